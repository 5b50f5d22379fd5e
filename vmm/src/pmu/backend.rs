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
//! * cpu-switch — count only inside KVM_RUN. hw: `exclude_host=1` makes the hardware do it.
//!   soft: the events run all the time and the backend subtracts the time spent outside KVM_RUN
//!   ([`Gate`]: an RDTSC on each side of KVM_RUN, no system call per exit). Toggling the events
//!   instead (two ioctls per counter per exit) charged the guest for its own gating: more than
//!   domain-switch counted for the same work (issue 12). A counter armed to overflow gets its
//!   host period fixed when perf's signal comes early (the host counted VMM time too).
//! * domain-switch — count whenever the vCPU thread runs (KVM and the VMM's exit handling on
//!   that thread included): the host kernel's per-task perf context switch is the save/restore.
//!   soft: always enabled; hw: a guest-mode event with the guest's filters plus a host-mode event
//!   (exclude_guest) for the work done on the guest's behalf, summed.
//!
//! Keeping the soft path off system calls (costs in docs/vpmu.md, "Costs"): a soft counter read
//! makes one `read(2)` and then extrapolates with the TSC while the thread has not been switched
//! out ([`Anchor`]), and re-programming a soft counter keeps its host event (a new base, and a
//! PERF_EVENT_IOC_PERIOD for a sampling one) instead of closing and reopening it.

use std::collections::BTreeMap;
use std::os::fd::RawFd;

use vpmu::{
    AccountingMode, ArchEvent, BackendError, CounterBackend, CounterId, Event, Scale, Vendor,
};

use super::perf::{PerfEvent, PerfRequest, PerfSys, SwitchSeq};

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
    /// Backend units at which to report an overflow.
    armed: Option<u64>,
    /// Soft cpu-switch: [`Gate::outside_now`] when the counter was programmed.
    outside_at_program: u64,
    /// The last value `read` returned (reads never go backwards).
    last: u64,
    /// The host count when the counter was last programmed (soft events are reused: see
    /// `program`).
    base: u64,
    /// Soft source: the host count, TSC and switch sequence of the last `read(2)` of the event.
    /// While the thread has not been switched out since, the count has advanced exactly with
    /// the TSC (thread CPU time = wall time on the CPU), so reads need no system call.
    anchor: Option<Anchor>,
}

#[derive(Clone, Copy)]
struct Anchor {
    count: u64,
    tsc: u64,
    seq: u64,
}

/// Longest a soft counter is extrapolated from one `read(2)` (TSC cycles at 1 GHz: 10 ms; more
/// at faster TSCs, still short enough that TSC-vs-sched_clock drift is nothing).
const MAX_ANCHOR_AGE_TSC: u64 = 10_000_000;

/// Soft cpu-switch gating by subtraction: the TSC time the vCPU thread spends outside KVM_RUN,
/// taken with an RDTSC on each side of it. Wall time outside KVM_RUN equals the thread's CPU
/// time there unless the host switched the thread out meanwhile; a [`SwitchSeq`] (a load from
/// the ring buffer of an extra perf event that records the thread's context switches) tells,
/// and for such an interval the typical outside time of recent clean intervals is subtracted
/// instead of the wall time, which would also remove the time the thread waited for a CPU.
pub struct Gate {
    /// TSC cycles outside KVM_RUN, closed intervals only.
    outside: u64,
    /// TSC when KVM_RUN last returned.
    left_at: u64,
    /// The switch sequence when KVM_RUN last returned.
    seq_at_leave: u64,
    /// Moving average (1/8) of clean outside intervals, TSC cycles.
    typical: u64,
    /// The switch-recording event and its switch sequence (None until the first soft counter,
    /// or if it could not be opened: then every interval counts as clean, and reads always
    /// make the system call).
    switches: Option<(RawFd, Box<dyn SwitchSeq>)>,
    switches_failed: bool,
    /// Outside intervals during which the thread was switched out.
    pub switched_intervals: u64,
    now: fn() -> u64,
}

