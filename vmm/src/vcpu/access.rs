//! One typed access layer to a vCPU's state: [`VcpuAccess`]. Everything on the run-time path
//! that reads or writes guest state goes through it — the MSR path (the RDPMC service's RIP
//! check, KVM's own MSR value), the host-quirk fix-ups (`host_quirks::emulate`), the SYSCALL
//! relay, the profile sampler (RIP and CPL per sample) and the end-of-thread report — so there
//! is one set of ioctl wrappers, one page walk ([`crate::arch::x86::translate`]) and one error
//! type ([`AccessError`], over [`KvmVcpuError`]).
//!
//! [`KvmVcpu`] is the KVM implementation: a per-exit cache over the vCPU's raw descriptor and
//! the guest memory. Registers and special registers are loaded lazily (one KVM_GET_REGS /
//! KVM_GET_SREGS however many users ask during one exit), changes are kept in the cache and
//! written back once by [`VcpuAccess::commit`], which the vCPU loop calls before the next
//! KVM_RUN (special registers first, then registers; KVM_SET_VCPU_EVENTS flushes them first,
//! because KVM_SET_REGS drops a pending exception). It works on the raw descriptor because the
//! exit being handled still borrows the `VcpuFd`.
//!
//! **Sync registers (KVM_CAP_SYNC_REGS, 7 on this project's hosts: regs, sregs, events).** The
//! cache is shaped so that they plug in without changing a user: enable
//! `kvm_run.kvm_valid_regs = KVM_SYNC_X86_REGS | KVM_SYNC_X86_SREGS | KVM_SYNC_X86_EVENTS` once;
//! then KVM copies the three into `kvm_run.s.regs` at every exit, so the lazy load becomes a
//! copy out of `kvm_run` (no ioctl), and the write-back in `commit` becomes a copy into
//! `kvm_run.s.regs` plus the matching bits in `kvm_run.kvm_dirty_regs`, which KVM applies
//! (regs, sregs, events, in that order) at the next KVM_RUN. MSRs and FPU stay ioctls.
//!
//! **Guest memory.** Guest-virtual reads and writes walk the guest's page tables in software
//! over the cached CR3/CR4/EFER (no KVM_TRANSLATE), page by page, and are bounded by the
//! caller's buffer: a profile sampler can read a few bytes per sample (a stack word, an
//! instruction) at the cost of one cached KVM_GET_SREGS per exit and a few memory loads.

use std::os::fd::{AsRawFd, RawFd};

use kvm_bindings::{kvm_fpu, kvm_msr_entry, kvm_msrs, kvm_regs, kvm_sregs, kvm_vcpu_events, Msrs};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::ioctl::{ioctl_with_mut_ptr, ioctl_with_mut_ref, ioctl_with_ref};
use vmm_sys_util::{ioctl_ior_nr, ioctl_iow_nr, ioctl_iowr_nr};

use crate::arch::x86::{self, Paging};
pub use crate::kvm_error::{AccessError, KvmVcpuError};

/// A vCPU's state as the VMM's run-time code sees it. Getters may be served from a cache;
/// setters change the cache, and [`commit`](Self::commit) writes it back (the vCPU loop commits
/// before every KVM_RUN).
pub trait VcpuAccess {
    fn regs(&mut self) -> Result<kvm_regs, AccessError>;
    fn set_regs(&mut self, regs: &kvm_regs) -> Result<(), AccessError>;
    fn sregs(&mut self) -> Result<kvm_sregs, AccessError>;
    fn set_sregs(&mut self, sregs: &kvm_sregs) -> Result<(), AccessError>;
    /// Reads the MSRs `indices` as KVM holds them (KVM_GET_MSRS, which the MSR filter does not
    /// apply to) into `out`; returns how many were read (KVM stops at the first it does not
    /// know).
    fn msrs(&mut self, indices: &[u32], out: &mut [u64]) -> Result<usize, AccessError>;
    fn fpu(&mut self) -> Result<kvm_fpu, AccessError>;
    fn set_fpu(&mut self, fpu: &kvm_fpu) -> Result<(), AccessError>;
    fn vcpu_events(&mut self) -> Result<kvm_vcpu_events, AccessError>;
    /// Writes back changed registers first (KVM_SET_REGS would drop a pending exception).
    fn set_vcpu_events(&mut self, events: &kvm_vcpu_events) -> Result<(), AccessError>;
    /// The guest's RAM.
    fn memory(&self) -> &GuestMemoryMmap;
    /// Writes changed state back to the vCPU (special registers, then registers).
    fn commit(&mut self) -> Result<(), AccessError>;

