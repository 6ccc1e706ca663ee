//! A soak (`soak:` in a scenario, `run --soak DURATION`): the load runs for hours while
//! the cell's timeline of timed events repeats every `period` (the load's `duration`
//! unless said), so that what grows with time or with each firing (a proxy's memory, its
//! old processes, the errors per reload) shows as a slope.
//!
//! What a soak keeps is bounded: the interval log, the side figures and every event's
//! record for the whole run, the sampled requests in the windows the events' impact reads
//! (5 s before each firing, 15 s after it) and a uniform reservoir of the rest
//! ([`ingressbench_load::kept`]). Before anything starts, [`check`] estimates what the
//! results directory will take and refuses a soak whose estimate exceeds its budget,
//! with the arithmetic. While it runs, [`SoakLog`] writes down the tool's own cost and
//! the directory's size every `every` (soak.jsonl).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_lab::usage::PartUsage;
use ingressbench_lab::usage::{Part, UsageReader};
use ingressbench_load::kept::{Kept, KeptCounts, KeptHandle};
use ingressbench_results::impact::ImpactEntry;
use ingressbench_results::site::Slope;
use ingressbench_results::soak::{
    ExtraProcesses, SoakEvents, SoakLine, SoakPart, SoakRecord, ToolCost, MAX_STRETCHES,
};

use crate::load::{dur, scaled};
use crate::model::{LoadModeFile, Timing};
use crate::Cell;

/// Sampled requests kept before each firing: the impact's "p99 in the 5 s before".
pub(crate) const KEPT_BEFORE: Duration = Duration::from_secs(5);
/// And after it (after its propagation delay): the impact's window, at most 15 s.
pub(crate) const KEPT_AFTER: Duration = Duration::from_secs(15);
/// Kept samples beyond this many in a cell are refused: the events' impact reads them
/// into memory when the cell ends.
const MAX_KEPT_SAMPLES: f64 = 5_000_000.0;

/// The default `reservoir`, `budget` and `every`.
const RESERVOIR: usize = 20_000;
const BUDGET: u64 = 1_000_000_000;
const EVERY: Duration = Duration::from_secs(60);

/// What the estimate takes each written thing to weigh, measured on this tool's files
/// (docs/RESULTS.md, "Soaks"): a gzip-compressed sample row 16 bytes at 5,000 req/s and
/// 23.5 at 40 a second; an interval-log line 235 bytes a second at 200 req/s and 600 at
/// 5,000 (1,000 taken); a usage.jsonl part 95-110 bytes a reading; a proxy-metrics.jsonl
/// line 120-160 bytes; an event's impact.json entry about 2,100 bytes, its events.jsonl
/// lines 300 and nginx's log lines for a reload 900 (4,000 taken); a cell's summary,
/// percentiles and run.json entry about 16 kB (50 taken), and the report about 200 kB
/// (1 MB taken).
const SAMPLE_BYTES: f64 = 24.0;
const HLOG_BYTES_PER_S: f64 = 1_000.0;
const USAGE_BYTES_PER_PART_S: f64 = 110.0;
const METRICS_BYTES_PER_S: f64 = 200.0;
const FIRING_BYTES: f64 = 4_000.0;
const LOG_LINE_BYTES: f64 = 400.0;
const CELL_BYTES: f64 = 50_000.0;
const REPORT_BYTES: f64 = 1_000_000.0;

/// A cell's soak, its times scaled as the run's.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Soak {
    /// How long the load runs.
    pub(crate) duration: Duration,
    /// The timeline's length.
    pub(crate) period: Duration,
    /// Samples kept from outside the events' windows.
    pub(crate) reservoir: usize,
    /// The most the results directory may take.
    pub(crate) budget: u64,
    /// How often the tool's own cost is written down.
    pub(crate) every: Duration,
    /// Where in the soak's time this run starts (a resumed soak's).
    pub(crate) from: Duration,
}

impl Soak {
    /// The cell's soak, if it has one, scaled by `factor` (`--quick`).
    pub(crate) fn of(cell: &Cell, factor: f64) -> Result<Option<Self>, String> {
        let Some(file) = &cell.scenario.soak else {
            return Ok(None);
        };
        if cell.scenario.load.requests.is_some() {
            return Err("load.requests: a soak's load runs for soak.duration, not a number of requests; drop load.requests (and give soak.period)".into());
        }
        let duration = dur("soak.duration", &Some(file.duration.clone()))?
            .ok_or("soak.duration: give how long the load runs (1h)")?;
        let period = match dur("soak.period", &file.period)? {
            Some(p) => p,
            None => dur("load.duration", &cell.scenario.load.duration)?
                .ok_or("soak: give soak.period (how often the events repeat), or load.duration")?,
        };
        if period.is_zero() {
            return Err("soak.period: 0 s would repeat the events without end; give a period of at least 1s".into());
        }
        if duration < period {
            return Err(format!(
                "soak.duration {duration:?} is shorter than one period of the events ({period:?}); make the soak longer or the period shorter"
            ));
        }
        let from = dur("soak.from", &file.from)?.unwrap_or_default();
        if from >= duration {
            return Err(format!(
                "soak.from {from:?} is not before the soak's end ({duration:?}): nothing would be left to run"
            ));
        }
        let budget = match &file.budget {
            Some(b) => bytes(b).map_err(|e| format!("soak.budget: {e}"))?,
            None => BUDGET,
        };
        Ok(Some(Self {
            duration: scaled(duration, factor),
            period: scaled(period, factor),
            reservoir: file.reservoir.unwrap_or(RESERVOIR),
            budget,
            every: dur("soak.every", &file.every)?
                .unwrap_or(EVERY)
                .max(Duration::from_secs(1)),
            from: scaled(from, factor),
        }))
    }

