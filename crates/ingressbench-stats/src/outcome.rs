//! What became of one request: an HTTP status or the way it failed.

use std::borrow::Cow;
use std::collections::BTreeMap;

/// What became of one request. A failed request is an `Outcome`, never an error: it is
/// counted, timed and placed on the timeline like any other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// A complete HTTP response with this status (100-599).
    Status(u16),
    /// The TCP connection was refused (nothing listening).
    Refused,
    /// The TCP connect or TLS handshake did not finish within the timeout.
    ConnectTimeout,
    /// The host name could not be resolved (DNS), so no connection was tried.
    DnsError,
    /// The TCP connect failed for another reason (unreachable, address in use, …).
    ConnectError,
    /// The TLS handshake failed (bad certificate, protocol error, …).
    TlsError,
    /// The connection was reset or closed before the request was fully written.
    ResetBeforeWrite,
    /// The connection was reset after the request was written, before the response ended.
    ResetAfterWrite,
    /// The peer closed the connection cleanly before the response was complete.
    Eof,
    /// No complete response within the timeout after the request was sent.
    ReadTimeout,
    /// The response could not be parsed as HTTP/1.x.
    Malformed,
    /// The request was due but never sent: every connection was busy until the run ended
    /// (and one timeout after).
    NotSent,
    /// HTTP/2: the server reset the stream (`RST_STREAM`) with this error code (RFC 9113
    /// §7; codes past 0xd count as 0xe, `other`).
    RstStream(u8),
    /// HTTP/2: the server said GOAWAY with a last-stream-id below this stream's, so it
    /// never processed it (safe to send again, RFC 9113 §6.8).
    GoawayUnprocessed,
    /// HTTP/2: the server said GOAWAY with a last-stream-id that covers this stream, then
    /// the connection ended before its answer did.
    GoawayProcessedLost,
    /// HTTP/2: the connection broke the protocol (the client's HTTP/2 library closed it
    /// with a GOAWAY of its own), or the server ended it with an error code.
    ProtocolError,
    /// A gRPC call answered with this status (`grpc-status`, 0 OK to 16
    /// UNAUTHENTICATED; codes past 16 count as 2, UNKNOWN, as gRPC's clients read them).
    Grpc(u8),
    /// Sent, never answered, while a later unit on the same connection was: the server
    /// skipped it (an echo server that drops one message in ten).
    Unanswered,
    /// Sent, and still waiting for its answer when the run ended (its duration and the
    /// bounded drain after it, or a stop): a failure every figure and gate sees, so that a
    /// server that accepts and never answers is never a clean run.
    WaitingAtEnd,
    /// The peer stopped reading: the request or message could not be written within the
    /// timeout (or by the end of the run), and the connection was given up.
    WriteTimeout,
}

/// gRPC's status codes by number (the `grpc-status` trailer), as outcomes name them.
const GRPC_CODES: [&str; 17] = [
    "ok",
    "cancelled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
];

/// The names of HTTP/2's error codes (RFC 9113 §7), for `rst_stream:<code>`; the last
/// stands for every code past them.
const H2_CODES: [&str; 15] = [
    "no_error",
    "protocol_error",
    "internal_error",
    "flow_control_error",
    "settings_timeout",
    "stream_closed",
    "frame_size_error",
    "refused_stream",
    "cancel",
    "compression_error",
    "connect_error",
    "enhance_your_calm",
    "inadequate_security",
    "http_1_1_required",
    "other",
];

