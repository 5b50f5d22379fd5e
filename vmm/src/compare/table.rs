//! The side-by-side comparison of two profiles of one workload — cpu-switch and domain-switch —
//! as the published CPU-switch vs domain-switch tables show it: per function, samples and share
//! in each mode and the ratio of the shares, sorted by what domain-switch adds. Rendered as a
//! text table, CSV, and an SVG bar chart. Pure: built from recorded profiles, tested without KVM.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Samples per function (symbol, or a pseudo-symbol such as `[vmm] pio 0x510 out`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profile {
    pub samples: BTreeMap<String, u64>,
}

impl Profile {
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, u64)>) -> Self {
        let mut p = Profile::default();
        for (name, n) in pairs {
            *p.samples.entry(name.to_string()).or_default() += n;
        }
        p
    }

    pub fn total(&self) -> u64 {
        self.samples.values().sum()
    }

    /// Share of the samples in `name`, in percent (0 for an empty profile).
    pub fn percent(&self, name: &str) -> f64 {
        let t = self.total();
        if t == 0 {
            return 0.0;
        }
        100.0 * *self.samples.get(name).unwrap_or(&0) as f64 / t as f64
    }

    /// The function with the most samples (ties: the first by name).
    pub fn top(&self) -> Option<(&str, u64)> {
        self.samples
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(k, v)| (k.as_str(), *v))
    }
}

/// One function in both modes.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub function: String,
    pub cpu_samples: u64,
    pub cpu_percent: f64,
    pub domain_samples: u64,
    pub domain_percent: f64,
}

impl Row {
    /// domain-switch share / cpu-switch share (infinite when cpu-switch saw none).
    pub fn ratio(&self) -> f64 {
        if self.cpu_percent == 0.0 {
            if self.domain_percent == 0.0 {
                return 1.0;
            }
            return f64::INFINITY;
        }
        self.domain_percent / self.cpu_percent
    }

    /// Percentage points domain-switch adds (the sort key).
    pub fn gain(&self) -> f64 {
        self.domain_percent - self.cpu_percent
    }
}

/// Both profiles of one workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub workload: String,
    pub cpu_total: u64,
    pub domain_total: u64,
    pub rows: Vec<Row>,
}

impl Comparison {
    /// Rows sorted by gain (largest first), then by domain-switch samples, then by name: the
    /// same profiles always give the same order.
    pub fn new(workload: &str, cpu: &Profile, domain: &Profile) -> Self {
        let names: std::collections::BTreeSet<&String> =
            cpu.samples.keys().chain(domain.samples.keys()).collect();
        let mut rows: Vec<Row> = names
            .into_iter()
            .map(|n| Row {
                function: n.clone(),
                cpu_samples: *cpu.samples.get(n).unwrap_or(&0),
                cpu_percent: cpu.percent(n),
                domain_samples: *domain.samples.get(n).unwrap_or(&0),
                domain_percent: domain.percent(n),
            })
            .collect();
        rows.sort_by(|a, b| {
            b.gain()
                .total_cmp(&a.gain())
                .then(b.domain_samples.cmp(&a.domain_samples))
                .then(a.function.cmp(&b.function))
        });
        Comparison {
            workload: workload.to_string(),
            cpu_total: cpu.total(),
            domain_total: domain.total(),
            rows,
        }
    }

