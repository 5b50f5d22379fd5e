//! RDPMC served wherever the guest executes it (`--rdpmc trap`): kernel or user code, any guest
//! binary, no text patching.
//!
//! KVM answers a guest RDPMC itself; with KVM's own vPMU off (this workplace's host, or a VT-x/SVM
//! host after KVM_CAP_PMU_CAPABILITY with KVM_PMU_CAP_DISABLE) it injects #GP (`kvm_emulate_rdpmc`:
//! `kvm_pmu_rdpmc` fails when the vCPU's PMU has version 0). The VMM traps the guest's #GP
//! handler with an int3 (`host_quirks::idt_trap`) and, at each trapped #GP, looks at the faulting
//! instruction:
//!
//! * an RDPMC (`0F 33`, with any prefixes the decoder accepts) at CPL0, or at CPL3 with CR4.PCE
//!   set, whose ECX names a counter of the model ([`vpmu::Pmu::rdpmc`]: Intel ECX\[31:16\] is the
//!   counter type, 0 or 0x4000 (fixed); AMD ECX < counters): EDX:EAX get the counter (already
//!   masked to the model's width; the upper halves of RAX and RDX cleared, as RDPMC does), and
//!   the #GP frame is popped as IRETQ would pop it, with RIP past the RDPMC;
//! * anything else (another instruction, an error code, CPL3 without CR4.PCE, an index that
//!   names no counter, a frame IRETQ would refuse): the #GP goes to the guest's own handler.
//!
//! The frame and the instruction bytes are the guest's: every value gets a defined answer
//! ([`decide`] and `arch::iret::iret_return` are pure and unit-tested on hostile frames).

use iced_x86::{Code, Decoder, DecoderOptions};
use kvm_bindings::kvm_regs;

use super::VcpuPmu;
use crate::arch::iret::{iret_return, BadFrame};
use crate::arch::x86::{ExceptionFrame, CR4_PCE};
use crate::vcpu_access::{AccessError, VcpuAccess, MAX_INSTRUCTION};

/// RDPMC ECX bit 30: an Intel fixed counter.
const RDPMC_FIXED: u32 = 1 << 30;

/// Why a trapped #GP goes to the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GpCause {
    /// The faulting instruction is not RDPMC (or its bytes cannot be read).
    NotRdpmc,
    /// RDPMC faults with error code 0; this one has another.
    ErrorCode(u64),
    /// RDPMC at CPL 1-3 with CR4.PCE clear: the CPU's #GP is right.
    NoPce,
    /// ECX names no counter of the model: #GP, as on hardware.
    BadIndex(u32),
    /// The frame is one IRETQ would refuse (what it found wrong).
    BadFrame(&'static str),
}

impl GpCause {
    /// A guest RDPMC that faults on purpose (not some other #GP).
    pub(crate) fn is_rdpmc(self) -> bool {
        matches!(
            self,
            GpCause::NoPce | GpCause::BadIndex(_) | GpCause::BadFrame(_)
        )
    }
}

/// What to do with a trapped #GP, before the model is asked about the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// An RDPMC the vPMU serves, `len` bytes long.
    Rdpmc {
        len: u8,
    },
    Deliver(GpCause),
}

/// Decides from the frame, the bytes at the frame's RIP (as many as could be read, up to 15)
/// and CR4.
pub(crate) fn decide(frame: &ExceptionFrame, bytes: &[u8], cr4: u64) -> Decision {
    if frame.error != 0 {
        return Decision::Deliver(GpCause::ErrorCode(frame.error));
    }
    let bytes = &bytes[..bytes.len().min(MAX_INSTRUCTION)];
    let instr = Decoder::with_ip(64, bytes, frame.rip, DecoderOptions::NONE).decode();
    if instr.is_invalid() || instr.code() != Code::Rdpmc {
        return Decision::Deliver(GpCause::NotRdpmc);
    }
    if frame.cpl() != 0 && cr4 & CR4_PCE == 0 {
        return Decision::Deliver(GpCause::NoPce);
    }
    Decision::Rdpmc {
        len: instr.len() as u8,
    }
}

/// What the vPMU made of a trapped #GP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GpOutcome {
    /// An RDPMC answered; the vCPU resumes after it.
    Served,
    /// The guest's handler must take the #GP.
    Deliver(GpCause),
}

