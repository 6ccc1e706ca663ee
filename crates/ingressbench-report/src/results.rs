//! Reading a results directory (docs/RESULTS.md) back, or a single `load --json` output:
//! what a report and a comparison are made from. Missing or unreadable parts are noted,
//! not fatal, so that an incomplete run still gets a report.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::hlog::Interval;

/// A run as read from disk.
#[derive(Debug)]
pub struct RunResults {
    /// The results directory (or the directory of a single summary file).
    pub dir: PathBuf,
    /// The same, canonical: what is read must resolve inside it.
    pub root: PathBuf,
    /// `run.json` (for a single load output, a record made up from it).
    pub record: Value,
    /// Every cell, in running order (pending and failed ones too).
    pub cells: Vec<CellResults>,
    /// What could not be read.
    pub notes: Vec<String>,
}

/// One cell as read from disk.
#[derive(Debug)]
pub struct CellResults {
    /// Position in running order.
    pub index: usize,
    /// Which repeat (from 0).
    pub repeat: u32,
    /// The target's name.
    pub target: String,
    /// Matrix settings, as `path=value`.
    pub settings: Vec<(String, String)>,
    /// `done`, `pending`, `interrupted`, `failed`.
    pub status: String,
    /// Its directory, if it has one.
    pub dir: Option<PathBuf>,
    /// Its `summary.json`.
    pub summary: Option<Value>,
    /// The proxy's version.
    pub proxy_version: Option<String>,
    /// Its one-second windows (`latency.hlog`).
    pub windows: Vec<Interval>,
    /// Its `impact.json` entries.
    pub impact: Vec<Value>,
    /// Seconds from the load's start to the start of measurement (the warm-up).
    pub measure_from_s: f64,
    /// What the lab's processes spent (`run.json`'s `usage`), if it was measured.
    pub usage: Option<Value>,
    /// The proxies' CPU over time from `usage.jsonl`: (middle of each interval in seconds
    /// from the start of measurement, cores used in it).
    pub proxy_cpu: Vec<(f64, f64)>,
    /// Its `workers.json`, when several processes sent its load.
    pub workers: Option<Value>,
    /// Its error, if it failed.
    pub error: Option<String>,
}

