//! Intel architectural perfmon v2: every MSR rule, table-driven. Each case runs on a fresh PMU.

mod common;
use common::*;
use Op::*;

/// (name, writes, MSR read, value it must return).
type ReadBack = (&'static str, &'static [(u32, u64)], u32, u64);

#[rustfmt::skip]
const READ_BACK: &[ReadBack] = &[
    ("evtsel reads back", &[(evtsel(0), INTEL_CYCLES)], evtsel(0), INTEL_CYCLES),
    // Every non-reserved bit: event, umask, USR, OS, E, PC, INT, EN, INV, CMASK.
    ("evtsel keeps every valid bit", &[(evtsel(3), 0xffdf_ffff)], evtsel(3), 0xffdf_ffff),
    ("evtsel resets to 0", &[], evtsel(1), 0),
    ("pmc small value", &[(pmc(0), 0x1234)], pmc(0), 0x1234),
    ("pmc sign-extends bit 31", &[(pmc(0), 0x8000_0000)], pmc(0), 0xffff_8000_0000),
    ("pmc arms with -period", &[(pmc(1), 0xffff_f000)], pmc(1), 0xffff_ffff_f000),
    ("pmc ignores edx", &[(pmc(2), 0x1_7fff_ffff)], pmc(2), 0x7fff_ffff),
    ("pmc ignores edx, sign-extends eax", &[(pmc(3), 0xdead_0000_ffff_ffff)], pmc(3), MASK48),
    ("a_pmc full width", &[(a_pmc(0), 0xffff_ffff_f000)], a_pmc(0), 0xffff_ffff_f000),
    ("a_pmc does not sign-extend", &[(a_pmc(3), 0x8000_0000)], a_pmc(3), 0x8000_0000),
    ("a_pmc and pmc alias (a_pmc write)", &[(a_pmc(2), 0x1234_5678_9abc)], pmc(2), 0x1234_5678_9abc),
    ("a_pmc and pmc alias (pmc write)", &[(pmc(2), 0x8000_0000)], a_pmc(2), 0xffff_8000_0000),
    ("a_pmc accepts the top bit", &[(a_pmc(1), MASK48)], a_pmc(1), MASK48),
    ("fixed counter", &[(fixed_ctr(0), 0xdead_beef)], fixed_ctr(0), 0xdead_beef),
    ("fixed counter drops bits above 48", &[(fixed_ctr(2), u64::MAX)], fixed_ctr(2), MASK48),
    ("fixed ctrl OS/USR/PMI of three counters", &[(IA32_FIXED_CTR_CTRL, 0xbbb)], IA32_FIXED_CTR_CTRL, 0xbbb),
    ("fixed ctrl per-counter fields", &[(IA32_FIXED_CTR_CTRL, 0x821)], IA32_FIXED_CTR_CTRL, 0x821),
    ("global ctrl resets with GP bits set", &[], IA32_PERF_GLOBAL_CTRL, 0xf),
    ("global ctrl all counters", &[(IA32_PERF_GLOBAL_CTRL, 0x7_0000_000f)], IA32_PERF_GLOBAL_CTRL, 0x7_0000_000f),
    ("global ctrl cleared", &[(IA32_PERF_GLOBAL_CTRL, 0)], IA32_PERF_GLOBAL_CTRL, 0),
    ("global status resets to 0", &[], IA32_PERF_GLOBAL_STATUS, 0),
    ("ovf ctrl reads 0", &[(IA32_PERF_GLOBAL_OVF_CTRL, 0xc000_0007_0000_000f)], IA32_PERF_GLOBAL_OVF_CTRL, 0),
    ("perf capabilities: FW_WRITE only", &[], IA32_PERF_CAPABILITIES, PERF_CAP_FW_WRITE),
];

