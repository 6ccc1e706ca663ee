//! What a soak's results will take, said and checked before anything starts: each
//! written thing's size, measured on this tool's files, times how many the soak will
//! write; a soak over its budget is refused with the arithmetic.

use std::time::Duration;

use super::{Soak, KEPT_AFTER, KEPT_BEFORE};
use crate::model::{LoadModeFile, Timing};
use crate::Cell;

/// Kept samples beyond this many in a cell are refused: the events' impact reads them
/// into memory when the cell ends.
const MAX_KEPT_SAMPLES: f64 = 5_000_000.0;

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

/// `500MB`, `1GB`, `2GiB`: bytes.
pub(super) fn bytes(text: &str) -> Result<u64, String> {
    let (n, unit) = ingressbench_stats::number_and_unit(text)
        .ok_or_else(|| format!("`{text}` is not a size; write 500MB or 2GB"))?;
    let scale = match unit {
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
    let firings = soak.repeat(&period_firings(cell));
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

/// What a soak cell's files and the run's report are estimated to take, in bytes (run.json's
/// `soak.estimate_bytes`).
pub(super) fn estimated_bytes(cell: &Cell, soak: &Soak) -> u64 {
    let cell_bytes: f64 = estimate(cell, soak).map_or(0.0, |parts| parts.iter().map(|p| p.1).sum());
    (cell_bytes + REPORT_BYTES) as u64
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
fn period_firings(cell: &Cell) -> Vec<(Duration, usize, Duration)> {
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
    out
}

/// A scenario's soaks in a line (`scenario check` and `run` say it before anything
/// starts): how long each cell's load runs, how often its events repeat, and what its
/// results are estimated to take against the budget. None without a soak.
pub fn plan(cells: &[Cell]) -> Option<String> {
    let soak = cells.iter().find_map(|c| Soak::of(c, 1.0).ok().flatten())?;
    let firings: usize = (cells.iter())
        .map(|c| soak.repeat(&period_firings(c)).len())
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

#[cfg(test)]
mod tests {
    use super::super::tests::{cells, SOAK};
    use super::*;

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
    fn sizes_read_in_decimal_and_binary_units() {
        assert_eq!(bytes("500MB"), Ok(500_000_000));
        assert_eq!(bytes("2 GiB"), Ok(2 << 30));
        assert_eq!(bytes("1.5GB"), Ok(1_500_000_000));
        assert!(bytes("5 furlongs").is_err());
    }
}
