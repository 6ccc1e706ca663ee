//! The runner: every cell in order, each with its site (see [`crate::site`]), its load
//! and its timeline of events, into a results directory that is complete after every cell
//! and never lost.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ingressbench_lab::labfile::LabFile;
use ingressbench_lab::model::Overlay;
use ingressbench_lab::proxy::Binaries;
use ingressbench_lab::{Change, ChangeRecord, Lab};
use ingressbench_load::{
    parse_duration, parse_header, Length, Mode, Plan, Progress, RequestGate, RequestSpec, Resolve,
    RetryPolicy, Target as Url, Warmup,
};
use ingressbench_stats::Summary;
use serde_json::{json, Value};

use crate::cluster_site::{ClusterSite, Shape};
use crate::model::{Action, ConfigChange, LoadFrom, LoadModeFile, Target, Timing};
use crate::site::{CellFailure, Entry, LabSite, Site, Upstream};
use crate::store::{is_full, ProgressFn, ResultsLock, Streams};
use crate::usage::UsageLog;
use crate::{Cell, ScenarioError};

/// How long the lab and load get before the first request is due.
const START_DELAY: Duration = Duration::from_millis(300);
/// How long before its start a load from the cluster's pods is set going (`load.start_margin`
/// changes it): the time the cluster has to schedule and start them.
const CLUSTER_START_MARGIN: Duration = Duration::from_secs(5);
/// How often the runner checks that the lab's parts are still running.
const ALIVE_CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// With `--quick`, the whole run aims to take about this long.
const QUICK_BUDGET: Duration = Duration::from_secs(90);

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
    /// Continue the run recorded in `dir`: cells already done are skipped.
    pub resume: bool,
    /// Replace a run already in `dir` (its run.json and cells) instead of refusing.
    pub force: bool,
    /// Told the state of the cell in progress about once a second.
    pub live: Option<LiveFn>,
    /// Run each cell in a Kubernetes cluster instead of a lab (`--cluster`).
    pub cluster: Option<crate::cluster_site::ClusterOptions>,
}

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
    let record: Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a run record: {e}")))?;
    let scenario = record["scenario_text"]
        .as_str()
        .ok_or_else(|| bad("no scenario_text".into()))?
        .to_owned();
    let sets = record["sets"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| Some((p[0].as_str()?.to_owned(), p[1].as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    Ok(Recorded {
        scenario_text: scenario,
        sets,
        quick: record["quick"].as_bool().unwrap_or(false),
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

/// Runs `cells` (from [`crate::expand`]) into `options.dir`; `progress` is told about each
/// cell as it starts and ends.
pub fn run(
    cells: &[Cell],
    options: &RunOptions,
    mut progress: impl FnMut(&str),
) -> Result<RunOutcome, ScenarioError> {
    let path = options.dir.join("run.json");
    let io = |e: std::io::Error| ScenarioError::at(&path, format!("cannot write results: {e}"));
    // Held until the run returns: one writer per results directory.
    let lock = ResultsLock::acquire(&options.dir)?;
    let save = |record: &Value| {
        lock.write_even_if_full(|| write_json(&path, record))
            .map_err(io)
    };
    if !options.resume {
        clear_previous_run(&options.dir, options.force)?;
    }
    real_dir(&options.dir.join("cells"))?;
    let factor = if options.quick {
        quick_factor(cells)
    } else {
        1.0
    };
    let previous: Option<Value> = if options.resume {
        Some(own_record(&options.dir)?)
    } else {
        None
    };
    let mut record = json!({
        "scenario": cells.first().map(|c| c.scenario.name.clone()).unwrap_or_default(),
        "status": "running",
        "error": Value::Null,
        "tool_version": env!("CARGO_PKG_VERSION"),
        "command": options.command,
        "quick": options.quick,
        "quick_factor": factor,
        "sets": options.sets.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
        "machine": machine(),
        "started_at_unix_s": now_unix(),
        "scenario_text": options.scenario_text,
        "cells": cells.iter().map(|c| json!({
            "index": c.index, "repeat": c.repeat, "target": c.target.name(),
            "settings": c.settings.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
            "status": "pending", "dir": cell_dir_name(c),
        })).collect::<Vec<_>>(),
    });
    if let Some(previous) = &previous {
        // Keep what the earlier attempt finished; its start time and command stay too.
        for key in ["started_at_unix_s", "command"] {
            record[key] = previous[key].clone();
        }
        for (i, cell) in previous["cells"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if cell["status"] == "done" && record["cells"][i]["dir"] == cell["dir"] {
                record["cells"][i] = cell.clone();
            }
        }
        record["resumed_by"] = json!(options.command);
    }
    save(&record)?;
    let mut outcome = RunOutcome {
        dir: options.dir.clone(),
        done: 0,
        total: cells.len(),
        status: "complete",
        error: None,
        input_error: false,
    };
    let run_start = Instant::now();
    let mut sites = SiteCache::default();
    for cell in cells {
        if record["cells"][cell.index]["status"] == "done" {
            outcome.done += 1;
            continue;
        }
        if options.stop.load(Ordering::Relaxed) {
            outcome.status = "incomplete";
            break;
        }
        progress(&format!(
            "cell {}/{}: {} (repeat {})",
            cell.index + 1,
            cells.len(),
            cell.label(),
            cell.repeat + 1
        ));
        let dir = options.dir.join("cells").join(cell_dir_name(cell));
        // A cell that did not finish (an earlier attempt, resumed) starts over; what the
        // earlier attempt measured is kept beside it and listed. What no run of this
        // directory made is not touched.
        if dir.symlink_metadata().is_ok() {
            let previous_entry = previous.as_ref().map(|p| &p["cells"][cell.index]);
            if previous_entry.is_none_or(|e| e["dir"].as_str() != Some(&cell_dir_name(cell))) {
                return Err(ScenarioError::NotOurs {
                    path: dir,
                    why: "no run record of this directory lists it".into(),
                });
            }
            match keep_attempt(&options.dir, &dir, previous_entry).map_err(io)? {
                Some((attempt, said)) => {
                    progress(&format!("  {said}"));
                    let entry = &mut record["cells"][cell.index];
                    let mut attempts = previous_entry
                        .and_then(|e| e["earlier_attempts"].as_array().cloned())
                        .unwrap_or_default();
                    attempts.push(attempt);
                    entry["earlier_attempts"] = Value::Array(attempts);
                }
                None => std::fs::remove_dir_all(&dir).map_err(io)?,
            }
        }
        std::fs::create_dir_all(&dir).map_err(io)?;
        let live = options.live.clone().map(|f| {
            let this = planned(cell).mul_f64(factor);
            let after: Duration = cells[cell.index + 1..]
                .iter()
                .filter(|c| record["cells"][c.index]["status"] != "done")
                .map(|c| planned(c).mul_f64(factor))
                .sum();
            let (label, index, total) = (cell.label(), cell.index + 1, cells.len());
            let cell_start = Instant::now();
            Box::new(move |p: &Progress| {
                f(&Live {
                    cell: index,
                    cells: total,
                    label: label.clone(),
                    run_elapsed: run_start.elapsed(),
                    remaining: after + this.saturating_sub(cell_start.elapsed()),
                    load: p.clone(),
                });
            }) as ProgressFn
        });
        let result = run_cell(cell, &dir, options, factor, live, &mut sites, &lock);
        let entry = &mut record["cells"][cell.index];
        match result {
            Ok(done) => {
                entry["status"] = json!(if done.interrupted {
                    "interrupted"
                } else {
                    "done"
                });
                entry["summary"] = done.summary;
                entry["proxy_version"] = json!(done.proxy_version);
                entry["lab_reused"] = json!(done.lab_reused);
                entry["measure_from_s"] = json!(done.measure_from_s);
                if let Some(o) = done.link_overhead_us {
                    entry["link_overhead_us"] = o;
                }
                if let Some(k) = done.kernel {
                    entry["kernel"] = k;
                }
                if let Some(t) = done.topology {
                    entry["topology"] = t;
                }
                if let Some(r) = done.routes {
                    entry["routes"] = r;
                }
                if let Some(u) = done.usage {
                    entry["usage"] = u;
                }
                progress(&format!("  {}", done.line));
                if let Some(why) = done.cut_short {
                    entry["error"] = json!(why);
                    outcome.error = Some(format!("cell {} ({}): {why}", cell.index, cell.label()));
                    record["error"] = json!(outcome.error);
                }
                if done.interrupted {
                    outcome.status = "incomplete";
                    save(&record)?;
                    break;
                }
                outcome.done += 1;
            }
            Err(CellFailure { message: e, input }) => {
                entry["status"] = json!("failed");
                entry["error"] = json!(e);
                outcome.status = "failed";
                outcome.input_error = input;
                outcome.error = Some(format!("cell {} ({}): {e}", cell.index, cell.label()));
                record["error"] = json!(outcome.error);
                save(&record)?;
                break;
            }
        }
        save(&record)?;
    }
    record["status"] = json!(outcome.status);
    record["finished_at_unix_s"] = json!(now_unix());
    save(&record)?;
    Ok(outcome)
}

/// Refuses a results directory that holds a run (its run.json), or with `force` removes
/// that run: its run.json and the cells it lists (with their kept earlier attempts),
/// nothing else. A run.json this tool did not write is not taken for a run of its own.
fn clear_previous_run(dir: &Path, force: bool) -> Result<(), ScenarioError> {
    let path = dir.join("run.json");
    if path.symlink_metadata().is_err() {
        return Ok(());
    }
    let record = own_record(dir);
    if !force {
        let status = record
            .as_ref()
            .ok()
            .and_then(|v| v["status"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "unreadable".to_owned());
        return Err(ScenarioError::ResultsExist {
            dir: dir.to_owned(),
            status,
        });
    }
    let record = record?;
    let cells = dir.join("cells");
    if cells.symlink_metadata().is_ok() {
        real_dir(&cells)?;
    }
    let remove = |p: &Path, result: std::io::Result<()>| match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(ScenarioError::Write {
            path: p.to_owned(),
            source: e,
        }),
        _ => Ok(()),
    };
    for name in listed_dirs(&record) {
        // A link is removed, never what it leads to.
        let cell = cells.join(name);
        let result = match cell.symlink_metadata() {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&cell),
            Ok(_) => std::fs::remove_file(&cell),
            Err(e) => Err(e),
        };
        remove(&cell, result)?;
    }
    let _ = std::fs::remove_dir(&cells);
    remove(&path, std::fs::remove_file(&path))
}

/// The run record in `dir` if this tool wrote it: a JSON object with its version and a
/// list of cells, each in a directory of a plain name. Else why not.
fn own_record(dir: &Path) -> Result<Value, ScenarioError> {
    let path = dir.join("run.json");
    let not_ours = |why: String| ScenarioError::NotOurs {
        path: path.clone(),
        why,
    };
    let bytes = ingressbench_report::files::read_in(
        dir,
        &["run.json"],
        ingressbench_report::files::RUN_RECORD_LIMIT,
        "a run record's",
    )
    .map_err(not_ours)?;
    let record: Value = serde_json::from_slice(&bytes)
        .map_err(|e| not_ours(format!("it is not a run record ({e})")))?;
    let plain = |d: &Value| {
        d.as_str().is_some_and(|d| {
            !d.is_empty() && d != "." && d != ".." && !d.contains(['/', '\\', '\0'])
        })
    };
    let cells = record["cells"].as_array();
    let ours = record["tool_version"].is_string()
        && cells.is_some_and(|c| c.iter().all(|c| plain(&c["dir"])));
    if !ours {
        return Err(not_ours(
            "it was not written by `ingressbench run` (no tool_version, or cells without a directory of a plain name)".into(),
        ));
    }
    Ok(record)
}

/// The cell directories a run record lists: each cell's and its earlier attempts'.
fn listed_dirs(record: &Value) -> Vec<&str> {
    let mut dirs = Vec::new();
    for cell in record["cells"].as_array().into_iter().flatten() {
        dirs.extend(cell["dir"].as_str());
        for attempt in cell["earlier_attempts"].as_array().into_iter().flatten() {
            dirs.extend(
                attempt["dir"]
                    .as_str()
                    .filter(|d| !d.contains(['/', '\\']) && *d != ".." && *d != "."),
            );
        }
    }
    dirs
}

/// Makes `path` a directory (if missing), refusing one that is a link or not a
/// directory: what a run writes below it must stay in the results directory.
fn real_dir(path: &Path) -> Result<(), ScenarioError> {
    match path.symlink_metadata() {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(m) if m.file_type().is_symlink() => Err(ScenarioError::NotOurs {
            path: path.to_owned(),
            why: "it is a link, and a run writes only inside its results directory".into(),
        }),
        Ok(_) => Err(ScenarioError::NotOurs {
            path: path.to_owned(),
            why: "it is not a directory".into(),
        }),
        Err(_) => std::fs::create_dir(path).map_err(|source| ScenarioError::Write {
            path: path.to_owned(),
            source,
        }),
    }
}

struct CellDone {
    summary: Value,
    link_overhead_us: Option<Value>,
    /// The kernel each proxy ran with, and its listen queues' drops in the cell.
    kernel: Option<Value>,
    topology: Option<Value>,
    /// How a cluster cell's routes were made.
    routes: Option<Value>,
    /// What the lab's processes spent (see `usage.rs`).
    usage: Option<Value>,
    lab_reused: bool,
    measure_from_s: f64,
    proxy_version: Option<String>,
    interrupted: bool,
    /// Why the cell stopped before its end other than Ctrl-C (the disk filled).
    cut_short: Option<String>,
    line: String,
}

/// The directory of a cell: its index and label, the label cut to fit a file name (the
/// index keeps it unique).
fn cell_dir_name(cell: &Cell) -> String {
    let label: String = cell
        .label()
        .chars()
        .take(200)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{:03}-{label}", cell.index)
}

fn scaled(d: Duration, factor: f64) -> Duration {
    d.mul_f64(factor)
}

/// Scaled down (`--quick`), the time after a cell's last timed event shrinks with the rest,
/// to 0.3 s in `churn.yaml`, and a change applied slowly (a reload) delays the events
/// behind it past the load's end, which fails the cell. So a scaled load runs at least
/// this long after its last timed event (or the whole unscaled tail, if shorter).
const QUICK_EVENT_TAIL: Duration = Duration::from_secs(1);

/// How long a cell's measured load of `duration` runs, scaled by `factor`.
fn measured_length(duration: Duration, cell: &Cell, factor: f64) -> Duration {
    let length = scaled(duration, factor).max(Duration::from_millis(200));
    if factor >= 1.0 {
        return length;
    }
    let last_event = cell
        .events
        .iter()
        .filter_map(|e| match e.timing {
            Timing::At(at) => Some(at),
            Timing::Every {
                first,
                every,
                times,
            } => Some(first + every * times.saturating_sub(1)),
            Timing::BeforeRequest { .. } => None,
        })
        .max();
    match last_event {
        Some(last) if last < duration => {
            let tail = (duration - last).min(QUICK_EVENT_TAIL);
            length.max(scaled(last, factor) + tail)
        }
        _ => length,
    }
}

fn dur(field: &str, v: &Option<String>) -> Result<Option<Duration>, String> {
    v.as_deref()
        .map(|s| parse_duration(s).map_err(|e| format!("{field}: {e}")))
        .transpose()
}

/// How long a cell is planned to take, unscaled: warm-up, measurement and about 2 s of
/// set-up and tear-down.
fn planned(cell: &Cell) -> Duration {
    let l = &cell.scenario.load;
    let time = |v: &Option<String>| dur("", v).ok().flatten();
    let measured = match (time(&l.duration), l.requests) {
        (Some(d), _) => d + time(&l.warmup).unwrap_or_default(),
        (None, Some(n)) => {
            let each = time(&l.interval).unwrap_or_default() + Duration::from_millis(1);
            each * (n + l.warmup_requests.unwrap_or(0)).min(u64::from(u32::MAX)) as u32
        }
        (None, None) => Duration::from_secs(10),
    };
    measured + Duration::from_secs(2)
}

/// The factor that brings the run's planned time to about [`QUICK_BUDGET`] (at most 1).
fn quick_factor(cells: &[Cell]) -> f64 {
    let planned: f64 = cells.iter().map(|c| planned(c).as_secs_f64()).sum();
    (QUICK_BUDGET.as_secs_f64() / planned).min(1.0)
}

fn run_cell(
    cell: &Cell,
    dir: &Path,
    options: &RunOptions,
    factor: f64,
    live: Option<ProgressFn>,
    sites: &mut SiteCache,
    lock: &ResultsLock,
) -> Result<CellDone, CellFailure> {
    let l = &cell.scenario.load;
    let host = l
        .host
        .clone()
        .unwrap_or_else(|| ingressbench_lab::certs::DEFAULT_TLS_NAME.to_owned());
    let SiteUp {
        mut site,
        key,
        reused,
    } = bring_up(cell, options, sites)?;
    let workers = l.workers.unwrap_or(1);
    // From this machine (one process, or `workers` of them), or from the cluster's pods,
    // which are given the time to start.
    let (entry, senders, delay) = match l.from {
        LoadFrom::Here => (
            site.entry(cell.scenario.tls, &host, &l.path)?,
            match workers {
                1 => Senders::One,
                _ => Senders::Local(workers, options.backend_binary.clone()),
            },
            START_DELAY,
        ),
        LoadFrom::Cluster => {
            let request = (cell.scenario.tls, host.as_str(), l.path.as_str());
            let (entry, job) = site.cluster_load(request, workers, l.placement.as_ref())?;
            let margin = dur("load.start_margin", &l.start_margin)?;
            (
                entry,
                Senders::Cluster(job, workers),
                margin.unwrap_or(CLUSTER_START_MARGIN),
            )
        }
    };
    let (mut plan, start, measure_from) = load_plan(cell, &entry, (&host, delay), factor)?;
    let mut timeline = Timeline::of(cell, factor)?;
    let comment = format!(
        "ingressbench {} cell {}\nvalues in microseconds",
        env!("CARGO_PKG_VERSION"),
        cell.label()
    );
    // The load stops when the run is stopped (Ctrl-C), when a part of the site dies, or
    // when what it measures cannot be written (a full disk).
    let cell_stop = Arc::new(AtomicBool::new(false));
    let mut streams = Streams::new(
        Some(&dir.join("latency.hlog")),
        Some(&dir.join("samples.csv.gz")),
        &comment,
    )
    .map_err(|e| e.to_string())?
    .stop_on_error(cell_stop.clone());
    if let Some(live) = live {
        streams = streams.on_progress(live);
    }
    let gate = timeline.gate(&mut plan);
    site.start_measuring();
    let load = spawn_load(
        plan,
        senders,
        site.client_netns(),
        cell_stop.clone(),
        streams,
    )?;
    let events = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("events.jsonl"))
        .map_err(|e| e.to_string())?;
    // What the parts spend is a side figure: if its file cannot be written, the cell
    // goes on without it (the load is already running; latency is what it measures).
    let usage = UsageLog::new(
        &dir.join("usage.jsonl"),
        site.usage_parts(),
        start,
        measure_from,
    )
    .ok();
    let mut driver = Driver {
        cell,
        site: site.as_mut(),
        measure_from,
        events,
        usage,
        fired: vec![0; cell.events.len()],
        reported: 0,
        went_wrong: None,
        stop: cell_stop,
    };
    driver.drive(&load, &mut timeline, gate, &options.stop);
    let Driver {
        usage: mut usage_log,
        went_wrong,
        fired,
        ..
    } = driver;
    let (report, workers_json, mut streams) = load
        .join()
        .map_err(|_| "the load thread panicked".to_owned())?;
    if let Some(workers) = &workers_json {
        write_json(&dir.join("workers.json"), workers).map_err(|e| e.to_string())?;
    }
    if usage_log
        .as_mut()
        .is_some_and(|u| u.read_now(Instant::now()).is_err())
    {
        usage_log = None;
    }
    let report = report.map_err(|e| e.to_string())?;
    // A full disk cut the interval log or the samples: the load stopped there, and what
    // it measured is still written (the reserve makes room), the cell kept as cut short.
    let cut_short = match streams.finish(&report.summary.warnings) {
        Ok(()) => None,
        Err(e) if is_full(&e) => {
            lock.free_reserve();
            Some(format!(
                "the disk filled while the cell was measured ({e}); the load stopped there and what it measured \
                 is kept (summary.json; the interval log and samples as far as they were written): free space, \
                 then run again with --resume"
            ))
        }
        Err(e) => return Err(e.to_string().into()),
    };
    let summary = serde_json::to_value(&report.summary).map_err(|e| e.to_string())?;
    let full = |e: std::io::Error| e.to_string();
    lock.write_even_if_full(|| write_json(&dir.join("summary.json"), &summary))
        .map_err(full)?;
    lock.write_even_if_full(|| {
        let mut hgrm = std::fs::File::create(dir.join("latency.hgrm"))?;
        ingressbench_report::hgrm::write(&mut hgrm, report.recorder.latency())
    })
    .map_err(full)?;
    let record = site.record(dir);
    let impact = write_impact(
        site.records(),
        dir,
        &report.summary,
        usage_log.as_ref(),
        l.sample_rate,
        (measure_from, start),
    );
    // Cut samples make no event's impact: none is written then.
    if cut_short.is_none() {
        impact?;
    }
    if let Some(why) = went_wrong {
        return Err(why.into());
    }
    // An event that never fired would leave a report of a scenario that did not happen.
    if !report.summary.interrupted {
        if let Some(why) = unfired(cell, &fired, report.summary.requests.total) {
            return Err(why.into());
        }
    }
    let s = &report.summary;
    let line = format!(
        "{} requests, {} errors, p50 {:.2} ms, p99 {:.2} ms{}",
        s.requests.total,
        s.requests.errors,
        s.latency_us.p50 as f64 / 1e3,
        s.latency_us.p99 as f64 / 1e3,
        if s.warnings.is_empty() {
            String::new()
        } else {
            format!(" ({} warnings)", s.warnings.len())
        }
    );
    // Only cells without events share sites, so a kept site is as it started.
    if let (Some(key), true) = (key, cell.events.is_empty()) {
        sites.put(key, site);
    }
    let small = json!({ "requests": s.requests.total, "errors": s.requests.errors, "min_us": s.latency_us.min, "p50_us": s.latency_us.p50, "p99_us": s.latency_us.p99, "max_us": s.latency_us.max });
    Ok(CellDone {
        summary: small,
        link_overhead_us: record.link_overhead_us,
        kernel: record.kernel,
        topology: record.topology,
        routes: record.routes,
        usage: usage_log.map(|u| u.summary(s.requests.total)),
        lab_reused: reused,
        measure_from_s: measure_from.saturating_duration_since(start).as_secs_f64(),
        proxy_version: entry.proxy_version,
        interrupted: s.interrupted || cut_short.is_some(),
        cut_short,
        line,
    })
}

/// A cell's system under test, as [`bring_up`] found it.
struct SiteUp {
    site: Box<dyn Site>,
    /// What it is kept under between cells (`None`: it is not kept).
    key: Option<String>,
    /// Kept from an earlier cell.
    reused: bool,
}

/// The system under test of a cell: a site kept from an earlier cell with the same one
/// (only cells without events share them), or a new one.
fn bring_up(
    cell: &Cell,
    options: &RunOptions,
    sites: &mut SiteCache,
) -> Result<SiteUp, CellFailure> {
    if let Some(cluster) = &options.cluster {
        let s = &cell.scenario;
        // Each pool a Deployment and a Service of its name (a scenario without one: `echo`,
        // three backends); without routes, every request to the first.
        let pools: Vec<(String, usize)> = if s.backends.is_empty() {
            vec![("echo".into(), 3)]
        } else {
            s.backends
                .iter()
                .map(|p| (p.name.clone(), p.replicas))
                .collect()
        };
        let route = |host: &str, prefix: &str, pool: &str| ingressbench_cluster::deploy::Route {
            host: host.to_owned(),
            prefix: prefix.to_owned(),
            pool: pool.to_owned(),
        };
        let routes: Vec<ingressbench_cluster::deploy::Route> = if s.routes.is_empty() {
            vec![route("*", "/", &pools[0].0)]
        } else {
            s.routes
                .iter()
                .map(|r| route(&r.host, &r.path_prefix, &r.pool))
                .collect()
        };
        // The scenario's kernel settings (with the target's over them) become the backend
        // pods' `securityContext.sysctls`: a pod is a network namespace, as a lab node is.
        let mut sysctls: std::collections::BTreeMap<String, String> = s
            .tuning
            .sysctls
            .iter()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        if let Target::Proxy { sysctls: own, .. } = &cell.target {
            sysctls.extend(own.iter().map(|(k, v)| (k.clone(), v.0.clone())));
        }
        let shape = Shape {
            pools,
            routes,
            sysctls,
            tls: s.tls,
            route_changes: route_changes(cell),
            near_ingress: s.load.from == LoadFrom::Cluster
                && s.load.placement.as_ref().and_then(|p| p.node)
                    == Some(crate::model::NodePlacement::SameAsIngress),
        };
        let site = ClusterSite::up(cluster, &cell.target.name(), cell.index, shape)?;
        return Ok(SiteUp {
            site: Box::new(site),
            key: None,
            reused: false,
        });
    }
    let Some(file) = lab_file(cell) else {
        return match &cell.target {
            Target::Upstream { url, .. } => Ok(SiteUp {
                site: Box::new(Upstream { url: url.clone() }),
                key: None,
                reused: false,
            }),
            Target::Proxy { .. } => Err("a proxy target without a lab".into()),
            Target::Cluster { name } => Err(CellFailure {
                message: format!(
                    "target `{name}` is placed by a cluster file: run with --cluster FILE"
                ),
                input: true,
            }),
        };
    };
    let key = format!("{:?}", (&cell.target, &file));
    if cell.events.is_empty() {
        if let Some(site) = sites.take(&key) {
            return Ok(SiteUp {
                site,
                key: Some(key),
                reused: true,
            });
        }
    }
    let spec = file
        .to_spec(
            Path::new("scenario"),
            options.backend_binary.clone(),
            options.binaries.clone(),
        )
        .map_err(|e| e.to_string())?;
    let lab = Lab::up(spec).map_err(|e| e.to_string())?;
    Ok(SiteUp {
        site: Box::new(LabSite::new(lab)),
        key: Some(key),
        reused: false,
    })
}

/// The load of a cell against `entry`, starting `delay` from now: the plan, when it
/// starts and when measurement starts (after the warm-up).
fn load_plan(
    cell: &Cell,
    entry: &Entry,
    (host, delay): (&str, Duration),
    factor: f64,
) -> Result<(Plan, Instant, Instant), String> {
    let host_header = entry.host_header.then_some(host);
    let mut plan = plan_for(cell, &entry.url, host_header, factor)?;
    if let Some((options, at)) = &entry.tls {
        plan.tls = options.clone();
        if let Some(at) = at {
            plan.resolve = vec![Resolve::parse(&format!("{host}:{}:{}", at.port(), at.ip()))
                .map_err(|e| e.to_string())?];
        }
    }
    let warmup = match plan.warmup {
        Warmup::Duration(d) => d,
        _ => Duration::ZERO,
    };
    let start = Instant::now() + delay;
    plan.start = Some(start);
    plan.validate().map_err(|e| e.to_string())?;
    Ok((plan, start, start + warmup))
}

/// Who sends a cell's load.
enum Senders {
    /// This process.
    One,
    /// This many local processes of this program (this tool).
    Local(usize, PathBuf),
    /// This many pods of this Job.
    Cluster(ingressbench_cluster::workers::LoadJob, usize),
}

/// The load on a thread of its own, in `netns` if the site has one for the client (the
/// local workers it starts inherit it). With more than one sender, their health comes
/// back as `workers.json`.
fn spawn_load(
    plan: Plan,
    senders: Senders,
    netns: Option<PathBuf>,
    stop: Arc<AtomicBool>,
    mut streams: Streams,
) -> Result<LoadThread, String> {
    std::thread::Builder::new()
        .name("ib-cell-load".into())
        .spawn(move || {
            let entered = netns.as_deref().map_or(Ok(()), |ns| {
                ingressbench_lab::topology::enter_netns(ns).map_err(|e| {
                    ingressbench_load::LoadError::InvalidPlan {
                        field: "topology".into(),
                        reason: format!(
                            "cannot enter the client's network namespace {}: {e}",
                            ns.display()
                        ),
                    }
                })
            });
            use ingressbench_load::fleet;
            let ran = entered.and_then(|()| {
                let with_workers = |fleet: fleet::FleetReport| {
                    let json = fleet::workers_json(&fleet);
                    (fleet.load, Some(json))
                };
                match senders {
                    Senders::One => {
                        ingressbench_load::run(&plan, stop, &mut streams).map(|r| (r, None))
                    }
                    Senders::Local(workers, binary) => {
                        fleet::run_local(&plan, workers, &binary, stop, &mut streams)
                            .map(with_workers)
                    }
                    Senders::Cluster(job, workers) => {
                        run_in_cluster(&plan, job, workers, stop, &mut streams).map(
                            |(fleet, cluster)| {
                                let (load, mut json) = with_workers(fleet);
                                if let Some(json) = json.as_mut() {
                                    json["cluster"] = cluster;
                                }
                                (load, json)
                            },
                        )
                    }
                }
            });
            match ran {
                Ok((report, workers)) => (Ok(report), workers, streams),
                Err(e) => (Err(e), None, streams),
            }
        })
        .map_err(|e| e.to_string())
}

/// Sends `plan` from `workers` pods of `job`, which starts them with the plan in their
/// environment (its CA's certificates in it: the pods do not share this machine's files),
/// and merges what their logs carry; the Job is deleted once they are done. Also says
/// where the pods ran beside the backends, as the API said when they started.
fn run_in_cluster(
    plan: &Plan,
    job: ingressbench_cluster::workers::LoadJob,
    workers: usize,
    stop: Arc<AtomicBool>,
    observer: &mut Streams,
) -> Result<(ingressbench_load::fleet::FleetReport, Value), ingressbench_load::LoadError> {
    use ingressbench_load::fleet;
    let start = plan.start.unwrap_or_else(Instant::now);
    let wall = std::time::SystemTime::now() + start.saturating_duration_since(Instant::now());
    let mut wire = fleet::PlanWire::of(plan, 0, workers, wall);
    wire.embed_ca()?;
    let deadline = fleet::deadline(plan, start);
    // The cluster ends the Job if this process cannot: a minute past the coordinator's own
    // deadline (an hour for a run of a number of requests).
    let active_for = deadline.map_or(Duration::from_secs(3600), |d| {
        d.saturating_duration_since(Instant::now()) + Duration::from_secs(60)
    });
    let (sources, running) = job.start(&wire, active_for, &stop).map_err(|e| {
        ingressbench_load::LoadError::InvalidPlan {
            field: "load.from".into(),
            reason: e.to_string(),
        }
    })?;
    let placement = job_placement(&running);
    let report = fleet::coordinate(plan, sources, stop, deadline, observer);
    drop(running);
    report.map(|r| (r, placement))
}

/// Where a load Job's pods and the backends ran.
fn job_placement(running: &ingressbench_cluster::workers::RunningJob) -> Value {
    json!({
        "job": ingressbench_cluster::workers::JOB_NAME,
        "worker_nodes": running.pods.iter().map(|p| json!({ "index": p.index, "pod": p.pod, "node": p.node })).collect::<Vec<_>>(),
        "backend_nodes": running.backend_nodes,
    })
}

type LoadThread = std::thread::JoinHandle<(
    Result<ingressbench_load::LoadReport, ingressbench_load::LoadError>,
    Option<serde_json::Value>,
    Streams,
)>;

/// A cell's events in time: timed firings (offset from the start of measurement, event,
/// propagation delay), in order, and lock-step ones (first request, every, times, event,
/// delay).
pub(crate) struct Timeline {
    firings: Vec<(Duration, usize, Duration)>,
    next: usize,
    lockstep: Vec<(u64, u64, u32, usize, Duration)>,
}

impl Timeline {
    /// Whether any change is held back by a propagation delay (the lab's stand-in for a
    /// slow controller).
    pub(crate) fn delays_changes(&self) -> bool {
        self.firings.iter().any(|(_, _, delay)| !delay.is_zero())
            || self.lockstep.iter().any(|l| !l.4.is_zero())
    }

    pub(crate) fn of(cell: &Cell, factor: f64) -> Result<Self, String> {
        let controller_delay = scaled(
            dur(
                "controller.propagation_delay",
                &cell.scenario.controller.propagation_delay,
            )?
            .unwrap_or_default(),
            factor,
        );
        let mut firings = Vec::new();
        let mut lockstep = Vec::new();
        for (i, e) in cell.events.iter().enumerate() {
            let delay = e
                .propagation_delay
                .map_or(controller_delay, |d| scaled(d, factor));
            match &e.timing {
                Timing::At(at) => firings.push((scaled(*at, factor), i, delay)),
                Timing::Every {
                    first,
                    every,
                    times,
                } => {
                    for k in 0..*times {
                        firings.push((scaled(*first + *every * k, factor), i, delay));
                    }
                }
                Timing::BeforeRequest {
                    first,
                    every,
                    times,
                } => lockstep.push((*first, *every, *times, i, delay)),
            }
        }
        firings.sort_by_key(|f| f.0);
        Ok(Self {
            firings,
            next: 0,
            lockstep,
        })
    }

    /// With lock-step events, a gate on the plan: the load asks before each request (its
    /// sequence number) and waits for the answer.
    fn gate(&self, plan: &mut Plan) -> Option<Gate> {
        if self.lockstep.is_empty() {
            return None;
        }
        let (request_tx, request_rx) = std::sync::mpsc::channel::<u64>();
        let (ack_tx, ack_rx) = std::sync::mpsc::channel::<()>();
        let ack_rx = std::sync::Mutex::new(ack_rx);
        plan.gate = Some(RequestGate(Arc::new(move |seq| {
            if request_tx.send(seq).is_ok() {
                if let Ok(ack) = ack_rx.lock() {
                    let _ = ack.recv();
                }
            }
        })));
        Some(Gate {
            requests: request_rx,
            ack: ack_tx,
            warmup_requests: 0,
        })
    }

    /// The timed firings due by `now`.
    fn due(&mut self, now: Instant, measure_from: Instant) -> Vec<(Duration, usize, Duration)> {
        let mut due = Vec::new();
        while self.next < self.firings.len() && measure_from + self.firings[self.next].0 <= now {
            due.push(self.firings[self.next]);
            self.next += 1;
        }
        due
    }

    /// The lock-step events to fire before measured request `number` (from 1).
    fn before_request(&self, number: u64) -> Vec<(usize, Duration)> {
        self.lockstep
            .iter()
            .filter(|&&(first, every, times, _, _)| {
                number
                    .checked_sub(first)
                    .filter(|d| d % every == 0)
                    .map(|d| d / every)
                    .is_some_and(|k| k < u64::from(times))
            })
            .map(|&(_, _, _, index, delay)| (index, delay))
            .collect()
    }
}

/// The runner's side of lock-step events: the load's requests, and the answer it waits
/// for.
struct Gate {
    requests: std::sync::mpsc::Receiver<u64>,
    ack: std::sync::mpsc::Sender<()>,
    /// Requests before these are warm-up and fire nothing.
    warmup_requests: u64,
}

/// What runs beside the load: the site's liveness, its changes and the events.
struct Driver<'a> {
    cell: &'a Cell,
    site: &'a mut dyn Site,
    measure_from: Instant,
    events: std::fs::File,
    usage: Option<UsageLog>,
    /// How many times each event fired.
    fired: Vec<u32>,
    /// Records already written to `events.jsonl` as applied.
    reported: usize,
    /// Why the cell must fail (a part of the site exited, an event could not be applied):
    /// the load stops, what was measured is kept, and the cell is not done.
    went_wrong: Option<String>,
    stop: Arc<AtomicBool>,
}

impl Driver<'_> {
    /// Until the load ends: stops it on Ctrl-C or a dead part, fires events when due, and
    /// writes each change as it is applied.
    fn drive(
        &mut self,
        load: &LoadThread,
        timeline: &mut Timeline,
        mut gate: Option<Gate>,
        run_stop: &AtomicBool,
    ) {
        if let Some(g) = gate.as_mut() {
            g.warmup_requests = self.cell.scenario.load.warmup_requests.unwrap_or(0);
        }
        let mut checked_at = Instant::now();
        while !load.is_finished() {
            let now = Instant::now();
            if run_stop.load(Ordering::Relaxed) {
                self.stop.store(true, Ordering::Relaxed);
            }
            // A proxy (or front, sidecar, backend) that dies is not the system under test
            // any more: stop, keep what was measured, and fail the cell.
            if self.went_wrong.is_none() && now.duration_since(checked_at) >= ALIVE_CHECK_INTERVAL {
                checked_at = now;
                if let Err(e) = self.site.check_alive() {
                    self.fail(format!(
                        "{:.3} s into the cell: {e}",
                        crate::usage::signed_offset(now, self.measure_from)
                    ));
                }
            }
            if self.usage.as_mut().is_some_and(|u| u.poll(now).is_err()) {
                self.usage = None;
            }
            for (due, index, delay) in timeline.due(now, self.measure_from) {
                self.fire(index, delay, ("due_s", json!(due.as_secs_f64())));
            }
            if let Some(g) = &gate {
                while let Ok(seq) = g.requests.try_recv() {
                    // Measured requests count from 1; warm-up requests fire nothing.
                    if let Some(number) = seq.checked_sub(g.warmup_requests).map(|n| n + 1) {
                        for (index, delay) in timeline.before_request(number) {
                            self.fire(index, delay, ("due_request", json!(number)));
                        }
                    }
                    let _ = g.ack.send(());
                }
            }
            if let Err(e) = self.site.tick() {
                // A change the proxies were told and did not take.
                self.fail(format!(
                    "{:.3} s into the cell, a change could not be applied: {e}",
                    crate::usage::signed_offset(Instant::now(), self.measure_from)
                ));
            }
            self.write_applied();
            std::thread::sleep(Duration::from_millis(if gate.is_some() { 1 } else { 5 }));
        }
    }

    /// Stops the load and fails the cell (the first reason is kept).
    fn fail(&mut self, why: String) {
        self.went_wrong.get_or_insert(why);
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Fires event `index`: asks the site for its change and writes it to `events.jsonl`.
    fn fire(&mut self, index: usize, delay: Duration, due: (&str, Value)) {
        self.fired[index] += 1;
        let change = change_for(&self.cell.events[index].action, &self.cell.scenario);
        let measure_from = self.measure_from;
        let (mut line, failed) = match self.site.request(change, delay) {
            Ok(r) => {
                let rec = &self.site.records()[r];
                let generations: Vec<Value> = rec
                    .generations
                    .iter()
                    .map(|(header, g)| json!({ "header": header, "generation": g }))
                    .collect();
                (
                    json!({ "event": index, "what": rec.what, "requested_s": offset(rec.requested_at, measure_from),
                            "propagation_delay_s": delay.as_secs_f64(), "started": rec.started, "removed": rec.removed,
                            "generations": generations }),
                    None,
                )
            }
            Err(e) => (
                json!({ "event": index, "error": e }),
                Some(format!(
                    "events[{index}] could not be applied {:.3} s into the cell: {e}",
                    crate::usage::signed_offset(Instant::now(), measure_from)
                )),
            ),
        };
        line[due.0] = due.1;
        let _ = writeln!(self.events, "{line}").and_then(|()| self.events.flush());
        if let Some(why) = failed {
            self.fail(why);
        }
    }

    /// Writes each change the site applied since the last call to `events.jsonl`.
    fn write_applied(&mut self) {
        let records = self.site.records();
        for rec in &records[self.reported..] {
            let Some(applied) = rec.applied_at else { break };
            let mechanisms: Vec<String> = rec
                .mechanisms
                .iter()
                .map(|(k, m)| format!("{k}: {m}"))
                .collect();
            let mut line = json!({ "what": rec.what, "applied_s": offset(applied, self.measure_from), "mechanisms": mechanisms });
            if let Some(at) = rec.endpoints_at {
                line["endpoints_s"] = json!(offset(at, self.measure_from));
            }
            let _ = writeln!(self.events, "{line}").and_then(|()| self.events.flush());
            self.reported += 1;
        }
    }
}

/// Every check a cell makes before it starts anything, made without starting anything:
/// its lab (pool names, routes, every value that reaches a proxy, with each route change
/// its events ask for), its load plan and the open files its connections need, and its
/// events against its pools and its length. [`crate::expand`] makes them for every cell,
/// so `scenario check` and `run` find a bad matrix value before the first cell starts.
/// The message names the scenario field and the fix.
pub fn check_cell(cell: &Cell) -> Result<(), String> {
    let s = &cell.scenario;
    let (url, pools) = match (lab_file(cell), &cell.target) {
        (Some(file), _) => {
            let spec = file
                .to_spec(Path::new("scenario"), PathBuf::new(), Binaries::default())
                .map_err(|e| e.to_string())?;
            spec.check(&route_changes(cell))
                .map_err(|e| e.to_string())?;
            let pools = spec.pools.iter().map(|p| p.name.clone()).collect();
            (format!("http://127.0.0.1{}", s.load.path), pools)
        }
        (None, Target::Upstream { url, name }) => {
            if !cell.events.is_empty() {
                return Err(format!(
                    "events: target `{name}` is an upstream URL the tool did not start, so it cannot scale, kill, stall or reconfigure it; give the events to proxy targets (a lab), or run this target in a scenario without events"
                ));
            }
            (url.clone(), Vec::new())
        }
        (None, Target::Proxy { .. }) => return Err("a proxy target without a lab".into()),
        // The cluster file says where it runs; `run --cluster` checks it against the file.
        (None, Target::Cluster { .. }) => (
            format!("http://127.0.0.1{}", s.load.path),
            s.backends.iter().map(|b| b.name.clone()).collect(),
        ),
    };
    check_from(&s.load)?;
    let mut plan = plan_for(cell, &url, None, 1.0)?;
    plan.share.of = s.load.workers.unwrap_or(1);
    plan.validate().map_err(|e| match e {
        ingressbench_load::LoadError::InvalidPlan { field, reason } => {
            format!("{}: {reason}", scenario_field(&field))
        }
        e => e.to_string(),
    })?;
    ingressbench_load::ensure_descriptors(plan.connections)
        .map_err(|e| format!("load.connections: {e}"))?;
    for (i, e) in cell.events.iter().enumerate() {
        check_event(i, e, &pools, &plan.length)?;
    }
    Ok(())
}

/// Where the load comes from: placement and start margin only for load from the
/// cluster, and a placement says one thing.
fn check_from(l: &crate::model::LoadFile) -> Result<(), String> {
    if l.from == LoadFrom::Here {
        for (field, set) in [
            ("load.placement", l.placement.is_some()),
            ("load.start_margin", l.start_margin.is_some()),
        ] {
            if set {
                return Err(format!(
                    "{field}: only load from the cluster has pods to place; add `load.from: cluster` (with run --cluster FILE) or drop it"
                ));
            }
        }
    }
    if let Some(p) = &l.placement {
        if p.node.is_some() != p.node_selector.is_empty() {
            return Err("load.placement: give either `node:` (same_as_backends, other_than_backends, same_as_ingress or any) or `node_selector: { label: value }`".into());
        }
    }
    if dur("load.start_margin", &l.start_margin)?.is_some_and(|d| d.is_zero()) {
        return Err("load.start_margin: the pods need some time to start; give at least 1s".into());
    }
    Ok(())
}

/// The scenario field behind a load-plan option, for messages.
fn scenario_field(option: &str) -> &str {
    match option {
        "-R/--rate" => "load.rate",
        "-c/--connections" => "load.connections",
        "--threads" => "load.threads",
        "--workers" => "load.workers",
        "-n/--requests" => "load.requests",
        "-d/--duration" => "load.duration",
        "--timeout" => "load.timeout",
        "--sample-rate" => "load.sample_rate",
        other => other,
    }
}

/// An event that would name a backend no pool has, or fire after the load ends.
fn check_event(
    i: usize,
    e: &crate::model::EventSpec,
    pools: &[String],
    length: &Length,
) -> Result<(), String> {
    let named = match &e.action {
        Action::Kill(name) | Action::Terminate(name) => name.as_deref(),
        Action::StallBackend { backend, .. } => backend.as_deref(),
        _ => None,
    };
    if let Some(name) = named {
        let of_a_pool = pools.iter().any(|p| {
            name.strip_prefix(p.as_str())
                .and_then(|n| n.strip_prefix('-'))
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|n| n >= 1)
        });
        if !of_a_pool {
            let examples: Vec<String> = pools.iter().map(|p| format!("{p}-1")).collect();
            return Err(format!(
                "events[{i}]: `{name}` is not a backend of this scenario: backends are named POOL-N ({}), or leave the name out for one at random",
                examples.join(", ")
            ));
        }
    }
    let never = |what: String, limit: String| {
        Err(format!(
            "events[{i}]: {what} is past the end of the load ({limit}), so it would never fire; make the event earlier or the load longer"
        ))
    };
    match (&e.timing, length) {
        (Timing::At(at), Length::Duration(d)) if at >= d => {
            never(format!("at {at:?}"), format!("load.duration {d:?}"))
        }
        (
            Timing::Every {
                first,
                every,
                times,
            },
            Length::Duration(d),
        ) if *first + *every * times.saturating_sub(1) >= *d => never(
            format!(
                "the last of {times} firings ({:?})",
                *first + *every * times.saturating_sub(1)
            ),
            format!("load.duration {d:?}"),
        ),
        (
            Timing::BeforeRequest {
                first,
                every,
                times,
            },
            Length::Requests(n),
        ) if first + every * u64::from(times.saturating_sub(1)) > *n => never(
            format!(
                "the last of {times} firings (before request {})",
                first + every * u64::from(times.saturating_sub(1))
            ),
            format!("load.requests {n}"),
        ),
        _ => Ok(()),
    }
}

/// The load plan of a cell against `url` (a `Host` header added if given), its times
/// scaled by `factor`; what depends on the running lab (TLS, `--resolve`, the start) is
/// added by the caller.
fn plan_for(
    cell: &Cell,
    url: &str,
    host_header: Option<&str>,
    factor: f64,
) -> Result<Plan, String> {
    let l = &cell.scenario.load;
    let mut plan = Plan::new(Url::parse(url).map_err(|e| e.to_string())?);
    let mut headers = Vec::new();
    if let Some(host) = host_header {
        headers.push(("Host".to_owned(), host.to_owned()));
    }
    for (name, value) in &l.headers {
        headers.push(parse_header(&format!("{name}: {value}")).map_err(|e| e.to_string())?);
    }
    plan.request = RequestSpec {
        headers,
        ..RequestSpec::default()
    };
    plan.mode = match l.mode {
        LoadModeFile::Open => Mode::Open {
            rate_per_s: l.rate.unwrap_or(1.0),
        },
        LoadModeFile::Closed => Mode::Closed,
        LoadModeFile::Sequential => Mode::Sequential {
            interval: scaled(
                dur("load.interval", &l.interval)?.unwrap_or_default(),
                factor,
            ),
        },
    };
    plan.connections = if l.mode == LoadModeFile::Sequential {
        1
    } else {
        l.connections.unwrap_or(10)
    };
    plan.threads = l.threads.unwrap_or(1);
    plan.length = match (dur("load.duration", &l.duration)?, l.requests) {
        (Some(d), _) => Length::Duration(measured_length(d, cell, factor)),
        (None, Some(n)) => Length::Requests(n),
        (None, None) => return Err("load: no duration or requests".into()),
    };
    let warmup = scaled(dur("load.warmup", &l.warmup)?.unwrap_or_default(), factor);
    plan.warmup = match (warmup.is_zero(), l.warmup_requests) {
        (false, _) => Warmup::Duration(warmup),
        (true, Some(n)) => Warmup::Requests(n),
        (true, None) => Warmup::None,
    };
    plan.keepalive = l.keepalive;
    // Checked when the scenario was read.
    plan.protocol = l
        .protocol
        .as_deref()
        .and_then(ingressbench_load::Protocol::parse)
        .unwrap_or_default();
    plan.streams = l.streams;
    plan.retry = l
        .retry
        .as_deref()
        .and_then(RetryPolicy::parse)
        .unwrap_or_default();
    plan.timeout = dur("load.timeout", &l.timeout)?.unwrap_or(Duration::from_secs(10));
    plan.sample_rate = l.sample_rate;
    Ok(plan)
}

/// The lab a proxy target needs; `None` for an upstream URL.
fn lab_file(cell: &Cell) -> Option<LabFile> {
    let s = &cell.scenario;
    let Target::Proxy {
        kind,
        update,
        workers,
        keepalive_requests,
        upstream_keepalive,
        listen_backlog,
        upstream_protocol,
        sysctls,
        front,
        hop,
        ..
    } = &cell.target
    else {
        return None;
    };
    let mut tuning = s.tuning.clone();
    tuning.workers = workers.or(tuning.workers);
    tuning.keepalive_requests = keepalive_requests.or(tuning.keepalive_requests);
    tuning.upstream_keepalive = upstream_keepalive.or(tuning.upstream_keepalive);
    tuning.listen_backlog = listen_backlog.or(tuning.listen_backlog);
    tuning.upstream_protocol = upstream_protocol.or(tuning.upstream_protocol);
    tuning
        .sysctls
        .extend(sysctls.iter().map(|(k, v)| (k.clone(), v.clone())));
    Some(LabFile {
        proxies: vec![*kind],
        backends: if s.backends.is_empty() {
            ingressbench_lab::labfile::default_pools()
        } else {
            s.backends.clone()
        },
        routes: s.routes.clone(),
        tls: s.tls,
        tuning,
        overlay: s.overlay.clone(),
        haproxy_update: update.unwrap_or_default(),
        front: front.clone(),
        hop: hop.clone(),
        topology: s.topology.clone(),
    })
}

/// Sites kept up between cells that differ only in their load (a sweep over rates and
/// connections), so that each cell does not pay for a lab's start; at most
/// [`SiteCache::MAX`], the oldest torn down first.
#[derive(Default)]
struct SiteCache(Vec<(String, Box<dyn Site>)>);

impl SiteCache {
    const MAX: usize = 10;

    fn take(&mut self, key: &str) -> Option<Box<dyn Site>> {
        let i = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(i).1)
    }

    fn put(&mut self, key: String, site: Box<dyn Site>) {
        if self.0.len() == Self::MAX {
            self.0.remove(0);
        }
        self.0.push((key, site));
    }
}

