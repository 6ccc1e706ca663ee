//! HTTP/2 connections: each carries up to `streams` requests at once, one per stream, and
//! the `h2` crate does the framing. A connection's task takes the worker's next ticket
//! whenever the connection has a free stream slot and starts a stream (a task of its
//! own) for it, so a request waits (and the wait counts) only when every slot of every
//! connection is busy.
//!
//! What the server sends outside any one answer is read off the bytes as they arrive
//! ([`FrameWatch`]): a GOAWAY's time, last-stream-id and code, and the server's
//! `SETTINGS_MAX_CONCURRENT_STREAMS`. The `h2` crate acts on them too, but does not say
//! when, nor where a GOAWAY drew its line, which is what tells a stream the server never
//! processed (`goaway_unprocessed`, safe to send again) from one it did and then lost
//! (`goaway_processed_lost`).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ingressbench_stats::{Goaway, Outcome, Phases, Sample};

use super::multiplexed::{complete, Heard, Multiplexed};
use super::Worker;

mod frames;
use crate::connection::{nanos, Stream};
use crate::dispatch::{Retry, Ticket};
use crate::{LoadError, Plan, DEFAULT_STREAMS};
pub(super) use frames::Signal;
use frames::{FrameWatch, Watched};

/// How long a new connection waits for the server's first SETTINGS frame.
const SETTINGS_WAIT: Duration = Duration::from_secs(5);
/// Flow-control windows the client announces: large enough that a response body of a
/// few MiB never waits for a WINDOW_UPDATE (h2load announces 1 GiB).
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 32 << 20;

/// What every HTTP/2 connection of a run shares: the request, ready to clone.
pub(crate) struct Http2 {
    method: http::Method,
    uri: http::Uri,
    headers: http::HeaderMap,
    pub(super) body: Bytes,
    /// Streams per connection the plan asks for (`None`: the server's limit).
    pub(super) streams: Option<u32>,
    /// Whether streams the server did not process are sent again (any retry policy but
    /// `none`).
    pub(super) retry_unprocessed: bool,
}

impl Http2 {
    /// The request of `plan` as HTTP/2 sends it: the Host header (or the URL's
    /// authority) becomes `:authority`, and the headers HTTP/2 forbids
    /// (`Connection`, `Keep-Alive`, `Transfer-Encoding`, `Upgrade`) are left out.
    pub(crate) fn new(plan: &Plan) -> Result<Self, LoadError> {
        let spec = &plan.request;
        let invalid = |field: &str, reason: String| LoadError::InvalidPlan {
            field: field.to_owned(),
            reason,
        };
        let method = http::Method::from_bytes(spec.method.as_bytes()).map_err(|_| {
            invalid(
                "-X/--method",
                format!("`{}` is not an HTTP method", spec.method),
            )
        })?;
        let scheme = match plan.target.scheme {
            crate::Scheme::Http => "http",
            crate::Scheme::Https => "https",
        };
        let authority = spec.host_header(&plan.target);
        let uri = format!("{scheme}://{authority}{}", plan.target.path)
            .parse::<http::Uri>()
            .map_err(|e| invalid("url", format!("`{authority}{}`: {e}", plan.target.path)))?;
        let mut headers = http::HeaderMap::new();
        let forbidden = [
            "host",
            "connection",
            "keep-alive",
            "transfer-encoding",
            "upgrade",
            "proxy-connection",
        ];
        for (name, value) in &spec.headers {
            if forbidden.iter().any(|f| name.eq_ignore_ascii_case(f)) {
                continue;
            }
            let name = http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                .map_err(|e| invalid("-H/--header", format!("`{name}`: {e}")))?;
            let value = http::HeaderValue::from_str(value)
                .map_err(|e| invalid("-H/--header", format!("`{value}`: {e}")))?;
            headers.append(name, value);
        }
        if !headers.contains_key(http::header::USER_AGENT) {
            headers.insert(
                http::header::USER_AGENT,
                http::HeaderValue::from_static(concat!("ingressbench/", env!("CARGO_PKG_VERSION"))),
            );
        }
        if !headers.contains_key(http::header::ACCEPT) {
            headers.insert(http::header::ACCEPT, http::HeaderValue::from_static("*/*"));
        }
        Ok(Self {
            method,
            uri,
            headers,
            body: Bytes::from(spec.body.clone()),
            streams: plan.streams,
            retry_unprocessed: plan.retry != crate::RetryPolicy::None,
        })
    }

