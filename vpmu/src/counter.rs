//! The counter core shared by both vendors (what arch/x86/kvm/pmu.c is to KVM's vendor files):
//! counter values and widths, enables, interrupt-on-overflow, global control and status, and
//! the bookkeeping that keeps a [`CounterBackend`] counting exactly the counters the guest's
//! registers say count.
//!
//! Vendor files decode MSRs, check reserved bits and call in here with decoded values.

use crate::backend::{CounterBackend, CounterId, Scale};
use crate::guest_log::GuestLog;
use crate::{guest_warn, ArchEvent, Event, EventFilter};

/// Distinct uncounted events a counter core keeps for the report (the guest chooses them).
pub const MAX_UNCOUNTED_NOTED: usize = 64;

/// What the guest's select registers say about one counter, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Control {
    /// Counter enable (EN; for a fixed counter: its OS or USR field is non-zero).
    pub enabled: bool,
    /// Interrupt on overflow (INT; for a fixed counter: its PMI field).
    pub int: bool,
    /// What to count.
    pub event: Event,
}

/// A backend run: the counter is programmed in the backend since its value was `Counter::value`.
#[derive(Debug, Clone, Copy)]
struct Run {
    scale: Scale,
    /// Guest events from `Counter::value` to the wrap past the counter width.
    to_wrap: u64,
}

/// Whether a counter counts, given the guest's registers, the operator's filter and the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Counts,
    /// The guest's registers say count, but the event filter refuses the event.
    Filtered,
    /// Stopped by the guest's registers.
    Stopped,
    /// The guest's registers say count, but the backend cannot count the event: the counter
    /// stays still (noted once per event: [`CounterCore::uncounted`]).
    Uncounted,
}

/// An event the guest enabled that the backend cannot count (e.g. instructions on the soft
/// backend): its counter stays at its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UncountedEvent {
    /// `Some(i)`: Intel fixed counter i (its event is built in).
    pub fixed: Option<u8>,
    pub code: u16,
    pub umask: u8,
    /// Qualified to Intel TSX transactions (IN_TX or IN_TXCP).
    pub tsx: bool,
}

impl UncountedEvent {
    fn of(e: &Event) -> UncountedEvent {
        UncountedEvent {
            fixed: e.fixed,
            code: e.code,
            umask: e.umask,
            tsx: e.in_tx || e.in_tx_cp,
        }
    }
}

