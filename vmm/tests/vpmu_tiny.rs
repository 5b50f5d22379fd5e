//! Tier 2 for the vPMU: tiny guests that program the virtual PMU the way a driver does, on real
//! /dev/kvm, for both models and both accounting modes (see guest-image/tiny/asm/pmu_body.inc).

mod common;

use std::time::Duration;

use runtime::end::VmEnd;
use runtime::pmu::{BackendChoice, ModelChoice};
use runtime::vm::VpmuSetting;

/// What the guest reported over COM2.
#[derive(Debug)]
struct Report {
    v0: u64,
    v1: u64,
    v2: u64,
    samples: u64,
    in_loop: u64,
    masked_nmis: u64,
    masked_status: u64,
    storm_nmis: u64,
    rdpmc0: u64,
    rdpmc1: u64,
    msr0: u64,
    /// NMIs outside the sampling phases: PMIs the rate limit held back past their phase's end.
    late_nmis: u64,
}

const DELAY_US: u32 = 300;
const PMI_LIMIT: u32 = 500;

fn run(
    model: ModelChoice,
    mode: VpmuSetting,
    backend: BackendChoice,
) -> (Report, runtime::vm::RunReport) {
    let guest = match model {
        ModelChoice::Intel => tiny_guests::PMU_INTEL64,
        _ => tiny_guests::PMU_AMD64,
    };
    let r = common::run_tiny_with(&guest, Duration::from_secs(120), |cfg| {
        cfg.vpmu = mode;
        cfg.pmu_model = model;
        cfg.pmu_backend = backend;
        cfg.pmi_limit = PMI_LIMIT;
        cfg.io_delay_us = DELAY_US;
    });
    assert_eq!(
        r.report.end,
        VmEnd::PowerOff,
        "{model:?}/{mode:?}: console {}",
        r.console
    );
    assert_eq!(
        r.serial2.len(),
        96,
        "{model:?}/{mode:?}: guest report incomplete"
    );
    let w = r.words();
    let rep = Report {
        v0: w[0],
        v1: w[1],
        v2: w[2],
        samples: w[3],
        in_loop: w[4],
        masked_nmis: w[5],
        masked_status: w[6],
        storm_nmis: w[7],
        rdpmc0: w[8],
        rdpmc1: w[9],
        msr0: w[10],
        late_nmis: w[11],
    };
    let p = &r.report.pmu;
    eprintln!(
        "{model:?}/{mode:?}/{backend:?}: {rep:?}\n  vmm: {} NMIs, {} masked, {} throttled in {:?}",
        p.pmis_nmi, p.pmis_masked, p.pmis_throttled, r.report.run_time
    );
    (rep, r.report)
}

/// TSC cycles per second of this host, against the monotonic clock.
fn tsc_hz() -> f64 {
    let (t0, c0) = (std::time::Instant::now(), runtime::tsc::now());
    std::thread::sleep(Duration::from_millis(50));
    let (t1, c1) = (std::time::Instant::now(), runtime::tsc::now());
    (c1 - c0) as f64 / (t1 - t0).as_secs_f64()
}

/// A run whose PMIs the limiter never held back: replays every delivery (the TSC when KVM_NMI
/// returned) through a limiter at 1.1x the limit (slack for the replay's timing: the real check
/// ran just before the injection): not one may be over it.
fn storm_stayed_under_the_limit(p: &runtime::pmu::PmuStats) {
    assert!(
        p.pmis_nmi as usize <= runtime::pmu::MAX_PMI_TSCS
            && p.pmi_inject_tsc.len() as u64 == p.pmis_nmi,
        "storm neither throttled nor dropped, and not all {} NMIs recorded",
        p.pmis_nmi
    );
    let hz = tsc_hz();
    let t0 = std::time::Instant::now();
    let c0 = p.pmi_inject_tsc.first().copied().unwrap_or(0);
    let mut l = runtime::pmu::pmi::PmiLimiter::new(PMI_LIMIT * 11 / 10, t0);
    let over = p
        .pmi_inject_tsc
        .iter()
        .filter(|&&c| {
            let at = t0 + Duration::from_secs_f64(c.saturating_sub(c0) as f64 / hz);
            l.check(at).is_err()
        })
        .count();
    assert_eq!(
        over, 0,
        "storm neither throttled nor dropped, but {over} of {} NMIs came faster than the limit",
        p.pmis_nmi
    );
    eprintln!(
        "  storm: not throttled, and its {} NMIs never outran {PMI_LIMIT}/s (loaded host)",
        p.pmis_nmi
    );
}

