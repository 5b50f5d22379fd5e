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
//! because KVM_SET_REGS drops a pending exception) — or, with sync registers, no ioctl at all
//! (below). It works on the raw descriptor because the
//! exit being handled still borrows the `VcpuFd`.
//!
//! **Sync registers (KVM_CAP_SYNC_REGS, 7 on this project's hosts: regs, sregs, events).**
//! Where the host has all three (and `VmConfig::sync_regs`, on by default, and the SYSCALL
//! relay runs: host quirks), the vCPU loop sets
//! `kvm_run.kvm_valid_regs` once before its first KVM_RUN (KVM never clears it) and makes each
//! exit's cache with [`KvmVcpu::with_sync_regs`]: KVM copies the three into `kvm_run.s.regs`
//! at the end of every KVM_RUN (`store_regs` in x86.c, on every return, EINTR included), so the
//! lazy load is a copy out of `kvm_run` (no ioctl), and `commit` copies the changed sets into
//! `kvm_run.s.regs` and ORs their bits into `kvm_run.kvm_dirty_regs`. KVM applies them at the
//! start of the next KVM_RUN (`sync_regs`: regs, then sregs, then events, so a pending
//! exception survives the register write; before the `immediate_exit` check, so a kicked run
//! still applies them) and clears each bit as it does. Caveats, from x86.c: a vCPU still
//! waiting for INIT/SIPI returns from KVM_RUN without applying dirty sets (and `store_regs`
//! then overwrites them) — the loop writes no registers of such a vCPU; invalid sregs or
//! events make that KVM_RUN fail with EINVAL instead of a SET ioctl failing. Events carry
//! KVM_VCPUEVENT_VALID_NMI_PENDING as KVM reports them: written back unchanged the flag would
//! make KVM replace its NMI queue with the exit's old view of it, so [`events_to_sync`] drops
//! the flag unless the caller changed `nmi.pending` — as [`VcpuAccess::queue_nmi`] does for a
//! PMI, which on this path costs no KVM_NMI ioctl (the vCPU loop queues it before `commit`).
//! `interrupt_bitmap` in sregs round-trips as with KVM_GET/SET_SREGS. MSRs, FPU and LAPIC stay ioctls; [`KvmVcpu::ioctls`] counts the ones made
//! (the run report's `ExitCounts::access_ioctls`: 0 per relayed system call with sync
//! registers, 3 without).
//!
//! **Guest memory.** Guest-virtual reads and writes walk the guest's page tables in software
//! over the cached CR3/CR4/EFER (no KVM_TRANSLATE), page by page, and are bounded by the
//! caller's buffer: a profile sampler can read a few bytes per sample (a stack word, an
//! instruction) at the cost of one cached KVM_GET_SREGS per exit and a few memory loads.
//!
//! Beside it: [`kick`] (interrupting a vCPU's KVM_RUN from another thread) and [`lapic`] (the
//! LAPIC registers in KVM's page).

pub(crate) mod kick;
pub(crate) mod lapic;

use std::os::fd::{AsRawFd, RawFd};

use std::ptr::{self, NonNull};

