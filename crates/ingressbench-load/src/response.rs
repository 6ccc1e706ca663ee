//! A streaming HTTP/1.x response parser that keeps no copy of what it reads.
//!
//! Bytes are fed as they arrive, in pieces of any size, and the parser keeps only a few
//! fields of state: the status, the framing of the body, the value of one chosen header
//! (the backend header) and the numbers in the generation headers. That lets every
//! connection of a worker share one read buffer, so ten thousand idle connections cost a
//! few hundred bytes each.

use ingressbench_stats::GENERATION_SLOTS;

/// The longest header name the parser tells apart; longer names are skipped.
const NAME_CAP: usize = 64;
/// The longest header value it keeps (of the headers it looks at).
pub(crate) const VALUE_CAP: usize = 128;
/// A response head larger than this is malformed.
const HEAD_LIMIT: usize = 64 * 1024;

/// What one call to [`ResponseParser::feed`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// The response is not complete yet; feed more.
    NeedMore,
    /// The response ended after `consumed` bytes of the input; any more bytes were not
    /// asked for (the connection should not be reused).
    Done { consumed: usize },
}

/// Why a response could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) &'static str);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    StatusLine,
    SkipLine,
    LineStart,
    HeadEndLf,
    Name,
    ValueStart,
    Value,
    Body { remaining: u64 },
    UntilClose,
    ChunkSize,
    ChunkExt,
    ChunkData { remaining: u64 },
    ChunkDataCr,
    ChunkDataLf,
    TrailerStart,
    TrailerSkip,
    TrailerLf,
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Header {
    ContentLength,
    TransferEncoding,
    Connection,
    Backend,
    Generation(usize),
    ContentType,
    Other,
}

/// Parses one response after another on one connection.
#[derive(Clone, Debug)]
pub(crate) struct ResponseParser {
    backend_header: Box<[u8]>,
    generation_headers: Box<[Box<[u8]>]>,
    state: State,
    head_request: bool,
    status_line: [u8; 13],
    status_len: usize,
    status: u16,
    minor_version: u8,
    content_length: Option<u64>,
    chunked: bool,
    close: bool,
    keep_alive: bool,
    /// Whether the Content-Type is read (event streams only: the HTTP engine's
    /// per-response path does not pay for it).
    read_content_type: bool,
    /// The Content-Type said `text/event-stream`.
    event_stream: bool,
    name: [u8; NAME_CAP],
    name_len: usize,
    name_overflow: bool,
    header: Header,
    value: [u8; VALUE_CAP],
    value_len: usize,
    value_overflow: bool,
    backend: [u8; VALUE_CAP],
    backend_len: usize,
    generations: [u32; GENERATION_SLOTS],
    chunk_size: u64,
    chunk_digits: u32,
    head_bytes: usize,
}

impl ResponseParser {
    /// A parser that also captures the header `backend_header` (any case), and the
    /// number in each of `generation_headers` (at most [`GENERATION_SLOTS`]; more are
    /// ignored).
    pub(crate) fn new(backend_header: &str, generation_headers: &[String]) -> Self {
        let lower = |name: &str| name.to_ascii_lowercase().into_bytes().into_boxed_slice();
        Self {
            backend_header: lower(backend_header),
            generation_headers: generation_headers
                .iter()
                .take(GENERATION_SLOTS)
                .map(|name| lower(name))
                .collect(),
            state: State::StatusLine,
            head_request: false,
            status_line: [0; 13],
            status_len: 0,
            status: 0,
            minor_version: 1,
            content_length: None,
            chunked: false,
            close: false,
            keep_alive: false,
            read_content_type: false,
            event_stream: false,
            name: [0; NAME_CAP],
            name_len: 0,
            name_overflow: false,
            header: Header::Other,
            value: [0; VALUE_CAP],
            value_len: 0,
            value_overflow: false,
            backend: [0; VALUE_CAP],
            backend_len: 0,
            generations: [0; GENERATION_SLOTS],
            chunk_size: 0,
            chunk_digits: 0,
            head_bytes: 0,
        }
    }

