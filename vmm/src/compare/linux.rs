//! The stock-Linux packet-receive comparison: the published CPU-switch vs domain-switch
//! experiment, with no guest user space (it cannot run on every host). One boot of the guest
//! kernel with the virtio-net card (`--net`): once the guest answers its first echo request, a
//! controller runs four phases of `phase` each — packets in cpu-switch, packets in
//! domain-switch, then the CPU-bound control (pinger paused: the guest's spinning init and its
//! timer ticks) in cpu-switch and in domain-switch — and stops the VM. The VMM samples the
//! guest RIP with a cycles counter that follows the accounting mode (`--host-profile`, clock
//! auto), and the samples are cut into the phases by the TSC of each mode switch and resolved
//! with the kernel's own kallsyms.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use vpmu::AccountingMode;

use super::table::{Comparison, Profile};
use super::CompareError;
use crate::end::VmEnd;
use crate::net::NetConfig;
use crate::profile::report::bucket;
use crate::profile::symbols::SymbolTable;
use crate::trace::format::{Record, Trace};
use crate::trace::{ProfileClock, ProfileConfig};
use crate::vm::{self, Boot, Controller, RunReport, VmConfig, VmHandles, VpmuSetting};

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

/// The row that sums the virtio-net path in the packet-receive table.
pub const VIRTIO_NET_TOTAL: &str = "[virtio-net rx/tx/irq path, total]";

pub fn is_virtio_net(name: &str) -> bool {
    VIRTIO_NET_PREFIXES.iter().any(|p| name.starts_with(p))
}

pub struct Settings {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub out: PathBuf,
    /// Length of each of the four phases.
    pub phase: Duration,
    /// Echo requests per second during the packet phases.
    pub pps: u32,
    /// Host-profile samples per second of the sampled clock.
    pub hz: u32,
    /// Device-model work per card register access (µs).
    pub access_cost_us: u32,
    /// Give up if the guest's network is not up after this long.
    pub boot_timeout: Duration,
}

pub struct LinuxComparison {
    pub packets: Comparison,
    pub control: Comparison,
    pub run: RunReport,
    /// The guest kernel's console.
    pub console: PathBuf,
}

/// Boots the guest once and runs the four phases.
pub fn run(s: &Settings) -> Result<LinuxComparison, CompareError> {
    let profile = s.out.join("packet-rx.profile");
    let console = s.out.join("packet-rx-console.log");
    let mut cfg = VmConfig::new(Boot::Linux {
        kernel: s.kernel.clone(),
        initrd: Some(s.initrd.clone()),
        cmdline: String::new(),
    });
    cfg.vpmu = VpmuSetting::DomainSwitch;
    cfg.net = Some(NetConfig {
        rx_pps: s.pps,
        access_cost_us: s.access_cost_us,
    });
    cfg.console_out = Some(console.clone());
    cfg.timeout = Some(s.boot_timeout + 4 * s.phase + Duration::from_secs(60));
    cfg.record.profile = Some(ProfileConfig {
        path: profile.clone(),
        hz: s.hz,
        clock: ProfileClock::Auto,
    });
    let (phase, boot_timeout) = (s.phase, s.boot_timeout);
    cfg.controller = Some(Controller(Arc::new(move |h: VmHandles| {
        drive(&h, phase, boot_timeout)
    })));
    let report = vm::run(&cfg)?;
    if !matches!(report.end, VmEnd::Stopped(_)) {
        return Err(CompareError::GuestEnd(format!(
            "{} (guest console: {})",
            report.end,
            console.display()
        )));
    }
    let trace = Trace::read_file(&profile).map_err(|e| CompareError::GuestReport(e.to_string()))?;
    let syms = SymbolTable::from_kernel(&s.kernel)
        .map_err(|e| CompareError::GuestReport(format!("guest kernel symbols: {e}")))?;
    let cuts = phase_cuts(&report)?;
    let profiles = split(&trace, &syms, &cuts);
    Ok(LinuxComparison {
        packets: with_total(
            Comparison::new("packet-rx", &profiles[0], &profiles[1]),
            &profiles[0],
            &profiles[1],
        ),
        control: Comparison::new("packet-rx-control", &profiles[2], &profiles[3]),
        run: report,
        console,
    })
}

