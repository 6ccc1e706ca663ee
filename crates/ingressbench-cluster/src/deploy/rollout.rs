//! A controller restarted as `kubectl rollout restart` restarts it: its Deployment's or
//! DaemonSet's pod template gets the annotation `kubectl.kubernetes.io/restartedAt`, and
//! the workload's own controller replaces every pod by its update strategy; or upgraded
//! (`helm upgrade`, or its image changed), which rolls its workloads the same way. Read
//! back: when the first new pod was ready, and when the rollout was complete (what
//! `kubectl rollout status` waits for: every replica updated and available, no old one
//! left).

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::Api;

use super::{api_error, RunNamespace};
use crate::file::{Upgrade, UpgradeBy};
use crate::ClusterError;

/// The annotation `kubectl rollout restart` sets.
pub const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

/// A rollout restart asked for.
#[derive(Clone, Debug)]
pub struct Rollout {
    /// `Deployment` or `DaemonSet`.
    pub kind: &'static str,
    /// The namespace of the Deployment or DaemonSet rolled out.
    pub namespace: String,
    /// The Deployment's or DaemonSet's name.
    pub name: String,
    /// The workload's generation the restart made.
    generation: i64,
    /// Its pods' label selector.
    selector: String,
    /// Its pods before the restart.
    pub before: BTreeSet<String>,
}

/// Where a rollout is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolloutState {
    /// The new pods that are ready, by name.
    pub new_ready: Vec<String>,
    /// The pods of before that are gone (or being deleted).
    pub old_gone: Vec<String>,
    /// Every replica updated and available, and no old one left.
    pub complete: bool,
}

impl RunNamespace {
    /// Restarts a workload as `kubectl rollout restart` does.
    pub fn rollout_restart(
        &self,
        kind: &'static str,
        namespace: &str,
        name: &str,
    ) -> Result<Rollout, ClusterError> {
        let mut rollout = self.followed(kind, namespace, name)?;
        let what = format!("{kind} {namespace}/{name}");
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let patch = serde_json::json!({ "spec": { "template": { "metadata": { "annotations": { RESTARTED_AT: now } } } } });
        let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
        let restart = |e| {
            api_error(
                &format!("restarting {what} (a patch of its pod template)"),
                e,
            )
        };
        let metadata = match kind {
            "Deployment" => {
                self.api
                    .runtime
                    .block_on(
                        Api::<Deployment>::namespaced(self.api.client.clone(), namespace)
                            .patch(name, &params, &patch),
                    )
                    .map_err(restart)?
                    .metadata
            }
            _ => {
                self.api
                    .runtime
                    .block_on(
                        Api::<DaemonSet>::namespaced(self.api.client.clone(), namespace)
                            .patch(name, &params, &patch),
                    )
                    .map_err(restart)?
                    .metadata
            }
        };
        rollout.generation = metadata.generation.unwrap_or_default();
        Ok(rollout)
    }

    /// Upgrades the controller to `version` as `upgrade` says (`helm upgrade`, or its
    /// image changed); the rollouts of the workloads it rolls, each followed from the pods
    /// it had before and the next generation of its spec.
    pub fn upgrade(&self, upgrade: &Upgrade, version: &str) -> Result<Vec<Rollout>, ClusterError> {
        let rollouts = upgrade
            .follow
            .iter()
            .map(|(kind, namespace, name)| self.followed(kind, namespace, name))
            .collect::<Result<Vec<_>, _>>()?;
        match &upgrade.by {
            UpgradeBy::Helm {
                binary,
                release,
                namespace,
                chart,
                chart_version,
            } => {
                let chart = chart.replace("{version}", version);
                let mut helm = std::process::Command::new(binary);
                // The user's values kept over the new chart's defaults: `--reuse-values`
                // would keep the old chart's defaults too (its image tags: measured, the
                // controller stayed at the old version).
                helm.args(["upgrade", release, &chart, "--namespace", namespace])
                    .arg("--reset-then-reuse-values")
                    .args(
                        chart_version.iter().flat_map(|v| {
                            ["--version".to_owned(), v.replace("{version}", version)]
                        }),
                    )
                    .arg("--kubeconfig")
                    .arg(self.api.kubeconfig());
                if let Some(context) = self.api.context() {
                    helm.args(["--kube-context", context]);
                }
                let out = helm.output().map_err(|e| {
                    ClusterError::Api(format!(
                        "running {} for the upgrade: {e} (install Helm, or give `upgrade.helm.binary`)",
                        binary.display()
                    ))
                })?;
                if !out.status.success() {
                    let said = String::from_utf8_lossy(&out.stderr);
                    return Err(ClusterError::Api(format!(
                        "helm upgrade {namespace}/{release} to {chart} failed ({}): {}",
                        out.status,
                        said.trim()
                    )));
                }
            }
            UpgradeBy::Image {
                namespace,
                deployment,
                container,
                image,
            } => {
                let image = image.replace("{version}", version);
                let patch = serde_json::json!({ "spec": { "template": { "spec": { "containers": [{ "name": container, "image": image }] } } } });
                self.api
                    .runtime
                    .block_on(
                        Api::<Deployment>::namespaced(self.api.client.clone(), namespace).patch(
                            deployment,
                            &PatchParams::default(),
                            &Patch::Strategic(&patch),
                        ),
                    )
                    .map_err(|e| {
                        api_error(
                            &format!(
                                "upgrading Deployment {namespace}/{deployment} (its container {container}'s image to {image})"
                            ),
                            e,
                        )
                    })?;
            }
        }
        Ok(rollouts)
    }

