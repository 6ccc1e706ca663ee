//! One connection: opening it (DNS, TCP, TLS, each timed) and one request over it.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use ingressbench_stats::{IdleEnd, Outcome, Phases};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::response::{Progress, ResponseParser};
use crate::LoadError;

/// A plain or TLS connection.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Where and how to connect.
pub(crate) enum Address {
    /// A fixed address (an IP in the URL, or a `--resolve` entry): no DNS. The text says
    /// where it came from, for failure messages.
    Fixed(SocketAddr, &'static str),
    /// A name resolved for every new connection, as a curl loop would.
    Lookup { host: String, port: u16 },
}

/// Opens connections to the target.
pub(crate) struct Connector {
    pub(crate) address: Address,
    pub(crate) tls: Option<(TlsConnector, ServerName<'static>)>,
    /// Why the last connection failed, until the worker takes it.
    failure: RefCell<Option<String>>,
}

/// How far a request got, so that a timeout can be named for the phase it cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    Connecting,
    Exchanging,
}

impl Connector {
    pub(crate) fn new(
        address: Address,
        tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    ) -> Self {
        Self {
            address,
            tls: tls.map(|(config, name)| (TlsConnector::from(config), name)),
            failure: RefCell::new(None),
        }
    }

    /// Why the last connection failed (name lookup, connect or TLS handshake), if one
    /// did since the last call.
    pub(crate) fn take_failure(&self) -> Option<String> {
        self.failure.borrow_mut().take()
    }

    pub(crate) fn fail(&self, outcome: Outcome, reason: String) -> Outcome {
        *self.failure.borrow_mut() = Some(reason);
        outcome
    }

    /// Where connections go, in words: `127.0.0.1:8080 (from --resolve)`.
    pub(crate) fn describe(&self) -> String {
        match &self.address {
            Address::Fixed(addr, from) => format!("{addr} ({from})"),
            Address::Lookup { host, port } => format!("{host}:{port} (looked up in DNS)"),
        }
    }

    /// Where the next connection goes (looked up now for a name), with where the address
    /// came from; the lookup's time goes into `phases`.
    pub(crate) async fn resolve(
        &self,
        phases: &mut Phases,
    ) -> Result<(SocketAddr, &'static str), Outcome> {
        let start = Instant::now();
        let (addr, from) = match &self.address {
            Address::Fixed(addr, from) => (*addr, *from),
            Address::Lookup { host, port } => {
                let found = tokio::net::lookup_host((host.as_str(), *port))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|mut addrs| {
                        addrs.next().ok_or_else(|| "no address for it".to_owned())
                    });
                let addr = found.map_err(|e| {
                    self.fail(
                        Outcome::DnsError,
                        format!(
                            "cannot resolve `{host}` ({e}): check the name, or give its address \
                             with --resolve {host}:{port}:ADDRESS"
                        ),
                    )
                })?;
                (addr, "resolved by DNS")
            }
        };
        // A fixed address is no lookup: a preemption between the two clock reads is not
        // DNS time (it came out 1 us under a loaded machine).
        phases.dns_ns = match self.address {
            Address::Fixed(..) => 0,
            Address::Lookup { .. } => nanos(start.elapsed()),
        };
        Ok((addr, from))
    }

