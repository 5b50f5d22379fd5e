//! The ACPI power-management registers the FADT names (boot/acpi.rs), from
//! [`acpi::PM_BASE_PORT`]: a fixed-hardware platform's PM1a event block (PM1_STS, PM1_EN) and
//! PM1a control block (PM1_CNT), plus, at the base, a one-byte sleep control register in the
//! hardware-reduced layout that the VMM's tiny test guests write to power off.
//!
//! Power-off is SLP_TYP(S5) | SLP_EN in PM1_CNT (Linux writes SLP_TYP first, then both) or in
//! the sleep control byte. No fixed event ever happens (no PM timer, no buttons, no SCI), so
//! PM1_STS reads 0; PM1_EN keeps what the guest writes (ACPICA checks that its global lock
//! enable bit sticks); PM1_CNT reads SCI_EN set (the platform is always in ACPI mode).

use super::{DeviceEvent, PioDevice};
use crate::boot::acpi;

/// Register offsets from [`acpi::PM_BASE_PORT`].
const SLEEP_CONTROL: u16 = 0;
const PM1_STS: u16 = acpi::PM1A_EVT_PORT - acpi::PM_BASE_PORT;
const PM1_EN: u16 = PM1_STS + 2;
const PM1_CNT: u16 = acpi::PM1A_CNT_PORT - acpi::PM_BASE_PORT;

/// PM1_CNT bits: SCI_EN (read-only here: always set), SLP_EN (write-only: reads 0).
const SCI_EN: u16 = 1;
const SLP_EN: u16 = 1 << 13;

#[derive(Debug, Default)]
pub struct AcpiPm {
    pm1_en: u16,
    pm1_cnt: u16,
}

impl AcpiPm {
    /// The byte at `offset`, as the guest reads it.
    fn read_byte(&self, offset: u16) -> u8 {
        let (reg, at) = match offset {
            o if (PM1_EN..PM1_EN + 2).contains(&o) => (self.pm1_en, o - PM1_EN),
            o if (PM1_CNT..PM1_CNT + 2).contains(&o) => {
                ((self.pm1_cnt & !SLP_EN) | SCI_EN, o - PM1_CNT)
            }
            _ => return 0, // the sleep control/status bytes, PM1_STS, the gap
        };
        reg.to_le_bytes()[usize::from(at)]
    }

    fn write_byte(&mut self, offset: u16, value: u8) -> Option<DeviceEvent> {
        let set = |reg: &mut u16, at: u16| {
            let mut bytes = reg.to_le_bytes();
            bytes[usize::from(at)] = value;
            *reg = u16::from_le_bytes(bytes);
        };
        match offset {
            SLEEP_CONTROL => return power_off(value),
            o if (PM1_EN..PM1_EN + 2).contains(&o) => set(&mut self.pm1_en, o - PM1_EN),
            o if o == PM1_CNT => set(&mut self.pm1_cnt, 0),
            // PM1_CNT's high byte has the sleep control register's layout.
            o if o == PM1_CNT + 1 => {
                set(&mut self.pm1_cnt, 1);
                return power_off(value);
            }
            _ => {} // PM1_STS is write-1-to-clear and nothing is ever set; the rest is reserved
        }
        None
    }
}

fn power_off(sleep_control: u8) -> Option<DeviceEvent> {
    acpi::decode_sleep_control(sleep_control).map(|_| DeviceEvent::PowerOff)
}

impl PioDevice for AcpiPm {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        for (o, b) in (offset..).zip(data.iter_mut()) {
            *b = self.read_byte(o);
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<DeviceEvent> {
        let mut event = None;
        for (o, &b) in (offset..).zip(data) {
            event = event.or(self.write_byte(o, b));
        }
        event
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read16(pm: &mut AcpiPm, port: u16) -> u16 {
        let mut b = [0u8; 2];
        pm.read(port - acpi::PM_BASE_PORT, &mut b);
        u16::from_le_bytes(b)
    }

    fn write16(pm: &mut AcpiPm, port: u16, v: u16) -> Option<DeviceEvent> {
        pm.write(port - acpi::PM_BASE_PORT, &v.to_le_bytes())
    }

    #[test]
    fn linux_s5_through_pm1_cnt_powers_off_on_the_second_write() {
        let mut pm = AcpiPm::default();
        let cnt = read16(&mut pm, acpi::PM1A_CNT_PORT);
        assert_eq!(cnt, SCI_EN, "always in ACPI mode");
        // acpi_hw_legacy_sleep: SLP_TYP first, then SLP_TYP | SLP_EN.
        let typ = cnt | u16::from(acpi::SLEEP_TYPE_S5) << 10;
        assert_eq!(write16(&mut pm, acpi::PM1A_CNT_PORT, typ), None);
        assert_eq!(read16(&mut pm, acpi::PM1A_CNT_PORT), typ);
        assert_eq!(
            write16(&mut pm, acpi::PM1A_CNT_PORT, typ | SLP_EN),
            Some(DeviceEvent::PowerOff)
        );
        assert_eq!(
            read16(&mut pm, acpi::PM1A_CNT_PORT) & SLP_EN,
            0,
            "SLP_EN is write-only"
        );
    }

    #[test]
    fn other_sleep_states_and_byte_writes() {
        let mut pm = AcpiPm::default();
        for typ in [0u16, 1, 3, 4, 6, 7] {
            let v = SCI_EN | typ << 10 | SLP_EN;
            assert_eq!(
                write16(&mut pm, acpi::PM1A_CNT_PORT, v),
                None,
                "SLP_TYP {typ}"
            );
        }
        // The high byte alone, as an 8-bit access.
        let off = acpi::PM1A_CNT_PORT + 1 - acpi::PM_BASE_PORT;
        assert_eq!(pm.write(off, &[0x34]), Some(DeviceEvent::PowerOff));
        // The tiny guests' sleep control byte.
        assert_eq!(
            pm.write(SLEEP_CONTROL, &[0x34]),
            Some(DeviceEvent::PowerOff)
        );
        assert_eq!(pm.write(SLEEP_CONTROL, &[0x14]), None, "no SLP_EN");
    }

    #[test]
    fn pm1_en_keeps_what_is_written_and_pm1_sts_reads_zero() {
        let mut pm = AcpiPm::default();
        let gbl_en = 1 << 5;
        assert_eq!(write16(&mut pm, acpi::PM1A_EVT_PORT + 2, gbl_en), None);
        assert_eq!(read16(&mut pm, acpi::PM1A_EVT_PORT + 2), gbl_en);
        assert_eq!(write16(&mut pm, acpi::PM1A_EVT_PORT, 0xffff), None);
        assert_eq!(read16(&mut pm, acpi::PM1A_EVT_PORT), 0);
        // A 4-byte access over the whole event block.
        let mut b = [0xaa; 4];
        pm.read(PM1_STS, &mut b);
        assert_eq!(b, [0, 0, gbl_en as u8, 0]);
        assert_eq!(acpi::PM_PORTS, PM1_CNT + 2);
    }
}
