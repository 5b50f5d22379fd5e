//! The virtio-blk device model alone, without KVM (issue 18, "Limits to meet"):
//! `cargo bench -p vpmu-benches --bench blk`.
//!
//! A fake driver in this file plays the guest: a split virtqueue in a `GuestMemoryMmap`, one
//! descriptor chain per case built once (header, one data buffer, status byte), and per request
//! only what a driver does between requests: the header's sector, an avail ring entry, the avail
//! index, then `queue_notify` (the call the MMIO QUEUE_NOTIFY write makes on the vCPU thread).
//! The device runs over a real raw image ([`RawFile`]) of 64 MiB in a temporary directory,
//! read once beforehand so reads come from the page cache.
//!
//! Cases, one request per notify:
//! * `read 4K`: 4 KiB reads at scattered 4 KiB-aligned offsets: VMM CPU time per request.
//! * `write 4K`: the same as writes (into the page cache; no FLUSH in between).
//! * `read 128K`: 128 KiB reads, sequential through the image, one 128 KiB data segment:
//!   throughput (MB/s, wall) and CPU per request.
//! * `flush`: a FLUSH (fdatasync) after one 4 KiB write, for reference; only the flush is timed.
//! * `pread 4K`, `pwrite 4K`: the bare system calls at the same offsets, no device; the
//!   summary's last line is the device's own share, (device case - bare case) per round.
//!
//! CPU time is the thread's (`CLOCK_THREAD_CPUTIME_ID`: user + system, so the pread/pwrite
//! copies count); wall time is `Instant`. The fake driver's few guest-memory stores per request
//! are inside the timed loop (tens of ns). One warm-up round is discarded, then ROUNDS rounds
//! run every case once for about BATCH of wall time each, in an order that flips every round
//! (A B C D, D C B A), so machine load falls on all cases alike; each figure is the median
//! over the rounds with (min..max).
//!
//! `cargo bench -p vpmu-benches --bench blk -- worst-notify` measures instead the most work one
//! notify can ask of the device (issue 33): every avail entry of a full ring (256) names the same
//! chain (nothing in the ring tells a device that a head is already in flight, so one vCPU needs
//! no race for this), and that chain is the largest the device accepts: a header, SEG_MAX (254)
//! data descriptors of SIZE_MAX (1 MiB) each, a status byte -- 256 reads of 254 MiB, from a
//! 254 MiB image in the page cache into one 1 MiB guest buffer. Printed: the time of that one
//! notify (wall and this thread's CPU), of one such request, and the requests it carried out
//! (2026-11-29: 12.28 s for 256 requests before a pass took each head once, 0.05 s for 1 after;
//! docs/virtio-blk.md, "The most one notify can cost").

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use runtime::devices::virtio::blk::file::RawFile;
use runtime::devices::virtio::blk::{VirtioBlk, SEG_MAX, SIZE_MAX};
use runtime::devices::virtio::VirtioDevice;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const ROUNDS: usize = 7;
/// Wall time per case per round.
const BATCH: Duration = Duration::from_millis(200);
const IMAGE_BYTES: u64 = 64 << 20;
const SECTOR: u64 = 512;

const QSIZE: u16 = 256;
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x3000;
const USED: u64 = 0x4000;
/// Where buffers start in guest memory (headers, status bytes, data).
const BUFS: u64 = 0x10_000;
const MEM_BYTES: usize = 4 << 20;

/// The time this thread has run (user + system).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the one timespec it is given, which lives on this stack.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// One prebuilt request chain: header, optional data buffer, status byte.
#[derive(Clone, Copy)]
struct Chain {
    head: u16,
    header: u64,
    status: u64,
    data: u64,
    data_len: u32,
}

/// The guest side: guest memory, the queue's rings, and the device under test.
struct FakeDriver {
    mem: GuestMemoryMmap,
    dev: VirtioBlk<RawFile>,
    avail_idx: u16,
    next_desc: u16,
    next_buf: u64,
}

