//! Pure classification of a #PF that reached the relay, and the register state a completed
//! SYSCALL leaves: functions of the exception frame, CR2, R11, the SYSCALL MSRs and the
//! special registers, with no KVM and no guest memory (unit-tested on hand-made frames).

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};

use super::kinds;
use crate::arch::x86::{
    CR4_SMEP, EFER_NXE, PF_ERR_FETCH, PF_ERR_PRESENT, PF_ERR_USER,
    RFLAGS_FIXED as RFLAGS_RESERVED_1, RFLAGS_IF, RFLAGS_RF,
};

/// #PF error code of an instruction fetch from a present supervisor page at CPL3: P | U/S | I/D.
pub const PF_ERR_SYSCALL: u64 = PF_ERR_PRESENT | PF_ERR_USER | PF_ERR_FETCH;

/// The guest's SYSCALL MSRs, as one vCPU has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyscallMsrs {
    pub star: u64,
    pub lstar: u64,
    pub sfmask: u64,
}

/// The exception frame at the #PF handler's first instruction.
pub type PfFrame = crate::arch::x86::ExceptionFrame;

/// What a #PF that reached the relay is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PfKind {
    /// The fault SYSCALL at CPL3 leaves behind here: complete the system call.
    SystemCall,
    /// A real user-mode page fault: the guest's handler deals with it.
    UserFault,
    /// A user-mode jump (not a SYSCALL) to LSTAR: the real #PF the CPU raises for it.
    UserJumpToLstar,
    /// A page fault in the guest kernel.
    KernelFault,
}

impl PfKind {
    pub(super) fn report_name(self) -> &'static str {
        match self {
            PfKind::SystemCall => kinds::SYSCALL,
            PfKind::UserFault => kinds::USER_PF,
            PfKind::UserJumpToLstar => kinds::USER_JUMP,
            PfKind::KernelFault => kinds::KERNEL_PF,
        }
    }
}

/// The error code the CPU gives the #PF of a CPL3 fetch from a present supervisor page: the I/D
/// bit is there only when the guest has EFER.NXE or CR4.SMEP set (Linux has NXE).
pub fn syscall_error_code(sregs: &kvm_sregs) -> u64 {
    if sregs.efer & EFER_NXE != 0 || sregs.cr4 & CR4_SMEP != 0 {
        PF_ERR_SYSCALL
    } else {
        PF_ERR_SYSCALL & !PF_ERR_FETCH
    }
}

/// Tells the cases apart from the frame, CR2, R11 (which SYSCALL sets to the user RFLAGS), the
/// vCPU's SYSCALL MSRs and the error code a fetch fault has on it ([`syscall_error_code`]).
pub fn classify(
    frame: &PfFrame,
    cr2: u64,
    r11: u64,
    msrs: &SyscallMsrs,
    fetch_error: u64,
) -> PfKind {
    if !frame.user() {
        return PfKind::KernelFault;
    }
    if frame.error != fetch_error || frame.rip != msrs.lstar || cr2 != msrs.lstar {
        return PfKind::UserFault;
    }
    // SYSCALL cleared every SFMASK bit (user code always runs with IF set, so a jump shows IF) and
    // saved the unmasked flags in R11.
    let flags = frame.rflags & !RFLAGS_RF;
    let from_syscall =
        flags & msrs.sfmask == 0 && flags == (r11 & !msrs.sfmask & !RFLAGS_RF) | RFLAGS_RESERVED_1;
    if from_syscall {
        PfKind::SystemCall
    } else {
        PfKind::UserJumpToLstar
    }
}

/// Whether a fault that did not match the cached MSRs looks enough like a system call that the
/// MSRs may have changed (a user fetch fault at CR2 = RIP, with IF clear).
pub(super) fn syscall_shaped(frame: &PfFrame, cr2: u64, fetch_error: u64) -> bool {
    frame.user() && frame.error == fetch_error && frame.rip == cr2 && frame.rflags & RFLAGS_IF == 0
}

/// CS and SS as SYSCALL loads them from STAR[47:32].
pub fn kernel_segments(star: u64) -> (kvm_segment, kvm_segment) {
    let sel = ((star >> 32) & 0xfffc) as u16;
    let cs = kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: sel,
        type_: 11,
        present: 1,
        dpl: 0,
        db: 0,
        s: 1,
        l: 1,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    let ss = kvm_segment {
        selector: sel + 8,
        type_: 3,
        db: 1,
        l: 0,
        ..cs
    };
    (cs, ss)
}

