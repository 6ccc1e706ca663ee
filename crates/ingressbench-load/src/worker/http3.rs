//! HTTP/3 connections: QUIC over UDP (the `quinn` crate) with HTTP/3's framing (the `h3`
//! crate). As over HTTP/2, a connection carries up to `streams` requests at once, one per
//! stream, and its task takes the worker's next ticket whenever a slot is free; a
//! worker's connections share one UDP socket, as a browser's do.
//!
//! What is QUIC's own is named as QUIC names it: a handshake that no answer came to
//! (nothing serves QUIC there: UDP has no refusal), a stateless reset (the server no
//! longer knows the connection, as after a restart), the idle timeout, a version
//! mismatch, a CONNECTION_CLOSE with its transport or HTTP/3 code, a stream reset with its
//! HTTP/3 code. A request the server says it did not process (`H3_REQUEST_REJECTED`, or
//! refused for a GOAWAY before it went out) goes again, bounded as over HTTP/2. A
//! GOAWAY's stream id, which the `h3` crate keeps to itself, is read from the server's
//! control stream on its way to h3 ([`control`]): a request cut with its connection after
//! a GOAWAY is unprocessed (and goes again) when its stream is at or above that id, and
//! processed and lost below it, as the GOAWAY says.

mod control;

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use ingressbench_stats::{Outcome, Phases};

use super::http2::{Exchanged, Http2, Live, Pending, Signal};
use super::multiplexed::{complete, Heard, Multiplexed};
use super::Worker;
use crate::connection::nanos;
use crate::{LoadError, Plan, Protocol, DEFAULT_STREAMS};

/// HTTP/3's code for a connection closed with nothing wrong (RFC 9114 §8.1).
const H3_NO_ERROR: u32 = 0x100;

/// The shortest idle timeout a connection is given (below, the plan's `--timeout`).
const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(1);

/// What every HTTP/3 connection of a run shares.
pub(crate) struct Http3 {
    /// The request, with the fields it has over HTTP/2 (pseudo-headers, no
    /// connection-specific headers), and the streams and resends the plan asks for.
    request: Http2,
    client: quinn::ClientConfig,
    /// Asks for the connections to move to a new local port.
    migrate: crate::Migrate,
    /// With `--zero-rtt`: the server's session tickets, which resumed connections take
    /// (each one once, the newest first) to send their first requests as 0-RTT data.
    tickets: Option<Arc<rustls::client::ClientSessionMemoryCache>>,
    /// The TLS server name (`--sni`, else the URL's host), which the tickets are kept
    /// under too.
    tls_name: rustls::pki_types::ServerName<'static>,
}

impl Http3 {
    pub(crate) fn new(plan: &Plan) -> Result<Self, LoadError> {
        let mut tls = crate::tls::client_config_for(&plan.tls, Protocol::Http3)?;
        // The name is one TLS can send (quinn takes it as text): said up front, as over TCP.
        let tls_name = crate::tls::server_name(&plan.tls, &plan.target.host)?;
        let tickets = plan.tls.zero_rtt.then(|| {
            // rustls's in-memory store (256 servers, 8 tickets each), shared by the
            // worker's connections, and early data when a ticket allows it.
            let store = Arc::new(rustls::client::ClientSessionMemoryCache::new(256));
            let mut config = (*tls).clone();
            config.resumption = rustls::client::Resumption::store(store.clone());
            config.enable_early_data = true;
            tls = Arc::new(config);
            store
        });
        let crypto =
            quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| LoadError::Tls {
                path: None,
                reason: format!("QUIC needs TLS 1.3: {e}"),
            })?;
        let mut client = quinn::ClientConfig::new(Arc::new(crypto));
        // A server that goes silent (a process gone with the UDP socket its connections
        // lived on: nothing refuses, nothing resets) is given up after as long as a
        // request may take, not quinn's 30 s, and PINGs keep a quiet connection from
        // timing out while the server is there.
        let idle = plan.timeout.max(MIN_IDLE_TIMEOUT);
        let mut transport = quinn::TransportConfig::default();
        transport.max_idle_timeout(idle.try_into().ok());
        transport.keep_alive_interval(Some(idle / 3));
        client.transport_config(Arc::new(transport));
        Ok(Self {
            request: Http2::new(plan)?,
            client,
            migrate: plan.migrate.clone(),
            tickets,
            tls_name,
        })
    }
}

