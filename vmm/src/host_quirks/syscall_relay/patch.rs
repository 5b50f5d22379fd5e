//! The int3 over the guest's #PF handler: which first instructions the relay can stand in
//! for, where the handler is (the IDT gate), and the patch itself — written into guest
//! memory, and re-checked after exits (alternatives patching can rewrite the entry).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter, Mnemonic};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

pub(super) const INT3: u8 = 0xcc;

/// Why the handler's first instruction cannot be displaced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotDisplaceable {
    #[error("invalid bytes {0:02x?}")]
    Invalid(Vec<u8>),
    #[error("`{0}`")]
    Instruction(String),
}

/// Why the relay cannot be installed over the handler (the relay then stays off, said once).
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("reading the #PF handler at {gva:#x}: {source}")]
    Read {
        gva: u64,
        source: vm_memory::GuestMemoryError,
    },
    #[error("the #PF handler at {gva:#x} starts with {what}, which the relay cannot step over")]
    Refused { gva: u64, what: NotDisplaceable },
    #[error("patching the #PF handler at {gva:#x}: {source}")]
    Write {
        gva: u64,
        source: vm_memory::GuestMemoryError,
    },
}

/// The instruction the int3 displaces, and what stepping over it must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Displaced {
    /// NOP forms and ENDBR64: nothing.
    Nop(u8),
    /// CLAC: clear RFLAGS.AC.
    Clac(u8),
}

impl Displaced {
    /// Bytes to step over (an instruction: never 0).
    pub fn length(self) -> u8 {
        match self {
            Displaced::Nop(n) | Displaced::Clac(n) => n,
        }
    }
}

/// Decodes the handler's first instruction; Ok if the relay can stand in for it, else what it
/// is (for the message that says why guest user space will not run).
pub fn displaceable(bytes: &[u8], ip: u64) -> Result<Displaced, NotDisplaceable> {
    let mut dec = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let instr = dec.decode();
    let len = instr.len() as u8;
    match instr.mnemonic() {
        _ if instr.is_invalid() => Err(NotDisplaceable::Invalid(
            bytes[..bytes.len().min(4)].to_vec(),
        )),
        Mnemonic::Nop | Mnemonic::Endbr64 => Ok(Displaced::Nop(len)),
        Mnemonic::Clac => Ok(Displaced::Clac(len)),
        _ => {
            let mut text = String::new();
            IntelFormatter::new().format(&instr, &mut text);
            Err(NotDisplaceable::Instruction(text))
        }
    }
}

/// The handler address in a 16-byte 64-bit IDT gate, if the gate is a present interrupt or trap
/// gate.
pub fn idt_gate_target(gate: &[u8; 16]) -> Option<u64> {
    let attr = gate[5];
    let present = attr & 0x80 != 0;
    let kind = attr & 0x1f;
    if !present || !(kind == 0x0e || kind == 0x0f) {
        return None;
    }
    let lo = u64::from(u16::from_le_bytes([gate[0], gate[1]]));
    let mid = u64::from(u16::from_le_bytes([gate[6], gate[7]]));
    let hi = u64::from(u32::from_le_bytes(gate[8..12].try_into().unwrap()));
    Some(lo | (mid << 16) | (hi << 32))
}

/// Where the int3 sits (shared by all vCPUs: the handler is in the guest's shared kernel text).
#[derive(Default)]
pub(super) struct Patch {
    /// Guest-virtual address of the handler (0: not installed).
    gva: AtomicU64,
    /// Its guest-physical address.
    gpa: AtomicU64,
    /// Length of the displaced instruction; bit 7 set: it is CLAC.
    displaced: AtomicU8,
}

impl Patch {
    /// The handler's guest-virtual address, once installed.
    pub(super) fn installed_at(&self) -> Option<u64> {
        match self.gva.load(Ordering::Acquire) {
            0 => None,
            a => Some(a),
        }
    }

    pub(super) fn gpa(&self) -> u64 {
        self.gpa.load(Ordering::Acquire)
    }

    /// Marks the patch gone (the guest rewrote the entry with something not displaceable).
    pub(super) fn uninstall(&self) {
        self.gva.store(0, Ordering::Release);
    }

    pub(super) fn displaced(&self) -> Displaced {
        let d = self.displaced.load(Ordering::Acquire);
        if d & 0x80 != 0 {
            Displaced::Clac(d & 0x7f)
        } else {
            Displaced::Nop(d)
        }
    }

    /// Whether the int3 is still at the patched byte (one guest-memory read).
    pub(super) fn intact(&self, mem: &GuestMemoryMmap) -> bool {
        mem.read_obj::<u8>(GuestAddress(self.gpa())).ok() == Some(INT3)
    }

    /// Patches the handler at `gva` (physical `gpa`) if its first instruction can be displaced.
    pub(super) fn patch_at(
        &self,
        mem: &GuestMemoryMmap,
        gva: u64,
        gpa: u64,
    ) -> Result<Displaced, PatchError> {
        let mut bytes = [0u8; 15];
        let n = (0x1000 - (gpa & 0xfff) as usize).min(15);
        mem.read_slice(&mut bytes[..n], GuestAddress(gpa))
            .map_err(|source| PatchError::Read { gva, source })?;
        let d = displaceable(&bytes[..n], gva).map_err(|what| PatchError::Refused { gva, what })?;
        mem.write_obj(INT3, GuestAddress(gpa))
            .map_err(|source| PatchError::Write { gva, source })?;
        let code = match d {
            Displaced::Nop(n) => n,
            Displaced::Clac(n) => n | 0x80,
        };
        self.displaced.store(code, Ordering::Release);
        self.gpa.store(gpa, Ordering::Release);
        self.gva.store(gva, Ordering::Release);
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_instructions_with_no_effect_or_clac_are_displaced() {
        assert_eq!(displaceable(&[0x90, 0x90, 0x90], 0), Ok(Displaced::Nop(1)));
        assert_eq!(displaceable(&[0x0f, 0x1f, 0x00], 0), Ok(Displaced::Nop(3)));
        assert_eq!(displaceable(&[0x66, 0x90], 0), Ok(Displaced::Nop(2)));
        assert_eq!(
            displaceable(&[0xf3, 0x0f, 0x1e, 0xfa], 0),
            Ok(Displaced::Nop(4))
        );
        assert_eq!(displaceable(&[0x0f, 0x01, 0xca], 0), Ok(Displaced::Clac(3)));
        let e = displaceable(&[0x48, 0x89, 0xe5], 0).unwrap_err();
        assert!(e.to_string().contains("mov"), "{e}");
        assert!(displaceable(&[0x0f, 0xff], 0).is_err());
        assert!(displaceable(&[], 0).is_err());
    }

    #[test]
    fn idt_gates_decode() {
        let target: u64 = 0xffff_ffff_8160_0b20;
        let mut g = [0u8; 16];
        g[0..2].copy_from_slice(&(target as u16).to_le_bytes());
        g[2..4].copy_from_slice(&0x10u16.to_le_bytes());
        g[5] = 0x8e;
        g[6..8].copy_from_slice(&((target >> 16) as u16).to_le_bytes());
        g[8..12].copy_from_slice(&((target >> 32) as u32).to_le_bytes());
        assert_eq!(idt_gate_target(&g), Some(target));
        g[5] = 0x8f;
        assert_eq!(idt_gate_target(&g), Some(target));
        g[5] = 0x0e; // not present
        assert_eq!(idt_gate_target(&g), None);
        g[5] = 0x85; // task gate
        assert_eq!(idt_gate_target(&g), None);
    }
}
