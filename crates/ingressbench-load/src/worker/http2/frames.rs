//! What the server sends outside any one answer, read off the bytes as they arrive: a
//! GOAWAY's time, last-stream-id and code, the server's SETTINGS_MAX_CONCURRENT_STREAMS
//! and whether its first SETTINGS came ([`FrameWatch`], fed by the connection's stream
//! wrapped in [`Watched`]), and the wake-up a connection's task waits on ([`Signal`]).

use std::cell::{Cell, RefCell};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::connection::Stream;

/// A wake-up for the one task that waits on it (a connection's task), without a lock:
/// everything here runs on one thread.
#[derive(Default)]
pub(in crate::worker) struct Signal {
    pub(in crate::worker) generation: Cell<u64>,
    pub(in crate::worker) waiter: RefCell<Option<std::task::Waker>>,
}

impl Signal {
    pub(in crate::worker) fn notify(&self) {
        self.generation.set(self.generation.get() + 1);
        let waiter = self.waiter.borrow_mut().take();
        if let Some(waker) = waiter {
            waker.wake();
        }
    }

    /// Where it stands now, for [`Signal::since`].
    pub(in crate::worker) fn mark(&self) -> u64 {
        self.generation.get()
    }

    /// Returns once it has been notified after `mark`.
    pub(in crate::worker) async fn since(&self, mark: u64) {
        std::future::poll_fn(|cx| {
            if self.generation.get() != mark {
                return Poll::Ready(());
            }
            *self.waiter.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
    }
}

/// A GOAWAY as read off the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct GoawayFrame {
    pub(super) last_stream_id: u32,
    pub(super) code: u32,
}

/// Reads HTTP/2 frame headers (and the few payload bytes it needs) as they go past.
#[derive(Default)]
pub(super) struct FrameScan {
    /// Bytes of the current frame header read so far.
    pub(super) header: [u8; 9],
    pub(super) header_len: usize,
    /// Payload bytes of the current frame still to come.
    pub(super) payload_left: usize,
    pub(super) kind: u8,
    /// The payload bytes kept (GOAWAY: 8; SETTINGS: one 6-byte entry at a time).
    pub(super) kept: [u8; 8],
    pub(super) kept_len: usize,
}

/// What one connection's frame scan found.
#[derive(Default)]
pub(super) struct FrameWatch {
    pub(super) scan: RefCell<FrameScan>,
    /// Every GOAWAY, in order, with when it arrived and the streams started and in
    /// flight then.
    pub(super) goaways: RefCell<Vec<(Instant, GoawayFrame, u64, u32)>>,
    /// Streams started on the connection, and in flight now.
    pub(super) sent: Cell<u64>,
    pub(super) in_flight: Cell<u32>,
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS, once a SETTINGS frame said it.
    pub(super) max_streams: Cell<Option<u32>>,
    /// Whether the server's first SETTINGS frame arrived.
    pub(super) settings_seen: Cell<bool>,
    /// The first bytes the server sent, to tell HTTP/1.1 answering an h2c preface.
    pub(super) first_bytes: RefCell<Vec<u8>>,
    /// Notified at the server's SETTINGS, at each GOAWAY, when the connection ends and
    /// when one of its streams ends: what its task waits on.
    pub(super) changed: Signal,
}

pub(super) const FRAME_SETTINGS: u8 = 0x4;
pub(super) const FRAME_GOAWAY: u8 = 0x7;
pub(super) const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;

impl FrameWatch {
    pub(super) fn feed(&self, mut data: &[u8]) {
        {
            let mut first = self.first_bytes.borrow_mut();
            if first.len() < 16 {
                let take = (16 - first.len()).min(data.len());
                first.extend_from_slice(&data[..take]);
            }
        }
        let mut scan = self.scan.borrow_mut();
        while !data.is_empty() {
            if scan.header_len < 9 {
                let take = (9 - scan.header_len).min(data.len());
                let at = scan.header_len;
                scan.header[at..at + take].copy_from_slice(&data[..take]);
                scan.header_len += take;
                data = &data[take..];
                if scan.header_len == 9 {
                    let h = scan.header;
                    scan.payload_left =
                        (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
                    scan.kind = h[3];
                    scan.kept_len = 0;
                    if scan.payload_left == 0 {
                        self.frame_done(&mut scan);
                    }
                }
                continue;
            }
            let take = scan.payload_left.min(data.len());
            // Only SETTINGS (each entry) and a GOAWAY's first 8 bytes are read; every
            // other payload (the answers' DATA above all) is skipped without a look.
            let (wanted, watched) = match scan.kind {
                FRAME_GOAWAY => (8, take.min(8usize.saturating_sub(scan.kept_len))),
                FRAME_SETTINGS => (6, take),
                _ => (0, 0),
            };
            for &b in &data[..watched] {
                if scan.kept_len < wanted {
                    let at = scan.kept_len;
                    scan.kept[at] = b;
                    scan.kept_len += 1;
                    if scan.kind == FRAME_SETTINGS && scan.kept_len == 6 {
                        let id = u16::from_be_bytes([scan.kept[0], scan.kept[1]]);
                        if id == SETTINGS_MAX_CONCURRENT_STREAMS {
                            let value = u32::from_be_bytes([
                                scan.kept[2],
                                scan.kept[3],
                                scan.kept[4],
                                scan.kept[5],
                            ]);
                            self.max_streams.set(Some(value));
                        }
                        scan.kept_len = 0;
                    }
                }
            }
            scan.payload_left -= take;
            data = &data[take..];
            if scan.payload_left == 0 {
                self.frame_done(&mut scan);
            }
        }
    }

    pub(super) fn frame_done(&self, scan: &mut FrameScan) {
        let ack = scan.header[4] & 0x1 != 0;
        match scan.kind {
            FRAME_SETTINGS if !ack => {
                self.settings_seen.set(true);
                self.changed.notify();
            }
            FRAME_GOAWAY if scan.kept_len == 8 => {
                let k = scan.kept;
                let frame = GoawayFrame {
                    last_stream_id: u32::from_be_bytes([k[0], k[1], k[2], k[3]]) & 0x7fff_ffff,
                    code: u32::from_be_bytes([k[4], k[5], k[6], k[7]]),
                };
                self.goaways.borrow_mut().push((
                    Instant::now(),
                    frame,
                    self.sent.get(),
                    self.in_flight.get(),
                ));
                self.changed.notify();
            }
            _ => {}
        }
        scan.header_len = 0;
        scan.kept_len = 0;
    }

    pub(super) fn last_goaway(&self) -> Option<GoawayFrame> {
        self.goaways.borrow().last().map(|(_, g, _, _)| *g)
    }
}

/// The connection's stream, with every byte read shown to its [`FrameWatch`].
pub(super) struct Watched {
    pub(super) inner: Stream,
    pub(super) watch: Rc<FrameWatch>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.watch.feed(&buf.filled()[before..]);
        }
        polled
    }
}

impl AsyncWrite for Watched {
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
