//! What `vpmu-vmm run` prints (to stderr) when the VM ends.

use crate::exit::ExitCounts;
use crate::vm::RunReport;

pub fn print(r: &RunReport) {
    let mut total = ExitCounts::default();
    for c in &r.exits {
        total.add(c);
    }
    eprintln!();
    eprintln!(
        "[vpmu-vmm] {} after {:.2} s (exit code {})",
        r.end,
        r.run_time.as_secs_f64(),
        r.end.exit_code()
    );
    eprintln!(
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
    );
    if r.vpmu != crate::vm::VpmuSetting::Off {
        let p = &r.pmu;
        eprintln!(
            "[vpmu-vmm] vPMU ({:?}): {} MSR reads, {} writes, {} RDPMC served, {} #GP; PMIs: {} NMI, {} vector, {} dropped (LVTPC masked), {} held back by the rate limit",
            r.vpmu, p.msr_reads, p.msr_writes, p.rdpmc_reads, p.gp_faults, p.pmis_nmi, p.pmis_vector, p.pmis_masked, p.pmis_throttled
        );
        if p.pmis_throttled > 0 || p.pmis_merged > 0 {
            eprintln!(
                "[vpmu-vmm] vPMU rate limit: {} PMIs raised = {} delivered + {} dropped (masked) + {} merged into held-back ones + {} held at the end; {} signals on the vCPU threads",
                p.pmis_raised,
                p.pmis_nmi + p.pmis_vector,
                p.pmis_masked,
                p.pmis_merged,
                p.pmis_held_at_end,
                p.signals
            );
        }
        if r.mode_history.len() > 1 {
            let step = |s: &crate::pmu::mode::Switch| {
                format!(
                    "{} at {:.1} s ({})",
                    crate::pmu::mode::name(s.mode),
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
            eprintln!("[vpmu-vmm] accounting modes: {}", steps.join(" -> "));
        }
        let time = crate::pmu::mode::time_in_modes(&r.mode_history, r.run_time);
        for (i, m) in [
            vpmu::AccountingMode::CpuSwitch,
            vpmu::AccountingMode::DomainSwitch,
        ]
        .into_iter()
        .enumerate()
        {
            let c = p.by_mode[i];
            if c.pmis + c.rdpmc_reads > 0 || (r.mode_history.len() > 1 && !time[i].is_zero()) {
                eprintln!(
                    "[vpmu-vmm]   in {} ({:.1} s): {} PMIs delivered, {} RDPMC served",
                    crate::pmu::mode::name(m),
                    time[i].as_secs_f64(),
                    c.pmis,
                    c.rdpmc_reads
                );
            }
        }
        if p.rdpmc_fixed > 0 {
            eprintln!(
                "[vpmu-vmm]   {} of the RDPMCs read a fixed counter",
                p.rdpmc_fixed
            );
        }
        if let Some(f) = &r.pmu_event_filter {
            let per: Vec<String> = p
                .filter_blocked_by_vcpu
                .iter()
                .enumerate()
                .map(|(i, n)| format!("vCPU {i}: {n}"))
                .collect();
            eprintln!(
                "[vpmu-vmm] vPMU event filter {f}: {} counter programmings refused ({})",
                p.filter_blocked,
                per.join(", ")
            );
        }
        if !p.uncounted.is_empty() {
            let list: Vec<String> = p
                .uncounted
                .iter()
                .map(|(u, a)| match a {
                    Some(a) => format!("{u} ({a:?})"),
                    None => u.to_string(),
                })
                .collect();
            eprintln!(
                "[vpmu-vmm] WARNING: the guest programmed events the vPMU's backend cannot count; their \
                 counters stayed still (a guest profiler shows 0 for them, docs/vpmu.md \
                 \"What the soft backend cannot do\"): {}",
                list.join(", ")
            );
        }
        if p.rdpmc_genuine_msr > 0 {
            eprintln!(
                "[vpmu-vmm] {} RDMSRs of RDPMC index numbers from unpatched code were left to KVM",
                p.rdpmc_genuine_msr
            );
        }
    }
    if let Some(n) = &r.net {
        print_net(n);
    }
    if !r.fixups.is_empty() {
        let list: Vec<String> = r.fixups.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        eprintln!("[vpmu-vmm] host-quirk fix-ups: {}", list.join(", "));
    }
    if let Some((n, us)) = r.syscall_relay {
        eprintln!(
            "[vpmu-vmm] syscall relay: {n} guest system calls completed by the VMM, {us:.1} us each in the VMM (exit to registers written{})",
            if total.sync_regs { ", through kvm_run: KVM applies them in the next KVM_RUN" } else { "" }
        );
        eprintln!(
            "[vpmu-vmm] vCPU state ioctls on exits: {} (registers {})",
            total.access_ioctls,
            if total.sync_regs {
                "through kvm_run, KVM_CAP_SYNC_REGS"
            } else {
                "through ioctls"
            }
        );
    }
    for l in diagnostic(r) {
        eprintln!("{l}");
    }
    if !r.end.is_clean() && !r.console_tail.is_empty() {
        eprintln!("[vpmu-vmm] last guest console lines:");
        for l in &r.console_tail {
            eprintln!("  | {l}");
        }
    }
}

fn print_net(n: &crate::net::NetReport) {
    let c = &n.card;
    eprintln!(
        "[vpmu-vmm] virtio-net: status {:#x}, {} frames to the guest, {} from it, {} dropped (no receive buffer), {} queue errors, {} bad register accesses; {} interrupts, {} rx / {} tx notifies",
        n.status, c.rx_frames, c.tx_frames, c.rx_dropped, c.queue_errors, n.bad_accesses, n.interrupts, c.rx_notifies, c.tx_notifies
    );
    let Some(p) = &n.pinger else { return };
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    eprintln!(
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
    );
    if let Some(loss) = p.loss_after_first_reply() {
        eprintln!(
            "[vpmu-vmm] net pinger: after the first reply {} requests pushed, {} answered, {} still in flight, loss {:.1}%",
            p.pushed_after_first_reply,
            p.replies_after_first_reply,
            p.unanswered_after_first_reply,
            loss * 100.0
        );
    }
    if let Some(why) = &p.first_bad {
        eprintln!("[vpmu-vmm] net pinger: first bad frame: {why}");
    }
}

/// On any end but a clean one: one line per vCPU with its RIP and its last exits
/// (`[vpmu-vmm] vCPU 0 at RIP 0x100034 (CPL 0), ended the run, 12 exits, last: ...`).
pub fn diagnostic(r: &RunReport) -> Vec<String> {
    if r.end.is_clean() {
        return Vec::new();
    }
    r.vcpu_states
        .iter()
        .map(|s| format!("[vpmu-vmm] {}", s.line()))
        .collect()
}
