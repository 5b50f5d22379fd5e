//! Tier 2: guests that go wrong, on real /dev/kvm. Each case checks the run's exit code, the
//! diagnostic line per vCPU (RIP, last exits), and that what the user asked to be written
//! (trace, host profile, COM2 output) is complete: `vpmu-vmm trace summary` and
//! `vpmu-vmm report` read it.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{kvm_available, run_tiny_with, TinyRun};
use runtime::end::code;
use runtime::host_quirks::{HostKind, QuirkSetting};
use runtime::trace::{ProfileClock, ProfileConfig};
use tiny_guests::TinyGuest;

const BIN: &str = env!("CARGO_BIN_EXE_vpmu-vmm");

/// (exit code, stdout, stderr) of `vpmu-vmm ARGS`.
fn vmm(args: &[&str]) -> (i32, String, String) {
    let o = std::process::Command::new(BIN).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The diagnostic lines of a run, printed for the test log.
fn diagnostic(r: &TinyRun) -> Vec<String> {
    let d = vmm::report::diagnostic(&r.report);
    eprintln!("{} -> exit code {}", r.report.end, r.report.end.exit_code());
    for l in &d {
        eprintln!("{l}");
    }
    d
}

/// The RIP a diagnostic line names.
fn rip_of(line: &str) -> u64 {
    let hex = line
        .split("at RIP 0x")
        .nth(1)
        .unwrap_or_else(|| panic!("no RIP in {line:?}"));
    let hex: String = hex.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
    u64::from_str_radix(&hex, 16).unwrap()
}

fn in_image(rip: u64, g: &TinyGuest) -> bool {
    (g.load_addr..g.load_addr + g.image.len() as u64).contains(&rip)
}

/// Runs `trace summary` and `report` on the files; both must read them whole.
fn files_are_readable(trace: &Path, profile: &Path, dir: &Path) {
    let (c, out, err) = vmm(&["trace", "summary", trace.to_str().unwrap()]);
    assert_eq!(c, 0, "trace summary: {err}");
    assert!(out.contains("pio-out"), "{out}");
    let map = dir.join("System.map");
    std::fs::write(&map, "0000000000100000 T start\n").unwrap();
    let (c, out, err) = vmm(&[
        "report",
        profile.to_str().unwrap(),
        "--system-map",
        map.to_str().unwrap(),
    ]);
    assert_eq!(c, 0, "report: {err}");
    assert!(out.contains("start") || out.contains("[vmm]"), "{out}");
}

#[test]
fn triple_fault_exits_4_and_names_the_vcpu() {
    if !kvm_available() {
        return;
    }
    let r = run_tiny_with(&tiny_guests::TRIPLE64, Duration::from_secs(60), |_| {});
    let d = diagnostic(&r);
    assert_eq!(
        r.report.end.exit_code(),
        code::TRIPLE_FAULT,
        "{}",
        r.console
    );
    assert_eq!(d.len(), 1);
    assert!(d[0].starts_with("[vpmu-vmm] vCPU 0 at RIP 0x"), "{}", d[0]);
    assert!(d[0].contains("ended the run"), "{}", d[0]);
    assert!(
        d[0].ends_with("shutdown"),
        "the last exit is the shutdown: {}",
        d[0]
    );
    assert!(d[0].contains("pio 0x3f8 out 1 x"), "{}", d[0]);
    // `compare` ends with the run's own code and says the same.
    let e = vmm::compare::CompareError::guest_end(&r.report, " (guest console: c)");
    assert_eq!(e.exit_code(), code::TRIPLE_FAULT);
    let msg = e.to_string();
    assert!(
        msg.contains("triple fault")
            && msg.contains("(guest console: c)\n[vpmu-vmm] vCPU 0 at RIP 0x"),
        "{msg}"
    );
}

#[test]
fn compare_guest_that_powers_off_early_is_exit_1() {
    if !kvm_available() {
        return;
    }
    let r = run_tiny_with(&tiny_guests::HELLO64, Duration::from_secs(60), |_| {});
    assert_eq!(r.report.end.exit_code(), code::CLEAN);
    assert!(
        vmm::report::diagnostic(&r.report).is_empty(),
        "clean: no diagnostic"
    );
    let e = vmm::compare::CompareError::guest_end(&r.report, "");
    assert_eq!(e.exit_code(), code::ERROR);
}

#[test]
fn guest_panic_exits_3_with_the_panic_line() {
    if !kvm_available() {
        return;
    }
    let r = run_tiny_with(&tiny_guests::PANIC64, Duration::from_secs(60), |_| {});
    let d = diagnostic(&r);
    assert_eq!(r.report.end.exit_code(), code::GUEST_PANIC, "{}", r.console);
    assert!(
        r.report
            .end
            .to_string()
            .contains("Kernel panic - not syncing: tiny guest panics on purpose"),
        "{}",
        r.report.end
    );
    assert_eq!(d.len(), 1);
    assert!(
        d[0].contains("ended the run") && d[0].ends_with("pio 0x64 out 1"),
        "the reset write ended it: {}",
        d[0]
    );
    assert!(in_image(rip_of(&d[0]), &tiny_guests::PANIC64), "{}", d[0]);
}

#[test]
fn interrupts_off_hang_ends_by_timeout_7_with_every_vcpu_rip() {
    if !kvm_available() {
        return;
    }
    let t = Instant::now();
    let r = run_tiny_with(&tiny_guests::HALT64, Duration::from_millis(1000), |cfg| {
        cfg.vcpus = 2;
    });
    let d = diagnostic(&r);
    assert!(t.elapsed() >= Duration::from_millis(1000));
    assert_eq!(r.report.end.exit_code(), code::TIMEOUT);
    assert_eq!(r.console, "tiny: halting forever\n");
    assert_eq!(d.len(), 2, "one line per vCPU: {d:?}");
    assert!(d[0].starts_with("[vpmu-vmm] vCPU 0 at RIP 0x"), "{}", d[0]);
    assert!(d[1].starts_with("[vpmu-vmm] vCPU 1 at RIP 0x"), "{}", d[1]);
    // vCPU 0 sleeps in its `hlt; jmp` loop; the kick that stopped it is its last exit.
    assert!(in_image(rip_of(&d[0]), &tiny_guests::HALT64), "{}", d[0]);
    assert!(d[0].ends_with("interrupted"), "{}", d[0]);
    assert!(d.iter().all(|l| !l.contains("ended the run")), "{d:?}");
}

/// The int3-loop guest run with `quirks`, when this host emulates guest kernel code (its int3s
/// are emulation failures); elsewhere int3 runs in hardware: the test is named NOT CHECKED,
/// the guest must still have ended (it overruns its stack), and None comes back.
fn int3_loop(test: &str, quirks: QuirkSetting) -> Option<TinyRun> {
    let t = Instant::now();
    let r = run_tiny_with(&tiny_guests::INT3_LOOP64, Duration::from_secs(120), |c| {
        c.host = HostKind::decide(quirks);
    });
    eprintln!("ended after {:.1} s", t.elapsed().as_secs_f64());
    if HostKind::decide(QuirkSetting::Auto).quirks() {
        return Some(r);
    }
    testkit::not_checked(
        test,
        &format!(
            "this host runs int3 in hardware, no emulation failure to complete or refuse (the run ended: {})",
            r.report.end
        ),
    );
    assert_ne!(r.report.end.exit_code(), code::TIMEOUT, "the guest hung");
    None
}

/// `--host-quirks off` means no fix-up runs: the first emulation failure ends the run with
/// code 6 and says why, where `auto` would have completed it (the test below).
#[test]
fn with_host_quirks_off_an_emulation_failure_ends_the_run() {
    if !kvm_available() {
        return;
    }
    let Some(r) = int3_loop(
        "with_host_quirks_off_an_emulation_failure_ends_the_run",
        QuirkSetting::Off,
    ) else {
        return;
    };
    assert_eq!(
        r.report.end.exit_code(),
        code::EMULATION_FAILURE,
        "{}",
        r.report.end
    );
    let end = r.report.end.to_string();
    assert!(end.contains("--host-quirks off: no fix-up"), "{end}");
    assert!(
        r.report.fixups.is_empty(),
        "fix-ups ran: {:?}",
        r.report.fixups
    );
}

#[test]
fn fixup_without_progress_exits_6_instead_of_spinning() {
    if !kvm_available() {
        return;
    }
    let g = tiny_guests::INT3_LOOP64;
    let Some(r) = int3_loop(
        "fixup_without_progress_exits_6_instead_of_spinning",
        QuirkSetting::Auto,
    ) else {
        return;
    };
    let d = diagnostic(&r);
    assert_eq!(
        r.report.end.exit_code(),
        code::EMULATION_FAILURE,
        "{}",
        r.report.end
    );
    let end = r.report.end.to_string();
    assert!(end.contains("no progress") && end.contains("int3"), "{end}");
    assert_eq!(d.len(), 1);
    let rip = rip_of(&d[0]);
    assert!(in_image(rip, &g), "{}", d[0]);
    // The ring names the failing RIP: the int3 itself.
    assert!(
        d[0].contains(&format!("internal-error @{rip:#x}")) || d[0].contains("internal-error @0x"),
        "{}",
        d[0]
    );
    let fixups: u64 = r
        .report
        .fixups
        .iter()
        .filter(|(k, _)| k.contains("int3"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        fixups >= u64::from(runtime::last_exits::NO_PROGRESS_LIMIT) - 1,
        "{fixups} fix-ups"
    );
}

/// Trace, host profile and COM2 output of a run that only --timeout ends.
fn recorded_run(adjust: impl FnOnce(&mut runtime::vm::VmConfig)) -> (TinyRun, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (trace, profile) = (dir.path().join("t.trace"), dir.path().join("p.profile"));
    let r = run_tiny_with(
        &tiny_guests::SERIAL2_FOREVER64,
        Duration::from_millis(1500),
        |cfg| {
            cfg.record.trace = Some(trace);
            cfg.record.profile = Some(ProfileConfig {
                path: profile,
                hz: 1000,
                clock: ProfileClock::Wall,
                task_layout: None,
            });
            adjust(cfg);
        },
    );
    (r, dir)
}

#[test]
fn timeout_mid_trace_leaves_complete_files() {
    if !kvm_available() {
        return;
    }
    let (r, dir) = recorded_run(|_| {});
    let d = diagnostic(&r);
    assert_eq!(r.report.end.exit_code(), code::TIMEOUT);
    assert_eq!(d.len(), 1);
    assert!(
        in_image(rip_of(&d[0]), &tiny_guests::SERIAL2_FOREVER64),
        "{}",
        d[0]
    );
    assert!(d[0].contains("pio 0x80 out 1"), "{}", d[0]);
    assert_eq!(r.console, "tiny: busy until the timeout\n");
    assert_eq!(r.serial2, b"tiny: serial2 line before the timeout\n");
    let trace = dir.path().join("t.trace");
    files_are_readable(&trace, &dir.path().join("p.profile"), dir.path());
    // Every port write the VMM counted is in the trace.
    let t = analysis::trace::format::Trace::read_file(&trace).unwrap();
    let s = analysis::trace::summary::summarize(&t).unwrap();
    let outs = s.vcpus[0]
        .reasons
        .get(&analysis::trace::format::Reason::IoOut)
        .map(|x| x.count())
        .unwrap_or(0);
    assert_eq!(outs, r.report.exits[0].io_out);
    assert!(outs > 100, "{outs}");
}

#[test]
fn panicking_vcpu_thread_ends_the_run_with_8_and_closed_files() {
    if !kvm_available() {
        return;
    }
    let t = Instant::now();
    let (r, dir) = recorded_run(|cfg| {
        cfg.timeout = Some(Duration::from_secs(60));
        cfg.panic_vcpu_at_exit = Some((0, 300));
    });
    let d = diagnostic(&r);
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "the VMM waited for the timeout"
    );
    assert_eq!(r.report.end.exit_code(), code::VMM_BUG, "{}", r.report.end);
    assert!(
        r.report.end.to_string().contains("vCPU 0 thread panicked"),
        "{}",
        r.report.end
    );
    assert_eq!(d.len(), 1);
    assert!(
        d[0].contains("(CPL 0), ended the run, THREAD PANICKED: test hook"),
        "{}",
        d[0]
    );
    assert!(
        in_image(rip_of(&d[0]), &tiny_guests::SERIAL2_FOREVER64),
        "{}",
        d[0]
    );
    assert!(d[0].contains(", 300 exits, last: "), "{}", d[0]);
    assert_eq!(r.serial2, b"tiny: serial2 line before the timeout\n");
    files_are_readable(
        &dir.path().join("t.trace"),
        &dir.path().join("p.profile"),
        dir.path(),
    );
}

#[test]
fn compare_outputs_are_replaced_whole() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.csv");
    std::fs::write(&p, "old").unwrap();
    vmm::compare::write_whole(&p, b"new,contents\n").unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "new,contents\n");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "no temporary file left behind");
}
