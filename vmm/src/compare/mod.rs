//! `vpmu-vmm compare`: one workload profiled with the VMM's work charged to the guest
//! (domain-switch) and not charged (cpu-switch), shown side by side ([`table`]): text table,
//! CSV and SVG chart. Workloads: [`linux`] (packet receive on the stock kernel, profiled from
//! the host), [`in_guest`] (the same, profiled by the guest's own perf or OProfile: needs a
//! VT-x/SVM host) and [`tiny`] (a bare-metal guest that samples itself with the vPMU).

pub(crate) mod args;
mod chart;
pub mod in_guest;
pub mod linux;
pub mod table;
pub mod tiny;

use std::path::{Path, PathBuf};

use args::{CompareArgs, Format, Profiler, Workload};
use runtime::host_quirks::HostKind;
use runtime::vm::VmError;

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
    #[error(transparent)]
    Inputs(#[from] linux::InputError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl CompareError {
    /// A run that ended the wrong way: its end, `extra`, and one diagnostic line per vCPU.
    pub fn guest_end(report: &runtime::vm::RunReport, extra: &str) -> Self {
        let mut what = format!("{}{extra}", report.end);
        for l in crate::report::diagnostic(report) {
            what.push('\n');
            what.push_str(&l);
        }
        let code = if report.end.is_clean() {
            runtime::end::code::ERROR
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
            _ => runtime::end::code::ERROR,
        }
    }
}

/// `vpmu-vmm compare`: runs the workload, prints the tables and what they show, writes the files.
pub fn command(args: &CompareArgs) -> Result<(), CompareError> {
    let profiler = match (args.profiler, args.workload) {
        (Some(p), _) => p,
        // The host-side comparison drives its own guests only (compare/linux.rs, tiny.rs).
        (None, Workload::Command) => Profiler::Perf,
        (None, _) => Profiler::Host,
    };
    let in_guest = match profiler {
        Profiler::Host => None,
        Profiler::Perf => Some(in_guest::GuestProfiler::Perf),
        Profiler::Oprofile => Some(in_guest::GuestProfiler::Oprofile),
    };
    check_workload_args(args, in_guest.is_some())?;
    std::fs::create_dir_all(&args.out).map_err(|source| CompareError::Io {
        path: args.out.clone(),
        source,
    })?;
    let _lock = lock_out_dir(&args.out)?;
    match (args.workload, in_guest) {
        (Workload::PacketRx, None) => packet_rx_host(args),
        (Workload::PacketRx | Workload::Command, Some(p)) => in_guest_comparison(args, p),
        (Workload::Tiny, _) => tiny_guest(args),
        (Workload::Command, None) => unreachable!("refused by check_workload_args"),
    }
}

/// An exclusive lock on `DIR/.lock` for the whole comparison: two compares writing the same
/// files (the guest's result stream, the CSVs) would mix them; the second is refused instead.
fn lock_out_dir(dir: &std::path::Path) -> Result<std::fs::File, CompareError> {
    use std::os::fd::AsRawFd;
    let path = dir.join(".lock");
    let io = |source| CompareError::Io {
        path: path.clone(),
        source,
    };
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io)?;
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(CompareError::Input(format!(
                "--out {}: another vpmu-vmm compare is writing there (it holds {}); give this one \
                 its own --out DIR",
                dir.display(),
                path.display()
            )));
        }
        return Err(io(e));
    }
    Ok(f)
}

/// The combinations of workload, profiler and command that make sense, else a usage message.
fn check_workload_args(args: &CompareArgs, guest_profiler: bool) -> Result<(), CompareError> {
    let refuse = |m: &str| Err(CompareError::Input(m.into()));
    match args.workload {
        Workload::Tiny if guest_profiler => refuse(
            "--profiler perf|oprofile needs --workload packet-rx or command: the tiny guest has no Linux (it samples itself with the vPMU)",
        ),
        Workload::Command if !guest_profiler => refuse(
            "--workload command needs the guest's own profiler (--profiler perf, the default, or oprofile): the host-side comparison runs its own packet-rx guest only. To profile your program from the host, boot your guest with `run --host-profile FILE` and read it with `report FILE --guest-files DIR` (processes, functions, call stacks: docs/tracing.md)",
        ),
        Workload::Command if args.command.is_empty() => refuse(
            "--workload command needs the command after `--`, e.g. compare --workload command --kernel K --disk ROOTFS -- dd if=/dev/zero of=/tmp/f bs=64k count=100 conv=fsync",
        ),
        Workload::Command if args.disk.is_empty() => refuse(
            "--workload command needs --disk: the guest's root filesystem image (guest-image/build.sh rootfs: $ROOTFS), then any disks the command uses",
        ),
        Workload::Tiny | Workload::PacketRx if !args.command.is_empty() => refuse(
            "a command after `--` is for --workload command",
        ),
        _ => Ok(()),
    }
}

