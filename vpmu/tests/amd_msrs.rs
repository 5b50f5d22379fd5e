//! AMD legacy / PerfCtrExtCore / PerfMonV2: every MSR rule, table-driven. Each case runs on a
//! fresh PMU of the configuration it names.

mod common;
use common::*;
use AmdConfig::*;
use Op::*;

const V2_2: AmdConfig = PerfMonV2 { counters: 2 };
const ALL: [AmdConfig; 3] = [Legacy, CoreExt, AMD_V2];

/// (name, configurations to run on, writes, MSR read, value it must return).
type ReadBack = (
    &'static str,
    &'static [AmdConfig],
    &'static [(u32, u64)],
    u32,
    u64,
);

#[rustfmt::skip]
const READ_BACK: &[ReadBack] = &[
    ("ctl reads back", &ALL, &[(k7_ctl(0), AMD_CYCLES)], k7_ctl(0), AMD_CYCLES),
    ("ctl keeps EventSelect[11:8]", &ALL, &[(k7_ctl(1), 0xf_0053_0076)], k7_ctl(1), 0xf_0053_0076),
    ("ctl keeps every valid bit", &ALL, &[(k7_ctl(2), 0xf_ffd7_ffff)], k7_ctl(2), 0xf_ffd7_ffff),
    // AMD drops reserved bits (19, 21, 63:36 with HostOnly/GuestOnly) instead of faulting.
    ("ctl drops bit 19", &ALL, &[(k7_ctl(0), AMD_CYCLES | 1 << 19)], k7_ctl(0), AMD_CYCLES),
    ("ctl drops bit 21", &ALL, &[(k7_ctl(0), AMD_CYCLES | 1 << 21)], k7_ctl(0), AMD_CYCLES),
    ("ctl drops HostOnly/GuestOnly", &ALL, &[(k7_ctl(3), AMD_CYCLES | 3 << 40)], k7_ctl(3), AMD_CYCLES),
    ("ctl drops bit 63", &ALL, &[(k7_ctl(3), AMD_CYCLES | 1 << 63)], k7_ctl(3), AMD_CYCLES),
    ("ctr reads back", &ALL, &[(k7_ctr(0), 0xabcd)], k7_ctr(0), 0xabcd),
    ("ctr drops bits above 48", &ALL, &[(k7_ctr(1), u64::MAX)], k7_ctr(1), MASK48),
    ("ctr does not sign-extend", &ALL, &[(k7_ctr(2), 0x8000_0000)], k7_ctr(2), 0x8000_0000),
    ("ctr takes -period", &ALL, &[(k7_ctr(3), 0xffff_ffff_ffff_f000)], k7_ctr(3), 0xffff_ffff_f000),
    // The core-extension range: CTLn even, CTRn odd; the first four alias the legacy MSRs.
    ("core ctl1 is k7 ctl1", &[CoreExt, AMD_V2], &[(core_ctl(1), AMD_CYCLES)], k7_ctl(1), AMD_CYCLES),
    ("k7 ctl3 is core ctl3", &[CoreExt, AMD_V2], &[(k7_ctl(3), AMD_CYCLES)], core_ctl(3), AMD_CYCLES),
    ("core ctr0 is k7 ctr0", &[CoreExt, AMD_V2], &[(core_ctr(0), 0x1234)], k7_ctr(0), 0x1234),
    ("k7 ctr2 is core ctr2", &[CoreExt, AMD_V2], &[(k7_ctr(2), 0x5678)], core_ctr(2), 0x5678),
    ("core ctl5", &[CoreExt, AMD_V2], &[(core_ctl(5), AMD_CYCLES)], core_ctl(5), AMD_CYCLES),
    ("core ctr5", &[CoreExt, AMD_V2], &[(core_ctr(5), 0x9999)], core_ctr(5), 0x9999),
    ("ctl and ctr are distinct", &[CoreExt, AMD_V2], &[(core_ctl(4), AMD_CYCLES), (core_ctr(4), 7)], core_ctl(4), AMD_CYCLES),
    // PerfMonV2.
    ("global ctl resets with every counter enabled", &[AMD_V2], &[], AMD_PERF_CNTR_GLOBAL_CTL, 0x3f),
    ("global ctl reset, 2 counters", &[V2_2], &[], AMD_PERF_CNTR_GLOBAL_CTL, 0x3),
    ("global ctl drops reserved bits", &[AMD_V2], &[(AMD_PERF_CNTR_GLOBAL_CTL, u64::MAX)], AMD_PERF_CNTR_GLOBAL_CTL, 0x3f),
    ("global ctl cleared", &[AMD_V2], &[(AMD_PERF_CNTR_GLOBAL_CTL, 0)], AMD_PERF_CNTR_GLOBAL_CTL, 0),
    ("global status resets to 0", &[AMD_V2], &[], AMD_PERF_CNTR_GLOBAL_STATUS, 0),
    ("status set", &[AMD_V2], &[(AMD_PERF_CNTR_GLOBAL_STATUS_SET, 0x21)], AMD_PERF_CNTR_GLOBAL_STATUS, 0x21),
    ("status set drops reserved bits", &[AMD_V2], &[(AMD_PERF_CNTR_GLOBAL_STATUS_SET, u64::MAX)], AMD_PERF_CNTR_GLOBAL_STATUS, 0x3f),
    ("status set, 2 counters", &[V2_2], &[(AMD_PERF_CNTR_GLOBAL_STATUS_SET, 0x3f)], AMD_PERF_CNTR_GLOBAL_STATUS, 0x3),
    ("status clr", &[AMD_V2], &[(AMD_PERF_CNTR_GLOBAL_STATUS_SET, 0x3f), (AMD_PERF_CNTR_GLOBAL_STATUS_CLR, 0x5)], AMD_PERF_CNTR_GLOBAL_STATUS, 0x3a),
    ("status clr ignores reserved bits", &[AMD_V2], &[(AMD_PERF_CNTR_GLOBAL_STATUS_SET, 0x3f), (AMD_PERF_CNTR_GLOBAL_STATUS_CLR, u64::MAX)], AMD_PERF_CNTR_GLOBAL_STATUS, 0),
    ("status write is ignored", &[AMD_V2], &[(AMD_PERF_CNTR_GLOBAL_STATUS_SET, 0x1), (AMD_PERF_CNTR_GLOBAL_STATUS, 0x3e)], AMD_PERF_CNTR_GLOBAL_STATUS, 0x1),
    ("status clr reads 0", &[AMD_V2], &[(AMD_PERF_CNTR_GLOBAL_STATUS_SET, 0x3f)], AMD_PERF_CNTR_GLOBAL_STATUS_CLR, 0),
    ("status set reads 0", &[AMD_V2], &[(AMD_PERF_CNTR_GLOBAL_STATUS_SET, 0x3f)], AMD_PERF_CNTR_GLOBAL_STATUS_SET, 0),
    ("2 counters: k7 ctl1 present", &[V2_2], &[(k7_ctl(1), AMD_CYCLES)], k7_ctl(1), AMD_CYCLES),
];