use kvm_bindings::{
    kvm_device_attr, kvm_fpu, kvm_msr_entry, kvm_msrs, kvm_regs, kvm_run, kvm_sregs, kvm_sync_regs,
    kvm_vcpu_events, Msrs, KVM_SYNC_X86_EVENTS, KVM_SYNC_X86_REGS, KVM_SYNC_X86_SREGS,
    KVM_VCPUEVENT_VALID_NMI_PENDING,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::ioctl::{ioctl, ioctl_with_mut_ptr, ioctl_with_mut_ref, ioctl_with_ref};
use vmm_sys_util::{ioctl_io_nr, ioctl_ior_nr, ioctl_iow_nr, ioctl_iowr_nr};

use crate::arch::x86::{self, Paging};

/// The longest x86 instruction, in bytes.
pub(crate) const MAX_INSTRUCTION: usize = 15;
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
    /// Queues an NMI for the vCPU (the PMI through LVTPC's NMI mode). An NMI already pending
    /// absorbs it, as a second NMI line edge would on hardware.
    fn queue_nmi(&mut self) -> Result<(), AccessError>;
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
        let cr3 = self.sregs()?.cr3;
        self.translate_at(cr3, gva)
    }

    /// The same walk from another root table (`cr3`, as CR3 holds it): the vCPU's paging mode,
    /// another address space (the kernel's own under page-table isolation).
    fn translate_at(&mut self, cr3: u64, gva: u64) -> Result<u64, AccessError> {
        let s = self.sregs()?;
        let mem = self.memory();
        x86::translate(Paging::of(s.cr0, s.cr4, s.efer), cr3, gva, |pa| {
            mem.read_obj::<u64>(GuestAddress(pa)).ok()
        })
        .ok_or(AccessError::NotMapped(gva))
    }

    /// Reads guest-virtual memory, page by page.
    fn read_virt(&mut self, gva: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        let cr3 = self.sregs()?.cr3;
        self.read_virt_at(cr3, gva, buf)
    }

    /// Reads guest-virtual memory of the address space whose root is `cr3`.
    fn read_virt_at(&mut self, cr3: u64, gva: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        let mut done = 0;
        while done < buf.len() {
            let va = gva.wrapping_add(done as u64);
            let n = ((0x1000 - (va & 0xfff)) as usize).min(buf.len() - done);
            let pa = self.translate_at(cr3, va)?;
            self.memory()
                .read_slice(&mut buf[done..done + n], GuestAddress(pa))
                .map_err(|_| AccessError::OutsideMemory(pa))?;
            done += n;
        }
        Ok(())
    }

    /// The bytes of the instruction at guest-virtual `gva`: 15 (the longest x86 instruction), or
    /// as many as can be read before an unmapped page (an instruction may end just before one);
    /// empty if none can.
    fn read_instruction(&mut self, gva: u64) -> Vec<u8> {
        let mut buf = [0u8; MAX_INSTRUCTION];
        if self.read_virt(gva, &mut buf).is_ok() {
            return buf.to_vec();
        }
        let to_page_end = (0x1000 - (gva & 0xfff)) as usize;
        let n = to_page_end.min(MAX_INSTRUCTION);
        match self.read_virt(gva, &mut buf[..n]) {
            Ok(()) => buf[..n].to_vec(),
            Err(_) => Vec::new(),
        }
    }

    /// The 8-byte GDT descriptor for `selector`, if it is a GDT selector (not null, not LDT)
    /// within the GDT's limit (`sregs`: the vCPU's) and its bytes can be read.
    fn gdt_descriptor(&mut self, sregs: &kvm_sregs, selector: u16) -> Option<u64> {
        if selector & 4 != 0 {
            return None;
        }
        let offset = u64::from(selector & !7);
        if offset == 0 || offset + 7 > u64::from(sregs.gdt.limit) {
            return None;
        }
        let mut raw = [0u8; 8];
        self.read_virt(sregs.gdt.base.wrapping_add(offset), &mut raw)
            .ok()?;
        Some(u64::from_le_bytes(raw))
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
ioctl_io_nr!(KVM_NMI, KVMIO, 0x9a);
ioctl_iow_nr!(KVM_GET_DEVICE_ATTR, KVMIO, 0xe2, kvm_device_attr);

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

/// What [`KvmVcpu`] asks KVM to copy into `kvm_run.s.regs` at every exit (and what it may
/// write back through `kvm_run.kvm_dirty_regs`): registers, special registers, vCPU events.
pub(crate) const SYNC_REGS_WANTED: u64 =
    (KVM_SYNC_X86_REGS | KVM_SYNC_X86_SREGS | KVM_SYNC_X86_EVENTS) as u64;

/// Whether a KVM_CHECK_EXTENSION(KVM_CAP_SYNC_REGS) answer covers [`SYNC_REGS_WANTED`].
pub(crate) fn sync_regs_usable(cap: i32) -> bool {
    cap > 0 && (cap as u64) & SYNC_REGS_WANTED == SYNC_REGS_WANTED
}

/// Where [`KvmVcpu`] reads and writes registers, special registers and vCPU events.
#[derive(Clone, Copy)]
enum Path {
    /// KVM_GET/SET_REGS, _SREGS, _VCPU_EVENTS.
    Ioctl,
    /// `kvm_run.s.regs`, filled by KVM at every exit; writes go back through
    /// `kvm_run.kvm_dirty_regs` at the next KVM_RUN.
    Sync(NonNull<kvm_run>),
}

/// [`VcpuAccess`] over KVM: ioctls on the vCPU descriptor, or the vCPU's `kvm_run` where sync
/// registers are on, cached for one exit (see the module comment). Make one per exit: after
/// KVM_RUN the cached state is stale.
pub struct KvmVcpu<'a> {
    fd: Raw,
    mem: &'a GuestMemoryMmap,
    path: Path,
    regs: Option<kvm_regs>,
    sregs: Option<kvm_sregs>,
    events: Option<kvm_vcpu_events>,
    regs_dirty: bool,
    sregs_dirty: bool,
    events_dirty: bool,
    ioctls: u32,
}

