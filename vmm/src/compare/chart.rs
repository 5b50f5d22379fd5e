//! The comparison as a horizontal bar chart (`compare --svg`): per row its share of the samples
//! in each accounting mode and the ratio of the two, on a labelled percent axis. Drawn with
//! the one SVG writer (`analysis::svg`).

use analysis::svg::Svg;

use super::table::{Comparison, Row, CHART_TOP};

/// Height of one mode's bar; a row holds both and a gap.
const BAR: usize = 14;
const ROW: usize = 2 * BAR + 10;
/// Monospace advance at 12 px.
const CHAR: f64 = 7.3;
/// Characters of a label; longer names are cut, the full one in <title>.
const MAX_LABEL: usize = 64;
/// Width of the plot area.
const PLOT: f64 = 480.0;
/// Where the rows start (below the header and legend).
const TOP: usize = 130;
const CPU_COLOR: &str = "#4e79a7";
const DOMAIN_COLOR: &str = "#e15759";

/// Where things go, from the rows and their labels.
struct Layout {
    plot_x: f64,
    ratio_x: f64,
    width: f64,
    height: f64,
    /// Percent at the right end of the plot, and between grid lines.
    axis_max: f64,
    step: f64,
    top: f64,
    bottom: f64,
}

impl Layout {
    fn new(rows: &[Row], labels: &[String]) -> Layout {
        let longest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(8);
        let label_w = ((longest as f64 * CHAR) as usize + 20).max(120);
        let plot_x = (10 + label_w) as f64;
        let ratio_x = plot_x + PLOT + 64.0;
        let max = rows
            .iter()
            .map(|r| r.cpu_percent.max(r.domain_percent))
            .fold(0.0, f64::max);
        let step = [1.0, 2.0, 5.0, 10.0, 20.0, 25.0, 50.0]
            .into_iter()
            .find(|s| max / s <= 6.0)
            .unwrap_or(50.0);
        Layout {
            plot_x,
            ratio_x,
            width: ((ratio_x + 90.0) as usize) as f64,
            height: (TOP + rows.len() * ROW + 44) as f64,
            axis_max: ((max / step).ceil() * step).clamp(step, 100.0),
            step,
            top: TOP as f64,
            bottom: (TOP + rows.len() * ROW) as f64,
        }
    }

    fn x_of(&self, pct: f64) -> f64 {
        self.plot_x + PLOT * pct / self.axis_max
    }
}

/// The chart of `c`'s [`Comparison::chart_rows`]`(CHART_TOP)`.
pub(super) fn svg(c: &Comparison) -> String {
    let rows = c.chart_rows(CHART_TOP);
    let labels: Vec<String> = rows.iter().map(|r| label(&r.function)).collect();
    let mut layout = Layout::new(&rows, &labels);
    let header = header_lines(c, rows.len());
    // Widest header line, at about 9 px (15 px bold) and 6.8 px (12 px) per character.
    let header_w = (header[0].chars().count() as f64 * 9.0)
        .max(header[1].chars().count() as f64 * 6.8)
        .max(header[2].chars().count() as f64 * 6.8);
    layout.width = layout.width.max(((header_w + 30.0) as usize) as f64);
    let mut s = Svg::new(
        layout.width,
        layout.height,
        r#"font-family="sans-serif" font-size="12""#,
    );
    draw_header(&mut s, c, &header);
    draw_axis(&mut s, &layout);
    for (i, (r, label)) in rows.iter().zip(&labels).enumerate() {
        let other = i + 1 == rows.len() && !c.rows.iter().any(|x| x.function == r.function);
        draw_row(&mut s, &layout, i, r, label, c.is_total(r), other);
    }
    s.line(
        (layout.plot_x, layout.top - 6.0),
        (layout.plot_x, layout.bottom),
        r##"stroke="#444""##,
    );
    s.finish()
}

/// A function's name as its row shows it (cut to MAX_LABEL characters).
fn label(function: &str) -> String {
    if function.chars().count() > MAX_LABEL {
        let cut: String = function.chars().take(MAX_LABEL - 1).collect();
        format!("{cut}\u{2026}")
    } else {
        function.to_string()
    }
}

/// Title, which rows are charted, and how they are sorted.
fn header_lines(c: &Comparison, shown: usize) -> [String; 3] {
    let title = format!(
        "{}: share of samples per function, cpu-switch vs domain-switch accounting",
        c.workload
    );
    let selection = if shown < c.rows.len() {
        format!(
            "{} of {} rows charted: {}the {CHART_TOP} largest in either mode; the other {} summed in one row (all rows are in the CSV)",
            shown - 1,
            c.rows.len(),
            if c.total_rows.is_empty() { "" } else { "the path total, " },
            c.rows.len() + 1 - shown,
        )
    } else {
        format!("all {} rows", c.rows.len())
    };
    let order = "sorted by the percentage points domain-switch adds; dom/cpu = domain-switch share / cpu-switch share";
    [title, selection, order.to_string()]
}

