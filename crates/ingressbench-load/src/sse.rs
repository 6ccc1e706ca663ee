//! Server-sent events (issue #34): each connection holds one `text/event-stream` response
//! open, as a browser's `EventSource` does, and the server sends it numbered events on the
//! open-loop schedule the client asks for; a cut stream is resumed with `Last-Event-ID`.
//!
//! The request says the schedule (`sse_every_ns`, `sse_count`, `sse_bytes` and
//! `sse_epoch_ns`, the wall-clock time event 0 is due: the lab's echo backend keeps it), so
//! every event has a due time both ends know, and each is timed from when it was due to
//! when it came (no coordinated omission: an event due while the stream was down, sent
//! when it resumed, carries the wait). An event that has not come a timeout after it was
//! due is lost (late if it comes after); one that comes twice is duplicated; events a
//! resumed stream skipped (its first id past the last one seen) are lost with the cut. A
//! stream the server ended is a close by the server, one that broke mid-response an
//! abnormal one; neither has a code. The timing compares two wall clocks: on one machine
//! (the lab, a local cluster) they are one clock; across machines their offset is in
//! every figure.

use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_stats::{BackendId, Outcome, Phases};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::connection::Stream;
use crate::response::{Progress, ResponseParser};
use crate::stream::{drive, ClosedBy, Downtime, Numbered, Run, Said, StreamKind, StreamOptions};
use crate::{LoadError, LoadReport, Observer, Plan};

/// Runs an event stream plan ([`crate::Kind::Sse`]) to its end or until `stop` is set,
/// giving windows and samples to `observer` as the HTTP engine does.
pub(crate) fn run(
    plan: &Plan,
    options: &StreamOptions,
    stop: Arc<AtomicBool>,
    observer: &mut dyn Observer,
) -> Result<LoadReport, LoadError> {
    drive(plan, (StreamKind::Sse, options), stop, observer, connection)
}

/// One connection's event streams, one after another, to the end of the run.
async fn connection(run: Rc<Run>, index: usize) {
    let mut events = Numbered::new(&run, index);
    let mut down = Downtime::new(index);
    tokio::time::sleep_until(run.start.into()).await;
    while Instant::now() < run.end && events.to_come(&run) {
        match open(&run, &events).await {
            Ok(mut open) => {
                // What the stream skips is lost with the close that cut the last one.
                let cut_by = down.close;
                let backend = run.reopened(&mut down, open.backend.as_deref());
                events.expire(&run, backend);
                let ended = listen(&run, &mut open, backend, &mut events, cut_by).await;
                match ended {
                    None => {
                        run.open.set(run.open.get() - 1);
                        break;
                    }
                    Some((by, reason)) => {
                        run.cut(&mut down, (by, Said::Nothing, reason), open.backend, 0);
                    }
                }
            }
            Err(why) => run.failed(&mut down, why),
        }
        if !down.wait(&run).await {
            events.give_up(&run);
            return;
        }
    }
    events.finish(&run);
}

/// An event stream's response, its head read.
struct Open {
    stream: Stream,
    parser: ResponseParser,
    /// What was read past the head.
    rest: Vec<u8>,
    backend: Option<String>,
    phases: Phases,
}

/// Opens an event stream: a connection, the request (resuming after the last id seen),
/// the response's head; an answer other than 200 is a failure by its status.
async fn open(run: &Run, events: &Numbered) -> Result<Open, String> {
    let plan = &run.plan;
    let mut phases = Phases::default();
    let mut stream = run.connect(&mut phases).await?;
    let request = render(run, events);
    let mut parser = ResponseParser::new(&plan.backend_header, &[]).reading_content_type();
    let head = async {
        stream
            .write_all(&request)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let mut buf = vec![0u8; 16 << 10];
        let mut body = Vec::new();
        loop {
            let n = stream
                .read(&mut buf)
                .await
                .map_err(|e| format!("response: {e}"))?;
            if n == 0 {
                return Err("response: the connection ended before the head".to_owned());
            }
            let progress = parser
                .feed_body(&buf[..n], |piece| body.extend_from_slice(piece))
                .map_err(|e| format!("response: {}", e.0))?;
            if parser.head_read() || progress != Progress::NeedMore {
                return Ok(body);
            }
        }
    };
    let rest = match tokio::time::timeout(plan.timeout, head).await {
        Err(_) => return Err("response: timed out".into()),
        Ok(result) => result?,
    };
    if parser.status() != 200 {
        return Err(format!("status {}", parser.status()));
    }
    if !parser.is_event_stream() {
        // An HTML page with `id:` lines in it is not an event stream.
        return Err(
            "status 200 without Content-Type text/event-stream: not an event stream".into(),
        );
    }
    let backend = parser
        .backend()
        .map(|name| String::from_utf8_lossy(name).into_owned());
    Ok(Open {
        stream,
        parser,
        rest,
        backend,
        phases,
    })
}

/// The request for the events from the one after the last seen: the schedule in the
/// query, `Last-Event-ID` when resuming, the plan's headers.
fn render(run: &Run, events: &Numbered) -> Vec<u8> {
    let plan = &run.plan;
    let epoch_ns = events.epoch_ns();
    let separator = if plan.target.path.contains('?') {
        '&'
    } else {
        '?'
    };
    let mut head = format!(
        "GET {}{separator}sse_every_ns={}&sse_count={}&sse_bytes={}&sse_epoch_ns={epoch_ns} HTTP/1.1\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n",
        plan.target.path,
        run.interval.as_nanos(),
        events.count(),
        run.options.message_bytes,
    );
    if !plan
        .request
        .headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        head += &format!("Host: {}\r\n", plan.target.authority());
    }
    for (name, value) in &plan.request.headers {
        head += &format!("{name}: {value}\r\n");
    }
    if let Some(id) = events.last_id() {
        head += &format!("Last-Event-ID: {id}\r\n");
    }
    head += "\r\n";
    head.into_bytes()
}

