//! The packet gate port: lets the guest's experiment say when the VMM's pinger sends it echo
//! requests. One byte at [`PACKET_GATE_PORT`]: write 1 = send, 0 = hold (other values are
//! ignored, with a log line); read = 1 while sending, 0 while holding. Present only when the
//! network's pinger starts gated (`NetConfig::guest_gate`: `compare --profiler`), where the
//! guest profiles itself and only it knows when its system-wide window runs; the gate starts
//! closed, so the emulated boot, the profilers' start-up and the CPU-bound control run without
//! packets (docs/virtio-net.md, "Holding the packets back").
//!
//! The gate is the pinger's pause flag, the one `compare`'s host-side controller sets between its
//! phases: a held request is not sent and not counted as lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use vpmu::guest_log::GuestLog;
use vpmu::guest_warn;

use super::{DeviceEvent, PioDevice};

pub const PACKET_GATE_PORT: u16 = 0x512;

pub struct PacketGate {
    /// The pinger's pause flag: true = hold.
    paused: Arc<AtomicBool>,
}

impl PacketGate {
    pub fn new(paused: Arc<AtomicBool>) -> Self {
        PacketGate { paused }
    }
}

impl PioDevice for PacketGate {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0);
        if let Some(b) = data.first_mut() {
            *b = u8::from(!self.paused.load(Ordering::Relaxed));
        }
    }

    fn write(&mut self, _offset: u16, data: &[u8]) -> Option<DeviceEvent> {
        let hold = match data.first() {
            Some(0) => true,
            Some(1) => false,
            other => {
                static IGNORED: GuestLog = GuestLog::new("packet-gate-ignored-write");
                guest_warn!(
                    IGNORED,
                    "packet gate port: ignored write {other:?} (1 = send, 0 = hold)"
                );
                return None;
            }
        };
        if self.paused.swap(hold, Ordering::Relaxed) != hold {
            log::info!(
                "packet gate {} by the guest: echo requests {}",
                if hold { "closed" } else { "opened" },
                if hold { "held" } else { "sent" }
            );
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_opens_and_closes_the_gate_and_reads_it_back() {
        let paused = Arc::new(AtomicBool::new(true));
        let mut gate = PacketGate::new(paused.clone());
        let mut b = [0xaau8; 2];
        gate.read(0, &mut b);
        assert_eq!(b, [0, 0], "starts closed; wider reads are zero-filled");
        gate.write(0, &[1]);
        assert!(!paused.load(Ordering::Relaxed));
        gate.read(0, &mut b[..1]);
        assert_eq!(b[0], 1);
        // Anything but 0 and 1 (and an empty write) leaves the gate as it is.
        for w in [&[2u8][..], &[0xff], &[]] {
            gate.write(0, w);
            assert!(!paused.load(Ordering::Relaxed), "{w:?}");
        }
        gate.write(0, &[0, 1]);
        assert!(paused.load(Ordering::Relaxed), "the first byte decides");
    }
}
