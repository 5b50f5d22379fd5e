//! The VM's control surface, shared by the threads of a run: [`VmControl`] (kick, end,
//! stopping, the vCPUs' end states), [`Latch`] (a one-shot event), and what a run-time
//! [`Controller`] gets to drive the VM ([`VmHandles`]). Built by `vm::run`; the vCPU threads,
//! the pinger and the controller hold it; it imports nothing from `vm`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::console::ConsoleLog;
use crate::end::VmEnd;
use crate::pmu::mode::ModeSwitch;
use crate::vcpu_access::kick;

/// A one-shot event a thread can wait for (e.g. the guest's network coming up).
#[derive(Default)]
pub struct Latch {
    fired: Mutex<bool>,
    cv: Condvar,
}

impl Latch {
    pub(crate) fn fire(&self) {
        *self.fired.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    /// Waits until fired (true) or until `give_up` says so (false); polls it every 50 ms.
    pub fn wait(&self, give_up: impl Fn() -> bool) -> bool {
        let mut f = self.fired.lock().unwrap_or_else(|e| e.into_inner());
        while !*f {
            if give_up() {
                return false;
            }
            f = self
                .cv
                .wait_timeout(f, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

/// What a run-time controller gets to drive a running VM: the accounting mode, the VM's
/// control (kick, end, stopping), the guest's network coming up, and the pinger's pause.
pub struct VmHandles {
    /// None with `--vpmu=off`.
    pub mode: Option<Arc<ModeSwitch>>,
    pub control: Arc<VmControl>,
    /// Fired at the first echo reply (`--net`).
    pub net_up: Arc<Latch>,
    /// While true the pinger sends no requests (`--net`).
    pub net_paused: Arc<AtomicBool>,
    /// The guest console as seen so far (boot milestones).
    pub console: Arc<Mutex<ConsoleLog>>,
}

impl VmHandles {
    /// Switches the accounting mode (and kicks the vCPUs so they apply it now).
    pub fn set_mode(&self, mode: vpmu::AccountingMode, by: &'static str) {
        if let Some(m) = &self.mode {
            if m.set(mode, by) {
                self.control.kick_all();
            }
        }
    }

    /// Waits until the guest kernel has started init (true), or the VM ends or `give_up`
    /// says so (false).
    pub fn wait_for_init(&self, give_up: impl Fn() -> bool) -> bool {
        while !self
            .console
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .init_started()
        {
            if self.control.stopping() || give_up() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// Sleeps `d` unless the VM ends first (false then).
    pub fn sleep(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        while Instant::now() < until {
            if self.control.stopping() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20).min(until - Instant::now()));
        }
        !self.control.stopping()
    }
}

/// Code that drives a running VM from its own thread (`vpmu-vmm compare`'s experiment).
#[derive(Clone)]
pub struct Controller(pub Arc<dyn Fn(VmHandles) + Send + Sync>);

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Controller")
    }
}

/// Shared between the vCPU threads and the thread waiting for the VM to end.
#[derive(Default)]
pub struct VmControl {
    end: Mutex<Option<VmEnd>>,
    ended: Condvar,
    stopping: AtomicBool,
    threads: Mutex<Vec<libc::pthread_t>>,
    /// How each vCPU stood when its thread ended (the diagnostic of a bad end).
    vcpu_states: Mutex<Vec<crate::last_exits::VcpuEndState>>,
    /// Test hook (`VmConfig::panic_vcpu_at_exit`).
    panic_at: Option<(u32, u64)>,
}

impl VmControl {
    /// A control with the test hook `VmConfig::panic_vcpu_at_exit` set (None: no hook).
    pub fn new(panic_at: Option<(u32, u64)>) -> Self {
        VmControl {
            panic_at,
            ..Default::default()
        }
    }

    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    pub(crate) fn register_thread(&self, t: libc::pthread_t) {
        self.threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(t);
    }

    /// Kicks every vCPU out of KVM_RUN (it looks at what changed, then re-enters).
    pub fn kick_all(&self) {
        for &t in self
            .threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            kick::kick(t);
        }
    }

    /// Records why the VM ends (the first reason wins: true if it was this one) and kicks
    /// every vCPU out of KVM_RUN.
    pub fn request_end(&self, end: VmEnd) -> bool {
        let mut e = self.end.lock().unwrap_or_else(|p| p.into_inner());
        let first = e.is_none();
        if first {
            *e = Some(end);
        }
        self.stopping.store(true, Ordering::Release);
        for &t in self
            .threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            kick::kick(t);
        }
        self.ended.notify_all();
        first
    }

    /// A vCPU thread's state as it ends (see [`crate::last_exits`]).
    pub(crate) fn report_vcpu_state(&self, st: crate::last_exits::VcpuEndState) {
        self.vcpu_states
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(st);
    }

    /// The vCPU states reported so far, in vCPU order.
    pub fn vcpu_states(&self) -> Vec<crate::last_exits::VcpuEndState> {
        let mut v = self
            .vcpu_states
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        v.sort_by_key(|s| s.vcpu);
        v
    }

    /// Test hook: the exit (1-based) at which vCPU `id`'s thread panics on purpose.
    pub(crate) fn panic_at(&self, id: u32) -> Option<u64> {
        self.panic_at.filter(|(v, _)| *v == id).map(|(_, n)| n)
    }

    /// Waits for the end, or ends the VM with `Timeout` after `timeout` (or with `Signal` at
    /// SIGINT/SIGTERM, [`crate::stop_signal`]: looked at every 100 ms).
    pub fn wait(&self, timeout: Option<Duration>) -> VmEnd {
        self.wait_watching(timeout, || None)
    }

    /// [`Self::wait`], also ending the run with what `watch` returns (polled every 100 ms).
    pub(crate) fn wait_watching(
        &self,
        timeout: Option<Duration>,
        watch: impl Fn() -> Option<VmEnd>,
    ) -> VmEnd {
        let start = Instant::now();
        let mut e = self.end.lock().unwrap_or_else(PoisonError::into_inner);
        while e.is_none() {
            if let Some(end) = watch() {
                drop(e);
                self.request_end(end);
                e = self.end.lock().unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            if let Some(sig) = crate::stop_signal::pending() {
                drop(e);
                self.request_end(VmEnd::Signal(sig));
                e = self.end.lock().unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            const POLL: Duration = Duration::from_millis(100);
            match timeout {
                Some(t) => {
                    let left = t.saturating_sub(start.elapsed());
                    if left.is_zero() {
                        drop(e);
                        self.request_end(VmEnd::Timeout(t));
                        e = self.end.lock().unwrap_or_else(PoisonError::into_inner);
                        continue;
                    }
                    e = self
                        .ended
                        .wait_timeout(e, left.min(POLL))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                None => {
                    e = self
                        .ended
                        .wait_timeout(e, POLL)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            }
        }
        e.clone().unwrap()
    }
}