    /// The same parser, also reading whether the Content-Type is `text/event-stream`
    /// ([`ResponseParser::is_event_stream`]).
    pub(crate) fn reading_content_type(mut self) -> Self {
        self.read_content_type = true;
        self
    }

    /// Gets ready for the next response; `head_request` says the request was a HEAD (whose
    /// response has no body whatever its headers say).
    pub(crate) fn reset(&mut self, head_request: bool) {
        self.state = State::StatusLine;
        self.head_request = head_request;
        self.status_len = 0;
        self.status = 0;
        self.minor_version = 1;
        self.content_length = None;
        self.chunked = false;
        self.close = false;
        self.keep_alive = false;
        self.event_stream = false;
        self.backend_len = 0;
        self.generations = [0; GENERATION_SLOTS];
        self.head_bytes = 0;
    }

    /// The status of the response (valid once the head is parsed).
    pub(crate) fn status(&self) -> u16 {
        self.status
    }

    /// Whether the response's Content-Type is `text/event-stream`.
    pub(crate) fn is_event_stream(&self) -> bool {
        self.event_stream
    }

    /// The backend header's value, if the response had one.
    pub(crate) fn backend(&self) -> Option<&[u8]> {
        (self.backend_len > 0).then(|| &self.backend[..self.backend_len])
    }

    /// The number in each generation header, in the order they were given; 0 where the
    /// response had none (or not a number).
    pub(crate) fn generations(&self) -> [u32; GENERATION_SLOTS] {
        self.generations
    }

    /// Whether the connection can carry another request after this response.
    pub(crate) fn keep_alive(&self) -> bool {
        if self.close || self.state == State::UntilClose {
            return false;
        }
        self.minor_version >= 1 || self.keep_alive
    }

    /// Whether the response was complete when the peer closed the connection: true for a
    /// body delimited by the end of the connection.
    pub(crate) fn complete_at_eof(&mut self) -> bool {
        if self.state == State::UntilClose {
            self.state = State::Done;
        }
        self.state == State::Done
    }

    /// Feeds the next bytes of the connection.
    pub(crate) fn feed(&mut self, data: &[u8]) -> Result<Progress, Malformed> {
        self.feed_body(data, |_| {})
    }

