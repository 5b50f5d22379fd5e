//! Tier 2 for tracing and host-side profiles: tiny guests on real /dev/kvm with a known
//! exit mix (exact counts in the trace) and a known split of guest vs VMM time (where the host
//! profile's samples land in cpu-switch and domain-switch).

mod common;

use std::time::Duration;

use analysis::profile::report;
use analysis::profile::symbols::SymbolTable;
use analysis::trace::format::{Reason, Record, Trace};
use analysis::trace::read::Records;
use analysis::trace::summary;
use runtime::end::VmEnd;
use runtime::trace::{ProfileClock, ProfileConfig};

#[test]
fn exit_mix_counts_are_exact() {
    if !common::kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mix.trace");
    let r = common::run_tiny_with(&tiny_guests::EXIT_MIX64, Duration::from_secs(60), |cfg| {
        cfg.const_msrs = vec![0xc001_0004];
        cfg.record.trace = Some(path.clone());
    });
    assert_eq!(r.report.end, VmEnd::PowerOff, "console: {}", r.console);
    let t = Trace::read_file(&path).unwrap();
    assert!(t.has_exits() && !t.has_samples());
    assert_eq!(t.header.vcpus, 1);
    let s = summary::summarize(&t).unwrap();
    assert_eq!(s.vcpus[0].dropped, 0);
    let count = |m: &std::collections::BTreeMap<(u32, bool), summary::Stats>, k| {
        m.get(&k).map(|s| s.count()).unwrap_or(0)
    };
    assert_eq!(count(&s.ports, (0x80, true)), 1000, "port 0x80 writes");
    assert_eq!(count(&s.ports, (0x80, false)), 10, "port 0x80 reads");
    assert_eq!(count(&s.ports, (0x600, true)), 1, "ACPI power-off write");
    assert_eq!(count(&s.msrs, (0xc001_0004, false)), 100, "MSR reads");
    assert_eq!(s.ports.len(), 3, "{:?}", s.ports.keys());
    assert_eq!(s.msrs.len(), 1);
    // The trace agrees with the VMM's own exit counts, kind by kind.
    let c = &r.report.exits[0];
    let v = &s.vcpus[0];
    let n = |reason| v.reasons.get(&reason).map(|s| s.count()).unwrap_or(0);
    assert_eq!(
        (
            n(Reason::IoOut),
            n(Reason::IoIn),
            n(Reason::MsrRead),
            n(Reason::Interrupted)
        ),
        (c.io_out, c.io_in, c.msr, c.interrupted)
    );
    assert_eq!(n(Reason::IoOut), 1001);
    // Times are consistent: every exit re-entered after it exited (but the last one, which
    // ended the run), and the three parts add up to the wall time.
    let exits: Vec<_> = t.vcpus[0]
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Exit {
                exit_tsc,
                entry_tsc,
                ..
            } => Some((*exit_tsc, *entry_tsc)),
            _ => None,
        })
        .collect();
    assert!(exits[..exits.len() - 1].iter().all(|(x, e)| e > x));
    assert!(exits.windows(2).all(|w| w[1].0 >= w[0].1));
    let sp = v.split;
    assert_eq!(sp.in_guest + sp.in_vmm + sp.halted, sp.wall);
    assert!(sp.in_vmm > 0 && sp.wall > 0);
    let text = summary::render(&t, &s, "mix");
    eprintln!("{text}");
    assert!(text.contains("0x0080 out") && text.contains("0xc0010004 rd"));
}

/// Where samples land: (in compute, in io_heavy, elsewhere), and the run.
fn profile_run(clock: ProfileClock) -> (u64, u64, u64, Trace) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.trace");
    let r = common::run_tiny_with(&tiny_guests::PROFILE64, Duration::from_secs(120), |cfg| {
        cfg.io_delay_us = 300;
        cfg.record.trace = Some(path.clone());
        cfg.record.profile = Some(ProfileConfig {
            path: path.clone(),
            hz: 2000,
            clock,
            task_layout: None,
        });
    });
    assert_eq!(r.report.end, VmEnd::PowerOff, "console: {}", r.console);
    let w = r.words();
    assert_eq!(w.len(), 4, "guest did not report its function bounds");
    let t = Trace::read_file(&path).unwrap();
    assert!(t.has_exits() && t.has_samples());
    let (mut compute, mut io, mut other) = (0, 0, 0);
    for rec in &t.vcpus[0].records {
        if let Record::Sample { rip, cpl, .. } = *rec {
            assert_eq!(cpl, 0);
            if (w[0]..w[1]).contains(&rip) {
                compute += 1;
            } else if (w[2]..=w[3]).contains(&rip) {
                io += 1;
            } else {
                other += 1;
            }
        }
    }
    eprintln!("{clock:?}: compute {compute}, io_heavy {io}, elsewhere {other}");
    // The report's symbolizer agrees, given a System.map of the guest's two functions.
    // (io_heavy follows compute directly: compute_end == io_heavy.)
    assert_eq!(w[1], w[2]);
    let map = format!(
        "{:016x} T compute\n{:016x} T io_heavy\n{:016x} T after\n",
        w[0],
        w[2],
        w[3] + 1
    );
    let syms = SymbolTable::parse_system_map(&map, "tiny").unwrap();
    let rows = report::profile(&t, Some(&syms)).unwrap();
    let n = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .map_or(0, |r| r.samples)
    };
    assert_eq!((n("compute"), n("io_heavy")), (compute, io));
    eprintln!(
        "{}",
        report::render_profile(&t.header, &rows, Some(&syms), 5)
    );
    eprintln!(
        "{}",
        report::render_system_wide(&t, &report::system_wide(&t, Some(&syms)).unwrap(), 6)
    );
    (compute, io, other, t)
}

