//! VM-exit tracing (`run --trace`): a compact binary record per exit that reaches the VMM,
//! written off the vCPUs' hot path in bounded memory. The host-side profiler
//! ([`crate::profile`]) writes its samples in the same format. The format itself, its readers
//! and the xenalyze-style summaries (`trace summary`) are the `analysis` crate's
//! (`analysis::trace`); an exit's reason and detail come from [`crate::exit::kind`].
//!
//! * [`writer`] — per-vCPU buffer pools and the writer thread (drops are counted, not queued);
//! * [`recorder`] — what the vCPU loop calls around KVM_RUN (TSCs, clock and sample records).

pub mod recorder;
pub(crate) mod writer;

pub use recorder::{ProfileClock, ProfileConfig, RecordConfig};
