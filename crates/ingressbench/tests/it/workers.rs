//! One run sent by several worker processes (`load --workers`): merged exactly, each
//! worker's health reported, a worker's death named, nothing left running.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::common::{alive, close, from_samples, scratch, text, BIN};
use crate::process::Backend;

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `load` against `url` with `args`, writing summary, workers and samples into `dir`.
fn load(dir: &Path, url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("load")
        .args(args)
        .arg("--json")
        .arg(dir.join("summary.json"))
        .arg("--workers-json")
        .arg(dir.join("workers.json"))
        .arg(url);
    c
}

/// Worker processes of this tool whose parent is `parent`.
fn workers_of(parent: u32) -> Vec<u32> {
    crate::common::live_processes()
        .into_iter()
        .filter(|(pid, fields)| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent)
                && cmdline.ends_with(b"worker\0")
        })
        .map(|(pid, _)| pid)
        .collect()
}

#[test]
fn three_workers_merge_to_exactly_the_figures_of_all_their_requests() {
    let dir = scratch("workers-merge");
    let backend = Backend::start(&["--latency", "uniform:100us-3ms"]);
    let url = format!("http://{}/", backend.addr);
    let samples = dir.join("samples.csv");
    let out = load(
        &dir,
        &url,
        &[
            "-R",
            "600",
            "-d",
            "3s",
            "-c",
            "12",
            "--workers",
            "3",
            "--sample-rate",
            "1",
        ],
    )
    .arg("--samples")
    .arg(&samples)
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let summary = json(&dir.join("summary.json"));
    let workers = json(&dir.join("workers.json"));
    let (rows, union) = from_samples(&samples);
    let total = summary["requests"]["total"].as_u64().unwrap();
    assert_eq!(rows, total, "every request of every worker is a sample");
    assert_eq!(
        total, 1800,
        "the three stripes make the whole schedule once"
    );
    let lat = &summary["latency_us"];
    for (name, p) in [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9)] {
        let merged = lat[name].as_u64().unwrap();
        let from_union = union.value_at_percentile(p);
        eprintln!("{name}: merged {merged} us, from the union of the samples {from_union} us");
        assert!(
            close(merged, from_union),
            "{name}: merged {merged} us, union {from_union} us"
        );
    }
    assert!(close(lat["max"].as_u64().unwrap(), union.max()));
    assert_eq!(lat["count"].as_u64().unwrap(), union.count());
    // Each worker: its share, complete, started on time, named.
    let each = workers["workers"].as_array().unwrap();
    assert_eq!(each.len(), 3);
    let mut sum = 0;
    for (k, w) in each.iter().enumerate() {
        assert_eq!(w["index"], k, "{w}");
        assert_eq!(w["complete"], true, "{w}");
        assert_eq!(w["exit"], "exit 0", "{w}");
        assert!(w["start_late_ms"].as_f64().unwrap() < 300.0, "{w}");
        // One machine, one clock: a line is read after it is written, never before.
        assert!(w["clock_ahead_at_least_ms"].as_f64().unwrap() <= 0.0, "{w}");
        let requests = w["summary"]["requests"]["total"].as_u64().unwrap();
        assert_eq!(requests, 600, "worker {k}: its third of the schedule: {w}");
        assert_eq!(
            w["summary"]["rate"]["target_per_s"].as_f64(),
            Some(200.0),
            "{w}"
        );
        sum += requests;
    }
    assert_eq!(sum, total);
    assert_eq!(workers["merged_p99_us"], lat["p99"]);
    let average = workers["p99_average_of_workers_us"].as_f64().unwrap();
    let p99s: Vec<f64> = each
        .iter()
        .map(|w| w["summary"]["latency_us"]["p99"].as_f64().unwrap())
        .collect();
    assert!((average - p99s.iter().sum::<f64>() / 3.0).abs() < 1e-6);
    eprintln!(
        "p99: merged {} us, average of the workers' {average:.0} us",
        lat["p99"]
    );
    assert!(workers_of(std::process::id()).is_empty());
}

