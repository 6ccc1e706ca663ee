//! gRPC load (issue #34): unary calls ([`crate::Kind::Grpc`]) and server streams
//! ([`crate::Kind::GrpcStream`]) to the echo service of `proto/ingressbench/echo/v1/
//! echo.proto`, through tonic's client (its framing, codec, statuses and streaming) over
//! hyper's HTTP/2 on this engine's own TCP and TLS connections (ALPN `h2`, or h2c with
//! prior knowledge to an `http://` target).
//!
//! Unary: each connection is one HTTP/2 connection, its calls due on the open-loop
//! schedule and sent as they fall due, as many at once as are outstanding; each is timed
//! from when it was due to its answer, and its answer must carry its sequence number.
//! Outcomes are gRPC's statuses (`grpc:ok`, `grpc:unavailable`, …) when the call was
//! answered, the proxy's HTTP status when it answered without gRPC (`502`), and HTTP/2's
//! own when it was not: a stream reset mid-call (`rst_stream:cancel`), refused by a
//! GOAWAY before the server processed it (`goaway_unprocessed`), or lost with a
//! connection that ended after a GOAWAY (`goaway_processed_lost`). A call the server
//! never processed (a GOAWAY's, or `REFUSED_STREAM`) is sent again on a new connection,
//! as gRPC's clients do (transparent retry), keeping its due time; the sample says so.
//! A connection that went away is a cut; the calls due while none is open are sent once
//! one is, unless older than the timeout by then (unsent).
//!
//! Server streams: each connection holds one stream open, asking the backend for
//! messages on the client's schedule (as for server-sent events, both ends know when each
//! was due, and each is timed from then); a stream that ends is a close with its status,
//! and the connection asks for the messages after the last it saw, on the same HTTP/2
//! connection if it is still up (the proxy's own, while only the backend went), on a new
//! one if not.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use hyper::client::conn::http2::SendRequest;
use ingressbench_stats::{Outcome, Phases};
use tonic::body::Body;

use crate::stream::{
    drive, ClosedBy, Downtime, Numbered, Out, Pacer, Run, Said, StreamKind, StreamOptions,
};
use crate::{LoadError, LoadReport, Observer, Plan, Scheme};

/// The messages of `proto/ingressbench/echo/v1/echo.proto`, written out for prost.
pub(crate) mod proto {
    /// `ingressbench.echo.v1.Message`: a call, its answer, or a stream's message.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Message {
        /// The call's sequence number on its connection, or the message's id.
        #[prost(uint64, tag = "1")]
        pub(crate) seq: u64,
        /// When it was due, in nanoseconds.
        #[prost(uint64, tag = "2")]
        pub(crate) due_ns: u64,
        /// Filling to the size asked for.
        #[prost(bytes = "vec", tag = "3")]
        pub(crate) payload: Vec<u8>,
    }

    /// `ingressbench.echo.v1.StreamRequest`: which messages a stream asks for, when.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct StreamRequest {
        /// The first message's id.
        #[prost(uint64, tag = "1")]
        pub(crate) from: u64,
        /// One past the last message's id.
        #[prost(uint64, tag = "2")]
        pub(crate) count: u64,
        /// Between two messages' due times.
        #[prost(uint64, tag = "3")]
        pub(crate) every_ns: u64,
        /// When message 0 is due, on the wall clock.
        #[prost(uint64, tag = "4")]
        pub(crate) epoch_ns: u64,
        /// Each message's size on the wire.
        #[prost(uint32, tag = "5")]
        pub(crate) bytes: u32,
    }
}

/// The echo service's unary method.
pub const UNARY_PATH: &str = "/ingressbench.echo.v1.Echo/Unary";
/// The echo service's server-streaming method.
pub const STREAM_PATH: &str = "/ingressbench.echo.v1.Echo/Stream";

/// How many times a call the server never processed is sent (the first and two more).
const MOST_ATTEMPTS: u8 = 3;

