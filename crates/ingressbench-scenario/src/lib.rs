//! Scenario files: one YAML file describes an experiment (which systems to compare, the
//! lab behind them, the load, a timeline of events, a matrix of settings and a number of
//! repeats), and [`expand`] turns it into the [`Cell`]s a runner executes, in an order
//! that interleaves repeats (A B C A B C) so that drift in the machine spreads evenly.
//!
//! ```
//! use ingressbench_scenario::expand;
//!
//! let text = "
//! name: demo
//! targets: [nginx, haproxy]
//! load: { mode: open, rate: 100, duration: 10s }
//! matrix: { load.rate: [100, 500] }
//! repeat: 2
//! ";
//! let cells = expand(text, std::path::Path::new("demo.yaml"), &[], false).unwrap();
//! assert_eq!(cells.len(), 2 * 2 * 2);
//! assert_eq!(cells[0].target.name(), "nginx");
//! assert_eq!(cells[1].target.name(), "haproxy");
//! assert_eq!(cells[4].repeat, 1);
//! ```

pub mod capacity;
pub mod ceiling;
mod cell;
mod check;
#[cfg(feature = "cluster")]
pub mod cluster_site;
mod error;
mod expand;
pub mod impact;
mod load;
mod lock;
mod model;
mod options;
mod propagation;
mod proxy_counts;
mod record;
pub mod runner;
mod search;
mod site;
pub mod soak;
mod timeline;
mod usage;

pub use error::ScenarioError;
pub use expand::{
    expand, expand_noting, expand_with, lab_only_target_settings, names_cluster_targets, Cell,
};
pub use model::{
    ConfigChange, EventFile, EventSpec, LoadFile, LoadFrom, LoadModeFile, NodePlacement,
    PlacementFile, Scenario, Target, Timing,
};
pub use options::ClusterOptions;

/// Runs `cells` (from [`expand`]) into `options.dir`; `progress` is told about each cell
/// as it starts and ends. Cells of a scenario with `search:` are searches, each run as
/// the trials it chooses (`search.rs`); others are run once each (`runner.rs`).
pub fn run(
    cells: &[Cell],
    options: &runner::RunOptions,
    mut progress: impl FnMut(&str),
) -> Result<runner::RunOutcome, ScenarioError> {
    if cells.iter().any(|c| c.scenario.search.is_some()) {
        search::run(cells, options, &mut progress)
    } else {
        runner::run_cells(cells, options, progress)
    }
}