    /// How long this run's load goes: the soak from `from` to its end.
    pub(crate) fn length(&self) -> Duration {
        self.duration.saturating_sub(self.from)
    }

    /// The timed firings (offset from the start of measurement, event, propagation
    /// delay) of one period, repeated while they fall within the soak; from `from` on,
    /// in phase, as offsets from this run's start.
    pub(crate) fn repeat(
        &self,
        period: &[(Duration, usize, Duration)],
    ) -> Vec<(Duration, usize, Duration)> {
        let mut out = Vec::new();
        // The round `from` falls in.
        let mut round = self.period * (self.from.as_nanos() / self.period.as_nanos()) as u32;
        while round < self.duration {
            out.extend(
                period
                    .iter()
                    .map(|&(at, i, delay)| (round + at, i, delay))
                    .filter(|f| f.0 >= self.from && f.0 < self.duration)
                    .map(|(at, i, delay)| (at - self.from, i, delay)),
            );
            round += self.period;
        }
        out
    }

    /// The samples' filter: every sample within [`KEPT_BEFORE`] of a firing and
    /// [`KEPT_AFTER`] after it (and its delay), times in nanoseconds from the load's
    /// start (`warmup` before measurement), and a reservoir written to `path`.
    pub(crate) fn kept(
        &self,
        firings: &[(Duration, usize, Duration)],
        warmup: Duration,
        path: &Path,
    ) -> Kept {
        let windows = firings
            .iter()
            .map(|&(at, _, delay)| {
                let at = warmup + at;
                (
                    at.saturating_sub(KEPT_BEFORE).as_nanos() as u64,
                    (at + delay + KEPT_AFTER).as_nanos() as u64,
                )
            })
            .collect();
        Kept::new(windows, self.reservoir, path, self.every)
    }
}

/// `500MB`, `1GB`, `2GiB`: bytes.
fn bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size; write 500MB or 2GB"))?;
    let scale = match unit.trim() {
        "B" => 1.0,
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0f64.powi(4),
        _ => {
            return Err(format!(
                "`{text}`: the unit is one of B, kB, MB, GB, TB, KiB, MiB, GiB, TiB"
            ))
        }
    };
    Ok((n * scale) as u64)
}

/// What a soak cell's results directory is estimated to take: each part, in words, and
/// its bytes.
pub(crate) fn estimate(cell: &Cell, soak: &Soak) -> Result<Vec<(String, f64)>, String> {
    let l = &cell.scenario.load;
    let rate = match (l.mode, l.rate) {
        (LoadModeFile::Open, Some(rate)) => rate,
        _ => return Err("soak: a soak holds its results to a budget from the load's rate; give open-loop load a load.rate".into()),
    };
    let seconds = soak.length().as_secs_f64();
    let firings = soak.repeat(&period_firings(cell)?);
    // The seconds the windows cover, overlaps counted once.
    let mut windows: Vec<(f64, f64)> = firings
        .iter()
        .map(|&(at, _, delay)| {
            let at = at.as_secs_f64();
            (
                (at - KEPT_BEFORE.as_secs_f64()).max(0.0),
                (at + (delay + KEPT_AFTER).as_secs_f64()).min(seconds),
            )
        })
        .collect();
    windows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut covered = 0.0;
    let mut reach = f64::MIN;
    for (from, to) in windows {
        let from = from.max(reach);
        if to > from {
            covered += to - from;
        }
        reach = reach.max(to);
    }
    let samples = rate * l.sample_rate * covered;
    if samples > MAX_KEPT_SAMPLES {
        return Err(format!(
            "soak: {} sampled requests would be kept around the events ({rate} req/s x load.sample_rate {} x {covered:.0} s of windows), over the {} a cell's impact can read; lower load.sample_rate to {:.4} or less",
            samples.round(),
            l.sample_rate,
            MAX_KEPT_SAMPLES,
            MAX_KEPT_SAMPLES / (rate * covered)
        ));
    }
    let parts = parts_of(cell) as f64;
    Ok(vec![
        (
            format!("interval log: {seconds:.0} s x {HLOG_BYTES_PER_S:.0} B"),
            seconds * HLOG_BYTES_PER_S,
        ),
        (
            format!(
                "samples around the events: {rate} req/s x load.sample_rate {} x {covered:.0} s x {SAMPLE_BYTES:.0} B",
                l.sample_rate
            ),
            samples * SAMPLE_BYTES,
        ),
        (
            format!(
                "the reservoir: {} samples x {SAMPLE_BYTES:.0} B",
                soak.reservoir
            ),
            soak.reservoir as f64 * SAMPLE_BYTES,
        ),
        (
            format!(
                "usage.jsonl: {seconds:.0} s x {parts:.0} parts x {USAGE_BYTES_PER_PART_S:.0} B"
            ),
            seconds * parts * USAGE_BYTES_PER_PART_S,
        ),
        (
            format!("proxy-metrics.jsonl: {seconds:.0} s x {METRICS_BYTES_PER_S:.0} B"),
            seconds * METRICS_BYTES_PER_S,
        ),
        (
            format!(
                "events: {} firings x {FIRING_BYTES:.0} B",
                firings.len()
            ),
            firings.len() as f64 * FIRING_BYTES,
        ),
        (
            format!(
                "soak.jsonl: {:.0} lines x {LOG_LINE_BYTES:.0} B",
                (seconds / soak.every.as_secs_f64()).ceil()
            ),
            (seconds / soak.every.as_secs_f64()).ceil() * LOG_LINE_BYTES,
        ),
        (
            format!("the cell's summary and percentiles: {CELL_BYTES:.0} B"),
            CELL_BYTES,
        ),
    ])
}

