//! End-to-end tests of the `ingressbench` binary: exit codes, messages and output files.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{scratch, server, BIN};

fn ib(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn outputs_are_written_and_agree_with_each_other() {
    let addr = server();
    let dir = scratch("cli-outputs");
    let (json, hgrm, hlog, samples) = (
        dir.join("s.json"),
        dir.join("s.hgrm"),
        dir.join("s.hlog"),
        dir.join("s.csv.gz"),
    );
    let out = ib(&[
        "load",
        "-R",
        "400",
        "-d",
        "2s",
        "-c",
        "4",
        "--json",
        path_str(&json),
        "--hgrm",
        path_str(&hgrm),
        "--hlog",
        path_str(&hlog),
        "--samples",
        path_str(&samples),
        "--sample-rate",
        "0.5",
        "--latency",
        &format!("http://{addr}/"),
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("corrected for coordinated omission"),
        "{stdout}"
    );
    assert!(stdout.contains("Detailed percentile spectrum"), "{stdout}");

    // The JSON validates against the checked-in schema.
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let schema_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/schema/load-summary.schema.json");
    let schema: serde_json::Value =
        serde_json::from_slice(&std::fs::read(schema_path).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&summary)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(errors.is_empty(), "schema errors: {errors:?}");
    let total = summary["requests"]["total"].as_u64().unwrap();
    assert_eq!(total, 800);
    assert_eq!(summary["backends"]["cli"].as_u64(), Some(800));
    assert_eq!(summary["rate"]["target_per_s"].as_f64(), Some(400.0));

    // The .hgrm spectrum brackets the JSON's percentiles: the last row below each
    // percentile is at or under it, the first row at or past it is at or over it.
    let rows = ingressbench_report::hgrm::parse(&std::fs::read_to_string(&hgrm).unwrap()).unwrap();
    for (p, key) in [(50.0, "p50"), (90.0, "p90"), (99.0, "p99")] {
        let json_ms = summary["latency_us"][key].as_f64().unwrap() / 1000.0;
        let at_or_past = ingressbench_report::hgrm::value_at(&rows, p).unwrap();
        let below = rows
            .iter()
            .filter(|r| r.percentile * 100.0 < p)
            .map(|r| r.value_ms)
            .fold(0.0, f64::max);
        assert!(
            below <= json_ms + 0.001 && json_ms <= at_or_past + 0.001,
            "{key}: {below} <= {json_ms} <= {at_or_past}"
        );
    }
    assert_eq!(rows.last().unwrap().total_count, total);

    // The interval log holds every request, one interval per second.
    let intervals = ingressbench_results::hlog::read(&std::fs::read(&hlog).unwrap()).unwrap();
    assert!(intervals.len() >= 2, "{} intervals", intervals.len());
    assert_eq!(
        intervals.iter().map(|i| i.histogram.count()).sum::<u64>(),
        total
    );

    // About half the requests were sampled, each row with every column.
    let mut csv = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&samples).unwrap())
        .read_to_string(&mut csv)
        .unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert!(
        (250..=550).contains(&rows.len()),
        "{} sampled rows",
        rows.len()
    );
    let columns = ingressbench_results::samples::HEADER.split(',').count();
    assert!(rows.iter().all(|r| r.split(',').count() == columns));
}

