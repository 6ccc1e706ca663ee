//! `ingressbench capacity` against servers whose limits are known by construction.

use std::process::Command;

use crate::backend::Backend;
use crate::common::{scratch, BIN};

/// One search at a time: the generator-limited one saturates a core, which the other's
/// trials would otherwise share.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `capacity` of `backend` with `args` (`tag`: the test's own scratch directory); its
/// output and the JSON it wrote.
fn capacity(
    backend: &Backend,
    tag: &str,
    args: &[&str],
) -> (std::process::Output, serde_json::Value) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let json = scratch(&format!("capacity-{tag}")).join("capacity.json");
    let out = Command::new(BIN)
        .arg("capacity")
        .arg(format!("http://{}/", backend.addr))
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let doc = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    (out, doc)
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A server that answers one request at a time, each taking 0.5 ms: it serves 2,000 a
/// second and queues the rest, so above 2,000 every answer waits longer than the last.
/// The search brackets that to 2% and reports a capacity within 5% of it; every trial is
/// in the JSON with its figures and their intervals.
#[test]
fn the_capacity_of_a_server_of_known_capacity_is_found_within_five_percent() {
    let backend = Backend::start(&[
        "--listen",
        "127.0.0.1:0",
        "--name",
        "known",
        "--serve-at-most",
        "2000",
    ]);
    let (out, doc) = capacity(
        &backend,
        "known",
        &[
            "--slo",
            "p99 < 50ms",
            "--slo",
            "errors < 0.1%",
            "--from",
            "1000",
            "--up-to",
            "8000",
            "--precision",
            "2%",
            "--trial",
            "3s",
            "--warmup",
            "1s",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let said = doc["outcome"].as_str().unwrap();
    let found: f64 = said
        .strip_prefix("capacity ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}\n{}", text(&out)));
    assert!(
        (1900.0..=2100.0).contains(&found),
        "found {found} req/s, built to serve 2000\n{}",
        text(&out)
    );
    let trials = doc["trials"].as_array().unwrap();
    assert!(trials.len() <= 12, "{}", text(&out));
    assert_eq!(trials[0]["rate_per_s"], 1000.0);
    assert_eq!(trials[0]["verdict"], "pass", "{}", text(&out));
    for t in trials {
        let share = &t["figures"][0];
        let [lo, hi] = [
            share["interval"][0].as_f64().unwrap(),
            share["interval"][1].as_f64().unwrap(),
        ];
        assert!(
            lo <= share["value"].as_f64().unwrap() && share["value"].as_f64().unwrap() <= hi,
            "{t}"
        );
    }
}

/// A server faster than the generator (answers at once; the generator asked for
/// 200,000 requests a second on one thread): the search stops saying the generator was
/// the limit, with its lag or CPU, and reports no capacity.
#[test]
fn a_server_faster_than_the_generator_is_reported_as_generator_limited() {
    let backend = Backend::start(&["--listen", "127.0.0.1:0", "--name", "fast"]);
    let (out, doc) = capacity(
        &backend,
        "fast",
        &[
            "--slo",
            "p99 < 1ms",
            "--from",
            "200000",
            "--up-to",
            "400000",
            "--trial",
            "2s",
            "--warmup",
            "0s",
            "-c",
            "20",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = doc["outcome"].as_str().unwrap();
    assert!(
        said.starts_with("limited by the generator at 200000 req/s"),
        "{said}"
    );
    assert!(!text(&out).contains("capacity 2"), "{}", text(&out));
}
