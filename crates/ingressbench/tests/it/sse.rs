//! Server-sent events (issue #34) from the echo backend: every event accounted for, a
//! lossy server's skipped and repeated events counted, what a draining backend does to
//! its streams, and streams cut mid-response resumed with `Last-Event-ID` without losing
//! or repeating an event.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ingressbench_load::stream::{ClosedBy, Reconnect, StreamFile, StreamKind, StreamOptions};
use ingressbench_load::{Kind, Length, LoadReport, Mode, NoObserver, Plan, Target};
use ingressbench_stats::Outcome;

use crate::process::Backend;

/// An event stream load of `addr`: `connections`, `rate` events a second over them, for
/// `length`, an event not come 300 ms after it was due counted lost.
fn plan(addr: &std::net::SocketAddr, connections: usize, rate: f64, reconnect: Reconnect) -> Plan {
    let mut plan = Plan::new(Target::parse(&format!("http://{addr}/events")).unwrap());
    plan.kind = Kind::Sse(StreamOptions {
        message_bytes: 64,
        reconnect,
    });
    plan.mode = Mode::Open { rate_per_s: rate };
    plan.connections = connections;
    plan.length = Length::Duration(Duration::from_secs(3));
    plan.timeout = Duration::from_millis(300);
    plan
}

fn run(plan: &Plan) -> LoadReport {
    ingressbench_load::run(plan, Arc::new(AtomicBool::new(false)), &mut NoObserver).unwrap()
}

