//! The tool used as a hostile or careless user would: results directories that already
//! hold a run, names that would leave `results/`, two writers at once. Each test goes
//! through the binary, where the user would meet the problem.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ingressbench");

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ib-hostile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A scenario of one upstream target (the test's own server) at 50 req/s for `duration`.
fn scenario(dir: &Path, name: &str, duration: &str) -> PathBuf {
    let addr = common::server();
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
    let dir = scratch("exists");
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
    // --force replaces it: a new run, its own cells only.
    std::fs::create_dir_all(out.join("cells").join("999-stale")).unwrap();
    let forced = run(&file, &["--out", out.to_str().unwrap(), "--force"], &dir);
    assert!(forced.status.success(), "{}", text(&forced));
    assert_ne!(std::fs::read(out.join("run.json")).unwrap(), before);
    assert!(!out.join("cells").join("999-stale").exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_scenario_name_cannot_leave_the_results_directory() {
    let dir = scratch("name");
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
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_second_writer_is_refused_while_the_first_runs_and_the_first_completes() {
    let dir = scratch("lock");
    let file = scenario(&dir, "lock", "3s");
    let out = dir.join("out");
    let first = Command::new(BIN)
        .arg("run")
        .arg(&file)
        .args(["--out", out.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the first holds the lock.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(out.join(".lock")).is_ok_and(|l| l.starts_with("process ")) {
        assert!(
            Instant::now() < deadline,
            "the first run never took the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Neither a second run, nor --force, nor --resume may write it meanwhile.
    for extra in [vec!["--force"], vec![]] {
        let mut args = vec!["--out", out.to_str().unwrap()];
        args.extend(extra);
        let second = run(&file, &args, &dir);
        assert_eq!(second.status.code(), Some(2), "{}", text(&second));
        assert!(
            text(&second).contains(&format!("is being written by process {}", first.id())),
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
    let _ = std::fs::remove_dir_all(dir);
}
