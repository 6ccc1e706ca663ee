//! WebSocket load (issue #34): connections upgraded through the target (RFC 6455, framed
//! by tungstenite over this engine's own TCP and TLS connections), each sending binary
//! messages on an open-loop schedule; the server echoes them.
//!
//! Every message carries its connection's sequence number and the time it was due, so an
//! echo is timed from when its message was due (no coordinated omission: a message that
//! waited for a reconnect carries the wait), and lost (sent and not echoed within the
//! plan's timeout, or on a WebSocket that ended first), late (echoed after it was counted
//! lost), duplicated (echoed twice) and reordered (echoed after a later one) messages are
//! counted. A close is data: who closed (the server with a close frame, or
//! the connection ending without one, 1006), its code and reason, when, and which backend
//! the WebSocket was on. A cut connection reconnects as its policy says ([`Reconnect`]),
//! and the time from the cut to the next open WebSocket is measured; messages due while no
//! WebSocket was open are sent once one is, unless they are older than the plan's timeout
//! by then (counted as unsent).
//!
//! One thread, one current-thread runtime: WebSocket loads are connections × messages a
//! second in the thousands, not the HTTP engine's hundreds of thousands.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use ingressbench_stats::{HistogramUs, Phases};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use crate::connection::{Address, Connector, Stream};
use crate::{Length, LoadError, Plan, Scheme};

/// The smallest message: a sequence number and a due time, eight bytes each.
pub const MESSAGE_HEADER: usize = 16;

/// What a cut WebSocket does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reconnect {
    /// Nothing: the connection stays down to the end of the run.
    Never,
    /// Opens a new WebSocket at once.
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
    fn delay(&self, attempt: u32, rng: &mut u64) -> Option<Duration> {
        match *self {
            Self::Never => None,
            Self::Immediate => Some(Duration::ZERO),
            Self::Backoff { first, max } => {
                let ceiling = first
                    .saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
                    .min(max);
                Some(ceiling.mul_f64(uniform(rng)))
            }
        }
    }
}

/// A WebSocket load: the HTTP plan's target, TLS, `--resolve`, connections, length,
/// start, timeout and headers, with messages instead of requests.
#[derive(Clone, Debug)]
pub struct WebSocketPlan {
    /// Where and how to connect (its mode and protocol are not used).
    pub load: Plan,
    /// Messages a second over all connections.
    pub messages_per_s: f64,
    /// Each message's size, at least [`MESSAGE_HEADER`].
    pub message_bytes: usize,
    /// What a cut WebSocket does.
    pub reconnect: Reconnect,
}

/// Who ended a WebSocket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClosedBy {
    /// The server (or the proxy) sent a close frame.
    Server,
    /// The connection ended without one (read as code 1006).
    Abnormal,
}

/// A WebSocket that ended before the run did.
#[derive(Clone, Debug, PartialEq)]
pub struct Close {
    /// Seconds from the run's start.
    pub at_s: f64,
    /// Which connection (0-based).
    pub connection: usize,
    /// Who ended it.
    pub by: ClosedBy,
    /// The close frame's code (1006 when there was none).
    pub code: u16,
    /// Its reason, or what ended the connection.
    pub reason: String,
    /// The backend that answered its upgrade (`x-backend`), if it said.
    pub backend: Option<String>,
    /// Messages sent on it that were never echoed.
    pub lost: u64,
}

/// What a WebSocket load measured.
#[derive(Clone, Debug, Default)]
pub struct WebSocketReport {
    /// Each echo, from when its message was due to when it came back.
    pub latency: HistogramUs,
    /// Messages sent.
    pub sent: u64,
    /// Messages echoed (once each).
    pub echoed: u64,
    /// Not echoed within the timeout, or sent on a WebSocket that ended before their echo
    /// came.
    pub lost: u64,
    /// Echoed after they were counted lost (not in `lost`).
    pub late: u64,
    /// Echoes of a message already echoed.
    pub duplicated: u64,
    /// Echoes that came after the echo of a later message.
    pub reordered: u64,
    /// Due while no WebSocket was open, and older than the timeout when one was.
    pub unsent: u64,
    /// Sent and not yet echoed when the run ended.
    pub in_flight_at_end: u64,
    /// WebSockets opened.
    pub opened: u64,
    /// Upgrades that failed, by why (`status 502`, `connect: refused`, …).
    pub upgrade_failures: BTreeMap<String, u64>,
    /// WebSockets that ended before the run did, in order.
    pub closes: Vec<Close>,
    /// From a cut to the next WebSocket open on that connection.
    pub reconnect: HistogramUs,
    /// WebSockets open, every 100 ms: (seconds from the start, open).
    pub open_over_time: Vec<(f64, u32)>,
    /// Seconds from the start to the end.
    pub duration_s: f64,
}

