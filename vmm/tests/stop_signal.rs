//! Tier 2: SIGINT in the middle of a traced run (its own test binary: the signal goes to the
//! whole process). The run ends like a timeout: exit code 130, a diagnostic line, the trace,
//! host profile and COM2 output complete.

mod common;

use std::time::{Duration, Instant};

use analysis::trace::format::Trace;
use analysis::trace::read::Records;
use runtime::end::{code, VmEnd};
use runtime::trace::{ProfileClock, ProfileConfig};

#[test]
fn sigint_ends_the_run_with_130_and_closed_files() {
    if !common::kvm_available() {
        return;
    }
    runtime::stop_signal::install().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (trace, profile) = (dir.path().join("t.trace"), dir.path().join("p.profile"));
    let t = Instant::now();
    let sender = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(700));
        // SAFETY: kill with our own pid and a valid signal; the handler is installed.
        unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
    });
    let (tr, pr) = (trace.clone(), profile.clone());
    let r = common::run_tiny_with(
        &tiny_guests::SERIAL2_FOREVER64,
        Duration::from_secs(60),
        move |cfg| {
            cfg.record.trace = Some(tr);
            cfg.record.profile = Some(ProfileConfig {
                path: pr,
                hz: 1000,
                clock: ProfileClock::Wall,
                task_layout: None,
            });
        },
    );
    sender.join().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "the signal did not stop the run"
    );
    assert_eq!(r.report.end, VmEnd::Signal(libc::SIGINT));
    assert_eq!(r.report.end.exit_code(), code::SIGNAL_BASE + 2);
    assert_eq!(r.report.end.to_string(), "stopped by SIGINT");
    let d = vmm::report::diagnostic(&r.report);
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(
        d[0].starts_with("[vpmu-vmm] vCPU 0 at RIP 0x") && d[0].contains("pio 0x80 out 1"),
        "{}",
        d[0]
    );
    assert_eq!(r.serial2, b"tiny: serial2 line before the timeout\n");
    let t = Trace::read_file(&trace).expect("the trace is complete");
    assert!(t.has_exits());
    let p = Trace::read_file(&profile).expect("the profile is complete");
    assert!(p.has_samples());
}
