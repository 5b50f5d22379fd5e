//! Bad input on the command line: a one-line error naming the problem, exit code 2 for usage
//! errors and 1 otherwise, never a panic or backtrace.

mod common;

use std::io::Write;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_vpmu-vmm");

struct Outcome {
    code: i32,
    stderr: String,
}

fn vmm(args: &[&str]) -> Outcome {
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
    Outcome {
        code: out.status.code().expect("exited by signal"),
        stderr,
    }
}

fn error_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with("error")).collect()
}

fn write_file(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> String {
    let p = dir.path().join(name);
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let k = write_file(&dir, "vmlinux", &common::tiny_elf(16));
    for (args, needle) in [
        (vec!["run", "--kernel", &k, "--cpus", "0"], "--cpus"),
        (vec!["run", "--kernel", &k, "--cpus", "100"], "--cpus"),
        (vec!["run", "--kernel", &k, "--memory", "1"], "--memory"),
        (vec!["run", "--kernel", &k, "--vpmu", "fast"], "--vpmu"),
        (
            vec!["run", "--kernel", &k, "--pmu-model", "arm"],
            "--pmu-model",
        ),
        (
            vec!["run", "--kernel", &k, "--vpmu-backend", "magic"],
            "--vpmu-backend",
        ),
        (vec!["run", "--kernel", &k, "--timeout=-3"], "--timeout"),
        (vec!["run", "--kernel", &k, "--timeout", "0"], "--timeout"),
        (vec!["run"], "--kernel"),
        (vec!["frobnicate"], "frobnicate"),
        (
            vec!["run", "--kernel", &k, "--net", "--net-rx-pps", "5000"],
            "--net-rx-pps",
        ),
        (vec!["run", "--kernel", &k, "--net-rx-pps", "5"], "--net"),
        (
            vec![
                "run",
                "--kernel",
                &k,
                "--vpmu-schedule",
                "cpu-switch:1,repeat,domain-switch:1",
            ],
            "`repeat` must be the last entry",
        ),
        (
            vec!["compare", "--workload", "packet-rx", "--rounds", "0"],
            "--rounds",
        ),
    ] {
        let o = vmm(&args);
        assert_eq!(o.code, 2, "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains(needle), "{args:?}: {}", o.stderr);
        assert_eq!(error_lines(&o.stderr).len(), 1, "{args:?}: {}", o.stderr);
    }
}

#[test]
fn bad_event_filters_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let k = write_file(&dir, "vmlinux", &common::tiny_elf(16));
    let bad = write_file(&dir, "filter", b"# policy\nallow:\n 0x3c\n 0x1000\n");
    let run = |spec: &str, vpmu: &str| {
        vmm(&[
            "run",
            "--kernel",
            &k,
            "--vpmu",
            vpmu,
            "--pmu-event-filter",
            spec,
        ])
    };
    for (spec, vpmu, needle) in [
        (
            "allow:c0",
            "cpu-switch",
            "\"c0\": event select is not a number",
        ),
        (
            "deny:0x3c/0x100",
            "cpu-switch",
            "unit mask 0x100 is out of range",
        ),
        ("allow:fixed=0x8", "cpu-switch", "fixed-counter bitmap"),
        ("permit:0x3c", "cpu-switch", "neither an inline filter"),
        (
            bad.as_str(),
            "cpu-switch",
            "event select 0x1000 is out of range",
        ),
        ("deny:0x76", "off", "--pmu-event-filter needs the vPMU"),
    ] {
        let o = run(spec, vpmu);
        assert_eq!(o.code, 2, "{spec}: {}", o.stderr);
        assert!(o.stderr.contains(needle), "{spec}: {}", o.stderr);
        assert_eq!(error_lines(&o.stderr).len(), 1, "{spec}: {}", o.stderr);
    }
}

#[test]
fn bad_files_exit_1_with_one_line() {
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("*** /dev/kvm missing: file errors are still checked, after KVM setup fails ***");
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = write_file(&dir, "vmlinux", &common::tiny_elf(4096));
    let text = write_file(&dir, "notes.txt", b"just some text, not a kernel at all");
    // A bzImage whose gzip payload is corrupt.
    let mut bz = vec![0u8; 1024];
    bz[0x1f1] = 1;
    bz[0x201] = 0x6a;
    bz[0x202..0x206].copy_from_slice(b"HdrS");
    bz[0x206..0x208].copy_from_slice(&0x20fu16.to_le_bytes());
    bz[0x24c..0x250].copy_from_slice(&64u32.to_le_bytes());
    bz.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3]);
    bz.extend_from_slice(&[0x55; 54]);
    let corrupt = write_file(&dir, "bzImage", &bz);
    let big_initrd = write_file(&dir, "initrd", &vec![0u8; 40 << 20]);
    let missing = dir.path().join("nope").to_str().unwrap().to_string();
    for (args, needle) in [
        (vec!["run", "--kernel", &missing], "cannot read kernel"),
        (vec!["run", "--kernel", &text], "is not a kernel"),
        (vec!["run", "--kernel", &corrupt], "corrupt gzip payload"),
        (
            vec!["run", "--kernel", &kernel, "--initrd", &missing],
            "cannot read initrd",
        ),
        (
            vec![
                "run",
                "--kernel",
                &kernel,
                "--initrd",
                &big_initrd,
                "--memory",
                "48",
            ],
            "does not fit",
        ),
    ] {
        let o = vmm(&args);
        assert_eq!(o.code, 1, "{args:?}: {}", o.stderr);
        let errs = error_lines(&o.stderr);
        assert_eq!(errs.len(), 1, "{args:?}: {}", o.stderr);
        assert!(errs[0].contains(needle), "{args:?}: {}", o.stderr);
    }
}

