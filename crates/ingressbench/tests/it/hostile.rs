//! The tool used as a hostile or careless user would: results directories that already
//! hold a run, names that would leave `results/`, two writers at once. Each test goes
//! through the binary, where the user would meet the problem.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{alive, scratch, text, BIN};

/// A scenario of one upstream target (the test's own server) at 50 req/s for `duration`.
fn scenario(dir: &Path, name: &str, duration: &str) -> PathBuf {
    let addr = crate::common::server();
    let file = dir.join("scenario.yaml");
    std::fs::write(
        &file,
        format!(
            "name: {name}\ntargets: [{{ upstream: \"http://{addr}/\", name: up }}]\nload: {{ mode: open, rate: 50, connections: 2, duration: {duration} }}\n"
        ),
    )
    .unwrap();
    file
}

/// A server on 127.0.0.1:0 that accepts connections and never answers (it holds them).
fn silent_server() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    addr
}

/// `ingressbench run FILE --out OUT` in the background, its output captured.
fn spawn_run(file: &Path, out: &Path) -> std::process::Child {
    Command::new(BIN)
        .arg("run")
        .arg(file)
        .arg("--out")
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn run(file: &Path, extra: &[&str], cwd: &Path) -> Output {
    Command::new(BIN)
        .arg("run")
        .arg(file)
        .args(extra)
        .current_dir(cwd)
        .output()
        .unwrap()
}

#[test]
fn a_results_directory_that_holds_a_run_is_refused_unless_forced() {
    let dir = scratch("hostile-exists");
    let file = scenario(&dir, "exists", "300ms");
    let out = dir.join("out");
    let first = run(&file, &["--out", out.to_str().unwrap()], &dir);
    assert!(first.status.success(), "{}", text(&first));
    let before = std::fs::read(out.join("run.json")).unwrap();
    // Again into the same directory: refused as a usage error, nothing touched.
    let again = run(&file, &["--out", out.to_str().unwrap()], &dir);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    let said = text(&again);
    assert!(
        said.contains("already holds a run (status complete)")
            && said.contains("--resume")
            && said.contains("--force"),
        "{said}"
    );
    assert_eq!(std::fs::read(out.join("run.json")).unwrap(), before);
    // --force replaces it: a new run; it removes the cells the old run listed, and
    // nothing it did not make.
    std::fs::create_dir_all(out.join("cells").join("999-stale")).unwrap();
    let forced = run(&file, &["--out", out.to_str().unwrap(), "--force"], &dir);
    assert!(forced.status.success(), "{}", text(&forced));
    assert_ne!(std::fs::read(out.join("run.json")).unwrap(), before);
    assert!(out.join("cells").join("999-stale").exists());
}

#[test]
fn a_scenario_name_cannot_leave_the_results_directory() {
    let dir = scratch("hostile-name");
    let victim = dir.join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("run.json"), "{\"precious\": true}").unwrap();
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    for name in ["../../victim", "a/b", "..", "\"x\\ty\""] {
        let file = scenario(&work, name, "300ms");
        for command in [vec!["scenario", "check"], vec!["run"]] {
            let out = Command::new(BIN)
                .args(&command)
                .arg(&file)
                .current_dir(&work)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out));
            assert!(
                text(&out).contains("name: ")
                    && text(&out).contains("cannot name a results directory"),
                "{name}: {}",
                text(&out)
            );
        }
    }
    assert_eq!(
        std::fs::read_to_string(victim.join("run.json")).unwrap(),
        "{\"precious\": true}"
    );
    assert!(!work.join("results").exists(), "nothing was written");
}

