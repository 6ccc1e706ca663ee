//! The node agent: what stands in for the kubelet on the local cluster, where there is no
//! container runtime. It registers its nodes and renews their leases, and runs every pod
//! the scheduler binds to one of them: each of its containers a local process, together
//! in a network namespace of their own (an address from 198.18.0.0/15: the API refuses
//! loopback addresses in EndpointSlices), with the environment the kubelet gives them
//! (values, fields, Secrets). It reports the pod Running, then Ready once every
//! container's readiness probe passes; on deletion it runs each container's preStop
//! hook (`lifecycle`) and sends it SIGTERM once the hook ended, waits out the grace
//! period, sends SIGKILL, and removes the pod. An image is run from its unpacked root
//! filesystem (chrooted, as the pod's or the image's user, in a mount namespace of its
//! own with a `/proc` and the pod's volumes: [`crate::image`]; `envoy` is an image staged
//! from the lab's Envoy), or, where no image was built, as a local binary (`ingressbench`
//! is this tool), as the security context's user. It stands in for kube-proxy and the
//! cluster's DNS too (`services`). Every start is recorded in [`RAN`] in its directory.
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
use k8s_openapi::api::core::v1::{Container, Node, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::ClusterError;

mod lifecycle;
mod pod;
mod services;
mod status;
mod volumes;
use pod::{
    command_line, environment, non_root_asked, pod_name, pod_ns, pod_sysctls, probe_of, run_as,
    runs_as_root, user_of,
};
pub use services::REFRESH as SERVICES_REFRESH;

/// How often the agent looks at the pods.
pub const POLL: Duration = Duration::from_millis(100);
/// How often a node's lease is renewed (the kubelet's default).
const LEASE_RENEW: Duration = Duration::from_secs(10);
/// How long the agent goes on trying when none of its steps goes through (the API server
/// gone): then it stops, and the local cluster with it.
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);
/// The prefix of the nodes' names.
pub const NODE_PREFIX: &str = "ib-node-";
pub use crate::file::IMAGE;

/// What the agent needs.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// The administrator's kubeconfig.
    pub kubeconfig: PathBuf,
    /// How many nodes it registers (`ib-node-1` …).
    pub nodes: usize,
    /// Where pods' logs go.
    pub dir: PathBuf,
    /// Images it can run, by name (`envoy`: any tag) or name and tag (`gateway:v1.9.1`),
    /// without the registry, and what runs for each.
    pub images: BTreeMap<String, Runs>,
    /// The version its nodes report (the control plane's).
    pub kubelet_version: &'static str,
    /// Where the API server listens (the `kubernetes` Service's endpoint).
    pub api: SocketAddr,
    /// The range Services' cluster IPs come from (the `kubernetes` Service has the
    /// first).
    pub service_range: &'static str,
}

/// What the agent runs for an image.
#[derive(Clone, Debug)]
pub enum Runs {
    /// The image itself, unpacked.
    Image(Box<crate::image::Image>),
    /// A local binary with the container's arguments (where no image was built), run as
    /// the user the image would run as (`user`), unless the security context names one.
    Binary {
        /// The program.
        binary: PathBuf,
        /// The image's `USER`, if it has one ([`IMAGE_USER`] for this tool's image).
        user: Option<(u32, u32)>,
    },
}

/// The user this tool's image runs as (`scripts/image.sh`: `USER 65532:65532`); its
/// pods run as it from the binary too, so that `runAsNonRoot` holds either way.
pub const IMAGE_USER: (u32, u32) = (65532, 65532);

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
                let runtime = crate::api::runtime()?;
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
    ip: IpAddr,
    /// Its containers, in the pod's order (none started: it could not be, and is
    /// waiting with the reason reported).
    containers: Vec<ContainerRun>,
    ready: bool,
    /// Set once its deletion began: when to stop waiting for it to exit.
    deadline: Option<Instant>,
    /// Whether it runs to completion (restart policy `Never` or `OnFailure`, a Job's
    /// pods): its exit is reported as the pod's end, `Succeeded` or `Failed`.
    runs_to_completion: bool,
    /// Whether its processes have all ended (and, if it runs to completion, that was
    /// reported).
    ended: bool,
    /// Whether a container of a pod that should keep running has exited (and that was
    /// reported, as the kubelet's `CrashLoopBackOff`).
    crashed: bool,
    /// Its volumes' files.
    volumes: volumes::Volumes,
}

