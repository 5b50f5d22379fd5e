//! PMI storm and soak on real /dev/kvm (`scripts/storm-soak.sh`; docs/vpmu.md, "Storm and soak").
//!
//! One run of the `storm_smp64` tiny guest on 2 vCPUs: each vCPU arms a period-1 counter with
//! LVTPC -> NMI and re-arms it from its NMI handler, so only the VMM's `--pmi-limit` holds the
//! PMIs back, while `--vpmu-schedule cpu-switch:1,domain-switch:1,repeat` switches the
//! accounting mode every second. This process is the VMM (it calls `runtime::vm::run` as
//! `vpmu-vmm run` does), so it measures itself while the storm runs:
//! - console: every PROBE seconds a byte goes in through the VMM's stdin thread and COM1; the
//!   guest echoes it; the time to its echo on the console output (a FIFO) is the round trip;
//! - control port 0x511: the guest keeps the most TSC cycles any of its `in 0x511` took and a
//!   histogram of them by power of two; the host run-queue wait of the VMM's threads
//!   (/proc/self/task/*/schedstat) says how much of a long one was this machine's scheduler;
//! - schedule: each switch's time against its due time (the schedule thread), and the TSC at
//!   which each vCPU's guest first read the new mode from 0x511 against the switch's TSC;
//! - file descriptors (/proc/self/fd) and VmRSS (/proc/self/status) every SAMPLE seconds;
//! - at the end: the VMM's PMI accounting (raised = delivered + merged + held) against the
//!   guest's own NMI and overflow counts, and signal / NMI rates per vCPU against the cap.
//!
//! `storm_soak [--secs N] [--sample S] [--probe P] [--pmi-limit L] [--label NAME]`
//! (cargo appends `--bench`, which is ignored). Prints a report; exits 1 if an invariant fails
//! (a probe over 100 ms, a PMI unaccounted for, a rate over the cap, fds/RSS growing).

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use runtime::end::VmEnd;
use runtime::pmu::{BackendChoice, ModelChoice};
use runtime::vm::{Boot, VmConfig, VpmuSetting};

/// Every "other thread" answer must come within this.
const ANSWER_LIMIT: Duration = Duration::from_millis(100);

struct Args {
    secs: f64,
    sample: f64,
    probe: f64,
    pmi_limit: u32,
    label: String,
}

fn parse_args() -> Args {
    let mut a = Args {
        secs: 60.0,
        sample: 5.0,
        probe: 0.25,
        pmi_limit: 2000,
        label: "storm".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--bench" => {}
            "--secs" => a.secs = val().parse().expect("--secs"),
            "--sample" => a.sample = val().parse().expect("--sample"),
            "--probe" => a.probe = val().parse().expect("--probe"),
            "--pmi-limit" => a.pmi_limit = val().parse().expect("--pmi-limit"),
            "--label" => a.label = val(),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// TSC ticks per second, against the monotonic clock over 200 ms.
fn tsc_hz() -> f64 {
    let (t0, c0) = (Instant::now(), runtime::tsc::now());
    std::thread::sleep(Duration::from_millis(200));
    let (t1, c1) = (Instant::now(), runtime::tsc::now());
    (c1 - c0) as f64 / (t1 - t0).as_secs_f64()
}

/// (open file descriptors, VmRSS in KiB) of this process.
fn fds_and_rss() -> (usize, u64) {
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0);
    (fds, rss)
}

/// The VMM threads whose host scheduling is reported.
const THREADS: [&str; 4] = ["vcpu0", "vcpu1", "stdin", "vpmu-schedule"];

/// (thread name, ns on a CPU, ns waiting on a run queue) of this process's VMM threads.
fn sched_stats() -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let name = comm.trim();
        if !THREADS.contains(&name) {
            continue;
        }
        let st = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        let f: Vec<u64> = st
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if f.len() >= 2 {
            out.push((name.to_string(), f[0], f[1]));
        }
    }
    out.sort();
    out
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * p).round() as usize]
}

struct Sample {
    at: f64,
    fds: usize,
    rss_kib: u64,
}

