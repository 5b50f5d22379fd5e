//! Tier 2: the Multiboot v1 loader and the isa-debug-exit port, with a tiny ELF32 Multiboot
//! kernel (guest-image/tiny/asm/multiboot32.S) booted through `vpmu-vmm run --kernel`, as
//! kvm-unit-tests' x86/*.flat are: it prints the machine state and the information block it was
//! given, then writes the last digit of its command line to port 0xf4.

mod common;

use std::path::Path;
use std::process::Command;

use runtime::boot::layout;
use runtime::boot::multiboot::BOOTLOADER_MAGIC;
use runtime::end::code;
use tiny_guests::{MULTIBOOT32, XBEGIN_MULTIBOOT64};

const BIN: &str = env!("CARGO_BIN_EXE_vpmu-vmm");

struct Run {
    code: i32,
    console: String,
    stderr: String,
    report: serde_json::Value,
}

fn boot(kernel: &Path, extra: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let console = dir.path().join("console");
    let json = dir.path().join("report.json");
    let o = Command::new(BIN)
        .args(["run", "--kernel"])
        .arg(kernel)
        .arg("--console")
        .arg(&console)
        .arg("--report-json")
        .arg(&json)
        .args(["--timeout", "60"])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let report = std::fs::read_to_string(&json)
        .map(|t| serde_json::from_str(&t).unwrap())
        .unwrap_or(serde_json::Value::Null);
    Run {
        code: o.status.code().unwrap_or(-1),
        console: std::fs::read_to_string(&console).unwrap_or_default(),
        stderr,
        report,
    }
}

fn tiny_kernel(dir: &Path) -> std::path::PathBuf {
    const { assert!(MULTIBOOT32.multiboot, "multiboot32 is built as an ELF32") };
    let path = dir.join("multiboot32.elf");
    std::fs::write(&path, MULTIBOOT32.image).unwrap();
    path
}

/// The value after `key=` on the console's line that has it (8 hex digits).
fn hex_field(console: &str, key: &str) -> u32 {
    let at = console
        .find(&format!("{key}="))
        .unwrap_or_else(|| panic!("no {key}= in:\n{console}"));
    let digits = &console[at + key.len() + 1..][..8];
    u32::from_str_radix(digits, 16).unwrap_or_else(|_| panic!("{key}={digits}"))
}

#[test]
fn multiboot_kernel_gets_protected_mode_the_info_block_and_its_environment() {
    if !common::kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = tiny_kernel(dir.path());
    let r = boot(
        &kernel,
        &["--memory", "64", "--cpus", "2", "--cmdline=-v 0"],
    );
    let c = &r.console;
    assert_eq!(hex_field(c, "eax"), BOOTLOADER_MAGIC, "{c}");
    let cr0 = hex_field(c, "cr0");
    assert_eq!(cr0 & 1, 1, "protected mode: {c}");
    assert_eq!(cr0 & (1 << 31), 0, "paging off: {c}");
    assert_eq!(hex_field(c, "efer") & (1 << 10), 0, "not long mode: {c}");
    assert_eq!(hex_field(c, "cs"), 8, "{c}");
    let flags = hex_field(c, "flags");
    for (bit, what) in [
        (0, "mem"),
        (2, "cmdline"),
        (3, "mods"),
        (6, "mmap"),
        (9, "loader"),
    ] {
        assert_ne!(flags & (1 << bit), 0, "flag {what}: {c}");
    }
    assert_eq!(hex_field(c, "mem_lower"), 639, "{c}");
    assert_eq!(hex_field(c, "mem_upper"), (64 << 10) - 1024, "{c}");
    assert_eq!(hex_field(c, "mods_count"), 1, "{c}");
    assert!(c.contains("mb: cmdline=multiboot32.elf -v 0\n"), "{c}");
    assert!(c.contains("mb: loader=vpmu-vmm\n"), "{c}");
    let module = format!(
        "mb: module at {:08x}\nNR_CPUS=2\nMEMSIZE=64\nMEMLIMIT=64\nmb: module end\n",
        layout::MULTIBOOT_MODULE_ADDR
    );
    assert!(c.contains(&module), "{c}");
    assert!(c.contains("mb: mmap 00000000 0009fc00 00000001\n"), "{c}");
    assert!(c.contains("mb: mmap 00100000 03f00000 00000001\n"), "{c}");
    assert!(!c.contains("still running"), "{c}");
    // Value 0: exit code 11, and the report says what was written.
    assert_eq!(r.code, code::DEBUG_EXIT_ZERO, "{}", r.stderr);
    let end = &r.report["end"];
    assert_eq!(end["kind"], "debug-exit", "{}", r.report);
    assert_eq!(end["debug_exit"]["value"], 0);
    assert_eq!(end["debug_exit"]["qemu_status"], 1);
    assert!(
        r.stderr
            .contains("guest wrote 0x0 to the isa-debug-exit port (QEMU would exit with status 1)"),
        "{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("last exits"),
        "no diagnostic: {}",
        r.stderr
    );
}

