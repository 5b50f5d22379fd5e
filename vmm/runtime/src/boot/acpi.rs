//! ACPI tables for a Linux guest booted directly (no firmware, no PCI).
//!
//! Two jobs: tell the kernel about the vCPUs and interrupt controllers (Debian's cloud kernel
//! has no MP-table parser, so without a MADT it brings up only the boot CPU), and give it a way
//! to power off. The platform described is a "fixed hardware" one (the FADT does NOT set
//! HW_REDUCED_ACPI): a PM1a event block (status, enable) and a PM1a control block at
//! [`PM1A_EVT_PORT`] / [`PM1A_CNT_PORT`], an SCI on ISA IRQ 9 that never fires, no SMI command
//! port (the platform is always in ACPI mode) and a FACS. Power-off is the guest writing
//! SLP_TYP(S5) | SLP_EN to PM1a_CNT, an I/O port the VMM traps (devices/acpi_pm.rs).
//!
//! Why not hardware-reduced: a hardware-reduced Linux has no legacy PIC and hence no ISA IRQs
//! (IRQ 0-15 do not exist), so an ISA device's interrupt works only once the DSDT names its GSI.
//! A kernel built without CONFIG_PCI (common in microVM configs) loads no DSDT at all: Linux 6.1's
//! ACPICA then has no PCI_Config region handler and gives up ("AE_BAD_PARAMETER, During Region
//! initialization ... Unable to load the System Description Tables"). Its 8250 driver keeps the
//! legacy ports with IRQ 4 and 3, request_irq fails at the first open, the tty is marked
//! TTY_IO_ERROR and every write of user space to the console fails with EIO, while printk (polled)
//! still reaches it. With fixed hardware the kernel keeps its 8259 PIC and identity-maps ISA
//! IRQs to I/O APIC pins, so the console works with or without a DSDT.
//!
//! Tables, packed in this order from [`RSDP_ADDR`] (RSDP 16-byte aligned, FACS 64-byte aligned,
//! the rest 8-byte aligned), all below 1 MiB in the BIOS area that Linux also scans for the RSDP:
//!
//! ```text
//! RSDP (rev 2) -> XSDT -> FACP (FADT rev 6) -> DSDT (\_S5_, COM1, COM2)
//!                                           -> FACS
//!                      -> APIC (MADT: N local APICs, 1 I/O APIC, SCI override, LINT1 = NMI)
//! ```
//!
//! Interrupt wiring this describes: KVM's in-kernel irqchip with its default GSI routing, where
//! ISA IRQ n reaches I/O APIC pin n (GSI n) and the 8259 PIC for n < 16. That is why the MADT has
//! no IRQ0 -> GSI2 override: QEMU needs one because it reprograms KVM's routing to send the PIT
//! to pin 2, and this VMM does not. The one override is the SCI's (IRQ 9, level, active high, as
//! QEMU gives it): the VMM never raises it.

use acpi_tables::facs::FACS;
use acpi_tables::fadt::{FADTBuilder, Flags as FadtFlags};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::{aml, Aml};
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

/// Where the RSDP goes: the start of the BIOS area (0xE0000..0xFFFFF) Linux scans when
/// boot_params.acpi_rsdp_addr is not set. The other tables follow it.
pub(crate) const RSDP_ADDR: u64 = 0x000E_0000;
/// End (exclusive) of the area the tables may occupy.
pub(crate) const ACPI_AREA_END: u64 = 0x0010_0000;

/// First I/O port of the VMM's ACPI power-management registers (devices/acpi_pm.rs): a one-byte
/// sleep control register in the hardware-reduced layout (not in the FADT: the VMM's tiny test
/// guests power off by writing SLP_TYP(S5) | SLP_EN there), then the PM1a blocks below.
pub(crate) const PM_BASE_PORT: u16 = 0x600;
/// The PM1a event block: PM1_STS (2 bytes), then PM1_EN (2 bytes).
pub(crate) const PM1A_EVT_PORT: u16 = PM_BASE_PORT + 4;
pub(crate) const PM1_EVT_LEN: u8 = 4;
/// The PM1a control block: PM1_CNT (2 bytes).
pub(crate) const PM1A_CNT_PORT: u16 = PM_BASE_PORT + 8;
pub(crate) const PM1_CNT_LEN: u8 = 2;
/// How many ports the power-management registers take from [`PM_BASE_PORT`].
pub(crate) const PM_PORTS: u16 = PM1A_CNT_PORT + PM1_CNT_LEN as u16 - PM_BASE_PORT;
/// The SCI: ISA IRQ 9 (GSI 9), the PC convention. Nothing in the VMM raises it.
pub(crate) const SCI_IRQ: u8 = 9;
/// SLP_TYP value the DSDT's `\_S5_` object gives for S5 (soft off).
pub(crate) const SLEEP_TYPE_S5: u8 = 5;

