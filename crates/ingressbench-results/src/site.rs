//! What a cell's site recorded of itself in `run.json`: where it ran (`topology`: nodes
//! and emulated links), what the kernel gave its proxies (`kernel`), the links' own added
//! time (`link_overhead_us`) and what the lab's processes spent (`usage`). The lab and
//! the scenario runner write them; the report draws them.
//!
//! Each is for the reader's eyes, not a figure a gate reads: a record that does not parse
//! (from an older or a foreign writer) is read as absent ([`crate::or_default`]) rather than making
//! the whole run unreadable.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The nodes of a lab and the emulated links between them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// `loopback` (each node an address) or `netns` (each a network namespace).
    #[serde(default)]
    pub isolation: String,
    /// Every node with something on it.
    #[serde(default)]
    pub nodes: Vec<Node>,
    /// The links a request crosses.
    #[serde(default)]
    pub links: Vec<Link>,
}

/// A node of a topology.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The node's name in the topology.
    #[serde(default)]
    pub name: String,
    /// Its address.
    #[serde(default)]
    pub address: String,
    /// Its network namespace, if it has one.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Where it sits along a request's path (client 0, front 1, proxies 2, sidecar 3,
    /// backends 4).
    #[serde(default)]
    pub column: u64,
    /// Whether it is outside the system under test.
    #[serde(default)]
    pub outside: bool,
    /// What runs on it, in words.
    #[serde(default)]
    pub runs: Vec<String>,
}

/// An emulated link, each direction.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// From this node.
    #[serde(default)]
    pub from: String,
    /// To this one.
    #[serde(default)]
    pub to: String,
    /// One-way delay.
    #[serde(default)]
    pub delay_us: u64,
    /// Its jitter.
    #[serde(default)]
    pub jitter_us: u64,
    /// Its bandwidth, when limited.
    #[serde(default)]
    pub bandwidth_bytes_per_s: Option<u64>,
    /// The probability a connection across it is reset.
    #[serde(default)]
    pub reset: f64,
}

/// What the kernel gave a cell's proxies.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    /// Per node, the sysctls in force (every one the scenario set, and
    /// `net.core.somaxconn` of a proxy's node).
    #[serde(default)]
    pub sysctls: BTreeMap<String, BTreeMap<String, String>>,
    /// Each proxy listener's accept queue.
    #[serde(default)]
    pub listeners: Vec<Listener>,
    /// Each proxy's open-file limit.
    #[serde(default)]
    pub open_files: BTreeMap<String, u64>,
    /// Per proxy node in a namespace, what its listen queues dropped during the load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen_queue: Option<BTreeMap<String, ListenQueue>>,
}

/// A proxy's listener.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Listener {
    /// The proxy.
    #[serde(default)]
    pub proxy: String,
    /// The node it listens on.
    #[serde(default)]
    pub node: String,
    /// The port.
    #[serde(default)]
    pub port: u16,
    /// The accept queue's length it got (none: not read).
    #[serde(default)]
    pub backlog: Option<u64>,
}

/// A namespace's listen-queue counters over a load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ListenQueue {
    /// Handshakes completed while the accept queue was full.
    #[serde(default)]
    pub overflows: u64,
    /// Connection requests dropped at a listener (overflows included).
    #[serde(default)]
    pub drops: u64,
}

/// The links' own added time per chunk, beyond their delay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkOverhead {
    /// Chunks relayed.
    #[serde(default)]
    pub chunks: u64,
    /// Median.
    #[serde(default)]
    pub p50: u64,
    /// 99th percentile.
    #[serde(default)]
    pub p99: u64,
    /// The most the link added to one chunk, in microseconds.
    #[serde(default)]
    pub max: u64,
}

