//! Building a VM, in named steps (the order [`build`] takes them in):
//! [`create_vm`] (KVM, TSS, irqchip, PIT) -> [`create_memory`] -> [`load_guest`] (kernel or flat
//! image, ACPI tables, command line) -> [`attach_devices`] (the port-I/O and MMIO buses and what
//! is on them) -> [`plan_vpmu`] (model, backend, MSR filter, RDPMC sites: a [`VpmuPlan`]) ->
//! [`make_vcpus`] (CPUID, boot registers, one [`VcpuRunner`] each) -> [`start_recording`].
//! What comes out is a [`BuiltVm`], which `run.rs` runs.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvm_bindings::{
    kvm_cpuid_entry2, kvm_pit_config, kvm_userspace_memory_region, CpuId, KVM_MAX_CPUID_ENTRIES,
    KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::eventfd::EventFd;

use super::DEFAULT_CMDLINE;
use super::{Boot, Latch, RdpmcSetting, VmConfig, VmControl, VmError, VpmuSetting};
use crate::boot::{self, layout};
use crate::console::{ConsoleLog, Tee};
use crate::devices::virtio::blk::{self, DiskConfig, VirtioBlk};
use crate::devices::virtio::mmio::{MmioTransport, MMIO_LEN};
use crate::devices::virtio::net::VirtioNet;
use crate::devices::{
    acpi_pm::AcpiPm, debug_exit, delay, i8042, packet_gate, serial, vpmu_control, MmioBus, PioBus,
    PioDevice,
};
use crate::host_quirks::idt_trap::{Mark, TrapPoll};
use crate::host_quirks::{self, syscall_relay, FixupCounts};
use crate::kvm_error::KvmSetupError;
use crate::net::{self, pinger::Pinger};
use crate::pmu::{
    self,
    backend::{PerfBackend, SimHost, Source},
    mode::ModeSwitch,
    perf::{HostPerf, PerfSys},
    rdpmc::RdpmcSites,
    BackendChoice, ModelChoice, VcpuPmu,
};
use crate::trace::recorder::Recording;
use crate::vcpu::{cpuid, identity, regs, ticker::Ticker, VcpuRunner, VcpuShared};
use crate::vcpu_access::kick;

/// The network card as the buses, the ticker and the end-of-run report see it.
pub(super) type NetCard = Arc<Mutex<MmioTransport<VirtioNet>>>;

/// A block device as the bus and the end-of-run report see it.
pub(super) type DiskCard = Arc<Mutex<MmioTransport<VirtioBlk>>>;

/// A VM ready to run: its vCPUs (not started yet) and what the run's other threads and its
/// report need.
pub(super) struct BuiltVm {
    pub runners: Vec<VcpuRunner>,
    pub control: Arc<VmControl>,
    /// The accounting mode (None with `--vpmu=off`).
    pub mode_switch: Option<Arc<ModeSwitch>>,
    pub devices: Devices,
    pub fixups: Arc<FixupCounts>,
    /// The SYSCALL relay (host quirks only).
    pub relay: Option<Arc<syscall_relay::SyscallRelay>>,
    /// Whether the vPMU is on (a [`VpmuPlan`] was made).
    pub vpmu_on: bool,
    /// The kernel command line: Linux's, or a Multiboot kernel's (None for a flat image).
    pub cmdline: Option<String>,
    /// `--trace` / `--host-profile`: the writers (each vCPU has its recorder already).
    pub recording: Option<Recording>,
    /// The vCPUs' TSC frequency, for the relay's cost in microseconds.
    pub tsc_khz: Option<u64>,
    /// What the run is on, for its report.
    pub host: super::HostReport,
    // Dropped in this order, after the vCPU threads were joined: the VM (its last reference),
    // then guest memory (see `create_memory`), then /dev/kvm.
    _vm: Arc<VmFd>,
    _mem: GuestMemoryMmap,
    _kvm: Kvm,
}

impl BuiltVm {
    /// The descriptors its vCPU threads make KVM ioctls on (seccomp allows those only).
    pub(super) fn kvm_fds(&self) -> crate::seccomp::KvmFds {
        use std::os::fd::AsRawFd;
        crate::seccomp::KvmFds {
            vm: Some(self._vm.as_raw_fd()),
            vcpus: self.runners.iter().map(|r| r.fd.as_raw_fd()).collect(),
        }
    }
}

/// Builds the VM `cfg` describes, up to the moment its vCPU threads may start.
pub(super) fn build(cfg: &VmConfig) -> Result<BuiltVm, VmError> {
    let host = cfg.host;
    if let host_quirks::HostKind::EmulatedKernel { why } = host {
        log::info!("host quirks on: {why}");
    }
    let quirks = host.quirks();
    let (hv, vm) = create_vm()?;
    turn_off_kvm_pmu(&vm)?;
    let mem = create_memory(&vm, cfg.memory_mib)?;
    let throttle_off = guest_pmi_throttle_off(cfg);
    let guest = load_guest(cfg, &mem, quirks, throttle_off)?;
    let control = Arc::new(VmControl::new(cfg.panic_vcpu_at_exit));
    let mode_switch = mode_switch(cfg);
    let devices = attach_devices(cfg, &vm, &mem, &control, mode_switch.as_ref())?;
    let supported = hv
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(KvmSetupError::GetSupportedCpuid)?;
    // The guest's CPUID (KVM's supported table with the guest's identity), which the vPMU's
    // model reads (its TSX bits) and the vCPUs are made from.
    let guest_cpuid = guest_cpuid(cfg.pmu_model, supported.as_slice());
    let mut vpmu = plan_vpmu(
        cfg,
        &vm,
        &mem,
        &guest_cpuid,
        &guest.code,
        &mode_switch,
        quirks,
    )?;
    let probe = vpmu.as_mut().and_then(|v| apply_host_probe(cfg, &hv, v));
    // The host-side profile's sampler is a soft counter too, with or without a vPMU.
    let notify_cost_ns = match (probe, cfg.record.profile.is_some()) {
        (Some(p), _) => p.notify_cost_ns(),
        (None, true) => super::host_probe::probe(&hv).map_or(0, |p| p.notify_cost_ns()),
        (None, false) => 0,
    };
    if vpmu.is_none() {
        filter_const_msrs(&vm, &cfg.const_msrs)?;
    }
    kick::install_handler().map_err(VmError::KickHandler)?;
    let fixups = Arc::new(FixupCounts::default());
    let traps = Traps::new(
        quirks,
        vpmu.as_ref(),
        &guest.code,
        supported.as_slice(),
        &fixups,
    );
    let shared = VcpuShared {
        mem: mem.clone(),
        pio: devices.pio.clone(),
        mmio: devices.mmio.clone(),
        vm: vm.clone(),
        control: control.clone(),
        fixups: fixups.clone(),
        host,
        const_msrs: !cfg.const_msrs.is_empty(),
    };
    let vcpus = VcpuPlan {
        cfg,
        guest_cpuid: &guest_cpuid,
        quirks,
        entry: guest.entry,
        vpmu: vpmu.as_ref(),
        mode_switch: &mode_switch,
        net_card: devices.net_card.as_ref(),
        traps: &traps,
    };
    let mut runners = make_vcpus(&vcpus, &shared)?;
    // For the relay's cost in microseconds (the guest's TSC runs at the host's here).
    let tsc_khz = runners
        .first()
        .and_then(|r| r.fd.get_tsc_khz().ok())
        .map(u64::from)
        .filter(|&k| k > 0);
    let recording = start_recording(cfg, &mut runners, &mode_switch, quirks, notify_cost_ns)?;
    let host = super::HostReport {
        kvm: host_quirks::kvm_module(),
        quirks,
        backend: vpmu.as_ref().map(|v| v.backend),
        exit_cost_ns: vpmu.as_ref().map_or(0, |v| v.exit_cost_ns),
        kvm_answers_rdpmc: probe.map(|p| p.kvm_answers_rdpmc),
        notify_cost_ns,
    };
    Ok(BuiltVm {
        host,
        runners,
        control,
        mode_switch,
        devices,
        fixups,
        relay: traps.relay,
        vpmu_on: vpmu.is_some(),
        cmdline: guest.cmdline,
        recording,
        tsc_khz,
        _vm: vm,
        _mem: mem,
        _kvm: hv,
    })
}

