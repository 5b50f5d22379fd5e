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
//! ([`decide`] and [`iret_return`] are pure and unit-tested on hostile frames).

use iced_x86::{Code, Decoder, DecoderOptions};
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};

use super::VcpuPmu;
use crate::arch::x86::{
    canonical, ExceptionFrame, CR4_LA57, CR4_PCE, RFLAGS_FIXED, RFLAGS_LOADABLE, RFLAGS_RF,
    RFLAGS_VM,
};
use crate::vcpu::access::{AccessError, VcpuAccess};

/// RDPMC ECX bit 30: an Intel fixed counter.
const RDPMC_FIXED: u32 = 1 << 30;
/// The longest x86 instruction.
const MAX_INSN: usize = 15;

/// Why a trapped #GP goes to the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpCause {
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
    pub fn is_rdpmc(self) -> bool {
        matches!(
            self,
            GpCause::NoPce | GpCause::BadIndex(_) | GpCause::BadFrame(_)
        )
    }
}

/// What to do with a trapped #GP, before the model is asked about the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// An RDPMC the vPMU serves, `len` bytes long.
    Rdpmc {
        len: u8,
    },
    Deliver(GpCause),
}

/// Decides from the frame, the bytes at the frame's RIP (as many as could be read, up to 15)
/// and CR4.
pub fn decide(frame: &ExceptionFrame, bytes: &[u8], cr4: u64) -> Decision {
    if frame.error != 0 {
        return Decision::Deliver(GpCause::ErrorCode(frame.error));
    }
    let bytes = &bytes[..bytes.len().min(MAX_INSN)];
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

/// Where the guest resumes after a served RDPMC: what IRETQ would load from the frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Return {
    pub rip: u64,
    pub rsp: u64,
    pub rflags: u64,
    /// The segments to load, when they differ from the handler's (a return to CPL3).
    pub segments: Option<(kvm_segment, kvm_segment)>,
}

/// A segment register loaded from a GDT descriptor (`raw`, the 8 bytes) for `selector`.
pub fn segment_from_descriptor(selector: u16, raw: u64) -> kvm_segment {
    let limit = ((raw & 0xffff) | ((raw >> 32) & 0xf_0000)) as u32;
    let g = ((raw >> 55) & 1) as u8;
    kvm_segment {
        base: ((raw >> 16) & 0xff_ffff) | (((raw >> 56) & 0xff) << 24),
        limit: if g == 1 { (limit << 12) | 0xfff } else { limit },
        selector,
        type_: ((raw >> 40) & 0xf) as u8,
        s: ((raw >> 44) & 1) as u8,
        dpl: ((raw >> 45) & 3) as u8,
        present: ((raw >> 47) & 1) as u8,
        avl: ((raw >> 52) & 1) as u8,
        l: ((raw >> 53) & 1) as u8,
        db: ((raw >> 54) & 1) as u8,
        g,
        unusable: 0,
        padding: 0,
    }
}

/// The return IRETQ would make from `frame` with RIP advanced by `len`, given the handler's
/// segment registers and a reader of GDT descriptors (None: outside the GDT, or an LDT
/// selector). Err: IRETQ would fault, so the #GP goes to the guest.
pub fn iret_return(
    frame: &ExceptionFrame,
    len: u8,
    sregs: &kvm_sregs,
    descriptor: &mut dyn FnMut(u16) -> Option<u64>,
) -> Result<Return, GpCause> {
    let rip = frame.rip.wrapping_add(u64::from(len));
    if !canonical(rip, sregs.cr4 & CR4_LA57 != 0) {
        return Err(GpCause::BadFrame("return RIP not canonical"));
    }
    let rflags = (frame.rflags & RFLAGS_LOADABLE & !RFLAGS_RF & !RFLAGS_VM) | RFLAGS_FIXED;
    let cs_sel = frame.cs as u16;
    let ss_sel = frame.ss as u16;
    let rpl = cs_sel & 3;
    let same = cs_sel == sregs.cs.selector && ss_sel == sregs.ss.selector;
    let ret = |segments| Return {
        rip,
        rsp: frame.rsp,
        rflags,
        segments,
    };
    if same && rpl == u16::from(sregs.cs.dpl) {
        return Ok(ret(None));
    }
    if rpl == 1 || rpl == 2 {
        return Err(GpCause::BadFrame("return to ring 1 or 2"));
    }
    let cs = descriptor(cs_sel)
        .map(|raw| segment_from_descriptor(cs_sel, raw))
        .ok_or(GpCause::BadFrame("CS outside the GDT"))?;
    let code = cs.s == 1 && cs.type_ & 0x8 != 0;
    if !code || cs.present == 0 || u16::from(cs.dpl) != rpl || (cs.l == 1 && cs.db == 1) {
        return Err(GpCause::BadFrame(
            "CS is not a present code segment of its RPL",
        ));
    }
    let ss = if ss_sel & !3 == 0 {
        if rpl != 0 {
            return Err(GpCause::BadFrame("null SS at CPL3"));
        }
        kvm_segment {
            selector: ss_sel,
            unusable: 1,
            ..Default::default()
        }
    } else {
        let ss = descriptor(ss_sel)
            .map(|raw| segment_from_descriptor(ss_sel, raw))
            .ok_or(GpCause::BadFrame("SS outside the GDT"))?;
        let writable_data = ss.s == 1 && ss.type_ & 0xa == 0x2;
        if !writable_data || ss.present == 0 || ss.dpl != cs.dpl || ss_sel & 3 != rpl {
            return Err(GpCause::BadFrame(
                "SS is not a present writable data segment of its RPL",
            ));
        }
        ss
    };
    Ok(ret(Some((cs, ss))))
}

