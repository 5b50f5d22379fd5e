//! A fake of the perf syscall layer ([`PerfSys`]) that **counts** as perf's ABI does on a host
//! with a PMU and VT-x/SVM, so the hw source's unit tests check counts and overflow timing,
//! not only which events were opened.
//!
//! The test scripts a timeline: [`Sim::run`]`(ctx, n)` says the event happened `n` times while
//! the vCPU thread was in `ctx` (guest or host mode, user or kernel ring). Every open, enabled
//! hardware/raw event whose exclude bits admit `ctx` counts them:
//! * `exclude_host` — counts only in guest mode; `exclude_guest` — only in host mode (both:
//!   nothing; AMD's perf clears USR and OS then, Intel's masks the counter both ways);
//! * `exclude_user` / `exclude_kernel` — the ring of the code running, in either mode (the
//!   event select's USR/OS bits apply to the guest's CPL in guest mode);
//! * a sampling event (`sample_period`) overflows every `period` counts: each overflow is one
//!   notification, the signal on the opening thread (here: the vCPU kick signal, raised on the
//!   calling thread), and the period starts again;
//! * PERF_EVENT_IOC_PERIOD ([`PerfSys::set_period`]) sets the period and restarts it (the next
//!   overflow is `period` counts from now; `__perf_event_period` zeroes `period_left`), and is
//!   refused (EINVAL) on a counting-only event, for 0 and for bit 63; IOC_ENABLE/DISABLE stop
//!   and start counting and keep the period's progress; IOC_RESET ([`Sim::reset`]: the trait
//!   has no caller for it) zeroes the count, not the period;
//! * `read(2)` gives the count; with `read_times` also perf's time_enabled and time_running;
//! * with a counter budget ([`Sim::with_counters`]) more enabled hardware events than counters
//!   are multiplexed as perf's rotation does: every `interval` time units the next `budget` of
//!   them (in opening order, round robin) hold the counters; the others count nothing and only
//!   their time_enabled advances. Time is the timeline's event count (1 event = 1 unit: a
//!   cycles-like event).
//!
//! Software events (task-clock, switch records) count nothing here.
//!
//! Two drivers share this counting core: the unit tests' scripted timeline ([`Sim::run`]) and
//! `sim_host.rs`, which drives it with the vCPU thread's real CPU time so a whole VM can run on
//! the hw source (`--vpmu-backend sim`).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

use crate::pmu::perf::{PerfCount, PerfEvent, PerfRequest, PerfSys, SwitchSeq};

/// Where the vCPU thread is when the events of a [`Sim::run`] happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ctx {
    /// Guest mode (inside VMRUN/VMLAUNCH) or host mode (KVM, the VMM).
    pub guest: bool,
    /// CPL 3 (of the guest in guest mode, of the VMM in host mode) or CPL 0.
    pub user: bool,
}

// The scripted tests use every context; a live run (sim_host.rs) only two.
#[cfg_attr(not(test), allow(dead_code))]
impl Ctx {
    pub(super) const GUEST_USER: Ctx = Ctx {
        guest: true,
        user: true,
    };
    pub(super) const GUEST_KERNEL: Ctx = Ctx {
        guest: true,
        user: false,
    };
    pub(super) const HOST_USER: Ctx = Ctx {
        guest: false,
        user: true,
    };
    pub(super) const HOST_KERNEL: Ctx = Ctx {
        guest: false,
        user: false,
    };
}

struct SimEvent {
    req: PerfRequest,
    enabled: bool,
    count: u64,
    /// Counts left until the next overflow (sampling events).
    period_left: u64,
    time_enabled: u64,
    time_running: u64,
}

impl SimEvent {
    fn is_hw(&self) -> bool {
        matches!(self.req.event, PerfEvent::Hardware(_) | PerfEvent::Raw(_))
    }

    fn counts_in(&self, ctx: Ctx) -> bool {
        let r = &self.req;
        let hw = self.is_hw();
        let mode_ok = if ctx.guest {
            !r.exclude_guest
        } else {
            !r.exclude_host
        };
        let ring_ok = if ctx.user {
            !r.exclude_user
        } else {
            !r.exclude_kernel
        };
        hw && self.enabled && mode_ok && ring_ok
    }

