//! Tier 3: a stock Linux guest on real /dev/kvm (minutes on hosts that emulate guest kernel
//! code). Run by `scripts/test.sh`, which builds the guest images and passes their paths:
//!   VPMU_TEST_KERNEL=... VPMU_TEST_INITRD=... cargo test -p vmm --test linux_boot -- --ignored
//! One boot checks everything, because a boot is expensive here.

mod common;

use std::process::Command;
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_vpmu-vmm");

#[test]
#[ignore = "boots Linux (minutes here): run through scripts/test.sh, which provides VPMU_TEST_KERNEL/VPMU_TEST_INITRD"]
fn stock_linux_boots_on_two_vcpus() {
    if !common::kvm_available() {
        return;
    }
    let kernel =
        std::env::var("VPMU_TEST_KERNEL").expect("VPMU_TEST_KERNEL must name the guest kernel");
    let initrd =
        std::env::var("VPMU_TEST_INITRD").expect("VPMU_TEST_INITRD must name the initramfs");
    let timeout = std::env::var("VPMU_TEST_TIMEOUT").unwrap_or_else(|_| "900".into());
    let dir = tempfile::tempdir().unwrap();
    let console = dir.path().join("console.log");
    let t = Instant::now();
    let out = Command::new(BIN)
        .args([
            "run",
            "--kernel",
            &kernel,
            "--initrd",
            &initrd,
            "--cpus",
            "2",
            "--timeout",
            &timeout,
        ])
        .args(["--cmdline", "vpmu.cmd=nproc"])
        .arg("--console")
        .arg(&console)
        .output()
        .unwrap();
    let log = std::fs::read_to_string(&console).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    eprintln!(
        "boot took {:.0} s, exit code {code:?}\n{stderr}",
        t.elapsed().as_secs_f64()
    );
    let has = |s: &str| log.contains(s);
    let dump = || format!("--- console ---\n{log}\n--- vmm ---\n{stderr}");

    // The kernel itself, whatever the host: both CPUs up, init started.
    assert!(
        has("Brought up 1 node, 2 CPUs") || has("Total of 2 processors activated"),
        "second CPU not up\n{}",
        dump()
    );
    assert!(
        has("Run /init as init process"),
        "init not reached\n{}",
        dump()
    );
    for bad in ["general protection fault", "Oops", "BUG:", "unknown reason"] {
        assert!(!has(bad), "guest log has {bad:?}\n{}", dump());
    }

    if vmm::host_quirks::detect(vmm::host_quirks::QuirkSetting::Auto).is_some() {
        // Guest user space cannot run on this host: SYSCALL at CPL3 never reaches the guest
        // kernel, so init dies at its first system call and the kernel panics.
        eprintln!(
            "*** guest user space CANNOT RUN on this host (guest kernel code is emulated): the \
             init marker / nproc / clean power-off part of this test needs a VT-x/SVM host ***"
        );
        assert!(
            has("Attempted to kill init"),
            "expected init to die here\n{}",
            dump()
        );
        assert_eq!(code, Some(vmm::end::code::GUEST_PANIC), "{}", dump());
    } else {
        assert!(has("VPMU-GUEST-INIT-OK"), "init marker missing\n{}", dump());
        assert!(
            log.lines().any(|l| l.trim() == "2"),
            "nproc did not print 2\n{}",
            dump()
        );
        assert!(has("VPMU-GUEST-CMD-EXIT=0"), "{}", dump());
        assert_eq!(code, Some(0), "{}", dump());
    }
}
