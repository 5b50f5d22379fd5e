//! Stock perf and OProfile inside a stock Linux guest on the vPMU (issue 4, issue 10): boots the
//! default kernel with its root filesystem on a read-only virtio-blk disk (guest-image/build.sh
//! rootfs: what the default initramfs holds, and the kernel's symbols, so /init need not read
//! /proc/kallsyms in emulated code; checked below) on one vCPU with
//! `vpmu.experiment=perf-stat,perf-record,ocount,operf,vector-regs,lib-chain,perf-user-read vpmu.modes=cpu-switch,domain-switch vpmu.profile_rounds=4000`
//! (the guest library's `all` less perf-record-io; one boot, the guest switches the mode through the
//! vPMU control port), decodes the result frames from COM2 and checks them, in each mode:
//!   * perf stat -e cycles,instructions,task-clock on cpu_split: a real cycles count (not
//!     <not supported>), and cycles / task-clock at the vPMU's nominal frequency once the steal
//!     time is taken out of task-clock (the guest's task-clock also runs while the host has the
//!     vCPU thread switched out; KVM tells the guest how long, in /proc/stat's steal column,
//!     which the guest library reads around cpu_split): 0.70-1.05 of it in both modes (0.98-0.99 on
//!     a quiet host; the gap grows with the host's load, check_mode);
//!   * instructions, which the soft backend cannot count, is named in the VMM's end-of-run
//!     warning (AMD model: no CPUID bit can tell the guest), not left as a silent 0;
//!   * perf record -e cycles (fixed period) + perf report: samples of event 'cycles' (no
//!     cpu-clock fallback), hot_75 has 75% of cpu_split's own samples in cpu-switch, within 2 pp
//!     or, with fewer than ~2100 samples, within 3 binomial standard deviations (check_hot_share);
//!     in domain-switch only that it is there: VMM work is charged too;
//!   * ocount counts a nonzero default event, operf + opreport -l: hot_75's share as for perf;
//!   * vector_regs found its ymm registers unchanged after each of its task switches (beside a
//!     loop of busybox pipelines): on hosts that emulate guest kernel code the guest kernel keeps
//!     no AVX state, and /init keeps glibc off AVX (docs/guest.md, "AVX state");
//!   * the VMM's own samples of the same run (`--host-profile`, issue 19): the passive profile
//!     agrees with perf's on cpu_split, names libraries, and gives lib_chain's samples in
//!     libchain_b.so the whole stack `main;a_outer;b_spin` across two shared libraries;
//!   * every step exited 0 and the guest kernel logged no unknown NMI, "irq loop stuck", general
//!     protection fault, oops or BUG (soft-lockup reports excepted: emulated kernel code is slow).
//!
//! And `vpmu-vmm compare --workload packet-rx --profiler perf` runs end to end on the Intel model
//! (`--pmu-model intel`: the guest must take its Intel PMU driver), `--profiler oprofile` on the
//! host's model (OProfile reads a user-space CPUID, native on kvm_pvm: docs/guest.md), sized by
//! host kind (`PacketRxSize`). Where guest kernel code is emulated: 90 s system-wide windows at
//! 10 echo requests/s, the functions that access the card's registers (vm_interrupt, vm_notify)
//! have >= 50 samples in domain-switch and >= 3x their cpu-switch share with perf (with OProfile,
//! which loses most of them there, only some and no smaller share). On a VT-x/SVM host (tier 4's
//! nested kvm_amd, `VPMU_SVM_PROFILERS=1`): 30 s windows at 200 requests/s, at least 50
//! samples and 3x with both profilers (the seeds' size, 1000, is open in issue 32). In both,
//! the CPU-bound control's hot_75 moves less than `testkit::NOISE_SDS` (4) standard deviations
//! of its sampling noise (one boot per profiler). A fourth boot drives the shell the rootfs
//! image gives on the console.
//!
//! On hosts whose /dev/kvm emulates guest kernel code (kvm_pvm, shared/HOST-FACTS.md) guest user
//! space runs through the VMM's SYSCALL relay; each boot takes 15-50 minutes there (docs/guest.md,
//! "Sizes and periods"). Run (scripts/test.sh does):
//!
//!   guest-image/build.sh default-kernel rootfs && eval "$(guest-image/build.sh paths)" &&
//!   VPMU_TEST_KERNEL=$DEFAULT_BZIMAGE VPMU_TEST_ROOTFS=$ROOTFS \
//!     cargo test --release -p vmm --test guest_profilers -- --ignored --nocapture

mod common;

use std::path::Path;
use std::process::Command;

use analysis::guest_reports::{
    failed_steps, ocount_counts, opreport_samples, perf_report_samples, perf_stat_count,
    proc_stat_steal_ms,
};
use analysis::guest_results::{decode, Decoded};

const BIN: &str = env!("CARGO_BIN_EXE_vpmu-vmm");

/// The kernel and root filesystem image to boot, or None (after saying loudly why) without
/// /dev/kvm. The image is attached read-only (a shared lock), so the boots of this file can run
/// side by side on one image.
fn inputs() -> Option<(String, String)> {
    if !common::kvm_available() {
        return None;
    }
    let kernel =
        std::env::var("VPMU_TEST_KERNEL").expect("VPMU_TEST_KERNEL must name the guest kernel");
    let rootfs = std::env::var("VPMU_TEST_ROOTFS")
        .expect("VPMU_TEST_ROOTFS must name the default root filesystem image (build.sh rootfs)");
    Some((kernel, rootfs))
}

/// Seconds from the kernel's start to "Run /sbin/init" (its own printk clock), for the log.
fn boot_to_init_secs(console: &str) -> Option<f64> {
    let line = console.lines().find(|l| l.contains("Run /sbin/init"))?;
    let stamp = line.split_once('[')?.1.split_once(']')?.0;
    stamp.trim().parse().ok()
}

/// Seconds a boot may take (VPMU_TEST_TIMEOUT): generous, emulated guest kernels on a busy host
/// are slow.
fn timeout_secs() -> u64 {
    std::env::var("VPMU_TEST_TIMEOUT")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(5400)
}

struct Boot {
    console: String,
    vmm_stderr: String,
    code: Option<i32>,
    results: Decoded,
}

