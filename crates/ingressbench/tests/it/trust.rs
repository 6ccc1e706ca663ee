//! The trust boundary on a shared machine: while a lab runs, what it started runs as the
//! lab's own unprivileged user, listens on TCP only where traffic is measured, and no
//! other local user (`nobody` here, switched to with util-linux `setpriv`) reaches a
//! control interface of it or reads a file of it. And a request body larger than every
//! proxy's buffer goes through each of the five.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ingressbench_lab::backend::BODY_HEADER;
use ingressbench_lab::identity::lab_identity;
use ingressbench_lab::proxy::ProxyKind;
use ingressbench_lab::{HopSpec, Lab, LabSpec};
use ingressbench_load::{run, Length, Mode, NoObserver, Plan, Target};

use crate::common::{live_processes, BIN};

/// The stranger: the kernel's overflow user, which owns nothing of the lab.
const NOBODY: &str = "65534";

/// Runs `program args` as [`NOBODY`], with no groups; returns its exit code and output.
fn as_nobody(program: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            "--",
            program,
        ])
        .args(args)
        .output()
        .expect("setpriv runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Every live process in the process groups `groups`.
fn members(groups: &[u32]) -> Vec<u32> {
    live_processes()
        .into_iter()
        .filter(|(_, f)| {
            f.get(2)
                .and_then(|g| g.parse().ok())
                .is_some_and(|g| groups.contains(&g))
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// The real, effective, saved and file-system user ids of `pid`.
fn uids(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|ids| {
            ids.split_whitespace()
                .filter_map(|i| i.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The socket inodes `pid` holds open.
fn socket_inodes(pid: u32) -> BTreeSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.trim_end_matches(']').to_owned())
        })
        .collect()
}

/// The TCP ports (IPv4 and IPv6) that `pid` listens on.
fn listening_ports(pid: u32) -> BTreeSet<u16> {
    let inodes = socket_inodes(pid);
    let mut ports = BTreeSet::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(3) == Some(&"0A") && f.get(9).is_some_and(|i| inodes.contains(*i)) {
                let port = f[1].rsplit(':').next().unwrap();
                ports.insert(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports
}

/// Every regular file and directory under `dir`, links not followed.
fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
    found.push(dir.to_owned());
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            walk(&entry.path(), found);
        } else if kind.is_file() {
            found.push(entry.path());
        }
    }
}

/// One HTTP/1.1 request over a Unix socket, as the tool itself sends it: the answer's
/// status line.
fn admin_get(socket: &Path, path: &str) -> String {
    let mut s = UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("the tool reaches {}: {e}", socket.display()));
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: \r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn no_other_local_user_reaches_a_running_lab() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test switches to another user: run it as root (CI does)"
    );
    let lab_user = lab_identity()
        .unwrap()
        .expect("root runs the lab as a user of its own");
    // All five proxies, TLS, an Envoy sidecar with mutual TLS to the backends; and an L4
    // front over two HAProxy replicas.
    let mut spec = LabSpec::simple(ProxyKind::ALL.to_vec(), 2, BIN.into());
    spec.hop = Some(HopSpec { mtls: true });
    let lab = Lab::up(spec).unwrap_or_else(|e| panic!("lab: {e}"));
    let mut fronted = LabSpec::simple(vec![ProxyKind::Haproxy], 1, BIN.into());
    fronted.front = Some(2);
    let fronted = Lab::up(fronted).unwrap_or_else(|e| panic!("lab with a front: {e}"));

    let mut groups = Vec::new();
    let mut data_ports = BTreeSet::new();
    for l in [&lab, &fronted] {
        for p in l.proxies().iter().chain(l.sidecar()) {
            groups.push(p.pid());
            data_ports.insert(p.http_port());
            data_ports.extend(p.https_port());
        }
        for b in l.backends() {
            groups.push(b.pid());
            data_ports.insert(b.addr.port());
        }
        if let Some(front) = l.front() {
            groups.push(front.pid());
            data_ports.insert(front.http_addr().port());
            data_ports.extend(front.https_addr().map(|a| a.port()));
        }
    }
    let processes = members(&groups);
    // 5 proxies (nginx's worker and HAProxy's worker besides), the sidecar, 2 backends;
    // 2 HAProxy replicas, the front, a backend.
    assert!(processes.len() >= 12, "{processes:?}");
    for &pid in &processes {
        let ids = uids(pid);
        assert!(
            ids.len() == 4 && ids.iter().all(|&u| u == lab_user.uid),
            "process {pid} runs as {ids:?}, not the lab's user {}",
            lab_user.uid
        );
        let extra: Vec<u16> = listening_ports(pid)
            .difference(&data_ports)
            .copied()
            .collect();
        assert!(
            extra.is_empty(),
            "process {pid} listens on TCP ports {extra:?}, which carry no measured traffic (a control interface?)"
        );
    }

    // The control sockets answer the tool (so that a refusal below means something)...
    let socket = |kind: ProxyKind| {
        let p = lab.proxies().iter().find(|p| p.kind() == kind).unwrap();
        p.files().admin_socket.clone()
    };
    assert!(admin_get(&socket(ProxyKind::Caddy), "/config/").contains(" 200 "));
    assert!(admin_get(&socket(ProxyKind::Envoy), "/ready").contains(" 200 "));
    let sidecar_socket = lab.sidecar().unwrap().files().admin_socket.clone();
    assert!(admin_get(&sidecar_socket, "/ready").contains(" 200 "));
    let mut haproxy = UnixStream::connect(socket(ProxyKind::Haproxy)).unwrap();
    haproxy.write_all(b"show info\n").unwrap();
    let mut info = String::new();
    haproxy.read_to_string(&mut info).unwrap();
    assert!(info.contains("Name: HAProxy"), "{info}");

    // ... and nobody else, however it asks: Caddy's admin API (which could load a
    // file_server over the lab's keys), Envoy's (which could fail its health checks),
    // HAProxy's runtime API and its master CLI (which could reload it or stop it).
    let master = socket(ProxyKind::Haproxy).with_file_name("master.sock");
    assert!(master.exists(), "{}", master.display());
    for path in [
        socket(ProxyKind::Caddy),
        socket(ProxyKind::Envoy),
        socket(ProxyKind::Haproxy),
        master,
        sidecar_socket,
    ] {
        let path = path.display().to_string();
        let (code, out) = as_nobody(
            "curl",
            &[
                "-sS",
                "-m",
                "5",
                "-X",
                "POST",
                "--unix-socket",
                &path,
                "http://x/load",
            ],
        );
        assert_eq!(code, 7, "nobody connected to {path}: {out}");
        assert!(
            out.contains("Couldn't connect") || out.contains("Permission denied"),
            "{out}"
        );
    }

    // No file of either lab is readable by nobody, nor any directory listable; a file
    // nobody may read, beside them, is read (the probe itself works).
    let mut paths = Vec::new();
    walk(lab.dir(), &mut paths);
    walk(fronted.dir(), &mut paths);
    assert!(paths.len() > 30, "{paths:?}");
    assert!(paths.iter().any(|p| p.ends_with("server.key")));
    let scratch = crate::common::scratch("trust-open");
    let open = scratch.join("readable");
    std::fs::write(&open, "x").unwrap();
    let mut probe = vec![
        "-c".to_owned(),
        r#"for f in "$@"; do if [ -d "$f" ]; then ls "$f" >/dev/null 2>&1 && echo "LISTED $f"; elif head -c1 "$f" >/dev/null 2>&1; then echo "READ $f"; fi; done"#.to_owned(),
        "probe".to_owned(),
        open.display().to_string(),
    ];
    probe.extend(paths.iter().map(|p| p.display().to_string()));
    let args: Vec<&str> = probe.iter().map(String::as_str).collect();
    let (_, out) = as_nobody("sh", &args);
    let read: Vec<&str> = out.lines().collect();
    assert_eq!(
        read,
        [format!("READ {}", open.display())],
        "nobody read or listed these of the lab"
    );
}

