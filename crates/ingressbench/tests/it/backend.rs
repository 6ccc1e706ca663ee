//! The echo backend as a real process: what it answers, how it drains, how it dies.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_lab::backend::PROTOCOL_HEADER;
use ingressbench_load::{run, Length, Mode, NoObserver, Plan, Protocol, Target};

use crate::common::BIN;
use crate::process::Backend;

fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn load(addr: SocketAddr, n: u64) -> ingressbench_stats::Summary {
    let mut plan = Plan::new(Target::parse(&format!("http://{addr}/")).unwrap());
    plan.mode = Mode::Closed;
    plan.connections = 4;
    plan.length = Length::Requests(n);
    run(&plan, Arc::new(AtomicBool::new(false)), &mut NoObserver)
        .unwrap()
        .summary
}

#[test]
fn answers_with_its_name_a_615_byte_body_and_the_echoed_path() {
    let b = Backend::start(&["--name", "b7"]);
    let response = get(b.addr, "/some/path?q=1");
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains("\r\nx-backend: b7\r\n"));
    assert!(response.contains("\r\nx-echo-path: /some/path\r\n"));
    assert!(response.contains("\r\nContent-Length: 615\r\n"));
    assert_eq!(response.split("\r\n\r\n").nth(1).unwrap().len(), 615);
    assert!(get(b.addr, "/healthz").ends_with("\r\n\r\nok\n"));
    let s = load(b.addr, 2000);
    assert_eq!(s.outcomes.get("200"), Some(&2000));
    assert_eq!(s.backends.get("b7"), Some(&2000));
}

/// HTTP/2 with prior knowledge (what a proxy speaks to an h2c upstream): the same answer,
/// many streams at once on one connection, each with the asked delay.
#[test]
fn answers_http2_with_prior_knowledge_as_it_answers_http1() {
    let mut b = Backend::start(&["--name", "b2", "--latency", "5ms"]);
    let mut plan = Plan::new(Target::parse(&format!("http://{}/some/path?q=1", b.addr)).unwrap());
    plan.protocol = Protocol::Http2;
    plan.streams = Some(10);
    plan.mode = Mode::Closed;
    plan.connections = 2;
    plan.length = Length::Requests(400);
    let s = run(&plan, Arc::new(AtomicBool::new(false)), &mut NoObserver)
        .unwrap()
        .summary;
    assert_eq!(
        s.outcomes.get("200"),
        Some(&400),
        "{:?} {:?}",
        s.outcomes,
        s.failure_details
    );
    assert_eq!(s.backends.get("b2"), Some(&400));
    assert_eq!(s.connection_events.http2_connections, 2);
    assert_eq!(s.connection_events.max_streams_in_flight, 10);
    assert_eq!(s.bytes_received, 400 * 615, "the body, as over HTTP/1.1");
    assert!(s.latency_us.p50 >= 5_000, "p50 {}", s.latency_us.p50);
    // HTTP/1.1 on the same port still works.
    let answer = get(b.addr, "/x");
    assert!(answer.contains("\r\nx-backend: b2\r\n"), "{answer}");
    assert!(
        answer.contains("\r\nx-backend-protocol: HTTP/1.1\r\n"),
        "{answer}"
    );
    // Every HTTP/2 answer says so (what a test of a proxy's HTTP/2 upstream reads).
    plan.backend_header = PROTOCOL_HEADER.to_owned();
    plan.length = Length::Requests(20);
    let s = run(&plan, Arc::new(AtomicBool::new(false)), &mut NoObserver)
        .unwrap()
        .summary;
    assert_eq!(s.backends.get("HTTP/2"), Some(&20), "{:?}", s.backends);
    let (status, stderr) = b.terminate();
    assert!(status.success());
    assert!(
        stderr.contains("drained after 5 connections (4 HTTP/2), 421 requests"),
        "{stderr}"
    );
}

#[test]
fn status_error_rate_and_latency_are_what_was_asked() {
    let b = Backend::start(&["--status", "503", "--body-bytes", "10"]);
    assert_eq!(load(b.addr, 50).outcomes.get("503"), Some(&50));

    let b = Backend::start(&["--error-rate", "0.3"]);
    let s = load(b.addr, 2000);
    let errors = *s.outcomes.get("500").unwrap_or(&0) as f64;
    assert!(
        (errors / 2000.0 - 0.3).abs() < 0.05,
        "{errors} errors of 2000"
    );

    let b = Backend::start(&["--latency", "20ms"]);
    let s = load(b.addr, 40);
    assert!(s.latency_us.p50 >= 20_000, "p50 {}", s.latency_us.p50);
}