/// The load engine's stall test (200 ms of every second, 1,000 req/s) with three workers:
/// each sends a third of the schedule, so each sees the stalls the one would.
#[test]
fn coordinated_omission_is_corrected_across_workers() {
    let _heavy = crate::common::heavy();
    let dir = scratch("workers-stall");
    let backend = Backend::start(&["--stall-every", "1s", "--stall-for", "200ms"]);
    let url = format!("http://{}/", backend.addr);
    let mut figures = Vec::new();
    for workers in ["1", "3"] {
        let out = load(
            &dir,
            &url,
            &["-R", "1000", "-d", "5s", "-c", "9", "--workers", workers],
        )
        .output()
        .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let s = json(&dir.join("summary.json"));
        assert_eq!(s["requests"]["errors"], 0, "{s}");
        // The service time hides the stall: only the nine requests on a connection when
        // it starts wait in it; the rest wait for their turn, which only the corrected
        // latency counts.
        let (corrected, service) = (
            s["latency_us"]["p90"].as_f64().unwrap(),
            s["service_time_us"]["p90"].as_f64().unwrap(),
        );
        assert!(service < corrected / 4.0, "{workers}: {s}");
        figures.push(s["latency_us"].clone());
    }
    // A fifth of the requests wait out a stall, a wait uniform over 0-200 ms. The load
    // engine's own test holds this to 5%; here three processes and the backend share two
    // cores with whatever else runs, and the queue each stall leaves takes longer to drain
    // the busier they are, which only ever adds: p90 came out 109 ms beside the report
    // tests and 117 ms in a CI run with three workers. So a figure may be 15% under what
    // the stalls alone give (an uncorrected one is a few ms) and 40% over it (a stall's
    // wait counted twice would be twice it).
    let expected_ms = |p: f64| 200.0 * (1.0 - (1.0 - p / 100.0) / 0.2);
    for (name, p) in [("p90", 90.0), ("p99", 99.0)] {
        let want = expected_ms(p);
        for (latency, workers) in figures.iter().zip([1, 3]) {
            let got = latency[name].as_f64().unwrap() / 1e3;
            eprintln!("{workers} worker(s): {name} {got:.1} ms, expected {want:.1} ms");
            assert!(
                got > want * 0.85 && got < want * 1.4,
                "{workers} worker(s): {name} {got:.1} ms, expected {want:.1} ms \
                 (from 15% under to 40% over)"
            );
        }
    }
}

fn run_and_signal(dir: &Path, url: &str, args: &[&str], act: impl FnOnce(u32, &[u32])) -> Output {
    let child = load(dir, url, args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let parent = child.id();
    let mut workers = Vec::new();
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(50));
        workers = workers_of(parent);
        if workers.len() == 3 {
            break;
        }
    }
    assert_eq!(workers.len(), 3, "three worker processes under {parent}");
    std::thread::sleep(Duration::from_millis(1500));
    act(parent, &workers);
    let out = child.wait_with_output().unwrap();
    for w in workers {
        assert!(!alive(w), "worker {w} left running");
    }
    out
}

#[test]
fn a_worker_killed_mid_run_is_named_and_the_others_are_kept() {
    let dir = scratch("workers-kill");
    let backend = Backend::start(&[]);
    let url = format!("http://{}/", backend.addr);
    let out = run_and_signal(
        &dir,
        &url,
        &["-R", "300", "-d", "4s", "-c", "6", "--workers", "3"],
        |_, workers| {
            assert!(Command::new("kill")
                .args(["-KILL", &workers[1].to_string()])
                .status()
                .unwrap()
                .success());
        },
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("ended before handing over its results (killed by signal 9)"),
        "{}",
        text(&out)
    );
    let workers = json(&dir.join("workers.json"));
    let complete: Vec<bool> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["complete"].as_bool().unwrap())
        .collect();
    assert_eq!(complete.iter().filter(|c| !**c).count(), 1, "{workers}");
    let summary = json(&dir.join("summary.json"));
    let total = summary["requests"]["total"].as_u64().unwrap();
    // The two that lived sent their whole shares; the killed one what it had sent by
    // its last window (about 1.5 s of its 4 s).
    let kept: u64 = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["complete"] == true)
        .map(|w| w["summary"]["requests"]["total"].as_u64().unwrap())
        .sum();
    assert_eq!(kept, 800, "{workers}");
    assert!(total > kept && total < 1200, "{total}: {summary}");
}

#[test]
fn ctrl_c_stops_every_worker_once_and_keeps_what_they_measured() {
    let dir = scratch("workers-int");
    let backend = Backend::start(&[]);
    let url = format!("http://{}/", backend.addr);
    let out = run_and_signal(
        &dir,
        &url,
        &["-R", "300", "-d", "30s", "-c", "6", "--workers", "3"],
        |parent, _| {
            assert!(Command::new("kill")
                .args(["-INT", &parent.to_string()])
                .status()
                .unwrap()
                .success());
        },
    );
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    let workers = json(&dir.join("workers.json"));
    for w in workers["workers"].as_array().unwrap() {
        assert_eq!(w["complete"], true, "{w}");
        assert_eq!(w["summary"]["interrupted"], true, "{w}");
    }
    let summary = json(&dir.join("summary.json"));
    assert_eq!(summary["interrupted"], true);
    assert!(
        summary["requests"]["total"].as_u64().unwrap() > 300,
        "{summary}"
    );
}

