//! A simulated host PMU that backs a real run: `--vpmu-backend sim` (hidden; for tests and
//! for checking the hw source end to end on hosts without a hardware PMU, like this project's
//! build machines).
//!
//! [`SimHost`] is a [`PerfSys`] over sim.rs's counting core (the perf ABI as hardware counts:
//! exclude bits by mode and ring, sample_period overflows, IOC_PERIOD/ENABLE/DISABLE,
//! time_enabled/time_running, multiplexing over a counter budget), driven by real time
//! instead of a scripted timeline. The hw source runs over it unchanged, as over perf:
//! * **time**: the vCPU thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), converted to cycles at
//!   the TSC rate like the soft backend (task-clock x TSC). Every hardware or raw event counts
//!   these cycles, whatever its event select says (there is nothing else to count here).
//! * **mode**: the run loop tells the perf layer when KVM_RUN is entered and left
//!   ([`PerfSys::guest_entry`]/[`guest_exit`](PerfSys::guest_exit), right inside the gate: the
//!   VM entry and exit that real hardware sees by itself). CPU time in between is guest mode,
//!   the rest of the thread's CPU time is host mode. Guest time is taken as guest CPL 0 and
//!   host time as host CPL 3 (the sim does not see rings): an event that filters the guest's
//!   rings to user only counts nothing in guest mode here.
//! * **time is brought up to date** at every call of the perf layer (the hw source reads,
//!   programs and stops through it) and at each guest entry and exit, so a read sees every
//!   cycle up to that moment.
//! * **overflows** send the vCPU kick signal, the one real perf events are set to send
//!   (F_SETSIG): at once if one happened while catching up, and — since nothing calls the perf
//!   layer while the guest runs — from a POSIX timer armed at each guest entry for the first
//!   overflow due in guest mode (wall time, so it may come early if the thread is preempted:
//!   then the overflow is not due yet, and the next entry re-arms for the rest). A host-mode
//!   overflow is seen at the next call of the perf layer, at the latest the next guest entry:
//!   the signal makes that KVM_RUN return at once, as a real perf signal during the VMM's exit
//!   handling does.
//! * **a counter budget** of [`SIM_COUNTERS`] hardware counters, rotated every
//!   [`MUX_INTERVAL_NS`] of thread CPU time, as perf's multiplexing does.
//!
//! Not simulated: skid, per-event rates (instructions, cache misses, ...), the host's other
//! perf users, PEBS/LBR. What it checks is the hw source's own logic end to end on a real
//! guest: which events it opens per mode, its reads, re-arms, split periods, PMIs, scaling.

use std::io;
use std::os::fd::RawFd;
use std::thread::ThreadId;

use super::sim::{notify, Ctx, Sim, SimPerf};
use crate::pmu::perf::{PerfCount, PerfRequest, PerfSys, SwitchSeq};
use crate::vcpu_access::kick::KickTimer;

/// Hardware counters of the simulated host (an AMD Zen core has 6, Intel's have 4-8 general
/// plus 3 fixed): a guest with more counters than this running gets multiplexed.
pub(super) const SIM_COUNTERS: usize = 4;

/// How often the simulated perf rotates multiplexed events (ns of thread CPU time; perf's
/// default `perf_event_mux_interval_ms` is 4).
pub(super) const MUX_INTERVAL_NS: u64 = 4_000_000;

/// The calling thread's CPU time (ns).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Cycles in `ns` at `tsc_khz`.
fn ns_to_cycles(tsc_khz: u64, ns: u64) -> u64 {
    u64::try_from(u128::from(ns) * u128::from(tsc_khz) / 1_000_000).unwrap_or(u64::MAX)
}

/// ns for `cycles` at `tsc_khz`, rounded up.
fn cycles_to_ns(tsc_khz: u64, cycles: u64) -> u64 {
    let khz = u128::from(tsc_khz.max(1));
    u64::try_from((u128::from(cycles) * 1_000_000).div_ceil(khz)).unwrap_or(u64::MAX)
}

