//! [`FakeBackend`]: a counter backend that counts only when a test says so.
//!
//! Clones share one state, so a test keeps a clone to drive and inspect the backend it has
//! boxed into a [`Pmu`](crate::Pmu):
//!
//! ```
//! use vpmu::{fake::FakeBackend, CounterId, Pmu, PmuConfig};
//!
//! let fake = FakeBackend::new();
//! let mut pmu = Pmu::new(PmuConfig::amd(), Box::new(fake.clone())).unwrap();
//! pmu.wrmsr(0xc001_0000, 0x53_0076).unwrap(); // PERF_CTL0: cycles, USR+OS, EN
//! fake.advance(CounterId::gp(0), 1000);
//! assert_eq!(pmu.rdmsr(0xc001_0004).unwrap(), 1000);
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::{BackendError, CounterBackend, CounterId, Scale};
use crate::Event;

/// A call the model made, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// [`CounterBackend::program`].
    Program {
        ctr: CounterId,
        event: Event,
        overflow_after: Option<u64>,
    },
    /// [`CounterBackend::stop`].
    Stop { ctr: CounterId },
    /// [`CounterBackend::set_mode`].
    SetMode(crate::AccountingMode),
}

#[derive(Debug, Clone, Copy)]
struct FakeCounter {
    event: Event,
    count: u64,
    overflow_after: Option<u64>,
}

type SupportFn = dyn Fn(&Event) -> bool + Send;

struct State {
    running: BTreeMap<CounterId, FakeCounter>,
    overflows: u64,
    calls: Vec<Call>,
    supports: Box<SupportFn>,
    scale: Scale,
    fail_program: bool,
    guest_entries: u64,
    guest_exits: u64,
}

/// A backend driven by hand: counters advance only through [`advance`](Self::advance), and an
/// overflow is raised when an armed count is crossed. Supports every event unless told
/// otherwise. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct FakeBackend {
    state: Arc<Mutex<State>>,
}

impl Default for FakeBackend {
    fn default() -> FakeBackend {
        FakeBackend::new()
    }
}

impl std::fmt::Debug for FakeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("FakeBackend")
            .field("running", &s.running)
            .field("overflows", &s.overflows)
            .finish()
    }
}

impl FakeBackend {
    /// A backend that supports every event at scale 1.
    pub fn new() -> FakeBackend {
        FakeBackend::with_support(|_| true)
    }

    /// A backend that supports the events `supports` accepts.
    pub fn with_support(supports: impl Fn(&Event) -> bool + Send + 'static) -> FakeBackend {
        FakeBackend {
            state: Arc::new(Mutex::new(State {
                running: BTreeMap::new(),
                overflows: 0,
                calls: Vec::new(),
                supports: Box::new(supports),
                scale: Scale::ONE,
                fail_program: false,
                guest_entries: 0,
                guest_exits: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reports `scale` for every event from now on.
    pub fn set_scale(&self, scale: Scale) {
        self.lock().scale = scale;
    }

    /// Makes `program` fail (`true`) or succeed again.
    pub fn fail_program(&self, fail: bool) {
        self.lock().fail_program = fail;
    }

    /// Counts `n` backend units on `ctr` if it is running; raises its overflow when this
    /// crosses its armed count. Returns whether it was running.
    pub fn advance(&self, ctr: CounterId, n: u64) -> bool {
        let mut s = self.lock();
        let Some(c) = s.running.get_mut(&ctr) else {
            return false;
        };
        let before = c.count;
        c.count = c.count.saturating_add(n);
        let crossed = c.overflow_after.is_some_and(|a| before < a && c.count >= a);
        if crossed {
            s.overflows |= ctr.mask();
        }
        true
    }

    /// [`advance`](Self::advance)s every running counter by `n`.
    pub fn advance_all(&self, n: u64) {
        let ids: Vec<CounterId> = self.lock().running.keys().copied().collect();
        for id in ids {
            self.advance(id, n);
        }
    }

    /// Reports an overflow on `ctr` whether or not a count was crossed (a spurious or early
    /// report).
    pub fn raise_overflow(&self, ctr: CounterId) {
        self.lock().overflows |= ctr.mask();
    }

    /// Whether `ctr` is programmed.
    pub fn is_running(&self, ctr: CounterId) -> bool {
        self.lock().running.contains_key(&ctr)
    }

    /// The counters that are programmed.
    pub fn running(&self) -> Vec<CounterId> {
        self.lock().running.keys().copied().collect()
    }

    /// The event `ctr` counts, if it is programmed.
    pub fn event(&self, ctr: CounterId) -> Option<Event> {
        self.lock().running.get(&ctr).map(|c| c.event)
    }

    /// The `overflow_after` `ctr` was last programmed with (`None` if not running or not armed).
    pub fn armed(&self, ctr: CounterId) -> Option<u64> {
        self.lock().running.get(&ctr).and_then(|c| c.overflow_after)
    }

    /// Units counted on `ctr` since it was programmed.
    pub fn count(&self, ctr: CounterId) -> u64 {
        self.lock().running.get(&ctr).map_or(0, |c| c.count)
    }

    /// Overflows raised and not yet taken.
    pub fn pending_overflows(&self) -> u64 {
        self.lock().overflows
    }

    /// Every call recorded so far.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// Every call recorded so far, forgetting them.
    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.lock().calls)
    }

    /// How often `enter_guest` and `leave_guest` were called.
    pub fn guest_switches(&self) -> (u64, u64) {
        let s = self.lock();
        (s.guest_entries, s.guest_exits)
    }
}

impl CounterBackend for FakeBackend {
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn supports(&self, event: &Event) -> bool {
        (self.lock().supports)(event)
    }

    fn scale(&self, _event: &Event) -> Scale {
        self.lock().scale
    }

    fn program(
        &mut self,
        ctr: CounterId,
        event: &Event,
        overflow_after: Option<u64>,
    ) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.calls.push(Call::Program {
            ctr,
            event: *event,
            overflow_after,
        });
        s.overflows &= !ctr.mask();
        if s.fail_program {
            s.running.remove(&ctr);
            return Err(BackendError::Host("fake failure".into()));
        }
        s.running.insert(
            ctr,
            FakeCounter {
                event: *event,
                count: 0,
                overflow_after,
            },
        );
        Ok(())
    }

    fn read(&mut self, ctr: CounterId) -> u64 {
        self.count(ctr)
    }

    fn stop(&mut self, ctr: CounterId) {
        let mut s = self.lock();
        s.calls.push(Call::Stop { ctr });
        s.overflows &= !ctr.mask();
        s.running.remove(&ctr);
    }

    fn take_overflows(&mut self) -> u64 {
        std::mem::take(&mut self.lock().overflows)
    }

    fn enter_guest(&mut self) {
        self.lock().guest_entries += 1;
    }

    fn leave_guest(&mut self) {
        self.lock().guest_exits += 1;
    }

    fn set_mode(&mut self, mode: crate::AccountingMode) {
        self.lock().calls.push(Call::SetMode(mode));
    }
}