/// Runs a unary plan ([`crate::Kind::Grpc`]) to its end or until `stop` is set.
pub(crate) fn run_unary(
    plan: &Plan,
    options: &StreamOptions,
    stop: Arc<AtomicBool>,
    observer: &mut dyn Observer,
) -> Result<LoadReport, LoadError> {
    drive(
        plan,
        (StreamKind::Grpc, options),
        stop,
        observer,
        unary_connection,
    )
}

/// Runs a server-streaming plan ([`crate::Kind::GrpcStream`]) to its end or until `stop`
/// is set.
pub(crate) fn run_stream(
    plan: &Plan,
    options: &StreamOptions,
    stop: Arc<AtomicBool>,
    observer: &mut dyn Observer,
) -> Result<LoadReport, LoadError> {
    drive(
        plan,
        (StreamKind::GrpcStream, options),
        stop,
        observer,
        stream_connection,
    )
}

/// What a call's answer said before tonic read it: its HTTP status (0: none came) and
/// the backend that answered.
#[derive(Default)]
struct Seen {
    status: AtomicU16,
    backend: OnceLock<String>,
}

/// hyper's HTTP/2 client as the service tonic calls through; each answer's status and
/// backend go to the [`Seen`] its request carries.
#[derive(Clone)]
struct Service {
    send: SendRequest<Body>,
    backend_header: http::HeaderName,
}

impl tower_service::Service<http::Request<Body>> for Service {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, hyper::Error>>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let seen = request.extensions().get::<Arc<Seen>>().cloned();
        let header = self.backend_header.clone();
        let answer = self.send.send_request(request);
        Box::pin(async move {
            let response = answer.await?;
            if let Some(seen) = seen {
                seen.status
                    .store(response.status().as_u16(), Ordering::Relaxed);
                if let Some(name) = response.headers().get(&header) {
                    let _ = seen
                        .backend
                        .set(String::from_utf8_lossy(name.as_bytes()).into_owned());
                }
            }
            Ok(response)
        })
    }
}

/// Runs hyper's connection tasks on the connection's own thread.
#[derive(Clone, Copy)]
struct Local;

impl<F: Future + 'static> hyper::rt::Executor<F> for Local {
    fn execute(&self, future: F) {
        tokio::task::spawn_local(future);
    }
}

/// One HTTP/2 connection to the target.
struct Connection {
    grpc: tonic::client::Grpc<Service>,
    /// How it ended (who, and why), once its task did.
    ended: Rc<RefCell<Option<(ClosedBy, String)>>>,
    /// A GOAWAY refused a call on it: no new one goes on it.
    going_away: Cell<bool>,
}

impl Connection {
    /// Why no new call goes on it, if none does.
    fn gone(&self) -> Option<(ClosedBy, String)> {
        if let Some(ended) = self.ended.borrow().clone() {
            return Some(ended);
        }
        self.going_away
            .get()
            .then(|| (ClosedBy::Server, "GOAWAY".to_owned()))
    }
}

