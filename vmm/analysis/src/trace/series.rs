//! `trace summary --interval SECS`: a time series (CSV) of exit rates, samples and the
//! in-guest / in-VMM / halted split per interval, summed over vCPUs, and `--svg FILE`, a
//! hand-written SVG chart of it.

use std::fmt::Write as _;

use super::format::{FormatError, Reason, Record};
use super::read::Records;
use super::summary::vmm_ticks;
use crate::svg::Svg;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Interval {
    pub start_s: f64,
    pub pio: u64,
    pub mmio: u64,
    pub msr: u64,
    pub interrupted: u64,
    pub other: u64,
    pub samples: u64,
    /// vCPU-ticks in each state (summed over vCPUs).
    pub vmm: f64,
    pub halted: f64,
    pub span: f64,
}

impl Interval {
    pub fn exits(&self) -> u64 {
        self.pio + self.mmio + self.msr + self.interrupted + self.other
    }
    fn pct(&self, v: f64) -> f64 {
        if self.span <= 0.0 {
            0.0
        } else {
            (v * 100.0 / self.span).clamp(0.0, 100.0)
        }
    }
    pub(crate) fn vmm_pct(&self) -> f64 {
        self.pct(self.vmm)
    }
    pub(crate) fn halted_pct(&self) -> f64 {
        self.pct(self.halted)
    }
    pub(crate) fn guest_pct(&self) -> f64 {
        (100.0 - self.vmm_pct() - self.halted_pct()).max(0.0)
    }
}

/// Adds `rate` per tick over [a, b) to the buckets it overlaps.
fn spread(v: &mut [f64], start: u64, width: u64, a: u64, b: u64, rate: f64) {
    if b <= a || v.is_empty() {
        return;
    }
    let first = (a.saturating_sub(start) / width) as usize;
    let last = ((b - 1).saturating_sub(start) / width) as usize;
    for (i, slot) in v.iter_mut().enumerate().take(last + 1).skip(first) {
        let lo = start + i as u64 * width;
        let hi = lo + width;
        let overlap = b.min(hi).saturating_sub(a.max(lo));
        *slot += overlap as f64 * rate;
    }
}

/// How many `secs`-second buckets the trace's run needs.
pub(crate) fn interval_count(t: &dyn Records, secs: f64) -> u64 {
    let h = t.header();
    let width = ((secs * f64::from(h.tsc_khz) * 1e3) as u64).max(1);
    let start = h.start_tsc;
    (t.end_tsc().max(start + 1) - start).div_ceil(width)
}

