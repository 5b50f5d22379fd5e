//! The local APIC registers the VMM reads and writes through KVM_GET/SET_LAPIC (a 1 KiB copy
//! of the APIC page: 32-bit registers at 16-byte-aligned offsets).

use std::os::raw::c_char;

pub(crate) const LVT_PERFCNT: usize = 0x340;
pub(crate) const LVT_LINT0: usize = 0x350;
pub(crate) const LVT_LINT1: usize = 0x360;
pub(crate) const LVT_MASKED: u32 = 1 << 16;
pub(crate) const DELIVERY_FIXED: u32 = 0;
pub(crate) const DELIVERY_NMI: u32 = 4;
pub(crate) const DELIVERY_EXTINT: u32 = 7;

pub(crate) fn reg(regs: &[c_char; 1024], off: usize) -> u32 {
    let b = |i: usize| regs[off + i] as u8;
    u32::from_le_bytes([b(0), b(1), b(2), b(3)])
}

pub(crate) fn set_reg(regs: &mut [c_char; 1024], off: usize, v: u32) {
    for (i, byte) in v.to_le_bytes().into_iter().enumerate() {
        regs[off + i] = byte as c_char;
    }
}

/// An LVT entry's delivery mode (bits 10:8).
pub(crate) fn delivery_mode(lvt: u32) -> u32 {
    (lvt >> 8) & 7
}

pub(crate) fn with_delivery_mode(lvt: u32, mode: u32) -> u32 {
    (lvt & !0x700) | (mode << 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_roundtrip_and_fields() {
        let mut regs = [0 as c_char; 1024];
        set_reg(&mut regs, LVT_PERFCNT, 0x1_04fe);
        assert_eq!(reg(&regs, LVT_PERFCNT), 0x1_04fe);
        assert_eq!(delivery_mode(0x1_04fe), DELIVERY_NMI);
        assert_eq!(with_delivery_mode(0x1_04fe, DELIVERY_EXTINT), 0x1_07fe);
    }
}
