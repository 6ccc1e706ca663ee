//! Reading a results directory (docs/RESULTS.md) back, or a single `load --json` output:
//! what a report and a comparison are made from. A directory may come from elsewhere, so
//! every file goes through [`crate::files`] (no link, regular files, sizes bounded by the
//! run's own counts). A cell the run recorded as done is read whole or marked
//! [`CellResults::unreadable`] with the reasons, never left out in silence: a report
//! shows it as such and a gate cannot judge without it. Missing parts of cells that never
//! finished are noted, not fatal, so that an incomplete run still gets a report.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ingressbench_results::site::{CountsReading, UsageReading};
use ingressbench_results::summary::{CellSummary, Latency, Requests};
use serde_json::Value;

use ingressbench_results::run::RunRecord;

use crate::files;
use ingressbench_results::hlog::Interval;

/// A run as read from disk.
#[derive(Debug)]
pub struct RunResults {
    /// The results directory (or the directory of a single summary file).
    pub dir: PathBuf,
    /// The same, canonical: what is read must resolve inside it.
    pub root: PathBuf,
    /// `run.json` (for a single load output, a record made up from it).
    pub record: RunRecord,
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
    /// Its directory's name under `cells/`, if it has one.
    pub dir_name: Option<String>,
    /// Why files of a cell recorded as done could not be read (each names the file and
    /// the rule it broke); its figures are then none of the run's.
    pub unreadable: Vec<String>,
    /// Its `summary.json`.
    pub summary: Option<CellSummary>,
    /// The proxy's version.
    pub proxy_version: Option<String>,
    /// Its one-second windows (`latency.hlog`).
    pub windows: Vec<Interval>,
    /// When its windows' offsets start, in seconds since the Unix epoch (the interval
    /// log's `StartTime`: as the load began).
    pub log_start_unix_s: Option<f64>,
    /// Its `impact.json` entries.
    pub impact: Vec<ingressbench_results::impact::ImpactEntry>,
    /// Its `routes.json` (the route probe's figures per event firing), when it has one.
    pub routes: Option<ingressbench_results::routes::RoutesFile>,
    /// Its `websocket.json`, `sse.json`, `grpc.json` or `grpc-stream.json`, when its
    /// load was long-lived.
    pub websocket: Option<ingressbench_results::stream::StreamFile>,
    /// Seconds from the load's start to the start of measurement (the warm-up).
    pub measure_from_s: f64,
    /// What the lab's processes spent (`run.json`'s `usage`), if it was measured.
    pub usage: Option<ingressbench_results::site::Usage>,
    /// The proxies' CPU over time from `usage.jsonl`: (middle of each interval in seconds
    /// from the start of measurement, cores used in it).
    pub proxy_cpu: Vec<(f64, f64)>,
    /// The proxies' resident memory and processes over time from `usage.jsonl`: (seconds
    /// from the start of measurement, bytes, processes), every proxy replica together.
    pub proxy_memory: Vec<(f64, f64, f64)>,
    /// A soak's verdict (`run.json`'s `soak`).
    pub soak: Option<ingressbench_results::soak::SoakRecord>,
    /// What the proxies counted over time from `proxy-metrics.jsonl`: per kind of count
    /// (its words), the rate per second in each interval between readings, at its middle.
    pub proxy_counts: Vec<CountRates>,
    /// Why the proxies' counts could not be read from a `proxy-metrics.jsonl` that is there.
    pub proxy_counts_unread: Option<String>,
    /// Its `workers.json`, when several processes sent its load.
    pub workers: Option<ingressbench_results::workers::WorkersFile>,
    /// Its error, if it failed.
    pub error: Option<String>,
}

impl CellResults {
    /// Makes the cell unreadable for `why` (when there is one): none of its figures is
    /// the run's.
    fn set_unreadable(&mut self, why: Vec<String>) {
        if why.is_empty() {
            return;
        }
        self.summary = None;
        self.windows.clear();
        self.impact.clear();
        self.workers = None;
        self.routes = None;
        self.websocket = None;
        self.proxy_counts.clear();
        self.proxy_cpu.clear();
        self.proxy_memory.clear();
        self.unreadable.extend(why);
    }

