//! Overflow -> status bit -> PMI: ordering, interrupt bits, clearing, vendor differences, and
//! the PMI-handler sequences Linux's perf drivers run.

mod common;
use common::*;

/// Arms `ctr` (select `sel`) `period` events before its wrap, through the given MSRs.
fn arm(pmu: &mut Pmu, ctr_msr: u32, sel_msr: u32, sel: u64, period: u64) {
    wr(pmu, ctr_msr, (1 << 48) - period);
    wr(pmu, sel_msr, sel);
}

#[test]
fn intel_overflow_sets_status_then_reports_the_pmi() {
    let (mut pmu, fake) = intel();
    arm(
        &mut pmu,
        a_pmc(0),
        evtsel(0),
        INTEL_CYCLES | EVTSEL_INT,
        1000,
    );
    fake.advance(GP0, 999);
    assert_eq!(pmu.service_overflow(), None);
    assert_eq!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS), 0);
    fake.advance(GP0, 1);
    let pmi = pmu.service_overflow().expect("PMI due");
    assert_eq!(
        pmi,
        Pmi {
            counters: 1,
            mask_lvtpc: true
        }
    );
    assert_eq!(pmi.counter_ids().collect::<Vec<_>>(), [GP0]);
    assert_eq!(
        rd(&mut pmu, IA32_PERF_GLOBAL_STATUS),
        1,
        "status bit set with the PMI"
    );
    assert_eq!(rd(&mut pmu, pmc(0)), 0);
    assert_eq!(pmu.service_overflow(), None, "reported once");
    assert_eq!(fake.armed(GP0), Some(1 << 48), "re-armed for the next wrap");
}

/// The status bit is visible as soon as the guest could notice the overflow, even before the
/// backend's report is serviced; the PMI still follows.
#[test]
fn status_is_set_before_the_backend_report_is_serviced() {
    let (mut pmu, fake) = intel();
    arm(&mut pmu, a_pmc(1), evtsel(1), INTEL_CYCLES | EVTSEL_INT, 10);
    fake.advance(GP1, 15);
    assert_eq!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS), 0b10);
    assert_eq!(rd(&mut pmu, pmc(1)), 5);
    assert_eq!(pmu.service_overflow().map(|p| p.counters), Some(0b10));
}

/// Reading the counter also notices the wrap (value and status agree at every instant).
#[test]
fn reading_a_wrapped_counter_sets_its_status() {
    let (mut pmu, fake) = intel();
    arm(&mut pmu, a_pmc(0), evtsel(0), INTEL_CYCLES, 10);
    fake.advance(GP0, 10);
    assert_eq!(rd(&mut pmu, pmc(0)), 0);
    assert_eq!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS), 1);
}

#[test]
fn no_pmi_after_the_guest_cleared_the_status_bit() {
    #[rustfmt::skip]
    let cases: &[(&str, PmuConfig, u32, u32, u32, u32)] = &[
        // (name, config, counter msr, select msr, status msr, clear msr)
        ("intel", PmuConfig::intel(), a_pmc(0), evtsel(0), IA32_PERF_GLOBAL_STATUS, IA32_PERF_GLOBAL_OVF_CTRL),
        ("amd v2", PmuConfig::amd(), k7_ctr(0), k7_ctl(0), AMD_PERF_CNTR_GLOBAL_STATUS, AMD_PERF_CNTR_GLOBAL_STATUS_CLR),
    ];
    for &(name, config, ctr, sel, status, clear) in cases {
        let (mut pmu, fake) = pmu(config);
        let sel_value = if config.vendor() == Vendor::Intel {
            INTEL_CYCLES
        } else {
            AMD_CYCLES
        };
        arm(&mut pmu, ctr, sel, sel_value | EVTSEL_INT, 100);
        fake.advance(GP0, 100);
        // The guest sees the overflow (e.g. its handler for another NMI polls the status) and
        // acknowledges it before the VMM serviced the backend's report.
        assert_eq!(rd(&mut pmu, status), 1, "{name}");
        wr(&mut pmu, clear, 1);
        assert_eq!(pmu.service_overflow(), None, "{name}: cleared, no PMI");
        // The next overflow interrupts again.
        wr(&mut pmu, ctr, (1 << 48) - 5);
        fake.advance(GP0, 5);
        assert_eq!(
            pmu.service_overflow().map(|p| p.counters),
            Some(1),
            "{name}"
        );
    }
}

