//! The HTML report: one self-contained file (inline CSS and SVG, no script, nothing
//! fetched), readable on a laptop and printable. Every string from the results is escaped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use ingressbench_stats::HistogramUs;

use crate::analysis::{self, groups, Condition, Difference, METRICS};
use crate::results::{read_samples, CellResults, RunResults, SampleRow};
use crate::svg::{esc, short, Axis, Plot, ERROR_COLOUR, PALETTE};

/// At most this many points per latency-over-time panel (errors first); statistics always
/// use every request.
const MAX_POINTS: usize = 4000;
/// Configuration files shown at most this long.
const MAX_CONFIG_BYTES: usize = 64 * 1024;
/// How many configuration files a report shows at most per target.
const MAX_CONFIG_FILES: usize = 64;

/// A rendered report.
pub struct Report {
    /// The page.
    pub html: String,
    /// Each chart (name, standalone SVG), for `--png`.
    pub charts: Vec<(String, String)>,
    /// The headline, one sentence per group of settings.
    pub headline: Vec<String>,
    /// Warnings (generator behind, failed cells, too few requests, unreadable files).
    pub warnings: Vec<String>,
}

/// Renders the report of `run`; `noise_floor` (0.01 for 1%) is the smallest relative
/// difference that counts.
pub fn render(run: &RunResults, noise_floor: f64) -> Report {
    let conditions = analysis::conditions(run, 0x1b_e5c4);
    let diffs = analysis::differences(&conditions, noise_floor);
    let headline = analysis::headline(&conditions, &diffs);
    let warnings = warnings(run);
    let colours = target_colours(&conditions);
    let mut charts = Vec::new();
    let mut body = String::new();
    let name = run.record["scenario"].as_str().unwrap_or("run");
    let status = run.record["status"].as_str().unwrap_or("unknown");
    let _ = write!(
        body,
        "<header><h1>{}</h1><p class=\"what\">{}</p><p class=\"status status-{}\">Run {}; {} of {} cells measured.</p></header>",
        esc(name),
        esc(&description(run)),
        esc(&status.replace(' ', "-")),
        esc(status),
        run.cells.iter().filter(|c| c.summary.is_some()).count(),
        run.cells.len()
    );
    // Headline.
    body.push_str("<section><h2>Headline</h2><ul class=\"headline\">");
    for line in &headline {
        let _ = write!(body, "<li>{}</li>", esc(line));
    }
    body.push_str("</ul><p class=\"note\">p99 of latency from each request's intended send time, over every measured request of a cell; intervals are 95% bootstrap intervals over repeats (or over one-second windows of a single run). A difference whose interval reaches inside the noise floor is called no measurable difference.</p>");
    if !warnings.is_empty() {
        body.push_str("<div class=\"warnings\"><h3>Warnings</h3><ul>");
        for w in &warnings {
            let _ = write!(body, "<li>{}</li>", esc(w));
        }
        body.push_str("</ul></div>");
    }
    body.push_str("</section>");
    // Where it ran.
    if let Some((html, diagrams)) = crate::topology::section(run) {
        body.push_str(&html);
        charts.extend(diagrams);
    }
    // Latency over time.
    body.push_str("<section><h2>Latency over time</h2><p class=\"note\">Each sampled request as a point (errors in red), p50 and p99 per second as lines, every event as a labelled dashed line; time from the start of measurement. The first repeat of each target and setting.</p>");
    body.push_str("<div class=\"scale\"><input type=\"radio\" name=\"y\" id=\"ylog\" checked><label for=\"ylog\">log</label><input type=\"radio\" name=\"y\" id=\"ylin\"><label for=\"ylin\">linear</label>");
    for c in &conditions {
        let Some(cell) = first_cell(run, c) else {
            continue;
        };
        let samples = samples_of(run, cell);
        let title = format!("{} {}", c.target, c.settings);
        let colour = colours.get(&c.target).map_or(PALETTE[0], |s| s);
        let x = time_axis(cell, &samples);
        let log = timeline(cell, &samples, colour, true, &title, x);
        let lin = timeline(cell, &samples, colour, false, &title, x);
        let cpu = proxy_cpu_chart(cell, colour, &title, x);
        let _ = write!(
            body,
            "<figure class=\"panel\"><figcaption>{}</figcaption><div class=\"log\">{log}</div><div class=\"lin\">{lin}</div>{}</figure>",
            esc(&title),
            cpu.as_deref().unwrap_or_default()
        );
        charts.push((format!("timeline {title}"), log));
        if let Some(cpu) = cpu {
            charts.push((format!("proxy cpu {title}"), cpu));
        }
    }
    body.push_str("</div></section>");
    // Percentile spectrum, per settings.
    body.push_str("<section><h2>Percentile spectrum</h2><p class=\"note\">Latency at each percentile, on HdrHistogram's 1/(1-p) axis, over all repeats of each target.</p>");
    for (settings, members) in groups(&conditions) {
        let svg = spectrum(run, &members, &colours, &settings);
        let _ = write!(
            body,
            "<figure><figcaption>{}</figcaption>{svg}</figure>",
            esc(&settings_title(&settings))
        );
        charts.push((format!("spectrum {settings}"), svg));
    }
    body.push_str("</section>");
    // Comparison.
    body.push_str("<section><h2>Comparison</h2><p class=\"note\">Each metric's value with its 95% interval; the table gives each target's difference from the first one at the same settings, then what the client and the proxies did besides (over all repeats): requests retried after a reused connection was closed under them, idle connections the server closed, the proxies' CPU per 1,000 requests (every replica, read from /proc) and their peak resident memory.</p>");
    for (settings, members) in groups(&conditions) {
        let _ = write!(
            body,
            "<h3>{}</h3><p class=\"legend\">",
            esc(&settings_title(&settings))
        );
        for c in &members {
            let colour = colours.get(&c.target).copied().unwrap_or(PALETTE[0]);
            let _ = write!(
                body,
                "<span class=\"swatch\" style=\"background:{}\"></span>{} ",
                esc(colour),
                esc(&c.target)
            );
        }
        body.push_str("</p><div class=\"bars\">");
        for (m, (metric, unit, _)) in METRICS.iter().enumerate() {
            let svg = bars(&members, m, metric, unit, &colours);
            body.push_str(&svg);
            charts.push((format!("bars {metric} {settings}"), svg));
        }
        body.push_str("</div>");
        body.push_str(&differences_table(run, &diffs, &settings, &members));
    }
    body.push_str("</section>");
    if let Some(section) = crate::protocols::section(run, &conditions, noise_floor) {
        body.push_str(&section);
    }
    // Events.
    body.push_str(&events_section(run, &conditions));
    // Phases.
    if let Some((table, svg)) = phases(run, &conditions) {
        let _ = write!(
            body,
            "<section><h2>Phases</h2><p class=\"note\">Mean time per phase (curl's columns as differences: DNS, connect, TLS, server until the first byte, transfer), first repeat of each target and setting.</p>{svg}{table}</section>"
        );
        charts.push(("phases".into(), svg));
    }
    // Sweeps.
    if let Some(svg) = sweep(&conditions, &colours) {
        let _ = write!(
            body,
            "<section><h2>Sweep</h2><p class=\"note\">p99 against the offered rate, one line per target and per setting besides the rate.</p>{svg}</section>"
        );
        charts.push(("sweep".into(), svg));
    }
    if let Some(section) = crate::kernel::section(run, &conditions) {
        body.push_str(&section);
    }
    if let Some(section) = crate::workers::section(run, &mut charts) {
        body.push_str(&section);
    }
    body.push_str(&measured_section(run));
    let html = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{} - ingressbench report</title><style>{CSS}</style></head><body>{body}<footer>Written by ingressbench {}.</footer></body></html>",
        esc(name),
        esc(env!("CARGO_PKG_VERSION"))
    );
    Report {
        html,
        charts,
        headline,
        warnings,
    }
}