#[test]
fn sigterm_drains_in_flight_requests_then_exits() {
    let mut b = Backend::start(&["--latency", "600ms"]);
    let addr = b.addr;
    let in_flight = std::thread::spawn(move || get(addr, "/slow"));
    std::thread::sleep(Duration::from_millis(200));
    let stop = std::thread::spawn(move || b.terminate());
    let response = in_flight.join().unwrap();
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "the in-flight request finished: {response}"
    );
    let (status, stderr) = stop.join().unwrap();
    assert!(status.success());
    assert!(
        stderr.contains("drained after 1 connections (0 HTTP/2), 1 requests"),
        "{stderr}"
    );
    assert!(TcpStream::connect(addr).is_err(), "no longer accepting");
}

#[test]
fn sigkill_is_a_crash_for_requests_in_flight() {
    let b = Backend::start(&["--latency", "2s"]);
    let addr = b.addr;
    let in_flight = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    });
    std::thread::sleep(Duration::from_millis(200));
    b.signal("-KILL");
    assert!(
        in_flight.join().unwrap().is_empty(),
        "no answer from a killed backend"
    );
}

#[test]
fn bad_options_exit_2() {
    for (args, expected) in [
        (
            vec!["--latency", "uniform:5ms-1ms"],
            "minimum is above the maximum",
        ),
        (vec!["--error-rate", "2"], "--error-rate"),
        (
            vec!["--stall-every", "1s", "--stall-for", "2s"],
            "shorter than its period",
        ),
        (vec!["--listen", "192.0.2.1:1"], "cannot listen on"),
    ] {
        let out = Command::new(BIN)
            .arg("backend")
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn stalls_hold_answers_for_their_length() {
    let b = Backend::start(&["--stall-every", "1s", "--stall-for", "300ms"]);
    let mut plan = Plan::new(Target::parse(&format!("http://{}/", b.addr)).unwrap());
    plan.mode = Mode::Open { rate_per_s: 200.0 };
    plan.connections = 100;
    plan.length = Length::Duration(Duration::from_secs(2));
    let s = run(&plan, Arc::new(AtomicBool::new(false)), &mut NoObserver)
        .unwrap()
        .summary;
    assert_eq!(s.requests.errors, 0);
    // About 30% of requests arrive in a stall and wait up to 300 ms; the rest do not.
    assert!(
        s.latency_us.max >= 250_000 && s.latency_us.max < 400_000,
        "max {}",
        s.latency_us.max
    );
    assert!(s.latency_us.p50 < 50_000, "p50 {}", s.latency_us.p50);
    assert!(s.latency_us.p90 > 100_000, "p90 {}", s.latency_us.p90);
}

/// `request` (a whole HTTP/1.1 request) to `addr`; what came back.
fn ask(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn the_control_endpoint_holds_every_answer_for_the_time_asked() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let control = free.local_addr().unwrap();
    drop(free);
    let backend = Backend::start(&[
        "--listen",
        "127.0.0.1:0",
        "--name",
        "held",
        "--control",
        &control.to_string(),
    ]);
    assert!(get(backend.addr, "/").contains("x-backend: held"));
    let post = |target: &str| {
        ask(
            control,
            &format!("POST {target} HTTP/1.1\r\nHost: c\r\n\r\n"),
        )
    };
    assert!(post("/nothing").starts_with("HTTP/1.1 404"));
    // Its own CPU and memory, as a controller's process collector names them: the
    // memory is what /proc says of the backend's process.
    let metrics = ask(control, "GET /metrics HTTP/1.1\r\nHost: c\r\n\r\n");
    let series = |name: &str| -> f64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name}: {metrics}"));
        line[name.len()..].trim().parse().unwrap()
    };
    let rss = crate::common::rss_bytes(backend.child.id());
    let said_rss = series("process_resident_memory_bytes");
    assert!(
        said_rss > rss * 0.5 && said_rss < rss * 2.0,
        "said {said_rss} bytes, /proc {rss}"
    );
    assert!(series("process_cpu_seconds_total") >= 0.0);
    assert!(post("/stall?for=soon").starts_with("HTTP/1.1 400"));
    let said = post("/stall?for=1500ms");
    assert!(said.starts_with("HTTP/1.1 200"), "{said}");
    // Answers, the health check's too, wait out the stall.
    let started = Instant::now();
    assert!(get(backend.addr, "/healthz").contains("200 OK"));
    let held = started.elapsed();
    assert!(held >= Duration::from_millis(1000), "held {held:?}");
}