/// Opens an HTTP/2 connection: TCP, TLS with ALPN `h2` (or none: h2c), HTTP/2's
/// preface and settings.
async fn open(run: &Run) -> Result<(Connection, Phases), String> {
    let plan = &run.plan;
    let mut phases = Phases::default();
    let stream = run.connect(&mut phases).await?;
    let handshake = hyper::client::conn::http2::Builder::new(Local)
        .handshake::<_, Body>(hyper_util::rt::TokioIo::new(stream));
    let (send, connection) = match tokio::time::timeout(plan.timeout, handshake).await {
        Err(_) => return Err("HTTP/2: no settings within the timeout".into()),
        Ok(Err(e)) => return Err(format!("HTTP/2: {e}")),
        Ok(Ok(pair)) => pair,
    };
    let ended = Rc::new(RefCell::new(None));
    let said = ended.clone();
    tokio::task::spawn_local(async move {
        let why = match connection.await {
            Ok(()) => (ClosedBy::Server, "the connection closed".to_owned()),
            Err(e) => (ClosedBy::Abnormal, format!("the connection broke: {e}")),
        };
        *said.borrow_mut() = Some(why);
    });
    let scheme = match plan.target.scheme {
        Scheme::Https => "https",
        Scheme::Http => "http",
    };
    // A `Host` header routes the calls, as it does HTTP/2 requests: it is their
    // `:authority`, not a metadata entry of its own.
    let origin: http::Uri = format!("{scheme}://{}", plan.request.host_header(&plan.target))
        .parse()
        .map_err(|e| format!("the target's authority: {e}"))?;
    let service = Service {
        send,
        backend_header: http::HeaderName::from_bytes(plan.backend_header.as_bytes())
            .map_err(|e| format!("the backend header: {e}"))?,
    };
    let connection = Connection {
        // The client's own limit (4 MiB by default) never refuses an echo of the size
        // sent: were it to, tonic would give `out_of_range` as if the server had said it.
        grpc: tonic::client::Grpc::with_origin(service, origin)
            .max_decoding_message_size(message_limit(run.options.message_bytes))
            .max_encoding_message_size(message_limit(run.options.message_bytes)),
        ended,
        going_away: Cell::new(false),
    };
    Ok((connection, phases))
}

/// The most a message may hold either way: twice the size sent and a margin, and no less
/// than gRPC's usual 4 MiB.
fn message_limit(message_bytes: usize) -> usize {
    (message_bytes.saturating_mul(2) + (64 << 10)).max(4 << 20)
}

/// Waits until the connection takes another call (HTTP/2's stream limit); why not.
async fn ready(grpc: &mut tonic::client::Grpc<Service>) -> Result<(), tonic::Status> {
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::from_error(e.into()))
}

/// A request with the plan's headers as metadata and a [`Seen`] for its answer.
fn request<T>(run: &Run, message: T) -> (tonic::Request<T>, Arc<Seen>) {
    let mut request = tonic::Request::new(message);
    for (name, value) in &run.plan.request.headers {
        if name.eq_ignore_ascii_case("host") {
            continue;
        }
        let (Ok(name), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) else {
            continue;
        };
        request.metadata_mut().insert(name, value);
    }
    let seen = Arc::new(Seen::default());
    request.extensions_mut().insert(seen.clone());
    (request, seen)
}

/// What became of a call or stream that did not end with an OK status: the outcome, the
/// words a close says, and whether the server never processed it (so it may be sent
/// again). Read from what HTTP/2 said first (tonic reads a broken connection as status
/// UNKNOWN, which would hide it), then from the answer's HTTP status, then gRPC's.
fn failure(
    status: &tonic::Status,
    seen: &Seen,
    connection: &Connection,
) -> (Outcome, String, bool) {
    let mut transport = None;
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            let reason = h2.reason().unwrap_or(h2::Reason::NO_ERROR);
            if h2.is_go_away() && h2.is_remote() {
                connection.going_away.set(true);
                return (
                    Outcome::GoawayUnprocessed,
                    format!("GOAWAY ({reason:?}) before the server processed it"),
                    true,
                );
            }
            if h2.is_reset() {
                return (
                    Outcome::rst_stream(u32::from(reason)),
                    format!("RST_STREAM ({reason:?})"),
                    reason == h2::Reason::REFUSED_STREAM,
                );
            }
            // HTTP/2's own words over hyper's ("error reading a body from connection").
            transport = Some(h2.to_string());
        }
        if let Some(hyper) = error.downcast_ref::<hyper::Error>() {
            if hyper.is_closed() {
                // hyper's channel to the connection had closed: the call never left the
                // client (the connection had ended, after a GOAWAY when it ended well).
                connection.going_away.set(true);
                let outcome = match connection.ended.borrow().as_ref() {
                    Some((ClosedBy::Abnormal, _)) => Outcome::ResetBeforeWrite,
                    _ => Outcome::GoawayUnprocessed,
                };
                return (outcome, "never sent: the connection had ended".into(), true);
            }
            transport.get_or_insert_with(|| hyper.to_string());
        }
        source = error.source();
    }
    if let Some(what) = transport {
        // The connection broke (or ended after a GOAWAY) before the answer did.
        let outcome = if connection.going_away.get() {
            Outcome::GoawayProcessedLost
        } else {
            Outcome::ResetAfterWrite
        };
        return (outcome, format!("the connection broke: {what}"), false);
    }
    match seen.status.load(Ordering::Relaxed) {
        0 => (
            Outcome::ResetAfterWrite,
            format!("no answer: {}", status.message()),
            false,
        ),
        200 => {
            let outcome = Outcome::grpc(status.code() as u32);
            let mut why = format!("{}", outcome.name());
            if !status.message().is_empty() {
                why = format!("{why}: {}", status.message());
            }
            (outcome, why, false)
        }
        http => (Outcome::Status(http), format!("status {http}"), false),
    }
}

