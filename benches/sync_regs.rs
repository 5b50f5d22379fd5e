//! The exit path with and without sync registers (KVM_CAP_SYNC_REGS, vmm/runtime/src/vcpu_access/mod.rs),
//! runs interleaved A/B in one process (`cargo bench -p vpmu-benches --bench sync_regs`).
//!
//! R1  ns per VM exit of exit_storm64 (100000 port writes; registers never read), sync
//!     registers on / off, median of 5 pairs: what KVM's copy of regs, sregs and events into
//!     kvm_run at every exit costs. Goal <= 1.05.
//! R2  a relayed system call's round trip (syscall64, TSC cycles as the guest measures them),
//!     on / off, median of 7 pairs (and each against the guest's CPL3 `ud2` round trip). Goal < 1 (the register ioctls are gone; KVM applies the
//!     dirty sets inside KVM_RUN).
//! R3  the run report's VMM µs per relayed system call (exit to registers written), on / off.
//!     Goal <= 0.5 (issue 20 item 5).

use std::time::Duration;

use runtime::end::VmEnd;
use runtime::vm::{Boot, VmConfig};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn config(guest: &tiny_guests::TinyGuest, dir: &std::path::Path, sync_regs: bool) -> VmConfig {
    VmConfig {
        memory_mib: 64,
        timeout: Some(Duration::from_secs(300)),
        console_out: Some(dir.join("console")),
        serial2: Some(dir.join("serial2")),
        sync_regs,
        ..VmConfig::new(Boot::tiny(guest))
    }
}

fn run(cfg: &VmConfig) -> runtime::vm::RunReport {
    // On a thread of its own: vm::run leaves its calling thread confined by seccomp.
    let r = std::thread::scope(|s| s.spawn(|| runtime::vm::run(cfg)).join().expect("vm::run"))
        .expect("VM run");
    assert_eq!(r.end, VmEnd::PowerOff, "{:?}", r.end);
    r
}

fn exit_ns(sync_regs: bool) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let r = run(&config(&tiny_guests::EXIT_STORM64, dir.path(), sync_regs));
    assert_eq!(
        r.exits[0].sync_regs, sync_regs,
        "this host has no sync registers"
    );
    r.run_time.as_nanos() as f64 / r.exits[0].total() as f64
}

/// (round trip TSC cycles per system call, VMM µs per relayed system call, TSC cycles per CPL3
/// `ud2` -> #UD -> IRETQ round trip: no VMM involved)
fn syscall(sync_regs: bool) -> (f64, f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&tiny_guests::SYSCALL64, dir.path(), sync_regs);
    let r = run(&cfg);
    let w: Vec<u64> = std::fs::read(dir.path().join("serial2"))
        .unwrap()
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(w.len(), 19, "guest report incomplete");
    let (_, us) = r
        .syscall_relay
        .expect("no relayed system calls: not a kvm_pvm host");
    (w[15] as f64 / w[17] as f64, us, w[16] as f64 / w[18] as f64)
}

fn main() {
    if !std::path::Path::new("/dev/kvm").exists() {
        panic!("*** /dev/kvm is missing: this benchmark CANNOT RUN here ***");
    }
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        on.push(exit_ns(true));
        off.push(exit_ns(false));
    }
    let (on, off) = (median(on), median(off));
    println!(
        "R1 port-write exit: {on:.0} ns with sync registers, {off:.0} ns without: ratio {:.3} (goal <= 1.05)",
        on / off
    );
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        on.push(syscall(true));
        off.push(syscall(false));
    }
    let rt = |v: &[(f64, f64, f64)]| median(v.iter().map(|s| s.0).collect());
    let us = |v: &[(f64, f64, f64)]| median(v.iter().map(|s| s.1).collect());
    let ud2 = |v: &[(f64, f64, f64)]| median(v.iter().map(|s| s.0 / s.2).collect());
    println!(
        "R2 relayed system call round trip: {:.0} TSC cycles with sync registers ({:.2}x a CPL3 ud2 round trip), {:.0} without ({:.2}x): ratio {:.3} (goal < 1)",
        rt(&on),
        ud2(&on),
        rt(&off),
        ud2(&off),
        rt(&on) / rt(&off)
    );
    println!(
        "R3 VMM time per relayed system call: {:.1} us with sync registers, {:.1} without: ratio {:.3} (goal <= 0.5)",
        us(&on),
        us(&off),
        us(&on) / us(&off)
    );
}