/// Boots the image (read-only) with `cmdline`, and `extra` `run` arguments.
fn boot(
    kernel: &str,
    rootfs: &str,
    vpmu: &str,
    cmdline: &str,
    dir: &Path,
    extra: &[&std::ffi::OsStr],
) -> Boot {
    let console = dir.join(format!("console-{vpmu}.log"));
    let serial2 = dir.join(format!("serial2-{vpmu}.bin"));
    let start = std::time::Instant::now();
    // One vCPU: with two, freshly exec'd processes die at startup now and then on hosts that
    // emulate guest kernel code (docs/guest.md). Nothing retries a step: a process that dies fails it.
    let out = Command::new(BIN)
        .args([
            "run",
            "--kernel",
            kernel,
            "--disk",
            &format!("{rootfs},readonly=on"),
        ])
        .args(["--cpus", "1", "--memory", "1024"])
        .args(["--timeout", &timeout_secs().to_string()])
        .args(["--vpmu", vpmu, "--cmdline", cmdline])
        .args(extra)
        .arg("--console")
        .arg(&console)
        .arg("--serial2")
        .arg(&serial2)
        .output()
        .unwrap();
    let console = std::fs::read_to_string(&console).unwrap_or_default();
    eprintln!(
        "boot ({cmdline}): {:.0} s wall, /sbin/init after {:?} s of guest time",
        start.elapsed().as_secs_f64(),
        boot_to_init_secs(&console)
    );
    let bytes = std::fs::read(&serial2).unwrap_or_default();
    Boot {
        console,
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

/// The vPMU's nominal frequency (GHz): the soft backend's TSC rate, from the VMM's log.
fn nominal_ghz(b: &Boot) -> f64 {
    let khz = b
        .vmm_stderr
        .lines()
        .find_map(|l| {
            let rest = l.split("at the TSC rate, ").nth(1)?;
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
        .unwrap_or_else(|| {
            panic!(
                "the VMM did not log its soft backend's TSC rate\n{}",
                dump(b)
            )
        });
    khz / 1e6
}

/// hot_75's share of cpu_split's own samples must be 75%: within 2 pp, or within three binomial
/// standard deviations when there are too few samples for 2 pp to be a fair bound (fewer than
/// ~2100: a boot on a host that emulates guest kernel code gets ~250-350 in the time CI allows;
/// docs/guest.md, "Sizes and periods"). Returns the share.
fn check_hot_share(mode: &str, what: &str, samples: &[(String, u64)], report: &str) -> f64 {
    let count = |name: &str| {
        samples
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, n)| *n)
            .sum::<u64>()
    };
    let (hot, cold) = (count("hot_75"), count("cold_25"));
    let n = hot + cold;
    assert!(
        n >= 100,
        "{mode}: {what}: only {n} samples in cpu_split's hot_75/cold_25 (at least 100 needed):\n{report}"
    );
    let share = 100.0 * hot as f64 / n as f64;
    let sds = testkit::NOISE_SDS;
    let bound = (sds * testkit::share_sd_pp(0.75, n)).max(2.0);
    eprintln!(
        "{mode}: {what}: hot_75 {hot} + cold_25 {cold} samples: hot_75 {share:.1}% \
         (75 +- {bound:.1} pp allowed: {sds} sd of {n} samples, at least 2 pp)"
    );
    assert!(
        (share - 75.0).abs() <= bound,
        "{mode}: {what}: hot_75 has {share:.1}% of cpu_split's {n} samples, not 75 +- {bound:.1}:\n{report}"
    );
    share
}

/// One profiler's report of cpu_split's own symbols: printed; hot_75 must be in it, and in
/// cpu-switch hold its share (in domain-switch VMM work is charged too).
fn check_cpu_split_profile(mode: &str, what: &str, samples: &[(String, u64)], report: &str) {
    eprintln!(
        "{mode}: {what}: cpu_split's symbols:\n{}",
        table_lines(report)
    );
    assert!(
        samples.iter().any(|(k, _)| k == "hot_75"),
        "{mode}: {what}: no hot_75 in the report:\n{report}"
    );
    if mode == "cpu-switch" {
        check_hot_share(mode, what, samples, report);
    }
}

/// A report's table lines (no comments or blank lines), for the test's output.
fn table_lines(report: &str) -> String {
    report
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .take(20)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Issue 19, item 5: the guest's own `perf record` of cpu_split (active) and the VMM's host-side
/// samples of the same run (passive), in one mode. Of the passive samples naming a cpu_split
/// process, >= 95% must name its executable (the comm and the mm read from guest memory agree),
/// <= 1% of other processes' samples may resolve into cpu_split's functions, and hot_75's share
/// of cpu_split's two functions must agree with perf's within `testkit::NOISE_SDS` sd of the two
/// samples' binomial noise.
fn check_active_and_passive(b: &Boot, mode: &str, profile: &Path, rootfs: &str) {
    let files = Path::new(rootfs).with_file_name("files");
    let files = files.to_str().unwrap();
    let json = common::report(
        profile,
        &["--format", "json", "--mode", mode, "--guest-files", files],
    );
    let doc: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let rows = doc["rows"].as_array().unwrap();
    let sum = |pred: &dyn Fn(&str, &str, &str) -> bool| -> u64 {
        rows.iter()
            .filter(|r| {
                pred(
                    r["process"].as_str().unwrap(),
                    r["object"].as_str().unwrap(),
                    r["symbol"].as_str().unwrap(),
                )
            })
            .map(|r| r["samples"].as_u64().unwrap())
            .sum()
    };
    let is_split = |p: &str| p.starts_with("cpu_split[");
    let split_user = sum(&|p, o, _| is_split(p) && !o.is_empty());
    let split_exe = sum(&|p, o, _| is_split(p) && o == "/usr/bin/cpu_split");
    let others = sum(&|p, o, _| !is_split(p) && !o.is_empty());
    let others_in_split = sum(&|p, _, s| !is_split(p) && (s == "hot_75" || s == "cold_25"));
    // Shared libraries (perf and operf are dynamic): a user sample outside its executable's
    // code names the mapping it lies in, and with the guest's files the library (and, where
    // the library's symbols cover it, the function: ld.so and most of Debian's libraries are
    // stripped to their exported symbols, so many say "[lib, no symbol]").
    let is_lib = |o: &str| o.starts_with("/lib/") || o.starts_with("/usr/lib/");
    let lib = sum(&|_, o, _| is_lib(o));
    let lib_named = sum(&|_, o, s| is_lib(o) && !s.starts_with('['));
    let map_unresolved = sum(&|_, o, _| o.starts_with("[unresolved: the mapping"));
    let mut top_lib: Vec<(&str, &str, u64)> = rows
        .iter()
        .filter(|r| is_lib(r["object"].as_str().unwrap()))
        .map(|r| {
            (
                r["object"].as_str().unwrap(),
                r["symbol"].as_str().unwrap(),
                r["samples"].as_u64().unwrap(),
            )
        })
        .collect();
    top_lib.sort_by_key(|t| std::cmp::Reverse(t.2));
    top_lib.truncate(5);
    eprintln!(
        "{mode}: user samples in shared libraries: {lib} ({lib_named} name a function), \
         {map_unresolved} whose mapping was not read; top: {top_lib:?}"
    );
    assert!(
        lib >= 20,
        "{mode}: only {lib} passive user samples in shared libraries (perf and operf run in them)"
    );
    assert!(
        lib_named >= 1,
        "{mode}: none of the {lib} library samples names a function"
    );
    assert!(
        map_unresolved * 10 <= lib,
        "{mode}: {map_unresolved} samples' mappings unresolved against {lib} resolved"
    );
    let hot = sum(&|p, _, s| is_split(p) && s == "hot_75");
    let cold = sum(&|p, _, s| is_split(p) && s == "cold_25");
    let report = text(b, mode, "perf-record/report-cpu_split-symbols.txt");
    let active = perf_report_samples(&report);
    let count = |name: &str| {
        active
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, n)| *n)
            .sum::<u64>()
    };
    let (ahot, acold) = (count("hot_75"), count("cold_25"));
    let share = |h: u64, c: u64| h as f64 / (h + c).max(1) as f64;
    let (p_passive, p_active) = (share(hot, cold), share(ahot, acold));
    let pooled = share(hot + ahot, cold + acold);
    let sds = testkit::NOISE_SDS;
    let bar = sds * testkit::share_diff_sd_pp(pooled, hot + cold, ahot + acold) / 100.0;
    eprintln!(
        "{mode}: active (perf record) hot_75 {:.1}% of {}; passive (host-side) {:.1}% of {} \
         ({sds} sd = {:.1} pp); passive user samples of cpu_split: {split_exe} of {split_user} name \
         its executable; other processes' user samples: {others}, {others_in_split} of them in \
         cpu_split's functions",
        100.0 * p_active,
        ahot + acold,
        100.0 * p_passive,
        hot + cold,
        100.0 * bar
    );
    assert!(
        hot + cold >= 100,
        "{mode}: only {} passive samples in cpu_split's functions",
        hot + cold
    );
    assert!(
        split_exe * 100 >= split_user * 95,
        "{mode}: {split_exe} of {split_user} user-space samples of cpu_split name its executable"
    );
    assert!(
        others_in_split * 100 <= others.max(1),
        "{mode}: {others_in_split} of {others} other processes' user samples in cpu_split's functions"
    );
    assert!(
        (p_passive - p_active).abs() <= bar,
        "{mode}: hot_75's share: passive {:.1}% vs active {:.1}%, more than {sds} sd ({:.1} pp) apart",
        100.0 * p_passive,
        100.0 * p_active,
        100.0 * bar
    );
}

/// Issue 19, call stacks across shared libraries: lib_chain's work runs in b_spin
/// (libchain_b.so), called by a_outer (libchain_a.so), called by main (the executable), all
/// with frame pointers. The RIP's mapping names libchain_b.so; a_outer's return address lies in
/// another library, named through its own mapping record (trace record kind 9). Of the passive
/// samples in b_spin (>= 100 a mode: ~1 s of native user code), >= 90% must carry the whole
/// chain `main;a_outer;b_spin` (the few at b_spin's first two instructions, before its frame
/// exists, miss a_outer).
fn check_library_callers(mode: &str, profile: &Path, rootfs: &str) {
    let files = Path::new(rootfs).with_file_name("files");
    let folded = common::report(
        profile,
        &[
            "--format",
            "folded",
            "--mode",
            mode,
            "--guest-files",
            files.to_str().unwrap(),
        ],
    );
    let folded = String::from_utf8(folded).unwrap();
    // `process;object;callers...;symbol[;[vmm] exit] count`.
    let stacks: Vec<(Vec<&str>, u64)> = folded
        .lines()
        .filter(|l| l.starts_with("lib_chain["))
        .filter_map(|l| {
            let (stack, n) = l.rsplit_once(' ')?;
            let frames = stack.split(';').filter(|f| !f.starts_with("[vmm]"));
            Some((frames.collect(), n.parse().ok()?))
        })
        .collect();
    let in_b_spin = |f: &Vec<&str>| {
        f.get(1).is_some_and(|o| o.ends_with("/libchain_b.so")) && f.last() == Some(&"b_spin")
    };
    let b_spin: u64 = stacks
        .iter()
        .filter(|(f, _)| in_b_spin(f))
        .map(|s| s.1)
        .sum();
    let whole: u64 = stacks
        .iter()
        .filter(|(f, _)| in_b_spin(f) && f.join(";").ends_with(";main;a_outer;b_spin"))
        .map(|s| s.1)
        .sum();
    let mut top: Vec<&(Vec<&str>, u64)> = stacks.iter().collect();
    top.sort_by_key(|s| std::cmp::Reverse(s.1));
    let top: Vec<String> = top
        .iter()
        .take(6)
        .map(|(f, n)| format!("{n} {}", f.join(";")))
        .collect();
    eprintln!(
        "{mode}: lib_chain: {whole} of {b_spin} passive samples in b_spin carry main;a_outer;b_spin; \
         top stacks:\n{}",
        top.join("\n")
    );
    assert!(
        b_spin >= 100,
        "{mode}: only {b_spin} passive samples in lib_chain's b_spin (libchain_b.so):\n{}",
        top.join("\n")
    );
    assert!(
        whole * 100 >= b_spin * 90,
        "{mode}: {whole} of {b_spin} samples in b_spin carry main;a_outer;b_spin (a caller in \
         another library unnamed?):\n{}",
        top.join("\n")
    );
}

/// Issue 32 item 3: a guest process reads its cycles counter with RDPMC through the perf mmap
/// page (the PMU allows it: sysfs `rdpmc` 1), and perf's own test of that runs to its end in
/// each of five runs and passes in at least one: the VMM serves user-space RDPMC (`--rdpmc
/// auto`: the #GP trap beside the kernel rewrite). Before, it died with a segmentation fault.
/// (A run may fail its "each doubling loop counts more" check where a guest timer tick, emulated
/// here for milliseconds, lands in one of its short loops: counted and printed, not a crash.)
fn check_user_space_rdpmc(b: &Boot, mode: &str) {
    let sysfs = text(b, mode, "perf-user-read/rdpmc-sysfs.txt");
    assert_eq!(sysfs.trim(), "1", "{mode}: the guest PMU's rdpmc switch");
    let out = text(b, mode, "perf-user-read/perf-test.txt");
    let runs = out.matches("perf test exit=").count();
    let ok = out.matches("subtest 3: Ok").count();
    eprintln!("{mode}: perf test (user space counter reading of cycles): {ok} of {runs} runs Ok");
    let crashed = [
        "Segmentation fault",
        "unexpected signal",
        "userspace counter access not",
    ];
    for bad in crashed {
        assert!(
            !out.contains(bad),
            "{mode}: `{bad}` in perf test:\n{out}\n{}",
            dump(b)
        );
    }
    assert_eq!(runs, 5, "{mode}: perf test did not run five times:\n{out}");
    assert!(
        ok >= 1,
        "{mode}: perf's user-space counter reading test passed in none of 5 runs:\n{out}\n{}",
        dump(b)
    );
}

/// The checks on one mode's results.
fn check_mode(b: &Boot, mode: &str) {
    for exp in [
        "perf-stat",
        "perf-record",
        "ocount",
        "operf",
        "vector-regs",
        "lib-chain",
        "perf-user-read",
    ] {
        let status = text(b, mode, &format!("{exp}/status.txt"));
        eprintln!("{mode}: {exp} steps:\n{}", status.trim_end());
        assert!(
            failed_steps(&status).is_empty(),
            "{mode}: {exp} steps failed:\n{status}\n{}",
            dump(b)
        );
    }
    let csv = text(b, mode, "perf-stat/cpu_split.csv");
    let cycles = perf_stat_count(&csv, "cycles");
    let clock_ms = perf_stat_count(&csv, "task-clock");
    let instructions = perf_stat_count(&csv, "instructions");
    let nominal = nominal_ghz(b);
    eprintln!(
        "{mode}: perf stat cpu_split: cycles = {cycles:?}, instructions = {instructions:?}, \
         task-clock = {clock_ms:?} ms"
    );
    let cycles = cycles.unwrap_or_else(|| panic!("{mode}: perf stat counted no cycles:\n{csv}"));
    assert!(cycles > 0.0, "{mode}: perf stat counted 0 cycles:\n{csv}");
    let clock_ms =
        clock_ms.unwrap_or_else(|| panic!("{mode}: perf stat has no task-clock:\n{csv}"));
    // The guest's task-clock also runs while the host keeps the vCPU thread off the CPU (steal
    // time, which KVM reports to the guest); the soft backend's cycles do not. Without the steal
    // the two agree on any host, idle or busy.
    let proc_stat = text(b, mode, "perf-stat/cpu_split.proc-stat");
    let steal_ms = proc_stat_steal_ms(&proc_stat).unwrap_or_else(|| {
        panic!("{mode}: no steal time in the guest's /proc/stat lines:\n{proc_stat}")
    });
    let ghz = cycles / (clock_ms * 1e6);
    let running_ms = clock_ms - steal_ms;
    assert!(
        running_ms > 0.2 * clock_ms,
        "{mode}: the host kept the vCPU off the CPU for {steal_ms} of cpu_split's {clock_ms} ms: \
         too busy for a cycles / task-clock check\n{csv}\n{proc_stat}"
    );
    let running_ghz = cycles / (running_ms * 1e6);
    eprintln!(
        "{mode}: cycles / task-clock = {ghz:.3} GHz; without the {steal_ms:.0} ms of steal time \
         {running_ghz:.3} GHz; the vPMU's nominal frequency {nominal:.3} GHz (ratio {:.3})",
        running_ghz / nominal
    );
    // Above nominal would count time the guest did not run: 5% at most, in both modes. Below:
    // on a quiet host 0.98-0.99 in both modes, but the gap grows with the host's load in both, so
    // it is not (only) cpu-switch leaving out the VMM's exit handling: the guest's task-clock less
    // its steal time is more than the vCPU thread's CPU time when the host is contended. Measured:
    // 0.939 cpu-switch with three boots on two cores; beside two busy loops 0.917 cpu-switch and
    // 0.910 domain-switch (one boot), 0.834 cpu-switch (three boots). So both modes may fall to
    // 0.70: a count off by a factor (half, double, nothing) still fails (docs/guest.md,
    // "cycles / task-clock").
    let ratio = running_ghz / nominal;
    let low = 0.70;
    assert!(
        (low..=1.05).contains(&ratio),
        "{mode}: {running_ghz:.3} GHz of cycles per task-clock (less {steal_ms} ms of steal), \
         {ratio:.3} of the nominal {nominal:.3} GHz, not within {low}-1.05:\n{csv}\n{proc_stat}"
    );

    let full = text(b, mode, "perf-record/report-cpu_split.txt");
    assert!(
        full.contains("of event 'cycles'") && !full.contains("cpu-clock"),
        "{mode}: perf record did not sample the cycles event:\n{full}"
    );
    let report = text(b, mode, "perf-record/report-cpu_split-symbols.txt");
    check_cpu_split_profile(mode, "perf", &perf_report_samples(&report), &report);

    let oc = text(b, mode, "ocount/ocount-cpu_split.txt");
    let counts = ocount_counts(&oc);
    eprintln!("{mode}: ocount cpu_split: {counts:?}");
    assert!(
        counts.iter().any(|(_, c)| *c > 0),
        "{mode}: ocount counted nothing:\n{oc}"
    );
    // vector_regs exits 1 when a register changed (a failed step above); here: it did check.
    let vr = text(b, mode, "vector-regs/vector_regs.txt");
    eprintln!("{mode}: {}", vr.trim_end());
    // Where the guest kernel's `noxsave` also hides AVX from user space (OSXSAVE clear: seen on an
    // Intel kvm_pvm host; on the AMD ones user space saw the host's AVX), no process can use the
    // registers, so there is nothing to corrupt: said loudly, not counted as checked.
    let no_avx =
        vr.contains("ymm1 skipped (no AVX usable in user space)") && vr.contains("ymm16 skipped");
    if no_avx {
        testkit::not_checked(
            &format!("{mode}: vector_regs' ymm registers"),
            "guest user space has no usable AVX on this host (OSXSAVE off)",
        );
    }
    assert!(
        no_avx || vr.contains("changed in 0 of"),
        "{mode}: vector_regs checked no register:\n{vr}"
    );
    check_user_space_rdpmc(b, mode);
    let op = text(b, mode, "operf/opreport-symbols.txt");
    check_cpu_split_profile(mode, "operf", &opreport_samples(&op), &op);
    assert!(
        !text(b, mode, "operf/opreport.txt").trim().is_empty(),
        "{mode}: opreport printed nothing"
    );
}

/// The guest log's lines with `what` that are about the kernel: a user process's fault
/// ([`common::is_user_fault`]) fails [`assert_no_user_crashes`] instead, with its own message.
fn kernel_lines<'a>(console: &'a str, what: &str) -> Vec<&'a str> {
    console
        .lines()
        .filter(|l| l.contains(what) && !common::is_user_fault(l))
        .collect()
}

