//! The host-side guest profiler's trigger, one per vCPU thread: either a clock counter the VMM
//! programs for itself through the vPMU's own perf backend ([`PerfBackend`]), gated like the
//! run's accounting mode, or a plain wall-clock timer. Both notify the vCPU thread with the kick
//! signal, so KVM_RUN returns EINTR (or the signal lands while the VMM handles an exit); the
//! vCPU loop then asks [`Sampler::due`] and, if so, reads RIP and CPL before re-entering.
//!
//! The signal is shared with the vPMU's guest counters and with stop requests: `due` checks
//! the sampler's own counter value (or its own deadline), never just "a signal came".
//!
//! With `--host-profile-clock auto` and the vPMU on, the counter follows the VM's run-time
//! accounting mode (`pmu::mode::ModeSwitch`): at a switch it is re-opened under the new mode,
//! and each sample is tagged with the mode it was counted in.

use vpmu::{AccountingMode, CounterBackend, CounterId};

use crate::pmu::backend::{periods_passed, PerfBackend, Source};
use crate::pmu::perf::HostPerf;
use crate::vcpu_access::kick;
use analysis::trace::format::SampleClock;

#[derive(Debug, thiserror::Error)]
pub(crate) enum SamplerError {
    #[error("host profile counter: {0}")]
    Counter(String),
    #[error("host profile timer: {0}")]
    Timer(std::io::Error),
}

/// The one counter of the sampler's backend.
const CTR: CounterId = CounterId::gp(0);

enum Trigger {
    Counter {
        /// (Boxed: a backend is much larger than a wall-clock trigger.)
        backend: Box<PerfBackend>,
        period_ns: u64,
        /// Counter value (ns) at which the next sample is due.
        next_at: u64,
        watch: kick::SignalWatch,
    },
    Wall {
        timer: Option<libc::timer_t>,
        period_tsc: u64,
        next_due: u64,
        watch: kick::SignalWatch,
    },
}

pub(crate) struct Sampler {
    trigger: Trigger,
    period_ns: u64,
    started: bool,
    /// The counter's accounting mode now (None: wall clock).
    mode: Option<AccountingMode>,
    /// The VM's mode to follow (counter triggers with `--host-profile-clock auto`).
    follow: Option<std::sync::Arc<crate::pmu::mode::ModeSwitch>>,
}

// SAFETY: timer_t is an opaque kernel timer id (a pointer-sized handle), used and deleted only
// by the vCPU thread that owns the sampler; moving it between threads before start is harmless.
unsafe impl Send for Sampler {}

impl Sampler {
    /// `clock` must not be [`SampleClock::None`]; `hz` > 0. `notify_cost_ns`: what taking one
    /// notification costs here (`vm::host_probe`): the counter's re-arms are no shorter than
    /// `pmu::backend::min_soft_period_ns` of it.
    pub(crate) fn new(
        clock: SampleClock,
        hz: u32,
        tsc_khz: u32,
        notify_cost_ns: u64,
        follow: Option<std::sync::Arc<crate::pmu::mode::ModeSwitch>>,
    ) -> Sampler {
        let mut mode = None;
        let period_ns = 1_000_000_000 / u64::from(hz.max(1));
        let trigger = match clock {
            SampleClock::Wall => Trigger::Wall {
                timer: None,
                period_tsc: u64::from(tsc_khz) * 1000 / u64::from(hz.max(1)),
                next_due: 0,
                watch: kick::SignalWatch::default(),
            },
            c => {
                let m = match (&follow, c) {
                    (Some(f), _) => f.get(),
                    (None, SampleClock::CpuSwitch) => AccountingMode::CpuSwitch,
                    (None, _) => AccountingMode::DomainSwitch,
                };
                mode = Some(m);
                Trigger::Counter {
                    backend: Box::new(PerfBackend::new(
                        // Whole KVM_RUN intervals in cpu-switch: the sample points follow the
                        // vCPU thread's time inside KVM_RUN, KVM's exit path included (the
                        // guest's counters leave it out: vm::exit_cost).
                        Source::Soft {
                            tsc_khz: u64::from(tsc_khz),
                            exit_cost_ns: 0,
                            notify_cost_ns,
                        },
                        m,
                        Box::new(HostPerf {
                            signal: kick::kick_signal(),
                        }),
                    )),
                    period_ns,
                    next_at: period_ns,
                    watch: kick::SignalWatch::default(),
                }
            }
        };
        let follow = follow.filter(|_| mode.is_some());
        Sampler {
            trigger,
            period_ns,
            started: false,
            mode,
            follow,
        }
    }

    /// The accounting mode the counter counts in now (None: wall clock).
    pub(crate) fn mode(&self) -> Option<AccountingMode> {
        self.mode
    }

