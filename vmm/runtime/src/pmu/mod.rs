//! The VMM side of the virtual PMU: one [`VcpuPmu`] per vCPU joins the `vpmu` model (which has
//! no KVM types) to KVM: MSR exits go straight to the model, which drives its counter backend
//! ([`backend`]); after each exit a due PMI is delivered through the guest's LVTPC ([`pmi`]).
//! [`setup`] holds what is done once per VM (MSR filter) or per vCPU (CPUID).

pub mod backend;
pub mod mode;
pub(crate) mod perf;
pub mod pmi;
pub mod rdpmc;
pub(crate) mod rdpmc_trap;
pub mod setup;

use std::sync::Arc;
use std::time::Instant;

use crate::exit::{GpFault, MsrHandler};
use crate::merge::Distinct;
use crate::vcpu_access::VcpuAccess;
use backend::PerfBackend;

/// Which counter backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// hw when the host has a hardware PMU (`/sys/bus/event_source/devices/cpu`), else soft.
    Auto,
    /// perf software task-clock: runs anywhere; only cycle events count.
    Soft,
    /// perf raw hardware events (needs a host PMU and VT-x/SVM).
    Hw,
    /// Hidden, for tests: the hw source over a simulated host PMU (`backend::SimHost`: every
    /// hardware event counts the vCPU thread's CPU time x TSC rate, split at KVM_RUN into guest
    /// and host mode). Checks the hw path end to end on hosts without a PMU.
    #[value(hide = true)]
    Sim,
}

/// Which PMU (and, for Intel on a non-Intel host, which CPU) the guest sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelChoice {
    /// Follow the guest's CPUID vendor (the host's).
    Auto,
    /// Intel arch perfmon v2; on a host that is not Intel the whole guest CPU becomes a generic
    /// Intel one (GenuineIntel, family 6, a model no kernel lists: `vcpu::identity`).
    Intel,
    /// AMD counters (PerfCtrExtCore, PerfMonV2); on a host that is not AMD the whole guest CPU
    /// becomes a generic AMD one (AuthenticAMD, family 0x19 model 0x11: `vcpu::identity`).
    Amd,
}

/// `--vpmu`: whether the guest has a PMU, and in which accounting mode it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum VpmuSetting {
    /// No PMU in the guest.
    #[default]
    Off,
    /// Counters run only while the vCPU executes guest code.
    CpuSwitch,
    /// Counters run whenever the vCPU thread runs, VMM exit handling included.
    DomainSwitch,
}

/// `--rdpmc`: how guest RDPMC reaches the vPMU (pmu/rdpmc.rs, pmu/rdpmc_trap.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum RdpmcSetting {
    /// Patch when every RDPMC in the guest kernel can be proven safe to rewrite, else trap
    /// (the log says which and why).
    #[default]
    Auto,
    /// Rewrite each RDPMC in the guest kernel's text to RDMSR and answer it from the vPMU;
    /// refuse to start if one cannot be proven safe. Guest user-space RDPMC is not served.
    Patch,
    /// No patching: trap the guest's #GP handler and answer every RDPMC the guest executes,
    /// kernel or user (CR4.PCE) space, from the vPMU; other #GPs go to the guest.
    Trap,
    /// Leave RDPMC to KVM (which, on hosts without a PMU, makes it fault).
    Off,
}