/// A guest user process that died of a fault fails the test, as in linux_boot: nothing in the
/// guest re-runs a crashed step any more (docs/guest.md, "AVX state", says what used to crash).
fn assert_no_user_crashes(console: &str, what: &str) {
    let crashed = common::user_crashes(console);
    assert!(
        crashed.is_empty(),
        "{what}: a guest process died of a fault (docs/guest.md, \"AVX state\"): {crashed:?}"
    );
    eprintln!("{what}: guest user processes that died of a fault: 0");
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
        "NMI received for unknown reason",
        "irq loop stuck",
        "software events only",
        "PMU not available",
    ] {
        let found = kernel_lines(&b.console, bad);
        assert!(found.is_empty(), "guest log has {found:?}\n{}", dump(b));
    }
    // Soft-lockup reports are the emulated kernel's slowness on some hosts, not a vPMU fault.
    let bugs: Vec<&str> = b
        .console
        .lines()
        .filter(|l| l.contains("BUG:") && !l.contains("soft lockup"))
        .collect();
    assert!(bugs.is_empty(), "guest log has {bugs:?}\n{}", dump(b));
    assert_no_user_crashes(&b.console, "experiments boot");
    check_kallsyms_snapshot(&b.console);
}

/// `compare --profiler` starts the VMM's packets held (the packet gate port); the guest opens the
/// gate for its two system-wide windows (experiments.sh, vpmu_packets), so most of the requests
/// that fell due over the run were held back.
fn check_packet_gate(stderr: &str, profiler: &str) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("[compare] network:"))
        .unwrap_or_else(|| panic!("{profiler}: no '[compare] network:' line:\n{stderr}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let [sent, ok, bad, held] = numbers[..] else {
        panic!("{profiler}: unexpected network line: {line}");
    };
    assert!(
        ok > 0 && bad == 0,
        "{profiler}: the guest answered no echo request, or a bad one: {line}"
    );
    // 90 s windows: at 10 requests/s OProfile recorded 18 + 5 samples of vm_interrupt and
    // vm_notify in domain-switch in 40 s windows (perf 66 + 13).
    // The gate (the VMM logs each change) opened for the guest's two system-wide windows, one
    // per mode, and closed after each: outside them the requests were held. (A count of held
    // against sent requests depends on how long the rest of the run takes: with the root disk
    // the boot is shorter, and 1054 sent / 3109 held is a gate that worked.)
    let opened = stderr
        .lines()
        .filter(|l| l.contains("packet gate opened by the guest"))
        .count();
    let closed = stderr
        .lines()
        .filter(|l| l.contains("packet gate closed by the guest"))
        .count();
    let last_closes = stderr
        .lines()
        .rfind(|l| l.contains(" by the guest: echo requests "))
        .is_some_and(|l| l.contains("packet gate closed by the guest"));
    assert!(
        opened == 2 && closed == 2 && last_closes,
        "{profiler}: the guest's packet gate opened {opened} and closed {closed} times (want 2 and 2, ending closed):\n{stderr}"
    );
    assert!(
        sent > 0 && held > 0,
        "{profiler}: the packets were not held outside the guest's windows: {line}"
    );
}

