//! Lab files: a lab described in YAML (`ingressbench lab up FILE`). Scenario files use the
//! same `backends`, `routes`, `tls`, `tuning` and `overlay` sections.
//!
//! ```yaml
//! proxies: [nginx, haproxy, envoy, traefik, caddy]
//! backends:
//!   - name: echo
//!     replicas: 3
//!     backend: { latency: 1ms, body_bytes: 615 }
//! routes:
//!   - { host: app.test, path_prefix: /, pool: echo }
//! tls: true
//! tuning: { workers: 1, keepalive_requests: 1000, upstream_keepalive: 32 }
//! # tuning: { upstream_protocol: http2 }  # h2c to the backends (not nginx)
//! # tuning: { sysctls: { net.core.somaxconn: 32768 }, listen_backlog: 32768 }  # netns only
//! haproxy_update: runtime_api
//! front: { replicas: 2 }               # an L4 front over two replicas of each proxy
//! topology:                            # nodes and the links between them
//!   isolation: loopback                # or netns (root)
//!   placement: anti_affinity           # or affinity, or { client, front, proxies, sidecar, backends }
//!   links: { cross_node: { delay: 0.3ms, jitter: 0.05ms } }
//! ```
//! Unknown keys are errors, reported with the file, line and column.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::backend::Latency;
use crate::model::{Overlay, Route, Tuning};
use crate::proxy::{Binaries, HaproxyUpdate, ProxyKind, ProxyOptions};
use crate::relay::LinkSpec;
use crate::topology::{Isolation, Topology};
use crate::{HopSpec, LabError, LabSpec, PoolSpec};

/// A lab file as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabFile {
    /// Proxies to run, each in front of every pool.
    pub proxies: Vec<ProxyKind>,
    /// Start the proxies ready for an in-place upgrade (nginx detached from the tool,
    /// Envoy with hot restart on); a scenario with an `upgrade` event sets it.
    #[serde(default)]
    pub upgradeable: bool,
    /// Backend pools (default: one pool `echo` of 3).
    #[serde(default = "default_pools")]
    pub backends: Vec<PoolFile>,
    /// Routes (default: every host and path to the first pool).
    #[serde(default)]
    pub routes: Vec<RouteFile>,
    /// Terminate TLS too (default: true).
    #[serde(default = "yes")]
    pub tls: bool,
    /// Tuning knobs, equal across proxies.
    #[serde(default)]
    pub tuning: TuningFile,
    /// Header, CORS and rewrite changes in force at start.
    #[serde(default)]
    pub overlay: OverlayFile,
    /// How HAProxy receives endpoint changes.
    #[serde(default)]
    pub haproxy_update: HaproxyUpdate,
    /// An L4 load balancer in front of replicas of each proxy.
    #[serde(default)]
    pub front: Option<FrontFile>,
    /// An extra hop: a sidecar between the proxies and the backends.
    #[serde(default)]
    pub hop: Option<HopFile>,
    /// Where things run, and the links between.
    #[serde(default)]
    pub topology: TopologyFile,
}

/// Where things run and the links between, as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TopologyFile {
    /// `loopback` (each node an address 127.0.N.1) or `netns` (each node a network
    /// namespace, root only).
    #[serde(default)]
    pub isolation: Isolation,
    /// A preset, `affinity` (everything on one node: no links) or `anti_affinity` (the
    /// client, the front and the proxies on nodes of their own, every backend on its own),
    /// or the node of each part: `{ client, front, proxies, sidecar, backends }`.
    #[serde(default)]
    pub placement: PlacementFile,
    /// `internal` (the client on a node of the cluster) or `external` (its node outside,
    /// across `internet`).
    #[serde(default)]
    pub client: ClientPath,
    /// Links; unset ones keep their defaults.
    #[serde(default)]
    pub links: LinksFile,
}

/// A placement as written: a preset's name or a node per part.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum PlacementFile {
    /// `affinity` or `anti_affinity`.
    Preset(Placement),
    /// `{ client: c, front: lb, proxies: n1, sidecar: n2, backends: n1 | each }`.
    Nodes(NodesFile),
}

