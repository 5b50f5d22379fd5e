//! Counter backends: the vPMU model's counters over host perf events on the vCPU thread.
//!
//! [`PerfBackend`] is the model's [`CounterBackend`]; it holds the perf layer ([`PerfSys`]) and
//! the overflow-signal watch, and hands each call to its source:
//! * `soft` ([`Source::Soft`], soft.rs) — perf software task-clock x TSC frequency, cycle
//!   events only; cpu-switch charges the thread's CPU time inside KVM_RUN through the
//!   [`Gate`] (gate.rs: RDTSC on each side of KVM_RUN, a `read(2)` of a thread clock only
//!   after the host switched the thread out).
//! * `hw` ([`Source::Hw`], hw.rs) — perf raw hardware events from the guest's event select.
//!   Needs a host PMU and VT-x/SVM; on hosts without them it runs end to end over a
//!   simulated host PMU (sim_host.rs, `--vpmu-backend sim`: sim.rs's counting core driven by
//!   the vCPU thread's CPU time, split at KVM_RUN into guest and host mode).
//!
//! Accounting modes, the same meaning on both:
//! * cpu-switch — count only inside KVM_RUN (hw: `exclude_host=1`; soft: the gate).
//! * domain-switch — count whenever the vCPU thread runs (KVM and the VMM's exit handling on
//!   that thread included): the host kernel's per-task perf context switch is the save/restore.

mod exit_path;
mod gate;
mod hw;
mod sim;
mod sim_host;
mod soft;
#[cfg(test)]
mod testutil;

use std::os::fd::RawFd;

use vpmu::{AccountingMode, BackendError, CounterBackend, CounterId, Event, Scale};

use super::perf::{PerfRequest, PerfSys};

#[cfg(test)]
use gate::Gate;
pub use sim_host::SimHost;
pub use soft::min_period_ns as min_soft_period_ns;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// perf task-clock, scaled to cycles at `tsc_khz`; cpu-switch leaves `exit_cost_ns` (KVM's
    /// exit path, `vm::host_probe`) out of each KVM_RUN interval; no notification is armed
    /// sooner than [`soft::min_period_ns`] of `notify_cost_ns` (what taking one costs here).
    Soft {
        tsc_khz: u64,
        exit_cost_ns: u64,
        notify_cost_ns: u64,
    },
    /// perf raw hardware events.
    Hw,
}

/// What one source does for the guest's counters (`bit` = [`CounterId::bit`]). The perf layer
/// is passed in: [`PerfBackend`] owns it.
trait SourceBackend: Send {
    fn supports(&self, e: &Event) -> bool;
    fn scale(&self, e: &Event) -> Scale;
    /// See [`CounterBackend::program`].
    fn program(
        &mut self,
        sys: &mut dyn PerfSys,
        bit: u8,
        e: &Event,
        overflow_after: Option<u64>,
    ) -> Result<(), BackendError>;
    fn read(&mut self, sys: &mut dyn PerfSys, bit: u8) -> u64;
    fn stop(&mut self, sys: &mut dyn PerfSys, bit: u8);
    /// After an overflow signal: the counters whose armed point was reached (a bitmap).
    fn overflows(&mut self, sys: &mut dyn PerfSys) -> u64;
    fn enter_guest(&mut self, _sys: &mut dyn PerfSys) {}
    fn leave_guest(&mut self, _sys: &mut dyn PerfSys) {}
    fn set_mode(&mut self, mode: AccountingMode);
    /// Closes every event (the backend is dropped).
    fn close_all(&mut self, sys: &mut dyn PerfSys);
}

enum Imp {
    // Boxed: the soft source carries its gate's exit-path windows, the hw source little.
    Soft(Box<soft::Soft>),
    Hw(hw::Hw),
}

pub(crate) struct PerfBackend {
    imp: Imp,
    sys: Box<dyn PerfSys>,
    /// `sys.sees_guest_transitions()`, asked once.
    tell_transitions: bool,
    signals: crate::vcpu_access::kick::SignalWatch,
}

impl PerfBackend {
    pub(crate) fn new(source: Source, mode: AccountingMode, sys: Box<dyn PerfSys>) -> Self {
        let imp = match source {
            Source::Soft {
                tsc_khz,
                exit_cost_ns,
                notify_cost_ns,
            } => Imp::Soft(Box::new(soft::Soft::new(
                tsc_khz,
                exit_cost_ns,
                notify_cost_ns,
                mode,
            ))),
            Source::Hw => Imp::Hw(hw::Hw::new(mode)),
        };
        PerfBackend {
            imp,
            tell_transitions: sys.sees_guest_transitions(),
            sys,
            signals: Default::default(),
        }
    }

