//! Peers that misbehave (issue #48): a WebSocket server that stops reading, an event
//! stream that never sends, an echo server that skips messages, events that come out of
//! order, a page that is not an event stream. Each unit the schedule sent ends in exactly
//! one outcome, "still waiting at the end" included, and no peer holds a run past its
//! duration and a bounded drain.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_load::stream::{Reconnect, StreamFile, StreamOptions};
use ingressbench_load::{Kind, Length, LoadReport, Mode, NoObserver, Plan, Target};
use ingressbench_stats::Outcome;

use crate::common::{ends_within, scratch, BIN};
use crate::process::Backend;

/// Serves each connection on a thread of its own with `serve`, for as long as the test
/// process lives; every connection is dropped after a minute whatever `serve` does.
fn serve_each(serve: fn(TcpStream)) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = stream.set_write_timeout(Some(Duration::from_secs(60)));
            std::thread::spawn(move || serve(stream));
        }
    });
    addr
}

/// Reads a request's head (to its blank line).
fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 << 10 {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Reads a WebSocket upgrade's request and accepts it; false if the client went away.
fn upgrade(stream: &mut TcpStream) -> bool {
    let head = read_head(stream);
    let key = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("sec-websocket-key")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    stream.write_all(answer.as_bytes()).is_ok()
}

/// Completes a WebSocket upgrade, then sends pings as fast as it can and never reads:
/// the client's pongs fill the connection until its writes block.
fn pings_and_never_reads(mut stream: TcpStream) {
    if !upgrade(&mut stream) {
        return;
    }
    let mut ping = vec![0x89u8, 125];
    ping.extend_from_slice(&[b'p'; 125]);
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until && stream.write_all(&ping).is_ok() {}
}

/// Completes a WebSocket upgrade and closes it at once with code 999, which no endpoint
/// may send; then reads what the client says until it goes.
fn closes_with_999(mut stream: TcpStream) {
    if !upgrade(&mut stream)
        || stream
            .write_all(&[0x88, 5, 0x03, 0xe7, b'b', b'y', b'e'])
            .is_err()
    {
        return;
    }
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut sink = [0u8; 512];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
}

/// Accepts and never reads a byte: the client's writes fill the connection and block.
fn never_reads(stream: TcpStream) {
    std::thread::sleep(Duration::from_secs(60));
    drop(stream);
}

/// Accepts and reads one byte a second: a writer blocks, and sees progress.
fn reads_a_byte_a_second(mut stream: TcpStream) {
    let mut byte = [0u8; 1];
    for _ in 0..60 {
        if !matches!(stream.read(&mut byte), Ok(1)) {
            return;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Refuses every WebSocket upgrade (403).
fn refuses_upgrades(mut stream: TcpStream) {
    read_head(&mut stream);
    let _ = stream
        .write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
}

/// Answers an event stream's head and ends it at once.
fn ends_each_stream_at_once(mut stream: TcpStream) {
    read_head(&mut stream);
    let _ = stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
    );
}

/// Answers an event stream's head, then sends nothing.
fn silent_events(mut stream: TcpStream) {
    read_head(&mut stream);
    let _ = stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    std::thread::sleep(Duration::from_secs(60));
}

/// The events the request asks for (`sse_count`), each pair sent in the wrong order: 1,
/// 0, 3, 2, … all at once, then the stream stays open.
fn swapped_events(mut stream: TcpStream) {
    let head = read_head(&mut stream);
    let count: u64 = head
        .split(['?', '&', ' '])
        .find_map(|p| p.strip_prefix("sse_count="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let mut body = String::new();
    for pair in 0..count / 2 {
        for id in [2 * pair + 1, 2 * pair] {
            let event = format!("id: {id}\ndata: x\n\n");
            body += &format!("{:x}\r\n{event}\r\n", event.len());
        }
    }
    let _ = stream.write_all(
        format!("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n{body}")
            .as_bytes(),
    );
    std::thread::sleep(Duration::from_secs(60));
}

/// A web page that happens to hold `id:` lines.
fn html_with_ids(mut stream: TcpStream) {
    read_head(&mut stream);
    let page = "id: 0\ndata: x\n\nid: 1\ndata: x\n\n";
    let _ = stream.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\r\n{page}",
            page.len()
        )
        .as_bytes(),
    );
    std::thread::sleep(Duration::from_secs(60));
}

fn stream_plan(url: &str, kind: fn(StreamOptions) -> Kind, rate: f64, length: Duration) -> Plan {
    let mut plan = Plan::new(Target::parse(url).unwrap());
    plan.kind = kind(StreamOptions {
        message_bytes: 64,
        reconnect: Reconnect::Never,
    });
    plan.mode = Mode::Open { rate_per_s: rate };
    plan.connections = 2;
    plan.length = Length::Duration(length);
    // Longer than the run: nothing times out before the end.
    plan.timeout = Duration::from_secs(10);
    plan
}

/// 20 events a second over two streams from a server that serves each with `serve`.
fn events_from(serve: fn(TcpStream), length: Duration) -> LoadReport {
    let addr = serve_each(serve);
    run(&stream_plan(
        &format!("http://{addr}/events"),
        Kind::Sse,
        20.0,
        length,
    ))
}

fn run(plan: &Plan) -> LoadReport {
    ingressbench_load::run(plan, Arc::new(AtomicBool::new(false)), &mut NoObserver).unwrap()
}

/// Every unit sent ended in exactly one way, and the summary counts each once.
fn conserved(load: &LoadReport) -> &StreamFile {
    let r = load.stream.as_deref().expect("a stream report");
    assert_eq!(r.echoed + r.lost + r.in_flight_at_end, r.sent, "{r:?}");
    assert_eq!(load.summary.requests.total, r.sent + r.unsent, "{r:?}");
    let outcomes = load.recorder.outcomes();
    assert_eq!(
        outcomes.get(Outcome::WaitingAtEnd),
        r.in_flight_at_end,
        "{r:?}"
    );
    assert_eq!(outcomes.get(Outcome::Unanswered), r.unanswered, "{r:?}");
    r
}

/// A server that accepts the upgrade and stops reading: the run ends at its duration and
/// a bounded drain, every file written, the blocked messages counted as `write_timeout`.
#[test]
fn a_websocket_peer_that_stops_reading_cannot_hold_the_run() {
    let addr = serve_each(pings_and_never_reads);
    let dir = scratch("peer-stops-reading");
    let (json, stream_json) = (dir.join("load.json"), dir.join("stream.json"));
    let mut child = Command::new(BIN)
        .args([
            "load",
            "--websocket",
            "-R",
            "200",
            "-c",
            "2",
            "-d",
            "3s",
            "--json",
        ])
        .arg(&json)
        .arg("--stream-json")
        .arg(&stream_json)
        .arg(format!("ws://{addr}/"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The run is 3 s and its drain at most 1 s.
    let status = ends_within(
        &mut child,
        Duration::from_secs(120),
        "the run did not end by itself",
    );
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{status:?}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect(&said)).expect(&said);
    let stream: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&stream_json).expect(&said)).expect(&said);
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let outcomes = &summary["outcomes"];
    assert!(n(&outcomes["write_timeout"]) >= 1, "{outcomes}\n{said}");
    assert_eq!(
        n(&summary["requests"]["total"]),
        n(&stream["sent"]) + n(&stream["unsent"]),
        "{stream}"
    );
    assert_eq!(
        n(&stream["echoed"]) + n(&stream["lost"]) + n(&stream["in_flight_at_end"]),
        n(&stream["sent"]),
        "{stream}"
    );
    assert!(n(&summary["requests"]["errors"]) > 0, "{summary}");
}

/// An event stream that answers its head and sends nothing: every event due is a failure
/// (`waiting_at_end`), never a clean run with no outcomes.
#[test]
fn a_silent_event_stream_is_a_failure_not_a_clean_run() {
    let load = events_from(silent_events, Duration::from_secs(3));
    let r = conserved(&load);
    assert_eq!(r.echoed, 0, "{r:?}");
    assert!(r.in_flight_at_end >= 55, "60 due: {r:?}");
    assert_eq!(load.summary.requests.errors, load.summary.requests.total);
    assert!(
        load.summary
            .warnings
            .iter()
            .any(|w| w.starts_with("WAITING AT THE END")),
        "{:?}",
        load.summary.warnings
    );
}

/// An echo server that never answers one message in ten, with a timeout longer than the
/// run: those it skipped (a later one was echoed) are `unanswered`, and the run says the
/// server dropped them.
#[test]
fn messages_an_echo_server_skips_are_unanswered_and_named() {
    let backend = Backend::start(&["--listen", "127.0.0.1:0", "--ws-drop-every", "10"]);
    let load = run(&stream_plan(
        &format!("http://{}/ws", backend.addr),
        Kind::WebSocket,
        200.0,
        Duration::from_secs(3),
    ));
    let r = conserved(&load);
    let tenth = r.sent as f64 / 10.0;
    // A connection's last skipped message may have no echoed one after it.
    assert!(
        (r.unanswered as f64 - tenth).abs() <= 2.0,
        "{} of {}: {r:?}",
        r.unanswered,
        r.sent
    );
    assert!(r.in_flight_at_end <= 2, "{r:?}");
    assert!(
        load.summary
            .warnings
            .iter()
            .any(|w| w.starts_with("THE SERVER SKIPPED")),
        "{:?}",
        load.summary.warnings
    );
}

/// Events sent 1, 0, 3, 2, …: every one came once, each second of a pair reordered, none
/// lost or duplicated.
#[test]
fn reordered_events_are_counted_reordered_not_lost_and_duplicated() {
    let load = events_from(swapped_events, Duration::from_secs(3));
    let r = conserved(&load);
    assert_eq!((r.lost, r.duplicated), (0, 0), "{r:?}");
    assert_eq!(r.echoed, r.sent, "{r:?}");
    assert_eq!(r.reordered, r.echoed / 2, "{r:?}");
}

/// A 200 answer that is a web page, not `text/event-stream`, is a failed stream whatever
/// lines it holds.
#[test]
fn a_page_that_is_not_an_event_stream_is_refused() {
    let load = events_from(html_with_ids, Duration::from_secs(2));
    let r = conserved(&load);
    assert_eq!(r.echoed, 0, "{r:?}");
    assert!(
        r.upgrade_failures
            .keys()
            .any(|k| k.contains("not an event stream")),
        "{r:?}"
    );
}

/// A close with a code no endpoint may send (999) is reported as the server sent it and
/// said to be invalid, not as the 1002 the client library answers with.
#[test]
fn a_close_code_no_endpoint_may_send_is_reported_as_received() {
    let addr = serve_each(closes_with_999);
    let dir = scratch("peer-close-999");
    let stream_json = dir.join("stream.json");
    let out = Command::new(BIN)
        .args(["load", "--websocket", "-R", "20", "-c", "1", "-d", "1s"])
        .args(["--reconnect", "never", "--stream-json"])
        .arg(&stream_json)
        .arg(format!("ws://{addr}/"))
        .output()
        .unwrap();
    let said = crate::common::text(&out);
    assert!(
        said.contains("999 by server (a code no endpoint may send)"),
        "{said}"
    );
    assert!(!said.contains("1002"), "{said}");
    let stream: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&stream_json).expect(&said)).expect(&said);
    let closes = stream["closes"].as_array().expect(&said);
    assert!(!closes.is_empty(), "{stream}");
    assert!(
        closes
            .iter()
            .all(|c| c["code"] == 999 && c["by"] == "server"),
        "{stream}"
    );
}

