//! `impact.json`: per event a cell's site applied, in order, what it did to the requests
//! in its window (from its request to the next event's, at most 15 s) and when it took
//! effect. Times are seconds from the start of measurement; the `_after_s` figures from
//! the event's request. Written by the scenario runner, read by the report.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One event's entry. Fields added after the first version default when an older file
/// lacks them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImpactEntry {
    /// What the event did, in words (`scale echo 3->4`, `kill echo-2`, `reload`).
    #[serde(default)]
    pub what: String,
    /// When it was requested.
    #[serde(default)]
    pub requested_s: f64,
    /// When the site had applied it (none: never, or not known).
    #[serde(default)]
    pub applied_s: Option<f64>,
    /// In a cluster: when the Service's EndpointSlices showed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints_s: Option<f64>,
    /// In a cluster: when the controller said it had it (an HTTPRoute's status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_s: Option<f64>,
    /// A controller's restart: when its rollout was complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_s: Option<f64>,
    /// When the traffic showed it (none: not observable from traffic).
    #[serde(default)]
    pub took_effect_s: Option<f64>,
    /// How `took_effect_s` was read.
    #[serde(default)]
    pub took_effect_basis: String,
    /// A route change or reload: the last answer carrying an older generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_old_answer_s: Option<f64>,
    /// A route change or reload: how long old and new answers interleaved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed_window_s: Option<f64>,
    /// A route change or reload: per hop (the proxies', a sidecar's), read from the
    /// generation every answer carries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generations: Vec<GenerationEffect>,
    /// The requests of its window and what became of them.
    #[serde(flatten)]
    pub requests: WindowFigures,
    /// The HTTP/2 GOAWAYs the client received in its window, if any.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub goaways: Option<Goaways>,
    /// Over HTTP/3: the QUIC connections opened and ended in its window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic: Option<QuicConnections>,
    /// With a long-lived load: the connections its action cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub websocket: Option<EventCuts>,
    /// CPU around it, per role (`proxy`, `front`, `sidecar`, `tool`), when measured.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cpu: BTreeMap<String, CpuAround>,
    /// The client's failures that ended between the proxies' readings around its window
    /// (what `proxy_counted` is set against).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_errors_between_readings: Option<u64>,
    /// What each proxy counted over its window, by proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_counted: Option<BTreeMap<String, ProxyCounted>>,
}

/// The requests sent in an event's window. Errors are exact (every failure is kept
/// whatever the sample rate); what needs successes comes from the random sample.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowFigures {
    /// Failed requests (none in results written before every failure was kept: those
    /// have `estimated_errors`).
    #[serde(default)]
    pub errors: Option<u64>,
    /// Results before every failure was kept: failures estimated from the sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_errors: Option<f64>,
    /// Failed requests by outcome (`503`, `refused`).
    #[serde(default)]
    pub errors_by_outcome: BTreeMap<String, u64>,
    /// The window's length.
    #[serde(default)]
    pub window_s: Option<f64>,
    /// Requests of the random sample in the window.
    #[serde(default)]
    pub sampled_requests: u64,
    /// The same, scaled by the sample rate.
    #[serde(default)]
    pub estimated_requests: f64,
    /// Failed requests of the random sample.
    #[serde(default)]
    pub sampled_errors: u64,
    /// The first failure's send, after the event.
    #[serde(default)]
    pub first_error_after_s: Option<f64>,
    /// The last failure's send, after the event.
    #[serde(default)]
    pub last_error_after_s: Option<f64>,
    /// The longest run of consecutive failures.
    #[serde(default)]
    pub longest_failure_run: Option<u64>,
    /// How that run was read: `schedule` (open-loop slots) or `sampled` (between sampled
    /// successes).
    #[serde(default)]
    pub longest_failure_run_basis: String,
    /// The slowest request of the window.
    #[serde(default)]
    pub max_latency_ms: Option<f64>,
    /// p99 of the sample in the 5 s before.
    #[serde(default)]
    pub p99_ms_5s_before: Option<f64>,
    /// p99 of the sample in the 5 s after.
    #[serde(default)]
    pub p99_ms_5s_after: Option<f64>,
    /// p99 of the sample from 5 to 15 s after.
    #[serde(default)]
    pub p99_ms_5_to_15s_after: Option<f64>,
}

/// When a route change or reload reached the answers of one hop.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationEffect {
    /// The header that carries the hop's generation.
    pub header: String,
    /// The generation the change made.
    pub generation: u32,
    /// The first answer carrying it or a later one.
    pub took_effect_s: Option<f64>,
    /// The last answer carrying an earlier one.
    pub last_old_answer_s: Option<f64>,
    /// How long both kinds of answer interleaved.
    pub mixed_window_s: Option<f64>,
    /// Answers with an earlier generation.
    pub answers_before: u64,
    /// Answers with it or a later one.
    pub answers_after: u64,
    /// Answers with it exactly (none while later ones were answered: superseded before
    /// the proxies served it); not in results written before it was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answers_with_it: Option<u64>,
}

