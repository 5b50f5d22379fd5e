//! The report as the lines `vpmu-vmm run` prints on stderr, rendered from [`RunDoc`] (the
//! JSON document's own structs, so the two cannot say different things).

use super::{DiskDoc, ExitsDoc, HostDoc, NetDoc, PingerDoc, RunDoc, VpmuDoc};

/// The lines of the text report (the first one empty).
pub fn lines(d: &RunDoc) -> Vec<String> {
    let mut out = vec![
        String::new(),
        format!(
            "[vpmu-vmm] {} after {:.2} s (exit code {})",
            d.end.text, d.run_secs, d.end.exit_code
        ),
        host_line(&d.host),
        exits_line(&d.exits),
    ];
    if let Some(v) = &d.vpmu {
        vpmu_lines(&mut out, v);
    }
    if let Some(n) = &d.net {
        net_lines(&mut out, n);
    }
    for (i, disk) in d.disks.iter().enumerate() {
        out.push(disk_line(i, disk));
    }
    if !d.host_quirk_fixups.is_empty() {
        let list: Vec<String> = d
            .host_quirk_fixups
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect();
        out.push(format!(
            "[vpmu-vmm] host-quirk fix-ups: {}",
            list.join(", ")
        ));
    }
    if let Some(s) = &d.syscall_relay {
        let sync_regs = d.exits.counts.sync_regs;
        out.push(format!(
            "[vpmu-vmm] syscall relay: {} guest system calls completed by the VMM, {:.1} us each in the VMM (exit to registers written{})",
            s.calls,
            s.us_each,
            if sync_regs { ", through kvm_run: KVM applies them in the next KVM_RUN" } else { "" }
        ));
        out.push(format!(
            "[vpmu-vmm] vCPU state ioctls on exits: {} (registers {})",
            d.exits.counts.access_ioctls,
            if sync_regs {
                "through kvm_run, KVM_CAP_SYNC_REGS"
            } else {
                "through ioctls"
            }
        ));
    }
    out.extend(guest_log_line(d));
    out.extend(d.diagnostic.iter().cloned());
    out.extend(d.hints.iter().map(|h| format!("[vpmu-vmm] hint: {h}")));
    if !d.console_tail.is_empty() {
        out.push("[vpmu-vmm] last guest console lines:".to_string());
        out.extend(d.console_tail.iter().map(|l| format!("  | {l}")));
    }
    out
}

/// The host kind: which KVM, whether its quirks were on, the backend and its costs.
fn host_line(h: &HostDoc) -> String {
    let kind = if h.quirks {
        "guest kernel code emulated, host quirks on"
    } else {
        "VT-x/SVM, host quirks off"
    };
    let mut line = format!("[vpmu-vmm] host: {} ({kind})", h.kvm);
    if let Some(b) = &h.vpmu_backend {
        line.push_str(&format!("; vPMU backend {b}"));
        if h.cpu_switch_exit_cost_ns > 0 {
            line.push_str(&format!(
                ", cpu-switch leaves {:.1} us of KVM's exit path out of each KVM_RUN",
                h.cpu_switch_exit_cost_ns as f64 / 1000.0
            ));
        }
        if h.notify_cost_ns > 0 {
            line.push_str(&format!(
                "; a notification costs {:.1} us, so soft counters notify no sooner than every {:.0} us",
                h.notify_cost_ns as f64 / 1000.0,
                h.min_soft_period_ns as f64 / 1000.0
            ));
        }
        if h.kvm_answers_rdpmc == Some(true) {
            line.push_str("; KVM answers guest RDPMC itself (not trappable)");
        }
    }
    line
}

fn exits_line(e: &ExitsDoc) -> String {
    let c = &e.counts;
    format!(
        "[vpmu-vmm] exits: {} total: {} port in, {} port out ({} unclaimed), {} mmio ({} unclaimed), {} msr, {} interrupted, {} emulation failures",
        e.total, c.io_in, c.io_out, c.unclaimed_io, c.mmio, c.unclaimed_mmio, c.msr, c.interrupted, c.internal_error
    )
}

/// The vPMU's lines: MSR and RDPMC service, PMIs, the rate limit, modes, the host profile's
/// share, the trap, the event filter and what the backend could not count.
fn vpmu_lines(out: &mut Vec<String>, v: &VpmuDoc) {
    let p = &v.pmis;
    out.push(format!(
        "[vpmu-vmm] vPMU ({}): {} MSR reads, {} writes, {} RDPMC served, {} #GP; PMIs: {} NMI, {} vector, {} dropped (LVTPC masked), {} held back by the rate limit",
        v.setting, v.msr_reads, v.msr_writes, v.rdpmc_served, v.gp_faults, p.nmi, p.vector, p.dropped_masked, p.throttled
    ));
    if p.throttled > 0 || p.merged > 0 {
        out.push(format!(
            "[vpmu-vmm] vPMU rate limit: {} PMIs raised = {} delivered + {} dropped (masked) + {} merged into held-back ones + {} held at the end; {} signals on the vCPU threads",
            p.raised, p.delivered, p.dropped_masked, p.merged, p.held_at_end, v.signals
        ));
    }
    mode_lines(out, v);
    let sampler_ns = v.sampler_ns_forgotten + v.sampler_work_ns_left_out;
    if sampler_ns > 0 {
        out.push(format!(
            "[vpmu-vmm] host profile: its samples cost the guest's counters {:.3} ms of host time \
             (interruptions {:.3} ms, the VMM's sample work {:.3} ms), taken back from them",
            sampler_ns as f64 / 1e6,
            v.sampler_ns_forgotten as f64 / 1e6,
            v.sampler_work_ns_left_out as f64 / 1e6
        ));
    }
    if v.rdpmc_fixed > 0 {
        out.push(format!(
            "[vpmu-vmm]   {} of the RDPMCs read a fixed counter",
            v.rdpmc_fixed
        ));
    }
    let t = &v.rdpmc_trap;
    if t.served + t.gp_delivered > 0 {
        out.push(format!(
            "[vpmu-vmm] RDPMC trap: {} RDPMCs served through the guest's #GP handler; {} #GPs \
             passed to the guest ({} of them RDPMCs that fault as on hardware)",
            t.served, t.gp_delivered, t.rdpmc_gp
        ));
    }
    if let Some(f) = &v.event_filter {
        let per: Vec<String> = f
            .refused_by_vcpu
            .iter()
            .enumerate()
            .map(|(i, n)| format!("vCPU {i}: {n}"))
            .collect();
        out.push(format!(
            "[vpmu-vmm] vPMU event filter {}: {} counter programmings refused ({})",
            f.spec,
            f.refused,
            per.join(", ")
        ));
    }
    if !v.uncounted_events.is_empty() {
        out.push(format!(
            "[vpmu-vmm] WARNING: the guest programmed events the vPMU's backend cannot count; their \
             counters stayed still (a guest profiler shows 0 for them, docs/vpmu.md \
             \"What the soft backend cannot do\"): {}",
            v.uncounted_events.join(", ")
        ));
    }
    if v.rdpmc_left_to_kvm > 0 {
        out.push(format!(
            "[vpmu-vmm] {} RDMSRs of RDPMC index numbers from unpatched code were left to KVM",
            v.rdpmc_left_to_kvm
        ));
    }
}

