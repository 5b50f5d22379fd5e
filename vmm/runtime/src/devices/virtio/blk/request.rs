//! One virtio-blk request: the descriptor chain split into its parts ([`Buffers`]), checked
//! against the image and the negotiated features, and carried out on a [`DiskFile`]
//! ([`Disk::execute`]). Nothing here writes the status byte or the used ring: the device does
//! that after `execute` returned, so a request completes only after its system calls did.

use std::io;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_WRITE_ZEROES, VIRTIO_BLK_S_IOERR,
    VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID,
    VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES,
};
use virtio_queue::desc::split::Descriptor;
use vm_memory::{GuestAddress, GuestMemoryError, GuestMemoryMmap};

use super::file::{DiskFile, ID_BYTES, SECTOR_SIZE};
use crate::devices::virtio::segments::Segments;

/// The request header: type, reserved, sector (`struct virtio_blk_outhdr`).
pub(crate) const HEADER_LEN: u64 = 16;
/// One DISCARD / WRITE_ZEROES range: sector, number of sectors, flags.
pub(crate) const SEGMENT_LEN: u64 = 16;
/// Ranges per DISCARD / WRITE_ZEROES request (config max_discard_seg, max_write_zeroes_seg).
pub(crate) const MAX_RANGES: u32 = 1;
/// Sectors per DISCARD range (config max_discard_sectors): 2 GiB (a punched hole).
pub(crate) const MAX_RANGE_SECTORS: u32 = 1 << 22;
/// Sectors per WRITE_ZEROES range (config max_write_zeroes_sectors): 64 MiB, because where the
/// file system cannot zero a range the device writes the zeroes, on the notifying vCPU.
pub(crate) const MAX_WRITE_ZEROES_SECTORS: u32 = 1 << 17;
/// WRITE_ZEROES flag: the device may unmap (punch a hole) instead of writing zeroes.
const WRITE_ZEROES_UNMAP: u32 = 1;
/// Largest piece of a read or write copied through the bounce buffer at once.
const CHUNK: usize = 128 * 1024;
/// Times one call on the image is repeated after EINTR before the request fails with it.
const EINTR_RETRIES: u32 = 16;

/// Runs `call` (one [`DiskFile`] operation) again while it fails with EINTR, at most
/// [`EINTR_RETRIES`] times: an interrupted call did not complete, and each operation names its
/// offset, so repeating it whole is safe. Other errors are returned at once.
fn retry_interrupted<T>(mut call: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut retries = 0;
    loop {
        match call() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted && retries < EINTR_RETRIES => {
                retries += 1;
            }
            r => return r,
        }
    }
}

/// The request types, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
    Flush,
    GetId,
    Discard,
    WriteZeroes,
    /// A type this device does not implement (or a header too short to hold one).
    Other(u32),
}

impl Kind {
    fn of(t: u32) -> Kind {
        match t {
            VIRTIO_BLK_T_IN => Kind::Read,
            VIRTIO_BLK_T_OUT => Kind::Write,
            VIRTIO_BLK_T_FLUSH => Kind::Flush,
            VIRTIO_BLK_T_GET_ID => Kind::GetId,
            VIRTIO_BLK_T_DISCARD => Kind::Discard,
            VIRTIO_BLK_T_WRITE_ZEROES => Kind::WriteZeroes,
            t => Kind::Other(t),
        }
    }

    pub(crate) fn writes(self) -> bool {
        matches!(self, Kind::Write | Kind::Discard | Kind::WriteZeroes)
    }
}

/// A chain the device cannot even answer: there is no device-writable byte at its end for the
/// status. It is returned to the driver unused (used length 0) and counted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChainError {
    #[error("descriptor chain without a device-writable status byte at its end")]
    NoStatus,
}