/// Sleep control register layout (ACPI 6.5, 4.8.3.7): SLP_TYP in bits 2..=4, SLP_EN in bit 5.
/// PM1_CNT's high byte has the same layout (SLP_TYP in bits 10..=12, SLP_EN in bit 13).
const SLP_TYP_SHIFT: u8 = 2;
const SLP_TYP_MASK: u8 = 0b111;
const SLP_EN: u8 = 1 << 5;

// Identification written into every table header.
const OEM_ID: [u8; 6] = *b"VPMU  ";
const OEM_REVISION: u32 = 1;
/// FADT "hypervisor vendor identity" (a u64 holding 8 ASCII bytes).
const HYPERVISOR_VENDOR_ID: [u8; 8] = *b"VPMU-VMM";

/// Size of the common table header (signature..creator revision).
const HEADER_LEN: u32 = 36;

/// FADT IAPC_BOOT_ARCH bits (ACPI 6.5, table 5.11). Bit 1 ("8042 present") stays clear on
/// purpose: the VMM's i8042 only implements the reset command, so the kernel's PS/2 driver is
/// better off not probing it (`reboot=k` still works: it writes port 0x64 directly).
const IAPC_NO_VGA: u16 = 1 << 2;
const IAPC_NO_MSI: u16 = 1 << 3;
const IAPC_NO_ASPM: u16 = 1 << 4;
const IAPC_NO_CMOS_RTC: u16 = 1 << 5;

/// MADT flags: PCAT_COMPAT, "the system also has dual 8259 PICs" (KVM's in-kernel PIC).
const MADT_PCAT_COMPAT: u32 = 1;
/// MADT interrupt controller structure types.
const MADT_LOCAL_APIC: u8 = 0;
const MADT_IO_APIC: u8 = 1;
const MADT_INTERRUPT_OVERRIDE: u8 = 2;
const MADT_LOCAL_APIC_NMI: u8 = 4;
/// MPS INTI flags of the SCI override: polarity active high (01), trigger mode level (11 << 2).
const SCI_INTI_FLAGS: u16 = 0b1101;
/// The ISA bus, source of an interrupt source override.
const ISA_BUS: u8 = 0;
/// Local APIC flags: Enabled.
const LAPIC_ENABLED: u32 = 1;
/// ACPI processor UID meaning "all processors" in a Local APIC NMI structure.
const ALL_PROCESSORS: u8 = 0xff;
/// I/O APIC id; 0 is also the reset value of the ID register of KVM's in-kernel I/O APIC.
const IOAPIC_ID: u8 = 0;

/// The VMM's legacy UARTs (devices/serial.rs): name, I/O base, ISA IRQ (= GSI, see above).
/// A kernel that loads the DSDT finds them through its 8250 PnP driver (`_CRS` below); one that
/// cannot (no CONFIG_PCI) keeps its built-in legacy ports, whose IRQs 4 and 3 work because the
/// platform is not hardware-reduced (see the module comment).
const UARTS: [(&str, u16, u32); 2] = [("COM1", 0x3f8, 4), ("COM2", 0x2f8, 3)];
const UART_PORTS: u8 = 8;

/// What a write to the sleep control register asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SleepRequest {
    /// S5, soft off.
    PowerOff,
}

#[derive(Debug, thiserror::Error)]
pub enum AcpiError {
    #[error("ACPI tables need at least one vCPU")]
    NoCpus,
    #[error(
        "ACPI tables do not fit: {table} would end at {end:#x}, past {:#x}",
        ACPI_AREA_END
    )]
    TooLarge { table: &'static str, end: u64 },
    #[error("writing the ACPI {table} table to guest memory at {addr:#x}: {source}")]
    GuestMemory {
        table: &'static str,
        addr: u64,
        #[source]
        source: GuestMemoryError,
    },
}

/// Builds the ACPI tables for `num_cpus` vCPUs (APIC ids 0..num_cpus), the I/O APIC at
/// `ioapic_addr` (GSI base 0) and the local APICs at `lapic_addr`, writes them into guest
/// memory from [`RSDP_ADDR`] on, and returns the address of the RSDP.
#[cfg(test)]
pub(crate) fn create_acpi_tables(
    mem: &GuestMemoryMmap,
    num_cpus: u8,
    ioapic_addr: u32,
    lapic_addr: u32,
) -> Result<GuestAddress, AcpiError> {
    create_acpi_tables_with(mem, num_cpus, ioapic_addr, lapic_addr, &[])
}

