//! `ingressbench capacity` against servers whose limits are known by construction.
//!
//! A test binary of its own, which scripts/test.sh runs alone, first: a search
//! judges the generator's lateness and latencies of a millisecond, which the end-to-end
//! tests beside it (two local clusters, five proxies under load) would add to, and did
//! (the start rate of a search for `p99 < 1ms` failing, a straddle ending as
//! generator-limited at 200 req/s). Its searches are one test, run in turn, for the same
//! reason. A scenario's searches, whose objective leaves room for a busy machine, are
//! end-to-end tests (tests/it/search.rs).

use std::process::Command;

#[allow(dead_code)]
#[path = "it/common.rs"]
mod common;
#[allow(dead_code)]
#[path = "it/process.rs"]
mod process;

use common::{scratch, text, BIN};
use process::Backend;

/// The searches below, in turn: each judges the generator's lateness, which another
/// search's trials beside it would add to.
#[test]
fn capacity_searches_find_what_servers_of_known_capacity_take() {
    let searches: [(&str, fn()); 4] = [
        (
            "known capacity",
            the_capacity_of_a_server_of_known_capacity_is_found_within_five_percent,
        ),
        (
            "generator-limited",
            a_server_faster_than_the_generator_is_reported_as_generator_limited,
        ),
        (
            "down from a failing rate",
            a_search_from_a_failing_rate_goes_down_only_when_asked,
        ),
        (
            "a straddle repeated",
            a_trial_whose_interval_straddles_the_objective_is_run_again_a_bounded_number_of_times,
        ),
    ];
    for (name, search) in searches {
        let started = std::time::Instant::now();
        search();
        eprintln!("capacity: {name}: {:.1} s", started.elapsed().as_secs_f64());
    }
}

/// `capacity` of `backend` with `args` (`tag`: the test's own scratch directory); its
/// output and the JSON it wrote.
fn capacity(
    backend: &Backend,
    tag: &str,
    args: &[&str],
) -> (std::process::Output, serde_json::Value) {
    let dir = scratch(&format!("capacity-{tag}"));
    let json = dir.join("capacity.json");
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

/// The capacity `capacity --json` found (its outcome: `capacity R req/s: …`).
fn found(out: &std::process::Output, doc: &serde_json::Value) -> f64 {
    let said = doc["outcome"].as_str().unwrap_or("");
    said.strip_prefix("capacity ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}\n{}", text(out)))
}

/// A server that answers one request at a time, each taking 0.5 ms: it serves 2,000 a
/// second and queues the rest, so above 2,000 every answer waits longer than the last.
/// The search brackets that to 2% and reports a capacity within 5% of it; every trial is
/// in the JSON with its figures and their intervals.
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
    let found = found(&out, &doc);
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
/// 200,000 to 400,000 requests a second on one thread): the search stops saying the
/// generator was the limit, with its lag or CPU, and reports no capacity. The objective
/// is one the server meets whenever the generator keeps up (with `p99 < 1ms`, a quiet
/// moment let the generator keep up at 200,000 and the server's own p99 failed the
/// first trial: a search stopped for the server, not the generator).
fn a_server_faster_than_the_generator_is_reported_as_generator_limited() {
    let backend = Backend::start(&["--listen", "127.0.0.1:0", "--name", "fast"]);
    let (out, doc) = capacity(
        &backend,
        "fast",
        &[
            "--slo", "p99 < 1s", "--from", "200000", "--up-to", "400000", "--trial", "2s",
            "--warmup", "0s", "-c", "20",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = doc["outcome"].as_str().unwrap();
    let at: f64 = said
        .strip_prefix("limited by the generator at ")
        .and_then(|rest| rest.split(" req/s").next())
        .and_then(|rate| rate.parse().ok())
        .unwrap_or_else(|| panic!("{said}\n{}", text(&out)));
    assert!((200000.0..=400000.0).contains(&at), "{said}");
    assert!(!text(&out).contains("capacity 2"), "{}", text(&out));
    // Before searching, the generator alone fell behind within the range too, and said
    // where and why (at 200,000 req/s or, on a quiet moment of the machine, at 400,000:
    // how fast the machine is is not what this asserts).
    let ceiling = &doc["generator_ceiling"];
    let behind = ceiling["behind_at_per_s"].as_f64().unwrap_or_default();
    assert!([200000.0, 400000.0].contains(&behind), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("fell behind at {behind} req/s (scheduler lag p99")),
        "{}",
        text(&out)
    );
}

/// The server of known capacity searched from a rate it cannot hold: without
/// `--down-from` the search stops there and says how to go on; with it the rate is
/// halved until one passes, then bisected, and the capacity found is the server's.
fn a_search_from_a_failing_rate_goes_down_only_when_asked() {
    let backend = Backend::start(&[
        "--listen",
        "127.0.0.1:0",
        "--name",
        "known-down",
        "--serve-at-most",
        "2000",
    ]);
    let args = [
        "--slo",
        "p99 < 50ms",
        "--from",
        "8000",
        "--up-to",
        "8000",
        "--precision",
        "20%",
        "--trial",
        "2s",
        "--warmup",
        "500ms",
    ];
    let (out, doc) = capacity(&backend, "from-fails", &args);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        doc["outcome"]
            .as_str()
            .unwrap()
            .ends_with("start lower, or search down from it with down_from"),
        "{}",
        text(&out)
    );
    assert_eq!(doc["trials"].as_array().unwrap().len(), 1);
    let (out, doc) = capacity(
        &backend,
        "down-from",
        &[&args[..], &["--down-from"]].concat(),
    );
    assert!(out.status.success(), "{}", text(&out));
    let trials = doc["trials"].as_array().unwrap();
    let rates: Vec<f64> = trials
        .iter()
        .map(|t| t["rate_per_s"].as_f64().unwrap())
        .collect();
    assert_eq!(rates[..2], [8000.0, 4000.0], "{}", text(&out));
    assert_eq!(trials[1]["why"], "halving down");
    let found = found(&out, &doc);
    // Within the search's 20% below the server's 2,000.
    assert!(
        (1600.0..=2100.0).contains(&found),
        "{found}: {}",
        text(&out)
    );
}

