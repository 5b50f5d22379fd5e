//! Benchmarks live in `vpmu.rs` (a `harness = false` bench); nothing to export.
