//! Tier 2: guest user space through the SYSCALL relay (vmm/src/host_quirks/syscall_relay/).
//! A tiny kernel with Linux's GDT layout and SYSCALL MSRs drops to CPL3, makes N system calls,
//! takes user #PFs (not present, supervisor page, a jump to LSTAR), M `ud2` round trips and one
//! kernel #PF (guest-image/tiny/asm/syscall64.S). Exact counts, return values, registers and
//! error codes are checked on the guest's side; the relay's own counts on the VMM's. On a
//! VT-x/SVM host SYSCALL works natively and the same guest checks the CPU instead.

mod common;

use std::time::Duration;

use vmm::end::VmEnd;
use vmm::host_quirks::syscall_relay::kinds;

#[test]
fn system_calls_faults_and_ud2_from_guest_user_space() {
    if !common::kvm_available() {
        return;
    }
    let r = common::run_tiny(&tiny_guests::SYSCALL64, Duration::from_secs(20));
    assert_eq!(
        r.report.end,
        VmEnd::PowerOff,
        "console: {}; serial2 {:x?}; fix-ups {:?}",
        r.console,
        r.serial2,
        r.report.fixups
    );
    let w: Vec<u64> = r
        .serial2
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
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
    eprintln!(
        "relayed system call: {per_syscall:.0} TSC cycles round trip; CPL3 ud2 -> #UD -> IRETQ: \
         {per_ud2:.0} ({:.2}x)",
        per_syscall / per_ud2
    );
    if vmm::host_quirks::detect(vmm::host_quirks::QuirkSetting::Auto).is_some() {
        let count = |k: &str| {
            r.report
                .fixups
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, c)| *c)
                .unwrap_or(0)
        };
        assert_eq!(
            count(kinds::SYSCALL),
            n + 1,
            "relayed (N and the final one)"
        );
        assert_eq!(count(kinds::USER_PF), 2, "user #PFs passed on");
        assert_eq!(count(kinds::USER_JUMP), 1, "the jump to LSTAR passed on");
        assert_eq!(count(kinds::KERNEL_PF), 1, "kernel #PFs passed on");
    } else {
        eprintln!("host quirks are off (VT-x/SVM host): SYSCALL ran natively, no relay counts");
    }
}
