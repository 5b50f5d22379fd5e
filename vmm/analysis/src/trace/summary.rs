//! `vpmu-vmm trace summary`: xenalyze-style tables from a trace (per vCPU exit reasons with
//! count, time, share of the run and cycle percentiles; per I/O port, MSR and MMIO address),
//! the split of each vCPU's wall time, and `--dump` (every record in time order).
//!
//! Time split of one vCPU, from the header's start TSC to the vCPU's end TSC:
//! * in VMM — from each exit (KVM_RUN returned) to the next KVM_RUN: exit handling, device
//!   emulation, vPMU work, fix-ups (measured exactly, TSC at both ends), less the time the
//!   thread was preempted during interrupted exits (clock records bracket those);
//! * halted/off-CPU — time the thread was not running: a halted vCPU waiting in KVM_RUN, or
//!   the host scheduling something else; wall time minus the thread's CPU time (clock
//!   records). Preemption during other exits' handling stays in "in VMM";
//! * in guest — the rest of the KVM_RUN time (guest code, and KVM's in-kernel exits).
//!
//! "cycles" are TSC ticks (the file's TSC kHz converts them to time).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;

use super::format::FormatError;
use super::format::{ExitEvent, Reason, Record};
use super::read::{Records, VcpuEnd};
use crate::guest_task::GuestMapping;

/// Count, total and percentiles of one kind of exit's VMM time, in bounded memory: the values
/// themselves while there are few (exact percentiles), then a histogram with 3 significant
/// digits (HdrHistogram: percentiles within 0.1%, memory set by the values' range, not by how
/// many there are).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    values: Vec<u64>,
    hist: Option<Histogram<u64>>,
    count: u64,
    total: u64,
}

/// Values kept exactly before a [`Stats`] turns to its histogram.
const EXACT_VALUES: usize = 4096;
/// Values above this are counted as this (HdrHistogram's range; 2^62 ticks is decades).
const LARGEST_VALUE: u64 = 1 << 62;

impl Stats {
    pub fn add(&mut self, ticks: u64) {
        self.count += 1;
        self.total = self.total.saturating_add(ticks);
        match &mut self.hist {
            Some(h) => record(h, ticks),
            None if self.values.len() < EXACT_VALUES => self.values.push(ticks),
            None => {
                let mut h = Histogram::new(3).expect("3 significant digits are valid");
                for v in std::mem::take(&mut self.values).into_iter().chain([ticks]) {
                    record(&mut h, v);
                }
                self.hist = Some(h);
            }
        }
    }
    /// Adds everything `other` holds.
    pub fn merge(&mut self, other: &Stats) {
        match &other.hist {
            None => other.values.iter().for_each(|&v| self.add(v)),
            Some(oh) => {
                let mut h = self.hist.take().unwrap_or_else(|| {
                    let mut h = Histogram::new(3).expect("3 significant digits are valid");
                    self.values.drain(..).for_each(|v| record(&mut h, v));
                    h
                });
                h.add(oh).expect("auto-resizing histograms take any other");
                self.hist = Some(h);
                self.count += other.count;
                self.total = self.total.saturating_add(other.total);
            }
        }
    }
    pub fn count(&self) -> u64 {
        self.count
    }
    pub fn total(&self) -> u64 {
        self.total
    }
    pub fn mean(&self) -> u64 {
        self.total.checked_div(self.count()).unwrap_or(0)
    }
    /// Nearest-rank percentile (exact while the values are kept, else within 0.1%).
    pub fn pct(&self, p: u32) -> u64 {
        if let Some(h) = &self.hist {
            return h.value_at_quantile(f64::from(p) / 100.0);
        }
        if self.values.is_empty() {
            return 0;
        }
        let mut v = self.values.clone();
        let rank = (u64::from(p) * self.count()).div_ceil(100).max(1);
        let (_, nth, _) = v.select_nth_unstable((rank - 1) as usize);
        *nth
    }
}

fn record(h: &mut Histogram<u64>, ticks: u64) {
    h.record(ticks.min(LARGEST_VALUE))
        .expect("an auto-resizing histogram takes values up to 2^62");
}

