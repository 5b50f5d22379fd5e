//! Tier 2 (issue 20 item 5): in cpu-switch nothing of the VMM's tracing is charged to the
//! guest. The recorder's work around KVM_RUN (TSC and clock reads, records into the writer's
//! buffers: run_loop.rs steps 2 and 8) sits outside the gate, so a guest that counts its own
//! cycles in cpu-switch over a fixed amount of work with many exits reads the same with and
//! without `--trace`.
//!
//! The guest (`gating_pair_amd64`) counts cycles around 2 x 2000 unclaimed port writes, 20
//! rounds of 100 in each mode (switching through the vPMU control port). Boots with and
//! without `--trace` run in BOOTS back-to-back pairs (A/B, then B/A); each pair gives a ratio
//! with/without, and the median of the pairs' cpu-switch ratios must lie within TOLERANCE of 1.
//! Ratios within a pair, not medians of each side: this machine's speed shifts by up to 25 %
//! for seconds at a time, and a shift between the with-boots and the without-boots once made
//! the medians 0.80x apart. domain-switch, which charges the VMM's work, is printed beside it.
//!
//! What it can and cannot catch (measured on this project's build machine, 2 shared cores):
//! the recorder's per-exit work is well under 1 % of a ~8 us exit here, below the boot-to-boot
//! noise (medians of 5 least-disturbed rounds still land 0-3 % apart). Moving the whole
//! recorder and `reprogram_dirty` inside the gate (run_loop.rs) gave 0.9997x: this test did
//! NOT fail then. It bounds what tracing may charge in cpu-switch at TOLERANCE (5 %, not the
//! issue's 2 %, which flakes here): it fails if tracing work of about half a microsecond per
//! exit or more (a system call per exit, say) lands inside the gate. The 2 % figure belongs in
//! a bench on a quiet machine.

mod common;

use std::time::Duration;

use vmm::end::VmEnd;
use vmm::pmu::{BackendChoice, ModelChoice};
use vmm::vm::VpmuSetting;

const BOOTS: usize = 5;
/// How far the median of the pairs' cpu-switch ratios with/without may lie from 1.
const TOLERANCE: f64 = 0.05;

/// (cpu-switch, domain-switch) cycles the guest counted in its least disturbed round of 100
/// exits (the fastest: load on the shared machine only adds), x 20: the 2000 exits' cost
/// without the noise the sums carry.
fn one_boot(trace: bool) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace");
    let r = common::run_tiny_with(
        &tiny_guests::GATING_PAIR_AMD64,
        Duration::from_secs(120),
        |cfg| {
            cfg.vpmu = VpmuSetting::CpuSwitch;
            cfg.pmu_model = ModelChoice::Amd;
            cfg.pmu_backend = BackendChoice::Soft;
            cfg.io_delay_us = 0;
            // Whole KVM_RUN intervals: with KVM's exit path left out (vm::exit_cost) the guest
            // counts next to nothing between these exits, and a ratio of near-zero counts
            // bounds nothing; charged whole, tracing work inside the gate would show.
            cfg.exit_cost_ns = Some(0);
            if trace {
                cfg.record.trace = Some(path.clone());
            }
        },
    );
    assert_eq!(r.report.end, VmEnd::PowerOff, "console {}", r.console);
    let w = r.words();
    assert_eq!(w.len(), 41, "guest report incomplete");
    if trace {
        let t = analysis::trace::format::Trace::read_file(&path).unwrap();
        let n: usize = t
            .vcpus
            .iter()
            .map(|v| v.records.len() + v.dropped as usize)
            .sum();
        assert!(n >= 4000, "the trace recorded the exits: {n} records");
    }
    let rounds = w[1..].chunks(2);
    let min = |i: usize| rounds.clone().map(|p| p[i]).min().unwrap() * 20;
    (min(0), min(1))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_unstable_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn tracing_is_not_charged_to_the_guest_in_cpu_switch() {
    if !common::kvm_available() {
        return;
    }
    // (with, without) of each pair, a few seconds apart.
    let mut pairs = Vec::new();
    for i in 0..BOOTS {
        // A/B, then B/A: drift within a pair falls on both sides in turn.
        let first_traced = i % 2 == 0;
        let a = one_boot(first_traced);
        let b = one_boot(!first_traced);
        pairs.push(if first_traced { (a, b) } else { (b, a) });
    }
    let ratio = |part: fn(&(u64, u64)) -> u64| {
        median(
            pairs
                .iter()
                .map(|(w, wo)| part(w) as f64 / part(wo).max(1) as f64)
                .collect(),
        )
    };
    let cpu = ratio(|v| v.0);
    let dom = ratio(|v| v.1);
    eprintln!(
        "cycles over 2000 exits, median of {BOOTS} pairs' ratios with/without --trace: \
         cpu-switch {cpu:.4}x, domain-switch {dom:.4}x\n\
         (with, without) per pair, as (cpu-switch, domain-switch): {pairs:?}"
    );
    assert!(
        pairs.iter().all(|(_, wo)| wo.0 > 0),
        "cpu-switch counted nothing"
    );
    assert!(
        (cpu - 1.0).abs() <= TOLERANCE,
        "tracing changed what cpu-switch charges the guest: {cpu:.4}x (allowed {TOLERANCE})"
    );
}
