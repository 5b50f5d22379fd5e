//! Handling one VM exit: a plain function of the exit and the devices it touches, so every
//! branch is unit-tested without /dev/kvm. What needs the vCPU itself (emulation fix-ups) is
//! returned to the vCPU loop as an [`Outcome`].

pub mod kind;

use kvm_ioctls::VcpuExit;

use crate::devices::{DeviceEvent, MmioBus, PioBus, PioWrite};
use crate::end::{KvmFailure, VmEnd};
use crate::kvm_error::KvmVcpuError;
use crate::vcpu_access::VcpuAccess;

/// The guest's MSR access faults: it takes #GP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpFault;

/// Answers the MSR accesses that KVM sends to user space (through the MSR filter).
pub trait MsrHandler {
    /// `cpu` is the exiting vCPU (each question costs an ioctl the first time in an exit, so
    /// handlers ask only when they must: the RDPMC service's RIP check).
    fn rdmsr(&mut self, index: u32, cpu: &mut dyn VcpuAccess) -> Result<u64, GpFault>;
    fn wrmsr(&mut self, index: u32, value: u64) -> Result<(), GpFault>;
}

/// No MSRs are handled in user space: every access that reaches us takes #GP.
pub(crate) struct NoMsrs;

impl MsrHandler for NoMsrs {
    fn rdmsr(&mut self, _index: u32, _cpu: &mut dyn VcpuAccess) -> Result<u64, GpFault> {
        Err(GpFault)
    }
    fn wrmsr(&mut self, _index: u32, _value: u64) -> Result<(), GpFault> {
        Err(GpFault)
    }
}

/// Reads give 0 and writes are accepted: the cheapest possible user-space MSR exit (the
/// baseline the vPMU's cost is measured against, benches/).
pub(crate) struct ConstMsrs;

impl MsrHandler for ConstMsrs {
    fn rdmsr(&mut self, _index: u32, _cpu: &mut dyn VcpuAccess) -> Result<u64, GpFault> {
        Ok(0)
    }
    fn wrmsr(&mut self, _index: u32, _value: u64) -> Result<(), GpFault> {
        Ok(())
    }
}

/// Per-vCPU exit counts by kind: [`ExitCounts::count`] from the exit's classification, and
/// `unclaimed_io` from [`handle`] (no device claimed the port).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ExitCounts {
    pub io_in: u64,
    pub io_out: u64,
    pub unclaimed_io: u64,
    pub mmio: u64,
    /// MMIO exits at addresses no device claims (reads float high, writes are dropped).
    pub unclaimed_mmio: u64,
    pub msr: u64,
    pub hlt: u64,
    pub interrupted: u64,
    pub internal_error: u64,
    pub other: u64,
    /// Ioctls the access layer (`vcpu_access::KvmVcpu`) made while handling exits: register,
    /// special register, event, MSR and FPU reads and writes (not KVM_RUN, not the PMI path's
    /// LAPIC/NMI ioctls). With sync registers a relayed system call makes none.
    pub access_ioctls: u64,
    /// Whether this vCPU read and wrote registers through `kvm_run` (KVM_CAP_SYNC_REGS).
    pub sync_regs: bool,
}

impl ExitCounts {
    /// Counts one exit by its classification (exits that end the run are not counted).
    #[inline]
    pub fn count(&mut self, e: kind::ExitEvent) {
        use kind::Reason;
        match e.reason {
            Reason::IoIn => self.io_in += 1,
            Reason::IoOut => self.io_out += 1,
            Reason::MmioRead | Reason::MmioWrite => self.mmio += 1,
            Reason::MsrRead | Reason::MsrWrite => self.msr += 1,
            Reason::Hlt => self.hlt += 1,
            Reason::Interrupted => self.interrupted += 1,
            Reason::InternalError => self.internal_error += 1,
            Reason::IrqWindowOpen | Reason::IoapicEoi => self.other += 1,
            Reason::Shutdown
            | Reason::SystemEvent
            | Reason::FailEntry
            | Reason::KvmError
            | Reason::Other => {}
        }
    }

    pub fn total(&self) -> u64 {
        self.io_in
            + self.io_out
            + self.mmio
            + self.msr
            + self.hlt
            + self.interrupted
            + self.internal_error
            + self.other
    }
}

crate::merge_fields!(ExitCounts {
    io_in,
    io_out,
    unclaimed_io,
    mmio,
    unclaimed_mmio,
    msr,
    hlt,
    interrupted,
    internal_error,
    other,
    access_ioctls,
    sync_regs,
});

