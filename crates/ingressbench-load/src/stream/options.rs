//! How a long-lived load is asked for: each message's size and what a cut connection does
//! ([`StreamOptions`], part of a plan's kind), with the reconnect policies' bounds. A leaf
//! of the load engine: the plan names it, the stream loads read it.

use std::time::Duration;

/// How long `immediate` waits at most after its first failed attempt; each failure after
/// that doubles it, up to [`IMMEDIATE_RETRY_MAX`], with full jitter.
pub const IMMEDIATE_RETRY: Duration = Duration::from_millis(10);

/// The longest `immediate` waits between failed attempts.
pub const IMMEDIATE_RETRY_MAX: Duration = Duration::from_secs(1);

/// How long a connection must stay open for its reconnect policy to start again from its
/// first attempt (reconnecting-websocket's `minUptime`, shorter): one that opens and ends
/// at once is a failed attempt, and its waits grow.
pub const STABLE_UPTIME: Duration = Duration::from_secs(1);

/// The smallest message: a sequence number and a due time, eight bytes each.
pub const MESSAGE_HEADER: usize = 16;

/// What a cut WebSocket or event stream does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reconnect {
    /// Nothing: the connection stays down to the end of the run.
    Never,
    /// Opens a new one at once; after a failed attempt, backs off from
    /// [`IMMEDIATE_RETRY`] to [`IMMEDIATE_RETRY_MAX`] (at once again would be thousands of
    /// attempts a second at a proxy that is down).
    Immediate,
    /// Waits a random time between zero and `first` doubled for each failed attempt
    /// (at most `max`) before each attempt: exponential backoff with full jitter, as
    /// browsers' reconnecting libraries do.
    Backoff {
        /// The first attempt's ceiling.
        first: Duration,
        /// The largest ceiling.
        max: Duration,
    },
}

impl std::fmt::Display for Reconnect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Never => f.write_str("none"),
            Self::Immediate => f.write_str("immediate"),
            Self::Backoff { first, max } => write!(f, "backoff:{first:?}-{max:?}"),
        }
    }
}

impl Reconnect {
    /// `none`, `immediate`, `backoff` (100 ms doubling to 10 s) or `backoff:FIRST-MAX`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "none" | "never" => Ok(Self::Never),
            "immediate" => Ok(Self::Immediate),
            "backoff" => Ok(Self::Backoff {
                first: Duration::from_millis(100),
                max: Duration::from_secs(10),
            }),
            other => {
                let range = other.strip_prefix("backoff:").ok_or_else(|| {
                    format!(
                        "`{s}`: none, immediate, backoff or backoff:FIRST-MAX (backoff:100ms-10s)"
                    )
                })?;
                let (first, max) = range.split_once('-').ok_or_else(|| {
                    format!("`{s}`: write backoff:FIRST-MAX, e.g. backoff:100ms-10s")
                })?;
                let (first, max) = (
                    ingressbench_stats::parse_duration(first)?,
                    ingressbench_stats::parse_duration(max)?,
                );
                if first.is_zero() || max < first {
                    return Err(format!("`{s}`: FIRST above zero and MAX at least FIRST"));
                }
                Ok(Self::Backoff { first, max })
            }
        }
    }

    /// How long to wait before attempt `attempt` (0: the first after a cut); none: do
    /// not reconnect. `rng` is the connection's own generator.
    pub(crate) fn delay(&self, attempt: u32, rng: &mut u64) -> Option<Duration> {
        match *self {
            Self::Never => None,
            Self::Immediate if attempt == 0 => Some(Duration::ZERO),
            Self::Immediate => Some(jittered(
                IMMEDIATE_RETRY,
                IMMEDIATE_RETRY_MAX,
                attempt - 1,
                rng,
            )),
            Self::Backoff { first, max } => Some(jittered(first, max, attempt, rng)),
        }
    }
}

/// A random wait from zero to `first` doubled `doublings` times (at most `max`): full
/// jitter.
fn jittered(first: Duration, max: Duration, doublings: u32, rng: &mut u64) -> Duration {
    let ceiling = first
        .saturating_mul(1u32.checked_shl(doublings.min(31)).unwrap_or(u32::MAX))
        .min(max);
    ceiling.mul_f64(uniform(rng))
}

/// A long-lived load's own settings ([`crate::Kind::WebSocket`], [`crate::Kind::Sse`],
/// [`crate::Kind::Grpc`], [`crate::Kind::GrpcStream`]);
/// the rest is the plan's: its target, TLS, `--resolve`, connections, open-loop rate
/// (messages or events a second over all connections), duration, warm-up, start,
/// timeout, headers and sample rate.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamOptions {
    /// Each message's (or event's) size, at least [`MESSAGE_HEADER`].
    pub message_bytes: usize,
    /// What a cut connection does.
    pub reconnect: Reconnect,
}

impl Default for StreamOptions {
    fn default() -> Self {
        Self {
            message_bytes: 64,
            reconnect: Reconnect::Backoff {
                first: Duration::from_millis(100),
                max: Duration::from_secs(10),
            },
        }
    }
}

/// A uniform draw in [0, 1) from `state` (xorshift64*).
pub(crate) fn uniform(state: &mut u64) -> f64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
}
