//! The local control plane is a real one: the API server answers with its version, the
//! controller manager turns a Deployment into pods, the scheduler tries to place them, and
//! nothing is left once the cluster is dropped.

use std::time::{Duration, Instant};

use ingressbench_cluster::local::{LocalCluster, LocalOptions, KUBE_VERSION};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::Api;

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
    })
}

#[test]
fn a_local_control_plane_schedules_a_deployment_and_leaves_nothing() {
    let dir = std::env::temp_dir().join(format!("ib-cluster-test-{}", std::process::id()));
    // No node: the scheduler has nowhere to put pods (the node agent and the controllers
    // are tested through the binary, whose image the agent runs).
    let options = LocalOptions {
        nodes: 0,
        traefik: None,
        contour: None,
        haproxy_ingress: None,
        ..LocalOptions::discover(dir.clone())
    };
    let cluster = LocalCluster::up(&options).unwrap();
    let pids: Vec<(String, u32)> = cluster
        .processes()
        .into_iter()
        .map(|(n, p)| (n.to_owned(), p))
        .collect();
    assert_eq!(pids.len(), 4, "{pids:?}");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let version = ingressbench_cluster::api::version(cluster.kubeconfig(), None)
            .await
            .unwrap();
        assert_eq!(version, format!("v{KUBE_VERSION}"));
        let client = ingressbench_cluster::api::client(cluster.kubeconfig(), None)
            .await
            .unwrap();
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
        let deployment: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "echo" },
            "spec": {
                "replicas": 2,
                "selector": { "matchLabels": { "app": "echo" } },
                "template": {
                    "metadata": { "labels": { "app": "echo" } },
                    "spec": { "containers": [{ "name": "echo", "image": "ingressbench" }] }
                }
            }
        }))
        .unwrap();
        deployments
            .create(&PostParams::default(), &deployment)
            .await
            .unwrap();
        // The controllers make two pods; with no node, the scheduler says it cannot place
        // them.
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let list = pods
                .list(&ListParams::default().labels("app=echo"))
                .await
                .unwrap();
            let unschedulable = list
                .items
                .iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| {
                            c.iter().any(|c| {
                                c.type_ == "PodScheduled"
                                    && c.status == "False"
                                    && c.reason.as_deref() == Some("Unschedulable")
                            })
                        })
                })
                .count();
            if list.items.len() == 2 && unschedulable == 2 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "after 60 s: {} pods, {unschedulable} marked unschedulable",
                list.items.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    drop(cluster);
    for (name, pid) in &pids {
        assert!(!alive(*pid), "{name} ({pid}) is still running");
    }
    assert!(!dir.exists(), "{} is still there", dir.display());
}

/// The uid a process runs as (`/proc/PID/status`).
fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The processes whose command line holds `word`.
fn processes_with(word: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(word))
        })
        .collect()
}

#[test]
fn without_an_image_a_pod_that_must_not_run_as_root_runs_the_binary_as_the_images_user() {
    use ingressbench_cluster::agent::{Runs, IMAGE, IMAGE_USER, RAN};
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("ib-cluster-no-image-{}", std::process::id()));
    // The binary where the image's user cannot reach it, as a build under root's home is.
    let closed = std::env::temp_dir().join(format!("ib-closed-{}", std::process::id()));
    std::fs::create_dir_all(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let binary = closed.join("sleep");
    std::fs::copy("/usr/bin/sleep", &binary).unwrap();
    let options = LocalOptions {
        nodes: 1,
        traefik: None,
        contour: None,
        haproxy_ingress: None,
        gateway_crds: None,
        // Envoy Gateway serves the Gateway API, which this cluster goes without.
        envoy_gateway: None,
        image: None,
        images: [(
            IMAGE.to_owned(),
            Runs::Binary {
                binary: binary.clone(),
                user: Some(IMAGE_USER),
            },
        )]
        .into(),
        ..LocalOptions::discover(dir.clone())
    };
    let cluster = LocalCluster::up(&options).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = ingressbench_cluster::api::client(cluster.kubeconfig(), None)
            .await
            .unwrap();
        let pods: Api<Pod> = Api::namespaced(client, "default");
        // What the run's backend pods ask: not root, no user named.
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "not-root" },
            "spec": {
                "securityContext": { "runAsNonRoot": true },
                "containers": [{ "name": "c", "image": "registry.example/ingressbench:0.1.0", "args": ["4242.5"] }]
            }
        }))
        .unwrap();
        // Refused until the controller manager has made the namespace's service account.
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(e) = pods.create(&PostParams::default(), &pod).await {
            assert!(Instant::now() < deadline, "{e}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        loop {
            let p = pods.get("not-root").await.unwrap();
            let status = p.status.unwrap_or_default();
            // Still being made is no failure: the projected service-account volume waits for
            // the namespace's kube-root-ca.crt, which the controller manager publishes a moment
            // after the service account (CI saw it missing at the first try). A refusal to run
            // as root would wait with another reason.
            let waiting = (status.container_statuses.iter().flatten())
                .find_map(|c| c.state.as_ref()?.waiting.clone())
                .filter(|w| w.reason.as_deref() != Some("ContainerCreating"));
            assert!(waiting.is_none(), "{waiting:?}");
            if status.phase.as_deref() == Some("Running") {
                break;
            }
            assert!(Instant::now() < deadline, "not running after 60 s: {status:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let running = processes_with("4242.5");
    assert_eq!(running.len(), 1, "{running:?}");
    assert_eq!(uid_of(running[0]), Some(IMAGE_USER.0));
    let ran = std::fs::read_to_string(dir.join("pods").join(RAN)).unwrap();
    let record: serde_json::Value = serde_json::from_str(ran.lines().next().unwrap()).unwrap();
    assert_eq!(record["ran"], "binary", "{record}");
    assert_eq!(record["user"], "65532:65532", "{record}");
    drop(cluster);
    assert!(processes_with("4242.5").is_empty());
    assert!(!dir.exists(), "{} is still there", dir.display());
    std::fs::remove_dir_all(&closed).unwrap();
}
