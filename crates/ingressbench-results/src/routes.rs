//! `routes.json`: for a cell whose events added or removed routes, what the route probe
//! found per firing (a step, or routes one at a time): each route's time to its first
//! right answer, the figure's resolution, wrong answers, routes never right, the proxy's
//! memory and CPU around it, and what the tool spent. Written by the scenario's route
//! probe, read by the report (which refuses a file with a negative figure first).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// routes.json as a whole.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoutesFile {
    /// How the probe asked, and what it spent.
    #[serde(default)]
    pub probe: Probe,
    /// The tool's CPU for the route changes and the probe.
    #[serde(default)]
    pub tool_cpu_ms: f64,
    /// Every firing, in order.
    pub firings: Vec<Firing>,
}

/// The route probe.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    /// Probes per second, as asked.
    #[serde(default)]
    pub rate: f64,
    /// Its connections.
    #[serde(default)]
    pub connections: usize,
    /// Its CPU.
    #[serde(default)]
    pub cpu_ms: f64,
}

/// One firing of a route event: a step, or routes one at a time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Firing {
    /// The event, an index into the scenario's.
    #[serde(default)]
    pub event: usize,
    /// What it did, in words.
    #[serde(default)]
    pub what: String,
    /// Whether its routes were asked for one per update.
    #[serde(default)]
    pub one_at_a_time: bool,
    /// Routes it asks for in all.
    #[serde(default)]
    pub planned: usize,
    /// Routes in force once its changes were asked for.
    #[serde(default)]
    pub routes_after: Option<u64>,
    /// The proxy's configuration as rendered for them (the lab's).
    #[serde(default)]
    pub config_bytes: Option<u64>,
    /// Routes handed to the probe.
    #[serde(default)]
    pub asked: u64,
    /// Of them, those that answered right.
    #[serde(default)]
    pub right: u64,
    /// When its first route was asked for, seconds from the start of measurement.
    #[serde(default)]
    pub requested_s: Option<f64>,
    /// Each route's time to its first right answer.
    #[serde(default)]
    pub time_to_right_ms: TimeToRight,
    /// From its first request to the last route's first right answer.
    #[serde(default)]
    pub last_right_ms: Option<f64>,
    /// The gap between a route's last wrong probe and its first right one's answer.
    #[serde(default)]
    pub resolution_ms: Resolution,
    /// Answers that were neither the before nor the after, by kind (`503`).
    #[serde(default)]
    pub wrong: BTreeMap<String, u64>,
    /// Probes sent.
    #[serde(default)]
    pub probes: u64,
    /// The tool's CPU for making and applying its changes.
    #[serde(default)]
    pub tool_cpu_ms: f64,
    /// Routes never right, by name.
    #[serde(default)]
    pub never_right: Vec<String>,
    /// The CDF of time to right: (ms, fraction), up to 100 points.
    #[serde(default)]
    pub cdf: Vec<[f64; 2]>,
    /// The proxy's resident memory just before it and just before the next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_rss_bytes: Option<Memory>,
    /// What the proxy spent from its request to the next firing's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_cpu_ms: Option<f64>,
    /// In a local cluster, a controller apart from its proxy: as for the proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_rss_bytes: Option<Memory>,
    /// As for the proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_cpu_ms: Option<f64>,
}

impl Firing {
    /// The routes present before it (routes in force after it, less those it asked for).
    pub fn routes_before(&self) -> f64 {
        self.routes_after.unwrap_or(0) as f64 - self.asked as f64
    }
}

/// Times to first right answer, nearest-rank; none with no route right.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeToRight {
    /// Median.
    #[serde(default)]
    pub p50: Option<f64>,
    /// 90th percentile.
    #[serde(default)]
    pub p90: Option<f64>,
    /// 99th percentile.
    #[serde(default)]
    pub p99: Option<f64>,
    /// The p99's 95% interval, from order statistics.
    #[serde(default)]
    pub p99_interval: Option<[f64; 2]>,
    /// The slowest route's time, in milliseconds.
    #[serde(default)]
    pub max: Option<f64>,
}

/// A firing's resolution.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Resolution {
    /// Median.
    #[serde(default)]
    pub p50: Option<f64>,
    /// The widest gap between a route's last wrong and first right answer, in milliseconds.
    #[serde(default)]
    pub max: Option<f64>,
}

/// Resident memory around a firing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// Just before it.
    #[serde(default)]
    pub before: Option<u64>,
    /// Just before the next firing (or the end).
    #[serde(default)]
    pub after: Option<u64>,
}
