//! The hw source: perf *raw hardware* events built from the guest's event select, USR/OS mapped
//! to exclude_user/exclude_kernel. **Hardware-only**: needs a host PMU and VT-x/SVM; checked
//! here only against fakes of [`PerfSys`].
//!
//! cpu-switch: one guest-mode event (`exclude_host=1`: the hardware stops it on VM exit).
//! domain-switch: a guest-mode event with the guest's filters plus a host-mode event
//! (`exclude_guest=1`) for the work done on the guest's behalf, summed.

use std::collections::BTreeMap;
use std::os::fd::RawFd;

use vpmu::{AccountingMode, BackendError, Event, Scale, Vendor};

use super::{close_events, open_events, SourceBackend};
use crate::pmu::perf::{PerfEvent, PerfRequest, PerfSys};

/// Shortest host sample period a hardware event is armed with (counts): a guest that arms a
/// counter to overflow after 1 event must not turn into a signal storm on the host.
pub const MIN_HW_PERIOD: u64 = 10_000;

struct HwCounter {
    fds: Vec<RawFd>,
    /// Backend units at which to report an overflow.
    armed: Option<u64>,
    /// The last value `count` returned (reads never go backwards).
    last: u64,
}

pub(super) struct Hw {
    mode: AccountingMode,
    counters: BTreeMap<u8, HwCounter>,
}

impl Hw {
    pub(super) fn new(mode: AccountingMode) -> Hw {
        Hw {
            mode,
            counters: BTreeMap::new(),
        }
    }

    /// The perf events that implement one guest counter.
    fn requests(&self, e: &Event, period: Option<u64>) -> Vec<PerfRequest> {
        let guest = PerfRequest {
            event: hw_event(e),
            sample_period: period.map(|p| p.max(MIN_HW_PERIOD)),
            exclude_user: !e.usr,
            exclude_kernel: !e.os,
            exclude_host: true,
            ..PerfRequest::counting(PerfEvent::TaskClock)
        };
        match self.mode {
            AccountingMode::CpuSwitch => vec![guest],
            AccountingMode::DomainSwitch => {
                let host = PerfRequest {
                    exclude_user: false,
                    exclude_kernel: false,
                    exclude_host: false,
                    exclude_guest: true,
                    ..guest
                };
                vec![guest, host]
            }
        }
    }

    fn count(&mut self, sys: &mut dyn PerfSys, bit: u8) -> u64 {
        let Some(c) = self.counters.get_mut(&bit) else {
            return 0;
        };
        let raw: u64 = c.fds.iter().map(|&fd| sys.read(fd)).sum();
        c.last = raw.max(c.last);
        c.last
    }
}

/// The host perf event for a guest event on the hardware backend.
fn hw_event(e: &Event) -> PerfEvent {
    const PERF_COUNT_HW_CPU_CYCLES: u64 = 0;
    const PERF_COUNT_HW_INSTRUCTIONS: u64 = 1;
    const PERF_COUNT_HW_REF_CPU_CYCLES: u64 = 9;
    if let Some(i) = e.fixed {
        return PerfEvent::Hardware(match i {
            0 => PERF_COUNT_HW_INSTRUCTIONS,
            1 => PERF_COUNT_HW_CPU_CYCLES,
            _ => PERF_COUNT_HW_REF_CPU_CYCLES,
        });
    }
    // The event-select layout both vendors share (edge 18, inv 23, cmask 24-31); AMD keeps event
    // bits 11:8 at 35:32.
    let code = u64::from(e.code);
    let mut config = (code & 0xff)
        | (u64::from(e.umask) << 8)
        | (u64::from(e.edge) << 18)
        | (u64::from(e.inv) << 23)
        | (u64::from(e.cmask) << 24);
    if e.vendor == Vendor::Amd {
        config |= ((code >> 8) & 0xf) << 32;
    }
    PerfEvent::Raw(config)
}

impl SourceBackend for Hw {
    fn supports(&self, _e: &Event) -> bool {
        true
    }

    fn scale(&self, _e: &Event) -> Scale {
        Scale::ONE
    }

    fn program(
        &mut self,
        sys: &mut dyn PerfSys,
        bit: u8,
        e: &Event,
        overflow_after: Option<u64>,
    ) -> Result<(), BackendError> {
        self.stop(sys, bit);
        let fds = open_events(sys, &self.requests(e, overflow_after))?;
        let c = HwCounter {
            fds,
            armed: overflow_after,
            last: 0,
        };
        self.counters.insert(bit, c);
        Ok(())
    }

