//! Completing guest SYSCALLs on hosts whose KVM emulates guest kernel code (shared/HOST-FACTS.md,
//! "Guest user space"): there, SYSCALL at guest CPL3 does everything but the privilege switch
//! (RIP = LSTAR, RCX/R11 set, SFMASK applied, CS/SS left at CPL3), and the instruction fetch at
//! LSTAR then raises a #PF (error 0x15) that would kill the guest's process. The relay makes that
//! #PF reach the VMM and finishes the system call the way the CPU would have:
//!
//! 1. **Install.** Once the guest has an LSTAR and an IDT, the first byte of its #PF handler
//!    (vector 14's gate) is overwritten with `int3`. An int3 at CPL0 is an emulation failure on
//!    these hosts, so every #PF then exits to the VMM at the handler's first instruction. Only an
//!    instruction the relay can step over is displaced (NOP forms, ENDBR64, CLAC, `push imm`);
//!    otherwise the relay says why guest user space will not run, and tries again if the guest
//!    points its gate at another handler.
//! 2. **Classify** the exception frame on the guest's kernel stack, as the CPU would tell the cases
//!    apart: a system call is a user-mode (CPL3) instruction-fetch fault on a present page
//!    (error 0x15) at LSTAR with CR2 = LSTAR, whose RFLAGS have every SFMASK bit clear and agree
//!    with R11 (which only SYSCALL sets that way). A user jump to LSTAR, any other user #PF and
//!    every kernel #PF are real faults: the relay steps over the displaced instruction and the
//!    guest's handler runs as usual.
//! 3. **Complete** the system call: RIP = LSTAR, RSP = the user RSP, RFLAGS = the masked user
//!    RFLAGS (RF clear); RCX and R11 keep what SYSCALL put there; the #PF frame is dropped. The
//!    #PF delivery already put the vCPU at CPL0 with CS = the gate's selector, which for Linux is
//!    STAR[47:32]: then only the general registers are written (see [`complete_syscall`]);
//!    otherwise CS and SS are set as SYSCALL sets them. Per system call: KVM_GET_REGS,
//!    KVM_GET_SREGS, KVM_SET_REGS, the frame read through a software page walk (no ioctl), and
//!    LSTAR/STAR/SFMASK cached per vCPU (re-read only when a fault looks like a system call but
//!    does not match them).
//! 4. **Keep it installed.** After every exit the vCPU loop checks the patched byte (one memory
//!    read); if the guest rewrote its handler entry (alternatives patching), the relay decodes the
//!    new instruction and patches it again.
//!
//! The relay is on only with host quirks (never on a VT-x/SVM host, where an int3 in the #PF
//! handler would reach the guest as #BP). Its counts go to the end-of-run fix-up report.
//!
//! The code is in two parts here: [`classify`](mod@classify) (pure: frame -> what it is, and
//! the registers a completed SYSCALL leaves) and this module, which reads and writes the vCPU
//! through the access layer ([`crate::vcpu_access::VcpuAccess`]). The int3 itself (install,
//! re-check, move, step over) is [`super::idt_trap`], shared with the RDPMC trap.

pub(crate) mod classify;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use super::idt_trap::{displaceable, idt_gate_target, Displaced, NotDisplaceable, PatchError};
use super::idt_trap::{Mark, TrapError, TrapNames, TrapPoll, VectorTrap};
use super::FixupCounts;
use crate::arch::x86::{MSR_LSTAR, MSR_SFMASK, MSR_STAR, VECTOR_PF};
use crate::kvm_error::KvmVcpuError;
use crate::vcpu_access::{AccessError, VcpuAccess};
use classify::syscall_shaped;
pub use classify::{
    classify, complete_syscall, kernel_segments, syscall_error_code, PfFrame, PfKind, SyscallMsrs,
    PF_ERR_SYSCALL,
};

/// Why the relay could not finish with an exception that reached it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RelayError {
    #[error("syscall relay: {0}")]
    Access(#[from] AccessError),
    #[error("syscall relay: cannot read the #PF frame at RSP {rsp:#x}: {source}")]
    Frame { rsp: u64, source: AccessError },
}

