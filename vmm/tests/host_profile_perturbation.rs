//! Issue 19, item 5: the host-side profiler must not change what the guest counts. A guest
//! counts its own cycles over a fixed user-space loop (guest-image/tiny/asm/user_cycles_amd64.S:
//! CPL3, native on every host) alone, with `--host-profile` at 1000 Hz, and with it but its
//! interruptions left in the guest's counts (`RecordConfig::keep_sampler_time`, the behaviour
//! before the correction), in each accounting mode; runs rotate so drift falls on all three.
//! Each sample interrupts KVM_RUN (a signal); on hosts without a hardware PMU the soft backend
//! counts the vCPU thread's CPU time, so the host's work on each interruption (~70-80 us of it
//! here, measured by the sampler: docs/tracing.md, Limits) is counted as guest cycles unless
//! the vPMU forgets it. Checks, per mode (medians over nine rotations of each rotation's
//! ratios, each run's least round): the correction leaves less than 8 %, and where the
//! interruptions inflate the count by 8 % or more it takes away at least 40 % of that (below,
//! the share is within run-to-run noise and is reported NOT CHECKED; a pool machine measured
//! +1-8 % without the correction, 2026-11-29). Measured here: +11-16 % without it and +2.4-3.8 % with it on a
//! quiet machine; +9-13 % and +1.0-3.6 % beside two busy loops. What stays is the
//! interruptions' re-entry and after-effects, which the sampler cannot see.

mod common;

use std::path::Path;
use std::time::Duration;

use runtime::end::VmEnd;
use runtime::host_quirks::QuirkSetting;
use runtime::pmu::{BackendChoice, ModelChoice, PmuStats};
use runtime::trace::recorder::{ProfileClock, ProfileConfig};
use runtime::vm::VpmuSetting;

/// Inflation of the guest's count by the interruptions (kept in) above which the correction's
/// share of it is checked: a run's least round varies by up to ~9 % from run to run on a pool
/// machine (87-96M cycles, quiet, 2026-11-29), so the medians of nine ratios are good to a few
/// %; at +6.6 % inflation one quiet run left +4.2 % with the correction (a 36 % share), within
/// that noise.
const VISIBLE_INFLATION: f64 = 0.08;

/// How a run is profiled.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Profiled {
    No,
    Forgotten,
    Kept,
}

/// The least of the guest's per-round cycle counts (its first round dropped: warm-up): the
/// round the host disturbed least (this machine's speed drifts by several % from second to
/// second; every round has its ~33 samples, so the profile's cost is in each).
fn run(
    vpmu: VpmuSetting,
    backend: BackendChoice,
    profiled: Profiled,
    dir: &Path,
) -> (f64, PmuStats) {
    let r = common::run_tiny_with(
        &tiny_guests::USER_CYCLES_AMD64,
        Duration::from_secs(120),
        |c| {
            c.vpmu = vpmu;
            c.pmu_model = ModelChoice::Amd;
            c.pmu_backend = backend;
            c.record.keep_sampler_time = profiled == Profiled::Kept;
            c.record.profile = (profiled != Profiled::No).then(|| ProfileConfig {
                path: dir.join("p.prof"),
                hz: 1000,
                clock: ProfileClock::Auto,
                task_layout: None,
            });
        },
    );
    assert_eq!(
        r.report.end,
        VmEnd::PowerOff,
        "console: {}; serial2 {:x?}",
        r.console,
        r.serial2
    );
    let w = r.words();
    let n = *w.last().expect("no report from the guest") as usize;
    assert_eq!(w.len(), n + 1, "guest report: {w:x?}");
    let m = w[1..n].iter().copied().min().expect("rounds") as f64;
    eprintln!(
        "{vpmu:?} {backend:?} {profiled:?}: least {m:.0} cycles a round; {:.3} ms forgotten \
         over {} signals, {} samples' work left out",
        r.report.pmu.sampler_ns_forgotten as f64 / 1e6,
        r.report.pmu.signals,
        r.report.pmu.samples_left_out
    );
    if profiled == Profiled::Forgotten && backend == BackendChoice::Soft {
        assert!(
            r.report.pmu.sampler_ns_forgotten > 0,
            "{vpmu:?}: a profiled run of user code forgot nothing"
        );
    }
    (m, r.report.pmu)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn the_host_profile_does_not_change_the_guests_user_space_counts() {
    if !common::kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for vpmu in [VpmuSetting::CpuSwitch, VpmuSetting::DomainSwitch] {
        let backend = BackendChoice::Soft;
        // Nine rotations of the three kinds of run (~0.5 s a run); each rotation's ratios (its
        // runs ~1 s apart), then their medians. With five, one run of the old code
        // beside nothing else came out at +10.6 %, against +2.8-4.3 % in the four around it.
        let kinds = [Profiled::No, Profiled::Forgotten, Profiled::Kept];
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for rotation in 0..9 {
            let mut least = [0.0; 3];
            for k in 0..3 {
                let k = (k + rotation) % 3;
                least[k] = run(vpmu, backend, kinds[k], dir.path()).0;
            }
            with.push(least[1] / least[0] - 1.0);
            without.push(least[2] / least[0] - 1.0);
        }
        let (with, without) = (median(with), median(without));
        eprintln!(
            "{vpmu:?} {backend:?}: the guest's count with the host profile {:+.2} %, {:+.2} % \
             with its interruptions left in",
            100.0 * with,
            100.0 * without
        );
        assert!(
            with < 0.08,
            "{vpmu:?} {backend:?}: with the host profile the guest counted {:+.2} % ({:+.2} % \
             with the interruptions left in)",
            100.0 * with,
            100.0 * without
        );
        // The correction's share can be told from run-to-run noise only where the
        // interruptions inflate the count clearly (+9-16 % on the machine this was written on;
        // +1-8 % on a pool machine whose signals cost less, where a run's noise is a few %).
        if without >= VISIBLE_INFLATION {
            assert!(
                with < 0.6 * without,
                "{vpmu:?} {backend:?}: the correction took away less than 40 % of the \
                 interruptions' {:+.2} % (left {:+.2} %)",
                100.0 * without,
                100.0 * with
            );
        } else {
            testkit::not_checked(
                &format!("host profile correction's share, {vpmu:?}"),
                &format!(
                    "the interruptions inflated the guest's count by only {:+.2} % here (below \
                     {:.0} %, within run-to-run noise): only the bound of 8 % with the \
                     correction was checked",
                    100.0 * without,
                    100.0 * VISIBLE_INFLATION
                ),
            );
        }
    }
}

/// The hw source (over the simulated host PMU: hardware-only otherwise) in domain-switch counts
/// the VMM's work, so each sample's is left out of the guest's counters
/// (`VcpuPmu::host_work_begins`; the arithmetic is checked in pmu/backend/hw.rs against the
/// counting simulation). It cannot be told the interruption before the exit in events, so no
/// ns are forgotten; on this host the interruption is most of a sample's cost, which is why
/// this run checks the wiring and not the guest's count.
#[test]
fn the_hw_source_leaves_each_samples_work_out_in_domain_switch() {
    if !common::kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, pmu) = run(
        VpmuSetting::DomainSwitch,
        BackendChoice::Sim,
        Profiled::Forgotten,
        dir.path(),
    );
    assert!(
        pmu.samples_left_out * 10 >= pmu.signals * 9 && pmu.samples_left_out > 100,
        "{} samples' work left out of {} signals",
        pmu.samples_left_out,
        pmu.signals
    );
    assert_eq!(
        pmu.sampler_ns_forgotten, 0,
        "the hw source forgets no host time"
    );
}

