//! Property-based fuzzing of the virtio-mmio transport and the virtio-net device: random
//! register sequences (known registers and random offsets, every access size) interleaved with
//! driver set-ups that use random queue sizes (not powers of two too) and ring addresses
//! (aligned and not, overlapping, outside guest memory), random descriptors (loops, indices
//! past the queue, indirect, zero and huge lengths, buffers outside memory), avail-index jumps,
//! notifies of any queue and ticks of a running pinger.
//!
//! Invariants: no panic; no allocation out of proportion (the counting allocator); only the
//! two interrupt reasons; a device whose queues the driver broke sets DEVICE_NEEDS_RESET (and
//! uses nothing) until the driver writes status 0, which brings it back to the power-on state.
//! A control property checks the other direction: a driver that follows the rules never sees
//! DEVICE_NEEDS_RESET.
//!
//! Short mode (the default): a few hundred sequences. Long mode: `VPMU_FUZZ_CASES=N`
//! (scripts/fuzz-long.sh); the sequences and operations run are printed.

mod fuzz_common;

use std::time::{Duration, Instant};

use fuzz_common::{cases, largest_allocation};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use virtio_bindings::virtio_mmio::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::devices::virtio::mmio::MmioTransport;
use vmm::devices::virtio::net::{VirtioNet, NET_HDR_LEN, RX_QUEUE, TX_QUEUE};
use vmm::devices::MmioDevice;
use vmm::devices::Tick;
use vmm::net::pinger::{Pinger, GUEST_MAC};
use vmm_sys_util::eventfd::EventFd;

const MEM: u64 = 1 << 20;
const NEEDS_RESET: u32 = 0x40;
const MAX_OPS: usize = 120;

type Dev = MmioTransport<VirtioNet>;

#[derive(Debug, Clone, Copy)]
struct Rings {
    size: u16,
    desc: u64,
    avail: u64,
    used: u64,
}

#[derive(Debug, Clone)]
enum Op {
    Write(u64, u8, u32),
    Read(u64, u8),
    /// The driver's initialisation with these queues (rx, tx).
    Setup([Rings; 2]),
    Desc {
        queue: u8,
        index: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    },
    /// Put `head` in the next avail entry and move the avail index by `bump`.
    Offer {
        queue: u8,
        head: u16,
        bump: u16,
    },
    Poke(u64, Vec<u8>),
    Notify(u32),
    Tick(u64),
}

fn register() -> impl Strategy<Value = u64> {
    let known = vec![
        VIRTIO_MMIO_MAGIC_VALUE,
        VIRTIO_MMIO_DEVICE_FEATURES,
        VIRTIO_MMIO_DEVICE_FEATURES_SEL,
        VIRTIO_MMIO_DRIVER_FEATURES,
        VIRTIO_MMIO_DRIVER_FEATURES_SEL,
        VIRTIO_MMIO_QUEUE_SEL,
        VIRTIO_MMIO_QUEUE_NUM_MAX,
        VIRTIO_MMIO_QUEUE_NUM,
        VIRTIO_MMIO_QUEUE_READY,
        VIRTIO_MMIO_QUEUE_NOTIFY,
        VIRTIO_MMIO_INTERRUPT_STATUS,
        VIRTIO_MMIO_INTERRUPT_ACK,
        VIRTIO_MMIO_STATUS,
        VIRTIO_MMIO_QUEUE_DESC_LOW,
        VIRTIO_MMIO_QUEUE_DESC_HIGH,
        VIRTIO_MMIO_QUEUE_AVAIL_LOW,
        VIRTIO_MMIO_QUEUE_AVAIL_HIGH,
        VIRTIO_MMIO_QUEUE_USED_LOW,
        VIRTIO_MMIO_QUEUE_USED_HIGH,
        VIRTIO_MMIO_CONFIG_GENERATION,
        VIRTIO_MMIO_CONFIG,
    ];
    prop_oneof![
        4 => prop::sample::select(known).prop_map(u64::from),
        1 => 0u64..0x1000,
    ]
}

fn size() -> impl Strategy<Value = u8> {
    prop_oneof![6 => Just(4u8), 1 => Just(1), 1 => Just(2), 1 => Just(8)]
}

fn addr() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => (0u64..MEM / 0x1000).prop_map(|p| p * 0x1000),
        2 => 0u64..MEM + 0x100,
        1 => prop::sample::select(vec![0, MEM - 1, MEM - 16, MEM, u64::MAX - 15, u64::MAX, 1 << 32]),
    ]
}

