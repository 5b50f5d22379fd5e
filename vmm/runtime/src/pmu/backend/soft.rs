//! The soft source: one perf *software* task-clock event (thread CPU time, ns) per counter;
//! cycle events (Intel 0x3C and fixed counters 1/2, AMD 0x76) count time x TSC frequency. Runs
//! on any Linux host, including those without a PMU. The guest's USR/OS filter cannot be
//! honoured (thread CPU time does not say which guest ring ran) and is ignored.
//!
//! Both modes run the events all the time (for their overflow signals). cpu-switch charges
//! only the thread's CPU time inside KVM_RUN ([`Gate`]); a counter armed to overflow gets its
//! host period fixed when perf's signal comes early (the host also counted VMM time).
//! Toggling the events instead (two ioctls per counter per exit) charged the guest for its own
//! gating: more than domain-switch counted for the same work (issue 12).
//!
//! Keeping off system calls (costs in docs/vpmu.md): a read makes one `read(2)` and then
//! extrapolates with the TSC while the thread has not been switched out ([`Anchor`]), and
//! re-programming keeps the host event (a new base, and a PERF_EVENT_IOC_PERIOD for a sampling
//! one) instead of closing and reopening it.

use std::collections::BTreeMap;
use std::os::fd::RawFd;

use vpmu::{AccountingMode, ArchEvent, BackendError, CounterId, Event, Scale};

use super::gate::{Anchor, Gate, TscSource};
use super::{close_events, open_events, SourceBackend};
use crate::pmu::perf::{PerfEvent, PerfRequest, PerfSys};

/// Shortest host sample period a soft counter is armed with (ns of thread CPU time): a guest
/// that arms a counter to overflow after 1 cycle must not turn into a signal storm on the host.
pub(super) const MIN_SOFT_PERIOD_NS: u64 = 50_000;
/// ... and at least this many notifications' worth (the host probe's cost of taking one: the
/// signal's delivery and the exit it ends): perf's sampling event fires every period of thread
/// CPU time, and taking a notification is itself thread CPU time. Where that costs more than
/// the period, notifications queue up without end and the guest starves: on the SVM host under
/// QEMU's emulator (a 40 µs exit, a signal's delivery slower still) a 50 µs period overflowed
/// the thread's real-time signal queue, and a 270 µs re-arm of the host-side profile's
/// sampler left ~16,000 signals queued and the guest running one instruction a second.
pub(super) const MIN_SOFT_PERIOD_NOTIFICATIONS: u64 = 10;
/// The most times the floor of an early notification's re-arm doubles (see
/// [`Soft::rest_floor_ns`]): 50 us x 2^8 = 12.8 ms.
const MAX_EARLY_DOUBLINGS: u32 = 8;

/// The shortest period a soft source arms on a host where taking one notification costs
/// `notify_cost_ns` (0: not measured).
pub fn min_period_ns(notify_cost_ns: u64) -> u64 {
    MIN_SOFT_PERIOD_NS.max(MIN_SOFT_PERIOD_NOTIFICATIONS.saturating_mul(notify_cost_ns))
}

struct SoftCounter {
    fd: RawFd,
    /// Backend units at which to report an overflow.
    armed: Option<u64>,
    /// The last value `count` returned (reads never go backwards).
    last: u64,
    /// The count when the counter was last programmed: of its host event (reused: see
    /// `reprogram`), or of the gate's guest time in cpu-switch.
    base: u64,
    /// The host count, TSC and switch sequence of the last `read(2)` of the event.
    anchor: Option<Anchor>,
    /// A sampling event: its period and the host count at which perf notifies next (perf
    /// notifies each time the count passes a multiple of the period from its last
    /// PERF_EVENT_IOC_PERIOD, or from its opening).
    notify: Option<Notify>,
    /// Since the counter was last armed for a whole period: how many times the floor of its
    /// early re-arms doubled, and the guest's rest (counter units) at the last early re-arm.
    early: Early,
}

#[derive(Clone, Copy, Default)]
struct Early {
    doublings: u32,
    rest: Option<u64>,
}

#[derive(Clone, Copy)]
struct Notify {
    period: u64,
    next: u64,
}

pub(super) struct Soft {
    tsc_khz: u64,
    mode: AccountingMode,
    counters: BTreeMap<u8, SoftCounter>,
    pub(super) gate: Gate,
    /// The thread's CPU time when host work the guest is not charged for began (domain-switch).
    host_work_from: Option<u64>,
    /// The shortest host sample period here: [`MIN_SOFT_PERIOD_NS`], or
    /// [`MIN_SOFT_PERIOD_NOTIFICATIONS`] notifications where they cost more.
    min_period_ns: u64,
}

