//! Helpers shared by the integration tests: a PMU over a fake backend, register encodings.
#![allow(dead_code, unused_imports)]

pub(crate) use vpmu::fake::{Call, FakeBackend};
pub(crate) use vpmu::msr::*;
pub(crate) use vpmu::{
    AmdConfig, CounterId, Event, Fault, IntelConfig, Pmi, Pmu, PmuConfig, Scale, Vendor,
};

/// 2^48 - 1.
pub(crate) const MASK48: u64 = (1 << 48) - 1;

/// USR | OS | EN.
pub(crate) const ON: u64 = EVTSEL_USR | EVTSEL_OS | EVTSEL_EN;
/// USR | OS | EN | INT.
pub(crate) const ON_INT: u64 = ON | EVTSEL_INT;

/// Intel unhalted core cycles (0x3C/0x00), counting, no interrupt.
pub(crate) const INTEL_CYCLES: u64 = 0x3c | ON;
/// AMD CPU cycles (0x76), counting, no interrupt.
pub(crate) const AMD_CYCLES: u64 = 0x76 | ON;

pub(crate) const GP0: CounterId = CounterId::gp(0);
pub(crate) const GP1: CounterId = CounterId::gp(1);
pub(crate) const FIXED0: CounterId = CounterId::fixed(0);
pub(crate) const FIXED1: CounterId = CounterId::fixed(1);

/// A PMU of `config` over a fresh fake backend, and a handle on that backend.
pub(crate) fn pmu(config: PmuConfig) -> (Pmu, FakeBackend) {
    pmu_with(config, FakeBackend::new())
}

/// A PMU of `config` over `fake`.
pub(crate) fn pmu_with(config: PmuConfig, fake: FakeBackend) -> (Pmu, FakeBackend) {
    let pmu = Pmu::new(config, Box::new(fake.clone())).expect("valid config");
    (pmu, fake)
}

/// The default Intel PMU (4 GP, 3 fixed, 48 bits, PDCM + FW_WRITE).
pub(crate) fn intel() -> (Pmu, FakeBackend) {
    pmu(PmuConfig::intel())
}

/// An Intel PMU with the default config changed by `f`.
pub(crate) fn intel_with(f: impl FnOnce(&mut IntelConfig)) -> (Pmu, FakeBackend) {
    let mut c = IntelConfig::default();
    f(&mut c);
    pmu(PmuConfig::Intel(c))
}

/// An AMD PMU of `config`.
pub(crate) fn amd(config: AmdConfig) -> (Pmu, FakeBackend) {
    pmu(PmuConfig::Amd(config))
}

pub(crate) const AMD_V2: AmdConfig = AmdConfig::PerfMonV2 { counters: 6 };

/// IA32_PMCx / PERFEVTSELx / A_PMCx / FIXED_CTRx / AMD PERF_CTLx / PERF_CTRx of counter `i`.
pub(crate) const fn pmc(i: u32) -> u32 {
    IA32_PMC0 + i
}
pub(crate) const fn evtsel(i: u32) -> u32 {
    IA32_PERFEVTSEL0 + i
}
pub(crate) const fn a_pmc(i: u32) -> u32 {
    IA32_A_PMC0 + i
}
pub(crate) const fn fixed_ctr(i: u32) -> u32 {
    IA32_FIXED_CTR0 + i
}
pub(crate) const fn k7_ctl(i: u32) -> u32 {
    AMD_K7_PERF_CTL0 + i
}
pub(crate) const fn k7_ctr(i: u32) -> u32 {
    AMD_K7_PERF_CTR0 + i
}
pub(crate) const fn core_ctl(i: u32) -> u32 {
    AMD_F15H_PERF_CTL0 + 2 * i
}
pub(crate) const fn core_ctr(i: u32) -> u32 {
    AMD_F15H_PERF_CTL0 + 2 * i + 1
}

/// WRMSR that must succeed.
#[track_caller]
pub(crate) fn wr(pmu: &mut Pmu, msr: u32, v: u64) {
    pmu.wrmsr(msr, v)
        .unwrap_or_else(|e| panic!("wrmsr {msr:#x} <- {v:#x}: {e}"));
}

/// RDMSR that must succeed.
#[track_caller]
pub(crate) fn rd(pmu: &mut Pmu, msr: u32) -> u64 {
    pmu.rdmsr(msr)
        .unwrap_or_else(|e| panic!("rdmsr {msr:#x}: {e}"))
}

/// What a step of a table-driven case does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Rd(u32),
    Wr(u32, u64),
    Rdpmc(u32),
}

/// Runs `op`, returning the value read (0 for a write) or the fault.
pub(crate) fn run(pmu: &mut Pmu, op: Op) -> Result<u64, Fault> {
    match op {
        Op::Rd(m) => pmu.rdmsr(m),
        Op::Wr(m, v) => pmu.wrmsr(m, v).map(|()| 0),
        Op::Rdpmc(ecx) => pmu.rdpmc(ecx),
    }
}

/// Sets IA32_PERF_GLOBAL_CTRL to enable `gp` general-purpose and `fixed` fixed counters.
pub(crate) fn intel_enable_all(pmu: &mut Pmu) {
    wr(pmu, IA32_PERF_GLOBAL_CTRL, 0x7_0000_000f);
}
