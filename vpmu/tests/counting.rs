//! When counters count, what the backend is asked to count, and how values advance, wrap and
//! get armed.

mod common;
use common::*;

/// Intel: a GP counter counts only when its EN bit, at least one of USR/OS, and its
/// IA32_PERF_GLOBAL_CTRL bit are set.
#[test]
fn intel_gp_counter_needs_enable_privilege_and_global_bit() {
    #[rustfmt::skip]
    let cases: &[(&str, u64, u64, bool)] = &[
        // (name, evtsel, global ctrl, counts)
        ("EN + global", INTEL_CYCLES, 0x1, true),
        ("EN, global clear", INTEL_CYCLES, 0x0, false),
        ("EN, other counter's global bit", INTEL_CYCLES, 0x2, false),
        ("no EN", 0x3c | EVTSEL_USR | EVTSEL_OS, 0x1, false),
        ("EN, neither USR nor OS", 0x3c | EVTSEL_EN, 0x1, false),
        ("EN + USR only", 0x3c | EVTSEL_EN | EVTSEL_USR, 0x1, true),
        ("EN + OS only", 0x3c | EVTSEL_EN | EVTSEL_OS, 0x1, true),
    ];
    for &(name, sel, global, counts) in cases {
        // Both orders of writing the two registers.
        for global_first in [false, true] {
            let (mut pmu, fake) = intel();
            if global_first {
                wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, global);
                wr(&mut pmu, evtsel(0), sel);
            } else {
                wr(&mut pmu, evtsel(0), sel);
                wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, global);
            }
            assert_eq!(fake.is_running(GP0), counts, "{name}");
            fake.advance(GP0, 100);
            let want = if counts { 100 } else { 0 };
            assert_eq!(rd(&mut pmu, pmc(0)), want, "{name}");
        }
    }
}

/// Intel fixed counters: the OS/USR fields of IA32_FIXED_CTR_CTRL enable them, the global bit
/// 32+i gates them, and each counts its built-in event.
#[test]
fn intel_fixed_counter_fields_and_global_bits() {
    /// Per fixed counter: None = stopped, Some((usr, os)) = counting at those levels.
    type Want = [Option<(bool, bool)>; 3];
    #[rustfmt::skip]
    let cases: &[(&str, u64, u64, Want)] = &[
        // (name, fixed ctrl, global ctrl, want)
        ("all off", 0x000, 0x7_0000_0000, [None, None, None]),
        ("ctr0 OS", 0x001, 0x7_0000_0000, [Some((false, true)), None, None]),
        ("ctr1 USR", 0x020, 0x7_0000_0000, [None, Some((true, false)), None]),
        ("ctr2 both + PMI", 0xb00, 0x7_0000_0000, [None, None, Some((true, true))]),
        ("PMI alone does not enable", 0x888, 0x7_0000_0000, [None, None, None]),
        ("all on, global only ctr1", 0x333, 0x2_0000_0000, [None, Some((true, true)), None]),
        ("all on, GP global bits only", 0x333, 0xf, [None, None, None]),
    ];
    for &(name, ctrl, global, want) in cases {
        let (mut pmu, fake) = intel();
        wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, global);
        wr(&mut pmu, IA32_FIXED_CTR_CTRL, ctrl);
        for (i, w) in want.into_iter().enumerate() {
            let id = CounterId::fixed(i as u8);
            let got = fake.event(id).map(|e| (e.usr, e.os));
            assert_eq!(got, w, "{name}: fixed{i}");
            if let Some(e) = fake.event(id) {
                assert_eq!(e, Event::intel_fixed(i as u8, e.usr, e.os), "{name}");
            }
        }
    }
}

#[test]
fn amd_legacy_counts_on_enable_alone_and_perfmon_v2_adds_the_global_gate() {
    for config in [AmdConfig::Legacy, AmdConfig::CoreExt] {
        let (mut pmu, fake) = amd(config);
        wr(&mut pmu, k7_ctl(0), AMD_CYCLES);
        assert!(fake.is_running(GP0), "{config:?}");
        wr(&mut pmu, k7_ctl(0), AMD_CYCLES & !EVTSEL_EN);
        assert!(!fake.is_running(GP0), "{config:?}");
    }
    let (mut pmu, fake) = amd(AMD_V2);
    wr(&mut pmu, core_ctl(5), AMD_CYCLES);
    assert!(
        fake.is_running(CounterId::gp(5)),
        "reset value of GLOBAL_CTL enables"
    );
    wr(&mut pmu, AMD_PERF_CNTR_GLOBAL_CTL, 0x1f);
    assert!(!fake.is_running(CounterId::gp(5)));
    wr(&mut pmu, AMD_PERF_CNTR_GLOBAL_CTL, 0x3f);
    assert!(fake.is_running(CounterId::gp(5)));
    wr(&mut pmu, core_ctl(5), AMD_CYCLES & !EVTSEL_EN);
    assert!(!fake.is_running(CounterId::gp(5)), "EN still needed");
}

