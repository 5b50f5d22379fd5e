//! Seccomp overhead on real /dev/kvm, as a ratio from one run (`cargo bench -p vpmu-benches
//! --bench seccomp`).
//!
//! S1  run time of an exit-heavy tiny guest (exit_storm64: 100000 port writes, each a VM exit
//!     to the VMM, so 100000 KVM_RUN ioctls through the vCPU thread's filter) with the filters
//!     on against off, alternating runs, median of each. Goal < 1.05x.

use std::time::Duration;

use runtime::end::VmEnd;
use runtime::seccomp::SeccompSetting;
use runtime::vm::{Boot, VmConfig};

fn run(seccomp: SeccompSetting) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let cfg = VmConfig {
        memory_mib: 64,
        timeout: Some(Duration::from_secs(300)),
        console_out: Some(dir.path().join("console")),
        seccomp,
        ..VmConfig::new(Boot::tiny(&tiny_guests::EXIT_STORM64))
    };
    let r = vpmu_benches::run_vm(&cfg);
    assert_eq!(r.end, VmEnd::PowerOff, "{:?}", r.end);
    assert!(
        r.exits[0].total() >= 100_000,
        "{} exits",
        r.exits[0].total()
    );
    r.run_time.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let n = 7;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    run(SeccompSetting::On); // warm-up
    for _ in 0..n {
        off.push(run(SeccompSetting::Off));
        on.push(run(SeccompSetting::On));
    }
    let (m_on, m_off) = (median(on.clone()), median(off.clone()));
    println!(
        "S1 exit_storm64 (100000 exits), median of {n}: seccomp off {m_off:.3} s, on {m_on:.3} s"
    );
    println!("   runs off: {off:.3?}");
    println!("   runs on:  {on:.3?}");
    println!("S1 ratio on/off: {:.3}x (goal < 1.05x)", m_on / m_off);
}