const CSS: &str = "body{font-family:system-ui,sans-serif;max-width:1000px;margin:1em auto;padding:0 1em;color:#222;line-height:1.4}h1{margin-bottom:.2em}h2{border-bottom:1px solid #ccc;margin-top:1.6em}figure{margin:.6em 0}figcaption{font-weight:600;font-size:.9em}svg{max-width:100%;height:auto}.note{color:#555;font-size:.85em}.warnings{background:#fff4e5;border-left:4px solid #e69f00;padding:.2em 1em}.status-incomplete,.status-failed,.status-cut-short{color:#b00}.bars{display:flex;flex-wrap:wrap;gap:4px}table{border-collapse:collapse;font-size:.85em;margin:.6em 0}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}th{background:#f5f5f5}td.l,th.l{text-align:left}pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:.8em;max-height:30em}.scale input{margin-left:1em}.swatch{display:inline-block;width:.8em;height:.8em;margin:0 .3em 0 .8em}.scale .lin{display:none}#ylin:checked~figure .lin{display:block}#ylin:checked~figure .log{display:none}@media print{.scale input,.scale label{display:none}details{display:block}details>*{display:block}}";

fn description(run: &RunResults) -> String {
    let text = run.record["scenario_text"].as_str().unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("description:"))
        .map(|d| d.trim().trim_matches('"').to_owned())
        .unwrap_or_default()
}

