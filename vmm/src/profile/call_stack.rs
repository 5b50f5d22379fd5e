//! The call stack of a host-side sample, by frame pointers (issue 19, "call stacks"): from the
//! sampled RBP, each frame holds the caller's RBP at `[rbp]` and the return address at
//! `[rbp + 8]`, read from guest memory through the vCPU's page tables (the sampled task's own
//! address space, which maps the kernel too). User space: programs built with frame pointers
//! (the workloads are); the kernel: the default kernel is built with UNWINDER_FRAME_POINTER.
//!
//! The guest is not trusted and code built without frame pointers leaves garbage in RBP: the
//! walk stops at [`MAX_DEPTH`] frames, at a frame pointer outside the sample's half of the
//! address space, misaligned (the kernel's entry code marks a frame of saved registers with
//! bit 0: the walk ends at the interrupt or system call that entered the kernel), not above the
//! last one (stacks grow down, so callers' frames lie higher) or more than the space's span above
//! the first (8 MiB for a user stack, 32 KiB for a kernel one: two 16 KiB stacks), at an unmapped
//! page, and at a return address of 0 or outside the space's code (user half; the kernel's text
//! mapping from 0xffffffff80000000). What code without frame pointers gets is a short or empty
//! stack (its leaf function, from the RIP, is always there), never a fault. The leaf's caller is
//! missed when the sample lands in a prologue, before `push rbp; mov rbp, rsp` (as for any
//! frame-pointer unwinder; for user space `report` recovers it: `profile::user_symbols`).

use super::guest_task::GuestRead;

/// The most return addresses one sample records.
pub const MAX_DEPTH: usize = 24;
/// x86-64 user addresses lie below this.
const USER_TOP: u64 = 0x0000_8000_0000_0000;
/// The kernel half starts here.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;
/// The kernel's text mapping (__START_KERNEL_map).
const KERNEL_TEXT: u64 = 0xffff_ffff_8000_0000;

/// Whose stack a sample interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    User,
    Kernel,
}

impl Space {
    /// How far above the first frame the walk may go.
    pub fn max_span(self) -> u64 {
        match self {
            Space::User => 8 << 20,
            Space::Kernel => 32 << 10,
        }
    }

    fn frame_ok(self, fp: u64) -> bool {
        match self {
            Space::User => fp != 0 && fp < USER_TOP - 16,
            Space::Kernel => (KERNEL_HALF..u64::MAX - 16).contains(&fp),
        }
    }

    fn return_ok(self, ret: u64) -> bool {
        match self {
            Space::User => ret != 0 && ret < USER_TOP,
            Space::Kernel => ret >= KERNEL_TEXT,
        }
    }
}

