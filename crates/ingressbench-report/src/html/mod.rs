//! The HTML report: one self-contained file (inline CSS and SVG, no script, nothing
//! fetched), readable on a laptop and printable. Every string from the results is escaped.
//!
//! `render` puts the page together; the charts are `charts.rs`, the tables and sections
//! in words `sections.rs`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::analysis::{self, groups, Condition, METRICS};
use crate::results::{read_samples, CellResults, RunResults, SampleRow};
use crate::svg::{esc, PALETTE};

mod charts;
mod sections;
mod workers;

use charts::{
    bars, phases, proxy_counts_chart, proxy_cpu_chart, spectrum, sweep, time_axis, timeline,
};
use sections::{differences_table, events_section, measured_section};

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
    /// The headline as a table, for a terminal ([`crate::headline::text`]).
    pub table: String,
    /// The route-scale sentences, one per cell and step kind (also in `headline`).
    pub routes: Vec<String>,
    /// The WebSocket sentences, one per cell and kind of event (also in `headline`).
    pub websocket: Vec<String>,
    /// The capacity sentences, one per search (also leading `headline`).
    pub capacity: Vec<String>,
    /// The soak sentences, one per soak cell, those that found growth first (also
    /// leading `headline`).
    pub soak: Vec<String>,
    /// The warnings grouped by kind: the kind and its warnings.
    pub warning_groups: Vec<(String, Vec<String>)>,
    /// Warnings (generator behind, failed cells, too few requests, unreadable files).
    pub warnings: Vec<String>,
}

