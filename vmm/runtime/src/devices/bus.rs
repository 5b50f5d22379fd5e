//! One bus type for both address spaces a guest reaches devices through: port I/O ([`PioBus`],
//! 16-bit ports) and MMIO ([`MmioBus`], guest-physical addresses outside RAM). A [`Bus`] is a
//! fixed list of address ranges, each routed to one device behind its own lock; it is built once
//! before the vCPUs start ([`BusBuilder`]: an overlap is a [`BusError`], not a panic) and then
//! shared by every vCPU thread (cloning a bus clones one `Arc`). Addresses nobody claims read as
//! all ones and ignore writes, as on a PC with nothing there; the callers count them.
//!
//! Device locks are taken with [`lock_device`]: a vCPU thread that panics while emulating a
//! device (a VMM bug, which ends the run with exit code 8) does not make the other vCPU threads
//! panic in turn on the poisoned lock.

use std::fmt;
use std::ops::Sub;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{DeviceEvent, MmioDevice, PioDevice};

/// An address on a bus: a port (`u16`) or a guest-physical address (`u64`).
pub trait BusAddress: Copy + Into<u64> + Sub<Output = Self> + fmt::Debug {
    /// The address space's name, for errors.
    const SPACE: &'static str;
    /// One past the highest address a device range may cover (for MMIO, `u64::MAX`: the very
    /// last byte of the address space is never a device's).
    const END: u64;
}

impl BusAddress for u16 {
    const SPACE: &'static str = "port";
    const END: u64 = 1 << 16;
}

impl BusAddress for u64 {
    const SPACE: &'static str = "MMIO";
    const END: u64 = u64::MAX;
}

/// Why a device cannot go on a bus (a VMM programming error, reported at build time).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    #[error(
        "{space} range {base:#x}+{len:#x} overlaps the device at {other_base:#x}+{other_len:#x}"
    )]
    Overlap {
        space: &'static str,
        base: u64,
        len: u64,
        other_base: u64,
        other_len: u64,
    },
    #[error("{space} range {base:#x}+{len:#x} is empty or runs past the end of the address space")]
    BadRange {
        space: &'static str,
        base: u64,
        len: u64,
    },
}

/// Locks a device for one access.
///
/// A device lock is poisoned only when a thread panicked while holding it: a VMM bug on a vCPU
/// thread, whose panic already ends the run (`VcpuRunner::run_catching_panics`, exit code 8).
/// The other vCPU threads must still see that end, stop and report their state, so they take
/// the lock as it is instead of panicking too. The device may be half-updated, but the run is
/// ending and nothing relies on it afterwards except the end-of-run report, which only reads it.
pub fn lock_device<D: ?Sized>(dev: &Mutex<D>) -> MutexGuard<'_, D> {
    dev.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Slot<A, D: ?Sized> {
    base: A,
    len: u64,
    dev: Arc<Mutex<D>>,
}

impl<A: BusAddress, D: ?Sized> Slot<A, D> {
    fn start(&self) -> u64 {
        self.base.into()
    }

    fn contains(&self, addr: A) -> bool {
        let a: u64 = addr.into();
        a >= self.start() && a - self.start() < self.len
    }
}

/// Address ranges of one address space (`A`) routed to devices (`D`, a device trait object).
pub struct Bus<A, D: ?Sized> {
    slots: Arc<[Slot<A, D>]>,
}

impl<A, D: ?Sized> Clone for Bus<A, D> {
    fn clone(&self) -> Self {
        Bus {
            slots: self.slots.clone(),
        }
    }
}

impl<A, D: ?Sized> Default for Bus<A, D> {
    /// A bus with nothing on it: a lookup is one check of an empty list.
    fn default() -> Self {
        Bus {
            slots: Arc::new([]),
        }
    }
}

impl<A: BusAddress, D: ?Sized> Bus<A, D> {
    pub fn builder() -> BusBuilder<A, D> {
        BusBuilder { slots: Vec::new() }
    }

    /// The device that claims `addr`, locked ([`lock_device`]), and `addr`'s offset in its range.
    pub fn device(&self, addr: A) -> Option<(A, MutexGuard<'_, D>)> {
        let slot = self.slots.iter().find(|s| s.contains(addr))?;
        Some((addr - slot.base, lock_device(&slot.dev)))
    }
}