impl FakeDriver {
    fn new(file: File, image_bytes: u64) -> FakeDriver {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_BYTES)]).unwrap();
        let mut dev = VirtioBlk::new(
            RawFile::new(file),
            image_bytes / SECTOR,
            false,
            *b"bench-disk\0\0\0\0\0\0\0\0\0\0",
            "bench.img".into(),
        );
        let q = &mut dev.queues_mut()[0];
        q.set_size(QSIZE);
        q.set_desc_table_address(Some(DESC as u32), Some(0));
        q.set_avail_ring_address(Some(AVAIL as u32), Some(0));
        q.set_used_ring_address(Some(USED as u32), Some(0));
        q.set_ready(true);
        assert!(q.is_valid(&mem), "queue layout");
        // The driver accepts VERSION_1 and FLUSH (Linux does): writes go to the page cache.
        let features = dev.features();
        assert_ne!(features & (1 << VIRTIO_BLK_F_FLUSH), 0);
        dev.activate(features, Instant::now());
        FakeDriver {
            mem,
            dev,
            avail_idx: 0,
            next_desc: 0,
            next_buf: BUFS,
        }
    }

    fn alloc(&mut self, len: u32) -> u64 {
        let a = self.next_buf;
        self.next_buf += (u64::from(len) + 0xfff) & !0xfff;
        assert!(self.next_buf <= MEM_BYTES as u64, "guest memory");
        a
    }

    /// Writes descriptor chain (addr, len, device-writable) into the table; returns its head.
    fn descriptors(&mut self, parts: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, writable)) in parts.iter().enumerate() {
            let d = self.next_desc;
            self.next_desc += 1;
            let mut flags = if writable {
                VRING_DESC_F_WRITE as u16
            } else {
                0
            };
            if i + 1 < parts.len() {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            let at = DESC + 16 * u64::from(d);
            self.mem.write_obj(addr, GuestAddress(at)).unwrap();
            self.mem.write_obj(len, GuestAddress(at + 8)).unwrap();
            self.mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
            self.mem.write_obj(d + 1, GuestAddress(at + 14)).unwrap();
        }
        head
    }

    /// A chain of type `t` with a data buffer of `data_len` bytes (device-writable for reads).
    fn chain(&mut self, t: u32, data_len: u32) -> Chain {
        let header = self.alloc(16);
        self.mem.write_obj(t, GuestAddress(header)).unwrap();
        let data = if data_len > 0 {
            self.alloc(data_len)
        } else {
            0
        };
        let status = self.alloc(1);
        let mut parts = vec![(header, 16, false)];
        if data_len > 0 {
            parts.push((data, data_len, t == VIRTIO_BLK_T_IN));
        }
        parts.push((status, 1, true));
        let head = self.descriptors(&parts);
        Chain {
            head,
            header,
            status,
            data,
            data_len,
        }
    }

    /// What a driver does per request: sector, avail entry, avail index; then the notify.
    fn submit(&mut self, c: &Chain, sector: u64, now: Instant) {
        let m = &self.mem;
        m.write_obj(sector, GuestAddress(c.header + 8)).unwrap();
        let idx = self.avail_idx;
        let slot = AVAIL + 4 + 2 * u64::from(idx % QSIZE);
        m.write_obj(c.head, GuestAddress(slot)).unwrap();
        self.avail_idx = idx.wrapping_add(1);
        m.write_obj(self.avail_idx, GuestAddress(AVAIL + 2))
            .unwrap();
        self.dev.queue_notify(0, m, now);
    }

    /// Every request so far was used and succeeded, and `c` got status OK.
    fn check(&self, c: &Chain) {
        let used: u16 = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
        assert_eq!(used, self.avail_idx, "requests not all used");
        let st: u8 = self.mem.read_obj(GuestAddress(c.status)).unwrap();
        assert_eq!(st, 0, "status of the last request");
        let k = &self.dev.counts;
        assert_eq!((k.io_errors, k.unsupported, k.no_status), (0, 0, 0));
        assert!(self.dev.fault().is_none(), "{:?}", self.dev.fault());
    }
}

/// One case's figures for one round.
#[derive(Clone, Copy)]
struct Sample {
    cpu_us: f64,
    wall_us: f64,
    mb_s: f64,
}

