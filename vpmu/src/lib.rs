//! A virtual PMU for one vCPU: the guest-visible performance-monitoring registers of an Intel
//! or AMD CPU, over a pluggable source of counts. No KVM types: the VMM turns MSR exits into
//! [`Pmu::rdmsr`]/[`Pmu::wrmsr`] calls and the answers back into exit fields; everything here
//! reads like the manuals and is tested without `/dev/kvm`.
//!
//! # The model
//!
//! Two vendor tables over one counter core, as in Linux's KVM (arch/x86/kvm/pmu.c with
//! vmx/pmu_intel.c and svm/pmu.c):
//!
//! - **Intel** architectural performance monitoring version 2 (SDM Vol. 3B, "Architectural
//!   Performance Monitoring"): general-purpose counters IA32_PMCx with IA32_PERFEVTSELx, their
//!   full-width aliases IA32_A_PMCx (when IA32_PERF_CAPABILITIES.FW_WRITE is advertised),
//!   fixed counters IA32_FIXED_CTRx with IA32_FIXED_CTR_CTRL, and IA32_PERF_GLOBAL_CTRL /
//!   \_STATUS / \_OVF_CTRL. Advertised through CPUID leaf 0AH and CPUID.1:ECX.PDCM.
//! - **AMD** (APM Vol. 2, "Performance Monitoring Counters"): the four legacy PERF_CTL/PERF_CTR
//!   pairs at 0xC0010000, six with PerfCtrExtCore at 0xC0010200 (the first four aliasing the
//!   legacy ones), and PerfMonV2's PerfCntrGlobalCtl / Status / StatusClr / StatusSet.
//!   Advertised through CPUID Fn8000_0001_ECX\[23\] and Fn8000_0022.
//!
//! The core keeps, per counter, the select register, the decoded enable / interrupt / event,
//! and the value `base + scale(backend delta)` masked to the counter width (48 bits). A counter
//! counts when its enable bit is set, at least one of USR/OS is set, its global control bit is
//! set (Intel; AMD with PerfMonV2 — legacy AMD has no global control), and the backend supports
//! its event. Whenever the guest changes any of that, or writes the value, the core folds what
//! the backend counted into `base` and reprograms or stops the backend.
//!
//! Faults follow KVM, which follows the hardware: on Intel, reserved bits and writes to
//! read-only MSRs take #GP; on AMD, reserved bits are dropped and read-only writes ignored.
//! On both, MSRs of counters or features the configuration lacks take #GP. See [`Fault`].
//!
//! # Overflow and PMI
//!
//! A guest arms a counter by writing `-period` (e.g. IA32_PMC0 ← 0xFFFF_F000, sign-extended to
//! 0xFFFF_FFFF_F000): the counter overflows after `2^48 - value` events, and the backend is
//! programmed with `overflow_after` = that many events converted to backend units. When the
//! backend reports it ([`CounterBackend::take_overflows`], typically after kicking the vCPU out
//! of KVM_RUN), [`Pmu::service_overflow`] folds the counter, **sets its global status bit
//! first** (Intel, AMD PerfMonV2; legacy AMD shows the overflow only as bit 47 of the counter
//! clearing), re-arms it for the next wrap, and returns a [`Pmi`] if the counter has
//! interrupt-on-overflow set (INT, bit 20 of the event select; the PMI bit of its
//! IA32_FIXED_CTR_CTRL field) and the guest has not cleared that status bit meanwhile. The VMM
//! then delivers it through LVTPC (NMI, vector, or nothing if masked) and, for
//! Intel-compatible guests, masks LVTPC ([`Pmi::mask_lvtpc`]).
//!
//! # Backends
//!
//! [`CounterBackend`] is what a source of counts must do: say which events it supports, start
//! counting (with an optional overflow point), read, stop, report overflows. Real backends
//! (perf software events on the vCPU thread, perf raw hardware events) live with the VMM;
//! [`fake::FakeBackend`] counts only when a test tells it to. [`AccountingMode`] names the two
//! ways a backend can charge host work done for the guest.
//!
//! # For the VMM
//!
//! 1. `Pmu::new(config, backend)` per vCPU.
//! 2. CPUID: [`Pmu::cpuid_edits`] / [`Pmu::apply_cpuid`] with `--vpmu` on, [`cpuid::hide_pmu`]
//!    with it off.
//! 3. MSR filter: deny (i.e. exit to user space for) every range in [`Pmu::msr_ranges`];
//!    answer those exits with [`Pmu::rdmsr`]/[`Pmu::wrmsr`] (`Err` → `error = 1`, i.e. #GP).
//! 4. RDPMC (rewritten to RDMSR at known sites): [`Pmu::rdpmc`] with the guest's ECX; the
//!    filter must also send [`Pmu::rdpmc_ranges`] (as MSR indexes) to user space.
//! 5. Around KVM_RUN: [`Pmu::enter_guest`] / [`Pmu::leave_guest`] (for backends that account
//!    per [`AccountingMode::CpuSwitch`] by hand; no-ops otherwise).
//! 6. After every exit: [`Pmu::service_overflow`]; deliver the [`Pmi`] it returns.
//! 7. Optionally, before the first KVM_RUN: [`Pmu::set_event_filter`] with the operator's
//!    [`EventFilter`] (KVM_SET_PMU_EVENT_FILTER's allow/deny lists; [`filter`]).

mod amd;
pub mod backend;
mod config;
mod counter;
pub mod cpuid;
mod event;
pub mod fake;
pub mod filter;
pub mod guest_log;
mod intel;
pub mod msr;
mod pmu;

pub use backend::{AccountingMode, BackendError, CounterBackend, CounterId, Scale};
pub use config::{AmdConfig, ConfigError, IntelConfig, PmuConfig, Vendor};
pub use counter::{UncountedEvent, MAX_UNCOUNTED_NOTED};
pub use cpuid::{CpuidEdit, CpuidEntry, CpuidReg};
pub use event::{ArchEvent, Event};
pub use filter::{EventFilter, EventMatch, FilterAction, FilterError};
pub use pmu::{Fault, Pmi, Pmu};
