//! run.json and the cells' directories: what a run writes about itself (the tool, the
//! machine, each cell's status), how it reads its own record back, and what `--force` and
//! `--resume` may delete or move: only what a run of this tool made and listed. Not the
//! files a cell streams while it runs ([`crate::store`]).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use ingressbench_results::run::{
    check_format, status, CellEntry, EarlierAttempt, Machine, RunRecord, FORMAT_VERSION,
};

use ingressbench_results::summary::AttemptSummary;

use crate::options::RunOptions;
use crate::{Cell, ScenarioError};

/// Refuses a results directory that holds a run (its run.json), or with `force` removes
/// that run: its run.json and the cells it lists (with their kept earlier attempts),
/// nothing else. A run.json this tool did not write is not taken for a run of its own.
pub(crate) fn clear_previous_run(dir: &Path, force: bool) -> Result<(), ScenarioError> {
    let path = dir.join("run.json");
    if path.symlink_metadata().is_err() {
        return Ok(());
    }
    let record = own_record(dir);
    if !force {
        let status = record
            .as_ref()
            .map_or_else(|_| "unreadable".to_owned(), |r| r.status.clone());
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
pub(crate) fn own_record(dir: &Path) -> Result<RunRecord, ScenarioError> {
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
    let record: RunRecord = serde_json::from_slice(&bytes)
        .map_err(|e| not_ours(format!("it is not a run record ({e})")))?;
    check_format(record.format_version.as_deref()).map_err(not_ours)?;
    let plain = |d: &Option<String>| {
        d.as_deref().is_some_and(|d| {
            !d.is_empty() && d != "." && d != ".." && !d.contains(['/', '\\', '\0'])
        })
    };
    let ours = record.tool_version.is_some() && record.cells.iter().all(|c| plain(&c.dir));
    if !ours {
        return Err(not_ours(
            "it was not written by `ingressbench run` (no tool_version, or cells without a directory of a plain name)".into(),
        ));
    }
    Ok(record)
}

/// The cell directories a run record lists: each cell's and its earlier attempts'.
fn listed_dirs(record: &RunRecord) -> Vec<&str> {
    let mut dirs = Vec::new();
    for cell in &record.cells {
        dirs.extend(cell.dir.as_deref());
        for attempt in &cell.earlier_attempts {
            dirs.extend(
                (attempt.dir.as_deref())
                    .filter(|d| !d.contains(['/', '\\']) && *d != ".." && *d != "."),
            );
        }
    }
    dirs
}

/// Makes `path` a directory (if missing), refusing one that is a link or not a
/// directory: what a run writes below it must stay in the results directory.
pub(crate) fn real_dir(path: &Path) -> Result<(), ScenarioError> {
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

/// The directory of a cell: its index and label, the label cut to fit a file name (the
/// index keeps it unique).
pub(crate) fn cell_dir_name(cell: &Cell) -> String {
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

/// A cell's entry in run.json before it runs.
pub(crate) fn cell_entry(c: &Cell) -> CellEntry {
    CellEntry {
        index: Some(c.index),
        repeat: c.repeat,
        target: c.target.name().to_owned(),
        settings: c.settings.iter().cloned().collect(),
        status: status::PENDING.to_owned(),
        dir: Some(cell_dir_name(c)),
        ..CellEntry::default()
    }
}

/// The record a run starts with: what was run, where and how, and every cell `pending`;
/// resumed, the cells the earlier attempt finished (and its start time and command) are
/// kept from `previous`.
pub(crate) fn new_record(
    cells: &[Cell],
    options: &RunOptions,
    factor: f64,
    previous: Option<&RunRecord>,
) -> RunRecord {
    let mut record = RunRecord {
        format_version: Some(FORMAT_VERSION.to_owned()),
        scenario: cells
            .first()
            .map(|c| c.scenario.name.clone())
            .unwrap_or_default(),
        status: "running".to_owned(),
        tool_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
        command: Some(options.command.clone()),
        quick: options.quick,
        quick_factor: factor,
        sets: options.sets.clone(),
        machine: machine(),
        started_at_unix_s: Some(now_unix()),
        scenario_text: Some(options.scenario_text.clone()),
        cells: cells.iter().map(cell_entry).collect(),
        left_out: options.left_out.clone(),
        ..RunRecord::default()
    };
    if let Some(previous) = previous {
        record.started_at_unix_s = previous.started_at_unix_s;
        record.command.clone_from(&previous.command);
        for (mine, theirs) in record.cells.iter_mut().zip(&previous.cells) {
            if theirs.is_done() && mine.dir == theirs.dir {
                *mine = theirs.clone();
            }
        }
        record.resumed_by = Some(options.command.clone());
    }
    record
}

/// Why a cell's directory could not be made ready.
pub(crate) enum Fresh {
    /// It is not this tool's to touch.
    NotOurs(ScenarioError),
    Io(std::io::Error),
}

/// Makes `dir` ready for `cell`. A directory an earlier attempt left (a resumed run)
/// starts over: what it measured is moved aside and listed (returned: the cell's
/// `earlier_attempts` and a line to print), an empty one is removed. A directory no run
/// record of this results directory lists is not touched.
pub(crate) fn fresh_cell_dir(
    results_dir: &Path,
    dir: &Path,
    cell: &Cell,
    previous_entry: Option<&CellEntry>,
) -> Result<Option<(Vec<EarlierAttempt>, String)>, Fresh> {
    let mut kept = None;
    if dir.symlink_metadata().is_ok() {
        if previous_entry.is_none_or(|e| e.dir.as_deref() != Some(&cell_dir_name(cell))) {
            return Err(Fresh::NotOurs(ScenarioError::NotOurs {
                path: dir.to_owned(),
                why: "no run record of this directory lists it".into(),
            }));
        }
        match keep_attempt(results_dir, dir, previous_entry).map_err(Fresh::Io)? {
            Some((attempt, said)) => {
                let mut attempts = previous_entry
                    .map(|e| e.earlier_attempts.clone())
                    .unwrap_or_default();
                attempts.push(attempt);
                kept = Some((attempts, said));
            }
            None => std::fs::remove_dir_all(dir).map_err(Fresh::Io)?,
        }
    }
    std::fs::create_dir_all(dir).map_err(Fresh::Io)?;
    Ok(kept)
}

/// Moves the directory of a cell an earlier attempt left unfinished to
/// `NAME.attempt-K` (the first K free) if it measured anything, and describes it: its
/// summary (the one run.json kept for a cell stopped by Ctrl-C, else one rebuilt from its
/// interval log) and where it went, and a line to print. `None` if there was nothing to keep.
fn keep_attempt(
    results_dir: &Path,
    dir: &Path,
    previous: Option<&CellEntry>,
) -> std::io::Result<Option<(EarlierAttempt, String)>> {
    use ingressbench_report::{files, results};
    use ingressbench_results::hlog;
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
        .filter(|p| p.status == status::INTERRUPTED)
        .and_then(|p| p.summary.clone())
        .map(AttemptSummary::Line);
    let rebuilt = || {
        hlog::read_partial(&bytes)
            .ok()
            .and_then(|p| results::rebuild_summary(&p))
            .map(|s| AttemptSummary::Rebuilt(Box::new(s)))
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
        "an earlier attempt was cut short ({}); kept in cells/{kept}, running the cell again",
        summary.said()
    );
    Ok(Some((
        EarlierAttempt {
            dir: Some(kept),
            status: status::INTERRUPTED.to_owned(),
            summary: Some(summary),
        },
        said,
    )))
}

/// Writes a run record: into a new file beside it, renamed over it (a link there is
/// replaced, never followed), so that a write that fails leaves the old record whole.
/// A full disk is met by the results lock's reserve ([`ResultsLock::write_even_if_full`]).
///
/// [`ResultsLock::write_even_if_full`]: crate::lock::ResultsLock::write_even_if_full
pub(crate) fn write_json<T: serde::Serialize + ?Sized>(
    path: &Path,
    value: &T,
) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    ingressbench_report::files::replace_file(path, text.as_bytes())
}

pub(crate) fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn machine() -> Machine {
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
    Machine {
        cpu_model: cpu,
        cores: std::thread::available_parallelism().map_or(0, |n| n.get() as u64),
        kernel,
    }
}
