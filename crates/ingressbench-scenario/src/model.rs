//! The scenario file as written, and its validated parts.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use ingressbench_lab::labfile::{
    FrontFile, HopFile, OverlayFile, PoolFile, RouteFile, SysctlsFile, TopologyFile, TuningFile,
};
use ingressbench_lab::model::UpstreamProtocol;
use ingressbench_lab::proxy::{HaproxyUpdate, ProxyKind};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// A scenario file. Unknown keys are errors.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name, used in the results directory's name.
    pub name: String,
    /// What the scenario reproduces and what to look for.
    #[serde(default)]
    pub description: String,
    /// The systems to compare; each cell runs one.
    pub targets: Vec<Target>,
    /// Backend pools, as in a lab file.
    #[serde(default)]
    pub backends: Vec<PoolFile>,
    /// Routes, as in a lab file; or `{ count: N, routes: [...] }`: N generated routes
    /// (`rN.routes.test`, over the pools in turn) on top of those.
    #[serde(default)]
    pub routes: RoutesFile,
    /// Terminate TLS (default true); load then goes over https.
    #[serde(default = "yes")]
    pub tls: bool,
    /// Tuning knobs for every lab proxy (a target may override them).
    #[serde(default)]
    pub tuning: TuningFile,
    /// Route changes in force at the start.
    #[serde(default)]
    pub overlay: OverlayFile,
    /// How changes reach the proxies.
    #[serde(default)]
    pub controller: ControllerFile,
    /// Where things run and the links between (placement presets, link delays).
    #[serde(default)]
    pub topology: TopologyFile,
    /// The load.
    pub load: LoadFile,
    /// The timeline, relative to the start of measurement.
    #[serde(default)]
    pub events: Vec<EventFile>,
    /// Dotted paths of fields and the values each cell takes (`load.rate: [100, 500]`).
    #[serde(default)]
    pub matrix: BTreeMap<String, Vec<serde_yaml_ng::Value>>,
    /// How many times every combination runs (interleaved).
    #[serde(default = "one")]
    pub repeat: u32,
    /// What `--quick` changes besides scaling durations down.
    #[serde(default)]
    pub quick: QuickFile,
    /// A capacity search: each cell becomes trials at the rates the search chooses
    /// ([`crate::capacity`]).
    pub search: Option<SearchFile>,
}

/// `search:`: the highest open-loop rate each cell sustains within its objectives.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchFile {
    /// The objectives, as `compare --fail-if` writes them (`p99 < 5ms`, `errors < 0.1%`).
    pub slo: Vec<String>,
    /// A rate expected to pass, tried first (requests per second).
    pub from: f64,
    /// The highest rate tried.
    pub up_to: f64,
    /// Stop when the bracket is this narrow (`5%`).
    #[serde(default = "five_percent")]
    pub precision: String,
    /// Each trial's measured length (after the load's warm-up).
    #[serde(default = "twenty_seconds")]
    pub trial: String,
    /// How many times a trial whose interval straddles an objective runs again.
    #[serde(default = "two")]
    pub repeats: u32,
    /// When `from` fails, halve the rate until one passes, then bisect (instead of
    /// stopping at `from`).
    #[serde(default)]
    pub down_from: bool,
}

fn five_percent() -> String {
    "5%".into()
}

fn twenty_seconds() -> String {
    "20s".into()
}

fn two() -> u32 {
    2
}

/// What `--quick` changes besides scaling durations down: a thinner matrix, fewer repeats,
/// fields set (fewer requests).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuickFile {
    /// Replaces these entries of `matrix` (each must be there).
    #[serde(default)]
    pub matrix: BTreeMap<String, Vec<serde_yaml_ng::Value>>,
    /// Replaces `repeat`.
    pub repeat: Option<u32>,
    /// Fields set as `--set` would (`load.requests: 240`), before the command line's own.
    #[serde(default)]
    pub set: BTreeMap<String, serde_yaml_ng::Value>,
    /// About how long the quick run takes (default 90 s): a file whose events need time to
    /// settle (reconnects after a restart) gives its cells more.
    pub budget: Option<String>,
}

/// What an `upgrade` event goes to: `same` (the binary each proxy runs), a version (for
/// every target), or a version per kind of proxy (the others: `same`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpgradeTo {
    /// The binary it runs: the mechanism is what is measured.
    Same,
    /// This version, whichever the proxy.
    Version(String),
    /// This version for each kind named.
    Each(BTreeMap<ProxyKind, String>),
}

