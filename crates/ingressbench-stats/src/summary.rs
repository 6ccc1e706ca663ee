//! The summary of a load run: what `--json` writes and the terminal prints.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{ConnectionEvents, HistogramUs, Recorder};

/// Scheduler lag p99 above this (1 ms) means the generator could not keep its schedule.
pub const LAG_WARNING_US: u64 = 1_000;
/// Scheduler lag p50 above this share of the latency p50 is disclosed as a warning: that
/// much of the reported latency is the generator's own lateness.
pub const LAG_SHARE_WARNING: f64 = 0.10;
/// … unless it is below this, which is within the noise of one loopback wake-up here.
pub const LAG_FLOOR_US: u64 = 25;
/// An achieved rate below this share of the target means the generator fell short.
const RATE_SHORTFALL: f64 = 0.99;
/// Answers slower than this share of the rate sent mean the server fell behind the
/// schedule (its queue grew for the whole run).
const ANSWERS_BEHIND: f64 = 0.9;
/// Fewer requests than this make p99.9 a guess; the summary says so.
const MIN_REQUESTS_FOR_P999: u64 = 1_000;

/// How load was generated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadMode {
    /// Constant arrival rate; latency from the intended send time.
    Open,
    /// Each connection sends its next request when the previous one is answered.
    Closed,
    /// One request at a time, with an optional pause between them.
    Sequential,
}

/// What the recorder cannot know about the run it recorded.
#[derive(Clone, Debug)]
pub struct SummaryContext {
    /// How load was generated.
    pub mode: LoadMode,
    /// The target rate of open-loop load.
    pub target_rate_per_s: Option<f64>,
    /// How long the measured part of the run lasted (warm-up excluded).
    pub measured_ns: u64,
    /// Whether the run was stopped before its end (Ctrl-C).
    pub interrupted: bool,
    /// The retry policy the client ran with (`none`, `idempotent`, `always`).
    pub retry_policy: &'static str,
    /// The open-loop pacer's batch window setting (`auto`, `500us`); `None` without a
    /// schedule.
    pub batch_window: Option<String>,
    /// The generation headers the answers were read for, by slot.
    pub generation_headers: Vec<String>,
    /// The HTTP version the client spoke (`http1`, `http2`).
    pub protocol: &'static str,
}

/// Percentiles of one histogram, in microseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// How many values they summarise.
    pub count: u64,
    /// Minimum.
    pub min: u64,
    /// Median.
    pub p50: u64,
    /// 75th percentile.
    pub p75: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// 99.99th percentile.
    pub p9999: u64,
    /// Maximum.
    pub max: u64,
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub stdev: f64,
}

impl Percentiles {
    /// The percentiles of no values.
    pub fn empty() -> Self {
        Self::of(&HistogramUs::new())
    }

    /// The percentiles of `h`.
    pub fn of(h: &HistogramUs) -> Self {
        Self {
            count: h.count(),
            min: h.min(),
            p50: h.value_at_percentile(50.0),
            p75: h.value_at_percentile(75.0),
            p90: h.value_at_percentile(90.0),
            p99: h.value_at_percentile(99.0),
            p999: h.value_at_percentile(99.9),
            p9999: h.value_at_percentile(99.99),
            max: h.max(),
            mean: round3(h.mean()),
            stdev: round3(h.stdev()),
        }
    }
}

/// The shortest percentile set, for phases.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseSummary {
    /// How many requests had this phase.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Mean.
    pub mean: f64,
    /// Largest (0 in results written before it was recorded).
    #[serde(default)]
    pub max: u64,
}

impl PhaseSummary {
    fn of(h: &HistogramUs) -> Self {
        Self {
            count: h.count(),
            p50: h.value_at_percentile(50.0),
            p99: h.value_at_percentile(99.0),
            mean: round3(h.mean()),
            max: h.max(),
        }
    }
}

/// Request counts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestSummary {
    /// Measured requests (warm-up excluded), whatever their outcome.
    pub total: u64,
    /// Requests answered with a status below 400.
    pub ok: u64,
    /// Everything else: error statuses and failures.
    pub errors: u64,
    /// Requests excluded as warm-up.
    pub warmup: u64,
}

/// Requests the client sent a second time, on a new connection, because the first
/// attempt failed on a reused connection before any byte of the answer (the server
/// closed it just as the request went out). Without the retry they would have failed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RetrySummary {
    /// The policy: `none`, `idempotent` (the default) or `always`.
    pub policy: String,
    /// Requests retried (each at most once).
    pub retried: u64,
    /// What the first attempt ran into, by failure name.
    pub after: BTreeMap<String, u64>,
}

