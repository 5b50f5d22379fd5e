//! x86-64 architectural constants, in one place, and the guest page-table walk.
//!
//! Taken from the `x86` crate (0.52) where it has them: MSR numbers (`x86::msr`), CR0/CR4 bits
//! (`x86::controlregs::{Cr0, Cr4}`, `usize` bitflags, widened here to the `u64` KVM's
//! `kvm_sregs` holds) and RFLAGS bits (`x86::bits64::rflags::RFlags`). Written by hand, from the
//! SDM / APM, where the crate has nothing to offer: the EFER bits (the crate has the MSR number
//! `IA32_EFER` but no bit names), exception vectors and #PF error-code bits, and the page-table
//! entry bits the walk needs (the crate's `bits64::paging` flags are per-level bitflags types
//! with a private address mask; the walk below needs plain `u64` masks valid at every level,
//! and the 32-bit and PAE formats, which `bits64` does not describe).

use x86::bits64::rflags::RFlags;
use x86::controlregs::{Cr0, Cr4};

// ---- MSRs (x86::msr) ----
/// STAR: SYSCALL/SYSRET segment selectors.
pub const MSR_STAR: u32 = x86::msr::IA32_STAR;
/// LSTAR: the 64-bit SYSCALL entry point.
pub const MSR_LSTAR: u32 = x86::msr::IA32_LSTAR;
/// CSTAR: the compatibility-mode SYSCALL entry point.
pub(crate) const MSR_CSTAR: u32 = x86::msr::IA32_CSTAR;
/// SFMASK (the SDM's IA32_FMASK): RFLAGS bits SYSCALL clears.
pub(crate) const MSR_SFMASK: u32 = x86::msr::IA32_FMASK;
pub(crate) const MSR_KERNEL_GS_BASE: u32 = x86::msr::IA32_KERNEL_GSBASE;
pub(crate) const MSR_TSC_AUX: u32 = x86::msr::IA32_TSC_AUX;
pub(crate) const MSR_SYSENTER_CS: u32 = x86::msr::IA32_SYSENTER_CS;
pub(crate) const MSR_SYSENTER_ESP: u32 = x86::msr::IA32_SYSENTER_ESP;
pub(crate) const MSR_SYSENTER_EIP: u32 = x86::msr::IA32_SYSENTER_EIP;
pub(crate) const MSR_MISC_ENABLE: u32 = x86::msr::IA32_MISC_ENABLE;

// ---- CR0 / CR4 (x86::controlregs) ----
pub const CR0_PE: u64 = Cr0::CR0_PROTECTED_MODE.bits() as u64;
pub(crate) const CR0_ET: u64 = Cr0::CR0_EXTENSION_TYPE.bits() as u64;
pub const CR0_PG: u64 = Cr0::CR0_ENABLE_PAGING.bits() as u64;
pub(crate) const CR4_PSE: u64 = Cr4::CR4_ENABLE_PSE.bits() as u64;
pub const CR4_PAE: u64 = Cr4::CR4_ENABLE_PAE.bits() as u64;
pub(crate) const CR4_LA57: u64 = Cr4::CR4_ENABLE_LA57.bits() as u64;
pub(crate) const CR4_SMEP: u64 = Cr4::CR4_ENABLE_SMEP.bits() as u64;
/// RDPMC allowed at CPL > 0.
pub(crate) const CR4_PCE: u64 = Cr4::CR4_ENABLE_PPMC.bits() as u64;

// ---- EFER (by hand: the x86 crate names no EFER bits) ----
/// Long mode enable.
pub const EFER_LME: u64 = 1 << 8;
/// Long mode active.
pub const EFER_LMA: u64 = 1 << 10;
/// No-execute enable.
pub(crate) const EFER_NXE: u64 = 1 << 11;

