//! Load from inside the cluster: the run's workers as an Indexed Job in the cell's
//! namespace (one completion per worker, all at once), each pod running `ingressbench
//! worker` with the common plan in its environment and its index from the Job
//! (`JOB_COMPLETION_INDEX`). Each worker's standard output is its transport: the
//! coordinator follows every pod's log through the API (`pods/log?follow=true`), so no
//! Service, port or volume is needed, and hands the lines to
//! [`ingressbench_load::fleet::coordinate`], which merges them as it does local workers'.
//!
//! Nothing outlives the run: the Job is deleted when the run is done with it, and it
//! carries `activeDeadlineSeconds` and `ttlSecondsAfterFinished`, so the cluster ends
//! and removes it even if the tool dies (and the namespace goes with the cell, or with
//! `cluster cleanup`).

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::{AsyncBufReadExt, StreamExt};
use ingressbench_load::fleet::{PlanWire, Source, WorkerHandle, PLAN_ENV, POD_ENV};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams, PropagationPolicy};
use kube::{Api, Client};
use serde_json::json;

use crate::meta::{CANNOT_START, MANAGED_BY, POOL_LABEL, RUN_LABEL, TOOL};
use crate::ClusterError;

/// The Job's name (one per cell namespace).
pub const JOB_NAME: &str = "ingressbench-load";
/// The label that marks the workers' pods (they carry no pool label, so the backends'
/// selectors never match them).
pub const ROLE_LABEL: &str = "app.kubernetes.io/component";
/// [`ROLE_LABEL`]'s value on a load worker's pod.
pub const ROLE: &str = "load";
/// The workers' container.
const CONTAINER: &str = "worker";
/// The Job controller's label naming a pod's Job, and its annotation with the index.
const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
const INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";
/// How long after the common start a worker's pod may still be starting before the run
/// gives up on it.
const START_WAIT: Duration = Duration::from_secs(30);
/// How long the scheduler may call a pod unschedulable before that is the answer.
const UNSCHEDULABLE_GRACE: Duration = Duration::from_secs(3);
/// The seconds a worker gets to hand over its results when asked to stop.
const GRACE_S: u32 = 30;
/// How long a finished Job stays for anyone to look at.
const TTL_S: i32 = 60;
/// How often pods are looked at while waiting.
const POLL: Duration = Duration::from_millis(200);

/// Where the workers' pods may go, relative to what the run has in the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Wherever the scheduler puts them.
    #[default]
    Any,
    /// On nodes where a backend of the run runs (pod affinity).
    SameAsBackends,
    /// On nodes without one (pod anti-affinity).
    OtherThanBackends,
    /// On nodes where a pod of the ingress controller runs: the pods of
    /// [`FleetSpec::ingress_pods`].
    SameAsIngress,
    /// On nodes with these labels (`nodeSelector`).
    Nodes(BTreeMap<String, String>),
}

/// What a run's load Job is.
#[derive(Clone, Debug)]
pub struct FleetSpec {
    /// How many workers.
    pub workers: usize,
    /// Where they go.
    pub placement: Placement,
    /// On the node's network (`hostNetwork`), where the controller's address is reached
    /// as from the node itself (the local cluster's controllers listen on its loopback).
    pub host_network: bool,
    /// The ingress controller's pods: their namespace and labels (its Service's
    /// selector), for [`Placement::SameAsIngress`].
    pub ingress_pods: Option<(String, BTreeMap<String, String>)>,
}

/// A run's load Job, to be made in `namespace`.
pub struct LoadJob {
    /// The run's connection to the cluster.
    pub(crate) api: crate::api::ClusterApi,
    /// The Job to make.
    pub(crate) object: JobObject,
}

/// The Job of load workers, as it is made.
#[derive(Debug)]
pub(crate) struct JobObject {
    pub(crate) namespace: String,
    pub(crate) run_id: String,
    pub(crate) image: String,
    pub(crate) spec: FleetSpec,
}

/// Where each worker ran, as the API says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerPod {
    /// The worker's index in the run's share of the load (0 to N-1).
    pub index: usize,
    /// The pod.
    pub pod: String,
    /// The node the pod was placed on.
    pub node: String,
}

/// The Job while it runs; deleted when dropped (its pods go with it).
pub struct RunningJob {
    api: crate::api::ClusterApi,
    namespace: String,
    /// Each worker's pod, by index.
    pub pods: Vec<WorkerPod>,
    /// The nodes the run's backends were on when the workers started.
    pub backend_nodes: Vec<String>,
}

