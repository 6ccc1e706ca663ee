//! Cluster mode on a local cluster, through the binary and the cluster crate: the control
//! plane runs in the background after `up` returns, a second `up` is refused, the node
//! agent runs pods, a run's namespace is made and cleaned up, scenarios run in it, and
//! `down` leaves no process, namespace or file.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::{cells_of, text, BIN};

fn local(verb: &str, dir: &Path) -> Output {
    Command::new(BIN)
        .args(["cluster", "local", verb, "--dir"])
        .arg(dir)
        // `up` adds its context to the user's kubeconfig: the test's own, not root's.
        .env("KUBECONFIG", users_kubeconfig(dir))
        .output()
        .unwrap()
}

/// The kubeconfig that stands for the user's in a test of the cluster in `dir`.
fn users_kubeconfig(dir: &Path) -> std::path::PathBuf {
    dir.with_extension("kubeconfig")
}

/// A port that is taken is refused before anything starts, naming the process that holds
/// it; nothing is left behind.
#[test]
fn cluster_local_up_refuses_a_taken_port_and_names_who_holds_it() {
    let dir = std::env::temp_dir().join(format!("ib-cluster-taken-{}", std::process::id()));
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let up = Command::new(BIN)
        .args(["cluster", "local", "up", "--https-port"])
        .arg(port.to_string())
        .arg("--dir")
        .arg(&dir)
        .env("KUBECONFIG", users_kubeconfig(&dir))
        .output()
        .unwrap();
    assert_eq!(up.status.code(), Some(2), "{}", tail(&up));
    let said = text(&up);
    assert!(
        said.contains(&format!(
            "port {port} on 127.0.0.1 (--https-port) is taken by process {}",
            std::process::id()
        )),
        "{said}"
    );
    assert!(!dir.exists() && !users_kubeconfig(&dir).exists());
}

/// On a machine where the cache lacks the control plane, the first `up` builds it with
/// the project's script, saying what and how long it takes; here with a `go` that fails,
/// so that the test takes a second: the failure names the script and nothing is left.
#[test]
fn cluster_local_up_builds_what_the_cache_lacks_and_says_so() {
    let scratch = crate::common::scratch("cluster-build");
    let path = crate::common::fake_go(&scratch, "echo 'go: no network here' >&2\nexit 1");
    let dir = scratch.join("cluster");
    let up = Command::new(BIN)
        .args(["cluster", "local", "up", "--dir"])
        .arg(&dir)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env("INGRESSBENCH_CACHE", scratch.join("empty-cache"))
        .env("PATH", path)
        .env("KUBECONFIG", scratch.join("kubeconfig"))
        .output()
        .unwrap();
    let said = text(&up);
    assert!(!up.status.success(), "{said}");
    assert!(
        said.contains("building the control plane (Kubernetes v1.33.13")
            && said.contains("6 to 11 minutes"),
        "{said}"
    );
    assert!(said.contains("scripts/kube-binaries.sh"), "{said}");
    assert!(said.contains("failed"), "{said}");
    assert!(
        !dir.exists() && !scratch.join("kubeconfig").exists(),
        "{said}"
    );
}

/// Runs `down` when dropped, so that a failing test leaves no cluster behind.
struct Down(std::path::PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        if std::thread::panicking() {
            control_plane_at_failure(&self.0);
        }
        if self.0.exists() {
            let _ = local("down", &self.0);
        }
        // The user's kubeconfig the test made beside it.
        let _ = std::fs::remove_file(users_kubeconfig(&self.0));
    }
}

/// When a part fails, what the control plane was doing: whether etcd and the API server
/// still run, and the end of their logs (the cluster's directory goes with `down`).
fn control_plane_at_failure(dir: &Path) {
    if let Ok(why) = std::fs::read_to_string(dir.join("stopped")) {
        eprintln!("the local cluster had stopped: {why}");
    }
    let serving = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
    for line in serving.lines().filter(|l| l.starts_with("error: ")) {
        eprintln!("serve.log: {line}");
    }
    for line in controllers_started_again(dir) {
        eprintln!("serve.log: {line}");
    }
    let cluster = dir.join("cluster");
    for name in ["etcd", "kube-apiserver"] {
        let running = processes_with(&cluster.display().to_string())
            .into_iter()
            .any(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                    c.split(|b| *b == 0)
                        .next()
                        .is_some_and(|p| p.ends_with(name.as_bytes()))
                })
            });
        let log = std::fs::read_to_string(cluster.join(format!("{name}.log"))).unwrap_or_default();
        let end: Vec<&str> = log.lines().rev().take(25).collect();
        // Where a graceful stop began (the API server's on SIGTERM or SIGINT).
        let stopping: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("graceful-termination") || l.contains("received signal"))
            .take(5)
            .collect();
        eprintln!(
            "{name}: {}; its stop began: {stopping:?}; the end of its log:\n{}",
            if running { "running" } else { "NOT running" },
            end.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

/// What the serving process's log says of the controllers that exited and were started
/// again, and of the node agent's API calls that failed and were made again.
fn controllers_started_again(dir: &Path) -> Vec<String> {
    let serving = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
    serving
        .lines()
        .filter(|l| l.contains(" exited (") || l.starts_with("node agent: "))
        .map(str::to_owned)
        .collect()
}

/// A directory removed when dropped, however the test ends.
struct RemovedAtEnd(std::path::PathBuf);

impl Drop for RemovedAtEnd {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Traefik's plain HTTP address (`127.0.0.1:PORT`), from the cluster file `up` wrote.
fn traefik_http(dir: &Path) -> String {
    let file = std::fs::read_to_string(dir.join("cluster.yaml")).unwrap();
    file.split("http://")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap()
        .to_owned()
}

/// The cluster file `up` wrote, with a class no controller serves; its path.
fn unserved_class(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("no-class.yaml");
    let file = std::fs::read_to_string(dir.join("cluster.yaml")).unwrap();
    std::fs::write(
        &path,
        file.replace("ingress_class: traefik", "ingress_class: nginx"),
    )
    .unwrap();
    path
}

/// The admin kubeconfig with a token the cluster does not know: its path and its text.
fn unknown_token(dir: &Path) -> (std::path::PathBuf, serde_json::Value) {
    let config = std::fs::read_to_string(dir.join("cluster/kubeconfig")).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&config).unwrap();
    doc["users"][0]["user"]["token"] = serde_json::json!("not-a-token");
    let path = dir.join("bad-token.kubeconfig");
    std::fs::write(&path, doc.to_string()).unwrap();
    (path, doc)
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

/// The processes of containers whose command line holds `needle`: not the `enter` each
/// image's container runs under (its parent, outside its PID namespace).
fn container_processes(needle: &str) -> Vec<u32> {
    processes_with(needle)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| !String::from_utf8_lossy(&c).contains("\0local\0enter\0"))
        })
        .collect()
}

/// One part of the cluster test: its name and what it runs against a cluster's directory.
type Part = (&'static str, fn(&Path));

/// A local cluster up from the image built from the binary under test runs the parts below
/// in turn (each alone on it, so that a part that asserts the cluster holds nothing of the
/// tool's sees only its own), and goes down without a trace.
#[test]
fn a_local_cluster_comes_up_runs_scenarios_and_goes_down_without_a_trace() {
    let parts: &[Part] = &[
        (
            "envoy gateway",
            crate::kubelet::envoy_gateway_runs_from_its_chart_with_the_data_plane_it_creates,
        ),
        (
            "the node agent runs pods",
            the_node_agent_runs_pods_as_local_processes_with_addresses_probes_and_deletion,
        ),
        (
            "a pod's volumes",
            crate::kubelet::a_pods_volumes_are_made_as_the_kubelet_makes_them,
        ),
        (
            "services and DNS",
            crate::kubelet::pods_reach_services_by_name_and_the_api_through_its_service,
        ),
        (
            "a run namespace",
            a_run_namespace_is_made_changed_through_the_api_and_removed_and_cleanup_takes_only_the_tools,
        ),
        (
            "three times per event",
            a_scenario_runs_in_the_cluster_with_three_times_per_event_and_leaves_nothing,
        ),
        (
            "the pod proxy",
            a_controller_in_pods_is_read_through_the_api_servers_pod_proxy,
        ),
        (
            "the shipped scenarios",
            the_shipped_scenarios_run_against_every_controller_of_the_cluster,
        ),
        (
            "the mesh",
            the_mesh_puts_a_sidecar_in_each_pod_that_the_controllers_reach_with_mutual_tls,
        ),
        (
            "gRPC and WebSockets",
            crate::cluster_traffic::grpc_and_websockets_pass_through_every_controller,
        ),
        (
            "gateway-api-bench's probe",
            crate::cluster_traffic::gateway_api_benchs_probe_runs_through_envoy_gateway,
        ),
        (
            "gateway-api-bench's route change",
            crate::cluster_traffic::gateway_api_benchs_route_change_runs_through_envoy_gateway,
        ),
        (
            "each controller's routes",
            each_controller_routes_and_takes_route_changes_the_way_its_api_does,
        ),
        (
            "generated routes",
            generated_routes_are_an_object_each_and_a_refused_one_fails_its_cell,
        ),
        (
            "load from pods",
            load_from_the_clusters_pods_is_placed_merged_and_leaves_nothing,
        ),
        (
            "a capacity search",
            a_capacity_search_runs_from_the_clusters_pods,
        ),
        (
            "restarts",
            a_controller_restarts_by_its_process_or_by_a_rollout_under_load,
        ),
    ];
    // The image a user would push, built from the binary under test.
    let layout = std::env::temp_dir().join(format!("ib-cluster-image-{}", std::process::id()));
    let _image = RemovedAtEnd(layout.clone());
    let image = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/image.sh"
        ))
        .args(["--binary", BIN, "--out"])
        .arg(&layout)
        .output()
        .unwrap();
    assert!(image.status.success(), "{}", tail(&image));
    // One cluster runs them all, in turn. Two side by side (half the parts each, the
    // agents' load balancers in blocks of their own) took this test from 1,011 s to 552 s,
    // but starved the tests beside them in both CI runs that had them: docs/ARCHITECTURE.md,
    // "CI's time". `a_cluster_runs` takes any share of the parts.
    a_cluster_runs("ib-cluster", parts, &layout);
}

/// A local cluster in a directory named from `tag` comes up from the image in `layout`,
/// runs `parts` in turn, and goes down without a trace.
fn a_cluster_runs(tag: &str, parts: &[Part], layout: &Path) {
    let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _down = Down(dir.clone());
    let began = std::time::Instant::now();
    // The ports the local cluster used to take by default: `up` takes free ones.
    let _taken = std::net::TcpListener::bind("127.0.0.1:18080");
    // The user's kubeconfig, with a context of their own.
    let users = users_kubeconfig(&dir);
    std::fs::write(
        &users,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: prod\n  cluster: { server: https://prod.invalid }\nusers:\n- name: me\n  user: { token: x }\ncontexts:\n- name: prod\n  context: { cluster: prod, user: me }\ncurrent-context: prod\n",
    )
    .unwrap();
    // Envoy Gateway's older release, which the part `envoy gateway` upgrades.
    let up = Command::new(BIN)
        .args([
            "cluster",
            "local",
            "up",
            "--envoy-gateway",
            "1.9.0",
            "--dir",
        ])
        .arg(&dir)
        .arg("--image")
        .arg(layout)
        .env("KUBECONFIG", &users)
        .output()
        .unwrap();
    assert!(up.status.success(), "{}", tail(&up));
    assert!(
        !text(&up).contains("building "),
        "all of it was in the cache: {}",
        text(&up)
    );
    assert!(
        text(&up).contains(&format!("pods run the image {}:latest", layout.display())),
        "{}",
        tail(&up)
    );
    assert!(
        text(&up).contains("added context ingressbench-local") && text(&up).contains("was prod"),
        "{}",
        tail(&up)
    );
    // Envoy Gateway, installed by its chart, serving its Gateway.
    assert!(
        text(&up).contains(
            "Envoy Gateway v1.9.0: helm install of its chart, its Gateway answering at 127.1."
        ),
        "{}",
        tail(&up)
    );
    // The cluster is reached with no flag: `cluster check` on its file, through the
    // user's kubeconfig.
    let check = Command::new(BIN)
        .args(["cluster", "check"])
        .arg(dir.join("cluster.yaml"))
        .env("KUBECONFIG", &users)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", tail(&check));
    let config = dir.join("cluster/kubeconfig");
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
    eprintln!("{tag}: up: {:.1} s", began.elapsed().as_secs_f64());
    cluster_check_says_what_is_missing(&dir);
    let again = local("up", &dir);
    assert_eq!(again.status.code(), Some(2), "{}", tail(&again));
    assert!(text(&again).contains("already up"), "{}", tail(&again));
    for (name, part) in parts {
        let started = std::time::Instant::now();
        part(&dir);
        eprintln!("{tag}: {name}: {:.1} s", started.elapsed().as_secs_f64());
    }
    every_pod_ran_from_the_image(&dir, layout);
    let kubeconfig = dir.join("cluster/kubeconfig");
    wait_until("no namespace of the tool left", || {
        namespaces_of_the_tool(&kubeconfig).is_empty().then_some(())
    });
    // The restart part's crash, and any other a controller had under the load.
    for line in controllers_started_again(&dir) {
        eprintln!("{tag}: serve.log: {line}");
    }
    let serve = std::fs::read_to_string(dir.join("serve.pid")).unwrap();
    let down = local("down", &dir);
    assert!(down.status.success(), "{}", tail(&down));
    // No process, no namespace of the agent's, no file.
    let left = processes_with(&dir.display().to_string());
    assert!(left.is_empty(), "left running: {left:?}");
    let namespaces = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let owned = format!("ingressbench-{}x", serve.trim());
    assert!(
        !String::from_utf8_lossy(&namespaces.stdout).contains(&owned),
        "{}",
        String::from_utf8_lossy(&namespaces.stdout)
    );
    assert!(!dir.exists());
    // The user's kubeconfig is as it was: their context current, ours gone.
    let users = std::fs::read_to_string(users_kubeconfig(&dir)).unwrap();
    assert!(
        users.contains("current-context: prod") && !users.contains("ingressbench-local"),
        "{users}"
    );
    let none = local("down", &dir);
    assert_eq!(none.status.code(), Some(2), "{}", tail(&none));
    assert!(
        text(&none).contains("no local cluster is up"),
        "{}",
        tail(&none)
    );
}

/// What the node agent recorded of every container it started: each ran from the image's
/// unpacked root filesystem (the digest of the layout's manifest), as the image's user,
/// backends and load workers alike; and the tool in that root filesystem is this one.
fn every_pod_ran_from_the_image(dir: &Path, layout: &Path) {
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(layout.join("index.json")).unwrap()).unwrap();
    let digest = index["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let ran = std::fs::read_to_string(dir.join("cluster/pods/ran.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = ran
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The mesh's sidecars, the counters' stand-in and Envoy Gateway's data plane run
    // Envoy, and Envoy Gateway's pods its binary, which the image does not hold: from
    // images staged at `up` from those binaries.
    let (staged, records): (Vec<&serde_json::Value>, Vec<&serde_json::Value>) = records
        .iter()
        .partition(|r| r["image"].as_str().unwrap().contains(" (staged from /"));
    assert!(
        staged
            .iter()
            .any(|r| r["image"].as_str().unwrap().starts_with("envoy ")),
        "{ran}"
    );
    for r in &staged {
        assert_eq!(r["ran"], "image", "{r}");
        let program = match r["image"].as_str().unwrap().split([' ', ':']).next() {
            Some("gateway") => "envoy-gateway",
            other => other.unwrap(),
        };
        assert!(r["argv"][0].as_str().unwrap().ends_with(program), "{r}");
    }
    for r in &records {
        assert_eq!(r["ran"], "image", "{r}");
        assert_eq!(r["digest"], digest.as_str(), "{r}");
        assert_eq!(r["user"], "65532:65532", "{r}");
        assert_eq!(r["argv"][0], "/usr/local/bin/ingressbench", "{r}");
    }
    let ran_as = |what: &str| records.iter().filter(|r| r["argv"][1] == what).count();
    assert!(ran_as("backend") >= 4, "{ran}");
    assert!(ran_as("worker") >= 3, "{ran}");
    let rootfs = dir.join("cluster/image/rootfs");
    let version = Command::new(BIN)
        .args(["cluster", "local", "enter", "--root"])
        .arg(&rootfs)
        .args([
            "--user",
            "65532:65532",
            "--",
            "/usr/local/bin/ingressbench",
            "--version",
        ])
        .output()
        .unwrap();
    let ours = Command::new(BIN).arg("--version").output().unwrap();
    assert!(version.status.success(), "{}", tail(&version));
    assert_eq!(version.stdout, ours.stdout);
}

/// The message of the first pod whose container waits for `reason`.
pub(crate) fn waiting_because(
    pods: &[k8s_openapi::api::core::v1::Pod],
    reason: &str,
) -> Option<String> {
    pods.iter().find_map(|p| {
        let status = p.status.as_ref()?.container_statuses.as_ref()?.first()?;
        let waiting = status.state.as_ref()?.waiting.clone()?;
        (waiting.reason.as_deref() == Some(reason)).then(|| waiting.message.unwrap_or_default())
    })
}

/// Pods of `app=echo` in `default`: (name, ip, ready).
async fn echo_pods(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
) -> Vec<(String, String, bool)> {
    let list = pods
        .list(&kube::api::ListParams::default().labels("app=echo"))
        .await
        .unwrap();
    list.items
        .iter()
        .map(|p| {
            let status = p.status.clone().unwrap_or_default();
            let ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (
                p.metadata.name.clone().unwrap_or_default(),
                status.pod_ip.unwrap_or_default(),
                ready,
            )
        })
        .collect()
}

/// `GET /` on `ip:8080`; the `x-backend` header of the answer.
fn backend_at(ip: &str) -> Option<String> {
    backend_via(&format!("{ip}:8080"), "echo")
}

/// `GET /` with `Host: host` through `entry` (host:port); the `x-backend` of the answer.
pub(crate) fn backend_via(entry: &str, host: &str) -> Option<String> {
    use std::io::{Read, Write};
    // A gone pod's address answers nothing, not even a reset: without a bound, the
    // kernel's SYN retries would take two minutes to say so.
    let address: std::net::SocketAddr = entry.parse().ok()?;
    let mut s =
        std::net::TcpStream::connect_timeout(&address, std::time::Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .ok()?;
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("x-backend: ")
            .map(|v| v.trim().to_owned())
    })
}

