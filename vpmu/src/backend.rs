//! What a counter source must do for the model ([`CounterBackend`]), and the types it speaks.
//!
//! The model keeps every virtual counter as `value = base + scale(host_delta)`: `base` is the
//! guest-visible value when the backend was last programmed, `host_delta` is what the backend
//! has counted since, in its own units (nanoseconds of thread CPU time, host instructions, ...),
//! and [`Scale`] turns those units into guest events. All counter arithmetic (width, wrap,
//! sign extension, overflow status, PMIs) stays in the model; a backend only counts.

use crate::Event;

/// One virtual counter, numbered like the global control/status bits (and like KVM's
/// `pmc->idx`): general-purpose counter `i` is bit `i`, Intel fixed counter `i` is bit `32 + i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterId(u8);

impl CounterId {
    /// Bit of the first fixed counter in IA32_PERF_GLOBAL_CTRL/STATUS.
    pub const FIXED_BASE: u8 = 32;

    /// General-purpose counter `i` (IA32_PMCi, AMD PERF_CTRi).
    pub const fn gp(i: u8) -> CounterId {
        assert!(i < Self::FIXED_BASE);
        CounterId(i)
    }

    /// Intel fixed counter `i` (IA32_FIXED_CTRi).
    pub const fn fixed(i: u8) -> CounterId {
        assert!(i < 64 - Self::FIXED_BASE);
        CounterId(Self::FIXED_BASE + i)
    }

    /// The id whose global-status bit is `bit`.
    pub const fn from_bit(bit: u8) -> CounterId {
        assert!(bit < 64);
        CounterId(bit)
    }

    /// Whether this is a fixed counter.
    pub const fn is_fixed(self) -> bool {
        self.0 >= Self::FIXED_BASE
    }

    /// Index within its kind (GP or fixed).
    pub const fn index(self) -> u8 {
        if self.is_fixed() {
            self.0 - Self::FIXED_BASE
        } else {
            self.0
        }
    }

    /// Bit number in the global control/status registers and in overflow bitmaps.
    pub const fn bit(self) -> u8 {
        self.0
    }

    /// `1 << self.bit()`.
    pub const fn mask(self) -> u64 {
        1 << self.0
    }

    /// The ids whose bits are set in `bitmap`, lowest first.
    pub fn iter_bits(bitmap: u64) -> impl Iterator<Item = CounterId> {
        // One step per set bit (lowest first), not 64: the vCPU loop asks for the overflows
        // after every exit, nearly always with an empty bitmap.
        let mut rest = bitmap;
        std::iter::from_fn(move || {
            (rest != 0).then(|| {
                let bit = rest.trailing_zeros() as u8;
                rest &= rest - 1;
                CounterId(bit)
            })
        })
    }
}

impl std::fmt::Display for CounterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_fixed() {
            write!(f, "fixed{}", self.index())
        } else {
            write!(f, "gp{}", self.index())
        }
    }
}

/// Guest events per backend unit, as the exact fraction `num / den` (e.g. a 2.6 GHz cycles
/// counter over a nanosecond clock is `13 / 5`). Rational so that repeated reads never drift.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale {
    num: u64,
    den: u64,
}

impl Scale {
    /// One guest event per backend unit.
    pub const ONE: Scale = Scale { num: 1, den: 1 };

    /// `num / den` guest events per backend unit.
    ///
    /// # Panics
    /// If either is 0.
    pub const fn new(num: u64, den: u64) -> Scale {
        assert!(num != 0 && den != 0, "a scale needs a non-zero fraction");
        Scale { num, den }
    }

    /// Guest events in `host` backend units (rounded down, saturating).
    pub fn to_guest(self, host: u64) -> u64 {
        let v = u128::from(host) * u128::from(self.num) / u128::from(self.den);
        u64::try_from(v).unwrap_or(u64::MAX)
    }

