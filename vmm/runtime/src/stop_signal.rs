//! SIGINT / SIGTERM during a run (Ctrl-C on a long trace): the first one ends the run the way
//! `--timeout` does — the vCPUs are kicked, traces and profiles closed whole, the report and the
//! per-vCPU diagnostic printed — with exit code 128 + the signal number (130, 143). The handler
//! resets itself, so a second signal kills the process as usual (a VMM that does not stop).

use std::sync::atomic::{AtomicI32, Ordering};

static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // An atomic store is async-signal-safe.
    PENDING.store(sig, Ordering::Release);
}

/// Installs the handler for SIGINT and SIGTERM (once per run; `vpmu-vmm run` and `compare`).
pub fn install() -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: sigaction is plain data; all-zero is a valid starting value.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESETHAND | libc::SA_RESTART;
        // SAFETY: `sa` is valid for the call; the handler only does an atomic store.
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The signal that asked the run to stop, if one came.
pub fn pending() -> Option<i32> {
    match PENDING.load(Ordering::Acquire) {
        0 => None,
        s => Some(s),
    }
}

/// `SIGINT`, `SIGTERM`, or `signal N`.
pub fn name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        s => format!("signal {s}"),
    }
}