fn check_one_mode(model: ModelChoice, mode: VpmuSetting, backend: BackendChoice) -> Report {
    if !common::kvm_available() {
        panic!("unreachable: kvm_available panics or returns true unless skipping");
    }
    let (rep, vm) = run(model, mode, backend);
    // Counting: cycles advance over the busy loop and over the I/O loop.
    assert!(rep.v1 > rep.v0, "{rep:?}");
    assert!(rep.v2 > rep.v1, "{rep:?}");
    // Sampling: PMIs arrive as NMIs and land in the hot loop.
    assert!(rep.samples >= 20, "too few samples: {rep:?}");
    assert!(
        rep.in_loop * 10 >= rep.samples * 9,
        "samples outside the hot loop: {rep:?}"
    );
    // Masked LVTPC: no NMI, the overflow stays visible in the global status.
    assert_eq!(rep.masked_nmis, 0, "{rep:?}");
    assert_eq!(rep.masked_status & 1, 1, "{rep:?}");
    assert!(vm.pmu.pmis_masked >= 1, "{:?}", vm.pmu);
    // Storm: a period of 1 is capped by the per-vCPU PMI rate limit, which holds PMIs back (on
    // Intel it may also end earlier, when an overflow finds LVTPC still masked from the previous
    // PMI: dropped, as on hardware, and nothing re-arms the counter). On a loaded host the vCPU
    // thread may run only in short slices far apart, each with fewer PMIs than the limiter's
    // burst: then nothing needed holding back, and the delivery times show it.
    if vm.pmu.pmis_throttled + vm.pmu.pmis_masked < 2 {
        storm_stayed_under_the_limit(&vm.pmu);
    }
    // The limit counts per fixed one-second window: over the whole run at most one window's
    // worth per started second.
    let windows = vm.run_time.as_secs() + 1;
    assert!(
        vm.pmu.pmis_nmi <= u64::from(PMI_LIMIT) * windows,
        "{} NMIs in {:?}",
        vm.pmu.pmis_nmi,
        vm.run_time
    );
    // Every PMI the model raised is accounted for: delivered, dropped (masked), merged into a
    // held-back one, or still held when the vCPU stopped.
    let p = &vm.pmu;
    assert!(p.pmis_raised > 0, "{p:?}");
    assert_eq!(
        p.pmis_raised,
        p.pmis_nmi + p.pmis_vector + p.pmis_masked + p.pmis_merged + p.pmis_held_at_end,
        "{p:?}"
    );
    assert!(p.signals > 0, "{p:?}");
    // RDPMC, rewritten to RDMSR by the VMM, reads the running counter; the genuine RDMSR of
    // MSR 0 (same number as RDPMC index 0) is answered by KVM (P5_MC_ADDR reads 0).
    assert!(rep.rdpmc1 > rep.rdpmc0, "RDPMC did not advance: {rep:?}");
    assert_eq!(rep.msr0, 0, "RDMSR 0 answered by the vPMU? {rep:?}");
    assert_eq!(vm.pmu.rdpmc_reads, 2, "{:?}", vm.pmu);
    assert_eq!(vm.pmu.rdpmc_genuine_msr, 1, "{:?}", vm.pmu);
    // Every NMI the VMM delivered reached the guest's handler. A PMI the rate limit held back
    // may land after its phase ended (the guest counts it as late and re-arms nothing): at most
    // one for each of the two sampling phases that re-arm from the handler.
    assert!(rep.late_nmis <= 2, "{rep:?}");
    let seen = rep.samples + rep.storm_nmis + rep.late_nmis;
    assert_eq!(
        vm.pmu.pmis_nmi, seen,
        "VMM delivered {} NMIs, guest saw {seen}: {:?}",
        vm.pmu.pmis_nmi, vm.pmu.by_mode
    );
    rep
}

