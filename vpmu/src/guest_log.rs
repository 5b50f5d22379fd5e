//! Log lines the guest can cause, bounded: one limiter for the VMM and this model (issue 33).
//!
//! A hostile or broken guest repeats what draws a warning (a write the device ignores, a
//! counter the backend cannot program, a notify of a queue that does not exist) as fast as it
//! can exit: tens of thousands of lines a second into the user's terminal or log file. Each
//! kind of guest-triggered line is a `static` [`GuestLog`]; its first [`LOGGED_PER_KIND`]
//! occurrences are logged (the last of them saying that further ones are only counted), the
//! rest are counted, and [`totals`] gives every kind's counts for the end-of-run report.
//!
//! ```
//! use vpmu::guest_log::GuestLog;
//! static IGNORED_WRITE: GuestLog = GuestLog::new("example-ignored-write");
//! vpmu::guest_warn!(IGNORED_WRITE, "ignored write {:#x}", 7);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Lines logged of each kind; later occurrences are counted only.
pub const LOGGED_PER_KIND: u64 = 10;

/// One kind of guest-triggered log line and how often it happened.
pub struct GuestLog {
    kind: &'static str,
    seen: AtomicU64,
}

/// Every kind that happened at least once, in the order they first did.
static SEEN_KINDS: Mutex<Vec<&'static GuestLog>> = Mutex::new(Vec::new());

/// What to do with one occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it.
    Log,
    /// Log it and say that later ones are only counted.
    LogLast,
    /// Count it only.
    Suppress,
}

impl GuestLog {
    /// A kind, named as the report's totals show it.
    pub const fn new(kind: &'static str) -> Self {
        GuestLog {
            kind,
            seen: AtomicU64::new(0),
        }
    }

    /// Counts one occurrence and says whether to log it.
    pub fn occur(&'static self) -> Verdict {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if n == 1 {
            SEEN_KINDS
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(self);
        }
        match n {
            n if n < LOGGED_PER_KIND => Verdict::Log,
            LOGGED_PER_KIND => Verdict::LogLast,
            _ => Verdict::Suppress,
        }
    }

    /// Occurrences so far.
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::Relaxed)
    }
}

/// The words a [`Verdict::LogLast`] line ends with.
pub const LAST_NOTE: &str = " (further lines of this kind are counted, not logged)";

/// Logs a guest-triggered warning through its kind's limiter.
#[macro_export]
macro_rules! guest_warn {
    ($kind:expr, $($arg:tt)+) => {
        match $kind.occur() {
            $crate::guest_log::Verdict::Log => log::warn!($($arg)+),
            $crate::guest_log::Verdict::LogLast => {
                log::warn!("{}{}", format_args!($($arg)+), $crate::guest_log::LAST_NOTE)
            }
            $crate::guest_log::Verdict::Suppress => {}
        }
    };
}

/// One kind's counts for the end-of-run report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestLogTotal {
    pub kind: &'static str,
    /// Occurrences.
    pub seen: u64,
    /// Occurrences counted but not logged.
    pub suppressed: u64,
}

/// Every kind that happened in this process so far.
pub fn totals() -> Vec<GuestLogTotal> {
    SEEN_KINDS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .iter()
        .map(|k| GuestLogTotal {
            kind: k.kind,
            seen: k.seen(),
            suppressed: k.seen().saturating_sub(LOGGED_PER_KIND),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_logs_ten_lines_and_counts_the_rest() {
        static FLOOD: GuestLog = GuestLog::new("test-flood");
        let verdicts: Vec<Verdict> = (0..100_000).map(|_| FLOOD.occur()).collect();
        let logged = verdicts.iter().filter(|v| **v != Verdict::Suppress).count();
        assert_eq!(logged as u64, LOGGED_PER_KIND);
        assert_eq!(verdicts[9], Verdict::LogLast);
        let t = totals()
            .into_iter()
            .find(|t| t.kind == "test-flood")
            .unwrap();
        assert_eq!((t.seen, t.suppressed), (100_000, 100_000 - LOGGED_PER_KIND));
    }
}