/// Every failure kind, in the order used for counting and printing.
pub const FAILURE_KINDS: [Outcome; 32] = [
    Outcome::Refused,
    Outcome::ConnectTimeout,
    Outcome::DnsError,
    Outcome::ConnectError,
    Outcome::TlsError,
    Outcome::ResetBeforeWrite,
    Outcome::ResetAfterWrite,
    Outcome::Eof,
    Outcome::ReadTimeout,
    Outcome::Malformed,
    Outcome::NotSent,
    Outcome::RstStream(0),
    Outcome::RstStream(1),
    Outcome::RstStream(2),
    Outcome::RstStream(3),
    Outcome::RstStream(4),
    Outcome::RstStream(5),
    Outcome::RstStream(6),
    Outcome::RstStream(7),
    Outcome::RstStream(8),
    Outcome::RstStream(9),
    Outcome::RstStream(10),
    Outcome::RstStream(11),
    Outcome::RstStream(12),
    Outcome::RstStream(13),
    Outcome::RstStream(14),
    Outcome::GoawayUnprocessed,
    Outcome::GoawayProcessedLost,
    Outcome::ProtocolError,
    Outcome::Unanswered,
    Outcome::WaitingAtEnd,
    Outcome::WriteTimeout,
];

const STATUS_MIN: u16 = 100;
const STATUS_SLOTS: usize = 500;

impl Outcome {
    /// Whether the request succeeded: a final response with a status below 400, or a
    /// gRPC call answered OK.
    #[inline]
    pub fn is_ok(self) -> bool {
        matches!(self, Outcome::Status(s) if s < 400) || self == Outcome::Grpc(0)
    }

    /// Whether an answer came (an HTTP status, or a gRPC call's status): its latency
    /// is an answer's, not a time to failure.
    #[inline]
    pub fn is_answer(self) -> bool {
        matches!(self, Outcome::Status(_) | Outcome::Grpc(_))
    }

    /// The outcome of a gRPC call answered with `grpc-status` `code`.
    pub fn grpc(code: u32) -> Outcome {
        Outcome::Grpc(if code < GRPC_CODES.len() as u32 {
            code as u8
        } else {
            2
        })
    }

    /// The name used in outputs: the status code as text, or a snake_case failure name.
    pub fn name(self) -> Cow<'static, str> {
        match self {
            Outcome::Status(code) => Cow::Owned(code.to_string()),
            Outcome::RstStream(code) => Cow::Owned(format!(
                "rst_stream:{}",
                H2_CODES[usize::from(code).min(H2_CODES.len() - 1)]
            )),
            Outcome::Grpc(code) => Cow::Owned(format!(
                "grpc:{}",
                GRPC_CODES[usize::from(code).min(GRPC_CODES.len() - 1)]
            )),
            other => Cow::Borrowed(other.failure_name()),
        }
    }

    /// The outcome named `name` (the inverse of [`Outcome::name`]).
    pub fn from_name(name: &str) -> Option<Outcome> {
        if let Ok(code) = name.parse::<u16>() {
            return (STATUS_MIN..STATUS_MIN + STATUS_SLOTS as u16)
                .contains(&code)
                .then_some(Outcome::Status(code));
        }
        if let Some(code) = name.strip_prefix("rst_stream:") {
            return H2_CODES
                .iter()
                .position(|c| *c == code)
                .map(|i| Outcome::RstStream(i as u8));
        }
        if let Some(code) = name.strip_prefix("grpc:") {
            return GRPC_CODES
                .iter()
                .position(|c| *c == code)
                .map(|i| Outcome::Grpc(i as u8));
        }
        FAILURE_KINDS.into_iter().find(|k| k.failure_name() == name)
    }

    /// The outcome for a stream reset with HTTP/2 error `code`.
    pub fn rst_stream(code: u32) -> Outcome {
        Outcome::RstStream(code.min(H2_CODES.len() as u32 - 1) as u8)
    }

    fn failure_name(self) -> &'static str {
        match self {
            Outcome::Status(_) => "status",
            Outcome::Refused => "refused",
            Outcome::ConnectTimeout => "connect_timeout",
            Outcome::DnsError => "dns_error",
            Outcome::ConnectError => "connect_error",
            Outcome::TlsError => "tls_error",
            Outcome::ResetBeforeWrite => "reset_before_write",
            Outcome::ResetAfterWrite => "reset_after_write",
            Outcome::Eof => "eof",
            Outcome::ReadTimeout => "read_timeout",
            Outcome::Malformed => "malformed",
            Outcome::NotSent => "not_sent",
            Outcome::RstStream(_) => "rst_stream",
            Outcome::GoawayUnprocessed => "goaway_unprocessed",
            Outcome::GoawayProcessedLost => "goaway_processed_lost",
            Outcome::ProtocolError => "protocol_error",
            Outcome::Grpc(_) => "grpc",
            Outcome::Unanswered => "unanswered",
            Outcome::WaitingAtEnd => "waiting_at_end",
            Outcome::WriteTimeout => "write_timeout",
        }
    }

    fn failure_index(self) -> Option<usize> {
        match self {
            Outcome::RstStream(code) => FAILURE_KINDS
                .iter()
                .position(|k| *k == Outcome::rst_stream(u32::from(code))),
            other => FAILURE_KINDS.iter().position(|k| *k == other),
        }
    }
}

