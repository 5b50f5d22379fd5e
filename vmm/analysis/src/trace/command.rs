//! `vpmu-vmm trace summary FILE [--interval SECS] [--svg OUT] [--dump]`.

use std::io::Write;
use std::path::PathBuf;

use super::format::FormatError;
use super::read::{Records, TraceFile};
use super::{series, summary};

/// `trace summary`'s arguments (part of the command line in `cli.rs`).
#[derive(clap::Args, Debug)]
pub struct SummaryArgs {
    /// Trace file (`run --trace FILE`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Also print a CSV time series with one row per SECS seconds.
    #[arg(long, value_name = "SECS")]
    pub interval: Option<f64>,
    /// Draw the time series into an SVG file (interval: --interval, or 1/50 of the run).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Print one line per record (time, vCPU, event, detail), all vCPUs merged in time order,
    /// instead of the tables.
    #[arg(long)]
    pub dump: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{file}: {source}")]
    Read { file: String, source: FormatError },
    #[error("--interval {0}: must be a positive number of seconds")]
    Interval(f64),
    #[error("--interval {secs}: the run needs {count} intervals of that length (at most {MAX_INTERVALS}); choose a longer one")]
    TooManyIntervals { secs: f64, count: u64 },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Most rows `--interval` prints (and buckets it holds).
pub(crate) const MAX_INTERVALS: u64 = 1_000_000;

/// Opens a trace file for the views (its structure checked; records read as they go).
pub fn open(file: &std::path::Path) -> Result<TraceFile, CommandError> {
    TraceFile::open(file).map_err(|e| read_error(file, e))
}

pub(crate) fn read_error(file: &std::path::Path, source: FormatError) -> CommandError {
    CommandError::Read {
        file: file.display().to_string(),
        source,
    }
}

/// `trace summary`; a closed stdout (`| head`) ends it quietly.
pub fn summary(args: &SummaryArgs) -> Result<(), CommandError> {
    match run_summary(args) {
        Err(CommandError::Write { source, .. })
            if source.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            Ok(())
        }
        r => r,
    }
}

fn run_summary(args: &SummaryArgs) -> Result<(), CommandError> {
    if let Some(i) = args.interval.filter(|i| !(i.is_finite() && *i > 0.0)) {
        return Err(CommandError::Interval(i));
    }
    let t = open(&args.file)?;
    let read = |e| read_error(&args.file, e);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let io = |source| CommandError::Write {
        path: "stdout".into(),
        source,
    };
    if args.dump {
        summary::dump(&t, &mut out).map_err(|e| match e {
            summary::DumpError::Read(e) => read(e),
            summary::DumpError::Write(e) => io(e),
        })?;
    } else {
        let s = summary::summarize(&t).map_err(read)?;
        out.write_all(summary::render(&t, &s, &args.file.display().to_string()).as_bytes())
            .map_err(io)?;
    }
    let run_s = t
        .header()
        .secs(t.end_tsc().saturating_sub(t.header().start_tsc));
    if args.interval.is_some() || args.svg.is_some() {
        let secs = args.interval.unwrap_or((run_s / 50.0).max(1e-3));
        let count = series::interval_count(&t, secs);
        if count > MAX_INTERVALS {
            return Err(CommandError::TooManyIntervals { secs, count });
        }
        let iv = series::intervals(&t, secs).map_err(read)?;
        if args.interval.is_some() {
            writeln!(out, "\ntime series, {secs} s intervals (all vCPUs):").map_err(io)?;
            out.write_all(series::csv(&iv, secs).as_bytes())
                .map_err(io)?;
        }
        if let Some(path) = &args.svg {
            let title = format!("{} ({secs} s intervals)", args.file.display());
            std::fs::write(path, series::svg(&iv, secs, &title)).map_err(|source| {
                CommandError::Write {
                    path: path.clone(),
                    source,
                }
            })?;
        }
    }
    Ok(())
}