impl UpgradeTo {
    /// The version a proxy of `kind` goes to (none: the binary it runs).
    pub fn for_kind(&self, kind: ProxyKind) -> Option<(ProxyKind, String)> {
        match self {
            Self::Same => None,
            Self::Version(v) => Some((kind, v.clone())),
            Self::Each(each) => each.get(&kind).map(|v| (kind, v.clone())),
        }
    }
}

impl<'de> Deserialize<'de> for UpgradeTo {
    /// `same`, `1.40.0` or `{ envoy: 1.40.0, traefik: 3.7.15 }`.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            One(String),
            Each(BTreeMap<ProxyKind, String>),
        }
        let version_like = |v: &str| {
            !v.is_empty()
                && v.len() <= 40
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-+".contains(c))
        };
        match Written::deserialize(deserializer).map_err(|_| {
            de::Error::custom("upgrade: `same`, a version (`1.40.0`) or a version per proxy (`{ envoy: 1.40.0, traefik: 3.7.15 }`)")
        })? {
            Written::One(v) if v == "same" => Ok(Self::Same),
            Written::One(v) if version_like(&v) => Ok(Self::Version(v)),
            Written::Each(each) if !each.is_empty() && each.values().all(|v| version_like(v)) => {
                Ok(Self::Each(each))
            }
            _ => Err(de::Error::custom(
                "upgrade: a version is letters, digits and . _ - + (at most 40); `same` for the binary each proxy runs",
            )),
        }
    }
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

/// How changes reach the proxies.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerFile {
    /// Delay between a change to the backends and the proxies being told (a slow
    /// controller, a cloud API); an event may set its own.
    pub propagation_delay: Option<String>,
}

/// One system to compare: a lab proxy with its settings, or a URL the lab does not manage.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// A proxy the lab runs.
    Proxy {
        /// Which proxy.
        kind: ProxyKind,
        /// Its name in the results (default: the kind).
        name: Option<String>,
        /// HAProxy: how endpoint changes reach it.
        update: Option<HaproxyUpdate>,
        /// Overrides of the scenario's tuning.
        workers: Option<u32>,
        /// `keepalive_requests` for this target.
        keepalive_requests: Option<u64>,
        /// Upstream keep-alive pool for this target.
        upstream_keepalive: Option<u32>,
        /// The proxy's listen backlog for this target.
        listen_backlog: Option<u32>,
        /// What this target's proxy speaks to the backends.
        upstream_protocol: Option<UpstreamProtocol>,
        /// Kernel settings on this target's proxy node, over the scenario's.
        sysctls: SysctlsFile,
        /// An L4 load balancer in front of replicas of the proxy.
        front: Option<FrontFile>,
        /// A sidecar between the proxy and the backends.
        hop: Option<HopFile>,
        /// The version it starts at, when not the one installed as the default (one
        /// installed beside it: `upgrade` events go from it to another).
        version: Option<String>,
    },
    /// A controller a cluster file places (`{ cluster: NAME }`; what `run --cluster`
    /// runs when the command line does not choose targets).
    Cluster {
        /// Its name in the results (default: the cluster file's).
        name: String,
        /// Its name in the cluster file.
        placed: String,
        /// A sidecar in every backend pod: the backends in a mesh, which the controller
        /// reaches from outside it (with mutual TLS: given a client certificate).
        hop: Option<HopFile>,
    },
    /// A URL the lab does not manage (a cloud load balancer, a cluster ingress).
    Upstream {
        /// Its name in the results.
        name: String,
        /// The URL loaded.
        url: String,
    },
}

impl Target {
    /// The name used in results and reports.
    pub fn name(&self) -> String {
        match self {
            Target::Proxy { kind, name, .. } => {
                name.clone().unwrap_or_else(|| kind.name().to_owned())
            }
            Target::Upstream { name, .. } | Target::Cluster { name, .. } => name.clone(),
        }
    }

    /// Its name in the cluster file, for a cluster target.
    pub fn placed(&self) -> Option<&str> {
        match self {
            Target::Cluster { placed, .. } => Some(placed),
            _ => None,
        }
    }

    /// What a cluster file places it by: a cluster target's `cluster:` name, any other
    /// target's own name (`--set targets=[traefik]` names the file's `traefik`).
    pub fn file_key(&self) -> String {
        match self {
            Target::Cluster { placed, .. } => placed.clone(),
            _ => self.name(),
        }
    }

