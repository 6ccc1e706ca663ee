//! A cluster file's `upgrade:` of a target: how its controller is taken to a version.

use std::path::PathBuf;

use serde::Deserialize;

use super::{Restart, RestartVia};

/// How a controller is upgraded to a version: `helm upgrade` of its release to that
/// version's chart (its values kept), or a change of its Deployment's container image, as
/// a chart's upgrade makes it. `{version}` in the chart or the image is the event's
/// version. The workloads the upgrade rolls are followed for its times (applied when the
/// first one's first new pod is ready, complete when every one's rollout is); by default
/// the Deployment whose image changes.
///
/// ```yaml
/// upgrade:
///   helm: { release: eg, namespace: envoy-gateway-system, chart: "charts/gateway-helm-{version}.tgz" }
///   follow: [{ deployment: envoy-gateway, namespace: envoy-gateway-system }]
/// upgrade:
///   image: { deployment: envoy-gateway, namespace: envoy-gateway-system, container: envoy-gateway,
///            image: "docker.io/envoyproxy/gateway:v{version}" }
/// ```
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UpgradeVia {
    /// A Helm release upgraded to another chart.
    #[serde(default)]
    pub helm: Option<HelmUpgrade>,
    /// Or a container's image changed.
    #[serde(default)]
    pub image: Option<ImageUpgrade>,
    /// The workloads the upgrade rolls, in the order their rollouts are told.
    #[serde(default)]
    pub follow: Vec<RestartVia>,
}

/// `helm upgrade RELEASE CHART --namespace NAMESPACE --reset-then-reuse-values` (Helm
/// 3.14 or later: the release's own values over the new chart's defaults).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HelmUpgrade {
    /// The release.
    pub release: String,
    /// Its namespace.
    pub namespace: String,
    /// The chart of the version (a directory, an archive or a reference), with
    /// `{version}` where the version goes.
    pub chart: String,
    /// For a chart from a repository or registry: its `--version`, with `{version}`
    /// (`v{version}` for Envoy Gateway's `oci://docker.io/envoyproxy/gateway-helm`).
    #[serde(default)]
    pub chart_version: Option<String>,
    /// The `helm` binary (default: `helm` on the PATH).
    #[serde(default)]
    pub binary: Option<PathBuf>,
}

/// A Deployment's container given another image.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ImageUpgrade {
    /// The Deployment.
    pub deployment: String,
    /// Its namespace.
    pub namespace: String,
    /// The container.
    pub container: String,
    /// The image of the version, with `{version}` where the version goes.
    pub image: String,
}

/// An upgrade, checked: how, and the workloads it rolls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgrade {
    /// What is changed.
    pub by: UpgradeBy,
    /// The workloads followed (kind, namespace, name), at least one.
    pub follow: Vec<(&'static str, String, String)>,
}

/// What an upgrade changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpgradeBy {
    /// A Helm release: the binary, the release, its namespace, the chart with
    /// `{version}`.
    Helm {
        /// The `helm` binary.
        binary: PathBuf,
        /// The release.
        release: String,
        /// Its namespace.
        namespace: String,
        /// The chart, with `{version}`.
        chart: String,
        /// Its `--version`, with `{version}`.
        chart_version: Option<String>,
    },
    /// A Deployment's container's image.
    Image {
        /// The Deployment's namespace.
        namespace: String,
        /// The Deployment.
        deployment: String,
        /// The container.
        container: String,
        /// The image, with `{version}`.
        image: String,
    },
}

impl UpgradeBy {
    /// What it is, for a version.
    pub fn describe(&self, version: &str) -> String {
        match self {
            UpgradeBy::Helm {
                release, namespace, ..
            } => format!("upgrade to {version}: helm upgrade {namespace}/{release}"),
            UpgradeBy::Image {
                namespace,
                deployment,
                container,
                image,
            } => format!(
                "upgrade to {version}: image of Deployment {namespace}/{deployment} container {container} to {}",
                image.replace("{version}", version)
            ),
        }
    }
}

impl UpgradeVia {
    /// What it names, or what is wrong with it.
    pub fn checked(&self) -> Result<Upgrade, String> {
        let mut follow = Vec::new();
        for (i, f) in self.follow.iter().enumerate() {
            match f.checked().map_err(|e| format!("follow[{i}]: {e}"))? {
                Restart::Rollout {
                    kind,
                    namespace,
                    name,
                } => follow.push((kind, namespace, name)),
                Restart::Local { .. } => {
                    return Err(format!(
                        "follow[{i}]: name a Deployment or DaemonSet and its namespace"
                    ))
                }
            }
        }
        let by = match (&self.helm, &self.image) {
            (Some(h), None) => UpgradeBy::Helm {
                binary: h.binary.clone().unwrap_or_else(|| PathBuf::from("helm")),
                release: h.release.clone(),
                namespace: h.namespace.clone(),
                chart: h.chart.clone(),
                chart_version: h.chart_version.clone(),
            },
            (None, Some(i)) => {
                if follow.is_empty() {
                    follow.push(("Deployment", i.namespace.clone(), i.deployment.clone()));
                }
                UpgradeBy::Image {
                    namespace: i.namespace.clone(),
                    deployment: i.deployment.clone(),
                    container: i.container.clone(),
                    image: i.image.clone(),
                }
            }
            _ => return Err("give one of `helm` (a release upgraded to the version's chart) and `image` (a Deployment's container image changed)".into()),
        };
        if follow.is_empty() {
            return Err("give the workloads the upgrade rolls in `follow` (e.g. `[{ deployment: NAME, namespace: NS }]`): its times are theirs".into());
        }
        Ok(Upgrade { by, follow })
    }
}
