//! MSR numbers of the performance-monitoring registers this crate models.
//!
//! Names follow the Intel SDM Vol. 4 ("Model-Specific Registers", architectural MSRs) and the
//! AMD APM Vol. 2 ("Performance Monitoring Counters", and the MSR appendix) so that the code
//! can be read next to the manuals.
//!
//! The Intel architectural MSR numbers come from the `x86` crate (`x86::msr`), under the SDM's
//! names. The `x86` crate has none of the AMD performance-monitoring MSRs (PERF_CTLx/CTRx in
//! either range, the PerfMonV2 global registers) and no event-select or status bit fields, so
//! those are written out here from the manuals (docs/architecture.md, "The x86 crate").

// ---- Intel architectural performance monitoring (SDM Vol. 3B, "Architectural Performance
// Monitoring"; Vol. 4, "Architectural MSRs"); numbers from `x86::msr` ----

/// IA32_PMC0: first general-purpose counter; IA32_PMCx = IA32_PMC0 + x. Writes take the low
/// 32 bits sign-extended to the counter width.
pub const IA32_PMC0: u32 = x86::msr::IA32_PMC0;
/// IA32_PERFEVTSEL0: event select of IA32_PMC0; IA32_PERFEVTSELx = IA32_PERFEVTSEL0 + x.
pub const IA32_PERFEVTSEL0: u32 = x86::msr::IA32_PERFEVTSEL0;
/// IA32_FIXED_CTR0 (instructions retired); CTR1 (core cycles) and CTR2 (reference cycles)
/// follow.
pub const IA32_FIXED_CTR0: u32 = x86::msr::IA32_FIXED_CTR0;
/// IA32_PERF_CAPABILITIES (read-only; exists when CPUID.1:ECX.PDCM\[bit 15\] = 1).
pub const IA32_PERF_CAPABILITIES: u32 = x86::msr::IA32_PERF_CAPABILITIES;
/// IA32_FIXED_CTR_CTRL: four bits per fixed counter (OS, USR, AnyThread, PMI).
pub const IA32_FIXED_CTR_CTRL: u32 = x86::msr::IA32_FIXED_CTR_CTRL;
/// IA32_PERF_GLOBAL_STATUS (read-only): overflow bits, GP counters at 0.., fixed at 32...
/// (The `x86` crate spells it `IA32_PERF_GLOBAL_STAUS`.)
pub const IA32_PERF_GLOBAL_STATUS: u32 = x86::msr::IA32_PERF_GLOBAL_STAUS;
/// IA32_PERF_GLOBAL_CTRL: enable bits, GP counters at 0.., fixed at 32...
pub const IA32_PERF_GLOBAL_CTRL: u32 = x86::msr::IA32_PERF_GLOBAL_CTRL;
/// IA32_PERF_GLOBAL_OVF_CTRL: write 1 to clear the matching IA32_PERF_GLOBAL_STATUS bit.
pub const IA32_PERF_GLOBAL_OVF_CTRL: u32 = x86::msr::IA32_PERF_GLOBAL_OVF_CTRL;
/// IA32_A_PMC0: full-width alias of IA32_PMC0 (exists when IA32_PERF_CAPABILITIES.FW_WRITE).
pub const IA32_A_PMC0: u32 = x86::msr::IA32_A_PMC0;

/// The architecture allows at most this many general-purpose counters in the IA32_PMCx,
/// IA32_PERFEVTSELx and IA32_A_PMCx blocks (0xC1-0xC8, 0x186-0x18D, 0x4C1-0x4C8).
pub const INTEL_MAX_GP: u32 = 8;
/// The model owns this many fixed-counter MSRs (0x309-0x30C), so a guest probing a fourth
/// fixed counter gets #GP from the model, as from a CPU with three.
pub const INTEL_MAX_FIXED_MSRS: u32 = 4;

/// IA32_PERF_CAPABILITIES bit 13 (FW_WRITE): IA32_A_PMCx full-width writes are supported.
pub const PERF_CAP_FW_WRITE: u64 = 1 << 13;

// ---- AMD (APM Vol. 2, "Performance Monitoring Counters"); not in `x86::msr` ----

/// PerfEvtSel0 (legacy "K7" range): PERF_CTL0..3 at 0xC0010000..3.
pub const AMD_K7_PERF_CTL0: u32 = 0xc001_0000;
/// PerfCtr0 (legacy "K7" range): PERF_CTR0..3 at 0xC0010004..7.
pub const AMD_K7_PERF_CTR0: u32 = 0xc001_0004;
/// Counters in the legacy range.
pub const AMD_K7_COUNTERS: u32 = 4;
/// PERF_CTL0 in the core-extension range (CPUID Fn8000_0001_ECX\[PerfCtrExtCore\]): CTLn at
/// 0xC0010200 + 2n, CTRn at 0xC0010201 + 2n; the first four alias the legacy range.
pub const AMD_F15H_PERF_CTL0: u32 = 0xc001_0200;
/// Counters in the core-extension range.
pub const AMD_CORE_COUNTERS: u32 = 6;
/// PerfCntrGlobalStatus (PerfMonV2; read-only; writes are ignored).
pub const AMD_PERF_CNTR_GLOBAL_STATUS: u32 = 0xc000_0300;
/// PerfCntrGlobalCtl (PerfMonV2): enable bit per counter.
pub const AMD_PERF_CNTR_GLOBAL_CTL: u32 = 0xc000_0301;
/// PerfCntrGlobalStatusClr (PerfMonV2): write 1 to clear a status bit; reads as 0.
pub const AMD_PERF_CNTR_GLOBAL_STATUS_CLR: u32 = 0xc000_0302;
/// PerfCntrGlobalStatusSet (PerfMonV2): write 1 to set a status bit; reads as 0.
pub const AMD_PERF_CNTR_GLOBAL_STATUS_SET: u32 = 0xc000_0303;