/// `ingressbench load ARGS` to its end (a hang detector, not a timing: the runs here are
/// 2 s and a drain of at most their timeout), and its summary.
fn load_ends_by_itself(args: &[String], dir: &std::path::Path) -> serde_json::Value {
    let json = dir.join("load.json");
    let mut child = Command::new(BIN)
        .arg("load")
        .args(args)
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    ends_within(
        &mut child,
        Duration::from_secs(120),
        &format!("load {args:?} did not end by itself"),
    );
    let out = child.wait_with_output().unwrap();
    let said = crate::common::text(&out);
    serde_json::from_slice(&std::fs::read(&json).expect(&said)).expect(&said)
}

/// A server that never reads, and one that reads a byte a second, hold no HTTP/1, HTTP/2
/// or gRPC run past its end: each request is in exactly one outcome, every one a failure,
/// and an HTTP/1 request whose body could not be written is `write_timeout` (the server
/// stopped reading), not a slow answer.
#[test]
fn a_peer_that_stops_reading_holds_no_http_or_grpc_run() {
    let dir = scratch("peer-http-stops-reading");
    let body = dir.join("body");
    std::fs::write(&body, vec![b'x'; 4 << 20]).unwrap();
    for (name, serve) in [
        ("never reads", never_reads as fn(TcpStream)),
        ("reads a byte a second", reads_a_byte_a_second),
    ] {
        let addr = serve_each(serve);
        let common = ["-R", "20", "-c", "2", "-d", "2s", "--timeout", "1s"];
        let body_args = [
            "-X".to_owned(),
            "POST".to_owned(),
            "--body-file".to_owned(),
            body.display().to_string(),
        ];
        for (kind, extra) in [
            ("HTTP/1", body_args.to_vec()),
            (
                "HTTP/2",
                [body_args.to_vec(), vec!["--http2".to_owned()]].concat(),
            ),
            (
                "gRPC",
                vec![
                    "--grpc".to_owned(),
                    "--message-size".to_owned(),
                    (4 << 20).to_string(),
                ],
            ),
        ] {
            let mut args: Vec<String> = common.iter().map(|a| (*a).to_owned()).collect();
            args.extend(extra);
            args.push(format!("http://{addr}/"));
            let summary = load_ends_by_itself(&args, &dir);
            let what = format!("{kind} against a server that {name}: {summary}");
            let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
            let total = n(&summary["requests"]["total"]);
            let outcomes: u64 = summary["outcomes"]
                .as_object()
                .expect(&what)
                .values()
                .map(n)
                .sum();
            assert!(total > 0, "{what}");
            assert_eq!(outcomes, total, "{what}");
            assert_eq!(n(&summary["requests"]["errors"]), total, "{what}");
            if kind == "HTTP/1" {
                assert!(n(&summary["outcomes"]["write_timeout"]) > 0, "{what}");
                assert_eq!(n(&summary["outcomes"]["read_timeout"]), 0, "{what}");
            }
        }
    }
}