    /// Counts `n`; returns the overflows.
    fn add(&mut self, n: u64) -> u64 {
        self.count += n;
        let Some(period) = self.req.sample_period.filter(|&p| p > 0) else {
            return 0;
        };
        if n < self.period_left {
            self.period_left -= n;
            return 0;
        }
        let past = n - self.period_left;
        self.period_left = period - past % period;
        1 + past / period
    }
}

/// What the fake saw and holds.
#[derive(Default)]
pub(super) struct SimState {
    /// Every request, in order.
    pub opened: Vec<PerfRequest>,
    pub closed: Vec<RawFd>,
    /// Every PERF_EVENT_IOC_PERIOD, accepted or not.
    pub periods: Vec<(RawFd, u64)>,
    /// Calls the kernel would have refused (a bug in the backend).
    pub refused: Vec<String>,
    /// Overflow notifications sent, per fd.
    pub notifications: BTreeMap<RawFd, u64>,
    events: BTreeMap<RawFd, SimEvent>,
    /// Hardware counters (None: as many as events) and the rotation interval.
    budget: Option<(usize, u64)>,
    /// Time units run so far.
    clock: u64,
}

impl SimState {
    /// The events on a hardware counter now: all of them, or `budget` of the enabled ones
    /// from a start that moves by one each interval.
    fn scheduled(&self) -> Vec<RawFd> {
        let hw: Vec<RawFd> = self
            .events
            .iter()
            .filter(|(_, e)| e.is_hw() && e.enabled)
            .map(|(fd, _)| *fd)
            .collect();
        match self.budget {
            Some((n, interval)) if hw.len() > n => {
                let start = (self.clock / interval) as usize % hw.len();
                hw.iter().cycle().skip(start).take(n).copied().collect()
            }
            _ => hw,
        }
    }

    /// `n` events in `ctx`, cut where the multiplexing rotates; returns the overflows.
    pub(super) fn run(&mut self, ctx: Ctx, n: u64) -> u64 {
        let mut signals = 0;
        let mut left = n;
        while left > 0 {
            let chunk = match self.budget {
                Some((_, interval)) => left.min(interval - self.clock % interval),
                None => left,
            };
            signals += self.step(ctx, chunk);
            left -= chunk;
        }
        signals
    }

    /// Counts until the first sampling event that counts in `ctx` overflows, if any (the
    /// events not on a counter now included: an early answer only costs the caller a look).
    pub(super) fn next_overflow(&self, ctx: Ctx) -> Option<u64> {
        self.events
            .values()
            .filter(|e| e.req.sample_period.is_some() && e.counts_in(ctx))
            .map(|e| e.period_left)
            .min()
    }

    /// Sets a counter budget: `counters` hardware counters, rotated every `interval` units.
    pub(super) fn set_budget(&mut self, counters: usize, interval: u64) {
        self.budget = Some((counters, interval.max(1)));
    }

    /// `n` events in `ctx` with no rotation in between; returns the overflows.
    fn step(&mut self, ctx: Ctx, n: u64) -> u64 {
        let on = self.scheduled();
        let mut signals = 0;
        for (fd, e) in self.events.iter_mut() {
            if !(e.is_hw() && e.enabled) {
                continue;
            }
            e.time_enabled += n;
            if !on.contains(fd) {
                continue;
            }
            e.time_running += n;
            if e.counts_in(ctx) {
                let o = e.add(n);
                if o > 0 {
                    *self.notifications.entry(*fd).or_default() += o;
                    signals += o;
                }
            }
        }
        self.clock += n;
        signals
    }
}

/// Overflow notifications: the kick signal on the calling thread (the vCPU thread, which
/// opened the events), as perf sends it (at most a few: one is enough for the watch).
pub(super) fn notify(signals: u64) {
    for _ in 0..signals.min(4) {
        // SAFETY: raising the kick signal on this thread; `Sim::new` (or the VMM) installed its
        // handler.
        unsafe { libc::raise(crate::vcpu_access::kick::kick_signal()) };
    }
}