/// What the vPMU made of a trapped #GP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpOutcome {
    /// An RDPMC answered; the vCPU resumes after it.
    Served,
    /// The guest's handler must take the #GP.
    Deliver(GpCause),
}

/// The bytes at `rip`, as many as can be read up to 15 (an instruction may end just before an
/// unmapped page).
fn instruction_bytes(cpu: &mut dyn VcpuAccess, rip: u64) -> Vec<u8> {
    let mut buf = [0u8; MAX_INSN];
    if cpu.read_virt(rip, &mut buf).is_ok() {
        return buf.to_vec();
    }
    let to_page_end = (0x1000 - (rip & 0xfff)) as usize;
    let n = to_page_end.min(MAX_INSN);
    match cpu.read_virt(rip, &mut buf[..n]) {
        Ok(()) => buf[..n].to_vec(),
        Err(_) => Vec::new(),
    }
}

/// The 8-byte GDT descriptor for `selector`, if it is a GDT selector within the GDT's limit.
fn gdt_descriptor(cpu: &mut dyn VcpuAccess, sregs: &kvm_sregs, selector: u16) -> Option<u64> {
    if selector & 4 != 0 {
        return None;
    }
    let offset = u64::from(selector & !7);
    if offset == 0 || offset + 7 > u64::from(sregs.gdt.limit) {
        return None;
    }
    let mut raw = [0u8; 8];
    cpu.read_virt(sregs.gdt.base.wrapping_add(offset), &mut raw)
        .ok()?;
    Some(u64::from_le_bytes(raw))
}

