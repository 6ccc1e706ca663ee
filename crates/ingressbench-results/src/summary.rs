//! A cell's summary as a report reads it. A cell's `summary.json` is the load's own
//! [`ingressbench_stats::Summary`]; a cell cut short has one rebuilt from its interval
//! log, which holds only some of its figures; a `load --json` output, or a directory from
//! elsewhere, may hold anything. [`CellSummary`] is what every reader relies on: the
//! figures each cell must have (its duration, requests and errors, latency), typed and
//! checked once as the file is read ([`CellSummary::read`] names what is missing), and
//! every other figure by its path in the file as written ([`CellSummary::figure`]), which
//! is how the report's metrics, its headline's columns and `compare --fail-if` name them.
//!
//! run.json keeps a shorter line per cell ([`LineSummary`]), and for an attempt cut short
//! and moved aside either that line or a rebuilt summary ([`AttemptSummary`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A cell's summary: the figures every reader relies on, and the file as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CellSummary {
    /// Where a rebuilt summary came from (`latency.hlog`); none for the load's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuilt_from: Option<String>,
    /// Whether the load was stopped before its end.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub interrupted: bool,
    /// Seconds measured.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub duration_s: Option<f64>,
    /// Requests sent, and what became of them.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub requests: Requests,
    /// Requests by outcome (`200`, `refused`), each in exactly one; none in summaries
    /// written before they were.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub outcomes: Option<BTreeMap<String, Value>>,
    /// Latency of the answered requests, microseconds.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub latency_us: Latency,
    /// What makes its figures less trustworthy, in words.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub warnings: Vec<String>,
    /// A `load --json` output: the tool that wrote it.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub tool_version: Option<String>,
    /// A `load --json` output: the URL loaded.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub target: Option<String>,
    /// The summary as written, for figures by path: set by [`CellSummary::read`], and
    /// by [`CellSummary::made`] for one made here.
    #[serde(skip)]
    pub written: Value,
}

/// A summary's request counts. A count that is not one reads as none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Requests {
    /// Every request of the measured part.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub total: Option<u64>,
    /// Answered with a 2xx or 3xx.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub ok: Option<u64>,
    /// Failed (none when a rebuilt summary cannot say).
    #[serde(default, deserialize_with = "crate::or_default")]
    pub errors: Option<u64>,
}

/// A summary's latency. A figure that is not a number reads as none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Answered requests it counts.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub count: Option<u64>,
    /// Mean.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub mean: Option<f64>,
    /// Median.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub p50: Option<f64>,
    /// 90th percentile.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub p90: Option<f64>,
    /// 99th percentile.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub p99: Option<f64>,
    /// 99.9th percentile.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub p999: Option<f64>,
    /// The highest latency, in microseconds.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub max: Option<f64>,
}

impl CellSummary {
    /// Reads a summary file's JSON: the figures every cell must have are there, finite and
    /// not negative, and its outcomes (where it has them) account for each request once.
    /// The error names what is wrong (`no number at requests.total`).
    pub fn read(written: Value) -> Result<Self, String> {
        let not_one = |why: String| format!("summary.json is not a load summary: {why}");
        let mut summary: Self =
            serde_json::from_value(written.clone()).map_err(|e| not_one(e.to_string()))?;
        summary.written = written;
        let (l, r) = (&summary.latency_us, &summary.requests);
        let count = |n: Option<u64>| n.map(|n| n as f64);
        let check = |figures: &[(&str, Option<f64>)]| match figures
            .iter()
            .find(|(_, x)| !x.is_some_and(|x| x.is_finite() && x >= 0.0))
        {
            Some((path, _)) => Err(not_one(format!("no number at {path}"))),
            None => Ok(()),
        };
        check(&[
            ("requests.total", count(r.total)),
            ("requests.errors", count(r.errors)),
            ("latency_us.p50", l.p50),
            ("latency_us.p99", l.p99),
            ("latency_us.mean", l.mean),
            ("latency_us.max", l.max),
        ])?;
        summary.conserved()?;
        check(&[
            ("duration_s", summary.duration_s),
            ("latency_us.count", count(summary.latency_us.count)),
        ])?;
        Ok(summary)
    }

    /// A summary made here (rebuilt from an interval log), its figures by path as they
    /// would be written.
    pub fn made(mut self) -> Self {
        self.written = serde_json::to_value(&self).unwrap_or(Value::Null);
        self
    }

    /// The number at `path` in the summary as written (`["latency_us", "p99"]`,
    /// `["phases_us", "connect", "count"]`), if it is one.
    pub fn figure(&self, path: &[&str]) -> Option<f64> {
        path.iter()
            .try_fold(&self.written, |v, key| v.get(key))?
            .as_f64()
    }