/// Where the host emulates guest kernel code, vpmu-vmm asks /init (vpmu.kallsyms=snapshot, in
/// host_quirks::KERNEL_OPTIONS) to read /proc/kallsyms once and bind-mount the copy over it: each
/// read of the kernel's own file takes ~45 s there, and perf reads it several times per command.
/// With `vpmu.kallsyms=snapshot` (host quirks on), /init must have found the root image's copy
/// of this kernel's symbols (guest-image/build.sh rootfs) rather than reading /proc/kallsyms in
/// emulated code.
fn check_kallsyms_snapshot(console: &str) {
    let asked = console
        .lines()
        .any(|l| l.contains("Command line:") && l.contains("vpmu.kallsyms=snapshot"));
    if asked {
        let snap = console
            .lines()
            .find(|l| l.starts_with("vpmu: /proc/kallsyms from the image's copy"))
            .unwrap_or_else(|| {
                panic!("/init did not use the image's copy of the kernel's symbols:\n{console}")
            });
        eprintln!("{snap}");
    }
}

#[test]
#[ignore = "boots Linux with perf and OProfile (15-50 min on hosts that emulate guest kernel code); needs VPMU_TEST_KERNEL/VPMU_TEST_ROOTFS; see the file's header"]
fn stock_perf_and_oprofile_in_the_guest_in_both_modes() {
    let Some((kernel, rootfs)) = inputs() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // One boot: the guest switches the mode through the vPMU control port; frames are tagged
    // with the mode the port reports. The VMM samples the same run from the host (issue 19:
    // the active and the passive profiler side by side).
    let passive = dir.path().join("passive.profile");
    let b = boot(
        &kernel,
        &rootfs,
        "cpu-switch",
        // 4000 cpu_split rounds in perf record and operf (the image's default is 6000): ~280
        // samples at 200M cycles where guest kernel code is emulated, each costing the guest's
        // profiler ~0.1 s of emulated kernel work; check_hot_share's bar follows the count.
        "vpmu.experiment=perf-stat,perf-record,ocount,operf,vector-regs,lib-chain,perf-user-read vpmu.modes=cpu-switch,domain-switch vpmu.profile_rounds=4000",
        dir.path(),
        &["--host-profile".as_ref(), passive.as_os_str()],
    );
    check_boot(&b);
    // The VMM's end-of-run report: PMIs per mode, host-quirk fix-ups (any emulation failure met
    // after init is there), the SYSCALL relay's count and cost.
    let summary: Vec<&str> = b
        .vmm_stderr
        .lines()
        .filter(|l| l.starts_with("[vpmu-vmm]"))
        .collect();
    eprintln!("the VMM's end-of-run report:\n{}", summary.join("\n"));
    for mode in ["cpu-switch", "domain-switch"] {
        check_mode(&b, mode);
        check_active_and_passive(&b, mode, &passive, &rootfs);
        check_library_callers(mode, &passive, &rootfs);
    }
    // The user-space RDPMCs of perf's test came through the VMM's #GP trap.
    let served = summary
        .iter()
        .find_map(|l| {
            let n = l
                .split_once("RDPMC trap: ")?
                .1
                .split_once(" RDPMCs served")?
                .0;
            n.parse::<u64>().ok()
        })
        .unwrap_or(0);
    assert!(
        served > 0,
        "no RDPMC served through the #GP trap:\n{}",
        summary.join("\n")
    );
    // The soft backend cannot count instructions: on the AMD model (no CPUID bit to say so) the
    // VMM names the event instead of leaving the guest's 0 unexplained.
    if !b.vmm_stderr.contains("Intel model") {
        assert!(
            b.vmm_stderr
                .contains("events the vPMU's backend cannot count")
                && b.vmm_stderr.contains("(Instructions)"),
            "the VMM did not warn about the uncounted instructions event\n{}",
            dump(&b)
        );
    }
    if let Some(out) = std::env::var_os("VPMU_TEST_KEEP") {
        let out = Path::new(&out);
        std::fs::create_dir_all(out).unwrap();
        for f in std::fs::read_dir(dir.path()).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), out.join(f.file_name())).unwrap();
        }
    }
}

