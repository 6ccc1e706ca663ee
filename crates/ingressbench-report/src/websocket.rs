//! A long-lived load's own results (`websocket.json`, `sse.json`, `grpc.json` or
//! `grpc-stream.json` in a cell, `load --stream-json`): WebSockets (event streams, gRPC
//! connections or streams) opened, each close (who, code or gRPC status, reason,
//! backend, messages lost, time to the next one open on its connection), the
//! reconnect distribution, the messages' (events') accounting and how many were open over
//! time. The messages' latency and outcomes are in the cell's ordinary files (a message or
//! an event counted as a request).

use std::collections::BTreeMap;
use std::fmt::Write as _;

pub use ingressbench_results::stream::{
    Close, ClosedBy, Reconnects, StreamFile, StreamKind, STREAM_FILES,
};

use crate::results::{CellResults, RunResults};
use crate::svg::{esc, short, Axis, Plot, PALETTE};
use crate::terminal::human_us;

/// What the closes in one stretch of a run came to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cuts {
    /// Closes.
    pub closed: usize,
    /// By code, with who closed: (`1001 by server`, count).
    pub by_code: BTreeMap<String, usize>,
    /// Messages lost with them.
    pub lost: u64,
    /// Reconnect times of those that reconnected, in milliseconds, sorted.
    pub reconnect_ms: Vec<f64>,
}

impl Cuts {
    /// The closes of `closes` from `from_s` (inclusive) to `to_s` (exclusive).
    pub fn between(closes: &[Close], from_s: f64, to_s: f64) -> Self {
        Self::of(closes.iter().filter(|c| c.at_s >= from_s && c.at_s < to_s))
    }

