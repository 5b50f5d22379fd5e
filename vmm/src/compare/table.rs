//! The side-by-side comparison of two profiles of one workload — cpu-switch and domain-switch —
//! as the published CPU-switch vs domain-switch tables show it: per function, samples and share
//! in each mode and the ratio of the shares, sorted by what domain-switch adds. Rendered as a
//! text table, CSV, and an SVG bar chart. Pure: built from recorded profiles, tested without KVM.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use analysis::guest_task::printable;

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

/// How many functions the chart shows besides the total rows (the rest is summed in one row).
pub const CHART_TOP: usize = 20;

/// Both profiles of one workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub workload: String,
    pub cpu_total: u64,
    pub domain_total: u64,
    pub rows: Vec<Row>,
    /// Names of rows that sum other rows ([`insert_total`](Self::insert_total)).
    pub total_rows: Vec<String>,
    /// The run's parameters (`key`, value), in order: `# key=value` lines at the top of the CSV
    /// and the `params` object of the JSON document ([`set_params`](Self::set_params)).
    pub params: Vec<(String, serde_json::Value)>,
}

impl Comparison {
    /// Rows sorted by gain (largest first), then by domain-switch samples, then by name: the
    /// same profiles always give the same order.
    pub fn new(workload: &str, cpu: &Profile, domain: &Profile) -> Self {
        let names: std::collections::BTreeSet<&String> =
            cpu.samples.keys().chain(domain.samples.keys()).collect();
        // Totals once, not per function (Profile::percent sums the profile).
        let (cpu_total, domain_total) = (cpu.total(), domain.total());
        let pct = |n: u64, t: u64| {
            if t == 0 {
                0.0
            } else {
                100.0 * n as f64 / t as f64
            }
        };
        let mut rows: Vec<Row> = names
            .into_iter()
            .map(|n| {
                let (c, d) = (
                    *cpu.samples.get(n).unwrap_or(&0),
                    *domain.samples.get(n).unwrap_or(&0),
                );
                Row {
                    function: n.clone(),
                    cpu_samples: c,
                    cpu_percent: pct(c, cpu_total),
                    domain_samples: d,
                    domain_percent: pct(d, domain_total),
                }
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
            cpu_total,
            domain_total,
            rows,
            total_rows: Vec::new(),
            params: Vec::new(),
        }
    }

    /// Sets the run's parameters (replacing any). Keys are `[a-z0-9_]` words; values are
    /// strings, numbers or booleans (written as they are after `key=` in the CSV).
    pub fn set_params(&mut self, params: Vec<(String, serde_json::Value)>) {
        self.params = params;
    }

    pub fn row(&self, function: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.function == function)
    }

    /// The text table.
    pub fn to_table(&self) -> String {
        let w = self
            .rows
            .iter()
            .map(|r| printable(&r.function).chars().count())
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
                printable(&r.function),
                r.cpu_samples,
                r.cpu_percent,
                r.domain_samples,
                r.domain_percent,
                ratio
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

    /// CSV: `# key=value` lines with the run's parameters, a header row, one row per function
    /// (`kind` = `symbol`) or sum of functions (`kind` = `total`); ratio empty when cpu-switch saw
    /// no samples of the function. [`csv_rows`] reads it back.
    pub fn to_csv(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.params {
            let v = match v {
                serde_json::Value::String(t) => t.clone(),
                other => other.to_string(),
            };
            // One line per parameter, whatever the value holds.
            let _ = writeln!(s, "# {k}={}", v.replace(['\n', '\r'], " "));
        }
        s.push_str(CSV_HEADER);
        s.push('\n');
        for r in &self.rows {
            let ratio = r.ratio();
            let ratio = if ratio.is_finite() {
                format!("{ratio:.4}")
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "{},{},{},{},{:.4},{},{:.4},{}",
                csv_field(&self.workload),
                csv_field(&r.function),
                self.kind(r),
                r.cpu_samples,
                r.cpu_percent,
                r.domain_samples,
                r.domain_percent,
                ratio
            );
        }
        s
    }

    /// Adds `row`, a sum over other rows (e.g. a code path's total), at the top. The chart
    /// always shows it and does not count its samples again in its "other" row.
    pub fn insert_total(&mut self, row: Row) {
        self.total_rows.push(row.function.clone());
        self.rows.insert(0, row);
    }

    pub(super) fn is_total(&self, r: &Row) -> bool {
        self.total_rows.contains(&r.function)
    }

    /// `total` for a row that sums other rows, `symbol` for a function (or pseudo-symbol).
    pub fn kind(&self, r: &Row) -> &'static str {
        if self.is_total(r) {
            "total"
        } else {
            "symbol"
        }
    }