/// A #GP trapped at the guest's handler (`regs`: the vCPU there, untouched by the handler;
/// `frame`: the exception frame): serves it if it is an RDPMC the vPMU answers, writing the
/// registers back; otherwise says why the guest must take it. Counts both.
pub(crate) fn on_gp(
    pmu: &mut VcpuPmu,
    frame: &ExceptionFrame,
    mut regs: kvm_regs,
    cpu: &mut dyn VcpuAccess,
) -> Result<GpOutcome, AccessError> {
    let mut sregs = cpu.sregs()?;
    let bytes = cpu.read_instruction(frame.rip);
    let outcome = match decide(frame, &bytes, sregs.cr4) {
        Decision::Deliver(cause) => GpOutcome::Deliver(cause),
        Decision::Rdpmc { len } => {
            let ecx = regs.rcx as u32;
            match pmu.pmu.rdpmc(ecx) {
                Err(_) => GpOutcome::Deliver(GpCause::BadIndex(ecx)),
                Ok(value) => {
                    let mut gdt = |sel| cpu.gdt_descriptor(&sregs, sel);
                    let rip = frame.rip.wrapping_add(u64::from(len));
                    match iret_return(frame, rip, &sregs, &mut gdt) {
                        Err(BadFrame(why)) => GpOutcome::Deliver(GpCause::BadFrame(why)),
                        Ok(ret) => {
                            regs.rax = value & 0xffff_ffff;
                            regs.rdx = (value >> 32) & 0xffff_ffff;
                            regs.rip = ret.rip;
                            regs.rsp = ret.rsp;
                            regs.rflags = ret.rflags;
                            if let Some((cs, ss)) = ret.segments {
                                sregs.cs = cs;
                                sregs.ss = ss;
                                cpu.set_sregs(&sregs)?;
                            }
                            cpu.set_regs(&regs)?;
                            count_served(pmu, ecx);
                            GpOutcome::Served
                        }
                    }
                }
            }
        }
    };
    if let GpOutcome::Deliver(cause) = outcome {
        pmu.stats.gp_delivered += 1;
        if cause.is_rdpmc() {
            pmu.stats.rdpmc_gp += 1;
            log::debug!(
                "trapped RDPMC at {:#x}: #GP to the guest ({cause:?})",
                frame.rip
            );
        }
    }
    Ok(outcome)
}

fn count_served(pmu: &mut VcpuPmu, ecx: u32) {
    pmu.stats.rdpmc_reads += 1;
    pmu.stats.rdpmc_trapped += 1;
    pmu.in_mode().rdpmc_reads += 1;
    if ecx & RDPMC_FIXED != 0 {
        pmu.stats.rdpmc_fixed += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::iret::tests::frame;

    const RDPMC: [u8; 2] = [0x0f, 0x33];

    #[test]
    fn rdpmc_at_cpl0_is_served_and_at_cpl3_only_with_pce() {
        let k = frame(0x10, 0xffff_ffff_8100_0000);
        assert_eq!(decide(&k, &RDPMC, 0), Decision::Rdpmc { len: 2 });
        let u = frame(0x33, 0x40_1000);
        assert_eq!(decide(&u, &RDPMC, 0), Decision::Deliver(GpCause::NoPce));
        assert_eq!(decide(&u, &RDPMC, CR4_PCE), Decision::Rdpmc { len: 2 });
    }

    #[test]
    fn prefixes_count_in_the_length_and_other_instructions_are_not_served() {
        let k = frame(0x10, 0x1000);
        // REX.W and an operand-size prefix: still RDPMC, longer.
        assert_eq!(
            decide(&k, &[0x48, 0x0f, 0x33], 0),
            Decision::Rdpmc { len: 3 }
        );
        assert_eq!(
            decide(&k, &[0x66, 0x0f, 0x33], 0),
            Decision::Rdpmc { len: 3 }
        );
        // RDMSR, RDTSC, WRMSR, a lone 0F, nothing at all, 15 prefixes then RDPMC (too long).
        for bytes in [
            &[0x0f, 0x32][..],
            &[0x0f, 0x31],
            &[0x0f, 0x30],
            &[0x0f],
            &[],
            &[0x66; 16],
        ] {
            assert_eq!(
                decide(&k, bytes, CR4_PCE),
                Decision::Deliver(GpCause::NotRdpmc),
                "{bytes:02x?}"
            );
        }
        let mut long = vec![0x66; 14];
        long.extend_from_slice(&RDPMC);
        assert_eq!(decide(&k, &long, 0), Decision::Deliver(GpCause::NotRdpmc));
    }

    #[test]
    fn a_gp_with_an_error_code_is_not_an_rdpmc() {
        let mut k = frame(0x10, 0x1000);
        k.error = 0x10;
        assert_eq!(
            decide(&k, &RDPMC, 0),
            Decision::Deliver(GpCause::ErrorCode(0x10))
        );
    }
}