/// `compare --profiler perf` end to end on the Intel model (`--pmu-model intel`: a generic
/// GenuineIntel CPU, so the guest runs Linux's Intel PMU driver), so that perf in the guest is
/// driven on both models in one test run (the experiments boot above uses the host's, AMD here).
#[test]
#[ignore = "boots Linux with perf (20-30 min on hosts that emulate guest kernel code); needs VPMU_TEST_KERNEL/VPMU_TEST_ROOTFS; see the file's header"]
fn compare_with_the_guests_perf() {
    compare_in_the_guest("perf", "intel");
}

/// `compare --profiler oprofile` end to end, on the host's model: OProfile identifies the CPU with
/// a user-space CPUID, which kvm_pvm hosts run natively (the host's AMD identity), so on the Intel
/// model it would program AMD's cycles code (docs/guest.md, "OProfile on the Intel model").
#[test]
#[ignore = "boots Linux with OProfile (10-30 min on hosts that emulate guest kernel code); needs VPMU_TEST_KERNEL/VPMU_TEST_ROOTFS; see the file's header"]
fn compare_with_the_guests_oprofile() {
    compare_in_the_guest("oprofile", "auto");
}

/// `compare --profiler PROFILER --pmu-model MODEL` end to end: one boot. The three boots of this
/// file run side by side (scripts/test.sh: --test-threads 3).
/// The packet-receive comparison's size and bars on this kind of host.
struct PacketRxSize {
    secs: u64,
    pps: u32,
    /// `--guest-period` (None: compare's default for the host).
    period: Option<u64>,
    /// Samples the register-access functions must have in domain-switch, and how many times
    /// their cpu-switch share they must reach.
    min_samples: u64,
    min_ratio: f64,
}