/// Wall time of one vCPU split three ways (TSC ticks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimeSplit {
    pub wall: u64,
    pub in_guest: u64,
    pub in_vmm: u64,
    pub halted: u64,
}

#[derive(Debug, Clone, Default)]
pub struct VcpuSummary {
    pub reasons: BTreeMap<Reason, Stats>,
    /// Of the interrupted exits' VMM time, how much the thread was not running (preempted by
    /// the host), from the clock records around them.
    pub interrupted_off_cpu: u64,
    pub split: TimeSplit,
    pub samples: u64,
    pub dropped: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub vcpus: Vec<VcpuSummary>,
    /// (port, out) -> stats, all vCPUs.
    pub ports: BTreeMap<(u32, bool), Stats>,
    /// (index, write) -> stats.
    pub msrs: BTreeMap<(u32, bool), Stats>,
    /// (address, write) -> stats.
    pub mmio: BTreeMap<(u64, bool), Stats>,
    /// By described event (`pio 0x2f8 out`): for the system-wide view.
    pub events: BTreeMap<String, Stats>,
}

/// The VMM time of an exit record (to the re-entry, or to the vCPU's end if none).
pub(crate) fn vmm_ticks(exit_tsc: u64, entry_tsc: u64, end_tsc: u64) -> u64 {
    if entry_tsc == 0 {
        end_tsc.saturating_sub(exit_tsc)
    } else {
        entry_tsc.saturating_sub(exit_tsc)
    }
}

/// `pio 0x2f8 out`, `msr 0xc0010004 rd` — an exit's kind without the access size.
pub(crate) fn event_key(e: &ExitEvent) -> String {
    match e.reason {
        Reason::IoIn | Reason::IoOut => format!(
            "pio {:#x} {}",
            e.detail,
            if e.reason == Reason::IoOut {
                "out"
            } else {
                "in"
            }
        ),
        Reason::MmioRead | Reason::MmioWrite => format!(
            "mmio {:#x} {}",
            e.addr,
            if e.reason == Reason::MmioWrite {
                "wr"
            } else {
                "rd"
            }
        ),
        _ => e.describe(),
    }
}

/// One vCPU's running state while its records stream by.
#[derive(Default)]
struct VcpuPass {
    summary: VcpuSummary,
    in_vmm: u64,
    first_clock: Option<(u64, u64)>,
    last_clock: Option<(u64, u64)>,
    /// An interrupted exit with a clock record at its exit: (entry TSC, CPU ns, VMM ticks).
    open: Option<(u64, u64, u64)>,
}

/// The tables of `trace summary`, in one pass over the records.
pub fn summarize(t: &dyn Records) -> Result<Summary, FormatError> {
    let h = t.header();
    let khz = u64::from(h.tsc_khz);
    let start = h.start_tsc;
    let ends = t.vcpu_ends();
    let mut s = Summary::default();
    let mut pass: Vec<VcpuPass> = ends.iter().map(|_| VcpuPass::default()).collect();
    t.for_each(&mut |v, r| {
        let end = ends[v].end_tsc.max(start);
        let p = &mut pass[v];
        match *r {
            Record::Exit {
                event,
                exit_tsc,
                entry_tsc,
            } => {
                let d = vmm_ticks(exit_tsc, entry_tsc, end);
                p.open = match p.last_clock {
                    Some((tsc, cpu)) if event.reason == Reason::Interrupted && tsc == exit_tsc => {
                        Some((entry_tsc, cpu, d))
                    }
                    _ => None,
                };
                p.in_vmm += d;
                p.summary.reasons.entry(event.reason).or_default().add(d);
                s.add_exit(&event, d);
            }
            Record::Sample { .. } => p.summary.samples += 1,
            // Notes on the sample before them.
            Record::Task { .. }
            | Record::Exe(_)
            | Record::CallFrames { .. }
            | Record::UserStackTop(_)
            | Record::Mapping(_)
            | Record::CallerMapping(_) => {}
            Record::Clock { tsc, thread_cpu_ns } => {
                p.first_clock.get_or_insert((tsc, thread_cpu_ns));
                if let Some((_, cpu0, d)) = p.open.take().filter(|o| o.0 == tsc) {
                    let on_cpu = thread_cpu_ns.saturating_sub(cpu0) * khz / 1_000_000;
                    p.summary.interrupted_off_cpu += d.saturating_sub(on_cpu);
                }
                p.last_clock = Some((tsc, thread_cpu_ns));
            }
        }
    })?;
    for (p, e) in pass.into_iter().zip(&ends) {
        s.vcpus.push(p.finish(e, start, khz));
    }
    Ok(s)
}