/// Every event due came, was lost, was never sent or was still to come at the end; never
/// two of them; and the figures count each event once with the outcome that says what
/// became of it.
fn accounted(load: &LoadReport) -> &StreamFile {
    let r = load.stream.as_deref().expect("an event stream report");
    assert_eq!(r.kind, StreamKind::Sse);
    assert_eq!(r.echoed + r.lost + r.in_flight_at_end, r.sent, "{r:?}");
    let outcomes = load.recorder.outcomes();
    assert_eq!(outcomes.get(Outcome::Status(200)), r.echoed, "{r:?}");
    assert_eq!(load.recorder.latency().count(), r.echoed, "{r:?}");
    assert_eq!(
        outcomes.get(Outcome::ReadTimeout)
            + outcomes.get(Outcome::Eof)
            + outcomes.get(Outcome::Unanswered),
        r.lost,
        "{r:?}"
    );
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

/// A server that skips every 10th event and sends every 7th twice: the skipped ones are
/// lost when their timeout passes (a gap on a live stream may still fill), the repeats
/// duplicated, the rest came.
#[test]
fn a_lossy_event_stream_is_counted_event_by_event() {
    let backend = Backend::start(&[
        "--listen",
        "127.0.0.1:0",
        "--ws-drop-every",
        "10",
        "--ws-duplicate-every",
        "7",
    ]);
    let load = run(&plan(&backend.addr, 4, 400.0, Reconnect::Never));
    let r = accounted(&load);
    // 1,200 events due over 3 s; a stream's last skipped event shows no gap before the end.
    assert!((1_190..=1_200).contains(&(r.sent + r.unsent)), "{r:?}");
    // The only ends: a stream whose last event was skipped ends without it.
    assert!(r.closes.iter().all(|c| c.at_s > 2.9), "{r:?}");
    let skipped = r.sent as f64 / 10.0;
    assert!((r.lost as f64 - skipped).abs() <= 6.0, "{r:?}");
    skips_lost_at_their_timeout(&load, r);
    let twice = r.sent as f64 / 7.0 - r.sent as f64 / 70.0;
    assert!((r.duplicated as f64 - twice).abs() <= 8.0, "{r:?}");
    assert_eq!(r.late, 0, "{r:?}");
}

/// On a live stream a gap waits its timeout (a later event may fill it, reordered): a
/// skipped one is lost then, or with the stream's end (`eof`, the gaps of its last
/// timeout), or `unanswered` at the run's end. Event streams and gRPC streams alike.
pub(crate) fn skips_lost_at_their_timeout(load: &LoadReport, r: &StreamFile) {
    let outcomes = load.recorder.outcomes();
    assert_eq!(
        outcomes.get(Outcome::ReadTimeout)
            + outcomes.get(Outcome::Eof)
            + outcomes.get(Outcome::Unanswered),
        r.lost,
        "{r:?}"
    );
    assert!(outcomes.get(Outcome::ReadTimeout) > r.lost / 2, "{r:?}");
}

/// SIGTERM to the backend mid-run: by default it ends each stream's response, and the
/// client records each end with the backend it was on; with no reconnect, what falls due
/// afterwards is never sent. Told not to end them, the backend keeps sending until its
/// drain timeout drops the connections: each breaks off mid-response, after the signal.
#[test]
fn a_draining_backend_ends_its_event_streams_or_drops_them_at_its_timeout() {
    for (flags, by, reason) in [
        (&[][..], ClosedBy::Server, "the response ended"),
        (
            &["--ws-no-close-on-drain", "--drain-timeout", "500ms"][..],
            ClosedBy::Abnormal,
            "the connection ended mid-response",
        ),
    ] {
        let mut backend = Backend::start(
            &[&["--listen", "127.0.0.1:0", "--name", "drained"][..], flags].concat(),
        );
        let plan = plan(&backend.addr, 4, 200.0, Reconnect::Never);
        let load = std::thread::spawn(move || run(&plan));
        std::thread::sleep(Duration::from_secs(1));
        let (status, said) = backend.terminate();
        assert!(status.success(), "{said}");
        assert!(said.contains("4 event streams"), "{said}");
        let load = load.join().unwrap();
        let r = accounted(&load);
        assert_eq!(r.closes.len(), 4, "{r:?}");
        for close in &r.closes {
            assert_eq!((close.by, close.code), (by, None), "{close:?}");
            assert_eq!(close.reason, reason, "{close:?}");
            assert_eq!(close.backend.as_deref(), Some("drained"), "{close:?}");
            assert!(close.at_s > 0.5, "{close:?}");
        }
        // Nothing came after the ends: about the last 1 to 2 s of 3 s at 200 a second.
        assert!(r.unsent >= 150 && r.unsent + r.sent <= 600, "{r:?}");
    }
}

/// A link that resets the connection at random (2% of the chunks it carries, an event a
/// chunk): each cut stream resumes after the last id it saw, the event the reset dropped
/// comes on the resumed stream, and no event is lost or repeated; every cut is counted
/// and reconnected.
#[test]
fn a_cut_event_stream_resumes_after_its_last_id_losing_and_repeating_nothing() {
    let backend = Backend::start(&["--listen", "127.0.0.1:0"]);
    let relay = crate::common::resetting_link(backend.addr);
    let mut plan = plan(&relay.addr(), 4, 200.0, Reconnect::Immediate);
    // Long enough that an event replayed on the resumed stream is in time, not late.
    plan.timeout = Duration::from_secs(2);
    let load = run(&plan);
    let r = accounted(&load);
    assert!(
        r.cut >= 3,
        "a 2% reset over 600 events cuts a few streams: {r:?}"
    );
    assert_eq!(
        (r.lost, r.duplicated, r.late, r.unsent),
        (0, 0, 0, 0),
        "{r:?}"
    );
    assert_eq!(r.echoed + r.in_flight_at_end, 600, "{r:?}");
    // Every cut came back, unless it came in the run's last moment.
    let back = r.closes.iter().filter(|c| c.reconnected_after_ms.is_some());
    assert_eq!(r.opened, 4 + back.count() as u64, "{r:?}");
    for close in &r.closes {
        assert_eq!(close.lost, 0, "{close:?}");
        assert!(
            close.reconnected_after_ms.is_some() || close.at_s > 2.9,
            "{close:?}"
        );
    }
}