/// The parts of a cell's site that usage.jsonl reads once a second: the proxy (and each
/// replica, the front, a sidecar), the backends and the client.
fn parts_of(cell: &Cell) -> usize {
    let backends: usize = cell.scenario.backends.iter().map(|p| p.replicas).sum();
    let proxies = match &cell.target {
        crate::Target::Proxy { front, hop, .. } => {
            front.as_ref().map_or(1, |f| f.replicas + 1) + usize::from(hop.is_some())
        }
        _ => 1,
    };
    backends + proxies + 1
}

/// One period's timed firings, as the timeline makes them (unscaled).
fn period_firings(cell: &Cell) -> Result<Vec<(Duration, usize, Duration)>, String> {
    let mut out = Vec::new();
    for (i, e) in cell.events.iter().enumerate() {
        let delay = e.propagation_delay.unwrap_or_default();
        match e.timing {
            Timing::At(at) => out.push((at, i, delay)),
            Timing::Every {
                first,
                every,
                times,
            } => out.extend((0..times).map(|k| (first + every * k, i, delay))),
            Timing::BeforeRequest { .. } => {}
        }
    }
    Ok(out)
}

/// A scenario's soaks in a line (`scenario check` and `run` say it before anything
/// starts): how long each cell's load runs, how often its events repeat, and what its
/// results are estimated to take against the budget. None without a soak.
pub fn plan(cells: &[Cell]) -> Option<String> {
    let soak = cells.iter().find_map(|c| Soak::of(c, 1.0).ok().flatten())?;
    let firings: usize = (cells.iter())
        .filter_map(|c| Some(soak.repeat(&period_firings(c).ok()?).len()))
        .max()
        .unwrap_or(0);
    let total = check(cells).ok().flatten().unwrap_or_default();
    Some(format!(
        "soak: each cell's load runs {:?} with its events repeated every {:?} (up to {firings} firings a cell); the results about {} of the soak.budget {}",
        soak.duration,
        soak.period,
        megabytes(total),
        megabytes(soak.budget as f64)
    ))
}