#[test]
fn bad_input_exits_2_and_says_what_would_be_valid() {
    for (args, expected) in [
        (vec!["load", "ftp://x/"], "http:// or https://"),
        (
            vec!["load", "-H", "no colon", "http://127.0.0.1:1/"],
            "Name: value",
        ),
        (vec!["load", "--rate", "0", "http://127.0.0.1:1/"], "--rate"),
        (
            vec!["load", "--resolve", "nonsense", "http://127.0.0.1:1/"],
            "host:port:address",
        ),
        (
            vec!["load", "--threads", "4", "-c", "2", "http://127.0.0.1:1/"],
            "--threads",
        ),
        (
            vec![
                "load",
                "--json",
                "/nonexistent-dir/x.json",
                "http://127.0.0.1:1/",
            ],
            "cannot create /nonexistent-dir/x.json",
        ),
        (
            vec!["load", "-d", "ten", "http://127.0.0.1:1/"],
            "not a duration",
        ),
        (
            vec!["load", "--streams", "10", "http://127.0.0.1:1/"],
            "--http2",
        ),
        (
            vec!["load", "--http2", "--streams", "0", "http://127.0.0.1:1/"],
            "--streams",
        ),
    ] {
        let out = ib(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn an_unreachable_target_fails_the_run_with_a_hint() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = scratch("cli-unreachable");
    let (hgrm, hlog) = (dir.join("u.hgrm"), dir.join("u.hlog"));
    let out = ib(&[
        "load",
        "-n",
        "3",
        "-c",
        "1",
        "--hgrm",
        path_str(&hgrm),
        "--hlog",
        path_str(&hlog),
        &format!("http://127.0.0.1:{port}/"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    // Every output says what went wrong, and the files still parse.
    let hgrm_text = std::fs::read_to_string(&hgrm).unwrap();
    assert!(
        hgrm_text.contains("#[WARNING: NO REQUEST SUCCEEDED"),
        "{hgrm_text}"
    );
    assert!(ingressbench_report::hgrm::parse(&hgrm_text).is_ok());
    let hlog_bytes = std::fs::read(&hlog).unwrap();
    assert!(String::from_utf8_lossy(&hlog_bytes).contains("#WARNING: NO REQUEST SUCCEEDED"));
    assert!(ingressbench_results::hlog::read(&hlog_bytes).is_ok());
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("NO REQUEST SUCCEEDED") && stdout.contains("is the server running"),
        "{stdout}"
    );
}

#[test]
fn ctrl_c_keeps_what_was_measured() {
    let addr = server();
    let dir = scratch("cli-sigint");
    let (json, hlog) = (dir.join("s.json"), dir.join("s.hlog"));
    let child = Command::new(BIN)
        .args([
            "load",
            "-R",
            "200",
            "-d",
            "60s",
            "--json",
            path_str(&json),
            "--hlog",
            path_str(&hlog),
            &format!("http://{addr}/"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(summary["interrupted"], true);
    assert!(summary["requests"]["ok"].as_u64().unwrap() > 200);
    let intervals = ingressbench_results::hlog::read(&std::fs::read(&hlog).unwrap()).unwrap();
    assert!(intervals.len() >= 2);
}

fn scenario_schema() -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/schema/scenario.schema.json");
    let schema: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

fn yaml_as_json(text: &str) -> serde_json::Value {
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).unwrap();
    serde_json::to_value(value).unwrap()
}

#[test]
fn the_scenario_schema_accepts_every_shipped_scenario_and_rejects_what_the_tool_rejects() {
    let schema = scenario_schema();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let mut shipped = 0;
    for entry in std::fs::read_dir(root).unwrap() {
        let path = entry.unwrap().path();
        let json = yaml_as_json(&std::fs::read_to_string(&path).unwrap());
        let errors: Vec<String> = schema.iter_errors(&json).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", path.display());
        shipped += 1;
    }
    assert!(shipped >= 4, "{shipped} scenarios");
    let base = "name: s\ntargets: [nginx]\nload: { rate: 10, duration: 1s }\n";
    assert!(schema.is_valid(&yaml_as_json(base)));
    let bad = [
        "name: s\ntargets: [nginx]\nload: { rate: 10, duration: 1s }\nextra: 1\n",
        "name: s\ntargets: [squid]\nload: { rate: 10, duration: 1s }\n",
        "name: s\ntargets: [nginx]\nload: { rate: 10, duration: 1 second }\n",
        "name: s\ntargets: [nginx]\nload: { rate: 10, duration: 1s, mode: burst }\n",
        "name: s\ntargets: [nginx]\nload: { rate: 10, duration: 1s }\nevents: [{ at: 1s, scale: 2, kill: random }]\n",
        "name: s\ntargets: [nginx]\nload: { rate: 10, duration: 1s }\nevents: [{ scale: 2 }]\n",
        "name: s\ntargets: [nginx]\nload: { rate: 10, duration: 1s }\nmatrix: { targets: [[nginx]] }\n",
        "name: s\ntargets: [{ upstream: ftp://x, name: x }]\nload: { rate: 10, duration: 1s }\n",
        "name: s\ntargets: [nginx]\nload: { rate: 10, duration: 1s }\nrepeat: 0\n",
        "name: s\ntargets: [{ proxy: nginx, hop: { proxy: haproxy } }]\nload: { rate: 10, duration: 1s }\n",
        "name: s\ntargets: [{ proxy: nginx, front: { replicas: 0 } }]\nload: { rate: 10, duration: 1s }\n",
        "name: s\ntargets: [{ cluster: contour, front: { replicas: 2 } }]\nload: { rate: 10, duration: 1s }\n",
        "name: s\ntargets: [{ cluster: contour, hop: { proxy: nginx } }]\nload: { rate: 10, duration: 1s }\n",
        "name: s\ntargets: [nginx]\nroutes: { count: many }\nload: { rate: 10, duration: 1s }\n",
        "name: s\ntargets: [nginx]\nload: { rate: 10, duration: 2s }\nevents: [{ at: 1s, add_routes: 5, scale: 2 }]\n",
        "name: s\ntargets: [nginx]\nload: { rate: 10, duration: 1s, retry: twice }\n",
        "name: s\ntargets: [nginx]\ntls: true\nload: { rate: 10, duration: 1s, protocol: http4 }\n",
        "name: s\ntargets: [nginx]\ntls: true\nload: { rate: 10, duration: 1s, protocol: http2, streams: 0 }\n",
        "name: s\ntargets: [nginx]\nload: { rate: 10, duration: 1s }\ntopology: { isolation: netns }\ntuning: { sysctls: { fs.file-max: 100000 } }\n",
        "name: s\ntargets: [nginx]\nload: { warmup: 1s }\nsearch: { slo: ['p99 > 5ms'], from: 10, up_to: 100 }\n",
        "name: s\ntargets: [nginx]\nload: { warmup: 1s }\nsearch: { slo: [], from: 10, up_to: 100 }\n",
        "name: s\ntargets: [nginx]\nload: { warmup: 1s }\nsearch: { slo: ['p99 < 5ms'], from: 10, up_to: 100, precision: 5 }\n",
    ];
    let dir = std::env::temp_dir().join(format!("ib-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, text) in bad.iter().enumerate() {
        assert!(
            !schema.is_valid(&yaml_as_json(text)),
            "schema accepts: {text}"
        );
        let file = dir.join(format!("bad{i}.yaml"));
        std::fs::write(&file, text).unwrap();
        let check = Command::new(BIN)
            .args(["scenario", "check"])
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(check.status.code(), Some(2), "the tool accepts: {text}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The demo's set-up, from a fresh tree: `install-deps.sh --lab` installs and checks what
/// the lab needs and nothing of the local cluster (no Go build, nothing in the cache the
/// cluster's scripts fill), and says what it left for the test command.
#[test]
fn the_demo_installs_the_lab_alone_and_builds_no_part_of_the_cluster() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tree = scratch("demo-setup");
    // A fresh tree: the scripts, and the project's .venv (its pinned Envoy and Traefik,
    // which the script checks by version) rather than a download of them.
    let copied = Command::new("cp")
        .arg("-r")
        .arg(root.join("scripts"))
        .arg(&tree)
        .status()
        .unwrap();
    assert!(copied.success());
    std::os::unix::fs::symlink(
        root.join(".venv").canonicalize().unwrap(),
        tree.join(".venv"),
    )
    .unwrap();
    // A `go` that says it was called: the cluster's parts are Go builds.
    let marker = tree.join("go-was-called");
    let path = crate::common::fake_go(&tree, &format!("touch {}\nexit 1", marker.display()));
    let cache = tree.join("cache");
    let out = Command::new("bash")
        .arg(tree.join("scripts/install-deps.sh"))
        .arg("--lab")
        .env("PATH", path)
        .env("INGRESSBENCH_CACHE", &cache)
        .output()
        .unwrap();
    let said = crate::common::text(&out);
    assert!(out.status.success(), "{said}");
    for part in ["nginx", "haproxy", "caddy", "envoy", "traefik"] {
        assert!(
            said.lines().any(|l| l.trim_start().starts_with(part)),
            "{part}: {said}"
        );
    }
    assert!(said.contains("the lab only (--lab)"), "{said}");
    assert!(
        !said.contains("kube-binaries.sh") && !said.contains("controllers.sh"),
        "{said}"
    );
    assert!(!marker.exists(), "the lab's set-up ran go: {said}");
    assert!(
        !cache.exists(),
        "the lab's set-up filled the cluster's cache: {said}"
    );
}
