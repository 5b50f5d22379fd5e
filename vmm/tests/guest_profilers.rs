//! Stock perf and OProfile inside a stock Linux guest on the vPMU (issue 4): boots the default
//! kernel with the default initramfs (guest-image/build.sh) and `vpmu.experiment=all`, once per
//! accounting mode, decodes the result frames from COM2 and checks them:
//!   * perf stat -e cycles on cpu_split counts a nonzero number of cycles;
//!   * perf record -e cycles + perf report: hot_75 has 75% +- 2 pp of cpu_split's samples in
//!     cpu-switch (in domain-switch only that it is there: VMM work is charged too);
//!   * ocount counts a nonzero default event, operf + opreport -l find hot_75;
//!   * every step exited 0 and the guest kernel logged no PMU trouble;
//!   * `vpmu-vmm compare --workload packet-rx --profiler perf` (and `oprofile`) runs end to end:
//!     both tables have samples, and the function that takes the card's interrupt
//!     (vm_interrupt) has no smaller share in domain-switch than in cpu-switch.
//!
//! NEEDS A HOST WHERE GUEST USER SPACE RUNS (VT-x/SVM). On hosts whose /dev/kvm emulates guest
//! kernel code (kvm_pvm, shared/HOST-FACTS.md), init dies at its first system call, so this test
//! says so loudly and stops. On such a host, run it with (docs/guest.md):
//!
//!   guest-image/build.sh default-kernel initramfs && eval "$(guest-image/build.sh paths)" &&
//!   VPMU_TEST_KERNEL=$DEFAULT_BZIMAGE VPMU_TEST_INITRD=$INITRAMFS \
//!     cargo test --release -p vmm --test guest_profilers -- --ignored --nocapture

mod common;

use std::path::Path;
use std::process::Command;

use vmm::guest_reports::{
    failed_steps, ocount_counts, opreport_share, perf_report_share, perf_stat_count,
};
use vmm::guest_results::{decode, Decoded};

const BIN: &str = env!("CARGO_BIN_EXE_vpmu-vmm");

/// Why this host cannot run the test, if it cannot.
fn cannot_run_here() -> Option<&'static str> {
    if vmm::host_quirks::detect(vmm::host_quirks::QuirkSetting::Auto).is_some() {
        return Some(
            "this host's /dev/kvm (kvm_pvm) emulates guest kernel code and never delivers a guest \
             SYSCALL to the guest kernel, so guest user space (init, perf, operf) cannot run",
        );
    }
    None
}

/// The kernel and initramfs to boot, or None (after saying loudly why) where this file's tests
/// cannot run: no /dev/kvm, or no guest user space.
fn inputs(what: &str) -> Option<(String, String)> {
    if !common::kvm_available() {
        return None;
    }
    if let Some(why) = cannot_run_here() {
        eprintln!(
            "\n*** {what} CANNOT RUN on this host: {why}. ***\n\
             *** Nothing was checked. Run it on a VT-x/SVM host with the command in docs/guest.md (\"What was \
             proven on this host, and what needs a VT-x/SVM host\"). ***\n"
        );
        return None;
    }
    let kernel =
        std::env::var("VPMU_TEST_KERNEL").expect("VPMU_TEST_KERNEL must name the guest kernel");
    let initrd = std::env::var("VPMU_TEST_INITRD")
        .expect("VPMU_TEST_INITRD must name the default (full) initramfs");
    Some((kernel, initrd))
}

struct Boot {
    console: String,
    vmm_stderr: String,
    code: Option<i32>,
    results: Decoded,
}

fn boot(kernel: &str, initrd: &str, vpmu: &str, cmdline: &str, dir: &Path) -> Boot {
    let console = dir.join(format!("console-{vpmu}.log"));
    let serial2 = dir.join(format!("serial2-{vpmu}.bin"));
    let timeout = std::env::var("VPMU_TEST_TIMEOUT").unwrap_or_else(|_| "900".into());
    let out = Command::new(BIN)
        .args(["run", "--kernel", kernel, "--initrd", initrd])
        .args(["--cpus", "2", "--memory", "1024", "--timeout", &timeout])
        .args(["--vpmu", vpmu, "--cmdline", cmdline])
        .arg("--console")
        .arg(&console)
        .arg("--serial2")
        .arg(&serial2)
        .output()
        .unwrap();
    let bytes = std::fs::read(&serial2).unwrap_or_default();
    Boot {
        console: std::fs::read_to_string(&console).unwrap_or_default(),
        vmm_stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        code: out.status.code(),
        results: decode(&bytes),
    }
}

fn text(b: &Boot, mode: &str, name: &str) -> String {
    let f = b.results.get(mode, name).unwrap_or_else(|| {
        panic!(
            "no frame {name} in mode {mode}; frames: {:?}\n{}",
            b.results
                .frames
                .iter()
                .map(|f| format!("{}:{}", f.mode, f.name))
                .collect::<Vec<_>>(),
            dump(b)
        )
    });
    String::from_utf8_lossy(&f.payload).into_owned()
}

fn dump(b: &Boot) -> String {
    format!(
        "--- console ---\n{}\n--- vmm (exit {:?}) ---\n{}",
        b.console, b.code, b.vmm_stderr
    )
}