    /// The guest RIP.
    fn rip(&mut self) -> Result<u64, AccessError> {
        self.regs().map(|r| r.rip)
    }

    /// The current privilege level (CS.RPL in protected mode, 0 in real mode).
    fn cpl(&mut self) -> Result<u8, AccessError> {
        let s = self.sregs()?;
        Ok(if s.cr0 & x86::CR0_PE != 0 {
            (s.cs.selector & 3) as u8
        } else {
            0
        })
    }

    /// One MSR as KVM holds it; `None` if KVM does not know it.
    fn msr(&mut self, index: u32) -> Result<Option<u64>, AccessError> {
        let mut v = [0u64];
        Ok((self.msrs(&[index], &mut v)? == 1).then_some(v[0]))
    }

    /// Guest-linear to guest-physical, through the guest's page tables as the vCPU has them
    /// now (the one page walk, [`x86::translate`]).
    fn translate(&mut self, gva: u64) -> Result<u64, AccessError> {
        let s = self.sregs()?;
        let mem = self.memory();
        x86::translate(Paging::of(s.cr0, s.cr4, s.efer), s.cr3, gva, |pa| {
            mem.read_obj::<u64>(GuestAddress(pa)).ok()
        })
        .ok_or(AccessError::NotMapped(gva))
    }

    /// Reads guest-virtual memory, page by page.
    fn read_virt(&mut self, gva: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        let mut done = 0;
        while done < buf.len() {
            let va = gva.wrapping_add(done as u64);
            let n = ((0x1000 - (va & 0xfff)) as usize).min(buf.len() - done);
            let pa = self.translate(va)?;
            self.memory()
                .read_slice(&mut buf[done..done + n], GuestAddress(pa))
                .map_err(|_| AccessError::OutsideMemory(pa))?;
            done += n;
        }
        Ok(())
    }

    /// Writes guest-virtual memory, page by page (pages before an unmapped one are written).
    fn write_virt(&mut self, gva: u64, buf: &[u8]) -> Result<(), AccessError> {
        let mut done = 0;
        while done < buf.len() {
            let va = gva.wrapping_add(done as u64);
            let n = ((0x1000 - (va & 0xfff)) as usize).min(buf.len() - done);
            let pa = self.translate(va)?;
            self.memory()
                .write_slice(&buf[done..done + n], GuestAddress(pa))
                .map_err(|_| AccessError::OutsideMemory(pa))?;
            done += n;
        }
        Ok(())
    }
}

const KVMIO: u32 = 0xAE;
ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_regs);
ioctl_iow_nr!(KVM_SET_REGS, KVMIO, 0x82, kvm_regs);
ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_sregs);
ioctl_iow_nr!(KVM_SET_SREGS, KVMIO, 0x84, kvm_sregs);
ioctl_iowr_nr!(KVM_GET_MSRS, KVMIO, 0x88, kvm_msrs);
ioctl_ior_nr!(KVM_GET_FPU, KVMIO, 0x8c, kvm_fpu);
ioctl_iow_nr!(KVM_SET_FPU, KVMIO, 0x8d, kvm_fpu);
ioctl_ior_nr!(KVM_GET_VCPU_EVENTS, KVMIO, 0x9f, kvm_vcpu_events);
ioctl_iow_nr!(KVM_SET_VCPU_EVENTS, KVMIO, 0xa0, kvm_vcpu_events);

/// A vCPU's raw descriptor (valid as long as its `VcpuFd` lives).
#[derive(Clone, Copy)]
struct Raw(RawFd);

