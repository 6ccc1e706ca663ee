//! Test servers for the load engine: real sockets on 127.0.0.1:0, each made to behave in
//! one way (answer, stall, refuse, reset, send garbage, speak TLS).

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub mod http2;

/// How a test server treats each request.
#[derive(Clone, Debug)]
pub enum Behavior {
    /// 200 with `x-backend: name`, echoing the Host header and path in the body.
    Answer { name: String },
    /// Like `Answer`, but holds every answer due within `stall_for` of each multiple of
    /// `every` (from server start) until that stall ends.
    Stall {
        every: Duration,
        stall_for: Duration,
    },
    /// Reads the request, then never answers.
    Silent,
    /// Reads the request, then closes with a reset.
    Reset,
    /// Reads the request, then closes cleanly without answering.
    CloseAfterRequest,
    /// Answers the first request of each connection, then resets the connection after
    /// `after` (so a second request on it is written to a dead socket).
    AnswerThenReset { after: Duration },
    /// Reads the request and answers with bytes that are not HTTP.
    Garbage,
    /// Answers like `Answer`, and closes (FIN) a connection that stays idle for `after`
    /// after an answer (nginx's `keepalive_timeout`; before its first request a connection
    /// waits as long as it likes, as under nginx's 60 s `client_header_timeout`).
    IdleClose { after: Duration },
    /// Answers the first request of each connection; on the second it reads the request
    /// and closes without a byte of answer: the server closing a kept-alive connection
    /// just as a request arrives, every time.
    CloseOnReuse,
}

/// A running test server.
pub struct Server {
    pub addr: SocketAddr,
    pub accepts: Arc<AtomicU64>,
    pub requests: Arc<AtomicU64>,
    _runtime: tokio::runtime::Runtime,
}

impl Server {
    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://{}/", self.addr)
    }
}

/// TLS material for a server: a CA and a certificate for `app.test` and 127.0.0.1.
pub struct TestTls {
    pub ca_path: PathBuf,
    pub dir: PathBuf,
    pub server_config: Arc<rustls::ServerConfig>,
}

/// The directory goes with the files.
impl Drop for TestTls {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn test_tls(tag: &str) -> TestTls {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ingressbench test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["app.test".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    test_tls_files(tag, &ca_cert.pem(), cert.der(), &key)
}

/// TLS material whose server certificate is a self-signed CA certificate (CA:TRUE) for
/// 127.0.0.1; `ca_path` holds that same certificate.
pub fn ca_as_server_tls(tag: &str) -> TestTls {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    test_tls_files(tag, &cert.pem(), cert.der(), &key)
}

/// Writes `ca_pem` into a fresh directory and builds a server config for `cert`.
fn test_tls_files(tag: &str, ca_pem: &str, cert: &[u8], key: &rcgen::KeyPair) -> TestTls {
    let dir = std::env::temp_dir().join(format!("ib-load-test-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_path = dir.join("ca.pem");
    std::fs::write(&ca_path, ca_pem).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server_config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    TestTls {
        ca_path,
        dir,
        server_config: Arc::new(server_config),
    }
}

/// A runtime of its own (two threads) and a listener on 127.0.0.1:0 in it.
pub fn listen() -> (tokio::runtime::Runtime, TcpListener, SocketAddr) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    (runtime, listener, addr)
}

/// Starts a server on 127.0.0.1:0 with its own runtime (two threads).
pub fn serve(behavior: Behavior, tls: Option<Arc<rustls::ServerConfig>>) -> Server {
    let (runtime, listener, addr) = listen();
    let accepts = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let (a, r) = (accepts.clone(), requests.clone());
    runtime.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            a.fetch_add(1, Ordering::Relaxed);
            let _ = stream.set_nodelay(true);
            let behavior = behavior.clone();
            let requests = r.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    Some(config) => {
                        let acceptor = tokio_rustls::TlsAcceptor::from(config);
                        if let Ok(stream) = acceptor.accept(stream).await {
                            serve_connection(stream, None, behavior, requests, started).await;
                        }
                    }
                    None => {
                        let raw = stream;
                        serve_plain(raw, behavior, requests, started).await;
                    }
                }
            });
        }
    });
    Server {
        addr,
        accepts,
        requests,
        _runtime: runtime,
    }
}