/// The port a trapped guest exception handler writes on VT-x/SVM hosts (next to the
/// isa-debug-exit port 0xf4; `host_quirks::idt_trap::Mark::PortOut`): `out %al, $0xf5`.
pub(crate) const TRAP_PORT: u16 = 0xf5;

/// What the vCPU loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Continue,
    /// KVM_RUN returned EINTR/EAGAIN: a kick (stop request, overflow signal). The loop clears
    /// `immediate_exit` and looks at why it was kicked.
    Interrupted,
    /// KVM could not emulate a guest instruction: the loop asks the host-quirk code to complete it.
    InternalError,
    /// A write to [`TRAP_PORT`]: the mark the VMM put over a trapped guest exception handler on
    /// a VT-x/SVM host (`host_quirks::idt_trap::Mark::PortOut`). The loop completes the write,
    /// then asks the traps whose it is; a write from anywhere else is ignored (counted as
    /// unclaimed).
    TrapMark,
    Stop(VmEnd),
}

pub struct ExitContext<'a> {
    pub pio: &'a PioBus,
    pub mmio: &'a MmioBus,
    pub msrs: &'a mut dyn MsrHandler,
    pub cpu: &'a mut dyn VcpuAccess,
    pub counts: &'a mut ExitCounts,
}

fn device_event(e: DeviceEvent) -> Outcome {
    match e {
        DeviceEvent::Reset => Outcome::Stop(VmEnd::Reboot),
        DeviceEvent::PowerOff => Outcome::Stop(VmEnd::PowerOff),
        DeviceEvent::DebugExit(value) => Outcome::Stop(VmEnd::DebugExit(value)),
    }
}

