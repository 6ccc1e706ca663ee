//! h3_quinn's connection with the server's control stream read on its way to h3, for
//! what h3 0.0.8 keeps to itself: the stream id in a GOAWAY (RFC 9114 §5.2). The server
//! will not process a request on a stream at or above it, so such a request may be sent
//! again; one below it may have been processed. Every other stream, and every byte, goes
//! to h3 unchanged; only the control stream's frame headers are read, and only a GOAWAY's
//! payload.

use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId};
use tokio::sync::mpsc::UnboundedSender;

/// HTTP/3's control stream type (RFC 9114 §6.2.1).
const CONTROL_STREAM: u64 = 0x00;

/// The GOAWAY frame's type (RFC 9114 §7.2.6).
const GOAWAY: u64 = 0x07;

/// A QUIC connection for h3 that tells `goaway` each GOAWAY's stream id as it comes.
pub(super) struct Watched {
    inner: h3_quinn::Connection,
    goaway: UnboundedSender<u64>,
}

impl Watched {
    pub(super) fn new(inner: h3_quinn::Connection, goaway: UnboundedSender<u64>) -> Self {
        Self { inner, goaway }
    }
}

impl<B: Buf> quic::Connection<B> for Watched {
    type RecvStream = Tee;
    type OpenStreams = h3_quinn::OpenStreams;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Tee, ConnectionErrorIncoming>> {
        let inner = ready!(quic::Connection::<B>::poll_accept_recv(&mut self.inner, cx))?;
        Poll::Ready(Ok(Tee {
            inner,
            read: Control::default(),
            goaway: self.goaway.clone(),
        }))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, ConnectionErrorIncoming>> {
        quic::Connection::<B>::poll_accept_bidi(&mut self.inner, cx)
    }

    fn opener(&self) -> h3_quinn::OpenStreams {
        quic::Connection::<B>::opener(&self.inner)
    }
}

impl<B: Buf> quic::OpenStreams<B> for Watched {
    type SendStream = h3_quinn::SendStream<B>;
    type BidiStream = h3_quinn::BidiStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_bidi(&mut self.inner, cx)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_send(&mut self.inner, cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        quic::OpenStreams::<B>::close(&mut self.inner, code, reason);
    }
}

/// A stream the server opened, read on its way to h3.
pub(super) struct Tee {
    inner: h3_quinn::RecvStream,
    read: Control,
    goaway: UnboundedSender<u64>,
}

impl quic::RecvStream for Tee {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let read = ready!(self.inner.poll_data(cx));
        if let Ok(Some(bytes)) = &read {
            for id in self.read.feed(bytes) {
                let _ = self.goaway.send(id);
            }
        }
        Poll::Ready(read)
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.inner.stop_sending(error_code);
    }

    fn recv_id(&self) -> StreamId {
        self.inner.recv_id()
    }
}

/// What has been read of a stream the server opened: its type, then (on the control
/// stream) frame after frame, skipping every payload but a GOAWAY's.
#[derive(Debug, Default)]
struct Control {
    /// Bytes not yet parsed (a frame header, or a GOAWAY's payload, split across reads).
    held: Vec<u8>,
    /// Whether the stream's type has been read, and it is the control stream.
    typed: bool,
    /// Not the control stream: nothing more is read.
    other: bool,
    /// Payload bytes of the current frame still to pass over.
    skip: u64,
}

impl Control {
    /// Reads `bytes`; the GOAWAY stream ids they completed.
    fn feed(&mut self, bytes: &[u8]) -> Vec<u64> {
        let mut ids = Vec::new();
        if self.other {
            return ids;
        }
        self.held.extend_from_slice(bytes);
        loop {
            if self.other {
                self.held = Vec::new();
                break;
            }
            if self.skip > 0 {
                let n = self.skip.min(self.held.len() as u64);
                self.held.drain(..n as usize);
                self.skip -= n;
                if self.skip > 0 {
                    break;
                }
                continue;
            }
            match self.parse() {
                None => break,
                Some(id) => ids.extend(id),
            }
        }
        ids
    }

