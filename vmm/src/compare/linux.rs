//! The stock-Linux packet-receive comparison: the published CPU-switch vs domain-switch
//! experiment, with no guest user space (it cannot run on every host). One boot of the guest
//! kernel with the virtio-net card (`--net`). Once the kernel has started init (its boot work is
//! over) and answered its first echo request, a controller runs the four phases — packets in
//! cpu-switch and in domain-switch, then the CPU-bound control (pinger paused: the guest's
//! spinning init and its timer ticks) in cpu-switch and in domain-switch — **interleaved**:
//! `rounds` rounds of four slices, the order of the two modes swapped every other round, so a
//! slow drift in what the guest does (timers, the random driver's reseeding) falls on both
//! modes alike. Then it stops the VM. The VMM samples the guest RIP with a cycles counter that
//! follows the accounting mode (`--host-profile`, clock auto); each sample is filed under the
//! slice its TSC falls in (if its mode tag agrees) and resolved with the kernel's own kallsyms;
//! a user-space sample whose guest task the VMM read (a kernel with a `task-layout`) is filed
//! under its process, `[guest user space, CPL 3] comm[tgid]`.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vpmu::AccountingMode;

use super::table::{Comparison, Profile};
use super::CompareError;
use analysis::profile::stacks::{self, Frames};
use analysis::profile::symbols::SymbolTable;
use analysis::profile::symbols::{bucket, USER_BUCKET_NAMED};
use analysis::trace::format::{FormatError, Record};
use analysis::trace::read::{for_each_sample, Records, TraceFile};
use runtime::end::VmEnd;
use runtime::net::NetConfig;
use runtime::pmu::ModelChoice;
use runtime::trace::{ProfileClock, ProfileConfig};
use runtime::vm::{self, Boot, Controller, RunReport, VmConfig, VmHandles, VpmuSetting};
use std::collections::HashMap;

/// Name prefixes of the guest's virtio-net receive/transmit/interrupt path (driver, virtqueue
/// and virtio-mmio transport).
pub const VIRTIO_NET_PREFIXES: &[&str] = &[
    "virtnet_",
    "virtqueue_",
    "vring_",
    "detach_buf",
    "vm_interrupt",
    "vm_notify",
    "receive_buf",
    "start_xmit",
    "skb_recv_done",
    "skb_xmit_done",
    "free_old_xmit_skbs",
    "try_fill_recv",
    "page_to_skb",
    "virtio_net_hdr_to_skb",
];

/// The functions of that path that access the card's registers, i.e. make the VM exits whose
/// device-model work domain-switch charges: the interrupt handler (reads and acknowledges the
/// interrupt status) and the queue notification (the transmit and receive-refill kicks). In the
/// published e1000 table these are the interrupt, rx-poll and transmit functions.
pub const DEVICE_ACCESS_FUNCTIONS: &[&str] = &["vm_interrupt", "vm_notify"];

/// The row that sums the virtio-net path in the packet-receive table.
pub const VIRTIO_NET_TOTAL: &str = "[virtio-net rx/tx/irq path: total]";

/// The row that sums the virtio path (either device, the ring, the interrupt) in a command's
/// table: where a disk or network workload's device work shows.
pub const VIRTIO_TOTAL: &str = "[virtio blk/net/ring/irq path: total]";

/// Guest kernel functions of the virtio-blk driver's request path (drivers/block/virtio_blk.c).
pub const VIRTIO_BLK_PREFIXES: &[&str] = &["virtblk_", "virtio_queue_rq", "virtio_commit_rqs"];

/// A function of either virtio device's path, their rings or the virtio-mmio transport.
pub fn is_virtio(name: &str) -> bool {
    is_virtio_net(name) || VIRTIO_BLK_PREFIXES.iter().any(|p| name.starts_with(p))
}

pub fn is_virtio_net(name: &str) -> bool {
    VIRTIO_NET_PREFIXES.iter().any(|p| name.starts_with(p))
}

