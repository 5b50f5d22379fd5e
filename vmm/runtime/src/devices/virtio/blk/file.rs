//! The disk image behind a virtio-blk device: [`DiskFile`], the few operations a request needs
//! (one system call each on a [`RawFile`]), and [`open`], which checks and locks an image.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The sector: the unit of request addresses and sizes, and of the image size.
pub(crate) const SECTOR_SIZE: u64 = 512;

/// What a request may do to the image. Each call returns only once the host kernel has done
/// it (the data is in the page cache, or on stable storage for [`DiskFile::sync_data`]); the
/// device completes a request to the guest only after its calls returned.
pub trait DiskFile: Send {
    /// Reads exactly `buf.len()` bytes at `offset` (pread64).
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset` (pwrite64).
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable (fdatasync).
    fn sync_data(&mut self) -> io::Result<()>;
    /// The guest no longer needs these bytes (fallocate PUNCH_HOLE: they read back as zeroes).
    fn discard(&mut self, offset: u64, len: u64) -> io::Result<()>;
    /// These bytes read back as zeroes (fallocate ZERO_RANGE, else written zeroes).
    fn write_zeroes(&mut self, offset: u64, len: u64) -> io::Result<()>;
}

/// A raw image file: sector `n` is at byte `n * 512`.
pub struct RawFile {
    file: File,
}

impl RawFile {
    pub fn new(file: File) -> Self {
        RawFile { file }
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        // SAFETY: fallocate on a file descriptor this struct owns; no memory is passed.
        // (EINTR is repeated by the caller, `request::retry_interrupted`, as for every call.)
        let r = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off, len) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Largest zero buffer written when the file system cannot zero a range itself.
const ZERO_CHUNK: u64 = 64 * 1024;

impl DiskFile for RawFile {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn discard(&mut self, offset: u64, len: u64) -> io::Result<()> {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        match self.fallocate(mode, offset, len) {
            // A discard is a hint: a file system that cannot punch holes keeps the bytes.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            r => r,
        }
    }

    fn write_zeroes(&mut self, offset: u64, len: u64) -> io::Result<()> {
        let mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        match self.fallocate(mode, offset, len) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
            r => return r,
        }
        let zeroes = vec![0u8; ZERO_CHUNK.min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(ZERO_CHUNK) as usize;
            self.file.write_all_at(&zeroes[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
}

/// Why a disk image cannot be used. The run does not start (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("--disk {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("--disk {path}: not a regular file (a raw image file is needed)")]
    NotAFile { path: PathBuf },
    #[error("--disk {path}: the image is empty")]
    Empty { path: PathBuf },
    #[error("--disk {path}: {size} bytes is not a whole number of 512-byte sectors (pad it, e.g. `truncate -s %512 {path}`)")]
    NotWholeSectors { path: PathBuf, size: u64 },
    #[error("--disk {path}: the image is in use: another process holds a lock on it (another vpmu-vmm or QEMU, or the same image given twice)")]
    Locked { path: PathBuf },
    #[error("--disk {path}: cannot lock the image: {source}")]
    Lock { path: PathBuf, source: io::Error },
}

/// An image opened for a device: the file (locked for as long as it is open), its size and
/// the identity string GET_ID answers.
pub struct DiskImage {
    pub file: RawFile,
    pub sectors: u64,
    pub id: [u8; ID_BYTES],
}

/// Length of the GET_ID answer (VIRTIO_BLK_ID_BYTES).
pub(crate) const ID_BYTES: usize = 20;

/// Opens the raw image at `path` (read-write unless `readonly`) and locks it as QEMU does
/// ([`lock`]): any number of read-only users (vpmu-vmm or QEMU) may share an image, a writer
/// has it alone. Refuses what is not a regular file, an empty image and a size that is not
/// whole sectors.
pub fn open(path: &Path, readonly: bool) -> Result<DiskImage, DiskError> {
    let p = || path.to_path_buf();
    let file = OpenOptions::new()
        .read(true)
        .write(!readonly)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::EISDIR) => DiskError::NotAFile { path: p() },
            _ => DiskError::Open { path: p(), source },
        })?;
    let meta = file
        .metadata()
        .map_err(|source| DiskError::Open { path: p(), source })?;
    if !meta.is_file() {
        return Err(DiskError::NotAFile { path: p() });
    }
    let size = meta.len();
    if size == 0 {
        return Err(DiskError::Empty { path: p() });
    }
    if !size.is_multiple_of(SECTOR_SIZE) {
        return Err(DiskError::NotWholeSectors { path: p(), size });
    }
    lock(&file, readonly).map_err(|e| match e {
        LockError::Held => DiskError::Locked { path: p() },
        LockError::Os(source) => DiskError::Lock { path: p(), source },
    })?;
    Ok(DiskImage {
        file: RawFile::new(file),
        sectors: size / SECTOR_SIZE,
        id: disk_id(path),
    })
}

/// QEMU's lock bytes (block/file-posix.c): a user holding permission `i` takes a shared OFD
/// lock on byte `PERM_BASE + i`; one that does not share permission `i` with others takes
/// byte `SHARED_BASE + i`. Permissions (include/block/block-common.h): 0 consistent read,
/// 1 write, 2 write unchanged, 3 resize.
const PERM_BASE: i64 = 100;
const SHARED_BASE: i64 = 200;
const CONSISTENT_READ: i64 = 0;
const WRITE: i64 = 1;
const RESIZE: i64 = 3;

enum LockError {
    /// Another user's lock conflicts.
    Held,
    Os(io::Error),
}

/// Locks `file` with open-file-description locks on QEMU's lock bytes, then checks for
/// conflicts as QEMU does (raw_apply_lock_bytes, raw_check_lock_bytes): a reader takes
/// consistent read and does not share write; a writer also takes write and does not share
/// write or resize. Conflicts: someone who does not share what we take, or who holds what we
/// do not share. So vpmu-vmm and QEMU (share-rw=off, the default) exclude each other's
/// writers, and two vpmu-vmm runs do too (OFD locks belong to the open file, so even within
/// one process). The locks go with the file's last descriptor.
fn lock(file: &File, readonly: bool) -> Result<(), LockError> {
    let (take, unshared): (&[i64], &[i64]) = if readonly {
        (&[CONSISTENT_READ], &[WRITE])
    } else {
        (&[CONSISTENT_READ, WRITE], &[WRITE, RESIZE])
    };
    let held = take.iter().map(|p| PERM_BASE + p);
    for b in held.chain(unshared.iter().map(|p| SHARED_BASE + p)) {
        ofd_lock(file, b).map_err(|e| match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => LockError::Held,
            _ => LockError::Os(e),
        })?;
    }
    let refused_by_others = take.iter().map(|p| SHARED_BASE + p);
    for b in refused_by_others.chain(unshared.iter().map(|p| PERM_BASE + p)) {
        if ofd_held_by_other(file, b).map_err(LockError::Os)? {
            return Err(LockError::Held);
        }
    }
    Ok(())
}

fn ofd_request(kind: libc::c_int, byte: i64) -> libc::flock {
    // SAFETY: `flock` is plain data; all-zero is a valid value, and the fields that matter
    // are set below.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = byte;
    l.l_len = 1;
    l
}

/// A shared (read) OFD lock on byte `byte` of `file`, without waiting.
fn ofd_lock(file: &File, byte: i64) -> io::Result<()> {
    let l = ofd_request(libc::F_RDLCK, byte);
    // SAFETY: F_OFD_SETLK reads the `flock` passed by reference, which lives for the call.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &l) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether another open file holds a lock on byte `byte` (F_OFD_GETLK of a write lock).
fn ofd_held_by_other(file: &File, byte: i64) -> io::Result<bool> {
    let mut l = ofd_request(libc::F_WRLCK, byte);
    // SAFETY: F_OFD_GETLK writes the `flock` passed by reference, which lives for the call.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut l) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(l.l_type != libc::F_UNLCK as libc::c_short)
}

/// The GET_ID answer: the image's file name, cut to 20 bytes, zero-padded (Linux shows it as
/// /sys/block/vdX/serial and /dev/disk/by-id/virtio-NAME).
pub(crate) fn disk_id(path: &Path) -> [u8; ID_BYTES] {
    let mut id = [0u8; ID_BYTES];
    let name = path
        .file_name()
        .map(|n| n.as_encoded_bytes())
        .unwrap_or(b"");
    let n = name.len().min(ID_BYTES);
    id[..n].copy_from_slice(&name[..n]);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(dir: &Path, name: &str, size: u64) -> PathBuf {
        let p = dir.join(name);
        let f = File::create(&p).unwrap();
        f.set_len(size).unwrap();
        p
    }

    #[test]
    fn images_are_checked_and_locked() {
        let dir = tempfile::tempdir().unwrap();
        let good = image(dir.path(), "good.img", 8 * SECTOR_SIZE);
        let d = open(&good, false).unwrap();
        assert_eq!(d.sectors, 8);
        assert_eq!(&d.id[..8], b"good.img");
        assert_eq!(d.id[8..], [0; 12]);
        // A second user: refused while the first holds its lock, read-only or not.
        let e = open(&good, false).err().unwrap();
        assert!(matches!(e, DiskError::Locked { .. }), "{e}");
        assert!(e.to_string().contains("another process holds a lock"));
        assert!(matches!(open(&good, true), Err(DiskError::Locked { .. })));
        drop(d);
        // Read-only users share the image; a writer is then refused.
        let r1 = open(&good, true).unwrap();
        let _r2 = open(&good, true).unwrap();
        assert!(matches!(open(&good, false), Err(DiskError::Locked { .. })));
        drop(r1);

        let odd = image(dir.path(), "odd.img", 1000);
        let e = open(&odd, false).err().unwrap();
        assert!(
            matches!(e, DiskError::NotWholeSectors { size: 1000, .. }),
            "{e}"
        );
        let empty = image(dir.path(), "empty.img", 0);
        assert!(matches!(open(&empty, false), Err(DiskError::Empty { .. })));
        assert!(matches!(
            open(dir.path(), true),
            Err(DiskError::NotAFile { .. })
        ));
        let e = open(&dir.path().join("missing.img"), false).err().unwrap();
        assert!(matches!(e, DiskError::Open { .. }), "{e}");
        assert!(e.to_string().contains("missing.img"), "{e}");
    }

    /// Takes a shared OFD lock on each of `bytes` of `path` as QEMU's file-posix driver
    /// does (raw_apply_lock_bytes); the locks last as long as the returned file.
    fn qemu_locks(path: &Path, bytes: &[i64]) -> File {
        let f = OpenOptions::new().read(true).open(path).unwrap();
        for &b in bytes {
            ofd_lock(&f, b).unwrap();
        }
        f
    }

    #[test]
    fn images_interlock_with_qemu_s_byte_locks() {
        let dir = tempfile::tempdir().unwrap();
        let img = image(dir.path(), "q.img", 8 * SECTOR_SIZE);
        // QEMU writing the image (default share-rw=off): consistent read and write taken
        // (bytes 100, 101), write and resize not shared (201, 203).
        let writer = qemu_locks(&img, &[100, 101, 201, 203]);
        assert!(matches!(open(&img, true), Err(DiskError::Locked { .. })));
        assert!(matches!(open(&img, false), Err(DiskError::Locked { .. })));
        drop(writer);
        // QEMU reading it (readonly=on): consistent read taken, write not shared.
        let reader = qemu_locks(&img, &[100, 201]);
        assert!(matches!(open(&img, false), Err(DiskError::Locked { .. })));
        let ro = open(&img, true).unwrap();
        drop(reader);
        // And QEMU sees ours: a read-only vpmu-vmm does not share write (201), a writer holds
        // write (101), which is what QEMU tests before it takes the permission.
        assert!(ofd_held_by_other(&qemu_locks(&img, &[]), 201).unwrap());
        drop(ro);
        let rw = open(&img, false).unwrap();
        let probe = qemu_locks(&img, &[]);
        assert!(ofd_held_by_other(&probe, 101).unwrap());
        assert!(ofd_held_by_other(&probe, 201).unwrap());
        drop(rw);
        assert!(!ofd_held_by_other(&probe, 101).unwrap());
    }

    #[test]
    fn raw_file_reads_writes_and_zeroes() {
        let dir = tempfile::tempdir().unwrap();
        let p = image(dir.path(), "d.img", 64 * 1024 * 4);
        let mut f = RawFile::new(OpenOptions::new().read(true).write(true).open(&p).unwrap());
        f.write_at(&[0xab; 4096], 8192).unwrap();
        f.sync_data().unwrap();
        let mut b = [0u8; 4096];
        f.read_at(&mut b, 8192).unwrap();
        assert_eq!(b, [0xab; 4096]);
        f.write_zeroes(8192, 1024).unwrap();
        f.read_at(&mut b, 8192).unwrap();
        assert_eq!(b[..1024], [0; 1024]);
        assert_eq!(b[1024..], [0xab; 3072]);
        f.discard(8192, 4096).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().len(),
            64 * 1024 * 4,
            "size kept"
        );
        // Past the end: an error, not a short read.
        assert!(f.read_at(&mut b, 64 * 1024 * 4 - 512).is_err());
    }
}
