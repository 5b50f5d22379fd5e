//! Devices and the bus that routes a guest access to them ([`bus`]: one [`Bus`] type, for port
//! I/O and for MMIO). All device emulation for a vCPU's exits runs on that vCPU's thread (so
//! domain-switch accounting charges it to the guest), and so does periodic device work ([`Tick`]).

pub mod acpi_pm;
pub(crate) mod bus;
pub(crate) mod debug_exit;
pub(crate) mod delay;
pub mod i8042;
pub mod packet_gate;
pub mod serial;
pub mod virtio;
pub mod vpmu_control;

pub use bus::{lock_device, Bus, BusError, MmioBus, PioBus, PioWrite};

/// Something a device asks the VMM to do after a guest access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEvent {
    /// The guest asked for a reset (i8042 0xFE, `reboot=k`).
    Reset,
    /// The guest asked to power off (ACPI S5).
    PowerOff,
    /// The guest wrote this value to the isa-debug-exit port (kvm-unit-tests' exit status).
    DebugExit(u32),
}

/// A device with periodic work (generating traffic), run by a vCPU thread when it falls due.
pub trait Tick: Send {
    fn tick(&mut self, now: std::time::Instant);
}

/// A device on the port-I/O bus; `offset` is relative to the device's base port.
pub trait PioDevice: Send {
    fn read(&mut self, offset: u16, data: &mut [u8]);
    fn write(&mut self, offset: u16, data: &[u8]) -> Option<DeviceEvent>;
}

/// A device on the MMIO bus; `offset` is relative to the device's base address.
pub trait MmioDevice: Send {
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}