/// A #GP trapped at the guest's handler (`regs`: the vCPU there, untouched by the handler;
/// `frame`: the exception frame): serves it if it is an RDPMC the vPMU answers, writing the
/// registers back; otherwise says why the guest must take it. Counts both.
pub fn on_gp(
    pmu: &mut VcpuPmu,
    frame: &ExceptionFrame,
    mut regs: kvm_regs,
    cpu: &mut dyn VcpuAccess,
) -> Result<GpOutcome, AccessError> {
    let mut sregs = cpu.sregs()?;
    let bytes = instruction_bytes(cpu, frame.rip);
    let outcome = match decide(frame, &bytes, sregs.cr4) {
        Decision::Deliver(cause) => GpOutcome::Deliver(cause),
        Decision::Rdpmc { len } => {
            let ecx = regs.rcx as u32;
            match pmu.pmu.rdpmc(ecx) {
                Err(_) => GpOutcome::Deliver(GpCause::BadIndex(ecx)),
                Ok(value) => {
                    let mut gdt = |sel| gdt_descriptor(cpu, &sregs, sel);
                    match iret_return(frame, len, &sregs, &mut gdt) {
                        Err(cause) => GpOutcome::Deliver(cause),
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

    const RDPMC: [u8; 2] = [0x0f, 0x33];

    fn frame(cs: u64, rip: u64) -> ExceptionFrame {
        ExceptionFrame {
            error: 0,
            rip,
            cs,
            rflags: 0x10246,
            rsp: 0x7fff_f000,
            ss: if cs & 3 == 3 { 0x2b } else { 0x18 },
        }
    }

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

    fn flat(dpl: u64, code: bool) -> u64 {
        // Base 0, limit 0xfffff, G; code: type 0xb, L; data: type 3, D/B.
        let ty: u64 = if code { 0xb } else { 0x3 };
        let flags: u64 = if code { 1 << 53 } else { 1 << 54 };
        0xffff | (0xf << 48) | (ty << 40) | (1 << 44) | (dpl << 45) | (1 << 47) | flags | (1 << 55)
    }

    /// Linux's GDT layout: 0x10 kernel CS, 0x18 kernel DS, 0x2b user DS, 0x33 user CS.
    fn gdt(sel: u16) -> Option<u64> {
        match sel & !3 {
            0x10 => Some(flat(0, true)),
            0x18 => Some(flat(0, false)),
            0x28 => Some(flat(3, false)),
            0x30 => Some(flat(3, true)),
            _ => None,
        }
    }

    fn handler_sregs() -> kvm_sregs {
        kvm_sregs {
            cs: segment_from_descriptor(0x10, flat(0, true)),
            ss: segment_from_descriptor(0x18, flat(0, false)),
            ..Default::default()
        }
    }

    #[test]
    fn a_kernel_return_keeps_the_segments() {
        let k = frame(0x10, 0xffff_ffff_8100_0000);
        let r = iret_return(&k, 2, &handler_sregs(), &mut gdt).unwrap();
        assert_eq!(r.rip, 0xffff_ffff_8100_0002);
        assert_eq!(r.rsp, 0x7fff_f000);
        assert_eq!(r.rflags, 0x246, "RF cleared: the instruction completed");
        assert_eq!(r.segments, None);
    }

    #[test]
    fn a_user_return_loads_cs_and_ss_from_the_gdt() {
        let u = frame(0x33, 0x40_1000);
        let r = iret_return(&u, 2, &handler_sregs(), &mut gdt).unwrap();
        let (cs, ss) = r.segments.unwrap();
        assert_eq!((cs.selector, cs.dpl, cs.l, cs.type_), (0x33, 3, 1, 0xb));
        assert_eq!((ss.selector, ss.dpl, ss.db, ss.type_), (0x2b, 3, 1, 0x3));
        assert_eq!((cs.limit, cs.base, cs.present), (0xffff_ffff, 0, 1));
    }

    #[test]
    fn hostile_frames_get_the_gp_not_a_panic() {
        let s = handler_sregs();
        let cases: &[(u64, u64, u64)] = &[
            // (cs, ss, rip)
            (0x33, 0x2b, 0x7fff_ffff_ffff), // RIP + 2 not canonical
            (0x31, 0x29, 0x1000),           // ring 1
            (0x43, 0x2b, 0x1000),           // CS outside the GDT
            (0x1b, 0x2b, 0x1000),           // a data segment as CS
            (0x13, 0x2b, 0x1000),           // DPL 0 code with RPL 3
            (0x33, 0x0, 0x1000),            // null SS at CPL3
            (0x33, 0x33, 0x1000),           // code as SS
            (0x33, 0x18, 0x1000),           // SS RPL 0 for CPL3
            (0x37, 0x2f, 0x1000),           // LDT selectors
            (0xffff_ffff_ffff_ffff, !0, !0 - 1), // all ones
        ];
        for &(cs, ss, rip) in cases {
            let f = ExceptionFrame {
                cs,
                ss,
                rip,
                ..frame(0x33, 0)
            };
            let mut look = |sel: u16| if sel & 4 != 0 { None } else { gdt(sel) };
            assert!(
                matches!(iret_return(&f, 2, &s, &mut look), Err(GpCause::BadFrame(_))),
                "{f:x?}"
            );
        }
        // Any RFLAGS: only the loadable bits come back, bit 1 set, VM and RF clear.
        let f = ExceptionFrame {
            rflags: !0,
            ..frame(0x10, 0x1000)
        };
        let r = iret_return(&f, 2, &s, &mut gdt).unwrap();
        assert_eq!(r.rflags, (RFLAGS_LOADABLE & !RFLAGS_RF & !RFLAGS_VM) | 2);
    }

    #[test]
    fn descriptors_decode() {
        let cs = segment_from_descriptor(0x10, 0x00af_9b00_0000_ffff);
        assert_eq!(
            (cs.type_, cs.s, cs.dpl, cs.present, cs.l, cs.db, cs.g),
            (0xb, 1, 0, 1, 1, 0, 1)
        );
        assert_eq!((cs.base, cs.limit), (0, 0xffff_ffff));
        let ds = segment_from_descriptor(0x2b, 0x00cf_f300_0000_ffff);
        assert_eq!((ds.type_, ds.dpl, ds.db), (0x3, 3, 1));
    }
}
