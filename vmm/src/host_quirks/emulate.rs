//! Completing guest instructions that the host's emulator could not run.
//!
//! Called only when KVM_RUN reported an emulation failure. The instruction at the guest RIP is
//! decoded with iced-x86 and, for the kinds listed in [`emulate`], its architectural effect is
//! applied to the vCPU state (registers, flags, MXCSR, memory) and RIP is advanced, or the
//! exception the CPU would raise is injected. Anything else is reported, not guessed at.

use iced_x86::{
    Decoder, DecoderOptions, Formatter, Instruction, IntelFormatter, Mnemonic, OpKind, Register,
};

/// What the fix-up code needs from a vCPU. The KVM implementation lives with the vCPU; tests
/// use a plain struct.
pub trait GuestCpu {
    fn rip(&self) -> u64;
    fn set_rip(&mut self, rip: u64);
    /// 16, 32 or 64.
    fn bitness(&self) -> u32;
    fn rflags(&self) -> u64;
    fn set_rflags(&mut self, v: u64);
    /// Full 64-bit value of a general-purpose register (iced's 64-bit register enum).
    fn gpr(&self, reg: Register) -> u64;
    fn set_gpr(&mut self, reg: Register, v: u64);
    fn segment_base(&self, seg: Register) -> u64;
    fn read_virt(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), String>;
    fn write_virt(&mut self, addr: u64, buf: &[u8]) -> Result<(), String>;
    fn mxcsr(&mut self) -> Result<u32, String>;
    fn set_mxcsr(&mut self, v: u32) -> Result<(), String>;
    fn tsc_aux(&mut self) -> Result<u64, String>;
    /// Inject exception `vector` (no error code) when the vCPU next runs.
    fn inject_exception(&mut self, vector: u8) -> Result<(), String>;
    /// Write back registers changed through this trait.
    fn commit(&mut self) -> Result<(), String>;
}

/// An instruction we could not complete: enough for the user to see what the guest was doing.
#[derive(Debug, Clone)]
pub struct EmulationFailure {
    pub rip: u64,
    pub bytes: Vec<u8>,
    pub text: String,
    pub reason: String,
}

impl std::fmt::Display for EmulationFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "guest instruction at RIP {:#x} [{:02x?}] `{}`: {}",
            self.rip, self.bytes, self.text, self.reason
        )
    }
}

const RFLAGS_CF: u64 = 1 << 0;
const RFLAGS_PF: u64 = 1 << 2;
const RFLAGS_AF: u64 = 1 << 4;
const RFLAGS_ZF: u64 = 1 << 6;
const RFLAGS_SF: u64 = 1 << 7;
const RFLAGS_OF: u64 = 1 << 11;
const RFLAGS_AC: u64 = 1 << 18;
const VECTOR_BP: u8 = 3;
const VECTOR_UD: u8 = 6;

/// Decodes the instruction at RIP (reading up to 15 bytes, fewer at an unreadable page end).
pub fn fetch(cpu: &mut dyn GuestCpu) -> Result<(Instruction, Vec<u8>), EmulationFailure> {
    let rip = cpu.rip();
    let linear = cpu.segment_base(Register::CS).wrapping_add(rip);
    let mut bytes = vec![0u8; 15];
    if cpu.read_virt(linear, &mut bytes).is_err() {
        // The instruction may end before an unmapped page: take the bytes that can be read.
        bytes.clear();
        let mut b = [0u8; 1];
        while bytes.len() < 15 && cpu.read_virt(linear + bytes.len() as u64, &mut b).is_ok() {
            bytes.push(b[0]);
        }
        if bytes.is_empty() {
            return Err(EmulationFailure {
                rip,
                bytes,
                text: "?".into(),
                reason: "cannot read the instruction".into(),
            });
        }
    }
    let mut dec = Decoder::with_ip(cpu.bitness(), &bytes, rip, DecoderOptions::NONE);
    let instr = dec.decode();
    bytes.truncate(instr.len().max(1));
    Ok((instr, bytes))
}