/// One container of a pod: its process, and its readiness probe.
struct ContainerRun {
    /// The container's name and image, as reported in its status.
    name: String,
    image: String,
    child: OwnedChild,
    probe: Option<SocketAddr>,
    probe_path: String,
    /// Its log.
    log: PathBuf,
    /// How it ended, once it has.
    exit: Option<std::process::ExitStatus>,
    /// Its preStop hook, until its pod is deleted.
    pre_stop: Option<lifecycle::Hook>,
    /// Once its pod is being deleted: its hook running (none: it had none, or it ended
    /// and the container was sent SIGTERM).
    stopping: Option<std::thread::JoinHandle<()>>,
}

impl ContainerRun {
    /// Its exit code, as a container runtime gives it (a signal is 128 + its number).
    fn code(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.exit.map(|s| {
            s.code()
                .or_else(|| s.signal().map(|n| 128 + n))
                .unwrap_or(1)
        })
    }
}

impl Running {
    /// Its deletion begins, with `grace` to end: each container's preStop hook starts, and
    /// a container without one is sent SIGTERM.
    fn begin_stop(&mut self, grace: Duration) {
        let deadline = Instant::now() + grace;
        self.deadline = Some(deadline);
        for c in &mut self.containers {
            let label = format!(
                "preStop hook of pod {}/{} container {}",
                self.namespace, self.name, c.name
            );
            let pid = c.child.pid();
            c.stopping = c
                .pre_stop
                .take()
                .map(|hook| hook.start(label, pid, deadline));
            if c.stopping.is_none() {
                let _ = c.child.signal(rustix::process::Signal::TERM);
            }
        }
    }

    /// Sends SIGTERM to each container whose preStop hook has ended.
    fn term_hooked(&mut self) {
        for c in &mut self.containers {
            if c.stopping.as_ref().is_some_and(|h| h.is_finished()) {
                c.stopping = None;
                let _ = c.child.signal(rustix::process::Signal::TERM);
            }
        }
    }

    fn kill_all(&mut self) {
        for c in &mut self.containers {
            c.child.terminate(Duration::ZERO);
        }
    }

    /// Whether every container's process has ended (noting how each did).
    fn all_exited(&mut self) -> bool {
        for c in &mut self.containers {
            if c.exit.is_none() {
                c.exit = c.child.try_wait();
            }
        }
        self.containers.iter().all(|c| c.exit.is_some())
    }
}

struct State {
    options: AgentOptions,
    client: Client,
    /// The Services and DNS the pods reach (dropped before `nodes`, whose hub it uses).
    network: services::Network,
    nodes: Nodes,
    pods: Vec<Running>,
    renewed: Instant,
    /// The pods whose process runs, for the log endpoint.
    live: crate::logs::Live,
    logs: crate::logs::LogServer,
    /// Pods waiting for a volume (a Secret not made yet), by uid: when to try again, and
    /// the reason last reported.
    waiting: BTreeMap<String, (Instant, String)>,
}

