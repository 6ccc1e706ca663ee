//! `ingressbench cluster local up | kubeconfig | down` through the binary: the control
//! plane runs in the background after `up` returns, a second `up` is refused, and `down`
//! leaves no process and no file.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_ingressbench");

fn local(verb: &str, dir: &std::path::Path) -> Output {
    Command::new(BIN)
        .args(["cluster", "local", verb, "--dir"])
        .arg(dir)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Processes whose command line mentions `needle`.
fn processes_with(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

#[test]
fn a_local_cluster_comes_up_in_the_background_and_goes_down_without_a_trace() {
    let dir = std::env::temp_dir().join(format!("ib-cluster-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let up = local("up", &dir);
    assert!(up.status.success(), "{}", text(&up));
    let config = dir.join("cluster/kubeconfig");
    assert!(
        text(&up).contains(&format!("export KUBECONFIG={}", config.display())),
        "{}",
        text(&up)
    );
    let path = local("kubeconfig", &dir);
    assert_eq!(
        String::from_utf8_lossy(&path.stdout).trim(),
        config.display().to_string()
    );
    // Its processes run from the cluster's directory (etcd's data dir, the certificates).
    let running = processes_with(&dir.display().to_string());
    assert!(
        running.len() >= 5,
        "serve, etcd and the three kube binaries: {running:?}"
    );
    let again = local("up", &dir);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    assert!(text(&again).contains("already up"), "{}", text(&again));
    let down = local("down", &dir);
    assert!(down.status.success(), "{}", text(&down));
    let left = processes_with(&dir.display().to_string());
    assert!(left.is_empty(), "left running: {left:?}");
    assert!(!dir.exists());
    let none = local("down", &dir);
    assert_eq!(none.status.code(), Some(2), "{}", text(&none));
    assert!(
        text(&none).contains("no local cluster is up"),
        "{}",
        text(&none)
    );
}