#[test]
fn registers_read_back_what_was_written() {
    for &(name, writes, msr, want) in READ_BACK {
        let (mut pmu, _) = intel();
        for &(m, v) in writes {
            wr(&mut pmu, m, v);
        }
        assert_eq!(pmu.rdmsr(msr), Ok(want), "{name}");
    }
}

const fn reserved(msr: u32, value: u64, bits: u64) -> Result<u64, Fault> {
    Err(Fault::Reserved { msr, value, bits })
}

/// One access on the default PMU and the fault it takes.
#[rustfmt::skip]
const FAULTS: &[(&str, Op, Result<u64, Fault>)] = &[
    // Reserved bits.
    ("evtsel AnyThread (bit 21)", Wr(evtsel(0), INTEL_CYCLES | 1 << 21), reserved(evtsel(0), INTEL_CYCLES | 1 << 21, 1 << 21)),
    ("evtsel IN_TX without TSX (bit 32)", Wr(evtsel(1), 1 << 32), reserved(evtsel(1), 1 << 32, 1 << 32)),
    ("evtsel bit 63", Wr(evtsel(3), 1 << 63 | 0x3c), reserved(evtsel(3), 1 << 63 | 0x3c, 1 << 63)),
    ("fixed ctrl AnyThread", Wr(IA32_FIXED_CTR_CTRL, 0x4), reserved(IA32_FIXED_CTR_CTRL, 0x4, 0x4)),
    ("fixed ctrl AnyThread of ctr 2", Wr(IA32_FIXED_CTR_CTRL, 0x4bb), reserved(IA32_FIXED_CTR_CTRL, 0x4bb, 0x400)),
    ("fixed ctrl 4th counter", Wr(IA32_FIXED_CTR_CTRL, 0x3000), reserved(IA32_FIXED_CTR_CTRL, 0x3000, 0x3000)),
    ("fixed ctrl high bits", Wr(IA32_FIXED_CTR_CTRL, 1 << 40), reserved(IA32_FIXED_CTR_CTRL, 1 << 40, 1 << 40)),
    ("global ctrl 5th GP", Wr(IA32_PERF_GLOBAL_CTRL, 0x1f), reserved(IA32_PERF_GLOBAL_CTRL, 0x1f, 0x10)),
    ("global ctrl 4th fixed", Wr(IA32_PERF_GLOBAL_CTRL, 1 << 35), reserved(IA32_PERF_GLOBAL_CTRL, 1 << 35, 1 << 35)),
    ("global ctrl bit 62", Wr(IA32_PERF_GLOBAL_CTRL, 1 << 62), reserved(IA32_PERF_GLOBAL_CTRL, 1 << 62, 1 << 62)),
    ("ovf ctrl 5th GP", Wr(IA32_PERF_GLOBAL_OVF_CTRL, 0x10), reserved(IA32_PERF_GLOBAL_OVF_CTRL, 0x10, 0x10)),
    ("ovf ctrl 4th fixed", Wr(IA32_PERF_GLOBAL_OVF_CTRL, 1 << 35), reserved(IA32_PERF_GLOBAL_OVF_CTRL, 1 << 35, 1 << 35)),
    ("ovf ctrl bit 61", Wr(IA32_PERF_GLOBAL_OVF_CTRL, 1 << 61), reserved(IA32_PERF_GLOBAL_OVF_CTRL, 1 << 61, 1 << 61)),
    ("a_pmc bit 48", Wr(a_pmc(0), 1 << 48), reserved(a_pmc(0), 1 << 48, 1 << 48)),
    ("a_pmc -1", Wr(a_pmc(1), u64::MAX), reserved(a_pmc(1), u64::MAX, !MASK48)),
    // Read-only.
    ("global status write", Wr(IA32_PERF_GLOBAL_STATUS, 0), Err(Fault::ReadOnly(IA32_PERF_GLOBAL_STATUS))),
    ("global status write 1s", Wr(IA32_PERF_GLOBAL_STATUS, 1), Err(Fault::ReadOnly(IA32_PERF_GLOBAL_STATUS))),
    ("perf capabilities write", Wr(IA32_PERF_CAPABILITIES, PERF_CAP_FW_WRITE), Err(Fault::ReadOnly(IA32_PERF_CAPABILITIES))),
    // Counters beyond the configured ones (4 GP, 3 fixed).
    ("pmc4 read", Rd(pmc(4)), Err(Fault::Absent(pmc(4)))),
    ("pmc7 write", Wr(pmc(7), 0), Err(Fault::Absent(pmc(7)))),
    ("evtsel4 write", Wr(evtsel(4), 0), Err(Fault::Absent(evtsel(4)))),
    ("evtsel7 read", Rd(evtsel(7)), Err(Fault::Absent(evtsel(7)))),
    ("a_pmc4 read", Rd(a_pmc(4)), Err(Fault::Absent(a_pmc(4)))),
    ("fixed ctr3 read", Rd(fixed_ctr(3)), Err(Fault::Absent(fixed_ctr(3)))),
    ("fixed ctr3 write", Wr(fixed_ctr(3), 0), Err(Fault::Absent(fixed_ctr(3)))),
    // Not the model's.
    ("TSC", Rd(0x10), Err(Fault::NotPmuMsr(0x10))),
    ("past the PMC block", Rd(pmc(8)), Err(Fault::NotPmuMsr(pmc(8)))),
    ("past the evtsel block", Wr(evtsel(8), 0), Err(Fault::NotPmuMsr(evtsel(8)))),
    ("AMD counter on Intel", Rd(k7_ctr(0)), Err(Fault::NotPmuMsr(k7_ctr(0)))),
    // RDPMC.
    ("rdpmc gp4", Rdpmc(4), Err(Fault::BadRdpmcIndex(4))),
    ("rdpmc fixed3", Rdpmc(1 << 30 | 3), Err(Fault::BadRdpmcIndex(1 << 30 | 3))),
    ("rdpmc fast-read bit 31", Rdpmc(1 << 31), Err(Fault::BadRdpmcIndex(1 << 31))),
    ("rdpmc fixed + fast-read", Rdpmc(3 << 30), Err(Fault::BadRdpmcIndex(3 << 30))),
    ("rdpmc unknown type", Rdpmc(1 << 16), Err(Fault::BadRdpmcIndex(1 << 16))),
    ("rdpmc gp index in high half", Rdpmc(0x1_0000), Err(Fault::BadRdpmcIndex(0x1_0000))),
];