/// SIGTERM in the middle of a long run against a peer that holds every unit (it never
/// reads; an event stream that never sends): each load kind ends in a bounded time, exit
/// 130, with its summary written, marked interrupted, every unit sent in one outcome.
#[test]
fn sigterm_against_a_stuck_peer_ends_every_kind_with_its_files_written() {
    let dir = scratch("sigterm-stuck-peer");
    let body = dir.join("body");
    std::fs::write(&body, vec![b'x'; 4 << 20]).unwrap();
    let never = serve_each(never_reads);
    let pinging = serve_each(pings_and_never_reads);
    let silent = serve_each(silent_events);
    let post = ["-X", "POST", "--body-file", &body.display().to_string()].map(str::to_owned);
    let kinds: [(&str, Vec<String>, String); 5] = [
        ("HTTP/1", post.to_vec(), format!("http://{never}/")),
        (
            "HTTP/2",
            [post.to_vec(), vec!["--http2".into()]].concat(),
            format!("http://{never}/"),
        ),
        (
            "gRPC",
            vec![
                "--grpc".into(),
                "--message-size".into(),
                (4 << 20).to_string(),
            ],
            format!("http://{never}/"),
        ),
        (
            "WebSocket",
            vec!["--websocket".into()],
            format!("ws://{pinging}/"),
        ),
        ("SSE", vec!["--sse".into()], format!("http://{silent}/")),
    ];
    for (kind, extra, url) in kinds {
        let json = dir.join(format!("{}.json", kind.replace('/', "")));
        let mut child = Command::new(BIN)
            .args([
                "load",
                "-R",
                "20",
                "-c",
                "2",
                "-d",
                "60s",
                "--timeout",
                "2s",
                "--json",
            ])
            .arg(&json)
            .args(&extra)
            .arg(&url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // After the connections' opening (which HTTP/2 waits for before its schedule
        // starts: up to the 2 s timeout against this peer), into the schedule.
        std::thread::sleep(Duration::from_millis(3500));
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        // Bounded: a request's timeout (2 s) and the drain, not the 60 s.
        let status = ends_within(
            &mut child,
            Duration::from_secs(40),
            &format!("{kind}: SIGTERM did not end the run"),
        );
        let out = child.wait_with_output().unwrap();
        let said = format!("{kind}: {status:?}\n{}", crate::common::text(&out));
        assert_eq!(status.code(), Some(130), "{said}");
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).expect(&said)).expect(&said);
        assert_eq!(summary["interrupted"], true, "{said}");
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        let total = n(&summary["requests"]["total"]);
        let outcomes: u64 = (summary["outcomes"].as_object().expect(&said).values())
            .map(n)
            .sum();
        assert!(total > 0, "{said}");
        assert_eq!(outcomes, total, "{said}");
        assert_eq!(n(&summary["requests"]["errors"]), total, "{said}");
    }
}

