//! The VMM's end of the guest's wire: sends ICMP echo requests to the guest at a fixed rate,
//! answers the guest's ARP requests for the VMM's address, and checks every echo reply
//! (addresses, identifier, a sequence number it is waiting for, the payload it sent, checksums).
//! Pure logic: the virtio-net device moves the frames, the vCPU loop supplies the clock.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::packet::{self, Frame, Mac};

/// Addresses on the guest's link (docs/virtio-net.md). The guest's come from the VMM's `ip=`
/// and the device's MAC; the VMM's (the "host" end) answer ARP and send the requests.
pub const GUEST_MAC: Mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
pub const HOST_MAC: Mac = [0x52, 0x54, 0x00, 0x00, 0x02, 0x02];
pub const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
pub const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// ICMP identifier of the VMM's echo requests ("VP").
pub const ECHO_ID: u16 = 0x5650;
/// Echo payload size (as `ping`'s default).
pub(crate) const PAYLOAD_LEN: usize = 56;
/// When the loop falls further behind than this many requests, the backlog is skipped (and
/// counted) instead of sent in a burst.
const MAX_BURST: u64 = 4;
/// Requests older than this are forgotten (counted as lost if never answered).
const MAX_IN_FLIGHT: usize = 4096;

/// What the wire saw; printed when the VM ends.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NetStats {
    /// Echo requests put into the guest's receive queue.
    pub requests_pushed: u64,
    /// Echo requests due while the guest had no receive buffer (or its driver was not up yet
    /// after the generator started): not sent.
    pub requests_no_buffer: u64,
    /// Requests skipped because the vCPU loop fell more than a few periods behind.
    pub requests_skipped_late: u64,
    /// Requests due while held back (the pause flag: `compare`'s control phase, or the guest's
    /// packet gate closed): not sent, and not lost.
    pub requests_held: u64,
    /// Echo replies that matched a request in flight, byte for byte.
    pub replies_ok: u64,
    /// Frames from the guest that claimed to be an echo reply (or were malformed) but failed a check.
    pub replies_bad: u64,
    /// The guest's ARP requests for the VMM's address, answered.
    pub arp_answered: u64,
    /// Any other frame the guest sent.
    pub other_frames: u64,
    /// Frames the guest transmitted, all kinds.
    pub tx_frames: u64,
    /// Sum and maximum of request-to-reply times (replies_ok of them).
    pub rtt_total: Duration,
    pub rtt_max: Duration,
    /// From the generator's start to the first and to the last good reply.
    pub first_reply_after: Option<Duration>,
    pub last_reply_after: Option<Duration>,
    /// Requests pushed once the guest had answered one (its IP is configured by then): the
    /// base for the loss rate, which requests sent before the guest had an address would skew.
    pub pushed_after_first_reply: u64,
    /// Replies to those requests.
    pub replies_after_first_reply: u64,
    /// Requests still waiting for their reply when the statistics were taken (all, and of
    /// those pushed after the first reply).
    pub unanswered: u64,
    pub unanswered_after_first_reply: u64,
    /// Why the first bad frame was bad.
    pub first_bad: Option<String>,
}

impl NetStats {
    pub fn rtt_mean(&self) -> Option<Duration> {
        (self.replies_ok > 0).then(|| self.rtt_total / self.replies_ok as u32)
    }

    /// Of the requests pushed after the first reply, the share that got no reply (those
    /// still in flight at the end are not counted as lost).
    pub fn loss_after_first_reply(&self) -> Option<f64> {
        let base = self.pushed_after_first_reply;
        let lost =
            base.saturating_sub(self.replies_after_first_reply + self.unanswered_after_first_reply);
        (base > 0).then(|| lost as f64 / base as f64)
    }
}

pub struct Pinger {
    /// Requests per second (> 0).
    pps: u32,
    started: Option<Instant>,
    /// Requests accounted for so far (pushed, no buffer or skipped): the next sequence number.
    generated: u64,
    /// Sequence number -> when it was sent, and whether after the first reply.
    in_flight: HashMap<u16, (Instant, bool)>,
    pub stats: NetStats,
    /// While true no request falls due: compare's control phase, or the guest's packet gate
    /// ([`crate::devices::packet_gate`]) closed.
    paused: Option<Arc<AtomicBool>>,
    /// Fired at the first good echo reply (the guest's network is up).
    first_reply: Option<Arc<crate::control::Latch>>,
}