pub struct Settings {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub out: PathBuf,
    /// Total length of each of the four phases (packets/control x cpu/domain).
    pub phase: Duration,
    /// Each phase is run as this many slices, interleaved with the others.
    pub rounds: u32,
    /// Echo requests per second during the packet phases.
    pub pps: u32,
    /// Host-profile samples per second of the sampled clock.
    pub hz: u32,
    /// Device-model work per card register access (µs).
    pub access_cost_us: u32,
    /// Give up if the guest's network is not up after this long.
    pub boot_timeout: Duration,
    pub pmu_model: ModelChoice,
}

pub struct LinuxComparison {
    pub packets: Comparison,
    pub control: Comparison,
    /// The packet phases' folded stacks (cpu-switch, domain-switch): `process;symbol[;[vmm]
    /// exit] count` lines, as `report --format folded` writes them.
    pub packets_folded: [String; 2],
    pub run: RunReport,
    /// The guest kernel's console.
    pub console: PathBuf,
}

/// What the guest is given during a slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Packets,
    Control,
}

/// One slice of one phase, as the controller ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    pub workload: Workload,
    pub mode: AccountingMode,
    /// TSC when the slice began (after the mode switch was requested).
    pub start_tsc: u64,
}

/// The slices in the order they run: per round packets then control, each in both modes, the
/// modes' order swapped in odd rounds.
pub fn plan(rounds: u32) -> Vec<(Workload, AccountingMode)> {
    let (c, d) = (AccountingMode::CpuSwitch, AccountingMode::DomainSwitch);
    let mut v = Vec::new();
    for r in 0..rounds {
        let (m1, m2) = if r % 2 == 0 { (c, d) } else { (d, c) };
        for w in [Workload::Packets, Workload::Control] {
            v.push((w, m1));
            v.push((w, m2));
        }
    }
    v
}

/// Boots the guest once and runs the interleaved phases.
pub fn run(s: &Settings) -> Result<LinuxComparison, CompareError> {
    let profile = s.out.join("packet-rx.profile");
    let console = s.out.join("packet-rx-console.log");
    let mut cfg = VmConfig::new(Boot::Linux {
        kernel: s.kernel.clone(),
        initrd: Some(s.initrd.clone()),
        cmdline: String::new(),
    });
    cfg.vpmu = VpmuSetting::DomainSwitch;
    cfg.pmu_model = s.pmu_model;
    cfg.net = Some(NetConfig {
        rx_pps: s.pps,
        access_cost_us: s.access_cost_us,
        // This controller gates the packets itself, between its phases.
        guest_gate: false,
    });
    cfg.console_out = Some(console.clone());
    cfg.timeout = Some(s.boot_timeout + 4 * s.phase + Duration::from_secs(60));
    cfg.record.profile = Some(ProfileConfig {
        path: profile.clone(),
        hz: s.hz,
        clock: ProfileClock::Auto,
        task_layout: None,
    });
    let slices: Arc<Mutex<Vec<Slice>>> = Arc::default();
    let end_tsc = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
    let slice_len = s.phase / s.rounds.max(1);
    let (rounds, boot_timeout) = (s.rounds.max(1), s.boot_timeout);
    let (sl, et) = (slices.clone(), end_tsc.clone());
    cfg.controller = Some(Controller(Arc::new(move |h: VmHandles| {
        drive(&h, rounds, slice_len, boot_timeout, &sl, &et)
    })));
    let report = vm::run(&cfg)?;
    if !matches!(report.end, VmEnd::Stopped(_)) {
        return Err(CompareError::guest_end(
            &report,
            &format!(" (guest console: {})", console.display()),
        ));
    }
    let slices = slices.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if slices.len() != plan(rounds).len() {
        return Err(CompareError::GuestReport(format!(
            "the controller ran {} of {} slices",
            slices.len(),
            plan(rounds).len()
        )));
    }
    let trace = TraceFile::open(&profile).map_err(|e| CompareError::GuestReport(e.to_string()))?;
    let syms = SymbolTable::from_kernel(&s.kernel)
        .map_err(|e| CompareError::GuestReport(format!("guest kernel symbols: {e}")))?;
    let ([pc, pd, cc, cd], [fc, fd, _, _]) =
        split(&trace, &syms, &slices, end_tsc.load(Ordering::Relaxed))
            .map_err(|e| CompareError::GuestReport(format!("{}: {e}", profile.display())))?;
    Ok(LinuxComparison {
        packets: with_total(Comparison::new("packet-rx", &pc, &pd), &pc, &pd),
        control: Comparison::new("packet-rx-control", &cc, &cd),
        packets_folded: [stacks::folded(&fc), stacks::folded(&fd)],
        run: report,
        console,
    })
}

