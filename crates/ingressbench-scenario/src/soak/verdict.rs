//! A soak's verdict, when its cell ends: what grew, as slopes with their intervals,
//! per part and per kind of event, and the tool's own cost (run.json's `soak`).

use ingressbench_lab::usage::PartUsage;
use ingressbench_results::impact::ImpactEntry;
use ingressbench_results::site::Slope;
use ingressbench_results::soak::{
    ExtraProcesses, SoakEvents, SoakPart, SoakRecord, ToolCost, MAX_STRETCHES,
};

use super::{budget, SoakRun};
use crate::Cell;

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
    let estimate = budget::estimated_bytes(cell, soak);
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
        estimate_bytes: estimate,
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
}
