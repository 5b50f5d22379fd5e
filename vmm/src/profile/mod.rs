//! Host-side guest profiles (`run --host-profile`, `report`): the VMM samples each vCPU's guest
//! RIP and CPL with no profiler in the guest, and resolves guest kernel addresses with the
//! guest kernel's own symbols.
//!
//! * [`sampler`] — the per-vCPU trigger: a cycles counter over the vPMU's perf backend, gated
//!   like the accounting mode, or a wall-clock timer;
//! * [`guest_task`] — which guest task (pid, tgid, comm) a sample interrupted, read from guest
//!   memory through a layout file made with the kernel;
//! * [`kallsyms`] — the kallsyms tables inside a kernel image (ELF symbols or a scan);
//! * [`symbols`] — an address -> symbol table (from kallsyms or a System.map);
//! * [`stacks`] — samples by guest process, and the folded / flame-graph SVG / JSON formats;
//! * [`call_stack`] — a user-space call stack by frame pointers, bounded;
//! * [`user_symbols`] — user-space RIPs to executable + function, with the guest's files on the
//!   host;
//! * [`report`] — the opreport-like table and the system-wide view (guest symbols beside the
//!   VMM's exit handling).

pub mod btf_layout;
pub(crate) mod call_stack;
pub mod guest_task;
pub(crate) mod sampler;
