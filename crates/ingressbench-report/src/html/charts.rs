//! The report's charts, each an SVG built from the results: latency over time with the
//! events and errors, the proxy's CPU, the percentile spectrum, bars per target, phases
//! and a sweep over a matrix value. Not the tables ([`super::sections`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ingressbench_results::impact::ImpactEntry;
use ingressbench_stats::HistogramUs;

use super::{first_cell, settings_title, MAX_POINTS};
use crate::analysis::{self, Condition};
use crate::results::{CellResults, RunResults, SampleRow};
use crate::svg::{esc, short, Axis, Plot, ERROR_COLOUR, PALETTE};

/// Latency over time for one cell.
/// The time axis a cell's charts share: its samples, windows and CPU readings, from the
/// start of measurement to its end.
pub(super) fn time_axis(cell: &CellResults, samples: &[SampleRow]) -> Axis {
    let shift = cell.measure_from_s;
    let end = (cell.summary.as_ref())
        .and_then(|s| s.duration_s)
        .unwrap_or(1.0);
    let xs = samples
        .iter()
        .map(|s| s.at_s - shift)
        .chain(
            cell.windows
                .iter()
                .map(|w| w.start.as_secs_f64() + w.length.as_secs_f64() / 2.0 - shift),
        )
        .chain(cell.proxy_cpu.iter().map(|p| p.0))
        .chain(
            cell.proxy_counts
                .iter()
                .flat_map(|(_, p)| p.iter().map(|v| v.0)),
        )
        .chain([0.0, end]);
    Axis::covering(xs, false)
}

/// The proxies' CPU (cores, per second) under a cell's latency chart, on the same time
/// axis, with the events marked.
pub(super) fn proxy_cpu_chart(
    cell: &CellResults,
    colour: &str,
    title: &str,
    x: Axis,
) -> Option<String> {
    if cell.proxy_cpu.is_empty() {
        return None;
    }
    let y = Axis::covering(cell.proxy_cpu.iter().map(|p| p.1).chain([0.0]), false);
    let mut plot = Plot::new(900.0, 130.0, x, y);
    plot.axes(
        "seconds from the start of measurement",
        "proxy CPU (cores)",
        &|v| short(v),
    );
    plot.line(&cell.proxy_cpu, colour, 1.6, false);
    for (i, e) in cell.impact.iter().enumerate() {
        plot.marker(e.requested_s, &event_label(i, e), i % 3);
    }
    Some(plot.finish(&format!("Proxy CPU over time: {title}")))
}

/// What the proxies counted per second (failed backend attempts, retries, 5xx sent) under
/// a cell's latency chart, on the same time axis, with the events marked.
pub(super) fn proxy_counts_chart(cell: &CellResults, title: &str, x: Axis) -> Option<String> {
    if cell
        .proxy_counts
        .iter()
        .all(|(_, points)| points.is_empty())
    {
        return None;
    }
    let values = cell
        .proxy_counts
        .iter()
        .flat_map(|(_, p)| p.iter().map(|v| v.1));
    let y = Axis::covering(values.chain([0.0, 1.0]), false);
    let mut plot = Plot::new(900.0, 130.0, x, y);
    plot.axes(
        "seconds from the start of measurement",
        "the proxy counted (per s)",
        &|v| short(v),
    );
    let mut legend = Vec::new();
    for (i, (words, points)) in cell.proxy_counts.iter().enumerate() {
        let colour = if i == 0 {
            ERROR_COLOUR
        } else {
            PALETTE[(i + 2) % PALETTE.len()]
        };
        plot.line(points, colour, 1.6, i > 0);
        legend.push(((*words).to_owned(), colour.to_owned()));
    }
    plot.legend(&legend);
    for (i, e) in cell.impact.iter().enumerate() {
        plot.marker(e.requested_s, &event_label(i, e), i % 3);
    }
    Some(plot.finish(&format!("What the proxy counted over time: {title}")))
}

/// An event's marker label: its number and what it did in a few words (`3 scale 3→4`).
fn event_label(i: usize, e: &ImpactEntry) -> String {
    format!("{} {}", i + 1, crate::headline::short_event(&e.what))
}

