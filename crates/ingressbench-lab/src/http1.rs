//! One HTTP/1.1 request on a fresh connection, for the tool's own errands: a proxy's admin
//! interface, whether the front or a kubelet-style probe answers, which backend a route
//! reaches. Not the load engine (`ingressbench_load`): no pacing, no timing, no reuse; the
//! caller opens the stream (TCP, a Unix socket, TLS) and sets its timeouts, and the request
//! says `Connection: close`.

use std::io::{self, Read, Write};

/// A request: `method path`, with `Host: host` and, when it has a body, that body as
/// JSON.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// `GET`, `POST`, `HEAD`…: a method other than `GET` and `HEAD` says its body's
    /// length even when it has none.
    pub method: &'a str,
    /// The request target as sent (`/stats?format=json`).
    pub path: &'a str,
    /// The `Host` header's value; empty for a Unix socket, which has no host.
    pub host: &'a str,
    /// JSON sent as the body, if any.
    pub body: Option<&'a str>,
}

impl<'a> Request<'a> {
    /// `GET path` for `host`.
    pub fn get(host: &'a str, path: &'a str) -> Self {
        Self {
            method: "GET",
            path,
            host,
            body: None,
        }
    }
}

/// How much of the answer to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// Its status line: whether it answers, and with what.
    Status,
    /// All of it, to the close (a chunked body joined).
    End,
}

/// What came back: the status (0 if the status line does not parse), the head's header
/// lines, and the body as text (empty when only the status was read).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// The status code; 0 if the status line has none.
    pub status: u16,
    /// The status line and the header lines, without the blank line that ends them.
    pub head: String,
    /// The body (a chunked one joined), lossily as UTF-8; empty when only the status
    /// line was read.
    pub body: String,
}

impl Answer {
    /// The first header `name` (any case), trimmed.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// Writes `request` on `stream` and reads the answer `until` its status line or its end.
///
/// Read to the end, an answer whose connection ends in an error after its head (a TLS peer
/// that closes without `close_notify`) keeps what arrived, unless its body is then shorter
/// than its `Content-Length` or a chunked body is cut short: those are errors, as is an
/// answer without a status line.
pub fn exchange(
    mut stream: impl Read + Write,
    request: &Request<'_>,
    until: Until,
) -> io::Result<Answer> {
    // HTTP/1.1 asks for a Host header, empty when there is no host (Envoy's admin
    // interface refuses a request without one).
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\n",
        request.method, request.path, request.host
    );
    let body = request.body.unwrap_or("");
    if request.body.is_some() || !matches!(request.method, "GET" | "HEAD") {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("Connection: close\r\n\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()?;
    match until {
        Until::Status => status_line(&mut stream),
        Until::End => whole(&mut stream),
    }
}

/// Reads up to the end of the status line (at most 1 KiB), a byte at a time so that
/// nothing past it is waited for.
fn status_line(stream: &mut impl Read) -> io::Result<Answer> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        if line.len() > 1024 || stream.read(&mut byte)? == 0 {
            return Err(cut_short("a status line"));
        }
        line.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&line).trim_end().to_owned();
    if !head.starts_with("HTTP/") {
        return Err(cut_short("a status line"));
    }
    Ok(Answer {
        status: status_of(&head),
        head,
        body: String::new(),
    })
}

fn whole(stream: &mut impl Read) -> io::Result<Answer> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if !raw.windows(4).any(|w| w == b"\r\n\r\n") => return Err(e),
            Err(_) => break,
        }
    }
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let Some((head, body)) = raw.split_once("\r\n\r\n") else {
        return Err(cut_short("an answer's head"));
    };
    let mut answer = Answer {
        status: status_of(head),
        head: head.to_owned(),
        body: String::new(),
    };
    answer.body = if answer
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        dechunk(body).ok_or_else(|| cut_short("a chunked answer"))?
    } else {
        let length = answer.header("content-length").and_then(|v| v.parse().ok());
        if length.is_some_and(|n: usize| body.len() < n) {
            return Err(cut_short("an answer's body"));
        }
        body.to_owned()
    };
    Ok(answer)
}

