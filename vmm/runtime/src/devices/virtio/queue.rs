//! What the virtio devices share about split virtqueues beyond rust-vmm's `virtio-queue`: a
//! chain read once from guest memory, checked, and handed to the device as a copy
//! ([`pop_checked`], [`CheckedChain`], [`QueueFault`]), and the driver's interrupt suppression
//! ([`wants_interrupt`]).
//!
//! Why a copy: the driver (another vCPU) may rewrite the available ring and the descriptor
//! table while the device works. virtio-queue's `DescriptorChain` reads each descriptor again
//! as it is walked, so what was checked need not be what is used (an indirect table, a loop,
//! an index out of range, a buffer outside memory could come back after the check). Here each
//! byte of the ring and the table the device depends on is read exactly once.

use std::sync::atomic::{fence, Ordering};

use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_bindings::virtio_ring::{
    VRING_AVAIL_F_NO_INTERRUPT, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT,
};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::segments::Segments;

/// A descriptor chain as [`pop_checked`] read it, once: its head index (for the used ring)
/// and its descriptors, each checked (index in range, no loop, no indirect table, buffer in
/// guest memory). Devices use this copy, never the guest's table again.
#[derive(Debug, Clone)]
pub(crate) struct CheckedChain {
    pub head: u16,
    pub descriptors: Vec<Descriptor>,
}

impl CheckedChain {
    /// The device-readable buffers, in chain order.
    pub(crate) fn readable(&self) -> Segments {
        self.pieces(false)
    }

    /// The device-writable buffers, in chain order.
    pub(crate) fn writable(&self) -> Segments {
        self.pieces(true)
    }

    fn pieces(&self, writable: bool) -> Segments {
        Segments::new(
            self.descriptors
                .iter()
                .filter(|d| (u32::from(d.flags()) & VRING_DESC_F_WRITE != 0) == writable)
                .map(|d| (d.addr(), u64::from(d.len())))
                .collect(),
        )
    }
}

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

/// Takes the next available chain of queue `q` (named `queue` in faults), read once into a
/// [`CheckedChain`] after checking what virtio-queue does not: that the driver did not move
/// the available index more than a queue's worth ahead, and that the chain is well formed
/// (indices in range, no loop, no indirect table, buffers in guest memory). `Ok(None)`:
/// nothing available. On a fault the queue does not move.
pub(crate) fn pop_checked(
    q: &mut Queue,
    queue: &'static str,
    mem: &GuestMemoryMmap,
) -> Result<Option<CheckedChain>, QueueFault> {
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
    let mut descriptors = Vec::new();
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
        let next = d.next();
        descriptors.push(d);
        if flags & VRING_DESC_F_NEXT == 0 {
            q.set_next_avail(q.next_avail().wrapping_add(1));
            return Ok(Some(CheckedChain { head, descriptors }));
        }
        at = next;
    }
    Err(QueueFault::ChainLoop { queue, head })
}

/// Whether the driver wants an interrupt for `q` now that buffers were used.
/// `virtio-queue` leaves VRING_AVAIL_F_NO_INTERRUPT (how a driver without EVENT_IDX, such
/// as Linux's here, silences a queue while it polls) to the device: it is checked here.
pub(crate) fn wants_interrupt(q: &mut Queue, mem: &GuestMemoryMmap) -> bool {
    fence(Ordering::SeqCst); // the used-ring writes before the read of the driver's flags
    let avail_flags = mem
        .read_obj::<u16>(GuestAddress(q.avail_ring()))
        .map(u16::from_le);
    if matches!(avail_flags, Ok(f) if u32::from(f) & VRING_AVAIL_F_NO_INTERRUPT != 0) {
        return false;
    }
    q.needs_notification(mem).unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    const DESC: u64 = 0x1000;
    const AVAIL: u64 = 0x2000;
    const USED: u64 = 0x3000;

    fn queue(mem: &GuestMemoryMmap) -> Queue {
        let mut q = Queue::new(8).unwrap();
        q.set_size(8);
        q.set_desc_table_address(Some(DESC as u32), Some(0));
        q.set_avail_ring_address(Some(AVAIL as u32), Some(0));
        q.set_used_ring_address(Some(USED as u32), Some(0));
        q.set_ready(true);
        assert!(q.is_valid(mem));
        q
    }

    fn desc(mem: &GuestMemoryMmap, i: u64, addr: u64, len: u32, flags: u16, next: u16) {
        let at = DESC + 16 * i;
        mem.write_obj(addr, GuestAddress(at)).unwrap();
        mem.write_obj(len, GuestAddress(at + 8)).unwrap();
        mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
        mem.write_obj(next, GuestAddress(at + 14)).unwrap();
    }

    #[test]
    fn the_device_keeps_the_chain_it_checked_whatever_the_guest_writes_next() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let mut q = queue(&mem);
        desc(&mem, 0, 0x8000, 16, VRING_DESC_F_NEXT as u16, 1);
        desc(&mem, 1, 0x9000, 512, VRING_DESC_F_WRITE as u16, 0);
        mem.write_obj(0u16, GuestAddress(AVAIL + 4)).unwrap();
        mem.write_obj(1u16, GuestAddress(AVAIL + 2)).unwrap();
        let chain = pop_checked(&mut q, "test queue", &mem).unwrap().unwrap();
        // The other vCPU now points the chain at an indirect table and the top of memory,
        // and loops it. Nothing the device holds changes.
        desc(
            &mem,
            0,
            u64::MAX - 8,
            u32::MAX,
            VRING_DESC_F_INDIRECT as u16,
            0,
        );
        desc(
            &mem,
            1,
            u64::MAX,
            u32::MAX,
            (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE) as u16,
            1,
        );
        mem.write_obj(5u16, GuestAddress(AVAIL + 4)).unwrap();
        assert_eq!(chain.head, 0);
        let readable = chain.readable();
        let writable = chain.writable();
        assert_eq!(
            (readable.first(), readable.len()),
            (GuestAddress(0x8000), 16)
        );
        assert_eq!(
            (writable.first(), writable.len()),
            (GuestAddress(0x9000), 512)
        );
        assert_eq!(q.next_avail(), 1, "popped once");
        // The next chain is checked as read then: the loop is a fault, and the queue stays.
        mem.write_obj(0u16, GuestAddress(AVAIL + 6)).unwrap();
        mem.write_obj(2u16, GuestAddress(AVAIL + 2)).unwrap();
        assert!(matches!(
            pop_checked(&mut q, "test queue", &mem),
            Err(QueueFault::Indirect { index: 0, .. })
        ));
        assert_eq!(q.next_avail(), 1, "a fault does not move the queue");
    }
}
