//! One worker thread: its own runtime, its share of the connections and of the schedule,
//! and its own recorder. Nothing on the per-request path allocates, locks or makes a
//! syscall beyond the socket's reads and writes.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_stats::{IdleEnd, Outcome, Phases, Recorder, Sample, Window};
use tokio::task::LocalSet;

use crate::connection::{exchange, idle_end, nanos, Connector, Exchange, Stage, Stream};
use crate::dispatch::{Dispatch, Ticket};
use crate::response::ResponseParser;
use crate::schedule::Schedule;
use crate::timer::{Clock, PreciseClock};

mod http2;
mod http3;
mod multiplexed;
pub(crate) use http2::Http2;
pub(crate) use http3::Http3;
use multiplexed::connection_loop as connection_loop_of;

/// The read buffer every connection of a worker shares.
const READ_BUFFER: usize = 64 * 1024;
/// How often a worker hands its closed windows and samples to the coordinator.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// What a worker tells the coordinator while it runs.
pub(crate) enum Message {
    Windows {
        worker: usize,
        windows: Vec<Window>,
    },
    Samples {
        samples: Vec<Sample>,
        backends: Vec<String>,
    },
    /// Every connection the worker opens before the start is open (or failed).
    Opened {
        at: Instant,
    },
}

/// What every worker shares (read-only).
pub(crate) struct Shared {
    pub(crate) request: Vec<u8>,
    pub(crate) head_request: bool,
    pub(crate) timeout: Duration,
    pub(crate) keepalive: bool,
    pub(crate) max_requests_per_connection: u64,
    /// Whether a request that fails on a reused connection before any byte of the answer
    /// is sent once more (the plan's retry policy, for this request's method).
    pub(crate) retry: bool,
    pub(crate) backend_header: String,
    pub(crate) generation_headers: Vec<String>,
    pub(crate) sample_rate: f64,
    pub(crate) window_ns: u64,
    pub(crate) warmup_ns: u64,
    /// When the run ends, from its start (warm-up and duration), if it has a duration.
    pub(crate) end_ns: Option<u64>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) gate: Option<crate::RequestGate>,
    pub(crate) batch_window: crate::BatchWindow,
    /// Set for HTTP/2: the request as its streams send it.
    pub(crate) http2: Option<Http2>,
    /// Set for HTTP/3: the request and the QUIC client's configuration.
    pub(crate) http3: Option<Http3>,
}

/// How one worker gets its requests.
pub(crate) enum Feed {
    /// An open-loop schedule.
    Open(Schedule),
    /// As fast as answers come (closed loop), or one at a time with a pause (sequential).
    Loop {
        budget: Option<u64>,
        pause: Option<Duration>,
    },
}

/// One worker's part of the run.
pub(crate) struct Assignment {
    pub(crate) index: usize,
    pub(crate) connections: usize,
    pub(crate) feed: Feed,
    pub(crate) warmup_requests: u64,
    pub(crate) seed: u64,
    /// The run's start, once the coordinator has set it.
    pub(crate) start: tokio::sync::watch::Receiver<Option<Instant>>,
}

enum Source {
    Open(Dispatch),
    Loop {
        remaining: Cell<u64>,
        pause: Option<Duration>,
        issued: Cell<u64>,
        /// Requests handed back (HTTP/2), sent before new ones.
        returned: RefCell<std::collections::VecDeque<Ticket>>,
    },
}

struct Worker {
    shared: Arc<Shared>,
    /// When the first request is due (warm-up included): what every time is counted
    /// from. Set by [`Worker::begin`]; until then, when the worker was made.
    start: Cell<Instant>,
    start_set: tokio::sync::watch::Receiver<Option<Instant>>,
    /// Connections still opening before the start, and a wake-up when one is done.
    opening: Cell<usize>,
    opened: tokio::sync::Notify,
    index: usize,
    connector: Connector,
    source: Source,
    warmup_requests: u64,
    recorder: RefCell<Recorder>,
    buffer: RefCell<Box<[u8]>>,
    samples: RefCell<Vec<Sample>>,
    sample_threshold: u64,
    rng: Cell<u64>,
    /// Requests started and not yet recorded.
    in_flight: Cell<u64>,
    tx: Sender<Message>,
    /// HTTP/3: the worker's UDP socket, shared by its QUIC connections.
    quic: RefCell<Option<quinn::Endpoint>>,
}

