//! PLACEHOLDER until the ACPI module lands: same API, writes nothing useful.
use vm_memory::{GuestAddress, GuestMemoryMmap};
pub const RSDP_ADDR: u64 = 0x000E_0000;
pub const SHUTDOWN_PORT: u16 = 0x600;
#[derive(Debug, thiserror::Error)]
pub enum AcpiError {
    #[error("acpi")]
    Placeholder,
}
#[derive(Debug, PartialEq, Eq)]
pub enum SleepRequest {
    PowerOff,
}
pub fn create_acpi_tables(
    _mem: &GuestMemoryMmap,
    _n: u8,
    _io: u32,
    _l: u32,
) -> Result<GuestAddress, AcpiError> {
    Ok(GuestAddress(RSDP_ADDR))
}
pub fn decode_sleep_control(v: u8) -> Option<SleepRequest> {
    (v == (5 << 2 | 1 << 5)).then_some(SleepRequest::PowerOff)
}
