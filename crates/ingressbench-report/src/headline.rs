//! The headline as a table, read in five seconds: a row per target and setting, with p50
//! and p99 and their intervals, the errors and the events they fell in, how long each
//! kind of event took to show in the traffic (median and worst), the proxy's CPU per 1,000
//! requests and a verdict on p99 against the baseline (the first target at the same
//! settings, or the one `report --baseline` names). The report puts it on top, `run` and
//! `report` print it; the sentences of [`crate::analysis::headline`] follow it. Warnings,
//! grouped by kind, are here too ([`group_warnings`]).

use std::collections::BTreeMap;

use ingressbench_stats::compare::{Estimate, Verdict};

use crate::analysis::{metric_index, ms, Condition, Difference};
use crate::results::{CellResults, RunResults};

/// One row: a target at one setting, over its repeats.
#[derive(Debug)]
pub struct Row {
    /// The target's label (a column of the run's matrix).
    pub target: String,
    /// The settings label (`load.rate=500`), empty without a matrix.
    pub settings: String,
    /// p50 and p99 in ms, with their intervals.
    pub p50: Estimate,
    /// See `p50`.
    pub p99: Estimate,
    /// Failed requests over every repeat, and requests sent.
    pub errors: u64,
    /// Requests over every repeat.
    pub requests: u64,
    /// The events with errors in their window (first repeat): the event's short name and
    /// its errors, most first.
    pub error_events: Vec<(String, u64)>,
    /// Per kind of event (scale, kill, route change, …): how many, and the median and
    /// worst time from the request to the traffic showing it, in seconds (over every
    /// repeat); kinds none of whose events showed have `None`.
    pub took_effect: Vec<TookEffect>,
    /// The proxies' CPU per 1,000 requests (ms, mean over repeats).
    pub cpu_per_1k: Option<f64>,
    /// The p99 verdict against the baseline and the relative difference; `None` for the
    /// baseline itself.
    pub verdict: Option<(Verdict, Estimate)>,
}

/// One kind of event in a row.
#[derive(Clone, Debug, PartialEq)]
pub struct TookEffect {
    /// Its name (`scale`, `route change`).
    pub kind: String,
    /// How many there were.
    pub count: usize,
    /// Of them, route changes no answer carried before a later change did: the proxies
    /// took the later one first (a controller that coalesces changes). Their times are
    /// the later one's, so they are left out of `figures`.
    pub superseded: usize,
    /// The median and worst seconds until the traffic showed them (`None`: none showed).
    pub figures: Option<(f64, f64)>,
    /// What the figures measure.
    pub shown: Shown,
}

/// What a kind's times measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    /// Until the traffic showed the events.
    InTraffic,
    /// None showed in the traffic (an upgrade to a release that answers alike): until
    /// the rollouts they made were complete.
    RolloutComplete,
}

/// The rows of `conditions` (in their order), with `diffs` their differences from the
/// first of each settings group.
pub fn rows(run: &RunResults, conditions: &[Condition], diffs: &[Difference]) -> Vec<Row> {
    let p50 = metric_index("p50").unwrap_or(1);
    let p99 = metric_index("p99").unwrap_or(2);
    conditions
        .iter()
        .map(|c| {
            let cells: Vec<&CellResults> =
                c.cells.iter().filter_map(|&i| run.cells.get(i)).collect();
            let count = |path: &[&str]| -> u64 {
                cells
                    .iter()
                    .filter_map(|cell| cell.number(path))
                    .sum::<f64>() as u64
            };
            let verdict = diffs
                .iter()
                .find(|d| d.metric == "p99" && d.settings == c.settings && d.other == c.target)
                .map(|d| (d.verdict, d.relative));
            Row {
                target: c.target.clone(),
                settings: c.settings.clone(),
                p50: c.metrics[p50],
                p99: c.metrics[p99],
                errors: count(&["requests", "errors"]),
                requests: count(&["requests", "total"]),
                error_events: cells.first().map(|c| error_events(c)).unwrap_or_default(),
                took_effect: took_effect_by_kind(cells.iter().flat_map(|c| c.impact.iter())),
                cpu_per_1k: mean_cpu(&cells),
                verdict,
            }
        })
        .collect()
}