/// One open HTTP/3 connection, shared by its task and its streams' tasks.
pub(super) struct Conn {
    send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    quic: quinn::Connection,
    /// Set when the connection's driver ended (closed, or broken).
    ended: Rc<Cell<bool>>,
    /// Set when a new stream could not be opened on it: it takes no more.
    going_away: Cell<bool>,
    /// Set when the server's GOAWAY came, or a new stream was refused for it: a stream
    /// cut with it after that may have been one the GOAWAY covered.
    goaway_heard: Cell<bool>,
    /// The lowest stream id a GOAWAY named: the server processes no request at or
    /// above it.
    goaway: Cell<Option<u64>>,
    /// Streams handed a ticket and not ended.
    busy: Cell<u32>,
    /// Streams it was handed in all.
    sent: Cell<u64>,
    /// Woken when a stream ends or the connection does.
    changed: Rc<Signal>,
    /// The handshake's phases, for the first stream to go out on it.
    opened: Cell<Option<Phases>>,
    /// What became of its 0-RTT data, if it sent any.
    early: tokio::sync::watch::Receiver<Early>,
}

/// A connection's 0-RTT: whether it sent its first requests before the handshake
/// completed (a resumed session, `--zero-rtt`) and what the server made of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Early {
    /// A full handshake: nothing was sent before it completed.
    NotTried,
    /// Sent, the handshake not yet complete.
    Pending,
    /// The server took the 0-RTT data.
    Taken,
    /// The server rejected it (it no longer held the session): every stream opened so
    /// far failed unprocessed, and the connection is closed.
    Rejected,
    /// The handshake never completed: its requests failed as a handshake does.
    Failed(Outcome),
}

impl Conn {
    /// What became of its 0-RTT data, once the handshake has said (at once when none was
    /// sent).
    async fn early_settled(&self) -> Early {
        let mut early = self.early.clone();
        let settled = early.wait_for(|e| *e != Early::Pending).await;
        settled.map_or(Early::NotTried, |e| *e)
    }
}

impl Multiplexed for Conn {
    const OPENING: &'static str =
        "the QUIC handshake: nothing serves HTTP/3 on that UDP port, or it answers too slowly";

    async fn open(worker: &Rc<Worker>, id: u64, phases: &mut Phases) -> Result<Rc<Self>, Outcome> {
        Worker::open_http3(worker, id, phases).await
    }

    fn set_opened(&self, phases: Phases) {
        self.opened.set(Some(phases));
    }

    fn open_for_streams(&self, max: u64) -> bool {
        !self.ended.get() && !self.going_away.get() && self.sent.get() < max
    }

    fn busy(&self) -> u32 {
        self.busy.get()
    }

    fn slots(&self, worker: &Worker) -> u32 {
        worker.http3_slots()
    }

    fn changed(&self) -> &Signal {
        &self.changed
    }

    fn start_stream(worker: &Rc<Worker>, conn: &Rc<Self>, live: &Rc<Live>, pending: Pending) {
        start_stream(worker, conn, live, pending);
    }

    fn done(&self) {
        self.quic.close(H3_NO_ERROR.into(), b"");
    }
}

impl Worker {
    fn http3(&self) -> &Http3 {
        self.shared.http3.as_ref().expect("an HTTP/3 run")
    }

