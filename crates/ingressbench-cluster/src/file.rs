//! The cluster file: *where* a scenario's targets run when it is run with `--cluster`
//! (the scenario says *what* is measured). Unknown keys are errors.
//!
//! ```yaml
//! context: my-aks              # optional; else the kubeconfig's current context
//! namespace_prefix: ingressbench
//! image: registry.example/ingressbench:0.1.0   # what the backend pods run
//! targets:
//!   traefik:
//!     ingress_class: traefik
//!     address: http://ingress.example.com      # or: service: { name, namespace }
//!     tls_address: https://ingress.example.com # for scenarios with `tls: true`
//!   traefik-gateway:                           # routes as an HTTPRoute instead
//!     gateway: { name: traefik, namespace: kube-system, listener: web, tls_listener: websecure }
//!     address: http://gateway.example.com
//!     tls_address: https://gateway.example.com
//!     ca: gateway-ca.pem   # what signed the HTTPS listener's certificate (relative: to this file)
//!     cluster_address: http://traefik.kube-system.svc   # where pods reach it (load.from: cluster);
//!                                                        # default: address / tls_address
//!     restart: { deployment: traefik, namespace: kube-system }   # what a `restart` event rolls
//! workers:                 # how `load.from: cluster` runs its pods
//!   host_network: false    # true: on the nodes' network (the local cluster's controllers
//!                          # listen on the host's loopback)
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::ClusterError;

mod upgrade;
pub use upgrade::{HelmUpgrade, ImageUpgrade, Upgrade, UpgradeBy, UpgradeVia};

/// A cluster file as written.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// The kubeconfig context (default: the current one).
    #[serde(default)]
    pub context: Option<String>,
    /// The prefix of every namespace a run makes.
    #[serde(default = "default_prefix")]
    pub namespace_prefix: String,
    /// The image the backend pods run.
    #[serde(default = "default_image")]
    pub image: String,
    /// The image of the Envoy sidecar a scenario's `hop` puts beside each backend.
    #[serde(default = "default_sidecar_image")]
    pub sidecar_image: String,
    /// Each target of the scenario: how its controller is selected and reached.
    pub targets: BTreeMap<String, ClusterTarget>,
    /// How the pods of `load.from: cluster` run here.
    #[serde(default)]
    pub workers: WorkersFile,
}

/// How load pods run in this cluster.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WorkersFile {
    /// On the nodes' network (`hostNetwork`) rather than the pods'.
    #[serde(default)]
    pub host_network: bool,
}

