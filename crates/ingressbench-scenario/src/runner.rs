//! The run loop: every cell in order into a results directory that is complete after
//! every cell and never lost: resume, `--force`, Ctrl-C, a full disk, and the factor that
//! scales a run down for `--quick`. One cell is [`crate::cell`]; what run.json holds and
//! what a run may touch in a results directory is [`crate::record`]; the files a cell
//! streams while it runs are [`crate::store`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ingressbench_load::Progress;
use ingressbench_results::run::{status, CellEntry, RunRecord};

use crate::cell::{run_cell, CellDone, SiteCache};
use crate::load::dur;
use crate::lock::ResultsLock;
pub use crate::options::{Live, LiveFn, RunOptions};
use crate::record::{
    cell_dir_name, clear_previous_run, fresh_cell_dir, new_record, now_unix, own_record, real_dir,
    write_json, Fresh,
};
use crate::site::CellFailure;
use crate::{Cell, ScenarioError};
use ingressbench_load::streams::ProgressFn;

/// With `--quick`, the whole run aims to take about this long.
const QUICK_BUDGET: Duration = Duration::from_secs(90);

/// What `--resume` needs from a results directory.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The scenario file's text as run.
    pub scenario_text: String,
    /// Its `--set` overrides.
    pub sets: Vec<(String, String)>,
    /// Whether it ran with `--quick`.
    pub quick: bool,
}

/// Reads what `--resume` needs from a results directory's run.json.
pub fn recorded(dir: &Path) -> Result<Recorded, ScenarioError> {
    let path = dir.join("run.json");
    let bad = |m: String| ScenarioError::at(&path, m);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        bad(format!(
            "cannot read it ({e}); is {} a results directory?",
            dir.display()
        ))
    })?;
    let record: RunRecord =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a run record: {e}")))?;
    ingressbench_results::run::check_format(record.format_version.as_deref()).map_err(bad)?;
    let scenario = record
        .scenario_text
        .ok_or_else(|| bad("no scenario_text".into()))?;
    Ok(Recorded {
        scenario_text: scenario,
        sets: record.sets,
        quick: record.quick,
    })
}

/// How a run ended.
#[derive(Debug)]
pub struct RunOutcome {
    /// The results directory.
    pub dir: PathBuf,
    /// Cells that finished.
    pub done: usize,
    /// Cells planned.
    pub total: usize,
    /// `complete`, `incomplete` (interrupted) or `failed`.
    pub status: &'static str,
    /// What failed, if a cell did.
    pub error: Option<String>,
    /// The failure was the input's (a usage error), not the run's.
    pub input_error: bool,
}

/// Runs `cells` (from [`crate::expand`]) into `options.dir`, each once (a scenario with
/// `search:` is run by [`crate::run`] as searches); `progress` is told about each cell as
/// it starts and ends.
pub(crate) fn run_cells(
    cells: &[Cell],
    options: &RunOptions,
    mut progress: impl FnMut(&str),
) -> Result<RunOutcome, ScenarioError> {
    let factor = if options.quick {
        quick_factor(cells)
    } else {
        1.0
    };
    let mut runner = Runner::start(cells, options, factor)?;
    runner.outcome.total = cells.len();
    for cell in cells {
        if runner.record.cells[cell.index].is_done() {
            runner.outcome.done += 1;
            continue;
        }
        if options.stop.load(Ordering::Relaxed) {
            runner.outcome.status = "incomplete";
            break;
        }
        progress(&format!(
            "cell {}/{}: {} (repeat {})",
            cell.index + 1,
            cells.len(),
            cell.label(),
            cell.repeat + 1
        ));
        let live = live_for(
            cell,
            cells,
            &runner.record,
            (options, factor, runner.started),
        );
        if runner.run_cell(cell, live, &mut progress)? {
            break;
        }
    }
    runner.finish()
}

/// A run in progress: its results directory held, its record, and what its cells share.
pub(crate) struct Runner<'a> {
    pub(crate) options: &'a RunOptions,
    pub(crate) factor: f64,
    /// The record an earlier attempt left (`--resume`).
    pub(crate) previous: Option<RunRecord>,
    pub(crate) record: RunRecord,
    pub(crate) outcome: RunOutcome,
    pub(crate) started: Instant,
    sites: SiteCache,
    lock: ResultsLock,
}

