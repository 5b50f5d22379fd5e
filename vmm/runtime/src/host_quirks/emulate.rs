//! Completing guest instructions that the host's emulator could not run.
//!
//! Called only when KVM_RUN reported an emulation failure. The instruction at the guest RIP is
//! decoded with iced-x86 and, for the kinds listed in [`emulate`], its architectural effect is
//! applied to the vCPU state (registers, flags, MXCSR, memory) and RIP is advanced, or the
//! exception the CPU would raise is injected. Anything else is reported, not guessed at.

use iced_x86::{
    Decoder, DecoderOptions, Formatter, Instruction, IntelFormatter, Mnemonic, OpKind, Register,
};
use kvm_bindings::{kvm_regs, kvm_sregs};

use crate::arch::x86::{
    EFER_LMA, MSR_TSC_AUX, RFLAGS_AC, RFLAGS_AF, RFLAGS_CF, RFLAGS_OF, RFLAGS_PF, RFLAGS_SF,
    RFLAGS_ZF, VECTOR_BP, VECTOR_UD,
};
use crate::end::EmulationFailure;
use crate::vcpu_access::{AccessError, VcpuAccess};

/// Why an operand could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OperandError {
    #[error("operand {0} is not in memory")]
    NotMemory(u32),
    #[error("cannot compute the memory address")]
    Address,
    #[error("unsupported operand kind {0}")]
    Kind(String),
    #[error(transparent)]
    Access(#[from] AccessError),
}

/// The fix-ups' view of the vCPU: registers and special registers loaded once through the
/// access layer, written back through it when changed.
struct Cpu<'a> {
    acc: &'a mut dyn VcpuAccess,
    regs: kvm_regs,
    sregs: kvm_sregs,
    dirty: bool,
}

impl<'a> Cpu<'a> {
    fn load(acc: &'a mut dyn VcpuAccess) -> Result<Self, AccessError> {
        Ok(Cpu {
            regs: acc.regs()?,
            sregs: acc.sregs()?,
            acc,
            dirty: false,
        })
    }
    fn rip(&self) -> u64 {
        self.regs.rip
    }
    fn set_rip(&mut self, rip: u64) {
        self.regs.rip = rip;
        self.dirty = true;
    }
    /// 16, 32 or 64.
    fn bitness(&self) -> u32 {
        if self.sregs.efer & EFER_LMA != 0 && self.sregs.cs.l == 1 {
            64
        } else if self.sregs.cs.db == 1 {
            32
        } else {
            16
        }
    }
    fn rflags(&self) -> u64 {
        self.regs.rflags
    }
    fn set_rflags(&mut self, v: u64) {
        self.regs.rflags = v;
        self.dirty = true;
    }
    fn segment_base(&self, seg: Register) -> u64 {
        let s = &self.sregs;
        match seg {
            Register::FS => s.fs.base,
            Register::GS => s.gs.base,
            // In 64-bit mode CS/DS/ES/SS bases are treated as zero.
            _ if self.bitness() == 64 => 0,
            Register::CS => s.cs.base,
            Register::SS => s.ss.base,
            Register::ES => s.es.base,
            _ => s.ds.base,
        }
    }
    fn read_virt(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        self.acc.read_virt(addr, buf)
    }
    fn write_virt(&mut self, addr: u64, buf: &[u8]) -> Result<(), AccessError> {
        self.acc.write_virt(addr, buf)
    }
    fn mxcsr(&mut self) -> Result<u32, AccessError> {
        self.acc.fpu().map(|f| f.mxcsr)
    }
    fn set_mxcsr(&mut self, v: u32) -> Result<(), AccessError> {
        let mut f = self.acc.fpu()?;
        f.mxcsr = v;
        self.acc.set_fpu(&f)
    }
    /// TSC_AUX as KVM holds it (0 if KVM does not know it, as before the access layer).
    fn tsc_aux(&mut self) -> Result<u64, AccessError> {
        self.acc.msr(MSR_TSC_AUX).map(|v| v.unwrap_or(0))
    }
    /// Injects exception `vector` (no error code) for when the vCPU next runs; registers
    /// (RIP: the exception frame) are written first.
    fn inject_exception(&mut self, vector: u8) -> Result<(), AccessError> {
        self.commit()?;
        let mut ev = self.acc.vcpu_events()?;
        ev.exception.injected = 1;
        ev.exception.nr = vector;
        ev.exception.has_error_code = 0;
        ev.exception.error_code = 0;
        ev.flags = 0;
        self.acc.set_vcpu_events(&ev)
    }
    /// Hands changed registers to the access layer (which writes them before the next KVM_RUN).
    fn commit(&mut self) -> Result<(), AccessError> {
        if self.dirty {
            self.acc.set_regs(&self.regs)?;
            self.dirty = false;
        }
        Ok(())
    }
}

