//! gRPC (issue #34) from the echo backend and through the lab's proxies: unary calls
//! answered with their statuses, a lossy server's skipped and repeated stream messages
//! counted, what a draining backend does to its streams (UNAVAILABLE, or dropped at its
//! timeout), streams cut by a resetting link resumed after their last message without
//! losing or repeating one, and calls a GOAWAY refused sent again as gRPC's clients do.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ingressbench_load::stream::{ClosedBy, Reconnect, StreamFile, StreamKind, StreamOptions};
use ingressbench_load::{Kind, Length, LoadReport, Mode, NoObserver, Plan, Target};
use ingressbench_stats::Outcome;

use crate::process::Backend;
use crate::websocket::{json, run_scenario};

/// A gRPC load of `addr` (h2c): `connections`, `rate` calls (stream messages) a second
/// over them, for 3 s, one not answered 300 ms after it was due counted lost.
fn plan(addr: &std::net::SocketAddr, stream: bool, rate: f64, reconnect: Reconnect) -> Plan {
    let mut plan = Plan::new(Target::parse(&format!("http://{addr}/")).unwrap());
    let options = StreamOptions {
        message_bytes: 64,
        reconnect,
    };
    plan.kind = if stream {
        Kind::GrpcStream(options)
    } else {
        Kind::Grpc(options)
    };
    plan.mode = Mode::Open { rate_per_s: rate };
    plan.connections = 4;
    plan.length = Length::Duration(Duration::from_secs(3));
    plan.timeout = Duration::from_millis(300);
    plan
}

fn run(plan: &Plan) -> LoadReport {
    ingressbench_load::run(plan, Arc::new(AtomicBool::new(false)), &mut NoObserver).unwrap()
}

/// Every call (message) due was answered (came), lost, never sent or still out at the
/// end; never two of them; each counted once in the figures, answered ones by status.
fn accounted(load: &LoadReport, kind: StreamKind) -> &StreamFile {
    let r = load.stream.as_deref().expect("a gRPC report");
    assert_eq!(r.kind, kind);
    assert_eq!(r.echoed + r.lost + r.in_flight_at_end, r.sent, "{r:?}");
    let outcomes = load.recorder.outcomes();
    assert_eq!(outcomes.get(Outcome::grpc(0)), r.echoed, "{r:?}");
    assert_eq!(outcomes.get(Outcome::NotSent), r.unsent, "{r:?}");
    // What was still out at the end is a failure the figures count, not a blank.
    assert_eq!(
        outcomes.get(Outcome::WaitingAtEnd),
        r.in_flight_at_end,
        "{r:?}"
    );
    assert_eq!(
        load.summary.requests.total,
        r.sent + r.unsent,
        "{:?}",
        load.summary
    );
    r
}

/// Unary calls straight to the backend, one in five answered INTERNAL by its injected
/// errors: every call is answered, with its own sequence number, and counted by status;
/// the errors' latency is an answer's (in the histogram), not a time to failure.
#[test]
fn unary_calls_are_answered_with_their_status_each_counted_once() {
    let backend = Backend::start(&["--listen", "127.0.0.1:0", "--error-rate", "0.2"]);
    let load = run(&plan(&backend.addr, false, 400.0, Reconnect::Never));
    let r = accounted(&load, StreamKind::Grpc);
    let outcomes = load.recorder.outcomes();
    let internal = outcomes.get(Outcome::grpc(13));
    assert!((1_190..=1_200).contains(&r.sent), "{r:?}");
    assert_eq!(r.echoed + internal, r.sent - r.in_flight_at_end, "{r:?}");
    assert!(
        (internal as f64 / r.sent as f64 - 0.2).abs() < 0.06,
        "{internal} of {}",
        r.sent
    );
    assert_eq!(load.recorder.latency().count(), r.echoed + internal);
    assert_eq!((r.opened, r.cut, r.unsent), (4, 0, 0), "{r:?}");
    assert_eq!(
        outcomes.get(Outcome::Malformed),
        0,
        "every answer its own call's"
    );
}