    /// The worker's UDP socket (made on first use, in the worker's runtime), of the
    /// address family of `to`.
    fn quic_endpoint(&self, to: SocketAddr) -> Result<quinn::Endpoint, Outcome> {
        if let Some(endpoint) = self.quic.borrow().as_ref() {
            return Ok(endpoint.clone());
        }
        let local: SocketAddr = if to.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let endpoint = quinn::Endpoint::client(local).map_err(|e| {
            self.connector.fail(
                Outcome::ConnectError,
                format!("cannot open a UDP socket for QUIC: {e}"),
            )
        })?;
        *self.quic.borrow_mut() = Some(endpoint.clone());
        tokio::task::spawn_local(migrations(
            endpoint.clone(),
            local,
            self.http3().migrate.clone(),
        ));
        Ok(endpoint)
    }

    /// Opens a QUIC connection and HTTP/3 on it; the handshake (transport and TLS are one
    /// in QUIC, one round trip) is its connect phase. Its opening and, unless the client
    /// closed it, its end are recorded as connection `id`'s.
    async fn open_http3(
        self: &Rc<Self>,
        id: u64,
        phases: &mut Phases,
    ) -> Result<Rc<Conn>, Outcome> {
        let (addr, from) = self.connector.resolve(phases).await?;
        let endpoint = self.quic_endpoint(addr)?;
        let http3 = self.http3();
        let started = Instant::now();
        let connecting = endpoint
            .connect_with(http3.client.clone(), addr, &http3.tls_name.to_str())
            .map_err(|e| {
                self.connector.fail(
                    Outcome::ConnectError,
                    format!("QUIC to {addr} ({from}): {e}"),
                )
            })?;
        // With a ticket from an earlier connection, the requests go before the handshake
        // completes (0-RTT), and the handshake's end says whether the server took them.
        let early = match http3.tickets {
            Some(_) => connecting.into_0rtt(),
            None => Err(connecting),
        };
        let (quic, accepted) = match early {
            Ok((quic, accepted)) => (quic, Some(accepted)),
            Err(connecting) => {
                let quic = connecting
                    .await
                    .map_err(|e| self.handshake_failure(&e, addr, from))?;
                (quic, None)
            }
        };
        phases.connect_ns = nanos(started.elapsed());
        let (settle, early) = tokio::sync::watch::channel(Early::NotTried);
        match accepted {
            None => self.record_quic(id, "opened".to_owned(), phases.connect_ns / 1_000, None),
            Some(accepted) => {
                settle.send_replace(Early::Pending);
                let (worker, quic) = (self.clone(), quic.clone());
                tokio::task::spawn_local(async move {
                    let taken = accepted.await;
                    let handshake_us = nanos(started.elapsed()) / 1_000;
                    let early = match quic.close_reason() {
                        Some(reason) => {
                            Early::Failed(worker.handshake_failure(&reason, addr, from))
                        }
                        None => {
                            worker.record_quic(id, "opened".to_owned(), handshake_us, Some(taken));
                            if taken {
                                Early::Taken
                            } else {
                                quic.close(H3_NO_ERROR.into(), b"0-RTT rejected");
                                worker.forget_tickets();
                                Early::Rejected
                            }
                        }
                    };
                    settle.send_replace(early);
                });
            }
        }
        // No GREASE frame after a request's HEADERS (h3 sends one by default, and each
        // clone of `SendRequest` again): with one, the HEADERS frame is not the last
        // before the stream's FIN, so Envoy starts the request upstream not knowing its
        // end and sends a GET with `Transfer-Encoding: chunked`, which a backend may
        // refuse (the lab's echo backend answered every one 501). Without it a GET's
        // HEADERS frame carries the stream's end, as a request without a body has it.
        let (goaway_tx, mut goaways) = tokio::sync::mpsc::unbounded_channel();
        let watched = control::Watched::new(h3_quinn::Connection::new(quic.clone()), goaway_tx);
        let (mut driver, send) = h3::client::builder()
            .send_grease(false)
            .build(watched)
            .await
            .map_err(|e| {
                self.connector.fail(
                    Outcome::ProtocolError,
                    format!("HTTP/3 on the QUIC connection to {addr} ({from}): {e}"),
                )
            })?;
        let ended = Rc::new(Cell::new(false));
        let changed = Rc::new(Signal::default());
        let conn = Rc::new(Conn {
            send,
            quic: quic.clone(),
            ended: ended.clone(),
            going_away: Cell::new(false),
            goaway_heard: Cell::new(false),
            goaway: Cell::new(None),
            busy: Cell::new(0),
            sent: Cell::new(0),
            changed: changed.clone(),
            opened: Cell::new(None),
            early: early.clone(),
        });
        // The driver's task holds the connection weakly: it closes when its last sender
        // goes, and the task must not keep one.
        let heard = Rc::downgrade(&conn);
        let (driver_ended, driver_changed) = (ended, changed);
        let (worker, watched, watched_early) = (self.clone(), quic, early);
        tokio::task::spawn_local(async move {
            loop {
                tokio::select! {
                    _ = driver.wait_idle() => break,
                    Some(goaway) = goaways.recv() => {
                        if let Some(conn) = heard.upgrade() {
                            worker.note_goaway(id, &conn, goaway);
                        }
                    }
                }
            }
            driver_ended.set(true);
            driver_changed.notify();
            // What ended it, unless the client did (its last request sent, or the run's
            // end, or its 0-RTT rejected): a server's close, a reset, a silence; and
            // unless it never opened (a 0-RTT connection whose handshake failed, which
            // may still read as pending here).
            let reason = watched.closed().await;
            let opened = matches!(*watched_early.borrow(), Early::NotTried | Early::Taken);
            if reason != quinn::ConnectionError::LocallyClosed && opened {
                worker.record_quic(id, closed_by(&reason).name().into_owned(), 0, None);
            }
        });
        Ok(conn)
    }