/// A server whose p99 sits at the objective whatever the rate (it answers after a
/// lognormal time whose p99 is 20 ms, many requests at once; about 0.7% of answers take
/// 22 ms or more, against the 1% `p99 < 22ms` allows, so that the first trial does not
/// fail outright and end the search; at 10 ms and 11 ms, this VM's 1.2 ms of timer
/// jitter at 200 req/s was a tenth of the p99 and the search stopped on the generator): its trials' intervals take in the objective, so a
/// trial that straddles it is run again at the same rate, judged with the windows of the
/// straddles it repeats, at most `--repeats` times in a row, and then counts as a
/// failure; the result says how many trials were spent and why.
fn a_trial_whose_interval_straddles_the_objective_is_run_again_a_bounded_number_of_times() {
    let backend = Backend::start(&[
        "--listen",
        "127.0.0.1:0",
        "--name",
        "at-the-objective",
        "--latency",
        "lognormal:4ms,p99=20ms",
    ]);
    let (out, doc) = capacity(
        &backend,
        "straddle",
        &[
            "--slo",
            "p99 < 22ms",
            "--from",
            "200",
            "--up-to",
            "3200",
            "--precision",
            "5%",
            "--trial",
            "2s",
            "--warmup",
            "0s",
            "--repeats",
            "2",
            "-c",
            "50",
        ],
    );
    let trials = doc["trials"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", text(&out)));
    let said = |t: &serde_json::Value| t["verdict"].as_str().unwrap().to_owned();
    let straddles = trials
        .iter()
        .filter(|t| said(t).starts_with("straddles p99 < 22ms"))
        .count();
    assert!(straddles >= 1, "{}", text(&out));
    let mut in_a_row = 0;
    for (i, t) in trials.iter().enumerate() {
        let verdict = said(t);
        // A streak is one rate's: a trial at a new rate that straddles starts its own.
        in_a_row = match (
            verdict.starts_with("straddles"),
            t["why"] == "repeat of a straddle",
        ) {
            (false, _) => 0,
            (true, true) => in_a_row + 1,
            (true, false) => 1,
        };
        assert!(in_a_row <= 3, "at most two repeats: {}", text(&out));
        let next = trials.get(i + 1);
        if verdict.ends_with(": run again") {
            // The next trial is that repeat, at the same rate.
            let next = next.unwrap_or_else(|| panic!("{}", text(&out)));
            assert_eq!(next["why"], "repeat of a straddle", "{}", text(&out));
            assert_eq!(next["rate_per_s"], t["rate_per_s"], "{}", text(&out));
            assert_eq!(next["pooled_trials"], in_a_row, "{}", text(&out));
        } else {
            if verdict.starts_with("straddles") {
                assert!(
                    verdict.ends_with("3 times in a row: counted as a failure"),
                    "{verdict}"
                );
                assert_eq!(in_a_row, 3, "{}", text(&out));
            }
            if let Some(next) = next {
                assert_ne!(next["why"], "repeat of a straddle", "{}", text(&out));
            }
        }
    }
    let repeats = trials
        .iter()
        .filter(|t| t["why"] == "repeat of a straddle")
        .count();
    assert!(repeats >= 1, "{}", text(&out));
    let spent = doc["spent"].as_str().unwrap();
    assert!(
        spent.starts_with(&format!("{} trial", trials.len())),
        "{spent}"
    );
    assert!(spent.contains("repeat"), "{spent}");
    assert!(text(&out).contains(spent), "{}", text(&out));
}
