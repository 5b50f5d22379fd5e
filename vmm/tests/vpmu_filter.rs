//! Tier 2 for `--pmu-event-filter`: tiny guests on /dev/kvm start counters from a known value
//! under a filter (guest-image/tiny/asm/pmu_filter_body.inc). A refused counter still reads its
//! start value after the guest's busy loop, while an allowed one counts; every select register
//! reads back what the guest wrote; the run reports the refusals per vCPU. Intel (general-purpose
//! and fixed counters, allow and deny lists) and AMD (12-bit event selects), soft backend.

mod common;

use std::time::Duration;

use runtime::end::VmEnd;
use runtime::pmu::{BackendChoice, ModelChoice};
use runtime::vm::{RunReport, VpmuSetting};

/// The guests' start value (START in pmu_filter_body.inc).
const START: u64 = 1000;
/// USR | OS | EN.
const ON: u64 = (1 << 16) | (1 << 17) | (1 << 22);

fn run(model: ModelChoice, mode: VpmuSetting, filter: Option<&str>) -> (Vec<u64>, RunReport) {
    let guest = match model {
        ModelChoice::Intel => tiny_guests::PMU_FILTER_INTEL64,
        _ => tiny_guests::PMU_FILTER_AMD64,
    };
    let r = common::run_tiny_with(&guest, Duration::from_secs(120), |cfg| {
        cfg.vpmu = mode;
        cfg.pmu_model = model;
        cfg.pmu_backend = BackendChoice::Soft;
        cfg.pmu_event_filter = filter.map(|f| f.parse().unwrap());
    });
    assert_eq!(
        r.report.end,
        VmEnd::PowerOff,
        "{model:?} {filter:?}: console {}",
        r.console
    );
    let words: Vec<u64> = r
        .serial2
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    eprintln!(
        "{model:?}/{mode:?} {filter:?}: {words:?}; refused per vCPU {:?}",
        r.report.pmu.filter_blocked_by_vcpu
    );
    (words, r.report)
}

/// Intel: [PMC0 (0x3c/0x00), PMC1 (0x3c/0x01), fixed 1, fixed 2] counted or not.
fn intel(mode: VpmuSetting, filter: Option<&str>, counts: [bool; 4], refused: u64) {
    let (w, report) = run(ModelChoice::Intel, mode, filter);
    assert_eq!(w.len(), 7, "{filter:?}: guest report incomplete: {w:?}");
    for (i, (&v, c)) in w[..4].iter().zip(counts).enumerate() {
        if c {
            assert!(v > START, "{filter:?}: counter {i} did not count: {w:?}");
        } else {
            assert_eq!(v, START, "{filter:?}: refused counter {i} moved: {w:?}");
        }
    }
    assert_eq!(w[4], 0x3c | ON, "{filter:?}: PERFEVTSEL0 read back");
    assert_eq!(w[5], 0x13c | ON, "{filter:?}: PERFEVTSEL1 read back");
    assert_eq!(w[6], 0x330, "{filter:?}: IA32_FIXED_CTR_CTRL read back");
    assert_eq!(
        report.pmu.filter_blocked_by_vcpu,
        vec![refused],
        "{filter:?}"
    );
    assert_eq!(
        report.pmu_event_filter.map(|f| f.to_string()),
        filter.map(|f| f.parse::<vpmu::EventFilter>().unwrap().to_string())
    );
}

#[test]
fn intel_refused_counters_keep_their_start_value_while_allowed_ones_count() {
    if !common::kvm_available() {
        return;
    }
    // Without a filter all four count: what the filter runs below take away is real.
    intel(VpmuSetting::CpuSwitch, None, [true; 4], 0);
    // Core cycles (PMC0 by its unit mask, fixed 1 by the bitmap) refused, reference cycles not.
    let counts = [false, true, false, true];
    intel(
        VpmuSetting::CpuSwitch,
        Some("deny:0x3c/0x00,fixed=0x2"),
        counts,
        2,
    );
    intel(
        VpmuSetting::DomainSwitch,
        Some("allow:0x3c/0x01,fixed=0x4"),
        counts,
        2,
    );
}

#[test]
fn amd_filter_compares_12_bit_selects_and_unit_masks() {
    if !common::kvm_available() {
        return;
    }
    let amd = |filter: &str, counts: bool, refused: u64| {
        let (w, report) = run(ModelChoice::Amd, VpmuSetting::DomainSwitch, Some(filter));
        assert_eq!(w.len(), 4, "{filter}: guest report incomplete: {w:?}");
        for (i, &v) in w[..2].iter().enumerate() {
            if counts {
                assert!(v > START, "{filter}: counter {i} did not count: {w:?}");
            } else {
                assert_eq!(v, START, "{filter}: refused counter {i} moved: {w:?}");
            }
        }
        assert_eq!(w[2], 0x76 | ON, "{filter}: PERF_CTL0 read back");
        assert_eq!(w[3], 0x76 | ON, "{filter}: PERF_CTL1 read back");
        assert_eq!(report.pmu.filter_blocked_by_vcpu, vec![refused], "{filter}");
    };
    amd("deny:0x76", false, 2);
    // 0x176 is another event (EventSelect[11:8] = 1), and 0x76/0x01 another unit mask.
    amd("deny:0x176,0x76/0x01", true, 0);
}