fn status_of(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn cut_short(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{what} cut short"))
}

/// A chunked body's data (Envoy's admin interface streams large answers so: a chunk's
/// size line may fall in the middle of a line of the text), or `None` if it is cut short.
fn dechunk(mut body: &str) -> Option<String> {
    let mut data = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(data);
        }
        data.push_str(rest.get(..size)?);
        body = rest.get(size..)?.strip_prefix("\r\n")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that hands out `answer` (then `end`) and keeps what was written.
    struct Peer {
        answer: io::Cursor<Vec<u8>>,
        end: Option<io::ErrorKind>,
        written: Vec<u8>,
    }

    impl Peer {
        fn new(answer: &str, end: Option<io::ErrorKind>) -> Self {
            Self {
                answer: io::Cursor::new(answer.as_bytes().to_vec()),
                end,
                written: Vec::new(),
            }
        }
    }

    impl Read for Peer {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.answer.read(buf)? {
                0 => self.end.map_or(Ok(0), |kind| Err(kind.into())),
                n => Ok(n),
            }
        }
    }

    impl Write for Peer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.written.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_chunked_answer_is_joined_even_where_a_chunk_splits_a_line() {
        let body = "b\r\nline one\nli\r\n7;ext=1\r\nne two\n\r\n0\r\n\r\n";
        assert_eq!(dechunk(body).as_deref(), Some("line one\nline two\n"));
        assert_eq!(dechunk("b\r\nline one\nli\r\n5\r\nne"), None);
        assert_eq!(dechunk("zz\r\n"), None);
    }

    #[test]
    fn the_request_says_what_it_is_and_the_answer_is_read_as_asked() {
        let answer =
            "HTTP/1.1 503 Service Unavailable\r\nX-Backend: b-2\r\nContent-Length: 4\r\n\r\ngone";
        let mut peer = Peer::new(answer, None);
        let post = Request {
            method: "POST",
            path: "/drain",
            host: "",
            body: Some("{}"),
        };
        let got = exchange(&mut peer, &post, Until::End).unwrap();
        assert_eq!((got.status, got.body.as_str()), (503, "gone"));
        assert_eq!(got.header("x-backend"), Some("b-2"));
        assert_eq!(
            String::from_utf8(peer.written).unwrap(),
            "POST /drain HTTP/1.1\r\nHost: \r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        );

        let mut peer = Peer::new(answer, None);
        let got = exchange(&mut peer, &Request::get("a.test", "/"), Until::Status).unwrap();
        assert_eq!((got.status, got.body.as_str()), (503, ""));
        assert_eq!(
            String::from_utf8(peer.written).unwrap(),
            "GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n"
        );
        // Only the status line was taken from the stream.
        assert_eq!(peer.answer.position(), 34);
    }

    #[test]
    fn a_close_after_a_whole_answer_keeps_it_and_a_cut_short_one_is_an_error() {
        let get = Request::get("a.test", "/");
        // A TLS peer that closes without close_notify, after the whole answer.
        let whole = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let eof = Some(io::ErrorKind::UnexpectedEof);
        let got = exchange(Peer::new(whole, eof), &get, Until::End).unwrap();
        assert_eq!(got.body, "ok");
        // The same close halfway through the body, or before the head ends.
        let half = "HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\nok";
        assert!(exchange(Peer::new(half, eof), &get, Until::End).is_err());
        assert!(exchange(Peer::new(half, None), &get, Until::End).is_err());
        let headless = "HTTP/1.1 200 OK\r\nContent-";
        assert!(exchange(Peer::new(headless, eof), &get, Until::End).is_err());
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n";
        assert!(exchange(Peer::new(chunked, None), &get, Until::End).is_err());
        // Not HTTP at all.
        assert!(exchange(Peer::new("SSH-2.0-x\r\n", None), &get, Until::Status).is_err());
        assert!(exchange(Peer::new("", None), &get, Until::Status).is_err());
    }
}