    pub(super) fn request(&self) -> http::Request<()> {
        let mut request = http::Request::new(());
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();
        request
    }
}

/// One open HTTP/2 connection, shared by its task and its streams' tasks.
pub(super) struct Conn {
    id: u64,
    send: RefCell<h2::client::SendRequest<Bytes>>,
    watch: Rc<FrameWatch>,
    /// Set when the connection's driver ended (closed, or broken).
    ended: Rc<Cell<bool>>,
    /// GOAWAYs already recorded.
    goaways_recorded: Cell<usize>,
    /// Streams handed a ticket and not ended.
    busy: Cell<u32>,
    /// Set when a new stream could not be opened on it (it is closing).
    refused: Cell<bool>,
    /// The connect and TLS phases, for the first stream to go out on it.
    opened: Cell<Option<Phases>>,
}

impl Multiplexed for Conn {
    const OPENING: &'static str = "TCP, TLS and the HTTP/2 preface";

    async fn open(worker: &Rc<Worker>, id: u64, phases: &mut Phases) -> Result<Rc<Self>, Outcome> {
        worker.open_http2(id, phases).await
    }

    fn set_opened(&self, phases: Phases) {
        self.opened.set(Some(phases));
    }

    fn open_for_streams(&self, max: u64) -> bool {
        !self.ended.get()
            && !self.refused.get()
            && self.watch.last_goaway().is_none()
            && self.watch.sent.get() < max
    }

    fn busy(&self) -> u32 {
        self.busy.get()
    }

    fn slots(&self, worker: &Worker) -> u32 {
        worker.stream_slots(self)
    }

    fn changed(&self) -> &Signal {
        &self.watch.changed
    }

    fn start_stream(worker: &Rc<Worker>, conn: &Rc<Self>, live: &Rc<Live>, pending: Pending) {
        start_stream(worker, conn, live, pending);
    }

    fn after_streams(&self, worker: &Worker) {
        worker.note_goaways(self);
    }
}

/// A ticket and what it already went through (a connection opened for it).
pub(super) struct Pending {
    pub(super) ticket: Ticket,
    pub(super) sent_at: Instant,
}

impl Worker {
    /// After an attempt of `ticket` that ended as `failed` without the server processing
    /// it: the ticket to send again and how long to wait first, or `None` when its
    /// attempts are spent or the wait would reach its deadline (it then ends as `failed`).
    pub(super) fn again(&self, ticket: Ticket, failed: &Sample) -> Option<(Ticket, Duration)> {
        let mut retry = ticket.retry.unwrap_or(Retry {
            after: failed.outcome,
            first_sent_ns: failed.sent_at_ns,
            attempts: 0,
        });
        retry.attempts += 1;
        let wait = resend_wait(retry.attempts);
        if retry.attempts >= MAX_ATTEMPTS
            || Instant::now() + wait >= self.deadline(retry.first_sent_ns)
        {
            return None;
        }
        Some((
            Ticket {
                retry: Some(retry),
                ..ticket
            },
            wait,
        ))
    }

    /// Records a request that ended, or hands one to go again back after its wait.
    pub(super) async fn settle(&self, exchanged: Exchanged) {
        match exchanged {
            Exchanged::Done(sample) => self.record(&sample),
            Exchanged::Again(ticket, wait) => {
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                self.give_back(ticket);
            }
        }
        self.in_flight.set(self.in_flight.get() - 1);
    }

    /// Records the GOAWAYs `conn`'s watch saw since the last call.
    fn note_goaways(&self, conn: &Conn) {
        let goaways = conn.watch.goaways.borrow();
        for (at, frame, sent, in_flight) in goaways.iter().skip(conn.goaways_recorded.get()) {
            self.recorder.borrow_mut().record_goaway(Goaway {
                at_ns: nanos(at.saturating_duration_since(self.start.get())),
                connection: conn.id,
                last_stream_id: frame.last_stream_id.into(),
                code: frame.code,
                streams_in_flight: *in_flight,
                streams_sent: *sent,
            });
        }
        conn.goaways_recorded.set(goaways.len());
    }

