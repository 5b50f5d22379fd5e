//! What a VM exit was about, as a trace record keeps it: the [`Reason`] byte and the
//! [`ExitEvent`] detail. The VMM derives both from KVM's exit, once per exit (`runtime::exit::kind`);
//! the readers here know them only as data.

use std::fmt;

/// Why KVM_RUN returned (or what a sample interrupted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Reason {
    IoIn = 1,
    IoOut = 2,
    MmioRead = 3,
    MmioWrite = 4,
    MsrRead = 5,
    MsrWrite = 6,
    Hlt = 7,
    /// KVM_RUN returned EINTR: a kick signal (stop request, counter overflow, profile sample).
    Interrupted = 8,
    /// KVM_EXIT_INTERNAL_ERROR (on this host: an emulation failure the VMM completes).
    InternalError = 9,
    Shutdown = 10,
    SystemEvent = 11,
    IrqWindowOpen = 12,
    IoapicEoi = 13,
    FailEntry = 14,
    /// KVM_RUN failed with an error other than EINTR/EAGAIN.
    KvmError = 15,
    Other = 16,
}

impl Reason {
    pub const ALL: [Reason; 16] = [
        Reason::IoIn,
        Reason::IoOut,
        Reason::MmioRead,
        Reason::MmioWrite,
        Reason::MsrRead,
        Reason::MsrWrite,
        Reason::Hlt,
        Reason::Interrupted,
        Reason::InternalError,
        Reason::Shutdown,
        Reason::SystemEvent,
        Reason::IrqWindowOpen,
        Reason::IoapicEoi,
        Reason::FailEntry,
        Reason::KvmError,
        Reason::Other,
    ];

    pub(crate) fn from_u8(v: u8) -> Option<Reason> {
        Reason::ALL.get(usize::from(v).wrapping_sub(1)).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            Reason::IoIn => "pio-in",
            Reason::IoOut => "pio-out",
            Reason::MmioRead => "mmio-read",
            Reason::MmioWrite => "mmio-write",
            Reason::MsrRead => "msr-read",
            Reason::MsrWrite => "msr-write",
            Reason::Hlt => "hlt",
            Reason::Interrupted => "interrupted",
            Reason::InternalError => "internal-error",
            Reason::Shutdown => "shutdown",
            Reason::SystemEvent => "system-event",
            Reason::IrqWindowOpen => "irq-window",
            Reason::IoapicEoi => "ioapic-eoi",
            Reason::FailEntry => "fail-entry",
            Reason::KvmError => "kvm-error",
            Reason::Other => "other",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a VM exit was about: what the VMM derives from the exit (and the part of a trace
/// record that describes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExitEvent {
    pub reason: Reason,
    /// Port or MSR index.
    pub detail: u32,
    /// MMIO address.
    pub addr: u64,
    /// bit 0 write/out, bits 1..=4 access size.
    pub flags: u8,
}

impl ExitEvent {
    pub fn new(reason: Reason) -> Self {
        ExitEvent {
            reason,
            detail: 0,
            addr: 0,
            flags: 0,
        }
    }

    pub fn size(&self) -> u8 {
        (self.flags >> 1) & 0xf
    }

    /// `pio 0x2f8 out 1`, `msr 0xc0010004 rd`, `mmio 0xfee000b0 wr 4`, `hlt`...
    pub fn describe(&self) -> String {
        match self.reason {
            Reason::IoIn | Reason::IoOut => format!(
                "pio {:#x} {} {}",
                self.detail,
                if self.reason == Reason::IoOut {
                    "out"
                } else {
                    "in"
                },
                self.size()
            ),
            Reason::MsrRead => format!("msr {:#x} rd", self.detail),
            Reason::MsrWrite => format!("msr {:#x} wr", self.detail),
            Reason::MmioRead | Reason::MmioWrite => format!(
                "mmio {:#x} {} {}",
                self.addr,
                if self.reason == Reason::MmioWrite {
                    "wr"
                } else {
                    "rd"
                },
                self.size()
            ),
            r => r.name().to_string(),
        }
    }
}
