//! `run.json`: a run's record of itself (what was run, where, with what tool, each cell's
//! status and what it wrote), rewritten as the run goes. The scenario runner writes it;
//! the report, `--resume` and `--force` read it back. A directory may come from elsewhere
//! or from an older tool: every field that an older record may lack defaults, and a
//! record of a newer major format is refused by [`check_format`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::capacity::{SearchRecord, TrialRecord};
use crate::site::{Kernel, LinkOverhead, Topology, Usage};
use crate::summary::{AttemptSummary, LineSummary};

/// The results format this tool writes, `MAJOR.MINOR`. A new minor version only adds
/// fields (an older reader ignores them); a new major version changes what a field means
/// or removes one, and an older reader refuses it. Records before the version was written
/// (ingressbench 0.1.0) are 1.0.
pub const FORMAT_VERSION: &str = "1.1";

/// Whether this tool reads a record of `format` (none: written before the version was).
pub fn check_format(format: Option<&str>) -> Result<(), String> {
    let Some(format) = format else {
        return Ok(());
    };
    let major = |v: &str| v.split('.').next().and_then(|m| m.parse::<u32>().ok());
    match (major(format), major(FORMAT_VERSION)) {
        (Some(theirs), Some(ours)) if theirs <= ours => Ok(()),
        (Some(_), _) => Err(format!(
            "it is in results format {format}, newer than the {FORMAT_VERSION} this ingressbench ({}) reads; read it with the ingressbench that wrote it (its run.json's tool_version) or a newer one",
            env!("CARGO_PKG_VERSION")
        )),
        (None, _) => Err(format!(
            "its format_version {format:?} is not MAJOR.MINOR; it was not written by ingressbench"
        )),
    }
}

/// Whether `value` (run.json as read) is a run record (it has a `cells` list) of a
/// format this tool reads ([`check_format`]), before it is read as a [`RunRecord`].
pub fn check_record(value: &Value) -> Result<(), String> {
    if !value.get("cells").is_some_and(Value::is_array) {
        return Err(
            "not a run record (no `cells` list); give a results directory written by `ingressbench run`"
                .into(),
        );
    }
    check_format(value.get("format_version").and_then(Value::as_str))
}

/// The run. Fields this version does not know (a newer minor version's) are kept in
/// `other`, so that a `--resume` by this version writes them back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The results format ([`FORMAT_VERSION`]); none before it was written.
    #[serde(default)]
    pub format_version: Option<String>,
    /// The scenario's name.
    #[serde(default)]
    pub scenario: String,
    /// `running`, `complete`, `incomplete`, `interrupted`, `failed` (and, as the report
    /// reads a record whose writer is gone, `cut short`).
    #[serde(default)]
    pub status: String,
    /// What ended the run, if something did.
    #[serde(default)]
    pub error: Option<String>,
    /// Why a run recorded as running is not (its writer is gone), as the report found it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_short: Option<String>,
    /// The version of the tool that wrote it.
    #[serde(default)]
    pub tool_version: Option<String>,
    /// The command line that started it.
    #[serde(default)]
    pub command: Option<String>,
    /// The command line that resumed it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_by: Option<String>,
    /// Whether it ran `--quick`.
    #[serde(default)]
    pub quick: bool,
    /// By how much `--quick` scaled its durations.
    #[serde(default = "one")]
    pub quick_factor: f64,
    /// Its `--set` overrides, in order.
    #[serde(default)]
    pub sets: Vec<(String, String)>,
    /// The machine it ran on.
    #[serde(default)]
    pub machine: Machine,
    /// When it started (the first attempt's, when resumed).
    #[serde(default)]
    pub started_at_unix_s: Option<f64>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_unix_s: Option<f64>,
    /// The scenario file as run.
    #[serde(default)]
    pub scenario_text: Option<String>,
    /// Every cell, in running order.
    pub cells: Vec<CellEntry>,
    /// The cells the matrix left out and why (`nginx with load.protocol=http3: …`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
    /// A scenario with capacity searches: one per searched cell (docs/RESULTS.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub searches: Option<Vec<SearchRecord>>,
    /// Fields of a newer minor version.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

impl RunRecord {
    /// The scenario's name, `run` when the record has none (a single load's output).
    pub fn name(&self) -> &str {
        if self.scenario.is_empty() {
            "run"
        } else {
            &self.scenario
        }
    }

    /// Its status, `unknown` when the record has none.
    pub fn status(&self) -> &str {
        if self.status.is_empty() {
            "unknown"
        } else {
            &self.status
        }
    }
}

