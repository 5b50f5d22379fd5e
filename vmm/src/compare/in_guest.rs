//! `vpmu-vmm compare --workload packet-rx --profiler perf|oprofile`: the same comparison with the
//! guest's own stock profiler instead of the VMM's host-side sampler. One boot of the default
//! kernel with the default initramfs (perf, OProfile, cpu_split) and the virtio-net card; the
//! guest's /init runs the `compare-perf` or `compare-oprofile` experiment
//! (guest-image/initramfs/experiments.sh) once per accounting mode, switching through the vPMU
//! control port: a system-wide profile while the VMM's pinger sends packets, and a profile of
//! cpu_split (the CPU-bound control). The pinger starts held; the guest opens the packet gate
//! ([`runtime::devices::packet_gate`]) for its system-wide windows only. The reports come back over
//! COM2 as result frames ([`analysis::guest_results`]) and are read with [`analysis::guest_reports`].
//!
//! Runs on VT-x/SVM hosts and on hosts whose KVM emulates guest kernel code (kvm_pvm, this
//! project's build machines), where the VMM's SYSCALL relay (`host_quirks::syscall_relay`) lets
//! guest user space run; there the guest has one vCPU and the profilers sample with a fixed
//! period (guest-image/initramfs/experiments.sh, docs/guest.md "Sizes and periods").

use std::path::PathBuf;
use std::time::Duration;

use super::table::{Comparison, Profile};
use super::CompareError;
use analysis::guest_reports::{
    failed_steps, log_tail, opreport_samples, perf_report_samples, step_log,
};
use analysis::guest_results::{decode, Decoded};
use runtime::end::VmEnd;
use runtime::net::NetConfig;
use runtime::pmu::ModelChoice;
use runtime::vm::DiskConfig;
use runtime::vm::{self, Boot, RunReport, VmConfig, VpmuSetting};

/// The guest's profiler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestProfiler {
    Perf,
    Oprofile,
}

impl GuestProfiler {
    /// The experiment /init runs (experiments.sh).
    pub fn experiment(self) -> &'static str {
        match self {
            GuestProfiler::Perf => "compare-perf",
            GuestProfiler::Oprofile => "compare-oprofile",
        }
    }

    /// Samples per symbol from one of this profiler's reports.
    pub fn parse(self, report: &str) -> Profile {
        let pairs = match self {
            GuestProfiler::Perf => perf_report_samples(report),
            GuestProfiler::Oprofile => opreport_samples(report),
        };
        let mut p = Profile::default();
        for (name, n) in pairs {
            *p.samples.entry(name).or_default() += n;
        }
        p
    }
}

/// Where the guest's root filesystem (perf, OProfile, cpu_split, /init with experiments.sh)
/// comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestRoot {
    /// The default (full) initramfs.
    Initrd(PathBuf),
    /// A root disk image (guest-image's rootfs), attached read-only as /dev/vda.
    Disk {
        path: PathBuf,
        /// `--disk-access-cost-us` as resolved for this host.
        access_cost_us: u32,
    },
}

/// What the guest profiles system-wide in each mode, beside the CPU-bound control.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Window {
    /// The VMM's echo requests through the virtio-net card for `secs` seconds (the guest opens
    /// the packet gate for its window).
    Packets {
        secs: u64,
        pps: u32,
        /// `--net-access-cost-us` as resolved for this host.
        access_cost_us: u32,
    },
    /// The user's command, run in the guest with `sh -c`; at most `max_secs` per mode.
    Command { command: String, max_secs: u64 },
}

impl Window {
    /// The experiment /init runs (experiments.sh) with this profiler.
    pub fn experiment(&self, profiler: GuestProfiler) -> &'static str {
        match (self, profiler) {
            (Window::Packets { .. }, p) => p.experiment(),
            (Window::Command { .. }, GuestProfiler::Perf) => "compare-command-perf",
            (Window::Command { .. }, GuestProfiler::Oprofile) => "compare-command-oprofile",
        }
    }

    /// The name the tables, CSV and SVG files take.
    pub fn label(&self) -> &'static str {
        match self {
            Window::Packets { .. } => "packet-rx",
            Window::Command { .. } => "command",
        }
    }

    /// Seconds the window may take in one mode.
    fn secs(&self) -> u64 {
        match self {
            Window::Packets { secs, .. } => *secs,
            Window::Command { max_secs, .. } => *max_secs,
        }
    }
}