#[test]
fn host_profile_follows_the_accounting_mode() {
    if !common::kvm_available() {
        return;
    }
    let (c_cpu, io_cpu, _, t) = profile_run(ProfileClock::CpuSwitch);
    assert_eq!(
        t.header.sample_clock,
        analysis::trace::format::SampleClock::CpuSwitch
    );
    let (c_dom, io_dom, _, _) = profile_run(ProfileClock::DomainSwitch);
    assert!(c_cpu > 20 && c_dom > 20, "too few samples to judge");
    let share = |io: u64, c: u64| io as f64 / (io + c) as f64;
    // 480 port writes x 300 us of VMM work (~290 samples at 2000 Hz): domain-switch charges it
    // to io_heavy, cpu-switch does not. What cpu-switch does charge io_heavy is its own
    // emulated instructions and the part of each exit spent inside KVM_RUN (13-18 samples on a
    // quiet machine), which the host's load can inflate: one CI run here saw 59. So the bar
    // is on the VMM's work itself: cpu-switch must not give io_heavy half of what
    // domain-switch gives it (a gate that charged the VMM's work would give it as much).
    assert!(
        share(io_dom, c_dom) > 0.3,
        "domain-switch: io_heavy should get a large share ({io_dom} vs {c_dom})"
    );
    assert!(
        2 * io_cpu < io_dom,
        "io_heavy samples: domain-switch {io_dom} (compute {c_dom}) vs cpu-switch {io_cpu} (compute {c_cpu})"
    );
}

/// A guest that is not the kernel a task layout describes, or whose memory says nonsense, gets
/// task records that say why, and the run is not disturbed: here the layout's "banner" is
/// zeros that the tiny guest's zeroed memory does hold (so the reader goes on), and its
/// per-CPU offset array is zeros too, which leads outside the kernel half: every sample must
/// carry the reason `__per_cpu_offset[cpu] not a kernel pointer`.
#[test]
fn a_guest_that_is_no_linux_gets_samples_that_say_why() {
    if !common::kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.prof");
    let layout = dir.path().join("task-layout");
    std::fs::write(
        &layout,
        "banner \0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\n\
         symbol linux_banner 0x3000000\nsymbol __per_cpu_offset 0x3001000\n\
         symbol current_task 0x1ac00\nvalue nr_cpus 8\nvalue task_struct_pid 912\n\
         value task_struct_tgid 916\nvalue task_struct_comm 1400\nvalue task_struct_flags 44\n\
         value task_struct_size 6464\nvalue pf_kthread 2097152\nvalue task_struct_mm 768\n\
         value mm_struct_exe_file 840\nvalue mm_struct_start_code 240\n\
         value mm_struct_end_code 248\nvalue file_f_path 16\nvalue path_dentry 8\n\
         value dentry_d_name 32\nvalue qstr_name 8\n",
    )
    .unwrap();
    let r = common::run_tiny_with(&tiny_guests::PROFILE64, Duration::from_secs(120), |cfg| {
        cfg.io_delay_us = 300;
        cfg.record.profile = Some(ProfileConfig {
            path: path.clone(),
            hz: 1000,
            clock: ProfileClock::DomainSwitch,
            task_layout: Some(layout.clone()),
        });
    });
    assert_eq!(r.report.end, VmEnd::PowerOff, "console: {}", r.console);
    let t = Trace::read_file(&path).unwrap();
    let records = &t.vcpus[0].records;
    let samples = records
        .iter()
        .filter(|r| matches!(r, Record::Sample { .. }))
        .count();
    let reasons: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Task { task, .. } => Some(*task),
            _ => None,
        })
        .collect();
    eprintln!(
        "{samples} samples; first task record: {:?}",
        reasons.first()
    );
    assert!(samples > 20, "too few samples to judge: {samples}");
    assert_eq!(reasons.len(), samples, "one task record per sample");
    use runtime::profile::guest_task::{Step, Unresolved};
    assert!(
        reasons
            .iter()
            .all(|r| *r == Err(Unresolved::BadPointer(Step::PerCpuOffset))),
        "{:?}",
        &reasons[..reasons.len().min(5)]
    );
}