    /// Opens a connection and speaks HTTP/2 on it, up to the server's first SETTINGS.
    async fn open_http2(&self, id: u64, phases: &mut Phases) -> Result<Rc<Conn>, Outcome> {
        let stream = self.connector.connect(phases).await?;
        if let Stream::Tls(tls) = &stream {
            let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            if alpn.as_deref() != Some(b"h2") {
                let to = self.connector.describe();
                self.recorder.borrow_mut().note_failure_detail(Outcome::ProtocolError, || {
                    format!(
                        "{to} did not agree to HTTP/2 in the TLS handshake (ALPN {}): it does not serve h2 on this port; \
                         drop --http2, or enable HTTP/2 there (nginx `http2 on;`, HAProxy `alpn h2,http/1.1`)",
                        alpn.map_or("none".to_owned(), |p| format!("`{}`", String::from_utf8_lossy(&p)))
                    )
                });
                return Err(Outcome::ProtocolError);
            }
        }
        let watch = Rc::new(FrameWatch::default());
        let io = Watched {
            inner: stream,
            watch: watch.clone(),
        };
        let handshake = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .enable_push(false)
            .handshake::<_, Bytes>(io)
            .await;
        let (send, connection) = match handshake {
            Ok(pair) => pair,
            Err(e) => return Err(self.failed_handshake(&e, &watch)),
        };
        let ended = Rc::new(Cell::new(false));
        let (driver_ended, driver_watch) = (ended.clone(), watch.clone());
        tokio::task::spawn_local(async move {
            let _ = connection.await;
            driver_ended.set(true);
            driver_watch.changed.notify();
        });
        let deadline = tokio::time::Instant::now() + SETTINGS_WAIT;
        loop {
            let mark = watch.changed.mark();
            if watch.settings_seen.get() {
                break;
            }
            if ended.get() {
                return Err(self.failed_handshake_settings(&watch));
            }
            if tokio::time::timeout_at(deadline, watch.changed.since(mark))
                .await
                .is_err()
            {
                return Err(self.failed_handshake_settings(&watch));
            }
        }
        self.recorder
            .borrow_mut()
            .record_http2_connection(watch.max_streams.get());
        Ok(Rc::new(Conn {
            id,
            send: RefCell::new(send),
            watch,
            ended,
            goaways_recorded: Cell::new(0),
            busy: Cell::new(0),
            refused: Cell::new(false),
            opened: Cell::new(None),
        }))
    }

    fn failed_handshake(&self, e: &h2::Error, watch: &FrameWatch) -> Outcome {
        let to = self.connector.describe();
        let got = watch.first_bytes.borrow().clone();
        self.recorder
            .borrow_mut()
            .note_failure_detail(Outcome::ProtocolError, || {
                format!("HTTP/2 handshake with {to}: {e}{}", http1_hint(&got))
            });
        Outcome::ProtocolError
    }

    fn failed_handshake_settings(&self, watch: &FrameWatch) -> Outcome {
        let to = self.connector.describe();
        let got = watch.first_bytes.borrow().clone();
        self.recorder.borrow_mut().note_failure_detail(Outcome::ProtocolError, || {
            format!(
                "{to} sent no HTTP/2 SETTINGS frame after the connection preface (waited up to {SETTINGS_WAIT:?}){}",
                http1_hint(&got)
            )
        });
        Outcome::ProtocolError
    }

    /// How many streams a connection carries at once: the plan's number, else the
    /// server's limit up to [`DEFAULT_STREAMS`]; never more than the server allows.
    fn stream_slots(&self, conn: &Conn) -> u32 {
        // Without keep-alive a connection carries one request.
        let wanted = match &self.shared.http2 {
            Some(http2) if self.shared.keepalive => http2.streams.unwrap_or(DEFAULT_STREAMS),
            _ => 1,
        };
        conn.watch
            .max_streams
            .get()
            .map_or(wanted, |limit| wanted.min(limit))
            .max(1)
    }

