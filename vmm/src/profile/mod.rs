//! Host-side guest profiles (`run --host-profile`, `report`): the VMM samples each vCPU's guest
//! RIP and CPL with no profiler in the guest, and resolves guest kernel addresses with the
//! guest kernel's own symbols.
//!
//! * [`sampler`] — the per-vCPU trigger: a cycles counter over the vPMU's perf backend, gated
//!   like the accounting mode, or a wall-clock timer;
//! * [`kallsyms`] — the kallsyms tables inside a kernel image (ELF symbols or a scan);
//! * [`symbols`] — an address -> symbol table (from kallsyms or a System.map);
//! * [`report`] — the opreport-like table and the system-wide view (guest symbols beside the
//!   VMM's exit handling).

pub mod kallsyms;
pub mod report;
pub mod sampler;
pub mod symbols;
