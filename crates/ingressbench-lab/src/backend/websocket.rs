//! WebSocket (RFC 6455) on the echo backend (issue #34): a request that asks to upgrade
//! (`Upgrade: websocket` with a `Sec-WebSocket-Key`) is answered `101 Switching
//! Protocols`, naming the backend in `x-backend` as every answer does, and each text or
//! binary message on the connection is sent back as it came (the load's messages carry
//! their own sequence numbers). The framing is tungstenite's.
//!
//! When the backend drains (SIGTERM), each WebSocket is closed with 1001 (going away) as a
//! well-behaved server closes them, and the backend waits for the client's close as the
//! RFC asks; told not to ([`WebSocketBehaviour::close_on_drain`] false), it keeps echoing
//! until the drain timeout drops the connection, as a server that ignores its WebSockets
//! at shutdown does. For tests of the client's sequence checks it can leave every Nth
//! message unanswered or answer it twice.

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::PROTOCOL_HEADER;

/// What the backend does with the WebSocket messages it echoes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WebSocketBehaviour {
    /// Leave every Nth message unanswered (a lossy server).
    pub drop_every: Option<u64>,
    /// Answer every Nth message twice.
    pub duplicate_every: Option<u64>,
    /// On drain, close each WebSocket with 1001; false: keep echoing until the drain
    /// timeout drops the connection without a close.
    pub close_on_drain: bool,
}

impl Default for WebSocketBehaviour {
    fn default() -> Self {
        Self {
            drop_every: None,
            duplicate_every: None,
            close_on_drain: true,
        }
    }
}

/// The close a draining backend sends.
pub const DRAIN_CLOSE_REASON: &str = "backend draining";

/// The `101` answer to an upgrade whose `Sec-WebSocket-Key` is `key`.
pub(super) fn switching_protocols(key: &[u8], name: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\nx-backend: {name}\r\n{PROTOCOL_HEADER}: websocket\r\n\r\n",
        derive_accept_key(key)
    )
    .into_bytes()
}

/// Echoes the messages of the WebSocket on `stream` (the `101` already sent; `read` is
/// what was read past the upgrade request) until the client closes it or the connection
/// ends; returns how many messages were sent back.
pub(super) async fn echo<S>(
    stream: S,
    read: Vec<u8>,
    behaviour: WebSocketBehaviour,
    mut drain: watch::Receiver<bool>,
) -> u64
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut ws = WebSocketStream::from_partially_read(stream, read, Role::Server, None).await;
    let (mut received, mut sent) = (0u64, 0u64);
    let mut closing = false;
    let draining = async move {
        let _ = drain.wait_for(|d| *d).await.map(|_| ());
    };
    tokio::pin!(draining);
    loop {
        tokio::select! {
            message = ws.next() => {
                // The client's close is answered by tungstenite as it is read; the stream
                // then ends.
                let Some(Ok(message)) = message else { return sent };
                if !(message.is_text() || message.is_binary()) {
                    continue;
                }
                received += 1;
                if behaviour.drop_every.is_some_and(|n| received % n == 0) {
                    continue;
                }
                let twice = behaviour.duplicate_every.is_some_and(|n| received % n == 0);
                if twice {
                    if ws.feed(message.clone()).await.is_err() {
                        return sent;
                    }
                    sent += 1;
                }
                if ws.send(message).await.is_err() {
                    return sent;
                }
                sent += 1;
            }
            () = &mut draining, if !closing && behaviour.close_on_drain => {
                closing = true;
                let close = CloseFrame {
                    code: CloseCode::Away,
                    reason: DRAIN_CLOSE_REASON.into(),
                };
                if ws.send(Message::Close(Some(close))).await.is_err() {
                    return sent;
                }
            }
        }
    }
}
