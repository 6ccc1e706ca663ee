//! A finished run as OpenMetrics text with timestamps (`ingressbench export prometheus`),
//! for `promtool tsdb create-blocks-from openmetrics`: the run's figures can then be
//! queried in a user's own Prometheus beside their production dashboards.
//!
//! The metrics are those of the live endpoint (`--metrics-listen`), named and bucketed the
//! same, so one dashboard reads either: requests by outcome, latency as a histogram, the
//! rate, events by kind, and each cell's settings as an info metric. Each is read from
//! what a cell keeps: its interval log's one-second windows (latency and outcomes), and
//! `events.jsonl`. Each series carries the cell (`cell`, its directory's name) and its
//! `target`, since a run's cells follow one another and would otherwise be one series.
//! The scheduler lag, requests in flight and retries are live only: the interval log
//! does not keep them per window.
//!
//! Why written here and not by `prometheus-client`: its encoder writes no sample
//! timestamps, and a backfill needs one on every sample. The format's rules this keeps:
//! one family at a time (never interleaved), each series' samples in time order, label
//! values escaped (`\\`, `"`, newline), `# EOF` last.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write;

use ingressbench_results::events::EventLine;
use ingressbench_stats::{HistogramUs, OutcomeCounts};
use serde_json::Value;

use crate::files;
use crate::results::{CellResults, RunResults};

/// What an export wrote.
#[derive(Debug, Default)]
pub struct Exported {
    /// Cells written.
    pub cells: usize,
    /// Samples (lines with a value) written.
    pub samples: u64,
    /// The first and last timestamp written (Unix seconds).
    pub span: Option<(f64, f64)>,
}

/// One cell's figures as timed points.
struct Series<'a> {
    cell: &'a CellResults,
    labels: String,
    /// Each window's end (Unix seconds) and the window.
    windows: Vec<(f64, &'a ingressbench_results::hlog::Interval)>,
    /// Each event fired: when it was asked for (Unix seconds) and its kind.
    events: Vec<(f64, String)>,
}

/// A run ready to be written: the cells that can be, with their times.
pub struct Export<'a> {
    series: Vec<Series<'a>>,
    scenario: &'a str,
    /// Cells left out, each with why (not done, unreadable, or no time for its windows).
    pub left_out: Vec<String>,
}

impl<'a> Export<'a> {
    /// The cells of `run` that can be exported; an error if none can, or if a cell holds a
    /// value its run cannot have recorded (a time outside the run, a line over the limit).
    pub fn of(run: &'a RunResults) -> Result<Self, String> {
        let mut series = Vec::new();
        let mut left_out = Vec::new();
        for cell in &run.cells {
            match cell_series(run, cell) {
                Ok(s) => series.push(s),
                Err(Unwritten::LeftOut(why)) => left_out.push(format!("{}: {why}", cell.label())),
                Err(Unwritten::Refused(why)) => {
                    return Err(format!(
                        "{}: {why}; nothing exported (a value the run cannot have recorded)",
                        cell.label()
                    ))
                }
            }
        }
        if series.is_empty() {
            return Err(format!(
                "no cell of {} can be exported: {}",
                run.dir.display(),
                left_out.join("; ")
            ));
        }
        Ok(Self {
            series,
            scenario: run.record.name(),
            left_out,
        })
    }

    /// Writes it to `out`: each family in turn, over every cell.
    pub fn write(&self, out: &mut dyn Write) -> std::io::Result<Exported> {
        let mut text = Text::new(out);
        requests(&mut text, &self.series)?;
        latency(&mut text, &self.series)?;
        rate(&mut text, &self.series)?;
        events(&mut text, &self.series)?;
        settings(&mut text, &self.series, self.scenario)?;
        text.end()?;
        Ok(Exported {
            cells: self.series.len(),
            samples: text.samples,
            span: text.span,
        })
    }
}

const REQUESTS_HELP: &str = "Requests finished after the warm-up, by outcome (an HTTP status, a gRPC status, or how it failed)";
const LATENCY_HELP: &str = "Latency of the answered requests after the warm-up, from when each was due (coordinated omission corrected)";

