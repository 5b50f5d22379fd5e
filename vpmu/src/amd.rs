//! AMD performance counters (APM Vol. 2, "Performance Monitoring Counters"): the legacy K7
//! counters, PerfCtrExtCore and PerfMonV2, as a vendor table over the counter core, mirroring
//! arch/x86/kvm/svm/pmu.c and the AMD half of arch/x86/kvm/pmu.c.
//!
//! Where Intel faults, AMD ignores: reserved bits of PERF_CTLx and PerfCntrGlobalCtl are dropped,
//! and writes to the read-only PerfCntrGlobalStatus are ignored (KVM: "AMD ignores writes to
//! reserved bits and read-only PMU MSRs, whereas Intel generates #GP"). MSRs that do not exist
//! in the configuration, and RDPMC of a counter that does not exist, do take #GP.

use std::ops::RangeInclusive;

use crate::backend::{CounterBackend, CounterId};
use crate::counter::{Control, CoreLayout, CounterCore};
use crate::cpuid::{self, CpuidEdit, CpuidEntry, CpuidReg};
use crate::msr::*;
use crate::{AmdConfig, Event, Fault};

/// Width of every AMD counter (APM: 48-bit counters).
pub(crate) const COUNTER_WIDTH: u8 = 48;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AmdMsr {
    PerfCtl(u8),
    PerfCtr(u8),
    GlobalStatus,
    GlobalCtl,
    GlobalStatusClr,
    GlobalStatusSet,
}

/// The MSR blocks an AMD model owns, whatever its configuration (MSRs the configuration lacks
/// take #GP from the model).
pub(crate) const MSR_RANGES: [RangeInclusive<u32>; 3] = [
    AMD_K7_PERF_CTL0..=AMD_K7_PERF_CTR0 + AMD_K7_COUNTERS - 1,
    AMD_F15H_PERF_CTL0..=AMD_F15H_PERF_CTL0 + 2 * AMD_CORE_COUNTERS - 1,
    AMD_PERF_CNTR_GLOBAL_STATUS..=AMD_PERF_CNTR_GLOBAL_STATUS_SET,
];

/// Decoded PERF_CTLx, reserved bits already dropped.
fn control(sel: u64) -> Control {
    Control {
        enabled: sel & EVTSEL_EN != 0,
        int: sel & EVTSEL_INT != 0,
        event: Event::from_amd_evtsel(sel),
    }
}

pub(crate) struct AmdModel {
    cfg: AmdConfig,
}

impl AmdModel {
    pub(crate) fn new(cfg: AmdConfig, backend: Box<dyn CounterBackend>) -> (AmdModel, CounterCore) {
        let v2 = cfg.perfmon_v2();
        let layout = CoreLayout {
            gp: cfg.counters(),
            fixed: 0,
            width: COUNTER_WIDTH,
            global_ctrl: v2,
            global_status: v2,
            reset_gp: control(0),
            reset_fixed: |_| unreachable!("AMD has no fixed counters"),
            blocked: Vec::new(),
        };
        (AmdModel { cfg }, CounterCore::new(layout, backend))
    }

    fn counter_bits(&self) -> u64 {
        (1u64 << self.cfg.counters()) - 1
    }

    /// Decodes `msr` and checks that it exists in this configuration (KVM's
    /// `amd_is_valid_msr` / `get_gp_pmc_amd`).
    fn lookup(&self, msr: u32) -> Result<AmdMsr, Fault> {
        let in_block = |base: u32, n: u32| (base..base + n).contains(&msr);
        let m = if in_block(AMD_K7_PERF_CTL0, AMD_K7_COUNTERS) {
            AmdMsr::PerfCtl((msr - AMD_K7_PERF_CTL0) as u8)
        } else if in_block(AMD_K7_PERF_CTR0, AMD_K7_COUNTERS) {
            AmdMsr::PerfCtr((msr - AMD_K7_PERF_CTR0) as u8)
        } else if in_block(AMD_F15H_PERF_CTL0, 2 * AMD_CORE_COUNTERS) {
            if !self.cfg.perfctr_core() {
                return Err(Fault::Absent(msr));
            }
            // CTLn at even offsets, CTRn at odd ones.
            let off = msr - AMD_F15H_PERF_CTL0;
            let i = (off / 2) as u8;
            if off & 1 == 0 {
                AmdMsr::PerfCtl(i)
            } else {
                AmdMsr::PerfCtr(i)
            }
        } else if in_block(AMD_PERF_CNTR_GLOBAL_STATUS, 4) {
            if !self.cfg.perfmon_v2() {
                return Err(Fault::Absent(msr));
            }
            match msr {
                AMD_PERF_CNTR_GLOBAL_STATUS => AmdMsr::GlobalStatus,
                AMD_PERF_CNTR_GLOBAL_CTL => AmdMsr::GlobalCtl,
                AMD_PERF_CNTR_GLOBAL_STATUS_CLR => AmdMsr::GlobalStatusClr,
                _ => AmdMsr::GlobalStatusSet,
            }
        } else {
            return Err(Fault::NotPmuMsr(msr));
        };
        match m {
            AmdMsr::PerfCtl(i) | AmdMsr::PerfCtr(i) if i >= self.cfg.counters() => {
                Err(Fault::Absent(msr))
            }
            m => Ok(m),
        }
    }

