//! XBEGIN at guest CPL 0, completed as an immediate transaction abort.
//!
//! This host's emulator of guest kernel code raises #UD for XBEGIN (RTM), while CPUID leaf 7,
//! which KVM_SET_CPUID2 does not change here (shared/probes/cpuid-override.c), offers RTM and
//! HLE. The architecture lets a transaction abort at any time for implementation reasons, before
//! its first instruction (SDM vol. 1, 16.3.8; a CPU with TSX_CTRL.RTM_DISABLE aborts every
//! XBEGIN so), so an abort is a correct completion: EAX = 0 (no status bit: not an XABORT, no
//! retry hint), RIP = XBEGIN's fallback address, nothing else changed. The VMM traps the guest's
//! #UD handler with an int3 ([`super::idt_trap`]) and, at each trapped #UD, looks at the faulting
//! instruction: an XBEGIN at CPL 0 is completed that way and the #UD frame popped as IRETQ would
//! pop it; any other #UD goes to the guest's handler. XBEGIN at CPL 3 runs natively here and
//! never reaches the trap.
//!
//! Who needs it: kvm-unit-tests' x86/pmu, whose `check_tsx_cycles` (TSX-qualified cycle
//! counting, after which comes the full-width-writes round) runs XBEGIN in its kernel. No Linux
//! kernel runs XBEGIN itself, so the trap is installed only for guests whose code the VMM runs
//! unpatched (Multiboot kernels) and whose CPUID offers RTM; never on a VT-x/SVM host (host
//! quirks off).

use iced_x86::{Code, Decoder, DecoderOptions};
use kvm_bindings::kvm_cpuid_entry2;
use std::sync::Arc;

use super::idt_trap::{Mark, Stopped, TrapNames, VectorTrap};
use super::FixupCounts;
use crate::arch::iret::{iret_return, BadFrame};
use crate::arch::x86::{ExceptionFrame, VECTOR_UD};
use crate::vcpu_access::{AccessError, VcpuAccess, MAX_INSTRUCTION};

/// Whether the guest's CPUID offers RTM (leaf 7.0 EBX bit 11): only then does a guest run
/// XBEGIN.
pub fn offers_rtm(cpuid: &[kvm_cpuid_entry2]) -> bool {
    const RTM: u32 = 1 << 11;
    cpuid
        .iter()
        .any(|e| e.function == 7 && e.index == 0 && e.ebx & RTM != 0)
}

/// The fix-up's name in the counts (`host_quirk_fixups`).
pub(crate) const FIXUP: &str = "xbegin -> abort";

/// What to do with a trapped #UD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// An XBEGIN at CPL 0: resume at its fallback address with EAX = 0.
    Abort { fallback: u64 },
    /// The guest's handler takes it (why).
    Deliver(&'static str),
}

/// Decides from the #UD frame and the bytes at its RIP (as many as could be read).
pub fn decide(frame: &ExceptionFrame, bytes: &[u8]) -> Decision {
    if frame.cpl() != 0 {
        return Decision::Deliver("not at CPL 0");
    }
    let bytes = &bytes[..bytes.len().min(MAX_INSTRUCTION)];
    let instr = Decoder::with_ip(64, bytes, frame.rip, DecoderOptions::NONE).decode();
    match instr.code() {
        Code::Xbegin_rel32 | Code::Xbegin_rel16 => Decision::Abort {
            fallback: instr.near_branch_target(),
        },
        _ => Decision::Deliver("not XBEGIN"),
    }
}

/// The int3 over the guest's #UD handler.
pub fn trap(fixups: Arc<FixupCounts>) -> VectorTrap {
    let names = TrapNames {
        owner: "xbegin trap",
        exception: "#UD",
        without: "XBEGIN at guest CPL 0 (it gets the host emulator's #UD)",
        reinstalled: "xbegin trap: re-installed after the guest rewrote its #UD entry",
        moved: "xbegin trap: moved after the guest changed its #UD gate",
    };
    // Host quirks only: the emulator's #UD for XBEGIN (an int3 is an emulation failure there).
    VectorTrap::new(VECTOR_UD, Mark::Int3, names, fixups)
}