/// How the open-loop pacer batched its wake-ups.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchWindowSummary {
    /// The setting: `auto`, or a fixed window such as `500us`.
    pub setting: String,
    /// The windows in force, sampled every 100 ms of each worker's run, in microseconds.
    pub used_us: PhaseSummary,
}

/// The answers that carried one configuration generation (see
/// [`crate::GenerationSeen`]): which header, which generation, how many, and when the
/// first and last of them ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerationSummary {
    /// The generation header.
    pub header: String,
    /// The generation it carried.
    pub generation: u32,
    /// Answers that carried it.
    pub answers: u64,
    /// When the first of them ended, in seconds from the start of the run (warm-up
    /// included).
    pub first_answer_s: f64,
    /// When the last of them ended.
    pub last_answer_s: f64,
}

/// The rate sent and the rate answered, as wrk2 gives both: a server that falls behind
/// the schedule shows as answers slower than sends, never as "achieved".
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateSummary {
    /// The target of open-loop load; `null` for closed-loop and sequential load.
    pub target_per_s: Option<f64>,
    /// The rate sent: measured requests that were sent (`not_sent` ones are not offered
    /// load) divided by the measured duration (open loop: the span of the schedule).
    pub achieved_per_s: f64,
    /// The rate answered: answers (any status) a second over the span they came in, from
    /// the first answer to the last (none with fewer than two answers, and in results
    /// written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_per_s: Option<f64>,
}

/// The summary of one load run. Its JSON form is documented by
/// `docs/schema/load-summary.schema.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// How load was generated.
    pub mode: LoadMode,
    /// Length of the measured part of the run, in seconds.
    pub duration_s: f64,
    /// Whether the run was stopped before its end.
    pub interrupted: bool,
    /// Request counts.
    pub requests: RequestSummary,
    /// Target and achieved rate.
    pub rate: RateSummary,
    /// Whether `latency_us` is measured from intended send times (open loop).
    pub latency_corrected: bool,
    /// Latency of answered requests (any status) in microseconds: from the intended send
    /// time under open-loop load.
    pub latency_us: Percentiles,
    /// Service time of answered requests in microseconds: from the actual send,
    /// uncorrected.
    pub service_time_us: Percentiles,
    /// Time to failure of failed requests in microseconds, from the intended send time
    /// (requests never sent are not in it).
    #[serde(default = "Percentiles::empty")]
    pub time_to_failure_us: Percentiles,
    /// How late the generator released requests against its schedule, in microseconds.
    pub scheduler_lag_us: Percentiles,
    /// How the pacer batched wake-ups (open loop only).
    #[serde(default)]
    pub batch_window: Option<BatchWindowSummary>,
    /// Phase durations in microseconds: dns, connect, tls, ttfb, total.
    pub phases_us: BTreeMap<String, PhaseSummary>,
    /// Count per outcome: status code or failure name.
    pub outcomes: BTreeMap<String, u64>,
    /// Count per backend (value of the backend header).
    pub backends: BTreeMap<String, u64>,
    /// Latency per backend, in microseconds.
    pub backend_latency_us: BTreeMap<String, PhaseSummary>,
    /// Connections opened during the measured part.
    pub connections_opened: u64,
    /// Keep-alive runs open every connection before the first request is due: how long
    /// that took, from the run's launch to the last one open (or failed), in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_ramp_ms: Option<f64>,
    /// Requests sent over an already used connection.
    pub reused_requests: u64,
    /// Retries and their causes.
    #[serde(default)]
    pub retries: RetrySummary,
    /// Connections retired while idle (closed by the server, or unexpected bytes).
    #[serde(default)]
    pub connection_events: ConnectionEvents,
    /// The first reason given for a kind of failure (a TLS failure's message), by
    /// outcome name.
    #[serde(default)]
    pub failure_details: BTreeMap<String, String>,
    /// The configuration generations the answers carried (route changes and reloads as
    /// the traffic saw them), in order of first sight; empty when no answer carried one.
    #[serde(default)]
    pub generations: Vec<GenerationSummary>,
    /// Requests in flight when the run was stopped (Ctrl-C) and given up after a short
    /// grace; they have no outcome and are in no other figure.
    #[serde(default)]
    pub abandoned_at_stop: u64,
    /// Response bytes received.
    pub bytes_received: u64,
    /// The HTTP version the client spoke (`http1`, `http2`).
    #[serde(default = "http1")]
    pub protocol: String,
    /// HTTP/2 GOAWAY frames received, in order (at most 10,000).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub goaways: Vec<crate::Goaway>,
    /// HTTP/3: QUIC connections opened and ended, in order (at most 20,000).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quic_events: Vec<crate::QuicEvent>,
    /// Whatever makes these numbers less trustworthy, in words.
    pub warnings: Vec<String>,
}