fn draw_header(s: &mut Svg, c: &Comparison, header: &[String; 3]) {
    s.text(
        10.0,
        22.0,
        r#"font-size="15" font-weight="bold""#,
        &header[0],
    );
    s.text(10.0, 42.0, r##"fill="#444""##, &header[1]);
    s.text(10.0, 58.0, r##"fill="#444""##, &header[2]);
    let legend = [
        (
            CPU_COLOR,
            format!(
                "cpu-switch: only guest execution counts ({} samples)",
                c.cpu_total
            ),
        ),
        (
            DOMAIN_COLOR,
            format!(
                "domain-switch: the VMM's work for the guest counts too ({} samples)",
                c.domain_total
            ),
        ),
    ];
    for (i, (color, text)) in legend.iter().enumerate() {
        let y = (70 + 18 * i) as f64;
        s.rect(10.0, y, 12.0, 12.0, &format!(r#"fill="{color}""#));
        s.text(27.0, y + 10.0, "", text);
    }
}

/// The percent axis on top, grid lines through the plot, the axis' and ratio column's names.
fn draw_axis(s: &mut Svg, l: &Layout) {
    let mut t = 0.0;
    while t <= l.axis_max + 1e-9 {
        let x = l.x_of(t);
        s.line((x, l.top - 6.0), (x, l.bottom), r##"stroke="#ddd""##);
        s.text(
            x,
            l.top - 10.0,
            r##"text-anchor="middle" fill="#444""##,
            &format!("{t}%"),
        );
        t += l.step;
    }
    s.text(
        l.plot_x + PLOT / 2.0,
        l.bottom + 30.0,
        r##"text-anchor="middle" fill="#444""##,
        "share of the mode's samples",
    );
    s.text(l.ratio_x, l.top - 10.0, r#"font-weight="bold""#, "dom/cpu");
}

/// Row `i`: its label, a bar per mode with its percentage, the ratio; a total row is bold and
/// underlined, the "other functions" row italic.
fn draw_row(s: &mut Svg, l: &Layout, i: usize, r: &Row, label: &str, total: bool, other: bool) {
    let y = (TOP + i * ROW + 4) as f64;
    let weight = if total {
        r#"font-weight="bold""#
    } else if other {
        r#"font-style="italic""#
    } else {
        ""
    };
    s.titled_text(
        l.plot_x - 8.0,
        y + (BAR + 4) as f64,
        &format!(r#"text-anchor="end" font-family="monospace" {weight}"#),
        Some(&r.function),
        label,
    );
    for (j, (pct, color)) in [(r.cpu_percent, CPU_COLOR), (r.domain_percent, DOMAIN_COLOR)]
        .into_iter()
        .enumerate()
    {
        let len = l.x_of(pct) - l.plot_x;
        let by = y + (j * BAR) as f64;
        s.rect(
            l.plot_x,
            by,
            len,
            (BAR - 2) as f64,
            &format!(r#"fill="{color}""#),
        );
        s.text(
            l.plot_x + len + 4.0,
            by + (BAR - 3) as f64,
            r#"font-size="11""#,
            &format!("{pct:.1}%"),
        );
    }
    let ratio = match r.ratio() {
        x if x.is_infinite() => "new".to_string(),
        x => format!("{x:.2}x"),
    };
    s.text(l.ratio_x, y + (BAR + 4) as f64, weight, &ratio);
    if total {
        let ly = y + (ROW - 6) as f64;
        s.line(
            (10.0, ly),
            (l.ratio_x + 60.0, ly),
            r##"stroke="#999" stroke-dasharray="4 3""##,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::table::tests::{many_rows, packet_rx};
    use crate::compare::table::Profile;

    #[test]
    fn the_chart_carries_every_row_of_a_short_table() {
        let c = packet_rx();
        let out = svg(&c);
        assert!(out.starts_with("<svg") && out.trim_end().ends_with("</svg>"));
        // Background, two legend boxes, two bars per row.
        assert_eq!(out.matches("<rect").count(), 3 + 2 * c.rows.len());
        assert!(out.contains("all 5 rows"), "{out}");
        assert!(out.contains("13.33x") && out.contains(">new<"), "{out}");
        let empty = Comparison::new("w", &Profile::default(), &Profile::default());
        assert!(svg(&empty).trim_end().ends_with("</svg>"));
    }

    #[test]
    fn chart_height_does_not_grow_with_the_number_of_functions() {
        let small = svg(&many_rows(0));
        let huge = svg(&many_rows(20_000));
        let height = |svg: &str| -> usize {
            let h = svg.split("height=\"").nth(1).unwrap();
            h[..h.find('"').unwrap()].parse().unwrap()
        };
        assert_eq!(height(&small), height(&huge));
        assert!(height(&huge) < 1200, "{}", height(&huge));
        assert_eq!(huge.matches("<rect").count(), 3 + 2 * (1 + CHART_TOP + 1));
        assert!(huge.contains("other 20013 functions"), "{huge}");
        assert!(huge.contains("21 of 20034 rows charted"), "{huge}");
    }

    #[test]
    fn chart_cuts_long_names_but_keeps_them_whole_in_a_title() {
        let long = format!("[vmm] {}", "x".repeat(200));
        let p = Profile::from_pairs([(long.as_str(), 2), ("f", 1)]);
        let out = svg(&Comparison::new("w", &p, &p));
        assert!(out.contains(&format!("<title>{long}</title>")));
        assert!(out.contains(&format!("{}\u{2026}</text>", &long[..63])));
    }

    #[test]
    fn awkward_names_are_escaped() {
        let p = Profile::from_pairs([("[vmm] pio 0x510 out, delay", 3), ("<lambda>", 1)]);
        assert!(svg(&Comparison::new("w", &p, &p)).contains("&lt;lambda&gt;"));
    }
}
