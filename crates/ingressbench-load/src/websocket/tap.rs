//! The server's bytes of a WebSocket, read as they pass for the one thing tungstenite does
//! not hand on: the code of a close frame it finds invalid. Given a code no endpoint may
//! send (999, 1005, 2999, …), tungstenite answers 1002 and gives the caller 1002 "Protocol
//! violation" as if the server had said it; the run reports what the server sent.
//!
//! The tap follows the frames' boundaries (RFC 6455 §5.2) after the upgrade's answer,
//! keeping nothing but the first close frame's code: it never changes what is read.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::connection::Stream;

/// A connection whose reads pass through [`Frames`].
pub(crate) struct Tapped {
    inner: Stream,
    frames: Frames,
}

impl Tapped {
    pub(crate) fn new(inner: Stream) -> Self {
        Self {
            inner,
            frames: Frames::default(),
        }
    }

    /// The code of the first close frame the server sent, as it sent it.
    pub(crate) fn close_code(&self) -> Option<u16> {
        self.frames.close_code
    }
}

/// Where the reader is in the server's bytes.
#[derive(Debug)]
enum At {
    /// In the upgrade's answer: how much of its `\r\n\r\n` end has been seen.
    Answer(usize),
    /// In a frame's header, with the bytes of it so far (at most 14: two, eight of
    /// length, four of mask).
    Header([u8; 14], usize),
    /// In a frame's payload: bytes left, and a close frame's payload so far (its code is
    /// its first two bytes) with its mask.
    Payload {
        left: u64,
        close: Option<(Vec<u8>, Option<[u8; 4]>)>,
    },
}

#[derive(Debug)]
struct Frames {
    at: At,
    close_code: Option<u16>,
}

impl Default for Frames {
    fn default() -> Self {
        Self {
            at: At::Answer(0),
            close_code: None,
        }
    }
}

impl Frames {
    /// Follows `bytes`, the next the server sent.
    fn read(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.at {
                At::Answer(seen) => {
                    let b = bytes[0];
                    bytes = &bytes[1..];
                    *seen = match (*seen, b) {
                        (0 | 2, b'\r') => *seen + 1,
                        (1 | 3, b'\n') => *seen + 1,
                        (_, b'\r') => 1,
                        _ => 0,
                    };
                    if *seen == 4 {
                        self.at = At::Header([0; 14], 0);
                    }
                }
                At::Header(header, len) => {
                    header[*len] = bytes[0];
                    *len += 1;
                    bytes = &bytes[1..];
                    if let Some((length, opcode, mask)) = parsed(&header[..*len]) {
                        let close = (opcode == 8 && self.close_code.is_none())
                            .then(|| (Vec::with_capacity(2), mask));
                        self.at = At::Payload {
                            left: length,
                            close,
                        };
                        if length == 0 {
                            self.at = At::Header([0; 14], 0);
                        }
                    }
                }
                At::Payload { left, close } => {
                    let n = (*left).min(bytes.len() as u64) as usize;
                    if let Some((code, mask)) = close {
                        for &b in bytes[..n].iter().take(2 - code.len()) {
                            let key = mask.map_or(0, |m| m[code.len()]);
                            code.push(b ^ key);
                        }
                        if code.len() == 2 {
                            self.close_code = Some(u16::from_be_bytes([code[0], code[1]]));
                            *close = None;
                        }
                    }
                    bytes = &bytes[n..];
                    *left -= n as u64;
                    if *left == 0 {
                        self.at = At::Header([0; 14], 0);
                    }
                }
            }
        }
    }
}

/// A whole frame header's payload length, opcode and mask; `None` until it is whole.
fn parsed(header: &[u8]) -> Option<(u64, u8, Option<[u8; 4]>)> {
    let [first, second, rest @ ..] = header else {
        return None;
    };
    let (length, rest) = match second & 0x7f {
        126 => (
            u64::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?)),
            &rest[2..],
        ),
        127 => (
            u64::from_be_bytes(rest.get(..8)?.try_into().ok()?),
            &rest[8..],
        ),
        n => (u64::from(n), rest),
    };
    let mask = if second & 0x80 != 0 {
        Some(rest.get(..4)?.try_into().ok()?)
    } else {
        None
    };
    Some((length, first & 0x0f, mask))
}

impl AsyncRead for Tapped {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            this.frames.read(&buf.filled()[before..]);
        }
        read
    }
}

impl AsyncWrite for Tapped {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut out = vec![0x80 | opcode];
        let m = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n @ 0..=125 => out.push(m | n as u8),
            n @ 126..=65535 => {
                out.push(m | 126);
                out.extend((n as u16).to_be_bytes());
            }
            n => {
                out.push(m | 127);
                out.extend((n as u64).to_be_bytes());
            }
        }
        if let Some(key) = mask {
            out.extend(key);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        } else {
            out.extend(payload);
        }
        out
    }

    #[test]
    fn the_first_close_code_is_found_across_any_split_of_the_bytes() {
        let mut bytes = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n".to_vec();
        // A close code's bytes inside a binary message's payload must not count.
        bytes.extend(frame(2, &[0x03, 0xe7, 8, 9], None));
        bytes.extend(frame(2, &vec![7; 300], None));
        bytes.extend(frame(2, &vec![1; 70_000], None));
        bytes.extend(frame(9, b"", None));
        bytes.extend(frame(8, &[0x03, 0xe7, b'b', b'y', b'e'], None));
        bytes.extend(frame(8, &[0x03, 0xe8], None));
        for chunk in [1, 2, 3, 7, 64, 4096, bytes.len()] {
            let mut frames = Frames::default();
            bytes.chunks(chunk).for_each(|c| frames.read(c));
            assert_eq!(frames.close_code, Some(999), "chunks of {chunk}");
        }
        let mut masked = b"HTTP/1.1 101 OK\r\n\r\n".to_vec();
        masked.extend(frame(8, &[0x0b, 0xb8], Some([1, 2, 3, 4])));
        let mut frames = Frames::default();
        frames.read(&masked);
        assert_eq!(frames.close_code, Some(3000));
        let mut none = Frames::default();
        none.read(b"HTTP/1.1 101 OK\r\n\r\n");
        none.read(&frame(2, &[0x03, 0xe7], None));
        assert_eq!(none.close_code, None);
    }
}
