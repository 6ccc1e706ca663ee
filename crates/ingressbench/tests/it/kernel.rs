//! Kernel settings per node: a node's namespace gets its sysctls while the machine keeps
//! its own, a proxy's listen backlog is what the kernel says it got, and a small accept
//! queue drops connections a deep one takes (counted by the client and by the kernel).
//! These run as root (CI does): namespaces need it.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ingressbench_lab::kernel::{ListenCounters, Sysctls};
use ingressbench_lab::labfile::TopologyFile;
use ingressbench_lab::proxy::ProxyKind;
use ingressbench_lab::{Lab, LabSpec};
use ingressbench_load::{run, Length, Mode, NoObserver, Plan, Target};

use crate::common::BIN;

/// An nginx lab on one node of its own namespace, with `settings` on it.
fn tuned_lab(settings: &[(&str, &str)], listen_backlog: Option<u32>) -> Lab {
    lab_of(ProxyKind::Nginx, settings, listen_backlog)
}

/// A lab of `kind` on one node of its own namespace, with `settings` on it.
fn lab_of(kind: ProxyKind, settings: &[(&str, &str)], listen_backlog: Option<u32>) -> Lab {
    let mut spec = LabSpec::simple(vec![kind], 1, BIN.into());
    spec.tls = false;
    let file: TopologyFile = serde_yaml_ng::from_str("{ isolation: netns }").unwrap();
    spec.topology = file.to_topology().unwrap();
    spec.sysctls.proxies = settings
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect::<Sysctls>();
    spec.tuning.listen_backlog = listen_backlog;
    Lab::up(spec).unwrap_or_else(|e| panic!("{kind} lab: {e}"))
}

/// A setting as `ip netns exec` reads it inside the namespace: not the tool's own reader.
fn read_inside(netns: &Path, name: &str) -> String {
    let ns = netns.file_name().unwrap().to_string_lossy().into_owned();
    let path = format!("/proc/sys/{}", name.replace('.', "/"));
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, "cat", &path])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    normal(&String::from_utf8_lossy(&out.stdout))
}

fn read_here(name: &str) -> String {
    normal(&std::fs::read_to_string(format!("/proc/sys/{}", name.replace('.', "/"))).unwrap())
}

