//! WebSocket load (issue #34): connections upgraded through the target (RFC 6455, framed
//! by tungstenite over this engine's own TCP and TLS connections), each sending binary
//! messages on an open-loop schedule; the server echoes them.
//!
//! Every message carries its connection's sequence number and the time it was due, so an
//! echo is timed from when its message was due (no coordinated omission: a message that
//! waited for a reconnect carries the wait), and lost (sent and not echoed within the
//! plan's timeout, or on a WebSocket that ended first), late (echoed after it was counted
//! lost), duplicated (echoed twice) and reordered (echoed after a later one) messages are
//! counted. A close is data: who closed (the server with a close frame, or
//! the connection ending without one, 1006), its code and reason, when, and which backend
//! the WebSocket was on. A cut connection reconnects as its policy says ([`Reconnect`]),
//! and the time from the cut to the next open WebSocket is measured; messages due while no
//! WebSocket was open are sent once one is, unless they are older than the plan's timeout
//! by then (counted as unsent).
//!
//! One thread, one current-thread runtime: WebSocket loads are connections × messages a
//! second in the thousands, not the HTTP engine's hundreds of thousands.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use ingressbench_stats::{BackendId, HistogramUs, Outcome, Phases, Recorder, Sample, Window};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use crate::connection::{Address, Connector, Stream};
use crate::run::{ensure_descriptors, progress_after, summarize};
use crate::timer::{Clock, PreciseClock};
use crate::{Length, LoadError, LoadReport, Mode, Observer, Plan, Protocol, Scheme, Warmup};

/// The most closes kept one by one (a server that closes every WebSocket at once, with
/// reconnects at once, makes thousands a second); past it they are only counted.
pub const MAX_CLOSES_KEPT: usize = 50_000;

/// The smallest message: a sequence number and a due time, eight bytes each.
pub const MESSAGE_HEADER: usize = 16;

/// What a cut WebSocket does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reconnect {
    /// Nothing: the connection stays down to the end of the run.
    Never,
    /// Opens a new WebSocket at once.
    Immediate,
    /// Waits a random time between zero and `first` doubled for each failed attempt
    /// (at most `max`) before each attempt: exponential backoff with full jitter, as
    /// browsers' reconnecting libraries do.
    Backoff {
        /// The first attempt's ceiling.
        first: Duration,
        /// The largest ceiling.
        max: Duration,
    },
}

impl std::fmt::Display for Reconnect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Never => f.write_str("none"),
            Self::Immediate => f.write_str("immediate"),
            Self::Backoff { first, max } => write!(f, "backoff:{first:?}-{max:?}"),
        }
    }
}

impl Reconnect {
    /// `none`, `immediate`, `backoff` (100 ms doubling to 10 s) or `backoff:FIRST-MAX`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "none" | "never" => Ok(Self::Never),
            "immediate" => Ok(Self::Immediate),
            "backoff" => Ok(Self::Backoff {
                first: Duration::from_millis(100),
                max: Duration::from_secs(10),
            }),
            other => {
                let range = other.strip_prefix("backoff:").ok_or_else(|| {
                    format!(
                        "`{s}`: none, immediate, backoff or backoff:FIRST-MAX (backoff:100ms-10s)"
                    )
                })?;
                let (first, max) = range.split_once('-').ok_or_else(|| {
                    format!("`{s}`: write backoff:FIRST-MAX, e.g. backoff:100ms-10s")
                })?;
                let (first, max) = (
                    ingressbench_stats::parse_duration(first)?,
                    ingressbench_stats::parse_duration(max)?,
                );
                if first.is_zero() || max < first {
                    return Err(format!("`{s}`: FIRST above zero and MAX at least FIRST"));
                }
                Ok(Self::Backoff { first, max })
            }
        }
    }

    /// How long to wait before attempt `attempt` (0: the first after a cut); none: do
    /// not reconnect. `rng` is the connection's own generator.
    fn delay(&self, attempt: u32, rng: &mut u64) -> Option<Duration> {
        match *self {
            Self::Never => None,
            Self::Immediate => Some(Duration::ZERO),
            Self::Backoff { first, max } => {
                let ceiling = first
                    .saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
                    .min(max);
                Some(ceiling.mul_f64(uniform(rng)))
            }
        }
    }
}