/// Released requests waiting for a connection, per worker, beyond which further ones are
/// counted as not sent instead of queued (about 3 MiB of tickets).
const MAX_BACKLOG: usize = 100_000;

/// After a stop (Ctrl-C), how long requests already in flight may take to end before
/// they are abandoned: a stop acts within about this long even when a server stalls.
const STOP_GRACE: Duration = Duration::from_millis(500);

/// Runs one worker to the end and returns what it recorded.
pub(crate) fn run(
    shared: Arc<Shared>,
    connector: Connector,
    assignment: Assignment,
    tx: Sender<Message>,
) -> std::io::Result<Recorder> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let Assignment {
        index,
        connections,
        feed,
        warmup_requests,
        seed,
        start,
    } = assignment;
    let (source, schedule) = match feed {
        Feed::Open(schedule) => (Source::Open(Dispatch::default()), Some(schedule)),
        Feed::Loop { budget, pause } => (
            Source::Loop {
                remaining: Cell::new(budget.unwrap_or(u64::MAX)),
                pause,
                issued: Cell::new(0),
                returned: RefCell::default(),
            },
            None,
        ),
    };
    let sample_threshold = if shared.sample_rate >= 1.0 {
        u64::MAX
    } else {
        (shared.sample_rate * u64::MAX as f64) as u64
    };
    let preopened = if shared.keepalive { connections } else { 0 };
    let worker = Rc::new(Worker {
        recorder: RefCell::new(Recorder::new(shared.window_ns)),
        shared,
        start: Cell::new(Instant::now()),
        start_set: start,
        opening: Cell::new(preopened),
        opened: tokio::sync::Notify::new(),
        index,
        connector,
        source,
        warmup_requests,
        buffer: RefCell::new(vec![0; READ_BUFFER].into_boxed_slice()),
        samples: RefCell::new(Vec::new()),
        sample_threshold,
        rng: Cell::new(seed | 1),
        in_flight: Cell::new(0),
        tx,
        quic: RefCell::new(None),
    });
    let local = LocalSet::new();
    local.block_on(&runtime, async {
        let tasks: Vec<_> = (0..connections)
            .map(|i| {
                let id = ((index as u64) << 20) | i as u64;
                if worker.shared.http3.is_some() {
                    tokio::task::spawn_local(connection_loop_of::<http3::Conn>(worker.clone(), id))
                } else if worker.shared.http2.is_some() {
                    tokio::task::spawn_local(connection_loop_of::<http2::Conn>(worker.clone(), id))
                } else {
                    tokio::task::spawn_local(connection_loop(worker.clone()))
                }
            })
            .collect();
        // Each connection task opens its connection first; the coordinator hears when
        // they all have, and says when the run starts.
        while worker.opening.get() > 0 {
            worker.opened.notified().await;
        }
        let _ = worker.tx.send(Message::Opened { at: Instant::now() });
        worker.begin().await;
        let flusher = tokio::task::spawn_local(flush_loop(worker.clone()));
        let pacer =
            schedule.map(|schedule| tokio::task::spawn_local(pace(worker.clone(), schedule)));
        let handles: Vec<_> = tasks.iter().map(|t| t.abort_handle()).collect();
        let stopper = tokio::task::spawn_local(abandon_after_stop(worker.clone(), handles));
        let mut panicked = None;
        for task in tasks.into_iter().chain(pacer) {
            if let Err(e) = task.await {
                if e.is_panic() {
                    panicked.get_or_insert(e.into_panic());
                }
            }
        }
        flusher.abort();
        stopper.abort();
        let _ = flusher.await;
        if let Some(panic) = panicked {
            // A bug, not an outcome: let the coordinator report it.
            std::panic::resume_unwind(panic);
        }
    });
    let windows = {
        let mut recorder = worker.recorder.borrow_mut();
        recorder.record_waiting_at_end(worker.in_flight.get());
        recorder.roll_windows(worker.now_ns());
        recorder.finish_windows()
    };
    let _ = worker.tx.send(Message::Windows {
        worker: index,
        windows,
    });
    // Last: the samples still buffered (their backend names come from the recorder).
    worker.send_samples();
    let recorder = worker.recorder.borrow().clone();
    Ok(recorder)
}