impl AsRawFd for Raw {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

fn check(ret: i32, err: fn(kvm_ioctls::Error) -> KvmVcpuError) -> Result<i32, KvmVcpuError> {
    if ret < 0 {
        Err(err(kvm_ioctls::Error::last()))
    } else {
        Ok(ret)
    }
}

/// [`VcpuAccess`] over KVM: ioctls on the vCPU descriptor, cached for one exit (see the module
/// comment). Make one per exit: after KVM_RUN the cached state is stale.
pub struct KvmVcpu<'a> {
    fd: Raw,
    mem: &'a GuestMemoryMmap,
    regs: Option<kvm_regs>,
    sregs: Option<kvm_sregs>,
    regs_dirty: bool,
    sregs_dirty: bool,
}

impl<'a> KvmVcpu<'a> {
    /// `fd` must be a vCPU descriptor that outlives this value.
    pub fn new(fd: RawFd, mem: &'a GuestMemoryMmap) -> Self {
        KvmVcpu {
            fd: Raw(fd),
            mem,
            regs: None,
            sregs: None,
            regs_dirty: false,
            sregs_dirty: false,
        }
    }
}

impl VcpuAccess for KvmVcpu<'_> {
    fn regs(&mut self) -> Result<kvm_regs, AccessError> {
        if let Some(r) = self.regs {
            return Ok(r);
        }
        let mut r = kvm_regs::default();
        // SAFETY: KVM_GET_REGS writes one kvm_regs, which `r` is; the fd is a vCPU's.
        let rc = unsafe { ioctl_with_mut_ref(&self.fd, KVM_GET_REGS(), &mut r) };
        check(rc, KvmVcpuError::GetRegs)?;
        Ok(*self.regs.insert(r))
    }

    fn set_regs(&mut self, regs: &kvm_regs) -> Result<(), AccessError> {
        self.regs = Some(*regs);
        self.regs_dirty = true;
        Ok(())
    }

    fn sregs(&mut self) -> Result<kvm_sregs, AccessError> {
        if let Some(s) = self.sregs {
            return Ok(s);
        }
        let mut s = kvm_sregs::default();
        // SAFETY: KVM_GET_SREGS writes one kvm_sregs, which `s` is; the fd is a vCPU's.
        let rc = unsafe { ioctl_with_mut_ref(&self.fd, KVM_GET_SREGS(), &mut s) };
        check(rc, KvmVcpuError::GetSregs)?;
        Ok(*self.sregs.insert(s))
    }

    fn set_sregs(&mut self, sregs: &kvm_sregs) -> Result<(), AccessError> {
        self.sregs = Some(*sregs);
        self.sregs_dirty = true;
        Ok(())
    }

    fn msrs(&mut self, indices: &[u32], out: &mut [u64]) -> Result<usize, AccessError> {
        let entries: Vec<kvm_msr_entry> = indices
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs = Msrs::from_entries(&entries)
            .map_err(|_| KvmVcpuError::GetMsrs(kvm_ioctls::Error::new(libc::E2BIG)))?;
        // SAFETY: the pointer is a kvm_msrs header followed by `nmsrs` entries (the FAM
        // wrapper's allocation); KVM_GET_MSRS writes at most that many; the fd is a vCPU's.
        let n = check(
            unsafe { ioctl_with_mut_ptr(&self.fd, KVM_GET_MSRS(), msrs.as_mut_fam_struct_ptr()) },
            KvmVcpuError::GetMsrs,
        )? as usize;
        for (o, e) in out.iter_mut().zip(&msrs.as_slice()[..n.min(indices.len())]) {
            *o = e.data;
        }
        Ok(n)
    }

    fn fpu(&mut self) -> Result<kvm_fpu, AccessError> {
        let mut f = kvm_fpu::default();
        // SAFETY: KVM_GET_FPU writes one kvm_fpu, which `f` is; the fd is a vCPU's.
        let rc = unsafe { ioctl_with_mut_ref(&self.fd, KVM_GET_FPU(), &mut f) };
        check(rc, KvmVcpuError::GetFpu)?;
        Ok(f)
    }

    fn set_fpu(&mut self, fpu: &kvm_fpu) -> Result<(), AccessError> {
        // SAFETY: KVM_SET_FPU reads one kvm_fpu; the fd is a vCPU's.
        let rc = unsafe { ioctl_with_ref(&self.fd, KVM_SET_FPU(), fpu) };
        check(rc, KvmVcpuError::SetFpu)?;
        Ok(())
    }

    fn vcpu_events(&mut self) -> Result<kvm_vcpu_events, AccessError> {
        let mut e = kvm_vcpu_events::default();
        // SAFETY: KVM_GET_VCPU_EVENTS writes one kvm_vcpu_events, which `e` is.
        let rc = unsafe { ioctl_with_mut_ref(&self.fd, KVM_GET_VCPU_EVENTS(), &mut e) };
        check(rc, KvmVcpuError::GetVcpuEvents)?;
        Ok(e)
    }

    fn set_vcpu_events(&mut self, events: &kvm_vcpu_events) -> Result<(), AccessError> {
        self.commit()?;
        // SAFETY: KVM_SET_VCPU_EVENTS reads one kvm_vcpu_events; the fd is a vCPU's.
        let rc = unsafe { ioctl_with_ref(&self.fd, KVM_SET_VCPU_EVENTS(), events) };
        check(rc, KvmVcpuError::SetVcpuEvents)?;
        Ok(())
    }

    fn memory(&self) -> &GuestMemoryMmap {
        self.mem
    }

    fn commit(&mut self) -> Result<(), AccessError> {
        if self.sregs_dirty {
            if let Some(s) = &self.sregs {
                // SAFETY: KVM_SET_SREGS reads one kvm_sregs; the fd is a vCPU's.
                let rc = unsafe { ioctl_with_ref(&self.fd, KVM_SET_SREGS(), s) };
                check(rc, KvmVcpuError::SetSregs)?;
            }
            self.sregs_dirty = false;
        }
        if self.regs_dirty {
            if let Some(r) = &self.regs {
                // SAFETY: KVM_SET_REGS reads one kvm_regs; the fd is a vCPU's.
                let rc = unsafe { ioctl_with_ref(&self.fd, KVM_SET_REGS(), r) };
                check(rc, KvmVcpuError::SetRegs)?;
            }
            self.regs_dirty = false;
        }
        Ok(())
    }
}

