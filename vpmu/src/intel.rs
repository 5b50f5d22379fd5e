//! Intel architectural performance monitoring, version 2 (SDM Vol. 3B, "Architectural
//! Performance Monitoring Version 1" and "... Version 2"): the vendor table over the counter
//! core, mirroring arch/x86/kvm/vmx/pmu_intel.c and the Intel half of arch/x86/kvm/pmu.c.

use std::ops::RangeInclusive;

use crate::backend::{CounterBackend, CounterId};
use crate::counter::{Control, CoreLayout, CounterCore};
use crate::cpuid::{self, CpuidEdit, CpuidEntry, CpuidReg};
use crate::event::ArchEvent;
use crate::msr::*;
use crate::{Event, Fault, IntelConfig, Vendor};

/// Architectural performance monitoring version advertised in CPUID.0AH:EAX\[7:0\].
pub(crate) const VERSION: u32 = 2;

/// An Intel PMU MSR, decoded from the blocks the model owns (before checking that the counter
/// exists in this configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IntelMsr {
    /// IA32_PMCx: writes sign-extend bit 31.
    Pmc(u8),
    /// IA32_A_PMCx: full-width writes.
    FullWidthPmc(u8),
    PerfEvtSel(u8),
    FixedCtr(u8),
    FixedCtrCtrl,
    PerfCapabilities,
    GlobalStatus,
    GlobalCtrl,
    GlobalOvfCtrl,
}

fn decode(msr: u32) -> Option<IntelMsr> {
    let idx = |base: u32| (msr - base) as u8;
    Some(match msr {
        _ if (IA32_PMC0..IA32_PMC0 + INTEL_MAX_GP).contains(&msr) => IntelMsr::Pmc(idx(IA32_PMC0)),
        _ if (IA32_A_PMC0..IA32_A_PMC0 + INTEL_MAX_GP).contains(&msr) => {
            IntelMsr::FullWidthPmc(idx(IA32_A_PMC0))
        }
        _ if (IA32_PERFEVTSEL0..IA32_PERFEVTSEL0 + INTEL_MAX_GP).contains(&msr) => {
            IntelMsr::PerfEvtSel(idx(IA32_PERFEVTSEL0))
        }
        _ if (IA32_FIXED_CTR0..IA32_FIXED_CTR0 + INTEL_MAX_FIXED_MSRS).contains(&msr) => {
            IntelMsr::FixedCtr(idx(IA32_FIXED_CTR0))
        }
        IA32_FIXED_CTR_CTRL => IntelMsr::FixedCtrCtrl,
        IA32_PERF_CAPABILITIES => IntelMsr::PerfCapabilities,
        IA32_PERF_GLOBAL_STATUS => IntelMsr::GlobalStatus,
        IA32_PERF_GLOBAL_CTRL => IntelMsr::GlobalCtrl,
        IA32_PERF_GLOBAL_OVF_CTRL => IntelMsr::GlobalOvfCtrl,
        _ => return None,
    })
}

/// The MSR blocks an Intel model owns: the architectural maximum of each block, so that
/// counters beyond the configured ones take #GP from the model rather than reaching KVM.
pub(crate) const MSR_RANGES: [RangeInclusive<u32>; 6] = [
    IA32_PMC0..=IA32_PMC0 + INTEL_MAX_GP - 1,
    IA32_PERFEVTSEL0..=IA32_PERFEVTSEL0 + INTEL_MAX_GP - 1,
    IA32_FIXED_CTR0..=IA32_FIXED_CTR0 + INTEL_MAX_FIXED_MSRS - 1,
    IA32_PERF_CAPABILITIES..=IA32_PERF_CAPABILITIES,
    IA32_FIXED_CTR_CTRL..=IA32_PERF_GLOBAL_OVF_CTRL,
    IA32_A_PMC0..=IA32_A_PMC0 + INTEL_MAX_GP - 1,
];

/// Decoded IA32_PERFEVTSELx.
fn gp_control(sel: u64) -> Control {
    Control {
        enabled: sel & EVTSEL_EN != 0,
        int: sel & EVTSEL_INT != 0,
        event: Event::from_intel_evtsel(sel),
    }
}

