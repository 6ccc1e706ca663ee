//! A run of a scenario with `search:`: each of its cells is a capacity search
//! ([`crate::capacity`]), run as trials the search chooses one after another. A trial is
//! an ordinary cell of the run (its load at one rate, the scenario's events on their
//! timeline, its own directory and entry in run.json), so report, compare and `--resume`
//! take it as they take any cell; its entry also says which search it belongs to, why it
//! ran and its verdict, and run.json's `searches` says where each search ended.
//!
//! A trial is judged from its interval log, read back once it ends (with load workers,
//! the merged one): the same path a resumed run takes, which rebuilds each search from
//! the verdicts its finished trials recorded.

use std::time::Duration;

use crate::capacity::{
    describe, figure_records, pooled_text, GeneratorSeen, Pool, Search, SearchPlan, Verdict,
    WindowFigures,
};
use crate::ceiling::Ceiling;
use crate::record::{cell_dir_name, cell_entry};
use crate::runner::{live_line, planned, RunOptions, RunOutcome, Runner};
use crate::{Cell, ScenarioError};
use ingressbench_results::capacity::{SearchRecord, TrialRecord};
use ingressbench_results::run::{CellEntry, RunRecord};

/// Runs a search for each of `bases` (the expanded cells of a scenario with `search:`).
pub(crate) fn run(
    bases: &[Cell],
    options: &RunOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<RunOutcome, ScenarioError> {
    let mut runner = Runner::start(&[], options, 1.0)?;
    runner.record.scenario = (bases.first())
        .map(|c| c.scenario.name.clone())
        .unwrap_or_default();
    runner.record.searches = Some(Vec::new());
    let earlier: Vec<CellEntry> = (runner.previous.as_ref())
        .map(|p| p.cells.clone())
        .unwrap_or_default();
    let results = options.dir.join("run.json");
    let bad = |m: String| ScenarioError::at(&results, m);
    // The generator's ceiling for each shape of load the searches send, measured once.
    let mut ceilings: Vec<(String, Option<Ceiling>)> = Vec::new();
    'searches: for (n, base) in bases.iter().enumerate() {
        let file = base.scenario.search.as_ref().ok_or_else(|| {
            bad(format!(
                "cell {} ({}) has no search",
                base.index,
                base.label()
            ))
        })?;
        let plan = SearchPlan::of(file).map_err(bad)?;
        let mut search = Search::new(plan.bounds);
        let mut pool = Pool::default();
        let too_small = plan.too_small_at(plan.bounds.from);
        for warning in &too_small {
            progress(&format!("warning: {}: {warning}", base.label()));
        }
        let ceiling = ceiling_for(base, &plan, options, &mut ceilings).map_err(&bad)?;
        progress(&format!(
            "search {}/{}: {}: {}",
            n + 1,
            bases.len(),
            base.label(),
            ceiling.as_ref().map_or_else(
                || "the generator's ceiling is not measured here: the load is sent from the cluster's pods (each trial's merged lag is judged)".into(),
                |c| c.describe(plan.bounds.up_to)
            )
        ));
        searches(&mut runner.record).push(SearchRecord {
            of: base.index,
            label: base.label(),
            target: base.target.name().to_owned(),
            settings: cell_entry(base).settings,
            slo: file.slo.clone(),
            trial_s: plan.trial.as_secs_f64(),
            bounds: plan.bounds.record(),
            trials: Vec::new(),
            outcome: None,
            status: "searching".into(),
            warnings: too_small,
            spent: None,
            generator_ceiling: ceiling.as_ref().map(Ceiling::record),
        });
        // What an earlier attempt finished of this search, taken as it was.
        for entry in earlier
            .iter()
            .filter(|e| e.search.as_ref().is_some_and(|s| s.of == base.index) && e.is_done())
        {
            let index = runner.record.cells.len();
            let trial = entry.search.as_ref();
            let (Some(rate), Some(verdict)) = (
                trial.and_then(|t| t.rate_per_s),
                trial
                    .and_then(|t| t.verdict.as_ref())
                    .map(Verdict::from_record),
            ) else {
                return Err(bad(format!(
                    "cell {index}: a finished trial without its rate or verdict; run the scenario again without --resume"
                )));
            };
            if entry.index != Some(index) {
                return Err(bad(format!(
                    "the finished trials are not in running order (cell {:?} where {index} was due); run the scenario again without --resume",
                    entry.index
                )));
            }
            push_cell(&mut runner.record, entry.clone(), n);
            // A straddle's windows, for the repeats still to run.
            pool.with(&search, &[]);
            if matches!(verdict, Verdict::Straddle(_)) {
                let dir = options
                    .dir
                    .join("cells")
                    .join(entry.dir.as_deref().unwrap_or(""));
                pool.keep(windows_of(&plan, &dir).map_err(|m| bad(format!("cell {index}: {m}")))?);
            }
            search.record(rate, verdict);
            runner.outcome.done += 1;
        }
        while let Some((rate, why)) = search.next_rate() {
            if options.stop.load(std::sync::atomic::Ordering::Relaxed) {
                runner.outcome.status = "incomplete";
                break 'searches;
            }
            let trial = search.trials().len() + 1;
            let cell = trial_cell(base, runner.record.cells.len(), rate);
            push_cell(&mut runner.record, cell_entry(&cell), n);
            runner.save()?;
            progress(&format!(
                "search {}/{}: {}: trial {trial} at {rate} req/s ({why})",
                n + 1,
                bases.len(),
                base.label()
            ));
            let live = live_line(
                options,
                &cell,
                cell.index + 1,
                (planned(&cell), Duration::ZERO),
                runner.started,
            );
            if runner.run_cell(&cell, live, progress)? {
                break 'searches;
            }
            let seed = 0x5ea_4c11 + (base.index as u64) * 1000 + trial as u64;
            let entry = &mut runner.record.cells[cell.index];
            let dir = options.dir.join("cells").join(cell_dir_name(&cell));
            let (own, mut seen) = trial_figures(&plan, (&cell, &dir, entry))
                .map_err(|m| bad(format!("cell {} ({}): {m}", cell.index, cell.label())))?;
            seen.past_ceiling = ceiling.as_ref().and_then(|c| c.past(rate));
            let judged = pool.judge_next(&mut search, (&plan.objectives, rate), own, &seen, seed);
            let verdict = judged.verdict.record();
            let said = search.last_said(&plan.objectives);
            progress(&format!(
                "  {rate} req/s: {}{}; generator lag p99 {} us: {said}",
                describe(&plan.objectives, &judged.figures),
                pooled_text(judged.pooled),
                seen.lag_p99_us
            ));
            entry.search = Some(TrialRecord {
                of: base.index,
                search: n,
                trial,
                rate_per_s: Some(rate),
                why: why.to_owned(),
                verdict: Some(verdict),
                said,
                pooled_trials: judged.pooled,
                figures: figure_records(&plan.objectives, &judged.figures),
                scheduler_lag_us_p99: seen.lag_p99_us,
                generator_cpu_share: seen.cpu_share,
            });
            runner.save()?;
        }
        let this = &mut searches(&mut runner.record)[n];
        if let Some(outcome) = search.outcome() {
            this.outcome = Some(outcome.record(&plan.objectives));
            this.status = "done".into();
            this.spent = Some(search.spent());
            progress(&format!(
                "  {}: {}; {}",
                base.label(),
                outcome.text(&plan.objectives),
                search.spent()
            ));
        }
        runner.save()?;
    }
    if runner.outcome.status == "complete"
        && searches(&mut runner.record).iter().any(|s| !s.is_done())
    {
        runner.outcome.status = "incomplete";
    }
    runner.outcome.total = runner.record.cells.len();
    runner.finish()
}