pub(super) fn timeline(
    cell: &CellResults,
    samples: &[SampleRow],
    colour: &str,
    log: bool,
    title: &str,
    x: Axis,
) -> String {
    let shift = cell.measure_from_s;
    let mut errors: Vec<(f64, f64)> = Vec::new();
    let mut ok: Vec<(f64, f64)> = Vec::new();
    for s in samples {
        let point = (s.at_s - shift, (s.latency_s * 1e3).max(0.001));
        if s.ok {
            ok.push(point);
        } else {
            errors.push(point);
        }
    }
    // Display only: an even thinning, errors kept first.
    let thin = |v: Vec<(f64, f64)>, cap: usize| -> Vec<(f64, f64)> {
        if v.len() <= cap {
            return v;
        }
        let step = v.len() as f64 / cap as f64;
        (0..cap).map(|i| v[(i as f64 * step) as usize]).collect()
    };
    let errors = thin(errors, MAX_POINTS / 2);
    let ok = thin(ok, MAX_POINTS - errors.len());
    let windows: Vec<(f64, f64, f64)> = cell
        .windows
        .iter()
        .filter(|w| w.histogram.count() > 0)
        .map(|w| {
            let mid = w.start.as_secs_f64() + w.length.as_secs_f64() / 2.0 - shift;
            let p = |q| (w.histogram.value_at_percentile(q) as f64 * 1e-3).max(0.001);
            (mid, p(50.0), p(99.0))
        })
        .collect();
    let ys = ok
        .iter()
        .chain(&errors)
        .map(|p| p.1)
        .chain(windows.iter().flat_map(|w| [w.1, w.2]));
    let y = Axis::covering(ys, log);
    let mut plot = Plot::new(900.0, 240.0, x, y);
    plot.axes(
        "seconds from the start of measurement",
        "latency (ms)",
        &|v| short(v),
    );
    plot.dots(&ok, colour, 1.6, 0.45);
    plot.dots(&errors, ERROR_COLOUR, 2.2, 0.9);
    let p50: Vec<(f64, f64)> = windows.iter().map(|w| (w.0, w.1)).collect();
    let p99: Vec<(f64, f64)> = windows.iter().map(|w| (w.0, w.2)).collect();
    plot.line(&p50, "#333", 1.2, false);
    plot.line(&p99, "#333", 1.2, true);
    // Every event by its number (as in the events table) and what it did; labels that
    // would overlap go on rows of their own.
    let times: Vec<f64> = cell.impact.iter().map(|e| e.requested_s).collect();
    let crowded = times
        .windows(2)
        .any(|w| (plot.px(w[1]) - plot.px(w[0])).abs() < 110.0);
    // Events at the same moment (a kill and its replacement) share one line.
    let mut marks: Vec<(f64, String)> = Vec::new();
    for (i, e) in cell.impact.iter().enumerate() {
        let at = e.requested_s;
        let label = event_label(i, e);
        match marks.last_mut() {
            Some((x, l)) if (plot.px(*x) - plot.px(at)).abs() < 6.0 => {
                l.push_str("; ");
                l.push_str(&label);
            }
            _ => marks.push((at, label)),
        }
    }
    for (row, (at, label)) in marks.iter().enumerate() {
        plot.marker(*at, label, if crowded { row % 3 } else { row });
    }
    plot.legend(&[
        ("request".into(), colour.to_owned()),
        ("error".into(), ERROR_COLOUR.into()),
        ("p50 / p99 (dashed) per second".into(), "#333".into()),
    ]);
    plot.finish(&format!("Latency over time: {title}"))
}

/// A histogram's spectrum in milliseconds at x = log10(1 / (1 - p)), from 0 (p = 0) to 5
/// (p = 99.999%).
pub(crate) fn spectrum_points(h: &HistogramUs) -> Vec<(f64, f64)> {
    (0..=100)
        .map(|k| {
            let x = k as f64 / 20.0;
            let p = 100.0 * (1.0 - 10f64.powf(-x));
            (x, (h.value_at_percentile(p) as f64 * 1e-3).max(0.001))
        })
        .collect()
}