/// Counts of outcomes without allocation: one slot per status code and failure kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutcomeCounts {
    status: Box<[u64; STATUS_SLOTS]>,
    failures: [u64; FAILURE_KINDS.len()],
    grpc: [u64; GRPC_CODES.len()],
    ok: u64,
    total: u64,
}

impl Default for OutcomeCounts {
    fn default() -> Self {
        Self {
            status: Box::new([0; STATUS_SLOTS]),
            failures: [0; FAILURE_KINDS.len()],
            grpc: [0; GRPC_CODES.len()],
            ok: 0,
            total: 0,
        }
    }
}

impl OutcomeCounts {
    /// Counts one outcome.
    #[inline]
    pub fn add(&mut self, outcome: Outcome) {
        self.add_n(outcome, 1);
    }

    /// Counts `n` of one outcome.
    pub fn add_n(&mut self, outcome: Outcome, n: u64) {
        match outcome {
            Outcome::Status(code) => {
                let slot = usize::from(code.saturating_sub(STATUS_MIN)).min(STATUS_SLOTS - 1);
                self.status[slot] += n;
            }
            Outcome::Grpc(code) => {
                self.grpc[usize::from(code).min(GRPC_CODES.len() - 1)] += n;
            }
            other => {
                if let Some(i) = other.failure_index() {
                    self.failures[i] += n;
                }
            }
        }
        if outcome.is_ok() {
            self.ok += n;
        }
        self.total += n;
    }

    /// All outcomes counted.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Successful outcomes (status below 400).
    pub fn ok(&self) -> u64 {
        self.ok
    }

    /// Everything that was not a success.
    pub fn errors(&self) -> u64 {
        self.total - self.ok
    }

    /// The count of one outcome.
    pub fn get(&self, outcome: Outcome) -> u64 {
        match outcome {
            Outcome::Status(code)
                if (STATUS_MIN..STATUS_MIN + STATUS_SLOTS as u16).contains(&code) =>
            {
                self.status[usize::from(code - STATUS_MIN)]
            }
            Outcome::Status(_) => 0,
            Outcome::Grpc(code) => self.grpc.get(usize::from(code)).copied().unwrap_or(0),
            other => other.failure_index().map_or(0, |i| self.failures[i]),
        }
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &OutcomeCounts) {
        for (a, b) in self.status.iter_mut().zip(other.status.iter()) {
            *a += b;
        }
        for (a, b) in self.failures.iter_mut().zip(other.failures.iter()) {
            *a += b;
        }
        for (a, b) in self.grpc.iter_mut().zip(other.grpc.iter()) {
            *a += b;
        }
        self.ok += other.ok;
        self.total += other.total;
    }

