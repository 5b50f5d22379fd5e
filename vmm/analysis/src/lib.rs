//! The offline side of vpmu-vmm: what a run leaves in files, read back without KVM.
//!
//! * [`exit_reason`] — what a VM exit was about, as a trace record keeps it;
//! * [`guest_task`] — the guest task, executable and mapping a host-side sample found;
//! * [`trace`] — the trace file format (`run --trace`, `--host-profile`), its readers, the
//!   xenalyze-style summaries, the `--interval` series and the `trace summary` command;
//! * [`profile`] — guest symbols (kallsyms, System.map, the guest's own ELF files), samples by
//!   process and symbol, flame graphs, and the `report` command;
//! * [`svg`] — the one SVG writer of the charts (`trace summary --svg`, `compare`), and the
//!   one XML escaper;
//! * [`guest_results`] — the result frames a guest sends over COM2 (`vpmu-vmm results`), and
//!   [`guest_reports`] — readers for the profiler outputs in them;
//! * [`bzimage`] — the vmlinux inside a bzImage (the VMM boots from it, the symbol readers
//!   read it).
//!
//! The VMM's runtime (`runtime`) writes these files and depends on this crate; nothing here depends on the VMM.

pub mod bzimage;
pub mod exit_reason;
pub mod guest_reports;
pub mod guest_results;
pub mod guest_task;
pub mod profile;
pub mod svg;
pub mod trace;