/// Decoded 4-bit IA32_FIXED_CTR_CTRL field of fixed counter `i`: bit 0 OS, bit 1 USR,
/// bit 2 AnyThread (reserved here), bit 3 PMI.
fn fixed_control(i: u8, field: u64) -> Control {
    Control {
        enabled: field & 0b11 != 0,
        int: field & 0b1000 != 0,
        event: Event::intel_fixed(i, field & 0b10 != 0, field & 0b01 != 0),
    }
}

/// Sign-extends the low 32 bits (SDM: a write to IA32_PMCx sets bits 31:0 from EAX and the
/// upper bits to copies of bit 31; EDX is ignored).
fn sign_extend_32(v: u64) -> u64 {
    v as u32 as i32 as i64 as u64
}

pub(crate) struct IntelModel {
    cfg: IntelConfig,
    /// CPUID.0AH:EBX: bit i set = architectural event i unavailable.
    unavailable: u32,
}

impl IntelModel {
    /// The model, and the core it drives, for `cfg` over `backend`.
    pub(crate) fn new(
        cfg: IntelConfig,
        backend: Box<dyn CounterBackend>,
    ) -> (IntelModel, CounterCore) {
        let unavailable = ArchEvent::INTEL_CPUID_ORDER
            .iter()
            .enumerate()
            .filter(|(_, &a)| Event::arch(Vendor::Intel, a).is_some_and(|e| !backend.supports(&e)))
            .fold(0u32, |m, (i, _)| m | 1 << i);
        // KVM's intel_hw_event_available: a GP counter does not count an architectural event
        // that CPUID says is unavailable.
        let blocked = ArchEvent::INTEL_CPUID_ORDER
            .iter()
            .enumerate()
            .filter(|(i, _)| unavailable & (1 << i) != 0)
            .map(|(_, a)| {
                let (code, umask) = a.intel_code();
                (u16::from(code), umask)
            })
            .collect();
        let layout = CoreLayout {
            gp: cfg.gp_counters,
            fixed: cfg.fixed_counters,
            width: cfg.counter_width,
            global_ctrl: true,
            global_status: true,
            reset_gp: gp_control(0),
            reset_fixed: |i| fixed_control(i, 0),
            blocked,
        };
        (
            IntelModel { cfg, unavailable },
            CounterCore::new(layout, backend),
        )
    }

    fn gp_bits(&self) -> u64 {
        (1u64 << self.cfg.gp_counters) - 1
    }

    fn fixed_bits(&self) -> u64 {
        ((1u64 << self.cfg.fixed_counters) - 1) << CounterId::FIXED_BASE
    }

    /// Writable bits of IA32_PERF_GLOBAL_CTRL (KVM: `~global_ctrl_mask`).
    fn global_ctrl_valid(&self) -> u64 {
        self.gp_bits() | self.fixed_bits()
    }

    /// Bits IA32_PERF_GLOBAL_OVF_CTRL may set (KVM: `~global_status_mask`): the counters plus
    /// OvfBuffer and CondChgd.
    fn ovf_ctrl_valid(&self) -> u64 {
        self.global_ctrl_valid() | INTEL_STATUS_OVF_BUF | INTEL_STATUS_COND_CHGD
    }

    /// Writable bits of IA32_FIXED_CTR_CTRL (KVM: `~fixed_ctr_ctrl_mask`): OS, USR and PMI of
    /// each fixed counter; AnyThread is reserved.
    fn fixed_ctrl_valid(&self) -> u64 {
        (0..self.cfg.fixed_counters).fold(0, |m, i| m | 0b1011 << (4 * i))
    }

    /// Writable bits of IA32_PERFEVTSEL`i` (KVM: `~eventsel_rsvd`): the TSX qualifiers only
    /// where the guest has TSX, IN_TXCP only on counter 2.
    fn evtsel_valid(&self, i: u8) -> u64 {
        let mut valid = !INTEL_EVTSEL_RESERVED;
        if self.cfg.tsx {
            valid |= INTEL_EVTSEL_IN_TX;
            if i == INTEL_IN_TXCP_COUNTER {
                valid |= INTEL_EVTSEL_IN_TXCP;
            }
        }
        valid
    }

