//! virtio-blk: a block device over a raw image file, one request queue, no interrupts
//! coalescing, no multi-queue. Requests are carried out synchronously on the vCPU thread that
//! notified the queue (so domain-switch accounting charges the guest for its I/O, as for the
//! network card), and completed to the guest only after their pread/pwrite/fdatasync returned.
//! Offered: VERSION_1, SIZE_MAX, SEG_MAX, BLK_SIZE, FLUSH, DISCARD, WRITE_ZEROES, and RO for a
//! read-only disk (which is offered neither DISCARD nor WRITE_ZEROES). docs/virtio-blk.md.

pub(crate) mod counts;
pub mod file;
pub(crate) mod request;

use std::mem::offset_of;
use std::path::PathBuf;
use std::time::Instant;

use virtio_bindings::virtio_blk::{
    virtio_blk_config, VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX, VIRTIO_BLK_F_WRITE_ZEROES,
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestMemoryMmap};

use vpmu::guest_log::GuestLog;
use vpmu::guest_warn;

use super::queue::{self, pop_checked, CheckedChain, QueueFault};
use super::{VirtioDevice, VIRTIO_F_VERSION_1};
pub use counts::{BlkCounts, DiskReport};
use file::{DiskFile, RawFile, SECTOR_SIZE};
use request::{
    Buffers, Disk, Kind, RequestError, MAX_RANGES, MAX_RANGE_SECTORS, MAX_WRITE_ZEROES_SECTORS,
};

/// Largest queue the driver may ask for.
pub const QUEUE_SIZE: u16 = 256;
/// Data segments per request (config seg_max): the queue less the header and status.
pub const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// Largest data segment (config size_max).
pub const SIZE_MAX: u32 = 1 << 20;
/// The block size the guest sees (config blk_size).
pub const BLK_SIZE: u32 = SECTOR_SIZE as u32;
/// Bad requests logged one line each; after that they are only counted.
const LOGGED_BAD_REQUESTS: u64 = 10;
/// The only queue.
pub(crate) const REQUEST_QUEUE: u16 = 0;
const QUEUE_NAME: &str = "block request queue";

/// `--disk PATH[,readonly=on]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskConfig {
    pub path: PathBuf,
    pub readonly: bool,
    /// Device-model work per access to the device's registers, in microseconds, busy-waited
    /// on the vCPU thread (`--disk-access-cost-us`; docs/accounting-modes.md).
    pub access_cost_us: u32,
}

/// At most this many disks (one IOAPIC pin each, [`disk_gsi`]).
pub(crate) const MAX_DISKS: usize = 8;

/// Disk `i`'s interrupt: IOAPIC pins 16.. (the upper pins, which nothing else uses here).
pub(crate) fn disk_gsi(i: usize) -> u32 {
    16 + i as u32
}

pub struct VirtioBlk<F: DiskFile = RawFile> {
    queues: [Queue; 1],
    disk: Disk<F>,
    pub counts: BlkCounts,
    /// The driver broke the queue: nothing is used until it resets the device.
    fault: Option<QueueFault>,
    /// For log lines: the image's path.
    name: String,
    /// Whether the VM is stopping (`--timeout`, a signal, another vCPU's end): asked between
    /// requests, so a long notify does not hold a stopping VM (nothing after it is used).
    stopping: Option<StopFlag>,
}

/// Asked between requests: true once the VM is stopping.
pub(crate) type StopFlag = std::sync::Arc<dyn Fn() -> bool + Send + Sync>;

impl<F: DiskFile> VirtioBlk<F> {
    /// A disk of `sectors` 512-byte sectors over `file`; `id` is GET_ID's answer.
    pub fn new(
        file: F,
        sectors: u64,
        readonly: bool,
        id: [u8; file::ID_BYTES],
        name: String,
    ) -> Self {
        VirtioBlk {
            queues: [Queue::new(QUEUE_SIZE).expect("QUEUE_SIZE is a valid queue size")],
            disk: Disk::new(file, sectors, readonly, id),
            counts: BlkCounts::default(),
            fault: None,
            name,
            stopping: None,
        }
    }

    /// Requests stop being taken from the ring once `stopping` says so.
    pub(crate) fn stop_when(&mut self, stopping: StopFlag) {
        self.stopping = Some(stopping);
    }

    pub fn file(&self) -> &F {
        &self.disk.file
    }

    pub fn sectors(&self) -> u64 {
        self.disk.sectors
    }

    pub fn readonly(&self) -> bool {
        self.disk.readonly
    }