/// The controller: wait for init and the network, then the slices, then stop.
fn drive(
    h: &VmHandles,
    rounds: u32,
    slice: Duration,
    boot_timeout: Duration,
    slices: &Mutex<Vec<Slice>>,
    end_tsc: &std::sync::atomic::AtomicU64,
) {
    let started = std::time::Instant::now();
    let late = || started.elapsed() > boot_timeout;
    eprintln!("[compare] waiting for the guest kernel to finish booting (\"Run /init\") and answer an echo request...");
    if !(h.wait_for_init(late) && h.net_up.wait(|| h.control.stopping() || late())) {
        if !h.control.stopping() {
            h.control.request_end(VmEnd::Stopped(format!(
                "the guest did not start init and answer an echo request within {:.0} s",
                boot_timeout.as_secs_f64()
            )));
        }
        return;
    }
    let plan = plan(rounds);
    eprintln!(
        "[compare] guest up at {:.0} s: {} slices of {:.1} s ({rounds} rounds of packets and control, each in both modes)",
        started.elapsed().as_secs_f64(),
        plan.len(),
        slice.as_secs_f64()
    );
    for (i, (workload, mode)) in plan.into_iter().enumerate() {
        h.net_paused
            .store(workload == Workload::Control, Ordering::Relaxed);
        h.set_mode(mode, "compare");
        slices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Slice {
                workload,
                mode,
                start_tsc: runtime::tsc::now(),
            });
        if i % 4 == 0 {
            eprintln!(
                "[compare] round {}/{rounds} (at {:.0} s)",
                i / 4 + 1,
                started.elapsed().as_secs_f64()
            );
        }
        if !h.sleep(slice) {
            return;
        }
    }
    end_tsc.store(runtime::tsc::now(), Ordering::Relaxed);
    h.control
        .request_end(VmEnd::Stopped("compare: all slices done".into()));
}

/// Samples per symbol in the four phases [packets cpu, packets domain, control cpu, control
/// domain], and per stack (process, symbol, the VMM's exit if the sample came in one): each
/// sample goes to the slice its TSC falls in, and counts only if its mode tag agrees with the
/// slice's mode.
/// Per phase: samples per symbol, and per stack.
type Phases = ([Profile; 4], [HashMap<Frames, u64>; 4]);

fn split(
    t: &dyn Records,
    syms: &SymbolTable,
    slices: &[Slice],
    end_tsc: u64,
) -> Result<Phases, FormatError> {
    let mut out: [Profile; 4] = Default::default();
    let mut frames: [HashMap<Frames, u64>; 4] = Default::default();
    let phase = |s: &Slice| {
        let w = if s.workload == Workload::Packets {
            0
        } else {
            2
        };
        w + s.mode.index()
    };
    for_each_sample(t, &mut |_, r, notes| {
        let Record::Sample {
            rip,
            cpl,
            tsc,
            mode,
            during,
        } = *r
        else {
            return;
        };
        if tsc >= end_tsc {
            return;
        }
        // The last slice that began at or before the sample.
        let i = slices.partition_point(|s| s.start_tsc <= tsc);
        let Some(s) = i.checked_sub(1).map(|i| &slices[i]) else {
            return;
        };
        if mode != Some(s.mode) {
            return;
        }
        // A user-space sample whose guest task was read is filed under its process.
        let task = notes.task.as_ref();
        let name = match task {
            Some(Ok(t)) if cpl == 3 => format!("{USER_BUCKET_NAMED} {}", t.label()),
            _ => bucket(rip, cpl, Some(syms)),
        };
        let f = Frames {
            process: stacks::process_label(task),
            object: String::new(),
            symbol: if cpl == 3 {
                USER_BUCKET_NAMED.to_string()
            } else {
                name.clone()
            },
            callers: if cpl == 3 {
                Vec::new()
            } else {
                stacks::kernel_callers(&notes.frames, Some(syms))
            },
            kernel: cpl != 3,
            vmm: during.map(|(e, _)| format!("[vmm] {}", e.describe())),
        };
        *frames[phase(s)].entry(f).or_default() += 1;
        *out[phase(s)].samples.entry(name).or_default() += 1;
    })?;
    Ok((out, frames))
}

