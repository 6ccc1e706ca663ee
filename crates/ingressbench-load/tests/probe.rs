//! The route probe against a server whose routes change at instants it records itself:
//! each route's first right answer (a new route's, a removed one's, a changed one's new
//! revision) comes after its change, its last wrong one before,
//! answers that are neither are counted, and a route that never changes is never right.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ingressbench_load::probe::{Expect, ProbeOptions, ProbeRoute, Prober};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod support;

/// What the server answers for a host: a status, the backend it names and the route's
/// revision (in `x-revision`, when above 0).
type Table = Arc<Mutex<HashMap<String, (u16, &'static str, u32)>>>;

/// The header the server names a route's revision in.
const REVISION: &str = "x-revision";

/// A keep-alive HTTP/1.1 server answering from `table` by `Host` (404 for an unknown host).
fn server(table: Table) -> (SocketAddr, tokio::runtime::Runtime) {
    let (runtime, listener, addr) = support::listen();
    runtime.spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let table = table.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    buf.drain(..end + 4);
                    let host = head
                        .lines()
                        .find_map(|l| l.strip_prefix("Host: "))
                        .unwrap_or_default()
                        .to_owned();
                    let (status, backend, revision) = table
                        .lock()
                        .unwrap()
                        .get(&host)
                        .copied()
                        .unwrap_or((404, "", 0));
                    let revision = if revision > 0 {
                        format!("{REVISION}: {revision}\r\n")
                    } else {
                        String::new()
                    };
                    let answer = format!(
                        "HTTP/1.1 {status} X\r\nx-backend: {backend}\r\n{revision}content-length: 0\r\n\r\n"
                    );
                    if socket.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, runtime)
}

fn route(host: &str, expect: Expect) -> ProbeRoute {
    ProbeRoute {
        host: host.into(),
        path: "/".into(),
        expect,
    }
}

#[test]
fn each_route_is_right_after_its_change_and_wrong_before_it() {
    let table: Table = Arc::default();
    for (host, revision) in [("old.test", 0), ("edited.test", 1)] {
        table
            .lock()
            .unwrap()
            .insert(host.into(), (200, "echo-1", revision));
    }
    let (addr, _runtime) = server(table.clone());
    let options = ProbeOptions {
        revision_header: Some(REVISION),
        ..ProbeOptions::default()
    };
    let prober = Prober::start(addr, options, || Ok(())).unwrap();
    let requested = Instant::now();
    let added = Expect::Added {
        pool: "echo".into(),
    };
    prober.probe(
        0,
        vec![
            route("a.test", added.clone()),
            route("b.test", added.clone()),
            route("never.test", added.clone()),
            route(
                "old.test",
                Expect::Removed {
                    pool: "echo".into(),
                },
            ),
            route(
                "edited.test",
                Expect::Changed {
                    pool: "echo".into(),
                    revision: 2,
                },
            ),
        ],
        requested,
    );
    // The server changes its routes one after another, keeping when each changed; b
    // answers 503 for a while first (a reload's wrong answers).
    std::thread::sleep(Duration::from_millis(50));
    let mut changed = HashMap::new();
    let mut set = |host: &str, answer: (u16, &'static str, u32)| {
        table.lock().unwrap().insert(host.into(), answer);
        changed.insert(host.to_owned(), Instant::now());
    };
    set("a.test", (200, "echo-2", 0));
    std::thread::sleep(Duration::from_millis(20));
    set("b.test", (503, "", 0));
    std::thread::sleep(Duration::from_millis(20));
    set("b.test", (200, "echo-1", 0));
    std::thread::sleep(Duration::from_millis(20));
    set("old.test", (404, "", 0));
    std::thread::sleep(Duration::from_millis(20));
    set("edited.test", (200, "echo-1", 2));
    let deadline = Instant::now() + Duration::from_secs(10);
    while prober.settled() < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let jobs = prober.finish().jobs;
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    for r in &job.routes {
        if r.host == "never.test" {
            assert!(r.right_at.is_none(), "{r:?}");
            assert!(r.probes > 1, "{r:?}");
            continue;
        }
        let at = changed[&r.host];
        let right = r
            .right_at
            .unwrap_or_else(|| panic!("{} never right", r.host));
        let wrong = r.last_wrong_at.expect("wrong before the change");
        assert_eq!(r.requested_at, requested);
        // The change falls between the last wrong probe's send and the first right
        // one's answer: the bracket the probe states as its resolution.
        let answered = r.right_answered_at.expect("answered");
        assert!(wrong < at, "{}: last wrong after the change", r.host);
        assert!(at <= answered, "{}: right before the change", r.host);
        assert!(wrong < right && right <= answered, "{r:?}");
    }
    assert!(
        job.wrong.get("503").is_some_and(|n| *n >= 1),
        "{:?}",
        job.wrong
    );
    assert_eq!(job.wrong.len(), 1, "{:?}", job.wrong);
}

#[test]
fn a_later_change_takes_over_a_pending_route_and_the_rate_holds() {
    let table: Table = Arc::default();
    let (addr, _runtime) = server(table.clone());
    let options = ProbeOptions {
        rate_per_s: 200.0,
        ..ProbeOptions::default()
    };
    let prober = Prober::start(addr, options, || Ok(())).unwrap();
    let added = Expect::Added {
        pool: "echo".into(),
    };
    let hosts: Vec<String> = (0..20).map(|i| format!("r{i}.test")).collect();
    let routes = |expect: &Expect| {
        hosts
            .iter()
            .map(|h| route(h, expect.clone()))
            .collect::<Vec<_>>()
    };
    let started = Instant::now();
    prober.probe(0, routes(&added), started);
    std::thread::sleep(Duration::from_millis(300));
    // The same routes, removed before they were ever added: job 0 gives them up and
    // job 1 finds them right (404) at once.
    let removed = Expect::Removed {
        pool: "echo".into(),
    };
    prober.probe(1, routes(&removed), Instant::now());
    let deadline = Instant::now() + Duration::from_secs(10);
    while prober.settled() < 40 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = started.elapsed();
    let jobs = prober.finish().jobs;
    assert!(jobs[0].routes.iter().all(|r| r.right_at.is_none()));
    assert!(jobs[1].routes.iter().all(|r| r.right_at.is_some()));
    // No more probes than the rate allows over the time it ran (one slot of slack per
    // connection).
    let probes: u32 = jobs.iter().flat_map(|j| &j.routes).map(|r| r.probes).sum();
    let allowed = (elapsed.as_secs_f64() * 200.0).ceil() as u32 + 4;
    assert!(probes <= allowed, "{probes} probes in {elapsed:?}");
}