/// Percentile spectrum of the conditions of one settings group.
pub(super) fn spectrum(
    run: &RunResults,
    members: &[&Condition],
    colours: &BTreeMap<String, &str>,
    settings: &str,
) -> String {
    let mut curves = Vec::new();
    for c in members {
        let mut merged = HistogramUs::new();
        for cell in run.cells.iter().filter(|x| c.cells.contains(&x.index)) {
            for w in &cell.windows {
                merged.merge(&w.histogram);
            }
        }
        if merged.is_empty() {
            continue;
        }
        curves.push((c.target.clone(), spectrum_points(&merged)));
    }
    let y = Axis::covering(curves.iter().flat_map(|c| c.1.iter().map(|p| p.1)), true);
    let x = Axis {
        min: 0.0,
        max: 5.0,
        log: false,
    };
    let mut plot = Plot::new(900.0, 260.0, x, y);
    plot.axes("percentile", "latency (ms)", &|v| {
        let p = 100.0 * (1.0 - 10f64.powf(-v));
        match v.round() as i32 {
            0 => "0%".into(),
            _ => format!("{}%", short(p)),
        }
    });
    let mut legend = Vec::new();
    for (target, points) in &curves {
        let colour = colours.get(target).copied().unwrap_or(PALETTE[0]);
        plot.line(points, colour, 1.8, false);
        legend.push((target.clone(), colour.to_owned()));
    }
    plot.legend(&legend);
    plot.finish(&format!(
        "Percentile spectrum: {}",
        settings_title(settings)
    ))
}

/// One metric's bars with interval whiskers, one per condition.
pub(super) fn bars(
    members: &[&Condition],
    m: usize,
    metric: &str,
    unit: &str,
    colours: &BTreeMap<String, &str>,
) -> String {
    let n = members.len().max(1) as f64;
    let highs = members
        .iter()
        .map(|c| c.metrics[m].high.max(c.metrics[m].value));
    let y = Axis::covering(highs.chain([0.0]), false);
    let x = Axis {
        min: 0.0,
        max: n,
        log: false,
    };
    let mut plot = Plot::new(160.0, 200.0, x, y);
    plot.axes(
        "",
        &if unit.is_empty() {
            metric.to_owned()
        } else {
            format!("{metric} ({unit})")
        },
        &|_| String::new(),
    );
    for (i, c) in members.iter().enumerate() {
        let e = &c.metrics[m];
        let colour = colours.get(&c.target).copied().unwrap_or(PALETTE[0]);
        let x0 = i as f64 + 0.15;
        let x1 = i as f64 + 0.85;
        plot.rect(
            x0,
            0.0,
            x1,
            e.value.max(0.0),
            colour,
            &format!(
                "{} {metric}: {}",
                c.target,
                analysis::with_interval(e, unit)
            ),
        );
        if e.high > e.low {
            let mid = (x0 + x1) / 2.0;
            plot.line(&[(mid, e.low), (mid, e.high)], "#222", 1.5, false);
            plot.line(
                &[(mid - 0.15, e.low), (mid + 0.15, e.low)],
                "#222",
                1.5,
                false,
            );
            plot.line(
                &[(mid - 0.15, e.high), (mid + 0.15, e.high)],
                "#222",
                1.5,
                false,
            );
        }
    }
    plot.finish(&format!("{metric} per target"))
}

/// A 100-bar strip of sampled failures per 100 ms, from 2 s before `at_s` to 8 s after
/// (sample time).
pub(super) fn error_strip(samples: &[SampleRow], at_s: f64) -> String {
    let mut bins = [0u32; 100];
    for s in samples.iter().filter(|s| !s.ok) {
        let i = ((s.at_s - at_s + 2.0) * 10.0).floor();
        if (0.0..100.0).contains(&i) {
            bins[i as usize] += 1;
        }
    }
    let top = bins.iter().copied().max().unwrap_or(0).max(1) as f64;
    let mut svg = String::from(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="200" height="24" viewBox="0 0 200 24"><rect width="200" height="24" fill="#fafafa"/><line x1="40" y1="0" x2="40" y2="24" stroke="#444" stroke-dasharray="2 2"/>"##,
    );
    for (i, b) in bins.iter().enumerate().filter(|(_, b)| **b > 0) {
        let h = 22.0 * f64::from(*b) / top;
        let _ = write!(
            svg,
            r#"<rect x="{}" y="{:.1}" width="2" height="{h:.1}" fill="{ERROR_COLOUR}"/>"#,
            i * 2,
            24.0 - h
        );
    }
    svg.push_str("</svg>");
    svg
}

