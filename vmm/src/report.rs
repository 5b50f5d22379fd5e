//! What `vpmu-vmm run` prints (to stderr) when the VM ends.

use crate::exit::ExitCounts;
use crate::vm::RunReport;

pub fn print(r: &RunReport) {
    for l in lines(r) {
        eprintln!("{l}");
    }
}

/// The lines [`print`] prints (the first one empty).
pub fn lines(r: &RunReport) -> Vec<String> {
    let mut out = Vec::new();
    let mut total = ExitCounts::default();
    for c in &r.exits {
        total.add(c);
    }
    out.push(String::new());
    out.push(format!(
        "[vpmu-vmm] {} after {:.2} s (exit code {})",
        r.end,
        r.run_time.as_secs_f64(),
        r.end.exit_code()
    ));
    out.push(host_line(&r.host));
    out.push(format!(
        "[vpmu-vmm] exits: {} total: {} port in, {} port out ({} unclaimed), {} mmio ({} unclaimed), {} msr, {} interrupted, {} emulation failures",
        total.total(),
        total.io_in,
        total.io_out,
        total.unclaimed_io,
        total.mmio,
        total.unclaimed_mmio,
        total.msr,
        total.interrupted,
        total.internal_error
    ));
    if r.vpmu != crate::vm::VpmuSetting::Off {
        print_vpmu(&mut out, r);
    }
    if let Some(n) = &r.net {
        print_net(&mut out, n);
    }
    for (i, d) in r.disks.iter().enumerate() {
        out.push(disk_line(i, d));
    }
    if !r.fixups.is_empty() {
        let list: Vec<String> = r.fixups.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        out.push(format!(
            "[vpmu-vmm] host-quirk fix-ups: {}",
            list.join(", ")
        ));
    }
    if let Some((n, us)) = r.syscall_relay {
        out.push(format!(
            "[vpmu-vmm] syscall relay: {n} guest system calls completed by the VMM, {us:.1} us each in the VMM (exit to registers written{})",
            if total.sync_regs { ", through kvm_run: KVM applies them in the next KVM_RUN" } else { "" }
        ));
        out.push(format!(
            "[vpmu-vmm] vCPU state ioctls on exits: {} (registers {})",
            total.access_ioctls,
            if total.sync_regs {
                "through kvm_run, KVM_CAP_SYNC_REGS"
            } else {
                "through ioctls"
            }
        ));
    }
    if let Some(line) = guest_log_line(&r.guest_log) {
        out.push(line);
    }
    out.extend(diagnostic(r));
    out.extend(r.hints.iter().map(|h| format!("[vpmu-vmm] hint: {h}")));
    if r.end.needs_diagnostic() && !r.console_tail.is_empty() {
        out.push("[vpmu-vmm] last guest console lines:".to_string());
        for l in &r.console_tail {
            out.push(format!("  | {l}"));
        }
    }
    out
}

