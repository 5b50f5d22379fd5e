//! Tier 2: tiny purpose-built guests on real /dev/kvm (seconds).

mod common;

use std::time::{Duration, Instant};

use common::{kvm_available, run_tiny};
use runtime::end::{code, VmEnd};

#[test]
fn real_mode_guest_prints_and_resets() {
    if !kvm_available() {
        return;
    }
    let r = run_tiny(&tiny_guests::HELLO16, Duration::from_secs(60));
    assert_eq!(r.report.end, VmEnd::Reboot, "console: {}", r.console);
    assert_eq!(r.console, "tiny: hello from real mode\n");
    assert_eq!(r.report.end.exit_code(), code::CLEAN);
}

#[test]
fn long_mode_guest_uses_both_serials_and_msrs_then_powers_off() {
    if !kvm_available() {
        return;
    }
    let r = run_tiny(&tiny_guests::HELLO64, Duration::from_secs(60));
    assert_eq!(r.report.end, VmEnd::PowerOff, "console: {}", r.console);
    assert_eq!(
        r.console,
        "tiny: hello from long mode\ntiny: rdmsr TSC advanced\n"
    );
    assert_eq!(r.serial2, b"tiny: serial2 channel works\n");
    let exits = &r.report.exits[0];
    // Every byte is one port write; plus the power-off write.
    let bytes = r.console.len() + r.serial2.len() + 1;
    assert_eq!(exits.io_out as usize, bytes, "{exits:?}");
}

#[test]
fn halted_guest_sleeps_until_the_timeout() {
    if !kvm_available() {
        return;
    }
    let cpu_before = thread_cpu_total();
    let t = Instant::now();
    let r = run_tiny(&tiny_guests::HALT64, Duration::from_millis(1500));
    let wall = t.elapsed();
    assert!(
        matches!(r.report.end, VmEnd::Timeout(_)),
        "{:?}",
        r.report.end
    );
    assert_eq!(r.report.end.exit_code(), code::TIMEOUT);
    assert_eq!(r.console, "tiny: halting forever\n");
    assert!(wall >= Duration::from_millis(1500));
    // A halted vCPU must not spin: the process used well under the wall time in CPU.
    let cpu = thread_cpu_total() - cpu_before;
    assert!(
        cpu < wall.as_secs_f64() * 0.5,
        "used {cpu:.2} s of CPU in {wall:?}"
    );
}

#[test]
fn empty_idt_fault_is_a_triple_fault() {
    if !kvm_available() {
        return;
    }
    let r = run_tiny(&tiny_guests::TRIPLE64, Duration::from_secs(60));
    assert_eq!(r.report.end, VmEnd::TripleFault, "console: {}", r.console);
    assert_eq!(r.report.end.exit_code(), code::TRIPLE_FAULT);
    assert!(r
        .report
        .console_tail
        .iter()
        .any(|l| l.contains("about to triple-fault")));
}

/// CPU seconds used by this process so far (user + system).
fn thread_cpu_total() -> f64 {
    // SAFETY: rusage is plain integers and timevals: all zeros is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we pass, which lives through the call.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}
