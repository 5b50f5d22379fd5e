//! Benchmarks live in `vpmu.rs` and `trace.rs` (`harness = false` benches); this holds what they
//! share.

/// `vm::run` on a thread of its own: with seccomp on (the default, as in the binary), the
/// calling thread stays confined after the run, and a bench runs many VMs from `main`.
pub fn run_vm(cfg: &vmm::vm::VmConfig) -> vmm::vm::RunReport {
    std::thread::scope(|s| {
        s.spawn(|| vmm::vm::run(cfg).expect("VM run"))
            .join()
            .expect("VM run thread")
    })
}