/// A virtio-mmio register block for the DSDT. A hardware-reduced Linux has no identity-mapped
/// ISA IRQs, so `virtio_mmio.device=...:IRQ` on the command line cannot name a usable interrupt;
/// a DSDT device with `_HID "LNRO0005"` (matched by Linux's virtio_mmio driver, as with
/// Firecracker) and a `_CRS` naming the GSI does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VirtioMmioAcpi {
    pub base: u32,
    pub len: u32,
    pub gsi: u32,
}

/// [`create_acpi_tables`], plus virtio-mmio devices in the DSDT.
pub(crate) fn create_acpi_tables_with(
    mem: &GuestMemoryMmap,
    num_cpus: u8,
    ioapic_addr: u32,
    lapic_addr: u32,
    virtio_mmio: &[VirtioMmioAcpi],
) -> Result<GuestAddress, AcpiError> {
    if num_cpus == 0 {
        return Err(AcpiError::NoCpus);
    }

    // The DSDT and MADT do not point anywhere, and the FADT and XSDT have fixed sizes, so
    // every address is known before any pointer has to be filled in.
    let dsdt = dsdt(virtio_mmio);
    let madt = madt(num_cpus, ioapic_addr, lapic_addr);
    let xsdt_len = HEADER_LEN as usize + 2 * std::mem::size_of::<u64>();

    let mut next = RSDP_ADDR;
    let rsdp_addr = place(&mut next, Rsdp::len(), 16, "RSDP")?;
    let xsdt_addr = place(&mut next, xsdt_len, 8, "XSDT")?;
    let fadt_addr = place(&mut next, acpi_tables::fadt::FADT::len(), 8, "FACP")?;
    let madt_addr = place(&mut next, madt.len(), 8, "APIC")?;
    let dsdt_addr = place(&mut next, dsdt.len(), 8, "DSDT")?;
    let facs_addr = place(&mut next, FACS::len(), FACS_ALIGN, "FACS")?;

    let fadt = to_bytes(&fadt(dsdt_addr, facs_addr));
    let facs = to_bytes(&facs());
    let mut xsdt = XSDT::new(OEM_ID, *b"VPMUXSDT", OEM_REVISION);
    xsdt.add_entry(fadt_addr);
    xsdt.add_entry(madt_addr);
    let xsdt = to_bytes(&xsdt);
    let rsdp = to_bytes(&Rsdp::new(OEM_ID, xsdt_addr));
    debug_assert_eq!(xsdt.len(), xsdt_len);

    for (table, addr, bytes) in [
        ("RSDP", rsdp_addr, rsdp.as_slice()),
        ("XSDT", xsdt_addr, xsdt.as_slice()),
        ("FACP", fadt_addr, fadt.as_slice()),
        ("APIC", madt_addr, madt.as_slice()),
        ("DSDT", dsdt_addr, dsdt.as_slice()),
        ("FACS", facs_addr, facs.as_slice()),
    ] {
        mem.write_slice(bytes, GuestAddress(addr))
            .map_err(|source| AcpiError::GuestMemory {
                table,
                addr,
                source,
            })?;
        log::debug!("ACPI {table} at {addr:#x}, {} bytes", bytes.len());
    }
    Ok(GuestAddress(rsdp_addr))
}

/// Decodes a byte the guest wrote to the sleep control register at [`PM_BASE_PORT`], or to the
/// high byte of PM1_CNT (the same layout): `Some(PowerOff)` for SLP_TYP = S5 with SLP_EN set
/// (`5 << 2 | 1 << 5`), `None` for anything else. Reserved bits are ignored.
pub(crate) fn decode_sleep_control(value: u8) -> Option<SleepRequest> {
    let slp_typ = (value >> SLP_TYP_SHIFT) & SLP_TYP_MASK;
    (value & SLP_EN != 0 && slp_typ == SLEEP_TYPE_S5).then_some(SleepRequest::PowerOff)
}

/// Reserves `len` bytes at the next `align`-aligned address from `*next`, inside the area.
fn place(next: &mut u64, len: usize, align: u64, table: &'static str) -> Result<u64, AcpiError> {
    let addr = next.next_multiple_of(align);
    let end = addr + len as u64;
    if end > ACPI_AREA_END {
        return Err(AcpiError::TooLarge { table, end });
    }
    *next = end;
    Ok(addr)
}

fn to_bytes(table: &dyn Aml) -> Vec<u8> {
    let mut bytes = Vec::new();
    table.to_aml_bytes(&mut bytes);
    bytes
}