impl Soft {
    #[cfg(test)]
    pub(super) fn tsc_khz(&self) -> u64 {
        self.tsc_khz
    }

    pub(super) fn new(
        tsc_khz: u64,
        exit_cost_ns: u64,
        notify_cost_ns: u64,
        mode: AccountingMode,
    ) -> Soft {
        // Tests and users compare a guest's cycles / task-clock with this (docs/vpmu.md).
        log::info!(
            "soft counter backend: cycle events count thread CPU time at the TSC rate, {tsc_khz} kHz \
             (nominal frequency); only cycle events count"
        );
        Soft {
            tsc_khz,
            mode,
            counters: BTreeMap::new(),
            gate: Gate::new(TscSource::Cpu, tsc_khz, exit_cost_ns),
            host_work_from: None,
            min_period_ns: min_period_ns(notify_cost_ns),
        }
    }

    /// Whether the gate charges (cpu-switch).
    fn gates(&self) -> bool {
        self.mode == AccountingMode::CpuSwitch
    }

    /// What counter `bit` counts now, from its zero (`base`): the gate's guest time in
    /// cpu-switch, else its host event.
    fn source_now(&mut self, sys: &mut dyn PerfSys, bit: u8) -> u64 {
        if self.gates() {
            self.gate.guest_ns(sys)
        } else {
            self.raw(sys, bit)
        }
    }

    /// What the host event of counter `bit` has counted since it was opened.
    fn raw(&mut self, sys: &mut dyn PerfSys, bit: u8) -> u64 {
        let (now, seq) = (self.gate.now(), self.gate.seq());
        let Some(c) = self.counters.get(&bit) else {
            return 0;
        };
        if let Some(v) = self.gate.extrapolate(c.anchor, now, seq) {
            return v;
        }
        let v = sys.read(c.fd);
        if self.gate.watching() {
            if let Some(c) = self.counters.get_mut(&bit) {
                c.anchor = Some(Anchor {
                    count: v,
                    tsc: now,
                    seq,
                });
            }
        }
        v
    }

    fn count(&mut self, sys: &mut dyn PerfSys, bit: u8) -> u64 {
        if !self.counters.contains_key(&bit) {
            return 0;
        }
        let now = self.source_now(sys, bit);
        let Some(c) = self.counters.get_mut(&bit) else {
            return 0;
        };
        c.last = now.saturating_sub(c.base).max(c.last);
        c.last
    }

    /// Re-programs an open counter in place when the host event can stay (every soft counter
    /// is the same task-clock event): it counts from a new base, and a sampling event gets its
    /// new period (PERF_EVENT_IOC_PERIOD, which restarts it). Closing and opening the event
    /// instead costs a perf_event_open, three fcntls and a close (~15-30 us here) on every
    /// re-arm after an overflow and every counter write. Returns false if the event must be
    /// (re)opened: none yet, or counting-only vs sampling changes.
    fn reprogram(&mut self, sys: &mut dyn PerfSys, bit: u8, overflow_after: Option<u64>) -> bool {
        let reusable = matches!(self.counters.get(&bit),
            Some(c) if c.armed.is_some() == overflow_after.is_some());
        if !reusable {
            return false;
        }
        if self.gates() {
            self.gate.open_clock(sys);
        }
        let base = self.source_now(sys, bit);
        if let Some(p) = overflow_after {
            self.arm(sys, bit, p, false);
        }
        if let Some(c) = self.counters.get_mut(&bit) {
            c.base = base;
            c.armed = overflow_after;
            c.last = 0;
            c.early = Early::default();
        }
        true
    }

    /// Sets the sampling event of counter `bit` to notify `period` ns of thread CPU time from
    /// now (at least `min_period_ns`). With `track`, notes where (for
    /// [`take_notification_lag`](Self::take_notification_lag); it reads the host count, which
    /// may cost a `read(2)`: only the host-side sampler's re-arm asks for it, not the guest's
    /// counters on the PMI path).
    fn arm(&mut self, sys: &mut dyn PerfSys, bit: u8, period: u64, track: bool) {
        self.arm_no_sooner(sys, bit, period, track, self.min_period_ns);
    }

    /// [`arm`](Self::arm) with a floor of its own.
    fn arm_no_sooner(
        &mut self,
        sys: &mut dyn PerfSys,
        bit: u8,
        period: u64,
        track: bool,
        floor: u64,
    ) {
        let period = period.max(floor);
        let now = track.then(|| self.raw(sys, bit));
        if let Some(c) = self.counters.get_mut(&bit) {
            sys.set_period(c.fd, period);
            c.notify = now.map(|now| Notify {
                period,
                next: now + period,
            });
        }
    }

