//! Seccomp (docs/security.md): while a VM runs, every thread of the VMM is in seccomp filter
//! mode (`Seccomp: 2` in /proc/<pid>/task/<tid>/status), and the run still ends normally;
//! `--seccomp off` leaves them unfiltered. (A forbidden call's report and exit code are
//! checked by the unit tests in vmm/runtime/src/seccomp/mod.rs.)

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime::end::{code, VmEnd};
use runtime::vm::{Boot, Controller, VmConfig, VpmuSetting};

const BIN: &str = env!("CARGO_BIN_EXE_vpmu-vmm");

/// A minimal ELF64 "kernel" of HLTs, entered in long mode with interrupts off, so each vCPU
/// sleeps in KVM_RUN until --timeout.
fn halt_elf() -> Vec<u8> {
    common::tiny_elf(16)
}

/// tid -> (thread name, the `Seccomp:` mode) for every thread of process `pid`.
fn thread_modes(pid: &str) -> BTreeMap<String, (String, String)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let p = e.path();
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(p.join("comm")),
            std::fs::read_to_string(p.join("status")),
        ) else {
            continue; // the thread ended meanwhile
        };
        let mode = status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| "no Seccomp line".into());
        out.insert(
            e.file_name().to_string_lossy().into_owned(),
            (comm.trim().to_string(), mode),
        );
    }
    out
}

fn names(modes: &BTreeMap<String, (String, String)>) -> Vec<&str> {
    let mut v: Vec<&str> = modes.values().map(|(n, _)| n.as_str()).collect();
    v.sort();
    v
}

/// Polls the threads of `pid` until `expected` names are all there and `done` says the modes
/// are as wanted, or fails after `within` showing the last listing.
fn wait_for_threads(
    pid: &str,
    expected: &[&str],
    within: Duration,
    done: impl Fn(&BTreeMap<String, (String, String)>) -> bool,
) -> BTreeMap<String, (String, String)> {
    let t0 = Instant::now();
    loop {
        let modes = thread_modes(pid);
        let have = names(&modes);
        if expected.iter().all(|n| have.contains(n)) && done(&modes) {
            return modes;
        }
        assert!(
            t0.elapsed() < within,
            "threads of {pid} never got there: {modes:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The binary, with every kind of thread `run` starts: main, two vCPUs, the trace writer, the
/// mode schedule, the stdin reader (stdin is a pipe kept open).
fn run_binary(dir: &Path, seccomp: &str) -> (std::process::Child, String) {
    let kernel = dir.join("halt.elf");
    std::fs::write(&kernel, halt_elf()).unwrap();
    let trace = dir.join("t.trace");
    let child = Command::new(BIN)
        .args(["run", "--kernel"])
        .arg(&kernel)
        .args(["--cpus", "2", "--memory", "64", "--timeout", "8"])
        .args(["--vpmu", "cpu-switch"])
        .args(["--vpmu-schedule", "cpu-switch:1,domain-switch:1,repeat"])
        .arg("--trace")
        .arg(&trace)
        .arg("--host-profile")
        .arg(&trace)
        .arg("--console")
        .arg(dir.join("console"))
        .arg("--serial2")
        .arg(dir.join("serial2"))
        .args(["--seccomp", seccomp])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    (child, pid)
}

const RUN_THREADS: &[&str] = &[
    "vpmu-vmm",
    "vcpu0",
    "vcpu1",
    "trace-writer",
    "vpmu-schedule",
    "stdin",
];

#[test]
fn every_thread_of_a_running_vmm_is_filtered() {
    if !common::kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (mut child, pid) = run_binary(dir.path(), "on");
    let mut stdin = child.stdin.take().unwrap();
    let modes = wait_for_threads(&pid, RUN_THREADS, Duration::from_secs(60), |m| {
        m.values().all(|(_, mode)| mode == "2")
    });
    eprintln!("threads: {modes:?}");
    // Give the console something to feed (the stdin thread's path), then let --timeout end it:
    // the end of the run (joins, trace finish, report) happens under the filters too.
    let _ = stdin.write_all(b"x\n");
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("seccomp"), "{stderr}");
    assert_eq!(out.status.code(), Some(code::TIMEOUT), "{stderr}");
    assert!(stderr.contains("trace "), "the trace was written: {stderr}");
}

#[test]
fn seccomp_off_leaves_threads_unfiltered() {
    if !common::kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (mut child, pid) = run_binary(dir.path(), "off");
    let stdin = child.stdin.take().unwrap();
    let modes = wait_for_threads(&pid, RUN_THREADS, Duration::from_secs(60), |_| true);
    let filtered: Vec<_> = modes.values().filter(|(_, m)| m != "0").collect();
    assert!(filtered.is_empty(), "{modes:?}");
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(code::TIMEOUT),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// In process (as tests and `compare` use it): the controller thread, the vCPU and the calling
/// thread are filtered while the VM runs; the controller switches the mode, kicks and stops
/// the VM under its filter.
#[test]
fn controller_and_calling_thread_are_filtered() {
    if !common::kvm_available() {
        return;
    }
    let checked = Arc::new(AtomicBool::new(false));
    // SAFETY: gettid has no preconditions.
    let caller = unsafe { libc::gettid() }.to_string();
    let watcher = {
        let checked = checked.clone();
        let caller = caller.clone();
        // Started before vm::run, so it is not filtered itself: it can read /proc.
        std::thread::spawn(move || {
            let modes = wait_for_threads(
                "self",
                &["vm-controller", "vcpu0"],
                Duration::from_secs(60),
                |m| {
                    m.values()
                        .filter(|(n, _)| n == "vm-controller" || n == "vcpu0")
                        .all(|(_, mode)| mode == "2")
                        && m.get(&caller).is_some_and(|(_, mode)| mode == "2")
                },
            );
            eprintln!("threads: {modes:?}");
            checked.store(true, Ordering::SeqCst);
        })
    };
    let flag = checked.clone();
    let dir = tempfile::tempdir().unwrap();
    let cfg = VmConfig {
        memory_mib: 64,
        vpmu: VpmuSetting::CpuSwitch,
        timeout: Some(Duration::from_secs(120)),
        console_out: Some(dir.path().join("console")),
        controller: Some(Controller(Arc::new(move |h| {
            while !flag.load(Ordering::SeqCst) && h.sleep(Duration::from_millis(20)) {}
            h.set_mode(vpmu::AccountingMode::DomainSwitch, "test");
            h.control.kick_all();
            h.control
                .request_end(VmEnd::Stopped("seccomp test done".into()));
        }))),
        ..VmConfig::new(Boot::tiny(&tiny_guests::HALT64))
    };
    let report = runtime::vm::run(&cfg).unwrap();
    watcher.join().expect("every thread filtered");
    assert_eq!(
        report.end,
        VmEnd::Stopped("seccomp test done".into()),
        "{:?}",
        report.console_tail
    );
}
