//! Devices and the buses that route a guest access to them: port I/O here, MMIO in
//! [`mmio_bus`]. All device emulation for a vCPU's exits runs on that vCPU's thread (so
//! domain-switch accounting charges it to the guest), and so does periodic device work ([`Tick`]).

pub mod acpi_shutdown;
pub mod delay;
pub mod i8042;
pub mod mmio_bus;
pub mod packet_gate;
pub mod serial;
pub mod virtio;
pub mod vpmu_control;

use std::sync::{Arc, Mutex};

/// Something a device asks the VMM to do after a guest access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEvent {
    /// The guest asked for a reset (i8042 0xFE, `reboot=k`).
    Reset,
    /// The guest asked to power off (ACPI S5).
    PowerOff,
}

/// A device with periodic work (generating traffic), run by a vCPU thread when it falls due.
pub trait Tick: Send {
    fn tick(&mut self, now: std::time::Instant);
}

/// The result of a port write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PioWrite {
    Done,
    /// The device asks the VMM to act.
    Event(DeviceEvent),
    /// No device at that port: the write is dropped.
    Unclaimed,
}

/// A device on the port-I/O bus; `offset` is relative to the device's base port.
pub trait PioDevice: Send {
    fn read(&mut self, offset: u16, data: &mut [u8]);
    fn write(&mut self, offset: u16, data: &[u8]) -> Option<DeviceEvent>;
}

struct Range {
    base: u16,
    len: u16,
    dev: Arc<Mutex<dyn PioDevice>>,
}

/// Routes port accesses to devices. Ports nobody claims read as all ones and ignore writes,
/// as on a PC with nothing at that address.
#[derive(Default, Clone)]
pub struct PioBus {
    ranges: Arc<Vec<Range>>,
}

impl PioBus {
    pub fn builder() -> PioBusBuilder {
        PioBusBuilder::default()
    }

    fn find(&self, port: u16) -> Option<&Range> {
        self.ranges
            .iter()
            .find(|r| port >= r.base && port - r.base < r.len)
    }

    /// Returns false when no device claims the port.
    pub fn read(&self, port: u16, data: &mut [u8]) -> bool {
        match self.find(port) {
            Some(r) => {
                r.dev.lock().unwrap().read(port - r.base, data);
                true
            }
            None => {
                data.fill(0xff);
                false
            }
        }
    }

    pub fn write(&self, port: u16, data: &[u8]) -> PioWrite {
        match self.find(port) {
            Some(r) => match r.dev.lock().unwrap().write(port - r.base, data) {
                Some(e) => PioWrite::Event(e),
                None => PioWrite::Done,
            },
            None => PioWrite::Unclaimed,
        }
    }
}

#[derive(Default)]
pub struct PioBusBuilder {
    ranges: Vec<Range>,
}

impl PioBusBuilder {
    /// Adds a device at `base..base+len`; panics on overlap (a programming error).
    pub fn add(mut self, base: u16, len: u16, dev: Arc<Mutex<dyn PioDevice>>) -> Self {
        let overlaps = self
            .ranges
            .iter()
            .any(|r| base < r.base + r.len && r.base < base + len);
        assert!(
            !overlaps,
            "port range {base:#x}+{len} overlaps another device"
        );
        self.ranges.push(Range { base, len, dev });
        self
    }

    pub fn build(self) -> PioBus {
        PioBus {
            ranges: Arc::new(self.ranges),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder(Vec<(u16, u8)>);
    impl PioDevice for Recorder {
        fn read(&mut self, offset: u16, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u16, data: &[u8]) -> Option<DeviceEvent> {
            self.0.push((offset, data[0]));
            (data[0] == 0xfe).then_some(DeviceEvent::Reset)
        }
    }

    #[test]
    fn routes_by_port_and_offset() {
        let dev = Arc::new(Mutex::new(Recorder::default()));
        let bus = PioBus::builder().add(0x3f8, 8, dev.clone()).build();
        let mut b = [0u8; 1];
        assert!(bus.read(0x3fa, &mut b));
        assert_eq!(b[0], 2);
        assert!(!bus.read(0x400, &mut b));
        assert_eq!(b[0], 0xff);
        assert_eq!(bus.write(0x3f8, &[7]), PioWrite::Done);
        assert_eq!(
            bus.write(0x3ff, &[0xfe]),
            PioWrite::Event(DeviceEvent::Reset)
        );
        assert_eq!(bus.write(0x3f7, &[1]), PioWrite::Unclaimed);
        assert_eq!(dev.lock().unwrap().0, vec![(0, 7), (7, 0xfe)]);
    }

    #[test]
    #[should_panic(expected = "overlaps")]
    fn overlapping_devices_are_refused() {
        let a = Arc::new(Mutex::new(Recorder::default()));
        let _ = PioBus::builder().add(0x60, 8, a.clone()).add(0x64, 1, a);
    }
}