// ---- RFLAGS (x86::bits64::rflags) ----
pub(crate) const RFLAGS_CF: u64 = RFlags::FLAGS_CF.bits();
/// Bit 1, always set.
pub(crate) const RFLAGS_FIXED: u64 = RFlags::FLAGS_A1.bits();
pub(crate) const RFLAGS_PF: u64 = RFlags::FLAGS_PF.bits();
pub(crate) const RFLAGS_AF: u64 = RFlags::FLAGS_AF.bits();
pub(crate) const RFLAGS_ZF: u64 = RFlags::FLAGS_ZF.bits();
pub(crate) const RFLAGS_SF: u64 = RFlags::FLAGS_SF.bits();
pub(crate) const RFLAGS_IF: u64 = RFlags::FLAGS_IF.bits();
pub(crate) const RFLAGS_OF: u64 = RFlags::FLAGS_OF.bits();
pub(crate) const RFLAGS_RF: u64 = RFlags::FLAGS_RF.bits();
pub(crate) const RFLAGS_AC: u64 = RFlags::FLAGS_AC.bits();
pub(crate) const RFLAGS_VM: u64 = RFlags::FLAGS_VM.bits();
/// The RFLAGS bits IRETQ can load (the rest are reserved: bits 22-63, 15, 5 and 3).
pub(crate) const RFLAGS_LOADABLE: u64 = 0x3f_7fd5;

// ---- Exceptions (by hand: vector numbers and #PF error bits are not in the x86 crate's
// `irq` module in the form needed here) ----
pub(crate) const VECTOR_BP: u8 = 3;
pub const VECTOR_UD: u8 = 6;
pub(crate) const VECTOR_GP: u8 = 13;
pub(crate) const VECTOR_PF: u8 = 14;
/// #PF error code bits: present, write, user, reserved bit, instruction fetch.
pub(crate) const PF_ERR_PRESENT: u64 = 1 << 0;
pub(crate) const PF_ERR_USER: u64 = 1 << 2;
pub(crate) const PF_ERR_FETCH: u64 = 1 << 4;

// ---- Page-table entries (by hand, see the module comment) ----
pub(crate) const PTE_PRESENT: u64 = 1 << 0;
/// PS: a large page at this level (PDPTE: 1 GiB, PDE: 2 MiB / 4 MiB).
pub(crate) const PTE_HUGE: u64 = 1 << 7;
/// Physical address bits of a 64-bit entry (MAXPHYADDR 52).
pub(crate) const PTE_ADDR: u64 = 0x000f_ffff_ffff_f000;

/// The 64-bit exception frame at an exception handler's first instruction: error code (only for
/// the vectors of [`pushes_error_code`]; 0 in `error` for the others), RIP, CS, RFLAGS, RSP, SS,
/// each 8 bytes, from RSP up. The guest wrote it: every field is whatever it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExceptionFrame {
    pub error: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

impl ExceptionFrame {
    /// Its length with an error code.
    pub(crate) const LEN: usize = 48;

    /// Its length for `vector`.
    pub(crate) fn len_for(vector: u8) -> usize {
        if pushes_error_code(vector) {
            Self::LEN
        } else {
            Self::LEN - 8
        }
    }

    /// The frame of `vector` from the [`Self::len_for`] bytes at the handler's RSP (`b` holds
    /// at least that many; the rest is ignored).
    pub(crate) fn for_vector(vector: u8, b: &[u8; Self::LEN]) -> Self {
        if pushes_error_code(vector) {
            return Self::from_bytes(b);
        }
        let mut with_error = [0u8; Self::LEN];
        with_error[8..].copy_from_slice(&b[..Self::LEN - 8]);
        Self::from_bytes(&with_error)
    }

    pub fn from_bytes(b: &[u8; Self::LEN]) -> Self {
        let q = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        ExceptionFrame {
            error: q(0),
            rip: q(1),
            cs: q(2),
            rflags: q(3),
            rsp: q(4),
            ss: q(5),
        }
    }

    /// The privilege level the exception came from (the saved CS's RPL).
    pub fn cpl(&self) -> u8 {
        (self.cs & 3) as u8
    }

    pub fn user(&self) -> bool {
        self.cpl() == 3
    }
}

/// Whether the CPU pushes an error code for exception `vector` (#DF, #TS, #NP, #SS, #GP, #PF,
/// #AC, #CP, #VC, #SX; SDM vol. 3, table 6-1).
pub(crate) fn pushes_error_code(vector: u8) -> bool {
    matches!(vector, 8 | 10..=14 | 17 | 21 | 29 | 30)
}