impl Gate {
    fn new(now: fn() -> u64) -> Gate {
        Gate {
            outside: 0,
            left_at: now(),
            seq_at_leave: 0,
            typical: 0,
            switches: None,
            switches_failed: false,
            switched_intervals: 0,
            now,
        }
    }

    fn seq(&self) -> u64 {
        self.switches.as_ref().map_or(0, |(_, s)| s.get())
    }

    /// The outside time to charge for the interval that started at `left_at`, up to `now`,
    /// and whether the thread was switched out in it.
    fn interval(&self, now: u64) -> (u64, bool) {
        let wall = now.saturating_sub(self.left_at);
        if self.seq() != self.seq_at_leave {
            (wall.min(self.typical), true)
        } else {
            (wall, false)
        }
    }

    /// TSC cycles outside KVM_RUN so far, the current interval included if outside now.
    fn outside_now(&self, in_guest: bool) -> u64 {
        if in_guest {
            self.outside
        } else {
            self.outside + self.interval((self.now)()).0
        }
    }

    fn leave(&mut self) {
        self.left_at = (self.now)();
        self.seq_at_leave = self.seq();
    }

    fn enter(&mut self) {
        let (d, switched) = self.interval((self.now)());
        if switched {
            self.switched_intervals += 1;
        } else if self.typical == 0 {
            self.typical = d;
        } else {
            self.typical = self.typical - self.typical / 8 + d / 8;
        }
        self.outside += d;
    }
}

pub struct PerfBackend {
    source: Source,
    mode: AccountingMode,
    sys: Box<dyn PerfSys>,
    counters: BTreeMap<u8, Open>,
    in_guest: bool,
    signals: crate::vcpu::kick::SignalWatch,
    gate: Gate,
}

impl PerfBackend {
    pub fn new(source: Source, mode: AccountingMode, sys: Box<dyn PerfSys>) -> Self {
        if let Source::Soft { tsc_khz } = source {
            // Tests and users compare a guest's cycles / task-clock with this (docs/vpmu.md).
            log::info!(
                "soft counter backend: cycle events count thread CPU time at the TSC rate, {tsc_khz} kHz \
                 (nominal frequency); only cycle events count"
            );
        }
        PerfBackend {
            source,
            mode,
            sys,
            counters: BTreeMap::new(),
            in_guest: false,
            signals: Default::default(),
            gate: Gate::new(crate::tsc::now),
        }
    }

    /// Whether this backend gates by subtraction (soft source, cpu-switch).
    fn subtracts(&self) -> bool {
        matches!(self.source, Source::Soft { .. }) && self.mode == AccountingMode::CpuSwitch
    }

    /// Opens the gate's switch-detecting event, once (on the vCPU thread: perf events belong
    /// to the calling thread). Soft source only.
    fn watch_switches(&mut self) {
        if self.gate.switches.is_some() || self.gate.switches_failed {
            return;
        }
        let req = PerfRequest {
            event: PerfEvent::SwitchRecords,
            sample_period: None,
            exclude_user: false,
            exclude_kernel: false,
            exclude_host: false,
            exclude_guest: false,
            disabled: false,
        };
        let res = self
            .sys
            .open(&req)
            .and_then(|fd| match self.sys.switch_seq(fd) {
                Ok(s) => Ok((fd, s)),
                Err(e) => {
                    self.sys.close(fd);
                    Err(e)
                }
            });
        match res {
            Ok(c) => {
                self.gate.switches = Some(c);
                self.gate.seq_at_leave = self.gate.seq();
            }
            Err(e) => {
                self.gate.switches_failed = true;
                log::warn!(
                    "vpmu: cannot watch for host thread switches ({e}); cpu-switch subtracts \
                     all wall time outside KVM_RUN"
                );
            }
        }
    }