impl PacketRxSize {
    fn for_this_host(profiler: &str) -> PacketRxSize {
        let emulated =
            runtime::host_quirks::HostKind::decide(runtime::host_quirks::QuirkSetting::Auto)
                .quirks();
        if !emulated {
            // A VT-x/SVM host (tier 4's nested kvm_amd, VPMU_SVM_PROFILERS=1): guest kernel code
            // runs in hardware and interrupts are taken at once. 30 s windows at 200 echo
            // requests/s and compare's period there (5M cycles): one run read vm_interrupt +
            // vm_notify 4 of 32 samples in cpu-switch, 92 of 120 in domain-switch (6.1x). The
            // seeds' size (>= 1000 samples, issue 32) needs a period near 1M, at which the
            // nested host's cpu-switch windows stalled (docs/accounting-modes.md): open.
            return PacketRxSize {
                secs: 30,
                pps: 200,
                period: None,
                min_samples: 50,
                min_ratio: 3.0,
            };
        }
        // Guest kernel code emulated (kvm_pvm): 90 s windows at 10 requests a second and the
        // default period (200M cycles). OProfile's system-wide profile keeps few of the
        // register-access samples in domain-switch here (6-23 samples, where perf had 53-163 in
        // the same kind of boot): operf 1.4 silently drops every kernel sample taken in the idle
        // task, where an idle guest takes the card's interrupts (docs/guest.md), so its bar is
        // only that the share does not fall and the functions are there.
        let (min_samples, min_ratio) = if profiler == "perf" {
            (50, 3.0)
        } else {
            (1, 1.0)
        };
        PacketRxSize {
            secs: 90,
            pps: 10,
            period: None,
            min_samples,
            min_ratio,
        }
    }
}

