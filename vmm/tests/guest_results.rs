//! The guest's result framing (guest-image/initramfs/experiments.sh, run here by the host's
//! busybox sh, as /init runs it in the guest) against the host's decoder (analysis::guest_results).
//! A file stands in for the serial port and another for /dev/port (the vPMU control port).
//! Needs /bin/busybox (Debian's busybox-static, installed by scripts/deps.sh): fails loudly
//! without it.

use std::path::{Path, PathBuf};
use std::process::Command;

use analysis::guest_results::{decode, Decoded};

const BUSYBOX: &str = "/bin/busybox";
const CONTROL_PORT: usize = 0x511;

fn experiments_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-image/initramfs/experiments.sh")
}

/// Runs `script` in busybox sh with experiments.sh sourced; returns the decoded results port.
fn run_guest_script(dir: &Path, port: Option<&[u8]>, script: &str) -> (Decoded, String) {
    assert!(
        Path::new(BUSYBOX).exists(),
        "*** {BUSYBOX} not found: this test runs the guest's init library with busybox sh; \
         install busybox-static (scripts/deps.sh does) ***"
    );
    let results = dir.join("results.bin");
    let port_file = dir.join("port");
    let _ = std::fs::remove_file(&results);
    let _ = std::fs::remove_file(&port_file);
    if let Some(p) = port {
        std::fs::write(&port_file, p).unwrap();
    }
    let bin = busybox_bin(dir);
    let out = Command::new(BUSYBOX)
        .args(["sh", "-c"])
        .arg(format!(". {}\n{script}", experiments_sh().display()))
        .env("VPMU_RESULTS_DEV", &results)
        .env("VPMU_PORT_DEV", &port_file)
        .env("VPMU_WORK", dir.join("work"))
        .env("PATH", &bin)
        .output()
        .unwrap();
    let console = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "script failed:\n{console}");
    let bytes = std::fs::read(&results).unwrap_or_default();
    (decode(&bytes), console)
}

/// Only busybox's applets on PATH (as in the guest): one link per applet, in DIR/bin.
fn busybox_bin(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    if !bin.exists() {
        std::fs::create_dir(&bin).unwrap();
        let list = Command::new(BUSYBOX).arg("--list").output().unwrap();
        for app in String::from_utf8_lossy(&list.stdout).lines() {
            std::os::unix::fs::symlink(BUSYBOX, bin.join(app)).unwrap();
        }
    }
    bin
}

/// A fake /dev/port whose control-port byte reads `mode`, as the VMM's device answers.
fn port_with(mode: u8) -> Vec<u8> {
    let mut p = vec![0xffu8; CONTROL_PORT + 16];
    p[CONTROL_PORT] = mode;
    p
}

#[test]
fn frames_from_the_guest_library_decode_intact_binary_payloads_included() {
    let dir = tempfile::tempdir().unwrap();
    let bin: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    std::fs::write(dir.path().join("bin"), &bin).unwrap();
    let script = format!(
        "vpmu_results_open\n\
         VPMU_MODE_TAG=cpu-switch\n\
         vpmu_frame test/binary {bin}\n\
         vpmu_frame test/missing {dir}/no-such-file\n\
         vpmu_frame_text test/text 'hello world'\n\
         printf 'VPMU-RESULTS-END frames=%d\\n' \"$VPMU_SEQ\" >&3\n\
         vpmu_results_close\n",
        bin = dir.path().join("bin").display(),
        dir = dir.path().display()
    );
    let (d, console) = run_guest_script(dir.path(), None, &script);
    assert!(d.problems.is_empty(), "{:?}\n{console}", d.problems);
    assert_eq!(d.frames.len(), 3);
    assert_eq!(d.get("cpu-switch", "test/binary").unwrap().payload, bin);
    assert_eq!(d.get("cpu-switch", "test/missing").unwrap().payload, b"");
    assert_eq!(
        d.get("cpu-switch", "test/text").unwrap().payload,
        b"hello world\n"
    );
}

