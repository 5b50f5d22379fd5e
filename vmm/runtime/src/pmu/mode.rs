//! The accounting mode at run time. One [`ModeSwitch`] per VM holds the mode every vCPU should
//! count in; the host changes it on a schedule (`--vpmu-schedule`, [`Schedule`]) and the guest
//! through the vPMU control port (devices/vpmu_control.rs). Each vCPU applies a change at its
//! next exit (the switcher kicks them all), through `vpmu::Pmu::set_accounting_mode`, which
//! keeps the counts so far. Every switch is logged with its time, and the vCPUs' PMI and RDPMC
//! counts are kept per mode (`PmuStats::by_mode`), so each count says which mode it was taken in.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vpmu::AccountingMode;

/// One switch, as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    pub at: Duration,
    /// TSC at the switch (to cut trace samples into the phases).
    pub tsc: u64,
    pub mode: AccountingMode,
    pub by: &'static str,
}

/// At most this many switches are logged (4.8 MB; 28 hours of switching every second). The guest
/// can switch at every exit through port 0x511, so an unbounded log would let it grow the VMM's
/// memory by 48 bytes per exit (found by the soak, docs/vpmu.md "Storm and soak"). Later switches
/// are still applied, only not logged.
pub(crate) const MAX_LOGGED_SWITCHES: usize = 100_000;

/// Switches are printed (info level) at most this often: a guest that switches at every exit
/// through port 0x511 must not flood the operator's terminal. The ones in between are counted
/// and the next printed line says how many; all of them are in [`ModeSwitch::history`].
pub(crate) const PRINT_INTERVAL: Duration = Duration::from_secs(1);

/// The VM's current accounting mode.
pub struct ModeSwitch {
    current: AtomicU8,
    start: Instant,
    log: Mutex<SwitchLog>,
    /// Switches made after the log filled up.
    unlogged: AtomicU64,
}

struct SwitchLog {
    switches: Vec<Switch>,
    /// When a switch was last printed, and how many were not printed since.
    last_printed: Option<Duration>,
    not_printed: u64,
}

impl SwitchLog {
    /// Whether the switch at `at` gets a line of its own; if so, also how many before it did not.
    fn should_print(&mut self, at: Duration) -> Option<u64> {
        match self.last_printed {
            Some(last) if at.saturating_sub(last) < PRINT_INTERVAL => {
                self.not_printed += 1;
                None
            }
            _ => {
                self.last_printed = Some(at);
                Some(std::mem::take(&mut self.not_printed))
            }
        }
    }
}

impl ModeSwitch {
    pub fn new(mode: AccountingMode) -> Self {
        ModeSwitch {
            current: AtomicU8::new(mode.index() as u8),
            start: Instant::now(),
            log: Mutex::new(SwitchLog {
                switches: vec![Switch {
                    at: Duration::ZERO,
                    tsc: crate::tsc::now(),
                    mode,
                    by: "start",
                }],
                last_printed: None,
                not_printed: 0,
            }),
            unlogged: AtomicU64::new(0),
        }
    }

    pub fn get(&self) -> AccountingMode {
        match self.current.load(Ordering::Acquire) {
            0 => AccountingMode::CpuSwitch,
            _ => AccountingMode::DomainSwitch,
        }
    }

    /// Sets the mode; returns whether it changed (the caller then kicks the vCPUs).
    pub fn set(&self, mode: AccountingMode, by: &'static str) -> bool {
        let old = self.current.swap(mode.index() as u8, Ordering::AcqRel);
        if old == mode.index() as u8 {
            return false;
        }
        let at = self.start.elapsed();
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        match log.should_print(at) {
            Some(0) => log::info!(
                "vPMU accounting mode -> {} at {:.3} s (by {by})",
                mode.name(),
                at.as_secs_f64()
            ),
            Some(skipped) => log::info!(
                "vPMU accounting mode -> {} at {:.3} s (by {by}; {skipped} switches in the last {} s not printed)",
                mode.name(),
                at.as_secs_f64(),
                PRINT_INTERVAL.as_secs()
            ),
            None => log::debug!(
                "vPMU accounting mode -> {} at {:.3} s (by {by})",
                mode.name(),
                at.as_secs_f64()
            ),
        }
        if log.switches.len() >= MAX_LOGGED_SWITCHES {
            if self.unlogged.fetch_add(1, Ordering::Relaxed) == 0 {
                log::warn!(
                    "vPMU accounting-mode log full ({MAX_LOGGED_SWITCHES} switches): later switches are applied but not logged, and the end-of-run time per mode counts them in the last logged mode"
                );
            }
            return true;
        }
        log.switches.push(Switch {
            at,
            tsc: crate::tsc::now(),
            mode,
            by,
        });
        true
    }

    /// Switches made after the log was full (not in [`Self::history`]).
    pub(crate) fn unlogged(&self) -> u64 {
        self.unlogged.load(Ordering::Relaxed)
    }

