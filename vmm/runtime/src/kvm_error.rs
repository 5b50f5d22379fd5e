//! The typed failures of a vCPU's KVM ioctls on the run-time path: one variant per ioctl
//! (as Firecracker's `KvmVcpuError`), so a failure names the call that failed and keeps the
//! errno; and [`AccessError`], what the vCPU access layer (`vcpu_access`) returns. A leaf
//! module: `end.rs` carries both inside `VmEnd::KvmFailure`.

/// A vCPU ioctl failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvmVcpuError {
    #[error("KVM_RUN: {0}")]
    Run(kvm_ioctls::Error),
    #[error("KVM_GET_REGS: {0}")]
    GetRegs(kvm_ioctls::Error),
    #[error("KVM_SET_REGS: {0}")]
    SetRegs(kvm_ioctls::Error),
    #[error("KVM_GET_SREGS: {0}")]
    GetSregs(kvm_ioctls::Error),
    #[error("KVM_SET_SREGS: {0}")]
    SetSregs(kvm_ioctls::Error),
    #[error("KVM_GET_MSRS: {0}")]
    GetMsrs(kvm_ioctls::Error),
    /// KVM_GET_MSRS read fewer MSRs than asked for (it stops at the first it does not know).
    #[error("KVM_GET_MSRS read {read} of the {asked} MSRs asked for")]
    GetMsrsShort { read: usize, asked: usize },
    #[error("KVM_GET_FPU: {0}")]
    GetFpu(kvm_ioctls::Error),
    #[error("KVM_SET_FPU: {0}")]
    SetFpu(kvm_ioctls::Error),
    #[error("KVM_GET_VCPU_EVENTS: {0}")]
    GetVcpuEvents(kvm_ioctls::Error),
    #[error("KVM_SET_VCPU_EVENTS: {0}")]
    SetVcpuEvents(kvm_ioctls::Error),
    #[error("KVM_NMI: {0}")]
    Nmi(kvm_ioctls::Error),
}

/// Why a vCPU state access failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error(transparent)]
    Kvm(#[from] KvmVcpuError),
    /// The guest's page tables do not map this guest-virtual address.
    #[error("guest address {0:#x} is not mapped")]
    NotMapped(u64),
    /// A guest-physical address (a page table, or the page a virtual address maps to) is not
    /// guest RAM.
    #[error("guest-physical address {0:#x} is outside guest memory")]
    OutsideMemory(u64),
}
