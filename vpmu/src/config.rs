//! Which PMU the guest sees: vendor, version, counter counts and widths.

/// CPU vendor whose PMU is modelled (and whose event codes [`Event`](crate::Event) carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    /// Intel architectural performance monitoring.
    Intel,
    /// AMD64 performance counters.
    Amd,
}

impl Vendor {
    /// Whether delivering a PMI sets the mask bit of the local APIC's LVT performance-counter
    /// register (LVTPC). Intel CPUs do (SDM Vol. 3A, "Local Vector Table": the PMI handler
    /// must unmask LVTPC again), and KVM emulates it for Intel-compatible guests
    /// (`kvm_apic_local_deliver`); AMD CPUs do not. The VMM applies it when it injects the PMI.
    pub const fn masks_lvtpc_after_pmi(self) -> bool {
        matches!(self, Vendor::Intel)
    }
}

/// The guest's PMU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmuConfig {
    /// Intel architectural performance monitoring, version 2.
    Intel(IntelConfig),
    /// AMD performance counters.
    Amd(AmdConfig),
}

impl PmuConfig {
    /// Intel defaults: [`IntelConfig::default`].
    pub fn intel() -> PmuConfig {
        PmuConfig::Intel(IntelConfig::default())
    }

    /// AMD defaults: [`AmdConfig::default`].
    pub fn amd() -> PmuConfig {
        PmuConfig::Amd(AmdConfig::default())
    }

    /// The vendor of this model.
    pub fn vendor(&self) -> Vendor {
        match self {
            PmuConfig::Intel(_) => Vendor::Intel,
            PmuConfig::Amd(_) => Vendor::Amd,
        }
    }

    /// Checks the numbers against what the architecture (and KVM) allow.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            PmuConfig::Intel(c) => {
                if !(1..=crate::msr::INTEL_MAX_GP as u8).contains(&c.gp_counters) {
                    return Err(ConfigError::GpCounters(c.gp_counters));
                }
                if c.fixed_counters > 3 {
                    return Err(ConfigError::FixedCounters(c.fixed_counters));
                }
                if !(32..=48).contains(&c.counter_width) {
                    return Err(ConfigError::Width(c.counter_width));
                }
                if c.full_width_writes && !c.pdcm {
                    return Err(ConfigError::FullWidthWithoutPdcm);
                }
                Ok(())
            }
            PmuConfig::Amd(AmdConfig::PerfMonV2 { counters }) => {
                if !(1..=crate::msr::AMD_CORE_COUNTERS as u8).contains(&counters) {
                    return Err(ConfigError::GpCounters(counters));
                }
                Ok(())
            }
            PmuConfig::Amd(_) => Ok(()),
        }
    }
}

/// An Intel architectural PMU, version 2 (SDM Vol. 3B, "Architectural Performance Monitoring
/// Version 2"): general-purpose counters, fixed counters, IA32_PERF_GLOBAL_CTRL/STATUS/OVF_CTRL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntelConfig {
    /// General-purpose counters, 1..=8 (CPUID.0AH:EAX\[15:8\]).
    pub gp_counters: u8,
    /// Fixed counters, 0..=3 (CPUID.0AH:EDX\[4:0\]).
    pub fixed_counters: u8,
    /// Width of every counter in bits, 32..=48 (CPUID.0AH:EAX\[23:16\] and EDX\[12:5\]).
    pub counter_width: u8,
    /// Advertise IA32_PERF_CAPABILITIES (CPUID.1:ECX.PDCM\[bit 15\]).
    pub pdcm: bool,
    /// Advertise IA32_PERF_CAPABILITIES.FW_WRITE\[bit 13\] and serve IA32_A_PMCx. Needs `pdcm`.
    pub full_width_writes: bool,
    /// The guest's CPUID has Intel TSX (RTM or HLE, CPUID.(EAX=7,ECX=0):EBX\[11\] or \[4\]): the
    /// TSX qualifiers IN_TX (bit 32, every IA32_PERFEVTSELx) and IN_TXCP (bit 33,
    /// IA32_PERFEVTSEL2 only) are writable, as KVM's intel_pmu_refresh makes them.
    pub tsx: bool,
}

impl Default for IntelConfig {
    /// 4 general-purpose and 3 fixed counters of 48 bits, with full-width writes (what KVM
    /// gives a guest on a recent Intel host).
    fn default() -> IntelConfig {
        IntelConfig {
            gp_counters: 4,
            fixed_counters: 3,
            counter_width: 48,
            pdcm: true,
            full_width_writes: true,
            tsx: false,
        }
    }
}

/// An AMD PMU (APM Vol. 2, "Performance Monitoring Counters"). Counters are 48 bits wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AmdConfig {
    /// The four legacy counters at 0xC0010000-7. No CPUID bit advertises them: a guest finds
    /// them by probing.
    Legacy,
    /// Six counters (CPUID Fn8000_0001_ECX\[PerfCtrExtCore\], bit 23) at 0xC0010200-B, the first
    /// four also reachable through the legacy MSRs.
    CoreExt,
    /// PerfMonV2 (CPUID Fn8000_0022_EAX\[PerfMonV2\], bit 0) on top of `CoreExt`: `counters`
    /// counters (1..=6, Fn8000_0022_EBX\[3:0\]) and PerfCntrGlobalCtl/Status/StatusClr/StatusSet.
    PerfMonV2 {
        /// Number of core counters.
        counters: u8,
    },
}

impl Default for AmdConfig {
    /// PerfMonV2 with six counters (a Zen 4 or later CPU).
    fn default() -> AmdConfig {
        AmdConfig::PerfMonV2 {
            counters: crate::msr::AMD_CORE_COUNTERS as u8,
        }
    }
}

impl AmdConfig {
    /// Number of counters the guest has.
    pub fn counters(self) -> u8 {
        match self {
            AmdConfig::Legacy => crate::msr::AMD_K7_COUNTERS as u8,
            AmdConfig::CoreExt => crate::msr::AMD_CORE_COUNTERS as u8,
            AmdConfig::PerfMonV2 { counters } => counters,
        }
    }

    /// Whether the core-extension MSRs (0xC0010200-B) exist.
    pub fn perfctr_core(self) -> bool {
        !matches!(self, AmdConfig::Legacy)
    }

    /// Whether PerfMonV2 (global control and status) exists.
    pub fn perfmon_v2(self) -> bool {
        matches!(self, AmdConfig::PerfMonV2 { .. })
    }
}

/// A [`PmuConfig`] the architecture does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Too few or too many general-purpose counters.
    #[error("{0} general-purpose counters: Intel allows 1..=8, AMD PerfMonV2 1..=6")]
    GpCounters(u8),
    /// Too many fixed counters.
    #[error("{0} fixed counters: the model has at most 3")]
    FixedCounters(u8),
    /// Counter width out of range.
    #[error("{0}-bit counters: the model supports 32..=48 bits")]
    Width(u8),
    /// Full-width writes are advertised in IA32_PERF_CAPABILITIES, which needs PDCM.
    #[error("full-width counter writes need PDCM (IA32_PERF_CAPABILITIES)")]
    FullWidthWithoutPdcm,
}