/// A WebSocket load's own settings ([`crate::Kind::WebSocket`]); the rest is the plan's:
/// its target, TLS, `--resolve`, connections, open-loop rate (messages a second over all
/// connections), duration, warm-up, start, timeout, headers and sample rate.
#[derive(Clone, Debug, PartialEq)]
pub struct WebSocketOptions {
    /// Each message's size, at least [`MESSAGE_HEADER`].
    pub message_bytes: usize,
    /// What a cut WebSocket does.
    pub reconnect: Reconnect,
}

impl Default for WebSocketOptions {
    fn default() -> Self {
        Self {
            message_bytes: 64,
            reconnect: Reconnect::Backoff {
                first: Duration::from_millis(100),
                max: Duration::from_secs(10),
            },
        }
    }
}

/// Who ended a WebSocket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClosedBy {
    /// The server (or the proxy) sent a close frame.
    Server,
    /// The connection ended without one (read as code 1006).
    Abnormal,
}

/// A WebSocket that ended before the run did.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Close {
    /// Seconds from the run's start.
    pub at_s: f64,
    /// Which connection (0-based).
    pub connection: usize,
    /// Who ended it.
    pub by: ClosedBy,
    /// The close frame's code (1006 when there was none).
    pub code: u16,
    /// Its reason, or what ended the connection.
    pub reason: String,
    /// The backend that answered its upgrade (`x-backend`), if it said.
    pub backend: Option<String>,
    /// Messages sent on it that were never echoed.
    pub lost: u64,
    /// How long until its connection had a WebSocket open again, in milliseconds (none:
    /// not before the run ended, or its policy does not reconnect).
    pub reconnected_after_ms: Option<f64>,
}

/// What a WebSocket load measured besides its messages' figures (those are in the
/// [`LoadReport`]'s recorder and summary, a message counted as a request: answered with
/// status 101 when echoed, `read_timeout` when not echoed within the timeout, `eof` or
/// `reset_after_write` when its WebSocket was closed or broken first, `not_sent` when it
/// fell due while none was open and was too old to send when one was).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct WebSocketReport {
    /// Messages sent.
    pub sent: u64,
    /// Messages echoed (once each, in time).
    pub echoed: u64,
    /// Not echoed within the timeout, or sent on a WebSocket that ended before their echo
    /// came.
    pub lost: u64,
    /// Of the lost, echoed after the timeout (the figures keep them as timed out, as an
    /// HTTP client that gave up would).
    pub late: u64,
    /// Echoes of a message already echoed.
    pub duplicated: u64,
    /// Echoes that came after the echo of a later message.
    pub reordered: u64,
    /// Due while no WebSocket was open, and older than the timeout when one was.
    pub unsent: u64,
    /// Sent and not yet echoed when the run ended.
    pub in_flight_at_end: u64,
    /// WebSockets opened.
    pub opened: u64,
    /// Upgrades that failed, by why (`status 502`, `connect: refused`, …).
    pub upgrade_failures: BTreeMap<String, u64>,
    /// WebSockets that ended before the run did.
    pub cut: u64,
    /// The first [`MAX_CLOSES_KEPT`] of them, in order.
    pub closes: Vec<Close>,
    /// From a cut to the next WebSocket open on that connection, in microseconds.
    #[serde(serialize_with = "reconnect_summary")]
    pub reconnect: HistogramUs,
    /// WebSockets open, every 100 ms: (seconds from the start, open).
    pub open_over_time: Vec<(f64, u32)>,
    /// Seconds from the start to the end.
    pub duration_s: f64,
}

fn reconnect_summary<S: serde::Serializer>(h: &HistogramUs, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(5))?;
    map.serialize_entry("count", &h.count())?;
    for (name, p) in [("p50_us", 50.0), ("p90_us", 90.0), ("p99_us", 99.0)] {
        map.serialize_entry(name, &(!h.is_empty()).then(|| h.value_at_percentile(p)))?;
    }
    map.serialize_entry("max_us", &(!h.is_empty()).then(|| h.max()))?;
    map.end()
}

