//! Host-side guest profiles, read back (`report`): guest kernel symbols from the kernel's own
//! tables, user-space symbols from the guest's files, samples by process and symbol, flame
//! graphs.
//!
//! * [`kallsyms`] — the kallsyms tables inside a kernel image (ELF symbols or a scan);
//! * [`symbols`] — an address -> symbol table (from kallsyms or a System.map), and the row a
//!   sample counts in;
//! * [`user_symbols`] — user-space RIPs to executable + function, with the guest's files on the
//!   host;
//! * [`stacks`] — samples by guest process, and the folded / flame-graph SVG / JSON formats;
//! * [`report`] — the opreport-like table and the system-wide view (guest symbols beside the
//!   VMM's exit handling).

pub mod kallsyms;
pub mod report;
pub mod stacks;
pub mod symbols;
pub mod user_symbols;