/// Moves the directory of a cell an earlier attempt left unfinished to
/// `NAME.attempt-K` (the first K free) if it measured anything, and describes it: its
/// summary (the one run.json kept for a cell stopped by Ctrl-C, else one rebuilt from its
/// interval log) and where it went, and a line to print. `None` if there was nothing to keep.
fn keep_attempt(
    results_dir: &Path,
    dir: &Path,
    previous: Option<&Value>,
) -> std::io::Result<Option<(Value, String)>> {
    use ingressbench_report::{files, hlog, results};
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // No link followed, and a day of one-second windows at most.
    let Ok(bytes) = files::read_in(
        results_dir,
        &["cells", &name, "latency.hlog"],
        86_400 << 18,
        "a day of one-second windows",
    ) else {
        return Ok(None);
    };
    let recorded = previous
        .filter(|p| p["status"] == "interrupted")
        .map(|p| p["summary"].clone())
        .filter(|s| !s.is_null());
    let rebuilt = || {
        hlog::read_partial(&bytes)
            .ok()
            .and_then(|p| results::rebuild_summary(&p))
    };
    let Some(summary) = recorded.or_else(rebuilt) else {
        return Ok(None);
    };
    let kept = (1..)
        .map(|k| format!("{name}.attempt-{k}"))
        .find(|n| dir.with_file_name(n).symlink_metadata().is_err())
        .unwrap_or_default();
    std::fs::rename(dir, dir.with_file_name(&kept))?;
    let said = format!(
        "an earlier attempt was cut short after {:.0} s ({} requests answered, p99 {} us); kept in cells/{kept}, running the cell again",
        summary["duration_s"].as_f64().unwrap_or_default(),
        summary["latency_us"]["count"],
        summary["latency_us"]["p99"]
    );
    Ok(Some((
        json!({ "dir": kept, "status": "interrupted", "summary": summary }),
        said,
    )))
}

