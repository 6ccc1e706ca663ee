//! Server-sent events on the echo backend (issue #34): a request that accepts
//! `text/event-stream` is answered with a stream of numbered events, one chunk each, on the
//! schedule its query asks for (`sse_every_ns`, `sse_count`, `sse_bytes`, `sse_epoch_ns`:
//! event N is due at the wall-clock time `sse_epoch_ns + N × sse_every_ns`); without them,
//! one 64-byte event a second for a minute from now, so `curl -N` shows it. A request with
//! `Last-Event-ID: N` resumes at N + 1, sending at once what fell due meanwhile, as an
//! event log does. The response ends after the last event.
//!
//! When the backend drains (SIGTERM), each stream is ended (its last chunk sent) as a
//! well-behaved server does, and the client resumes elsewhere; told not to
//! ([`super::WebSocketBehaviour::close_on_drain`] false), it keeps sending until the drain
//! timeout drops the connection mid-response. The behaviour's `drop_every` and
//! `duplicate_every` skip and repeat events as they do WebSocket messages (for tests).

use std::os::fd::OwnedFd;
use std::time::{Duration, SystemTime};

use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::PROTOCOL_HEADER;

/// The most events one stream may be asked for.
const MOST_EVENTS: u64 = 100_000_000;
/// The shortest time between two events one stream may be asked for.
const SHORTEST_EVERY: Duration = Duration::from_micros(10);

/// What a request asks of its event stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Schedule {
    pub(super) every: Duration,
    /// One past the last event's id.
    pub(super) count: u64,
    pub(super) bytes: usize,
    pub(super) epoch_ns: u128,
    /// The first event to send.
    pub(super) from: u64,
}

impl Schedule {
    /// The schedule `query` (a request target's query string) asks for, resuming after
    /// `last_event_id`; why not, when it asks for what this backend will not send.
    pub(super) fn parse(query: &[u8], last_event_id: Option<u64>) -> Result<Self, String> {
        let now_ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let mut schedule = Self {
            every: Duration::from_secs(1),
            count: 60,
            bytes: 64,
            epoch_ns: now_ns,
            from: last_event_id.map_or(0, |id| id.saturating_add(1)),
        };
        for pair in query.split(|&b| b == b'&') {
            let text = String::from_utf8_lossy(pair);
            let Some((name, value)) = text.split_once('=') else {
                continue;
            };
            let number = || {
                value
                    .parse::<u128>()
                    .map_err(|_| format!("{name}: `{value}` is not a number"))
            };
            match name {
                "sse_every_ns" => {
                    schedule.every =
                        Duration::from_nanos(u64::try_from(number()?).unwrap_or(u64::MAX))
                }
                "sse_count" => schedule.count = u64::try_from(number()?).unwrap_or(u64::MAX),
                "sse_bytes" => schedule.bytes = usize::try_from(number()?).unwrap_or(usize::MAX),
                "sse_epoch_ns" => schedule.epoch_ns = number()?,
                _ => {}
            }
        }
        schedule.check("sse_")
    }

    /// The schedule, if this backend sends it (fields named with `prefix`, as asked).
    pub(super) fn check(self, prefix: &str) -> Result<Self, String> {
        if self.every < SHORTEST_EVERY || self.every > Duration::from_secs(3600) {
            return Err(format!("{prefix}every_ns: from 10 us to an hour"));
        }
        if self.count > MOST_EVENTS {
            return Err(format!("{prefix}count: at most {MOST_EVENTS}"));
        }
        if !(16..=16 << 20).contains(&self.bytes) {
            return Err(format!("{prefix}bytes: from 16 bytes to 16 MiB"));
        }
        Ok(self)
    }

    /// When event `id` is due, in nanoseconds of the wall clock.
    pub(super) fn due_ns(&self, id: u64) -> u128 {
        self.epoch_ns + self.every.as_nanos() * u128::from(id)
    }
}

/// Sleeps to a time of the wall clock to the microsecond (a timer of the kernel's, armed
/// for that time), not to tokio's next millisecond: an event a millisecond late would be
/// the backend's lateness in every figure. Tokio's timer when the kernel gives none.
pub(super) struct WallTimer(Option<AsyncFd<OwnedFd>>);

impl WallTimer {
    pub(super) fn new() -> Self {
        let fd = rustix::time::timerfd_create(
            TimerfdClockId::Realtime,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        );
        // `AsyncFd::new` is deprecated because a borrowed fd could be closed behind the
        // reactor's back; this one is an `OwnedFd` nobody else holds.
        #[allow(deprecated)]
        Self(fd.ok().and_then(|fd| AsyncFd::new(fd).ok()))
    }

