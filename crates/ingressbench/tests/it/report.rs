//! `ingressbench report` and `ingressbench compare`: a report of a real run rendered by a
//! real browser, hostile strings, a large run, and `--fail-if` as a gate.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime};

use ingressbench_results::hlog::HlogWriter;
use ingressbench_stats::HistogramUs;

use crate::common::{scratch, text, BIN};

fn ib(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// A summary.json with these latency figures (us) and errors.
fn summary(p50: u64, p99: u64, errors: u64, requests: u64, warning: &str) -> serde_json::Value {
    serde_json::json!({
        "target": "http://127.0.0.1/", "mode": "open", "duration_s": 10.0, "interrupted": false,
        "latency_us": { "count": requests, "mean": p50 as f64 * 1.1, "p50": p50, "p99": p99, "p999": p99 * 2, "max": p99 * 3 },
        "requests": { "total": requests, "ok": requests - errors, "errors": errors },
        "phases_us": {},
        "warnings": if warning.is_empty() { vec![] } else { vec![warning] },
    })
}

struct FakeCell<'a> {
    target: &'a str,
    settings: &'a [(&'a str, &'a str)],
    repeat: u32,
    status: &'a str,
    summary: Option<serde_json::Value>,
    /// Latencies (us) for a one-window interval log and a samples file.
    latencies: Vec<u64>,
    backend: &'a str,
    impact: serde_json::Value,
}

/// Writes a results directory as `ingressbench run` does (the parts a report reads).
fn fake_run(dir: &Path, scenario_text: &str, cells: &[FakeCell<'_>]) {
    let mut entries = Vec::new();
    for (i, c) in cells.iter().enumerate() {
        let name = format!("{i:03}-cell");
        let settings: serde_json::Map<String, serde_json::Value> = c
            .settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::json!(v)))
            .collect();
        entries.push(serde_json::json!({
            "index": i, "repeat": c.repeat, "target": c.target, "settings": settings,
            "status": c.status, "dir": name, "proxy_version": format!("{} 1.0", c.target),
        }));
        if c.status == "pending" {
            // Never started: no directory (one with an interval log was cut short).
            continue;
        }
        let cell_dir = dir.join("cells").join(&name);
        std::fs::create_dir_all(cell_dir.join("proxy")).unwrap();
        if let Some(s) = &c.summary {
            std::fs::write(cell_dir.join("summary.json"), s.to_string()).unwrap();
        }
        let mut h = HistogramUs::new();
        c.latencies.iter().for_each(|v| h.record_us(*v));
        let mut log = Vec::new();
        let mut w = HlogWriter::new(&mut log, SystemTime::now(), "test").unwrap();
        for k in 0..4 {
            w.interval(Duration::from_secs(k), Duration::from_secs(1), &h)
                .unwrap();
            let mut outcomes = ingressbench_stats::OutcomeCounts::default();
            outcomes.add_n(ingressbench_stats::Outcome::Status(200), h.count());
            w.outcomes(Duration::from_secs(k), &outcomes).unwrap();
        }
        w.flush().unwrap();
        drop(w);
        std::fs::write(cell_dir.join("latency.hlog"), log).unwrap();
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(cell_dir.join("samples.csv.gz")).unwrap(),
            flate2::Compression::fast(),
        );
        writeln!(gz, "{}", ingressbench_results::samples::HEADER).unwrap();
        for (k, v) in c.latencies.iter().enumerate() {
            let ok = k % 50 != 7;
            let t = k as f64 * 4.0 / c.latencies.len() as f64;
            writeln!(
                gz,
                "{t:.6},{t:.6},{:.6},0.000010,0,0,0,0,0,0,100,{},{},{},1",
                *v as f64 / 1e6,
                if ok { "200" } else { "reset" },
                if ok { "200" } else { "" },
                c.backend
            )
            .unwrap();
        }
        gz.finish().unwrap();
        std::fs::write(cell_dir.join("impact.json"), c.impact.to_string()).unwrap();
        std::fs::write(
            cell_dir.join("proxy").join("nginx.conf"),
            format!("server {{ # {} }}\n", c.backend),
        )
        .unwrap();
    }
    let record = serde_json::json!({
        "scenario": "fake", "status": "complete", "tool_version": "test",
        "command": "ingressbench run fake.yaml", "scenario_text": scenario_text,
        "machine": { "cpu_model": "test", "cores": 2, "kernel": "6" }, "cells": entries,
    });
    std::fs::write(dir.join("run.json"), record.to_string()).unwrap();
}

