//! What each event did to the requests around it, computed from a cell's samples.

use std::path::Path;
use std::time::Instant;

use ingressbench_lab::ChangeRecord;
use ingressbench_results::impact::{
    EventCuts, FirstGoaway, GenerationEffect, Goaways, ImpactEntry, ProxyCounted, QuicConnections,
    WindowFigures,
};
use ingressbench_stats::GenerationSummary;
use ingressbench_stats::Summary;

use crate::record::write_json;
use crate::timeline::offset;
use crate::usage::UsageLog;

/// A sampled request (times in seconds from the start of measurement).
pub use ingressbench_report::results::SampleRow as Point;

/// Reads the cell's `samples.csv.gz` in `dir` (times shifted so that 0 is the start of
/// measurement), in order of intended send time.
pub fn read_samples(dir: &Path, measure_from_s: f64) -> Result<Vec<Point>, String> {
    // The cell's own file, just written: no bound but the file's.
    let mut points =
        ingressbench_report::results::read_samples(dir, &["samples.csv.gz"], u64::MAX - 1)?;
    for p in &mut points {
        p.at_s -= measure_from_s;
    }
    points.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    Ok(points)
}

fn p99_ms(points: &[&Point]) -> Option<f64> {
    if points.is_empty() {
        return None;
    }
    let mut l: Vec<f64> = points.iter().map(|p| p.latency_s).collect();
    l.sort_by(f64::total_cmp);
    let i = ((l.len() as f64 * 0.99).ceil() as usize).clamp(1, l.len()) - 1;
    Some(l[i] * 1e3)
}

/// The impact of an event at `t_s` (seconds from the start of measurement) whose window
/// of effect ends at `until_s` (the next event, or 15 s later, whichever is first).
/// `points` hold every failed request (kept whatever the sample rate) and the random
/// sample (`in_sample`). Errors are exact: their count and outcomes, the first and the
/// last, and, under open-loop load (`slot_s`, the schedule's spacing), the longest run of
/// consecutive failed requests; without a schedule that run is read between sampled
/// successes (`longest_failure_run_basis: "sampled"`). What needs successes (requests,
/// latency) comes from the random sample; `sample_rate` scales its counts.
pub fn impact(
    points: &[Point],
    t_s: f64,
    until_s: f64,
    sample_rate: f64,
    slot_s: Option<f64>,
) -> WindowFigures {
    let within = |from: f64, to: f64| {
        points
            .iter()
            .filter(move |p| p.at_s >= from && p.at_s < to)
            .collect::<Vec<_>>()
    };
    let sampled = |from: f64, to: f64| {
        let mut w = within(from, to);
        w.retain(|p| p.in_sample);
        w
    };
    let after = within(t_s, until_s);
    let failed: Vec<&&Point> = after.iter().filter(|p| !p.ok).collect();
    let (longest, basis) = match slot_s {
        Some(slot) => (longest_run_on_schedule(&failed, slot), "schedule"),
        None => (longest_run_between(&after), "sampled"),
    };
    let after_sampled = sampled(t_s, until_s);
    // Every row is in the sample or a failure (or both): the window's rows are both.
    let max_ms = after
        .iter()
        .map(|p| p.latency_s * 1e3)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    let scale = if sample_rate > 0.0 {
        1.0 / sample_rate
    } else {
        0.0
    };
    let mut by_outcome = std::collections::BTreeMap::<String, u64>::new();
    for p in &failed {
        *by_outcome.entry(p.outcome.clone()).or_default() += 1;
    }
    let sampled_errors = after_sampled.iter().filter(|p| !p.ok).count();
    WindowFigures {
        errors: Some(failed.len() as u64),
        estimated_errors: None,
        errors_by_outcome: by_outcome,
        window_s: Some(until_s - t_s),
        sampled_requests: after_sampled.len() as u64,
        estimated_requests: (after_sampled.len() as f64 * scale).round(),
        sampled_errors: sampled_errors as u64,
        first_error_after_s: failed.first().map(|p| p.at_s - t_s),
        last_error_after_s: failed.last().map(|p| p.at_s - t_s),
        longest_failure_run: Some(longest),
        longest_failure_run_basis: basis.to_owned(),
        max_latency_ms: max_ms,
        p99_ms_5s_before: p99_ms(&sampled(t_s - 5.0, t_s)),
        p99_ms_5s_after: p99_ms(&sampled(t_s, t_s + 5.0)),
        p99_ms_5_to_15s_after: p99_ms(&sampled(t_s + 5.0, t_s + 15.0)),
    }
}