#[test]
fn faulting_accesses_take_gp_and_change_nothing() {
    for &(name, op, ref want) in FAULTS {
        let (mut pmu, fake) = intel();
        let before = snapshot(&mut pmu);
        assert_eq!(run(&mut pmu, op), *want, "{name}");
        assert_eq!(snapshot(&mut pmu), before, "{name}: state changed");
        assert!(fake.calls().is_empty(), "{name}: backend touched");
    }
}

/// Every readable register of the default Intel PMU.
fn snapshot(pmu: &mut Pmu) -> Vec<u64> {
    let mut msrs: Vec<u32> = (0..4).flat_map(|i| [pmc(i), evtsel(i)]).collect();
    msrs.extend((0..3).map(fixed_ctr));
    msrs.extend([
        IA32_FIXED_CTR_CTRL,
        IA32_PERF_GLOBAL_CTRL,
        IA32_PERF_GLOBAL_STATUS,
    ]);
    msrs.into_iter().map(|m| rd(pmu, m)).collect()
}

/// Accesses whose outcome depends on the configuration.
#[test]
fn configuration_decides_which_msrs_exist() {
    type Tweak = fn(&mut IntelConfig);
    #[rustfmt::skip]
    let cases: &[(&str, Tweak, Op, Result<u64, Fault>)] = &[
        ("no FW_WRITE: a_pmc read", |c| c.full_width_writes = false, Rd(a_pmc(0)), Err(Fault::Absent(a_pmc(0)))),
        ("no FW_WRITE: a_pmc write", |c| c.full_width_writes = false, Wr(a_pmc(0), 1), Err(Fault::Absent(a_pmc(0)))),
        ("no FW_WRITE: capabilities read 0", |c| c.full_width_writes = false, Rd(IA32_PERF_CAPABILITIES), Ok(0)),
        ("no FW_WRITE: pmc still sign-extends", |c| c.full_width_writes = false, Wr(pmc(0), 0x8000_0000), Ok(0)),
        ("no PDCM: capabilities absent", |c| { c.pdcm = false; c.full_width_writes = false }, Rd(IA32_PERF_CAPABILITIES), Err(Fault::Absent(IA32_PERF_CAPABILITIES))),
        ("no PDCM: capabilities write absent", |c| { c.pdcm = false; c.full_width_writes = false }, Wr(IA32_PERF_CAPABILITIES, 0), Err(Fault::Absent(IA32_PERF_CAPABILITIES))),
        ("2 GP: pmc2 absent", |c| c.gp_counters = 2, Rd(pmc(2)), Err(Fault::Absent(pmc(2)))),
        ("2 GP: evtsel1 present", |c| c.gp_counters = 2, Rd(evtsel(1)), Ok(0)),
        ("2 GP: global ctrl resets to 0x3", |c| c.gp_counters = 2, Rd(IA32_PERF_GLOBAL_CTRL), Ok(0x3)),
        ("2 GP: global ctrl bit 2 reserved", |c| c.gp_counters = 2, Wr(IA32_PERF_GLOBAL_CTRL, 0x4), reserved(IA32_PERF_GLOBAL_CTRL, 0x4, 0x4)),
        ("2 GP: rdpmc 2", |c| c.gp_counters = 2, Rdpmc(2), Err(Fault::BadRdpmcIndex(2))),
        ("8 GP: pmc7 present", |c| c.gp_counters = 8, Wr(pmc(7), 5), Ok(0)),
        ("8 GP: global ctrl 0xff", |c| c.gp_counters = 8, Rd(IA32_PERF_GLOBAL_CTRL), Ok(0xff)),
        ("no fixed: fixed ctr0 absent", |c| c.fixed_counters = 0, Rd(fixed_ctr(0)), Err(Fault::Absent(fixed_ctr(0)))),
        ("no fixed: every ctrl bit reserved", |c| c.fixed_counters = 0, Wr(IA32_FIXED_CTR_CTRL, 1), reserved(IA32_FIXED_CTR_CTRL, 1, 1)),
        ("no fixed: ctrl reads 0", |c| c.fixed_counters = 0, Rd(IA32_FIXED_CTR_CTRL), Ok(0)),
        ("1 fixed: ctr1 absent", |c| c.fixed_counters = 1, Wr(fixed_ctr(1), 0), Err(Fault::Absent(fixed_ctr(1)))),
        ("1 fixed: global bit 33 reserved", |c| c.fixed_counters = 1, Wr(IA32_PERF_GLOBAL_CTRL, 1 << 33), reserved(IA32_PERF_GLOBAL_CTRL, 1 << 33, 1 << 33)),
        ("32-bit counters: pmc masks", |c| c.counter_width = 32, Wr(pmc(0), 0xffff_ffff), Ok(0)),
        ("32-bit counters: a_pmc bit 32 reserved", |c| c.counter_width = 32, Wr(a_pmc(0), 1 << 32), reserved(a_pmc(0), 1 << 32, 1 << 32)),
    ];
    for &(name, tweak, op, ref want) in cases {
        let (mut pmu, _) = intel_with(tweak);
        assert_eq!(run(&mut pmu, op), *want, "{name}");
    }
}

