//! The node agent's log endpoint: what the kubelet serves so that the API server can
//! answer `GET /api/v1/namespaces/NS/pods/POD/log` (`kubectl logs`). The API server finds
//! it at the node's InternalIP and `status.daemonEndpoints.kubeletEndpoint.Port` and asks
//! `GET /containerLogs/NS/POD/CONTAINER?follow=true` over HTTPS; with no
//! `--kubelet-certificate-authority` it does not check the certificate, so the endpoint
//! presents a self-signed one. It serves a container's log file from its start (the
//! first container's is the pod's, `NS_POD.log`; another's `NS_POD_CONTAINER.log`) and,
//! when asked to follow, goes on until the pod's processes have
//! ended and its last bytes are sent. `tailLines` and `limitBytes` are honoured;
//! `timestamps` is not (the file holds no times).
//!
//! One thread per request, on 127.0.0.1 only: its callers are the API server and nothing
//! else.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::ClusterError;

/// How often a followed log is read again for new lines.
const FOLLOW_EVERY: Duration = Duration::from_millis(20);
/// The most a request line and its headers may take.
const HEAD_LIMIT: usize = 16 * 1024;

/// Which pods' processes still run (`NS_POD`, as their log files are named): a followed
/// log ends once its pod is no longer here and its file is drained.
pub(crate) type Live = Arc<Mutex<BTreeSet<String>>>;

/// The running endpoint; stops accepting when dropped.
pub(crate) struct LogServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LogServer {
    /// Serves the logs in `dir` (`NS_POD.log`) on a free port of 127.0.0.1.
    pub(crate) fn start(dir: PathBuf, live: Live) -> Result<Self, ClusterError> {
        let fail =
            |what: &str, e: String| ClusterError::Api(format!("node agent logs: {what}: {e}"));
        let config = Arc::new(tls_config().map_err(|e| fail("certificate", e))?);
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| fail("listening", e.to_string()))?;
        let addr = listener
            .local_addr()
            .map_err(|e| fail("listening", e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ib-agent-logs".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if flag.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let (config, dir, live, flag) =
                        (config.clone(), dir.clone(), live.clone(), flag.clone());
                    let _ = std::thread::Builder::new()
                        .name("ib-agent-log".into())
                        .spawn(move || {
                            let _ = serve(conn, config, &dir, &live, &flag);
                        });
                }
            })
            .map_err(|e| fail("starting", e.to_string()))?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Its port (what the nodes report as their kubelet's).
    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Drop for LogServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accepting thread, which then sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A self-signed certificate for 127.0.0.1.
fn tls_config() -> Result<rustls::ServerConfig, String> {
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).map_err(|e| e.to_string())?;
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .map_err(|e| e.to_string())
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
struct Ask {
    /// `NS_POD`.
    key: String,
    /// The container's name.
    container: String,
    follow: bool,
    tail_lines: Option<usize>,
    limit_bytes: Option<u64>,
}

/// `GET /containerLogs/NS/POD/CONTAINER?…` → what it asks for (`None`: not a log request).
fn parse_target(target: &str) -> Option<Ask> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut parts = path.strip_prefix("/containerLogs/")?.split('/');
    let (ns, pod, container) = (parts.next()?, parts.next()?, parts.next()?);
    let safe = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    };
    if parts.next().is_some() || !safe(ns) || !safe(pod) || !safe(container) {
        return None;
    }
    let mut ask = Ask {
        key: format!("{ns}_{pod}"),
        container: container.to_owned(),
        follow: false,
        tail_lines: None,
        limit_bytes: None,
    };
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("follow", v)) => ask.follow = v == "true" || v == "1",
            Some(("tailLines", v)) => ask.tail_lines = v.parse().ok(),
            Some(("limitBytes", v)) => ask.limit_bytes = v.parse().ok(),
            _ => {}
        }
    }
    Some(ask)
}

