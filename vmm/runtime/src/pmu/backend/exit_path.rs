//! How much of each KVM_RUN interval the soft cpu-switch gate leaves out as KVM's exit path:
//! the host probe's measure (`vm::host_probe`: a throwaway VM's single-instruction exits),
//! raised to what this VM's own short intervals show. The probe VM has no devices, no perf
//! events and no VMM work between its exits; where the real VM's exits cost more (on the SVM
//! host under QEMU's emulator, a VM exit after 300 µs of device emulation cost ~75 µs against
//! the probe's ~40 µs), the probe's figure left the rest charged to the guest.
//!
//! The estimate: intervals shorter than [`SHORT_FACTOR`] x the probe's cost are taken to be
//! (mostly) exit path, a guest running a few instructions between two exits, as an I/O loop or
//! a driver's register sequence does; the [`PERCENTILE`]th percentile of the last [`WINDOW`]
//! of them is the exit path, never below the probe's figure and so never above SHORT_FACTOR x
//! it; kept apart for intervals entered after little and after much VMM work ([`ExitPath`]).
//! Intervals a signal ended (kicks, overflow notifications) are not looked at: a counter's
//! notification re-armed for the rest of its period would otherwise teach the gate that its
//! own intervals are exit path, and the rest would never count down. A guest that never exits
//! back to back keeps the probe's figure.

/// Intervals up to this many times the probe's cost count as exit path.
pub(super) const SHORT_FACTOR: u64 = 4;
/// How many short intervals the estimate looks at.
pub(super) const WINDOW: usize = 64;
/// The percentile of them taken.
pub(super) const PERCENTILE: usize = 50;
/// The estimate is recomputed every this many short intervals (a sort of WINDOW values).
const EVERY: usize = 16;

/// One estimate: the last [`WINDOW`] short intervals and their [`PERCENTILE`]th percentile.
#[derive(Debug, Clone)]
struct Window {
    estimate_ns: u64,
    ring: Vec<u64>,
    len: usize,
    next: usize,
    since_estimate: usize,
}

impl Window {
    fn new(probe_ns: u64) -> Window {
        Window {
            estimate_ns: probe_ns,
            ring: vec![0; WINDOW],
            len: 0,
            next: 0,
            since_estimate: 0,
        }
    }

    fn note(&mut self, interval_ns: u64, probe_ns: u64) {
        self.ring[self.next] = interval_ns;
        self.next = (self.next + 1) % WINDOW;
        self.len = (self.len + 1).min(WINDOW);
        self.since_estimate += 1;
        if self.since_estimate >= EVERY {
            self.since_estimate = 0;
            let mut v = self.ring[..self.len].to_vec();
            v.sort_unstable();
            self.estimate_ns = v[(v.len() - 1) * PERCENTILE / 100].max(probe_ns);
        }
    }
}

/// The exit path's estimates, apart for intervals entered after little and after much VMM work
/// outside KVM_RUN (at least [`SHORT_FACTOR`] x the probe's cost): re-entering after the VMM
/// worked a while costs more (caches, TLBs; under QEMU's emulator, its translations), ~75 µs
/// against ~45 µs for back-to-back MSR exits on the SVM host. One estimate for both took the
/// cheap exits' figure for the dear ones and charged the guest the rest.
#[derive(Debug, Clone)]
pub(super) struct ExitPath {
    probe_ns: u64,
    after_little: Window,
    after_much: Window,
}

impl ExitPath {
    /// Starting from the probe's measure (0: nothing is left out, ever).
    pub(super) fn new(probe_ns: u64) -> ExitPath {
        ExitPath {
            probe_ns,
            after_little: Window::new(probe_ns),
            after_much: Window::new(probe_ns),
        }
    }

    fn window(&mut self, outside_ns: u64) -> &mut Window {
        if outside_ns >= SHORT_FACTOR * self.probe_ns {
            &mut self.after_much
        } else {
            &mut self.after_little
        }
    }

    /// What to leave out of an interval entered after `outside_ns` of VMM work.
    pub(super) fn ns(&mut self, outside_ns: u64) -> u64 {
        self.window(outside_ns).estimate_ns
    }

    /// The probe's figure, as given.
    #[cfg(test)]
    pub(super) fn probe_ns(&self) -> u64 {
        self.probe_ns
    }

    /// Notes one closed interval's whole length (entered after `outside_ns` of VMM work).
    pub(super) fn note(&mut self, outside_ns: u64, interval_ns: u64) {
        let probe = self.probe_ns;
        if probe == 0 || interval_ns >= SHORT_FACTOR * probe {
            return;
        }
        self.window(outside_ns).note(interval_ns, probe);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_intervals_raise_the_estimate_long_ones_do_not() {
        let mut e = ExitPath::new(40);
        for _ in 0..1000 {
            e.note(0, 5_000); // compute: not exit path
        }
        assert_eq!(e.ns(0), 40);
        for i in 0..WINDOW as u64 {
            e.note(0, 70 + i % 20); // back-to-back exits at 70-89
        }
        assert!((75..=85).contains(&e.ns(0)), "{}", e.ns(0));
        assert_eq!(e.ns(1_000), 40, "after much VMM work: its own estimate");
        for _ in 0..WINDOW {
            e.note(1_000, 120);
        }
        assert_eq!(e.ns(1_000), 120);
        assert!((75..=85).contains(&e.ns(0)));
        // Never below the probe's figure.
        let mut e = ExitPath::new(40);
        for _ in 0..WINDOW {
            e.note(0, 10);
        }
        assert_eq!(e.ns(0), 40);
        // No probe: nothing left out.
        let mut e = ExitPath::new(0);
        e.note(0, 10);
        assert_eq!(e.ns(0), 0);
        assert_eq!(e.probe_ns(), 0);
    }

    #[test]
    fn the_estimate_is_bounded_by_what_counts_as_short() {
        let mut e = ExitPath::new(40);
        for _ in 0..WINDOW {
            e.note(0, SHORT_FACTOR * 40 - 1);
        }
        assert!(e.ns(0) < SHORT_FACTOR * 40);
    }
}
