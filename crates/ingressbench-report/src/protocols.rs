//! The HTTP/1.1 against HTTP/2 section: for each target and setting measured over both
//! (a `load.protocol` matrix axis), what the protocol changed: latency with the
//! difference's interval, errors, retries, and over HTTP/2 the GOAWAYs received and
//! what became of the streams they and resets cut.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::analysis::{self, Condition};
use crate::results::{CellResults, RunResults};
use crate::svg::esc;

const HTTP1: &str = "load.protocol=http1";
const HTTP2: &str = "load.protocol=http2";

/// The settings without the protocol (`load.rate=500`).
fn without_protocol(settings: &str) -> String {
    settings
        .split(' ')
        .filter(|part| !part.starts_with("load.protocol="))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every HTTP/2 condition with the HTTP/1.1 one of the same target and other settings.
pub(crate) fn pairs(conditions: &[Condition]) -> Vec<(&Condition, &Condition)> {
    conditions
        .iter()
        .filter(|c| c.settings.split(' ').any(|p| p == HTTP2))
        .filter_map(|h2| {
            let h1_settings = h2.settings.replace(HTTP2, HTTP1);
            conditions
                .iter()
                .find(|c| c.target == h2.target && c.settings == h1_settings)
                .map(|h1| (h1, h2))
        })
        .collect()
}

/// HTTP/2 stream outcomes summed over a condition's cells, by name.
fn stream_outcomes(run: &RunResults, c: &Condition) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for cell in cells(run, c) {
        let Some(outcomes) = cell.summary.as_ref().and_then(|s| s.outcomes.as_ref()) else {
            continue;
        };
        for (name, n) in outcomes {
            let stream = name.starts_with("rst_stream:")
                || name.starts_with("goaway_")
                || name == "protocol_error";
            if stream {
                *out.entry(name.clone()).or_default() += n.as_f64().unwrap_or(0.0);
            }
        }
    }
    out
}

fn cells<'a>(run: &'a RunResults, c: &Condition) -> Vec<&'a CellResults> {
    c.cells.iter().filter_map(|&i| run.cells.get(i)).collect()
}

fn total(run: &RunResults, c: &Condition, path: &[&str]) -> f64 {
    cells(run, c)
        .iter()
        .filter_map(|cell| cell.number(path))
        .fold(0.0, |a, b| a + b)
}

/// GOAWAYs that came within an event's window, summed over the first cell's events.
fn goaways_at_events(run: &RunResults, c: &Condition) -> f64 {
    cells(run, c).first().map_or(0.0, |cell| {
        (cell.impact.iter())
            .filter_map(|e| Some(e.goaways.as_ref()?.goaways as f64))
            .sum()
    })
}

/// The section, or `None` when no target ran over both protocols at the same settings.
pub(crate) fn section(
    run: &RunResults,
    conditions: &[Condition],
    noise_floor: f64,
) -> Option<String> {
    let pairs = pairs(conditions);
    if pairs.is_empty() {
        return None;
    }
    let (p99, errors) = (
        analysis::metric_index("p99").unwrap_or(2),
        analysis::metric_index("errors").unwrap_or(5),
    );
    let mut t = String::from(
        "<table><tr><th class=\"l\">target</th><th class=\"l\">settings</th><th>p99 HTTP/1.1 (ms)</th><th>p99 HTTP/2 (ms)</th><th>HTTP/2 vs HTTP/1.1</th><th>errors HTTP/1.1 / HTTP/2</th><th>retried HTTP/1.1 / HTTP/2</th><th>GOAWAYs (at events)</th><th>most streams on one connection</th><th class=\"l\">HTTP/2 stream outcomes</th></tr>",
    );
    for (h1, h2) in &pairs {
        let diff = analysis::compare_pair(h1, h2, noise_floor);
        let p99_diff = diff
            .iter()
            .find(|d| d.metric == "p99")
            .map_or("-".to_owned(), |d| {
                format!("{}: {}", d.verdict.words(), analysis::percent(&d.relative))
            });
        let streams = cells(run, h2)
            .iter()
            .filter_map(|cell| cell.number(&["connection_events", "max_streams_in_flight"]))
            .fold(0.0, f64::max);
        let outcomes = stream_outcomes(run, h2);
        let outcomes = if outcomes.is_empty() {
            "none".to_owned()
        } else {
            outcomes
                .iter()
                .map(|(k, n)| format!("{k}: {n:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = write!(
            t,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0} / {:.0}</td><td>{:.0} / {:.0}</td><td>{:.0} ({:.0})</td><td>{:.0}</td><td class=\"l\">{}</td></tr>",
            esc(&h2.target),
            esc(&without_protocol(&h2.settings)),
            esc(&analysis::with_interval(&h1.metrics[p99], "ms")),
            esc(&analysis::with_interval(&h2.metrics[p99], "ms")),
            esc(&p99_diff),
            h1.metrics[errors].value,
            h2.metrics[errors].value,
            total(run, h1, &["retries", "retried"]),
            total(run, h2, &["retries", "retried"]),
            total(run, h2, &["connection_events", "goaways_received"]),
            goaways_at_events(run, h2),
            streams,
            esc(&outcomes),
        );
    }
    t.push_str("</table>");
    Some(format!(
        "<section><h2>HTTP/1.1 and HTTP/2</h2><p class=\"note\">Each target at the same settings over both protocols (all repeats). Over HTTP/2 one connection carries many requests at once, and a reload or a drain ends it with GOAWAY instead of a close: streams above the GOAWAY's last-stream-id were never processed and are sent again (retried; `goaway_unprocessed` under --retry-policy none), streams the proxy took and then lost are `goaway_processed_lost`, streams it reset are `rst_stream:&lt;code&gt;`. GOAWAYs (at events) counts those that arrived within an event's window in the first repeat. Errors over HTTP/1.1 include the closes a reused connection raced; retried counts what the client sent again.</p>{t}</section>"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingressbench_stats::compare::Estimate;

    fn condition(target: &str, settings: &str) -> Condition {
        let e = Estimate {
            value: 1.0,
            low: 1.0,
            high: 1.0,
        };
        Condition {
            target: target.into(),
            settings: settings.into(),
            cells: vec![],
            metrics: vec![e; 6],
            draws: vec![vec![1.0; 4]; 6],
            units_p99: vec![1.0],
            basis: "repeats",
            requests: 1.0,
        }
    }

    #[test]
    fn each_http2_condition_meets_its_http1_twin() {
        let conditions = [
            condition("nginx", "load.rate=100 load.protocol=http1"),
            condition("nginx", "load.rate=100 load.protocol=http2"),
            condition("nginx", "load.rate=500 load.protocol=http2"),
            condition("envoy", "load.rate=100 load.protocol=http1"),
        ];
        let found = pairs(&conditions);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0.settings, "load.rate=100 load.protocol=http1");
        assert_eq!(found[0].1.settings, "load.rate=100 load.protocol=http2");
        assert_eq!(without_protocol(&found[0].1.settings), "load.rate=100");
    }
}