/// What the connections share: the run's clock and what they measured.
struct Run {
    plan: WebSocketPlan,
    connector: Connector,
    start: Instant,
    end: Instant,
    interval: Duration,
    stop: Arc<AtomicBool>,
    report: RefCell<WebSocketReport>,
    open: std::cell::Cell<u32>,
}

/// Runs `plan` to its end or until `stop` is set, and returns what was measured.
pub fn run(plan: &WebSocketPlan, stop: Arc<AtomicBool>) -> Result<WebSocketReport, LoadError> {
    let invalid = |field: &str, reason: String| LoadError::InvalidPlan {
        field: field.into(),
        reason,
    };
    let load = &plan.load;
    if !(plan.messages_per_s > 0.0 && plan.messages_per_s.is_finite()) {
        return Err(invalid(
            "messages per second",
            format!("{} is not a rate above zero", plan.messages_per_s),
        ));
    }
    if plan.message_bytes < MESSAGE_HEADER || plan.message_bytes > 16 << 20 {
        return Err(invalid(
            "message size",
            format!(
                "{} bytes: from {MESSAGE_HEADER} (a sequence number and a due time) to 16 MiB",
                plan.message_bytes
            ),
        ));
    }
    if load.connections == 0 {
        return Err(invalid("connections", "at least one".into()));
    }
    let Length::Duration(length) = load.length else {
        return Err(invalid(
            "length",
            "a WebSocket load runs for a duration, not a number of requests".into(),
        ));
    };
    let tls = match load.target.scheme {
        Scheme::Https => Some((
            crate::tls::client_config_for(&load.tls, crate::Protocol::Http1)?,
            crate::tls::server_name(&load.tls, &load.target.host)?,
        )),
        Scheme::Http => None,
    };
    let fixed = load.resolve.iter().find_map(|r| r.applies_to(&load.target));
    let address = match (fixed, load.target.ip()) {
        (Some(addr), _) => Address::Fixed(addr, "from --resolve"),
        (None, Some(ip)) => Address::Fixed((ip, load.target.port).into(), "the URL's address"),
        (None, None) => Address::Lookup {
            host: load.target.host.clone(),
            port: load.target.port,
        },
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LoadError::Runtime)?;
    let start = load
        .start
        .unwrap_or_else(|| Instant::now() + Duration::from_millis(20));
    let run = Rc::new(Run {
        plan: plan.clone(),
        connector: Connector::new(address, tls),
        start,
        end: start + length,
        interval: Duration::from_secs_f64(load.connections as f64 / plan.messages_per_s),
        stop,
        report: RefCell::new(WebSocketReport::default()),
        open: std::cell::Cell::new(0),
    });
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let mut tasks = Vec::with_capacity(load.connections);
        for index in 0..load.connections {
            tasks.push(tokio::task::spawn_local(connection(run.clone(), index)));
        }
        let sampler = tokio::task::spawn_local(sample_open(run.clone()));
        for task in tasks {
            let _ = task.await;
        }
        sampler.abort();
    });
    let mut report = run.report.take();
    report.duration_s = run
        .end
        .min(Instant::now())
        .saturating_duration_since(start)
        .as_secs_f64();
    Ok(report)
}

/// Samples how many WebSockets are open every 100 ms until aborted.
async fn sample_open(run: Rc<Run>) {
    let mut at = run.start;
    loop {
        tokio::time::sleep_until(at.into()).await;
        let t = at.saturating_duration_since(run.start).as_secs_f64();
        run.report
            .borrow_mut()
            .open_over_time
            .push((t, run.open.get()));
        at += Duration::from_millis(100);
    }
}

/// How a WebSocket's conversation ended.
enum Ended {
    /// The run is over (or stopped): close it as a client does.
    RunOver,
    /// Cut, with what the close said.
    Cut {
        by: ClosedBy,
        code: u16,
        reason: String,
    },
}