#[test]
fn a_second_writer_is_refused_while_the_first_runs_and_the_first_completes() {
    let dir = scratch("hostile-lock");
    let file = scenario(&dir, "lock", "3s");
    let out = dir.join("out");
    let first = spawn_run(&file, &out);
    // Wait until the first holds the lock.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(out.join(".lock")).is_ok_and(|l| l.starts_with("process ")) {
        assert!(
            Instant::now() < deadline,
            "the first run never took the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Neither a second run, nor --force, nor --resume may write it meanwhile, even with
    // the lock file deleted (the directory itself is what is locked).
    std::fs::remove_file(out.join(".lock")).unwrap();
    for extra in [vec!["--force"], vec![]] {
        let mut args = vec!["--out", out.to_str().unwrap()];
        args.extend(extra);
        let second = run(&file, &args, &dir);
        assert_eq!(second.status.code(), Some(2), "{}", text(&second));
        assert!(
            text(&second).contains("is being written by"),
            "{}",
            text(&second)
        );
    }
    let resume = Command::new(BIN)
        .args(["run", "--resume", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(resume.status.code(), Some(2), "{}", text(&resume));
    let done = first.wait_with_output().unwrap();
    assert!(done.status.success(), "{}", text(&done));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["status"], "complete", "{record}");
    assert_eq!(record["cells"][0]["status"], "done", "{record}");
    assert!(record.get("resumed_by").is_none(), "{record}");
}

/// The pids of `parent`'s children whose command is `comm`.
fn children_named(parent: u32, comm: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let Some((head, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
            head.ends_with(&format!("({comm}")) && ppid == Some(parent)
        })
        .collect()
}

/// Runs `yaml` (one haproxy cell) and kills HAProxy, as a crash would, once `seconds`
/// of the cell have been measured; the run's output and record, and the scratch
/// directory (its results in `out`).
fn killed_mid_cell(
    tag: &str,
    yaml: &str,
    seconds: usize,
) -> (Output, serde_json::Value, crate::common::Scratch) {
    let dir = scratch(tag);
    let file = dir.join("crash.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = dir.join("out");
    let run = spawn_run(&file, &out);
    let hlog = out.join("cells").join("000-haproxy").join("latency.hlog");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&hlog)
        .map_or(0, |t| t.lines().filter(|l| !l.starts_with('#')).count())
        < seconds
    {
        assert!(
            Instant::now() < deadline,
            "the cell never started measuring"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let haproxy = children_named(run.id(), "haproxy");
    assert_eq!(haproxy.len(), 1, "{haproxy:?}");
    Command::new("kill")
        .args(["-KILL", &haproxy[0].to_string()])
        .status()
        .unwrap();
    let started = Instant::now();
    let done = run.wait_with_output().unwrap();
    assert_eq!(done.status.code(), Some(1), "{}", text(&done));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the run went on for {:?} after the proxy died",
        started.elapsed()
    );
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    (done, record, dir)
}

#[test]
fn a_proxy_that_dies_mid_cell_fails_the_cell_and_keeps_what_was_measured() {
    let (_, record, dir) = killed_mid_cell(
        "hostile-crash",
        "name: crash\ntargets: [haproxy]\nbackends: [{ name: echo, replicas: 2 }]\nload: { mode: open, rate: 100, connections: 5, duration: 20s, sample_rate: 1 }\n",
        3,
    );
    let out = dir.join("out");
    assert_eq!(record["status"], "failed", "{record}");
    let cell = &record["cells"][0];
    assert_eq!(cell["status"], "failed", "{cell}");
    let error = cell["error"].as_str().unwrap();
    assert!(
        error.contains("haproxy exited during the cell") && error.contains("signal: 9"),
        "{error}"
    );
    // What was measured before is kept: intervals and every sampled request.
    let samples = ingressbench_report::results::read_samples(
        &out,
        &["cells", "000-haproxy", "samples.csv.gz"],
        u64::MAX - 1,
    )
    .unwrap();
    assert!(samples.len() >= 100, "{} samples kept", samples.len());
}

/// A soak whose proxy dies 7 s in (a reload every 3 s, 30 s planned): the cell ends then,
/// failed with the time of death, and run.json keeps the soak's verdict on what came
/// before (its firings, the parts' figures, the tool's cost).
#[test]
fn a_proxy_that_dies_mid_soak_ends_its_cell_with_the_time_of_death_and_the_verdict_so_far() {
    let (_, record, _dir) = killed_mid_cell(
        "hostile-soak-crash",
        "name: crash\ntargets: [haproxy]\nbackends: [{ name: echo, replicas: 2 }]\nload: { mode: open, rate: 100, connections: 5, duration: 3s, sample_rate: 1 }\nevents:\n  - { at: 1s, reload: true }\nsoak: { duration: 30s, every: 2s }\n",
        7,
    );
    let cell = &record["cells"][0];
    assert_eq!(cell["status"], "failed", "{cell}");
    let error = cell["error"].as_str().unwrap();
    let died_at: f64 = error
        .split(" s into the cell")
        .next()
        .and_then(|t| t.rsplit(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("the time of death: {error}"));
    assert!((6.0..10.0).contains(&died_at), "{error}");
    assert!(error.contains("haproxy exited during the cell"), "{error}");
    let soak = &cell["soak"];
    let firings = soak["firings"].as_u64().unwrap_or_else(|| panic!("{cell}"));
    assert!((2..=3).contains(&firings), "{soak}");
    assert_eq!(soak["duration_s"], 30.0, "{soak}");
    assert!(
        soak["parts"].as_array().is_some_and(|p| p.len() == 3),
        "the proxy and two backends: {soak}"
    );
    assert!(soak["tool"]["rss_first_bytes"].as_u64() > Some(0), "{soak}");
}

#[test]
fn the_first_ctrl_c_acts_at_once_even_while_every_request_is_stalled() {
    let addr = silent_server();
    let dir = scratch("hostile-stalled");
    let json = dir.join("out.json");
    let load = Command::new(BIN)
        .args([
            "load",
            "-R",
            "20",
            "-c",
            "4",
            "-d",
            "60s",
            "--timeout",
            "60s",
            "--json",
        ])
        .arg(&json)
        .arg(format!("http://{addr}/"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    Command::new("kill")
        .args(["-INT", &load.id().to_string()])
        .status()
        .unwrap();
    let stopped = Instant::now();
    let done = load.wait_with_output().unwrap();
    // Far sooner than the 60 s timeout the stalled requests would otherwise wait out.
    assert!(
        stopped.elapsed() < Duration::from_secs(15),
        "took {:?} to stop",
        stopped.elapsed()
    );
    assert_eq!(done.status.code(), Some(130), "{}", text(&done));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(summary["interrupted"], true, "{summary}");
    // The 4 connections' requests were in flight: given up, counted as failures
    // (`waiting_at_end`), and said so.
    assert!(
        summary["abandoned_at_stop"].as_u64().unwrap() >= 1,
        "{summary}"
    );
    assert_eq!(
        summary["outcomes"]["waiting_at_end"], summary["abandoned_at_stop"],
        "{summary}"
    );
    assert!(
        summary["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().starts_with("WAITING AT THE END")),
        "{summary}"
    );
}

#[test]
fn more_connections_than_open_files_allowed_is_an_error_before_the_run() {
    let addr = crate::common::server();
    // A hard limit of 256 open files: 1000 connections cannot be opened.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -Sn 256 && ulimit -Hn 256 && exec {BIN} load -c 1000 -R 100 -d 1s http://{addr}/"
        ))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("1000 connections need 1064 open files")
            && said.contains("hard limit 256")
            && said.contains("ulimit -n 1064"),
        "{said}"
    );
    // Within the hard limit, the soft one is raised and the run goes ahead.
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -Sn 128 && exec {BIN} load -c 200 -R 100 -d 1s http://{addr}/"
        ))
        .output()
        .unwrap();
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(text(&ok).contains("100 requests"), "{}", text(&ok));
}

/// The largest resident size of `pid` seen while it runs, in KiB.
fn peak_rss_kib(child: &mut std::process::Child) -> u64 {
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()));
        let rss = status.ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        });
        peak = peak.max(rss.unwrap_or(0));
        std::thread::sleep(Duration::from_millis(50));
    }
    peak
}

