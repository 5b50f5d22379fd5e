//! Tier 2 for `--rdpmc trap`: an unpatched tiny guest (guest-image/tiny/asm/rdpmc_trap_body.inc)
//! executes RDPMC at CPL0 and at CPL3, and the VMM serves it through the mark over the guest's
//! #GP handler — or gives the guest the #GP the CPU would raise. Both PMU models, and both
//! marks: the host's own (an int3 where host quirks are on, the trap-port write on a VT-x/SVM
//! host) and, with `--host-quirks off`, the trap-port write on every host.

mod common;

use std::time::Duration;

use runtime::end::VmEnd;
use runtime::host_quirks::QuirkSetting;
use runtime::pmu::{BackendChoice, ModelChoice};
use runtime::vm::{RdpmcSetting, VpmuSetting};
use tiny_guests::TinyGuest;

const K0: u64 = 0x1234_5678_9abc;
const K_FIXED: u64 = 0xabcd_ef01_2345;
const USER_BASE: u64 = 0x20_0000;
const WORDS: usize = 30;

fn guest(model: ModelChoice) -> TinyGuest {
    match model {
        ModelChoice::Intel => tiny_guests::RDPMC_TRAP_INTEL64,
        _ => tiny_guests::RDPMC_TRAP_AMD64,
    }
}

fn run(model: ModelChoice, rdpmc: RdpmcSetting) -> (Vec<u64>, runtime::vm::RunReport, String) {
    run_with(model, rdpmc, QuirkSetting::Auto)
}

fn run_with(
    model: ModelChoice,
    rdpmc: RdpmcSetting,
    quirks: QuirkSetting,
) -> (Vec<u64>, runtime::vm::RunReport, String) {
    let r = common::run_tiny_with(&guest(model), Duration::from_secs(120), |cfg| {
        cfg.vpmu = VpmuSetting::CpuSwitch;
        cfg.pmu_model = model;
        cfg.pmu_backend = BackendChoice::Soft;
        cfg.rdpmc = rdpmc;
        cfg.host = runtime::host_quirks::HostKind::decide(quirks);
    });
    let words: Vec<u64> = r
        .serial2
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (words, r.report, r.console)
}

/// One probe: what RAX and RDX held after the RDPMC, and the #GPs the guest's handler had seen.
fn probe(w: &[u64], i: usize) -> (u64, u64, u64) {
    (w[3 * i], w[3 * i + 1], w[3 * i + 2])
}

/// RDPMC's answer in RAX/RDX: the value split in halves, the upper 32 bits of each cleared.
fn served(v: u64) -> (u64, u64) {
    (v & 0xffff_ffff, v >> 32)
}

/// TSC cycles per second of this host (the guest's TSC runs at the host's here).
fn tsc_hz() -> f64 {
    let (t0, c0) = (std::time::Instant::now(), runtime::tsc::now());
    std::thread::sleep(Duration::from_millis(50));
    let (t1, c1) = (std::time::Instant::now(), runtime::tsc::now());
    (c1 - c0) as f64 / (t1 - t0).as_secs_f64()
}

fn check(model: ModelChoice, rdpmc: RdpmcSetting) {
    check_with(model, rdpmc, QuirkSetting::Auto)
}

fn check_with(model: ModelChoice, rdpmc: RdpmcSetting, quirks: QuirkSetting) {
    if !common::kvm_available() {
        return;
    }
    let (w, report, console) = run_with(model, rdpmc, quirks);
    assert_eq!(report.end, VmEnd::PowerOff, "{model:?}: console {console}");
    if common::kvm_answers_rdpmc(&report) {
        // No #GP to trap: the CPL 0 RDPMC reads KVM's 0, and the VMM serves none.
        assert_eq!(probe(&w, 0), (0, 0, 0), "{model:?}: {w:x?}");
        assert_eq!(report.pmu.rdpmc_trapped, 0, "{model:?}");
        testkit::not_checked(
            &format!("the RDPMC trap ({model:?} model, {quirks:?} host quirks)"),
            "this host's KVM answers guest RDPMC itself (0, no #GP): nothing reaches the trap",
        );
        return;
    }
    assert_eq!(w.len(), WORDS, "{model:?}: guest report incomplete: {w:x?}");
    eprintln!("{model:?}: {w:#x?}");
    let unchanged = (u64::MAX, u64::MAX);
    let intel = model == ModelChoice::Intel;
    // (a) CPL0: the value written by WRMSR comes back, split as RDPMC splits it.
    let (a, d, gp) = probe(&w, 0);
    assert_eq!(((a, d), gp), (served(K0), 0), "{model:?}: CPL0 RDPMC 0");
    // Width: Intel's legacy counter write is sign-extended from 32 bits and masked to 48; AMD
    // masks an all-ones write to 48 bits.
    let width = if intel {
        0xffff_8000_0000
    } else {
        0xffff_ffff_ffff
    };
    let (a, d, gp) = probe(&w, 1);
    assert_eq!(((a, d), gp), (served(width), 0), "{model:?}: width");
    // Fixed counter 0 (ECX bit 30): Intel serves it; AMD has none, so #GP.
    let (a, d, gp) = probe(&w, 2);
    if intel {
        assert_eq!(((a, d), gp), (served(K_FIXED), 0), "{model:?}: fixed 0");
    } else {
        assert_eq!(
            ((a, d), gp),
            (unchanged, 1),
            "{model:?}: AMD ECX 0x40000000"
        );
    }
    let gp_before = gp;
    // ECX bit 31 ("fast read", only on non-architectural Intel PMUs) and an index naming no
    // counter: #GP, delivered to the guest's handler.
    let (a, d, gp) = probe(&w, 3);
    assert_eq!(
        ((a, d), gp),
        (unchanged, gp_before + 1),
        "{model:?}: ECX bit 31"
    );
    let (a, d, gp) = probe(&w, 4);
    assert_eq!(
        ((a, d), gp),
        (unchanged, gp_before + 2),
        "{model:?}: ECX 0x20"
    );
    // A REX.W-prefixed RDPMC is served too (3 bytes stepped over, not 2).
    let (a, d, gp) = probe(&w, 5);
    assert_eq!(
        ((a, d), gp),
        (served(K0), gp_before + 2),
        "{model:?}: REX RDPMC"
    );
    // (b) CPL3 with CR4.PCE: served.
    let (a, d, gp) = probe(&w, 6);
    assert_eq!(
        ((a, d), gp),
        (served(K0), gp_before + 2),
        "{model:?}: CPL3 PCE"
    );
    // (c) CPL3 without CR4.PCE: #GP in the guest's handler, from the user RDPMC.
    let (a, d, gp) = probe(&w, 7);
    assert_eq!(
        ((a, d), gp),
        (unchanged, gp_before + 3),
        "{model:?}: CPL3 no PCE"
    );
    let user_rdpmc = w[26];
    assert!(user_rdpmc >= USER_BASE, "{w:x?}");
    assert_eq!(
        (w[24], w[25]),
        (user_rdpmc, 0x33),
        "{model:?}: the #GP frame"
    );
    // The VMM's own count agrees with the guest's (probes, then two timing loops).
    let loops = w[29];
    let served_probes = if intel { 5 } else { 4 };
    let p = &report.pmu;
    assert_eq!(
        (p.rdpmc_trapped, p.rdpmc_reads),
        (served_probes + 2 * loops, served_probes + 2 * loops),
        "{model:?}: RDPMCs served by the trap"
    );
    let hz = tsc_hz();
    eprintln!(
        "{model:?}: a served RDPMC costs {:.1} us at CPL0, {:.1} us at CPL3 (guest TSC, {loops} each)",
        w[27] as f64 / loops as f64 / hz * 1e6,
        w[28] as f64 / loops as f64 / hz * 1e6
    );
    assert_eq!(p.gp_delivered, gp_before + 3, "{model:?}: #GPs delivered");
    assert_eq!(p.rdpmc_gp, p.gp_delivered, "{model:?}: all of them RDPMCs");
}