#[test]
fn registers_read_back_what_was_written() {
    for &(name, configs, writes, msr, want) in READ_BACK {
        for &config in configs {
            let (mut pmu, _) = amd(config);
            for &(m, v) in writes {
                wr(&mut pmu, m, v);
            }
            assert_eq!(pmu.rdmsr(msr), Ok(want), "{name} ({config:?})");
        }
    }
}

/// Accesses that take #GP, and the configurations where they do.
#[rustfmt::skip]
const FAULTS: &[(&str, &[AmdConfig], Op, Fault)] = &[
    ("core range without PerfCtrExtCore", &[Legacy], Rd(core_ctl(0)), Fault::Absent(core_ctl(0))),
    ("core ctr5 without PerfCtrExtCore", &[Legacy], Wr(core_ctr(5), 0), Fault::Absent(core_ctr(5))),
    ("global status without PerfMonV2", &[Legacy, CoreExt], Rd(AMD_PERF_CNTR_GLOBAL_STATUS), Fault::Absent(AMD_PERF_CNTR_GLOBAL_STATUS)),
    ("global ctl without PerfMonV2", &[Legacy, CoreExt], Wr(AMD_PERF_CNTR_GLOBAL_CTL, 0), Fault::Absent(AMD_PERF_CNTR_GLOBAL_CTL)),
    ("status clr without PerfMonV2", &[Legacy, CoreExt], Wr(AMD_PERF_CNTR_GLOBAL_STATUS_CLR, 0), Fault::Absent(AMD_PERF_CNTR_GLOBAL_STATUS_CLR)),
    ("status set without PerfMonV2", &[Legacy, CoreExt], Rd(AMD_PERF_CNTR_GLOBAL_STATUS_SET), Fault::Absent(AMD_PERF_CNTR_GLOBAL_STATUS_SET)),
    ("k7 ctl2 with 2 counters", &[V2_2], Wr(k7_ctl(2), 0), Fault::Absent(k7_ctl(2))),
    ("k7 ctr3 with 2 counters", &[V2_2], Rd(k7_ctr(3)), Fault::Absent(k7_ctr(3))),
    ("core ctl2 with 2 counters", &[V2_2], Rd(core_ctl(2)), Fault::Absent(core_ctl(2))),
    ("past the legacy block", &[Legacy, CoreExt, AMD_V2], Rd(k7_ctr(4)), Fault::NotPmuMsr(k7_ctr(4))),
    ("past the core block", &[CoreExt, AMD_V2], Rd(core_ctl(6)), Fault::NotPmuMsr(core_ctl(6))),
    ("past the PerfMonV2 block", &[AMD_V2], Rd(AMD_PERF_CNTR_GLOBAL_STATUS_SET + 1), Fault::NotPmuMsr(AMD_PERF_CNTR_GLOBAL_STATUS_SET + 1)),
    ("Intel MSR on AMD", &[AMD_V2], Rd(IA32_PERF_GLOBAL_CTRL), Fault::NotPmuMsr(IA32_PERF_GLOBAL_CTRL)),
    ("rdpmc 4 on legacy", &[Legacy], Rdpmc(4), Fault::BadRdpmcIndex(4)),
    ("rdpmc 6 with six counters", &[CoreExt, AMD_V2], Rdpmc(6), Fault::BadRdpmcIndex(6)),
    ("rdpmc 2 with two counters", &[V2_2], Rdpmc(2), Fault::BadRdpmcIndex(2)),
    ("rdpmc with Intel's fixed bit", &[Legacy, CoreExt, AMD_V2], Rdpmc(1 << 30), Fault::BadRdpmcIndex(1 << 30)),
];