    /// Every switch so far, the initial mode first.
    pub(crate) fn history(&self) -> Vec<Switch> {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .switches
            .clone()
    }
}

/// Wall time spent in each mode (indexed by [`index`]) from a switch history (initial mode
/// first) up to `end`, the run's length.
pub fn time_in_modes(history: &[Switch], end: Duration) -> [Duration; 2] {
    let mut out = [Duration::ZERO; 2];
    for (i, s) in history.iter().enumerate() {
        let until = history.get(i + 1).map_or(end, |n| n.at).max(s.at);
        out[s.mode.index()] += until.saturating_sub(s.at);
    }
    out
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScheduleError {
    #[error("--vpmu-schedule: empty")]
    Empty,
    #[error("--vpmu-schedule: `{0}` is not MODE:SECONDS (MODE = cpu-switch or domain-switch)")]
    Entry(String),
    #[error("--vpmu-schedule: `repeat` must be the last entry, after at least one MODE:SECONDS")]
    Repeat,
}

/// `--vpmu-schedule cpu-switch:30,domain-switch:30`: each mode for its seconds in turn; the
/// last one stays. With a final `,repeat` the list starts over after its last step, for as
/// long as the VM runs (modes interleaved over a run whose length is not known in advance,
/// e.g. a boot: each mode gets a share of every part of it).
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub steps: Vec<(AccountingMode, Duration)>,
    pub repeat: bool,
}

impl std::str::FromStr for Schedule {
    type Err = ScheduleError;
    fn from_str(s: &str) -> Result<Self, ScheduleError> {
        let mut out = Vec::new();
        let mut repeat = false;
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if repeat {
                return Err(ScheduleError::Repeat);
            }
            if entry == "repeat" {
                if out.is_empty() {
                    return Err(ScheduleError::Repeat);
                }
                repeat = true;
                continue;
            }
            let bad = || ScheduleError::Entry(entry.to_string());
            let (m, secs) = entry.split_once(':').ok_or_else(bad)?;
            let mode = AccountingMode::parse(m.trim()).ok_or_else(bad)?;
            let secs: f64 = secs.trim().parse().map_err(|_| bad())?;
            if !(secs.is_finite() && secs > 0.0) {
                return Err(bad());
            }
            out.push((mode, Duration::from_secs_f64(secs)));
        }
        if out.is_empty() {
            return Err(ScheduleError::Empty);
        }
        Ok(Schedule { steps: out, repeat })
    }
}

impl Schedule {
    pub fn first(&self) -> AccountingMode {
        self.steps[0].0
    }

