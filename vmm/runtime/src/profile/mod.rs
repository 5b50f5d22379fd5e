//! Host-side guest profiles (`run --host-profile`): the VMM samples each vCPU's guest RIP and
//! CPL with no profiler in the guest. Reading them back (symbols, stacks, flame graphs, the
//! `report` command) is the `analysis` crate's (`analysis::profile`).
//!
//! * [`sampler`] — the per-vCPU trigger: a clock counter over the vPMU's perf backend, gated
//!   like the accounting mode, or a wall-clock timer;
//! * [`guest_task`] — which guest task (pid, tgid, comm) a sample interrupted, read from guest
//!   memory through a layout file made with the kernel;
//! * [`btf_layout`] — that layout, from the kernel image's BTF (`vpmu-vmm task-layout`);
//! * [`call_stack`] — a user-space call stack by frame pointers, bounded.

pub mod btf_layout;
pub(crate) mod call_stack;
pub mod guest_task;
pub(crate) mod sampler;