fn one() -> f64 {
    1.0
}

/// The machine a run ran on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// `/proc/cpuinfo`'s model name.
    #[serde(default)]
    pub cpu_model: String,
    /// The cores the tool could use.
    #[serde(default)]
    pub cores: u64,
    /// The kernel's release.
    #[serde(default)]
    pub kernel: String,
}

/// A cell's status in run.json.
pub mod status {
    /// Not run yet, or started and never finished (its run was killed).
    pub const PENDING: &str = "pending";
    /// Ran to its end.
    pub const DONE: &str = "done";
    /// Stopped before its end (Ctrl-C, a full disk): what it measured is kept.
    pub const INTERRUPTED: &str = "interrupted";
    /// Did not run: its error says why.
    pub const FAILED: &str = "failed";
}

/// One cell's entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CellEntry {
    /// Its position in running order.
    #[serde(default)]
    pub index: Option<usize>,
    /// Which repeat (from 0).
    #[serde(default)]
    pub repeat: u32,
    /// The target's name.
    #[serde(default)]
    pub target: String,
    /// Its matrix settings, `path` to value.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// [`status`]: `pending`, `done`, `interrupted`, `failed`.
    #[serde(default = "pending")]
    pub status: String,
    /// Its directory's name under `cells/`.
    #[serde(default)]
    pub dir: Option<String>,
    /// Why it failed, or was cut short.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The figures of its terminal line (requests, errors, latency).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::or_default"
    )]
    pub summary: Option<LineSummary>,
    /// The proxy's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_version: Option<String>,
    /// Where the load went: the URL, and the address its name was sent to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<Value>,
    /// Whether its lab was an earlier cell's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lab_reused: Option<bool>,
    /// Seconds from the load's start to the start of measurement (the warm-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measure_from_s: Option<f64>,
    /// The files it wrote and their sizes (records before 0.1.0 have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<BTreeMap<String, u64>>,
    /// The emulated links' own added time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::or_default")]
    pub link_overhead_us: Option<LinkOverhead>,
    /// The kernel each proxy ran with, and its listen queues' drops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::or_default")]
    pub kernel: Option<Kernel>,
    /// Where it ran: nodes and links.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::or_default")]
    pub topology: Option<Topology>,
    /// In a cluster: how its routes were made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<Value>,
    /// What the lab's processes spent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::or_default"
    )]
    pub usage: Option<Usage>,
    /// A trial of a capacity search: its rate, verdict and figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<TrialRecord>,
    /// A soak's verdict: what grew, per part and per kind of event, and the tool's own
    /// cost.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::or_default"
    )]
    pub soak: Option<crate::soak::SoakRecord>,
    /// Earlier attempts at it (a resumed run), moved aside.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_attempts: Vec<EarlierAttempt>,
    /// Fields of a newer minor version.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

fn pending() -> String {
    status::PENDING.to_owned()
}

impl CellEntry {
    /// Whether it ran to its end.
    pub fn is_done(&self) -> bool {
        self.status == status::DONE
    }
}

/// An earlier attempt at a cell, kept in a directory of its own.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EarlierAttempt {
    /// Its directory's name under `cells/`.
    #[serde(default)]
    pub dir: Option<String>,
    /// `interrupted`.
    #[serde(default)]
    pub status: String,
    /// What it measured before it stopped, if its summary could be read.
    #[serde(default, deserialize_with = "crate::or_default")]
    pub summary: Option<AttemptSummary>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_major_format_is_refused_by_name_and_older_ones_are_read() {
        assert!(check_format(None).is_ok());
        assert!(check_format(Some("1.0")).is_ok());
        assert!(check_format(Some("1.9")).is_ok());
        let newer = check_format(Some("2.0")).unwrap_err();
        assert!(newer.contains("results format 2.0"), "{newer}");
        assert!(check_format(Some("x")).is_err());
    }

    #[test]
    fn fields_of_a_newer_minor_version_are_kept() {
        let text = r#"{"format_version":"1.7","cells":[{"index":0,"target":"nginx","status":"done","dir":"000-nginx","later":[1]}],"later":{"a":1}}"#;
        let record: RunRecord = serde_json::from_str(text).unwrap();
        assert_eq!(record.other["later"]["a"], 1);
        assert_eq!(record.cells[0].other["later"][0], 1);
        let again = serde_json::to_value(&record).unwrap();
        assert_eq!(again["later"]["a"], 1);
        assert_eq!(again["cells"][0]["later"][0], 1);
    }
}
