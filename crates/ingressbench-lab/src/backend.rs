//! The echo backend: a small HTTP/1.1 server that plays the service behind the proxies.
//! A connection that opens with HTTP/2's preface is served over HTTP/2 (h2c with prior
//! knowledge), so that a proxy can speak HTTP/2 to its upstreams (`http2.rs`).
//!
//! Every response names the backend in an `x-backend` header, the protocol it was asked
//! over in [`PROTOCOL_HEADER`] (so what a proxy speaks to its upstreams can be seen), and
//! echoes the path it was asked for in `x-echo-path` (so a path rewrite by a proxy can be
//! seen). It can be made slow (fixed, uniform or lognormal latency), return errors at a
//! rate, or stop answering periodically (a stall), or on demand through its control
//! endpoint ([`serve_control`]: `POST /stall?for=2s`). `/healthz` answers 200 while
//! serving and 503 while draining. When `shutdown` completes it drains: it stops
//! accepting, finishes the requests in flight (answering them with `Connection: close`),
//! closes idle connections and returns.

use std::future::Future;
use std::io;
use std::str::FromStr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::LabError;

mod control;
mod grpc;
mod http2;
mod http3;
mod sse;
mod websocket;

pub use control::{serve_control, CONTROL_TOKEN_ENV, CONTROL_TOKEN_HEADER};
pub use http3::{serve_http3, Http3Options};
pub use websocket::{WebSocketBehaviour, DRAIN_CLOSE_REASON};

/// The size of nginx's welcome page, the body most published comparisons served.
pub const DEFAULT_BODY_BYTES: usize = 615;
/// The response header naming the protocol a request reached the backend over
/// (`HTTP/1.1` or `HTTP/2`).
pub const PROTOCOL_HEADER: &str = "x-backend-protocol";
/// The response header giving how many bytes of request body the backend received
/// (present only when there were any), so what a proxy passed on can be checked.
pub const BODY_HEADER: &str = "x-received-body-bytes";
/// A request head larger than this gets 431 and the connection is closed.
const HEAD_LIMIT: usize = 64 * 1024;

/// How long a backend takes before answering.
#[derive(Clone, Debug, PartialEq)]
pub enum Latency {
    /// Always this long.
    Fixed(Duration),
    /// Uniformly between the two.
    Uniform(Duration, Duration),
    /// Lognormal with this median and 99th percentile (a long tail, like real services).
    LogNormal {
        /// Median.
        median: Duration,
        /// 99th percentile; must be at least the median.
        p99: Duration,
    },
}

impl FromStr for Latency {
    type Err = LabError;

    /// `5ms` (fixed), `uniform:1ms-5ms`, `lognormal:2ms,p99=20ms`.
    fn from_str(s: &str) -> Result<Self, LabError> {
        let bad = |reason: String| LabError::InvalidBackend {
            field: "--latency".into(),
            reason,
        };
        let dur = |v: &str| ingressbench_stats::parse_duration(v).map_err(bad);
        if let Some(range) = s.strip_prefix("uniform:") {
            let (lo, hi) = range.split_once('-').ok_or_else(|| {
                bad(format!(
                    "`{s}`: write uniform:MIN-MAX, e.g. uniform:1ms-5ms"
                ))
            })?;
            let (lo, hi) = (dur(lo)?, dur(hi)?);
            if lo > hi {
                return Err(bad(format!("`{s}`: the minimum is above the maximum")));
            }
            Ok(Latency::Uniform(lo, hi))
        } else if let Some(spec) = s.strip_prefix("lognormal:") {
            let (median, p99) = spec.split_once(",p99=").ok_or_else(|| {
                bad(format!(
                    "`{s}`: write lognormal:MEDIAN,p99=P99, e.g. lognormal:2ms,p99=20ms"
                ))
            })?;
            let (median, p99) = (dur(median)?, dur(p99)?);
            if p99 < median || median.is_zero() {
                return Err(bad(format!(
                    "`{s}`: p99 must be at least the median, and the median above 0"
                )));
            }
            Ok(Latency::LogNormal { median, p99 })
        } else {
            Ok(Latency::Fixed(dur(s.strip_prefix("fixed:").unwrap_or(s))?))
        }
    }
}