impl CellResults {
    /// The settings as one label (`load.rate=500`), empty without a matrix.
    pub fn settings_label(&self) -> String {
        self.settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// A number from the summary by path (`["latency_us", "p99"]`).
    pub fn number(&self, path: &[&str]) -> Option<f64> {
        let mut v = self.summary.as_ref()?;
        for key in path {
            v = v.get(key)?;
        }
        v.as_f64()
    }
}

/// Reads a results directory, or a `load --json` file (with an `.hlog` of the same stem
/// beside it, if there is one).
pub fn read(path: &Path) -> Result<RunResults, String> {
    if path.is_file() {
        return read_single(path);
    }
    let run_json = path.join("run.json");
    let text = std::fs::read_to_string(&run_json).map_err(|e| {
        format!(
            "{}: cannot read it ({e}); give a results directory (from `ingressbench run`) or a `load --json` file",
            run_json.display()
        )
    })?;
    let record: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a run record: {e}", run_json.display()))?;
    let listed = record
        .get("cells")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            format!(
                "{}: not a run record (no `cells` list); give a results directory written by `ingressbench run`",
                run_json.display()
            )
        })?;
    if listed.is_empty() {
        return Err(format!(
            "{}: the run has no cells, so there is nothing to report",
            run_json.display()
        ));
    }
    // Every file read must be inside the results directory, whatever run.json says and
    // whatever links it holds.
    let root = path
        .canonicalize()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut notes = Vec::new();
    let mut cells = Vec::new();
    let mut record = record.clone();
    if record["status"] == "running" {
        if let Some(gone) = writer_gone(path) {
            record["status"] = Value::from(RUN_CUT_SHORT);
            record["cut_short"] = Value::from(gone);
        }
    }
    for (i, c) in listed.iter().enumerate() {
        let dir = match c["dir"].as_str() {
            Some(d) if !is_plain_name(d) => {
                return Err(format!(
                    "{}: cell {i}: dir {d:?} is not a directory name under cells/ (it would leave the results directory)",
                    run_json.display()
                ))
            }
            d => d.map(|d| path.join("cells").join(d)),
        };
        let mut cell = CellResults {
            index: c["index"].as_u64().map_or(i, |x| x as usize),
            repeat: c["repeat"].as_u64().unwrap_or(0) as u32,
            target: c["target"].as_str().unwrap_or("?").to_owned(),
            settings: c["settings"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                        .collect()
                })
                .unwrap_or_default(),
            status: c["status"].as_str().unwrap_or("pending").to_owned(),
            dir: dir.clone(),
            summary: None,
            proxy_version: c["proxy_version"].as_str().map(str::to_owned),
            windows: Vec::new(),
            impact: Vec::new(),
            measure_from_s: c["measure_from_s"].as_f64().unwrap_or(0.0),
            usage: c.get("usage").filter(|u| !u.is_null()).cloned(),
            proxy_cpu: Vec::new(),
            workers: None,
            error: c["error"].as_str().map(str::to_owned),
        };
        match (&dir, cell.status.as_str()) {
            (Some(dir), "done" | "interrupted") => {
                load_cell_files(&mut cell, &root, dir, &mut notes)
            }
            // Started but never finished: its run was killed, crashed or stopped twice.
            (Some(dir), "pending") => recover_cell(&mut cell, &root, dir, &mut notes),
            _ => {}
        }
        cells.push(cell);
    }
    Ok(RunResults {
        dir: path.to_owned(),
        root,
        record,
        cells,
        notes,
    })
}

/// One path component, not `.` or `..`.
fn is_plain_name(d: &str) -> bool {
    !d.is_empty() && d != "." && d != ".." && !d.contains(['/', '\\', '\0'])
}

