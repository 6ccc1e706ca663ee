//! A long-lived load's own file (`websocket.json`, `sse.json`, `grpc.json` or
//! `grpc-stream.json` in a cell, `load --stream-json`): the load engine fills a
//! [`StreamFile`] as it runs and writes it; the report reads the same type back. The
//! messages' latency and outcomes are in the cell's ordinary files (a message or an event
//! counted as a request).

use std::collections::BTreeMap;

use ingressbench_stats::HistogramUs;
use serde::{Deserialize, Serialize};

/// What a long-lived load carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    /// Messages over WebSockets, echoed.
    #[default]
    Websocket,
    /// Server-sent events (`text/event-stream`), numbered, resumed with `Last-Event-ID`.
    Sse,
    /// gRPC unary calls, echoed, many at once on each connection's HTTP/2.
    Grpc,
    /// gRPC server streams, one per connection, their messages numbered, resumed after
    /// the last one seen.
    GrpcStream,
}

/// Every kind's file, in the order a cell's are looked for.
pub const STREAM_FILES: [&str; 4] = [
    "websocket.json",
    "sse.json",
    "grpc.json",
    "grpc-stream.json",
];

impl StreamKind {
    /// The cell's file: `websocket.json`, `sse.json`, `grpc.json` or `grpc-stream.json`.
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Websocket => STREAM_FILES[0],
            Self::Sse => STREAM_FILES[1],
            Self::Grpc => STREAM_FILES[2],
            Self::GrpcStream => STREAM_FILES[3],
        }
    }

    /// What its connections and their items are called: (`WebSockets`, `messages`).
    pub fn nouns(self) -> (&'static str, &'static str) {
        match self {
            Self::Websocket => ("WebSockets", "messages"),
            Self::Sse => ("event streams", "events"),
            Self::Grpc => ("gRPC connections", "calls"),
            Self::GrpcStream => ("gRPC streams", "messages"),
        }
    }
}

/// Who ended a WebSocket or an event stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClosedBy {
    /// The server (or the proxy) sent a close frame, or ended the event stream's response.
    Server,
    /// The connection ended without one (a WebSocket's 1006), or broke mid-response.
    Abnormal,
}

impl ClosedBy {
    /// `server` or `abnormal`, as the file says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Server => "server",
            Self::Abnormal => "abnormal",
        }
    }
}

/// A WebSocket, event stream or gRPC connection or stream that ended before the run did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Close {
    /// Seconds from the run's start.
    pub at_s: f64,
    /// Which connection (0-based).
    pub connection: usize,
    /// Who ended it.
    pub by: ClosedBy,
    /// The close frame's code (1006 when there was none); none for an event stream or
    /// gRPC.
    pub code: Option<u16>,
    /// The status a gRPC stream ended with (`grpc:unavailable`), if it ended with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<String>,
    /// Its reason, or what ended the connection.
    pub reason: String,
    /// The backend that answered its upgrade or request (`x-backend`), if it said.
    pub backend: Option<String>,
    /// Messages sent on it that were never echoed; for an event stream, the events the
    /// stream that resumed it skipped.
    pub lost: u64,
    /// How long until its connection had a WebSocket open again, in milliseconds (none:
    /// not before the run ended, or its policy does not reconnect).
    pub reconnected_after_ms: Option<f64>,
}

/// The reconnect distribution (from a cut to the next open on its connection), in
/// microseconds; the percentiles are none when nothing reconnected.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconnects {
    /// Reconnects made.
    pub count: u64,
    /// Median.
    pub p50_us: Option<u64>,
    /// 90th percentile.
    pub p90_us: Option<u64>,
    /// 99th percentile.
    pub p99_us: Option<u64>,
    /// The longest reconnect, in microseconds.
    pub max_us: Option<u64>,
}

impl Reconnects {
    /// The figures of `times`.
    pub fn of(times: &HistogramUs) -> Self {
        let at = |p: f64| (!times.is_empty()).then(|| times.value_at_percentile(p));
        Self {
            count: times.count(),
            p50_us: at(50.0),
            p90_us: at(90.0),
            p99_us: at(99.0),
            max_us: (!times.is_empty()).then(|| times.max()),
        }
    }
}

/// What a long-lived load measured besides its messages' figures. A WebSocket's message
/// is answered with status 101 when echoed, `read_timeout` when not echoed within the
/// timeout, `eof` or `reset_after_write` when its WebSocket was closed or broken first,
/// `not_sent` when it fell due while none was open and was too old to send when one was.
/// An event is answered 200 when it came, `read_timeout` when it had not come a timeout
/// after it was due, `eof` when a resumed stream skipped it, `not_sent` when it fell due
/// after its connection gave up. Fields added after the first version default when a
/// file lacks them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamFile {
    /// WebSockets, server-sent events, gRPC calls or streams (files before event streams
    /// had none).
    #[serde(default)]
    pub kind: StreamKind,
    /// Messages sent (events: that fell due while the connection had not given up).
    pub sent: u64,
    /// Messages echoed (events: that came), once each, in time.
    pub echoed: u64,
    /// Not echoed within the timeout, or sent on a WebSocket that ended before their echo
    /// came.
    pub lost: u64,
    /// Of the lost, echoed after the timeout (the figures keep them as timed out, as an
    /// HTTP client that gave up would).
    pub late: u64,
    /// Echoes of a message already echoed.
    pub duplicated: u64,
    /// Of the lost, never answered while a later one on the same connection was: the
    /// server skipped them (outcome `unanswered`).
    #[serde(default)]
    pub unanswered: u64,
    /// Frames that were no message of ours: the wrong size, or a number and due time
    /// that no message sent carried (a server that answers something else). In no
    /// message's outcome; the report says how many.
    #[serde(default)]
    pub not_ours: u64,
    /// Echoes that came after the echo of a later message.
    pub reordered: u64,
    /// Due while no WebSocket was open, and older than the timeout when one was.
    pub unsent: u64,
    /// Sent and not yet echoed when the run ended and its drain was over (outcome
    /// `waiting_at_end`: a failure, in the summary's figures; in none of them in results
    /// written before that outcome).
    pub in_flight_at_end: u64,
    /// Of all these, due during the warm-up: in this file's counts, in none of the
    /// summary's (as the HTTP engine's warm-up requests).
    #[serde(default)]
    pub warmup: u64,
    /// WebSockets (event streams) opened.
    pub opened: u64,
    /// Upgrades (event stream requests) that failed, by why (`status 502`, `connect:
    /// refused`, …).
    #[serde(default)]
    pub upgrade_failures: BTreeMap<String, u64>,
    /// WebSockets (event streams) that ended before the run did.
    #[serde(default)]
    pub cut: u64,
    /// The first [`MAX_CLOSES_KEPT`] of them, in order.
    #[serde(default)]
    pub closes: Vec<Close>,
    /// From a cut to the next WebSocket open on that connection.
    pub reconnect: Reconnects,
    /// WebSockets (event streams) open, every 100 ms: (seconds from the start, open).
    #[serde(default)]
    pub open_over_time: Vec<(f64, u32)>,
    /// Seconds from the start to the end.
    pub duration_s: f64,
}

/// The most closes a file lists (the count `cut` has them all).
pub const MAX_CLOSES_KEPT: usize = 50_000;