/// One connection's WebSockets, one after another, to the end of the run.
async fn connection(run: Rc<Run>, index: usize) {
    let connections = run.plan.load.connections as f64;
    // Staggered over one interval, so the messages of all connections are evenly spread.
    let mut due = run.start + run.interval.mul_f64(index as f64 / connections);
    let mut seq = 0u64;
    let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ ((index as u64 + 1) << 17);
    let mut cut_at: Option<Instant> = None;
    let mut attempt = 0u32;
    tokio::time::sleep_until(run.start.into()).await;
    while Instant::now() < run.end && !run.stop.load(Ordering::Relaxed) {
        match open(&run).await {
            Ok((mut ws, backend)) => {
                attempt = 0;
                if let Some(cut) = cut_at.take() {
                    run.report
                        .borrow_mut()
                        .reconnect
                        .record_ns(crate::connection::nanos(cut.elapsed()));
                }
                run.report.borrow_mut().opened += 1;
                run.open.set(run.open.get() + 1);
                let mut outstanding = BTreeMap::new();
                let ended = converse(&run, &mut ws, (&mut due, &mut seq), &mut outstanding).await;
                run.open.set(run.open.get() - 1);
                match ended {
                    Ended::RunOver => {
                        finish(&run, ws, &mut outstanding).await;
                        return;
                    }
                    Ended::Cut { by, code, reason } => {
                        let mut report = run.report.borrow_mut();
                        report.lost += outstanding.len() as u64;
                        report.closes.push(Close {
                            at_s: run.start.elapsed().as_secs_f64(),
                            connection: index,
                            by,
                            code,
                            reason,
                            backend,
                            lost: outstanding.len() as u64,
                        });
                        cut_at = Some(Instant::now());
                    }
                }
            }
            Err(why) => {
                *run.report
                    .borrow_mut()
                    .upgrade_failures
                    .entry(why)
                    .or_default() += 1;
                cut_at.get_or_insert_with(Instant::now);
            }
        }
        match run.plan.reconnect.delay(attempt, &mut rng) {
            Some(wait) => {
                attempt += 1;
                tokio::time::sleep(wait).await;
            }
            None => break,
        }
    }
    // Never reconnected: what fell due from here to the end was never sent.
    let mut report = run.report.borrow_mut();
    while due < run.end {
        report.unsent += 1;
        due += run.interval;
    }
}

/// Opens a WebSocket: a connection, then the upgrade; the backend the answer names.
async fn open(run: &Run) -> Result<(WebSocketStream<Stream>, Option<String>), String> {
    let load = &run.plan.load;
    let stream = run
        .connector
        .connect(&mut Phases::default())
        .await
        .map_err(|outcome| {
            run.connector.take_failure().map_or_else(
                || format!("connect: {outcome:?}"),
                |why| format!("connect: {why}"),
            )
        })?;
    let scheme = match load.target.scheme {
        Scheme::Https => "wss",
        Scheme::Http => "ws",
    };
    let url = format!("{scheme}://{}{}", load.target.authority(), load.target.path);
    let mut request = url
        .into_client_request()
        .map_err(|e| format!("request: {e}"))?;
    for (name, value) in &load.request.headers {
        let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) else {
            continue;
        };
        request.headers_mut().insert(name, value);
    }
    let upgrade = tokio_tungstenite::client_async(request, stream);
    let (ws, answer) = match tokio::time::timeout(load.timeout, upgrade).await {
        Err(_) => return Err("upgrade: timed out".into()),
        Ok(Err(WsError::Http(answer))) => {
            return Err(format!("status {}", answer.status().as_u16()))
        }
        Ok(Err(e)) => return Err(format!("upgrade: {e}")),
        Ok(Ok(done)) => done,
    };
    let backend = answer
        .headers()
        .get(load.backend_header.as_str())
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok((ws, backend))
}

/// How many messages counted lost on a live WebSocket are remembered, so that a late echo
/// is told from a duplicate.
const EXPIRED_KEPT: usize = 1 << 16;