/// One controller under test.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterTarget {
    /// The IngressClass its Ingress objects name.
    #[serde(default)]
    pub ingress_class: Option<String>,
    /// Or the Gateway its HTTPRoutes attach to (Gateway API).
    #[serde(default)]
    pub gateway: Option<GatewayRef>,
    /// Where its plain HTTP traffic enters (`http://host[:port]`; an `https://` one serves
    /// for TLS scenarios instead).
    #[serde(default)]
    pub address: Option<String>,
    /// Where its TLS traffic enters (`https://host[:port]`), for scenarios with `tls: true`.
    #[serde(default)]
    pub tls_address: Option<String>,
    /// Whether its TLS address also takes HTTP/3 (QUIC on the UDP port of the same
    /// number), as its controller serves it once asked (Envoy Gateway: a
    /// ClientTrafficPolicy with `http3: {}`; Traefik: its entry point's `http3`). A cell
    /// with `load.protocol: http3` goes only to a target that says so.
    #[serde(default)]
    pub http3: bool,
    /// Or the LoadBalancer Service whose status gives the address.
    #[serde(default)]
    pub service: Option<ServiceRef>,
    /// Where pods reach its plain HTTP (`load.from: cluster`), if not where this machine
    /// does: a ClusterIP Service's name, say.
    #[serde(default)]
    pub cluster_address: Option<String>,
    /// And its TLS.
    #[serde(default)]
    pub cluster_tls_address: Option<String>,
    /// For a gateway target over TLS: the CA certificate (PEM) that signed its HTTPS
    /// listener's certificate, which the Gateway's owner chose (an Ingress target's
    /// certificate is the run's own, in a Secret it makes).
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// The `kubernetes.io/tls` Secret with the client certificate the controller is
    /// configured to present to every upstream (Contour's `tls.envoy-client-certificate`),
    /// whose `ca.crt` a mesh's sidecars then accept: what a `hop` with mutual TLS needs of a
    /// controller that takes no certificate per route.
    #[serde(default)]
    pub mesh_client: Option<ServiceRef>,
    /// A controller of the local cluster (`cluster local up` writes it): the process
    /// groups whose CPU and memory a run reads from `/proc` on this machine.
    #[serde(default)]
    pub local_pids: Option<LocalPids>,
    /// A controller on other machines: the pods whose CPU and memory a run reads through
    /// the API (the controller's own Prometheus endpoint, or the metrics API).
    #[serde(default)]
    pub usage: Option<TargetUsage>,
    /// What a scenario's `restart` event restarts (none: the event is refused, naming
    /// this).
    #[serde(default)]
    pub restart: Option<RestartVia>,
    /// How a scenario's `upgrade: VERSION` event upgrades the controller (none: the event
    /// is refused, naming this).
    #[serde(default)]
    pub upgrade: Option<UpgradeVia>,
    /// Where what the controller's proxy itself counted (failed connects to backends,
    /// 5xx, …) is read once a second: a socket on this machine (a local cluster's
    /// controller; `cluster local up` writes it), or its pods' Prometheus endpoint.
    #[serde(default)]
    pub counters: Option<CountersVia>,
}

/// Where a controller's proxy keeps its counts: its Envoy's admin interface or its
/// HAProxy's runtime API, each a Unix socket on this machine; or, on a cluster whose
/// machines are elsewhere, its pods' Prometheus endpoint through the API server's pod
/// proxy.
///
/// ```yaml
/// counters: { envoy_admin: /root/.cache/ingressbench/local/contour/envoy-admin.sock }
/// counters: { haproxy_stat: /root/.cache/ingressbench/local/haproxy-ingress/fs/var/run/haproxy/admin.sock }
/// counters: { pods: { namespace: projectcontour, selector: app=envoy, port: 8002, exposition: envoy } }
/// ```
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CountersVia {
    /// Envoy's admin socket (its `/stats`).
    #[serde(default)]
    pub envoy_admin: Option<PathBuf>,
    /// Or HAProxy's runtime API socket (its `show stat`).
    #[serde(default)]
    pub haproxy_stat: Option<PathBuf>,
    /// Or the proxy's pods, each read through the API server's pod proxy.
    #[serde(default)]
    pub pods: Option<CounterPods>,
}

/// A proxy's pods and their Prometheus endpoint.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CounterPods {
    /// The namespace the counting pods run in.
    pub namespace: String,
    /// Their label selector (`app=envoy`).
    pub selector: String,
    /// The endpoint's port on each pod (Contour's Envoy: 8002; HAProxy Ingress's exporter:
    /// its `prometheus-port`, 9105; Traefik's metrics entrypoint: 9100 in its chart).
    pub port: u16,
    /// Its path (by default the exposition's usual one: `/stats/prometheus` for Envoy,
    /// `/metrics` for the others).
    #[serde(default)]
    pub path: Option<String>,
    /// Whose series they are: `envoy`, `haproxy` or `traefik`.
    pub exposition: ingressbench_lab::proxy::exposition::Exposition,
}

impl CounterPods {
    /// The endpoint's path.
    pub fn path(&self) -> &str {
        (self.path.as_deref()).unwrap_or(self.exposition.default_path())
    }
}