#[test]
fn only_counters_with_the_interrupt_bit_raise_a_pmi() {
    let (mut pmu, fake) = intel();
    intel_enable_all(&mut pmu);
    arm(&mut pmu, a_pmc(0), evtsel(0), INTEL_CYCLES, 10); // no INT
    arm(&mut pmu, a_pmc(1), evtsel(1), INTEL_CYCLES | EVTSEL_INT, 10);
    wr(&mut pmu, fixed_ctr(0), (1 << 48) - 10);
    wr(&mut pmu, fixed_ctr(1), (1 << 48) - 10);
    wr(&mut pmu, IA32_FIXED_CTR_CTRL, 0x0b3); // fixed0 without PMI, fixed1 with PMI
    fake.advance_all(10);
    let pmi = pmu.service_overflow().unwrap();
    assert_eq!(pmi.counters, GP1.mask() | FIXED1.mask());
    assert_eq!(
        rd(&mut pmu, IA32_PERF_GLOBAL_STATUS),
        GP0.mask() | GP1.mask() | FIXED0.mask() | FIXED1.mask(),
        "every overflow sets status, with or without PMI"
    );
}

#[test]
fn amd_legacy_shows_overflow_as_bit_47_clearing_and_does_not_mask_lvtpc() {
    for config in [AmdConfig::Legacy, AmdConfig::CoreExt] {
        let (mut pmu, fake) = amd(config);
        arm(
            &mut pmu,
            k7_ctr(2),
            k7_ctl(2),
            AMD_CYCLES | EVTSEL_INT,
            0x1000,
        );
        let id = CounterId::gp(2);
        fake.advance(id, 0xfff);
        assert_ne!(rd(&mut pmu, k7_ctr(2)) & 1 << 47, 0, "{config:?}: not yet");
        assert_eq!(pmu.service_overflow(), None);
        fake.advance(id, 1);
        assert_eq!(
            rd(&mut pmu, k7_ctr(2)) & 1 << 47,
            0,
            "{config:?}: overflowed"
        );
        let pmi = pmu.service_overflow().unwrap();
        assert_eq!(
            pmi,
            Pmi {
                counters: 0b100,
                mask_lvtpc: false
            }
        );
        assert!(!pmu.mask_lvtpc_after_pmi());
    }
}

#[test]
fn amd_v2_status_set_raises_no_pmi() {
    let (mut pmu, _) = amd(AMD_V2);
    wr(&mut pmu, k7_ctl(0), AMD_CYCLES | EVTSEL_INT);
    wr(&mut pmu, AMD_PERF_CNTR_GLOBAL_STATUS_SET, 1);
    assert_eq!(pmu.service_overflow(), None);
    assert_eq!(rd(&mut pmu, AMD_PERF_CNTR_GLOBAL_STATUS), 1);
}

#[test]
fn a_spurious_report_is_re_armed_not_delivered() {
    let (mut pmu, fake) = intel();
    arm(
        &mut pmu,
        a_pmc(0),
        evtsel(0),
        INTEL_CYCLES | EVTSEL_INT,
        100,
    );
    fake.advance(GP0, 40);
    fake.raise_overflow(GP0);
    assert_eq!(pmu.service_overflow(), None);
    assert_eq!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS), 0);
    assert_eq!(rd(&mut pmu, pmc(0)), (1 << 48) - 60);
    assert_eq!(
        fake.armed(GP0),
        Some(60),
        "re-armed for the rest of the period"
    );
    fake.advance(GP0, 60);
    assert_eq!(pmu.service_overflow().map(|p| p.counters), Some(1));
}

#[test]
fn a_late_report_keeps_the_counts_past_the_wrap() {
    let (mut pmu, fake) = amd(AmdConfig::Legacy);
    arm(&mut pmu, k7_ctr(0), k7_ctl(0), AMD_CYCLES | EVTSEL_INT, 100);
    fake.advance(GP0, 100);
    fake.advance(GP0, 23); // counted on before the VMM got to it
    assert!(pmu.service_overflow().is_some());
    assert_eq!(rd(&mut pmu, k7_ctr(0)), 23);
    assert_eq!(fake.armed(GP0), Some((1 << 48) - 23));
}

#[test]
fn an_overflow_found_when_stopping_a_counter_is_still_delivered() {
    let (mut pmu, fake) = intel();
    arm(&mut pmu, a_pmc(0), evtsel(0), INTEL_CYCLES | EVTSEL_INT, 8);
    fake.advance(GP0, 8);
    // The guest freezes all counters before the VMM serviced the report.
    wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, 0);
    assert!(!fake.is_running(GP0));
    assert_eq!(pmu.service_overflow().map(|p| p.counters), Some(1));
    assert_eq!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS), 1);
}

