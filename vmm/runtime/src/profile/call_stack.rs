//! The call stack of a host-side sample, by frame pointers (issue 19, "call stacks"): from the
//! sampled RBP, each frame holds the caller's RBP at `[rbp]` and the return address at
//! `[rbp + 8]`, read from guest memory through the vCPU's page tables (the sampled task's own
//! address space, which maps the kernel too). User space: programs built with frame pointers
//! (the workloads are); the kernel: the default kernel is built with UNWINDER_FRAME_POINTER.
//!
//! Kernel stacks go on through interrupts: the kernel's entry code marks a frame of saved
//! registers (`struct pt_regs`) by setting bit 0 of the RBP it leaves (ENCODE_FRAME_POINTER), as
//! Linux's own frame-pointer unwinder knows; when the walk meets such a marker and the saved CS
//! says the interrupt came from kernel mode, the interrupted RIP is the next frame and the walk
//! goes on from the saved RBP, on whatever stack that is (at most [`MAX_INTERRUPTS`] times; an
//! interrupt or system call from user mode ends it). The saved registers are read at the
//! offsets of the x86-64 `struct pt_regs`, which is ABI (ptrace's `user_regs_struct` has the
//! same layout).
//!
//! The guest is not trusted and code built without frame pointers leaves garbage in RBP: the
//! walk stops at [`MAX_DEPTH`] frames, at a frame pointer outside the sample's half of the
//! address space, misaligned, not above the
//! last one (stacks grow down, so callers' frames lie higher) or more than the space's span above
//! the first (8 MiB for a user stack, 32 KiB for a kernel one: two 16 KiB stacks), at an unmapped
//! page, and at a return address of 0 or outside the space's code (user half; the kernel's text
//! mapping from 0xffffffff80000000). What code without frame pointers gets is a short or empty
//! stack (its leaf function, from the RIP, is always there), never a fault. The leaf's caller is
//! missed when the sample lands in a prologue, before `push rbp; mov rbp, rsp` (as for any
//! frame-pointer unwinder; for user space `report` recovers it: `profile::user_symbols`).

use super::guest_task::GuestRead;

/// The most return addresses one sample records.
pub(crate) const MAX_DEPTH: usize = 24;
/// The most interrupt frames (saved registers) a kernel walk goes through.
pub(crate) const MAX_INTERRUPTS: usize = 2;
/// Offsets in x86-64's `struct pt_regs`: bp, ip, cs.
const PT_REGS_BP: u64 = 4 * 8;
const PT_REGS_IP: u64 = 16 * 8;
const PT_REGS_CS: u64 = 17 * 8;
/// x86-64 user addresses lie below this.
const USER_TOP: u64 = 0x0000_8000_0000_0000;
/// The kernel half starts here.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;
/// The kernel's text mapping (__START_KERNEL_map).
const KERNEL_TEXT: u64 = 0xffff_ffff_8000_0000;

/// Whose stack a sample interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Space {
    User,
    Kernel,
}