    /// Its sidecar hop, if it has one.
    pub fn hop(&self) -> Option<&HopFile> {
        match self {
            Target::Proxy { hop, .. } | Target::Cluster { hop, .. } => hop.as_ref(),
            Target::Upstream { .. } => None,
        }
    }
}

/// A proxy target's settings of the lab's own (a controller in a cluster is configured
/// by its own objects, and reached through its Service's load balancer), and its hop,
/// which a cluster target takes as its own.
pub(crate) const LAB_ONLY_TARGET_KEYS: [&str; 10] = [
    "update",
    "workers",
    "keepalive_requests",
    "upstream_keepalive",
    "listen_backlog",
    "upstream_protocol",
    "sysctls",
    "front",
    "hop",
    "version",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetMap {
    proxy: Option<ProxyKind>,
    upstream: Option<String>,
    cluster: Option<String>,
    name: Option<String>,
    update: Option<HaproxyUpdate>,
    workers: Option<u32>,
    keepalive_requests: Option<u64>,
    upstream_keepalive: Option<u32>,
    listen_backlog: Option<u32>,
    upstream_protocol: Option<UpstreamProtocol>,
    #[serde(default)]
    sysctls: SysctlsFile,
    front: Option<FrontFile>,
    hop: Option<HopFile>,
    version: Option<String>,
}

/// Why a cluster target refuses a lab setting, and what to do instead.
pub(crate) fn cluster_refusal(key: &str) -> &'static str {
    match key {
        "front" => "an L4 front before a controller is the load balancer of its Service of type LoadBalancer: place the target by `service: { name, namespace }` in the cluster file and its traffic goes through it (the local cluster gives each controller one, an L4 front of its own; docs/CLUSTER.md)",
        "hop" => "the lab's hop is a sidecar beside its proxy; a cluster target takes one of its own, an Envoy sidecar in every backend pod: `{ cluster: NAME, name: NAME-in-mesh, hop: { proxy: envoy, mtls: true } }` (docs/CLUSTER.md, \"A mesh\")",
        "sysctls" => "the controller's pods are not the tool's to change; the scenario's `tuning.sysctls` go to the backend pods",
        "update" => "a controller takes endpoint changes its own way",
        "version" => "a controller's version is its image's: deploy the one to measure (docs/CLUSTER.md)",
        _ => "a controller's proxy is configured by the controller (its ConfigMap, flags or annotations), not by the tool: set it there, and name the setting in the target's name",
    }
}

impl<'de> Deserialize<'de> for Target {
    /// `nginx`, `{ proxy: haproxy, update: reload }` or `{ upstream: URL, name: lb }`.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TargetVisitor;
        impl<'de> Visitor<'de> for TargetVisitor {
            type Value = Target;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a proxy name (nginx, haproxy, envoy, traefik, caddy), { proxy: KIND, ... }, { upstream: URL, name: NAME } or { cluster: NAME }")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Target, E> {
                let kind = v.parse::<ProxyKind>().map_err(|_| {
                    E::custom(format!(
                        "unknown proxy `{v}`: expected nginx, haproxy, envoy, traefik or caddy"
                    ))
                })?;
                Ok(Target::Proxy {
                    kind,
                    name: None,
                    update: None,
                    workers: None,
                    keepalive_requests: None,
                    upstream_keepalive: None,
                    listen_backlog: None,
                    upstream_protocol: None,
                    sysctls: SysctlsFile::new(),
                    front: None,
                    hop: None,
                    version: None,
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Target, A::Error> {
                let m = TargetMap::deserialize(de::value::MapAccessDeserializer::new(map))?;
                match (m.proxy, m.upstream, m.cluster) {
                    (None, None, Some(name)) => {
                        let given = [
                            ("update", m.update.is_some()),
                            ("workers", m.workers.is_some()),
                            ("keepalive_requests", m.keepalive_requests.is_some()),
                            ("upstream_keepalive", m.upstream_keepalive.is_some()),
                            ("listen_backlog", m.listen_backlog.is_some()),
                            ("upstream_protocol", m.upstream_protocol.is_some()),
                            ("sysctls", !m.sysctls.is_empty()),
                            ("front", m.front.is_some()),
                            ("version", m.version.is_some()),
                        ];
                        if let Some((key, _)) = given.iter().find(|(_, set)| *set) {
                            return Err(de::Error::custom(format!(
                                "cluster target `{name}` takes no `{key}`: {}",
                                cluster_refusal(key)
                            )));
                        }
                        Ok(Target::Cluster {
                            name: m.name.unwrap_or_else(|| name.clone()),
                            placed: name,
                            hop: m.hop,
                        })
                    }
                    (Some(kind), None, None) => Ok(Target::Proxy {
                        kind,
                        name: m.name,
                        update: m.update,
                        workers: m.workers,
                        keepalive_requests: m.keepalive_requests,
                        upstream_keepalive: m.upstream_keepalive,
                        listen_backlog: m.listen_backlog,
                        upstream_protocol: m.upstream_protocol,
                        sysctls: m.sysctls,
                        front: m.front,
                        hop: m.hop,
                        version: m.version,
                    }),
                    (None, Some(url), None) => {
                        if !(url.starts_with("http://") || url.starts_with("https://")) {
                            return Err(de::Error::custom(format!(
                                "upstream `{url}` must be an http:// or https:// URL"
                            )));
                        }
                        let name = m.name.ok_or_else(|| {
                            de::Error::custom("an upstream target needs a `name`")
                        })?;
                        Ok(Target::Upstream { name, url })
                    }
                    _ => Err(de::Error::custom(
                        "a target has exactly one of `proxy`, `upstream` or `cluster`",
                    )),
                }
            }
        }
        deserializer.deserialize_any(TargetVisitor)
    }
}

/// How load is paced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadModeFile {
    /// Constant rate (`rate`).
    #[default]
    Open,
    /// Each connection sends when answered.
    Closed,
    /// One at a time, with `interval` between.
    Sequential,
}

