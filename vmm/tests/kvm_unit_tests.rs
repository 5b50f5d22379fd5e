//! Tier 3: kvm-unit-tests' `x86/pmu` (unmodified, built by `guest-image/build.sh kvm-unit-tests`)
//! booted as a Multiboot kernel, its result lines compared with an expected-results file,
//! sub-test by sub-test (docs/kvm-unit-tests.md). One Intel-model boot: 12-24 minutes here (its CPL 0 code
//! is emulated). Run by scripts/test.sh (AMD model, cpu-switch, soft backend)
//! and by scripts/kvm-unit-tests.sh for the other configurations:
//!   VPMU_TEST_KUT_PMU=.../pmu.flat cargo test --release -p vmm --test kvm_unit_tests -- --ignored
//! Environment: VPMU_TEST_KUT_MODEL (amd|intel, default: the host's vendor), VPMU_TEST_KUT_VPMU
//! (cpu-switch|domain-switch, default cpu-switch), VPMU_TEST_KUT_BACKEND (soft|hw, default soft),
//! VPMU_TEST_KUT_EXPECTED (default guest-image/kvm-unit-tests/
//! pmu.MODEL.VPMU.BACKEND.HOST-host.expected, HOST = the host's CPU vendor, amd or intel, on
//! hosts that emulate guest kernel code (kvm_pvm), and amd-svm or intel-vmx elsewhere (tier 4's
//! nested kvm_amd is amd-svm; `host_label`): the guest's CPUID vendor is the host's unless
//! `--pmu-model intel` on a non-Intel host gives it an Intel identity, and kvm-unit-tests picks
//! its Intel or AMD tests by that vendor),
//! VPMU_TEST_KUT_OUT (where to write what this run observed, in the expected file's format).
//!
//! The comparison: every line of the file names a result (PASS, FAIL, SKIP, ...) or
//! NOT-REACHED, in the order the guest prints them, and why. A PASS that becomes a FAIL fails the
//! test; so does a FAIL that becomes a PASS (the file is then out of date: update it), a line
//! that is missing or new, a sub-test reached that the file says is not, and a different end
//! (the isa-debug-exit value). The tests without `#[ignore]` check the comparison itself on a
//! recorded console, without KVM.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_vpmu-vmm");
/// A hang detector, not a speed check: the Intel model took 1434 s here on a quiet machine.
const TIMEOUT_SECS: u32 = 4500;
/// The statuses kvm-unit-tests' report() and report_skip() print (lib/report.c).
const STATUSES: [&str; 6] = ["PASS", "FAIL", "XPASS", "XFAIL", "KFAIL", "SKIP"];
const NOT_REACHED: &str = "NOT-REACHED";
/// A sub-test whose PASS or FAIL depends on timing the VMM does not control (the simulated host
/// PMU counts CPU time for every event: whether a second run of a loop counts more than the
/// first is chance). Either is accepted; a SKIP, a missing line or another name is not.
const VARIES: &str = "VARIES";
const END: &str = "END";

#[derive(Debug, Clone, PartialEq, Eq)]
struct Expected {
    status: String,
    name: String,
    reason: String,
}

/// The expected file: `STATUS | name | reason` lines (`#` comments), and one
/// `END | debug-exit VALUE | reason` line.
fn parse_expected(text: &str) -> Result<(Vec<Expected>, String), String> {
    let mut lines = Vec::new();
    let mut end = None;
    for (i, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = l.splitn(3, '|').map(str::trim).collect();
        let [status, name, reason] = f[..] else {
            return Err(format!("line {}: not `STATUS | name | reason`: {l}", i + 1));
        };
        let known = STATUSES.contains(&status)
            || status == NOT_REACHED
            || status == VARIES
            || status == END;
        if !known || name.is_empty() {
            return Err(format!("line {}: bad status or empty name: {l}", i + 1));
        }
        if status != "PASS" && reason.is_empty() {
            return Err(format!("line {}: a {status} needs its reason: {l}", i + 1));
        }
        if status == END {
            end = Some(name.to_string());
            continue;
        }
        lines.push(Expected {
            status: status.into(),
            name: name.into(),
            reason: reason.into(),
        });
    }
    let end = end.ok_or("no `END | debug-exit VALUE | reason` line")?;
    Ok((lines, end))
}