#[test]
fn thirty_two_bit_counters_wrap_at_32_bits() {
    let (mut pmu, _) = intel_with(|c| c.counter_width = 32);
    wr(&mut pmu, pmc(0), 0xffff_f000);
    assert_eq!(rd(&mut pmu, pmc(0)), 0xffff_f000);
    wr(&mut pmu, fixed_ctr(0), u64::MAX);
    assert_eq!(rd(&mut pmu, fixed_ctr(0)), 0xffff_ffff);
}

#[test]
fn rdpmc_reads_gp_and_fixed_counters() {
    let (mut pmu, _) = intel();
    for i in 0..4 {
        wr(&mut pmu, a_pmc(i), 0x1000 + u64::from(i));
    }
    for i in 0..3 {
        wr(&mut pmu, fixed_ctr(i), 0x2000 + u64::from(i));
    }
    for i in 0..4 {
        assert_eq!(pmu.rdpmc(i), Ok(0x1000 + u64::from(i)));
    }
    for i in 0..3 {
        assert_eq!(pmu.rdpmc(1 << 30 | i), Ok(0x2000 + u64::from(i)));
    }
    wr(&mut pmu, pmc(0), 0xffff_ff00);
    assert_eq!(
        pmu.rdpmc(0),
        Ok(0xffff_ffff_ff00),
        "RDPMC returns the full width"
    );
}