impl<'a> KvmVcpu<'a> {
    /// `fd` must be a vCPU descriptor that outlives this value. Everything goes through ioctls.
    pub fn new(fd: RawFd, mem: &'a GuestMemoryMmap) -> Self {
        KvmVcpu {
            fd: Raw(fd),
            mem,
            path: Path::Ioctl,
            regs: None,
            sregs: None,
            events: None,
            regs_dirty: false,
            sregs_dirty: false,
            events_dirty: false,
            ioctls: 0,
        }
    }

    /// Like [`new`](Self::new), but registers, special registers and vCPU events are read from
    /// `run.s.regs` and written back through `run.kvm_dirty_regs` (no ioctl). MSRs and the FPU
    /// stay ioctls.
    ///
    /// # Safety
    /// `run` must be the `kvm_run` mapping of the vCPU `fd`, valid for as long as this value
    /// lives, with `kvm_valid_regs` holding [`SYNC_REGS_WANTED`] since before the last KVM_RUN
    /// (so KVM filled `s.regs` at that exit), and no other code may write `s.regs` or
    /// `kvm_dirty_regs` meanwhile (KVM only touches them inside KVM_RUN).
    pub(crate) unsafe fn with_sync_regs(
        fd: RawFd,
        run: NonNull<kvm_run>,
        mem: &'a GuestMemoryMmap,
    ) -> Self {
        KvmVcpu {
            path: Path::Sync(run),
            ..KvmVcpu::new(fd, mem)
        }
    }

    #[cfg(test)]
    /// Whether this value reads and writes registers through `kvm_run` (sync registers).
    pub(crate) fn uses_sync_regs(&self) -> bool {
        matches!(self.path, Path::Sync(_))
    }

    /// The ioctls this value has made so far (register, special register, event, MSR and FPU
    /// reads and writes; 0 for a relayed system call on a sync-registers host).
    pub fn ioctls(&self) -> u32 {
        self.ioctls
    }

    /// The sync-register area and the dirty mask of `run`.
    fn sync_area(run: NonNull<kvm_run>) -> (*mut kvm_sync_regs, *mut u64) {
        let run = run.as_ptr();
        // SAFETY: `run` points to a live kvm_run (with_sync_regs' contract); addr_of_mut! makes
        // field pointers without creating a reference (the exit being handled may hold one to
        // another part of the mapping).
        unsafe {
            (
                ptr::addr_of_mut!((*run).s.regs),
                ptr::addr_of_mut!((*run).kvm_dirty_regs),
            )
        }
    }

    fn ioctl_get<T: Default>(
        &mut self,
        nr: libc::c_ulong,
        err: fn(kvm_ioctls::Error) -> KvmVcpuError,
    ) -> Result<T, KvmVcpuError> {
        let mut v = T::default();
        self.ioctls += 1;
        // SAFETY: every caller passes a KVM_GET_* request whose argument is one T, which `v`
        // is; the fd is a vCPU's.
        let rc = unsafe { ioctl_with_mut_ref(&self.fd, nr, &mut v) };
        check(rc, err)?;
        Ok(v)
    }

