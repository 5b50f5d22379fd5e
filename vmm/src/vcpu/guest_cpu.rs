//! [`GuestCpu`] over a KVM vCPU: what the host-quirk fix-ups need (registers, guest-virtual
//! memory through KVM_TRANSLATE, MXCSR, exception injection).

use iced_x86::Register;
use kvm_bindings::{kvm_regs, kvm_sregs};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::host_quirks::GuestCpu;

pub struct KvmGuestCpu<'a> {
    vcpu: &'a VcpuFd,
    mem: &'a GuestMemoryMmap,
    regs: kvm_regs,
    sregs: kvm_sregs,
    dirty: bool,
}

impl<'a> KvmGuestCpu<'a> {
    pub fn new(vcpu: &'a VcpuFd, mem: &'a GuestMemoryMmap) -> Result<Self, kvm_ioctls::Error> {
        Ok(KvmGuestCpu {
            regs: vcpu.get_regs()?,
            sregs: vcpu.get_sregs()?,
            vcpu,
            mem,
            dirty: false,
        })
    }

    fn translate(&self, addr: u64) -> Result<u64, String> {
        let t = self
            .vcpu
            .translate_gva(addr)
            .map_err(|e| format!("KVM_TRANSLATE {addr:#x}: {e}"))?;
        if t.valid == 0 {
            return Err(format!("guest address {addr:#x} is not mapped"));
        }
        Ok(t.physical_address)
    }

    /// Calls `f(gpa, range)` for each page-contained piece of `[addr, addr+len)`.
    fn each_page(
        &self,
        addr: u64,
        len: usize,
        mut f: impl FnMut(u64, std::ops::Range<usize>) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut done = 0;
        while done < len {
            let va = addr.wrapping_add(done as u64);
            let n = ((0x1000 - (va & 0xfff)) as usize).min(len - done);
            f(self.translate(va)?, done..done + n)?;
            done += n;
        }
        Ok(())
    }
}

fn gpr_mut(r: &mut kvm_regs, reg: Register) -> &mut u64 {
    match reg {
        Register::RAX => &mut r.rax,
        Register::RBX => &mut r.rbx,
        Register::RCX => &mut r.rcx,
        Register::RDX => &mut r.rdx,
        Register::RSI => &mut r.rsi,
        Register::RDI => &mut r.rdi,
        Register::RSP => &mut r.rsp,
        Register::RBP => &mut r.rbp,
        Register::R8 => &mut r.r8,
        Register::R9 => &mut r.r9,
        Register::R10 => &mut r.r10,
        Register::R11 => &mut r.r11,
        Register::R12 => &mut r.r12,
        Register::R13 => &mut r.r13,
        Register::R14 => &mut r.r14,
        _ => &mut r.r15,
    }
}

