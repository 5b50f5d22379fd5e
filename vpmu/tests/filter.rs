//! The operator's event filter (KVM_SET_PMU_EVENT_FILTER semantics): a refused event is accepted
//! by the MSR write and reads back, but the backend is never programmed for it and the counter
//! keeps its value; both vendors, Intel fixed counters, AMD 12-bit event selects.

mod common;
use common::*;

use vpmu::EventFilter;

fn filter(s: &str) -> Option<EventFilter> {
    Some(s.parse().unwrap_or_else(|e| panic!("{s}: {e}")))
}

/// No `Program` call for `id` since the last `take_calls`.
#[track_caller]
fn never_programmed(fake: &FakeBackend, id: CounterId) {
    let calls = fake.take_calls();
    assert!(
        !calls
            .iter()
            .any(|c| matches!(c, Call::Program { ctr, .. } if *ctr == id)),
        "{id} programmed: {calls:?}"
    );
}

#[test]
fn intel_gp_refused_event_reads_back_keeps_its_value_and_never_reaches_the_backend() {
    let (mut pmu, fake) = intel();
    pmu.set_event_filter(filter("deny:0x3c/0x00"));
    intel_enable_all(&mut pmu);
    fake.take_calls();
    wr(&mut pmu, a_pmc(0), 1000);
    wr(&mut pmu, evtsel(0), INTEL_CYCLES);
    // Reference cycles (0x3c/0x01) differ in the unit mask: allowed.
    wr(&mut pmu, evtsel(1), 0x013c | ON);
    never_programmed(&fake, GP0);
    assert!(!fake.is_running(GP0));
    assert!(fake.is_running(GP1));
    assert_eq!(rd(&mut pmu, evtsel(0)), INTEL_CYCLES);
    fake.advance_all(500);
    assert_eq!(rd(&mut pmu, pmc(0)), 1000, "refused counter moved");
    assert_eq!(rd(&mut pmu, pmc(1)), 500);
    assert_eq!(pmu.rdpmc(0).unwrap(), 1000);
    assert_eq!(pmu.filter_blocked(), 1);
    // A value write to the enabled, refused counter is kept (and is another refusal).
    wr(&mut pmu, a_pmc(0), 7);
    assert_eq!(rd(&mut pmu, pmc(0)), 7);
    assert_eq!(pmu.filter_blocked(), 2);
    // Disabling it is not a refusal.
    wr(&mut pmu, evtsel(0), 0);
    assert_eq!(pmu.filter_blocked(), 2);
}

#[test]
fn intel_allow_list_and_unit_masks() {
    // (filter, evtsel, counts)
    #[rustfmt::skip]
    let cases: &[(&str, u64, bool)] = &[
        ("allow:0x3c", INTEL_CYCLES, true),
        ("allow:0x3c", 0x013c | ON, true),
        ("allow:0x3c/0x01", INTEL_CYCLES, false),
        ("allow:0x3c/0x01", 0x013c | ON, true),
        ("allow:0xc0", INTEL_CYCLES, false),
        ("allow:", INTEL_CYCLES, false),
        ("deny:", INTEL_CYCLES, true),
        ("deny:0xc0,0x2e", INTEL_CYCLES, true),
        ("deny:0x3c", INTEL_CYCLES, false),
        // An Intel select is 8 bits: 0x13c never names 0x3c.
        ("deny:0x13c", INTEL_CYCLES, true),
    ];
    for &(spec, sel, counts) in cases {
        let (mut pmu, fake) = intel();
        pmu.set_event_filter(filter(spec));
        intel_enable_all(&mut pmu);
        wr(&mut pmu, evtsel(2), sel);
        assert_eq!(fake.is_running(CounterId::gp(2)), counts, "{spec} {sel:#x}");
        assert_eq!(rd(&mut pmu, evtsel(2)), sel, "{spec}: read back");
        assert_eq!(pmu.filter_blocked(), u64::from(!counts), "{spec}");
    }
}