/// What the prober thread saw.
#[derive(Default)]
struct Probes {
    echo_ms: Vec<f64>,
    echo_lost: usize,
    samples: Vec<Sample>,
    /// From the guest's "ready" byte to the `q` that ends the storm.
    window: Duration,
    /// TSC when the `q` went out.
    end_tsc: u64,
    /// `sched_stats` at the first sample and just before the `q`.
    sched: [Vec<(String, u64, u64)>; 2],
}

/// One vCPU's figures from COM2.
struct GuestCpu {
    nmis: u64,
    overflows: u64,
    max_in_cycles: u64,
    records: u64,
    /// INs of 0x511 by duration: bucket i counts those of 2^i to 2^(i+1)-1 TSC cycles.
    hist: Vec<u64>,
    /// (TSC, mode code) at each change of the mode read from 0x511.
    changes: Vec<(u64, u64)>,
}

fn parse_guest(words: &[u64]) -> (u64, Vec<GuestCpu>) {
    let mut it = words.iter().copied();
    let ap_up = it.next().expect("COM2: no ap_up word");
    let mut cpus = Vec::new();
    for _ in 0..2 {
        let mut next = || it.next().expect("COM2 stream cut short");
        let (nmis, overflows, max_in_cycles, records) = (next(), next(), next(), next());
        let hist = (0..64).map(|_| next()).collect();
        let kept = records.min(8192);
        let changes = (0..kept).map(|_| (next(), next())).collect();
        cpus.push(GuestCpu {
            nmis,
            overflows,
            max_in_cycles,
            records,
            hist,
            changes,
        });
    }
    (ap_up, cpus)
}

fn mode_code(m: vpmu::AccountingMode) -> u64 {
    match m {
        vpmu::AccountingMode::CpuSwitch => 1,
        vpmu::AccountingMode::DomainSwitch => 2,
    }
}