/// Per-vCPU PMU state on the vCPU thread.
pub struct VcpuPmu {
    pub pmu: vpmu::Pmu,
    pub limiter: pmi::PmiLimiter,
    /// A PMI the rate limit holds back, and the timer that brings the vCPU back when it may go
    /// (created on the vCPU thread at first need).
    pub held: Option<vpmu::Pmi>,
    pub timer: Option<crate::vcpu_access::kick::KickTimer>,
    /// LVTPC's mask bit as an Intel CPU sets it when it delivers a PMI, kept here and not in the
    /// in-kernel LAPIC: KVM has no ioctl for one LAPIC register, and KVM_SET_LAPIC writes the
    /// whole page back, IRR included, losing any interrupt another vCPU or a device raised
    /// since the page was read (the 2-vCPU Intel-model boots on the SVM host hung on it). Set
    /// at a PMI of an Intel-compatible model; cleared when the guest acknowledges an overflow
    /// (IA32_PERF_GLOBAL_OVF_CTRL), as its PMI handler does beside unmasking LVTPC, which the
    /// VMM cannot see. While set, a PMI is dropped as a masked LVTPC drops it.
    pub lvtpc_masked_by_pmi: bool,
    pub stats: PmuStats,
    /// Rewritten RDPMC sites (empty with `--rdpmc off`).
    pub rdpmc: Arc<rdpmc::RdpmcSites>,
    /// The VM's accounting mode, and the one this vCPU counts in now.
    pub mode_switch: Arc<mode::ModeSwitch>,
    pub mode: vpmu::AccountingMode,
    /// Guest TSC = host TSC + this ([`crate::vcpu_access::guest_tsc_offset`]; 0 where KVM does
    /// not say): puts the PMI timestamps in `stats` on the guest's TSC.
    pub guest_tsc_offset: i64,
}

/// Host time on the vCPU thread that the guest's counters of `mode` counted for a host-side
/// profile sample's interruption of the guest (from perf's notification to the VMM's look at
/// it), which the vPMU is to forget (`VcpuRecorder::after_exit` measures it; the VMM's sample
/// work after that is left out by the backend: `VcpuPmu::host_work_begins`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SamplerTime {
    pub mode: vpmu::AccountingMode,
    pub ns: u64,
}

impl VcpuPmu {
    /// The VMM's perf backend under the model (None: another backend, as unit tests give).
    fn backend(&mut self) -> Option<&mut PerfBackend> {
        self.pmu.backend_mut().as_any_mut().downcast_mut()
    }

    /// A host-side profile sample cost the guest's counters `t`: forgotten when they count in
    /// the sample's mode (the sampler's count measured it in that mode; in another the figure
    /// would not be what the counters counted).
    pub(crate) fn forget_sampler_time(&mut self, t: SamplerTime) {
        if t.mode == self.mode {
            self.stats.sampler_ns_forgotten +=
                self.backend().map_or(0, |b| b.forget_host_time(t.ns));
        }
    }

    /// The VMM's work for a host-side profile sample begins: not the guest's (see
    /// [`PerfBackend::host_work_begins`]).
    pub fn host_work_begins(&mut self) {
        if let Some(b) = self.backend() {
            b.host_work_begins();
        }
    }