impl Summary {
    fn add_exit(&mut self, event: &ExitEvent, d: u64) {
        self.events.entry(event_key(event)).or_default().add(d);
        let write = event.flags & 1 == 1;
        match event.reason {
            Reason::IoIn | Reason::IoOut => {
                self.ports.entry((event.detail, write)).or_default().add(d)
            }
            Reason::MsrRead | Reason::MsrWrite => {
                self.msrs.entry((event.detail, write)).or_default().add(d)
            }
            Reason::MmioRead | Reason::MmioWrite => {
                self.mmio.entry((event.addr, write)).or_default().add(d)
            }
            _ => {}
        }
    }
}

impl VcpuPass {
    /// The vCPU's time split, once its records are all seen.
    fn finish(self, e: &VcpuEnd, start: u64, khz: u64) -> VcpuSummary {
        let mut vs = self.summary;
        vs.dropped = e.dropped;
        let end = e.end_tsc.max(start);
        let wall = end - start;
        // Before the first KVM_RUN (the first clock record) the thread was setting up: VMM.
        let (run_start, cpu_start) = self.first_clock.unwrap_or((start, e.end_thread_cpu_ns));
        let mut in_vmm = (self.in_vmm + run_start.saturating_sub(start)).min(wall);
        // Preempted time inside exit handling is off-CPU time, not VMM work.
        in_vmm = in_vmm.saturating_sub(vs.interrupted_off_cpu);
        let span = end.saturating_sub(run_start);
        let cpu_ticks = e.end_thread_cpu_ns.saturating_sub(cpu_start) * khz / 1_000_000;
        let in_run = wall - in_vmm;
        let halted = span.saturating_sub(cpu_ticks).min(in_run);
        vs.split = TimeSplit {
            wall,
            in_guest: in_run - halted,
            in_vmm,
            halted,
        };
        vs
    }
}

fn ms(t: &dyn Records, ticks: u64) -> f64 {
    t.header().secs(ticks) * 1e3
}

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 * 100.0 / b as f64
    }
}

fn stats_row(out: &mut String, t: &dyn Records, name: &str, st: &Stats, wall: u64) {
    let _ = writeln!(
        out,
        "  {name:<22} {:>9} {:>11.3} {:>6.2} {:>9} {:>9} {:>9} {:>9}",
        st.count(),
        ms(t, st.total()),
        pct(st.total(), wall),
        st.mean(),
        st.pct(5),
        st.pct(50),
        st.pct(95)
    );
}

fn stats_head(out: &mut String, title: &str) {
    let _ = writeln!(
        out,
        "  {title:<22} {:>9} {:>11} {:>6} {:>9} {:>9} {:>9} {:>9}",
        "count", "total ms", "% run", "mean cyc", "p5 cyc", "p50 cyc", "p95 cyc"
    );
}

fn split_line(t: &dyn Records, sp: &TimeSplit) -> String {
    let h = t.header();
    format!(
        "wall {:.3} s = in guest {:.3} s ({:.1}%) + in VMM {:.3} s ({:.1}%) + halted/off-CPU {:.3} s ({:.1}%)",
        h.secs(sp.wall),
        h.secs(sp.in_guest),
        pct(sp.in_guest, sp.wall),
        h.secs(sp.in_vmm),
        pct(sp.in_vmm, sp.wall),
        h.secs(sp.halted),
        pct(sp.halted, sp.wall)
    )
}