    /// Opens a connection, timing each phase into `phases`.
    pub(crate) async fn connect(&self, phases: &mut Phases) -> Result<Stream, Outcome> {
        let (addr, from) = self.resolve(phases).await?;
        let resolved = Instant::now();
        let tcp = TcpStream::connect(addr).await.map_err(|e| match e.kind() {
            io::ErrorKind::ConnectionRefused => self.fail(
                Outcome::Refused,
                format!(
                    "{addr} ({from}) refused the connection: nothing listens there (is the \
                     server running, is the port right?)"
                ),
            ),
            io::ErrorKind::TimedOut => self.fail(
                Outcome::ConnectTimeout,
                format!("connecting to {addr} ({from}) timed out in the kernel"),
            ),
            _ => self.fail(
                Outcome::ConnectError,
                format!("connecting to {addr} ({from}): {e}"),
            ),
        })?;
        let _ = tcp.set_nodelay(true);
        let connected = Instant::now();
        phases.connect_ns = nanos(connected - resolved);
        match &self.tls {
            None => Ok(Stream::Plain(tcp)),
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| self.fail(Outcome::TlsError, describe_tls_failure(&e)))?;
                phases.tls_ns = nanos(connected.elapsed());
                Ok(Stream::Tls(Box::new(tls)))
            }
        }
    }
}

/// A TLS handshake failure in words, with the fix where a common one has a known fix.
pub(crate) fn describe_tls_failure(e: &io::Error) -> String {
    use rustls::{CertificateError, Error};
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<Error>()) else {
        return format!("TLS handshake: {e}");
    };
    let hint = match tls {
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "the server's certificate is not signed by a trusted CA: pass the CA that signed \
             it with --cacert, or -k to accept any certificate"
        }
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => {
            "the certificate does not name the host: use --sni NAME, or a URL with that name \
              and --resolve"
        }
        Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => "the server's certificate has expired",
        Error::InvalidCertificate(CertificateError::BadSignature) => {
            "the certificate's signature does not verify with the CA given: it was signed by \
             another CA (one with the same name, perhaps); pass the CA that signed it with \
             --cacert, or -k to accept any certificate"
        }
        Error::InvalidCertificate(CertificateError::Other(other))
            if format!("{other:?}").contains("CaUsedAsEndEntity") =>
        {
            "the server presents a certificate marked as a CA (basicConstraints CA:TRUE) as its \
             own. curl and OpenSSL accept that; rustls, like browsers, refuses a CA certificate \
             as a server certificate. Make a CA, sign a server certificate (CA:FALSE, with the \
             host in subjectAltName) with it, serve that one and pass the CA with --cacert; or \
             use -k"
        }
        Error::InvalidMessage(_) | Error::InappropriateMessage { .. } => {
            "the server did not answer in TLS: is the port plain HTTP (use http://)?"
        }
        _ => {
            "check https:// vs http://, --cacert, --sni, or use -k for a self-signed \
              certificate"
        }
    };
    format!("TLS handshake: {tls}: {hint}")
}

/// What one exchange left behind, beyond the outcome.
pub(crate) struct Exchange {
    /// Response bytes read.
    pub(crate) bytes: u64,
    /// When the first response byte arrived.
    pub(crate) first_byte: Option<Instant>,
    /// Whether the connection can carry another request.
    pub(crate) reusable: bool,
    /// Whether the whole request was written: a timeout before it was is the server not
    /// reading (`write_timeout`), not a slow answer.
    pub(crate) written: bool,
}

/// Writes `request` and reads one response into `parser`, using the worker's shared read
/// buffer (borrowed only while a read is being parsed, never across a wait).
pub(crate) async fn exchange(
    stream: &mut Stream,
    request: &[u8],
    parser: &mut ResponseParser,
    buffer: &RefCell<Box<[u8]>>,
    progress: &mut Exchange,
) -> Outcome {
    let is_tls = matches!(stream, Stream::Tls(_));
    if let Err(e) = stream.write_all(request).await {
        return write_failure(&e, is_tls);
    }
    if is_tls {
        if let Err(e) = stream.flush().await {
            return write_failure(&e, is_tls);
        }
    }
    progress.written = true;
    loop {
        let read = poll_fn(|cx| {
            let mut buf = buffer.borrow_mut();
            let mut read_buf = ReadBuf::new(&mut buf[..]);
            match Pin::new(&mut *stream).poll_read(cx, &mut read_buf) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let data = read_buf.filled();
                    if data.is_empty() {
                        return Poll::Ready(Ok(None));
                    }
                    if progress.first_byte.is_none() {
                        progress.first_byte = Some(Instant::now());
                    }
                    let parsed = parser.feed(data);
                    Poll::Ready(Ok(Some((parsed, data.len()))))
                }
            }
        })
        .await;
        match read {
            Ok(Some((Ok(Progress::NeedMore), n))) => progress.bytes += n as u64,
            Ok(Some((Ok(Progress::Done { consumed }), n))) => {
                progress.bytes += consumed as u64;
                // Bytes beyond the response were never asked for: do not trust the connection.
                progress.reusable = consumed == n && parser.keep_alive();
                return Outcome::Status(parser.status());
            }
            Ok(Some((Err(_), _))) => return Outcome::Malformed,
            Ok(None) => {
                return if parser.complete_at_eof() {
                    Outcome::Status(parser.status())
                } else {
                    Outcome::Eof
                };
            }
            Err(e) => return read_failure(&e, is_tls),
        }
    }
}