impl std::fmt::Display for UncountedEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.fixed {
            Some(i) => write!(f, "fixed counter {i}")?,
            None => write!(f, "event {:#x}/{:#04x}", self.code, self.umask)?,
        }
        if self.tsx {
            write!(f, " inside TSX transactions (IN_TX/IN_TXCP)")?;
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Counter {
    id: CounterId,
    /// The select register as the guest reads it back: IA32_PERFEVTSELx / PERF_CTLx, or the
    /// counter's 4-bit field of IA32_FIXED_CTR_CTRL.
    select: u64,
    ctl: Control,
    /// Value when last folded (the `base` of `base + scale(backend delta)`).
    value: u64,
    run: Option<Run>,
}

/// How the core is put together; filled in by the vendor file.
pub(crate) struct CoreLayout {
    pub gp: u8,
    pub fixed: u8,
    pub width: u8,
    /// Counters count only when their bit in the global control register is set
    /// (Intel v2 IA32_PERF_GLOBAL_CTRL, AMD PerfMonV2 PerfCntrGlobalCtl).
    pub global_ctrl: bool,
    /// Overflows set bits in a global status register (Intel, AMD PerfMonV2).
    pub global_status: bool,
    /// Select value and decoded control of a counter at reset.
    pub reset_gp: Control,
    pub reset_fixed: fn(u8) -> Control,
    /// (event, unit mask) pairs a general-purpose counter must not count (Intel: the
    /// architectural events CPUID.0AH:EBX marks unavailable).
    pub blocked: Vec<(u16, u8)>,
}

pub(crate) struct CounterCore {
    counters: Vec<Counter>,
    gp: u8,
    mask: u64,
    has_global_ctrl: bool,
    has_global_status: bool,
    global_ctrl: u64,
    global_status: u64,
    /// Counters that overflowed with interrupt-on-overflow set, PMI not yet reported.
    pending_pmi: u64,
    blocked: Vec<(u16, u8)>,
    /// The operator's event filter (`None`: every event may count).
    filter: Option<EventFilter>,
    /// Times the filter kept a counter the guest's registers enabled from counting.
    filter_blocked: u64,
    /// Events the guest enabled that the backend cannot count, each noted (and logged) once;
    /// at most [`MAX_UNCOUNTED_NOTED`].
    uncounted: Vec<(UncountedEvent, Option<ArchEvent>)>,
    reset_gp: Control,
    reset_fixed: fn(u8) -> Control,
    /// Deferred reprogramming (KVM's `reprogram_pmi` bitmap): guest writes only update the
    /// registers and mark counters [`dirty`](Self::dirty); the backend hears of them once, in
    /// [`reprogram_dirty`](Self::reprogram_dirty), before the next guest entry. Off: every
    /// write reaches the backend at once.
    deferred: bool,
    /// Counters ([`CounterId::mask`]s) whose backend program is out of date: folded (their
    /// `value` is current, `run` is `None`), to be programmed or stopped at the next
    /// [`reprogram_dirty`](Self::reprogram_dirty). Always 0 when not deferred.
    dirty: u64,
    /// Counters the backend has a program for (programmed and not stopped since). A dirty
    /// counter may still be live: the backend runs its old program, whose counts are dropped.
    live: u64,
    backend: Box<dyn CounterBackend>,
}

impl CounterCore {
    pub(crate) fn new(layout: CoreLayout, backend: Box<dyn CounterBackend>) -> CounterCore {
        let gp = (0..layout.gp).map(|i| (CounterId::gp(i), layout.reset_gp));
        let fixed = (0..layout.fixed).map(|i| (CounterId::fixed(i), (layout.reset_fixed)(i)));
        let counters = gp
            .chain(fixed)
            .map(|(id, ctl)| Counter {
                id,
                select: 0,
                ctl,
                value: 0,
                run: None,
            })
            .collect();
        let mut core = CounterCore {
            counters,
            gp: layout.gp,
            mask: (1u64 << layout.width) - 1,
            has_global_ctrl: layout.global_ctrl,
            has_global_status: layout.global_status,
            global_ctrl: 0,
            global_status: 0,
            pending_pmi: 0,
            blocked: layout.blocked,
            filter: None,
            filter_blocked: 0,
            uncounted: Vec::new(),
            reset_gp: layout.reset_gp,
            reset_fixed: layout.reset_fixed,
            deferred: false,
            dirty: 0,
            live: 0,
            backend,
        };
        core.reset();
        core
    }

    /// Power-on/INIT state: everything stopped and zero, except that the global control
    /// register enables every general-purpose counter (SDM: IA32_PERF_GLOBAL_CTRL resets with
    /// the PMCx enable bits set, so that version-1 software works; AMD PerfCntrGlobalCtl does
    /// the same; KVM's `kvm_pmu_refresh` emulates both).
    pub(crate) fn reset(&mut self) {
        for i in 0..self.counters.len() {
            let c = &mut self.counters[i];
            c.run = None;
            if self.live & c.id.mask() != 0 {
                self.backend.stop(c.id);
            }
            c.value = 0;
            c.select = 0;
            c.ctl = if c.id.is_fixed() {
                (self.reset_fixed)(c.id.index())
            } else {
                self.reset_gp
            };
        }
        self.global_ctrl = if self.has_global_ctrl {
            (1u64 << self.gp) - 1
        } else {
            0
        };
        self.global_status = 0;
        self.pending_pmi = 0;
        self.dirty = 0;
        self.live = 0;
    }

    /// Defers backend programming to [`reprogram_dirty`](Self::reprogram_dirty) (`true`), or
    /// programs at every write (`false`; switching off reprograms what is dirty now).
    pub(crate) fn set_deferred(&mut self, on: bool) {
        if !on {
            self.reprogram_dirty();
        }
        self.deferred = on;
    }

    /// Counters whose backend program is out of date (a bitmap of [`CounterId::mask`]s).
    pub(crate) fn dirty(&self) -> u64 {
        self.dirty
    }

    /// Brings the backend up to date for every dirty counter: one `program` for a counter
    /// that counts, one `stop` for a live one that does not, nothing for the rest (KVM's
    /// `kvm_pmu_handle_event` before VM entry). Cheap when nothing is dirty.
    pub(crate) fn reprogram_dirty(&mut self) {
        for id in CounterId::iter_bits(std::mem::take(&mut self.dirty)) {
            if let Some(s) = self.slot(id) {
                let c = &self.counters[s];
                let verdict = self.verdict(c, &c.ctl);
                self.apply(s, verdict);
            }
        }
    }

    /// Switches the backend's accounting mode without losing counts: every running counter is
    /// folded into its value (and its overflow noticed), the backend switched, and the counters
    /// re-armed from their values.
    pub(crate) fn set_mode(&mut self, mode: crate::AccountingMode) {
        let running: Vec<usize> = (0..self.counters.len()).filter(|&s| self.fold(s)).collect();
        self.backend.set_mode(mode);
        for s in running {
            self.arm(s);
        }
    }

    /// Sets (or removes) the event filter. Running counters are folded first, and every counter
    /// is then armed or stopped under the new filter.
    pub(crate) fn set_filter(&mut self, filter: Option<EventFilter>) {
        for s in 0..self.counters.len() {
            self.fold(s);
        }
        self.filter = filter;
        for s in 0..self.counters.len() {
            self.arm(s);
        }
    }

    pub(crate) fn filter(&self) -> Option<&EventFilter> {
        self.filter.as_ref()
    }

    /// How many times the filter kept an enabled counter from counting.
    pub(crate) fn filter_blocked(&self) -> u64 {
        self.filter_blocked
    }

    /// Events the guest enabled that the backend cannot count (their counters stayed still),
    /// in the order first met, with the architectural event each is, if it is one.
    pub(crate) fn uncounted(&self) -> &[(UncountedEvent, Option<ArchEvent>)] {
        &self.uncounted
    }

    /// Mask of a counter's value (2^width - 1).
    pub(crate) fn value_mask(&self) -> u64 {
        self.mask
    }

    /// Bitmap of the counters that exist.
    pub(crate) fn valid_bits(&self) -> u64 {
        self.counters.iter().fold(0, |m, c| m | c.id.mask())
    }

    pub(crate) fn backend(&self) -> &dyn CounterBackend {
        &*self.backend
    }

    pub(crate) fn backend_mut(&mut self) -> &mut dyn CounterBackend {
        &mut *self.backend
    }

    fn slot(&self, id: CounterId) -> Option<usize> {
        let i = usize::from(id.index());
        let gp = usize::from(self.gp);
        let slot = if id.is_fixed() { gp + i } else { i };
        (slot < self.counters.len() && self.counters[slot].id == id).then_some(slot)
    }

    /// The select register of `id` as written (0 for a counter that does not exist).
    pub(crate) fn select(&self, id: CounterId) -> u64 {
        self.slot(id).map_or(0, |s| self.counters[s].select)
    }

    /// The counter's current value. Notices an overflow the backend has not reported yet.
    pub(crate) fn value(&mut self, id: CounterId) -> u64 {
        let Some(s) = self.slot(id) else { return 0 };
        let (value, run) = (self.counters[s].value, self.counters[s].run);
        let Some(run) = run else { return value };
        let delta = run.scale.to_guest(self.backend.read(id));
        if delta >= run.to_wrap {
            self.update(s, |_| {});
            return self.counters[s].value;
        }
        value.wrapping_add(delta) & self.mask
    }

    /// A guest write of the counter value (already sign-extended or checked by the vendor).
    pub(crate) fn write_value(&mut self, id: CounterId, value: u64) {
        let mask = self.mask;
        if let Some(s) = self.slot(id) {
            self.update(s, |c| c.value = value & mask);
        }
    }

    /// A guest write of a counter's select register (`select` as it reads back, `ctl` decoded).
    pub(crate) fn write_control(&mut self, id: CounterId, select: u64, ctl: Control) {
        let Some(s) = self.slot(id) else { return };
        let c = &self.counters[s];
        if c.select == select && c.ctl == ctl {
            return;
        }
        let verdict = self.verdict(c, &ctl);
        let stays_stopped = c.run.is_none() && verdict != Verdict::Counts;
        let set = |c: &mut Counter| {
            c.select = select;
            c.ctl = ctl;
        };
        if stays_stopped {
            match verdict {
                Verdict::Filtered => self.note_filtered(s, &ctl),
                Verdict::Uncounted => self.note_uncounted(s, &ctl),
                _ => {}
            }
            set(&mut self.counters[s]);
        } else {
            self.update(s, set);
        }
    }

    pub(crate) fn global_ctrl(&self) -> u64 {
        self.global_ctrl
    }

    /// A guest write of the global control register (reserved bits already handled).
    pub(crate) fn write_global_ctrl(&mut self, value: u64) {
        let changed = (self.global_ctrl ^ value) & self.valid_bits();
        for id in CounterId::iter_bits(changed) {
            if let Some(s) = self.slot(id) {
                self.fold(s);
            }
        }
        self.global_ctrl = value;
        for id in CounterId::iter_bits(changed) {
            if let Some(s) = self.slot(id) {
                self.arm(s);
            }
        }
    }

    /// The global status register. Folds counters that have passed their wrap point, so a PMI
    /// handler that reads the status first sees every overflow that happened.
    pub(crate) fn global_status(&mut self) -> u64 {
        self.poll();
        self.global_status
    }

    /// Write-1-to-clear of global status bits (IA32_PERF_GLOBAL_OVF_CTRL, AMD
    /// PerfCntrGlobalStatusClr). A PMI not yet reported for a cleared bit is dropped.
    ///
    /// Counters that have wrapped but were not folded yet are folded first: on hardware their
    /// status bit was set at the wrap, so this write clears it (otherwise a later fold would set
    /// it again, with a PMI, after the guest cleared it).
    pub(crate) fn clear_status(&mut self, bits: u64) {
        self.poll();
        self.global_status &= !bits;
        self.pending_pmi &= !bits;
    }

    /// Write-1-to-set of global status bits (AMD PerfCntrGlobalStatusSet). Raises no PMI.
    pub(crate) fn set_status(&mut self, bits: u64) {
        self.global_status |= bits;
    }

    /// Takes the backend's overflow reports, folds those counters (setting status bits) and
    /// re-arms them; then returns the counters whose PMI is due, and forgets them.
    ///
    /// A PMI is due for a counter that overflowed with interrupt-on-overflow set, unless the
    /// guest has cleared its status bit since (models with a global status register).
    pub(crate) fn service_overflow(&mut self) -> u64 {
        let reported = self.backend.take_overflows();
        for id in CounterId::iter_bits(reported) {
            match self.slot(id) {
                Some(s) if self.counters[s].run.is_some() => self.update(s, |_| {}),
                _ => log::debug!("vpmu: overflow report for stopped counter {id} ignored"),
            }
        }
        let due = if self.has_global_status {
            self.pending_pmi & self.global_status
        } else {
            self.pending_pmi
        };
        self.pending_pmi = 0;
        due
    }

    /// Folds every running counter that has passed its wrap point.
    fn poll(&mut self) {
        for s in 0..self.counters.len() {
            let c = &self.counters[s];
            if let Some(run) = c.run {
                if run.scale.to_guest(self.backend.read(c.id)) >= run.to_wrap {
                    self.update(s, |_| {});
                }
            }
        }
    }

    /// Fold, change, re-arm: the one way a counter's state changes while it may be counting.
    fn update(&mut self, s: usize, change: impl FnOnce(&mut Counter)) {
        self.fold(s);
        change(&mut self.counters[s]);
        self.arm(s);
    }

    /// Adds what the backend counted since it was programmed to the value, and records an
    /// overflow if the value wrapped. Returns whether the backend was running the counter.
    fn fold(&mut self, s: usize) -> bool {
        let id = self.counters[s].id;
        let Some(run) = self.counters[s].run.take() else {
            return false;
        };
        let delta = run.scale.to_guest(self.backend.read(id));
        let c = &mut self.counters[s];
        c.value = c.value.wrapping_add(delta) & self.mask;
        if delta >= run.to_wrap {
            self.overflowed(s);
        }
        true
    }

    /// The counter wrapped: set its status bit, then (if it interrupts) make its PMI pending.
    fn overflowed(&mut self, s: usize) {
        let c = &self.counters[s];
        let bit = c.id.mask();
        if self.has_global_status {
            self.global_status |= bit;
        }
        if c.ctl.int {
            self.pending_pmi |= bit;
        }
        log::trace!("vpmu: {} overflowed (int={})", c.id, c.ctl.int);
    }

    /// Whether counter `c` with control `ctl` counts: the guest's registers say so, the event
    /// filter allows its event (checked only then, as KVM's `pmc_event_is_allowed`), and the
    /// backend can count it.
    fn verdict(&self, c: &Counter, ctl: &Control) -> Verdict {
        let ev = &ctl.event;
        let enabled = ctl.enabled
            && (ev.usr || ev.os)
            && (!self.has_global_ctrl || self.global_ctrl & c.id.mask() != 0)
            && !(ev.fixed.is_none() && self.blocked.contains(&(ev.code, ev.umask)));
        if !enabled {
            Verdict::Stopped
        } else if self.filter.as_ref().is_some_and(|f| !f.allows(ev)) {
            Verdict::Filtered
        } else if self.backend.supports(ev) {
            Verdict::Counts
        } else {
            Verdict::Uncounted
        }
    }

    /// The filter kept counter `s` from counting (its value stays as it is).
    fn note_filtered(&mut self, s: usize, ctl: &Control) {
        self.filter_blocked += 1;
        let e = &ctl.event;
        log::debug!(
            "vpmu: {} event {:#x}/{:#04x} not counted: refused by the event filter",
            self.counters[s].id,
            e.code,
            e.umask
        );
    }

    /// The backend cannot count counter `s`'s event: say so once per event (a guest profiler
    /// would otherwise read a silent 0).
    fn note_uncounted(&mut self, s: usize, ctl: &Control) {
        static UNCOUNTED: GuestLog = GuestLog::new("vpmu-uncounted-event");
        let u = UncountedEvent::of(&ctl.event);
        // The guest chooses the events (an AMD model has ~2^20 codes): the list keeps the
        // first MAX_UNCOUNTED_NOTED, the limiter counts the rest.
        if self.uncounted.len() >= MAX_UNCOUNTED_NOTED
            || self.uncounted.iter().any(|(seen, _)| *seen == u)
        {
            return;
        }
        let arch = ctl.event.arch_event();
        guest_warn!(
            UNCOUNTED,
            "vpmu: {} {u}{} not counted: the backend cannot count it, the counter stays at its value \
             (reported once per event)",
            self.counters[s].id,
            arch.map(|a| format!(" ({a:?})")).unwrap_or_default()
        );
        self.uncounted.push((u, arch));
    }

    /// After a change to counter `s` (folded first): notes a refused or uncounted event (once
    /// per guest write, deferred or not), then programs or stops the backend for the counter's
    /// state now, or, deferred, marks it dirty for [`reprogram_dirty`](Self::reprogram_dirty).
    fn arm(&mut self, s: usize) {
        let c = &self.counters[s];
        let verdict = self.verdict(c, &c.ctl);
        let ctl = c.ctl;
        match verdict {
            Verdict::Filtered => self.note_filtered(s, &ctl),
            Verdict::Uncounted => self.note_uncounted(s, &ctl),
            _ => {}
        }
        if self.deferred {
            self.dirty |= self.counters[s].id.mask();
        } else {
            self.apply(s, verdict);
        }
    }

    /// Programs the backend for counter `s` (folded, `run` is `None`) as `verdict` says, or
    /// stops it if the backend has a program for it.
    fn apply(&mut self, s: usize, verdict: Verdict) {
        let c = &self.counters[s];
        let id = c.id;
        if verdict != Verdict::Counts {
            if self.live & id.mask() != 0 {
                self.backend.stop(id);
                self.live &= !id.mask();
            }
            return;
        }
        let event = c.ctl.event;
        let scale = self.backend.scale(&event);
        let to_wrap = self.mask - c.value + 1;
        // Status bits need to hear of every overflow; without them only interrupts do (AMD
        // legacy shows an overflow in the counter value alone).
        let after = (self.has_global_status || c.ctl.int).then(|| scale.to_host(to_wrap));
        match self.backend.program(id, &event, after) {
            Ok(()) => {
                self.counters[s].run = Some(Run { scale, to_wrap });
                self.live |= id.mask();
            }
            Err(e) => {
                static NOT_PROGRAMMED: GuestLog = GuestLog::new("vpmu-backend-refused");
                guest_warn!(NOT_PROGRAMMED, "vpmu: {id} does not count: {e}");
                self.backend.stop(id);
                self.live &= !id.mask();
            }
        }
    }
}
