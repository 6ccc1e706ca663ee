//! The echo backend over HTTP/2 without TLS (h2c with prior knowledge), so that a proxy's
//! upstream side can speak HTTP/2: a connection that opens with HTTP/2's preface is
//! served by the `h2` crate's server side, one task per stream, each answered as an
//! HTTP/1.1 request would be (the same delays, errors, stalls, headers and body).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Connection;

/// What a client sends first on an HTTP/2 connection (RFC 9113 §3.4).
pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether `buf` may still be the start of an HTTP/2 connection preface.
pub(super) fn may_be_preface(buf: &[u8]) -> bool {
    let n = buf.len().min(PREFACE.len());
    buf[..n] == PREFACE[..n]
}

/// A stream with bytes already read from it put back in front.
struct Rewound<S> {
    read: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewound<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.read.len() {
            let n = (this.read.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.read[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewound<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl Connection {
    /// Serves an HTTP/2 connection whose first bytes (`read`) were already taken off
    /// `stream`; returns the number of requests answered. Draining sends GOAWAY, lets
    /// the streams in flight finish, then ends.
    pub(super) async fn run_http2<S>(self, read: Vec<u8>, stream: S) -> u64
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = Rewound {
            read,
            at: 0,
            inner: stream,
        };
        let Ok(mut conn) = h2::server::Builder::new()
            .max_concurrent_streams(1000)
            .handshake::<_, Bytes>(io)
            .await
        else {
            return 0;
        };
        self.responses
            .http2_connections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut drain = self.drain.clone();
        let mut streams = tokio::task::JoinSet::new();
        let mut answered = 0;
        let mut seed = self.rng;
        let mut draining = *drain.borrow();
        if draining {
            conn.graceful_shutdown();
        }
        loop {
            tokio::select! {
                accepted = conn.accept() => {
                    let Some(Ok((request, respond))) = accepted else { break };
                    seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
                    let mut each = self.clone();
                    each.rng = seed | 1;
                    streams.spawn(each.answer_http2(request, respond));
                }
                Some(done) = streams.join_next(), if !streams.is_empty() => {
                    answered += u64::from(done.unwrap_or(false));
                }
                _ = drain.wait_for(|d| *d), if !draining => {
                    draining = true;
                    conn.graceful_shutdown();
                }
            }
        }
        while let Some(done) = streams.join_next().await {
            answered += u64::from(done.unwrap_or(false));
        }
        answered
    }

    /// What a request for `path` is answered with, as over HTTP/1.1: the health check's
    /// answer, an injected error, or the normal answer.
    pub(super) fn choose(&mut self, path: &str) -> (u16, Bytes) {
        if path == "/healthz" {
            if *self.drain.borrow() {
                (503, Bytes::from_static(b"draining\n"))
            } else {
                (200, Bytes::from_static(b"ok\n"))
            }
        } else if self.error_rate > 0.0 && self.uniform() < self.error_rate {
            (500, self.responses.error_body.clone())
        } else {
            (self.responses.status, self.responses.ok_body.clone())
        }
    }

    /// The head of an answer over HTTP/2 or HTTP/3 (`protocol`): a health check's bare,
    /// the others naming the backend, the protocol, the path and the body received.
    pub(super) fn answer_head(
        &self,
        status: u16,
        path: &str,
        received: usize,
        protocol: &str,
        body_len: usize,
    ) -> http::response::Builder {
        let mut answer = http::Response::builder()
            .status(status)
            .header("server", "ingressbench-backend")
            .header("content-type", "text/html")
            .header("content-length", body_len);
        if path != "/healthz" {
            let echoed: String = path.chars().filter(char::is_ascii_graphic).collect();
            answer = answer
                .header("x-backend", &self.responses.name)
                .header(super::PROTOCOL_HEADER, protocol)
                .header("x-echo-path", echoed);
            if received > 0 {
                answer = answer.header(super::BODY_HEADER, received);
            }
        }
        answer
    }

    /// Answers one stream as [`Connection::render`] answers an HTTP/1.1 request; says
    /// whether the answer went out.
    async fn answer_http2(
        mut self,
        request: http::Request<h2::RecvStream>,
        mut respond: h2::server::SendResponse<Bytes>,
    ) -> bool {
        if super::grpc::is_grpc(&request) {
            return self.answer_grpc(request, respond).await;
        }
        self.leak();
        // The path without its query, as over HTTP/1.1.
        let path = request.uri().path().to_owned();
        let head = request.method() == http::Method::HEAD;
        // The request body, if any, is read, counted and dropped (its window given back).
        let mut body_in = request.into_body();
        let mut received = 0;
        while let Some(Ok(chunk)) = body_in.data().await {
            received += chunk.len();
            let _ = body_in.flow_control().release_capacity(chunk.len());
        }
        self.wait_before_answering().await;
        let (status, body) = self.choose(&path);
        let answer = self.answer_head(status, &path, received, "HTTP/2", body.len());
        let Ok(answer) = answer.body(()) else {
            return false;
        };
        let empty = head || body.is_empty();
        let Ok(mut out) = respond.send_response(answer, empty) else {
            return false;
        };
        empty || out.send_data(body, true).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preface_is_told_from_http1_by_its_first_bytes() {
        assert!(may_be_preface(b""));
        assert!(may_be_preface(b"PRI * HT"));
        assert!(may_be_preface(PREFACE));
        assert!(!may_be_preface(b"GET / HTTP/1.1\r\n"));
        assert!(!may_be_preface(b"PRIX"));
    }
}
