//! Counter backends: the vPMU model's counters over host perf events on the vCPU thread.
//!
//! * `soft` — a perf *software* task-clock event (thread CPU time, ns) per counter; cycle events
//!   (Intel 0x3C and fixed counters 1/2, AMD 0x76) count time x TSC frequency. Runs on any Linux
//!   host, including those without a PMU. The guest's USR/OS filter cannot be honoured (thread
//!   CPU time does not say which guest ring ran) and is ignored.
//! * `hw` — perf *raw hardware* events built from the guest's event select, USR/OS mapped to
//!   exclude_user/exclude_kernel. **Hardware-only**: needs a host PMU and VT-x/SVM; checked here
//!   only against a fake of [`PerfSys`].
//!
//! Accounting modes, the same meaning on both:
//! * cpu-switch — count only inside KVM_RUN. soft: events are enabled in `enter_guest` and
//!   disabled in `leave_guest`; hw: `exclude_host=1` makes the hardware do it.
//! * domain-switch — count whenever the vCPU thread runs (KVM and the VMM's exit handling on
//!   that thread included): the host kernel's per-task perf context switch is the save/restore.
//!   soft: always enabled; hw: a guest-mode event with the guest's filters plus a host-mode event
//!   (exclude_guest) for the work done on the guest's behalf, summed.

use std::collections::BTreeMap;
use std::os::fd::RawFd;

use vpmu::{
    AccountingMode, ArchEvent, BackendError, CounterBackend, CounterId, Event, Scale, Vendor,
};

use super::perf::{PerfEvent, PerfRequest, PerfSys};

/// Shortest host sample period a soft counter is armed with (ns of thread CPU time): a guest
/// that arms a counter to overflow after 1 cycle must not turn into a signal storm on the host.
pub const MIN_SOFT_PERIOD_NS: u64 = 50_000;
/// Likewise for hardware events (counts).
pub const MIN_HW_PERIOD: u64 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// perf task-clock, scaled to cycles at `tsc_khz`.
    Soft { tsc_khz: u64 },
    /// perf raw hardware events.
    Hw,
}

struct Open {
    fds: Vec<RawFd>,
    /// Host units counted at program time are subtracted (events start at 0, but cpu-switch
    /// toggling leaves them as they are).
    armed: Option<u64>,
}

pub struct PerfBackend {
    source: Source,
    mode: AccountingMode,
    sys: Box<dyn PerfSys>,
    counters: BTreeMap<u8, Open>,
    in_guest: bool,
    signals: crate::vcpu::kick::SignalWatch,
}

impl PerfBackend {
    pub fn new(source: Source, mode: AccountingMode, sys: Box<dyn PerfSys>) -> Self {
        PerfBackend {
            source,
            mode,
            sys,
            counters: BTreeMap::new(),
            in_guest: false,
            signals: Default::default(),
        }
    }

    fn soft_counts(e: &Event) -> bool {
        matches!(
            e.arch_event(),
            Some(ArchEvent::CoreCycles | ArchEvent::RefCycles)
        )
    }

    /// The perf events that implement one guest counter.
    fn requests(&self, e: &Event, period: Option<u64>) -> Vec<PerfRequest> {
        let base = PerfRequest {
            event: PerfEvent::TaskClock,
            sample_period: period,
            exclude_user: false,
            exclude_kernel: false,
            exclude_host: false,
            exclude_guest: false,
            disabled: false,
        };
        match self.source {
            Source::Soft { .. } => {
                // cpu-switch: opened disabled, enabled only inside KVM_RUN.
                let disabled = self.mode == AccountingMode::CpuSwitch && !self.in_guest;
                vec![PerfRequest {
                    sample_period: period.map(|p| p.max(MIN_SOFT_PERIOD_NS)),
                    disabled,
                    ..base
                }]
            }
            Source::Hw => {
                let guest = PerfRequest {
                    event: hw_event(e),
                    sample_period: period.map(|p| p.max(MIN_HW_PERIOD)),
                    exclude_user: !e.usr,
                    exclude_kernel: !e.os,
                    exclude_host: true,
                    ..base
                };
                match self.mode {
                    AccountingMode::CpuSwitch => vec![guest],
                    AccountingMode::DomainSwitch => {
                        vec![
                            guest,
                            PerfRequest {
                                exclude_user: false,
                                exclude_kernel: false,
                                exclude_host: false,
                                exclude_guest: true,
                                ..guest
                            },
                        ]
                    }
                }
            }
        }
    }