    pub fn row(&self, function: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.function == function)
    }

    /// The text table.
    pub fn to_table(&self) -> String {
        let w = self
            .rows
            .iter()
            .map(|r| r.function.len())
            .max()
            .unwrap_or(8)
            .max(8);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "workload {}: {} samples in cpu-switch, {} in domain-switch",
            self.workload, self.cpu_total, self.domain_total
        );
        let _ = writeln!(
            s,
            "{:<w$}  {:>10} {:>7}  {:>10} {:>7}  {:>8}",
            "function", "cpu-sw", "%", "domain-sw", "%", "dom/cpu"
        );
        for r in &self.rows {
            let ratio = r.ratio();
            let ratio = if ratio.is_infinite() {
                "new".to_string()
            } else {
                format!("{ratio:.2}x")
            };
            let _ = writeln!(
                s,
                "{:<w$}  {:>10} {:>6.2}%  {:>10} {:>6.2}%  {:>8}",
                r.function, r.cpu_samples, r.cpu_percent, r.domain_samples, r.domain_percent, ratio
            );
        }
        s
    }

    /// The text table, at most `top` rows (0 = all).
    pub fn to_table_top(&self, top: usize) -> String {
        if top == 0 || self.rows.len() <= top {
            return self.to_table();
        }
        let mut c = self.clone();
        c.rows.truncate(top);
        let mut t = c.to_table();
        t.push_str(&format!(
            "({} more rows in the CSV)\n",
            self.rows.len() - top
        ));
        t
    }

    /// CSV with a header row; ratio empty when cpu-switch saw no samples of the function.
    pub fn to_csv(&self) -> String {
        let mut s = String::from(
            "workload,function,cpu_switch_samples,cpu_switch_percent,domain_switch_samples,domain_switch_percent,ratio_domain_cpu\n",
        );
        for r in &self.rows {
            let ratio = r.ratio();
            let ratio = if ratio.is_finite() {
                format!("{ratio:.4}")
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "{},{},{},{:.4},{},{:.4},{}",
                csv_field(&self.workload),
                csv_field(&r.function),
                r.cpu_samples,
                r.cpu_percent,
                r.domain_samples,
                r.domain_percent,
                ratio
            );
        }
        s
    }

    /// A horizontal bar chart: per function, its share in each mode.
    pub fn to_svg(&self) -> String {
        const BAR: usize = 14;
        const LABEL: usize = 260;
        const PLOT: f64 = 420.0;
        let rows = self.rows.len();
        let height = 60 + rows * (2 * BAR + 12) + 30;
        let width = LABEL + PLOT as usize + 80;
        let max = self
            .rows
            .iter()
            .map(|r| r.cpu_percent.max(r.domain_percent))
            .fold(1.0, f64::max);
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            s,
            r#"<text x="10" y="20" font-size="14">{}: share of samples per function, cpu-switch vs domain-switch</text>"#,
            xml(&self.workload)
        );
        let _ = writeln!(
            s,
            r##"<rect x="10" y="32" width="12" height="12" fill="#4e79a7"/><text x="26" y="42">cpu-switch ({} samples)</text><rect x="220" y="32" width="12" height="12" fill="#e15759"/><text x="236" y="42">domain-switch ({} samples)</text>"##,
            self.cpu_total, self.domain_total
        );
        for (i, r) in self.rows.iter().enumerate() {
            let y = 60 + i * (2 * BAR + 12);
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                LABEL - 8,
                y + BAR + 4,
                xml(&r.function)
            );
            for (j, (pct, color)) in [(r.cpu_percent, "#4e79a7"), (r.domain_percent, "#e15759")]
                .into_iter()
                .enumerate()
            {
                let len = PLOT * pct / max;
                let by = y + j * BAR;
                let _ = writeln!(
                    s,
                    r#"<rect x="{LABEL}" y="{by}" width="{len:.1}" height="{}" fill="{color}"/><text x="{:.1}" y="{}">{pct:.1}%</text>"#,
                    BAR - 2,
                    LABEL as f64 + len + 4.0,
                    by + BAR - 3
                );
            }
        }
        s.push_str("</svg>\n");
        s
    }
}

/// Reads back the rows of a CSV written by [`Comparison::to_csv`] (for scripts and tests that
/// check a comparison run): quoted fields as RFC 4180 writes them.
pub fn csv_rows(text: &str) -> Result<Vec<Row>, String> {
    let mut lines = text.lines();
    match lines.next() {
        Some(h) if h.starts_with("workload,function,") => {}
        _ => return Err("not a comparison CSV (no header row)".into()),
    }
    lines
        .enumerate()
        .map(|(i, l)| {
            let f = csv_split(l);
            let bad = |what: &str| format!("CSV line {}: {what}: {l}", i + 2);
            if f.len() != 7 {
                return Err(bad("expected 7 fields"));
            }
            let num = |k: usize| f[k].parse::<f64>().map_err(|_| bad("not a number"));
            Ok(Row {
                function: f[1].clone(),
                cpu_samples: f[2].parse().map_err(|_| bad("not a count"))?,
                cpu_percent: num(3)?,
                domain_samples: f[4].parse().map_err(|_| bad("not a count"))?,
                domain_percent: num(5)?,
            })
        })
        .collect()
}