/// Decodes the instruction at RIP (reading up to 15 bytes, fewer at an unreadable page end).
fn fetch(cpu: &mut Cpu<'_>) -> Result<(Instruction, Vec<u8>), EmulationFailure> {
    let rip = cpu.rip();
    let linear = cpu.segment_base(Register::CS).wrapping_add(rip);
    let mut bytes = cpu.acc.read_instruction(linear);
    if bytes.is_empty() {
        return Err(EmulationFailure {
            rip,
            bytes,
            text: "?".into(),
            reason: "cannot read the instruction".into(),
        });
    }
    let mut dec = Decoder::with_ip(cpu.bitness(), &bytes, rip, DecoderOptions::NONE);
    let instr = dec.decode();
    bytes.truncate(instr.len().max(1));
    Ok((instr, bytes))
}

/// Completes the instruction at RIP; returns the name of the fix-up applied.
pub(crate) fn emulate(acc: &mut dyn VcpuAccess) -> Result<&'static str, EmulationFailure> {
    let mut cpu = Cpu::load(acc).map_err(|e| EmulationFailure {
        rip: 0,
        bytes: Vec::new(),
        text: "?".into(),
        reason: format!("reading the vCPU's registers: {e}"),
    })?;
    emulate_at(&mut cpu)
}