impl<'a> Runner<'a> {
    /// Takes `options.dir` (cleared unless resumed) and writes the first record, listing
    /// `cells`.
    pub(crate) fn start(
        cells: &[Cell],
        options: &'a RunOptions,
        factor: f64,
    ) -> Result<Self, ScenarioError> {
        // Held until the run returns: one writer per results directory.
        let lock = ResultsLock::acquire(&options.dir)?;
        if !options.resume {
            clear_previous_run(&options.dir, options.force)?;
        }
        real_dir(&options.dir.join("cells"))?;
        let previous = match options.resume {
            true => Some(own_record(&options.dir)?),
            false => None,
        };
        let record = new_record(cells, options, factor, previous.as_ref());
        let runner = Self {
            options,
            factor,
            previous,
            record,
            outcome: RunOutcome {
                dir: options.dir.clone(),
                done: 0,
                total: cells.len(),
                status: "complete",
                error: None,
                input_error: false,
            },
            started: Instant::now(),
            sites: SiteCache::default(),
            lock,
        };
        runner.save()?;
        Ok(runner)
    }

    /// Writes run.json as it stands (even on a full disk: the lock's reserve).
    pub(crate) fn save(&self) -> Result<(), ScenarioError> {
        let path = self.options.dir.join("run.json");
        self.lock
            .write_even_if_full(|| write_json(&path, &self.record))
            .map_err(|e| ScenarioError::at(&path, format!("cannot write results: {e}")))
    }

    /// Runs `cell` (its entry in the record at `cell.index`) into its directory and
    /// records how it went; whether the run stops there (interrupted or failed).
    pub(crate) fn run_cell(
        &mut self,
        cell: &Cell,
        live: Option<ProgressFn>,
        progress: &mut dyn FnMut(&str),
    ) -> Result<bool, ScenarioError> {
        let options = self.options;
        let path = options.dir.join("run.json");
        let io = |e: std::io::Error| ScenarioError::at(&path, format!("cannot write results: {e}"));
        let dir = options.dir.join("cells").join(cell_dir_name(cell));
        let previous_entry = (self.previous.as_ref()).and_then(|p| p.cells.get(cell.index));
        let kept =
            fresh_cell_dir(&options.dir, &dir, cell, previous_entry).map_err(|e| match e {
                Fresh::NotOurs(e) => e,
                Fresh::Io(e) => io(e),
            })?;
        let resumed;
        let mut cell = cell;
        if let Some((attempts, said)) = kept {
            progress(&format!("  {said}"));
            // A soak goes on from where its last attempt stopped.
            if let Some((soak, from_s)) =
                crate::soak::resumed(&options.dir, cell, &attempts, self.factor)
            {
                progress(&format!("  the soak goes on from {from_s:.0} s"));
                resumed = soak;
                cell = &resumed;
            }
            self.record.cells[cell.index].earlier_attempts = attempts;
        }
        let result = run_cell(
            cell,
            &dir,
            options,
            self.factor,
            live,
            &mut self.sites,
            &self.lock,
        );
        let entry = &mut self.record.cells[cell.index];
        let outcome = &mut self.outcome;
        let stop = match result {
            Ok(done) => {
                progress(&format!("  {}", done.line));
                let interrupted = done.interrupted;
                entry.files = Some(files_written(&dir));
                if let Some(why) = note_done(entry, done) {
                    outcome.error = Some(format!("cell {} ({}): {why}", cell.index, cell.label()));
                    self.record.error.clone_from(&outcome.error);
                }
                if interrupted {
                    outcome.status = "incomplete";
                } else {
                    outcome.done += 1;
                }
                interrupted
            }
            Err(CellFailure {
                message: e,
                input,
                soak,
            }) => {
                entry.status = status::FAILED.to_owned();
                entry.error = Some(e.clone());
                entry.soak = soak.map(|s| *s);
                outcome.status = "failed";
                outcome.input_error = input;
                outcome.error = Some(format!("cell {} ({}): {e}", cell.index, cell.label()));
                self.record.error.clone_from(&outcome.error);
                true
            }
        };
        self.save()?;
        Ok(stop)
    }

    /// Ends the record (status and end time) and returns how the run ended.
    pub(crate) fn finish(mut self) -> Result<RunOutcome, ScenarioError> {
        self.record.status = self.outcome.status.to_owned();
        self.record.finished_at_unix_s = Some(now_unix());
        self.save()?;
        Ok(self.outcome)
    }
}