/// The longest run of failed requests in consecutive slots of an open-loop schedule
/// (`failed` in order of intended time, every one of the window's).
fn longest_run_on_schedule(failed: &[&&Point], slot_s: f64) -> u64 {
    let mut longest = 0;
    let mut run = 0;
    let mut last: Option<f64> = None;
    for p in failed {
        // The next slot is `slot_s` on; half a slot either way absorbs rounding.
        run = match last {
            Some(at) if p.at_s - at < 1.5 * slot_s => run + 1,
            _ => 1,
        };
        longest = longest.max(run);
        last = Some(p.at_s);
    }
    longest
}

/// The longest run of failed requests with no sampled success between them.
fn longest_run_between(points: &[&Point]) -> u64 {
    let mut longest = 0;
    let mut run = 0;
    for p in points {
        run = if p.ok { 0 } else { run + 1 };
        longest = longest.max(run);
    }
    longest
}

/// The HTTP/2 GOAWAYs the client received in `[t_s, until_s)`, if any: how many, on how many connections, the first one's delay and its last-stream-id and
/// code, and the streams in flight on their connections when they came. `shift_s` is the
/// start of measurement after the load's start (GOAWAY times run from the load's start).
pub fn goaways_within(
    goaways: &[ingressbench_stats::Goaway],
    shift_s: f64,
    t_s: f64,
    until_s: f64,
) -> Option<Goaways> {
    let within: Vec<(f64, &ingressbench_stats::Goaway)> = goaways
        .iter()
        .map(|g| (g.at_ns as f64 / 1e9 - shift_s, g))
        .filter(|(at, _)| *at >= t_s && *at < until_s)
        .collect();
    let (first_at, first) = *within.first()?;
    let connections: std::collections::BTreeSet<u64> =
        within.iter().map(|(_, g)| g.connection).collect();
    Some(Goaways {
        goaways: within.len() as u64,
        goaway_connections: connections.len() as u64,
        first_goaway_after_s: first_at - t_s,
        first_goaway: FirstGoaway {
            last_stream_id: first.last_stream_id,
            code: first.code,
        },
        streams_in_flight_at_goaways: (within.iter())
            .map(|(_, g)| u64::from(g.streams_in_flight))
            .sum(),
    })
}

/// The QUIC connections opened and ended in `[t_s, until_s)` over an HTTP/3 run (none
/// otherwise): handshakes, ends by what ended them, the first end's delay. `shift_s` as
/// for [`goaways_within`]; `opened` and `ended` are the run's totals, which say whether
/// `events` holds every one.
pub fn quic_within(
    events: &[ingressbench_stats::QuicEvent],
    (opened, ended): (u64, u64),
    shift_s: f64,
    t_s: f64,
    until_s: f64,
) -> Option<QuicConnections> {
    if opened == 0 {
        return None;
    }
    let at = |e: &ingressbench_stats::QuicEvent| e.at_ns as f64 / 1e9 - shift_s;
    let complete =
        events.len() as u64 == opened + ended || events.last().is_some_and(|e| at(e) >= until_s);
    let mut figures = QuicConnections {
        complete,
        ..QuicConnections::default()
    };
    for e in events.iter().filter(|e| (t_s..until_s).contains(&at(e))) {
        if e.what == "opened" {
            figures.opened += 1;
            let ms = e.handshake_us as f64 / 1e3;
            figures.max_handshake_ms = Some(figures.max_handshake_ms.map_or(ms, |m| m.max(ms)));
            match e.zero_rtt {
                Some(true) => figures.zero_rtt_accepted += 1,
                Some(false) => figures.zero_rtt_rejected += 1,
                None => {}
            }
        } else {
            *figures.ended.entry(e.what.clone()).or_default() += 1;
            figures.first_end_after_s.get_or_insert(at(e) - t_s);
        }
    }
    Some(figures)
}