/// Periodic stalls: answers due within `duration` after each multiple of `every` (from
/// the backend's start) are held until the stall ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    /// How often a stall begins, counted from the backend's start.
    pub every: Duration,
    /// Length of each stall.
    pub duration: Duration,
}

/// Answers held back until an instant: a stall asked for through the control endpoint.
/// Clones share it.
#[derive(Clone, Debug, Default)]
pub struct Hold(std::sync::Arc<std::sync::Mutex<Option<tokio::time::Instant>>>);

impl Hold {
    /// Holds every answer due from now until `duration` has passed.
    pub fn hold_for(&self, duration: Duration) {
        let until = tokio::time::Instant::now() + duration;
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *held = Some(held.map_or(until, |h| h.max(until)));
    }

    /// Until when answers are held, if they are now.
    fn until(&self) -> Option<tokio::time::Instant> {
        let held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        held.filter(|h| *h > tokio::time::Instant::now())
    }
}

/// How a backend behaves.
#[derive(Clone, Debug)]
pub struct BackendConfig {
    /// Sent back in the `x-backend` header.
    pub name: String,
    /// Body size of a normal answer.
    pub body_bytes: usize,
    /// Status of a normal answer.
    pub status: u16,
    /// Time before answering.
    pub latency: Latency,
    /// Share of requests answered 500 instead (0 to 1).
    pub error_rate: f64,
    /// Periodic stalls.
    pub stall: Option<Stall>,
    /// Stalls asked for through the control endpoint.
    pub hold: Hold,
    /// How long a drain may take before the remaining connections are dropped.
    pub drain_timeout: Duration,
    /// Serve over TLS instead of plain HTTP.
    pub tls: Option<BackendTls>,
    /// Answer at most this many requests a second, one after another, each taking
    /// its share of a second; the rest wait their turn: a server whose capacity is
    /// known by construction ([`Queue`]).
    pub at_most: Option<f64>,
    /// What it does with WebSocket messages, and with WebSockets when it drains.
    pub websocket: WebSocketBehaviour,
    /// Bytes each request it answers keeps and never frees: a server whose leak is known
    /// by construction, for soak tests (0: none).
    pub leak_per_request: usize,
}

/// Memory kept and never freed, a piece per request answered ([`BackendConfig::leak_per_request`]).
#[derive(Debug)]
struct Leak {
    per_request: usize,
    kept: std::sync::Mutex<Vec<Box<[u8]>>>,
}

impl Leak {
    /// Keeps one more piece, written to so that its pages are resident.
    fn keep(&self) {
        let piece = vec![0xa5u8; self.per_request].into_boxed_slice();
        if let Ok(mut kept) = self.kept.lock() {
            kept.push(piece);
        }
    }
}

/// One server's queue: each answer takes `service` of it, one after another, whatever
/// the connection; an answer waits for its turn. Its capacity is exactly one over
/// `service`: below it answers take `service` (plus the wait when arrivals bunch), above
/// it the queue, and every answer's wait, grows without bound.
#[derive(Debug)]
pub struct Queue {
    service: Duration,
    next_free: std::sync::Mutex<Instant>,
}

impl Queue {
    /// A queue serving `per_s` answers a second.
    pub fn new(per_s: f64) -> Self {
        Self {
            service: Duration::from_secs_f64(1.0 / per_s),
            next_free: std::sync::Mutex::new(Instant::now()),
        }
    }

    /// Takes the next turn for an answer asked at `now`: when it is done.
    fn turn(&self, now: Instant) -> Instant {
        let mut next_free = self.next_free.lock().unwrap_or_else(|p| p.into_inner());
        let done = (*next_free).max(now) + self.service;
        *next_free = done;
        done
    }
}