    /// A GOAWAY naming stream `goaway` came on connection `id`: recorded (with the
    /// streams then in flight), and the connection takes no new stream.
    fn note_goaway(&self, id: u64, conn: &Conn, goaway: u64) {
        conn.goaway_heard.set(true);
        conn.going_away.set(true);
        conn.goaway
            .set(Some(conn.goaway.get().map_or(goaway, |g| g.min(goaway))));
        conn.changed.notify();
        self.recorder
            .borrow_mut()
            .record_goaway(ingressbench_stats::Goaway {
                at_ns: self.now_ns(),
                connection: id,
                last_stream_id: goaway,
                code: 0,
                streams_in_flight: conn.busy.get(),
                streams_sent: conn.sent.get(),
            });
    }

    /// A QUIC handshake that did not complete, as its outcome (the reason noted).
    fn handshake_failure(
        &self,
        e: &quinn::ConnectionError,
        addr: SocketAddr,
        from: &str,
    ) -> Outcome {
        use quinn::ConnectionError as E;
        let (outcome, why) = match e {
            E::TimedOut => (
                Outcome::ConnectTimeout,
                format!(
                    "no answer to the QUIC handshake from {addr} ({from}): nothing serves \
                     HTTP/3 on that UDP port (UDP has no refusal), or a firewall drops it"
                ),
            ),
            E::VersionMismatch => (
                Outcome::QuicVersionMismatch,
                format!("{addr} ({from}) speaks no QUIC version this client does (1)"),
            ),
            E::Reset => (
                Outcome::QuicStatelessReset,
                format!("{addr} ({from}) answered the QUIC handshake with a stateless reset"),
            ),
            E::ConnectionClosed(close) if is_crypto(close.error_code.into()) => (
                Outcome::TlsError,
                format!(
                    "the TLS handshake inside QUIC with {addr} ({from}) failed: {close}{}",
                    alpn_hint(close.error_code.into())
                ),
            ),
            E::TransportError(t) if is_crypto(t.code.into()) => (
                Outcome::TlsError,
                format!("the TLS handshake inside QUIC with {addr} ({from}) failed: {t}"),
            ),
            E::ConnectionClosed(close) => (
                Outcome::quic_close(close.error_code.into()),
                format!("{addr} ({from}) closed the QUIC handshake: {close}"),
            ),
            E::ApplicationClosed(close) => (
                Outcome::h3_close(close.error_code.into_inner()),
                format!("{addr} ({from}) closed the QUIC handshake: {close}"),
            ),
            other => (
                Outcome::ConnectError,
                format!("QUIC handshake with {addr} ({from}): {other}"),
            ),
        };
        self.connector.fail(outcome, why)
    }

