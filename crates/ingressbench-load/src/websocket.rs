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
//! the WebSocket was on. A cut connection reconnects as its policy says ([`crate::stream::Reconnect`]),
//! and the time from the cut to the next open WebSocket is measured; messages due while no
//! WebSocket was open are sent once one is, unless they are older than the plan's timeout
//! by then (counted as unsent). What it shares with server-sent events is in
//! [`crate::stream`].

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use ingressbench_stats::{BackendId, Outcome, Phases};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use crate::stream::{
    drive, Bound, ClosedBy, Downtime, Out, Pacer, Run, Said, StreamKind, StreamOptions,
    MESSAGE_HEADER,
};
use crate::{LoadError, LoadReport, Observer, Plan, Scheme};

mod tap;
use tap::Tapped;

/// Runs a WebSocket plan ([`crate::Kind::WebSocket`]) to its end or until `stop` is set,
/// giving windows and samples to `observer` as the HTTP engine does.
pub(crate) fn run(
    plan: &Plan,
    options: &StreamOptions,
    stop: Arc<AtomicBool>,
    observer: &mut dyn Observer,
) -> Result<LoadReport, LoadError> {
    drive(
        plan,
        (StreamKind::Websocket, options),
        stop,
        observer,
        connection,
    )
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
    let connections = run.plan.connections as f64;
    // Staggered over one interval, so the messages of all connections are evenly spread.
    let mut due = run.start + run.interval.mul_f64(index as f64 / connections);
    let mut seq = 0u64;
    let mut down = Downtime::new(index);
    let mut clock = Pacer::new(run.start, run.plan.batch_window);
    tokio::time::sleep_until(run.start.into()).await;
    while Instant::now() < run.end && !run.stop.load(Ordering::Relaxed) {
        match open(&run).await {
            Ok((mut ws, backend_name, phases)) => {
                let backend = run.reopened(&mut down, backend_name.as_deref());
                let mut outstanding = Outstanding::default();
                let ended = converse(
                    &run,
                    (&mut ws, backend, Some(phases)),
                    (&mut clock, &mut due, &mut seq),
                    &mut outstanding,
                )
                .await;
                match ended {
                    Ended::RunOver => {
                        run.open.set(run.open.get() - 1);
                        finish(&run, ws, outstanding, backend).await;
                        return;
                    }
                    Ended::Cut { by, code, reason } => {
                        let outcome = match by {
                            ClosedBy::Server => Outcome::Eof,
                            ClosedBy::Abnormal => Outcome::ResetAfterWrite,
                        };
                        for out in outstanding.sent.values() {
                            run.record(*out, outcome, backend, 0);
                        }
                        let lost = outstanding.sent.len() as u64;
                        run.report.borrow_mut().lost += lost;
                        run.cut(
                            &mut down,
                            (by, Said::Code(code), reason),
                            backend_name,
                            lost,
                        );
                    }
                }
            }
            Err(why) => run.failed(&mut down, why),
        }
        if !down.wait(&run).await {
            break;
        }
    }
    // Never reconnected: what fell due from here to the end was never sent.
    while due < run.end {
        run.report.borrow_mut().unsent += 1;
        run.record(Out::unsent(run.ns(due)), Outcome::NotSent, None, 0);
        due += run.interval;
    }
}

/// Opens a WebSocket: a connection, then the upgrade; the backend the answer names, and
/// the connection's phases.
async fn open(run: &Run) -> Result<(WebSocketStream<Tapped>, Option<String>, Phases), String> {
    let plan = &run.plan;
    let mut phases = Phases::default();
    let stream = run.connect(&mut phases).await?;
    let scheme = match plan.target.scheme {
        Scheme::Https => "wss",
        Scheme::Http => "ws",
    };
    let url = format!("{scheme}://{}{}", plan.target.authority(), plan.target.path);
    let mut request = url
        .into_client_request()
        .map_err(|e| format!("request: {e}"))?;
    for (name, value) in &plan.request.headers {
        let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) else {
            continue;
        };
        request.headers_mut().insert(name, value);
    }
    let upgrade = tokio_tungstenite::client_async_with_config(
        request,
        Tapped::new(stream),
        Some(frame_limits(run.options.message_bytes)),
    );
    let (ws, answer) = match tokio::time::timeout(plan.timeout, upgrade).await {
        Err(_) => return Err("upgrade: timed out".into()),
        Ok(Err(WsError::Http(answer))) => {
            return Err(format!("status {}", answer.status().as_u16()))
        }
        Ok(Err(e)) => return Err(format!("upgrade: {e}")),
        Ok(Ok(done)) => done,
    };
    let backend = answer
        .headers()
        .get(plan.backend_header.as_str())
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok((ws, backend, phases))
}

