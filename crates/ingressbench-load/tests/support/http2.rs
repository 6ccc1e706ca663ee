//! HTTP/2 test servers: one on the `h2` crate's server side (answer, stall, reset
//! streams), and one that writes its frames by hand to send a GOAWAY with a chosen
//! last-stream-id (the `h2` server always names the last stream it received).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// How the `h2` server treats each stream.
#[derive(Clone, Debug)]
pub enum H2Behavior {
    /// 200 with `x-backend: name`.
    Answer { name: String },
    /// Like `Answer`, but holds every answer due within `stall_for` of each multiple of
    /// `every` (from server start) until that stall ends.
    Stall {
        every: Duration,
        stall_for: Duration,
    },
    /// Resets every `nth` stream (counted over the server) with `code`; answers the rest.
    ResetEvery { nth: u64, code: u32 },
    /// Announces a stream window of 0 and never opens it, nor answers: a request body
    /// never goes out.
    NeverOpenWindow,
}

/// What an HTTP/2 test server saw.
#[derive(Default)]
pub struct H2Seen {
    pub accepts: AtomicU64,
    pub streams: AtomicU64,
    /// The most streams open at once on one connection.
    pub max_concurrent: AtomicU64,
    /// When each reset was sent.
    pub resets: Mutex<Vec<Instant>>,
    /// Each stream's `:authority` and whether it also carried a `host` header.
    pub authorities: Mutex<Vec<(String, bool)>>,
}

/// A running HTTP/2 test server.
pub struct H2Server {
    pub addr: SocketAddr,
    pub seen: Arc<H2Seen>,
    _runtime: tokio::runtime::Runtime,
}

impl H2Server {
    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://{}/", self.addr)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Serves HTTP/2 with the `h2` crate: h2c with prior knowledge, or over TLS (`tls`, whose
/// ALPN is set to `h2` here).
pub fn serve_h2(behavior: H2Behavior, tls: Option<Arc<rustls::ServerConfig>>) -> H2Server {
    let runtime = runtime();
    let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(H2Seen::default());
    let tls = tls.map(|config| {
        let mut config = (*config).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    });
    let started = Instant::now();
    let s = seen.clone();
    runtime.spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            s.accepts.fetch_add(1, Ordering::Relaxed);
            let _ = tcp.set_nodelay(true);
            let (behavior, seen, tls) = (behavior.clone(), s.clone(), tls.clone());
            tokio::spawn(async move {
                match tls {
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(tcp).await {
                            serve_h2_connection(stream, behavior, seen, started).await;
                        }
                    }
                    None => serve_h2_connection(tcp, behavior, seen, started).await,
                }
            });
        }
    });
    H2Server {
        addr,
        seen,
        _runtime: runtime,
    }
}

