//! Building a VM (memory, in-kernel irqchip and PIT, devices, vCPUs), running it until it ends,
//! and what the run reports ([`run`], [`RunReport`]). What a run is given is in [`config`]; the
//! control surface its threads share is [`crate::control`] (re-exported here).

pub mod config;

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_bindings::{
    kvm_pit_config, kvm_userspace_memory_region, CpuId, KVM_MAX_CPUID_ENTRIES,
    KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::Kvm;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::eventfd::EventFd;

use crate::boot::{self, layout};
use crate::console::{ConsoleLog, Tee};
use crate::devices::virtio::mmio::{MmioTransport, MMIO_LEN};
use crate::devices::virtio::net::VirtioNet;
use crate::devices::{
    acpi_shutdown::AcpiShutdown, delay, i8042, lock_device, packet_gate, serial, vpmu_control,
    BusError, MmioBus, PioBus, PioDevice,
};
use crate::end::VmEnd;
use crate::exit::ExitCounts;
use crate::host_quirks::{self, FixupCounts};
use crate::net::{self, pinger::Pinger, NetReport};
use crate::pmu::{
    self, backend::PerfBackend, perf::HostPerf, BackendChoice, ModelChoice, PmuStats, VcpuPmu,
};
use crate::seccomp::{self, ThreadKind};
use crate::vcpu::{cpuid, identity, kick, regs, ticker::Ticker, VcpuRunner};

pub use crate::control::{Controller, Latch, VmControl, VmHandles};
pub use crate::pmu::{RdpmcSetting, VpmuSetting};
pub use config::{Boot, VmConfig, DEFAULT_CMDLINE, MAX_MEMORY_MIB, MAX_VCPUS, MIN_MEMORY_MIB};

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("cannot open /dev/kvm: {0} (is KVM available and are you allowed to use it?)")]
    OpenKvm(kvm_ioctls::Error),
    #[error("{what}: {source}")]
    Kvm {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("guest memory: {0}")]
    Memory(String),
    #[error(transparent)]
    Kernel(#[from] boot::kernel::KernelError),
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
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Record(#[from] crate::trace::recorder::RecordError),
    #[error("device bus: {0}")]
    Bus(#[from] BusError),
    #[error(transparent)]
    Seccomp(#[from] crate::seccomp::SeccompError),
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

/// What a run produced.
pub struct RunReport {
    pub end: VmEnd,
    pub exits: Vec<ExitCounts>,
    /// Summed over vCPUs; all zero with `--vpmu=off`.
    pub pmu: PmuStats,
    pub vpmu: VpmuSetting,
    /// The vPMU's `--pmu-event-filter` (None without one, or with the vPMU off).
    pub pmu_event_filter: Option<vpmu::EventFilter>,
    /// The accounting modes the run went through (initial mode first), with times.
    pub mode_history: Vec<pmu::mode::Switch>,
    pub fixups: Vec<(&'static str, u64)>,
    /// The SYSCALL relay (host quirks): system calls completed, and the VMM's mean time per
    /// system call in microseconds (exit to registers written).
    pub syscall_relay: Option<(u64, f64)>,
    pub console_tail: Vec<String>,
    /// Each vCPU's RIP and last exits as its thread ended (printed on a bad end).
    pub vcpu_states: Vec<crate::vcpu::last_exits::VcpuEndState>,
    pub cmdline: Option<String>,
    /// With `--net`: what the network card and the pinger counted.
    pub net: Option<NetReport>,
    /// `VmConfig::started` (or the `run` call) to the moment the vCPUs may enter KVM_RUN.
    pub setup_time: Duration,
    pub run_time: Duration,
}

/// Builds the VM described by `cfg`, runs it to the end and reports.
pub fn run(cfg: &VmConfig) -> Result<RunReport, VmError> {
    let t0 = cfg.started.unwrap_or_else(Instant::now);
    // Threads started from here on confine themselves (docs/security.md).
    let seccomp = seccomp::Scope::enter(cfg.seccomp)?;
    let quirks = host_quirks::detect(cfg.host_quirks);
    if let Some(why) = quirks {
        log::info!("host quirks on: {why}");
    }

    let hv = Kvm::new().map_err(VmError::OpenKvm)?;
    let vm = Arc::new(hv.create_vm().map_err(kvm("KVM_CREATE_VM"))?);
    vm.set_tss_address(layout::KVM_TSS_ADDR as usize)
        .map_err(kvm("KVM_SET_TSS_ADDR"))?;
    vm.create_irq_chip().map_err(kvm("KVM_CREATE_IRQCHIP"))?;
    vm.create_pit2(kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    })
    .map_err(kvm("KVM_CREATE_PIT2"))?;

    let mem_size = cfg.memory_mib << 20;
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), mem_size as usize)])
        .map_err(|e| VmError::Memory(e.to_string()))?;
    for (slot, region) in mem.iter().enumerate() {
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().raw_value(),
            memory_size: region.len(),
            userspace_addr: mem.get_host_address(region.start_addr()).unwrap() as u64,
            flags: 0,
        };
        // SAFETY: the region is a live mmap owned by `mem`, which outlives the VM (both are
        // dropped at the end of this function, the vCPU threads having been joined).
        unsafe { vm.set_user_memory_region(r) }.map_err(kvm("KVM_SET_USER_MEMORY_REGION"))?;
    }

    let (entry, cmdline, guest_code) = match &cfg.boot {
        Boot::Linux {
            kernel,
            initrd,
            cmdline,
        } => {
            let virtio: Vec<_> = cfg
                .net
                .iter()
                .map(|_| boot::acpi::VirtioMmioAcpi {
                    base: layout::VIRTIO_NET_MMIO_BASE as u32,
                    len: MMIO_LEN as u32,
                    gsi: net::NET_GSI,
                })
                .collect();
            let rsdp = boot::acpi::create_acpi_tables_with(
                &mem,
                cfg.vcpus as u8,
                layout::IOAPIC_ADDR,
                layout::LAPIC_ADDR,
                &virtio,
            )?;
            let mut full = DEFAULT_CMDLINE.to_string();
            if quirks.is_some() {
                full.push(' ');
                full.push_str(host_quirks::KERNEL_OPTIONS);
            }
            if cfg.net.is_some() {
                full.push(' ');
                full.push_str(&net::kernel_cmdline());
            }
            if !cmdline.trim().is_empty() {
                full.push(' ');
                full.push_str(cmdline.trim());
            }
            let loaded = boot::kernel::load(&mem, kernel, initrd.as_deref(), &full, Some(rsdp))?;
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
            (
                loaded.entry.raw_value(),
                Some(full),
                pmu::setup::GuestCode::Elf(loaded.elf),
            )
        }
        Boot::Flat {
            image,
            load_addr,
            entry,
            ..
        } => {
            let end = load_addr
                .checked_add(image.len() as u64)
                .filter(|&e| e <= mem_size);
            if end.is_none() {
                return Err(VmError::Memory(format!(
                    "image of {} bytes does not fit at {load_addr:#x}",
                    image.len()
                )));
            }
            mem.write_slice(image, GuestAddress(*load_addr))
                .map_err(|e| VmError::Memory(e.to_string()))?;
            (
                *entry,
                None,
                pmu::setup::GuestCode::Flat {
                    image,
                    base: *load_addr,
                },
            )
        }
    };

    // The accounting mode (switchable at run time: `--vpmu-schedule`, the vPMU control port).
    let control = Arc::new(VmControl::new(cfg.panic_vcpu_at_exit));
    let mode_switch = match cfg.vpmu {
        VpmuSetting::Off => None,
        on => {
            let initial = match &cfg.vpmu_schedule {
                Some(s) => s.first(),
                None if on == VpmuSetting::CpuSwitch => vpmu::AccountingMode::CpuSwitch,
                None => vpmu::AccountingMode::DomainSwitch,
            };
            Some(Arc::new(pmu::mode::ModeSwitch::new(initial)))
        }
    };

    // Devices.
    let console_log = Arc::new(Mutex::new(ConsoleLog::default()));
    let console_out: Box<dyn std::io::Write + Send> = match &cfg.console_out {
        Some(p) => Box::new(File::create(p).map_err(|source| VmError::Output {
            path: p.clone(),
            source,
        })?),
        None => Box::new(std::io::stdout()),
    };
    let com2_out: Box<dyn std::io::Write + Send> = match &cfg.serial2 {
        Some(p) => Box::new(File::create(p).map_err(|source| VmError::Output {
            path: p.clone(),
            source,
        })?),
        None => Box::new(std::io::sink()),
    };
    let irq = |gsi: u32| -> Result<EventFd, VmError> {
        let evt = EventFd::new(libc::EFD_NONBLOCK)
            .map_err(|e| VmError::Memory(format!("eventfd: {e}")))?;
        vm.register_irqfd(&evt, gsi).map_err(kvm("KVM_IRQFD"))?;
        Ok(evt)
    };
    let com1 = Arc::new(Mutex::new(serial::Uart::new(
        irq(serial::COM1_GSI)?,
        Tee::new(console_out, console_log.clone()),
    )));
    let com2: Arc<Mutex<dyn PioDevice>> = Arc::new(Mutex::new(serial::Uart::new(
        irq(serial::COM2_GSI)?,
        com2_out,
    )));
    let net_up = Arc::new(Latch::default());
    // Closed from the start when the guest gates the packets (the packet gate port below).
    let gated = cfg.net.is_some_and(|n| n.guest_gate && n.rx_pps > 0);
    let net_paused = Arc::new(AtomicBool::new(gated));
    let mut pio = PioBus::builder();
    pio.insert(serial::COM1_BASE, serial::UART_LEN, com1.clone())?
        .insert(serial::COM2_BASE, serial::UART_LEN, com2)?
        .insert(
            i8042::I8042_BASE,
            i8042::I8042_LEN,
            Arc::new(Mutex::new(i8042::I8042)),
        )?
        .insert(
            boot::acpi::SHUTDOWN_PORT,
            2,
            Arc::new(Mutex::new(AcpiShutdown)),
        )?;
    if let Some(m) = &mode_switch {
        let c = control.clone();
        pio.insert(
            vpmu_control::VPMU_CONTROL_PORT,
            1,
            Arc::new(Mutex::new(vpmu_control::VpmuControl::new(
                m.clone(),
                Box::new(move || c.kick_all()),
            ))),
        )?;
    }
    if cfg.io_delay_us > 0 {
        let each = Duration::from_micros(u64::from(cfg.io_delay_us));
        pio.insert(
            delay::DELAY_PORT,
            1,
            Arc::new(Mutex::new(delay::Delay::new(each))),
        )?;
    }
    if gated {
        pio.insert(
            packet_gate::PACKET_GATE_PORT,
            1,
            Arc::new(Mutex::new(packet_gate::PacketGate::new(net_paused.clone()))),
        )?;
    }
    let pio = pio.build();
    if cfg.console_in {
        serial::spawn_stdin_reader(com1);
    }
    let net_card = match cfg.net {
        None => None,
        Some(n) => {
            let pinger = (n.rx_pps > 0)
                .then(|| Pinger::new(n.rx_pps).with_handles(net_paused.clone(), net_up.clone()));
            let card = VirtioNet::new(net::pinger::GUEST_MAC, pinger);
            Some(Arc::new(Mutex::new(
                MmioTransport::new(card, mem.clone(), irq(net::NET_GSI)?)
                    .with_access_cost(Duration::from_micros(u64::from(n.access_cost_us))),
            )))
        }
    };
    let mut mmio = MmioBus::builder();
    if let Some(card) = &net_card {
        mmio.insert(layout::VIRTIO_NET_MMIO_BASE, MMIO_LEN, card.clone())?;
    }
    let mmio = mmio.build();

    // vCPUs.
    let supported = hv
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm("KVM_GET_SUPPORTED_CPUID"))?;
    // `--pmu-model intel` on a host that is not Intel: the whole CPU identity is Intel.
    let guest_cpuid = match cfg.pmu_model {
        ModelChoice::Intel if !identity::is_intel(supported.as_slice()) => {
            log::info!(
                "guest CPU identity: GenuineIntel family {} model {:#x} (\"{}\"), for --pmu-model intel",
                identity::INTEL_FAMILY,
                identity::INTEL_MODEL,
                identity::INTEL_BRAND
            );
            identity::intel(supported.as_slice())
        }
        _ => supported.as_slice().to_vec(),
    };
    let policy = cpuid::CpuidPolicy {
        hide_cx16: quirks.is_some(),
        hide_hypercall_features: quirks.is_some(),
    };
    let vpmu_plan = match cfg.vpmu {
        VpmuSetting::Off => None,
        _ => {
            let config = pmu::setup::model_config(cfg.pmu_model, supported.as_slice());
            let backend = pmu::setup::resolve_backend(cfg.pmu_backend);
            let mode = mode_switch.as_ref().map(|m| m.get()).unwrap_or_default();
            // A throwaway model gives the MSR ranges and CPUID edits (the same for every vCPU).
            let probe = vpmu::Pmu::new(config, Box::new(vpmu::fake::FakeBackend::new()))
                .map_err(|e| VmError::Unsupported(format!("vPMU configuration: {e}")))?;
            let mut ranges = probe.msr_ranges();
            ranges.sort_by_key(|r| *r.start());
            let rdpmc = match cfg.rdpmc {
                RdpmcSetting::Patch => {
                    let sites = pmu::setup::patch_rdpmc(&mem, &guest_code)?;
                    pmu::rdpmc::RdpmcSites::new(probe.rdpmc_ranges(), &sites)
                }
                RdpmcSetting::Off => pmu::rdpmc::RdpmcSites::default(),
            };
            let rdpmc_ranges = if rdpmc.is_empty() {
                Vec::new()
            } else {
                probe.rdpmc_ranges()
            };
            pmu::setup::install_msr_filter(&vm, &ranges, &rdpmc_ranges)
                .map_err(kvm("KVM_X86_SET_MSR_FILTER"))?;
            let rdpmc = Arc::new(rdpmc);
            log::info!(
                "vPMU: {:?} model, {mode:?} accounting, {backend:?} backend, PMI limit {}/s per vCPU; {} MSR ranges to user space",
                config.vendor(),
                cfg.pmi_limit,
                ranges.len()
            );
            if let Some(f) = &cfg.pmu_event_filter {
                log::info!("vPMU event filter: {f}");
            }
            Some((config, backend, mode, probe.cpuid_edits(), rdpmc))
        }
    };
    if vpmu_plan.is_none() && !cfg.const_msrs.is_empty() {
        let ranges: Vec<_> = cfg.const_msrs.iter().map(|&m| m..=m).collect();
        pmu::setup::install_msr_filter(&vm, &ranges, &[]).map_err(kvm("KVM_X86_SET_MSR_FILTER"))?;
    }
    let pmu_edits = match &vpmu_plan {
        Some((_, _, _, edits, _)) => edits.clone(),
        None => vpmu::cpuid::hide_pmu(),
    };
    kick::install_handler().map_err(|e| VmError::Kvm {
        what: "installing the vCPU kick signal handler",
        source: e,
    })?;
    let fixups = Arc::new(FixupCounts::default());
    // Guest user space where the host leaves SYSCALL half done (host quirks only).
    let relay = quirks.map(|_| host_quirks::syscall_relay::SyscallRelay::new(fixups.clone()));
    let mut runners = Vec::new();
    for id in 0..cfg.vcpus {
        let fd = vm
            .create_vcpu(u64::from(id))
            .map_err(kvm("KVM_CREATE_VCPU"))?;
        let mut table = cpuid::for_vcpu(&guest_cpuid, id, cfg.vcpus, policy);
        pmu::setup::apply_cpuid(&mut table, &pmu_edits);
        let vcpu_pmu = match &vpmu_plan {
            None => None,
            Some((config, backend, mode, _, rdpmc)) => {
                let source = match backend {
                    BackendChoice::Hw => pmu::backend::Source::Hw,
                    _ => pmu::backend::Source::Soft {
                        tsc_khz: u64::from(fd.get_tsc_khz().map_err(kvm("KVM_GET_TSC_KHZ"))?),
                    },
                };
                let backend = PerfBackend::new(
                    source,
                    *mode,
                    Box::new(HostPerf {
                        signal: kick::kick_signal(),
                    }),
                );
                let mut model = vpmu::Pmu::new(*config, Box::new(backend))
                    .map_err(|e| VmError::Unsupported(format!("vPMU configuration: {e}")))?;
                model.set_event_filter(cfg.pmu_event_filter.clone());
                Some(VcpuPmu::new(
                    model,
                    cfg.pmi_limit,
                    rdpmc.clone(),
                    mode_switch.clone().expect("a vPMU has a mode"),
                ))
            }
        };
        let table = CpuId::from_entries(&table)
            .map_err(|e| VmError::Unsupported(format!("CPUID table: {e:?}")))?;
        fd.set_cpuid2(&table).map_err(kvm("KVM_SET_CPUID2"))?;
        regs::setup_common(&fd)?;
        if id == 0 {
            match &cfg.boot {
                Boot::Flat {
                    long_mode: false, ..
                } => regs::setup_real_mode(&fd, entry)?,
                _ => regs::setup_boot_vcpu(&fd, &mem, entry)?,
            }
        }
        runners.push(VcpuRunner {
            id,
            fd,
            mem: mem.clone(),
            pio: pio.clone(),
            mmio: mmio.clone(),
            // The pinger's clock runs on vCPU 0's thread: its work is charged to that vCPU.
            ticker: match (&net_card, cfg.net) {
                (Some(card), Some(n)) if id == 0 && n.rx_pps > 0 => {
                    Some(Ticker::new(card.clone(), net::tick_period(n.rx_pps)))
                }
                _ => None,
            },
            control: control.clone(),
            fixups: fixups.clone(),
            quirks_expected: quirks.is_some(),
            pmu: vcpu_pmu,
            vm: vm.clone(),
            const_msrs: !cfg.const_msrs.is_empty(),
            recorder: None,
            last_exits: Default::default(),
            relay: relay
                .clone()
                .map(host_quirks::syscall_relay::VcpuRelay::new),
        });
    }
    // For the relay's cost in microseconds (the guest's TSC runs at the host's here).
    let tsc_khz_for_report = runners
        .first()
        .and_then(|r| r.fd.get_tsc_khz().ok())
        .map(u64::from)
        .filter(|&k| k > 0);
    let mut recording = match runners.first().filter(|_| cfg.record.is_on()) {
        Some(r) => {
            let tsc_khz = r.fd.get_tsc_khz().map_err(kvm("KVM_GET_TSC_KHZ"))?;
            let kernel = match &cfg.boot {
                Boot::Linux { kernel, .. } => Some(kernel.as_path()),
                Boot::Flat { .. } => None,
            };
            crate::trace::recorder::Recording::start(
                &cfg.record,
                cfg.vcpus,
                tsc_khz,
                cfg.vpmu,
                kernel,
                mode_switch.clone(),
            )?
        }
        None => None,
    };
    if let Some(rec) = recording.as_mut() {
        for r in &mut runners {
            r.recorder = rec.take_vcpu();
        }
    }
    let setup_time = t0.elapsed();
    log::info!(
        "VM ready in {:.1} ms: {} vCPU(s), {} MiB, vPMU {:?}",
        setup_time.as_secs_f64() * 1e3,
        cfg.vcpus,
        cfg.memory_mib,
        cfg.vpmu
    );

    let t1 = Instant::now();
    let mut handles = Vec::new();
    for r in runners {
        let name = format!("vcpu{}", r.id);
        let confine = seccomp::for_new_thread(ThreadKind::Vcpu);
        handles.push(
            std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    confine.apply();
                    r.run_catching_panics()
                })
                .map_err(|e| VmError::Memory(e.to_string()))?,
        );
    }
    if let (Some(schedule), Some(m)) = (cfg.vpmu_schedule.clone(), &mode_switch) {
        let (kick, stop) = (control.clone(), control.clone());
        schedule.spawn(m.clone(), move || kick.kick_all(), move || stop.stopping());
    }
    if let Some(c) = cfg.controller.clone() {
        let handles = VmHandles {
            mode: mode_switch.clone(),
            control: control.clone(),
            net_up: net_up.clone(),
            net_paused: net_paused.clone(),
            console: console_log.clone(),
        };
        let confine = seccomp::for_new_thread(ThreadKind::Controller);
        std::thread::Builder::new()
            .name("vm-controller".into())
            .spawn(move || {
                confine.apply();
                (c.0)(handles)
            })
            .map_err(|e| VmError::Memory(e.to_string()))?;
    }
    seccomp.confine_caller();
    let mut end = control.wait(cfg.timeout);
    let mut exits: Vec<ExitCounts> = Vec::new();
    let mut pmu_stats = PmuStats::default();
    for h in handles {
        let (counts, stats) = h.join().unwrap_or_default();
        exits.push(counts);
        pmu_stats.add(&stats);
    }
    let run_time = t1.elapsed();
    if let Some(rec) = recording {
        for (path, st) in rec.finish()? {
            log::info!(
                "trace {}: {} records in {} blocks, {} bytes{}",
                path.display(),
                st.records,
                st.blocks,
                st.bytes,
                if st.dropped > 0 {
                    format!(", {} RECORDS DROPPED (the writer fell behind)", st.dropped)
                } else {
                    String::new()
                }
            );
        }
    }
    // (A vCPU thread that panicked may have poisoned these locks: the data is still whole.)
    let log = console_log.lock().unwrap_or_else(|e| e.into_inner());
    if let (Some(line), VmEnd::Reboot | VmEnd::PowerOff) = (log.panic_line(), &end) {
        end = VmEnd::GuestPanic(line.to_string());
    }
    let net = net_card.map(|c| NetReport::from_card(&lock_device(&c)));
    Ok(RunReport {
        end,
        net,
        exits,
        pmu: pmu_stats,
        vpmu: cfg.vpmu,
        pmu_event_filter: vpmu_plan.as_ref().and(cfg.pmu_event_filter.clone()),
        mode_history: mode_switch.map(|m| m.history()).unwrap_or_default(),
        fixups: fixups.snapshot(),
        syscall_relay: relay.as_ref().and_then(|r| {
            let (n, cycles) = r.syscall_cost();
            let khz = tsc_khz_for_report?;
            (n > 0).then(|| (n, cycles as f64 * 1000.0 / khz as f64 / n as f64))
        }),
        console_tail: log.tail(15),
        vcpu_states: control.vcpu_states(),
        cmdline,
        setup_time,
        run_time,
    })
}