/// The simulated host (shared by the test and the backend's [`PerfSys`]).
#[derive(Clone, Default)]
pub(super) struct Sim(Arc<Mutex<SimState>>);

impl Sim {
    /// A fresh host; installs the kick signal's handler (overflows raise it).
    #[cfg(test)]
    pub(super) fn new() -> Sim {
        crate::vcpu_access::kick::install_handler().unwrap();
        Sim::default()
    }

    /// The perf layer a backend is given.
    #[cfg(test)]
    pub(super) fn perf(&self) -> Box<dyn PerfSys> {
        Box::new(SimPerf(self.clone()))
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.0.lock().unwrap()
    }

    /// A host with `counters` hardware counters, rotating multiplexed events every
    /// `interval` time units.
    #[cfg(test)]
    pub(super) fn with_counters(counters: usize, interval: u64) -> Sim {
        let sim = Sim::new();
        sim.state().set_budget(counters, interval);
        sim
    }

    /// The event happens `n` times in `ctx`; overflowing events notify.
    #[cfg(test)]
    pub(super) fn run(&self, ctx: Ctx, n: u64) {
        let signals = self.state().run(ctx, n);
        notify(signals);
    }

    /// PERF_EVENT_IOC_RESET: the count goes to 0, the period's progress stays.
    #[cfg(test)]
    pub(super) fn reset(&self, fd: RawFd) {
        if let Some(e) = self.state().events.get_mut(&fd) {
            e.count = 0;
        }
    }

    /// The fds open now.
    #[cfg(test)]
    pub(super) fn open_fds(&self) -> Vec<RawFd> {
        self.state().events.keys().copied().collect()
    }
}

pub(super) struct SimPerf(pub(super) Sim);

/// PERF_EVENT_IOC_ENABLE / _DISABLE as the kernel does them (no backend calls them: they open
/// their events enabled and close them; the simulation's own tests do).
#[cfg(test)]
impl Sim {
    fn enable(&self, fd: RawFd) {
        if let Some(e) = self.state().events.get_mut(&fd) {
            e.enabled = true;
        }
    }

    fn disable(&self, fd: RawFd) {
        if let Some(e) = self.state().events.get_mut(&fd) {
            e.enabled = false;
        }
    }
}

impl PerfSys for SimPerf {
    fn open(&mut self, req: &PerfRequest) -> io::Result<RawFd> {
        let mut s = self.0.state();
        s.opened.push(*req);
        let fd = 100 + s.opened.len() as RawFd;
        let e = SimEvent {
            req: *req,
            enabled: !req.disabled,
            count: 0,
            period_left: req.sample_period.unwrap_or(0),
            time_enabled: 0,
            time_running: 0,
        };
        s.events.insert(fd, e);
        Ok(fd)
    }

    fn read(&mut self, fd: RawFd) -> u64 {
        let mut s = self.0.state();
        match s.events.get(&fd) {
            Some(e) => e.count,
            None => {
                s.refused.push(format!("read({fd}): not open (EBADF)"));
                0
            }
        }
    }

    fn read_count(&mut self, fd: RawFd) -> PerfCount {
        let value = self.read(fd);
        match self.0.state().events.get(&fd) {
            Some(e) if e.req.read_times => PerfCount {
                value,
                time_enabled: e.time_enabled,
                time_running: e.time_running,
            },
            _ => PerfCount {
                value,
                ..PerfCount::default()
            },
        }
    }

    fn close(&mut self, fd: RawFd) {
        let mut s = self.0.state();
        if s.events.remove(&fd).is_none() {
            s.refused.push(format!("close({fd}): not open (EBADF)"));
        }
        s.closed.push(fd);
    }