pub struct Settings {
    pub profiler: GuestProfiler,
    pub sampling: Sampling,
    pub kernel: PathBuf,
    pub root: GuestRoot,
    /// Disks after the root (/dev/vdb, ...), for the command's data.
    pub extra_disks: Vec<DiskConfig>,
    pub out: PathBuf,
    pub window: Window,
    pub boot_timeout: Duration,
    pub pmu_model: ModelChoice,
}

pub struct GuestComparison {
    /// The system-wide profile of the window (packets or the command).
    pub window: Comparison,
    pub control: Comparison,
    pub run: RunReport,
}

/// How the guest's profiler samples, chosen by host kind: the system-wide window's period, and
/// the CPU-bound control's cpu_split rounds and period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampling {
    /// Cycles between samples in the system-wide window (`--guest-period`).
    pub period: u64,
    pub control_rounds: u32,
    pub control_period: u64,
}

/// Where the host emulates guest kernel code (kvm_pvm). The window's period is experiments.sh's
/// VPMU_PERIOD: the emulated PMI handler takes 2-3 ms, and an idle guest's emulated ticks are
/// kernel code that a shorter period samples over and over. The control: ~900 samples of
/// cpu_split's own code, ~3 min of one mode there (each sample costs the guest's profiler ~0.1 s
/// of emulated kernel work); issue 31: 1000 rounds at the window's period gave ~60 samples and a
/// 24 pp bar, which passes nearly anything.
pub const EMULATED_HOST_SAMPLING: Sampling = Sampling {
    period: 200_000_000,
    control_rounds: 4000,
    control_period: 50_000_000,
};

/// On a VT-x/SVM host, where the guest's kernel runs in hardware and a PMI costs the guest a
/// few exits: ~500 samples a second of guest or charged VMM time at 2.6 GHz, and a control of
/// ~900-1300 samples in seconds (800 rounds of ~11.7M cycles). On the nested SVM host of the
/// tests (a 1 GHz TSC, guest user code ~3.5x slower than native) the control took ~13 s a mode.
pub const VTX_SVM_HOST_SAMPLING: Sampling = Sampling {
    period: 5_000_000,
    control_rounds: 800,
    control_period: 10_000_000,
};

impl Sampling {
    /// By host kind, with the window's period as asked if it was; and why.
    pub fn for_host(
        guest_kernel_emulated: bool,
        asked_period: Option<u64>,
    ) -> (Sampling, &'static str) {
        let (base, why) = if guest_kernel_emulated {
            (
                EMULATED_HOST_SAMPLING,
                "this host emulates guest kernel code",
            )
        } else {
            (VTX_SVM_HOST_SAMPLING, "a VT-x/SVM host")
        };
        match asked_period {
            Some(period) => (Sampling { period, ..base }, "as asked"),
            None => (base, why),
        }
    }
}

/// The kernel command line for the guest's experiment.
pub fn cmdline(profiler: GuestProfiler, window: &Window, sampling: Sampling) -> String {
    let mut c = format!(
        "vpmu.experiment={} vpmu.modes=cpu-switch,domain-switch vpmu.secs={} vpmu.period={} \
         vpmu.profile_rounds={} vpmu.control_period={}",
        window.experiment(profiler),
        window.secs(),
        sampling.period,
        sampling.control_rounds,
        sampling.control_period,
    );
    if let Window::Command { command, .. } = window {
        c.push_str(" vpmu.workload=");
        c.push_str(&percent_encode(command));
    }
    c
}