impl Default for PlacementFile {
    fn default() -> Self {
        Self::Preset(Placement::Affinity)
    }
}

/// The node of each part, as written; `backends: each` puts every backend on its own.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodesFile {
    /// The client's node (default `client`).
    #[serde(default)]
    pub client: Option<String>,
    /// The L4 front's node (default `lb`).
    #[serde(default)]
    pub front: Option<String>,
    /// The proxies' node, or `each` for a node per replica (`ingress-1`, `ingress-2`, …).
    pub proxies: String,
    /// The sidecar's node (default: the proxies').
    #[serde(default)]
    pub sidecar: Option<String>,
    /// The backends' node (default: the proxies'), or `each` for a node per backend.
    #[serde(default)]
    pub backends: Option<String>,
}

/// A placement preset.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Everything on one node.
    #[default]
    Affinity,
    /// The client, the front and the proxies on nodes of their own; each backend on its own.
    AntiAffinity,
}

/// Where the client is.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ClientPath {
    /// Inside the cluster.
    #[default]
    Internal,
    /// Across the internet link.
    External,
}

/// Links as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LinksFile {
    /// Between nodes of the cluster (default 0.3 ms ± 0.05 ms).
    pub cross_node: Option<LinkFile>,
    /// Between the outside and the cluster (default 20 ms ± 2 ms).
    pub internet: Option<LinkFile>,
    /// Links for particular pairs of nodes.
    #[serde(default)]
    pub between: Vec<LinkFile>,
}

/// One link as written: `{ delay: 0.3ms, jitter: 0.05ms, bandwidth: 100mbit, reset: 0.001 }`,
/// with `nodes: [a, b]` in `between`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LinkFile {
    /// The two nodes it joins (only in `between`).
    #[serde(default)]
    pub nodes: Option<[String; 2]>,
    /// One-way delay.
    pub delay: String,
    /// Largest deviation either way (default 0).
    #[serde(default)]
    pub jitter: Option<String>,
    /// Each direction's capacity: `500kbit`, `100mbit`, `1gbit` (default: no cap).
    #[serde(default)]
    pub bandwidth: Option<String>,
    /// Probability, per chunk of bytes carried, that the connection is reset (0 to 1).
    #[serde(default)]
    pub reset: Option<f64>,
}

impl LinkFile {
    fn to_link(&self, field: &str) -> Result<LinkSpec, String> {
        let parse =
            |v: &str| ingressbench_stats::parse_duration(v).map_err(|e| format!("{field}: {e}"));
        let link = LinkSpec {
            delay: parse(&self.delay)?,
            jitter: self
                .jitter
                .as_deref()
                .map(parse)
                .transpose()?
                .unwrap_or_default(),
            bandwidth: self
                .bandwidth
                .as_deref()
                .map(|b| parse_bandwidth(b).map_err(|e| format!("{field}.bandwidth: {e}")))
                .transpose()?,
            reset: self.reset.unwrap_or(0.0),
        };
        if link.jitter > link.delay {
            return Err(format!(
                "{field}: jitter {:?} is larger than the delay {:?}",
                link.jitter, link.delay
            ));
        }
        if !(0.0..=1.0).contains(&link.reset) {
            return Err(format!(
                "{field}.reset: {} is not a probability (0 to 1)",
                link.reset
            ));
        }
        Ok(link)
    }
}