/// A backend's TLS: its certificate, and the CA its clients' certificates must come from
/// (mutual TLS, as a mesh's inbound sidecar demands).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendTls {
    /// Certificate chain (PEM).
    pub cert: std::path::PathBuf,
    /// Private key (PEM).
    pub key: std::path::PathBuf,
    /// Require a client certificate issued by this CA (PEM).
    pub client_ca: Option<std::path::PathBuf>,
}

impl BackendTls {
    /// The server configuration over TCP, offering `h2` and `http/1.1`.
    pub fn acceptor(&self) -> io::Result<tokio_rustls::TlsAcceptor> {
        let mut config = self.server_config()?;
        // HTTP/2 when the proxy asks for it (an HTTP/2 upstream), as on plain connections.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)))
    }

    /// The TLS server configuration, with no ALPN yet; errors name the file that is wrong.
    pub(crate) fn server_config(&self) -> io::Result<rustls::ServerConfig> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let named = |path: &std::path::Path| {
            let path = path.display().to_string();
            move |e: rustls_pki_types::pem::Error| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{path}: {e}"))
            }
        };
        let certs = CertificateDer::pem_file_iter(&self.cert)
            .map_err(named(&self.cert))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(named(&self.cert))?;
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(named(&self.key))?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let tls_error = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidInput, e);
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(tls_error)?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(ca).map_err(named(ca))? {
                    roots.add(cert.map_err(named(ca))?).map_err(tls_error)?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    std::sync::Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        builder.with_single_cert(certs, key).map_err(tls_error)
    }
}

impl Default for BackendConfig {
    fn default() -> Self {
        Self {
            name: "backend".to_owned(),
            body_bytes: DEFAULT_BODY_BYTES,
            status: 200,
            latency: Latency::Fixed(Duration::ZERO),
            error_rate: 0.0,
            stall: None,
            hold: Hold::default(),
            drain_timeout: Duration::from_secs(30),
            tls: None,
            at_most: None,
            websocket: WebSocketBehaviour::default(),
            leak_per_request: 0,
        }
    }
}

impl BackendConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), LabError> {
        let bad = |field: &str, reason: String| {
            Err(LabError::InvalidBackend {
                field: field.into(),
                reason,
            })
        };
        if self.name.is_empty() || !self.name.bytes().all(|b| b.is_ascii_graphic()) {
            return bad(
                "--name",
                format!("`{}` must be printable ASCII without spaces", self.name),
            );
        }
        if !(100..=599).contains(&self.status) {
            return bad(
                "--status",
                format!("{} is not an HTTP status (100-599)", self.status),
            );
        }
        if let Some(r) = self
            .at_most
            .filter(|r| !(r.is_finite() && (1.0..=1e7).contains(r)))
        {
            return bad(
                "--serve-at-most",
                format!("{r} is not a rate between 1 and 10,000,000 answers a second"),
            );
        }
        if !(0.0..=1.0).contains(&self.error_rate) {
            return bad(
                "--error-rate",
                format!("{} is not between 0 and 1", self.error_rate),
            );
        }
        if self.body_bytes > 64 * 1024 * 1024 {
            return bad("--body-bytes", "at most 64 MiB".to_owned());
        }
        if self.leak_per_request > 16 * 1024 * 1024 {
            return bad("--leak-per-request", "at most 16 MiB".to_owned());
        }
        if let Some(stall) = self.stall {
            if stall.every.is_zero() || stall.duration >= stall.every {
                return bad(
                    "--stall-for",
                    "a stall must be shorter than its period (--stall-every)".to_owned(),
                );
            }
        }
        Ok(())
    }
}

/// What a backend did, reported when it returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServeReport {
    /// Connections accepted.
    pub connections: u64,
    /// Of them, connections that spoke HTTP/2.
    pub http2_connections: u64,
    /// Requests answered.
    pub requests: u64,
    /// Connections still open when the drain timed out.
    pub dropped_at_drain: u64,
    /// Requests upgraded to WebSockets.
    pub websockets: u64,
    /// WebSocket messages sent back.
    pub websocket_messages: u64,
    /// Requests answered with an event stream.
    pub event_streams: u64,
    /// Server-sent events sent.
    pub events: u64,
    /// gRPC unary calls answered.
    pub grpc_calls: u64,
    /// gRPC server streams answered.
    pub grpc_streams: u64,
    /// Messages sent on them.
    pub grpc_messages: u64,
}