fn cell(target: &str, repeat: u32, p99: u64, errors: u64) -> FakeCell<'_> {
    FakeCell {
        target,
        settings: &[],
        repeat,
        status: "done",
        // As many answered requests as the interval log's 4 windows of 400 hold.
        summary: Some(summary(p99 / 4, p99, errors, 1600, "")),
        latencies: (0..400).map(|k| 100 + k * p99 / 400).collect(),
        backend: "echo-1",
        impact: serde_json::json!([]),
    }
}

#[test]
fn compare_fail_if_exits_non_zero_exactly_when_the_condition_holds() {
    let dir = scratch("report-gate");
    let (a, b) = (dir.join("a"), dir.join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    // Three repeats each, p99 1000 us vs 1500 us (+50%), no errors vs 3 per run.
    let spread = [0, 10, 20];
    let a_cells: Vec<FakeCell<'_>> = (0..3)
        .map(|r| cell("nginx", r, 1000 + spread[r as usize], 0))
        .collect();
    let b_cells: Vec<FakeCell<'_>> = (0..3)
        .map(|r| cell("nginx", r, 1500 + spread[r as usize], 3))
        .collect();
    fake_run(&a, "", &a_cells);
    fake_run(&b, "", &b_cells);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    for (condition, fails) in [
        ("p99 > +10%", true),
        ("p99 > +60%", false),
        ("p99 < -10%", false),
        ("p99 >= 1.5ms", true),
        ("p99 > 2", false),
        ("errors > 0", true),
        ("errors > 5", false),
        ("mean > +40%", true),
    ] {
        let out = ib(&["compare", a, b, "--fail-if", condition]);
        assert_eq!(
            out.status.code(),
            Some(if fails { 1 } else { 0 }),
            "{condition}: {}",
            text(&out)
        );
        assert_eq!(text(&out).contains("FAIL: "), fails, "{}", text(&out));
    }
    // Against itself: no measurable difference anywhere, and nothing fails.
    let same = ib(&["compare", a, a, "--fail-if", "p99 > +1%", "--json"]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same));
    let doc: serde_json::Value = serde_json::from_slice(&same.stdout).unwrap();
    for d in doc["differences"].as_array().unwrap() {
        assert_eq!(d["verdict"], "no_measurable_difference", "{d}");
    }
    // The +50% p99 is worse, with an interval that excludes zero.
    let out = ib(&["compare", a, b, "--metric", "p99", "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &doc["differences"][0];
    assert_eq!(
        (d["metric"].as_str(), d["verdict"].as_str()),
        (Some("p99"), Some("worse"))
    );
    assert!(d["relative_low"].as_f64().unwrap() > 0.4, "{d}");
    // Bad conditions are bad input.
    let bad = ib(&["compare", a, b, "--fail-if", "p98 > 1"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad).contains("write METRIC OP VALUE"),
        "{}",
        text(&bad)
    );
}

/// Rewrites a key of a results directory's run.json.
fn set_record(dir: &Path, key: &str, value: serde_json::Value) {
    let path = dir.join("run.json");
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record[key] = value;
    std::fs::write(path, record.to_string()).unwrap();
}

#[test]
fn a_gate_fails_closed_on_what_it_cannot_see() {
    let dir = scratch("report-closed");
    let run = |name: &str, cells: &[FakeCell<'_>]| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        fake_run(&d, "", cells);
        d
    };
    let both = || [cell("nginx", 0, 1000, 0), cell("haproxy", 0, 1000, 0)];
    let base = run("base", &both());
    let same = run("same", &both());
    let incomplete = run("incomplete", &both());
    set_record(&incomplete, "status", serde_json::json!("incomplete"));
    let missing = run("missing", &[cell("nginx", 0, 1000, 0)]);
    let mut garbage = both();
    garbage[0].summary = Some(serde_json::json!({ "requests": "lots", "latency_us": {} }));
    let garbage = run("garbage", &garbage);
    let gate = |other: &Path, extra: &[&str]| {
        let mut args = vec!["compare", base.to_str().unwrap(), other.to_str().unwrap()];
        args.extend(extra);
        ib(&args)
    };
    // The same results pass.
    let ok = gate(&same, &["--fail-if", "errors > 0"]);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok));
    // Each thing the gate cannot see fails it with its own code, and says what.
    for (other, says) in [
        (&incomplete, "is incomplete, not complete"),
        (&missing, "haproxy was measured in the baseline only"),
        (
            &garbage,
            "nginx, repeat 1 (cell 0) was recorded as done but cannot be read: summary.json is not a load summary: no number at requests.total",
        ),
    ] {
        let out = gate(other, &["--fail-if", "errors > 0"]);
        assert_eq!(out.status.code(), Some(3), "{}", text(&out));
        assert!(text(&out).contains("CANNOT JUDGE: "), "{}", text(&out));
        assert!(text(&out).contains(says), "{says}: {}", text(&out));
        let json = gate(other, &["--fail-if", "errors > 0", "--json"]);
        let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        assert!(!doc["cannot_judge"].as_array().unwrap().is_empty(), "{doc}");
    }
    // Without a gate it is a note, and no failure.
    let noted = gate(&missing, &[]);
    assert_eq!(noted.status.code(), Some(0), "{}", text(&noted));
    assert!(text(&noted).contains("note: haproxy was measured in the baseline only"));
}