#[test]
fn the_backend_gets_the_decoded_event() {
    let (mut pmu, fake) = intel();
    // LLC misses, USR only, edge, inv, cmask 3.
    wr(&mut pmu, evtsel(2), 0x0395_412e | EVTSEL_EN);
    let e = fake.event(CounterId::gp(2)).unwrap();
    assert_eq!((e.vendor, e.code, e.umask), (Vendor::Intel, 0x2e, 0x41));
    assert!(e.usr && !e.os && e.edge && e.inv);
    assert_eq!((e.cmask, e.fixed), (3, None));
    assert_eq!(e.arch_event(), Some(vpmu::ArchEvent::LlcMisses));

    let (mut pmu, fake) = amd(AMD_V2);
    wr(&mut pmu, core_ctl(4), 0x2_0052_00c1 | EVTSEL_EN);
    let e = fake.event(CounterId::gp(4)).unwrap();
    assert_eq!((e.vendor, e.code, e.umask), (Vendor::Amd, 0x2c1, 0x00));
    assert!(!e.usr && e.os && !e.edge);
}

#[test]
fn unsupported_events_do_not_count_and_do_not_fault() {
    let only_cycles =
        FakeBackend::with_support(|e| e.arch_event() == Some(vpmu::ArchEvent::CoreCycles));
    let (mut pmu, fake) = pmu_with(PmuConfig::intel(), only_cycles);
    wr(&mut pmu, evtsel(0), 0xc0 | ON); // instructions: unsupported
    wr(&mut pmu, evtsel(1), INTEL_CYCLES);
    intel_enable_all(&mut pmu);
    wr(&mut pmu, IA32_FIXED_CTR_CTRL, 0x333);
    assert_eq!(fake.running(), vec![GP1, FIXED1]);
    fake.advance_all(10);
    assert_eq!(rd(&mut pmu, pmc(0)), 0);
    assert_eq!(rd(&mut pmu, pmc(1)), 10);
    assert_eq!(rd(&mut pmu, fixed_ctr(0)), 0);
    assert_eq!(rd(&mut pmu, fixed_ctr(1)), 10);
    // CPUID told the guest that GP instructions are unavailable (not noted); the fixed counters
    // of uncounted events (0: instructions, 2: reference cycles here) are noted.
    let noted: Vec<String> = pmu.uncounted().iter().map(|(u, _)| u.to_string()).collect();
    assert_eq!(noted, ["fixed counter 0", "fixed counter 2"]);
}

#[test]
fn uncounted_events_are_noted_once_each() {
    // AMD has no CPUID bits for unavailable events: the model notes each event the backend
    // cannot count, once, so the VMM can say why the guest reads 0 for it.
    let only_cycles =
        FakeBackend::with_support(|e| e.arch_event() == Some(vpmu::ArchEvent::CoreCycles));
    let (mut pmu, fake) = pmu_with(PmuConfig::Amd(AmdConfig::Legacy), only_cycles);
    for _ in 0..3 {
        wr(&mut pmu, k7_ctl(0), 0xc0 | ON); // instructions
        wr(&mut pmu, k7_ctl(0), 0);
    }
    wr(&mut pmu, k7_ctl(1), 0xc2 | ON); // branches
    wr(&mut pmu, k7_ctl(2), AMD_CYCLES);
    assert_eq!(fake.running(), vec![CounterId::gp(2)]);
    let noted: Vec<(String, Option<vpmu::ArchEvent>)> = pmu
        .uncounted()
        .iter()
        .map(|(u, a)| (u.to_string(), *a))
        .collect();
    assert_eq!(
        noted,
        [
            (
                "event 0xc0/0x00".to_string(),
                Some(vpmu::ArchEvent::Instructions)
            ),
            (
                "event 0xc2/0x00".to_string(),
                Some(vpmu::ArchEvent::Branches)
            ),
        ]
    );
}

