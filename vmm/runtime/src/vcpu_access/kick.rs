//! Kicking a vCPU out of KVM_RUN without lost wake-ups: a real-time signal whose handler sets
//! `kvm_run.immediate_exit` for the thread it lands on. A signal that arrives while the thread
//! is outside KVM_RUN makes the next KVM_RUN return at once with EINTR, so the loop always sees
//! a stop request (or, later, an overflow notification) promptly.

use std::cell::Cell;
use std::ptr::null_mut;

use kvm_bindings::kvm_run;
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

thread_local! {
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(null_mut()) };
    /// Counted by the handler: signals (stop requests, counter-overflow notifications from
    /// perf for the vPMU or the host-side profiler) that arrived on this thread.
    static SIGNALS: Cell<u64> = const { Cell::new(0) };
    /// TSC when the last signal arrived (for PMI latency measurements).
    static SIGNAL_TSC: Cell<u64> = const { Cell::new(0) };
}

/// The TSC value when the last kick or overflow signal arrived on this thread.
pub(crate) fn last_signal_tsc() -> u64 {
    SIGNAL_TSC.with(|t| t.get())
}

/// Kick and overflow signals that arrived on the calling thread so far.
pub(crate) fn signals() -> u64 {
    SIGNALS.with(|s| s.get())
}

/// One consumer's view of the kick signal. Several consumers share the one signal (the vPMU's
/// counters, the host-side profiler's counter or timer, stop requests); each keeps its own
/// watch, so one of them taking a signal does not hide it from the others, and each then
/// checks its own state (counter value, deadline) to see whether the signal was for it.
#[derive(Debug, Default)]
pub(crate) struct SignalWatch {
    seen: u64,
}

impl SignalWatch {
    /// Whether a kick or overflow signal arrived on the calling thread since this watch last
    /// looked (a new watch reports any signal the thread has had).
    pub(crate) fn take(&mut self) -> bool {
        let n = SIGNALS.with(|s| s.get());
        let new = n != self.seen;
        self.seen = n;
        new
    }
}

/// The signal used to kick vCPU threads.
pub(crate) fn kick_signal() -> i32 {
    SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    SIGNALS.with(|s| s.set(s.get().wrapping_add(1)));
    // (RDTSC is async-signal-safe.)
    SIGNAL_TSC.with(|t| t.set(crate::tsc::now()));
    let run = KVM_RUN.with(|p| p.get());
    if !run.is_null() {
        // SAFETY: the pointer is this thread's own mmap'd kvm_run, set by `bind` before the first
        // KVM_RUN and valid until the vCPU fd is dropped after `unbind`. A single byte store is
        // async-signal-safe.
        unsafe { std::ptr::write_volatile(&mut (*run).immediate_exit, 1) };
    }
}

/// Installs the kick handler (once per process), for the kick signal and for SIGIO: when a
/// thread's queue of real-time signals is full, the kernel sends a perf event's overflow
/// notification as SIGIO instead of the signal F_SETSIG named (fcntl(2)), and SIGIO's default
/// action ends the process. That happened on the SVM host under QEMU's emulator, where the
/// vCPU thread takes overflow signals slower than a short period raises them: a guest's tiny
/// sampling period killed the VMM. A SIGIO is taken as a kick: every consumer looks at its own
/// counters after any signal, so a merged notification loses nothing.
pub(crate) fn install_handler() -> Result<(), vmm_sys_util::errno::Error> {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let mut res = Ok(());
    ONCE.call_once(|| {
        res = register_signal_handler(kick_signal(), on_kick)
            .and_then(|()| register_signal_handler(libc::SIGIO, on_kick))
    });
    res
}

/// Binds the calling thread to its vCPU's kvm_run area.
pub(crate) fn bind(run: *mut kvm_run) {
    KVM_RUN.with(|p| p.set(run));
}

pub(crate) fn unbind() {
    KVM_RUN.with(|p| p.set(null_mut()));
}

/// Sends the kick signal to a thread.
pub(crate) fn kick(thread: libc::pthread_t) {
    // SAFETY: pthread_kill with a valid signal number; the thread id comes from pthread_self of a
    // vCPU thread that is joined only after it stopped being kicked.
    unsafe { libc::pthread_kill(thread, kick_signal()) };
}

/// A per-thread timer that kicks its vCPU thread at a chosen time (POSIX timer, SIGEV_THREAD_ID,
/// the kick signal): brings back a vCPU that runs in the guest with no exits when something
/// held back (a rate-limited PMI) may go.
pub struct KickTimer {
    timer: libc::timer_t,
}

impl KickTimer {
    /// A timer for the calling thread.
    pub(crate) fn for_this_thread() -> std::io::Result<Self> {
        // SAFETY: sigevent is plain data; all-zero is a valid starting value.
        let mut ev: libc::sigevent = unsafe { std::mem::zeroed() };
        ev.sigev_notify = libc::SIGEV_THREAD_ID;
        ev.sigev_signo = kick_signal();
        // SAFETY: gettid has no preconditions.
        ev.sigev_notify_thread_id = unsafe { libc::gettid() };
        let mut timer: libc::timer_t = null_mut();
        // SAFETY: `ev` and `timer` are valid for the call; the timer is deleted in Drop.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut timer) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(KickTimer { timer })
    }

    /// Kicks this thread once, `after` from now (replacing any earlier setting).
    pub(crate) fn kick_after(&self, after: std::time::Duration) {
        let after = after.max(std::time::Duration::from_micros(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: a timer created by timer_create and not yet deleted; `spec` is valid.
        unsafe { libc::timer_settime(self.timer, 0, &spec, null_mut()) };
    }

    /// Cancels a kick that has not come yet.
    pub(crate) fn disarm(&self) {
        // SAFETY: itimerspec is plain data; all-zero (it_value 0) disarms the timer.
        let spec: libc::itimerspec = unsafe { std::mem::zeroed() };
        // SAFETY: a timer created by timer_create and not yet deleted; `spec` is valid.
        unsafe { libc::timer_settime(self.timer, 0, &spec, null_mut()) };
    }
}

// SAFETY: a timer_t is an id the kernel resolves for any thread of the process; the timer is
// only armed and deleted by the value's owner.
unsafe impl Send for KickTimer {}

impl Drop for KickTimer {
    fn drop(&mut self) {
        // SAFETY: deletes the timer this value owns, once.
        unsafe { libc::timer_delete(self.timer) };
    }
}
