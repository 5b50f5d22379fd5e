//! virtio-net: a network card with one receive and one transmit queue, no offloads, whose
//! other end is the VMM's [`Pinger`]: on each tick it puts the echo requests that fell due into
//! the receive queue; each frame the guest transmits goes to the pinger, and what it answers
//! (ARP replies) goes back into the receive queue.

use std::collections::VecDeque;
use std::time::Instant;

use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{virtio_net_hdr_v1, VIRTIO_NET_F_MAC};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use vpmu::guest_log::GuestLog;
use vpmu::guest_warn;

use super::queue::{self, pop_checked, CheckedChain, QueueFault};
use super::{VirtioDevice, VIRTIO_F_VERSION_1};
use crate::net::packet::Mac;
use crate::net::pinger::{NetStats, Pinger};

pub const RX_QUEUE: u16 = 0;
pub const TX_QUEUE: u16 = 1;
/// Largest queue the driver may ask for.
pub const QUEUE_SIZE: u16 = 256;
/// The header in front of every frame in both directions (`virtio_net_hdr_v1`, 12 bytes: a
/// modern device always has `num_buffers`).
pub const NET_HDR_LEN: usize = std::mem::size_of::<virtio_net_hdr_v1>();
/// Frames waiting for a receive buffer beyond this many are dropped.
const MAX_PENDING: usize = 64;
/// Largest frame accepted from the guest (no TSO/GSO was offered).
const MAX_TX_FRAME: usize = 1514;

/// Why a descriptor chain could not be used. Counted (and the first one logged), never fatal:
/// the chain is returned to the driver unused and the device carries on.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QueueError {
    #[error("receive buffer of {have} bytes for a {need}-byte frame")]
    BufferTooSmall { have: u64, need: usize },
    #[error("{0}-byte transmit chain (a frame with its header is {min}..={max} bytes)", min = NET_HDR_LEN + 1, max = NET_HDR_LEN + MAX_TX_FRAME)]
    BadFrameLength(u64),
    #[error("guest memory: {0}")]
    Memory(#[from] vm_memory::GuestMemoryError),
    #[error("notify of queue {0}, which does not exist")]
    NoSuchQueue(u16),
}

fn queue_name(index: u16) -> &'static str {
    if index == RX_QUEUE {
        "receive queue"
    } else {
        "transmit queue"
    }
}

/// What the device itself counted (the pinger counts the traffic).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NetDeviceCounts {
    /// Frames put into the guest's receive queue.
    pub rx_frames: u64,
    /// Frames taken from the guest's transmit queue.
    pub tx_frames: u64,
    /// Frames for the guest dropped because it had no receive buffer for too long.
    pub rx_dropped: u64,
    /// Descriptor chains that could not be used (malformed, too small, bad addresses).
    pub queue_errors: u64,
    /// Times the driver notified the receive / transmit queue.
    pub rx_notifies: u64,
    pub tx_notifies: u64,
}

pub struct VirtioNet {
    mac: Mac,
    queues: [Queue; 2],
    pinger: Option<Pinger>,
    pending: VecDeque<Vec<u8>>,
    pub counts: NetDeviceCounts,
    /// The driver broke a queue: nothing is used until it resets the device.
    fault: Option<QueueFault>,
}

impl VirtioNet {
    /// A card with address `mac`; `pinger` (None: the link is silent) sends and checks traffic.
    pub fn new(mac: Mac, pinger: Option<Pinger>) -> Self {
        let q = || Queue::new(QUEUE_SIZE).expect("QUEUE_SIZE is a valid queue size");
        VirtioNet {
            mac,
            queues: [q(), q()],
            pinger,
            pending: VecDeque::new(),
            counts: NetDeviceCounts::default(),
            fault: None,
        }
    }

    pub(crate) fn pinger_stats(&self) -> Option<NetStats> {
        self.pinger.as_ref().map(Pinger::stats)
    }

    fn queue_error(&mut self, e: QueueError) {
        if self.counts.queue_errors == 0 {
            log::warn!("virtio-net: {e} (further queue errors are only counted)");
        }
        self.counts.queue_errors += 1;
    }