/// Whether `path` resolves (links followed) inside `root` (a canonical path); if not, why.
/// Whatever a results directory holds, nothing outside it is read into a report.
pub fn resolves_inside(root: &Path, path: &Path) -> Result<(), String> {
    match path.canonicalize() {
        Ok(real) if real.starts_with(root) => Ok(()),
        Ok(real) => Err(format!(
            "{}: not read, it leads out of the results directory (to {})",
            path.display(),
            real.display()
        )),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Reads a cell's files, each only if it resolves inside `root` (the results directory,
/// canonical).
fn load_cell_files(cell: &mut CellResults, root: &Path, dir: &Path, notes: &mut Vec<String>) {
    let inside = |p: &Path| resolves_inside(root, p);
    let summary = dir.join("summary.json");
    match inside(&summary).and_then(|()| read_json(&summary)) {
        Ok(v) => cell.summary = Some(v),
        Err(e) => notes.push(e),
    }
    let hlog = dir.join("latency.hlog");
    if let Err(e) = inside(&hlog) {
        notes.push(e);
        return;
    }
    match std::fs::read(&hlog) {
        Ok(bytes) => match crate::hlog::read(&bytes) {
            Ok(w) => cell.windows = w,
            Err(e) => notes.push(format!("{}: {e}", hlog.display())),
        },
        Err(e) => notes.push(format!("{}: {e}", hlog.display())),
    }
    let impact = dir.join("impact.json");
    if let Ok(Value::Array(entries)) = inside(&impact).and_then(|()| read_json(&impact)) {
        cell.impact = entries;
    }
    let workers = dir.join("workers.json");
    if workers.exists() {
        match inside(&workers).and_then(|()| read_json(&workers)) {
            Ok(v) => cell.workers = Some(v),
            Err(e) => notes.push(e),
        }
    }
    let usage = dir.join("usage.jsonl");
    if let Ok(text) =
        inside(&usage).and_then(|()| std::fs::read_to_string(&usage).map_err(|e| e.to_string()))
    {
        cell.proxy_cpu = cpu_rates(&text, "proxy");
    }
}

/// The status shown for a run whose run.json says `running` while the process that
/// wrote it is gone.
pub const RUN_CUT_SHORT: &str = "cut short";

/// For a run.json that says `running`: if the process named in the results directory's
/// lock is gone, says so (it was killed or crashed). `None` while it lives, or when the
/// lock does not name one.
fn writer_gone(dir: &Path) -> Option<String> {
    let holder = std::fs::read_to_string(dir.join(".lock")).ok()?;
    let pid = holder
        .strip_prefix("process ")?
        .split(' ')
        .next()?
        .parse::<u32>()
        .ok()?;
    (!Path::new("/proc").join(pid.to_string()).exists()).then(|| {
        format!(
            "run.json says running, but process {pid}, which wrote it, is gone (killed or crashed)"
        )
    })
}

/// The status a cell rebuilt from its interval log gets.
pub const CUT_SHORT: &str = "interrupted";

/// A cell that started and never finished, because its run was killed, crashed or stopped
/// by a second Ctrl-C: what it wrote as it went (the interval log) is read back, its summary
/// rebuilt and the cell marked interrupted. A cell that never started has no log and stays
/// pending.
fn recover_cell(cell: &mut CellResults, root: &Path, dir: &Path, notes: &mut Vec<String>) {
    let hlog = dir.join("latency.hlog");
    if !hlog.exists() {
        return;
    }
    let partial = resolves_inside(root, &hlog)
        .and_then(|()| std::fs::read(&hlog).map_err(|e| format!("{}: {e}", hlog.display())))
        .and_then(|bytes| {
            crate::hlog::read_partial(&bytes).map_err(|e| format!("{}: {e}", hlog.display()))
        });
    let partial = match partial {
        Ok(p) => p,
        Err(e) => {
            notes.push(e);
            return;
        }
    };
    let Some(summary) = rebuild_summary(&partial) else {
        return;
    };
    cell.status = CUT_SHORT.to_owned();
    cell.summary = Some(summary);
    cell.windows = partial.intervals;
    let usage = dir.join("usage.jsonl");
    if let Ok(text) = resolves_inside(root, &usage)
        .and_then(|()| std::fs::read_to_string(&usage).map_err(|e| e.to_string()))
    {
        cell.proxy_cpu = cpu_rates(&text, "proxy");
    }
}

/// The summary of a cell cut short, from its interval log: requests answered and their
/// latency from the histograms; every outcome, errors included, from the per-interval
/// counts (a log without them, from an older version, leaves errors unknown). Marked
/// `rebuilt_from` and `interrupted`, with a warning that says so. `None` without an
/// interval.
pub fn rebuild_summary(partial: &crate::hlog::Partial) -> Option<Value> {
    let last = partial.intervals.last()?;
    let mut latency = ingressbench_stats::HistogramUs::new();
    for i in &partial.intervals {
        latency.merge(&i.histogram);
    }
    let seconds = (last.start + last.length).as_secs_f64();
    let with_outcomes = partial.intervals_with_outcomes == partial.intervals.len();
    let o = &partial.outcomes;
    let (total, ok, errors, outcomes) = if with_outcomes {
        (
            Value::from(o.total()),
            Value::from(o.ok()),
            Value::from(o.errors()),
            serde_json::to_value(o.to_map()).unwrap_or(Value::Null),
        )
    } else {
        (
            Value::from(latency.count()),
            Value::Null,
            Value::Null,
            Value::Null,
        )
    };
    let pct = |p: f64| Value::from(latency.value_at_percentile(p));
    Some(serde_json::json!({
        "rebuilt_from": "latency.hlog",
        "interrupted": true,
        "duration_s": seconds,
        "requests": { "total": total, "ok": ok, "errors": errors },
        "outcomes": outcomes,
        "latency_us": {
            "count": latency.count(),
            "mean": latency.mean(),
            "p50": pct(50.0), "p90": pct(90.0), "p99": pct(99.0), "p999": pct(99.9),
            "max": latency.max(),
        },
        "warnings": [format!(
            "CUT SHORT, REBUILT FROM DISK: this cell's run ended before the cell did (killed, crashed, or stopped by a second Ctrl-C); its figures are rebuilt from the {} one-second windows of latency.hlog (the first {seconds:.0} s){}",
            partial.intervals.len(),
            if with_outcomes { "" } else { "; the log has no outcome counts (an older version wrote it), so errors are unknown" }
        )],
    }))
}

/// A CSV field as written: quoted (with doubled quotes inside) or plain.
fn unquote(field: &str) -> String {
    match field.strip_prefix('"').and_then(|f| f.strip_suffix('"')) {
        Some(inner) => inner.replace("\"\"", "\""),
        None => field.to_owned(),
    }
}

/// The CPU rate (cores) of the parts with `role` in each interval between consecutive
/// readings of a `usage.jsonl`, at the interval's middle. Lines that do not parse (a
/// reading cut short by a crash) are skipped.
pub fn cpu_rates(usage_jsonl: &str, role: &str) -> Vec<(f64, f64)> {
    let readings: Vec<(f64, f64)> = usage_jsonl
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|r| {
            let cpu = r["parts"]
                .as_array()?
                .iter()
                .filter(|p| p["role"] == role)
                .filter_map(|p| p["cpu_s"].as_f64())
                .sum();
            Some((r["t_s"].as_f64()?, cpu))
        })
        .collect();
    readings
        .windows(2)
        // An interval of under 0.1 s (the last, cut at the end) says little at 10 ms ticks.
        .filter(|w| w[1].0 - w[0].0 >= 0.1)
        .map(|w| {
            (
                (w[0].0 + w[1].0) / 2.0,
                (w[1].1 - w[0].1) / (w[1].0 - w[0].0),
            )
        })
        .collect()
}

fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// A single `load --json` output as a run of one cell.
fn read_single(path: &Path) -> Result<RunResults, String> {
    let summary = read_json(path)?;
    if summary.get("latency_us").is_none() {
        return Err(format!(
            "{}: not a `load --json` summary (no latency_us); give a results directory or a summary file",
            path.display()
        ));
    }
    let mut notes = Vec::new();
    let hlog = path.with_extension("hlog");
    let windows = match std::fs::read(&hlog) {
        Ok(bytes) => crate::hlog::read(&bytes).unwrap_or_else(|e| {
            notes.push(format!("{}: {e}", hlog.display()));
            Vec::new()
        }),
        Err(_) => Vec::new(),
    };
    let name = path
        .file_stem()
        .map_or("load".into(), |s| s.to_string_lossy().into_owned());
    let record = serde_json::json!({
        "scenario": name,
        "status": if summary["interrupted"].as_bool() == Some(true) { "incomplete" } else { "complete" },
        "command": Value::Null,
        "tool_version": summary.get("tool_version").cloned().unwrap_or(Value::Null),
    });
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let root = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(RunResults {
        dir,
        root,
        record,
        cells: vec![CellResults {
            index: 0,
            repeat: 0,
            target: summary["target"].as_str().unwrap_or("target").to_owned(),
            settings: Vec::new(),
            status: "done".into(),
            dir: None,
            summary: Some(summary),
            proxy_version: None,
            windows,
            impact: Vec::new(),
            measure_from_s: 0.0,
            usage: None,
            proxy_cpu: Vec::new(),
            workers: None,
            error: None,
        }],
        notes,
    })
}

/// A sampled request as the charts and impact figures need it.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleRow {
    /// Intended send time, seconds from the load's start.
    pub at_s: f64,
    /// Latency from the intended send time, seconds.
    pub latency_s: f64,
    /// Answered with a status below 400.
    pub ok: bool,
    /// The outcome's name (`200`, `refused`, `timeout`, …).
    pub outcome: String,
    /// The `x-backend` of the answer (empty if none).
    pub backend: String,
    /// The generations the answer carried (`generation`, `sidecar_generation`; 0: none,
    /// or a file written before these columns existed).
    pub generations: [u32; 2],
}