fn normal(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn a_node_namespace_gets_its_settings_and_the_machine_keeps_its_own() {
    let names = ["net.core.somaxconn", "net.ipv4.ip_local_port_range"];
    let before: Vec<String> = names.iter().map(|n| read_here(n)).collect();
    // Values the machine does not have, so that a leak would show.
    let somaxconn = if before[0] == "200" { "201" } else { "200" };
    let range = if before[1] == "20000 30000" {
        "20001 30000"
    } else {
        "20000 30000"
    };
    let lab = tuned_lab(&[(names[0], somaxconn), (names[1], range)], Some(1000));
    let node = &lab.nodes()[0];
    let netns = node.netns.as_deref().expect("a namespace");
    assert_eq!(read_inside(netns, names[0]), somaxconn);
    assert_eq!(read_inside(netns, names[1]), range);
    let after: Vec<String> = names.iter().map(|n| read_here(n)).collect();
    assert_eq!(after, before, "the machine's own values changed");
    // nginx asked for 1000 (its configuration says so); the kernel gave it somaxconn.
    let conf = std::fs::read_to_string(lab.proxies()[0].files().config_path("nginx.conf"))
        .unwrap_or_default();
    assert!(conf.contains("backlog=1000"), "{conf}");
    let record = lab.kernel();
    eprintln!("{record:#?}");
    let listener = &record.listeners[0];
    assert_eq!(listener.port, lab.proxies()[0].http_port());
    assert_eq!(listener.backlog, Some(somaxconn.parse::<u64>().unwrap()));
    assert_eq!(record.sysctls[&node.name][names[0]], somaxconn);
    assert_eq!(record.sysctls[&node.name][names[1]], range);
    assert!(record.open_files["nginx"] > 0);
}

/// What `connections` new connections at once saw while nginx was stopped (SIGSTOP) for
/// half a second: connects that took 900 ms or more (a SYN the kernel dropped is sent
/// again after 1 s), failed requests, and the kernel's listen-queue counters.
fn burst_against_stopped_proxy(somaxconn: u32, connections: usize) -> (u64, u64, ListenCounters) {
    let lab = tuned_lab(&[("net.core.somaxconn", &somaxconn.to_string())], None);
    let before = lab.listen_counters()[0].1;
    let client = lab.client_netns().unwrap();
    let mut plan = Plan::new(Target::parse(&lab.proxies()[0].http_url()).unwrap());
    plan.mode = Mode::Closed;
    plan.connections = connections;
    plan.length = Length::Requests(connections as u64);
    // One request per connection, all at once: a burst of new connections.
    plan.keepalive = false;
    plan.timeout = Duration::from_secs(20);
    let group = rustix::process::Pid::from_raw(lab.proxies()[0].pid() as i32).unwrap();
    rustix::process::kill_process_group(group, rustix::process::Signal::STOP).unwrap();
    let load = std::thread::spawn(move || {
        ingressbench_lab::topology::enter_netns(&client).unwrap();
        run(&plan, Arc::new(AtomicBool::new(false)), &mut NoObserver).unwrap()
    });
    std::thread::sleep(Duration::from_millis(500));
    rustix::process::kill_process_group(group, rustix::process::Signal::CONT).unwrap();
    let report = load.join().unwrap();
    let connect = &report.recorder.phases().connect;
    let slow = connect.count() - connect.as_hdr().count_between(0, 899_999);
    let counters = lab.listen_counters()[0].1.since(before);
    eprintln!(
        "somaxconn {somaxconn}: {} connects, {slow} of them 900 ms or more (max {} us), {} errors ({:?}), kernel {counters:?}",
        connect.count(),
        connect.max(),
        report.summary.requests.errors,
        report.summary.outcomes
    );
    (slow, report.summary.requests.errors, counters)
}

#[test]
fn a_small_accept_queue_drops_connections_a_deep_one_takes() {
    let _heavy = crate::common::heavy();
    let (slow_small, errors_small, small) = burst_against_stopped_proxy(16, 200);
    let (slow_deep, errors_deep, deep) = burst_against_stopped_proxy(4096, 200);
    // The kernel's own count: a queue of 16 overflowed, one of 4096 (nginx's 511) took
    // the burst. Not always zero there: once in CI, with the whole suite in one process
    // beside a local cluster, the deep queue's namespace counted 15 overflows against the
    // small one's 766, with no slow connect at all.
    assert!(small.overflows > 0, "somaxconn 16: {small:?}");
    assert!(
        deep.overflows * 10 < small.overflows,
        "somaxconn 4096: {deep:?}; 16: {small:?}"
    );
    // The client's: connects that waited for a SYN sent again (or failed outright).
    assert!(
        slow_small + errors_small >= 100,
        "somaxconn 16: {slow_small} slow connects, {errors_small} errors of 200"
    );
    assert!(
        (slow_deep + errors_deep) * 10 < slow_small + errors_small,
        "somaxconn 4096: {slow_deep} slow connects, {errors_deep} errors; 16: {slow_small}, {errors_small}"
    );
}

#[test]
fn each_proxy_listens_with_the_backlog_it_was_given_or_its_own() {
    // nginx, HAProxy and Envoy take a backlog; Traefik and Caddy (Go) listen with
    // somaxconn. What counts is what the kernel gave each listener (ss), not the file.
    let cases = [
        (ProxyKind::Nginx, Some(300), 300),
        (ProxyKind::Haproxy, Some(300), 300),
        (ProxyKind::Envoy, Some(300), 300),
        (ProxyKind::Nginx, None, 511),
        (ProxyKind::Traefik, None, 700),
        (ProxyKind::Caddy, None, 700),
    ];
    for (kind, asked, want) in cases {
        let lab = lab_of(kind, &[("net.core.somaxconn", "700")], asked);
        let record = lab.kernel();
        let got: Vec<Option<u64>> = record.listeners.iter().map(|l| l.backlog).collect();
        assert!(!got.is_empty(), "{kind}: {record:?}");
        for b in got {
            assert_eq!(b, Some(want), "{kind} asked for {asked:?}: {record:?}");
        }
    }
}

/// `ingressbench scenario check` of a scenario whose `extra` lines ask for kernel
/// settings: its exit code and what it said.
fn check_scenario(extra: &str) -> (Option<i32>, String) {
    let dir = std::env::temp_dir().join(format!("ib-kernel-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("s.yaml");
    std::fs::write(
        &file,
        format!("name: k\ntls: false\nload: {{ mode: open, rate: 10, duration: 2s }}\n{extra}"),
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["scenario", "check"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn settings_that_would_touch_the_machine_are_refused_before_anything_starts() {
    let netns = "targets: [nginx]\ntopology: { isolation: netns }\n";
    let cases = [
        // Loopback nodes share the machine's namespace.
        (
            "targets: [nginx]\ntuning: { sysctls: { net.core.somaxconn: 128 } }\n".to_owned(),
            "set topology.isolation: netns",
        ),
        // Not a net.* setting: machine-wide.
        (
            format!("{netns}tuning: {{ sysctls: {{ fs.file-max: 100000 }} }}\n"),
            "only net.* settings",
        ),
        // A net.* setting this kernel keeps machine-wide.
        (
            format!("{netns}tuning: {{ sysctls: {{ net.core.netdev_max_backlog: 5000 }} }}\n"),
            "machine-wide, not per network namespace",
        ),
        (
            format!("{netns}tuning: {{ nodes: {{ nowhere: {{ net.core.somaxconn: 64 }} }} }}\n"),
            "`nowhere` is not a node of this lab",
        ),
        (
            "targets: [{ proxy: traefik, listen_backlog: 100 }]\n".to_owned(),
            "traefik has no listen backlog setting",
        ),
    ];
    for (extra, says) in cases {
        let (code, err) = check_scenario(&extra);
        assert_eq!(code, Some(2), "{extra}: {err}");
        assert!(err.contains(says), "{extra}: {err}");
    }
    let (code, err) = check_scenario("targets: [nginx]\ntopology: { isolation: netns }\ntuning: { sysctls: { net.core.somaxconn: 128 } }\nmatrix: { tuning.sysctls.net.core.somaxconn: [128, 4096] }\n");
    assert_eq!(code, Some(0), "{err}");
}
