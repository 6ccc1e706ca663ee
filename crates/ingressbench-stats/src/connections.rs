//! What the client saw of its connections besides requests: idle connections the server
//! closed, HTTP/2's GOAWAYs, HTTP/3's QUIC connections opened and ended.

use serde::{Deserialize, Serialize};

/// What happened to connections outside any request: the server closed one while it sat
/// idle in the pool, or sent bytes nobody asked for. Such a connection is retired before
/// it is handed a request, as a browser, curl or Go's net/http would, so these are not
/// request outcomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionEvents {
    /// Idle connections the server closed (FIN, or RST) before they carried another
    /// request.
    pub closed_by_server_while_idle: u64,
    /// Idle connections on which bytes arrived that no request asked for.
    pub unexpected_bytes_while_idle: u64,
    /// HTTP/2: connections that spoke it (ALPN `h2`, or `h2c` with prior knowledge).
    #[serde(default)]
    pub http2_connections: u64,
    /// HTTP/2: GOAWAY frames received (each is in [`Recorder::goaways`] too, up to a
    /// limit).
    #[serde(default)]
    pub goaways_received: u64,
    /// HTTP/2: the most streams one connection carried at once.
    #[serde(default)]
    pub max_streams_in_flight: u64,
    /// HTTP/2: the fewest concurrent streams a server allowed on one connection (its
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`; 0 when none was announced).
    #[serde(default)]
    pub server_stream_limit: u64,
    /// HTTP/2: request bodies that had to wait for the server's flow-control window.
    #[serde(default)]
    pub flow_control_stalls: u64,
    /// HTTP/2: how long they waited, in total.
    #[serde(default)]
    pub flow_control_stall_ns: u64,
    /// HTTP/3: QUIC connections whose handshake completed.
    #[serde(default)]
    pub quic_opened: u64,
    /// HTTP/3: QUIC connections that ended other than by the client's own close (each is
    /// in [`Recorder::quic_events`] too, up to a limit).
    #[serde(default)]
    pub quic_ended: u64,
}

impl ConnectionEvents {
    pub(crate) fn merge(&mut self, other: &ConnectionEvents) {
        self.closed_by_server_while_idle += other.closed_by_server_while_idle;
        self.unexpected_bytes_while_idle += other.unexpected_bytes_while_idle;
        self.http2_connections += other.http2_connections;
        self.goaways_received += other.goaways_received;
        self.max_streams_in_flight = self.max_streams_in_flight.max(other.max_streams_in_flight);
        self.server_stream_limit = match (self.server_stream_limit, other.server_stream_limit) {
            (0, b) => b,
            (a, 0) => a,
            (a, b) => a.min(b),
        };
        self.flow_control_stalls += other.flow_control_stalls;
        self.flow_control_stall_ns += other.flow_control_stall_ns;
        self.quic_opened += other.quic_opened;
        self.quic_ended += other.quic_ended;
    }
}

/// An HTTP/2 GOAWAY frame as the client received it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Goaway {
    /// When it arrived (from the start of the run).
    pub at_ns: u64,
    /// Which connection (unique within the run's process).
    pub connection: u64,
    /// HTTP/2: the last stream the server says it processed or may process. HTTP/3: the
    /// frame's stream id, the first request stream it will not process (RFC 9114 §5.2).
    pub last_stream_id: u64,
    /// Its error code (0: a graceful shutdown).
    pub code: u32,
    /// Streams in flight on the connection when it arrived.
    pub streams_in_flight: u32,
    /// Streams the connection had carried until then.
    pub streams_sent: u64,
}

/// GOAWAYs kept one by one; past this many only [`ConnectionEvents::goaways_received`]
/// counts them.
pub const MAX_GOAWAYS_KEPT: usize = 10_000;

/// A QUIC connection opened (its handshake done) or ended, as the client saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuicEvent {
    /// When (from the start of the run).
    pub at_ns: u64,
    /// Which connection (unique within the run's process).
    pub connection: u64,
    /// `opened`, or what ended it, named as a request it cut is (`quic_idle_timeout`,
    /// `quic_stateless_reset`, `quic_close:<code>`, `h3_close:<code>`).
    pub what: String,
    /// An opening's handshake, in microseconds.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub handshake_us: u64,
    /// An opening that sent its first requests as 0-RTT data on a resumed session
    /// (`--zero-rtt`): whether the server took that data; absent when it was a full
    /// handshake (no 0-RTT tried: not asked, or no ticket from the server yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_rtt: Option<bool>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// QUIC connections' openings and ends kept one by one; past this many only
/// [`ConnectionEvents::quic_opened`] and [`ConnectionEvents::quic_ended`] count them.
pub const MAX_QUIC_EVENTS_KEPT: usize = 20_000;

/// Why a connection left the pool while idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleEnd {
    /// The server closed it (EOF, a TLS close, or a reset).
    Closed,
    /// Bytes arrived that no request asked for.
    UnexpectedBytes,
}
