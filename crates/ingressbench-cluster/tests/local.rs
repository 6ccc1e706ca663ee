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
