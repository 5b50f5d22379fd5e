//! Periodic device work on a vCPU thread. A POSIX timer sends this thread the kick signal every
//! period, so KVM_RUN returns even while the guest idles in HLT; after every exit the loop asks
//! [`Ticker::poll`], which runs the device's tick when it is due. The work is thus done by the
//! vCPU thread itself, as a device model's work would be (domain-switch charges it to the guest).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::devices::Tick;

#[derive(Debug, thiserror::Error)]
pub(crate) enum TickerError {
    #[error("timer_create: {0}")]
    Create(std::io::Error),
    #[error("timer_settime: {0}")]
    Arm(std::io::Error),
}

pub(crate) struct Ticker {
    dev: Arc<Mutex<dyn Tick>>,
    period: Duration,
    next: Instant,
    timer: Option<libc::timer_t>,
}

// SAFETY: `timer_t` is an opaque id of a POSIX timer of this process; the Ticker is moved into
// its vCPU thread before the timer is created and only that thread uses it.
unsafe impl Send for Ticker {}

impl Ticker {
    pub(crate) fn new(dev: Arc<Mutex<dyn Tick>>, period: Duration) -> Self {
        Ticker {
            dev,
            period,
            next: Instant::now(),
            timer: None,
        }
    }

    /// Starts the periodic kick of the calling thread (call it on the vCPU thread).
    pub(crate) fn start(&mut self) -> Result<(), TickerError> {
        // SAFETY: an all-zero sigevent is a valid value (the padding is private to libc).
        let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = crate::vcpu_access::kick::kick_signal();
        // SAFETY: gettid has no preconditions.
        sev.sigev_notify_thread_id = unsafe { libc::gettid() };
        let mut timer: libc::timer_t = std::ptr::null_mut();
        // SAFETY: valid pointers to a filled sigevent and to the timer id out-parameter.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut timer) } != 0 {
            return Err(TickerError::Create(std::io::Error::last_os_error()));
        }
        self.timer = Some(timer);
        let ts = libc::timespec {
            tv_sec: self.period.as_secs() as libc::time_t,
            tv_nsec: self.period.subsec_nanos() as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: ts,
            it_value: ts,
        };
        // SAFETY: `timer` was just created; `spec` is a valid itimerspec.
        if unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) } != 0 {
            return Err(TickerError::Arm(std::io::Error::last_os_error()));
        }
        self.next = Instant::now();
        Ok(())
    }

    /// After an exit: runs the device's tick if it is due.
    pub(crate) fn poll(&mut self) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        crate::devices::lock_device(&self.dev).tick(now);
        self.next += self.period;
        if self.next <= now {
            // Fell behind (the thread was not scheduled): the device catches up by its own clock.
            self.next = now + self.period;
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        if let Some(t) = self.timer.take() {
            // SAFETY: the timer was created by `start` and is deleted once.
            unsafe { libc::timer_delete(t) };
        }
    }
}