/// The events of `cell` with errors in their window, most first.
fn error_events(cell: &CellResults) -> Vec<(String, u64)> {
    let mut events: Vec<(String, u64)> = cell
        .impact
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let n = e.requests.errors.unwrap_or(0);
            (n > 0).then(|| (format!("#{} {}", i + 1, short_event(&e.what)), n))
        })
        .collect();
    events.sort_by_key(|e| std::cmp::Reverse(e.1));
    events
}

/// Per kind of event over every cell: how many, and the median and worst time from the
/// request to the traffic showing it.
fn took_effect_by_kind<'a>(
    events: impl Iterator<Item = &'a ingressbench_results::impact::ImpactEntry>,
) -> Vec<TookEffect> {
    #[derive(Default)]
    struct Slot {
        count: usize,
        superseded: usize,
        seen: Vec<f64>,
        complete: Vec<f64>,
    }
    let mut by_kind: BTreeMap<String, Slot> = BTreeMap::new();
    for e in events {
        let slot = by_kind.entry(event_kind(&e.what)).or_default();
        slot.count += 1;
        if e.generations.first().is_some_and(|g| g.superseded()) {
            slot.superseded += 1;
        } else if let Some(seen) = e.took_effect_s {
            slot.seen.push((seen - e.requested_s).max(0.0));
        }
        if let Some(complete) = e.completed_s {
            slot.complete.push((complete - e.requested_s).max(0.0));
        }
    }
    let median_and_worst = |mut times: Vec<f64>| {
        times.sort_by(f64::total_cmp);
        (!times.is_empty()).then(|| (times[times.len() / 2], times[times.len() - 1]))
    };
    by_kind
        .into_iter()
        .map(|(kind, slot)| {
            let (figures, shown) = match median_and_worst(slot.seen) {
                Some(figures) => (Some(figures), Shown::InTraffic),
                None => (median_and_worst(slot.complete), Shown::RolloutComplete),
            };
            TookEffect {
                kind,
                count: slot.count,
                superseded: slot.superseded,
                figures,
                shown,
            }
        })
        .collect()
}

/// The proxies' CPU per 1,000 requests, the mean over the cells that measured it.
fn mean_cpu(cells: &[&CellResults]) -> Option<f64> {
    let cpu: Vec<f64> = cells
        .iter()
        .filter_map(|cell| {
            cell.usage
                .as_ref()?
                .by_role
                .get("proxy")?
                .cpu_ms_per_1000_requests
        })
        .collect();
    (!cpu.is_empty()).then(|| cpu.iter().sum::<f64>() / cpu.len() as f64)
}

/// What an event did, in a few words for a chart's marker: `scale 3→4`, `CORS on`,
/// `kill echo-2`, `revert`.
pub fn short_event(what: &str) -> String {
    let words: Vec<&str> = what.split_whitespace().collect();
    match words.as_slice() {
        // `scale POOL A->B`.
        ["scale", _, counts] => format!("scale {}", counts.replace("->", "→")),
        ["revert", "route", "changes"] => "revert".into(),
        _ if what.contains("CORS")
            || what.starts_with("header ")
            || what.starts_with("rewrite ") =>
        {
            what.split(", ")
                .map(|part| match part.split_whitespace().next() {
                    Some("CORS") => "CORS on".to_owned(),
                    Some("header") => format!(
                        "header {}",
                        part.split_whitespace()
                            .nth(1)
                            .unwrap_or("")
                            .trim_end_matches(':')
                    ),
                    Some(word) => word.to_owned(),
                    None => String::new(),
                })
                .collect::<Vec<_>>()
                .join(", ")
        }
        _ => {
            let mut s: String = what.chars().take(24).collect();
            if what.chars().count() > 24 {
                s.push('…');
            }
            s
        }
    }
}

/// The kind an event is counted under: scale, kill, terminate, stall, reload, route
/// change, or its first word.
pub fn event_kind(what: &str) -> String {
    let first = what.split_whitespace().next().unwrap_or("event");
    match first {
        "scale" | "kill" | "terminate" | "stall" | "reload" => first.to_owned(),
        "CORS" | "header" | "rewrite" | "revert" => "route change".to_owned(),
        _ if what.contains("CORS") => "route change".to_owned(),
        other => other.to_owned(),
    }
}