/// Collects a bus's devices; [`BusBuilder::build`] freezes them.
pub struct BusBuilder<A, D: ?Sized> {
    slots: Vec<Slot<A, D>>,
}

impl<A: BusAddress, D: ?Sized> BusBuilder<A, D> {
    /// Puts `dev` at `base..base+len`: an error if the range is empty, runs past the end of
    /// the address space or overlaps a device already there.
    pub fn insert(&mut self, base: A, len: A, dev: Arc<Mutex<D>>) -> Result<&mut Self, BusError> {
        let (start, len): (u64, u64) = (base.into(), len.into());
        if len == 0 || A::END - start < len {
            return Err(BusError::BadRange {
                space: A::SPACE,
                base: start,
                len,
            });
        }
        if let Some(other) = self
            .slots
            .iter()
            .find(|s| start < s.start() + s.len && s.start() < start + len)
        {
            return Err(BusError::Overlap {
                space: A::SPACE,
                base: start,
                len,
                other_base: other.start(),
                other_len: other.len,
            });
        }
        self.slots.push(Slot { base, len, dev });
        Ok(self)
    }

    pub fn build(self) -> Bus<A, D> {
        Bus {
            slots: self.slots.into(),
        }
    }
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

/// The port-I/O bus.
pub type PioBus = Bus<u16, dyn PioDevice>;

impl Bus<u16, dyn PioDevice> {
    /// Returns false when no device claims the port (`data` is then all ones).
    pub fn read(&self, port: u16, data: &mut [u8]) -> bool {
        match self.device(port) {
            Some((offset, mut dev)) => {
                dev.read(offset, data);
                true
            }
            None => {
                data.fill(0xff);
                false
            }
        }
    }