impl Worker {
    fn now_ns(&self) -> u64 {
        nanos(Instant::now().saturating_duration_since(self.start.get()))
    }

    /// Waits for the coordinator to say when the run starts, and returns that time.
    async fn begin(&self) -> Instant {
        let mut set = self.start_set.clone();
        if let Ok(start) = set.wait_for(Option::is_some).await {
            if let Some(start) = *start {
                self.start.set(start);
            }
        }
        self.start.get()
    }

    /// One connection opened before the start is open (or failed).
    fn preopened(&self) {
        self.opening.set(self.opening.get().saturating_sub(1));
        self.opened.notify_one();
    }

    /// Hands the sampled requests kept so far to the coordinator, with the names their
    /// backend ids stand for in this worker.
    fn send_samples(&self) {
        let samples = std::mem::take(&mut *self.samples.borrow_mut());
        if !samples.is_empty() {
            let backends = self.recorder.borrow().backend_names();
            let _ = self.tx.send(Message::Samples { samples, backends });
        }
    }

    fn stopped(&self) -> bool {
        self.shared.stop.load(Ordering::Relaxed)
    }

    fn past_end(&self, now: Instant) -> bool {
        self.shared
            .end_ns
            .is_some_and(|end| now >= self.start.get() + Duration::from_nanos(end))
    }

    /// When a request first sent at `first_sent_ns` gives up. The timeout runs from the
    /// send, as vegeta, oha and k6 count theirs: connect, TLS, write and read (and, over
    /// HTTP/2, every resend) come out of it; a wait for a free connection before the
    /// send does not, and is in the request's latency and time to failure instead.
    fn deadline(&self, first_sent_ns: u64) -> Instant {
        self.start.get() + Duration::from_nanos(first_sent_ns) + self.shared.timeout
    }

    async fn next_ticket(&self) -> Option<Ticket> {
        match &self.source {
            Source::Open(dispatch) => dispatch.next().await,
            Source::Loop {
                remaining,
                pause,
                issued,
                returned,
            } => {
                if let Some(ticket) = returned.borrow_mut().pop_front() {
                    return Some(ticket);
                }
                if let Some(pause) = pause {
                    if issued.get() > 0 {
                        tokio::time::sleep(*pause).await;
                    }
                }
                if remaining.get() == 0 || self.stopped() || self.past_end(Instant::now()) {
                    return None;
                }
                remaining.set(remaining.get() - 1);
                let seq = issued.get();
                issued.set(seq + 1);
                if let Some(gate) = &self.shared.gate {
                    // Sequential load only: one connection, so waiting here holds nothing else.
                    (gate.0)(seq);
                }
                let now = self.now_ns();
                Some(Ticket {
                    seq,
                    intended_ns: now,
                    released_ns: now,
                    warmup: self.is_warmup(seq, now),
                    retry: None,
                })
            }
        }
    }

    /// Hands a taken ticket back, to be sent before any new one (HTTP/2: its connection
    /// could not send it, or the server did not process it).
    fn give_back(&self, ticket: Ticket) {
        match &self.source {
            Source::Open(dispatch) => dispatch.push_front(ticket),
            Source::Loop { returned, .. } => returned.borrow_mut().push_back(ticket),
        }
    }

