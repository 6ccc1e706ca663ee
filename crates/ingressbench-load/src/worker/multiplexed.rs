//! What HTTP/2's and HTTP/3's connections share: a connection carries many requests at
//! once, one per stream, and one task per connection hands the worker's tickets to new
//! streams while it has a free slot ([`connection_loop`], [`run_streams`]). How a
//! connection is opened and how a stream goes is each protocol's ([`Multiplexed`]).

use std::rc::Rc;
use std::time::Instant;

use ingressbench_stats::{BackendId, Outcome, Phases, Sample, GENERATION_SLOTS};

use super::http2::{Live, Pending, Signal};
use super::Worker;

/// A connection of a protocol that multiplexes requests on streams.
pub(super) trait Multiplexed: Sized + 'static {
    /// What opening one is, for a connect timeout's detail ("TCP, TLS and the HTTP/2
    /// preface").
    const OPENING: &'static str;

    /// Opens one (numbered `id` among the worker's), timing its phases into `phases`.
    async fn open(worker: &Rc<Worker>, id: u64, phases: &mut Phases) -> Result<Rc<Self>, Outcome>;

    /// Keeps the opening's phases for the first stream to go out on it.
    fn set_opened(&self, phases: Phases);

    /// Whether a new stream may start on it (`max`: requests a connection may carry).
    fn open_for_streams(&self, max: u64) -> bool;

    /// Streams started on it and not ended.
    fn busy(&self) -> u32;

    /// How many streams it carries at once.
    fn slots(&self, worker: &Worker) -> u32;

    /// Woken when a stream ends or the connection changes.
    fn changed(&self) -> &Signal;

    /// Starts `pending`'s stream on it, a task of its own that records what became of it.
    fn start_stream(worker: &Rc<Worker>, conn: &Rc<Self>, live: &Rc<Live>, pending: Pending);

    /// After its streams (it takes no more, or the run has no more): what it records.
    fn after_streams(&self, _worker: &Worker) {}

    /// Once the worker has nothing more to send on it.
    fn done(&self) {}
}

/// One connection task: opens its connection (before the start with keep-alive, else
/// when a ticket needs it), starts streams on it until it can take no more, then opens
/// the next. `index` numbers the task among the worker's.
pub(super) async fn connection_loop<C: Multiplexed>(worker: Rc<Worker>, index: u64) {
    let mut generation = 0u64;
    let mut next_id = || {
        generation += 1;
        (index << 32) | generation
    };
    let live = Rc::new(Live::default());
    let mut ready = None;
    if worker.shared.keepalive {
        let mut phases = Phases::default();
        let open = C::open(&worker, next_id(), &mut phases);
        if let Ok(Ok(conn)) = tokio::time::timeout(worker.shared.timeout, open).await {
            conn.set_opened(phases);
            ready = Some(conn);
        }
        worker.preopened();
    }
    let start = worker.begin().await;
    tokio::time::sleep_until(start.into()).await;
    loop {
        let (conn, first) = match ready.take() {
            Some(conn) => (conn, None),
            None => {
                let Some(ticket) = worker.next_ticket().await else {
                    live.wait_idle().await;
                    if worker.tickets_waiting() {
                        continue;
                    }
                    return;
                };
                let pending = Pending {
                    ticket,
                    sent_at: Instant::now(),
                };
                worker.in_flight.set(worker.in_flight.get() + 1);
                let mut phases = Phases::default();
                let open = C::open(&worker, next_id(), &mut phases);
                let deadline = worker.deadline(worker.first_sent_ns(&pending));
                let opened = tokio::time::timeout_at(deadline.into(), open).await;
                worker.in_flight.set(worker.in_flight.get() - 1);
                match opened {
                    Ok(Ok(conn)) => {
                        conn.set_opened(phases);
                        (conn, Some(pending))
                    }
                    Ok(Err(outcome)) => {
                        worker.record(&worker.connect_failure(&pending, outcome, phases));
                        continue;
                    }
                    Err(_elapsed) => {
                        let sample =
                            worker.connect_failure(&pending, Outcome::ConnectTimeout, phases);
                        let (to, timeout) = (worker.connector.describe(), worker.shared.timeout);
                        worker.recorder.borrow_mut().note_failure_detail(Outcome::ConnectTimeout, || {
                            format!("connecting to {to} ({}) took longer than --timeout {timeout:?}", C::OPENING)
                        });
                        worker.record(&sample);
                        continue;
                    }
                }
            }
        };
        let finished = run_streams(&worker, &conn, &live, first).await;
        conn.after_streams(&worker);
        if finished {
            // The run has no more new tickets: let this task's streams end before it
            // does (what is still in flight when the worker stops counts as abandoned),
            // and send again what they handed back.
            live.wait_idle().await;
            if !worker.tickets_waiting() {
                conn.done();
                return;
            }
            let max = worker.shared.max_requests_per_connection;
            ready = conn.open_for_streams(max).then_some(conn);
        }
    }
}