#[test]
fn values_fold_across_stop_and_restart() {
    let (mut pmu, fake) = intel();
    wr(&mut pmu, evtsel(0), INTEL_CYCLES);
    fake.advance(GP0, 100);
    assert_eq!(rd(&mut pmu, pmc(0)), 100);
    wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, 0); // freeze
    assert!(!fake.is_running(GP0));
    assert_eq!(rd(&mut pmu, pmc(0)), 100);
    assert!(!fake.advance(GP0, 1_000), "stopped counters do not count");
    wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, 0xf);
    fake.advance(GP0, 50);
    assert_eq!(rd(&mut pmu, pmc(0)), 150);
    // Changing the event folds too.
    wr(&mut pmu, evtsel(0), 0xc0 | ON);
    fake.advance(GP0, 7);
    assert_eq!(rd(&mut pmu, pmc(0)), 157);
    assert_eq!(fake.event(GP0).unwrap().code, 0xc0);
}

#[test]
fn writing_a_running_counter_restarts_it_from_the_new_value() {
    let (mut pmu, fake) = amd(AmdConfig::Legacy);
    wr(&mut pmu, k7_ctl(1), AMD_CYCLES);
    fake.advance(GP1, 500);
    wr(&mut pmu, k7_ctr(1), 1000);
    assert_eq!(rd(&mut pmu, k7_ctr(1)), 1000);
    fake.advance(GP1, 5);
    assert_eq!(rd(&mut pmu, k7_ctr(1)), 1005);
}

#[test]
fn counters_wrap_at_48_bits() {
    #[rustfmt::skip]
    let cases: &[(&str, PmuConfig, u32, u32, u64, u64, u64)] = &[
        // (name, config, select msr, counter msr, select, start, advance) -> expect start+advance mod 2^48
        ("intel gp", PmuConfig::intel(), evtsel(0), a_pmc(0), INTEL_CYCLES, MASK48 - 0xf, 0x20),
        ("intel gp exactly to 0", PmuConfig::intel(), evtsel(0), a_pmc(0), INTEL_CYCLES, MASK48, 1),
        ("intel fixed", PmuConfig::intel(), IA32_FIXED_CTR_CTRL, fixed_ctr(0), 0x3, MASK48 - 1, 3),
        ("amd legacy", PmuConfig::Amd(AmdConfig::Legacy), k7_ctl(0), k7_ctr(0), AMD_CYCLES, MASK48 - 0xff, 0x1000),
        ("amd v2", PmuConfig::amd(), core_ctl(5), core_ctr(5), AMD_CYCLES, MASK48, 0x10),
    ];
    for &(name, config, sel_msr, ctr_msr, sel, start, n) in cases {
        let (mut pmu, fake) = pmu(config);
        wr_any(&mut pmu, IA32_PERF_GLOBAL_CTRL, 0x7_0000_000f);
        wr(&mut pmu, ctr_msr, start);
        wr(&mut pmu, sel_msr, sel);
        fake.advance_all(n);
        let want = start.wrapping_add(n) & MASK48;
        assert_eq!(rd(&mut pmu, ctr_msr), want, "{name}: running");
        pmu.service_overflow();
        assert_eq!(rd(&mut pmu, ctr_msr), want, "{name}: after service");
        fake.advance_all(1);
        assert_eq!(
            rd(&mut pmu, ctr_msr),
            (want + 1) & MASK48,
            "{name}: re-armed and counting"
        );
    }
}

/// `wr` that tolerates #GP, for tables that mix vendors.
fn wr_any(pmu: &mut Pmu, msr: u32, v: u64) {
    let _ = pmu.wrmsr(msr, v);
}

