//! `trace summary` and `report` on bad input: a one-line error, exit code 1 (2 for usage), no
//! panic. Files are made with the library's own encoder.

use std::path::Path;
use std::process::Command;

use analysis::trace::format::{
    block_header, end_record, ExitEvent, Header, Reason, Record, SampleClock, CONTENTS_EXITS,
    CONTENTS_SAMPLES, RECORD_SIZE,
};

const BIN: &str = env!("CARGO_BIN_EXE_vpmu-vmm");

fn vmm(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("panicked") && !stderr.contains("stack backtrace"),
        "{args:?}: {stderr}"
    );
    (
        out.status.code().expect("exited by signal"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

/// A small valid trace: port writes and, with `samples`, profile samples.
fn trace_file(path: &Path, samples: bool) {
    trace_file_to(path, samples, 20_000);
}

/// The same, with the run ending at TSC `end` (1 GHz).
fn trace_file_to(path: &Path, samples: bool, end: u64) {
    let mut f = Header {
        vcpus: 1,
        contents: CONTENTS_EXITS | if samples { CONTENTS_SAMPLES } else { 0 },
        tsc_khz: 1_000_000,
        start_tsc: 1000,
        sample_clock: if samples {
            SampleClock::CpuSwitch
        } else {
            SampleClock::None
        },
        sample_period_ns: 1_000_000,
        kernel: String::new(),
    }
    .encode();
    let mut body = Vec::new();
    let mut ev = ExitEvent::new(Reason::IoOut);
    ev.detail = 0x2f8;
    ev.flags = 1 | (1 << 1);
    for i in 0..100u64 {
        let mut recs = vec![Record::Exit {
            event: ev,
            exit_tsc: 2000 + 100 * i,
            entry_tsc: 2050 + 100 * i,
        }];
        if samples {
            recs.push(Record::Sample {
                rip: 0xffff_ffff_8100_0000 + i,
                cpl: 0,
                tsc: 2060 + 100 * i,
                during: None,
                mode: Some(if i % 2 == 0 {
                    vpmu::AccountingMode::CpuSwitch
                } else {
                    vpmu::AccountingMode::DomainSwitch
                }),
            });
        }
        for r in recs {
            let mut b = [0u8; RECORD_SIZE];
            r.encode(&mut b);
            body.extend_from_slice(&b);
        }
    }
    let n = (body.len() / RECORD_SIZE) as u32;
    f.extend_from_slice(&block_header(0, false, n, 0, &body));
    f.extend_from_slice(&body);
    let end = end_record(end, 0, 0);
    f.extend_from_slice(&block_header(0, true, 1, 0, &end));
    f.extend_from_slice(&end);
    std::fs::write(path, f).unwrap();
}

#[test]
fn good_files_are_summarised_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t");
    trace_file(&p, true);
    let p = p.to_str().unwrap();
    let (code, out, err) = vmm(&["trace", "summary", p, "--interval", "0.000005"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("pio-out") && out.contains("start_s,exits_per_s"),
        "{out}"
    );
    let svg = dir.path().join("t.svg");
    let (code, _, err) = vmm(&["trace", "summary", p, "--svg", svg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("</svg>"));
    let (code, out, _) = vmm(&["trace", "summary", p, "--dump"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 201, "{out}");
    let map = dir.path().join("map");
    std::fs::write(&map, "ffffffff81000000 T some_function\n").unwrap();
    let (code, out, err) = vmm(&["report", p, "--system-map", map.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("100  100.00") && out.contains("some_function"),
        "{out}"
    );
    assert!(out.contains("[vmm] pio 0x2f8 out"), "{out}");
    // The other formats, on a file without task records (no process information).
    let m = map.to_str().unwrap();
    let (code, out, err) = vmm(&["report", p, "--system-map", m, "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["schema"], "vpmu-profile/1");
    assert_eq!(doc["samples"], 100);
    assert_eq!(doc["rows"][0]["process"], "[no process information]");
    let (code, out, err) = vmm(&["report", p, "--system-map", m, "--format", "folded"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .all(|l| l.starts_with("[no process information];")),
        "{out}"
    );
    let (code, out, err) = vmm(&["report", p, "--system-map", m, "--format", "svg"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("<?xml") && out.contains("</svg>"));
    // Guest files that are not there: a clear error, exit 1.
    let (code, _, err) = vmm(&["report", p, "--guest-files", "/nonexistent/dir"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--guest-files /nonexistent/dir"), "{err}");
}

#[test]
fn corrupt_truncated_and_wrong_files_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    trace_file(&good, true);
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.path().join("cut");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let mut damaged = bytes.clone();
    damaged[200] ^= 0x10;
    let bad = dir.path().join("bad");
    std::fs::write(&bad, damaged).unwrap();
    let junk = dir.path().join("junk");
    std::fs::write(&junk, "hello").unwrap();
    let exits_only = dir.path().join("exits");
    trace_file(&exits_only, false);
    let long = dir.path().join("long");
    trace_file_to(&long, false, 10_000_000_000);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["trace".into(), "summary".into(), s(&cut)], "truncated"),
        (vec!["report".into(), s(&cut)], "truncated"),
        (vec!["trace".into(), "summary".into(), s(&bad)], "checksum"),
        (
            vec!["trace".into(), "summary".into(), s(&junk)],
            "not a vpmu-vmm trace",
        ),
        (
            vec![
                "trace".into(),
                "summary".into(),
                s(&dir.path().join("none")),
            ],
            "cannot read",
        ),
        (vec!["report".into(), s(&exits_only)], "no profile samples"),
        (
            vec!["report".into(), s(&good), "--system-map".into(), s(&junk)],
            "not a System.map line",
        ),
        (
            vec!["report".into(), s(&good), "--kernel".into(), s(&junk)],
            "not an ELF vmlinux or a bzImage",
        ),
        (
            vec![
                "trace".into(),
                "summary".into(),
                s(&good),
                "--interval=-1".into(),
            ],
            "--interval",
        ),
        (
            // 10 s of run in 1 us intervals: 10 million rows, more than the reader holds.
            vec![
                "trace".into(),
                "summary".into(),
                s(&long),
                "--interval=0.000001".into(),
            ],
            "choose a longer one",
        ),
        (
            // A damaged record is found while the records stream: an error, nothing printed.
            vec!["report".into(), s(&bad)],
            "checksum",
        ),
        (
            vec!["task-layout".into(), s(&junk)],
            "not an ELF vmlinux or a bzImage",
        ),
    ];
    for (args, want) in cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, err) = vmm(&a);
        assert_eq!(code, 1, "{a:?}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(lines.len(), 1, "{a:?}: {err}");
        assert!(lines[0].contains(want), "{a:?}: {err}");
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        vec![
            "run",
            "--kernel",
            "k",
            "--host-profile",
            "p",
            "--host-profile-hz",
            "0",
        ],
        vec!["report", "f", "--kernel", "k", "--system-map", "m"],
        vec!["report", "f", "--format", "pdf"],
        // A task layout names the tasks of host-profile samples: without one, it is a mistake.
        vec!["run", "--kernel", "k", "--task-layout", "l"],
        vec!["trace"],
    ] {
        let (code, _, err) = vmm(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
}