    /// A workload to follow through a change of its pod template: its pods now, and its
    /// next generation (the change's, whoever makes it).
    fn followed(
        &self,
        kind: &'static str,
        namespace: &str,
        name: &str,
    ) -> Result<Rollout, ClusterError> {
        let what = format!("{kind} {namespace}/{name}");
        let read = |e| api_error(&format!("reading {what}"), e);
        let (selector, generation) = match kind {
            "Deployment" => {
                let d = self
                    .api
                    .runtime
                    .block_on(
                        Api::<Deployment>::namespaced(self.api.client.clone(), namespace).get(name),
                    )
                    .map_err(read)?;
                (d.spec.unwrap_or_default().selector, d.metadata.generation)
            }
            _ => {
                let d = self
                    .api
                    .runtime
                    .block_on(
                        Api::<DaemonSet>::namespaced(self.api.client.clone(), namespace).get(name),
                    )
                    .map_err(read)?;
                (d.spec.unwrap_or_default().selector, d.metadata.generation)
            }
        };
        let selector: Vec<String> = selector
            .match_labels
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if selector.is_empty() {
            return Err(ClusterError::Api(format!(
                "{what} selects its pods by expressions only; its pods cannot be followed (give its matchLabels)"
            )));
        }
        let mut rollout = Rollout {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            generation: generation.unwrap_or_default() + 1,
            selector: selector.join(","),
            before: BTreeSet::new(),
        };
        // Every pod after the change that is not one of these is new.
        rollout.before = self
            .workload_pods(&rollout)?
            .into_iter()
            .filter(|(_, _, terminating)| !terminating)
            .map(|(name, _, _)| name)
            .collect();
        Ok(rollout)
    }

    /// Where `rollout` is now.
    pub fn rollout_state(&self, rollout: &Rollout) -> Result<RolloutState, ClusterError> {
        let pods = self.workload_pods(rollout)?;
        let live: BTreeSet<&String> = pods
            .iter()
            .filter(|(_, _, terminating)| !terminating)
            .map(|(n, _, _)| n)
            .collect();
        let new_ready = pods
            .iter()
            .filter(|(n, ready, terminating)| *ready && !terminating && !rollout.before.contains(n))
            .map(|(n, _, _)| n.clone())
            .collect();
        let old_gone: Vec<String> = rollout
            .before
            .iter()
            .filter(|n| !live.contains(n))
            .cloned()
            .collect();
        let what = format!("{} {}/{}", rollout.kind, rollout.namespace, rollout.name);
        let client = self.api.client.clone();
        let done = self.api.runtime.block_on(async {
            let read = |e| api_error(&format!("reading {what}"), e);
            Ok::<_, ClusterError>(match rollout.kind {
                "Deployment" => {
                    let api: Api<Deployment> = Api::namespaced(client, &rollout.namespace);
                    let d = api.get(&rollout.name).await.map_err(read)?;
                    let wanted = d.spec.and_then(|s| s.replicas).unwrap_or(1);
                    let s = d.status.unwrap_or_default();
                    s.observed_generation.unwrap_or_default() >= rollout.generation
                        && s.updated_replicas.unwrap_or_default() == wanted
                        && s.replicas.unwrap_or_default() == wanted
                        && s.available_replicas.unwrap_or_default() == wanted
                }
                _ => {
                    let api: Api<DaemonSet> = Api::namespaced(client, &rollout.namespace);
                    let s = api
                        .get(&rollout.name)
                        .await
                        .map_err(read)?
                        .status
                        .unwrap_or_default();
                    s.observed_generation.unwrap_or_default() >= rollout.generation
                        && s.updated_number_scheduled.unwrap_or_default()
                            == s.desired_number_scheduled
                        && s.number_available.unwrap_or_default() == s.desired_number_scheduled
                }
            })
        })?;
        Ok(RolloutState {
            new_ready,
            // Complete when its status says so and the pods agree: none of before is left.
            complete: done && old_gone.len() == rollout.before.len(),
            old_gone,
        })
    }

    /// The workload's pods: name, ready, being deleted.
    fn workload_pods(&self, rollout: &Rollout) -> Result<Vec<(String, bool, bool)>, ClusterError> {
        let api: Api<Pod> = Api::namespaced(self.api.client.clone(), &rollout.namespace);
        let list = self
            .api
            .runtime
            .block_on(api.list(&ListParams::default().labels(&rollout.selector)))
            .map_err(|e| {
                api_error(
                    &format!(
                        "listing the pods of {} {}/{}",
                        rollout.kind, rollout.namespace, rollout.name
                    ),
                    e,
                )
            })?;
        Ok(list
            .items
            .into_iter()
            .map(|p| {
                let ready = p
                    .status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                (
                    p.metadata.name.unwrap_or_default(),
                    ready,
                    p.metadata.deletion_timestamp.is_some(),
                )
            })
            .collect())
    }
}