    /// How long ago (ns of thread CPU time) perf's last notification for counter `bit` fell
    /// due, if one did since the last call (else None: the signal that brought the VMM here was
    /// not this counter's). The notification is then taken: the next call looks for the one
    /// after it.
    fn take_notification_lag(&mut self, sys: &mut dyn PerfSys, bit: u8) -> Option<u64> {
        let now = self.raw(sys, bit);
        let n = self.counters.get_mut(&bit)?.notify.as_mut()?;
        (super::periods_passed(now, &mut n.next, n.period) > 0).then(|| now - (n.next - n.period))
    }

    /// The floor of the re-arm after counter `bit`'s early notification, with `rest` of the
    /// guest's period still to run: [`MIN_SOFT_PERIOD_NS`], doubled each time the guest ran
    /// less than half the floor since the last early re-arm (at most [`MAX_EARLY_DOUBLINGS`]
    /// times; back to the fixed floor when the counter is armed for a new period). Usually one
    /// notification in a period is early (the host also counted the VMM's time) and the fixed
    /// floor holds: `min_period_ns` there delayed the guest's PMI by up to that much and moved
    /// the tiny guest's samples from one function to the next. But where taking a notification
    /// costs the thread as much as that floor (the nested SVM host on the wall clock: a 40 us
    /// exit, a signal's delivery slower still), each re-arm's period would go on the VMM's
    /// handling of the last one and the guest would gain nothing: a livelock just short of the
    /// overflow. Doubling ends it within a few re-arms. (Other counters' signals re-arm this one
    /// too, with the guest's progress in between: no doubling.)
    fn rest_floor_ns(&mut self, bit: u8, rest: u64) -> u64 {
        let Some(c) = self.counters.get_mut(&bit) else {
            return MIN_SOFT_PERIOD_NS;
        };
        let floor = MIN_SOFT_PERIOD_NS << c.early.doublings;
        let ran = c.early.rest.map(|before| before.saturating_sub(rest));
        if ran.is_some_and(|ran| ran < floor / 2) {
            c.early.doublings = (c.early.doublings + 1).min(MAX_EARLY_DOUBLINGS);
        }
        c.early.rest = Some(rest);
        MIN_SOFT_PERIOD_NS << c.early.doublings
    }

    /// `ns` of thread CPU time since the last entry was the host's, not the guest's (see
    /// [`super::PerfBackend::forget_host_time`]): cpu-switch takes it off the gate's last
    /// KVM_RUN interval (at most all of it); domain-switch moves every counter's zero forward
    /// by it (a counter then stands still until it has counted that much again: counts never
    /// go backwards, see `count`).
    pub(super) fn forget_host_time(&mut self, ns: u64) -> u64 {
        if self.gates() {
            self.gate.forget(ns)
        } else {
            for c in self.counters.values_mut() {
                c.base = c.base.saturating_add(ns);
            }
            ns
        }
    }

    /// Host work the guest is not charged for begins (see
    /// [`super::PerfBackend::host_work_begins`]): in domain-switch, notes the thread's CPU
    /// time (every soft counter counts it); cpu-switch counts nothing outside KVM_RUN.
    pub(super) fn host_work_begins(&mut self, sys: &mut dyn PerfSys) {
        self.host_work_from = match self.counters.keys().next() {
            Some(&bit) if !self.gates() => Some(self.raw(sys, bit)),
            _ => None,
        };
    }

    /// ... and ends: the thread's CPU time since is forgotten (`forget_host_time`); returns it.
    pub(super) fn host_work_ends(&mut self, sys: &mut dyn PerfSys) -> Option<u64> {
        let from = self.host_work_from.take()?;
        let &bit = self.counters.keys().next()?;
        let ns = self.raw(sys, bit).saturating_sub(from);
        Some(self.forget_host_time(ns))
    }

    /// For a sampler on the host's side (profile::sampler), after a signal: how much host time
    /// the guest was charged for the interruption, if counter `ctr`'s notification is what
    /// interrupted it (else None). The thread's CPU time since perf's notification fell due,
    /// less, in cpu-switch, what of it ran after KVM_RUN returned (not charged there); in
    /// domain-switch all of it (charged until the next entry, and more after this call).
    pub(super) fn interruption_ns(&mut self, sys: &mut dyn PerfSys, ctr: CounterId) -> Option<u64> {
        let lag = self.take_notification_lag(sys, ctr.bit())?;
        if self.gates() {
            Some(lag.saturating_sub(self.gate.since_leave(sys)))
        } else {
            Some(lag)
        }
    }