pub fn handle(exit: Result<VcpuExit<'_>, kvm_ioctls::Error>, ctx: &mut ExitContext<'_>) -> Outcome {
    let exit = match exit {
        Ok(e) => e,
        Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
            return Outcome::Interrupted;
        }
        Err(e) => {
            return Outcome::Stop(VmEnd::KvmFailure(KvmFailure::Vcpu {
                vcpu: None,
                error: KvmVcpuError::Run(e),
            }))
        }
    };
    match exit {
        VcpuExit::IoIn(port, data) => {
            if !ctx.pio.read(port, data) {
                ctx.counts.unclaimed_io += 1;
            }
            Outcome::Continue
        }
        VcpuExit::IoOut(TRAP_PORT, [_]) => Outcome::TrapMark,
        VcpuExit::IoOut(port, data) => match ctx.pio.write(port, data) {
            PioWrite::Event(e) => device_event(e),
            PioWrite::Done => Outcome::Continue,
            PioWrite::Unclaimed => {
                ctx.counts.unclaimed_io += 1;
                Outcome::Continue
            }
        },
        VcpuExit::MmioRead(addr, data) => {
            // Addresses no device claims float high, as on a bus with nothing there.
            if !ctx.mmio.read(addr, data) {
                ctx.counts.unclaimed_mmio += 1;
            }
            Outcome::Continue
        }
        VcpuExit::MmioWrite(addr, data) => {
            if !ctx.mmio.write(addr, data) {
                ctx.counts.unclaimed_mmio += 1;
            }
            Outcome::Continue
        }
        VcpuExit::X86Rdmsr(exit) => {
            match ctx.msrs.rdmsr(exit.index, ctx.cpu) {
                Ok(v) => *exit.data = v,
                Err(GpFault) => *exit.error = 1,
            }
            Outcome::Continue
        }
        VcpuExit::X86Wrmsr(exit) => {
            if ctx.msrs.wrmsr(exit.index, exit.data).is_err() {
                *exit.error = 1;
            }
            Outcome::Continue
        }
        // With the in-kernel irqchip KVM handles HLT itself (the vCPU sleeps in KVM until an
        // interrupt): an HLT exit here is not the guest powering off but KVM or the VMM's setup
        // going wrong, and ends the run with its own exit code.
        VcpuExit::Hlt => Outcome::Stop(VmEnd::UnexpectedHlt),
        VcpuExit::Shutdown => Outcome::Stop(VmEnd::TripleFault),
        VcpuExit::SystemEvent(kind, _) => match kind {
            kvm_bindings::KVM_SYSTEM_EVENT_SHUTDOWN => Outcome::Stop(VmEnd::PowerOff),
            kvm_bindings::KVM_SYSTEM_EVENT_RESET => Outcome::Stop(VmEnd::Reboot),
            kvm_bindings::KVM_SYSTEM_EVENT_CRASH => {
                Outcome::Stop(VmEnd::GuestPanic("KVM system event: crash".into()))
            }
            k => Outcome::Stop(VmEnd::KvmFailure(KvmFailure::UnknownSystemEvent(k))),
        },
        VcpuExit::InternalError => Outcome::InternalError,
        VcpuExit::FailEntry(reason, cpu) => {
            Outcome::Stop(VmEnd::KvmFailure(KvmFailure::FailEntry { reason, cpu }))
        }
        VcpuExit::Intr => Outcome::Interrupted,
        VcpuExit::IrqWindowOpen | VcpuExit::IoapicEoi(_) => Outcome::Continue,
        other => Outcome::Stop(VmEnd::KvmFailure(KvmFailure::UnexpectedExit(format!(
            "{other:?}"
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::i8042::I8042;
    use crate::devices::MmioDevice;
    use crate::vcpu_access::fake::FakeVcpu;
    use std::sync::{Arc, Mutex};

    struct Msrs(Vec<(u32, u64)>);
    impl MsrHandler for Msrs {
        fn rdmsr(&mut self, index: u32, _cpu: &mut dyn VcpuAccess) -> Result<u64, GpFault> {
            self.0
                .iter()
                .find(|(i, _)| *i == index)
                .map(|(_, v)| *v)
                .ok_or(GpFault)
        }
        fn wrmsr(&mut self, index: u32, value: u64) -> Result<(), GpFault> {
            if index == 0x10 {
                return Err(GpFault);
            }
            self.0.push((index, value));
            Ok(())
        }
    }

    fn run(
        exit: Result<VcpuExit<'_>, kvm_ioctls::Error>,
        msrs: &mut Msrs,
        counts: &mut ExitCounts,
    ) -> Outcome {
        let mut pio = PioBus::builder();
        pio.insert(0x60, 5, Arc::new(Mutex::new(I8042))).unwrap();
        let pio = pio.build();
        let mmio = MmioBus::default();
        // As the vCPU loop does: classify once, count, then handle.
        counts.count(kind::classify(&exit));
        handle(
            exit,
            &mut ExitContext {
                pio: &pio,
                mmio: &mmio,
                msrs,
                cpu: &mut FakeVcpu::default(),
                counts,
            },
        )
    }

    #[test]
    fn port_io_goes_to_devices_and_reset_stops() {
        let (mut m, mut c) = (Msrs(vec![]), ExitCounts::default());
        let mut data = [0u8; 1];
        assert_eq!(
            run(Ok(VcpuExit::IoIn(0x64, &mut data)), &mut m, &mut c),
            Outcome::Continue
        );
        assert_eq!(data[0], 0);
        assert_eq!(
            run(Ok(VcpuExit::IoIn(0x80, &mut data)), &mut m, &mut c),
            Outcome::Continue
        );
        assert_eq!(data[0], 0xff);
        assert_eq!(
            run(Ok(VcpuExit::IoOut(0x80, &[1])), &mut m, &mut c),
            Outcome::Continue
        );
        assert_eq!(
            run(Ok(VcpuExit::IoOut(0x64, &[0xfe])), &mut m, &mut c),
            Outcome::Stop(VmEnd::Reboot)
        );
        assert_eq!((c.io_in, c.io_out, c.unclaimed_io), (2, 2, 2));
    }

    #[test]
    fn a_byte_written_to_the_trap_port_is_a_trap_mark() {
        let (mut m, mut c) = (Msrs(vec![]), ExitCounts::default());
        assert_eq!(
            run(Ok(VcpuExit::IoOut(TRAP_PORT, &[0x55])), &mut m, &mut c),
            Outcome::TrapMark
        );
        // Only the mark's form (`out %al`): a wider write there is an ordinary unclaimed one.
        assert_eq!(
            run(Ok(VcpuExit::IoOut(TRAP_PORT, &[1, 2])), &mut m, &mut c),
            Outcome::Continue
        );
        assert_eq!((c.io_out, c.unclaimed_io), (2, 1));
    }

    /// Reads return the offset plus the last value written.
    struct Echo(u8);
    impl MmioDevice for Echo {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8 + self.0);
        }
        fn write(&mut self, _offset: u64, data: &[u8]) {
            self.0 = data[0];
        }
    }

    fn mmio_exit(mmio: &MmioBus, counts: &mut ExitCounts, exit: VcpuExit<'_>) -> Outcome {
        let exit = Ok(exit);
        counts.count(kind::classify(&exit));
        handle(
            exit,
            &mut ExitContext {
                pio: &PioBus::default(),
                mmio,
                msrs: &mut Msrs(vec![]),
                cpu: &mut FakeVcpu::default(),
                counts,
            },
        )
    }

    #[test]
    fn mmio_goes_to_the_bus_and_unclaimed_accesses_float_high_and_count() {
        let dev = Arc::new(Mutex::new(Echo(0)));
        let mut bus = MmioBus::builder();
        bus.insert(0xd000_0000, 0x1000, dev.clone()).unwrap();
        let bus = bus.build();
        let mut c = ExitCounts::default();
        let write = VcpuExit::MmioWrite(0xd000_0010, &[7, 0, 0, 0]);
        assert_eq!(mmio_exit(&bus, &mut c, write), Outcome::Continue);
        let mut data = [0u8; 4];
        let read = VcpuExit::MmioRead(0xd000_0004, &mut data);
        assert_eq!(mmio_exit(&bus, &mut c, read), Outcome::Continue);
        assert_eq!(
            data,
            [4 + 7; 4],
            "offset within the device plus the value written"
        );
        let read = VcpuExit::MmioRead(0xc000_0000, &mut data);
        assert_eq!(mmio_exit(&bus, &mut c, read), Outcome::Continue);
        assert_eq!(data, [0xff; 4]);
        let write = VcpuExit::MmioWrite(0xc000_0000, &[1]);
        assert_eq!(mmio_exit(&bus, &mut c, write), Outcome::Continue);
        assert_eq!((c.mmio, c.unclaimed_mmio), (4, 2));
        assert_eq!(dev.lock().unwrap().0, 7, "the unclaimed write went nowhere");
    }

    #[test]
    fn msr_exits_answer_or_raise_gp() {
        let (mut m, mut c) = (Msrs(vec![(0xc001_0004, 42)]), ExitCounts::default());
        let (mut err, mut data) = (0u8, 0u64);
        let exit = kvm_ioctls::ReadMsrExit {
            error: &mut err,
            reason: kvm_ioctls::MsrExitReason::Filter,
            index: 0xc001_0004,
            data: &mut data,
        };
        assert_eq!(
            run(Ok(VcpuExit::X86Rdmsr(exit)), &mut m, &mut c),
            Outcome::Continue
        );
        assert_eq!((err, data), (0, 42));
        let exit = kvm_ioctls::ReadMsrExit {
            error: &mut err,
            reason: kvm_ioctls::MsrExitReason::Filter,
            index: 0x1234,
            data: &mut data,
        };
        run(Ok(VcpuExit::X86Rdmsr(exit)), &mut m, &mut c);
        assert_eq!(err, 1);
        let mut err = 0u8;
        let exit = kvm_ioctls::WriteMsrExit {
            error: &mut err,
            reason: kvm_ioctls::MsrExitReason::Filter,
            index: 0x10,
            data: 5,
        };
        run(Ok(VcpuExit::X86Wrmsr(exit)), &mut m, &mut c);
        assert_eq!(err, 1);
        assert_eq!(c.msr, 3);
    }

    #[test]
    fn endings_map_to_vm_ends() {
        let (mut m, mut c) = (Msrs(vec![]), ExitCounts::default());
        assert_eq!(
            run(Ok(VcpuExit::Shutdown), &mut m, &mut c),
            Outcome::Stop(VmEnd::TripleFault)
        );
        assert_eq!(
            run(Ok(VcpuExit::Hlt), &mut m, &mut c),
            Outcome::Stop(VmEnd::UnexpectedHlt)
        );
        assert_eq!(c.hlt, 1, "still counted");
        assert_eq!(
            VmEnd::UnexpectedHlt.exit_code(),
            crate::end::code::UNEXPECTED_HLT
        );
        assert!(!VmEnd::UnexpectedHlt.is_clean());
        assert_eq!(
            run(Ok(VcpuExit::InternalError), &mut m, &mut c),
            Outcome::InternalError
        );
        assert_eq!(
            run(Err(kvm_ioctls::Error::new(libc::EINTR)), &mut m, &mut c),
            Outcome::Interrupted
        );
        assert!(matches!(
            run(Err(kvm_ioctls::Error::new(libc::EFAULT)), &mut m, &mut c),
            Outcome::Stop(VmEnd::KvmFailure(_))
        ));
        assert!(matches!(
            run(Ok(VcpuExit::FailEntry(7, 0)), &mut m, &mut c),
            Outcome::Stop(VmEnd::KvmFailure(_))
        ));
        assert_eq!(
            run(
                Ok(VcpuExit::SystemEvent(
                    kvm_bindings::KVM_SYSTEM_EVENT_RESET,
                    &[]
                )),
                &mut m,
                &mut c
            ),
            Outcome::Stop(VmEnd::Reboot)
        );
    }
}