/// Adds the virtio-net path total as a row of its own.
fn with_total(c: Comparison, cpu: &Profile, dom: &Profile) -> Comparison {
    with_path_total(c, cpu, dom, VIRTIO_NET_TOTAL, is_virtio_net)
}

/// Adds a row `name` summing the functions `member` picks (a device's path), kind `total`.
pub fn with_path_total(
    mut c: Comparison,
    cpu: &Profile,
    dom: &Profile,
    name: &str,
    member: fn(&str) -> bool,
) -> Comparison {
    let sum = |p: &Profile| -> u64 {
        p.samples
            .iter()
            .filter(|(k, _)| member(k))
            .map(|(_, v)| v)
            .sum()
    };
    let pct = |n: u64, p: &Profile| {
        if p.total() == 0 {
            0.0
        } else {
            100.0 * n as f64 / p.total() as f64
        }
    };
    let (a, b) = (sum(cpu), sum(dom));
    c.insert_total(super::table::Row {
        function: name.into(),
        cpu_samples: a,
        cpu_percent: pct(a, cpu),
        domain_samples: b,
        domain_percent: pct(b, dom),
    });
    c
}

/// Why the files a comparison boots are missing, found before the (long) boot.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error(
        "--workload packet-rx needs --kernel and --initrd (the default guest: \
         `eval \"$(guest-image/build.sh paths)\"` then --kernel \"$DEFAULT_BZIMAGE\" \
         --initrd \"$SPIN_INITRAMFS\", or --initrd \"$INITRAMFS\" with --profiler \
         perf|oprofile; scripts/demo.sh does this)"
    )]
    PacketRxGuest,
    #[error(
        "--profiler perf|oprofile needs --kernel and the guest's root: --disk (a root \
         filesystem image) or --initrd (the default initramfs); the default guest: \
         `eval \"$(guest-image/build.sh paths)\"` then --kernel \"$DEFAULT_BZIMAGE\" \
         --disk \"$ROOTFS\""
    )]
    ProfilerGuest,
    #[error("{}: no such file", .0.display())]
    NoSuchFile(PathBuf),
}

/// Each of `paths` an existing file.
fn files_exist(paths: [&Path; 2]) -> Result<(), InputError> {
    match paths.into_iter().find(|p| !p.is_file()) {
        Some(p) => Err(InputError::NoSuchFile(p.to_path_buf())),
        None => Ok(()),
    }
}

/// The kernel and initramfs a packet-rx run needs, checked before the (long) boot.
pub fn check_inputs(
    kernel: Option<&Path>,
    initrd: Option<&Path>,
) -> Result<(PathBuf, PathBuf), InputError> {
    let (Some(k), Some(i)) = (kernel, initrd) else {
        return Err(InputError::PacketRxGuest);
    };
    files_exist([k, i])?;
    Ok((k.to_path_buf(), i.to_path_buf()))
}