/// Completes the instruction at RIP; returns the name of the fix-up applied.
pub fn emulate(cpu: &mut dyn GuestCpu) -> Result<&'static str, EmulationFailure> {
    let (instr, bytes) = fetch(cpu)?;
    let mut text = String::new();
    IntelFormatter::new().format(&instr, &mut text);
    let fail = |reason: String| EmulationFailure {
        rip: cpu_rip(&instr),
        bytes: bytes.clone(),
        text: text.clone(),
        reason,
    };
    if instr.is_invalid() {
        return Err(fail("not a valid instruction".into()));
    }
    let next = instr.next_ip();
    let kind = match instr.mnemonic() {
        Mnemonic::Int3 => {
            // A trap: the #BP handler sees the RIP after the int3.
            cpu.set_rip(next);
            cpu.inject_exception(VECTOR_BP).map_err(fail)?;
            "int3 -> #BP"
        }
        Mnemonic::Ud2 => {
            cpu.inject_exception(VECTOR_UD).map_err(fail)?;
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
            let src = read_operand(cpu, &instr, 1, size).map_err(&fail)?;
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
            write_gpr(cpu, instr.op0_register(), res);
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
            let v = read_operand(cpu, &instr, 0, 4).map_err(&fail)? as u32;
            if v & 0xffff_0000 != 0 {
                return Err(fail("ldmxcsr with reserved bits set would #GP".into()));
            }
            cpu.set_mxcsr(v).map_err(&fail)?;
            cpu.set_rip(next);
            "ldmxcsr"
        }
        Mnemonic::Stmxcsr => {
            let v = cpu.mxcsr().map_err(&fail)?;
            let addr = memory_address(cpu, &instr, 0).map_err(&fail)?;
            cpu.write_virt(addr, &v.to_le_bytes()).map_err(&fail)?;
            cpu.set_rip(next);
            "stmxcsr"
        }
        Mnemonic::Rdpid => {
            let v = cpu.tsc_aux().map_err(&fail)?;
            write_gpr(cpu, instr.op0_register(), v);
            cpu.set_rip(next);
            "rdpid"
        }
        _ => {
            return Err(fail(
                "the host could not emulate it and the VMM has no fix-up for it".into(),
            ))
        }
    };
    cpu.commit().map_err(fail)?;
    Ok(kind)
}

fn cpu_rip(instr: &Instruction) -> u64 {
    instr.ip()
}

/// Linear address of a memory operand.
fn memory_address(cpu: &mut dyn GuestCpu, instr: &Instruction, op: u32) -> Result<u64, String> {
    if instr.op_kind(op) != OpKind::Memory {
        return Err(format!("operand {op} is not in memory"));
    }
    let seg_base = cpu.segment_base(instr.memory_segment());
    let ea = instr
        .virtual_address(op, 0, |reg, _, _| match reg {
            Register::None => Some(0),
            r if r.is_segment_register() => Some(0),
            r => Some(read_gpr(cpu, r)),
        })
        .ok_or_else(|| "cannot compute the memory address".to_string())?;
    Ok(seg_base.wrapping_add(ea))
}

/// Value of operand `op`, `size` bytes wide, from a register or memory.
fn read_operand(
    cpu: &mut dyn GuestCpu,
    instr: &Instruction,
    op: u32,
    size: u32,
) -> Result<u64, String> {
    match instr.op_kind(op) {
        OpKind::Register => Ok(read_gpr(cpu, instr.op_register(op))),
        OpKind::Memory => {
            let addr = memory_address(cpu, instr, op)?;
            let mut buf = [0u8; 8];
            cpu.read_virt(addr, &mut buf[..size as usize])?;
            Ok(u64::from_le_bytes(buf))
        }
        k => Err(format!("unsupported operand kind {k:?}")),
    }
}