fn http1() -> String {
    "http1".to_owned()
}

impl Summary {
    /// Summarises what `recorder` saw.
    pub fn new(recorder: &Recorder, ctx: &SummaryContext) -> Self {
        let outcomes = recorder.outcomes();
        let duration_s = ctx.measured_ns as f64 / 1e9;
        let sent = outcomes.total() - outcomes.get(crate::Outcome::NotSent);
        let achieved_per_s = if duration_s > 0.0 {
            sent as f64 / duration_s
        } else {
            0.0
        };
        // Answers a second between the first answer and the last: a steady latency moves
        // both ends alike, a queue that grows stretches the span.
        let answers = recorder.latency().count();
        let answered_per_s = recorder
            .answers_span_ns()
            .map(|(first, last)| last.saturating_sub(first))
            .filter(|span| *span > 0 && answers > 1)
            .map(|span| round3((answers - 1) as f64 * 1e9 / span as f64));
        let phases = recorder.phases();
        let phases_us = [
            ("dns", &phases.dns),
            ("connect", &phases.connect),
            ("tls", &phases.tls),
            ("ttfb", &phases.ttfb),
            ("total", &phases.total),
            ("warmup_connect", &phases.warmup_connect),
        ]
        .into_iter()
        .map(|(name, h)| (name.to_owned(), PhaseSummary::of(h)))
        .collect();
        let mut summary = Self {
            mode: ctx.mode,
            duration_s: round3(duration_s),
            interrupted: ctx.interrupted,
            requests: RequestSummary {
                total: outcomes.total(),
                ok: outcomes.ok(),
                errors: outcomes.errors(),
                warmup: recorder.warmup_requests(),
            },
            rate: RateSummary {
                target_per_s: ctx.target_rate_per_s,
                achieved_per_s: round3(achieved_per_s),
                answered_per_s,
            },
            latency_corrected: ctx.mode == LoadMode::Open,
            latency_us: Percentiles::of(recorder.latency()),
            service_time_us: Percentiles::of(recorder.service_time()),
            time_to_failure_us: Percentiles::of(recorder.time_to_failure()),
            scheduler_lag_us: Percentiles::of(recorder.scheduler_lag()),
            batch_window: ctx.batch_window.as_ref().map(|setting| BatchWindowSummary {
                setting: setting.clone(),
                used_us: PhaseSummary::of(recorder.batch_windows_us()),
            }),
            phases_us,
            outcomes: outcomes.to_map(),
            backends: recorder
                .backends()
                .iter()
                .map(|b| (b.name.clone(), b.count))
                .collect(),
            backend_latency_us: recorder
                .backends()
                .iter()
                .map(|b| (b.name.clone(), PhaseSummary::of(&b.latency)))
                .collect(),
            connections_opened: recorder.connections_opened(),
            connect_ramp_ms: None,
            reused_requests: recorder.reused_requests(),
            retries: RetrySummary {
                policy: ctx.retry_policy.to_owned(),
                retried: recorder.retried().total(),
                after: recorder.retried().to_map(),
            },
            connection_events: *recorder.connection_events(),
            failure_details: recorder.failure_details().clone(),
            protocol: ctx.protocol.to_owned(),
            goaways: recorder.goaways().to_vec(),
            quic_events: recorder.quic_events().to_vec(),
            generations: recorder
                .generations()
                .iter()
                .map(|g| GenerationSummary {
                    header: ctx
                        .generation_headers
                        .get(g.slot)
                        .cloned()
                        .unwrap_or_default(),
                    generation: g.generation,
                    answers: g.answers,
                    first_answer_s: round_ns(g.first_answer_ns),
                    last_answer_s: round_ns(g.last_answer_ns),
                })
                .collect(),
            abandoned_at_stop: recorder.abandoned_at_stop(),
            bytes_received: recorder.bytes(),
            warnings: Vec::new(),
        };
        summary.warnings = summary.find_warnings(recorder);
        summary
    }

    /// Whether the generator itself fell behind, so that the numbers describe it as much
    /// as the target.
    pub fn generator_fell_behind(&self) -> bool {
        self.lag_too_high() || self.rate_short()
    }

