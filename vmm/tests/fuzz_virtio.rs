//! Property-based fuzzing of the virtio-mmio transport, the virtio-net device and the
//! virtio-blk device (module `blk` below: random request chains). virtio-net: random
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

fn wr(t: &mut impl MmioDevice, reg: u32, v: u32) {
    t.write(u64::from(reg), &v.to_le_bytes());
}

fn rd(t: &mut impl MmioDevice, reg: u32) -> u32 {
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

// ---- virtio-blk: random request chains against an image in memory ----

mod blk {
    use super::*;
    use std::sync::{Arc, Mutex};
    use virtio_bindings::virtio_blk::*;
    use vmm::devices::virtio::blk::file::DiskFile;
    use vmm::devices::virtio::blk::VirtioBlk;

    const SECTORS: u64 = 16;
    const IMAGE: u64 = SECTORS * 512;
    const QSIZE: u16 = 16;
    const DESC: u64 = 0x1_0000;
    const AVAIL: u64 = 0x1_4000;
    const USED: u64 = 0x1_8000;

    /// What the device did to the image: out-of-image accesses and writes, seen by the test.
    #[derive(Default)]
    struct Seen {
        outside: Vec<String>,
        writes: u64,
    }

    /// An image in memory that notes every access outside it instead of failing.
    struct MemDisk {
        data: Vec<u8>,
        seen: Arc<Mutex<Seen>>,
    }

    impl MemDisk {
        fn range(
            &self,
            what: &str,
            offset: u64,
            len: u64,
        ) -> std::io::Result<std::ops::Range<usize>> {
            match offset.checked_add(len) {
                Some(end) if end <= IMAGE => Ok(offset as usize..end as usize),
                _ => {
                    self.seen
                        .lock()
                        .unwrap()
                        .outside
                        .push(format!("{what} {offset}+{len}"));
                    Err(std::io::Error::from_raw_os_error(libc::EINVAL))
                }
            }
        }
    }

    impl DiskFile for MemDisk {
        fn read_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            let r = self.range("read", offset, buf.len() as u64)?;
            buf.copy_from_slice(&self.data[r]);
            Ok(())
        }
        fn write_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            let r = self.range("write", offset, buf.len() as u64)?;
            self.data[r].copy_from_slice(buf);
            self.seen.lock().unwrap().writes += 1;
            Ok(())
        }
        fn sync_data(&mut self) -> std::io::Result<()> {
            Ok(())
        }
        fn discard(&mut self, offset: u64, len: u64) -> std::io::Result<()> {
            self.write_zeroes(offset, len)
        }
        fn write_zeroes(&mut self, offset: u64, len: u64) -> std::io::Result<()> {
            let r = self.range("zero", offset, len)?;
            self.data[r].fill(0);
            self.seen.lock().unwrap().writes += 1;
            Ok(())
        }
    }

    /// One descriptor of a request chain: its length, whether the device may write it, and
    /// where it points (an offset in the data area, or anywhere).
    #[derive(Debug, Clone)]
    struct Part {
        len: u32,
        writable: bool,
        addr: Option<u64>,
    }

    #[derive(Debug, Clone)]
    enum BlkOp {
        /// A request: header (type, sector) in the first part (when it is readable), then the
        /// parts; offered and notified.
        Request {
            kind: u32,
            sector: u64,
            parts: Vec<Part>,
        },
        /// A raw register write (any register, any value: resets, queue changes, junk).
        Write(u64, u32),
        Poke(u64, Vec<u8>),
        Notify(u32),
    }

    fn part() -> impl Strategy<Value = Part> {
        let len = prop_oneof![
            8 => prop::sample::select(vec![0u32, 1, 16, 511, 512, 1024, 4096]),
            2 => 0u32..10_000,
            1 => Just(u32::MAX),
        ];
        let addr = prop_oneof![15 => Just(None), 1 => addr().prop_map(Some)];
        (len, any::<bool>(), addr).prop_map(|(len, writable, addr)| Part {
            len,
            writable,
            addr,
        })
    }

    fn blk_op() -> impl Strategy<Value = BlkOp> {
        let kind = prop_oneof![
            6 => prop::sample::select(vec![
                VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID,
                VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES,
            ]),
            1 => any::<u32>(),
        ];
        let sector = prop_oneof![
            4 => 0u64..SECTORS + 2,
            1 => prop::sample::select(vec![SECTORS - 1, SECTORS, u64::MAX, u64::MAX / 512, 1 << 55]),
            1 => any::<u64>(),
        ];
        // Mostly the shape a driver uses (header, data, status byte) with odd lengths and
        // directions mixed in; sometimes any chain at all.
        let data_len = prop_oneof![
            6 => prop::sample::select(vec![512u32, 1024, 4096, 16]),
            1 => 0u32..5000,
        ];
        let shaped = (
            prop::collection::vec((data_len, prop::bool::weighted(0.2)), 0..3),
            prop::bool::weighted(0.9),
            prop::sample::select(vec![1u32, 1, 1, 1, 0, 2]),
        );
        let request = (
            kind,
            sector,
            prop_oneof![3 => shaped.prop_map(Some), 1 => Just(None)],
            prop::collection::vec(part(), 0..5),
        )
            .prop_map(|(kind, sector, shaped, random)| {
                let parts = match shaped {
                    None => random,
                    Some((data, status_w, status_len)) => {
                        let mut p = vec![Part {
                            len: 16,
                            writable: false,
                            addr: None,
                        }];
                        for (len, flip) in data {
                            let to_guest = kind == VIRTIO_BLK_T_IN || kind == VIRTIO_BLK_T_GET_ID;
                            p.push(Part {
                                len,
                                writable: to_guest != flip,
                                addr: None,
                            });
                        }
                        p.push(Part {
                            len: status_len,
                            writable: status_w,
                            addr: None,
                        });
                        p
                    }
                };
                BlkOp::Request {
                    kind,
                    sector,
                    parts,
                }
            });
        prop_oneof![
            10 => request,
            1 => (register(), any::<u32>()).prop_map(|(r, v)| BlkOp::Write(r, v)),
            1 => (addr(), prop::collection::vec(any::<u8>(), 1..32)).prop_map(|(a, b)| BlkOp::Poke(a, b)),
            1 => prop_oneof![4 => Just(0u32), 1 => any::<u32>()].prop_map(BlkOp::Notify),
        ]
    }

    struct BlkHarness {
        t: MmioTransport<VirtioBlk<MemDisk>>,
        mem: GuestMemoryMmap,
        seen: Arc<Mutex<Seen>>,
        next: u16,
    }

    impl BlkHarness {
        fn new(readonly: bool) -> BlkHarness {
            let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
            let seen = Arc::new(Mutex::new(Seen::default()));
            let disk = MemDisk {
                data: vec![0x5a; IMAGE as usize],
                seen: seen.clone(),
            };
            let dev = VirtioBlk::new(disk, SECTORS, readonly, [1; 20], "fuzz.img".into());
            let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
            let mut h = BlkHarness {
                t: MmioTransport::new(dev, mem.clone(), irq),
                mem,
                seen,
                next: 0,
            };
            h.setup();
            h
        }

        /// A driver's set-up accepting every offered feature, one queue of QSIZE.
        fn setup(&mut self) {
            // Fresh rings, as a driver allocates them at each initialisation.
            for ring in [AVAIL, USED] {
                self.mem
                    .write_slice(&[0u8; 0x1000], GuestAddress(ring))
                    .unwrap();
            }
            let t = &mut self.t;
            wr(t, VIRTIO_MMIO_STATUS, 0);
            wr(t, VIRTIO_MMIO_STATUS, 3);
            for sel in [0, 1] {
                wr(t, VIRTIO_MMIO_DEVICE_FEATURES_SEL, sel);
                let f = rd(t, VIRTIO_MMIO_DEVICE_FEATURES);
                wr(t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, sel);
                wr(t, VIRTIO_MMIO_DRIVER_FEATURES, f);
            }
            wr(t, VIRTIO_MMIO_STATUS, 0xb);
            wr(t, VIRTIO_MMIO_QUEUE_SEL, 0);
            wr(t, VIRTIO_MMIO_QUEUE_NUM, u32::from(QSIZE));
            wr(t, VIRTIO_MMIO_QUEUE_DESC_LOW, DESC as u32);
            wr(t, VIRTIO_MMIO_QUEUE_AVAIL_LOW, AVAIL as u32);
            wr(t, VIRTIO_MMIO_QUEUE_USED_LOW, USED as u32);
            wr(t, VIRTIO_MMIO_QUEUE_READY, 1);
            wr(t, VIRTIO_MMIO_STATUS, 0xf);
            self.next = 0;
        }

        fn used_idx(&self) -> u16 {
            self.mem.read_obj(GuestAddress(USED + 2)).unwrap()
        }

        fn apply(&mut self, op: &BlkOp) -> Result<(), TestCaseError> {
            match op {
                BlkOp::Request {
                    kind,
                    sector,
                    parts,
                } => self.request(*kind, *sector, parts)?,
                BlkOp::Write(r, v) => {
                    self.t.write(*r, &v.to_le_bytes());
                    if self.t.status() == 0 {
                        self.setup(); // the driver starts over after a reset
                    }
                }
                BlkOp::Poke(a, b) => {
                    let _ = self.mem.write_slice(b, GuestAddress(*a));
                }
                BlkOp::Notify(q) => wr(&mut self.t, VIRTIO_MMIO_QUEUE_NOTIFY, *q),
            }
            Ok(())
        }

        /// Lays the chain out (data area 0x4_0000.., each part on its own 16 KiB slot unless
        /// it points elsewhere), offers it and notifies; checks the answer.
        fn request(&mut self, kind: u32, sector: u64, parts: &[Part]) -> Result<(), TestCaseError> {
            let n = parts.len() as u16;
            let head = self.next % QSIZE;
            let mut status_at = None;
            for (i, p) in parts.iter().enumerate() {
                let d = (head + i as u16) % QSIZE;
                let a = p.addr.unwrap_or(0x4_0000 + i as u64 * 0x4000);
                if i == 0 && !p.writable {
                    let _ = self.mem.write_obj(kind, GuestAddress(a));
                    let _ = self.mem.write_obj(sector, GuestAddress(a.wrapping_add(8)));
                }
                let last = i + 1 == parts.len();
                if last && p.writable && p.len > 0 && p.addr.is_none() {
                    status_at = Some(a + u64::from(p.len.min(0x4000)) - 1);
                }
                let mut flags = if p.writable { 2u16 } else { 0 };
                if !last {
                    flags |= 1;
                }
                let at = GuestAddress(DESC + 16 * u64::from(d));
                self.mem.write_obj(a, at).unwrap();
                self.mem.write_obj(p.len, GuestAddress(at.0 + 8)).unwrap();
                self.mem.write_obj(flags, GuestAddress(at.0 + 12)).unwrap();
                self.mem
                    .write_obj((d + 1) % QSIZE, GuestAddress(at.0 + 14))
                    .unwrap();
            }
            if let Some(s) = status_at {
                let _ = self.mem.write_obj(0xeeu8, GuestAddress(s));
            }
            self.next = self.next.wrapping_add(n.max(1));
            let idx: u16 = self.mem.read_obj(GuestAddress(AVAIL + 2)).unwrap();
            self.mem
                .write_obj(head, GuestAddress(AVAIL + 4 + 2 * u64::from(idx % QSIZE)))
                .unwrap();
            self.mem
                .write_obj(idx.wrapping_add(1), GuestAddress(AVAIL + 2))
                .unwrap();
            let before = self.used_idx();
            wr(&mut self.t, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
            let used = self.used_idx();
            if self.t.device().fault().is_some() {
                prop_assert!(self.t.status() & NEEDS_RESET != 0);
                wr(&mut self.t, VIRTIO_MMIO_STATUS, 0); // the driver resets and starts over
                FAULTS.fetch_add(1, Relaxed);
                self.setup();
                return Ok(());
            }
            let st = self.t.status();
            if st & 0x4 == 0 || st & (0x80 | NEEDS_RESET) != 0 {
                return Ok(()); // not live (DRIVER_OK unset, or FAILED): notifies are ignored
            }
            // A random QueueReady write other than 1 (found: 2) un-readies the queue, whose
            // notifies are then ignored too.
            wr(&mut self.t, VIRTIO_MMIO_QUEUE_SEL, 0);
            if rd(&mut self.t, VIRTIO_MMIO_QUEUE_READY) == 0 {
                prop_assert_eq!(used, before, "a queue that is not ready is not used");
                return Ok(());
            }
            prop_assert_eq!(used, idx.wrapping_add(1), "every chain offered is used");
            let e = GuestAddress(USED + 4 + 8 * u64::from(idx % QSIZE));
            let len: u32 = self.mem.read_obj(GuestAddress(e.0 + 4)).unwrap();
            if let (Some(s), true) = (status_at, len > 0) {
                if parts.len() >= 2 && parts[..parts.len() - 1].iter().all(|p| p.addr.is_none()) {
                    let st: u8 = self.mem.read_obj(GuestAddress(s)).unwrap();
                    prop_assert!(st <= 2, "status byte {:#x}", st);
                }
            }
            Ok(())
        }
    }

    fn run_blk(readonly: bool, ops: &[BlkOp]) -> Result<(), TestCaseError> {
        let mut h = BlkHarness::new(readonly);
        for (i, op) in ops.iter().enumerate() {
            let mut r = Ok(());
            let biggest = largest_allocation(|| r = h.apply(op));
            r.map_err(|e| TestCaseError::fail(format!("step {i} {op:?}: {e}")))?;
            prop_assert!(
                biggest <= 1 << 20,
                "step {} {:?}: {}-byte allocation",
                i,
                op,
                biggest
            );
            let fault = h.t.device().fault().is_some();
            prop_assert_eq!(h.t.status() & NEEDS_RESET != 0, fault, "step {}", i);
            let seen = h.seen.lock().unwrap();
            prop_assert!(
                seen.outside.is_empty(),
                "step {}: outside the image: {:?}",
                i,
                seen.outside
            );
            if readonly {
                prop_assert_eq!(seen.writes, 0, "step {}: a read-only image written", i);
            }
        }
        let c = &h.t.device().counts;
        REQUESTS.fetch_add(
            c.reads + c.writes + c.flushes + c.get_ids + c.discards + c.write_zeroes + c.other,
            Relaxed,
        );
        DONE.fetch_add(c.bytes_read + c.bytes_written, Relaxed);
        wr(&mut h.t, VIRTIO_MMIO_STATUS, 0);
        prop_assert!(h.t.device().fault().is_none());
        Ok(())
    }

    /// A second vCPU: rewrites descriptors (address, length, flags, next) and available-ring
    /// entries of the request queue with junk, without pause, until `stop`; returns how many
    /// writes it made. Junk includes what the device refuses when it checks (indirect tables,
    /// loops, indices past the queue, buffers at the top of the address space, 4 GiB lengths),
    /// so a device that reads the ring again after checking it would use it.
    fn rewrite_ring_until(mem: GuestMemoryMmap, stop: Arc<AtomicBool>, seed: u64) -> u64 {
        let mut x = seed | 1;
        let mut writes = 0u64;
        while !stop.load(Relaxed) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let d = (x >> 8) % u64::from(QSIZE);
            let at = DESC + 16 * d;
            let _ = match (x >> 4) % 6 {
                0 => mem.write_obj(u64::MAX - (x >> 60), GuestAddress(at)),
                1 => mem.write_obj(0x4_0000 + ((x >> 20) & 0x3_ffff), GuestAddress(at)),
                2 => mem.write_obj(
                    if x & 1 == 0 {
                        u32::MAX
                    } else {
                        (x >> 32) as u32
                    },
                    GuestAddress(at + 8),
                ),
                3 => mem.write_obj(((x >> 32) as u16) & 0x7, GuestAddress(at + 12)),
                4 => mem.write_obj((x >> 40) as u16 % (QSIZE + 4), GuestAddress(at + 14)),
                _ => mem.write_obj(
                    (x >> 24) as u16 % (QSIZE + 4),
                    GuestAddress(AVAIL + 4 + 2 * ((x >> 48) % u64::from(QSIZE))),
                ),
            };
            writes += 1;
        }
        writes
    }

    /// Two vCPUs: one offers well-formed requests and notifies, the other rewrites the ring
    /// under it (issue 33). Whatever the device read, it used what it checked: no panic (this
    /// test runs in debug builds too, with overflow checks: scripts/test.sh), no image access
    /// outside the image, DEVICE_NEEDS_RESET exactly when the queue broke.
    #[test]
    fn virtio_blk_survives_a_second_vcpu_rewriting_its_ring() {
        let rounds = 20 * cases() as u64;
        let mut h = BlkHarness::new(false);
        let stop = Arc::new(AtomicBool::new(false));
        let racer = {
            let (mem, stop) = (h.mem.clone(), stop.clone());
            std::thread::spawn(move || rewrite_ring_until(mem, stop, 0x9e37_79b9_7f4a_7c15))
        };
        let (faults_before, mut notifies) = (FAULTS.load(Relaxed), 0u64);
        for i in 0..rounds {
            let kind = [VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_FLUSH][(i % 3) as usize];
            let data_to_guest = kind == VIRTIO_BLK_T_IN;
            let part = |len, writable| Part {
                len,
                writable,
                addr: None,
            };
            let parts = vec![part(16, false), part(1024, data_to_guest), part(1, true)];
            // Its own checks of the answer may see the other vCPU's junk: only what the
            // device did is judged here.
            let _ = h.request(kind, i % SECTORS, &parts);
            notifies += 1;
            // (request() resets a device whose queue broke, counting it in FAULTS.)
            let fault = h.t.device().fault().is_some();
            assert_eq!(h.t.status() & NEEDS_RESET != 0, fault, "round {i}");
            let seen = h.seen.lock().unwrap();
            assert!(seen.outside.is_empty(), "round {i}: {:?}", seen.outside);
        }
        stop.store(true, Relaxed);
        let writes = racer.join().expect("the racing thread");
        // Other tests of this binary count theirs in FAULTS too: a lower bound for this one.
        let faults = FAULTS.load(Relaxed) - faults_before;
        println!(
            "fuzz surface=virtio-blk-two-vcpus notifies={notifies} racing_writes={writes} \
             queue_faults={faults} requests={}",
            h.t.device().counts.reads + h.t.device().counts.writes + h.t.device().counts.flushes
        );
        // How often the race lands inside a notify depends on the scheduler (two busy loops
        // beside the test can serialise the threads): only that the other vCPU ran is required.
        assert!(writes > 0, "the racing thread never wrote");
    }

    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    /// Requests with a header the device read, and bytes moved by successful reads/writes:
    /// the fuzzing reaches the image, not only the checks in front of it.
    static REQUESTS: AtomicU64 = AtomicU64::new(0);
    static DONE: AtomicU64 = AtomicU64::new(0);
    /// Chains that broke the queue (the harness then resets the device).
    static FAULTS: AtomicU64 = AtomicU64::new(0);

    /// Random request chains (types, sectors past the end and wrapping, data lengths that
    /// are not whole sectors, huge and zero lengths, readable/writable in any order, no
    /// status byte, buffers outside memory) and register junk, on a read-write and a
    /// read-only disk: no panic, no allocation out of proportion, every image access inside
    /// the image, a read-only image never written, one used entry per chain with a status
    /// byte of OK/IOERR/UNSUPP, DEVICE_NEEDS_RESET exactly when the queue broke.
    #[test]
    fn virtio_blk_survives_random_requests() {
        let mut runner = TestRunner::new(Config {
            cases: cases(),
            failure_persistence: None,
            ..Config::default()
        });
        let strategy = (any::<bool>(), prop::collection::vec(blk_op(), 1..MAX_OPS));
        let r = runner.run(&strategy, |(ro, ops)| run_blk(ro, &ops));
        if let Err(e) = r {
            panic!("{e}");
        }
        let (requests, bytes) = (REQUESTS.load(Relaxed), DONE.load(Relaxed));
        println!(
            "fuzz surface=virtio-blk cases={} requests={requests} bytes_moved={bytes} queue_faults={}",
            cases(),
            FAULTS.load(Relaxed)
        );
        assert!(
            requests > 0 && bytes > 0,
            "the fuzzing never reached the image"
        );
    }
}
