//! Virtio 1.x devices. The transport is virtio-mmio ([`mmio`]: the register block the guest
//! driver talks to), split virtqueues come from the rust-vmm `virtio-queue` crate (with the
//! checks it leaves to devices in [`queue`]: a chain is read once, checked, and devices use
//! that copy, [`queue::CheckedChain`], through [`segments`]), and the devices are a network card ([`net`]) and
//! block devices ([`blk`]). All of it runs on the vCPU thread whose exit (or tick) reached it.

pub mod blk;
pub mod mmio;
pub mod net;
pub(crate) mod queue;
pub(crate) mod segments;

use std::time::Instant;

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;

/// Feature bit every modern (virtio 1.x) device offers and a modern driver must accept.
pub const VIRTIO_F_VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;

/// What a virtio device looks like to its transport.
pub trait VirtioDevice: Send {
    /// Virtio device id (1 = network card, 2 = block device).
    fn device_id(&self) -> u32;
    /// Feature bits the device offers.
    fn features(&self) -> u64;
    /// Device-specific configuration space, read at `offset`.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    fn queues(&self) -> &[Queue];
    fn queues_mut(&mut self) -> &mut [Queue];
    /// The driver set DRIVER_OK with these features accepted: queues are live.
    fn activate(&mut self, features: u64, now: Instant);
    /// The driver reset the device (status 0): back to the power-on state.
    fn reset(&mut self);
    /// The driver notified queue `index`. Returns whether the guest should be interrupted
    /// (buffers were used and the driver did not suppress interrupts).
    fn queue_notify(&mut self, index: u16, mem: &GuestMemoryMmap, now: Instant) -> bool;
    /// Whether the driver broke the device's queues so that only a reset recovers it (the
    /// transport then sets DEVICE_NEEDS_RESET and raises a configuration-change interrupt).
    fn needs_reset(&self) -> bool {
        false
    }
    /// Periodic work on the vCPU thread (traffic generation). Returns whether to interrupt.
    fn tick(&mut self, _mem: &GuestMemoryMmap, _now: Instant) -> bool {
        false
    }
}