/// Where the load is sent from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadFrom {
    /// This machine.
    #[default]
    Here,
    /// Pods of the cluster (an Indexed Job in the cell's namespace).
    Cluster,
}

/// Where the cluster's load pods go: beside what, or on nodes with these labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementFile {
    /// Relative to the run's pods.
    pub node: Option<NodePlacement>,
    /// Or on nodes with these labels (`nodeSelector`).
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
}

/// Which nodes, relative to the run's pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodePlacement {
    /// Where a backend of the run runs.
    SameAsBackends,
    /// Where none does.
    OtherThanBackends,
    /// Where a pod of the ingress controller runs.
    SameAsIngress,
    /// Anywhere.
    Any,
}

/// What the load sends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadKindFile {
    /// HTTP requests.
    #[default]
    Http,
    /// Messages over WebSockets, one per connection, at `rate` messages a second.
    Websocket,
    /// Server-sent events, one stream per connection, at `rate` events a second.
    Sse,
    /// gRPC unary calls to the backend's echo service, at `rate` calls a second over
    /// `connections` HTTP/2 connections; the proxies speak HTTP/2 to the backends.
    Grpc,
    /// gRPC server streams, one per connection, at `rate` messages a second.
    GrpcStream,
}

impl LoadKindFile {
    /// Whether it is gRPC (which the proxies carry as HTTP/2 to the backends).
    pub fn is_grpc(self) -> bool {
        matches!(self, Self::Grpc | Self::GrpcStream)
    }
}

/// `load.stream: { message_bytes: 64, reconnect: backoff }` (also `load.websocket`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamLoadFile {
    /// Each message's (event's) size (default 64 bytes, at least 16).
    pub message_bytes: Option<usize>,
    /// What a cut WebSocket, event stream, gRPC connection or stream does: `none`,
    /// `immediate`, `backoff`
    /// (default: 100ms doubling to 10s, full jitter) or `backoff:FIRST-MAX`.
    pub reconnect: Option<String>,
}