    fn lag_too_high(&self) -> bool {
        self.mode == LoadMode::Open && self.scheduler_lag_us.p99 > LAG_WARNING_US
    }

    /// Whether the generator's lateness is a visible part of the latency it reports: its
    /// scheduler lag p50 is over [`LAG_SHARE_WARNING`] of the latency p50 (and over
    /// [`LAG_FLOOR_US`]).
    pub fn lateness_visible(&self) -> bool {
        let lag = self.scheduler_lag_us.p50;
        self.mode == LoadMode::Open
            && self.latency_us.count > 0
            && lag > LAG_FLOOR_US
            && lag as f64 > LAG_SHARE_WARNING * self.latency_us.p50 as f64
    }

    /// Whether answers came slower than requests went, by more than the noise of the
    /// run's last answers: the server fell behind the schedule, and says so by name.
    fn answers_behind(&self) -> Option<String> {
        let answered = self.rate.answered_per_s?;
        let answers = self.latency_us.count;
        let sent = self.rate.achieved_per_s;
        let share_answered = answers as f64 / self.requests.total.max(1) as f64;
        let expected = sent * share_answered;
        (self.mode == LoadMode::Open
            && !self.interrupted
            && answers >= 10
            && answered < expected * ANSWERS_BEHIND)
            .then(|| {
                format!(
                    "ANSWERS FELL BEHIND: {sent:.1} req/s were sent and the target answered {answered:.1} req/s \
                     (from its first answer to its last); the server, not the \
                     generator, could not keep up, and its queue grew for the whole run (latency p50 {} us)",
                    self.latency_us.p50
                )
            })
    }

    fn rate_short(&self) -> bool {
        match self.rate.target_per_s {
            Some(target) if !self.interrupted && target > 0.0 => {
                self.rate.achieved_per_s < target * RATE_SHORTFALL
            }
            _ => false,
        }
    }

