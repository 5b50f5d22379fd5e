//! Tier 2 (issue 20 item 5): in cpu-switch nothing of the VMM's tracing is charged to the
//! guest. The recorder's work around KVM_RUN (TSC and clock reads, records into the writer's
//! buffers: run_loop.rs steps 2 and 8) sits outside the gate, so a guest that counts its own
//! cycles in cpu-switch over a fixed amount of work with many exits reads the same with and
//! without `--trace`.
//!
//! The guest (`gating_pair_amd64`) counts cycles around 2 x 2000 unclaimed port writes, 20
//! rounds of 100 in each mode (switching through the vPMU control port). Boots with and
//! without `--trace` alternate in BOOTS back-to-back pairs (A/B, then B/A). A boot's speed is
//! set for its whole life and differs from the next boot's by up to 2x on the build machines (a
//! pool machine, pinned to one CPU, read 22M to 46M cycles for the same work from boot to
//! boot), which defeats any one estimate now and then: the median of 5 pair ratios failed 6
//! runs of 7 there (on the commit before this test changed as after), the fastest boot of each
//! side failed 2 runs of 9 (one stray fast boot on one side). So two estimates of the same
//! ratio are taken from 16 pairs, the median of the pairs' cpu-switch ratios and the fastest
//! boot with over the fastest without, and the test passes if either lies within TOLERANCE of
//! 1: tracing work charged inside the gate shifts both. domain-switch, which charges the VMM's
//! work, is printed beside it.
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

use runtime::end::VmEnd;
use runtime::pmu::{BackendChoice, ModelChoice};
use runtime::vm::VpmuSetting;

const BOOTS: usize = 16;
/// How far the cpu-switch ratio with/without may lie from 1.
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
    type Pair = ((u64, u64), (u64, u64));
    let median_ratio = |mode: fn((u64, u64)) -> u64| {
        let mut v: Vec<f64> = pairs
            .iter()
            .map(|(w, wo)| mode(*w) as f64 / mode(*wo).max(1) as f64)
            .collect();
        v.sort_unstable_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let fastest = |side: fn(&Pair) -> (u64, u64), mode: fn((u64, u64)) -> u64| {
        pairs
            .iter()
            .map(|p| mode(side(p)))
            .min()
            .unwrap_or(0)
            .max(1) as f64
    };
    let fastest_ratio =
        |mode: fn((u64, u64)) -> u64| fastest(|p| p.0, mode) / fastest(|p| p.1, mode);
    let (cpu_median, cpu_fastest) = (median_ratio(|v| v.0), fastest_ratio(|v| v.0));
    let (dom_median, dom_fastest) = (median_ratio(|v| v.1), fastest_ratio(|v| v.1));
    eprintln!(
        "cycles over 2000 exits with/without --trace, {BOOTS} pairs: cpu-switch {cpu_median:.4}x \
         (median of pairs), {cpu_fastest:.4}x (fastest boots); domain-switch {dom_median:.4}x, \
         {dom_fastest:.4}x\n(with, without) per pair, as (cpu-switch, domain-switch): {pairs:?}"
    );
    assert!(
        pairs.iter().all(|(_, wo)| wo.0 > 0),
        "cpu-switch counted nothing"
    );
    assert!(
        (cpu_median - 1.0).abs() <= TOLERANCE || (cpu_fastest - 1.0).abs() <= TOLERANCE,
        "tracing changed what cpu-switch charges the guest: {cpu_median:.4}x (median of pairs), \
         {cpu_fastest:.4}x (fastest boots); allowed {TOLERANCE}"
    );
}