/// A server that skips every 10th stream message and sends every 7th twice: the skipped
/// ones are lost at once (the next id shows the gap), the repeats duplicated.
#[test]
fn a_lossy_grpc_stream_is_counted_message_by_message() {
    let backend = Backend::start(&[
        "--listen",
        "127.0.0.1:0",
        "--ws-drop-every",
        "10",
        "--ws-duplicate-every",
        "7",
    ]);
    let load = run(&plan(&backend.addr, true, 400.0, Reconnect::Never));
    let r = accounted(&load, StreamKind::GrpcStream);
    assert!((1_190..=1_200).contains(&(r.sent + r.unsent)), "{r:?}");
    let skipped = r.sent as f64 / 10.0;
    assert!((r.lost as f64 - skipped).abs() <= 6.0, "{r:?}");
    crate::sse::skips_lost_at_their_timeout(&load, r);
    let twice = r.sent as f64 / 7.0 - r.sent as f64 / 70.0;
    assert!((r.duplicated as f64 - twice).abs() <= 8.0, "{r:?}");
    assert_eq!(r.late, 0, "{r:?}");
}

/// SIGTERM to the backend mid-run: by default it says GOAWAY and ends each stream with
/// UNAVAILABLE ("backend draining"), which the client records with the backend it was
/// on; told not to, it keeps sending until its drain timeout drops the connections, and
/// each stream breaks off with the connection, after the signal.
#[test]
fn a_draining_backend_ends_its_grpc_streams_unavailable_or_drops_them_at_its_timeout() {
    for (flags, by, status, reason) in [
        (
            &[][..],
            ClosedBy::Server,
            Some("grpc:unavailable"),
            "grpc:unavailable: backend draining",
        ),
        (
            &["--ws-no-close-on-drain", "--drain-timeout", "500ms"][..],
            ClosedBy::Abnormal,
            None,
            "the connection broke",
        ),
    ] {
        let mut backend = Backend::start(
            &[&["--listen", "127.0.0.1:0", "--name", "drained"][..], flags].concat(),
        );
        let plan = plan(&backend.addr, true, 200.0, Reconnect::Never);
        let load = std::thread::spawn(move || run(&plan));
        std::thread::sleep(Duration::from_secs(1));
        let (exit, said) = backend.terminate();
        assert!(exit.success(), "{said}");
        assert!(said.contains("4 gRPC streams"), "{said}");
        let load = load.join().unwrap();
        let r = accounted(&load, StreamKind::GrpcStream);
        assert_eq!(r.closes.len(), 4, "{r:?}");
        for close in &r.closes {
            assert_eq!(close.by, by, "{close:?}");
            assert_eq!(close.grpc_status.as_deref(), status, "{close:?}");
            assert!(close.reason.starts_with(reason), "{close:?}");
            assert_eq!(close.backend.as_deref(), Some("drained"), "{close:?}");
            assert!(close.at_s > 0.5, "{close:?}");
        }
        assert!(r.unsent >= 150 && r.unsent + r.sent <= 600, "{r:?}");
    }
}

/// A link that resets the connection at random (2% of the chunks it carries): each cut
/// stream is asked again on a new connection from the message after the last it saw, and
/// no message is lost or repeated; every cut is counted and reconnected.
#[test]
fn grpc_streams_cut_by_a_resetting_link_resume_after_their_last_message() {
    let backend = Backend::start(&["--listen", "127.0.0.1:0"]);
    let relay = crate::common::resetting_link(backend.addr);
    let mut plan = plan(&relay.addr(), true, 200.0, Reconnect::Immediate);
    plan.timeout = Duration::from_secs(2);
    let load = run(&plan);
    let r = accounted(&load, StreamKind::GrpcStream);
    assert!(
        r.cut >= 3,
        "a 2% reset over 600 messages cuts a few streams: {r:?}"
    );
    assert_eq!(
        (r.lost, r.duplicated, r.late, r.unsent),
        (0, 0, 0, 0),
        "{r:?}"
    );
    assert_eq!(r.echoed + r.in_flight_at_end, 600, "{r:?}");
    for close in &r.closes {
        assert_eq!(close.by, ClosedBy::Abnormal, "{close:?}");
        assert!(
            close.reconnected_after_ms.is_some() || close.at_s > 2.9,
            "{close:?}"
        );
    }
}