/// The generator's ceiling for `base`'s load, from `measured` when a search with the
/// same load measured it already; none when the load is sent from the cluster's pods (this
/// machine's ceiling says nothing of theirs).
fn ceiling_for(
    base: &Cell,
    plan: &SearchPlan,
    options: &RunOptions,
    measured: &mut Vec<(String, Option<Ceiling>)>,
) -> Result<Option<Ceiling>, String> {
    let load = &base.scenario.load;
    let from_here = load.from == crate::model::LoadFrom::Here;
    let workers = if from_here {
        load.workers.unwrap_or(1)
    } else {
        0
    };
    let key = format!(
        "{:?}/{:?}/{:?}/{:?}/{:?}/{workers}/{}/{}",
        load.connections,
        load.threads,
        load.protocol,
        load.streams,
        load.keepalive,
        plan.bounds.from,
        plan.bounds.up_to
    );
    if let Some((_, known)) = measured.iter().find(|(k, _)| *k == key) {
        return Ok(known.clone());
    }
    let ceiling = if from_here {
        let shape = crate::load::plan_for(base, "http://127.0.0.1/", None, 1.0)?;
        Some(Ceiling::measure(
            &shape,
            (&options.backend_binary, workers),
            &plan.bounds,
            &options.stop,
        )?)
    } else {
        None
    };
    measured.push((key, ceiling.clone()));
    Ok(ceiling)
}