/// Renders the report of `run`; `noise_floor` (0.01 for 1%) is the smallest relative
/// difference that counts.
pub fn render(run: &RunResults, noise_floor: f64, baseline: Option<&str>) -> Report {
    let mut conditions = analysis::conditions(run, 0x1b_e5c4);
    if let Some(baseline) = baseline {
        // The baseline first at each setting: the differences are from it.
        conditions.sort_by_key(|c| c.target != baseline);
    }
    let diffs = analysis::differences(&conditions, noise_floor);
    let mut headline = analysis::headline(&conditions, &diffs);
    let warnings = warnings(run);
    let warning_groups = crate::headline::group_warnings(&warnings);
    let rows = crate::headline::rows(run, &conditions, &diffs);
    let colours = target_colours(&conditions);
    let mut charts = Vec::new();
    // Route scale: its sentences join the headline's, its section follows the events.
    let (routes_section, routes) = crate::routes::section(run, &colours, &mut charts)
        .map_or((None, Vec::new()), |(html, lines)| (Some(html), lines));
    headline.extend(routes.iter().cloned());
    // WebSockets: what each event cut; its sentences join the headline's.
    let (websocket_section, websocket) = crate::websocket::section(run, &colours, &mut charts)
        .map_or((None, Vec::new()), |(html, lines)| (Some(html), lines));
    headline.extend(websocket.iter().cloned());
    // Capacity: its sentences lead the headline, its section follows it.
    let (capacity_section, capacity) = crate::capacity::section(run, &colours, &mut charts)
        .map_or((None, Vec::new()), |(html, lines)| (Some(html), lines));
    headline.splice(0..0, capacity.iter().cloned());
    // Soaks: what grew leads the headline; the section follows the events.
    let (soak_section, soak) = crate::soak::section(run, &colours, &mut charts)
        .map_or((None, Vec::new()), |(html, lines)| (Some(html), lines));
    headline.splice(0..0, soak.iter().cloned());
    let mut body = String::new();
    let name = run.record.name();
    let status = run.record.status();
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
    if !run.record.left_out.is_empty() {
        let _ = write!(
            body,
            "<p class=\"note\">Left out, not run: {}.</p>",
            esc(&run.record.left_out.join("; "))
        );
    }
    // Headline: the table, then the warnings by kind, then the sentences.
    body.push_str("<section><h2>Headline</h2>");
    body.push_str(&crate::headline::html(&rows, &|s: &str| esc(s).to_string()));
    body.push_str("<p class=\"note\">Latency from each request's intended send time, over every measured request; under each figure its 95% bootstrap interval over repeats (or over one-second windows of a single run). The verdict is p99's against the first target at the same settings (or <code>report --baseline</code>'s); a difference whose interval reaches inside the noise floor is no measurable difference. Errors: every failed request, with the events (numbered as in the charts and the events table) whose window had the most. Took effect: from each event's request until the traffic showed it, per kind, median / worst over every repeat.</p>");
    if !warning_groups.is_empty() {
        body.push_str("<div class=\"warnings\"><h3>Warnings</h3><ul>");
        for (kind, members) in &warning_groups {
            let _ = write!(
                body,
                "<li><details><summary>{} × {}</summary><ul>",
                members.len(),
                esc(kind)
            );
            for w in members {
                let _ = write!(body, "<li>{}</li>", esc(w));
            }
            body.push_str("</ul></details></li>");
        }
        body.push_str("</ul></div>");
    }
    body.push_str("<ul class=\"headline\">");
    for line in &headline {
        let _ = write!(body, "<li>{}</li>", esc(line));
    }
    body.push_str("</ul></section>");
    if let Some(section) = &capacity_section {
        body.push_str(section);
    }
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
        let counted = proxy_counts_chart(cell, &title, x).or_else(|| {
            (cell.proxy_counts_unread.as_ref())
                .map(|why| format!("<p class=\"note\">{}</p>", esc(why)))
        });
        let _ = write!(
            body,
            "<figure class=\"panel\"><figcaption>{}</figcaption><div class=\"log\">{log}</div><div class=\"lin\">{lin}</div>{}{}</figure>",
            esc(&title),
            cpu.as_deref().unwrap_or_default(),
            counted.as_deref().unwrap_or_default()
        );
        charts.push((format!("timeline {title}"), log));
        if let Some(cpu) = cpu {
            charts.push((format!("proxy cpu {title}"), cpu));
        }
        if let Some(counted) = counted.filter(|c| c.starts_with("<svg")) {
            charts.push((format!("proxy counts {title}"), counted));
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
    if let Some(section) = &routes_section {
        body.push_str(section);
    }
    if let Some(section) = &websocket_section {
        body.push_str(section);
    }
    if let Some(section) = &soak_section {
        body.push_str(section);
    }
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
    if let Some(section) = workers::section(run, &mut charts) {
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
        table: crate::headline::text(&rows),
        routes,
        websocket,
        capacity,
        soak,
        warning_groups,
        warnings,
    }
}

const CSS: &str = "body{font-family:system-ui,sans-serif;max-width:1000px;margin:1em auto;padding:0 1em;color:#222;line-height:1.4}h1{margin-bottom:.2em}h2{border-bottom:1px solid #ccc;margin-top:1.6em}figure{margin:.6em 0}figcaption{font-weight:600;font-size:.9em}svg{max-width:100%;height:auto}.note{color:#555;font-size:.85em}.warnings{background:#fff4e5;border-left:4px solid #e69f00;padding:.2em 1em}.headline-table td.good{background:#e3f4e1}.headline-table td.bad{background:#fbe3e1}.headline-table td.same{color:#555}.headline-table .ci{color:#666;font-size:.85em;white-space:nowrap}.headline-table td.nowrap{white-space:nowrap}.headline-table caption{text-align:left;color:#555;font-size:.9em}.status-incomplete,.status-failed,.status-cut-short{color:#b00}.bars{display:flex;flex-wrap:wrap;gap:4px}table{border-collapse:collapse;font-size:.85em;margin:.6em 0}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}th{background:#f5f5f5}td.l,th.l{text-align:left}pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:.8em;max-height:30em}.scale input{margin-left:1em}.swatch{display:inline-block;width:.8em;height:.8em;margin:0 .3em 0 .8em}.scale .lin{display:none}#ylin:checked~figure .lin{display:block}#ylin:checked~figure .log{display:none}@media print{.scale input,.scale label{display:none}details{display:block}details>*{display:block}}";

/// `text`, or `instead` when it is empty (a field an older record lacks).
pub(crate) fn non_empty<'a>(text: &'a str, instead: &'a str) -> &'a str {
    if text.is_empty() {
        instead
    } else {
        text
    }
}

fn description(run: &RunResults) -> String {
    let text = run.record.scenario_text.as_deref().unwrap_or_default();
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
    if let Some(why) = &run.record.cut_short {
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
        let attempts = run.record.cells.get(c.index).map(|e| &e.earlier_attempts);
        for a in attempts.into_iter().flatten() {
            out.push(format!(
                "{label}: an earlier attempt was cut short ({}); not in these figures, its files are in cells/{}",
                a.summary.as_ref().map_or_else(
                    || "before any request was answered".into(),
                    |s| s.said()
                ),
                a.dir.as_deref().unwrap_or("?")
            ));
        }
        for w in c.summary.iter().flat_map(|s| &s.warnings) {
            out.push(format!("{label}: {w}"));
        }
    }
    out.extend(run.notes.iter().map(|n| format!("unreadable: {n}")));
    out
}
