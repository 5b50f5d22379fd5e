//! Tier 2: cpu-switch must never charge the guest more than domain-switch for the same guest
//! work. domain-switch counts everything cpu-switch counts plus the VMM's work on the guest's
//! behalf; a cpu-switch that charges the guest for its own gating (issue 12) breaks that.
//!
//! The tiny guests `gating_{amd,intel}64` count cycles around 2000 writes to an unclaimed port
//! (trivial VMM work per exit). Runs alternate between the modes; the medians are compared.

mod common;

use std::time::Duration;

use vmm::end::VmEnd;
use vmm::pmu::{BackendChoice, ModelChoice};
use vmm::vm::VpmuSetting;

/// Runs per mode and model (alternating cpu-switch / domain-switch).
const RUNS: usize = 5;

/// The guest's counter delta over its port-write loop.
fn loop_cycles(model: ModelChoice, mode: VpmuSetting) -> u64 {
    let guest = match model {
        ModelChoice::Intel => tiny_guests::GATING_INTEL64,
        _ => tiny_guests::GATING_AMD64,
    };
    let r = common::run_tiny_with(&guest, Duration::from_secs(120), |cfg| {
        cfg.vpmu = mode;
        cfg.pmu_model = model;
        cfg.pmu_backend = BackendChoice::Soft;
    });
    assert_eq!(
        r.report.end,
        VmEnd::PowerOff,
        "{model:?}/{mode:?}: console {}",
        r.console
    );
    let w: Vec<u64> = r
        .serial2
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(w.len(), 3, "{model:?}/{mode:?}: guest report incomplete");
    assert_eq!(w[2], 2000);
    let unclaimed: u64 = r.report.exits.iter().map(|e| e.unclaimed_io).sum();
    assert!(unclaimed >= 2000, "{:?}", r.report.exits);
    w[0]
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn cpu_switch_never_charges_more(model: ModelChoice) {
    if !common::kvm_available() {
        return;
    }
    let (mut cpu, mut dom) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        cpu.push(loop_cycles(model, VpmuSetting::CpuSwitch));
        dom.push(loop_cycles(model, VpmuSetting::DomainSwitch));
    }
    eprintln!("{model:?}: cpu-switch {cpu:?}\n{model:?}: domain-switch {dom:?}");
    let (c, d) = (median(cpu), median(dom));
    eprintln!(
        "{model:?}: medians cpu-switch {c}, domain-switch {d}: domain/cpu = {:.2}",
        d as f64 / c.max(1) as f64
    );
    assert!(c > 0, "cpu-switch counted nothing over 2000 exits");
    assert!(
        c <= d,
        "cpu-switch charged more than domain-switch for the same work: {c} > {d}"
    );
}

#[test]
fn amd_model_cpu_switch_never_charges_more_than_domain_switch() {
    cpu_switch_never_charges_more(ModelChoice::Amd);
}

#[test]
fn intel_model_cpu_switch_never_charges_more_than_domain_switch() {
    cpu_switch_never_charges_more(ModelChoice::Intel);
}
