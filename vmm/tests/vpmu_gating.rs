//! Tier 2: cpu-switch must never charge the guest more than domain-switch for the same guest
//! work. domain-switch counts everything cpu-switch counts plus the VMM's work on the guest's
//! behalf; a cpu-switch that charges the guest for its own gating (issue 12: one enable and one
//! disable ioctl per counter per exit) breaks that.
//!
//! The tiny guests `gating_pair_{amd,intel}64` count cycles around 2000 port writes in each
//! mode, interleaved in rounds of 100 within one boot (the guest switches the mode through the
//! vPMU control port), so load on the host hits both modes alike; several boots.
//! * With 1 us of VMM work per exit (the delay device) the margin (~1 us of a ~9 us exit) is
//!   well above this machine's noise: cpu-switch <= domain-switch, strictly, per boot median
//!   and in the median round. The old toggle gating charged ~1.5 us per exit and fails it.
//! * With trivial VMM work (the port unclaimed: ~0.1 us of user-space work per exit) the true
//!   margin (~1%) is below the run-to-run noise here, so that check allows 3%: it still catches
//!   the old gating's bias (cpu-switch 15-20% above domain-switch).

mod common;

use std::time::Duration;

use runtime::end::VmEnd;
use runtime::pmu::{BackendChoice, ModelChoice};
use runtime::vm::VpmuSetting;

/// Boots per model.
const BOOTS: usize = 5;

/// (cpu-switch cycles, domain-switch cycles) of each round of the guest's loops in one boot.
fn one_boot(model: ModelChoice, backend: BackendChoice, io_delay_us: u32) -> Vec<(u64, u64)> {
    let guest = match model {
        ModelChoice::Intel => tiny_guests::GATING_PAIR_INTEL64,
        _ => tiny_guests::GATING_PAIR_AMD64,
    };
    let r = common::run_tiny_with(&guest, Duration::from_secs(120), |cfg| {
        cfg.vpmu = VpmuSetting::CpuSwitch;
        cfg.pmu_model = model;
        cfg.pmu_backend = backend;
        cfg.io_delay_us = io_delay_us;
    });
    assert_eq!(
        r.report.end,
        VmEnd::PowerOff,
        "{model:?}: console {}",
        r.console
    );
    let w = r.words();
    assert_eq!(w.first(), Some(&20), "{model:?}: rounds");
    assert_eq!(w.len(), 41, "{model:?}: guest report incomplete");
    let unclaimed: u64 = r.report.exits.iter().map(|e| e.unclaimed_io).sum();
    if io_delay_us == 0 {
        assert!(unclaimed >= 4000, "{:?}", r.report.exits);
    } else {
        assert_eq!(unclaimed, 0, "the delay device should answer");
    }
    // It starts in cpu-switch: the first switch to cpu-switch changes nothing.
    assert_eq!(r.report.pmu.mode_switches, 39, "{:?}", r.report.pmu);
    w[1..].chunks(2).map(|p| (p[0], p[1])).collect()
}

fn median(mut v: Vec<i64>) -> i64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Runs the boots; returns the medians over boots of the per-mode sums and the median over all
/// rounds of (domain-switch - cpu-switch).
fn measure(
    model: ModelChoice,
    backend: BackendChoice,
    io_delay_us: u32,
) -> (i64, i64, i64, Vec<(u64, u64)>) {
    let boots: Vec<Vec<(u64, u64)>> = (0..BOOTS)
        .map(|_| one_boot(model, backend, io_delay_us))
        .collect();
    let sums: Vec<(u64, u64)> = boots
        .iter()
        .map(|b| b.iter().fold((0, 0), |s, r| (s.0 + r.0, s.1 + r.1)))
        .collect();
    eprintln!(
        "{model:?}/{backend:?}, VMM work {io_delay_us} us/exit: (cpu-switch, domain-switch) cycles over \
         2000 exits, per boot {sums:?}"
    );
    let c = median(sums.iter().map(|s| s.0 as i64).collect());
    let d = median(sums.iter().map(|s| s.1 as i64).collect());
    // Each round's pair ran back to back: their difference is the VMM's work in that round,
    // whatever the host's load did to the round as a whole.
    let diffs: Vec<i64> = boots
        .iter()
        .flatten()
        .map(|&(c, d)| d as i64 - c as i64)
        .collect();
    let rounds = diffs.len();
    let more = diffs.iter().filter(|&&x| x < 0).count();
    let diff = median(diffs);
    eprintln!(
        "{model:?}: medians per boot cpu-switch {c}, domain-switch {d}: domain/cpu = {:.3}; \
         per round (100 exits) domain - cpu median {diff} cycles, cpu-switch more in {more}/{rounds} rounds",
        d as f64 / c.max(1) as f64
    );
    (c, d, diff, sums)
}

fn cpu_switch_never_charges_more(model: ModelChoice, backend: BackendChoice) {
    if !common::kvm_available() {
        return;
    }
    let (c, d, diff, sums) = measure(model, backend, 1);
    // The counter runs in cpu-switch (the guest's own time in KVM_RUN is charged).
    assert!(c > 0, "cpu-switch counted nothing over 2000 exits");
    assert!(
        c <= d,
        "cpu-switch charged more than domain-switch for the same work: {c} > {d}"
    );
    assert!(
        diff >= 0,
        "median round: cpu-switch more by {} cycles",
        -diff
    );
    for (c, d) in sums {
        assert!(c <= d, "one boot: cpu-switch {c} > domain-switch {d}");
    }

    let (c, d, _, _) = measure(model, backend, 0);
    assert!(c > 0, "cpu-switch counted nothing over 2000 exits");
    assert!(
        c * 100 <= d * 103,
        "trivial VMM work: cpu-switch {c} more than 3% above domain-switch {d}"
    );
}

#[test]
fn amd_model_cpu_switch_never_charges_more_than_domain_switch() {
    cpu_switch_never_charges_more(ModelChoice::Amd, BackendChoice::Soft);
}

/// The same on the hw backend's path (40 run-time mode switches per boot: each re-opens the
/// counter's events with the other mode's exclude bits), over the real hardware PMU where the
/// host has one that counts, else over the simulated host PMU; says loudly which.
#[test]
fn amd_model_on_the_hw_backend_cpu_switch_never_charges_more_than_domain_switch() {
    if !common::kvm_available() {
        return;
    }
    let backend = if runtime::pmu::setup::host_counts_instructions() {
        eprintln!("*** hw backend: REAL (this host's hardware PMU counts instructions) ***");
        BackendChoice::Hw
    } else {
        eprintln!("*** hw backend: SIMULATED (no hardware PMU on this host) ***");
        testkit::not_checked(
            "the hw backend on a real host PMU (its tiny guests ran over the simulated one)",
            "this host's PMU does not count instructions for perf_event_open",
        );
        BackendChoice::Sim
    };
    cpu_switch_never_charges_more(ModelChoice::Amd, backend);
}

#[test]
fn intel_model_cpu_switch_never_charges_more_than_domain_switch() {
    cpu_switch_never_charges_more(ModelChoice::Intel, BackendChoice::Soft);
}