/// The checks on one mode's results.
fn check_mode(b: &Boot, mode: &str) {
    for exp in ["perf-stat", "perf-record", "ocount", "operf"] {
        let status = text(b, mode, &format!("{exp}/status.txt"));
        assert!(
            failed_steps(&status).is_empty(),
            "{mode}: {exp} steps failed:\n{status}\n{}",
            dump(b)
        );
    }
    let csv = text(b, mode, "perf-stat/cpu_split.csv");
    let cycles = perf_stat_count(&csv, "cycles");
    eprintln!("{mode}: perf stat cpu_split: cycles = {cycles:?}");
    assert!(
        cycles.is_some_and(|c| c > 0.0),
        "{mode}: perf stat counted no cycles:\n{csv}"
    );

    let report = text(b, mode, "perf-record/report-cpu_split-symbols.txt");
    let hot = perf_report_share(&report, "hot_75");
    let cold = perf_report_share(&report, "cold_25");
    eprintln!("{mode}: perf report cpu_split: hot_75 {hot:?} %, cold_25 {cold:?} %");
    let hot = hot.unwrap_or_else(|| panic!("{mode}: no hot_75 in perf report:\n{report}"));
    if mode == "cpu-switch" {
        assert!(
            (hot - 75.0).abs() <= 2.0,
            "cpu-switch: hot_75 has {hot}% of cpu_split's samples, not 75 +- 2:\n{report}"
        );
    }

    let oc = text(b, mode, "ocount/ocount-cpu_split.txt");
    let counts = ocount_counts(&oc);
    eprintln!("{mode}: ocount cpu_split: {counts:?}");
    assert!(
        counts.iter().any(|(_, c)| *c > 0),
        "{mode}: ocount counted nothing:\n{oc}"
    );
    let op = text(b, mode, "operf/opreport-symbols.txt");
    let share = opreport_share(&op, "hot_75");
    eprintln!("{mode}: opreport -l cpu_split: hot_75 {share:?} %");
    assert!(share.is_some(), "{mode}: opreport found no hot_75:\n{op}");
    assert!(
        !text(b, mode, "operf/opreport.txt").trim().is_empty(),
        "{mode}: opreport printed nothing"
    );
}

fn check_boot(b: &Boot) {
    assert_eq!(b.code, Some(0), "the guest did not power off\n{}", dump(b));
    assert!(
        b.results.problems.is_empty(),
        "result frames damaged or missing: {:?}\n{}",
        b.results.problems,
        dump(b)
    );
    for bad in [
        "general protection fault",
        "Oops",
        "BUG:",
        "NMI received for unknown reason",
        "irq loop stuck",
        "software events only",
        "PMU not available",
    ] {
        assert!(
            !b.console.contains(bad),
            "guest log has {bad:?}\n{}",
            dump(b)
        );
    }
}

#[test]
#[ignore = "boots Linux with perf and OProfile: needs a VT-x/SVM host (guest user space) and VPMU_TEST_KERNEL/VPMU_TEST_INITRD; see the file's header"]
fn stock_perf_and_oprofile_in_the_guest_in_both_modes() {
    let Some((kernel, initrd)) = inputs("guest_profilers") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();

    // One boot per mode, the mode fixed by the VMM.
    for mode in ["cpu-switch", "domain-switch"] {
        let b = boot(&kernel, &initrd, mode, "vpmu.experiment=all", dir.path());
        check_boot(&b);
        check_mode(&b, mode);
    }

    // One boot switching modes from the guest through the vPMU control port: frames are tagged
    // with the mode the port reports.
    let b = boot(
        &kernel,
        &initrd,
        "cpu-switch",
        "vpmu.experiment=perf-stat,perf-record vpmu.modes=cpu-switch,domain-switch",
        dir.path(),
    );
    check_boot(&b);
    for mode in ["cpu-switch", "domain-switch"] {
        let csv = text(&b, mode, "perf-stat/cpu_split.csv");
        assert!(
            perf_stat_count(&csv, "cycles").is_some_and(|c| c > 0.0),
            "{mode} (switched from the guest): no cycles:\n{csv}"
        );
    }
}

/// `compare --profiler perf|oprofile` end to end (runs only where guest user space does).
#[test]
#[ignore = "boots Linux with perf and OProfile: needs a VT-x/SVM host (guest user space) and VPMU_TEST_KERNEL/VPMU_TEST_INITRD; see the file's header"]
fn compare_with_the_guests_own_profilers() {
    let Some((kernel, initrd)) = inputs("compare --profiler perf|oprofile") else {
        return;
    };
    for profiler in ["perf", "oprofile"] {
        let dir = tempfile::tempdir().unwrap();
        let run = common::run_compare(
            &[
                "--workload",
                "packet-rx",
                "--profiler",
                profiler,
                "--kernel",
                &kernel,
                "--initrd",
                &initrd,
                "--phase-secs",
                "20",
            ],
            dir.path(),
        );
        let stdout = run.stdout;
        let read = |name: &str| common::compare_csv(dir.path(), name);
        let packets = read(&format!("packet-rx-{profiler}.csv"));
        let control = read(&format!("packet-rx-control-{profiler}.csv"));
        assert!(!packets.is_empty() && !control.is_empty());
        let irq = packets
            .iter()
            .find(|r| r.function == "vm_interrupt")
            .unwrap_or_else(|| panic!("{profiler}: no vm_interrupt samples:\n{stdout}"));
        assert!(
            irq.domain_percent >= irq.cpu_percent,
            "{profiler}: vm_interrupt {}% in cpu-switch, {}% in domain-switch",
            irq.cpu_percent,
            irq.domain_percent
        );
    }
}