/// Hands tickets to new streams on `conn` while it has a free stream slot and takes new
/// streams, each stream a task of its own; returns `true` when the run has no more
/// tickets, `false` when the connection takes no more streams (a GOAWAY, its end, its
/// request limit). The connection waits for a ticket only while a slot is free, so a
/// request waits only when no connection has one.
async fn run_streams<C: Multiplexed>(
    worker: &Rc<Worker>,
    conn: &Rc<C>,
    live: &Rc<Live>,
    first: Option<Pending>,
) -> bool {
    let slots = conn.slots(worker);
    let max = worker.shared.max_requests_per_connection;
    if let Some(pending) = first {
        C::start_stream(worker, conn, live, pending);
    }
    // One wait for a ticket, kept across wake-ups (a dropped wait goes to the back of
    // the line) and renewed only once it has given a ticket.
    let next = worker.next_ticket();
    tokio::pin!(next);
    let mut armed = true;
    loop {
        let mark = conn.changed().mark();
        if !conn.open_for_streams(max) {
            return false;
        }
        if conn.busy() >= slots {
            conn.changed().since(mark).await;
            continue;
        }
        if !armed {
            next.set(worker.next_ticket());
            armed = true;
        }
        let ticket = tokio::select! {
            biased;
            () = conn.changed().since(mark) => continue,
            ticket = &mut next => {
                armed = false;
                ticket
            }
        };
        let Some(ticket) = ticket else {
            return true;
        };
        let pending = Pending {
            ticket,
            sent_at: Instant::now(),
        };
        C::start_stream(worker, conn, live, pending);
    }
}

/// What an answer's head says that its sample keeps: the backend that answered and the
/// generations it carried.
#[derive(Default)]
pub(super) struct Heard {
    backend: Option<BackendId>,
    generations: [u32; GENERATION_SLOTS],
}

impl Worker {
    /// What `headers` (an answer's) say of its backend and generations.
    pub(super) fn hear(&self, headers: &http::HeaderMap) -> Heard {
        let mut heard = Heard::default();
        if let Some(name) = headers.get(self.shared.backend_header.as_str()) {
            heard.backend = Some(self.recorder.borrow_mut().backend_id(name.as_bytes()));
        }
        for (slot, header) in self.shared.generation_headers.iter().enumerate() {
            if let Some(value) = headers.get(header.as_str()) {
                heard.generations[slot] = std::str::from_utf8(value.as_bytes())
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
            }
        }
        heard
    }
}

/// Completes a stream's `sample` whose outcome is set: the body's bytes, the time to
/// first byte and the transfer (from `written`, when its request went out, to `done`),
/// and, for an answer, its backend and generations.
pub(super) fn complete(
    sample: &mut Sample,
    bytes: u64,
    written: Instant,
    first_byte: Option<Instant>,
    done: Instant,
    heard: Heard,
) {
    sample.bytes = bytes;
    if let Some(first) = first_byte {
        sample.phases.ttfb_ns = crate::connection::nanos(first.saturating_duration_since(written));
        sample.phases.transfer_ns = crate::connection::nanos(done.saturating_duration_since(first));
    }
    if let Outcome::Status(_) = sample.outcome {
        sample.backend = heard.backend;
        sample.generations = heard.generations;
    }
}
