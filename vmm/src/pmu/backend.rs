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
//!   soft: the events run all the time (for their overflow signals) and the counters count the
//!   vCPU thread's CPU time inside KVM_RUN, interval by interval ([`Gate`]: an RDTSC on each side
//!   of KVM_RUN, a `read(2)` of a thread clock only after the host switched the thread out).
//!   Toggling the events instead (two ioctls per counter per exit) charged the guest for its own
//!   gating: more than domain-switch counted for the same work (issue 12). A counter armed to
//!   overflow gets its host period fixed when perf's signal comes early (the host counted VMM
//!   time too).
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
    /// The last value `read` returned (reads never go backwards).
    last: u64,
    /// The count when the counter was last programmed: of its host events (soft events are
    /// reused: see `program`), or of the gate's guest time in soft cpu-switch.
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

/// Soft cpu-switch gating: the guest is charged the vCPU thread's CPU time inside KVM_RUN,
/// interval by interval. The thread's CPU time at each side of KVM_RUN comes from a counting
/// task-clock event of the gate's own, read with `read(2)` only when needed: while the thread has
/// not been switched out since the last read (a [`SwitchSeq`]: a load from the ring buffer of an
/// extra perf event that records the thread's context switches), its CPU time has advanced
/// exactly with the TSC, so an RDTSC on each side of KVM_RUN suffices (no system call per exit).
/// After a switch (preemption, a sleep in the kernel or in the VMM) the next side of KVM_RUN
/// reads the event again: waiting time is never taken for CPU time, and each interval's charge
/// is bounded by what that interval really ran (0..its own CPU time), so an error in one interval
/// cannot eat guest time counted in others. (The design before issue 12 item 1 subtracted
/// estimated outside time from a cumulative count: one over-estimate under load ate the guest
/// time of earlier intervals, and the count stood still.)
pub struct Gate {
    /// Guest time (ns of thread CPU time) in closed KVM_RUN intervals.
    inside: u64,
    /// Thread CPU time when KVM_RUN was last entered; `Some` while inside (and gating).
    entered_at: Option<u64>,
    /// The last `read(2)` of the clock event, to extrapolate from.
    anchor: Option<Anchor>,
    /// The switch sequence when KVM_RUN last returned.
    seq_at_leave: u64,
    /// The switch-recording event and its switch sequence (None until the first soft counter,
    /// or if it could not be opened: then each side of KVM_RUN reads the clock event).
    switches: Option<(RawFd, Box<dyn SwitchSeq>)>,
    switches_failed: bool,
    /// The thread clock: a counting task-clock event (None until the first soft cpu-switch
    /// counter, or if it could not be opened: then wall time inside KVM_RUN is charged).
    clock: Option<RawFd>,
    clock_failed: bool,
    /// Outside intervals during which the thread was switched out.
    pub switched_intervals: u64,
    /// `read(2)`s of the clock event.
    pub clock_reads: u64,
    now: fn() -> u64,
}

impl Gate {
    fn new(now: fn() -> u64) -> Gate {
        Gate {
            inside: 0,
            entered_at: None,
            anchor: None,
            seq_at_leave: 0,
            switches: None,
            switches_failed: false,
            clock: None,
            clock_failed: false,
            switched_intervals: 0,
            clock_reads: 0,
            now,
        }
    }

    fn seq(&self) -> u64 {
        self.switches.as_ref().map_or(0, |(_, s)| s.get())
    }
}

