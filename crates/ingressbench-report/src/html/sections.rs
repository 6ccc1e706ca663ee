//! The report's tables and sections in words: what the client and each proxy cost, the
//! differences between targets, each event's impact, what was measured and how, and the
//! configuration files the proxies ran with. Not the charts ([`super::charts`]).

use std::fmt::Write as _;
use std::path::Path;

use super::charts::error_strip;
use super::{first_cell, samples_of, MAX_CONFIG_BYTES, MAX_CONFIG_FILES};
use crate::analysis::{self, Condition, Difference, METRICS};
use crate::results::{CellResults, RunResults};
use crate::svg::esc;
use ingressbench_results::site::Spent;

/// What a condition's cells add up to besides latency: requests retried after the server
/// closed a reused connection, idle connections it closed (retired before use), the
/// proxies' CPU per 1,000 requests (mean over cells) and their peak memory.
pub(super) fn client_and_cost(run: &RunResults, c: &Condition) -> [String; 4] {
    let cells: Vec<&CellResults> = c.cells.iter().filter_map(|&i| run.cells.get(i)).collect();
    let total = |path: &[&str]| -> f64 { cells.iter().filter_map(|cell| cell.number(path)).sum() };
    let proxy = |figure: fn(&Spent) -> Option<f64>| -> Vec<f64> {
        (cells.iter())
            .filter_map(|cell| figure(cell.usage.as_ref()?.by_role.get("proxy")?))
            .collect()
    };
    let cpu = proxy(|s| s.cpu_ms_per_1000_requests);
    let rss = proxy(|s| Some(s.rss_peak_bytes as f64));
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

pub(super) fn differences_table(
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

pub(super) fn events_section(run: &RunResults, conditions: &[Condition]) -> String {
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
            "<h3>{} {}</h3><table><tr><th>#</th><th class=\"l\">event</th><th>requested (s)</th><th>applied (s)</th><th>took effect (s)</th><th>control plane (ms)</th><th title=\"A route change: until its controller reported it in the route's status. A controller's restart: until it was complete (every replica new and available)\">controller reported or restarted (ms)</th><th>proxy (ms)</th><th>old and new answers mixed (ms)</th><th title=\"Every failed request in the event's window: exact (runs before every failure was kept show an estimate from the sample, marked est.)\">errors</th><th title=\"HTTP/2: GOAWAY frames received in the event's window, on how many connections, and how long after the event the first came. HTTP/3: the QUIC connections that ended in the window, by what ended them (the client's own closes aside), and the handshakes of new ones\">GOAWAYs (connections; first after s) or QUIC connections ended; new</th><th>first / last error after (s)</th><th>longest failure run</th><th>max (ms)</th><th>p99 5 s before / after / 5-15 s after (ms)</th><th>proxy CPU: cores before / peak after; extra in 5 s (ms)</th><th class=\"l\">errors from 2 s before to 8 s after</th><th class=\"l\" title=\"The client's errors in the event's window beside what each proxy itself counted over the same window (read once a second from its stats: Envoy's admin interface, HAProxy's runtime API, nginx's error log)\">client and proxy</th></tr>",
            esc(&c.target),
            esc(&c.settings)
        );
        for (i, e) in cell.impact.iter().enumerate() {
            let r = &e.requests;
            let num = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.3}"));
            let errors = match (r.errors, r.estimated_errors) {
                (Some(n), _) => n.to_string(),
                (None, Some(n)) => format!("~{n:.0} est."),
                (None, None) => "-".into(),
            };
            let longest = match (r.longest_failure_run, r.longest_failure_run_basis.as_str()) {
                (Some(n), "sampled") => format!("{n} (between sampled successes)"),
                (Some(n), _) => n.to_string(),
                (None, _) => "-".into(),
            };
            // A change no answer showed before the next event or the load's end says how
            // long the traffic was watched for it.
            let took_effect = match (e.took_effect_s, r.window_s) {
                (Some(t), _) => format!("{t:.3}"),
                (None, Some(w)) => format!("not within {w:.2} s"),
                (None, None) => "-".to_owned(),
            };
            let mixed_ms = e
                .mixed_window_s
                .map_or("-".to_owned(), |v| format!("{:.1}", v * 1e3));
            // The control plane's part (asked until the proxies were told: the lab's
            // propagation delay, or a cluster's EndpointSlices) and the proxy's (told until
            // the traffic showed it).
            let part = |from: Option<f64>, to: Option<f64>| match (from, to) {
                (Some(a), Some(b)) => format!("{:.0}", (b - a) * 1e3),
                _ => "-".to_owned(),
            };
            let cpu_cell = e.cpu.get("proxy").map_or("-".to_owned(), |cpu| {
                let cores = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
                format!(
                    "{} / {}; {}",
                    cores(cpu.cores_before),
                    cores(cpu.peak_cores_after),
                    cpu.extra_cpu_ms
                        .map_or("-".to_owned(), |v| format!("{v:+.0}"))
                )
            });
            let goaways = match (&e.goaways, &e.quic) {
                (Some(g), _) => format!(
                    "{} ({}; {})",
                    g.goaways,
                    g.goaway_connections,
                    num(Some(g.first_goaway_after_s))
                ),
                (None, Some(q)) => quic_connections(q),
                (None, None) => "-".to_owned(),
            };
            let requested = Some(e.requested_s);
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td title=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td><td>{}</td><td>{}</td><td>{} / {} / {}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
                i + 1,
                esc(&e.what),
                num(requested),
                num(e.applied_s),
                esc(&e.took_effect_basis),
                esc(&took_effect),
                part(requested, e.applied_s),
                part(requested, e.completed_s.or(e.reported_s)),
                part(e.applied_s, e.took_effect_s),
                mixed_ms,
                errors,
                esc(&goaways),
                num(r.first_error_after_s),
                num(r.last_error_after_s),
                longest,
                num(r.max_latency_ms),
                num(r.p99_ms_5s_before),
                num(r.p99_ms_5s_after),
                num(r.p99_ms_5_to_15s_after),
                esc(&cpu_cell),
                error_strip(&samples, e.requested_s + cell.measure_from_s),
                esc(&crate::counted::sentence(e).unwrap_or_else(|| "-".into())),
            );
        }
        out.push_str("</table>");
    }
    if out.is_empty() {
        return String::new();
    }
    format!("<section><h2>Events</h2><p class=\"note\">Each event with its times (seconds from the start of measurement), the control plane's part (asked until the proxies were told: the lab's propagation delay, or in a cluster until the Service's EndpointSlices showed it), when the controller reported a route change in the route's status (Gateway API), and the proxy's part (told until the traffic showed it; a change no answer showed before the next event or the load's end says how long it was watched for), and what it did to the requests after it (docs/RESULTS.md): errors, their first and last and the longest run of consecutive failures are exact, from every failed request (kept whatever the sample rate); latency from the sampled requests. The strip shows failed requests per 100 ms around it. A route change or reload took effect with the first answer that carried its configuration generation; old and new answers mixed until the last answer of an earlier one. Proxy CPU is read once a second from /proc (10 ms ticks): the mean before the event, the highest second in the 5 s after it, and what those 5 s cost beyond the rate before.</p>{out}</section>")
}

