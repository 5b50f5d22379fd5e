//! Guest physical memory layout used by the direct (64-bit boot protocol) kernel boot.
//!
//! ```text
//! 0x0000_0500  GDT                      0x0000_7000  zero page (boot_params), or the Multiboot
//!                                                     information page (Multiboot kernels)
//! 0x0000_8ff0  boot stack (grows down)  0x0000_9000  PML4, 0xa000 PDPT, 0xb000-0xefff PDs (4 GiB identity map)
//! 0x0002_0000  kernel command line      0x0002_1000  Multiboot module (the environment, <= 64 KiB)
//! 0x0009_fc00  end of low RAM (EBDA above)
//! 0x000e_0000  ACPI tables (RSDP first) 0x0010_0000  high RAM starts; the kernel loads where its ELF says
//! top of RAM   initramfs, page-aligned, as high as the kernel allows
//! 0xd000_0000  virtio-net MMIO registers (4 KiB, `--net` only; described in the DSDT)
//! 0xd000_1000  virtio-blk MMIO registers, 4 KiB per `--disk`, in order (described in the DSDT)
//! 0xfec0_0000  IOAPIC                   0xfee0_0000  local APIC
//! ```

pub(crate) const GDT_ADDR: u64 = 0x500;
pub(crate) const ZERO_PAGE_ADDR: u64 = 0x7000;
pub(crate) const BOOT_STACK_POINTER: u64 = 0x8ff0;
pub(crate) const PML4_ADDR: u64 = 0x9000;
pub(crate) const PDPT_ADDR: u64 = 0xa000;
/// Four page directories (0xb000-0xefff): 2 MiB pages identity-mapping the first 4 GiB, so
/// the LAPIC/IOAPIC MMIO pages are reachable before the guest builds its own tables.
pub(crate) const PD_ADDR: u64 = 0xb000;
pub(crate) const IDENTITY_MAP_GIB: u64 = 4;
pub(crate) const CMDLINE_ADDR: u64 = 0x20000;
pub(crate) const CMDLINE_MAX_SIZE: usize = 4096;
/// A Multiboot kernel has no zero page: its information block, module list, memory map and
/// loader name take that page instead.
pub(crate) const MULTIBOOT_INFO_ADDR: u64 = ZERO_PAGE_ADDR;
/// The Multiboot module (page-aligned, right after the command line's 4 KiB).
pub const MULTIBOOT_MODULE_ADDR: u64 = CMDLINE_ADDR + CMDLINE_MAX_SIZE as u64;
pub(crate) const MULTIBOOT_MODULE_MAX: usize = 0x1_0000;
pub(crate) const EBDA_START: u64 = 0x9fc00;
pub(crate) const HIMEM_START: u64 = 0x100000;
/// KVM needs three pages for the TSS somewhere the guest does not use (below 4 GiB).
pub(crate) const KVM_TSS_ADDR: u64 = 0xfffb_d000;
pub(crate) const IOAPIC_ADDR: u32 = 0xfec0_0000;
pub(crate) const LAPIC_ADDR: u32 = 0xfee0_0000;
/// The virtio-mmio network card's register block (in the MMIO hole).
pub(crate) const VIRTIO_NET_MMIO_BASE: u64 = 0xd000_0000;
/// The first virtio-mmio block device's register block; disk `i` is at `+ i * 4 KiB`.
pub(crate) const VIRTIO_BLK_MMIO_BASE: u64 = 0xd000_1000;
/// Guest RAM must stay below the 32-bit MMIO hole.
pub(crate) const MMIO_HOLE_START: u64 = 0xc000_0000;