    /// ... and ends: left out of the guest's counts where they count it (domain-switch).
    pub(crate) fn host_work_ends(&mut self) {
        if let Some(ns) = self.backend().and_then(|b| b.host_work_ends()) {
            self.stats.sampler_work_ns_left_out += ns;
        }
        self.stats.samples_left_out += 1;
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PmuStats {
    pub msr_reads: u64,
    pub msr_writes: u64,
    pub gp_faults: u64,
    /// Guest RDPMCs answered from the vPMU (rewritten sites and trapped ones).
    pub rdpmc_reads: u64,
    /// Of `rdpmc_reads`, those served through the #GP trap (`--rdpmc trap`).
    pub rdpmc_trapped: u64,
    /// #GPs the trap passed to the guest's handler (not an RDPMC the vPMU serves).
    pub gp_delivered: u64,
    /// Of `gp_delivered`, RDPMCs that fault as on hardware (CPL3 without CR4.PCE, an index
    /// naming no counter, a frame IRETQ would refuse).
    pub rdpmc_gp: u64,
    /// Of `rdpmc_reads`, those of Intel fixed counters (ECX bit 30): the guest's driver put an
    /// event (e.g. its NMI watchdog's cycles) on a fixed counter.
    pub rdpmc_fixed: u64,
    /// RDMSRs of an RDPMC index number from elsewhere (answered by KVM).
    pub rdpmc_genuine_msr: u64,
    /// PMIs delivered and RDPMCs served, per accounting mode ([`AccountingMode::index`]).
    pub by_mode: [ModeCounts; 2],
    /// Accounting-mode changes this vCPU applied.
    pub mode_switches: u64,
    pub pmis_nmi: u64,
    pub pmis_vector: u64,
    /// PMIs dropped because LVTPC was masked (as hardware does).
    pub pmis_masked: u64,
    /// ns of host time a host-side profile's interruptions of the guest cost its counters,
    /// which they forgot (soft backend; see `VcpuPmu::forget_sampler_time`).
    pub sampler_ns_forgotten: u64,
    /// Host-side profile samples whose VMM work the guest's counters were told to leave out
    /// (every backend; only domain-switch counts it, see `VcpuPmu::host_work_begins`).
    pub samples_left_out: u64,
    /// ns of that work the soft backend left out (the hw source leaves events out, not ns).
    pub sampler_work_ns_left_out: u64,
    /// PMIs the rate limit held back (each delivered later, merged with any that came meanwhile).
    pub pmis_throttled: u64,
    /// PMIs the model raised (counter overflows with interrupt-on-overflow whose status bit was
    /// still set): each is delivered (`pmis_nmi`, `pmis_vector`), dropped (`pmis_masked`), merged
    /// into one held back (`pmis_merged`), still held at the end (`pmis_held_at_end`), or lost
    /// to a failed injection (logged).
    pub pmis_raised: u64,
    /// Raised PMIs merged into one the rate limit was holding back (delivered with it).
    pub pmis_merged: u64,
    /// PMIs still held back by the rate limit when the vCPU stopped (0 or 1 per vCPU).
    pub pmis_held_at_end: u64,
    /// Signals (counter overflows from perf, kick timers, stop and mode-switch kicks) that
    /// arrived on the vCPU thread: the host-side interrupt load the guest caused.
    pub signals: u64,
    /// TSC at the overflow signal behind each of the first [`MAX_PMI_TSCS`] NMIs delivered, on
    /// the guest's TSC (the host's plus the vCPU's offset; 0: no signal behind it); with the
    /// guest's handler-entry TSC this gives the PMI latency (benches/).
    pub pmi_signal_tsc: Vec<u64>,
    /// Counter programmings the `--pmu-event-filter` refused ([`vpmu::Pmu::filter_blocked`]):
    /// this vCPU's, or the sum.
    pub filter_blocked: u64,
    /// `filter_blocked` by vCPU: a vCPU's own is `[filter_blocked]`; merged, the VM's total
    /// lists its vCPUs' counts by vCPU id.
    pub filter_blocked_by_vcpu: Vec<u64>,
    /// Events the guest enabled that the backend cannot count ([`vpmu::Pmu::uncounted`]): the
    /// counter stayed still, so the guest read 0 for them. Each once (the sum: across vCPUs).
    pub uncounted: Distinct<(vpmu::UncountedEvent, Option<vpmu::ArchEvent>)>,
    /// TSC right after each of those NMIs was queued (KVM_NMI returned, or `nmi.pending` was
    /// set in kvm_run's events for the next KVM_RUN), on the guest's TSC as `pmi_signal_tsc`:
    /// with `pmi_signal_tsc`, the VMM's cost per
    /// delivered sample (benches/).
    pub pmi_inject_tsc: Vec<u64>,
}

/// Enough for a period-1 storm of a tiny guest (vmm/tests/vpmu_tiny.rs replays all its
/// deliveries through the rate limiter when that never acted); 128 KiB per vCPU at most.
pub const MAX_PMI_TSCS: usize = 8192;

/// RDPMC ECX bit 30: an Intel fixed counter.
const RDPMC_FIXED: u32 = 1 << 30;

/// Counts taken in one accounting mode.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ModeCounts {
    pub pmis: u64,
    pub rdpmc_reads: u64,
}

crate::merge_fields!(ModeCounts { pmis, rdpmc_reads });

crate::merge_fields!(PmuStats {
    msr_reads,
    msr_writes,
    gp_faults,
    rdpmc_reads,
    rdpmc_trapped,
    gp_delivered,
    rdpmc_gp,
    rdpmc_fixed,
    rdpmc_genuine_msr,
    by_mode,
    mode_switches,
    pmis_nmi,
    pmis_vector,
    pmis_masked,
    sampler_ns_forgotten,
    samples_left_out,
    sampler_work_ns_left_out,
    pmis_throttled,
    pmis_raised,
    pmis_merged,
    pmis_held_at_end,
    signals,
    pmi_signal_tsc,
    filter_blocked,
    filter_blocked_by_vcpu,
    uncounted,
    pmi_inject_tsc,
});

impl VcpuPmu {
    pub fn new(
        pmu: vpmu::Pmu,
        pmi_limit: u32,
        rdpmc: Arc<rdpmc::RdpmcSites>,
        mode_switch: Arc<mode::ModeSwitch>,
    ) -> Self {
        let mode = mode_switch.get();
        VcpuPmu {
            pmu,
            limiter: pmi::PmiLimiter::new(pmi_limit, Instant::now()),
            held: None,
            timer: None,
            lvtpc_masked_by_pmi: false,
            stats: PmuStats::default(),
            rdpmc,
            mode_switch,
            mode,
            guest_tsc_offset: 0,
        }
    }