fn compare_modes(model: ModelChoice, backend: BackendChoice) {
    if !common::kvm_available() {
        return;
    }
    let cpu = check_one_mode(model, VpmuSetting::CpuSwitch, backend);
    let dom = check_one_mode(model, VpmuSetting::DomainSwitch, backend);
    let (cpu_io, dom_io) = (cpu.v2 - cpu.v1, dom.v2 - dom.v1);
    eprintln!(
        "{model:?}/{backend:?}: I/O loop cycles cpu-switch {cpu_io}, domain-switch {dom_io} ({:.1}x)",
        dom_io as f64 / cpu_io as f64
    );
    // 100 port writes x 300 us of VMM work: charged in domain-switch only.
    assert!(
        dom_io > 3 * cpu_io,
        "domain-switch should charge the VMM's I/O work: cpu {cpu_io}, domain {dom_io}"
    );
}

#[test]
fn amd_model_counts_samples_and_charges_by_mode() {
    compare_modes(ModelChoice::Amd, BackendChoice::Soft);
}

#[test]
fn intel_model_counts_samples_and_charges_by_mode() {
    compare_modes(ModelChoice::Intel, BackendChoice::Soft);
}

/// The hw backend's path (raw hardware events, exclude_host/exclude_guest per mode, split
/// periods, multiplex scaling): on the real hardware PMU where the host has one that counts
/// (a perf_event_open of PERF_TYPE_HARDWARE / INSTRUCTIONS works), else over the simulated
/// host PMU (`--vpmu-backend sim`: backend/sim_host.rs). Says loudly which.
fn hw_backend() -> BackendChoice {
    if runtime::pmu::setup::host_counts_instructions() {
        eprintln!("*** hw backend: REAL (this host's hardware PMU counts instructions) ***");
        BackendChoice::Hw
    } else {
        eprintln!("*** hw backend: SIMULATED (no hardware PMU on this host) ***");
        testkit::not_checked(
            "the hw backend on a real host PMU (its tiny guests ran over the simulated one)",
            "this host's PMU does not count instructions for perf_event_open",
        );
        BackendChoice::Sim
    }
}

#[test]
fn amd_model_on_the_hw_backend_counts_samples_and_charges_by_mode() {
    if common::kvm_available() {
        compare_modes(ModelChoice::Amd, hw_backend());
    }
}

#[test]
fn intel_model_on_the_hw_backend_counts_samples_and_charges_by_mode() {
    if common::kvm_available() {
        compare_modes(ModelChoice::Intel, hw_backend());
    }
}

/// `--vpmu-backend hw` on a host whose PMU does not count is refused at start (exit code 1 and
/// why), not a guest whose counters stay at 0; `auto` takes the soft backend there.
#[test]
fn the_hw_backend_is_refused_where_the_host_pmu_cannot_count() {
    if !common::kvm_available() {
        return;
    }
    if runtime::pmu::setup::host_counts_instructions() {
        testkit::not_checked(
            "the_hw_backend_is_refused_where_the_host_pmu_cannot_count",
            "this host's PMU counts: --vpmu-backend hw is accepted here",
        );
        return;
    }
    let cfg = runtime::vm::VmConfig {
        memory_mib: 64,
        vpmu: VpmuSetting::CpuSwitch,
        pmu_model: ModelChoice::Amd,
        pmu_backend: BackendChoice::Hw,
        timeout: Some(Duration::from_secs(30)),
        ..runtime::vm::VmConfig::new(runtime::vm::Boot::tiny(&tiny_guests::PMU_AMD64))
    };
    let result = std::thread::scope(|s| s.spawn(|| runtime::vm::run(&cfg)).join().unwrap());
    let Err(e) = result else {
        panic!("--vpmu-backend hw started on a host whose PMU cannot count");
    };
    let e = e.to_string();
    assert!(e.contains("this host's PMU cannot count"), "{e}");
    assert_eq!(
        runtime::pmu::setup::resolve_backend(BackendChoice::Auto).unwrap(),
        BackendChoice::Soft
    );
}