/// The table as HTML (every string escaped by the caller's `esc`).
pub fn html(rows: &[Row], esc: &dyn Fn(&str) -> String) -> String {
    let settings = varying_settings(rows);
    let with_settings = settings.iter().any(|s| !s.is_empty());
    let mut out = String::from("<table class=\"headline-table\">");
    let shared = shared_settings(rows);
    if !shared.is_empty() {
        out.push_str(&format!("<caption>every row at {}</caption>", esc(&shared)));
    }
    out.push_str("<tr><th class=\"l\">target</th>");
    if with_settings {
        out.push_str("<th class=\"l\">settings</th>");
    }
    out.push_str("<th>p50 (ms)</th><th>p99 (ms)</th><th class=\"l\">p99 against the baseline</th><th class=\"l\">errors (events they fell in)</th><th class=\"l\">took effect: median / worst (s)</th><th title=\"the proxies' CPU per 1,000 requests\">proxy CPU / 1k req</th></tr>");
    // A value over its interval, the interval small.
    let figure = |e: &Estimate| match estimate(e).split_once(" (") {
        Some((value, interval)) => format!(
            "{}<br><span class=\"ci\">{}</span>",
            esc(value),
            esc(interval.trim_end_matches(')'))
        ),
        None => esc(&estimate(e)),
    };
    for (r, settings) in rows.iter().zip(&settings) {
        let (class, verdict) = verdict_words(r);
        out.push_str(&format!(
            "<tr><td class=\"l\"><b>{}</b></td>",
            esc(&r.target)
        ));
        if with_settings {
            out.push_str(&format!("<td class=\"l\">{}</td>", esc(settings)));
        }
        let took: Vec<String> = took_effect(r).split("; ").map(esc).collect();
        out.push_str(&format!(
            "<td>{}</td><td>{}</td><td class=\"l {class}\">{}</td><td class=\"l{}\">{}</td><td class=\"l nowrap\">{}</td><td>{}</td></tr>",
            figure(&r.p50),
            figure(&r.p99),
            esc(&verdict),
            if r.errors > 0 { " bad" } else { "" },
            esc(&errors(r)),
            took.join("<br>"),
            esc(&cpu(r)),
        ));
    }
    out.push_str("</table>");
    out
}