async fn serve_h2_connection<T>(io: T, behavior: H2Behavior, seen: Arc<H2Seen>, started: Instant)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = h2::server::Builder::new();
    builder.max_concurrent_streams(1000);
    if let H2Behavior::NeverOpenWindow = behavior {
        builder.initial_window_size(0);
    }
    let Ok(mut conn) = builder.handshake::<_, Bytes>(io).await else {
        return;
    };
    let open = Arc::new(AtomicU64::new(0));
    while let Some(Ok((request, mut respond))) = conn.accept().await {
        let n = seen.streams.fetch_add(1, Ordering::Relaxed) + 1;
        let authority = request.uri().authority().map(|a| a.to_string());
        let host = request.headers().contains_key(http::header::HOST);
        seen.authorities
            .lock()
            .unwrap()
            .push((authority.unwrap_or_default(), host));
        let now_open = open.fetch_add(1, Ordering::Relaxed) + 1;
        seen.max_concurrent.fetch_max(now_open, Ordering::Relaxed);
        let (behavior, seen, open) = (behavior.clone(), seen.clone(), open.clone());
        tokio::spawn(async move {
            let name = match &behavior {
                H2Behavior::Answer { name } => name.clone(),
                H2Behavior::Stall { every, stall_for } => {
                    let since = started.elapsed();
                    let into = Duration::from_nanos((since.as_nanos() % every.as_nanos()) as u64);
                    if into < *stall_for {
                        tokio::time::sleep(*stall_for - into).await;
                    }
                    "stall".to_owned()
                }
                H2Behavior::NeverOpenWindow => {
                    // Holds the body unread (so no window opens) and never answers.
                    let _held = (request, respond);
                    std::future::pending::<()>().await;
                    return;
                }
                H2Behavior::ResetEvery { nth, code } => {
                    if n.is_multiple_of(*nth) {
                        seen.resets.lock().unwrap().push(Instant::now());
                        respond.send_reset(h2::Reason::from(*code));
                        open.fetch_sub(1, Ordering::Relaxed);
                        return;
                    }
                    "reset-every".to_owned()
                }
            };
            let response = http::Response::builder()
                .status(200)
                .header("x-backend", name)
                .body(())
                .unwrap();
            if let Ok(mut body) = respond.send_response(response, false) {
                let _ = body.send_data(Bytes::from_static(b"ok\n"), true);
            }
            open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// A server that writes HTTP/2 frames by hand (h2c, prior knowledge). On its first
/// connection it answers nothing until `hold` streams are open, then sends GOAWAY with
/// `last_stream_id`, answers the held streams up to that id, and closes. Later
/// connections answer every stream at once.
pub fn serve_goaway(hold: usize, last_stream_id: u32) -> H2Server {
    serve_raw(move |tcp, accepted, seen| async move {
        let hold = (accepted == 0).then_some((hold, last_stream_id));
        let _ = raw_connection(tcp, hold, &seen).await;
    })
}

/// A server (h2c) that answers every connection's preface with its SETTINGS and a
/// GOAWAY(last-stream-id 0, NO_ERROR) at once, then reads what comes (counting the
/// streams opened anyway) until the client closes.
pub fn serve_goaway_at_once() -> H2Server {
    serve_raw(|mut tcp, _, seen| async move {
        let mut preface = [0u8; 24];
        if tcp.read_exact(&mut preface).await.is_err() {
            return;
        }
        let mut out = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        out.extend(frame(0x7, 0, 0, &[0; 8]));
        if tcp.write_all(&out).await.is_err() {
            return;
        }
        while let Ok((kind, _, _, _)) = read_frame(&mut tcp).await {
            if kind == 0x1 {
                seen.streams.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

/// A server that hands each accepted connection (with how many came before it) to
/// `serve`, on a task of its own; accepts are counted.
fn serve_raw<F, Fut>(serve: F) -> H2Server
where
    F: Fn(tokio::net::TcpStream, u64, Arc<H2Seen>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let runtime = runtime();
    let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(H2Seen::default());
    let s = seen.clone();
    runtime.spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let accepted = s.accepts.fetch_add(1, Ordering::Relaxed);
            let _ = tcp.set_nodelay(true);
            tokio::spawn(serve(tcp, accepted, s.clone()));
        }
    });
    H2Server {
        addr,
        seen,
        _runtime: runtime,
    }
}

/// The next frame: its type, flags, stream and payload.
async fn read_frame(tcp: &mut tokio::net::TcpStream) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut header = [0u8; 9];
    tcp.read_exact(&mut header).await?;
    let len =
        (usize::from(header[0]) << 16) | (usize::from(header[1]) << 8) | usize::from(header[2]);
    let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    tcp.read_exact(&mut payload).await?;
    Ok((header[3], header[4], stream, payload))
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// HEADERS with `:status: 200` (HPACK static index 8) and END_STREAM | END_HEADERS.
fn answer_frame(stream: u32) -> Vec<u8> {
    frame(0x1, 0x5, stream, &[0x88])
}

async fn raw_connection(
    mut tcp: tokio::net::TcpStream,
    hold: Option<(usize, u32)>,
    seen: &H2Seen,
) -> std::io::Result<()> {
    let mut preface = [0u8; 24];
    tcp.read_exact(&mut preface).await?;
    assert_eq!(&preface[..], PREFACE, "an HTTP/2 client preface");
    // SETTINGS: MAX_CONCURRENT_STREAMS 100.
    tcp.write_all(&frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]))
        .await?;
    let mut held = Vec::new();
    loop {
        let (kind, flags, stream, payload) = read_frame(&mut tcp).await?;
        match kind {
            0x4 if flags & 0x1 == 0 => tcp.write_all(&frame(0x4, 0x1, 0, &[])).await?,
            0x6 if flags & 0x1 == 0 => tcp.write_all(&frame(0x6, 0x1, 0, &payload)).await?,
            0x1 => {
                seen.streams.fetch_add(1, Ordering::Relaxed);
                match hold {
                    None => tcp.write_all(&answer_frame(stream)).await?,
                    Some((count, last)) => {
                        held.push(stream);
                        seen.max_concurrent
                            .fetch_max(held.len() as u64, Ordering::Relaxed);
                        if held.len() == count {
                            let mut goaway = last.to_be_bytes().to_vec();
                            goaway.extend_from_slice(&0u32.to_be_bytes());
                            tcp.write_all(&frame(0x7, 0, 0, &goaway)).await?;
                            for &id in held.iter().filter(|id| **id <= last) {
                                tcp.write_all(&answer_frame(id)).await?;
                            }
                            tcp.flush().await?;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            return Ok(());
                        }
                    }
                }
            }
            _ => {}
        }
    }
}