/// The command as one kernel command-line word, for /init's percent_decode: every byte outside
/// `[A-Za-z0-9_./,:=+-]` becomes `%XX`.
pub fn percent_encode(command: &str) -> String {
    let mut out = String::with_capacity(command.len());
    for b in command.bytes() {
        if b.is_ascii_alphanumeric() || b"_./,:=+-".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Boots the guest once; it profiles itself in both modes and powers off.
pub fn run(s: &Settings) -> Result<GuestComparison, CompareError> {
    let serial2 = s.out.join("guest-results.bin");
    let console = s.out.join("guest-console.log");
    let (initrd, disks) = match &s.root {
        GuestRoot::Initrd(path) => (Some(path.clone()), Vec::new()),
        GuestRoot::Disk {
            path,
            access_cost_us,
        } => (
            None,
            vec![DiskConfig {
                path: path.clone(),
                readonly: true,
                access_cost_us: *access_cost_us,
            }],
        ),
    };
    let mut cfg = VmConfig::new(Boot::Linux {
        kernel: s.kernel.clone(),
        initrd,
        cmdline: cmdline(s.profiler, &s.window, s.sampling),
    });
    // With a disk and no initrd the VMM mounts the disk as the root (`root=/dev/vda ro`).
    cfg.disks = disks;
    cfg.disks.extend(s.extra_disks.iter().cloned());
    cfg.memory_mib = 1024;
    // The guest switches the mode itself before each profile (vpmu.modes).
    cfg.vpmu = VpmuSetting::CpuSwitch;
    cfg.pmu_model = s.pmu_model;
    if let Window::Packets {
        pps,
        access_cost_us,
        ..
    } = s.window
    {
        cfg.net = Some(NetConfig {
            rx_pps: pps,
            access_cost_us,
            // Only the guest knows when its system-wide window runs: it opens the gate for it.
            guest_gate: true,
        });
    }
    cfg.serial2 = Some(serial2.clone());
    cfg.console_out = Some(console.clone());
    // Two system-wide profiles plus two cpu_split runs and the reports: generous.
    cfg.timeout = Some(s.boot_timeout + Duration::from_secs(4 * s.window.secs() + 600));
    let report = vm::run(&cfg)?;
    if report.end != VmEnd::PowerOff {
        return Err(CompareError::guest_end(
            &report,
            &format!(" (guest console: {})", console.display()),
        ));
    }
    let bytes = std::fs::read(&serial2).map_err(|source| CompareError::Io {
        path: serial2.clone(),
        source,
    })?;
    let exp = s.window.experiment(s.profiler);
    let (window, control) = comparisons(s.profiler, exp, s.window.label(), &decode(&bytes))?;
    Ok(GuestComparison {
        window,
        control,
        run: report,
    })
}

/// A failed step's status line and the end of the log it wrote (sent as frame `exp/<log>`).
fn describe_failed_step(d: &Decoded, mode: &str, exp: &str, line: &str) -> String {
    let log = step_log(line).and_then(|name| d.get(mode, &format!("{exp}/{name}")));
    match log {
        Some(f) => format!(
            "  {line}\n    its log ends:\n{}",
            log_tail(&String::from_utf8_lossy(&f.payload), 15)
                .lines()
                .map(|l| format!("    | {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        ),
        None => format!("  {line}"),
    }
}

/// The window's and the control's comparisons from the guest's result frames of experiment
/// `exp`, named after `label` and the profiler.
pub fn comparisons(
    profiler: GuestProfiler,
    exp: &str,
    label: &str,
    d: &Decoded,
) -> Result<(Comparison, Comparison), CompareError> {
    if !d.problems.is_empty() {
        return Err(CompareError::GuestReport(format!(
            "damaged or missing result frames: {}",
            d.problems
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        )));
    }
    let text = |mode: &str, name: &str| -> Result<String, CompareError> {
        d.get(mode, &format!("{exp}/{name}"))
            .map(|f| String::from_utf8_lossy(&f.payload).into_owned())
            .ok_or_else(|| {
                CompareError::GuestReport(format!(
                    "no {exp}/{name} from the guest in {mode} (did the mode switch fail? see the guest console)"
                ))
            })
    };
    let mut profiles = Vec::new();
    for mode in ["cpu-switch", "domain-switch"] {
        let status = text(mode, "status.txt")?;
        if status.contains("unknown experiment") {
            return Err(CompareError::GuestReport(format!(
                "the guest's /etc/vpmu/experiments.sh does not know {exp}: an image older than this \
                 vpmu-vmm? Rebuild it (guest-image/build.sh rootfs, or initramfs)"
            )));
        }
        let failed = failed_steps(&status);
        if !failed.is_empty() {
            let described: Vec<String> = failed
                .iter()
                .map(|line| describe_failed_step(d, mode, exp, line))
                .collect();
            return Err(CompareError::GuestReport(format!(
                "{mode}: profiler steps failed in the guest:\n{}",
                described.join("\n")
            )));
        }
        let system = profiler.parse(&text(mode, "report-system.txt")?);
        let control = profiler.parse(&text(mode, "report-control.txt")?);
        if system.total() == 0 || control.total() == 0 {
            return Err(CompareError::GuestReport(format!(
                "{mode}: the guest's {exp} reports hold no samples"
            )));
        }
        profiles.push((system, control));
    }
    let tool = match profiler {
        GuestProfiler::Perf => "perf",
        GuestProfiler::Oprofile => "oprofile",
    };
    let name = |what: &str| format!("{label}{what}-{tool}");
    let (cpu, dom) = (&profiles[0], &profiles[1]);
    let window = Comparison::new(&name(""), &cpu.0, &dom.0);
    Ok((
        if label == "command" {
            super::linux::with_path_total(
                window,
                &cpu.0,
                &dom.0,
                super::linux::VIRTIO_TOTAL,
                super::linux::is_virtio,
            )
        } else {
            window
        },
        Comparison::new(&name("-control"), &cpu.1, &dom.1),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A result stream as the guest library writes it (its framing is checked against the real
    /// busybox library in vmm/tests/guest_results.rs).
    fn stream(frames: &[(&str, &str, &str)]) -> Vec<u8> {
        let mut b =
            b"VPMU-RESULTS-BEGIN v1 experiments=compare-perf modes=cpu-switch,domain-switch\n"
                .to_vec();
        for (seq, (mode, name, payload)) in frames.iter().enumerate() {
            let crc = crc32fast::hash(payload.as_bytes());
            b.extend_from_slice(
                format!(
                    "VPMU-FRAME v1 seq={seq} name={name} mode={mode} len={} crc32={crc:08x}\n",
                    payload.len()
                )
                .as_bytes(),
            );
            b.extend_from_slice(payload.as_bytes());
            b.extend_from_slice(format!("\nVPMU-FRAME-END seq={seq}\n").as_bytes());
        }
        b.extend_from_slice(format!("VPMU-RESULTS-END frames={}\n", frames.len()).as_bytes());
        b
    }

    fn report(rows: &[(&str, u64)]) -> String {
        let total: u64 = rows.iter().map(|r| r.1).sum();
        let mut s = String::from("# Overhead       Samples  Symbol\n#\n");
        for (name, n) in rows {
            s.push_str(&format!(
                "    {:.2}%  {n:>12}  [k] {name}\n",
                100.0 * *n as f64 / total as f64
            ));
        }
        s
    }

    #[test]
    fn frames_become_the_two_comparisons() {
        let cpu_sys = report(&[("vm_interrupt", 20), ("default_idle", 980)]);
        let dom_sys = report(&[("vm_interrupt", 2000), ("default_idle", 1000)]);
        let ctl = report(&[("hot_75", 750), ("cold_25", 250)]);
        let ok = "exit=0\tperf record\n";
        let bytes = stream(&[
            ("cpu-switch", "compare-perf/report-system.txt", &cpu_sys),
            ("cpu-switch", "compare-perf/report-control.txt", &ctl),
            ("cpu-switch", "compare-perf/status.txt", ok),
            ("domain-switch", "compare-perf/report-system.txt", &dom_sys),
            ("domain-switch", "compare-perf/report-control.txt", &ctl),
            ("domain-switch", "compare-perf/status.txt", ok),
        ]);
        let d = decode(&bytes);
        assert!(d.problems.is_empty(), "{:?}", d.problems);
        let (p, c) = comparisons(GuestProfiler::Perf, "compare-perf", "packet-rx", &d).unwrap();
        assert_eq!(p.workload, "packet-rx-perf");
        let r = p.row("vm_interrupt").unwrap();
        assert_eq!((r.cpu_samples, r.domain_samples), (20, 2000));
        assert!(r.ratio() > 30.0);
        assert_eq!(c.row("hot_75").unwrap().ratio(), 1.0);

        // A failed step in the guest is an error that names it, not an empty table.
        let bad = stream(&[
            ("cpu-switch", "compare-perf/report-system.txt", &cpu_sys),
            ("cpu-switch", "compare-perf/report-control.txt", &ctl),
            (
                "cpu-switch",
                "compare-perf/status.txt",
                "exit=1\tsecs=3\tlog=record-system.log\tperf record -a\n",
            ),
            (
                "cpu-switch",
                "compare-perf/record-system.log",
                "line 1\nperf_event_open failed: Device or resource busy\n",
            ),
        ]);
        let e = comparisons(
            GuestProfiler::Perf,
            "compare-perf",
            "packet-rx",
            &decode(&bad),
        )
        .unwrap_err();
        assert!(e.to_string().contains("perf record -a"), "{e}");
        assert!(
            e.to_string().contains("| perf_event_open failed"),
            "the step's log is shown: {e}"
        );
        // A missing mode is named.
        let half = stream(&[
            ("cpu-switch", "compare-perf/report-system.txt", &cpu_sys),
            ("cpu-switch", "compare-perf/report-control.txt", &ctl),
            ("cpu-switch", "compare-perf/status.txt", ok),
        ]);
        let e = comparisons(
            GuestProfiler::Perf,
            "compare-perf",
            "packet-rx",
            &decode(&half),
        )
        .unwrap_err();
        assert!(e.to_string().contains("domain-switch"), "{e}");
    }

    #[test]
    fn sampling_follows_the_host_kind_and_the_asked_period() {
        let (s, why) = Sampling::for_host(true, None);
        assert_eq!(
            (s, why),
            (
                EMULATED_HOST_SAMPLING,
                "this host emulates guest kernel code"
            )
        );
        let (s, why) = Sampling::for_host(false, Some(1_000_000));
        assert_eq!(why, "as asked");
        assert_eq!(s.period, 1_000_000);
        assert_eq!(s.control_rounds, VTX_SVM_HOST_SAMPLING.control_rounds);
    }

    #[test]
    fn the_command_line_names_the_experiment_and_both_modes() {
        let packets = Window::Packets {
            secs: 20,
            pps: 10,
            access_cost_us: 0,
        };
        let sampling = Sampling {
            period: 7_000_000,
            ..VTX_SVM_HOST_SAMPLING
        };
        let c = cmdline(GuestProfiler::Oprofile, &packets, sampling);
        assert!(c.contains("vpmu.experiment=compare-oprofile"));
        assert!(c.contains("vpmu.period=7000000"), "{c}");
        assert!(
            c.contains("vpmu.profile_rounds=800 vpmu.control_period=10000000"),
            "{c}"
        );
        assert!(c.contains("vpmu.modes=cpu-switch,domain-switch"));
        assert!(c.contains("vpmu.secs=20"));
        assert!(!c.contains("vpmu.workload"));
        let command = Window::Command {
            command: "dd if=/dev/zero of=/dev/vdb bs=64k count=10 oflag=direct; echo \"100%\""
                .into(),
            max_secs: 60,
        };
        let c = cmdline(GuestProfiler::Perf, &command, EMULATED_HOST_SAMPLING);
        assert!(c.contains("vpmu.experiment=compare-command-perf"), "{c}");
        // One word, decoded by /init's percent_decode.
        let word = c
            .split_whitespace()
            .find(|w| w.starts_with("vpmu.workload="))
            .unwrap();
        assert_eq!(
            word,
            "vpmu.workload=dd%20if=/dev/zero%20of=/dev/vdb%20bs=64k%20count=10%20oflag=direct%3B%20echo%20%22100%25%22"
        );
    }
}
