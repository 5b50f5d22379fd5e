//! The typed failures of KVM ioctls, one variant per ioctl (as Firecracker's `KvmVcpuError`),
//! so a failure names the call that failed and keeps the errno: [`KvmVcpuError`] on a vCPU's
//! run-time path, [`KvmSetupError`] while a VM is built; and [`AccessError`], what the vCPU access layer (`vcpu_access`) returns. A leaf
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

/// A KVM ioctl of the build path failed (system, VM, and a vCPU's set-up before it runs; the
/// host probe's calibration VM too): one variant per ioctl, as [`KvmVcpuError`] at run time.
#[derive(Debug, thiserror::Error)]
pub enum KvmSetupError {
    #[error("KVM_CREATE_VM: {0}")]
    CreateVm(kvm_ioctls::Error),
    #[error("KVM_SET_TSS_ADDR: {0}")]
    SetTssAddr(kvm_ioctls::Error),
    #[error("KVM_CREATE_IRQCHIP: {0}")]
    CreateIrqchip(kvm_ioctls::Error),
    #[error("KVM_CREATE_PIT2: {0}")]
    CreatePit2(kvm_ioctls::Error),
    #[error("KVM_SET_USER_MEMORY_REGION: {0}")]
    SetUserMemoryRegion(kvm_ioctls::Error),
    #[error("KVM_IRQFD: {0}")]
    Irqfd(kvm_ioctls::Error),
    #[error("KVM_X86_SET_MSR_FILTER: {0}")]
    SetMsrFilter(kvm_ioctls::Error),
    #[error("KVM_ENABLE_CAP(KVM_CAP_PMU_CAPABILITY): {0}")]
    DisablePmu(kvm_ioctls::Error),
    #[error("KVM_GET_SUPPORTED_CPUID: {0}")]
    GetSupportedCpuid(kvm_ioctls::Error),
    #[error("KVM_CREATE_VCPU: {0}")]
    CreateVcpu(kvm_ioctls::Error),
    #[error("KVM_SET_CPUID2: {0}")]
    SetCpuid2(kvm_ioctls::Error),
    #[error("KVM_GET_TSC_KHZ: {0}")]
    GetTscKhz(kvm_ioctls::Error),
    #[error("KVM_SET_MSRS: {0}")]
    SetMsrs(kvm_ioctls::Error),
    #[error("KVM_GET_LAPIC: {0}")]
    GetLapic(kvm_ioctls::Error),
    #[error("KVM_SET_LAPIC: {0}")]
    SetLapic(kvm_ioctls::Error),
    /// A vCPU ioctl of the run-time path, met while setting the vCPU up (its registers, its
    /// FPU) or in the host probe's calibration run.
    #[error(transparent)]
    Vcpu(#[from] KvmVcpuError),
}

/// `map_err` for a vCPU ioctl on the build path: `.map_err(on_vcpu(KvmVcpuError::SetRegs))`.
pub(crate) fn on_vcpu(
    ioctl: fn(kvm_ioctls::Error) -> KvmVcpuError,
) -> impl Fn(kvm_ioctls::Error) -> KvmSetupError {
    move |e| KvmSetupError::Vcpu(ioctl(e))
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