/// Reads a `samples.csv` or `samples.csv.gz` file (docs/RESULTS.md), in file order.
pub fn read_samples(path: &Path) -> std::io::Result<Vec<SampleRow>> {
    let file = std::fs::File::open(path)?;
    let reader: Box<dyn BufRead> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(BufReader::new(flate2::read::GzDecoder::new(file)))
    } else {
        Box::new(BufReader::new(file))
    };
    let mut rows = Vec::new();
    let mut lines = reader.lines();
    // Files written before the generation columns existed end at connection_reused.
    let header = lines.next().transpose()?.unwrap_or_default();
    let after_backend = if header.ends_with("sidecar_generation") {
        3
    } else {
        1
    };
    for line in lines {
        let line = line?;
        // The first thirteen columns never hold a comma; the backend (possibly quoted)
        // and the columns after it follow.
        let f: Vec<&str> = line.splitn(14, ',').collect();
        if f.len() < 14 {
            continue;
        }
        let (Ok(at_s), Ok(latency_s)) = (f[0].parse::<f64>(), f[2].parse::<f64>()) else {
            continue;
        };
        let mut tail: Vec<&str> = f[13].rsplitn(after_backend + 1, ',').collect();
        tail.reverse();
        if tail.len() != after_backend + 1 {
            continue;
        }
        let backend = unquote(tail[0]);
        let generation = |i: usize| tail.get(i).and_then(|g| g.parse().ok()).unwrap_or(0);
        rows.push(SampleRow {
            at_s,
            latency_s,
            ok: f[12].parse::<u16>().is_ok_and(|s| s < 400),
            outcome: f[11].to_owned(),
            backend,
            generations: [generation(2), generation(3)],
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_and_without_generation_columns_read_alike() {
        let dir = std::env::temp_dir().join(format!("ib-samples-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let row = "1.000000,1.000200,0.005200,0.000100,0,0.0001,0,0.0001,0.0036,0.005,850,200,200,\"b,\"\"x\"\"\",0";
        let old = dir.join("old.csv");
        let header = crate::samples::HEADER.replace(",generation,sidecar_generation", "");
        std::fs::write(&old, format!("{header}\n{row}\n")).unwrap();
        let new = dir.join("new.csv");
        std::fs::write(&new, format!("{}\n{row},4,\n", crate::samples::HEADER)).unwrap();
        let (old, new) = (read_samples(&old).unwrap(), read_samples(&new).unwrap());
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(old[0].backend, "b,\"x\"");
        assert_eq!(old[0].generations, [0, 0]);
        assert_eq!(new[0].backend, "b,\"x\"");
        assert_eq!(new[0].generations, [4, 0]);
        assert!(old[0].ok && (new[0].latency_s - 0.0052).abs() < 1e-9);
    }

    #[test]
    fn cpu_rates_are_per_interval_of_the_role_asked() {
        let line = |t: f64, proxy: f64| {
            format!(
                r#"{{"t_s":{t},"parts":[{{"name":"a","role":"proxy","cpu_s":{proxy}}},{{"name":"b","role":"proxy","cpu_s":{proxy}}},{{"name":"client","role":"client","cpu_s":9}}]}}"#
            )
        };
        let text = [
            line(0.0, 1.0),
            line(1.0, 1.25),
            "{cut".into(),
            line(3.0, 1.5),
            line(3.05, 1.5),
        ]
        .join("\n");
        // Two parts of the role: 0.5 core, then 0.25 over two seconds; the last 50 ms is
        // too short to say anything.
        assert_eq!(cpu_rates(&text, "proxy"), vec![(0.5, 0.5), (2.0, 0.25)]);
    }
}