/// The result lines of a kvm-unit-tests console: (status, name), in order. x86/pmu's
/// `verify_event` also prints `FAIL: MIN <= COUNT <= MAX` before a counting sub-test's result
/// line: a measurement (it differs from run to run), not a result, so it is left out.
fn observed(console: &str) -> Vec<(String, String)> {
    console
        .lines()
        .filter_map(|l| {
            let (status, name) = l.trim_end_matches('\r').split_once(": ")?;
            let name = name.trim();
            (STATUSES.contains(&status) && !is_measurement(name))
                .then(|| (status.to_string(), without_value(name)))
        })
        .collect()
}

/// A name that ends in a measured value (`TSX cycles: gp cntr-0 with a value of 4306632`) with
/// the value as `N`, as the expected files write it: it differs from run to run.
fn without_value(name: &str) -> String {
    const VALUE: &str = " with a value of ";
    match name.rsplit_once(VALUE) {
        Some((head, v)) if v.parse::<i64>().is_ok() => format!("{head}{VALUE}N"),
        _ => name.to_string(),
    }
}

/// `MIN <= COUNT <= MAX` (integers).
fn is_measurement(name: &str) -> bool {
    let parts: Vec<&str> = name.split(" <= ").collect();
    parts.len() == 3 && parts.iter().all(|p| p.parse::<i64>().is_ok())
}

/// What differs between the file and the run (empty: they agree).
fn compare(
    expected: &[Expected],
    end_expected: &str,
    seen: &[(String, String)],
    end_seen: &str,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, e) in expected.iter().enumerate() {
        match (e.status.as_str(), seen.get(i)) {
            (NOT_REACHED, None) => {}
            (NOT_REACHED, Some((s, n))) => problems.push(format!(
                "#{i} `{}` is NOT-REACHED in the file, but the run printed `{s}: {n}`: the run \
                 got further, update the file",
                e.name
            )),
            (_, None) => problems.push(format!(
                "#{i} `{}: {}` expected, but the run printed no more results",
                e.status, e.name
            )),
            (_, Some((s, n))) if *n != e.name => problems.push(format!(
                "#{i} `{}: {}` expected, the run printed `{s}: {n}`",
                e.status, e.name
            )),
            (VARIES, Some((s, _))) if s == "PASS" || s == "FAIL" => {}
            (_, Some((s, _))) if *s != e.status => {
                let why = match (e.status.as_str(), s.as_str()) {
                    ("PASS", _) => "a regression",
                    (_, "PASS") => "now passes: update the file (and its reason)",
                    _ => "changed",
                };
                problems.push(format!(
                    "#{i} `{}`: expected {} ({}), got {s}: {why}",
                    e.name, e.status, e.reason
                ));
            }
            _ => {}
        }
    }
    for (i, (s, n)) in seen.iter().enumerate().skip(expected.len()) {
        problems.push(format!("#{i} `{s}: {n}` is not in the file"));
    }
    if end_seen != end_expected {
        problems.push(format!(
            "the run ended with `{end_seen}`, the file says `{end_expected}`"
        ));
    }
    problems
}

/// What a run observed, in the expected file's format (reasons left for a person to write).
fn as_expected_file(seen: &[(String, String)], end: &str) -> String {
    let mut out: String = seen
        .iter()
        .map(|(s, n)| format!("{s} | {n} | \n"))
        .collect();
    out.push_str(&format!("END | {end} | \n"));
    out
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// The host CPU's vendor, `amd` or `intel` (/proc/cpuinfo).
fn host_vendor() -> &'static str {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if info.contains("GenuineIntel") {
        "intel"
    } else {
        "amd"
    }
}