/// Whether a linear address is canonical with 48-bit (or, with LA57, 57-bit) addresses.
pub fn canonical(va: u64, la57: bool) -> bool {
    let bits = if la57 { 57 } else { 48 };
    let top = (va as i64) >> (bits - 1);
    top == 0 || top == -1
}

/// The paging mode a vCPU's CR0/CR4/EFER select.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paging {
    /// CR0.PG clear: linear = physical.
    Off,
    /// 32-bit paging: 2 levels of 4-byte entries (4 MiB pages with CR4.PSE).
    Bits32 { pse: bool },
    /// PAE: a 4-entry PDPT, then 2 levels of 8-byte entries.
    Pae,
    /// 4-level (or 5-level with LA57) long-mode paging.
    Long { la57: bool },
}

impl Paging {
    pub fn of(cr0: u64, cr4: u64, efer: u64) -> Paging {
        if cr0 & CR0_PG == 0 {
            Paging::Off
        } else if efer & EFER_LMA != 0 {
            Paging::Long {
                la57: cr4 & CR4_LA57 != 0,
            }
        } else if cr4 & CR4_PAE != 0 {
            Paging::Pae
        } else {
            Paging::Bits32 {
                pse: cr4 & CR4_PSE != 0,
            }
        }
    }
}

/// Guest-linear to guest-physical through the guest's own page tables, read with `read_u64`
/// (a guest-physical read: `None` when the table is outside guest memory). Returns `None` if the
/// address is not mapped. Access rights are not checked (the VMM reads and writes as the CPU's
/// supervisor would with CR0.WP clear). This is the one page walk of the VMM: the vCPU access
/// layer (`vcpu_access`) uses it for every guest-virtual read and write.
pub fn translate(
    paging: Paging,
    cr3: u64,
    va: u64,
    mut read_u64: impl FnMut(u64) -> Option<u64>,
) -> Option<u64> {
    match paging {
        Paging::Off => Some(va),
        Paging::Long { la57 } => {
            let levels: u32 = if la57 { 5 } else { 4 };
            let mut table = cr3 & PTE_ADDR;
            for level in (1..=levels).rev() {
                let shift = 12 + 9 * (level - 1);
                let index = (va >> shift) & 0x1ff;
                let entry = read_u64(table + index * 8)?;
                if entry & PTE_PRESENT == 0 {
                    return None;
                }
                if level == 1 || (entry & PTE_HUGE != 0 && level <= 3) {
                    let page_mask = (1u64 << shift) - 1;
                    return Some((entry & PTE_ADDR & !page_mask) | (va & page_mask));
                }
                table = entry & PTE_ADDR;
            }
            None
        }
        Paging::Pae => {
            let va = va & 0xffff_ffff;
            let pdpte = read_u64((cr3 & 0xffff_ffe0) + ((va >> 30) & 3) * 8)?;
            if pdpte & PTE_PRESENT == 0 {
                return None;
            }
            let pde = read_u64((pdpte & PTE_ADDR) + ((va >> 21) & 0x1ff) * 8)?;
            if pde & PTE_PRESENT == 0 {
                return None;
            }
            if pde & PTE_HUGE != 0 {
                return Some((pde & PTE_ADDR & !0x1f_ffff) | (va & 0x1f_ffff));
            }
            let pte = read_u64((pde & PTE_ADDR) + ((va >> 12) & 0x1ff) * 8)?;
            (pte & PTE_PRESENT != 0).then_some((pte & PTE_ADDR) | (va & 0xfff))
        }
        Paging::Bits32 { pse } => {
            let va = va & 0xffff_ffff;
            // 4-byte entries: read the 8 bytes at the entry and keep the low half.
            let mut read_u32 = |a: u64| read_u64(a).map(|v| v & 0xffff_ffff);
            let pde = read_u32((cr3 & 0xffff_f000) + (va >> 22) * 4)?;
            if pde & PTE_PRESENT == 0 {
                return None;
            }
            if pse && pde & PTE_HUGE != 0 {
                return Some((pde & 0xffc0_0000) | (va & 0x3f_ffff));
            }
            let pte = read_u32((pde & 0xffff_f000) + ((va >> 12) & 0x3ff) * 4)?;
            (pte & PTE_PRESENT != 0).then_some((pte & 0xffff_f000) | (va & 0xfff))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn frames_with_and_without_an_error_code() {
        let words: Vec<u8> = (1u64..=6).flat_map(|w| w.to_le_bytes()).collect();
        let raw: [u8; ExceptionFrame::LEN] = words.try_into().unwrap();
        let gp = ExceptionFrame::for_vector(VECTOR_GP, &raw);
        assert_eq!((gp.error, gp.rip, gp.ss), (1, 2, 6));
        assert_eq!(ExceptionFrame::len_for(VECTOR_GP), 48);
        // #UD pushes no error code: RIP is the first word.
        let ud = ExceptionFrame::for_vector(VECTOR_UD, &raw);
        assert_eq!((ud.error, ud.rip, ud.cs, ud.ss), (0, 1, 2, 5));
        assert_eq!(ExceptionFrame::len_for(VECTOR_UD), 40);
        assert!(!pushes_error_code(VECTOR_BP) && pushes_error_code(VECTOR_PF));
    }

    #[test]
    fn constants_match_the_manuals() {
        assert_eq!(
            (MSR_STAR, MSR_LSTAR, MSR_SFMASK),
            (0xc000_0081, 0xc000_0082, 0xc000_0084)
        );
        assert_eq!(
            (MSR_TSC_AUX, MSR_KERNEL_GS_BASE),
            (0xc000_0103, 0xc000_0102)
        );
        assert_eq!(
            (CR0_PE, CR0_PG, CR4_PAE, CR4_LA57, CR4_SMEP),
            (1, 1 << 31, 1 << 5, 1 << 12, 1 << 20)
        );
        assert_eq!(
            (RFLAGS_FIXED, RFLAGS_IF, RFLAGS_RF, RFLAGS_AC),
            (2, 0x200, 0x1_0000, 0x4_0000)
        );
    }

    fn mem(entries: &[(u64, u64)]) -> impl FnMut(u64) -> Option<u64> + '_ {
        let m: HashMap<u64, u64> = entries.iter().copied().collect();
        move |a| Some(m.get(&a).copied().unwrap_or(0))
    }

    #[test]
    fn modes_are_told_apart() {
        assert_eq!(Paging::of(CR0_PE, 0, 0), Paging::Off);
        assert_eq!(
            Paging::of(CR0_PG, 0, EFER_LMA),
            Paging::Long { la57: false }
        );
        assert_eq!(Paging::of(CR0_PG, CR4_PAE, 0), Paging::Pae);
        assert_eq!(Paging::of(CR0_PG, CR4_PSE, 0), Paging::Bits32 { pse: true });
        assert_eq!(translate(Paging::Off, 0, 0x1234, |_| None), Some(0x1234));
    }

    #[test]
    fn pae_and_32_bit_walks() {
        // PAE: PDPT at 0x1000, PD at 0x2000 (a 2 MiB page at index 1), PT at 0x3000.
        let e = [
            (0x1000, 0x2001),
            (0x2000, 0x3001),
            (0x2008, 0x80_0081),
            (0x3000 + 5 * 8, 0x9001),
        ];
        assert_eq!(
            translate(Paging::Pae, 0x1000, 0x5123, mem(&e)),
            Some(0x9123)
        );
        assert_eq!(
            translate(Paging::Pae, 0x1000, 0x20_0042, mem(&e)),
            Some(0x80_0042)
        );
        assert_eq!(translate(Paging::Pae, 0x1000, 0x4000_0000, mem(&e)), None);
        // 32-bit: PD at 0x1000, a 4 MiB page at index 1, PT at 0x2000.
        let e = [
            (0x1000, 0x2001),
            (0x1004, 0xc0_0081),
            (0x2000 + 3 * 4, 0x7001),
        ];
        let pse = Paging::Bits32 { pse: true };
        assert_eq!(translate(pse, 0x1000, 0x3456, mem(&e)), Some(0x7456));
        assert_eq!(translate(pse, 0x1000, 0x40_1234, mem(&e)), Some(0xc0_1234));
    }
}