/// `--profiler perf|oprofile`: the kernel and the guest's root, an initramfs (--initrd) or a
/// disk image (--disk), each an existing file.
pub fn check_in_guest_inputs(
    kernel: Option<&Path>,
    initrd: Option<&Path>,
    disk: Option<&Path>,
) -> Result<(PathBuf, PathBuf, bool), InputError> {
    let (Some(k), Some((root, is_disk))) = (
        kernel,
        disk.map(|d| (d, true)).or(initrd.map(|i| (i, false))),
    ) else {
        return Err(InputError::ProfilerGuest);
    };
    files_exist([k, root])?;
    Ok((k.to_path_buf(), root.to_path_buf(), is_disk))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtio_net_path_names() {
        for n in [
            "virtnet_poll",
            "vring_interrupt",
            "vm_notify",
            "start_xmit",
            "receive_buf",
        ] {
            assert!(is_virtio_net(n), "{n}");
        }
        for n in [
            "default_idle",
            "virtio_dev_probe",
            "[guest user space, CPL 3] (no process information)",
        ] {
            assert!(!is_virtio_net(n), "{n}");
        }
    }

    #[test]
    fn the_total_row_sums_the_path() {
        let cpu = Profile::from_pairs([("virtnet_poll", 2), ("vm_interrupt", 2), ("idle", 96)]);
        let dom = Profile::from_pairs([("virtnet_poll", 20), ("vm_notify", 20), ("idle", 60)]);
        let c = with_total(Comparison::new("p", &cpu, &dom), &cpu, &dom);
        let t = c.row(VIRTIO_NET_TOTAL).unwrap();
        assert_eq!((t.cpu_samples, t.domain_samples), (4, 40));
        assert!((t.ratio() - 10.0).abs() < 1e-9);
        assert_eq!(c.rows[0].function, VIRTIO_NET_TOTAL);
    }

    #[test]
    fn samples_are_filed_by_slice_and_kept_only_in_their_own_mode() {
        use analysis::trace::format::{Header, Trace, VcpuTrace, CONTENTS_SAMPLES};
        let (c, d) = (AccountingMode::CpuSwitch, AccountingMode::DomainSwitch);
        let at = |tsc, mode| Record::Sample {
            rip: 0xffff_ffff_8100_0010,
            cpl: 0,
            tsc,
            during: None,
            mode: Some(mode),
        };
        let t = Trace {
            header: Header::for_tests(CONTENTS_SAMPLES),
            vcpus: vec![VcpuTrace {
                records: vec![
                    at(50, d),  // boot, before the first slice: not filed
                    at(150, c), // packets, cpu-switch
                    at(160, c),
                    at(210, c), // domain-switch slice, still counted in cpu-switch (the vCPU
                    //             had not applied the switch yet): dropped
                    at(220, d), // packets, domain-switch
                    at(310, c), // control, cpu-switch
                    at(420, d), // control, domain-switch
                    at(999, d), // after the end: not filed
                ],
                dropped: 0,
                end_tsc: 1000,
                end_thread_cpu_ns: 0,
            }],
        };
        let slice = |workload, mode, start_tsc| Slice {
            workload,
            mode,
            start_tsc,
        };
        let slices = [
            slice(Workload::Packets, c, 100),
            slice(Workload::Packets, d, 200),
            slice(Workload::Control, c, 300),
            slice(Workload::Control, d, 400),
        ];
        let syms = SymbolTable::parse_system_map("ffffffff81000000 T f\n", "m").unwrap();
        let (p, stacks) = split(&t, &syms, &slices, 500).unwrap();
        let totals: Vec<u64> = p.iter().map(Profile::total).collect();
        assert_eq!(totals, [2, 1, 1, 1]);
        assert_eq!(p[0].samples.get("f"), Some(&2));
        // The same samples as stacks: each phase's stack counts add up to its total.
        let stack_totals: Vec<u64> = stacks.iter().map(|m| m.values().sum()).collect();
        assert_eq!(stack_totals, [2, 1, 1, 1]);
    }

    #[test]
    fn the_plan_interleaves_and_balances_the_modes() {
        let p = plan(2);
        assert_eq!(p.len(), 8);
        let (c, d) = (AccountingMode::CpuSwitch, AccountingMode::DomainSwitch);
        assert_eq!(
            p[..4],
            [
                (Workload::Packets, c),
                (Workload::Packets, d),
                (Workload::Control, c),
                (Workload::Control, d)
            ]
        );
        assert_eq!(p[4], (Workload::Packets, d));
        assert_eq!(p[5], (Workload::Packets, c));
        for w in [Workload::Packets, Workload::Control] {
            for m in [c, d] {
                assert_eq!(p.iter().filter(|x| **x == (w, m)).count(), 2);
            }
        }
    }

    #[test]
    fn missing_inputs_are_explained() {
        let e = check_inputs(None, None).unwrap_err().to_string();
        assert!(e.contains("--kernel"), "{e}");
        let e = check_inputs(
            Some(Path::new("/nonexistent")),
            Some(Path::new("/nonexistent")),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no such file"), "{e}");
    }
}