/// What the lab's processes spent over a cell's measurement (run.json's `usage`), from
/// the readings of its `usage.jsonl`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// How often it was read.
    #[serde(default)]
    pub interval_s: f64,
    /// From the first reading of measurement to the last.
    #[serde(default)]
    pub measured_s: f64,
    /// Requests sent in it (what `cpu_ms_per_1000_requests` is over).
    #[serde(default)]
    pub requests: u64,
    /// Per role (`proxy`, `client`, `backend`, `controller`), its parts together.
    #[serde(default)]
    pub by_role: BTreeMap<String, Spent>,
    /// Per part (a process and its children).
    #[serde(default)]
    pub parts: Vec<PartSpent>,
}

impl Usage {
    /// The mean cores `role` used, if it was measured.
    pub fn cores(&self, role: &str) -> Option<f64> {
        self.by_role.get(role)?.cpu_cores_mean
    }
}

/// What a role's or a part's processes spent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    /// CPU seconds.
    #[serde(default)]
    pub cpu_s: f64,
    /// CPU milliseconds per 1,000 requests (none without a request).
    #[serde(default)]
    pub cpu_ms_per_1000_requests: Option<f64>,
    /// Cores in use on average (a role's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cores_mean: Option<f64>,
    /// Resident memory, the highest reading.
    #[serde(default)]
    pub rss_peak_bytes: u64,
    /// Resident memory, the mean of the readings.
    #[serde(default)]
    pub rss_mean_bytes: u64,
    /// How fast resident memory grew over the readings: the least-squares slope, in bytes
    /// a minute, with its 95% interval (Student's t on the readings' effective number,
    /// for readings correlated second to second; `ingressbench_stats::growth`); none
    /// with fewer than ten readings. An interval holding zero is no
    /// measurable growth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_growth_bytes_per_min: Option<Slope>,
}

/// A slope with its 95% interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Slope {
    /// The slope of the readings as taken.
    pub value: f64,
    /// Lower end of the interval.
    pub low: f64,
    /// Upper end of the interval.
    pub high: f64,
}

impl Slope {
    /// Whether the interval leaves zero out: growth (or shrinkage) measured.
    pub fn measurable(&self) -> bool {
        self.low > 0.0 || self.high < 0.0
    }
}

/// A part's share of [`Usage`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PartSpent {
    /// The part's name (`nginx`, `backend-2`…).
    #[serde(default)]
    pub name: String,
    /// What the part is (`proxy`, `backend`, `front`…).
    #[serde(default)]
    pub role: String,
    /// What it spent.
    #[serde(flatten)]
    pub spent: Spent,
}

/// A line of `usage.jsonl`: every part's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageReading {
    /// Seconds from the start of measurement (negative in the warm-up).
    pub t_s: f64,
    /// Each part.
    #[serde(default)]
    pub parts: Vec<PartReading>,
}

impl UsageReading {
    /// The CPU seconds of the parts with `role`, together.
    pub fn cpu_s(&self, role: &str) -> f64 {
        (self.parts.iter())
            .filter(|p| p.role == role)
            .map(|p| p.cpu_s)
            .sum()
    }
}

/// A part's counters in a reading.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PartReading {
    /// The part's name (`nginx`, `backend-2`…).
    #[serde(default)]
    pub name: String,
    /// What the part is (`proxy`, `backend`, `front`…).
    #[serde(default)]
    pub role: String,
    /// CPU seconds since it started (with what replaced processes of it spent).
    #[serde(default)]
    pub cpu_s: f64,
    /// Resident memory.
    #[serde(default)]
    pub rss_bytes: u64,
    /// Its processes.
    #[serde(default)]
    pub processes: u64,
    /// The descriptors its processes hold open (none where they could not be read, or
    /// for a part read elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fds: Option<u64>,
}

/// A line of `proxy-metrics.jsonl`: what each proxy counted (its own metrics, by the
/// tool's names: `retries`, `responses_5xx`, …) at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CountsReading {
    /// Seconds from the start of measurement (negative in the warm-up).
    pub t_s: f64,
    /// Each proxy's counts, by name.
    #[serde(default)]
    pub proxies: BTreeMap<String, BTreeMap<String, u64>>,
    /// The proxies that could not be read, and why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, String>,
}
