//! What a run is given: [`VmConfig`] (what `vpmu-vmm run`'s options become), [`Boot`] (what to
//! boot) and the limits the command line checks against.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::boot::layout;
use crate::control::Controller;
use crate::devices::virtio::blk::DiskConfig;
use crate::host_quirks::{HostKind, QuirkSetting};
use crate::net::NetConfig;
use crate::pmu::{self, BackendChoice, ModelChoice, RdpmcSetting, VpmuSetting};

pub const MIN_MEMORY_MIB: u64 = 32;
pub const MAX_MEMORY_MIB: u64 = layout::MMIO_HOLE_START >> 20;
pub const MAX_VCPUS: u32 = 8;

/// Base kernel command line; host-quirk options and the user's `--cmdline` are appended.
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1 pci=off";

/// What to boot.
#[derive(Debug, Clone)]
pub enum Boot {
    /// A Linux kernel (ELF vmlinux or bzImage) through the 64-bit boot protocol.
    Linux {
        kernel: PathBuf,
        initrd: Option<PathBuf>,
        cmdline: String,
    },
    /// A flat binary (tiny test guests) copied to `load_addr` and entered at `entry`, in real
    /// mode (CS base 0) or 64-bit long mode (identity-mapped first GiB).
    Flat {
        image: Vec<u8>,
        load_addr: u64,
        entry: u64,
        long_mode: bool,
    },
}

/// Default `--output-file-cap-mib` (console::Capped).
pub const DEFAULT_OUTPUT_FILE_CAP_MIB: u64 = 256;

#[derive(Debug, Clone)]
pub struct VmConfig {
    pub boot: Boot,
    pub memory_mib: u64,
    pub vcpus: u32,
    pub vpmu: VpmuSetting,
    pub serial2: Option<PathBuf>,
    /// The kind of host (`--host-quirks` and detection, decided once).
    pub host: HostKind,
    pub timeout: Option<Duration>,
    /// Where guest console output goes (stdout when None).
    pub console_out: Option<PathBuf>,
    /// Bytes the guest may write into each of the console and COM2 files, in MiB (0: no cap).
    pub output_file_cap_mib: u64,
    /// Feed our stdin to the guest console.
    pub console_in: bool,
    /// `--pmu-model`, `--vpmu-backend`, `--pmi-limit` (PMIs per second per vCPU, 0 = none).
    pub pmu_model: ModelChoice,
    pub pmu_backend: BackendChoice,
    pub pmi_limit: u32,
    /// `--rdpmc`: rewrite the guest kernel's RDPMCs so the vPMU answers them.
    pub rdpmc: RdpmcSetting,
    /// `--vpmu-schedule`: accounting modes to switch through at run time (vPMU on only).
    pub vpmu_schedule: Option<pmu::mode::Schedule>,
    /// `--pmu-event-filter`: events the guest's counters may not count (vPMU on only).
    pub pmu_event_filter: Option<vpmu::EventFilter>,
    /// Test device: port I/O to [`devices::delay::DELAY_PORT`] busy-waits this long on the vCPU
    /// thread (VMM work done for the guest). 0 = no device.
    pub io_delay_us: u32,
    /// Benchmark baseline, only with `--vpmu=off`: these MSRs are sent to user space and
    /// answered with 0 (a bare user-space MSR exit).
    pub const_msrs: Vec<u32>,
    /// `--net`: a virtio-net card at [`layout::VIRTIO_NET_MMIO_BASE`] fed by the VMM's pinger.
    pub net: Option<NetConfig>,
    /// `--disk`: virtio-blk devices at [`layout::VIRTIO_BLK_MMIO_BASE`] on, in order (the
    /// first is the guest's /dev/vda).
    pub disks: Vec<DiskConfig>,
    /// Drives the running VM from its own thread (None: nothing does).
    pub controller: Option<Controller>,
    /// When the process (or the caller's measurement) started: `RunReport::setup_time` counts
    /// from here to the moment the vCPUs may enter KVM_RUN.
    pub started: Option<Instant>,
    /// `--trace` / `--host-profile` (off by default).
    pub record: crate::trace::RecordConfig,
    /// Test hook: vCPU `.0`'s thread panics at its `.1`-th exit (a stand-in for a VMM bug;
    /// tests check that the run still ends, with exit code 8 and its outputs closed).
    pub panic_vcpu_at_exit: Option<(u32, u64)>,
    /// `--seccomp`: confine every thread of the run, the calling thread included (from the end
    /// of setup on, for the rest of its life: call `run` on a fresh thread to do more after).
    pub seccomp: crate::seccomp::SeccompSetting,
    /// Read and write vCPU registers through `kvm_run` (KVM_CAP_SYNC_REGS) where the host has
    /// regs, sregs and events and the SYSCALL relay runs (host quirks: it touches registers on
    /// every relayed system call); false: always the KVM_GET/SET_REGS/SREGS/VCPU_EVENTS ioctls
    /// (on by default; off for A/B measurements).
    pub sync_regs: bool,
    /// What one exit to user space costs inside KVM_RUN, taken off each KVM_RUN interval the
    /// soft backend's cpu-switch charges: None measures it at start (`vm::exit_cost`); Some(0)
    /// charges whole intervals, as before issue 32 (hidden `--exit-cost-ns`, for A/B runs).
    pub exit_cost_ns: Option<u64>,
}

impl Boot {
    /// A tiny test guest (guest-image/tiny), entered at its load address.
    pub fn tiny(guest: &tiny_guests::TinyGuest) -> Boot {
        Boot::Flat {
            image: guest.image.to_vec(),
            load_addr: guest.load_addr,
            entry: guest.load_addr,
            long_mode: guest.long_mode,
        }
    }
}

impl VmConfig {
    /// `boot` with the defaults of `vpmu-vmm run` (256 MiB, 1 vCPU, no vPMU, no timeout,
    /// console to stdout); callers change what they need.
    pub fn new(boot: Boot) -> Self {
        VmConfig {
            boot,
            memory_mib: 256,
            vcpus: 1,
            vpmu: VpmuSetting::Off,
            host: HostKind::decide(QuirkSetting::Auto),
            timeout: None,
            console_out: None,
            output_file_cap_mib: DEFAULT_OUTPUT_FILE_CAP_MIB,
            console_in: false,
            pmu_model: ModelChoice::Auto,
            pmu_backend: BackendChoice::Auto,
            pmi_limit: 2000,
            rdpmc: RdpmcSetting::Auto,
            vpmu_schedule: None,
            pmu_event_filter: None,
            io_delay_us: 0,
            const_msrs: Vec::new(),
            serial2: None,
            started: None,
            record: Default::default(),
            net: None,
            disks: Vec::new(),
            controller: None,
            panic_vcpu_at_exit: None,
            seccomp: Default::default(),
            sync_regs: true,
            exit_cost_ns: None,
        }
    }
}