/// The load, as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadFile {
    /// What it sends: `http` (default), `websocket` or `sse`.
    #[serde(default)]
    pub kind: LoadKindFile,
    /// With `kind: websocket` or `sse`: its messages (events) and reconnects.
    #[serde(alias = "websocket")]
    pub stream: Option<StreamLoadFile>,
    /// How it is paced.
    #[serde(default)]
    pub mode: LoadModeFile,
    /// Requests per second (open loop).
    pub rate: Option<f64>,
    /// Connections (open and closed loop).
    pub connections: Option<usize>,
    /// Worker threads.
    pub threads: Option<usize>,
    /// Processes sending one schedule between them (each with `threads` threads), their
    /// results merged exactly (default 1).
    pub workers: Option<usize>,
    /// Where the load is sent from: this machine (default), or pods of the cluster
    /// (`run --cluster` only).
    #[serde(default)]
    pub from: LoadFrom,
    /// Where the cluster's load pods go (`from: cluster`).
    pub placement: Option<PlacementFile>,
    /// How long before the load's start its pods are made (`from: cluster`, default
    /// 5s): the time a cluster has to schedule and start them.
    pub start_margin: Option<String>,
    /// How long to measure (`60s`).
    pub duration: Option<String>,
    /// Or how many requests to measure.
    pub requests: Option<u64>,
    /// Excluded at the start: a time …
    pub warmup: Option<String>,
    /// … or a number of requests.
    pub warmup_requests: Option<u64>,
    /// Pause between sequential requests.
    pub interval: Option<String>,
    /// Reuse connections (default true).
    #[serde(default = "yes")]
    pub keepalive: bool,
    /// `http1` (default) or `http2` (ALPN `h2` over TLS, h2c with prior knowledge over
    /// plain HTTP).
    pub protocol: Option<String>,
    /// HTTP/2: the most streams in flight on one connection (default: the server's
    /// limit, at most 100).
    pub streams: Option<u32>,
    /// Request path (default `/`).
    #[serde(default = "root")]
    pub path: String,
    /// Host to request (default app.test); sent as Host and TLS server name.
    pub host: Option<String>,
    /// Extra request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Share of requests kept as samples (default 0.1).
    #[serde(default = "tenth")]
    pub sample_rate: f64,
    /// Limit per request (default 10s).
    pub timeout: Option<String>,
    /// What the client does when a reused connection fails before any byte of the
    /// answer: `none`, `idempotent` (default) or `always` (see `load --retry-policy`).
    pub retry: Option<String>,
}

fn root() -> String {
    "/".to_owned()
}

fn tenth() -> f64 {
    0.1
}

/// An event as written: exactly one timing and one action.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventFile {
    /// At this time after the start of measurement.
    pub at: Option<String>,
    /// Every this long (from `at`, default from the start).
    pub every: Option<String>,
    /// How many times, with `every`.
    pub times: Option<u32>,
    /// Before sequential request number N (from 1), and before every Nth with `times`.
    pub before_request: Option<u64>,
    /// Overrides the controller's propagation delay for this event.
    pub propagation_delay: Option<String>,
    /// Scale the (first) pool to N replicas.
    pub scale: Option<usize>,
    /// SIGKILL a backend: `random` or a name.
    pub kill: Option<String>,
    /// SIGTERM (drain) a backend: `random` or a name.
    pub terminate: Option<String>,
    /// Route changes (`revert` undoes them).
    pub config: Option<ConfigChange>,
    /// Push the configuration again without a change.
    pub reload: Option<bool>,
    /// Stop the proxy its own graceful way and start it again (as a service manager's
    /// restart; with a front, one replica at a time).
    pub restart: Option<bool>,
    /// Upgrade the proxy through its own zero-downtime mechanism (nginx's binary upgrade,
    /// HAProxy's master re-exec, Envoy's hot restart; a restart for Traefik and Caddy):
    /// `same` upgrades to the binary it runs (the mechanism is what is measured), a
    /// version (`1.40.0`) or a version per proxy (`{ envoy: 1.40.0, traefik: 3.7.15 }`)
    /// to that version, installed beside the one the target starts with.
    pub upgrade: Option<UpgradeTo>,
    /// With `restart` or `upgrade`: how long the stopped proxy has to end what it serves before what
    /// is left of it is killed (default 5s; a service manager gives 90s).
    pub grace: Option<String>,
    /// Make a backend stop answering for a while: `{ backend: NAME, for: 2s }`.
    pub stall_backend: Option<StallFile>,
    /// Add this many generated routes, in one update of the proxy.
    pub add_routes: Option<usize>,
    /// Remove this many generated routes (the last added), in one update.
    pub remove_routes: Option<usize>,
    /// Change this many generated routes (the lowest numbers) in one update: each answers
    /// a new revision in a response header.
    pub change_routes: Option<usize>,
    /// With `add_routes` or `remove_routes`: one route per update, the next once the
    /// last answers as it should (or is given up).
    pub one_at_a_time: Option<bool>,
    /// Generated routes to these counts in turn, each step in one update, the next once
    /// the last step's routes answer as they should and `pause` has passed.
    pub route_steps: Option<RouteStepsFile>,
}