    fn ioctl_set<T>(
        &mut self,
        nr: libc::c_ulong,
        v: &T,
        err: fn(kvm_ioctls::Error) -> KvmVcpuError,
    ) -> Result<(), KvmVcpuError> {
        self.ioctls += 1;
        // SAFETY: every caller passes a KVM_SET_* request whose argument is one T, which `v`
        // is (KVM only reads it); the fd is a vCPU's.
        let rc = unsafe { ioctl_with_ref(&self.fd, nr, v) };
        check(rc, err)?;
        Ok(())
    }
}

/// The vCPU's TSC offset (guest TSC = host TSC + this, wrapping), as KVM keeps it
/// (KVM_GET_DEVICE_ATTR, KVM_VCPU_TSC_CTRL / KVM_VCPU_TSC_OFFSET; Linux 5.16+). `None` where KVM
/// does not say. On VT-x/SVM hosts KVM starts each guest's TSC near 0, so a host TSC (an overflow
/// signal's) and a guest one (its NMI handler's) compare only through this.
pub(crate) fn guest_tsc_offset(fd: &impl AsRawFd) -> Option<i64> {
    let mut offset = 0u64;
    let attr = kvm_device_attr {
        flags: 0,
        group: kvm_bindings::KVM_VCPU_TSC_CTRL,
        attr: u64::from(kvm_bindings::KVM_VCPU_TSC_OFFSET),
        addr: ptr::addr_of_mut!(offset) as u64,
    };
    // SAFETY: KVM_GET_DEVICE_ATTR reads one kvm_device_attr, which `attr` is, and writes the
    // attribute's one u64 to `addr`, which points to `offset`, alive until the call returns.
    let rc = unsafe { ioctl_with_ref(fd, KVM_GET_DEVICE_ATTR(), &attr) };
    (rc == 0).then_some(offset as i64)
}

/// The vCPU events to hand KVM through sync registers: `new` as the caller wrote it, except
/// that an unchanged NMI-pending state is not written. (KVM_SET_VCPU_EVENTS with
/// KVM_VCPUEVENT_VALID_NMI_PENDING replaces the NMI queue; with sync registers the write
/// happens at the next KVM_RUN, and the exit's old `nmi.pending` must not replace an NMI queued
/// since. The ioctl path writes at once.)
pub(crate) fn events_to_sync(new: &kvm_vcpu_events, stored: &kvm_vcpu_events) -> kvm_vcpu_events {
    let mut e = *new;
    if e.nmi.pending == stored.nmi.pending {
        e.flags &= !KVM_VCPUEVENT_VALID_NMI_PENDING;
    }
    e
}