/// The guest writes -period; the backend is armed with overflow_after = 2^48 - value.
#[test]
fn arming_programs_the_distance_to_the_wrap() {
    /// (name, config, counter msr, value written, select msr, select, expected overflow_after)
    type Case = (&'static str, PmuConfig, u32, u64, u32, u64, Option<u64>);
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("intel pmc -4096 (sign-extended)", PmuConfig::intel(), pmc(0), 0xffff_f000, evtsel(0), INTEL_CYCLES | EVTSEL_INT, Some(0x1000)),
        ("intel a_pmc -4096", PmuConfig::intel(), a_pmc(0), 0xffff_ffff_f000, evtsel(0), INTEL_CYCLES | EVTSEL_INT, Some(0x1000)),
        ("intel pmc -1", PmuConfig::intel(), pmc(0), 0xffff_ffff, evtsel(0), INTEL_CYCLES | EVTSEL_INT, Some(1)),
        ("intel value 0: a full period", PmuConfig::intel(), pmc(0), 0, evtsel(0), INTEL_CYCLES | EVTSEL_INT, Some(1 << 48)),
        ("intel without INT still armed (status)", PmuConfig::intel(), pmc(0), 0xffff_0000, evtsel(0), INTEL_CYCLES, Some(0x1_0000)),
        ("intel fixed -1000", PmuConfig::intel(), fixed_ctr(0), (1 << 48) - 1000, IA32_FIXED_CTR_CTRL, 0xb, Some(1000)),
        ("amd legacy with INT", PmuConfig::Amd(AmdConfig::Legacy), k7_ctr(0), 0xffff_ffff_f000, k7_ctl(0), AMD_CYCLES | EVTSEL_INT, Some(0x1000)),
        ("amd legacy without INT: not armed", PmuConfig::Amd(AmdConfig::Legacy), k7_ctr(0), 0xffff_ffff_f000, k7_ctl(0), AMD_CYCLES, None),
        ("amd v2 without INT still armed (status)", PmuConfig::amd(), k7_ctr(0), 0xffff_ffff_f000, k7_ctl(0), AMD_CYCLES, Some(0x1000)),
        ("amd drops bits above 48", PmuConfig::amd(), k7_ctr(0), u64::MAX - 0xfff, k7_ctl(0), AMD_CYCLES | EVTSEL_INT, Some(0x1000)),
    ];
    for &(name, config, ctr_msr, value, sel_msr, sel, want) in cases {
        // Value first, then enable; and enable first, then value (re-arm of a running counter).
        for value_first in [true, false] {
            let (mut pmu, fake) = pmu(config);
            wr_any(&mut pmu, IA32_PERF_GLOBAL_CTRL, 0x7_0000_000f);
            if value_first {
                wr(&mut pmu, ctr_msr, value);
                wr(&mut pmu, sel_msr, sel);
            } else {
                wr(&mut pmu, sel_msr, sel);
                wr(&mut pmu, ctr_msr, value);
            }
            let id = fake.running()[0];
            assert_eq!(fake.armed(id), want, "{name} (value first: {value_first})");
        }
    }
}

#[test]
fn scale_converts_backend_units_both_ways() {
    let (mut pmu, fake) = amd(AmdConfig::Legacy);
    fake.set_scale(Scale::new(13, 5)); // 2.6 guest events per backend unit
    wr(&mut pmu, k7_ctr(0), (1 << 48) - 1000);
    wr(&mut pmu, k7_ctl(0), AMD_CYCLES | EVTSEL_INT);
    // ceil(1000 * 5 / 13) = 385 units make 1001 events: the first that reaches 1000.
    assert_eq!(fake.armed(GP0), Some(385));
    fake.advance(GP0, 5);
    assert_eq!(rd(&mut pmu, k7_ctr(0)), (1 << 48) - 1000 + 13);
    fake.advance(GP0, 380);
    assert_eq!(pmu.service_overflow().map(|p| p.counters), Some(1));
    assert_eq!(
        rd(&mut pmu, k7_ctr(0)),
        1,
        "385 units = 1001 events: one past the wrap"
    );
}

#[test]
fn rewriting_the_same_select_does_not_reprogram() {
    let (mut pmu, fake) = intel();
    wr(&mut pmu, evtsel(0), INTEL_CYCLES);
    wr(&mut pmu, evtsel(0), INTEL_CYCLES);
    wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, 0xf);
    wr(&mut pmu, IA32_FIXED_CTR_CTRL, 0);
    assert_eq!(fake.calls().len(), 1, "{:?}", fake.calls());
    // Disabled counters being reconfigured never reach the backend.
    wr(&mut pmu, evtsel(1), 0xc0);
    wr(&mut pmu, evtsel(1), 0xc4 | EVTSEL_USR);
    wr(&mut pmu, pmc(1), 1234);
    assert_eq!(fake.calls().len(), 1, "{:?}", fake.calls());
}

#[test]
fn program_and_stop_calls_follow_the_guest() {
    let (mut pmu, fake) = intel();
    wr(&mut pmu, evtsel(0), INTEL_CYCLES);
    wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, 0);
    wr(&mut pmu, IA32_PERF_GLOBAL_CTRL, 0xf);
    wr(&mut pmu, evtsel(0), 0);
    let calls = fake.take_calls();
    let kinds: Vec<&str> = calls
        .iter()
        .map(|c| match c {
            Call::Program { ctr, .. } if *ctr == GP0 => "program",
            Call::Stop { ctr } if *ctr == GP0 => "stop",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["program", "stop", "program", "stop"]);
}