/// The payload of request `seq`: a pattern that differs from one request to the next.
fn payload(seq: u16) -> [u8; PAYLOAD_LEN] {
    let mut p = [0u8; PAYLOAD_LEN];
    for (i, b) in p.iter_mut().enumerate() {
        *b = (seq as u8).wrapping_add(i as u8);
    }
    p
}

impl Pinger {
    pub fn new(pps: u32) -> Self {
        assert!(pps > 0, "a rate of 0 means no pinger");
        Pinger {
            pps,
            started: None,
            generated: 0,
            in_flight: HashMap::new(),
            stats: NetStats::default(),
            paused: None,
            first_reply: None,
        }
    }

    /// A controller's handles: pause the requests, hear of the first reply.
    pub(crate) fn with_handles(
        mut self,
        paused: Arc<AtomicBool>,
        first_reply: Arc<crate::control::Latch>,
    ) -> Self {
        self.paused = Some(paused);
        self.first_reply = Some(first_reply);
        self
    }

    pub fn started(&self) -> bool {
        self.started.is_some()
    }

    /// The statistics, with the requests still in flight counted.
    pub fn stats(&self) -> NetStats {
        NetStats {
            unanswered: self.in_flight.len() as u64,
            unanswered_after_first_reply: self.in_flight.values().filter(|(_, a)| *a).count()
                as u64,
            ..self.stats.clone()
        }
    }

    /// Starts the clock (the guest's driver is up); requests fall due from now on.
    pub fn start(&mut self, now: Instant) {
        if self.started.is_none() {
            self.started = Some(now);
        }
    }

    /// How many requests are due at `now` (at most a few: a longer backlog is skipped).
    pub fn due(&mut self, now: Instant) -> u64 {
        let Some(t0) = self.started else { return 0 };
        let expected = (now.duration_since(t0).as_secs_f64() * f64::from(self.pps)) as u64;
        if self
            .paused
            .as_ref()
            .is_some_and(|p| p.load(Ordering::Relaxed))
        {
            self.stats.requests_held += expected.saturating_sub(self.generated);
            self.generated = self.generated.max(expected);
            return 0;
        }
        let behind = expected.saturating_sub(self.generated);
        if behind > MAX_BURST {
            let skip = behind - MAX_BURST;
            self.stats.requests_skipped_late += skip;
            self.generated += skip;
            return MAX_BURST;
        }
        behind
    }