/// A vCPU without KVM, for unit tests (here and in `tests/`): plain state, guest memory, and
/// counts of what a KVM vCPU would have paid in ioctls.
pub mod fake {
    use std::collections::BTreeMap;

    use super::*;

    pub struct FakeVcpu {
        pub regs: kvm_regs,
        pub sregs: kvm_sregs,
        pub fpu: kvm_fpu,
        pub events: kvm_vcpu_events,
        /// MSRs KVM would know.
        pub msrs: BTreeMap<u32, u64>,
        pub mem: GuestMemoryMmap,
        /// KVM_GET_MSRS calls.
        pub msr_reads: u32,
        /// KVM_SET_REGS / KVM_SET_SREGS a commit would have made.
        pub regs_sets: u32,
        pub sregs_sets: u32,
        /// KVM_SET_VCPU_EVENTS calls.
        pub event_sets: u32,
        dirty: (bool, bool),
    }

    impl FakeVcpu {
        /// A vCPU with `mem` and zeroed state (paging off: virtual = physical).
        pub fn new(mem: GuestMemoryMmap) -> Self {
            FakeVcpu {
                regs: kvm_regs::default(),
                sregs: kvm_sregs::default(),
                fpu: kvm_fpu::default(),
                events: kvm_vcpu_events::default(),
                msrs: BTreeMap::new(),
                mem,
                msr_reads: 0,
                regs_sets: 0,
                sregs_sets: 0,
                event_sets: 0,
                dirty: (false, false),
            }
        }

