//! Seccomp (docs/security.md): while a VM runs, every thread of the VMM is in seccomp filter
//! mode (`Seccomp: 2` in /proc/<pid>/task/<tid>/status), and the run still ends normally;
//! `--seccomp off` leaves them unfiltered. (A forbidden call's report and exit code are
//! checked by the unit tests in vmm/src/seccomp/mod.rs.)

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm::end::{code, VmEnd};
use vmm::vm::{Boot, Controller, VmConfig, VpmuSetting};

const BIN: &str = env!("CARGO_BIN_EXE_vpmu-vmm");

/// A minimal ELF64 "kernel": one PT_LOAD segment of HLTs at 16 MiB, entered in long mode with
/// interrupts off, so each vCPU sleeps in KVM_RUN until --timeout.
fn halt_elf() -> Vec<u8> {
    let size = 16u64;
    let mut f = vec![0u8; 0x78];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = 2; // 64-bit
    f[5] = 1; // little endian
    f[6] = 1; // version
    f[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    f[20..24].copy_from_slice(&1u32.to_le_bytes());
    f[24..32].copy_from_slice(&0x100_0000u64.to_le_bytes()); // entry
    f[32..40].copy_from_slice(&64u64.to_le_bytes()); // phoff
    f[52..54].copy_from_slice(&64u16.to_le_bytes()); // ehsize
    f[54..56].copy_from_slice(&56u16.to_le_bytes()); // phentsize
    f[56..58].copy_from_slice(&1u16.to_le_bytes()); // phnum
    let ph = &mut f[64..120];
    ph[0..4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    ph[4..8].copy_from_slice(&5u32.to_le_bytes()); // R+X
    ph[8..16].copy_from_slice(&0x78u64.to_le_bytes()); // offset
    ph[16..24].copy_from_slice(&0xffff_ffff_8100_0000u64.to_le_bytes()); // vaddr
    ph[24..32].copy_from_slice(&0x100_0000u64.to_le_bytes()); // paddr
    ph[32..40].copy_from_slice(&size.to_le_bytes()); // filesz
    ph[40..48].copy_from_slice(&size.to_le_bytes()); // memsz
    f.resize(0x78 + size as usize, 0xf4);
    f
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
    let report = vmm::vm::run(&cfg).unwrap();
    watcher.join().expect("every thread filtered");
    assert_eq!(
        report.end,
        VmEnd::Stopped("seccomp test done".into()),
        "{:?}",
        report.console_tail
    );
}