    /// A failed attempt to open a connection for `pending`, as its sample.
    pub(super) fn connect_failure(
        &self,
        pending: &Pending,
        outcome: Outcome,
        phases: Phases,
    ) -> Sample {
        let mut sample = self.sample_for(pending);
        sample.phases = phases;
        sample.outcome = outcome;
        sample.done_at_ns = self.now_ns();
        if let Some(reason) = self.connector.take_failure() {
            self.recorder
                .borrow_mut()
                .note_failure_detail(outcome, || reason);
        }
        sample
    }

    pub(super) fn sample_for(&self, pending: &Pending) -> Sample {
        let ticket = pending.ticket;
        let mut sample = Sample::new(ticket.intended_ns);
        sample.seq = ticket.seq;
        sample.released_at_ns = ticket.released_ns;
        sample.warmup = ticket.warmup;
        sample.sent_at_ns = self.first_sent_ns(pending);
        sample.retried_after = ticket.retry.map(|r| r.after);
        sample
    }

    /// When `pending`'s request was first sent: its latency's send and its timeout run
    /// from there, whatever resends followed.
    pub(super) fn first_sent_ns(&self, pending: &Pending) -> u64 {
        match pending.ticket.retry {
            Some(retry) => retry.first_sent_ns,
            None => nanos(pending.sent_at.saturating_duration_since(self.start.get())),
        }
    }
}

/// A hint when a server answered an HTTP/2 preface in HTTP/1.x.
fn http1_hint(first_bytes: &[u8]) -> &'static str {
    if first_bytes.starts_with(b"HTTP/1.") {
        ": it answered in HTTP/1.x, so it does not speak h2c (HTTP/2 without TLS, prior knowledge) on this port; \
         use https:// if it serves h2 over TLS, or drop --http2"
    } else {
        ""
    }
}

/// The streams a connection task started (on any of its connections) and not yet ended.
#[derive(Default)]
pub(super) struct Live {
    pub(super) count: Cell<u32>,
    pub(super) ended: Signal,
}

impl Live {
    pub(super) async fn wait_idle(&self) {
        loop {
            let mark = self.ended.mark();
            if self.count.get() == 0 {
                return;
            }
            self.ended.since(mark).await;
        }
    }
}

/// Opens a stream for `pending` on `conn` (at once, from the connection's task) and
/// leaves waiting for its answer to a task of its own, which records what became of it
/// (or hands the ticket back to be sent elsewhere).
fn start_stream(worker: &Rc<Worker>, conn: &Rc<Conn>, live: &Rc<Live>, pending: Pending) {
    let sent = match open_stream(worker, conn, pending) {
        Ok(sent) => sent,
        // Never on the wire: it goes again (policy or not), within its attempts.
        Err(failed) => {
            let (ticket, sample) = *failed;
            let exchanged = match worker.again(ticket, &sample) {
                Some((ticket, wait)) => Exchanged::Again(ticket, wait),
                None => Exchanged::Done(sample),
            };
            live.count.set(live.count.get() + 1);
            worker.in_flight.set(worker.in_flight.get() + 1);
            let (worker, live) = (worker.clone(), live.clone());
            tokio::task::spawn_local(async move {
                worker.settle(exchanged).await;
                live.count.set(live.count.get() - 1);
                live.ended.notify();
            });
            return;
        }
    };
    conn.busy.set(conn.busy.get() + 1);
    live.count.set(live.count.get() + 1);
    worker.in_flight.set(worker.in_flight.get() + 1);
    let (worker, conn, live) = (worker.clone(), conn.clone(), live.clone());
    tokio::task::spawn_local(async move {
        let exchanged = finish_stream(&worker, &conn, sent).await;
        conn.busy.set(conn.busy.get() - 1);
        worker.note_goaways(&conn);
        conn.watch.changed.notify();
        worker.settle(exchanged).await;
        live.count.set(live.count.get() - 1);
        live.ended.notify();
    });
}

/// What became of one stream.
pub(super) enum Exchanged {
    Done(Sample),
    /// The request goes back, after this wait, to be sent on another connection.
    Again(Ticket, Duration),
}