    /// The figures of `closes`.
    pub fn of<'a>(closes: impl Iterator<Item = &'a Close>) -> Self {
        let mut cuts = Cuts::default();
        for c in closes {
            cuts.closed += 1;
            let label = match (c.code, &c.grpc_status) {
                (Some(code), _) if c.by == ClosedBy::Server && !sendable(code) => {
                    format!("{code} by server (a code no endpoint may send)")
                }
                (Some(code), _) => format!("{code} by {}", c.by.as_str()),
                (None, Some(status)) => format!("{status} by {}", c.by.as_str()),
                (None, None) if c.by == ClosedBy::Server => "ended by server".to_owned(),
                (None, None) => "broken off".to_owned(),
            };
            *cuts.by_code.entry(label).or_default() += 1;
            cuts.lost += c.lost;
            cuts.reconnect_ms.extend(c.reconnected_after_ms);
        }
        cuts.reconnect_ms.sort_by(f64::total_cmp);
        cuts
    }

    /// The `p`th percentile of the reconnect times (nearest rank), if any reconnected.
    pub fn reconnect_percentile_ms(&self, p: f64) -> Option<f64> {
        let n = self.reconnect_ms.len();
        (n > 0).then(|| {
            let rank = ((p / 100.0) * n as f64).ceil() as usize;
            self.reconnect_ms[rank.clamp(1, n) - 1]
        })
    }

    /// `4 × 1001 by server`, or `none`.
    pub fn codes(&self) -> String {
        if self.by_code.is_empty() {
            return "none".into();
        }
        self.by_code
            .iter()
            .map(|(code, n)| format!("{n} × {code}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Whether an endpoint may send `code` in a close frame (RFC 6455 §7.4: the defined codes
/// but 1004-1006 and 1015, and 3000-4999 for libraries and applications).
fn sendable(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// WebSockets open at `t_s` seconds from the load's start (the last sample at or before).
fn open_at(file: &StreamFile, t_s: f64) -> u32 {
    file.open_over_time
        .iter()
        .take_while(|&&(t, _)| t <= t_s + 1e-9)
        .last()
        .map_or(0, |&(_, n)| n)
}

/// The WebSocket section: per cell, WebSockets open over time with every event drawn in,
/// and a table of what each event cut; the headline's sentence per cell and kind of
/// event. `None` when no cell's load was WebSockets.
pub(crate) fn section(
    run: &RunResults,
    colours: &BTreeMap<String, &str>,
    charts: &mut Vec<(String, String)>,
) -> Option<(String, Vec<String>)> {
    let cells: Vec<(&CellResults, &StreamFile)> = run
        .cells
        .iter()
        .filter_map(|c| Some((c, c.websocket.as_ref()?)))
        .collect();
    if cells.is_empty() {
        return None;
    }
    let mut html = String::from("<section><h2>WebSockets, event streams and gRPC</h2><p class=\"note\">Each message (server-sent event, gRPC call or stream message) carries its sequence number and is timed from when it was due to its echo (its arrival, its answer); in the figures above a message is a request (101 when echoed), an event too (200 when it came), a gRPC call or stream message by its status (grpc:ok). Per cell: WebSockets (event streams) open over time (sampled every 100 ms) with each event; per event, from its request to the next event's (at most 15 s): the connections cut (a WebSocket's by close code and who closed: <em>server</em> is a close frame from the proxy or the backend, <em>abnormal</em> a connection that ended without one; an event stream <em>ended by server</em> when its response ended, <em>broken off</em> when the connection broke mid-response; a gRPC stream by the status it ended with, or broken off; a gRPC connection for unary calls <em>ended by server</em> after a GOAWAY, or broken off), the messages lost with them (for event streams, those the resumed stream skipped), every failed message or event in the window, how long the cut connections took to have one open again, and the p99 of the latency in the 5 s after.</p>");
    let mut headline = Vec::new();
    for (cell, file) in &cells {
        let label = cell.label();
        let colour = colours.get(&cell.target).copied().unwrap_or(PALETTE[0]);
        let _ = write!(html, "<h3>{}</h3>", esc(&label));
        if let Some(svg) = open_chart(cell, file, colour, &label) {
            html.push_str(&svg);
            charts.push((format!("websockets {label}"), svg));
        }
        html.push_str(&event_table(cell, file));
        let _ = write!(html, "<pre>{}</pre>", esc(&text(file)));
        headline.extend(sentences(cell, file));
    }
    html.push_str("</section>");
    Some((html, headline))
}

/// What an event cut, by code (`4 × 1001 by server`), or nothing.
fn codes(cuts: &ingressbench_results::impact::EventCuts) -> String {
    (cuts.by_code.iter())
        .map(|(code, n)| format!("{n} × {code}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn event_table(cell: &CellResults, file: &StreamFile) -> String {
    let mut t = String::from("<table><tr><th class=\"l\">event</th><th>at s</th><th>open before</th><th>cut</th><th class=\"l\">by code</th><th>lost with them</th><th>failed messages</th><th>reconnect p50 ms</th><th>p99 ms</th><th>max ms</th><th>latency p99 5 s after, ms</th></tr>");
    for e in &cell.impact {
        let Some(w) = &e.websocket else {
            continue;
        };
        let ms = |v: Option<f64>| v.map_or("-".to_owned(), |m| format!("{m:.1}"));
        let _ = write!(
            t,
            "<tr><td class=\"l\">{}</td><td>{:.2}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&e.what),
            e.requested_s,
            open_at(file, e.requested_s + cell.measure_from_s - 1e-3),
            w.cut,
            esc(&codes(w)),
            w.messages_lost,
            e.requests.errors.map_or("-".to_owned(), |n| n.to_string()),
            ms(w.reconnect_p50_ms),
            ms(w.reconnect_p99_ms),
            ms(w.reconnect_max_ms),
            ms(e.requests.p99_ms_5s_after),
        );
    }
    t.push_str("</table>");
    t
}

/// WebSockets open over time, every event a labelled marker; time from the start of
/// measurement, as the other charts.
fn open_chart(cell: &CellResults, file: &StreamFile, colour: &str, label: &str) -> Option<String> {
    let points: Vec<(f64, f64)> = file
        .open_over_time
        .iter()
        .map(|&(t, n)| (t - cell.measure_from_s, f64::from(n)))
        .collect();
    if points.len() < 2 {
        return None;
    }
    let x = Axis::covering(points.iter().map(|p| p.0), false);
    let y = Axis::covering(points.iter().map(|p| p.1).chain([0.0]), false);
    let mut plot = Plot::new(900.0, 200.0, x, y);
    let (streams, _) = file.kind.nouns();
    plot.axes("seconds", &format!("{streams} open"), &|v| short(v));
    plot.line(&points, colour, 1.6, false);
    for (i, e) in cell.impact.iter().enumerate() {
        plot.marker(e.requested_s, &format!("{} {}", i + 1, e.what), i % 3);
    }
    Some(plot.finish(&format!("{streams} open over time, {label}")))
}

/// "caddy …: at a reload, 8 of 8 WebSockets cut (8 × 1001 by server), 0 messages lost,
/// reconnected in 3.1 ms (p99)", for the first event of each kind.
fn sentences(cell: &CellResults, file: &StreamFile) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for e in &cell.impact {
        let Some(w) = &e.websocket else {
            continue;
        };
        let what = &e.what;
        let kind = what.split_whitespace().next().unwrap_or("");
        if !seen.insert(kind.to_owned()) {
            continue;
        }
        let before = open_at(file, e.requested_s + cell.measure_from_s - 1e-3);
        let (cut, lost) = (w.cut, w.messages_lost);
        let codes = if w.by_code.is_empty() {
            String::new()
        } else {
            format!(" ({})", codes(w))
        };
        let reconnected = match w.reconnect_p99_ms {
            Some(p99) => format!(", reconnected in {p99:.1} ms (p99)"),
            None => String::new(),
        };
        let (streams, items) = file.kind.nouns();
        out.push(format!(
            "{}: at {what}, {}{codes}, {lost} {items} lost with them, {} {items} failed in its window{reconnected}.",
            cell.label(),
            cut_of(cut, u64::from(before), streams),
            e.requests.errors.unwrap_or(0),
        ));
    }
    out
}

/// `8 of 8 WebSockets cut`; when the event's window cut more than were open at it (the
/// clients were still reconnecting from the last event, and it cut those too), says so
/// rather than `17 of 5`: `17 WebSockets cut, of which 5 were open at it`.
fn cut_of(cut: u64, before: u64, streams: &str) -> String {
    if cut > before {
        format!("{cut} {streams} cut, of which {before} were open at it")
    } else {
        format!("{cut} of {before} {streams} cut")
    }
}

/// The most WebSockets open at once.
pub fn most_open(file: &StreamFile) -> u32 {
    file.open_over_time
        .iter()
        .map(|&(_, n)| n)
        .max()
        .unwrap_or(0)
}

/// A few lines for the terminal, under the messages' summary.
pub fn text(file: &StreamFile) -> String {
    let mut out = String::new();
    let failed: u64 = file.upgrade_failures.values().sum();
    let (streams, items) = file.kind.nouns();
    let (attempt, echoed, closed) = match file.kind {
        StreamKind::Websocket => ("upgrade", "echoed", "with a closed WebSocket"),
        StreamKind::Sse => ("request", "came", "skipped by a resumed stream"),
        StreamKind::Grpc => ("connection", "answered", "with a cut connection"),
        StreamKind::GrpcStream => ("stream", "came", "skipped by a resumed stream"),
    };
    let _ = writeln!(
        out,
        "  {streams}  {} opened (at most {} at once), {} closed before the end, {failed} {attempt}(s) failed",
        file.opened,
        most_open(file),
        file.cut,
    );
    for (why, n) in &file.upgrade_failures {
        let _ = writeln!(out, "    {attempt} failed: {n} × {why}");
    }
    let all = Cuts::between(&file.closes, f64::NEG_INFINITY, f64::INFINITY);
    if all.closed > 0 {
        let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
        for c in &file.closes {
            *reasons.entry(c.reason.as_str()).or_default() += 1;
        }
        let reasons = reasons
            .iter()
            .map(|(r, n)| format!("{n} × \"{r}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(out, "    closes    {} ({reasons})", all.codes());
    }
    let _ = writeln!(
        out,
        "    {items}  {} sent, {} {echoed}, {} lost ({} of them {closed}, {} skipped by the server), {} late, {} duplicated, {} reordered, {} never sent, {} still waiting at the end (errors){}",
        file.sent,
        file.echoed,
        file.lost,
        all.lost,
        file.unanswered,
        file.late,
        file.duplicated,
        file.reordered,
        file.unsent,
        file.in_flight_at_end,
        match file.not_ours {
            0 => String::new(),
            n => format!("; {n} frames that were none of ours (wrong size or contents)"),
        }
    );
    let r = &file.reconnect;
    if r.count > 0 {
        let us = |v: Option<u64>| v.map_or("-".into(), |v| human_us(v as f64));
        let _ = writeln!(
            out,
            "    reconnect {} after a cut: p50 {}, p90 {}, p99 {}, max {}",
            r.count,
            us(r.p50_us),
            us(r.p90_us),
            us(r.p99_us),
            us(r.max_us)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(at_s: f64, code: u16, lost: u64, reconnected: Option<f64>) -> Close {
        Close {
            at_s,
            connection: 0,
            by: if code == 1006 {
                ClosedBy::Abnormal
            } else {
                ClosedBy::Server
            },
            code: Some(code),
            grpc_status: None,
            reason: "backend draining".into(),
            backend: Some("b1".into()),
            lost,
            reconnected_after_ms: reconnected,
        }
    }

    #[test]
    fn more_cut_than_were_open_at_the_event_says_the_others_opened_after_it() {
        assert_eq!(cut_of(8, 8, "WebSockets"), "8 of 8 WebSockets cut");
        assert_eq!(cut_of(0, 0, "event streams"), "0 of 0 event streams cut");
        assert_eq!(
            cut_of(17, 5, "WebSockets"),
            "17 WebSockets cut, of which 5 were open at it"
        );
    }

    #[test]
    fn cuts_in_a_window_count_codes_losses_and_reconnects() {
        let closes = [
            close(0.5, 1001, 1, Some(3.0)),
            close(2.0, 1001, 0, Some(1.0)),
            close(2.1, 1006, 2, None),
            close(2.2, 1001, 0, Some(9.0)),
            close(5.0, 1001, 4, Some(2.0)),
        ];
        let cuts = Cuts::between(&closes, 2.0, 5.0);
        assert_eq!(cuts.closed, 3);
        assert_eq!(cuts.lost, 2);
        assert_eq!(cuts.codes(), "2 × 1001 by server, 1 × 1006 by abnormal");
        assert_eq!(cuts.reconnect_ms, vec![1.0, 9.0]);
        assert_eq!(cuts.reconnect_percentile_ms(50.0), Some(1.0));
        assert_eq!(cuts.reconnect_percentile_ms(99.0), Some(9.0));
        assert_eq!(Cuts::between(&closes, 6.0, 7.0).codes(), "none");
        assert_eq!(
            Cuts::between(&closes, 6.0, 7.0).reconnect_percentile_ms(99.0),
            None
        );
    }
}