#[test]
fn overflows_of_several_counters_make_one_pmi() {
    let (mut pmu, fake) = amd(AMD_V2);
    for i in [1u32, 4] {
        arm(
            &mut pmu,
            core_ctr(i),
            core_ctl(i),
            AMD_CYCLES | EVTSEL_INT,
            50,
        );
    }
    fake.advance_all(50);
    assert_eq!(pmu.service_overflow().map(|p| p.counters), Some(0b1_0010));
    assert_eq!(rd(&mut pmu, AMD_PERF_CNTR_GLOBAL_STATUS), 0b1_0010);
}

/// What Linux's Intel driver does in its PMI handler (intel_pmu_handle_irq, v2 path): freeze
/// with GLOBAL_CTRL = 0, read and acknowledge GLOBAL_STATUS, reload the counter with -period,
/// unfreeze. The cycle repeats, one PMI per period.
#[test]
fn intel_pmi_handler_cycle_repeats() {
    let (mut pmu, fake) = intel();
    let period = 100_000u64;
    wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, 0);
    wr(&mut pmu, fixed_ctr(1), (1 << 48) - period);
    wr(&mut pmu, IA32_FIXED_CTR_CTRL, 0xb0); // fixed1: cycles, OS+USR, PMI (NMI watchdog)
    wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, 0x7_0000_000f);
    for round in 0..5 {
        fake.advance(FIXED1, period + 17);
        let pmi = pmu.service_overflow().expect("PMI");
        assert_eq!(pmi.counters, FIXED1.mask(), "round {round}");
        wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, 0);
        let status = rd(&mut pmu, IA32_PERF_GLOBAL_STATUS);
        assert_eq!(status, FIXED1.mask());
        wr(&mut pmu, IA32_PERF_GLOBAL_OVF_CTRL, status);
        assert_eq!(
            pmu.rdpmc(1 << 30 | 1),
            Ok(17),
            "RDPMC in x86_perf_event_update"
        );
        wr(&mut pmu, fixed_ctr(1), (1 << 48) - period);
        wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, 0x7_0000_000f);
        assert_eq!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS), 0);
        assert_eq!(fake.armed(FIXED1), Some(period));
        assert_eq!(pmu.service_overflow(), None);
    }
}

/// What Linux's AMD PerfMonV2 handler does (amd_pmu_v2_handle_irq): GLOBAL_CTL = 0, read
/// GLOBAL_STATUS, reload, GLOBAL_STATUS_CLR, GLOBAL_CTL back.
#[test]
fn amd_v2_pmi_handler_cycle_repeats() {
    let (mut pmu, fake) = amd(AMD_V2);
    let period = 4096u64;
    arm(
        &mut pmu,
        core_ctr(0),
        core_ctl(0),
        AMD_CYCLES | EVTSEL_INT,
        period,
    );
    for round in 0..5 {
        fake.advance(GP0, period);
        assert_eq!(
            pmu.service_overflow().map(|p| p.counters),
            Some(1),
            "round {round}"
        );
        wr(&mut pmu, AMD_PERF_CNTR_GLOBAL_CTL, 0);
        let status = rd(&mut pmu, AMD_PERF_CNTR_GLOBAL_STATUS);
        assert_eq!(status, 1);
        assert_eq!(pmu.rdpmc(0), Ok(0));
        wr(&mut pmu, core_ctr(0), (1 << 48) - period);
        wr(&mut pmu, AMD_PERF_CNTR_GLOBAL_STATUS_CLR, status);
        wr(&mut pmu, AMD_PERF_CNTR_GLOBAL_CTL, 0x3f);
        assert_eq!(pmu.service_overflow(), None);
    }
}

/// Linux's legacy AMD handler (x86_pmu_handle_irq): a counter overflowed iff bit 47 is clear;
/// reload with -period. No status register.
#[test]
fn amd_legacy_pmi_handler_cycle_repeats() {
    let (mut pmu, fake) = amd(AmdConfig::Legacy);
    let period = 250_000u64;
    arm(
        &mut pmu,
        k7_ctr(0),
        k7_ctl(0),
        AMD_CYCLES | EVTSEL_INT,
        period,
    );
    for _ in 0..5 {
        fake.advance(GP0, period);
        assert_eq!(pmu.service_overflow().map(|p| p.counters), Some(1));
        let v = pmu.rdpmc(0).unwrap();
        assert_eq!(v & 1 << 47, 0, "overflowed");
        wr(&mut pmu, k7_ctr(0), (1 << 48) - period);
        assert_ne!(pmu.rdpmc(0).unwrap() & 1 << 47, 0);
    }
}

#[test]
fn overflow_reports_for_stopped_counters_are_ignored() {
    let (mut pmu, fake) = intel();
    fake.raise_overflow(GP1);
    fake.raise_overflow(CounterId::gp(7));
    assert_eq!(pmu.service_overflow(), None);
    assert_eq!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS), 0);
}