pub struct PerfBackend {
    source: Source,
    mode: AccountingMode,
    sys: Box<dyn PerfSys>,
    counters: BTreeMap<u8, Open>,
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
            signals: Default::default(),
            gate: Gate::new(crate::tsc::now),
        }
    }

    /// Whether this backend gates in software (soft source, cpu-switch: see [`Gate`]).
    fn gates(&self) -> bool {
        matches!(self.source, Source::Soft { .. }) && self.mode == AccountingMode::CpuSwitch
    }

    /// Opens the gate's switch-detecting event, once (on the vCPU thread: perf events belong
    /// to the calling thread). Soft source only.
    fn watch_switches(&mut self) {
        if self.gate.switches.is_some() || self.gate.switches_failed {
            return;
        }
        let req = PerfRequest::counting(PerfEvent::SwitchRecords);
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
                self.gate.anchor = None;
            }
            Err(e) => {
                self.gate.switches_failed = true;
                log::warn!(
                    "vpmu: cannot watch for host thread switches ({e}); cpu-switch reads the \
                     thread's CPU time on each side of KVM_RUN (two system calls per exit)"
                );
            }
        }
    }

    /// Opens the gate's thread clock, once (on the vCPU thread). Soft cpu-switch only.
    fn open_clock(&mut self) {
        if self.gate.clock.is_some() || self.gate.clock_failed {
            return;
        }
        let req = PerfRequest::counting(PerfEvent::TaskClock);
        match self.sys.open(&req) {
            Ok(fd) => {
                self.gate.clock = Some(fd);
                self.gate.anchor = None;
            }
            Err(e) => {
                self.gate.clock_failed = true;
                log::warn!(
                    "vpmu: cannot open the thread clock for cpu-switch gating ({e}); it \
                     charges wall time inside KVM_RUN"
                );
            }
        }
    }

    /// The vCPU thread's CPU time now (ns, the gate's clock event): extrapolated with the TSC
    /// from the last `read(2)` while the thread has not been switched out since (and the read
    /// is younger than [`MAX_ANCHOR_AGE_TSC`]), else read again.
    fn thread_ns(&mut self) -> u64 {
        // TSC first, then the sequence: a switch after the TSC read shows in the sequence.
        let now = (self.gate.now)();
        let seq = self.gate.seq();
        let Some(fd) = self.gate.clock else {
            return self.tsc_to_ns(now);
        };
        match self.gate.anchor {
            Some(a)
                if self.gate.switches.is_some()
                    && a.seq == seq
                    && now.wrapping_sub(a.tsc) < MAX_ANCHOR_AGE_TSC =>
            {
                a.count + self.tsc_to_ns(now - a.tsc)
            }
            _ => {
                // The sequence was taken before the read: a switch during or after it makes
                // the next call read again.
                let v = self.sys.read(fd);
                self.gate.clock_reads += 1;
                self.gate.anchor = Some(Anchor {
                    count: v,
                    tsc: (self.gate.now)(),
                    seq,
                });
                v
            }
        }
    }

    /// Guest time charged so far (ns): closed KVM_RUN intervals plus the open one, if inside.
    fn guest_ns(&mut self) -> u64 {
        match self.gate.entered_at {
            Some(t) => self.gate.inside + self.thread_ns().saturating_sub(t),
            None => self.gate.inside,
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

    /// What counter `bit` counts now, from its zero (`Open::base`): the gate's guest time in
    /// soft cpu-switch, else its host events.
    fn source_now(&mut self, bit: u8) -> u64 {
        if self.gates() {
            self.guest_ns()
        } else {
            self.raw(bit)
        }
    }

    /// For a sampler on the host's side (profile::sampler): the next perf notification when
    /// counter `ctr` reaches `at`, counted from now. Soft cpu-switch only, where perf's own
    /// period also runs outside KVM_RUN: without this, a notification due during the VMM's
    /// work on an exit would take its sample there, at the instruction that caused the exit,
    /// and charge VMM work to that instruction in the mode that must not count it. With it,
    /// the notification comes when the guest itself has run the rest of the period, inside
    /// KVM_RUN, as a hardware counter's would.
    pub fn notify_at(&mut self, ctr: CounterId, at: u64) {
        if !self.gates() {
            return;
        }
        let v = self.count(ctr.bit());
        if let Some(&fd) = self.counters.get(&ctr.bit()).and_then(|c| c.fds.first()) {
            self.sys
                .set_period(fd, at.saturating_sub(v).max(MIN_SOFT_PERIOD_NS));
        }
    }

    /// Host-thread switches seen during outside intervals (soft cpu-switch; for reports).
    pub fn switched_intervals(&self) -> u64 {
        self.gate.switched_intervals
    }

    /// `read(2)`s of the gate's thread clock (soft cpu-switch; for reports and tests).
    pub fn clock_reads(&self) -> u64 {
        self.gate.clock_reads
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
            sample_period: period,
            ..PerfRequest::counting(PerfEvent::TaskClock)
        };
        match self.source {
            // Both modes run the event all the time (cpu-switch charges only KVM_RUN intervals,
            // see `Gate`).
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
        if self.gates() {
            self.open_clock();
        }
        let base = self.source_now(bit);
        if let Some(p) = overflow_after {
            self.sys.set_period(fd, p.max(MIN_SOFT_PERIOD_NS));
        }
        if let Some(c) = self.counters.get_mut(&bit) {
            c.base = base;
            c.armed = overflow_after;
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
        let now = self.source_now(bit);
        let c = &self.counters[&bit];
        let v = now.saturating_sub(c.base).max(c.last);
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
            if self.gates() {
                self.open_clock();
            }
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
        // A new host event counts from 0; the gate's guest time from where it stands.
        let base = if self.gates() { self.guest_ns() } else { 0 };
        self.counters.insert(
            ctr.bit(),
            Open {
                fds,
                armed: overflow_after,
                last: 0,
                base,
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
            } else if self.gates() {
                // Early: the host also counted time outside KVM_RUN. Ask for a notification
                // when the rest of the guest's period has run (perf restarts the period now).
                let fd = self.counters[&bit].fds[0];
                self.sys.set_period(fd, (at - v).max(MIN_SOFT_PERIOD_NS));
            }
        }
        bits
    }

    fn enter_guest(&mut self) {
        if self.gates() {
            if self.gate.seq() != self.gate.seq_at_leave {
                self.gate.switched_intervals += 1;
            }
            self.gate.entered_at = Some(self.thread_ns());
        }
    }

    fn set_mode(&mut self, mode: AccountingMode) {
        // The model re-programs every running counter right after this, and `requests` follows
        // the mode: hw events get the new mode's exclude bits; soft cpu-switch charges from
        // the next KVM_RUN (we are outside it).
        if mode != self.mode {
            self.gate.entered_at = None;
        }
        self.mode = mode;
    }

    fn leave_guest(&mut self) {
        if self.gates() {
            if let Some(t) = self.gate.entered_at.take() {
                // This interval's CPU time, never less than 0: an error here stays here.
                let d = self.thread_ns().saturating_sub(t);
                self.gate.inside += d;
            }
            self.gate.seq_at_leave = self.gate.seq();
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
        if let Some(fd) = self.gate.clock.take() {
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

    /// Records every call; counts are set by the test, or by the fake thread clock.
    #[derive(Default)]
    struct Log {
        opened: Vec<PerfRequest>,
        enabled: Vec<RawFd>,
        disabled: Vec<RawFd>,
        closed: Vec<RawFd>,
        periods: Vec<(RawFd, u64)>,
        /// Counts added by the test, per event.
        counts: BTreeMap<RawFd, u64>,
        /// The thread's CPU time (ns): every task-clock event counts it from its opening.
        cpu: u64,
        /// `cpu` when each task-clock event was opened.
        cpu_at_open: BTreeMap<RawFd, u64>,
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
            let fd = 100 + l.opened.len() as RawFd;
            if req.event == PerfEvent::TaskClock {
                let cpu = l.cpu;
                l.cpu_at_open.insert(fd, cpu);
            }
            Ok(fd)
        }
        fn enable(&mut self, fd: RawFd) {
            self.0.lock().unwrap().enabled.push(fd);
        }
        fn disable(&mut self, fd: RawFd) {
            self.0.lock().unwrap().disabled.push(fd);
        }
        fn read(&mut self, fd: RawFd) -> u64 {
            let l = self.0.lock().unwrap();
            let clock = l.cpu_at_open.get(&fd).map_or(0, |at| l.cpu - at);
            l.counts.get(&fd).unwrap_or(&0) + clock
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

    /// The thread runs on a CPU for `ns` (the fake TSC runs at 1 GHz: 1 cycle = 1 ns).
    fn run(log: &Arc<Mutex<Log>>, ns: u64) {
        advance(ns);
        log.lock().unwrap().cpu += ns;
    }

    /// The thread waits `ns` for a CPU: wall time passes, its CPU time does not, and the host
    /// writes switch-out and switch-in records (unless `unseen`: a switch the gate misses).
    fn wait(log: &Arc<Mutex<Log>>, ns: u64, unseen: bool) {
        advance(ns);
        if !unseen {
            log.lock().unwrap().seq.fetch_add(2, Ordering::Relaxed);
        }
    }

    /// One exit: `inside` ns of guest time in KVM_RUN, then `outside` ns of VMM work.
    fn exit_cycle(b: &mut PerfBackend, log: &Arc<Mutex<Log>>, inside: u64, outside: u64) {
        b.enter_guest();
        run(log, inside);
        b.leave_guest();
        run(log, outside);
    }

    #[test]
    fn soft_cpu_switch_counts_time_inside_kvm_run_without_syscalls_per_exit() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::CpuSwitch,
        );
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
        {
            let l = log.lock().unwrap();
            assert!(
                l.enabled.is_empty() && l.disabled.is_empty(),
                "no ioctls per exit"
            );
        }
        assert_eq!(b.clock_reads(), 1, "one read(2) of the clock, then the TSC");

        // domain-switch charges everything.
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::DomainSwitch,
        );
        b.program(CounterId::gp(0), &e, None).unwrap();
        for _ in 0..100 {
            exit_cycle(&mut b, &log, 1000, 300);
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
    fn a_host_thread_switch_is_never_charged_inside_or_outside_kvm_run() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::CpuSwitch,
        );
        b.leave_guest();
        b.program(CounterId::gp(0), &e, None).unwrap();
        for _ in 0..10 {
            exit_cycle(&mut b, &log, 1000, 300);
        }
        // Next exit: 300 ns of VMM work, but the thread also waited 5 ms for a CPU.
        b.enter_guest();
        run(&log, 1000);
        b.leave_guest();
        run(&log, 150);
        wait(&log, 5_000_000, false);
        run(&log, 150);
        exit_cycle(&mut b, &log, 1000, 300);
        assert_eq!(b.read(CounterId::gp(0)), 12_000);
        assert_eq!(b.switched_intervals(), 1);
        // Preempted inside KVM_RUN: 2 x 500 ns of guest time around a 5 ms wait.
        b.enter_guest();
        run(&log, 500);
        wait(&log, 5_000_000, false);
        run(&log, 500);
        b.leave_guest();
        run(&log, 300);
        assert_eq!(b.read(CounterId::gp(0)), 13_000);
        assert_eq!(b.switched_intervals(), 1, "that one was inside");
    }

    /// Issue 12 item 1: the I/O loop of `vpmu_tiny` on a busy host. Each exit has a little guest
    /// code and 300 us of VMM work that busy-waits on *wall* time (the delay device), so a
    /// preemption in it shortens the thread's CPU time there, not the wall time. The subtracting
    /// gate took the typical outside time (300 us) for such an interval, more than the host
    /// event had counted: the over-subtraction ate the guest's earlier time and the counter,
    /// clamped to its last value, stood still for the whole loop. Charging each KVM_RUN
    /// interval's own CPU time counts exactly.
    #[test]
    fn preemptions_in_wall_time_busy_waits_do_not_eat_guest_time() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::CpuSwitch,
        );
        b.leave_guest();
        b.program(CounterId::gp(0), &e, None).unwrap();
        // Clean exits first (what the subtracting gate learnt its typical outside time from).
        for _ in 0..10 {
            exit_cycle(&mut b, &log, 2000, 300_000);
        }
        let v1 = b.read(CounterId::gp(0));
        assert_eq!(v1, 20_000);
        // The loop: every exit's 300 us busy-wait is preempted for 120 us of it.
        let mut last = v1;
        for i in 1..=100 {
            b.enter_guest();
            run(&log, 2000);
            b.leave_guest();
            run(&log, 100_000);
            wait(&log, 120_000, false);
            run(&log, 80_000);
            let v = b.read(CounterId::gp(0));
            assert!(
                v > last,
                "exit {i}: the counter must advance ({v} after {last})"
            );
            last = v;
        }
        assert_eq!(last, v1 + 100 * 2000);
        assert_eq!(b.switched_intervals(), 99, "the 100th is still open");
        // Two reads of the clock per preempted exit at most (one on each side of KVM_RUN).
        assert!(b.clock_reads() <= 1 + 2 * 100, "{}", b.clock_reads());
    }

    /// A switch the gate does not see (the wait is taken for CPU time) costs at most the
    /// interval it falls in, never the guest time counted before it.
    #[test]
    fn an_unseen_switch_costs_at_most_one_interval() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::CpuSwitch,
        );
        b.leave_guest();
        b.program(CounterId::gp(0), &e, None).unwrap();
        for _ in 0..10 {
            exit_cycle(&mut b, &log, 1000, 300);
        }
        assert_eq!(b.read(CounterId::gp(0)), 10_000);
        // 5 ms of unseen waiting outside KVM_RUN, then exits past MAX_ANCHOR_AGE_TSC (so the
        // clock is read again, and the extrapolated time it had overshot is found out).
        wait(&log, 5_000_000, true);
        let n = 2 * MAX_ANCHOR_AGE_TSC / 100_000;
        let mut last = 10_000;
        for _ in 0..n {
            exit_cycle(&mut b, &log, 100_000, 300);
            let v = b.read(CounterId::gp(0));
            assert!(v >= last);
            last = v;
        }
        assert!(b.clock_reads() >= 2);
        assert!(
            last >= 10_000 + (n - 1) * 100_000 && last <= 10_000 + n * 100_000,
            "{last} after {n} exits of 100 us"
        );
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
        assert_eq!(log.lock().unwrap().opened[2].sample_period, Some(1_000_000));
        // perf's period ran out on host time: 800 us in the guest, 200 us outside.
        for _ in 0..800 {
            exit_cycle(&mut b, &log, 1000, 250);
        }
        // (the fake count: 800 x 1250 = 1 ms of host time)
        // SAFETY: raising the kick signal on this thread, whose handler is installed.
        unsafe { libc::raise(crate::vcpu::kick::kick_signal()) };
        assert_eq!(b.take_overflows(), 0, "not yet in guest time");
        assert_eq!(log.lock().unwrap().periods, vec![(103, 200_000)]);
        for _ in 0..200 {
            exit_cycle(&mut b, &log, 1000, 250);
        }
        // SAFETY: as above.
        unsafe { libc::raise(crate::vcpu::kick::kick_signal()) };
        assert_eq!(b.take_overflows(), 1);
        assert_eq!(log.lock().unwrap().periods.len(), 1);
    }

    #[test]
    fn switching_to_cpu_switch_starts_gating_from_there() {
        let e = event(Vendor::Amd, 0x76, 0, true, true);
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::DomainSwitch,
        );
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
        let (mut b, log) = backend(
            Source::Soft { tsc_khz: 1_000_000 },
            AccountingMode::DomainSwitch,
        );
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