    /// Takes one item off the front of what is held: the stream type, or a frame
    /// (`Some(Some(id))` for a whole GOAWAY, `Some(None)` for another frame's header, its
    /// payload then to skip); `None` when more bytes are needed.
    fn parse(&mut self) -> Option<Option<u64>> {
        if !self.typed {
            let (kind, n) = varint(&self.held)?;
            self.held.drain(..n);
            self.typed = true;
            self.other = kind != CONTROL_STREAM;
            return Some(None);
        }
        let (kind, a) = varint(&self.held)?;
        let (len, b) = varint(&self.held[a..])?;
        if kind == GOAWAY {
            let end = a + b + usize::try_from(len).ok()?;
            if self.held.len() < end {
                return None;
            }
            let id = varint(&self.held[a + b..end]).map(|(id, _)| id);
            self.held.drain(..end);
            return Some(id);
        }
        self.held.drain(..a + b);
        self.skip = len;
        Some(None)
    }
}

/// A QUIC variable-length integer at the front of `bytes` (RFC 9000 §16), and its length.
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let first = *bytes.first()?;
    let len = 1usize << (first >> 6);
    let raw = bytes.get(..len)?;
    let mut value = u64::from(first & 0x3f);
    for b in &raw[1..] {
        value = (value << 8) | u64::from(*b);
    }
    Some((value, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A QUIC varint's shortest encoding.
    fn enc(v: u64) -> Vec<u8> {
        match v {
            0..=63 => vec![v as u8],
            64..=16_383 => (0x4000 | v as u16).to_be_bytes().to_vec(),
            _ => (0x8000_0000 | v as u32).to_be_bytes().to_vec(),
        }
    }

    fn frame(kind: u64, payload: &[u8]) -> Vec<u8> {
        let mut f = enc(kind);
        f.extend(enc(payload.len() as u64));
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_goaway_on_the_control_stream_is_read_however_the_bytes_are_split() {
        // The stream type, a SETTINGS frame (skipped), a reserved frame of 300 bytes,
        // then two GOAWAYs (the second lower, as a server may send).
        let mut stream = enc(CONTROL_STREAM);
        stream.extend(frame(0x04, &[0x01, 0x40, 0x64, 0x06, 0x44, 0x00]));
        stream.extend(frame(0x21, &[0xab; 300]));
        stream.extend(frame(GOAWAY, &enc(4_000)));
        stream.extend(frame(GOAWAY, &enc(8)));
        for split in [1, 2, 3, 7, 64, 1000] {
            let mut control = Control::default();
            let ids: Vec<u64> = stream.chunks(split).flat_map(|c| control.feed(c)).collect();
            assert_eq!(ids, [4_000, 8], "in chunks of {split}");
            assert!(control.held.is_empty(), "{control:?}");
        }
    }

    #[test]
    fn another_streams_bytes_are_not_read() {
        // A QPACK encoder stream (type 2) whose bytes happen to look like a GOAWAY.
        let mut stream = enc(0x02);
        stream.extend(frame(GOAWAY, &enc(4)));
        let mut control = Control::default();
        assert!(control.feed(&stream).is_empty());
        assert!(control.other && control.held.is_empty());
    }

    #[test]
    fn varints_of_each_length_read_as_rfc_9000_gives_them() {
        // RFC 9000 §A.1's examples.
        assert_eq!(
            varint(&[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c]),
            Some((151_288_809_941_952_652, 8))
        );
        assert_eq!(varint(&[0x9d, 0x7f, 0x3e, 0x7d]), Some((494_878_333, 4)));
        assert_eq!(varint(&[0x7b, 0xbd]), Some((15_293, 2)));
        assert_eq!(varint(&[0x25]), Some((37, 1)));
        assert_eq!(varint(&[0x7b]), None, "cut short");
    }
}