#[test]
fn a_step_records_its_output_and_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let script = "vpmu_results_open\n\
         dir=$VPMU_WORK/x; mkdir -p $dir\n\
         vpmu_step x ok.txt echo fine\n\
         vpmu_step x bad.txt sh -c 'echo broken >&2; exit 7'\n\
         : >$VPMU_WORK/tries\n\
         vpmu_step x crash.txt sh -c 'echo . >>$0; kill -SEGV $$' $VPMU_WORK/tries\n\
         vpmu_frame x/status.txt $dir/status.txt\n\
         printf 'VPMU-RESULTS-END frames=%d\\n' \"$VPMU_SEQ\" >&3\n\
         vpmu_results_close\n";
    let (d, console) = run_guest_script(dir.path(), None, script);
    assert!(d.problems.is_empty(), "{:?}\n{console}", d.problems);
    assert_eq!(d.get("-", "x/ok.txt").unwrap().payload, b"fine\n");
    assert_eq!(d.get("-", "x/bad.txt").unwrap().payload, b"broken\n");
    let status = String::from_utf8(d.get("-", "x/status.txt").unwrap().payload.clone()).unwrap();
    // exit=N<TAB>secs=S<TAB>command
    let line = |cmd: &str| {
        status
            .lines()
            .find(|l| l.starts_with("exit=") && l.ends_with(cmd))
            .unwrap_or_else(|| panic!("no exit line for {cmd}:\n{status}"))
            .to_string()
    };
    assert!(line("\techo fine").starts_with("exit=0\tsecs="), "{status}");
    assert!(
        line("\tsh -c echo broken >&2; exit 7").starts_with("exit=7\tsecs="),
        "{status}"
    );
    // A process that dies of SIGSEGV runs once: its step fails with exit 139, nothing re-runs it.
    assert!(line("/tries").starts_with("exit=139\t"), "{status}");
    let runs = std::fs::read_to_string(dir.path().join("work/tries")).unwrap();
    assert_eq!(runs, ".\n", "the crashed step ran more than once");
    assert!(!status.contains("retry"), "{status}");
    assert_eq!(
        analysis::guest_reports::failed_steps(&status).len(),
        2,
        "exit 7 and the SIGSEGV fail:\n{status}"
    );
    assert!(
        console.contains("x: sh -c echo broken >&2; exit 7 -> exit 7"),
        "{console}"
    );
}

#[test]
fn the_whole_run_switches_modes_through_the_control_port_and_tags_frames() {
    let dir = tempfile::tempdir().unwrap();
    // The port file behaves like the control port: what is written reads back.
    let (d, console) = run_guest_script(
        dir.path(),
        Some(&port_with(0xff)),
        "vpmu_run_experiments no-such-experiment cpu-switch,domain-switch",
    );
    assert!(d.problems.is_empty(), "{:?}\n{console}", d.problems);
    assert_eq!(
        d.begin.as_deref(),
        Some("experiments=no-such-experiment modes=cpu-switch,domain-switch")
    );
    let names: Vec<(String, String)> = d
        .frames
        .iter()
        .map(|f| (f.mode.clone(), f.name.clone()))
        .collect();
    let pair = |m: &str, n: &str| (m.to_string(), n.to_string());
    assert_eq!(
        names,
        vec![
            pair("-", "system/cmdline"),
            pair("cpu-switch", "no-such-experiment/status.txt"),
            pair("domain-switch", "no-such-experiment/status.txt"),
            pair("-", "system/dmesg.txt"),
        ]
    );
    assert_eq!(
        d.get("cpu-switch", "no-such-experiment/status.txt")
            .unwrap()
            .payload,
        b"unknown experiment\n"
    );
    // The last mode written stays in the port.
    let port = std::fs::read(dir.path().join("port")).unwrap();
    assert_eq!(port[CONTROL_PORT], 2);
}

#[test]
fn without_a_control_port_a_requested_mode_is_reported_not_faked() {
    let dir = tempfile::tempdir().unwrap();
    // No /dev/port at all (another VMM, or a kernel without DEVPORT).
    let (d, console) = run_guest_script(
        dir.path(),
        None,
        "vpmu_run_experiments no-such-experiment cpu-switch",
    );
    assert!(d.problems.is_empty(), "{:?}\n{console}", d.problems);
    assert!(d.frames.iter().all(|f| f.mode == "-"));
    assert!(d.get("-", "mode-switch-failed/cpu-switch").is_some());
    assert!(console.contains("cannot switch to cpu-switch"), "{console}");
    // Without modes, frames are tagged with what the port reads: here the VMM's domain-switch.
    let (d, console) = run_guest_script(
        dir.path(),
        Some(&port_with(2)),
        "vpmu_run_experiments no-such-experiment",
    );
    assert!(d.problems.is_empty(), "{:?}\n{console}", d.problems);
    assert!(d
        .get("domain-switch", "no-such-experiment/status.txt")
        .is_some());
}

