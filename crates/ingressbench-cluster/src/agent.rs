//! The node agent: what stands in for the kubelet on the local cluster, where there is no
//! container runtime. It registers its nodes and renews their leases, and runs every pod
//! the scheduler binds to one of them as a local process in a network namespace of its
//! own (an address from 198.18.0.0/15: the API refuses loopback addresses in
//! EndpointSlices). It reports the pod Running, then Ready once its readiness probe
//! passes; on deletion it sends SIGTERM, waits the grace period, sends SIGKILL, and removes
//! the pod. An image is run from its unpacked root filesystem (chrooted, as the pod's or
//! the image's user: [`crate::image`]), or, where no image was built, as a local binary
//! (`ingressbench` is this tool). Every start is recorded in [`RAN`] in its directory.
//!
//! It polls the API every [`POLL`] rather than watching: one list of a few dozen pods is
//! cheap on a local API server, and the code stays a loop a reader can follow. Its
//! reaction time (up to one poll) is part of what the local cluster measures as the
//! control plane's time, and is said so in docs/CLUSTER.md.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_lab::process::OwnedChild;
use ingressbench_lab::topology::{Isolation, Nodes};
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::ClusterError;

/// How often the agent looks at the pods.
pub const POLL: Duration = Duration::from_millis(100);
/// How often a node's lease is renewed (the kubelet's default).
const LEASE_RENEW: Duration = Duration::from_secs(10);
/// The prefix of the nodes' names.
pub const NODE_PREFIX: &str = "ib-node-";
/// The image that runs this tool.
pub const IMAGE: &str = "ingressbench";

/// What the agent needs.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// The administrator's kubeconfig.
    pub kubeconfig: PathBuf,
    /// How many nodes it registers (`ib-node-1` …).
    pub nodes: usize,
    /// Where pods' logs go.
    pub dir: PathBuf,
    /// Images it can run, by name (without tag or registry), and what runs for each.
    pub images: BTreeMap<String, Runs>,
}

/// What the agent runs for an image.
#[derive(Clone, Debug)]
pub enum Runs {
    /// The image itself, unpacked.
    Image(Box<crate::image::Image>),
    /// A local binary with the container's arguments (where no image was built).
    Binary(PathBuf),
}

/// The file in the agent's directory with a line per container started: the pod, the
/// image, whether it ran from the image's root filesystem, its digest, user and command.
pub const RAN: &str = "ran.jsonl";

/// The running agent; stopping it (or dropping it) kills its pods.
#[derive(Debug)]
pub struct Agent {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<(), ClusterError>>>,
}

impl Agent {
    /// Registers the nodes, then serves pods on a thread of its own (the parent-death
    /// signal of each pod's process is tied to that thread) until stopped.
    pub fn start(options: AgentOptions) -> Result<Agent, ClusterError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("ib-node-agent".into())
            .spawn(move || {
                let runtime = crate::local::runtime()?;
                runtime.block_on(async move {
                    let mut state = match State::new(options).await {
                        Ok(s) => {
                            let _ = ready_tx.send(Ok(()));
                            s
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return Err(e);
                        }
                    };
                    let result = state.serve(&flag).await;
                    state.stop_all().await;
                    result
                })
            })
            .map_err(|e| ClusterError::Api(format!("cannot start the node agent: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Agent {
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(ClusterError::Api(format!("node agent: {e}")))
            }
            Err(_) => Err(ClusterError::Api("the node agent stopped at once".into())),
        }
    }