    /// Runs the schedule on its own thread: at each step's time, sets the mode and calls
    /// `kick` (which makes every vCPU exit and apply it). Stops early when `stopping` says so.
    pub fn spawn(
        self,
        switch: std::sync::Arc<ModeSwitch>,
        kick: impl Fn() + Send + 'static,
        stopping: impl Fn() -> bool + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        let confine = crate::seccomp::for_new_thread(crate::seccomp::ThreadKind::Schedule);
        std::thread::Builder::new()
            .name("vpmu-schedule".into())
            .spawn(move || {
                confine.apply();
                let start = Instant::now();
                let mut at = Duration::ZERO;
                // The list once, or over and over (`repeat`) until the VM stops.
                let steps = if self.repeat {
                    usize::MAX
                } else {
                    self.steps.len()
                };
                for i in 0..steps {
                    let (mode, secs) = self.steps[i % self.steps.len()];
                    if i > 0 {
                        while start.elapsed() < at {
                            if stopping() {
                                return;
                            }
                            std::thread::sleep(Duration::from_millis(20).min(at - start.elapsed()));
                        }
                    }
                    if switch.set(mode, "schedule") {
                        kick();
                    }
                    at += secs;
                }
            })
            .expect("spawning the schedule thread")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn switches_are_printed_at_most_once_a_second() {
        let mut log = SwitchLog {
            switches: Vec::new(),
            last_printed: None,
            not_printed: 0,
        };
        let ms = Duration::from_millis;
        assert_eq!(log.should_print(ms(10)), Some(0));
        // A guest switching every millisecond: one line a second, saying how many were skipped.
        let printed: Vec<(u64, u64)> = (11..3011)
            .filter_map(|t| log.should_print(ms(t)).map(|n| (t, n)))
            .collect();
        assert_eq!(printed, vec![(1010, 999), (2010, 999), (3010, 999)]);
        // A switch after a quiet second is printed at once.
        assert_eq!(log.should_print(ms(5000)), Some(0));
        assert_eq!(log.should_print(ms(5100)), None);
        assert_eq!(log.should_print(ms(6500)), Some(1));
    }

    #[test]
    fn schedule_parses_and_rejects() {
        let s: Schedule = "cpu-switch:1.5, domain-switch:30".parse().unwrap();
        assert_eq!(
            s.steps,
            vec![
                (AccountingMode::CpuSwitch, Duration::from_millis(1500)),
                (AccountingMode::DomainSwitch, Duration::from_secs(30))
            ]
        );
        assert!(!s.repeat);
        let r: Schedule = "cpu-switch:4,domain-switch:4,repeat".parse().unwrap();
        assert!(r.repeat);
        assert_eq!(r.steps.len(), 2);
        for bad in [
            "repeat",
            "repeat,cpu-switch:1",
            "cpu-switch:1,repeat,domain-switch:1",
        ] {
            assert_eq!(bad.parse::<Schedule>(), Err(ScheduleError::Repeat), "{bad}");
        }
        for bad in [
            "cpu:3",
            "cpu-switch",
            "cpu-switch:-1",
            "cpu-switch:x",
            "off:3",
        ] {
            assert!(
                matches!(bad.parse::<Schedule>(), Err(ScheduleError::Entry(_))),
                "{bad}"
            );
        }
        assert_eq!(",".parse::<Schedule>(), Err(ScheduleError::Empty));
    }

    #[test]
    fn switch_logs_changes_only() {
        let m = ModeSwitch::new(AccountingMode::CpuSwitch);
        assert!(!m.set(AccountingMode::CpuSwitch, "test"));
        assert!(m.set(AccountingMode::DomainSwitch, "test"));
        assert_eq!(m.get(), AccountingMode::DomainSwitch);
        let h = m.history();
        assert_eq!(h.len(), 2);
        assert_eq!(h[1].by, "test");
    }

    #[test]
    fn a_guest_switching_at_every_exit_cannot_grow_the_log_without_bound() {
        let m = ModeSwitch::new(AccountingMode::CpuSwitch);
        let extra = 1001;
        for i in 0..MAX_LOGGED_SWITCHES + extra {
            let mode = if i % 2 == 0 {
                AccountingMode::DomainSwitch
            } else {
                AccountingMode::CpuSwitch
            };
            assert!(m.set(mode, "guest"), "switch {i}");
            assert_eq!(m.get(), mode);
        }
        assert_eq!(m.history().len(), MAX_LOGGED_SWITCHES);
        // The start entry took one place in the log.
        assert_eq!(m.unlogged(), extra as u64 + 1);
    }

    #[test]
    fn schedule_thread_switches_in_order() {
        let m = Arc::new(ModeSwitch::new(AccountingMode::DomainSwitch));
        let kicks = Arc::new(AtomicU8::new(0));
        let k = kicks.clone();
        let s: Schedule = "cpu-switch:0.05,domain-switch:0.05".parse().unwrap();
        s.spawn(
            m.clone(),
            move || {
                k.fetch_add(1, Ordering::SeqCst);
            },
            || false,
        )
        .join()
        .unwrap();
        let modes: Vec<_> = m.history().iter().map(|s| s.mode).collect();
        assert_eq!(
            modes,
            vec![
                AccountingMode::DomainSwitch,
                AccountingMode::CpuSwitch,
                AccountingMode::DomainSwitch
            ]
        );
        assert_eq!(kicks.load(Ordering::SeqCst), 2);
        assert!(m.history()[2].at >= Duration::from_millis(50));
    }

    #[test]
    fn time_in_each_mode_adds_up_to_the_run() {
        let sw = |at_ms: u64, mode| Switch {
            at: Duration::from_millis(at_ms),
            tsc: 0,
            mode,
            by: "t",
        };
        let h = [
            sw(0, AccountingMode::CpuSwitch),
            sw(400, AccountingMode::DomainSwitch),
            sw(1000, AccountingMode::CpuSwitch),
        ];
        let t = time_in_modes(&h, Duration::from_millis(1500));
        assert_eq!(t[0], Duration::from_millis(900));
        assert_eq!(t[1], Duration::from_millis(600));
        // A switch logged after the run's measured end counts nothing, never negative time.
        let t = time_in_modes(&h, Duration::from_millis(900));
        assert_eq!(t[0], Duration::from_millis(400));
        assert_eq!(t[1], Duration::from_millis(600));
    }

    #[test]
    fn a_repeating_schedule_cycles_until_stopped() {
        let m = Arc::new(ModeSwitch::new(AccountingMode::DomainSwitch));
        let s: Schedule = "cpu-switch:0.01,domain-switch:0.01,repeat".parse().unwrap();
        let seen = m.clone();
        // Stop once the list has gone round three times (6 switches after the start entry).
        s.spawn(m.clone(), || {}, move || seen.history().len() >= 7)
            .join()
            .unwrap();
        let modes: Vec<_> = m.history().iter().skip(1).map(|s| s.mode).collect();
        assert_eq!(modes.len(), 6, "{modes:?}");
        for pair in modes.chunks(2) {
            assert_eq!(
                pair,
                [AccountingMode::CpuSwitch, AccountingMode::DomainSwitch]
            );
        }
    }
}