/// `500kbit`, `100mbit`, `1gbit` (bits per second, as tc writes them) in bytes per second.
fn parse_bandwidth(text: &str) -> Result<u64, String> {
    let t = text.trim().to_ascii_lowercase();
    let (number, scale) = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)]
        .iter()
        .find_map(|(unit, scale)| t.strip_suffix(unit).map(|n| (n.trim().to_owned(), *scale)))
        .ok_or_else(|| format!("`{text}`: give bits per second as 500kbit, 100mbit or 1gbit"))?;
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}`: `{number}` is not a number"))?;
    let bytes = value * scale / 8.0;
    if !bytes.is_finite() || bytes < 1.0 {
        return Err(format!("`{text}`: too small to carry anything"));
    }
    Ok(bytes as u64)
}

impl TopologyFile {
    /// The topology it describes: the node of each part, and the links between nodes.
    pub fn to_topology(&self) -> Result<Topology, String> {
        let defaults = Topology::default();
        let mut t = match &self.placement {
            PlacementFile::Preset(Placement::Affinity) => Topology::on_one_node("node-1"),
            PlacementFile::Preset(Placement::AntiAffinity) => Topology {
                client: "client".into(),
                front: "lb".into(),
                proxies: "ingress".into(),
                sidecar: "ingress".into(),
                backends: None,
                ..defaults.clone()
            },
            PlacementFile::Nodes(n) => {
                // `proxies: each`: one node per replica, ingress-1, ingress-2, …
                let each = n.proxies == "each";
                let stem = if each { "ingress" } else { n.proxies.as_str() };
                let first = if each {
                    format!("{stem}-1")
                } else {
                    stem.to_owned()
                };
                Topology {
                    client: n.client.clone().unwrap_or_else(|| "client".into()),
                    front: n.front.clone().unwrap_or_else(|| "lb".into()),
                    proxies: stem.to_owned(),
                    proxies_each: each,
                    // With a node per replica, the sidecar gets one of its own.
                    sidecar: n.sidecar.clone().unwrap_or_else(|| {
                        if each {
                            "mesh".to_owned()
                        } else {
                            first.clone()
                        }
                    }),
                    backends: match n.backends.as_deref() {
                        Some("each") => None,
                        Some(node) => Some(node.to_owned()),
                        // Replicas on nodes of their own all reach the backends across a
                        // link: on nodes of their own too.
                        None if each => None,
                        None => Some(first),
                    },
                    ..defaults.clone()
                }
            }
        };
        if t.proxies_each {
            let on_a_replica = [Some(&t.sidecar), t.backends.as_ref()]
                .into_iter()
                .flatten()
                .find(|n| t.is_proxy_node(n));
            if let Some(node) = on_a_replica {
                return Err(format!(
                    "topology.placement: `{node}` is a proxy replica's node; with `proxies: each` the sidecar and the backends go on nodes of their own, so that every replica reaches them across the same kind of link"
                ));
            }
        }
        t.isolation = self.isolation;
        if self.client == ClientPath::External {
            if matches!(self.placement, PlacementFile::Preset(_)) {
                t.client = "internet-client".into();
            }
            let shared = [&t.front, &t.proxies, &t.sidecar]
                .into_iter()
                .chain(t.backends.as_ref())
                .any(|n| n == &t.client);
            if shared {
                return Err(format!(
                    "topology: the external client's node `{}` also runs part of the cluster; give it a node of its own",
                    t.client
                ));
            }
            t.outside = vec![t.client.clone()];
        }
        for (slot, file, field) in [
            (&mut t.cross_node, &self.links.cross_node, "cross_node"),
            (&mut t.internet, &self.links.internet, "internet"),
        ] {
            if let Some(l) = file {
                if l.nodes.is_some() {
                    return Err(format!(
                        "topology.links.{field}.nodes: a link between two particular nodes goes in `links.between`"
                    ));
                }
                *slot = l.to_link(&format!("topology.links.{field}"))?;
            }
        }
        for (i, b) in self.links.between.iter().enumerate() {
            let field = format!("topology.links.between[{i}]");
            let [x, y] = b
                .nodes
                .clone()
                .ok_or_else(|| format!("{field}: give the two nodes it joins, `nodes: [a, b]`"))?;
            t.between.push((x, y, b.to_link(&field)?));
        }
        let named = [&t.client, &t.front, &t.proxies, &t.sidecar]
            .into_iter()
            .chain(t.backends.as_ref())
            .chain(t.between.iter().flat_map(|(x, y, _)| [x, y]));
        for name in named {
            crate::model::check_name("topology node", name).map_err(|e| e.to_string())?;
        }
        Ok(t)
    }
}

/// An extra hop as written: `{ proxy: envoy, mtls: true }`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HopFile {
    /// The sidecar (Envoy, as in the meshes it stands for).
    pub proxy: ProxyKind,
    /// Mutual TLS from the sidecar to the backends.
    #[serde(default)]
    pub mtls: bool,
}

/// An L4 front as written: `{ replicas: 2 }`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FrontFile {
    /// How many replicas of each proxy it spreads connections over.
    pub replicas: usize,
}

/// A pool as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolFile {
    /// The pool's name, which routes and events refer to.
    pub name: String,
    /// How many backends the pool starts with.
    pub replicas: usize,
    /// How its backends behave.
    #[serde(default)]
    pub backend: BackendFile,
}

/// Backend behaviour as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendFile {
    /// `5ms`, `uniform:1ms-5ms`, `lognormal:2ms,p99=20ms`.
    pub latency: Option<String>,
    /// Body size.
    pub body_bytes: Option<usize>,
    /// The status every answer has (200 when not given).
    pub status: Option<u16>,
    /// Share of 500s.
    pub error_rate: Option<f64>,
    /// Answer at most this many requests a second, one after another (a server whose
    /// capacity is known by construction).
    pub serve_at_most: Option<f64>,
    /// Bytes each answered request keeps and never frees (a server whose leak is known
    /// by construction).
    pub leak_per_request: Option<usize>,
}

/// A route as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    /// Host (`*` for any).
    pub host: String,
    /// Path prefix (default `/`).
    #[serde(default = "root")]
    pub path_prefix: String,
    /// The pool the route sends to, by name.
    pub pool: String,
}

/// Tuning as written; unset knobs keep the defaults.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TuningFile {
    /// Worker processes or threads.
    pub workers: Option<u32>,
    /// Requests per client connection.
    pub keepalive_requests: Option<u64>,
    /// Idle upstream connections per pool.
    pub upstream_keepalive: Option<u32>,
    /// The proxies' own listen backlog (nginx, HAProxy, Envoy).
    pub listen_backlog: Option<u32>,
    /// What the proxies speak to the backends (`http1`, `http2`; not nginx).
    pub upstream_protocol: Option<crate::model::UpstreamProtocol>,
    /// Pass each piece of a response on as it comes (HAProxy's `option http-no-delay`).
    pub no_delay: Option<bool>,
    /// How long what a reload or restart replaced may serve on (nginx
    /// `worker_shutdown_timeout`, HAProxy `hard-stop-after`, Envoy `--drain-time-s`,
    /// Traefik `graceTimeOut`, Caddy `grace_period`): `10s`.
    pub drain: Option<String>,
    /// Kernel settings on the proxies' node (`net.core.somaxconn: 32768`); needs
    /// `topology.isolation: netns`.
    #[serde(default)]
    pub sysctls: SysctlsFile,
    /// Kernel settings on other nodes, by node name.
    #[serde(default)]
    pub nodes: std::collections::BTreeMap<String, SysctlsFile>,
}

/// Sysctls as written: each value a number or a string (`"1024 65000"`).
pub type SysctlsFile = std::collections::BTreeMap<String, SysctlValue>;

/// A sysctl value as written: `32768` or `"1024 65000"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SysctlValue(pub String);

