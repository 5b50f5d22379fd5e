//! Tier 3: packet receive in a stock Linux guest (minutes here). The default kernel brings
//! eth0 up by itself (`ip=` autoconfiguration, before /init) and answers the VMM's ICMP echo
//! requests from its softirq path, no user space involved.
//!
//!   VPMU_TEST_KERNEL=... VPMU_TEST_SPIN_INITRD=... \
//!     cargo test --release -p vmm --test linux_net -- --ignored --nocapture
//!
//! VPMU_TEST_SPIN_INITRD is `guest-image/build.sh spin-initramfs`: an /init that spins in user
//! mode without system calls, so the kernel keeps running after boot even on hosts where guest
//! user space cannot make system calls (with busybox there, init dies at once and the kernel
//! panics ~20 s after eth0 came up). VPMU_TEST_NET_TIMEOUT (default 300 s) is the run length;
//! the guest must answer for at least VPMU_TEST_NET_MIN_SECS (default 120 s) of it.

mod common;

use std::process::Command;
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_vpmu-vmm");
const PPS: u32 = 10;

/// The number after `label` in `line` ("... 123 replies ok ..." with label " replies ok").
fn number_before(line: &str, label: &str) -> Option<f64> {
    let end = line.find(label)?;
    let start = line[..end].rfind(' ').map_or(0, |i| i + 1);
    line[start..end].trim_end_matches('%').parse().ok()
}

fn secs(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{var}={v}: not a number"))
        })
        .unwrap_or(default)
}

#[test]
#[ignore = "boots Linux (minutes here): needs VPMU_TEST_KERNEL and VPMU_TEST_SPIN_INITRD"]
fn stock_linux_answers_echo_requests_over_virtio_net() {
    if !common::kvm_available() {
        return;
    }
    let kernel =
        std::env::var("VPMU_TEST_KERNEL").expect("VPMU_TEST_KERNEL must name the guest kernel");
    let initrd = std::env::var("VPMU_TEST_SPIN_INITRD").expect(
        "VPMU_TEST_SPIN_INITRD must name the spin initramfs (guest-image/build.sh spin-initramfs)",
    );
    let timeout = secs("VPMU_TEST_NET_TIMEOUT", 300);
    let min_secs = secs("VPMU_TEST_NET_MIN_SECS", 120);
    let dir = tempfile::tempdir().unwrap();
    let console = dir.path().join("console.log");
    let t = Instant::now();
    let out = Command::new(BIN)
        .args(["run", "--kernel", &kernel, "--initrd", &initrd, "--net"])
        .args(["--net-rx-pps", &PPS.to_string()])
        .args(["--timeout", &timeout.to_string()])
        .arg("--console")
        .arg(&console)
        .output()
        .unwrap();
    let log = std::fs::read_to_string(&console).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "run took {:.0} s, exit code {:?}\n{stderr}",
        t.elapsed().as_secs_f64(),
        out.status.code()
    );
    let dump = || format!("--- console ---\n{log}\n--- vmm ---\n{stderr}");

    assert!(
        log.contains("device=eth0, hwaddr=52:54:00:12:34:56, ipaddr=10.0.2.15"),
        "eth0 was not configured\n{}",
        dump()
    );
    assert!(log.contains("Run /init as init process"), "{}", dump());
    assert!(
        !log.contains("Kernel panic"),
        "the kernel must stay up\n{}",
        dump()
    );
    assert_eq!(
        out.status.code(),
        Some(runtime::end::code::TIMEOUT),
        "{}",
        dump()
    );

    let pinger = stderr
        .lines()
        .find(|l| l.contains("net pinger:") && l.contains("replies ok"))
        .unwrap_or_else(|| panic!("no pinger statistics\n{}", dump()));
    let ok = number_before(pinger, " replies ok").unwrap();
    let bad = number_before(pinger, " bad;").unwrap();
    assert_eq!(bad, 0.0, "bad replies: {pinger}\n{}", dump());
    let loss_line = stderr
        .lines()
        .find(|l| l.contains("after the first reply"))
        .unwrap_or_else(|| panic!("no loss statistics\n{}", dump()));
    let loss = number_before(loss_line, "%").unwrap();
    assert!(loss <= 5.0, "{loss}% of requests lost: {loss_line}");
    // Replies for at least min_secs at PPS, minus 5%.
    let want = (min_secs * u64::from(PPS)) as f64 * 0.95;
    assert!(
        ok >= want,
        "{ok} replies, want {want} ({min_secs} s at {PPS}/s): boot slower than {} s? \
         Raise VPMU_TEST_NET_TIMEOUT.\n{}",
        timeout - min_secs,
        dump()
    );
}

#[test]
fn number_parsing_reads_the_report_format() {
    let l = "[vpmu-vmm] net pinger: 636 echo requests pushed, 365 replies ok, 0 bad; 6 not sent";
    assert_eq!(number_before(l, " replies ok"), Some(365.0));
    assert_eq!(number_before(l, " bad;"), Some(0.0));
    assert_eq!(number_before("loss 1.5%", "%"), Some(1.5));
    assert_eq!(number_before(l, " missing"), None);
}
