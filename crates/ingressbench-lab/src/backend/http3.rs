//! The echo backend over HTTP/3: QUIC on a UDP socket of its own (the `quinn` and `h3`
//! crates), each request answered as over HTTP/2 (the same delays, errors, stalls,
//! headers and body). Draining sends each connection a GOAWAY, lets its requests in
//! flight finish, and closes it with `H3_NO_ERROR`, as a graceful HTTP/3 server does.

use std::future::Future;
use std::io;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use tokio::task::JoinSet;

use super::{BackendConfig, BackendTls, Connection};

/// HTTP/3's code for a connection closed with nothing wrong (RFC 9114 §8.1).
const H3_NO_ERROR: u32 = 0x100;

/// What the HTTP/3 listener is told beyond the backend's configuration.
#[derive(Clone, Debug)]
pub struct Http3Options {
    /// Request streams a client may have open at once on a connection (QUIC's
    /// MAX_STREAMS, quinn's default 100; 0 lets it open none).
    pub max_streams: u32,
    /// The secret its stateless-reset tokens are derived from (RFC 9000 §10.3). A process
    /// started again with the same one answers the old process's connections with a
    /// stateless reset, which ends them at once, where a new random one (`None`, quinn's
    /// default) leaves them to the client's idle timeout.
    pub reset_key: Option<String>,
}

impl Default for Http3Options {
    fn default() -> Self {
        Self {
            max_streams: 100,
            reset_key: None,
        }
    }
}

/// How long a draining connection waits, after its GOAWAY and its last answer, for the
/// client to close it.
const GOAWAY_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves HTTP/3 on `socket` with `config` (which must have TLS) and `options` until
/// `shutdown` completes, then drains; returns the number of requests answered.
pub async fn serve_http3(
    socket: std::net::UdpSocket,
    config: BackendConfig,
    options: Http3Options,
    shutdown: impl Future<Output = ()>,
) -> io::Result<u64> {
    let tls = config.tls.as_ref().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "HTTP/3 runs over QUIC, which is always TLS: give --tls-cert and --tls-key",
        )
    })?;
    let endpoint = endpoint(tls, socket, &options)?;
    let (template, drain_tx) = Connection::first(&config)?;
    let mut connections = JoinSet::new();
    let mut answered = 0;
    let mut seed = template.rng;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut conn = template.clone();
                conn.rng = seed | 1;
                connections.spawn(conn.run_http3(incoming));
            }
            Some(done) = connections.join_next(), if !connections.is_empty() => {
                answered += done.unwrap_or(0);
            }
        }
    }
    let _ = drain_tx.send(true);
    let deadline = tokio::time::Instant::now() + config.drain_timeout;
    while !connections.is_empty() {
        match tokio::time::timeout_at(deadline, connections.join_next()).await {
            Ok(Some(done)) => answered += done.unwrap_or(0),
            Ok(None) => break,
            Err(_) => {
                connections.abort_all();
                break;
            }
        }
    }
    endpoint.close(H3_NO_ERROR.into(), b"");
    Ok(answered)
}

/// A QUIC server endpoint on `socket` with the backend's certificate, offering ALPN `h3`,
/// as `options` say.
fn endpoint(
    tls: &BackendTls,
    socket: std::net::UdpSocket,
    options: &Http3Options,
) -> io::Result<quinn::Endpoint> {
    let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidInput, e);
    let mut server = tls.server_config()?;
    server.alpn_protocols = vec![b"h3".to_vec()];
    // A resumed client's 0-RTT requests are taken (quinn asks for all or nothing), as
    // Caddy's are; sessions live in rustls's in-memory cache, so a restarted backend
    // rejects the tickets of the process before it.
    server.max_early_data_size = u32::MAX;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(Arc::new(server))
        .map_err(|e| invalid(format!("QUIC needs TLS 1.3: {e}")))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport.max_concurrent_bidi_streams(options.max_streams.into());
    config.transport_config(Arc::new(transport));
    let endpoint_config = match &options.reset_key {
        Some(secret) => {
            let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
            let mut config = quinn::EndpointConfig::new(Arc::new(key));
            config.cid_generator(|| Box::new(AnyCid));
            config
        }
        None => quinn::EndpointConfig::default(),
    };
    quinn::Endpoint::new(
        endpoint_config,
        Some(config),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
}

