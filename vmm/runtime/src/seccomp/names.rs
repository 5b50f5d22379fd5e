//! x86_64 system call names, for naming a forbidden call in the SIGSYS report: the table of the
//! `syscalls` crate (generated from Linux's `arch/x86/entry/syscalls/syscall_64.tbl` and kept
//! current upstream), not a copy of our own.

use syscalls::x86_64::Sysno;

/// The name of x86_64 system call `nr`, or `None` for a number the table does not know (the
/// report then gives the number alone). Async-signal-safe: a `match` over constants, no
/// allocation, no lock.
pub(crate) fn name(nr: i64) -> Option<&'static str> {
    usize::try_from(nr)
        .ok()
        .and_then(Sysno::new)
        .map(|s| s.name())
}
