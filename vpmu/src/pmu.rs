//! [`Pmu`]: one vCPU's virtual PMU, the entry point the VMM talks to.

use std::ops::RangeInclusive;

use crate::amd::{self, AmdModel};
use crate::backend::{AccountingMode, CounterBackend, CounterId};
use crate::counter::CounterCore;
use crate::cpuid::{CpuidEdit, CpuidEntry};
use crate::intel::{self, IntelModel};
use crate::{ConfigError, EventFilter, PmuConfig, Vendor};

/// Why an access failed. Every variant means the same thing to the guest: inject #GP(0)
/// (for a WRMSR/RDMSR exit through the MSR filter: set the exit's `error` to 1). The variants
/// only say why, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    /// Not an MSR this model owns (the VMM's MSR filter and [`Pmu::msr_ranges`] disagree).
    #[error("MSR {0:#x} is not a PMU MSR of this model")]
    NotPmuMsr(u32),
    /// A PMU MSR this configuration does not have (a counter beyond the advertised number,
    /// IA32_A_PMCx without FW_WRITE, PerfMonV2 MSRs without PerfMonV2, ...).
    #[error("MSR {0:#x} does not exist in this PMU configuration")]
    Absent(u32),
    /// A write that sets reserved bits.
    #[error("write of {value:#x} to MSR {msr:#x} sets reserved bits {bits:#x}")]
    Reserved {
        /// The MSR.
        msr: u32,
        /// The value written.
        value: u64,
        /// The reserved bits it set.
        bits: u64,
    },
    /// A write to a read-only MSR (Intel; AMD ignores such writes).
    #[error("MSR {0:#x} is read-only")]
    ReadOnly(u32),
    /// RDPMC with an ECX that names no counter.
    #[error("RDPMC index {0:#x} names no counter")]
    BadRdpmcIndex(u32),
}

/// A performance-monitoring interrupt the VMM must deliver now, through the guest's LVTPC
/// (NMI, fixed vector, or nothing if masked: the VMM's business).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pmi {
    /// The counters that overflowed with interrupt-on-overflow set ([`CounterId::bit`]s).
    /// Their global status bits (Intel, AMD PerfMonV2) are already set.
    pub counters: u64,
    /// Set LVTPC's mask bit when delivering ([`Vendor::masks_lvtpc_after_pmi`]).
    pub mask_lvtpc: bool,
}

impl Pmi {
    /// The counters as ids.
    pub fn counter_ids(&self) -> impl Iterator<Item = CounterId> {
        CounterId::iter_bits(self.counters)
    }
}

enum Model {
    Intel(IntelModel),
    Amd(AmdModel),
}

/// One vCPU's virtual PMU: the guest-visible registers of one [`PmuConfig`] over a
/// [`CounterBackend`] that does the counting.
pub struct Pmu {
    config: PmuConfig,
    model: Model,
    core: CounterCore,
}

impl std::fmt::Debug for Pmu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pmu").field("config", &self.config).finish()
    }
}

impl Pmu {
    /// A PMU in its power-on state (every counter stopped and zero; the global control
    /// register, where there is one, enabling every general-purpose counter).
    pub fn new(config: PmuConfig, backend: Box<dyn CounterBackend>) -> Result<Pmu, ConfigError> {
        config.validate()?;
        let (model, core) = match config {
            PmuConfig::Intel(c) => {
                let (m, core) = IntelModel::new(c, backend);
                (Model::Intel(m), core)
            }
            PmuConfig::Amd(c) => {
                let (m, core) = AmdModel::new(c, backend);
                (Model::Amd(m), core)
            }
        };
        Ok(Pmu {
            config,
            model,
            core,
        })
    }

    /// The configuration this PMU was built from.
    pub fn config(&self) -> &PmuConfig {
        &self.config
    }

    /// The vendor of the model.
    pub fn vendor(&self) -> Vendor {
        self.config.vendor()
    }