    pub(crate) fn rdmsr(&self, core: &mut CounterCore, msr: u32) -> Result<u64, Fault> {
        Ok(match self.lookup(msr)? {
            AmdMsr::PerfCtl(i) => core.select(CounterId::gp(i)),
            AmdMsr::PerfCtr(i) => core.value(CounterId::gp(i)),
            AmdMsr::GlobalStatus => core.global_status(),
            AmdMsr::GlobalCtl => core.global_ctrl(),
            AmdMsr::GlobalStatusClr | AmdMsr::GlobalStatusSet => 0,
        })
    }

    pub(crate) fn wrmsr(&self, core: &mut CounterCore, msr: u32, v: u64) -> Result<(), Fault> {
        match self.lookup(msr)? {
            AmdMsr::PerfCtl(i) => {
                let sel = v & !AMD_EVTSEL_RESERVED;
                core.write_control(CounterId::gp(i), sel, control(sel));
            }
            // Bits above the width are dropped (KVM's pmc_write_counter).
            AmdMsr::PerfCtr(i) => core.write_value(CounterId::gp(i), v),
            // Read-only: the PPR says writes are ignored.
            AmdMsr::GlobalStatus => {}
            AmdMsr::GlobalCtl => core.write_global_ctrl(v & self.counter_bits()),
            AmdMsr::GlobalStatusClr => core.clear_status(v),
            AmdMsr::GlobalStatusSet => core.set_status(v & self.counter_bits()),
        }
        Ok(())
    }

    /// RDPMC (APM Vol. 3, RDPMC): ECX 0..n-1 reads core counter ECX; anything else takes #GP.
    pub(crate) fn rdpmc(&self, core: &mut CounterCore, ecx: u32) -> Result<u64, Fault> {
        if ecx >= u32::from(self.cfg.counters()) {
            return Err(Fault::BadRdpmcIndex(ecx));
        }
        Ok(core.value(CounterId::gp(ecx as u8)))
    }

    /// The ECX values RDPMC accepts.
    pub(crate) fn rdpmc_ranges(&self) -> Vec<RangeInclusive<u32>> {
        vec![0..=u32::from(self.cfg.counters()) - 1]
    }

    /// CPUID Fn8000_0022 for PerfMonV2.
    pub(crate) fn leaf_8000_0022(&self) -> CpuidEntry {
        CpuidEntry {
            function: cpuid::LEAF_EXT_PERFMON,
            index: 0,
            eax: cpuid::EXT_PERFMON_EAX_V2,
            ebx: u32::from(self.cfg.counters()),
            ecx: 0,
            edx: 0,
        }
    }

    /// PerfCtrExtCore and Fn8000_0022 per the configuration; NB/LLC counter extensions, PDCM
    /// and leaf 0AH cleared.
    pub(crate) fn cpuid_edits(&self) -> Vec<CpuidEdit> {
        let mut v = vec![
            CpuidEdit::flag(
                cpuid::LEAF_FEATURES,
                CpuidReg::Ecx,
                cpuid::FEATURES_ECX_PDCM,
                false,
            ),
            CpuidEdit::flag(
                cpuid::LEAF_EXT_FEATURES,
                CpuidReg::Ecx,
                cpuid::EXT_ECX_PERFCTR_NB | cpuid::EXT_ECX_PERFCTR_LLC,
                false,
            ),
            CpuidEdit::flag(
                cpuid::LEAF_EXT_FEATURES,
                CpuidReg::Ecx,
                cpuid::EXT_ECX_PERFCTR_CORE,
                self.cfg.perfctr_core(),
            ),
        ];
        v.extend(CpuidEdit::zero(cpuid::LEAF_ARCH_PERFMON));
        if self.cfg.perfmon_v2() {
            v.push(CpuidEdit::Leaf(self.leaf_8000_0022()));
        } else {
            v.extend(CpuidEdit::zero(cpuid::LEAF_EXT_PERFMON));
        }
        v
    }
}
