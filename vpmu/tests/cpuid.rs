//! CPUID leaves that advertise (or hide) the PMU.

mod common;
use common::*;
use vpmu::cpuid::{self, CpuidEdit, CpuidEntry, CpuidReg};
use vpmu::ArchEvent;

fn leaf(function: u32, eax: u32, ebx: u32, ecx: u32, edx: u32) -> CpuidEntry {
    CpuidEntry {
        function,
        index: 0,
        eax,
        ebx,
        ecx,
        edx,
    }
}

/// A host-like table with every PMU bit of both vendors set, max leaves too low for 0AH and
/// Fn8000_0022.
fn host_table() -> Vec<CpuidEntry> {
    vec![
        leaf(0, 0x7, 0x6874_7541, 0x444d_4163, 0x6974_6e65),
        leaf(1, 0x00a2_0f12, 0, 0xfed8_3203 | 1 << 15, 0x178b_fbff),
        leaf(0x8000_0000, 0x8000_0008, 0, 0, 0),
        leaf(0x8000_0001, 0, 0, 1 << 23 | 1 << 24 | 1 << 28 | 1, 0),
    ]
}

fn get(table: &[CpuidEntry], function: u32) -> Option<CpuidEntry> {
    table.iter().copied().find(|e| e.function == function)
}

#[test]
fn intel_leaf_0a_describes_the_configuration() {
    #[rustfmt::skip]
    let cases: &[(&str, IntelConfig, [u32; 4])] = &[
        // version 2, 4 GP, 48 bits, 7 events | all available | 0 | 3 fixed of 48 bits
        ("default", IntelConfig::default(), [0x0730_0402, 0, 0, 0x603]),
        ("2 GP, no fixed, 40 bits", IntelConfig { gp_counters: 2, fixed_counters: 0, counter_width: 40, ..Default::default() }, [0x0728_0202, 0, 0, 0x500]),
        ("8 GP, 1 fixed", IntelConfig { gp_counters: 8, fixed_counters: 1, ..Default::default() }, [0x0730_0802, 0, 0, 0x601]),
    ];
    for &(name, config, [eax, ebx, ecx, edx]) in cases {
        let (pmu, _) = pmu(PmuConfig::Intel(config));
        let mut t = host_table();
        pmu.apply_cpuid(&mut t);
        assert_eq!(get(&t, 0xa), Some(leaf(0xa, eax, ebx, ecx, edx)), "{name}");
    }
}

#[test]
fn intel_ebx_marks_events_the_backend_cannot_count() {
    // Supports cycles and instructions only (what a time-based backend can approximate).
    let fake = FakeBackend::with_support(|e| {
        matches!(
            e.arch_event(),
            Some(ArchEvent::CoreCycles | ArchEvent::Instructions)
        )
    });
    let (mut pmu, fake) = pmu_with(PmuConfig::intel(), fake);
    let mut t = host_table();
    pmu.apply_cpuid(&mut t);
    // Bits: 0 cycles, 1 instructions, 2 ref cycles, 3 LLC ref, 4 LLC miss, 5 branches, 6 misses.
    assert_eq!(get(&t, 0xa).unwrap().ebx, 0b111_1100);
    // A GP counter programmed with an unavailable architectural event does not count.
    wr(&mut pmu, evtsel(0), 0x4f2e | ON);
    assert!(!fake.is_running(GP0));
    wr(&mut pmu, evtsel(0), 0xc0 | ON);
    assert!(fake.is_running(GP0));
}

#[test]
fn intel_edits_set_pdcm_and_hide_amd_bits() {
    for (pdcm, fw) in [(true, true), (true, false), (false, false)] {
        let (pmu, _) = intel_with(|c| {
            c.pdcm = pdcm;
            c.full_width_writes = fw;
        });
        let mut t = host_table();
        t[1].ecx &= !(1 << 15);
        pmu.apply_cpuid(&mut t);
        assert_eq!(get(&t, 1).unwrap().ecx & 1 << 15 != 0, pdcm);
        assert_eq!(
            get(&t, 0).unwrap().eax,
            0xa,
            "max basic leaf raised to reach 0AH"
        );
        assert_eq!(
            get(&t, 0x8000_0001).unwrap().ecx,
            1,
            "AMD counter bits cleared"
        );
        assert_eq!(get(&t, 0x8000_0022), None, "absent leaf stays absent");
    }
}

#[test]
fn amd_edits_per_configuration() {
    #[rustfmt::skip]
    let cases: &[(AmdConfig, u32, Option<CpuidEntry>, u32)] = &[
        // (config, Fn8000_0001_ECX, Fn8000_0022, max extended leaf)
        (AmdConfig::Legacy, 1, None, 0x8000_0008),
        (AmdConfig::CoreExt, 1 | 1 << 23, None, 0x8000_0008),
        (AMD_V2, 1 | 1 << 23, Some(leaf(0x8000_0022, 1, 6, 0, 0)), 0x8000_0022),
        (AmdConfig::PerfMonV2 { counters: 3 }, 1 | 1 << 23, Some(leaf(0x8000_0022, 1, 3, 0, 0)), 0x8000_0022),
    ];
    for &(config, ext_ecx, leaf_22, max_ext) in cases {
        let (pmu, _) = amd(config);
        let mut t = host_table();
        t.push(leaf(0xa, 0x0730_0402, 0, 0, 0x603));
        pmu.apply_cpuid(&mut t);
        assert_eq!(get(&t, 0x8000_0001).unwrap().ecx, ext_ecx, "{config:?}");
        assert_eq!(get(&t, 0x8000_0022), leaf_22, "{config:?}");
        assert_eq!(get(&t, 0x8000_0000).unwrap().eax, max_ext, "{config:?}");
        assert_eq!(get(&t, 1).unwrap().ecx & 1 << 15, 0, "{config:?}: no PDCM");
        assert_eq!(
            get(&t, 0xa),
            Some(leaf(0xa, 0, 0, 0, 0)),
            "{config:?}: no leaf 0AH"
        );
    }
}

