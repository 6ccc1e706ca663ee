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

/// Each of the five proxies carries 8 WebSockets through a reload and a scale-down of
/// two backends to one (`load.kind: websocket` in a scenario). What each proxy does at
/// the reload is measured, not assumed: the test holds what must be true of any proxy and
/// prints the rest. Every message is accounted for in the cell's files (the summary's
/// messages are websocket.json's sent and never sent); a proxy either keeps every
/// WebSocket through its reload or cuts them, and a cut one is ended with a close frame,
/// not dropped; the backend that scales away closes its WebSockets with 1001 and its
/// reason, and every proxy hands that close to the client as it was (not as a broken
/// connection); with `reconnect: immediate` every connection has a WebSocket again by
/// the end; each event's window in impact.json says what it cut.
#[test]
fn every_proxy_carries_websockets_through_a_reload_and_a_scale_down() {
    let dir = crate::common::scratch("websocket-proxies");
    let file = dir.join("ws.yaml");
    std::fs::write(
        &file,
        "name: ws
targets: [nginx, haproxy, envoy, traefik, caddy]
backends: [{ name: echo, replicas: 2 }]
tls: false
load:
  kind: websocket
  websocket: { message_bytes: 64, reconnect: immediate }
  rate: 200
  connections: 8
  duration: 4s
  timeout: 1s
  sample_rate: 1
events:
  - { at: 1500ms, reload: true }
  - { at: 3s, scale: 1 }
",
    )
    .unwrap();
    let out = dir.join("results");
    let run = std::process::Command::new(crate::common::BIN)
        .args([
            "run",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let said = crate::common::text(&run);
    assert!(run.status.success(), "{said}");
    let json = |path: std::path::PathBuf| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    };
    let mut measured = Vec::new();
    for cell in crate::common::cells_of(&out) {
        let name = cell.file_name().unwrap().to_string_lossy().into_owned();
        let ws = json(cell.join("websocket.json"));
        let summary = json(cell.join("summary.json"));
        let n = |v: &serde_json::Value| v.as_u64().unwrap();
        let total = n(&summary["requests"]["total"]);
        assert_eq!(
            total + n(&ws["in_flight_at_end"]),
            n(&ws["sent"]) + n(&ws["unsent"]),
            "{name}: {ws}"
        );
        assert_eq!(
            n(&summary["requests"]["ok"]),
            n(&ws["echoed"]),
            "{name}: {ws}"
        );
        // Every connection has a WebSocket at the end.
        let open = ws["open_over_time"].as_array().unwrap();
        assert_eq!(open.last().unwrap()[1], 8, "{name}: {open:?}");
        let impact = json(cell.join("impact.json"));
        let events = impact.as_array().unwrap();
        assert_eq!(events.len(), 2, "{name}: {impact}");
        let (reload, scale) = (&events[0]["websocket"], &events[1]["websocket"]);
        let cut_at_reload = n(&reload["cut"]);
        assert!(cut_at_reload == 0 || cut_at_reload == 8, "{name}: {reload}");
        for close in ws["closes"].as_array().unwrap() {
            assert_eq!(close["by"], "server", "{name}: {close}");
            assert!(close["reconnected_after_ms"].is_number(), "{name}: {close}");
        }
        // The backend scaled away closed its WebSockets itself, with its reason, and the
        // proxy handed each close on as it was.
        let drained: Vec<&serde_json::Value> = ws["closes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["reason"] == "backend draining")
            .collect();
        assert!(!drained.is_empty(), "{name}: {ws}");
        for c in &drained {
            assert_eq!(c["code"], 1001, "{name}: {c}");
            assert!(c["at_s"].as_f64().unwrap() >= 2.9, "{name}: {c}");
        }
        assert!(n(&scale["cut"]) >= drained.len() as u64, "{name}: {scale}");
        measured.push(format!(
            "{name}: reload cut {cut_at_reload} of 8 ({}), scale-down cut {} ({}), messages lost {}, reconnect p99 {} ms",
            reload["by_code"], scale["cut"], scale["by_code"], ws["lost"], scale["reconnect_p99_ms"]
        ));
    }
    assert_eq!(measured.len(), 5, "{said}");
    println!("{}", measured.join("\n"));
    // The report says it per proxy and event, and refuses a websocket.json that does not
    // agree with its cell's summary.
    let report = std::process::Command::new(crate::common::BIN)
        .args(["report", out.to_str().unwrap()])
        .output()
        .unwrap();
    let said = crate::common::text(&report);
    for target in ["nginx", "haproxy", "envoy", "traefik", "caddy"] {
        assert!(
            said.contains(&format!("{target}, repeat 1 (cell "))
                && said.contains("of 8 WebSockets cut"),
            "{said}"
        );
    }
    let first = crate::common::cells_of(&out)
        .remove(0)
        .join("websocket.json");
    let mut ws = json(first.clone());
    ws["sent"] = (ws["sent"].as_u64().unwrap() + 1).into();
    std::fs::write(&first, ws.to_string()).unwrap();
    let report = std::process::Command::new(crate::common::BIN)
        .args(["report", out.to_str().unwrap()])
        .output()
        .unwrap();
    let said = crate::common::text(&report);
    assert!(
        said.contains("UNREADABLE") && said.contains("websocket.json counts"),
        "{said}"
    );
}

/// A `restart` of each proxy under WebSocket load: its own graceful stop, at most a
/// second's grace, then a new process on the same ports. Whatever a proxy does with its
/// WebSockets at the stop (measured: some close them, some keep them to the grace's end),
/// a new process cannot hold the old one's connections, so every WebSocket ends between
/// the request and the grace's end, and every connection has one again from the new
/// process by the end. The proxy's CPU follows the new process (it never goes down).
#[test]
fn a_restarted_proxy_ends_every_websocket_and_its_clients_come_back() {
    let dir = crate::common::scratch("websocket-restart");
    let file = dir.join("restart.yaml");
    std::fs::write(
        &file,
        "name: restart
targets: [nginx, haproxy, envoy, traefik, caddy]
backends: [{ name: echo, replicas: 1 }]
tls: false
load:
  kind: websocket
  websocket: { reconnect: 'backoff:50ms-500ms' }
  rate: 100
  connections: 4
  duration: 5s
  timeout: 1s
events:
  - { at: 1s, restart: true, grace: 1s }
",
    )
    .unwrap();
    let out = dir.join("results");
    let run = std::process::Command::new(crate::common::BIN)
        .args([
            "run",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let said = crate::common::text(&run);
    assert!(run.status.success(), "{said}");
    let json = |path: std::path::PathBuf| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    };
    let mut measured = Vec::new();
    for cell in crate::common::cells_of(&out) {
        let name = cell.file_name().unwrap().to_string_lossy().into_owned();
        let ws = json(cell.join("websocket.json"));
        let restart = &json(cell.join("impact.json"))[0];
        assert_eq!(restart["what"], "restart", "{name}: {restart}");
        let requested = restart["requested_s"].as_f64().unwrap();
        let cut = &restart["websocket"];
        assert_eq!(cut["cut"], 4, "{name}: {cut}");
        assert_eq!(cut["reconnected"], 4, "{name}: {cut}");
        for close in ws["closes"].as_array().unwrap() {
            let at = close["at_s"].as_f64().unwrap();
            assert!(at >= requested && at < requested + 2.0, "{name}: {close}");
        }
        let open = ws["open_over_time"].as_array().unwrap();
        assert_eq!(open.last().unwrap()[1], 4, "{name}: {open:?}");
        // The proxy part's CPU never goes down across the restart.
        let usage = std::fs::read_to_string(cell.join("usage.jsonl")).unwrap();
        let cpu: Vec<f64> = usage
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["parts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|p| p["role"] == "proxy")
                    .map(|p| p["cpu_s"].as_f64().unwrap())
                    .sum()
            })
            .collect();
        assert!(cpu.windows(2).all(|w| w[1] >= w[0]), "{name}: {cpu:?}");
        measured.push(format!(
            "{name}: closes {} at {:?} s, reconnect p99 {} ms, upgrade failures {}",
            cut["by_code"],
            ws["closes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["at_s"].as_f64().unwrap() - requested)
                .fold(0.0, f64::max),
            cut["reconnect_p99_ms"],
            ws["upgrade_failures"]
        ));
    }
    assert_eq!(measured.len(), 5, "{said}");
    println!("{}", measured.join("\n"));
}

/// nginx's binary upgrade, HAProxy's master re-exec and Envoy's hot restart (`upgrade:
/// same`) under HTTP and under WebSocket load: no request fails; nginx's and HAProxy's
/// old workers keep their WebSockets (none is cut), while Envoy's old epoch keeps them
/// only until it is told to exit (a second after its drain), and they reconnect to the
/// new one; the events' mechanism says which was used.
#[test]
fn nginx_haproxy_and_envoy_upgrade_in_place_without_losing_a_request() {
    let dir = crate::common::scratch("websocket-upgrade");
    let file = dir.join("upgrade.yaml");
    std::fs::write(
        &file,
        "name: upgrade
targets: [nginx, haproxy, envoy]
backends: [{ name: echo, replicas: 2 }]
tls: false
load: { rate: 200, connections: 8, duration: 5s, timeout: 1s, retry: none }
events:
  - { at: 1500ms, upgrade: same, grace: 1s }
matrix:
  load.kind: [http, websocket]
",
    )
    .unwrap();
    let out = dir.join("results");
    let run = std::process::Command::new(crate::common::BIN)
        .args([
            "run",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let said = crate::common::text(&run);
    assert!(run.status.success(), "{said}");
    let json = |path: std::path::PathBuf| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    };
    let cells = crate::common::cells_of(&out);
    assert_eq!(cells.len(), 6, "{said}");
    for cell in cells {
        let name = cell.file_name().unwrap().to_string_lossy().into_owned();
        let summary = json(cell.join("summary.json"));
        assert_eq!(summary["requests"]["errors"], 0, "{name}: {summary}");
        assert!(
            summary["requests"]["ok"].as_u64().unwrap() >= 700,
            "{name}: {summary}"
        );
        let events = std::fs::read_to_string(cell.join("events.jsonl")).unwrap();
        let mechanism = if name.contains("nginx") {
            "binary upgrade (USR2, then WINCH and QUIT to the old master)"
        } else if name.contains("haproxy") {
            "master re-exec (USR2)"
        } else {
            "hot restart (a new epoch takes the listeners, the old drains)"
        };
        assert!(events.contains(mechanism), "{name}: {events}");
        if cell.join("websocket.json").exists() {
            let ws = json(cell.join("websocket.json"));
            if name.contains("envoy") {
                // Cut when the old epoch is told to exit: the upgrade at 1.5 s, 1 s of
                // drain, a second more; each reconnected.
                assert_eq!(ws["cut"], 8, "{name}: {ws}");
                for close in ws["closes"].as_array().unwrap() {
                    let at = close["at_s"].as_f64().unwrap();
                    assert!((3.4..4.5).contains(&at), "{name}: {close}");
                    assert!(close["reconnected_after_ms"].is_number(), "{name}: {close}");
                }
            } else {
                assert_eq!(ws["cut"], 0, "{name}: {ws}");
                assert_eq!(ws["opened"], 8, "{name}: {ws}");
            }
        }
    }
}