    /// Where `file` of this cell is, as path parts under the results directory.
    pub fn file_parts<'a>(&'a self, file: &'a str) -> Option<[&'a str; 3]> {
        self.dir_name.as_deref().map(|d| ["cells", d, file])
    }

    /// The cell in words: `haproxy at load.rate=500, repeat 2 (cell 7)`.
    pub fn label(&self) -> String {
        let settings = self.settings_label();
        let at = if settings.is_empty() {
            String::new()
        } else {
            format!(" at {settings}")
        };
        format!(
            "{}{at}, repeat {} (cell {})",
            self.target,
            self.repeat + 1,
            self.index
        )
    }

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
        self.summary.as_ref()?.figure(path)
    }
}

/// Reads a results directory, or a `load --json` file (with an `.hlog` of the same stem
/// beside it, if there is one).
pub fn read(path: &Path) -> Result<RunResults, String> {
    if path.is_file() {
        return read_single(path);
    }
    let run_json = path.join("run.json");
    let text = files::read_in(
        path,
        &["run.json"],
        files::RUN_RECORD_LIMIT,
        "a run record's",
    )
    .map_err(|e| {
        format!("{e}; give a results directory (from `ingressbench run`) or a `load --json` file")
    })?;
    let value: Value = serde_json::from_slice(&text)
        .map_err(|e| format!("{}: not a run record: {e}", run_json.display()))?;
    ingressbench_results::run::check_record(&value)
        .map_err(|e| format!("{}: {e}", run_json.display()))?;
    let mut record: RunRecord = serde_json::from_value(value)
        .map_err(|e| format!("{}: not a run record: {e}", run_json.display()))?;
    if record.cells.is_empty() {
        return Err(format!(
            "{}: the run has no cells, so there is nothing to report",
            run_json.display()
        ));
    }
    // Every file is read from the results directory down, whatever run.json says and
    // whatever links it holds.
    let root = path
        .canonicalize()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut notes = Vec::new();
    let mut cells = Vec::new();
    if record.status == "running" {
        if let Some(gone) = writer_gone(path) {
            record.status = RUN_CUT_SHORT.to_owned();
            record.cut_short = Some(gone);
        }
    }
    for (i, c) in record.cells.iter().enumerate() {
        let dir = match c.dir.as_deref() {
            Some(d) if !is_plain_name(d) => {
                return Err(format!(
                    "{}: cell {i}: dir {d:?} is not a directory name under cells/ (it would leave the results directory)",
                    run_json.display()
                ))
            }
            d => d,
        };
        let mut cell = CellResults {
            index: c.index.unwrap_or(i),
            repeat: c.repeat,
            target: if c.target.is_empty() { "?" } else { &c.target }.to_owned(),
            settings: c.settings.clone().into_iter().collect(),
            status: c.status.clone(),
            dir: dir.map(|d| path.join("cells").join(d)),
            dir_name: dir.map(str::to_owned),
            unreadable: Vec::new(),
            summary: None,
            proxy_version: c.proxy_version.clone(),
            windows: Vec::new(),
            log_start_unix_s: None,
            impact: Vec::new(),
            routes: None,
            websocket: None,
            measure_from_s: c.measure_from_s.unwrap_or(0.0),
            usage: c.usage.clone(),
            proxy_cpu: Vec::new(),
            proxy_memory: Vec::new(),
            soak: c.soak.clone(),
            proxy_counts: Vec::new(),
            proxy_counts_unread: None,
            workers: None,
            error: c.error.clone(),
        };
        match (dir, cell.status.as_str()) {
            (Some(_), "done" | "interrupted") => {
                load_cell_files(&mut cell, &root);
                check_files_written(&mut cell, &root, c.files.as_ref());
                notes.extend(
                    cell.unreadable
                        .iter()
                        .map(|why| format!("{}: {why}", cell.label())),
                );
            }
            (None, "done" | "interrupted") => cell
                .unreadable
                .push("run.json gives it no directory".to_owned()),
            // Started but never finished: its run was killed, crashed or stopped twice.
            (Some(_), "pending") => recover_cell(&mut cell, &root, &mut notes),
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

/// Whether the files a cell wrote (its run.json entry's `files`, name and size; runs
/// before 0.1.0 recorded none) are still what it wrote: a file deleted, emptied or cut
/// would otherwise take its section of the report and its sentence of the headline away
/// without a word. A cell whose files differ is unreadable, each difference named.
fn check_files_written(
    cell: &mut CellResults,
    root: &Path,
    written: Option<&BTreeMap<String, u64>>,
) {
    let Some(written) = written else {
        return;
    };
    let dir_name = cell.dir_name.clone().unwrap_or_default();
    let mut why = Vec::new();
    for (name, &size) in written {
        if !is_plain_name(name) {
            why.push(format!(
                "run.json records a file named {name:?}, not a name in the cell's directory"
            ));
            continue;
        }
        let parts = ["cells", dir_name.as_str(), name.as_str()];
        if !files::exists_in(root, &parts) {
            why.push(format!("{name} was written ({size} bytes) and is gone"));
            continue;
        }
        match files::open_in(root, &parts)
            .and_then(|f| f.metadata().map_err(|e| format!("{name}: {e}")))
        {
            Ok(meta) if meta.len() == size => {}
            Ok(meta) => why.push(format!(
                "{name} was written with {size} bytes and holds {} (changed since)",
                meta.len()
            )),
            Err(e) => why.push(e),
        }
    }
    cell.set_unreadable(why);
}

/// Where `value` holds a negative number (`routes.json: firings[2].routes`), if it does.
fn negative_at(value: &Value, at: &str) -> Option<String> {
    match value {
        Value::Number(n) => n.as_f64().filter(|x| *x < 0.0).map(|_| at.to_owned()),
        Value::Array(items) => {
            (items.iter().enumerate()).find_map(|(i, v)| negative_at(v, &format!("{at}[{i}]")))
        }
        Value::Object(fields) => (fields.iter()).find_map(|(k, v)| {
            negative_at(
                v,
                &format!("{at}{}{k}", if at.ends_with(".json") { ": " } else { "." }),
            )
        }),
        _ => None,
    }
}

/// One path component, not `.` or `..`.
fn is_plain_name(d: &str) -> bool {
    !d.is_empty() && d != "." && d != ".." && !d.contains(['/', '\\', '\0'])
}

/// What one window of a cell's interval log may take at most: a V2-deflate histogram in
/// base64 and its outcomes comment (a real one takes a few KiB).
const HLOG_BYTES_PER_WINDOW: u64 = 256 << 10;

/// The lines a cell's per-second files may hold: a window each second of the load, with
/// room for the warm-up and the end.
fn seconds_allowed(duration_s: f64, measure_from_s: f64) -> u64 {
    (duration_s.max(0.0) + measure_from_s.max(0.0))
        .min(1e9)
        .ceil() as u64
        + 60
}

/// Reads a cell the run recorded as done: its summary (which must be one), its interval
/// log (whole, and holding every answered request the summary counts), its impact and
/// workers records when present, and its CPU readings. Any of these that cannot be read
/// makes the cell unreadable, its figures none of the run's.
fn load_cell_files(cell: &mut CellResults, root: &Path) {
    let mut why = Vec::new();
    let dir_name = cell.dir_name.clone().unwrap_or_default();
    let read = |file: &str, limit: u64, allows: &str| {
        files::read_in(root, &["cells", &dir_name, file], limit, allows)
    };
    let summary = read("summary.json", files::CELL_JSON_LIMIT, "a summary's").and_then(|b| {
        let value: Value =
            serde_json::from_slice(&b).map_err(|e| format!("summary.json is not JSON: {e}"))?;
        CellSummary::read(value)
    });
    let summary = match summary {
        Ok(s) => s,
        Err(e) => {
            cell.unreadable.push(e);
            return;
        }
    };
    // Both there: checked as it was read.
    let duration_s = summary.duration_s.unwrap_or(0.0);
    let answered = summary.latency_us.count.unwrap_or(0);
    let windows = seconds_allowed(duration_s, cell.measure_from_s);
    let hlog = read(
        "latency.hlog",
        windows * HLOG_BYTES_PER_WINDOW,
        &format!("the {windows} one-second windows of the cell's duration"),
    )
    .and_then(|bytes| {
        let w =
            ingressbench_results::hlog::read(&bytes).map_err(|e| format!("latency.hlog: {e}"))?;
        Ok((w, ingressbench_results::hlog::start_unix_s(&bytes)))
    });
    match hlog {
        Ok((w, start)) => {
            cell.log_start_unix_s = start;
            let counted: u64 = w.iter().map(|i| i.histogram.count()).sum();
            if counted != answered {
                why.push(format!(
                    "latency.hlog holds {counted} answered requests and the summary counts {answered} (cut, or not this cell's)"
                ));
            }
            cell.windows = w;
        }
        Err(e) => why.push(e),
    }
    // Present or not as the run had events or workers; when present, read whole.
    let optional = |file: &str| {
        files::exists_in(root, &["cells", &dir_name, file]).then(|| {
            read(file, files::CELL_JSON_LIMIT, "a cell record's").and_then(|b| {
                serde_json::from_slice::<Value>(&b).map_err(|e| format!("{file}: {e}"))
            })
        })
    };
    match optional("impact.json").map(|v| {
        v.and_then(|v| {
            serde_json::from_value(v).map_err(|e| {
                format!("impact.json is not a list of events as the tool writes them: {e}")
            })
        })
    }) {
        Some(Ok(entries)) => cell.impact = entries,
        Some(Err(e)) => why.push(e),
        None => {}
    }
    match optional("workers.json").map(|v| {
        v.and_then(|v| serde_json::from_value(v).map_err(|e| format!("workers.json: {e}")))
    }) {
        Some(Ok(file)) => cell.workers = Some(file),
        Some(Err(e)) => why.push(e),
        None => {}
    }
    match optional("routes.json") {
        Some(Ok(v)) if v["firings"].is_array() => match negative_at(&v, "routes.json") {
            Some(at) => why.push(format!(
                "{at} is negative, and no count, time or size the route probe records can be"
            )),
            None => match serde_json::from_value(v) {
                Ok(routes) => cell.routes = Some(routes),
                Err(e) => why.push(format!("routes.json: {e}")),
            },
        },
        Some(Ok(_)) => why.push("routes.json has no list of firings".into()),
        Some(Err(e)) => why.push(e),
        None => {}
    }
    let stream = ingressbench_results::stream::STREAM_FILES
        .into_iter()
        .find_map(|name| {
            optional(name).map(|v| {
                v.and_then(|v| {
                    serde_json::from_value::<ingressbench_results::stream::StreamFile>(v)
                        .map_err(|e| format!("{name}: {e}"))
                })
            })
        });
    match stream {
        Some(Ok(w)) => {
            let total = summary.requests.total.unwrap_or(0);
            let waiting = summary.outcome("waiting_at_end").unwrap_or(0);
            let (_, items) = w.kind.nouns();
            // Every message (event) due after the warm-up is in the summary once: sent or
            // never sent. Those still out at the end are its `waiting_at_end` (in results
            // written before that outcome, in none of its figures).
            if w.sent + w.unsent != total - waiting.min(total) + w.in_flight_at_end + w.warmup
                || (waiting > 0 && waiting != w.in_flight_at_end)
            {
                why.push(format!(
                    "{} counts {} {items} sent, {} never sent and {} out at the end, and the summary {total} ({waiting} waiting at the end): not this cell's",
                    w.kind.file_name(), w.sent, w.unsent, w.in_flight_at_end
                ));
            }
            // And every one sent ended in exactly one way.
            let ended = w.echoed + w.lost + w.in_flight_at_end;
            if ended != w.sent {
                why.push(format!(
                    "{} counts {} {items} sent and {ended} that ended ({} answered, {} lost, {} still out): {} {} in no outcome",
                    w.kind.file_name(), w.sent, w.echoed, w.lost, w.in_flight_at_end,
                    w.sent.abs_diff(ended),
                    if ended < w.sent { "sent and" } else { "ended and not sent," },
                ));
            }
            cell.websocket = Some(w);
        }
        Some(Err(e)) => why.push(e),
        None => {}
    }
    (cell.proxy_cpu, cell.proxy_memory) = usage_readings(cell, root, windows);
    match count_readings(cell, root, windows) {
        Ok(counts) => cell.proxy_counts = counts,
        Err(why) => cell.proxy_counts_unread = Some(why),
    }
    cell.summary = Some(summary);
    cell.set_unreadable(why);
}

/// The proxies' CPU over time, and their memory and processes, from a cell's
/// `usage.jsonl` (one reading a second; none when it is missing or unreadable: they are
/// charts, not figures a gate reads).
type ProxySeries = (Vec<(f64, f64)>, Vec<(f64, f64, f64)>);

fn usage_readings(cell: &CellResults, root: &Path, seconds: u64) -> ProxySeries {
    let Some(parts) = cell.file_parts("usage.jsonl") else {
        return (Vec::new(), Vec::new());
    };
    match files::Lines::open(root, &parts, seconds + 1)
        .map(|lines| lines.collect::<Result<Vec<_>, _>>())
    {
        Ok(Ok(lines)) => {
            let text = lines.join("\n");
            (cpu_rates(&text, "proxy"), memory(&text, "proxy"))
        }
        _ => (Vec::new(), Vec::new()),
    }
}

/// The resident memory and process count of the parts with `role`, together, at each
/// reading of a `usage.jsonl` (from the start of measurement on).
fn memory(usage_jsonl: &str, role: &str) -> Vec<(f64, f64, f64)> {
    (usage_jsonl.lines())
        .filter_map(|l| serde_json::from_str::<UsageReading>(l).ok())
        .filter(|r| r.t_s >= -1e-3)
        .map(|r| {
            let of_role = r.parts.iter().filter(|p| p.role == role);
            let (rss, processes) = of_role.fold((0.0, 0.0), |(b, n), p| {
                (b + p.rss_bytes as f64, n + p.processes as f64)
            });
            (r.t_s, rss, processes)
        })
        .collect()
}

/// A kind of count (its words) and its rate per second between readings, at each
/// interval's middle.
pub type CountRates = (&'static str, Vec<(f64, f64)>);

/// The counts a report charts from `proxy-metrics.jsonl`: their words, and the tool's
/// names summed into each (over every proxy).
const CHARTED_COUNTS: [(&str, &[&str]); 3] = [
    (
        "failed backend attempts",
        &["upstream_connect_failures", "upstream_response_errors"],
    ),
    ("retries", &["retries"]),
    ("5xx sent", &["responses_5xx"]),
];

/// `proxy-metrics.jsonl` read as [`CellResults::proxy_counts`] (a line a second; none
/// when the cell's proxies count nothing and it has no such file). A file that is there
/// and gives no reading (unreadable, empty, or no line of it JSON) is an error that says
/// so: the chart is not a figure a gate reads, but its absence is said, not silent.
fn count_readings(
    cell: &CellResults,
    root: &Path,
    seconds: u64,
) -> Result<Vec<CountRates>, String> {
    let Some(parts) = cell.file_parts("proxy-metrics.jsonl") else {
        return Ok(Vec::new());
    };
    if !files::exists_in(root, &parts) {
        return Ok(Vec::new());
    }
    let lines = files::Lines::open(root, &parts, seconds + 1)
        .and_then(|lines| lines.collect::<Result<Vec<_>, _>>())?;
    let readings: Vec<CountsReading> = lines
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    if readings.is_empty() {
        return Err(format!(
            "proxy-metrics.jsonl holds no reading ({} lines), so the proxies' counts are unread",
            lines.len()
        ));
    }
    Ok(CHARTED_COUNTS
        .iter()
        .filter_map(|(words, names)| Some((*words, count_rates(&readings, names)?)))
        .collect())
}

/// The rate per second of the sum of `names` over every proxy, between consecutive
/// readings, at each interval's middle; a count that fell started again (a reload), and
/// what it holds then is its increase. `None` when no proxy counts any of them.
fn count_rates(readings: &[CountsReading], names: &[&str]) -> Option<Vec<(f64, f64)>> {
    let mut counted = false;
    // Per reading: its time, and each proxy's count.
    let points: Vec<(f64, BTreeMap<String, u64>)> = readings
        .iter()
        .map(|r| {
            let by_proxy = (r.proxies.iter())
                .filter_map(|(proxy, c)| {
                    let values: Vec<u64> =
                        names.iter().filter_map(|n| c.get(*n).copied()).collect();
                    counted |= !values.is_empty();
                    (!values.is_empty()).then(|| (proxy.clone(), values.iter().sum()))
                })
                .collect();
            (r.t_s, by_proxy)
        })
        .collect();
    if !counted {
        return None;
    }
    Some(
        points
            .windows(2)
            .filter(|w| w[1].0 - w[0].0 >= 0.1)
            .map(|w| {
                let increase: u64 = (w[1].1.iter())
                    .map(|(proxy, now)| match w[0].1.get(proxy) {
                        Some(before) if now >= before => now - before,
                        Some(_) => *now,
                        None => 0,
                    })
                    .sum();
                ((w[0].0 + w[1].0) / 2.0, increase as f64 / (w[1].0 - w[0].0))
            })
            .collect(),
    )
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
fn recover_cell(cell: &mut CellResults, root: &Path, notes: &mut Vec<String>) {
    let Some(parts) = cell.file_parts("latency.hlog") else {
        return;
    };
    if !files::exists_in(root, &parts) {
        return;
    }
    // A cell cut short has no summary to bound its log by: a day of windows.
    const DAY: u64 = 86_400;
    let partial = files::read_in(
        root,
        &parts,
        DAY * HLOG_BYTES_PER_WINDOW,
        "a day of one-second windows",
    )
    .and_then(|bytes| {
        ingressbench_results::hlog::read_partial(&bytes).map_err(|e| format!("latency.hlog: {e}"))
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
    (cell.proxy_cpu, cell.proxy_memory) =
        usage_readings(cell, root, cell.windows.len() as u64 + 60);
}

/// The summary of a cell cut short, from its interval log: requests answered and their
/// latency from the histograms; every outcome, errors included, from the per-interval
/// counts (a log without them, from an older version, leaves errors unknown). Marked
/// `rebuilt_from` and `interrupted`, with a warning that says so. `None` without an
/// interval.
pub fn rebuild_summary(partial: &ingressbench_results::hlog::Partial) -> Option<CellSummary> {
    let last = partial.intervals.last()?;
    let mut latency = ingressbench_stats::HistogramUs::new();
    for i in &partial.intervals {
        latency.merge(&i.histogram);
    }
    let seconds = (last.start + last.length).as_secs_f64();
    let with_outcomes = partial.intervals_with_outcomes == partial.intervals.len();
    let o = &partial.outcomes;
    let (requests, outcomes) = if with_outcomes {
        let outcomes = (o.to_map().into_iter())
            .map(|(k, v)| (k, Value::from(v)))
            .collect();
        let requests = Requests {
            total: Some(o.total()),
            ok: Some(o.ok()),
            errors: Some(o.errors()),
        };
        (requests, Some(outcomes))
    } else {
        let requests = Requests {
            total: Some(latency.count()),
            ..Requests::default()
        };
        (requests, None)
    };
    let pct = |p: f64| Some(latency.value_at_percentile(p) as f64);
    let summary = CellSummary {
        rebuilt_from: Some("latency.hlog".into()),
        interrupted: true,
        duration_s: Some(seconds),
        requests,
        outcomes,
        latency_us: Latency {
            count: Some(latency.count()),
            mean: Some(latency.mean()),
            p50: pct(50.0),
            p90: pct(90.0),
            p99: pct(99.0),
            p999: pct(99.9),
            max: Some(latency.max() as f64),
        },
        warnings: vec![format!(
            "CUT SHORT, REBUILT FROM DISK: this cell's run ended before the cell did (killed, crashed, or stopped by a second Ctrl-C); its figures are rebuilt from the {} one-second windows of latency.hlog (the first {seconds:.0} s){}",
            partial.intervals.len(),
            if with_outcomes { "" } else { "; the log has no outcome counts (an older version wrote it), so errors are unknown" }
        )],
        ..CellSummary::default()
    };
    Some(summary.made())
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
        .filter_map(|l| serde_json::from_str::<UsageReading>(l).ok())
        .map(|r| (r.t_s, r.cpu_s(role)))
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

/// A single `load --json` output as a run of one cell (and the interval log of the same
/// stem beside it, when there is one, which must then be whole).
fn read_single(path: &Path) -> Result<RunResults, String> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let file = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let bytes = files::read_in(&dir, &[&file(path)], files::CELL_JSON_LIMIT, "a summary's")?;
    let not_summary = |e: String| {
        format!(
            "{}: not a `load --json` summary ({e}); give a results directory or a summary file",
            path.display()
        )
    };
    let summary: Value = serde_json::from_slice(&bytes).map_err(|e| not_summary(e.to_string()))?;
    let summary = CellSummary::read(summary).map_err(not_summary)?;
    let duration_s = summary.duration_s.unwrap_or(0.0);
    let mut notes = Vec::new();
    let mut unreadable = Vec::new();
    let hlog = path.with_extension("hlog");
    let (mut windows, mut log_start_unix_s) = (Vec::new(), None);
    if hlog.symlink_metadata().is_ok() {
        let seconds = seconds_allowed(duration_s, 0.0);
        match files::read_in(
            &dir,
            &[&file(&hlog)],
            seconds * HLOG_BYTES_PER_WINDOW,
            &format!("the {seconds} one-second windows of the run's duration"),
        )
        .and_then(|b| {
            let w = ingressbench_results::hlog::read(&b)
                .map_err(|e| format!("{}: {e}", hlog.display()))?;
            Ok((w, ingressbench_results::hlog::start_unix_s(&b)))
        }) {
            Ok((w, start)) => (windows, log_start_unix_s) = (w, start),
            Err(e) => {
                notes.push(e.clone());
                unreadable.push(e);
            }
        }
    }
    let name = path
        .file_stem()
        .map_or("load".into(), |s| s.to_string_lossy().into_owned());
    let record = RunRecord {
        scenario: name,
        status: if summary.interrupted {
            "incomplete"
        } else {
            "complete"
        }
        .to_owned(),
        tool_version: summary.tool_version.clone(),
        ..RunRecord::default()
    };
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
            target: summary.target.clone().unwrap_or_else(|| "target".into()),
            settings: Vec::new(),
            status: "done".into(),
            dir: None,
            dir_name: None,
            summary: unreadable.is_empty().then_some(summary),
            unreadable,
            proxy_version: None,
            windows,
            log_start_unix_s,
            impact: Vec::new(),
            routes: None,
            websocket: None,
            measure_from_s: 0.0,
            usage: None,
            proxy_cpu: Vec::new(),
            proxy_memory: Vec::new(),
            soak: None,
            proxy_counts: Vec::new(),
            proxy_counts_unread: None,
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
    /// Whether the random sample chose it; a failed request is kept whatever the
    /// sample rate (files written before that was so hold only chosen ones).
    pub in_sample: bool,
}

/// Reads a `samples.csv` or `samples.csv.gz` file (docs/RESULTS.md), `root/parts…`, in
/// file order, refusing one of more than `max_rows` rows (the requests its cell sent).
pub fn read_samples(root: &Path, parts: &[&str], max_rows: u64) -> Result<Vec<SampleRow>, String> {
    let mut rows = Vec::new();
    let mut lines = files::Lines::open(root, parts, max_rows.saturating_add(1))?;
    // Files written before the generation columns existed end at connection_reused,
    // before every failure was kept at sidecar_generation.
    let header = lines.next().transpose()?.unwrap_or_default();
    let after_backend = if header.ends_with("in_sample") {
        4
    } else if header.ends_with("sidecar_generation") {
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
            // By the outcome: an HTTP status below 400, or a gRPC call answered OK.
            ok: ingressbench_stats::Outcome::from_name(f[11]).is_some_and(|o| o.is_ok()),
            outcome: f[11].to_owned(),
            backend,
            generations: [generation(2), generation(3)],
            in_sample: after_backend < 4 || tail.get(4) == Some(&"1"),
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_of_every_column_set_read_alike() {
        let dir = std::env::temp_dir().join(format!("ib-samples-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let row = "1.000000,1.000200,0.005200,0.000100,0,0.0001,0,0.0001,0.0036,0.005,850,200,200,\"b,\"\"x\"\"\",0";
        // Before the generation columns, before `in_sample`, and now (a failure kept
        // outside the random sample).
        let old = dir.join("old.csv");
        let header = ingressbench_results::samples::HEADER
            .replace(",generation,sidecar_generation,in_sample", "");
        std::fs::write(&old, format!("{header}\n{row}\n")).unwrap();
        let mid = dir.join("mid.csv");
        let header = ingressbench_results::samples::HEADER.replace(",in_sample", "");
        std::fs::write(&mid, format!("{header}\n{row},4,\n")).unwrap();
        let new = dir.join("new.csv");
        std::fs::write(
            &new,
            format!("{}\n{row},4,,0\n", ingressbench_results::samples::HEADER),
        )
        .unwrap();
        let read = |name: &str| read_samples(&dir, &[name], 10).unwrap();
        let (old, mid, new) = (read("old.csv"), read("mid.csv"), read("new.csv"));
        let _ = std::fs::remove_dir_all(&dir);
        for rows in [&old, &mid, &new] {
            assert_eq!(rows[0].backend, "b,\"x\"");
            assert!(rows[0].ok && (rows[0].latency_s - 0.0052).abs() < 1e-9);
        }
        assert_eq!(old[0].generations, [0, 0]);
        assert_eq!(mid[0].generations, [4, 0]);
        assert_eq!(new[0].generations, [4, 0]);
        assert!(old[0].in_sample && mid[0].in_sample && !new[0].in_sample);
    }

    #[test]
    fn count_rates_sum_the_proxies_and_take_a_fall_as_a_new_start() {
        let readings: Vec<CountsReading> = [
            r#"{"t_s":0.0,"proxies":{"a":{"upstream_connect_failures":0,"upstream_response_errors":0},"b":{"upstream_connect_failures":5}}}"#,
            r#"{"t_s":1.0,"proxies":{"a":{"upstream_connect_failures":3,"upstream_response_errors":1},"b":{"upstream_connect_failures":6}}}"#,
            r#"{"t_s":2.0,"proxies":{"a":{"upstream_connect_failures":2,"upstream_response_errors":1},"b":{"upstream_connect_failures":6}}}"#,
        ]
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
        let failed = count_rates(&readings, CHARTED_COUNTS[0].1).unwrap();
        // 4 + 1 in the first second; then a's count fell (a new start: 3 since), b's stayed.
        assert_eq!(failed, vec![(0.5, 5.0), (1.5, 3.0)]);
        assert!(
            count_rates(&readings, &["retries"]).is_none(),
            "nobody counts it"
        );
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