/// The vPMU's lines: MSR and RDPMC service, PMIs, the rate limit, modes, the host profile's
/// share, the trap, the event filter and what the backend could not count.
fn print_vpmu(out: &mut Vec<String>, r: &RunReport) {
    let p = &r.pmu;
    out.push(format!(
        "[vpmu-vmm] vPMU ({:?}): {} MSR reads, {} writes, {} RDPMC served, {} #GP; PMIs: {} NMI, {} vector, {} dropped (LVTPC masked), {} held back by the rate limit",
        r.vpmu, p.msr_reads, p.msr_writes, p.rdpmc_reads, p.gp_faults, p.pmis_nmi, p.pmis_vector, p.pmis_masked, p.pmis_throttled
    ));
    if p.pmis_throttled > 0 || p.pmis_merged > 0 {
        out.push(format!(
            "[vpmu-vmm] vPMU rate limit: {} PMIs raised = {} delivered + {} dropped (masked) + {} merged into held-back ones + {} held at the end; {} signals on the vCPU threads",
            p.pmis_raised,
            p.pmis_nmi + p.pmis_vector,
            p.pmis_masked,
            p.pmis_merged,
            p.pmis_held_at_end,
            p.signals
        ));
    }
    print_modes(out, r);
    if p.sampler_ns_forgotten + p.sampler_work_ns_left_out > 0 {
        out.push(format!(
            "[vpmu-vmm] host profile: its samples cost the guest's counters {:.3} ms of host time \
             (interruptions {:.3} ms, the VMM's sample work {:.3} ms), taken back from them",
            (p.sampler_ns_forgotten + p.sampler_work_ns_left_out) as f64 / 1e6,
            p.sampler_ns_forgotten as f64 / 1e6,
            p.sampler_work_ns_left_out as f64 / 1e6
        ));
    }
    if p.rdpmc_fixed > 0 {
        out.push(format!(
            "[vpmu-vmm]   {} of the RDPMCs read a fixed counter",
            p.rdpmc_fixed
        ));
    }
    if p.rdpmc_trapped + p.gp_delivered > 0 {
        out.push(format!(
            "[vpmu-vmm] RDPMC trap: {} RDPMCs served through the guest's #GP handler; {} #GPs \
             passed to the guest ({} of them RDPMCs that fault as on hardware)",
            p.rdpmc_trapped, p.gp_delivered, p.rdpmc_gp
        ));
    }
    if let Some(f) = &r.pmu_event_filter {
        let per: Vec<String> = p
            .filter_blocked_by_vcpu
            .iter()
            .enumerate()
            .map(|(i, n)| format!("vCPU {i}: {n}"))
            .collect();
        out.push(format!(
            "[vpmu-vmm] vPMU event filter {f}: {} counter programmings refused ({})",
            p.filter_blocked,
            per.join(", ")
        ));
    }
    if !p.uncounted.is_empty() {
        let list = uncounted_names(&p.uncounted);
        out.push(format!(
            "[vpmu-vmm] WARNING: the guest programmed events the vPMU's backend cannot count; their \
             counters stayed still (a guest profiler shows 0 for them, docs/vpmu.md \
             \"What the soft backend cannot do\"): {}",
            list.join(", ")
        ));
    }
    if p.rdpmc_genuine_msr > 0 {
        out.push(format!(
            "[vpmu-vmm] {} RDMSRs of RDPMC index numbers from unpatched code were left to KVM",
            p.rdpmc_genuine_msr
        ));
    }
}

/// The accounting modes of the run: its switches, and what each mode saw.
fn print_modes(out: &mut Vec<String>, r: &RunReport) {
    let p = &r.pmu;
    if r.mode_history.len() > 1 {
        let step = |s: &crate::pmu::mode::Switch| {
            format!(
                "{} at {:.1} s ({})",
                s.mode.name(),
                s.at.as_secs_f64(),
                s.by
            )
        };
        let h = &r.mode_history;
        // A repeating schedule switches hundreds of times: show the ends of the list.
        let steps: Vec<String> = if h.len() <= 8 {
            h.iter().map(step).collect()
        } else {
            let mut v: Vec<String> = h[..3].iter().map(step).collect();
            v.push(format!("... {} switches ...", h.len() - 6));
            v.extend(h[h.len() - 3..].iter().map(step));
            v
        };
        out.push(format!(
            "[vpmu-vmm] accounting modes: {}",
            steps.join(" -> ")
        ));
    }
    let time = crate::pmu::mode::time_in_modes(&r.mode_history, r.run_time);
    for (i, m) in vpmu::AccountingMode::ALL.into_iter().enumerate() {
        let c = p.by_mode[i];
        if c.pmis + c.rdpmc_reads > 0 || (r.mode_history.len() > 1 && !time[i].is_zero()) {
            out.push(format!(
                "[vpmu-vmm]   in {} ({:.1} s): {} PMIs delivered, {} RDPMC served",
                m.name(),
                time[i].as_secs_f64(),
                c.pmis,
                c.rdpmc_reads
            ));
        }
    }
}