/// The guest's PMU is the VMM's (or none, with --vpmu off): KVM's own must not answer the
/// guest's RDPMC from counters nobody programs. Before the vCPUs are created.
fn turn_off_kvm_pmu(vm: &VmFd) -> Result<(), VmError> {
    let off = pmu::setup::disable_kvm_pmu(vm).map_err(KvmSetupError::DisablePmu)?;
    log::debug!(
        "KVM's own PMU: {}",
        if off {
            "turned off for this VM"
        } else {
            "not offered to turn off (absent, or an older KVM)"
        }
    );
    Ok(())
}

/// What the vCPUs complete for the guest besides its exits: the SYSCALL relay and the XBEGIN
/// trap where the host cannot run those (host quirks), the RDPMC trap (`--rdpmc trap`).
struct Traps {
    /// Guest user space where the host leaves SYSCALL half done (host quirks only).
    relay: Option<Arc<syscall_relay::SyscallRelay>>,
    /// `--rdpmc trap`: the int3 over the guest's #GP handler.
    gp_trap: Option<Arc<host_quirks::idt_trap::VectorTrap>>,
    /// XBEGIN at guest CPL 0 (host quirks): only test kernels run it (kvm-unit-tests' x86/pmu).
    ud_trap: Option<Arc<host_quirks::idt_trap::VectorTrap>>,
}

impl Traps {
    fn new(
        quirks: bool,
        vpmu: Option<&VpmuPlan>,
        code: &pmu::setup::GuestCode<'_>,
        supported: &[kvm_cpuid_entry2],
        fixups: &Arc<FixupCounts>,
    ) -> Traps {
        // RTM as the guest sees it: these hosts ignore leaf 7 of KVM_SET_CPUID2, so the host's
        // own table decides, even when the guest's identity (an AMD one) leaves RTM out (no
        // identity adds it).
        let xbegin = quirks
            && matches!(code, pmu::setup::GuestCode::Unpatched)
            && host_quirks::xbegin_abort::offers_rtm(supported);
        Traps {
            relay: quirks.then(|| syscall_relay::SyscallRelay::new(fixups.clone())),
            gp_trap: vpmu
                .and_then(|v| v.rdpmc_trap)
                .map(|mark| Arc::new(gp_trap(mark, fixups.clone()))),
            ud_trap: xbegin.then(|| Arc::new(host_quirks::xbegin_abort::trap(fixups.clone()))),
        }
    }
}

/// Opens KVM and creates the VM with its TSS, in-kernel irqchip (PIC, IOAPIC, LAPICs) and PIT.
fn create_vm() -> Result<(Kvm, Arc<VmFd>), VmError> {
    let hv = Kvm::new().map_err(VmError::OpenKvm)?;
    let vm = Arc::new(hv.create_vm().map_err(KvmSetupError::CreateVm)?);
    vm.set_tss_address(layout::KVM_TSS_ADDR as usize)
        .map_err(KvmSetupError::SetTssAddr)?;
    vm.create_irq_chip().map_err(KvmSetupError::CreateIrqchip)?;
    vm.create_pit2(kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    })
    .map_err(KvmSetupError::CreatePit2)?;
    Ok((hv, vm))
}

/// Maps `mib` MiB of guest RAM at guest-physical 0 (one region, below the 32-bit MMIO hole).
fn create_memory(vm: &VmFd, mib: u64) -> Result<GuestMemoryMmap, VmError> {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), (mib << 20) as usize)])
        .map_err(VmError::Memory)?;
    for (slot, region) in mem.iter().enumerate() {
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().raw_value(),
            memory_size: region.len(),
            userspace_addr: mem.get_host_address(region.start_addr()).unwrap() as u64,
            flags: 0,
        };
        // SAFETY: the region is a live mmap owned by `mem`. Its clones live as long as the VM:
        // each vCPU thread holds one beside its VM reference, and `BuiltVm` drops its VM
        // reference (the last) before its clone of `mem`.
        unsafe { vm.set_user_memory_region(r) }.map_err(KvmSetupError::SetUserMemoryRegion)?;
    }
    Ok(mem)
}

/// A guest in memory.
struct LoadedGuest<'a> {
    /// How vCPU 0 starts.
    entry: regs::BootEntry,
    /// The Linux kernel command line (None for a flat image).
    cmdline: Option<String>,
    /// Where the RDPMC sites are looked for.
    code: pmu::setup::GuestCode<'a>,
}

