//! The ACPI hardware-reduced sleep control register (FADT SLEEP_CONTROL_REG), at the port the
//! ACPI tables name: the guest writes SLP_TYP(S5)<<2 | SLP_EN to power off.

use super::{DeviceEvent, PioDevice};
use crate::boot::acpi;

#[derive(Default)]
pub struct AcpiShutdown;

impl PioDevice for AcpiShutdown {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<DeviceEvent> {
        match (offset, data.first()) {
            (0, Some(&v)) => acpi::decode_sleep_control(v).map(|_| DeviceEvent::PowerOff),
            _ => None,
        }
    }
}
