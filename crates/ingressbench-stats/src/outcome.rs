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
    /// HTTP/3: the server reset the request's stream with this HTTP/3 error code (RFC
    /// 9114 §8.1, by its place in `H3_CODES`; `request_rejected` means it was not
    /// processed, safe to send again).
    H3Reset(u8),
    /// HTTP/3: the server closed the QUIC connection with this HTTP/3 error code (an
    /// application close, RFC 9000 §19.19) before the answer ended.
    H3Close(u8),
    /// QUIC: the server closed the connection with this transport error code (RFC 9000
    /// §20.1, by its place in `QUIC_CODES`; `crypto_error` for every TLS alert).
    QuicClose(u8),
    /// QUIC: the connection's idle timeout passed with nothing from the server (it went
    /// away without a word, or its packets stopped arriving).
    QuicIdleTimeout,
    /// QUIC: the server answered with a stateless reset (RFC 9000 §10.3): it no longer
    /// knows the connection, as a restarted process does not.
    QuicStatelessReset,
    /// QUIC: the server speaks none of the client's QUIC versions (version negotiation,
    /// RFC 9000 §6).
    QuicVersionMismatch,
    /// QUIC: the request went out as 0-RTT data on a resumed connection and the server
    /// rejected that data (RFC 9001 §4.6.2: it no longer holds the session, as after a
    /// restart): never processed, so it goes again on a new connection.
    QuicZeroRttRejected,
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

/// HTTP/3's error codes (RFC 9114 §8.1, 0x100 to 0x110, in order), for `h3_reset:` and
/// `h3_close:`; the last stands for every other code.
const H3_CODES: [&str; 18] = [
    "no_error",
    "general_protocol_error",
    "internal_error",
    "stream_creation_error",
    "closed_critical_stream",
    "frame_unexpected",
    "frame_error",
    "excessive_load",
    "id_error",
    "settings_error",
    "missing_settings",
    "request_rejected",
    "request_cancelled",
    "request_incomplete",
    "message_error",
    "connect_error",
    "version_fallback",
    "other",
];

/// QUIC's transport error codes (RFC 9000 §20.1, 0x0 to 0x10, in order), for
/// `quic_close:`; then `crypto_error` (0x100 to 0x1ff, a TLS alert) and `other`.
const QUIC_CODES: [&str; 19] = [
    "no_error",
    "internal_error",
    "connection_refused",
    "flow_control_error",
    "stream_limit_error",
    "stream_state_error",
    "final_size_error",
    "frame_encoding_error",
    "transport_parameter_error",
    "connection_id_limit_error",
    "protocol_violation",
    "invalid_token",
    "application_error",
    "crypto_buffer_exceeded",
    "key_update_error",
    "aead_limit_reached",
    "no_viable_path",
    "crypto_error",
    "other",
];

/// HTTP/3's first error code: `H3_NO_ERROR`.
const H3_FIRST: u64 = 0x100;

/// Every failure kind, in the order used for counting and printing.
pub const FAILURE_KINDS: [Outcome; 91] = failure_kinds();

