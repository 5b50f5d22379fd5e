//! Tiny purpose-built guests for fast tests on real /dev/kvm. Each is a flat binary assembled
//! from `asm/NAME.S` at build time, entered at its load address either in real mode (CS base 0)
//! or in 64-bit long mode (the VMM's identity-mapped first GiB). They talk over COM1 (0x3f8)
//! and COM2 (0x2f8) and end by asking the i8042 for a reset (port 0x64, 0xFE) or by the ACPI
//! sleep register (port 0x600), so a clean run exits 0. `multiboot32` is an ELF32 Multiboot
//! kernel instead, booted through `--kernel`; it ends through the isa-debug-exit port (0xf4).

/// One assembled tiny guest.
#[derive(Debug, Clone, Copy)]
pub struct TinyGuest {
    pub name: &'static str,
    pub image: &'static [u8],
    /// Where the image is linked and must be loaded; also its entry point.
    pub load_addr: u64,
    /// Entered in 64-bit long mode (else real mode).
    pub long_mode: bool,
    /// An ELF32 Multiboot kernel, not a flat binary: write `image` to a file and boot it with
    /// `--kernel` (entered in 32-bit protected mode by the VMM's Multiboot loader).
    pub multiboot: bool,
}

include!(concat!(env!("OUT_DIR"), "/guests.rs"));
