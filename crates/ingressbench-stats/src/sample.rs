//! One request as the load engine saw it.

use crate::Outcome;

/// Index of a backend in a recorder's table of backend names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BackendId(pub u16);

/// How many generation headers an answer's generations are read from (the proxies' and
/// the sidecar's, in the lab).
pub const GENERATION_SLOTS: usize = 2;

/// Durations of each phase of one request, in nanoseconds, as curl's `-w` splits them
/// (but as durations, not cumulative times). A request on a reused connection has zero
/// DNS, connect and TLS time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phases {
    /// Name resolution (0 for an IP address or a `--resolve` entry).
    pub dns_ns: u64,
    /// TCP connect.
    pub connect_ns: u64,
    /// TLS handshake.
    pub tls_ns: u64,
    /// From starting to write the request to the first byte of the response.
    pub ttfb_ns: u64,
    /// Reading the response, from its first byte to its last.
    pub transfer_ns: u64,
}

/// One request: when it was due, when it went out, how long each phase took and how it
/// ended. Times are nanosecond offsets from the start of the run (a monotonic clock).
///
/// For open-loop load `intended_at_ns <= released_at_ns <= sent_at_ns <= done_at_ns`:
/// the schedule wanted it at `intended_at_ns`, the generator's timer handed it out at
/// `released_at_ns`, a connection started on it at `sent_at_ns` (connecting first if it
/// had to). Closed-loop and sequential load have no schedule, so all three are equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Sequence number of the request in its worker's schedule.
    pub seq: u64,
    /// When the schedule wanted it sent.
    pub intended_at_ns: u64,
    /// When the generator's timer released it to the connections.
    pub released_at_ns: u64,
    /// When a connection started on it (DNS/connect included when it needed a new one).
    pub sent_at_ns: u64,
    /// When it ended: the last response byte, or the failure.
    pub done_at_ns: u64,
    /// Phase durations.
    pub phases: Phases,
    /// Response bytes received (head and body).
    pub bytes: u64,
    /// What became of it.
    pub outcome: Outcome,
    /// The backend that answered, from the backend header, if it was present.
    pub backend: Option<BackendId>,
    /// The configuration generation each hop stamped on the answer, one slot per
    /// generation header (0: the answer carried none).
    pub generations: [u32; GENERATION_SLOTS],
    /// Whether it went over a connection that had already carried a request (for a
    /// retried request: whether the connection that answered had).
    pub connection_reused: bool,
    /// Whether it was sent a second time on a new connection, and why: the first
    /// attempt failed this way on a reused connection before any byte of the answer.
    pub retried_after: Option<Outcome>,
    /// Whether it belongs to the warm-up and is excluded from results.
    pub warmup: bool,
    /// Whether the random sample chose it. A failed request is kept in the sampled
    /// stream whatever the sample rate (errors around events are counted exactly from
    /// them); this tells the random sample, from which figures of successes are
    /// estimated, apart.
    pub in_sample: bool,
}

impl Sample {
    /// A sample due at `intended_at_ns`, with every other time equal to it and no outcome
    /// yet (it starts as [`Outcome::NotSent`]).
    pub fn new(intended_at_ns: u64) -> Self {
        Self {
            seq: 0,
            intended_at_ns,
            released_at_ns: intended_at_ns,
            sent_at_ns: intended_at_ns,
            done_at_ns: intended_at_ns,
            phases: Phases::default(),
            bytes: 0,
            outcome: Outcome::NotSent,
            backend: None,
            generations: [0; GENERATION_SLOTS],
            connection_reused: false,
            retried_after: None,
            warmup: false,
            in_sample: false,
        }
    }

    /// Latency as the user experienced it: from the intended send time to the end (the
    /// answer, or for a failure the time to failure). With closed-loop load this equals
    /// the service time.
    #[inline]
    pub fn latency_ns(&self) -> u64 {
        self.done_at_ns.saturating_sub(self.intended_at_ns)
    }

    /// Service time: from the actual start to the end (not corrected for waiting).
    #[inline]
    pub fn service_time_ns(&self) -> u64 {
        self.done_at_ns.saturating_sub(self.sent_at_ns)
    }

    /// How late the generator's timer released the request.
    #[inline]
    pub fn scheduler_lag_ns(&self) -> u64 {
        self.released_at_ns.saturating_sub(self.intended_at_ns)
    }
}