/// FADT, revision 6.5, fixed hardware (not hardware-reduced; see the module comment): the PM1a
/// blocks, the SCI, the FACS and the DSDT (64-bit pointers). No SMI command port (always in ACPI
/// mode), no PM timer, no GPE blocks, no PM2 block, no reset register, no fixed buttons. The
/// PM1a blocks are given in the 32-bit fields only (ACPICA derives the X_ fields from them).
fn fadt(dsdt_addr: u64, facs_addr: u64) -> acpi_tables::fadt::FADT {
    let mut fadt = FADTBuilder::new(OEM_ID, *b"VPMUFACP", OEM_REVISION)
        .dsdt_64(dsdt_addr)
        .firmware_ctrl_64(facs_addr)
        // Power and sleep buttons, if any, would be control-method devices: no fixed buttons.
        .flag(FadtFlags::PwrButton)
        .flag(FadtFlags::SlpButton);
    fadt.sci_int = u16::from(SCI_IRQ).into();
    fadt.pm1a_evt_blk = u32::from(PM1A_EVT_PORT).into();
    fadt.pm1_evt_len = PM1_EVT_LEN;
    fadt.pm1a_cnt_blk = u32::from(PM1A_CNT_PORT).into();
    fadt.pm1_cnt_len = PM1_CNT_LEN;
    fadt.iapc_boot_arch = (IAPC_NO_VGA | IAPC_NO_MSI | IAPC_NO_ASPM | IAPC_NO_CMOS_RTC).into();
    fadt.hypervisor_vendor_identity = u64::from_le_bytes(HYPERVISOR_VENDOR_ID).into();
    fadt.finalize()
}

/// FACS alignment (ACPI 6.5, 5.2.10: 64 bytes).
const FACS_ALIGN: u64 = 64;

/// FACS, version 2: no waking vector (no S1-S4), the global lock word (free), no flags.
/// Required on a fixed-hardware platform; Linux uses it for the global lock only.
fn facs() -> FACS {
    let mut facs = FACS::new();
    facs.version = 2;
    facs
}

/// MADT, revision 5: one enabled Processor Local APIC per vCPU (ACPI processor UID = APIC id =
/// index), the I/O APIC, the SCI's interrupt source override and LINT1 as NMI on every
/// processor. Other ISA IRQs are identity-mapped to GSIs (see the module comment).
fn madt(num_cpus: u8, ioapic_addr: u32, lapic_addr: u32) -> Vec<u8> {
    let mut madt = Sdt::new(
        *b"APIC",
        HEADER_LEN + 8,
        5,
        OEM_ID,
        *b"VPMUAPIC",
        OEM_REVISION,
    );
    madt.write_u32(36, lapic_addr);
    madt.write_u32(40, MADT_PCAT_COMPAT);

    let mut entries = Vec::new();
    for id in 0..num_cpus {
        // type, length, ACPI processor UID, APIC id, flags (u32)
        entries.extend_from_slice(&[MADT_LOCAL_APIC, 8, id, id]);
        entries.extend_from_slice(&LAPIC_ENABLED.to_le_bytes());
    }
    // type, length, I/O APIC id, reserved, address (u32), GSI base (u32)
    entries.extend_from_slice(&[MADT_IO_APIC, 12, IOAPIC_ID, 0]);
    entries.extend_from_slice(&ioapic_addr.to_le_bytes());
    entries.extend_from_slice(&0u32.to_le_bytes());
    // type, length, bus, source (ISA IRQ), GSI (u32), MPS INTI flags (u16)
    entries.extend_from_slice(&[MADT_INTERRUPT_OVERRIDE, 10, ISA_BUS, SCI_IRQ]);
    entries.extend_from_slice(&u32::from(SCI_IRQ).to_le_bytes());
    entries.extend_from_slice(&SCI_INTI_FLAGS.to_le_bytes());
    // type, length, ACPI processor UID, flags (u16: 0 = conforms to the bus), LINT#
    entries.extend_from_slice(&[MADT_LOCAL_APIC_NMI, 6, ALL_PROCESSORS, 0, 0, 1]);

    madt.append_slice(&entries); // updates the length and the checksum
    madt.as_slice().to_vec()
}