/// The kind of host the comparison's runs get (`VmConfig::new` decides it the same way, once
/// per run; compare has no `--host-quirks`).
fn host() -> HostKind {
    HostKind::decide(runtime::host_quirks::QuirkSetting::Auto)
}

/// The extra device-model work per card register access: as asked, else by host, and why.
fn access_cost(args: &CompareArgs, host: HostKind) -> (u32, &'static str) {
    match (args.net_access_cost_us, host.quirks()) {
        (Some(us), _) => (us, "as asked"),
        (None, true) => (
            host.default_access_cost_us(),
            "scaled like this host's emulated guest kernel code; docs/accounting-modes.md",
        ),
        (None, false) => (0, "the VMM's own work only"),
    }
}

fn packet_rx_host(args: &CompareArgs) -> Result<(), CompareError> {
    let (kernel, initrd) = linux::check_inputs(args.kernel.as_deref(), args.initrd.as_deref())?;
    let (access_cost_us, why) = access_cost(args, host());
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
    let params = vec![
        param("profiler", "host"),
        param("kernel", kernel_name(args)),
        param("phase_secs", args.phase_secs),
        param("rounds", args.rounds),
        param("sampling", "host cycles counter gated like the mode"),
        param("sample_hz", args.hz),
        param("net_rx_pps", args.net_rx_pps),
        param("access_cost_us", access_cost_us),
        param("pmu_model", format!("{:?}", args.pmu_model).to_lowercase()),
    ];
    write_flame_graphs(&args.out, &l.packets_folded)?;
    print_linux_comparison(
        args,
        l.packets,
        l.control,
        &l.run,
        params,
        linux::VIRTIO_NET_TOTAL,
    )
}

/// The packet phases as folded stacks (one file per mode) and a differential flame graph of
/// domain-switch against cpu-switch: where the VMM's work lands (`[vmm] ...` frames on the
/// guest code that caused it) shows in red.
fn write_flame_graphs(out: &std::path::Path, folded: &[String; 2]) -> Result<(), CompareError> {
    let write = |name: &str, bytes: &[u8]| {
        let path = out.join(name);
        std::fs::write(&path, bytes).map_err(|source| CompareError::Io { path, source })
    };
    write("packet-rx-cpu-switch.folded", folded[0].as_bytes())?;
    write("packet-rx-domain-switch.folded", folded[1].as_bytes())?;
    let svg = analysis::profile::stacks::differential_flame_graph(
        &folded[0],
        &folded[1],
        "packet-rx: domain-switch against cpu-switch (red: grew)",
    )
    .map_err(|e| CompareError::GuestReport(e.to_string()))?;
    write("packet-rx-flame-diff.svg", &svg)?;
    eprintln!(
        "written: {} (folded stacks: packet-rx-cpu-switch.folded, packet-rx-domain-switch.folded)",
        out.join("packet-rx-flame-diff.svg").display()
    );
    Ok(())
}