    /// Whether it stopped by itself (an error it could not go on after).
    pub fn failed(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| t.is_finished())
    }

    /// Kills its pods and waits for it; its error, if it stopped on one.
    pub fn stop(mut self) -> Result<(), ClusterError> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<(), ClusterError> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(ClusterError::Api("the node agent panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

/// One pod the agent runs.
struct Running {
    namespace: String,
    name: String,
    uid: String,
    /// The container's name and image, as reported in its status.
    container: String,
    image: String,
    ip: IpAddr,
    /// `None`: it could not be started (an image the agent does not know).
    child: Option<OwnedChild>,
    probe: Option<SocketAddr>,
    probe_path: String,
    ready: bool,
    /// Set once its deletion began: when to stop waiting for it to exit.
    deadline: Option<Instant>,
    /// Whether it runs to completion (restart policy `Never` or `OnFailure`, a Job's
    /// pods): its exit is reported as the pod's end, `Succeeded` or `Failed`.
    runs_to_completion: bool,
    /// Whether its process has ended (and, if it runs to completion, that was
    /// reported).
    ended: bool,
}

struct State {
    options: AgentOptions,
    client: Client,
    nodes: Nodes,
    pods: Vec<Running>,
    renewed: Instant,
    /// The pods whose process runs, for the log endpoint.
    live: crate::logs::Live,
    logs: crate::logs::LogServer,
}

impl State {
    async fn new(options: AgentOptions) -> Result<Self, ClusterError> {
        let client = crate::api::client(&options.kubeconfig, None).await?;
        let nodes = Nodes::new(Isolation::Netns)?;
        let live = crate::logs::Live::default();
        let logs = crate::logs::LogServer::start(options.dir.clone(), live.clone())?;
        let mut state = State {
            options,
            client,
            nodes,
            pods: Vec::new(),
            renewed: Instant::now(),
            live,
            logs,
        };
        state.register().await?;
        Ok(state)
    }

    fn node_names(&self) -> Vec<String> {
        (1..=self.options.nodes)
            .map(|i| format!("{NODE_PREFIX}{i}"))
            .collect()
    }

    /// Creates the nodes (Ready, with room for 110 pods each) and their leases.
    async fn register(&mut self) -> Result<(), ClusterError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        for name in self.node_names() {
            let node: Node = serde_json::from_value(json!({
                "metadata": { "name": name, "labels": {
                    "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                    "app.kubernetes.io/managed-by": "ingressbench" } },
            }))
            .map_err(api)?;
            match nodes.create(&PostParams::default(), &node).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(api(e)),
            }
            self.report_node(&name).await?;
        }
        self.renew_leases().await
    }

    async fn report_node(&self, name: &str) -> Result<(), ClusterError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let now = now();
        let room = json!({ "cpu": "2", "memory": "8Gi", "pods": "110" });
        let status = json!({ "status": {
            "capacity": room, "allocatable": room,
            "addresses": [{ "type": "InternalIP", "address": "127.0.0.1" },
                          { "type": "Hostname", "address": name }],
            // Where the API server asks for pods' logs (`kubectl logs`).
            "daemonEndpoints": { "kubeletEndpoint": { "Port": self.logs.port() } },
            "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "ingressbench node agent", "lastHeartbeatTime": now,
                "lastTransitionTime": now }],
            "nodeInfo": { "kubeletVersion": format!("v{}", crate::local::KUBE_VERSION),
                "containerRuntimeVersion": "ingressbench://local-processes",
                "architecture": "amd64", "operatingSystem": "linux", "osImage": "local",
                "kernelVersion": "", "kubeProxyVersion": "", "machineID": "", "systemUUID": "",
                "bootID": "" },
        }});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(api)?;
        Ok(())
    }

    async fn renew_leases(&mut self) -> Result<(), ClusterError> {
        use k8s_openapi::api::coordination::v1::Lease;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        for name in self.node_names() {
            let lease = json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": { "name": name },
                "spec": { "holderIdentity": name, "leaseDurationSeconds": 40,
                          "renewTime": now_micro() },
            });
            let patch = PatchParams::apply("ingressbench-node-agent").force();
            leases
                .patch(&name, &patch, &Patch::Apply(&lease))
                .await
                .map_err(api)?;
        }
        self.renewed = Instant::now();
        Ok(())
    }

    async fn serve(&mut self, stop: &AtomicBool) -> Result<(), ClusterError> {
        while !stop.load(Ordering::Relaxed) {
            if self.renewed.elapsed() >= LEASE_RENEW {
                self.renew_leases().await?;
                for name in self.node_names() {
                    self.report_node(&name).await?;
                }
            }
            self.step().await?;
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    /// One look at the pods: start the new ones bound here, report the ready ones, stop
    /// the deleted ones.
    async fn step(&mut self) -> Result<(), ClusterError> {
        let all: Api<Pod> = Api::all(self.client.clone());
        let listed = all.list(&ListParams::default()).await.map_err(api)?;
        let ours: Vec<&Pod> = listed
            .items
            .iter()
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .is_some_and(|n| n.starts_with(NODE_PREFIX))
            })
            .collect();
        for pod in &ours {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let known = self.pods.iter().position(|r| r.uid == uid);
            match (known, pod.metadata.deletion_timestamp.is_some()) {
                (None, false) => self.start(pod).await?,
                (None, true) => self.remove(pod_ns(pod), pod_name(pod)).await,
                (Some(i), true) if self.pods[i].deadline.is_none() => {
                    let grace = pod
                        .metadata
                        .deletion_grace_period_seconds
                        .unwrap_or(30)
                        .max(0) as u64;
                    let running = &mut self.pods[i];
                    running.deadline = Some(Instant::now() + Duration::from_secs(grace));
                    if let Some(child) = &running.child {
                        let _ = child.signal(rustix::process::Signal::TERM);
                    }
                }
                _ => {}
            }
        }
        // Pods gone from the API (deleted with no grace by someone else) stop here too.
        let listed_uids: Vec<String> = ours.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        let mut i = 0;
        while i < self.pods.len() {
            let r = &mut self.pods[i];
            let gone = !listed_uids.contains(&r.uid);
            let exited = r.child.as_mut().is_none_or(|c| c.try_wait().is_some());
            let overdue = r.deadline.is_some_and(|d| Instant::now() >= d);
            if gone || (r.deadline.is_some() && (exited || overdue)) {
                let mut r = self.pods.remove(i);
                if let Some(mut child) = r.child.take() {
                    child.terminate(Duration::ZERO);
                }
                self.log_complete(&r.namespace, &r.name);
                self.nodes.release(&r.uid);
                if !gone {
                    self.remove(&r.namespace, &r.name).await;
                }
                continue;
            }
            i += 1;
        }
        // Pods whose process has ended: their log is complete, and those that run to
        // completion are reported ended (those of other restart policies stay as they
        // are: the agent restarts nothing).
        for i in 0..self.pods.len() {
            let r = &mut self.pods[i];
            if r.ended {
                continue;
            }
            let Some(status) = r.child.as_mut().and_then(|c| c.try_wait()) else {
                continue;
            };
            r.ended = true;
            let (namespace, name) = (r.namespace.clone(), r.name.clone());
            self.log_complete(&namespace, &name);
            if self.pods[i].runs_to_completion && self.pods[i].deadline.is_none() {
                self.report_end(i, status).await?;
            }
        }
        // Readiness.
        for i in 0..self.pods.len() {
            let r = &self.pods[i];
            if r.ready || r.ended || r.deadline.is_some() || r.child.is_none() {
                continue;
            }
            let passes = match self.pods[i].probe {
                None => true,
                Some(addr) => http_ok(addr, &self.pods[i].probe_path),
            };
            if passes {
                self.pods[i].ready = true;
                self.report_pod(i, true).await?;
            }
        }
        Ok(())
    }

    /// Starts a pod's first container in a namespace of its own and reports it Running.
    async fn start(&mut self, pod: &Pod) -> Result<(), ClusterError> {
        let (namespace, name) = (pod_ns(pod).to_owned(), pod_name(pod).to_owned());
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.as_ref();
        let node = spec.and_then(|s| s.node_name.clone()).unwrap_or_default();
        let Some(container) = spec.and_then(|s| s.containers.first()) else {
            return Ok(());
        };
        let image = container.image.clone().unwrap_or_default();
        let mut running = Running {
            namespace: namespace.clone(),
            name: name.clone(),
            uid: uid.clone(),
            container: container.name.clone(),
            image: image.clone(),
            ip: IpAddr::from([0, 0, 0, 0]),
            child: None,
            probe: None,
            probe_path: String::new(),
            ready: false,
            deadline: None,
            runs_to_completion: spec
                .and_then(|s| s.restart_policy.as_deref())
                .is_some_and(|p| p != "Always"),
            ended: false,
        };
        let Some(runs) = self.runs_for(&image) else {
            let known: Vec<&String> = self.options.images.keys().collect();
            self.report_waiting(
                &namespace,
                &name,
                &container.name,
                &image,
                "ErrImageNotKnown",
                &format!(
                    "the ingressbench node agent runs the images it was given ({known:?}), not `{image}`"
                ),
            )
            .await?;
            // Known, so that it is not tried again every poll.
            self.pods.push(running);
            return Ok(());
        };
        // A pod on the host's network shares the node's namespace (and the node's
        // address, 127.0.0.1); any other gets a namespace of its own.
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let place = if host_network {
            ingressbench_lab::topology::Node {
                name: uid.clone(),
                ip: IpAddr::from([127, 0, 0, 1]),
                netns: None,
            }
        } else {
            self.nodes.get(&uid, &mut |_| {})?
        };
        // The pod's sysctls, in its own network namespace, as the kubelet sets them in the
        // pod's sandbox; one the kernel will not take keeps the pod from starting.
        let sysctls: ingressbench_lab::kernel::Sysctls = spec
            .and_then(|s| s.security_context.as_ref())
            .and_then(|c| c.sysctls.as_ref())
            .into_iter()
            .flatten()
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect();
        if !sysctls.is_empty() {
            let refused =
                ingressbench_lab::kernel::check_namespaced(sysctls.keys().map(String::as_str))
                    .and_then(|()| match place.netns.as_deref() {
                        Some(ns) => ingressbench_lab::kernel::apply(&name, ns, &sysctls),
                        // As the kubelet refuses them: they would change the node's own.
                        None => Err(ingressbench_lab::LabError::Kernel {
                            node: name.clone(),
                            setting: sysctls.keys().cloned().collect::<Vec<_>>().join(", "),
                            reason: "a pod on the host's network cannot set namespaced sysctls"
                                .into(),
                        }),
                    });
            if let Err(e) = refused {
                self.report_waiting(
                    &namespace,
                    &name,
                    &container.name,
                    &image,
                    "SysctlForbidden",
                    &e.to_string(),
                )
                .await?;
                self.pods.push(running);
                return Ok(());
            }
        }
        let mut env = environment(container, pod, place.ip, &node);
        let log = self.options.dir.join(format!("{namespace}_{name}.log"));
        // As the kubelet: a container that must not run as root and would is not started.
        if let Runs::Image(unpacked) = &runs {
            if user_of(unpacked, pod, container).0 == 0 && non_root_asked(pod, container) {
                self.report_waiting(
                    &namespace,
                    &name,
                    &container.name,
                    &image,
                    "CreateContainerConfigError",
                    "container has runAsNonRoot and image will run as root",
                )
                .await?;
                self.pods.push(running);
                return Ok(());
            }
        }
        let (program, argv, record) = command_line(&runs, pod, container, &mut env);
        self.record_start(&namespace, &name, &image, record);
        running.child = Some(OwnedChild::spawn_with_env(
            &format!("pod {namespace}/{name}"),
            &program,
            &argv,
            &env,
            &self.options.dir,
            &log,
            ingressbench_lab::process::RunAs {
                netns: place.netns.as_deref(),
                user: None,
            },
        )?);
        self.live().insert(format!("{namespace}_{name}"));
        running.ip = place.ip;
        if let Some(http) = container
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
        {
            use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
            // A named port is the container's port of that name.
            let port = match &http.port {
                IntOrString::Int(p) => *p as u16,
                IntOrString::String(named) => container
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(named.as_str()))
                    .map_or(0, |p| p.container_port as u16),
            };
            running.probe = Some(SocketAddr::new(place.ip, port));
            running.probe_path = http.path.clone().unwrap_or_else(|| "/".into());
        }
        self.pods.push(running);
        let last = self.pods.len() - 1;
        self.report_pod(last, false).await
    }

    fn live(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<String>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pod `namespace/name`'s process has ended: its log ends where it is.
    fn log_complete(&self, namespace: &str, name: &str) {
        self.live().remove(&format!("{namespace}_{name}"));
    }

    fn runs_for(&self, image: &str) -> Option<Runs> {
        // `registry/path/name:tag` → `name`.
        let name = image.rsplit('/').next().unwrap_or(image);
        let name = name.split([':', '@']).next().unwrap_or(name);
        self.options.images.get(name).cloned()
    }

    /// Appends what pod `namespace/name` runs to [`RAN`].
    fn record_start(
        &self,
        namespace: &str,
        name: &str,
        image: &str,
        mut record: serde_json::Value,
    ) {
        use std::io::Write;
        record["pod"] = json!(format!("{namespace}/{name}"));
        record["pod_image"] = json!(image);
        let path = self.options.dir.join(RAN);
        if let Ok(mut f) = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&path)
        {
            let _ = writeln!(f, "{record}");
        }
    }

    /// Reports pod `i` Running, ready or not.
    async fn report_pod(&self, i: usize, ready: bool) -> Result<(), ClusterError> {
        let r = &self.pods[i];
        let now = now();
        let flag = if ready { "True" } else { "False" };
        let status = json!({ "status": {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": r.ip.to_string(),
            "podIPs": [{ "ip": r.ip.to_string() }],
            "startTime": now,
            "conditions": [
                { "type": "PodScheduled", "status": "True", "lastTransitionTime": now },
                { "type": "Initialized", "status": "True", "lastTransitionTime": now },
                { "type": "ContainersReady", "status": flag, "lastTransitionTime": now },
                { "type": "Ready", "status": flag, "lastTransitionTime": now },
            ],
            "containerStatuses": [{
                "name": r.container, "ready": ready, "started": true, "restartCount": 0,
                "image": r.image, "imageID": r.image,
                "state": { "running": { "startedAt": now } },
            }],
        }});
        self.patch_pod_status(i, &status).await
    }

    /// Reports pod `i`'s container ended with `status`: the pod `Succeeded` on exit 0,
    /// `Failed` otherwise (a signal is exit 128 + its number, as a container runtime says).
    async fn report_end(
        &self,
        i: usize,
        status: std::process::ExitStatus,
    ) -> Result<(), ClusterError> {
        use std::os::unix::process::ExitStatusExt;
        let r = &self.pods[i];
        let code = status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(1);
        let now = now();
        let (phase, reason) = if code == 0 {
            ("Succeeded", "Completed")
        } else {
            ("Failed", "Error")
        };
        let status = json!({ "status": {
            "phase": phase,
            "conditions": [
                { "type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now },
                { "type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now },
            ],
            "containerStatuses": [{
                "name": r.container, "ready": false, "started": false, "restartCount": 0,
                "image": r.image, "imageID": r.image,
                "state": { "terminated": { "exitCode": code, "reason": reason, "finishedAt": now } },
            }],
        }});
        self.patch_pod_status(i, &status).await
    }

    /// Patches pod `i`'s status; a pod deleted meanwhile is no error (the next step
    /// stops it).
    async fn patch_pod_status(
        &self,
        i: usize,
        status: &serde_json::Value,
    ) -> Result<(), ClusterError> {
        let r = &self.pods[i];
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &r.namespace);
        match pods
            .patch_status(&r.name, &PatchParams::default(), &Patch::Merge(status))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            other => other.map(|_| ()).map_err(api),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn report_waiting(
        &self,
        namespace: &str,
        name: &str,
        container: &str,
        image: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), ClusterError> {
        let status = json!({ "status": { "phase": "Pending", "containerStatuses": [{
            "name": container, "ready": false, "restartCount": 0, "image": image, "imageID": "",
            "state": { "waiting": { "reason": reason, "message": message } } }] } });
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map(|_| ())
            .map_err(api)
    }

    /// Removes the pod object (the last step of a deletion, as the kubelet's).
    async fn remove(&self, namespace: &str, name: &str) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let _ = pods
            .delete(
                name,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                },
            )
            .await;
    }

    /// Kills every pod (the agent is stopping) and removes their namespaces.
    async fn stop_all(&mut self) {
        for mut r in self.pods.drain(..) {
            if let Some(mut child) = r.child.take() {
                child.terminate(Duration::ZERO);
            }
        }
        self.nodes.remove();
    }
}