    /// After a rejected 0-RTT: the server no longer holds the sessions of its tickets (a
    /// restarted process), so the others kept from it go too, rather than each costing a
    /// request another rejection; the next connection makes a full handshake and brings
    /// new ones.
    fn forget_tickets(&self) {
        use rustls::client::ClientSessionStore;
        let http3 = self.http3();
        if let Some(store) = &http3.tickets {
            while store.take_tls13_ticket(&http3.tls_name).is_some() {}
        }
    }

    /// Records connection `id`'s opening or end (`what`) as of now; an opening that sent
    /// 0-RTT data says whether the server took it.
    fn record_quic(&self, id: u64, what: String, handshake_us: u64, zero_rtt: Option<bool>) {
        (self.recorder.borrow_mut()).record_quic(ingressbench_stats::QuicEvent {
            at_ns: self.now_ns(),
            connection: id,
            what,
            handshake_us,
            zero_rtt,
        });
    }

    /// How many streams a connection carries at once: the plan's number, else
    /// [`DEFAULT_STREAMS`]. QUIC itself holds a stream back until the server's
    /// MAX_STREAMS allows it, and that wait is in the request's latency.
    fn http3_slots(&self) -> u32 {
        match self.http3().request.streams {
            Some(n) if self.shared.keepalive => n,
            _ if self.shared.keepalive => DEFAULT_STREAMS,
            _ => 1,
        }
    }
}

/// Whether a QUIC transport error code is a TLS alert (0x100 to 0x1ff).
fn is_crypto(code: u64) -> bool {
    (0x100..0x200).contains(&code)
}

/// A hint for the TLS alert `no_application_protocol` (120): the server does not take
/// ALPN `h3`.
fn alpn_hint(code: u64) -> &'static str {
    if code == 0x100 + 120 {
        ": it does not serve HTTP/3 (ALPN h3) there"
    } else {
        ""
    }
}

/// Starts `pending`'s exchange on `conn` as a task of its own, which records what became
/// of it (or hands the ticket back to be sent elsewhere).
fn start_stream(worker: &Rc<Worker>, conn: &Rc<Conn>, live: &Rc<Live>, pending: Pending) {
    conn.busy.set(conn.busy.get() + 1);
    conn.sent.set(conn.sent.get() + 1);
    live.count.set(live.count.get() + 1);
    worker.in_flight.set(worker.in_flight.get() + 1);
    let (worker, conn, live) = (worker.clone(), conn.clone(), live.clone());
    tokio::task::spawn_local(async move {
        let exchanged = exchange(&worker, &conn, pending).await;
        conn.busy.set(conn.busy.get() - 1);
        conn.changed.notify();
        worker.settle(exchanged).await;
        live.count.set(live.count.get() - 1);
        live.ended.notify();
    });
}

/// How far a failed exchange got.
enum Failed {
    /// The stream could not be opened (the connection went away or is going): never on
    /// the wire.
    NotSent(h3::error::StreamError),
    Stream(h3::error::StreamError),
}