/// A connection's calls in flight, shared with their tasks.
#[derive(Default)]
struct Calls {
    outstanding: Cell<u64>,
    /// Calls the server never processed, to send again on the next connection.
    again: RefCell<VecDeque<(u64, Out, u8)>>,
    /// The run's end counted what was still out: answers from here are not recorded.
    over: Cell<bool>,
    /// A call ended (or asks to be sent again).
    changed: tokio::sync::Notify,
}

/// One connection's unary calls, on one HTTP/2 connection after another, to the end of
/// the run.
async fn unary_connection(run: Rc<Run>, index: usize) {
    let connections = run.plan.connections as f64;
    let mut due = run.start + run.interval.mul_f64(index as f64 / connections);
    let mut seq = 0u64;
    let mut down = Downtime::new(index);
    let mut clock = Pacer::new(run.start, run.plan.batch_window);
    let calls = Rc::new(Calls::default());
    tokio::time::sleep_until(run.start.into()).await;
    'run: while Instant::now() < run.end && !run.stop.load(Ordering::Relaxed) {
        let (connection, phases) = match open(&run).await {
            Ok(opened) => opened,
            Err(why) => {
                run.failed(&mut down, why);
                if !down.wait(&run).await {
                    break;
                }
                continue;
            }
        };
        let connection = Rc::new(connection);
        run.reopened(&mut down, None);
        let mut opened = Some(phases);
        // What fell due while no connection was open: too old to send, or sent now.
        let now = Instant::now();
        while due + run.plan.timeout < now && due < run.end {
            run.report.borrow_mut().unsent += 1;
            run.record(Out::unsent(run.ns(due)), Outcome::NotSent, None, 0);
            due += run.interval;
        }
        let cut = loop {
            if run.stop.load(Ordering::Relaxed) || due >= run.end {
                run.open.set(run.open.get() - 1);
                break 'run;
            }
            if let Some(gone) = connection.gone() {
                break gone;
            }
            let again = calls.again.borrow_mut().pop_front();
            if let Some((number, mut out, attempts)) = again {
                // Sent again from now, on this connection (its phases are not the call's).
                out.released_ns = run.ns(Instant::now());
                out.sent_ns = out.released_ns;
                out.opened = None;
                let task = call(&run, &connection, &calls, (number, out, attempts));
                tokio::task::spawn_local(task);
                continue;
            }
            tokio::select! {
                biased;
                () = calls.changed.notified() => {}
                () = clock.sleep_until(due) => {
                    let due_ns = run.ns(due);
                    let now_ns = run.ns(Instant::now());
                    let out = Out {
                        due_ns,
                        released_ns: now_ns,
                        sent_ns: now_ns,
                        opened: opened.take(),
                        retried_after: None,
                    };
                    run.report.borrow_mut().sent += 1;
                    let task = call(&run, &connection, &calls, (seq, out, 1));
                    tokio::task::spawn_local(task);
                    seq += 1;
                    due += run.interval;
                }
            }
        };
        run.cut(&mut down, (cut.0, Said::Nothing, cut.1), None, 0);
        if !down.wait(&run).await {
            break;
        }
    }
    // Never reconnected: what fell due from here to the end was never sent.
    while due < run.end {
        run.report.borrow_mut().unsent += 1;
        run.record(Out::unsent(run.ns(due)), Outcome::NotSent, None, 0);
        due += run.interval;
    }
    // The answers still coming, for one timeout (at most a second); what is still out
    // then is in flight at the end, as requests a stopped HTTP run abandons.
    let deadline = Instant::now() + run.plan.timeout.min(Duration::from_secs(1));
    while calls.outstanding.get() > 0 && Instant::now() < deadline {
        let _ = tokio::time::timeout_at(deadline.into(), calls.changed.notified()).await;
    }
    calls.over.set(true);
    let (out, again) = (calls.outstanding.get(), calls.again.borrow().len() as u64);
    let mut report = run.report.borrow_mut();
    report.in_flight_at_end += out + again;
    run.recorder.borrow_mut().record_waiting_at_end(out + again);
}