#[test]
fn a_rate_the_target_cannot_take_keeps_memory_flat_and_says_what_was_offered() {
    let _heavy = crate::common::heavy();
    // Every request beyond the two in flight waits, and the schedule asks for 900,000 a
    // second, every request sampled (those never sent are counted, not written).
    let addr = silent_server();
    let dir = scratch("hostile-rate");
    let json = dir.join("out.json");
    let samples = dir.join("samples.csv.gz");
    let mut load = Command::new(BIN)
        .args([
            "load",
            "-R",
            "900000",
            "-c",
            "2",
            "-d",
            "4s",
            "--timeout",
            "1s",
            "--sample-rate",
            "1",
            "--samples",
        ])
        .arg(&samples)
        .arg("--json")
        .arg(&json)
        .arg(format!("http://{addr}/"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let peak = peak_rss_kib(&mut load);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "it ended by itself"
    );
    // Queued tickets would take hundreds of MiB here; the backlog is bounded.
    assert!(peak < 150 * 1024, "peak RSS {peak} KiB");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let not_sent = summary["outcomes"]["not_sent"].as_u64().unwrap_or(0);
    assert!(not_sent > 100_000, "{}", summary["outcomes"]);
    // What was offered is what went out: a few timed-out requests a second, not millions.
    let achieved = summary["rate"]["achieved_per_s"].as_f64().unwrap();
    assert!(achieved < 100.0, "{}", summary["rate"]);
    assert!(
        summary["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().starts_with("RATE SHORT OF TARGET")),
        "{summary}"
    );
    // Past what any number of connections could carry: refused before anything is sent,
    // with the arithmetic.
    for (rate, threads, most) in [("3000000", "1", "1000000"), ("10000000", "2", "2000000")] {
        let out = Command::new(BIN)
            .args([
                "load",
                "-R",
                rate,
                "--threads",
                threads,
                "-c",
                "4",
                "-d",
                "1s",
            ])
            .arg(format!("http://{addr}/"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            text(&out).contains(&format!("thread(s) can send at most {most} req/s")),
            "{}",
            text(&out)
        );
    }
}

/// Starts `run` of `scenario` (written in `dir`) with nginx replaced by the shell script
/// `script`: the run, its results directory and the script's path.
fn run_with_nginx(
    dir: &Path,
    script: &str,
    scenario: &str,
) -> (std::process::Child, PathBuf, PathBuf) {
    let fake = dir.join("nginx");
    std::fs::write(&fake, script).unwrap();
    Command::new("chmod")
        .arg("755")
        .arg(&fake)
        .status()
        .unwrap();
    let file = dir.join("scenario.yaml");
    std::fs::write(&file, scenario).unwrap();
    let out = dir.join("out");
    let run = Command::new(BIN)
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(&out)
        .arg("--proxy-bin")
        .arg(format!("nginx={}", fake.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (run, out, fake)
}

#[test]
fn a_proxy_binary_that_hangs_fails_its_cell_in_seconds_and_leaves_nothing() {
    let dir = scratch("hostile-hang");
    // Answers nothing, ever, not even its version; and forks a helper that would outlive it.
    let (mut run, out, fake) = run_with_nginx(
        &dir,
        "#!/bin/sh\nsleep 3600 &\nexec sleep 3600\n",
        "name: hang\ntargets: [nginx]\nbackends: [{ name: echo, replicas: 1 }]\nload: { mode: open, rate: 20, connections: 2, duration: 2s }\n",
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    while run.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = run.kill();
            panic!("the run was still waiting for the hanging binary after 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let done = run.wait_with_output().unwrap();
    assert_eq!(done.status.code(), Some(1), "{}", text(&done));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    let error = record["cells"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("does not behave like nginx")
            && error.contains("did not finish within 10s")
            && error.contains("--proxy-bin nginx=PATH"),
        "{error}"
    );
    // Neither the fake nor what it forked is left.
    let fake_path = fake.display().to_string();
    let left: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            alive(*pid)
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&fake_path))
        })
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn what_a_lab_leaves_when_the_tool_and_its_reaper_are_killed_goes_at_the_next_start() {
    let dir = scratch("hostile-reaped");
    let file = dir.join("left.yaml");
    std::fs::write(
        &file,
        "name: left\ntargets: [nginx]\nbackends: [{ name: echo, replicas: 1 }]\nload: { mode: open, rate: 50, connections: 2, duration: 60s }\n",
    )
    .unwrap();
    let out = dir.join("out");
    // A temporary directory of the test's own: labs are found there, and the tests beside
    // this one start the tool too, whose start would take what this one leaves first.
    let tmp = std::env::temp_dir().join(format!("ibr-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut run = Command::new(BIN)
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(&out)
        .env("TMPDIR", &tmp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let hlog = out.join("cells").join("000-nginx").join("latency.hlog");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&hlog).is_ok_and(|t| t.lines().any(|l| !l.starts_with('#'))) {
        assert!(
            Instant::now() < deadline,
            "the cell never started measuring"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let master = children_named(run.id(), "nginx");
    assert_eq!(master.len(), 1, "{master:?}");
    let workers = children_named(master[0], "nginx");
    assert!(!workers.is_empty(), "nginx has workers");
    let lab = std::fs::read_link(format!("/proc/{}/cwd", master[0]))
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    assert!(
        lab.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("ingressbench-lab-"),
        "{}",
        lab.display()
    );
    // The reaper and the backend.
    let helpers = children_named(run.id(), "ingressbench");
    assert_eq!(helpers.len(), 2, "{helpers:?}");
    // `kill -9` of every ingressbench process, the reaper before the tool (the tool's
    // death is what would wake the reaper up).
    Command::new("kill")
        .arg("-KILL")
        .args(helpers.iter().map(u32::to_string))
        .arg(run.id().to_string())
        .status()
        .unwrap();
    let _ = run.wait();
    std::thread::sleep(Duration::from_millis(300));
    // What nobody was left to clean: the workers (with nginx's listening port), the lab.
    assert!(
        workers.iter().any(|w| alive(*w)),
        "nothing was left to clean up"
    );
    assert!(lab.exists(), "{}", lab.display());
    // The next start of the tool, even for a run with no lab of its own, removes them.
    let quick = scenario(&dir, "next", "1s");
    let next = Command::new(BIN)
        .arg("run")
        .arg(&quick)
        .arg("--out")
        .arg(dir.join("next"))
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    assert!(next.status.success(), "{}", text(&next));
    assert!(
        text(&next).contains("left behind by an ingressbench that is gone"),
        "{}",
        text(&next)
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while workers.iter().any(|w| alive(*w)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let still: Vec<_> = workers.iter().filter(|w| alive(**w)).collect();
    assert!(still.is_empty(), "workers still alive: {still:?}");
    assert!(
        !lab.exists(),
        "{} (and its private key) is still there",
        lab.display()
    );
    let _ = std::fs::remove_dir_all(tmp);
}

/// `ingressbench load` for 1 s at 10 req/s with a JSON summary; returns the summary and
/// what was printed.
fn load_json(dir: &Path, url: &str, extra: &[&str]) -> (Output, Option<serde_json::Value>) {
    let json = dir.join("load.json");
    let _ = std::fs::remove_file(&json);
    let out = Command::new(BIN)
        .args(["load", "-R", "10", "-c", "1", "-d", "1s", "--json"])
        .arg(&json)
        .args(extra)
        .arg(url)
        .output()
        .unwrap();
    let summary = std::fs::read(&json)
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap());
    (out, summary)
}

#[test]
fn connection_failures_say_why_dns_refused_or_a_resolve_that_does_not_match() {
    let dir = scratch("hostile-why");
    // A label longer than DNS allows: the resolver refuses it without sending a query.
    let host = format!("{}.test", "a".repeat(64));
    let (out, summary) = load_json(&dir, &format!("http://{host}/"), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let summary = summary.unwrap();
    assert_eq!(summary["outcomes"]["dns_error"], 10, "{summary}");
    let why = summary["failure_details"]["dns_error"].as_str().unwrap();
    assert!(
        why.contains(&format!("cannot resolve `{host}`"))
            && why.contains(&format!("--resolve {host}:80:ADDRESS")),
        "{why}"
    );
    assert!(text(&out).contains(why), "{}", text(&out));

    // Nothing listens: the address and where it came from.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (out, summary) = load_json(
        &dir,
        &format!("http://app.test:{port}/"),
        &["--resolve", &format!("app.test:{port}:127.0.0.1")],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let summary = summary.unwrap();
    assert_eq!(summary["outcomes"]["refused"], 10, "{summary}");
    let why = summary["failure_details"]["refused"].as_str().unwrap();
    assert!(
        why.starts_with(&format!(
            "127.0.0.1:{port} (from --resolve) refused the connection"
        )),
        "{why}"
    );

    // A --resolve for another port would silently send every request to DNS: refused
    // before the run, with the entry that would work.
    let (out, summary) = load_json(
        &dir,
        "http://app.test/",
        &["--resolve", "app.test:8443:127.0.0.1"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(summary.is_none(), "nothing ran");
    assert!(
        text(&out).contains("does not cover the URL's app.test:80")
            && text(&out).contains("Use --resolve app.test:80:127.0.0.1"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_run_killed_mid_cell_is_rebuilt_from_its_interval_log_and_resumed_without_loss() {
    let dir = scratch("hostile-killed");
    let file = scenario(&dir, "killed", "6s");
    let out = dir.join("out");
    let mut run = spawn_run(&file, &out);
    let cell = out.join("cells").join("000-up");
    let hlog = cell.join("latency.hlog");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&hlog).map_or(0, |t| {
        t.lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with('"'))
            .count()
    }) < 3
    {
        assert!(Instant::now() < deadline, "the cell never measured 3 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    Command::new("kill")
        .args(["-KILL", &run.id().to_string()])
        .status()
        .unwrap();
    let _ = run.wait();

    // What was on disk is the cell's summary, marked as such.
    let read = ingressbench_report::results::read(&out).unwrap();
    assert_eq!(read.record.status, "cut short", "{:?}", read.record);
    let c = &read.cells[0];
    assert_eq!(c.status, "interrupted");
    let answered = c.number(&["requests", "total"]).unwrap();
    assert!(answered >= 100.0, "3 s at 50 req/s: {answered}");
    assert_eq!(c.number(&["requests", "errors"]), Some(0.0));
    assert!(c.number(&["latency_us", "p99"]).unwrap() > 0.0);
    let report = Command::new(BIN).arg("report").arg(&out).output().unwrap();
    assert!(report.status.success(), "{}", text(&report));
    assert!(
        text(&report).contains("RUN CUT SHORT") && text(&report).contains("REBUILT FROM DISK"),
        "{}",
        text(&report)
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        html.contains("Run cut short; 1 of 1 cells measured."),
        "the header"
    );
    // A gate cannot pass on it.
    let gate = Command::new(BIN)
        .arg("compare")
        .arg(&out)
        .arg(&out)
        .args(["--fail-if", "p99 > +50%"])
        .output()
        .unwrap();
    assert_eq!(gate.status.code(), Some(3), "{}", text(&gate));

    // --resume keeps what the attempt measured, beside the cell it runs again.
    let resumed = Command::new(BIN)
        .arg("run")
        .arg("--resume")
        .arg(&out)
        .output()
        .unwrap();
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert!(
        text(&resumed).contains("an earlier attempt was cut short (after ")
            && text(&resumed).contains(&format!(" s: {answered} requests answered, p99 "))
            && text(&resumed).contains("kept in cells/000-up.attempt-1"),
        "{}",
        text(&resumed)
    );
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["status"], "complete", "{record}");
    let entry = &record["cells"][0];
    assert_eq!(entry["status"], "done");
    let attempt = &entry["earlier_attempts"][0];
    assert_eq!(attempt["dir"], "000-up.attempt-1", "{entry}");
    assert_eq!(
        attempt["summary"]["latency_us"]["count"].as_f64(),
        Some(answered)
    );
    assert!(out.join("cells/000-up.attempt-1/latency.hlog").exists());
    let report = Command::new(BIN).arg("report").arg(&out).output().unwrap();
    assert!(
        text(&report).contains("an earlier attempt was cut short"),
        "{}",
        text(&report)
    );
}

/// `ingressbench scenario check` of `text`.
fn check_text(dir: &Path, text: &str) -> Output {
    let file = dir.join("check.yaml");
    std::fs::write(&file, text).unwrap();
    Command::new(BIN)
        .args(["scenario", "check"])
        .arg(&file)
        .output()
        .unwrap()
}

#[test]
fn scenario_check_finds_what_any_cell_or_event_would_find_wrong() {
    let dir = scratch("hostile-check");
    let base = "name: c\ntargets: [nginx]\nbackends: [{ name: echo, replicas: 2 }]\n";
    let load = "load: { mode: open, rate: 50, connections: 2, duration: 10s }\n";
    let cases: [(String, &[&str]); 9] = [
        // A matrix value only the third cell has.
        (
            format!("{base}load: {{ mode: open, rate: 50, duration: 10s }}\nmatrix: {{ load.connections: [2, 4, 0] }}\n"),
            &["cell 2 (nginx load.connections=0)", "load.connections: 0 is not between 1 and 1000000"],
        ),
        (
            format!("{base}{load}events: [{{ at: 2s, kill: ech-2 }}]\n"),
            &["events[0]: `ech-2` is not a backend of this scenario", "echo-1"],
        ),
        (
            format!("{base}{load}events: [{{ at: 2s, config: {{ pool: green }} }}]\n"),
            &["events[0]: config.pool `green` is not a pool of this scenario (echo)", "add a backend of that name"],
        ),
        (
            format!("{base}{load}events: [{{ at: 30s, reload: true }}]\n"),
            &["events[0]: at 30s is past the end of the load (load.duration 10s)"],
        ),
        (
            format!("{base}load: {{ mode: sequential, requests: 20 }}\nevents: [{{ before_request: 10, times: 3, reload: true }}]\n"),
            &["the last of 3 firings (before request 30) is past the end of the load (load.requests 20)"],
        ),
        // A route change whose value no proxy may be given.
        (
            format!("{base}{load}events: [{{ at: 2s, config: {{ response_header: {{ name: x-ingressbench-generation, value: \"1\" }} }} }}]\n"),
            &["x-ingressbench-generation", "use another name"],
        ),
        (
            format!("name: c\ntargets: [{{ upstream: \"http://127.0.0.1:9/\", name: up }}]\n{load}events: [{{ at: 2s, reload: true }}]\n"),
            &["target `up` is an upstream URL the tool did not start"],
        ),
        // nginx has no HTTP/2 upstream for HTTP; the other proxies may have one.
        (
            format!("name: c\ntargets: [{{ proxy: haproxy, upstream_protocol: http2 }}, {{ proxy: nginx, upstream_protocol: http2 }}]\n{load}"),
            &["cell 1 (nginx)", "nginx proxies HTTP only as HTTP/1.x to its upstreams"],
        ),
        (
            format!("{base}{load}tuning: {{ upstream_protocol: h2 }}\n"),
            &["unknown variant `h2`", "http1", "http2"],
        ),
    ];
    for (yaml, says) in &cases {
        let out = check_text(&dir, yaml);
        assert_eq!(out.status.code(), Some(2), "{yaml}: {}", text(&out));
        for s in *says {
            assert!(
                text(&out).contains(s),
                "{yaml}: wanted `{s}` in: {}",
                text(&out)
            );
        }
    }
    let both = format!("name: c\ntargets: [nginx, {{ proxy: caddy, upstream_protocol: http2 }}]\n{load}matrix: {{ tuning.upstream_protocol: [http1] }}\n");
    let out = check_text(&dir, &both);
    assert_eq!(out.status.code(), Some(0), "{both}: {}", text(&out));
    // `run` says the same before any cell starts: nothing is written.
    let file = dir.join("check.yaml");
    std::fs::write(&file, &cases[0].0).unwrap();
    let out = run(&file, &["--out", "never"], &dir);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("load.connections"), "{}", text(&out));
    assert!(!dir.join("never").exists());
}

#[test]
fn an_event_that_cannot_be_applied_fails_its_cell_and_is_not_shown_as_applied() {
    let dir = scratch("hostile-unapplied");
    // echo-5 is a name of the pool, but only echo-1 and echo-2 run.
    let file = dir.join("kill.yaml");
    std::fs::write(
        &file,
        "name: unapplied\ntargets: [nginx]\nbackends: [{ name: echo, replicas: 2 }]\nload: { mode: open, rate: 50, connections: 2, duration: 4s }\nevents: [{ at: 1s, kill: echo-5 }]\n",
    )
    .unwrap();
    let out = dir.join("out");
    let done = run(&file, &["--out", out.to_str().unwrap()], &dir);
    assert_eq!(done.status.code(), Some(1), "{}", text(&done));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    let cell = &record["cells"][0];
    assert_eq!(cell["status"], "failed", "{cell}");
    let error = cell["error"].as_str().unwrap();
    assert!(
        error.contains("events[0] could not be applied") && error.contains("echo-5"),
        "{error}"
    );
    let events = std::fs::read_to_string(out.join("cells/000-nginx/events.jsonl")).unwrap();
    let line: serde_json::Value = serde_json::from_str(events.lines().next().unwrap()).unwrap();
    assert!(
        line["error"].is_string() && line.get("requested_s").is_none(),
        "{line}"
    );
    // What was measured until then is kept, and the report says the cell failed.
    assert!(out.join("cells/000-nginx/latency.hlog").exists());
    let report = Command::new(BIN).arg("report").arg(&out).output().unwrap();
    assert!(
        text(&report).contains("failed: events[0]"),
        "{}",
        text(&report)
    );
}

/// A copy of a finished run's directory, `out`, for tampering with.
fn finished_run(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let file = scenario(dir, name, "300ms");
    let out = dir.join(name);
    let done = run(&file, &["--out", out.to_str().unwrap()], dir);
    assert!(done.status.success(), "{}", text(&done));
    (file, out)
}

#[test]
fn a_results_directory_from_elsewhere_is_written_and_deleted_only_where_the_tool_made_it() {
    let dir = scratch("hostile-store");
    let outside = dir.join("outside");
    let precious = outside.join("000-up");
    std::fs::create_dir_all(&precious).unwrap();
    std::fs::write(precious.join("keep"), "precious").unwrap();
    let intact = || {
        assert_eq!(
            std::fs::read_to_string(precious.join("keep")).unwrap(),
            "precious"
        );
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
        assert_eq!(std::fs::read_dir(&precious).unwrap().count(), 1);
    };
    let refused = |out: &Output, says: &str| {
        assert_eq!(out.status.code(), Some(2), "{}", text(out));
        assert!(text(out).contains(says), "`{says}` not in {}", text(out));
    };

    // --force on a run.json this tool did not write: nothing deleted.
    let (file, foreign) = finished_run(&dir, "foreign");
    std::fs::write(
        foreign.join("run.json"),
        r#"{"precious": true, "cells": [{"dir": "000-up"}]}"#,
    )
    .unwrap();
    let out = run(
        &file,
        &["--out", foreign.to_str().unwrap(), "--force"],
        &dir,
    );
    refused(&out, "it was not written by `ingressbench run`");
    assert!(foreign
        .join("cells")
        .join("000-up")
        .join("summary.json")
        .exists());

    // cells/ a link: neither a new run (forced or not) nor --resume writes or deletes
    // through it.
    let (file, linked) = finished_run(&dir, "linked");
    std::fs::remove_dir_all(linked.join("cells")).unwrap();
    std::os::unix::fs::symlink(&outside, linked.join("cells")).unwrap();
    let out = run(&file, &["--out", linked.to_str().unwrap(), "--force"], &dir);
    refused(
        &out,
        "it is a link, and a run writes only inside its results directory",
    );
    intact();
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(linked.join("run.json")).unwrap()).unwrap();
    record["status"] = "incomplete".into();
    record["cells"][0]["status"] = "pending".into();
    std::fs::write(linked.join("run.json"), record.to_string()).unwrap();
    let resume = Command::new(BIN)
        .args(["run", "--resume", linked.to_str().unwrap()])
        .output()
        .unwrap();
    refused(&resume, "it is a link");
    intact();
    let fresh = dir.join("fresh");
    std::fs::create_dir_all(&fresh).unwrap();
    std::os::unix::fs::symlink(&outside, fresh.join("cells")).unwrap();
    refused(
        &run(&file, &["--out", fresh.to_str().unwrap()], &dir),
        "it is a link",
    );
    intact();

    // A cell directory that no run record lists (in a directory with no run): left.
    let planted = dir.join("planted");
    std::fs::create_dir_all(planted.join("cells").join("000-up")).unwrap();
    std::fs::write(planted.join("cells").join("000-up").join("keep"), "x").unwrap();
    refused(
        &run(&file, &["--out", planted.to_str().unwrap()], &dir),
        "no run record of this directory lists it",
    );
    assert!(planted.join("cells").join("000-up").join("keep").exists());

    // A .lock that leads elsewhere is not truncated.
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    let locked = dir.join("locked");
    std::fs::create_dir_all(&locked).unwrap();
    std::os::unix::fs::symlink(&victim, locked.join(".lock")).unwrap();
    let out = run(&file, &["--out", locked.to_str().unwrap()], &dir);
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
}

/// A file system mounted for a test, unmounted when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A disk that fills mid-cell (a 512 KiB tmpfs as --out, every request sampled): the
/// load stops there, the cell is `interrupted` with what it measured (its summary in
/// run.json and summary.json, written in the room the run reserved), run.json ends
/// `incomplete` with the reason and the fix, the exit code is a failure (not Ctrl-C's),
/// and no temporary or reserve file is left. Before: the cell `failed` with nothing of
/// what it measured.
#[test]
fn a_full_disk_ends_the_run_as_incomplete_and_keeps_what_was_measured() {
    let dir = scratch("hostile-full");
    let file = dir.join("scenario.yaml");
    let addr = crate::common::server();
    std::fs::write(
        &file,
        format!(
            "name: full\ntargets: [{{ upstream: \"http://{addr}/\", name: up }}]\nload: {{ mode: open, rate: 3000, connections: 4, duration: 30s, sample_rate: 1.0 }}\n"
        ),
    )
    .unwrap();
    let small = dir.join("small");
    std::fs::create_dir_all(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512k", "tmpfs"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(mounted.success(), "mounting a tmpfs needs root");
    let _mounted = Mounted(small.clone());
    let out = small.join("out");
    let started = Instant::now();
    let run = run(&file, &["--out", out.to_str().unwrap()], &dir);
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "the load stopped when the disk filled, not at its end"
    );
    assert_eq!(run.status.code(), Some(1), "{}", text(&run));
    assert!(text(&run).contains("the disk filled"), "{}", text(&run));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["status"], "incomplete", "{record}");
    assert!(
        record["error"].as_str().unwrap().contains("--resume"),
        "{record}"
    );
    let cell = &record["cells"][0];
    assert_eq!(cell["status"], "interrupted", "{record}");
    assert!(
        cell["summary"]["requests"].as_u64().unwrap() > 1000,
        "{record}"
    );
    let summary: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join("cells").join("000-up").join("summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(summary["requests"]["total"], cell["summary"]["requests"]);
    let left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp") || n == ".reserve")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    drop(_mounted);
}

#[test]
fn a_hang_up_ends_the_run_as_incomplete_and_keeps_what_was_measured() {
    let dir = scratch("hostile-hup");
    let file = scenario(&dir, "hup", "20s");
    let out = dir.join("out");
    let mut child = spawn_run(&file, &out);
    // Once the cell has measured a few windows, the terminal goes away.
    let deadline = Instant::now() + Duration::from_secs(30);
    let hlog = out.join("cells").join("000-up").join("latency.hlog");
    while std::fs::read_to_string(&hlog).map_or(0, |l| l.matches("#outcomes").count()) < 2 {
        assert!(Instant::now() < deadline, "the cell never measured");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "stopped as by Ctrl-C");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["status"], "incomplete", "{record}");
    assert_eq!(record["cells"][0]["status"], "interrupted", "{record}");
    assert!(
        record["cells"][0]["summary"]["requests"].as_u64().unwrap() >= 50,
        "{record}"
    );
    let left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// Ctrl-C during a restart's grace ends it there: the proxy's WebSockets would hold its
/// graceful stop for the whole grace (120 s here), and a stopped run does not wait it out.
/// The run ends as Ctrl-C ends one (the cell interrupted with what it measured, its
/// files written). The bound below is a hang detector at half
/// the grace, not a timing.
#[test]
fn ctrl_c_during_a_restarts_grace_ends_the_grace() {
    let dir = scratch("hostile-grace");
    let file = dir.join("scenario.yaml");
    std::fs::write(
        &file,
        "name: grace\ntargets: [nginx]\nbackends: [{ name: echo, replicas: 1 }]\nload: { kind: websocket, rate: 50, connections: 2, duration: 200s, timeout: 1s }\nevents:\n  - { at: 1s, restart: true, grace: 120s }\n",
    )
    .unwrap();
    let out = dir.join("out");
    let mut child = spawn_run(&file, &out);
    // Three windows measured: the restart (at 1 s) is in its grace.
    let hlog = out.join("cells").join("000-nginx").join("latency.hlog");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&hlog).map_or(0, |l| l.matches("#outcomes").count()) < 3 {
        assert!(Instant::now() < deadline, "the cell never measured");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let status = crate::common::ends_within(
        &mut child,
        Duration::from_secs(60),
        "the run waited out the restart's grace after Ctrl-C",
    );
    let said = text(&child.wait_with_output().unwrap());
    assert_eq!(status.code(), Some(130), "{said}");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["status"], "incomplete", "{record}");
    assert_eq!(record["cells"][0]["status"], "interrupted", "{record}");
    assert!(out.join("cells/000-nginx/summary.json").is_file(), "{said}");
    let events = std::fs::read_to_string(out.join("cells/000-nginx/events.jsonl")).unwrap();
    assert!(events.contains("\"restart\""), "{events}");
}

/// A restart whose new process will not start fails its cell, and the message points at
/// the copies of the proxy's files kept in the cell (`cells/NNN/proxy/`), which outlive
/// the lab's own directory: a path in it that still exists, and no path of the lab's.
#[test]
fn a_restart_that_cannot_start_the_proxy_again_points_at_the_cells_copies() {
    let dir = scratch("hostile-restart-fails");
    let nginx = std::process::Command::new("sh")
        .args(["-c", "command -v nginx"])
        .output()
        .unwrap();
    let nginx = String::from_utf8_lossy(&nginx.stdout).trim().to_owned();
    assert!(
        !nginx.is_empty(),
        "nginx is installed (scripts/install-deps.sh)"
    );
    // Starts the server once (`-p DIR`), refuses the second time; asked its version, says it.
    let mark = dir.join("started-once");
    Command::new("chmod").arg("777").arg(&dir).status().unwrap();
    let (mut run, out, fake) = run_with_nginx(
        &dir,
        &format!(
            "#!/bin/sh\nif [ \"$1\" = -p ]; then\n  if [ -e {mark} ]; then echo 'refusing to start a second time' >&2; exit 1; fi\n  : > {mark}\nfi\nexec {nginx} \"$@\"\n",
            mark = mark.display()
        ),
        "name: restart-fails\ntargets: [nginx]\nbackends: [{ name: echo, replicas: 1 }]\ntls: false\nload: { mode: open, rate: 20, connections: 2, duration: 4s }\nevents:\n  - { at: 1s, restart: true, grace: 1s }\n",
    );
    crate::common::ends_within(
        &mut run,
        Duration::from_secs(120),
        "the run did not end after the failed restart",
    );
    let done = run.wait_with_output().unwrap();
    assert_eq!(done.status.code(), Some(1), "{}", text(&done));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    let error = record["cells"][0]["error"].as_str().unwrap().to_owned();
    let copies = out.join("cells");
    let named: Vec<&str> = error
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ',' || c == ';')
        .map(|w| w.trim_end_matches(['.', ':']))
        .filter(|w| w.starts_with('/'))
        .collect();
    // Besides the binary's own path: each file named is the cell's copy, still there.
    let fake = fake.display().to_string();
    let named: Vec<&str> = named.into_iter().filter(|p| *p != fake).collect();
    assert!(!named.is_empty(), "no path in: {error}");
    for path in &named {
        assert!(
            path.starts_with(&copies.display().to_string()),
            "{path} is not in the cell's copies: {error}"
        );
        assert!(Path::new(path).exists(), "{path} is gone: {error}");
    }
}
