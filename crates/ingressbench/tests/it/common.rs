//! What the end-to-end test modules share.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Output;

/// The binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_ingressbench");

/// An empty directory of this test process's own, named by `tag` (which the caller makes
/// unique: its module's name first). It goes when dropped if the test passed, and stays
/// for a look if it failed.
pub(crate) fn scratch(tag: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("ib-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// A test's scratch directory: [`scratch`].
pub(crate) struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The resident memory of process `pid` now, in bytes, as /proc says.
pub(crate) fn rss_bytes(pid: u32) -> f64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap();
    let pages: f64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * rustix::param::page_size() as f64
}

/// Whether process `pid` still exists (and is not a zombie).
pub(crate) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
    })
}

/// Every live (non-zombie) process: its pid and the fields of `/proc/PID/stat` after the
/// command name (`state ppid pgrp …`).
pub(crate) fn live_processes() -> Vec<(u32, Vec<String>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
        if fields.first().is_some_and(|s| s != "Z") {
            found.push((pid, fields));
        }
    }
    found
}

/// What a finished command printed, standard output then standard error.
pub(crate) fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A threaded HTTP/1.1 server on 127.0.0.1:0 answering 200 with `x-backend: cli`.
pub(crate) fn server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || answer(stream));
        }
    });
    addr
}

fn answer(stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => {}
            }
        }
        let body = "hello from the cli test server\n";
        let response = format!(
            "HTTP/1.1 200 OK\r\nx-backend: cli\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// The cells of the run in `out`, in running order.
pub(crate) fn cells_of(out: &std::path::Path) -> Vec<PathBuf> {
    let mut cells: Vec<PathBuf> = std::fs::read_dir(out.join("cells"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    cells.sort();
    cells
}

/// Percentiles of the answered requests' latency computed from a samples file (plain or
/// `.gz`) written at sample rate 1: every request, from every worker. Returns how many
/// rows it has.
pub(crate) fn from_samples(path: &std::path::Path) -> (u64, ingressbench_stats::HistogramUs) {
    use std::io::Read;
    let mut csv = String::new();
    let file = std::fs::File::open(path).unwrap();
    if path.extension().is_some_and(|e| e == "gz") {
        flate2::read::GzDecoder::new(file).read_to_string(&mut csv)
    } else {
        std::io::BufReader::new(file).read_to_string(&mut csv)
    }
    .unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (latency, status) = (col("latency_s"), col("status"));
    let mut h = ingressbench_stats::HistogramUs::new();
    let mut rows = 0;
    for line in lines {
        let fields: Vec<&str> = line.split(',').collect();
        rows += 1;
        if !fields[status].is_empty() {
            let s: f64 = fields[latency].parse().unwrap();
            h.record_us((s * 1e6).round() as u64);
        }
    }
    (rows, h)
}

/// The samples file holds microseconds rounded, the histogram truncated: one value apart,
/// which at most moves a figure by one unit of the histogram's resolution.
pub(crate) fn close(merged: u64, union: u64) -> bool {
    merged.abs_diff(union) <= 1.max(union / 1000)
}

/// A directory `bin` under `dir` holding a `go` that runs `script` (a shell body), and a
/// PATH with it first: for tests of what the set-up builds with Go.
pub(crate) fn fake_go(dir: &Path, script: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("fake-bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("go"), format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(bin.join("go"), std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// How many requests an interval log (`latency.hlog`) counts: the sum of its windows'
/// outcomes.
pub(crate) fn hlog_requests(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("#outcomes "))
        .flat_map(|l| l.split_whitespace().skip(1))
        .filter_map(|kv| kv.split_once('=').and_then(|(_, n)| n.parse::<u64>().ok()))
        .sum()
}

/// Waits for `child` to end by itself; kills it and fails with `why` if it has not after
/// `limit` (a hang detector, not a timing: the limit is far above what the run takes).
pub(crate) fn ends_within(
    child: &mut std::process::Child,
    limit: std::time::Duration,
    why: &str,
) -> std::process::ExitStatus {
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("{why}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Held by the tests that keep every core busy (a thousand routes through five proxies,
/// chromium, a million samples) or whose figures a busy machine moves most (coordinated
/// omission across workers, a rate the target cannot take): at most one of them runs at
/// a time, beside the tests that mostly wait. (The capacity searches need the machine to
/// themselves: tests/capacity.rs.) A test that failed while holding it does not stop the
/// others.
pub(crate) fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A link in front of `addr` that resets the connection at 2% of the chunks it carries:
/// long-lived streams through it are cut again and again.
pub(crate) fn resetting_link(addr: SocketAddr) -> ingressbench_lab::relay::Relay {
    let link = ingressbench_lab::relay::LinkSpec {
        reset: 0.02,
        ..Default::default()
    };
    ingressbench_lab::relay::Relay::start("127.0.0.1:0".parse().unwrap(), addr, link, false, None)
        .unwrap()
}