/// One unary call (`number`, due as `out` says, its `attempt`), recorded when it ends,
/// or queued to be sent again if the server never processed it.
fn call(
    run: &Rc<Run>,
    connection: &Rc<Connection>,
    calls: &Rc<Calls>,
    (number, mut out, attempt): (u64, Out, u8),
) -> impl Future<Output = ()> + 'static {
    let (run, connection, calls) = (run.clone(), connection.clone(), calls.clone());
    calls.outstanding.set(calls.outstanding.get() + 1);
    async move {
        let message = proto::Message {
            seq: number,
            due_ns: out.due_ns,
            payload: vec![0; run.options.message_bytes.saturating_sub(24)],
        };
        let (request, seen) = request(&run, message);
        let mut grpc = connection.grpc.clone();
        let answer = tokio::time::timeout(run.plan.timeout, async {
            ready(&mut grpc).await?;
            grpc.unary::<_, proto::Message, _>(
                request,
                PathAndQuery::from_static(UNARY_PATH),
                tonic_prost::ProstCodec::default(),
            )
            .await
        })
        .await;
        calls.outstanding.set(calls.outstanding.get() - 1);
        calls.changed.notify_one();
        if calls.over.get() {
            return;
        }
        let backend = seen
            .backend
            .get()
            .map(|name| run.recorder.borrow_mut().backend_id(name.as_bytes()));
        let (outcome, bytes) = match answer {
            Err(_) => (Outcome::ReadTimeout, 0),
            Ok(Ok(reply)) if reply.get_ref().seq == number => {
                let bytes = prost::Message::encoded_len(reply.get_ref()) as u64;
                (Outcome::grpc(0), bytes)
            }
            Ok(Ok(reply)) => {
                let got = reply.get_ref().seq;
                run.recorder
                    .borrow_mut()
                    .note_failure_detail(Outcome::Malformed, || {
                        format!("the server answered call {number} with the echo of call {got}: it is not echoing what it was sent")
                    });
                (Outcome::Malformed, 0)
            }
            Ok(Err(status)) => {
                let (outcome, _, unprocessed) = failure(&status, &seen, &connection);
                if unprocessed && attempt < MOST_ATTEMPTS {
                    out.retried_after = Some(outcome);
                    calls
                        .again
                        .borrow_mut()
                        .push_back((number, out, attempt + 1));
                    return;
                }
                (outcome, 0)
            }
        };
        run.record(out, outcome, backend, bytes);
        let mut report = run.report.borrow_mut();
        if outcome.is_ok() {
            report.echoed += 1;
        } else {
            report.lost += 1;
        }
    }
}