/// The guest kernel's own PMI throttle, off for the project's /init
/// (`vpmu.perf_cpu_time_max_percent=0`) whenever the vPMU is on with a PMI limit. The kernel
/// times its PMI handler and lowers perf_event_max_sample_rate when it looks slow ("perf:
/// interrupt took too long"); but the handler's MSR accesses are exits to this VMM (4-10 per
/// PMI), whose cost is the host's, not the guest's: on the SVM host it lowered the rate from
/// 100000 to 3900-4000/s within 45 s of one profile, and on kvm_pvm (a host quirk asks the
/// same) to 100/s, throttling the fixed-period profiles compare relies on. The VMM bounds
/// PMIs itself (`--pmi-limit`, default 2000/s per vCPU), so a guest cannot storm the host
/// either way. The user's own `vpmu.perf_cpu_time_max_percent=N` comes later on the command
/// line and wins; `--pmi-limit 0` leaves the guest's throttle on.
pub(super) const PMI_THROTTLE_OFF: &str = "vpmu.perf_cpu_time_max_percent=0";

fn guest_pmi_throttle_off(cfg: &VmConfig) -> bool {
    cfg.vpmu != VpmuSetting::Off && cfg.pmi_limit > 0
}

/// Loads the kernel (with ACPI tables and command line) or the flat image into `mem`.
fn load_guest<'a>(
    cfg: &'a VmConfig,
    mem: &GuestMemoryMmap,
    quirks: bool,
    throttle_off: bool,
) -> Result<LoadedGuest<'a>, VmError> {
    match &cfg.boot {
        Boot::Linux {
            kernel,
            initrd,
            cmdline,
        } => match multiboot_image(kernel)? {
            Some(image) => load_multiboot(cfg, mem, kernel, &image, initrd.is_some(), cmdline),
            None => load_linux(
                cfg,
                mem,
                kernel,
                initrd.as_deref(),
                cmdline,
                (quirks, throttle_off),
            ),
        },
        Boot::Flat {
            image,
            load_addr,
            entry,
            long_mode,
        } => {
            let fits = load_addr
                .checked_add(image.len() as u64)
                .is_some_and(|end| end <= cfg.memory_mib << 20);
            if !fits {
                return Err(VmError::ImageTooBig {
                    len: image.len(),
                    load_addr: *load_addr,
                });
            }
            mem.write_slice(image, GuestAddress(*load_addr))
                .map_err(VmError::LoadImage)?;
            let entry = match long_mode {
                true => regs::BootEntry::LongMode { rip: *entry },
                false => regs::BootEntry::RealMode { rip: *entry },
            };
            Ok(LoadedGuest {
                entry,
                cmdline: None,
                code: pmu::setup::GuestCode::Flat {
                    image,
                    base: *load_addr,
                },
            })
        }
    }
}

fn load_linux<'a>(
    cfg: &VmConfig,
    mem: &GuestMemoryMmap,
    kernel: &Path,
    initrd: Option<&Path>,
    user_cmdline: &str,
    (quirks, throttle_off): (bool, bool),
) -> Result<LoadedGuest<'a>, VmError> {
    let virtio = virtio_mmio_devices(cfg);
    let rsdp = boot::acpi::create_acpi_tables_with(
        mem,
        cfg.vcpus as u8,
        layout::IOAPIC_ADDR,
        layout::LAPIC_ADDR,
        &virtio,
    )?;
    let root = root_option(initrd.is_some(), &cfg.disks, user_cmdline);
    let host_options = if quirks {
        Some(host_quirks::KERNEL_OPTIONS)
    } else {
        throttle_off.then_some(PMI_THROTTLE_OFF)
    };
    let full = kernel_cmdline(host_options, cfg.net.is_some(), root, user_cmdline);
    let loaded = boot::kernel::load(mem, kernel, initrd, &full, Some(rsdp))?;
    log::info!(
        "kernel {} entry {:#x}, ends {:#x}{}",
        kernel.display(),
        loaded.entry.raw_value(),
        loaded.kernel_end,
        loaded
            .initrd
            .map(|(a, s)| format!(", initrd {s} bytes at {:#x}", a.raw_value()))
            .unwrap_or_default()
    );
    log::info!("kernel command line: {full}");
    Ok(LoadedGuest {
        entry: regs::BootEntry::LongMode {
            rip: loaded.entry.raw_value(),
        },
        cmdline: Some(full),
        code: pmu::setup::GuestCode::Elf(loaded.elf),
    })
}

/// The kernel file's bytes when it is a Multiboot kernel (an ELF32: kvm-unit-tests).
fn multiboot_image(kernel: &Path) -> Result<Option<Vec<u8>>, VmError> {
    boot::multiboot::probe(kernel).map_err(|source| VmError::Multiboot {
        path: kernel.into(),
        source,
    })
}

/// A Multiboot v1 kernel (kvm-unit-tests): its ELF32 segments, the information block, its
/// command line (the file's name, then `--cmdline`, as QEMU gives it: kvm-unit-tests takes it
/// as argv) and one module, the environment built from `--cpus` and `--memory`. No Linux
/// options, no initrd; the ACPI tables are there for kernels that look for them. Its code is
/// run as it is: no RDPMC is rewritten.
fn load_multiboot<'a>(
    cfg: &VmConfig,
    mem: &GuestMemoryMmap,
    kernel: &Path,
    image: &[u8],
    initrd: bool,
    user_cmdline: &str,
) -> Result<LoadedGuest<'a>, VmError> {
    let err = |source| VmError::Multiboot {
        path: kernel.into(),
        source,
    };
    if initrd {
        return Err(err(boot::multiboot::MultibootError::Initrd));
    }
    boot::acpi::create_acpi_tables_with(
        mem,
        cfg.vcpus as u8,
        layout::IOAPIC_ADDR,
        layout::LAPIC_ADDR,
        &[],
    )?;
    let name = kernel.file_name().unwrap_or(kernel.as_os_str());
    let cmdline = [name.to_string_lossy().trim(), user_cmdline.trim()]
        .join(" ")
        .trim()
        .to_string();
    let env = boot::multiboot::kvm_unit_tests_env(cfg.vcpus, cfg.memory_mib);
    let info = boot::multiboot::BootInfo {
        cmdline: &cmdline,
        module: env.as_bytes(),
    };
    let loaded = boot::multiboot::load(mem, image, &info).map_err(err)?;
    log::info!(
        "Multiboot kernel {} entry {:#x} (32-bit protected mode), ends {:#x}; info block at {:#x}, environment module: {:?}",
        kernel.display(),
        loaded.entry,
        loaded.kernel_end,
        loaded.info,
        env
    );
    log::info!("Multiboot command line: {cmdline}");
    Ok(LoadedGuest {
        entry: regs::BootEntry::Multiboot {
            entry: loaded.entry,
            info: loaded.info,
        },
        cmdline: Some(cmdline),
        code: pmu::setup::GuestCode::Unpatched,
    })
}