/// The controller: wait for the network, then the four phases, then stop.
fn drive(h: &VmHandles, phase: Duration, boot_timeout: Duration) {
    let started = std::time::Instant::now();
    eprintln!("[compare] waiting for the guest's network (first echo reply)...");
    if !h
        .net_up
        .wait(|| h.control.stopping() || started.elapsed() > boot_timeout)
    {
        if !h.control.stopping() {
            h.control.request_end(VmEnd::Stopped(format!(
                "no echo reply within {:.0} s: the guest's network did not come up",
                boot_timeout.as_secs_f64()
            )));
        }
        return;
    }
    let phases = [
        ("packets", AccountingMode::CpuSwitch, false),
        ("packets", AccountingMode::DomainSwitch, false),
        ("control", AccountingMode::CpuSwitch, true),
        ("control", AccountingMode::DomainSwitch, true),
    ];
    for (i, (what, mode, paused)) in phases.into_iter().enumerate() {
        h.net_paused.store(paused, Ordering::Relaxed);
        h.set_mode(mode, "compare");
        eprintln!(
            "[compare] phase {}/4: {what} in {} for {:.0} s (at {:.0} s)",
            i + 1,
            crate::pmu::mode::name(mode),
            phase.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        if !h.sleep(phase) {
            return;
        }
    }
    h.control
        .request_end(VmEnd::Stopped("compare: the four phases are done".into()));
}

/// TSCs of the four phase starts and of the end, from the run's mode switches by `compare`.
fn phase_cuts(r: &RunReport) -> Result<Vec<u64>, CompareError> {
    let mut cuts: Vec<u64> = r
        .mode_history
        .iter()
        .filter(|s| s.by == "compare")
        .map(|s| s.tsc)
        .collect();
    // Phases 2->3 and 3->4 change the mode; 1 also does (the boot runs in domain-switch).
    if cuts.len() != 4 {
        return Err(CompareError::GuestReport(format!(
            "expected 4 phase switches, the run made {}",
            cuts.len()
        )));
    }
    cuts.push(u64::MAX);
    Ok(cuts)
}

/// Samples per symbol in each of the four phases (a sample counts only if its mode tag agrees
/// with its phase).
fn split(t: &Trace, syms: &SymbolTable, cuts: &[u64]) -> Vec<Profile> {
    let modes = [
        AccountingMode::CpuSwitch,
        AccountingMode::DomainSwitch,
        AccountingMode::CpuSwitch,
        AccountingMode::DomainSwitch,
    ];
    let mut out = vec![Profile::default(); 4];
    for v in &t.vcpus {
        for r in &v.records {
            let Record::Sample {
                rip,
                cpl,
                tsc,
                mode,
                ..
            } = *r
            else {
                continue;
            };
            let Some(p) = (0..4).find(|&p| tsc >= cuts[p] && tsc < cuts[p + 1]) else {
                continue;
            };
            if mode != Some(modes[p]) {
                continue;
            }
            *out[p]
                .samples
                .entry(bucket(rip, cpl, Some(syms)))
                .or_default() += 1;
        }
    }
    out
}

/// Adds the virtio-net path total as a row of its own.
fn with_total(mut c: Comparison, cpu: &Profile, dom: &Profile) -> Comparison {
    let sum = |p: &Profile| -> u64 {
        p.samples
            .iter()
            .filter(|(k, _)| is_virtio_net(k))
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
    c.rows.insert(
        0,
        super::table::Row {
            function: VIRTIO_NET_TOTAL.into(),
            cpu_samples: a,
            cpu_percent: pct(a, cpu),
            domain_samples: b,
            domain_percent: pct(b, dom),
        },
    );
    c
}

/// The kernel and initramfs a packet-rx run needs, checked before the (long) boot.
pub fn check_inputs(
    kernel: Option<&Path>,
    initrd: Option<&Path>,
) -> Result<(PathBuf, PathBuf), String> {
    let (Some(k), Some(i)) = (kernel, initrd) else {
        return Err(
            "--workload packet-rx needs --kernel and --initrd (the default guest: \
                    `eval \"$(guest-image/build.sh paths)\"` then --kernel \"$DEFAULT_BZIMAGE\" \
                    --initrd \"$SPIN_INITRAMFS\"; scripts/demo.sh does this)"
                .into(),
        );
    };
    for p in [k, i] {
        if !p.is_file() {
            return Err(format!("{}: no such file", p.display()));
        }
    }
    Ok((k.to_path_buf(), i.to_path_buf()))
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
    fn missing_inputs_are_explained() {
        let e = check_inputs(None, None).unwrap_err();
        assert!(e.contains("--kernel"), "{e}");
        let e = check_inputs(
            Some(Path::new("/nonexistent")),
            Some(Path::new("/nonexistent")),
        )
        .unwrap_err();
        assert!(e.contains("no such file"), "{e}");
    }
}