/// Serves on `listener` until `shutdown` completes, then drains and returns.
pub async fn serve(
    listener: TcpListener,
    config: BackendConfig,
    shutdown: impl Future<Output = ()>,
) -> io::Result<ServeReport> {
    let (template, drain_tx) = Connection::first(&config)?;
    let acceptor = config.tls.as_ref().map(BackendTls::acceptor).transpose()?;
    let responses = template.responses.clone();
    let mut connections = JoinSet::new();
    let mut report = ServeReport::default();
    let mut seed = template.rng;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                report.connections += 1;
                let _ = stream.set_nodelay(true);
                seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut conn = template.clone();
                conn.rng = seed | 1;
                match &acceptor {
                    None => {
                        connections.spawn(conn.run(stream));
                    }
                    Some(acceptor) => {
                        let handshake = acceptor.accept(stream);
                        connections.spawn(async move {
                            // A failed handshake (no client certificate, a wrong one) is
                            // the client's error; the connection just ends.
                            match handshake.await {
                                Ok(tls) => conn.run(tls).await,
                                Err(_) => 0,
                            }
                        });
                    }
                }
            }
            Some(done) = connections.join_next(), if !connections.is_empty() => {
                report.requests += done.unwrap_or(0);
            }
        }
    }
    drop(listener);
    let _ = drain_tx.send(true);
    let deadline = tokio::time::Instant::now() + config.drain_timeout;
    while !connections.is_empty() {
        match tokio::time::timeout_at(deadline, connections.join_next()).await {
            Ok(Some(done)) => report.requests += done.unwrap_or(0),
            Ok(None) => break,
            Err(_) => {
                report.dropped_at_drain = connections.len() as u64;
                connections.abort_all();
                break;
            }
        }
    }
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    report.http2_connections = count(&responses.http2_connections);
    report.websockets = count(&responses.websockets);
    report.websocket_messages = count(&responses.websocket_messages);
    report.event_streams = count(&responses.event_streams);
    report.events = count(&responses.events);
    report.grpc_calls = count(&responses.grpc_calls);
    report.grpc_streams = count(&responses.grpc_streams);
    report.grpc_messages = count(&responses.grpc_messages);
    Ok(report)
}

/// Responses rendered once: the head up to the echoed path, the rest, and the bodies
/// (and for HTTP/2 the status and name the heads carry).
struct Responses {
    ok_head: Vec<u8>,
    error_head: Vec<u8>,
    ok_body: bytes::Bytes,
    error_body: bytes::Bytes,
    status: u16,
    name: String,
    /// Connections served over HTTP/2 so far.
    http2_connections: std::sync::atomic::AtomicU64,
    /// Requests upgraded to WebSockets so far.
    websockets: std::sync::atomic::AtomicU64,
    /// WebSocket messages sent back so far (on WebSockets that have ended).
    websocket_messages: std::sync::atomic::AtomicU64,
    /// Requests answered with an event stream so far.
    event_streams: std::sync::atomic::AtomicU64,
    /// Server-sent events sent so far (on streams that have ended).
    events: std::sync::atomic::AtomicU64,
    /// gRPC unary calls answered so far.
    grpc_calls: std::sync::atomic::AtomicU64,
    /// gRPC server streams answered so far.
    grpc_streams: std::sync::atomic::AtomicU64,
    /// Messages sent on gRPC streams so far (on streams that have ended).
    grpc_messages: std::sync::atomic::AtomicU64,
}

