//! WebSocket load (issue #34) against the echo backend: every message accounted for,
//! a lossy server's drops and duplicates counted, and what a draining backend does to
//! its WebSockets, with and without a close.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ingressbench_load::websocket::{ClosedBy, Reconnect, WebSocketOptions, WebSocketReport};
use ingressbench_load::{Kind, Length, LoadReport, Mode, NoObserver, Plan, Target};
use ingressbench_stats::Outcome;

use crate::backend::Backend;

/// A WebSocket load of `backend`: `connections`, `rate` messages a second over them, for
/// `length`, a message unanswered for 300 ms counted lost.
fn plan(backend: &Backend, connections: usize, rate: f64, length: Duration) -> Plan {
    let mut plan = Plan::new(Target::parse(&format!("http://{}/ws", backend.addr)).unwrap());
    plan.kind = Kind::WebSocket(WebSocketOptions {
        message_bytes: 64,
        reconnect: Reconnect::Never,
    });
    plan.mode = Mode::Open { rate_per_s: rate };
    plan.connections = connections;
    plan.length = Length::Duration(length);
    plan.timeout = Duration::from_millis(300);
    plan
}

fn run(plan: &Plan) -> LoadReport {
    ingressbench_load::run(plan, Arc::new(AtomicBool::new(false)), &mut NoObserver).unwrap()
}

/// Every message sent is echoed, lost, or still out at the end; never two of them; and
/// the figures count each message once with the outcome that says what became of it.
fn accounted(load: &LoadReport) -> &WebSocketReport {
    let r = load.websocket.as_deref().expect("a WebSocket report");
    assert_eq!(r.echoed + r.lost + r.in_flight_at_end, r.sent, "{r:?}");
    let outcomes = load.recorder.outcomes();
    assert_eq!(outcomes.get(Outcome::Status(101)), r.echoed, "{r:?}");
    assert_eq!(load.recorder.latency().count(), r.echoed, "{r:?}");
    assert_eq!(
        outcomes.get(Outcome::ReadTimeout)
            + outcomes.get(Outcome::Eof)
            + outcomes.get(Outcome::ResetAfterWrite),
        r.lost,
        "{r:?}"
    );
    assert_eq!(outcomes.get(Outcome::NotSent), r.unsent, "{r:?}");
    let total = load.summary.requests.total;
    assert_eq!(
        total,
        r.sent + r.unsent - r.in_flight_at_end,
        "{:?}",
        load.summary
    );
    r
}

/// A server that leaves every 10th message of a WebSocket unanswered and answers every
/// 7th twice: the client counts those it lost and those it got twice, and each echo is
/// timed once.
#[test]
fn a_lossy_servers_drops_and_duplicates_are_counted_and_every_message_accounted_for() {
    let backend = Backend::start(&[
        "--listen",
        "127.0.0.1:0",
        "--name",
        "lossy",
        "--ws-drop-every",
        "10",
        "--ws-duplicate-every",
        "7",
    ]);
    let load = run(&plan(&backend, 4, 400.0, Duration::from_secs(3)));
    let r = accounted(&load);
    assert_eq!(r.opened, 4, "{r:?}");
    assert!(
        r.closes.is_empty() && r.upgrade_failures.is_empty(),
        "{r:?}"
    );
    assert!(
        (1140..=1260).contains(&r.sent),
        "3 s at 400 a second: {r:?}"
    );
    // Per WebSocket, floor(n / 10) dropped; over four of them within four of a tenth.
    let tenth = r.sent as f64 / 10.0;
    let missing = (r.lost + r.in_flight_at_end) as f64;
    assert!(
        (missing - tenth).abs() <= 4.0,
        "{missing} of {}: {r:?}",
        r.sent
    );
    // floor(n / 7) answered twice, less those dropped first (every 70th).
    let twice = r.sent as f64 / 7.0 - r.sent as f64 / 70.0;
    assert!((r.duplicated as f64 - twice).abs() <= 8.0, "{r:?}");
    assert_eq!(r.reordered, 0, "{r:?}");
    assert_eq!(r.late, 0, "{r:?}");
}

/// SIGTERM to the backend mid-run: by default it closes each WebSocket with 1001 and the
/// reason it gives, and the client records each close with the backend it was on; with
/// no reconnect, what falls due afterwards is counted unsent. Told not to close them, the
/// backend keeps echoing until its drain timeout drops the connections: each ends without
/// a close (1006), after the signal.
#[test]
fn a_draining_backend_closes_its_websockets_with_1001_or_drops_them_at_its_timeout() {
    for (flags, by, code) in [
        (&[][..], ClosedBy::Server, 1001),
        (
            &["--ws-no-close-on-drain", "--drain-timeout", "500ms"][..],
            ClosedBy::Abnormal,
            1006,
        ),
    ] {
        let mut backend = Backend::start(
            &[&["--listen", "127.0.0.1:0", "--name", "drained"][..], flags].concat(),
        );
        let plan = plan(&backend, 4, 200.0, Duration::from_secs(3));
        let load = std::thread::spawn(move || run(&plan));
        std::thread::sleep(Duration::from_secs(1));
        let (status, said) = backend.terminate();
        assert!(status.success(), "{said}");
        assert!(said.contains("4 WebSockets"), "{said}");
        let load = load.join().unwrap();
        let r = accounted(&load);
        assert_eq!(r.closes.len(), 4, "{r:?}");
        for close in &r.closes {
            assert_eq!((close.by, close.code), (by, code), "{close:?}");
            assert_eq!(close.backend.as_deref(), Some("drained"), "{close:?}");
            // After the signal (sent about a second in).
            assert!(close.at_s > 0.5, "{close:?}");
            if by == ClosedBy::Server {
                assert_eq!(close.reason, "backend draining");
            }
        }
        // Nothing sent after the closes: about the last 1 to 2 s of 3 s at 200 a second.
        assert!(r.unsent >= 150 && r.unsent + r.sent <= 610, "{r:?}");
    }
}