#[test]
fn amd_rdpmc_is_served_at_cpl0_and_cpl3_without_patching() {
    check(ModelChoice::Amd, RdpmcSetting::Trap);
}

#[test]
fn intel_rdpmc_is_served_at_cpl0_and_cpl3_without_patching() {
    check(ModelChoice::Intel, RdpmcSetting::Trap);
}

/// The trap-port mark (a VT-x/SVM host's) on this host too: with the host quirks off the #GP
/// handler starts with `out %al, $0xf5`, each #GP is a port-I/O exit the VMM completes before
/// it looks (KVM_RUN with immediate_exit), and the results are the same as the int3's.
#[test]
fn both_models_rdpmc_through_the_trap_port_mark() {
    check_with(ModelChoice::Amd, RdpmcSetting::Trap, QuirkSetting::Off);
    check_with(ModelChoice::Intel, RdpmcSetting::Trap, QuirkSetting::Off);
}

/// The guest's REX-prefixed RDPMC is one the patcher refuses: `--rdpmc patch` does not start
/// it (with a message naming the site), and `--rdpmc auto` (the default) serves it by trap.
#[test]
fn patch_refuses_the_guest_and_auto_traps_instead() {
    if !common::kvm_available() {
        return;
    }
    let cfg = runtime::vm::VmConfig {
        memory_mib: 64,
        vpmu: VpmuSetting::CpuSwitch,
        pmu_model: ModelChoice::Amd,
        pmu_backend: BackendChoice::Soft,
        rdpmc: RdpmcSetting::Patch,
        timeout: Some(Duration::from_secs(60)),
        ..runtime::vm::VmConfig::new(runtime::vm::Boot::tiny(&tiny_guests::RDPMC_TRAP_AMD64))
    };
    let result = std::thread::scope(|s| s.spawn(|| runtime::vm::run(&cfg)).join().unwrap());
    let Err(err) = result else {
        panic!("--rdpmc patch must refuse a prefixed RDPMC");
    };
    let err = err.to_string();
    assert!(
        err.contains("cannot be patched safely") && err.contains("--rdpmc trap"),
        "{err}"
    );
    check(ModelChoice::Amd, RdpmcSetting::Auto);
}

/// Without the trap (`--rdpmc off`) this host answers the first RDPMC with #GP straight into the
/// guest's handler: the same guest then reports other values (the check above can fail).
#[test]
fn without_the_trap_the_guest_takes_every_gp() {
    if !common::kvm_available() {
        return;
    }
    let (w, report, console) = run(ModelChoice::Amd, RdpmcSetting::Off);
    if common::kvm_answers_rdpmc(&report) {
        assert_eq!(report.end, VmEnd::PowerOff, "console {console}");
        assert_eq!(probe(&w, 0), (0, 0, 0), "KVM's answer: {w:x?}");
        testkit::not_checked(
            "without_the_trap_the_guest_takes_every_gp",
            "this host's KVM answers guest RDPMC itself (0, no #GP)",
        );
        return;
    }
    assert_eq!(report.end, VmEnd::PowerOff, "console {console}");
    assert_eq!(w.len(), WORDS, "{w:x?}");
    assert_eq!(
        probe(&w, 0),
        (u64::MAX, u64::MAX, 1),
        "the first RDPMC faulted"
    );
    assert_eq!(report.pmu.rdpmc_trapped, 0);
}
