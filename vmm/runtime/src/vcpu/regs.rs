//! Boot-time vCPU state for the 64-bit boot protocol: GDT, identity page tables, long mode
//! segment registers, general registers, FPU, boot MSRs and the local APIC's LINT pins.
//! (The same state Firecracker and the Linux boot protocol document; APs are left to KVM,
//! which holds them until the BSP sends INIT/SIPI.)

use kvm_bindings::{kvm_fpu, kvm_msr_entry, kvm_regs, kvm_segment, kvm_sregs, Msrs};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::boot::layout::*;
use crate::kvm_error::{on_vcpu, KvmSetupError, KvmVcpuError};
use crate::vcpu_access::lapic;

#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    #[error("writing boot structures to guest memory: {0}")]
    Memory(#[from] vm_memory::GuestMemoryError),
    #[error(transparent)]
    Kvm(#[from] KvmSetupError),
}

use crate::arch::x86::{
    CR0_ET as X86_CR0_ET, CR0_PE as X86_CR0_PE, CR0_PG as X86_CR0_PG, CR4_PAE as X86_CR4_PAE,
    EFER_LMA, EFER_LME, MSR_CSTAR, MSR_KERNEL_GS_BASE, MSR_LSTAR,
    MSR_MISC_ENABLE as MSR_IA32_MISC_ENABLE, MSR_SFMASK as MSR_SYSCALL_MASK, MSR_STAR,
    MSR_SYSENTER_CS as MSR_IA32_SYSENTER_CS, MSR_SYSENTER_EIP as MSR_IA32_SYSENTER_EIP,
    MSR_SYSENTER_ESP as MSR_IA32_SYSENTER_ESP,
};

/// GDT entry from (flags, base, limit) as in the Linux `GDT_ENTRY` macro.
const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << (56 - 24))
        | ((flags as u64 & 0x0000_f0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << (48 - 16))
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

fn segment_from_gdt(entry: u64, index: u8) -> kvm_segment {
    let get = |shift: u32, bits: u32| ((entry >> shift) & ((1 << bits) - 1)) as u8;
    kvm_segment {
        base: ((entry >> 16) & 0xff_ffff) | (((entry >> 56) & 0xff) << 24),
        limit: {
            let l = ((entry & 0xffff) | (((entry >> 48) & 0xf) << 16)) as u32;
            if get(55, 1) == 1 {
                (l << 12) | 0xfff
            } else {
                l
            }
        },
        selector: u16::from(index) * 8,
        type_: get(40, 4),
        present: get(47, 1),
        dpl: get(45, 2),
        db: get(54, 1),
        s: get(44, 1),
        l: get(53, 1),
        g: get(55, 1),
        avl: get(52, 1),
        unusable: u8::from(get(47, 1) == 0),
        padding: 0,
    }
}

/// Writes the boot GDT (null, code with `code_flags`, flat 4 GiB data, TSS) and loads it: GDTR,
/// no IDT, CS from entry 1, DS/ES/FS/GS/SS from entry 2, TR from entry 3. Long mode and the
/// Multiboot state differ only in the code segment (0xa09b 64-bit, 0xc09b 32-bit).
fn flat_segments(
    mem: &GuestMemoryMmap,
    sregs: &mut kvm_sregs,
    code_flags: u16,
) -> Result<(), RegsError> {
    let gdt = [
        gdt_entry(0, 0, 0),                // null
        gdt_entry(code_flags, 0, 0xfffff), // code
        gdt_entry(0xc093, 0, 0xfffff),     // data, 4 GiB
        gdt_entry(0x808b, 0, 0xfffff),     // TSS
    ];
    for (i, e) in gdt.iter().enumerate() {
        mem.write_obj(*e, GuestAddress(GDT_ADDR + 8 * i as u64))?;
    }
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (std::mem::size_of_val(&gdt) - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    let data = segment_from_gdt(gdt[2], 2);
    sregs.cs = segment_from_gdt(gdt[1], 1);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment_from_gdt(gdt[3], 3);
    Ok(())
}

/// Writes GDT and identity-mapped page tables (first 4 GiB, 2 MiB pages) and returns the
/// special registers for 64-bit long mode.
pub(crate) fn long_mode_sregs(
    mem: &GuestMemoryMmap,
    mut sregs: kvm_sregs,
) -> Result<kvm_sregs, RegsError> {
    flat_segments(mem, &mut sregs, 0xa09b)?; // 64-bit code

    mem.write_obj(PDPT_ADDR | 0x03, GuestAddress(PML4_ADDR))?;
    for g in 0..IDENTITY_MAP_GIB {
        let pd = PD_ADDR + g * 0x1000;
        mem.write_obj(pd | 0x03, GuestAddress(PDPT_ADDR + g * 8))?;
        for i in 0..512u64 {
            mem.write_obj(((g * 512 + i) << 21) | 0x83, GuestAddress(pd + i * 8))?;
        }
    }
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 |= X86_CR4_PAE;
    sregs.cr0 |= X86_CR0_PE | X86_CR0_ET | X86_CR0_PG;
    sregs.efer |= EFER_LME | EFER_LMA;
    Ok(sregs)
}

/// Sets up the boot vCPU to enter a 64-bit kernel at `entry` with RSI pointing at the zero page.
pub(crate) fn setup_boot_vcpu(
    vcpu: &VcpuFd,
    mem: &GuestMemoryMmap,
    entry: u64,
) -> Result<(), RegsError> {
    let sregs = vcpu.get_sregs().map_err(on_vcpu(KvmVcpuError::GetSregs))?;
    let sregs = long_mode_sregs(mem, sregs)?;
    vcpu.set_sregs(&sregs)
        .map_err(on_vcpu(KvmVcpuError::SetSregs))?;
    let regs = kvm_regs {
        rflags: 0x2,
        rip: entry,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        rsi: ZERO_PAGE_ADDR,
        ..Default::default()
    };
    vcpu.set_regs(&regs)
        .map_err(on_vcpu(KvmVcpuError::SetRegs))?;
    Ok(())
}

/// State every vCPU gets: FPU defaults, boot MSRs, LAPIC LINT0 = ExtINT and LINT1 = NMI.
pub(crate) fn setup_common(vcpu: &VcpuFd) -> Result<(), RegsError> {
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(on_vcpu(KvmVcpuError::SetFpu))?;

    const MISC_ENABLE_FAST_STRING: u64 = 1;
    let entries: Vec<kvm_msr_entry> = [
        (MSR_IA32_SYSENTER_CS, 0),
        (MSR_IA32_SYSENTER_ESP, 0),
        (MSR_IA32_SYSENTER_EIP, 0),
        (MSR_STAR, 0),
        (MSR_CSTAR, 0),
        (MSR_KERNEL_GS_BASE, 0),
        (MSR_SYSCALL_MASK, 0),
        (MSR_LSTAR, 0),
        (MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
    ]
    .into_iter()
    .map(|(index, data)| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    })
    .collect();
    let msrs = Msrs::from_entries(&entries).expect("fixed small MSR list");
    let n = vcpu.set_msrs(&msrs).map_err(KvmSetupError::SetMsrs)?;
    if n != entries.len() {
        log::debug!("KVM accepted {n} of {} boot MSRs", entries.len());
    }

    let mut lapic = vcpu.get_lapic().map_err(KvmSetupError::GetLapic)?;
    for (reg, mode) in [
        (lapic::LVT_LINT0, lapic::DELIVERY_EXTINT),
        (lapic::LVT_LINT1, lapic::DELIVERY_NMI),
    ] {
        let v = lapic::reg(&lapic.regs, reg);
        lapic::set_reg(&mut lapic.regs, reg, lapic::with_delivery_mode(v, mode));
    }
    vcpu.set_lapic(&lapic).map_err(KvmSetupError::SetLapic)?;
    Ok(())
}

/// Writes a flat 32-bit GDT and returns the special registers of the Multiboot v1 machine state
/// (spec 3.2): protected mode with paging off, CS a 32-bit flat code segment, DS/ES/FS/GS/SS a
/// flat data segment, CR4 and EFER clear, no IDT.
pub(crate) fn protected_mode_sregs(
    mem: &GuestMemoryMmap,
    mut sregs: kvm_sregs,
) -> Result<kvm_sregs, RegsError> {
    flat_segments(mem, &mut sregs, 0xc09b)?; // 32-bit code, 4 GiB
    sregs.cr0 = X86_CR0_PE | X86_CR0_ET;
    sregs.cr3 = 0;
    sregs.cr4 = 0;
    sregs.efer = 0;
    Ok(sregs)
}

/// Sets up the boot vCPU to enter a Multiboot v1 kernel at `entry` (32-bit protected mode,
/// paging off) with EAX = the boot loader magic and EBX = the information block.
pub(crate) fn setup_multiboot(
    vcpu: &VcpuFd,
    mem: &GuestMemoryMmap,
    entry: u32,
    info: u32,
) -> Result<(), RegsError> {
    let sregs = vcpu.get_sregs().map_err(on_vcpu(KvmVcpuError::GetSregs))?;
    let sregs = protected_mode_sregs(mem, sregs)?;
    vcpu.set_sregs(&sregs)
        .map_err(on_vcpu(KvmVcpuError::SetSregs))?;
    let regs = kvm_regs {
        rflags: 0x2,
        rip: entry.into(),
        rax: crate::boot::multiboot::BOOTLOADER_MAGIC.into(),
        rbx: info.into(),
        // The spec leaves ESP undefined; a kernel sets its own. This one is valid meanwhile.
        rsp: BOOT_STACK_POINTER,
        ..Default::default()
    };
    vcpu.set_regs(&regs)
        .map_err(on_vcpu(KvmVcpuError::SetRegs))?;
    Ok(())
}

/// How vCPU 0 starts (the other vCPUs wait in KVM for INIT/SIPI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BootEntry {
    /// 64-bit long mode at `rip` (Linux 64-bit boot protocol: RSI = the zero page; tiny guests).
    LongMode { rip: u64 },
    /// Real mode at `rip` (CS base 0; tiny guests).
    RealMode { rip: u64 },
    /// 32-bit protected mode, paging off, EAX/EBX as Multiboot v1 says.
    Multiboot { entry: u32, info: u32 },
}

/// Puts vCPU 0 in the state `entry` names.
pub(crate) fn setup_boot_entry(
    vcpu: &VcpuFd,
    mem: &GuestMemoryMmap,
    entry: BootEntry,
) -> Result<(), RegsError> {
    match entry {
        BootEntry::LongMode { rip } => setup_boot_vcpu(vcpu, mem, rip),
        BootEntry::RealMode { rip } => setup_real_mode(vcpu, rip),
        BootEntry::Multiboot { entry, info } => setup_multiboot(vcpu, mem, entry, info),
    }
}

/// Sets up the boot vCPU for a real-mode image: all segments at base 0, RIP = `entry`.
pub(crate) fn setup_real_mode(vcpu: &VcpuFd, entry: u64) -> Result<(), RegsError> {
    let mut sregs = vcpu.get_sregs().map_err(on_vcpu(KvmVcpuError::GetSregs))?;
    for s in [
        &mut sregs.cs,
        &mut sregs.ds,
        &mut sregs.es,
        &mut sregs.fs,
        &mut sregs.gs,
        &mut sregs.ss,
    ] {
        s.base = 0;
        s.selector = 0;
    }
    vcpu.set_sregs(&sregs)
        .map_err(on_vcpu(KvmVcpuError::SetSregs))?;
    let regs = kvm_regs {
        rflags: 0x2,
        rip: entry,
        rsp: 0x7000,
        ..Default::default()
    };
    vcpu.set_regs(&regs)
        .map_err(on_vcpu(KvmVcpuError::SetRegs))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryBackend;

    #[test]
    fn gdt_entries_decode_to_long_mode_segments() {
        let code = segment_from_gdt(gdt_entry(0xa09b, 0, 0xfffff), 1);
        assert_eq!(
            (code.l, code.db, code.present, code.type_, code.selector),
            (1, 0, 1, 0xb, 8)
        );
        assert_eq!(code.limit, 0xffff_ffff);
        let data = segment_from_gdt(gdt_entry(0xc093, 0, 0xfffff), 2);
        assert_eq!((data.l, data.db, data.type_, data.selector), (0, 1, 3, 16));
        assert_eq!(segment_from_gdt(0, 0).unusable, 1);
    }

    #[test]
    fn multiboot_state_is_flat_32_bit_protected_mode_with_paging_off() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let start = kvm_sregs {
            efer: EFER_LME | EFER_LMA,
            cr0: X86_CR0_PG | X86_CR0_PE,
            cr4: X86_CR4_PAE,
            ..Default::default()
        };
        let s = protected_mode_sregs(&mem, start).unwrap();
        assert_eq!((s.cr0, s.cr4, s.efer), (X86_CR0_PE | X86_CR0_ET, 0, 0));
        assert_eq!(
            (
                s.cs.l,
                s.cs.db,
                s.cs.type_,
                s.cs.base,
                s.cs.limit,
                s.cs.selector
            ),
            (0, 1, 0xb, 0, 0xffff_ffff, 8)
        );
        for seg in [s.ds, s.es, s.fs, s.gs, s.ss] {
            assert_eq!(
                (seg.db, seg.type_, seg.base, seg.limit),
                (1, 3, 0, 0xffff_ffff)
            );
            assert_eq!(seg.selector, 16);
        }
        // The GDT in memory says the same (a far jump or segment reload keeps the state).
        let code: u64 = mem.read_obj(GuestAddress(GDT_ADDR + 8)).unwrap();
        assert_eq!(segment_from_gdt(code, 1).db, 1);
    }

    #[test]
    fn page_tables_identity_map_first_4_gib() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
        let sregs = long_mode_sregs(&mem, kvm_sregs::default()).unwrap();
        assert_eq!(sregs.cr3, PML4_ADDR);
        assert_ne!(sregs.efer & EFER_LMA, 0);
        let pde: u64 = mem.read_obj(GuestAddress(PD_ADDR + 8 * 8)).unwrap();
        assert_eq!(pde, (8 << 21) | 0x83);
        // The LAPIC page (0xfee00000) is in the 4th GiB: PD 3, entry 0x1f7.
        let lapic_pde: u64 = mem
            .read_obj(GuestAddress(PD_ADDR + 3 * 0x1000 + 0x1f7 * 8))
            .unwrap();
        assert_eq!(lapic_pde, 0xfee0_0000 & !0x1f_ffff | 0x83);
        let pdpte: u64 = mem.read_obj(GuestAddress(PDPT_ADDR + 3 * 8)).unwrap();
        assert_eq!(pdpte, (PD_ADDR + 3 * 0x1000) | 3);
        assert!(mem.address_in_range(GuestAddress(PD_ADDR + 4 * 4096 - 1)));
    }
}