    fn perf_capabilities(&self) -> u64 {
        if self.cfg.full_width_writes {
            PERF_CAP_FW_WRITE
        } else {
            0
        }
    }

    /// The counter behind a counter MSR, if this configuration has it.
    fn counter(&self, msr: IntelMsr) -> Option<CounterId> {
        match msr {
            IntelMsr::Pmc(i) | IntelMsr::PerfEvtSel(i) if i < self.cfg.gp_counters => {
                Some(CounterId::gp(i))
            }
            IntelMsr::FullWidthPmc(i) if i < self.cfg.gp_counters && self.cfg.full_width_writes => {
                Some(CounterId::gp(i))
            }
            IntelMsr::FixedCtr(i) if i < self.cfg.fixed_counters => Some(CounterId::fixed(i)),
            _ => None,
        }
    }

    /// Decodes `msr` and checks that it exists in this configuration.
    fn lookup(&self, msr: u32) -> Result<(IntelMsr, Option<CounterId>), Fault> {
        let m = decode(msr).ok_or(Fault::NotPmuMsr(msr))?;
        let ctr = self.counter(m);
        let exists = match m {
            IntelMsr::Pmc(_)
            | IntelMsr::FullWidthPmc(_)
            | IntelMsr::PerfEvtSel(_)
            | IntelMsr::FixedCtr(_) => ctr.is_some(),
            IntelMsr::PerfCapabilities => self.cfg.pdcm,
            _ => true,
        };
        if exists {
            Ok((m, ctr))
        } else {
            Err(Fault::Absent(msr))
        }
    }

    pub(crate) fn rdmsr(&self, core: &mut CounterCore, msr: u32) -> Result<u64, Fault> {
        let (m, ctr) = self.lookup(msr)?;
        Ok(match (m, ctr) {
            (IntelMsr::PerfEvtSel(_), Some(id)) => core.select(id),
            (_, Some(id)) => core.value(id),
            (IntelMsr::FixedCtrCtrl, _) => (0..self.cfg.fixed_counters)
                .fold(0, |v, i| v | core.select(CounterId::fixed(i)) << (4 * i)),
            (IntelMsr::PerfCapabilities, _) => self.perf_capabilities(),
            (IntelMsr::GlobalStatus, _) => core.global_status(),
            (IntelMsr::GlobalCtrl, _) => core.global_ctrl(),
            // Write-only in effect: reads return 0 (as KVM).
            (IntelMsr::GlobalOvfCtrl, _) => 0,
            (m, None) => unreachable!("{m:?} without a counter passed lookup"),
        })
    }

    pub(crate) fn wrmsr(&self, core: &mut CounterCore, msr: u32, v: u64) -> Result<(), Fault> {
        let (m, ctr) = self.lookup(msr)?;
        let reserved = |valid: u64| -> Result<(), Fault> {
            match v & !valid {
                0 => Ok(()),
                bits => Err(Fault::Reserved {
                    msr,
                    value: v,
                    bits,
                }),
            }
        };
        match (m, ctr) {
            (IntelMsr::Pmc(_), Some(id)) => core.write_value(id, sign_extend_32(v)),
            (IntelMsr::FullWidthPmc(_), Some(id)) => {
                reserved(core.value_mask())?;
                core.write_value(id, v);
            }
            // KVM drops bits above the width of a fixed counter rather than faulting.
            (IntelMsr::FixedCtr(_), Some(id)) => core.write_value(id, v),
            (IntelMsr::PerfEvtSel(i), Some(id)) => {
                reserved(self.evtsel_valid(i))?;
                core.write_control(id, v, gp_control(v));
            }
            (IntelMsr::FixedCtrCtrl, _) => {
                reserved(self.fixed_ctrl_valid())?;
                for i in 0..self.cfg.fixed_counters {
                    let field = (v >> (4 * i)) & 0xf;
                    core.write_control(CounterId::fixed(i), field, fixed_control(i, field));
                }
            }
            (IntelMsr::PerfCapabilities | IntelMsr::GlobalStatus, _) => {
                return Err(Fault::ReadOnly(msr))
            }
            (IntelMsr::GlobalCtrl, _) => {
                reserved(self.global_ctrl_valid())?;
                core.write_global_ctrl(v);
            }
            (IntelMsr::GlobalOvfCtrl, _) => {
                reserved(self.ovf_ctrl_valid())?;
                core.clear_status(v);
            }
            (m, None) => unreachable!("{m:?} without a counter passed lookup"),
        }
        Ok(())
    }