/// Puts an executable busybox-sh script called `name` on the test's PATH.
fn stub(dir: &Path, name: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let p = busybox_bin(dir).join(name);
    let _ = std::fs::remove_file(&p);
    std::fs::write(&p, format!("#!{BUSYBOX} sh\n{body}")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `vpmu-vmm compare --profiler perf|oprofile`, guest half against host half: the guest
/// library's compare-perf and compare-oprofile experiments, with stand-ins for perf, operf,
/// opreport and cpu_split that print real (perf) or documented (OProfile) report layouts, in
/// both modes through the stand-in control port; the host turns the frames into its two
/// comparisons. (The profilers themselves run only where guest user space does.)
#[test]
fn compare_experiments_feed_the_hosts_guest_profiler_comparison() {
    use vmm::compare::in_guest::{comparisons, GuestProfiler};
    let dir = tempfile::tempdir().unwrap();
    // The readers and their fixtures are the analysis crate's.
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("analysis/tests/fixtures");
    stub(
        dir.path(),
        "perf",
        &format!(
            "case \"$1\" in\n\
             record) while [ $# -gt 0 ]; do [ \"$1\" = -o ] && : >\"$2\"; shift; done ;;\n\
             report) case \"$*\" in *system.data*) cat {f}/perf-report-system.txt ;; \
             *) cat {f}/perf-report-control.txt ;; esac ;;\n\
             *) exit 9 ;;\n\
             esac\n",
            f = fixtures.display()
        ),
    );
    // operf --system-wide says "Press Ctl-c ..." once it profiles and runs until SIGINT, then
    // exits 0, as the real one. (perl: a shell started in the background ignores SIGINT and
    // cannot trap it; the real operf, a C++ program, installs its handler.)
    stub(
        dir.path(),
        "operf",
        "case \"$*\" in *--system-wide*) exec /usr/bin/perl -e '$| = 1; $SIG{INT} = sub { exit 0 }; \
         print \"operf: Press Ctl-c or kill -SIGINT $$ to stop profiling\\n\"; sleep 1 while 1' ;; esac\n",
    );
    stub(
        dir.path(),
        "opreport",
        "echo 'CPU: AMD64 generic, speed 2600 MHz (estimated)'\n\
         echo 'samples  %        image name               symbol name'\n\
         case \"$*\" in *op_system*) echo '900      90.0000  vmlinux  vm_interrupt'\n\
         echo '100      10.0000  vmlinux  default_idle' ;;\n\
         *) echo '750      75.0000  cpu_split  hot_75'\n echo '250      25.0000  cpu_split  cold_25' ;; esac\n",
    );
    stub(dir.path(), "cpu_split", "exit 0\n");
    // The packet window, and `compare --workload command`'s: the user's command in its place
    // (it must run: it leaves a file behind).
    let ran = dir.path().join("workload-ran");
    for (profiler, exp, label) in [
        (GuestProfiler::Perf, "compare-perf", "packet-rx"),
        (GuestProfiler::Oprofile, "compare-oprofile", "packet-rx"),
        (GuestProfiler::Perf, "compare-command-perf", "command"),
        (
            GuestProfiler::Oprofile,
            "compare-command-oprofile",
            "command",
        ),
    ] {
        let _ = std::fs::remove_file(&ran);
        let (d, console) = run_guest_script(
            dir.path(),
            Some(&port_with(0xff)),
            &format!(
                "VPMU_SECS=1; VPMU_WORKLOAD='echo ran >>{}'; vpmu_run_experiments {exp} cpu-switch,domain-switch",
                ran.display()
            ),
        );
        assert!(d.problems.is_empty(), "{:?}\n{console}", d.problems);
        for mode in ["cpu-switch", "domain-switch"] {
            let status = d.get(mode, &format!("{exp}/status.txt")).unwrap();
            let status = String::from_utf8_lossy(&status.payload);
            assert!(
                analysis::guest_reports::failed_steps(&status).is_empty(),
                "{exp} {mode}: {status}\n{console}"
            );
        }
        let (packets, control) = comparisons(profiler, exp, label, &d)
            .unwrap_or_else(|e| panic!("{exp}: {e}\n{console}"));
        let top = match profiler {
            GuestProfiler::Perf => "pv_native_safe_halt",
            GuestProfiler::Oprofile => "vm_interrupt",
        };
        assert!(
            packets.row(top).is_some_and(|r| r.cpu_samples > 0),
            "{packets:?}"
        );
        assert!(control.cpu_total > 0 && control.domain_total > 0);
        if label == "command" {
            let runs = std::fs::read_to_string(&ran).unwrap_or_default();
            // perf's stub does not run the command it records; operf's window does.
            if profiler == GuestProfiler::Oprofile {
                assert_eq!(
                    runs, "ran\nran\n",
                    "{exp}: the command ran once per mode\n{console}"
                );
            }
            assert!(
                packets.row(vmm::compare::linux::VIRTIO_TOTAL).is_some(),
                "{exp}: no virtio path total row: {packets:?}"
            );
            assert!(
                packets.workload.starts_with("command-"),
                "{}",
                packets.workload
            );
        }
    }
}
