//! Each vCPU's last few VM exits, for the one-line diagnostic printed when a run ends badly
//! (`report.rs`), and the check that ends a run whose emulation fix-ups make no progress.
//!
//! The exit path is hot: [`LastExits::push_event`] is a few stores into a fixed ring of the
//! exit's classification (`crate::exit::kind`, done once per exit by the vCPU loop). RIPs are kept only where the exit path already
//! read them (emulation failures); the vCPU's final RIP is read once, when its thread ends.

use analysis::exit_reason::{ExitEvent, Reason};

/// Exits kept per vCPU.
pub(crate) const KEPT: usize = 8;

/// This many emulation failures in a row at one RIP, with no other exit in between (kicks
/// aside), and each completed by a fix-up, mean the fix-up does not make the guest move on:
/// the run ends with exit code 6 instead of spinning. (Linux's int3 and ud2 sites never come
/// back to the same RIP without other exits; at ~100 us per fix-up here this is about a second.)
pub const NO_PROGRESS_LIMIT: u32 = 10_000;

/// One remembered exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastExit {
    pub event: ExitEvent,
    /// Guest RIP, where the exit path read it anyway (emulation failures).
    pub rip: Option<u64>,
}

/// A fixed ring of the last [`KEPT`] exits, plus the current run of emulation failures at
/// one RIP.
#[derive(Debug, Clone)]
pub struct LastExits {
    ring: [LastExit; KEPT],
    next: usize,
    total: u64,
    stuck_rip: u64,
    stuck_count: u32,
}

impl Default for LastExits {
    fn default() -> Self {
        LastExits {
            ring: [LastExit {
                event: ExitEvent::new(Reason::Other),
                rip: None,
            }; KEPT],
            next: 0,
            total: 0,
            stuck_rip: 0,
            stuck_count: 0,
        }
    }
}

impl LastExits {
    /// Records one exit, as the vCPU loop classified it (`exit::kind::classify`, once per exit).
    #[inline]
    pub fn push_event(&mut self, event: ExitEvent) {
        self.ring[self.next] = LastExit { event, rip: None };
        self.next = (self.next + 1) % KEPT;
        self.total += 1;
        if !matches!(event.reason, Reason::InternalError | Reason::Interrupted) {
            self.stuck_count = 0;
        }
    }

    /// The RIP of the last exit pushed (an emulation failure: the fix-up code read it).
    pub(crate) fn set_last_rip(&mut self, rip: u64) {
        if self.total > 0 {
            self.ring[(self.next + KEPT - 1) % KEPT].rip = Some(rip);
        }
    }

    /// An emulation failure at `rip` (already pushed): how many in a row at this RIP, with no
    /// other exit (kicks aside) in between.
    pub(crate) fn emulation_failure_at(&mut self, rip: u64) -> u32 {
        self.set_last_rip(rip);
        if self.stuck_count > 0 && self.stuck_rip == rip {
            self.stuck_count = self.stuck_count.saturating_add(1);
        } else {
            self.stuck_rip = rip;
            self.stuck_count = 1;
        }
        self.stuck_count
    }

    /// Exits seen in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The kept exits, oldest first.
    pub fn last(&self) -> Vec<LastExit> {
        let n = (self.total.min(KEPT as u64)) as usize;
        (0..n)
            .map(|i| self.ring[(self.next + KEPT - n + i) % KEPT])
            .collect()
    }
}

/// How one vCPU stood when its thread ended: for the diagnostic line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VcpuEndState {
    pub vcpu: u32,
    /// Guest RIP when the thread stopped (None: the registers could not be read).
    pub rip: Option<u64>,
    /// Guest privilege level (CS.RPL in protected mode, 0 in real mode).
    pub cpl: Option<u8>,
    /// The thread's last exits, oldest first.
    pub last: Vec<LastExit>,
    pub exits: u64,
    /// This vCPU's thread ended the run (its exit or failure is the VM's end).
    pub ended_vm: bool,
    /// The thread panicked (a VMM bug): the message.
    pub panicked: Option<String>,
}

