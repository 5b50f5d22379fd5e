//! Running a built VM: start the vCPU threads (and `--vpmu-schedule`'s and compare's controller
//! threads), confine the calling thread, wait for the end, join the vCPUs and collect the
//! [`RunReport`].

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::builder::BuiltVm;
use super::{RunReport, VmConfig, VmError, VmHandles};
use crate::devices::lock_device;
use crate::devices::virtio::blk::DiskReport;
use crate::devices::virtio::net::NetReport;
use crate::end::VmEnd;
use crate::exit::ExitCounts;
use crate::merge::Merge;
use crate::pmu::PmuStats;
use crate::seccomp::{self, ThreadKind};
use crate::trace::recorder::Recording;
use crate::vcpu::VcpuRunner;

/// Runs `vm` to its end; `setup_time` is how long building it took.
pub(super) fn run(
    cfg: &VmConfig,
    mut vm: BuiltVm,
    seccomp: seccomp::Scope,
    setup_time: Duration,
) -> Result<RunReport, VmError> {
    let t1 = Instant::now();
    let handles = spawn_vcpus(std::mem::take(&mut vm.runners))?;
    if let (Some(schedule), Some(m)) = (cfg.vpmu_schedule.clone(), &vm.mode_switch) {
        let (kick, stop) = (vm.control.clone(), vm.control.clone());
        schedule.spawn(m.clone(), move || kick.kick_all(), move || stop.stopping());
    }
    spawn_controller(cfg, &vm)?;
    seccomp.confine_caller();
    // A guest kernel that halted for good (console.rs) never runs again: end the run there.
    let console = vm.devices.console.clone();
    let end = vm.control.wait_watching(cfg.timeout, || {
        lock_device(&console).halted().then(|| {
            log::info!(
                "the guest kernel halted the machine (\"reboot: System halted\"; a kernel without \
                 an ACPI \\_S5, e.g. one built without CONFIG_PCI, halts on poweroff): ended as a power-off"
            );
            VmEnd::PowerOff
        })
    });
    let (exits, pmu) = join_vcpus(handles);
    let run_time = t1.elapsed();
    if let Some(rec) = vm.recording.take() {
        finish_recording(rec)?;
    }
    Ok(report(cfg, vm, end, exits, pmu, setup_time, run_time))
}

/// One thread per vCPU, confined first thing, running [`VcpuRunner::run_catching_panics`].
fn spawn_vcpus(
    runners: Vec<VcpuRunner>,
) -> Result<Vec<JoinHandle<(ExitCounts, PmuStats)>>, VmError> {
    let mut handles = Vec::new();
    for r in runners {
        let name = format!("vcpu{}", r.id);
        let confine = seccomp::for_new_thread(ThreadKind::Vcpu);
        let handle = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                confine.apply();
                r.run_catching_panics()
            })
            .map_err(|source| VmError::SpawnThread { name, source })?;
        handles.push(handle);
    }
    Ok(handles)
}

/// `compare`'s experiment: its controller thread, given the run's handles.
fn spawn_controller(cfg: &VmConfig, vm: &BuiltVm) -> Result<(), VmError> {
    let Some(c) = cfg.controller.clone() else {
        return Ok(());
    };
    let handles = VmHandles {
        mode: vm.mode_switch.clone(),
        control: vm.control.clone(),
        net_up: vm.devices.net_up.clone(),
        net_paused: vm.devices.net_paused.clone(),
        console: vm.devices.console.clone(),
    };
    let confine = seccomp::for_new_thread(ThreadKind::Controller);
    let name = "vm-controller".to_string();
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            confine.apply();
            (c.0)(handles)
        })
        .map_err(|source| VmError::SpawnThread { name, source })?;
    Ok(())
}

/// Each vCPU's exit counts, and the vPMU statistics summed (a thread that panicked counts as
/// zero: its panic is already the run's end).
fn join_vcpus(handles: Vec<JoinHandle<(ExitCounts, PmuStats)>>) -> (Vec<ExitCounts>, PmuStats) {
    let mut exits = Vec::new();
    let mut pmu = PmuStats::default();
    for h in handles {
        let (counts, stats) = h.join().unwrap_or_default();
        exits.push(counts);
        pmu.merge(&stats);
    }
    (exits, pmu)
}

/// Waits for the trace/profile writers and logs what each wrote.
fn finish_recording(rec: Recording) -> Result<(), VmError> {
    for (path, st) in rec.finish()? {
        let dropped = if st.dropped > 0 {
            format!(", {} RECORDS DROPPED (the writer fell behind)", st.dropped)
        } else {
            String::new()
        };
        log::info!(
            "trace {}: {} records in {} blocks, {} bytes{dropped}",
            path.display(),
            st.records,
            st.blocks,
            st.bytes,
        );
    }
    Ok(())
}

/// What the guest's console says that explains a failure the user would otherwise see only as
/// its consequence.
fn guest_hints(cfg: &VmConfig, log: &crate::console::ConsoleLog) -> Vec<String> {
    let mut hints = Vec::new();
    if log.no_dsdt() && (!cfg.disks.is_empty() || cfg.net.is_some()) {
        hints.push(
            "the guest kernel could not load the ACPI DSDT (\"ACPI: Unable to load the System \
             Description Tables\"), where this VMM describes its virtio-mmio disks and network \
             card, so the guest has none of them (a root disk cannot be mounted). A Linux kernel \
             built without CONFIG_PCI always fails so: build it with CONFIG_PCI=y (the VMM's \
             pci=off is fine), or boot it with --initrd"
                .to_string(),
        );
    }
    hints
}

fn report(
    cfg: &VmConfig,
    vm: BuiltVm,
    mut end: VmEnd,
    exits: Vec<ExitCounts>,
    pmu: PmuStats,
    setup_time: Duration,
    run_time: Duration,
) -> RunReport {
    // (A vCPU thread that panicked may have poisoned these locks: the data is still whole.)
    let log = lock_device(&vm.devices.console);
    if let (Some(line), VmEnd::Reboot | VmEnd::PowerOff) = (log.panic_line(), &end) {
        end = VmEnd::GuestPanic(line.to_string());
    }
    let net = vm
        .devices
        .net_card
        .as_ref()
        .map(|c| NetReport::from_card(&lock_device(c)));
    let syscall_relay = vm.relay.as_ref().and_then(|r| {
        let (n, cycles) = r.syscall_cost();
        let khz = vm.tsc_khz?;
        (n > 0).then(|| (n, cycles as f64 * 1000.0 / khz as f64 / n as f64))
    });
    let disks = vm
        .devices
        .disks
        .iter()
        .map(|(path, d)| DiskReport::from_device(path.clone(), &lock_device(d)))
        .collect();
    RunReport {
        host: vm.host.clone(),
        end,
        net,
        disks,
        exits,
        pmu,
        vpmu: cfg.vpmu,
        pmu_event_filter: cfg.pmu_event_filter.clone().filter(|_| vm.vpmu_on),
        mode_history: vm
            .mode_switch
            .as_ref()
            .map(|m| m.history())
            .unwrap_or_default(),
        mode_switches_unlogged: vm.mode_switch.as_ref().map_or(0, |m| m.unlogged()),
        fixups: vm.fixups.snapshot(),
        syscall_relay,
        console_tail: log.tail(15),
        hints: guest_hints(cfg, &log),
        vcpu_states: vm.control.vcpu_states(),
        cmdline: vm.cmdline.clone(),
        guest_log: vpmu::guest_log::totals(),
        setup_time,
        run_time,
    }
}