fn offset(t: Instant, measure_from: Instant) -> f64 {
    t.saturating_duration_since(measure_from).as_secs_f64()
}

/// Fires event `index` of `cell` now and writes its `events.jsonl` line.
/// `due` is `("due_s", seconds)` for a timed event or `("due_request", n)` for a lock-step one.
/// Says which event fired fewer times than planned (the run ended first), if one did.
fn unfired(cell: &Cell, fired: &[u32], requests: u64) -> Option<String> {
    cell.events.iter().zip(fired).enumerate().find_map(|(i, (e, n))| {
        let planned = match e.timing {
            Timing::At(_) => 1,
            Timing::Every { times, .. } | Timing::BeforeRequest { times, .. } => times,
        };
        (*n < planned).then(|| {
            format!(
                "events[{i}] fired {n} of {planned} times: the load ended first ({requests} requests); make load.duration (or load.requests) longer, or the event earlier"
            )
        })
    })
}

/// Asks the lab for event `index`'s change and logs it in `events.jsonl`. A change the
/// lab cannot make is logged as such and is the cell's failure.
/// Writes `impact.json`: for every event fired, what it did to the sampled requests in the
/// window after it (until the next event, at most 15 s).
/// `times` are the start of measurement and the load's start.
fn write_impact(
    records: &[ChangeRecord],
    dir: &Path,
    summary: &Summary,
    usage: Option<&UsageLog>,
    sample_rate: f64,
    (measure_from, start): (Instant, Instant),
) -> Result<(), String> {
    let shift = measure_from.saturating_duration_since(start).as_secs_f64();
    let points = crate::impact::read_samples(dir, shift)?;
    // The end of the last window: the end of measurement, or the last sample if one was
    // sent later (a sequential load's last request goes out at its end); inclusive.
    let end = points
        .iter()
        .map(|p| p.at_s)
        .fold(summary.duration_s, f64::max)
        + 1e-6;
    let mut out = Vec::new();
    for (i, rec) in records.iter().enumerate() {
        let t = rec
            .requested_at
            .saturating_duration_since(measure_from)
            .as_secs_f64();
        let next = records.get(i + 1).map(|r| {
            r.requested_at
                .saturating_duration_since(measure_from)
                .as_secs_f64()
        });
        let until = next.unwrap_or(f64::MAX).min(t + 15.0).min(end.max(t));
        let slot_s = summary
            .rate
            .target_per_s
            .filter(|r| *r > 0.0)
            .map(|r| 1.0 / r);
        let mut figures = crate::impact::impact(&points, t, until, sample_rate, slot_s);
        crate::impact::add_goaways(&mut figures, &summary.goaways, shift, t, until);
        let (effect, basis) =
            crate::impact::took_effect(&points, t, until, &rec.started, &rec.removed);
        figures["what"] = json!(rec.what);
        figures["requested_s"] = json!(t);
        figures["applied_s"] = json!(rec.applied_at.map(|a| offset(a, measure_from)));
        if let Some(at) = rec.endpoints_at {
            // The control plane's part: when the Service's EndpointSlices showed it.
            figures["endpoints_s"] = json!(offset(at, measure_from));
        }
        if let Some(at) = rec.reported_at {
            // When the controller said it had it (an HTTPRoute's status).
            figures["reported_s"] = json!(offset(at, measure_from));
        }
        figures["took_effect_s"] = json!(effect.map(|e| t + e));
        figures["took_effect_basis"] = json!(basis);
        // Route changes and reloads: read from the generation every answer carries.
        let by_hop: Vec<Value> = rec
            .generations
            .iter()
            .map(|(header, g)| {
                crate::impact::generation_effect(&summary.generations, header, *g, shift)
            })
            .collect();
        if let Some(proxies) = by_hop.first() {
            figures["took_effect_s"] = proxies["took_effect_s"].clone();
            figures["took_effect_basis"] = json!(format!(
                "first answer carrying generation {} ({})",
                proxies["generation"],
                proxies["header"].as_str().unwrap_or_default()
            ));
            figures["last_old_answer_s"] = proxies["last_old_answer_s"].clone();
            figures["mixed_window_s"] = proxies["mixed_window_s"].clone();
            figures["generations"] = Value::Array(by_hop);
        }
        if let Some(usage) = usage {
            figures["cpu"] = usage.around(t);
        }
        out.push(figures);
    }
    write_json(&dir.join("impact.json"), &Value::Array(out)).map_err(|e| e.to_string())
}

