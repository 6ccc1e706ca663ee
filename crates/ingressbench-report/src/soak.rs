//! The report's soak section (issue 52): per soak cell, what grew, each growth a slope
//! with its 95% interval or "no measurable growth" when the interval holds zero (never a
//! first-against-last difference); the old processes its events left alive and for how
//! long; each kind of event's errors and p99 over its firings; the tool's own cost. A
//! chart per cell of the proxy's memory and processes over the soak. Its sentences lead
//! the headline, those that found growth first.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ingressbench_results::site::Slope;
use ingressbench_results::soak::{SoakPart, SoakRecord};

use crate::results::{CellResults, RunResults};
use crate::svg::{esc, short, Axis, Plot, ERROR_COLOUR, PALETTE};

/// The section and its headline sentences, when the run has a soak cell.
pub(crate) fn section(
    run: &RunResults,
    colours: &BTreeMap<String, &'static str>,
    charts: &mut Vec<(String, String)>,
) -> Option<(String, Vec<String>)> {
    let cells: Vec<(&CellResults, &SoakRecord)> = (run.cells.iter())
        .filter_map(|c| Some((c, c.soak.as_ref()?)))
        .collect();
    if cells.is_empty() {
        return None;
    }
    let mut html = String::from("<section><h2>Soak</h2><p class=\"note\">Each cell's load ran for the soak's length with its events repeated every period. Every growth is a least-squares slope with its 95% interval (readings a second apart are correlated: the interval allows for it); an interval that holds zero is no measurable growth. Memory is against events fired (per 100 firings) and against time (per minute); old processes are those beyond the count a part had at the start of measurement, each stretch from the first reading with more to the first without. The series of each event's errors and p99 is impact.json; soak.jsonl holds the tool's own cost.</p>");
    let mut grew = Vec::new();
    let mut flat = Vec::new();
    for (cell, soak) in &cells {
        let label = cell.label();
        let (sentence, growth) = sentence(&label, soak);
        if growth {
            grew.push(sentence);
        } else {
            flat.push(sentence);
        }
        let _ = write!(
            html,
            "<h3>{}</h3><p class=\"note\">{:.0} s of load, the timeline every {:.0} s, {} firings.</p>",
            esc(&label),
            soak.duration_s,
            soak.period_s,
            soak.firings
        );
        html.push_str(&parts_table(soak));
        html.push_str(&events_table(soak));
        html.push_str(&tool_line(soak));
        let colour = colours.get(&cell.target).copied().unwrap_or(PALETTE[0]);
        for (name, svg) in memory_charts(cell, colour, &label) {
            let _ = write!(html, "<figure>{svg}</figure>");
            charts.push((format!("{name} {label}"), svg));
        }
        if let Some((svg, note)) = firings_chart(cell, &label) {
            let _ = write!(html, "<figure>{svg}</figure>{note}");
            charts.push((format!("soak firings {label}"), svg));
        }
    }
    html.push_str("</section>");
    grew.extend(flat);
    Some((html, grew))
}

/// `+1.8 MiB (1.5 to 2.1)` for a slope of bytes.
fn bytes_slope(s: &Slope) -> String {
    format!(
        "{} ({} to {})",
        signed_bytes(s.value),
        signed_bytes(s.low),
        signed_bytes(s.high)
    )
}

fn signed_bytes(b: f64) -> String {
    let sign = if b < 0.0 { "-" } else { "+" };
    let a = b.abs();
    let text = if a >= f64::from(1 << 20) {
        format!("{:.1} MiB", a / f64::from(1 << 20))
    } else if a >= 1024.0 {
        format!("{:.1} KiB", a / 1024.0)
    } else {
        format!("{a:.0} B")
    };
    format!("{sign}{text}")
}

/// `+0.25 ms (0.10 to 0.40)`: a slope of a figure, to `digits` decimals, in `unit`.
fn figure(s: &Slope, digits: usize, unit: &str) -> String {
    format!(
        "{:+.digits$}{unit} ({:.digits$} to {:.digits$})",
        s.value, s.low, s.high
    )
}

/// A slope in words: the value with its interval, or no measurable growth.
fn growth_words(s: Option<&Slope>, unit: &dyn Fn(&Slope) -> String) -> String {
    match s {
        Some(s) if s.measurable() => unit(s),
        Some(s) => format!("no measurable growth ({})", unit(s)),
        None => "too few readings".to_owned(),
    }
}