fn in_guest_comparison(
    args: &CompareArgs,
    profiler: in_guest::GuestProfiler,
) -> Result<(), CompareError> {
    let root_path = args.disk.first().map(|d| d.path.as_path());
    let (kernel, root, is_disk) =
        linux::check_in_guest_inputs(args.kernel.as_deref(), args.initrd.as_deref(), root_path)?;
    let host = host();
    let disk_cost = crate::disk_arg::disk_access_cost(args.disk_access_cost_us, host);
    let root = if is_disk {
        in_guest::GuestRoot::Disk {
            path: root,
            access_cost_us: disk_cost,
        }
    } else {
        in_guest::GuestRoot::Initrd(root)
    };
    let extra_disks = args
        .disk
        .iter()
        .skip(1)
        .map(|d| runtime::vm::DiskConfig {
            path: d.path.clone(),
            readonly: d.readonly,
            access_cost_us: disk_cost,
        })
        .collect();
    let emulated = host.quirks();
    let (access_cost_us, why) = access_cost(args, host);
    let (sampling, period_why) = in_guest::Sampling::for_host(emulated, args.guest_period);
    let period = sampling.period;
    let window = match args.workload {
        Workload::Command => in_guest::Window::Command {
            command: args.command.join(" "),
            max_secs: args.phase_secs,
        },
        _ => in_guest::Window::Packets {
            secs: args.phase_secs,
            pps: args.net_rx_pps,
            access_cost_us,
        },
    };
    let tool = window
        .experiment(profiler)
        .trim_start_matches("compare-")
        .trim_start_matches("command-");
    match &window {
        in_guest::Window::Packets { .. } => eprintln!(
            "[compare] booting {} with the virtio-net card ({access_cost_us} us of extra device-model work per register access: {why}), \
             {} echo requests/s; the guest's {tool} profiles the whole system for {} s (one sample every {period} cycles: {period_why}) and cpu_split (the control) in each mode, switching through the vPMU control port",
            kernel.display(),
            args.net_rx_pps,
            args.phase_secs,
        ),
        in_guest::Window::Command { command, .. } => eprintln!(
            "[compare] booting {} from its root disk; in each mode the guest's {tool} profiles the whole system while `{command}` runs \
             (one sample every {period} cycles: {period_why}; disks: {disk_cost} us of extra device-model work per register access), then cpu_split (the control), switching through the vPMU control port",
            kernel.display(),
        ),
    }
    let g = in_guest::run(&in_guest::Settings {
        profiler,
        sampling,
        kernel,
        root,
        extra_disks,
        out: args.out.clone(),
        window: window.clone(),
        boot_timeout: std::time::Duration::from_secs(args.boot_timeout),
        pmu_model: args.pmu_model,
    })?;
    let mut params = vec![
        param("profiler", tool),
        param("kernel", kernel_name(args)),
        param("guest_root", guest_root_param(args)),
        param("phase_secs", args.phase_secs),
        param("rounds", 1),
        param("sampling", "guest profiler, fixed period"),
        param("period_cycles", period),
        param("control_rounds", sampling.control_rounds),
        param("control_period_cycles", sampling.control_period),
    ];
    match &window {
        in_guest::Window::Packets { .. } => {
            params.push(param("net_rx_pps", args.net_rx_pps));
            params.push(param("access_cost_us", access_cost_us));
        }
        in_guest::Window::Command { command, .. } => {
            params.push(param("command", command.as_str()));
            params.push(param("disk_access_cost_us", disk_cost));
        }
    }
    params.push(param(
        "pmu_model",
        format!("{:?}", args.pmu_model).to_lowercase(),
    ));
    let io_total = match window {
        in_guest::Window::Packets { .. } => linux::VIRTIO_NET_TOTAL,
        in_guest::Window::Command { .. } => linux::VIRTIO_TOTAL,
    };
    print_linux_comparison(args, g.window, g.control, &g.run, params, io_total)
}

/// The guest's root as the CSV/JSON parameter says it.
fn guest_root_param(args: &CompareArgs) -> String {
    match (args.disk.first(), &args.initrd) {
        (Some(d), _) => format!("disk {} (read-only)", d.path.display()),
        (None, Some(i)) => format!("initrd {}", i.display()),
        (None, None) => String::new(),
    }
}

fn print_linux_comparison(
    args: &CompareArgs,
    mut packets: table::Comparison,
    mut control: table::Comparison,
    run: &runtime::vm::RunReport,
    params: Vec<(String, serde_json::Value)>,
    io_total: &str,
) -> Result<(), CompareError> {
    let params = run_params(args, run, params);
    for c in [&mut packets, &mut control] {
        c.set_params(with_totals(&params, c));
    }
    let (packets, control) = (&packets, &control);
    let text = args.format == Format::Text;
    eprintln!("[compare] done in {:.1} s", run.run_time.as_secs_f64());
    if let Some(n) = run.net.as_ref().and_then(|n| n.pinger.as_ref()) {
        eprintln!(
            "[compare] network: {} echo requests, {} replies ok, {} bad; {} held back (control phase, or the guest's packet gate closed)",
            n.requests_pushed, n.replies_ok, n.replies_bad, n.requests_held
        );
    }
    let mut files = Vec::new();
    for c in [packets, control] {
        let (csv, svg) = write_outputs(&args.out, c)?;
        if text {
            println!("{}", c.to_table_top(args.top));
            println!("written: {} {}\n", csv.display(), svg.display());
        }
        files.push((csv, svg));
    }
    if !text {
        let doc = document(
            &params,
            &[packets, control],
            &files,
            packets,
            control,
            io_total,
            run,
        );
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("plain values")
        );
        return Ok(());
    }
    for f in linux::DEVICE_ACCESS_FUNCTIONS {
        if let Some(r) = packets.row(f) {
            println!(
                "{f} (accesses the card's registers): {} samples in cpu-switch, {} in domain-switch ({:.1}% -> {:.1}%)",
                r.cpu_samples, r.domain_samples, r.cpu_percent, r.domain_percent
            );
        }
    }
    println!("{}", summary(packets, control, io_total));
    Ok(())
}