/// What runs for a container, as the kubelet would run it: the program, its arguments
/// and the record of it for [`RAN`]. From an image, the container's command line runs
/// inside the image's root filesystem through [`crate::image::ENTER_COMMAND`], with the
/// image's environment put under `env`.
fn command_line(
    runs: &Runs,
    pod: &Pod,
    container: &Container,
    env: &mut Vec<(String, String)>,
) -> (PathBuf, Vec<String>, serde_json::Value) {
    // `$(VAR)` in command and args is the container's variable, as the kubelet
    // expands it.
    let expand = |list: &Option<Vec<String>>| -> Option<Vec<String>> {
        list.as_ref().map(|l| {
            l.iter()
                .map(|a| {
                    env.iter()
                        .fold(a.clone(), |a, (k, v)| a.replace(&format!("$({k})"), v))
                })
                .collect()
        })
    };
    let (command, args) = (expand(&container.command), expand(&container.args));
    match runs {
        Runs::Binary(binary) => {
            let argv = args.unwrap_or_default();
            let record = json!({ "ran": "binary", "binary": binary, "argv": argv });
            (binary.clone(), argv, record)
        }
        Runs::Image(image) => {
            let argv = image.argv(command.as_deref(), args.as_deref());
            let (uid, gid) = user_of(image, pod, container);
            let record = json!({
                "ran": "image", "image": image.reference, "digest": image.digest,
                "rootfs": image.rootfs, "user": format!("{uid}:{gid}"), "argv": argv,
            });
            // The image's environment, the container's over it.
            let own: Vec<String> = env.iter().map(|(k, _)| k.clone()).collect();
            env.splice(
                0..0,
                image.env.iter().filter(|(k, _)| !own.contains(k)).cloned(),
            );
            let enter = crate::image::ENTER_COMMAND
                .iter()
                .map(|s| (*s).to_owned())
                .chain([
                    "--root".into(),
                    image.rootfs.display().to_string(),
                    "--user".into(),
                    format!("{uid}:{gid}"),
                    "--workdir".into(),
                    container
                        .working_dir
                        .clone()
                        .unwrap_or(image.workdir.clone()),
                    "--".into(),
                ])
                .chain(argv)
                .collect();
            (image.launcher.clone(), enter, record)
        }
    }
}

