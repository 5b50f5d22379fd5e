//! The CPUID leaves and bits that advertise a PMU, and edits that set or hide them.
//!
//! - CPUID.1:ECX bit 15, PDCM: IA32_PERF_CAPABILITIES exists (Intel).
//! - CPUID.0AH: architectural performance monitoring (Intel; SDM Vol. 2A, CPUID, leaf 0AH).
//! - CPUID Fn8000_0001_ECX bit 23, PerfCtrExtCore; bit 24 PerfCtrExtNB; bit 28 PerfCtrExtLLC
//!   (AMD; APM Vol. 3, "CPUID Fn8000_0001_ECX").
//! - CPUID Fn8000_0022: PerfMonV2 in EAX bit 0, NumPerfCtrCore in EBX\[3:0\] (AMD; APM Vol. 3,
//!   "CPUID Fn8000_0022 Extended Performance Monitoring and Debug").
//!
//! The VMM turns its table (KVM's `kvm_cpuid_entry2`) into [`CpuidEntry`]s or applies the
//! [`CpuidEdit`]s itself; no KVM type appears here.
//!
//! The leaves are written by hand: the `x86` crate's CPUID module (raw-cpuid) only *reads* a
//! CPU, through a function pointer, and knows neither PerfCtrExtCore nor Fn8000_0022. It is used
//! the other way round, as a second, independent reader of what the model writes:
//! [`decode_leaf_0a`] (docs/architecture.md, "The x86 crate").

use std::cell::Cell;

/// CPUID.1: feature flags.
pub const LEAF_FEATURES: u32 = 0x1;
/// CPUID.1:ECX.PDCM.
pub const FEATURES_ECX_PDCM: u32 = 1 << 15;
/// CPUID.0AH: architectural performance monitoring.
pub const LEAF_ARCH_PERFMON: u32 = 0xa;
/// CPUID Fn8000_0001: extended feature flags.
pub const LEAF_EXT_FEATURES: u32 = 0x8000_0001;
/// Fn8000_0001_ECX\[PerfCtrExtCore\].
pub const EXT_ECX_PERFCTR_CORE: u32 = 1 << 23;
/// Fn8000_0001_ECX\[PerfCtrExtNB\] (northbridge counters; not modelled, always hidden).
pub const EXT_ECX_PERFCTR_NB: u32 = 1 << 24;
/// Fn8000_0001_ECX\[PerfCtrExtLLC\] (L3 counters; not modelled, always hidden).
pub const EXT_ECX_PERFCTR_LLC: u32 = 1 << 28;
/// CPUID Fn8000_0022: extended performance monitoring.
pub const LEAF_EXT_PERFMON: u32 = 0x8000_0022;
/// Fn8000_0022_EAX\[PerfMonV2\].
pub const EXT_PERFMON_EAX_V2: u32 = 1 << 0;

/// Reads a CPUID.0AH entry with the `x86` crate's decoder (raw-cpuid's
/// `get_performance_monitoring_info`), as a guest on an Intel CPU whose maximum basic leaf is
/// 0AH would see it. For checking the model's encoding against a reader written by others.
pub fn decode_leaf_0a(entry: &CpuidEntry) -> x86::cpuid::PerformanceMonitoringInfo {
    thread_local! {
        static LEAF_0A: Cell<CpuidEntry> = Cell::new(CpuidEntry::default());
    }
    // raw-cpuid takes a plain `fn`, so the entry reaches it through a thread-local.
    fn read(leaf: u32, _subleaf: u32) -> x86::cpuid::CpuIdResult {
        let e = match leaf {
            // "GenuineIntel" in EBX, EDX, ECX; leaves up to 0AH.
            0 => CpuidEntry {
                eax: LEAF_ARCH_PERFMON,
                ebx: 0x756e_6547,
                edx: 0x4965_6e69,
                ecx: 0x6c65_746e,
                ..Default::default()
            },
            LEAF_ARCH_PERFMON => LEAF_0A.with(Cell::get),
            _ => CpuidEntry::default(),
        };
        x86::cpuid::CpuIdResult {
            eax: e.eax,
            ebx: e.ebx,
            ecx: e.ecx,
            edx: e.edx,
        }
    }
    LEAF_0A.with(|c| c.set(*entry));
    let info = x86::cpuid::CpuId::with_cpuid_fn(read)
        .get_performance_monitoring_info()
        .expect("leaf 0AH is within the reader's maximum leaf");
    LEAF_0A.with(|c| c.set(CpuidEntry::default()));
    info
}