#[test]
fn amd_without_v2_zeroes_an_existing_leaf_8000_0022() {
    let (pmu, _) = amd(AmdConfig::CoreExt);
    let mut t = host_table();
    t.push(leaf(0x8000_0022, 0x7, 0x0001_0106, 0, 0));
    t[2].eax = 0x8000_0022;
    pmu.apply_cpuid(&mut t);
    assert_eq!(get(&t, 0x8000_0022), Some(leaf(0x8000_0022, 0, 0, 0, 0)));
}

#[test]
fn leaf_edits_replace_existing_leaves_and_never_lower_the_max() {
    let (pmu, _) = amd(AMD_V2);
    let mut t = host_table();
    t[2].eax = 0x8000_0026;
    t.push(leaf(0x8000_0022, 0x7, 0x0001_0106, 0, 0));
    pmu.apply_cpuid(&mut t);
    assert_eq!(get(&t, 0x8000_0022), Some(leaf(0x8000_0022, 1, 6, 0, 0)));
    assert_eq!(get(&t, 0x8000_0000).unwrap().eax, 0x8000_0026);
    assert_eq!(t.iter().filter(|e| e.function == 0x8000_0022).count(), 1);
}

#[test]
fn hide_pmu_clears_every_pmu_bit_of_both_vendors() {
    let mut t = host_table();
    t.push(leaf(0xa, 0x0730_0402, 0, 0, 0x603));
    t.push(leaf(0x8000_0022, 0x7, 0x0001_0106, 0, 0));
    let before = t.clone();
    cpuid::apply(&cpuid::hide_pmu(), &mut t);
    assert_eq!(get(&t, 1).unwrap().ecx, before[1].ecx & !(1 << 15));
    assert_eq!(get(&t, 0xa), Some(leaf(0xa, 0, 0, 0, 0)));
    assert_eq!(get(&t, 0x8000_0001).unwrap().ecx, 1);
    assert_eq!(get(&t, 0x8000_0022), Some(leaf(0x8000_0022, 0, 0, 0, 0)));
    assert_eq!(t.len(), before.len(), "hiding adds no leaves");
    assert_eq!(get(&t, 0), get(&before, 0), "nor raises max leaves");
}

#[test]
fn bit_edits_of_absent_leaves_do_nothing() {
    let mut t = vec![leaf(0, 1, 0, 0, 0)];
    CpuidEdit::flag(0x8000_0001, CpuidReg::Ecx, 1 << 23, true).apply(&mut t);
    for e in CpuidEdit::zero(0xa) {
        e.apply(&mut t);
    }
    assert_eq!(t, vec![leaf(0, 1, 0, 0, 0)]);
    assert_eq!(leaf(5, 1, 2, 3, 4).reg(CpuidReg::Edx), 4);
}

/// The model's leaf 0AH, read back by an independent decoder (the `x86` crate's raw-cpuid).
#[test]
fn intel_leaf_0a_reads_back_through_the_x86_crate() {
    for (gp, fixed, width) in [(4u8, 3u8, 48u8), (2, 0, 40), (8, 1, 32)] {
        let fake = FakeBackend::with_support(|e| e.arch_event() != Some(ArchEvent::Branches));
        let (pmu, _) = pmu_with(
            PmuConfig::Intel(IntelConfig {
                gp_counters: gp,
                fixed_counters: fixed,
                counter_width: width,
                ..Default::default()
            }),
            fake,
        );
        let mut t = host_table();
        pmu.apply_cpuid(&mut t);
        let info = cpuid::decode_leaf_0a(&get(&t, 0xa).unwrap());
        let name = format!("{gp} GP, {fixed} fixed, {width} bits");
        assert_eq!(info.version_id(), 2, "{name}");
        assert_eq!(info.number_of_counters(), gp, "{name}");
        assert_eq!(info.counter_bit_width(), width, "{name}");
        assert_eq!(info.fixed_function_counters(), fixed, "{name}");
        assert_eq!(info.fixed_function_counters_bit_width(), width, "{name}");
        assert_eq!(
            usize::from(info.ebx_length()),
            ArchEvent::INTEL_CPUID_ORDER.len()
        );
        assert!(info.is_branch_inst_ret_ev_unavailable(), "{name}");
        assert!(!info.is_core_cyc_ev_unavailable() && !info.is_inst_ret_ev_unavailable());
        assert!(!info.is_branch_midpred_ev_unavailable(), "{name}");
    }
}