/// The clock the simulation runs on: the first thread that uses it (the vCPU thread, where
/// perf events belong) and its CPU time then.
struct Clock {
    thread: ThreadId,
    start_ns: u64,
    /// Cycles already run through the counting core.
    cycles: u64,
}

/// The simulated host's perf layer for one vCPU (see the module docs).
pub struct SimHost {
    perf: SimPerf,
    tsc_khz: u64,
    clock: Option<Clock>,
    in_guest: bool,
    /// Kicks KVM_RUN at the first guest-mode overflow (made on the vCPU thread at first need).
    timer: Option<KickTimer>,
    timer_failed: bool,
    timer_armed: bool,
    now: fn() -> u64,
}

impl SimHost {
    /// A simulated host whose cycles run at `tsc_khz`.
    pub fn new(tsc_khz: u64) -> SimHost {
        SimHost::with_clock(tsc_khz, thread_cpu_ns)
    }

    fn with_clock(tsc_khz: u64, now: fn() -> u64) -> SimHost {
        let sim = Sim::default();
        sim.state()
            .set_budget(SIM_COUNTERS, ns_to_cycles(tsc_khz, MUX_INTERVAL_NS));
        SimHost {
            perf: SimPerf(sim),
            tsc_khz,
            clock: None,
            in_guest: false,
            timer: None,
            timer_failed: false,
            timer_armed: false,
            now,
        }
    }

    fn ctx(&self) -> Ctx {
        if self.in_guest {
            Ctx::GUEST_KERNEL
        } else {
            Ctx::HOST_USER
        }
    }

    /// Runs the thread's CPU time since the last call through the counting core, in the
    /// current mode; sends the kick signal for any overflow. Calls from another thread (the
    /// builder, a drop elsewhere) do not move the clock: it is the vCPU thread's.
    fn catch_up(&mut self) {
        let me = std::thread::current().id();
        let ns = (self.now)();
        let clock = self.clock.get_or_insert(Clock {
            thread: me,
            start_ns: ns,
            cycles: 0,
        });
        if clock.thread != me {
            return;
        }
        let total = ns_to_cycles(self.tsc_khz, ns.saturating_sub(clock.start_ns));
        let n = total.saturating_sub(clock.cycles);
        clock.cycles = clock.cycles.max(total);
        if n == 0 {
            return;
        }
        let ctx = self.ctx();
        let signals = self.perf.0.state().run(ctx, n);
        notify(signals);
    }

    /// Arms the kick timer for the first overflow due in guest mode, if any.
    fn arm_timer(&mut self) {
        let Some(cycles) = self.perf.0.state().next_overflow(Ctx::GUEST_KERNEL) else {
            return;
        };
        if self.timer.is_none() && !self.timer_failed {
            match KickTimer::for_this_thread() {
                Ok(t) => self.timer = Some(t),
                Err(e) => {
                    self.timer_failed = true;
                    log::warn!(
                        "vpmu sim: no kick timer ({e}); guest-mode overflows are seen at the \
                         next exit only"
                    );
                }
            }
        }
        if let Some(t) = &self.timer {
            let ns = cycles_to_ns(self.tsc_khz, cycles);
            t.kick_after(std::time::Duration::from_nanos(ns));
            self.timer_armed = true;
        }
    }
}

impl PerfSys for SimHost {
    fn open(&mut self, req: &PerfRequest) -> io::Result<RawFd> {
        self.catch_up();
        self.perf.open(req)
    }

    fn read(&mut self, fd: RawFd) -> u64 {
        self.catch_up();
        self.perf.read(fd)
    }

    fn read_count(&mut self, fd: RawFd) -> PerfCount {
        self.catch_up();
        self.perf.read_count(fd)
    }

    fn close(&mut self, fd: RawFd) {
        self.catch_up();
        self.perf.close(fd);
    }