    /// Every MSR this model answers, as few ranges, for the VMM's MSR filter (reads and
    /// writes). The whole architectural block of each kind is owned, also for counters or
    /// features this configuration lacks: those take #GP from [`rdmsr`](Self::rdmsr)/
    /// [`wrmsr`](Self::wrmsr), rather than whatever the host's KVM would do with them.
    ///
    /// Intel: 0xC1-0xC8, 0x186-0x18D, 0x309-0x30C, 0x345, 0x38D-0x390, 0x4C1-0x4C8.
    /// AMD: 0xC0010000-0xC0010007, 0xC0010200-0xC001020B, 0xC0000300-0xC0000303.
    pub fn msr_ranges(&self) -> Vec<RangeInclusive<u32>> {
        self.static_msr_ranges().to_vec()
    }

    fn static_msr_ranges(&self) -> &'static [RangeInclusive<u32>] {
        match self.vendor() {
            Vendor::Intel => &intel::MSR_RANGES,
            Vendor::Amd => &amd::MSR_RANGES,
        }
    }

    /// Whether `msr` is in [`msr_ranges`](Self::msr_ranges).
    pub fn owns(&self, msr: u32) -> bool {
        self.static_msr_ranges().iter().any(|r| r.contains(&msr))
    }

    /// The ECX values [`rdpmc`](Self::rdpmc) accepts (Intel: 0..GP counters and
    /// 0x4000_0000..+fixed counters; AMD: 0..counters). Where the VMM rewrites RDPMC into
    /// RDMSR, these are also the MSR indexes those RDMSRs carry: its MSR filter must send them
    /// to user space too, and it answers them with `rdpmc` only at rewritten sites.
    pub fn rdpmc_ranges(&self) -> Vec<RangeInclusive<u32>> {
        match &self.model {
            Model::Intel(m) => m.rdpmc_ranges(),
            Model::Amd(m) => m.rdpmc_ranges(),
        }
    }

    /// A guest RDMSR.
    pub fn rdmsr(&mut self, msr: u32) -> Result<u64, Fault> {
        let r = match &self.model {
            Model::Intel(m) => m.rdmsr(&mut self.core, msr),
            Model::Amd(m) => m.rdmsr(&mut self.core, msr),
        };
        log::trace!("vpmu: rdmsr {msr:#x} -> {r:x?}");
        r
    }

    /// A guest WRMSR (`value` = EDX:EAX).
    pub fn wrmsr(&mut self, msr: u32, value: u64) -> Result<(), Fault> {
        let r = match &self.model {
            Model::Intel(m) => m.wrmsr(&mut self.core, msr, value),
            Model::Amd(m) => m.wrmsr(&mut self.core, msr, value),
        };
        log::trace!("vpmu: wrmsr {msr:#x} <- {value:#x}: {r:?}");
        r
    }

    /// A guest RDPMC with this ECX. Intel: ECX\[15:0\] < general-purpose counters, or
    /// ECX\[30\] set and ECX\[15:0\] < fixed counters; any other bit set is #GP. AMD:
    /// ECX < counters. The CR4.PCE / CPL check is the caller's (it knows the vCPU's state).
    pub fn rdpmc(&mut self, ecx: u32) -> Result<u64, Fault> {
        match &self.model {
            Model::Intel(m) => m.rdpmc(&mut self.core, ecx),
            Model::Amd(m) => m.rdpmc(&mut self.core, ecx),
        }
    }

    /// The CPUID edits that advertise this PMU (and hide the other vendor's PMU bits). Apply
    /// them to the vCPU's table before its first KVM_RUN, after everything else that touches
    /// these leaves. See [`crate::cpuid`].
    pub fn cpuid_edits(&self) -> Vec<CpuidEdit> {
        match &self.model {
            Model::Intel(m) => m.cpuid_edits(),
            Model::Amd(m) => m.cpuid_edits(),
        }
    }

    /// Applies [`cpuid_edits`](Self::cpuid_edits) to `table`.
    pub fn apply_cpuid(&self, table: &mut Vec<CpuidEntry>) {
        crate::cpuid::apply(&self.cpuid_edits(), table);
    }

    /// Collects the backend's overflow reports and returns the PMI to deliver, if one is due.
    ///
    /// Call it after every exit (it is cheap) and whenever the backend has kicked the vCPU
    /// (e.g. KVM_RUN returned EINTR). By the time it returns `Some`, the overflowed counters'
    /// global status bits are set; a PMI is never returned for a counter without
    /// interrupt-on-overflow, nor for one whose status bit the guest cleared in the meantime.
    /// Pending PMIs are forgotten once returned: the VMM delivers or drops (masked LVTPC,
    /// throttling) them.
    pub fn service_overflow(&mut self) -> Option<Pmi> {
        let counters = self.core.service_overflow();
        (counters != 0).then(|| Pmi {
            counters,
            mask_lvtpc: self.mask_lvtpc_after_pmi(),
        })
    }

    /// Whether the VMM must set LVTPC's mask bit when it delivers a PMI (Intel-compatible:
    /// yes; AMD: no).
    pub fn mask_lvtpc_after_pmi(&self) -> bool {
        self.vendor().masks_lvtpc_after_pmi()
    }

    /// Back to the power-on state (vCPU RESET/INIT).
    pub fn reset(&mut self) {
        self.core.reset();
    }

    /// Deferred reprogramming, as KVM does it (`kvm_pmu_request_counter_reprogram`, then
    /// `kvm_pmu_handle_event` before VM entry): with `on`, guest writes (select, counter value,
    /// global control), mode switches and filter changes only update the model's registers and
    /// mark the counters they touch dirty; the backend hears of them in
    /// [`reprogram_dirty`](Self::reprogram_dirty), once per dirty counter, however many writes
    /// touched it. Reads are answered from the model's registers and are exact meanwhile (a
    /// dirty counter holds its value and does not count until it is reprogrammed). Off (the
    /// default): every write reaches the backend at once; turning it off reprograms what is
    /// dirty. The VMM turns it on and calls [`reprogram_dirty`](Self::reprogram_dirty) before
    /// every KVM_RUN.
    pub fn set_deferred_reprogram(&mut self, on: bool) {
        self.core.set_deferred(on);
    }

    /// Counters whose backend program is out of date ([`CounterId::mask`]s; 0 unless
    /// [deferred](Self::set_deferred_reprogram)).
    pub fn dirty_counters(&self) -> u64 {
        self.core.dirty()
    }

    /// Programs (or stops) every dirty counter in the backend: one backend call per dirty
    /// counter that counts or was counting, none when nothing is dirty. Call it before the
    /// guest runs again (before KVM_RUN, outside the cpu-switch gate).
    #[inline]
    pub fn reprogram_dirty(&mut self) {
        if self.core.dirty() != 0 {
            self.core.reprogram_dirty();
        }
    }

    /// Forwards to [`CounterBackend::enter_guest`]: call just before KVM_RUN.
    pub fn enter_guest(&mut self) {
        self.core.backend_mut().enter_guest();
    }

    /// Forwards to [`CounterBackend::leave_guest`]: call just after KVM_RUN returns.
    pub fn leave_guest(&mut self) {
        self.core.backend_mut().leave_guest();
    }

    /// The counter backend, for the VMM that made it ([`CounterBackend::as_any_mut`]).
    pub fn backend_mut(&mut self) -> &mut dyn CounterBackend {
        self.core.backend_mut()
    }

    /// Switches the accounting mode at run time (call outside KVM_RUN): counts so far are kept,
    /// counting goes on under the new mode's rules.
    pub fn set_accounting_mode(&mut self, mode: AccountingMode) {
        self.core.set_mode(mode);
    }

    /// Sets the operator's event filter (`None`: none), as KVM_SET_PMU_EVENT_FILTER: a counter
    /// whose event the filter refuses keeps its registers (they read back what the guest wrote)
    /// but never counts. Takes effect at once, also for counters already running.
    pub fn set_event_filter(&mut self, filter: Option<EventFilter>) {
        self.core.set_filter(filter);
    }

    /// The event filter, if one is set.
    pub fn event_filter(&self) -> Option<&EventFilter> {
        self.core.filter()
    }

    /// How many times the event filter kept a counter from counting: each time a guest write
    /// (select, value, global control) left a counter enabled but its event refused.
    pub fn filter_blocked(&self) -> u64 {
        self.core.filter_blocked()
    }

    /// Events the guest enabled that the backend cannot count (their counters stayed still),
    /// each once, in the order first met (e.g. instructions on the soft backend).
    pub fn uncounted(&self) -> &[(crate::UncountedEvent, Option<crate::ArchEvent>)] {
        self.core.uncounted()
    }

    /// The backend, e.g. to print its statistics.
    pub fn backend(&self) -> &dyn CounterBackend {
        self.core.backend()
    }
}
