//! [`VcpuView`] over a KVM vCPU file descriptor, for the MSR path's questions (RIP, KVM's own MSR
//! value) while the exit still borrows the `VcpuFd`: the ioctls go to the raw descriptor.

use std::os::fd::{AsRawFd, RawFd};

use kvm_bindings::{kvm_msr_entry, kvm_msrs, kvm_regs, Msrs};
use vmm_sys_util::ioctl::{ioctl_with_mut_ptr, ioctl_with_mut_ref};
use vmm_sys_util::{ioctl_ior_nr, ioctl_iowr_nr};

use crate::exit::VcpuView;

const KVMIO: u32 = 0xAE;
ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_regs);
ioctl_iowr_nr!(KVM_GET_MSRS, KVMIO, 0x88, kvm_msrs);

/// A vCPU's raw descriptor (valid as long as its `VcpuFd` lives).
pub struct KvmView(pub RawFd);

impl AsRawFd for KvmView {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

impl VcpuView for KvmView {
    fn rip(&self) -> Option<u64> {
        let mut regs = kvm_regs::default();
        // SAFETY: KVM_GET_REGS writes one kvm_regs, which `regs` is; the fd is a vCPU's.
        let ret = unsafe { ioctl_with_mut_ref(self, KVM_GET_REGS(), &mut regs) };
        (ret == 0).then_some(regs.rip)
    }

    fn kvm_msr(&self, index: u32) -> Option<u64> {
        let mut msrs = Msrs::from_entries(&[kvm_msr_entry {
            index,
            ..Default::default()
        }])
        .ok()?;
        // SAFETY: the pointer is a kvm_msrs header followed by `nmsrs` entries (the FAM
        // wrapper's allocation); KVM_GET_MSRS writes at most that many; the fd is a vCPU's.
        let ret = unsafe { ioctl_with_mut_ptr(self, KVM_GET_MSRS(), msrs.as_mut_fam_struct_ptr()) };
        (ret == 1).then(|| msrs.as_slice()[0].data)
    }
}