    /// At each exit: if the VM's accounting mode changed, count in the new one from now on.
    pub(crate) fn follow_mode(&mut self) {
        let want = self.mode_switch.get();
        if want != self.mode {
            self.pmu.set_accounting_mode(want);
            self.mode = want;
            self.stats.mode_switches += 1;
        }
    }

    /// The per-mode counts of the mode this vCPU counts in now.
    pub(crate) fn in_mode(&mut self) -> &mut ModeCounts {
        &mut self.stats.by_mode[self.mode.index()]
    }
}

impl MsrHandler for VcpuPmu {
    fn rdmsr(&mut self, index: u32, cpu: &mut dyn VcpuAccess) -> Result<u64, GpFault> {
        if self.rdpmc.is_index(index) {
            // An RDPMC index number: a rewritten RDPMC (answered by the vPMU) or a genuine
            // RDMSR of that MSR (answered by KVM, as if there were no filter).
            if cpu.rip().is_ok_and(|rip| self.rdpmc.is_site(rip)) {
                self.stats.rdpmc_reads += 1;
                self.in_mode().rdpmc_reads += 1;
                if index & RDPMC_FIXED != 0 {
                    self.stats.rdpmc_fixed += 1;
                }
                return self.pmu.rdpmc(index).map_err(|f| {
                    self.stats.gp_faults += 1;
                    log::debug!("rdpmc {index:#x}: #GP ({f:?})");
                    GpFault
                });
            }
            self.stats.rdpmc_genuine_msr += 1;
            return cpu.msr(index).ok().flatten().ok_or(GpFault);
        }
        self.stats.msr_reads += 1;
        self.pmu.rdmsr(index).map_err(|f| {
            self.stats.gp_faults += 1;
            log::debug!("rdmsr {index:#x}: #GP ({f:?})");
            GpFault
        })
    }

    fn wrmsr(&mut self, index: u32, value: u64) -> Result<(), GpFault> {
        self.stats.msr_writes += 1;
        self.pmu.wrmsr(index, value).map_err(|f| {
            self.stats.gp_faults += 1;
            log::debug!("wrmsr {index:#x} <- {value:#x}: #GP ({f:?})");
            GpFault
        })?;
        if index == vpmu::msr::IA32_PERF_GLOBAL_OVF_CTRL {
            self.lvtpc_masked_by_pmi = false;
        }
        Ok(())
    }
}
