//! Cost of the per-vCPU ring of last exits (vmm/runtime/src/last_exits.rs) on the exit path, as a
//! ratio from one run (`cargo bench -p vpmu-benches --bench last_exits`).
//!
//! R1  ns per `LastExits::push` of a port-write exit (classification + ring stores), against
//!     ns per VM exit of an exit-heavy tiny guest on /dev/kvm (exit_storm64: 100000 port
//!     writes, no tracing), median of 5 runs. Goal < 0.01 (under 1% of an exit).

use std::hint::black_box;
use std::time::{Duration, Instant};

use kvm_ioctls::VcpuExit;
use runtime::end::VmEnd;
use runtime::exit::kind::classify;
use runtime::last_exits::LastExits;
use runtime::vm::{Boot, VmConfig};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn push_ns() -> f64 {
    const N: u64 = 20_000_000;
    let mut ring = LastExits::default();
    let data = [0u8; 1];
    let t = Instant::now();
    for i in 0..N {
        let port = 0x80 + (i & 1) as u16;
        ring.push_event(classify(black_box(&Ok(VcpuExit::IoOut(port, &data)))));
    }
    black_box(ring.last());
    t.elapsed().as_nanos() as f64 / N as f64
}

fn exit_ns() -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let cfg = VmConfig {
        memory_mib: 64,
        timeout: Some(Duration::from_secs(300)),
        console_out: Some(dir.path().join("console")),
        ..VmConfig::new(Boot::tiny(&tiny_guests::EXIT_STORM64))
    };
    let r = runtime::vm::run(&cfg).expect("VM run");
    assert_eq!(r.end, VmEnd::PowerOff, "{:?}", r.end);
    r.run_time.as_nanos() as f64 / r.exits[0].total() as f64
}

fn main() {
    if !std::path::Path::new("/dev/kvm").exists() {
        panic!("*** /dev/kvm is missing: this benchmark CANNOT RUN here ***");
    }
    let push = median((0..5).map(|_| push_ns()).collect());
    let exit = median((0..5).map(|_| exit_ns()).collect());
    println!(
        "R1 last-exits ring: {push:.2} ns per push, {exit:.0} ns per VM exit: ratio {:.5} (goal < 0.01)",
        push / exit
    );
}