/// Attempts in all for a request the server did not process (the first and three
/// resends), each within the request's timeout. Go's HTTP/2 client makes up to 7, a
/// second and more apart; a benchmark's timeout is shorter, and a server that refuses a
/// request four times in a row will not take it on the fifth: the request then fails
/// as what the server said, not as a timeout.
const MAX_ATTEMPTS: u8 = 4;

/// How long a request waits before it goes again after `attempts` attempts: at once
/// after the first (a GOAWAY at a reload is routine, and the next connection takes it),
/// then 10 ms, then 20 ms, so that a server refusing everything is not stormed with new
/// connections and streams.
fn resend_wait(attempts: u8) -> Duration {
    match attempts {
        0 | 1 => Duration::ZERO,
        n => Duration::from_millis(10 << (n - 2).min(6)),
    }
}

/// A stream on its way: what its task waits on.
struct Sent {
    pending: Pending,
    sample: Sample,
    write_at: Instant,
    response: h2::client::ResponseFuture,
    body_out: h2::SendStream<Bytes>,
}

/// Opens a stream for `pending` on `conn` and queues its request (no wait). A
/// connection that takes no new stream gives the ticket back, with the request as it
/// failed there (never sent), and takes no more.
fn open_stream(
    worker: &Worker,
    conn: &Conn,
    pending: Pending,
) -> Result<Sent, Box<(Ticket, Sample)>> {
    let http2 = worker.shared.http2.as_ref().expect("an HTTP/2 run");
    let mut sample = worker.sample_for(&pending);
    let write_at = Instant::now();
    let end_of_stream = http2.body.is_empty();
    let opened = conn
        .send
        .borrow_mut()
        .send_request(http2.request(), end_of_stream);
    let (response, body_out) = match opened {
        Ok(pair) => pair,
        // Never on the wire (the connection closed or went away since it was looked
        // at): another connection sends it.
        Err(_) => {
            conn.refused.set(true);
            conn.watch.changed.notify();
            sample.outcome = if conn.watch.last_goaway().is_some() {
                Outcome::GoawayUnprocessed
            } else {
                Outcome::ResetBeforeWrite
            };
            sample.done_at_ns = worker.now_ns();
            return Err(Box::new((pending.ticket, sample)));
        }
    };
    let opened = conn.opened.take();
    sample.connection_reused = opened.is_none();
    if let Some(p) = opened {
        sample.phases.dns_ns = p.dns_ns;
        sample.phases.connect_ns = p.connect_ns;
        sample.phases.tls_ns = p.tls_ns;
    }
    let watch = &conn.watch;
    watch.sent.set(watch.sent.get() + 1);
    watch.in_flight.set(watch.in_flight.get() + 1);
    worker
        .recorder
        .borrow_mut()
        .record_streams_in_flight(u64::from(watch.in_flight.get()));
    Ok(Sent {
        pending,
        sample,
        write_at,
        response,
        body_out,
    })
}

