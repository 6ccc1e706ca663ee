//! What the long-lived loads share (issue #34): WebSockets ([`crate::websocket`]) and
//! server-sent events ([`crate::sse`]) keep one connection each open for the run, count
//! every message or event by its sequence number, record each into the run's
//! [`Recorder`] as a request (timed from when it was due), and report the closes, the
//! reconnects and the accounting in a [`StreamFile`]. Cut connections come back as
//! their [`Reconnect`] policy says.
//!
//! One thread, one current-thread runtime: these loads are connections × messages a
//! second in the thousands, not the HTTP engine's hundreds of thousands.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use ingressbench_stats::{BackendId, HistogramUs, Outcome, Phases, Recorder, Sample, Window};

pub(crate) mod options;
pub(crate) use options::uniform;

use crate::connection::ensure_descriptors;
use crate::connection::{Address, Connector, Stream};
use crate::report::{progress_after, summarize};
use crate::timer::{Clock, PreciseClock};
use crate::{Length, LoadError, LoadReport, Mode, Observer, Plan, Protocol, Scheme, Warmup};

/// The file a long-lived load fills and writes (`websocket.json`, …), with its parts: one
/// definition, the report's too. At most [`MAX_CLOSES_KEPT`] closes are kept one by one
/// (a server that closes every WebSocket at once, with reconnects at once, makes thousands
/// a second); past it they are only counted.
pub use ingressbench_results::stream::{
    Close, ClosedBy, Reconnects, StreamFile, StreamKind, MAX_CLOSES_KEPT,
};

pub use options::{
    Reconnect, StreamOptions, IMMEDIATE_RETRY, IMMEDIATE_RETRY_MAX, MESSAGE_HEADER, STABLE_UPTIME,
};

/// Why [`Run::bounded`] gave up on a write or a close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bound {
    /// Its timeout, or the run's drain, passed: the peer stopped reading.
    TimedOut,
    /// The run was stopped.
    Stopped,
}

/// What a close said of itself, besides its reason.
pub(crate) enum Said {
    /// Nothing: an event stream's end, a broken connection, a gRPC connection's GOAWAY.
    Nothing,
    /// A WebSocket close frame's code (1006 for none).
    Code(u16),
    /// The status a gRPC stream ended with (`grpc:unavailable`).
    Status(String),
}

/// What the connections share: the run's clock and what they measured.
pub(crate) struct Run {
    pub(crate) options: StreamOptions,
    pub(crate) plan: Plan,
    pub(crate) connector: Connector,
    pub(crate) start: Instant,
    /// When the warm-up ends (messages due before are only counted).
    pub(crate) measured_from_ns: u64,
    pub(crate) end: Instant,
    pub(crate) interval: Duration,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) report: RefCell<StreamFile>,
    /// From each cut to the next open on its connection (the file's `reconnect`, at the
    /// end).
    pub(crate) reconnects: RefCell<HistogramUs>,
    pub(crate) recorder: RefCell<Recorder>,
    pub(crate) samples: RefCell<Vec<Sample>>,
    pub(crate) sample_threshold: u64,
    pub(crate) rng: std::cell::Cell<u64>,
    pub(crate) next_seq: std::cell::Cell<u64>,
    pub(crate) open: std::cell::Cell<u32>,
    /// When the stop was first seen (Ctrl-C, SIGTERM): the run's end from then on.
    pub(crate) stopped_at: std::cell::Cell<Option<Instant>>,
}

impl Run {
    pub(crate) fn ns(&self, at: Instant) -> u64 {
        crate::connection::nanos(at.saturating_duration_since(self.start))
    }