impl VcpuAccess for KvmVcpu<'_> {
    fn regs(&mut self) -> Result<kvm_regs, AccessError> {
        if let Some(r) = self.regs {
            return Ok(r);
        }
        let r = match self.path {
            Path::Ioctl => self.ioctl_get(KVM_GET_REGS(), KvmVcpuError::GetRegs)?,
            Path::Sync(run) => {
                let (area, _) = Self::sync_area(run);
                // SAFETY: `area` is the live sync-register area KVM filled at the last exit
                // (with_sync_regs' contract); a plain copy out.
                unsafe { ptr::addr_of!((*area).regs).read() }
            }
        };
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
        let s = match self.path {
            Path::Ioctl => self.ioctl_get(KVM_GET_SREGS(), KvmVcpuError::GetSregs)?,
            Path::Sync(run) => {
                let (area, _) = Self::sync_area(run);
                // SAFETY: as in `regs`.
                unsafe { ptr::addr_of!((*area).sregs).read() }
            }
        };
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
        self.ioctls += 1;
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
        Ok(self.ioctl_get(KVM_GET_FPU(), KvmVcpuError::GetFpu)?)
    }

    fn set_fpu(&mut self, fpu: &kvm_fpu) -> Result<(), AccessError> {
        Ok(self.ioctl_set(KVM_SET_FPU(), fpu, KvmVcpuError::SetFpu)?)
    }

    fn vcpu_events(&mut self) -> Result<kvm_vcpu_events, AccessError> {
        if let Some(e) = self.events {
            return Ok(e);
        }
        match self.path {
            // Not cached: the ioctl path writes events at once, so a read after it asks KVM.
            Path::Ioctl => Ok(self.ioctl_get(KVM_GET_VCPU_EVENTS(), KvmVcpuError::GetVcpuEvents)?),
            Path::Sync(run) => {
                let (area, _) = Self::sync_area(run);
                // SAFETY: as in `regs`.
                let e = unsafe { ptr::addr_of!((*area).events).read() };
                Ok(*self.events.insert(e))
            }
        }
    }

    fn set_vcpu_events(&mut self, events: &kvm_vcpu_events) -> Result<(), AccessError> {
        match self.path {
            Path::Ioctl => {
                self.commit()?;
                self.ioctl_set(KVM_SET_VCPU_EVENTS(), events, KvmVcpuError::SetVcpuEvents)?;
            }
            // KVM applies dirty registers before dirty events (sync_regs in x86.c), so a
            // pending exception survives the register write without a commit here.
            Path::Sync(_) => {
                self.events = Some(*events);
                self.events_dirty = true;
            }
        }
        Ok(())
    }

    /// KVM_NMI; with sync registers `nmi.pending` in the events KVM applies at the start of
    /// the next KVM_RUN (with KVM_VCPUEVENT_VALID_NMI_PENDING: KVM then queues it as KVM_NMI
    /// does, and the entry injects it), which saves an ioctl per PMI.
    fn queue_nmi(&mut self) -> Result<(), AccessError> {
        match self.path {
            Path::Ioctl => {
                self.ioctls += 1;
                // SAFETY: KVM_NMI takes no argument; the fd is a vCPU's.
                let rc = unsafe { ioctl(&self.fd, KVM_NMI()) };
                check(rc, KvmVcpuError::Nmi)?;
            }
            Path::Sync(_) => {
                let mut e = self.vcpu_events()?;
                if e.nmi.pending == 0 {
                    e.nmi.pending = 1;
                    e.flags |= KVM_VCPUEVENT_VALID_NMI_PENDING;
                    self.set_vcpu_events(&e)?;
                }
            }
        }
        Ok(())
    }

    fn memory(&self) -> &GuestMemoryMmap {
        self.mem
    }

    fn commit(&mut self) -> Result<(), AccessError> {
        match self.path {
            Path::Ioctl => {
                if self.sregs_dirty {
                    if let Some(s) = self.sregs {
                        self.ioctl_set(KVM_SET_SREGS(), &s, KvmVcpuError::SetSregs)?;
                    }
                    self.sregs_dirty = false;
                }
                if self.regs_dirty {
                    if let Some(r) = self.regs {
                        self.ioctl_set(KVM_SET_REGS(), &r, KvmVcpuError::SetRegs)?;
                    }
                    self.regs_dirty = false;
                }
            }
            Path::Sync(run) => {
                let (area, dirty) = Self::sync_area(run);
                let mut bits = 0u64;
                if let (true, Some(r)) = (self.regs_dirty, self.regs) {
                    // SAFETY: the live sync-register area (with_sync_regs' contract); KVM
                    // reads it at the next KVM_RUN.
                    unsafe { ptr::addr_of_mut!((*area).regs).write(r) };
                    bits |= u64::from(KVM_SYNC_X86_REGS);
                }
                if let (true, Some(s)) = (self.sregs_dirty, self.sregs) {
                    // SAFETY: as above.
                    unsafe { ptr::addr_of_mut!((*area).sregs).write(s) };
                    bits |= u64::from(KVM_SYNC_X86_SREGS);
                }
                if let (true, Some(e)) = (self.events_dirty, self.events) {
                    // SAFETY: as above; the stored events are KVM's from the last exit
                    // until this write replaces them.
                    unsafe {
                        let stored = ptr::addr_of!((*area).events).read();
                        ptr::addr_of_mut!((*area).events).write(events_to_sync(&e, &stored));
                    }
                    bits |= u64::from(KVM_SYNC_X86_EVENTS);
                }
                if bits != 0 {
                    // SAFETY: the live kvm_run's dirty mask; KVM clears each bit as it
                    // applies that set at the next KVM_RUN.
                    unsafe { dirty.write(dirty.read() | bits) };
                }
                self.regs_dirty = false;
                self.sregs_dirty = false;
                self.events_dirty = false;
            }
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
        fn queue_nmi(&mut self) -> Result<(), AccessError> {
            self.events.nmi.pending = 1;
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

    /// A kvm_run as KVM leaves it after an exit with sync registers on, and a KvmVcpu over it
    /// with a descriptor no ioctl can succeed on (each would count, and fail).
    fn synced() -> (Box<kvm_run>, GuestMemoryMmap) {
        let mut run = Box::<kvm_run>::default();
        run.kvm_valid_regs = SYNC_REGS_WANTED;
        // SAFETY: `regs` is the member KVM fills with sync registers on.
        let area = unsafe { &mut run.s.regs };
        area.regs.rip = 0x1000;
        area.regs.rax = 1;
        area.sregs.cr3 = 0x5000;
        area.sregs.cs.selector = 0x33;
        area.sregs.cr0 = x86::CR0_PE;
        area.events.flags = KVM_VCPUEVENT_VALID_NMI_PENDING | 4; // | VALID_SHADOW
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
        (run, mem)
    }

    fn area(run: &kvm_run) -> kvm_sync_regs {
        // SAFETY: `regs` is the member in use (see `synced`).
        unsafe { run.s.regs }
    }

    #[test]
    fn sync_regs_are_read_from_kvm_run_once_and_written_back_with_dirty_bits() {
        let (mut run, mem) = synced();
        let ptr = NonNull::from(&mut *run);
        // SAFETY: `run` outlives `cpu`, and only `cpu` writes it while `cpu` lives.
        let mut cpu = unsafe { KvmVcpu::with_sync_regs(-1, ptr, &mem) };
        assert!(cpu.uses_sync_regs());
        assert_eq!(cpu.rip(), Ok(0x1000));
        assert_eq!(cpu.cpl(), Ok(3));
        // Cached for the exit: a later change in kvm_run is not seen (KVM only writes it
        // inside KVM_RUN).
        // SAFETY: a write to the live sync area, as KVM would make.
        unsafe { ptr::addr_of_mut!((*ptr.as_ptr()).s.regs.regs.rip).write(0x2000) };
        assert_eq!(cpu.rip(), Ok(0x1000));
        // A write waits for commit, then lands in kvm_run with only its own dirty bit.
        let mut r = cpu.regs().unwrap();
        r.rip = 0x1003;
        cpu.set_regs(&r).unwrap();
        // SAFETY: a read of the live kvm_run's dirty mask.
        let dirty = || unsafe { ptr::addr_of!((*ptr.as_ptr()).kvm_dirty_regs).read() };
        assert_eq!(dirty(), 0, "nothing written before commit");
        cpu.commit().unwrap();
        assert_eq!(dirty(), u64::from(KVM_SYNC_X86_REGS));
        cpu.commit().unwrap();
        assert_eq!(cpu.ioctls(), 0, "no ioctl on the sync path");
        assert_eq!(area(&run).regs.rip, 0x1003);
        assert_eq!(area(&run).sregs.cr3, 0x5000, "sregs untouched");

        // Special registers and events add their bits to the ones still pending (KVM clears
        // each bit only as it applies that set).
        let ptr = NonNull::from(&mut *run);
        // SAFETY: as above.
        let mut cpu = unsafe { KvmVcpu::with_sync_regs(-1, ptr, &mem) };
        let mut s = cpu.sregs().unwrap();
        s.cs.selector = 0x10;
        cpu.set_sregs(&s).unwrap();
        let mut e = cpu.vcpu_events().unwrap();
        e.exception.injected = 1;
        e.exception.nr = 3;
        cpu.set_vcpu_events(&e).unwrap();
        assert_eq!(cpu.vcpu_events().unwrap().exception.nr, 3, "cached");
        cpu.commit().unwrap();
        assert_eq!((cpu.ioctls(), cpu.cpl()), (0, Ok(0)));
        assert_eq!(run.kvm_dirty_regs, SYNC_REGS_WANTED);
        assert_eq!(area(&run).sregs.cs.selector, 0x10);
        assert_eq!(
            (area(&run).events.exception.nr, area(&run).events.flags),
            (3, 4),
            "an unchanged NMI-pending state is not written back"
        );
    }

    #[test]
    fn an_nmi_is_queued_through_kvm_run_events_or_absorbed_by_a_pending_one() {
        let (mut run, mem) = synced();
        run.s.regs.events.flags = 4;
        let ptr = NonNull::from(&mut *run);
        // SAFETY: `run` outlives `cpu`, and only `cpu` writes it while `cpu` lives.
        let mut cpu = unsafe { KvmVcpu::with_sync_regs(-1, ptr, &mem) };
        cpu.queue_nmi().unwrap();
        cpu.commit().unwrap();
        assert_eq!(cpu.ioctls(), 0, "no KVM_NMI on the sync path");
        assert_eq!(run.kvm_dirty_regs, u64::from(KVM_SYNC_X86_EVENTS));
        let e = area(&run).events;
        assert_eq!(e.nmi.pending, 1);
        assert_eq!(
            e.flags,
            KVM_VCPUEVENT_VALID_NMI_PENDING | 4,
            "KVM applies nmi.pending"
        );

        // KVM reported an NMI pending at this exit: nothing to write (hardware merges them).
        let (mut run, mem) = synced();
        run.s.regs.events.nmi.pending = 1;
        let ptr = NonNull::from(&mut *run);
        // SAFETY: as above.
        let mut cpu = unsafe { KvmVcpu::with_sync_regs(-1, ptr, &mem) };
        cpu.queue_nmi().unwrap();
        cpu.commit().unwrap();
        assert_eq!(run.kvm_dirty_regs, 0);

        // Without sync registers it is KVM_NMI (one ioctl; it fails on fd -1).
        let mut cpu = KvmVcpu::new(-1, &mem);
        assert!(matches!(
            cpu.queue_nmi(),
            Err(AccessError::Kvm(KvmVcpuError::Nmi(_)))
        ));
        assert_eq!(cpu.ioctls(), 1);
    }

    #[test]
    fn events_keep_the_nmi_flag_only_when_the_caller_changed_nmi_pending() {
        let mut stored = kvm_vcpu_events {
            flags: KVM_VCPUEVENT_VALID_NMI_PENDING,
            ..Default::default()
        };
        let mut new = stored;
        assert_eq!(events_to_sync(&new, &stored).flags, 0);
        new.nmi.pending = 1;
        assert_eq!(
            events_to_sync(&new, &stored).flags,
            KVM_VCPUEVENT_VALID_NMI_PENDING
        );
        stored.nmi.pending = 1;
        new.nmi.pending = 0;
        assert_eq!(
            events_to_sync(&new, &stored).flags,
            KVM_VCPUEVENT_VALID_NMI_PENDING,
            "clearing a pending NMI is a change"
        );
    }

    #[test]
    fn the_ioctl_path_counts_its_ioctls_and_the_capability_needs_all_three_sets() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
        let mut cpu = KvmVcpu::new(-1, &mem);
        assert!(!cpu.uses_sync_regs());
        assert!(cpu.regs().is_err(), "no vCPU behind -1");
        assert!(cpu.sregs().is_err());
        // A write is only cached: no ioctl until commit, one per dirty set then.
        cpu.set_regs(&kvm_regs::default()).unwrap();
        assert_eq!(cpu.ioctls(), 2);
        assert!(cpu.commit().is_err());
        assert_eq!(cpu.ioctls(), 3);
        assert!(sync_regs_usable(7));
        assert!(sync_regs_usable(0x1f));
        assert!(!sync_regs_usable(3));
        assert!(!sync_regs_usable(0));
        assert!(!sync_regs_usable(-1));
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
