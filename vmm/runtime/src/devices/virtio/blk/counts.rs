//! What a block device counted ([`BlkCounts`]) and what the end-of-run report shows of a disk
//! ([`DiskReport`]).

use std::path::PathBuf;

use super::request::Kind;
use super::VirtioBlk;
use crate::devices::virtio::mmio::MmioTransport;

/// What the device counted: requests by type, bytes, and the ones that failed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlkCounts {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub get_ids: u64,
    pub discards: u64,
    pub write_zeroes: u64,
    /// Requests of a type the device does not implement.
    pub other: u64,
    /// Bytes read from / written to the image by successful reads and writes.
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Requests answered VIRTIO_BLK_S_IOERR / VIRTIO_BLK_S_UNSUPP.
    pub io_errors: u64,
    pub unsupported: u64,
    /// Chains with no status byte (returned unused, used length 0).
    pub no_status: u64,
    /// Times the driver notified the queue.
    pub notifies: u64,
    /// Notifies of a queue that does not exist (counted with the bad requests).
    pub bad_notifies: u64,
}

impl BlkCounts {
    pub(super) fn count(&mut self, kind: Kind) {
        let c = match kind {
            Kind::Read => &mut self.reads,
            Kind::Write => &mut self.writes,
            Kind::Flush => &mut self.flushes,
            Kind::GetId => &mut self.get_ids,
            Kind::Discard => &mut self.discards,
            Kind::WriteZeroes => &mut self.write_zeroes,
            Kind::Other(_) => &mut self.other,
        };
        *c += 1;
    }

    pub(super) fn bad_requests(&self) -> u64 {
        self.io_errors + self.unsupported + self.no_status + self.bad_notifies
    }
}

/// What one disk counted, for the end-of-run report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskReport {
    pub path: PathBuf,
    pub readonly: bool,
    pub sectors: u64,
    pub counts: BlkCounts,
    /// virtio-mmio status register at the end (0xf: the driver is up), interrupts raised.
    pub status: u32,
    pub interrupts: u64,
    pub bad_accesses: u64,
    /// The queue fault that stopped the device, if the driver broke its queue.
    pub fault: Option<String>,
}

impl DiskReport {
    pub(crate) fn from_device(path: PathBuf, t: &MmioTransport<VirtioBlk>) -> Self {
        let d = t.device();
        DiskReport {
            path,
            readonly: d.readonly(),
            sectors: d.sectors(),
            counts: d.counts.clone(),
            status: t.status(),
            interrupts: t.interrupts,
            bad_accesses: t.bad_accesses,
            fault: d.fault().map(|f| f.to_string()),
        }
    }
}