#[test]
fn ovf_ctrl_clears_only_the_bits_written() {
    let (mut pmu, fake) = intel();
    intel_enable_all(&mut pmu);
    // Overflow GP0, GP1 and fixed counter 0.
    for (sel, ctr) in [(evtsel(0), pmc(0)), (evtsel(1), pmc(1))] {
        wr(&mut pmu, ctr, 0xffff_fff0);
        wr(&mut pmu, sel, INTEL_CYCLES);
    }
    wr(&mut pmu, fixed_ctr(0), MASK48 - 0xf);
    wr(&mut pmu, IA32_FIXED_CTR_CTRL, 0x3);
    fake.advance_all(0x10);
    assert_eq!(pmu.service_overflow(), None, "no INT, no PMI");
    assert_eq!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS), 0x1_0000_0003);
    wr(&mut pmu, IA32_PERF_GLOBAL_OVF_CTRL, 0x1);
    assert_eq!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS), 0x1_0000_0002);
    wr(&mut pmu, IA32_PERF_GLOBAL_OVF_CTRL, 0xc000_0001_0000_0000);
    assert_eq!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS), 0x2);
    wr(&mut pmu, IA32_PERF_GLOBAL_OVF_CTRL, 0x7_0000_000f);
    assert_eq!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS), 0);
}

#[test]
fn msr_ranges_are_the_architectural_blocks() {
    let (pmu, _) = intel();
    assert_eq!(
        pmu.msr_ranges(),
        vec![
            0xc1..=0xc8,
            0x186..=0x18d,
            0x309..=0x30c,
            0x345..=0x345,
            0x38d..=0x390,
            0x4c1..=0x4c8,
        ]
    );
    for owned in [
        0xc1, 0xc8, 0x18d, 0x30c, 0x345, 0x38d, 0x38e, 0x38f, 0x390, 0x4c1, 0x4c8,
    ] {
        assert!(pmu.owns(owned), "{owned:#x}");
    }
    for not in [
        0xc0,
        0xc9,
        0x185,
        0x18e,
        0x308,
        0x30d,
        0x344,
        0x346,
        0x38c,
        0x391,
        0x4c0,
        0x4c9,
        0xc001_0000,
    ] {
        assert!(!pmu.owns(not), "{not:#x}");
    }
    // The ranges do not depend on the configuration.
    let (small, _) = intel_with(|c| {
        c.gp_counters = 1;
        c.fixed_counters = 0;
        c.pdcm = false;
        c.full_width_writes = false;
    });
    assert_eq!(small.msr_ranges(), pmu.msr_ranges());
}