/// A free port on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_control_endpoint_obeys_only_who_holds_its_token() {
    // With a token (as a cluster run's backends have, from a Secret): a stall without it,
    // or with another, is refused, and the backend keeps answering.
    let port = free_port();
    let token = "0123456789abcdef0123456789abcdef";
    let backend = Backend::start_with(
        &[
            "--listen",
            "127.0.0.1:0",
            "--name",
            "guarded",
            "--control",
            &format!("127.0.0.1:{port}"),
        ],
        &[("INGRESSBENCH_CONTROL_TOKEN", token)],
    );
    let control: SocketAddr = ([127, 0, 0, 1], port).into();
    let stall = |header: &str| {
        ask(
            control,
            &format!("POST /stall?for=60s HTTP/1.1\r\nHost: c\r\n{header}\r\n"),
        )
    };
    for refused in [
        String::new(),
        "x-ingressbench-token: 0123456789abcdef0123456789abcdee\r\n".into(),
        "x-ingressbench-token: 0123456789abcdef\r\n".into(),
        format!("authorization: Bearer {token}\r\n"),
    ] {
        let said = stall(&refused);
        assert!(said.starts_with("HTTP/1.1 403"), "{refused:?}: {said}");
    }
    assert!(get(backend.addr, "/healthz").contains("200 OK"), "not held");
    // /metrics reads, and is open.
    assert!(ask(control, "GET /metrics HTTP/1.1\r\nHost: c\r\n\r\n").starts_with("HTTP/1.1 200"));
    let said = ask(
        control,
        &format!(
            "POST /stall?for=1ms HTTP/1.1\r\nHost: c\r\nX-Ingressbench-Token: {token}\r\n\r\n"
        ),
    );
    assert!(said.starts_with("HTTP/1.1 200"), "{said}");
    // Without a token, on an address other pods reach (all of them here; asked through
    // loopback), no stall is obeyed, and it says so when it starts.
    let port = free_port();
    let mut open = Backend::start(&[
        "--listen",
        "127.0.0.1:0",
        "--name",
        "open",
        "--control",
        &format!("0.0.0.0:{port}"),
    ]);
    let said = ask(
        ([127, 0, 0, 1], port).into(),
        "POST /stall?for=60s HTTP/1.1\r\nHost: c\r\n\r\n",
    );
    assert!(said.starts_with("HTTP/1.1 403"), "{said}");
    assert!(get(open.addr, "/healthz").contains("200 OK"), "not held");
    let (_, stderr) = open.terminate();
    assert!(
        stderr.contains("has no token (INGRESSBENCH_CONTROL_TOKEN)"),
        "{stderr}"
    );
}

#[test]
fn a_body_of_any_size_is_counted_as_it_comes_and_the_next_request_still_parses() {
    let backend = Backend::start(&["--listen", "127.0.0.1:0", "--name", "big"]);
    // 3 MiB (far over the head limit), written slowly enough to arrive in many reads,
    // then a pipelined request on the same connection.
    let bytes = 3 * 1024 * 1024;
    let mut s = TcpStream::connect(backend.addr).unwrap();
    write!(
        s,
        "POST /up HTTP/1.1\r\nHost: b\r\nContent-Length: {bytes}\r\n\r\n"
    )
    .unwrap();
    for chunk in vec![b'y'; bytes].chunks(100_000) {
        s.write_all(chunk).unwrap();
    }
    s.write_all(b"GET /after HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let answers: Vec<&str> = out.matches("HTTP/1.1 200 OK").collect();
    assert_eq!(answers.len(), 2, "{out}");
    assert!(
        out.contains(&format!(
            "{}: {bytes}\r\n",
            ingressbench_lab::backend::BODY_HEADER
        )),
        "{out}"
    );
    assert!(out.contains("x-echo-path: /after"), "{out}");
    assert_eq!(
        out.matches(ingressbench_lab::backend::BODY_HEADER).count(),
        1
    );
}