#[test]
fn wall_clock_profile_samples_at_about_the_requested_rate() {
    if !common::kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.prof");
    let r = common::run_tiny_with(&tiny_guests::PROFILE64, Duration::from_secs(120), |cfg| {
        cfg.io_delay_us = 300;
        cfg.record.profile = Some(ProfileConfig {
            path: path.clone(),
            // This host delivers interval-timer signals late and coalesced (measured with a
            // plain setitimer loop: 230/s asked 1000/s, 66/s asked 100/s); the sampler counts
            // every period that passed, so the rate still comes out right.
            hz: 100,
            clock: ProfileClock::Wall,
            task_layout: None,
        });
    });
    assert_eq!(r.report.end, VmEnd::PowerOff);
    let t = Trace::read_file(&path).unwrap();
    assert!(t.has_samples() && !t.has_exits());
    assert_eq!(
        t.header.sample_clock,
        analysis::trace::format::SampleClock::Wall
    );
    let n = t.vcpus[0]
        .records
        .iter()
        .filter(|r| matches!(r, Record::Sample { .. }))
        .count() as f64;
    let expected = r.report.run_time.as_secs_f64() * 100.0;
    eprintln!(
        "wall clock: {n} samples in {:?} (expected ~{expected:.0})",
        r.report.run_time
    );
    // Each period that passed is a sample, however the signals came; the last period of the
    // run may be cut short.
    assert!(
        n >= 0.8 * expected - 2.0 && n <= 1.1 * expected + 2.0,
        "{n} vs {expected}"
    );
}

/// The vPMU's guest counters and the host profiler share the kick signal: with both on, the
/// guest still gets exactly its PMIs (none lost, none invented) and the profile its samples.
/// On the soft backend, and on the hw source over the simulated host PMU (where each
/// sample's VMM work is left out of the guest's counters and their periods restart: the
/// guest's PMIs must still come).
#[test]
fn vpmu_overflows_and_profile_samples_share_the_signal() {
    if !common::kvm_available() {
        return;
    }
    for backend in [
        runtime::pmu::BackendChoice::Soft,
        runtime::pmu::BackendChoice::Sim,
    ] {
        overflows_and_samples_share_the_signal(backend);
    }
}

fn overflows_and_samples_share_the_signal(backend: runtime::pmu::BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("both.trace");
    let r = common::run_tiny_with(&tiny_guests::PMU_AMD64, Duration::from_secs(120), |cfg| {
        cfg.vpmu = runtime::vm::VpmuSetting::DomainSwitch;
        cfg.pmu_model = runtime::pmu::ModelChoice::Amd;
        cfg.pmu_backend = backend;
        cfg.pmi_limit = 500;
        cfg.io_delay_us = 300;
        cfg.record.trace = Some(path.clone());
        cfg.record.profile = Some(ProfileConfig {
            path: path.clone(),
            hz: 2000,
            clock: ProfileClock::Auto,
            task_layout: None,
        });
    });
    assert_eq!(r.report.end, VmEnd::PowerOff, "console: {}", r.console);
    let w = r.words();
    assert_eq!(w.len(), 12, "guest report incomplete");
    let (guest_samples, in_loop, storm_nmis, late_nmis) = (w[3], w[4], w[7], w[11]);
    let p = &r.report.pmu;
    assert!(guest_samples >= 20, "guest PMIs: {w:?}");
    assert!(in_loop * 10 >= guest_samples * 9, "{w:?}");
    // A PMI the rate limit held back may land after its phase ended: the guest counts it as
    // late (at most one for each of the two sampling phases that re-arm from the handler).
    assert!(late_nmis <= 2, "{w:?}");
    let seen = guest_samples + storm_nmis + late_nmis;
    assert_eq!(
        p.pmis_nmi, seen,
        "VMM delivered {} NMIs, guest saw {seen}: {w:?}",
        p.pmis_nmi
    );
    let t = Trace::read_file(&path).unwrap();
    assert_eq!(
        t.header.sample_clock,
        analysis::trace::format::SampleClock::DomainSwitch
    );
    let host_samples = t.vcpus[0]
        .records
        .iter()
        .filter(|r| matches!(r, Record::Sample { .. }))
        .count();
    eprintln!(
        "{backend:?}: guest PMIs {guest_samples} (+{storm_nmis} storm), host samples \
         {host_samples}, {} samples' work left out, {:?}",
        p.samples_left_out, r.report.run_time
    );
    assert!(host_samples >= 20, "host samples: {host_samples}");
}