        /// The state set so far and not committed, as (regs, sregs).
        pub fn dirty(&self) -> (bool, bool) {
            self.dirty
        }
    }

    impl Default for FakeVcpu {
        /// One page of guest memory at 0.
        fn default() -> Self {
            FakeVcpu::new(
                GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)])
                    .expect("a one-page guest memory"),
            )
        }
    }

    impl VcpuAccess for FakeVcpu {
        fn regs(&mut self) -> Result<kvm_regs, AccessError> {
            Ok(self.regs)
        }
        fn set_regs(&mut self, regs: &kvm_regs) -> Result<(), AccessError> {
            self.regs = *regs;
            self.dirty.0 = true;
            Ok(())
        }
        fn sregs(&mut self) -> Result<kvm_sregs, AccessError> {
            Ok(self.sregs)
        }
        fn set_sregs(&mut self, sregs: &kvm_sregs) -> Result<(), AccessError> {
            self.sregs = *sregs;
            self.dirty.1 = true;
            Ok(())
        }
        fn msrs(&mut self, indices: &[u32], out: &mut [u64]) -> Result<usize, AccessError> {
            self.msr_reads += 1;
            let mut n = 0;
            for (i, o) in indices.iter().zip(out.iter_mut()) {
                match self.msrs.get(i) {
                    Some(v) => *o = *v,
                    None => break,
                }
                n += 1;
            }
            Ok(n)
        }
        fn fpu(&mut self) -> Result<kvm_fpu, AccessError> {
            Ok(self.fpu)
        }
        fn set_fpu(&mut self, fpu: &kvm_fpu) -> Result<(), AccessError> {
            self.fpu = *fpu;
            Ok(())
        }
        fn vcpu_events(&mut self) -> Result<kvm_vcpu_events, AccessError> {
            Ok(self.events)
        }
        fn set_vcpu_events(&mut self, events: &kvm_vcpu_events) -> Result<(), AccessError> {
            self.commit()?;
            self.events = *events;
            self.event_sets += 1;
            Ok(())
        }
        fn memory(&self) -> &GuestMemoryMmap {
            &self.mem
        }
        fn commit(&mut self) -> Result<(), AccessError> {
            if self.dirty.1 {
                self.sregs_sets += 1;
            }
            if self.dirty.0 {
                self.regs_sets += 1;
            }
            self.dirty = (false, false);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeVcpu;
    use super::*;

    #[test]
    fn virtual_access_crosses_pages_and_reports_unmapped() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let mut cpu = FakeVcpu::new(mem);
        // Paging off: virtual = physical.
        cpu.write_virt(0xffe, &[1, 2, 3, 4]).unwrap();
        let mut b = [0u8; 4];
        cpu.read_virt(0xffe, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4]);
        assert_eq!(
            cpu.read_virt(0x20_0000, &mut b),
            Err(AccessError::OutsideMemory(0x20_0000))
        );
        // Long mode with an empty PML4: nothing is mapped.
        cpu.sregs.cr0 = x86::CR0_PG | x86::CR0_PE;
        cpu.sregs.efer = x86::EFER_LMA;
        cpu.sregs.cr3 = 0x8000;
        assert_eq!(cpu.translate(0x1000), Err(AccessError::NotMapped(0x1000)));
    }

    #[test]
    fn msrs_stop_at_the_first_unknown_and_events_commit_registers_first() {
        let mut cpu = FakeVcpu::default();
        cpu.msrs.insert(x86::MSR_LSTAR, 7);
        assert_eq!(cpu.msr(x86::MSR_LSTAR), Ok(Some(7)));
        assert_eq!(cpu.msr(x86::MSR_STAR), Ok(None));
        let mut r = cpu.regs().unwrap();
        r.rip = 5;
        cpu.set_regs(&r).unwrap();
        assert_eq!(cpu.dirty(), (true, false));
        let ev = cpu.vcpu_events().unwrap();
        cpu.set_vcpu_events(&ev).unwrap();
        assert_eq!((cpu.regs_sets, cpu.dirty()), (1, (false, false)));
    }
}