/// How a controller is restarted: a rollout restart of its workload, as `kubectl rollout
/// restart` makes one (the pod template's `kubectl.kubernetes.io/restartedAt`
/// annotation), or, in the local cluster, its process stopped and started again by the
/// cluster's serving process.
///
/// ```yaml
/// restart: { deployment: contour, namespace: projectcontour }   # or daemonset: envoy
/// restart: { local: /root/.cache/ingressbench/local, process: traefik }
/// ```
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RestartVia {
    /// A Deployment's name.
    #[serde(default)]
    pub deployment: Option<String>,
    /// Or a DaemonSet's.
    #[serde(default)]
    pub daemonset: Option<String>,
    /// The workload's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Or the local cluster's directory (`cluster local up --dir`).
    #[serde(default)]
    pub local: Option<PathBuf>,
    /// The process of the local cluster to restart (`traefik`, `contour`,
    /// `contour-envoy`, `haproxy-ingress`).
    #[serde(default)]
    pub process: Option<String>,
}

/// What a restart acts on, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Restart {
    /// A rollout restart of a workload: kind (`Deployment`, `DaemonSet`), namespace, name.
    Rollout {
        /// `Deployment` or `DaemonSet`.
        kind: &'static str,
        /// The namespace of the controller's Deployment or DaemonSet.
        namespace: String,
        /// The controller's Deployment or DaemonSet, by name.
        name: String,
    },
    /// A process of the local cluster served from `dir`.
    Local {
        /// The local cluster's directory.
        dir: PathBuf,
        /// The process's name there.
        process: String,
    },
}

impl RestartVia {
    /// What it names, or what is wrong with it.
    pub fn checked(&self) -> Result<Restart, String> {
        fn given(v: &Option<String>) -> Option<&str> {
            v.as_deref().filter(|v| !v.trim().is_empty())
        }
        match (
            given(&self.deployment),
            given(&self.daemonset),
            &self.local,
        ) {
            (Some(name), None, None) | (None, Some(name), None) => {
                let namespace = given(&self.namespace)
                    .ok_or("give the workload's `namespace`")?
                    .to_owned();
                if self.process.is_some() {
                    return Err("`process` names a process of the local cluster (with `local`)".into());
                }
                let kind = if self.deployment.is_some() {
                    "Deployment"
                } else {
                    "DaemonSet"
                };
                Ok(Restart::Rollout {
                    kind,
                    namespace,
                    name: name.to_owned(),
                })
            }
            (None, None, Some(dir)) => {
                if self.namespace.is_some() {
                    return Err("`namespace` is a workload's (with `deployment` or `daemonset`)".into());
                }
                Ok(Restart::Local {
                    dir: dir.clone(),
                    process: given(&self.process)
                        .ok_or("give the local cluster's `process` to restart (traefik, contour, contour-envoy, haproxy-ingress)")?
                        .to_owned(),
                })
            }
            (None, None, None) => Err(
                "give the `deployment` (or `daemonset`) and its `namespace` a rollout restart rolls, or the local cluster's `local` directory and `process`"
                    .into(),
            ),
            _ => Err("give one of `deployment`, `daemonset` and `local`".into()),
        }
    }
}

impl std::fmt::Display for Restart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Restart::Rollout {
                kind,
                namespace,
                name,
            } => write!(f, "a rollout restart of {kind} {namespace}/{name}"),
            Restart::Local { process, .. } => {
                write!(
                    f,
                    "the local cluster's {process} process stopped and started"
                )
            }
        }
    }
}

/// Where a controller's and its proxy's CPU and memory are read on a cluster whose
/// processes this machine cannot see.
///
/// ```yaml
/// usage:
///   controller: { namespace: projectcontour, selector: app=contour,
///                 metrics: { port: 8000, path: /metrics } }   # process_* through the pod proxy
///   proxy: { namespace: projectcontour, selector: app=envoy }  # metrics.k8s.io PodMetrics
/// ```
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TargetUsage {
    /// The controller's pods.
    #[serde(default)]
    pub controller: Option<PodsUsage>,
    /// Its proxy's pods, when they are apart (Contour's Envoy); a controller that is its own
    /// proxy (Traefik) names its pods here.
    #[serde(default)]
    pub proxy: Option<PodsUsage>,
}