#[derive(Clone, Copy, PartialEq)]
enum Case {
    Read4k,
    Write4k,
    Read128k,
    Flush,
    /// The same pread64 / pwrite64 of 4 KiB straight on the file, without the device: what
    /// the device adds is the difference.
    BarePread4k,
    BarePwrite4k,
}

const CASES: [Case; 6] = [
    Case::Read4k,
    Case::Write4k,
    Case::Read128k,
    Case::Flush,
    Case::BarePread4k,
    Case::BarePwrite4k,
];

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Read4k => "read 4K",
            Case::Write4k => "write 4K",
            Case::Read128k => "read 128K",
            Case::Flush => "flush",
            Case::BarePread4k => "pread 4K",
            Case::BarePwrite4k => "pwrite 4K",
        }
    }
}

struct Bench {
    drv: FakeDriver,
    read4k: Chain,
    write4k: Chain,
    read128k: Chain,
    flush: Chain,
    /// The image, for the bare system-call cases.
    file: File,
    /// Request counter driving the offsets (scattered for 4 KiB, sequential for 128 KiB).
    n: u64,
}

impl Bench {
    fn new(file: File) -> Bench {
        let file_for_bare = file.try_clone().unwrap();
        let mut drv = FakeDriver::new(file, IMAGE_BYTES);
        let read4k = drv.chain(VIRTIO_BLK_T_IN, 4096);
        let write4k = drv.chain(VIRTIO_BLK_T_OUT, 4096);
        let read128k = drv.chain(VIRTIO_BLK_T_IN, 128 << 10);
        let flush = drv.chain(VIRTIO_BLK_T_FLUSH, 0);
        Bench {
            drv,
            read4k,
            write4k,
            read128k,
            flush,
            file: file_for_bare,
            n: 0,
        }
    }

    /// A 4 KiB-aligned sector spread over the image (a stride prime to the block count).
    fn scattered_4k(&mut self) -> u64 {
        self.n += 1;
        (self.n.wrapping_mul(7919) % (IMAGE_BYTES / 4096)) * 8
    }

    fn sequential_128k(&mut self) -> u64 {
        self.n += 1;
        (self.n % (IMAGE_BYTES / (128 << 10))) * 256
    }

    /// Requests of one chain until BATCH has passed, timed as a whole.
    fn batch(&mut self, case: Case) -> Sample {
        let c = match case {
            Case::Read4k => self.read4k,
            Case::Write4k => self.write4k,
            Case::Read128k => self.read128k,
            Case::Flush => return self.flushes(),
            Case::BarePread4k | Case::BarePwrite4k => return self.bare(case),
        };
        let now = Instant::now();
        let (cpu0, wall0) = (thread_cpu(), Instant::now());
        let mut reqs = 0u64;
        while !reqs.is_multiple_of(16) || wall0.elapsed() < BATCH {
            let sector = if case == Case::Read128k {
                self.sequential_128k()
            } else {
                self.scattered_4k()
            };
            self.drv.submit(&c, sector, now);
            reqs += 1;
        }
        let (cpu, wall) = (thread_cpu() - cpu0, wall0.elapsed());
        self.drv.check(&c);
        sample(cpu, wall, reqs, u64::from(c.data_len))
    }

    /// pread64 / pwrite64 of 4 KiB at the offsets the device cases use, no device.
    fn bare(&mut self, case: Case) -> Sample {
        let mut buf = vec![1u8; 4096];
        let (cpu0, wall0) = (thread_cpu(), Instant::now());
        let mut reqs = 0u64;
        while !reqs.is_multiple_of(16) || wall0.elapsed() < BATCH {
            let offset = self.scattered_4k() * SECTOR;
            if case == Case::BarePread4k {
                self.file.read_exact_at(&mut buf, offset).unwrap();
            } else {
                self.file.write_all_at(&buf, offset).unwrap();
            }
            reqs += 1;
        }
        sample(thread_cpu() - cpu0, wall0.elapsed(), reqs, 4096)
    }