    /// The queue fault that stopped the device, if any (cleared by a reset).
    pub fn fault(&self) -> Option<&QueueFault> {
        self.fault.as_ref()
    }

    fn set_fault(&mut self, f: QueueFault) {
        static FAULT: GuestLog = GuestLog::new("virtio-net-queue-fault");
        guest_warn!(FAULT, "virtio-net: {f}: the device needs a reset");
        self.fault = Some(f);
    }

    /// The next available chain of queue `index`; None when there is none or the queue is
    /// broken (then the device is marked as needing a reset).
    fn pop(&mut self, index: u16, mem: &GuestMemoryMmap) -> Option<CheckedChain> {
        if self.fault.is_some() {
            return None;
        }
        match pop_checked(&mut self.queues[index as usize], queue_name(index), mem) {
            Ok(c) => c,
            Err(f) => {
                self.set_fault(f);
                None
            }
        }
    }

    /// Returns a chain to the driver; a used ring it cannot write breaks the queue.
    fn add_used(&mut self, index: u16, mem: &GuestMemoryMmap, head: u16, len: u32) {
        if let Err(source) = self.queues[index as usize].add_used(mem, head, len) {
            self.set_fault(QueueFault::UsedRing {
                queue: queue_name(index),
                source,
            });
        }
    }

    /// Puts one frame into the next receive buffer, made by `make` only once a buffer is there.
    /// Returns false when the guest has no receive buffer available.
    fn receive(&mut self, mem: &GuestMemoryMmap, make: impl FnOnce(&mut Self) -> Vec<u8>) -> bool {
        let Some(chain) = self.pop(RX_QUEUE, mem) else {
            return false;
        };
        let head = chain.head;
        let frame = make(self);
        let mut data = vec![0u8; NET_HDR_LEN];
        // num_buffers (the last field of the header): this frame fills one buffer.
        data[NET_HDR_LEN - 2..].copy_from_slice(&1u16.to_le_bytes());
        data.extend_from_slice(&frame);
        let buffer = chain.writable();
        let written = if buffer.len() < data.len() as u64 {
            Err(QueueError::BufferTooSmall {
                have: buffer.len(),
                need: data.len(),
            })
        } else {
            buffer
                .write(mem, &data)
                .map(|()| data.len())
                .map_err(QueueError::from)
        };
        let len = match written {
            Ok(n) => {
                self.counts.rx_frames += 1;
                n as u32
            }
            Err(e) => {
                self.queue_error(e);
                0
            }
        };
        self.add_used(RX_QUEUE, mem, head, len);
        true
    }

    /// Frames waiting for receive buffers, oldest first, while buffers last.
    fn flush_pending(&mut self, mem: &GuestMemoryMmap) -> bool {
        let mut used = false;
        while let Some(f) = self.pending.pop_front() {
            let mut frame = Some(f);
            if self.receive(mem, |_| frame.take().unwrap()) {
                used = true;
            } else {
                self.pending.push_front(frame.take().unwrap());
                break;
            }
        }
        used
    }

    fn queue_for_guest(&mut self, frame: Vec<u8>) {
        if self.pending.len() >= MAX_PENDING {
            self.pending.pop_front();
            self.counts.rx_dropped += 1;
        }
        self.pending.push_back(frame);
    }