/// The cell's sentence, and whether it found growth (memory, descriptors or errors).
fn sentence(label: &str, soak: &SoakRecord) -> (String, bool) {
    let mut said = Vec::new();
    let mut grew = false;
    for p in soak.parts.iter().filter(|p| p.role == "proxy") {
        if let Some(s) = p.rss_bytes_per_100_firings.filter(Slope::measurable) {
            grew |= s.value > 0.0;
            said.push(format!(
                "{} memory {} per 100 firings",
                p.name,
                bytes_slope(&s)
            ));
        } else {
            said.push(format!("no measurable growth in {}'s memory", p.name));
        }
        if let Some(s) = p.fds_per_min.filter(Slope::measurable) {
            grew |= s.value > 0.0;
            said.push(format!(
                "its descriptors {:+.2} a minute ({:.2} to {:.2})",
                s.value, s.low, s.high
            ));
        }
        if let Some(s) = p.cpu_ms_per_1000_per_min.filter(Slope::measurable) {
            grew |= s.value > 0.0;
            said.push(format!(
                "its CPU per 1,000 requests {:+.3} ms a minute ({:.3} to {:.3})",
                s.value, s.low, s.high
            ));
        }
        said.push(old_processes(p));
    }
    // The other parts (backends, a front, a sidecar) when they grew.
    for p in soak.parts.iter().filter(|p| p.role != "proxy") {
        let grown = |s: &Option<Slope>| s.filter(|s| s.measurable() && s.value > 0.0);
        if let Some(s) = grown(&p.rss_bytes_per_100_firings) {
            grew = true;
            said.push(format!(
                "{} ({}) memory {} per 100 firings",
                p.name,
                p.role,
                bytes_slope(&s)
            ));
        } else if let Some(s) = grown(&p.rss_bytes_per_min) {
            grew = true;
            said.push(format!(
                "{} ({}) memory {} a minute",
                p.name,
                p.role,
                bytes_slope(&s)
            ));
        }
        if p.extra_stretches > 0 {
            said.push(format!("{}: {}", p.name, old_processes(p)));
        }
    }
    for e in &soak.events {
        match e.errors_per_100_firings.filter(Slope::measurable) {
            Some(s) => {
                grew |= s.value > 0.0;
                said.push(format!(
                    "errors after each {} {:+.1} per 100 firings ({:.1} to {:.1})",
                    e.kind, s.value, s.low, s.high
                ));
            }
            None => said.push(format!(
                "{} errors over {} {}s, no measurable growth",
                e.errors, e.firings, e.kind
            )),
        }
    }
    let sentence = format!(
        "{label}: over {:.0} s and {} firings, {}.",
        soak.duration_s,
        soak.firings,
        said.join("; ")
    );
    (sentence, grew)
}

/// Old processes in words: none, or how many at once at most and the longest alive.
fn old_processes(p: &SoakPart) -> String {
    if p.extra_stretches == 0 {
        return format!(
            "no old process beyond the {} at the start",
            p.processes_at_start
        );
    }
    let most = p.extra_processes.iter().map(|s| s.extra).max().unwrap_or(0);
    format!(
        "up to {most} old process{} alive at once, the longest for {:.0} s ({} time{})",
        if most == 1 { "" } else { "es" },
        p.extra_longest_s,
        p.extra_stretches,
        if p.extra_stretches == 1 { "" } else { "s" }
    )
}

fn parts_table(soak: &SoakRecord) -> String {
    let mut t = String::from("<table><tr><th class=\"l\">part</th><th class=\"l\">memory per 100 firings</th><th class=\"l\">memory per minute</th><th class=\"l\">descriptors per minute</th><th class=\"l\">CPU per 1,000 requests, a minute</th><th>memory first / last (MiB)</th><th>processes at start / most</th><th class=\"l\">old processes</th></tr>");
    for p in &soak.parts {
        let _ = write!(
            t,
            "<tr><td class=\"l\">{} ({})</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{:.1} / {:.1}</td><td>{} / {}</td><td class=\"l\">{}</td></tr>",
            esc(&p.name),
            esc(&p.role),
            esc(&growth_words(p.rss_bytes_per_100_firings.as_ref(), &bytes_slope)),
            esc(&growth_words(p.rss_bytes_per_min.as_ref(), &bytes_slope)),
            esc(&growth_words(p.fds_per_min.as_ref(), &|s: &Slope| figure(s, 2, ""))),
            esc(&growth_words(p.cpu_ms_per_1000_per_min.as_ref(), &|s: &Slope| figure(s, 3, " ms"))),
            p.rss_first_bytes as f64 / f64::from(1 << 20),
            p.rss_last_bytes as f64 / f64::from(1 << 20),
            p.processes_at_start,
            p.processes_max,
            esc(&old_processes(p)),
        );
    }
    t.push_str("</table>");
    t
}

