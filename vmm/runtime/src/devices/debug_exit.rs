//! QEMU's `isa-debug-exit` device as kvm-unit-tests uses it (`-device
//! isa-debug-exit,iobase=0xf4,iosize=4`): a write of any width to port [`DEBUG_EXIT_PORT`] ends
//! the run and records the value written. QEMU exits with status `(value << 1) | 1`
//! (`end::qemu_status`); this VMM
//! keeps its own exit codes (`end::code::DEBUG_EXIT_ZERO` / `DEBUG_EXIT_NONZERO`) and puts the
//! value, and the status QEMU would have given, in the run's report. Reads return all ones (QEMU's
//! device has no read side).

use super::{DeviceEvent, PioDevice};

pub(crate) const DEBUG_EXIT_PORT: u16 = 0xf4;
/// `iosize=4`: ports 0xf4-0xf7.
pub(crate) const DEBUG_EXIT_LEN: u16 = 4;

#[derive(Default)]
pub(crate) struct DebugExit;

/// The value a write carries (little-endian, 1, 2 or 4 bytes; more are cut to 4).
pub(crate) fn value(data: &[u8]) -> u32 {
    let mut v = [0u8; 4];
    let n = data.len().min(4);
    v[..n].copy_from_slice(&data[..n]);
    u32::from_le_bytes(v)
}

impl PioDevice for DebugExit {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&mut self, _offset: u16, data: &[u8]) -> Option<DeviceEvent> {
        Some(DeviceEvent::DebugExit(value(data)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_write_ends_the_run_with_its_value() {
        let mut d = DebugExit;
        assert_eq!(d.write(0, &[1]), Some(DeviceEvent::DebugExit(1)));
        assert_eq!(
            d.write(0, &[0x34, 0x12, 0, 0]),
            Some(DeviceEvent::DebugExit(0x1234))
        );
        assert_eq!(d.write(2, &[0, 1]), Some(DeviceEvent::DebugExit(0x100)));
        assert_eq!(d.write(0, &[]), Some(DeviceEvent::DebugExit(0)));
        assert_eq!(value(&[1, 2, 3, 4, 5, 6]), 0x0403_0201);
        let mut r = [0u8; 4];
        d.read(0, &mut r);
        assert_eq!(r, [0xff; 4]);
    }
}