/// What the connections share: the run's clock and what they measured.
struct Run {
    options: WebSocketOptions,
    plan: Plan,
    connector: Connector,
    start: Instant,
    /// When the warm-up ends (messages due before are only counted).
    measured_from_ns: u64,
    end: Instant,
    interval: Duration,
    stop: Arc<AtomicBool>,
    report: RefCell<WebSocketReport>,
    recorder: RefCell<Recorder>,
    samples: RefCell<Vec<Sample>>,
    sample_threshold: u64,
    rng: std::cell::Cell<u64>,
    next_seq: std::cell::Cell<u64>,
    open: std::cell::Cell<u32>,
}

impl Run {
    fn ns(&self, at: Instant) -> u64 {
        crate::connection::nanos(at.saturating_duration_since(self.start))
    }

    /// Records one message's fate, and keeps it as a sample if the random sample picks it
    /// or it failed (as the HTTP engine does). The first message on a WebSocket carries
    /// the phases of opening it, as the first request on a connection does.
    fn record(&self, out: Out, outcome: Outcome, backend: Option<BackendId>, bytes: u64) {
        let now_ns = self.ns(Instant::now());
        let mut sample = Sample::new(out.due_ns);
        sample.seq = self.next_seq.replace(self.next_seq.get() + 1);
        sample.released_at_ns = out.released_ns;
        sample.sent_at_ns = out.sent_ns;
        sample.done_at_ns = if outcome == Outcome::NotSent {
            out.due_ns
        } else {
            now_ns
        };
        sample.outcome = outcome;
        sample.backend = backend;
        sample.bytes = bytes;
        sample.connection_reused = out.opened.is_none();
        sample.phases = out.opened.unwrap_or_default();
        sample.phases.ttfb_ns = sample.done_at_ns.saturating_sub(out.sent_ns);
        sample.warmup = out.due_ns < self.measured_from_ns;
        self.recorder.borrow_mut().record(&sample);
        if sample.warmup || self.sample_threshold == 0 || outcome == Outcome::NotSent {
            return;
        }
        let mut x = self.rng.get();
        let chosen = uniform(&mut x) * u64::MAX as f64 <= self.sample_threshold as f64;
        self.rng.set(x);
        if chosen || !outcome.is_ok() {
            sample.in_sample = chosen;
            self.samples.borrow_mut().push(sample);
        }
    }
}