/// Adds `entry` to the record's cells and to search `n`'s trials.
fn push_cell(record: &mut RunRecord, entry: CellEntry, n: usize) {
    let index = record.cells.len();
    searches(record)[n].trials.push(index);
    record.cells.push(entry);
}

/// The record's searches (a run of searches starts with none).
fn searches(record: &mut RunRecord) -> &mut Vec<SearchRecord> {
    record.searches.get_or_insert_default()
}

/// The trial of `base` at `rate`, the run's cell `index`.
fn trial_cell(base: &Cell, index: usize, rate: f64) -> Cell {
    let mut cell = base.clone();
    cell.index = index;
    cell.scenario.load.rate = Some(rate);
    cell.settings.push(("load.rate".into(), format!("{rate}")));
    cell
}

/// The windows of the trial whose directory is `dir`, from its interval log.
fn windows_of(plan: &SearchPlan, dir: &std::path::Path) -> Result<Vec<WindowFigures>, String> {
    let path = dir.join("latency.hlog");
    let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let partial = ingressbench_results::hlog::read_partial(&bytes)?;
    Ok(partial
        .windows()
        .iter()
        .map(|w| WindowFigures::of(w, &plan.objectives))
        .collect())
}

/// What `cell`, a trial whose directory is `dir` and whose run.json entry is `entry`,
/// is judged on: its windows from its interval log, the generator's lag from its
/// summary.json, and its CPU (this process's, when the load was sent from it alone) from
/// its usage.
fn trial_figures(
    plan: &SearchPlan,
    (cell, dir, entry): (&Cell, &std::path::Path, &CellEntry),
) -> Result<(Vec<WindowFigures>, GeneratorSeen), String> {
    let own = windows_of(plan, dir)?;
    let path = dir.join("summary.json");
    let summary: ingressbench_stats::Summary = std::fs::read(&path)
        .map_err(|e| format!("reading {}: {e}", path.display()))
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| format!("summary.json: {e}")))?;
    let load = &cell.scenario.load;
    let threads = load.threads.unwrap_or(1);
    let sent_from_here =
        load.workers.unwrap_or(1) == 1 && load.from == crate::model::LoadFrom::Here;
    let seen = GeneratorSeen {
        lag_p99_us: summary.scheduler_lag_us.p99,
        latency_p99_us: summary.latency_us.p99,
        cpu_share: (entry.usage.as_ref())
            .and_then(|u| u.cores("client"))
            .filter(|_| sent_from_here)
            .map(|c| c / threads as f64),
        threads,
        past_ceiling: None,
    };
    Ok((own, seen))
}