/// A failed attempt backs off even under `immediate`, and a stream that opens and ends at
/// once is a failed attempt: against a server that refuses every upgrade, and one that
/// ends every event stream at once, 4 connections over 3 s make a bounded number of
/// attempts (a count, not a timing: a fixed 10 ms retry made about 950).
#[test]
fn failed_and_instantly_ended_connections_back_off() {
    for (kind, serve, reconnect) in [
        (
            Kind::WebSocket as fn(StreamOptions) -> Kind,
            refuses_upgrades as fn(TcpStream),
            Reconnect::Immediate,
        ),
        (Kind::Sse, ends_each_stream_at_once, Reconnect::Immediate),
        (
            Kind::Sse,
            ends_each_stream_at_once,
            Reconnect::Backoff {
                first: Duration::from_millis(10),
                max: Duration::from_secs(1),
            },
        ),
    ] {
        let addr = serve_each(serve);
        let mut plan = stream_plan(
            &format!("http://{addr}/"),
            kind,
            20.0,
            Duration::from_secs(3),
        );
        plan.connections = 4;
        let options = StreamOptions {
            message_bytes: 64,
            reconnect,
        };
        plan.kind = kind(options);
        let load = run(&plan);
        let r = load.stream.as_deref().expect("a stream report");
        let attempts = r.opened + r.upgrade_failures.values().sum::<u64>();
        // 4 connections each doubling its wait from 10 ms to 1 s make about 40 in 3 s.
        assert!(attempts < 150, "{reconnect}: {attempts} attempts: {r:?}");
        assert!(attempts >= 4, "{reconnect}: {r:?}");
    }
}