#[test]
fn malformed_results_directories_are_refused_and_nothing_outside_is_read() {
    let dir = scratch("report-malformed");
    let secret = dir.join("secret.conf");
    std::fs::write(&secret, "server { # the secret outside }").unwrap();
    let good = dir.join("good");
    std::fs::create_dir_all(&good).unwrap();
    fake_run(&good, "", &[cell("nginx", 0, 1000, 0)]);
    // A link in the results directory to a file outside it is not followed.
    let conf = good
        .join("cells")
        .join("000-cell")
        .join("proxy")
        .join("nginx.conf");
    std::fs::remove_file(&conf).unwrap();
    std::os::unix::fs::symlink(&secret, &conf).unwrap();
    let out = ib(&["report", good.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let html = std::fs::read_to_string(good.join("report.html")).unwrap();
    assert!(
        !html.contains("the secret outside"),
        "the link was followed"
    );
    // Run records that are not runs, or whose cells point out of the directory.
    for (record, says) in [
        (
            serde_json::json!({ "status": "complete" }),
            "no `cells` list",
        ),
        (
            serde_json::json!({ "status": "complete", "cells": [] }),
            "has no cells",
        ),
        (serde_json::json!([1, 2]), "no `cells` list"),
        (
            serde_json::json!({ "status": "complete", "cells": [{ "status": "done", "dir": "../../.." }] }),
            "would leave the results directory",
        ),
        (
            serde_json::json!({ "status": "complete", "cells": [{ "status": "done", "dir": "/etc" }] }),
            "would leave the results directory",
        ),
    ] {
        let bad = dir.join("bad");
        std::fs::create_dir_all(&bad).unwrap();
        std::fs::write(bad.join("run.json"), record.to_string()).unwrap();
        for command in [vec!["report"], vec!["compare", good.to_str().unwrap()]] {
            let mut args = command.clone();
            args.push(bad.to_str().unwrap());
            let out = ib(&args);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{record} {command:?}: {}",
                text(&out)
            );
            assert!(text(&out).contains(says), "{record}: {}", text(&out));
        }
    }
}

#[test]
fn hostile_strings_in_results_produce_no_markup() {
    let dir = scratch("report-hostile");
    let evil = "<img src=x onerror=alert(1)><script>alert(2)</script>";
    let evil_settings = [("load.host", evil)];
    let mut c = cell(evil, 0, 900, 2);
    c.settings = &evil_settings;
    c.backend = "\"<svg onload=alert(3)>\"";
    c.summary = Some(summary(200, 900, 2, 1600, evil));
    c.impact = serde_json::json!([{ "what": evil, "requested_s": 1.0, "took_effect_basis": evil }]);
    let mut pending = cell("</style><script>x</script>", 0, 900, 0);
    pending.status = "pending";
    pending.summary = None;
    fake_run(
        &dir,
        &format!("name: x\ndescription: {evil}\n</pre></details>{evil}"),
        &[c, pending],
    );
    let out = ib(&["report", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    for raw in ["<script", "<img", "<svg onload", "</pre></details><img"] {
        assert!(!html.contains(raw), "`{raw}` in the report");
    }
    // No tag carries an event handler: hostile text stays text (inside quoted values,
    // whose own quotes are escaped, it is only text).
    for tag in html
        .split('<')
        .skip(1)
        .map(|t| t.split('>').next().unwrap_or(""))
    {
        let outside_quotes: String = tag.split('"').step_by(2).collect();
        let lower = outside_quotes.to_ascii_lowercase();
        assert!(
            !lower.contains("onerror") && !lower.contains("onload"),
            "a tag with a handler: <{tag}>"
        );
    }
    assert!(
        html.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "escaped, not dropped"
    );
    // The pending cell is marked as missing.
    assert!(
        html.contains("is pending: not measured"),
        "incomplete run marked"
    );
}

#[test]
fn a_million_sample_run_gives_a_small_report_from_every_request() {
    let _heavy = crate::common::heavy();
    let dir = scratch("report-million");
    // One cell whose statistics come from its interval log, with a million samples.
    let mut c = cell("nginx", 0, 5000, 0);
    c.latencies = (0..1_000_000u64).map(|k| 100 + (k * 7919) % 4900).collect();
    // Its interval log holds the million in each of 4 windows.
    c.summary = Some(summary(2550, 4950, 0, 4_000_000, ""));
    fake_run(&dir, "", &[c]);
    let started = Instant::now();
    let out = ib(&["report", dir.to_str().unwrap()]);
    let took = started.elapsed();
    assert!(out.status.success(), "{}", text(&out));
    let size = std::fs::metadata(dir.join("report.html")).unwrap().len();
    eprintln!("1,000,000 samples: report of {size} bytes written in {took:?}");
    assert!(size < 3 * 1024 * 1024, "{size} bytes");
    // Points are thinned for display only: p99 comes from all of them (the windows).
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.matches("<circle").count() <= 2 * 4000, "points drawn");
    let printed = text(&out);
    let row = printed
        .lines()
        .find(|l| l.starts_with("nginx"))
        .unwrap_or("");
    assert!(row.contains(" 4.9"), "{printed}");
}

/// The headline table of a known run, cell by cell: p50 and p99, the verdict against the
/// baseline (the first target, or `--baseline`), the errors with the event they fell in,
/// the event kind's took-effect times and the proxy's CPU; warnings grouped by kind.
#[test]
fn the_headline_table_gives_each_targets_figures_verdict_errors_and_events() {
    let dir = scratch("report-headline");
    let impact = |errors: u64| {
        serde_json::json!([
            { "what": "scale echo 3->4", "requested_s": 2.0, "took_effect_s": 2.4, "errors": errors },
            { "what": "CORS https://a.example", "requested_s": 3.0, "took_effect_s": 3.1, "errors": 0 },
        ])
    };
    let mut cells = Vec::new();
    for repeat in 0..3 {
        let mut fast = cell("nginx", repeat, 1000, 0);
        fast.impact = impact(0);
        cells.push(fast);
        let mut slow = cell("envoy", repeat, 2000, 5);
        slow.impact = impact(5);
        slow.summary = Some(summary(500, 2000, 5, 1600, "CONNECT RAMP: the 10 connections were still opening 12 ms after the first request was due"));
        cells.push(slow);
    }
    fake_run(&dir, "", &cells);
    let mut record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    for c in record["cells"].as_array_mut().unwrap() {
        let cpu = if c["target"] == "nginx" { 12.0 } else { 30.0 };
        c["usage"] =
            serde_json::json!({ "by_role": { "proxy": { "cpu_ms_per_1000_requests": cpu } } });
    }
    std::fs::write(dir.join("run.json"), record.to_string()).unwrap();
    let out = ib(&["report", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let printed = text(&out);
    let row = |target: &str| {
        printed
            .lines()
            .find(|l| l.starts_with(target))
            .unwrap_or_else(|| panic!("no row for {target}: {printed}"))
            .to_owned()
    };
    let nginx = row("nginx");
    assert!(nginx.contains("0.250") && nginx.contains("1.00"), "{nginx}");
    assert!(
        nginx.contains("baseline") && nginx.contains("12 ms"),
        "{nginx}"
    );
    assert!(
        nginx.contains("scale ×3 0.40/0.40") && nginx.contains("route change ×3 0.10/0.10"),
        "{nginx}"
    );
    let envoy = row("envoy");
    assert!(envoy.contains("worse +100%"), "{envoy}");
    assert!(envoy.contains("15 of 4800 (#1 scale 3→4: 5)"), "{envoy}");
    assert!(envoy.contains("30 ms"), "{envoy}");
    // Three cells' warnings of one kind: one line.
    assert!(
        printed.contains("3 × CONNECT RAMP: the 10 connections"),
        "{printed}"
    );
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(
        html.contains("<td class=\"l bad\">worse +100%</td>"),
        "{html:.3000}"
    );
    assert!(
        html.contains("<summary>3 × CONNECT RAMP: the 10 connections"),
        "{html:.3000}"
    );
    // Against envoy, nginx is the better one.
    let out = ib(&["report", dir.to_str().unwrap(), "--baseline", "envoy"]);
    assert!(out.status.success(), "{}", text(&out));
    let printed = text(&out);
    let nginx = printed
        .lines()
        .find(|l| l.starts_with("nginx"))
        .unwrap_or("");
    assert!(nginx.contains("better -50%"), "{printed}");
    let none = ib(&["report", dir.to_str().unwrap(), "--baseline", "traefik"]);
    assert_eq!(none.status.code(), Some(2), "{}", text(&none));
    assert!(text(&none).contains("has envoy, nginx"), "{}", text(&none));
}

/// Share of pixels that are not near-white in a PNG.
fn ink(path: &Path) -> f64 {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let pixels = &buf[..info.buffer_size()];
    let total = pixels.len() / channels;
    let inked = pixels
        .chunks(channels)
        .filter(|p| p.iter().take(3).any(|c| *c < 200))
        .count();
    inked as f64 / total as f64
}

#[test]
fn the_report_of_a_real_run_renders_in_chromium_without_errors_and_every_chart_has_ink() {
    let _heavy = crate::common::heavy();
    let dir = scratch("report-real");
    let file = dir.join("small.yaml");
    std::fs::write(
        &file,
        "
name: small
description: two proxies, a scale-up, two rates
targets: [nginx, haproxy]
tls: false
backends: [{ name: echo, replicas: 2 }]
load: { mode: open, rate: 200, connections: 10, duration: 3s, sample_rate: 1 }
events:
  - { at: 1s, scale: 3 }
matrix: { load.rate: [100, 200] }
",
    )
    .unwrap();
    let out = dir.join("out");
    let run = Command::new(BIN)
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", text(&run));
    let report = ib(&["report", out.to_str().unwrap(), "--png"]);
    assert!(report.status.success(), "{}", text(&report));
    let printed = text(&report);
    // The headline table: a row per target and rate, the first target the baseline.
    let rows: Vec<&str> = printed
        .lines()
        .filter(|l| l.starts_with("nginx") || l.starts_with("haproxy"))
        .collect();
    assert_eq!(rows.len(), 4, "{printed}");
    assert!(
        rows[0].contains("load.rate=100") && rows[0].contains("baseline"),
        "{printed}"
    );
    // Its scale event is named in the table's took-effect column and on the charts.
    assert!(rows[0].contains("scale ×1"), "{printed}");
    assert!(
        std::fs::read_to_string(out.join("report.html"))
            .unwrap()
            .contains("1 scale 2→3"),
        "the event's marker is labelled with what it did"
    );
    let html = out.join("report.html");
    // The page loads in a real browser with nothing logged to its console.
    let browser = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
        ])
        .arg(format!("file://{}", html.display()))
        .output()
        .expect("chromium runs (apt-get install chromium)");
    let log = String::from_utf8_lossy(&browser.stderr);
    assert!(browser.status.success(), "{log}");
    assert!(!log.contains(":CONSOLE"), "console output: {log}");
    let dom = String::from_utf8_lossy(&browser.stdout);
    assert!(
        dom.contains("Latency over time") && dom.contains("<svg"),
        "{dom:.500}"
    );
    // Every chart, drawn by the browser, is more than a blank canvas.
    let mut charts: Vec<PathBuf> = std::fs::read_dir(out.join("charts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
        .collect();
    charts.sort();
    // 4 timelines with their proxy CPU, 2 spectra, 2 x 6 bars, a sweep (and phases:
    // connections were opened).
    let named = |kind: &str| {
        charts
            .iter()
            .filter(|p| p.to_string_lossy().contains(kind))
            .count()
    };
    assert_eq!(
        (
            named("timeline"),
            named("cpu"),
            named("spectrum"),
            named("bars"),
            named("sweep")
        ),
        (4, 4, 2, 12, 1),
        "{charts:?}"
    );
    // The comparison says what the proxies spent, with a number for each.
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("proxy CPU (ms per 1,000 requests)"),
        "{page:.300}"
    );
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    // A number for every cell; /proc counts CPU in 10 ms ticks, which a cell of 300
    // requests to nginx can stay under (seen once in CI-like load), so more than zero is
    // asked of the run's cells together.
    let cpu: Vec<f64> = record["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            c["usage"]["by_role"]["proxy"]["cpu_ms_per_1000_requests"]
                .as_f64()
                .unwrap_or_else(|| panic!("{}", c["usage"]))
        })
        .collect();
    assert!(cpu.iter().sum::<f64>() > 0.0, "{cpu:?}");
    for chart in &charts {
        let share = ink(chart);
        assert!(share > 0.01, "{}: {share} of pixels inked", chart.display());
    }
}

#[test]
fn a_single_load_output_gets_a_report_too() {
    use std::io::BufRead;
    let dir = scratch("report-single");
    let mut backend = Command::new(BIN)
        .args(["backend", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(backend.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    let json = dir.join("run.json.out");
    let (json_s, hlog_s) = (
        dir.join("load.json").display().to_string(),
        dir.join("load.hlog").display().to_string(),
    );
    let load = ib(&[
        "load",
        "-R",
        "200",
        "-c",
        "4",
        "-d",
        "3s",
        "--json",
        &json_s,
        "--hlog",
        &hlog_s,
        &format!("http://{addr}/"),
    ]);
    let _ = backend.kill();
    let _ = backend.wait();
    assert!(load.status.success(), "{}", text(&load));
    let out = ib(&["report", &json_s]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(" p99 "), "{}", text(&out));
    let html = std::fs::read_to_string(dir.join("load.html")).unwrap();
    // Its windows drawn: the p50 and p99 lines of latency over time, and a spectrum.
    assert!(
        html.contains("Latency over time") && html.contains("<polyline"),
        "{html:.300}"
    );
    assert!(!json.exists());
}

#[test]
fn a_gate_cannot_judge_a_run_with_a_done_cell_it_cannot_read() {
    let dir = scratch("report-unreadable");
    let base = dir.join("base");
    std::fs::create_dir_all(&base).unwrap();
    fake_run(
        &base,
        "",
        &(0..3)
            .map(|r| cell("nginx", r, 1000, 0))
            .collect::<Vec<_>>(),
    );
    // Each way one repeat of a +215% candidate (with 3 errors) can be broken.
    type Break = fn(&Path);
    let breaks: [(&str, Break, &str); 9] = [
        (
            "summary deleted",
            |p| std::fs::remove_file(p.join("summary.json")).unwrap(),
            "No such file",
        ),
        (
            "summary empty",
            |p| std::fs::write(p.join("summary.json"), "").unwrap(),
            "summary.json is not JSON",
        ),
        (
            "summary {}",
            |p| std::fs::write(p.join("summary.json"), "{}").unwrap(),
            "no number at requests.total",
        ),
        (
            "summary outcomes short of its requests",
            |p| {
                let file = p.join("summary.json");
                let mut v: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
                v["outcomes"] = serde_json::json!({ "200": 1500, "reset": 3 });
                std::fs::write(&file, v.to_string()).unwrap();
            },
            "summary.json's outcomes count 1503 requests (3 failed) and its requests 1600 (3 errors)",
        ),
        (
            "summary a link",
            |p| {
                let real = p.join("real.json");
                std::fs::rename(p.join("summary.json"), &real).unwrap();
                std::os::unix::fs::symlink(&real, p.join("summary.json")).unwrap();
            },
            "is a link",
        ),
        (
            "hlog cut",
            |p| {
                // The last interval and the outcomes line after it.
                let log = std::fs::read(p.join("latency.hlog")).unwrap();
                let mut end = log.len() - 1;
                for _ in 0..2 {
                    end = log[..end].iter().rposition(|b| *b == b'\n').unwrap();
                }
                std::fs::write(p.join("latency.hlog"), &log[..=end]).unwrap();
            },
            "latency.hlog holds 1200 answered requests and the summary counts 1600",
        ),
        (
            "hlog garbage line",
            |p| {
                let mut log = std::fs::read(p.join("latency.hlog")).unwrap();
                log.extend_from_slice(b"1.0,2.0,not,a line\n");
                std::fs::write(p.join("latency.hlog"), log).unwrap();
            },
            "latency.hlog",
        ),
        (
            "hlog a FIFO",
            |p| {
                std::fs::remove_file(p.join("latency.hlog")).unwrap();
                assert!(Command::new("mkfifo")
                    .arg(p.join("latency.hlog"))
                    .status()
                    .unwrap()
                    .success());
            },
            "not a regular file",
        ),
        (
            "cell directory a link",
            |p| {
                let moved = p.with_extension("moved");
                std::fs::rename(p, &moved).unwrap();
                std::os::unix::fs::symlink(&moved, p).unwrap();
            },
            "is a link",
        ),
    ];
    for (i, (what, break_it, says)) in breaks.into_iter().enumerate() {
        let other = dir.join(format!("other-{i}"));
        std::fs::create_dir_all(&other).unwrap();
        fake_run(
            &other,
            "",
            &(0..3)
                .map(|r| cell("nginx", r, 3150, 3))
                .collect::<Vec<_>>(),
        );
        break_it(&other.join("cells").join("001-cell"));
        for gate in ["p99 > +50%", "errors > 0"] {
            let out = ib(&[
                "compare",
                base.to_str().unwrap(),
                other.to_str().unwrap(),
                "--fail-if",
                gate,
            ]);
            let t = text(&out);
            assert_eq!(out.status.code(), Some(3), "{what}, {gate}: {t}");
            assert!(t.contains("CANNOT JUDGE: "), "{what}: {t}");
            assert!(
                t.contains("nginx, repeat 2 (cell 1) was recorded as done but cannot be read"),
                "{what}: {t}"
            );
            assert!(t.contains(says), "{what}: `{says}` not in {t}");
        }
        // The report says so too, and draws nothing from that cell.
        let out = ib(&["report", other.to_str().unwrap()]);
        let t = text(&out);
        assert!(out.status.success(), "{what}: {t}");
        assert!(t.contains("UNREADABLE: 1 of the cells"), "{what}: {t}");
        assert!(t.contains("nginx, repeat 2 (cell 1): "), "{what}: {t}");
        let html = std::fs::read_to_string(other.join("report.html")).unwrap();
        assert!(
            html.contains("nginx, repeat 2 (cell 1)"),
            "{what}: the report does not name it"
        );
    }
}

#[test]
fn a_report_written_into_a_directory_from_elsewhere_replaces_a_link_rather_than_following_it() {
    let dir = scratch("report-link-out");
    let run = dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    fake_run(&run, "", &[cell("nginx", 0, 1000, 0)]);
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    std::os::unix::fs::symlink(&victim, run.join("report.html")).unwrap();
    let out = ib(&["report", run.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    let report = run.join("report.html");
    assert!(!report.symlink_metadata().unwrap().file_type().is_symlink());
    assert!(std::fs::read_to_string(report).unwrap().contains("<html"));
}

/// `export prometheus` writes what the run recorded and refuses what it cannot have:
/// two events of a kind in one millisecond are two samples Prometheus keeps (read back by
/// promtool's own backfill and dump), and a StartTime of 1e30, NaN or before the epoch, or
/// an events.jsonl line over the 1 MiB limit, ends the export with the cell and the value
/// named and nothing written.
#[test]
fn an_export_keeps_every_event_and_refuses_times_and_lines_no_run_recorded() {
    let dir = scratch("export-refusals");
    let out = dir.join("run");
    fake_run(&out, "name: fake\n", &[cell("nginx", 0, 4000, 0)]);
    let events = out.join("cells/000-cell/events.jsonl");
    let event = |requested: f64, kind: &str| {
        format!(
            "{{\"event\":0,\"kind\":\"{kind}\",\"what\":\"{kind}\",\"requested_s\":{requested}}}\n"
        )
    };
    std::fs::write(
        &events,
        [
            event(1.0, "kill"),
            event(1.0002, "kill"),
            event(2.0, "scale"),
        ]
        .concat(),
    )
    .unwrap();
    let om = dir.join("run.om");
    let export = |extra: &[&str]| {
        let mut args = vec!["export", "prometheus", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        ib(&args)
    };
    let written = export(&["--out", om.to_str().unwrap()]);
    assert!(written.status.success(), "{}", text(&written));
    let db = dir.join("tsdb");
    let backfill = Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&om)
        .arg(&db)
        .output()
        .expect("promtool (Debian's prometheus package)");
    assert!(backfill.status.success(), "{}", text(&backfill));
    // promtool 2.42 reads a write-ahead log beside the blocks, which a backfill does not make.
    std::fs::create_dir_all(db.join("wal")).unwrap();
    let dump = Command::new("promtool")
        .args([
            "tsdb",
            "dump",
            "--match",
            "{__name__=\"ingressbench_events_total\"}",
        ])
        .arg(&db)
        .output()
        .unwrap();
    assert!(dump.status.success(), "{}", text(&dump));
    let dumped = String::from_utf8_lossy(&dump.stdout);
    let kills: Vec<&str> = dumped
        .lines()
        .filter(|l| l.contains("kind=\"kill\""))
        .collect();
    // 0 at the start, then 1 and 2: both kills kept.
    assert_eq!(kills.len(), 3, "{dumped}");
    assert!(kills.iter().any(|l| l.contains(" 2 ")), "{dumped}");

    let hlog = out.join("cells/000-cell/latency.hlog");
    let original = std::fs::read_to_string(&hlog).unwrap();
    let start_line = original
        .lines()
        .find(|l| l.starts_with("#[StartTime: "))
        .unwrap()
        .to_owned();
    for bad in ["1e30", "NaN", "-5e9"] {
        std::fs::write(
            &hlog,
            original.replace(
                &start_line,
                &format!("#[StartTime: {bad} (seconds since epoch)]"),
            ),
        )
        .unwrap();
        let refused = export(&[]);
        assert!(
            !refused.status.success(),
            "StartTime {bad}: {}",
            text(&refused)
        );
        assert!(
            text(&refused).contains("StartTime") && text(&refused).contains("nothing exported"),
            "StartTime {bad}: {}",
            text(&refused)
        );
        assert!(
            refused.stdout.is_empty(),
            "StartTime {bad}: wrote {} bytes",
            refused.stdout.len()
        );
    }
    std::fs::write(&hlog, &original).unwrap();

    let long = format!(
        "{{\"event\":0,\"kind\":\"kill\",\"requested_s\":1.0,\"what\":\"{}\"}}\n",
        "x".repeat(2 << 20)
    );
    std::fs::write(&events, [event(1.0, "kill"), long].concat()).unwrap();
    let refused = export(&[]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("longer than"), "{}", text(&refused));

    std::fs::write(&events, event(1e30, "kill")).unwrap();
    let refused = export(&[]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        text(&refused).contains("outside its run"),
        "{}",
        text(&refused)
    );
}

/// A route probe's results that say nothing, or what no probe records, are said: a
/// `routes.json` with no firing gets a sentence in the section and the headline (not a
/// section that vanishes), and one with a negative figure makes its cell unreadable, named.
#[test]
fn route_results_with_no_firing_are_said_and_negative_figures_refused() {
    let dir = scratch("report-routes");
    let out = dir.join("run");
    fake_run(
        &out,
        "name: fake\n",
        &[cell("nginx", 0, 4000, 0), cell("haproxy", 0, 4000, 0)],
    );
    let routes = |firings: serde_json::Value| {
        serde_json::json!({
            "probe": { "rate": 100, "connections": 2, "cpu_ms": 3.0 },
            "tool_cpu_ms": 5.0,
            "firings": firings,
        })
        .to_string()
    };
    std::fs::write(
        out.join("cells/000-cell/routes.json"),
        routes(serde_json::json!([])),
    )
    .unwrap();
    std::fs::write(
        out.join("cells/001-cell/routes.json"),
        routes(serde_json::json!([{ "requested_s": 1.0, "routes_after": -5, "added": 5 }])),
    )
    .unwrap();
    let report = ib(&["report", out.to_str().unwrap()]);
    let said = text(&report);
    assert!(report.status.success(), "{said}");
    assert!(
        said.contains("nginx, repeat 1 (cell 0): the route probe ran and no route change fired"),
        "{said}"
    );
    assert!(said.contains("UNREADABLE: 1 of the cells"), "{said}");
    assert!(
        said.contains("routes.json: firings[0].routes_after is negative"),
        "{said}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("no route change fired"));
    assert!(!html.contains("at -5 routes"));
}

/// Copies the tree at `from` into `to` (files and directories only).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A results directory written by ingressbench 0.1.0 before the results files became
/// types (tests/fixtures/old-format.yaml: an HTTP cell and a WebSocket cell through Envoy,
/// with a scale, a kill, a route change and a reload) reads as it did: the same table,
/// sentences and warnings as the tool of then printed for it, every cell readable. A
/// record of a newer major format is refused, naming it.
#[test]
fn results_written_before_the_types_read_the_same_and_a_newer_format_is_refused() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = scratch("old-format");
    copy_tree(&fixtures.join("results-0.1.0"), &dir);
    let out = ib(&["report", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let printed: String = String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
        .filter(|l| !l.starts_with("report: "))
        .map(|l| format!("{l}\n"))
        .collect();
    let then = std::fs::read_to_string(fixtures.join("results-0.1.0.report.txt")).unwrap();
    assert_eq!(printed, then);
    let read = ingressbench_report::results::read(&dir).unwrap();
    assert_eq!(read.cells.len(), 2);
    assert!(read.notes.is_empty(), "{:?}", read.notes);
    assert!(read.cells.iter().all(|c| c.unreadable.is_empty()));
    assert_eq!(read.cells[0].impact.len(), 4);
    assert!(read.cells[1].websocket.is_some());
    // The same record in a format from the future.
    let record = dir.join("run.json");
    let mut value: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    value["format_version"] = "2.0".into();
    std::fs::write(&record, serde_json::to_vec(&value).unwrap()).unwrap();
    let newer = ib(&["report", dir.to_str().unwrap()]);
    assert_eq!(newer.status.code(), Some(2), "{}", text(&newer));
    assert!(
        text(&newer).contains("results format 2.0, newer than"),
        "{}",
        text(&newer)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