/// Buckets of `secs` seconds from the trace's start (the caller bounds
/// [`interval_count`]), in one pass over the records.
pub fn intervals(t: &dyn Records, secs: f64) -> Result<Vec<Interval>, FormatError> {
    let h = t.header();
    let width = ((secs * f64::from(h.tsc_khz) * 1e3) as u64).max(1);
    let start = h.start_tsc;
    let n = interval_count(t, secs) as usize;
    let mut out: Vec<Interval> = (0..n)
        .map(|i| Interval {
            start_s: i as f64 * secs,
            ..Default::default()
        })
        .collect();
    let mut vmm = vec![0.0; n];
    let mut busy = vec![0.0; n];
    let mut span = vec![0.0; n];
    let khz = f64::from(h.tsc_khz);
    let bucket = |tsc: u64| ((tsc.saturating_sub(start) / width) as usize).min(n - 1);
    let ends = t.vcpu_ends();
    for e in &ends {
        spread(&mut span, start, width, start, e.end_tsc.max(start), 1.0);
    }
    // Per vCPU: the last clock record (TSC, CPU ns), and an interrupted exit bracketed by
    // clock records (exit, entry, CPU ns at the exit).
    type State = (Option<(u64, u64)>, Option<(u64, u64, u64)>);
    let mut state: Vec<State> = vec![(None, None); ends.len()];
    t.for_each(&mut |v, r| {
        let vend = ends[v].end_tsc.max(start);
        let (clock, open) = &mut state[v];
        match *r {
            Record::Exit {
                event,
                exit_tsc,
                entry_tsc,
            } => {
                let b = &mut out[bucket(exit_tsc)];
                match event.reason {
                    Reason::IoIn | Reason::IoOut => b.pio += 1,
                    Reason::MmioRead | Reason::MmioWrite => b.mmio += 1,
                    Reason::MsrRead | Reason::MsrWrite => b.msr += 1,
                    Reason::Interrupted => b.interrupted += 1,
                    _ => b.other += 1,
                }
                let d = vmm_ticks(exit_tsc, entry_tsc, vend);
                match *clock {
                    // As in the summary: its off-CPU part is not VMM work (see below).
                    Some((t, c)) if event.reason == Reason::Interrupted && t == exit_tsc => {
                        *open = Some((exit_tsc, entry_tsc, c));
                    }
                    _ => spread(&mut vmm, start, width, exit_tsc, exit_tsc + d, 1.0),
                }
            }
            Record::Sample { tsc, .. } => out[bucket(tsc)].samples += 1,
            // Notes on the sample before them.
            Record::Task { .. }
            | Record::Exe(_)
            | Record::CallFrames { .. }
            | Record::UserStackTop(_)
            | Record::Mapping(_)
            | Record::CallerMapping(_) => {}
            Record::Clock { tsc, thread_cpu_ns } => {
                if let Some((x, e, c)) = open.take() {
                    if e == tsc && tsc > x {
                        let on = (thread_cpu_ns.saturating_sub(c) as f64 * khz / 1e6)
                            .min((tsc - x) as f64);
                        spread(&mut vmm, start, width, x, tsc, on / (tsc - x) as f64);
                    }
                }
                match *clock {
                    // CPU time between two clock records, spread evenly over that time.
                    Some((t0, c0)) if tsc > t0 => {
                        let ticks = thread_cpu_ns.saturating_sub(c0) as f64 * khz / 1e6;
                        spread(&mut busy, start, width, t0, tsc, ticks / (tsc - t0) as f64);
                    }
                    // Before the first clock record the thread was setting up (busy).
                    None => spread(&mut busy, start, width, start, tsc, 1.0),
                    _ => {}
                }
                *clock = Some((tsc, thread_cpu_ns));
            }
        }
    })?;
    for (e, (clock, _)) in ends.iter().zip(state) {
        let vend = e.end_tsc.max(start);
        if let Some((t0, c0)) = clock.filter(|(t0, _)| vend > *t0) {
            let ticks = e.end_thread_cpu_ns.saturating_sub(c0) as f64 * khz / 1e6;
            spread(
                &mut busy,
                start,
                width,
                t0,
                vend,
                ticks / (vend - t0) as f64,
            );
        }
        if clock.is_none() {
            // No clock records (a profile-only file): no halted time can be told.
            spread(&mut busy, start, width, start, vend, 1.0);
        }
    }
    for (i, iv) in out.iter_mut().enumerate() {
        iv.vmm = vmm[i];
        iv.span = span[i];
        iv.halted = (span[i] - busy[i]).max(0.0).min(span[i] - vmm[i]).max(0.0);
    }
    Ok(out)
}

pub fn csv(iv: &[Interval], secs: f64) -> String {
    let mut s = String::from(
        "start_s,exits_per_s,pio_per_s,mmio_per_s,msr_per_s,interrupted_per_s,other_per_s,samples,guest_pct,vmm_pct,halted_pct\n",
    );
    for i in iv {
        let r = |n: u64| n as f64 / secs;
        let _ = writeln!(
            s,
            "{:.3},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{},{:.2},{:.2},{:.2}",
            i.start_s,
            r(i.exits()),
            r(i.pio),
            r(i.mmio),
            r(i.msr),
            r(i.interrupted),
            r(i.other),
            i.samples,
            i.guest_pct(),
            i.vmm_pct(),
            i.halted_pct()
        );
    }
    s
}

/// One chart panel: top y, axis label, y maximum, lines (name, colour, values).
type Panel<'a> = (f64, &'a str, f64, Vec<(&'a str, &'a str, Vec<f64>)>);