impl Space {
    /// How far above the first frame the walk may go.
    pub(crate) fn max_span(self) -> u64 {
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

/// The return addresses of the frames above `rbp`, innermost first (for a kernel stack, with
/// the RIPs that interrupts came into).
pub(crate) fn walk<M: GuestRead + ?Sized>(mem: &mut M, rbp: u64, space: Space) -> Vec<u64> {
    let mut out = Vec::new();
    let (mut first, mut fp) = (rbp, rbp);
    let mut interrupts = 0;
    while out.len() < MAX_DEPTH {
        if space == Space::Kernel && fp & 7 == 1 && interrupts < MAX_INTERRUPTS {
            // The entry code's marker: fp - 1 is a pt_regs.
            match interrupted(mem, fp - 1) {
                Some((ip, bp)) => {
                    out.push(ip);
                    interrupts += 1;
                    (first, fp) = (bp, bp);
                    continue;
                }
                None => break,
            }
        }
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
        // A marker (bit 0) may lead to another stack, below this one: the check at the top of
        // the loop takes it (at most MAX_INTERRUPTS times), not "not above the last one".
        if next <= fp && !(space == Space::Kernel && next & 7 == 1) {
            break;
        }
        fp = next;
    }
    out
}

/// The kernel RIP and RBP an interrupt saved at `regs` (a `struct pt_regs`); None if it came
/// from user mode or the values are no kernel's.
fn interrupted<M: GuestRead + ?Sized>(mem: &mut M, regs: u64) -> Option<(u64, u64)> {
    if !Space::Kernel.frame_ok(regs) || !regs.is_multiple_of(8) || regs > u64::MAX - 256 {
        return None;
    }
    let mut word = |off: u64| {
        let mut b = [0u8; 8];
        mem.read_virt(regs + off, &mut b).ok()?;
        Some(u64::from_le_bytes(b))
    };
    let (ip, cs, bp) = (word(PT_REGS_IP)?, word(PT_REGS_CS)?, word(PT_REGS_BP)?);
    (cs & 3 == 0 && Space::Kernel.return_ok(ip)).then_some((ip, bp))
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
        // The saved registers: an interrupt from user mode (CS RPL 3) ends the walk.
        s.0.insert(K + 0x60 + PT_REGS_IP, 0x40_1000);
        s.0.insert(K + 0x60 + PT_REGS_CS, 0x33);
        s.0.insert(K + 0x60 + PT_REGS_BP, 0x7ffc_0000_0000);
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
    fn a_kernel_walk_goes_on_through_an_interrupt_from_kernel_mode() {
        // The handler's frames on the IRQ stack, the marker pointing down to the saved registers
        // on the task stack (another stack), then the interrupted kernel code's frames there.
        const IRQ: u64 = 0xffff_c900_0002_3f00;
        const TASK: u64 = 0xffff_c900_0001_0e00;
        const REGS: u64 = 0xffff_c900_0001_1f58;
        let mut s = Stack::default();
        s.0.insert(IRQ, IRQ + 0x20);
        s.0.insert(IRQ + 8, 0xffff_ffff_8150_0000); // hrtimer_interrupt
        s.0.insert(IRQ + 0x20, REGS + 1);
        s.0.insert(IRQ + 0x28, 0xffff_ffff_81a0_0000); // asm_sysvec_apic_timer_interrupt
        s.0.insert(REGS + PT_REGS_IP, 0xffff_ffff_8123_4567); // where the interrupt came in
        s.0.insert(REGS + PT_REGS_CS, 0x10);
        s.0.insert(REGS + PT_REGS_BP, TASK);
        s.0.insert(TASK, TASK + 0x40);
        s.0.insert(TASK + 8, 0xffff_ffff_8130_0000); // its caller
        s.0.insert(TASK + 0x40, 0);
        s.0.insert(TASK + 0x48, 0xffff_ffff_8100_0000);
        assert_eq!(
            walk(&mut s, IRQ, Space::Kernel),
            vec![
                0xffff_ffff_8150_0000,
                0xffff_ffff_81a0_0000,
                0xffff_ffff_8123_4567,
                0xffff_ffff_8130_0000,
                0xffff_ffff_8100_0000
            ]
        );
        // Saved registers that are no kernel's (a user RIP with kernel CS, unmapped) end it.
        let mut bad = Stack(s.0.clone());
        bad.0.insert(REGS + PT_REGS_IP, 0x40_0000);
        assert_eq!(walk(&mut bad, IRQ, Space::Kernel).len(), 2);
        let mut bad = Stack(s.0.clone());
        bad.0.remove(&(REGS + PT_REGS_CS));
        assert_eq!(walk(&mut bad, IRQ, Space::Kernel).len(), 2);
        // A marker that leads to itself again and again: at most MAX_INTERRUPTS.
        let mut looped = Stack(s.0.clone());
        looped.0.insert(REGS + PT_REGS_BP, REGS + 1);
        assert_eq!(
            walk(&mut looped, IRQ, Space::Kernel).len(),
            2 + MAX_INTERRUPTS
        );
        // User stacks know no markers.
        assert!(walk(&mut s, REGS + 1, Space::User).is_empty());
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