fn serve(
    conn: TcpStream,
    config: Arc<rustls::ServerConfig>,
    dir: &std::path::Path,
    live: &Live,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let tls = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    let mut stream = rustls::StreamOwned::new(tls, conn);
    let mut head = Vec::new();
    {
        let mut reader = BufReader::new(&mut stream);
        loop {
            let before = head.len();
            reader.read_until(b'\n', &mut head)?;
            let line = &head[before..];
            if line.is_empty() || line == b"\r\n" || line == b"\n" || head.len() > HEAD_LIMIT {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&head);
    let target = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("GET "))
        .and_then(|l| l.split(' ').next())
        .unwrap_or_default();
    let Some(ask) = parse_target(target) else {
        return respond(&mut stream, "404 Not Found", b"not a container log\n");
    };
    // A pod's first container writes the pod's log; any other, a log of its own.
    let own = dir.join(format!("{}_{}.log", ask.key, ask.container));
    let path = if own.is_file() {
        own
    } else {
        dir.join(format!("{}.log", ask.key))
    };
    let Ok(mut file) = std::fs::File::open(&path) else {
        return respond(&mut stream, "404 Not Found", b"no log for this pod\n");
    };
    let mut from = 0;
    if let Some(n) = ask.tail_lines {
        from = tail_offset(&mut file, n)?;
    }
    file.seek(SeekFrom::Start(from))?;
    stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
    )?;
    let mut left = ask.limit_bytes.unwrap_or(u64::MAX);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Whether the pod's process ran before this read: if not, this read is the last.
        let running = live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&ask.key);
        let room = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = file.read(&mut buf[..room])?;
        if n > 0 {
            write!(stream, "{n:x}\r\n")?;
            stream.write_all(&buf[..n])?;
            stream.write_all(b"\r\n")?;
            stream.flush()?;
            left -= n as u64;
            if left == 0 {
                break;
            }
            continue;
        }
        if !ask.follow || !running || stop.load(Ordering::Relaxed) {
            break;
        }
        std::thread::sleep(FOLLOW_EVERY);
    }
    stream.write_all(b"0\r\n\r\n")?;
    stream.flush()?;
    stream.conn.send_close_notify();
    stream.flush()
}

fn respond(stream: &mut impl Write, status: &str, body: &[u8]) -> std::io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    stream.flush()
}

/// Where the last `n` lines of `file` begin.
fn tail_offset(file: &mut std::fs::File, n: usize) -> std::io::Result<u64> {
    let mut all = Vec::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_end(&mut all)?;
    if n == 0 {
        return Ok(all.len() as u64);
    }
    // A final newline ends the last line rather than starting another.
    let body = all.strip_suffix(b"\n").unwrap_or(&all);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return Ok(i as u64 + 1);
            }
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_requests_name_a_pod_and_what_of_its_log() {
        let ask = parse_target("/containerLogs/ns-1/worker-0-abc/worker?follow=true&tailLines=5")
            .unwrap();
        assert_eq!(
            ask,
            Ask {
                key: "ns-1_worker-0-abc".into(),
                container: "worker".into(),
                follow: true,
                tail_lines: Some(5),
                limit_bytes: None
            }
        );
        assert!(parse_target("/containerLogs/ns/pod").is_none());
        assert!(parse_target("/containerLogs/../etc/passwd/x").is_none());
        assert!(parse_target("/exec/ns/pod/c").is_none());
    }

    #[test]
    fn tail_lines_start_at_the_last_n_lines() {
        let dir = std::env::temp_dir().join(format!("ib-logs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.log");
        std::fs::write(&path, "a\nbb\nccc\n").unwrap();
        let mut f = std::fs::File::open(&path).unwrap();
        assert_eq!(tail_offset(&mut f, 1).unwrap(), 5);
        assert_eq!(tail_offset(&mut f, 2).unwrap(), 2);
        assert_eq!(tail_offset(&mut f, 9).unwrap(), 0);
        assert_eq!(tail_offset(&mut f, 0).unwrap(), 9);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