/// The text of `trace summary` (without `--interval`/`--dump`).
pub fn render(t: &dyn Records, s: &Summary, file: &str) -> String {
    let mut out = String::new();
    let h = t.header();
    let exits: u64 = s
        .vcpus
        .iter()
        .flat_map(|v| v.reasons.values())
        .map(Stats::count)
        .sum();
    let samples: u64 = s.vcpus.iter().map(|v| v.samples).sum();
    let dropped: u64 = s.vcpus.iter().map(|v| v.dropped).sum();
    let _ = writeln!(
        out,
        "trace {file}: format v{}, {} vCPU(s), TSC {} kHz, run {:.3} s{}",
        super::format::VERSION,
        h.vcpus,
        h.tsc_khz,
        h.secs(t.end_tsc().saturating_sub(h.start_tsc)),
        if h.kernel.is_empty() {
            String::new()
        } else {
            format!(", kernel {}", h.kernel)
        }
    );
    let _ = writeln!(
        out,
        "records: {exits} exits, {samples} profile samples{}",
        if t.has_exits() {
            ""
        } else {
            " (this file has no exit records: it is a host profile; see `vpmu-vmm report`)"
        }
    );
    if dropped > 0 {
        let _ = writeln!(
            out,
            "WARNING: {dropped} records were DROPPED (the trace writer fell behind); counts and times below are lower bounds"
        );
    } else {
        let _ = writeln!(out, "dropped records: 0");
    }
    let mut all = TimeSplit::default();
    let mut all_reasons: BTreeMap<Reason, Stats> = BTreeMap::new();
    for (i, v) in s.vcpus.iter().enumerate() {
        let _ = writeln!(out, "\nvCPU {i}: {}", split_line(t, &v.split));
        if v.dropped > 0 {
            let _ = writeln!(out, "  ({} records dropped on this vCPU)", v.dropped);
        }
        stats_head(&mut out, "exit reason");
        for (r, st) in &v.reasons {
            stats_row(&mut out, t, r.name(), st, v.split.wall);
            all_reasons.entry(*r).or_default().merge(st);
        }
        all.wall += v.split.wall;
        all.in_guest += v.split.in_guest;
        all.in_vmm += v.split.in_vmm;
        all.halted += v.split.halted;
    }
    if s.vcpus.len() > 1 {
        let _ = writeln!(out, "\nall vCPUs (vCPU-seconds): {}", split_line(t, &all));
        stats_head(&mut out, "exit reason");
        for (r, st) in &all_reasons {
            stats_row(&mut out, t, r.name(), st, all.wall);
        }
    }
    let tables: [(&str, Vec<(String, &Stats)>); 3] = [
        (
            "I/O ports",
            s.ports
                .iter()
                .map(|((p, w), st)| (format!("{p:#06x} {}", if *w { "out" } else { "in" }), st))
                .collect(),
        ),
        (
            "MSRs",
            s.msrs
                .iter()
                .map(|((m, w), st)| (format!("{m:#x} {}", if *w { "wr" } else { "rd" }), st))
                .collect(),
        ),
        (
            "MMIO addresses",
            s.mmio
                .iter()
                .map(|((a, w), st)| (format!("{a:#x} {}", if *w { "wr" } else { "rd" }), st))
                .collect(),
        ),
    ];
    for (title, rows) in tables {
        let _ = writeln!(out, "\n{title} (all vCPUs; % of vCPU-seconds):");
        if rows.is_empty() {
            let _ = writeln!(out, "  (none)");
            continue;
        }
        stats_head(&mut out, "");
        for (name, st) in rows {
            stats_row(&mut out, t, &name, st, all.wall);
        }
    }
    out
}

