//! The one SVG writer of the project's charts (`trace summary --svg`, `compare`'s chart): a
//! document of text, rectangles, lines and polylines on a white page, every piece of text
//! escaped by [`xml`]. The charts decide the layout; this module writes the elements. (No
//! plotting crate: the two charts are a bar chart with per-row labels, ratios and tooltips, and
//! two panels of time series with a side legend; the elements are a few lines each.)
//!
//! `attrs` arguments are attribute text the chart's code writes (`fill="#444"`), never data;
//! text and titles, which may come from the guest (function and process names), always go
//! through [`xml`].

use std::fmt::Write as _;

/// An SVG document being written.
pub struct Svg {
    out: String,
}

impl Svg {
    /// A `width` x `height` page with a white background; `attrs` go on the `<svg>` element
    /// (fonts).
    pub fn new(width: f64, height: f64, attrs: &str) -> Svg {
        let (w, h) = (num(width), num(height));
        let mut out = format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" {attrs}>"#
        );
        out.push('\n');
        let _ = writeln!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        Svg { out }
    }

    /// `text` at (`x`, `y`).
    pub fn text(&mut self, x: f64, y: f64, attrs: &str, text: &str) {
        self.titled_text(x, y, attrs, None, text);
    }

    /// `text` at (`x`, `y`), with a tooltip (`<title>`) when `title` is given.
    pub fn titled_text(&mut self, x: f64, y: f64, attrs: &str, title: Option<&str>, text: &str) {
        let title = title.map_or(String::new(), |t| format!("<title>{}</title>", xml(t)));
        let _ = writeln!(
            self.out,
            r#"<text x="{}" y="{}"{}>{title}{}</text>"#,
            num(x),
            num(y),
            sep(attrs),
            xml(text)
        );
    }

    pub fn rect(&mut self, x: f64, y: f64, width: f64, height: f64, attrs: &str) {
        let _ = writeln!(
            self.out,
            r#"<rect x="{}" y="{}" width="{}" height="{}"{}/>"#,
            num(x),
            num(y),
            num(width),
            num(height),
            sep(attrs)
        );
    }

    pub fn line(&mut self, (x1, y1): (f64, f64), (x2, y2): (f64, f64), attrs: &str) {
        let _ = writeln!(
            self.out,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}"{}/>"#,
            num(x1),
            num(y1),
            num(x2),
            num(y2),
            sep(attrs)
        );
    }

    pub(crate) fn polyline(&mut self, points: impl IntoIterator<Item = (f64, f64)>, attrs: &str) {
        let points: Vec<String> = points
            .into_iter()
            .map(|(x, y)| format!("{},{}", num(x), num(y)))
            .collect();
        let _ = writeln!(
            self.out,
            r#"<polyline fill="none" points="{}"{}/>"#,
            points.join(" "),
            sep(attrs)
        );
    }

    /// The document, closed.
    pub fn finish(mut self) -> String {
        self.out.push_str("</svg>\n");
        self.out
    }
}

/// A coordinate as SVG text: whole numbers without decimals, others to 0.1.
fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v:.1}")
    }
}

fn sep(attrs: &str) -> String {
    match attrs.trim() {
        "" => String::new(),
        a => format!(" {a}"),
    }
}

/// `s` as XML text or attribute value.
pub fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            // XML 1.0 allows no control characters, not even as references: a name the guest
            // chose shows them as text escapes, as `guest_task::printable` does.
            c if c.is_control() => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_markup_and_control_characters() {
        assert_eq!(
            xml("a<b>&\"c\"\u{1b}\n"),
            "a&lt;b&gt;&amp;&quot;c&quot;\\u{1b}\\u{a}"
        );
        assert_eq!(xml(r#"a "b" & <c>"#), "a &quot;b&quot; &amp; &lt;c&gt;");
    }

    #[test]
    fn elements_escape_their_text_and_keep_the_chart_attributes() {
        let mut s = Svg::new(100.0, 50.5, r#"font-size="12""#);
        s.titled_text(1.0, 2.25, r##"fill="#444""##, Some("<full>"), "a<b");
        s.rect(0.0, 0.0, 3.0, 4.0, "");
        s.line((0.0, 1.0), (2.0, 3.0), r##"stroke="#ddd""##);
        s.polyline([(0.0, 0.0), (1.5, 2.0)], r#"stroke="red""#);
        let doc = s.finish();
        assert!(doc.starts_with(r#"<svg xmlns="http://www.w3.org/2000/svg" width="100" height="50.5" viewBox="0 0 100 50.5" font-size="12">"#), "{doc}");
        assert!(
            doc.contains(
                r##"<text x="1" y="2.2" fill="#444"><title>&lt;full&gt;</title>a&lt;b</text>"##
            ),
            "{doc}"
        );
        assert!(
            doc.contains(r#"<rect x="0" y="0" width="3" height="4"/>"#),
            "{doc}"
        );
        assert!(
            doc.contains(r##"<line x1="0" y1="1" x2="2" y2="3" stroke="#ddd"/>"##),
            "{doc}"
        );
        assert!(
            doc.contains(r#"<polyline fill="none" points="0,0 1.5,2" stroke="red"/>"#),
            "{doc}"
        );
        assert!(doc.ends_with("</svg>\n"));
    }
}
