//! Tier 2 (issue 20 item 5): in cpu-switch the gate charges the guest no more than the trace
//! saw the vCPU spend in KVM_RUN. The recorder reads its TSCs outside the accounting gate
//! (run_loop.rs: step 2 before the gate opens, step 8 after it closes), so each KVM_RUN
//! interval the gate charges lies inside the interval the trace records for it (entry TSC to
//! exit TSC), and what the guest counts over a stretch of exits can never exceed what the trace
//! says those exits spent in KVM_RUN.
//!
//! One traced boot of `gating_pair_amd64`: 20 rounds, each counting the cycles of 100
//! unclaimed port writes in cpu-switch and then in domain-switch, read with RDMSR (a VM exit
//! the trace records, so a round's count covers exactly the KVM_RUN intervals between its two
//! RDMSR exits). The soft backend's cycles are thread CPU time at the TSC rate, the trace's
//! TSC ticks, so the two are in one unit. Every cpu-switch round must count at most the
//! trace's in-KVM_RUN time (plus [`TOLERANCE`] for task-clock reads after a switch, converted
//! at the rounded kHz); the domain-switch rounds of the same boot, which charge the VMM's work
//! between the exits too, must count more than it (in at least one round: a round the host
//! preempted inside KVM_RUN may count less CPU time than wall time passed), so the comparison
//! tells the two modes apart. Deterministic: no boot-to-boot speed enters (the version before
//! compared 16 pairs of boots with and without `--trace` and still flaked under load).
//!
//! What it catches and what it cannot (this project's Intel build machine, kvm_pvm): with the
//! loop as it is, cpu-switch rounds count 0.95-0.976 of their KVM_RUN time (the ~2.5 % left is
//! the work between the trace's TSC reads and the gate's: backend reprogramming, the gate's
//! own toggles, the exit's classification) and domain-switch rounds 1.037-1.054. The gate
//! closed after the exit's handling (step 11: MSRs, devices, the host-profile sample's work
//! in step 12 before it) counts 1.013-1.018 and fails 19 of 20 rounds. The recorder's own
//! record-keeping moved inside the gate does NOT fail it (0.993 with step 2 inside, 0.998 with
//! step 8 inside): a record costs tens of nanoseconds per exit, less than that 2.5 % margin
//! and below what comparing boots resolves here; its place outside the gate is kept by the
//! loop's one order (run_loop.rs), and what tracing costs the guest as a ratio of boots is
//! benches/trace.rs T3 (goal 2 %).

mod common;

use std::time::Duration;

use analysis::exit_reason::Reason;
use analysis::trace::format::{Record, Trace};
use runtime::end::VmEnd;
use runtime::pmu::{BackendChoice, ModelChoice};
use runtime::vm::VpmuSetting;

/// The guest's counter (AMD PerfCtrExtCore counter 0), read with RDMSR around each round.
const CTR0: u32 = 0xc001_0201;
const ROUNDS: usize = 20;
/// How far a cpu-switch round may count past the trace's in-KVM_RUN time (relative).
const TOLERANCE: f64 = 1e-3;

/// One exit as the trace recorded it.
struct TracedExit {
    reason: Reason,
    /// MSR index or port.
    detail: u32,
    exit_tsc: u64,
    /// 0: never re-entered.
    entry_tsc: u64,
}

/// One traced cpu-switch boot: the guest's (cpu-switch, domain-switch) counts per round and
/// the trace's exits.
fn traced_boot() -> (Vec<(u64, u64)>, Vec<TracedExit>) {
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
            // Whole KVM_RUN intervals: nothing of them left out as KVM's exit path
            // (vm::exit_cost), so the gate's intervals and the trace's differ only by what
            // lies between their TSC reads.
            cfg.exit_cost_ns = Some(0);
            cfg.record.trace = Some(path.clone());
        },
    );
    assert_eq!(r.report.end, VmEnd::PowerOff, "console {}", r.console);
    let w = r.words();
    assert_eq!(w.len(), 1 + 2 * ROUNDS, "guest report incomplete: {w:?}");
    let rounds = w[1..].chunks(2).map(|p| (p[0], p[1])).collect();
    let t = Trace::read_file(&path).unwrap();
    assert_eq!(t.vcpus.len(), 1, "one vCPU");
    let v = &t.vcpus[0];
    assert_eq!(
        v.dropped, 0,
        "the trace dropped records: rounds cannot be aligned"
    );
    let exits = v
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Exit {
                event,
                exit_tsc,
                entry_tsc,
            } => Some(TracedExit {
                reason: event.reason,
                detail: event.detail,
                exit_tsc: *exit_tsc,
                entry_tsc: *entry_tsc,
            }),
            _ => None,
        })
        .collect();
    (rounds, exits)
}

/// TSC ticks the trace says the vCPU spent in KVM_RUN from the re-entry after exit `a` to the
/// exit `b` (the intervals a counter read at exit `a` and again at exit `b` covers).
fn in_run_ticks(exits: &[TracedExit], a: usize, b: usize) -> u64 {
    (a..b)
        .map(|k| {
            let entry = exits[k].entry_tsc;
            let exit = exits[k + 1].exit_tsc;
            assert!(entry != 0 && exit >= entry, "exit {k}: TSCs out of order");
            exit - entry
        })
        .sum()
}

#[test]
fn cpu_switch_charges_no_more_than_the_traced_kvm_run_time() {
    if !common::kvm_available() {
        return;
    }
    let (rounds, exits) = traced_boot();
    // The guest reads CTR0 twice per loop, two loops per round (cpu-switch, domain-switch).
    let reads: Vec<usize> = (0..exits.len())
        .filter(|&k| exits[k].reason == Reason::MsrRead && exits[k].detail == CTR0)
        .collect();
    assert_eq!(
        reads.len(),
        4 * ROUNDS,
        "RDMSR exits of the counter in the trace"
    );
    let mut lines = Vec::new();
    let mut over = Vec::new();
    let mut domain_above = 0;
    for (i, &(cpu, dom)) in rounds.iter().enumerate() {
        let (a, b) = (reads[4 * i], reads[4 * i + 1]);
        // 100 port writes between the reads, and any exit a kick adds (the sums cover them).
        assert!(b - a > 100, "round {i}: {} exits between the reads", b - a);
        let cpu_run = in_run_ticks(&exits, a, b);
        let dom_run = in_run_ticks(&exits, reads[4 * i + 2], reads[4 * i + 3]);
        lines.push(format!(
            "round {i:2}: cpu-switch {cpu} of {cpu_run} in KVM_RUN ({:.4}); domain-switch {dom} \
             of {dom_run} ({:.4})",
            cpu as f64 / cpu_run.max(1) as f64,
            dom as f64 / dom_run.max(1) as f64
        ));
        if cpu as f64 > cpu_run as f64 * (1.0 + TOLERANCE) {
            over.push(i);
        }
        assert!(cpu > 0, "round {i}: cpu-switch counted nothing");
        domain_above += usize::from(dom > dom_run);
    }
    let report = lines.join("\n");
    eprintln!("guest cycles against the trace's TSC ticks in KVM_RUN, per round:\n{report}");
    assert!(
        over.is_empty(),
        "cpu-switch charged the guest more than the trace's KVM_RUN time in rounds {over:?} \
         (tolerance {TOLERANCE}): VMM work lies inside the gate\n{report}"
    );
    assert!(
        domain_above > 0,
        "no domain-switch round counted more than its KVM_RUN time: the comparison cannot tell \
         the modes apart\n{report}"
    );
}