/// The virtio-mmio devices in the DSDT, in the order Linux probes them: the network card,
/// then the disks in `--disk` order (so the first disk is /dev/vda).
fn virtio_mmio_devices(cfg: &VmConfig) -> Vec<boot::acpi::VirtioMmioAcpi> {
    let net = cfg.net.iter().map(|_| boot::acpi::VirtioMmioAcpi {
        base: layout::VIRTIO_NET_MMIO_BASE as u32,
        len: MMIO_LEN as u32,
        gsi: net::NET_GSI,
    });
    let disks = (0..cfg.disks.len()).map(|i| boot::acpi::VirtioMmioAcpi {
        base: disk_base(i) as u32,
        len: MMIO_LEN as u32,
        gsi: blk::disk_gsi(i),
    });
    net.chain(disks).collect()
}

/// Disk `i`'s register block.
fn disk_base(i: usize) -> u64 {
    layout::VIRTIO_BLK_MMIO_BASE + i as u64 * MMIO_LEN
}

/// The root device option the VMM adds, as Firecracker does for its root drive: with no initrd,
/// the first `--disk` is the root filesystem (`root=/dev/vda`, mounted `ro` if the disk is
/// read-only, else `rw`), unless the user's command line names a root itself.
fn root_option(has_initrd: bool, disks: &[DiskConfig], user: &str) -> Option<&'static str> {
    let user_names_root = user.split_whitespace().any(|w| w.starts_with("root="));
    match disks.first() {
        Some(d) if !has_initrd && !user_names_root => Some(if d.readonly {
            "root=/dev/vda ro"
        } else {
            "root=/dev/vda rw"
        }),
        _ => None,
    }
}

/// [`DEFAULT_CMDLINE`], then the host's options (host quirks', or [`PMI_THROTTLE_OFF`]), the
/// network options, the root device ([`root_option`]), the user's (last: /init takes the last
/// of a repeated `vpmu.` option, so the user's wins).
fn kernel_cmdline(host: Option<&str>, net: bool, root: Option<&str>, user: &str) -> String {
    let mut full = DEFAULT_CMDLINE.to_string();
    let net_options = net.then(net::kernel_cmdline);
    let parts = [
        host,
        net_options.as_deref(),
        root,
        Some(user.trim()).filter(|u| !u.is_empty()),
    ];
    for part in parts.into_iter().flatten() {
        full.push(' ');
        full.push_str(part);
    }
    full
}

/// The accounting mode (switchable at run time: `--vpmu-schedule`, the vPMU control port).
fn mode_switch(cfg: &VmConfig) -> Option<Arc<ModeSwitch>> {
    let initial = match (cfg.vpmu, &cfg.vpmu_schedule) {
        (VpmuSetting::Off, _) => return None,
        (_, Some(s)) => s.first(),
        (VpmuSetting::CpuSwitch, None) => vpmu::AccountingMode::CpuSwitch,
        (_, None) => vpmu::AccountingMode::DomainSwitch,
    };
    Some(Arc::new(ModeSwitch::new(initial)))
}

/// The devices and the two buses they hang on, and what else of them the run keeps.
pub(super) struct Devices {
    pub pio: PioBus,
    pub mmio: MmioBus,
    /// The guest console's log (last lines, panic detection).
    pub console: Arc<Mutex<ConsoleLog>>,
    /// With `--net`: the virtio-mmio network card.
    pub net_card: Option<NetCard>,
    /// With `--disk`: the block devices and their images' paths, in `--disk` order.
    pub disks: Vec<(std::path::PathBuf, DiskCard)>,
    /// The guest's network is up (the pinger saw a reply).
    pub net_up: Arc<Latch>,
    /// The pinger's packets are held back (the packet gate, compare's controller).
    pub net_paused: Arc<AtomicBool>,
}

/// Creates the devices and puts them on the buses: COM1, COM2, i8042, the ACPI sleep register,
/// the isa-debug-exit port (0xf4, always there: kvm-unit-tests ends through it), the vPMU control port, the delay port and the packet gate on port I/O; the network card on
/// MMIO. Starts the stdin reader with `--console-in`.
fn attach_devices(
    cfg: &VmConfig,
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    control: &Arc<VmControl>,
    mode_switch: Option<&Arc<ModeSwitch>>,
) -> Result<Devices, VmError> {
    let console = Arc::new(Mutex::new(ConsoleLog::default()));
    let cap = cfg.output_file_cap_mib.saturating_mul(1 << 20);
    let console_out = open_output(cfg.console_out.as_deref(), cap, std::io::stdout)?;
    let com2_out = open_output(cfg.serial2.as_deref(), cap, std::io::sink)?;
    let com1 = Arc::new(Mutex::new(serial::Uart::new(
        irqfd(vm, serial::COM1_GSI)?,
        Tee::new(console_out, console.clone()),
    )));
    let com2 = serial::Uart::new(irqfd(vm, serial::COM2_GSI)?, com2_out);
    // Closed from the start when the guest gates the packets (the packet gate port).
    let gated = cfg.net.is_some_and(|n| n.guest_gate && n.rx_pps > 0);
    let net_paused = Arc::new(AtomicBool::new(gated));
    let mut pio = PioBus::builder();
    pio.insert(serial::COM1_BASE, serial::UART_LEN, com1.clone())?
        .insert(serial::COM2_BASE, serial::UART_LEN, shared(com2))?
        .insert(i8042::I8042_BASE, i8042::I8042_LEN, shared(i8042::I8042))?
        .insert(
            boot::acpi::PM_BASE_PORT,
            boot::acpi::PM_PORTS,
            shared(AcpiPm::default()),
        )?
        .insert(
            debug_exit::DEBUG_EXIT_PORT,
            debug_exit::DEBUG_EXIT_LEN,
            shared(debug_exit::DebugExit),
        )?;
    if let Some(m) = mode_switch {
        let c = control.clone();
        let kick_all = Box::new(move || c.kick_all());
        let port = vpmu_control::VpmuControl::new(m.clone(), kick_all);
        pio.insert(vpmu_control::VPMU_CONTROL_PORT, 1, shared(port))?;
    }
    if cfg.io_delay_us > 0 {
        let each = Duration::from_micros(u64::from(cfg.io_delay_us));
        pio.insert(delay::DELAY_PORT, 1, shared(delay::Delay::new(each)))?;
    }
    if gated {
        let gate = packet_gate::PacketGate::new(net_paused.clone());
        pio.insert(packet_gate::PACKET_GATE_PORT, 1, shared(gate))?;
    }
    if cfg.console_in {
        serial::spawn_stdin_reader(com1);
    }
    let net_up = Arc::new(Latch::default());
    let net_card = match cfg.net {
        Some(n) => Some(net_card(n, vm, mem, &net_paused, &net_up)?),
        None => None,
    };
    let mut mmio = MmioBus::builder();
    if let Some(card) = &net_card {
        mmio.insert(layout::VIRTIO_NET_MMIO_BASE, MMIO_LEN, card.clone())?;
    }
    let disks = disks(cfg, vm, mem, control)?;
    for (i, (_, d)) in disks.iter().enumerate() {
        mmio.insert(disk_base(i), MMIO_LEN, d.clone())?;
    }
    Ok(Devices {
        pio: pio.build(),
        mmio: mmio.build(),
        console,
        net_card,
        disks,
        net_up,
        net_paused,
    })
}