impl GuestCpu for KvmGuestCpu<'_> {
    fn rip(&self) -> u64 {
        self.regs.rip
    }
    fn set_rip(&mut self, rip: u64) {
        self.regs.rip = rip;
        self.dirty = true;
    }
    fn bitness(&self) -> u32 {
        const EFER_LMA: u64 = 1 << 10;
        if self.sregs.efer & EFER_LMA != 0 && self.sregs.cs.l == 1 {
            64
        } else if self.sregs.cs.db == 1 {
            32
        } else {
            16
        }
    }
    fn rflags(&self) -> u64 {
        self.regs.rflags
    }
    fn set_rflags(&mut self, v: u64) {
        self.regs.rflags = v;
        self.dirty = true;
    }
    fn gpr(&self, reg: Register) -> u64 {
        let mut r = self.regs;
        *gpr_mut(&mut r, reg)
    }
    fn set_gpr(&mut self, reg: Register, v: u64) {
        *gpr_mut(&mut self.regs, reg) = v;
        self.dirty = true;
    }
    fn segment_base(&self, seg: Register) -> u64 {
        let s = &self.sregs;
        match seg {
            Register::FS => s.fs.base,
            Register::GS => s.gs.base,
            // In 64-bit mode CS/DS/ES/SS bases are treated as zero.
            _ if self.bitness() == 64 => 0,
            Register::CS => s.cs.base,
            Register::SS => s.ss.base,
            Register::ES => s.es.base,
            _ => s.ds.base,
        }
    }
    fn read_virt(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), String> {
        let mem = self.mem;
        self.each_page(addr, buf.len(), |gpa, r| {
            mem.read_slice(&mut buf[r], GuestAddress(gpa))
                .map_err(|e| e.to_string())
        })
    }
    fn write_virt(&mut self, addr: u64, buf: &[u8]) -> Result<(), String> {
        let mem = self.mem;
        self.each_page(addr, buf.len(), |gpa, r| {
            mem.write_slice(&buf[r], GuestAddress(gpa))
                .map_err(|e| e.to_string())
        })
    }
    fn mxcsr(&mut self) -> Result<u32, String> {
        self.vcpu
            .get_fpu()
            .map(|f| f.mxcsr)
            .map_err(|e| format!("KVM_GET_FPU: {e}"))
    }
    fn set_mxcsr(&mut self, v: u32) -> Result<(), String> {
        let mut f = self
            .vcpu
            .get_fpu()
            .map_err(|e| format!("KVM_GET_FPU: {e}"))?;
        f.mxcsr = v;
        self.vcpu
            .set_fpu(&f)
            .map_err(|e| format!("KVM_SET_FPU: {e}"))
    }
    fn tsc_aux(&mut self) -> Result<u64, String> {
        const MSR_TSC_AUX: u32 = 0xc000_0103;
        let mut msrs = kvm_bindings::Msrs::from_entries(&[kvm_bindings::kvm_msr_entry {
            index: MSR_TSC_AUX,
            ..Default::default()
        }])
        .map_err(|e| e.to_string())?;
        self.vcpu
            .get_msrs(&mut msrs)
            .map_err(|e| format!("KVM_GET_MSRS: {e}"))?;
        Ok(msrs.as_slice()[0].data)
    }
    fn inject_exception(&mut self, vector: u8) -> Result<(), String> {
        // Registers (RIP) must be written before the event so the exception frame is right.
        self.commit()?;
        let mut ev = self
            .vcpu
            .get_vcpu_events()
            .map_err(|e| format!("KVM_GET_VCPU_EVENTS: {e}"))?;
        ev.exception.injected = 1;
        ev.exception.nr = vector;
        ev.exception.has_error_code = 0;
        ev.exception.error_code = 0;
        ev.flags = 0;
        self.vcpu
            .set_vcpu_events(&ev)
            .map_err(|e| format!("KVM_SET_VCPU_EVENTS: {e}"))
    }
    fn commit(&mut self) -> Result<(), String> {
        if self.dirty {
            self.vcpu
                .set_regs(&self.regs)
                .map_err(|e| format!("KVM_SET_REGS: {e}"))?;
            self.dirty = false;
        }
        Ok(())
    }
}

/// The SYSCALL relay's view of a KVM vCPU (host quirks only).
pub struct RelayKvm<'a>(pub &'a VcpuFd);

impl crate::host_quirks::syscall_relay::RelayVcpu for RelayKvm<'_> {
    fn get_regs(&self) -> Result<kvm_regs, String> {
        self.0.get_regs().map_err(|e| format!("KVM_GET_REGS: {e}"))
    }
    fn set_regs(&self, regs: &kvm_regs) -> Result<(), String> {
        self.0
            .set_regs(regs)
            .map_err(|e| format!("KVM_SET_REGS: {e}"))
    }
    fn get_sregs(&self) -> Result<kvm_sregs, String> {
        self.0
            .get_sregs()
            .map_err(|e| format!("KVM_GET_SREGS: {e}"))
    }
    fn set_sregs(&self, sregs: &kvm_sregs) -> Result<(), String> {
        self.0
            .set_sregs(sregs)
            .map_err(|e| format!("KVM_SET_SREGS: {e}"))
    }
    fn syscall_msrs(&self) -> Result<crate::host_quirks::syscall_relay::SyscallMsrs, String> {
        use crate::host_quirks::syscall_relay::{MSR_LSTAR, MSR_SFMASK, MSR_STAR};
        let entry = |index| kvm_bindings::kvm_msr_entry {
            index,
            ..Default::default()
        };
        let mut msrs = kvm_bindings::Msrs::from_entries(&[
            entry(MSR_STAR),
            entry(MSR_LSTAR),
            entry(MSR_SFMASK),
        ])
        .map_err(|e| e.to_string())?;
        let n = self
            .0
            .get_msrs(&mut msrs)
            .map_err(|e| format!("KVM_GET_MSRS: {e}"))?;
        if n != 3 {
            return Err(format!("KVM_GET_MSRS read {n} of the 3 SYSCALL MSRs"));
        }
        let v = msrs.as_slice();
        Ok(crate::host_quirks::syscall_relay::SyscallMsrs {
            star: v[0].data,
            lstar: v[1].data,
            sfmask: v[2].data,
        })
    }
}