/// Connection ids of 8 random bytes, every one of which the endpoint takes for its own:
/// a process started again then answers the old process's ids with a stateless reset.
/// quinn's default generator embeds a hash keyed per process and drops, unanswered, the
/// packets of ids it did not make.
struct AnyCid;

impl quinn::ConnectionIdGenerator for AnyCid {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        use ring::rand::SecureRandom;
        let mut id = [0u8; 8];
        // The system's random source; it does not fail on Linux once booted.
        ring::rand::SystemRandom::new()
            .fill(&mut id)
            .expect("the system's random source");
        quinn::ConnectionId::new(&id)
    }

    fn cid_len(&self) -> usize {
        8
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

impl Connection {
    /// Serves one QUIC connection's requests, each on a task of its own; returns how
    /// many were answered.
    async fn run_http3(self, incoming: quinn::Incoming) -> u64 {
        let Ok(quic) = incoming.await else {
            return 0;
        };
        let Ok(mut conn) =
            h3::server::Connection::<_, Bytes>::new(h3_quinn::Connection::new(quic.clone())).await
        else {
            return 0;
        };
        let mut drain = self.drain.clone();
        let mut draining = *drain.borrow();
        let mut streams = JoinSet::new();
        let mut answered = 0;
        let mut seed = self.rng;
        loop {
            if draining {
                // GOAWAY: the requests already taken are answered, no new one is.
                let _ = conn.shutdown(0).await;
                break;
            }
            tokio::select! {
                accepted = conn.accept() => {
                    let Ok(Some(resolver)) = accepted else { break };
                    seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
                    let mut each = self.clone();
                    each.rng = seed | 1;
                    streams.spawn(async move {
                        match resolver.resolve_request().await {
                            Ok((request, stream)) => each.answer_http3(request, stream).await,
                            Err(_) => false,
                        }
                    });
                }
                Some(done) = streams.join_next(), if !streams.is_empty() => {
                    answered += u64::from(done.unwrap_or(false));
                }
                _ = drain.wait_for(|d| *d), if !draining => draining = true,
            }
        }
        while let Some(done) = streams.join_next().await {
            answered += u64::from(done.unwrap_or(false));
        }
        if draining {
            // Closing drops what is not yet sent, the GOAWAY too: give it a moment to
            // reach the client, which closes once it has no stream left on it (at most
            // a second; RFC 9114 §5.2 asks a server to let it arrive).
            let _ = tokio::time::timeout(GOAWAY_LINGER, quic.closed()).await;
        }
        quic.close(H3_NO_ERROR.into(), b"");
        answered
    }

    /// Answers one request stream as [`Connection::answer_http2`] answers a stream; says
    /// whether the answer went out.
    async fn answer_http3<S>(
        mut self,
        request: http::Request<()>,
        mut stream: h3::server::RequestStream<S, Bytes>,
    ) -> bool
    where
        S: h3::quic::BidiStream<Bytes>,
    {
        self.leak();
        let path = request.uri().path().to_owned();
        let head = request.method() == http::Method::HEAD;
        let mut received = 0;
        while let Ok(Some(chunk)) = stream.recv_data().await {
            received += chunk.remaining();
        }
        self.wait_before_answering().await;
        let (status, body) = self.choose(&path);
        let Ok(answer) = self
            .answer_head(status, &path, received, "HTTP/3", body.len())
            .body(())
        else {
            return false;
        };
        if stream.send_response(answer).await.is_err() {
            return false;
        }
        if !head && !body.is_empty() && stream.send_data(body).await.is_err() {
            return false;
        }
        stream.finish().await.is_ok()
    }
}
