//! What a run hands back: to its observer while it goes ([`Observer`]: each window, the
//! samples, [`Progress`]), and at its end ([`LoadReport`], its summary made by
//! [`summarize`]). Every kind of load (requests, streams, several processes) reports
//! through these.

use std::time::Duration;

use ingressbench_stats::{
    HistogramUs, LoadMode, Recorder, Sample, Summary, SummaryContext, Window,
};

use crate::{Mode, Plan};

/// A live view of a run, given to the observer about once a second.
#[derive(Clone, Debug)]
pub struct Progress {
    /// Time since the run started (warm-up included).
    pub elapsed: Duration,
    /// Measured requests finished so far.
    pub requests: u64,
    /// Of which failed.
    pub errors: u64,
    /// Requests finished in the last window, per second.
    pub rate_per_s: f64,
    /// Median latency so far, in microseconds.
    pub p50_us: u64,
    /// 99th percentile so far, in microseconds.
    pub p99_us: u64,
}

/// Receives what a run produces while it goes, on the calling thread.
pub trait Observer {
    /// One closed interval window, merged over all workers, in order.
    fn window(&mut self, _window: &Window) {}
    /// A batch of sampled requests (in the order they finished, per worker); `backends`
    /// names the backend ids they carry.
    fn samples(&mut self, _samples: &[Sample], _backends: &[String]) {}
    /// The state of the run, after each window.
    fn progress(&mut self, _progress: &Progress) {}
}

/// An observer that ignores everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoObserver;

impl Observer for NoObserver {}

/// What a finished (or interrupted) run measured.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// Everything recorded, merged over workers.
    pub recorder: Recorder,
    /// The summary of it.
    pub summary: Summary,
    /// A WebSocket or event stream load's closes, reconnects and message accounting.
    pub stream: Option<Box<ingressbench_results::stream::StreamFile>>,
}

/// The progress line after `window`.
pub(crate) fn progress_after(
    window: &Window,
    cumulative: &HistogramUs,
    requests: u64,
    errors: u64,
) -> Progress {
    Progress {
        elapsed: Duration::from_nanos(window.end_ns()),
        requests,
        errors,
        rate_per_s: window.outcomes.total() as f64 * 1e9 / window.width_ns as f64,
        p50_us: cumulative.value_at_percentile(50.0),
        p99_us: cumulative.value_at_percentile(99.0),
    }
}

/// The summary of what `recorder` holds, against `target_rate_per_s`.
pub(crate) fn summarize(
    recorder: &Recorder,
    plan: &Plan,
    target_rate_per_s: Option<f64>,
    interrupted: bool,
) -> Summary {
    // Open loop: the span the schedule covered (first intended send to one slot after the
    // last), so that answers still coming in after the last send do not count as a
    // shortfall; every request due was either sent or counted `not_sent`, and only those
    // make the rate short. Otherwise: from the first request's intended time to the last
    // one's end.
    let measured_ns = match target_rate_per_s {
        Some(rate) => recorder.schedule_span_ns(rate).unwrap_or(0),
        None => recorder
            .span_ns()
            .map_or(0, |(first, last)| last.saturating_sub(first)),
    };
    let mode = match plan.mode {
        Mode::Open { .. } => LoadMode::Open,
        Mode::Closed => LoadMode::Closed,
        Mode::Sequential { .. } => LoadMode::Sequential,
    };
    let ctx = SummaryContext {
        mode,
        target_rate_per_s,
        measured_ns,
        interrupted,
        retry_policy: plan.retry.name(),
        batch_window: plan.rate_per_s().map(|_| plan.batch_window.to_string()),
        generation_headers: plan.generation_headers.clone(),
        protocol: plan.protocol.name(),
    };
    Summary::new(recorder, &ctx)
}