/// Runs a WebSocket plan ([`crate::Kind::WebSocket`]) to its end or until `stop` is set,
/// giving windows and samples to `observer` as the HTTP engine does.
pub(crate) fn run(
    plan: &Plan,
    options: &WebSocketOptions,
    stop: Arc<AtomicBool>,
    observer: &mut dyn Observer,
) -> Result<LoadReport, LoadError> {
    plan.validate()?;
    let (Mode::Open { rate_per_s }, Length::Duration(length)) = (&plan.mode, plan.length) else {
        return Err(LoadError::InvalidPlan {
            field: "-R/--rate".into(),
            reason: "a WebSocket load sends messages at a rate for a duration".into(),
        });
    };
    let rate_per_s = *rate_per_s;
    let warmup = match plan.warmup {
        Warmup::Duration(d) => d,
        _ => Duration::ZERO,
    };
    // A connection and a timer each.
    ensure_descriptors(plan.connections * 2)?;
    let tls = match plan.target.scheme {
        Scheme::Https => Some((
            crate::tls::client_config_for(&plan.tls, Protocol::Http1)?,
            crate::tls::server_name(&plan.tls, &plan.target.host)?,
        )),
        Scheme::Http => None,
    };
    let fixed = plan.resolve.iter().find_map(|r| r.applies_to(&plan.target));
    let address = match (fixed, plan.target.ip()) {
        (Some(addr), _) => Address::Fixed(addr, "from --resolve"),
        (None, Some(ip)) => Address::Fixed((ip, plan.target.port).into(), "the URL's address"),
        (None, None) => Address::Lookup {
            host: plan.target.host.clone(),
            port: plan.target.port,
        },
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LoadError::Runtime)?;
    let start = plan
        .start
        .unwrap_or_else(|| Instant::now() + Duration::from_millis(20));
    let run = Rc::new(Run {
        options: options.clone(),
        plan: plan.clone(),
        connector: Connector::new(address, tls),
        start,
        measured_from_ns: crate::connection::nanos(warmup),
        end: start + warmup + length,
        interval: Duration::from_secs_f64(plan.connections as f64 / rate_per_s),
        stop: stop.clone(),
        report: RefCell::new(WebSocketReport::default()),
        recorder: RefCell::new(Recorder::new(crate::connection::nanos(plan.window))),
        samples: RefCell::new(Vec::new()),
        sample_threshold: if plan.sample_rate >= 1.0 {
            u64::MAX
        } else {
            (plan.sample_rate.max(0.0) * u64::MAX as f64) as u64
        },
        rng: std::cell::Cell::new(0x2545_F491_4F6C_DD1D),
        next_seq: std::cell::Cell::new(0),
        open: std::cell::Cell::new(0),
    });
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let tasks: Vec<_> = (0..plan.connections)
            .map(|index| tokio::task::spawn_local(connection(run.clone(), index)))
            .collect();
        let sampler = tokio::task::spawn_local(sample_open(run.clone()));
        let mut cumulative = HistogramUs::new();
        let (mut requests, mut errors) = (0u64, 0u64);
        let mut pass = |finished: Vec<Window>, observer: &mut dyn Observer| {
            let samples = std::mem::take(&mut *run.samples.borrow_mut());
            if !samples.is_empty() {
                observer.samples(&samples, &run.recorder.borrow().backend_names());
            }
            for window in finished {
                cumulative.merge(&window.latency);
                requests += window.outcomes.total();
                errors += window.outcomes.errors();
                observer.window(&window);
                observer.progress(&progress_after(&window, &cumulative, requests, errors));
            }
        };
        // Windows close on the clock, messages or not, and go to the observer as they do.
        while tasks.iter().any(|t| !t.is_finished()) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let finished = {
                let mut recorder = run.recorder.borrow_mut();
                recorder.roll_windows(run.ns(Instant::now()).min(run.ns(run.end)));
                recorder.take_finished_windows()
            };
            pass(finished, observer);
        }
        sampler.abort();
        let last = run.recorder.borrow_mut().finish_windows();
        pass(last, observer);
    });
    let mut report = run.report.take();
    report.duration_s = run
        .end
        .min(Instant::now())
        .saturating_duration_since(start)
        .as_secs_f64();
    let recorder = run.recorder.replace(Recorder::new(1));
    let interrupted = stop.load(Ordering::Relaxed);
    let summary = summarize(&recorder, plan, Some(rate_per_s), interrupted);
    Ok(LoadReport {
        recorder,
        summary,
        websocket: Some(Box::new(report)),
    })
}

/// Samples how many WebSockets are open every 100 ms until the run's end.
async fn sample_open(run: Rc<Run>) {
    let mut at = run.start;
    while at < run.end {
        tokio::time::sleep_until(at.into()).await;
        let t = at.saturating_duration_since(run.start).as_secs_f64();
        run.report
            .borrow_mut()
            .open_over_time
            .push((t, run.open.get()));
        at += Duration::from_millis(100);
    }
}

/// When messages go: the engine's precise clock (a timer of its own per connection; tokio's
/// timer wakes on whole milliseconds, late by up to one), or tokio's if the system gives no
/// timer.
enum Pacer {
    Precise(Box<PreciseClock>),
    Tokio,
}

impl Pacer {
    fn new(origin: Instant, batch: crate::BatchWindow) -> Self {
        PreciseClock::new(origin, batch).map_or(Self::Tokio, |c| Self::Precise(Box::new(c)))
    }

    async fn sleep_until(&mut self, deadline: Instant) {
        match self {
            Self::Precise(clock) => clock.sleep_until(deadline).await,
            Self::Tokio => tokio::time::sleep_until(deadline.into()).await,
        }
    }
}

/// How a WebSocket's conversation ended.
enum Ended {
    /// The run is over (or stopped): close it as a client does.
    RunOver,
    /// Cut, with what the close said.
    Cut {
        by: ClosedBy,
        code: u16,
        reason: String,
    },
}

/// A message sent and not yet echoed: when it was due, when the clock let it go and when
/// it went, from the start; the first on a WebSocket, the phases of opening it.
#[derive(Clone, Copy)]
struct Out {
    due_ns: u64,
    released_ns: u64,
    sent_ns: u64,
    opened: Option<Phases>,
}