async fn serve_plain(
    stream: TcpStream,
    behavior: Behavior,
    requests: Arc<AtomicU64>,
    started: Instant,
) {
    match behavior {
        Behavior::Reset | Behavior::AnswerThenReset { .. } => {
            // These need the raw socket to reset it.
            let mut stream = stream;
            let mut buf = vec![0u8; 16 * 1024];
            if let Behavior::AnswerThenReset { after } = behavior {
                if read_head(&mut stream, &mut buf).await.is_none() {
                    return;
                }
                requests.fetch_add(1, Ordering::Relaxed);
                let _ = stream.write_all(&response("reset-after", "/", "-")).await;
                tokio::time::sleep(after).await;
            } else {
                if read_head(&mut stream, &mut buf).await.is_none() {
                    return;
                }
                requests.fetch_add(1, Ordering::Relaxed);
            }
            reset(stream);
        }
        other => serve_connection(stream, None, other, requests, started).await,
    }
}

#[allow(deprecated)]
fn reset(stream: TcpStream) {
    // SO_LINGER 0 turns close into a reset.
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}

async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    _unused: Option<()>,
    behavior: Behavior,
    requests: Arc<AtomicU64>,
    started: Instant,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut served = 0u64;
    loop {
        let head = match &behavior {
            Behavior::IdleClose { after } if served > 0 => {
                match tokio::time::timeout(*after, read_head(&mut stream, &mut buf)).await {
                    Ok(head) => head,
                    Err(_idle) => {
                        let _ = stream.shutdown().await;
                        return;
                    }
                }
            }
            _ => read_head(&mut stream, &mut buf).await,
        };
        let Some((host, path)) = head else {
            return;
        };
        requests.fetch_add(1, Ordering::Relaxed);
        served += 1;
        match &behavior {
            Behavior::IdleClose { .. } => {
                if stream
                    .write_all(&response("idle-close", &path, &host))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Behavior::CloseOnReuse => {
                if served > 1 {
                    let _ = stream.shutdown().await;
                    return;
                }
                if stream
                    .write_all(&response("close-on-reuse", &path, &host))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Behavior::Answer { name } => {
                // "$host" names the backend after the Host header, to check routing.
                let name = if name == "$host" { &host } else { name };
                if stream
                    .write_all(&response(name, &path, &host))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Behavior::Stall { every, stall_for } => {
                let since = started.elapsed();
                let into = Duration::from_nanos((since.as_nanos() % every.as_nanos()) as u64);
                if into < *stall_for {
                    tokio::time::sleep(*stall_for - into).await;
                }
                if stream
                    .write_all(&response("stall", &path, &host))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Behavior::Silent => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Behavior::CloseAfterRequest => return,
            Behavior::Garbage => {
                let _ = stream
                    .write_all(b"SSH-2.0-OpenSSH_9.2p1 this is not http\r\n")
                    .await;
                return;
            }
            Behavior::Reset | Behavior::AnswerThenReset { .. } => return,
        }
    }
}

/// Reads one request head (and ignores any body); returns its Host and path.
async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut [u8],
) -> Option<(String, String)> {
    let mut len = 0;
    loop {
        if let Some(end) = buf[..len].windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
            let host = head
                .lines()
                .find_map(|l| {
                    l.strip_prefix("Host: ")
                        .or_else(|| l.strip_prefix("host: "))
                })
                .unwrap_or("")
                .to_owned();
            // Keep-alive: this simple server assumes nothing follows the head in the buffer.
            return Some((host, path));
        }
        if len == buf.len() {
            return None;
        }
        match stream.read(&mut buf[len..]).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => len += n,
        }
    }
}

fn response(name: &str, path: &str, host: &str) -> Vec<u8> {
    let body = format!("host={host} path={path}\n");
    format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nx-backend: {name}\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        .into_bytes()
}

/// An address where nothing listens: bind, note the port, close.
pub fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}
