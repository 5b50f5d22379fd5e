//! The end-of-run report of `vpmu-vmm run`, as data: [`RunDoc`] and its sections are typed
//! structs built once from the runtime's [`RunReport`]; serde derives the JSON document
//! (`run --report-json FILE`, schema [`RUN_SCHEMA`]; docs/tracing.md, "The end-of-run report as
//! JSON") and [`text`] renders the lines printed on stderr from the same structs.

mod text;

use std::collections::BTreeMap;

use runtime::end::VmEnd;
use runtime::exit::ExitCounts;
use runtime::merge::Merge;
use runtime::vm::RunReport;
use serde::Serialize;

pub use text::lines;

/// The `schema` field of the JSON document: bumped when a stable field changes meaning or goes
/// away (fields may be added within a version).
pub const RUN_SCHEMA: &str = "vpmu-run/1";

/// The whole report.
#[derive(Debug, Serialize)]
pub struct RunDoc {
    pub schema: &'static str,
    pub end: EndDoc,
    pub host: HostDoc,
    pub setup_secs: f64,
    pub run_secs: f64,
    /// Summed over vCPUs.
    pub exits: ExitsDoc,
    pub exits_by_vcpu: Vec<ExitsDoc>,
    /// None with `--vpmu=off`.
    pub vpmu: Option<VpmuDoc>,
    /// None without `--net`.
    pub net: Option<NetDoc>,
    /// One per `--disk`, in order.
    pub disks: Vec<DiskDoc>,
    /// Host-quirk fix-ups by kind (none on a VT-x/SVM host).
    pub host_quirk_fixups: BTreeMap<&'static str, u64>,
    pub guest_log: Vec<GuestLogDoc>,
    /// None where the SYSCALL relay did not run.
    pub syscall_relay: Option<SyscallRelayDoc>,
    /// One line per vCPU on a bad end ([`diagnostic`]).
    pub diagnostic: Vec<String>,
    pub hints: Vec<String>,
    /// The guest console's last lines, on a bad end only.
    pub console_tail: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct EndDoc {
    /// One word per [`VmEnd`] variant ([`end_kind`]).
    pub kind: &'static str,
    pub text: String,
    pub exit_code: i32,
    pub clean: bool,
    pub debug_exit: Option<DebugExitDoc>,
}

#[derive(Debug, Serialize)]
pub struct DebugExitDoc {
    pub value: u32,
    pub qemu_status: u32,
}

#[derive(Debug, Serialize)]
pub struct HostDoc {
    pub kvm: &'static str,
    pub quirks: bool,
    /// `emulated-kernel` or `vt-x/svm`.
    pub kind: &'static str,
    /// As `--vpmu-backend` spells it (None with the vPMU off).
    pub vpmu_backend: Option<String>,
    pub cpu_switch_exit_cost_ns: u64,
    pub kvm_answers_rdpmc: Option<bool>,
    pub notify_cost_ns: u64,
    pub min_soft_period_ns: u64,
}

/// Exit counts as [`ExitCounts`] derives them, and their sum.
#[derive(Debug, Serialize)]
pub struct ExitsDoc {
    pub total: u64,
    #[serde(flatten)]
    pub counts: ExitCounts,
}

#[derive(Debug, Serialize)]
pub struct VpmuDoc {
    /// As `--vpmu` spells it: the mode the run started in.
    pub setting: String,
    pub msr_reads: u64,
    pub msr_writes: u64,
    pub gp_faults: u64,
    pub rdpmc_served: u64,
    pub rdpmc_fixed: u64,
    pub rdpmc_left_to_kvm: u64,
    pub rdpmc_trap: RdpmcTrapDoc,
    pub pmis: PmisDoc,
    pub signals: u64,
    pub sampler_ns_forgotten: u64,
    pub samples_left_out: u64,
    pub sampler_work_ns_left_out: u64,
    pub by_mode: Vec<ModeDoc>,
    pub mode_switches: Vec<SwitchDoc>,
    /// Switches made after the log of `mode_switches` was full (not in it).
    pub mode_switches_unlogged: u64,
    pub event_filter: Option<EventFilterDoc>,
    pub uncounted_events: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct RdpmcTrapDoc {
    pub served: u64,
    pub gp_delivered: u64,
    pub rdpmc_gp: u64,
}

#[derive(Debug, Serialize)]
pub struct PmisDoc {
    pub raised: u64,
    pub delivered: u64,
    pub nmi: u64,
    pub vector: u64,
    pub dropped_masked: u64,
    pub throttled: u64,
    pub merged: u64,
    pub held_at_end: u64,
}

/// What one accounting mode saw.
#[derive(Debug, Serialize)]
pub struct ModeDoc {
    pub mode: &'static str,
    pub secs: f64,
    pub pmis_delivered: u64,
    pub rdpmc_served: u64,
}

#[derive(Debug, Serialize)]
pub struct SwitchDoc {
    pub mode: &'static str,
    pub at_secs: f64,
    pub by: &'static str,
}

#[derive(Debug, Serialize)]
pub struct EventFilterDoc {
    pub spec: String,
    pub refused: u64,
    pub refused_by_vcpu: Vec<u64>,
}

#[derive(Debug, Serialize)]
pub struct NetDoc {
    pub status: u32,
    pub interrupts: u64,
    pub bad_accesses: u64,
    pub rx_frames: u64,
    pub tx_frames: u64,
    pub rx_dropped: u64,
    pub queue_errors: u64,
    pub rx_notifies: u64,
    pub tx_notifies: u64,
    pub pinger: Option<PingerDoc>,
}

#[derive(Debug, Serialize)]
pub struct PingerDoc {
    pub requests_pushed: u64,
    pub replies_ok: u64,
    pub replies_bad: u64,
    pub requests_no_buffer: u64,
    pub requests_skipped_late: u64,
    pub requests_held: u64,
    pub arp_answered: u64,
    pub other_frames: u64,
    pub rtt_mean_ms: Option<f64>,
    pub rtt_max_ms: f64,
    /// From the pinger's start to the first and the last good reply.
    pub first_reply_secs: Option<f64>,
    pub last_reply_secs: Option<f64>,
    pub pushed_after_first_reply: u64,
    pub replies_after_first_reply: u64,
    pub unanswered_after_first_reply: u64,
    /// Share of the requests pushed after the first reply that got none (0..1).
    pub loss_after_first_reply: Option<f64>,
    pub first_bad: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct DiskDoc {
    pub path: String,
    pub readonly: bool,
    pub sectors: u64,
    pub status: u32,
    pub interrupts: u64,
    pub notifies: u64,
    pub bad_accesses: u64,
    pub requests: DiskRequestsDoc,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: DiskErrorsDoc,
    pub queue_fault: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct DiskRequestsDoc {
    pub read: u64,
    pub write: u64,
    pub flush: u64,
    pub get_id: u64,
    pub discard: u64,
    pub write_zeroes: u64,
    pub other: u64,
}

#[derive(Debug, Serialize)]
pub struct DiskErrorsDoc {
    pub io_error: u64,
    pub unsupported: u64,
    pub no_status: u64,
    pub bad_notify: u64,
}

/// Guest-triggered warnings of one kind: how many, and how many were not logged.
#[derive(Debug, Serialize)]
pub struct GuestLogDoc {
    pub kind: &'static str,
    pub seen: u64,
    pub suppressed: u64,
}

#[derive(Debug, Serialize)]
pub struct SyscallRelayDoc {
    pub calls: u64,
    /// The VMM's mean time per system call (exit to registers written).
    pub us_each: f64,
}

impl RunDoc {
    pub fn new(r: &RunReport) -> RunDoc {
        let mut total = ExitCounts::default();
        for c in &r.exits {
            total.merge(c);
        }
        let bad_end = r.end.needs_diagnostic();
        RunDoc {
            schema: RUN_SCHEMA,
            end: EndDoc::new(&r.end),
            host: HostDoc::new(&r.host),
            setup_secs: r.setup_time.as_secs_f64(),
            run_secs: r.run_time.as_secs_f64(),
            exits: ExitsDoc::new(&total),
            exits_by_vcpu: r.exits.iter().map(ExitsDoc::new).collect(),
            vpmu: (r.vpmu != runtime::vm::VpmuSetting::Off).then(|| VpmuDoc::new(r)),
            net: r.net.as_ref().map(NetDoc::new),
            disks: r.disks.iter().map(DiskDoc::new).collect(),
            host_quirk_fixups: r.fixups.iter().copied().collect(),
            guest_log: r
                .guest_log
                .iter()
                .map(|t| GuestLogDoc {
                    kind: t.kind,
                    seen: t.seen,
                    suppressed: t.suppressed,
                })
                .collect(),
            syscall_relay: r
                .syscall_relay
                .map(|(calls, us_each)| SyscallRelayDoc { calls, us_each }),
            diagnostic: diagnostic(r),
            hints: r.hints.clone(),
            console_tail: if bad_end {
                r.console_tail.clone()
            } else {
                Vec::new()
            },
        }
    }
}

impl EndDoc {
    fn new(end: &VmEnd) -> EndDoc {
        EndDoc {
            kind: end_kind(end),
            text: end.to_string(),
            exit_code: end.exit_code(),
            clean: end.is_clean(),
            debug_exit: match *end {
                VmEnd::DebugExit(value) => Some(DebugExitDoc {
                    value,
                    qemu_status: runtime::end::qemu_status(value),
                }),
                _ => None,
            },
        }
    }
}

impl HostDoc {
    fn new(h: &runtime::vm::HostReport) -> HostDoc {
        HostDoc {
            kvm: h.kvm,
            quirks: h.quirks,
            kind: if h.quirks {
                "emulated-kernel"
            } else {
                "vt-x/svm"
            },
            vpmu_backend: h.backend.map(|b| value_name(&b)),
            cpu_switch_exit_cost_ns: h.exit_cost_ns,
            kvm_answers_rdpmc: h.kvm_answers_rdpmc,
            notify_cost_ns: h.notify_cost_ns,
            min_soft_period_ns: runtime::pmu::backend::min_soft_period_ns(h.notify_cost_ns),
        }
    }
}

impl ExitsDoc {
    fn new(c: &ExitCounts) -> ExitsDoc {
        ExitsDoc {
            total: c.total(),
            counts: c.clone(),
        }
    }
}

impl VpmuDoc {
    fn new(r: &RunReport) -> VpmuDoc {
        let p = &r.pmu;
        let time = runtime::pmu::mode::time_in_modes(&r.mode_history, r.run_time);
        VpmuDoc {
            setting: value_name(&r.vpmu),
            msr_reads: p.msr_reads,
            msr_writes: p.msr_writes,
            gp_faults: p.gp_faults,
            rdpmc_served: p.rdpmc_reads,
            rdpmc_fixed: p.rdpmc_fixed,
            rdpmc_left_to_kvm: p.rdpmc_genuine_msr,
            rdpmc_trap: RdpmcTrapDoc {
                served: p.rdpmc_trapped,
                gp_delivered: p.gp_delivered,
                rdpmc_gp: p.rdpmc_gp,
            },
            pmis: PmisDoc {
                raised: p.pmis_raised,
                delivered: p.pmis_nmi + p.pmis_vector,
                nmi: p.pmis_nmi,
                vector: p.pmis_vector,
                dropped_masked: p.pmis_masked,
                throttled: p.pmis_throttled,
                merged: p.pmis_merged,
                held_at_end: p.pmis_held_at_end,
            },
            signals: p.signals,
            sampler_ns_forgotten: p.sampler_ns_forgotten,
            samples_left_out: p.samples_left_out,
            sampler_work_ns_left_out: p.sampler_work_ns_left_out,
            by_mode: vpmu::AccountingMode::ALL
                .into_iter()
                .enumerate()
                .map(|(i, m)| ModeDoc {
                    mode: m.name(),
                    secs: time[i].as_secs_f64(),
                    pmis_delivered: p.by_mode[i].pmis,
                    rdpmc_served: p.by_mode[i].rdpmc_reads,
                })
                .collect(),
            mode_switches: r
                .mode_history
                .iter()
                .map(|s| SwitchDoc {
                    mode: s.mode.name(),
                    at_secs: s.at.as_secs_f64(),
                    by: s.by,
                })
                .collect(),
            mode_switches_unlogged: r.mode_switches_unlogged,
            event_filter: r.pmu_event_filter.as_ref().map(|f| EventFilterDoc {
                spec: f.to_string(),
                refused: p.filter_blocked,
                refused_by_vcpu: p.filter_blocked_by_vcpu.clone(),
            }),
            uncounted_events: p
                .uncounted
                .iter()
                .map(|(u, a)| match a {
                    Some(a) => format!("{u} ({a:?})"),
                    None => u.to_string(),
                })
                .collect(),
        }
    }
}

impl NetDoc {
    fn new(n: &runtime::devices::virtio::net::NetReport) -> NetDoc {
        let c = &n.card;
        NetDoc {
            status: n.status,
            interrupts: n.interrupts,
            bad_accesses: n.bad_accesses,
            rx_frames: c.rx_frames,
            tx_frames: c.tx_frames,
            rx_dropped: c.rx_dropped,
            queue_errors: c.queue_errors,
            rx_notifies: c.rx_notifies,
            tx_notifies: c.tx_notifies,
            pinger: n.pinger.as_ref().map(PingerDoc::new),
        }
    }
}

impl PingerDoc {
    fn new(p: &runtime::net::pinger::NetStats) -> PingerDoc {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        PingerDoc {
            requests_pushed: p.requests_pushed,
            replies_ok: p.replies_ok,
            replies_bad: p.replies_bad,
            requests_no_buffer: p.requests_no_buffer,
            requests_skipped_late: p.requests_skipped_late,
            requests_held: p.requests_held,
            arp_answered: p.arp_answered,
            other_frames: p.other_frames,
            rtt_mean_ms: p.rtt_mean().map(ms),
            rtt_max_ms: ms(p.rtt_max),
            first_reply_secs: p.first_reply_after.map(|d| d.as_secs_f64()),
            last_reply_secs: p.last_reply_after.map(|d| d.as_secs_f64()),
            pushed_after_first_reply: p.pushed_after_first_reply,
            replies_after_first_reply: p.replies_after_first_reply,
            unanswered_after_first_reply: p.unanswered_after_first_reply,
            loss_after_first_reply: p.loss_after_first_reply(),
            first_bad: p.first_bad.clone(),
        }
    }
}

impl DiskDoc {
    fn new(d: &runtime::vm::DiskReport) -> DiskDoc {
        let c = &d.counts;
        DiskDoc {
            path: d.path.display().to_string(),
            readonly: d.readonly,
            sectors: d.sectors,
            status: d.status,
            interrupts: d.interrupts,
            notifies: c.notifies,
            bad_accesses: d.bad_accesses,
            requests: DiskRequestsDoc {
                read: c.reads,
                write: c.writes,
                flush: c.flushes,
                get_id: c.get_ids,
                discard: c.discards,
                write_zeroes: c.write_zeroes,
                other: c.other,
            },
            bytes_read: c.bytes_read,
            bytes_written: c.bytes_written,
            errors: DiskErrorsDoc {
                io_error: c.io_errors,
                unsupported: c.unsupported,
                no_status: c.no_status,
                bad_notify: c.bad_notifies,
            },
            queue_fault: d.fault.clone(),
        }
    }
}

/// A value as its command-line option spells it (`clap::ValueEnum`).
fn value_name<T: clap::ValueEnum + std::fmt::Debug>(v: &T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_else(|| format!("{v:?}").to_lowercase())
}

/// The end's kind, one word per [`VmEnd`] variant (stable in `vpmu-run/1`).
pub fn end_kind(end: &VmEnd) -> &'static str {
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

/// Prints the report's text on stderr.
pub fn print(r: &RunReport) {
    for l in lines(&RunDoc::new(r)) {
        eprintln!("{l}");
    }
}

/// The report as one JSON value (`vpmu-run/1`).
pub fn to_json(r: &RunReport) -> serde_json::Value {
    serde_json::to_value(RunDoc::new(r)).expect("the report serializes: plain values")
}

/// Writes the JSON document to `path`, whole: into `path.tmp`, synced, renamed over `path`.
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
mod tests;