    /// FLUSHes, each after one 4 KiB write; only the flushes are timed.
    fn flushes(&mut self) -> Sample {
        let now = Instant::now();
        let (w, f) = (self.write4k, self.flush);
        self.drv.submit(&f, 0, now); // what earlier cases left dirty is not this case's cost
        let (mut cpu, mut wall, mut reqs) = (Duration::ZERO, Duration::ZERO, 0);
        let start = Instant::now();
        while start.elapsed() < BATCH || reqs < 5 {
            let sector = self.scattered_4k();
            self.drv.submit(&w, sector, now);
            let (cpu0, wall0) = (thread_cpu(), Instant::now());
            self.drv.submit(&f, 0, now);
            wall += wall0.elapsed();
            cpu += thread_cpu() - cpu0;
            reqs += 1;
        }
        self.drv.check(&f);
        sample(cpu, wall, reqs, 0)
    }
}

fn sample(cpu: Duration, wall: Duration, reqs: u64, bytes_per_req: u64) -> Sample {
    let n = reqs as f64;
    Sample {
        cpu_us: cpu.as_secs_f64() * 1e6 / n,
        wall_us: wall.as_secs_f64() * 1e6 / n,
        mb_s: (bytes_per_req * reqs) as f64 / wall.as_secs_f64() / 1e6,
    }
}

/// A 64 MiB raw image of non-zero bytes (no holes), synced, then read once into the page cache.
fn make_image(dir: &std::path::Path) -> File {
    make_image_of(dir, IMAGE_BYTES)
}

/// A raw image of `bytes` (whole MiBs) as [`make_image`] makes it.
fn make_image_of(dir: &std::path::Path, bytes: u64) -> File {
    let path = dir.join("bench.img");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    let chunk: Vec<u8> = (0..1 << 20).map(|i: u32| (i / 512) as u8 | 1).collect();
    for _ in 0..bytes / (1 << 20) {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    let mut all = Vec::new();
    File::open(&path).unwrap().read_to_end(&mut all).unwrap();
    assert_eq!(all.len() as u64, bytes);
    f
}

/// Reads 4 KiB through the device and compares it with the file: the bench measures real work.
fn check_data(b: &mut Bench, file: &File) {
    let c = b.read4k;
    b.drv.submit(&c, 8 * 1001, Instant::now());
    b.drv.check(&c);
    let mut got = vec![0u8; 4096];
    b.drv
        .mem
        .read_slice(&mut got, GuestAddress(c.data))
        .unwrap();
    let mut want = vec![0u8; 4096];
    file.read_exact_at(&mut want, 1001 * 4096).unwrap();
    assert_eq!(got, want, "data read through the device");
}

fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    (s[s.len() / 2], s[0], s[s.len() - 1])
}

fn show(v: &[f64], unit: &str, prec: usize) -> String {
    let (med, lo, hi) = stats(v);
    format!("{med:>8.prec$} {unit} ({lo:.prec$}..{hi:.prec$})")
}

