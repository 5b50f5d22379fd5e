//! What a VM exit was about, classified ONCE per exit, from the exit *before*
//! [`crate::exit::handle`] consumes it: a pure function, unit-tested with hand-made exits. The
//! vCPU loop shares the result with the trace recorder (`trace::recorder`, whose file format
//! encodes [`Reason`] as a byte), the last-exits ring (`last_exits`) and the exit counts
//! ([`super::ExitCounts::count`]).

use kvm_ioctls::VcpuExit;

pub use analysis::exit_reason::{ExitEvent, Reason};

fn sized(reason: Reason, write: bool, size: usize) -> ExitEvent {
    ExitEvent {
        flags: u8::from(write) | (((size.min(15)) as u8) << 1),
        ..ExitEvent::new(reason)
    }
}

/// The trace record's reason and detail for one return of KVM_RUN.
pub fn classify(r: &Result<VcpuExit<'_>, kvm_ioctls::Error>) -> ExitEvent {
    let exit = match r {
        Ok(e) => e,
        Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
            return ExitEvent::new(Reason::Interrupted)
        }
        Err(e) => {
            return ExitEvent {
                detail: e.errno() as u32,
                ..ExitEvent::new(Reason::KvmError)
            }
        }
    };
    match exit {
        VcpuExit::IoIn(port, data) => ExitEvent {
            detail: u32::from(*port),
            ..sized(Reason::IoIn, false, data.len())
        },
        VcpuExit::IoOut(port, data) => ExitEvent {
            detail: u32::from(*port),
            ..sized(Reason::IoOut, true, data.len())
        },
        VcpuExit::MmioRead(addr, data) => ExitEvent {
            addr: *addr,
            ..sized(Reason::MmioRead, false, data.len())
        },
        VcpuExit::MmioWrite(addr, data) => ExitEvent {
            addr: *addr,
            ..sized(Reason::MmioWrite, true, data.len())
        },
        VcpuExit::X86Rdmsr(m) => ExitEvent {
            detail: m.index,
            ..ExitEvent::new(Reason::MsrRead)
        },
        VcpuExit::X86Wrmsr(m) => ExitEvent {
            detail: m.index,
            ..sized(Reason::MsrWrite, true, 0)
        },
        VcpuExit::Hlt => ExitEvent::new(Reason::Hlt),
        VcpuExit::Intr => ExitEvent::new(Reason::Interrupted),
        VcpuExit::InternalError => ExitEvent::new(Reason::InternalError),
        VcpuExit::Shutdown => ExitEvent::new(Reason::Shutdown),
        VcpuExit::SystemEvent(kind, _) => ExitEvent {
            detail: *kind,
            ..ExitEvent::new(Reason::SystemEvent)
        },
        VcpuExit::IrqWindowOpen => ExitEvent::new(Reason::IrqWindowOpen),
        VcpuExit::IoapicEoi(v) => ExitEvent {
            detail: u32::from(*v),
            ..ExitEvent::new(Reason::IoapicEoi)
        },
        VcpuExit::FailEntry(reason, _) => ExitEvent {
            detail: *reason as u32,
            ..ExitEvent::new(Reason::FailEntry)
        },
        _ => ExitEvent::new(Reason::Other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_io_has_port_direction_and_size() {
        let mut d2 = [0u8; 2];
        let e = classify(&Ok(VcpuExit::IoIn(0x3fd, &mut d2)));
        assert_eq!(
            (e.reason, e.detail, e.flags & 1, e.size()),
            (Reason::IoIn, 0x3fd, 0, 2)
        );
        let e = classify(&Ok(VcpuExit::IoOut(0x2f8, &[1])));
        assert_eq!(
            (e.reason, e.detail, e.flags & 1, e.size()),
            (Reason::IoOut, 0x2f8, 1, 1)
        );
        assert_eq!(e.describe(), "pio 0x2f8 out 1");
    }

    #[test]
    fn mmio_has_address_direction_and_size() {
        let mut d = [0u8; 4];
        let e = classify(&Ok(VcpuExit::MmioRead(0xfec0_0000, &mut d)));
        assert_eq!(
            (e.reason, e.addr, e.size()),
            (Reason::MmioRead, 0xfec0_0000, 4)
        );
        let e = classify(&Ok(VcpuExit::MmioWrite(0xd000_0008, &[0; 8])));
        assert_eq!(
            (e.reason, e.addr, e.flags & 1, e.size()),
            (Reason::MmioWrite, 0xd000_0008, 1, 8)
        );
    }

    #[test]
    fn msr_has_index_and_direction() {
        let (mut err, mut data) = (0u8, 0u64);
        let r = kvm_ioctls::ReadMsrExit {
            error: &mut err,
            reason: kvm_ioctls::MsrExitReason::Filter,
            index: 0xc001_0004,
            data: &mut data,
        };
        let e = classify(&Ok(VcpuExit::X86Rdmsr(r)));
        assert_eq!((e.reason, e.detail), (Reason::MsrRead, 0xc001_0004));
        assert_eq!(e.describe(), "msr 0xc0010004 rd");
        let mut err = 0u8;
        let w = kvm_ioctls::WriteMsrExit {
            error: &mut err,
            reason: kvm_ioctls::MsrExitReason::Filter,
            index: 0x38f,
            data: 1,
        };
        let e = classify(&Ok(VcpuExit::X86Wrmsr(w)));
        assert_eq!((e.reason, e.detail), (Reason::MsrWrite, 0x38f));
    }

    #[test]
    fn kicks_halts_fixups_and_errors_are_reasons() {
        let eintr = Err(kvm_ioctls::Error::new(libc::EINTR));
        assert_eq!(classify(&eintr).reason, Reason::Interrupted);
        let eagain = Err(kvm_ioctls::Error::new(libc::EAGAIN));
        assert_eq!(classify(&eagain).reason, Reason::Interrupted);
        let efault = Err(kvm_ioctls::Error::new(libc::EFAULT));
        let e = classify(&efault);
        assert_eq!(
            (e.reason, e.detail),
            (Reason::KvmError, libc::EFAULT as u32)
        );
        assert_eq!(classify(&Ok(VcpuExit::Hlt)).reason, Reason::Hlt);
        assert_eq!(
            classify(&Ok(VcpuExit::InternalError)).reason,
            Reason::InternalError
        );
        assert_eq!(classify(&Ok(VcpuExit::Shutdown)).reason, Reason::Shutdown);
        assert_eq!(classify(&Ok(VcpuExit::Intr)).reason, Reason::Interrupted);
        let e = classify(&Ok(VcpuExit::FailEntry(7, 1)));
        assert_eq!((e.reason, e.detail), (Reason::FailEntry, 7));
    }
}