/// Guest-triggered warnings that were only counted (none: no line).
fn guest_log_line(totals: &[vpmu::guest_log::GuestLogTotal]) -> Option<String> {
    let flooded: Vec<String> = totals
        .iter()
        .filter(|t| t.suppressed > 0)
        .map(|t| format!("{} {} ({} not logged)", t.kind, t.seen, t.suppressed))
        .collect();
    (!flooded.is_empty()).then(|| {
        format!(
            "[vpmu-vmm] guest-triggered warnings, first {} of each kind logged: {}",
            vpmu::guest_log::LOGGED_PER_KIND,
            flooded.join(", ")
        )
    })
}

/// One line per `--disk`: requests by type, bytes, errors.
fn disk_line(i: usize, d: &crate::vm::DiskReport) -> String {
    let c = &d.counts;
    format!(
        "[vpmu-vmm] virtio-blk vd{} ({}{}): status {:#x}; requests: {} read, {} write, {} flush, {} get-id, {} discard, {} write-zeroes, {} other; {} bytes read, {} written; {} I/O errors, {} unsupported, {} without a status byte, {} bad register accesses{}; {} interrupts, {} notifies ({} of no queue)",
        (b'a' + i as u8) as char,
        d.path.display(),
        if d.readonly { ", read-only" } else { "" },
        d.status,
        c.reads, c.writes, c.flushes, c.get_ids, c.discards, c.write_zeroes, c.other,
        c.bytes_read, c.bytes_written,
        c.io_errors, c.unsupported, c.no_status, d.bad_accesses,
        d.fault.as_ref().map(|f| format!("; queue fault: {f}")).unwrap_or_default(),
        d.interrupts, c.notifies, c.bad_notifies,
    )
}

fn disk_json(d: &crate::vm::DiskReport) -> serde_json::Value {
    let c = &d.counts;
    serde_json::json!({
        "path": d.path.display().to_string(),
        "readonly": d.readonly,
        "sectors": d.sectors,
        "status": d.status,
        "interrupts": d.interrupts,
        "notifies": c.notifies,
        "bad_accesses": d.bad_accesses,
        "requests": {
            "read": c.reads,
            "write": c.writes,
            "flush": c.flushes,
            "get_id": c.get_ids,
            "discard": c.discards,
            "write_zeroes": c.write_zeroes,
            "other": c.other,
        },
        "bytes_read": c.bytes_read,
        "bytes_written": c.bytes_written,
        "errors": {
            "io_error": c.io_errors,
            "unsupported": c.unsupported,
            "no_status": c.no_status,
            "bad_notify": c.bad_notifies,
        },
        "queue_fault": d.fault,
    })
}

fn print_net(out: &mut Vec<String>, n: &crate::devices::virtio::net::NetReport) {
    let c = &n.card;
    out.push(format!(
        "[vpmu-vmm] virtio-net: status {:#x}, {} frames to the guest, {} from it, {} dropped (no receive buffer), {} queue errors, {} bad register accesses; {} interrupts, {} rx / {} tx notifies",
        n.status, c.rx_frames, c.tx_frames, c.rx_dropped, c.queue_errors, n.bad_accesses, n.interrupts, c.rx_notifies, c.tx_notifies
    ));
    let Some(p) = &n.pinger else { return };
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    out.push(format!(
        "[vpmu-vmm] net pinger: {} echo requests pushed, {} replies ok, {} bad; {} not sent (no receive buffer), {} skipped (late), {} held (paused or gate closed); {} ARP answered, {} other frames{}{}",
        p.requests_pushed,
        p.replies_ok,
        p.replies_bad,
        p.requests_no_buffer,
        p.requests_skipped_late,
        p.requests_held,
        p.arp_answered,
        p.other_frames,
        p.rtt_mean()
            .map(|m| format!("; RTT mean {:.1} ms, max {:.1} ms", ms(m), ms(p.rtt_max)))
            .unwrap_or_default(),
        match (p.first_reply_after, p.last_reply_after) {
            (Some(f), Some(l)) => format!(
                "; replies from {:.1} s to {:.1} s after the driver came up",
                f.as_secs_f64(),
                l.as_secs_f64()
            ),
            _ => String::new(),
        },
    ));
    if let Some(loss) = p.loss_after_first_reply() {
        out.push(format!(
            "[vpmu-vmm] net pinger: after the first reply {} requests pushed, {} answered, {} still in flight, loss {:.1}%",
            p.pushed_after_first_reply,
            p.replies_after_first_reply,
            p.unanswered_after_first_reply,
            loss * 100.0
        ));
    }
    if let Some(why) = &p.first_bad {
        out.push(format!("[vpmu-vmm] net pinger: first bad frame: {why}"));
    }
}

