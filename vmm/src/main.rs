use std::process::ExitCode;

use clap::Parser;
use runtime::end::code;
use vmm::cli::{Cli, Command, TraceCommand};

fn main() -> ExitCode {
    let started = std::time::Instant::now();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { code::USAGE as u8 } else { 0 });
        }
    };
    let level = match cli.verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_timestamp(None)
        .format_target(false)
        .init();

    if matches!(cli.command, Command::Run(_) | Command::Compare(_)) {
        if let Err(e) = runtime::stop_signal::install() {
            log::warn!("cannot catch SIGINT/SIGTERM ({e}): they will kill the run outright");
        }
    } else {
        confine_offline();
    }
    match cli.command {
        Command::Compare(args) => match vmm::compare::command(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(e.exit_code() as u8)
            }
        },
        Command::Results(args) => {
            match analysis::guest_results::command(
                &args.file,
                &args.out,
                args.format == vmm::cli::Format::Json,
            ) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(code::ERROR as u8),
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(code::ERROR as u8)
                }
            }
        }
        Command::Run(args) => {
            let cfg = match args.to_config(started) {
                Ok(c) => c,
                Err(msg) => {
                    eprintln!("error: {msg}");
                    return ExitCode::from(code::USAGE as u8);
                }
            };
            match runtime::vm::run(&cfg) {
                Ok(report) => {
                    vmm::report::print(&report);
                    if let Some(f) = &args.report_json {
                        if let Err(e) = vmm::report::write_json(f, &report) {
                            // The run's own end and exit code stand; the file is extra.
                            eprintln!("error: --report-json {}: {e}", f.display());
                        }
                    }
                    ExitCode::from(report.end.exit_code() as u8)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(code::ERROR as u8)
                }
            }
        }
        Command::Trace(TraceCommand::Summary(args)) => {
            done(analysis::trace::command::summary(&args))
        }
        Command::Report(args) => done(analysis::profile::report::command(&args)),
        Command::TaskLayout(args) => done(runtime::profile::btf_layout::command(&args)),
    }
}

/// The offline commands (`report`, `trace summary`, `results`, `task-layout`) read files a user
/// hands in, some written by a guest: they run under the main thread's seccomp filter
/// (docs/security.md), which lets them read and write files but not start processes, open
/// sockets, or make KVM or perf calls. Where the kernel has no seccomp, they run unfiltered
/// (said on stderr).
fn confine_offline() {
    let confined =
        runtime::seccomp::filters().and_then(|f| f.apply(runtime::seccomp::ThreadKind::Main));
    if let Err(e) = confined {
        log::warn!("seccomp: {e}: running without a filter");
    }
}

/// Exit 0, or print the error and exit 1 (bad or unreadable input).
fn done<E: std::fmt::Display>(r: Result<(), E>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(code::ERROR as u8)
        }
    }
}