    /// Records one message's fate, and keeps it as a sample if the random sample picks it
    /// or it failed (as the HTTP engine does). The first message on a WebSocket (event on a
    /// stream) carries the phases of opening it, as the first request on a connection does.
    pub(crate) fn record(
        &self,
        out: Out,
        outcome: Outcome,
        backend: Option<BackendId>,
        bytes: u64,
    ) {
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
        sample.retried_after = out.retried_after;
        sample.phases = out.opened.unwrap_or_default();
        sample.phases.ttfb_ns = sample.done_at_ns.saturating_sub(out.sent_ns);
        sample.warmup = out.due_ns < self.measured_from_ns;
        self.report.borrow_mut().warmup += u64::from(sample.warmup);
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

/// One connection's cuts: since when it has had no WebSocket (event stream) open, the
/// close that cut it in the report's list, and its reconnect attempts.
pub(crate) struct Downtime {
    connection: usize,
    since: Option<Instant>,
    /// The close that cut it, in the report's list, until it is open again.
    pub(crate) close: Option<usize>,
    attempt: u32,
    /// When the connection last opened, while it is open.
    opened_at: Option<Instant>,
    rng: u64,
}

impl Downtime {
    pub(crate) fn new(connection: usize) -> Self {
        Self {
            connection,
            since: None,
            close: None,
            attempt: 0,
            opened_at: None,
            rng: 0x9E37_79B9_7F4A_7C15_u64 ^ ((connection as u64 + 1) << 17),
        }
    }

    /// Waits as the policy says before the next attempt; false: it does not reconnect.
    pub(crate) async fn wait(&mut self, run: &Run) -> bool {
        match run.options.reconnect.delay(self.attempt, &mut self.rng) {
            Some(wait) => {
                self.attempt += 1;
                tokio::time::sleep(wait).await;
                true
            }
            None => false,
        }
    }
}

impl Run {
    /// A WebSocket (event stream) is open on the connection `down` follows, answered by
    /// `backend`: the time since its cut is a reconnect. Returns the backend's id.
    pub(crate) fn reopened(&self, down: &mut Downtime, backend: Option<&str>) -> Option<BackendId> {
        down.opened_at = Some(Instant::now());
        let mut report = self.report.borrow_mut();
        if let Some(cut) = down.since.take() {
            (self.reconnects.borrow_mut()).record_ns(crate::connection::nanos(cut.elapsed()));
            if let Some(close) = down.close.take().and_then(|i| report.closes.get_mut(i)) {
                close.reconnected_after_ms = Some(cut.elapsed().as_secs_f64() * 1e3);
            }
        }
        report.opened += 1;
        self.open.set(self.open.get() + 1);
        backend.map(|name| self.recorder.borrow_mut().backend_id(name.as_bytes()))
    }

    /// The connection `down` follows was cut: who closed, what the close said, the
    /// reason; the backend it was on and the messages lost with it.
    pub(crate) fn cut(
        &self,
        down: &mut Downtime,
        (by, said, reason): (ClosedBy, Said, String),
        backend: Option<String>,
        lost: u64,
    ) {
        self.open.set(self.open.get() - 1);
        let mut report = self.report.borrow_mut();
        report.cut += 1;
        // Only a connection that stayed up starts its policy again; one that ended at once
        // is one more failed attempt.
        if (down.opened_at.take()).is_some_and(|at| at.elapsed() >= STABLE_UPTIME) {
            down.attempt = 0;
        }
        down.since = Some(Instant::now());
        down.close = None;
        if report.closes.len() < MAX_CLOSES_KEPT {
            let (code, grpc_status) = match said {
                Said::Nothing => (None, None),
                Said::Code(code) => (Some(code), None),
                Said::Status(status) => (None, Some(status)),
            };
            report.closes.push(Close {
                at_s: self.start.elapsed().as_secs_f64(),
                connection: down.connection,
                by,
                code,
                reason,
                grpc_status,
                backend,
                lost,
                reconnected_after_ms: None,
            });
            down.close = Some(report.closes.len() - 1);
        }
    }

    /// Settles a message (event, call) that never came by the end of the run: `unanswered`
    /// when a later one on its connection came (`skipped`: the server dropped it), else
    /// `waiting_at_end`; both failures in every figure, each counted once (its `sent` is
    /// the caller's).
    pub(crate) fn never_came(&self, out: Out, skipped: bool, backend: Option<BackendId>) {
        let outcome = if skipped {
            Outcome::Unanswered
        } else {
            Outcome::WaitingAtEnd
        };
        self.record(out, outcome, backend, 0);
        let mut report = self.report.borrow_mut();
        if skipped {
            report.lost += 1;
            report.unanswered += 1;
        } else {
            report.in_flight_at_end += 1;
        }
    }

    /// When the answers still coming after the run's end stop being waited for: a
    /// timeout after the end, at most a second. A stopped run ended when the stop was
    /// first seen, not at its planned end (before, a WebSocket stopped a minute into a
    /// two-minute run waited out the other minute for its echoes).
    pub(crate) fn drain_deadline(&self) -> Instant {
        let end = match self.stopped_at.get() {
            Some(at) => at.min(self.end),
            None if self.stop.load(Ordering::Relaxed) => {
                let now = Instant::now();
                self.stopped_at.set(Some(now));
                now.min(self.end)
            }
            None => self.end,
        };
        end + self.plan.timeout.min(Duration::from_secs(1))
    }

    /// Runs `io` (a write, a close) until it is done, a timeout passes, the run's drain
    /// is over, or the run is stopped: no peer holds a connection, or the run, longer.
    pub(crate) async fn bounded<T>(
        &self,
        io: impl std::future::Future<Output = T>,
    ) -> Result<T, Bound> {
        let mut io = std::pin::pin!(io);
        // Most writes end at once: no timer for them (this is on every message's path).
        if let Some(done) = futures_util::FutureExt::now_or_never(io.as_mut()) {
            return Ok(done);
        }
        let deadline = (Instant::now() + self.plan.timeout).min(self.drain_deadline());
        let stopped = async {
            while !self.stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::select! {
            done = io => Ok(done),
            () = tokio::time::sleep_until(deadline.into()) => Err(Bound::TimedOut),
            () = stopped => Err(Bound::Stopped),
        }
    }

    /// A connection to the target (TCP, and TLS for https), its phases in `phases`; why
    /// not (`connect: refused …`).
    pub(crate) async fn connect(&self, phases: &mut Phases) -> Result<Stream, String> {
        self.connector.connect(phases).await.map_err(|outcome| {
            self.connector.take_failure().map_or_else(
                || format!("connect: {}", outcome.name()),
                |why| format!("connect: {why}"),
            )
        })
    }

    /// An attempt to open one failed, with why.
    pub(crate) fn failed(&self, down: &mut Downtime, why: String) {
        *self
            .report
            .borrow_mut()
            .upgrade_failures
            .entry(why)
            .or_default() += 1;
        down.since.get_or_insert_with(Instant::now);
    }
}

/// When messages go: the engine's precise clock (a timer of its own per connection; tokio's
/// timer wakes on whole milliseconds, late by up to one), or tokio's if the system gives no
/// timer.
pub(crate) enum Pacer {
    Precise(Box<PreciseClock>),
    Tokio,
}

impl Pacer {
    pub(crate) fn new(origin: Instant, batch: crate::BatchWindow) -> Self {
        PreciseClock::new(origin, batch).map_or(Self::Tokio, |c| Self::Precise(Box::new(c)))
    }

    pub(crate) async fn sleep_until(&mut self, deadline: Instant) {
        match self {
            Self::Precise(clock) => clock.sleep_until(deadline).await,
            Self::Tokio => tokio::time::sleep_until(deadline.into()).await,
        }
    }
}

/// A message sent and not yet echoed: when it was due, when the clock let it go and when
/// it went, from the start; the first on a WebSocket, the phases of opening it.
#[derive(Clone, Copy)]
pub(crate) struct Out {
    pub(crate) due_ns: u64,
    pub(crate) released_ns: u64,
    pub(crate) sent_ns: u64,
    pub(crate) opened: Option<Phases>,
    /// Sent again after this answer said the server never processed it (a gRPC call
    /// refused by a GOAWAY, as gRPC's clients retry it).
    pub(crate) retried_after: Option<Outcome>,
}

impl Out {
    /// A message that was never sent.
    pub(crate) fn unsent(due_ns: u64) -> Self {
        Self {
            due_ns,
            released_ns: due_ns,
            sent_ns: due_ns,
            opened: None,
            retried_after: None,
        }
    }
}

/// One connection's numbered messages that the server sends on the client's schedule (an
/// event stream's events, a gRPC server stream's messages): which fell due when, and
/// which have been settled. Message N is due at the first's due time + N × the run's
/// interval; one that has not come a timeout after it was due is lost (late if it comes
/// after), one that comes twice is duplicated, and those a resumed stream skipped (its
/// first id past the last one seen) are lost with the cut.
pub(crate) struct Numbered {
    /// Message 0's due time.
    first: Instant,
    /// How many fall due before the run ends.
    count: u64,
    /// Every message below this one has come or been counted lost.
    next: u64,
    /// Counted lost on the clock; one may still come (late).
    expired: BTreeSet<u64>,
    /// Came past `next` on a live stream: the ones between may still come (reordered),
    /// until their timeout.
    ahead: BTreeSet<u64>,
    /// The highest id that came.
    highest: Option<u64>,
    /// The last id seen (what a resumed stream asks to follow).
    last_id: Option<u64>,
}

impl Numbered {
    /// Connection `index`'s messages: staggered over one interval, so the messages of all
    /// connections are evenly spread, to the run's end.
    pub(crate) fn new(run: &Run, index: usize) -> Self {
        let first = run.start
            + run
                .interval
                .mul_f64(index as f64 / run.plan.connections as f64);
        let count = if first < run.end {
            (run.end - first)
                .as_nanos()
                .div_ceil(run.interval.as_nanos().max(1)) as u64
        } else {
            0
        };
        Self {
            first,
            count,
            next: 0,
            expired: BTreeSet::new(),
            ahead: BTreeSet::new(),
            highest: None,
            last_id: None,
        }
    }

    /// How many fall due before the run ends.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// The last id seen.
    pub(crate) fn last_id(&self) -> Option<u64> {
        self.last_id
    }

    /// Whether some are still to come (and the run was not stopped).
    pub(crate) fn to_come(&self, run: &Run) -> bool {
        self.next < self.count && !run.stop.load(Ordering::Relaxed)
    }

    /// When message 0 is due, in nanoseconds of the wall clock (what the server is told).
    pub(crate) fn epoch_ns(&self) -> u128 {
        let (wall, now) = (SystemTime::now(), Instant::now());
        let ago = now.saturating_duration_since(self.first);
        let ahead = self.first.saturating_duration_since(now);
        (wall - ago + ahead)
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    }

    fn due(&self, run: &Run, id: u64) -> Instant {
        let interval_ns = u64::try_from(run.interval.as_nanos()).unwrap_or(u64::MAX);
        self.first + Duration::from_nanos(interval_ns.saturating_mul(id))
    }

    /// Settles `id`, not come: lost (`outcome`, not on time or skipped), in the figures.
    fn lose(&mut self, run: &Run, id: u64, outcome: Outcome, backend: Option<BackendId>) {
        let due_ns = run.ns(self.due(run, id));
        run.record(Out::unsent(due_ns), outcome, backend, 0);
        let mut report = run.report.borrow_mut();
        report.sent += 1;
        report.lost += 1;
    }

    /// Counts lost what has not come a timeout after it was due.
    pub(crate) fn expire(&mut self, run: &Run, backend: Option<BackendId>) {
        let now = Instant::now();
        while self.next < self.count && self.due(run, self.next) + run.plan.timeout < now {
            if !self.ahead.remove(&self.next) {
                self.lose(run, self.next, Outcome::ReadTimeout, backend);
                self.expired.insert(self.next);
                if self.expired.len() > 1 << 16 {
                    self.expired.pop_first();
                }
            }
            self.next += 1;
        }
    }

    /// Moves `next` past what already came ahead of it.
    fn advance(&mut self) {
        while self.ahead.remove(&self.next) {
            self.next += 1;
        }
    }

    /// Message `id` came, `bytes` long, answered `outcome` on a stream answered by
    /// `backend`; the first on a stream carries the phases of opening it. On a resumed
    /// stream (one opened after another was cut), ids its first message jumps over were
    /// skipped, and are lost with the cut; on a live stream, a gap may still fill
    /// (reordered) until its timeout. Returns how many messages a resumed stream skipped.
    pub(crate) fn came(
        &mut self,
        run: &Run,
        (id, bytes, outcome): (u64, u64, Outcome),
        backend: Option<BackendId>,
        opened: &mut Option<Phases>,
    ) -> u64 {
        let resumed = opened.is_some() && self.last_id.is_some();
        self.last_id = Some(id);
        if self.expired.remove(&id) {
            run.report.borrow_mut().late += 1;
            return 0;
        }
        if id < self.next || id >= self.count || self.ahead.contains(&id) {
            run.report.borrow_mut().duplicated += 1;
            return 0;
        }
        let mut skipped = 0;
        if resumed {
            while self.next < id {
                if !self.ahead.remove(&self.next) {
                    self.lose(run, self.next, Outcome::Eof, backend);
                    skipped += 1;
                }
                self.next += 1;
            }
        }
        let due_ns = run.ns(self.due(run, id));
        let out = Out {
            due_ns,
            released_ns: due_ns,
            sent_ns: due_ns,
            opened: opened.take(),
            retried_after: None,
        };
        run.record(out, outcome, backend, bytes);
        let mut report = run.report.borrow_mut();
        report.sent += 1;
        report.echoed += 1;
        if self.highest.is_some_and(|h| id < h) {
            report.reordered += 1;
        }
        self.highest = Some(self.highest.map_or(id, |h| h.max(id)));
        if id == self.next {
            self.next += 1;
        } else {
            self.ahead.insert(id);
        }
        self.advance();
        skipped
    }

    /// The connection gives up (its policy does not reconnect): what came due and did
    /// not come was lost with the cut; what falls due from here is never sent.
    pub(crate) fn give_up(&mut self, run: &Run) {
        let now = Instant::now();
        while self.next < self.count {
            let came = self.ahead.remove(&self.next);
            if !came && self.due(run, self.next) <= now {
                self.lose(run, self.next, Outcome::Eof, None);
            } else if !came {
                let due_ns = run.ns(self.due(run, self.next));
                run.record(Out::unsent(due_ns), Outcome::NotSent, None, 0);
                run.report.borrow_mut().unsent += 1;
            }
            self.next += 1;
        }
    }

    /// The run is over: what never came ends as `unanswered` when a later one came (the
    /// server skipped it), else as `waiting_at_end`; both failures in every figure.
    pub(crate) fn finish(&mut self, run: &Run) {
        self.expire(run, None);
        while self.next < self.count {
            if !self.ahead.remove(&self.next) {
                let skipped = self.highest.is_some_and(|h| self.next < h);
                run.report.borrow_mut().sent += 1;
                run.never_came(Out::unsent(run.ns(self.due(run, self.next))), skipped, None);
            }
            self.next += 1;
        }
    }
}

/// Runs a long-lived plan to its end or until `stop` is set: `connection` for each of
/// the plan's connections (its index), on one thread, giving windows and samples to
/// `observer` as the HTTP engine does.
pub(crate) fn drive<F, C>(
    plan: &Plan,
    (kind, options): (StreamKind, &StreamOptions),
    stop: Arc<AtomicBool>,
    observer: &mut dyn Observer,
    connection: C,
) -> Result<LoadReport, LoadError>
where
    C: Fn(Rc<Run>, usize) -> F,
    F: std::future::Future<Output = ()> + 'static,
{
    plan.validate()?;
    let (Mode::Open { rate_per_s }, Length::Duration(length)) = (&plan.mode, plan.length) else {
        return Err(LoadError::InvalidPlan {
            field: "-R/--rate".into(),
            reason: "a WebSocket or event stream load goes at a rate for a duration".into(),
        });
    };
    let rate_per_s = *rate_per_s;
    let warmup = match plan.warmup {
        Warmup::Duration(d) => d,
        _ => Duration::ZERO,
    };
    // A connection and a timer each.
    ensure_descriptors(plan.connections * 2)?;
    // gRPC is HTTP/2 (ALPN `h2`); WebSockets and event streams HTTP/1.1.
    let protocol = match kind {
        StreamKind::Grpc | StreamKind::GrpcStream => Protocol::Http2,
        StreamKind::Websocket | StreamKind::Sse => Protocol::Http1,
    };
    let tls = match plan.target.scheme {
        Scheme::Https => Some((
            crate::tls::client_config_for(&plan.tls, protocol)?,
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
        report: RefCell::new(StreamFile {
            kind,
            ..StreamFile::default()
        }),
        reconnects: RefCell::new(HistogramUs::new()),
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
        stopped_at: std::cell::Cell::new(None),
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
    report.reconnect = Reconnects::of(&run.reconnects.borrow());
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
        stream: Some(Box::new(report)),
    })
}

/// Samples how many WebSockets (event streams) are open every 100 ms until the run's end.
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
        // At once after a cut; not in a tight loop while attempts fail.
        assert_eq!(
            Reconnect::Immediate.delay(0, &mut rng),
            Some(Duration::ZERO)
        );
        // Each failed attempt after that backs off, as browsers' libraries do.
        for (attempt, ceiling) in [
            (1, IMMEDIATE_RETRY),
            (3, IMMEDIATE_RETRY * 4),
            (30, IMMEDIATE_RETRY_MAX),
        ] {
            let longest = (0..200)
                .map(|_| Reconnect::Immediate.delay(attempt, &mut rng).unwrap())
                .max()
                .unwrap();
            assert!(
                longest <= ceiling && longest > ceiling.mul_f64(0.8),
                "{attempt}: {longest:?}"
            );
        }
    }
}