/// `route_steps: { to: [50, 100, 300], pause: 2s }`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RouteStepsFile {
    /// The generated route counts, in turn.
    pub to: Vec<usize>,
    /// How long each count is held once its routes are right (default 2s).
    pub pause: Option<String>,
}

/// A scenario's routes: its own, and how many generated ones on top of them.
#[derive(Clone, Debug, Default)]
pub struct RoutesFile {
    /// The scenario's own routes.
    pub own: Vec<RouteFile>,
    /// Generated routes (`rN.routes.test`, N from 0), over the pools in turn.
    pub count: usize,
    /// How the routes that events add or remove are probed.
    pub probe: ProbeFile,
}

/// How the routes that events add or remove are probed until they answer as the change
/// says (`routes: { count: N, probe: { rate: 2000 } }`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProbeFile {
    /// Probes per second over every pending route (one in flight per route).
    #[serde(default = "ProbeFile::default_rate")]
    pub rate: f64,
    /// Connections the probes share.
    #[serde(default = "ProbeFile::default_connections")]
    pub connections: usize,
    /// A route not right this long after its change is named never right.
    #[serde(default = "ProbeFile::default_give_up")]
    pub give_up_after: String,
}

impl ProbeFile {
    fn default_rate() -> f64 {
        2000.0
    }
    fn default_connections() -> usize {
        4
    }
    fn default_give_up() -> String {
        "60s".into()
    }
}

impl Default for ProbeFile {
    fn default() -> Self {
        Self {
            rate: Self::default_rate(),
            connections: Self::default_connections(),
            give_up_after: Self::default_give_up(),
        }
    }
}

impl RoutesFile {
    /// Every route: its own, then the generated ones over `pools`.
    pub fn all(&self, pools: &[String]) -> Vec<RouteFile> {
        let generated = (0..self.count).map(|i| {
            let r = ingressbench_lab::model::generated_route(i, pools);
            RouteFile {
                host: r.host,
                path_prefix: r.path_prefix,
                pool: r.pool,
            }
        });
        self.own.iter().cloned().chain(generated).collect()
    }
}

impl<'de> Deserialize<'de> for RoutesFile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Generated {
            count: usize,
            #[serde(default)]
            routes: Vec<RouteFile>,
            #[serde(default)]
            probe: ProbeFile,
        }
        // Either form read from the file as it streams, so that a mistake inside one is
        // named where it is (`5:5: unknown field `hots``), not as "matched neither".
        struct Either;
        impl<'de> de::Visitor<'de> for Either {
            type Value = RoutesFile;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of { host, path_prefix, pool }, or { count: N, routes: [...] } for N generated routes on top of them")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, a: A) -> Result<RoutesFile, A::Error> {
                let own = Vec::<RouteFile>::deserialize(de::value::SeqAccessDeserializer::new(a))?;
                Ok(RoutesFile {
                    own,
                    count: 0,
                    probe: ProbeFile::default(),
                })
            }
            fn visit_map<A: de::MapAccess<'de>>(self, a: A) -> Result<RoutesFile, A::Error> {
                let g = Generated::deserialize(de::value::MapAccessDeserializer::new(a))?;
                Ok(RoutesFile {
                    own: g.routes,
                    count: g.count,
                    probe: g.probe,
                })
            }
        }
        d.deserialize_any(Either)
    }
}

/// A route change: an overlay, or `revert`.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigChange {
    /// Apply these changes.
    Set(OverlayFileEq),
    /// Back to the scenario's `overlay`.
    Revert,
}

/// An overlay as written (comparable).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OverlayFileEq {
    /// `(name, value)` of a response header.
    pub response_header: Option<(String, String)>,
    /// CORS origin.
    pub cors_origin: Option<String>,
    /// `(from, to)` of a path-prefix rewrite.
    pub rewrite: Option<(String, String)>,
}