/// Pods measured together, and how.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PodsUsage {
    /// The namespace the controller's pods run in.
    pub namespace: String,
    /// Their label selector (`app=contour`).
    pub selector: String,
    /// Each pod's Prometheus endpoint with the process collector's series
    /// (`process_cpu_seconds_total`, `process_resident_memory_bytes`), reached through the
    /// API server's pod proxy; without it, the metrics API's PodMetrics (metrics-server).
    #[serde(default)]
    pub metrics: Option<MetricsEndpoint>,
}

/// A pod's Prometheus endpoint.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetricsEndpoint {
    /// Its port on the pod.
    pub port: u16,
    /// The HTTP path the metrics are served at (`/metrics` by default).
    #[serde(default = "default_metrics_path")]
    pub path: String,
}

fn default_metrics_path() -> String {
    "/metrics".into()
}

/// The process groups of a local controller, by the pid that leads each.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LocalPids {
    /// The controller (for Traefik, also its proxy).
    pub controller: u32,
    /// Its proxy, when it runs apart (Contour's Envoy); a proxy the controller starts
    /// itself (HAProxy Ingress's HAProxy) is found among its children.
    #[serde(default)]
    pub proxy: Option<u32>,
}

impl ClusterTarget {
    /// Where pods reach it: the plain HTTP and the TLS address the file gives for them,
    /// each else the one this machine uses (`looked_up`: those, with `service:`).
    pub fn cluster_addresses(
        &self,
        looked_up: (Option<String>, Option<String>),
    ) -> (Option<String>, Option<String>) {
        (
            self.cluster_address.clone().or(looked_up.0),
            self.cluster_tls_address.clone().or(looked_up.1),
        )
    }

    /// The plain HTTP and the TLS address the file gives (an `https://` address serves TLS
    /// when there is no `tls_address`); none with `service:`, read from the cluster.
    pub fn addresses(&self) -> (Option<String>, Option<String>) {
        let with = |scheme: &str| self.address.clone().filter(|a| a.starts_with(scheme));
        (
            with("http://"),
            self.tls_address.clone().or_else(|| with("https://")),
        )
    }
}

/// A Gateway (Gateway API) by name, and optionally one of its listeners (the route's
/// `parentRef.sectionName`; without one the route attaches to every listener that
/// allows it).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GatewayRef {
    /// The Gateway's name.
    pub name: String,
    /// The Gateway's namespace.
    pub namespace: String,
    /// The listener's name (none: the route attaches to every listener).
    #[serde(default)]
    pub listener: Option<String>,
    /// The HTTPS listener's name, for scenarios with `tls: true` (none: every listener).
    #[serde(default)]
    pub tls_listener: Option<String>,
}

impl GatewayRef {
    /// The same Gateway, through the listener for `tls` traffic or plain HTTP.
    pub fn for_traffic(&self, tls: bool) -> Self {
        let listener = if tls {
            self.tls_listener.clone()
        } else {
            self.listener.clone()
        };
        Self {
            listener,
            ..self.clone()
        }
    }
}

impl std::fmt::Display for GatewayRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        match &self.listener {
            Some(l) => write!(f, " (listener {l})"),
            None => Ok(()),
        }
    }
}

/// An object (a Service, a Secret) by name and namespace.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceRef {
    /// The Service's name.
    pub name: String,
    /// The Service's namespace.
    pub namespace: String,
}

/// The sidecar's image where the cluster file names none: the Envoy the lab runs.
pub const SIDECAR_IMAGE: &str = "envoyproxy/envoy:v1.40.0";

/// The image that runs this tool (the backends, the load workers).
pub const IMAGE: &str = "ingressbench";

fn default_sidecar_image() -> String {
    SIDECAR_IMAGE.into()
}