/// When an event took effect, read from traffic (seconds after it was requested) and
/// how that was read: the first answer from a backend it started; else the last answer
/// from a backend it removed, or the last failure, within `until_s`; else not observable.
pub fn took_effect(
    points: &[Point],
    t_s: f64,
    until_s: f64,
    started: &[String],
    removed: &[String],
) -> (Option<f64>, &'static str) {
    let after = points.iter().filter(|p| p.at_s >= t_s && p.at_s < until_s);
    let answered = |p: &Point| p.at_s + p.latency_s - t_s;
    if !started.is_empty() {
        let first = after
            .filter(|p| p.ok && started.contains(&p.backend))
            .map(answered)
            .reduce(f64::min);
        return (first, "first answer from a backend it started");
    }
    if !removed.is_empty() {
        let last = after
            .filter(|p| !p.ok || removed.contains(&p.backend))
            .map(answered)
            .reduce(f64::max);
        return (
            last.or(Some(0.0)),
            "last answer from a backend it removed, or last failure, after it",
        );
    }
    (None, "not observable from traffic")
}

/// When a route change or reload reached the answers of one hop, read from every answer
/// (the summary's generation table, not the sample): the first answer carrying
/// `generation` or a later one in `header` (`took_effect_s`), the last answer carrying an
/// earlier one (`last_old_answer_s`), and how long both kinds of answer interleaved
/// (`mixed_window_s`: workers or replicas that took the change at different times). Times
/// are seconds from the start of measurement; `shift_s` is where that is in the summary's
/// times (the warm-up).
pub fn generation_effect(
    seen: &[GenerationSummary],
    header: &str,
    generation: u32,
    shift_s: f64,
) -> GenerationEffect {
    let of_header = || seen.iter().filter(|g| g.header == header);
    let first_new = of_header()
        .filter(|g| g.generation >= generation)
        .map(|g| g.first_answer_s - shift_s)
        .reduce(f64::min);
    let last_old = of_header()
        .filter(|g| g.generation < generation)
        .map(|g| g.last_answer_s - shift_s)
        .reduce(f64::max);
    let mixed = first_new.map(|new| last_old.map_or(0.0, |old| (old - new).max(0.0)));
    let answers = |new: bool| {
        of_header()
            .filter(|g| (g.generation >= generation) == new)
            .map(|g| g.answers)
            .sum::<u64>()
    };
    GenerationEffect {
        header: header.to_owned(),
        generation,
        took_effect_s: first_new.map(round6),
        last_old_answer_s: last_old.map(round6),
        mixed_window_s: mixed.map(round6),
        answers_before: answers(false),
        answers_after: answers(true),
        answers_with_it: Some(
            of_header()
                .filter(|g| g.generation == generation)
                .map(|g| g.answers)
                .sum(),
        ),
    }
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// Writes `impact.json`: for every change the site made (`records`), what it did to the
/// sampled requests in the window after it (until the next event, at most 15 s), and when
/// it took effect (from the traffic, the generation it made, or for a route change
/// nothing else shows, when the route probe found its last route right: `probed`).
/// `times` are the start of measurement and the load's start.
/// The longest an event's action is taken to go on closing connections after it (an
/// event's window is no longer).
const CUT_BY_EVENT_WITHIN_S: f64 = 15.0;

/// Which event's action closed each of `closes` (timed from the load's start; the events'
/// `requested_s` from the start of measurement, `shift` later), or none: the latest
/// event before the close, within [`CUT_BY_EVENT_WITHIN_S`], that took away the backend
/// the connection was on (a kill, a termination, a scale-down); else the latest made to
/// the proxies or applied to them by a reload (a reload, a restart, an upgrade, a route
/// change; nginx's scale-down). Not the window the close fell in: a reload's connections
/// close as its old workers drain, often after the next event. A close whose backend is
/// not known goes to the latest event before it.
fn cut_by(
    closes: &[ingressbench_report::websocket::Close],
    events: &[(f64, &ChangeRecord)],
    shift: f64,
) -> Vec<Option<usize>> {
    let latest = |at: f64, acted: &dyn Fn(&ChangeRecord) -> bool| {
        (events.iter().enumerate().rev())
            .find(|(_, (t, rec))| {
                let t = t + shift;
                t <= at && at - t <= CUT_BY_EVENT_WITHIN_S && acted(rec)
            })
            .map(|(i, _)| i)
    };
    closes
        .iter()
        .map(|c| match &c.backend {
            Some(b) => latest(c.at_s, &|rec| rec.removed.contains(b))
                .or_else(|| latest(c.at_s, &|rec| rec.on_proxies)),
            // Which backend it was on is not known (a stream whose answer did not say):
            // the latest event before it, as its window would have it.
            None => latest(c.at_s, &|_| true),
        })
        .collect()
}

/// The WebSockets an event's action cut (`mine`, see [`cut_by`]): how many, by code, the
/// messages lost with them, and how long their connections took to have one again; and
/// how many closes in its window no event's action explains (`unexplained`).
fn websocket_cuts<'a>(
    mine: impl Iterator<Item = &'a ingressbench_report::websocket::Close>,
    unexplained: usize,
) -> EventCuts {
    let cuts = ingressbench_report::websocket::Cuts::of(mine);
    EventCuts {
        cut_by_no_event_in_window: unexplained as u64,
        cut: cuts.closed as u64,
        by_code: (cuts.by_code.iter())
            .map(|(k, n)| (k.clone(), *n as u64))
            .collect(),
        messages_lost: cuts.lost,
        reconnected: cuts.reconnect_ms.len() as u64,
        reconnect_p50_ms: cuts.reconnect_percentile_ms(50.0),
        reconnect_p99_ms: cuts.reconnect_percentile_ms(99.0),
        reconnect_max_ms: cuts.reconnect_ms.last().copied(),
    }
}

