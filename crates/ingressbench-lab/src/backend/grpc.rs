//! gRPC on the echo backend (issue #34): on HTTP/2 (h2c, what the proxies speak to it
//! for gRPC), a request whose content type is `application/grpc` is a call to the echo
//! service of `proto/ingressbench/echo/v1/echo.proto`. `Unary` answers with the message
//! it was given; `Stream` sends messages `from` .. `count` - 1, message N when the wall
//! clock reaches `epoch_ns + N × every_ns`, on the same kernel timer as server-sent
//! events. Statuses are gRPC's (`grpc-status` in the trailers, or alone in the head when
//! there is nothing to send): 12 UNIMPLEMENTED for another method or a compressed
//! message, 3 INVALID_ARGUMENT for a message it cannot read or a schedule it will not
//! send, 13 INTERNAL for an error `--error-rate` injects.
//!
//! The messages are read and written here without a protobuf library (the load engine's
//! client uses prost): two implementations of the one wire format, so a mistake in
//! either shows as a call that fails.
//!
//! When the backend drains (SIGTERM), its HTTP/2 connections say GOAWAY (the calls in
//! flight finish) and each stream ends with 14 UNAVAILABLE, as a well-behaved server
//! does, and the client resumes elsewhere; told not to
//! ([`super::WebSocketBehaviour::close_on_drain`] false), the streams go on until the
//! drain timeout drops the connection mid-stream. `drop_every` and `duplicate_every`
//! skip and repeat stream messages as they do WebSocket messages (for tests).

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use super::sse::{Schedule, WallTimer};
use super::{Connection, PROTOCOL_HEADER};

/// The unary method.
const UNARY: &str = "/ingressbench.echo.v1.Echo/Unary";
/// The server-streaming method.
const STREAM: &str = "/ingressbench.echo.v1.Echo/Stream";
/// The largest request message read.
const MOST_BYTES: usize = 16 << 20;

/// Whether `request` is a gRPC call (`application/grpc`, `application/grpc+proto`, …).
pub(super) fn is_grpc<T>(request: &http::Request<T>) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A field of a protobuf message.
#[derive(Debug, PartialEq, Eq)]
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// Reads a base-128 varint off the front of `data`.
fn varint(data: &mut &[u8]) -> Result<u64, &'static str> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = data.split_first().ok_or("a varint cut short")?;
        *data = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a varint longer than ten bytes")
}

/// The varint and length-delimited fields of a protobuf message, by number, in order
/// (fixed-width ones skipped, as nothing here has them).
fn fields(mut data: &[u8]) -> Result<Vec<(u64, Field<'_>)>, &'static str> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let key = varint(&mut data)?;
        let (number, wire) = (key >> 3, key & 7);
        match wire {
            0 => out.push((number, Field::Varint(varint(&mut data)?))),
            1 | 5 => {
                let width = if wire == 1 { 8 } else { 4 };
                data = data.get(width..).ok_or("a fixed field cut short")?;
            }
            2 => {
                let len = usize::try_from(varint(&mut data)?).map_err(|_| "a length too long")?;
                let (bytes, rest) = (
                    data.get(..len).ok_or("a field cut short")?,
                    &data[len.min(data.len())..],
                );
                out.push((number, Field::Bytes(bytes)));
                data = rest;
            }
            _ => return Err("a wire type protobuf 3 does not write"),
        }
    }
    Ok(out)
}