/// Waits while a pooled connection sits idle, and returns when the server closes it (EOF,
/// a TLS close, a reset) or sends bytes no request asked for. It waits on the readiness
/// the reactor already tracks for the socket, so it makes no syscall while nothing
/// arrives; a TLS record that carries no data (a session ticket) is taken in and the
/// wait goes on.
pub(crate) async fn idle_end(stream: &mut Stream, buffer: &RefCell<Box<[u8]>>) -> IdleEnd {
    poll_fn(|cx| {
        let mut buf = buffer.borrow_mut();
        let mut read_buf = ReadBuf::new(&mut buf[..]);
        match Pin::new(&mut *stream).poll_read(cx, &mut read_buf) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) if read_buf.filled().is_empty() => Poll::Ready(IdleEnd::Closed),
            Poll::Ready(Ok(())) => Poll::Ready(IdleEnd::UnexpectedBytes),
            Poll::Ready(Err(_)) => Poll::Ready(IdleEnd::Closed),
        }
    })
    .await
}

fn write_failure(e: &io::Error, is_tls: bool) -> Outcome {
    if is_tls && e.kind() == io::ErrorKind::InvalidData {
        Outcome::TlsError
    } else {
        Outcome::ResetBeforeWrite
    }
}

fn read_failure(e: &io::Error, is_tls: bool) -> Outcome {
    match e.kind() {
        io::ErrorKind::InvalidData if is_tls => Outcome::TlsError,
        io::ErrorKind::UnexpectedEof => Outcome::Eof,
        _ => Outcome::ResetAfterWrite,
    }
}

/// Nanoseconds of a duration, saturating.
pub(crate) fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Descriptors the process needs besides its connections: files it writes, the reactor,
/// timers, the standard streams.
const SPARE_DESCRIPTORS: u64 = 64;

/// Raises the open-file limit to its hard limit if `connections` need it, or says before
/// the run that they cannot all be opened (a run that cannot open its sockets would
/// otherwise send nothing and look like a target that refuses them).
pub fn ensure_descriptors(connections: usize) -> Result<(), LoadError> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let needed = connections as u64 + SPARE_DESCRIPTORS;
    let limit = getrlimit(Resource::Nofile);
    let soft = limit.current.unwrap_or(u64::MAX);
    if needed <= soft {
        return Ok(());
    }
    let hard = limit.maximum.unwrap_or(u64::MAX);
    if needed <= hard {
        let raised = rustix::process::Rlimit {
            current: Some(needed),
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return Ok(());
        }
    }
    Err(LoadError::InvalidPlan {
        field: "-c/--connections".into(),
        reason: format!(
            "{connections} connections need {needed} open files, and this process may open {} (hard limit {}); raise it (`ulimit -n {needed}`, or LimitNOFILE= for a service) or use fewer connections",
            soft,
            limit.maximum.map_or("unlimited".to_owned(), |h| h.to_string())
        ),
    })
}