    /// The next request frame; the caller has a receive buffer for it.
    pub(crate) fn next_request(&mut self, now: Instant) -> Vec<u8> {
        let seq = self.generated as u16;
        self.generated += 1;
        self.stats.requests_pushed += 1;
        let after = self.stats.replies_ok > 0;
        if after {
            self.stats.pushed_after_first_reply += 1;
        }
        if self.in_flight.len() >= MAX_IN_FLIGHT {
            // Forget the oldest: it will never be matched (and counts as unanswered).
            if let Some(&oldest) = self
                .in_flight
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(s, _)| s)
            {
                self.in_flight.remove(&oldest);
            }
        }
        self.in_flight.insert(seq, (now, after));
        packet::echo(
            false,
            HOST_MAC,
            GUEST_MAC,
            HOST_IP,
            GUEST_IP,
            ECHO_ID,
            seq,
            &payload(seq),
        )
    }

    /// A request fell due but the guest had no receive buffer.
    pub(crate) fn no_buffer(&mut self) {
        self.generated += 1;
        self.stats.requests_no_buffer += 1;
    }

    fn bad(&mut self, why: String) {
        log::debug!("net: bad frame from the guest: {why}");
        self.stats.replies_bad += 1;
        if self.stats.first_bad.is_none() {
            self.stats.first_bad = Some(why);
        }
    }

    /// A frame the guest transmitted. Returns a frame to send back (an ARP reply), if any.
    pub fn from_guest(&mut self, frame: &[u8], now: Instant) -> Option<Vec<u8>> {
        self.stats.tx_frames += 1;
        match packet::parse(frame) {
            Err(e) => self.bad(e.to_string()),
            Ok(Frame::Arp {
                reply: false,
                sender_mac,
                sender_ip,
                target_ip,
                ..
            }) if target_ip == HOST_IP => {
                self.stats.arp_answered += 1;
                return Some(packet::arp(true, HOST_MAC, HOST_IP, sender_mac, sender_ip));
            }
            Ok(Frame::Echo {
                reply: true,
                src_mac,
                dst_mac,
                src,
                dst,
                id,
                seq,
                payload: p,
            }) => {
                let checks = [
                    (src == GUEST_IP && dst == HOST_IP, "IP addresses"),
                    (src_mac == GUEST_MAC && dst_mac == HOST_MAC, "MAC addresses"),
                    (id == ECHO_ID, "identifier"),
                    (p == payload(seq), "payload"),
                ];
                if let Some((_, what)) = checks.iter().find(|(ok, _)| !ok) {
                    self.bad(format!("echo reply seq {seq}: wrong {what}"));
                } else if let Some((sent, after)) = self.in_flight.remove(&seq) {
                    let rtt = now.duration_since(sent);
                    let s = &mut self.stats;
                    s.replies_ok += 1;
                    s.replies_after_first_reply += u64::from(after);
                    s.rtt_total += rtt;
                    s.rtt_max = s.rtt_max.max(rtt);
                    let since_start = self.started.map(|t0| now.duration_since(t0));
                    if s.first_reply_after.is_none() {
                        s.first_reply_after = since_start;
                        if let Some(l) = &self.first_reply {
                            l.fire();
                        }
                    }
                    s.last_reply_after = since_start;
                } else {
                    self.bad(format!(
                        "echo reply seq {seq}: no such request in flight (duplicate?)"
                    ));
                }
            }
            Ok(_) => self.stats.other_frames += 1,
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply_to(req: &[u8]) -> Vec<u8> {
        match packet::parse(req).unwrap() {
            Frame::Echo {
                reply: false,
                src_mac,
                dst_mac,
                src,
                dst,
                id,
                seq,
                payload,
            } => packet::echo(true, dst_mac, src_mac, dst, src, id, seq, payload),
            f => panic!("not a request: {f:?}"),
        }
    }

    #[test]
    fn requests_fall_due_at_the_rate_and_backlogs_are_skipped() {
        let t0 = Instant::now();
        let mut p = Pinger::new(50);
        assert_eq!(p.due(t0 + Duration::from_secs(1)), 0, "not started");
        p.start(t0);
        assert_eq!(p.due(t0 + Duration::from_millis(10)), 0);
        assert_eq!(p.due(t0 + Duration::from_millis(41)), 2);
        p.next_request(t0);
        p.no_buffer();
        assert_eq!(p.due(t0 + Duration::from_millis(59)), 0);
        assert_eq!(p.due(t0 + Duration::from_millis(61)), 1);
        p.next_request(t0);
        // One second late: 50 due, at most MAX_BURST sent, the rest skipped.
        assert_eq!(p.due(t0 + Duration::from_millis(1061)), MAX_BURST);
        assert_eq!(p.stats.requests_skipped_late, 53 - 3 - MAX_BURST);
        assert_eq!(p.stats.requests_pushed, 2);
        assert_eq!(p.stats.requests_no_buffer, 1);
    }

    #[test]
    fn paused_requests_are_held_not_sent_late_or_lost() {
        let t0 = Instant::now();
        let paused = Arc::new(AtomicBool::new(true));
        let mut p = Pinger::new(10).with_handles(paused.clone(), Default::default());
        p.start(t0);
        // The gate starts closed: 30 s of requests fall due, none is sent or skipped.
        assert_eq!(p.due(t0 + Duration::from_secs(30)), 0);
        assert_eq!(p.stats.requests_held, 300);
        // Opened: the rate starts from now, with no burst of the held ones.
        paused.store(false, Ordering::Relaxed);
        assert_eq!(p.due(t0 + Duration::from_millis(30_050)), 0);
        assert_eq!(p.due(t0 + Duration::from_millis(30_150)), 1);
        p.next_request(t0);
        // Closed again, then a second of held requests.
        paused.store(true, Ordering::Relaxed);
        assert_eq!(p.due(t0 + Duration::from_millis(31_150)), 0);
        assert_eq!(p.stats.requests_held, 300 + 10);
        assert_eq!(p.stats.requests_skipped_late, 0);
        assert_eq!(p.stats.requests_pushed, 1);
    }

    #[test]
    fn good_replies_count_and_wrong_ones_do_not() {
        let t0 = Instant::now();
        let mut p = Pinger::new(10);
        p.start(t0);
        let r0 = p.next_request(t0);
        let r1 = p.next_request(t0);
        let t1 = t0 + Duration::from_millis(30);
        assert_eq!(p.from_guest(&reply_to(&r0), t1), None);
        assert_eq!(p.stats.replies_ok, 1);
        assert_eq!(p.stats.rtt_max, Duration::from_millis(30));
        assert_eq!(p.stats.first_reply_after, Some(Duration::from_millis(30)));
        // The same reply again: nothing in flight for it.
        p.from_guest(&reply_to(&r0), t1);
        // A reply to r1 with correct checksums but not the payload that was sent.
        let wrong = packet::echo(
            true,
            GUEST_MAC,
            HOST_MAC,
            GUEST_IP,
            HOST_IP,
            ECHO_ID,
            1,
            &[0u8; PAYLOAD_LEN],
        );
        p.from_guest(&wrong, t1);
        // A reply with a broken checksum.
        let mut broken = reply_to(&r1);
        broken[40] ^= 0xff;
        p.from_guest(&broken, t1);
        assert_eq!(p.stats.replies_ok, 1);
        assert_eq!(p.stats.replies_bad, 3);
        assert!(p.stats.first_bad.as_deref().unwrap().contains("duplicate"));
        // The real reply to r1 still counts.
        p.from_guest(&reply_to(&r1), t1);
        assert_eq!(p.stats.replies_ok, 2);
        assert_eq!(p.stats.tx_frames, 5);
    }

    #[test]
    fn loss_counts_only_requests_sent_after_the_first_reply() {
        let t0 = Instant::now();
        let mut p = Pinger::new(10);
        p.start(t0);
        // Before the guest has its address: two requests, never answered.
        p.next_request(t0);
        p.next_request(t0);
        let r2 = p.next_request(t0);
        p.from_guest(&reply_to(&r2), t0);
        assert_eq!(
            p.stats().loss_after_first_reply(),
            None,
            "nothing sent after it yet"
        );
        // After the first reply: 4 requests, 2 answered, 2 still in flight.
        let reqs: Vec<_> = (0..4).map(|_| p.next_request(t0)).collect();
        p.from_guest(&reply_to(&reqs[0]), t0);
        p.from_guest(&reply_to(&reqs[2]), t0);
        let s = p.stats();
        assert_eq!(s.pushed_after_first_reply, 4);
        assert_eq!(s.replies_after_first_reply, 2);
        assert_eq!(s.unanswered, 4, "2 from before, 2 from after");
        assert_eq!(s.unanswered_after_first_reply, 2);
        assert_eq!(
            s.loss_after_first_reply(),
            Some(0.0),
            "in flight is not lost"
        );
        let s = NetStats {
            unanswered_after_first_reply: 0,
            ..s
        };
        assert_eq!(s.loss_after_first_reply(), Some(0.5), "had they been lost");
    }

    #[test]
    fn arp_for_the_host_is_answered_and_other_arp_is_not() {
        let mut p = Pinger::new(1);
        let now = Instant::now();
        let req = packet::arp(false, GUEST_MAC, GUEST_IP, [0; 6], HOST_IP);
        let ans = p.from_guest(&req, now).expect("an ARP reply");
        assert_eq!(
            packet::parse(&ans).unwrap(),
            Frame::Arp {
                reply: true,
                sender_mac: HOST_MAC,
                sender_ip: HOST_IP,
                target_mac: GUEST_MAC,
                target_ip: GUEST_IP
            }
        );
        let other = packet::arp(
            false,
            GUEST_MAC,
            GUEST_IP,
            [0; 6],
            Ipv4Addr::new(10, 0, 2, 3),
        );
        assert_eq!(p.from_guest(&other, now), None);
        assert_eq!((p.stats.arp_answered, p.stats.other_frames), (1, 1));
    }
}