fn tiny_guest(args: &CompareArgs) -> Result<(), CompareError> {
    eprintln!(
        "[compare] booting the tiny comparison guest: I/O workload and CPU-bound control, \
         cpu-switch then domain-switch, one boot ({} us per I/O access)...",
        args.io_delay_us
    );
    let mut t = tiny::run(&args.out, args.io_delay_us)?;
    eprintln!("[compare] done in {:.1} s", t.run.run_time.as_secs_f64());
    let params = run_params(
        args,
        &t.run,
        vec![
            param("sampling", "guest NMI sampler on vPMU counter 0 (cycles)"),
            param("sample_period_cycles", tiny::SAMPLE_PERIOD_CYCLES),
            param("rounds", tiny::ROUNDS),
            param("io_delay_us", args.io_delay_us),
            // compare64.S programs AMD's counter MSRs (tiny::run).
            param("pmu_model", "amd"),
        ],
    );
    for c in [&mut t.io, &mut t.control] {
        c.set_params(with_totals(&params, c));
    }
    let text = args.format == Format::Text;
    let mut files = Vec::new();
    for c in [&t.io, &t.control] {
        let (csv, svg) = write_outputs(&args.out, c)?;
        if text {
            println!("{}", c.to_table());
            println!("written: {} {}\n", csv.display(), svg.display());
        }
        files.push((csv, svg));
    }
    if text {
        println!("{}", summary(&t.io, &t.control, "io_heavy"));
    } else {
        let doc = document(
            &params,
            &[&t.io, &t.control],
            &files,
            &t.io,
            &t.control,
            "io_heavy",
            &t.run,
        );
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("plain values")
        );
    }
    Ok(())
}

/// The `schema` field of `compare --format json` (docs/accounting-modes.md, "Results a script
/// can read"): bumped when a stable field changes meaning or goes away.
pub const COMPARE_SCHEMA: &str = "vpmu-compare/1";

fn param(key: &str, value: impl Into<serde_json::Value>) -> (String, serde_json::Value) {
    (key.to_string(), value.into())
}

fn kernel_name(args: &CompareArgs) -> String {
    args.kernel
        .as_deref()
        .map(|k| k.display().to_string())
        .unwrap_or_default()
}