/// The block devices: each image opened, checked and locked (a failure ends the build).
fn disks(
    cfg: &VmConfig,
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    control: &Arc<VmControl>,
) -> Result<Vec<(std::path::PathBuf, DiskCard)>, VmError> {
    if cfg.disks.len() > blk::MAX_DISKS {
        return Err(VmError::TooManyDisks(cfg.disks.len()));
    }
    let mut out = Vec::new();
    for (i, d) in cfg.disks.iter().enumerate() {
        let image = blk::file::open(&d.path, d.readonly)?;
        let name = d.path.display().to_string();
        let mut dev = VirtioBlk::new(image.file, image.sectors, d.readonly, image.id, name);
        let control = control.clone();
        dev.stop_when(Arc::new(move || control.stopping()));
        let cost = Duration::from_micros(u64::from(d.access_cost_us));
        let transport = MmioTransport::new(dev, mem.clone(), irqfd(vm, blk::disk_gsi(i))?);
        let card = Arc::new(Mutex::new(transport.with_access_cost(cost)));
        log::info!(
            "disk {} (/dev/vd{}): {} sectors{} at {:#x}, GSI {}",
            d.path.display(),
            (b'a' + i as u8) as char,
            image.sectors,
            if d.readonly { ", read-only" } else { "" },
            disk_base(i),
            blk::disk_gsi(i)
        );
        out.push((d.path.clone(), card));
    }
    Ok(out)
}

/// The virtio-mmio network card, its pinger (if it sends) wired to the gate and the latch.
fn net_card(
    n: net::NetConfig,
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    paused: &Arc<AtomicBool>,
    up: &Arc<Latch>,
) -> Result<NetCard, VmError> {
    let pinger =
        (n.rx_pps > 0).then(|| Pinger::new(n.rx_pps).with_handles(paused.clone(), up.clone()));
    let card = VirtioNet::new(net::pinger::GUEST_MAC, pinger);
    let cost = Duration::from_micros(u64::from(n.access_cost_us));
    let transport = MmioTransport::new(card, mem.clone(), irqfd(vm, net::NET_GSI)?);
    Ok(Arc::new(Mutex::new(transport.with_access_cost(cost))))
}

fn shared<D: PioDevice + 'static>(dev: D) -> Arc<Mutex<dyn PioDevice>> {
    Arc::new(Mutex::new(dev))
}

/// A file created at `path`, or `default()` (stdout, a sink) without one.
/// The file at `path`, holding at most `cap` bytes of guest output (0: no cap), else
/// `default()`.
fn open_output<W: std::io::Write + Send + 'static>(
    path: Option<&Path>,
    cap: u64,
    default: fn() -> W,
) -> Result<Box<dyn std::io::Write + Send>, VmError> {
    Ok(match path {
        Some(p) => {
            let f = File::create(p).map_err(|source| VmError::Output {
                path: p.to_path_buf(),
                source,
            })?;
            match cap {
                0 => Box::new(f),
                cap => Box::new(crate::console::Capped::new(f, cap, p.to_path_buf())),
            }
        }
        None => Box::new(default()),
    })
}

/// An eventfd that raises `gsi` on the in-kernel irqchip when written.
fn irqfd(vm: &VmFd, gsi: u32) -> Result<EventFd, VmError> {
    let evt = EventFd::new(libc::EFD_NONBLOCK).map_err(VmError::EventFd)?;
    vm.register_irqfd(&evt, gsi).map_err(KvmSetupError::Irqfd)?;
    Ok(evt)
}

/// What every vCPU's vPMU is made from (the vPMU on): the same for every vCPU.
pub(super) struct VpmuPlan {
    pub config: vpmu::PmuConfig,
    /// `--vpmu-backend`, `auto` resolved.
    pub backend: BackendChoice,
    /// The initial accounting mode.
    pub mode: vpmu::AccountingMode,
    /// The model's CPUID edits.
    pub cpuid_edits: Vec<vpmu::cpuid::CpuidEdit>,
    /// The guest's RDPMC sites, rewritten to RDMSR (empty unless `--rdpmc patch`, or auto
    /// that could patch).
    pub rdpmc: Arc<RdpmcSites>,
    /// The mark over the guest's #GP handler that serves RDPMC where the guest executes it
    /// unpatched (`--rdpmc trap`, and `auto`: user space, code the rewrite could not reach).
    pub rdpmc_trap: Option<Mark>,
    /// ns of KVM's exit path taken off each KVM_RUN interval the soft backend's cpu-switch
    /// charges (0: whole intervals; other backends: 0, `exclude_host` does it).
    pub exit_cost_ns: u64,
    /// ns one notification costs the vCPU thread here (`host_probe`; 0: not measured): the
    /// soft backend's shortest period follows from it.
    pub notify_cost_ns: u64,
}

