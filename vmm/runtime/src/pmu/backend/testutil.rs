//! Test helpers shared by the backend's tests: a recording fake of [`PerfSys`] whose task-clock
//! events count a fake thread CPU time, a fake TSC, and guest events.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use vpmu::{AccountingMode, CounterBackend, Event, Vendor};

use super::gate::TscSource;
use super::{Gate, Imp, PerfBackend, Source};
use crate::pmu::perf::{PerfEvent, PerfRequest, PerfSys, SwitchSeq};

thread_local! {
    /// The fake TSC of the test running on this thread.
    static NOW: Cell<u64> = const { Cell::new(0) };
}
pub(super) fn fake_now() -> u64 {
    NOW.with(|n| n.get())
}
pub(super) fn advance(tsc: u64) {
    NOW.with(|n| n.set(n.get() + tsc));
}

/// Records every call; counts are set by the test, or by the fake thread clock.
#[derive(Default)]
pub(super) struct Log {
    pub(super) opened: Vec<PerfRequest>,
    pub(super) closed: Vec<RawFd>,
    pub(super) periods: Vec<(RawFd, u64)>,
    /// Counts added by the test, per event.
    pub(super) counts: BTreeMap<RawFd, u64>,
    /// The thread's CPU time (ns): every task-clock event counts it from its opening.
    pub(super) cpu: u64,
    /// `cpu` when each task-clock event was opened.
    pub(super) cpu_at_open: BTreeMap<RawFd, u64>,
    /// The switch sequence every mapped control page shows.
    pub(super) seq: Arc<AtomicU64>,
}
pub(super) struct FakePerf(pub(super) Arc<Mutex<Log>>);
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
    fn switch_seq(&mut self, _fd: RawFd) -> std::io::Result<SwitchSeq> {
        Ok(SwitchSeq::of_counter(self.0.lock().unwrap().seq.clone()))
    }
}

pub(super) fn backend(source: Source, mode: AccountingMode) -> (PerfBackend, Arc<Mutex<Log>>) {
    let log = Arc::new(Mutex::new(Log::default()));
    let mut b = PerfBackend::new(source, mode, Box::new(FakePerf(log.clone())));
    with_fake_tsc(&mut b);
    (b, log)
}

/// A soft backend over the fake perf ABI at a 1 GHz TSC (1 cycle = 1 ns), with no exit-path or
/// notification cost measured.
pub(super) fn soft_backend(mode: AccountingMode) -> (PerfBackend, Arc<Mutex<Log>>) {
    let source = Source::Soft {
        tsc_khz: 1_000_000,
        exit_cost_ns: 0,
        notify_cost_ns: 0,
    };
    backend(source, mode)
}

/// Raises the kick signal on this thread (as perf's notification would) and takes the
/// overflows the backend then reports. The kick handler must be installed.
pub(super) fn kick_and_take_overflows(b: &mut PerfBackend) -> u64 {
    // SAFETY: raising the kick signal on this thread, whose handler the caller installed.
    unsafe { libc::raise(crate::vcpu_access::kick::kick_signal()) };
    b.take_overflows()
}

/// Makes a soft backend's gate read the fake TSC (1 GHz: 1 cycle = 1 ns at `tsc_khz` 1e6).
pub(super) fn with_fake_tsc(b: &mut PerfBackend) {
    if let Imp::Soft(s) = &mut b.imp {
        s.gate = Gate::new(
            TscSource::Fake(fake_now),
            s.tsc_khz(),
            s.gate.exit_cost_ns(),
        );
    }
}

pub(super) fn event(vendor: Vendor, code: u16, umask: u8, usr: bool, os: bool) -> Event {
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
        in_tx: false,
        in_tx_cp: false,
    }
}

/// The thread runs on a CPU for `ns` (the fake TSC runs at 1 GHz: 1 cycle = 1 ns).
pub(super) fn run(log: &Arc<Mutex<Log>>, ns: u64) {
    advance(ns);
    log.lock().unwrap().cpu += ns;
}

/// The thread waits `ns` for a CPU: wall time passes, its CPU time does not, and the host
/// writes switch-out and switch-in records (unless `unseen`: a switch the gate misses).
pub(super) fn wait(log: &Arc<Mutex<Log>>, ns: u64, unseen: bool) {
    advance(ns);
    if !unseen {
        log.lock().unwrap().seq.fetch_add(2, Ordering::Relaxed);
    }
}

/// One exit: `inside` ns of guest time in KVM_RUN, then `outside` ns of VMM work.
pub(super) fn exit_cycle(b: &mut PerfBackend, log: &Arc<Mutex<Log>>, inside: u64, outside: u64) {
    b.enter_guest();
    run(log, inside);
    b.leave_guest();
    run(log, outside);
}

/// Counts the read(2) calls the backend makes.
pub(super) struct CountingReads(pub(super) FakePerf, pub(super) Arc<Mutex<u32>>);
impl PerfSys for CountingReads {
    fn open(&mut self, req: &PerfRequest) -> std::io::Result<RawFd> {
        self.0.open(req)
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
    fn switch_seq(&mut self, fd: RawFd) -> std::io::Result<SwitchSeq> {
        self.0.switch_seq(fd)
    }
}
