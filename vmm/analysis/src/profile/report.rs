//! `vpmu-vmm report FILE`: the host-side profile as an opreport-like table (samples, %,
//! symbol), and — when the file also holds exit records — the system-wide view: guest symbols
//! and the VMM's exit handling side by side, in milliseconds.
//!
//! Buckets: a CPL 0 sample resolves to the guest kernel symbol containing its RIP; a CPL 3
//! sample goes to one bucket, `[guest user space, CPL 3]` (the VMM knows no processes); a
//! kernel RIP no symbol covers goes to `[guest kernel, unknown]`; without symbols, samples are
//! listed by raw RIP.
//!
//! Units in the system-wide view: a sample stands for one period of the sampled clock
//! (`1e9 / hz` ns of thread CPU time for the cycles counter, of wall time for the timer), so
//! guest time = samples x period. VMM time is measured per exit from the TSCs (exit to
//! re-entry) and converted with the file's TSC kHz. A sample that arrived while the VMM was
//! handling an exit (domain-switch, wall clock) is VMM time, already measured exactly by the
//! exit records, so the view leaves it out of the guest rows rather than count it twice.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::stacks;
use super::symbols::{bucket, Origin, SymbolTable, SymbolsError};
use crate::trace::command::{open, read_error, CommandError};
use crate::trace::format::{FormatError, Header, Reason, Record};
use crate::trace::read::Records;
use crate::trace::summary;

/// The system-wide view's remainder row.
pub(crate) const REST: &str = "[rest: halted, off-CPU or unsampled]";