#[test]
fn intel_fixed_counters_follow_the_bitmap() {
    // (filter, fixed counters that count out of all three enabled)
    #[rustfmt::skip]
    let cases: &[(&str, [bool; 3])] = &[
        ("allow:fixed=0x3", [true, true, false]),
        ("allow:0x3c,0xc0", [false, false, false]),
        ("deny:fixed=0x2", [true, false, true]),
        ("deny:0x3c/0x00,0xc0/0x00", [true, true, true]),
        ("deny:fixed=0x7", [false, false, false]),
    ];
    for &(spec, want) in cases {
        let (mut pmu, fake) = intel();
        pmu.set_event_filter(filter(spec));
        intel_enable_all(&mut pmu);
        for i in 0..3 {
            wr(&mut pmu, fixed_ctr(i), 100);
        }
        wr(&mut pmu, IA32_FIXED_CTR_CTRL, 0x333);
        assert_eq!(rd(&mut pmu, IA32_FIXED_CTR_CTRL), 0x333, "{spec}");
        fake.advance_all(10);
        for (i, w) in want.into_iter().enumerate() {
            let id = CounterId::fixed(i as u8);
            assert_eq!(fake.is_running(id), w, "{spec}: fixed{i}");
            let v = rd(&mut pmu, fixed_ctr(i as u32));
            assert_eq!(v, if w { 110 } else { 100 }, "{spec}: fixed{i}");
        }
        let refused = want.iter().filter(|w| !**w).count() as u64;
        assert_eq!(pmu.filter_blocked(), refused, "{spec}");
    }
}

#[test]
fn amd_selects_are_12_bits_and_umask_matters_when_given() {
    // (filter, PERF_CTL value, counts)
    #[rustfmt::skip]
    let cases: &[(&str, u64, bool)] = &[
        ("deny:0x76", AMD_CYCLES, false),
        ("deny:0x176", AMD_CYCLES, true),
        ("deny:0x176", AMD_CYCLES | (1 << 32), false),
        ("allow:0x176", AMD_CYCLES | (1 << 32), true),
        ("allow:0x176", AMD_CYCLES, false),
        ("allow:0x76/0x00", AMD_CYCLES, true),
        ("allow:0x76/0x01", AMD_CYCLES, false),
        ("allow:0x76/0x01", AMD_CYCLES | 0x100, true),
        ("allow:fixed=0x7", AMD_CYCLES, false),
    ];
    for config in [AmdConfig::Legacy, AMD_V2] {
        for &(spec, sel, counts) in cases {
            let (mut pmu, fake) = amd(config);
            pmu.set_event_filter(filter(spec));
            let (ctl, ctr) = if config == AmdConfig::Legacy {
                (k7_ctl(1), k7_ctr(1))
            } else {
                (core_ctl(1), core_ctr(1))
            };
            wr(&mut pmu, ctr, 5);
            wr(&mut pmu, ctl, sel);
            assert_eq!(fake.is_running(GP1), counts, "{config:?} {spec} {sel:#x}");
            assert_eq!(rd(&mut pmu, ctl), sel, "{config:?} {spec}: read back");
            fake.advance_all(20);
            let want = if counts { 25 } else { 5 };
            assert_eq!(rd(&mut pmu, ctr), want, "{config:?} {spec}");
            assert_eq!(
                pmu.filter_blocked(),
                u64::from(!counts),
                "{config:?} {spec}"
            );
        }
    }
}

#[test]
fn amd_perfmon_v2_global_enable_of_a_refused_counter_is_a_refusal_too() {
    let (mut pmu, fake) = amd(AMD_V2);
    pmu.set_event_filter(filter("deny:0x76"));
    wr(&mut pmu, AMD_PERF_CNTR_GLOBAL_CTL, 0);
    wr(&mut pmu, core_ctl(0), AMD_CYCLES);
    assert_eq!(pmu.filter_blocked(), 0, "globally disabled: not a refusal");
    wr(&mut pmu, AMD_PERF_CNTR_GLOBAL_CTL, 1);
    assert_eq!(pmu.filter_blocked(), 1);
    assert!(!fake.is_running(GP0));
}

#[test]
fn setting_the_filter_stops_a_running_counter_and_removing_it_restarts_it() {
    let (mut pmu, fake) = intel();
    intel_enable_all(&mut pmu);
    wr(&mut pmu, evtsel(0), INTEL_CYCLES);
    fake.advance(GP0, 40);
    pmu.set_event_filter(filter("allow:0xc0"));
    assert!(!fake.is_running(GP0));
    fake.advance_all(1000);
    assert_eq!(rd(&mut pmu, pmc(0)), 40, "count before the filter kept");
    pmu.set_event_filter(None);
    assert!(fake.is_running(GP0));
    fake.advance(GP0, 2);
    assert_eq!(rd(&mut pmu, pmc(0)), 42);
    assert!(pmu.event_filter().is_none());
}

#[test]
fn a_refused_sampling_counter_never_raises_a_pmi() {
    let (mut pmu, fake) = intel();
    pmu.set_event_filter(filter("deny:0x3c"));
    intel_enable_all(&mut pmu);
    wr(&mut pmu, a_pmc(0), MASK48 - 9);
    wr(&mut pmu, evtsel(0), 0x3c | ON_INT);
    fake.advance_all(100);
    assert_eq!(pmu.service_overflow(), None);
    assert_eq!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS), 0);
    assert_eq!(rd(&mut pmu, pmc(0)), MASK48 - 9);
}