fn compare_in_the_guest(profiler: &str, model: &str) {
    let Some((kernel, rootfs)) = inputs() else {
        return;
    };
    let size = PacketRxSize::for_this_host(profiler);
    let dir = tempfile::tempdir().unwrap();
    let start = std::time::Instant::now();
    let (secs, pps) = (size.secs.to_string(), size.pps.to_string());
    // compare allows its boot this much and then 4 x --phase-secs + 600 s more: the whole run
    // stays within VPMU_TEST_TIMEOUT, as the experiments boot's does.
    let boot_timeout = timeout_secs()
        .saturating_sub(4 * size.secs + 600)
        .max(600)
        .to_string();
    let mut args = vec![
        "--workload",
        "packet-rx",
        "--profiler",
        profiler,
        "--pmu-model",
        model,
        "--kernel",
        &kernel,
        "--disk",
        &rootfs,
        "--phase-secs",
        &secs,
        "--net-rx-pps",
        &pps,
        "--boot-timeout",
        &boot_timeout,
    ];
    let period = size.period.map(|p| p.to_string());
    if let Some(p) = &period {
        args.extend(["--guest-period", p]);
    }
    let run = common::run_compare(&args, dir.path());
    eprintln!(
        "compare --profiler {profiler} --pmu-model {model}: {:.0} s wall",
        start.elapsed().as_secs_f64()
    );
    let console = std::fs::read_to_string(dir.path().join("guest-console.log")).unwrap_or_default();
    if model == "intel" {
        assert!(
            console.contains("Intel PMU driver"),
            "{profiler}: the guest did not take its Intel PMU driver:\n{console}"
        );
    }
    for bad in [
        "general protection fault",
        "Oops",
        "NMI received for unknown reason",
        "irq loop stuck",
    ] {
        let found = kernel_lines(&console, bad);
        assert!(
            found.is_empty(),
            "{profiler}: guest log has {found:?}\n{console}"
        );
    }
    assert_no_user_crashes(&console, profiler);
    check_kallsyms_snapshot(&console);
    check_packet_gate(&run.stderr, profiler);
    let stdout = run.stdout;
    let read = |name: &str| common::compare_csv(dir.path(), name);
    let packets = read(&format!("packet-rx-{profiler}.csv"));
    let control = read(&format!("packet-rx-control-{profiler}.csv"));
    assert!(!packets.is_empty() && !control.is_empty());
    // The functions that access the card's registers (the VMM's work lands on them in
    // domain-switch): enough samples to mean something, and at least 3x their cpu-switch share.
    let (cpu, dom) = register_access_samples(&packets);
    let share = |n: u64, total: u64| n as f64 / total.max(1) as f64;
    let totals = |rows: &[vmm::compare::table::Row]| -> (u64, u64) {
        rows.iter()
            .filter(|r| !r.function.starts_with('['))
            .fold((0, 0), |(a, b), r| {
                (a + r.cpu_samples, b + r.domain_samples)
            })
    };
    let (cpu_total, dom_total) = totals(&packets);
    eprintln!(
        "{profiler}: vm_interrupt + vm_notify: {cpu} of {cpu_total} samples in cpu-switch, {dom} of {dom_total} in domain-switch"
    );
    let (min_samples, min_ratio) = (size.min_samples, size.min_ratio);
    assert!(
        dom >= min_samples,
        "{profiler}: only {dom} samples of the register-access functions in domain-switch (want >= {min_samples}):\n{stdout}"
    );
    assert!(
        share(dom, dom_total) >= min_ratio * share(cpu, cpu_total),
        "{profiler}: register-access functions {cpu}/{cpu_total} in cpu-switch, {dom}/{dom_total} in domain-switch: less than {min_ratio}x:\n{stdout}"
    );
    // The CPU-bound control moves less than NOISE_SDS standard deviations of its sampling noise.
    let hot = control
        .iter()
        .find(|r| r.function == "hot_75")
        .unwrap_or_else(|| panic!("{profiler}: no hot_75 in the control:\n{stdout}"));
    let (n1, n2) = totals(&control);
    let (p1, p2) = (share(hot.cpu_samples, n1), share(hot.domain_samples, n2));
    let p = (hot.cpu_samples + hot.domain_samples) as f64 / (n1 + n2).max(1) as f64;
    let sds = testkit::NOISE_SDS;
    let bar = sds * testkit::share_diff_sd_pp(p, n1, n2) / 100.0;
    eprintln!(
        "{profiler}: control hot_75 {:.1}% -> {:.1}% ({n1}/{n2} samples; {sds} sd = {:.1} pp)",
        100.0 * p1,
        100.0 * p2,
        100.0 * bar
    );
    assert!(
        (p2 - p1).abs() < bar,
        "{profiler}: the control moved {:.1} pp, more than {sds} sd ({:.1} pp)",
        100.0 * (p2 - p1),
        100.0 * bar
    );
    if let Some(out) = std::env::var_os("VPMU_TEST_KEEP") {
        let out = Path::new(&out).join(format!("compare-{profiler}"));
        std::fs::create_dir_all(&out).unwrap();
        for f in std::fs::read_dir(dir.path()).unwrap() {
            let f = f.unwrap();
            if f.path().is_file() {
                std::fs::copy(f.path(), out.join(f.file_name())).unwrap();
            }
        }
    }
}

/// Interactive use (issue 18): `run --disk ROOTFS --vpmu cpu-switch` with nothing else asked gives
/// a shell on the console (the image's /etc/vpmu/interactive); commands typed on the VMM's stdin
/// run there: perf stat and OProfile's ocount count cycles, and `exit` powers the guest off.
#[test]
#[ignore = "boots Linux and drives its shell (5-15 min on hosts that emulate guest kernel code); needs VPMU_TEST_KERNEL/VPMU_TEST_ROOTFS; see the file's header"]
fn a_shell_on_the_console_runs_perf_and_ocount() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let Some((kernel, rootfs)) = inputs() else {
        return;
    };
    let start = std::time::Instant::now();
    let mut child = Command::new(BIN)
        .args([
            "run",
            "--kernel",
            &kernel,
            "--disk",
            &format!("{rootfs},readonly=on"),
        ])
        .args(["--cpus", "1", "--memory", "1024", "--vpmu", "cpu-switch"])
        .args(["--timeout", &timeout_secs().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let vmm_stderr =
        std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let mut console = String::new();
    let mut typed = false;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap_or_default();
        if !typed && line.contains("vpmu: interactive shell") {
            // What a user types: the tty holds it until the shell reads.
            stdin
                .write_all(
                    b"perf stat -e cycles -- cpu_split 40 2>&1; echo \"VPMU-SHELL-PERF=$?\"\n\
                      ocount cpu_split 20 2>&1; echo \"VPMU-SHELL-OCOUNT=$?\"\n\
                      exit\n",
                )
                .unwrap();
            stdin.flush().unwrap();
            typed = true;
        }
        console.push_str(&line);
        console.push('\n');
    }
    let status = child.wait().unwrap();
    let vmm_stderr = vmm_stderr.join().unwrap();
    eprintln!(
        "interactive shell: {:.0} s wall, exit {:?}",
        start.elapsed().as_secs_f64(),
        status.code()
    );
    let all = format!("{console}\n--- vmm ---\n{vmm_stderr}");
    assert!(typed, "no shell on the console:\n{all}");
    assert_eq!(
        status.code(),
        Some(0),
        "the guest did not power off:\n{all}"
    );
    assert_no_user_crashes(&console, "interactive shell");
    check_kallsyms_snapshot(&console);
    for done in ["VPMU-SHELL-PERF=0", "VPMU-SHELL-OCOUNT=0"] {
        assert!(console.contains(done), "{done} missing:\n{all}");
    }
    // perf stat's count line: a number, then `cycles` (not <not supported>).
    let counted = console.lines().any(|l| {
        let mut w = l.split_whitespace();
        matches!((w.next(), w.next()), (Some(n), Some("cycles"))
            if n.replace(',', "").parse::<u64>().is_ok_and(|n| n > 0))
    });
    assert!(counted, "perf stat counted no cycles:\n{all}");
}