/// A #UD trapped at the guest's handler: completes an XBEGIN as an abort (true: the vCPU
/// resumes at the fallback, registers written through `cpu`), or false: the guest's handler
/// must take it.
pub(crate) fn on_ud(
    trap: &VectorTrap,
    stopped: &Stopped,
    cpu: &mut dyn VcpuAccess,
) -> Result<bool, AccessError> {
    let frame = &stopped.frame;
    let bytes = cpu.read_instruction(frame.rip);
    let fallback = match decide(frame, &bytes) {
        Decision::Abort { fallback } => fallback,
        Decision::Deliver(why) => {
            log::debug!("xbegin trap: #UD at {:#x} to the guest ({why})", frame.rip);
            return Ok(false);
        }
    };
    let sregs = cpu.sregs()?;
    let mut gdt = |sel| cpu.gdt_descriptor(&sregs, sel);
    let ret = match iret_return(frame, fallback, &sregs, &mut gdt) {
        Ok(ret) => ret,
        Err(BadFrame(why)) => {
            log::debug!("xbegin trap: #UD at {:#x} to the guest ({why})", frame.rip);
            return Ok(false);
        }
    };
    // CPL 0 to CPL 0: IRETQ keeps the handler's segments (iret_return checked the selectors).
    if ret.segments.is_some() {
        return Ok(false);
    }
    let mut regs = stopped.regs;
    regs.rax = 0;
    regs.rip = ret.rip;
    regs.rsp = ret.rsp;
    regs.rflags = ret.rflags;
    cpu.set_regs(&regs)?;
    if trap.fixups().record(FIXUP) {
        log::info!(
            "host quirk: completed `XBEGIN` at guest CPL 0 as an immediate abort (first at RIP \
             {:#x}): this host's emulator has no RTM",
            frame.rip
        );
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::iret::tests::frame;
    use crate::vcpu_access::fake::FakeVcpu;
    use kvm_bindings::kvm_regs;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    /// A vCPU stopped on the #UD handler at 0x3000 (paging off), with `code` at 0x1000 and a
    /// kernel-mode #UD frame for RIP 0x1000 at RSP 0x7fd8 (the interrupted RSP: 0x8000).
    fn stopped_on(code: &[u8]) -> (FakeVcpu, Stopped) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let mut cpu = FakeVcpu::new(mem);
        cpu.mem.write_slice(code, GuestAddress(0x1000)).unwrap();
        cpu.sregs.cs.selector = 0x10;
        cpu.sregs.ss.selector = 0x18;
        let frame = frame(0x10, 0x1000);
        let words = [frame.rip, frame.cs, frame.rflags, 0x8000, frame.ss];
        for (i, w) in words.iter().enumerate() {
            cpu.mem
                .write_obj(*w, GuestAddress(0x7fd8 + 8 * i as u64))
                .unwrap();
        }
        cpu.regs = kvm_regs {
            rip: 0x3000,
            rsp: 0x7fd8,
            rax: 0xffff_ffff_ffff_ffff,
            rbx: 7,
            rflags: 2,
            ..Default::default()
        };
        let stopped = Stopped {
            handler: 0x3000,
            regs: cpu.regs,
            frame: ExceptionFrame {
                rsp: 0x8000,
                ..frame
            },
        };
        (cpu, stopped)
    }

    #[test]
    fn a_trapped_xbegin_resumes_at_the_fallback_with_eax_0() {
        let trap = trap(Arc::new(FixupCounts::default()));
        let (mut cpu, stopped) = stopped_on(&[0xc7, 0xf8, 0x10, 0, 0, 0]);
        assert!(on_ud(&trap, &stopped, &mut cpu).unwrap());
        let r = cpu.regs;
        assert_eq!((r.rip, r.rsp, r.rax, r.rbx), (0x1016, 0x8000, 0, 7));
        assert_eq!(r.rflags, 0x246);
        assert_eq!(trap.fixups().snapshot(), vec![(FIXUP, 1)]);
    }

    #[test]
    fn a_trapped_ud2_is_left_to_the_guest() {
        let trap = trap(Arc::new(FixupCounts::default()));
        let (mut cpu, stopped) = stopped_on(&[0x0f, 0x0b]);
        assert!(!on_ud(&trap, &stopped, &mut cpu).unwrap());
        assert_eq!(cpu.regs.rip, 0x3000, "registers untouched");
        assert!(trap.fixups().snapshot().is_empty());
    }

    #[test]
    fn xbegin_at_cpl0_aborts_to_its_fallback() {
        // xbegin +0 (kvm-unit-tests: `xbegin 1f; 1:`): the fallback is the next instruction.
        let k = frame(0x10, 0x40_1000);
        let xbegin0 = [0xc7, 0xf8, 0, 0, 0, 0];
        assert_eq!(
            decide(&k, &xbegin0),
            Decision::Abort {
                fallback: 0x40_1006
            }
        );
        // A negative displacement, and the 16-bit form (66 prefix).
        let back = [0xc7, 0xf8, 0xf0, 0xff, 0xff, 0xff];
        assert_eq!(
            decide(&k, &back),
            Decision::Abort {
                fallback: 0x40_0ff6
            }
        );
        let short = [0x66, 0xc7, 0xf8, 0x10, 0x00];
        assert!(matches!(decide(&k, &short), Decision::Abort { .. }));
    }

    #[test]
    fn everything_else_goes_to_the_guest() {
        let k = frame(0x10, 0x1000);
        let u = frame(0x33, 0x1000);
        let xbegin0 = [0xc7, 0xf8, 0, 0, 0, 0];
        assert_eq!(decide(&u, &xbegin0), Decision::Deliver("not at CPL 0"));
        for bytes in [
            &[0x0f, 0x0b][..],         // ud2
            &[0xc7, 0xf8, 0, 0],       // cut short
            &[0xc7, 0xc0, 0, 0, 0, 0], // mov eax, 0 (C7 /0, not /7)
            &[0x0f, 0x01, 0xd5],       // xend
            &[],
            &[0x66; 16],
        ] {
            assert_eq!(
                decide(&k, bytes),
                Decision::Deliver("not XBEGIN"),
                "{bytes:02x?}"
            );
        }
    }
}