/// Why `--dump` stopped.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error(transparent)]
    Read(#[from] FormatError),
    #[error(transparent)]
    Write(#[from] std::io::Error),
}

/// How far apart in its vCPU's stream (in records) a record may be written from its place in
/// time and still be dumped in order: the recorder writes an exit's record at the next entry,
/// after the samples (and their notes) taken while the VMM handled that exit, a few records.
const DUMP_WINDOW: usize = 1 << 16;

/// A record with its time (a note's is its sample's) and its place in its vCPU's stream.
struct Timed {
    tsc: u64,
    seq: u64,
    record: Record,
}

impl Timed {
    fn key(&self) -> (u64, u64) {
        (self.tsc, self.seq)
    }
}

impl PartialEq for Timed {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// One vCPU's records in time order: a window of [`DUMP_WINDOW`] records over its stream,
/// earliest out first (ties in written order).
struct TimeOrdered<'a> {
    stream: Box<dyn Iterator<Item = Result<Record, FormatError>> + 'a>,
    window: std::collections::BinaryHeap<std::cmp::Reverse<Timed>>,
    seq: u64,
    /// The time of the last record with one (for the notes after it).
    last_tsc: u64,
    /// The latest time given out, and how many records came out before it (later than their
    /// place: more than the window out of order).
    given: u64,
    late: u64,
}

impl<'a> TimeOrdered<'a> {
    fn new(stream: Box<dyn Iterator<Item = Result<Record, FormatError>> + 'a>) -> Self {
        TimeOrdered {
            stream,
            window: Default::default(),
            seq: 0,
            last_tsc: 0,
            given: 0,
            late: 0,
        }
    }

    fn next(&mut self) -> Result<Option<Timed>, FormatError> {
        while self.window.len() < DUMP_WINDOW {
            let Some(record) = self.stream.next().transpose()? else {
                break;
            };
            if !record.is_sample_note() {
                self.last_tsc = record.tsc();
            }
            self.seq += 1;
            self.window.push(std::cmp::Reverse(Timed {
                tsc: self.last_tsc,
                seq: self.seq,
                record,
            }));
        }
        let Some(std::cmp::Reverse(t)) = self.window.pop() else {
            return Ok(None);
        };
        if t.tsc < self.given {
            self.late += 1;
        }
        self.given = self.given.max(t.tsc);
        Ok(Some(t))
    }
}

/// `--dump`: one line per record, merged across vCPUs in time order (ties: the lower vCPU
/// first, then written order). Streams: the trace is checked by one pass, then each vCPU's
/// records are read in a window of [`DUMP_WINDOW`] records and merged, so memory does not grow
/// with the file; nothing is written for a damaged trace.
pub fn dump(t: &dyn Records, out: &mut dyn std::io::Write) -> Result<(), DumpError> {
    t.for_each(&mut |_, _| {})?;
    let ends = t.vcpu_ends();
    let mut vcpus: Vec<TimeOrdered<'_>> = (0..ends.len())
        .map(|v| TimeOrdered::new(t.vcpu_records(v)))
        .collect();
    // The next record of each vCPU, and their times (earliest first; ties: the lower vCPU).
    let mut next: Vec<Option<Timed>> = Vec::with_capacity(vcpus.len());
    let mut heads = std::collections::BinaryHeap::new();
    for (v, s) in vcpus.iter_mut().enumerate() {
        let r = s.next()?;
        if let Some(r) = &r {
            heads.push(std::cmp::Reverse((r.tsc, v)));
        }
        next.push(r);
    }
    let h = t.header();
    let secs = |tsc: u64| h.secs(tsc.saturating_sub(h.start_tsc));
    writeln!(out, "# time_s vcpu event detail")?;
    while let Some(std::cmp::Reverse((tsc, v))) = heads.pop() {
        let Some(Timed { record, .. }) = next[v].take() else {
            continue;
        };
        next[v] = vcpus[v].next()?;
        if let Some(r) = &next[v] {
            heads.push(std::cmp::Reverse((r.tsc, v)));
        }
        let what = describe(&record, tsc, ends[v].end_tsc, h);
        writeln!(out, "{:.9} vcpu{v} {what}", secs(tsc))?;
    }
    let late: u64 = vcpus.iter().map(|s| s.late).sum();
    if late > 0 {
        writeln!(
            out,
            "# {late} record(s) above were written more than {DUMP_WINDOW} records away from \
             their place in time on their vCPU, and are shown late"
        )?;
    }
    Ok(())
}

/// One record as `--dump` prints it after its time and vCPU. `end_tsc`: the vCPU's end (an
/// exit with no re-entry is charged to it).
fn describe(r: &Record, tsc: u64, end_tsc: u64, h: &super::format::Header) -> String {
    match r {
        Record::Exit {
            event, entry_tsc, ..
        } => format!(
            "exit {} vmm_us={:.2}{}",
            event.describe(),
            h.secs(vmm_ticks(tsc, *entry_tsc, end_tsc)) * 1e6,
            if *entry_tsc == 0 {
                " (no re-entry)"
            } else {
                ""
            }
        ),
        Record::Sample {
            rip, cpl, during, ..
        } => format!(
            "sample rip={rip:#x} cpl={cpl}{}",
            match during {
                Some((e, _)) => format!(" during {}", e.describe()),
                None => String::new(),
            }
        ),
        Record::Clock { thread_cpu_ns, .. } => {
            format!("clock thread_cpu_ms={:.3}", *thread_cpu_ns as f64 / 1e6)
        }
        Record::Task { cr3, task } => format!(
            "task cr3={cr3:#x} {}",
            match task {
                Ok(t) => format!(
                    "pid={} tgid={} comm={:?}{}",
                    t.pid,
                    t.tgid,
                    t.comm(),
                    if t.kernel_thread { " kthread" } else { "" }
                ),
                Err(u) => format!("unresolved ({})", u.describe()),
            }
        ),
        Record::UserStackTop(w) => format!("user stack top {:#x} {:#x}", w[0], w[1]),
        Record::CallFrames { count, addrs } => format!(
            "user frames {}",
            addrs[..usize::from(*count).min(3)]
                .iter()
                .map(|a| format!("{a:#x}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Record::Mapping(m) => format!(
            "mapping {}",
            match m {
                Ok(m) => describe_mapping(m),
                Err(u) => format!("unresolved ({})", u.describe()),
            }
        ),
        Record::CallerMapping(m) => format!("caller mapping {}", describe_mapping(m)),
        Record::Exe(exe) => format!(
            "exe {}",
            match exe {
                Ok(e) => format!(
                    "name={:?}{} start_code={:#x} code_size={:#x}",
                    e.name(),
                    if e.truncated() { " (truncated)" } else { "" },
                    e.start_code,
                    e.code_size
                ),
                Err(u) => format!("unresolved ({})", u.describe()),
            }
        ),
    }
}

/// A mapping record's fields, as `--dump` prints them.
fn describe_mapping(m: &GuestMapping) -> String {
    if m.anonymous() {
        return format!("anonymous vm_start={:#x}", m.vm_start);
    }
    format!(
        "name={:?}{} vm_start={:#x} pgoff={:#x}",
        m.name(),
        if m.truncated() { " (truncated)" } else { "" },
        m.vm_start,
        m.pgoff
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::format::{Header, SampleClock, Trace, VcpuTrace, CONTENTS_EXITS};

    fn out(port: u32, exit: u64, entry: u64) -> Record {
        Record::Exit {
            event: ExitEvent {
                detail: port,
                flags: 1 | (1 << 1),
                ..ExitEvent::new(Reason::IoOut)
            },
            exit_tsc: exit,
            entry_tsc: entry,
        }
    }

    /// 1 MHz TSC: one tick is a microsecond.
    fn trace(records: Vec<Record>, end: u64, cpu_ns: u64) -> Trace {
        Trace {
            header: Header {
                vcpus: 1,
                contents: CONTENTS_EXITS,
                tsc_khz: 1000,
                start_tsc: 0,
                sample_clock: SampleClock::None,
                sample_period_ns: 0,
                kernel: String::new(),
            },
            vcpus: vec![VcpuTrace {
                records,
                dropped: 0,
                end_tsc: end,
                end_thread_cpu_ns: cpu_ns,
            }],
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut st = Stats::default();
        for v in (1..=100).rev() {
            st.add(v);
        }
        assert_eq!((st.pct(5), st.pct(50), st.pct(95)), (5, 50, 95));
        assert_eq!((st.count(), st.total(), st.mean()), (100, 5050, 50));
        let mut one = Stats::default();
        one.add(7);
        assert_eq!((one.pct(5), one.pct(95)), (7, 7));
    }

    #[test]
    fn many_values_keep_their_percentiles_in_bounded_memory() {
        // Past EXACT_VALUES the stats hold a histogram: percentiles within 0.1%.
        let mut st = Stats::default();
        let n = 100_000u64;
        for v in 0..n {
            st.add(1000 + (v * 7919) % n);
        }
        assert!(st.hist.is_some() && st.values.is_empty());
        assert_eq!(st.count(), n);
        assert_eq!(st.total(), (0..n).map(|v| 1000 + v).sum::<u64>());
        for (p, want) in [
            (5u32, 1000 + 5000 - 1),
            (50, 1000 + 50_000 - 1),
            (95, 1000 + 95_000 - 1),
        ] {
            let got = st.pct(p);
            assert!(got.abs_diff(want) * 1000 <= want, "p{p}: {got} vs {want}");
        }
        // Merging exact stats into a histogram, and a histogram into exact stats.
        let mut small = Stats::default();
        small.add(3);
        let mut big = st.clone();
        big.merge(&small);
        assert_eq!(big.count(), n + 1);
        small.merge(&st);
        assert_eq!((small.count(), small.pct(0).min(3)), (n + 1, 3));
        // A hostile duration is counted, clamped, never a panic.
        st.add(u64::MAX);
        assert!(st.pct(100) >= LARGEST_VALUE);
    }

    #[test]
    fn time_split_and_tables() {
        // Clock at 10 (cpu 0); exits 100..110 and 200..230; end at 1000 with 600 us of CPU.
        let recs = vec![
            Record::Clock {
                tsc: 10,
                thread_cpu_ns: 0,
            },
            out(0x2f8, 100, 110),
            out(0x2f8, 200, 230),
        ];
        let t = trace(recs, 1000, 600_000);
        let s = summarize(&t).unwrap();
        let v = &s.vcpus[0];
        let st = &v.reasons[&Reason::IoOut];
        assert_eq!((st.count(), st.total(), st.pct(50)), (2, 40, 10));
        // VMM: 40 us of exits + 10 us before the first KVM_RUN.
        // Halted: span 990 us - 600 us of CPU = 390.
        assert_eq!(
            v.split,
            TimeSplit {
                wall: 1000,
                in_guest: 1000 - 50 - 390,
                in_vmm: 50,
                halted: 390,
            }
        );
        assert_eq!(s.ports[&(0x2f8, true)].count(), 2);
        assert_eq!(s.events["pio 0x2f8 out"].count(), 2);
        let text = render(&t, &s, "f");
        assert!(text.contains("pio-out"), "{text}");
        assert!(text.contains("0x02f8 out"), "{text}");
        assert!(text.contains("dropped records: 0"), "{text}");
    }

    #[test]
    fn preemption_in_interrupted_exits_is_off_cpu_not_vmm() {
        // An interrupted exit 100..300 with clocks on both sides: 50 us of CPU in it.
        let recs = vec![
            Record::Clock {
                tsc: 0,
                thread_cpu_ns: 0,
            },
            Record::Clock {
                tsc: 100,
                thread_cpu_ns: 100_000,
            },
            Record::Exit {
                event: ExitEvent::new(Reason::Interrupted),
                exit_tsc: 100,
                entry_tsc: 300,
            },
            Record::Clock {
                tsc: 300,
                thread_cpu_ns: 150_000,
            },
        ];
        let t = trace(recs, 1000, 850_000);
        let v = &summarize(&t).unwrap().vcpus[0];
        assert_eq!(v.interrupted_off_cpu, 150);
        assert_eq!(v.reasons[&Reason::Interrupted].total(), 200);
        // VMM work 50; off-CPU 1000 - 850 = 150; guest the rest.
        assert_eq!(
            v.split,
            TimeSplit {
                wall: 1000,
                in_guest: 800,
                in_vmm: 50,
                halted: 150,
            }
        );
    }

    #[test]
    fn an_exit_never_re_entered_lasts_to_the_end() {
        let t = trace(vec![out(0x64, 900, 0)], 1000, 1_000_000);
        let s = summarize(&t).unwrap();
        assert_eq!(s.vcpus[0].reasons[&Reason::IoOut].total(), 100);
    }

    #[test]
    fn dump_merges_vcpus_in_time_order() {
        let mut t = trace(vec![out(1, 10, 11), out(1, 30, 31)], 100, 0);
        t.header.vcpus = 2;
        t.vcpus.push(VcpuTrace {
            records: vec![out(2, 20, 21)],
            end_tsc: 100,
            ..Default::default()
        });
        let mut buf = Vec::new();
        dump(&t, &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].contains("vcpu0 exit pio 0x1 out"), "{text}");
        assert!(lines[1].contains("vcpu1 exit pio 0x2 out"), "{text}");
        assert!(lines[2].contains("vcpu0"), "{text}");
    }
}
