//! vpmu-vmm, the tool: its command line, `compare` (profiles in both accounting modes side by
//! side) and the end-of-run report. The VM itself is the `runtime` crate's, what reads a run's
//! files back is `analysis`'s, the PMU model is `vpmu`'s (see docs/architecture.md).
//! * [`cli`], `main.rs`: command line and exit codes;
//! * [`compare`]: `vpmu-vmm compare`; [`disk_arg`]: `--disk` as both take it;
//! * [`report`]: the end-of-run report, as text and as JSON.

pub mod cli;
pub mod compare;
pub mod disk_arg;
pub mod report;