    /// Whether tickets wait to be taken (released and not taken, or handed back).
    fn tickets_waiting(&self) -> bool {
        match &self.source {
            Source::Open(dispatch) => dispatch.backlog() > 0,
            Source::Loop { returned, .. } => !returned.borrow().is_empty(),
        }
    }

    fn is_warmup(&self, seq: u64, intended_ns: u64) -> bool {
        seq < self.warmup_requests || intended_ns < self.shared.warmup_ns
    }

    /// Records a request; with sampling on, keeps it in the sampled stream if the random
    /// sample chooses it or it failed (every failure, so that errors around events are
    /// exact). Requests never sent are only counted: they have no times to show, and a
    /// rate no schedule could keep makes millions of them a second.
    fn record(&self, sample: &Sample) {
        self.recorder.borrow_mut().record(sample);
        if sample.warmup || self.sample_threshold == 0 || sample.outcome == Outcome::NotSent {
            return;
        }
        let chosen = self.next_random() <= self.sample_threshold;
        if chosen || !sample.outcome.is_ok() {
            let mut kept = *sample;
            kept.in_sample = chosen;
            self.samples.borrow_mut().push(kept);
        }
    }

    /// xorshift64*: a cheap, good-enough stream for deciding which requests to keep.
    fn next_random(&self) -> u64 {
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The next ticket. Meanwhile a pooled connection that the server closes, or sends
    /// unasked bytes on, is retired and counted, so that no request is handed a
    /// connection already known to be dead.
    async fn next_ticket_watching(
        &self,
        conn: &mut Option<Stream>,
        opened: &mut Option<Phases>,
    ) -> Option<Ticket> {
        enum Wake {
            Ticket(Option<Ticket>),
            Idle(IdleEnd),
        }
        let next = self.next_ticket();
        tokio::pin!(next);
        loop {
            let Some(stream) = conn.as_mut() else {
                return next.await;
            };
            let wake = tokio::select! {
                biased;
                ticket = &mut next => Wake::Ticket(ticket),
                end = idle_end(stream, &self.buffer) => Wake::Idle(end),
            };
            match wake {
                Wake::Ticket(ticket) => {
                    if ticket.is_some() && self.shared.gate.is_some() {
                        // The gate held this thread without its reactor: let the reactor
                        // look once before the connection is used.
                        self.check_idle(conn, opened).await;
                    }
                    return ticket;
                }
                Wake::Idle(end) => self.retire(end, conn, opened),
            }
        }
    }

    /// Retires a pooled connection now if the reactor has seen it closed.
    async fn check_idle(&self, conn: &mut Option<Stream>, opened: &mut Option<Phases>) {
        tokio::task::yield_now().await;
        let Some(stream) = conn.as_mut() else {
            return;
        };
        let end = tokio::select! {
            biased;
            end = idle_end(stream, &self.buffer) => Some(end),
            () = std::future::ready(()) => None,
        };
        if let Some(end) = end {
            self.retire(end, conn, opened);
        }
    }

    fn retire(&self, end: IdleEnd, conn: &mut Option<Stream>, opened: &mut Option<Phases>) {
        self.recorder.borrow_mut().record_idle_end(end);
        *conn = None;
        *opened = None;
    }

    /// Sends one request (opening a connection first if needed) and says what became of
    /// it. A request that fails on a pooled connection before any byte of the answer is
    /// sent once more on a new connection when the retry policy allows; its latency
    /// still runs from the intended time, so the retry's cost is in it.
    async fn execute(
        &self,
        ticket: Ticket,
        conn: &mut Option<Stream>,
        served: &mut u64,
        parser: &mut ResponseParser,
        opened: &mut Option<Phases>,
    ) -> Sample {
        let mut sample = Sample::new(ticket.intended_ns);
        sample.seq = ticket.seq;
        sample.released_at_ns = ticket.released_ns;
        sample.warmup = ticket.warmup;
        let preopened = opened.take().filter(|_| conn.is_some());
        let reused = conn.is_some() && preopened.is_none();
        let sent = Instant::now();
        sample.sent_at_ns = nanos(sent.saturating_duration_since(self.start.get()));
        let mut stage = Stage::Connecting;
        let mut write_at = sent;
        let mut progress = Exchange {
            bytes: 0,
            first_byte: None,
            reusable: false,
            written: false,
        };
        let mut retried_after = None;
        let phases = &mut sample.phases;
        let attempt = async {
            loop {
                let pooled = conn.is_some();
                if conn.is_none() {
                    *conn = Some(self.connector.connect(phases).await?);
                    *served = 0;
                }
                stage = Stage::Exchanging;
                write_at = Instant::now();
                parser.reset(self.shared.head_request);
                progress.written = false;
                let Some(stream) = conn.as_mut() else {
                    return Err(Outcome::ConnectError);
                };
                let outcome = exchange(
                    stream,
                    &self.shared.request,
                    parser,
                    &self.buffer,
                    &mut progress,
                )
                .await;
                let raced = pooled
                    && progress.first_byte.is_none()
                    && matches!(
                        outcome,
                        Outcome::Eof | Outcome::ResetBeforeWrite | Outcome::ResetAfterWrite
                    );
                if raced && self.shared.retry && retried_after.is_none() {
                    retried_after = Some(outcome);
                    *conn = None;
                    stage = Stage::Connecting;
                    continue;
                }
                return Ok(outcome);
            }
        };
        let result = tokio::time::timeout_at((sent + self.shared.timeout).into(), attempt).await;
        let done = Instant::now();
        sample.retried_after = retried_after;
        sample.connection_reused = reused && retried_after.is_none();
        if let Some(p) = preopened.filter(|_| retried_after.is_none()) {
            sample.phases.dns_ns = p.dns_ns;
            sample.phases.connect_ns = p.connect_ns;
            sample.phases.tls_ns = p.tls_ns;
        }
        sample.outcome = match result {
            Ok(Ok(outcome) | Err(outcome)) => outcome,
            Err(_elapsed) => match stage {
                Stage::Connecting => Outcome::ConnectTimeout,
                Stage::Exchanging if !progress.written => Outcome::WriteTimeout,
                Stage::Exchanging => Outcome::ReadTimeout,
            },
        };
        match sample.outcome {
            Outcome::ConnectTimeout if stage == Stage::Connecting => {
                let to = self.connector.describe();
                let timeout = self.shared.timeout;
                self.recorder
                    .borrow_mut()
                    .note_failure_detail(sample.outcome, || {
                        format!("connecting to {to} took longer than --timeout {timeout:?}")
                    });
            }
            Outcome::WriteTimeout => {
                let (bytes, timeout) = (self.shared.request.len(), self.shared.timeout);
                self.recorder
                    .borrow_mut()
                    .note_failure_detail(sample.outcome, || {
                        format!("the server stopped reading: a request of {bytes} bytes was not written within --timeout {timeout:?}")
                    });
            }
            Outcome::Refused | Outcome::DnsError | Outcome::ConnectError | Outcome::TlsError => {
                if let Some(reason) = self.connector.take_failure() {
                    self.recorder
                        .borrow_mut()
                        .note_failure_detail(sample.outcome, || reason);
                }
            }
            _ => {}
        }
        sample.done_at_ns = nanos(done.saturating_duration_since(self.start.get()));
        sample.bytes = progress.bytes;
        if let Some(first) = progress.first_byte {
            sample.phases.ttfb_ns = nanos(first.saturating_duration_since(write_at));
            sample.phases.transfer_ns = nanos(done.saturating_duration_since(first));
        }
        if let Outcome::Status(_) = sample.outcome {
            if let Some(name) = parser.backend() {
                sample.backend = Some(self.recorder.borrow_mut().backend_id(name));
            }
            sample.generations = parser.generations();
        }
        if conn.is_some() {
            *served += 1;
        }
        let reuse = matches!(sample.outcome, Outcome::Status(_))
            && progress.reusable
            && self.shared.keepalive
            && *served < self.shared.max_requests_per_connection;
        if !reuse {
            *conn = None;
        }
        sample
    }
}

/// Once the run is stopped, gives the requests in flight [`STOP_GRACE`] to end, then
/// cancels the connections' tasks (what they had in flight is counted as abandoned).
async fn abandon_after_stop(worker: Rc<Worker>, tasks: Vec<tokio::task::AbortHandle>) {
    while !worker.stopped() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(STOP_GRACE).await;
    for task in tasks {
        task.abort();
    }
}

async fn connection_loop(worker: Rc<Worker>) {
    let mut conn = None;
    let mut served = 0;
    let mut parser = ResponseParser::new(
        &worker.shared.backend_header,
        &worker.shared.generation_headers,
    );
    // With keep-alive, open the connection before the first request is due, as wrk does,
    // so that handshakes do not land inside the measured run (a connection that would only
    // be opened by a later burst would pay its TLS handshake there). Its phases go on its
    // first request, which is not counted as reused but did not wait for them.
    let mut opened = None;
    if worker.shared.keepalive {
        let mut phases = Phases::default();
        let connect = worker.connector.connect(&mut phases);
        if let Ok(Ok(stream)) = tokio::time::timeout(worker.shared.timeout, connect).await {
            conn = Some(stream);
            opened = Some(phases);
        }
        worker.preopened();
    }
    let start = worker.begin().await;
    tokio::time::sleep_until(start.into()).await;
    while let Some(ticket) = worker.next_ticket_watching(&mut conn, &mut opened).await {
        worker.in_flight.set(worker.in_flight.get() + 1);
        let sample = worker
            .execute(ticket, &mut conn, &mut served, &mut parser, &mut opened)
            .await;
        worker.record(&sample);
        worker.in_flight.set(worker.in_flight.get() - 1);
    }
}

/// Releases the open-loop schedule's tickets at their intended times, then waits for the
/// backlog to drain (at most one timeout), and counts what never went out as not sent.
async fn pace(worker: Rc<Worker>, schedule: Schedule) {
    let Source::Open(dispatch) = &worker.source else {
        return;
    };
    match PreciseClock::new(worker.start.get(), worker.shared.batch_window) {
        Ok(mut clock) => release(&worker, dispatch, schedule, &mut clock).await,
        Err(_) => {
            release(
                &worker,
                dispatch,
                schedule,
                &mut crate::timer::TokioFallback,
            )
            .await
        }
    }
    dispatch.close();
    // Interrupted, what the schedule had not released yet was never due (it is in no
    // figure); what it had released was due, and what no connection took is `not_sent`
    // (before, a stop while no connection was open left a run of due requests with none
    // counted).
    let deadline = Instant::now() + worker.shared.timeout;
    while dispatch.backlog() > 0 && Instant::now() < deadline && !worker.stopped() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let now = worker.now_ns();
    for ticket in dispatch.take_backlog() {
        worker.record(&not_sent(ticket, now));
    }
}

/// A released request that no connection took, as a sample ended at `now_ns`.
fn not_sent(ticket: Ticket, now_ns: u64) -> Sample {
    let mut sample = Sample::new(ticket.intended_ns);
    sample.seq = ticket.seq;
    sample.released_at_ns = ticket.released_ns;
    sample.sent_at_ns = now_ns;
    sample.done_at_ns = now_ns;
    sample.warmup = ticket.warmup;
    sample
}

async fn release(worker: &Worker, dispatch: &Dispatch, schedule: Schedule, clock: &mut impl Clock) {
    release_schedule(worker, dispatch, schedule, clock).await;
    if let Some(windows) = clock.windows_us() {
        worker.recorder.borrow_mut().record_batch_windows(windows);
    }
}

async fn release_schedule(
    worker: &Worker,
    dispatch: &Dispatch,
    schedule: Schedule,
    clock: &mut impl Clock,
) {
    for (seq, intended_ns) in schedule {
        let due = worker.start.get() + Duration::from_nanos(intended_ns);
        if clock.now() < due {
            clock.sleep_until(due).await;
        }
        if worker.stopped() {
            return;
        }
        let released_ns = nanos(clock.now().saturating_duration_since(worker.start.get()));
        let ticket = Ticket {
            seq,
            intended_ns,
            released_ns,
            warmup: worker.is_warmup(seq, intended_ns),
            retry: None,
        };
        if dispatch.backlog() < MAX_BACKLOG {
            dispatch.push(ticket);
        } else {
            // Every connection is busy and this many wait already: the request is not
            // sent (memory stays flat whatever the rate asks).
            worker.record(&not_sent(ticket, released_ns));
        }
    }
}

async fn flush_loop(worker: Rc<Worker>) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let windows = {
            let mut recorder = worker.recorder.borrow_mut();
            recorder.roll_windows(worker.now_ns());
            let mut windows = recorder.take_finished_windows();
            for w in &mut windows {
                w.in_flight = worker.in_flight.get();
            }
            windows
        };
        if !windows.is_empty() {
            let _ = worker.tx.send(Message::Windows {
                worker: worker.index,
                windows,
            });
        }
        worker.send_samples();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::timer::TokioClock;

