//! The benchmarks are the `[[bench]]` targets of benches/Cargo.toml (`harness = false`, each a
//! file here); this holds what they share.

/// `vm::run` on a thread of its own: with seccomp on (the default, as in the binary), the
/// calling thread stays confined after the run, and a bench runs many VMs from `main`.
pub fn run_vm(cfg: &runtime::vm::VmConfig) -> runtime::vm::RunReport {
    std::thread::scope(|s| {
        s.spawn(|| runtime::vm::run(cfg).expect("VM run"))
            .join()
            .expect("VM run thread")
    })
}