/// On any end but a clean one: one line per vCPU with its RIP and its last exits
/// (`[vpmu-vmm] vCPU 0 at RIP 0x100034 (CPL 0), ended the run, 12 exits, last: ...`).
pub fn diagnostic(r: &RunReport) -> Vec<String> {
    if !r.end.needs_diagnostic() {
        return Vec::new();
    }
    r.vcpu_states
        .iter()
        .map(|s| format!("[vpmu-vmm] {}", s.line()))
        .collect()
}

/// The `schema` field of [`to_json`]'s document: bumped when a stable field changes meaning or
/// goes away (fields may be added within a version).
pub const RUN_SCHEMA: &str = "vpmu-run/1";

/// The end's kind, one word per [`crate::end::VmEnd`] variant (stable in `vpmu-run/1`).
pub fn end_kind(end: &crate::end::VmEnd) -> &'static str {
    use crate::end::VmEnd;
    match end {
        VmEnd::PowerOff => "power-off",
        VmEnd::Reboot => "reboot",
        VmEnd::GuestPanic(_) => "guest-panic",
        VmEnd::TripleFault => "triple-fault",
        VmEnd::KvmFailure(_) => "kvm-failure",
        VmEnd::EmulationFailure(_) => "emulation-failure",
        VmEnd::Timeout(_) => "timeout",
        VmEnd::Stopped(_) => "stopped",
        VmEnd::VmmPanic(_) => "vmm-bug",
        VmEnd::Signal(_) => "signal",
        VmEnd::UnexpectedHlt => "unexpected-hlt",
        VmEnd::DebugExit(_) => "debug-exit",
    }
}

/// The events the backend could not count, as the text report and the JSON both name them.
fn uncounted_names<U: std::fmt::Display, A: std::fmt::Debug>(
    uncounted: &[(U, Option<A>)],
) -> Vec<String> {
    uncounted
        .iter()
        .map(|(u, a)| match a {
            Some(a) => format!("{u} ({a:?})"),
            None => u.to_string(),
        })
        .collect()
}

/// An `exits` object of the JSON report: the counts as `ExitCounts` derives them, and their sum.
#[derive(serde::Serialize)]
struct ExitsJson<'a> {
    total: u64,
    #[serde(flatten)]
    counts: &'a ExitCounts,
}

fn exits_json(c: &ExitCounts) -> serde_json::Value {
    serde_json::to_value(ExitsJson {
        total: c.total(),
        counts: c,
    })
    .expect("plain numbers")
}

/// The end-of-run report as one JSON document (`vpmu-run/1`; docs/tracing.md, "The end-of-run
/// report as JSON"): what [`print`] prints, as numbers, and the diagnostic lines.
/// The report's line for the host kind: which KVM, whether its quirks were on, the backend.
fn host_line(h: &crate::vm::HostReport) -> String {
    let kind = if h.quirks {
        "guest kernel code emulated, host quirks on"
    } else {
        "VT-x/SVM, host quirks off"
    };
    let mut line = format!("[vpmu-vmm] host: {} ({kind})", h.kvm);
    if let Some(b) = h.backend {
        line.push_str(&format!("; vPMU backend {}", backend_name(b)));
        if h.exit_cost_ns > 0 {
            line.push_str(&format!(
                ", cpu-switch leaves {:.1} us of KVM's exit path out of each KVM_RUN",
                h.exit_cost_ns as f64 / 1000.0
            ));
        }
        if h.notify_cost_ns > 0 {
            line.push_str(&format!(
                "; a notification costs {:.1} us, so soft counters notify no sooner than every {:.0} us",
                h.notify_cost_ns as f64 / 1000.0,
                crate::pmu::backend::min_soft_period_ns(h.notify_cost_ns) as f64 / 1000.0
            ));
        }
        if h.kvm_answers_rdpmc == Some(true) {
            line.push_str("; KVM answers guest RDPMC itself (not trappable)");
        }
    }
    line
}