impl Responses {
    fn new(config: &BackendConfig) -> Self {
        let filler = b"<p>ingressbench echo backend</p>\n";
        let ok_body: Vec<u8> = filler
            .iter()
            .copied()
            .cycle()
            .take(config.body_bytes)
            .collect();
        let error_body = b"backend error (injected by --error-rate)\n".to_vec();
        let head = |status: u16| {
            format!("HTTP/1.1 {status} {}\r\nServer: ingressbench-backend\r\nContent-Type: text/html\r\nx-backend: {}\r\n{PROTOCOL_HEADER}: HTTP/1.1\r\n", reason(status), config.name).into_bytes()
        };
        Self {
            ok_head: head(config.status),
            error_head: head(500),
            ok_body: ok_body.into(),
            error_body: error_body.into(),
            status: config.status,
            name: config.name.clone(),
            http2_connections: std::sync::atomic::AtomicU64::new(0),
            websockets: std::sync::atomic::AtomicU64::new(0),
            websocket_messages: std::sync::atomic::AtomicU64::new(0),
            event_streams: std::sync::atomic::AtomicU64::new(0),
            events: std::sync::atomic::AtomicU64::new(0),
            grpc_calls: std::sync::atomic::AtomicU64::new(0),
            grpc_streams: std::sync::atomic::AtomicU64::new(0),
            grpc_messages: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        400 => "Bad Request",
        404 => "Not Found",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

#[derive(Clone)]
struct Connection {
    responses: std::sync::Arc<Responses>,
    latency: Latency,
    error_rate: f64,
    stall: Option<Stall>,
    hold: Hold,
    started: Instant,
    rng: u64,
    drain: watch::Receiver<bool>,
    queue: Option<std::sync::Arc<Queue>>,
    websocket: WebSocketBehaviour,
    leak: Option<std::sync::Arc<Leak>>,
}

/// One parsed request head.
struct Request {
    head_len: usize,
    body_len: usize,
    path_start: usize,
    path_end: usize,
    close: bool,
    head_method: bool,
    /// Where the `Sec-WebSocket-Key` is, when the request asks to upgrade to a WebSocket.
    websocket_key: Option<(usize, usize)>,
    /// Where its query is, when it accepts `text/event-stream` (none: it does not).
    event_stream: Option<(usize, usize)>,
    /// Its `Last-Event-ID`, when it is a number.
    last_event_id: Option<u64>,
}

impl Connection {
    /// The connection every other is a copy of (each with a seed of its own), for a
    /// backend serving `config` from now on, and the sender that starts its drain.
    fn first(config: &BackendConfig) -> io::Result<(Connection, watch::Sender<bool>)> {
        config
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let (drain_tx, drain) = watch::channel(false);
        let first = Connection {
            responses: std::sync::Arc::new(Responses::new(config)),
            latency: config.latency.clone(),
            error_rate: config.error_rate,
            stall: config.stall,
            hold: config.hold.clone(),
            started: Instant::now(),
            rng: 0x853c_49e6_748f_ea9b,
            drain,
            queue: config.at_most.map(|r| std::sync::Arc::new(Queue::new(r))),
            websocket: config.websocket,
            leak: (config.leak_per_request > 0).then(|| {
                std::sync::Arc::new(Leak {
                    per_request: config.leak_per_request,
                    kept: std::sync::Mutex::new(Vec::new()),
                })
            }),
        };
        Ok((first, drain_tx))
    }

    /// Keeps this request's piece of the leak, if the backend leaks.
    fn leak(&self) {
        if let Some(leak) = &self.leak {
            leak.keep();
        }
    }

    /// Serves one connection; returns the number of requests answered.
    async fn run<S>(mut self, mut stream: S) -> u64
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let mut buf = Vec::with_capacity(4096);
        let mut out = Vec::with_capacity(1024);
        let mut answered = 0;
        // Body bytes of the request being read that were already dropped: a body is
        // counted as it comes, never held (any size, in bounded memory).
        let mut dropped = 0;
        loop {
            // HTTP/2's preface (or what may still become it) is no HTTP/1.1 request.
            let maybe_http2 = answered == 0 && http2::may_be_preface(&buf);
            if maybe_http2 && buf.len() >= http2::PREFACE.len() {
                return self.run_http2(std::mem::take(&mut buf), stream).await;
            }
            // Answer every complete request already buffered (pipelining included).
            loop {
                if maybe_http2 {
                    break;
                }
                let request = match parse_request(&buf) {
                    Ok(Some(r)) if buf.len() + dropped >= r.head_len + r.body_len => r,
                    Ok(Some(r)) => {
                        dropped += buf.len() - r.head_len;
                        buf.truncate(r.head_len);
                        break;
                    }
                    Ok(None) => break,
                    Err(status) => {
                        let _ = stream
                            .write_all(&simple_response(status, "bad request\n", true))
                            .await;
                        return answered;
                    }
                };
                let draining = *self.drain.borrow();
                if let (Some((start, end)), false) = (request.websocket_key, draining) {
                    // The upgrade waits as an answer would; then the connection is the
                    // WebSocket's.
                    self.wait_before_answering().await;
                    let answer =
                        websocket::switching_protocols(&buf[start..end], &self.responses.name);
                    if stream.write_all(&answer).await.is_err() {
                        return answered;
                    }
                    self.responses
                        .websockets
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let rest = buf.split_off(request.head_len + request.body_len - dropped);
                    let sent =
                        websocket::echo(stream, rest, self.websocket, self.drain.clone()).await;
                    self.responses
                        .websocket_messages
                        .fetch_add(sent, std::sync::atomic::Ordering::Relaxed);
                    return answered + 1;
                }
                if let (Some((start, end)), false) = (request.event_stream, draining) {
                    // The stream's head waits as an answer would; then the connection is
                    // the stream's until its end.
                    self.wait_before_answering().await;
                    let schedule =
                        match sse::Schedule::parse(&buf[start..end], request.last_event_id) {
                            Ok(schedule) => schedule,
                            Err(why) => {
                                let _ = stream
                                    .write_all(&simple_response(400, &format!("{why}\n"), true))
                                    .await;
                                return answered;
                            }
                        };
                    if stream
                        .write_all(&sse::head(&self.responses.name))
                        .await
                        .is_err()
                    {
                        return answered;
                    }
                    self.responses
                        .event_streams
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let sent =
                        sse::send(&mut stream, schedule, self.websocket, self.drain.clone()).await;
                    self.responses
                        .events
                        .fetch_add(sent, std::sync::atomic::Ordering::Relaxed);
                    let _ = stream.shutdown().await;
                    return answered + 1;
                }
                let close = request.close || draining;
                self.wait_before_answering().await;
                self.render(&buf, &request, close || *self.drain.borrow(), &mut out);
                if stream.write_all(&out).await.is_err() {
                    return answered;
                }
                answered += 1;
                buf.drain(..request.head_len + request.body_len - dropped);
                dropped = 0;
                if close || *self.drain.borrow() {
                    let _ = stream.shutdown().await;
                    return answered;
                }
            }
            if buf.len() > HEAD_LIMIT {
                let _ = stream
                    .write_all(&simple_response(431, "request head too large\n", true))
                    .await;
                return answered;
            }
            if buf.capacity() - buf.len() < 1024 {
                buf.reserve(4096);
            }
            let idle = buf.is_empty();
            tokio::select! {
                read = stream.read_buf(&mut buf) => match read {
                    Ok(0) | Err(_) => return answered,
                    Ok(_) => {}
                },
                // Draining: an idle connection is closed; one mid-request finishes first.
                _ = self.drain.wait_for(|d| *d), if idle => return answered,
            }
        }
    }

    async fn wait_before_answering(&mut self) {
        if let Some(until) = self.hold.until() {
            tokio::time::sleep_until(until).await;
        }
        if let Some(stall) = self.stall {
            let since = self.started.elapsed();
            let into = Duration::from_nanos((since.as_nanos() % stall.every.as_nanos()) as u64);
            if into < stall.duration {
                tokio::time::sleep(stall.duration - into).await;
            }
        }
        let delay = match self.latency {
            Latency::Fixed(d) => d,
            Latency::Uniform(lo, hi) => lo + (hi - lo).mul_f64(self.uniform()),
            Latency::LogNormal { median, p99 } => {
                // ln(X) ~ N(mu, sigma): mu = ln(median), sigma from the p99 (z = 2.3263).
                let sigma = (p99.as_secs_f64() / median.as_secs_f64()).ln() / 2.326_348;
                let z = self.standard_normal();
                Duration::from_secs_f64((median.as_secs_f64().ln() + sigma * z).exp().min(3600.0))
            }
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if let Some(queue) = &self.queue {
            let done = queue.turn(Instant::now());
            tokio::time::sleep_until(done.into()).await;
        }
    }

    fn render(&mut self, buf: &[u8], request: &Request, close: bool, out: &mut Vec<u8>) {
        out.clear();
        let path = &buf[request.path_start..request.path_end];
        if path == b"/healthz" {
            let draining = *self.drain.borrow();
            let (status, body) = if draining {
                (503, "draining\n")
            } else {
                (200, "ok\n")
            };
            out.extend_from_slice(&simple_response(status, body, close));
            return;
        }
        self.leak();
        let error = self.error_rate > 0.0 && self.uniform() < self.error_rate;
        let r = &*self.responses;
        let (head, body) = if error {
            (&r.error_head, &r.error_body)
        } else {
            (&r.ok_head, &r.ok_body)
        };
        out.extend_from_slice(head);
        out.extend_from_slice(b"x-echo-path: ");
        // The path is echoed as received, minus anything that could break the header.
        out.extend(path.iter().copied().filter(|b| b.is_ascii_graphic()));
        out.extend_from_slice(b"\r\n");
        if request.body_len > 0 {
            out.extend_from_slice(BODY_HEADER.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(request.body_len.to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if close {
            out.extend_from_slice(b"Connection: close\r\n");
        }
        out.extend_from_slice(b"Content-Length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
        if !request.head_method {
            out.extend_from_slice(body);
        }
    }

    fn uniform(&mut self) -> f64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn standard_normal(&mut self) -> f64 {
        // Box-Muller.
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

fn simple_response(status: u16, body: &str, close: bool) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {}\r\nServer: ingressbench-backend\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{}\r\n{body}",
        reason(status),
        body.len(),
        if close { "Connection: close\r\n" } else { "" }
    )
    .into_bytes()
}

/// Parses a request head at the start of `buf`: `Ok(None)` until it is complete, `Err`
/// with the status to answer when it cannot be served.
fn parse_request(buf: &[u8]) -> Result<Option<Request>, u16> {
    let Some(end) = memchr::memmem::find(buf, b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = &buf[..end];
    let line_end = memchr::memchr(b'\r', head).unwrap_or(head.len());
    let line = &head[..line_end];
    let mut parts = line.split(|&b| b == b' ');
    let method = parts.next().ok_or(400u16)?;
    let target = parts.next().ok_or(400u16)?;
    let version = parts.next().ok_or(400u16)?;
    if !version.starts_with(b"HTTP/1.") || method.is_empty() {
        return Err(400);
    }
    let path_start = target.as_ptr() as usize - buf.as_ptr() as usize;
    let path_len = target
        .iter()
        .position(|&b| b == b'?')
        .unwrap_or(target.len());
    let mut body_len = 0;
    let mut close = version == b"HTTP/1.0";
    let (mut upgrade, mut key) = (false, None);
    let (mut event_stream, mut last_event_id) = (false, None);
    for header in head[line_end..].split(|&b| b == b'\n').skip(1) {
        let header = header.strip_suffix(b"\r").unwrap_or(header);
        let Some(colon) = memchr::memchr(b':', header) else {
            continue;
        };
        let (name, value) = (&header[..colon], header[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"content-length") {
            body_len = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.parse().ok())
                .ok_or(400u16)?;
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // The lab's clients never send chunked bodies; refuse rather than misframe.
            return Err(501);
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            upgrade = value.eq_ignore_ascii_case(b"websocket");
        } else if name.eq_ignore_ascii_case(b"accept") {
            event_stream = memchr::memmem::find(value, b"text/event-stream").is_some();
        } else if name.eq_ignore_ascii_case(b"last-event-id") {
            last_event_id = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
        } else if name.eq_ignore_ascii_case(b"sec-websocket-key") {
            let start = value.as_ptr() as usize - buf.as_ptr() as usize;
            key = Some((start, start + value.len()));
        } else if name.eq_ignore_ascii_case(b"connection") {
            if value.eq_ignore_ascii_case(b"close") {
                close = true;
            } else if value.eq_ignore_ascii_case(b"keep-alive") {
                close = false;
            }
        }
    }
    Ok(Some(Request {
        head_len: end + 4,
        body_len,
        path_start,
        path_end: path_start + path_len,
        close,
        head_method: method == b"HEAD",
        websocket_key: key.filter(|_| upgrade),
        event_stream: event_stream.then(|| {
            let query_start = (path_start + path_len + 1).min(path_start + target.len());
            (query_start, path_start + target.len())
        }),
        last_event_id,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_specs() {
        assert_eq!(
            "5ms".parse::<Latency>().unwrap(),
            Latency::Fixed(Duration::from_millis(5))
        );
        assert_eq!(
            "uniform:1ms-5ms".parse::<Latency>().unwrap(),
            Latency::Uniform(Duration::from_millis(1), Duration::from_millis(5))
        );
        assert!(matches!(
            "lognormal:2ms,p99=20ms".parse::<Latency>().unwrap(),
            Latency::LogNormal { .. }
        ));
        for bad in [
            "uniform:5ms-1ms",
            "lognormal:2ms",
            "lognormal:20ms,p99=2ms",
            "soon",
        ] {
            assert!(bad.parse::<Latency>().is_err(), "{bad}");
        }
    }

    #[test]
    fn request_heads() {
        let raw = b"GET /a/b?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET";
        let r = parse_request(raw).unwrap().unwrap();
        assert_eq!(&raw[r.path_start..r.path_end], b"/a/b");
        assert_eq!((r.head_len + r.body_len, r.close), (raw.len() - 3, false));
        let r = parse_request(b"GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(r.close);
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\nHost: x\r\n")
                .unwrap()
                .map(|r| r.head_len),
            None
        );
        assert_eq!(parse_request(b"garbage\r\n\r\n").err(), Some(400));
    }

    #[test]
    fn the_queue_serves_one_answer_at_a_time_at_its_rate() {
        let queue = Queue::new(1000.0);
        let now = Instant::now();
        let ms = |n: u64| Duration::from_millis(n);
        // Three asked at once: done one service time apart.
        assert_eq!(queue.turn(now), now + ms(1));
        assert_eq!(queue.turn(now), now + ms(2));
        assert_eq!(queue.turn(now), now + ms(3));
        // One asked after the queue emptied takes its own service time only.
        assert_eq!(queue.turn(now + ms(10)), now + ms(11));
        let bad = BackendConfig {
            at_most: Some(0.0),
            ..BackendConfig::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--serve-at-most"));
    }

    #[test]
    fn lognormal_has_the_asked_median_and_tail() {
        let (tx, rx) = watch::channel(false);
        drop(tx);
        let mut c = Connection {
            responses: std::sync::Arc::new(Responses::new(&BackendConfig::default())),
            latency: Latency::Fixed(Duration::ZERO),
            error_rate: 0.0,
            stall: None,
            hold: Hold::default(),
            started: Instant::now(),
            rng: 12345,
            drain: rx,
            queue: None,
            websocket: WebSocketBehaviour::default(),
            leak: None,
        };
        let sigma = (20.0f64 / 2.0).ln() / 2.326_348;
        let mut draws: Vec<f64> = (0..20_000)
            .map(|_| (2.0f64.ln() + sigma * c.standard_normal()).exp())
            .collect();
        draws.sort_by(f64::total_cmp);
        let (median, p99) = (draws[10_000], draws[19_800]);
        assert!((median - 2.0).abs() < 0.1, "median {median}");
        assert!((p99 - 20.0).abs() < 2.5, "p99 {p99}");
    }
}