impl LoadJob {
    /// Makes the Job from `wire` (every worker's plan; its index is the Job's), waits
    /// until each worker's pod runs (at most [`START_WAIT`] past the common start), and
    /// follows their logs. A pod that cannot start (unschedulable, an image the nodes
    /// cannot run) is an error naming it and the reason, and the Job is deleted.
    /// `active_for` bounds how long the Job may run at all; `stop` (Ctrl-C) ends the
    /// wait.
    pub fn start(
        self,
        wire: &PlanWire,
        active_for: Duration,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<(Vec<Source>, RunningJob), ClusterError> {
        let runtime = self.api.runtime.clone();
        let client = self.api.client();
        let job: Job = serde_json::from_value(self.object.job(wire, active_for)?)
            .map_err(|e| ClusterError::Api(format!("the load Job: {e}")))?;
        let jobs: Api<Job> = Api::namespaced(client.clone(), &self.object.namespace);
        runtime
            .block_on(jobs.create(&PostParams::default(), &job))
            .map_err(|e| ClusterError::Api(format!("creating Job {JOB_NAME}: {e}")))?;
        let mut running = RunningJob {
            api: self.api.clone(),
            namespace: self.object.namespace.clone(),
            pods: Vec::new(),
            backend_nodes: Vec::new(),
        };
        let start = std::time::UNIX_EPOCH + Duration::from_nanos(wire.start_unix_ns);
        let give_up = Instant::now()
            + start.duration_since(SystemTime::now()).unwrap_or_default()
            + START_WAIT;
        let pods = runtime.block_on(wait_for_pods(
            &client,
            &self.object.namespace,
            self.object.spec.workers,
            (give_up, stop),
        ))?;
        let api: Api<Pod> = Api::namespaced(client, &self.object.namespace);
        let backends = ListParams::default().labels(POOL_LABEL);
        let mut backend_nodes: Vec<String> = runtime
            .block_on(api.list(&backends))
            .map_err(|e| ClusterError::Api(format!("listing the backends' pods: {e}")))?
            .items
            .into_iter()
            .filter_map(|p| p.spec?.node_name)
            .collect();
        backend_nodes.sort();
        backend_nodes.dedup();
        running.backend_nodes = backend_nodes;
        let sources = pods
            .iter()
            .map(|p| {
                let (tx, rx) = mpsc::channel();
                runtime.spawn(follow(api.clone(), p.pod.clone(), tx));
                Source {
                    lines: Box::new(std::io::BufReader::new(ChannelReader {
                        rx,
                        chunk: Vec::new(),
                        at: 0,
                    })),
                    stderr: None,
                    handle: Box::new(PodWorker {
                        runtime: runtime.clone(),
                        api: api.clone(),
                        pod: p.pod.clone(),
                    }),
                    place: Some(format!("pod {} on node {}", p.pod, p.node)),
                }
            })
            .collect();
        running.pods = pods;
        Ok((sources, running))
    }
}

impl JobObject {
    /// The Job's manifest.
    fn job(
        &self,
        wire: &PlanWire,
        active_for: Duration,
    ) -> Result<serde_json::Value, ClusterError> {
        let n = self.spec.workers;
        let plan = serde_json::to_string(wire).map_err(|e| ClusterError::Api(e.to_string()))?;
        let labels = json!({ MANAGED_BY: TOOL, RUN_LABEL: self.run_id, ROLE_LABEL: ROLE });
        let mut pod = json!({
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": GRACE_S,
            // As the backends: what the "restricted" Pod Security Standard asks.
            "securityContext": { "runAsNonRoot": true, "seccompProfile": { "type": "RuntimeDefault" } },
            "containers": [{
                "name": CONTAINER,
                "image": self.image,
                "args": ["worker"],
                "securityContext": { "allowPrivilegeEscalation": false, "capabilities": { "drop": ["ALL"] } },
                "env": [
                    { "name": PLAN_ENV, "value": plan },
                    { "name": POD_ENV, "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                ],
            }],
        });
        if self.spec.host_network {
            pod["hostNetwork"] = json!(true);
            pod["dnsPolicy"] = json!("ClusterFirstWithHostNet");
        }
        self.place(&mut pod)?;
        Ok(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": { "name": JOB_NAME, "namespace": self.namespace, "labels": labels },
            "spec": {
                "completionMode": "Indexed",
                "completions": n, "parallelism": n,
                // A worker that fails is reported as such; a second one for its index
                // would send its share twice.
                "backoffLimitPerIndex": 0,
                "podReplacementPolicy": "Failed",
                "activeDeadlineSeconds": active_for.as_secs().max(1),
                "ttlSecondsAfterFinished": TTL_S,
                "template": { "metadata": { "labels": labels }, "spec": pod },
            },
        }))
    }