impl Out {
    /// A message that was never sent.
    fn unsent(due_ns: u64) -> Self {
        Self {
            due_ns,
            released_ns: due_ns,
            sent_ns: due_ns,
            opened: None,
        }
    }
}

/// One connection's WebSockets, one after another, to the end of the run.
async fn connection(run: Rc<Run>, index: usize) {
    let connections = run.plan.connections as f64;
    // Staggered over one interval, so the messages of all connections are evenly spread.
    let mut due = run.start + run.interval.mul_f64(index as f64 / connections);
    let mut seq = 0u64;
    let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ ((index as u64 + 1) << 17);
    let mut cut_at: Option<Instant> = None;
    // The close that cut it, in the report's list.
    let mut cut_by: Option<usize> = None;
    let mut attempt = 0u32;
    let mut clock = Pacer::new(run.start, run.plan.batch_window);
    tokio::time::sleep_until(run.start.into()).await;
    while Instant::now() < run.end && !run.stop.load(Ordering::Relaxed) {
        match open(&run).await {
            Ok((mut ws, backend_name, phases)) => {
                attempt = 0;
                if let Some(cut) = cut_at.take() {
                    let mut report = run.report.borrow_mut();
                    report
                        .reconnect
                        .record_ns(crate::connection::nanos(cut.elapsed()));
                    if let Some(close) = cut_by.take().and_then(|i| report.closes.get_mut(i)) {
                        close.reconnected_after_ms = Some(cut.elapsed().as_secs_f64() * 1e3);
                    }
                }
                let backend = backend_name
                    .as_deref()
                    .map(|name| run.recorder.borrow_mut().backend_id(name.as_bytes()));
                run.report.borrow_mut().opened += 1;
                run.open.set(run.open.get() + 1);
                let mut outstanding = BTreeMap::new();
                let ended = converse(
                    &run,
                    (&mut ws, backend, Some(phases)),
                    (&mut clock, &mut due, &mut seq),
                    &mut outstanding,
                )
                .await;
                run.open.set(run.open.get() - 1);
                match ended {
                    Ended::RunOver => {
                        finish(&run, ws, &mut outstanding, backend).await;
                        return;
                    }
                    Ended::Cut { by, code, reason } => {
                        let outcome = match by {
                            ClosedBy::Server => Outcome::Eof,
                            ClosedBy::Abnormal => Outcome::ResetAfterWrite,
                        };
                        for out in outstanding.values() {
                            run.record(*out, outcome, backend, 0);
                        }
                        let mut report = run.report.borrow_mut();
                        report.lost += outstanding.len() as u64;
                        report.cut += 1;
                        cut_at = Some(Instant::now());
                        cut_by = None;
                        if report.closes.len() < MAX_CLOSES_KEPT {
                            report.closes.push(Close {
                                at_s: run.start.elapsed().as_secs_f64(),
                                connection: index,
                                by,
                                code,
                                reason,
                                backend: backend_name,
                                lost: outstanding.len() as u64,
                                reconnected_after_ms: None,
                            });
                            cut_by = Some(report.closes.len() - 1);
                        }
                    }
                }
            }
            Err(why) => {
                *run.report
                    .borrow_mut()
                    .upgrade_failures
                    .entry(why)
                    .or_default() += 1;
                cut_at.get_or_insert_with(Instant::now);
            }
        }
        match run.options.reconnect.delay(attempt, &mut rng) {
            Some(wait) => {
                attempt += 1;
                tokio::time::sleep(wait).await;
            }
            None => break,
        }
    }
    // Never reconnected: what fell due from here to the end was never sent.
    while due < run.end {
        run.report.borrow_mut().unsent += 1;
        run.record(Out::unsent(run.ns(due)), Outcome::NotSent, None, 0);
        due += run.interval;
    }
}

