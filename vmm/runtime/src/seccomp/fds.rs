//! What each of the VMM's file descriptors is, for the SIGSYS report of a forbidden `ioctl`
//! ("on fd 14, a KVM vCPU"), read there without a system call or an allocation: a fixed table of
//! atomics filled from `/proc/self/fd` once the VM is built ([`snapshot`], before any thread is
//! confined) and by the code that opens descriptors later ([`note`]: perf events on the vCPU
//! threads).

use std::sync::atomic::{AtomicU8, Ordering};

/// Descriptors past this are reported as "unknown".
const MAX_FDS: usize = 4096;

static KINDS: [AtomicU8; MAX_FDS] = [const { AtomicU8::new(0) }; MAX_FDS];

/// What a descriptor refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum FdKind {
    Unknown = 0,
    /// /dev/kvm (system ioctls).
    Kvm,
    /// A KVM VM.
    KvmVm,
    /// A KVM vCPU.
    KvmVcpu,
    /// A perf event.
    Perf,
    /// An eventfd (irqfd, ioeventfd).
    EventFd,
    /// A terminal.
    Tty,
    /// A regular file or another path (disk image, trace, console).
    File,
    /// Anything else (socket, pipe, other anonymous inode).
    Other,
}

impl FdKind {
    const ALL: [FdKind; 9] = [
        FdKind::Unknown,
        FdKind::Kvm,
        FdKind::KvmVm,
        FdKind::KvmVcpu,
        FdKind::Perf,
        FdKind::EventFd,
        FdKind::Tty,
        FdKind::File,
        FdKind::Other,
    ];

    /// As the report says it: "a KVM vCPU".
    pub(crate) fn name(self) -> &'static str {
        match self {
            FdKind::Unknown => "of unknown kind",
            FdKind::Kvm => "/dev/kvm",
            FdKind::KvmVm => "a KVM VM",
            FdKind::KvmVcpu => "a KVM vCPU",
            FdKind::Perf => "a perf event",
            FdKind::EventFd => "an eventfd",
            FdKind::Tty => "a terminal",
            FdKind::File => "a file",
            FdKind::Other => "another kind (socket, pipe, anonymous inode)",
        }
    }

    /// The kind `/proc/self/fd/N` names with its link.
    pub(crate) fn of_link(link: &str) -> FdKind {
        match link {
            "/dev/kvm" => FdKind::Kvm,
            "anon_inode:kvm-vm" => FdKind::KvmVm,
            l if l.starts_with("anon_inode:kvm-vcpu") => FdKind::KvmVcpu,
            "anon_inode:[perf_event]" => FdKind::Perf,
            "anon_inode:[eventfd]" => FdKind::EventFd,
            l if l.starts_with("/dev/pts/") || l.starts_with("/dev/tty") => FdKind::Tty,
            l if l.starts_with('/') => FdKind::File,
            _ => FdKind::Other,
        }
    }
}

/// Records that `fd` is a `kind` (a descriptor opened after [`snapshot`]).
pub(crate) fn note(fd: i32, kind: FdKind) {
    if let Some(slot) = usize::try_from(fd).ok().and_then(|i| KINDS.get(i)) {
        slot.store(kind as u8, Ordering::Relaxed);
    }
}

/// What `fd` is, as far as the table knows (async-signal-safe: one atomic load).
pub(crate) fn kind_of(fd: i64) -> FdKind {
    let k = usize::try_from(fd)
        .ok()
        .and_then(|i| KINDS.get(i))
        .map_or(0, |s| s.load(Ordering::Relaxed));
    FdKind::ALL
        .get(usize::from(k))
        .copied()
        .unwrap_or(FdKind::Unknown)
}

/// Fills the table from `/proc/self/fd` (on the unconfined thread that built the VM).
pub(crate) fn snapshot() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for entry in dir.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if let Ok(link) = std::fs::read_link(entry.path()) {
            note(fd, FdKind::of_link(&link.to_string_lossy()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_name_their_kind() {
        assert_eq!(FdKind::of_link("anon_inode:kvm-vcpu:0"), FdKind::KvmVcpu);
        assert_eq!(FdKind::of_link("anon_inode:kvm-vm"), FdKind::KvmVm);
        assert_eq!(FdKind::of_link("/dev/kvm"), FdKind::Kvm);
        assert_eq!(FdKind::of_link("anon_inode:[perf_event]"), FdKind::Perf);
        assert_eq!(FdKind::of_link("anon_inode:[eventfd]"), FdKind::EventFd);
        assert_eq!(FdKind::of_link("/dev/pts/3"), FdKind::Tty);
        assert_eq!(FdKind::of_link("/tmp/disk.img"), FdKind::File);
        assert_eq!(FdKind::of_link("socket:[1234]"), FdKind::Other);
    }

    #[test]
    fn the_table_answers_what_it_was_told_and_unknown_otherwise() {
        note(4000, FdKind::Perf);
        assert_eq!(kind_of(4000), FdKind::Perf);
        assert_eq!(kind_of(-1), FdKind::Unknown);
        assert_eq!(kind_of(1 << 20), FdKind::Unknown);
        note(1 << 20, FdKind::Perf); // past the table: ignored
        snapshot();
        // This test binary's /dev/null or a file on fd 0..2, at least: never a KVM vCPU.
        assert_ne!(kind_of(0), FdKind::KvmVcpu);
    }
}