    /// Sets the pod spec's affinity or node selector from the placement.
    fn place(&self, pod: &mut serde_json::Value) -> Result<(), ClusterError> {
        let on_nodes_of = |selector: serde_json::Value, namespace: &str| {
            json!([{ "labelSelector": selector, "namespaces": [namespace],
                     "topologyKey": "kubernetes.io/hostname" }])
        };
        let backends = json!({
            "matchLabels": { RUN_LABEL: self.run_id },
            "matchExpressions": [{ "key": POOL_LABEL, "operator": "Exists" }],
        });
        match &self.spec.placement {
            Placement::Any => {}
            Placement::SameAsBackends => {
                pod["affinity"] = json!({ "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": on_nodes_of(backends, &self.namespace) } });
            }
            Placement::OtherThanBackends => {
                pod["affinity"] = json!({ "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": on_nodes_of(backends, &self.namespace) } });
            }
            Placement::SameAsIngress => {
                let Some((namespace, labels)) = &self.spec.ingress_pods else {
                    return Err(ClusterError::Api(
                        "placement same_as_ingress: the controller's pods are not known (its cluster-file target needs `service:`, whose selector names them)".into(),
                    ));
                };
                pod["affinity"] = json!({ "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution":
                        on_nodes_of(json!({ "matchLabels": labels }), namespace) } });
            }
            Placement::Nodes(labels) => pod["nodeSelector"] = json!(labels),
        }
        Ok(())
    }
}

