//! The scenario file as written, and its validated parts.

use std::collections::BTreeMap;
use std::fmt;

use ingressbench_lab::labfile::{
    FrontFile, HopFile, OverlayFile, PoolFile, RouteFile, SysctlsFile, TopologyFile, TuningFile,
};
use ingressbench_lab::model::UpstreamProtocol;
use ingressbench_lab::proxy::{HaproxyUpdate, ProxyKind};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

mod events;
pub(crate) use events::Action;
pub use events::{ConfigChange, EventFile, EventSpec, Timing};

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
    /// A soak: the load runs for `duration` while the timeline of `events` repeats
    /// ([`crate::soak`]).
    pub soak: Option<SoakFile>,
}

/// `soak:`: hours of load under the scenario's events, repeated on their timeline, with a
/// results directory of bounded size.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoakFile {
    /// How long the load runs (`1h`).
    pub duration: String,
    /// The timeline's length: its events fire again every this long (default: the
    /// load's `duration`).
    pub period: Option<String>,
    /// How many sampled requests from outside the events' windows are kept, chosen
    /// uniformly (default 20,000).
    pub reservoir: Option<usize>,
    /// The most the run's results directory may take (`500MB`; default 1GB): a soak
    /// whose estimate is larger is refused with its arithmetic.
    pub budget: Option<String>,
    /// How often the tool writes down its own cost and the directory's size (default
    /// 1m).
    pub every: Option<String>,
    /// Where in the soak's time this run starts (default 0): its events go on in phase,
    /// and the load runs the rest. `run --resume` sets it on a soak that was cut off.
    pub from: Option<String>,
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
        /// The kind of proxy (`nginx`, `haproxy`…).
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
/// which a cluster target takes as its own. Not its `version`: the release a lab proxy
/// starts at, for an upgrade to another; a controller runs its own, and the upgrade is
/// then to the version it runs (docs/CLUSTER.md), which its results say.
pub(crate) const LAB_ONLY_TARGET_KEYS: [&str; 9] = [
    "update",
    "workers",
    "keepalive_requests",
    "upstream_keepalive",
    "listen_backlog",
    "upstream_protocol",
    "sysctls",
    "front",
    "hop",
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
    /// HTTP/3: resume sessions and send each later connection's first requests as
    /// 0-RTT data (`load --zero-rtt`); TCP's connections always pay a full handshake, so
    /// a matrix's http1 and http2 cells run as without it.
    #[serde(default)]
    pub zero_rtt: bool,
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