/// Stacked mean phases per condition, when any request opened a connection.
pub(super) fn phases(run: &RunResults, conditions: &[Condition]) -> Option<(String, String)> {
    let names = ["dns", "connect", "tls", "server", "transfer"];
    let phase_colours = ["#999999", "#56B4E9", "#E69F00", "#009E73", "#CC79A7"];
    let mut rows = Vec::new();
    for c in conditions {
        let cell = first_cell(run, c)?;
        let m = |p: &str| cell.number(&["phases_us", p, "mean"]).unwrap_or(0.0) * 1e-3;
        let (dns, connect, tls, ttfb, total) =
            (m("dns"), m("connect"), m("tls"), m("ttfb"), m("total"));
        let transfer = (total - dns - connect - tls - ttfb).max(0.0);
        rows.push((
            format!("{} {}", c.target, c.settings),
            [dns, connect, tls, ttfb, transfer],
        ));
    }
    let any_connect = conditions.iter().any(|c| {
        first_cell(run, c)
            .and_then(|cell| cell.number(&["phases_us", "connect", "count"]))
            .is_some_and(|n| n > 0.0)
    });
    if rows.is_empty() || !any_connect {
        return None;
    }
    let x = Axis::covering(
        rows.iter().map(|r| r.1.iter().sum::<f64>()).chain([0.0]),
        false,
    );
    let y = Axis {
        min: 0.0,
        max: rows.len() as f64,
        log: false,
    };
    let mut plot = Plot::new(900.0, 60.0 + 26.0 * rows.len() as f64, x, y);
    plot.axes("mean time (ms)", "", &|v| short(v));
    let mut table = String::from("<table><tr><th class=\"l\">target</th>");
    for n in names {
        let _ = write!(table, "<th>{n} (ms)</th>");
    }
    table.push_str("</tr>");
    for (i, (label, parts)) in rows.iter().enumerate() {
        let top = (rows.len() - i) as f64 - 0.2;
        let mut from = 0.0;
        for (k, v) in parts.iter().enumerate() {
            plot.rect(
                from,
                top,
                from + v,
                top - 0.6,
                phase_colours[k],
                &format!("{label} {}: {} ms", names[k], analysis::ms(*v)),
            );
            from += v;
        }
        let (px, py) = (plot.px(0.0) + 4.0, plot.py(top - 0.3) + 4.0);
        plot.raw(&format!(
            r##"<text x="{px:.1}" y="{py:.1}" class="legend" fill="#222">{}</text>"##,
            esc(label)
        ));
        let _ = write!(table, "<tr><td class=\"l\">{}</td>", esc(label));
        for v in parts {
            let _ = write!(table, "<td>{}</td>", analysis::ms(*v));
        }
        table.push_str("</tr>");
    }
    table.push_str("</table>");
    plot.legend(
        &names
            .iter()
            .zip(phase_colours)
            .map(|(n, c)| ((*n).to_owned(), c.to_owned()))
            .collect::<Vec<_>>(),
    );
    Some((table, plot.finish("Mean time per phase")))
}

/// p99 against offered rate, when the matrix varies `load.rate`.
pub(super) fn sweep(conditions: &[Condition], colours: &BTreeMap<String, &str>) -> Option<String> {
    let rate_of = |s: &str| {
        s.split(' ')
            .find_map(|kv| kv.strip_prefix("load.rate="))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let rest_of = |s: &str| {
        s.split(' ')
            .filter(|kv| !kv.starts_with("load.rate="))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut lines: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
    let p99 = analysis::metric_index("p99").unwrap_or(2);
    for c in conditions {
        if let Some(rate) = rate_of(&c.settings) {
            lines
                .entry((c.target.clone(), rest_of(&c.settings)))
                .or_default()
                .push((rate, c.metrics[p99].value));
        }
    }
    let rates: Vec<f64> = lines.values().flatten().map(|p| p.0).collect();
    let mut distinct = rates.clone();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    if distinct.len() < 2 {
        return None;
    }
    let x = Axis::covering(rates.into_iter().chain([0.0]), false);
    let y = Axis::covering(lines.values().flatten().map(|p| p.1), true);
    let mut plot = Plot::new(900.0, 300.0, x, y);
    plot.axes("offered rate (requests per second)", "p99 (ms)", &|v| {
        short(v)
    });
    let mut legend = Vec::new();
    for (i, ((target, rest), points)) in lines.iter_mut().enumerate() {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let colour = colours.get(target).copied().unwrap_or(PALETTE[0]);
        plot.line(points, colour, 1.6, i % 2 == 1);
        plot.dots(points, colour, 2.5, 1.0);
        if let Some(last) = points.last() {
            let (px, py) = (plot.px(last.0), plot.py(last.1));
            plot.raw(&format!(
                r#"<text x="{:.1}" y="{py:.1}" class="tick" text-anchor="end">{}</text>"#,
                px - 4.0,
                esc(rest)
            ));
        }
        if !legend.iter().any(|(t, _): &(String, String)| t == target) {
            legend.push((target.clone(), colour.to_owned()));
        }
    }
    plot.legend(&legend);
    Some(plot.finish("p99 against offered rate"))
}