fn main() {
    let args = parse_args();
    let mut failed: Vec<String> = Vec::new();
    let hz = tsc_hz();
    let dir = tempfile::tempdir().unwrap();
    let console = dir.path().join("console.fifo");
    let serial2 = dir.path().join("serial2");
    let c = std::ffi::CString::new(console.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    // The VMM's stdin thread reads fd 0: make it a pipe this process writes to.
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: fds[0] is the read end just created; fd 0 is replaced by a copy of it.
    assert_eq!(unsafe { libc::dup2(fds[0], 0) }, 0, "dup2");
    // SAFETY: both descriptors were just created by pipe(2) and are owned by nothing else.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(rd);
    let mut stdin_w = std::fs::File::from(wr);

    // Console bytes with their arrival times. Started before vm::run (whose seccomp scope
    // confines the threads it starts): these threads are the measurement, not the VMM.
    let (tx, rx) = mpsc::channel::<(u8, Instant)>();
    let fifo = console.clone();
    std::thread::spawn(move || {
        let mut f = std::fs::File::open(fifo).expect("console fifo");
        let mut buf = [0u8; 256];
        while let Ok(n) = f.read(&mut buf) {
            if n == 0 {
                break;
            }
            let now = Instant::now();
            for &b in &buf[..n] {
                if tx.send((b, now)).is_err() {
                    return;
                }
            }
        }
    });
    let (secs, sample_every, probe_every) = (args.secs, args.sample, args.probe);
    let prober = std::thread::spawn(move || {
        let mut p = Probes::default();
        // The guest says 'R' once its storm is armed (boot: emulated real mode, a few seconds).
        loop {
            match rx.recv_timeout(Duration::from_secs(120)) {
                Ok((b'R', _)) => break,
                Ok(_) => continue,
                Err(_) => return p,
            }
        }
        let start = Instant::now();
        let mut next_sample = 0.0;
        while start.elapsed().as_secs_f64() < secs {
            let now = start.elapsed().as_secs_f64();
            if now >= next_sample {
                if p.samples.is_empty() {
                    p.sched[0] = sched_stats();
                }
                let (fds, rss_kib) = fds_and_rss();
                p.samples.push(Sample {
                    at: now,
                    fds,
                    rss_kib,
                });
                next_sample += sample_every;
            }
            let t0 = Instant::now();
            stdin_w.write_all(b"p").expect("stdin pipe");
            let mut got = false;
            while let Ok((b, at)) = rx.recv_timeout(Duration::from_secs(5)) {
                if b == b'p' {
                    p.echo_ms.push((at - t0).as_secs_f64() * 1e3);
                    got = true;
                    break;
                }
            }
            if !got {
                p.echo_lost += 1;
            }
            std::thread::sleep(Duration::from_secs_f64(probe_every).saturating_sub(t0.elapsed()));
        }
        let (fds, rss_kib) = fds_and_rss();
        p.samples.push(Sample {
            at: start.elapsed().as_secs_f64(),
            fds,
            rss_kib,
        });
        p.window = start.elapsed();
        p.sched[1] = sched_stats();
        p.end_tsc = runtime::tsc::now();
        stdin_w.write_all(b"q").expect("stdin pipe");
        p
    });

    let cfg = VmConfig {
        memory_mib: 64,
        vcpus: 2,
        vpmu: VpmuSetting::CpuSwitch,
        pmu_model: ModelChoice::Amd,
        pmu_backend: BackendChoice::Soft,
        pmi_limit: args.pmi_limit,
        vpmu_schedule: Some(
            "cpu-switch:1,domain-switch:1,repeat"
                .parse()
                .expect("schedule"),
        ),
        serial2: Some(serial2.clone()),
        console_out: Some(console.clone()),
        console_in: true,
        timeout: Some(Duration::from_secs_f64(args.secs + 180.0)),
        ..VmConfig::new(Boot::tiny(&tiny_guests::STORM_SMP64))
    };
    let r = vpmu_benches::run_vm(&cfg);
    let p = prober.join().expect("prober");
    if r.end != VmEnd::PowerOff {
        vmm::report::print(&r);
        panic!("storm guest did not power off: {:?}", r.end);
    }
    let words: Vec<u64> = std::fs::read(&serial2)
        .unwrap()
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let (ap_up, cpus) = parse_guest(&words);
    let w = p.window.as_secs_f64();
    let st = &r.pmu;

    println!(
        "== {}: 2 vCPUs, period-1 counters, --pmi-limit {}, modes switching every 1 s; {:.0} s of storm ({:.1} s run) ==",
        args.label,
        args.pmi_limit,
        w,
        r.run_time.as_secs_f64()
    );
    if ap_up == 0 {
        failed.push("the second vCPU never came up".into());
    }
    // Rates against the cap.
    let cap = f64::from(args.pmi_limit);
    let per_cpu_nmi: Vec<f64> = cpus.iter().map(|c| c.nmis as f64 / w).collect();
    println!(
        "rates per vCPU: guest NMIs {:.0}/s and {:.0}/s (cap {cap:.0}); VMM: NMIs injected {:.0}/s, signals on vCPU threads {:.0}/s (averaged over the {:.1} s run)",
        per_cpu_nmi[0],
        per_cpu_nmi[1],
        st.pmis_nmi as f64 / 2.0 / r.run_time.as_secs_f64(),
        st.signals as f64 / 2.0 / r.run_time.as_secs_f64(),
        r.run_time.as_secs_f64()
    );
    for (i, n) in per_cpu_nmi.iter().enumerate() {
        // The limiter's burst (cap/10) may come on top of cap * window.
        if *n > cap * 1.05 + cap / 10.0 / w {
            failed.push(format!("vCPU {i}: {n:.0} NMIs/s over the cap {cap}"));
        }
        if *n < cap * 0.5 {
            failed.push(format!(
                "vCPU {i}: {n:.0} NMIs/s, not storming at the cap {cap}"
            ));
        }
    }
    // Accounting.
    let delivered = st.pmis_nmi + st.pmis_vector;
    let accounted = delivered + st.pmis_masked + st.pmis_merged + st.pmis_held_at_end;
    println!(
        "VMM: {} PMIs raised = {} delivered + {} dropped (masked) + {} merged into held-back ones + {} held at the end ({} unaccounted); {} held back by the limit",
        st.pmis_raised,
        delivered,
        st.pmis_masked,
        st.pmis_merged,
        st.pmis_held_at_end,
        st.pmis_raised as i64 - accounted as i64,
        st.pmis_throttled
    );
    if st.pmis_raised != accounted {
        failed.push(format!(
            "{} PMIs raised but {accounted} accounted for",
            st.pmis_raised
        ));
    }
    let guest_nmis: u64 = cpus.iter().map(|c| c.nmis).sum();
    let guest_ovf: u64 = cpus.iter().map(|c| c.overflows).sum();
    println!(
        "guest: {} NMIs handled ({} + {}), {} with counter 0's overflow bit set; VMM injected {} NMIs ({} not seen by the guest)",
        guest_nmis,
        cpus[0].nmis,
        cpus[1].nmis,
        guest_ovf,
        st.pmis_nmi,
        st.pmis_nmi as i64 - guest_nmis as i64
    );
    // KVM keeps one NMI pending per vCPU: one injected just as the guest stopped may never
    // run, so allow one per vCPU; any more would be lost PMIs.
    if guest_nmis > st.pmis_nmi || st.pmis_nmi - guest_nmis > 2 {
        failed.push(format!(
            "guest handled {guest_nmis} NMIs, VMM injected {}",
            st.pmis_nmi
        ));
    }
    if guest_ovf != guest_nmis {
        failed.push(format!(
            "{} NMIs without counter 0's overflow bit",
            guest_nmis - guest_ovf
        ));
    }
    // Console echo.
    println!(
        "console echo (stdin thread -> COM1 -> guest -> console): {} probes, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {} unanswered after 5 s",
        p.echo_ms.len(),
        pct(&p.echo_ms, 0.5),
        pct(&p.echo_ms, 0.99),
        pct(&p.echo_ms, 1.0),
        p.echo_lost
    );
    if p.echo_ms.is_empty() || p.echo_lost > 0 || pct(&p.echo_ms, 1.0) > 100.0 {
        failed.push("console echo over 100 ms or lost".into());
    }
    // Control port: the histogram's tail, and reads that may have taken over 100 ms.
    let limit_cycles = ANSWER_LIMIT.as_secs_f64() * hz;
    for (i, c) in cpus.iter().enumerate() {
        let total: u64 = c.hist.iter().sum();
        let ms = |b: usize| (1u64 << b) as f64 / hz * 1e3;
        // A bucket holds 2^b .. 2^(b+1)-1 cycles: count it as over the limit if any part is.
        let over: u64 = (0..64)
            .filter(|&b| (1u128 << (b + 1)) as f64 > limit_cycles)
            .map(|b| c.hist[b])
            .sum();
        let at = |q: f64| {
            let want = (total as f64 * q).ceil() as u64;
            let mut seen = 0;
            (0..64)
                .find(|&b| {
                    seen += c.hist[b];
                    seen >= want
                })
                .map_or(f64::NAN, |b| ms(b + 1))
        };
        let tail: Vec<String> = (0..64)
            .filter(|&b| c.hist[b] > 0 && ms(b) >= 1.0)
            .map(|b| format!("{:.0}-{:.0} ms: {}", ms(b), ms(b + 1), c.hist[b]))
            .collect();
        println!(
            "control port 0x511, vCPU {i}: {total} INs, p50 < {:.3} ms, p99 < {:.3} ms, p99.99 < {:.2} ms, max {:.2} ms; over 1 ms: [{}]; possibly over 100 ms: {over} (an NMI or a host preemption inside the IN counts too)",
            at(0.5),
            at(0.99),
            at(0.9999),
            c.max_in_cycles as f64 / hz * 1e3,
            tail.join(", ")
        );
        // A vCPU thread waiting on this shared machine's run queue can hold one IN up past
        // 100 ms; the VMM must answer all but a trace of them in time.
        if total == 0 || over as f64 > total as f64 * 1e-5 {
            failed.push(format!(
                "vCPU {i}: {over} of {total} 0x511 reads possibly over 100 ms"
            ));
        }
    }
    // How much the host's scheduler held the VMM's threads back over the storm.
    let waits: Vec<String> = p.sched[1]
        .iter()
        .map(|(name, run, wait)| {
            let (run0, wait0) = p.sched[0]
                .iter()
                .find(|t| &t.0 == name)
                .map_or((0, 0), |t| (t.1, t.2));
            format!(
                "{name} ran {:.1} s, waited {:.1} s",
                (run - run0) as f64 / 1e9,
                (wait - wait0) as f64 / 1e9
            )
        })
        .collect();
    println!(
        "host scheduling over the {w:.0} s (schedstat): {}",
        waits.join("; ")
    );
    // Schedule: due time -> switch (schedule thread) -> guest sees the mode (each vCPU).
    let h = &r.mode_history;
    let mut late_ms = Vec::new();
    let mut seen_ms: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut unseen = [0usize; 2];
    for (i, s) in h.iter().enumerate().skip(1) {
        late_ms.push((s.at.as_secs_f64() - i as f64) * 1e3);
        // The mode is published before the switch's TSC is taken, so a guest may read it a
        // little before `s.tsc`: look from the previous switch on (and count that as 0 ms).
        let prev_tsc = h[i - 1].tsc;
        let next_tsc = h.get(i + 1).map_or(u64::MAX, |n| n.tsc);
        for (c, cpu) in cpus.iter().enumerate() {
            // Only switches while this vCPU's guest was polling 0x511 (after its first read,
            // 100 ms before the end at least).
            let first = cpu.changes.first().map_or(u64::MAX, |f| f.0);
            if s.tsc <= first || s.tsc + (hz * 0.1) as u64 >= p.end_tsc {
                continue;
            }
            match cpu
                .changes
                .iter()
                .find(|(t, m)| *t > prev_tsc && *t < next_tsc && *m == mode_code(s.mode))
            {
                Some((t, _)) => seen_ms[c].push(t.saturating_sub(s.tsc) as f64 / hz * 1e3),
                None => unseen[c] += 1,
            }
        }
    }
    println!(
        "schedule: {} switches; set after its due time: p50 {:.2} ms, max {:.2} ms; guest read the new mode from 0x511 after the switch: vCPU 0 p50 {:.2} ms max {:.2} ms, vCPU 1 p50 {:.2} ms max {:.2} ms; switches a vCPU never saw: {} / {}",
        h.len() - 1,
        pct(&late_ms, 0.5),
        pct(&late_ms, 1.0),
        pct(&seen_ms[0], 0.5),
        pct(&seen_ms[0], 1.0),
        pct(&seen_ms[1], 0.5),
        pct(&seen_ms[1], 1.0),
        unseen[0],
        unseen[1]
    );
    let worst_seen = pct(&seen_ms[0], 1.0).max(pct(&seen_ms[1], 1.0));
    if h.len() < 3 || pct(&late_ms, 1.0) > 100.0 || worst_seen.is_nan() || worst_seen > 100.0 {
        failed.push("a schedule step took over 100 ms to reach a vCPU".into());
    }
    if unseen.iter().any(|u| *u > 0) || cpus.iter().any(|c| c.records > 8192) {
        failed.push(format!("switches unseen by the guest: {unseen:?}"));
    }
    // Resources.
    let series =
        |f: &dyn Fn(&Sample) -> String| p.samples.iter().map(f).collect::<Vec<_>>().join(" ");
    println!(
        "fds   (t s:count): {}",
        series(&|s| format!("{:.0}:{}", s.at, s.fds))
    );
    println!(
        "VmRSS (t s:KiB):   {}",
        series(&|s| format!("{:.0}:{}", s.at, s.rss_kib))
    );
    if let (Some(a), Some(b)) = (p.samples.get(1).or(p.samples.first()), p.samples.last()) {
        // From the second sample on (the first may precede lazily made per-thread state).
        if b.fds > a.fds {
            failed.push(format!("fds grew from {} to {}", a.fds, b.fds));
        }
        if b.rss_kib > a.rss_kib + 1024 {
            failed.push(format!("RSS grew from {} to {} KiB", a.rss_kib, b.rss_kib));
        }
    }
    vmm::report::print(&r);
    if failed.is_empty() {
        println!("{}: all invariants hold", args.label);
    } else {
        for f in &failed {
            println!("{}: FAILED: {f}", args.label);
        }
        std::process::exit(1);
    }
}
