//! The vPMU control port: lets the guest (its init, or a tiny test guest) switch the accounting
//! mode, and read which mode it is counting in (to tag its own results). One byte at
//! [`VPMU_CONTROL_PORT`]: write 1 = cpu-switch, 2 = domain-switch (other values are ignored, with
//! a log line); read = the current mode (1 or 2). Present only with the vPMU on.

use std::sync::Arc;

use vpmu::AccountingMode;

use vpmu::guest_log::GuestLog;
use vpmu::guest_warn;

use super::{DeviceEvent, PioDevice};
use crate::pmu::mode::ModeSwitch;

pub const VPMU_CONTROL_PORT: u16 = 0x511;

pub struct VpmuControl {
    switch: Arc<ModeSwitch>,
    /// Makes every vCPU exit so that it applies the new mode (the writer applies it at once).
    kick: Box<dyn Fn() + Send>,
}

impl VpmuControl {
    pub fn new(switch: Arc<ModeSwitch>, kick: Box<dyn Fn() + Send>) -> Self {
        VpmuControl { switch, kick }
    }
}

fn code(mode: AccountingMode) -> u8 {
    match mode {
        AccountingMode::CpuSwitch => 1,
        AccountingMode::DomainSwitch => 2,
    }
}

impl PioDevice for VpmuControl {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0);
        data[0] = code(self.switch.get());
    }

    fn write(&mut self, _offset: u16, data: &[u8]) -> Option<DeviceEvent> {
        let mode = match data.first() {
            Some(1) => AccountingMode::CpuSwitch,
            Some(2) => AccountingMode::DomainSwitch,
            other => {
                static IGNORED: GuestLog = GuestLog::new("vpmu-control-ignored-write");
                guest_warn!(
                    IGNORED,
                    "vPMU control port: ignored write {other:?} (1 = cpu-switch, 2 = domain-switch)"
                );
                return None;
            }
        };
        if self.switch.set(mode, "guest") {
            (self.kick)();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn guest_switches_and_reads_the_mode() {
        let m = Arc::new(ModeSwitch::new(AccountingMode::CpuSwitch));
        let kicks = Arc::new(AtomicU32::new(0));
        let k = kicks.clone();
        let mut dev = VpmuControl::new(
            m.clone(),
            Box::new(move || {
                k.fetch_add(1, Ordering::SeqCst);
            }),
        );
        let mut b = [0u8];
        dev.read(0, &mut b);
        assert_eq!(b[0], 1);
        dev.write(0, &[2]);
        dev.write(0, &[2]);
        dev.write(0, &[7]);
        dev.read(0, &mut b);
        assert_eq!((b[0], m.get()), (2, AccountingMode::DomainSwitch));
        assert_eq!(kicks.load(Ordering::SeqCst), 1, "kick once per change");
    }
}