    pub fn write(&self, port: u16, data: &[u8]) -> PioWrite {
        match self.device(port) {
            Some((offset, mut dev)) => match dev.write(offset, data) {
                Some(e) => PioWrite::Event(e),
                None => PioWrite::Done,
            },
            None => PioWrite::Unclaimed,
        }
    }
}

/// The MMIO bus (empty without `--net`).
pub type MmioBus = Bus<u64, dyn MmioDevice>;

impl Bus<u64, dyn MmioDevice> {
    /// Returns false when no device claims the address (`data` is then all ones).
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.device(addr) {
            Some((offset, mut dev)) => {
                dev.read(offset, data);
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
        match self.device(addr) {
            Some((offset, mut dev)) => {
                dev.write(offset, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Ports(Vec<(u16, u8)>);
    impl PioDevice for Ports {
        fn read(&mut self, offset: u16, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u16, data: &[u8]) -> Option<DeviceEvent> {
            self.0.push((offset, data[0]));
            (data[0] == 0xfe).then_some(DeviceEvent::Reset)
        }
    }

    #[derive(Default)]
    struct Memory(Vec<(u64, Vec<u8>)>);
    impl MmioDevice for Memory {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn ports_route_by_port_and_offset() {
        let dev = Arc::new(Mutex::new(Ports::default()));
        let mut b = PioBus::builder();
        b.insert(0x3f8, 8, dev.clone()).unwrap();
        let bus = b.build();
        let mut d = [0u8; 1];
        assert!(bus.read(0x3fa, &mut d));
        assert_eq!(d[0], 2);
        assert!(!bus.read(0x400, &mut d));
        assert_eq!(d[0], 0xff);
        assert_eq!(bus.write(0x3f8, &[7]), PioWrite::Done);
        assert_eq!(
            bus.write(0x3ff, &[0xfe]),
            PioWrite::Event(DeviceEvent::Reset)
        );
        assert_eq!(bus.write(0x3f7, &[1]), PioWrite::Unclaimed);
        assert_eq!(dev.lock().unwrap().0, vec![(0, 7), (7, 0xfe)]);
    }

    #[test]
    fn mmio_routes_by_address_and_offset() {
        let dev = Arc::new(Mutex::new(Memory::default()));
        let mut b = MmioBus::builder();
        b.insert(0xd000_0000, 0x1000, dev.clone()).unwrap();
        let bus = b.build();
        let mut d = [0u8; 4];
        assert!(bus.read(0xd000_0070, &mut d));
        assert_eq!(d, [0x70; 4]);
        assert!(!bus.read(0xd000_1000, &mut d));
        assert_eq!(d, [0xff; 4]);
        assert!(bus.write(0xd000_0fff, &[1]));
        assert!(!bus.write(0xcfff_ffff, &[2]));
        assert_eq!(dev.lock().unwrap().0, vec![(0xfff, vec![1])]);
    }

    #[test]
    fn an_empty_bus_claims_nothing() {
        let (pio, mmio) = (PioBus::default(), MmioBus::default());
        let mut d = [0u8; 2];
        assert!(!pio.read(0x3f8, &mut d));
        assert_eq!(pio.write(0x3f8, &[1]), PioWrite::Unclaimed);
        assert!(!mmio.read(0, &mut d));
        assert!(!mmio.write(u64::MAX, &[1]));
    }

    #[test]
    fn overlap_is_an_error_and_leaves_the_bus_as_it_was() {
        let a = Arc::new(Mutex::new(Ports::default()));
        let mut b = PioBus::builder();
        b.insert(0x60, 8, a.clone()).unwrap();
        let err = b.insert(0x64, 1, a.clone()).err().unwrap();
        assert_eq!(
            err,
            BusError::Overlap {
                space: "port",
                base: 0x64,
                len: 1,
                other_base: 0x60,
                other_len: 8
            }
        );
        assert!(err.to_string().contains("overlaps"), "{err}");
        // Touching ranges do not overlap.
        b.insert(0x68, 1, a.clone()).unwrap();
        b.insert(0x5f, 1, a).unwrap();
        let bus = b.build();
        assert_eq!(bus.write(0x64, &[1]), PioWrite::Done);

        let m = Arc::new(Mutex::new(Memory::default()));
        let mut b = MmioBus::builder();
        b.insert(0x1000, 0x1000, m.clone()).unwrap();
        assert!(matches!(
            b.insert(0x1800, 0x10, m.clone()),
            Err(BusError::Overlap { space: "MMIO", .. })
        ));
        assert!(matches!(
            b.insert(0x0, 0x2000, m),
            Err(BusError::Overlap { .. })
        ));
    }

    #[test]
    fn empty_or_too_long_ranges_are_errors() {
        let a = Arc::new(Mutex::new(Ports::default()));
        let mut b = PioBus::builder();
        assert!(matches!(
            b.insert(0x60, 0, a.clone()),
            Err(BusError::BadRange { .. })
        ));
        // 0xfff8 + 8 ends exactly at the top of the port space; one more does not fit.
        b.insert(0xfff8, 8, a.clone()).unwrap();
        assert!(matches!(
            PioBus::builder().insert(0xfff9, 8, a),
            Err(BusError::BadRange { .. })
        ));
    }

    /// Panics on every write, as a device with a bug would.
    struct Buggy;
    impl PioDevice for Buggy {
        fn read(&mut self, _offset: u16, data: &mut [u8]) {
            data.fill(0x42);
        }
        fn write(&mut self, _offset: u16, _data: &[u8]) -> Option<DeviceEvent> {
            panic!("device bug");
        }
    }

    #[test]
    fn a_device_that_panicked_while_locked_serves_the_other_threads() {
        let dev = Arc::new(Mutex::new(Buggy));
        let mut b = PioBus::builder();
        b.insert(0x510, 1, dev.clone()).unwrap();
        let bus = b.build();
        let other = bus.clone();
        let crashed = std::thread::spawn(move || other.write(0x510, &[1])).join();
        assert!(crashed.is_err(), "the write panicked on its thread");
        assert!(dev.is_poisoned(), "while holding the device's lock");
        // Another thread's next access (here, this one's) goes through.
        let mut d = [0u8; 1];
        let other = bus.clone();
        let read = std::thread::spawn(move || {
            let mut d = [0u8; 1];
            other.read(0x510, &mut d);
            d[0]
        })
        .join();
        assert_eq!(read.ok(), Some(0x42));
        assert!(bus.read(0x510, &mut d));
        assert_eq!(d[0], 0x42);
    }
}