    /// The source and the perf layer, borrowed apart.
    fn parts(&mut self) -> (&mut dyn SourceBackend, &mut dyn PerfSys) {
        let src: &mut dyn SourceBackend = match &mut self.imp {
            Imp::Soft(s) => s.as_mut(),
            Imp::Hw(h) => h,
        };
        (src, self.sys.as_mut())
    }

    fn source(&self) -> &dyn SourceBackend {
        match &self.imp {
            Imp::Soft(s) => s.as_ref(),
            Imp::Hw(h) => h,
        }
    }

    /// For a sampler on the host's side (profile::sampler), not a guest counter: counter `ctr`
    /// counts the soft source's clock (ns of the vCPU thread's time, gated by the accounting
    /// mode) with a notification after `period_ns`. No guest event is involved; the hw source
    /// has no such clock.
    pub(crate) fn program_clock(
        &mut self,
        ctr: CounterId,
        period_ns: u64,
    ) -> Result<(), BackendError> {
        match &mut self.imp {
            Imp::Soft(s) => s.program_clock(self.sys.as_mut(), ctr.bit(), Some(period_ns)),
            Imp::Hw(_) => Err(BackendError::Host(
                "the host profile's clock needs the soft source".into(),
            )),
        }
    }

    /// For a sampler on the host's side (profile::sampler): the next perf notification when
    /// counter `ctr` reaches `at`, counted from now. Soft source only (see
    /// `soft::Soft::notify_at`); nothing on the hw source.
    pub(crate) fn notify_at(&mut self, ctr: CounterId, at: u64) {
        if let Imp::Soft(s) = &mut self.imp {
            s.notify_at(self.sys.as_mut(), ctr, at);
        }
    }

    /// For a sampler on the host's side (profile::sampler), after a signal: the host time
    /// the interruption by counter `ctr`'s notification cost the guest's counting, if that
    /// notification is what came (soft source; see `soft::Soft::interruption_ns`). None
    /// otherwise, and on the hw source (which counts guest mode alone in cpu-switch).
    pub(crate) fn interruption_ns(&mut self, ctr: CounterId) -> Option<u64> {
        match &mut self.imp {
            Imp::Soft(s) => s.interruption_ns(self.sys.as_mut(), ctr),
            Imp::Hw(_) => None,
        }
    }

    #[cfg(test)]
    fn gate(&self) -> Option<&Gate> {
        match &self.imp {
            Imp::Soft(s) => Some(&s.gate),
            Imp::Hw(_) => None,
        }
    }

    /// Host-thread switches seen during outside intervals (soft cpu-switch).
    #[cfg(test)]
    pub(crate) fn switched_intervals(&self) -> u64 {
        self.gate().map_or(0, |g| g.switched_intervals)
    }

    /// Counters (a bitmap of [`CounterId::bit`]s) whose host events perf was seen
    /// multiplexing (more events than the host has counters): their counts are scaled by time
    /// enabled / time running, and each was warned about once. hw source only.
    #[cfg(test)]
    pub(crate) fn multiplexed_counters(&self) -> u64 {
        match &self.imp {
            Imp::Hw(h) => h.multiplexed,
            Imp::Soft(_) => 0,
        }
    }

    /// `read(2)`s of the gate's thread clock (soft cpu-switch).
    #[cfg(test)]
    pub(crate) fn clock_reads(&self) -> u64 {
        self.gate().map_or(0, |g| g.clock_reads)
    }
}

/// Points on a grid of `period` from `*next` (a sampler's sample points, perf's notifications):
/// how many of them `now` has passed (0 if none), moving `*next` to the first one still ahead.
pub(crate) fn periods_passed(now: u64, next: &mut u64, period: u64) -> u64 {
    if now < *next || period == 0 {
        return 0;
    }
    let n = (now - *next) / period + 1;
    *next += n * period;
    n
}

/// Opens `reqs` in order; on a failure closes those already open.
fn open_events(sys: &mut dyn PerfSys, reqs: &[PerfRequest]) -> Result<Vec<RawFd>, BackendError> {
    let mut fds = Vec::new();
    for req in reqs {
        match sys.open(req) {
            Ok(fd) => fds.push(fd),
            Err(err) => {
                close_events(sys, &fds);
                return Err(BackendError::Host(format!(
                    "perf_event_open({:?}): {err}",
                    req.event
                )));
            }
        }
    }
    Ok(fds)
}