    pub(super) async fn sleep_until(&self, due_ns: u128) {
        let now_ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        if due_ns <= now_ns {
            return;
        }
        let tokio_sleep = || {
            let wait = u64::try_from(due_ns - now_ns).unwrap_or(u64::MAX);
            tokio::time::sleep(Duration::from_nanos(wait))
        };
        let Some(fd) = &self.0 else {
            return tokio_sleep().await;
        };
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: Timespec {
                tv_sec: i64::try_from(due_ns / 1_000_000_000).unwrap_or(i64::MAX),
                tv_nsec: (due_ns % 1_000_000_000) as i64,
            },
        };
        if rustix::time::timerfd_settime(fd.get_ref(), TimerfdTimerFlags::ABSTIME, &spec).is_err() {
            return tokio_sleep().await;
        }
        loop {
            let Ok(mut guard) = fd.readable().await else {
                return tokio_sleep().await;
            };
            let mut expirations = [0u8; 8];
            match guard.try_io(|fd| {
                rustix::io::read(fd.get_ref(), &mut expirations).map_err(std::io::Error::from)
            }) {
                Ok(_) => {
                    guard.clear_ready();
                    return;
                }
                Err(_would_block) => continue,
            }
        }
    }
}

/// The head of an event stream's answer.
pub(super) fn head(name: &str) -> Vec<u8> {
    // X-Accel-Buffering: nginx passes each event on as it comes instead of buffering the
    // response (the header nginx documents for streaming answers).
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\nx-backend: {name}\r\n{PROTOCOL_HEADER}: HTTP/1.1\r\n\r\n"
    )
    .into_bytes()
}

/// Sends the events of `schedule` on `stream` (the head already sent), each as it falls
/// due, then the response's end; returns how many it sent.
pub(super) async fn send<S>(
    stream: &mut S,
    schedule: Schedule,
    behaviour: super::WebSocketBehaviour,
    mut drain: watch::Receiver<bool>,
) -> u64
where
    S: AsyncWrite + Unpin,
{
    let mut sent = 0;
    let mut event = Vec::with_capacity(schedule.bytes + 32);
    let draining = async move {
        let _ = drain.wait_for(|d| *d).await;
    };
    tokio::pin!(draining);
    let timer = WallTimer::new();
    for id in schedule.from..schedule.count {
        tokio::select! {
            biased;
            () = &mut draining, if behaviour.close_on_drain => break,
            () = timer.sleep_until(schedule.due_ns(id)) => {}
        }
        let nth = |every: Option<u64>| every.is_some_and(|n| (id + 1) % n == 0);
        if nth(behaviour.drop_every) {
            continue;
        }
        render(id, schedule.bytes, &mut event);
        for _ in 0..1 + u8::from(nth(behaviour.duplicate_every)) {
            if stream.write_all(&event).await.is_err() {
                return sent;
            }
            sent += 1;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let _ = stream.flush().await;
    sent
}

/// Event `id` as one chunk: `id: N`, a `data:` line filling it to `bytes`, a blank line.
fn render(id: u64, bytes: usize, out: &mut Vec<u8>) {
    let fields = format!("id: {id}\ndata: ");
    let fill = bytes.saturating_sub(fields.len() + 2);
    let size = fields.len() + fill + 2;
    out.clear();
    out.extend_from_slice(format!("{size:x}\r\n{fields}").as_bytes());
    out.resize(out.len() + fill, b'.');
    out.extend_from_slice(b"\n\n\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_read_from_the_query_and_bounded() {
        let s = Schedule::parse(
            b"x=1&sse_every_ns=2000000&sse_count=5&sse_bytes=100&sse_epoch_ns=7",
            Some(2),
        )
        .unwrap();
        assert_eq!(
            (s.every, s.count, s.bytes, s.epoch_ns, s.from),
            (Duration::from_millis(2), 5, 100, 7, 3)
        );
        assert!(Schedule::parse(b"sse_every_ns=10", None).is_err());
        assert!(Schedule::parse(b"sse_count=1000000000", None).is_err());
        assert!(Schedule::parse(b"sse_bytes=1", None).is_err());
        assert!(Schedule::parse(b"sse_count=many", None).is_err());
        let plain = Schedule::parse(b"", None).unwrap();
        assert_eq!((plain.count, plain.from), (60, 0));
    }

    #[test]
    fn an_event_is_one_chunk_of_the_size_asked() {
        let mut out = Vec::new();
        render(12, 64, &mut out);
        let text = String::from_utf8(out).unwrap();
        let (size, rest) = text.split_once("\r\n").unwrap();
        let body = rest.strip_suffix("\r\n").unwrap();
        assert_eq!(usize::from_str_radix(size, 16).unwrap(), body.len());
        assert_eq!(body.len(), 64);
        assert!(body.starts_with("id: 12\ndata: ..."), "{body}");
        assert!(body.ends_with(".\n\n"));
    }
}