/// Chooses the vPMU's model and backend, rewrites the guest's RDPMCs and installs the MSR filter
/// over the model's ranges. None with `--vpmu=off`.
fn plan_vpmu(
    cfg: &VmConfig,
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    guest_cpuid: &[kvm_cpuid_entry2],
    code: &pmu::setup::GuestCode<'_>,
    mode_switch: &Option<Arc<ModeSwitch>>,
    quirks: bool,
) -> Result<Option<VpmuPlan>, VmError> {
    let Some(mode) = mode_switch.as_ref().map(|m| m.get()) else {
        return Ok(None);
    };
    let config = pmu::setup::model_config(cfg.pmu_model, guest_cpuid);
    let backend = pmu::setup::resolve_backend(cfg.pmu_backend)?;
    // A throwaway model gives the MSR ranges and CPUID edits (the same for every vCPU).
    let probe = vpmu::Pmu::new(config, Box::new(vpmu::fake::FakeBackend::new()))?;
    let mut ranges = probe.msr_ranges();
    ranges.sort_by_key(|r| *r.start());
    let mark = Mark::for_host(quirks);
    let (rdpmc, rdpmc_trap) = match cfg.rdpmc {
        RdpmcSetting::Patch => {
            let sites = pmu::setup::patch_rdpmc(mem, code)?;
            (RdpmcSites::new(probe.rdpmc_ranges(), &sites), None)
        }
        RdpmcSetting::Auto if matches!(code, pmu::setup::GuestCode::Unpatched) => {
            log::info!(
                "RDPMC (--rdpmc auto): trap: the guest's code is run unmodified (a Multiboot \
                 kernel), so every guest RDPMC is served by trapping the guest's #GP handler"
            );
            (RdpmcSites::default(), Some(mark))
        }
        RdpmcSetting::Auto => match pmu::setup::patch_rdpmc(mem, code) {
            Ok(sites) => {
                log::info!(
                    "RDPMC (--rdpmc auto): patch: {} site(s) in the guest kernel rewritten; \
                     RDPMC elsewhere (guest user space reading its counters through the perf \
                     mmap page, code the rewrite did not reach) is served by trapping the \
                     guest's #GP handler",
                    sites.len()
                );
                (RdpmcSites::new(probe.rdpmc_ranges(), &sites), Some(mark))
            }
            Err(e) if e.nothing_patched() => {
                log::warn!(
                    "RDPMC (--rdpmc auto): trap: patching refused ({e}); every guest RDPMC is \
                     served by trapping the guest's #GP handler instead"
                );
                (RdpmcSites::default(), Some(mark))
            }
            Err(e) => return Err(e.into()),
        },
        RdpmcSetting::Trap => (RdpmcSites::default(), Some(mark)),
        RdpmcSetting::Off => (RdpmcSites::default(), None),
    };
    if let Some(mark) = rdpmc_trap {
        log::info!("RDPMC trap: {mark:?} over the guest's #GP handler");
    }
    let rdpmc_ranges = if rdpmc.is_empty() {
        Vec::new()
    } else {
        probe.rdpmc_ranges()
    };
    pmu::setup::install_msr_filter(vm, &ranges, &rdpmc_ranges)
        .map_err(KvmSetupError::SetMsrFilter)?;
    log::info!(
        "vPMU: {:?} model, {mode:?} accounting, {backend:?} backend, PMI limit {}/s per vCPU; {} MSR ranges to user space",
        config.vendor(),
        cfg.pmi_limit,
        ranges.len()
    );
    if backend == BackendChoice::Sim {
        log::warn!(
            "vPMU: hw backend over a SIMULATED host PMU (--vpmu-backend sim, a test backend): \
             every hardware event counts the vCPU thread's CPU time x TSC rate, split at KVM_RUN \
             into guest and host mode"
        );
    }
    if let Some(f) = &cfg.pmu_event_filter {
        log::info!("vPMU event filter: {f}");
    }
    Ok(Some(VpmuPlan {
        config,
        backend,
        mode,
        cpuid_edits: probe.cpuid_edits(),
        rdpmc: Arc::new(rdpmc),
        rdpmc_trap,
        exit_cost_ns: 0,
        notify_cost_ns: 0,
    }))
}

/// What the vPMU takes from the host probe (`host_probe`, once per process): the soft
/// backend's cpu-switch exit cost (or `--exit-cost-ns`), and a warning where KVM answers RDPMC
/// itself, so the trap cannot serve the RDPMCs it is there for. None if the probe failed
/// (said so; whole KVM_RUN intervals are then charged).
fn apply_host_probe(
    cfg: &VmConfig,
    hv: &Kvm,
    plan: &mut VpmuPlan,
) -> Option<super::host_probe::HostProbe> {
    use super::host_probe::{probe, PERCENTILE, SAMPLES};
    let probed = probe(hv)
        .inspect_err(|e| {
            log::warn!(
                "cannot probe this host's KVM ({e}); cpu-switch (soft backend) charges whole \
                 KVM_RUN intervals to the guest"
            )
        })
        .ok();
    if plan.backend == BackendChoice::Soft {
        plan.exit_cost_ns = match (cfg.exit_cost_ns, probed) {
            (Some(ns), _) => {
                log::info!("cpu-switch (soft backend): {ns} ns of KVM's exit path left out per exit (--exit-cost-ns)");
                ns
            }
            (None, Some(p)) => {
                log::info!(
                    "cpu-switch (soft backend): KVM's exit path costs {:.1} us per exit to user \
                     space on this host (p{PERCENTILE} of {SAMPLES} port-I/O exits of a probe VM); \
                     left out of each KVM_RUN interval the guest is charged",
                    p.exit_cost_ns as f64 / 1000.0,
                );
                p.exit_cost_ns
            }
            (None, None) => 0,
        };
    }
    plan.notify_cost_ns = probed.map_or(0, |p| p.notify_cost_ns());
    if plan.rdpmc_trap.is_some() && probed.is_some_and(|p| p.kvm_answers_rdpmc) {
        log::warn!(
            "RDPMC trap: this host's KVM answers guest RDPMC itself (reading 0) although its PMU \
             is off for the VM (Linux 6.1 kvm_amd does), so no #GP comes to trap: guest RDPMCs \
             outside the rewritten kernel sites (user space reading its counters through the \
             perf mmap page, a Multiboot kernel) read 0, not the vPMU's counters"
        );
    }
    probed
}

/// The int3 over the guest's #GP handler that serves RDPMC (`--rdpmc trap`).
fn gp_trap(mark: Mark, fixups: Arc<FixupCounts>) -> host_quirks::idt_trap::VectorTrap {
    let names = host_quirks::idt_trap::TrapNames {
        owner: "rdpmc trap",
        exception: "#GP",
        without: "guest RDPMC",
        reinstalled: "rdpmc trap: re-installed after the guest rewrote its #GP entry",
        moved: "rdpmc trap: moved after the guest changed its #GP gate",
    };
    host_quirks::idt_trap::VectorTrap::new(crate::arch::x86::VECTOR_GP, mark, names, fixups)
}

/// `VmConfig::const_msrs` without a vPMU: these MSRs exit to user space (answered 0).
fn filter_const_msrs(vm: &VmFd, msrs: &[u32]) -> Result<(), VmError> {
    if msrs.is_empty() {
        return Ok(());
    }
    let ranges: Vec<_> = msrs.iter().map(|&m| m..=m).collect();
    pmu::setup::install_msr_filter(vm, &ranges, &[])
        .map_err(|e| KvmSetupError::SetMsrFilter(e).into())
}