/// A backend as `--vpmu-backend` spells it.
fn backend_name(b: crate::pmu::BackendChoice) -> String {
    clap::ValueEnum::to_possible_value(&b)
        .map(|v| v.get_name().to_string())
        .unwrap_or_else(|| format!("{b:?}").to_lowercase())
}

pub fn to_json(r: &RunReport) -> serde_json::Value {
    use serde_json::json;
    let mut total = ExitCounts::default();
    for c in &r.exits {
        total.add(c);
    }
    let p = &r.pmu;
    let time = crate::pmu::mode::time_in_modes(&r.mode_history, r.run_time);
    let vpmu = if r.vpmu == crate::vm::VpmuSetting::Off {
        serde_json::Value::Null
    } else {
        let by_mode: Vec<serde_json::Value> = vpmu::AccountingMode::ALL
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                json!({
                    "mode": m.name(),
                    "secs": time[i].as_secs_f64(),
                    "pmis_delivered": p.by_mode[i].pmis,
                    "rdpmc_served": p.by_mode[i].rdpmc_reads,
                })
            })
            .collect();
        let switches: Vec<serde_json::Value> = r
            .mode_history
            .iter()
            .map(|s| {
                json!({
                    "mode": s.mode.name(),
                    "at_secs": s.at.as_secs_f64(),
                    "by": s.by,
                })
            })
            .collect();
        let uncounted = uncounted_names(&p.uncounted);
        json!({
            // As --vpmu spells it: the mode the run started in.
            "setting": clap::ValueEnum::to_possible_value(&r.vpmu)
                .map(|v| v.get_name().to_string()),
            "msr_reads": p.msr_reads,
            "msr_writes": p.msr_writes,
            "gp_faults": p.gp_faults,
            "rdpmc_served": p.rdpmc_reads,
            "rdpmc_fixed": p.rdpmc_fixed,
            "rdpmc_left_to_kvm": p.rdpmc_genuine_msr,
            "rdpmc_trap": {
                "served": p.rdpmc_trapped,
                "gp_delivered": p.gp_delivered,
                "rdpmc_gp": p.rdpmc_gp,
            },
            "pmis": {
                "raised": p.pmis_raised,
                "delivered": p.pmis_nmi + p.pmis_vector,
                "nmi": p.pmis_nmi,
                "vector": p.pmis_vector,
                "dropped_masked": p.pmis_masked,
                "throttled": p.pmis_throttled,
                "merged": p.pmis_merged,
                "held_at_end": p.pmis_held_at_end,
            },
            "signals": p.signals,
            "sampler_ns_forgotten": p.sampler_ns_forgotten,
            "samples_left_out": p.samples_left_out,
            "sampler_work_ns_left_out": p.sampler_work_ns_left_out,
            "by_mode": by_mode,
            "mode_switches": switches,
            "event_filter": r.pmu_event_filter.as_ref().map(|f| json!({
                "spec": f.to_string(),
                "refused": p.filter_blocked,
                "refused_by_vcpu": p.filter_blocked_by_vcpu,
            })),
            "uncounted_events": uncounted,
        })
    };
    let net = r.net.as_ref().map(|n| {
        let c = &n.card;
        json!({
            "status": n.status,
            "interrupts": n.interrupts,
            "bad_accesses": n.bad_accesses,
            "rx_frames": c.rx_frames,
            "tx_frames": c.tx_frames,
            "rx_dropped": c.rx_dropped,
            "queue_errors": c.queue_errors,
            "rx_notifies": c.rx_notifies,
            "tx_notifies": c.tx_notifies,
            "pinger": n.pinger.as_ref().map(|p| json!({
                "requests_pushed": p.requests_pushed,
                "replies_ok": p.replies_ok,
                "replies_bad": p.replies_bad,
                "requests_no_buffer": p.requests_no_buffer,
                "requests_skipped_late": p.requests_skipped_late,
                "requests_held": p.requests_held,
                "arp_answered": p.arp_answered,
                "other_frames": p.other_frames,
            })),
        })
    });
    let fixups: serde_json::Map<String, serde_json::Value> = r
        .fixups
        .iter()
        .map(|(k, n)| (k.to_string(), json!(n)))
        .collect();
    json!({
        "schema": RUN_SCHEMA,
        "end": {
            "kind": end_kind(&r.end),
            "text": r.end.to_string(),
            "exit_code": r.end.exit_code(),
            "clean": r.end.is_clean(),
            "debug_exit": match r.end {
                crate::end::VmEnd::DebugExit(v) => json!({
                    "value": v,
                    "qemu_status": crate::end::qemu_status(v),
                }),
                _ => serde_json::Value::Null,
            },
        },
        "host": {
            "kvm": r.host.kvm,
            "quirks": r.host.quirks,
            "kind": if r.host.quirks { "emulated-kernel" } else { "vt-x/svm" },
            "vpmu_backend": r.host.backend.map(backend_name),
            "cpu_switch_exit_cost_ns": r.host.exit_cost_ns,
            "kvm_answers_rdpmc": r.host.kvm_answers_rdpmc,
            "notify_cost_ns": r.host.notify_cost_ns,
            "min_soft_period_ns": crate::pmu::backend::min_soft_period_ns(r.host.notify_cost_ns),
        },
        "setup_secs": r.setup_time.as_secs_f64(),
        "run_secs": r.run_time.as_secs_f64(),
        "exits": exits_json(&total),
        "exits_by_vcpu": r.exits.iter().map(exits_json).collect::<Vec<_>>(),
        "vpmu": vpmu,
        "net": net,
        "disks": r.disks.iter().map(disk_json).collect::<Vec<_>>(),
        "host_quirk_fixups": fixups,
        "guest_log": r.guest_log.iter().map(|t| json!({
            "kind": t.kind,
            "seen": t.seen,
            "suppressed": t.suppressed,
        })).collect::<Vec<_>>(),
        "syscall_relay": r.syscall_relay.map(|(n, us)| json!({"calls": n, "us_each": us})),
        "diagnostic": diagnostic(r),
        "hints": r.hints,
        "console_tail": if r.end.needs_diagnostic() { r.console_tail.clone() } else { Vec::new() },
    })
}

