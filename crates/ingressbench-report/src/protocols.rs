//! HTTP/2 and HTTP/3 against HTTP/1.1: for each target and setting measured over HTTP/1.1
//! and another protocol (a `load.protocol` matrix axis), what the protocol changed:
//! latency with the difference's interval, errors, retries; over HTTP/2 the GOAWAYs
//! received and what became of the streams they and resets cut, over HTTP/3 the QUIC
//! connections that ended and what became of the requests on them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::analysis::{self, Condition};
use crate::results::{CellResults, RunResults};
use crate::svg::esc;

const HTTP1: &str = "load.protocol=http1";
/// The protocols set beside HTTP/1.1, with their names as a reader knows them.
const OTHERS: [(&str, &str); 2] = [
    ("load.protocol=http2", "HTTP/2"),
    ("load.protocol=http3", "HTTP/3"),
];

/// The settings without the protocol (`load.rate=500`).
fn without_protocol(settings: &str) -> String {
    settings
        .split(' ')
        .filter(|part| !part.starts_with("load.protocol="))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every HTTP/2 and HTTP/3 condition with the HTTP/1.1 one of the same target and other
/// settings, and the other protocol's name.
pub(crate) fn pairs(conditions: &[Condition]) -> Vec<(&Condition, &Condition, &'static str)> {
    let mut found = Vec::new();
    for (setting, name) in OTHERS {
        for other in conditions
            .iter()
            .filter(|c| c.settings.split(' ').any(|p| p == setting))
        {
            let h1_settings = other.settings.replace(setting, HTTP1);
            if let Some(h1) =
                (conditions.iter()).find(|c| c.target == other.target && c.settings == h1_settings)
            {
                found.push((h1, other, name));
            }
        }
    }
    found
}

/// Whether a failure is one of a stream's or a connection's under HTTP/2 or HTTP/3 (what
/// a GOAWAY, a reset or a QUIC close made of a request), rather than HTTP/1.1's kinds.
fn multiplexed_failure(name: &str) -> bool {
    ["rst_stream:", "goaway_", "h3_reset:", "h3_close:", "quic_"]
        .iter()
        .any(|p| name.starts_with(p))
        || name == "protocol_error"
}

/// Stream and connection outcomes summed over a condition's cells, by name.
fn stream_outcomes(run: &RunResults, c: &Condition) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for cell in cells(run, c) {
        let Some(outcomes) = cell.summary.as_ref().and_then(|s| s.outcomes.as_ref()) else {
            continue;
        };
        for (name, n) in outcomes {
            if multiplexed_failure(name) {
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

/// GOAWAYs (HTTP/2) or QUIC connections ended (HTTP/3) within an event's window, summed
/// over the first cell's events.
fn ends_at_events(run: &RunResults, c: &Condition) -> f64 {
    cells(run, c).first().map_or(0.0, |cell| {
        (cell.impact.iter())
            .map(|e| {
                let goaways = e.goaways.as_ref().map_or(0, |g| g.goaways);
                let quic = e.quic.as_ref().map_or(0, |q| q.ended.values().sum());
                (goaways + quic) as f64
            })
            .sum()
    })
}

/// The section, or `None` when no target ran over HTTP/1.1 and another protocol at the
/// same settings.
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
        "<table><tr><th class=\"l\">target</th><th class=\"l\">settings</th><th class=\"l\">protocol</th><th>p99 HTTP/1.1 (ms)</th><th>p99 (ms)</th><th>vs HTTP/1.1</th><th>errors HTTP/1.1 / it</th><th>retried HTTP/1.1 / it</th><th>GOAWAYs or QUIC ends (at events)</th><th>most streams on one connection</th><th class=\"l\">stream and connection outcomes</th></tr>",
    );
    for (h1, other, protocol) in &pairs {
        let diff = analysis::compare_pair(h1, other, noise_floor);
        let p99_diff = diff
            .iter()
            .find(|d| d.metric == "p99")
            .map_or("-".to_owned(), |d| {
                format!("{}: {}", d.verdict.words(), analysis::percent(&d.relative))
            });
        // Counted by the HTTP/2 connections' own watch; HTTP/3's has none.
        let streams = match *protocol {
            "HTTP/2" => format!(
                "{:.0}",
                (cells(run, other).iter())
                    .filter_map(|cell| cell.number(&["connection_events", "max_streams_in_flight"]))
                    .fold(0.0, f64::max)
            ),
            _ => "-".to_owned(),
        };
        let outcomes = stream_outcomes(run, other);
        let outcomes = if outcomes.is_empty() {
            "none".to_owned()
        } else {
            outcomes
                .iter()
                .map(|(k, n)| format!("{k}: {n:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let ends = total(run, other, &["connection_events", "goaways_received"])
            + total(run, other, &["connection_events", "quic_ended"]);
        let _ = write!(
            t,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{protocol}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0} / {:.0}</td><td>{:.0} / {:.0}</td><td>{:.0} ({:.0})</td><td>{}</td><td class=\"l\">{}</td></tr>",
            esc(&other.target),
            esc(&without_protocol(&other.settings)),
            esc(&analysis::with_interval(&h1.metrics[p99], "ms")),
            esc(&analysis::with_interval(&other.metrics[p99], "ms")),
            esc(&p99_diff),
            h1.metrics[errors].value,
            other.metrics[errors].value,
            total(run, h1, &["retries", "retried"]),
            total(run, other, &["retries", "retried"]),
            ends,
            ends_at_events(run, other),
            streams,
            esc(&outcomes),
        );
    }
    t.push_str("</table>");
    let over_h3 = pairs.iter().any(|(_, _, p)| *p == "HTTP/3");
    let (title, quic) = match over_h3 {
        true => (
            "HTTP/1.1, HTTP/2 and HTTP/3",
            " Over HTTP/3 the connection is QUIC's, on UDP: a proxy's restart leaves its connections with no refusal or reset to end them (the client's idle timeout does, `quic_idle_timeout`), or closes them with a QUIC or HTTP/3 code (`quic_close:&lt;code&gt;`, `h3_close:&lt;code&gt;`); a request the server did not process (`h3_reset:request_rejected`, a rejected 0-RTT) is sent again. QUIC ends counts the connections that ended other than by the client's own close.",
        ),
        false => ("HTTP/1.1 and HTTP/2", ""),
    };
    Some(format!(
        "<section><h2>{title}</h2><p class=\"note\">Each target at the same settings over HTTP/1.1 and another protocol (all repeats). Over HTTP/2 one connection carries many requests at once, and a reload or a drain ends it with GOAWAY instead of a close: streams above the GOAWAY's last-stream-id were never processed and are sent again (retried; `goaway_unprocessed` under --retry-policy none), streams the proxy took and then lost are `goaway_processed_lost`, streams it reset are `rst_stream:&lt;code&gt;`.{quic} GOAWAYs or QUIC ends (at events) counts those that came within an event's window in the first repeat. Errors over HTTP/1.1 include the closes a reused connection raced; retried counts what the client sent again.</p>{t}</section>"
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
    fn each_http2_and_http3_condition_meets_its_http1_twin() {
        let conditions = [
            condition("nginx", "load.rate=100 load.protocol=http1"),
            condition("nginx", "load.rate=100 load.protocol=http2"),
            condition("nginx", "load.rate=500 load.protocol=http2"),
            condition("envoy", "load.rate=100 load.protocol=http1"),
            condition("envoy", "load.rate=100 load.protocol=http3"),
            condition("caddy", "load.rate=100 load.protocol=http3"),
        ];
        let found = pairs(&conditions);
        let named: Vec<_> = (found.iter())
            .map(|(h1, other, p)| (h1.target.as_str(), other.settings.as_str(), *p))
            .collect();
        assert_eq!(
            named,
            [
                ("nginx", "load.rate=100 load.protocol=http2", "HTTP/2"),
                ("envoy", "load.rate=100 load.protocol=http3", "HTTP/3"),
            ]
        );
        assert_eq!(found[0].0.settings, "load.rate=100 load.protocol=http1");
        assert_eq!(without_protocol(&found[1].1.settings), "load.rate=100");
    }

    #[test]
    fn quic_and_http3_failures_are_the_streams_and_connections_ones() {
        for name in [
            "quic_idle_timeout",
            "h3_close:no_error",
            "h3_reset:request_rejected",
            "quic_0rtt_rejected",
            "rst_stream:cancel",
            "goaway_processed_lost",
        ] {
            assert!(multiplexed_failure(name), "{name}");
        }
        for name in ["reset_after_write", "eof", "read_timeout", "502"] {
            assert!(!multiplexed_failure(name), "{name}");
        }
    }
}