/// Sends the messages that fall due and reads their echoes until the run ends or the
/// WebSocket is cut. `outstanding` holds the messages sent and not yet echoed (sequence
/// number, when due).
async fn converse(
    run: &Run,
    ws: &mut WebSocketStream<Stream>,
    (due, seq): (&mut Instant, &mut u64),
    outstanding: &mut BTreeMap<u64, Instant>,
) -> Ended {
    let timeout = run.plan.load.timeout;
    // What fell due while no WebSocket was open: too old to send, or sent now.
    {
        let now = Instant::now();
        let mut report = run.report.borrow_mut();
        while *due + timeout < now && *due < run.end {
            report.unsent += 1;
            *due += run.interval;
        }
    }
    let mut highest: Option<u64> = None;
    let mut expired = BTreeSet::new();
    let mut payload = vec![0u8; run.plan.message_bytes];
    loop {
        if run.stop.load(Ordering::Relaxed) || *due >= run.end {
            return Ended::RunOver;
        }
        tokio::select! {
            biased;
            message = ws.next() => match message {
                Some(Ok(Message::Binary(echo))) if echo.len() >= MESSAGE_HEADER => {
                    let number = u64::from_be_bytes(echo[..8].try_into().unwrap_or_default());
                    let due_ns = u64::from_be_bytes(echo[8..16].try_into().unwrap_or_default());
                    let mut report = run.report.borrow_mut();
                    let late = expired.remove(&number);
                    if outstanding.remove(&number).is_some() || late {
                        let now_ns = crate::connection::nanos(run.start.elapsed());
                        report.latency.record_ns(now_ns.saturating_sub(due_ns));
                        report.echoed += 1;
                        if late {
                            report.late += 1;
                            report.lost -= 1;
                        }
                        if highest.is_some_and(|h| number < h) {
                            report.reordered += 1;
                        }
                        highest = Some(highest.map_or(number, |h| h.max(number)));
                    } else {
                        report.duplicated += 1;
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    let (code, reason) = frame.map_or((1005, String::new()), |f: CloseFrame| {
                        (u16::from(f.code), f.reason.to_string())
                    });
                    return Ended::Cut { by: ClosedBy::Server, code, reason };
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    return Ended::Cut { by: ClosedBy::Abnormal, code: 1006, reason: e.to_string() };
                }
                None => {
                    return Ended::Cut {
                        by: ClosedBy::Abnormal,
                        code: 1006,
                        reason: "the connection ended without a close".into(),
                    };
                }
            },
            () = tokio::time::sleep_until((*due).into()) => {
                payload[..8].copy_from_slice(&seq.to_be_bytes());
                let due_ns = crate::connection::nanos(due.saturating_duration_since(run.start));
                payload[8..16].copy_from_slice(&due_ns.to_be_bytes());
                if let Err(e) = ws.send(Message::Binary(payload.clone().into())).await {
                    return Ended::Cut { by: ClosedBy::Abnormal, code: 1006, reason: e.to_string() };
                }
                outstanding.insert(*seq, *due);
                let mut report = run.report.borrow_mut();
                report.sent += 1;
                *seq += 1;
                *due += run.interval;
                // What has waited longer than the timeout is lost, unless it comes late.
                let now = Instant::now();
                while let Some(entry) = outstanding.first_entry() {
                    if *entry.get() + timeout >= now {
                        break;
                    }
                    expired.insert(entry.remove_entry().0);
                    report.lost += 1;
                    if expired.len() > EXPIRED_KEPT {
                        expired.pop_first();
                    }
                }
            }
        }
    }
}

/// Ends a WebSocket at the end of the run: a close (1000), then the echoes still coming
/// until the server's close or one timeout; what is still out is in flight at the end.
async fn finish(
    run: &Run,
    mut ws: WebSocketStream<Stream>,
    outstanding: &mut BTreeMap<u64, Instant>,
) {
    let _ = ws.close(None).await;
    let deadline = Instant::now() + run.plan.load.timeout.min(Duration::from_secs(1));
    while let Ok(Some(Ok(message))) = tokio::time::timeout_at(deadline.into(), ws.next()).await {
        if let Message::Binary(echo) = message {
            if echo.len() >= MESSAGE_HEADER {
                let number = u64::from_be_bytes(echo[..8].try_into().unwrap_or_default());
                if outstanding.remove(&number).is_some() {
                    run.report.borrow_mut().echoed += 1;
                }
            }
        }
    }
    run.report.borrow_mut().in_flight_at_end += outstanding.len() as u64;
}

/// A uniform draw in [0, 1) from `state` (xorshift64*).
fn uniform(state: &mut u64) -> f64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_policies_parse_and_back_off_with_jitter_within_their_ceiling() {
        assert_eq!(Reconnect::parse("none"), Ok(Reconnect::Never));
        assert_eq!(Reconnect::parse("immediate"), Ok(Reconnect::Immediate));
        let policy = Reconnect::parse("backoff:50ms-1s").unwrap();
        assert!(Reconnect::parse("backoff:1s-50ms").is_err());
        assert!(Reconnect::parse("sometimes")
            .unwrap_err()
            .contains("backoff:FIRST-MAX"));
        let mut rng = 7;
        for attempt in 0..12 {
            let ceiling = Duration::from_millis(50 << attempt.min(5)).min(Duration::from_secs(1));
            let mut longest = Duration::ZERO;
            for _ in 0..200 {
                let d = policy.delay(attempt, &mut rng).unwrap();
                assert!(d <= ceiling, "{attempt}: {d:?} over {ceiling:?}");
                longest = longest.max(d);
            }
            // Jittered over the whole range, not always at its ceiling.
            assert!(longest > ceiling.mul_f64(0.8), "{attempt}: {longest:?}");
        }
        assert_eq!(Reconnect::Never.delay(0, &mut rng), None);
    }
}
