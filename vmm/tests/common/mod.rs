//! Shared helpers for tests that need /dev/kvm.

#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use runtime::vm::{Boot, RunReport, VmConfig};
use tiny_guests::TinyGuest;

/// Returns false (after saying so loudly) when this tier cannot run here. Without /dev/kvm the
/// test fails unless VPMU_ALLOW_NO_KVM=1 is set, so a machine without KVM never passes silently.
pub(crate) fn kvm_available() -> bool {
    if Path::new("/dev/kvm").exists() {
        return true;
    }
    let msg = "*** /dev/kvm is missing: the KVM test tier CANNOT RUN on this machine ***";
    if std::env::var("VPMU_ALLOW_NO_KVM").as_deref() == Ok("1") {
        testkit::not_checked(
            "the KVM tiers of this binary",
            "/dev/kvm is missing (skipped because VPMU_ALLOW_NO_KVM=1)",
        );
        return false;
    }
    panic!("{msg}; set VPMU_ALLOW_NO_KVM=1 to skip it knowingly");
}

/// Whether the run's host answered guest RDPMC itself (the VMM's host probe, in its report):
/// then an RDPMC the VMM does not rewrite reads KVM's 0 instead of faulting (Linux 6.1's
/// kvm_amd, even with its PMU off), and there is no #GP to trap.
pub(crate) fn kvm_answers_rdpmc(report: &RunReport) -> bool {
    report.host.kvm_answers_rdpmc == Some(true)
}

/// Whether this host's CPU is QEMU's emulator (the SVM host of `scripts/svm-host.sh`: Linux
/// under `qemu-system-x86_64 -accel tcg -cpu max`), whose nested guests see its emulation's own
/// quirks beside KVM's.
pub(crate) fn host_cpu_is_qemus_emulator() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains("QEMU TCG CPU"))
}

pub(crate) struct TinyRun {
    pub report: RunReport,
    pub console: String,
    pub serial2: Vec<u8>,
}