/// An event's QUIC connections in words: how many ended and by what, how many were
/// opened anew (and whether their 0-RTT data was taken), and whether the client kept them
/// all (`3 ended (quic_idle_timeout 3); 3 new (0-RTT rejected 3)`).
fn quic_connections(q: &ingressbench_results::impact::QuicConnections) -> String {
    let ended: u64 = q.ended.values().sum();
    let by: Vec<String> = q
        .ended
        .iter()
        .map(|(how, n)| format!("{how} {n}"))
        .collect();
    let by = if by.is_empty() {
        String::new()
    } else {
        format!(" ({})", by.join(", "))
    };
    let part = if q.complete { "" } else { ", a part" };
    let early = match (q.zero_rtt_accepted, q.zero_rtt_rejected) {
        (0, 0) => String::new(),
        (taken, 0) => format!(" (0-RTT taken {taken})"),
        (0, rejected) => format!(" (0-RTT rejected {rejected})"),
        (taken, rejected) => format!(" (0-RTT taken {taken}, rejected {rejected})"),
    };
    format!("{ended} ended{by}; {} new{early}{part}", q.opened)
}

pub(super) fn measured_section(run: &RunResults) -> String {
    let r = &run.record;
    let mut out = String::from("<section><h2>How it was measured</h2><table>");
    let machine = &r.machine;
    let rows = [
        (
            "tool",
            format!("ingressbench {}", r.tool_version.as_deref().unwrap_or("?")),
        ),
        (
            "machine",
            format!(
                "{}, {} cores, Linux {}",
                super::non_empty(&machine.cpu_model, "?"),
                machine.cores,
                super::non_empty(&machine.kernel, "?")
            ),
        ),
        (
            "command",
            r.command
                .as_deref()
                .unwrap_or("ingressbench load")
                .to_owned(),
        ),
        (
            "quick",
            match r.quick {
                true => format!("yes: durations x{:.3}", r.quick_factor),
                false => "no".into(),
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
    if let Some(text) = &r.scenario_text {
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
pub(super) fn config_files(dir: &Path) -> Vec<(String, String)> {
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