    /// One comparison as an object of the `vpmu-compare/1` document (docs/accounting-modes.md,
    /// "Results a script can read"): name, per-mode totals and every row in table order;
    /// `ratio_domain_cpu` is null when cpu-switch saw no samples of the row.
    /// The comparison as `vpmu-compare/1` writes it (JSON by derive: [`ComparisonDoc`]).
    pub fn doc(&self) -> ComparisonDoc {
        ComparisonDoc {
            name: self.workload.clone(),
            cpu_switch_samples: self.cpu_total,
            domain_switch_samples: self.domain_total,
            rows: self
                .rows
                .iter()
                .map(|r| RowDoc {
                    function: r.function.clone(),
                    kind: self.kind(r),
                    cpu_switch_samples: r.cpu_samples,
                    cpu_switch_percent: r.cpu_percent,
                    domain_switch_samples: r.domain_samples,
                    domain_switch_percent: r.domain_percent,
                    ratio_domain_cpu: Some(r.ratio()).filter(|x| x.is_finite()),
                })
                .collect(),
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self.doc()).expect("plain values")
    }

    /// The rows the chart shows, in table order: the total rows, the `top` functions with the
    /// largest share in either mode, and one `other N functions` row summing the rest (N >= 2:
    /// a single leftover function is shown as itself). Every row stays in the CSV.
    pub fn chart_rows(&self, top: usize) -> Vec<Row> {
        let mut by_share: Vec<&Row> = self.rows.iter().filter(|r| !self.is_total(r)).collect();
        by_share.sort_by(|a, b| {
            let share = |r: &Row| r.cpu_percent.max(r.domain_percent);
            share(b)
                .total_cmp(&share(a))
                .then(a.function.cmp(&b.function))
        });
        let top = if by_share.len() <= top + 1 {
            by_share.len()
        } else {
            top
        };
        let kept: std::collections::BTreeSet<&str> = by_share
            .iter()
            .take(top)
            .map(|r| r.function.as_str())
            .collect();
        let mut out: Vec<Row> = self
            .rows
            .iter()
            .filter(|r| self.is_total(r) || kept.contains(r.function.as_str()))
            .cloned()
            .collect();
        let rest: Vec<&Row> = by_share.iter().skip(top).copied().collect();
        if !rest.is_empty() {
            let pct = |n: u64, t: u64| {
                if t == 0 {
                    0.0
                } else {
                    100.0 * n as f64 / t as f64
                }
            };
            let cpu: u64 = rest.iter().map(|r| r.cpu_samples).sum();
            let dom: u64 = rest.iter().map(|r| r.domain_samples).sum();
            out.push(Row {
                function: format!("other {} functions", rest.len()),
                cpu_samples: cpu,
                cpu_percent: pct(cpu, self.cpu_total),
                domain_samples: dom,
                domain_percent: pct(dom, self.domain_total),
            });
        }
        out
    }
}

/// One comparison in the JSON document.
#[derive(Debug, serde::Serialize)]
pub struct ComparisonDoc {
    pub name: String,
    pub cpu_switch_samples: u64,
    pub domain_switch_samples: u64,
    pub rows: Vec<RowDoc>,
}

/// One row of a comparison in the JSON document.
#[derive(Debug, serde::Serialize)]
pub struct RowDoc {
    pub function: String,
    /// `symbol` or `total`.
    pub kind: &'static str,
    pub cpu_switch_samples: u64,
    pub cpu_switch_percent: f64,
    pub domain_switch_samples: u64,
    pub domain_switch_percent: f64,
    /// None where cpu-switch has no sample of the row.
    pub ratio_domain_cpu: Option<f64>,
}