pub(crate) async fn wait_for<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "after 60 s: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The node agent runs a Deployment's pods as local processes, each on its own address,
/// ready once its probe passes, reached through Traefik, stopped when deleted; an image it
/// does not know is said in the pod's status.
fn the_node_agent_runs_pods_as_local_processes_with_addresses_probes_and_deletion(dir: &Path) {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{DeleteParams, PostParams};
    let config = dir.join("cluster/kubeconfig");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = ingressbench_cluster::api::client(&config, None).await.unwrap();
        let deployments: kube::Api<Deployment> = kube::Api::namespaced(client.clone(), "default");
        let deployment = |name: &str, image: &str| -> Deployment {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": name },
                "spec": {
                    "replicas": 2,
                    "selector": { "matchLabels": { "app": name } },
                    "template": {
                        "metadata": { "labels": { "app": name } },
                        "spec": {
                            "terminationGracePeriodSeconds": 5,
                            "containers": [{
                                "name": "echo", "image": image,
                                "args": ["backend", "--listen", "0.0.0.0:8080", "--name", "$(POD_NAME)"],
                                "env": [{ "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }],
                                "readinessProbe": { "httpGet": { "path": "/healthz", "port": 8080 } }
                            }]
                        }
                    }
                }
            }))
            .unwrap()
        };
        deployments
            .create(&PostParams::default(), &deployment("echo", "example.test/ingressbench:dev"))
            .await
            .unwrap();
        let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), "default");
        let ready = wait_for("two ready echo pods", async || {
            let p = echo_pods(&pods).await;
            (p.len() == 2 && p.iter().all(|(_, ip, r)| *r && !ip.is_empty())).then_some(p)
        })
        .await;
        // Each pod answers on its own address, as itself ($(POD_NAME) expanded).
        for (name, ip, _) in &ready {
            assert!(ip.starts_with("198.1"), "{ip}");
            assert_eq!(backend_at(ip).as_deref(), Some(name.as_str()), "{ip}");
        }
        // Through Traefik, the cluster's ingress controller: an Ingress for app.test to a
        // Service over the pods.
        let objects: Vec<serde_json::Value> = vec![
            serde_json::json!({ "apiVersion": "v1", "kind": "Service",
                "metadata": { "name": "echo" },
                "spec": { "selector": { "app": "echo" }, "ports": [{ "port": 80, "targetPort": 8080 }] } }),
            serde_json::json!({ "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                "metadata": { "name": "echo" },
                "spec": { "ingressClassName": "traefik", "rules": [{ "host": "app.test", "http": { "paths": [
                    { "path": "/", "pathType": "Prefix",
                      "backend": { "service": { "name": "echo", "port": { "number": 80 } } } }] } }] } }),
        ];
        let services: kube::Api<k8s_openapi::api::core::v1::Service> =
            kube::Api::namespaced(client.clone(), "default");
        services
            .create(&PostParams::default(), &serde_json::from_value(objects[0].clone()).unwrap())
            .await
            .unwrap();
        let ingresses: kube::Api<k8s_openapi::api::networking::v1::Ingress> =
            kube::Api::namespaced(client.clone(), "default");
        ingresses
            .create(&PostParams::default(), &serde_json::from_value(objects[1].clone()).unwrap())
            .await
            .unwrap();
        let entry = traefik_http(dir);
        let names: Vec<String> = ready.iter().map(|(n, _, _)| n.clone()).collect();
        let via_traefik = wait_for("an answer through Traefik", async || {
            let answer = backend_via(&entry, "app.test")?;
            names.contains(&answer).then_some(answer)
        })
        .await;
        assert!(names.contains(&via_traefik));
        // A deleted pod is stopped and removed; the Deployment replaces it.
        let (victim, victim_ip, _) = ready[0].clone();
        pods.delete(&victim, &DeleteParams::default()).await.unwrap();
        wait_for("the deleted pod gone and a new one ready", async || {
            let p = echo_pods(&pods).await;
            (p.len() == 2 && p.iter().all(|(n, _, r)| *r && *n != victim)).then_some(())
        })
        .await;
        assert_eq!(backend_at(&victim_ip), None, "{victim} still answers");
        // An image the agent cannot run says so in the pod's status.
        deployments
            .create(&PostParams::default(), &deployment("nginx", "nginx:1.27"))
            .await
            .unwrap();
        let unknown: kube::Api<Pod> = kube::Api::namespaced(client.clone(), "default");
        let message = wait_for("the unknown image reported", async || {
            let list = unknown
                .list(&kube::api::ListParams::default().labels("app=nginx"))
                .await
                .ok()?;
            waiting_because(&list.items, "ErrImageNotKnown")
        })
        .await;
        assert!(message.contains("nginx:1.27") && message.contains("ingressbench"), "{message}");
        // A container that must not run as root and would (runAsUser 0) is not started,
        // as the kubelet refuses it.
        let mut as_root = deployment("as-root", "ingressbench");
        let template = as_root.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
        template.security_context = Some(k8s_openapi::api::core::v1::PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(0),
            ..Default::default()
        });
        deployments.create(&PostParams::default(), &as_root).await.unwrap();
        let refused = wait_for("the root container refused", async || {
            let list = unknown
                .list(&kube::api::ListParams::default().labels("app=as-root"))
                .await
                .ok()?;
            waiting_because(&list.items, "CreateContainerConfigError")
        })
        .await;
        assert!(refused.contains("runAsNonRoot"), "{refused}");
        deployments.delete("as-root", &DeleteParams::default()).await.unwrap();
        // A container of a Deployment's pod that exits is reported as the kubelet does
        // (the agent restarts nothing), with its exit code and its log's last line.
        let mut crashes = deployment("crashes", "ingressbench");
        let template = crashes.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
        template.containers[0].args =
            Some(["scenario", "check", "/nonexistent/crash.yaml"].map(String::from).to_vec());
        deployments.create(&PostParams::default(), &crashes).await.unwrap();
        let crashed = wait_for("the exited container reported", async || {
            let list = unknown
                .list(&kube::api::ListParams::default().labels("app=crashes"))
                .await
                .ok()?;
            waiting_because(&list.items, "CrashLoopBackOff")
        })
        .await;
        assert!(
            crashed.contains("container echo exited with code 2") && crashed.contains("crash.yaml"),
            "{crashed}"
        );
        deployments.delete("crashes", &DeleteParams::default()).await.unwrap();
        // A Job's pods run to completion: exit 0 is Succeeded, anything else Failed, and
        // the Job controller sees it; an Indexed Job's pods get their completion index.
        use k8s_openapi::api::batch::v1::Job;
        let jobs: kube::Api<Job> = kube::Api::namespaced(client.clone(), "default");
        let job = |name: &str, args: serde_json::Value| -> Job {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": name },
                "spec": {
                    "completionMode": "Indexed", "completions": 2, "parallelism": 2,
                    // Each index fails on its own (a Job-wide limit of 0 would delete
                    // the other index's pod at the first failure, racing its log).
                    "backoffLimitPerIndex": 0, "ttlSecondsAfterFinished": 600,
                    "template": { "spec": { "restartPolicy": "Never", "containers": [{
                        "name": "worker", "image": "ingressbench", "args": args }] } }
                }
            }))
            .unwrap()
        };
        jobs.create(&PostParams::default(), &job("done", serde_json::json!(["--version"])))
            .await
            .unwrap();
        jobs.create(
            &PostParams::default(),
            &job(
                "fails",
                serde_json::json!(["scenario", "check", "/nonexistent/index-$(JOB_COMPLETION_INDEX).yaml"]),
            ),
        )
        .await
        .unwrap();
        let condition = |job: &Job, kind: &str| {
            job.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == kind && c.status == "True"))
        };
        let done = wait_for("the Job of two exits 0 complete", async || {
            let j = jobs.get("done").await.ok()?;
            condition(&j, "Complete").then_some(j)
        })
        .await;
        assert_eq!(done.status.and_then(|s| s.succeeded), Some(2));
        wait_for("the Job of failing pods failed", async || {
            let j = jobs.get("fails").await.ok()?;
            condition(&j, "Failed").then_some(())
        })
        .await;
        let failed_pods = unknown
            .list(&kube::api::ListParams::default().labels("job-name=fails"))
            .await
            .unwrap();
        let mut said = String::new();
        for p in &failed_pods.items {
            let status = p.status.clone().unwrap_or_default();
            assert_eq!(status.phase.as_deref(), Some("Failed"), "{p:?}");
            let log = dir.join("cluster/pods").join(format!(
                "default_{}.log",
                p.metadata.name.clone().unwrap_or_default()
            ));
            said += &std::fs::read_to_string(&log).unwrap_or_default();
        }
        for index in ["index-0.yaml", "index-1.yaml"] {
            assert!(said.contains(index), "{index} not in the pods' logs: {said}");
        }
        for name in ["done", "fails"] {
            jobs.delete(name, &DeleteParams::background()).await.unwrap();
        }
        wait_for("the Jobs' pods gone", async || {
            let left = unknown
                .list(&kube::api::ListParams::default().labels("job-name"))
                .await
                .ok()?;
            left.items.is_empty().then_some(())
        })
        .await;
        // The next parts share the cluster: this part's route and pods go.
        let gone = DeleteParams::default();
        ingresses.delete("echo", &gone).await.unwrap();
        services.delete("echo", &gone).await.unwrap();
        for name in ["echo", "nginx"] {
            deployments.delete(name, &gone).await.unwrap();
        }
    });
}

/// A cluster file that places Traefik by the LoadBalancer Service the local cluster gives
/// it.
const SERVICE_FILE: &str =
    "targets:\n  traefik: { ingress_class: traefik, service: { name: traefik, namespace: kube-system } }\n";

fn check(file: &Path, kubeconfig: &Path) -> Output {
    Command::new(BIN)
        .args(["cluster", "check"])
        .arg(file)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .unwrap()
}