    /// Host TSC cycles to backend units (ns of the soft source).
    fn tsc_to_ns(&self, tsc: u64) -> u64 {
        match self.source {
            Source::Soft { tsc_khz } => {
                u64::try_from(u128::from(tsc) * 1_000_000 / u128::from(tsc_khz.max(1)))
                    .unwrap_or(u64::MAX)
            }
            Source::Hw => 0,
        }
    }

    /// Outside-KVM_RUN time since `ctr` was programmed, in backend units (0 unless gating by
    /// subtraction).
    fn subtracted(&self, c: &Open) -> u64 {
        if !self.subtracts() {
            return 0;
        }
        let tsc = self
            .gate
            .outside_now(self.in_guest)
            .saturating_sub(c.outside_at_program);
        self.tsc_to_ns(tsc)
    }

    /// Host-thread switches seen during outside intervals (soft cpu-switch; for reports).
    pub fn switched_intervals(&self) -> u64 {
        self.gate.switched_intervals
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
            // Both modes run the event all the time (cpu-switch subtracts, see `Gate`).
            Source::Soft { .. } => vec![PerfRequest {
                sample_period: period.map(|p| p.max(MIN_SOFT_PERIOD_NS)),
                ..base
            }],
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

    /// Soft source: re-programs an open counter in place when the host event can stay (every
    /// soft counter is the same task-clock event): it counts from a new base, and a sampling
    /// event gets its new period (PERF_EVENT_IOC_PERIOD, which restarts it). Closing and
    /// opening the event instead costs a perf_event_open, three fcntls and a close (~15-30 us
    /// here) on every re-arm after an overflow and every counter write. Returns false if the
    /// event must be (re)opened: none yet, or counting-only vs sampling changes.
    fn reprogram_soft(&mut self, bit: u8, overflow_after: Option<u64>) -> bool {
        if !matches!(self.source, Source::Soft { .. }) {
            return false;
        }
        let fd = match self.counters.get(&bit) {
            Some(c) if c.fds.len() == 1 && c.armed.is_some() == overflow_after.is_some() => {
                c.fds[0]
            }
            _ => return false,
        };
        let base = self.raw(bit);
        if let Some(p) = overflow_after {
            self.sys.set_period(fd, p.max(MIN_SOFT_PERIOD_NS));
        }
        let outside_at_program = self.gate.outside_now(self.in_guest);
        if let Some(c) = self.counters.get_mut(&bit) {
            c.base = base;
            c.armed = overflow_after;
            c.outside_at_program = outside_at_program;
            c.last = 0;
        }
        true
    }

    /// What the host events of counter `bit` have counted since they were opened.
    fn raw(&mut self, bit: u8) -> u64 {
        let Some(c) = self.counters.get(&bit) else {
            return 0;
        };
        let soft = matches!(self.source, Source::Soft { .. }) && self.gate.switches.is_some();
        let (now, seq) = ((self.gate.now)(), self.gate.seq());
        let fast = match c.anchor {
            Some(a) if soft && a.seq == seq && now.wrapping_sub(a.tsc) < MAX_ANCHOR_AGE_TSC => {
                Some(a.count + self.tsc_to_ns(now - a.tsc))
            }
            _ => None,
        };
        let raw: u64 = match (fast, c.fds.as_slice()) {
            (Some(v), _) => v,
            (None, [fd]) => {
                let v = self.sys.read(*fd);
                if soft {
                    let anchor = Anchor {
                        count: v,
                        tsc: now,
                        seq,
                    };
                    if let Some(c) = self.counters.get_mut(&bit) {
                        c.anchor = Some(anchor);
                    }
                }
                v
            }
            (None, fds) => {
                let fds = fds.to_vec();
                fds.into_iter().map(|fd| self.sys.read(fd)).sum()
            }
        };
        raw
    }

    fn count(&mut self, bit: u8) -> u64 {
        if !self.counters.contains_key(&bit) {
            return 0;
        }
        let raw = self.raw(bit);
        let c = &self.counters[&bit];
        let v = raw
            .saturating_sub(c.base)
            .saturating_sub(self.subtracted(c))
            .max(c.last);
        if let Some(c) = self.counters.get_mut(&bit) {
            c.last = v;
        }
        v
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
        if self.reprogram_soft(ctr.bit(), overflow_after) {
            return Ok(());
        }
        self.close(ctr.bit());
        if matches!(self.source, Source::Soft { .. }) {
            self.watch_switches();
        }
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
        let outside_at_program = self.gate.outside_now(self.in_guest);
        self.counters.insert(
            ctr.bit(),
            Open {
                fds,
                armed: overflow_after,
                outside_at_program,
                last: 0,
                base: 0,
                anchor: None,
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
            let v = self.count(bit);
            if v >= at {
                bits |= 1 << bit;
            } else if self.subtracts() {
                // Early: the host also counted time outside KVM_RUN. Ask for a notification
                // when the rest of the guest's period has run (perf restarts the period now).
                let fd = self.counters[&bit].fds[0];
                self.sys.set_period(fd, (at - v).max(MIN_SOFT_PERIOD_NS));
            }
        }
        bits
    }

    fn enter_guest(&mut self) {
        self.in_guest = true;
        if self.subtracts() {
            self.gate.enter();
        }
    }

    fn set_mode(&mut self, mode: AccountingMode) {
        // The model re-programs every running counter right after this, and `requests` follows
        // the mode: hw events get the new mode's exclude bits; soft cpu-switch starts its
        // outside interval here (we are outside KVM_RUN).
        if mode != self.mode && mode == AccountingMode::CpuSwitch && !self.in_guest {
            self.gate.leave();
        }
        self.mode = mode;
    }

    fn leave_guest(&mut self) {
        self.in_guest = false;
        if self.subtracts() {
            self.gate.leave();
        }
    }
}

impl Drop for PerfBackend {
    fn drop(&mut self) {
        let bits: Vec<u8> = self.counters.keys().copied().collect();
        for b in bits {
            self.close(b);
        }
        if let Some((fd, seq)) = self.gate.switches.take() {
            drop(seq);
            self.sys.close(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    thread_local! {
        /// The fake TSC of the test running on this thread.
        static NOW: Cell<u64> = const { Cell::new(0) };
    }
    fn fake_now() -> u64 {
        NOW.with(|n| n.get())
    }
    fn advance(tsc: u64) {
        NOW.with(|n| n.set(n.get() + tsc));
    }

    /// Records every call; counts are set by the test.
    #[derive(Default)]
    struct Log {
        opened: Vec<PerfRequest>,
        enabled: Vec<RawFd>,
        disabled: Vec<RawFd>,
        closed: Vec<RawFd>,
        periods: Vec<(RawFd, u64)>,
        counts: BTreeMap<RawFd, u64>,
        /// The switch sequence every mapped control page shows.
        seq: Arc<AtomicU64>,
    }
    struct FakeSeq(Arc<AtomicU64>);
    impl SwitchSeq for FakeSeq {
        fn get(&self) -> u64 {
            self.0.load(Ordering::Relaxed)
        }
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
        fn set_period(&mut self, fd: RawFd, period: u64) {
            self.0.lock().unwrap().periods.push((fd, period));
        }
        fn switch_seq(&mut self, _fd: RawFd) -> std::io::Result<Box<dyn SwitchSeq>> {
            Ok(Box::new(FakeSeq(self.0.lock().unwrap().seq.clone())))
        }
    }

    fn backend(source: Source, mode: AccountingMode) -> (PerfBackend, Arc<Mutex<Log>>) {
        let log = Arc::new(Mutex::new(Log::default()));
        let mut b = PerfBackend::new(source, mode, Box::new(FakePerf(log.clone())));
        b.gate = Gate::new(fake_now);
        (b, log)
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

    /// One exit: `inside` ns of guest time in KVM_RUN, then `outside` ns of VMM work (the fake
    /// TSC runs at 1 GHz: 1 cycle = 1 ns), all counted by the host event `fd`.
    fn exit_cycle(
        b: &mut PerfBackend,
        log: &Arc<Mutex<Log>>,
        fd: RawFd,
        inside: u64,
        outside: u64,
    ) {
        b.enter_guest();
        advance(inside);
        b.leave_guest();
        advance(outside);
        *log.lock().unwrap().counts.entry(fd).or_default() += inside + outside;
    }

    #[test]
    fn soft_cpu_switch_subtracts_time_outside_kvm_run_without_syscalls_per_exit() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::CpuSwitch,
        );
        b.leave_guest();
        b.program(CounterId::gp(0), &e, None).unwrap();
        // The switch-recording event first, then the counter; both run from the start.
        let fd = {
            let l = log.lock().unwrap();
            assert_eq!(l.opened.len(), 2);
            assert!(l.opened.iter().all(|r| !r.disabled));
            assert_eq!(l.opened[0].event, PerfEvent::SwitchRecords);
            assert_eq!(l.opened[1].event, PerfEvent::TaskClock);
            102
        };
        for _ in 0..100 {
            exit_cycle(&mut b, &log, fd, 1000, 300);
        }
        // Read outside KVM_RUN, 300 ns into the current exit: the guest's 100 x 1000 ns only.
        assert_eq!(b.read(CounterId::gp(0)), 100_000);
        {
            let l = log.lock().unwrap();
            assert!(
                l.enabled.is_empty() && l.disabled.is_empty(),
                "no ioctls per exit"
            );
        }

        // domain-switch charges everything.
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::DomainSwitch,
        );
        b.program(CounterId::gp(0), &e, None).unwrap();
        for _ in 0..100 {
            exit_cycle(&mut b, &log, 102, 1000, 300);
        }
        assert_eq!(b.read(CounterId::gp(0)), 130_000);
    }

    /// Counts the read(2) calls the backend makes.
    struct CountingReads(FakePerf, Arc<Mutex<u32>>);
    impl PerfSys for CountingReads {
        fn open(&mut self, req: &PerfRequest) -> std::io::Result<RawFd> {
            self.0.open(req)
        }
        fn enable(&mut self, fd: RawFd) {
            self.0.enable(fd)
        }
        fn disable(&mut self, fd: RawFd) {
            self.0.disable(fd)
        }
        fn read(&mut self, fd: RawFd) -> u64 {
            *self.1.lock().unwrap() += 1;
            self.0.read(fd)
        }
        fn close(&mut self, fd: RawFd) {
            self.0.close(fd)
        }
        fn set_period(&mut self, fd: RawFd, period: u64) {
            self.0.set_period(fd, period)
        }
        fn switch_seq(&mut self, fd: RawFd) -> std::io::Result<Box<dyn SwitchSeq>> {
            self.0.switch_seq(fd)
        }
    }

    #[test]
    fn soft_reads_extrapolate_with_the_tsc_until_the_thread_is_switched_out() {
        let log = Arc::new(Mutex::new(Log::default()));
        let reads = Arc::new(Mutex::new(0));
        let mut b = PerfBackend::new(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::DomainSwitch,
            Box::new(CountingReads(FakePerf(log.clone()), reads.clone())),
        );
        b.gate = Gate::new(fake_now);
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        b.program(CounterId::gp(0), &e, None).unwrap();
        for i in 1..=10 {
            exit_cycle(&mut b, &log, 102, 1000, 300);
            assert_eq!(b.read(CounterId::gp(0)), i * 1300);
        }
        assert_eq!(*reads.lock().unwrap(), 1, "one read(2), then the TSC");
        // Switched out for 5 ms (not counted by the host event): read(2) again.
        advance(5_000_000);
        log.lock().unwrap().seq.fetch_add(2, Ordering::Relaxed);
        assert_eq!(b.read(CounterId::gp(0)), 13_000);
        assert_eq!(*reads.lock().unwrap(), 2);
        // And after MAX_ANCHOR_AGE_TSC, even without a switch.
        advance(MAX_ANCHOR_AGE_TSC);
        *log.lock().unwrap().counts.entry(102).or_default() += MAX_ANCHOR_AGE_TSC;
        assert_eq!(b.read(CounterId::gp(0)), 13_000 + MAX_ANCHOR_AGE_TSC);
        assert_eq!(*reads.lock().unwrap(), 3);
    }

    #[test]
    fn a_host_thread_switch_outside_kvm_run_subtracts_the_typical_exit_not_the_wait() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::CpuSwitch,
        );
        b.leave_guest();
        b.program(CounterId::gp(0), &e, None).unwrap();
        for _ in 0..10 {
            exit_cycle(&mut b, &log, 102, 1000, 300);
        }
        // Next exit: 300 ns of VMM work, but the thread also waited 5 ms for a CPU (not counted
        // by the host event, and the control page's sequence moved).
        b.enter_guest();
        advance(1000);
        b.leave_guest();
        advance(5_000_300);
        {
            let mut l = log.lock().unwrap();
            *l.counts.entry(102).or_default() += 1300;
            l.seq.fetch_add(2, Ordering::Relaxed);
        }
        b.enter_guest();
        advance(1000);
        b.leave_guest();
        *log.lock().unwrap().counts.entry(102).or_default() += 1000;
        assert_eq!(b.read(CounterId::gp(0)), 12_000);
        assert_eq!(b.switched_intervals(), 1);
    }

    #[test]
    fn soft_cpu_switch_rearms_an_early_overflow_signal_for_the_rest_of_the_period() {
        crate::vcpu::kick::install_handler().unwrap();
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::CpuSwitch,
        );
        b.leave_guest();
        b.program(CounterId::gp(0), &e, Some(1_000_000)).unwrap();
        assert_eq!(log.lock().unwrap().opened[1].sample_period, Some(1_000_000));
        // perf's period ran out on host time: 800 us in the guest, 200 us outside.
        for _ in 0..800 {
            exit_cycle(&mut b, &log, 102, 1000, 250);
        }
        // (the fake count: 800 x 1250 = 1 ms of host time)
        // SAFETY: raising the kick signal on this thread, whose handler is installed.
        unsafe { libc::raise(crate::vcpu::kick::kick_signal()) };
        assert_eq!(b.take_overflows(), 0, "not yet in guest time");
        assert_eq!(log.lock().unwrap().periods, vec![(102, 200_000)]);
        for _ in 0..200 {
            exit_cycle(&mut b, &log, 102, 1000, 250);
        }
        // SAFETY: as above.
        unsafe { libc::raise(crate::vcpu::kick::kick_signal()) };
        assert_eq!(b.take_overflows(), 1);
        assert_eq!(log.lock().unwrap().periods.len(), 1);
    }