/// The interruption of guest *kernel* code is forgotten only where that code runs natively (a
/// VT-x/SVM host): on hosts that emulate it (host quirks on) it runs on for the PMI skid after
/// the sampler's notification. A CPL 0 guest (gating_pair_amd64) under `--host-profile` in
/// cpu-switch: with the quirks as detected, and with them off (as on a VT-x/SVM host; the
/// tiny guest needs none of them). (The guest also runs rounds in domain-switch, where every
/// sample's VMM work is left out whatever the CPL: `sampler_work_ns_left_out`, not counted
/// here.)
#[test]
fn kernel_code_interruptions_are_forgotten_only_where_it_runs_natively() {
    if !common::kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let emulated = runtime::host_quirks::HostKind::decide(QuirkSetting::Auto).quirks();
    let mut forgotten = Vec::new();
    for quirks in [QuirkSetting::Auto, QuirkSetting::Off] {
        let r = common::run_tiny_with(
            &tiny_guests::GATING_PAIR_AMD64,
            Duration::from_secs(120),
            |c| {
                c.vpmu = VpmuSetting::CpuSwitch;
                c.pmu_model = ModelChoice::Amd;
                c.pmu_backend = BackendChoice::Soft;
                c.host = runtime::host_quirks::HostKind::decide(quirks);
                c.record.profile = Some(ProfileConfig {
                    path: dir.path().join("k.prof"),
                    hz: 1000,
                    clock: ProfileClock::Auto,
                    task_layout: None,
                });
            },
        );
        assert_eq!(r.report.end, VmEnd::PowerOff, "console: {}", r.console);
        let p = &r.report.pmu;
        eprintln!(
            "CPL 0 guest, quirks {quirks:?} (host emulates guest kernel code: {emulated}): \
             interruptions {:.3} ms forgotten over {} signals; sample work {:.3} ms left out",
            p.sampler_ns_forgotten as f64 / 1e6,
            p.signals,
            p.sampler_work_ns_left_out as f64 / 1e6
        );
        assert!(p.signals > 10, "too few samples to tell: {p:?}");
        forgotten.push(p.sampler_ns_forgotten);
    }
    let [as_detected, off] = forgotten[..] else {
        unreachable!()
    };
    assert!(
        off > 0,
        "kernel code's interruptions not forgotten with the quirks off"
    );
    assert_eq!(
        as_detected > 0,
        !emulated,
        "quirks as detected (the host emulates guest kernel code: {emulated}): {as_detected} ns \
         of its interruptions forgotten"
    );
}