/// One CSV line's fields: commas inside double quotes do not split, `""` is a quote.
fn csv_split(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                out.last_mut().expect("one field").push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(String::new()),
            (c, _) => out.last_mut().expect("one field").push(c),
        }
    }
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_reads_back_what_it_wrote_commas_and_quotes_included() {
        let cpu = Profile::from_pairs([("[guest user space, CPL 3]", 70), ("say \"hi\"", 30)]);
        let dom = Profile::from_pairs([("[guest user space, CPL 3]", 40), ("say \"hi\"", 60)]);
        let c = Comparison::new("w", &cpu, &dom);
        let rows = csv_rows(&c.to_csv()).unwrap();
        assert_eq!(rows.len(), 2);
        for (a, b) in rows.iter().zip(&c.rows) {
            assert_eq!(a.function, b.function);
            assert_eq!(
                (a.cpu_samples, a.domain_samples),
                (b.cpu_samples, b.domain_samples)
            );
            assert!((a.domain_percent - b.domain_percent).abs() < 1e-3);
        }
        assert!(csv_rows("x,y\n").is_err());
        assert!(csv_rows("workload,function,a\nw,f,1\n").is_err());
    }

    fn packet_rx() -> Comparison {
        // Shaped like the published packet-receive table: the NIC functions go from tens of
        // samples to thousands once the VMM's work is charged.
        let cpu = Profile::from_pairs([
            ("csum_partial", 400),
            ("e1000_intr", 30),
            ("e1000_clean_rx_irq", 20),
            ("default_idle", 550),
        ]);
        let dom = Profile::from_pairs([
            ("csum_partial", 420),
            ("e1000_intr", 2400),
            ("e1000_clean_rx_irq", 1600),
            ("default_idle", 580),
            ("e1000_xmit_frame", 1000),
        ]);
        Comparison::new("packet-rx", &cpu, &dom)
    }

    #[test]
    fn rows_are_sorted_by_gain_with_shares_and_ratios() {
        let c = packet_rx();
        let order: Vec<&str> = c.rows.iter().map(|r| r.function.as_str()).collect();
        assert_eq!(
            order,
            [
                "e1000_intr",
                "e1000_clean_rx_irq",
                "e1000_xmit_frame",
                "csum_partial",
                "default_idle"
            ]
        );
        let intr = c.row("e1000_intr").unwrap();
        assert_eq!((intr.cpu_samples, intr.domain_samples), (30, 2400));
        assert!((intr.cpu_percent - 3.0).abs() < 1e-9);
        assert!((intr.domain_percent - 40.0).abs() < 1e-9);
        assert!((intr.ratio() - 40.0 / 3.0).abs() < 1e-9);
        assert!(c.row("e1000_xmit_frame").unwrap().ratio().is_infinite());
        assert_eq!((c.cpu_total, c.domain_total), (1000, 6000));
    }

    #[test]
    fn same_profiles_same_output() {
        assert_eq!(packet_rx().to_table(), packet_rx().to_table());
        assert_eq!(packet_rx().to_csv(), packet_rx().to_csv());
    }

    #[test]
    fn table_csv_and_svg_carry_every_row() {
        let c = packet_rx();
        let t = c.to_table();
        assert!(t.contains("e1000_intr"), "{t}");
        assert!(t.contains("13.33x"), "{t}");
        assert!(t.contains("new"), "{t}");
        let csv = c.to_csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 1 + c.rows.len());
        assert_eq!(
            lines[1],
            "packet-rx,e1000_intr,30,3.0000,2400,40.0000,13.3333"
        );
        assert!(lines.iter().any(
            |l| l.starts_with("packet-rx,e1000_xmit_frame,0,0.0000,1000,") && l.ends_with(',')
        ));
        let svg = c.to_svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<rect").count(), 2 + 2 * c.rows.len());
    }

    #[test]
    fn awkward_names_are_quoted() {
        let p = Profile::from_pairs([("[vmm] pio 0x510 out, delay", 3), ("<lambda>", 1)]);
        let c = Comparison::new("w", &p, &p);
        assert!(c.to_csv().contains("\"[vmm] pio 0x510 out, delay\""));
        assert!(c.to_svg().contains("&lt;lambda&gt;"));
        assert_eq!(c.row("<lambda>").unwrap().ratio(), 1.0);
    }

    #[test]
    fn empty_profiles_do_not_divide_by_zero() {
        let c = Comparison::new("w", &Profile::default(), &Profile::default());
        assert!(c.rows.is_empty());
        assert!(c.to_table().contains("0 samples"));
    }
}