/// `ingressbench_requests_total{outcome}`: cumulative through each cell, every outcome the
/// cell saw at every window (0 before its first).
fn requests(text: &mut Text<'_>, series: &[Series<'_>]) -> std::io::Result<()> {
    text.family("ingressbench_requests", "counter", REQUESTS_HELP)?;
    for s in series {
        let by_window: Vec<BTreeMap<String, u64>> = (s.windows.iter())
            .map(|(_, w)| {
                w.outcomes
                    .as_ref()
                    .map(OutcomeCounts::to_map)
                    .unwrap_or_default()
            })
            .collect();
        let outcomes: BTreeSet<&String> = by_window.iter().flat_map(BTreeMap::keys).collect();
        for outcome in outcomes {
            let labels = format!("{},outcome=\"{}\"", s.labels, escape(outcome));
            let mut total = 0u64;
            for ((at, _), counts) in s.windows.iter().zip(&by_window) {
                total += counts.get(outcome).copied().unwrap_or(0);
                text.sample(
                    "ingressbench_requests_total",
                    &labels,
                    &total.to_string(),
                    *at,
                )?;
            }
        }
    }
    Ok(())
}

/// `ingressbench_latency_seconds`: the live endpoint's buckets, cumulative through each
/// cell.
fn latency(text: &mut Text<'_>, series: &[Series<'_>]) -> std::io::Result<()> {
    text.family("ingressbench_latency_seconds", "histogram", LATENCY_HELP)?;
    let bounds = HistogramUs::prometheus_bounds_s();
    let les: Vec<String> = (bounds.iter())
        .map(|b| dtoa::Buffer::new().format(*b).to_owned())
        .chain(["+Inf".to_owned()])
        .collect();
    for s in series {
        let mut cumulative = vec![0u64; les.len()];
        let mut sum = 0.0;
        for (at, w) in &s.windows {
            let (counts, window_sum) = w.histogram.cut_s(&bounds);
            for (c, n) in cumulative.iter_mut().zip(counts) {
                *c += n;
            }
            sum += window_sum;
            let mut below = 0;
            for (le, n) in les.iter().zip(&cumulative) {
                below += n;
                let labels = format!("{},le=\"{le}\"", s.labels);
                text.sample(
                    "ingressbench_latency_seconds_bucket",
                    &labels,
                    &below.to_string(),
                    *at,
                )?;
            }
            let (count, sum) = (
                below.to_string(),
                dtoa::Buffer::new().format(sum).to_owned(),
            );
            text.sample("ingressbench_latency_seconds_count", &s.labels, &count, *at)?;
            text.sample("ingressbench_latency_seconds_sum", &s.labels, &sum, *at)?;
        }
    }
    Ok(())
}

/// `ingressbench_rate_per_second`: each window's requests per second.
fn rate(text: &mut Text<'_>, series: &[Series<'_>]) -> std::io::Result<()> {
    text.family(
        "ingressbench_rate_per_second",
        "gauge",
        "Requests finished in the window, per second",
    )?;
    for s in series {
        for (at, w) in &s.windows {
            let n = (w.outcomes.as_ref()).map_or(w.histogram.count(), OutcomeCounts::total);
            let rate = n as f64 / w.length.as_secs_f64().max(1e-9);
            let rate = dtoa::Buffer::new().format(rate).to_owned();
            text.sample("ingressbench_rate_per_second", &s.labels, &rate, *at)?;
        }
    }
    Ok(())
}