/// `cluster check` against the local cluster: a missing class, then present; a token
/// without the verbs; a bad token; an API that is not there. Each a clear FAIL with its
/// fix, exit 2, within seconds.
fn cluster_check_says_what_is_missing(dir: &Path) {
    let admin = dir.join("cluster/kubeconfig");
    // The cluster file `up` wrote: Traefik, class traefik, at its address. All pass.
    let file = dir.join("cluster.yaml");
    let out = check(&file, &admin);
    assert!(out.status.success(), "{}", tail(&out));
    let said = text(&out);
    assert!(
        said.contains("ok   API: answers, Kubernetes v1.33.13"),
        "{said}"
    );
    let verbs = ingressbench_cluster::check::NEEDED.len();
    assert!(
        said.contains(&format!("ok   permissions: all {verbs} verbs")),
        "{said}"
    );
    assert!(
        said.contains("ok   traefik: ingress class: `traefik` exists"),
        "{said}"
    );
    // Both Gateways, each with its implementation.
    for (target, gateway, controller) in [
        ("traefik-gateway", "kube-system/traefik", "traefik.io"),
        (
            "contour-gateway",
            "projectcontour/contour",
            "projectcontour.io",
        ),
    ] {
        assert!(
            said.contains(&format!(
                "ok   {target}: gateway: {gateway} (listener web) exists (controller {controller}/gateway-controller)"
            )),
            "{said}"
        );
    }
    // A listener the Gateway does not have, and a Gateway that is not there.
    let wrong = dir.join("wrong-gateway.yaml");
    std::fs::write(
        &wrong,
        std::fs::read_to_string(&file)
            .unwrap()
            .replace("listener: web,", "listener: nope,")
            .replace(
                "name: contour, namespace: projectcontour",
                "name: contour, namespace: default",
            ),
    )
    .unwrap();
    let out = check(&wrong, &admin);
    assert_eq!(out.status.code(), Some(2), "{}", tail(&out));
    assert!(
        text(&out).contains("FAIL traefik-gateway: gateway: Gateway kube-system/traefik has no listener `nope` (it has: web, websecure)")
            && text(&out).contains("FAIL contour-gateway: gateway: no Gateway default/contour"),
        "{}",
        tail(&out)
    );
    assert!(said.contains("ok   traefik: address"), "{said}");
    // The same controller found through its LoadBalancer Service's status: the address
    // of the load balancer's stand-in (an L4 front of its own), not Traefik's.
    let by_service = dir.join("by-service.yaml");
    std::fs::write(&by_service, SERVICE_FILE).unwrap();
    let out = check(&by_service, &admin);
    assert!(out.status.success(), "{}", tail(&out));
    assert!(
        text(&out).contains("ok   traefik: address: http://127.0.1.1:")
            && !text(&out).contains(&traefik_http(dir)),
        "{}",
        tail(&out)
    );
    assert!(
        std::fs::read_to_string(&file).unwrap().contains(
            "# through a load balancer: service: { name: envoy, namespace: projectcontour }"
        ),
        "the cluster file names every controller's load balancer"
    );
    // A class no controller serves.
    let out = check(&unserved_class(dir), &admin);
    assert_eq!(out.status.code(), Some(2), "{}", tail(&out));
    assert!(
        text(&out).contains(
            "FAIL traefik: ingress class: no IngressClass `nginx` (there are: contour, haproxy, traefik)"
        ) && text(&out).contains("correct targets.traefik.ingress_class"),
        "{}",
        tail(&out)
    );
    // The scheduler's identity cannot make namespaces.
    let out = check(&file, &dir.join("cluster/kube-scheduler.kubeconfig"));
    assert_eq!(out.status.code(), Some(2), "{}", tail(&out));
    assert!(
        text(&out).contains("FAIL permissions: not allowed to create namespaces")
            && text(&out).contains("kubectl apply -f deploy/rbac.yaml"),
        "{}",
        tail(&out)
    );
    // A token the cluster does not know, and an API server that is not there.
    let (bad_token, mut doc) = unknown_token(dir);
    let started = std::time::Instant::now();
    let out = check(&file, &bad_token);
    assert_eq!(out.status.code(), Some(2), "{}", tail(&out));
    assert!(
        text(&out).contains("401 Unauthorized") && text(&out).contains("deploy/rbac.yaml"),
        "{}",
        tail(&out)
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    doc["clusters"][0]["cluster"]["server"] =
        serde_json::json!(format!("https://127.0.0.1:{port}"));
    let nowhere = dir.join("nowhere.kubeconfig");
    std::fs::write(&nowhere, doc.to_string()).unwrap();
    let out = check(&file, &nowhere);
    assert_eq!(out.status.code(), Some(2), "{}", tail(&out));
    assert!(
        text(&out).contains("FAIL API:") && text(&out).contains("is the API server running"),
        "{}",
        tail(&out)
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "bad credentials and a missing server are told within seconds"
    );
}

/// The names of the run's pods once `n` are ready and the EndpointSlices list `n` ready
/// addresses.
fn ready_pods(run: &ingressbench_cluster::deploy::RunNamespace, n: usize) -> Option<Vec<String>> {
    let pods = run.pods().ok()?;
    let ready: Vec<String> = pods
        .iter()
        .filter(|p| p.ready)
        .map(|p| p.name.clone())
        .collect();
    let endpoints = run.ready_endpoints().ok()?;
    (ready.len() == n && endpoints.len() == n).then_some(ready)
}

/// Waits (at most 60 s) until `check` gives a value.
pub(crate) fn wait_until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "after 60 s: {what}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A run's namespace through the library: made, routed, scaled, a pod killed, cleaned up
/// with only the tool's stale namespaces taken, deleted.
fn a_run_namespace_is_made_changed_through_the_api_and_removed_and_cleanup_takes_only_the_tools(
    dir: &Path,
) {
    use ingressbench_cluster::deploy::{
        cleanup, RunNamespace, RunObjects, HEARTBEAT, MANAGED_BY, TOOL,
    };
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::PostParams;
    let kubeconfig = dir.join("cluster/kubeconfig");
    let entry = traefik_http(dir);
    let api = ingressbench_cluster::api::ClusterApi::connect(&kubeconfig, None).unwrap();
    let run = RunNamespace::create(
        &api,
        RunObjects {
            namespace: "ib-test-run".into(),
            run_id: "test-run".into(),
            pool: "echo".into(),
            replicas: 2,
            other_pools: Vec::new(),
            image: "ingressbench".into(),
            backend_args: Vec::new(),
            routes: vec![ingressbench_cluster::deploy::Route {
                host: "app.test".into(),
                prefix: "/".into(),
                pool: "echo".into(),
            }],
            routing: ingressbench_cluster::routes::Routing::Ingress {
                class: "traefik".into(),
                profile: None,
            },
            generation: None,
            cors_origins: Vec::new(),
            sysctls: [("net.core.somaxconn".to_owned(), "1234".to_owned())].into(),
            grace_s: 2,
            tls: None,
            mesh: None,
            traffic: ingressbench_cluster::deploy::Traffic::Http,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let first = wait_until("2 pods ready and in the EndpointSlices", || {
        ready_pods(&run, 2)
    });
    // The pods' sysctls, in each pod's own network namespace; the machine keeps its own.
    for pod in &first {
        let pid = container_processes(pod)[0];
        let inside = Command::new("nsenter")
            .arg(format!("--net=/proc/{pid}/ns/net"))
            .args(["cat", "/proc/sys/net/core/somaxconn"])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&inside.stdout).trim(),
            "1234",
            "{pod}"
        );
    }
    assert_ne!(
        std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .unwrap()
            .trim(),
        "1234"
    );
    // Routed through the cluster's controller, by the Ingress the run made.
    let answer = wait_until("an answer through Traefik", || {
        backend_via(&entry, "app.test").filter(|b| first.contains(b))
    });
    assert!(first.contains(&answer));
    another_pod_cannot_stall_the_runs_backends(dir, &run, &first[0]);
    // Scale, then kill one (grace 0): the API and the EndpointSlices follow.
    run.scale(3).unwrap();
    let three = wait_until("3 pods ready", || ready_pods(&run, 3));
    run.delete_pod(&three[0], Some(0)).unwrap();
    wait_until("the killed pod out of the endpoints and replaced", || {
        let pods = run.pods().ok()?;
        let gone = !pods.iter().any(|p| p.name == three[0]);
        (gone && run.ready_endpoints().ok()?.len() == 3).then_some(())
    });
    // Cleanup takes a namespace of the tool whose heartbeat is stale, and nothing else:
    // not the live run's, not one without the tool's label.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = ingressbench_cluster::api::client(&kubeconfig, None)
            .await
            .unwrap();
        let namespaces: kube::Api<Namespace> = kube::Api::all(client);
        let make = |name: &str, labelled: bool| {
            let mut ns: Namespace =
                serde_json::from_value(serde_json::json!({ "metadata": { "name": name } }))
                    .unwrap();
            if labelled {
                ns.metadata.labels = Some([(MANAGED_BY.to_owned(), TOOL.to_owned())].into());
                ns.metadata.annotations = Some([(HEARTBEAT.to_owned(), "1".to_owned())].into());
            }
            ns
        };
        namespaces
            .create(&PostParams::default(), &make("ib-test-stale", true))
            .await
            .unwrap();
        namespaces
            .create(&PostParams::default(), &make("not-the-tools", false))
            .await
            .unwrap();
    });
    let removed = cleanup(&api).unwrap();
    assert_eq!(removed, vec!["ib-test-stale".to_owned()]);
    let alive = runtime.block_on(async {
        let client = ingressbench_cluster::api::client(&kubeconfig, None)
            .await
            .unwrap();
        let namespaces: kube::Api<Namespace> = kube::Api::all(client);
        (
            namespaces.get_opt("not-the-tools").await.unwrap().is_some(),
            namespaces.get_opt("ib-test-run").await.unwrap().is_some(),
        )
    });
    assert_eq!(alive, (true, true), "cleanup took what it must not");
    // The run's end: its namespace goes, with everything in it.
    run.delete().unwrap();
    runtime.block_on(async {
        let client = ingressbench_cluster::api::client(&kubeconfig, None)
            .await
            .unwrap();
        let namespaces: kube::Api<Namespace> = kube::Api::all(client);
        wait_for("the run's namespace gone", async || {
            namespaces
                .get_opt("ib-test-run")
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
    });
    assert!(run.pods().unwrap().is_empty());
}

/// A pod of another namespace that reaches a backend's control endpoint (every pod
/// reaches every pod's address) is refused a stall, and the backend answers on; the run's
/// own stall, through the API server with the run's token, is obeyed.
fn another_pod_cannot_stall_the_runs_backends(
    dir: &Path,
    run: &ingressbench_cluster::deploy::RunNamespace,
    target: &str,
) {
    use k8s_openapi::api::core::v1::Pod;
    let ip = run
        .pods()
        .unwrap()
        .into_iter()
        .find(|p| p.name == target)
        .and_then(|p| p.ip)
        .unwrap();
    let kubeconfig = dir.join("cluster/kubeconfig");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let pods: kube::Api<Pod> = runtime.block_on(async {
        let client = ingressbench_cluster::api::client(&kubeconfig, None)
            .await
            .unwrap();
        kube::Api::namespaced(client, "default")
    });
    let intruder: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "intruder" },
        "spec": { "restartPolicy": "Never", "containers": [{
            "name": "intruder", "image": "ingressbench",
            "args": ["load", "-X", "POST", "--sequential", "-n", "1",
                     format!("http://{ip}:8081/stall?for=60s")]
        }] }
    }))
    .unwrap();
    runtime
        .block_on(pods.create(&kube::api::PostParams::default(), &intruder))
        .unwrap();
    runtime.block_on(wait_for("the intruder's request to end", async || {
        let p = pods.get("intruder").await.ok()?;
        let phase = p.status?.phase?;
        (phase == "Succeeded" || phase == "Failed").then_some(())
    }));
    let said = std::fs::read_to_string(dir.join("cluster/pods/default_intruder.log")).unwrap();
    assert!(said.contains("403"), "{said}");
    // Not held: a stall of 60 s would hold this answer past its own timeout.
    assert_eq!(backend_at(&ip).as_deref(), Some(target), "{said}");
    runtime
        .block_on(pods.delete("intruder", &kube::api::DeleteParams::default()))
        .unwrap();
    run.stall_pod(target, std::time::Duration::from_millis(1))
        .unwrap_or_else(|e| panic!("the run's own stall: {e}"));
}

/// The tool's namespaces in the cluster that are not being deleted.
fn tools_namespaces(kubeconfig: &Path) -> Vec<String> {
    namespaces_of_the_tool(kubeconfig)
        .into_iter()
        .filter(|(_, deleting)| !deleting)
        .map(|(name, _)| name)
        .collect()
}

/// Every namespace the tool made, with whether it is being deleted. A namespace asked to
/// go lives on for at least 5 s (kube-controller-manager waits that long before it
/// deletes what is in it), so the parts check that the tool asked ([`tools_namespaces`]
/// is empty) and the test's end that every one is gone, rather than waiting 5 s after
/// each run.
fn namespaces_of_the_tool(kubeconfig: &Path) -> Vec<(String, bool)> {
    use k8s_openapi::api::core::v1::Namespace;
    listed::<Namespace>(kubeconfig, "app.kubernetes.io/managed-by=ingressbench")
        .into_iter()
        .map(|n| {
            let deleting = n.metadata.deletion_timestamp.is_some();
            (n.metadata.name.unwrap_or_default(), deleting)
        })
        .collect()
}

/// `ingressbench run FILE --cluster CLUSTER --kubeconfig K --out OUT`, with `extra` args.
pub(crate) fn run_in_cluster(
    scenario: &Path,
    cluster: &Path,
    kubeconfig: &Path,
    out: &Path,
) -> Command {
    let mut command = Command::new(BIN);
    command
        .arg("run")
        .arg(scenario)
        .arg("--cluster")
        .arg(cluster)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--out")
        .arg(out)
        .arg("--force");
    command
}

/// The last forty lines of [`text`]: enough to see why a command failed, short enough
/// that a failing test's own message is not cut from what CI shows.
pub(crate) fn tail(o: &Output) -> String {
    let all = text(o);
    let lines: Vec<&str> = all.lines().collect();
    let from = lines.len().saturating_sub(40);
    let cut = if from > 0 {
        format!("[{from} lines before]\n")
    } else {
        String::new()
    };
    cut + &lines[from..].join("\n")
}