#[test]
fn help_explains_exit_codes_and_defaults() {
    let out = Command::new(BIN).args(["run", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "Exit codes:",
        "--vpmu",
        "cpu-switch",
        "domain-switch",
        "console=ttyS0",
        "--serial2",
        "--timeout",
    ] {
        assert!(help.contains(needle), "missing {needle} in:\n{help}");
    }
}

#[test]
fn compare_refuses_what_it_cannot_do_before_booting() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out = out.to_str().unwrap();
    // The tiny guest has no Linux, so no perf or OProfile in it.
    let o = vmm(&[
        "compare",
        "--workload",
        "tiny",
        "--profiler",
        "perf",
        "--out",
        out,
    ]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.contains("--workload packet-rx"), "{}", o.stderr);
    // packet-rx without its inputs.
    let o = vmm(&["compare", "--workload", "packet-rx", "--out", out]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.contains("--kernel"), "{}", o.stderr);
    assert!(
        !std::path::Path::new(out).join("packet-rx.csv").exists(),
        "nothing is written for a refused run"
    );
    // --workload command: the command, the root disk, a guest profiler; a command elsewhere.
    let refused = |args: &[&str], says: &str| {
        let mut all = vec!["compare", "--out", out];
        all.extend_from_slice(args);
        let o = vmm(&all);
        assert_eq!(o.code, 1, "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains(says), "{args:?}: {}", o.stderr);
    };
    refused(&["--workload", "command", "--disk", "x.img"], "after `--`");
    refused(&["--workload", "command", "--", "true"], "needs --disk");
    refused(
        &[
            "--workload",
            "command",
            "--profiler",
            "host",
            "--disk",
            "x",
            "--",
            "true",
        ],
        "guest's own profiler",
    );
    refused(
        &["--workload", "tiny", "--", "true"],
        "for --workload command",
    );
    refused(
        &[
            "--workload",
            "command",
            "--kernel",
            "/nonexistent/k",
            "--disk",
            "x",
            "--",
            "true",
        ],
        "no such file",
    );
}

/// The numbers after "exit code" in `text` (whitespace-normalised, so a wrapped line still counts).
fn exit_code_mentions(text: &str) -> Vec<i32> {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    flat.match_indices("exit code ")
        .filter_map(|(i, m)| {
            let rest = &flat[i + m.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// The help of one option of `run --help`: its header line and the indented lines under it.
fn option_help<'a>(help: &'a str, flag: &str) -> String {
    let is_header = |l: &str| {
        let t = l.trim_start();
        t.starts_with('-') && l.len() - t.len() <= 6
    };
    let mut lines = help
        .lines()
        .skip_while(|l| !(is_header(l) && l.contains(flag)));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no {flag} in:\n{help}"));
    std::iter::once(first)
        .chain(lines.take_while(|l| !is_header(l)))
        .collect::<Vec<&'a str>>()
        .join("\n")
}

#[test]
fn help_exit_codes_match_end_rs() {
    use runtime::end::code;
    let out = Command::new(BIN).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    // The "Exit codes:" list: each line starts with its codes ("  9  ...", "  130, 143  ...").
    let list: Vec<(i32, &str)> = help
        .lines()
        .skip_while(|l| !l.starts_with("Exit codes:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .flat_map(|l| {
            let codes = l.trim_start().split("  ").next().unwrap();
            codes
                .split(", ")
                .map(move |c| (c.parse::<i32>().unwrap_or_else(|_| panic!("{l}")), l))
        })
        .collect();
    let mut listed: Vec<i32> = list.iter().map(|&(c, _)| c).collect();
    listed.sort_unstable();
    let mut expected = vec![
        code::CLEAN,
        code::ERROR,
        code::USAGE,
        code::GUEST_PANIC,
        code::TRIPLE_FAULT,
        code::KVM_FAILURE,
        code::EMULATION_FAILURE,
        code::TIMEOUT,
        code::VMM_BUG,
        code::SECCOMP,
        code::UNEXPECTED_HLT,
        code::DEBUG_EXIT_ZERO,
        code::DEBUG_EXIT_NONZERO,
        code::SIGNAL_BASE + libc::SIGINT,
        code::SIGNAL_BASE + libc::SIGTERM,
    ];
    expected.sort_unstable();
    assert_eq!(listed, expected, "{help}");
    let line_of = |c: i32| list.iter().find(|&&(n, _)| n == c).unwrap().1;
    assert!(line_of(code::SECCOMP).contains("seccomp"));
    assert!(line_of(code::TIMEOUT).contains("--timeout"));
    assert!(line_of(code::VMM_BUG).contains("VMM bug"));
    assert!(line_of(code::UNEXPECTED_HLT).contains("HLT"));
    assert!(line_of(code::DEBUG_EXIT_ZERO).contains("0xf4"));
    assert!(line_of(code::DEBUG_EXIT_NONZERO).contains("0xf4"));
    assert!(help.contains("a line per vCPU names its RIP and its last exits"));
    // Every "exit code N" an option's help names is one of the list's, and the right one.
    for n in exit_code_mentions(&help) {
        assert!(
            listed.contains(&n),
            "exit code {n} is not in the list:\n{help}"
        );
    }
    for (flag, c) in [("--seccomp", code::SECCOMP), ("--timeout", code::TIMEOUT)] {
        let text = option_help(&help, flag);
        assert_eq!(exit_code_mentions(&text), vec![c], "{text}");
    }
}