#[test]
fn three_workers_reach_three_times_five_thousand_requests_a_second() {
    let dir = scratch("workers-rate");
    let backend = Backend::start(&["--body-bytes", "0"]);
    let url = format!("http://{}/", backend.addr);
    let out = load(
        &dir,
        &url,
        &["-R", "15000", "-d", "3s", "-c", "30", "--workers", "3"],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let s = json(&dir.join("summary.json"));
    let achieved = s["rate"]["achieved_per_s"].as_f64().unwrap();
    eprintln!("achieved {achieved:.0} req/s of 15000: {}", s["rate"]);
    assert!((achieved - 15000.0).abs() / 15000.0 < 0.01, "{}", s["rate"]);
}

#[test]
fn workers_that_cannot_share_the_load_are_refused_before_it_starts() {
    let url = "http://127.0.0.1:9/";
    for (args, says) in [
        (
            vec!["--sequential", "--workers", "2"],
            "sequential load is one request at a time",
        ),
        (
            vec!["-c", "2", "--workers", "3"],
            "need at least as many connections",
        ),
        (vec!["--workers", "0"], "--workers"),
    ] {
        let out = Command::new(BIN)
            .arg("load")
            .args(&args)
            .arg(url)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    }
    // A scenario's load from the cluster needs one; its placement needs that load.
    let dir = scratch("workers-refused");
    let file = dir.join("from.yaml");
    for (load, says) in [
        (
            "from: cluster",
            "load.from: cluster sends the load from pods of a cluster: run with --cluster FILE",
        ),
        (
            "placement: { node: other_than_backends }",
            "load.placement: only load from the cluster has pods to place",
        ),
        (
            "from: cluster, placement: { node: any, node_selector: { a: b } }",
            "load.placement: give either `node:`",
        ),
        (
            "from: cluster, placement: { node: beside }",
            "unknown variant `beside`",
        ),
    ] {
        std::fs::write(
            &file,
            format!("name: from\ntargets: [{{ upstream: \"{url}\", name: u }}]\nload: {{ rate: 10, duration: 1s, {load} }}\n"),
        )
        .unwrap();
        let out = Command::new(BIN)
            .arg("run")
            .arg(&file)
            .arg("--out")
            .arg(dir.join("out"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{load}: {}", text(&out));
        assert!(text(&out).contains(says), "{load}: {}", text(&out));
    }
}

#[test]
fn a_scenario_with_load_workers_writes_the_merged_cell_and_each_workers_health() {
    let dir = scratch("workers-run");
    let backend = Backend::start(&[]);
    let file = dir.join("workers.yaml");
    std::fs::write(
        &file,
        format!(
            "name: workers\ntargets: [{{ upstream: \"http://{}/\", name: echo }}]\nload: {{ mode: open, rate: 400, connections: 6, workers: 3, duration: 2s, warmup: 500ms, sample_rate: 1 }}\n",
            backend.addr
        ),
    )
    .unwrap();
    let out = dir.join("out");
    let run = Command::new(BIN)
        .args([
            "run",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", text(&run));
    let cell = crate::common::cells_of(&out)[0].clone();
    let summary = json(&cell.join("summary.json"));
    let workers = json(&cell.join("workers.json"));
    let each = workers["workers"].as_array().unwrap();
    assert_eq!(each.len(), 3, "{workers}");
    let sum: u64 = each
        .iter()
        .map(|w| w["summary"]["requests"]["total"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, summary["requests"]["total"].as_u64().unwrap());
    assert_eq!(sum, 800, "2 s at 400 req/s after the warm-up: {summary}");
    // The merged interval log holds every worker's answers.
    assert_eq!(
        crate::common::hlog_requests(&cell.join("latency.hlog")),
        sum
    );
    // The report shows the merged spectrum beside each worker's, and the averaged p99.
    let report = Command::new(BIN)
        .args(["report", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(report.status.success(), "{}", text(&report));
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<h2>Workers</h2>"), "no workers section");
    assert!(
        html.contains("average of the workers&#39; p99s")
            || html.contains("average of the workers' p99s")
    );
    for k in 0..3 {
        assert!(
            html.contains(&format!(">worker {k}<")),
            "worker {k} not in the chart's legend"
        );
    }
}