/// Two panels: the time split (% of vCPU time) and exits per second.
pub fn svg(iv: &[Interval], secs: f64, title: &str) -> String {
    let (w, ph, left, top, gap) = (900.0, 220.0, 70.0, 40.0, 70.0);
    let plot_w = w - left - 160.0;
    let total_s = (iv.len() as f64 * secs).max(secs);
    let x = |t: f64| left + t / total_s * plot_w;
    let max_rate = iv
        .iter()
        .map(|i| i.exits() as f64 / secs)
        .fold(1.0, f64::max);
    let height = top + 2.0 * ph + gap + 50.0;
    let mut s = Svg::new(w, height, r#"font-family="sans-serif" font-size="12""#);
    s.text(left, 20.0, r#"font-size="14""#, title);
    let panels: [Panel; 2] = [
        (
            top,
            "% of vCPU time",
            100.0,
            vec![
                (
                    "in guest",
                    "#2a7",
                    iv.iter().map(Interval::guest_pct).collect(),
                ),
                ("in VMM", "#d33", iv.iter().map(Interval::vmm_pct).collect()),
                (
                    "halted/off-CPU",
                    "#888",
                    iv.iter().map(Interval::halted_pct).collect(),
                ),
            ],
        ),
        (
            top + ph + gap,
            "exits / s",
            max_rate,
            vec![
                (
                    "all exits",
                    "#000",
                    iv.iter().map(|i| i.exits() as f64 / secs).collect(),
                ),
                (
                    "pio",
                    "#36c",
                    iv.iter().map(|i| i.pio as f64 / secs).collect(),
                ),
                (
                    "msr",
                    "#c6c",
                    iv.iter().map(|i| i.msr as f64 / secs).collect(),
                ),
                (
                    "interrupted",
                    "#e90",
                    iv.iter().map(|i| i.interrupted as f64 / secs).collect(),
                ),
            ],
        ),
    ];
    for (y0, label, max, lines) in panels {
        let y = |v: f64| y0 + ph - v / max * ph;
        s.rect(left, y0, plot_w, ph, r##"fill="none" stroke="#444""##);
        let mid = y0 + ph / 2.0;
        s.text(
            10.0,
            mid,
            &format!(r#"transform="rotate(-90 10 {mid})" text-anchor="middle""#),
            label,
        );
        for k in 0..=4 {
            let v = max * f64::from(k) / 4.0;
            let tick = if max >= 100.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            };
            s.text(left - 4.0, y(v) + 4.0, r#"text-anchor="end""#, &tick);
        }
        for (n, (name, color, vals)) in lines.iter().enumerate() {
            let points = vals
                .iter()
                .enumerate()
                .map(|(i, v)| (x((i as f64 + 0.5) * secs), y(*v)));
            s.polyline(points, &format!(r#"stroke="{color}" stroke-width="1.5""#));
            let ly = y0 + 14.0 + 16.0 * n as f64;
            s.line(
                (left + plot_w + 10.0, ly),
                (left + plot_w + 30.0, ly),
                &format!(r#"stroke="{color}" stroke-width="3""#),
            );
            s.text(left + plot_w + 35.0, ly + 4.0, "", name);
        }
        s.text(
            left + plot_w / 2.0,
            y0 + ph + 30.0,
            r#"text-anchor="middle""#,
            "time (s)",
        );
        s.text(left, y0 + ph + 15.0, "", "0");
        s.text(
            left + plot_w,
            y0 + ph + 15.0,
            r#"text-anchor="end""#,
            &format!("{total_s:.1}"),
        );
    }
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::format::{ExitEvent, Header, SampleClock, Trace, VcpuTrace, CONTENTS_EXITS};

    #[test]
    fn spread_splits_across_buckets() {
        let mut v = vec![0.0; 3];
        spread(&mut v, 100, 10, 105, 125, 1.0);
        assert_eq!(v, vec![5.0, 10.0, 5.0]);
    }

    #[test]
    fn intervals_count_exits_and_split_time() {
        // 1 MHz TSC, two 1 ms buckets. Exits at 100 (10 us) and 1500 (500 us, spans into..
        // the same bucket). The thread ran 1000 us of its 2000.
        let exit = |at: u64, len: u64| Record::Exit {
            event: ExitEvent::new(Reason::IoOut),
            exit_tsc: at,
            entry_tsc: at + len,
        };
        let t = Trace {
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
                records: vec![
                    Record::Clock {
                        tsc: 0,
                        thread_cpu_ns: 0,
                    },
                    exit(100, 10),
                    exit(1500, 400),
                ],
                dropped: 0,
                end_tsc: 2000,
                end_thread_cpu_ns: 1_000_000,
            }],
        };
        let iv = intervals(&t, 0.001).unwrap();
        assert_eq!(iv.len(), 2);
        assert_eq!((iv[0].pio, iv[1].pio), (1, 1));
        assert_eq!((iv[0].vmm, iv[1].vmm), (10.0, 400.0));
        assert_eq!((iv[0].halted, iv[1].halted), (500.0, 500.0));
        let c = csv(&iv, 0.001);
        assert_eq!(c.lines().count(), 3);
        assert!(
            c.lines().nth(2).unwrap().starts_with("0.001,1000.0,1000.0"),
            "{c}"
        );
        let g = svg(&iv, 0.001, "t<1>");
        assert!(g.starts_with("<svg") && g.trim_end().ends_with("</svg>"));
        assert!(g.contains("t&lt;1&gt;"));
    }
}