    /// The queue fault that stopped the device, if any (cleared by a reset).
    pub fn fault(&self) -> Option<&QueueFault> {
        self.fault.as_ref()
    }

    fn bad_request(&mut self, what: &dyn std::fmt::Display) {
        let n = self.counts.bad_requests();
        if n <= LOGGED_BAD_REQUESTS {
            let more = if n == LOGGED_BAD_REQUESTS {
                " (further bad requests are only counted)"
            } else {
                ""
            };
            log::warn!("virtio-blk {}: {what}{more}", self.name);
        }
    }

    /// Carries out one chain and returns it to the driver: status byte written, then the used
    /// ring, both only after the request's system calls returned.
    fn process(&mut self, chain: CheckedChain, mem: &GuestMemoryMmap) {
        let head = chain.head;
        let bufs = match Buffers::split(chain.descriptors.into_iter()) {
            Ok(b) => b,
            Err(e) => {
                self.counts.no_status += 1;
                self.bad_request(&e);
                self.add_used(mem, head, 0);
                return;
            }
        };
        let result = self.disk.header(mem, &bufs).and_then(|(kind, sector)| {
            self.counts.count(kind);
            let r = self.disk.execute(mem, &bufs, kind, sector);
            if let Ok(n) = r {
                match kind {
                    Kind::Read => self.counts.bytes_read += n,
                    Kind::Write => {
                        self.counts.bytes_written += bufs.readable.len() - request::HEADER_LEN
                    }
                    _ => {}
                }
            }
            r
        });
        let (status, written) = match result {
            Ok(n) => (VIRTIO_BLK_S_OK as u8, n),
            Err(e) => {
                self.request_failed(&e);
                (e.status(), 0)
            }
        };
        let used = match mem.write_obj(status, bufs.status) {
            Ok(()) => written + 1,
            Err(e) => {
                // pop_checked saw the buffer in memory; count it all the same.
                self.counts.no_status += 1;
                self.bad_request(&e);
                0
            }
        };
        self.add_used(mem, head, used as u32);
    }

    fn request_failed(&mut self, e: &RequestError) {
        if e.status() == VIRTIO_BLK_S_UNSUPP as u8 {
            self.counts.unsupported += 1;
        } else {
            debug_assert_eq!(e.status(), VIRTIO_BLK_S_IOERR as u8);
            self.counts.io_errors += 1;
        }
        if matches!(e, RequestError::Io { .. } | RequestError::SyncFailedBefore) {
            log::error!("virtio-blk {}: {e}", self.name);
        } else {
            self.bad_request(e);
        }
    }

    fn set_fault(&mut self, f: QueueFault) {
        static FAULT: GuestLog = GuestLog::new("virtio-blk-queue-fault");
        guest_warn!(
            FAULT,
            "virtio-blk {}: {f}: the device needs a reset",
            self.name
        );
        self.fault = Some(f);
    }

    fn add_used(&mut self, mem: &GuestMemoryMmap, head: u16, len: u32) {
        if let Err(source) = self.queues[0].add_used(mem, head, len) {
            self.set_fault(QueueFault::UsedRing {
                queue: QUEUE_NAME,
                source,
            });
        }
    }

    /// The configuration space (`struct virtio_blk_config`, little-endian), up to the
    /// WRITE_ZEROES fields.
    fn config(&self) -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        let mut put = |at: usize, b: &[u8]| c[at..at + b.len()].copy_from_slice(b);
        put(
            offset_of!(virtio_blk_config, capacity),
            &self.disk.sectors.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, size_max),
            &SIZE_MAX.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, seg_max),
            &SEG_MAX.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, blk_size),
            &BLK_SIZE.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, num_queues),
            &1u16.to_le_bytes(),
        );
        if !self.disk.readonly {
            let max = MAX_RANGE_SECTORS.to_le_bytes();
            let segs = MAX_RANGES.to_le_bytes();
            put(offset_of!(virtio_blk_config, max_discard_sectors), &max);
            put(offset_of!(virtio_blk_config, max_discard_seg), &segs);
            // Discards are punched holes: page-sized pieces free space.
            put(
                offset_of!(virtio_blk_config, discard_sector_alignment),
                &8u32.to_le_bytes(),
            );
            put(
                offset_of!(virtio_blk_config, max_write_zeroes_sectors),
                &MAX_WRITE_ZEROES_SECTORS.to_le_bytes(),
            );
            put(offset_of!(virtio_blk_config, max_write_zeroes_seg), &segs);
            put(offset_of!(virtio_blk_config, write_zeroes_may_unmap), &[1]);
        }
        c
    }
}