/// Unary calls through nginx and Envoy (TLS, HTTP/2 to the backends: nginx's grpc_pass)
/// across a reload and a scale-down: nginx's old worker says GOAWAY on every client
/// connection at the reload, the calls it refused (or that found the connection gone)
/// are sent again on a new one, as gRPC's clients do, and none fails; Envoy keeps its
/// connections at a reload. At the scale-down the backend removed says GOAWAY to the
/// proxy's upstream connections: a call that races it can fail (retries are off in the
/// lab, grpc_next_upstream too), a handful at most (seen: 1 or 2 of 1,000): 502 from
/// nginx, `grpc:unavailable` from Envoy (which answers a gRPC call's failed upstream
/// attempt with gRPC's status; seen in CI, session 50), or from nginx a call its old
/// worker reset after it was written (`reset_after_write`: seen once in 1,000 with
/// another test beside it), and nothing else fails.
#[test]
fn unary_calls_through_a_reload_are_sent_again_after_a_goaway_and_none_fails() {
    let (_dir, out, said) = run_scenario(
        "grpc-reload",
        "name: grpc-reload
targets: [nginx, envoy]
backends: [{ name: echo, replicas: 2 }]
tls: true
load:
  kind: grpc
  rate: 200
  connections: 4
  duration: 5s
  timeout: 2s
events:
  - { at: 1.5s, reload: true }
  - { at: 3s, scale: 1 }
",
    );
    let mut seen = Vec::new();
    for cell in crate::common::cells_of(&out) {
        let name = cell.file_name().unwrap().to_string_lossy().into_owned();
        let summary = json(cell.join("summary.json"));
        let grpc = json(cell.join("grpc.json"));
        let outcomes = summary["outcomes"].as_object().unwrap();
        assert!(
            outcomes["grpc:ok"].as_u64().unwrap() > 990,
            "{name}: {outcomes:?}"
        );
        let failed: u64 = outcomes
            .iter()
            .filter(|(k, _)| *k != "grpc:ok")
            .map(|(k, v)| {
                let races: &[&str] = if name.contains("nginx") {
                    &["502", "reset_after_write"]
                } else {
                    &["grpc:unavailable"]
                };
                assert!(races.contains(&k.as_str()), "{name}: {outcomes:?}");
                v.as_u64().unwrap()
            })
            .sum();
        assert!(failed <= 4, "{name}: {outcomes:?}");
        let reload = &json(cell.join("impact.json"))[0];
        assert_eq!(reload["what"], "reload", "{name}");
        // Only the races above, if any (CI saw nginx reset one call written as it closed
        // the connection at the reload: `reset_after_write`, not safe to send again).
        assert!(
            reload["errors"].as_u64().unwrap() <= failed,
            "{name}: {reload}"
        );
        let cut = reload["websocket"]["cut"].as_u64().unwrap();
        if name.contains("nginx") {
            assert_eq!(cut, 4, "{name}: every connection said GOAWAY: {reload}");
            assert_eq!(reload["websocket"]["reconnected"], 4, "{name}: {reload}");
        } else {
            assert_eq!(cut, 0, "{name}: Envoy keeps its connections: {reload}");
        }
        seen.push(format!(
            "{name}: {} connections cut at the reload, {} opened, {failed} failed, retried {}",
            cut, grpc["opened"], summary["retries"]["after"]
        ));
    }
    assert_eq!(seen.len(), 2, "{said}");
    println!("{}", seen.join("\n"));
}

/// gRPC through nginx needs its TLS listener (its plain port is HTTP/1.1 here), and
/// gRPC is HTTP/2 to the backends: both refused before anything starts, with the fix.
#[test]
fn grpc_where_a_proxy_cannot_carry_it_is_refused_with_the_fix() {
    let dir = crate::common::scratch("grpc-refused");
    for (yaml, says) in [
        (
            "name: a\ntargets: [nginx]\ntls: false\nload: { kind: grpc_stream, rate: 10, duration: 1s }\n",
            "needs `tls: true`",
        ),
        (
            "name: b\ntargets: [{ proxy: envoy, upstream_protocol: http1 }]\ntls: true\nload: { kind: grpc, rate: 10, duration: 1s }\n",
            "drop upstream_protocol",
        ),
    ] {
        let file = dir.join("scenario.yaml");
        std::fs::write(&file, yaml).unwrap();
        let check = std::process::Command::new(crate::common::BIN)
            .args(["scenario", "check"])
            .arg(&file)
            .output()
            .unwrap();
        let said = crate::common::text(&check);
        assert_eq!(check.status.code(), Some(2), "{said}");
        assert!(said.contains(says), "{said}");
    }
}