impl<'de> Deserialize<'de> for ConfigChange {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ConfigChange;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`revert` or { response_header: {name, value}, cors_origin, rewrite: {from, to} }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ConfigChange, E> {
                if v == "revert" {
                    Ok(ConfigChange::Revert)
                } else {
                    Err(E::custom(format!(
                        "`{v}`: expected `revert` or a map of changes"
                    )))
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ConfigChange, A::Error> {
                let o = OverlayFile::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let o = o.to_overlay();
                Ok(ConfigChange::Set(OverlayFileEq {
                    response_header: o.response_header,
                    cors_origin: o.cors_origin,
                    rewrite: o.rewrite,
                }))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A stall as written.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StallFile {
    /// The backend (`random` or a name).
    pub backend: String,
    /// How long.
    #[serde(rename = "for")]
    pub duration: String,
}

/// When an event fires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Timing {
    /// Once, at this time after the start of measurement.
    At(Duration),
    /// `times` times, `every` apart, the first at `first`.
    Every {
        /// First firing.
        first: Duration,
        /// Period.
        every: Duration,
        /// Count.
        times: u32,
    },
    /// Before sequential requests `first`, `first + every`, … (`times` of them).
    BeforeRequest {
        /// First request number (from 1).
        first: u64,
        /// Requests between firings.
        every: u64,
        /// Count.
        times: u32,
    },
}

impl Timing {
    /// How many times the event fires.
    pub fn times(&self) -> u32 {
        match self {
            Timing::At(_) => 1,
            Timing::Every { times, .. } | Timing::BeforeRequest { times, .. } => *times,
        }
    }
}

/// What an event does.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Scale the first pool.
    Scale(usize),
    /// SIGKILL a backend (`None`: at random).
    Kill(Option<String>),
    /// SIGTERM a backend (`None`: at random).
    Terminate(Option<String>),
    /// Route changes.
    Config(ConfigChange),
    /// Reload without change.
    Reload,
    /// Upgrade the proxy its own way, to the binary it runs or to another version.
    Upgrade {
        /// How long a stopped proxy has to end what it serves (where the upgrade stops it).
        grace: Duration,
        /// To what.
        to: UpgradeTo,
    },
    /// Stop the proxy and start it again, killing it after `grace`.
    Restart {
        /// How long it has to end what it serves.
        grace: Duration,
    },
    /// Add generated routes.
    AddRoutes(usize),
    /// Remove generated routes.
    RemoveRoutes(usize),
    /// Change generated routes (a new revision on each).
    ChangeRoutes(usize),
    /// Generated routes to these counts in turn, each held `pause` once right.
    RouteSteps {
        /// The counts.
        to: Vec<usize>,
        /// How long each is held.
        pause: Duration,
    },
    /// Stall a backend for a while.
    StallBackend {
        /// `None`: at random.
        backend: Option<String>,
        /// How long.
        duration: Duration,
    },
}

impl Action {
    /// Its kind, as the scenario file names it (the live metrics' `kind` label).
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Scale(_) => "scale",
            Action::Kill(_) => "kill",
            Action::Terminate(_) => "terminate",
            Action::Config(_) => "config",
            Action::Reload => "reload",
            Action::Upgrade { .. } => "upgrade",
            Action::Restart { .. } => "restart",
            Action::AddRoutes(_) => "add_routes",
            Action::RemoveRoutes(_) => "remove_routes",
            Action::ChangeRoutes(_) => "change_routes",
            Action::RouteSteps { .. } => "route_steps",
            Action::StallBackend { .. } => "stall_backend",
        }
    }

    /// Whether it adds, removes or changes generated routes (the route probe times it).
    pub fn is_route_event(&self) -> bool {
        matches!(
            self,
            Action::AddRoutes(_)
                | Action::RemoveRoutes(_)
                | Action::ChangeRoutes(_)
                | Action::RouteSteps { .. }
        )
    }
}

/// A validated event.
#[derive(Clone, Debug, PartialEq)]
pub struct EventSpec {
    /// When.
    pub timing: Timing,
    /// What.
    pub action: Action,
    /// Delay before the proxies are told (`None`: the controller's).
    pub propagation_delay: Option<Duration>,
    /// Routes added or removed one per update, each once the last is right.
    pub one_at_a_time: bool,
}

fn duration(field: &str, v: &str) -> Result<Duration, String> {
    ingressbench_stats::parse_duration(v).map_err(|e| format!("{field}: {e}"))
}

fn random_or_name(v: &str) -> Option<String> {
    (v != "random").then(|| v.to_owned())
}