/// One connection's server streams, one after another, to the end of the run: on the
/// same HTTP/2 connection while it is up, on a new one when not.
async fn stream_connection(run: Rc<Run>, index: usize) {
    let mut messages = Numbered::new(&run, index);
    let mut down = Downtime::new(index);
    let mut connection: Option<Rc<Connection>> = None;
    tokio::time::sleep_until(run.start.into()).await;
    while Instant::now() < run.end && messages.to_come(&run) {
        let mut phases = None;
        if connection.as_ref().is_none_or(|c| c.gone().is_some()) {
            match open(&run).await {
                Ok((opened, opening)) => {
                    connection = Some(Rc::new(opened));
                    phases = Some(opening);
                }
                Err(why) => {
                    run.failed(&mut down, why);
                    if !down.wait(&run).await {
                        messages.give_up(&run);
                        return;
                    }
                    continue;
                }
            }
        }
        let Some(on) = connection.clone() else {
            continue;
        };
        match listen(&run, &on, &mut messages, &mut down, phases).await {
            Ended::RunOver => {
                run.open.set(run.open.get() - 1);
                break;
            }
            Ended::NotOpened => {}
            Ended::Cut {
                by,
                status,
                reason,
                backend,
            } => {
                let said = status.map_or(Said::Nothing, Said::Status);
                run.cut(&mut down, (by, said, reason), backend, 0);
            }
        }
        if !down.wait(&run).await {
            messages.give_up(&run);
            return;
        }
    }
    messages.finish(&run);
}

/// How a server stream ended.
enum Ended {
    /// The run is over (or stopped).
    RunOver,
    /// It was not opened (the attempt is counted as failed, with why).
    NotOpened,
    /// It ended before the run did: who ended it, its status if it had one
    /// (`grpc:unavailable`), why, and the backend it was on.
    Cut {
        by: ClosedBy,
        status: Option<String>,
        reason: String,
        backend: Option<String>,
    },
}