/// [`FAILURE_KINDS`]: the failures without a code, each coded family in its codes' order.
const fn failure_kinds() -> [Outcome; 91] {
    let mut kinds = [Outcome::Refused; 91];
    let plain = [
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
    ];
    let after = [
        Outcome::GoawayUnprocessed,
        Outcome::GoawayProcessedLost,
        Outcome::ProtocolError,
        Outcome::Unanswered,
        Outcome::WaitingAtEnd,
        Outcome::WriteTimeout,
        Outcome::QuicIdleTimeout,
        Outcome::QuicStatelessReset,
        Outcome::QuicVersionMismatch,
        Outcome::QuicZeroRttRejected,
    ];
    let mut at = 0;
    let mut i = 0;
    while i < plain.len() {
        kinds[at] = plain[i];
        (at, i) = (at + 1, i + 1);
    }
    i = 0;
    while i < H2_CODES.len() {
        kinds[at] = Outcome::RstStream(i as u8);
        (at, i) = (at + 1, i + 1);
    }
    i = 0;
    while i < after.len() {
        kinds[at] = after[i];
        (at, i) = (at + 1, i + 1);
    }
    i = 0;
    while i < H3_CODES.len() {
        kinds[at] = Outcome::H3Reset(i as u8);
        kinds[at + H3_CODES.len()] = Outcome::H3Close(i as u8);
        (at, i) = (at + 1, i + 1);
    }
    at += H3_CODES.len();
    i = 0;
    while i < QUIC_CODES.len() {
        kinds[at] = Outcome::QuicClose(i as u8);
        (at, i) = (at + 1, i + 1);
    }
    assert!(at == kinds.len());
    kinds
}

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
            Outcome::H3Reset(code) => Cow::Owned(format!("h3_reset:{}", coded(&H3_CODES, code))),
            Outcome::H3Close(code) => Cow::Owned(format!("h3_close:{}", coded(&H3_CODES, code))),
            Outcome::QuicClose(code) => {
                Cow::Owned(format!("quic_close:{}", coded(&QUIC_CODES, code)))
            }
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
        /// A coded family: its prefix, its codes' names, and its outcome for a code's place.
        type Family = (&'static str, &'static [&'static str], fn(u8) -> Outcome);
        let families: [Family; 3] = [
            ("h3_reset:", &H3_CODES, Outcome::H3Reset),
            ("h3_close:", &H3_CODES, Outcome::H3Close),
            ("quic_close:", &QUIC_CODES, Outcome::QuicClose),
        ];
        for (prefix, codes, outcome) in families {
            if let Some(code) = name.strip_prefix(prefix) {
                return codes
                    .iter()
                    .position(|c| *c == code)
                    .map(|i| outcome(i as u8));
            }
        }
        FAILURE_KINDS.into_iter().find(|k| k.failure_name() == name)
    }

    /// The outcome for a stream reset with HTTP/2 error `code`.
    pub fn rst_stream(code: u32) -> Outcome {
        Outcome::RstStream(code.min(H2_CODES.len() as u32 - 1) as u8)
    }

    /// The outcome for an HTTP/3 stream reset with error `code` (`H3_REQUEST_REJECTED`
    /// is 0x10b).
    pub fn h3_reset(code: u64) -> Outcome {
        Outcome::H3Reset(h3_slot(code))
    }

    /// The outcome for a QUIC connection closed by the server with HTTP/3 error `code`.
    pub fn h3_close(code: u64) -> Outcome {
        Outcome::H3Close(h3_slot(code))
    }

    /// The outcome for a QUIC connection closed by the server with transport error
    /// `code`.
    pub fn quic_close(code: u64) -> Outcome {
        let last = QUIC_CODES.len() as u64 - 1;
        Outcome::QuicClose(match code {
            0..=0x10 => code as u8,
            0x100..=0x1ff => (last - 1) as u8,
            _ => last as u8,
        })
    }

    /// Whether the server said it did not process the request, so that it may go again
    /// whatever its method: HTTP/2's GOAWAY above it or REFUSED_STREAM, HTTP/3's
    /// GOAWAY or `H3_REQUEST_REJECTED`, QUIC's rejected 0-RTT (RFC 9113 §8.7, RFC 9114
    /// §4.1.1, RFC 9001 §4.6.2).
    pub fn unprocessed(self) -> bool {
        matches!(
            self,
            Outcome::GoawayUnprocessed | Outcome::QuicZeroRttRejected
        ) || self == Outcome::rst_stream(7)
            || self == Outcome::h3_reset(0x10b)
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
            Outcome::H3Reset(_) => "h3_reset",
            Outcome::H3Close(_) => "h3_close",
            Outcome::QuicClose(_) => "quic_close",
            Outcome::QuicIdleTimeout => "quic_idle_timeout",
            Outcome::QuicStatelessReset => "quic_stateless_reset",
            Outcome::QuicVersionMismatch => "quic_version_mismatch",
            Outcome::QuicZeroRttRejected => "quic_0rtt_rejected",
        }
    }

    fn failure_index(self) -> Option<usize> {
        let clamped = match self {
            Outcome::RstStream(code) => Outcome::rst_stream(u32::from(code)),
            Outcome::H3Reset(code) => Outcome::H3Reset(code.min(H3_CODES.len() as u8 - 1)),
            Outcome::H3Close(code) => Outcome::H3Close(code.min(H3_CODES.len() as u8 - 1)),
            Outcome::QuicClose(code) => Outcome::QuicClose(code.min(QUIC_CODES.len() as u8 - 1)),
            other => other,
        };
        FAILURE_KINDS.iter().position(|k| *k == clamped)
    }
}

/// The place of HTTP/3 error `code` in `H3_CODES` (the last for any code not in it).
fn h3_slot(code: u64) -> u8 {
    let last = H3_CODES.len() as u64 - 1;
    code.checked_sub(H3_FIRST).map_or(last, |i| i.min(last)) as u8
}

/// The name of a code by its place in `codes` (the last for a place past them).
fn coded(codes: &[&'static str], code: u8) -> &'static str {
    codes[usize::from(code).min(codes.len() - 1)]
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
    fn quic_and_http3_codes_are_named_by_their_rfcs() {
        assert_eq!(Outcome::h3_reset(0x10b).name(), "h3_reset:request_rejected");
        assert_eq!(
            Outcome::h3_reset(0x10c).name(),
            "h3_reset:request_cancelled"
        );
        assert_eq!(Outcome::h3_close(0x100).name(), "h3_close:no_error");
        assert_eq!(Outcome::h3_close(0x21).name(), "h3_close:other");
        assert_eq!(Outcome::h3_reset(0x999).name(), "h3_reset:other");
        assert_eq!(
            Outcome::quic_close(0x2).name(),
            "quic_close:connection_refused"
        );
        assert_eq!(Outcome::quic_close(0x128).name(), "quic_close:crypto_error");
        assert_eq!(Outcome::quic_close(0x11).name(), "quic_close:other");
        assert!(Outcome::h3_reset(0x10b).unprocessed());
        assert!(Outcome::rst_stream(7).unprocessed() && Outcome::GoawayUnprocessed.unprocessed());
        assert!(!Outcome::h3_reset(0x10c).unprocessed());
        // Every kind once, and each counted in a slot of its own.
        let mut c = OutcomeCounts::default();
        for (i, kind) in FAILURE_KINDS.into_iter().enumerate() {
            assert!(!FAILURE_KINDS[..i].contains(&kind), "{kind:?} twice");
            c.add(kind);
            assert_eq!(c.get(kind), 1, "{kind:?}");
        }
        assert_eq!(c.errors(), FAILURE_KINDS.len() as u64);
        c.add(Outcome::H3Close(200));
        assert_eq!(c.get(Outcome::h3_close(0x999)), 2);
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