/// A cell's impact.json, a line per event: what, its times and its errors.
fn brief(impact: &[serde_json::Value]) -> String {
    impact
        .iter()
        .map(|e| {
            format!(
                "{} requested {} applied {} took effect {} errors {}",
                e["what"], e["requested_s"], e["applied_s"], e["took_effect_s"], e["errors"]
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs `scenario` with `cluster` and `kubeconfig`, expecting a refusal: exit 2, saying
/// `says`.
fn refused(scenario: &Path, cluster: &Path, kubeconfig: &Path, out: &Path, says: &str) {
    let run = run_in_cluster(scenario, cluster, kubeconfig, out)
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2), "{}", tail(&run));
    assert!(text(&run).contains(says), "{}", tail(&run));
}

/// A scenario through the binary: three events with three times each, nothing left;
/// bad input refused with exit 2; a SIGKILLed run's namespace taken by `cluster cleanup`.
fn a_scenario_runs_in_the_cluster_with_three_times_per_event_and_leaves_nothing(dir: &Path) {
    let kubeconfig = dir.join("cluster/kubeconfig");
    let cluster = dir.join("cluster.yaml");
    let scenario = dir.join("scale-kill.yaml");
    std::fs::write(
        &scenario,
        "name: scale-kill\ntargets: [{ cluster: traefik }]\nbackends: [{ name: echo, replicas: 3 }]\ntls: false\nload: { mode: open, rate: 100, connections: 20, duration: 14s, warmup: 1s, sample_rate: 1 }\nevents:\n  - { at: 2s, scale: 4 }\n  - { at: 5s, scale: 3 }\n  - { at: 8s, kill: random }\n  - { at: 10s, stall_backend: { backend: echo-1, for: 1500ms } }\n",
    )
    .unwrap();
    let out = dir.join("results");
    let run = run_in_cluster(&scenario, &cluster, &kubeconfig, &out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    let cell = cells_of(&out)[0].clone();
    let impact: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(cell.join("impact.json")).unwrap()).unwrap();
    assert_eq!(impact.len(), 4, "four events");
    // The stall went through the API server's pod proxy to the backend's control
    // endpoint: the answers it held waited it out.
    let stall = &impact[3];
    assert!(
        stall["what"].as_str().unwrap().starts_with("stall echo-"),
        "{stall}"
    );
    assert!(
        stall["max_latency_ms"].as_f64().unwrap() >= 1000.0,
        "{stall}"
    );
    for e in &impact[..3] {
        // The API accepted it, then the EndpointSlices showed it.
        let requested = e["requested_s"].as_f64().unwrap();
        let endpoints = e["endpoints_s"].as_f64().unwrap_or(-1.0);
        assert!(endpoints >= requested, "{e}");
    }
    // The new pod's first answer after the scale-up, within the window.
    let up = &impact[0];
    assert_eq!(up["what"].as_str().unwrap(), "scale echo 3->4");
    assert!(
        up["took_effect_s"]
            .as_f64()
            .is_some_and(|t| t >= up["requested_s"].as_f64().unwrap() && t < 5.0),
        "{up}"
    );
    // The killed pod was deleted through the API: the EndpointSlices dropped it, and the
    // traffic's last answer from it is its time.
    let kill = &impact[2];
    assert!(
        kill["what"].as_str().unwrap().starts_with("kill echo-"),
        "{kill}"
    );
    let events = std::fs::read_to_string(cell.join("events.jsonl")).unwrap();
    assert!(events.contains("\"removed\":[\"echo-"), "{events}");
    // Nothing left: the cell's namespace goes at its end.
    wait_until("every namespace of the tool deleted or going", || {
        tools_namespaces(&kubeconfig).is_empty().then_some(())
    });
    // A target the cluster file does not place: refused before anything is made.
    let unplaced = dir.join("unplaced.yaml");
    std::fs::write(
        &unplaced,
        std::fs::read_to_string(&scenario).unwrap().replace(
            "targets: [{ cluster: traefik }]",
            "targets: [{ cluster: traefik }, { cluster: haproxy }]",
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    refused(
        &unplaced,
        &cluster,
        &kubeconfig,
        &dir.join("r2"),
        "does not place target(s) haproxy",
    );
    // A token the cluster does not know: refused at the first call, nothing made.
    refused(
        &scenario,
        &cluster,
        &unknown_token(dir).0,
        &dir.join("r3"),
        "cluster check",
    );
    // A class no controller serves.
    let cluster_text = std::fs::read_to_string(&cluster).unwrap();
    refused(
        &scenario,
        &unserved_class(dir),
        &kubeconfig,
        &dir.join("r5"),
        "no IngressClass `nginx`",
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(tools_namespaces(&kubeconfig).is_empty());
    // An image the nodes cannot run: known once its pods are placed, within seconds.
    let bad_image = dir.join("bad-image.yaml");
    std::fs::write(&bad_image, format!("image: nginx:1.27\n{cluster_text}")).unwrap();
    let started = std::time::Instant::now();
    let refused = run_in_cluster(&scenario, &bad_image, &kubeconfig, &dir.join("r6"))
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{}", tail(&refused));
    assert!(
        text(&refused).contains("cannot start: ErrImageNotKnown")
            && text(&refused).contains("`image:`"),
        "{}",
        tail(&refused)
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    wait_until("every namespace of the tool deleted or going", || {
        tools_namespaces(&kubeconfig).is_empty().then_some(())
    });
    // SIGKILL mid-cell: the namespace stays (nothing ran the tool's clean-up), and
    // `cluster cleanup` takes it at once (its owner is gone), touching nothing else.
    // Right after the run before, whose namespace is still being deleted (runs started
    // within one second once took the same one).
    let said = dir.join("r4.txt");
    let mut child = run_in_cluster(&scenario, &cluster, &kubeconfig, &dir.join("r4"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&said).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while tools_namespaces(&kubeconfig).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no namespace made: {}",
            std::fs::read_to_string(&said).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    child.kill().unwrap();
    child.wait().unwrap();
    let left = tools_namespaces(&kubeconfig);
    assert_eq!(left.len(), 1, "{left:?}");
    let cleanup = Command::new(BIN)
        .args(["cluster", "cleanup", "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    assert!(cleanup.status.success(), "{}", tail(&cleanup));
    assert!(
        text(&cleanup).contains(&format!("deleted namespace {}", left[0])),
        "{}",
        tail(&cleanup)
    );
    wait_until("every namespace of the tool deleted or going", || {
        tools_namespaces(&kubeconfig).is_empty().then_some(())
    });
}

/// A controller on other machines (a real cluster's): its pods named in the cluster
/// file's `usage:`, read through the API server's pod proxy from their own Prometheus
/// endpoint. The stand-in is a Deployment of the backend, whose control endpoint serves
/// the process collector's series: the run's figures for it are what /proc says of its
/// process. The metrics API, which this cluster does not serve, is refused by `cluster
/// check` naming metrics-server. Its proxy's counts (`counters: { pods }`) are read the
/// same way from a real Envoy in a pod, which serves `/stats/prometheus` as Contour's
/// does (a listener on 8002 that passes that one path to an admin interface on the pod's
/// own loopback).
fn a_controller_in_pods_is_read_through_the_api_servers_pod_proxy(dir: &Path) {
    use kube::api::DeleteParams;
    let kubeconfig = dir.join("cluster/kubeconfig");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let deployments = stand_in(
        &runtime,
        &kubeconfig,
        "usage-stand-in",
        1,
        &["--control", "0.0.0.0:8081"],
    );
    let pid = wait_until("the stand-in's process", || {
        container_processes("usage-stand-in").first().copied()
    });
    let envoys = envoy_stand_in(&runtime, &kubeconfig, "counters-stand-in");
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(envoys.clone().into_client(), "default");
    wait_until("the Envoy stand-in ready", || {
        let list = runtime
            .block_on(pods.list(&kube::api::ListParams::default().labels("app=counters-stand-in")))
            .ok()?;
        let ready = list.items.iter().any(|p| {
            let conditions = (p.status.as_ref()).and_then(|s| s.conditions.as_ref());
            conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        });
        ready.then_some(())
    });
    // The cluster file with Traefik's usage read from the stand-in's pods, not /proc.
    let written = std::fs::read_to_string(dir.join("cluster.yaml")).unwrap();
    let own = written.find(", local_pids: {").expect(&written);
    let end = own + written[own..].find('}').unwrap() + 1;
    let with = |usage: &str, more: &str| {
        format!(
            "{}, usage: {{ {usage} }}{more}{}",
            &written[..own],
            &written[end..]
        )
    };
    let pods = "namespace: default, selector: app=usage-stand-in";
    let through_metrics_api = dir.join("usage-metrics-api.yaml");
    std::fs::write(
        &through_metrics_api,
        with(&format!("controller: {{ {pods} }}"), ""),
    )
    .unwrap();
    let checked = check(&through_metrics_api, &kubeconfig);
    assert!(!checked.status.success(), "{}", tail(&checked));
    assert!(
        text(&checked).contains("metrics.k8s.io") && text(&checked).contains("metrics-server"),
        "{}",
        tail(&checked)
    );
    let through_pods = dir.join("usage-pods.yaml");
    std::fs::write(
        &through_pods,
        with(
            &format!("controller: {{ {pods}, metrics: {{ port: 8081 }} }}"),
            ", counters: { pods: { namespace: default, selector: app=counters-stand-in, port: 8002, exposition: envoy } }",
        ),
    )
    .unwrap();
    let checked = check(&through_pods, &kubeconfig);
    assert!(checked.status.success(), "{}", tail(&checked));
    assert!(
        text(&checked).contains("1 pod, ") && text(&checked).contains("on port 8081"),
        "{}",
        tail(&checked)
    );
    // Its static pool of 2 and the cluster of its admin interface: 3 endpoints up.
    assert!(
        text(&checked).contains("traefik: counters: 1 pod, /stats/prometheus on port 8002")
            && text(&checked).contains("endpoints_up 3"),
        "{}",
        tail(&checked)
    );
    let scenario = dir.join("usage.yaml");
    std::fs::write(
        &scenario,
        "name: usage\ntargets: [{ cluster: traefik }]\nbackends: [{ name: echo, replicas: 1 }]\ntls: false\nload: { mode: open, rate: 50, connections: 4, duration: 4s, warmup: 1s }\n",
    )
    .unwrap();
    let out = dir.join("usage-results");
    let run = run_in_cluster(&scenario, &through_pods, &kubeconfig, &out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    let cell = cells_of(&out)[0].clone();
    let usage = std::fs::read_to_string(cell.join("usage.jsonl")).unwrap();
    let rss = crate::common::rss_bytes(pid);
    let readings: Vec<serde_json::Value> = usage
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|r| {
            r["parts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "traefik-controller")
                .cloned()
                .expect(&usage)
        })
        .collect();
    assert!(readings.len() >= 4, "{usage}");
    for r in &readings {
        assert_eq!(r["role"], "controller", "{r}");
        assert_eq!(r["processes"], 1, "{r}");
        let read = r["rss_bytes"].as_f64().unwrap();
        assert!(
            read > rss * 0.5 && read < rss * 2.0,
            "read {read} through the API, /proc says {rss}"
        );
    }
    let cpu: Vec<f64> = readings
        .iter()
        .map(|r| r["cpu_s"].as_f64().unwrap())
        .collect();
    assert!(cpu.windows(2).all(|w| w[1] >= w[0]), "{cpu:?}");
    // The Envoy's counts, once a second through the API server.
    let counted = std::fs::read_to_string(cell.join("proxy-metrics.jsonl")).unwrap();
    let counted: Vec<serde_json::Value> = (counted.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(counted.len() >= 4, "{counted:?}");
    for r in &counted {
        assert!(r["errors"].is_null(), "{r}");
        assert_eq!(r["proxies"]["traefik"]["endpoints_up"], 3, "{r}");
        assert_eq!(
            r["proxies"]["traefik"]["upstream_connect_failures"], 0,
            "{r}"
        );
    }
    events_fire_on_time_while_a_reading_waits(dir, &written, end);
    events_fire_on_time_while_another_events_call_waits(dir, &written);
    runtime
        .block_on(deployments.delete("usage-stand-in", &DeleteParams::default()))
        .unwrap();
    runtime
        .block_on(envoys.delete("counters-stand-in", &DeleteParams::default()))
        .unwrap();
    wait_until("the stand-ins gone", || {
        (processes_with("usage-stand-in").is_empty()
            && processes_with("counters-stand-in").is_empty())
        .then_some(())
    });
    wait_until("every namespace of the tool deleted or going", || {
        tools_namespaces(&kubeconfig).is_empty().then_some(())
    });
}

/// Counts read from a pod that stops answering once the run has started (the Envoy
/// stand-in's process stopped: each reading gives up after 2 s, as at a controller that
/// is restarting): the events still fire when due, because the readings wait on a
/// thread of their own, and the readings say why they have no counts. `written`: the
/// cluster file `up` wrote, whose Traefik's `local_pids` ends at `end`.
fn events_fire_on_time_while_a_reading_waits(dir: &Path, written: &str, end: usize) {
    let envoy = container_processes("counters-stand-in");
    assert!(!envoy.is_empty());
    let stopped = run_stopping(
        dir,
        "slow-counters",
        &format!(
            "{}, counters: {{ pods: {{ namespace: default, selector: app=counters-stand-in, port: 8002, exposition: envoy }} }}{}",
            &written[..end],
            &written[end..]
        ),
        "name: slow-counters\ntargets: [{ cluster: traefik }]\nbackends: [{ name: echo, replicas: 2 }]\ntls: false\nload: { mode: open, rate: 50, connections: 4, duration: 5s, warmup: 1s }\nevents:\n  - { at: 1s, every: 500ms, times: 6, stall_backend: { backend: random, for: 10ms } }\n",
        // Checked and started: the pod stops answering while the cell is made.
        |_| Some(()),
        || envoy.clone(),
    );
    assert!(stopped.ended.success(), "{}", stopped.said);
    // Before, each reading held the driver for its 2 s: events fired up to 2 s late.
    assert_eq!(fired_on_time(&stopped.events), 6);
    let counted = std::fs::read_to_string(stopped.cell.join("proxy-metrics.jsonl")).unwrap();
    let unanswered = counted
        .lines()
        .filter(|l| l.contains("no answer in 2 s"))
        .count();
    assert!(unanswered >= 2, "{counted}");
    let _ = std::fs::remove_dir_all(stopped.cell.parent().unwrap().parent().unwrap());
}

/// An event's API call that never returns: every backend pod of the cell stopped once
/// the load runs, so each `stall_backend` call (through the API server's pod proxy to
/// the backend's control endpoint) waits with no answer. Each event's calls are its own
/// thread's, so the next stall still fires when due; before, the first held the driver
/// and the others never fired. The stalls asked after the stop are never applied, and
/// the run ends all the same.
fn events_fire_on_time_while_another_events_call_waits(dir: &Path, written: &str) {
    let stopped = run_stopping(
        dir,
        "stuck-call",
        written,
        "name: stuck-call\ntargets: [{ cluster: traefik }]\nbackends: [{ name: stuckapi, replicas: 2 }]\ntls: false\nload: { mode: open, rate: 20, connections: 4, duration: 7s, timeout: 500ms }\nevents:\n  - { at: 3s, every: 500ms, times: 6, stall_backend: { backend: random, for: 10ms } }\n",
        // The load's first window written: the backends stop before the first event (3 s).
        |cell| {
            let hlog = std::fs::read_to_string(cell.join("latency.hlog")).ok()?;
            hlog.contains("#outcomes").then_some(())
        },
        || {
            let backends = container_processes("stuckapi-");
            assert_eq!(backends.len(), 2, "{backends:?}");
            backends
        },
    );
    assert_eq!(fired_on_time(&stopped.events), 6, "{}", stopped.said);
    let applied = (stopped.events.lines())
        .filter(|l| l.contains("\"applied_s\""))
        .count();
    assert!(
        applied <= 1,
        "the stalls' calls were answered: {}",
        stopped.events
    );
    let _ = std::fs::remove_dir_all(stopped.cell.parent().unwrap().parent().unwrap());
}

/// A run that ended with processes stopped under it.
struct Stopped {
    ended: std::process::ExitStatus,
    said: String,
    /// Its one cell's directory.
    cell: std::path::PathBuf,
    /// Its events.jsonl.
    events: String,
}

/// Runs `scenario` (`NAME-scenario.yaml`) with `cluster` (`NAME.yaml`) in the background;
/// once its cell's directory exists and `ready` says so, SIGSTOPs the processes `pids`
/// names, waits for the run to end by itself, and lets them go on.
fn run_stopping(
    dir: &Path,
    name: &str,
    cluster: &str,
    scenario: &str,
    ready: impl Fn(&Path) -> Option<()>,
    pids: impl Fn() -> Vec<u32>,
) -> Stopped {
    let kubeconfig = dir.join("cluster/kubeconfig");
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, cluster).unwrap();
    let scenario_file = dir.join(format!("{name}-scenario.yaml"));
    std::fs::write(&scenario_file, scenario).unwrap();
    let out = dir.join(format!("{name}-results"));
    let log = dir.join(format!("{name}.log"));
    let mut run = run_in_cluster(&scenario_file, &file, &kubeconfig, &out)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
        .spawn()
        .unwrap();
    wait_until("the cell started", || {
        let cell = std::fs::read_dir(out.join("cells")).ok()?.next()?.ok()?;
        ready(&cell.path())
    });
    let pids = pids();
    let signal = |s: &str| {
        Command::new("kill")
            .arg(s)
            .args(pids.iter().map(u32::to_string))
            .status()
            .unwrap()
    };
    assert!(signal("-STOP").success());
    let ended =
        crate::common::ends_within(&mut run, std::time::Duration::from_secs(300), "the run");
    assert!(signal("-CONT").success());
    let said = std::fs::read_to_string(&log).unwrap_or_default()
        + &std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
    let cell = cells_of(&out)[0].clone();
    let events = std::fs::read_to_string(cell.join("events.jsonl")).unwrap_or_default();
    Stopped {
        ended,
        said,
        cell,
        events,
    }
}

/// How many events fired, each asked for within 1 s of when it was due (`events`: an
/// events.jsonl).
fn fired_on_time(events: &str) -> usize {
    let fired: Vec<(f64, f64)> = events
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|e| Some((e["due_s"].as_f64()?, e["requested_s"].as_f64()?)))
        .collect();
    for (due, requested) in &fired {
        assert!(
            requested - due < 1.0,
            "due at {due} s, asked for at {requested} s: {events}"
        );
    }
    fired.len()
}

pub(crate) fn json_of(cell: &Path, name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(cell.join(name)).unwrap()).unwrap()
}

/// `scenarios/churn.yaml`, `pod-kill.yaml` and `sequential-bursts.yaml` as shipped, in
/// quick mode, against the local cluster file's targets (Traefik reached through its
/// LoadBalancer Service's status). Churn over TLS through the five that can express its
/// route changes (Contour's Gateway, which cannot take CORS, is left out saying so): its
/// scale-ups, scale-downs and route changes each with its times, each controller its own
/// way. Pod-kill's kills are real pod deletions the EndpointSlices show, each error
/// attributed to an event. Sequential-bursts' two hosts each reach their own pool, over
/// TLS, through all six.
fn the_shipped_scenarios_run_against_every_controller_of_the_cluster(dir: &Path) {
    let kubeconfig = dir.join("cluster/kubeconfig");
    let cluster = dir.join("cluster.yaml");
    let shipped = |name: &str| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../scenarios")
            .join(name)
    };
    let time = |e: &serde_json::Value, key: &str| e[key].as_f64().unwrap_or(-1.0);
    // Traefik's HTTPS port from its Service's status, the others from the file.
    let by_service = dir.join("by-service-all.yaml");
    let file: String = std::fs::read_to_string(&cluster)
        .unwrap()
        .lines()
        .map(|l| {
            if l.starts_with("  traefik: ") {
                SERVICE_FILE.lines().nth(1).unwrap().to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&by_service, file + "\n").unwrap();
    let out = dir.join("churn");
    let churn = run_in_cluster(&shipped("churn.yaml"), &by_service, &kubeconfig, &out)
        // HTTP/1.1 only: churn's protocol axis would double the cells and halve each.
        .args([
            "--quick",
            "--set",
            "load.rate=100",
            "--set",
            "load.protocol=http1",
        ])
        .output()
        .unwrap();
    assert!(churn.status.success(), "{}", tail(&churn));
    assert!(
        text(&churn).contains("left out: contour-gateway: "),
        "{}",
        tail(&churn)
    );
    let cells = cells_of(&out);
    let names: Vec<String> = cells
        .iter()
        .map(|c| c.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "000-contour",
            "001-envoy-gateway",
            "002-haproxy-ingress",
            "003-traefik",
            "004-traefik-gateway"
        ],
        "{}",
        tail(&churn)
    );
    // Traefik, placed by its LoadBalancer Service, was loaded through the load
    // balancer's stand-in (the Service's HTTPS port, on 127.0.1.1); the others not.
    let lb_https = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = ingressbench_cluster::api::client(&kubeconfig, None)
            .await
            .unwrap();
        let services: kube::Api<k8s_openapi::api::core::v1::Service> =
            kube::Api::namespaced(client, "kube-system");
        let lb = services.get("traefik").await.unwrap();
        let ip = lb.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0]
            .ip
            .clone();
        assert_eq!(ip.as_deref(), Some("127.0.1.1"));
        let ports = lb.spec.unwrap().ports.unwrap();
        ports
            .iter()
            .find(|p| p.name.as_deref() == Some("https"))
            .unwrap()
            .port
    });
    let record = json_of(&out, "run.json");
    for c in record["cells"].as_array().unwrap() {
        let address = c["entry"]["address"].as_str().unwrap_or("").to_owned();
        let through_lb = c["target"] == "traefik";
        assert_eq!(
            address == format!("127.0.1.1:{lb_https}"),
            through_lb,
            "{}: {address}",
            c["target"]
        );
    }
    for cell in &cells {
        let impact = json_of(cell, "impact.json").as_array().unwrap().clone();
        assert_eq!(impact.len(), 10, "{cell:?}: 6 scales and 4 route changes");
        // What Contour's Envoy and HAProxy Ingress's haproxy counted, read through their
        // sockets in the cluster's directory once a second, and Envoy Gateway's Envoy
        // through its pods' Prometheus endpoint, per event beside the client's errors;
        // Traefik's are not read.
        let name = cell.file_name().unwrap().to_string_lossy().into_owned();
        let read = name.ends_with("contour")
            || name.ends_with("haproxy-ingress")
            || name.ends_with("envoy-gateway");
        assert_eq!(cell.join("proxy-metrics.jsonl").is_file(), read, "{cell:?}");
        if read {
            let target = name.split_once('-').unwrap().1;
            let readings = std::fs::read_to_string(cell.join("proxy-metrics.jsonl")).unwrap();
            assert!(readings.lines().count() >= 5, "{cell:?}: {readings}");
            assert!(!readings.contains("\"errors\""), "{cell:?}: {readings}");
            for e in &impact {
                let counted = &e["proxy_counted"][target];
                assert!(
                    counted["upstream_connect_failures"].is_u64(),
                    "{cell:?}: {e}"
                );
                assert!(counted["responses_5xx"].is_u64(), "{cell:?}: {e}");
            }
        }
        // The control plane's part is always read; the traffic's when it showed the
        // change before the next event (quick mode puts them 2.2 s apart here, and
        // Traefik applies changes at most once per 2 s).
        for e in &impact[..6] {
            let requested = time(e, "requested_s");
            assert!(time(e, "endpoints_s") >= requested, "{cell:?}: {e}");
            if !e["took_effect_s"].is_null() {
                assert!(time(e, "took_effect_s") >= requested, "{cell:?}: {e}");
            }
        }
        let mut seen = 0;
        for up in impact[..6].iter().step_by(2) {
            // The new pod's first answer, within the event's window.
            assert!(up["what"].as_str().unwrap().ends_with("3->4"), "{up}");
            assert_eq!(
                up["took_effect_basis"], "first answer from a backend it started",
                "{cell:?}"
            );
            if !up["took_effect_s"].is_null() {
                assert!(
                    time(up, "took_effect_s") < time(up, "requested_s") + time(up, "window_s"),
                    "{cell:?}: {up}"
                );
                seen += 1;
            }
        }
        // Quick mode puts the events 1.7 s apart here: on a busy machine a pod can take
        // 1.2 s to be ready and HAProxy Ingress as long again to send it traffic (CI
        // once saw all three windows end first). Then a new pod answered later in the
        // cell: more backends answered than the three at the start.
        let backends = json_of(cell, "summary.json")["backends"]
            .as_object()
            .map_or(0, serde_json::Map::len);
        assert!(
            seen >= 1 || backends > 3,
            "{cell:?}: no scale-up's new pod answered ({backends} backends did): {}",
            brief(&impact)
        );
        let mut unseen = 0;
        for (change, generation) in impact[6..].iter().zip(2..) {
            // The API stored the routes, then answers carried the new generation.
            assert!(
                time(change, "applied_s") >= time(change, "requested_s"),
                "{cell:?}: {change}"
            );
            assert_eq!(
                change["generations"][0]["generation"], generation,
                "{cell:?}: {change}"
            );
            if change["took_effect_s"].is_null() {
                // Unseen only when no answer carried its generation before the next
                // change: HAProxy Ingress and Traefik apply updates at most once per 2 s,
                // and quick mode puts the changes 2.2 s apart (the revert shortly before
                // the load ends); on a machine busy with other tests one more may slip.
                assert_eq!(change["generations"][0]["answers_after"], 0, "{change}");
                unseen += 1;
            } else {
                // `applied_s` is when the API's answer reached the tool: a controller that
                // watches and pushes as fast as Envoy Gateway can have its Envoy carry
                // the change before that answer arrives on a busy machine (CI: 6 ms
                // before, 42 ms after the request).
                assert!(
                    time(change, "took_effect_s") >= time(change, "requested_s"),
                    "{cell:?}: {change}"
                );
            }
        }
        assert!(unseen <= 2, "{cell:?}: {}", brief(&impact));
        assert_eq!(impact[9]["what"], "revert route changes");
    }
    // Pod-kill: the lab's stand-in for a slow controller has no meaning here, and says so.
    let pod_kill = shipped("pod-kill.yaml");
    let out = dir.join("pod-kill");
    let delayed = run_in_cluster(&pod_kill, &cluster, &kubeconfig, &out)
        .args(["--quick", "--set", "targets=[traefik]"])
        .output()
        .unwrap();
    assert_eq!(delayed.status.code(), Some(2), "{}", tail(&delayed));
    assert!(
        text(&delayed).contains("--set controller.propagation_delay=0s"),
        "{}",
        tail(&delayed)
    );
    let run = run_in_cluster(&pod_kill, &cluster, &kubeconfig, &out)
        // A request to a killed pod's address waits for the client's timeout (nothing
        // answers there, not even a reset); 2 s rather than 10 s ends it sooner.
        .args(["--quick", "--set", "controller.propagation_delay=0s"])
        .args(["--set", "load.timeout=2s"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    let cells = cells_of(&out);
    assert_eq!(cells.len(), 6, "{cells:?}");
    for cell in &cells {
        let impact = json_of(cell, "impact.json").as_array().unwrap().clone();
        let kills: Vec<&serde_json::Value> = impact
            .iter()
            .filter(|e| e["what"].as_str().unwrap().starts_with("kill echo-"))
            .collect();
        assert_eq!(kills.len(), 10, "{cell:?}: {}", brief(&impact));
        let mut killed: Vec<&str> = kills
            .iter()
            .map(|k| k["what"].as_str().unwrap().trim_start_matches("kill "))
            .collect();
        killed.sort_unstable();
        killed.dedup();
        assert_eq!(killed.len(), 10, "{cell:?}: ten different pods: {killed:?}");
        for k in &kills {
            assert!(
                time(k, "endpoints_s") >= time(k, "requested_s"),
                "{cell:?}: {k}"
            );
        }
        // Every failed request is counted against the event it followed.
        let summary = json_of(cell, "summary.json");
        let attributed: u64 = impact
            .iter()
            .map(|e| e["sampled_errors"].as_u64().unwrap())
            .sum();
        assert_eq!(
            attributed,
            summary["requests"]["errors"].as_u64().unwrap(),
            "{cell:?}: {}",
            brief(&impact)
        );
    }
    // Sequential-bursts: its topology is the lab's emulation, refused with the fix; then
    // each host through each controller reaches its own pool.
    let bursts = shipped("sequential-bursts.yaml");
    let out = dir.join("sequential-bursts");
    let emulated = run_in_cluster(&bursts, &cluster, &kubeconfig, &out)
        .arg("--quick")
        .output()
        .unwrap();
    assert_eq!(emulated.status.code(), Some(2), "{}", tail(&emulated));
    assert!(
        text(&emulated)
            .contains("--set topology.placement=affinity --set topology.client=internal"),
        "{}",
        tail(&emulated)
    );
    let run = run_in_cluster(&bursts, &cluster, &kubeconfig, &out)
        .args(["--quick", "--set", "topology.placement=affinity"])
        .args(["--set", "topology.client=internal"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    let cells = cells_of(&out);
    assert_eq!(cells.len(), 12, "two hosts through six: {cells:?}");
    let run_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    for record in run_json["cells"].as_array().unwrap() {
        let cell = out.join("cells").join(record["dir"].as_str().unwrap());
        let pool = match record["settings"]["load.host"].as_str() {
            Some("a.app.test") => "app-a-",
            Some("b.app.test") => "app-b-",
            other => panic!("{other:?}: {record}"),
        };
        let samples = samples_of(&cell);
        assert!(samples.len() >= 10, "{cell:?}");
        for s in &samples {
            assert_eq!(s.status, 200, "{cell:?}: {s:?}");
            assert!(s.backend.starts_with(pool), "{cell:?}: {s:?}");
        }
    }
    wait_until("every namespace of the tool deleted or going", || {
        tools_namespaces(&kubeconfig).is_empty().then_some(())
    });
}

/// `scenarios/mesh.yaml` as shipped, in quick mode: each controller to its backend pods
/// directly, and to the same pods with an Envoy sidecar in each that demands a client
/// certificate. Every request of a cell in the mesh passed through one of its sidecars,
/// which logged the certificate the controller presented; the sidecar ran as the user its
/// security context names, in every backend pod of the mesh's cells and in no other; and
/// a Gateway target, which has no way to present a certificate, is refused with the
/// reason.
fn the_mesh_puts_a_sidecar_in_each_pod_that_the_controllers_reach_with_mutual_tls(dir: &Path) {
    let kubeconfig = dir.join("cluster/kubeconfig");
    let cluster = dir.join("cluster.yaml");
    let pods = dir.join("cluster/pods");
    let mesh = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/mesh.yaml");
    let sidecar_logs = || -> Vec<String> {
        std::fs::read_dir(&pods)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with("_envoy.log"))
            .collect()
    };
    assert!(sidecar_logs().is_empty(), "{:?}", sidecar_logs());
    let out = dir.join("mesh");
    let run = run_in_cluster(&mesh, &cluster, &kubeconfig, &out)
        .arg("--quick")
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    let record = json_of(&out, "run.json");
    let cells = record["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 8, "four controllers, in and out of the mesh");
    // The sidecars' logs are whole once their pods are gone (Envoy writes its access
    // log out every 10 s, and when it stops).
    wait_until("no namespace of the tool left", || {
        namespaces_of_the_tool(&kubeconfig).is_empty().then_some(())
    });
    let logs = sidecar_logs();
    for c in cells {
        let cell = out.join("cells").join(c["dir"].as_str().unwrap());
        assert_eq!(c["status"], "done", "{c}");
        let summary = json_of(&cell, "summary.json");
        assert_eq!(summary["requests"]["total"], 200, "{c}");
        assert_eq!(
            summary["requests"]["errors"], 0,
            "{c}: {} {}",
            summary["outcomes"], summary["failure_details"]
        );
        for s in samples_of(&cell) {
            assert!(s.backend.starts_with("bookstore-"), "{c}: {s:?}");
        }
        // The cell's sidecars' logs: `NAMESPACE_POD_envoy.log`, the namespace ending in
        // the cell's index.
        let suffix = format!("-{}", c["index"]);
        let own: Vec<&String> = logs
            .iter()
            .filter(|n| n.split('_').next().unwrap().ends_with(&suffix))
            .collect();
        let in_mesh = c["target"].as_str().unwrap().ends_with("-in-mesh");
        if !in_mesh {
            assert!(own.is_empty(), "{c}: {own:?}");
            continue;
        }
        assert_eq!(own.len(), 2, "{c}: a sidecar in each of two pods: {own:?}");
        let mut passed = 0;
        for name in own {
            let log = std::fs::read_to_string(pods.join(name)).unwrap();
            for line in log.lines().filter(|l| l.starts_with("mesh ")) {
                assert!(
                    line.contains("client=\"CN=ingressbench lab sidecar\""),
                    "{name}: {line}"
                );
                passed += usize::from(line.contains("\" 200 peer="));
            }
        }
        assert!(passed >= 200, "{c}: {passed} requests through the sidecars");
    }
    // The sidecars ran from the Envoy image, as their security context's user, one per
    // backend pod of the mesh.
    let ran = std::fs::read_to_string(pods.join("ran.jsonl")).unwrap();
    let sidecars: Vec<serde_json::Value> = ran
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        // Envoy Gateway's data plane runs an `envoy` container too.
        .filter(|r| {
            r["container"] == "envoy"
                && !r["pod"]
                    .as_str()
                    .unwrap()
                    .starts_with("envoy-gateway-system/")
        })
        .collect();
    assert_eq!(sidecars.len(), 8, "{ran}");
    for r in &sidecars {
        assert_eq!(r["user"], "65532:65532", "{r}");
        let ran = [&r["ran"], &r["argv"][0], &r["argv"][1]].map(|v| v.as_str().unwrap_or(""));
        assert_eq!(ran, ["image", "envoy", "--config-yaml"], "{r}");
    }
    // Contour's Gateway: its routes have no way to a client certificate (Envoy
    // Gateway's has, its Gateway's, and its cell in the mesh passed above: the sidecars
    // demand a client certificate from the CA they were given).
    let gateway = dir.join("mesh-gateway.yaml");
    std::fs::write(
        &gateway,
        std::fs::read_to_string(&mesh).unwrap().replace(
            "{ cluster: contour, name: contour-in-mesh,",
            "{ cluster: contour-gateway, name: contour-in-mesh,",
        ),
    )
    .unwrap();
    refused(
        &gateway,
        &cluster,
        &kubeconfig,
        &out,
        "target `contour-in-mesh`: ",
    );
    refused(&gateway, &cluster, &kubeconfig, &out, "a Gateway's routes");
    wait_until("every namespace of the tool deleted or going", || {
        tools_namespaces(&kubeconfig).is_empty().then_some(())
    });
}

/// Route changes (header, rewrite, CORS, revert) on two hosts through every controller of
/// the local cluster, the way each takes them: Traefik's Middlewares, Contour's
/// HTTPProxies, and HTTPRoute filters on the three Gateways (Traefik's CORS through a
/// Middleware the route names, Envoy Gateway's through the API's filter). Each change's `took_effect_s` is measured, and the raw
/// samples agree: every answer completed before the change was asked carries an older
/// generation, every answer after its mixed window the new one. What a controller
/// cannot express is refused before anything is made; a route its Gateway does not
/// accept fails the cell, naming the condition's reason, within seconds.
fn each_controller_routes_and_takes_route_changes_the_way_its_api_does(dir: &Path) {
    let kubeconfig = dir.join("cluster/kubeconfig");
    let cluster = dir.join("cluster.yaml");
    let file = std::fs::read_to_string(&cluster).unwrap();
    let all = [
        "traefik",
        "traefik-gateway",
        "contour",
        "contour-gateway",
        "haproxy-ingress",
        "envoy-gateway",
    ];
    for name in all {
        assert!(file.contains(&format!("  {name}: ")), "{file}");
    }
    let scenario = dir.join("controllers.yaml");
    // Three seconds between changes and after the last: Traefik applies provider changes
    // at most once per 2 s, and its Gateway provider took up to 2 s here.
    let events = "[{ at: 1500ms, config: { response_header: { name: X-Churn, value: \"on\" } } }, { at: 4500ms, config: { response_header: { name: X-Churn, value: \"on\" }, rewrite: { from: /old, to: /new } } }, { at: 7500ms, config: { cors_origin: \"https://app.example\" } }, { at: 10500ms, config: revert }]";
    std::fs::write(
        &scenario,
        format!("name: controllers\ntargets: [traefik]\nbackends: [{{ name: echo, replicas: 2 }}]\nroutes:\n  - {{ host: a.app.test, path_prefix: /, pool: echo }}\n  - {{ host: b.app.test, path_prefix: /api, pool: echo }}\ntls: false\nload: {{ mode: open, rate: 100, connections: 10, duration: 14s, host: a.app.test, sample_rate: 1 }}\nevents: {events}\n"),
    )
    .unwrap();
    // Contour's Gateway refuses the API's CORS filter: named, it is refused before
    // anything is made; among the cluster file's targets, it is left out, saying why.
    let out = dir.join("controllers");
    let named = dir.join("controllers-cors-gateway.yaml");
    std::fs::write(
        &named,
        std::fs::read_to_string(&scenario).unwrap().replace(
            "targets: [traefik]",
            "targets: [{ cluster: contour-gateway }]",
        ),
    )
    .unwrap();
    refused(&named, &cluster, &kubeconfig, &out, "Contour");
    refused(&named, &cluster, &kubeconfig, &out, "cannot express CORS");
    let run = run_in_cluster(&scenario, &cluster, &kubeconfig, &out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    assert!(
        text(&run).contains("left out: contour-gateway: ")
            && text(&run).contains("cannot express CORS"),
        "{}",
        tail(&run)
    );
    let without_cors = dir.join("controllers-contour-gateway");
    let run = run_in_cluster(&scenario, &cluster, &kubeconfig, &without_cors)
        .args(["--set", "targets=[{ cluster: contour-gateway }]"])
        .args(["--set", "events=[{ at: 1500ms, config: { response_header: { name: X-Churn, value: \"on\" } } }, { at: 4500ms, config: { response_header: { name: X-Churn, value: \"on\" }, rewrite: { from: /old, to: /new } } }, { at: 7500ms, config: revert }]"])
        .args(["--set", "load.duration=11s"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    // Over HTTPS, through every one, to the other host and path: an Ingress presents the
    // run's own certificate, a Gateway the one its owner gave the listener (whose CA the
    // cluster file gives).
    let over_tls = dir.join("controllers-tls");
    let targets = all.map(|t| format!("{{ cluster: {t} }}")).join(", ");
    let run = run_in_cluster(&scenario, &cluster, &kubeconfig, &over_tls)
        .args(["--set", &format!("targets=[{targets}]")])
        .args(["--set", "tls=true", "--set", "load.host=b.app.test", "--set", "load.path=/api/tls"])
        .args(["--set", "events=[{ at: 1500ms, config: { response_header: { name: X-Churn, value: \"on\" } } }, { at: 4500ms, config: revert }]"])
        .args(["--set", "load.duration=8s"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    let mut cells: Vec<std::path::PathBuf> = [&out, &without_cors, &over_tls]
        .iter()
        .flat_map(|o| std::fs::read_dir(o.join("cells")).unwrap().flatten())
        .map(|e| e.path())
        .collect();
    cells.sort();
    assert_eq!(cells.len(), 12, "{cells:?}");
    let run_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    for cell in run_json["cells"].as_array().unwrap() {
        // How the routes were made is recorded; an HTTPRoute's acceptance is timed.
        let routes = &cell["routes"];
        if routes["kind"] == "HTTPRoute" {
            assert!(
                routes["accepted_after_s"].as_f64().unwrap() > 0.0,
                "{routes}"
            );
            assert_eq!(
                routes["names"].as_array().unwrap().len(),
                2,
                "a route per host"
            );
        }
    }
    for cell in &cells {
        let impact: Vec<serde_json::Value> =
            serde_json::from_slice(&std::fs::read(cell.join("impact.json")).unwrap()).unwrap();
        let gateway = cell.to_string_lossy().contains("gateway");
        let samples = samples_of(cell);
        assert!(
            samples.iter().all(|s| s.status == 200),
            "{cell:?}: every answer a 200"
        );
        for (i, change) in impact.iter().enumerate() {
            let generation = i as u64 + 2;
            let at = |k: &str| change[k].as_f64().unwrap_or(f64::NAN);
            let (requested, took_effect) = (at("requested_s"), at("took_effect_s"));
            assert!(took_effect >= requested, "{cell:?}: {change}");
            // Through the Gateway API, the controller reported the route's generation.
            if gateway {
                assert!(at("reported_s") >= requested, "{cell:?}: {change}");
            }
            let mixed = change["generations"][0]["mixed_window_s"].as_f64().unwrap();
            let until = impact
                .get(i + 1)
                .map_or(f64::MAX, |n| n["requested_s"].as_f64().unwrap());
            for s in &samples {
                if s.done < requested {
                    assert!(s.generation < generation, "{cell:?}: {change}: {s:?}");
                } else if s.done > took_effect + mixed && s.done < until {
                    assert!(s.generation >= generation, "{cell:?}: {change}: {s:?}");
                }
            }
        }
    }
    // A route its Gateway does not accept (a listener for its own namespace only).
    let web = file
        .lines()
        .find(|l| l.starts_with("  traefik-gateway:"))
        .and_then(|l| l.rsplit_once("http://"))
        .map(|(_, a)| a.trim_end_matches(['"', ' ', '}']).to_owned())
        .unwrap();
    let port: u16 = web.rsplit_once(':').unwrap().1.parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(ingressbench_cluster::api::apply_all(
        &kubeconfig,
        &[serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": { "name": "same-namespace-only", "namespace": "kube-system" },
            "spec": { "gatewayClassName": "traefik", "listeners": [{ "name": "web", "port": port,
                "protocol": "HTTP", "allowedRoutes": { "namespaces": { "from": "Same" } } }] },
        })],
    ))
    .unwrap();
    let wrong = dir.join("wrong-parent.yaml");
    std::fs::write(
        &wrong,
        format!("targets:\n  wrong: {{ gateway: {{ name: same-namespace-only, namespace: kube-system }}, address: \"http://{web}\" }}\n"),
    )
    .unwrap();
    let plain = dir.join("plain.yaml");
    std::fs::write(&plain, "name: plain\ntargets: [traefik]\nbackends: [{ name: echo, replicas: 1 }]\ntls: false\nload: { mode: open, rate: 10, duration: 2s }\n").unwrap();
    refused(
        &plain,
        &wrong,
        &kubeconfig,
        &dir.join("wrong"),
        "Accepted=False (NotAllowedByListeners)",
    );
    wait_until("every namespace of the tool deleted or going", || {
        tools_namespaces(&kubeconfig).is_empty().then_some(())
    });
}

/// One sampled answer: when it completed (s from the load's start), its status and the
/// generation it carried.
#[derive(Debug)]
struct Answer {
    done: f64,
    status: u16,
    generation: u64,
    backend: String,
}

/// Every sample of a cell.
fn samples_of(cell: &Path) -> Vec<Answer> {
    use std::io::Read;
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(cell.join("samples.csv.gz")).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (intended, latency, status, generation, backend) = (
        col("intended_at_s"),
        col("latency_s"),
        col("status"),
        col("generation"),
        col("backend"),
    );
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Answer {
                done: f[intended].parse::<f64>().unwrap() + f[latency].parse::<f64>().unwrap(),
                status: f[status].parse().unwrap_or(0),
                generation: f[generation].parse().unwrap_or(0),
                backend: f[backend].to_owned(),
            }
        })
        .collect()
}

/// Objects of a kind with these labels, in every namespace: `(namespace, name)` (no
/// namespace for a kind that has none).
fn tools_objects<K>(kubeconfig: &Path, selector: &str) -> Vec<(String, String)>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    listed::<K>(kubeconfig, selector)
        .iter()
        .map(|o| {
            let m = o.meta();
            (
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// Every object of kind `K` in the cluster with the labels `selector` selects.
fn listed<K>(kubeconfig: &Path, selector: &str) -> Vec<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = ingressbench_cluster::api::client(kubeconfig, None)
            .await
            .unwrap();
        let api: kube::Api<K> = kube::Api::all(client);
        api.list(&kube::api::ListParams::default().labels(selector))
            .await
            .unwrap()
            .items
    })
}

/// `load.from: cluster`: three workers of an Indexed Job, placed away from the backends
/// (read back from the API), their logs followed through the API and merged exactly (the
/// merged figures equal those of the union of every request's sample); one worker pod
/// deleted mid-run is named and the others' data kept; no Job or pod left. A placement
/// nothing fits and one the local cluster cannot have are refused saying why.
/// `scenarios/capacity.yaml` in quick mode against Contour, sent from two of the
/// cluster's pods: every trial is a cell whose two workers' logs were merged and judged,
/// the search ends, this machine's generator ceiling is not claimed for the pods, and no
/// namespace is left.
fn a_capacity_search_runs_from_the_clusters_pods(dir: &Path) {
    let kubeconfig = dir.join("cluster/kubeconfig");
    let cluster = dir.join("cluster.yaml");
    let capacity = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/capacity.yaml");
    let out = dir.join("capacity-from-cluster");
    let run = run_in_cluster(&capacity, &cluster, &kubeconfig, &out)
        .args([
            "--quick",
            "--set",
            "load.from=cluster",
            "--set",
            "load.workers=2",
        ])
        .args(["--set", "targets=[{cluster: contour}]"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    assert!(
        text(&run).contains("the generator's ceiling is not measured here"),
        "{}",
        tail(&run)
    );
    let record = json_of(&out, "run.json");
    let search = &record["searches"][0];
    assert_eq!(search["status"], "done", "{}", tail(&run));
    assert!(search["generator_ceiling"].is_null(), "{search}");
    let trials = search["trials"].as_array().unwrap();
    assert!(!trials.is_empty());
    for t in trials {
        let entry = &record["cells"][t.as_u64().unwrap() as usize];
        assert!(entry["search"]["verdict"]["kind"].is_string(), "{entry}");
        let cell = out.join("cells").join(entry["dir"].as_str().unwrap());
        let workers = json_of(&cell, "workers.json");
        assert_eq!(workers["workers"].as_array().unwrap().len(), 2, "{workers}");
    }
    wait_until("every namespace of the tool deleted or going", || {
        tools_namespaces(&kubeconfig).is_empty().then_some(())
    });
}

fn load_from_the_clusters_pods_is_placed_merged_and_leaves_nothing(dir: &Path) {
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::Pod;
    let kubeconfig = dir.join("cluster/kubeconfig");
    let cluster = dir.join("cluster.yaml");
    let scenario = dir.join("from-cluster.yaml");
    let write = |load: &str| {
        std::fs::write(
            &scenario,
            format!("name: from-cluster\ntargets: [{{ cluster: traefik }}]\nbackends: [{{ name: echo, replicas: 1 }}]\ntls: false\nload: {{ mode: open, rate: 300, connections: 12, duration: 10s, sample_rate: 1, from: cluster, workers: 3, {load} }}\n"),
        )
        .unwrap();
    };
    let out = dir.join("results-from-cluster");
    let load_pods = "app.kubernetes.io/component=load";
    // One backend on one of the two nodes; the workers on the other.
    write("placement: { node: other_than_backends }");
    let run = run_in_cluster(&scenario, &cluster, &kubeconfig, &out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once the three run, worker 1's pod is deleted at once (grace 0), about 4 s into the
    // load (which starts 5 s after the Job is made).
    let victim = wait_until("three load pods running", || {
        let pods = tools_objects::<Pod>(&kubeconfig, load_pods);
        (pods.len() == 3).then(|| pods.into_iter().find(|(_, n)| n.contains("-load-1-")))?
    });
    std::thread::sleep(std::time::Duration::from_secs(8));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let client = ingressbench_cluster::api::client(&kubeconfig, None)
                .await
                .unwrap();
            let pods: kube::Api<Pod> = kube::Api::namespaced(client, &victim.0);
            let now = kube::api::DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            };
            pods.delete(&victim.1, &now).await.unwrap();
        });
    let run = run.wait_with_output().unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    let cell = cells_of(&out)[0].clone();
    let workers = json_of(&cell, "workers.json");
    let summary = json_of(&cell, "summary.json");
    // Placed where it says, as the API reported when they started.
    let backend_nodes: Vec<&str> = workers["cluster"]["backend_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(backend_nodes.len(), 1, "{workers}");
    let placed = workers["cluster"]["worker_nodes"].as_array().unwrap();
    assert_eq!(placed.len(), 3, "{workers}");
    for w in placed {
        let node = w["node"].as_str().unwrap();
        assert!(node.starts_with("ib-node-"), "{w}");
        assert!(!backend_nodes.contains(&node), "{w} beside a backend");
    }
    // Each worker named by its pod; worker 1 stopped early and says so, the others whole.
    let each = workers["workers"].as_array().unwrap();
    assert_eq!(each.len(), 3);
    for (k, w) in each.iter().enumerate() {
        let pod = w["host"].as_str().unwrap();
        assert!(pod.starts_with(&format!("ingressbench-load-{k}-")), "{w}");
        assert!(
            w["place"].as_str().unwrap().contains(" on node ib-node-"),
            "{w}"
        );
        if k != 1 {
            assert_eq!(w["exit"], "exit 0", "{w}");
            assert_eq!(w["complete"], true, "{w}");
            assert_eq!(
                w["summary"]["requests"]["total"], 1000,
                "its whole third: {w}"
            );
        }
    }
    assert_eq!(each[1]["host"], victim.1.as_str());
    let killed = each[1]["summary"]["requests"]["total"].as_u64().unwrap();
    assert!((100..900).contains(&killed), "worker 1 sent {killed}");
    let warnings = summary["warnings"].to_string();
    assert!(
        warnings.contains(&format!("worker 1 ({}) stopped sending", victim.1)),
        "{warnings}"
    );
    // Merged exactly: the figures of every request's sample.
    let (rows, union) = crate::common::from_samples(&cell.join("samples.csv.gz"));
    let total = summary["requests"]["total"].as_u64().unwrap();
    assert_eq!(rows, total);
    assert_eq!(total, 2000 + killed);
    let lat = &summary["latency_us"];
    for (name, p) in [("p50", 50.0), ("p99", 99.0)] {
        let merged = lat[name].as_u64().unwrap();
        eprintln!(
            "{name}: merged {merged} us, union {} us",
            union.value_at_percentile(p)
        );
        assert!(
            crate::common::close(merged, union.value_at_percentile(p)),
            "{name}"
        );
    }
    assert!(crate::common::close(
        lat["max"].as_u64().unwrap(),
        union.max()
    ));
    // The report says where each worker ran and where the backends were.
    let report = Command::new(BIN)
        .args(["report", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(report.status.success(), "{}", tail(&report));
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        html.contains("Sent from the pods of Job ingressbench-load; the backends were on"),
        "no placement line in the workers section"
    );
    assert!(html.contains(&format!("pod {} on node ib-node-", victim.1)));
    // Nothing left: no Job, no load pod.
    assert_eq!(
        tools_objects::<Job>(&kubeconfig, "app.kubernetes.io/managed-by=ingressbench"),
        []
    );
    assert_eq!(tools_objects::<Pod>(&kubeconfig, load_pods), []);
    // A placement no node fits: the scheduler's words, and nothing left.
    write("placement: { node_selector: { disktype: ssd } }");
    let run = run_in_cluster(&scenario, &cluster, &kubeconfig, &out)
        .output()
        .unwrap();
    assert!(!run.status.success(), "{}", tail(&run));
    assert!(text(&run).contains("cannot be placed"), "{}", tail(&run));
    assert!(
        text(&run).contains("node affinity/selector"),
        "{}",
        tail(&run)
    );
    wait_until("the failed cell's namespace deleted or going", || {
        tools_namespaces(&kubeconfig).is_empty().then_some(())
    });
    assert_eq!(
        tools_objects::<Job>(&kubeconfig, "app.kubernetes.io/managed-by=ingressbench"),
        []
    );
    // Traefik runs outside the cluster's pods here: no node to be beside, found before
    // anything is made.
    write("placement: { node: same_as_ingress }");
    let cluster_with_service = dir.join("cluster-service.yaml");
    std::fs::write(
        &cluster_with_service,
        "targets: { traefik: { ingress_class: traefik, service: { name: traefik, namespace: kube-system } } }\nworkers: { host_network: true }\n",
    )
    .unwrap();
    let run = run_in_cluster(&scenario, &cluster_with_service, &kubeconfig, &out)
        .output()
        .unwrap();
    assert!(!run.status.success(), "{}", tail(&run));
    assert!(
        text(&run).contains("Service kube-system/traefik selects no pods"),
        "{}",
        tail(&run)
    );
    assert!(tools_namespaces(&kubeconfig).is_empty());
}

/// Route scale in the cluster: 500 Ingresses (Traefik) and 500 HTTPRoutes (Traefik's
/// Gateway), an object per route made through the API and each probed until it answers;
/// then 20 more, 10 changed (a response header each: a Middleware per revision for the
/// Ingresses, the route's own filter for the HTTPRoutes), 20 removed, each route timed by
/// the probe; the controller's memory read from /proc. A change an Ingress controller
/// cannot express is refused before anything is made, naming it; an object the API
/// refuses (a tenant's admission policy) fails its cell with the API's reason, and the
/// cell's namespace goes.
fn generated_routes_are_an_object_each_and_a_refused_one_fails_its_cell(dir: &Path) {
    let kubeconfig = dir.join("cluster/kubeconfig");
    let cluster = dir.join("cluster.yaml");
    let scenario = dir.join("route-scale.yaml");
    // The probe at 500 a second, not 2,000: the tests beside this one time what the
    // machine gives them.
    let write = |targets: &str, events: &str| {
        std::fs::write(
            &scenario,
            format!("name: route-scale\ntargets: {targets}\nbackends: [{{ name: echo, replicas: 2 }}]\nroutes: {{ count: 500, routes: [{{ host: app.test, pool: echo }}], probe: {{ rate: 500 }} }}\ntls: false\nload: {{ mode: open, rate: 50, connections: 4, duration: 16s, host: app.test }}\nevents: {events}\n"),
        )
        .unwrap();
    };
    write(
        "[{ cluster: traefik }, { cluster: traefik-gateway }]",
        "[{ at: 1s, add_routes: 20 }, { at: 5s, change_routes: 10 }, { at: 9s, remove_routes: 20 }]",
    );
    let out = dir.join("route-scale");
    let run = run_in_cluster(&scenario, &cluster, &kubeconfig, &out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    let record = json_of(&out, "run.json");
    let cells = cells_of(&out);
    let records = record["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2, "{record}");
    for ((cell, c), kind) in cells.iter().zip(records).zip(["Ingress", "HTTPRoute"]) {
        assert_eq!(c["routes"]["kind"], kind, "{c}");
        assert_eq!(c["routes"]["generated"]["count"], 500, "{c}");
        let firings = json_of(cell, "routes.json")["firings"].clone();
        let shape: Vec<(String, u64, u64)> = firings
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["what"].as_str().unwrap().to_owned(),
                    f["asked"].as_u64().unwrap(),
                    f["right"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            [
                ("add 20 routes".to_owned(), 20, 20),
                ("change 10 routes".to_owned(), 10, 10),
                ("remove 20 routes".to_owned(), 20, 20)
            ],
            "{}: {firings}",
            cell.display()
        );
        // Each change was applied once the API had every object, and took effect when
        // the probe found its last route right.
        for e in json_of(cell, "impact.json").as_array().unwrap() {
            let (asked, applied, took) = (
                e["requested_s"].as_f64().unwrap(),
                e["applied_s"].as_f64().unwrap(),
                e["took_effect_s"].as_f64().unwrap(),
            );
            assert!(asked <= applied && asked <= took, "{e}");
            assert_eq!(
                e["took_effect_basis"],
                "the route probe: the last of its routes to answer right"
            );
        }
        // Traefik is its own proxy: its process group's memory at each step.
        assert!(
            firings[0]["proxy_rss_bytes"]["after"]
                .as_u64()
                .is_some_and(|b| b > 10 << 20),
            "{firings}"
        );
    }
    wait_until("every namespace of the tool deleted or going", || {
        tools_namespaces(&kubeconfig).is_empty().then_some(())
    });
    // Contour cannot set a header on one Ingress alone: refused before anything is made.
    write("[{ cluster: contour }]", "[{ at: 1s, change_routes: 10 }]");
    refused(
        &scenario,
        &cluster,
        &kubeconfig,
        &dir.join("route-scale-refused"),
        "Contour sets response headers through HTTPProxies",
    );
    // A tenant's admission policy refuses the 511th route: the cell fails with the API's
    // reason, and nothing of it is left.
    let policy = serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": { "name": "ib-test-route-quota" },
        "spec": { "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": [{ "apiGroups": ["networking.k8s.io"], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["ingresses"] }] },
            "validations": [{ "expression": "object.metadata.name != 'route-510'",
                "message": "route quota: one route too many for this tenant" }] },
    });
    let binding = serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": { "name": "ib-test-route-quota" },
        "spec": { "policyName": "ib-test-route-quota", "validationActions": ["Deny"] },
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(ingressbench_cluster::api::apply_all(
        &kubeconfig,
        &[policy, binding],
    ))
    .unwrap();
    // The API server takes a policy in within a second or so.
    std::thread::sleep(std::time::Duration::from_secs(3));
    write("[{ cluster: traefik }]", "[{ at: 1s, add_routes: 20 }]");
    let out = dir.join("route-scale-quota");
    let run = run_in_cluster(&scenario, &cluster, &kubeconfig, &out)
        .output()
        .unwrap();
    rt.block_on(async {
        let client = ingressbench_cluster::api::client(&kubeconfig, None)
            .await
            .unwrap();
        for kind in [
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
        ] {
            ingressbench_cluster::api::delete(
                &client,
                "admissionregistration.k8s.io/v1",
                kind,
                None,
                "ib-test-route-quota",
            )
            .await
            .unwrap();
        }
    });
    assert!(!run.status.success(), "{}", tail(&run));
    assert!(
        text(&run).contains("applying Ingress route-510")
            && text(&run).contains("route quota: one route too many for this tenant"),
        "{}",
        tail(&run)
    );
    wait_until("every namespace of the tool deleted or going", || {
        tools_namespaces(&kubeconfig).is_empty().then_some(())
    });
}

/// A scenario's `restart` in cluster mode. In the local cluster each controller's process
/// is stopped and started again by the cluster's serving process (what a rollout restart
/// of its Deployment is on a real cluster), under event streams through it: the times
/// (requested, the new process ready), the old and new process in the record and in the
/// cluster file, and what the streams saw (measured: printed; a controller that is its
/// own proxy cuts every stream). On a real cluster's terms: a rollout restart of a
/// Deployment (a stand-in of the backend's, two replicas), followed to its first new pod
/// ready and to every pod replaced. A target whose file says not how to restart or upgrade
/// it, an upgrade to no one version, and one to a version whose chart is not there, are
/// refused before anything is made.
fn a_controller_restarts_by_its_process_or_by_a_rollout_under_load(dir: &Path) {
    use kube::api::DeleteParams;
    let kubeconfig = dir.join("cluster/kubeconfig");
    let cluster = dir.join("cluster.yaml");
    let pid_of = |target: &str| -> u32 {
        let file = ingressbench_cluster::file::ClusterFile::read(&cluster).unwrap();
        file.targets[target].local_pids.unwrap().controller
    };
    let before: Vec<u32> = ["traefik", "contour", "haproxy-ingress"]
        .iter()
        .map(|t| pid_of(t))
        .collect();
    let scenario = dir.join("restart.yaml");
    std::fs::write(
        &scenario,
        "name: restart\ntargets: [{ cluster: traefik }, { cluster: contour }, { cluster: haproxy-ingress }]\nbackends: [{ name: echo, replicas: 2 }]\ntls: false\nload: { kind: sse, stream: { reconnect: \"backoff:100ms-1s\" }, rate: 100, connections: 10, duration: 7s, warmup: 1s, timeout: 2s }\nevents:\n  - { at: 2s, restart: true, grace: 1s }\n",
    )
    .unwrap();
    let out = dir.join("restart-results");
    let run = run_in_cluster(&scenario, &cluster, &kubeconfig, &out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    let mut measured = Vec::new();
    for (cell, (target, old)) in cells_of(&out).into_iter().zip(
        ["traefik", "contour", "haproxy-ingress"]
            .into_iter()
            .zip(before),
    ) {
        let impact = json_of(&cell, "impact.json");
        let restart = &impact[0];
        let what = restart["what"].as_str().unwrap();
        let new = pid_of(target);
        assert_ne!(new, old, "{target}: {what}");
        assert!(processes_with(&format!("{}", dir.display())).contains(&new));
        assert!(
            what.starts_with(&format!(
                "restart: {target} process {old} -> {new} (old stopped after "
            )),
            "{what}"
        );
        let (requested, applied) = (
            restart["requested_s"].as_f64().unwrap(),
            restart["applied_s"].as_f64().unwrap(),
        );
        assert!(applied > requested, "{restart}");
        assert_eq!(restart["completed_s"], restart["applied_s"], "{restart}");
        let streams = &restart["websocket"];
        let sse = json_of(&cell, "sse.json");
        if target == "traefik" {
            // Its own proxy: a new process cannot hold the old one's connections.
            assert_eq!(streams["cut"], 10, "{target}: {streams}");
        }
        assert_eq!(sse["duplicated"], 0, "{target}: {sse}");
        measured.push(format!(
            "{target}: new process ready after {:.0} ms; streams cut {} ({}), reconnect p99 {} us, errors {}",
            (applied - requested) * 1e3,
            streams["cut"],
            streams["by_code"],
            sse["reconnect"]["p99_us"],
            restart["errors"]
        ));
    }
    assert_eq!(measured.len(), 3);
    eprintln!("{}", measured.join("\n"));
    // A controller that crashes is started again by the serving process, as a kubelet
    // starts a crashed container again; the control plane stays up.
    let crashed = pid_of("traefik");
    let killed = Command::new("kill")
        .args(["-KILL", "--", &format!("-{crashed}")])
        .output()
        .unwrap();
    assert!(killed.status.success(), "{}", tail(&killed));
    let again = wait_until("traefik started again", || {
        Some(pid_of("traefik")).filter(|p| *p != crashed)
    });
    let serving = std::fs::read_to_string(dir.join("serve.log")).unwrap();
    assert!(
        serving.contains(&format!(
            "traefik exited (signal: 9 (SIGKILL)); started again as process {again} (its 1st exit"
        )),
        "{serving}"
    );
    assert!(!dir.join("stopped").exists());
    wait_until("traefik answers again", || {
        Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-m", "2"])
            .arg(format!("http://{}/", traefik_http(dir)))
            .status()
            .ok()
            .filter(|s| s.success())
    });
    // A rollout restart: a Deployment standing in for a controller's.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let deployments = stand_in(&runtime, &kubeconfig, "restart-stand-in", 2, &[]);
    let stand_in_pods = || {
        let api: kube::Api<k8s_openapi::api::core::v1::Pod> = runtime.block_on(async {
            kube::Api::namespaced(
                ingressbench_cluster::api::client(&kubeconfig, None)
                    .await
                    .unwrap(),
                "default",
            )
        });
        let list = runtime
            .block_on(api.list(&kube::api::ListParams::default().labels("app=restart-stand-in")))
            .unwrap();
        let mut ready: Vec<String> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .filter_map(|p| p.metadata.name)
            .collect();
        ready.sort();
        ready
    };
    let first = wait_until("two stand-in pods ready", || {
        Some(stand_in_pods()).filter(|p| p.len() == 2)
    });
    let rolled = dir.join("cluster-rollout.yaml");
    let text = std::fs::read_to_string(&cluster).unwrap();
    let local = format!(
        "restart: {{ local: \"{}\", process: traefik }}",
        dir.join("cluster").display()
    );
    assert!(text.contains(&local), "{text}");
    std::fs::write(
        &rolled,
        text.replace(
            &local,
            "restart: { deployment: restart-stand-in, namespace: default }",
        ),
    )
    .unwrap();
    let scenario = dir.join("rollout.yaml");
    std::fs::write(
        &scenario,
        "name: rollout\ntargets: [{ cluster: traefik }]\nbackends: [{ name: echo, replicas: 1 }]\ntls: false\nload: { mode: open, rate: 50, connections: 4, duration: 10s, warmup: 1s }\nevents:\n  - { at: 1s, restart: true }\n  - { at: 5s, upgrade: same }\n",
    )
    .unwrap();
    let out = dir.join("rollout-results");
    let run = run_in_cluster(&scenario, &rolled, &kubeconfig, &out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", tail(&run));
    let impact = json_of(&cells_of(&out)[0], "impact.json");
    let rollout = &impact[0];
    assert_eq!(
        rollout["what"], "restart: rollout of Deployment default/restart-stand-in (2 pods)",
        "{rollout}"
    );
    // An upgrade to the version it runs is a roll of its pods: the same restart.
    assert_eq!(
        impact[1]["what"],
        "upgrade to the version it runs, a restart: rollout of Deployment default/restart-stand-in (2 pods)",
        "{impact}"
    );
    for event in impact.as_array().unwrap() {
        let at = |k: &str| event[k].as_f64().unwrap_or_else(|| panic!("{k}: {event}"));
        assert!(
            at("requested_s") < at("applied_s") && at("applied_s") <= at("completed_s"),
            "{event}"
        );
    }
    let at = |k: &str| rollout[k].as_f64().unwrap();
    eprintln!(
        "rollout restart of 2 pods: first new pod ready after {:.0} ms, complete after {:.0} ms",
        (at("applied_s") - at("requested_s")) * 1e3,
        (at("completed_s") - at("requested_s")) * 1e3
    );
    let now = stand_in_pods();
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(
        now.iter().all(|p| !first.contains(p)),
        "{first:?} -> {now:?}"
    );
    let template = runtime
        .block_on(deployments.get("restart-stand-in"))
        .unwrap();
    let annotations = template
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .annotations
        .unwrap();
    assert!(
        annotations.contains_key("kubectl.kubernetes.io/restartedAt"),
        "{annotations:?}"
    );
    // Refused before anything is made: a target whose file says not how to restart it,
    // and an upgrade.
    let unsaid = dir.join("cluster-no-restart.yaml");
    std::fs::write(&unsaid, text.replace(&format!(", {local}"), "")).unwrap();
    refused(
        &scenario,
        &unsaid,
        &kubeconfig,
        &dir.join("r7"),
        "the cluster file does not say how; add `restart: { deployment: NAME, namespace: NS }`",
    );
    let upgrade = dir.join("upgrade.yaml");
    std::fs::write(
        &upgrade,
        std::fs::read_to_string(&scenario)
            .unwrap()
            .replace("restart: true", "upgrade: same"),
    )
    .unwrap();
    refused(
        &upgrade,
        &unsaid,
        &kubeconfig,
        &dir.join("r8"),
        "an upgrade of target `traefik`'s controller to the version it runs (`same`, or versions of lab proxies only) is a restart of it, and the cluster file does not say how to restart it",
    );
    // Said how, an upgrade to a version needs a chart of it there.
    let upgradable = dir.join("cluster-upgrade.yaml");
    std::fs::write(
        &upgradable,
        std::fs::read_to_string(&rolled).unwrap().replace(
            "restart: { deployment: restart-stand-in, namespace: default }",
            "restart: { deployment: restart-stand-in, namespace: default }, upgrade: { helm: { release: r, namespace: default, chart: \"/nonexistent/v{version}/chart\" }, follow: [{ deployment: restart-stand-in, namespace: default }] }",
        ),
    )
    .unwrap();
    std::fs::write(
        &upgrade,
        std::fs::read_to_string(&scenario)
            .unwrap()
            .replace("restart: true", "upgrade: 9.9.9"),
    )
    .unwrap();
    refused(
        &upgrade,
        &rolled,
        &kubeconfig,
        &dir.join("r9"),
        "an upgrade of target `traefik`'s controller: the cluster file does not say how; add `upgrade:",
    );
    refused(
        &upgrade,
        &upgradable,
        &kubeconfig,
        &dir.join("r10"),
        "no chart of version 9.9.9 for target `traefik` at /nonexistent/v9.9.9/chart",
    );
    runtime
        .block_on(deployments.delete("restart-stand-in", &DeleteParams::default()))
        .unwrap();
    wait_until("the stand-in gone", || {
        processes_with("restart-stand-in").is_empty().then_some(())
    });
    wait_until("every namespace of the tool deleted or going", || {
        tools_namespaces(&kubeconfig).is_empty().then_some(())
    });
}

/// A Deployment of one real Envoy (the `envoy` image runs the project's) that serves
/// `/stats/prometheus` on port 8002 as Contour's Envoy does: a listener passing that one
/// path to its admin interface, which listens on the pod's own loopback only.
fn envoy_stand_in(
    runtime: &tokio::runtime::Runtime,
    kubeconfig: &Path,
    name: &str,
) -> kube::Api<k8s_openapi::api::apps::v1::Deployment> {
    let endpoint = |port: u16| {
        format!("{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }} }}")
    };
    let cluster = |name: &str, ports: &[u16]| {
        let endpoints: Vec<String> = ports.iter().map(|p| endpoint(*p)).collect();
        format!(
            "{{ name: {name}, type: STATIC, load_assignment: {{ cluster_name: {name}, endpoints: [ {{ lb_endpoints: [ {} ] }} ] }} }}",
            endpoints.join(", ")
        )
    };
    let config = format!(
        "{{ admin: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: 9901 }} }} }}, static_resources: {{ listeners: [ {{ name: stats, address: {{ socket_address: {{ address: 0.0.0.0, port_value: 8002 }} }}, filter_chains: [ {{ filters: [ {{ name: envoy.filters.network.http_connection_manager, typed_config: {{ \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager, stat_prefix: stats, route_config: {{ virtual_hosts: [ {{ name: stats, domains: [\"*\"], routes: [ {{ match: {{ path: /stats/prometheus }}, route: {{ cluster: admin }} }} ] }} ] }}, http_filters: [ {{ name: envoy.filters.http.router, typed_config: {{ \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }} }} ] }} }} ] }} ] }} ], clusters: [ {}, {} ] }} }}",
        cluster("admin", &[9901]),
        cluster("pool", &[1, 2])
    );
    let container = serde_json::json!({
        "name": "stats", "image": "docker.io/envoyproxy/envoy:v1.40.0",
        "args": ["--disable-hot-restart", "--config-yaml", config, "--service-node", name],
        "readinessProbe": { "httpGet": { "path": "/stats/prometheus", "port": 8002 } }
    });
    deployment_of(runtime, kubeconfig, name, 1, container)
}

/// A Deployment `name` of `replicas` pods in `default` standing in for a controller's: the
/// backend's image, answering on 8080 (ready when `/healthz` is), `extra` arguments
/// beside. Returns the namespace's Deployments.
fn stand_in(
    runtime: &tokio::runtime::Runtime,
    kubeconfig: &Path,
    name: &str,
    replicas: u32,
    extra: &[&str],
) -> kube::Api<k8s_openapi::api::apps::v1::Deployment> {
    let mut args = vec!["backend", "--listen", "0.0.0.0:8080"];
    args.extend_from_slice(extra);
    args.extend(["--name", name]);
    let container = serde_json::json!({
        "name": "controller", "image": "example.test/ingressbench:dev",
        "args": args,
        "readinessProbe": { "httpGet": { "path": "/healthz", "port": 8080 } }
    });
    deployment_of(runtime, kubeconfig, name, replicas, container)
}

/// Creates Deployment `name` in `default`: `replicas` pods labelled `app: name`, each of
/// the one `container`; its API.
fn deployment_of(
    runtime: &tokio::runtime::Runtime,
    kubeconfig: &Path,
    name: &str,
    replicas: u32,
    container: serde_json::Value,
) -> kube::Api<k8s_openapi::api::apps::v1::Deployment> {
    use k8s_openapi::api::apps::v1::Deployment;
    let deployments: kube::Api<Deployment> = runtime.block_on(async {
        let client = ingressbench_cluster::api::client(kubeconfig, None)
            .await
            .unwrap();
        kube::Api::namespaced(client, "default")
    });
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "terminationGracePeriodSeconds": 2, "containers": [container] }
            }
        }
    }))
    .unwrap();
    runtime
        .block_on(deployments.create(&kube::api::PostParams::default(), &deployment))
        .unwrap();
    deployments
}