    /// For a sampler on the host's side (profile::sampler): the next perf notification when
    /// counter `ctr` reaches `at`, counted from now, and where perf's count will then be (for
    /// [`interruption_ns`](Self::interruption_ns)). In cpu-switch perf's own period also runs
    /// outside KVM_RUN: without this, a notification due during the VMM's work on an exit
    /// would take its sample there, at the instruction that caused the exit, and charge VMM
    /// work to that instruction in the mode that must not count it. With it, the notification
    /// comes when the guest itself has run the rest of the period, inside KVM_RUN, as a
    /// hardware counter's would. In domain-switch it keeps perf's notifications on the
    /// sampler's grid (and where they fall known) however many periods pass.
    pub(super) fn notify_at(&mut self, sys: &mut dyn PerfSys, ctr: CounterId, at: u64) {
        let v = self.count(sys, ctr.bit());
        self.arm(sys, ctr.bit(), at.saturating_sub(v), true);
    }

    /// Counter `bit` counts this source's clock (ns of the vCPU thread's time, gated by the
    /// accounting mode), notifying after `overflow_after` ns: what every guest cycles event
    /// counts here, and what the VMM's own sampler counts ([`super::PerfBackend::program_clock`]).
    pub(super) fn program_clock(
        &mut self,
        sys: &mut dyn PerfSys,
        bit: u8,
        overflow_after: Option<u64>,
    ) -> Result<(), BackendError> {
        if self.reprogram(sys, bit, overflow_after) {
            return Ok(());
        }
        self.stop(sys, bit);
        self.gate.watch_switches(sys);
        if self.gates() {
            self.gate.open_clock(sys);
        }
        let req = PerfRequest {
            sample_period: overflow_after.map(|p| p.max(self.min_period_ns)),
            ..PerfRequest::counting(PerfEvent::TaskClock)
        };
        let fd = open_events(sys, &[req])?[0];
        // A new host event counts from 0; the gate's guest time from where it stands.
        let base = if self.gates() {
            self.gate.guest_ns(sys)
        } else {
            0
        };
        let c = SoftCounter {
            fd,
            armed: overflow_after,
            last: 0,
            base,
            anchor: None,
            notify: req.sample_period.map(|period| Notify {
                period,
                next: period,
            }),
            early: Early::default(),
        };
        self.counters.insert(bit, c);
        Ok(())
    }
}

/// Cycle events only; not cycles qualified to TSX transactions (IN_TX/IN_TXCP), which thread CPU
/// time cannot tell apart.
fn soft_counts(e: &Event) -> bool {
    matches!(
        e.arch_event(),
        Some(ArchEvent::CoreCycles | ArchEvent::RefCycles)
    ) && !e.in_tx
        && !e.in_tx_cp
}

impl SourceBackend for Soft {
    fn supports(&self, e: &Event) -> bool {
        soft_counts(e)
    }

    fn scale(&self, _e: &Event) -> Scale {
        // ns of thread CPU time -> cycles at the TSC rate.
        Scale::new(self.tsc_khz.max(1), 1_000_000)
    }

    fn program(
        &mut self,
        sys: &mut dyn PerfSys,
        bit: u8,
        _e: &Event,
        overflow_after: Option<u64>,
    ) -> Result<(), BackendError> {
        // Every event the soft source supports counts the same clock.
        self.program_clock(sys, bit, overflow_after)
    }

    fn read(&mut self, sys: &mut dyn PerfSys, bit: u8) -> u64 {
        self.count(sys, bit)
    }

    fn stop(&mut self, sys: &mut dyn PerfSys, bit: u8) {
        if let Some(c) = self.counters.remove(&bit) {
            close_events(sys, &[c.fd]);
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
            let v = self.count(sys, bit);
            if v >= at {
                bits |= 1 << bit;
            } else {
                // Early: the host also counted time outside KVM_RUN (cpu-switch), or time the
                // counter was told to forget (`forget_host_time`). Ask for a notification when
                // the rest of the guest's period has run (perf restarts the period now), plus,
                // in cpu-switch, the exit path the gate will leave out of the interval that
                // notification ends (else a rest shorter than it never counts down: a storm).
                let exit_path = if self.gates() {
                    self.gate.exit_path_ns()
                } else {
                    0
                };
                let floor = self.rest_floor_ns(bit, at - v);
                self.arm_no_sooner(sys, bit, at - v + exit_path, false, floor);
            }
        }
        bits
    }

    fn enter_guest(&mut self, sys: &mut dyn PerfSys) {
        if self.gates() {
            self.gate.enter(sys);
        }
    }

    fn leave_guest(&mut self, sys: &mut dyn PerfSys) {
        if self.gates() {
            self.gate.leave(sys);
        }
    }