/// The largest message or frame the client takes: what it sends, with room for a
/// server's own small messages, so that an oversized frame ends the WebSocket (counted
/// by its kind) instead of the client's memory growing with it.
fn frame_limits(message_bytes: usize) -> WebSocketConfig {
    let most = message_bytes.max(64 << 10) * 2;
    WebSocketConfig::default()
        .max_message_size(Some(most))
        .max_frame_size(Some(most))
}

/// How many messages counted lost on a live WebSocket are remembered, so that a late echo
/// is told from a duplicate.
const EXPIRED_KEPT: usize = 1 << 16;

/// The messages of one WebSocket sent and not yet echoed (by sequence number), those
/// counted lost on the clock (one may still come, late), and the highest number echoed
/// on it: a message below it that never comes was skipped.
#[derive(Default)]
struct Outstanding {
    sent: BTreeMap<u64, Out>,
    expired: BTreeSet<u64>,
    highest: Option<u64>,
}

impl Outstanding {
    /// Takes in a binary frame the server sent: the echo of a message of ours (timed and
    /// counted, reordered if a later one came first), a late or repeated echo, or a
    /// frame that is none of ours (the wrong size, or a number and due time no message
    /// carried); each counted once in the run's report.
    fn echo(&mut self, run: &Run, echo: &[u8], backend: Option<BackendId>) {
        let mut report = run.report.borrow_mut();
        let Some(number) = self.number_of(echo, run.options.message_bytes) else {
            report.not_ours += 1;
            return;
        };
        if let Some(out) = self.sent.remove(&number) {
            if self.highest.is_some_and(|h| number < h) {
                report.reordered += 1;
            }
            self.highest = Some(self.highest.map_or(number, |h| h.max(number)));
            report.echoed += 1;
            drop(report);
            run.record(out, Outcome::Status(101), backend, echo.len() as u64);
        } else if self.expired.remove(&number) {
            report.late += 1;
        } else {
            report.duplicated += 1;
        }
    }

    /// An echo's sequence number, if it is a message of ours as it was sent: its size,
    /// and the due time it carries that of the message with that number.
    fn number_of(&self, echo: &[u8], message_bytes: usize) -> Option<u64> {
        if echo.len() != message_bytes || echo.len() < MESSAGE_HEADER {
            return None;
        }
        let number = u64::from_be_bytes(echo[..8].try_into().ok()?);
        let due_ns = u64::from_be_bytes(echo[8..16].try_into().ok()?);
        match self.sent.get(&number) {
            Some(out) if out.due_ns != due_ns => None,
            _ => Some(number),
        }
    }
}