    fn find_warnings(&self, recorder: &Recorder) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.lag_too_high() {
            warnings.push(format!(
                "GENERATOR FELL BEHIND: scheduler lag p99 was {} us (limit {} us); these latencies \
                 partly measure ingressbench itself. Use fewer connections per thread, more --threads, \
                 or a lower rate.",
                self.scheduler_lag_us.p99, LAG_WARNING_US
            ));
        }
        if !self.lag_too_high() && self.lateness_visible() {
            warnings.push(format!(
                "GENERATOR LATENESS: requests went out {} us late at p50 ({:.0}% of the latency p50 of \
                 {} us), and latency includes that lateness. A narrower --batch-window, more --threads \
                 or a lower rate sends closer to the schedule.",
                self.scheduler_lag_us.p50,
                100.0 * self.scheduler_lag_us.p50 as f64 / self.latency_us.p50.max(1) as f64,
                self.latency_us.p50
            ));
        }
        if self.retries.retried > 0 {
            let why = match self.protocol.as_str() {
                "http2" => {
                    "the server did not process them (a GOAWAY below their stream, or \
                     REFUSED_STREAM) or closed a used connection before answering"
                }
                "http3" => {
                    "the server did not process them (a GOAWAY before their stream, \
                     H3_REQUEST_REJECTED, or their 0-RTT data rejected)"
                }
                _ => "the server closed a reused connection as they were sent",
            };
            warnings.push(format!(
                "{} requests were retried after {why} ({}); without retries they would have \
                 failed (--retry-policy none counts them as errors).",
                self.retries.retried,
                self.retries
                    .after
                    .iter()
                    .map(|(k, n)| format!("{n} after `{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if self.abandoned_at_stop > 0 {
            let when = if self.interrupted {
                "0.5 s after the stop"
            } else {
                "the end of the run and its drain"
            };
            warnings.push(format!(
                "WAITING AT THE END: {} requests (or messages, events, calls) were sent and had no \
                 answer by {when}; they count as errors (`waiting_at_end`), with no latency. A server \
                 that accepts and never answers does this, as does a --timeout longer than the run.",
                self.abandoned_at_stop
            ));
        }
        let unanswered = recorder.outcomes().get(crate::Outcome::Unanswered);
        if unanswered > 0 {
            warnings.push(format!(
                "THE SERVER SKIPPED {unanswered}: they were sent and never answered while later ones on \
                 the same connection were (`unanswered`): the server dropped them."
            ));
        }
        if let Some(behind) = self.answers_behind() {
            warnings.push(behind);
        }
        if self.rate_short() {
            let target = self.rate.target_per_s.unwrap_or_default();
            warnings.push(format!(
                "RATE SHORT OF TARGET: achieved {:.1} req/s of {:.1} req/s ({:.1}%). Either the target \
                 could not keep up with the connections given (-c) or the generator fell behind.",
                self.rate.achieved_per_s,
                target,
                100.0 * self.rate.achieved_per_s / target
            ));
        }
        if self.requests.total > 0 && self.requests.ok == 0 {
            if let Some((outcome, n)) = recorder.outcomes().dominant_failure() {
                // The reason seen, else the usual reasons for that outcome.
                let detail = match self.failure_details.get(outcome.name().as_ref()) {
                    Some(seen) => format!(": {seen}"),
                    None => hint_for(&outcome.name()).to_owned(),
                };
                warnings.push(format!(
                    "NO REQUEST SUCCEEDED: {n} of {} ended as `{}`{detail}",
                    self.requests.total,
                    outcome.name(),
                ));
            }
        }
        if self.requests.total > 0 && self.requests.total < MIN_REQUESTS_FOR_P999 {
            warnings.push(format!(
                "only {} requests: p99.9 and above are the largest few values, not a percentile",
                self.requests.total
            ));
        }
        if self.interrupted {
            warnings.push("interrupted: the run was stopped before its planned end".to_owned());
        }
        warnings
    }
}

fn hint_for(outcome: &str) -> &'static str {
    match outcome {
        "refused" => {
            " (nothing is listening at that address: is the server running, is the port right?)"
        }
        "connect_timeout" => " (the address does not answer: check the host, port and --resolve)",
        "dns_error" => " (the host name does not resolve: check it, or pin it with --resolve)",
        "tls_error" => {
            " (check https:// vs http://, --cacert, --sni, or use -k for a self-signed certificate)"
        }
        "malformed" => {
            " (the server does not speak HTTP/1.x on that port: is it TLS? use https://)"
        }
        "read_timeout" => " (the server accepts but does not answer within --timeout)",
        "write_timeout" => {
            " (the server stopped reading: what was sent could not be written within --timeout)"
        }
        _ => "",
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Nanoseconds as seconds, to the microsecond.
fn round_ns(ns: u64) -> f64 {
    (ns / 1_000) as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Outcome, Sample};

    fn recorder_with(outcome: Outcome, n: u64, lag_ns: u64) -> Recorder {
        let mut r = Recorder::new(1_000_000_000);
        for i in 0..n {
            let mut s = Sample::new(i * 1_000_000);
            s.released_at_ns = s.intended_at_ns + lag_ns;
            s.sent_at_ns = s.released_at_ns;
            s.done_at_ns = s.sent_at_ns + 500_000;
            s.outcome = outcome;
            r.record(&s);
        }
        r
    }

    fn ctx(mode: LoadMode, rate: Option<f64>, measured_s: f64) -> SummaryContext {
        SummaryContext {
            mode,
            target_rate_per_s: rate,
            measured_ns: (measured_s * 1e9) as u64,
            interrupted: false,
            retry_policy: "idempotent",
            batch_window: None,
            generation_headers: vec!["x-gen".to_owned()],
            protocol: "http1",
        }
    }

    #[test]
    fn a_clean_run_has_no_warnings() {
        let r = recorder_with(Outcome::Status(200), 2_000, 10_000);
        let s = Summary::new(&r, &ctx(LoadMode::Open, Some(1000.0), 2.0));
        assert_eq!(s.requests.total, 2_000);
        assert_eq!(s.rate.achieved_per_s, 1000.0);
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        assert!(!s.generator_fell_behind());
    }

    #[test]
    fn lag_and_shortfall_are_flagged() {
        let r = recorder_with(Outcome::Status(200), 2_000, 5_000_000);
        let s = Summary::new(&r, &ctx(LoadMode::Open, Some(2000.0), 2.0));
        assert!(s.generator_fell_behind());
        assert!(s
            .warnings
            .iter()
            .any(|w| w.starts_with("GENERATOR FELL BEHIND")));
        assert!(s
            .warnings
            .iter()
            .any(|w| w.starts_with("RATE SHORT OF TARGET")));
    }

    #[test]
    fn total_failure_names_the_cause_and_a_fix() {
        let r = recorder_with(Outcome::Refused, 10, 0);
        let s = Summary::new(&r, &ctx(LoadMode::Closed, None, 1.0));
        let w = s
            .warnings
            .iter()
            .find(|w| w.starts_with("NO REQUEST SUCCEEDED"))
            .unwrap();
        assert!(
            w.contains("refused") && w.contains("is the server running"),
            "{w}"
        );
        assert_eq!(s.outcomes["refused"], 10);
    }
}
