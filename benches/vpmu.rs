//! vPMU benchmarks on real /dev/kvm, reported as ratios and percentiles from one run (the build
//! machines are noisy: compare numbers taken together). `cargo bench -p vpmu-benches`.
//!
//! P1  cost of a guest RDMSR of a PMU counter answered by the vPMU (model + soft backend, with
//!     the counter running), against the same RDMSR answered by a constant in user space (a bare
//!     user-space MSR exit). Goal: <= 1.2x.
//! PMI latency: TSC at the host's overflow signal on the vCPU thread -> TSC read first thing in
//!     the guest's NMI handler; p50 and p95.

use std::time::Duration;

use vmm::end::VmEnd;
use vmm::pmu::{BackendChoice, ModelChoice};
use vmm::vm::{Boot, RunReport, VmConfig, VpmuSetting};

const P1_MSRS: [u32; 2] = [0xc001_0202, 0xc001_0203];

fn run(
    guest: &tiny_guests::TinyGuest,
    vpmu: VpmuSetting,
    const_msrs: Vec<u32>,
) -> (RunReport, Vec<u64>) {
    let dir = tempfile::tempdir().unwrap();
    let serial2 = dir.path().join("serial2");
    let cfg = VmConfig {
        memory_mib: 64,
        vpmu,
        serial2: Some(serial2.clone()),
        timeout: Some(Duration::from_secs(300)),
        console_out: Some(dir.path().join("console")),
        pmu_model: ModelChoice::Amd,
        pmu_backend: BackendChoice::Soft,
        pmi_limit: 0,
        const_msrs,
        ..VmConfig::new(Boot::tiny(guest))
    };
    let r = vpmu_benches::run_vm(&cfg);
    assert_eq!(r.end, VmEnd::PowerOff, "{}: {:?}", guest.name, r.end);
    let words = std::fs::read(serial2)
        .unwrap()
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (r, words)
}

fn tsc_khz() -> f64 {
    // The guest and host share the TSC; KVM reports its rate per vCPU, the host's cpuinfo is
    // close enough for converting cycles to microseconds here.
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|mhz| mhz * 1000.0)
        .unwrap_or(2_000_000.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("*** /dev/kvm is missing: the vPMU benchmarks CANNOT RUN here ***");
        std::process::exit(1);
    }
    let khz = tsc_khz();
    let us = |cycles: f64| cycles / khz * 1000.0;

    // P1, alternating runs so drift on a shared machine hits both sides alike.
    let (mut vp, mut bare) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let (_, w) = run(
            &tiny_guests::MSR_LOOP64,
            VpmuSetting::DomainSwitch,
            Vec::new(),
        );
        vp.push(w[0] as f64 / w[1] as f64);
        let (_, w) = run(&tiny_guests::MSR_LOOP64, VpmuSetting::Off, P1_MSRS.to_vec());
        bare.push(w[0] as f64 / w[1] as f64);
    }
    vp.sort_by(f64::total_cmp);
    bare.sort_by(f64::total_cmp);
    let (vp_med, bare_med) = (percentile(&vp, 0.5), percentile(&bare, 0.5));
    println!(
        "P1  PMU counter RDMSR via the vPMU: {:.2} us/access (median of 5 runs x 5000)",
        us(vp_med)
    );
    println!(
        "P1  same RDMSR answered with a constant in user space: {:.2} us/access",
        us(bare_med)
    );
    println!(
        "P1  ratio vPMU / bare user-space exit = {:.2}x (goal <= 1.2x)",
        vp_med / bare_med
    );

    // PMI latency.
    let (r, w) = run(
        &tiny_guests::PMI_LATENCY64,
        VpmuSetting::DomainSwitch,
        Vec::new(),
    );
    let guest_tscs = &w[1..];
    let host = &r.pmu.pmi_signal_tsc;
    let mut lat: Vec<f64> = guest_tscs
        .iter()
        .zip(host)
        .filter(|(g, h)| **h > 0 && **g > **h)
        .map(|(g, h)| us((g - h) as f64))
        .collect();
    lat.sort_by(f64::total_cmp);
    if lat.is_empty() {
        println!(
            "PMI latency: no samples ({} NMIs delivered, guest saw {})",
            r.pmu.pmis_nmi, w[0]
        );
        std::process::exit(1);
    }
    println!(
        "PMI latency (overflow signal -> guest NMI handler entry), {} PMIs: p50 {:.1} us, p95 {:.1} us, max {:.1} us",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.95),
        lat[lat.len() - 1]
    );
}