/// Reads events until the run ends (none) or the stream is cut (who, and why); what a
/// resumed stream skipped is lost with `cut_by`, the close (in the report's list) that cut
/// the stream before.
async fn listen(
    run: &Run,
    open: &mut Open,
    backend: Option<BackendId>,
    events: &mut Numbered,
    mut cut_by: Option<usize>,
) -> Option<(ClosedBy, String)> {
    let mut parser = EventParser::new(run.options.message_bytes);
    let mut opened = Some(open.phases);
    let mut came = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    let mut data = std::mem::take(&mut open.rest);
    let mut ended = false;
    // Past the run's end, what is still coming may come for a timeout (at most 1 s).
    let deadline = run.end + run.plan.timeout.min(Duration::from_secs(1));
    loop {
        if let Err(why) = parser.push(&data, &mut came) {
            return Some((ClosedBy::Abnormal, why.to_owned()));
        }
        for (id, bytes) in came.drain(..) {
            let skipped = events.came(run, (id, bytes, Outcome::Status(200)), backend, &mut opened);
            if let Some(close) = cut_by.take() {
                if let Some(close) = run.report.borrow_mut().closes.get_mut(close) {
                    close.lost += skipped;
                }
            }
        }
        events.expire(run, backend);
        if !events.to_come(run) {
            return None;
        }
        if ended {
            return Some((ClosedBy::Server, "the response ended".into()));
        }
        data.clear();
        let read = tokio::time::timeout_at(
            deadline
                .min(Instant::now() + Duration::from_millis(100))
                .into(),
            open.stream.read(&mut buf),
        )
        .await;
        match read {
            Err(_) if Instant::now() >= deadline => return None,
            Err(_) => {}
            Ok(Ok(0)) => {
                return Some((
                    ClosedBy::Abnormal,
                    "the connection ended mid-response".into(),
                ))
            }
            Ok(Ok(n)) => match open
                .parser
                .feed_body(&buf[..n], |piece| data.extend_from_slice(piece))
            {
                Ok(Progress::Done { .. }) => ended = true,
                Ok(Progress::NeedMore) => {}
                Err(e) => return Some((ClosedBy::Abnormal, format!("response: {}", e.0))),
            },
            Ok(Err(e)) => return Some((ClosedBy::Abnormal, e.to_string())),
        }
    }
}

/// Reads `text/event-stream` (the HTML standard's event stream format) as it comes: the
/// id and size of each event dispatched; lines longer than the limit end the stream.
struct EventParser {
    line: Vec<u8>,
    limit: usize,
    /// The event being read: its id and bytes so far.
    id: Option<u64>,
    bytes: u64,
    /// The last byte was a CR (a CRLF's LF is not a second line end).
    after_cr: bool,
}

impl EventParser {
    fn new(message_bytes: usize) -> Self {
        Self {
            line: Vec::new(),
            limit: message_bytes.max(64 << 10) * 2,
            id: None,
            bytes: 0,
            after_cr: false,
        }
    }

    /// Reads `data`, adding each event dispatched (with a numeric id) to `out`.
    fn push(&mut self, data: &[u8], out: &mut Vec<(u64, u64)>) -> Result<(), &'static str> {
        for &b in data {
            match b {
                b'\n' if self.after_cr => {
                    // A CRLF's LF: the event it ended was dispatched at the CR.
                    self.after_cr = false;
                    if self.bytes > 0 {
                        self.bytes += 1;
                    }
                }
                b'\r' | b'\n' => {
                    self.bytes += 1;
                    self.after_cr = b == b'\r';
                    self.line_end(out);
                }
                _ => {
                    self.bytes += 1;
                    self.after_cr = false;
                    if self.line.len() >= self.limit {
                        return Err("an event line longer than twice the event size");
                    }
                    self.line.push(b);
                }
            }
        }
        Ok(())
    }

    fn line_end(&mut self, out: &mut Vec<(u64, u64)>) {
        if self.line.is_empty() {
            if let Some(id) = self.id.take() {
                out.push((id, self.bytes));
            }
            self.bytes = 0;
            return;
        }
        let (field, value) = match memchr::memchr(b':', &self.line) {
            Some(at) => {
                let value = &self.line[at + 1..];
                (&self.line[..at], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (&self.line[..], &[][..]),
        };
        if field == b"id" {
            self.id = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
        }
        self.line.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_by_id_across_pieces_and_line_ends() {
        let mut parser = EventParser::new(64);
        let mut out = Vec::new();
        let stream = b": comment\r\nretry: 1000\r\n\r\nid: 0\ndata: ab\n\nid: 1\r\ndata: x\r\n\r\nid:2\rdata\r\rdata: no id\n\n";
        for piece in stream.chunks(3) {
            parser.push(piece, &mut out).unwrap();
        }
        let ids: Vec<u64> = out.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [0, 1, 2]);
        assert_eq!(out[0].1, "id: 0\ndata: ab\n\n".len() as u64);
        let mut long = EventParser::new(16);
        assert!(long.push(&vec![b'x'; 200 << 10], &mut out).is_err());
    }
}