impl<'de> Deserialize<'de> for SysctlValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Number(u64),
            Signed(i64),
            Text(String),
        }
        Ok(Self(
            match Written::deserialize(d).map_err(|_| {
                serde::de::Error::custom(
                    "a sysctl value is a number or a string of numbers (\"1024 65000\")",
                )
            })? {
                Written::Number(n) => n.to_string(),
                Written::Signed(n) => n.to_string(),
                Written::Text(t) => t,
            },
        ))
    }
}

/// Sysctls as the lab takes them.
fn sysctls(file: &SysctlsFile) -> crate::kernel::Sysctls {
    file.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect()
}

/// Route changes as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlayFile {
    /// `{ name: X-Lab, value: on }`
    pub response_header: Option<HeaderFile>,
    /// An origin, or `*`.
    pub cors_origin: Option<String>,
    /// `{ from: /old, to: /new }`
    pub rewrite: Option<RewriteFile>,
    /// A pool's name: the routes go there instead.
    pub pool: Option<String>,
}

/// A header as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderFile {
    /// The header's name.
    pub name: String,
    /// The header's value, as sent.
    pub value: String,
}

/// A rewrite as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewriteFile {
    /// Prefix to replace.
    pub from: String,
    /// What the matched prefix is replaced with.
    pub to: String,
}