/// What a scenario's soaks are refused for, before anything starts: events that cannot
/// repeat, a soak beside a capacity search, and results over the budget (the sum of
/// every cell's estimate, with the arithmetic). Their estimate, if there is a soak.
pub(crate) fn check(cells: &[Cell]) -> Result<Option<f64>, String> {
    let mut total = 0.0;
    let mut lines = Vec::new();
    let mut budget = None;
    for cell in cells {
        let Some(soak) = Soak::of(cell, 1.0)? else {
            continue;
        };
        if cell.scenario.search.is_some() {
            return Err("soak: a soak and a capacity search cannot share a cell: the search chooses each trial's length".into());
        }
        for (i, e) in cell.events.iter().enumerate() {
            let last = match e.timing {
                Timing::At(at) => at,
                Timing::Every {
                    first,
                    every,
                    times,
                } => first + every * times.saturating_sub(1),
                Timing::BeforeRequest { .. } => {
                    return Err(format!(
                        "events[{i}]: before_request fires in lock-step with requests, which a soak does not count; give the event a time (`at` or `every`)"
                    ))
                }
            };
            if last >= soak.period {
                return Err(format!(
                    "events[{i}]: fires at {last:?}, past the soak's period ({:?}), so it would not repeat with the others; make it earlier or soak.period longer",
                    soak.period
                ));
            }
        }
        let parts = estimate(cell, &soak)
            .map_err(|e| format!("cell {} ({}): {e}", cell.index, cell.label()))?;
        let cell_total: f64 = parts.iter().map(|p| p.1).sum();
        total += cell_total;
        lines.push(format!(
            "  cell {} ({}): {}\n{}",
            cell.index,
            cell.label(),
            megabytes(cell_total),
            parts
                .iter()
                .map(|(what, b)| format!("    {what} = {}", megabytes(*b)))
                .collect::<Vec<_>>()
                .join("\n")
        ));
        budget = Some(soak.budget);
    }
    if budget.is_some() {
        total += REPORT_BYTES;
        lines.push(format!("  the report: {}", megabytes(REPORT_BYTES)));
    }
    match budget {
        None => Ok(None),
        Some(budget) if total > budget as f64 => Err(format!(
            "soak: the results would take about {}, over soak.budget ({}):\n{}\nshorten soak.duration, lower load.sample_rate or the reservoir, or raise soak.budget",
            megabytes(total),
            megabytes(budget as f64),
            lines.join("\n")
        )),
        Some(_) => Ok(Some(total)),
    }
}

/// `12.3 MB`, `4.0 kB`, `1.2 GB`.
fn megabytes(bytes: f64) -> String {
    match bytes {
        b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        b => format!("{:.1} kB", b / 1e3),
    }
}

/// soak.jsonl: every `every`, what the tool itself spends (its memory, CPU per 1,000
/// requests, open descriptors), the results directory's size and what the samples'
/// filter kept. A line that cannot be written is left out; the cell goes on.
pub(crate) struct SoakLog {
    file: std::fs::File,
    every: Duration,
    measure_from: Instant,
    /// Where in the soak this run started.
    from: Duration,
    last: Option<(Instant, f64, u64)>,
    results: std::path::PathBuf,
    /// Every line written (one a minute: 1,440 a day).
    pub(crate) lines: Vec<SoakLine>,
}

impl SoakLog {
    /// The log at `path`, written every `every` from `measure_from`; `results` is the run's
    /// directory, whose size each line gives.
    pub(crate) fn new(
        path: &Path,
        (every, from): (Duration, Duration),
        measure_from: Instant,
        results: &Path,
    ) -> std::io::Result<Self> {
        // The first line's CPU per request counts from here.
        let me = UsageReader::new().read(&[Part::process("tool", "client", std::process::id())]);
        Ok(Self {
            file: std::fs::File::create(path)?,
            every,
            measure_from,
            from,
            last: me.first().map(|me| (Instant::now(), me.cpu_s, 0)),
            results: results.to_owned(),
            lines: Vec::new(),
        })
    }

    /// At `now`, if a line is due (every `every` from the start of measurement): writes
    /// it, with the load's `requests` so far, the events' `firings` and the samples'
    /// filter's counts.
    pub(crate) fn watch(
        &mut self,
        now: Instant,
        requests: u64,
        firings: u64,
        kept: Option<KeptCounts>,
    ) {
        let due = match self.last {
            Some((at, _, _)) if at > self.measure_from => now.duration_since(at) >= self.every,
            _ => now >= self.measure_from + self.every,
        };
        if due {
            self.write(now, requests, firings, kept);
        }
    }

    /// Writes a line now.
    pub(crate) fn write(
        &mut self,
        now: Instant,
        requests: u64,
        firings: u64,
        kept: Option<KeptCounts>,
    ) {
        use std::io::Write;
        let me = UsageReader::new().read(&[Part::process("tool", "client", std::process::id())]);
        let Some(me) = me.first() else { return };
        let per_1000 = self.last.and_then(|(_, cpu_s, before)| {
            let n = requests.checked_sub(before).filter(|n| *n > 0)?;
            Some(((me.cpu_s - cpu_s) * 1e6 / n as f64 * 100.0).round() / 100.0)
        });
        let kept = kept.unwrap_or_default();
        let t_s = (crate::usage::signed_offset(now, self.measure_from) * 1e3).round() / 1e3;
        let line = SoakLine {
            t_s,
            soak_t_s: t_s + self.from.as_secs_f64(),
            requests,
            rss_bytes: me.rss_bytes,
            cpu_s: me.cpu_s,
            cpu_ms_per_1000_requests: per_1000,
            fds: me.fds,
            results_bytes: size_of(&self.results),
            firings,
            outside_windows_seen: kept.seen,
            outside_windows_kept: kept.kept,
        };
        self.last = Some((now, me.cpu_s, requests));
        let text = serde_json::to_string(&line).unwrap_or_default();
        let _ = writeln!(self.file, "{text}").and_then(|()| self.file.flush());
        self.lines.push(line);
    }
}