    fn count(&mut self, bit: u8) -> u64 {
        let Some(c) = self.counters.get(&bit) else {
            return 0;
        };
        let fds = c.fds.clone();
        fds.into_iter().map(|fd| self.sys.read(fd)).sum()
    }

    fn close(&mut self, bit: u8) {
        if let Some(c) = self.counters.remove(&bit) {
            for fd in c.fds {
                self.sys.close(fd);
            }
        }
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

impl CounterBackend for PerfBackend {
    fn supports(&self, e: &Event) -> bool {
        match self.source {
            Source::Soft { .. } => Self::soft_counts(e),
            Source::Hw => true,
        }
    }

    fn scale(&self, _e: &Event) -> Scale {
        match self.source {
            // ns of thread CPU time -> cycles at the TSC rate.
            Source::Soft { tsc_khz } => Scale::new(tsc_khz.max(1), 1_000_000),
            Source::Hw => Scale::ONE,
        }
    }

    fn program(
        &mut self,
        ctr: CounterId,
        e: &Event,
        overflow_after: Option<u64>,
    ) -> Result<(), BackendError> {
        if !self.supports(e) {
            return Err(BackendError::Unsupported(*e));
        }
        self.close(ctr.bit());
        let mut fds = Vec::new();
        for req in self.requests(e, overflow_after) {
            match self.sys.open(&req) {
                Ok(fd) => fds.push(fd),
                Err(err) => {
                    for fd in fds {
                        self.sys.close(fd);
                    }
                    return Err(BackendError::Host(format!(
                        "perf_event_open({:?}): {err}",
                        req.event
                    )));
                }
            }
        }
        self.counters.insert(
            ctr.bit(),
            Open {
                fds,
                armed: overflow_after,
            },
        );
        Ok(())
    }

    fn read(&mut self, ctr: CounterId) -> u64 {
        self.count(ctr.bit())
    }

    fn stop(&mut self, ctr: CounterId) {
        self.close(ctr.bit());
    }

    fn take_overflows(&mut self) -> u64 {
        if !self.signals.take() {
            return 0;
        }
        let armed: Vec<(u8, u64)> = self
            .counters
            .iter()
            .filter_map(|(b, c)| c.armed.map(|a| (*b, a)))
            .collect();
        let mut bits = 0;
        for (bit, at) in armed {
            if self.count(bit) >= at {
                bits |= 1 << bit;
            }
        }
        bits
    }

    fn enter_guest(&mut self) {
        self.in_guest = true;
        if matches!(self.source, Source::Soft { .. }) && self.mode == AccountingMode::CpuSwitch {
            for c in self.counters.values() {
                for &fd in &c.fds {
                    self.sys.enable(fd);
                }
            }
        }
    }

    fn set_mode(&mut self, mode: AccountingMode) {
        // The model re-programs every running counter right after this, and `requests` follows
        // the mode: soft cpu-switch events open disabled (we are outside KVM_RUN), hw events get
        // the new mode's exclude bits.
        self.mode = mode;
    }

    fn leave_guest(&mut self) {
        self.in_guest = false;
        if matches!(self.source, Source::Soft { .. }) && self.mode == AccountingMode::CpuSwitch {
            for c in self.counters.values() {
                for &fd in &c.fds {
                    self.sys.disable(fd);
                }
            }
        }
    }
}

impl Drop for PerfBackend {
    fn drop(&mut self) {
        let bits: Vec<u8> = self.counters.keys().copied().collect();
        for b in bits {
            self.close(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Records every call; counts are set by the test.
    #[derive(Default)]
    struct Log {
        opened: Vec<PerfRequest>,
        enabled: Vec<RawFd>,
        disabled: Vec<RawFd>,
        closed: Vec<RawFd>,
        counts: BTreeMap<RawFd, u64>,
    }
    struct FakePerf(Arc<Mutex<Log>>);
    impl PerfSys for FakePerf {
        fn open(&mut self, req: &PerfRequest) -> std::io::Result<RawFd> {
            let mut l = self.0.lock().unwrap();
            l.opened.push(*req);
            Ok(100 + l.opened.len() as RawFd)
        }
        fn enable(&mut self, fd: RawFd) {
            self.0.lock().unwrap().enabled.push(fd);
        }
        fn disable(&mut self, fd: RawFd) {
            self.0.lock().unwrap().disabled.push(fd);
        }
        fn read(&mut self, fd: RawFd) -> u64 {
            *self.0.lock().unwrap().counts.get(&fd).unwrap_or(&0)
        }
        fn close(&mut self, fd: RawFd) {
            self.0.lock().unwrap().closed.push(fd);
        }
    }

    fn backend(source: Source, mode: AccountingMode) -> (PerfBackend, Arc<Mutex<Log>>) {
        let log = Arc::new(Mutex::new(Log::default()));
        (
            PerfBackend::new(source, mode, Box::new(FakePerf(log.clone()))),
            log,
        )
    }

    fn event(vendor: Vendor, code: u16, umask: u8, usr: bool, os: bool) -> Event {
        Event {
            vendor,
            code,
            umask,
            usr,
            os,
            edge: false,
            inv: false,
            cmask: 0,
            fixed: None,
        }
    }

    #[test]
    fn soft_counts_only_cycles_and_scales_to_tsc() {
        let (b, _) = backend(
            Source::Soft { tsc_khz: 2_600_000 },
            AccountingMode::DomainSwitch,
        );
        assert!(b.supports(&event(Vendor::Amd, 0x76, 0, true, true)));
        assert!(b.supports(&event(Vendor::Intel, 0x3c, 0, true, true)));
        assert!(b.supports(&event(Vendor::Intel, 0x3c, 1, true, true)));
        assert!(!b.supports(&event(Vendor::Intel, 0xc0, 0, true, true)));
        assert!(!b.supports(&event(Vendor::Amd, 0xc0, 0, true, true)));
        let fixed_cycles = Event {
            fixed: Some(1),
            ..event(Vendor::Intel, 0, 0, true, true)
        };
        assert!(b.supports(&fixed_cycles));
        assert_eq!(b.scale(&fixed_cycles).to_guest(1_000_000), 2_600_000);
    }

    #[test]
    fn soft_cpu_switch_toggles_around_kvm_run_domain_switch_does_not() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::CpuSwitch,
        );
        b.program(CounterId::gp(0), &e, None).unwrap();
        assert!(log.lock().unwrap().opened[0].disabled);
        b.enter_guest();
        b.leave_guest();
        {
            let l = log.lock().unwrap();
            assert_eq!((l.enabled.len(), l.disabled.len()), (1, 1));
        }

        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::DomainSwitch,
        );
        b.program(CounterId::gp(0), &e, None).unwrap();
        b.enter_guest();
        b.leave_guest();
        let l = log.lock().unwrap();
        assert!(!l.opened[0].disabled);
        assert!(l.enabled.is_empty() && l.disabled.is_empty());
    }

    #[test]
    fn tiny_periods_are_clamped() {
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::DomainSwitch,
        );
        b.program(
            CounterId::gp(1),
            &event(Vendor::Amd, 0x76, 0, true, true),
            Some(1),
        )
        .unwrap();
        assert_eq!(
            log.lock().unwrap().opened[0].sample_period,
            Some(MIN_SOFT_PERIOD_NS)
        );
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
    fn unsupported_events_are_refused() {
        let (mut b, log) = backend(Source::Soft { tsc_khz: 1 }, AccountingMode::CpuSwitch);
        let e = event(Vendor::Intel, 0xc0, 0, true, true);
        assert!(matches!(
            b.program(CounterId::gp(0), &e, None),
            Err(BackendError::Unsupported(_))
        ));
        assert!(log.lock().unwrap().opened.is_empty());
    }
}
