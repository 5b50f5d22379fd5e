//! Tier 2: guest user space through the SYSCALL relay (vmm/runtime/src/host_quirks/syscall_relay/).
//! A tiny kernel with Linux's GDT layout and SYSCALL MSRs drops to CPL3, makes N system calls,
//! takes user #PFs (not present, supervisor page, a jump to LSTAR), M `ud2` round trips and one
//! kernel #PF (guest-image/tiny/asm/syscall64.S). Exact counts, return values, registers and
//! error codes are checked on the guest's side; the relay's own counts on the VMM's. On a
//! VT-x/SVM host SYSCALL works natively and the same guest checks the CPU instead.

mod common;

use std::time::Duration;

use runtime::end::VmEnd;
use runtime::host_quirks::syscall_relay::kinds;

/// One run's measurements (after the guest's and the relay's counts were checked).
struct Sample {
    /// Relayed system calls (the guest's N and its final one; 0 where SYSCALL is native).
    relayed: u64,
    /// TSC cycles per system call round trip and per `ud2` round trip, as the guest saw them.
    per_syscall: f64,
    per_ud2: f64,
    /// The run report's mean VMM µs per relayed system call.
    vmm_us: Option<f64>,
    /// Ioctls the access layer made, and whether the vCPU used sync registers.
    access_ioctls: u64,
    sync_regs: bool,
}

#[test]
fn system_calls_faults_and_ud2_from_guest_user_space() {
    if !common::kvm_available() {
        return;
    }
    let s = run_syscall64(true);
    eprintln!(
        "relayed system call: {:.0} TSC cycles round trip; CPL3 ud2 -> #UD -> IRETQ: {:.0} ({:.2}x)",
        s.per_syscall,
        s.per_ud2,
        s.per_syscall / s.per_ud2
    );
}

/// Issue 20 item 5: with KVM_CAP_SYNC_REGS a relayed system call reads and writes the vCPU's
/// registers through `kvm_run`, so KVM_RUN is its only ioctl. Runs the guest with sync
/// registers and without, interleaved, and prints both (`--nocapture`).
#[test]
fn a_relayed_system_call_makes_no_register_ioctl_with_sync_regs() {
    if !common::kvm_available() {
        return;
    }
    let mut on = Vec::new();
    let mut off = Vec::new();
    for _ in 0..3 {
        on.push(run_syscall64(true));
        off.push(run_syscall64(false));
    }
    for (name, v) in [("sync regs", &on), ("ioctls   ", &off)] {
        for s in v.iter() {
            eprintln!(
                "{name}: {} relayed, VMM {:>6.1} us per relayed call, {} access ioctls ({:.2} per relayed call); round trip {:.0} TSC cycles, ud2 {:.0} ({:.2}x)",
                s.relayed,
                s.vmm_us.unwrap_or(f64::NAN),
                s.access_ioctls,
                s.access_ioctls as f64 / s.relayed.max(1) as f64,
                s.per_syscall,
                s.per_ud2,
                s.per_syscall / s.per_ud2
            );
        }
    }
    assert!(off.iter().all(|s| !s.sync_regs), "disabled by the config");
    if on[0].relayed == 0 {
        // A VT-x/SVM host: the CPU runs the system calls, no exit is taken for them, so neither
        // way to the registers is used per call.
        for s in on.iter().chain(&off) {
            assert!(
                s.access_ioctls < 20,
                "SYSCALL native, yet {} access ioctls",
                s.access_ioctls
            );
        }
        testkit::not_checked(
            "the relay's sync-register path",
            "SYSCALL runs natively on this host (host quirks off): nothing is relayed",
        );
        return;
    }
    if !on[0].sync_regs {
        testkit::not_checked(
            "the relay's sync-register path",
            "no KVM_CAP_SYNC_REGS (regs|sregs|events) on this host: ioctls only",
        );
        return;
    }
    for (a, b) in on.iter().zip(&off) {
        // Without sync registers each relayed call costs at least a register read and write.
        assert!(
            b.access_ioctls >= 2 * b.relayed,
            "ioctl path: {} ioctls for {} relayed calls",
            b.access_ioctls,
            b.relayed
        );
        // With them, what is left is independent of the number of calls: the relay's LSTAR/IDT
        // look before it is installed, its one MSR read, and the fix-ups of other exits.
        assert!(
            a.access_ioctls < 20 && a.access_ioctls * 10 < a.relayed,
            "sync regs: {} ioctls for {} relayed calls",
            a.access_ioctls,
            a.relayed
        );
    }
}

fn run_syscall64(sync_regs: bool) -> Sample {
    let r = common::run_tiny_with(&tiny_guests::SYSCALL64, Duration::from_secs(20), |c| {
        c.sync_regs = sync_regs
    });
    assert_eq!(
        r.report.end,
        VmEnd::PowerOff,
        "console: {}; serial2 {:x?}; fix-ups {:?}",
        r.console,
        r.serial2,
        r.report.fixups
    );
    let w = r.words();
    assert_eq!(w.len(), 19, "guest report incomplete: {w:x?}");
    let (n, m) = (w[17], w[18]);
    let lstar = w[14];
    assert_eq!(w[0], n, "system calls seen by the guest kernel");
    assert_eq!(w[1], 0, "user-side errors (return value, RBX, CS, IF)");
    assert_eq!(w[2], 0, "kernel-side errors (CS, SS, IF at the entry)");
    assert_eq!(w[3], 3, "user #PFs");
    assert_eq!(w[4], 1, "kernel #PFs");
    assert_eq!(w[5], m, "#UDs");
    assert_eq!(&w[6..10], &[0, 4, 5, 0x15], "#PF error codes in order");
    assert_eq!(
        &w[10..14],
        &[0x40_0000, 0x40_0000, 0x60_0000, lstar],
        "CR2 of each #PF"
    );
    let per_syscall = w[15] as f64 / n as f64;
    let per_ud2 = w[16] as f64 / m as f64;
    let mut relayed = 0;
    if runtime::host_quirks::HostKind::decide(runtime::host_quirks::QuirkSetting::Auto).quirks() {
        let count = |k: &str| {
            r.report
                .fixups
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, c)| *c)
                .unwrap_or(0)
        };
        relayed = count(kinds::SYSCALL);
        assert_eq!(relayed, n + 1, "relayed (N and the final one)");
        assert_eq!(count(kinds::USER_PF), 2, "user #PFs passed on");
        assert_eq!(count(kinds::USER_JUMP), 1, "the jump to LSTAR passed on");
        assert_eq!(count(kinds::KERNEL_PF), 1, "kernel #PFs passed on");
    } else {
        eprintln!("host quirks are off (VT-x/SVM host): SYSCALL ran natively, no relay counts");
    }
    Sample {
        relayed,
        per_syscall,
        per_ud2,
        vmm_us: r.report.syscall_relay.map(|(_, us)| us),
        access_ioctls: r.report.exits.iter().map(|e| e.access_ioctls).sum(),
        sync_regs: r.report.exits.iter().all(|e| e.sync_regs),
    }
}