/// The run's parameters, in CSV and JSON order: the workload, what the workload adds
/// (`extra`), the PMU model, host quirks, and the time the run spent in each mode.
fn run_params(
    args: &CompareArgs,
    run: &runtime::vm::RunReport,
    extra: Vec<(String, serde_json::Value)>,
) -> Vec<(String, serde_json::Value)> {
    let workload = match args.workload {
        Workload::Tiny => "tiny",
        Workload::PacketRx => "packet-rx",
        Workload::Command => "command",
    };
    let mut p = vec![param("schema", COMPARE_SCHEMA), param("workload", workload)];
    p.extend(extra);
    let quirks = run.host.quirks;
    let time = runtime::pmu::mode::time_in_modes(&run.mode_history, run.run_time);
    p.extend([
        param("host_quirks", quirks),
        param("mode_switches", run.mode_history.len().saturating_sub(1)),
        param("cpu_switch_secs", round3(time[0].as_secs_f64())),
        param("domain_switch_secs", round3(time[1].as_secs_f64())),
        param("run_secs", round3(run.run_time.as_secs_f64())),
    ]);
    p
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `params` and this comparison's per-mode sample totals.
fn with_totals(
    params: &[(String, serde_json::Value)],
    c: &table::Comparison,
) -> Vec<(String, serde_json::Value)> {
    let mut p = params.to_vec();
    p.push(param("cpu_switch_samples", c.cpu_total));
    p.push(param("domain_switch_samples", c.domain_total));
    p
}

/// The `vpmu-compare/1` document: the parameters, each comparison (with its files), the
/// summary lines' numbers, and the run's end-of-run report (`vpmu-run/1`).
fn document(
    params: &[(String, serde_json::Value)],
    comparisons: &[&table::Comparison],
    files: &[(PathBuf, PathBuf)],
    io: &table::Comparison,
    control: &table::Comparison,
    io_function: &str,
    run: &runtime::vm::RunReport,
) -> serde_json::Value {
    let params = params
        .iter()
        .filter(|(k, _)| k != "schema")
        .cloned()
        .collect();
    let comparisons = comparisons
        .iter()
        .zip(files)
        .map(|(c, (csv, svg))| ComparisonFiles {
            comparison: c.doc(),
            csv: csv.display().to_string(),
            svg: svg.display().to_string(),
        })
        .collect();
    let io = io.row(io_function).map(|r| IoRow {
        function: r.function.clone(),
        cpu_switch_percent: r.cpu_percent,
        domain_switch_percent: r.domain_percent,
        ratio_domain_cpu: Some(r.ratio()).filter(|x| x.is_finite()),
    });
    let control_top = control
        .rows
        .iter()
        .max_by(|a, b| a.cpu_percent.total_cmp(&b.cpu_percent))
        .map(|r| TopRow {
            function: r.function.clone(),
            cpu_switch_percent: r.cpu_percent,
            domain_switch_percent: r.domain_percent,
            moved_pp: r.domain_percent - r.cpu_percent,
        });
    let doc = CompareDoc {
        schema: COMPARE_SCHEMA,
        params,
        comparisons,
        summary: Summary { io, control_top },
        run: crate::report::RunDoc::new(run),
    };
    serde_json::to_value(doc).expect("plain values")
}

/// The `vpmu-compare/1` document.
#[derive(serde::Serialize)]
struct CompareDoc {
    schema: &'static str,
    params: serde_json::Map<String, serde_json::Value>,
    comparisons: Vec<ComparisonFiles>,
    summary: Summary,
    /// The run's end-of-run report (`vpmu-run/1`).
    run: crate::report::RunDoc,
}

/// A comparison and the files it was written to.
#[derive(serde::Serialize)]
struct ComparisonFiles {
    #[serde(flatten)]
    comparison: table::ComparisonDoc,
    csv: String,
    svg: String,
}

/// The summary lines' numbers.
#[derive(serde::Serialize)]
struct Summary {
    /// The I/O function's row.
    io: Option<IoRow>,
    /// The control's top function.
    control_top: Option<TopRow>,
}

#[derive(serde::Serialize)]
struct IoRow {
    function: String,
    cpu_switch_percent: f64,
    domain_switch_percent: f64,
    ratio_domain_cpu: Option<f64>,
}

#[derive(serde::Serialize)]
struct TopRow {
    function: String,
    cpu_switch_percent: f64,
    domain_switch_percent: f64,
    moved_pp: f64,
}

/// What the two tables show, in two lines: how much more of the I/O function domain-switch
/// sees, and how far the control's top function moved.
pub fn summary(io: &table::Comparison, control: &table::Comparison, io_function: &str) -> String {
    let mut s = String::new();
    if let Some(r) = io.row(io_function) {
        let ratio = if r.ratio().is_finite() {
            format!("{:.1}x", r.ratio())
        } else {
            "none in cpu-switch".to_string()
        };
        s.push_str(&format!(
            "{io_function}: {:.1}% of samples in cpu-switch, {:.1}% in domain-switch ({ratio})\n",
            r.cpu_percent, r.domain_percent,
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
    for (path, text) in [(&csv, c.to_csv()), (&svg, chart::svg(c))] {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_compare_on_the_same_out_dir_is_refused() {
        let dir = std::env::temp_dir().join(format!("vpmu-lock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = lock_out_dir(&dir).unwrap();
        let e = lock_out_dir(&dir).unwrap_err();
        assert!(e.to_string().contains("another vpmu-vmm compare"), "{e}");
        drop(first);
        lock_out_dir(&dir).expect("free again once the first ends");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