    /// As [`Self::feed`], giving each piece of the body (de-chunked) to `body` as it
    /// passes.
    pub(crate) fn feed_body(
        &mut self,
        data: &[u8],
        mut body: impl FnMut(&[u8]),
    ) -> Result<Progress, Malformed> {
        let mut i = 0;
        while i < data.len() {
            if self.in_head() {
                self.head_bytes += 1;
                if self.head_bytes > HEAD_LIMIT {
                    return Err(Malformed("response head larger than 64 KiB"));
                }
            }
            let b = data[i];
            match self.state {
                State::StatusLine => self.status_byte(b)?,
                State::SkipLine => {
                    // Skip the rest of the line in one go.
                    match memchr::memchr(b'\n', &data[i..]) {
                        Some(at) => {
                            self.head_bytes += at;
                            i += at;
                            self.state = State::LineStart;
                        }
                        None => {
                            self.head_bytes += data.len() - i - 1;
                            return self.check_head_limit();
                        }
                    }
                }
                State::LineStart => match b {
                    b'\r' => self.state = State::HeadEndLf,
                    b'\n' => self.end_of_head()?,
                    b' ' | b'\t' => return Err(Malformed("obsolete folded header line")),
                    _ => {
                        self.name_len = 0;
                        self.name_overflow = false;
                        self.name_byte(b)?;
                        self.state = State::Name;
                    }
                },
                State::HeadEndLf => {
                    if b != b'\n' {
                        return Err(Malformed("CR without LF at the end of the head"));
                    }
                    self.end_of_head()?;
                }
                State::Name => {
                    if b == b':' {
                        self.header = self.classify_name();
                        self.value_len = 0;
                        self.value_overflow = false;
                        self.state = State::ValueStart;
                    } else {
                        self.name_byte(b)?;
                    }
                }
                State::ValueStart | State::Value => {
                    if self.header == Header::Other {
                        // Uninteresting header: skip to the end of its line in one go.
                        match memchr::memchr(b'\n', &data[i..]) {
                            Some(at) => {
                                self.head_bytes += at;
                                i += at;
                                self.state = State::LineStart;
                            }
                            None => {
                                self.head_bytes += data.len() - i - 1;
                                return self.check_head_limit();
                            }
                        }
                    } else {
                        self.value_byte(b)?;
                    }
                }
                State::Body { remaining } => {
                    let take = remaining.min((data.len() - i) as u64);
                    body(&data[i..i + take as usize]);
                    let remaining = remaining - take;
                    i += take as usize;
                    if remaining == 0 {
                        self.state = State::Done;
                        return Ok(Progress::Done { consumed: i });
                    }
                    self.state = State::Body { remaining };
                    continue;
                }
                State::UntilClose => {
                    body(&data[i..]);
                    return Ok(Progress::NeedMore);
                }
                State::ChunkSize => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let digit = (b as char).to_digit(16).unwrap_or(0) as u64;
                        self.chunk_digits += 1;
                        if self.chunk_digits > 15 {
                            return Err(Malformed("chunk size too large"));
                        }
                        self.chunk_size = self.chunk_size * 16 + digit;
                    }
                    b';' | b' ' | b'\t' if self.chunk_digits > 0 => self.state = State::ChunkExt,
                    b'\r' if self.chunk_digits > 0 => self.state = State::ChunkExt,
                    b'\n' if self.chunk_digits > 0 => self.end_of_chunk_size(),
                    _ => return Err(Malformed("bad chunk size")),
                },
                State::ChunkExt => {
                    if b == b'\n' {
                        self.end_of_chunk_size();
                    }
                }
                State::ChunkData { remaining } => {
                    let take = remaining.min((data.len() - i) as u64);
                    body(&data[i..i + take as usize]);
                    i += take as usize;
                    self.state = if remaining == take {
                        State::ChunkDataCr
                    } else {
                        State::ChunkData {
                            remaining: remaining - take,
                        }
                    };
                    continue;
                }
                State::ChunkDataCr => match b {
                    b'\r' => self.state = State::ChunkDataLf,
                    b'\n' => self.start_chunk(),
                    _ => return Err(Malformed("chunk data longer than its size")),
                },
                State::ChunkDataLf => {
                    if b != b'\n' {
                        return Err(Malformed("CR without LF after chunk data"));
                    }
                    self.start_chunk();
                }
                State::TrailerStart => match b {
                    b'\r' => self.state = State::TrailerLf,
                    b'\n' => {
                        self.state = State::Done;
                        return Ok(Progress::Done { consumed: i + 1 });
                    }
                    _ => self.state = State::TrailerSkip,
                },
                State::TrailerSkip => {
                    if b == b'\n' {
                        self.state = State::TrailerStart;
                    }
                }
                State::TrailerLf => {
                    if b != b'\n' {
                        return Err(Malformed("CR without LF after trailers"));
                    }
                    self.state = State::Done;
                    return Ok(Progress::Done { consumed: i + 1 });
                }
                State::Done => return Ok(Progress::Done { consumed: i }),
            }
            i += 1;
            if self.state == State::Done {
                return Ok(Progress::Done { consumed: i });
            }
        }
        Ok(if self.state == State::Done {
            Progress::Done { consumed: i }
        } else {
            Progress::NeedMore
        })
    }

    /// The response's head has been read (its status and headers are known).
    pub(crate) fn head_read(&self) -> bool {
        !self.in_head()
    }

    fn in_head(&self) -> bool {
        matches!(
            self.state,
            State::StatusLine
                | State::SkipLine
                | State::LineStart
                | State::HeadEndLf
                | State::Name
                | State::ValueStart
                | State::Value
        )
    }

    fn check_head_limit(&self) -> Result<Progress, Malformed> {
        if self.head_bytes > HEAD_LIMIT {
            Err(Malformed("response head larger than 64 KiB"))
        } else {
            Ok(Progress::NeedMore)
        }
    }

    fn status_byte(&mut self, b: u8) -> Result<(), Malformed> {
        const PREFIX: &[u8] = b"HTTP/1.";
        if self.status_len < PREFIX.len() && b != PREFIX[self.status_len] {
            // Say so at the first wrong byte: a TLS record or a banner may be short.
            return Err(Malformed("not an HTTP/1.x status line"));
        }
        self.status_line[self.status_len] = b;
        self.status_len += 1;
        if self.status_len < self.status_line.len() {
            return Ok(());
        }
        let line = &self.status_line;
        if &line[..7] != b"HTTP/1." || !line[7].is_ascii_digit() || line[8] != b' ' {
            return Err(Malformed("not an HTTP/1.x status line"));
        }
        let digits = &line[9..12];
        if !digits.iter().all(u8::is_ascii_digit) {
            return Err(Malformed("status code is not three digits"));
        }
        let status = digits
            .iter()
            .fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0'));
        if !(100..=599).contains(&status) {
            return Err(Malformed("status code out of range"));
        }
        self.status = status;
        self.minor_version = line[7] - b'0';
        self.state = match line[12] {
            b'\n' => State::LineStart,
            b' ' | b'\r' => State::SkipLine,
            _ => return Err(Malformed("status code is not three digits")),
        };
        Ok(())
    }

    fn name_byte(&mut self, b: u8) -> Result<(), Malformed> {
        if !crate::request::is_token(b) {
            return Err(Malformed("invalid character in a header name"));
        }
        if self.name_len < NAME_CAP {
            self.name[self.name_len] = b.to_ascii_lowercase();
            self.name_len += 1;
        } else {
            self.name_overflow = true;
        }
        Ok(())
    }

    fn classify_name(&self) -> Header {
        if self.name_overflow {
            return Header::Other;
        }
        match &self.name[..self.name_len] {
            b"content-length" => Header::ContentLength,
            b"transfer-encoding" => Header::TransferEncoding,
            b"connection" => Header::Connection,
            b"content-type" if self.read_content_type => Header::ContentType,
            name if name == &*self.backend_header => Header::Backend,
            name => self
                .generation_headers
                .iter()
                .position(|h| name == &**h)
                .map_or(Header::Other, Header::Generation),
        }
    }

    fn value_byte(&mut self, b: u8) -> Result<(), Malformed> {
        match b {
            b'\n' => {
                self.end_of_header()?;
                self.state = State::LineStart;
            }
            b' ' | b'\t' if self.state == State::ValueStart => {}
            _ => {
                self.state = State::Value;
                if self.value_len < VALUE_CAP {
                    self.value[self.value_len] = b;
                    self.value_len += 1;
                } else {
                    self.value_overflow = true;
                }
            }
        }
        Ok(())
    }

    fn end_of_header(&mut self) -> Result<(), Malformed> {
        let mut value = &self.value[..self.value_len];
        while let [rest @ .., b'\r' | b' ' | b'\t'] = value {
            value = rest;
        }
        match self.header {
            Header::ContentLength => {
                if self.value_overflow
                    || value.is_empty()
                    || !value.iter().all(u8::is_ascii_digit)
                    || value.len() > 18
                {
                    return Err(Malformed("invalid Content-Length"));
                }
                let n = value
                    .iter()
                    .fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0'));
                if self.content_length.is_some_and(|prev| prev != n) {
                    return Err(Malformed("conflicting Content-Length headers"));
                }
                self.content_length = Some(n);
            }
            Header::TransferEncoding => {
                if self.value_overflow {
                    return Err(Malformed("Transfer-Encoding header too long"));
                }
                let last = value.rsplit(|&c| c == b',').next().unwrap_or(value);
                self.chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
                if !self.chunked {
                    // A transfer coding we do not decode: the body runs to the close.
                    self.close = true;
                }
            }
            Header::Connection => {
                for token in value.split(|&c| c == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        self.close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        self.keep_alive = true;
                    }
                }
            }
            Header::ContentType => {
                let media = value.split(|&c| c == b';').next().unwrap_or_default();
                self.event_stream = media
                    .trim_ascii()
                    .eq_ignore_ascii_case(b"text/event-stream");
            }
            Header::Backend => {
                self.backend[..value.len()].copy_from_slice(value);
                self.backend_len = value.len();
            }
            Header::Generation(slot) => {
                // A number of at most nine digits; anything else reads as none.
                let number = !self.value_overflow
                    && (1..=9).contains(&value.len())
                    && value.iter().all(u8::is_ascii_digit);
                self.generations[slot] = if number {
                    value
                        .iter()
                        .fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0'))
                } else {
                    0
                };
            }
            Header::Other => {}
        }
        Ok(())
    }

    fn end_of_head(&mut self) -> Result<(), Malformed> {
        if self.status < 200 {
            // An interim response (100 Continue, 103 Early Hints): the real one follows.
            let head_request = self.head_request;
            self.reset(head_request);
            return Ok(());
        }
        self.state = if self.head_request || self.status == 204 || self.status == 304 {
            State::Done
        } else if self.chunked {
            self.chunk_size = 0;
            self.chunk_digits = 0;
            State::ChunkSize
        } else if self.close && self.content_length.is_none() {
            State::UntilClose
        } else {
            match self.content_length {
                Some(0) => State::Done,
                Some(n) => State::Body { remaining: n },
                None => State::UntilClose,
            }
        };
        Ok(())
    }

    fn end_of_chunk_size(&mut self) {
        self.state = if self.chunk_size == 0 {
            State::TrailerStart
        } else {
            State::ChunkData {
                remaining: self.chunk_size,
            }
        };
    }

    fn start_chunk(&mut self) {
        self.chunk_size = 0;
        self.chunk_digits = 0;
        self.state = State::ChunkSize;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse_all(input: &[u8]) -> (Result<Progress, Malformed>, ResponseParser) {
        let mut p = ResponseParser::new("x-backend", &[]);
        p.reset(false);
        (p.feed(input), p)
    }

    #[test]
    fn content_length_response() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Backend: b1\r\n\r\nhello";
        let (r, p) = parse_all(raw);
        assert_eq!(
            r,
            Ok(Progress::Done {
                consumed: raw.len()
            })
        );
        assert_eq!(p.status(), 200);
        assert_eq!(p.backend(), Some(&b"b1"[..]));
        assert!(p.keep_alive());
    }

    #[test]
    fn generation_headers_are_read_as_numbers_in_their_slots() {
        let headers = ["x-gen".to_owned(), "x-side-gen".to_owned()];
        let mut p = ResponseParser::new("x-backend", &headers);
        let mut parse = |raw: &[u8]| {
            p.reset(false);
            assert!(matches!(p.feed(raw), Ok(Progress::Done { .. })));
            p.generations()
        };
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\nX-Side-Gen: 3\r\nX-Gen:  17 \r\nContent-Length: 0\r\n\r\n"),
            [17, 3]
        );
        // The next answer starts from none; what is not a number of at most nine digits
        // reads as none.
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
            [0, 0]
        );
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\nx-gen: 7a\r\nx-side-gen: 1234567890\r\nContent-Length: 0\r\n\r\n"),
            [0, 0]
        );
        // A header that merely starts like one is another header.
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\nx-gen-old: 5\r\nContent-Length: 0\r\n\r\n"),
            [0, 0]
        );
    }

    #[test]
    fn chunked_response_with_trailers() {
        let raw = b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n1\r\n!\r\n0\r\nX-T: 1\r\n\r\n";
        let (r, p) = parse_all(raw);
        assert_eq!(
            r,
            Ok(Progress::Done {
                consumed: raw.len()
            })
        );
        assert_eq!(p.status(), 201);
    }

    #[test]
    fn no_body_statuses_and_head() {
        for raw in [
            &b"HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n"[..],
            b"HTTP/1.1 304 Not Modified\r\n\r\n",
        ] {
            let (r, _) = parse_all(raw);
            assert_eq!(
                r,
                Ok(Progress::Done {
                    consumed: raw.len()
                })
            );
        }
        let mut p = ResponseParser::new("x-backend", &[]);
        p.reset(true);
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n";
        assert_eq!(
            p.feed(raw),
            Ok(Progress::Done {
                consumed: raw.len()
            })
        );
    }

    #[test]
    fn body_until_close() {
        let (r, mut p) = parse_all(b"HTTP/1.0 200 OK\r\n\r\nsome body");
        assert_eq!(r, Ok(Progress::NeedMore));
        assert!(!p.keep_alive());
        assert!(p.complete_at_eof());
    }

    #[test]
    fn http10_keep_alive_and_connection_close() {
        let (_, p) =
            parse_all(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n");
        assert!(p.keep_alive());
        let (_, p) =
            parse_all(b"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n");
        assert!(!p.keep_alive());
    }

    #[test]
    fn interim_responses_are_skipped() {
        let raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let (r, p) = parse_all(raw);
        assert_eq!(
            r,
            Ok(Progress::Done {
                consumed: raw.len()
            })
        );
        assert_eq!(p.status(), 200);
    }

    #[test]
    fn bare_lf_line_endings_are_accepted() {
        let raw = b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok";
        assert_eq!(
            parse_all(raw).0,
            Ok(Progress::Done {
                consumed: raw.len()
            })
        );
    }

    #[test]
    fn garbage_is_malformed() {
        for raw in [
            &b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n"[..],
            b"HTTP/1.1 2x0 OK\r\n\r\n",
            b"HTTP/1.1 999 Nope\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",
        ] {
            assert!(
                parse_all(raw).0.is_err(),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn huge_head_is_malformed() {
        let mut raw = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..10_000 {
            raw.extend_from_slice(format!("X-Filler-{i}: aaaaaaaaaa\r\n").as_bytes());
        }
        assert!(parse_all(&raw).0.is_err());
    }

    #[test]
    fn bytes_after_the_response_are_not_consumed() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA";
        assert_eq!(
            parse_all(raw).0,
            Ok(Progress::Done {
                consumed: raw.len() - 5
            })
        );
    }

    #[test]
    fn reuse_for_a_second_response() {
        let mut p = ResponseParser::new("x-backend", &[]);
        p.reset(false);
        let one = b"HTTP/1.1 200 OK\r\nX-Backend: a\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            p.feed(one),
            Ok(Progress::Done {
                consumed: one.len()
            })
        );
        p.reset(false);
        let two = b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            p.feed(two),
            Ok(Progress::Done {
                consumed: two.len()
            })
        );
        assert_eq!(p.status(), 503);
        assert_eq!(p.backend(), None);
    }

    fn response_strategy() -> impl Strategy<Value = Vec<u8>> {
        let body = proptest::collection::vec(any::<u8>(), 0..300);
        (
            body,
            any::<bool>(),
            1usize..40,
            proptest::collection::vec("[a-z]{1,12}", 0..5),
        )
            .prop_map(|(body, chunked, chunk, names)| {
                let mut raw = b"HTTP/1.1 200 OK\r\nX-Backend: b7\r\n".to_vec();
                for n in names {
                    raw.extend_from_slice(format!("X-{n}: value {n}\r\n").as_bytes());
                }
                if chunked {
                    raw.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                    for piece in body.chunks(chunk) {
                        raw.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                        raw.extend_from_slice(piece);
                        raw.extend_from_slice(b"\r\n");
                    }
                    raw.extend_from_slice(b"0\r\n\r\n");
                } else {
                    raw.extend_from_slice(
                        format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes(),
                    );
                    raw.extend_from_slice(&body);
                }
                raw
            })
    }

    proptest! {
        #[test]
        fn any_split_of_a_valid_response_parses_the_same(raw in response_strategy(), cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6)) {
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(raw.len() + 1)).collect();
            points.push(0);
            points.push(raw.len());
            points.sort_unstable();
            points.dedup();
            let mut p = ResponseParser::new("x-backend", &[]);
            p.reset(false);
            let mut done_at = None;
            for w in points.windows(2) {
                match p.feed(&raw[w[0]..w[1]]) {
                    Ok(Progress::Done { consumed }) => { done_at = Some(w[0] + consumed); break; }
                    Ok(Progress::NeedMore) => {}
                    Err(e) => prop_assert!(false, "malformed: {e:?}"),
                }
            }
            prop_assert_eq!(done_at, Some(raw.len()));
            prop_assert_eq!(p.backend(), Some(&b"b7"[..]));
        }

        #[test]
        fn garbage_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let mut p = ResponseParser::new("x-backend", &[]);
            p.reset(false);
            let _ = p.feed(&raw);
            let _ = p.complete_at_eof();
        }
    }
}