fn default_prefix() -> String {
    "ingressbench".into()
}

fn default_image() -> String {
    IMAGE.into()
}

impl ClusterFile {
    /// Reads and checks a cluster file.
    pub fn read(path: &Path) -> Result<Self, ClusterError> {
        let text = std::fs::read_to_string(path).map_err(|source| ClusterError::Io {
            path: path.to_owned(),
            source,
        })?;
        let mut file = Self::parse(&text).map_err(|e| ClusterError::File {
            path: path.to_owned(),
            message: e,
        })?;
        let here = path.parent().unwrap_or(Path::new("."));
        for target in file.targets.values_mut() {
            if let Some(ca) = target.ca.as_mut().filter(|ca| ca.is_relative()) {
                *ca = here.join(&*ca);
            }
            let restart = target.restart.as_mut().and_then(|r| r.local.as_mut());
            if let Some(dir) = restart.filter(|d| d.is_relative()) {
                *dir = here.join(&*dir);
            }
            if let Some(c) = target.counters.as_mut() {
                for socket in [c.envoy_admin.as_mut(), c.haproxy_stat.as_mut()]
                    .into_iter()
                    .flatten()
                    .filter(|s| s.is_relative())
                {
                    *socket = here.join(&*socket);
                }
            }
        }
        Ok(file)
    }