    /// Every outcome seen at least once, with its count: statuses, then gRPC's, then
    /// failures.
    pub fn iter(&self) -> impl Iterator<Item = (Outcome, u64)> + '_ {
        let statuses = self
            .status
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (Outcome::Status(STATUS_MIN + i as u16), *n));
        let grpc = self
            .grpc
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (Outcome::Grpc(i as u8), *n));
        let failures = FAILURE_KINDS
            .iter()
            .zip(self.failures.iter())
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| (*k, *n));
        statuses.chain(grpc).chain(failures)
    }

    /// The counts as a map from outcome name to count, for JSON.
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        self.iter()
            .map(|(o, n)| (o.name().into_owned(), n))
            .collect()
    }

    /// The most frequent failure (not a success), if any request failed. Requests never
    /// sent (`not_sent`) are a consequence, not a cause: the dominant failure only when
    /// there is no other.
    pub fn dominant_failure(&self) -> Option<(Outcome, u64)> {
        let failures = || self.iter().filter(|(o, _)| !o.is_ok());
        failures()
            .filter(|(o, _)| *o != Outcome::NotSent)
            .max_by_key(|(_, n)| *n)
            .or_else(|| failures().max_by_key(|(_, n)| *n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for o in FAILURE_KINDS
            .into_iter()
            .chain([Outcome::Status(200), Outcome::Status(502)])
        {
            assert_eq!(Outcome::from_name(&o.name()), Some(o), "{o:?}");
        }
        assert_eq!(Outcome::from_name("nope"), None);
        assert_eq!(Outcome::from_name("99"), None);
        assert_eq!(Outcome::rst_stream(7).name(), "rst_stream:refused_stream");
        assert_eq!(Outcome::rst_stream(0x99).name(), "rst_stream:other");
        assert_eq!(Outcome::from_name("rst_stream:nope"), None);
        for code in 0..17 {
            let o = Outcome::grpc(code);
            assert_eq!(Outcome::from_name(&o.name()), Some(o), "{o:?}");
        }
        assert_eq!(Outcome::grpc(14).name(), "grpc:unavailable");
        assert_eq!(Outcome::grpc(99), Outcome::grpc(2));
        assert!(Outcome::grpc(0).is_ok() && !Outcome::grpc(14).is_ok());
        let mut c = OutcomeCounts::default();
        c.add(Outcome::rst_stream(8));
        assert_eq!(c.to_map()["rst_stream:cancel"], 1);
    }

    #[test]
    fn counts_split_ok_and_errors() {
        let mut c = OutcomeCounts::default();
        c.add(Outcome::Status(200));
        c.add(Outcome::Status(304));
        c.add(Outcome::Status(502));
        c.add(Outcome::Refused);
        c.add_n(Outcome::ReadTimeout, 3);
        c.add(Outcome::grpc(0));
        c.add(Outcome::grpc(14));
        assert_eq!(c.total(), 9);
        assert_eq!(c.ok(), 3);
        assert_eq!(c.errors(), 6);
        assert_eq!(c.get(Outcome::grpc(14)), 1);
        assert_eq!(c.get(Outcome::ReadTimeout), 3);
        assert_eq!(c.dominant_failure(), Some((Outcome::ReadTimeout, 3)));
        // Never sent because every connection was held by what is: the cause leads.
        let mut held = c.clone();
        held.add_n(Outcome::NotSent, 30);
        assert_eq!(held.dominant_failure(), Some((Outcome::ReadTimeout, 3)));
        let mut only = OutcomeCounts::default();
        only.add_n(Outcome::NotSent, 2);
        assert_eq!(only.dominant_failure(), Some((Outcome::NotSent, 2)));
        let map = c.to_map();
        assert_eq!(map["502"], 1);
        assert_eq!(map["refused"], 1);
        assert_eq!(map["grpc:ok"], 1);
        let mut d = OutcomeCounts::default();
        d.merge(&c);
        d.merge(&c);
        assert_eq!(d.get(Outcome::Status(502)), 2);
        assert_eq!(d.total(), 18);
        assert_eq!(d.get(Outcome::grpc(14)), 2);
    }
}