/// Without the rewrite, this host's KVM answers RDPMC with #GP: the tiny guest (no #GP handler)
/// triple-faults. This is what `--rdpmc patch` fixes (and shows the test above can fail).
#[test]
fn without_the_rdpmc_rewrite_the_guest_faults() {
    if !common::kvm_available() {
        return;
    }
    let r = common::run_tiny_with(&tiny_guests::PMU_AMD64, Duration::from_secs(120), |cfg| {
        cfg.vpmu = VpmuSetting::CpuSwitch;
        cfg.pmu_model = ModelChoice::Amd;
        cfg.pmu_backend = BackendChoice::Soft;
        cfg.rdpmc = runtime::vm::RdpmcSetting::Off;
    });
    if common::kvm_answers_rdpmc(&r.report) {
        // The guest runs to its end, its RDPMCs reading KVM's 0.
        assert_eq!(r.report.end, VmEnd::PowerOff, "console {}", r.console);
        testkit::not_checked(
            "without_the_rdpmc_rewrite_the_guest_faults",
            "this host's KVM answers guest RDPMC itself (0, no #GP)",
        );
        return;
    }
    assert_eq!(r.report.end, VmEnd::TripleFault, "console {}", r.console);
    assert_eq!(r.serial2.len(), 64, "phases 1-4 should have reported");
}

/// The guest switches the accounting mode through the vPMU control port between two identical
/// I/O loops, with one counter running across the switch: the loop run in domain-switch is
/// charged the VMM's work, the one in cpu-switch is not — in one boot.
#[test]
fn guest_switches_the_accounting_mode_at_run_time() {
    if !common::kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("profile");
    let r = common::run_tiny_with(
        &tiny_guests::MODE_SWITCH64,
        Duration::from_secs(120),
        |cfg| {
            cfg.vpmu = VpmuSetting::CpuSwitch;
            cfg.pmu_model = ModelChoice::Amd;
            cfg.pmu_backend = BackendChoice::Soft;
            cfg.io_delay_us = DELAY_US;
            cfg.record.profile = Some(runtime::trace::ProfileConfig {
                path: profile.clone(),
                hz: 2000,
                clock: runtime::trace::ProfileClock::Auto,
                task_layout: None,
            });
        },
    );
    assert_eq!(r.report.end, VmEnd::PowerOff, "console {}", r.console);
    let w = r.words();
    assert_eq!(w.len(), 4, "guest report incomplete: {w:?}");
    let (mode1, cpu_io, mode2, dom_io) = (w[0], w[1], w[2], w[3]);
    eprintln!(
        "mode switch in one boot: cpu-switch loop {cpu_io} cycles, domain-switch loop {dom_io} ({:.1}x); modes {:?}",
        dom_io as f64 / cpu_io.max(1) as f64,
        r.report.mode_history
    );
    assert_eq!((mode1, mode2), (1, 2), "control port read-back");
    assert!(cpu_io > 0, "the counter must keep counting in cpu-switch");
    assert!(
        dom_io > 3 * cpu_io,
        "domain-switch loop should be charged the VMM's I/O work: cpu {cpu_io}, domain {dom_io}"
    );
    let modes: Vec<_> = r
        .report
        .mode_history
        .iter()
        .map(|s| (s.mode, s.by))
        .collect();
    assert_eq!(
        modes,
        vec![
            (vpmu::AccountingMode::CpuSwitch, "start"),
            (vpmu::AccountingMode::DomainSwitch, "guest")
        ]
    );
    assert_eq!(r.report.pmu.mode_switches, 1);
    // The host-side profiler's counter followed the switch: its samples carry both modes.
    let t = analysis::trace::format::Trace::read_file(&profile).unwrap();
    let modes = analysis::profile::report::sample_modes(&t).unwrap();
    assert_eq!(
        modes,
        vec![
            vpmu::AccountingMode::CpuSwitch,
            vpmu::AccountingMode::DomainSwitch
        ],
        "host profile samples should be tagged with both modes"
    );
}