pub(crate) fn write_impact(
    (records, probed, closes): (
        &[ChangeRecord],
        &[crate::propagation::Probed],
        Option<&[ingressbench_report::websocket::Close]>,
    ),
    dir: &Path,
    summary: &Summary,
    (usage, counts): (Option<&UsageLog>, Option<&crate::proxy_counts::ProxyCounts>),
    sample_rate: f64,
    (measure_from, start): (Instant, Instant),
) -> Result<Vec<ImpactEntry>, String> {
    let shift = measure_from.saturating_duration_since(start).as_secs_f64();
    let points = crate::impact::read_samples(dir, shift)?;
    // The end of the last window: the end of measurement, or the last sample if one was
    // sent later (a sequential load's last request goes out at its end); inclusive.
    let end = points
        .iter()
        .map(|p| p.at_s)
        .fold(summary.duration_s, f64::max)
        + 1e-6;
    let events: Vec<(f64, &ChangeRecord)> = (records.iter())
        .map(|r| (offset_from(r.requested_at, measure_from), r))
        .collect();
    let causes = closes.map(|c| cut_by(c, &events, shift));
    let mut out = Vec::new();
    for (i, rec) in records.iter().enumerate() {
        let t = events[i].0;
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
        let (effect, basis) =
            crate::impact::took_effect(&points, t, until, &rec.started, &rec.removed);
        let mut entry = ImpactEntry {
            what: rec.what.clone(),
            requested_s: t,
            applied_s: rec.applied_at.map(|a| offset(a, measure_from)),
            // The control plane's part: when the Service's EndpointSlices showed it.
            endpoints_s: rec.endpoints_at.map(|at| offset(at, measure_from)),
            // When the controller said it had it (an HTTPRoute's status).
            reported_s: rec.reported_at.map(|at| offset(at, measure_from)),
            // A controller's restart: when its rollout was complete.
            completed_s: rec.completed_at.map(|at| offset(at, measure_from)),
            took_effect_s: effect.map(|e| t + e),
            took_effect_basis: basis.to_owned(),
            requests: crate::impact::impact(&points, t, until, sample_rate, slot_s),
            goaways: goaways_within(&summary.goaways, shift, t, until),
            quic: quic_within(
                &summary.quic_events,
                (
                    summary.connection_events.quic_opened,
                    summary.connection_events.quic_ended,
                ),
                shift,
                t,
                until,
            ),
            cpu: usage.map(|u| u.around(t)).unwrap_or_default(),
            ..ImpactEntry::default()
        };
        if let (Some(closes), Some(causes)) = (closes, &causes) {
            let mine = (closes.iter().zip(causes)).filter(|(_, by)| **by == Some(i));
            let unexplained = (closes.iter().zip(causes))
                .filter(|(c, by)| by.is_none() && (t + shift..until + shift).contains(&c.at_s))
                .count();
            entry.websocket = Some(websocket_cuts(mine.map(|(c, _)| c), unexplained));
        }
        // Route changes and reloads: read from the generation every answer carries.
        entry.generations = (rec.generations.iter())
            .map(|(header, g)| generation_effect(&summary.generations, header, *g, shift))
            .collect();
        if let Some(proxies) = entry.generations.first() {
            entry.took_effect_s = proxies.took_effect_s;
            entry.took_effect_basis = if proxies.superseded() {
                format!(
                    "superseded: no answer carried generation {} ({}); the first answer carrying a later one",
                    proxies.generation, proxies.header
                )
            } else {
                format!(
                    "first answer carrying generation {} ({})",
                    proxies.generation, proxies.header
                )
            };
            entry.last_old_answer_s = proxies.last_old_answer_s;
            entry.mixed_window_s = proxies.mixed_window_s;
        }
        // A route change nothing on the existing routes shows (a cluster's routes carry
        // no generation): when the probe found the last of its routes right.
        if entry.took_effect_s.is_none() {
            let since = out
                .last()
                .map_or(f64::NEG_INFINITY, |e: &ImpactEntry| e.requested_s);
            if let Some(p) = probed
                .iter()
                .rev()
                .find(|p| p.requested_s <= t + 1e-6 && p.requested_s > since)
            {
                entry.took_effect_s = p.last_right_s;
                entry.took_effect_basis = match p.last_right_s {
                    Some(_) => "the route probe: the last of its routes to answer right",
                    None => "the route probe: a route never answered right (routes.json)",
                }
                .to_owned();
            }
        }
        // What the proxies counted over the window the client's errors are counted in,
        // and the client's failures that ended between the same two readings: a request
        // sent just before the event can fail after it, counted by the proxy but not in
        // the window (which holds the requests sent in it).
        if let Some(counted) = counts.and_then(|c| c.between(t, until)) {
            let span = counted.values().find_map(|v| match v {
                ProxyCounted::Counted(c) => Some((c.read_from_s, c.read_to_s)),
                ProxyCounted::NotRead { .. } => None,
            });
            if let Some((from, to)) = span {
                let ended = (points.iter())
                    .filter(|p| !p.ok && (from..=to).contains(&(p.at_s + p.latency_s)))
                    .count();
                entry.client_errors_between_readings = Some(ended as u64);
            }
            entry.proxy_counted = Some(counted);
        }
        out.push(entry);
    }
    write_json(&dir.join("impact.json"), &out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// Seconds from `measure_from` to `at` (none before).
fn offset_from(at: Instant, measure_from: Instant) -> f64 {
    at.saturating_duration_since(measure_from).as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cut_belongs_to_the_event_whose_action_closed_it() {
        let close = |at_s: f64, backend: &str| ingressbench_report::websocket::Close {
            at_s,
            connection: 0,
            by: ingressbench_results::stream::ClosedBy::Server,
            code: Some(1001),
            grpc_status: None,
            reason: String::new(),
            backend: Some(backend.into()),
            lost: 0,
            reconnected_after_ms: None,
        };
        let now = Instant::now();
        let reload = ChangeRecord {
            on_proxies: true,
            ..ChangeRecord::asked("reload".into(), now)
        };
        let kill = ChangeRecord {
            removed: vec!["echo-2".into()],
            ..ChangeRecord::asked("kill echo-2".into(), now)
        };
        let scale_up = ChangeRecord::asked("scale echo 2->3".into(), now);
        // Measurement starts 1 s into the load: a reload at 1.0 s, a kill 0.2 s later, a
        // scale-up at 5 s.
        let events = [(1.0, &reload), (1.2, &kill), (5.0, &scale_up)];
        let closes = [
            close(0.5, "echo-1"),  // before any event
            close(2.3, "echo-1"),  // the reload's old workers draining, after the kill
            close(2.25, "echo-2"), // the killed backend's
            close(6.5, "echo-1"),  // after the scale-up, which closes nothing
            close(30.0, "echo-1"), // long after: none
        ];
        assert_eq!(
            cut_by(&closes, &events, 1.0),
            [None, Some(0), Some(1), Some(0), None]
        );
        // On a backend no answer named: the latest event before it.
        let unknown = ingressbench_report::websocket::Close {
            backend: None,
            ..close(2.3, "")
        };
        assert_eq!(cut_by(&[unknown], &events, 1.0), [Some(1)]);
    }

    #[test]
    fn errors_are_exact_from_every_failure_and_the_rest_is_from_the_sample() {
        // One request every 10 ms for 20 s; errors from 10.0 s to 10.5 s but one success
        // at 10.25 s; slow from 10 s to 12 s. Half the requests are in the random sample
        // (the even ones); every failure is kept.
        let points: Vec<Point> = (0..2000)
            .map(|i| {
                let at_s = i as f64 * 0.01;
                let ok = !(10.0..10.5).contains(&at_s) || i == 1025;
                let latency_s = if (10.0..12.0).contains(&at_s) {
                    0.05
                } else {
                    0.001
                };
                Point {
                    at_s,
                    latency_s,
                    ok,
                    outcome: if ok { "200" } else { "502" }.into(),
                    backend: String::new(),
                    generations: [0, 0],
                    in_sample: i % 2 == 0,
                }
            })
            .filter(|p| p.in_sample || !p.ok)
            .collect();
        let v = impact(&points, 9.95, 15.0, 0.5, Some(0.01));
        assert_eq!(v.errors, Some(49));
        assert_eq!(v.errors_by_outcome["502"], 49);
        assert_eq!(v.sampled_errors, 25);
        assert_eq!(v.sampled_requests, 252);
        assert_eq!(v.estimated_requests, 504.0);
        // On the schedule the unsampled success at 10.25 s splits the run: 25 then 24.
        assert_eq!(v.longest_failure_run, Some(25));
        assert_eq!(v.longest_failure_run_basis, "schedule");
        // Without one, only sampled successes split runs.
        let between = impact(&points, 9.95, 15.0, 0.5, None);
        assert_eq!(between.longest_failure_run, Some(49));
        assert_eq!(between.longest_failure_run_basis, "sampled");
        assert!((v.first_error_after_s.unwrap() - 0.05).abs() < 1e-9);
        assert!((v.last_error_after_s.unwrap() - 0.54).abs() < 1e-9);
        assert!((v.max_latency_ms.unwrap() - 50.0).abs() < 1e-9);
        assert!((v.p99_ms_5s_before.unwrap() - 1.0).abs() < 1e-9);
        assert!((v.p99_ms_5s_after.unwrap() - 50.0).abs() < 1e-9);
        assert!((v.p99_ms_5_to_15s_after.unwrap() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn took_effect_reads_the_first_new_and_the_last_old_backend() {
        // Every 10 ms: b1 and b2 alternate; b3 answers from 1.05 s; b2 last answers at 2.0 s.
        let points: Vec<Point> = (0..300)
            .map(|i| {
                let at_s = i as f64 * 0.01;
                let backend = if at_s >= 1.05 && i % 3 == 0 {
                    "b3"
                } else if i % 2 == 0 || at_s > 2.0 {
                    "b1"
                } else {
                    "b2"
                };
                Point {
                    at_s,
                    latency_s: 0.002,
                    ok: true,
                    outcome: "200".into(),
                    backend: backend.into(),
                    generations: [0, 0],
                    in_sample: true,
                }
            })
            .collect();
        let (at, _) = took_effect(&points, 1.0, 3.0, &["b3".into()], &[]);
        assert!((at.unwrap() - 0.052).abs() < 1e-9, "{at:?}");
        let (at, _) = took_effect(&points, 1.0, 3.0, &[], &["b2".into()]);
        assert!((at.unwrap() - 0.992).abs() < 1e-9, "{at:?}");
        assert_eq!(took_effect(&points, 1.0, 3.0, &[], &[]).0, None);
    }

    #[test]
    fn a_generation_takes_effect_at_its_first_answer_and_mixes_until_the_last_old_one() {
        let seen = |header: &str, generation, first, last| GenerationSummary {
            header: header.into(),
            generation,
            answers: 10,
            first_answer_s: first,
            last_answer_s: last,
        };
        // Measurement starts 1 s into the run. Generation 2 first answers at 5.2 s while
        // an old worker still answers with 1 until 5.5 s; 3 (a revert) comes later.
        let table = vec![
            seen("x-gen", 1, 1.0, 5.5),
            seen("x-gen", 2, 5.2, 8.0),
            seen("x-gen", 3, 8.1, 12.0),
            seen("x-side", 1, 1.0, 12.0),
        ];
        let v = generation_effect(&table, "x-gen", 2, 1.0);
        assert_eq!(v.took_effect_s, Some(4.2));
        assert_eq!(v.last_old_answer_s, Some(4.5));
        assert_eq!(v.mixed_window_s, Some(0.3));
        assert_eq!(v.answers_before, 10);
        assert_eq!(v.answers_after, 20);
        assert_eq!(v.answers_with_it, Some(10));
        assert!(!v.superseded());
        // Generation 4 was never answered as itself: 5 was, first.
        let mut later = table.clone();
        later.push(seen("x-gen", 5, 12.5, 13.0));
        let v = generation_effect(&later, "x-gen", 4, 1.0);
        assert_eq!((v.answers_with_it, v.answers_after), (Some(0), 10));
        assert!(v.superseded());
        assert_eq!(v.took_effect_s, Some(11.5));
        let v = generation_effect(&table, "x-gen", 3, 1.0);
        assert_eq!(v.took_effect_s, Some(7.1));
        assert_eq!(v.mixed_window_s, Some(0.0));
        // A generation no answer carried has not taken effect.
        let v = generation_effect(&table, "x-side", 2, 1.0);
        assert_eq!(v.took_effect_s, None);
        assert_eq!(v.mixed_window_s, None);
    }

    #[test]
    fn goaways_are_placed_in_the_event_window_they_arrived_in() {
        let g = |at_s: f64, connection: u64| ingressbench_stats::Goaway {
            at_ns: (at_s * 1e9) as u64,
            connection,
            last_stream_id: 7,
            code: 0,
            streams_in_flight: 3,
            streams_sent: 10,
        };
        // Measurement starts 2 s after the load: a GOAWAY at 12.5 s of load is 10.5 s in.
        let goaways = [g(11.0, 1), g(12.5, 1), g(12.6, 2), g(30.0, 3)];
        let figures = goaways_within(&goaways, 2.0, 10.0, 20.0).unwrap();
        assert_eq!(figures.goaways, 2);
        assert_eq!(figures.goaway_connections, 2);
        assert!((figures.first_goaway_after_s - 0.5).abs() < 1e-6);
        assert_eq!(figures.first_goaway.last_stream_id, 7);
        assert_eq!(figures.streams_in_flight_at_goaways, 6);
        assert_eq!(goaways_within(&goaways, 2.0, 40.0, 50.0), None);
    }

    #[test]
    fn quic_connections_are_counted_in_the_window_they_opened_or_ended_in() {
        let e = |at_s: f64, what: &str, handshake_us: u64| ingressbench_stats::QuicEvent {
            at_ns: (at_s * 1e9) as u64,
            connection: 1,
            what: what.into(),
            handshake_us,
            zero_rtt: None,
        };
        // Measurement starts 2 s after the load: an end at 12.5 s of load is 10.5 s in.
        let events = [
            e(1.0, "opened", 900),
            e(12.5, "quic_close:internal_error", 0),
            e(12.6, "quic_idle_timeout", 0),
            e(12.7, "quic_idle_timeout", 0),
            e(13.0, "opened", 2_500),
            ingressbench_stats::QuicEvent {
                zero_rtt: Some(false),
                ..e(13.1, "opened", 1_200)
            },
            e(30.0, "quic_idle_timeout", 0),
        ];
        let f = quic_within(&events, (3, 4), 2.0, 10.0, 20.0).unwrap();
        assert_eq!(f.opened, 2);
        assert_eq!(f.max_handshake_ms, Some(2.5));
        assert_eq!((f.zero_rtt_accepted, f.zero_rtt_rejected), (0, 1));
        assert_eq!(f.ended["quic_idle_timeout"], 2);
        assert_eq!(f.ended["quic_close:internal_error"], 1);
        assert!((f.first_end_after_s.unwrap() - 0.5).abs() < 1e-6);
        assert!(f.complete);
        // Past the kept events' end a window's figures are a part, and say so; one the
        // kept events reach past is whole.
        assert!(
            !quic_within(&events, (3, 9), 2.0, 20.0, 40.0)
                .unwrap()
                .complete
        );
        assert!(
            quic_within(&events, (3, 9), 2.0, 10.0, 20.0)
                .unwrap()
                .complete
        );
        // No QUIC connection at all: not an HTTP/3 run.
        assert_eq!(quic_within(&[], (0, 0), 0.0, 0.0, 10.0), None);
    }
}