/// `report`'s arguments (part of the command line in `cli.rs`).
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Profile file (`run --host-profile FILE`, possibly also `--trace FILE`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Guest kernel (ELF vmlinux or bzImage) whose kallsyms tables resolve guest addresses
    /// (default: the kernel the run booted, as recorded in the file).
    #[arg(long, value_name = "PATH", conflicts_with = "system_map")]
    pub kernel: Option<PathBuf>,
    /// Resolve guest addresses with this System.map instead.
    #[arg(long, value_name = "FILE")]
    pub system_map: Option<PathBuf>,
    /// Show at most N rows (0 = all).
    #[arg(long, value_name = "N", default_value_t = 40)]
    pub top: usize,
    /// table: the opreport-like tables (by symbol; by process and symbol when the run named
    /// guest tasks; the system-wide view with --trace); json: the (process, symbol) rows
    /// (schema vpmu-profile/1); folded: flame-graph input (`process;symbol[;[vmm] exit] count`);
    /// svg: that flame graph drawn.
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    pub format: ReportFormat,
    /// The guest's root filesystem as a directory on the host (a mounted image, or the
    /// `files/` directory `guest-image/build.sh rootfs` keeps beside its image): user-space
    /// samples then resolve to the executable's functions.
    #[arg(long, value_name = "DIR")]
    pub guest_files: Option<PathBuf>,
    /// Only the samples counted in this accounting mode (a run that switched modes at run time
    /// tags each sample with its mode).
    #[arg(long, value_enum)]
    pub mode: Option<ModeFilter>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeFilter {
    CpuSwitch,
    DomainSwitch,
}

impl ModeFilter {
    fn mode(self) -> vpmu::AccountingMode {
        match self {
            ModeFilter::CpuSwitch => vpmu::AccountingMode::CpuSwitch,
            ModeFilter::DomainSwitch => vpmu::AccountingMode::DomainSwitch,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    Table,
    Json,
    Folded,
    Svg,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Trace(#[from] CommandError),
    #[error(transparent)]
    Symbols(#[from] SymbolsError),
    #[error("{0}: no profile samples in this file (record them with `run --host-profile FILE`)")]
    NoSamples(String),
    #[error(transparent)]
    Stacks(#[from] super::stacks::StacksError),
    #[error("writing the report: {0}")]
    Write(std::io::Error),
    #[error(transparent)]
    GuestFiles(#[from] super::user_symbols::UserSymbolsError),
}

/// Samples per bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Row {
    pub name: String,
    pub samples: u64,
    /// Of which taken while the VMM handled an exit.
    pub in_exit: u64,
}

/// Samples per bucket, most first (ties by name).
pub fn profile(t: &dyn Records, syms: Option<&SymbolTable>) -> Result<Vec<Row>, FormatError> {
    profile_in(t, syms, None)
}

/// The accounting modes the file's samples were counted in (run-time switches give several).
pub fn sample_modes(t: &dyn Records) -> Result<Vec<vpmu::AccountingMode>, FormatError> {
    let mut modes = Vec::new();
    t.for_each(&mut |_, r| {
        if let Record::Sample { mode: Some(m), .. } = *r {
            if !modes.contains(&m) {
                modes.push(m);
            }
        }
    })?;
    modes.sort_by_key(|m| m.index());
    Ok(modes)
}

/// Like [`profile`], only the samples counted in `mode` (None: all).
pub(crate) fn profile_in(
    t: &dyn Records,
    syms: Option<&SymbolTable>,
    mode: Option<vpmu::AccountingMode>,
) -> Result<Vec<Row>, FormatError> {
    let mut rows: HashMap<String, Row> = HashMap::new();
    t.for_each(&mut |_, r| {
        if let Record::Sample {
            rip,
            cpl,
            during,
            mode: m,
            ..
        } = *r
        {
            if mode.is_some() && m != mode {
                return;
            }
            let name = bucket(rip, cpl, syms);
            let row = rows.entry(name.clone()).or_insert_with(|| Row {
                name,
                ..Default::default()
            });
            row.samples += 1;
            row.in_exit += u64::from(during.is_some());
        }
    })?;
    let mut rows: Vec<Row> = rows.into_values().collect();
    rows.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.name.cmp(&b.name)));
    Ok(rows)
}

fn origin(syms: Option<&SymbolTable>) -> String {
    match syms {
        Some(t) => match &t.origin {
            Origin::Kallsyms(p) => format!("kallsyms tables in {p} ({} code symbols)", t.len()),
            Origin::SystemMap(p) => format!("System.map {p} ({} code symbols)", t.len()),
        },
        None => "none (addresses shown raw)".into(),
    }
}

fn limit<T>(rows: &[T], top: usize) -> &[T] {
    if top == 0 {
        rows
    } else {
        &rows[..rows.len().min(top)]
    }
}

/// The opreport-like table.
pub fn render_profile(h: &Header, rows: &[Row], syms: Option<&SymbolTable>, top: usize) -> String {
    let total: u64 = rows.iter().map(|r| r.samples).sum();
    let in_exit: u64 = rows.iter().map(|r| r.in_exit).sum();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "host-side profile: {total} samples from {} vCPU(s); clock: {}, one sample per {:.3} ms",
        h.vcpus,
        h.sample_clock.describe(),
        h.sample_period_ns as f64 / 1e6
    );
    let _ = writeln!(out, "symbols: {}", origin(syms));
    let _ = writeln!(
        out,
        "{in_exit} samples arrived while the VMM handled an exit (charged to the guest RIP that caused it)"
    );
    let _ = writeln!(
        out,
        "\n{:>9} {:>7} {:>8}  symbol",
        "samples", "%", "in-exit"
    );
    for r in limit(rows, top) {
        let _ = writeln!(
            out,
            "{:>9} {:>7.2} {:>8}  {}",
            r.samples,
            r.samples as f64 * 100.0 / total.max(1) as f64,
            r.in_exit,
            r.name
        );
    }
    if top != 0 && rows.len() > top {
        let rest: u64 = rows[top..].iter().map(|r| r.samples).sum();
        let _ = writeln!(
            out,
            "{:>9} {:>7.2} {:>8}  ({} more symbols; --top 0 shows all)",
            rest,
            rest as f64 * 100.0 / total.max(1) as f64,
            "",
            rows.len() - top
        );
    }
    out
}

/// The (process, symbol) table: which guest task each sample interrupted.
pub fn render_by_process(rows: &[stacks::ProcessRow], top: usize) -> String {
    let total: u64 = rows.iter().map(|r| r.samples).sum();
    let width = limit(rows, top)
        .iter()
        .map(|r| r.process.len())
        .max()
        .unwrap_or(7)
        .clamp(7, 48);
    let owidth = limit(rows, top)
        .iter()
        .map(|r| r.object.len())
        .max()
        .unwrap_or(6)
        .clamp(6, 40);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nby guest process (the task each sample interrupted, read from guest memory; \
         comm[tgid]):\n\n{:>9} {:>7} {:>8}  {:<width$}  {:<owidth$}  symbol",
        "samples", "%", "in-exit", "process", "object"
    );
    for r in limit(rows, top) {
        let _ = writeln!(
            out,
            "{:>9} {:>7.2} {:>8}  {:<width$}  {:<owidth$}  {}",
            r.samples,
            r.samples as f64 * 100.0 / total.max(1) as f64,
            r.in_exit,
            r.process,
            if r.object.is_empty() { "-" } else { &r.object },
            r.symbol
        );
    }
    if top != 0 && rows.len() > top {
        let rest: u64 = rows[top..].iter().map(|r| r.samples).sum();
        let _ = writeln!(
            out,
            "{rest:>9} {:>7.2} {:>8}  ({} more rows; --top 0 shows all)",
            rest as f64 * 100.0 / total.max(1) as f64,
            "",
            rows.len() - top
        );
    }
    out
}

/// One row of the system-wide view.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeRow {
    pub name: String,
    pub ms: f64,
}

/// Guest symbols (samples outside exit handling x period) and `[vmm] ...` pseudo-symbols
/// (measured exit-handling time), most time first.
pub fn system_wide(
    t: &dyn Records,
    syms: Option<&SymbolTable>,
) -> Result<Vec<TimeRow>, FormatError> {
    let h = t.header();
    let period_ms = h.sample_period_ns as f64 / 1e6;
    let mut guest: HashMap<String, u64> = HashMap::new();
    t.for_each(&mut |_, r| {
        if let Record::Sample {
            rip,
            cpl,
            during: None,
            ..
        } = *r
        {
            *guest.entry(bucket(rip, cpl, syms)).or_default() += 1;
        }
    })?;
    let mut rows: Vec<TimeRow> = guest
        .into_iter()
        .map(|(name, n)| TimeRow {
            name,
            ms: n as f64 * period_ms,
        })
        .collect();
    let s = summary::summarize(t)?;
    let preempted: u64 = s.vcpus.iter().map(|v| v.interrupted_off_cpu).sum();
    for (key, st) in &s.events {
        let off = if key == Reason::Interrupted.name() {
            preempted
        } else {
            0
        };
        rows.push(TimeRow {
            name: format!("[vmm] {key}"),
            ms: h.secs(st.total().saturating_sub(off)) * 1e3,
        });
    }
    rows.push(TimeRow {
        name: "[host] vCPU thread preempted during interrupted exits".into(),
        ms: h.secs(preempted) * 1e3,
    });
    // What neither accounts for: halted, off-CPU (host preemption), or not sampled.
    let wall_ms: f64 = s.vcpus.iter().map(|v| h.secs(v.split.wall) * 1e3).sum();
    let accounted: f64 = rows.iter().map(|r| r.ms).sum();
    rows.push(TimeRow {
        name: REST.into(),
        ms: (wall_ms - accounted).max(0.0),
    });
    rows.retain(|r| r.ms > 0.0);
    rows.sort_by(|a, b| b.ms.total_cmp(&a.ms).then(a.name.cmp(&b.name)));
    Ok(rows)
}

pub fn render_system_wide(t: &dyn Records, rows: &[TimeRow], top: usize) -> String {
    let h = t.header();
    let total: f64 = rows.iter().map(|r| r.ms).sum();
    let run_ms = h.secs(t.end_tsc().saturating_sub(h.start_tsc)) * 1e3;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nsystem-wide view: guest symbols = samples taken in the guest x {:.3} ms; [vmm] rows = \
         exit handling measured with the TSC; total {:.1} ms for {} vCPU(s) x the {:.1} ms run",
        h.sample_period_ns as f64 / 1e6,
        total,
        h.vcpus,
        run_ms
    );
    let _ = writeln!(out, "\n{:>11} {:>7}  symbol", "ms", "%");
    for r in limit(rows, top) {
        let _ = writeln!(
            out,
            "{:>11.3} {:>7.2}  {}",
            r.ms,
            r.ms * 100.0 / total.max(f64::MIN_POSITIVE),
            r.name
        );
    }
    if top != 0 && rows.len() > top {
        let rest: f64 = rows[top..].iter().map(|r| r.ms).sum();
        let _ = writeln!(
            out,
            "{rest:>11.3} {:>7.2}  ({} more rows; --top 0 shows all)",
            rest * 100.0 / total.max(f64::MIN_POSITIVE),
            rows.len() - top
        );
    }
    let over = total - run_ms * f64::from(h.vcpus);
    if over > 0.005 * total {
        let _ = writeln!(
            out,
            "(the rows exceed vCPUs x run by {over:.1} ms: the sample clock also ran while the VMM \
             handled interrupted exits, which the [vmm] interrupted row measures too; guest rows \
             are estimates from samples)"
        );
    }
    out
}