    fn set_period(&mut self, fd: RawFd, period: u64) {
        self.catch_up();
        self.perf.set_period(fd, period);
        let refused = self.perf.0.state().refused.pop();
        if let Some(why) = refused {
            log::error!("vpmu sim: the hw source made a call perf refuses: {why}");
        }
    }

    fn switch_seq(&mut self, fd: RawFd) -> io::Result<SwitchSeq> {
        self.perf.switch_seq(fd)
    }

    fn sees_guest_transitions(&self) -> bool {
        true
    }

    fn guest_entry(&mut self) {
        self.catch_up();
        self.in_guest = true;
        self.arm_timer();
    }

    fn guest_exit(&mut self) {
        self.catch_up();
        self.in_guest = false;
        if std::mem::take(&mut self.timer_armed) {
            if let Some(t) = &self.timer {
                t.disarm();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::pmu::backend::{PerfBackend, Source};
    use crate::pmu::perf::PerfEvent;
    use vpmu::{AccountingMode, CounterBackend, CounterId, Vendor};

    // One fake clock per test (tests run on their own threads, but share statics).
    static CLOCK_A: AtomicU64 = AtomicU64::new(0);
    fn clock_a() -> u64 {
        CLOCK_A.load(Ordering::Relaxed)
    }
    static CLOCK_B: AtomicU64 = AtomicU64::new(0);
    fn clock_b() -> u64 {
        CLOCK_B.load(Ordering::Relaxed)
    }

    #[test]
    fn thread_time_is_split_by_kvm_run_into_guest_and_host_cycles() {
        // 1 GHz: 1 ns = 1 cycle.
        let mut p = SimHost::with_clock(1_000_000, clock_a);
        let req = |exclude_host, exclude_guest| PerfRequest {
            exclude_host,
            exclude_guest,
            ..PerfRequest::counting(PerfEvent::Raw(0x76))
        };
        let guest = p.open(&req(true, false)).unwrap();
        let host = p.open(&req(false, true)).unwrap();
        let both = p.open(&req(false, false)).unwrap();
        let tc = p
            .open(&PerfRequest::counting(PerfEvent::TaskClock))
            .unwrap();
        for _ in 0..10 {
            CLOCK_A.fetch_add(300, Ordering::Relaxed);
            p.guest_entry();
            CLOCK_A.fetch_add(1000, Ordering::Relaxed);
            p.guest_exit();
        }
        CLOCK_A.fetch_add(50, Ordering::Relaxed);
        let got: Vec<u64> = [guest, host, both, tc].iter().map(|&f| p.read(f)).collect();
        assert_eq!(got, vec![10_000, 3050, 13_050, 0]);
    }

    #[test]
    fn the_hw_source_counts_and_overflows_over_it() {
        crate::vcpu_access::kick::install_handler().unwrap();
        let sim = SimHost::with_clock(2_000_000, clock_b);
        let mut b = PerfBackend::new(Source::Hw, AccountingMode::CpuSwitch, Box::new(sim));
        let e = super::super::testutil::event(Vendor::Amd, 0x76, 0, true, true);
        let ctr = CounterId::gp(0);
        b.program(ctr, &e, Some(100_000)).unwrap();
        // 40 us in the guest at 2 GHz: 80,000 cycles, no overflow yet.
        b.enter_guest();
        CLOCK_B.fetch_add(40_000, Ordering::Relaxed);
        b.leave_guest();
        // Host time is not counted in cpu-switch.
        CLOCK_B.fetch_add(1_000_000, Ordering::Relaxed);
        assert_eq!(b.read(ctr), 80_000);
        assert_eq!(b.take_overflows() & ctr.mask(), 0);
        b.enter_guest();
        CLOCK_B.fetch_add(10_000, Ordering::Relaxed);
        b.leave_guest();
        assert_eq!(b.read(ctr), 100_000);
        assert_eq!(b.take_overflows() & ctr.mask(), ctr.mask());
    }
}