/// Waits until every index has a pod that runs (or already ended), and says where each
/// is; a pod that cannot start is an error naming it and why.
async fn wait_for_pods(
    client: &Client,
    namespace: &str,
    workers: usize,
    (give_up, stop): (Instant, &std::sync::atomic::AtomicBool),
) -> Result<Vec<WorkerPod>, ClusterError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{JOB_NAME_LABEL}={JOB_NAME}");
    let mut unschedulable_since: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(ClusterError::Api(
                "stopped before the load workers started".into(),
            ));
        }
        let list = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| ClusterError::Api(format!("listing the load Job's pods: {e}")))?;
        let mut found: Vec<Option<WorkerPod>> = vec![None; workers];
        let mut waiting = Vec::new();
        for pod in &list.items {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let Some(index) = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(INDEX_ANNOTATION))
                .and_then(|i| i.parse::<usize>().ok())
                .filter(|i| *i < workers)
            else {
                continue;
            };
            let status = pod.status.clone().unwrap_or_default();
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            if let Some(why) = cannot_start(&status) {
                return Err(ClusterError::Api(format!(
                    "load worker {index} (pod {namespace}/{name}) cannot start: {why}"
                )));
            }
            if let Some(why) = unschedulable(&status) {
                let since = *unschedulable_since
                    .entry(name.clone())
                    .or_insert_with(Instant::now);
                if since.elapsed() > UNSCHEDULABLE_GRACE {
                    return Err(ClusterError::Api(format!(
                        "load worker {index} (pod {namespace}/{name}) cannot be placed: {why}; change load.placement, or give the cluster a node that fits"
                    )));
                }
            }
            match (status.phase.as_deref(), node) {
                (Some("Running" | "Succeeded" | "Failed"), Some(node)) => {
                    found[index].get_or_insert(WorkerPod {
                        index,
                        pod: name,
                        node,
                    });
                }
                (phase, _) => {
                    waiting.push(format!("{name} ({})", phase.unwrap_or("not yet reported")))
                }
            }
        }
        if found.iter().all(Option::is_some) {
            return Ok(found.into_iter().flatten().collect());
        }
        if Instant::now() > give_up {
            let missing: Vec<String> = found
                .iter()
                .enumerate()
                .filter(|(_, f)| f.is_none())
                .map(|(i, _)| i.to_string())
                .collect();
            return Err(ClusterError::Api(format!(
                "load worker(s) {} did not start within {START_WAIT:?} of the common start (pods: {}); a cluster that needs longer (an image to pull) needs a longer load.start_margin",
                missing.join(", "),
                if waiting.is_empty() { "none made yet".into() } else { waiting.join(", ") }
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The reason a pod's container cannot start without a change, if it has one.
fn cannot_start(status: &k8s_openapi::api::core::v1::PodStatus) -> Option<String> {
    status.container_statuses.iter().flatten().find_map(|c| {
        let w = c.state.as_ref()?.waiting.as_ref()?;
        let reason = w.reason.as_deref()?;
        CANNOT_START
            .contains(&reason)
            .then(|| format!("{reason}: {}", w.message.as_deref().unwrap_or_default()))
    })
}

/// The scheduler's message, if it calls the pod unschedulable.
fn unschedulable(status: &k8s_openapi::api::core::v1::PodStatus) -> Option<String> {
    status.conditions.iter().flatten().find_map(|c| {
        (c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable"))
        .then(|| c.message.clone().unwrap_or_else(|| "unschedulable".into()))
    })
}

/// Follows `pod`'s log to its end, sending each line (with its newline). If the stream
/// breaks while the pod still runs, it is opened again and the lines already sent are
/// skipped (a log is read from its start).
async fn follow(api: Api<Pod>, pod: String, tx: mpsc::Sender<Vec<u8>>) {
    let params = LogParams {
        container: Some(CONTAINER.into()),
        follow: true,
        ..LogParams::default()
    };
    let mut sent = 0usize;
    for _attempt in 0..10 {
        if let Ok(stream) = api.log_stream(&pod, &params).await {
            let mut lines = stream.lines().enumerate();
            while let Some((i, line)) = lines.next().await {
                let Ok(mut line) = line else { break };
                if i < sent {
                    continue;
                }
                sent = i + 1;
                line.push('\n');
                if tx.send(line.into_bytes()).is_err() {
                    return;
                }
            }
        }
        // Ended: done if the pod has (or is gone), else the stream broke.
        match api.get_opt(&pod).await {
            Ok(Some(p)) if !ended(&p) => tokio::time::sleep(POLL).await,
            _ => return,
        }
    }
}

/// Whether a pod whose log stream ended has ended: its container has, or it is being
/// deleted.
fn ended(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    pod.metadata.deletion_timestamp.is_some()
        || matches!(
            status.and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
        || terminated(pod).is_some()
}

/// Its container's end, if it ended.
fn terminated(pod: &Pod) -> Option<k8s_openapi::api::core::v1::ContainerStateTerminated> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .clone()
}

/// A followed log as a reader: the chunks its task sends, then the end.
struct ChannelReader {
    rx: mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.rx.recv() {
                Ok(chunk) => {
                    self.chunk = chunk;
                    self.at = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A worker as a pod: stopped by deleting the pod (SIGTERM, then its grace period).
struct PodWorker {
    runtime: Arc<tokio::runtime::Runtime>,
    api: Api<Pod>,
    pod: String,
}

impl PodWorker {
    fn delete(&self, grace: u32) {
        let params = DeleteParams {
            grace_period_seconds: Some(grace),
            ..DeleteParams::default()
        };
        let _ = self.runtime.block_on(self.api.delete(&self.pod, &params));
    }
}

impl WorkerHandle for PodWorker {
    fn interrupt(&mut self) {
        self.delete(GRACE_S);
    }

    fn kill(&mut self) {
        self.delete(0);
    }

    /// Called once its log has ended: how its container ended, as the node reported it.
    fn wait(&mut self) -> String {
        // The node reports the end within a moment of the log's.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let pod = match self.runtime.block_on(self.api.get_opt(&self.pod)) {
                Ok(Some(pod)) => pod,
                Ok(None) => return "pod deleted".into(),
                Err(e) => return format!("pod cannot be read: {e}"),
            };
            match (terminated(&pod), pod.metadata.deletion_timestamp.is_some()) {
                (Some(t), _) if t.exit_code > 128 => {
                    return format!("killed by signal {}", t.exit_code - 128)
                }
                (Some(t), _) => return format!("exit {}", t.exit_code),
                (None, true) => return "pod deleted".into(),
                (None, false) if Instant::now() > deadline => {
                    return "its log ended but the pod is not reported ended".into()
                }
                (None, false) => std::thread::sleep(POLL),
            }
        }
    }
}

impl Drop for RunningJob {
    fn drop(&mut self) {
        let api: Api<Job> = Api::namespaced(self.api.client(), &self.namespace);
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        let _ = self.api.run(api.delete(JOB_NAME, &params));
    }
}

impl std::fmt::Debug for RunningJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningJob")
            .field("namespace", &self.namespace)
            .field("pods", &self.pods)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(placement: Placement, host_network: bool) -> serde_json::Value {
        let plan = ingressbench_load::Plan::new(
            ingressbench_load::Target::parse("http://127.0.0.1:8080/").unwrap(),
        );
        let wire = PlanWire::of(&plan, 0, 3, SystemTime::now());
        JobObject {
            namespace: "ib-run-1".into(),
            run_id: "run-1".into(),
            image: "registry.example/ingressbench:0.1".into(),
            spec: FleetSpec {
                workers: 3,
                placement,
                host_network,
                ingress_pods: Some((
                    "ingress".into(),
                    BTreeMap::from([("app".into(), "traefik".into())]),
                )),
            },
        }
        .job(&wire, Duration::from_secs(90))
        .unwrap()
    }

    #[test]
    fn the_job_runs_one_indexed_pod_per_worker_that_nothing_replaces_or_outlives() {
        let j = job(Placement::Any, false);
        let spec = &j["spec"];
        assert_eq!(spec["completionMode"], "Indexed");
        assert_eq!(
            (spec["completions"].clone(), spec["parallelism"].clone()),
            (3.into(), 3.into())
        );
        assert_eq!(spec["backoffLimitPerIndex"], 0);
        assert_eq!(spec["podReplacementPolicy"], "Failed");
        assert_eq!(spec["activeDeadlineSeconds"], 90);
        assert_eq!(spec["ttlSecondsAfterFinished"], TTL_S);
        let pod = &spec["template"]["spec"];
        assert_eq!(pod["restartPolicy"], "Never");
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert!(pod.get("affinity").is_none() && pod.get("hostNetwork").is_none());
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "registry.example/ingressbench:0.1");
        assert_eq!(c["args"], serde_json::json!(["worker"]));
        let plan: PlanWire = serde_json::from_str(c["env"][0]["value"].as_str().unwrap()).unwrap();
        assert_eq!((plan.index, plan.of), (0, 3));
        assert_eq!(c["env"][0]["name"], PLAN_ENV);
        // Its pods carry the run's labels but no pool's, so no backend selector takes them.
        let labels = &spec["template"]["metadata"]["labels"];
        assert_eq!(labels[RUN_LABEL], "run-1");
        assert_eq!(labels[ROLE_LABEL], ROLE);
        assert!(labels.get(POOL_LABEL).is_none());
    }

    #[test]
    fn each_placement_is_the_affinity_or_selector_it_names() {
        let term = |j: &serde_json::Value, kind: &str| {
            j["spec"]["template"]["spec"]["affinity"][kind]
                ["requiredDuringSchedulingIgnoredDuringExecution"][0]
                .clone()
        };
        let near = term(&job(Placement::SameAsBackends, false), "podAffinity");
        assert_eq!(near["topologyKey"], "kubernetes.io/hostname");
        assert_eq!(near["namespaces"], serde_json::json!(["ib-run-1"]));
        assert_eq!(near["labelSelector"]["matchLabels"][RUN_LABEL], "run-1");
        assert_eq!(
            near["labelSelector"]["matchExpressions"][0]["key"],
            POOL_LABEL
        );
        let away = term(&job(Placement::OtherThanBackends, false), "podAntiAffinity");
        assert_eq!(away["labelSelector"], near["labelSelector"]);
        let ingress = term(&job(Placement::SameAsIngress, false), "podAffinity");
        assert_eq!(ingress["namespaces"], serde_json::json!(["ingress"]));
        assert_eq!(
            ingress["labelSelector"],
            serde_json::json!({ "matchLabels": { "app": "traefik" } })
        );
        let nodes = job(
            Placement::Nodes(BTreeMap::from([("disktype".into(), "ssd".into())])),
            true,
        );
        let pod = &nodes["spec"]["template"]["spec"];
        assert_eq!(
            pod["nodeSelector"],
            serde_json::json!({ "disktype": "ssd" })
        );
        assert_eq!(pod["hostNetwork"], true);
        assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    }
}
