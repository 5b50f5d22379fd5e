//! T2: the readers' memory (issue 19's limit): `trace summary` (its tables, and `--dump`: every
//! record in time order) and `report` on a synthetic trace of N records and on one 4x longer,
//! each in a child process of its own (this binary again, `--reader-child ...`, running the real
//! command through `vmm::cli`), whose peak RSS comes from wait4(2). The files hold what a domain-switch `run --trace --host-profile` writes: exits of
//! a few kinds on a few ports/MSRs/MMIO addresses, clock records, and samples at a bounded set of
//! guest RIPs with task, exe and call-frame notes, two vCPUs in interleaved blocks. Goal: the 4x
//! file's peak within 10% of the 1x file's, for each command.

use std::io::Write;
use std::path::{Path, PathBuf};

use analysis::trace::format::{
    block_header, end_record, ExitEvent, Header, Reason, Record, SampleClock, CONTENTS_EXITS,
    CONTENTS_SAMPLES, RECORD_SIZE,
};
use runtime::profile::guest_task::{GuestExe, GuestTask, COMM_MAX, EXE_NAME_MAX};

/// Records per vCPU block (the writer's buffers are of this order).
const BLOCK: usize = 4096;

/// The `i`th record group of vCPU `v`: one exit, and every fourth time a sample with notes or a
/// clock record. Values cycle through small sets, so the views' rows do not grow with the file.
fn group(i: u64, v: u16, out: &mut Vec<Record>) {
    let tsc = 1_000 + i * 2_000;
    let reasons = [
        (Reason::IoOut, 0x3f8, 0),
        (Reason::IoIn, 0x60, 0),
        (Reason::MsrWrite, 0xc001_0000, 0),
        (Reason::MsrRead, 0xc001_0004, 0),
        (Reason::MmioWrite, 0, 0xd000_0050),
        (Reason::Hlt, 0, 0),
        (Reason::Interrupted, 0, 0),
    ];
    let (reason, detail, addr) = reasons[(i % reasons.len() as u64) as usize];
    let mut event = ExitEvent::new(reason);
    event.detail = detail;
    event.addr = addr;
    event.flags = u8::from(matches!(
        reason,
        Reason::IoOut | Reason::MsrWrite | Reason::MmioWrite
    ));
    out.push(Record::Exit {
        event,
        exit_tsc: tsc,
        // Durations spread over four decades, as real exits' are.
        entry_tsc: tsc + 10 + (i * 7919) % 1_000 * ((i % 4) + 1).pow(3),
    });
    match i % 4 {
        0 => out.push(Record::Clock {
            tsc: tsc + 1_500,
            thread_cpu_ns: i * 1_900,
        }),
        1 => {
            let user = i.is_multiple_of(3);
            out.push(Record::Sample {
                rip: if user {
                    0x40_1000 + (i % 200) * 16
                } else {
                    0xffff_ffff_8100_0000 + (i % 2_000) * 64
                },
                cpl: if user { 3 } else { 0 },
                tsc: tsc + 1_600,
                during: i.is_multiple_of(5).then_some((event, tsc)),
                mode: Some(vpmu::AccountingMode::DomainSwitch),
            });
            let pid = 100 + (i % 8) as u32 + u32::from(v) * 10;
            let mut comm = [0u8; COMM_MAX];
            comm[..4].copy_from_slice(b"work");
            out.push(Record::Task {
                cr3: 0x10_0000 + u64::from(pid) * 0x1000,
                task: Ok(GuestTask {
                    pid,
                    tgid: pid,
                    comm,
                    kernel_thread: false,
                }),
            });
            if user {
                let mut name = [0u8; EXE_NAME_MAX];
                name[..4].copy_from_slice(b"work");
                out.push(Record::Exe(Ok(GuestExe {
                    name,
                    name_len: 4,
                    start_code: 0x40_1000,
                    code_size: 0x2000,
                })));
            }
            out.push(Record::CallFrames {
                count: 3,
                addrs: if user {
                    [0x40_1100, 0x40_1200 + (i % 4) * 8, 0x40_1300]
                } else {
                    [
                        0xffff_ffff_8100_4000,
                        0xffff_ffff_8100_8000 + (i % 16) * 64,
                        0xffff_ffff_8100_c000,
                    ]
                },
            });
        }
        _ => {}
    }
}