    /// Takes every frame the guest queued for transmission.
    fn transmit(&mut self, mem: &GuestMemoryMmap, now: Instant) -> bool {
        let mut used = false;
        // At most one ring's worth a notify, as virtio-blk (another vCPU refilling the ring
        // cannot keep this one here); later chains came with notifies of their own.
        for _ in 0..self.queues[TX_QUEUE as usize].size() {
            let Some(chain) = self.pop(TX_QUEUE, mem) else {
                break;
            };
            used = true;
            let head = chain.head;
            let data = chain.readable();
            let n = data.len();
            let mut buf = Vec::new();
            let read = match usize::try_from(n) {
                Ok(n) if n > NET_HDR_LEN && n <= NET_HDR_LEN + MAX_TX_FRAME => {
                    buf.resize(n, 0);
                    data.read(mem, &mut buf).map_err(QueueError::from)
                }
                _ => Err(QueueError::BadFrameLength(n)),
            };
            match read {
                Ok(_) => {
                    self.counts.tx_frames += 1;
                    let answer = self
                        .pinger
                        .as_mut()
                        .and_then(|p| p.from_guest(&buf[NET_HDR_LEN..], now));
                    if let Some(a) = answer {
                        self.queue_for_guest(a);
                    }
                }
                Err(e) => self.queue_error(e),
            }
            self.add_used(TX_QUEUE, mem, head, 0);
        }
        used
    }

    /// Whether the driver wants an interrupt for queue `index` now that buffers were used.
    fn wants_interrupt(&mut self, mem: &GuestMemoryMmap, index: u16) -> bool {
        queue::wants_interrupt(&mut self.queues[index as usize], mem)
    }
}

impl VirtioDevice for VirtioNet {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | (1 << VIRTIO_NET_F_MAC)
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = self.mac.get(offset as usize + i).copied().unwrap_or(0);
        }
    }

    fn queues(&self) -> &[Queue] {
        &self.queues
    }

    fn queues_mut(&mut self) -> &mut [Queue] {
        &mut self.queues
    }

    fn activate(&mut self, _features: u64, now: Instant) {
        if !self.queues.iter().all(|q| q.ready()) {
            log::warn!("virtio-net: driver ready but not all queues are");
        }
        log::info!("virtio-net: driver ready; the link is up");
        if let Some(p) = &mut self.pinger {
            p.start(now);
        }
    }

    fn reset(&mut self) {
        for q in &mut self.queues {
            q.reset();
        }
        self.pending.clear();
        self.fault = None;
    }

    fn needs_reset(&self) -> bool {
        self.fault.is_some()
    }

    fn queue_notify(&mut self, index: u16, mem: &GuestMemoryMmap, now: Instant) -> bool {
        let (rx_used, tx_used) = match index {
            RX_QUEUE => {
                self.counts.rx_notifies += 1;
                (self.flush_pending(mem), false)
            }
            TX_QUEUE => {
                self.counts.tx_notifies += 1;
                let tx = self.transmit(mem, now);
                (self.flush_pending(mem), tx)
            }
            _ => {
                self.queue_error(QueueError::NoSuchQueue(index));
                return false;
            }
        };
        (rx_used && self.wants_interrupt(mem, RX_QUEUE))
            | (tx_used && self.wants_interrupt(mem, TX_QUEUE))
    }

    fn tick(&mut self, mem: &GuestMemoryMmap, now: Instant) -> bool {
        let mut used = self.flush_pending(mem);
        let due = self.pinger.as_mut().map_or(0, |p| p.due(now));
        for _ in 0..due {
            let sent = self.receive(mem, |dev| {
                dev.pinger
                    .as_mut()
                    .expect("requests fall due only with a pinger")
                    .next_request(now)
            });
            if sent {
                used = true;
            } else if let Some(p) = &mut self.pinger {
                p.no_buffer();
            }
        }
        used && self.wants_interrupt(mem, RX_QUEUE)
    }
}

/// What the network card and the pinger counted, for the end-of-run report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetReport {
    pub pinger: Option<NetStats>,
    pub card: NetDeviceCounts,
    /// virtio-mmio status register at the end (0xf: the driver is up), interrupts raised.
    pub status: u32,
    pub interrupts: u64,
    pub bad_accesses: u64,
}