impl State {
    async fn new(options: AgentOptions) -> Result<Self, ClusterError> {
        let client = crate::api::client(&options.kubeconfig, None).await?;
        let mut nodes = Nodes::new(Isolation::Netns)?;
        let network = services::Network::start(
            &mut nodes,
            &options.kubeconfig,
            options.api,
            options.service_range,
        )?;
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
            waiting: BTreeMap::new(),
            network,
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
            "nodeInfo": { "kubeletVersion": format!("v{}", self.options.kubelet_version),
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

    /// Steps until stopped. A step that fails (an API call refused, cut or timed out on a
    /// busy control plane) is said in the serving process's log and the next step takes
    /// it up again, as a kubelet's sync loop does; only when none has gone through for
    /// [`GIVE_UP_AFTER`] does the agent stop, with the last error.
    async fn serve(&mut self, stop: &AtomicBool) -> Result<(), ClusterError> {
        let mut failing: Option<(Instant, String)> = None;
        while !stop.load(Ordering::Relaxed) {
            match self.sync().await {
                Ok(()) => {
                    if let Some((since, _)) = failing.take() {
                        eprintln!(
                            "node agent: its API calls go through again after {:.1} s",
                            since.elapsed().as_secs_f64()
                        );
                    }
                }
                Err(e) => {
                    let said = e.to_string();
                    match &mut failing {
                        Some((since, _)) if since.elapsed() >= GIVE_UP_AFTER => return Err(e),
                        Some((_, last)) if *last == said => {}
                        Some((_, last)) => {
                            eprintln!("node agent: {said}; trying again");
                            *last = said;
                        }
                        None => {
                            eprintln!("node agent: {said}; trying again");
                            failing = Some((Instant::now(), said));
                        }
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    /// The leases when due, then one step.
    async fn sync(&mut self) -> Result<(), ClusterError> {
        if self.renewed.elapsed() >= LEASE_RENEW {
            self.renew_leases().await?;
            for name in self.node_names() {
                self.report_node(&name).await?;
            }
        }
        self.step().await
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
            let retry_later = self
                .waiting
                .get(&uid)
                .is_some_and(|(at, _)| Instant::now() < *at);
            match (known, pod.metadata.deletion_timestamp.is_some()) {
                (None, false) if retry_later => {}
                (None, false) => {
                    if let Err(e) = self.start(pod).await {
                        // This pod waits and is tried again in a second; the others go on.
                        let message = e.to_string();
                        let again = Instant::now() + Duration::from_secs(1);
                        let told = self.waiting.insert(uid.clone(), (again, message.clone()));
                        if told.is_none_or(|(_, before)| before != message) {
                            eprintln!(
                                "node agent: pod {}/{}: {message}; trying again",
                                pod_ns(pod),
                                pod_name(pod)
                            );
                        }
                    }
                }
                (None, true) => {
                    self.forget_waiting(&uid);
                    self.remove(pod_ns(pod), pod_name(pod)).await;
                }
                (Some(i), true) if self.pods[i].deadline.is_none() => {
                    let grace = pod
                        .metadata
                        .deletion_grace_period_seconds
                        .unwrap_or(30)
                        .max(0) as u64;
                    self.pods[i].begin_stop(Duration::from_secs(grace));
                }
                _ => {}
            }
        }
        // Pods gone from the API (deleted with no grace by someone else) stop here too.
        let listed_uids: Vec<String> = ours.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        let gone_waiting: Vec<String> = self
            .waiting
            .keys()
            .filter(|uid| !listed_uids.contains(uid))
            .cloned()
            .collect();
        gone_waiting.iter().for_each(|uid| self.forget_waiting(uid));
        let mut i = 0;
        while i < self.pods.len() {
            let r = &mut self.pods[i];
            r.term_hooked();
            let gone = !listed_uids.contains(&r.uid);
            let exited = r.all_exited();
            let overdue = r.deadline.is_some_and(|d| Instant::now() >= d);
            if gone || (r.deadline.is_some() && (exited || overdue)) {
                let mut r = self.pods.remove(i);
                r.kill_all();
                r.volumes.remove();
                self.log_complete(&r.namespace, &r.name);
                self.nodes.release(&r.uid);
                if !gone {
                    self.remove(&r.namespace, &r.name).await;
                }
                continue;
            }
            i += 1;
        }
        // Pods whose processes have all ended: their logs are complete, and those that
        // run to completion are reported ended (those of other restart policies stay as
        // they are: the agent restarts nothing).
        for i in 0..self.pods.len() {
            let r = &mut self.pods[i];
            if r.ended || r.containers.is_empty() || !r.all_exited() {
                continue;
            }
            let (namespace, name) = (r.namespace.clone(), r.name.clone());
            self.log_complete(&namespace, &name);
            if self.pods[i].runs_to_completion && self.pods[i].deadline.is_none() {
                self.report_end(i).await?;
            }
            // Once reported: a report that failed is made again at the next step.
            self.pods[i].ended = true;
        }
        // A container of a pod that should keep running has exited: the kubelet would
        // restart it and report `CrashLoopBackOff`; the agent restarts nothing, and says so
        // once, with how it ended and its last words.
        for i in 0..self.pods.len() {
            let r = &mut self.pods[i];
            if r.crashed || r.runs_to_completion || r.deadline.is_some() {
                continue;
            }
            r.all_exited();
            if r.containers.iter().any(|c| c.exit.is_some()) {
                self.report_crash(i).await?;
                let r = &mut self.pods[i];
                r.crashed = true;
                r.ready = false;
            }
        }
        // Tokens near the end of their life are renewed, as the kubelet renews them.
        for r in &mut self.pods {
            r.volumes.renew_tokens(&self.client).await;
        }
        // Readiness: every container's probe passes.
        for i in 0..self.pods.len() {
            let r = &self.pods[i];
            if r.ready || r.ended || r.crashed || r.deadline.is_some() || r.containers.is_empty() {
                continue;
            }
            let passes = r.containers.iter().all(|c| match c.probe {
                None => true,
                Some(addr) => http_ok(addr, &c.probe_path),
            });
            if passes {
                self.report_pod(i, true).await?;
                self.pods[i].ready = true;
            }
        }
        Ok(())
    }

    /// Starts a pod's containers in a network namespace of its own and reports it
    /// Running. A container that cannot start (an image the agent does not know, a
    /// user its security context forbids) keeps the whole pod waiting, with the reason.
    async fn start(&mut self, pod: &Pod) -> Result<(), ClusterError> {
        let (namespace, name) = (pod_ns(pod).to_owned(), pod_name(pod).to_owned());
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.as_ref();
        let node = spec.and_then(|s| s.node_name.clone()).unwrap_or_default();
        let containers: &[Container] = spec.map_or(&[], |s| &s.containers);
        let Some(first) = containers.first() else {
            return Ok(());
        };
        let mut running = Running {
            namespace: namespace.clone(),
            name: name.clone(),
            uid: uid.clone(),
            ip: IpAddr::from([0, 0, 0, 0]),
            containers: Vec::new(),
            ready: false,
            deadline: None,
            runs_to_completion: spec
                .and_then(|s| s.restart_policy.as_deref())
                .is_some_and(|p| p != "Always"),
            ended: false,
            crashed: false,
            volumes: volumes::Volumes::default(),
        };
        // What runs for each container, or why one cannot.
        let mut plans = Vec::new();
        for container in containers {
            let image = container.image.clone().unwrap_or_default();
            let refusal = match self.runs_for(&image) {
                None => Err((
                    "ErrImageNotKnown",
                    format!(
                        "the ingressbench node agent runs the images it was given ({:?}), not `{image}`",
                        self.options.images.keys().collect::<Vec<_>>()
                    ),
                )),
                // As the kubelet: a container that must not run as root and would is not
                // started.
                Some(runs) if runs_as_root(&runs, pod, container) && non_root_asked(pod, container) => Err((
                    "CreateContainerConfigError",
                    "container has runAsNonRoot and image will run as root".to_owned(),
                )),
                Some(runs) => Ok(runs),
            };
            match refusal {
                Ok(runs) => plans.push((container, image, runs)),
                Err((reason, message)) => {
                    return self
                        .wait_for_good(running, container, reason, &message)
                        .await;
                }
            }
        }
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
            let place = self.nodes.get(&uid, &mut |_| {})?;
            if let Some(netns) = &place.netns {
                self.network.join(netns)?;
            }
            place
        };
        // Its sysctls set and its Secrets read, or why not, as the kubelet says.
        let ready = match pod_sysctls(pod, &place) {
            Err(e) => Err(("SysctlForbidden", e)),
            Ok(()) => self
                .secrets_for(pod)
                .await
                .map_err(|e| ("CreateContainerConfigError", e)),
        };
        let secrets = match ready {
            Ok(s) => s,
            Err((reason, message)) => {
                return self.wait_for_good(running, first, reason, &message).await;
            }
        };
        running.ip = place.ip;
        // Its volumes: not made yet, it waits and is tried again in a second (kept in
        // its namespace); never, it waits for good, with the reason.
        let dir = self.options.dir.join("volumes").join(&uid);
        match volumes::Volumes::make(&self.client, pod, place.ip, &node, dir).await {
            Ok(v) => {
                self.waiting.remove(&uid);
                running.volumes = v;
            }
            Err(volumes::NotMade::Waiting(message)) => {
                let again = Instant::now() + Duration::from_secs(1);
                let told = self.waiting.insert(uid, (again, message.clone()));
                if told.is_none_or(|(_, before)| before != message) {
                    self.report_waiting(&running, first, "ContainerCreating", &message)
                        .await?;
                }
                return Ok(());
            }
            Err(volumes::NotMade::Refused(message)) => {
                return self
                    .wait_for_good(running, first, "CreateContainerConfigError", &message)
                    .await;
            }
        }
        // The kubelet's files: where names are looked up (the cluster's DNS, unless the
        // pod asks for the node's), and the pod's own name.
        let cluster_dns = match spec.and_then(|s| s.dns_policy.as_deref()) {
            Some("Default" | "None") => false,
            Some("ClusterFirstWithHostNet") => true,
            _ => !host_network,
        };
        let etc = match cluster_dns {
            true => self
                .network
                .pod_files(&running.volumes.dir, &namespace, &name, place.ip)
                .map_err(|e| ClusterError::Io {
                    path: running.volumes.dir.clone(),
                    source: e,
                })?
                .map(|(source, target)| volumes::Mount {
                    source,
                    target: target.to_owned(),
                    read_only: true,
                })
                .into_iter()
                .collect(),
            false => Vec::new(),
        };
        let mut mounts = Vec::new();
        for (container, _, _) in &plans {
            match running.volumes.mounts(container) {
                Ok(mut m) => {
                    m.extend(etc.iter().cloned());
                    mounts.push(m);
                }
                Err(message) => {
                    running.volumes.remove();
                    return self
                        .wait_for_good(running, container, "CreateContainerConfigError", &message)
                        .await;
                }
            }
        }
        for (i, ((container, image, runs), mounts)) in plans.into_iter().zip(mounts).enumerate() {
            let mut env = environment(container, pod, place.ip, &node, &secrets);
            // The API server's Service, as the kubelet names it to every container.
            let kubernetes = services::first_address(self.options.service_range);
            for (key, value) in [
                ("KUBERNETES_SERVICE_HOST", kubernetes.to_string()),
                ("KUBERNETES_SERVICE_PORT", "443".to_owned()),
                ("KUBERNETES_SERVICE_PORT_HTTPS", "443".to_owned()),
            ] {
                if !env.iter().any(|(k, _)| k == key) {
                    env.insert(0, (key.to_owned(), value));
                }
            }
            // The first container's log is the pod's; the others' have their own.
            let log = match i {
                0 => self.options.dir.join(format!("{namespace}_{name}.log")),
                _ => self
                    .options
                    .dir
                    .join(format!("{namespace}_{name}_{}.log", container.name)),
            };
            let (mut program, argv, mut record) =
                command_line(&runs, pod, container, &mut env, &mounts);
            // Its preStop command runs inside the container, as its user, with its
            // environment (a local binary is no container to run a command in).
            let exec_hook = match (&runs, lifecycle::exec_command(container)) {
                (Runs::Image(image), Some(command)) => Some(lifecycle::ExecHook {
                    command,
                    env: env.clone(),
                    user: user_of(image, pod, container),
                    dir: self.options.dir.clone(),
                    log: self
                        .options
                        .dir
                        .join(format!("{namespace}_{name}_{}.prestop.log", container.name)),
                }),
                _ => None,
            };
            // A local binary runs as the user the security context names, else as the
            // image's (an image's container drops to its user itself, inside its root
            // filesystem); from where that user can reach it (not root's home).
            let user = match runs {
                Runs::Binary { user, .. } => run_as(pod, container)
                    .or(user)
                    .map(|(uid, gid)| ingressbench_lab::identity::Identity { uid, gid }),
                Runs::Image(_) => None,
            };
            if let Some(u) = &user {
                record["user"] = json!(format!("{}:{}", u.uid, u.gid));
                let stage = self.options.dir.join(format!("bin-{}", u.uid));
                program = match ingressbench_lab::identity::runnable(&program, user, &stage) {
                    Ok(p) => p,
                    Err(e) => {
                        running.kill_all();
                        return Err(e.into());
                    }
                };
            }
            let pre_stop = exec_hook
                .map(lifecycle::Hook::Exec)
                .or_else(|| lifecycle::http_hook(container, place.ip));
            self.record_start(&namespace, &name, &container.name, &image, record);
            let child = OwnedChild::spawn_with_env(
                &format!("pod {namespace}/{name} container {}", container.name),
                &program,
                &argv,
                &env,
                &self.options.dir,
                &log,
                ingressbench_lab::process::RunAs {
                    netns: place.netns.as_deref(),
                    user,
                },
            );
            let child = match child {
                Ok(c) => c,
                Err(e) => {
                    running.kill_all();
                    return Err(e.into());
                }
            };
            let (probe, probe_path) = probe_of(container, place.ip);
            running.containers.push(ContainerRun {
                name: container.name.clone(),
                image,
                child,
                probe,
                probe_path,
                log,
                exit: None,
                pre_stop,
                stopping: None,
            });
        }
        self.live().insert(format!("{namespace}_{name}"));
        self.pods.push(running);
        let last = self.pods.len() - 1;
        self.report_pod(last, false).await
    }

    /// The Secrets the pod's containers take variables from (`secretKeyRef`), by name:
    /// read from the API as the kubelet reads them. A missing Secret or key is the
    /// kubelet's `CreateContainerConfigError`.
    async fn secrets_for(
        &self,
        pod: &Pod,
    ) -> Result<BTreeMap<String, BTreeMap<String, String>>, String> {
        let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        let refs = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.env.iter().flatten())
            .filter_map(|v| v.value_from.as_ref()?.secret_key_ref.as_ref());
        let api: Api<Secret> = Api::namespaced(self.client.clone(), pod_ns(pod));
        for r in refs {
            if !out.contains_key(&r.name) {
                let secret = api
                    .get(&r.name)
                    .await
                    .map_err(|e| format!("secret \"{}\": {e}", r.name))?;
                let data = secret
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                    .collect();
                out.insert(r.name.clone(), data);
            }
            if !out[&r.name].contains_key(&r.key) && r.optional != Some(true) {
                return Err(format!(
                    "couldn't find key {} in Secret {}/{}",
                    r.key,
                    pod_ns(pod),
                    r.name
                ));
            }
        }
        Ok(out)
    }

    fn live(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<String>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pod `namespace/name`'s process has ended: its log ends where it is.
    fn log_complete(&self, namespace: &str, name: &str) {
        self.live().remove(&format!("{namespace}_{name}"));
    }

    /// What runs for `registry/path/name:tag`: the image given as `name:tag`, else as
    /// `name` (any tag).
    fn runs_for(&self, image: &str) -> Option<Runs> {
        let last = image.rsplit('/').next().unwrap_or(image);
        let tagged = last.split('@').next().unwrap_or(last);
        let name = tagged.split(':').next().unwrap_or(tagged);
        let images = &self.options.images;
        images.get(tagged).or_else(|| images.get(name)).cloned()
    }

    /// Appends what pod `namespace/name` runs to [`RAN`].
    fn record_start(
        &self,
        namespace: &str,
        name: &str,
        container: &str,
        image: &str,
        mut record: serde_json::Value,
    ) {
        use std::io::Write;
        record["pod"] = json!(format!("{namespace}/{name}"));
        record["container"] = json!(container);
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

    /// A pod that waited for a volume is gone: its namespace goes.
    fn forget_waiting(&mut self, uid: &str) {
        if self.waiting.remove(uid).is_some() {
            self.nodes.release(uid);
        }
    }

    /// Kills every pod (the agent is stopping) and removes their namespaces and volumes.
    async fn stop_all(&mut self) {
        for mut r in self.pods.drain(..) {
            r.kill_all();
            r.volumes.remove();
        }
        self.nodes.remove();
    }
}

/// The last line of a log (at most 300 characters of it), or `(empty)`.
fn last_line(log: &std::path::Path) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let tail = &text[text.len().saturating_sub(4096)..];
    let line = String::from_utf8_lossy(tail)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().chars().take(300).collect::<String>());
    line.unwrap_or_else(|| "(empty)".into())
}

/// Whether `GET path` on `addr` answers 2xx or 3xx (the kubelet's HTTP probe).
pub(crate) fn http_ok(addr: SocketAddr, path: &str) -> bool {
    use ingressbench_lab::http1::{exchange, Request, Until};
    let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let host = addr.to_string();
    exchange(s, &Request::get(&host, path), Until::Status)
        .is_ok_and(|answer| (200..400).contains(&answer.status))
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