/// The CSV's header row (after the `# key=value` lines).
pub const CSV_HEADER: &str = "workload,function,kind,cpu_switch_samples,cpu_switch_percent,domain_switch_samples,domain_switch_percent,ratio_domain_cpu";

/// A comparison CSV read back: the `# key=value` parameters, and each row with its `kind`.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvComparison {
    pub params: Vec<(String, String)>,
    /// (row, kind): `symbol` or `total`.
    pub rows: Vec<(Row, String)>,
}

/// Why a text is not a comparison CSV.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CsvError {
    #[error("not a comparison CSV (no header row)")]
    NoHeader,
    /// `line` (1-based) and its text.
    #[error("CSV line {line}: {what}: {text}")]
    Line {
        line: usize,
        what: &'static str,
        text: String,
    },
}

/// Reads back a CSV written by [`Comparison::to_csv`] (for scripts and tests that check a
/// comparison run): `# key=value` lines before the header, quoted fields as RFC 4180 writes
/// them. Also reads the layout before the `kind` column (7 fields, no parameters).
pub fn csv_read(text: &str) -> Result<CsvComparison, CsvError> {
    let mut params = Vec::new();
    let mut lines = text.lines().enumerate();
    let with_kind = loop {
        match lines.next() {
            Some((_, l)) if l.starts_with('#') => {
                let l = l.trim_start_matches('#').trim_start();
                if let Some((k, v)) = l.split_once('=') {
                    params.push((k.to_string(), v.to_string()));
                }
            }
            Some((_, h)) if h.starts_with("workload,function,kind,") => break true,
            Some((_, h)) if h.starts_with("workload,function,") => break false,
            _ => return Err(CsvError::NoHeader),
        }
    };
    let n = if with_kind { 8 } else { 7 };
    let rows = lines
        .map(|(i, l)| {
            let f = csv_split(l);
            let bad = |what| CsvError::Line {
                line: i + 1,
                what,
                text: l.to_string(),
            };
            if f.len() != n {
                return Err(bad(if with_kind {
                    "expected 8 fields"
                } else {
                    "expected 7 fields"
                }));
            }
            let (kind, k) = if with_kind {
                (f[2].clone(), 3)
            } else {
                ("symbol".to_string(), 2)
            };
            if kind != "symbol" && kind != "total" {
                return Err(bad("kind is neither symbol nor total"));
            }
            let num = |j: usize| f[j].parse::<f64>().map_err(|_| bad("not a number"));
            let count = |j: usize| f[j].parse::<u64>().map_err(|_| bad("not a count"));
            let row = Row {
                function: f[1].clone(),
                cpu_samples: count(k)?,
                cpu_percent: num(k + 1)?,
                domain_samples: count(k + 2)?,
                domain_percent: num(k + 3)?,
            };
            Ok((row, kind))
        })
        .collect::<Result<Vec<_>, CsvError>>()?;
    Ok(CsvComparison { params, rows })
}