    fn set_mode(&mut self, mode: AccountingMode) {
        // The model re-programs every running counter right after this; cpu-switch charges
        // from the next KVM_RUN (we are outside it).
        if mode != self.mode {
            self.gate.restart();
        }
        self.mode = mode;
    }

    fn close_all(&mut self, sys: &mut dyn PerfSys) {
        let bits: Vec<u8> = self.counters.keys().copied().collect();
        for b in bits {
            self.stop(sys, b);
        }
        self.gate.close(sys);
    }
}

#[cfg(test)]
mod tests {
    use super::super::gate::MAX_ANCHOR_AGE_TSC;
    use super::super::testutil::*;
    use super::super::{PerfBackend, Source};
    use super::*;
    use std::sync::{Arc, Mutex};
    use vpmu::{CounterBackend, Vendor};

    #[test]
    fn soft_counts_only_cycles_and_scales_to_tsc() {
        let (b, _) = backend(
            Source::Soft {
                tsc_khz: 2_600_000,
                exit_cost_ns: 0,
                notify_cost_ns: 0,
            },
            AccountingMode::DomainSwitch,
        );
        assert!(b.supports(&event(Vendor::Amd, 0x76, 0, true, true)));
        assert!(b.supports(&event(Vendor::Intel, 0x3c, 0, true, true)));
        assert!(b.supports(&event(Vendor::Intel, 0x3c, 1, true, true)));
        assert!(!b.supports(&event(Vendor::Intel, 0xc0, 0, true, true)));
        assert!(!b.supports(&event(Vendor::Amd, 0xc0, 0, true, true)));
        let in_tx = Event {
            in_tx: true,
            ..event(Vendor::Intel, 0x3c, 0, true, true)
        };
        assert!(!b.supports(&in_tx), "cycles inside TSX transactions");
        let fixed_cycles = Event {
            fixed: Some(1),
            ..event(Vendor::Intel, 0, 0, true, true)
        };
        assert!(b.supports(&fixed_cycles));
        assert_eq!(b.scale(&fixed_cycles).to_guest(1_000_000), 2_600_000);
    }

    #[test]
    fn soft_cpu_switch_counts_time_inside_kvm_run_without_syscalls_per_exit() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = soft_backend(AccountingMode::CpuSwitch);
        b.leave_guest();
        b.program(CounterId::gp(0), &e, None).unwrap();
        // The switch-recording event, the gate's thread clock, then the counter; all run from
        // the start.
        {
            let l = log.lock().unwrap();
            assert_eq!(l.opened.len(), 3);
            assert!(l.opened.iter().all(|r| !r.disabled));
            assert_eq!(l.opened[0].event, PerfEvent::SwitchRecords);
            assert_eq!(l.opened[1].event, PerfEvent::TaskClock);
            assert_eq!(l.opened[2].event, PerfEvent::TaskClock);
        }
        for _ in 0..100 {
            exit_cycle(&mut b, &log, 1000, 300);
        }
        // Read outside KVM_RUN, 300 ns into the current exit: the guest's 100 x 1000 ns only.
        assert_eq!(b.read(CounterId::gp(0)), 100_000);
        assert_eq!(b.clock_reads(), 1, "one read(2) of the clock, then the TSC");