    fn shared() -> Arc<Shared> {
        Arc::new(Shared {
            request: Vec::new(),
            head_request: false,
            timeout: Duration::from_secs(1),
            keepalive: true,
            max_requests_per_connection: u64::MAX,
            retry: true,
            backend_header: "x-backend".into(),
            generation_headers: Vec::new(),
            sample_rate: 0.0,
            window_ns: 1_000_000_000,
            warmup_ns: 0,
            end_ns: None,
            stop: Arc::new(AtomicBool::new(false)),
            batch_window: crate::BatchWindow::Fixed(Duration::from_micros(100)),
            gate: None,
            http2: None,
            http3: None,
        })
    }

    /// The pacer releases every request of the schedule at its intended time (on tokio's
    /// paused clock, to within its 1 ms timer slot) and none early.
    #[tokio::test(start_paused = true)]
    async fn pacer_releases_each_request_at_its_intended_time() {
        let start = tokio::time::Instant::now().into_std();
        let (tx, _rx) = std::sync::mpsc::channel();
        let (_set, start_set) = tokio::sync::watch::channel(Some(start));
        let worker = Worker {
            shared: shared(),
            start: Cell::new(start),
            start_set,
            opening: Cell::new(0),
            opened: tokio::sync::Notify::new(),
            index: 0,
            connector: Connector::new(
                crate::connection::Address::Fixed("127.0.0.1:9".parse().unwrap(), "a test"),
                None,
            ),
            source: Source::Open(Dispatch::default()),
            warmup_requests: 0,
            recorder: RefCell::new(Recorder::new(1_000_000_000)),
            buffer: RefCell::new(Box::new([])),
            samples: RefCell::new(Vec::new()),
            sample_threshold: 0,
            rng: Cell::new(1),
            in_flight: Cell::new(0),
            tx,
            quic: RefCell::new(None),
        };
        let Source::Open(dispatch) = &worker.source else {
            unreachable!()
        };
        let rate = 333.0;
        let schedule = Schedule::new(rate, 0, 1, Some(1000), None);
        release(&worker, dispatch, schedule, &mut TokioClock).await;
        let tickets = dispatch.take_backlog();
        assert_eq!(tickets.len(), 1000);
        for (j, t) in tickets.iter().enumerate() {
            assert_eq!(t.intended_ns, Schedule::intended_ns(rate, j as u64));
            assert!(t.released_ns >= t.intended_ns, "released early: {t:?}");
            assert!(
                t.released_ns - t.intended_ns <= 1_000_000,
                "released late: {t:?}"
            );
        }
        let elapsed = tokio::time::Instant::now().into_std() - start;
        let expected = Duration::from_nanos(Schedule::intended_ns(rate, 999));
        assert!(
            elapsed >= expected && elapsed <= expected + Duration::from_millis(1),
            "{elapsed:?}"
        );
    }
}