/// One CPUID leaf/subleaf and its four registers (the VMM's table entry without KVM's flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuidEntry {
    /// EAX input (leaf).
    pub function: u32,
    /// ECX input (subleaf).
    pub index: u32,
    pub eax: u32,
    pub ebx: u32,
    pub ecx: u32,
    pub edx: u32,
}

impl CpuidEntry {
    fn reg_mut(&mut self, reg: CpuidReg) -> &mut u32 {
        match reg {
            CpuidReg::Eax => &mut self.eax,
            CpuidReg::Ebx => &mut self.ebx,
            CpuidReg::Ecx => &mut self.ecx,
            CpuidReg::Edx => &mut self.edx,
        }
    }

    /// The register `reg`.
    pub fn reg(&self, reg: CpuidReg) -> u32 {
        match reg {
            CpuidReg::Eax => self.eax,
            CpuidReg::Ebx => self.ebx,
            CpuidReg::Ecx => self.ecx,
            CpuidReg::Edx => self.edx,
        }
    }
}

/// A CPUID output register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuidReg {
    Eax,
    Ebx,
    Ecx,
    Edx,
}

/// One change to a CPUID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuidEdit {
    /// Make the leaf exactly this, adding it if the table lacks it; then make sure the range's
    /// maximum leaf (CPUID.0:EAX or Fn8000_0000_EAX) reaches it, or the guest could not read it.
    Leaf(CpuidEntry),
    /// In leaf `function`/`index`, clear the `clear` bits of `reg`, then set the `set` bits.
    /// Does nothing if the table lacks the leaf.
    Bits {
        function: u32,
        index: u32,
        reg: CpuidReg,
        set: u32,
        clear: u32,
    },
}

impl CpuidEdit {
    /// Clears all four registers of a leaf, if the table has it.
    pub fn zero(function: u32) -> [CpuidEdit; 4] {
        [CpuidReg::Eax, CpuidReg::Ebx, CpuidReg::Ecx, CpuidReg::Edx].map(|reg| CpuidEdit::Bits {
            function,
            index: 0,
            reg,
            set: 0,
            clear: !0,
        })
    }

    /// Sets (`on`) or clears bits `bits` of `reg` in leaf `function`, subleaf 0.
    pub fn flag(function: u32, reg: CpuidReg, bits: u32, on: bool) -> CpuidEdit {
        CpuidEdit::Bits {
            function,
            index: 0,
            reg,
            set: if on { bits } else { 0 },
            clear: bits,
        }
    }

    /// Applies this edit to `table`.
    pub fn apply(&self, table: &mut Vec<CpuidEntry>) {
        match *self {
            CpuidEdit::Leaf(leaf) => {
                match find_mut(table, leaf.function, leaf.index) {
                    Some(e) => *e = leaf,
                    None => table.push(leaf),
                }
                let range_max = leaf.function & 0x8000_0000;
                if let Some(max) = find_mut(table, range_max, 0) {
                    if max.eax < leaf.function {
                        max.eax = leaf.function;
                    }
                }
            }
            CpuidEdit::Bits {
                function,
                index,
                reg,
                set,
                clear,
            } => {
                if let Some(e) = find_mut(table, function, index) {
                    let r = e.reg_mut(reg);
                    *r = (*r & !clear) | set;
                }
            }
        }
    }
}

fn find_mut(table: &mut [CpuidEntry], function: u32, index: u32) -> Option<&mut CpuidEntry> {
    table
        .iter_mut()
        .find(|e| e.function == function && e.index == index)
}

/// Applies `edits` in order.
pub fn apply(edits: &[CpuidEdit], table: &mut Vec<CpuidEntry>) {
    for e in edits {
        e.apply(table);
    }
}

/// The edits for `--vpmu=off`: advertise no PMU of either vendor (leaf 0AH zero, no PDCM, no
/// AMD counter extensions, no PerfMonV2).
///
/// AMD's four legacy counters have no CPUID bit: a guest that sees none of the above still
/// probes 0xC0010000-7, and finds no PMU only if those MSRs misbehave (Linux's
/// `check_hw_exists`), which is what KVM without a vPMU does.
pub fn hide_pmu() -> Vec<CpuidEdit> {
    let mut v = vec![
        CpuidEdit::flag(LEAF_FEATURES, CpuidReg::Ecx, FEATURES_ECX_PDCM, false),
        CpuidEdit::flag(
            LEAF_EXT_FEATURES,
            CpuidReg::Ecx,
            EXT_ECX_PERFCTR_CORE | EXT_ECX_PERFCTR_NB | EXT_ECX_PERFCTR_LLC,
            false,
        ),
    ];
    v.extend(CpuidEdit::zero(LEAF_ARCH_PERFMON));
    v.extend(CpuidEdit::zero(LEAF_EXT_PERFMON));
    v
}