        // domain-switch charges everything.
        let (mut b, log) = soft_backend(AccountingMode::DomainSwitch);
        b.program(CounterId::gp(0), &e, None).unwrap();
        for _ in 0..100 {
            exit_cycle(&mut b, &log, 1000, 300);
        }
        assert_eq!(b.read(CounterId::gp(0)), 130_000);
    }

    #[test]
    fn soft_reads_extrapolate_with_the_tsc_until_the_thread_is_switched_out() {
        let log = Arc::new(Mutex::new(Log::default()));
        let reads = Arc::new(Mutex::new(0));
        let mut b = PerfBackend::new(
            Source::Soft {
                tsc_khz: 1_000_000,
                exit_cost_ns: 0,
                notify_cost_ns: 0,
            },
            AccountingMode::DomainSwitch,
            Box::new(CountingReads(FakePerf(log.clone()), reads.clone())),
        );
        with_fake_tsc(&mut b);
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        b.program(CounterId::gp(0), &e, None).unwrap();
        for i in 1..=10 {
            exit_cycle(&mut b, &log, 1000, 300);
            assert_eq!(b.read(CounterId::gp(0)), i * 1300);
        }
        assert_eq!(*reads.lock().unwrap(), 1, "one read(2), then the TSC");
        // Switched out for 5 ms (not counted by the host event): read(2) again.
        wait(&log, 5_000_000, false);
        assert_eq!(b.read(CounterId::gp(0)), 13_000);
        assert_eq!(*reads.lock().unwrap(), 2);
        // And after MAX_ANCHOR_AGE_TSC, even without a switch.
        run(&log, MAX_ANCHOR_AGE_TSC);
        assert_eq!(b.read(CounterId::gp(0)), 13_000 + MAX_ANCHOR_AGE_TSC);
        assert_eq!(*reads.lock().unwrap(), 3);
    }

    #[test]
    fn soft_cpu_switch_rearms_an_early_overflow_signal_for_the_rest_of_the_period() {
        crate::vcpu_access::kick::install_handler().unwrap();
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = soft_backend(AccountingMode::CpuSwitch);
        b.leave_guest();
        b.program(CounterId::gp(0), &e, Some(1_000_000)).unwrap();
        assert_eq!(log.lock().unwrap().opened[2].sample_period, Some(1_000_000));
        // perf's period ran out on host time: 800 us in the guest, 200 us outside.
        for _ in 0..800 {
            exit_cycle(&mut b, &log, 1000, 250);
        }
        // (the fake count: 800 x 1250 = 1 ms of host time)
        assert_eq!(kick_and_take_overflows(&mut b), 0, "not yet in guest time");
        assert_eq!(log.lock().unwrap().periods, vec![(103, 200_000)]);
        for _ in 0..200 {
            exit_cycle(&mut b, &log, 1000, 250);
        }
        assert_eq!(kick_and_take_overflows(&mut b), 1);
        assert_eq!(log.lock().unwrap().periods.len(), 1);
    }

    /// When a notification costs the thread about the fixed floor, the guest must still reach
    /// its overflow: each early re-arm after which the guest ran less than half the floor
    /// doubles the floor; one with progress keeps it; a new period starts from the fixed floor.
    #[test]
    fn early_rearms_without_guest_progress_double_their_floor() {
        crate::vcpu_access::kick::install_handler().unwrap();
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = soft_backend(AccountingMode::CpuSwitch);
        let last_period = |log: &Arc<Mutex<Log>>| log.lock().unwrap().periods.last().unwrap().1;
        b.leave_guest();
        b.program(CounterId::gp(0), &e, Some(1_000_000)).unwrap();
        // 800 us in the guest, 200 us outside: early, the rest (200 us) asked for.
        for _ in 0..800 {
            exit_cycle(&mut b, &log, 1000, 250);
        }
        assert_eq!(kick_and_take_overflows(&mut b), 0);
        assert_eq!(last_period(&log), 200_000);
        // The guest ran 180 us of it: 20 us left, asked for at the fixed floor.
        exit_cycle(&mut b, &log, 180_000, 20_000);
        assert_eq!(kick_and_take_overflows(&mut b), 0);
        assert_eq!(last_period(&log), MIN_SOFT_PERIOD_NS);
        // The notification's handling ate that floor: 5 us in the guest, then 10 us, then 5 us
        // (each less than half the floor): the floor doubles each time.
        exit_cycle(&mut b, &log, 5_000, 45_000);
        assert_eq!(kick_and_take_overflows(&mut b), 0);
        assert_eq!(last_period(&log), 2 * MIN_SOFT_PERIOD_NS);
        exit_cycle(&mut b, &log, 10_000, 90_000);
        assert_eq!(kick_and_take_overflows(&mut b), 0);
        assert_eq!(last_period(&log), 4 * MIN_SOFT_PERIOD_NS);
        exit_cycle(&mut b, &log, 5_000, 195_000);
        assert_eq!(
            kick_and_take_overflows(&mut b),
            1,
            "the guest's period has run"
        );
        // A new period: an early notification's re-arm starts from the fixed floor again.
        b.program(CounterId::gp(0), &e, Some(1_000_000)).unwrap();
        exit_cycle(&mut b, &log, 990_000, 10_000);
        assert_eq!(kick_and_take_overflows(&mut b), 0);
        assert_eq!(last_period(&log), MIN_SOFT_PERIOD_NS);
    }

    /// A host-side sampler's interruption (profile::sampler): how much host time since perf's
    /// notification fell due the guest was charged, and forgetting it.
    #[test]
    fn a_samplers_interruption_is_measured_and_forgotten_in_cpu_switch() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = soft_backend(AccountingMode::CpuSwitch);
        b.leave_guest();
        let ctr = CounterId::gp(0);
        b.program(ctr, &e, Some(1_000_000)).unwrap();
        // perf notifies after 1 ms of thread time; no exit until then. The guest runs 1 ms, the
        // host 30 us more inside KVM_RUN (its timer, the signal, the exit), then the VMM 5 us.
        b.enter_guest();
        run(&log, 1_000_000);
        run(&log, 30_000);
        b.leave_guest();
        run(&log, 5_000);
        assert_eq!(b.read(ctr), 1_030_000, "charged until KVM_RUN returned");
        assert_eq!(b.interruption_ns(ctr), Some(30_000));
        assert_eq!(
            b.interruption_ns(ctr),
            None,
            "taken: no second notification yet"
        );
        b.forget_host_time(30_000);
        assert_eq!(b.read(ctr), 1_030_000, "a count never goes backwards");
        exit_cycle(&mut b, &log, 40_000, 1000);
        assert_eq!(b.read(ctr), 1_040_000, "the guest's 1.04 ms");
        // At most the last interval: earlier guest time is never taken.
        b.forget_host_time(1_000_000);
        exit_cycle(&mut b, &log, 100_000, 1000);
        assert_eq!(b.read(ctr), 1_100_000);
    }

    #[test]
    fn a_samplers_interruption_is_forgotten_in_domain_switch_and_overflows_come_late_not_never() {
        crate::vcpu_access::kick::install_handler().unwrap();
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = soft_backend(AccountingMode::DomainSwitch);
        let (sampler, guest) = (CounterId::gp(0), CounterId::gp(1));
        b.program(sampler, &e, Some(1_000_000)).unwrap();
        b.program(guest, &e, Some(2_000_000)).unwrap();
        // Domain-switch: everything on the thread counts, up to the VMM's read 40 us after
        // perf's notification fell due.
        run(&log, 1_040_000);
        assert_eq!(b.interruption_ns(sampler), Some(40_000));
        assert_eq!(
            b.interruption_ns(guest),
            None,
            "not this one's notification"
        );
        assert_eq!(
            b.read(guest),
            1_040_000,
            "read by the guest before the forget"
        );
        b.forget_host_time(40_000);
        assert_eq!(b.read(guest), 1_040_000, "stands still...");
        run(&log, 20_000);
        assert_eq!(b.read(guest), 1_040_000);
        run(&log, 60_000);
        assert_eq!(
            b.read(guest),
            1_080_000,
            "...until it has counted that again"
        );
        // perf notifies the guest's counter at 2 ms of thread time, 40 us before the guest
        // counted its 2 ms: the signal is early and the rest is asked for.
        run(&log, 880_000);
        // (The sampler's counter, bit 0, is past its own point: reported, not re-armed.)
        assert_eq!(kick_and_take_overflows(&mut b), 1 << 0);
        assert_eq!(log.lock().unwrap().periods, vec![(103, 50_000)]);
        run(&log, 50_000);
        assert_eq!(kick_and_take_overflows(&mut b) & (1 << 1), 1 << 1);
    }

    #[test]
    fn a_samples_work_is_left_out_in_domain_switch_only() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let ctr = CounterId::gp(0);
        let (mut b, log) = soft_backend(AccountingMode::DomainSwitch);
        b.program(ctr, &e, None).unwrap();
        run(&log, 100_000);
        b.host_work_begins();
        run(&log, 25_000);
        assert_eq!(b.host_work_ends(), Some(25_000), "the VMM's sample work");
        assert_eq!(b.read(ctr), 100_000, "left out");
        run(&log, 10_000);
        assert_eq!(b.read(ctr), 110_000, "what follows counts");
        assert_eq!(b.host_work_ends(), None, "nothing began");
        // cpu-switch counts nothing outside KVM_RUN: nothing to leave out.
        let (mut b, log) = soft_backend(AccountingMode::CpuSwitch);
        b.program(ctr, &e, None).unwrap();
        exit_cycle(&mut b, &log, 100_000, 1000);
        b.host_work_begins();
        run(&log, 25_000);
        assert_eq!(b.host_work_ends(), None);
        assert_eq!(b.read(ctr), 100_000);
    }

    #[test]
    fn switching_to_cpu_switch_starts_gating_from_there() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = soft_backend(AccountingMode::DomainSwitch);
        b.program(CounterId::gp(0), &e, None).unwrap();
        exit_cycle(&mut b, &log, 1000, 300);
        assert_eq!(b.read(CounterId::gp(0)), 1300);
        b.set_mode(AccountingMode::CpuSwitch);
        b.program(CounterId::gp(0), &e, None).unwrap();
        for _ in 0..10 {
            exit_cycle(&mut b, &log, 1000, 300);
        }
        assert_eq!(b.read(CounterId::gp(0)), 10_000);
        // And back: domain-switch counts the host event from its re-programming.
        b.set_mode(AccountingMode::DomainSwitch);
        b.program(CounterId::gp(0), &e, None).unwrap();
        exit_cycle(&mut b, &log, 1000, 300);
        assert_eq!(b.read(CounterId::gp(0)), 1300);
    }

    #[test]
    fn soft_reprogramming_keeps_the_host_event() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = soft_backend(AccountingMode::DomainSwitch);
        b.program(CounterId::gp(0), &e, Some(1_000_000)).unwrap();
        exit_cycle(&mut b, &log, 1000, 300);
        assert_eq!(b.read(CounterId::gp(0)), 1300);
        // Re-armed after an overflow: same fd, new period, counts from 0 again.
        b.program(CounterId::gp(0), &e, Some(7)).unwrap();
        assert_eq!(b.read(CounterId::gp(0)), 0);
        exit_cycle(&mut b, &log, 1000, 300);
        assert_eq!(b.read(CounterId::gp(0)), 1300);
        {
            let l = log.lock().unwrap();
            assert_eq!(l.opened.len(), 2, "switch records + one task-clock");
            assert!(l.closed.is_empty());
            assert_eq!(l.periods, vec![(102, MIN_SOFT_PERIOD_NS)]);
        }
        // Counting-only cannot become sampling in place (perf refuses a period): reopened.
        b.program(CounterId::gp(0), &e, None).unwrap();
        let l = log.lock().unwrap();
        assert_eq!((l.opened.len(), l.closed.clone()), (3, vec![102]));
    }

    /// The Linux perf driver re-arming a counter (AMD PerfMonV2: global off, PERF_CTL0,
    /// PERF_CTR0 = -period, global on) through the model: without deferral the global off
    /// stops the counter (close) and the global on programs it anew (open); deferred, the
    /// entry's one `program` keeps the host event and only sets its period.
    #[test]
    fn a_deferred_rearm_keeps_the_host_event() {
        const CTL: u32 = 0xc001_0200;
        const CTR: u32 = 0xc001_0201;
        const GLOBAL_CTL: u32 = 0xc000_0301;
        let sel = 0x76 | 1 << 16 | 1 << 17 | 1 << 20 | 1 << 22; // cycles, USR, OS, INT, EN
        let period = 1_000_000u64;
        let mut syscalls = Vec::new();
        for deferred in [false, true] {
            let (b, log) = backend(
                Source::Soft {
                    tsc_khz: 1_000_000,
                    exit_cost_ns: 0,
                    notify_cost_ns: 0,
                },
                AccountingMode::DomainSwitch,
            );
            let config = vpmu::PmuConfig::Amd(vpmu::AmdConfig::PerfMonV2 { counters: 6 });
            let mut pmu = vpmu::Pmu::new(config, Box::new(b)).unwrap();
            pmu.set_deferred_reprogram(deferred);
            pmu.wrmsr(CTL, sel).unwrap();
            pmu.wrmsr(CTR, period.wrapping_neg() & ((1 << 48) - 1))
                .unwrap();
            pmu.reprogram_dirty();
            let before = {
                let l = log.lock().unwrap();
                (l.opened.len(), l.closed.len(), l.periods.len())
            };
            pmu.wrmsr(GLOBAL_CTL, 0).unwrap();
            pmu.wrmsr(CTL, sel).unwrap();
            pmu.wrmsr(CTR, period.wrapping_neg() & ((1 << 48) - 1))
                .unwrap();
            pmu.wrmsr(GLOBAL_CTL, 0x3f).unwrap();
            pmu.reprogram_dirty();
            let l = log.lock().unwrap();
            syscalls.push((
                l.opened.len() - before.0,
                l.closed.len() - before.1,
                l.periods.len() - before.2,
            ));
        }
        // (opens, closes, IOC_PERIODs) per re-arm: eager, deferred.
        assert_eq!(syscalls, [(1, 1, 0), (0, 0, 1)]);
    }

    #[test]
    fn tiny_periods_are_clamped() {
        let (mut b, log) = soft_backend(AccountingMode::DomainSwitch);
        b.program(
            CounterId::gp(1),
            &event(Vendor::Amd, 0x76, 0, true, true),
            Some(1),
        )
        .unwrap();
        assert_eq!(
            log.lock().unwrap().opened.last().unwrap().sample_period,
            Some(MIN_SOFT_PERIOD_NS)
        );
    }

    #[test]
    fn unsupported_events_are_refused() {
        let (mut b, log) = backend(
            Source::Soft {
                tsc_khz: 1,
                exit_cost_ns: 0,
                notify_cost_ns: 0,
            },
            AccountingMode::CpuSwitch,
        );
        let e = event(Vendor::Intel, 0xc0, 0, true, true);
        assert!(matches!(
            b.program(CounterId::gp(0), &e, None),
            Err(BackendError::Unsupported(_))
        ));
        assert!(log.lock().unwrap().opened.is_empty());
    }
}