/// Interrupts raised while the VMM delivers PMIs all arrive (guest-image/tiny/asm/
/// ipi_pmi_smp64.S): the second vCPU sends 500 fixed IPIs one at a time to the first, which takes
/// period-1 PMIs of the Intel model at the rate limit meanwhile. Masking LVTPC after a PMI used
/// to be a KVM_SET_LAPIC of the page read before the delivery, which wrote back an IRR without
/// any IPI that had arrived since: lost (received < sent), and a Linux guest waiting on such an
/// IPI hung. The mask is the VMM's now (`VcpuPmu::lvtpc_masked_by_pmi`).
#[test]
fn no_interrupt_is_lost_to_a_pmi() {
    if !common::kvm_available() {
        return;
    }
    let r = common::run_tiny_with(
        &tiny_guests::IPI_PMI_SMP64,
        Duration::from_secs(120),
        |cfg| {
            cfg.vcpus = 2;
            cfg.vpmu = VpmuSetting::CpuSwitch;
            cfg.pmu_model = ModelChoice::Intel;
            cfg.pmu_backend = BackendChoice::Soft;
            cfg.pmi_limit = 2000;
        },
    );
    assert_eq!(r.report.end, VmEnd::PowerOff, "console {}", r.console);
    let w = r.words();
    assert_eq!(w.len(), 5, "guest report incomplete: {w:?}");
    let (ap_up, sent, received, late, pmis) = (w[0], w[1], w[2], w[3], w[4]);
    let p = &r.report.pmu;
    eprintln!(
        "IPIs sent {sent}, received {received}, waits run out {late}; guest PMIs {pmis}; \
         vmm: {} NMIs, {} masked, {} throttled in {:?}",
        p.pmis_nmi, p.pmis_masked, p.pmis_throttled, r.report.run_time
    );
    assert_eq!(ap_up, 1, "the second vCPU did not start");
    // Lost IPIs first: each ends a wait, and after 5 the guest stops sending.
    assert_eq!(
        (received, late),
        (sent, 0),
        "IPIs lost or late (received of sent; waits that ran out): {w:?}"
    );
    assert!(sent >= 100, "too few IPIs sent: {w:?}");
    assert!(
        pmis >= 100 && p.pmis_nmi >= 100,
        "too few PMIs for the IPIs to race with: guest {pmis}, vmm {}",
        p.pmis_nmi
    );
}

/// The PMI timestamps of the run report are on the guest's TSC: each overflow signal comes
/// before the guest's NMI handler reads its TSC, and less than a second before. On a VT-x/SVM
/// host KVM starts a guest's TSC near 0; before the VMM added the vCPU's TSC offset, the SVM
/// tier's signals read ~8 * 10^9 cycles *after* the handlers that they caused (the PMI latency
/// bench found none to measure). On kvm_pvm the offset is 0.
#[test]
fn pmi_timestamps_are_on_the_guests_tsc() {
    let r = common::run_tiny_with(
        &tiny_guests::PMI_LATENCY64,
        Duration::from_secs(120),
        |cfg| {
            cfg.vpmu = VpmuSetting::DomainSwitch;
            cfg.pmu_model = ModelChoice::Amd;
            cfg.pmu_backend = BackendChoice::Soft;
            cfg.pmi_limit = 0;
        },
    );
    assert_eq!(r.report.end, VmEnd::PowerOff, "console {}", r.console);
    let w = r.words();
    let n = (w[0] as usize).min(256);
    assert!(n >= 64, "the guest saw {n} PMIs, wants 128");
    let hz = tsc_hz();
    let signals = &r.report.pmu.pmi_signal_tsc;
    let mut checked = 0;
    for (i, (&guest, &signal)) in w[1..1 + n].iter().zip(signals).enumerate() {
        if signal == 0 {
            continue; // no signal behind this PMI
        }
        assert!(
            signal < guest && ((guest - signal) as f64) < hz,
            "PMI {i}: overflow signal at guest TSC {signal}, the guest's handler at {guest}"
        );
        checked += 1;
    }
    assert!(checked >= n / 2, "{checked} of {n} PMIs had a signal");
    eprintln!("{checked} of {n} PMIs: signal before the guest's handler, within a second");
}
