//! SVG charts drawn by hand: no script, no fonts to load, every label escaped. Each chart
//! is a standalone `<svg>` element, so the same text goes into the HTML report and, through
//! a headless browser, into a PNG.

use std::fmt::Write as _;

/// Colours for series, in order (colour-blind-safe: Okabe and Ito).
pub const PALETTE: [&str; 8] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
];
/// Errors, in every chart.
pub const ERROR_COLOUR: &str = "#D7191C";

/// Escapes text for HTML and SVG, in content and in quoted attributes.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// A value axis: linear or log10.
#[derive(Clone, Copy, Debug)]
pub struct Axis {
    /// Smallest value shown.
    pub min: f64,
    /// Largest value shown.
    pub max: f64,
    /// Logarithmic.
    pub log: bool,
}

impl Axis {
    /// An axis covering `values` (with a little room), log if asked and possible.
    pub fn covering(values: impl Iterator<Item = f64>, log: bool) -> Self {
        let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
            min = min.min(v);
            max = max.max(v);
        }
        if !min.is_finite() {
            (min, max) = (if log { 0.001 } else { 0.0 }, 1.0);
        }
        if log {
            Axis {
                min: 10f64.powf(min.log10().floor()),
                max: 10f64.powf(max.log10().ceil().max(min.log10().floor() + 1.0)),
                log: true,
            }
        } else {
            let low = min.min(0.0);
            let top = if max > low { max } else { low + 1.0 };
            // A round step, and the top at the first step past the largest value.
            let step = nice_ceiling((top - low) / 5.0);
            Axis {
                min: low,
                max: (top / step).ceil() * step,
                log: false,
            }
        }
    }

    /// Where `v` falls, from 0 (min) to 1 (max).
    pub fn fraction(&self, v: f64) -> f64 {
        let f = if self.log {
            (v.max(self.min).log10() - self.min.log10()) / (self.max.log10() - self.min.log10())
        } else {
            (v - self.min) / (self.max - self.min)
        };
        f.clamp(0.0, 1.0)
    }

    /// Tick values.
    pub fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (lo, hi) = (
                self.min.log10().round() as i32,
                self.max.log10().round() as i32,
            );
            (lo..=hi).map(|e| 10f64.powi(e)).collect()
        } else {
            let step = nice_ceiling((self.max - self.min) / 5.0);
            let mut t = (self.min / step).ceil() * step;
            let mut out = Vec::new();
            while t <= self.max + step * 1e-9 {
                out.push(t);
                t += step;
            }
            out
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `x`.
fn nice_ceiling(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|v| *v >= x * (1.0 - 1e-9))
        .unwrap_or(10.0 * p)
}

/// A number for an axis label: `0.5`, `20`, `1.5k`.
pub fn short(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{}k", trim(v / 1000.0))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-0" {
        "0".to_owned()
    } else {
        s.to_owned()
    }
}

/// A plotting area with axes, into which marks are drawn.
pub struct Plot {
    width: f64,
    height: f64,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    /// The x axis.
    pub x: Axis,
    /// The y axis.
    pub y: Axis,
    body: String,
}

impl Plot {
    /// A `width` x `height` chart with these axes.
    pub fn new(width: f64, height: f64, x: Axis, y: Axis) -> Self {
        Self {
            width,
            height,
            left: 58.0,
            right: 28.0,
            top: 26.0,
            bottom: 38.0,
            x,
            y,
            body: String::new(),
        }
    }

    /// Pixel x of a value.
    pub fn px(&self, v: f64) -> f64 {
        self.left + self.x.fraction(v) * (self.width - self.left - self.right)
    }

    /// Pixel y of a value.
    pub fn py(&self, v: f64) -> f64 {
        self.height - self.bottom - self.y.fraction(v) * (self.height - self.top - self.bottom)
    }