/// DSDT (AML): `\_S5_`, the two UARTs and any virtio-mmio devices. `\_S5_` is all Linux needs
/// to power off: it gives SLP_TYP, the FADT gives the PM1a control register.
fn dsdt(virtio_mmio: &[VirtioMmioAcpi]) -> Vec<u8> {
    let mut body = Vec::new();

    // Name (\_S5_, Package () { SLP_TYPa, SLP_TYPb, reserved, reserved }). There is no PM1b
    // block, so only SLP_TYPa is used; the classic four-element form keeps every parser happy.
    let s5 = aml::Package::new(vec![&SLEEP_TYPE_S5, &SLEEP_TYPE_S5, &0u8, &0u8]);
    aml::Name::new("\\_S5_".into(), &s5).to_aml_bytes(&mut body);

    for (uid, (name, base, irq)) in (1u8..).zip(UARTS) {
        let hid = aml::EISAName::new("PNP0501"); // 16550A-compatible COM port
        let ports = aml::IO::new(base, base, 0, UART_PORTS);
        // consumer, edge-triggered, active-high, exclusive: an ISA IRQ
        let interrupt = aml::Interrupt::new(true, true, false, false, irq);
        let resources = aml::ResourceTemplate::new(vec![&ports, &interrupt]);
        aml::Device::new(
            format!("\\_SB_.{name}").as_str().into(),
            vec![
                &aml::Name::new("_HID".into(), &hid),
                &aml::Name::new("_UID".into(), &uid),
                &aml::Name::new("_CRS".into(), &resources),
            ],
        )
        .to_aml_bytes(&mut body);
    }

    for (uid, v) in (0u8..).zip(virtio_mmio) {
        let hid = aml::AmlString::from("LNRO0005");
        let regs = aml::Memory32Fixed::new(true, v.base, v.len);
        // consumer, edge-triggered, active-high, exclusive: an irqfd pulses the IOAPIC pin
        let interrupt = aml::Interrupt::new(true, true, false, false, v.gsi);
        let resources = aml::ResourceTemplate::new(vec![&regs, &interrupt]);
        aml::Device::new(
            format!("\\_SB_.VR{uid:02}").as_str().into(),
            vec![
                &aml::Name::new("_HID".into(), &hid),
                &aml::Name::new("_UID".into(), &uid),
                &aml::Name::new("_CRS".into(), &resources),
            ],
        )
        .to_aml_bytes(&mut body);
    }

    // Revision 2: 64-bit AML integers.
    let mut dsdt = Sdt::new(*b"DSDT", HEADER_LEN, 2, OEM_ID, *b"VPMUDSDT", OEM_REVISION);
    dsdt.append_slice(&body);
    dsdt.as_slice().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    const IOAPIC_ADDR: u32 = 0xfec0_0000;
    const LAPIC_ADDR: u32 = 0xfee0_0000;

    fn guest_memory(size: usize) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size)]).unwrap()
    }

    fn read(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
        buf
    }

    fn u16_at(b: &[u8], off: usize) -> u16 {
        u16::from_le_bytes(b[off..off + 2].try_into().unwrap())
    }

    fn u32_at(b: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
    }

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |acc, x| acc.wrapping_add(*x))
    }

    /// Reads the system description table at `addr`, checking what every table must satisfy:
    /// its signature, a length covering at least the header, a zero checksum, 8-byte
    /// alignment, and lying inside the ACPI area.
    fn table(mem: &GuestMemoryMmap, addr: u64, signature: &[u8; 4]) -> Vec<u8> {
        assert_eq!(
            addr % 8,
            0,
            "{signature:?} at {addr:#x} is not 8-byte aligned"
        );
        let header = read(mem, addr, HEADER_LEN as usize);
        assert_eq!(&header[..4], signature, "table at {addr:#x}");
        let len = u32_at(&header, 4) as usize;
        assert!(len >= HEADER_LEN as usize);
        assert!(addr >= RSDP_ADDR && addr + len as u64 <= ACPI_AREA_END);
        let bytes = read(mem, addr, len);
        assert_eq!(sum(&bytes), 0, "{signature:?} checksum");
        assert_eq!(&bytes[10..16], &OEM_ID);
        bytes
    }

    struct Tables {
        addrs: Vec<(u64, usize)>,
        fadt: Vec<u8>,
        madt: Vec<u8>,
        dsdt: Vec<u8>,
        facs: Vec<u8>,
    }

    /// Follows RSDP -> XSDT -> {FACP -> {DSDT, FACS}, APIC} in guest memory, as the guest would.
    fn parse(mem: &GuestMemoryMmap, rsdp_addr: GuestAddress) -> Tables {
        assert_eq!(rsdp_addr, GuestAddress(RSDP_ADDR));
        assert_eq!(RSDP_ADDR % 16, 0);
        let rsdp = read(mem, RSDP_ADDR, 36);
        assert_eq!(&rsdp[..8], b"RSD PTR ");
        assert_eq!(sum(&rsdp[..20]), 0, "RSDP checksum (ACPI 1.0 part)");
        assert_eq!(sum(&rsdp), 0, "RSDP extended checksum");
        assert_eq!(rsdp[15], 2, "RSDP revision");
        assert_eq!(u32_at(&rsdp, 16), 0, "no RSDT");
        assert_eq!(u32_at(&rsdp, 20), 36, "RSDP length");

        let xsdt_addr = u64_at(&rsdp, 24);
        let xsdt = table(mem, xsdt_addr, b"XSDT");
        assert_eq!(xsdt.len(), 36 + 2 * 8, "XSDT has two entries");
        let fadt_addr = u64_at(&xsdt, 36);
        let madt_addr = u64_at(&xsdt, 44);
        let fadt = table(mem, fadt_addr, b"FACP");
        let madt = table(mem, madt_addr, b"APIC");

        assert_eq!(u32_at(&fadt, 40), 0, "32-bit DSDT pointer unused");
        let dsdt_addr = u64_at(&fadt, 140);
        let dsdt = table(mem, dsdt_addr, b"DSDT");

        // The FACS has no checksum, no OEM fields and its own alignment.
        assert_eq!(u32_at(&fadt, 36), 0, "32-bit FACS pointer unused");
        let facs_addr = u64_at(&fadt, 132);
        assert_eq!(
            facs_addr % 64,
            0,
            "FACS at {facs_addr:#x} is not 64-byte aligned"
        );
        let facs = read(mem, facs_addr, 64);
        assert_eq!(&facs[..4], b"FACS");
        assert_eq!(u32_at(&facs, 4), 64, "FACS length");
        assert!(facs_addr + 64 <= ACPI_AREA_END);

        let mut addrs = vec![
            (RSDP_ADDR, rsdp.len()),
            (xsdt_addr, xsdt.len()),
            (fadt_addr, fadt.len()),
            (madt_addr, madt.len()),
            (dsdt_addr, dsdt.len()),
            (facs_addr, facs.len()),
        ];
        addrs.sort_unstable();
        for pair in addrs.windows(2) {
            assert!(
                pair[0].0 + pair[0].1 as u64 <= pair[1].0,
                "overlap: {addrs:x?}"
            );
        }
        Tables {
            addrs,
            fadt,
            madt,
            dsdt,
            facs,
        }
    }

    fn check_fadt(fadt: &[u8]) {
        assert_eq!(fadt.len(), 276, "FADT revision 6 length");
        assert_eq!(fadt[8], 6, "FADT major revision");
        let flags = u32_at(fadt, 112);
        assert_eq!(
            flags & (1 << 20),
            0,
            "not HW_REDUCED_ACPI: Linux keeps its ISA IRQs"
        );
        assert_eq!(flags & (3 << 4), 3 << 4, "no fixed power or sleep button");
        let iapc = u16_at(fadt, 109);
        assert_ne!(iapc & IAPC_NO_VGA, 0);
        assert_ne!(iapc & IAPC_NO_CMOS_RTC, 0);
        assert_eq!(iapc & (1 << 1), 0, "no 8042 claimed");
        assert_eq!(u16_at(fadt, 46), u16::from(SCI_IRQ), "SCI_INT");
        assert_eq!(u32_at(fadt, 48), 0, "no SMI_CMD: always in ACPI mode");
        // PM1a event and control blocks (32-bit fields; ACPICA fills the X_ ones), lengths.
        assert_eq!(u32_at(fadt, 56), u32::from(PM1A_EVT_PORT));
        assert_eq!(u32_at(fadt, 64), u32::from(PM1A_CNT_PORT));
        assert_eq!((fadt[88], fadt[89]), (4, 2), "PM1_EVT_LEN, PM1_CNT_LEN");
        // No PM1b blocks, PM2, PM timer, GPE blocks (60..64, 68..88, 90..94), no X_ blocks
        // (148..244), no hardware-reduced sleep registers (244..268).
        assert!(fadt[60..64].iter().all(|&b| b == 0));
        assert!(fadt[68..88].iter().all(|&b| b == 0));
        assert!(fadt[90..94].iter().all(|&b| b == 0));
        assert!(fadt[148..268].iter().all(|&b| b == 0));
        assert_eq!(&fadt[268..276], &HYPERVISOR_VENDOR_ID);
    }

    fn check_facs(facs: &[u8]) {
        assert_eq!(facs[32], 2, "FACS version");
        assert_eq!(u32_at(facs, 12), 0, "no firmware waking vector");
        assert_eq!(u64_at(facs, 24), 0, "no 64-bit waking vector");
        assert_eq!(u32_at(facs, 16), 0, "global lock free");
    }

    fn check_madt(madt: &[u8], num_cpus: u8) {
        assert_eq!(u32_at(madt, 36), LAPIC_ADDR);
        assert_eq!(u32_at(madt, 40), MADT_PCAT_COMPAT);
        let (mut lapics, mut ioapics, mut nmis) = (Vec::new(), Vec::new(), Vec::new());
        let mut overrides = Vec::new();
        let mut off = 44;
        while off < madt.len() {
            let (kind, len) = (madt[off], madt[off + 1] as usize);
            assert!(
                len >= 2 && off + len <= madt.len(),
                "bad MADT entry at {off}"
            );
            let e = &madt[off..off + len];
            match kind {
                0 => {
                    assert_eq!(len, 8);
                    lapics.push((e[2], e[3], u32_at(e, 4)));
                }
                1 => {
                    assert_eq!(len, 12);
                    ioapics.push((e[2], u32_at(e, 4), u32_at(e, 8)));
                }
                2 => {
                    assert_eq!(len, 10);
                    overrides.push((e[2], e[3], u32_at(e, 4), u16_at(e, 8)));
                }
                4 => {
                    assert_eq!(len, 6);
                    nmis.push((e[2], u16_at(e, 3), e[5]));
                }
                other => panic!("unexpected MADT entry type {other}"),
            }
            off += len;
        }
        assert_eq!(off, madt.len());
        let expected: Vec<_> = (0..num_cpus).map(|i| (i, i, LAPIC_ENABLED)).collect();
        assert_eq!(
            lapics, expected,
            "one enabled local APIC per vCPU, UID = APIC id"
        );
        assert_eq!(ioapics, vec![(IOAPIC_ID, IOAPIC_ADDR, 0)]);
        assert_eq!(nmis, vec![(0xff, 0, 1)], "LINT1 is NMI on all processors");
        // Only the SCI's: ISA IRQ 9 -> GSI 9, active high (01), level (11 << 2).
        assert_eq!(
            overrides,
            vec![(0, 9, 9, 0b1101)],
            "interrupt source overrides"
        );
    }

    fn check_dsdt(dsdt: &[u8]) {
        assert_eq!(dsdt[8], 2, "DSDT revision (64-bit AML integers)");
        let aml = &dsdt[36..];
        // NameOp '\' "_S5_" PackageOp PkgLength(1 byte) NumElements=4, then BytePrefix 5 twice.
        let s5 = aml
            .windows(5)
            .position(|w| w == b"\\_S5_")
            .expect("no \\_S5_ in the DSDT");
        assert_eq!(aml[s5 - 1], 0x08, "\\_S5_ is a Name");
        assert_eq!(aml[s5 + 5], 0x12, "\\_S5_ is a Package");
        assert_eq!(aml[s5 + 7], 4, "four elements");
        assert_eq!(
            &aml[s5 + 8..s5 + 12],
            &[0x0a, SLEEP_TYPE_S5, 0x0a, SLEEP_TYPE_S5]
        );
        // EisaId("PNP0501") as a DWordConst, twice; the two I/O descriptors.
        let hid = [0x0c, 0x41, 0xd0, 0x05, 0x01];
        assert_eq!(aml.windows(5).filter(|w| *w == hid).count(), 2);
        for base in [0x3f8u16, 0x2f8] {
            let [lo, hi] = base.to_le_bytes();
            let io = [0x47, 0x01, lo, hi, lo, hi, 0, 8];
            assert!(
                aml.windows(8).any(|w| w == io),
                "no IO descriptor for {base:#x}"
            );
        }
    }

    #[test]
    fn virtio_mmio_devices_are_described_in_the_dsdt() {
        let mem = guest_memory(256 << 20);
        let dev = VirtioMmioAcpi {
            base: 0xd000_0000,
            len: 0x1000,
            gsi: 5,
        };
        let rsdp = create_acpi_tables_with(&mem, 1, IOAPIC_ADDR, LAPIC_ADDR, &[dev]).unwrap();
        let t = parse(&mem, rsdp);
        check_dsdt(&t.dsdt);
        let aml = &t.dsdt[36..];
        assert!(aml.windows(8).any(|w| w == b"LNRO0005"), "no LNRO0005 _HID");
        assert!(aml.windows(4).any(|w| w == b"VR00"), "no device VR00");
        // Memory32Fixed: tag 0x86, length 9, read-write, base, length.
        let mut mem32 = vec![0x86, 0x09, 0x00, 0x01];
        mem32.extend_from_slice(&0xd000_0000u32.to_le_bytes());
        mem32.extend_from_slice(&0x1000u32.to_le_bytes());
        assert!(
            aml.windows(mem32.len()).any(|w| w == mem32),
            "no register block"
        );
        // Extended Interrupt: tag 0x89, length 6, flags (consumer, edge), 1 interrupt, GSI 5.
        let irq = [0x89, 0x06, 0x00, 0x03, 0x01, 5, 0, 0, 0];
        assert!(
            aml.windows(irq.len()).any(|w| w == irq),
            "no GSI 5 interrupt"
        );
        let plain = create_acpi_tables(&mem, 1, IOAPIC_ADDR, LAPIC_ADDR).unwrap();
        let plain = parse(&mem, plain);
        assert!(!plain.dsdt.windows(8).any(|w| w == b"LNRO0005"));
    }

    #[test]
    fn tables_parse_back_for_1_2_and_8_cpus() {
        for num_cpus in [1u8, 2, 8] {
            let mem = guest_memory(256 << 20);
            let rsdp = create_acpi_tables(&mem, num_cpus, IOAPIC_ADDR, LAPIC_ADDR).unwrap();
            let t = parse(&mem, rsdp);
            check_fadt(&t.fadt);
            check_madt(&t.madt, num_cpus);
            check_dsdt(&t.dsdt);
            assert_eq!(t.madt.len(), 44 + 8 * num_cpus as usize + 12 + 10 + 6);
            check_facs(&t.facs);
            let (last, len) = *t.addrs.last().unwrap();
            assert!(last + len as u64 <= ACPI_AREA_END);
        }
    }

    #[test]
    fn layout_for_two_cpus() {
        let mem = guest_memory(256 << 20);
        let t = parse(
            &mem,
            create_acpi_tables(&mem, 2, IOAPIC_ADDR, LAPIC_ADDR).unwrap(),
        );
        let dsdt_len = t.dsdt.len();
        assert_eq!(
            t.addrs,
            vec![
                (0xe0000, 36),
                (0xe0028, 52),
                (0xe0060, 276),
                (0xe0178, 88),
                (0xe01d0, dsdt_len),
                ((0xe01d0 + dsdt_len as u64).next_multiple_of(64), 64)
            ]
        );
    }

    #[test]
    fn every_u8_cpu_count_fits() {
        let mem = guest_memory(1 << 20);
        let t = parse(
            &mem,
            create_acpi_tables(&mem, 255, IOAPIC_ADDR, LAPIC_ADDR).unwrap(),
        );
        check_madt(&t.madt, 255);
    }

    #[test]
    fn rejects_zero_cpus() {
        let mem = guest_memory(1 << 20);
        let err = create_acpi_tables(&mem, 0, IOAPIC_ADDR, LAPIC_ADDR).unwrap_err();
        assert!(matches!(err, AcpiError::NoCpus), "{err}");
    }

    #[test]
    fn reports_memory_without_the_bios_area() {
        let mem = guest_memory(0x8_0000); // 512 KiB: ends below the ACPI area
        let err = create_acpi_tables(&mem, 1, IOAPIC_ADDR, LAPIC_ADDR).unwrap_err();
        assert!(
            matches!(
                err,
                AcpiError::GuestMemory {
                    table: "RSDP",
                    addr: RSDP_ADDR,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn placement_stays_inside_the_area() {
        let mut next = 0xe0024;
        assert_eq!(place(&mut next, 16, 8, "T").unwrap(), 0xe0028);
        assert_eq!(next, 0xe0038);
        let mut next = RSDP_ADDR;
        let full = (ACPI_AREA_END - RSDP_ADDR) as usize;
        assert_eq!(place(&mut next, full, 16, "T").unwrap(), RSDP_ADDR);
        let err = place(&mut next, 1, 8, "DSDT").unwrap_err();
        assert!(
            matches!(err, AcpiError::TooLarge { table: "DSDT", end } if end == ACPI_AREA_END + 1),
            "{err}"
        );
    }

    #[test]
    fn only_s5_with_slp_en_powers_off() {
        let linux_s5 = SLEEP_TYPE_S5 << 2 | 1 << 5;
        assert_eq!(linux_s5, 0x34);
        assert_eq!(decode_sleep_control(linux_s5), Some(SleepRequest::PowerOff));
        // Reserved bits (0, 1, 6, 7) do not matter; SLP_TYP must be 5 and SLP_EN set.
        for value in 0..=u8::MAX {
            let expected = (value & 0x3c == 0x34).then_some(SleepRequest::PowerOff);
            assert_eq!(decode_sleep_control(value), expected, "{value:#04x}");
        }
        assert_eq!(decode_sleep_control(SLEEP_TYPE_S5 << 2), None, "no SLP_EN");
        assert_eq!(decode_sleep_control(1 << 5), None, "S0 with SLP_EN");
        assert_eq!(decode_sleep_control(0x80), None, "WAK_STS clear");
    }
}