/// The symbols to use: --system-map, --kernel, or the kernel the file says was booted.
pub(crate) fn symbols_for(
    h: &Header,
    kernel: Option<&Path>,
    system_map: Option<&Path>,
) -> Result<Option<SymbolTable>, SymbolsError> {
    if let Some(m) = system_map {
        return SymbolTable::from_system_map(m).map(Some);
    }
    if let Some(k) = kernel {
        return SymbolTable::from_kernel(k).map(Some);
    }
    if h.kernel.is_empty() {
        return Ok(None);
    }
    let k = PathBuf::from(&h.kernel);
    if !k.exists() {
        log::warn!(
            "the kernel the run booted ({}) is gone: addresses are shown raw (give --kernel or --system-map)",
            k.display()
        );
        return Ok(None);
    }
    SymbolTable::from_kernel(&k).map(Some)
}

pub fn command(args: &ReportArgs) -> Result<(), ReportError> {
    // The file is read once per view below, record by record: memory follows the rows shown,
    // not the file's length.
    let t = open(&args.file)?;
    let read = |e: FormatError| ReportError::Trace(read_error(&args.file, e));
    if !t.has_samples() {
        return Err(ReportError::NoSamples(args.file.display().to_string()));
    }
    let h = t.header();
    let syms = symbols_for(h, args.kernel.as_deref(), args.system_map.as_deref())?;
    let mut files = match &args.guest_files {
        Some(d) => Some(super::user_symbols::GuestFiles::open(d)?),
        None => None,
    };
    let per_sample = stacks::samples(
        &t,
        syms.as_ref(),
        args.mode.map(ModeFilter::mode),
        files.as_mut(),
    )
    .map_err(read)?;
    let write = |bytes: &[u8]| {
        use std::io::Write as _;
        std::io::stdout()
            .write_all(bytes)
            .map_err(ReportError::Write)
    };
    match args.format {
        ReportFormat::Table => {}
        ReportFormat::Json => {
            let rows = stacks::by_process(&per_sample);
            let doc = stacks::json(h, &rows, &origin(syms.as_ref()));
            return write(format!("{doc:#}\n").as_bytes());
        }
        ReportFormat::Folded => return write(stacks::folded(&per_sample).as_bytes()),
        ReportFormat::Svg => {
            let title = format!("vpmu-vmm host-side profile: {}", args.file.display());
            return write(&stacks::flame_graph(&stacks::folded(&per_sample), &title)?);
        }
    }
    let only = args.mode.map(ModeFilter::mode);
    let rows = profile_in(&t, syms.as_ref(), only).map_err(read)?;
    let mut out = render_profile(h, &rows, syms.as_ref(), args.top);
    if stacks::names_tasks(&per_sample) {
        out.push_str(&render_by_process(
            &stacks::by_process(&per_sample),
            args.top,
        ));
    }
    let modes = sample_modes(&t).map_err(read)?;
    if modes.len() > 1 && only.is_none() {
        // The run switched accounting modes: each mode's samples on their own.
        for m in modes {
            let rows = profile_in(&t, syms.as_ref(), Some(m)).map_err(read)?;
            let _ = writeln!(out, "\nsamples counted in {} only:", m.name());
            out.push_str(&render_profile(h, &rows, syms.as_ref(), args.top));
        }
    }
    if t.has_exits() {
        let rows = system_wide(&t, syms.as_ref()).map_err(read)?;
        out.push_str(&render_system_wide(&t, &rows, args.top));
    }
    print!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::symbols::{UNKNOWN_KERNEL, USER_BUCKET, USER_BUCKET_NAMED};
    use crate::trace::format::{ExitEvent, Trace, VcpuTrace, CONTENTS_EXITS, CONTENTS_SAMPLES};

    fn sample(rip: u64, cpl: u8, during: bool) -> Record {
        Record::Sample {
            rip,
            cpl,
            tsc: 10,
            during: during.then_some((ExitEvent::new(Reason::IoOut), 5)),
            mode: Some(vpmu::AccountingMode::DomainSwitch),
        }
    }

    fn trace() -> Trace {
        let mut out = ExitEvent::new(Reason::IoOut);
        out.detail = 0x2f8;
        out.flags = 1 | (1 << 1);
        Trace {
            header: Header::for_tests(CONTENTS_EXITS | CONTENTS_SAMPLES),
            vcpus: vec![VcpuTrace {
                records: vec![
                    Record::Clock {
                        tsc: 0,
                        thread_cpu_ns: 0,
                    },
                    sample(0xffff_ffff_8100_0010, 0, false),
                    sample(0xffff_ffff_8100_0020, 0, false),
                    sample(0xffff_ffff_8100_0110, 0, true),
                    sample(0x40_0000, 3, false),
                    sample(0xffff_ffff_9000_0000, 0, false),
                    Record::Exit {
                        event: out,
                        exit_tsc: 100,
                        entry_tsc: 2100,
                    },
                ],
                dropped: 0,
                end_tsc: 10_000,
                end_thread_cpu_ns: 10_000_000,
            }],
        }
    }

    fn syms() -> SymbolTable {
        SymbolTable::parse_system_map(
            "ffffffff81000000 T hot_function\nffffffff81000100 t io_function\n",
            "m",
        )
        .unwrap()
    }

    #[test]
    fn samples_split_by_the_mode_they_were_counted_in() {
        let mut t = trace();
        assert_eq!(
            sample_modes(&t).unwrap(),
            vec![vpmu::AccountingMode::DomainSwitch]
        );
        t.vcpus[0].records.push(Record::Sample {
            rip: 0xffff_ffff_8100_0110,
            cpl: 0,
            tsc: 20,
            during: None,
            mode: Some(vpmu::AccountingMode::CpuSwitch),
        });
        assert_eq!(
            sample_modes(&t).unwrap(),
            vec![
                vpmu::AccountingMode::CpuSwitch,
                vpmu::AccountingMode::DomainSwitch
            ]
        );
        let cpu = profile_in(&t, Some(&syms()), Some(vpmu::AccountingMode::CpuSwitch)).unwrap();
        assert_eq!(cpu.len(), 1);
        assert_eq!((cpu[0].name.as_str(), cpu[0].samples), ("io_function", 1));
        let dom = profile_in(&t, Some(&syms()), Some(vpmu::AccountingMode::DomainSwitch)).unwrap();
        assert_eq!(dom.iter().map(|r| r.samples).sum::<u64>(), 5);
        assert_eq!(
            profile(&t, Some(&syms()))
                .unwrap()
                .iter()
                .map(|r| r.samples)
                .sum::<u64>(),
            6
        );
    }

    #[test]
    fn samples_go_to_symbols_user_and_unknown_buckets() {
        let t = trace();
        let rows = profile(&t, Some(&syms())).unwrap();
        let get = |n: &str| rows.iter().find(|r| r.name == n).cloned().unwrap();
        assert_eq!(rows[0].name, "hot_function");
        assert_eq!(get("hot_function").samples, 2);
        assert_eq!(
            get("io_function"),
            Row {
                name: "io_function".into(),
                samples: 1,
                in_exit: 1
            }
        );
        assert_eq!(get(USER_BUCKET).samples, 1);
        assert_eq!(get(UNKNOWN_KERNEL).samples, 1);
        let text = render_profile(&t.header, &rows, Some(&syms()), 0);
        assert!(
            text.contains("hot_function") && text.contains("40.00"),
            "{text}"
        );
        let raw = profile(&t, None).unwrap();
        assert!(raw
            .iter()
            .any(|r| r.name == "[no symbols] 0xffffffff81000010"));
    }

    #[test]
    fn the_process_table_names_each_samples_task() {
        let mut t = trace();
        let samples = |t: &Trace| stacks::samples(t, Some(&syms()), None, None).unwrap();
        assert!(!stacks::names_tasks(&samples(&t)));
        let mut comm = [0u8; crate::guest_task::COMM_MAX];
        comm[..4].copy_from_slice(b"spin");
        // The user-space sample (index 4) names its task.
        t.vcpus[0].records.insert(
            5,
            Record::Task {
                cr3: 0x5000,
                task: Ok(crate::guest_task::GuestTask {
                    pid: 9,
                    tgid: 9,
                    comm,
                    kernel_thread: false,
                }),
            },
        );
        assert!(stacks::names_tasks(&samples(&t)));
        let rows = stacks::by_process(&samples(&t));
        let text = render_by_process(&rows, 0);
        assert!(
            text.contains("spin[9]") && text.contains(USER_BUCKET_NAMED),
            "{text}"
        );
        assert!(
            text.contains(stacks::NO_PROCESS),
            "samples without a task record: {text}"
        );
        // The symbol table is unchanged by task records.
        assert_eq!(
            profile(&t, Some(&syms()))
                .unwrap()
                .iter()
                .map(|r| r.samples)
                .sum::<u64>(),
            5
        );
    }

    #[test]
    fn system_wide_view_puts_vmm_time_beside_guest_symbols() {
        let t = trace();
        let rows = system_wide(&t, Some(&syms())).unwrap();
        let ms = |n: &str| rows.iter().find(|r| r.name == n).map(|r| r.ms);
        // 2 samples x 1 ms; the sample taken during the exit is left to the [vmm] row.
        assert_eq!(ms("hot_function"), Some(2.0));
        assert_eq!(ms("io_function"), None);
        // 2000 ticks at 1 MHz.
        assert_eq!(ms("[vmm] pio 0x2f8 out"), Some(2.0));
        // The rows add up to the run: 10 ms - 2 (guest) - 2 (vmm) - 1 (user) - 1 (unknown).
        assert_eq!(ms(REST), Some(4.0));
        assert!(render_system_wide(&t, &rows, 0).contains("[vmm] pio 0x2f8 out"));
    }
}