/// Reads a register of any width (AL..R15, incl. AH-style high bytes).
pub fn read_gpr(cpu: &dyn GuestCpu, reg: Register) -> u64 {
    if reg == Register::RIP {
        return cpu.rip();
    }
    let full = cpu.gpr(reg.full_register());
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
pub fn write_gpr(cpu: &mut dyn GuestCpu, reg: Register, v: u64) {
    let full_reg = reg.full_register();
    let old = cpu.gpr(full_reg);
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
    cpu.set_gpr(full_reg, new);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A flat-memory CPU (virtual = linear, CS base 0) for driving the fix-ups.
    #[derive(Default)]
    struct FakeCpu {
        rip: u64,
        rflags: u64,
        gprs: HashMap<Register, u64>,
        mem: HashMap<u64, u8>,
        mxcsr: u32,
        injected: Option<u8>,
        committed: bool,
    }

    impl FakeCpu {
        fn with_code(code: &[u8]) -> Self {
            let mut c = FakeCpu {
                rip: 0x1000,
                rflags: 2,
                mxcsr: 0x1f80,
                ..Default::default()
            };
            c.poke(0x1000, code);
            c
        }
        fn poke(&mut self, addr: u64, bytes: &[u8]) {
            for (i, b) in bytes.iter().enumerate() {
                self.mem.insert(addr + i as u64, *b);
            }
        }
    }

    impl GuestCpu for FakeCpu {
        fn rip(&self) -> u64 {
            self.rip
        }
        fn set_rip(&mut self, rip: u64) {
            self.rip = rip
        }
        fn bitness(&self) -> u32 {
            64
        }
        fn rflags(&self) -> u64 {
            self.rflags
        }
        fn set_rflags(&mut self, v: u64) {
            self.rflags = v
        }
        fn gpr(&self, reg: Register) -> u64 {
            *self.gprs.get(&reg).unwrap_or(&0)
        }
        fn set_gpr(&mut self, reg: Register, v: u64) {
            self.gprs.insert(reg, v);
        }
        fn segment_base(&self, _seg: Register) -> u64 {
            0
        }
        fn read_virt(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), String> {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = *self.mem.get(&(addr + i as u64)).ok_or("unmapped")?;
            }
            Ok(())
        }
        fn write_virt(&mut self, addr: u64, buf: &[u8]) -> Result<(), String> {
            self.poke(addr, buf);
            Ok(())
        }
        fn mxcsr(&mut self) -> Result<u32, String> {
            Ok(self.mxcsr)
        }
        fn set_mxcsr(&mut self, v: u32) -> Result<(), String> {
            self.mxcsr = v;
            Ok(())
        }
        fn tsc_aux(&mut self) -> Result<u64, String> {
            Ok(3)
        }
        fn inject_exception(&mut self, vector: u8) -> Result<(), String> {
            self.injected = Some(vector);
            Ok(())
        }
        fn commit(&mut self) -> Result<(), String> {
            self.committed = true;
            Ok(())
        }
    }

    #[test]
    fn int3_advances_and_injects_bp() {
        let mut c = FakeCpu::with_code(&[0xcc, 0x90]);
        assert_eq!(emulate(&mut c).unwrap(), "int3 -> #BP");
        assert_eq!((c.rip, c.injected, c.committed), (0x1001, Some(3), true));
    }

    #[test]
    fn ud2_injects_ud_without_advancing() {
        let mut c = FakeCpu::with_code(&[0x0f, 0x0b]);
        emulate(&mut c).unwrap();
        assert_eq!((c.rip, c.injected), (0x1000, Some(6)));
    }

    #[test]
    fn clac_stac_flip_ac() {
        let mut c = FakeCpu::with_code(&[0x0f, 0x01, 0xcb, 0x0f, 0x01, 0xca]); // stac; clac
        emulate(&mut c).unwrap();
        assert_ne!(c.rflags & RFLAGS_AC, 0);
        emulate(&mut c).unwrap();
        assert_eq!(c.rflags & RFLAGS_AC, 0);
        assert_eq!(c.rip, 0x1006);
    }

    #[test]
    fn fwait_and_fences_are_no_ops() {
        let mut c =
            FakeCpu::with_code(&[0x9b, 0x0f, 0xae, 0xf8, 0x0f, 0xae, 0xe8, 0x0f, 0xae, 0xf0]);
        for _ in 0..4 {
            assert_eq!(emulate(&mut c).unwrap(), "fwait/fence (no-op)");
        }
        assert_eq!(c.rip, 0x100a);
    }

    #[test]
    fn popcnt_register_and_memory() {
        // popcnt rax, rdi  (f3 48 0f b8 c7)
        let mut c = FakeCpu::with_code(&[0xf3, 0x48, 0x0f, 0xb8, 0xc7]);
        c.gprs.insert(Register::RDI, 0xf0f0_0000_0000_0001);
        c.gprs.insert(Register::RAX, 0xdead);
        c.rflags = 2 | RFLAGS_ZF | RFLAGS_CF;
        emulate(&mut c).unwrap();
        assert_eq!(c.gprs[&Register::RAX], 9);
        assert_eq!(c.rflags & (RFLAGS_ZF | RFLAGS_CF), 0);
        assert_eq!(c.rip, 0x1005);
        // popcnt eax, dword [rbx+8]  (f3 0f b8 43 08): zero source sets ZF, 32-bit write zero-extends
        let mut c = FakeCpu::with_code(&[0xf3, 0x0f, 0xb8, 0x43, 0x08]);
        c.gprs.insert(Register::RBX, 0x2000);
        c.gprs.insert(Register::RAX, u64::MAX);
        c.poke(0x2008, &[0, 0, 0, 0]);
        emulate(&mut c).unwrap();
        assert_eq!(c.gprs[&Register::RAX], 0);
        assert_ne!(c.rflags & RFLAGS_ZF, 0);
    }

    #[test]
    fn tzcnt_lzcnt_of_zero_give_width_and_cf() {
        // tzcnt ecx, edx (f3 0f bc ca); lzcnt rcx, rdx (f3 48 0f bd ca)
        let mut c = FakeCpu::with_code(&[0xf3, 0x0f, 0xbc, 0xca, 0xf3, 0x48, 0x0f, 0xbd, 0xca]);
        emulate(&mut c).unwrap();
        assert_eq!(c.gprs[&Register::RCX], 32);
        assert_ne!(c.rflags & RFLAGS_CF, 0);
        c.gprs.insert(Register::RDX, 1 << 60);
        emulate(&mut c).unwrap();
        assert_eq!(c.gprs[&Register::RCX], 3);
        assert_eq!(c.rflags & RFLAGS_CF, 0);
    }

    #[test]
    fn ldmxcsr_stmxcsr_move_mxcsr() {
        // ldmxcsr [rsp+0x10] (0f ae 54 24 10); stmxcsr [rsp] (0f ae 1c 24)
        let mut c = FakeCpu::with_code(&[0x0f, 0xae, 0x54, 0x24, 0x10, 0x0f, 0xae, 0x1c, 0x24]);
        c.gprs.insert(Register::RSP, 0x3000);
        c.poke(0x3010, &0x9fc0u32.to_le_bytes());
        assert_eq!(emulate(&mut c).unwrap(), "ldmxcsr");
        assert_eq!(c.mxcsr, 0x9fc0);
        assert_eq!(emulate(&mut c).unwrap(), "stmxcsr");
        let mut b = [0u8; 4];
        c.read_virt(0x3000, &mut b).unwrap();
        assert_eq!(u32::from_le_bytes(b), 0x9fc0);
        c.poke(0x1009, &[0x0f, 0xae, 0x54, 0x24, 0x10]);
        c.poke(0x3010, &0x1_0000u32.to_le_bytes());
        assert!(emulate(&mut c).is_err(), "reserved MXCSR bits are refused");
    }

    #[test]
    fn partial_register_writes_merge() {
        let mut c = FakeCpu::default();
        c.gprs.insert(Register::RAX, 0x1122_3344_5566_7788);
        write_gpr(&mut c, Register::AH, 0xaa);
        assert_eq!(c.gprs[&Register::RAX], 0x1122_3344_5566_aa88);
        write_gpr(&mut c, Register::AX, 0xbbcc);
        assert_eq!(c.gprs[&Register::RAX], 0x1122_3344_5566_bbcc);
        assert_eq!(read_gpr(&c, Register::AH), 0xbb);
    }

    #[test]
    fn unknown_instruction_is_reported_not_guessed() {
        // lsl rax, eax (48 0f 03 c0)
        let mut c = FakeCpu::with_code(&[0x48, 0x0f, 0x03, 0xc0]);
        let e = emulate(&mut c).unwrap_err();
        assert_eq!(e.rip, 0x1000);
        assert_eq!(e.bytes, vec![0x48, 0x0f, 0x03, 0xc0]);
        assert!(e.text.starts_with("lsl"), "{}", e.text);
        assert!(!c.committed);
        assert!(e.to_string().contains("0x1000"));
    }
}