/// The files a cell wrote at its top level, each with its size in bytes: the report
/// refuses a cell whose files are no longer these (one deleted, emptied or cut), where it
/// would otherwise leave out the section the file held without a word.
fn files_written(dir: &Path) -> BTreeMap<String, u64> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let (Ok(kind), Some(name)) = (
            entry.file_type(),
            entry.file_name().to_str().map(str::to_owned),
        ) else {
            continue;
        };
        if let (true, Ok(meta)) = (kind.is_file(), entry.metadata()) {
            files.insert(name, meta.len());
        }
    }
    files
}

/// Writes what a cell that ran returned into its entry of run.json; the reason it was cut
/// short (a full disk), if it was.
fn note_done(entry: &mut CellEntry, done: CellDone) -> Option<String> {
    entry.status = if done.interrupted {
        status::INTERRUPTED
    } else {
        status::DONE
    }
    .to_owned();
    entry.summary = Some(done.summary);
    entry.proxy_version = done.proxy_version;
    entry.entry = Some(done.entry);
    entry.lab_reused = Some(done.lab_reused);
    entry.measure_from_s = Some(done.measure_from_s);
    entry.link_overhead_us = done.link_overhead_us;
    entry.kernel = done.kernel;
    entry.topology = done.topology;
    entry.routes = done.routes;
    entry.usage = done.usage;
    entry.soak = done.soak;
    if let Some(why) = &done.cut_short {
        entry.error = Some(why.clone());
    }
    done.cut_short
}

/// What tells `options.live` the state of the run while `cell` is measured: the cell, the
/// time since the run started and the planned time left (this cell's rest and the cells
/// after it not done yet).
fn live_for(
    cell: &Cell,
    cells: &[Cell],
    record: &RunRecord,
    (options, factor, run_start): (&RunOptions, f64, Instant),
) -> Option<ProgressFn> {
    let this = planned(cell).mul_f64(factor);
    let after: Duration = cells[cell.index + 1..]
        .iter()
        .filter(|c| !record.cells[c.index].is_done())
        .map(|c| planned(c).mul_f64(factor))
        .sum();
    live_line(options, cell, cells.len(), (this, after), run_start)
}

/// What tells `options.live` about `cell` (of `total`), planned to take `this` with
/// `after` left behind it.
pub(crate) fn live_line(
    options: &RunOptions,
    cell: &Cell,
    total: usize,
    (this, after): (Duration, Duration),
    run_start: Instant,
) -> Option<ProgressFn> {
    let f = options.live.clone()?;
    let (label, index) = (cell.label(), cell.index + 1);
    let cell_start = Instant::now();
    Some(Box::new(move |p: &Progress| {
        f(&Live {
            cell: index,
            cells: total,
            label: label.clone(),
            run_elapsed: run_start.elapsed(),
            remaining: after + this.saturating_sub(cell_start.elapsed()),
            load: p.clone(),
        });
    }))
}

/// How long a cell is planned to take, unscaled: warm-up, measurement and about 2 s of
/// set-up and tear-down.
pub(crate) fn planned(cell: &Cell) -> Duration {
    let l = &cell.scenario.load;
    let time = |v: &Option<String>| dur("", v).ok().flatten();
    let soak = crate::soak::Soak::of(cell, 1.0).ok().flatten();
    let measured = match (soak.map(|s| s.length()).or(time(&l.duration)), l.requests) {
        (Some(d), _) => d + time(&l.warmup).unwrap_or_default(),
        (None, Some(n)) => {
            let each = time(&l.interval).unwrap_or_default() + Duration::from_millis(1);
            each * (n + l.warmup_requests.unwrap_or(0)).min(u64::from(u32::MAX)) as u32
        }
        (None, None) => Duration::from_secs(10),
    };
    measured + Duration::from_secs(2)
}

/// The factor that brings the run's planned time to about its file's `quick.budget`, or
/// [`QUICK_BUDGET`] (at most 1).
fn quick_factor(cells: &[Cell]) -> f64 {
    let planned: f64 = cells.iter().map(|c| planned(c).as_secs_f64()).sum();
    let budget = cells
        .first()
        .and_then(|c| c.scenario.quick.budget.as_deref())
        .and_then(|b| ingressbench_stats::parse_duration(b).ok())
        .unwrap_or(QUICK_BUDGET);
    (budget.as_secs_f64() / planned).min(1.0)
}