/// Why a request failed; the guest gets [`RequestError::status`] and the device a log line.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    #[error("request header of {0} bytes (16 needed)")]
    ShortHeader(u64),
    #[error("device-readable descriptor after a device-writable one")]
    Misordered,
    #[error("{0:?} request with no data")]
    NoData(Kind),
    #[error("{0:?} request of {1} bytes, not whole 512-byte sectors")]
    PartialSector(Kind, u64),
    #[error("{kind:?} of {count} sectors at sector {sector}: past the end of the disk ({capacity} sectors)")]
    OutOfRange {
        kind: Kind,
        sector: u64,
        count: u64,
        capacity: u64,
    },
    #[error("a buffer of {0} bytes (the device offers size_max {max})", max = super::SIZE_MAX)]
    SegmentTooLarge(u64),
    #[error("{0:?} on a read-only disk")]
    ReadOnly(Kind),
    #[error("{0:?} request, but the driver did not accept its feature")]
    NotNegotiated(Kind),
    #[error("request type {0} is not supported")]
    Unsupported(u32),
    #[error("{0:?} with {1} bytes of ranges (1 range of 16 bytes accepted)")]
    BadRanges(Kind, u64),
    #[error("{0:?} range of {1} sectors (at most {2})")]
    RangeTooLong(Kind, u32, u32),
    #[error("{0:?} range with flags {1:#x}")]
    RangeFlags(Kind, u32),
    #[error("guest memory: {0}")]
    Memory(#[from] GuestMemoryError),
    #[error("{op} on the image: {source}")]
    Io { op: &'static str, source: io::Error },
    #[error("an earlier fdatasync of the image failed: writes may be lost, so no flush succeeds")]
    SyncFailedBefore,
}

impl RequestError {
    /// The status byte the guest gets: UNSUPP for what the device does not do, IOERR else.
    pub(crate) fn status(&self) -> u8 {
        match self {
            RequestError::Unsupported(_)
            | RequestError::NotNegotiated(_)
            | RequestError::RangeFlags(..) => VIRTIO_BLK_S_UNSUPP as u8,
            _ => VIRTIO_BLK_S_IOERR as u8,
        }
    }
}

/// A request's chain split into what the driver gives (header, then data for writes) and
/// what it takes (data for reads and GET_ID), the status byte apart.
#[derive(Debug)]
pub(crate) struct Buffers {
    pub readable: Segments,
    /// The device-writable bytes before the status byte.
    pub writable: Segments,
    pub status: GuestAddress,
    /// A readable descriptor came after a writable one (the request is refused).
    misordered: bool,
}

impl Buffers {
    /// Splits a chain (already checked by `queue::pop_checked`: indices, loops, memory).
    pub(crate) fn split(chain: impl Iterator<Item = Descriptor>) -> Result<Buffers, ChainError> {
        let (mut readable, mut writable) = (Vec::new(), Vec::new());
        let (mut misordered, mut last_writable) = (false, false);
        for d in chain {
            let piece = (d.addr(), u64::from(d.len()));
            last_writable = d.is_write_only();
            if last_writable {
                writable.push(piece);
            } else {
                misordered |= !writable.is_empty();
                readable.push(piece);
            }
        }
        // The status byte is the last byte of the chain, in a device-writable descriptor.
        if !last_writable {
            return Err(ChainError::NoStatus);
        }
        let mut writable = Segments::new(writable);
        let total = writable.len();
        if total == 0 {
            return Err(ChainError::NoStatus);
        }
        let last = writable.range(total - 1, 1).first();
        writable = writable.range(0, total - 1);
        Ok(Buffers {
            readable: Segments::new(readable),
            writable,
            status: last,
            misordered,
        })
    }
}

/// The image and what the device knows about it; carries out requests.
pub(crate) struct Disk<F> {
    pub file: F,
    pub sectors: u64,
    pub readonly: bool,
    pub id: [u8; ID_BYTES],
    /// The features the driver accepted (at DRIVER_OK).
    pub features: u64,
    /// An fdatasync failed: the page cache may have dropped writes, so no later flush may
    /// report success (a later fdatasync could, falsely).
    sync_failed: bool,
    bounce: Vec<u8>,
}

impl<F: DiskFile> Disk<F> {
    pub(crate) fn new(file: F, sectors: u64, readonly: bool, id: [u8; ID_BYTES]) -> Self {
        Disk {
            file,
            sectors,
            readonly,
            id,
            features: 0,
            sync_failed: false,
            bounce: Vec::new(),
        }
    }

    fn accepted(&self, bit: u32) -> bool {
        self.features & (1 << bit) != 0
    }

    /// The request's type from its header, and the header's sector.
    pub(crate) fn header(
        &self,
        mem: &GuestMemoryMmap,
        b: &Buffers,
    ) -> Result<(Kind, u64), RequestError> {
        let have = b.readable.len();
        if have < HEADER_LEN {
            return Err(RequestError::ShortHeader(have));
        }
        let mut h = [0u8; HEADER_LEN as usize];
        b.readable.read(mem, &mut h)?;
        let t = u32::from_le_bytes(h[0..4].try_into().expect("4 bytes"));
        let sector = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
        Ok((Kind::of(t), sector))
    }

    /// Carries out the request of `kind` at `sector`; returns the number of bytes written
    /// into the guest's writable buffers (the status byte not included).
    pub(crate) fn execute(
        &mut self,
        mem: &GuestMemoryMmap,
        b: &Buffers,
        kind: Kind,
        sector: u64,
    ) -> Result<u64, RequestError> {
        if b.misordered {
            return Err(RequestError::Misordered);
        }
        // What the config space promised the driver it need not exceed (size_max): a chain
        // cannot carry more than SEG_MAX x SIZE_MAX bytes.
        let longest = b.readable.longest().max(b.writable.longest());
        if longest > u64::from(super::SIZE_MAX) {
            return Err(RequestError::SegmentTooLarge(longest));
        }
        if self.readonly && kind.writes() {
            return Err(RequestError::ReadOnly(kind));
        }
        let data_in = b.readable.range(HEADER_LEN, u64::MAX);
        match kind {
            Kind::Read => {
                let n = self.check_range(kind, sector, b.writable.len())?;
                self.read(mem, &b.writable, sector, n)?;
                Ok(n)
            }
            Kind::Write => {
                let n = self.check_range(kind, sector, data_in.len())?;
                self.write(mem, &data_in, sector, n)?;
                if !self.accepted(VIRTIO_BLK_F_FLUSH) {
                    // A driver without FLUSH gets a write-through disk.
                    self.sync()?;
                }
                Ok(0)
            }
            Kind::Flush => {
                if !self.readonly {
                    self.sync()?;
                }
                Ok(0)
            }
            Kind::GetId => {
                let n = (b.writable.len()).min(ID_BYTES as u64) as usize;
                b.writable.write(mem, &self.id[..n])?;
                Ok(n as u64)
            }
            Kind::Discard | Kind::WriteZeroes => {
                let bit = if kind == Kind::Discard {
                    VIRTIO_BLK_F_DISCARD
                } else {
                    VIRTIO_BLK_F_WRITE_ZEROES
                };
                if !self.accepted(bit) {
                    return Err(RequestError::NotNegotiated(kind));
                }
                self.ranges(mem, &data_in, kind)?;
                if !self.accepted(VIRTIO_BLK_F_FLUSH) {
                    // Write-through, as for a write: zeroes read back after a crash too.
                    self.sync()?;
                }
                Ok(0)
            }
            Kind::Other(t) => Err(RequestError::Unsupported(t)),
        }
    }

    /// Checks `len` bytes at `sector` are whole sectors inside the disk; returns `len`.
    fn check_range(&self, kind: Kind, sector: u64, len: u64) -> Result<u64, RequestError> {
        if len == 0 {
            return Err(RequestError::NoData(kind));
        }
        if !len.is_multiple_of(SECTOR_SIZE) {
            return Err(RequestError::PartialSector(kind, len));
        }
        self.check_sectors(kind, sector, len / SECTOR_SIZE)?;
        Ok(len)
    }

    fn check_sectors(&self, kind: Kind, sector: u64, count: u64) -> Result<(), RequestError> {
        match sector.checked_add(count) {
            Some(end) if end <= self.sectors => Ok(()),
            _ => Err(RequestError::OutOfRange {
                kind,
                sector,
                count,
                capacity: self.sectors,
            }),
        }
    }

    fn bounce(&mut self, n: usize) -> Vec<u8> {
        let mut b = std::mem::take(&mut self.bounce);
        b.resize(n.min(CHUNK), 0);
        b
    }

    fn read(
        &mut self,
        mem: &GuestMemoryMmap,
        to: &Segments,
        sector: u64,
        n: u64,
    ) -> Result<(), RequestError> {
        let mut buf = self.bounce(n as usize);
        let mut done = 0;
        let r = loop {
            if done == n {
                break Ok(());
            }
            let k = (n - done).min(buf.len() as u64);
            let chunk = &mut buf[..k as usize];
            let offset = sector * SECTOR_SIZE + done;
            if let Err(source) = retry_interrupted(|| self.file.read_at(chunk, offset)) {
                break Err(RequestError::Io {
                    op: "pread",
                    source,
                });
            }
            if let Err(e) = to.range(done, k).write(mem, chunk) {
                break Err(e.into());
            }
            done += k;
        };
        self.bounce = buf;
        r
    }

    fn write(
        &mut self,
        mem: &GuestMemoryMmap,
        from: &Segments,
        sector: u64,
        n: u64,
    ) -> Result<(), RequestError> {
        let mut buf = self.bounce(n as usize);
        let mut done = 0;
        let r = loop {
            if done == n {
                break Ok(());
            }
            let k = (n - done).min(buf.len() as u64);
            let chunk = &mut buf[..k as usize];
            if let Err(e) = from.range(done, k).read(mem, chunk) {
                break Err(e.into());
            }
            let offset = sector * SECTOR_SIZE + done;
            if let Err(source) = retry_interrupted(|| self.file.write_at(chunk, offset)) {
                break Err(RequestError::Io {
                    op: "pwrite",
                    source,
                });
            }
            done += k;
        };
        self.bounce = buf;
        r
    }

    fn sync(&mut self) -> Result<(), RequestError> {
        if self.sync_failed {
            return Err(RequestError::SyncFailedBefore);
        }
        retry_interrupted(|| self.file.sync_data()).map_err(|source| {
            self.sync_failed = true;
            RequestError::Io {
                op: "fdatasync",
                source,
            }
        })
    }

    /// DISCARD / WRITE_ZEROES: one range (sector, count, flags) after the header.
    fn ranges(
        &mut self,
        mem: &GuestMemoryMmap,
        data: &Segments,
        kind: Kind,
    ) -> Result<(), RequestError> {
        if data.len() != SEGMENT_LEN * u64::from(MAX_RANGES) {
            return Err(RequestError::BadRanges(kind, data.len()));
        }
        let mut r = [0u8; SEGMENT_LEN as usize];
        data.read(mem, &mut r)?;
        let sector = u64::from_le_bytes(r[0..8].try_into().expect("8 bytes"));
        let count = u32::from_le_bytes(r[8..12].try_into().expect("4 bytes"));
        let flags = u32::from_le_bytes(r[12..16].try_into().expect("4 bytes"));
        let allowed = if kind == Kind::WriteZeroes {
            WRITE_ZEROES_UNMAP
        } else {
            0
        };
        if flags & !allowed != 0 {
            return Err(RequestError::RangeFlags(kind, flags));
        }
        let max = if kind == Kind::WriteZeroes {
            MAX_WRITE_ZEROES_SECTORS
        } else {
            MAX_RANGE_SECTORS
        };
        if count > max {
            return Err(RequestError::RangeTooLong(kind, count, max));
        }
        self.check_sectors(kind, sector, u64::from(count))?;
        let (offset, len) = (sector * SECTOR_SIZE, u64::from(count) * SECTOR_SIZE);
        let r = if kind == Kind::Discard {
            retry_interrupted(|| self.file.discard(offset, len)).map_err(|s| ("discard", s))
        } else {
            retry_interrupted(|| self.file.write_zeroes(offset, len)).map_err(|s| ("zero", s))
        };
        r.map_err(|(op, source)| RequestError::Io { op, source })
    }
}