fn settings_title(settings: &str) -> String {
    if settings.is_empty() {
        "All targets".into()
    } else {
        settings.to_owned()
    }
}

/// The first finished cell (first repeat) of a condition: the one drawn over time.
fn first_cell<'a>(run: &'a RunResults, c: &Condition) -> Option<&'a CellResults> {
    c.cells
        .first()
        .and_then(|i| run.cells.iter().find(|x| x.index == *i))
}

/// A cell's sampled requests (none if it has no samples file, or one that leads out of
/// the results directory).
fn samples_of(run: &RunResults, cell: &CellResults) -> Vec<SampleRow> {
    let sent = cell.number(&["requests", "total"]).unwrap_or(0.0)
        + cell.number(&["requests", "warmup"]).unwrap_or(0.0);
    cell.file_parts("samples.csv.gz")
        .and_then(|parts| read_samples(&run.root, &parts, sent as u64).ok())
        .unwrap_or_default()
}

fn target_colours(conditions: &[Condition]) -> BTreeMap<String, &'static str> {
    let mut out = BTreeMap::new();
    for c in conditions {
        let n = out.len();
        out.entry(c.target.clone())
            .or_insert(PALETTE[n % PALETTE.len()]);
    }
    out
}

fn warnings(run: &RunResults) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(why) = run.record["cut_short"].as_str() {
        out.push(format!(
            "RUN CUT SHORT: {why}; the cell it was running is rebuilt from its interval log, the cells after it were never run (`ingressbench run --resume {}` runs them)",
            run.dir.display()
        ));
    }
    for c in &run.cells {
        let label = format!(
            "{} {} (repeat {})",
            c.target,
            c.settings_label(),
            c.repeat + 1
        );
        match c.status.as_str() {
            "done" => {}
            "failed" => out.push(format!(
                "{label} failed: {}",
                c.error.as_deref().unwrap_or("see run.json")
            )),
            other => out.push(format!(
                "{label} is {other}: not measured, or not to the end"
            )),
        }
        let attempts = run.record["cells"][c.index]["earlier_attempts"].as_array();
        for a in attempts.into_iter().flatten() {
            out.push(format!(
                "{label}: an earlier attempt was cut short after {:.0} s ({} requests answered); not in these figures, its files are in cells/{}",
                a["summary"]["duration_s"].as_f64().unwrap_or_default(),
                a["summary"]["latency_us"]["count"],
                a["dir"].as_str().unwrap_or("?")
            ));
        }
        if let Some(ws) = c.summary.as_ref().and_then(|s| s["warnings"].as_array()) {
            for w in ws {
                out.push(format!("{label}: {}", w.as_str().unwrap_or_default()));
            }
        }
    }
    out.extend(run.notes.iter().map(|n| format!("unreadable: {n}")));
    out
}