    /// RDPMC (SDM Vol. 2B, RDPMC; KVM's `intel_rdpmc_ecx_to_pmc`): ECX\[31:16\] is the counter
    /// type (0 general-purpose, 0x4000 fixed: bit 30), ECX\[15:0\] the index. Anything else
    /// takes #GP.
    pub(crate) fn rdpmc(&self, core: &mut CounterCore, ecx: u32) -> Result<u64, Fault> {
        let index = (ecx & 0xffff) as u8;
        let id = match ecx >> 16 {
            0 if ecx < u32::from(self.cfg.gp_counters) => CounterId::gp(index),
            0x4000 if (ecx & 0xffff) < u32::from(self.cfg.fixed_counters) => {
                CounterId::fixed(index)
            }
            _ => return Err(Fault::BadRdpmcIndex(ecx)),
        };
        Ok(core.value(id))
    }

    /// The ECX values RDPMC accepts.
    pub(crate) fn rdpmc_ranges(&self) -> Vec<RangeInclusive<u32>> {
        let mut v = vec![0..=u32::from(self.cfg.gp_counters) - 1];
        if self.cfg.fixed_counters > 0 {
            v.push(1 << 30..=(1 << 30) + u32::from(self.cfg.fixed_counters) - 1);
        }
        v
    }

    /// CPUID.0AH (SDM Vol. 2A, CPUID leaf 0AH).
    pub(crate) fn leaf_0a(&self) -> CpuidEntry {
        let width = u32::from(self.cfg.counter_width);
        CpuidEntry {
            function: cpuid::LEAF_ARCH_PERFMON,
            index: 0,
            // Version, GP counters, GP width, length of the EBX bit vector.
            eax: VERSION
                | u32::from(self.cfg.gp_counters) << 8
                | width << 16
                | (ArchEvent::INTEL_CPUID_ORDER.len() as u32) << 24,
            ebx: self.unavailable,
            ecx: 0,
            // Fixed counters, fixed width.
            edx: u32::from(self.cfg.fixed_counters) | width << 5,
        }
    }

    /// Leaf 0AH and PDCM set; every AMD PMU bit cleared.
    pub(crate) fn cpuid_edits(&self) -> Vec<CpuidEdit> {
        let mut v = vec![
            CpuidEdit::Leaf(self.leaf_0a()),
            CpuidEdit::flag(
                cpuid::LEAF_FEATURES,
                CpuidReg::Ecx,
                cpuid::FEATURES_ECX_PDCM,
                self.cfg.pdcm,
            ),
            CpuidEdit::flag(
                cpuid::LEAF_EXT_FEATURES,
                CpuidReg::Ecx,
                cpuid::EXT_ECX_PERFCTR_CORE
                    | cpuid::EXT_ECX_PERFCTR_NB
                    | cpuid::EXT_ECX_PERFCTR_LLC,
                false,
            ),
        ];
        v.extend(CpuidEdit::zero(cpuid::LEAF_EXT_PERFMON));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_extension_copies_bit_31_and_ignores_edx() {
        assert_eq!(sign_extend_32(0x7fff_ffff), 0x7fff_ffff);
        assert_eq!(sign_extend_32(0x8000_0000), 0xffff_ffff_8000_0000);
        assert_eq!(sign_extend_32(0x1234_5678_ffff_f000), 0xffff_ffff_ffff_f000);
    }

    #[test]
    fn decode_covers_exactly_the_owned_msrs() {
        let owned = |m: u32| MSR_RANGES.iter().any(|r| r.contains(&m));
        for msr in (0..0x600).chain(0xc000_0000..0xc000_0400) {
            assert_eq!(decode(msr).is_some(), owned(msr), "{msr:#x}");
        }
    }
}