fn events_table(soak: &SoakRecord) -> String {
    if soak.events.is_empty() {
        return String::new();
    }
    let mut t = String::from("<table><tr><th class=\"l\">event</th><th>firings</th><th>errors</th><th class=\"l\">errors per 100 firings</th><th class=\"l\">p99 in the 5 s after, per 100 firings</th></tr>");
    for e in &soak.events {
        let _ = write!(
            t,
            "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
            esc(&e.kind),
            e.firings,
            e.errors,
            esc(&growth_words(e.errors_per_100_firings.as_ref(), &|s: &Slope| figure(s, 1, ""))),
            esc(&growth_words(e.p99_after_ms_per_100_firings.as_ref(), &|s: &Slope| figure(s, 3, " ms"))),
        );
    }
    t.push_str("</table>");
    t
}

fn tool_line(soak: &SoakRecord) -> String {
    let Some(tool) = &soak.tool else {
        return String::new();
    };
    let first = tool.rss_first_bytes as f64;
    let change = if first > 0.0 {
        format!(
            " ({:+.1}%)",
            (tool.rss_last_bytes as f64 - first) / first * 100.0
        )
    } else {
        String::new()
    };
    let cpu = match (tool.cpu_ms_per_1000_first, tool.cpu_ms_per_1000_last) {
        (Some(a), Some(b)) => format!("; its CPU {a:.1} then {b:.1} ms per 1,000 requests"),
        _ => String::new(),
    };
    format!(
        "<p class=\"note\">The tool itself: {:.1} MiB resident at its first soak.jsonl line, {:.1} MiB at its last{change}, its memory a minute: {}{cpu}; the results directory {:.1} MB (estimated {:.1} MB, budget {:.0} MB); {} sampled requests outside the events' windows, {} of them kept.</p>",
        first / f64::from(1 << 20),
        tool.rss_last_bytes as f64 / f64::from(1 << 20),
        esc(&growth_words(tool.rss_bytes_per_min.as_ref(), &|s: &Slope| format!(
            "{} a minute",
            bytes_slope(s)
        ))),
        tool.results_bytes as f64 / 1e6,
        soak.estimate_bytes as f64 / 1e6,
        soak.budget_bytes as f64 / 1e6,
        soak.outside_windows_seen,
        soak.outside_windows_kept
    )
}