impl NetReport {
    pub(crate) fn from_card(t: &super::mmio::MmioTransport<VirtioNet>) -> Self {
        NetReport {
            pinger: t.device().pinger_stats(),
            card: t.device().counts.clone(),
            status: t.status(),
            interrupts: t.interrupts,
            bad_accesses: t.bad_accesses,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::packet::{self, Frame};
    use crate::net::pinger::{GUEST_IP, GUEST_MAC, HOST_IP, HOST_MAC};
    use std::time::Duration;
    use virtio_bindings::virtio_ring::{VRING_AVAIL_F_NO_INTERRUPT, VRING_DESC_F_WRITE};
    use vm_memory::{Address, Bytes, GuestAddress};

    const SIZE: u16 = 4;

    /// Guest memory with both queues laid out by hand (as a driver would) at fixed addresses.
    struct Rings {
        mem: GuestMemoryMmap,
    }

    /// Queue `q`: descriptors at base, avail ring at base + 0x1000, used ring at base + 0x2000.
    fn base(q: u16) -> u64 {
        0x10_0000 + u64::from(q) * 0x1_0000
    }

    impl Rings {
        fn new(dev: &mut VirtioNet) -> Self {
            let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap();
            for (i, q) in dev.queues_mut().iter_mut().enumerate() {
                let b = base(i as u16);
                q.set_size(SIZE);
                q.set_desc_table_address(Some(b as u32), Some(0));
                q.set_avail_ring_address(Some((b + 0x1000) as u32), Some(0));
                q.set_used_ring_address(Some((b + 0x2000) as u32), Some(0));
                q.set_ready(true);
                assert!(q.is_valid(&mem));
            }
            Rings { mem }
        }

        /// Makes descriptor `d` of queue `q` a buffer at `addr` and offers it.
        fn offer(&self, q: u16, d: u16, addr: u64, len: u32, writable: bool) {
            let b = base(q);
            let flags = if writable {
                VRING_DESC_F_WRITE as u16
            } else {
                0
            };
            let m = &self.mem;
            let desc = GuestAddress(b + u64::from(d) * 16);
            m.write_obj(addr, desc).unwrap();
            m.write_obj(len, desc.unchecked_add(8)).unwrap();
            m.write_obj(flags, desc.unchecked_add(12)).unwrap();
            let idx: u16 = m.read_obj(GuestAddress(b + 0x1002)).unwrap();
            m.write_obj(d, GuestAddress(b + 0x1004 + 2 * u64::from(idx % SIZE)))
                .unwrap();
            m.write_obj(idx.wrapping_add(1), GuestAddress(b + 0x1002))
                .unwrap();
        }

        fn set_no_interrupt(&self, q: u16) {
            self.mem
                .write_obj(
                    VRING_AVAIL_F_NO_INTERRUPT as u16,
                    GuestAddress(base(q) + 0x1000),
                )
                .unwrap();
        }

        /// The used ring of queue `q`: (idx, [(id, len)]).
        fn used(&self, q: u16) -> (u16, Vec<(u32, u32)>) {
            let b = base(q) + 0x2000;
            let idx: u16 = self.mem.read_obj(GuestAddress(b + 2)).unwrap();
            let elems = (0..idx.min(SIZE))
                .map(|i| {
                    let e = GuestAddress(b + 4 + 8 * u64::from(i));
                    (
                        self.mem.read_obj(e).unwrap(),
                        self.mem.read_obj(e.unchecked_add(4)).unwrap(),
                    )
                })
                .collect();
            (idx, elems)
        }

        fn read(&self, addr: u64, len: usize) -> Vec<u8> {
            let mut v = vec![0; len];
            self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
            v
        }
    }

    #[test]
    fn due_requests_land_in_receive_buffers_with_a_header() {
        let t0 = Instant::now();
        let mut dev = VirtioNet::new(GUEST_MAC, Some(Pinger::new(2)));
        let r = Rings::new(&mut dev);
        dev.activate(0, t0);
        r.offer(RX_QUEUE, 0, 0x30_0000, 2048, true);
        assert!(
            !dev.tick(&r.mem, t0 + Duration::from_millis(100)),
            "nothing due yet"
        );
        assert!(
            dev.tick(&r.mem, t0 + Duration::from_millis(600)),
            "one request, interrupt"
        );
        let (idx, used) = r.used(RX_QUEUE);
        let len = NET_HDR_LEN + 14 + 20 + 8 + 56;
        assert_eq!((idx, used), (1, vec![(0, len as u32)]));
        let buf = r.read(0x30_0000, len);
        assert_eq!(&buf[..NET_HDR_LEN], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
        assert!(matches!(
            packet::parse(&buf[NET_HDR_LEN..]).unwrap(),
            Frame::Echo { reply: false, seq: 0, dst, .. } if dst == GUEST_IP
        ));
        // The next one falls due with no buffer left: counted, not queued.
        assert!(!dev.tick(&r.mem, t0 + Duration::from_millis(1100)));
        let s = dev.pinger_stats().unwrap();
        assert_eq!((s.requests_pushed, s.requests_no_buffer), (1, 1));
        assert_eq!(dev.counts.rx_frames, 1);
    }

    #[test]
    fn transmitted_arp_is_answered_through_the_receive_queue() {
        let t0 = Instant::now();
        let mut dev = VirtioNet::new(GUEST_MAC, Some(Pinger::new(1)));
        let r = Rings::new(&mut dev);
        dev.activate(0, t0);
        // The guest asks for 10.0.2.2 before any receive buffer is there: the answer waits.
        let mut frame = vec![0u8; NET_HDR_LEN];
        frame.extend(packet::arp(false, GUEST_MAC, GUEST_IP, [0; 6], HOST_IP));
        r.mem.write_slice(&frame, GuestAddress(0x40_0000)).unwrap();
        r.offer(TX_QUEUE, 0, 0x40_0000, frame.len() as u32, false);
        assert!(
            dev.queue_notify(TX_QUEUE, &r.mem, t0),
            "transmit used: interrupt"
        );
        assert_eq!(r.used(TX_QUEUE), (1, vec![(0, 0)]));
        assert_eq!(r.used(RX_QUEUE).0, 0);
        // A receive buffer arrives (with interrupts suppressed): the answer goes in, silently.
        r.set_no_interrupt(RX_QUEUE);
        r.offer(RX_QUEUE, 2, 0x30_0000, 2048, true);
        assert!(!dev.queue_notify(RX_QUEUE, &r.mem, t0), "suppressed");
        let (idx, used) = r.used(RX_QUEUE);
        assert_eq!((idx, used[0].0), (1, 2));
        let buf = r.read(0x30_0000, used[0].1 as usize);
        assert_eq!(
            packet::parse(&buf[NET_HDR_LEN..]).unwrap(),
            Frame::Arp {
                reply: true,
                sender_mac: HOST_MAC,
                sender_ip: HOST_IP,
                target_mac: GUEST_MAC,
                target_ip: GUEST_IP
            }
        );
        assert_eq!(dev.pinger_stats().unwrap().arp_answered, 1);
        assert_eq!(dev.counts.queue_errors, 0);
    }

    #[test]
    fn too_small_buffers_and_bad_queues_are_counted_not_fatal() {
        let t0 = Instant::now();
        let mut dev = VirtioNet::new(GUEST_MAC, Some(Pinger::new(1)));
        let r = Rings::new(&mut dev);
        dev.activate(0, t0);
        r.offer(RX_QUEUE, 0, 0x30_0000, 16, true);
        dev.tick(&r.mem, t0 + Duration::from_millis(1001));
        assert_eq!(r.used(RX_QUEUE), (1, vec![(0, 0)]), "returned unused");
        assert!(!dev.queue_notify(7, &r.mem, t0));
        // A transmit chain too short to hold a header and a frame: used, not sent on.
        r.offer(TX_QUEUE, 0, 0x40_0000, NET_HDR_LEN as u32, false);
        assert!(dev.queue_notify(TX_QUEUE, &r.mem, t0));
        assert_eq!(r.used(TX_QUEUE), (1, vec![(0, 0)]));
        assert_eq!(dev.counts.tx_frames, 0);
        assert_eq!(dev.pinger_stats().unwrap().tx_frames, 0);
        assert_eq!(dev.counts.queue_errors, 3);
    }
}