/// The lab change an action asks for.
/// The route changes a cell's events ask for, in order (a revert as the routes it
/// restores).
pub(crate) fn route_changes(cell: &Cell) -> Vec<Overlay> {
    cell.events
        .iter()
        .filter_map(|e| match change_for(&e.action, &cell.scenario) {
            Change::Overlay(o) => Some(o),
            _ => None,
        })
        .collect()
}

fn change_for(action: &Action, s: &crate::Scenario) -> Change {
    let pool = s
        .backends
        .first()
        .map_or_else(|| "echo".to_owned(), |p| p.name.clone());
    match action {
        Action::Scale(n) => Change::Scale { pool, replicas: *n },
        Action::Kill(name) => Change::Kill(name.clone()),
        Action::Terminate(name) => Change::Terminate(name.clone()),
        Action::Config(ConfigChange::Set(o)) => Change::Overlay(Overlay {
            response_header: o.response_header.clone(),
            cors_origin: o.cors_origin.clone(),
            rewrite: o.rewrite.clone(),
        }),
        Action::Config(ConfigChange::Revert) => Change::Overlay(s.overlay.to_overlay()),
        Action::Reload => Change::Reload,
        Action::StallBackend { backend, duration } => Change::Stall {
            backend: backend.clone(),
            duration: *duration,
        },
    }
}

