//! Building a VM (memory, in-kernel irqchip and PIT, devices, vCPUs), running it until it ends,
//! and what the run reports ([`run`], [`RunReport`]). What a run is given is in [`config`]; the
//! steps that build the VM are in `builder.rs`, running it in `run.rs`; the control surface its
//! threads share is [`crate::control`] (re-exported here).

mod builder;
pub(crate) mod config;
mod host_probe;
mod run;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::boot;
use crate::devices::virtio::blk::file::DiskError;
use crate::devices::virtio::net::NetReport;
use crate::devices::BusError;
use crate::end::VmEnd;
use crate::exit::ExitCounts;
use crate::kvm_error::KvmSetupError;
use crate::pmu::{self, BackendChoice, PmuStats};
use crate::seccomp;
use crate::vcpu::regs;

pub use crate::control::{Controller, Latch, VmControl, VmHandles};
pub use crate::devices::virtio::blk::{DiskConfig, DiskReport};
pub use crate::pmu::{RdpmcSetting, VpmuSetting};
pub use config::{
    Boot, VmConfig, DEFAULT_CMDLINE, DEFAULT_OUTPUT_FILE_CAP_MIB, MAX_MEMORY_MIB, MAX_VCPUS,
    MIN_MEMORY_MIB,
};

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("cannot open /dev/kvm: {0} (is KVM available and are you allowed to use it?)")]
    OpenKvm(kvm_ioctls::Error),
    #[error(transparent)]
    Kvm(#[from] KvmSetupError),
    #[error("installing the vCPU kick signal handler: {0}")]
    KickHandler(vmm_sys_util::errno::Error),
    #[error("guest memory: {0}")]
    Memory(vm_memory::mmap::FromRangesError),
    #[error("guest memory: image of {len} bytes does not fit at {load_addr:#x}")]
    ImageTooBig { len: usize, load_addr: u64 },
    #[error("guest memory: loading the image: {0}")]
    LoadImage(vm_memory::GuestMemoryError),
    #[error("eventfd for a device interrupt: {0}")]
    EventFd(std::io::Error),
    #[error("cannot start thread {name}: {source}")]
    SpawnThread {
        name: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Kernel(#[from] boot::kernel::KernelError),
    #[error("{path}: Multiboot kernel: {source}")]
    Multiboot {
        path: PathBuf,
        source: boot::multiboot::MultibootError,
    },
    #[error(transparent)]
    Acpi(#[from] boot::acpi::AcpiError),
    #[error(transparent)]
    Regs(#[from] regs::RegsError),
    #[error("cannot create {path}: {source}")]
    Output {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Rdpmc(#[from] pmu::rdpmc::RdpmcError),
    #[error("vPMU configuration: {0}")]
    VpmuConfig(#[from] vpmu::ConfigError),
    #[error("--vpmu-backend hw: {0}")]
    HostPmu(#[from] crate::pmu::setup::HostPmuError),
    #[error("CPUID table: {0}")]
    CpuidTable(vmm_sys_util::fam::Error),
    #[error(transparent)]
    Record(#[from] crate::trace::recorder::RecordError),
    #[error("device bus: {0}")]
    Bus(#[from] BusError),
    #[error(transparent)]
    Seccomp(#[from] crate::seccomp::SeccompError),
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("{0} disks: at most {max}", max = crate::devices::virtio::blk::MAX_DISKS)]
    TooManyDisks(usize),
}

/// What a run produced.
pub struct RunReport {
    pub end: VmEnd,
    /// The host kind the run was on and what the vPMU used there.
    pub host: HostReport,
    pub exits: Vec<ExitCounts>,
    /// Summed over vCPUs; all zero with `--vpmu=off`.
    pub pmu: PmuStats,
    pub vpmu: VpmuSetting,
    /// The vPMU's `--pmu-event-filter` (None without one, or with the vPMU off).
    pub pmu_event_filter: Option<vpmu::EventFilter>,
    /// The accounting modes the run went through (initial mode first), with times.
    pub mode_history: Vec<pmu::mode::Switch>,
    /// Switches made after `mode_history` was full (`pmu::mode`: the log is capped).
    pub mode_switches_unlogged: u64,
    pub fixups: Vec<(&'static str, u64)>,
    /// The SYSCALL relay (host quirks): system calls completed, and the VMM's mean time per
    /// system call in microseconds (exit to registers written).
    pub syscall_relay: Option<(u64, f64)>,
    pub console_tail: Vec<String>,
    /// What the VMM noticed of the guest that explains a failure (e.g. no DSDT, so no disks).
    pub hints: Vec<String>,
    /// Each vCPU's RIP and last exits as its thread ended (printed on a bad end).
    pub vcpu_states: Vec<crate::last_exits::VcpuEndState>,
    pub cmdline: Option<String>,
    /// With `--net`: what the network card and the pinger counted.
    pub net: Option<NetReport>,
    /// With `--disk`: what each block device counted, in `--disk` order.
    pub disks: Vec<DiskReport>,
    /// Guest-triggered warnings by kind: how many happened, how many were not logged
    /// (`vpmu::guest_log`).
    pub guest_log: Vec<vpmu::guest_log::GuestLogTotal>,
    /// `VmConfig::started` (or the `run` call) to the moment the vCPUs may enter KVM_RUN.
    pub setup_time: Duration,
    pub run_time: Duration,
}

/// What a run was on (issue 32 item 7: results from a kvm_pvm host and from a VT-x/SVM host
/// differ, and the report says which it was).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostReport {
    /// The KVM module serving /dev/kvm (`host_quirks::kvm_module`).
    pub kvm: &'static str,
    /// Host quirks on: guest kernel code emulated, fix-ups and the SYSCALL relay in use.
    pub quirks: bool,
    /// The vPMU's backend, `auto` resolved (None with the vPMU off).
    pub backend: Option<BackendChoice>,
    /// ns of KVM's exit path the soft backend's cpu-switch leaves out of each KVM_RUN interval.
    pub exit_cost_ns: u64,
    /// Whether this host's KVM answers guest RDPMC itself with its PMU off (`host_probe`; None
    /// with the vPMU off or the probe failed).
    pub kvm_answers_rdpmc: Option<bool>,
    /// ns one notification (a soft counter's overflow signal, a profile sample's) costs the
    /// vCPU thread here (`host_probe`; 0: not measured): no soft counter is armed sooner than
    /// ten of them (`pmu::backend::min_soft_period_ns`).
    pub notify_cost_ns: u64,
}

/// Builds the VM described by `cfg`, runs it to the end and reports.
pub fn run(cfg: &VmConfig) -> Result<RunReport, VmError> {
    let t0 = cfg.started.unwrap_or_else(Instant::now);
    // Threads started from here on confine themselves (docs/security.md).
    let seccomp = seccomp::Scope::enter(cfg.seccomp)?;
    let vm = builder::build(cfg)?;
    if seccomp.is_on() {
        // What each descriptor is, for the report of a forbidden ioctl (before any thread of
        // this run is confined; perf events opened later are noted where they are opened).
        seccomp::fds::snapshot();
    }
    seccomp.allow_kvm_fds(&vm.kvm_fds())?;
    let setup_time = t0.elapsed();
    log::info!(
        "VM ready in {:.1} ms: {} vCPU(s), {} MiB, vPMU {:?}",
        setup_time.as_secs_f64() * 1e3,
        cfg.vcpus,
        cfg.memory_mib,
        cfg.vpmu
    );
    run::run(cfg, vm, seccomp, setup_time)
}
