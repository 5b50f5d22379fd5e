//! `vpmu-vmm compare`: one workload profiled with the VMM's work charged to the guest
//! (domain-switch) and not charged (cpu-switch), shown side by side ([`table`]): text table,
//! CSV and SVG chart. Workloads: [`linux`] (packet receive on the stock kernel, profiled from
//! the host), [`in_guest`] (the same, profiled by the guest's own perf or OProfile: needs a
//! VT-x/SVM host) and [`tiny`] (a bare-metal guest that samples itself with the vPMU).

pub mod in_guest;
pub mod linux;
pub mod table;
pub mod tiny;

use std::path::{Path, PathBuf};

use crate::vm::VmError;

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error(transparent)]
    Vm(#[from] VmError),
    /// The run ended the wrong way: what happened (with the per-vCPU diagnostic) and the
    /// exit code `compare` ends with (the run's own, or 1 for an early clean end).
    #[error("the comparison guest did not power off cleanly: {0}")]
    GuestEnd(String, i32),
    #[error("the comparison guest's report: {0}")]
    GuestReport(String),
    #[error("{0}")]
    Input(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl CompareError {
    /// A run that ended the wrong way: its end, `extra`, and one diagnostic line per vCPU.
    pub fn guest_end(report: &crate::vm::RunReport, extra: &str) -> Self {
        let mut what = format!("{}{extra}", report.end);
        for l in crate::report::diagnostic(report) {
            what.push('\n');
            what.push_str(&l);
        }
        let code = if report.end.is_clean() {
            crate::end::code::ERROR
        } else {
            report.end.exit_code()
        };
        CompareError::GuestEnd(what, code)
    }

    /// The process exit code: the guest run's own when it went wrong (3 panic, 4 triple
    /// fault, ... as for `run`), else 1.
    pub fn exit_code(&self) -> i32 {
        match self {
            CompareError::GuestEnd(_, code) => *code,
            _ => crate::end::code::ERROR,
        }
    }
}

/// `vpmu-vmm compare`: runs the workload, prints the tables and what they show, writes the files.
pub fn command(args: &crate::cli::CompareArgs) -> Result<(), CompareError> {
    use crate::cli::{Profiler, Workload};
    let in_guest = match args.profiler {
        Profiler::Host => None,
        Profiler::Perf => Some(in_guest::GuestProfiler::Perf),
        Profiler::Oprofile => Some(in_guest::GuestProfiler::Oprofile),
    };
    if args.workload == Workload::Tiny && in_guest.is_some() {
        return Err(CompareError::Input(
            "--profiler perf|oprofile needs --workload packet-rx: the tiny guest has no Linux (it samples itself with the vPMU)"
                .into(),
        ));
    }
    std::fs::create_dir_all(&args.out).map_err(|source| CompareError::Io {
        path: args.out.clone(),
        source,
    })?;
    match (args.workload, in_guest) {
        (Workload::PacketRx, None) => packet_rx_host(args),
        (Workload::PacketRx, Some(p)) => packet_rx_in_guest(args, p),
        (Workload::Tiny, _) => tiny_guest(args),
    }
}

/// The extra device-model work per card register access: as asked, else by host, and why.
fn access_cost(args: &crate::cli::CompareArgs) -> (u32, &'static str) {
    let emulated = crate::host_quirks::detect(crate::host_quirks::QuirkSetting::Auto).is_some();
    match (args.net_access_cost_us, emulated) {
        (Some(us), _) => (us, "as asked"),
        (None, true) => (
            linux::EMULATED_ACCESS_COST_US,
            "scaled like this host's emulated guest kernel code; docs/accounting-modes.md",
        ),
        (None, false) => (0, "the VMM's own work only"),
    }
}

fn packet_rx_host(args: &crate::cli::CompareArgs) -> Result<(), CompareError> {
    let (kernel, initrd) = linux::check_inputs(args.kernel.as_deref(), args.initrd.as_deref())
        .map_err(CompareError::Input)?;
    let (access_cost_us, why) = access_cost(args);
    eprintln!(
        "[compare] booting {} with the virtio-net card ({access_cost_us} us of extra device-model work per register access: {why}), \
         {} echo requests/s; then 4 phases of {} s (packets and a CPU-bound control, each in cpu-switch and domain-switch) \
         interleaved in {} rounds, profiled from the host. The guest kernel's code is emulated on some hosts: the boot takes a minute or more there.",
        kernel.display(),
        args.net_rx_pps,
        args.phase_secs,
        args.rounds
    );
    let l = linux::run(&linux::Settings {
        kernel,
        initrd,
        out: args.out.clone(),
        phase: std::time::Duration::from_secs(args.phase_secs),
        rounds: args.rounds,
        pps: args.net_rx_pps,
        hz: args.hz,
        access_cost_us,
        boot_timeout: std::time::Duration::from_secs(args.boot_timeout),
        pmu_model: args.pmu_model,
    })?;
    print_packet_rx(args, &l.packets, &l.control, &l.run)
}

fn packet_rx_in_guest(
    args: &crate::cli::CompareArgs,
    profiler: in_guest::GuestProfiler,
) -> Result<(), CompareError> {
    let (kernel, initrd) = linux::check_inputs(args.kernel.as_deref(), args.initrd.as_deref())
        .map_err(CompareError::Input)?;
    let (access_cost_us, why) = access_cost(args);
    eprintln!(
        "[compare] booting {} with the virtio-net card ({access_cost_us} us of extra device-model work per register access: {why}), \
         {} echo requests/s; the guest's {} profiles the whole system for {} s and cpu_split (the control) in each mode, switching through the vPMU control port",
        kernel.display(),
        args.net_rx_pps,
        profiler.experiment().trim_start_matches("compare-"),
        args.phase_secs,
    );
    let g = in_guest::run(&in_guest::Settings {
        profiler,
        kernel,
        initrd,
        out: args.out.clone(),
        secs: args.phase_secs,
        pps: args.net_rx_pps,
        access_cost_us,
        boot_timeout: std::time::Duration::from_secs(args.boot_timeout),
        pmu_model: args.pmu_model,
    })?;
    print_packet_rx(args, &g.packets, &g.control, &g.run)
}

fn print_packet_rx(
    args: &crate::cli::CompareArgs,
    packets: &table::Comparison,
    control: &table::Comparison,
    run: &crate::vm::RunReport,
) -> Result<(), CompareError> {
    eprintln!("[compare] done in {:.1} s", run.run_time.as_secs_f64());
    if let Some(n) = run.net.as_ref().and_then(|n| n.pinger.as_ref()) {
        eprintln!(
            "[compare] network: {} echo requests, {} replies ok, {} bad; {} held back (control phase, or the guest's packet gate closed)",
            n.requests_pushed, n.replies_ok, n.replies_bad, n.requests_held
        );
    }
    for c in [packets, control] {
        println!("{}", c.to_table_top(args.top));
        let (csv, svg) = write_outputs(&args.out, c)?;
        println!("written: {} {}\n", csv.display(), svg.display());
    }
    for f in linux::DEVICE_ACCESS_FUNCTIONS {
        if let Some(r) = packets.row(f) {
            println!(
                "{f} (accesses the card's registers): {} samples in cpu-switch, {} in domain-switch ({:.1}% -> {:.1}%)",
                r.cpu_samples, r.domain_samples, r.cpu_percent, r.domain_percent
            );
        }
    }
    println!("{}", summary(packets, control, linux::VIRTIO_NET_TOTAL));
    Ok(())
}

fn tiny_guest(args: &crate::cli::CompareArgs) -> Result<(), CompareError> {
    eprintln!(
        "[compare] booting the tiny comparison guest: I/O workload and CPU-bound control, \
         cpu-switch then domain-switch, one boot ({} us per I/O access)...",
        args.io_delay_us
    );
    let t = tiny::run(&args.out, args.io_delay_us)?;
    eprintln!("[compare] done in {:.1} s", t.run.run_time.as_secs_f64());
    for c in [&t.io, &t.control] {
        println!("{}", c.to_table());
        let (csv, svg) = write_outputs(&args.out, c)?;
        println!("written: {} {}\n", csv.display(), svg.display());
    }
    println!("{}", summary(&t.io, &t.control, "io_heavy"));
    Ok(())
}

/// What the two tables show, in two lines: how much more of the I/O function domain-switch
/// sees, and how far the control's top function moved.
pub fn summary(io: &table::Comparison, control: &table::Comparison, io_function: &str) -> String {
    let mut s = String::new();
    if let Some(r) = io.row(io_function) {
        s.push_str(&format!(
            "{io_function}: {:.1}% of samples in cpu-switch, {:.1}% in domain-switch ({:.1}x)\n",
            r.cpu_percent,
            r.domain_percent,
            r.ratio()
        ));
    }
    let top = control
        .rows
        .iter()
        .max_by(|a, b| a.cpu_percent.total_cmp(&b.cpu_percent));
    if let Some(r) = top {
        s.push_str(&format!(
            "control: top function {} {:.1}% in cpu-switch, {:.1}% in domain-switch ({:+.1} pp)",
            r.function,
            r.cpu_percent,
            r.domain_percent,
            r.domain_percent - r.cpu_percent
        ));
    }
    s
}

/// Writes `NAME.csv` and `NAME.svg` for a comparison into `out`; returns their paths.
pub fn write_outputs(
    out: &Path,
    c: &table::Comparison,
) -> Result<(PathBuf, PathBuf), CompareError> {
    let csv = out.join(format!("{}.csv", c.workload));
    let svg = out.join(format!("{}.svg", c.workload));
    for (path, text) in [(&csv, c.to_csv()), (&svg, c.to_svg())] {
        write_whole(path, text.as_bytes()).map_err(|source| CompareError::Io {
            path: path.clone(),
            source,
        })?;
    }
    Ok((csv, svg))
}

/// Writes `path` so that it is never seen cut short: into `path.tmp`, synced, then renamed
/// over `path` (a run stopped in the middle leaves the old file or the new one, whole).
pub fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}