/// The kind of host the results are recorded for: the CPU vendor where /dev/kvm emulates guest
/// kernel code (kvm_pvm: `amd`, `intel`), with the virtualization added where it does not
/// (`amd-svm`: tier 4's kvm_amd nested under QEMU's emulator; `intel-vmx`): CPL 0 code runs at
/// the hardware's (or the emulator's) speed there and the RDPMC trap is a port write, so the
/// same configuration prints other results.
fn host_label() -> String {
    let emulated =
        runtime::host_quirks::HostKind::decide(runtime::host_quirks::QuirkSetting::Auto).quirks();
    match (emulated, host_vendor()) {
        (true, vendor) => vendor.to_string(),
        (false, "intel") => "intel-vmx".to_string(),
        (false, vendor) => format!("{vendor}-svm"),
    }
}

fn expected_path(model: &str, vpmu: &str, backend: &str) -> PathBuf {
    match std::env::var("VPMU_TEST_KUT_EXPECTED") {
        Ok(p) => PathBuf::from(p),
        Err(_) => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../guest-image/kvm-unit-tests")
            .join(format!(
                "pmu.{model}.{vpmu}.{backend}.{}-host.expected",
                host_label()
            )),
    }
}

#[test]
#[ignore = "tier 3: boots kvm-unit-tests x86/pmu (3-24 minutes here, by model); scripts/test.sh runs it"]
fn kvm_unit_tests_pmu_matches_its_expected_results() {
    assert!(common::kvm_available(), "tier 3 needs /dev/kvm");
    let flat = std::env::var("VPMU_TEST_KUT_PMU").expect(
        "VPMU_TEST_KUT_PMU must name x86/pmu.flat (guest-image/build.sh kvm-unit-tests; paths: KUT_PMU_FLAT)",
    );
    let model = env_or("VPMU_TEST_KUT_MODEL", host_vendor());
    let vpmu = env_or("VPMU_TEST_KUT_VPMU", "cpu-switch");
    let backend = env_or("VPMU_TEST_KUT_BACKEND", "soft");
    let expected_file = expected_path(&model, &vpmu, &backend);
    // Which sub-tests x86/pmu runs depends on the guest's CPU vendor (the host's here), so each
    // configuration is recorded per host vendor by a person who writes down the reasons. One not
    // recorded yet is not checked, said loudly, before spending a boot on it (unless this run is
    // the recording: VPMU_TEST_KUT_OUT).
    if !expected_file.exists() && std::env::var_os("VPMU_TEST_KUT_OUT").is_none() {
        testkit::not_checked(
            &format!("kvm-unit-tests x86/pmu ({model} model, {vpmu}, {backend})"),
            &format!(
                "no expected results recorded for this {} host ({} is missing); record them with \
                 scripts/kvm-unit-tests.sh (docs/kvm-unit-tests.md)",
                host_label(),
                expected_file.display()
            ),
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let console = dir.path().join("console");
    let json = dir.path().join("report.json");
    let t0 = std::time::Instant::now();
    let out = Command::new(BIN)
        .args(["run", "--kernel", &flat, "--memory", "256", "--cpus", "1"])
        .args([
            "--vpmu",
            &vpmu,
            "--pmu-model",
            &model,
            "--vpmu-backend",
            &backend,
        ])
        .args(["--timeout", &TIMEOUT_SECS.to_string()])
        .arg("--console")
        .arg(&console)
        .arg("--report-json")
        .arg(&json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let console = std::fs::read_to_string(&console).unwrap_or_default();
    eprintln!(
        "x86/pmu ({model}, {vpmu}, {backend}): {:.0} s, exit code {:?}\n{console}\n{stderr}",
        t0.elapsed().as_secs_f64(),
        out.status.code()
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the run's report")).unwrap();
    let end = &report["end"];
    let end_seen = match end["debug_exit"]["value"].as_u64() {
        Some(v) => format!("debug-exit {v}"),
        None => end["kind"].as_str().unwrap_or("?").to_string(),
    };
    let seen = observed(&console);
    if let Ok(path) = std::env::var("VPMU_TEST_KUT_OUT") {
        std::fs::write(&path, as_expected_file(&seen, &end_seen)).unwrap();
    }
    // fw_cfg (ports 0x510/0x511: this VMM's devices) is never read: the environment module
    // answers NR_CPUS, MEMSIZE and MEMLIMIT, and no port access goes unclaimed.
    assert_eq!(report["exits"]["unclaimed_io"], 0, "{report}");
    let text = std::fs::read_to_string(&expected_file).unwrap_or_else(|e| {
        panic!(
            "{}: {e}. This run observed (write the reasons in):\n{}",
            expected_file.display(),
            as_expected_file(&seen, &end_seen)
        )
    });
    let (expected, end_expected) =
        parse_expected(&text).unwrap_or_else(|e| panic!("{}: {e}", expected_file.display()));
    let problems = compare(&expected, &end_expected, &seen, &end_seen);
    assert!(
        problems.is_empty(),
        "x86/pmu differs from {}:\n{}",
        expected_file.display(),
        problems.join("\n")
    );
}

// The comparison itself, on a recorded console (no KVM).

/// x86/pmu's console from a run with `--pmu-model intel --vpmu cpu-switch` (soft backend) on an
/// Intel host (the recorded run of docs/kvm-unit-tests.md).
const FIXTURE: &str = include_str!("fixtures/kut-pmu.intel.cpu-switch.soft.intel-host.console");

fn checked_in(name: &str) -> (Vec<Expected>, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../guest-image/kvm-unit-tests")
        .join(name);
    parse_expected(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Every recorded console with its expected file (the AMD host's was recorded on an AMD EPYC
/// host: ../shared/recorded/, with the VMM's log lines among the guest's), how many of its
/// lines are VARIES (the simulated host PMU has chance results: overflow: status-N and the
/// odd irq-N, in each of its two rounds: Intel 4 GP + 1 fixed counter twice, AMD 6
/// PerfCtrExtCore then 4 K7 counters; the soft backend's branch misses pass or fail by whether
/// the guest CPU has IBPB: one per GP counter) and how it ends: the soft backend's runs abort at
/// measure_for_overflow's assert (63), the simulator's run to the end (1: some sub-tests
/// failed).
#[test]
fn the_recorded_runs_match_their_checked_in_files() {
    let runs = [
        (
            "pmu.intel.cpu-switch.soft.intel-host.expected",
            FIXTURE,
            4,
            63,
        ),
        (
            "pmu.intel.domain-switch.soft.intel-host.expected",
            include_str!("fixtures/kut-pmu.intel.domain-switch.soft.intel-host.console"),
            4,
            63,
        ),
        (
            "pmu.amd.cpu-switch.soft.intel-host.expected",
            include_str!("fixtures/kut-pmu.amd.cpu-switch.soft.intel-host.console"),
            6,
            63,
        ),
        (
            "pmu.amd.domain-switch.soft.intel-host.expected",
            include_str!("fixtures/kut-pmu.amd.domain-switch.soft.intel-host.console"),
            6,
            63,
        ),
        (
            "pmu.amd.cpu-switch.soft.amd-host.expected",
            include_str!("fixtures/kut-pmu.amd.cpu-switch.soft.amd-host.console"),
            6,
            63,
        ),
        (
            "pmu.intel.cpu-switch.sim.intel-host.expected",
            include_str!("fixtures/kut-pmu.intel.cpu-switch.sim.intel-host.console"),
            14,
            1,
        ),
        (
            "pmu.intel.domain-switch.sim.intel-host.expected",
            include_str!("fixtures/kut-pmu.intel.domain-switch.sim.intel-host.console"),
            14,
            1,
        ),
        (
            "pmu.amd.cpu-switch.sim.intel-host.expected",
            include_str!("fixtures/kut-pmu.amd.cpu-switch.sim.intel-host.console"),
            15,
            1,
        ),
        (
            "pmu.amd.domain-switch.sim.intel-host.expected",
            include_str!("fixtures/kut-pmu.amd.domain-switch.sim.intel-host.console"),
            15,
            1,
        ),
        // Tier 4's SVM host (kvm_amd nested under QEMU's emulator), recorded 2026-11-29.
        (
            "pmu.amd.cpu-switch.soft.amd-svm-host.expected",
            include_str!("fixtures/kut-pmu.amd.cpu-switch.soft.amd-svm-host.console"),
            0,
            63,
        ),
        (
            "pmu.intel.cpu-switch.soft.amd-svm-host.expected",
            include_str!("fixtures/kut-pmu.intel.cpu-switch.soft.amd-svm-host.console"),
            0,
            63,
        ),
    ];
    for (file, console, varies, exit) in runs {
        let (e, end) = checked_in(file);
        let seen = observed(console);
        assert!(seen.len() > 10, "{file}: {seen:?}");
        assert_eq!(end, format!("debug-exit {exit}"), "{file}: its end");
        let problems = compare(&e, &end, &seen, &end);
        assert!(problems.is_empty(), "{file}: {problems:#?}");
        let n = e.iter().filter(|x| x.status == VARIES).count();
        assert_eq!(n, varies, "{file}: VARIES lines");
    }
}

#[test]
fn a_pass_that_fails_or_a_fail_that_passes_is_reported() {
    let (e, end) = checked_in("pmu.intel.cpu-switch.soft.intel-host.expected");
    let seen = observed(FIXTURE);
    let flip = |want: &str, to: &str| {
        let i = seen.iter().position(|(s, _)| s == want).unwrap();
        let mut s = seen.clone();
        s[i].0 = to.to_string();
        let p = compare(&e, &end, &s, &end);
        assert_eq!(p.len(), 1, "{p:?}");
        p[0].clone()
    };
    assert!(flip("PASS", "FAIL").contains("a regression"));
    assert!(flip("FAIL", "PASS").contains("update the file"));
    // A line more (the run got further than the file says) and a line fewer.
    let mut more = seen.clone();
    more.push(("PASS".into(), "AMD: something new".into()));
    assert!(!compare(&e, &end, &more, &end).is_empty());
    let fewer = &seen[..seen.len() - 1];
    assert!(!compare(&e, &end, fewer, &end).is_empty());
    assert!(!compare(&e, &end, &seen, "debug-exit 0").is_empty());
    // VARIES takes a PASS or a FAIL, nothing else.
    let varies = |seen_status: &str| {
        let e = [Expected {
            status: VARIES.into(),
            name: "A: x-0".into(),
            reason: "timing".into(),
        }];
        compare(&e, "e", &[(seen_status.into(), "A: x-0".into())], "e")
    };
    assert!(varies("PASS").is_empty() && varies("FAIL").is_empty());
    assert!(!varies("SKIP").is_empty());
}

#[test]
fn expected_files_need_reasons_and_an_end() {
    assert!(parse_expected("FAIL | AMD: core cycles-0 | \nEND | debug-exit 1 | x\n").is_err());
    assert!(parse_expected("PASS | AMD: x | \n").is_err(), "no END");
    assert!(parse_expected("MAYBE | x | y\nEND | debug-exit 1 | x\n").is_err());
    let (l, end) = parse_expected(
        "# c\nPASS | A: b-0 | \nNOT-REACHED | A: c | stopped\nEND | debug-exit 63 | assert\n",
    )
    .unwrap();
    assert_eq!((l.len(), end.as_str()), (2, "debug-exit 63"));
    assert_eq!(
        observed("PASS: A: b-0\r\nINFO: x\nFAIL: 1000000 <= 25 <= 50000000\nSKIP: A: c-1\nSUMMARY: 2 tests\n"),
        vec![
            ("PASS".into(), "A: b-0".into()),
            ("SKIP".into(), "A: c-1".into())
        ]
    );
}