/// Asks for the messages after the last seen and reads them until the run or the
/// stream ends.
async fn listen(
    run: &Run,
    connection: &Connection,
    messages: &mut Numbered,
    down: &mut Downtime,
    phases: Option<Phases>,
) -> Ended {
    let ask = proto::StreamRequest {
        from: messages.last_id().map_or(0, |id| id + 1),
        count: messages.count(),
        every_ns: u64::try_from(run.interval.as_nanos()).unwrap_or(u64::MAX),
        epoch_ns: u64::try_from(messages.epoch_ns()).unwrap_or(u64::MAX),
        bytes: u32::try_from(run.options.message_bytes).unwrap_or(u32::MAX),
    };
    let (request, seen) = request(run, ask);
    let mut grpc = connection.grpc.clone();
    let opening = tokio::time::timeout(run.plan.timeout, async {
        ready(&mut grpc).await?;
        grpc.server_streaming::<_, proto::Message, _>(
            request,
            PathAndQuery::from_static(STREAM_PATH),
            tonic_prost::ProstCodec::default(),
        )
        .await
    })
    .await;
    let mut stream = match opening {
        Err(_) => {
            run.failed(down, "the stream's answer: timed out".into());
            return Ended::NotOpened;
        }
        Ok(Err(status)) => {
            let (_, why, _) = failure(&status, &seen, connection);
            run.failed(down, why);
            return Ended::NotOpened;
        }
        Ok(Ok(response)) => response.into_inner(),
    };
    let backend_name = seen.backend.get().cloned();
    let cut_by = down.close;
    let backend = run.reopened(down, backend_name.as_deref());
    let mut opened = Some(phases.unwrap_or_default());
    let mut cut_by = cut_by;
    let deadline = run.end + run.plan.timeout.min(Duration::from_secs(1));
    loop {
        messages.expire(run, backend);
        if !messages.to_come(run) {
            return Ended::RunOver;
        }
        let next = tokio::time::timeout_at(
            deadline
                .min(Instant::now() + Duration::from_millis(100))
                .into(),
            stream.message(),
        )
        .await;
        let (by, status, reason) = match next {
            Err(_) if Instant::now() >= deadline => return Ended::RunOver,
            Err(_) => continue,
            Ok(Ok(Some(message))) => {
                let bytes = prost::Message::encoded_len(&message) as u64;
                let came = (message.seq, bytes, Outcome::grpc(0));
                let skipped = messages.came(run, came, backend, &mut opened);
                if let Some(close) = cut_by.take() {
                    if let Some(close) = run.report.borrow_mut().closes.get_mut(close) {
                        close.lost += skipped;
                    }
                }
                continue;
            }
            Ok(Ok(None)) => {
                let ok = Outcome::grpc(0).name().into_owned();
                (ClosedBy::Server, Some(ok), "the stream ended".to_owned())
            }
            Ok(Err(status)) => {
                let (outcome, why, _) = failure(&status, &seen, connection);
                match outcome {
                    Outcome::Grpc(_) => (ClosedBy::Server, Some(outcome.name().into_owned()), why),
                    _ => (ClosedBy::Abnormal, None, why),
                }
            }
        };
        return Ended::Cut {
            by,
            status,
            reason,
            backend: backend_name,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field numbers and types written out for prost are the proto file's: each
    /// field encoded alone starts with the key the file gives it (number << 3 | wire
    /// type), so the backend and a peer tool given the file read what this client sends.
    #[test]
    fn the_messages_match_the_proto_file() {
        let file = include_str!("../../../proto/ingressbench/echo/v1/echo.proto");
        let fields = |message: &str| -> Vec<(String, String, u32)> {
            let body = file
                .split(&format!("message {message} {{"))
                .nth(1)
                .and_then(|rest| rest.split('}').next())
                .unwrap_or_else(|| panic!("no message {message} in the proto file"));
            body.lines()
                .map(str::trim)
                .filter(|l| !l.starts_with("//") && l.contains('='))
                .map(|l| {
                    let l = l.trim_end_matches(';');
                    let (left, number) = l.split_once('=').unwrap();
                    let mut words = left.split_whitespace();
                    let kind = words.next().unwrap().to_owned();
                    let name = words.next().unwrap().to_owned();
                    (name, kind, number.trim().parse().unwrap())
                })
                .collect()
        };
        let key = |kind: &str, number: u32| {
            let wire = if kind == "bytes" { 2 } else { 0 };
            (number << 3) | wire
        };
        let message = fields("Message");
        assert_eq!(message.len(), 3, "{message:?}");
        for (name, kind, number) in &message {
            let mut m = proto::Message::default();
            match name.as_str() {
                "seq" => m.seq = 7,
                "due_ns" => m.due_ns = 7,
                "payload" => m.payload = vec![7],
                other => panic!("a field {other} the client does not write"),
            }
            let bytes = prost::Message::encode_to_vec(&m);
            assert_eq!(u32::from(bytes[0]), key(kind, *number), "Message.{name}");
        }
        let ask = fields("StreamRequest");
        assert_eq!(ask.len(), 5, "{ask:?}");
        for (name, kind, number) in &ask {
            let mut m = proto::StreamRequest::default();
            match name.as_str() {
                "from" => m.from = 7,
                "count" => m.count = 7,
                "every_ns" => m.every_ns = 7,
                "epoch_ns" => m.epoch_ns = 7,
                "bytes" => m.bytes = 7,
                other => panic!("a field {other} the client does not write"),
            }
            let bytes = prost::Message::encode_to_vec(&m);
            assert_eq!(
                u32::from(bytes[0]),
                key(kind, *number),
                "StreamRequest.{name}"
            );
        }
        for path in [UNARY_PATH, STREAM_PATH] {
            let method = path.rsplit('/').next().unwrap();
            assert!(file.contains(&format!("rpc {method}(")), "{path}");
            assert!(path.starts_with("/ingressbench.echo.v1.Echo/"));
        }
        assert!(file.contains("package ingressbench.echo.v1;"));
    }
}
