//! What the node agent tells the API of a pod: running and ready, crashed, ended, or
//! waiting with the kubelet's reason.

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;

use super::{api, last_line, now, ContainerRun, Running, State};
use crate::ClusterError;

impl State {
    /// Reports pod `i` Running, ready or not.
    pub(super) async fn report_pod(&self, i: usize, ready: bool) -> Result<(), ClusterError> {
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
            "containerStatuses": r.containers.iter().map(|c| json!({
                "name": c.name, "ready": ready, "started": true, "restartCount": 0,
                "image": c.image, "imageID": c.image,
                "state": { "running": { "startedAt": now } },
            })).collect::<Vec<_>>(),
        }});
        self.patch_pod_status(i, &status).await
    }

    /// Reports pod `i` not ready, each container that has exited waiting in
    /// `CrashLoopBackOff` (its exit code as its last state, the message naming it and
    /// its log's last line), the others running.
    pub(super) async fn report_crash(&self, i: usize) -> Result<(), ClusterError> {
        let r = &self.pods[i];
        let now = now();
        let statuses: Vec<serde_json::Value> = r
            .containers
            .iter()
            .map(|c| {
                let mut status = json!({
                    "name": c.name, "ready": false, "started": c.exit.is_none(),
                    "restartCount": 0, "image": c.image, "imageID": c.image,
                    "state": { "running": { "startedAt": now } },
                });
                if let Some(code) = c.code() {
                    let last = last_line(&c.log);
                    status["state"] = json!({ "waiting": { "reason": "CrashLoopBackOff",
                        "message": format!("container {} exited with code {code}; its log ends: {last}", c.name) } });
                    status["lastState"] = json!({ "terminated": {
                        "exitCode": code, "reason": "Error", "finishedAt": now } });
                }
                status
            })
            .collect();
        let status = json!({ "status": {
            "conditions": [
                { "type": "ContainersReady", "status": "False", "lastTransitionTime": now },
                { "type": "Ready", "status": "False", "lastTransitionTime": now },
            ],
            "containerStatuses": statuses,
        }});
        self.patch_pod_status(i, &status).await
    }

    /// Reports pod `i`'s containers ended: the pod `Succeeded` when each exited 0,
    /// `Failed` otherwise (a signal is exit 128 + its number, as a container runtime
    /// says).
    pub(super) async fn report_end(&self, i: usize) -> Result<(), ClusterError> {
        let r = &self.pods[i];
        let now = now();
        let code_of = |c: &ContainerRun| c.code().unwrap_or(1);
        let phase = if r.containers.iter().all(|c| code_of(c) == 0) {
            "Succeeded"
        } else {
            "Failed"
        };
        let statuses: Vec<serde_json::Value> = r
            .containers
            .iter()
            .map(|c| {
                let code = code_of(c);
                let reason = if code == 0 { "Completed" } else { "Error" };
                json!({
                    "name": c.name, "ready": false, "started": false, "restartCount": 0,
                    "image": c.image, "imageID": c.image,
                    "state": { "terminated": { "exitCode": code, "reason": reason, "finishedAt": now } },
                })
            })
            .collect();
        let status = json!({ "status": {
            "phase": phase,
            "conditions": [
                { "type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now },
                { "type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now },
            ],
            "containerStatuses": statuses,
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

    /// Says in the pod's status that `container` waits, and why (`reason` as the
    /// kubelet's: `ContainerCreating`, `CreateContainerConfigError`).
    pub(super) async fn report_waiting(
        &self,
        pod: &Running,
        container: &Container,
        reason: &str,
        message: &str,
    ) -> Result<(), ClusterError> {
        let image = container.image.as_deref().unwrap_or_default();
        let status = json!({ "status": { "phase": "Pending", "containerStatuses": [{
            "name": container.name, "ready": false, "restartCount": 0, "image": image, "imageID": "",
            "state": { "waiting": { "reason": reason, "message": message } } }] } });
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        pods.patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map(|_| ())
            .map_err(api)
    }

    /// A pod that cannot start until it is changed: its status says why, and it is kept
    /// as known, so that it is not tried again every poll.
    pub(super) async fn wait_for_good(
        &mut self,
        pod: Running,
        container: &Container,
        reason: &str,
        message: &str,
    ) -> Result<(), ClusterError> {
        self.report_waiting(&pod, container, reason, message)
            .await?;
        self.pods.push(pod);
        Ok(())
    }
}