/// Samples of the functions that access the card's registers (vm_interrupt, vm_notify) in
/// cpu-switch and in domain-switch.
fn register_access_samples(rows: &[vmm::compare::table::Row]) -> (u64, u64) {
    rows.iter()
        .filter(|r| vmm::compare::linux::DEVICE_ACCESS_FUNCTIONS.contains(&r.function.as_str()))
        .fold((0, 0), |(a, b), r| {
            (a + r.cpu_samples, b + r.domain_samples)
        })
}

/// Issue 19 (passive profiling, "who was running" and "where in user space"): the host-side
/// profile of a boot whose init is cpu_split itself (`init=/usr/bin/cpu_split`; when it returns
/// the kernel panics "Attempted to kill init", which is this boot's expected end, exit code 3).
/// No profiler runs in the guest: the VMM names the task of each sample from guest memory and
/// `report --guest-files` resolves its user RIPs in the image's copy of cpu_split. Checks: every
/// user-space sample names cpu_split[1] and its executable; cpu_split's hot_75 share of its two
/// functions is the designed 75% (within 5 points; ~14,000 samples, sampling noise ~0.4 points);
/// the folded and SVG formats come out of the same file.
#[test]
#[ignore = "boots Linux (1-5 min on hosts that emulate guest kernel code); needs VPMU_TEST_KERNEL/VPMU_TEST_ROOTFS; see the file's header"]
fn the_host_side_profile_names_cpu_split_and_its_functions() {
    let Some((kernel, rootfs)) = inputs() else {
        return;
    };
    let files = Path::new(&rootfs).with_file_name("files");
    assert!(
        files.join("usr/bin/cpu_split").is_file(),
        "{}: no copy of the image's ELF files beside it (guest-image/build.sh rootfs keeps them)",
        files.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("cpu_split.profile");
    let out = Command::new(BIN)
        .args(["run", "--kernel", &kernel, "--disk"])
        .arg(format!("{rootfs},readonly=on"))
        .args(["--cpus", "1", "--vpmu", "cpu-switch"])
        .args(["--cmdline", "init=/usr/bin/cpu_split -- 3000"])
        .arg("--host-profile")
        .arg(&profile)
        .args(["--timeout", &timeout_secs().to_string()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(3) && stderr.contains("Attempted to kill init"),
        "expected cpu_split to run as init and return (a kernel panic, exit code 3), got {}:\n{}",
        out.status,
        stderr
    );
    let files = files.to_str().unwrap();
    let report =
        |format: &str| common::report(&profile, &["--format", format, "--guest-files", files]);
    let doc: serde_json::Value = serde_json::from_slice(&report("json")).unwrap();
    let rows = doc["rows"].as_array().unwrap();
    let samples = |process: &str, object: &str, symbol: &str| -> u64 {
        rows.iter()
            .filter(|r| {
                (process.is_empty() || r["process"] == process)
                    && (object.is_empty() || r["object"] == object)
                    && (symbol.is_empty() || r["symbol"] == symbol)
            })
            .map(|r| r["samples"].as_u64().unwrap())
            .sum()
    };
    let top: Vec<String> = rows
        .iter()
        .take(10)
        .map(|r| {
            format!(
                "{} {} {} {}",
                r["samples"], r["process"], r["object"], r["symbol"]
            )
        })
        .collect();
    let user: u64 = rows
        .iter()
        .filter(|r| r["object"] != "")
        .map(|r| r["samples"].as_u64().unwrap())
        .sum();
    let ours = samples("cpu_split[1]", "/usr/bin/cpu_split", "");
    let hot = samples("cpu_split[1]", "/usr/bin/cpu_split", "hot_75");
    let cold = samples("cpu_split[1]", "/usr/bin/cpu_split", "cold_25");
    let share = 100.0 * hot as f64 / (hot + cold).max(1) as f64;
    eprintln!(
        "passive profile of cpu_split: {ours} of {user} user-space samples name cpu_split[1] and \
         /usr/bin/cpu_split; hot_75 {hot}, cold_25 {cold}: {share:.1}%\n{}",
        top.join("\n")
    );
    assert!(
        user > 1000 && ours * 100 >= user * 95,
        "{ours} of {user} user-space samples name cpu_split:\n{}",
        top.join("\n")
    );
    assert!(
        (share - 75.0).abs() <= 5.0 && hot + cold > 1000,
        "hot_75 is {share:.1}% of cpu_split's samples ({hot} vs {cold}), not 75 +- 5:\n{}",
        top.join("\n")
    );
    let folded = String::from_utf8(report("folded")).unwrap();
    // The call stack: main calls hot_75, a leaf without a frame of its own (its caller comes
    // from [rsp]); main's frame pointer leads to glibc's start code.
    assert!(
        folded.contains(";main;hot_75 ") && folded.contains("cpu_split[1];/usr/bin/cpu_split;"),
        "{folded}"
    );
    let main_hot: u64 = folded
        .lines()
        .filter(|l| l.contains("cpu_split[1];/usr/bin/cpu_split;") && l.contains(";main;hot_75 "))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(
        main_hot * 100 >= hot * 90,
        "{main_hot} of hot_75's {hot} samples have main as caller:\n{folded}"
    );
    assert!(report("svg").starts_with(b"<?xml"));
}