/// One notify of a full ring whose every entry is the largest chain the device accepts.
fn worst_notify() {
    let segs = SEG_MAX as usize;
    let image = u64::from(SIZE_MAX) * segs as u64;
    let dir = tempfile::tempdir().unwrap();
    let mut drv = FakeDriver::new(make_image_of(dir.path(), image), image);
    let header = drv.alloc(16);
    drv.mem
        .write_obj(VIRTIO_BLK_T_IN, GuestAddress(header))
        .unwrap();
    drv.mem.write_obj(0u64, GuestAddress(header + 8)).unwrap();
    let data = drv.alloc(SIZE_MAX);
    let status = drv.alloc(1);
    let mut parts = vec![(header, 16, false)];
    parts.extend(std::iter::repeat_n((data, SIZE_MAX, true), segs));
    parts.push((status, 1, true));
    let head = drv.descriptors(&parts);
    // n avail entries, all `head`, then one notify; its wall and CPU time.
    let notify = |drv: &mut FakeDriver, n: u16| -> (Duration, Duration) {
        for _ in 0..n {
            let slot = AVAIL + 4 + 2 * u64::from(drv.avail_idx % QSIZE);
            drv.mem.write_obj(head, GuestAddress(slot)).unwrap();
            drv.avail_idx = drv.avail_idx.wrapping_add(1);
        }
        drv.mem
            .write_obj(drv.avail_idx, GuestAddress(AVAIL + 2))
            .unwrap();
        let (cpu0, wall0) = (thread_cpu(), Instant::now());
        drv.dev.queue_notify(0, &drv.mem, Instant::now());
        (wall0.elapsed(), thread_cpu() - cpu0)
    };
    let (one_wall, one_cpu) = notify(&mut drv, 1);
    let reads_before = drv.dev.counts.reads;
    let (wall, cpu) = notify(&mut drv, QSIZE);
    let k = &drv.dev.counts;
    let st: u8 = drv.mem.read_obj(GuestAddress(status)).unwrap();
    println!(
        "virtio-blk, the most one notify can ask (no KVM): {QSIZE} avail entries naming one chain \
         of {segs} x {} KiB data descriptors (a {} MiB read each), {} MiB image in the page cache",
        SIZE_MAX >> 10,
        image >> 20,
        image >> 20
    );
    println!(
        "one such request: {:.1} ms wall, {:.1} ms CPU",
        one_wall.as_secs_f64() * 1e3,
        one_cpu.as_secs_f64() * 1e3
    );
    println!(
        "one notify of the full ring: {:.2} s wall, {:.2} s CPU: {} requests carried out ({} MiB \
         read), status of the last {st}, device fault {:?}",
        wall.as_secs_f64(),
        cpu.as_secs_f64(),
        k.reads - reads_before,
        ((k.reads - reads_before) * image) >> 20,
        drv.dev.fault()
    );
}

fn main() {
    if std::env::args().any(|a| a == "worst-notify") {
        worst_notify();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = make_image(dir.path());
    let mut b = Bench::new(file.try_clone().unwrap());
    check_data(&mut b, &file);

    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); CASES.len()];
    for round in 0..=ROUNDS {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..CASES.len()).collect()
        } else {
            (0..CASES.len()).rev().collect()
        };
        for i in order {
            let s = b.batch(CASES[i]);
            if round > 0 {
                samples[i].push(s);
            }
        }
    }

    println!(
        "virtio-blk device model, no KVM: fake split queue, one request per notify, 64 MiB raw \
         image in {} (page cache), {ROUNDS} rounds of ~{} ms per case after a warm-up round; \
         median (min..max) over rounds",
        dir.path().display(),
        BATCH.as_millis()
    );
    println!(
        "{:<10} {:>28} {:>28} {:>28}",
        "case", "VMM CPU per request", "wall per request", "throughput (wall)"
    );
    for (case, s) in CASES.iter().zip(&samples) {
        let cpu: Vec<f64> = s.iter().map(|x| x.cpu_us).collect();
        let wall: Vec<f64> = s.iter().map(|x| x.wall_us).collect();
        let mb: Vec<f64> = s.iter().map(|x| x.mb_s).collect();
        let tput = if *case == Case::Read128k {
            show(&mb, "MB/s", 0)
        } else {
            String::new()
        };
        let prec = if *case == Case::Flush { 0 } else { 2 };
        println!(
            "{:<10} {:>28} {:>28} {:>28}",
            case.name(),
            show(&cpu, "us", prec),
            show(&wall, "us", prec),
            tput
        );
    }
    let cpu = |i: usize, j: usize| -> Vec<f64> {
        samples[i]
            .iter()
            .zip(&samples[j])
            .map(|(d, bare)| d.cpu_us - bare.cpu_us)
            .collect()
    };
    println!(
        "device model's own CPU per 4 KiB request (device - bare syscall, per round): read {}, \
         write {}",
        show(&cpu(0, 4), "us", 2).trim_start(),
        show(&cpu(1, 5), "us", 2).trim_start()
    );
    let k = &b.drv.dev.counts;
    println!(
        "device counts: {} reads, {} writes, {} flushes, {} notifies, {} bytes read, {} written",
        k.reads, k.writes, k.flushes, k.notifies, k.bytes_read, k.bytes_written
    );
}