#[test]
fn every_owned_msr_answers_read_or_gp_never_panics() {
    let (mut pmu, _) = intel();
    for r in pmu.msr_ranges() {
        for msr in r {
            let _ = pmu.rdmsr(msr);
            let _ = pmu.wrmsr(msr, 0);
            let _ = pmu.wrmsr(msr, u64::MAX);
        }
    }
}

#[test]
fn invalid_configurations_are_refused() {
    use vpmu::ConfigError::*;
    type Tweak = fn(&mut IntelConfig);
    let cases: &[(Tweak, vpmu::ConfigError)] = &[
        (|c| c.gp_counters = 0, GpCounters(0)),
        (|c| c.gp_counters = 9, GpCounters(9)),
        (|c| c.fixed_counters = 4, FixedCounters(4)),
        (|c| c.counter_width = 31, Width(31)),
        (|c| c.counter_width = 49, Width(49)),
        (|c| c.pdcm = false, FullWidthWithoutPdcm),
    ];
    for (tweak, want) in cases {
        let mut c = IntelConfig::default();
        tweak(&mut c);
        assert_eq!(
            Pmu::new(PmuConfig::Intel(c), Box::new(FakeBackend::new())).unwrap_err(),
            *want
        );
    }
}

#[test]
fn rdpmc_ranges_are_exactly_the_accepted_ecx_values() {
    for (gp, fixed) in [(4u8, 3u8), (1, 0), (8, 1)] {
        let (mut pmu, _) = intel_with(|c| {
            c.gp_counters = gp;
            c.fixed_counters = fixed;
        });
        let ranges = pmu.rdpmc_ranges();
        let accepted = |ecx: u32| ranges.iter().any(|r| r.contains(&ecx));
        for ecx in (0..0x20)
            .chain(0x4000_0000..0x4000_0020)
            .chain([1 << 31, 0xc000_0000])
        {
            assert_eq!(
                pmu.rdpmc(ecx).is_ok(),
                accepted(ecx),
                "{gp}/{fixed}: {ecx:#x}"
            );
        }
    }
}

#[test]
fn a_pmu_can_move_to_its_vcpu_thread() {
    fn send<T: Send>(_: &T) {}
    send(&intel().0);
}

#[test]
fn tsx_qualifiers_are_writable_only_where_the_guest_has_tsx() {
    const IN_TX: u64 = 1 << 32;
    const IN_TXCP: u64 = 1 << 33;
    let (mut pmu, fake) = intel_with(|c| c.tsx = true);
    // IN_TX on every counter (KVM's HSW_IN_TX), read back and handed to the backend.
    for i in 0..4 {
        wr(&mut pmu, evtsel(i), INTEL_CYCLES | IN_TX);
        assert_eq!(rd(&mut pmu, evtsel(i)), INTEL_CYCLES | IN_TX);
    }
    // IN_TXCP on counter 2 only (HSW_IN_TX_CHECKPOINTED).
    wr(&mut pmu, evtsel(2), INTEL_CYCLES | IN_TX | IN_TXCP);
    assert_eq!(rd(&mut pmu, evtsel(2)), INTEL_CYCLES | IN_TX | IN_TXCP);
    for i in [0, 1, 3] {
        let v = INTEL_CYCLES | IN_TXCP;
        assert_eq!(
            run(&mut pmu, Wr(evtsel(i), v)),
            reserved(evtsel(i), v, IN_TXCP),
            "IN_TXCP on counter {i}"
        );
    }
    intel_enable_all(&mut pmu);
    let programmed = fake.event(vpmu::CounterId::gp(2)).expect("counter 2 runs");
    assert!(programmed.in_tx && programmed.in_tx_cp);
    // Bit 34 stays reserved.
    let v = INTEL_CYCLES | 1 << 34;
    assert_eq!(
        run(&mut pmu, Wr(evtsel(0), v)),
        reserved(evtsel(0), v, 1 << 34)
    );
}