/// Opens a WebSocket: a connection, then the upgrade; the backend the answer names, and
/// the connection's phases.
async fn open(run: &Run) -> Result<(WebSocketStream<Stream>, Option<String>, Phases), String> {
    let plan = &run.plan;
    let mut phases = Phases::default();
    let stream = run
        .connector
        .connect(&mut phases)
        .await
        .map_err(|outcome| {
            run.connector.take_failure().map_or_else(
                || format!("connect: {}", outcome.name()),
                |why| format!("connect: {why}"),
            )
        })?;
    let scheme = match plan.target.scheme {
        Scheme::Https => "wss",
        Scheme::Http => "ws",
    };
    let url = format!("{scheme}://{}{}", plan.target.authority(), plan.target.path);
    let mut request = url
        .into_client_request()
        .map_err(|e| format!("request: {e}"))?;
    for (name, value) in &plan.request.headers {
        let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) else {
            continue;
        };
        request.headers_mut().insert(name, value);
    }
    let upgrade = tokio_tungstenite::client_async_with_config(
        request,
        stream,
        Some(frame_limits(run.options.message_bytes)),
    );
    let (ws, answer) = match tokio::time::timeout(plan.timeout, upgrade).await {
        Err(_) => return Err("upgrade: timed out".into()),
        Ok(Err(WsError::Http(answer))) => {
            return Err(format!("status {}", answer.status().as_u16()))
        }
        Ok(Err(e)) => return Err(format!("upgrade: {e}")),
        Ok(Ok(done)) => done,
    };
    let backend = answer
        .headers()
        .get(plan.backend_header.as_str())
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok((ws, backend, phases))
}

/// The largest message or frame the client takes: what it sends, with room for a
/// server's own small messages, so that an oversized frame ends the WebSocket (counted
/// by its kind) instead of the client's memory growing with it.
fn frame_limits(message_bytes: usize) -> WebSocketConfig {
    let most = message_bytes.max(64 << 10) * 2;
    WebSocketConfig::default()
        .max_message_size(Some(most))
        .max_frame_size(Some(most))
}

/// How many messages counted lost on a live WebSocket are remembered, so that a late echo
/// is told from a duplicate.
const EXPIRED_KEPT: usize = 1 << 16;