/// A YAML error as (line and column, message without the position), for messages of the
/// form `file:line:column: message`. Scenario files use it too.
pub fn yaml_error(e: &serde_yaml_ng::Error) -> (Option<(usize, usize)>, String) {
    let location = e.location().map(|l| (l.line(), l.column()));
    let message = e
        .to_string()
        .split(" at line ")
        .next()
        .unwrap_or_default()
        .to_owned();
    (location, message)
}

fn yes() -> bool {
    true
}

fn root() -> String {
    "/".to_owned()
}

/// The backends of a lab or scenario file that names none: one pool `echo` of 3.
pub fn default_pools() -> Vec<PoolFile> {
    vec![PoolFile {
        name: "echo".into(),
        replicas: 3,
        backend: BackendFile::default(),
    }]
}

impl OverlayFile {
    /// The overlay it describes.
    pub fn to_overlay(&self) -> Overlay {
        Overlay {
            response_header: self
                .response_header
                .as_ref()
                .map(|h| (h.name.clone(), h.value.clone())),
            cors_origin: self.cors_origin.clone(),
            rewrite: self
                .rewrite
                .as_ref()
                .map(|r| (r.from.clone(), r.to.clone())),
            pool: self.pool.clone(),
        }
    }
}

impl LabFile {
    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<Self, LabError> {
        let text = std::fs::read_to_string(path).map_err(|e| LabError::LabFile {
            path: path.to_owned(),
            location: None,
            message: format!("cannot read it: {e}"),
        })?;
        Self::parse(&text, path)
    }

    /// Parses lab-file text (`path` is only for messages).
    pub fn parse(text: &str, path: &Path) -> Result<Self, LabError> {
        serde_yaml_ng::from_str(text).map_err(|e| {
            let (location, message) = yaml_error(&e);
            LabError::LabFile {
                path: path.to_owned(),
                location,
                message,
            }
        })
    }

