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
//! the directory's size every `every` (soak.jsonl); when it ends, [`record`] judges what
//! grew. A soak cut off goes on under `run --resume` from its last soak.jsonl line
//! ([`resumed`]: `soak.from`, the events in phase).

mod budget;
mod log;
mod verdict;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_load::kept::{Kept, KeptHandle};
use ingressbench_results::soak::SoakLine;

pub(crate) use budget::check;
pub use budget::plan;
pub(crate) use log::SoakLog;
pub(crate) use verdict::record;

use crate::load::{dur, scaled};
use crate::Cell;

/// Sampled requests kept before each firing: the impact's "p99 in the 5 s before".
pub(crate) const KEPT_BEFORE: Duration = Duration::from_secs(5);
/// And after it (after its propagation delay): the impact's window, at most 15 s.
pub(crate) const KEPT_AFTER: Duration = Duration::from_secs(15);

/// The default `reservoir`, `budget` and `every`.
const RESERVOIR: usize = 20_000;
const BUDGET: u64 = 1_000_000_000;
const EVERY: Duration = Duration::from_secs(60);

/// A cell's soak, its times scaled as the run's.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Soak {
    /// How long the soak is (this run's load goes from `from` to it).
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
            Some(b) => budget::bytes(b).map_err(|e| format!("soak.budget: {e}"))?,
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(super) const SOAK: &str = "name: s\ntargets: [nginx]\nbackends: [{ name: echo, replicas: 2 }]\nload: { rate: 1000, duration: 10s, sample_rate: 0.01 }\nevents:\n  - { at: 2s, reload: true }\n  - { at: 7s, scale: 3 }\nsoak: { duration: 25s }\n";

    pub(super) fn cells(text: &str, sets: &[(&str, &str)]) -> Result<Vec<Cell>, String> {
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
}