/// Who a container of `image` runs as: its security context's user, else the image's,
/// else root.
fn user_of(image: &crate::image::Image, pod: &Pod, container: &Container) -> (u32, u32) {
    run_as(pod, container).unwrap_or(image.user.unwrap_or((0, 0)))
}

/// Whether the container's or the pod's security context says `runAsNonRoot: true`.
fn non_root_asked(pod: &Pod, container: &Container) -> bool {
    let own = container
        .security_context
        .as_ref()
        .and_then(|c| c.run_as_non_root);
    let pod_wide = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|c| c.run_as_non_root);
    own.or(pod_wide).unwrap_or(false)
}

/// The user and group the pod's or the container's security context asks for (the
/// container's over the pod's), if it names a user.
fn run_as(pod: &Pod, container: &Container) -> Option<(u32, u32)> {
    let pod_context = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let own = container.security_context.as_ref();
    let uid = own
        .and_then(|c| c.run_as_user)
        .or(pod_context.and_then(|c| c.run_as_user))?;
    let gid = own
        .and_then(|c| c.run_as_group)
        .or(pod_context.and_then(|c| c.run_as_group))
        .unwrap_or(uid);
    Some((u32::try_from(uid).ok()?, u32::try_from(gid).ok()?))
}

/// The container's environment: plain values and the pod fields `fieldRef` can name.
fn environment(container: &Container, pod: &Pod, ip: IpAddr, node: &str) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("metadata.name") => pod_name(pod).to_owned(),
                Some("metadata.namespace") => pod_ns(pod).to_owned(),
                Some("metadata.uid") => pod.metadata.uid.clone().unwrap_or_default(),
                Some("status.podIP") => ip.to_string(),
                Some("spec.nodeName") => node.to_owned(),
                // `metadata.annotations['key']`, `metadata.labels['key']` (a Job's
                // completion index comes this way).
                Some(path) => {
                    let item = |prefix: &str| {
                        path.strip_prefix(prefix)
                            .and_then(|rest| rest.strip_suffix("']"))
                            .map(str::to_owned)
                    };
                    let m = &pod.metadata;
                    match (item("metadata.annotations['"), item("metadata.labels['")) {
                        (Some(key), _) => m.annotations.as_ref().and_then(|a| a.get(&key)).cloned(),
                        (_, Some(key)) => m.labels.as_ref().and_then(|l| l.get(&key)).cloned(),
                        _ => None,
                    }
                    .unwrap_or_default()
                }
                None => String::new(),
            },
            _ => String::new(),
        };
        env.push((var.name.clone(), value));
    }
    env
}

fn pod_ns(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}

/// Whether `GET path` on `addr` answers 2xx or 3xx (the kubelet's HTTP probe).
pub(crate) fn http_ok(addr: SocketAddr, path: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && matches!(head[9], b'2' | b'3')
}

fn now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    k8s_openapi::jiff::Timestamp::from_second(secs as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn now_micro() -> String {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    k8s_openapi::jiff::Timestamp::from_microsecond(micros as i64)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string())
        .unwrap_or_default()
}

fn api(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Api(e.to_string())
}