    /// Grid, ticks and axis titles; `x_label` formats x tick values.
    pub fn axes(&mut self, x_title: &str, y_title: &str, x_label: &dyn Fn(f64) -> String) {
        let (l, r) = (self.left, self.width - self.right);
        let (t, b) = (self.top, self.height - self.bottom);
        let mut s = String::new();
        // Without a y title the y values mean nothing to read (rows of bars): no labels.
        for v in self.y.ticks().into_iter().filter(|_| !y_title.is_empty()) {
            let y = self.py(v);
            let _ = write!(
                s,
                r##"<line x1="{l:.1}" y1="{y:.1}" x2="{r:.1}" y2="{y:.1}" stroke="#e3e3e3"/><text x="{:.1}" y="{:.1}" text-anchor="end" class="tick">{}</text>"##,
                l - 6.0,
                y + 4.0,
                esc(&short(v))
            );
        }
        for v in self.x.ticks() {
            let x = self.px(v);
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" y1="{t:.1}" x2="{x:.1}" y2="{b:.1}" stroke="#f0f0f0"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" class="tick">{}</text>"##,
                b + 15.0,
                esc(&x_label(v))
            );
        }
        let _ = write!(
            s,
            r##"<rect x="{l:.1}" y="{t:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#999"/><text x="{:.1}" y="{:.1}" text-anchor="middle" class="axis">{}</text><text x="14" y="{:.1}" text-anchor="middle" transform="rotate(-90 14 {:.1})" class="axis">{}</text>"##,
            r - l,
            b - t,
            (l + r) / 2.0,
            self.height - 6.0,
            esc(x_title),
            (t + b) / 2.0,
            (t + b) / 2.0,
            esc(y_title)
        );
        self.body.insert_str(0, &s);
    }

    /// Dots.
    pub fn dots(&mut self, points: &[(f64, f64)], colour: &str, radius: f64, opacity: f64) {
        if points.is_empty() {
            return;
        }
        let _ = write!(
            self.body,
            r#"<g fill="{}" fill-opacity="{opacity}">"#,
            esc(colour)
        );
        for (x, y) in points {
            let _ = write!(
                self.body,
                r#"<circle cx="{:.1}" cy="{:.1}" r="{radius}"/>"#,
                self.px(*x),
                self.py(*y)
            );
        }
        self.body.push_str("</g>");
    }

    /// A line through points (in order).
    pub fn line(&mut self, points: &[(f64, f64)], colour: &str, width: f64, dashed: bool) {
        if points.len() < 2 {
            return self.dots(points, colour, width + 1.0, 1.0);
        }
        let d: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", self.px(*x), self.py(*y)))
            .collect();
        let _ = write!(
            self.body,
            r#"<polyline fill="none" stroke="{}" stroke-width="{width}"{} points="{}"/>"#,
            esc(colour),
            if dashed {
                r#" stroke-dasharray="5 3""#
            } else {
                ""
            },
            d.join(" ")
        );
    }

    /// A labelled vertical line at x (an event).
    pub fn marker(&mut self, x: f64, label: &str, row: usize) {
        let px = self.px(x);
        let (t, b) = (self.top, self.height - self.bottom);
        let _ = write!(
            self.body,
            r##"<line x1="{px:.1}" y1="{t:.1}" x2="{px:.1}" y2="{b:.1}" stroke="#444" stroke-dasharray="3 3"/><text x="{:.1}" y="{:.1}" class="event">{}</text>"##,
            px + 3.0,
            t + 11.0 + 11.0 * (row % 3) as f64,
            esc(label)
        );
    }

    /// A filled rectangle between two data corners.
    pub fn rect(&mut self, x0: f64, y0: f64, x1: f64, y1: f64, colour: &str, title: &str) {
        let (a, b) = (self.px(x0), self.px(x1));
        let (c, d) = (self.py(y0), self.py(y1));
        let _ = write!(
            self.body,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
            a.min(b),
            c.min(d),
            (b - a).abs().max(0.5),
            (d - c).abs().max(0.5),
            esc(colour),
            esc(title)
        );
    }

    /// Raw SVG drawn over the plot (already escaped).
    pub fn raw(&mut self, svg: &str) {
        self.body.push_str(svg);
    }

    /// A legend row at the top right.
    pub fn legend(&mut self, entries: &[(String, String)]) {
        let mut x = self.left + 6.0;
        for (label, colour) in entries {
            let _ = write!(
                self.body,
                r#"<rect x="{x:.1}" y="8" width="10" height="10" fill="{}"/><text x="{:.1}" y="17" class="legend">{}</text>"#,
                esc(colour),
                x + 14.0,
                esc(label)
            );
            x += 24.0 + 6.5 * label.chars().count() as f64;
        }
    }

    /// The finished `<svg>` element, with `title` for screen readers.
    pub fn finish(self, title: &str) -> String {
        document(self.width, self.height, title, &self.body)
    }
}

/// A standalone `<svg>` element of `width` x `height` around `body` (already escaped
/// markup), with `title` for screen readers and the classes every chart uses.
pub fn document(width: f64, height: f64, title: &str, body: &str) -> String {
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0} {height:.0}" width="{width:.0}" height="{height:.0}" role="img" font-family="sans-serif" font-size="11"><title>{t}</title><style>.tick{{fill:#555;font-size:10px}}.axis{{fill:#222;font-size:11px}}.event{{fill:#222;font-size:10px}}.legend{{fill:#222;font-size:11px}}.link{{fill:#0072b2;font-size:10px}}</style><rect width="100%" height="100%" fill="#fff"/>{body}</svg>"##,
        t = esc(title),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_text_cannot_close_an_element_or_start_one() {
        let e = esc("</title><script>alert(1)</script>\"' onload=x &amp;");
        assert!(!e.contains('<') && !e.contains('>') && !e.contains('"') && !e.contains('\''));
        assert!(e.contains("&lt;/title&gt;&lt;script&gt;") && e.contains("&amp;amp;"));
    }

    #[test]
    fn axes_cover_their_values_with_round_ends() {
        let a = Axis::covering([0.3, 7.0, 42.0].into_iter(), true);
        assert_eq!((a.min, a.max), (0.1, 100.0));
        assert_eq!(a.ticks(), [0.1, 1.0, 10.0, 100.0]);
        assert!((a.fraction(1.0) - 1.0 / 3.0).abs() < 1e-9);
        let l = Axis::covering([3.0, 17.0].into_iter(), false);
        assert_eq!((l.min, l.max), (0.0, 20.0));
        let l = Axis::covering([0.2, 5.9].into_iter(), false);
        assert_eq!((l.min, l.max), (0.0, 6.0));
        assert_eq!(short(1500.0), "1.5k");
        assert_eq!(short(0.25), "0.25");
    }
}