/// Bytes of configuration space shown: `struct virtio_blk_config` up to `unused1`.
pub(crate) const CONFIG_LEN: usize = offset_of!(virtio_blk_config, max_secure_erase_sectors);

impl<F: DiskFile> VirtioDevice for VirtioBlk<F> {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn features(&self) -> u64 {
        let bits = [
            VIRTIO_BLK_F_SIZE_MAX,
            VIRTIO_BLK_F_SEG_MAX,
            VIRTIO_BLK_F_BLK_SIZE,
            VIRTIO_BLK_F_FLUSH,
        ];
        let rw_bits = [VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_WRITE_ZEROES];
        let mut f = VIRTIO_F_VERSION_1;
        for b in bits {
            f |= 1 << b;
        }
        if self.disk.readonly {
            f |= 1 << VIRTIO_BLK_F_RO;
        } else {
            for b in rw_bits {
                f |= 1 << b;
            }
        }
        f
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let c = self.config();
        for (i, b) in data.iter_mut().enumerate() {
            let at = offset.checked_add(i as u64);
            *b = at.and_then(|a| c.get(a as usize)).copied().unwrap_or(0);
        }
    }

    fn queues(&self) -> &[Queue] {
        &self.queues
    }

    fn queues_mut(&mut self) -> &mut [Queue] {
        &mut self.queues
    }

    fn activate(&mut self, features: u64, _now: Instant) {
        self.disk.features = features;
        let flush = features & (1 << VIRTIO_BLK_F_FLUSH) != 0;
        log::info!(
            "virtio-blk {}: driver ready ({} sectors{}{})",
            self.name,
            self.disk.sectors,
            if self.disk.readonly {
                ", read-only"
            } else {
                ""
            },
            if flush {
                ""
            } else {
                ", no FLUSH: write-through"
            }
        );
    }

    fn reset(&mut self) {
        self.queues[0].reset();
        self.disk.features = 0;
        self.fault = None;
    }

    fn needs_reset(&self) -> bool {
        self.fault.is_some()
    }

    fn queue_notify(&mut self, index: u16, mem: &GuestMemoryMmap, _now: Instant) -> bool {
        self.counts.notifies += 1;
        if index != REQUEST_QUEUE {
            self.counts.bad_notifies += 1;
            self.bad_request(&format_args!(
                "notify of queue {index}, which does not exist"
            ));
            return false;
        }
        let mut used = false;
        // At most one ring's worth, each head once: another vCPU refilling the ring, or
        // avail entries that all name the same chain, cannot keep this vCPU here (under the
        // device lock) for more than the work of one ring of distinct buffers (the blk bench's
        // worst-notify: 256 reads of 254 MiB, 12.3 s, before; one, 43 ms, after). And none once
        // the VM is stopping (a stop or timeout is honoured between two requests; a request
        // left in the ring was never acknowledged). What is left waits for the next notify,
        // and there is one: the chains offered before this notify have distinct heads (a
        // driver offers a buffer again only once it is used), and every chain offered after it
        // began comes with a notify of its own (the device never sets VRING_USED_F_NO_NOTIFY
        // and offers no EVENT_IDX).
        let mut taken = HeadSet::default();
        for _ in 0..self.queues[0].size() {
            if self.fault.is_some() || self.stopping.as_ref().is_some_and(|stop| stop()) {
                break;
            }
            match pop_checked(&mut self.queues[0], QUEUE_NAME, mem) {
                Ok(Some(chain)) if !taken.insert(chain.head) => {
                    // Taken already in this pass: back into the ring for the next notify.
                    let q = &mut self.queues[0];
                    q.set_next_avail(q.next_avail().wrapping_sub(1));
                    break;
                }
                Ok(Some(chain)) => {
                    used = true;
                    self.process(chain, mem);
                }
                Ok(None) => break,
                Err(f) => self.set_fault(f),
            }
        }
        used && queue::wants_interrupt(&mut self.queues[0], mem)
    }
}

/// The heads one notify pass has taken (a queue has at most QUEUE_SIZE descriptors).
#[derive(Default)]
struct HeadSet([u64; QUEUE_SIZE as usize / 64]);

impl HeadSet {
    /// Adds `head`; false if it was there already.
    fn insert(&mut self, head: u16) -> bool {
        let (word, bit) = (usize::from(head / 64) % self.0.len(), head % 64);
        let fresh = self.0[word] & (1 << bit) == 0;
        self.0[word] |= 1 << bit;
        fresh
    }
}

#[cfg(test)]
mod tests;