/// KVM's supported CPUID, or for `--pmu-model intel` on a host that is not Intel (`amd` on one
/// that is not AMD), a whole Intel (AMD) CPU identity over it.
fn guest_cpuid(model: ModelChoice, supported: &[kvm_cpuid_entry2]) -> Vec<kvm_cpuid_entry2> {
    match model {
        ModelChoice::Intel if !identity::is_intel(supported) => {
            log::info!(
                "guest CPU identity: GenuineIntel family {} model {:#x} (\"{}\"), for --pmu-model intel",
                identity::INTEL_FAMILY,
                identity::INTEL_MODEL,
                identity::INTEL_BRAND
            );
            identity::intel(supported)
        }
        ModelChoice::Amd if !identity::is_amd(supported) => {
            log::info!(
                "guest CPU identity: AuthenticAMD family {:#x} model {:#x} (\"{}\"), for --pmu-model amd",
                identity::AMD_FAMILY,
                identity::AMD_MODEL,
                identity::AMD_BRAND
            );
            identity::amd(supported)
        }
        _ => supported.to_vec(),
    }
}

/// What the vCPUs are made from, besides what they share ([`VcpuShared`]).
struct VcpuPlan<'a> {
    cfg: &'a VmConfig,
    /// KVM's supported CPUID with the guest's identity ([`guest_cpuid`]).
    guest_cpuid: &'a [kvm_cpuid_entry2],
    /// Host quirks detected before boot (CPUID hides what the host cannot run).
    quirks: bool,
    /// How vCPU 0 starts.
    entry: regs::BootEntry,
    vpmu: Option<&'a VpmuPlan>,
    mode_switch: &'a Option<Arc<ModeSwitch>>,
    net_card: Option<&'a NetCard>,
    traps: &'a Traps,
}

/// Creates the vCPUs: each with its CPUID, vPMU and boot state (vCPU 0 starts at the entry, the
/// others wait in KVM for INIT/SIPI).
fn make_vcpus(plan: &VcpuPlan<'_>, shared: &VcpuShared) -> Result<Vec<VcpuRunner>, VmError> {
    let pmu_edits = match plan.vpmu {
        Some(v) => v.cpuid_edits.clone(),
        None => vpmu::cpuid::hide_pmu(),
    };
    let cfg = plan.cfg;
    let policy = cpuid::CpuidPolicy {
        hide_cx16: plan.quirks,
        hide_hypercall_features: plan.quirks,
    };
    // Registers through kvm_run only where the VMM touches them on many exits: the SYSCALL relay
    // (host quirks) reads and writes them on every relayed system call. Elsewhere few exits read
    // a register, and KVM copying all three sets into kvm_run at every exit costs ~4% of a plain
    // port-write exit here (benches/sync_regs.rs, R1), so the lazy ioctls are cheaper.
    let sync_regs = cfg.sync_regs && plan.quirks && crate::vcpu::sync_regs_available(&shared.vm);
    let mut runners = Vec::new();
    for id in 0..cfg.vcpus {
        let fd = shared
            .vm
            .create_vcpu(u64::from(id))
            .map_err(KvmSetupError::CreateVcpu)?;
        let mut table = cpuid::for_vcpu(plan.guest_cpuid, id, cfg.vcpus, policy);
        pmu::setup::apply_cpuid(&mut table, &pmu_edits);
        let mut pmu = match plan.vpmu {
            Some(v) => Some(vcpu_pmu(cfg, v, &fd, plan.mode_switch)?),
            None => None,
        };
        let table = CpuId::from_entries(&table).map_err(VmError::CpuidTable)?;
        fd.set_cpuid2(&table).map_err(KvmSetupError::SetCpuid2)?;
        regs::setup_common(&fd)?;
        if let Some(p) = pmu.as_mut() {
            p.guest_tsc_offset = crate::vcpu_access::guest_tsc_offset(&fd).unwrap_or(0);
        }
        if id == 0 {
            regs::setup_boot_entry(&fd, &shared.mem, plan.entry)?;
        }
        // The pinger's clock runs on vCPU 0's thread: its work is charged to that vCPU.
        let ticker = match (plan.net_card, cfg.net) {
            (Some(card), Some(n)) if id == 0 && n.rx_pps > 0 => {
                Some(Ticker::new(card.clone(), net::tick_period(n.rx_pps)))
            }
            _ => None,
        };
        let relay = plan.traps.relay.clone().map(syscall_relay::VcpuRelay::new);
        let mut runner = VcpuRunner::new(id, fd, shared.clone(), pmu, ticker, relay);
        runner.sync_regs = sync_regs;
        runner.gp_trap = plan.traps.gp_trap.clone().map(|t| (t, TrapPoll::new()));
        runner.ud_trap = plan.traps.ud_trap.clone().map(|t| (t, TrapPoll::new()));
        runners.push(runner);
    }
    Ok(runners)
}

/// One vCPU's vPMU: the model over a perf backend on this vCPU's thread.
fn vcpu_pmu(
    cfg: &VmConfig,
    plan: &VpmuPlan,
    fd: &VcpuFd,
    mode_switch: &Option<Arc<ModeSwitch>>,
) -> Result<VcpuPmu, VmError> {
    let tsc_khz = || -> Result<u64, VmError> {
        Ok(u64::from(
            fd.get_tsc_khz().map_err(KvmSetupError::GetTscKhz)?,
        ))
    };
    let host = Box::new(HostPerf {
        signal: kick::kick_signal(),
    });
    let (source, perf): (_, Box<dyn PerfSys>) = match plan.backend {
        BackendChoice::Hw => (Source::Hw, host),
        BackendChoice::Sim => (Source::Hw, Box::new(SimHost::new(tsc_khz()?))),
        BackendChoice::Soft | BackendChoice::Auto => (
            Source::Soft {
                tsc_khz: tsc_khz()?,
                exit_cost_ns: plan.exit_cost_ns,
                notify_cost_ns: plan.notify_cost_ns,
            },
            host,
        ),
    };
    let backend = PerfBackend::new(source, plan.mode, perf);
    let mut model = vpmu::Pmu::new(plan.config, Box::new(backend))?;
    model.set_event_filter(cfg.pmu_event_filter.clone());
    // Guest writes mark counters dirty; the run loop reprograms them once before KVM_RUN.
    model.set_deferred_reprogram(true);
    Ok(VcpuPmu::new(
        model,
        cfg.pmi_limit,
        plan.rdpmc.clone(),
        mode_switch.clone().expect("a vPMU has a mode"),
    ))
}