fn rings() -> impl Strategy<Value = Rings> {
    let size = prop_oneof![
        4 => prop::sample::select(vec![1u16, 2, 4, 8, 16, 256]),
        1 => any::<u16>(),
        1 => 0u16..300,
    ];
    // Mostly a sane layout in one of 8 slots; sometimes anything.
    let sane = (0u64..8).prop_map(|slot| {
        let b = 0x1_0000 + slot * 0x1_0000;
        (b, b + 0x4000, b + 0x8000)
    });
    let wild = (addr(), addr(), addr());
    (size, prop_oneof![4 => sane, 1 => wild]).prop_map(|(size, (desc, avail, used))| Rings {
        size,
        desc,
        avail,
        used,
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (register(), size(), any::<u32>()).prop_map(|(r, s, v)| Op::Write(r, s, v)),
        3 => (register(), size()).prop_map(|(r, s)| Op::Read(r, s)),
        2 => [rings(), rings()].prop_map(Op::Setup),
        8 => (
            0u8..2,
            prop_oneof![4 => 0u16..8, 1 => any::<u16>()],
            addr(),
            prop_oneof![
                3 => Just((NET_HDR_LEN + 42) as u32),
                2 => 0u32..4096,
                1 => prop::sample::select(vec![0u32, 1, NET_HDR_LEN as u32, u32::MAX, 1 << 31]),
            ],
            prop_oneof![4 => 0u16..4, 1 => any::<u16>()],
            prop_oneof![4 => 0u16..8, 1 => any::<u16>()],
        )
            .prop_map(|(queue, index, addr, len, flags, next)| Op::Desc {
                queue,
                index,
                addr,
                len,
                flags,
                next,
            }),
        6 => (
            0u8..2,
            prop_oneof![4 => 0u16..8, 1 => any::<u16>()],
            prop_oneof![8 => Just(1u16), 1 => any::<u16>(), 1 => 0u16..4],
        )
            .prop_map(|(queue, head, bump)| Op::Offer { queue, head, bump }),
        1 => (addr(), prop::collection::vec(any::<u8>(), 1..32)).prop_map(|(a, b)| Op::Poke(a, b)),
        5 => prop_oneof![4 => 0u32..2, 1 => any::<u32>()].prop_map(Op::Notify),
        2 => (0u64..3000).prop_map(Op::Tick),
    ]
}

fn wr(t: &mut Dev, reg: u32, v: u32) {
    t.write(u64::from(reg), &v.to_le_bytes());
}

fn rd(t: &mut Dev, reg: u32) -> u32 {
    let mut b = [0u8; 4];
    t.read(u64::from(reg), &mut b);
    u32::from_le_bytes(b)
}

/// What a Linux driver does: reset, ACKNOWLEDGE|DRIVER, features, FEATURES_OK, queues,
/// DRIVER_OK.
fn setup(t: &mut Dev, rings: &[Rings; 2]) {
    wr(t, VIRTIO_MMIO_STATUS, 0);
    wr(t, VIRTIO_MMIO_STATUS, 3);
    wr(t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    wr(t, VIRTIO_MMIO_DRIVER_FEATURES, 1);
    wr(t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
    wr(t, VIRTIO_MMIO_DRIVER_FEATURES, 1 << 5);
    wr(t, VIRTIO_MMIO_STATUS, 0xb);
    for (i, r) in rings.iter().enumerate() {
        wr(t, VIRTIO_MMIO_QUEUE_SEL, i as u32);
        wr(t, VIRTIO_MMIO_QUEUE_NUM, u32::from(r.size));
        for (lo, hi, a) in [
            (
                VIRTIO_MMIO_QUEUE_DESC_LOW,
                VIRTIO_MMIO_QUEUE_DESC_HIGH,
                r.desc,
            ),
            (
                VIRTIO_MMIO_QUEUE_AVAIL_LOW,
                VIRTIO_MMIO_QUEUE_AVAIL_HIGH,
                r.avail,
            ),
            (
                VIRTIO_MMIO_QUEUE_USED_LOW,
                VIRTIO_MMIO_QUEUE_USED_HIGH,
                r.used,
            ),
        ] {
            wr(t, lo, a as u32);
            wr(t, hi, (a >> 32) as u32);
        }
        wr(t, VIRTIO_MMIO_QUEUE_READY, 1);
    }
    wr(t, VIRTIO_MMIO_STATUS, 0xf);
}

struct Harness {
    t: Dev,
    mem: GuestMemoryMmap,
    rings: [Rings; 2],
    now: Instant,
}

impl Harness {
    fn new() -> Harness {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let dev = VirtioNet::new(GUEST_MAC, Some(Pinger::new(1000)));
        let none = Rings {
            size: 0,
            desc: 0,
            avail: 0,
            used: 0,
        };
        Harness {
            t: MmioTransport::new(dev, mem.clone(), irq),
            mem,
            rings: [none; 2],
            now: Instant::now(),
        }
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Write(off, n, v) => {
                let b = u64::from(*v).to_le_bytes();
                self.t.write(*off, &b[..usize::from(*n)]);
            }
            Op::Read(off, n) => {
                let mut b = [0u8; 8];
                self.t.read(*off, &mut b[..usize::from(*n)]);
            }
            Op::Setup(r) => {
                self.rings = *r;
                setup(&mut self.t, r);
            }
            Op::Desc {
                queue,
                index,
                addr,
                len,
                flags,
                next,
            } => {
                let r = self.rings[usize::from(*queue)];
                let at = r.desc.wrapping_add(16 * u64::from(*index));
                let mut d = [0u8; 16];
                d[..8].copy_from_slice(&addr.to_le_bytes());
                d[8..12].copy_from_slice(&len.to_le_bytes());
                d[12..14].copy_from_slice(&flags.to_le_bytes());
                d[14..].copy_from_slice(&next.to_le_bytes());
                let _ = self.mem.write_slice(&d, GuestAddress(at));
            }
            Op::Offer { queue, head, bump } => {
                let r = self.rings[usize::from(*queue)];
                let idx: u16 = self
                    .mem
                    .read_obj(GuestAddress(r.avail.wrapping_add(2)))
                    .unwrap_or(0);
                let slot = u64::from(idx % r.size.max(1));
                let _ = self
                    .mem
                    .write_obj(*head, GuestAddress(r.avail.wrapping_add(4 + 2 * slot)));
                let _ = self.mem.write_obj(
                    idx.wrapping_add(*bump),
                    GuestAddress(r.avail.wrapping_add(2)),
                );
            }
            Op::Poke(a, b) => {
                let _ = self.mem.write_slice(b, GuestAddress(*a));
            }
            Op::Notify(q) => wr(&mut self.t, VIRTIO_MMIO_QUEUE_NOTIFY, *q),
            Op::Tick(ms) => {
                self.now += Duration::from_millis(*ms);
                self.t.tick(self.now);
            }
        }
    }

    /// The invariants that hold after every step.
    fn check(&mut self) -> Result<(), TestCaseError> {
        let status = self.t.status();
        let fault = self.t.device().fault().map(|f| f.to_string());
        prop_assert_eq!(
            status & NEEDS_RESET != 0,
            fault.is_some(),
            "DEVICE_NEEDS_RESET in status {:#x} vs device fault {:?}",
            status,
            fault
        );
        let isr = rd(&mut self.t, VIRTIO_MMIO_INTERRUPT_STATUS);
        prop_assert_eq!(isr & !(VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG), 0);
        Ok(())
    }
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut h = Harness::new();
    for (i, op) in ops.iter().enumerate() {
        let mut r = Ok(());
        let biggest = largest_allocation(|| {
            h.apply(op);
            r = h.check();
        });
        r.map_err(|e| TestCaseError::fail(format!("step {i} {op:?}: {e}")))?;
        prop_assert!(
            biggest <= 1 << 20,
            "step {} {:?}: {}-byte allocation",
            i,
            op,
            biggest
        );
    }
    if h.t.status() & NEEDS_RESET != 0 {
        BROKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    // A reset always brings the device back.
    wr(&mut h.t, VIRTIO_MMIO_STATUS, 0);
    prop_assert_eq!(h.t.status(), 0);
    prop_assert!(h.t.device().fault().is_none());
    Ok(())
}

static OPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Sequences that ended with the device asking for a reset.
static BROKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[test]
fn virtio_net_survives_random_drivers() {
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = prop::collection::vec(op(), 1..MAX_OPS);
    let r = runner.run(&strategy, |ops| {
        OPS.fetch_add(ops.len() as u64, std::sync::atomic::Ordering::Relaxed);
        run(&ops)
    });
    if let Err(e) = r {
        panic!("{e}");
    }
    let ops = OPS.load(std::sync::atomic::Ordering::Relaxed);
    let broken = BROKEN.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "fuzz surface=virtio-net cases={} ops={ops} ended_needing_reset={broken}",
        cases()
    );
}

/// A driver that keeps the rules: valid rings, chains of 1-3 in-range descriptors with any
/// lengths, one offer per chain. The device may refuse frames (too short or long, buffers
/// too small) but never asks for a reset.
#[test]
fn a_driver_that_keeps_the_rules_never_sees_needs_reset() {
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let chain = (
        0u8..2,
        prop::collection::vec((0u32..3000, 0u64..0x70), 1..4),
        any::<bool>(),
    );
    let r = runner.run(&prop::collection::vec(chain, 1..40), |chains| {
        let mut h = Harness::new();
        let rings = [0, 1].map(|q| Rings {
            size: 8,
            desc: 0x1_0000 + q * 0x1_0000,
            avail: 0x1_4000 + q * 0x1_0000,
            used: 0x1_8000 + q * 0x1_0000,
        });
        h.apply(&Op::Setup(rings));
        let mut next = [0u16; 2];
        // Chains in flight per queue (their descriptor counts, oldest first) and how many
        // chains the device has returned: a driver never offers more descriptors than are free.
        let mut in_flight = [std::collections::VecDeque::new(), Default::default()];
        let mut returned = [0u16; 2];
        for (q, bufs, tick) in chains {
            let qi = usize::from(q);
            let used: u16 = h.mem.read_obj(GuestAddress(rings[qi].used + 2)).unwrap();
            while returned[qi] != used {
                in_flight[qi].pop_front();
                returned[qi] = returned[qi].wrapping_add(1);
            }
            if in_flight[qi].iter().sum::<usize>() + bufs.len() > 8 {
                continue;
            }
            in_flight[qi].push_back(bufs.len());
            let head = next[usize::from(q)];
            for (i, (len, page)) in bufs.iter().enumerate() {
                let index = (head + i as u16) % 8;
                let last = i + 1 == bufs.len();
                let write = if q == RX_QUEUE as u8 { 2 } else { 0 };
                h.apply(&Op::Desc {
                    queue: q,
                    index,
                    addr: 0x8_0000 + page * 0x1000,
                    len: *len,
                    flags: write | if last { 0 } else { 1 },
                    next: (index + 1) % 8,
                });
            }
            next[usize::from(q)] = (head + bufs.len() as u16) % 8;
            h.apply(&Op::Offer {
                queue: q,
                head,
                bump: 1,
            });
            h.apply(&Op::Notify(u32::from(q)));
            if tick {
                h.apply(&Op::Tick(5));
            }
            h.check()?;
            prop_assert_eq!(h.t.status() & NEEDS_RESET, 0, "{:?}", h.t.device().fault());
            let _ = TX_QUEUE;
        }
        Ok(())
    });
    if let Err(e) = r {
        panic!("{e}");
    }
}

/// Regression / spec: an available index moved more than a queue's worth ahead (which
/// virtio-queue only logs, leaving the device silent) and a descriptor loop each set
/// DEVICE_NEEDS_RESET with a configuration-change interrupt; status 0 recovers.
#[test]
fn broken_queues_ask_for_a_reset() {
    let rings = [0, 1].map(|q| Rings {
        size: 8,
        desc: 0x1_0000 + q * 0x1_0000,
        avail: 0x1_4000 + q * 0x1_0000,
        used: 0x1_8000 + q * 0x1_0000,
    });
    let cases: [&[Op]; 3] = [
        &[Op::Offer {
            queue: 1,
            head: 0,
            bump: 100,
        }],
        &[
            Op::Desc {
                queue: 1,
                index: 0,
                addr: 0x8_0000,
                len: 64,
                flags: 1,
                next: 1,
            },
            Op::Desc {
                queue: 1,
                index: 1,
                addr: 0x8_0000,
                len: 64,
                flags: 1,
                next: 0,
            },
            Op::Offer {
                queue: 1,
                head: 0,
                bump: 1,
            },
        ],
        &[
            Op::Desc {
                queue: 1,
                index: 0,
                addr: MEM - 8,
                len: 64,
                flags: 0,
                next: 0,
            },
            Op::Offer {
                queue: 1,
                head: 0,
                bump: 1,
            },
        ],
    ];
    for ops in cases {
        let mut h = Harness::new();
        h.apply(&Op::Setup(rings));
        for op in ops {
            h.apply(op);
        }
        h.apply(&Op::Notify(1));
        assert_eq!(h.t.status(), 0xf | NEEDS_RESET, "{ops:?}");
        assert!(h.t.device().fault().is_some());
        assert_eq!(
            rd(&mut h.t, VIRTIO_MMIO_INTERRUPT_STATUS) & VIRTIO_MMIO_INT_CONFIG,
            VIRTIO_MMIO_INT_CONFIG
        );
        // The driver writing status keeps the bit; queues stay unused.
        wr(&mut h.t, VIRTIO_MMIO_STATUS, 0xf);
        assert_eq!(h.t.status() & NEEDS_RESET, NEEDS_RESET);
        wr(&mut h.t, VIRTIO_MMIO_STATUS, 0);
        assert_eq!(h.t.status(), 0);
        h.apply(&Op::Setup(rings));
        assert_eq!(h.t.status(), 0xf, "usable again after the reset");
    }
}

/// Regression: a driver writing DEVICE_NEEDS_RESET (or bits above the 8-bit status) into the
/// status register made the transport believe the device was broken.
#[test]
fn the_driver_cannot_set_needs_reset() {
    let mut h = Harness::new();
    wr(&mut h.t, VIRTIO_MMIO_STATUS, 0x1_0043);
    assert_eq!(h.t.status(), 3);
}