/// Sends the messages that fall due and reads their echoes until the run ends or the
/// WebSocket is cut. Every write is bounded ([`Run::bounded`]): a server that stops
/// reading cuts the WebSocket (`write_timeout`), it does not hold the run.
async fn converse(
    run: &Run,
    (ws, backend, mut opened): (
        &mut WebSocketStream<Tapped>,
        Option<BackendId>,
        Option<Phases>,
    ),
    (clock, due, seq): (&mut Pacer, &mut Instant, &mut u64),
    outstanding: &mut Outstanding,
) -> Ended {
    let timeout = run.plan.timeout;
    // What fell due while no WebSocket was open: too old to send, or sent now.
    let now = Instant::now();
    while *due + timeout < now && *due < run.end {
        run.report.borrow_mut().unsent += 1;
        run.record(Out::unsent(run.ns(*due)), Outcome::NotSent, None, 0);
        *due += run.interval;
    }
    loop {
        // On the clock too: a peer that floods frames cannot keep the run going.
        let now = Instant::now();
        if run.stop.load(Ordering::Relaxed) || *due >= run.end || now >= run.end {
            return Ended::RunOver;
        }
        // Reading comes first, unless a message is due: a flood of frames (pings) cannot
        // hold the schedule back.
        let overdue = now >= *due;
        tokio::select! {
            biased;
            message = ws.next(), if !overdue => match message {
                Some(Ok(Message::Binary(echo))) => outstanding.echo(run, &echo, backend),
                Some(Ok(Message::Close(frame))) => {
                    let (code, reason) = frame.map_or((1005, String::new()), |f: CloseFrame| {
                        (u16::from(f.code), f.reason.to_string())
                    });
                    // The code the server sent, where tungstenite gives 1002 for one that
                    // is not valid.
                    let code = ws.get_ref().close_code().unwrap_or(code);
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
            () = clock.sleep_until(*due) => {
                let due_ns = run.ns(*due);
                let released_ns = run.ns(Instant::now());
                // A buffer each: the frame owns its bytes until they are written.
                let mut frame = BytesMut::zeroed(run.options.message_bytes);
                frame[..8].copy_from_slice(&seq.to_be_bytes());
                frame[8..16].copy_from_slice(&due_ns.to_be_bytes());
                let message = Message::Binary(frame.freeze());
                let sent_ns = run.ns(Instant::now());
                let out = Out { due_ns, released_ns, sent_ns, opened: opened.take(), retried_after: None };
                match run.bounded(ws.send(message)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        return Ended::Cut { by: ClosedBy::Abnormal, code: 1006, reason: e.to_string() };
                    }
                    Err(bound) => {
                        // Part of it may be on the wire: it ends here, as the WebSocket does.
                        let outcome = match bound {
                            Bound::TimedOut => Outcome::WriteTimeout,
                            Bound::Stopped => Outcome::WaitingAtEnd,
                        };
                        run.record(out, outcome, backend, 0);
                        let mut report = run.report.borrow_mut();
                        report.sent += 1;
                        *seq += 1;
                        *due += run.interval;
                        if bound == Bound::Stopped {
                            report.in_flight_at_end += 1;
                            return Ended::RunOver;
                        }
                        report.lost += 1;
                        return Ended::Cut {
                            by: ClosedBy::Abnormal,
                            code: 1006,
                            reason: "write_timeout: the server stopped reading (a message could not be written within --timeout, or by the end of the run)".into(),
                        };
                    }
                }
                outstanding.sent.insert(*seq, out);
                run.report.borrow_mut().sent += 1;
                *seq += 1;
                *due += run.interval;
                // What has waited longer than the timeout is lost, unless it comes late.
                let now_ns = run.ns(Instant::now());
                let timeout_ns = crate::connection::nanos(timeout);
                while let Some(entry) = outstanding.sent.first_entry() {
                    if entry.get().sent_ns + timeout_ns >= now_ns {
                        break;
                    }
                    let (number, out) = entry.remove_entry();
                    outstanding.expired.insert(number);
                    run.record(out, Outcome::ReadTimeout, backend, 0);
                    run.report.borrow_mut().lost += 1;
                    if outstanding.expired.len() > EXPIRED_KEPT {
                        outstanding.expired.pop_first();
                    }
                }
            }
        }
    }
}

/// Ends a WebSocket at the end of the run: a close (1000), then the echoes still coming
/// until the server's close or the run's drain is over; every close and read is bounded,
/// so a server that stops reading cannot hold the run. What is still out then ends as
/// `unanswered` when a later message was echoed (the server skipped it), else as
/// `waiting_at_end`: both failures, in every figure.
async fn finish(
    run: &Run,
    mut ws: WebSocketStream<Tapped>,
    mut outstanding: Outstanding,
    backend: Option<BackendId>,
) {
    let _ = run.bounded(ws.close(None)).await;
    let deadline = run
        .drain_deadline()
        .max(Instant::now() + Duration::from_millis(50));
    while let Ok(Some(Ok(message))) = tokio::time::timeout_at(deadline.into(), ws.next()).await {
        if let Message::Binary(echo) = message {
            outstanding.echo(run, &echo, backend);
        }
    }
    let highest = outstanding.highest;
    for (number, out) in std::mem::take(&mut outstanding.sent) {
        run.never_came(out, highest.is_some_and(|h| number < h), backend);
    }
}