impl EventFile {
    /// Checks that exactly one timing and one action are given, and parses them.
    pub fn validate(&self, index: usize) -> Result<EventSpec, String> {
        let here = |m: String| format!("events[{index}]: {m}");
        let actions = [
            self.scale.is_some(),
            self.kill.is_some(),
            self.terminate.is_some(),
            self.config.is_some(),
            self.reload.is_some(),
            self.restart.is_some(),
            self.upgrade.is_some(),
            self.stall_backend.is_some(),
            self.add_routes.is_some(),
            self.remove_routes.is_some(),
            self.change_routes.is_some(),
            self.route_steps.is_some(),
        ];
        if actions.iter().filter(|a| **a).count() != 1 {
            return Err(here(
                "give exactly one action: scale, kill, terminate, config, reload, restart, upgrade, stall_backend, add_routes, remove_routes, change_routes or route_steps"
                    .into(),
            ));
        }
        if self.grace.is_some() && self.restart != Some(true) && self.upgrade.is_none() {
            return Err(here(
                "grace: only a restart or an upgrade has a grace (how long the stopped proxy has to end what it serves)".into(),
            ));
        }
        let grace = duration("grace", self.grace.as_deref().unwrap_or("5s")).map_err(here)?;
        let action = if let Some(n) = self.scale {
            Action::Scale(n)
        } else if let Some(k) = &self.kill {
            Action::Kill(random_or_name(k))
        } else if let Some(t) = &self.terminate {
            Action::Terminate(random_or_name(t))
        } else if let Some(c) = &self.config {
            Action::Config(c.clone())
        } else if self.reload == Some(true) {
            Action::Reload
        } else if self.restart == Some(true) {
            Action::Restart { grace }
        } else if let Some(to) = &self.upgrade {
            Action::Upgrade {
                grace,
                to: to.clone(),
            }
        } else if let Some(n) = self.add_routes {
            Action::AddRoutes(n)
        } else if let Some(n) = self.remove_routes {
            Action::RemoveRoutes(n)
        } else if let Some(n) = self.change_routes {
            Action::ChangeRoutes(n)
        } else if let Some(steps) = &self.route_steps {
            if steps.to.is_empty() {
                return Err(here("route_steps.to: give at least one count".into()));
            }
            Action::RouteSteps {
                to: steps.to.clone(),
                pause: duration("route_steps.pause", steps.pause.as_deref().unwrap_or("2s"))
                    .map_err(here)?,
            }
        } else if let Some(s) = &self.stall_backend {
            Action::StallBackend {
                backend: random_or_name(&s.backend),
                duration: duration("stall_backend.for", &s.duration).map_err(here)?,
            }
        } else {
            return Err(here(
                "`reload: false` does nothing; remove the event".into(),
            ));
        };
        let times = self.times.unwrap_or(1);
        if times == 0 {
            return Err(here("`times` must be at least 1".into()));
        }
        if let Some(n) = self.before_request {
            if self.at.is_some() || self.every.is_some() {
                return Err(here(format!(
                    "`before_request: {n}` cannot be combined with `at` or `every`"
                )));
            }
        }
        let timing = match (&self.at, &self.every, self.before_request) {
            (_, _, Some(0)) => return Err(here("`before_request` counts from 1".into())),
            (_, _, Some(first)) => Timing::BeforeRequest {
                first,
                every: first,
                times,
            },
            (at, Some(every), None) => {
                let every = duration("every", every).map_err(here)?;
                if every.is_zero() {
                    return Err(here("`every` must be longer than 0".into()));
                }
                let first = at
                    .as_deref()
                    .map(|a| duration("at", a))
                    .transpose()
                    .map_err(here)?
                    .unwrap_or(every);
                Timing::Every {
                    first,
                    every,
                    times,
                }
            }
            (Some(at), None, None) => {
                if self.times.is_some() {
                    return Err(here("`times` needs `every` (or `before_request`)".into()));
                }
                Timing::At(duration("at", at).map_err(here)?)
            }
            (None, None, None) => {
                return Err(here(
                    "give a time: `at`, `every` (with `times`), or `before_request`".into(),
                ))
            }
        };
        let propagation_delay = self
            .propagation_delay
            .as_deref()
            .map(|d| duration("propagation_delay", d))
            .transpose()
            .map_err(here)?;
        let one_at_a_time = self.one_at_a_time == Some(true);
        if one_at_a_time && !matches!(action, Action::AddRoutes(_) | Action::RemoveRoutes(_)) {
            return Err(here(
                "`one_at_a_time` goes with add_routes or remove_routes".into(),
            ));
        }
        Ok(EventSpec {
            timing,
            action,
            propagation_delay,
            one_at_a_time,
        })
    }
}