impl TinyRun {
    /// What the guest wrote on COM2 as 8-byte little-endian words (the tiny guests' reports;
    /// a trailing partial word is dropped, so a short report shows as too few words).
    pub(crate) fn words(&self) -> Vec<u64> {
        self.serial2
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

pub(crate) fn run_tiny(guest: &TinyGuest, timeout: Duration) -> TinyRun {
    run_tiny_with(guest, timeout, |_| {})
}

/// Runs a tiny guest with a configuration the caller may adjust.
pub(crate) fn run_tiny_with(
    guest: &TinyGuest,
    timeout: Duration,
    adjust: impl FnOnce(&mut VmConfig),
) -> TinyRun {
    let dir = tempfile::tempdir().unwrap();
    let console = dir.path().join("console");
    let serial2 = dir.path().join("serial2");
    let cfg = VmConfig {
        memory_mib: 64,
        serial2: Some(serial2.clone()),
        timeout: Some(timeout),
        console_out: Some(console.clone()),
        ..VmConfig::new(Boot::tiny(guest))
    };
    let mut cfg = cfg;
    adjust(&mut cfg);
    // On a thread of its own: with seccomp on (the default), vm::run leaves its calling thread
    // confined to the main thread's system calls, and some tests run several VMs.
    let report = std::thread::scope(|s| {
        s.spawn(|| runtime::vm::run(&cfg))
            .join()
            .expect("vm::run thread")
    })
    .unwrap_or_else(|e| panic!("{}: {e}", guest.name));
    TinyRun {
        report,
        console: std::fs::read_to_string(console).unwrap(),
        serial2: std::fs::read(serial2).unwrap(),
    }
}

/// What `vpmu-vmm compare ARGS --out DIR` printed; panics (showing both streams) if it failed.
pub(crate) struct Compared {
    pub stdout: String,
    pub stderr: String,
}

pub(crate) fn run_compare(args: &[&str], out: &Path) -> Compared {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_vpmu-vmm"))
        .arg("compare")
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    let c = Compared {
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    eprintln!("{}\n{}", c.stdout, c.stderr);
    if !o.status.success() {
        // The reason goes into the panic message itself: a CI summary may keep only that.
        let lines: Vec<&str> = c.stderr.lines().collect();
        panic!(
            "vpmu-vmm compare {args:?} failed ({}); the end of its stderr:\n{}",
            o.status,
            lines[lines.len().saturating_sub(40)..].join("\n")
        );
    }
    c
}

/// The rows of a CSV that `compare` wrote into `dir`.
pub(crate) fn compare_csv(dir: &Path, name: &str) -> Vec<vmm::compare::table::Row> {
    let text = std::fs::read_to_string(dir.join(name))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()));
    vmm::compare::table::csv_rows(&text).unwrap()
}

/// A minimal ELF64 x86-64 executable: one PT_LOAD segment of `size` bytes of HLT at 16 MiB
/// (virtual 0xffffffff81000000, as a kernel is linked).
pub(crate) fn tiny_elf(size: u64) -> Vec<u8> {
    elf_exec(
        &vec![0xf4; size as usize],
        0x100_0000,
        0xffff_ffff_8100_0000,
        0,
    )
}

/// A minimal ELF64 x86-64 executable: one PT_LOAD segment (read/execute) of `code` right after
/// the headers, loaded at physical `paddr` (also the entry point) and virtual `vaddr`.
pub(crate) fn elf_exec(code: &[u8], paddr: u64, vaddr: u64, align: u64) -> Vec<u8> {
    let mut f = vec![0u8; 0x78];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = 2; // 64-bit
    f[5] = 1; // little endian
    f[6] = 1; // version
    f[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    f[20..24].copy_from_slice(&1u32.to_le_bytes());
    f[24..32].copy_from_slice(&paddr.to_le_bytes()); // entry
    f[32..40].copy_from_slice(&64u64.to_le_bytes()); // phoff
    f[52..54].copy_from_slice(&64u16.to_le_bytes()); // ehsize
    f[54..56].copy_from_slice(&56u16.to_le_bytes()); // phentsize
    f[56..58].copy_from_slice(&1u16.to_le_bytes()); // phnum
    let size = code.len() as u64;
    let ph = &mut f[64..120];
    ph[0..4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    ph[4..8].copy_from_slice(&5u32.to_le_bytes()); // R+X
    ph[8..16].copy_from_slice(&0x78u64.to_le_bytes()); // offset
    ph[16..24].copy_from_slice(&vaddr.to_le_bytes());
    ph[24..32].copy_from_slice(&paddr.to_le_bytes());
    ph[32..40].copy_from_slice(&size.to_le_bytes()); // filesz
    ph[40..48].copy_from_slice(&size.to_le_bytes()); // memsz
    ph[48..56].copy_from_slice(&align.to_le_bytes());
    f.extend_from_slice(code);
    f
}

/// Whether a guest console line is the kernel's report of a user process killed by a fault:
/// `traps: COMM[PID] general protection fault ip:...` or `COMM[PID]: segfault at ...`. On hosts
/// that emulate guest kernel code that was most often a process that lost its AVX registers
/// (docs/guest.md, "AVX state").
pub(crate) fn is_user_fault(line: &str) -> bool {
    line.contains("traps: ") || line.contains("]: segfault at ")
}

/// The guest log's lines that say a user process died of a fault.
pub(crate) fn user_crashes(log: &str) -> Vec<&str> {
    log.lines().filter(|l| is_user_fault(l)).collect()
}

/// `vpmu-vmm report PROFILE ARGS...`'s standard output; a failed report fails the test with its
/// stderr.
pub(crate) fn report(profile: &Path, args: &[&str]) -> Vec<u8> {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_vpmu-vmm"))
        .arg("report")
        .arg(profile)
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "vpmu-vmm report {} {args:?}: {}",
        profile.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}
