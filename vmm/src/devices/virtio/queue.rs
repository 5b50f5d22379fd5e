//! What the virtio devices share about split virtqueues beyond rust-vmm's `virtio-queue`: the
//! checks it does not make before a chain is popped ([`pop_checked`], [`QueueFault`]) and the
//! driver's interrupt suppression ([`wants_interrupt`]).

use std::sync::atomic::{fence, Ordering};

use virtio_bindings::virtio_ring::{
    VRING_AVAIL_F_NO_INTERRUPT, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT,
};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// A driver error the device cannot recover from by itself: the virtqueue's invariants are
/// broken (virtio 1.x, "Split Virtqueues"). The device stops using its queues and asks for a
/// reset (DEVICE_NEEDS_RESET) until the driver resets it.
#[derive(Debug, thiserror::Error)]
pub enum QueueFault {
    #[error(
        "{queue}: available index moved {ahead} entries ahead of the device (queue size {size})"
    )]
    AvailIndexJump {
        queue: &'static str,
        ahead: u16,
        size: u16,
    },
    #[error("{queue}: available ring at {addr:#x} is outside guest memory")]
    AvailRing { queue: &'static str, addr: u64 },
    #[error("{queue}: descriptor index {index} (queue size {size})")]
    DescriptorIndex {
        queue: &'static str,
        index: u16,
        size: u16,
    },
    #[error("{queue}: descriptor table entry {index} is outside guest memory")]
    DescriptorTable { queue: &'static str, index: u16 },
    #[error("{queue}: descriptor chain from {head} is longer than the queue (a loop)")]
    ChainLoop { queue: &'static str, head: u16 },
    #[error("{queue}: indirect descriptor {index}, but VIRTIO_F_INDIRECT_DESC was not offered")]
    Indirect { queue: &'static str, index: u16 },
    #[error("{queue}: buffer {addr:#x}+{len:#x} of descriptor {index} is outside guest memory")]
    Buffer {
        queue: &'static str,
        index: u16,
        addr: u64,
        len: u32,
    },
    #[error("{queue}: used ring: {source}")]
    UsedRing {
        queue: &'static str,
        source: virtio_queue::Error,
    },
}

/// Takes the next available chain of queue `q` (named `queue` in faults), after checking what virtio-queue does not:
/// that the driver did not move the available index more than a queue's worth ahead, and that
/// the chain is well formed (indices in range, no loop, no indirect table, buffers in guest
/// memory). `Ok(None)`: nothing available.
pub fn pop_checked<'m>(
    q: &mut Queue,
    queue: &'static str,
    mem: &'m GuestMemoryMmap,
) -> Result<Option<DescriptorChain<&'m GuestMemoryMmap>>, QueueFault> {
    let size = q.size();
    if !q.ready() || size == 0 {
        return Ok(None);
    }
    let avail = q
        .avail_idx(mem, Ordering::Acquire)
        .map_err(|_| QueueFault::AvailRing {
            queue,
            addr: q.avail_ring(),
        })?;
    let ahead = avail.0.wrapping_sub(q.next_avail());
    if ahead == 0 {
        return Ok(None);
    }
    if ahead > size {
        return Err(QueueFault::AvailIndexJump { queue, ahead, size });
    }
    let ring_entry = q
        .avail_ring()
        .checked_add(4 + 2 * u64::from(q.next_avail() % size))
        .ok_or(QueueFault::AvailRing {
            queue,
            addr: q.avail_ring(),
        })?;
    let head: u16 = mem
        .read_obj::<u16>(GuestAddress(ring_entry))
        .map(u16::from_le)
        .map_err(|_| QueueFault::AvailRing {
            queue,
            addr: ring_entry,
        })?;
    let mut at = head;
    for _ in 0..size {
        if at >= size {
            return Err(QueueFault::DescriptorIndex {
                queue,
                index: at,
                size,
            });
        }
        let d: Descriptor = GuestAddress(q.desc_table())
            .checked_add(16 * u64::from(at))
            .and_then(|a| mem.read_obj(a).ok())
            .ok_or(QueueFault::DescriptorTable { queue, index: at })?;
        let flags = u32::from(d.flags());
        if flags & VRING_DESC_F_INDIRECT != 0 {
            return Err(QueueFault::Indirect { queue, index: at });
        }
        let in_memory = d.len() == 0
            || d.addr()
                .checked_add(u64::from(d.len()) - 1)
                .is_some_and(|_| GuestMemoryBackend::check_range(mem, d.addr(), d.len() as usize));
        if !in_memory {
            return Err(QueueFault::Buffer {
                queue,
                index: at,
                addr: d.addr().0,
                len: d.len(),
            });
        }
        if flags & VRING_DESC_F_NEXT == 0 {
            return Ok(q.pop_descriptor_chain(mem));
        }
        at = d.next();
    }
    Err(QueueFault::ChainLoop { queue, head })
}

/// Whether the driver wants an interrupt for `q` now that buffers were used.
/// `virtio-queue` leaves VRING_AVAIL_F_NO_INTERRUPT (how a driver without EVENT_IDX, such
/// as Linux's here, silences a queue while it polls) to the device: it is checked here.
pub fn wants_interrupt(q: &mut Queue, mem: &GuestMemoryMmap) -> bool {
    fence(Ordering::SeqCst); // the used-ring writes before the read of the driver's flags
    let avail_flags = mem
        .read_obj::<u16>(GuestAddress(q.avail_ring()))
        .map(u16::from_le);
    if matches!(avail_flags, Ok(f) if u32::from(f) & VRING_AVAIL_F_NO_INTERRUPT != 0) {
        return false;
    }
    q.needs_notification(mem).unwrap_or(true)
}