fn close_events(sys: &mut dyn PerfSys, fds: &[RawFd]) {
    for &fd in fds {
        sys.close(fd);
    }
}

/// What the VMM's host-side profiler needs of the backend (not part of the guest's model).
impl PerfBackend {
    /// Up to `ns` of what the counters counted since the last entry was a host-side sampler's
    /// interruption of the guest (its timer, signal and exit), not the guest's: forgotten where
    /// the counters count time (counts never go backwards). Returns how much was forgotten.
    pub(crate) fn forget_host_time(&mut self, ns: u64) -> u64 {
        // The hardware source counts guest mode alone in cpu-switch (exclude_host); in
        // domain-switch it cannot tell how many events the interruption before the exit
        // counted (docs/tracing.md, Limits), only the VMM's work after it (`host_work_*`).
        match &mut self.imp {
            Imp::Soft(s) => s.forget_host_time(ns),
            Imp::Hw(_) => 0,
        }
    }

    /// From here to [`Self::host_work_ends`] the VMM does work not on the guest's behalf (a
    /// host-side sample): domain-switch leaves it out of every counter, overflows stay due
    /// where the guest armed them.
    pub(crate) fn host_work_begins(&mut self) {
        let sys = self.sys.as_mut();
        match &mut self.imp {
            Imp::Soft(s) => s.host_work_begins(sys),
            Imp::Hw(h) => h.host_work_begins(sys),
        }
    }

    /// Ends what [`Self::host_work_begins`] began: the host time left out (ns) where the
    /// backend counts time; None where it counts events or left nothing out.
    pub(crate) fn host_work_ends(&mut self) -> Option<u64> {
        let sys = self.sys.as_mut();
        match &mut self.imp {
            Imp::Soft(s) => s.host_work_ends(sys),
            Imp::Hw(h) => {
                h.host_work_ends(sys);
                None
            }
        }
    }
}

impl CounterBackend for PerfBackend {
    fn supports(&self, e: &Event) -> bool {
        self.source().supports(e)
    }

    fn scale(&self, e: &Event) -> Scale {
        self.source().scale(e)
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
        let (src, sys) = self.parts();
        src.program(sys, ctr.bit(), e, overflow_after)
    }

    fn read(&mut self, ctr: CounterId) -> u64 {
        let (src, sys) = self.parts();
        src.read(sys, ctr.bit())
    }

    fn stop(&mut self, ctr: CounterId) {
        let (src, sys) = self.parts();
        src.stop(sys, ctr.bit());
    }

    fn take_overflows(&mut self) -> u64 {
        if !self.signals.take() {
            return 0;
        }
        let (src, sys) = self.parts();
        src.overflows(sys)
    }

    fn enter_guest(&mut self) {
        // Matched here, not through `parts()`: direct calls on the exit path (see
        // `tell_transitions`).
        let sys = self.sys.as_mut();
        match &mut self.imp {
            Imp::Soft(s) => s.enter_guest(sys),
            Imp::Hw(h) => h.enter_guest(sys),
        }
        if self.tell_transitions {
            sys.guest_entry();
        }
    }

    fn set_mode(&mut self, mode: AccountingMode) {
        let (src, _) = self.parts();
        src.set_mode(mode);
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn leave_guest(&mut self) {
        let sys = self.sys.as_mut();
        if self.tell_transitions {
            sys.guest_exit();
        }
        match &mut self.imp {
            Imp::Soft(s) => s.leave_guest(sys),
            Imp::Hw(h) => h.leave_guest(sys),
        }
    }
}

impl Drop for PerfBackend {
    fn drop(&mut self) {
        let (src, sys) = self.parts();
        src.close_all(sys);
    }
}

#[cfg(test)]
mod grid_tests {
    use super::periods_passed;

    #[test]
    fn every_period_that_passed_is_a_sample() {
        let mut next = 100;
        assert_eq!(periods_passed(99, &mut next, 100), 0);
        assert_eq!(next, 100);
        assert_eq!(periods_passed(100, &mut next, 100), 1);
        assert_eq!(next, 200);
        // A long exit: the clock ran 4.5 periods before the loop looked.
        assert_eq!(periods_passed(640, &mut next, 100), 5);
        assert_eq!(next, 700);
        assert_eq!(periods_passed(650, &mut next, 100), 0);
        assert_eq!(periods_passed(5, &mut 0, 0), 0, "no period, no samples");
    }
}