    #[test]
    fn switching_to_cpu_switch_starts_subtracting_from_there() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::DomainSwitch,
        );
        b.program(CounterId::gp(0), &e, None).unwrap();
        exit_cycle(&mut b, &log, 102, 1000, 300);
        b.set_mode(AccountingMode::CpuSwitch);
        b.program(CounterId::gp(0), &e, None).unwrap();
        let fd = 103; // 101 the switch-recording event, 102 closed
        for _ in 0..10 {
            exit_cycle(&mut b, &log, fd, 1000, 300);
        }
        assert_eq!(b.read(CounterId::gp(0)), 10_000);
    }

    #[test]
    fn soft_reprogramming_keeps_the_host_event() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::DomainSwitch,
        );
        b.program(CounterId::gp(0), &e, Some(1_000_000)).unwrap();
        exit_cycle(&mut b, &log, 102, 1000, 300);
        assert_eq!(b.read(CounterId::gp(0)), 1300);
        // Re-armed after an overflow: same fd, new period, counts from 0 again.
        b.program(CounterId::gp(0), &e, Some(7)).unwrap();
        assert_eq!(b.read(CounterId::gp(0)), 0);
        exit_cycle(&mut b, &log, 102, 1000, 300);
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
            log.lock().unwrap().opened.last().unwrap().sample_period,
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
