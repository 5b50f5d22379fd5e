//! The part of the i8042 keyboard controller Linux uses to reset the machine (`reboot=k`):
//! command 0xFE written to port 0x64. Status reads say "input buffer empty".

use super::{DeviceEvent, PioDevice};

pub const I8042_BASE: u16 = 0x60;
pub const I8042_LEN: u16 = 5;
const CMD_RESET_CPU: u8 = 0xfe;

#[derive(Default)]
pub struct I8042;

impl PioDevice for I8042 {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> Option<DeviceEvent> {
        (offset == 4 && data.first() == Some(&CMD_RESET_CPU)).then_some(DeviceEvent::Reset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_reset_command_resets() {
        let mut d = I8042;
        assert_eq!(d.write(4, &[0xfe]), Some(DeviceEvent::Reset));
        assert_eq!(d.write(4, &[0xad]), None);
        assert_eq!(d.write(0, &[0xfe]), None);
        let mut b = [0xffu8];
        d.read(4, &mut b);
        assert_eq!(b[0], 0);
    }
}