    /// The lab it describes, run with `backend_binary` and proxies from `binaries`.
    pub fn to_spec(
        &self,
        path: &Path,
        backend_binary: PathBuf,
        binaries: Binaries,
    ) -> Result<LabSpec, LabError> {
        let err = |message: String| LabError::LabFile {
            path: path.to_owned(),
            location: None,
            message,
        };
        if self.proxies.is_empty() {
            return Err(err(
                "`proxies` is empty: name at least one of nginx, haproxy, envoy, traefik, caddy"
                    .into(),
            ));
        }
        if self.front.as_ref().is_some_and(|f| f.replicas == 0) {
            return Err(err(
                "front.replicas: 0; a front needs at least one proxy replica behind it".into(),
            ));
        }
        let topology = self.topology.to_topology().map_err(err)?;
        let pools: Vec<&str> = self.backends.iter().map(|p| p.name.as_str()).collect();
        topology.check_between(&pools).map_err(err)?;
        if let Some(hop) = &self.hop {
            if hop.proxy != ProxyKind::Envoy {
                return Err(err(format!(
                    "hop.proxy: `{}`; the sidecar is envoy (as in Istio, OSM and Consul)",
                    hop.proxy
                )));
            }
        }
        let mut pools = Vec::new();
        for pool in &self.backends {
            let mut args = Vec::new();
            let b = &pool.backend;
            if let Some(latency) = &b.latency {
                latency
                    .parse::<Latency>()
                    .map_err(|e| err(format!("pool `{}`: {e}", pool.name)))?;
                args.extend(["--latency".to_owned(), latency.clone()]);
            }
            if let Some(n) = b.body_bytes {
                args.extend(["--body-bytes".to_owned(), n.to_string()]);
            }
            if let Some(s) = b.status {
                args.extend(["--status".to_owned(), s.to_string()]);
            }
            if let Some(r) = b.error_rate {
                args.extend(["--error-rate".to_owned(), r.to_string()]);
            }
            if let Some(r) = b.serve_at_most {
                args.extend(["--serve-at-most".to_owned(), r.to_string()]);
            }
            if let Some(n) = b.leak_per_request {
                args.extend(["--leak-per-request".to_owned(), n.to_string()]);
            }
            pools.push(PoolSpec {
                name: pool.name.clone(),
                replicas: pool.replicas,
                backend_args: args,
            });
        }
        let first_pool = pools
            .first()
            .map(|p| p.name.clone())
            .ok_or_else(|| err("`backends` is empty: name at least one pool".into()))?;
        let routes = if self.routes.is_empty() {
            vec![Route {
                host: "*".into(),
                path_prefix: "/".into(),
                pool: first_pool,
                revision: 0,
            }]
        } else {
            self.routes
                .iter()
                .map(|r| Route {
                    host: r.host.clone(),
                    path_prefix: r.path_prefix.clone(),
                    pool: r.pool.clone(),
                    revision: 0,
                })
                .collect()
        };
        let defaults = Tuning::default();
        let tuning = Tuning {
            workers: self.tuning.workers.unwrap_or(defaults.workers),
            keepalive_requests: self.tuning.keepalive_requests,
            upstream_keepalive: self
                .tuning
                .upstream_keepalive
                .unwrap_or(defaults.upstream_keepalive),
            listen_backlog: self.tuning.listen_backlog,
            upstream_protocol: self
                .tuning
                .upstream_protocol
                .unwrap_or(defaults.upstream_protocol),
            no_delay: self.tuning.no_delay.unwrap_or(defaults.no_delay),
            drain: match self.tuning.drain.as_deref() {
                Some(d) => Some(
                    ingressbench_stats::parse_duration(d)
                        .map_err(|e| err(format!("tuning.drain: {e}")))?,
                ),
                None => None,
            },
            ..defaults
        };
        let kernel = crate::kernel::NodeSysctls {
            proxies: sysctls(&self.tuning.sysctls),
            nodes: self
                .tuning
                .nodes
                .iter()
                .map(|(node, s)| (node.clone(), sysctls(s)))
                .collect(),
        };
        Ok(LabSpec {
            proxies: self.proxies.clone(),
            pools,
            routes,
            overlay: self.overlay.to_overlay(),
            tuning,
            sysctls: kernel,
            tls: self.tls,
            backend_binary,
            binaries,
            keep: false,
            proxy_options: ProxyOptions {
                haproxy_update: self.haproxy_update,
                upstream_mtls: None,
                upgradeable: self.upgradeable,
            },
            front: self.front.as_ref().map(|f| f.replicas),
            hop: self.hop.as_ref().map(|h| HopSpec { mtls: h.mtls }),
            topology,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_put_parts_on_nodes_and_links_between_them() {
        let topology = |yaml: &str| {
            serde_yaml_ng::from_str::<TopologyFile>(yaml)
                .map_err(|e| e.to_string())?
                .to_topology()
        };
        let ms = std::time::Duration::from_millis(1);
        let near = topology("{}").unwrap();
        assert_eq!(near.link(&near.client, &near.proxies), None);
        assert_eq!(near.link(&near.proxies, &near.backend_node("echo-1")), None);
        let anti = topology("{ placement: anti_affinity, links: { cross_node: { delay: 1ms } } }")
            .unwrap();
        assert_eq!(
            anti.link(&anti.client, &anti.proxies).map(|l| l.delay),
            Some(ms)
        );
        assert_eq!(anti.backend_node("echo-2"), "echo-2", "a node per backend");
        assert_eq!(anti.link("ingress", "echo-2").map(|l| l.delay), Some(ms));
        let external = topology("{ client: external }").unwrap();
        assert_eq!(
            external
                .link(&external.client, &external.proxies)
                .map(|l| (l.delay.as_millis(), l.jitter.as_millis())),
            Some((20, 2))
        );
        assert_eq!(external.link(&external.proxies, "node-1"), None);
        let custom = topology(
            "{ isolation: netns, placement: { proxies: a, sidecar: b, backends: each }, links: { between: [{ nodes: [a, b], delay: 1ms, bandwidth: 8mbit, reset: 0.5 }] } }",
        )
        .unwrap();
        assert_eq!(custom.isolation, Isolation::Netns);
        let ab = custom.link("b", "a").unwrap();
        assert_eq!(
            (ab.delay, ab.bandwidth, ab.reset),
            (ms, Some(1_000_000), 0.5)
        );
        assert_eq!(custom.front, "lb");
        let spread = topology("{ placement: { proxies: each } }").unwrap();
        assert_eq!(
            (
                spread.proxy_node(1),
                spread.proxy_node(2),
                spread.backend_node("x-1")
            ),
            (
                "ingress-1".to_owned(),
                "ingress-2".to_owned(),
                "x-1".to_owned()
            )
        );
        assert_eq!(spread.sidecar, "mesh");
        for (yaml, want) in [
            (
                "{ links: { internet: { delay: 1ms, jitter: 2ms } } }",
                "larger than the delay",
            ),
            (
                "{ links: { cross_node: { delay: 1ms, bandwidth: fast } } }",
                "500kbit, 100mbit or 1gbit",
            ),
            (
                "{ links: { cross_node: { delay: 1ms, reset: 2 } } }",
                "not a probability",
            ),
            (
                "{ client: external, placement: { client: a, proxies: a } }",
                "node of its own",
            ),
            ("{ isolation: vm }", "unknown variant `vm`"),
            (
                "{ links: { between: [{ delay: 1ms }] } }",
                "the two nodes it joins",
            ),
            (
                "{ placement: { proxies: \"a b\" } }",
                "invalid topology node `a b`",
            ),
            (
                "{ placement: { proxies: each, backends: ingress-2 } }",
                "a proxy replica's node",
            ),
            (
                "{ links: { internet: { nodes: [a, b], delay: 1ms } } }",
                "goes in `links.between`",
            ),
        ] {
            let e = topology(yaml).unwrap_err();
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }

    fn parse(text: &str) -> Result<LabFile, String> {
        LabFile::parse(text, Path::new("lab.yaml")).map_err(|e| e.to_string())
    }

    #[test]
    fn a_minimal_file_gets_the_defaults() {
        let f = parse("proxies: [nginx, envoy]\n").unwrap();
        let spec = f
            .to_spec(Path::new("lab.yaml"), "ib".into(), Binaries::default())
            .unwrap();
        assert_eq!(spec.proxies, vec![ProxyKind::Nginx, ProxyKind::Envoy]);
        assert_eq!(spec.pools[0].replicas, 3);
        assert_eq!(spec.routes[0].host, "*");
        assert!(spec.tls);
    }

    #[test]
    fn errors_name_the_file_line_and_column() {
        for (text, want) in [
            ("proxies: [nginx]\nbogus: 1\n", "lab.yaml:2:1: unknown field `bogus`"),
            ("proxies: [nginz]\n", "lab.yaml:1:11: proxies[0]: unknown variant `nginz`, expected one of `nginx`"),
            ("proxies: [nginx]\nbackends:\n  - name: echo\n    replicas: three\n", "lab.yaml:4:15: backends[0].replicas: invalid type: string \"three\", expected usize"),
            ("proxies: [nginx]\nhaproxy_update: sometimes\n", "unknown variant `sometimes`, expected `runtime_api` or `reload`"),
            ("proxies: [nginx]\nbackends:\n  - { name: echo, replicas: 1, backend: { latency: soon } }\n", "lab.yaml: pool `echo`: invalid backend --latency"),
        ] {
            let result = parse(text).and_then(|f| f.to_spec(Path::new("lab.yaml"), "ib".into(), Binaries::default()).map_err(|e| e.to_string()));
            let message = result.err().unwrap_or_default();
            assert!(!message.is_empty(), "{text:?} should fail");
            assert!(message.contains(want), "{text:?}: {message}");
        }
    }
}