#[test]
fn a_backend_failure_leaves_the_counter_stopped_without_a_fault() {
    let (mut pmu, fake) = intel();
    fake.fail_program(true);
    wr(&mut pmu, evtsel(0), INTEL_CYCLES);
    assert!(!fake.is_running(GP0));
    fake.advance(GP0, 10);
    assert_eq!(rd(&mut pmu, pmc(0)), 0);
    fake.fail_program(false);
    wr(&mut pmu, evtsel(0), INTEL_CYCLES | EVTSEL_INT);
    assert!(fake.is_running(GP0), "the next change retries");
}

#[test]
fn reset_stops_everything_and_restores_power_on_values() {
    let (mut pmu, fake) = intel();
    intel_enable_all(&mut pmu);
    wr(&mut pmu, evtsel(0), INTEL_CYCLES | EVTSEL_INT);
    wr(&mut pmu, pmc(0), 0xffff_fff0);
    wr(&mut pmu, IA32_FIXED_CTR_CTRL, 0x333);
    fake.advance_all(0x20);
    assert!(rd(&mut pmu, IA32_PERF_GLOBAL_STATUS) != 0);
    pmu.reset();
    assert!(fake.running().is_empty());
    for (msr, want) in [
        (evtsel(0), 0),
        (pmc(0), 0),
        (fixed_ctr(0), 0),
        (IA32_FIXED_CTR_CTRL, 0),
        (IA32_PERF_GLOBAL_CTRL, 0xf),
        (IA32_PERF_GLOBAL_STATUS, 0),
    ] {
        assert_eq!(rd(&mut pmu, msr), want, "{msr:#x}");
    }
    assert_eq!(pmu.service_overflow(), None, "pending PMIs are dropped");
}

#[test]
fn guest_entry_and_exit_reach_the_backend() {
    let (mut pmu, fake) = intel();
    pmu.enter_guest();
    pmu.leave_guest();
    pmu.enter_guest();
    assert_eq!(fake.guest_switches(), (2, 1));
}

/// A run-time switch of the accounting mode keeps the counts so far, re-arms the running
/// counters (with the overflow point still where the guest put it) and leaves stopped ones alone.
#[test]
fn mode_switch_keeps_counts_and_rearms_running_counters() {
    let (mut pmu, fake) = intel();
    intel_enable_all(&mut pmu);
    wr(&mut pmu, pmc(0), 0);
    wr(&mut pmu, evtsel(0), INTEL_CYCLES | EVTSEL_INT);
    wr(&mut pmu, pmc(0), MASK48 - 999); // 1000 to the overflow (sign-extended from bit 31)
    let armed_before = fake.armed(GP0);
    fake.advance(GP0, 400);
    fake.take_calls();
    pmu.set_accounting_mode(vpmu::AccountingMode::DomainSwitch);
    let calls = fake.take_calls();
    assert!(
        calls.contains(&vpmu::fake::Call::SetMode(
            vpmu::AccountingMode::DomainSwitch
        )),
        "{calls:?}"
    );
    assert!(fake.is_running(GP0), "the counter must keep running");
    assert!(!fake.is_running(GP1), "a stopped counter stays stopped");
    assert_eq!(fake.count(GP0), 0, "re-programmed from its folded value");
    // 400 counted before the switch: 600 left to the overflow.
    assert_eq!(armed_before.map(|a| a - 400), fake.armed(GP0));
    fake.advance(GP0, 100);
    let v = rd(&mut pmu, pmc(0));
    assert_eq!(v, MASK48 - 999 + 500, "value {v:#x}");
}

#[test]
fn a_guest_cycling_through_event_codes_is_noted_a_bounded_number_of_times() {
    // An AMD-model guest can write ~2^20 distinct event codes the backend cannot count. The
    // list the report shows stays at MAX_UNCOUNTED_NOTED, and no search over it grows.
    let only_cycles =
        FakeBackend::with_support(|e| e.arch_event() == Some(vpmu::ArchEvent::CoreCycles));
    let (mut pmu, _fake) = pmu_with(PmuConfig::Amd(AmdConfig::Legacy), only_cycles);
    for code in 0..20_000u64 {
        let sel = (code & 0xff) | ((code >> 8) & 0xf) << 32 | ((code >> 12) & 0xff) << 8;
        wr(&mut pmu, k7_ctl(0), sel | ON);
    }
    assert_eq!(pmu.uncounted().len(), vpmu::MAX_UNCOUNTED_NOTED);
    let total = vpmu::guest_log::totals()
        .into_iter()
        .find(|t| t.kind == "vpmu-uncounted-event")
        .expect("the limiter counted them");
    // Other tests in this process note a few too; without the cap it would be ~20000.
    assert!(
        total.seen < 2 * vpmu::MAX_UNCOUNTED_NOTED as u64,
        "{total:?}"
    );
}
