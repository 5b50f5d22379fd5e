//! VM-exit tracing (`run --trace`, `trace summary`): a compact binary record per exit that
//! reaches the VMM, written off the vCPUs' hot path in bounded memory, and the xenalyze-style
//! summaries read back from it. The host-side profiler ([`crate::profile`]) writes its samples
//! in the same format.
//!
//! * [`format`] — file layout (header, blocks, records) and the reader, with its error enum;
//!   (an exit's reason and detail come from [`crate::exit::kind`], classified once per exit);
//! * [`writer`] — per-vCPU buffer pools and the writer thread (drops are counted, not queued);
//! * [`recorder`] — what the vCPU loop calls around KVM_RUN (TSCs, clock and sample records);
//! * [`summary`] — per-vCPU exit tables, per port/MSR/MMIO tables, time split, `--dump`;
//! * [`series`] — `--interval` CSV time series and its SVG chart.

pub mod recorder;
pub(crate) mod writer;

pub use recorder::{ProfileClock, ProfileConfig, RecordConfig};