    /// The fewest backend units that make at least `guest` guest events (at least 1), i.e.
    /// `to_guest(to_host(n)) >= n`. Used to arm overflow notifications.
    pub fn to_host(self, guest: u64) -> u64 {
        let num = u128::from(self.num);
        let v = (u128::from(guest) * u128::from(self.den)).div_ceil(num);
        u64::try_from(v).unwrap_or(u64::MAX).max(1)
    }
}

impl Default for Scale {
    fn default() -> Scale {
        Scale::ONE
    }
}

/// A backend could not start counting. The model logs it and leaves the counter stopped (the
/// guest sees a counter that does not advance, never a fault: hardware has no such failure).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The backend cannot count this event (it should also have said so in `supports`).
    #[error("event not supported by the counter backend: {0:?}")]
    Unsupported(Event),
    /// The host refused (e.g. `perf_event_open` failed); the text says why.
    #[error("counter backend failed: {0}")]
    Host(String),
}

/// A source of counts for the virtual counters: perf software events, perf raw hardware events,
/// or the [`FakeBackend`](crate::fake::FakeBackend) of the tests.
///
/// The model drives it: it programs a counter when the guest's registers say the counter counts
/// (enable bit, global enable, privilege bits, an event the backend supports), stops it when
/// they say it does not, and asks for a notification before the virtual counter would wrap.
/// Every call comes from the vCPU thread that owns the [`Pmu`](crate::Pmu).
pub trait CounterBackend: Send + 'static {
    /// Whether this backend can count `event`. Also decides Intel's CPUID.0AH:EBX (an
    /// architectural event the backend cannot count is advertised as unavailable).
    fn supports(&self, event: &Event) -> bool;

    /// Guest events per backend unit for `event` (default: one to one).
    fn scale(&self, _event: &Event) -> Scale {
        Scale::ONE
    }

    /// Starts counting `event` on `ctr` from zero, replacing whatever `ctr` counted before and
    /// discarding its un-taken overflow. With `overflow_after = Some(n)`, report `ctr` from
    /// [`take_overflows`](Self::take_overflows) once `read(ctr)` reaches `n` (and kick the vCPU
    /// out of the guest, if the backend can, so that the model hears of it soon). Reporting
    /// late is fine; reporting early only costs a re-arm.
    fn program(
        &mut self,
        ctr: CounterId,
        event: &Event,
        overflow_after: Option<u64>,
    ) -> Result<(), BackendError>;

    /// Backend units counted on `ctr` since it was last programmed (0 if it is not).
    fn read(&mut self, ctr: CounterId) -> u64;

    /// Stops counting on `ctr` and discards its un-taken overflow.
    fn stop(&mut self, ctr: CounterId);

    /// Counters whose armed overflow point was reached since the last call, as a bitmap of
    /// [`CounterId::bit`]s; clears them.
    fn take_overflows(&mut self) -> u64;

    /// Called by the VMM (through [`Pmu::enter_guest`](crate::Pmu::enter_guest)) just before
    /// KVM_RUN. The model never calls it. For [`AccountingMode::CpuSwitch`] backends that must
    /// exclude VMM time themselves; default: nothing.
    fn enter_guest(&mut self) {}

    /// Called by the VMM (through [`Pmu::leave_guest`](crate::Pmu::leave_guest)) just after
    /// KVM_RUN returns. The model never calls it. Default: nothing.
    fn leave_guest(&mut self) {}

    /// The backend itself, for the VMM that made it: what it offers beyond counting for the
    /// guest (a host-side profiler's bookkeeping) is the VMM's business, reached by downcasting
    /// through [`Pmu::backend_mut`](crate::Pmu::backend_mut). The model never calls it.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;

    /// Switches the accounting mode at run time, outside KVM_RUN. The model calls it from
    /// [`Pmu::set_accounting_mode`](crate::Pmu::set_accounting_mode) with every running counter
    /// folded into its value, and re-programs them right after, so a backend only has to make
    /// its next [`program`](Self::program) calls follow the new mode. Default: nothing (a backend
    /// that cannot tell the modes apart, like the fake).
    fn set_mode(&mut self, _mode: AccountingMode) {}
}

