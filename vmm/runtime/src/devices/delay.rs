//! A test device that stands for slow device emulation: each access to its port busy-waits a
//! fixed time on the vCPU thread, i.e. VMM work done on the guest's behalf. domain-switch
//! accounting charges that time to the guest, cpu-switch does not. Present only when asked for
//! (`VmConfig::io_delay_us`; the tiny-guest tests and the accounting-mode comparison use it).

use std::time::{Duration, Instant};

use super::{DeviceEvent, PioDevice};

pub(crate) const DELAY_PORT: u16 = 0x510;

/// Busy-waits `d` on the calling (vCPU) thread: VMM work done on the guest's behalf.
pub(crate) fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

pub(crate) struct Delay {
    each: Duration,
}

impl Delay {
    pub(crate) fn new(each: Duration) -> Self {
        Delay { each }
    }

    fn spin(&self) {
        spin(self.each);
    }
}

impl PioDevice for Delay {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        self.spin();
        data.fill(0);
    }

    fn write(&mut self, _offset: u16, _data: &[u8]) -> Option<DeviceEvent> {
        self.spin();
        None
    }
}