/// Sends the messages that fall due and reads their echoes until the run ends or the
/// WebSocket is cut. `outstanding` holds the messages sent and not yet echoed (by
/// sequence number).
async fn converse(
    run: &Run,
    (ws, backend, mut opened): (
        &mut WebSocketStream<Stream>,
        Option<BackendId>,
        Option<Phases>,
    ),
    (clock, due, seq): (&mut Pacer, &mut Instant, &mut u64),
    outstanding: &mut BTreeMap<u64, Out>,
) -> Ended {
    let timeout = run.plan.timeout;
    // What fell due while no WebSocket was open: too old to send, or sent now.
    let now = Instant::now();
    while *due + timeout < now && *due < run.end {
        run.report.borrow_mut().unsent += 1;
        run.record(Out::unsent(run.ns(*due)), Outcome::NotSent, None, 0);
        *due += run.interval;
    }
    let mut highest: Option<u64> = None;
    let mut expired = BTreeSet::new();
    loop {
        if run.stop.load(Ordering::Relaxed) || *due >= run.end {
            return Ended::RunOver;
        }
        tokio::select! {
            biased;
            message = ws.next() => match message {
                Some(Ok(Message::Binary(echo))) if echo.len() >= MESSAGE_HEADER => {
                    let number = u64::from_be_bytes(echo[..8].try_into().unwrap_or_default());
                    if let Some(out) = outstanding.remove(&number) {
                        run.record(out, Outcome::Status(101), backend, echo.len() as u64);
                        let mut report = run.report.borrow_mut();
                        report.echoed += 1;
                        if highest.is_some_and(|h| number < h) {
                            report.reordered += 1;
                        }
                        highest = Some(highest.map_or(number, |h| h.max(number)));
                    } else if expired.remove(&number) {
                        run.report.borrow_mut().late += 1;
                    } else {
                        run.report.borrow_mut().duplicated += 1;
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    let (code, reason) = frame.map_or((1005, String::new()), |f: CloseFrame| {
                        (u16::from(f.code), f.reason.to_string())
                    });
                    return Ended::Cut { by: ClosedBy::Server, code, reason };
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    return Ended::Cut { by: ClosedBy::Abnormal, code: 1006, reason: e.to_string() };
                }
                None => {
                    return Ended::Cut {
                        by: ClosedBy::Abnormal,
                        code: 1006,
                        reason: "the connection ended without a close".into(),
                    };
                }
            },
            () = clock.sleep_until(*due) => {
                let due_ns = run.ns(*due);
                let released_ns = run.ns(Instant::now());
                // A buffer each: the frame owns its bytes until they are written.
                let mut frame = BytesMut::zeroed(run.options.message_bytes);
                frame[..8].copy_from_slice(&seq.to_be_bytes());
                frame[8..16].copy_from_slice(&due_ns.to_be_bytes());
                let message = Message::Binary(frame.freeze());
                let sent_ns = run.ns(Instant::now());
                if let Err(e) = ws.send(message).await {
                    return Ended::Cut { by: ClosedBy::Abnormal, code: 1006, reason: e.to_string() };
                }
                outstanding.insert(*seq, Out { due_ns, released_ns, sent_ns, opened: opened.take() });
                run.report.borrow_mut().sent += 1;
                *seq += 1;
                *due += run.interval;
                // What has waited longer than the timeout is lost, unless it comes late.
                let now_ns = run.ns(Instant::now());
                let timeout_ns = crate::connection::nanos(timeout);
                while let Some(entry) = outstanding.first_entry() {
                    if entry.get().sent_ns + timeout_ns >= now_ns {
                        break;
                    }
                    let (number, out) = entry.remove_entry();
                    expired.insert(number);
                    run.record(out, Outcome::ReadTimeout, backend, 0);
                    run.report.borrow_mut().lost += 1;
                    if expired.len() > EXPIRED_KEPT {
                        expired.pop_first();
                    }
                }
            }
        }
    }
}

/// Ends a WebSocket at the end of the run: a close (1000), then the echoes still coming
/// until the server's close or one timeout (at most a second); what is still out then is
/// in flight at the end, as requests a stopped HTTP run abandons.
async fn finish(
    run: &Run,
    mut ws: WebSocketStream<Stream>,
    outstanding: &mut BTreeMap<u64, Out>,
    backend: Option<BackendId>,
) {
    let _ = ws.close(None).await;
    let deadline = Instant::now() + run.plan.timeout.min(Duration::from_secs(1));
    while let Ok(Some(Ok(message))) = tokio::time::timeout_at(deadline.into(), ws.next()).await {
        if let Message::Binary(echo) = message {
            if echo.len() >= MESSAGE_HEADER {
                let number = u64::from_be_bytes(echo[..8].try_into().unwrap_or_default());
                if let Some(out) = outstanding.remove(&number) {
                    run.record(out, Outcome::Status(101), backend, echo.len() as u64);
                    run.report.borrow_mut().echoed += 1;
                }
            }
        }
    }
    run.report.borrow_mut().in_flight_at_end += outstanding.len() as u64;
    run.recorder
        .borrow_mut()
        .record_abandoned(outstanding.len() as u64);
}

/// A uniform draw in [0, 1) from `state` (xorshift64*).
fn uniform(state: &mut u64) -> f64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_policies_parse_and_back_off_with_jitter_within_their_ceiling() {
        assert_eq!(Reconnect::parse("none"), Ok(Reconnect::Never));
        assert_eq!(Reconnect::parse("immediate"), Ok(Reconnect::Immediate));
        let policy = Reconnect::parse("backoff:50ms-1s").unwrap();
        assert!(Reconnect::parse("backoff:1s-50ms").is_err());
        assert!(Reconnect::parse("sometimes")
            .unwrap_err()
            .contains("backoff:FIRST-MAX"));
        let mut rng = 7;
        for attempt in 0..12 {
            let ceiling = Duration::from_millis(50 << attempt.min(5)).min(Duration::from_secs(1));
            let mut longest = Duration::ZERO;
            for _ in 0..200 {
                let d = policy.delay(attempt, &mut rng).unwrap();
                assert!(d <= ceiling, "{attempt}: {d:?} over {ceiling:?}");
                longest = longest.max(d);
            }
            // Jittered over the whole range, not always at its ceiling.
            assert!(longest > ceiling.mul_f64(0.8), "{attempt}: {longest:?}");
        }
        assert_eq!(Reconnect::Never.delay(0, &mut rng), None);
    }
}