/// Waits for a stream's answer and reads it to the end.
async fn finish_stream(worker: &Worker, conn: &Conn, sent: Sent) -> Exchanged {
    let http2 = worker.shared.http2.as_ref().expect("an HTTP/2 run");
    let Sent {
        pending,
        mut sample,
        write_at,
        response,
        mut body_out,
    } = sent;
    let end_of_stream = http2.body.is_empty();
    let watch = &conn.watch;
    let mut bytes = 0u64;
    let mut first_byte = None;
    let mut heard = Heard::default();
    let stall = Stall {
        worker,
        since: Cell::new(None),
    };
    let attempt = async {
        if !end_of_stream {
            send_body(&stall, &mut body_out, &http2.body).await?;
        }
        let answer = response.await?;
        first_byte = Some(Instant::now());
        let status = answer.status().as_u16();
        heard = worker.hear(answer.headers());
        let mut body = answer.into_body();
        while let Some(chunk) = body.data().await {
            let chunk = chunk?;
            bytes += chunk.len() as u64;
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        Ok::<u16, h2::Error>(status)
    };
    // The timeout runs from the first attempt's send: sending again never extends it.
    let deadline = worker.deadline(sample.sent_at_ns);
    let result = tokio::time::timeout_at(deadline.into(), attempt).await;
    let done = Instant::now();
    stall.end();
    watch.in_flight.set(watch.in_flight.get() - 1);
    sample.outcome = match result {
        Ok(Ok(status)) => Outcome::Status(status),
        Ok(Err(e)) => classify(&e, conn, first_byte.is_some(), worker),
        Err(_elapsed) => Outcome::ReadTimeout,
    };
    // A stream the server never processed may go again whatever its method (RFC 9113
    // §8.7), as often as the timeout allows, as browsers and Go's client do; one that
    // died with its connection before any answer goes once, as over HTTP/1.1.
    let unprocessed = sample.outcome.unprocessed();
    let raced = sample.outcome == Outcome::Eof && first_byte.is_none() && sample.connection_reused;
    sample.done_at_ns = nanos(done.saturating_duration_since(worker.start.get()));
    let again = (unprocessed && http2.retry_unprocessed)
        || (raced && worker.shared.retry && pending.ticket.retry.is_none());
    if again {
        if let Some((ticket, wait)) = worker.again(pending.ticket, &sample) {
            return Exchanged::Again(ticket, wait);
        }
    }
    complete(&mut sample, bytes, write_at, first_byte, done, heard);
    Exchanged::Done(sample)
}

/// Sends the request body as the server's flow-control window allows; a body that has to
/// wait for window is counted with how long it waited.
/// A body that never gets window (the request times out, or its stream ends, while it
/// waits) is counted too, by [`Stall::end`] when the attempt is over.
async fn send_body(
    stall: &Stall<'_>,
    out: &mut h2::SendStream<Bytes>,
    body: &Bytes,
) -> Result<(), h2::Error> {
    let mut rest = body.clone();
    out.reserve_capacity(rest.len());
    while !rest.is_empty() {
        if out.capacity() == 0 {
            stall.begin();
            match std::future::poll_fn(|cx| out.poll_capacity(cx)).await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e),
                None => break,
            }
        }
        let n = out.capacity().min(rest.len());
        let chunk = rest.split_to(n);
        out.send_data(chunk, rest.is_empty())?;
    }
    stall.end();
    Ok(())
}

/// When a request body first waited for flow-control window, until the wait is counted.
struct Stall<'a> {
    worker: &'a Worker,
    since: Cell<Option<Instant>>,
}

impl Stall<'_> {
    fn begin(&self) {
        if self.since.get().is_none() {
            self.since.set(Some(Instant::now()));
        }
    }

    /// Counts the wait, if there was one and it is not counted yet.
    fn end(&self) {
        if let Some(since) = self.since.take() {
            self.worker
                .recorder
                .borrow_mut()
                .record_flow_control_stall(nanos(since.elapsed()));
        }
    }
}

/// The outcome of a stream that ended in an error.
fn classify(e: &h2::Error, conn: &Conn, answered: bool, worker: &Worker) -> Outcome {
    let outcome = if e.is_go_away() && e.is_remote() {
        // h2 fails with the GOAWAY itself exactly the streams above its last-stream-id.
        Outcome::GoawayUnprocessed
    } else if e.is_reset() && e.is_remote() {
        Outcome::rst_stream(e.reason().map_or(0, u32::from))
    } else if let Some(io) = e.get_io() {
        if conn.watch.last_goaway().is_some() {
            Outcome::GoawayProcessedLost
        } else {
            match io.kind() {
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::UnexpectedEof => {
                    if answered {
                        Outcome::ResetAfterWrite
                    } else {
                        Outcome::Eof
                    }
                }
                std::io::ErrorKind::InvalidData if worker.connector.tls.is_some() => {
                    Outcome::TlsError
                }
                _ => Outcome::ResetAfterWrite,
            }
        }
    } else {
        Outcome::ProtocolError
    };
    if outcome == Outcome::ProtocolError {
        worker
            .recorder
            .borrow_mut()
            .note_failure_detail(outcome, || format!("HTTP/2: {e}"));
    }
    outcome
}