/// Sends `pending`'s request on a new stream of `conn` and reads its answer to the end.
async fn exchange(worker: &Worker, conn: &Conn, pending: Pending) -> Exchanged {
    let http3 = worker.http3();
    let mut sample = worker.sample_for(&pending);
    let opened = conn.opened.take();
    sample.connection_reused = opened.is_none();
    if let Some(p) = opened {
        sample.phases.dns_ns = p.dns_ns;
        sample.phases.connect_ns = p.connect_ns;
    }
    let write_at = Instant::now();
    let mut bytes = 0u64;
    let mut first_byte = None;
    let mut heard = Heard::default();
    let body = &http3.request.body;
    let mut send = conn.send.clone();
    // Whether QUIC gave the request a stream: it holds one back until the server's
    // MAX_STREAMS allows it.
    let mut on_wire = false;
    // Its stream's id, once it has one: a GOAWAY's id says whether the server took it.
    let mut stream_id = None;
    let attempt = async {
        let mut stream = send
            .send_request(http3.request.request())
            .await
            .map_err(Failed::NotSent)?;
        on_wire = true;
        stream_id = Some(stream.id().into_inner());
        if !body.is_empty() {
            stream
                .send_data(body.clone())
                .await
                .map_err(Failed::Stream)?;
        }
        stream.finish().await.map_err(Failed::Stream)?;
        let answer = stream.recv_response().await.map_err(Failed::Stream)?;
        first_byte = Some(Instant::now());
        heard = worker.hear(answer.headers());
        while let Some(chunk) = stream.recv_data().await.map_err(Failed::Stream)? {
            bytes += chunk.remaining() as u64;
        }
        Ok::<u16, Failed>(answer.status().as_u16())
    };
    // A stream that failed on a connection whose handshake is still under way: what the
    // server made of its 0-RTT data says why (a rejection fails every such stream).
    let attempt = async {
        let result = attempt.await;
        if result.is_err() {
            conn.early_settled().await;
        }
        result
    };
    let deadline = worker.deadline(sample.sent_at_ns);
    let result = tokio::time::timeout_at(deadline.into(), attempt).await;
    let done = Instant::now();
    sample.done_at_ns = nanos(done.saturating_duration_since(worker.start.get()));
    let never_sent = matches!(result, Ok(Err(Failed::NotSent(_))));
    sample.outcome = match result {
        Ok(Ok(status)) => Outcome::Status(status),
        Ok(Err(Failed::NotSent(e))) => {
            conn.going_away.set(true);
            conn.changed.notify();
            match e {
                h3::error::StreamError::RemoteClosing { .. } => {
                    conn.goaway_heard.set(true);
                    Outcome::GoawayUnprocessed
                }
                e => classify(&e, None, conn, worker),
            }
        }
        Ok(Err(Failed::Stream(e))) => classify(&e, stream_id, conn, worker),
        Err(_elapsed) => {
            if !on_wire {
                (worker.recorder.borrow_mut()).note_failure_detail(Outcome::ReadTimeout, || {
                    "HTTP/3: no stream to send the request on within --timeout: the server's \
                     MAX_STREAMS allowed no more (or none)"
                        .to_owned()
                });
            }
            Outcome::ReadTimeout
        }
    };
    // Never on the wire, or refused by the server unprocessed: it may go again, within
    // its attempts and its timeout.
    let again = (never_sent && sample.outcome == Outcome::GoawayUnprocessed)
        || (sample.outcome.unprocessed() && http3.request.retry_unprocessed);
    if again {
        if let Some((ticket, wait)) = worker.again(pending.ticket, &sample) {
            return Exchanged::Again(ticket, wait);
        }
    }
    complete(&mut sample, bytes, write_at, first_byte, done, heard);
    Exchanged::Done(sample)
}