    fn read(&mut self, sys: &mut dyn PerfSys, bit: u8) -> u64 {
        self.count(sys, bit)
    }

    fn stop(&mut self, sys: &mut dyn PerfSys, bit: u8) {
        if let Some(c) = self.counters.remove(&bit) {
            close_events(sys, &c.fds);
        }
    }

    fn overflows(&mut self, sys: &mut dyn PerfSys) -> u64 {
        let armed: Vec<(u8, u64)> = self
            .counters
            .iter()
            .filter_map(|(b, c)| c.armed.map(|a| (*b, a)))
            .collect();
        let mut bits = 0;
        for (bit, at) in armed {
            if self.count(sys, bit) >= at {
                bits |= 1 << bit;
            }
        }
        bits
    }

    fn set_mode(&mut self, mode: AccountingMode) {
        // The model re-programs every running counter right after this, and `requests`
        // follows the mode: the events get the new mode's exclude bits.
        self.mode = mode;
    }

    fn close_all(&mut self, sys: &mut dyn PerfSys) {
        let bits: Vec<u8> = self.counters.keys().copied().collect();
        for b in bits {
            self.stop(sys, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::Source;
    use super::*;
    use vpmu::{CounterBackend, CounterId};

    #[test]
    fn hw_maps_event_select_and_modes() {
        // Intel: LLC misses, user only, edge + cmask.
        let mut e = event(Vendor::Intel, 0x2e, 0x41, true, false);
        e.edge = true;
        e.cmask = 2;
        let (mut b, log) = backend(Source::Hw, AccountingMode::CpuSwitch);
        b.program(CounterId::gp(0), &e, None).unwrap();
        let r = log.lock().unwrap().opened[0];
        assert_eq!(
            r.event,
            PerfEvent::Raw(0x2e | 0x41 << 8 | 1 << 18 | 2 << 24)
        );
        assert!(r.exclude_kernel && !r.exclude_user && r.exclude_host && !r.exclude_guest);
        // AMD event code bits 11:8 go to config 35:32.
        let (mut b, log) = backend(Source::Hw, AccountingMode::CpuSwitch);
        b.program(
            CounterId::gp(0),
            &event(Vendor::Amd, 0x1c0, 0, true, true),
            None,
        )
        .unwrap();
        assert_eq!(
            log.lock().unwrap().opened[0].event,
            PerfEvent::Raw(0xc0 | 1 << 32)
        );
        // Fixed counters use generic hardware events.
        let (mut b, log) = backend(Source::Hw, AccountingMode::CpuSwitch);
        b.program(
            CounterId::fixed(0),
            &Event {
                fixed: Some(0),
                ..e
            },
            None,
        )
        .unwrap();
        assert_eq!(log.lock().unwrap().opened[0].event, PerfEvent::Hardware(1));
        // domain-switch adds a host-side event and sums both.
        let (mut b, log) = backend(Source::Hw, AccountingMode::DomainSwitch);
        b.program(
            CounterId::gp(2),
            &event(Vendor::Amd, 0x76, 0, false, true),
            None,
        )
        .unwrap();
        {
            let mut l = log.lock().unwrap();
            assert_eq!(l.opened.len(), 2);
            assert!(l.opened[0].exclude_host && l.opened[0].exclude_user);
            assert!(
                l.opened[1].exclude_guest && !l.opened[1].exclude_user && !l.opened[1].exclude_host
            );
            l.counts.insert(101, 7);
            l.counts.insert(102, 5);
        }
        assert_eq!(b.read(CounterId::gp(2)), 12);
        b.stop(CounterId::gp(2));
        assert_eq!(log.lock().unwrap().closed, vec![101, 102]);
    }

    #[test]
    fn tiny_hw_periods_are_clamped() {
        let (mut b, log) = backend(Source::Hw, AccountingMode::CpuSwitch);
        b.program(
            CounterId::gp(1),
            &event(Vendor::Amd, 0x76, 0, true, true),
            Some(1),
        )
        .unwrap();
        assert_eq!(
            log.lock().unwrap().opened[0].sample_period,
            Some(MIN_HW_PERIOD)
        );
    }
}