impl From<TrapError> for RelayError {
    fn from(e: TrapError) -> Self {
        match e {
            TrapError::Access(a) => RelayError::Access(a),
            TrapError::Frame { rsp, source } => RelayError::Frame { rsp, source },
        }
    }
}

/// The fix-up report's names for what the relay did.
pub mod kinds {
    pub const SYSCALL: &str = "syscall relay: system calls completed";
    pub const USER_PF: &str = "syscall relay: user #PF passed to the guest";
    pub const KERNEL_PF: &str = "syscall relay: kernel #PF passed to the guest";
    pub const USER_JUMP: &str = "syscall relay: user jump to LSTAR passed to the guest (#PF)";
    pub(crate) const REINSTALLED: &str =
        "syscall relay: re-installed after the guest rewrote its #PF entry";
    pub(crate) const MOVED: &str = "syscall relay: moved after the guest changed its #PF gate";
    pub(crate) const MSR_REFRESH: &str = "syscall relay: LSTAR/STAR/SFMASK re-read";
}

/// The guest's SYSCALL MSRs as KVM holds them (one KVM_GET_MSRS).
pub(crate) fn syscall_msrs(cpu: &mut dyn VcpuAccess) -> Result<SyscallMsrs, AccessError> {
    let mut v = [0u64; 3];
    let n = cpu.msrs(&[MSR_STAR, MSR_LSTAR, MSR_SFMASK], &mut v)?;
    if n != 3 {
        return Err(KvmVcpuError::GetMsrsShort { read: n, asked: 3 }.into());
    }
    Ok(SyscallMsrs {
        star: v[0],
        lstar: v[1],
        sfmask: v[2],
    })
}

/// The relay of one VM.
pub(crate) struct SyscallRelay {
    /// The int3 over the guest's #PF handler.
    pub trap: VectorTrap,
    /// Host TSC cycles spent completing system calls (from the exit to the registers written),
    /// and how many: the VMM's part of a relayed system call.
    syscall_tsc: AtomicU64,
    syscalls: AtomicU64,
}

/// What the relay made of an emulation failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handled {
    /// Not the patched handler: the ordinary fix-ups should look at it.
    NotOurs,
    /// Done: the vCPU can run on.
    Done(PfKind),
}

impl SyscallRelay {
    pub(crate) fn new(fixups: Arc<FixupCounts>) -> Arc<Self> {
        let names = TrapNames {
            owner: "syscall relay",
            exception: "#PF",
            without: "guest user space",
            reinstalled: kinds::REINSTALLED,
            moved: kinds::MOVED,
        };
        Arc::new(SyscallRelay {
            trap: VectorTrap::new(VECTOR_PF, Mark::Int3, names, fixups),
            syscall_tsc: AtomicU64::new(0),
            syscalls: AtomicU64::new(0),
        })
    }

