//! `workers.json`: a cell whose load several processes sent (`load.workers`, or the
//! cluster's pods): each worker's own part and health, the merged p99 beside the average
//! of the workers' p99s, and where a cluster's ran. The load engine's coordinator makes
//! the [`Worker`]s; the scenario runner writes the file; the report reads it.

use ingressbench_stats::Summary;
use serde::{Deserialize, Serialize};

/// workers.json as a whole.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkersFile {
    /// Each worker, by index.
    pub workers: Vec<Worker>,
    /// The merged run's p99, in microseconds.
    #[serde(default)]
    pub merged_p99_us: Option<u64>,
    /// The average of the workers' p99s, in microseconds: what tools that average
    /// per-worker percentiles report instead of the merged p99.
    #[serde(default)]
    pub p99_average_of_workers_us: Option<f64>,
    /// With the load from a cluster's pods: the Job and where its pods and the backends
    /// ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Placement>,
}

/// What became of one worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Worker {
    /// The worker's index (0 to N-1).
    pub index: usize,
    /// Where it ran (host or pod name).
    #[serde(default)]
    pub host: String,
    /// Where the coordinator placed it, as the cluster says (`pod … on node …`).
    #[serde(default)]
    pub place: Option<String>,
    /// How late it began against the common start, by its own clock, in milliseconds.
    #[serde(default)]
    pub start_late_ms: Option<f64>,
    /// How far its clock is ahead of the coordinator's at least, in milliseconds (its
    /// clock as it wrote a line minus the coordinator's as it read it, at most over the
    /// run: the offset less the quickest delivery). Negative: no sign it is ahead; a
    /// clock behind cannot be told from a slow delivery.
    #[serde(default)]
    pub clock_ahead_at_least_ms: Option<f64>,
    /// Whether it handed over its whole recorder. A worker that did not counts with the
    /// windows it sent (latency and outcomes only).
    #[serde(default)]
    pub complete: bool,
    /// How it ended (`exit 0`, `killed by signal 9`, …).
    #[serde(default)]
    pub exit: String,
    /// Why it could not run, if it said.
    #[serde(default)]
    pub error: Option<String>,
    /// The last lines it wrote on its standard error.
    #[serde(default)]
    pub stderr: Vec<String>,
    /// The summary of its own requests (against its share of the target rate).
    pub summary: Summary,
    /// What is wrong with its share, in words, each naming it.
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// Where a load Job's pods and the backends ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    /// The Job's name.
    pub job: String,
    /// Each worker's pod and node.
    #[serde(default)]
    pub worker_nodes: Vec<WorkerNode>,
    /// The nodes the backends were on when the workers started.
    #[serde(default)]
    pub backend_nodes: Vec<String>,
}

/// One worker's pod and node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerNode {
    /// The worker's index.
    pub index: usize,
    /// Its pod.
    pub pod: String,
    /// The node the worker ran on.
    #[serde(default)]
    pub node: String,
}
