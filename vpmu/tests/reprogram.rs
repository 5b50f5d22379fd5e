//! Deferred reprogramming (KVM's `reprogram_pmi` bitmap): how many backend calls a guest write
//! sequence costs with [`Pmu::set_deferred_reprogram`] off (every write reaches the backend) and
//! on (writes mark counters dirty; [`Pmu::reprogram_dirty`], before the next guest entry, makes
//! one call per dirty counter), and that reads before that entry see the written state.

mod common;
use common::*;

/// Backend calls (program, stop) recorded since the last call to this.
fn calls(fake: &FakeBackend) -> Vec<Call> {
    fake.take_calls()
}

fn programs(calls: &[Call]) -> usize {
    calls
        .iter()
        .filter(|c| matches!(c, Call::Program { .. }))
        .count()
}

const PERIOD: u64 = 100_000;

/// Intel, PMC0 counting cycles with PMI, enabled globally, and the backend's calls so far
/// forgotten. `deferred` as given, and (deferred) reprogrammed once, as at a first entry.
fn intel_running(deferred: bool) -> (Pmu, FakeBackend) {
    let (mut pmu, fake) = intel();
    pmu.set_deferred_reprogram(deferred);
    wr(&mut pmu, evtsel(0), INTEL_CYCLES | EVTSEL_INT);
    wr(&mut pmu, a_pmc(0), PERIOD.wrapping_neg() & MASK48);
    intel_enable_all(&mut pmu);
    pmu.reprogram_dirty();
    assert!(fake.is_running(GP0));
    calls(&fake);
    (pmu, fake)
}

/// The Linux perf driver's sequence on Intel (x86_pmu_disable, x86_perf_event_set_period +
/// the select, x86_pmu_enable): GLOBAL_CTRL = 0, PERFEVTSEL0, A_PMC0 = -period, GLOBAL_CTRL
/// on. Returns the backend calls made during the writes, and at the entry after them.
fn perf_sequence(pmu: &mut Pmu, fake: &FakeBackend, select: u64) -> (Vec<Call>, Vec<Call>) {
    wr(pmu, IA32_PERF_GLOBAL_CTRL, 0);
    wr(pmu, evtsel(0), select);
    wr(pmu, a_pmc(0), PERIOD.wrapping_neg() & MASK48);
    intel_enable_all(pmu);
    let during = calls(fake);
    pmu.reprogram_dirty();
    (during, calls(fake))
}

#[test]
fn perf_sequence_costs_one_program_at_entry_instead_of_a_stop_and_a_program() {
    // Same select (a re-arm, as in the PMI handler) and a new one (a new event).
    for select in [INTEL_CYCLES | EVTSEL_INT, 0x3c | 0x100 | ON_INT] {
        let (mut pmu, fake) = intel_running(false);
        let (during, at_entry) = perf_sequence(&mut pmu, &fake, select);
        assert_eq!(during.len(), 2, "before: {during:?}");
        assert_eq!(during[0], Call::Stop { ctr: GP0 });
        assert_eq!(programs(&during), 1);
        assert!(at_entry.is_empty());

        let (mut pmu, fake) = intel_running(true);
        let (during, at_entry) = perf_sequence(&mut pmu, &fake, select);
        assert!(during.is_empty(), "after: {during:?}");
        assert_eq!(at_entry.len(), 1, "after: {at_entry:?}");
        let Call::Program {
            ctr,
            overflow_after,
            ..
        } = at_entry[0]
        else {
            panic!("{at_entry:?}")
        };
        assert_eq!((ctr, overflow_after), (GP0, Some(PERIOD)));
    }
}

#[test]
fn every_counter_in_the_sequence_is_programmed_once() {
    // 4 GP + 3 fixed counters, all re-armed between a global disable and enable.
    let seq = |pmu: &mut Pmu| {
        wr(pmu, IA32_PERF_GLOBAL_CTRL, 0);
        for i in 0..4 {
            wr(pmu, evtsel(i), INTEL_CYCLES | EVTSEL_INT);
            wr(pmu, a_pmc(i), PERIOD.wrapping_neg() & MASK48);
        }
        wr(pmu, IA32_FIXED_CTR_CTRL, 0xbbb);
        for i in 0..3 {
            wr(pmu, fixed_ctr(i), PERIOD.wrapping_neg() & MASK48);
        }
        intel_enable_all(pmu);
    };
    let mut counts = Vec::new();
    for deferred in [false, true] {
        let (mut pmu, fake) = intel();
        // Intel fixed counter 0 (instructions) counts too on the fake.
        pmu.set_deferred_reprogram(deferred);
        seq(&mut pmu);
        pmu.reprogram_dirty();
        calls(&fake);
        // The second time round every counter is running: before, a stop and a program each.
        seq(&mut pmu);
        let during = calls(&fake);
        pmu.reprogram_dirty();
        let at_entry = calls(&fake);
        assert_eq!(fake.running().len(), 7);
        counts.push((during.len(), at_entry.len(), programs(&at_entry)));
    }
    assert_eq!(counts, [(14, 0, 0), (0, 7, 7)]);
}