/// Writes a two-vCPU trace of about `records` records to `path`.
fn write_trace(path: &Path, records: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create trace"));
    let header = Header {
        vcpus: 2,
        contents: CONTENTS_EXITS | CONTENTS_SAMPLES,
        tsc_khz: 2_000_000,
        start_tsc: 0,
        sample_clock: SampleClock::DomainSwitch,
        sample_period_ns: 1_000_000,
        kernel: String::new(),
    };
    f.write_all(&header.encode()).unwrap();
    let mut next = [0u64; 2];
    let (mut written, mut end) = (0u64, 0u64);
    let mut recs = Vec::with_capacity(BLOCK + 8);
    let mut body = Vec::with_capacity((BLOCK + 8) * RECORD_SIZE);
    while written < records {
        for v in 0..2u16 {
            recs.clear();
            while recs.len() < BLOCK {
                group(next[usize::from(v)], v, &mut recs);
                next[usize::from(v)] += 1;
            }
            body.clear();
            for r in &recs {
                let mut b = [0u8; RECORD_SIZE];
                r.encode(&mut b);
                body.extend_from_slice(&b);
            }
            f.write_all(&block_header(v, false, recs.len() as u32, 0, &body))
                .unwrap();
            f.write_all(&body).unwrap();
            written += recs.len() as u64;
            end = end.max(recs.iter().map(Record::tsc).max().unwrap_or(0) + 10_000_000);
        }
    }
    for v in 0..2u16 {
        let e = end_record(end, 0, end / 2);
        f.write_all(&block_header(v, true, 1, 0, &e)).unwrap();
        f.write_all(&e).unwrap();
    }
    f.flush().unwrap();
}

/// Runs `vpmu-vmm ARGS` in a child (this binary, `--reader-child`); its peak RSS in KiB.
// The child is reaped by wait4 below (std's wait() would not give its rusage).
#[allow(clippy::zombie_processes)]
fn peak_rss_kib(args: &[&str]) -> u64 {
    let me = std::env::current_exe().expect("own path");
    let child = std::process::Command::new(me)
        .arg("--reader-child")
        .args(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn reader child");
    let mut status = 0;
    // SAFETY: rusage is plain data that wait4 fills in; all-zero bytes are a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing into the two locals above.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "vpmu-vmm {args:?} failed: status {status:#x}"
    );
    usage.ru_maxrss as u64
}

/// The child: the real command line of `vpmu-vmm`, nothing else.
pub(crate) fn child(args: &[String]) -> ! {
    use clap::Parser;
    let cli = vmm::cli::Cli::parse_from(
        std::iter::once("vpmu-vmm".to_string()).chain(args.iter().cloned()),
    );
    let r = match cli.command {
        vmm::cli::Command::Trace(vmm::cli::TraceCommand::Summary(a)) => {
            analysis::trace::command::summary(&a).map_err(|e| e.to_string())
        }
        vmm::cli::Command::Report(a) => {
            analysis::profile::report::command(&a).map_err(|e| e.to_string())
        }
        _ => Err("only `trace summary` and `report` are measured".into()),
    };
    if let Err(e) = r {
        eprintln!("reader child: {e}");
        std::process::exit(1);
    }
    std::process::exit(0)
}

/// T2; `dir`: where the files go (kept), else a temporary directory.
pub(crate) fn run(records: u64, dir: Option<PathBuf>) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = dir.unwrap_or_else(|| tmp.path().to_path_buf());
    let files: Vec<(u64, PathBuf)> = [records, 4 * records]
        .into_iter()
        .map(|n| (n, dir.join(format!("readers-{n}.trace"))))
        .collect();
    for (n, p) in &files {
        write_trace(p, *n);
    }
    println!("T2 readers' peak RSS (KiB), files of N and 4N records, one child each:");
    for (name, args) in [
        ("trace summary", vec!["trace", "summary"]),
        ("summary --dump", vec!["trace", "summary", "--dump"]),
        ("report", vec!["report", "--top", "0"]),
    ] {
        let mut peaks = Vec::new();
        for (n, p) in &files {
            let mut a = args.clone();
            let path = p.to_str().expect("UTF-8 path");
            a.push(path);
            let size = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
            let kib = peak_rss_kib(&a);
            println!(
                "  {name:<14} {n:>9} records ({:>6.1} MiB file): peak RSS {kib:>7} KiB",
                size as f64 / f64::from(1 << 20)
            );
            peaks.push(kib);
        }
        let ratio = peaks[1] as f64 / peaks[0] as f64;
        println!(
            "  {name:<14} 4N/N peak ratio {ratio:.3} (goal <= 1.10): {}",
            if ratio <= 1.10 { "met" } else { "NOT MET" }
        );
    }
}