/// The settings every row shares (`load.rate=500`), if there are rows.
fn shared_settings(rows: &[Row]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    first
        .settings
        .split_whitespace()
        .filter(|part| {
            rows.iter()
                .all(|r| r.settings.split_whitespace().any(|p| p == *part))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Each row's settings without the parts every row shares (`load.protocol=http1` when
/// every row is at `load.rate=500`).
fn varying_settings(rows: &[Row]) -> Vec<String> {
    let parts: Vec<Vec<&str>> = rows
        .iter()
        .map(|r| r.settings.split_whitespace().collect())
        .collect();
    let shared = |part: &&str| parts.iter().all(|p| p.contains(part));
    parts
        .iter()
        .map(|p| {
            p.iter()
                .filter(|part| !shared(part))
                .copied()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// The table as text for a terminal: one line per row, columns aligned.
pub fn text(rows: &[Row]) -> String {
    let settings = varying_settings(rows);
    let with_settings = settings.iter().any(|s| !s.is_empty());
    let mut table: Vec<Vec<String>> = vec![[
        "target",
        "settings",
        "p50 ms",
        "p99 ms",
        "p99 vs baseline",
        "errors (events)",
        "took effect med/worst s",
        "CPU/1k",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()];
    for (r, settings) in rows.iter().zip(settings) {
        table.push(vec![
            r.target.clone(),
            settings,
            estimate(&r.p50),
            estimate(&r.p99),
            verdict_words(r).1,
            errors(r),
            took_effect(r),
            cpu(r),
        ]);
    }
    if !with_settings {
        for row in &mut table {
            row.remove(1);
        }
    }
    let columns = table[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            table
                .iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let shared = shared_settings(rows);
    let caption = (!shared.is_empty()).then(|| format!("every row at {shared}"));
    caption
        .into_iter()
        .chain(table.iter().map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            cells.join("  ").trim_end().to_owned()
        }))
        .collect::<Vec<_>>()
        .join("\n")
}

fn estimate(e: &Estimate) -> String {
    if !e.value.is_finite() {
        return "-".into();
    }
    if (e.high - e.low).abs() < 1e-12 {
        return ms(e.value);
    }
    format!("{} ({}-{})", ms(e.value), ms(e.low), ms(e.high))
}

/// The verdict's CSS class and words.
fn verdict_words(r: &Row) -> (&'static str, String) {
    match &r.verdict {
        None => ("", "baseline".into()),
        Some((Verdict::NoMeasurableDifference, _)) => ("same", "no measurable difference".into()),
        Some((v, rel)) => (
            match v {
                Verdict::Better => "good",
                _ => "bad",
            },
            format!("{} {:+.0}%", v.words(), rel.value * 100.0),
        ),
    }
}

fn errors(r: &Row) -> String {
    if r.errors == 0 {
        return "0".into();
    }
    let mut s = format!("{} of {}", r.errors, r.requests);
    if !r.error_events.is_empty() {
        let shown: Vec<String> = r
            .error_events
            .iter()
            .take(3)
            .map(|(e, n)| format!("{e}: {n}"))
            .collect();
        let more = r.error_events.len().saturating_sub(3);
        s.push_str(&format!(
            " ({}{})",
            shown.join("; "),
            if more > 0 {
                format!("; {more} more")
            } else {
                String::new()
            }
        ));
    }
    s
}

fn took_effect(r: &Row) -> String {
    if r.took_effect.is_empty() {
        return "-".into();
    }
    r.took_effect
        .iter()
        .map(|t| {
            let (kind, n) = (&t.kind, t.count);
            let kind = match t.superseded {
                0 => format!("{kind} ×{n}"),
                k => format!("{kind} ×{n} ({k} superseded)"),
            };
            match (t.figures, t.shown) {
                (Some((median, worst)), Shown::InTraffic) => {
                    format!("{kind} {median:.2}/{worst:.2}")
                }
                (Some((median, worst)), Shown::RolloutComplete) => {
                    format!("{kind} not seen, rollout complete {median:.2}/{worst:.2}")
                }
                (None, _) => format!("{kind} not seen"),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn cpu(r: &Row) -> String {
    r.cpu_per_1k.map_or("-".into(), |v| format!("{v:.0} ms"))
}

/// Warnings grouped by kind: (the first of the kind without the cell it names, and each
/// warning of it). The kind is a warning's tag (`CONNECT RAMP`, `GENERATOR FELL BEHIND`)
/// when it has one, else what it says with its numbers and the cell it names taken out.
pub fn group_warnings(warnings: &[String]) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<(String, String, Vec<String>)> = Vec::new();
    for w in warnings {
        let key = kind_of(w);
        match groups.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, _, members)) => members.push(w.clone()),
            None => groups.push((key, without_cell(w).to_owned(), vec![w.clone()])),
        }
    }
    groups.into_iter().map(|(_, first, m)| (first, m)).collect()
}

/// A warning without the cell it begins with (`target settings (repeat N): `).
fn without_cell(warning: &str) -> &str {
    warning.split_once("): ").map_or(warning, |(_, rest)| rest)
}

fn kind_of(warning: &str) -> String {
    // `target settings (repeat N): WHAT…`: the part after the cell.
    let body = warning.split_once("): ").map_or(warning, |(_, rest)| rest);
    if let Some((tag, _)) = body.split_once(':') {
        if tag.len() > 3
            && tag
                .chars()
                .all(|c| c.is_ascii_uppercase() || c == ' ' || c == '-')
        {
            return tag.to_owned();
        }
    }
    // Each number as `#`.
    let mut words = String::new();
    for c in body.split([';', '(']).next().unwrap_or(body).chars() {
        if !c.is_ascii_digit() {
            words.push(c);
        } else if !words.ends_with('#') {
            words.push('#');
        }
    }
    words.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_get_short_names_and_kinds() {
        assert_eq!(short_event("scale echo 3->4"), "scale 3→4");
        assert_eq!(short_event("CORS https://a.example"), "CORS on");
        assert_eq!(
            short_event("header X-Bench: 1, CORS https://a"),
            "header X-Bench, CORS on"
        );
        assert_eq!(short_event("revert route changes"), "revert");
        assert_eq!(short_event("kill echo-2"), "kill echo-2");
        assert_eq!(event_kind("scale echo 3->4"), "scale");
        assert_eq!(event_kind("rewrite /a -> /b"), "route change");
        assert_eq!(event_kind("revert route changes"), "route change");
    }

    #[test]
    fn an_upgrade_no_traffic_showed_gives_its_rollouts_time_and_says_so() {
        use ingressbench_results::impact::ImpactEntry;
        let event = |what: &str, took: Option<f64>, complete: Option<f64>| ImpactEntry {
            what: what.into(),
            requested_s: 10.0,
            took_effect_s: took,
            completed_s: complete,
            ..ImpactEntry::default()
        };
        let events = [
            event("scale echo 3->4", Some(10.5), None),
            event("scale echo 4->3", Some(11.0), None),
            event("upgrade envoy-gateway 1.9.0 -> 1.9.1", None, Some(29.4)),
            event("kill echo-2", None, None),
        ];
        let kinds = took_effect_by_kind(events.iter());
        let row = |kind: &str| kinds.iter().find(|k| k.kind == kind).unwrap().clone();
        assert_eq!(
            row("scale"),
            TookEffect {
                kind: "scale".into(),
                count: 2,
                superseded: 0,
                figures: Some((1.0, 1.0)),
                shown: Shown::InTraffic
            }
        );
        let upgrade = row("upgrade");
        assert_eq!(upgrade.shown, Shown::RolloutComplete);
        assert!(
            (upgrade.figures.unwrap().0 - 19.4).abs() < 1e-9,
            "{upgrade:?}"
        );
        assert_eq!(row("kill").figures, None);
    }

    #[test]
    fn a_change_superseded_before_it_was_served_is_counted_not_timed() {
        use ingressbench_results::impact::{GenerationEffect, ImpactEntry};
        let change = |requested_s: f64, took: f64, with_it: u64| ImpactEntry {
            what: "routes to green".into(),
            requested_s,
            took_effect_s: Some(took),
            generations: vec![GenerationEffect {
                answers_after: 100,
                answers_with_it: Some(with_it),
                ..GenerationEffect::default()
            }],
            ..ImpactEntry::default()
        };
        // The second was never answered as itself: its time is the third's.
        let events = [
            change(1.0, 1.1, 50),
            change(2.0, 3.4, 0),
            change(3.0, 3.4, 100),
        ];
        let kinds = took_effect_by_kind(events.iter());
        assert_eq!(kinds.len(), 1);
        assert_eq!((kinds[0].count, kinds[0].superseded), (3, 1));
        let (median, worst) = kinds[0].figures.unwrap();
        assert!(
            (median - 0.4).abs() < 1e-9 && (worst - 0.4).abs() < 1e-9,
            "{kinds:?}"
        );
        // Results written before the exact count was kept: none is taken for superseded.
        let mut old = change(2.0, 3.4, 0);
        old.generations[0].answers_with_it = None;
        assert_eq!(took_effect_by_kind([old].iter())[0].superseded, 0);
    }

    #[test]
    fn warnings_group_by_their_tag_or_their_words() {
        let groups = group_warnings(&[
            "nginx load.rate=500 (repeat 1): CONNECT RAMP: the 10 connections were still opening 12 ms after".into(),
            "envoy load.rate=500 (repeat 1): CONNECT RAMP: the 10 connections were still opening 30 ms after".into(),
            "caddy  (repeat 2): retried 4 requests after a reused connection closed".into(),
            "haproxy  (repeat 1): retried 17 requests after a reused connection closed".into(),
        ]);
        assert_eq!(groups.len(), 2, "{groups:?}");
        assert_eq!(
            groups[0].0,
            "CONNECT RAMP: the 10 connections were still opening 12 ms after"
        );
        assert_eq!(groups[0].1.len(), 2);
        assert_eq!(groups[1].1.len(), 2);
    }
}