    fn set_period(&mut self, fd: RawFd, period: u64) {
        let mut s = self.0.state();
        s.periods.push((fd, period));
        let why = match s.events.get_mut(&fd) {
            None => Some("not open (EBADF)"),
            Some(e) if e.req.sample_period.is_none() => Some("not a sampling event (EINVAL)"),
            Some(_) if period == 0 || period >> 63 != 0 => Some("bad period (EINVAL)"),
            Some(e) => {
                e.req.sample_period = Some(period);
                e.period_left = period;
                None
            }
        };
        if let Some(why) = why {
            s.refused.push(format!("IOC_PERIOD({fd}, {period}): {why}"));
        }
    }

    fn switch_seq(&mut self, _fd: RawFd) -> io::Result<SwitchSeq> {
        // The simulated thread is never switched out.
        Ok(SwitchSeq::of_counter(Default::default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(exclude_host: bool, exclude_guest: bool, exclude_user: bool) -> PerfRequest {
        PerfRequest {
            exclude_host,
            exclude_guest,
            exclude_user,
            ..PerfRequest::counting(PerfEvent::Raw(0x76))
        }
    }

    #[test]
    fn counts_by_mode_and_ring_as_the_exclude_bits_say() {
        let sim = Sim::new();
        let mut p = sim.perf();
        let guest = p.open(&raw(true, false, false)).unwrap();
        let host = p.open(&raw(false, true, false)).unwrap();
        let both = p.open(&raw(false, false, false)).unwrap();
        let kernel_only = p.open(&raw(false, false, true)).unwrap();
        let neither = p.open(&raw(true, true, false)).unwrap();
        sim.run(Ctx::GUEST_USER, 10);
        sim.run(Ctx::GUEST_KERNEL, 20);
        sim.run(Ctx::HOST_USER, 300);
        sim.run(Ctx::HOST_KERNEL, 4000);
        let got: Vec<u64> = [guest, host, both, kernel_only, neither]
            .iter()
            .map(|&fd| p.read(fd))
            .collect();
        assert_eq!(got, vec![30, 4300, 4330, 4020, 0]);
    }

    #[test]
    fn periods_overflow_restart_and_survive_disable() {
        let sim = Sim::new();
        let mut p = sim.perf();
        let req = PerfRequest {
            sample_period: Some(100),
            ..raw(false, false, false)
        };
        let fd = p.open(&req).unwrap();
        sim.run(Ctx::GUEST_USER, 250);
        assert_eq!(sim.state().notifications[&fd], 2);
        // 50 into the third period; IOC_PERIOD restarts it: the next overflow 30 from now.
        p.set_period(fd, 30);
        sim.run(Ctx::GUEST_USER, 29);
        assert_eq!(sim.state().notifications[&fd], 2);
        sim.disable(fd);
        sim.run(Ctx::GUEST_USER, 1000);
        sim.enable(fd);
        sim.run(Ctx::GUEST_USER, 1);
        assert_eq!(sim.state().notifications[&fd], 3);
        assert_eq!(p.read(fd), 280);
        sim.reset(fd);
        assert_eq!(p.read(fd), 0);
        sim.run(Ctx::GUEST_USER, 30);
        assert_eq!((p.read(fd), sim.state().notifications[&fd]), (30, 4));
        // A counting event refuses a period.
        let c = p.open(&raw(false, false, false)).unwrap();
        p.set_period(c, 10);
        assert_eq!(sim.state().refused.len(), 1);
    }

    #[test]
    fn more_events_than_counters_are_multiplexed_with_times() {
        let sim = Sim::with_counters(2, 100);
        let mut p = sim.perf();
        let req = PerfRequest {
            read_times: true,
            ..raw(false, false, false)
        };
        let fds: Vec<RawFd> = (0..3).map(|_| p.open(&req).unwrap()).collect();
        sim.run(Ctx::GUEST_USER, 3000);
        for fd in fds {
            let c = p.read_count(fd);
            assert_eq!((c.time_enabled, c.time_running), (3000, 2000), "fd {fd}");
            assert_eq!(c.value, 2000);
            assert!(c.multiplexed());
            assert_eq!(c.scaled(), 3000);
        }
    }
}