/// The bytes of the regular files under `dir` (links not followed), at most four levels
/// down: a run's directory, its cells and their `proxy/` files.
fn size_of(dir: &Path) -> u64 {
    fn walk(dir: &Path, depth: u32) -> u64 {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return 0;
        };
        entries
            .flatten()
            .map(|e| match e.file_type() {
                Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
                Ok(t) if t.is_dir() && depth > 0 => walk(&e.path(), depth - 1),
                _ => 0,
            })
            .sum()
    }
    walk(dir, 4)
}

/// A soak cell resumed after an attempt that stopped (`run --resume`): the cell with
/// `soak.from` at where the last attempt's soak.jsonl says it had got to (at most a line's
/// `every` lost), and that time in seconds; none for a cell without a soak, or an attempt
/// that stopped before its first line. `factor`: the run's `--quick` scale.
pub(crate) fn resumed(
    results: &Path,
    cell: &Cell,
    attempts: &[ingressbench_results::run::EarlierAttempt],
    factor: f64,
) -> Option<(Cell, f64)> {
    let whole = Soak::of(cell, factor).ok()??;
    let dir = attempts.last()?.dir.as_deref()?;
    // No link followed, and a day of lines at most.
    let bytes = ingressbench_report::files::read_in(
        results,
        &["cells", dir, "soak.jsonl"],
        86_400 * 1024,
        "a day of soak.jsonl lines",
    )
    .ok()?;
    let from_s = (String::from_utf8_lossy(&bytes).lines())
        .filter_map(|l| serde_json::from_str::<SoakLine>(l).ok())
        .map(|l| l.soak_t_s)
        .fold(0.0, f64::max);
    if from_s <= 0.0 {
        return None;
    }
    // An attempt that had all but finished runs the soak's last second.
    let from_s = from_s.min(whole.duration.as_secs_f64() - 1.0).max(0.0);
    let mut resumed = cell.clone();
    let soak = resumed.scenario.soak.as_mut()?;
    soak.from = Some(format!("{:.3}s", from_s / factor.max(1e-9)));
    Soak::of(&resumed, factor).ok()??;
    Some((resumed, from_s))
}

/// What a soak cell's driver holds beside the load: the samples' filter (held by the load
/// thread) as seen from here, the load's request count, and soak.jsonl.
pub(crate) struct SoakRun {
    /// The cell's soak.
    pub(crate) soak: Soak,
    pub(crate) kept: KeptHandle,
    pub(crate) requests: Arc<AtomicU64>,
    /// When the load started: samples' times count from it.
    pub(crate) start: Instant,
    pub(crate) log: Option<SoakLog>,
}

impl SoakRun {
    /// An event fired now: the samples of the impact's window after it are kept, even if
    /// it fired later than planned.
    pub(crate) fn fired(&self, now: Instant) {
        let until = now.saturating_duration_since(self.start) + KEPT_AFTER;
        self.kept.keep_until(until.as_nanos() as u64);
    }

    /// At `now`, writes soak.jsonl's line if one is due; `firings`: events fired so far.
    pub(crate) fn watch(&mut self, now: Instant, firings: u64) {
        let requests = self.requests.load(Ordering::Relaxed);
        let counts = self.kept.counts();
        if let Some(log) = self.log.as_mut() {
            log.watch(now, requests, firings, Some(counts));
        }
    }

    /// Writes the last line, as the load ends.
    pub(crate) fn finish(&mut self, firings: u64) {
        let requests = self.requests.load(Ordering::Relaxed);
        let counts = self.kept.counts();
        if let Some(log) = self.log.as_mut() {
            log.write(Instant::now(), requests, firings, Some(counts));
        }
    }
}

/// A slope with its interval, rounded to `digits` decimals, scaled by `scale`; none
/// with too few points to say.
fn slope(points: &[(f64, f64)], scale: f64, digits: i32) -> Option<Slope> {
    let e = ingressbench_stats::growth::growth(points)?;
    let r = |v: f64| (v * scale * 10f64.powi(digits)).round() / 10f64.powi(digits);
    Some(Slope {
        value: r(e.value),
        low: r(e.low),
        high: r(e.high),
    })
}