/// Applies the end state of SYSCALL to registers that hold the #PF handler's entry state.
/// Returns whether the segment registers had to change too (then they must be written back).
///
/// The #PF delivery has already switched to CPL0: CS is the IDT gate's selector (Linux's
/// `__KERNEL_CS`, the same as STAR[47:32]) and SS the null selector that 64-bit exception delivery
/// loads. When CS already is STAR's kernel CS, only RIP, RSP and RFLAGS change and the segments
/// are left as delivered: SS stays null instead of STAR[47:32] + 8, which a 64-bit kernel never
/// reads (SYSRET and IRET reload it). That saves a KVM_SET_SREGS per system call, and its side
/// effects (it rewrites every segment, control register and the APIC base).
pub fn complete_syscall(
    frame: &PfFrame,
    msrs: &SyscallMsrs,
    regs: &mut kvm_regs,
    sregs: &mut kvm_sregs,
) -> bool {
    regs.rip = msrs.lstar;
    regs.rsp = frame.rsp;
    regs.rflags = (frame.rflags & !RFLAGS_RF) | RFLAGS_RESERVED_1;
    let (cs, ss) = kernel_segments(msrs.star);
    let cs_ok = sregs.cs.selector == cs.selector
        && sregs.cs.dpl == 0
        && sregs.cs.l == 1
        && sregs.cs.present == 1;
    if cs_ok {
        return false;
    }
    sregs.cs = cs;
    sregs.ss = ss;
    true
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::host_quirks::syscall_relay) const STAR: u64 = 0x0023_0010_0000_0000;
    pub(in crate::host_quirks::syscall_relay) const LSTAR: u64 = 0xffff_ffff_8140_0040;
    pub(in crate::host_quirks::syscall_relay) const SFMASK: u64 = 0x47700;
    pub(in crate::host_quirks::syscall_relay) const MSRS: SyscallMsrs = SyscallMsrs {
        star: STAR,
        lstar: LSTAR,
        sfmask: SFMASK,
    };

    pub(in crate::host_quirks::syscall_relay) fn syscall_frame() -> PfFrame {
        // As measured (HOST-FACTS): err 0x15, RIP = LSTAR, CS 0x33, RFLAGS 0x10046, SS 0x2b.
        PfFrame {
            error: 0x15,
            rip: LSTAR,
            cs: 0x33,
            rflags: 0x10046,
            rsp: 0x7ffd_0000_1000,
            ss: 0x2b,
        }
    }

    #[test]
    fn a_syscall_fault_is_a_system_call() {
        assert_eq!(
            classify(&syscall_frame(), LSTAR, 0x646, &MSRS, 0x15),
            PfKind::SystemCall
        );
        // RF in R11 (set by a debug trap before the SYSCALL) does not change that.
        assert_eq!(
            classify(&syscall_frame(), LSTAR, 0x10646, &MSRS, 0x15),
            PfKind::SystemCall
        );
    }

    #[test]
    fn without_nx_or_smep_the_fetch_fault_has_no_id_bit() {
        let mut sregs = kvm_sregs::default();
        assert_eq!(syscall_error_code(&sregs), 0x5);
        sregs.efer = 1 << 11;
        assert_eq!(syscall_error_code(&sregs), 0x15);
        sregs.efer = 0;
        sregs.cr4 = 1 << 20;
        assert_eq!(syscall_error_code(&sregs), 0x15);
        let f = PfFrame {
            error: 0x5,
            ..syscall_frame()
        };
        assert_eq!(classify(&f, LSTAR, 0x646, &MSRS, 0x5), PfKind::SystemCall);
        assert_eq!(classify(&f, LSTAR, 0x646, &MSRS, 0x15), PfKind::UserFault);
    }

    #[test]
    fn a_user_jump_to_lstar_is_a_real_fault() {
        // A jump keeps IF set (user code cannot clear it): SFMASK bits show.
        let f = PfFrame {
            rflags: 0x10246,
            ..syscall_frame()
        };
        assert_eq!(
            classify(&f, LSTAR, 0x246, &MSRS, 0x15),
            PfKind::UserJumpToLstar
        );
        // With IF clear (an IOPL-3 process that did `cli`) its IOPL bits still show.
        let f = PfFrame {
            rflags: 0x13046,
            ..syscall_frame()
        };
        assert_eq!(
            classify(&f, LSTAR, 0x3046, &MSRS, 0x15),
            PfKind::UserJumpToLstar
        );
        // A guest whose SFMASK masks nothing: R11 must still agree with the frame's flags.
        let open = SyscallMsrs { sfmask: 0, ..MSRS };
        let f = PfFrame {
            rflags: 0x10246,
            ..syscall_frame()
        };
        assert_eq!(
            classify(&f, LSTAR, 0x1234, &open, 0x15),
            PfKind::UserJumpToLstar
        );
        assert_eq!(classify(&f, LSTAR, 0x246, &open, 0x15), PfKind::SystemCall);
    }

    #[test]
    fn other_faults_are_passed_on() {
        let user_read = PfFrame {
            error: 0x4,
            rip: 0x40_1000,
            rflags: 0x10246,
            ..syscall_frame()
        };
        assert_eq!(
            classify(&user_read, 0x1234_5000, 0x646, &MSRS, 0x15),
            PfKind::UserFault
        );
        // A user fetch fault elsewhere (e.g. jumping to a kernel address other than LSTAR).
        let fetch = PfFrame {
            rip: LSTAR + 0x10,
            ..syscall_frame()
        };
        assert_eq!(
            classify(&fetch, LSTAR + 0x10, 0x646, &MSRS, 0x15),
            PfKind::UserFault
        );
        // Same frame but CR2 elsewhere: not what a SYSCALL leaves.
        assert_eq!(
            classify(&syscall_frame(), LSTAR + 1, 0x646, &MSRS, 0x15),
            PfKind::UserFault
        );
        // Write fault at LSTAR from user mode.
        let write = PfFrame {
            error: 0x7,
            ..syscall_frame()
        };
        assert_eq!(
            classify(&write, LSTAR, 0x646, &MSRS, 0x15),
            PfKind::UserFault
        );
        // A kernel fault, even one that looks like the system call's.
        let kernel = PfFrame {
            cs: 0x10,
            ..syscall_frame()
        };
        assert_eq!(
            classify(&kernel, LSTAR, 0x646, &MSRS, 0x15),
            PfKind::KernelFault
        );
    }

    #[test]
    fn frames_decode_in_push_order() {
        let mut b = [0u8; 48];
        for (i, v) in [0x15u64, LSTAR, 0x33, 0x10046, 0x1000, 0x2b]
            .iter()
            .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        assert_eq!(
            PfFrame::from_bytes(&b),
            PfFrame {
                rsp: 0x1000,
                ..syscall_frame()
            }
        );
    }

    #[test]
    fn completion_sets_what_syscall_would() {
        let mut regs = kvm_regs {
            rip: 0xffff_ffff_8160_0000,
            rsp: 0xffff_c900_0000_3f58,
            rflags: 0x46,
            rcx: 0x40_102e,
            r11: 0x646,
            ..Default::default()
        };
        let mut sregs = kvm_sregs::default();
        // A gate whose CS is not STAR's: both segments are set as SYSCALL sets them.
        assert!(complete_syscall(
            &syscall_frame(),
            &MSRS,
            &mut regs,
            &mut sregs
        ));
        assert_eq!(regs.rip, LSTAR);
        assert_eq!(regs.rsp, 0x7ffd_0000_1000);
        assert_eq!(regs.rflags, 0x46);
        assert_eq!((regs.rcx, regs.r11), (0x40_102e, 0x646));
        assert_eq!((sregs.cs.selector, sregs.cs.dpl, sregs.cs.l), (0x10, 0, 1));
        assert_eq!((sregs.cs.type_, sregs.cs.db, sregs.cs.present), (11, 0, 1));
        assert_eq!((sregs.ss.selector, sregs.ss.dpl, sregs.ss.db), (0x18, 0, 1));
        assert_eq!((sregs.ss.type_, sregs.ss.l), (3, 0));
        // Linux's gate CS is STAR's kernel CS already: segments are left as the #PF loaded them.
        let mut delivered = kvm_sregs {
            cs: kernel_segments(STAR).0,
            ..Default::default()
        };
        let before = delivered;
        assert!(!complete_syscall(
            &syscall_frame(),
            &MSRS,
            &mut regs,
            &mut delivered
        ));
        assert_eq!(delivered.ss.selector, before.ss.selector);
    }
}