/// The return addresses of the frames above `rbp`, innermost first.
pub fn walk<M: GuestRead + ?Sized>(mem: &mut M, rbp: u64, space: Space) -> Vec<u64> {
    let mut out = Vec::new();
    let (first, mut fp) = (rbp, rbp);
    while out.len() < MAX_DEPTH {
        if !space.frame_ok(fp)
            || !fp.is_multiple_of(8)
            || fp < first
            || fp - first > space.max_span()
        {
            break;
        }
        let mut frame = [0u8; 16];
        if mem.read_virt(fp, &mut frame).is_err() {
            break;
        }
        let next = u64::from_le_bytes(frame[..8].try_into().unwrap());
        let ret = u64::from_le_bytes(frame[8..].try_into().unwrap());
        if !space.return_ok(ret) {
            break;
        }
        out.push(ret);
        if next <= fp {
            break;
        }
        fp = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvm_error::AccessError;
    use std::collections::HashMap;

    /// Little-endian u64s at addresses.
    #[derive(Default)]
    struct Stack(HashMap<u64, u64>);

    impl GuestRead for Stack {
        fn read_virt(&mut self, gva: u64, buf: &mut [u8]) -> Result<(), AccessError> {
            for (i, chunk) in buf.chunks_mut(8).enumerate() {
                let a = gva + 8 * i as u64;
                let v = self.0.get(&a).ok_or(AccessError::NotMapped(a))?;
                chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
            }
            Ok(())
        }
    }

    const TOP: u64 = 0x7ffc_0000_1000;

    /// main -> work -> hot_75, frames 0x40 apart, main's caller's rbp 0.
    fn three_frames() -> Stack {
        let mut s = Stack::default();
        s.0.insert(TOP, TOP + 0x40); // hot_75's frame: saved rbp of work
        s.0.insert(TOP + 8, 0x40_1234); // return into work
        s.0.insert(TOP + 0x40, TOP + 0x80);
        s.0.insert(TOP + 0x48, 0x40_2000); // return into main
        s.0.insert(TOP + 0x80, 0);
        s.0.insert(TOP + 0x88, 0x40_3000); // return into __libc_start_main
        s
    }

    #[test]
    fn frame_pointers_give_the_callers_innermost_first() {
        assert_eq!(
            walk(&mut three_frames(), TOP, Space::User),
            vec![0x40_1234, 0x40_2000, 0x40_3000]
        );
    }

    #[test]
    fn a_kernel_stack_is_walked_within_the_kernel_and_stops_at_an_entry_frame() {
        const K: u64 = 0xffff_c900_0001_3e00;
        let mut s = Stack::default();
        s.0.insert(K, K + 0x30);
        s.0.insert(K + 8, 0xffff_ffff_8150_0000);
        s.0.insert(K + 0x30, K + 0x61); // the entry code's pt_regs marker (bit 0)
        s.0.insert(K + 0x38, 0xffff_ffff_8160_0000);
        assert_eq!(
            walk(&mut s, K, Space::Kernel),
            vec![0xffff_ffff_8150_0000, 0xffff_ffff_8160_0000]
        );
        // A user frame pointer or a user return address is no kernel frame.
        assert!(walk(&mut s, TOP, Space::Kernel).is_empty());
        s.0.insert(K + 8, 0x40_0000);
        assert!(walk(&mut s, K, Space::Kernel).is_empty());
        // A kernel chain is cut at 32 KiB.
        let mut s = Stack::default();
        s.0.insert(K, K + 0x9000);
        s.0.insert(K + 8, 0xffff_ffff_8150_0000);
        s.0.insert(K + 0x9008, 0xffff_ffff_8150_0001);
        assert_eq!(walk(&mut s, K, Space::Kernel).len(), 1);
    }

    #[test]
    fn garbage_in_rbp_ends_the_walk_without_a_fault() {
        // No frame pointer at all, a kernel address, misaligned, unmapped.
        for rbp in [0, 0xffff_8880_0000_0000, TOP + 3, 0x1000] {
            assert_eq!(
                walk(&mut three_frames(), rbp, Space::User),
                Vec::<u64>::new(),
                "{rbp:#x}"
            );
        }
        // A loop (a frame pointing at itself or below) stops after one frame.
        let mut s = three_frames();
        s.0.insert(TOP + 0x40, TOP);
        assert_eq!(walk(&mut s, TOP, Space::User), vec![0x40_1234, 0x40_2000]);
        // A kernel return address stops it.
        let mut s = three_frames();
        s.0.insert(TOP + 0x48, 0xffff_ffff_8100_0000);
        assert_eq!(walk(&mut s, TOP, Space::User), vec![0x40_1234]);
        // An endless ascending chain is cut at MAX_DEPTH, or at MAX_SPAN.
        let mut s = Stack::default();
        for i in 0..100u64 {
            s.0.insert(TOP + 16 * i, TOP + 16 * (i + 1));
            s.0.insert(TOP + 16 * i + 8, 0x40_0000 + i);
        }
        assert_eq!(walk(&mut s, TOP, Space::User).len(), MAX_DEPTH);
        let mut s = Stack::default();
        s.0.insert(TOP, TOP + Space::User.max_span() + 16);
        s.0.insert(TOP + 8, 0x40_0000);
        s.0.insert(TOP + Space::User.max_span() + 16, 0);
        s.0.insert(TOP + Space::User.max_span() + 24, 0x40_0001);
        assert_eq!(walk(&mut s, TOP, Space::User), vec![0x40_0000]);
    }
}
