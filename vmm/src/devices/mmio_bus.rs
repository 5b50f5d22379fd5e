//! The MMIO bus: guest-physical address ranges (outside RAM) routed to devices. Addresses
//! nobody claims read as all ones and ignore writes. With no devices (no `--net`) a lookup is
//! one check of an empty list.

use std::sync::{Arc, Mutex};

/// A device on the MMIO bus; `offset` is relative to the device's base address.
pub trait MmioDevice: Send {
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}

struct Range {
    base: u64,
    len: u64,
    dev: Arc<Mutex<dyn MmioDevice>>,
}

#[derive(Default, Clone)]
pub struct MmioBus {
    ranges: Arc<Vec<Range>>,
}

impl MmioBus {
    pub fn builder() -> MmioBusBuilder {
        MmioBusBuilder::default()
    }

    fn find(&self, addr: u64) -> Option<&Range> {
        self.ranges
            .iter()
            .find(|r| addr >= r.base && addr - r.base < r.len)
    }

    /// Returns false when no device claims the address (`data` is then all ones).
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr) {
            Some(r) => {
                r.dev.lock().unwrap().read(addr - r.base, data);
                true
            }
            None => {
                data.fill(0xff);
                false
            }
        }
    }

    /// Returns false when no device claims the address (the write is dropped).
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr) {
            Some(r) => {
                r.dev.lock().unwrap().write(addr - r.base, data);
                true
            }
            None => false,
        }
    }
}

#[derive(Default)]
pub struct MmioBusBuilder {
    ranges: Vec<Range>,
}

impl MmioBusBuilder {
    /// Adds a device at `base..base+len`; panics on overlap (a programming error).
    pub fn add(mut self, base: u64, len: u64, dev: Arc<Mutex<dyn MmioDevice>>) -> Self {
        let overlaps = self
            .ranges
            .iter()
            .any(|r| base < r.base + r.len && r.base < base + len);
        assert!(
            !overlaps,
            "MMIO range {base:#x}+{len:#x} overlaps another device"
        );
        self.ranges.push(Range { base, len, dev });
        self
    }

    pub fn build(self) -> MmioBus {
        MmioBus {
            ranges: Arc::new(self.ranges),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder(Vec<(u64, Vec<u8>)>);
    impl MmioDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn routes_by_address_and_offset() {
        let dev = Arc::new(Mutex::new(Recorder::default()));
        let bus = MmioBus::builder()
            .add(0xd000_0000, 0x1000, dev.clone())
            .build();
        let mut b = [0u8; 4];
        assert!(bus.read(0xd000_0070, &mut b));
        assert_eq!(b, [0x70; 4]);
        assert!(!bus.read(0xd000_1000, &mut b));
        assert_eq!(b, [0xff; 4]);
        assert!(bus.write(0xd000_0fff, &[1]));
        assert!(!bus.write(0xcfff_ffff, &[2]));
        assert_eq!(dev.lock().unwrap().0, vec![(0xfff, vec![1])]);
    }

    #[test]
    #[should_panic(expected = "overlaps")]
    fn overlapping_devices_are_refused() {
        let a = Arc::new(Mutex::new(Recorder::default()));
        let _ = MmioBus::builder()
            .add(0x1000, 0x1000, a.clone())
            .add(0x1800, 0x10, a);
    }
}