    /// System calls completed and the host TSC cycles the VMM spent on them.
    pub(crate) fn syscall_cost(&self) -> (u64, u64) {
        (
            self.syscalls.load(Ordering::Relaxed),
            self.syscall_tsc.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn installed_at(&self) -> Option<u64> {
        self.trap.installed_at()
    }

    fn fixups(&self) -> &FixupCounts {
        self.trap.fixups()
    }

    /// Installs the int3 once the guest has an LSTAR and a #PF gate (called after exits until it
    /// is installed or refused). Returns whether it is installed now.
    pub(crate) fn try_install(&self, cpu: &mut dyn VcpuAccess) -> bool {
        if self.installed_at().is_some() {
            return true;
        }
        match syscall_msrs(cpu) {
            Ok(msrs) if msrs.lstar != 0 => {
                let done = self.trap.try_install(cpu);
                if done {
                    log::info!(
                        "syscall relay: LSTAR {:#x}: guest system calls are completed by the VMM",
                        msrs.lstar
                    );
                }
                done
            }
            _ => false,
        }
    }
}

/// One vCPU's view of the relay: its SYSCALL MSRs, read once and kept.
pub(crate) struct VcpuRelay {
    pub shared: Arc<SyscallRelay>,
    msrs: Option<SyscallMsrs>,
    /// When this vCPU looks at the guest's LSTAR and IDT next (not installed yet), or at the
    /// #PF gate (installed).
    poll: TrapPoll,
}

impl VcpuRelay {
    pub(crate) fn new(shared: Arc<SyscallRelay>) -> Self {
        VcpuRelay {
            shared,
            msrs: None,
            poll: TrapPoll::new(),
        }
    }

    /// After every exit: one memory read once installed (and a look at the #PF gate now and
    /// then); before that, a look at the guest's LSTAR and IDT at most every
    /// [`super::idt_trap::POLL_INTERVAL_TSC`].
    pub(crate) fn after_exit(&mut self, cpu: &mut dyn VcpuAccess) {
        let trap = &self.shared.trap;
        if trap.installed_at().is_none() {
            if self.poll.due() {
                self.shared.try_install(cpu);
            }
            return;
        }
        trap.recheck_entry(cpu);
        if self.poll.due() {
            trap.recheck_gate(cpu);
        }
    }

    /// An emulation failure: if the vCPU stopped on the patched handler, relay the system call
    /// or step over the displaced instruction.
    pub(crate) fn on_emulation_failure(
        &mut self,
        cpu: &mut dyn VcpuAccess,
    ) -> Result<Handled, RelayError> {
        let trap = &self.shared.trap;
        let start = crate::tsc::now();
        let Some(stopped) = trap.stopped_at_handler(cpu)? else {
            return Ok(Handled::NotOurs);
        };
        let frame = stopped.frame;
        let mut regs = stopped.regs;
        let mut sregs = cpu.sregs()?;
        let msrs = match self.msrs {
            Some(m) => m,
            None => *self.msrs.insert(syscall_msrs(cpu)?),
        };
        let fetch_error = syscall_error_code(&sregs);
        let mut kind = classify(&frame, sregs.cr2, regs.r11, &msrs, fetch_error);
        if kind != PfKind::SystemCall && syscall_shaped(&frame, sregs.cr2, fetch_error) {
            // Looks like a system call against MSRs we may hold stale: read them again.
            let fresh = syscall_msrs(cpu)?;
            if fresh != msrs {
                self.msrs = Some(fresh);
                self.shared.fixups().record(kinds::MSR_REFRESH);
                kind = classify(&frame, sregs.cr2, regs.r11, &fresh, fetch_error);
            }
        }
        match kind {
            PfKind::SystemCall => {
                let msrs = self.msrs.unwrap_or(msrs);
                if complete_syscall(&frame, &msrs, &mut regs, &mut sregs) {
                    cpu.set_sregs(&sregs)?;
                }
                cpu.set_regs(&regs)?;
                // Written now (not at the loop's commit) so the cost below includes it.
                cpu.commit()?;
                let spent = crate::tsc::now().wrapping_sub(start);
                self.shared.syscall_tsc.fetch_add(spent, Ordering::Relaxed);
                self.shared.syscalls.fetch_add(1, Ordering::Relaxed);
            }
            _ => trap.deliver(cpu, &stopped)?,
        }
        if self.shared.fixups().record(kind.report_name()) {
            log::info!(
                "{} (first: frame RIP {:#x} CS {:#x} error {:#x})",
                kind.report_name(),
                frame.rip,
                frame.cs,
                frame.error
            );
        }
        Ok(Handled::Done(kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::x86::{translate as walk, Paging, CR0_PG, EFER_LMA, RFLAGS_AC};
    use crate::vcpu_access::fake::FakeVcpu;

    fn set_msrs(cpu: &mut FakeVcpu, m: SyscallMsrs) {
        cpu.msrs.insert(MSR_STAR, m.star);
        cpu.msrs.insert(MSR_LSTAR, m.lstar);
        cpu.msrs.insert(MSR_SFMASK, m.sfmask);
    }

    fn translate(mem: &GuestMemoryMmap, cr3: u64, la57: bool, va: u64) -> Option<u64> {
        walk(Paging::Long { la57 }, cr3, va, |pa| {
            mem.read_obj(GuestAddress(pa)).ok()
        })
    }

    use crate::host_quirks::idt_trap::INT3;
    use classify::tests::{syscall_frame, LSTAR, MSRS};
    use kvm_bindings::{kvm_regs, kvm_sregs};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    /// A guest memory with 4-level tables: `va` -> `pa` in 4 KiB pages, plus one 2 MiB page.
    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap()
    }

    const CR3: u64 = 0x1000;

    fn map_4k(mem: &GuestMemoryMmap, va: u64, pa: u64, next: &mut u64) {
        let mut table = CR3;
        for level in (2..=4).rev() {
            let idx = (va >> (12 + 9 * (level - 1))) & 0x1ff;
            let slot = GuestAddress(table + idx * 8);
            let e: u64 = mem.read_obj(slot).unwrap();
            table = if e & 1 == 0 {
                *next += 0x1000;
                mem.write_obj(*next | 3, slot).unwrap();
                *next
            } else {
                e & !0xfff
            };
        }
        let idx = (va >> 12) & 0x1ff;
        mem.write_obj(pa | 3, GuestAddress(table + idx * 8))
            .unwrap();
    }

    #[test]
    fn page_walk_finds_4k_and_2m_pages() {
        let mem = memory();
        let mut next = CR3;
        map_4k(&mem, LSTAR & !0xfff, 0x30_0000, &mut next);
        assert_eq!(translate(&mem, CR3, false, LSTAR), Some(0x30_0040));
        assert_eq!(translate(&mem, CR3, false, LSTAR + 0x1000), None);
        // A 2 MiB page: PDE with PS set.
        let va = 0x4000_0000u64; // PML4 0, PDPT 1, PD 0
        map_4k(&mem, va, 0, &mut next); // builds the tables down to the PT
        let pdpt: u64 = mem.read_obj(GuestAddress(CR3)).unwrap();
        let pd: u64 = mem.read_obj(GuestAddress((pdpt & !0xfff) + 8)).unwrap();
        mem.write_obj(0x20_0000u64 | 0x83, GuestAddress(pd & !0xfff))
            .unwrap();
        assert_eq!(translate(&mem, CR3, false, va + 0x1234), Some(0x20_1234));
        // A table pointer outside guest memory: not mapped, no panic.
        mem.write_obj(0xfff_ffff_f003u64, GuestAddress(CR3 + 8))
            .unwrap();
        assert_eq!(translate(&mem, CR3, false, 1 << 39), None);
    }

    const HANDLER: u64 = 0xffff_ffff_8160_0b20;
    const HANDLER_PA: u64 = 0x31_0b20;
    const IDT: u64 = 0xffff_fe00_0000_0000;
    const IDT_PA: u64 = 0x32_0000;
    const STACK: u64 = 0xffff_c900_0000_3f00;
    const STACK_PA: u64 = 0x33_0f00;

    /// Guest memory with an IDT whose #PF gate points at a handler starting with `entry`, a
    /// kernel stack holding `frame`, and a vCPU stopped at the handler.
    fn guest(entry: &[u8], frame: &PfFrame, cr2: u64) -> FakeVcpu {
        let mem = memory();
        let mut next = CR3;
        map_4k(&mem, HANDLER & !0xfff, HANDLER_PA & !0xfff, &mut next);
        map_4k(&mem, IDT, IDT_PA, &mut next);
        map_4k(&mem, STACK & !0xfff, STACK_PA & !0xfff, &mut next);
        mem.write_slice(entry, GuestAddress(HANDLER_PA)).unwrap();
        let mut gate = [0u8; 16];
        gate[0..2].copy_from_slice(&(HANDLER as u16).to_le_bytes());
        gate[5] = 0x8e;
        gate[6..8].copy_from_slice(&((HANDLER >> 16) as u16).to_le_bytes());
        gate[8..12].copy_from_slice(&((HANDLER >> 32) as u32).to_le_bytes());
        mem.write_slice(&gate, GuestAddress(IDT_PA + 14 * 16))
            .unwrap();
        let words = [
            frame.error,
            frame.rip,
            frame.cs,
            frame.rflags,
            frame.rsp,
            frame.ss,
        ];
        for (i, w) in words.iter().enumerate() {
            mem.write_obj(*w, GuestAddress(STACK_PA + 8 * i as u64))
                .unwrap();
        }
        let mut sregs = kvm_sregs {
            cr0: CR0_PG | 1,
            cr3: CR3,
            cr4: 0x20,
            efer: EFER_LMA | (1 << 8) | (1 << 11),
            cr2,
            ..Default::default()
        };
        sregs.idt.base = IDT;
        sregs.idt.limit = 0xfff;
        sregs.cs.selector = 0x10;
        let regs = kvm_regs {
            rip: HANDLER,
            rsp: STACK,
            rflags: 0x46 | 0x10000,
            rcx: 0x40_102e,
            r11: 0x646,
            ..Default::default()
        };
        let mut cpu = FakeVcpu::new(mem);
        cpu.regs = regs;
        cpu.sregs = sregs;
        set_msrs(&mut cpu, MSRS);
        cpu
    }

    fn relay() -> (Arc<SyscallRelay>, Arc<FixupCounts>) {
        let fixups = Arc::new(FixupCounts::default());
        (SyscallRelay::new(fixups.clone()), fixups)
    }

    #[test]
    fn installs_over_the_handler_and_relays_a_system_call() {
        let mut cpu = guest(&[0x90, 0x90, 0x90], &syscall_frame(), LSTAR);
        let (shared, fixups) = relay();
        let mut v = VcpuRelay::new(shared.clone());
        // Not installed yet: the failure is not the relay's.
        assert_eq!(v.on_emulation_failure(&mut cpu), Ok(Handled::NotOurs));
        v.after_exit(&mut cpu);
        assert_eq!(shared.installed_at(), Some(HANDLER));
        assert_eq!(
            cpu.mem.read_obj::<u8>(GuestAddress(HANDLER_PA)).unwrap(),
            INT3
        );
        assert_eq!(
            v.on_emulation_failure(&mut cpu),
            Ok(Handled::Done(PfKind::SystemCall))
        );
        let r = cpu.regs;
        let s = cpu.sregs;
        assert_eq!((r.rip, r.rsp, r.rflags), (LSTAR, 0x7ffd_0000_1000, 0x46));
        assert_eq!((r.rcx, r.r11), (0x40_102e, 0x646));
        assert_eq!((s.cs.selector, s.cs.dpl, s.ss.selector), (0x10, 0, 0x18));
        // The fake's gate CS (selector 0x10 but not a full 64-bit code segment) needed sregs.
        // Second system call: the MSRs are not read again; one sregs + one regs write each.
        cpu.regs = kvm_regs {
            rip: HANDLER,
            rsp: STACK,
            r11: 0x646,
            ..Default::default()
        };
        let reads = cpu.msr_reads;
        (cpu.regs_sets, cpu.sregs_sets) = (0, 0);
        assert_eq!(
            v.on_emulation_failure(&mut cpu),
            Ok(Handled::Done(PfKind::SystemCall))
        );
        assert_eq!(cpu.msr_reads, reads);
        assert_eq!(
            cpu.regs_sets + cpu.sregs_sets,
            1,
            "CS is already the kernel's: one KVM_SET_REGS only"
        );
        assert_eq!(
            fixups.snapshot(),
            vec![(kinds::SYSCALL, 2)],
            "counted in the fix-up report"
        );
    }

    #[test]
    fn other_faults_step_over_the_displaced_instruction() {
        let user = PfFrame {
            error: 0x6,
            rip: 0x40_1000,
            rflags: 0x10246,
            ..syscall_frame()
        };
        let mut cpu = guest(&[0x0f, 0x01, 0xca, 0x90], &user, 0x50_0000);
        cpu.regs.rflags |= RFLAGS_AC;
        let (shared, fixups) = relay();
        let mut v = VcpuRelay::new(shared.clone());
        v.after_exit(&mut cpu);
        assert_eq!(
            v.on_emulation_failure(&mut cpu),
            Ok(Handled::Done(PfKind::UserFault))
        );
        let r = cpu.regs;
        assert_eq!(r.rip, HANDLER + 3, "CLAC stepped over");
        assert_eq!(r.rflags & RFLAGS_AC, 0, "and done");
        assert_eq!(cpu.sregs.cs.selector, 0x10, "segments untouched");
        // Elsewhere in the kernel: not the relay's.
        cpu.regs.rip = HANDLER + 0x40;
        assert_eq!(v.on_emulation_failure(&mut cpu), Ok(Handled::NotOurs));
        assert_eq!(fixups.snapshot(), vec![(kinds::USER_PF, 1)]);
    }

    #[test]
    fn changed_msrs_are_read_again() {
        let mut cpu = guest(&[0x90], &syscall_frame(), LSTAR);
        let (shared, _) = relay();
        let mut v = VcpuRelay::new(shared);
        v.after_exit(&mut cpu);
        v.msrs = Some(SyscallMsrs {
            lstar: 0xffff_ffff_8100_0000,
            ..MSRS
        });
        assert_eq!(
            v.on_emulation_failure(&mut cpu),
            Ok(Handled::Done(PfKind::SystemCall))
        );
        assert_eq!(v.msrs, Some(MSRS));
    }

    #[test]
    fn unknown_handler_entry_refuses_once_and_leaves_memory_alone() {
        let mut cpu = guest(&[0x55, 0x48, 0x89, 0xe5], &syscall_frame(), LSTAR);
        let (shared, _) = relay();
        let mut v = VcpuRelay::new(shared.clone());
        v.after_exit(&mut cpu);
        assert_eq!(shared.installed_at(), None);
        assert!(shared.trap.refused());
        assert_eq!(
            cpu.mem.read_obj::<u8>(GuestAddress(HANDLER_PA)).unwrap(),
            0x55
        );
        // Not tried again on the same handler; tried, and installed, once the guest's gate names
        // another one (an early-boot handler, then the final one).
        v.poll.reset();
        v.after_exit(&mut cpu);
        assert_eq!(shared.installed_at(), None);
        cpu.mem
            .write_slice(&[0x90], GuestAddress(HANDLER_PA + 0x100))
            .unwrap();
        point_gate(&cpu, HANDLER + 0x100);
        v.poll.reset();
        v.after_exit(&mut cpu);
        assert_eq!(shared.installed_at(), Some(HANDLER + 0x100));
        assert!(!shared.trap.refused());
    }

    /// Points the guest's #PF gate at `handler`.
    fn point_gate(cpu: &FakeVcpu, handler: u64) {
        let mut gate = [0u8; 16];
        gate[0..2].copy_from_slice(&(handler as u16).to_le_bytes());
        gate[5] = 0x8e;
        gate[6..8].copy_from_slice(&((handler >> 16) as u16).to_le_bytes());
        gate[8..12].copy_from_slice(&((handler >> 32) as u32).to_le_bytes());
        cpu.mem
            .write_slice(&gate, GuestAddress(IDT_PA + 14 * 16))
            .unwrap();
    }

    #[test]
    fn not_ready_before_lstar_or_the_idt() {
        let mut cpu = guest(&[0x90], &syscall_frame(), LSTAR);
        let (shared, _) = relay();
        cpu.msrs.insert(MSR_LSTAR, 0);
        assert!(!shared.try_install(&mut cpu));
        cpu.msrs.insert(MSR_LSTAR, LSTAR);
        cpu.sregs.idt.limit = 14 * 16;
        assert!(!shared.try_install(&mut cpu));
        assert!(!shared.trap.refused(), "tries again later");
        cpu.sregs.idt.limit = 0xfff;
        assert!(shared.try_install(&mut cpu));
    }

    #[test]
    fn before_install_the_guest_is_looked_at_only_now_and_then() {
        let mut cpu = guest(&[0x90], &syscall_frame(), LSTAR);
        cpu.msrs.insert(MSR_LSTAR, 0); // not ready
        let (shared, _) = relay();
        let mut v = VcpuRelay::new(shared);
        v.after_exit(&mut cpu);
        v.after_exit(&mut cpu);
        v.after_exit(&mut cpu);
        assert_eq!(cpu.msr_reads, 1, "one look per poll interval, not per exit");
        v.poll.reset();
        cpu.msrs.insert(MSR_LSTAR, LSTAR);
        v.after_exit(&mut cpu);
        assert_eq!(v.shared.installed_at(), Some(HANDLER));
    }

    #[test]
    fn a_rewritten_entry_is_patched_again() {
        let mut cpu = guest(&[0x90, 0x90, 0x90], &syscall_frame(), LSTAR);
        let (shared, fixups) = relay();
        let mut v = VcpuRelay::new(shared.clone());
        v.after_exit(&mut cpu);
        // Alternatives patching turns the three NOPs into one 3-byte NOP.
        cpu.mem
            .write_slice(&[0x0f, 0x1f, 0x00], GuestAddress(HANDLER_PA))
            .unwrap();
        v.after_exit(&mut cpu);
        assert_eq!(
            cpu.mem.read_obj::<u8>(GuestAddress(HANDLER_PA)).unwrap(),
            INT3
        );
        assert_eq!(fixups.snapshot(), vec![(kinds::REINSTALLED, 1)]);
        // A fault now steps over the 3-byte NOP.
        assert_eq!(shared.trap.displaced(), vec![Displaced::Nop(3)]);
        cpu.mem.write_obj(0x4u64, GuestAddress(STACK_PA)).unwrap(); // error: user read
        assert_eq!(
            v.on_emulation_failure(&mut cpu),
            Ok(Handled::Done(PfKind::UserFault))
        );
        assert_eq!(cpu.regs.rip, HANDLER + 3);
    }

    #[test]
    fn an_unreadable_frame_is_an_error_not_a_panic() {
        let mut cpu = guest(&[0x90], &syscall_frame(), LSTAR);
        let (shared, _) = relay();
        let mut v = VcpuRelay::new(shared);
        v.after_exit(&mut cpu);
        cpu.regs.rsp = 0xffff_8888_0000_0000;
        assert!(v.on_emulation_failure(&mut cpu).is_err());
    }

    #[test]
    fn a_moved_gate_moves_the_int3_and_puts_the_old_byte_back() {
        let mut cpu = guest(&[0x90, 0x90, 0x90], &syscall_frame(), LSTAR);
        let (shared, fixups) = relay();
        let mut v = VcpuRelay::new(shared.clone());
        v.after_exit(&mut cpu);
        assert_eq!(shared.installed_at(), Some(HANDLER));
        // The guest points its #PF gate at a new handler (an ENDBR64) on the same page.
        let new = HANDLER + 0x100;
        cpu.mem
            .write_slice(&[0xf3, 0x0f, 0x1e, 0xfa], GuestAddress(HANDLER_PA + 0x100))
            .unwrap();
        point_gate(&cpu, new);
        v.after_exit(&mut cpu);
        assert_eq!(
            shared.installed_at(),
            Some(HANDLER),
            "not looked at before the poll"
        );
        v.poll.reset();
        v.after_exit(&mut cpu);
        assert_eq!(shared.installed_at(), Some(new));
        let byte = |cpu: &FakeVcpu, pa| cpu.mem.read_obj::<u8>(GuestAddress(pa)).unwrap();
        assert_eq!(
            byte(&cpu, HANDLER_PA),
            0x90,
            "the old handler's NOP is back"
        );
        assert_eq!(byte(&cpu, HANDLER_PA + 0x100), INT3);
        assert_eq!(shared.trap.displaced(), vec![Displaced::Nop(4)]);
        assert_eq!(fixups.snapshot(), vec![(kinds::MOVED, 1)]);
        // A #PF now stops at the new handler and steps over its ENDBR64.
        cpu.regs.rip = new;
        cpu.mem.write_obj(0x4u64, GuestAddress(STACK_PA)).unwrap();
        assert_eq!(
            v.on_emulation_failure(&mut cpu),
            Ok(Handled::Done(PfKind::UserFault))
        );
        assert_eq!(cpu.regs.rip, new + 4);
    }

    #[test]
    fn a_displaced_push_is_pushed_when_the_fault_goes_to_the_guest() {
        let user = PfFrame {
            error: 0x6,
            rip: 0x40_1000,
            ..syscall_frame()
        };
        // kvm-unit-tests' entry stub: pushq $14; jmp __handle_exception
        let mut cpu = guest(&[0x6a, 0x0e, 0xe9, 0, 0, 0, 0], &user, 0x50_0000);
        let (shared, _) = relay();
        let mut v = VcpuRelay::new(shared.clone());
        v.after_exit(&mut cpu);
        assert_eq!(shared.trap.displaced(), vec![Displaced::Push(2, 14)]);
        assert_eq!(
            v.on_emulation_failure(&mut cpu),
            Ok(Handled::Done(PfKind::UserFault))
        );
        assert_eq!((cpu.regs.rip, cpu.regs.rsp), (HANDLER + 2, STACK - 8));
        let pushed: u64 = cpu.mem.read_obj(GuestAddress(STACK_PA - 8)).unwrap();
        assert_eq!(pushed, 14);
    }
}