fn emulate_at(cpu: &mut Cpu<'_>) -> Result<&'static str, EmulationFailure> {
    let (instr, bytes) = fetch(cpu)?;
    let mut text = String::new();
    IntelFormatter::new().format(&instr, &mut text);
    let fail = |reason: &dyn std::fmt::Display| EmulationFailure {
        rip: cpu_rip(&instr),
        bytes: bytes.clone(),
        text: text.clone(),
        reason: reason.to_string(),
    };
    if instr.is_invalid() {
        return Err(fail(&"not a valid instruction"));
    }
    let next = instr.next_ip();
    let kind = match instr.mnemonic() {
        Mnemonic::Int3 => {
            // A trap: the #BP handler sees the RIP after the int3.
            cpu.set_rip(next);
            cpu.inject_exception(VECTOR_BP).map_err(|e| fail(&e))?;
            "int3 -> #BP"
        }
        Mnemonic::Ud2 => {
            cpu.inject_exception(VECTOR_UD).map_err(|e| fail(&e))?;
            "ud2 -> #UD"
        }
        Mnemonic::Clac | Mnemonic::Stac => {
            let f = cpu.rflags() & !RFLAGS_AC;
            cpu.set_rflags(if instr.mnemonic() == Mnemonic::Stac {
                f | RFLAGS_AC
            } else {
                f
            });
            cpu.set_rip(next);
            "clac/stac"
        }
        Mnemonic::Wait
        | Mnemonic::Lfence
        | Mnemonic::Mfence
        | Mnemonic::Sfence
        | Mnemonic::Pause => {
            cpu.set_rip(next);
            "fwait/fence (no-op)"
        }
        Mnemonic::Popcnt | Mnemonic::Lzcnt | Mnemonic::Tzcnt => {
            let size = instr.op0_register().size() as u32;
            let src = read_operand(cpu, &instr, 1, size).map_err(|e| fail(&e))?;
            let bits = size * 8;
            let (res, cf) = match instr.mnemonic() {
                Mnemonic::Popcnt => (u64::from(src.count_ones()), false),
                Mnemonic::Lzcnt => {
                    let n = if src == 0 {
                        bits
                    } else {
                        src.leading_zeros() - (64 - bits)
                    };
                    (u64::from(n), src == 0)
                }
                _ => (
                    u64::from(if src == 0 { bits } else { src.trailing_zeros() }),
                    src == 0,
                ),
            };
            write_gpr(&mut cpu.regs, instr.op0_register(), res);
            cpu.dirty = true;
            let mut f = cpu.rflags()
                & !(RFLAGS_CF | RFLAGS_PF | RFLAGS_AF | RFLAGS_ZF | RFLAGS_SF | RFLAGS_OF);
            let zf = if instr.mnemonic() == Mnemonic::Popcnt {
                src == 0
            } else {
                res == 0
            };
            if zf {
                f |= RFLAGS_ZF;
            }
            if cf {
                f |= RFLAGS_CF;
            }
            cpu.set_rflags(f);
            cpu.set_rip(next);
            "popcnt/lzcnt/tzcnt"
        }
        Mnemonic::Ldmxcsr => {
            let v = read_operand(cpu, &instr, 0, 4).map_err(|e| fail(&e))? as u32;
            if v & 0xffff_0000 != 0 {
                return Err(fail(&"ldmxcsr with reserved bits set would #GP"));
            }
            cpu.set_mxcsr(v).map_err(|e| fail(&e))?;
            cpu.set_rip(next);
            "ldmxcsr"
        }
        Mnemonic::Stmxcsr => {
            let v = cpu.mxcsr().map_err(|e| fail(&e))?;
            let addr = memory_address(cpu, &instr, 0).map_err(|e| fail(&e))?;
            cpu.write_virt(addr, &v.to_le_bytes())
                .map_err(|e| fail(&e))?;
            cpu.set_rip(next);
            "stmxcsr"
        }
        Mnemonic::Rdpid => {
            let v = cpu.tsc_aux().map_err(|e| fail(&e))?;
            write_gpr(&mut cpu.regs, instr.op0_register(), v);
            cpu.dirty = true;
            cpu.set_rip(next);
            "rdpid"
        }
        _ => {
            return Err(fail(
                &"the host could not emulate it and the VMM has no fix-up for it",
            ))
        }
    };
    cpu.commit().map_err(|e| fail(&e))?;
    Ok(kind)
}

fn cpu_rip(instr: &Instruction) -> u64 {
    instr.ip()
}

/// Linear address of a memory operand.
fn memory_address(cpu: &Cpu<'_>, instr: &Instruction, op: u32) -> Result<u64, OperandError> {
    if instr.op_kind(op) != OpKind::Memory {
        return Err(OperandError::NotMemory(op));
    }
    let seg_base = cpu.segment_base(instr.memory_segment());
    let ea = instr
        .virtual_address(op, 0, |reg, _, _| match reg {
            Register::None => Some(0),
            r if r.is_segment_register() => Some(0),
            r => Some(read_gpr(&cpu.regs, r)),
        })
        .ok_or(OperandError::Address)?;
    Ok(seg_base.wrapping_add(ea))
}

/// Value of operand `op`, `size` bytes wide, from a register or memory.
fn read_operand(
    cpu: &mut Cpu<'_>,
    instr: &Instruction,
    op: u32,
    size: u32,
) -> Result<u64, OperandError> {
    match instr.op_kind(op) {
        OpKind::Register => Ok(read_gpr(&cpu.regs, instr.op_register(op))),
        OpKind::Memory => {
            let addr = memory_address(cpu, instr, op)?;
            let mut buf = [0u8; 8];
            cpu.read_virt(addr, &mut buf[..size as usize])?;
            Ok(u64::from_le_bytes(buf))
        }
        k => Err(OperandError::Kind(format!("{k:?}"))),
    }
}

/// Reads a register of any width (AL..R15, incl. AH-style high bytes).
pub(crate) fn read_gpr(regs: &kvm_regs, reg: Register) -> u64 {
    if reg == Register::RIP {
        return regs.rip;
    }
    let mut r = *regs;
    let full = *gpr_mut(&mut r, reg.full_register());
    match reg.size() {
        8 => full,
        4 => full & 0xffff_ffff,
        2 => full & 0xffff,
        _ if matches!(
            reg,
            Register::AH | Register::BH | Register::CH | Register::DH
        ) =>
        {
            (full >> 8) & 0xff
        }
        _ => full & 0xff,
    }
}

/// Writes a register with x86-64 semantics: 32-bit writes zero-extend, 8/16-bit writes merge.
pub(crate) fn write_gpr(regs: &mut kvm_regs, reg: Register, v: u64) {
    let full_reg = reg.full_register();
    let old = *gpr_mut(regs, full_reg);
    let new = match reg.size() {
        8 => v,
        4 => v & 0xffff_ffff,
        2 => (old & !0xffff) | (v & 0xffff),
        _ if matches!(
            reg,
            Register::AH | Register::BH | Register::CH | Register::DH
        ) =>
        {
            (old & !0xff00) | ((v & 0xff) << 8)
        }
        _ => (old & !0xff) | (v & 0xff),
    };
    *gpr_mut(regs, full_reg) = new;
}

/// A 64-bit general-purpose register in a register file (iced's enum; RAX..R15).
fn gpr_mut(r: &mut kvm_regs, reg: Register) -> &mut u64 {
    match reg {
        Register::RAX => &mut r.rax,
        Register::RBX => &mut r.rbx,
        Register::RCX => &mut r.rcx,
        Register::RDX => &mut r.rdx,
        Register::RSI => &mut r.rsi,
        Register::RDI => &mut r.rdi,
        Register::RSP => &mut r.rsp,
        Register::RBP => &mut r.rbp,
        Register::R8 => &mut r.r8,
        Register::R9 => &mut r.r9,
        Register::R10 => &mut r.r10,
        Register::R11 => &mut r.r11,
        Register::R12 => &mut r.r12,
        Register::R13 => &mut r.r13,
        Register::R14 => &mut r.r14,
        _ => &mut r.r15,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::vcpu_access::fake::FakeVcpu;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    /// A 64-bit vCPU with paging off (virtual = physical, CS base 0) and `code` at 0x1000.
    fn with_code(code: &[u8]) -> FakeVcpu {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let mut c = FakeVcpu::new(mem);
        c.regs.rip = 0x1000;
        c.regs.rflags = 2;
        c.fpu.mxcsr = 0x1f80;
        c.sregs.efer = EFER_LMA;
        c.sregs.cs.l = 1;
        c.msrs.insert(MSR_TSC_AUX, 3);
        poke(&mut c, 0x1000, code);
        c
    }

    fn poke(c: &mut FakeVcpu, addr: u64, bytes: &[u8]) {
        c.mem.write_slice(bytes, GuestAddress(addr)).unwrap();
    }

    fn run(c: &mut FakeVcpu) -> Result<&'static str, EmulationFailure> {
        emulate(c)
    }

    fn committed(c: &FakeVcpu) -> bool {
        c.regs_sets > 0 || c.dirty().0
    }

    #[test]
    fn int3_advances_and_injects_bp() {
        let mut c = with_code(&[0xcc, 0x90]);
        assert_eq!(run(&mut c).unwrap(), "int3 -> #BP");
        assert_eq!(
            (
                c.regs.rip,
                c.events.exception.nr,
                c.event_sets,
                committed(&c)
            ),
            (0x1001, 3, 1, true)
        );
    }

    #[test]
    fn ud2_injects_ud_without_advancing() {
        let mut c = with_code(&[0x0f, 0x0b]);
        run(&mut c).unwrap();
        assert_eq!(
            (c.regs.rip, c.events.exception.nr, c.event_sets),
            (0x1000, 6, 1)
        );
    }

    #[test]
    fn clac_stac_flip_ac() {
        let mut c = with_code(&[0x0f, 0x01, 0xcb, 0x0f, 0x01, 0xca]); // stac; clac
        run(&mut c).unwrap();
        assert_ne!(c.regs.rflags & RFLAGS_AC, 0);
        run(&mut c).unwrap();
        assert_eq!(c.regs.rflags & RFLAGS_AC, 0);
        assert_eq!(c.regs.rip, 0x1006);
    }

    #[test]
    fn fwait_and_fences_are_no_ops() {
        let mut c = with_code(&[0x9b, 0x0f, 0xae, 0xf8, 0x0f, 0xae, 0xe8, 0x0f, 0xae, 0xf0]);
        for _ in 0..4 {
            assert_eq!(run(&mut c).unwrap(), "fwait/fence (no-op)");
        }
        assert_eq!(c.regs.rip, 0x100a);
    }

    #[test]
    fn popcnt_register_and_memory() {
        // popcnt rax, rdi  (f3 48 0f b8 c7)
        let mut c = with_code(&[0xf3, 0x48, 0x0f, 0xb8, 0xc7]);
        c.regs.rdi = 0xf0f0_0000_0000_0001;
        c.regs.rax = 0xdead;
        c.regs.rflags = 2 | RFLAGS_ZF | RFLAGS_CF;
        run(&mut c).unwrap();
        assert_eq!(c.regs.rax, 9);
        assert_eq!(c.regs.rflags & (RFLAGS_ZF | RFLAGS_CF), 0);
        assert_eq!(c.regs.rip, 0x1005);
        // popcnt eax, dword [rbx+8]  (f3 0f b8 43 08): zero source sets ZF, 32-bit write zero-extends
        let mut c = with_code(&[0xf3, 0x0f, 0xb8, 0x43, 0x08]);
        c.regs.rbx = 0x2000;
        c.regs.rax = u64::MAX;
        poke(&mut c, 0x2008, &[0, 0, 0, 0]);
        run(&mut c).unwrap();
        assert_eq!(c.regs.rax, 0);
        assert_ne!(c.regs.rflags & RFLAGS_ZF, 0);
    }

    #[test]
    fn tzcnt_lzcnt_of_zero_give_width_and_cf() {
        // tzcnt ecx, edx (f3 0f bc ca); lzcnt rcx, rdx (f3 48 0f bd ca)
        let mut c = with_code(&[0xf3, 0x0f, 0xbc, 0xca, 0xf3, 0x48, 0x0f, 0xbd, 0xca]);
        run(&mut c).unwrap();
        assert_eq!(c.regs.rcx, 32);
        assert_ne!(c.regs.rflags & RFLAGS_CF, 0);
        c.regs.rdx = 1 << 60;
        run(&mut c).unwrap();
        assert_eq!(c.regs.rcx, 3);
        assert_eq!(c.regs.rflags & RFLAGS_CF, 0);
    }

    #[test]
    fn ldmxcsr_stmxcsr_move_mxcsr() {
        // ldmxcsr [rsp+0x10] (0f ae 54 24 10); stmxcsr [rsp] (0f ae 1c 24)
        let mut c = with_code(&[0x0f, 0xae, 0x54, 0x24, 0x10, 0x0f, 0xae, 0x1c, 0x24]);
        c.regs.rsp = 0x3000;
        poke(&mut c, 0x3010, &0x9fc0u32.to_le_bytes());
        assert_eq!(run(&mut c).unwrap(), "ldmxcsr");
        assert_eq!(c.fpu.mxcsr, 0x9fc0);
        assert_eq!(run(&mut c).unwrap(), "stmxcsr");
        let mut b = [0u8; 4];
        c.mem.read_slice(&mut b, GuestAddress(0x3000)).unwrap();
        assert_eq!(u32::from_le_bytes(b), 0x9fc0);
        poke(&mut c, 0x1009, &[0x0f, 0xae, 0x54, 0x24, 0x10]);
        poke(&mut c, 0x3010, &0x1_0000u32.to_le_bytes());
        assert!(run(&mut c).is_err(), "reserved MXCSR bits are refused");
    }

    #[test]
    fn partial_register_writes_merge() {
        let mut c = kvm_regs {
            rax: 0x1122_3344_5566_7788,
            ..Default::default()
        };
        write_gpr(&mut c, Register::AH, 0xaa);
        assert_eq!(c.rax, 0x1122_3344_5566_aa88);
        write_gpr(&mut c, Register::AX, 0xbbcc);
        assert_eq!(c.rax, 0x1122_3344_5566_bbcc);
        assert_eq!(read_gpr(&c, Register::AH), 0xbb);
    }

    #[test]
    fn unknown_instruction_is_reported_not_guessed() {
        // lsl rax, eax (48 0f 03 c0)
        let mut c = with_code(&[0x48, 0x0f, 0x03, 0xc0]);
        let e = run(&mut c).unwrap_err();
        assert_eq!(e.rip, 0x1000);
        assert_eq!(e.bytes, vec![0x48, 0x0f, 0x03, 0xc0]);
        assert!(e.text.starts_with("lsl"), "{}", e.text);
        assert!(!committed(&c));
        assert!(e.to_string().contains("0x1000"));
    }
}