/// The rows of a CSV written by [`Comparison::to_csv`] (total rows included), without their
/// kinds or the parameters: [`csv_read`].
pub fn csv_rows(text: &str) -> Result<Vec<Row>, CsvError> {
    Ok(csv_read(text)?.rows.into_iter().map(|(r, _)| r).collect())
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

#[cfg(test)]
pub(super) mod tests {
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

    #[test]
    fn csv_carries_parameters_and_marks_total_rows() {
        let mut c = many_rows(3);
        c.set_params(vec![
            ("workload".into(), "packet-rx".into()),
            ("rounds".into(), 3.into()),
            ("host_quirks".into(), true.into()),
            ("kernel".into(), "/a b,c\nd".into()),
        ]);
        let csv = c.to_csv();
        assert!(csv.starts_with("# workload=packet-rx\n# rounds=3\n# host_quirks=true\n# kernel=/a b,c d\nworkload,function,kind,"), "{csv}");
        let back = csv_read(&csv).unwrap();
        assert_eq!(
            back.params,
            [
                ("workload".to_string(), "packet-rx".to_string()),
                ("rounds".into(), "3".into()),
                ("host_quirks".into(), "true".into()),
                ("kernel".into(), "/a b,c d".into()),
            ]
        );
        assert_eq!(back.rows.len(), c.rows.len());
        let totals: Vec<&str> = back
            .rows
            .iter()
            .filter(|(_, k)| k == "total")
            .map(|(r, _)| r.function.as_str())
            .collect();
        assert_eq!(totals, ["[virtio path: total]"]);
        // The layout before the kind column still reads.
        let old = "workload,function,cpu_switch_samples,cpu_switch_percent,domain_switch_samples,domain_switch_percent,ratio_domain_cpu\nw,f,1,50.0000,2,100.0000,2.0000\n";
        let r = csv_read(old).unwrap();
        assert_eq!(r.rows[0].0.domain_samples, 2);
        assert_eq!(r.rows[0].1, "symbol");
        assert!(csv_read("workload,function,kind,a,b,c,d,e\nw,f,sum,1,1,1,1,\n").is_err());
    }

    #[test]
    fn json_rows_match_the_csv_rows() {
        let c = many_rows(2);
        let j: serde_json::Value = serde_json::from_str(&c.to_json().to_string()).unwrap();
        assert_eq!(j["name"], "packet-rx");
        assert_eq!(j["cpu_switch_samples"], c.cpu_total);
        assert_eq!(j["domain_switch_samples"], c.domain_total);
        let rows = j["rows"].as_array().unwrap();
        let csv = csv_read(&c.to_csv()).unwrap();
        assert_eq!(rows.len(), csv.rows.len());
        for (jr, (cr, kind)) in rows.iter().zip(&csv.rows) {
            assert_eq!(jr["function"], cr.function.as_str());
            assert_eq!(jr["kind"], kind.as_str());
            assert_eq!(jr["cpu_switch_samples"], cr.cpu_samples);
            assert_eq!(jr["domain_switch_samples"], cr.domain_samples);
            let pct = jr["domain_switch_percent"].as_f64().unwrap();
            assert!((pct - cr.domain_percent).abs() < 1e-4, "{jr}");
        }
        assert_eq!(rows[0]["kind"], "total");
        // A function cpu-switch never saw has no finite ratio: null, as the CSV's empty field.
        let p = packet_rx().to_json();
        let xmit = p["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["function"] == "e1000_xmit_frame")
            .unwrap();
        assert!(xmit["ratio_domain_cpu"].is_null());
    }

    pub(in crate::compare) fn packet_rx() -> Comparison {
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
    fn table_and_csv_carry_every_row() {
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
            "packet-rx,e1000_intr,symbol,30,3.0000,2400,40.0000,13.3333"
        );
        assert!(lines.iter().any(|l| l
            .starts_with("packet-rx,e1000_xmit_frame,symbol,0,0.0000,1000,")
            && l.ends_with(',')));
    }

    /// A packet-rx-shaped comparison: a path total over `n` virtio functions, a few big
    /// functions whose share moves between the modes, and a long tail of one-sample functions.
    pub(in crate::compare) fn many_rows(tail: usize) -> Comparison {
        let mut cpu = vec![
            ("default_idle".to_string(), 5000),
            ("vp_notify".to_string(), 40),
            ("virtnet_poll".to_string(), 30),
        ];
        let mut dom = vec![
            ("default_idle".to_string(), 3000),
            ("vp_notify".to_string(), 2500),
            ("virtnet_poll".to_string(), 200),
        ];
        for i in 0..30 {
            cpu.push((format!("mid_{i:02}"), 100 - i));
            dom.push((format!("mid_{i:02}"), 100 - i));
        }
        for i in 0..tail {
            cpu.push((format!("tail_{i:05}"), 1));
            dom.push((format!("tail_{i:05}"), (i % 2) as u64));
        }
        let p =
            |v: &Vec<(String, u64)>| Profile::from_pairs(v.iter().map(|(k, n)| (k.as_str(), *n)));
        let (cpu, dom) = (p(&cpu), p(&dom));
        let mut c = Comparison::new("packet-rx", &cpu, &dom);
        let path = |p: &Profile| {
            p.samples.get("vp_notify").unwrap() + p.samples.get("virtnet_poll").unwrap()
        };
        let pct = |n: u64, p: &Profile| 100.0 * n as f64 / p.total() as f64;
        c.insert_total(Row {
            function: "[virtio path: total]".into(),
            cpu_samples: path(&cpu),
            cpu_percent: pct(path(&cpu), &cpu),
            domain_samples: path(&dom),
            domain_percent: pct(path(&dom), &dom),
        });
        c
    }

    #[test]
    fn chart_keeps_the_total_and_the_largest_functions_and_sums_the_rest() {
        let c = many_rows(500);
        let rows = c.chart_rows(CHART_TOP);
        assert_eq!(rows.len(), 1 + CHART_TOP + 1);
        assert_eq!(rows[0].function, "[virtio path: total]");
        let names: Vec<&str> = rows.iter().map(|r| r.function.as_str()).collect();
        // Large in cpu-switch only, in domain-switch only, and in both: all kept.
        for f in [
            "default_idle",
            "vp_notify",
            "virtnet_poll",
            "mid_00",
            "mid_16",
        ] {
            assert!(names.contains(&f), "{f} missing: {names:?}");
        }
        assert!(!names.contains(&"mid_17") && !names.iter().any(|n| n.starts_with("tail_")));
        // Table order (by gain) is kept for the charted functions.
        let order: Vec<&str> = c
            .rows
            .iter()
            .map(|r| r.function.as_str())
            .filter(|n| names.contains(n))
            .collect();
        assert_eq!(order, names[..names.len() - 1]);
        // The other row sums exactly the functions not shown (the total row not counted again).
        let other = rows.last().unwrap();
        assert_eq!(other.function, format!("other {} functions", 13 + 500));
        let shown = |f: fn(&Row) -> u64| rows[1..rows.len() - 1].iter().map(f).sum::<u64>();
        assert_eq!(other.cpu_samples, c.cpu_total - shown(|r| r.cpu_samples));
        assert_eq!(
            other.domain_samples,
            c.domain_total - shown(|r| r.domain_samples)
        );
        let pct_sum: f64 = rows[1..].iter().map(|r| r.cpu_percent).sum();
        assert!((pct_sum - 100.0).abs() < 1e-6, "{pct_sum}");
        // Every row stays in the CSV and the text table.
        assert_eq!(c.to_csv().lines().count(), 1 + c.rows.len());
        assert_eq!(c.to_table().lines().count(), 2 + c.rows.len());
    }

    #[test]
    fn chart_of_few_rows_shows_them_all_and_never_sums_a_single_function() {
        let c = packet_rx();
        assert_eq!(c.chart_rows(CHART_TOP), c.rows);
        assert_eq!(c.chart_rows(3).len(), 4);
        assert_eq!(c.chart_rows(3)[3].function, "other 2 functions");
        // One function left over is charted as itself, not as "other 1 functions".
        assert_eq!(c.chart_rows(4), c.rows);
        let empty = Comparison::new("w", &Profile::default(), &Profile::default());
        assert!(empty.chart_rows(CHART_TOP).is_empty());
    }

    #[test]
    fn names_the_guest_chose_cannot_rewrite_the_terminal_or_split_a_row() {
        let hostile = "evil\x1b[2J\nfake_row 1 2";
        let cpu = Profile::from_pairs([(hostile, 3), ("ok", 1)]);
        let c = Comparison::new("w", &cpu, &cpu);
        let t = c.to_table();
        assert!(!t.contains('\x1b'), "{t:?}");
        assert_eq!(
            t.lines().count(),
            2 + 2,
            "a header, a title and one line per row: {t:?}"
        );
        assert!(t.contains("evil\\u{1b}[2J\\u{a}fake_row 1 2"), "{t:?}");
    }

    #[test]
    fn awkward_names_are_quoted() {
        let p = Profile::from_pairs([("[vmm] pio 0x510 out, delay", 3), ("<lambda>", 1)]);
        let c = Comparison::new("w", &p, &p);
        assert!(c.to_csv().contains("\"[vmm] pio 0x510 out, delay\""));
        assert_eq!(c.row("<lambda>").unwrap().ratio(), 1.0);
    }

    #[test]
    fn empty_profiles_do_not_divide_by_zero() {
        let c = Comparison::new("w", &Profile::default(), &Profile::default());
        assert!(c.rows.is_empty());
        assert!(c.to_table().contains("0 samples"));
    }
}
