//! A soak's verdict, in run.json's cell entry (`soak`), and the lines of soak.jsonl (the
//! tool's own cost, written as the soak goes). Every growth is a slope with its 95%
//! interval ([`Slope`]); an interval that holds zero is no measurable growth.

use serde::{Deserialize, Serialize};

use crate::site::Slope;

/// What a soak cell found, written when it ends.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SoakRecord {
    /// How long the load ran, as planned.
    #[serde(default)]
    pub duration_s: f64,
    /// The timeline's length: its events fired again every this long.
    #[serde(default)]
    pub period_s: f64,
    /// Where in the soak's time this run started (a resumed soak: where the earlier
    /// attempt stopped, its last soak.jsonl line; its figures are in its directory).
    #[serde(default)]
    pub from_s: f64,
    /// Events fired.
    #[serde(default)]
    pub firings: u64,
    /// Per part of the site (proxy, backends, front, sidecar): what grew.
    #[serde(default)]
    pub parts: Vec<SoakPart>,
    /// Per kind of event (the first word of what it did: `reload`, `scale`): its errors
    /// and latency after each firing, against the firing's number.
    #[serde(default)]
    pub events: Vec<SoakEvents>,
    /// What the tool itself spent over the soak (from soak.jsonl).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolCost>,
    /// Sampled requests outside the events' windows: seen, and kept in the reservoir
    /// (samples-rest.csv.gz).
    #[serde(default)]
    pub outside_windows_seen: u64,
    /// Of them, kept.
    #[serde(default)]
    pub outside_windows_kept: u64,
    /// What the cell's files and the report were estimated to take, and the run's budget.
    #[serde(default)]
    pub estimate_bytes: u64,
    /// See [`SoakRecord::estimate_bytes`].
    #[serde(default)]
    pub budget_bytes: u64,
}

/// What grew in one part of the site over a soak.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SoakPart {
    /// The part (`nginx`, `echo-1`).
    #[serde(default)]
    pub name: String,
    /// What it is (`proxy`, `backend`).
    #[serde(default)]
    pub role: String,
    /// Resident memory against events fired: bytes per 100 firings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes_per_100_firings: Option<Slope>,
    /// Resident memory against time: bytes a minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes_per_min: Option<Slope>,
    /// Open descriptors against time: a minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fds_per_min: Option<Slope>,
    /// CPU per 1,000 requests against time: milliseconds per 1,000 requests, a minute
    /// (its CPU a second over the load's mean rate, which an open-loop soak holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms_per_1000_per_min: Option<Slope>,
    /// Its resident memory at the first and the last reading.
    #[serde(default)]
    pub rss_first_bytes: u64,
    /// See [`SoakPart::rss_first_bytes`].
    #[serde(default)]
    pub rss_last_bytes: u64,
    /// The process count it had at the start of measurement, before any event (its
    /// master and workers).
    #[serde(default)]
    pub processes_at_start: u32,
    /// The most it had at once.
    #[serde(default)]
    pub processes_max: u32,
    /// Each stretch of readings with more processes than at the start (old generations alive
    /// after a reload or an upgrade), the first [`MAX_STRETCHES`].
    #[serde(default)]
    pub extra_processes: Vec<ExtraProcesses>,
    /// How many such stretches there were.
    #[serde(default)]
    pub extra_stretches: u64,
    /// The longest of them, in seconds.
    #[serde(default)]
    pub extra_longest_s: f64,
}

/// At most this many stretches of extra processes are listed per part.
pub const MAX_STRETCHES: usize = 200;

/// A stretch of readings with more processes than at the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtraProcesses {
    /// Its first reading, in seconds from the start of measurement.
    pub from_s: f64,
    /// The first reading after it back at the start's count or under (or the last
    /// reading).
    pub to_s: f64,
    /// The most processes over the start's count within it.
    pub extra: u32,
}

/// One kind of event over a soak.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SoakEvents {
    /// The kind (`reload`).
    #[serde(default)]
    pub kind: String,
    /// How many times it fired.
    #[serde(default)]
    pub firings: u64,
    /// Failed requests in all its windows.
    #[serde(default)]
    pub errors: u64,
    /// Failed requests in each firing's window against its number: per 100 firings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors_per_100_firings: Option<Slope>,
    /// The p99 in the 5 s after each firing against its number: milliseconds per 100
    /// firings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_after_ms_per_100_firings: Option<Slope>,
}

/// The tool's own cost over a soak (the first and the last line of soak.jsonl).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolCost {
    /// Its resident memory at the first line and the last.
    #[serde(default)]
    pub rss_first_bytes: u64,
    /// See [`ToolCost::rss_first_bytes`].
    #[serde(default)]
    pub rss_last_bytes: u64,
    /// Its resident memory against time: bytes a minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes_per_min: Option<Slope>,
    /// CPU per 1,000 requests over the first interval and the last.
    #[serde(default)]
    pub cpu_ms_per_1000_first: Option<f64>,
    /// See [`ToolCost::cpu_ms_per_1000_first`].
    #[serde(default)]
    pub cpu_ms_per_1000_last: Option<f64>,
    /// Its open descriptors at the first line and the last.
    #[serde(default)]
    pub fds_first: Option<u64>,
    /// See [`ToolCost::fds_first`].
    #[serde(default)]
    pub fds_last: Option<u64>,
    /// The results directory at the last line.
    #[serde(default)]
    pub results_bytes: u64,
}

/// One line of soak.jsonl: every `soak.every`, what the tool itself spent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SoakLine {
    /// Seconds from the start of measurement.
    #[serde(default)]
    pub t_s: f64,
    /// Seconds into the soak (`t_s` after where this run started: a resumed soak's
    /// `soak.from`).
    #[serde(default)]
    pub soak_t_s: f64,
    /// Requests the load has ended so far.
    #[serde(default)]
    pub requests: u64,
    /// The tool's resident memory.
    #[serde(default)]
    pub rss_bytes: u64,
    /// The tool's CPU time so far (user and system).
    #[serde(default)]
    pub cpu_s: f64,
    /// Its CPU per 1,000 requests since the line before.
    #[serde(default)]
    pub cpu_ms_per_1000_requests: Option<f64>,
    /// Its open descriptors.
    #[serde(default)]
    pub fds: Option<u64>,
    /// The run's results directory, every file in it.
    #[serde(default)]
    pub results_bytes: u64,
    /// Events fired so far.
    #[serde(default)]
    pub firings: u64,
    /// Sampled requests outside the events' windows so far.
    #[serde(default)]
    pub outside_windows_seen: u64,
    /// Of them, in the reservoir.
    #[serde(default)]
    pub outside_windows_kept: u64,
}