/// The last value of varint field `number` (protobuf's rule), 0 when absent.
fn number(fields: &[(u64, Field<'_>)], wanted: u64) -> u64 {
    fields
        .iter()
        .rev()
        .find_map(|(n, f)| match f {
            Field::Varint(v) if *n == wanted => Some(*v),
            _ => None,
        })
        .unwrap_or(0)
}

fn put_varint(out: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        out.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

/// `ingressbench.echo.v1.Message` { seq, due_ns, payload } framed for gRPC (the
/// uncompressed flag and the length, then the message).
fn message(seq: u64, due_ns: u64, payload: &[u8]) -> Bytes {
    let mut body = BytesMut::with_capacity(payload.len() + 32);
    put_varint(&mut body, 1 << 3);
    put_varint(&mut body, seq);
    put_varint(&mut body, 2 << 3);
    put_varint(&mut body, due_ns);
    put_varint(&mut body, (3 << 3) | 2);
    put_varint(&mut body, payload.len() as u64);
    body.put_slice(payload);
    let mut framed = BytesMut::with_capacity(body.len() + 5);
    framed.put_u8(0);
    framed.put_u32(body.len() as u32);
    framed.put_slice(&body);
    framed.freeze()
}

/// The message of a framed request body; why not, as a status and its words.
fn unframe(body: &[u8]) -> Result<&[u8], (u8, &'static str)> {
    let (&flag, rest) = body.split_first().ok_or((3, "no message"))?;
    if flag != 0 {
        return Err((12, "compressed messages are not read here"));
    }
    let len = rest
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or((3, "a message prefix cut short"))?;
    rest.get(4..4 + len)
        .filter(|m| m.len() + 4 == rest.len())
        .ok_or((3, "one message of the length its prefix says"))
}

/// The head of an answer: 200, gRPC's content type, the backend's name; with a status
/// when there is nothing else to send (a "trailers-only" answer).
fn head(name: &str, status: Option<(u8, &str)>) -> http::Response<()> {
    let mut head = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .header("x-backend", name)
        .header(PROTOCOL_HEADER, "gRPC");
    if let Some((code, words)) = status {
        head = head
            .header("grpc-status", code.to_string())
            .header("grpc-message", words);
    }
    head.body(()).unwrap_or_default()
}

/// The trailers that end an answer with `code` (and its words, unless OK).
fn trailers(code: u8, words: &str) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    map.insert("grpc-status", http::HeaderValue::from(u16::from(code)));
    if !words.is_empty() {
        if let Ok(words) = http::HeaderValue::from_str(words) {
            map.insert("grpc-message", words);
        }
    }
    map
}

impl Connection {
    /// Answers one gRPC call; says whether the answer went out.
    pub(super) async fn answer_grpc(
        mut self,
        request: http::Request<h2::RecvStream>,
        mut respond: h2::server::SendResponse<Bytes>,
    ) -> bool {
        let path = request.uri().path().to_owned();
        let mut body_in = request.into_body();
        let mut body = Vec::new();
        while let Some(Ok(chunk)) = body_in.data().await {
            let _ = body_in.flow_control().release_capacity(chunk.len());
            if body.len() + chunk.len() > MOST_BYTES + 5 {
                let only = head(&self.responses.name, Some((8, "a message over 16 MiB")));
                return respond.send_response(only, true).is_ok();
            }
            body.extend_from_slice(&chunk);
        }
        let name = self.responses.name.clone();
        let refuse = |respond: &mut h2::server::SendResponse<Bytes>, code, words: &str| {
            respond
                .send_response(head(&name, Some((code, words))), true)
                .is_ok()
        };
        let read = unframe(&body).and_then(|m| fields(m).map_err(|why| (3, why)));
        let fields = match (path.as_str(), read) {
            (UNARY | STREAM, Ok(fields)) => fields,
            (UNARY | STREAM, Err((code, why))) => return refuse(&mut respond, code, why),
            _ => return refuse(&mut respond, 12, "the echo service has Unary and Stream"),
        };
        self.wait_before_answering().await;
        if self.error_rate > 0.0 && self.uniform() < self.error_rate {
            return refuse(&mut respond, 13, "injected by --error-rate");
        }
        if path == UNARY {
            let payload = fields.iter().rev().find_map(|(n, f)| match f {
                Field::Bytes(b) if *n == 3 => Some(*b),
                _ => None,
            });
            let answer = message(
                number(&fields, 1),
                number(&fields, 2),
                payload.unwrap_or_default(),
            );
            let Ok(mut out) = respond.send_response(head(&self.responses.name, None), false) else {
                return false;
            };
            self.responses.grpc_calls.fetch_add(1, Ordering::Relaxed);
            return out.send_data(answer, false).is_ok()
                && out.send_trailers(trailers(0, "")).is_ok();
        }
        let schedule = Schedule {
            from: number(&fields, 1),
            count: number(&fields, 2),
            every: Duration::from_nanos(number(&fields, 3)),
            epoch_ns: u128::from(number(&fields, 4)),
            bytes: usize::try_from(number(&fields, 5)).unwrap_or(usize::MAX),
        };
        let schedule = match schedule.check("") {
            Ok(schedule) => schedule,
            Err(why) => return refuse(&mut respond, 3, &why),
        };
        let Ok(mut out) = respond.send_response(head(&self.responses.name, None), false) else {
            return false;
        };
        self.responses.grpc_streams.fetch_add(1, Ordering::Relaxed);
        let behaviour = self.websocket;
        let mut drain = self.drain.clone();
        let draining = async move {
            let _ = drain.wait_for(|d| *d).await;
        };
        tokio::pin!(draining);
        let timer = WallTimer::new();
        let payload = vec![b'.'; schedule.bytes.saturating_sub(24)];
        let mut sent = 0;
        let mut end = (0, "");
        for id in schedule.from..schedule.count {
            let due_ns = schedule.due_ns(id);
            tokio::select! {
                biased;
                () = &mut draining, if behaviour.close_on_drain => {
                    end = (14, "backend draining");
                    break;
                }
                () = timer.sleep_until(due_ns) => {}
            }
            let nth = |every: Option<u64>| every.is_some_and(|n| (id + 1) % n == 0);
            if nth(behaviour.drop_every) {
                continue;
            }
            let framed = message(id, u64::try_from(due_ns).unwrap_or(u64::MAX), &payload);
            for _ in 0..1 + u8::from(nth(behaviour.duplicate_every)) {
                if out.send_data(framed.clone(), false).is_err() {
                    self.responses
                        .grpc_messages
                        .fetch_add(sent, Ordering::Relaxed);
                    return true;
                }
                sent += 1;
            }
        }
        self.responses
            .grpc_messages
            .fetch_add(sent, Ordering::Relaxed);
        out.send_trailers(trailers(end.0, end.1)).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_written_here_reads_back_field_by_field() {
        let framed = message(300, 1 << 40, b"abc");
        assert_eq!(framed[0], 0);
        let inner = unframe(&framed).unwrap();
        let read = fields(inner).unwrap();
        assert_eq!(number(&read, 1), 300);
        assert_eq!(number(&read, 2), 1 << 40);
        assert_eq!(read[2], (3, Field::Bytes(b"abc")));
        // Protobuf's rules: the last value wins, unknown fixed-width fields are skipped.
        let mut later = inner.to_vec();
        later.extend_from_slice(&[0x08, 0x05, 0x21, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(number(&fields(&later).unwrap(), 1), 5);
    }

    #[test]
    fn broken_frames_and_messages_are_refused_with_a_status() {
        assert_eq!(unframe(b"").unwrap_err().0, 3);
        assert_eq!(unframe(&[1, 0, 0, 0, 0]).unwrap_err().0, 12);
        assert_eq!(unframe(&[0, 0, 0, 0, 5, 1]).unwrap_err().0, 3);
        assert_eq!(unframe(&[0, 0, 0, 0, 1, 8, 9]).unwrap_err().0, 3);
        assert!(fields(&[0x08]).is_err());
        assert!(fields(&[0x1a, 0x05, 1]).is_err());
        assert!(fields(&[0x0b]).is_err());
        assert!(fields(&[0xff; 12]).is_err());
    }
}