    /// Parses and checks cluster file text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: ClusterFile = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        let prefix_ok = !file.namespace_prefix.is_empty()
            && file.namespace_prefix.len() <= 30
            && file
                .namespace_prefix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !file.namespace_prefix.starts_with('-');
        if !prefix_ok {
            return Err(format!(
                "namespace_prefix: {:?} cannot start a namespace name; use 1-30 lowercase letters, digits or '-'",
                file.namespace_prefix
            ));
        }
        if file.targets.is_empty() {
            return Err("targets: name at least one controller".into());
        }
        for (name, t) in &file.targets {
            match (&t.ingress_class, &t.gateway) {
                (Some(_), Some(_)) => {
                    return Err(format!(
                        "targets.{name}: give `ingress_class` (routes as an Ingress) or `gateway` (as an HTTPRoute), not both"
                    ))
                }
                (None, None) => {
                    return Err(format!(
                        "targets.{name}: give the `ingress_class` its Ingress names, or the `gateway: {{ name, namespace }}` its HTTPRoute attaches to"
                    ))
                }
                _ => {}
            }
            match (&t.address, &t.service) {
                (Some(_), Some(_)) => {
                    return Err(format!(
                        "targets.{name}: give `address` or `service`, not both"
                    ))
                }
                (None, None) => {
                    return Err(format!(
                        "targets.{name}: give the controller's `address` (http://host:port) or the LoadBalancer `service: {{ name, namespace }}` to read it from"
                    ))
                }
                (Some(a), None)
                    if !(a.starts_with("http://") || a.starts_with("https://")) =>
                {
                    return Err(format!(
                        "targets.{name}.address: {a:?} must start with http:// or https://"
                    ))
                }
                _ => {}
            }
            if t.ca.is_some() && t.gateway.is_none() {
                return Err(format!(
                    "targets.{name}.ca: an Ingress target's certificate is the run's own (in a Secret the run makes, from a CA it trusts); `ca` is for a gateway target's HTTPS listener"
                ));
            }
            if let Some(usage) = &t.usage {
                if t.local_pids.is_some() {
                    return Err(format!(
                        "targets.{name}: give `local_pids` (a controller on this machine) or `usage` (pods read through the API), not both"
                    ));
                }
                if usage.controller.is_none() && usage.proxy.is_none() {
                    return Err(format!(
                        "targets.{name}.usage: name the `controller` or the `proxy` pods (namespace, selector)"
                    ));
                }
                for (part, pods) in [("controller", &usage.controller), ("proxy", &usage.proxy)] {
                    let Some(pods) = pods else { continue };
                    if pods.selector.trim().is_empty() {
                        return Err(format!(
                            "targets.{name}.usage.{part}.selector: empty; a label selector such as app=contour"
                        ));
                    }
                    if let Some(m) = pods.metrics.as_ref().filter(|m| !m.path.starts_with('/')) {
                        return Err(format!(
                            "targets.{name}.usage.{part}.metrics.path: {:?} must start with /",
                            m.path
                        ));
                    }
                }
            }
            if let Some(upgrade) = &t.upgrade {
                upgrade
                    .checked()
                    .map_err(|e| format!("targets.{name}.upgrade: {e}"))?;
            }
            if let Some(restart) = &t.restart {
                restart
                    .checked()
                    .map_err(|e| format!("targets.{name}.restart: {e}"))?;
            }
            if let Some(c) = &t.counters {
                let given = [
                    c.envoy_admin.is_some(),
                    c.haproxy_stat.is_some(),
                    c.pods.is_some(),
                ];
                if given.iter().filter(|g| **g).count() != 1 {
                    return Err(format!(
                        "targets.{name}.counters: give one of `envoy_admin` (its Envoy's admin socket), `haproxy_stat` (its HAProxy's runtime API socket) or `pods` (its pods' Prometheus endpoint)"
                    ));
                }
                if c.pods.as_ref().is_some_and(|p| !p.path().starts_with('/')) {
                    return Err(format!("targets.{name}.counters.pods.path: begins with /"));
                }
            }
            for (field, value, scheme) in [
                ("tls_address", &t.tls_address, "https://"),
                ("cluster_address", &t.cluster_address, "http://"),
                ("cluster_tls_address", &t.cluster_tls_address, "https://"),
            ] {
                if let Some(a) = value.as_deref().filter(|a| !a.starts_with(scheme)) {
                    return Err(format!(
                        "targets.{name}.{field}: {a:?} must start with {scheme}"
                    ));
                }
            }
        }
        Ok(file)
    }

    /// The targets of a scenario that this file does not place: an error naming them,
    /// not a silent skip.
    pub fn unplaced<'a>(&self, scenario_targets: &[&'a str]) -> Vec<&'a str> {
        scenario_targets
            .iter()
            .copied()
            .filter(|t| !self.targets.contains_key(*t))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_local_cluster_file_names_four_controllers_and_three_gateways() {
        let file =
            ClusterFile::parse(include_str!("../../../examples/cluster-local.yaml")).unwrap();
        let names: Vec<&str> = file.targets.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "contour",
                "contour-gateway",
                "envoy-gateway",
                "haproxy-ingress",
                "traefik",
                "traefik-gateway"
            ]
        );
        for (name, t) in &file.targets {
            assert!(
                t.addresses().1.is_some(),
                "{name}: every one over HTTPS too"
            );
            assert_eq!(t.gateway.is_some(), t.ca.is_some(), "{name}");
        }
        let gateway = file.targets["contour-gateway"].gateway.as_ref().unwrap();
        assert_eq!(gateway.for_traffic(false).listener.as_deref(), Some("web"));
        assert_eq!(
            gateway.for_traffic(true).listener.as_deref(),
            Some("websecure")
        );
        assert_eq!(
            file.targets["traefik"].ingress_class.as_deref(),
            Some("traefik")
        );
        // Envoy Gateway's pods are read and restarted through the API.
        let eg = &file.targets["envoy-gateway"];
        assert!(eg.local_pids.is_none());
        assert_eq!(
            eg.restart.as_ref().unwrap().checked(),
            Ok(Restart::Rollout {
                kind: "Deployment",
                namespace: "envoy-gateway-system".into(),
                name: "envoy-gateway".into()
            })
        );
        let pods = eg.counters.as_ref().unwrap().pods.as_ref().unwrap();
        assert_eq!((pods.port, pods.path()), (19001, "/stats/prometheus"));
        assert!(eg.usage.as_ref().unwrap().controller.is_some());
    }

    #[test]
    fn an_upgrade_is_a_helm_release_or_an_image_with_the_workloads_it_rolls() {
        let file = ClusterFile::parse(
            "targets:\n  h: { gateway: { name: g, namespace: n }, address: http://x, upgrade: { helm: { release: eg, namespace: egs, chart: oci://r/c, chart_version: 'v{version}' }, follow: [{ deployment: a, namespace: egs }, { daemonset: b, namespace: egs }] } }\n  i: { ingress_class: c, address: http://x, upgrade: { image: { deployment: ctl, namespace: ns, container: c, image: 'r/ctl:v{version}' } } }\n",
        )
        .unwrap();
        let helm = file.targets["h"]
            .upgrade
            .as_ref()
            .unwrap()
            .checked()
            .unwrap();
        assert_eq!(
            helm.follow,
            [
                ("Deployment", "egs".to_owned(), "a".to_owned()),
                ("DaemonSet", "egs".to_owned(), "b".to_owned())
            ]
        );
        assert_eq!(
            helm.by.describe("1.9.1"),
            "upgrade to 1.9.1: helm upgrade egs/eg"
        );
        assert!(matches!(
            helm.by,
            UpgradeBy::Helm { ref binary, ref chart_version, .. }
                if binary == Path::new("helm") && chart_version.as_deref() == Some("v{version}")
        ));
        // An image's Deployment is followed unless others are named.
        let image = file.targets["i"]
            .upgrade
            .as_ref()
            .unwrap()
            .checked()
            .unwrap();
        assert_eq!(
            image.follow,
            [("Deployment", "ns".to_owned(), "ctl".to_owned())]
        );
        assert_eq!(
            image.by.describe("2.0"),
            "upgrade to 2.0: image of Deployment ns/ctl container c to r/ctl:v2.0"
        );
    }

    #[test]
    fn a_relative_ca_is_read_beside_the_cluster_file() {
        let dir = std::env::temp_dir().join(format!("ib-file-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cluster.yaml");
        std::fs::write(
            &path,
            "targets: { g: { gateway: { name: g, namespace: n }, address: http://x, ca: certs/ca.pem }, h: { gateway: { name: g, namespace: n }, address: http://x, ca: /etc/ca.pem } }",
        )
        .unwrap();
        let file = ClusterFile::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            file.targets["g"].ca.as_deref(),
            Some(dir.join("certs/ca.pem").as_path())
        );
        assert_eq!(
            file.targets["h"].ca.as_deref(),
            Some(Path::new("/etc/ca.pem"))
        );
    }

    #[test]
    fn a_cluster_file_says_what_is_wrong_and_what_would_be_valid() {
        let ok = ClusterFile::parse(
            "targets: { traefik: { ingress_class: traefik, address: http://127.0.0.1:8080 } }",
        )
        .unwrap();
        assert_eq!(ok.namespace_prefix, "ingressbench");
        assert_eq!(ok.unplaced(&["traefik", "nginx"]), vec!["nginx"]);
        let t = &ok.targets["traefik"];
        assert_eq!(t.addresses(), (Some("http://127.0.0.1:8080".into()), None));
        assert!(!ok.workers.host_network);
        assert_eq!(t.cluster_addresses(t.addresses()), t.addresses());
        let inside = ClusterFile::parse(
            "targets: { t: { ingress_class: c, address: http://lb, cluster_address: http://t.ns.svc } }\nworkers: { host_network: true }",
        )
        .unwrap();
        let t = &inside.targets["t"];
        assert_eq!(
            t.cluster_addresses(t.addresses()),
            (Some("http://t.ns.svc".into()), None)
        );
        assert!(inside.workers.host_network);
        let rolled = ClusterFile::parse(
            "targets: { t: { ingress_class: c, address: http://x, restart: { daemonset: envoy, namespace: projectcontour } } }",
        )
        .unwrap();
        assert_eq!(
            rolled.targets["t"].restart.as_ref().unwrap().checked(),
            Ok(Restart::Rollout {
                kind: "DaemonSet",
                namespace: "projectcontour".into(),
                name: "envoy".into()
            })
        );
        let gateway = ClusterFile::parse(
            "targets: { g: { gateway: { name: traefik, namespace: kube-system, listener: web }, address: http://x } }",
        )
        .unwrap();
        assert_eq!(
            gateway.targets["g"].gateway.as_ref().unwrap().to_string(),
            "kube-system/traefik (listener web)"
        );
        let tls =
            ClusterFile::parse("targets: { t: { ingress_class: c, address: https://x } }").unwrap();
        assert_eq!(
            tls.targets["t"].addresses(),
            (None, Some("https://x".into()))
        );
        for (text, says) in [
            ("targets: {}", "name at least one controller"),
            ("targets: { t: { ingress_class: c } }", "give the controller's `address`"),
            ("targets: { t: { address: http://x } }", "give the `ingress_class`"),
            (
                "targets: { t: { ingress_class: c, gateway: { name: g, namespace: n }, address: http://x } }",
                "not both",
            ),
            ("targets: { t: { gateway: { name: g }, address: http://x } }", "missing field `namespace`"),
            (
                "targets: { t: { ingress_class: c, address: x, service: { name: a, namespace: b } } }",
                "not both",
            ),
            ("targets: { t: { ingress_class: c, address: ftp://x } }", "http://"),
            ("namespace_prefix: Bad_Name\ntargets: { t: { ingress_class: c, address: http://x } }", "namespace_prefix"),
            ("targets: { t: { ingres_class: c } }", "unknown field `ingres_class`"),
            (
                "targets: { t: { ingress_class: c, address: http://x, tls_address: http://x } }",
                "tls_address: \"http://x\" must start with https://",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, ca: ca.pem } }",
                "`ca` is for a gateway target",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, cluster_tls_address: http://y } }",
                "cluster_tls_address: \"http://y\" must start with https://",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x } }\nworkers: { host_net: true }",
                "unknown field `host_net`",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, restart: { deployment: t } } }",
                "targets.t.restart: give the workload's `namespace`",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, restart: { deployment: t, daemonset: t, namespace: n } } }",
                "give one of `deployment`, `daemonset` and `local`",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, restart: { local: /x } } }",
                "give the local cluster's `process`",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, restart: {} } }",
                "give the `deployment` (or `daemonset`)",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, restart: { statefulset: t } } }",
                "unknown field `statefulset`",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, upgrade: { helm: { release: r, namespace: n, chart: c } } } }",
                "targets.t.upgrade: give the workloads the upgrade rolls in `follow`",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, upgrade: { follow: [{ deployment: d, namespace: n }] } } }",
                "targets.t.upgrade: give one of `helm`",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, upgrade: { helm: { release: r, namespace: n, chart: c }, follow: [{ deployment: d }] } } }",
                "targets.t.upgrade: follow[0]: give the workload's `namespace`",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, counters: {} } }",
                "targets.t.counters: give one of `envoy_admin`",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, counters: { envoy_admin: /a, haproxy_stat: /b } } }",
                "targets.t.counters: give one of `envoy_admin`",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, counters: { envoy_admin: /a, pods: { namespace: n, selector: a=b, port: 8002, exposition: envoy } } } }",
                "targets.t.counters: give one of `envoy_admin`",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, counters: { pods: { namespace: n, selector: a=b, port: 8002, exposition: nginx } } } }",
                "unknown variant `nginx`, expected one of `envoy`, `haproxy`, `traefik`",
            ),
            (
                "targets: { t: { ingress_class: c, address: http://x, counters: { pods: { namespace: n, selector: a=b, port: 8002, path: stats, exposition: envoy } } } }",
                "counters.pods.path: begins with /",
            ),
        ] {
            let e = ClusterFile::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