/// `n` POSTs of `bytes` bytes through `url`: the outcomes, and the answers counted by the
/// body size the backend says it received.
fn post(url: &str, bytes: usize, n: u64) -> ingressbench_stats::Summary {
    let mut plan = Plan::new(Target::parse(url).unwrap());
    plan.mode = Mode::Closed;
    plan.connections = 2;
    plan.length = Length::Requests(n);
    plan.timeout = Duration::from_secs(10);
    plan.request.method = "POST".into();
    plan.request.body = vec![b'x'; bytes];
    plan.backend_header = BODY_HEADER.into();
    run(&plan, Arc::new(AtomicBool::new(false)), &mut NoObserver)
        .unwrap()
        .summary
}

#[test]
fn a_body_larger_than_every_buffer_goes_through_each_proxy() {
    // Over nginx's default limit (1 MiB) and far over its buffer (16 KiB), which it
    // spools to a temporary file in the lab's directory.
    let bytes = 1024 * 1024 + 1;
    let lab = Lab::up(LabSpec::simple(ProxyKind::ALL.to_vec(), 1, BIN.into()))
        .unwrap_or_else(|e| panic!("lab: {e}"));
    for proxy in lab.proxies() {
        let s = post(&proxy.http_url(), bytes, 20);
        assert_eq!(
            s.outcomes.get("200"),
            Some(&20),
            "{}: {:?} {:?}",
            proxy.kind(),
            s.outcomes,
            s.failure_details
        );
        assert_eq!(
            s.backends.get(&bytes.to_string()),
            Some(&20),
            "{}: the backend did not receive every body whole: {:?}",
            proxy.kind(),
            s.backends
        );
    }
}