/// What grew over a soak: per part, its memory against events fired and against time,
/// its descriptors, its processes beyond its count at the start and for how long; per kind of
/// event, its errors and p99 against the firing's number; the tool's own cost.
pub(crate) fn record(
    cell: &Cell,
    run: &SoakRun,
    (usage, rate): (Option<&crate::usage::UsageLog>, f64),
    impact: &[ImpactEntry],
) -> SoakRecord {
    let soak = &run.soak;
    let firing_times: Vec<f64> = impact.iter().map(|e| e.requested_s).collect();
    let fired_by = |t: f64| firing_times.partition_point(|&f| f <= t) as f64;
    let readings = usage.map_or(&[][..], |u| u.readings());
    let measured: Vec<_> = readings.iter().filter(|r| r.t_s >= -1e-3).collect();
    let mut parts = Vec::new();
    if let Some(first) = measured.first() {
        for p in first.parts.iter().filter(|p| p.role != "client") {
            let series: Vec<(f64, &PartUsage)> = (measured.iter())
                .filter_map(|r| Some((r.t_s, r.parts.iter().find(|q| q.name == p.name)?)))
                .collect();
            let rss_firings: Vec<(f64, f64)> = (series.iter())
                .map(|(t, u)| (fired_by(*t), u.rss_bytes as f64))
                .collect();
            let rss_time: Vec<(f64, f64)> = (series.iter())
                .map(|(t, u)| (t / 60.0, u.rss_bytes as f64))
                .collect();
            let fds: Vec<(f64, f64)> = (series.iter())
                .filter_map(|(t, u)| Some((t / 60.0, u.fds? as f64)))
                .collect();
            // Cores in each interval between readings, at its middle; at a steady rate of
            // `rate` requests a second their slope is CPU per request's, in ms per 1,000.
            let cores: Vec<(f64, f64)> = (series.windows(2))
                .filter(|w| w[1].0 - w[0].0 >= 0.1)
                .map(|w| {
                    let spent = (w[1].1.cpu_s - w[0].1.cpu_s).max(0.0);
                    ((w[0].0 + w[1].0) / 120.0, spent / (w[1].0 - w[0].0))
                })
                .collect();
            let per_1000 = if rate > 0.0 { 1e6 / rate } else { 0.0 };
            let counts: Vec<(f64, u32)> = series.iter().map(|(t, u)| (*t, u.processes)).collect();
            let (at_start, stretches) = extra_processes(&counts);
            parts.push(SoakPart {
                name: p.name.clone(),
                role: p.role.to_owned(),
                rss_bytes_per_100_firings: slope(&rss_firings, 100.0, 0),
                rss_bytes_per_min: slope(&rss_time, 1.0, 0),
                fds_per_min: slope(&fds, 1.0, 3),
                cpu_ms_per_1000_per_min: (per_1000 > 0.0)
                    .then(|| slope(&cores, per_1000, 3))
                    .flatten(),
                rss_first_bytes: series.first().map_or(0, |s| s.1.rss_bytes),
                rss_last_bytes: series.last().map_or(0, |s| s.1.rss_bytes),
                processes_at_start: at_start,
                processes_max: counts.iter().map(|c| c.1).max().unwrap_or(0),
                extra_stretches: stretches.len() as u64,
                extra_longest_s: stretches
                    .iter()
                    .map(|s| s.to_s - s.from_s)
                    .fold(0.0, f64::max),
                extra_processes: stretches.into_iter().take(MAX_STRETCHES).collect(),
            });
        }
    }
    let mut kinds: Vec<String> = Vec::new();
    for e in impact {
        let kind = e.what.split_whitespace().next().unwrap_or("").to_owned();
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    let events = kinds
        .into_iter()
        .map(|kind| {
            let mine: Vec<&ImpactEntry> = (impact.iter())
                .filter(|e| e.what.split_whitespace().next() == Some(kind.as_str()))
                .collect();
            let errors: Vec<(f64, f64)> = (mine.iter().enumerate())
                .filter_map(|(i, e)| Some((i as f64, e.requests.errors? as f64)))
                .collect();
            let p99: Vec<(f64, f64)> = (mine.iter().enumerate())
                .filter_map(|(i, e)| Some((i as f64, e.requests.p99_ms_5s_after?)))
                .collect();
            SoakEvents {
                firings: mine.len() as u64,
                errors: errors.iter().map(|e| e.1 as u64).sum(),
                errors_per_100_firings: slope(&errors, 100.0, 1),
                p99_after_ms_per_100_firings: slope(&p99, 100.0, 3),
                kind,
            }
        })
        .collect();
    let lines = run.log.as_ref().map_or(&[][..], |l| &l.lines[..]);
    let tool = match (lines.first(), lines.last()) {
        (Some(first), Some(last)) => {
            let rss: Vec<(f64, f64)> = (lines.iter())
                .map(|l| (l.t_s / 60.0, l.rss_bytes as f64))
                .collect();
            Some(ToolCost {
                rss_first_bytes: first.rss_bytes,
                rss_last_bytes: last.rss_bytes,
                rss_bytes_per_min: slope(&rss, 1.0, 0),
                cpu_ms_per_1000_first: first.cpu_ms_per_1000_requests,
                cpu_ms_per_1000_last: last.cpu_ms_per_1000_requests,
                fds_first: first.fds,
                fds_last: last.fds,
                results_bytes: last.results_bytes,
            })
        }
        _ => None,
    };
    let counts = run.kept.counts();
    let estimate = estimate(cell, soak).map_or(0.0, |parts| parts.iter().map(|p| p.1).sum());
    let estimate = estimate + REPORT_BYTES;
    SoakRecord {
        duration_s: soak.duration.as_secs_f64(),
        period_s: soak.period.as_secs_f64(),
        from_s: soak.from.as_secs_f64(),
        firings: impact.len() as u64,
        parts,
        events,
        tool,
        outside_windows_seen: counts.seen,
        outside_windows_kept: counts.kept,
        estimate_bytes: estimate as u64,
        budget_bytes: soak.budget,
    }
}

/// The process count a part had at its first reading (before any event), and each
/// stretch of readings (`t_s`, count) with more than that: old generations a reload or
/// an upgrade left alive (the count most often seen would miss an old process that
/// outlives most of the run).
fn extra_processes(counts: &[(f64, u32)]) -> (u32, Vec<ExtraProcesses>) {
    let at_start = counts.first().map_or(0, |c| c.1);
    let mut stretches = Vec::new();
    let mut open: Option<ExtraProcesses> = None;
    for &(t, n) in counts {
        match (&mut open, n > at_start) {
            (Some(s), true) => s.extra = s.extra.max(n - at_start),
            (None, true) => {
                open = Some(ExtraProcesses {
                    from_s: t,
                    to_s: t,
                    extra: n - at_start,
                })
            }
            (Some(_), false) => {
                if let Some(mut s) = open.take() {
                    s.to_s = t;
                    stretches.push(s);
                }
            }
            (None, false) => {}
        }
    }
    if let Some(mut s) = open {
        s.to_s = counts.last().map_or(s.from_s, |c| c.0);
        stretches.push(s);
    }
    (at_start, stretches)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOAK: &str = "name: s\ntargets: [nginx]\nbackends: [{ name: echo, replicas: 2 }]\nload: { rate: 1000, duration: 10s, sample_rate: 0.01 }\nevents:\n  - { at: 2s, reload: true }\n  - { at: 7s, scale: 3 }\nsoak: { duration: 25s }\n";

    fn cells(text: &str, sets: &[(&str, &str)]) -> Result<Vec<Cell>, String> {
        let sets: Vec<(String, String)> = (sets.iter())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        crate::expand(text, Path::new("s.yaml"), &sets, false).map_err(|e| e.to_string())
    }

    #[test]
    fn a_soak_repeats_the_timeline_every_period_while_it_lasts() {
        let cells = cells(SOAK, &[]).unwrap();
        let timeline = crate::timeline::Timeline::of(&cells[0], 1.0).unwrap();
        let at: Vec<(u64, usize)> = (timeline.firings().iter())
            .map(|f| (f.0.as_secs(), f.1))
            .collect();
        assert_eq!(at, [(2, 0), (7, 1), (12, 0), (17, 1), (22, 0)]);
        assert_eq!((timeline.planned(0), timeline.planned(1)), (3, 2));
        // The load runs for the soak, not the period.
        let plan = crate::load::plan_for(&cells[0], "http://127.0.0.1/", None, 1.0).unwrap();
        assert_eq!(
            plan.length,
            ingressbench_load::Length::Duration(Duration::from_secs(25))
        );
        // `run --soak 1h` is `soak.duration` set: on a file without `soak`, the period is
        // the load's duration.
        let plain = SOAK.replace("soak: { duration: 25s }\n", "");
        let cells = super::tests::cells(&plain, &[("soak.duration", "1h")]).unwrap();
        let soak = Soak::of(&cells[0], 1.0).unwrap().unwrap();
        assert_eq!(
            (soak.duration, soak.period),
            (Duration::from_secs(3600), Duration::from_secs(10))
        );
        assert_eq!(crate::runner::planned(&cells[0]), Duration::from_secs(3602));
    }

    #[test]
    fn a_soak_from_a_later_time_goes_on_in_phase_for_the_rest() {
        // Firings at 2 s and 7 s of every 10 s, a 25 s soak taken up at 9 s: the soak's
        // 12, 17 and 22 s, as 3, 8 and 13 s of this run, which lasts 16 s.
        let cells = cells(SOAK, &[("soak.from", "9s")]).unwrap();
        let soak = Soak::of(&cells[0], 1.0).unwrap().unwrap();
        assert_eq!(soak.length(), Duration::from_secs(16));
        let timeline = crate::timeline::Timeline::of(&cells[0], 1.0).unwrap();
        let at: Vec<(u64, usize)> = (timeline.firings().iter())
            .map(|f| (f.0.as_secs(), f.1))
            .collect();
        assert_eq!(at, [(3, 0), (8, 1), (13, 0)]);
        let e = super::tests::cells(SOAK, &[("soak.from", "25s")]).unwrap_err();
        assert!(
            e.contains("soak.from 25s is not before the soak's end"),
            "{e}"
        );
    }

    #[test]
    fn the_windows_keep_five_seconds_before_each_firing_and_fifteen_after() {
        let cells = cells(SOAK, &[("soak.duration", "60s"), ("load.duration", "30s")]).unwrap();
        let soak = Soak::of(&cells[0], 1.0).unwrap().unwrap();
        let firings = soak.repeat(&[(Duration::from_secs(10), 0, Duration::from_secs(1))]);
        assert_eq!(firings.len(), 2);
        // Measured from 1 s into the load (its warm-up): 6-27 s and 36-57 s of the load.
        let dir = std::env::temp_dir().join(format!("ib-soak-windows-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut kept = soak.kept(&firings, Duration::from_secs(1), &dir.join("rest.csv.gz"));
        let every_second: Vec<ingressbench_stats::Sample> = (0..60)
            .map(|s| ingressbench_stats::Sample::new(s * 1_000_000_000))
            .collect();
        let (out, _) = kept.split(&every_second, &[]);
        let seconds: Vec<u64> = out
            .iter()
            .map(|s| s.intended_at_ns / 1_000_000_000)
            .collect();
        let expected: Vec<u64> = (6..=27).chain(36..=57).collect();
        assert_eq!(seconds, expected);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn what_cannot_repeat_or_would_not_fit_is_refused_with_why() {
        let refused = |sets: &[(&str, &str)], text: &str, says: &str| {
            let e = cells(text, sets).unwrap_err();
            assert!(e.contains(says), "{e}");
        };
        refused(&[("soak.duration", "5s")], SOAK, "shorter than one period");
        refused(
            &[
                ("events.0.at", "12s"),
                ("load.duration", "20s"),
                ("soak.period", "10s"),
            ],
            SOAK,
            "events[0]: fires at 12s, past the soak's period (10s)",
        );
        refused(
            &[],
            &SOAK.replace("rate: 1000, ", "mode: sequential, ").replace(
                "{ at: 2s, reload: true }",
                "{ before_request: 100, reload: true }",
            ),
            "before_request fires in lock-step",
        );
        refused(
            &[("soak.period", "10s")],
            &SOAK.replace("duration: 10s, ", "requests: 1000, "),
            "drop load.requests",
        );
        refused(
            &[],
            &SOAK.replace("rate: 1000, ", "mode: closed, "),
            "give open-loop load a load.rate",
        );
        // The budget: the arithmetic, each part's.
        let e = cells(SOAK, &[("soak.duration", "24h"), ("soak.budget", "100MB")]).unwrap_err();
        assert!(e.contains("over soak.budget (100.0 MB)"), "{e}");
        assert!(
            e.contains("interval log: 86400 s x 1000 B = 86.4 MB"),
            "{e}"
        );
        assert!(
            e.contains("events: 17280 firings x 4000 B = 69.1 MB"),
            "{e}"
        );
        assert!(
            e.contains("usage.jsonl: 86400 s x 4 parts x 110 B = 38.0 MB"),
            "{e}"
        );
        // Windows of 20 s every 5 s cover the whole day: 1000 x 0.01 x 86400 samples.
        assert!(
            e.contains("samples around the events: 1000 req/s x load.sample_rate 0.01 x 86400 s x 24 B = 20.7 MB"),
            "{e}"
        );
        // The same day fits a budget that holds it.
        cells(SOAK, &[("soak.duration", "24h"), ("soak.budget", "300MB")]).unwrap();
        // More samples than a cell's impact can read.
        refused(
            &[("soak.duration", "24h"), ("load.sample_rate", "1")],
            SOAK,
            "lower load.sample_rate to 0.0579 or less",
        );
        refused(
            &[("soak.budget", "lots")],
            SOAK,
            "soak.budget: `lots` is not a size",
        );
    }

    #[test]
    fn processes_beyond_the_starts_count_are_stretches_with_their_ends() {
        // Two processes at the start; an old one alive from 2 s to 5 s, two from 8 s to
        // the end: the count most often seen (3) is not the baseline.
        let counts: Vec<(f64, u32)> = [2, 2, 3, 3, 3, 2, 2, 2, 3, 4, 4, 3]
            .iter()
            .enumerate()
            .map(|(t, n)| (t as f64, *n))
            .collect();
        let (at_start, stretches) = extra_processes(&counts);
        assert_eq!(at_start, 2);
        let spans: Vec<(f64, f64, u32)> = (stretches.iter())
            .map(|s| (s.from_s, s.to_s, s.extra))
            .collect();
        assert_eq!(spans, [(2.0, 5.0, 1), (8.0, 11.0, 2)]);
        assert_eq!(extra_processes(&[]), (0, Vec::new()));
    }

    #[test]
    fn sizes_read_in_decimal_and_binary_units() {
        assert_eq!(bytes("500MB"), Ok(500_000_000));
        assert_eq!(bytes("2 GiB"), Ok(2 << 30));
        assert_eq!(bytes("1.5GB"), Ok(1_500_000_000));
        assert!(bytes("5 furlongs").is_err());
    }
}