/// The accounting modes of the run: its switches, and what each mode saw.
fn mode_lines(out: &mut Vec<String>, v: &VpmuDoc) {
    let h = &v.mode_switches;
    if h.len() > 1 {
        let step = |s: &super::SwitchDoc| format!("{} at {:.1} s ({})", s.mode, s.at_secs, s.by);
        // A repeating schedule switches hundreds of times: show the ends of the list.
        let steps: Vec<String> = if h.len() <= 8 {
            h.iter().map(step).collect()
        } else {
            let mut v: Vec<String> = h[..3].iter().map(step).collect();
            v.push(format!("... {} switches ...", h.len() - 6));
            v.extend(h[h.len() - 3..].iter().map(step));
            v
        };
        let unlogged = match v.mode_switches_unlogged {
            0 => String::new(),
            n => format!(" (and {n} later switches, not logged)"),
        };
        out.push(format!(
            "[vpmu-vmm] accounting modes: {}{unlogged}",
            steps.join(" -> ")
        ));
    }
    for m in &v.by_mode {
        if m.pmis_delivered + m.rdpmc_served > 0 || (h.len() > 1 && m.secs > 0.0) {
            out.push(format!(
                "[vpmu-vmm]   in {} ({:.1} s): {} PMIs delivered, {} RDPMC served",
                m.mode, m.secs, m.pmis_delivered, m.rdpmc_served
            ));
        }
    }
}

/// Guest-triggered warnings that were only counted (none: no line).
fn guest_log_line(d: &RunDoc) -> Option<String> {
    let flooded: Vec<String> = d
        .guest_log
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
fn disk_line(i: usize, d: &DiskDoc) -> String {
    let (r, e) = (&d.requests, &d.errors);
    format!(
        "[vpmu-vmm] virtio-blk vd{} ({}{}): status {:#x}; requests: {} read, {} write, {} flush, {} get-id, {} discard, {} write-zeroes, {} other; {} bytes read, {} written; {} I/O errors, {} unsupported, {} without a status byte, {} bad register accesses{}; {} interrupts, {} notifies ({} of no queue)",
        disk_letter(i),
        d.path,
        if d.readonly { ", read-only" } else { "" },
        d.status,
        r.read, r.write, r.flush, r.get_id, r.discard, r.write_zeroes, r.other,
        d.bytes_read, d.bytes_written,
        e.io_error, e.unsupported, e.no_status, d.bad_accesses,
        d.queue_fault.as_ref().map(|f| format!("; queue fault: {f}")).unwrap_or_default(),
        d.interrupts, d.notifies, e.bad_notify,
    )
}

/// The guest's name for disk `i` (vda, vdb, ...; past vdz the index).
fn disk_letter(i: usize) -> String {
    match u8::try_from(i).ok().filter(|&i| i < 26) {
        Some(i) => char::from(b'a' + i).to_string(),
        None => format!("[{i}]"),
    }
}

fn net_lines(out: &mut Vec<String>, n: &NetDoc) {
    out.push(format!(
        "[vpmu-vmm] virtio-net: status {:#x}, {} frames to the guest, {} from it, {} dropped (no receive buffer), {} queue errors, {} bad register accesses; {} interrupts, {} rx / {} tx notifies",
        n.status, n.rx_frames, n.tx_frames, n.rx_dropped, n.queue_errors, n.bad_accesses, n.interrupts, n.rx_notifies, n.tx_notifies
    ));
    if let Some(p) = &n.pinger {
        pinger_lines(out, p);
    }
}

fn pinger_lines(out: &mut Vec<String>, p: &PingerDoc) {
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
        p.rtt_mean_ms
            .map(|m| format!("; RTT mean {m:.1} ms, max {:.1} ms", p.rtt_max_ms))
            .unwrap_or_default(),
        match (p.first_reply_secs, p.last_reply_secs) {
            (Some(f), Some(l)) => format!(
                "; replies from {f:.1} s to {l:.1} s after the driver came up"
            ),
            _ => String::new(),
        },
    ));
    if let Some(loss) = p.loss_after_first_reply {
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