#[test]
fn a_read_before_the_entry_sees_the_written_value() {
    let (mut pmu, fake) = intel_running(true);
    fake.advance(GP0, 500);
    assert_eq!(
        rd(&mut pmu, a_pmc(0)),
        (PERIOD.wrapping_neg() + 500) & MASK48
    );
    // Write, then read back (RDMSR and RDPMC) before any entry.
    wr(&mut pmu, a_pmc(0), 1234);
    assert_eq!(pmu.dirty_counters(), GP0.mask());
    assert_eq!(rd(&mut pmu, a_pmc(0)), 1234);
    assert_eq!(pmu.rdpmc(0), Ok(1234));
    // The backend still runs the old program until the entry; nothing it counts meanwhile is
    // the new counter's.
    assert!(fake.advance(GP0, 99));
    assert_eq!(rd(&mut pmu, a_pmc(0)), 1234);
    pmu.reprogram_dirty();
    assert_eq!(pmu.dirty_counters(), 0);
    fake.advance(GP0, 10);
    assert_eq!(rd(&mut pmu, a_pmc(0)), 1244);
}

#[test]
fn a_counter_left_disabled_is_stopped_once_at_entry() {
    let (mut pmu, fake) = intel_running(true);
    wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, 0);
    wr(&mut pmu, a_pmc(0), 5);
    wr(&mut pmu, evtsel(0), 0);
    assert!(calls(&fake).is_empty());
    pmu.reprogram_dirty();
    assert_eq!(calls(&fake), [Call::Stop { ctr: GP0 }]);
    assert!(!fake.is_running(GP0));
    // Nothing dirty: no call at all.
    pmu.reprogram_dirty();
    assert!(calls(&fake).is_empty());
    // A stopped counter enabled and disabled again before the entry: no call either.
    wr(&mut pmu, evtsel(1), INTEL_CYCLES);
    wr(&mut pmu, evtsel(1), 0);
    pmu.reprogram_dirty();
    assert!(calls(&fake).is_empty());
}

#[test]
fn an_overflow_rearm_is_programmed_at_the_next_entry() {
    let (mut pmu, fake) = intel_running(true);
    fake.advance(GP0, PERIOD);
    let pmi = pmu.service_overflow().expect("a PMI");
    assert_eq!(pmi.counters, GP0.mask());
    assert_eq!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS), GP0.mask());
    assert_eq!(rd(&mut pmu, a_pmc(0)), 0);
    // The PMI handler's writes: disable, ack, re-arm, enable. One program at the entry.
    let (during, at_entry) = perf_sequence(&mut pmu, &fake, INTEL_CYCLES | EVTSEL_INT);
    assert!(during.is_empty(), "{during:?}");
    assert_eq!(programs(&at_entry), 1);
    assert_eq!(at_entry.len(), 1);
    fake.advance(GP0, PERIOD);
    assert!(pmu.service_overflow().is_some());
}

#[test]
fn amd_legacy_disable_rearm_enable_costs_one_program() {
    // AMD without global control: the driver disables each counter through its PERF_CTL,
    // writes the counter, and enables it again.
    for (deferred, want_during, want_entry) in [(false, 2, 0), (true, 0, 1)] {
        let (mut pmu, fake) = amd(AmdConfig::Legacy);
        pmu.set_deferred_reprogram(deferred);
        wr(&mut pmu, k7_ctl(0), AMD_CYCLES | EVTSEL_INT);
        pmu.reprogram_dirty();
        calls(&fake);
        wr(
            &mut pmu,
            k7_ctl(0),
            0x76 | EVTSEL_USR | EVTSEL_OS | EVTSEL_INT,
        );
        wr(&mut pmu, k7_ctr(0), PERIOD.wrapping_neg() & MASK48);
        wr(&mut pmu, k7_ctl(0), AMD_CYCLES | EVTSEL_INT);
        assert_eq!(rd(&mut pmu, k7_ctr(0)), PERIOD.wrapping_neg() & MASK48);
        let during = calls(&fake);
        pmu.reprogram_dirty();
        let at_entry = calls(&fake);
        assert_eq!(
            (during.len(), at_entry.len()),
            (want_during, want_entry),
            "deferred={deferred}: {during:?} / {at_entry:?}"
        );
    }
}

#[test]
fn the_filter_still_counts_each_refused_write_when_deferred() {
    let filter: vpmu::EventFilter = "deny:0x3c".parse().unwrap();
    let mut blocked = Vec::new();
    for deferred in [false, true] {
        let (mut pmu, fake) = intel();
        pmu.set_deferred_reprogram(deferred);
        pmu.set_event_filter(Some(filter.clone()));
        wr(&mut pmu, evtsel(0), INTEL_CYCLES);
        wr(&mut pmu, a_pmc(0), 7);
        wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, 1);
        pmu.reprogram_dirty();
        assert!(!fake.is_running(GP0));
        assert_eq!(rd(&mut pmu, a_pmc(0)), 7);
        blocked.push(pmu.filter_blocked());
    }
    assert_eq!(blocked[0], blocked[1]);
    assert!(blocked[0] >= 2, "{blocked:?}");
}

#[test]
fn turning_deferral_off_reprograms_what_is_dirty() {
    let (mut pmu, fake) = intel_running(true);
    wr(&mut pmu, a_pmc(0), 42);
    assert!(calls(&fake).is_empty());
    pmu.set_deferred_reprogram(false);
    assert_eq!(programs(&calls(&fake)), 1);
    assert_eq!(pmu.dirty_counters(), 0);
    wr(&mut pmu, a_pmc(0), 43);
    assert_eq!(programs(&calls(&fake)), 1);
}