#[test]
fn faulting_accesses_take_gp() {
    for &(name, configs, op, want) in FAULTS {
        for &config in configs {
            let (mut pmu, fake) = amd(config);
            assert_eq!(run(&mut pmu, op), Err(want), "{name} ({config:?})");
            assert!(fake.calls().is_empty(), "{name}: backend touched");
        }
    }
}

#[test]
fn rdpmc_reads_every_counter() {
    for config in ALL {
        let (mut pmu, _) = amd(config);
        let n = config.counters() as u32;
        for i in 0..n {
            wr(
                &mut pmu,
                if i < 4 { k7_ctr(i) } else { core_ctr(i) },
                0x100 + u64::from(i),
            );
        }
        for i in 0..n {
            assert_eq!(pmu.rdpmc(i), Ok(0x100 + u64::from(i)), "{config:?} ecx={i}");
        }
    }
}

#[test]
fn msr_ranges_are_the_same_for_every_configuration() {
    let want = vec![
        0xc001_0000..=0xc001_0007,
        0xc001_0200..=0xc001_020b,
        0xc000_0300..=0xc000_0303,
    ];
    for config in [Legacy, CoreExt, AMD_V2, V2_2] {
        let (pmu, _) = amd(config);
        assert_eq!(pmu.msr_ranges(), want, "{config:?}");
        assert!(pmu.owns(0xc001_0003) && pmu.owns(0xc001_020b) && pmu.owns(0xc000_0302));
        assert!(!pmu.owns(0xc001_0008) && !pmu.owns(0xc001_020c) && !pmu.owns(0xc1));
    }
}

#[test]
fn every_owned_msr_answers_read_or_gp_never_panics() {
    for config in [Legacy, CoreExt, AMD_V2, V2_2] {
        let (mut pmu, _) = amd(config);
        for r in pmu.msr_ranges() {
            for msr in r {
                let _ = pmu.rdmsr(msr);
                let _ = pmu.wrmsr(msr, u64::MAX);
                let _ = pmu.wrmsr(msr, 0);
            }
        }
    }
}

#[test]
fn perfmon_v2_counter_count_is_validated() {
    for bad in [0, 7, 16] {
        let r = Pmu::new(
            PmuConfig::Amd(PerfMonV2 { counters: bad }),
            Box::new(FakeBackend::new()),
        );
        assert_eq!(r.unwrap_err(), vpmu::ConfigError::GpCounters(bad));
    }
    assert_eq!(Legacy.counters(), 4);
    assert_eq!(CoreExt.counters(), 6);
    assert_eq!(AmdConfig::default(), AMD_V2);
}

#[test]
fn rdpmc_ranges_are_exactly_the_accepted_ecx_values() {
    for config in [Legacy, CoreExt, AMD_V2, V2_2] {
        let (mut pmu, _) = amd(config);
        let ranges = pmu.rdpmc_ranges();
        assert_eq!(ranges, vec![0..=u32::from(config.counters()) - 1]);
        for ecx in (0..0x20).chain([1 << 30, 1 << 31]) {
            let accepted = ranges.iter().any(|r| r.contains(&ecx));
            assert_eq!(pmu.rdpmc(ecx).is_ok(), accepted, "{config:?}: {ecx:#x}");
        }
    }
}