/// What a backend charges to the guest's counters. Backends take it at construction and may be
/// switched at run time ([`CounterBackend::set_mode`]); the model's guest-visible rules are the
/// same in both modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AccountingMode {
    /// Count only while the vCPU is in the guest: the host's work on exits (KVM, the VMM's exit
    /// handling, device emulation) is excluded, as a CPU's PMU does on a world switch. A
    /// hardware backend gets this from `exclude_host`; a software backend must pause (or
    /// subtract) around KVM_RUN, using [`CounterBackend::enter_guest`]/[`leave_guest`].
    ///
    /// [`leave_guest`]: CounterBackend::leave_guest
    #[default]
    CpuSwitch,
    /// Count everything the vCPU thread does, the guest and the host work done for it (exit
    /// handling, device emulation), as one protection domain. The host kernel's per-task perf
    /// context switch does the save/restore; the VMM loop never pauses the counters.
    DomainSwitch,
}

impl AccountingMode {
    /// Both modes, in the order of [`AccountingMode::index`].
    pub const ALL: [AccountingMode; 2] = [AccountingMode::CpuSwitch, AccountingMode::DomainSwitch];

    /// Index of the mode in per-mode tables.
    pub fn index(self) -> usize {
        match self {
            AccountingMode::CpuSwitch => 0,
            AccountingMode::DomainSwitch => 1,
        }
    }

    /// The name the command line and the reports use (`--vpmu=cpu-switch`).
    pub fn name(self) -> &'static str {
        match self {
            AccountingMode::CpuSwitch => "cpu-switch",
            AccountingMode::DomainSwitch => "domain-switch",
        }
    }

    /// The mode of a [`AccountingMode::name`].
    pub fn parse(s: &str) -> Option<AccountingMode> {
        AccountingMode::ALL.into_iter().find(|m| m.name() == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_ids_number_like_global_status_bits() {
        assert_eq!(CounterId::gp(3).bit(), 3);
        assert_eq!(CounterId::fixed(2).bit(), 34);
        assert!(CounterId::fixed(0).is_fixed() && !CounterId::gp(0).is_fixed());
        assert_eq!(CounterId::fixed(1).index(), 1);
        let ids: Vec<_> = CounterId::iter_bits(0b101 | 1 << 33).collect();
        assert_eq!(
            ids,
            [CounterId::gp(0), CounterId::gp(2), CounterId::fixed(1)]
        );
        assert_eq!(CounterId::iter_bits(0).count(), 0);
        let ends: Vec<u8> = CounterId::iter_bits(1 | 1 << 63).map(|c| c.bit()).collect();
        assert_eq!(ends, [0, 63]);
        assert_eq!(CounterId::iter_bits(u64::MAX).count(), 64);
        assert_eq!(CounterId::fixed(1).to_string(), "fixed1");
    }

    #[test]
    fn scale_round_trips_without_undershoot() {
        let s = Scale::new(13, 5); // 2.6 events per unit
        assert_eq!(s.to_guest(5), 13);
        assert_eq!(s.to_guest(1), 2);
        for n in [1u64, 2, 3, 12, 13, 14, 1 << 20, (1 << 48) - 1, 1 << 48] {
            let h = s.to_host(n);
            assert!(s.to_guest(h) >= n, "n={n}");
            assert!(h == 1 || s.to_guest(h - 1) < n, "n={n}: not minimal");
        }
        assert_eq!(Scale::ONE.to_host(0), 1);
        assert_eq!(Scale::new(1, 1000).to_guest(u64::MAX), u64::MAX / 1000);
        assert_eq!(Scale::new(1000, 1).to_guest(u64::MAX), u64::MAX);
    }
}
