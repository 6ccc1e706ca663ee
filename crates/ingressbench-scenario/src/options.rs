//! What a run is asked to do ([`RunOptions`], from the command line) and what it tells
//! while a cell is measured ([`Live`]). Shared by the run loop and the cell, so that
//! neither imports the other for them.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ingressbench_lab::proxy::Binaries;
use ingressbench_load::Progress;

/// How to run.
pub struct RunOptions {
    /// The results directory to create.
    pub dir: PathBuf,
    /// Scale durations and intervals down so that the run takes about 90 s.
    pub quick: bool,
    /// The `ingressbench` binary (for backends).
    pub backend_binary: PathBuf,
    /// Where proxy binaries are found.
    pub binaries: Binaries,
    /// Set by Ctrl-C: stop after the cell in progress, keeping what was measured.
    pub stop: Arc<AtomicBool>,
    /// The command line, recorded to reproduce the run.
    pub command: String,
    /// The scenario file's text, recorded as run.
    pub scenario_text: String,
    /// The `--set` overrides, recorded so that `--resume` expands the same cells.
    pub sets: Vec<(String, String)>,
    /// The cells the matrix left out, each with why (kept in run.json).
    pub left_out: Vec<String>,
    /// Continue the run recorded in `dir`: cells already done are skipped.
    pub resume: bool,
    /// Replace a run already in `dir` (its run.json and cells) instead of refusing.
    pub force: bool,
    /// Told the state of the cell in progress about once a second.
    pub live: Option<LiveFn>,
    /// The live metrics' endpoint (`--metrics-listen`): every cell's windows, the current
    /// cell's settings and each event as it fires.
    pub metrics: Option<Arc<ingressbench_load::live::Live>>,
    /// Run each cell in a Kubernetes cluster instead of a lab (`--cluster`).
    pub cluster: Option<ClusterOptions>,
}

/// Where `--cluster` sends the cells.
#[cfg(feature = "cluster")]
pub use crate::cluster_site::ClusterOptions;

/// Without the `cluster` feature no cluster can be named: a type with no values.
#[cfg(not(feature = "cluster"))]
#[derive(Clone, Debug)]
pub enum ClusterOptions {}

/// What [`RunOptions::live`] is called with.
pub type LiveFn = Arc<dyn Fn(&Live) + Send + Sync>;

/// The state of a run while a cell is measured.
#[derive(Clone, Debug)]
pub struct Live {
    /// The cell in progress (from 1) …
    pub cell: usize,
    /// … of this many.
    pub cells: usize,
    /// Its label.
    pub label: String,
    /// Since the run (or the resumed run) started.
    pub run_elapsed: Duration,
    /// Planned time left, this cell's rest included.
    pub remaining: Duration,
    /// The load engine's state for this cell.
    pub load: Progress,
}