/// Writes a run record: into a new file beside it, renamed over it (a link there is
/// replaced, never followed). When the disk is full, the record is written over itself
/// instead (its own blocks are freed first), so that it can still say how the run ended.
fn write_json(path: &Path, value: &Value) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    match ingressbench_report::files::replace_file(path, text.as_bytes()) {
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error()) => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                .open(path)?;
            file.set_len(0)?;
            file.write_all(text.as_bytes())?;
            file.sync_data()
        }
        other => other,
    }
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    json!({ "cpu_model": cpu, "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), "kernel": kernel })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn cell(events: &str) -> Cell {
        let text = format!(
            "name: t\ntargets: [nginx]\nload: {{ mode: open, rate: 100, duration: 300s }}\n{events}"
        );
        crate::expand::expand(&text, Path::new("s.yaml"), &[], false)
            .unwrap()
            .remove(0)
    }

    #[test]
    fn a_scaled_load_keeps_a_tail_after_its_last_event() {
        let secs = |d: Duration| (d.as_secs_f64() * 1000.0).round() / 1000.0;
        let s = Duration::from_secs;
        // churn.yaml's shape: the last event 10 s before the end.
        let churn = cell(
            "events: [{ at: 30s, every: 60s, times: 3, scale: 4 }, { at: 290s, config: revert }]\n",
        );
        assert_eq!(secs(measured_length(s(300), &churn, 1.0)), 300.0);
        // 0.03: 9 s of load, the last event at 8.7 s; it gets 1 s after it, not 0.3 s.
        assert_eq!(secs(measured_length(s(300), &churn, 0.03)), 9.7);
        // The last of a repeated event counts (220 s: 6.6 + 1 is under 9 s).
        let repeated = cell("events: [{ at: 100s, every: 60s, times: 3, scale: 4 }]\n");
        assert_eq!(secs(measured_length(s(300), &repeated, 0.03)), 9.0);
        let late = cell("events: [{ at: 280s, every: 10s, times: 2, scale: 4 }]\n");
        assert_eq!(secs(measured_length(s(300), &late, 0.03)), 9.7);
        // A tail already shorter than that is kept as written.
        let at_end = cell("events: [{ at: 299.5s, reload: true }]\n");
        assert_eq!(secs(measured_length(s(300), &at_end, 0.03)), 9.485);
        // No timed event: scaled as before.
        assert_eq!(secs(measured_length(s(300), &cell(""), 0.03)), 9.0);
    }
}