impl GenerationEffect {
    /// Whether a later generation was answered and this one never: the change was
    /// superseded before the proxies served it (a controller that coalesces changes), so
    /// its `took_effect_s` is a later change's.
    pub fn superseded(&self) -> bool {
        self.answers_with_it == Some(0) && self.answers_after > 0
    }
}

/// The HTTP/2 GOAWAYs in an event's window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Goaways {
    /// GOAWAY frames received in the window.
    pub goaways: u64,
    /// On how many connections.
    pub goaway_connections: u64,
    /// The first one's time after the event.
    pub first_goaway_after_s: f64,
    /// The first one's last-stream-id and code.
    pub first_goaway: FirstGoaway,
    /// Streams in flight on their connections when they came.
    pub streams_in_flight_at_goaways: u64,
}

/// The QUIC connections opened and ended in an event's window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QuicConnections {
    /// Handshakes completed (new connections, the client's way back after an end).
    pub opened: u64,
    /// Connections ended, by what ended them (`quic_idle_timeout`, `quic_close:<code>`,
    /// `h3_close:<code>`, `quic_stateless_reset`); the client's own closes are not here.
    pub ended: BTreeMap<String, u64>,
    /// The first end's time after the event.
    pub first_end_after_s: Option<f64>,
    /// The handshakes' longest, in milliseconds.
    pub max_handshake_ms: Option<f64>,
    /// Of the openings, those that sent their first requests as 0-RTT data on a resumed
    /// session (`--zero-rtt`) and the server took (the way back without a round trip).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub zero_rtt_accepted: u64,
    /// Those whose 0-RTT data the server rejected (it no longer held the session, as a
    /// restarted process does not): their requests went again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub zero_rtt_rejected: u64,
    /// Whether the client kept every opening and end up to the window's end (it keeps
    /// 20,000 a run; past that, these figures are a part).
    pub complete: bool,
}

/// What the first GOAWAY said.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FirstGoaway {
    /// The stream id it named (HTTP/2: the last the server would process; HTTP/3: the
    /// first it would not).
    pub last_stream_id: u64,
    /// Its error code.
    pub code: u32,
}

/// The long-lived connections an event's action cut.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EventCuts {
    /// Closes in its window that no event's action explains.
    #[serde(default)]
    pub cut_by_no_event_in_window: u64,
    /// Connections it cut.
    pub cut: u64,
    /// By code and who closed (`1001 by server`).
    #[serde(default)]
    pub by_code: BTreeMap<String, u64>,
    /// Messages lost with them.
    #[serde(default)]
    pub messages_lost: u64,
    /// How many had one open again.
    #[serde(default)]
    pub reconnected: u64,
    /// Their time to reconnect: median.
    #[serde(default)]
    pub reconnect_p50_ms: Option<f64>,
    /// 99th percentile.
    #[serde(default)]
    pub reconnect_p99_ms: Option<f64>,
    /// The longest reconnect, in milliseconds.
    #[serde(default)]
    pub reconnect_max_ms: Option<f64>,
}

/// The CPU one role's processes spent around an event, from the once-a-second readings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuAround {
    /// Cores used over the readings before it.
    pub cores_before: Option<f64>,
    /// The most cores used in one interval before it.
    pub peak_cores_before: Option<f64>,
    /// The most cores used in one interval after it.
    pub peak_cores_after: Option<f64>,
    /// When that interval began, after the event.
    pub peak_after_at_s: Option<f64>,
    /// CPU spent in the readings after it.
    pub cpu_ms_after: f64,
    /// Of those, more than the rate before would have spent.
    pub extra_cpu_ms: Option<f64>,
    /// How long the readings after it span.
    pub after_s: f64,
}

/// What one proxy counted over an event's window, or why it was not read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ProxyCounted {
    /// It was not read at the window's start.
    NotRead {
        /// Why the figures could not be read.
        not_read: String,
    },
    /// Each count's increase over the readings around the window.
    Counted(Increases),
}

/// Each count's increase between two readings of a proxy (a count that fell started
/// again: what it holds then is what was counted since).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Increases {
    /// The gauge of backends up: at the first reading, the fewest, at the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints_up: Option<EndpointsUp>,
    /// The reading at or before the window's start.
    #[serde(default)]
    pub read_from_s: f64,
    /// The reading at or after its end.
    #[serde(default)]
    pub read_to_s: f64,
    /// Each other count's increase, by the tool's name (`upstream_connect_failures`).
    #[serde(flatten)]
    pub increases: BTreeMap<String, u64>,
}

/// The backends a proxy held up over a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointsUp {
    /// At its start.
    pub before: Option<u64>,
    /// The fewest endpoints up at once in the window.
    pub fewest: Option<u64>,
    /// At its end.
    pub after: Option<u64>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}