    /// Whether every request ended in exactly one outcome: the outcomes add up to the
    /// requests, the failed ones to the errors, and (where it says) ok and errors to the
    /// whole. Summaries before the outcomes were written are not checked.
    fn conserved(&self) -> Result<(), String> {
        let total = self.requests.total.unwrap_or(0);
        let errors = self.requests.errors.unwrap_or(0);
        if let Some(ok) = self.requests.ok {
            if ok.checked_add(errors) != Some(total) {
                return Err(format!(
                    "summary.json counts {total} requests, {ok} ok and {errors} errors: they do not add up"
                ));
            }
        }
        let Some(outcomes) = &self.outcomes else {
            return Ok(());
        };
        let (mut all, mut failed) = (0u64, 0u64);
        for (name, n) in outcomes {
            let Some(n) = n.as_u64() else {
                return Err(format!("summary.json's outcome {name} is not a count"));
            };
            all = all.saturating_add(n);
            if !ingressbench_stats::Outcome::from_name(name).is_some_and(|o| o.is_ok()) {
                failed = failed.saturating_add(n);
            }
        }
        if all != total || failed != errors {
            return Err(format!(
                "summary.json's outcomes count {all} requests ({failed} failed) and its requests {total} ({errors} errors): {} in no outcome or in two",
                all.abs_diff(total).max(failed.abs_diff(errors))
            ));
        }
        Ok(())
    }

    /// How many requests ended in `outcome` (`waiting_at_end`), if it says.
    pub fn outcome(&self, outcome: &str) -> Option<u64> {
        self.outcomes.as_ref()?.get(outcome)?.as_u64()
    }
}

/// The line run.json keeps of a cell's summary (what its terminal line said).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LineSummary {
    /// Requests of the measured part.
    pub requests: u64,
    /// Of them, failed.
    #[serde(default)]
    pub errors: Option<u64>,
    /// Latency, microseconds: the shortest, median, 99th percentile and longest.
    #[serde(default)]
    pub min_us: Option<u64>,
    /// Median.
    #[serde(default)]
    pub p50_us: Option<u64>,
    /// 99th percentile.
    #[serde(default)]
    pub p99_us: Option<u64>,
    /// The highest latency, in microseconds.
    #[serde(default)]
    pub max_us: Option<u64>,
}

/// What an attempt cut short had measured: the line run.json kept of it (a cell stopped
/// by Ctrl-C), or a summary rebuilt from its interval log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AttemptSummary {
    /// The line run.json kept.
    Line(LineSummary),
    /// Rebuilt.
    Rebuilt(Box<CellSummary>),
}

impl AttemptSummary {
    /// In words: `after 3 s: 1234 requests answered, p99 2345 us`, or `before any
    /// request was answered`.
    pub fn said(&self) -> String {
        let (requests, p99, after) = match self {
            AttemptSummary::Line(l) => (l.requests, l.p99_us, None),
            AttemptSummary::Rebuilt(s) => (
                s.latency_us.count.unwrap_or(0),
                s.latency_us.p99.map(|p| p as u64),
                s.duration_s,
            ),
        };
        let after = after.map_or(String::new(), |s| format!("after {s:.0} s: "));
        if requests == 0 {
            return format!("{after}before any request was answered");
        }
        match p99 {
            Some(p99) => format!("{after}{requests} requests answered, p99 {p99} us"),
            None => format!("{after}{requests} requests answered"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_summary_without_a_figure_every_cell_has_is_refused_by_its_path() {
        let whole = json!({
            "duration_s": 10.0, "requests": { "total": 3, "ok": 2, "errors": 1 },
            "outcomes": { "200": 2, "refused": 1 },
            "latency_us": { "count": 2, "mean": 1.5, "p50": 1, "p99": 2, "max": 2 },
            "phases_us": { "connect": { "count": 4 } },
        });
        let s = CellSummary::read(whole.clone()).unwrap();
        assert_eq!(s.figure(&["phases_us", "connect", "count"]), Some(4.0));
        assert_eq!(s.figure(&["latency_us", "p99"]), Some(2.0));
        assert_eq!(s.outcome("refused"), Some(1));
        let e = CellSummary::read(json!({ "requests": "lots", "latency_us": {} })).unwrap_err();
        assert_eq!(
            e,
            "summary.json is not a load summary: no number at requests.total"
        );
        let mut negative = whole.clone();
        negative["latency_us"]["max"] = json!(-1);
        assert!(CellSummary::read(negative)
            .unwrap_err()
            .ends_with("no number at latency_us.max"));
        let mut lost = whole;
        lost["outcomes"]["200"] = json!(1);
        assert!(CellSummary::read(lost)
            .unwrap_err()
            .contains("in no outcome or in two"));
    }

    #[test]
    fn a_cut_short_attempt_is_said_from_either_shape_of_summary() {
        let said = |v: Value| serde_json::from_value::<AttemptSummary>(v).unwrap().said();
        assert_eq!(
            said(json!({ "errors": 0, "p99_us": 2345, "requests": 1234 })),
            "1234 requests answered, p99 2345 us"
        );
        assert_eq!(
            said(
                json!({ "duration_s": 3.2, "latency_us": { "count": 150, "p99": 900 }, "requests": { "total": 150 } })
            ),
            "after 3 s: 150 requests answered, p99 900 us"
        );
        assert_eq!(
            said(json!({ "errors": 0, "p99_us": null, "requests": 0 })),
            "before any request was answered"
        );
    }
}