/// The outcome of a stream (`stream`: its id, if it got one) that ended in an error: the
/// server's reset code, or what ended its connection (read from QUIC's own record of why
/// it closed), or after a GOAWAY what that said of it.
fn classify(
    e: &h3::error::StreamError,
    stream: Option<u64>,
    conn: &Conn,
    worker: &Worker,
) -> Outcome {
    use h3::error::StreamError;
    match *conn.early.borrow() {
        Early::Rejected => return Outcome::QuicZeroRttRejected,
        Early::Failed(outcome) => return outcome,
        _ => {}
    }
    let outcome = match e {
        StreamError::RemoteTerminate { code, .. } => Outcome::h3_reset(code.value()),
        // After a GOAWAY: a stream at or above its id was not processed (it may go
        // again); below it, or with no id heard (a stream refused for the GOAWAY before
        // its frame was read), processed and lost, the safe side.
        StreamError::ConnectionError { .. } | StreamError::Undefined { .. }
            if conn.goaway_heard.get() =>
        {
            match (conn.goaway.get(), stream) {
                (Some(goaway), Some(stream)) if stream >= goaway => Outcome::GoawayUnprocessed,
                _ => Outcome::GoawayProcessedLost,
            }
        }
        StreamError::ConnectionError { .. } | StreamError::Undefined { .. } => {
            match conn.quic.close_reason() {
                Some(reason) => {
                    let outcome = closed_by(&reason);
                    // The server's own words for why it closed, where it gave any.
                    if let Some(phrase) = close_phrase(&reason) {
                        (worker.recorder.borrow_mut()).note_failure_detail(outcome, || {
                            format!("HTTP/3: the server closed the QUIC connection: {reason} ({phrase:?})")
                        });
                    }
                    outcome
                }
                None => Outcome::ProtocolError,
            }
        }
        _ => Outcome::ProtocolError,
    };
    if outcome == Outcome::ProtocolError {
        worker
            .recorder
            .borrow_mut()
            .note_failure_detail(outcome, || format!("HTTP/3: {e}"));
    }
    outcome
}

/// Until the worker's runtime ends: each migration asked, the endpoint moves to a new UDP
/// socket on `local`'s address (a new port) and the old one closes; quinn then sends
/// every connection's packets from there, and the server validates the new path (RFC
/// 9000 §9) or loses them.
async fn migrations(endpoint: quinn::Endpoint, local: SocketAddr, migrate: crate::Migrate) {
    let mut taken = migrate.asked();
    loop {
        taken = migrate.next(taken).await;
        // quinn keeps reading the socket it replaces until a packet comes on the new one;
        // a moved client's old address is gone (a NAT's new mapping, another network), so
        // what it keeps is a throwaway bound and replaced at once, and the old socket
        // closes: a server still sending to the old port reaches nobody.
        let rebound = (0..2).try_for_each(|_| endpoint.rebind(std::net::UdpSocket::bind(local)?));
        if let Err(e) = rebound {
            eprintln!("ingressbench: QUIC migration: cannot bind a new UDP socket: {e}");
        }
    }
}

/// The reason phrase of a CONNECTION_CLOSE, when it carried one.
fn close_phrase(reason: &quinn::ConnectionError) -> Option<String> {
    use quinn::ConnectionError as E;
    let bytes = match reason {
        E::ApplicationClosed(close) => &close.reason,
        E::ConnectionClosed(close) => &close.reason,
        _ => return None,
    };
    (!bytes.is_empty()).then(|| String::from_utf8_lossy(bytes).into_owned())
}

/// What a QUIC connection's end makes of the requests it cut.
fn closed_by(reason: &quinn::ConnectionError) -> Outcome {
    use quinn::ConnectionError as E;
    match reason {
        E::ApplicationClosed(close) => Outcome::h3_close(close.error_code.into_inner()),
        E::ConnectionClosed(close) => Outcome::quic_close(close.error_code.into()),
        E::TimedOut => Outcome::QuicIdleTimeout,
        E::Reset => Outcome::QuicStatelessReset,
        E::VersionMismatch => Outcome::QuicVersionMismatch,
        _ => Outcome::ProtocolError,
    }
}