/// Latency over time for one cell.
/// The time axis a cell's charts share: its samples, windows and CPU readings, from the
/// start of measurement to its end.
fn time_axis(cell: &CellResults, samples: &[SampleRow]) -> Axis {
    let shift = cell.measure_from_s;
    let end = cell.number(&["duration_s"]).unwrap_or(1.0);
    let xs = samples
        .iter()
        .map(|s| s.at_s - shift)
        .chain(
            cell.windows
                .iter()
                .map(|w| w.start.as_secs_f64() + w.length.as_secs_f64() / 2.0 - shift),
        )
        .chain(cell.proxy_cpu.iter().map(|p| p.0))
        .chain([0.0, end]);
    Axis::covering(xs, false)
}

/// The proxies' CPU (cores, per second) under a cell's latency chart, on the same time
/// axis, with the events marked.
fn proxy_cpu_chart(cell: &CellResults, colour: &str, title: &str, x: Axis) -> Option<String> {
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
        if let Some(at) = e["requested_s"].as_f64() {
            plot.marker(at, &format!("{}", i + 1), 0);
        }
    }
    Some(plot.finish(&format!("Proxy CPU over time: {title}")))
}

fn timeline(
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
    // Events by name when there is room for their labels, else by number (as numbered
    // in the events table).
    let times: Vec<f64> = cell
        .impact
        .iter()
        .filter_map(|e| e["requested_s"].as_f64())
        .collect();
    let crowded = times
        .windows(2)
        .any(|w| (plot.px(w[1]) - plot.px(w[0])).abs() < 110.0);
    // Events at the same moment (a kill and its replacement) share one line.
    let mut marks: Vec<(f64, String)> = Vec::new();
    for (i, e) in cell.impact.iter().enumerate() {
        let Some(at) = e["requested_s"].as_f64() else {
            continue;
        };
        let label = if crowded {
            format!("{}", i + 1)
        } else {
            format!("{} {}", i + 1, e["what"].as_str().unwrap_or("event"))
        };
        match marks.last_mut() {
            Some((x, l)) if (plot.px(*x) - plot.px(at)).abs() < 6.0 => {
                l.push_str(if crowded { "," } else { "; " });
                l.push_str(&label);
            }
            _ => marks.push((at, label)),
        }
    }
    for (row, (at, label)) in marks.iter().enumerate() {
        plot.marker(*at, label, if crowded { 0 } else { row });
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
fn spectrum(
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
fn bars(
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

/// What a condition's cells add up to besides latency: requests retried after the server
/// closed a reused connection, idle connections it closed (retired before use), the
/// proxies' CPU per 1,000 requests (mean over cells) and their peak memory.
fn client_and_cost(run: &RunResults, c: &Condition) -> [String; 4] {
    let cells: Vec<&CellResults> = c.cells.iter().filter_map(|&i| run.cells.get(i)).collect();
    let total = |path: &[&str]| -> f64 { cells.iter().filter_map(|cell| cell.number(path)).sum() };
    let proxy = |key: &str| -> Vec<f64> {
        cells
            .iter()
            .filter_map(|cell| cell.usage.as_ref()?["by_role"]["proxy"][key].as_f64())
            .collect()
    };
    let cpu = proxy("cpu_ms_per_1000_requests");
    let rss = proxy("rss_peak_bytes");
    [
        format!("{:.0}", total(&["retries", "retried"])),
        format!(
            "{:.0}",
            total(&["connection_events", "closed_by_server_while_idle"])
        ),
        if cpu.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.1}", cpu.iter().sum::<f64>() / cpu.len() as f64)
        },
        rss.iter()
            .copied()
            .reduce(f64::max)
            .map_or("-".to_owned(), |b| format!("{:.0}", b / 1e6)),
    ]
}

fn differences_table(
    run: &RunResults,
    diffs: &[Difference],
    settings: &str,
    members: &[&Condition],
) -> String {
    let mut t = String::from("<table><tr><th class=\"l\">target</th>");
    for (metric, unit, _) in METRICS {
        let _ = write!(
            t,
            "<th>{}</th>",
            esc(&if unit.is_empty() {
                metric.to_owned()
            } else {
                format!("{metric} ({unit})")
            })
        );
    }
    t.push_str("<th title=\"requests sent again on a new connection because the server closed a reused one just as they went out (without the retry they would have failed)\">retried</th><th title=\"idle keep-alive connections the server closed, retired before they carried a request\">idle closes</th><th>proxy CPU (ms per 1,000 requests)</th><th>proxy memory peak (MB)</th><th class=\"l\">basis</th></tr>");
    for c in members {
        let _ = write!(t, "<tr><td class=\"l\">{}</td>", esc(&c.target));
        for (m, (metric, unit, _)) in METRICS.iter().enumerate() {
            let mut cell = analysis::with_interval(&c.metrics[m], unit);
            if let Some(d) = diffs
                .iter()
                .find(|d| d.settings == settings && d.other == c.target && d.metric == *metric)
            {
                let _ = write!(
                    cell,
                    "\n{}: {}",
                    d.verdict.words(),
                    analysis::percent(&d.relative)
                );
            }
            let _ = write!(t, "<td>{}</td>", esc(&cell).replace('\n', "<br>"));
        }
        for extra in client_and_cost(run, c) {
            let _ = write!(t, "<td>{}</td>", esc(&extra));
        }
        let _ = write!(
            t,
            "<td class=\"l\">{} ({} requests)</td></tr>",
            esc(c.basis),
            c.requests
        );
    }
    t.push_str("</table>");
    t
}

fn events_section(run: &RunResults, conditions: &[Condition]) -> String {
    let mut out = String::new();
    for c in conditions {
        let Some(cell) = first_cell(run, c) else {
            continue;
        };
        if cell.impact.is_empty() {
            continue;
        }
        let samples = samples_of(run, cell);
        let _ = write!(
            out,
            "<h3>{} {}</h3><table><tr><th>#</th><th class=\"l\">event</th><th>requested (s)</th><th>applied (s)</th><th>took effect (s)</th><th>control plane (ms)</th><th>controller reported (ms)</th><th>proxy (ms)</th><th>old and new answers mixed (ms)</th><th title=\"Every failed request in the event's window: exact (runs before every failure was kept show an estimate from the sample, marked est.)\">errors</th><th title=\"HTTP/2: GOAWAY frames received in the event's window, on how many connections, and how long after the event the first came\">GOAWAYs (connections; first after s)</th><th>first / last error after (s)</th><th>longest failure run</th><th>max (ms)</th><th>p99 5 s before / after / 5-15 s after (ms)</th><th>proxy CPU: cores before / peak after; extra in 5 s (ms)</th><th class=\"l\">errors from 2 s before to 8 s after</th></tr>",
            esc(&c.target),
            esc(&c.settings)
        );
        for (i, e) in cell.impact.iter().enumerate() {
            let num = |k: &str| e[k].as_f64().map_or("-".to_owned(), |v| format!("{v:.3}"));
            let at = e["requested_s"].as_f64().unwrap_or(0.0);
            let errors = match (e["errors"].as_u64(), e["estimated_errors"].as_f64()) {
                (Some(n), _) => n.to_string(),
                (None, Some(n)) => format!("~{n:.0} est."),
                (None, None) => "-".into(),
            };
            let longest = match e["longest_failure_run_basis"].as_str() {
                Some("sampled") => {
                    format!("{} (between sampled successes)", num("longest_failure_run"))
                }
                _ => e["longest_failure_run"]
                    .as_u64()
                    .map_or("-".into(), |n| n.to_string()),
            };
            // A change no answer showed before the next event or the load's end says how
            // long the traffic was watched for it.
            let took_effect = match (e["took_effect_s"].as_f64(), e["window_s"].as_f64()) {
                (Some(t), _) => format!("{t:.3}"),
                (None, Some(w)) => format!("not within {w:.2} s"),
                (None, None) => "-".to_owned(),
            };
            let mixed_ms = e["mixed_window_s"]
                .as_f64()
                .map_or("-".to_owned(), |v| format!("{:.1}", v * 1e3));
            // The control plane's part (asked until the proxies were told: the lab's
            // propagation delay, or a cluster's EndpointSlices) and the proxy's (told until
            // the traffic showed it).
            let part = |from: &str, to: &str| match (e[from].as_f64(), e[to].as_f64()) {
                (Some(a), Some(b)) => format!("{:.0}", (b - a) * 1e3),
                _ => "-".to_owned(),
            };
            let cpu = &e["cpu"]["proxy"];
            let cores = |k: &str| {
                cpu[k]
                    .as_f64()
                    .map_or("-".to_owned(), |v| format!("{v:.2}"))
            };
            let cpu_cell = if cpu.is_null() {
                "-".to_owned()
            } else {
                format!(
                    "{} / {}; {}",
                    cores("cores_before"),
                    cores("peak_cores_after"),
                    cpu["extra_cpu_ms"]
                        .as_f64()
                        .map_or("-".to_owned(), |v| format!("{v:+.0}"))
                )
            };
            let goaways = match e["goaways"].as_f64() {
                Some(n) => format!(
                    "{n:.0} ({}; {})",
                    e["goaway_connections"].as_f64().unwrap_or(0.0),
                    num("first_goaway_after_s")
                ),
                None => "-".to_owned(),
            };
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td title=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td><td>{}</td><td>{}</td><td>{} / {} / {}</td><td>{}</td><td class=\"l\">{}</td></tr>",
                i + 1,
                esc(e["what"].as_str().unwrap_or("?")),
                num("requested_s"),
                num("applied_s"),
                esc(e["took_effect_basis"].as_str().unwrap_or_default()),
                esc(&took_effect),
                part("requested_s", "applied_s"),
                part("requested_s", "reported_s"),
                part("applied_s", "took_effect_s"),
                mixed_ms,
                errors,
                esc(&goaways),
                num("first_error_after_s"),
                num("last_error_after_s"),
                longest,
                num("max_latency_ms"),
                num("p99_ms_5s_before"),
                num("p99_ms_5s_after"),
                num("p99_ms_5_to_15s_after"),
                esc(&cpu_cell),
                error_strip(&samples, at + cell.measure_from_s),
            );
        }
        out.push_str("</table>");
    }
    if out.is_empty() {
        return String::new();
    }
    format!("<section><h2>Events</h2><p class=\"note\">Each event with its times (seconds from the start of measurement), the control plane's part (asked until the proxies were told: the lab's propagation delay, or in a cluster until the Service's EndpointSlices showed it), when the controller reported a route change in the route's status (Gateway API), and the proxy's part (told until the traffic showed it; a change no answer showed before the next event or the load's end says how long it was watched for), and what it did to the requests after it (docs/RESULTS.md): errors, their first and last and the longest run of consecutive failures are exact, from every failed request (kept whatever the sample rate); latency from the sampled requests. The strip shows failed requests per 100 ms around it. A route change or reload took effect with the first answer that carried its configuration generation; old and new answers mixed until the last answer of an earlier one. Proxy CPU is read once a second from /proc (10 ms ticks): the mean before the event, the highest second in the 5 s after it, and what those 5 s cost beyond the rate before.</p>{out}</section>")
}

/// A 100-bar strip of sampled failures per 100 ms, from 2 s before `at_s` to 8 s after
/// (sample time).
fn error_strip(samples: &[SampleRow], at_s: f64) -> String {
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
fn phases(run: &RunResults, conditions: &[Condition]) -> Option<(String, String)> {
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
fn sweep(conditions: &[Condition], colours: &BTreeMap<String, &str>) -> Option<String> {
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

fn measured_section(run: &RunResults) -> String {
    let r = &run.record;
    let mut out = String::from("<section><h2>How it was measured</h2><table>");
    let machine = &r["machine"];
    let rows = [
        (
            "tool",
            format!("ingressbench {}", r["tool_version"].as_str().unwrap_or("?")),
        ),
        (
            "machine",
            format!(
                "{}, {} cores, Linux {}",
                machine["cpu_model"].as_str().unwrap_or("?"),
                machine["cores"].as_u64().unwrap_or(0),
                machine["kernel"].as_str().unwrap_or("?")
            ),
        ),
        (
            "command",
            r["command"]
                .as_str()
                .unwrap_or("ingressbench load")
                .to_owned(),
        ),
        (
            "quick",
            match r["quick"].as_bool() {
                Some(true) => format!(
                    "yes: durations x{:.3}",
                    r["quick_factor"].as_f64().unwrap_or(1.0)
                ),
                _ => "no".into(),
            },
        ),
    ];
    for (k, v) in rows {
        let _ = write!(
            out,
            "<tr><th class=\"l\">{k}</th><td class=\"l\">{}</td></tr>",
            esc(&v)
        );
    }
    let mut versions: Vec<(String, String)> = Vec::new();
    for c in &run.cells {
        if let Some(v) = &c.proxy_version {
            if !versions.iter().any(|(t, _)| *t == c.target) {
                versions.push((c.target.clone(), v.clone()));
            }
        }
    }
    for (t, v) in &versions {
        let _ = write!(
            out,
            "<tr><th class=\"l\">{}</th><td class=\"l\">{}</td></tr>",
            esc(t),
            esc(v)
        );
    }
    out.push_str("</table>");
    if let Some(text) = r["scenario_text"].as_str() {
        let _ = write!(
            out,
            "<details><summary>Scenario as run</summary><pre>{}</pre></details>",
            esc(text)
        );
    }
    // Rendered configurations: the first cell of each target.
    let mut shown: Vec<&str> = Vec::new();
    for c in &run.cells {
        if shown.contains(&c.target.as_str()) {
            continue;
        }
        let Some(name) = c.dir_name.as_deref() else {
            continue;
        };
        if !crate::files::is_dir_in(&run.root, &["cells", name, "proxy"]) {
            continue;
        }
        let files = config_files(&run.root.join("cells").join(name).join("proxy"));
        if files.is_empty() {
            continue;
        }
        shown.push(&c.target);
        let _ = write!(
            out,
            "<details><summary>Configuration of {} ({} files)</summary>",
            esc(&c.target),
            files.len()
        );
        for (name, text) in files {
            let _ = write!(out, "<h4>{}</h4><pre>{}</pre>", esc(&name), esc(&text));
        }
        out.push_str("</details>");
    }
    out.push_str("</section>");
    out
}

/// Configuration files (not logs) under `dir`, each cut to [`MAX_CONFIG_BYTES`], at most
/// [`MAX_CONFIG_FILES`] of them; no link followed, only regular files read.
fn config_files(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        if out.len() >= MAX_CONFIG_FILES {
            break;
        }
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            // No link is followed: a results directory cannot bring other files in.
            let is_link = p
                .symlink_metadata()
                .is_ok_and(|m| m.file_type().is_symlink());
            if is_link || out.len() >= MAX_CONFIG_FILES {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else if p
                .extension()
                .is_some_and(|e| ["conf", "cfg", "json", "yaml"].iter().any(|x| e == *x))
            {
                let Some(mut text) = crate::files::read_prefix(&p, MAX_CONFIG_BYTES + 1) else {
                    continue;
                };
                if text.len() > MAX_CONFIG_BYTES {
                    let mut cut = MAX_CONFIG_BYTES;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                    text.push_str("\n… (cut)");
                }
                let name = p.strip_prefix(dir).unwrap_or(&p).display().to_string();
                out.push((name, text));
            }
        }
    }
    out
}