/// `--trace` / `--host-profile`: starts the writers and gives each vCPU its recorder.
fn start_recording(
    cfg: &VmConfig,
    runners: &mut [VcpuRunner],
    mode_switch: &Option<Arc<ModeSwitch>>,
    quirks: bool,
    notify_cost_ns: u64,
) -> Result<Option<Recording>, VmError> {
    let Some(first) = runners.first().filter(|_| cfg.record.is_on()) else {
        return Ok(None);
    };
    let host = crate::trace::recorder::RecordHost {
        tsc_khz: first.fd.get_tsc_khz().map_err(KvmSetupError::GetTscKhz)?,
        guest_kernel_emulated: quirks,
        notify_cost_ns,
    };
    let kernel = match &cfg.boot {
        Boot::Linux { kernel, .. } => Some(kernel.as_path()),
        Boot::Flat { .. } => None,
    };
    let mut recording = Recording::start(
        &cfg.record,
        cfg.vcpus,
        host,
        cfg.vpmu,
        kernel,
        mode_switch.clone(),
    )?;
    if let Some(rec) = recording.as_mut() {
        for r in runners.iter_mut() {
            r.recorder = rec.take_vcpu();
        }
    }
    Ok(recording)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DSDT lists the network card, then the disks in `--disk` order: Linux names the
    /// disks vda, vdb, ... in that order.
    #[test]
    fn virtio_devices_are_described_net_first_then_disks_in_order() {
        let disk = |p: &str| blk::DiskConfig {
            path: p.into(),
            readonly: false,
            access_cost_us: 0,
        };
        let mut cfg = VmConfig::new(Boot::Flat {
            image: Vec::new(),
            load_addr: 0,
            entry: 0,
            long_mode: false,
        });
        cfg.disks = vec![disk("a.img"), disk("b.img")];
        let v: Vec<_> = virtio_mmio_devices(&cfg)
            .iter()
            .map(|d| (d.base, d.gsi))
            .collect();
        assert_eq!(v, [(0xd000_1000, 16), (0xd000_2000, 17)]);
        cfg.net = Some(net::NetConfig {
            rx_pps: 0,
            access_cost_us: 0,
            guest_gate: false,
        });
        let v: Vec<_> = virtio_mmio_devices(&cfg)
            .iter()
            .map(|d| (d.base, d.gsi))
            .collect();
        assert_eq!(v, [(0xd000_0000, 5), (0xd000_1000, 16), (0xd000_2000, 17)]);
    }

    #[test]
    fn kernel_cmdline_appends_in_order() {
        assert_eq!(kernel_cmdline(None, false, None, "  "), DEFAULT_CMDLINE);
        let full = kernel_cmdline(
            Some(host_quirks::KERNEL_OPTIONS),
            true,
            Some("root=/dev/vda rw"),
            " quiet ",
        );
        let quirks = full.find(host_quirks::KERNEL_OPTIONS).unwrap();
        let net = full.find(&net::kernel_cmdline()).unwrap();
        assert!(full.starts_with(DEFAULT_CMDLINE));
        assert!(quirks < net, "{full}");
        assert!(full.ends_with(" root=/dev/vda rw quiet"), "{full}");
        // The throttle option comes before the user's, who can undo it.
        let slow = kernel_cmdline(
            Some(PMI_THROTTLE_OFF),
            false,
            None,
            "vpmu.perf_cpu_time_max_percent=25",
        );
        assert!(
            slow.ends_with(" vpmu.perf_cpu_time_max_percent=0 vpmu.perf_cpu_time_max_percent=25"),
            "{slow}"
        );
    }

    #[test]
    fn the_first_disk_is_the_root_without_an_initrd() {
        let disk = |readonly| DiskConfig {
            path: "img".into(),
            readonly,
            access_cost_us: 0,
        };
        let rw = [disk(false), disk(true)];
        assert_eq!(root_option(false, &rw, ""), Some("root=/dev/vda rw"));
        assert_eq!(
            root_option(false, &[disk(true)], "quiet"),
            Some("root=/dev/vda ro")
        );
        assert_eq!(root_option(true, &rw, ""), None, "an initrd is the root");
        assert_eq!(root_option(false, &[], ""), None, "no disk");
        assert_eq!(
            root_option(false, &rw, "x root=/dev/vdb"),
            None,
            "the user's root"
        );
        assert_eq!(
            root_option(false, &rw, "vpmu.root=1"),
            Some("root=/dev/vda rw")
        );
    }

    #[test]
    fn the_vpmu_setting_gives_the_initial_mode() {
        let mut cfg = VmConfig::new(Boot::Flat {
            image: vec![0xf4],
            load_addr: 0x1000,
            entry: 0x1000,
            long_mode: false,
        });
        assert!(mode_switch(&cfg).is_none(), "--vpmu=off: no mode");
        cfg.vpmu = VpmuSetting::CpuSwitch;
        let m = mode_switch(&cfg).unwrap();
        assert_eq!(m.get(), vpmu::AccountingMode::CpuSwitch);
        cfg.vpmu = VpmuSetting::DomainSwitch;
        let m = mode_switch(&cfg).unwrap();
        assert_eq!(m.get(), vpmu::AccountingMode::DomainSwitch);
    }

    #[test]
    fn a_flat_image_that_does_not_fit_is_a_typed_error() {
        let mut cfg = VmConfig::new(Boot::Flat {
            image: vec![0x90; 0x2000],
            load_addr: 0,
            entry: 0,
            long_mode: false,
        });
        cfg.memory_mib = 1;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        match &mut cfg.boot {
            Boot::Flat { load_addr, .. } => *load_addr = (1 << 20) - 0x1000,
            Boot::Linux { .. } => unreachable!(),
        }
        let err = load_guest(&cfg, &mem, false, false).err().unwrap();
        assert!(
            matches!(err, VmError::ImageTooBig { len: 0x2000, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("does not fit"), "{err}");
        match &mut cfg.boot {
            Boot::Flat { load_addr, .. } => *load_addr = u64::MAX,
            Boot::Linux { .. } => unreachable!(),
        }
        assert!(matches!(
            load_guest(&cfg, &mem, false, false),
            Err(VmError::ImageTooBig { .. })
        ));
    }

    #[test]
    fn a_bus_overlap_is_a_vm_error() {
        let mut pio = PioBus::builder();
        let dev = shared(i8042::I8042);
        pio.insert(0x60, 8, dev.clone()).unwrap();
        let err = VmError::from(pio.insert(0x64, 1, dev).err().unwrap());
        assert!(
            err.to_string().starts_with("device bus: port range 0x64"),
            "{err}"
        );
    }
}