/// `ingressbench_events_total{kind}`: from 0 at the cell's start, one more at each event.
/// Each sample of a series has its own millisecond (the format's timestamps' resolution
/// here): two events of a kind in one millisecond are written a millisecond apart, since a
/// reader keeps one sample per timestamp and would count them as one.
fn events(text: &mut Text<'_>, series: &[Series<'_>]) -> std::io::Result<()> {
    text.family("ingressbench_events", "counter", "Events fired, by kind")?;
    for s in series {
        let mut kinds: Vec<&str> = s.events.iter().map(|(_, k)| k.as_str()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        let start = s.windows.first().map(|(at, w)| at - w.length.as_secs_f64());
        for kind in kinds {
            let labels = format!("{},kind=\"{}\"", s.labels, escape(kind));
            let mut last_ms = None;
            // From 0 at the cell's start, so that the first event is an increase.
            let fired = s.events.iter().filter(|(_, k)| k == kind);
            let first_ms = fired.clone().map(|(at, _)| millis(*at)).min();
            if let Some(start) = start.filter(|t| first_ms.is_some_and(|f| f > millis(*t))) {
                text.sample("ingressbench_events_total", &labels, "0", start)?;
                last_ms = Some(millis(start));
            }
            for (n, (at, _)) in (1u64..).zip(fired) {
                let ms = last_ms.map_or(millis(*at), |last: i64| millis(*at).max(last + 1));
                last_ms = Some(ms);
                let at = ms as f64 / 1000.0;
                text.sample("ingressbench_events_total", &labels, &n.to_string(), at)?;
            }
        }
    }
    Ok(())
}

/// A time (Unix seconds) in whole milliseconds, as written.
fn millis(at: f64) -> i64 {
    (at * 1000.0).round() as i64
}

/// `ingressbench_run_info{scenario, label}`: the cell's settings, at each window.
fn settings(text: &mut Text<'_>, series: &[Series<'_>], scenario: &str) -> std::io::Result<()> {
    text.family(
        "ingressbench_run",
        "info",
        "The cell's settings: the scenario, the cell, its label and target",
    )?;
    for s in series {
        let labels = format!(
            "{},scenario=\"{}\",label=\"{}\"",
            s.labels,
            escape(scenario),
            escape(&s.cell.settings_label())
        );
        for (at, _) in &s.windows {
            text.sample("ingressbench_run_info", &labels, "1", *at)?;
        }
    }
    Ok(())
}

/// Why a cell is not written.
enum Unwritten {
    /// It has nothing to write (not done, unreadable, or written by an older version).
    LeftOut(String),
    /// It holds a value its run cannot have recorded: the whole export is refused.
    Refused(String),
}

impl From<&str> for Unwritten {
    fn from(why: &str) -> Self {
        Self::LeftOut(why.to_owned())
    }
}

/// The most an event's kind may hold, as a label value.
const KIND_LIMIT: usize = 64;

/// How far outside its run's recorded start and end a cell's times may fall (clocks are
/// read at different moments).
const CLOCK_SLACK_S: f64 = 60.0;

/// The times a cell's figures may carry: those of its run, as `run.json` records them, or
/// this century when it does not.
fn run_span(run: &RunResults) -> (f64, f64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let recorded = |t: Option<f64>| t.filter(|t| t.is_finite());
    (
        recorded(run.record.started_at_unix_s).map_or(946_684_800.0, |t| t - CLOCK_SLACK_S),
        recorded(run.record.finished_at_unix_s).unwrap_or(now) + CLOCK_SLACK_S,
    )
}

/// A cell's windows and events, timed, or why it cannot be exported.
fn cell_series<'a>(run: &RunResults, cell: &'a CellResults) -> Result<Series<'a>, Unwritten> {
    if cell.summary.is_none() {
        return Err(Unwritten::LeftOut(
            match (cell.status.as_str(), cell.unreadable.first()) {
                (_, Some(why)) => format!("unreadable ({why})"),
                (status, None) => format!("{status}, no figures"),
            },
        ));
    }
    let start = cell
        .log_start_unix_s
        .ok_or("its latency.hlog has no StartTime, so its windows have no time")?;
    let (earliest, latest) = run_span(run);
    let outside = |at: f64| !(at.is_finite() && (earliest..=latest).contains(&at));
    if outside(start) {
        return Err(Unwritten::Refused(format!(
            "its latency.hlog's StartTime {start} is not within its run ({earliest:.0} to {latest:.0} Unix seconds)"
        )));
    }
    let windows: Vec<_> = cell
        .windows
        .iter()
        .map(|w| (start + (w.start + w.length).as_secs_f64(), w))
        .collect();
    if windows.is_empty() {
        return Err("no windows in its latency.hlog".into());
    }
    if let Some((at, _)) = windows.iter().find(|(at, _)| outside(*at)) {
        return Err(Unwritten::Refused(format!(
            "its latency.hlog has a window ending at {at:.3}, after its run ended ({latest:.0} Unix seconds)"
        )));
    }
    if cell.windows.iter().any(|w| w.outcomes.is_none()) {
        return Err("its latency.hlog has no outcomes per window (written before 0.1.0)".into());
    }
    let events = cell_events(run, cell, start + cell.measure_from_s)?;
    if let Some((at, _)) = events.iter().find(|(at, _)| outside(*at)) {
        return Err(Unwritten::Refused(format!(
            "its events.jsonl has an event at {at:.3} Unix seconds, outside its run ({earliest:.0} to {latest:.0})"
        )));
    }
    Ok(Series {
        cell,
        labels: format!(
            "cell=\"{}\",target=\"{}\"",
            escape(cell.dir_name.as_deref().unwrap_or("load")),
            escape(&cell.target)
        ),
        windows,
        events,
    })
}