/// Writes [`to_json`]'s document to `path`, whole: into `path.tmp`, synced, renamed over `path`
/// (as `compare::write_whole`, which this layer does not import).
pub fn write_json(path: &std::path::Path, r: &RunReport) -> std::io::Result<()> {
    use std::io::Write;
    let mut text = serde_json::to_string_pretty(&to_json(r)).expect("JSON of plain values");
    text.push('\n');
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn report() -> RunReport {
        let exits = ExitCounts {
            io_in: 3,
            io_out: 40,
            msr: 7,
            interrupted: 2,
            internal_error: 5,
            ..Default::default()
        };
        let mut pmu = crate::pmu::PmuStats {
            msr_reads: 11,
            msr_writes: 12,
            pmis_raised: 30,
            pmis_nmi: 20,
            pmis_vector: 1,
            pmis_masked: 2,
            pmis_throttled: 6,
            pmis_merged: 6,
            pmis_held_at_end: 1,
            signals: 99,
            rdpmc_trapped: 5,
            gp_delivered: 4,
            rdpmc_gp: 3,
            ..Default::default()
        };
        pmu.by_mode[0].pmis = 8;
        pmu.by_mode[1].pmis = 13;
        let switch = |secs: u64, mode, by| crate::pmu::mode::Switch {
            at: Duration::from_secs(secs),
            tsc: 0,
            mode,
            by,
        };
        RunReport {
            host: crate::vm::HostReport {
                kvm: "kvm_amd",
                quirks: false,
                backend: Some(crate::pmu::BackendChoice::Soft),
                exit_cost_ns: 41_500,
                kvm_answers_rdpmc: Some(true),
                notify_cost_ns: 60_000,
            },
            end: crate::end::VmEnd::Timeout(Duration::from_secs(4)),
            exits: vec![exits.clone(), exits],
            pmu,
            vpmu: crate::vm::VpmuSetting::CpuSwitch,
            pmu_event_filter: None,
            mode_history: vec![
                switch(0, vpmu::AccountingMode::CpuSwitch, "start"),
                switch(1, vpmu::AccountingMode::DomainSwitch, "schedule"),
            ],
            fixups: vec![("clac/stac", 4), ("popcnt", 1)],
            syscall_relay: Some((17, 2.5)),
            console_tail: vec!["last line".into()],
            hints: vec!["a hint".into()],
            vcpu_states: Vec::new(),
            cmdline: None,
            guest_log: vec![vpmu::guest_log::GuestLogTotal {
                kind: "packet-gate-ignored-write",
                seen: 25,
                suppressed: 15,
            }],
            net: None,
            disks: vec![crate::vm::DiskReport {
                path: "/img/root.img".into(),
                readonly: true,
                sectors: 2048,
                counts: crate::devices::virtio::blk::BlkCounts {
                    reads: 40,
                    flushes: 2,
                    writes: 3,
                    bytes_read: 81920,
                    io_errors: 3,
                    unsupported: 1,
                    ..Default::default()
                },
                status: 0xf,
                interrupts: 45,
                bad_accesses: 0,
                fault: None,
            }],
            setup_time: Duration::from_millis(20),
            run_time: Duration::from_secs(4),
        }
    }

    #[test]
    fn json_report_says_what_the_text_report_says() {
        let r = report();
        let text = lines(&r).join("\n");
        let j: serde_json::Value = serde_json::from_str(&to_json(&r).to_string()).unwrap();
        assert_eq!(j["schema"], RUN_SCHEMA);
        assert_eq!(j["end"]["kind"], "timeout");
        assert_eq!(j["vpmu"]["setting"], "cpu-switch");
        assert_eq!(j["end"]["exit_code"], 7);
        assert_eq!(j["end"]["clean"], false);
        let h = &j["host"];
        assert_eq!(
            (&h["kvm"], &h["quirks"], &h["kind"], &h["vpmu_backend"]),
            (
                &serde_json::json!("kvm_amd"),
                &serde_json::json!(false),
                &serde_json::json!("vt-x/svm"),
                &serde_json::json!("soft")
            )
        );
        assert_eq!(h["cpu_switch_exit_cost_ns"], 41_500);
        assert_eq!(h["notify_cost_ns"], 60_000);
        let g = &j["guest_log"][0];
        assert_eq!(
            (&g["kind"], &g["seen"], &g["suppressed"]),
            (
                &serde_json::json!("packet-gate-ignored-write"),
                &serde_json::json!(25),
                &serde_json::json!(15)
            )
        );
        assert!(text.contains(
            "guest-triggered warnings, first 10 of each kind logged: packet-gate-ignored-write 25 (15 not logged)"
        ));
        assert_eq!(h["min_soft_period_ns"], 600_000);
        assert!(text.contains(
            "host: kvm_amd (VT-x/SVM, host quirks off); vPMU backend soft, cpu-switch leaves \
             41.5 us of KVM's exit path out of each KVM_RUN"
        ));
        assert!(text.contains(&format!(
            "{} after 4.00 s (exit code 7)",
            j["end"]["text"].as_str().unwrap()
        )));
        let e = &j["exits"];
        assert_eq!(e["total"], 114);
        // The schema's keys (vpmu-run/1), now derived from ExitCounts.
        let keys: Vec<&str> = e.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "access_ioctls",
                "hlt",
                "internal_error",
                "interrupted",
                "io_in",
                "io_out",
                "mmio",
                "msr",
                "other",
                "sync_regs",
                "total",
                "unclaimed_io",
                "unclaimed_mmio"
            ]
        );
        assert!(text.contains(&format!(
            "exits: {} total: {} port in, {} port out",
            e["total"], e["io_in"], e["io_out"]
        )));
        assert!(text.contains(&format!("{} emulation failures", e["internal_error"])));
        assert_eq!(j["exits_by_vcpu"].as_array().unwrap().len(), 2);
        let p = &j["vpmu"]["pmis"];
        assert!(text.contains(&format!(
            "{} PMIs raised = {} delivered + {} dropped (masked) + {} merged",
            p["raised"], p["delivered"], p["dropped_masked"], p["merged"]
        )));
        assert!(text.contains(&format!("{} held back by the rate limit", p["throttled"])));
        let t = &j["vpmu"]["rdpmc_trap"];
        assert_eq!(
            (t["served"].as_u64(), t["gp_delivered"].as_u64()),
            (Some(5), Some(4))
        );
        assert!(text.contains(&format!(
            "RDPMC trap: {} RDPMCs served through the guest's #GP handler; {} #GPs passed to the \
             guest ({} of them RDPMCs",
            t["served"], t["gp_delivered"], t["rdpmc_gp"]
        )));
        let m = &j["vpmu"]["by_mode"];
        assert_eq!(m[0]["mode"], "cpu-switch");
        assert_eq!(m[0]["secs"], 1.0);
        assert!(text.contains(&format!(
            "in domain-switch (3.0 s): {} PMIs delivered",
            m[1]["pmis_delivered"]
        )));
        let s = j["vpmu"]["mode_switches"].as_array().unwrap();
        assert_eq!((s.len(), &s[1]["by"]), (2, &serde_json::json!("schedule")));
        assert!(text.contains("domain-switch at 1.0 s (schedule)"));
        assert_eq!(j["host_quirk_fixups"]["clac/stac"], 4);
        assert!(text.contains("host-quirk fix-ups: clac/stac: 4, popcnt: 1"));
        assert_eq!(j["syscall_relay"]["calls"], 17);
        assert!(text.contains("syscall relay: 17 guest system calls"));
        assert_eq!(j["console_tail"][0], "last line");
        assert_eq!(j["hints"][0], "a hint");
        assert!(text.contains("[vpmu-vmm] hint: a hint"));
        assert!(j["net"].is_null());
        let d = &j["disks"][0];
        assert_eq!(
            (&d["readonly"], &d["sectors"]),
            (&true.into(), &2048.into())
        );
        assert!(text.contains(&format!(
            "virtio-blk vda (/img/root.img, read-only): status 0xf; requests: {} read, {} write, {} flush",
            d["requests"]["read"], d["requests"]["write"], d["requests"]["flush"]
        )), "{text}");
        assert!(text.contains(&format!(
            "{} bytes read, 0 written; {} I/O errors, {} unsupported",
            d["bytes_read"], d["errors"]["io_error"], d["errors"]["unsupported"]
        )));
    }

    #[test]
    fn json_report_of_a_run_without_the_vpmu() {
        let mut r = report();
        r.vpmu = crate::vm::VpmuSetting::Off;
        r.end = crate::end::VmEnd::PowerOff;
        r.syscall_relay = None;
        let j = to_json(&r);
        assert!(j["vpmu"].is_null() && j["syscall_relay"].is_null());
        assert_eq!(
            (&j["end"]["kind"], &j["end"]["exit_code"]),
            (&"power-off".into(), &0.into())
        );
        assert!(j["console_tail"].as_array().unwrap().is_empty());
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("r.json");
        write_json(&f, &r).unwrap();
        let back: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        assert_eq!(back, j);
    }

    #[test]
    fn a_debug_exit_is_reported_with_its_value_and_no_diagnostic() {
        let mut r = report();
        r.end = crate::end::VmEnd::DebugExit(1);
        let j = to_json(&r);
        assert_eq!(j["end"]["kind"], "debug-exit");
        assert_eq!(j["end"]["exit_code"], 12);
        assert_eq!(j["end"]["debug_exit"]["value"], 1);
        assert_eq!(j["end"]["debug_exit"]["qemu_status"], 3);
        assert!(j["console_tail"].as_array().unwrap().is_empty());
        let text = lines(&r).join("\n");
        assert!(
            text.contains(
                "guest wrote 0x1 to the isa-debug-exit port (QEMU would exit with status 3)"
            ),
            "{text}"
        );
        assert!(!text.contains("last guest console lines"), "{text}");
        r.end = crate::end::VmEnd::Timeout(Duration::from_secs(1));
        assert!(to_json(&r)["end"]["debug_exit"].is_null());
    }
}