// ---- Event-select fields shared by IA32_PERFEVTSELx and AMD PERF_CTLx ----

/// Event select, bits 7:0 (AMD: EventSelect\[7:0\]).
pub const EVTSEL_EVENT: u64 = 0xff;
/// Unit mask, bits 15:8.
pub const EVTSEL_UMASK: u64 = 0xff << 8;
/// USR: count at CPL > 0.
pub const EVTSEL_USR: u64 = 1 << 16;
/// OS: count at CPL 0.
pub const EVTSEL_OS: u64 = 1 << 17;
/// E: edge detect.
pub const EVTSEL_EDGE: u64 = 1 << 18;
/// INT: APIC interrupt (PMI) on overflow.
pub const EVTSEL_INT: u64 = 1 << 20;
/// EN: counter enable.
pub const EVTSEL_EN: u64 = 1 << 22;
/// INV: invert counter mask.
pub const EVTSEL_INV: u64 = 1 << 23;
/// CMASK: counter mask, bits 31:24.
pub const EVTSEL_CMASK_SHIFT: u32 = 24;
/// AMD EventSelect\[11:8\], bits 35:32.
pub const AMD_EVTSEL_EVENT_HI: u64 = 0xf << 32;

/// Reserved bits of IA32_PERFEVTSELx as KVM treats them for a version-2 PMU without TSX
/// (`pmu->reserved_bits` in arch/x86/kvm/vmx/pmu_intel.c): bit 21 (AnyThread) and 63:32.
/// Writing any of them takes #GP.
pub const INTEL_EVTSEL_RESERVED: u64 = 0xffff_ffff_0020_0000;
/// IN_TX (bit 32): count only inside Intel TSX transactional regions. Writable where the guest's
/// CPUID has RTM or HLE (KVM's intel_pmu_refresh: `HSW_IN_TX`).
pub const INTEL_EVTSEL_IN_TX: u64 = 1 << 32;
/// IN_TXCP (bit 33): leave aborted transactions' events out (checkpointed). Writable in
/// IA32_PERFEVTSEL2 only, where IN_TX is (`HSW_IN_TX_CHECKPOINTED`).
pub const INTEL_EVTSEL_IN_TXCP: u64 = 1 << 33;
/// The general-purpose counter IN_TXCP is writable in.
pub const INTEL_IN_TXCP_COUNTER: u8 = 2;
/// Reserved bits of AMD PERF_CTLx as KVM treats them (arch/x86/kvm/svm/pmu.c): bits 19, 21
/// and 63:36 (HostOnly/GuestOnly included). AMD hardware and KVM *ignore* writes to them: they
/// are dropped, and read back as 0.
pub const AMD_EVTSEL_RESERVED: u64 = 0xffff_fff0_0028_0000;

/// IA32_PERF_GLOBAL_STATUS bit 62 (OvfBuffer), clearable through IA32_PERF_GLOBAL_OVF_CTRL.
pub const INTEL_STATUS_OVF_BUF: u64 = 1 << 62;
/// IA32_PERF_GLOBAL_STATUS bit 63 (CondChgd), clearable through IA32_PERF_GLOBAL_OVF_CTRL.
pub const INTEL_STATUS_COND_CHGD: u64 = 1 << 63;

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers taken from the `x86` crate are the SDM's (Vol. 4, Table 2-2): a crate update
    /// that moved one would move the guest's view of the PMU.
    #[test]
    fn intel_msr_numbers_are_the_sdms() {
        let sdm = [
            (IA32_PMC0, 0xc1),
            (IA32_PERFEVTSEL0, 0x186),
            (IA32_FIXED_CTR0, 0x309),
            (IA32_PERF_CAPABILITIES, 0x345),
            (IA32_FIXED_CTR_CTRL, 0x38d),
            (IA32_PERF_GLOBAL_STATUS, 0x38e),
            (IA32_PERF_GLOBAL_CTRL, 0x38f),
            (IA32_PERF_GLOBAL_OVF_CTRL, 0x390),
            (IA32_A_PMC0, 0x4c1),
        ];
        for (ours, manual) in sdm {
            assert_eq!(ours, manual, "{ours:#x} != {manual:#x}");
        }
        // The per-counter MSRs are consecutive, as the model's `base + x` arithmetic assumes.
        assert_eq!(x86::msr::IA32_PMC7, IA32_PMC0 + INTEL_MAX_GP - 1);
        assert_eq!(
            x86::msr::IA32_PERFEVTSEL7,
            IA32_PERFEVTSEL0 + INTEL_MAX_GP - 1
        );
        assert_eq!(x86::msr::IA32_A_PMC7, IA32_A_PMC0 + INTEL_MAX_GP - 1);
        assert_eq!(x86::msr::IA32_FIXED_CTR2, IA32_FIXED_CTR0 + 2);
    }
}