#[test]
fn a_nonzero_debug_exit_value_is_exit_code_12_with_the_value_reported() {
    if !common::kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = tiny_kernel(dir.path());
    let r = boot(&kernel, &["--memory", "32", "--cmdline", "x 3"]);
    assert!(
        r.console.contains("NR_CPUS=1\nMEMSIZE=32\n"),
        "{}",
        r.console
    );
    assert_eq!(r.code, code::DEBUG_EXIT_NONZERO, "{}", r.stderr);
    assert_eq!(r.report["end"]["debug_exit"]["value"], 3);
    assert_eq!(r.report["end"]["debug_exit"]["qemu_status"], 7);
    assert_eq!(r.report["end"]["exit_code"], 12);
}

#[test]
fn corrupt_multiboot_kernels_exit_1_with_a_clear_error() {
    if !common::kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let good = MULTIBOOT32.image;
    // The first program header's p_filesz (ELF32: e_phoff 52, p_filesz at +16) made huge.
    let mut outside = good.to_vec();
    outside[52 + 16..52 + 20].copy_from_slice(&0x7fff_0000u32.to_le_bytes());
    outside[52 + 20..52 + 24].copy_from_slice(&0x7fff_0000u32.to_le_bytes());
    // The header's checksum broken: an ELF32 without a Multiboot header.
    let mut no_header = good.to_vec();
    let at = (0..no_header.len() - 4)
        .step_by(4)
        .find(|&i| no_header[i..i + 4] == 0x1BAD_B002u32.to_le_bytes())
        .unwrap();
    no_header[at + 8] ^= 1;
    for (name, bytes, says) in [
        ("outside.elf", outside, "outside the"),
        (
            "noheader.elf",
            no_header,
            "without a valid Multiboot header",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let r = boot(&path, &["--memory", "32"]);
        assert_eq!(r.code, code::ERROR, "{name}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{name}: {}", r.stderr);
        assert!(
            r.stderr.contains("Multiboot kernel"),
            "{name}: {}",
            r.stderr
        );
    }
}

/// XBEGIN at CPL 0 on a Multiboot kernel shaped like kvm-unit-tests' x86/pmu
/// (guest-image/tiny/asm/xbegin_multiboot64.S), as each host must show it:
/// - a host that emulates guest kernel code (host quirks) and whose CPUID offers RTM: the XBEGIN
///   trap (`host_quirks/xbegin_abort.rs`) completes both XBEGINs as aborts (RAX 0, resumed at
///   their fallbacks, nothing between run) and only the UD2's #UD reaches the guest's handler;
/// - a host without RTM (AMD hosts; QEMU's emulator under the SVM host): XBEGIN is a #UD, as on
///   hardware without RTM, and all three reach the guest (no trap installed);
/// - with `--host-quirks off` on a host whose guest kernel code is emulated: the emulator's #UDs
///   all reach the guest.
///
/// A VT-x/SVM host with RTM runs a real transaction: not checked there, said so.
#[test]
fn xbegin_at_cpl0_is_an_abort_through_the_trap_or_a_ud_the_guest_receives() {
    if !common::kvm_available() {
        return;
    }
    const { assert!(XBEGIN_MULTIBOOT64.multiboot, "built as an ELF32") };
    let quirks =
        runtime::host_quirks::HostKind::decide(runtime::host_quirks::QuirkSetting::Auto).quirks();
    let supported = kvm_ioctls::Kvm::new()
        .unwrap()
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .unwrap();
    let rtm = runtime::host_quirks::xbegin_abort::offers_rtm(supported.as_slice());
    eprintln!("host quirks {quirks}, RTM offered {rtm}");
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("xbegin.elf");
    std::fs::write(&kernel, XBEGIN_MULTIBOOT64.image).unwrap();
    let with = boot(&kernel, &["--memory", "32"]);
    if !quirks && common::host_cpu_is_qemus_emulator() {
        // The SVM host under QEMU's TCG: the emulator runs the nested guest's instructions
        // with its own CPU's features, whatever KVM's CPUID for it says; there XBEGIN neither
        // raises #UD nor aborts as the architecture describes (EAX came back 3 and 0xe).
        testkit::not_checked(
            "XBEGIN at CPL 0",
            "this host's CPU is QEMU's emulator, which executes XBEGIN whatever the guest's \
             CPUID offers",
        );
        return;
    }
    match (quirks, rtm) {
        (true, true) => xbegin_aborted_through_the_trap(&with),
        (_, false) => {
            every_ud_reached_the_guest(&with);
            testkit::not_checked(
                "the XBEGIN trap's abort",
                "this host's CPUID offers no RTM: XBEGIN is a #UD the guest receives (checked)",
            );
        }
        (false, true) => testkit::not_checked(
            "XBEGIN at CPL 0",
            "a VT-x/SVM host with RTM runs a real transaction: no VMM behaviour to check",
        ),
    }
    if quirks || !rtm {
        every_ud_reached_the_guest(&boot(&kernel, &["--memory", "32", "--host-quirks", "off"]));
    }
}

/// One of the guest's printed fields (16 hex digits).
fn xbegin_field(c: &str, key: &str) -> u64 {
    let at = c
        .find(&format!(" {key}="))
        .or_else(|| c.find(&format!("xb: {key}=")))
        .unwrap_or_else(|| panic!("no {key}= in:\n{c}"));
    let digits = &c[at..].split_once('=').unwrap().1[..16];
    u64::from_str_radix(digits, 16).unwrap()
}

fn xbegin_aborted_through_the_trap(run: &Run) {
    let c = &run.console;
    assert_eq!(run.code, code::DEBUG_EXIT_ZERO, "{c}\n{}", run.stderr);
    let field = |key| xbegin_field(c, key);
    assert_eq!(
        (field("eax1"), field("eax2"), field("bad")),
        (0, 0, 0),
        "{c}"
    );
    assert_eq!(field("ud"), 1, "only the UD2's #UD: {c}");
    assert_eq!(field("udrip"), field("ud2at"), "{c}");
    assert_eq!(
        run.report["host_quirk_fixups"]["xbegin -> abort"], 2,
        "{}",
        run.report
    );
}

fn every_ud_reached_the_guest(run: &Run) {
    let c = &run.console;
    assert_eq!(run.code, code::DEBUG_EXIT_ZERO, "{c}\n{}", run.stderr);
    let field = |key| xbegin_field(c, key);
    assert_eq!(field("ud"), 3, "every #UD reaches the guest: {c}");
    assert_eq!((field("eax1"), field("bad")), (u64::MAX, 0), "{c}");
    assert_eq!(
        field("udrip"),
        field("ud2at"),
        "the last #UD is the UD2's: {c}"
    );
    assert!(
        run.report["host_quirk_fixups"]["xbegin -> abort"].is_null(),
        "{}",
        run.report
    );
}