    /// Arms the counter or timer; must run on the vCPU thread (perf events and the timer
    /// signal belong to the calling thread). Called on the first `enter_guest`.
    fn start(&mut self) -> Result<(), SamplerError> {
        match &mut self.trigger {
            Trigger::Counter {
                backend, period_ns, ..
            } => backend
                .program_clock(CTR, *period_ns)
                .map_err(|e| SamplerError::Counter(e.to_string())),
            Trigger::Wall {
                timer,
                period_tsc,
                next_due,
                ..
            } => {
                let period = self.period_ns;
                // SAFETY: a zeroed sigevent is valid; the fields set are those SIGEV_THREAD_ID
                // reads. timer_create writes the new id into `id`.
                let id = unsafe {
                    let mut ev: libc::sigevent = std::mem::zeroed();
                    ev.sigev_notify = libc::SIGEV_THREAD_ID;
                    ev.sigev_signo = kick::kick_signal();
                    ev.sigev_notify_thread_id = libc::gettid();
                    let mut id: libc::timer_t = std::mem::zeroed();
                    if libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut id) != 0 {
                        return Err(SamplerError::Timer(std::io::Error::last_os_error()));
                    }
                    id
                };
                *timer = Some(id);
                let ts = libc::timespec {
                    tv_sec: (period / 1_000_000_000) as libc::time_t,
                    tv_nsec: (period % 1_000_000_000) as libc::c_long,
                };
                let spec = libc::itimerspec {
                    it_interval: ts,
                    it_value: ts,
                };
                // SAFETY: `id` is the timer just created; spec is initialised.
                if unsafe { libc::timer_settime(id, 0, &spec, std::ptr::null_mut()) } != 0 {
                    return Err(SamplerError::Timer(std::io::Error::last_os_error()));
                }
                // Sample points on a grid from here; accept a signal slightly early (timer
                // slack, TSC vs CLOCK_MONOTONIC): a grid point missed by a hair is counted at
                // the next signal, with the one after it.
                *next_due = crate::tsc::now() + *period_tsc - *period_tsc / 8;
                Ok(())
            }
        }
    }

    /// Just before KVM_RUN: starts the trigger the first time; cpu-switch resumes the counter.
    pub(crate) fn enter_guest(&mut self) -> Result<(), SamplerError> {
        if !self.started {
            self.started = true;
            self.start()?;
        }
        if let (
            Some(f),
            Trigger::Counter {
                backend,
                period_ns,
                next_at,
                ..
            },
        ) = (&self.follow, &mut self.trigger)
        {
            let want = f.get();
            if Some(want) != self.mode {
                // Re-open the counter under the new mode; it counts from 0 again.
                backend.set_mode(want);
                backend
                    .program_clock(CTR, *period_ns)
                    .map_err(|e| SamplerError::Counter(e.to_string()))?;
                *next_at = *period_ns;
                self.mode = Some(want);
            }
        }
        if let Trigger::Counter { backend, .. } = &mut self.trigger {
            backend.enter_guest();
        }
        Ok(())
    }

    /// Just after KVM_RUN: cpu-switch pauses the counter.
    pub(crate) fn leave_guest(&mut self) {
        if let Trigger::Counter { backend, .. } = &mut self.trigger {
            backend.leave_guest();
        }
    }

    /// How many samples are due now: the number of sample periods of the sampled clock that
    /// ended since the last samples were taken (0: none). More than one when the clock ran on
    /// for several periods before the loop could look — a long exit (slow device emulation in
    /// domain-switch), or timer signals that the host delivered late and coalesced. Each of
    /// those periods is one sample of where the guest was, as a hardware counter's overflow
    /// interrupts would have taken them: counting only one would understate exactly the long
    /// stretches of VMM work that domain-switch is there to show.
    /// After a [`Due`] with `signal`: the soft backend's next notification is asked for at
    /// the next grid point. In cpu-switch perf's period also ran outside KVM_RUN, so its
    /// signal may come early, or late for the next grid point; this asks for the next one when
    /// the guest reaches it (in domain-switch it keeps perf on the grid; no-op on the hw
    /// backend and for a wall-clock trigger).
    pub(crate) fn rearm(&mut self) {
        if let Trigger::Counter {
            backend, next_at, ..
        } = &mut self.trigger
        {
            backend.notify_at(CTR, *next_at);
        }
    }

    pub(crate) fn due(&mut self) -> Result<Due, SamplerError> {
        match &mut self.trigger {
            Trigger::Counter {
                backend,
                period_ns,
                next_at,
                watch,
            } => {
                // perf signals every period by itself (it was opened with a sample period):
                // no re-arming, which costs a close + perf_event_open per sample (measured:
                // milliseconds at times on this nested host). A signal is ours if our count
                // passed the next sample point; else it was a vPMU overflow or a stop kick.
                if !watch.take() {
                    return Ok(Due::default());
                }
                // First, before the re-arm below moves perf's next notification.
                let interruption_ns = backend.interruption_ns(CTR);
                let count = backend.read(CTR);
                let samples = periods_passed(count, next_at, *period_ns);
                Ok(Due {
                    signal: true,
                    samples,
                    interruption_ns,
                })
            }
            Trigger::Wall {
                period_tsc,
                next_due,
                watch,
                ..
            } => {
                if !watch.take() {
                    return Ok(Due::default());
                }
                Ok(Due {
                    signal: true,
                    samples: periods_passed(crate::tsc::now(), next_due, *period_tsc),
                    interruption_ns: None,
                })
            }
        }
    }
}

/// What [`Sampler::due`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Due {
    /// A signal came since the last look: call [`Sampler::rearm`] (after `due`, so that the
    /// VMM can leave the re-arm, a system call or two, out of the guest's counts with the rest
    /// of its sample work).
    pub signal: bool,
    /// Sample periods that passed since the last sample (0: none is due).
    pub samples: u64,
    /// The host time (ns of thread CPU time) the guest's counting was charged for this
    /// interruption, when the sampler's own notification interrupted it (also one that came
    /// early, before a sample was due: soft cpu-switch): from perf's notification falling due
    /// to KVM_RUN's return in cpu-switch, to now in domain-switch
    /// (`PerfBackend::interruption_ns`). None: another signal, a wall-clock trigger, or the hw
    /// backend.
    pub interruption_ns: Option<u64>,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        if let Trigger::Wall {
            timer: Some(id), ..
        } = self.trigger
        {
            // SAFETY: deleting the timer this sampler created, once.
            unsafe { libc::timer_delete(id) };
        }
    }
}