impl VcpuEndState {
    /// `vCPU 0 at RIP 0x100034 (CPL 0), 1042 exits, last: pio 0x3f8 out 1 x5, shutdown`:
    /// the exits oldest first, repeats folded.
    pub fn line(&self) -> String {
        let mut s = format!("vCPU {}", self.vcpu);
        match (self.rip, self.cpl) {
            (Some(rip), Some(cpl)) => s.push_str(&format!(" at RIP {rip:#x} (CPL {cpl})")),
            (Some(rip), None) => s.push_str(&format!(" at RIP {rip:#x}")),
            _ => s.push_str(" at RIP unknown"),
        }
        if self.ended_vm {
            s.push_str(", ended the run");
        }
        if let Some(p) = &self.panicked {
            s.push_str(&format!(", THREAD PANICKED: {p}"));
        }
        s.push_str(&format!(", {} exits", self.exits));
        if self.last.is_empty() {
            return s;
        }
        let mut parts: Vec<(String, u32)> = Vec::new();
        for e in &self.last {
            let mut d = e.event.describe();
            if let Some(rip) = e.rip {
                d.push_str(&format!(" @{rip:#x}"));
            }
            match parts.last_mut() {
                Some((p, n)) if *p == d => *n += 1,
                _ => parts.push((d, 1)),
            }
        }
        let list: Vec<String> = parts
            .into_iter()
            .map(|(d, n)| if n > 1 { format!("{d} x{n}") } else { d })
            .collect();
        s.push_str(&format!(", last: {}", list.join(", ")));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pio(port: u32) -> ExitEvent {
        ExitEvent {
            detail: port,
            flags: 1 | (1 << 1),
            ..ExitEvent::new(Reason::IoOut)
        }
    }

    #[test]
    fn ring_keeps_the_last_exits_oldest_first() {
        let mut l = LastExits::default();
        assert!(l.last().is_empty());
        for p in 0..20u32 {
            l.push_event(pio(p));
        }
        let last = l.last();
        assert_eq!(last.len(), KEPT);
        assert_eq!(last[0].event.detail, 20 - KEPT as u32);
        assert_eq!(last[KEPT - 1].event.detail, 19);
        assert_eq!(l.total(), 20);
    }

    #[test]
    fn emulation_failures_count_in_a_row_at_one_rip_only() {
        let mut l = LastExits::default();
        let fail = ExitEvent::new(Reason::InternalError);
        for i in 1..=5 {
            l.push_event(fail);
            assert_eq!(l.emulation_failure_at(0x1000), i);
            // Kicks do not break the run.
            l.push_event(ExitEvent::new(Reason::Interrupted));
        }
        l.push_event(fail);
        assert_eq!(l.emulation_failure_at(0x2000), 1, "another RIP starts over");
        l.push_event(pio(0x80));
        l.push_event(fail);
        assert_eq!(
            l.emulation_failure_at(0x2000),
            1,
            "another exit starts over"
        );
        assert_eq!(l.last().last().unwrap().rip, Some(0x2000));
    }

    #[test]
    fn line_names_vcpu_rip_and_folded_exits() {
        let mut l = LastExits::default();
        for _ in 0..3 {
            l.push_event(pio(0x3f8));
        }
        l.push_event(ExitEvent::new(Reason::Shutdown));
        let st = VcpuEndState {
            vcpu: 1,
            rip: Some(0x100034),
            cpl: Some(0),
            last: l.last(),
            exits: l.total(),
            ended_vm: true,
            panicked: None,
        };
        assert_eq!(
            st.line(),
            "vCPU 1 at RIP 0x100034 (CPL 0), ended the run, 4 exits, last: pio 0x3f8 out 1 x3, shutdown"
        );
    }
}