/// The events a cell fired: when each was asked for (Unix seconds, from `zero`, the
/// measurement's start) and its kind, in time order. Lines that are not events (an
/// event's later record) are passed over; an event with no time or a kind that is no
/// label is refused, as is a line over [`files::LINE_LIMIT`].
fn cell_events(
    run: &RunResults,
    cell: &CellResults,
    zero: f64,
) -> Result<Vec<(f64, String)>, Unwritten> {
    let mut events = Vec::new();
    let Some(parts) = cell.file_parts("events.jsonl") else {
        return Ok(events);
    };
    if !files::exists_in(&run.root, &parts) {
        return Ok(events);
    }
    let refused = |why: String| Unwritten::Refused(format!("events.jsonl: {why}"));
    let lines = files::Lines::open(&run.root, &parts, EVENT_LINES_LIMIT).map_err(refused)?;
    for (n, line) in (1..).zip(lines) {
        let line = line.map_err(Unwritten::Refused)?;
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            return Err(refused(format!("line {n} is not JSON")));
        };
        let event = match serde_json::from_value::<EventLine>(v) {
            Ok(EventLine::Requested(event)) => event,
            Ok(EventLine::Failed(_) | EventLine::Applied(_)) => continue,
            Err(_) => {
                return Err(refused(format!(
                    "line {n} is none the tool writes: an event with its requested_s, one that failed with its error, or a change applied with its applied_s"
                )))
            }
        };
        let requested = event.requested_s;
        // Runs before `kind` was written: the first word of what it did.
        let kind = event.kind();
        let label = |c: char| c.is_ascii_alphanumeric() || "_-.".contains(c);
        if kind.is_empty() || kind.len() > KIND_LIMIT || !kind.chars().all(label) {
            return Err(refused(format!(
                "line {n}: an event kind that is not a word of at most {KIND_LIMIT} letters, digits, `_`, `-` or `.`"
            )));
        }
        events.push((zero + requested, kind.to_owned()));
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(events)
}

/// The most lines an events.jsonl is read for: far more than a cell fires.
const EVENT_LINES_LIMIT: u64 = 1 << 20;

/// A label value escaped as the format asks.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The text as it is written.
struct Text<'a> {
    out: &'a mut dyn Write,
    line: String,
    samples: u64,
    span: Option<(f64, f64)>,
}

impl<'a> Text<'a> {
    fn new(out: &'a mut dyn Write) -> Self {
        Self {
            out,
            line: String::new(),
            samples: 0,
            span: None,
        }
    }

    fn write(&mut self) -> std::io::Result<()> {
        self.out.write_all(self.line.as_bytes())?;
        self.line.clear();
        Ok(())
    }

    fn family(&mut self, name: &str, kind: &str, help: &str) -> std::io::Result<()> {
        let _ = writeln!(self.line, "# TYPE {name} {kind}\n# HELP {name} {help}");
        self.write()
    }

    fn sample(&mut self, name: &str, labels: &str, value: &str, at: f64) -> std::io::Result<()> {
        let _ = writeln!(self.line, "{name}{{{labels}}} {value} {at:.3}");
        self.samples += 1;
        self.span = Some(match self.span {
            Some((first, last)) => (first.min(at), last.max(at)),
            None => (at, at),
        });
        self.write()
    }

    fn end(&mut self) -> std::io::Result<()> {
        self.line.push_str("# EOF\n");
        self.write()?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(escape("plain"), "plain");
    }
}