/// The proxy's resident memory (MiB) and its processes over the soak, from usage.jsonl:
/// two charts, each with its name.
fn memory_charts(cell: &CellResults, colour: &str, label: &str) -> Vec<(&'static str, String)> {
    let series = &cell.proxy_memory;
    if series.len() < 2 {
        return Vec::new();
    }
    let minutes = series.last().map_or(0.0, |p| p.0) > 600.0;
    let x_of = |t: f64| if minutes { t / 60.0 } else { t };
    let memory: Vec<(f64, f64)> = (series.iter())
        .map(|p| (x_of(p.0), p.1 / f64::from(1 << 20)))
        .collect();
    let processes: Vec<(f64, f64)> = series.iter().map(|p| (x_of(p.0), p.2)).collect();
    let x = Axis::covering(memory.iter().map(|p| p.0), false);
    let y = Axis::covering(memory.iter().map(|p| p.1).chain([0.0]), false);
    let mut plot = Plot::new(900.0, 220.0, x, y);
    let x_title = if minutes {
        "minutes of the soak"
    } else {
        "seconds of the soak"
    };
    plot.axes(x_title, "proxy memory (MiB)", &|v| short(v));
    plot.line(&memory, colour, 1.4, false);
    let most = processes.iter().map(|p| p.1).fold(1.0, f64::max);
    let y = Axis {
        min: 0.0,
        max: most + 1.0,
        log: false,
    };
    let mut counts = Plot::new(900.0, 160.0, x, y);
    counts.axes(x_title, "proxy processes", &|v| short(v));
    counts.line(&step(&processes), colour, 1.4, false);
    // Against events fired: each reading at the number fired by its time.
    let fired: Vec<f64> = cell.impact.iter().map(|e| e.requested_s).collect();
    let by_firings: Vec<(f64, f64)> = (series.iter())
        .map(|p| {
            let n = fired.partition_point(|&t| t <= p.0) as f64;
            (n, p.1 / f64::from(1 << 20))
        })
        .collect();
    let mut against = None;
    if by_firings.last().is_some_and(|p| p.0 >= 2.0) {
        let x = Axis::covering(by_firings.iter().map(|p| p.0), false);
        let y = Axis::covering(by_firings.iter().map(|p| p.1).chain([0.0]), false);
        let mut plot = Plot::new(900.0, 220.0, x, y);
        plot.axes("events fired", "proxy memory (MiB)", &|v| short(v));
        plot.dots(&by_firings, colour, 1.5, 0.6);
        against = Some(plot.finish(&format!("proxy memory against events fired, {label}")));
    }
    let mut charts = vec![
        (
            "soak memory",
            plot.finish(&format!("proxy memory over the soak, {label}")),
        ),
        (
            "soak processes",
            counts.finish(&format!("proxy processes over the soak, {label}")),
        ),
    ];
    charts.extend(against.map(|svg| ("soak memory by firings", svg)));
    charts
}

/// Each firing's p99 in the 5 s after it against its number, a line per kind of event
/// (the series the events' slopes are drawn through); a firing whose window had errors
/// is a red dot, and a note says how many. The chart, and the note.
fn firings_chart(cell: &CellResults, label: &str) -> Option<(String, String)> {
    let mut kinds: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut failed: Vec<(f64, f64, String)> = Vec::new();
    for e in &cell.impact {
        let kind = e.what.split_whitespace().next().unwrap_or("").to_owned();
        let at = match kinds.iter().position(|k| k.0 == kind) {
            Some(i) => i,
            None => {
                kinds.push((kind.clone(), Vec::new()));
                kinds.len() - 1
            }
        };
        let series = &mut kinds[at].1;
        let n = series.len() as f64 + 1.0;
        let p99 = e.requests.p99_ms_5s_after.unwrap_or(0.0);
        series.push((n, p99));
        if let Some(errors) = e.requests.errors.filter(|n| *n > 0) {
            failed.push((n, p99, format!("{kind} #{n:.0}: {errors}")));
        }
    }
    let all: Vec<(f64, f64)> = kinds.iter().flat_map(|k| k.1.iter().copied()).collect();
    if all.len() < 2 {
        return None;
    }
    let x = Axis::covering(all.iter().map(|p| p.0), false);
    let y = Axis::covering(all.iter().map(|p| p.1).chain([0.0]), false);
    let mut plot = Plot::new(900.0, 220.0, x, y);
    plot.axes(
        "firing (its number, per kind of event)",
        "p99 in the 5 s after (ms)",
        &|v| short(v),
    );
    let mut legend = Vec::new();
    for (i, (kind, p99)) in kinds.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        plot.line(p99, colour, 1.2, false);
        legend.push((kind.clone(), colour.to_owned()));
    }
    let red: Vec<(f64, f64)> = failed.iter().map(|f| (f.0, f.1)).collect();
    plot.dots(&red, ERROR_COLOUR, 3.0, 1.0);
    plot.legend(&legend);
    let note = if failed.is_empty() {
        String::new()
    } else {
        let list: Vec<&str> = failed.iter().take(30).map(|f| f.2.as_str()).collect();
        format!(
            "<p class=\"note\">Firings whose window had errors (red), with how many: {}{}.</p>",
            esc(&list.join(", ")),
            if failed.len() > 30 { ", …" } else { "" }
        )
    };
    Some((
        plot.finish(&format!("p99 after each firing, {label}")),
        note,
    ))
}

/// A series drawn as steps: each value held until the next reading.
fn step(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, p) in points.iter().enumerate() {
        if i > 0 {
            out.push((p.0, points[i - 1].1));
        }
        out.push(*p);
    }
    out
}
