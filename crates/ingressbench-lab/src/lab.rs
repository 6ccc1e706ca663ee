//! A lab: echo backends as separate processes, a CA and certificate, and proxies in front,
//! all in a private directory, all torn down when the lab is dropped.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_stats::HistogramUs;

use crate::certs::{self, LabCerts};
use crate::front::Front;
use crate::kernel::{self, ListenCounters, NodeSysctls};
use crate::model::{
    check_name, generated_index, Generation, Overlay, Pool, Route, RouteTable, Tuning,
    UpstreamProtocol, GENERATED_DOMAIN, GENERATION_HEADER, SIDECAR_GENERATION_HEADER,
};
use crate::process::{OwnedChild, RunAs};
use crate::proxy::{Binaries, Proxy, ProxyKind, ProxyOptions, UpstreamMtls};
use crate::reaper::Reaper;
use crate::relay::Relay;
use crate::routes::{is_route_change, RoutesDelta};
use crate::topology::{Isolation, Node, Nodes, Topology};
use crate::usage::Part;
use crate::LabError;

/// How long a backend may take to say where it listens.
const BACKEND_START_TIMEOUT: Duration = Duration::from_secs(10);
/// The start of a lab directory's name (then the owner's pid and a time stamp).
const DIR_PREFIX: &str = "ingressbench-lab-";
/// The file that marks a lab directory as kept on purpose.
const KEPT: &str = "KEPT";
/// How long a drained backend may take to exit.
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// A pool of identical backends.
#[derive(Clone, Debug)]
pub struct PoolSpec {
    /// Pool name; its backends are called `NAME-1`, `NAME-2`, …
    pub name: String,
    /// How many replicas to start.
    pub replicas: usize,
    /// Extra `ingressbench backend` options (`--latency 2ms`, `--body-bytes 100`, …).
    pub backend_args: Vec<String>,
}

/// What to bring up.
#[derive(Clone, Debug)]
pub struct LabSpec {
    /// Proxies, each in front of every pool.
    pub proxies: Vec<ProxyKind>,
    /// Backend pools.
    pub pools: Vec<PoolSpec>,
    /// Routes from host and path prefix to pools.
    pub routes: Vec<Route>,
    /// Header, CORS and rewrite changes in force at start.
    pub overlay: Overlay,
    /// Tuning knobs, equal across proxies.
    pub tuning: Tuning,
    /// Terminate TLS (with a certificate from the lab's own CA) besides plain HTTP.
    pub tls: bool,
    /// The `ingressbench` binary, run as `ingressbench backend`.
    pub backend_binary: PathBuf,
    /// Where proxy binaries are found.
    pub binaries: Binaries,
    /// Keep the lab's directory (configs, logs, keys) after tear-down.
    pub keep: bool,
    /// How proxies are updated.
    pub proxy_options: ProxyOptions,
    /// An L4 load balancer in front of this many replicas of each proxy (`None`: each
    /// proxy once, reached directly).
    pub front: Option<usize>,
    /// An extra hop: a sidecar between the proxies and the backends.
    pub hop: Option<HopSpec>,
    /// Where each part runs, and the links on the paths that cross nodes.
    pub topology: Topology,
    /// Kernel settings per node (namespace isolation only).
    pub sysctls: NodeSysctls,
}

/// An extra proxy on the path: an Envoy sidecar beside the proxies, as a service mesh puts
/// beside an ingress controller that joins it. The proxies send every request to it; it
/// routes to the backends (and is the one told when they change).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HopSpec {
    /// Mutual TLS from the sidecar to the backends, which then demand a client
    /// certificate from the lab's CA.
    pub mtls: bool,
}

impl LabSpec {
    /// One pool `echo` of `replicas` backends behind `proxies`, routing every host.
    pub fn simple(proxies: Vec<ProxyKind>, replicas: usize, backend_binary: PathBuf) -> Self {
        Self {
            proxies,
            pools: vec![PoolSpec {
                name: "echo".into(),
                replicas,
                backend_args: Vec::new(),
            }],
            routes: vec![Route {
                host: "*".into(),
                path_prefix: "/".into(),
                pool: "echo".into(),
                revision: 0,
            }],
            overlay: Overlay::default(),
            tuning: Tuning::default(),
            tls: true,
            backend_binary,
            binaries: Binaries::discover(),
            keep: false,
            proxy_options: ProxyOptions::default(),
            front: None,
            hop: None,
            topology: Topology::default(),
            sysctls: NodeSysctls::default(),
        }
    }

    /// Every check [`Lab::up`] makes of the spec before it starts anything (pool names,
    /// routes, every value that reaches a proxy's configuration), with the spec's overlay
    /// and with each of `overlays` (the route changes its events will ask for): what a
    /// proxy would be refused is known before the first cell starts.
    pub fn check(&self, overlays: &[Overlay]) -> Result<(), LabError> {
        for pool in &self.pools {
            check_name("pool", &pool.name)?;
        }
        for overlay in std::iter::once(&self.overlay).chain(overlays) {
            self.route_table(overlay, |_| Vec::new(), 1).validate()?;
        }
        self.check_upstream_protocol()?;
        self.check_kernel()
    }

    /// HTTP/2 to the backends only from proxies that can speak it.
    fn check_upstream_protocol(&self) -> Result<(), LabError> {
        let protocol = self.tuning.upstream_protocol;
        if protocol == UpstreamProtocol::Http2 && self.proxies.contains(&ProxyKind::Nginx) {
            return Err(LabError::InvalidValue {
                field: "tuning.upstream_protocol".into(),
                value: protocol.name().into(),
                reason: "nginx proxies HTTP only as HTTP/1.x to its upstreams (its HTTP/2 upstream side, grpc_pass, is for gRPC): keep http1 for nginx, or give upstream_protocol: http2 only to the haproxy, envoy, traefik and caddy targets".into(),
            });
        }
        Ok(())
    }

    /// Kernel settings: per namespace only (never the machine's), on nodes this lab has,
    /// and a listen backlog only for proxies that have one.
    fn check_kernel(&self) -> Result<(), LabError> {
        if let Some(b) = self.tuning.listen_backlog {
            if let Some(kind) = self
                .proxies
                .iter()
                .find(|k| matches!(k, ProxyKind::Traefik | ProxyKind::Caddy))
            {
                return Err(LabError::InvalidValue {
                    field: "tuning.listen_backlog".into(),
                    value: b.to_string(),
                    reason: format!("{kind} has no listen backlog setting (Go listens with the node's net.core.somaxconn): set tuning.sysctls.net.core.somaxconn instead, or give listen_backlog only to nginx, HAProxy and Envoy targets"),
                });
            }
        }
        if self.sysctls.is_empty() {
            return Ok(());
        }
        if self.topology.isolation != Isolation::Netns {
            return Err(LabError::InvalidValue {
                field: "tuning.sysctls".into(),
                value: self.sysctls.names().join(", "),
                reason: "kernel settings are set per node namespace, and loopback nodes share the machine's own (the tool never changes the machine's): set topology.isolation: netns (root)".into(),
            });
        }
        let pools: Vec<&str> = self.pools.iter().map(|p| p.name.as_str()).collect();
        for node in self.sysctls.nodes.keys() {
            self.topology
                .check_node(node, &pools, "tuning.nodes")
                .map_err(|reason| LabError::InvalidValue {
                    field: "tuning.nodes".into(),
                    value: node.clone(),
                    reason,
                })?;
        }
        self.sysctls.check()
    }

    /// The route table of this spec with `overlay`, its pools' endpoints from `endpoints`.
    fn route_table(
        &self,
        overlay: &Overlay,
        endpoints: impl Fn(&str) -> Vec<SocketAddr>,
        generation: u32,
    ) -> RouteTable {
        RouteTable {
            pools: self
                .pools
                .iter()
                .map(|p| Pool {
                    name: p.name.clone(),
                    endpoints: endpoints(&p.name),
                })
                .collect(),
            routes: self.routes.clone(),
            overlay: overlay.clone(),
            tuning: self.tuning.clone(),
            generation: Generation {
                header: GENERATION_HEADER,
                value: generation,
            },
        }
    }
}

/// One running backend.
#[derive(Debug)]
pub struct Backend {
    /// Its name (sent in `x-backend`).
    pub name: String,
    /// Its pool.
    pub pool: String,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its node.
    pub node: String,
    /// The link in front of it, when it sits on another node than the proxies.
    relay: Option<Relay>,
    child: OwnedChild,
}

impl Backend {
    /// Where the proxies reach it: its link's relay, or itself.
    pub fn routed_addr(&self) -> SocketAddr {
        self.relay.as_ref().map_or(self.addr, Relay::addr)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }
}

/// A running lab. Dropping it stops every process it started and removes its directory
/// (unless `keep` was asked).
pub struct Lab {
    spec: LabSpec,
    dir: PathBuf,
    certs: Option<LabCerts>,
    backends: Vec<Backend>,
    proxies: Vec<Proxy>,
    /// The node of each proxy, in the same order.
    proxy_nodes: Vec<String>,
    front: Option<Front>,
    nodes: Nodes,
    entry_relays: Option<(Relay, Option<Relay>)>,
    /// The links between the front and the proxies' replicas (plain and TLS ports).
    front_relays: Vec<Relay>,
    sidecar: Option<Proxy>,
    sidecar_relay: Option<Relay>,
    told_proxies: Option<RouteTable>,
    reload_due: bool,
    /// A restart (or, with the binary and version line each kind goes to, an upgrade)
    /// was asked and not yet done, with its grace.
    restart_due: Option<(Duration, Option<UpgradeTo>)>,
    /// A restart begun and not finished: it holds every change to the proxies.
    restarting: Option<Restarting>,
    overlay: Overlay,
    /// The proxies' configuration generation, bumped by every route change and reload.
    generation: u32,
    /// The sidecar's, bumped by every reload (route changes stop at the proxies).
    sidecar_generation: u32,
    serial: usize,
    startup: Duration,
    reaper: Option<Reaper>,
    /// Set when the run that drives the lab was stopped: a restart's grace ends there.
    stopping: Arc<AtomicBool>,
    terminating: Vec<(Backend, Instant)>,
    pending: Vec<(Instant, usize)>,
    stalled: Vec<(String, Instant)>,
    records: Vec<ChangeRecord>,
}

/// A restart (or an upgrade by stop and start) begun and not finished: the records it
/// applies, and the mechanism each proxy takes it by.
struct Restarting {
    records: Vec<usize>,
    mechanisms: Vec<(ProxyKind, &'static str)>,
}

impl ChangeRecord {
    /// A change asked for at `requested_at`, nothing of it done yet.
    pub fn asked(what: String, requested_at: Instant) -> Self {
        Self {
            on_proxies: false,
            what,
            requested_at,
            applied_at: None,
            endpoints_at: None,
            reported_at: None,
            completed_at: None,
            mechanisms: Vec::new(),
            versions: Vec::new(),
            started: Vec::new(),
            removed: Vec::new(),
            generations: Vec::new(),
        }
    }
}

/// What an upgrade goes to: per kind of proxy named, the binary and its version line.
type UpgradeTo = BTreeMap<ProxyKind, (PathBuf, String)>;

/// A change to the system under test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Start or stop backends of a pool until it has this many (stopping is graceful).
    Scale {
        /// The pool.
        pool: String,
        /// Replicas wanted.
        replicas: usize,
    },
    /// SIGKILL a backend (a crash); `None` picks one at random.
    Kill(Option<String>),
    /// SIGTERM a backend (it drains, then exits); `None` picks one at random.
    Terminate(Option<String>),
    /// Change the response header, CORS and rewrite (an empty overlay reverts).
    Overlay(Overlay),
    /// Push the current configuration again without a change (a reload).
    Reload,
    /// Stop each proxy its own graceful way and start it again, one after another (with
    /// a front, a rolling restart of its replicas), killing what is left of one after
    /// `grace`.
    Restart {
        /// How long a stopped proxy has to end what it serves.
        grace: Duration,
    },
    /// Upgrade each proxy to the binary it runs, through its own zero-downtime mechanism
    /// where it has one (nginx's binary upgrade, HAProxy's master re-exec, Envoy's hot
    /// restart), by a restart where its maintainers document none (Traefik, Caddy).
    Upgrade {
        /// How long a stopped proxy has to end what it serves (Traefik, Caddy), or an
        /// Envoy epoch drains.
        grace: Duration,
        /// The version each kind of proxy named goes to (installed beside the one it
        /// runs: [`crate::proxy::Binaries::locate_version`]); the others upgrade to the
        /// binary they run.
        to: BTreeMap<ProxyKind, String>,
    },
    /// Replace the routes with these (routes added, removed or sent elsewhere), in one
    /// update of each proxy, its own way.
    Routes(Vec<Route>),
    /// Add this many generated routes (`rN.routes.test`, after the last there is, over
    /// the pools in turn), in one update.
    AddRoutes(usize),
    /// Remove this many generated routes (the last ones), in one update.
    RemoveRoutes(usize),
    /// Add or remove generated routes until there are this many, in one update.
    GeneratedRoutes(usize),
    /// Change this many generated routes (the lowest numbers) in one update: each answers
    /// a new revision in [`crate::model::ROUTE_REVISION_HEADER`] (one above the highest
    /// any route has), as a user's edit of a route's response headers would.
    ChangeRoutes(usize),
    /// Freeze a backend (SIGSTOP) for a while, then let it go on (SIGCONT): a stuck
    /// process or a long GC pause. Its socket still accepts connections; nothing answers.
    /// The control plane does not notice, so the proxies are not told.
    Stall {
        /// The backend; `None` picks one at random.
        backend: Option<String>,
        /// How long it stays frozen.
        duration: Duration,
    },
}

/// What became of one requested change.
#[derive(Clone, Debug)]
pub struct ChangeRecord {
    /// What was asked, in words (`scale echo 3->4`, `kill echo-2`, …).
    pub what: String,
    /// When it was asked for (and the backend side happened).
    pub requested_at: Instant,
    /// When the proxies were told, after the propagation delay.
    pub applied_at: Option<Instant>,
    /// When the Service's EndpointSlices showed the change (in a cluster; the lab has
    /// none, its controller tells the proxies directly).
    pub endpoints_at: Option<Instant>,
    /// How each proxy took it.
    pub mechanisms: Vec<(ProxyKind, &'static str)>,
    /// After a restart or an upgrade, the version line each proxy runs.
    pub versions: Vec<(ProxyKind, String)>,
    /// Backends started by it.
    pub started: Vec<String>,
    /// Backends stopped or killed by it.
    pub removed: Vec<String>,
    /// The configuration generations that carry it, by response header: answers with
    /// this generation or a later one in that header were served after the change.
    pub generations: Vec<(&'static str, u32)>,
    /// When its controller reported it in the route's status (in a cluster, through the
    /// Gateway API: the HTTPRoute's conditions observed its generation).
    pub reported_at: Option<Instant>,
    /// After a controller's restart in a cluster: when it was complete (a rollout's every
    /// replica new and available; the local cluster's process ready). Its `applied_at` is
    /// when the first new pod (process) was ready.
    pub completed_at: Option<Instant>,
    /// Made to the proxies themselves (their routes, configuration or processes: a route
    /// change, a reload, a restart, an upgrade), or applied to them by a mechanism that
    /// can end their connections (nginx reloads for a backend's change too): what closes
    /// the connections they hold.
    pub on_proxies: bool,
}

impl Lab {
    /// Waits the lab makes for a proxy to drain (a restart's grace) end when `stopping`
    /// is set: a run stopped with Ctrl-C does not wait out a 15 s grace.
    pub fn cut_waits_short_on(&mut self, stopping: Arc<AtomicBool>) {
        self.stopping = stopping;
    }

    /// Starts the backends, then the proxies, and waits until each listens.
    pub fn up(spec: LabSpec) -> Result<Lab, LabError> {
        let started = Instant::now();
        for pool in &spec.pools {
            check_name("pool", &pool.name)?;
        }
        spec.check_upstream_protocol()?;
        spec.check_kernel()?;
        remove_leftovers();
        let nodes = Nodes::new(spec.topology.isolation)?;
        let dir = private_dir()?;
        let mut reaper = Reaper::start(&spec.backend_binary)?;
        if spec.keep {
            mark_kept(&dir);
        } else {
            reaper.remove_on_death(&dir);
        }
        let mut lab = Lab {
            reaper: Some(reaper),
            overlay: spec.overlay.clone(),
            spec,
            dir,
            certs: None,
            backends: Vec::new(),
            proxies: Vec::new(),
            proxy_nodes: Vec::new(),
            front: None,
            nodes,
            entry_relays: None,
            front_relays: Vec::new(),
            sidecar: None,
            sidecar_relay: None,
            told_proxies: None,
            reload_due: false,
            restart_due: None,
            restarting: None,
            stopping: Arc::default(),
            generation: 1,
            sidecar_generation: 1,
            serial: 0,
            startup: Duration::ZERO,
            terminating: Vec::new(),
            pending: Vec::new(),
            stalled: Vec::new(),
            records: Vec::new(),
        };
        match lab.start_all() {
            Ok(()) => {
                lab.startup = started.elapsed();
                Ok(lab)
            }
            Err(e) => {
                // A process that would not start left a log the error points to: keep it.
                if matches!(e, LabError::NotReady { .. }) {
                    lab.spec.keep = true;
                    mark_kept(&lab.dir);
                }
                Err(e)
            }
        }
    }

    /// Starts every part, in the order each needs the one before: the client's node
    /// (first, so that on loopback it is 127.0.0.1), certificates, backends, the sidecar,
    /// the proxies, the L4 front, and the links the client's traffic crosses.
    fn start_all(&mut self) -> Result<(), LabError> {
        let topology = self.spec.topology.clone();
        self.node(&topology.client)?;
        self.start_certs()?;
        for pool in self.spec.pools.clone() {
            for _ in 0..pool.replicas {
                self.start_backend(&pool)?;
            }
        }
        self.table().validate()?;
        if self.spec.hop.is_some() {
            self.start_sidecar(&topology)?;
        }
        self.start_proxies(&topology)?;
        if self.spec.front.is_some() {
            self.start_front(&topology)?;
        }
        if let Some((http, https)) = self.direct_entry() {
            self.link_entry(&topology, http, https)?;
        }
        Ok(())
    }

    /// The lab's CA and certificates, over TLS or for the sidecar's mutual TLS, owned by
    /// the lab's user.
    fn start_certs(&mut self) -> Result<(), LabError> {
        let mtls = self.spec.hop.as_ref().is_some_and(|h| h.mtls);
        if self.spec.tls || mtls {
            // Generated routes, thousands of them, and any added later: one wildcard.
            let mut hosts: Vec<String> = Vec::new();
            for r in &self.spec.routes {
                let host = match generated_index(r) {
                    Some(_) => format!("*.{GENERATED_DOMAIN}"),
                    None => r.host.clone(),
                };
                if !hosts.contains(&host) {
                    hosts.push(host);
                }
            }
            let certs = certs::generate(&self.dir, &hosts)?;
            certs
                .files()
                .into_iter()
                .try_for_each(crate::identity::own)?;
            self.certs = Some(certs);
        }
        Ok(())
    }

    /// The sidecar (an Envoy between the proxies and the backends), and the link to it.
    fn start_sidecar(&mut self, topology: &Topology) -> Result<(), LabError> {
        let mtls = self.spec.hop.as_ref().is_some_and(|h| h.mtls);
        let mut options = self.spec.proxy_options.clone();
        options.upstream_mtls = match (&self.certs, mtls) {
            (Some(c), true) => Some(UpstreamMtls {
                ca: c.ca.clone(),
                cert: c.client_cert.clone(),
                key: c.client_key.clone(),
            }),
            _ => None,
        };
        let node = self.node(&topology.sidecar)?;
        let table = self.sidecar_table();
        let reaper = self.reaper.as_mut();
        let sidecar = Proxy::start(
            ProxyKind::Envoy,
            &node,
            &self.spec.binaries,
            &self.dir.join("sidecar"),
            &table,
            None,
            &options,
            |pid| {
                if let Some(r) = reaper {
                    r.watch(pid);
                }
            },
        )?;
        let at = sidecar.http_addr();
        self.sidecar = Some(sidecar);
        self.sidecar_relay = self.link(&topology.proxy_node(1), &node, at, "the sidecar")?;
        Ok(())
    }

    /// Each proxy of the spec, `front` replicas of each (one without a front), every one
    /// told the same routing table.
    fn start_proxies(&mut self, topology: &Topology) -> Result<(), LabError> {
        let table = self.proxies_table();
        self.told_proxies = Some(table.clone());
        let replicas = self.spec.front.unwrap_or(1);
        for kind in self.spec.proxies.clone() {
            for replica in 1..=replicas {
                let node = self.node(&topology.proxy_node(replica))?;
                let tls = self
                    .certs
                    .as_ref()
                    .map(|c| (c.cert.as_path(), c.key.as_path(), c.combined.as_path()));
                // Replicas of a proxy live in directories of their own.
                let dir = if replicas > 1 {
                    self.dir.join(format!("replica-{replica}"))
                } else {
                    self.dir.clone()
                };
                let reaper = self.reaper.as_mut();
                let proxy = Proxy::start(
                    kind,
                    &node,
                    &self.spec.binaries,
                    &dir,
                    &table,
                    tls,
                    &self.spec.proxy_options,
                    |pid| {
                        if let Some(r) = reaper {
                            r.watch(pid);
                        }
                    },
                )?;
                self.proxies.push(proxy);
                self.proxy_nodes.push(node.name);
            }
        }
        Ok(())
    }

    /// The L4 front before the proxy replicas, reaching each through the link between
    /// their nodes.
    fn start_front(&mut self, topology: &Topology) -> Result<(), LabError> {
        let front_node = self.node(&topology.front)?;
        // The front reaches each replica through the link between their nodes.
        let targets: Vec<(String, SocketAddr, Option<SocketAddr>)> = self
            .proxies
            .iter()
            .zip(&self.proxy_nodes)
            .map(|(p, n)| (n.clone(), p.http_addr(), p.https_addr()))
            .collect();
        let mut reach = |node: &str, addr: SocketAddr| -> Result<SocketAddr, LabError> {
            let node = self.node(node)?;
            Ok(
                match self.link(&topology.front, &node, addr, "a proxy replica")? {
                    Some(relay) => {
                        let at = relay.addr();
                        self.front_relays.push(relay);
                        at
                    }
                    None => addr,
                },
            )
        };
        let mut http = Vec::new();
        let mut https = Some(Vec::new());
        for (node, plain, tls) in &targets {
            http.push(reach(node, *plain)?);
            https = match (https, tls) {
                (Some(mut all), Some(at)) => {
                    all.push(reach(node, *at)?);
                    Some(all)
                }
                _ => None,
            };
        }
        let reaper = self.reaper.as_mut();
        let front = Front::start(
            &self.spec.binaries,
            &front_node,
            &self.dir,
            &http,
            https.as_deref(),
            |pid| {
                if let Some(r) = reaper {
                    r.watch(pid);
                }
            },
        )?;
        self.front = Some(front);
        Ok(())
    }

    /// The link from the client's node to where its traffic enters (the front, or the
    /// first proxy), when the topology puts one there.
    fn link_entry(
        &mut self,
        topology: &Topology,
        http: SocketAddr,
        https: Option<SocketAddr>,
    ) -> Result<(), LabError> {
        let entry_node = if self.front.is_some() {
            topology.front.clone()
        } else {
            topology.proxy_node(1)
        };
        let entry = self.node(&entry_node)?;
        if let Some(relay) = self.link(&topology.client, &entry, http, "the entry")? {
            let https = match https {
                Some(at) => self.link(&topology.client, &entry, at, "the entry")?,
                None => None,
            };
            self.entry_relays = Some((relay, https));
        }
        Ok(())
    }

    /// The node called `name`, made if it is new (the reaper is told of its namespace).
    /// A new node gets its kernel settings before anything starts on it.
    fn node(&mut self, name: &str) -> Result<Node, LabError> {
        check_name("node", name)?;
        let new = !self.nodes.all().iter().any(|n| n.name == name);
        let reaper = &mut self.reaper;
        let node = self.nodes.get(name, &mut |ns| {
            if let Some(r) = reaper.as_mut() {
                r.remove_netns_on_death(ns);
            }
        })?;
        let settings = self
            .spec
            .sysctls
            .of(name, self.spec.topology.is_proxy_node(name));
        if let (true, false, Some(ns)) = (new, settings.is_empty(), &node.netns) {
            kernel::apply(name, ns, &settings)?;
        }
        Ok(node)
    }

    /// A relay on the link from node `from` to `to` (where `target` listens), or `None`
    /// when both are the same node. It listens on `to`'s address, in `to`'s namespace.
    fn link(
        &self,
        from: &str,
        to: &Node,
        target: SocketAddr,
        what: &str,
    ) -> Result<Option<Relay>, LabError> {
        let Some(link) = self.spec.topology.link(from, &to.name) else {
            return Ok(None);
        };
        Relay::start((to.ip, 0).into(), target, link, to.netns.as_deref())
            .map(Some)
            .map_err(|e| LabError::Network {
                action: format!(
                    "starting the link relay in front of {what} on node {}",
                    to.name
                ),
                reason: e.to_string(),
            })
    }

    fn start_backend(&mut self, pool: &PoolSpec) -> Result<(), LabError> {
        self.serial += 1;
        let index = self.backends.iter().filter(|b| b.pool == pool.name).count() + 1;
        let mut name = format!("{}-{index}", pool.name);
        while self.backends.iter().any(|b| b.name == name) {
            name = format!("{}-{}", pool.name, self.serial);
        }
        let node = self.node(&self.spec.topology.backend_node(&name))?;
        let log = self.dir.join(format!("backend-{name}.log"));
        let mut args = vec![
            "backend".to_owned(),
            "--name".into(),
            name.clone(),
            "--listen".into(),
            SocketAddr::from((node.ip, 0)).to_string(),
        ];
        args.extend(pool.backend_args.iter().cloned());
        if let (Some(certs), Some(HopSpec { mtls: true })) = (&self.certs, &self.spec.hop) {
            for (flag, path) in [
                ("--tls-cert", &certs.cert),
                ("--tls-key", &certs.key),
                ("--client-ca", &certs.ca),
            ] {
                args.extend([flag.to_owned(), path.display().to_string()]);
            }
        }
        // A replica that takes the name of one removed earlier appends to its log: only
        // what this process writes tells its address.
        let logged_before = std::fs::metadata(&log).map_or(0, |m| m.len());
        let user = crate::identity::lab_identity()?;
        let program =
            crate::identity::runnable(&self.spec.backend_binary, user, &self.dir.join("bin"))?;
        let mut child = OwnedChild::spawn_with_env(
            &format!("backend {name}"),
            &program,
            &args,
            &[],
            &self.dir,
            &log,
            RunAs {
                netns: node.netns.as_deref(),
                user,
            },
        )?;
        self.watch(child.pid());
        let addr = wait_for_address(&mut child, &log, logged_before)?;
        // The proxies (or the sidecar, with a hop) call the backends; with a node per
        // replica, the link is the first replica's (the same unless `between` says).
        let caller = if self.spec.hop.is_some() {
            self.spec.topology.sidecar.clone()
        } else {
            self.spec.topology.proxy_node(1)
        };
        let relay = self.link(&caller, &node, addr, &format!("backend {name}"))?;
        self.backends.push(Backend {
            name,
            pool: pool.name.clone(),
            addr,
            node: node.name,
            relay,
            child,
        });
        Ok(())
    }

    fn watch(&mut self, pid: u32) {
        if let Some(reaper) = self.reaper.as_mut() {
            reaper.watch(pid);
        }
    }

    /// What the sidecar routes: the backends now running, without the route changes
    /// (the proxies in front make those).
    fn sidecar_table(&self) -> RouteTable {
        RouteTable {
            overlay: Overlay::default(),
            generation: Generation {
                header: SIDECAR_GENERATION_HEADER,
                value: self.sidecar_generation,
            },
            ..self.table()
        }
    }

    /// What the proxies route: the backends now running, or with a sidecar, every pool
    /// to the sidecar.
    fn proxies_table(&self) -> RouteTable {
        let mut table = self.table();
        if let Some(sidecar) = &self.sidecar {
            let at = self
                .sidecar_relay
                .as_ref()
                .map_or(sidecar.http_addr(), Relay::addr);
            for pool in &mut table.pools {
                pool.endpoints = vec![at];
            }
        }
        table
    }

    /// The sidecar, if the lab has an extra hop.
    pub fn sidecar(&self) -> Option<&Proxy> {
        self.sidecar.as_ref()
    }

    /// The routes in force.
    pub fn routes(&self) -> &[Route] {
        &self.spec.routes
    }

    /// The routes a change leaves in force.
    fn routes_after(&self, change: &Change) -> Vec<Route> {
        let pools: Vec<String> = self.spec.pools.iter().map(|p| p.name.clone()).collect();
        crate::routes::routes_after(&self.spec.routes, &pools, change)
            .unwrap_or_else(|| self.spec.routes.clone())
    }

    /// What a route change would add, remove and change (`None` for any other change).
    pub fn routes_delta(&self, change: &Change) -> Option<RoutesDelta> {
        is_route_change(change).then(|| {
            let after = self.routes_after(change);
            RoutesDelta::between(&self.spec.routes, &after)
        })
    }

    /// The route table for the backends now running.
    pub fn table(&self) -> RouteTable {
        let endpoints = |pool: &str| {
            self.backends
                .iter()
                .filter(|b| b.pool == pool)
                .map(Backend::routed_addr)
                .collect()
        };
        self.spec
            .route_table(&self.overlay, endpoints, self.generation)
    }

    /// Starts or drains backends of `pool` until it has `replicas`, without telling the
    /// proxies (see [`Lab::sync_proxies`]). Returns the names started and drained.
    pub fn scale(
        &mut self,
        pool: &str,
        replicas: usize,
    ) -> Result<(Vec<String>, Vec<Backend>), LabError> {
        let spec = self
            .spec
            .pools
            .iter()
            .find(|p| p.name == pool)
            .cloned()
            .ok_or_else(|| LabError::InvalidValue {
                field: "pool".into(),
                value: pool.into(),
                reason: "no pool has that name".into(),
            })?;
        let mut started = Vec::new();
        while self.backends.iter().filter(|b| b.pool == pool).count() < replicas {
            self.start_backend(&spec)?;
            started.push(
                self.backends
                    .last()
                    .map(|b| b.name.clone())
                    .unwrap_or_default(),
            );
        }
        let mut removed = Vec::new();
        while self.backends.iter().filter(|b| b.pool == pool).count() > replicas {
            let i = self
                .backends
                .iter()
                .rposition(|b| b.pool == pool)
                .unwrap_or(0);
            removed.push(self.backends.remove(i));
        }
        Ok((started, removed))
    }

    /// Removes a backend from the lab's view and returns it (to kill or drain).
    pub fn take_backend(&mut self, name: &str) -> Option<Backend> {
        let i = self.backends.iter().position(|b| b.name == name)?;
        Some(self.backends.remove(i))
    }

    /// Sets the overlay (header, CORS, rewrite) the next sync applies, as a new
    /// configuration generation.
    pub fn set_overlay(&mut self, overlay: Overlay) {
        self.overlay = overlay;
        self.generation += 1;
    }

    /// Pushes the current table to every proxy, each its own way; returns how each took it.
    pub fn sync_proxies(&mut self) -> Result<Vec<(ProxyKind, &'static str)>, LabError> {
        let mut mechanisms = Vec::new();
        let sidecar_table = self.sidecar_table();
        if let Some(sidecar) = self.sidecar.as_mut() {
            let update = sidecar.update(&sidecar_table)?;
            mechanisms.push((sidecar.kind(), update.mechanism));
        }
        // With a sidecar, endpoint changes stop there: the proxies hear only of theirs
        // (a reload is pushed to them all the same).
        let table = self.proxies_table();
        let reload = std::mem::take(&mut self.reload_due);
        if let Some((grace, upgrade)) = self.restart_due.take() {
            let reaper = &mut self.reaper;
            for p in &mut self.proxies {
                let mut watch = |pid| {
                    if let Some(r) = reaper.as_mut() {
                        r.watch(pid);
                    }
                };
                let mechanism = if let Some(to) = &upgrade {
                    let to = to
                        .get(&p.kind())
                        .map(|(binary, line)| (binary.as_path(), line.clone()));
                    p.upgrade(&table, grace, to, &mut watch)?
                } else {
                    p.begin_restart(grace, None);
                    "restart (a graceful stop, then a new process)"
                };
                mechanisms.push((p.kind(), mechanism));
            }
            self.told_proxies = Some(table);
        } else if self.sidecar.is_none() || reload || self.told_proxies.as_ref() != Some(&table) {
            for p in &mut self.proxies {
                let update = p.update(&table)?;
                mechanisms.push((p.kind(), update.mechanism));
            }
            self.told_proxies = Some(table);
        }
        Ok(mechanisms)
    }

    /// Requests a change. The backend side happens now (a pod starts, dies or drains
    /// whatever the control plane does); the proxies are told after `propagation_delay`,
    /// when [`Lab::tick`] runs past it, as a controller going through a slow API would.
    /// Returns the index of the change's record.
    pub fn request(
        &mut self,
        change: Change,
        propagation_delay: Duration,
    ) -> Result<usize, LabError> {
        let requested_at = Instant::now();
        let mut generations = Vec::new();
        let (what, started, removed) = match &change {
            Change::Scale { pool, replicas } => {
                let before = self.backends.iter().filter(|b| &b.pool == pool).count();
                let (started, removed) = self.scale(pool, *replicas)?;
                let names = removed.iter().map(|b| b.name.clone()).collect();
                for backend in removed {
                    self.begin_termination(backend);
                }
                (format!("scale {pool} {before}->{replicas}"), started, names)
            }
            Change::Stall { backend, duration } => {
                let name = self.pick_backend(backend.as_deref())?;
                let child = self
                    .backends
                    .iter()
                    .find(|b| b.name == name)
                    .map(|b| &b.child)
                    .ok_or_else(|| self.no_such_backend(&name))?;
                child
                    .signal(rustix::process::Signal::STOP)
                    .map_err(|source| LabError::Io {
                        action: "stopping",
                        path: PathBuf::from(&name),
                        source,
                    })?;
                self.stalled.push((name.clone(), requested_at + *duration));
                let what = format!("stall {name} for {duration:?}");
                return Ok(self.record_done_when_asked(what, requested_at));
            }
            Change::Kill(name) | Change::Terminate(name) => {
                let name = self.pick_backend(name.as_deref())?;
                let backend = self
                    .take_backend(&name)
                    .ok_or_else(|| self.no_such_backend(&name))?;
                if matches!(change, Change::Kill(_)) {
                    backend.kill();
                    (format!("kill {name}"), Vec::new(), vec![name])
                } else {
                    self.begin_termination(backend);
                    (format!("terminate {name}"), Vec::new(), vec![name])
                }
            }
            Change::Overlay(overlay) => {
                // Refused here, before anything changes, if a proxy would be given a
                // value it must not get.
                self.spec.check(std::slice::from_ref(overlay))?;
                self.set_overlay(overlay.clone());
                generations.push((GENERATION_HEADER, self.generation));
                (overlay.describe(), Vec::new(), Vec::new())
            }
            Change::Routes(_)
            | Change::AddRoutes(_)
            | Change::RemoveRoutes(_)
            | Change::GeneratedRoutes(_)
            | Change::ChangeRoutes(_) => {
                let routes = self.routes_after(&change);
                let what = crate::routes::routes_change(&self.spec.routes, &routes);
                // One that changes no route (remove_routes with none generated) is said as
                // `routes N (unchanged)`, and no proxy is told or reloaded for it.
                if routes == self.spec.routes {
                    return Ok(self.record_done_when_asked(what, requested_at));
                }
                // Refused here, before anything changes, as an overlay is.
                let mut next = self.spec.clone();
                next.routes = routes.clone();
                next.check(&[])?;
                self.spec.routes = routes;
                self.generation += 1;
                generations.push((GENERATION_HEADER, self.generation));
                (what, Vec::new(), Vec::new())
            }
            Change::Upgrade { grace, to } => {
                // Refused now, before anything changes, if a version is not installed.
                let mut binaries = BTreeMap::new();
                for (kind, version) in to {
                    binaries.insert(*kind, self.spec.binaries.locate_version(*kind, version)?);
                }
                self.restart_due = Some((*grace, Some(binaries)));
                self.generation += 1;
                generations.push((GENERATION_HEADER, self.generation));
                let versions: Vec<String> = to
                    .iter()
                    .map(|(kind, v)| format!("{} {v}", kind.name()))
                    .collect();
                let what = if versions.is_empty() {
                    "upgrade".to_owned()
                } else {
                    format!("upgrade to {}", versions.join(", "))
                };
                (what, Vec::new(), Vec::new())
            }
            Change::Restart { grace } => {
                self.restart_due = Some((*grace, None));
                self.generation += 1;
                generations.push((GENERATION_HEADER, self.generation));
                ("restart".to_owned(), Vec::new(), Vec::new())
            }
            Change::Reload => {
                self.reload_due = true;
                self.generation += 1;
                generations.push((GENERATION_HEADER, self.generation));
                if self.sidecar.is_some() {
                    self.sidecar_generation += 1;
                    generations.push((SIDECAR_GENERATION_HEADER, self.sidecar_generation));
                }
                ("reload".to_owned(), Vec::new(), Vec::new())
            }
        };
        self.records.push(ChangeRecord {
            started,
            removed,
            // Every change to the proxies makes a generation of their configuration.
            on_proxies: !generations.is_empty(),
            generations,
            ..ChangeRecord::asked(what, requested_at)
        });
        let index = self.records.len() - 1;
        self.pending.push((requested_at + propagation_delay, index));
        self.tick()?;
        Ok(index)
    }

    /// Records a change that is done when it is asked and that no proxy is told of (a
    /// stall; a route change that changes nothing). Returns its index.
    fn record_done_when_asked(&mut self, what: String, requested_at: Instant) -> usize {
        self.records.push(ChangeRecord {
            applied_at: Some(requested_at),
            ..ChangeRecord::asked(what, requested_at)
        });
        self.records.len() - 1
    }

    /// Applies the changes whose propagation delay has passed (the proxies get the state
    /// of the backends as it is now, as a reconciling controller would), and reaps
    /// terminated backends. Call it often while changes are pending.
    pub fn tick(&mut self) -> Result<(), LabError> {
        let now = Instant::now();
        self.terminating.retain_mut(|(backend, since)| {
            let exited = backend.child.try_wait().is_some();
            if !exited && since.elapsed() > DRAIN_GRACE {
                backend.child.terminate(Duration::ZERO);
                return false;
            }
            !exited
        });
        let backends = &self.backends;
        self.stalled.retain(|(name, until)| {
            if *until > now {
                return true;
            }
            if let Some(b) = backends.iter().find(|b| &b.name == name) {
                let _ = b.child.signal(rustix::process::Signal::CONT);
            }
            false
        });
        // A restart holds every change to the proxies until its new processes route.
        if self.restarting.is_some() && !self.finish_restart()? {
            return Ok(());
        }
        let (due, waiting): (Vec<_>, Vec<_>) = self.pending.iter().partition(|(at, _)| *at <= now);
        self.pending = waiting;
        if due.is_empty() {
            return Ok(());
        }
        let restart = self.restart_due.is_some();
        let mechanisms = self.sync_proxies()?;
        let records = due.into_iter().map(|(_, index)| index).collect();
        if restart {
            // Applied when the new processes route; the old ones drain meanwhile, and
            // events go on firing.
            self.restarting = Some(Restarting {
                records,
                mechanisms,
            });
            self.finish_restart()?;
            return Ok(());
        }
        self.applied(records, mechanisms, false);
        Ok(())
    }

    /// Finishes the restart under way once no proxy waits for its old process any more
    /// (each has left, or its grace is over): starts the new processes with the table as
    /// it is now, and records the restart applied. Returns whether none is under way.
    fn finish_restart(&mut self) -> Result<bool, LabError> {
        let cut = &self.stopping;
        if self.proxies.iter_mut().any(|p| p.restart_waits(cut)) {
            return Ok(false);
        }
        let Some(restarting) = self.restarting.take() else {
            return Ok(true);
        };
        let table = self.proxies_table();
        let reaper = &mut self.reaper;
        for p in &mut self.proxies {
            let mut watch = |pid| {
                if let Some(r) = reaper.as_mut() {
                    r.watch(pid);
                }
            };
            p.finish_restart(&table, &mut watch)?;
        }
        self.told_proxies = Some(table);
        self.applied(restarting.records, restarting.mechanisms, true);
        Ok(true)
    }

    /// Records the changes `records` applied now, by `mechanisms`; after a restart or an
    /// upgrade, with the version line each proxy runs.
    fn applied(
        &mut self,
        records: Vec<usize>,
        mechanisms: Vec<(ProxyKind, &'static str)>,
        restarted: bool,
    ) {
        let applied = Instant::now();
        let versions: Vec<(ProxyKind, String)> = if restarted {
            self.proxies
                .iter()
                .map(|p| (p.kind(), p.version().to_owned()))
                .collect()
        } else {
            Vec::new()
        };
        let closing = (mechanisms.iter()).any(|(_, m)| crate::proxy::closes_connections(m));
        for index in records {
            if let Some(record) = self.records.get_mut(index) {
                record.applied_at = Some(applied);
                record.mechanisms = mechanisms.clone();
                record.versions = versions.clone();
                // A backend's change that nginx applies by a reload ends connections as
                // a reload does.
                record.on_proxies |= closing;
            }
        }
    }

    /// Whether changes are still waiting for their propagation delay, or backends to
    /// be let go on.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty() || !self.stalled.is_empty() || self.restarting.is_some()
    }

    /// Every change requested so far.
    pub fn records(&self) -> &[ChangeRecord] {
        &self.records
    }

    fn begin_termination(&mut self, backend: Backend) {
        let _ = backend.child.signal(rustix::process::Signal::TERM);
        // A stalled backend drains too.
        let _ = backend.child.signal(rustix::process::Signal::CONT);
        self.stalled.retain(|(name, _)| name != &backend.name);
        self.terminating.push((backend, Instant::now()));
    }

    /// `name`, or a running backend at random.
    fn pick_backend(&self, name: Option<&str>) -> Result<String, LabError> {
        match name {
            Some(name) => Ok(name.to_owned()),
            None => self.random_backend().ok_or_else(|| LabError::InvalidValue {
                field: "backend".into(),
                value: "random".into(),
                reason: "no backend is running".into(),
            }),
        }
    }

    fn no_such_backend(&self, name: &str) -> LabError {
        LabError::InvalidValue {
            field: "backend".into(),
            value: name.to_owned(),
            reason: format!(
                "no running backend has that name (running: {})",
                self.backends
                    .iter()
                    .map(|b| b.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    fn random_backend(&self) -> Option<String> {
        if self.backends.is_empty() {
            return None;
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos() as usize;
        Some(self.backends[nanos % self.backends.len()].name.clone())
    }

    /// The running proxies.
    pub fn proxies(&self) -> &[Proxy] {
        &self.proxies
    }

    /// The lab's processes to measure, each part a process group: every proxy (each
    /// replica, named `kind` or `kind-N`), the front and the sidecar.
    pub fn usage_parts(&self) -> Vec<Part> {
        let mut parts: Vec<Part> = self
            .proxies
            .iter()
            .enumerate()
            .map(|(i, p)| Part::group(&self.proxy_name(i), "proxy", p.pgid()))
            .collect();
        if let Some(front) = &self.front {
            parts.push(Part::group("front", "front", front.pid()));
        }
        if let Some(sidecar) = &self.sidecar {
            parts.push(Part::group("sidecar", "sidecar", sidecar.pid()));
        }
        parts
    }

    /// A proxy's name in readings: its kind, numbered when a front spreads the load over
    /// several.
    fn proxy_name(&self, i: usize) -> String {
        let kind = self.proxies[i].kind().to_string();
        if self.proxies.len() > 1 && self.front.is_some() {
            format!("{kind}-{}", i + 1)
        } else {
            kind
        }
    }

    /// What each proxy counted so far, by its name in readings (see
    /// [`crate::proxy::counters`]); a proxy that could not be read says why.
    pub fn proxy_counters(&mut self) -> crate::proxy::counters::Readings {
        (0..self.proxies.len())
            .map(|i| (self.proxy_name(i), self.proxies[i].counted()))
            .collect()
    }

    /// Checks that every part nothing asked to stop is still running: each proxy (and
    /// replica), the front, the sidecar and every backend no event killed or drained. The
    /// first one that exited is the error, with how it ended and its log's end.
    pub fn check_alive(&mut self) -> Result<(), LabError> {
        // A proxy whose restart is under way has left on purpose.
        let proxies = (self.proxies.iter_mut())
            .filter(|p| !p.restarting())
            .map(|p| (p.kind().to_string(), p.child()));
        let front = self
            .front
            .iter_mut()
            .map(|f| ("front".to_owned(), f.child()));
        let sidecar = self
            .sidecar
            .iter_mut()
            .map(|s| ("sidecar".to_owned(), s.child()));
        let backends = self
            .backends
            .iter_mut()
            .map(|b| (format!("backend {}", b.name), &mut b.child));
        for (part, child) in proxies.chain(front).chain(sidecar).chain(backends) {
            if let Some(status) = child.try_wait() {
                return Err(LabError::PartExited {
                    part,
                    status: status.to_string(),
                    log_tail: child.log_tail(),
                });
            }
        }
        Ok(())
    }

    /// The running proxies, to update one at a time.
    pub fn proxies_mut(&mut self) -> &mut [Proxy] {
        &mut self.proxies
    }

    /// The L4 front, if the lab has one.
    pub fn front(&self) -> Option<&Front> {
        self.front.as_ref()
    }

    /// Where clients connect (plain, TLS): through the client's link if it has one, else
    /// the front if there is one, else the first proxy.
    pub fn entry(&self) -> Option<(SocketAddr, Option<SocketAddr>)> {
        if let Some((http, https)) = &self.entry_relays {
            return Some((http.addr(), https.as_ref().map(Relay::addr)));
        }
        self.direct_entry()
    }

    /// The client's network namespace, with namespace isolation: the load generator's
    /// threads enter it (see [`crate::topology::enter_netns`]).
    pub fn client_netns(&self) -> Option<PathBuf> {
        let client = &self.spec.topology.client;
        self.nodes
            .all()
            .iter()
            .find(|n| &n.name == client)
            .and_then(|n| n.netns.clone())
    }

    /// The kernel as each proxy runs with it, read back, not as asked: each node's
    /// settings (those the spec sets, and `net.core.somaxconn` of every proxy's node), the
    /// backlog each proxy listener got (its own, capped by `somaxconn`) and the proxies'
    /// open-file limit.
    pub fn kernel(&self) -> serde_json::Value {
        let mut sysctls = serde_json::Map::new();
        for node in self.nodes.all() {
            let proxy = self.proxy_nodes.contains(&node.name);
            let mut names: Vec<String> = self
                .spec
                .sysctls
                .of(&node.name, proxy)
                .into_keys()
                .collect();
            if proxy {
                names.push("net.core.somaxconn".into());
            }
            if names.is_empty() {
                continue;
            }
            sysctls.insert(
                node.name.clone(),
                serde_json::json!(kernel::read(node.netns.as_deref(), &names)),
            );
        }
        let mut listeners = Vec::new();
        let mut open_files = serde_json::Map::new();
        for (p, node) in self.proxies.iter().zip(&self.proxy_nodes) {
            let Some(node) = self.nodes.all().iter().find(|n| &n.name == node) else {
                continue;
            };
            let got = kernel::listen_backlogs(node.netns.as_deref(), node.ip);
            for port in std::iter::once(p.http_port()).chain(p.https_port()) {
                listeners.push(serde_json::json!({
                    "proxy": p.kind().name(),
                    "node": node.name,
                    "port": port,
                    "backlog": got.get(&port),
                }));
            }
            if let Some(n) = kernel::open_files_limit(p.pid()) {
                open_files.insert(p.kind().name().to_owned(), serde_json::json!(n));
            }
        }
        serde_json::json!({
            "sysctls": sysctls,
            "listeners": listeners,
            "open_files": open_files,
        })
    }

    /// The listen-queue counters of each proxy node's namespace (none on loopback, where
    /// the counters are the whole machine's).
    pub fn listen_counters(&self) -> Vec<(String, ListenCounters)> {
        let mut out: Vec<(String, ListenCounters)> = Vec::new();
        for node in self.nodes.all() {
            if !self.proxy_nodes.contains(&node.name) || node.netns.is_none() {
                continue;
            }
            if let Some(c) = kernel::listen_counters(node.netns.as_deref()) {
                out.push((node.name.clone(), c));
            }
        }
        out
    }

    /// The nodes made so far (the client's first).
    pub fn nodes(&self) -> &[Node] {
        self.nodes.all()
    }

    /// Where everything runs and the links on the request's path, for the results: each
    /// node with its address, what runs on it and its column along the path (client 0,
    /// front 1, proxies 2, sidecar 3, backends 4), and each link crossed with its settings.
    pub fn map(&self) -> serde_json::Value {
        let t = &self.spec.topology;
        let mut runs: Vec<(String, usize, String)> = vec![(t.client.clone(), 0, "client".into())];
        if self.front.is_some() {
            runs.push((t.front.clone(), 1, "L4 front (haproxy)".into()));
        }
        // Each proxy kind on each node, counted.
        let mut placed: Vec<(&str, ProxyKind, usize)> = Vec::new();
        for (p, node) in self.proxies.iter().zip(&self.proxy_nodes) {
            match placed
                .iter_mut()
                .find(|(n, k, _)| n == node && *k == p.kind())
            {
                Some(entry) => entry.2 += 1,
                None => placed.push((node, p.kind(), 1)),
            }
        }
        for (node, kind, n) in &placed {
            let times = if *n > 1 {
                format!(" x{n}")
            } else {
                String::new()
            };
            runs.push(((*node).to_owned(), 2, format!("{kind}{times}")));
        }
        if self.sidecar.is_some() {
            runs.push((t.sidecar.clone(), 3, "sidecar (envoy)".into()));
        }
        for b in &self.backends {
            runs.push((b.node.clone(), 4, b.name.clone()));
        }
        let proxy_nodes: Vec<&str> = placed.iter().map(|(n, _, _)| *n).collect();
        let callers: Vec<&str> = if self.sidecar.is_some() {
            vec![t.sidecar.as_str()]
        } else {
            proxy_nodes.clone()
        };
        let mut hops: Vec<(&str, &str)> = Vec::new();
        match &self.front {
            Some(_) => {
                hops.push((&t.client, &t.front));
                hops.extend(proxy_nodes.iter().map(|n| (t.front.as_str(), *n)));
            }
            None => hops.extend(proxy_nodes.first().map(|n| (t.client.as_str(), *n))),
        }
        if self.sidecar.is_some() {
            hops.extend(proxy_nodes.iter().map(|n| (*n, t.sidecar.as_str())));
        }
        for b in &self.backends {
            hops.extend(callers.iter().map(|c| (*c, b.node.as_str())));
        }
        hops.sort();
        hops.dedup();
        let links: Vec<serde_json::Value> = hops
            .into_iter()
            .filter_map(|(from, to)| {
                let l = t.link(from, to)?;
                Some(serde_json::json!({
                    "from": from,
                    "to": to,
                    "delay_us": l.delay.as_micros() as u64,
                    "jitter_us": l.jitter.as_micros() as u64,
                    "bandwidth_bytes_per_s": l.bandwidth,
                    "reset": l.reset,
                }))
            })
            .collect();
        let nodes: Vec<serde_json::Value> = self
            .nodes
            .all()
            .iter()
            .filter_map(|n| {
                let here: Vec<&(String, usize, String)> =
                    runs.iter().filter(|r| r.0 == n.name).collect();
                let column = here.iter().map(|r| r.1).min()?;
                let parts: Vec<&str> = here.iter().map(|r| r.2.as_str()).collect();
                Some(serde_json::json!({
                    "name": n.name,
                    "address": n.ip.to_string(),
                    "namespace": n.netns.as_ref().map(|p| p.display().to_string()),
                    "column": column,
                    "outside": t.outside.contains(&n.name),
                    "runs": parts,
                }))
            })
            .collect();
        serde_json::json!({
            "isolation": match t.isolation {
                crate::topology::Isolation::Loopback => "loopback",
                crate::topology::Isolation::Netns => "netns",
            },
            "nodes": nodes,
            "links": links,
        })
    }

    /// Every link relay's own added time per chunk (microseconds), merged, since the lab
    /// started or [`Lab::reset_link_overhead`].
    pub fn link_overhead(&self) -> HistogramUs {
        let mut h = HistogramUs::new();
        for relay in self.relays() {
            h.merge(&relay.overhead());
        }
        h
    }

    /// Starts the links' overhead measurement afresh (a reused lab, a new cell).
    pub fn reset_link_overhead(&self) {
        for relay in self.relays() {
            relay.reset_overhead();
        }
    }

    /// Every link relay.
    fn relays(&self) -> impl Iterator<Item = &Relay> {
        let entry = self
            .entry_relays
            .iter()
            .flat_map(|(a, b)| std::iter::once(a).chain(b.as_ref()))
            .chain(&self.front_relays)
            .chain(&self.sidecar_relay);
        let backends = self
            .backends
            .iter()
            .chain(self.terminating.iter().map(|(b, _)| b))
            .filter_map(|b| b.relay.as_ref());
        entry.chain(backends)
    }

    /// The entry without the client's link.
    fn direct_entry(&self) -> Option<(SocketAddr, Option<SocketAddr>)> {
        match &self.front {
            Some(front) => Some((front.http_addr(), front.https_addr())),
            None => self
                .proxies
                .first()
                .map(|p| (p.http_addr(), p.https_addr())),
        }
    }

    /// The running backends.
    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// The lab's TLS files.
    pub fn certs(&self) -> Option<&LabCerts> {
        self.certs.as_ref()
    }

    /// The lab's private directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// From `up` to every proxy listening.
    pub fn startup(&self) -> Duration {
        self.startup
    }

    /// Keeps the directory after tear-down (to look at configs and logs after a failure).
    pub fn keep(&mut self) {
        self.spec.keep = true;
        mark_kept(&self.dir);
        if let Some(reaper) = self.reaper.as_mut() {
            reaper.remove_on_death(Path::new(""));
        }
    }
}

impl Backend {
    /// Stops it gracefully: SIGTERM (it drains), SIGKILL after a grace period.
    pub fn drain(mut self) {
        self.child.terminate(DRAIN_GRACE);
    }

    /// Crashes it: SIGKILL.
    pub fn kill(self) {
        drop(self);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(front) = self.front.take() {
            front.stop(Duration::from_secs(2));
        }
        for proxy in self.proxies.drain(..).chain(self.sidecar.take()) {
            proxy.stop(Duration::from_secs(2));
        }
        self.backends.clear();
        self.terminating.clear();
        self.entry_relays = None;
        self.front_relays.clear();
        self.sidecar_relay = None;
        self.nodes.remove();
        if let Some(reaper) = self.reaper.take() {
            reaper.dismiss();
        }
        if !self.spec.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Marks a lab directory as kept on purpose, so that no later start removes it as stale.
fn mark_kept(dir: &Path) {
    let _ = std::fs::write(
        dir.join(KEPT),
        "kept on purpose (--keep, or a process that did not start)\n",
    );
}

/// Once per process: removes what labs of an ingressbench that is gone (its reaper gone
/// too) left behind: processes still working in their lab directory (nginx workers keep
/// their listening ports), network namespaces, the host's veth, lab directories (with
/// their private keys). A lab whose owner is alive is never touched.
pub fn remove_leftovers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut removed = kill_stray_processes();
        removed.extend(crate::topology::remove_stale());
        let dirs = std::fs::read_dir(std::env::temp_dir())
            .into_iter()
            .flatten();
        for entry in dirs.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if dead_owner(&name).is_some() && !entry.path().join(KEPT).exists() {
                removed.extend(remove_dead_lab(&entry.path()));
            }
        }
        for name in removed {
            eprintln!("removed {name}, left behind by an ingressbench that is gone");
        }
    });
}

/// Removes a lab directory whose owner is gone, and the shared memory its Envoys' hot
/// restarts left in /dev/shm (Envoy never removes it; a lab removes it as it stops, which
/// a SIGKILL prevents): found by the `base-id` files in the lab's proxy directories.
/// Returns what it removed, described.
fn remove_dead_lab(dir: &Path) -> Vec<String> {
    let mut removed = Vec::new();
    let mut base_ids = Vec::new();
    find_base_ids(dir, 3, &mut base_ids);
    for id in base_ids {
        if crate::proxy::remove_envoy_shared_memory(id) {
            removed.push(format!(
                "Envoy's hot-restart shared memory for base id {id}"
            ));
        }
    }
    if std::fs::remove_dir_all(dir).is_ok() {
        removed.push(dir.display().to_string());
    }
    removed
}

/// The base ids in `base-id` files at most `depth` directories below `dir` (no link
/// followed).
fn find_base_ids(dir: &Path, depth: u32, found: &mut Vec<u64>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() && depth > 0 {
            find_base_ids(&entry.path(), depth - 1, found);
        } else if kind.is_file() && entry.file_name() == "base-id" {
            let id = std::fs::read_to_string(entry.path()).ok();
            found.extend(id.and_then(|t| t.trim().parse::<u64>().ok()));
        }
    }
}

/// For a name that starts `ingressbench-lab-PID-` (as [`private_dir`] names them): PID,
/// if that process is gone.
fn dead_owner(name: &str) -> Option<&str> {
    name.strip_prefix(DIR_PREFIX)
        .and_then(|r| r.split('-').next())
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .filter(|p| !Path::new("/proc").join(p).exists())
}

/// SIGKILLs every process of a lab whose owner is gone: those marked with
/// [`LAB_DIR_ENV`](crate::process::LAB_DIR_ENV) (every lab child gets it, and what it
/// forks inherits it), and, since some rewrite their environment (nginx workers, for
/// their process title), those whose working directory lies in such a lab's directory
/// unless the lab was kept on purpose (someone may be looking at it). Returns them,
/// described.
fn kill_stray_processes() -> Vec<String> {
    let tmp = std::env::temp_dir();
    let marker = format!("{}=", crate::process::LAB_DIR_ENV);
    // The lab's directory name, for a path inside one.
    let lab_of = |path: &Path| -> Option<String> {
        let name = path.strip_prefix(&tmp).ok()?.iter().next()?.to_str()?;
        dead_owner(name).map(|_| name.to_owned())
    };
    let mut killed = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let marked = std::fs::read(entry.path().join("environ"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .filter_map(|var| std::str::from_utf8(var).ok()?.strip_prefix(&marker))
            .find_map(|dir| lab_of(Path::new(dir)));
        let working_in = || {
            let cwd = std::fs::read_link(entry.path().join("cwd")).ok()?;
            lab_of(&cwd).filter(|lab| !tmp.join(lab).join(KEPT).exists())
        };
        let Some(lab) = marked.or_else(working_in) else {
            continue;
        };
        let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if let Some(target) = rustix::process::Pid::from_raw(pid) {
            if rustix::process::kill_process(target, rustix::process::Signal::KILL).is_ok() {
                killed.push(format!("process {pid} ({}) of {lab}", name.trim()));
            }
        }
    }
    if !killed.is_empty() {
        // Let the kernel take their files and ports back before the directories go.
        std::thread::sleep(Duration::from_millis(100));
    }
    killed
}

fn private_dir() -> Result<PathBuf, LabError> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| LabError::Io {
        action: "creating",
        path: dir.clone(),
        source,
    })?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(|source| {
        LabError::Io {
            action: "securing",
            path: dir.clone(),
            source,
        }
    })?;
    crate::identity::own(&dir)?;
    Ok(dir)
}

/// Reads the `listening on ADDR` line a backend writes first, in its log from byte `from`
/// (what it appended).
fn wait_for_address(child: &mut OwnedChild, log: &Path, from: u64) -> Result<SocketAddr, LabError> {
    let started = Instant::now();
    loop {
        if let Ok(bytes) = std::fs::read(log) {
            let ours = bytes.get(usize::try_from(from).unwrap_or(usize::MAX)..);
            if let Some(addr) = String::from_utf8_lossy(ours.unwrap_or_default())
                .lines()
                .find_map(|l| l.strip_prefix("listening on "))
                .and_then(|a| a.trim().parse().ok())
            {
                return Ok(addr);
            }
        }
        if let Some(status) = child.try_wait() {
            return Err(child.not_ready(format!("exited with {status}")));
        }
        if started.elapsed() > BACKEND_START_TIMEOUT {
            return Err(child.not_ready(format!(
                "no `listening on` line after {BACKEND_START_TIMEOUT:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lab whose owner was SIGKILLed mid hot restart: its directory goes, and with it the
    /// shared memory its Envoy left in /dev/shm, found by the lab's `base-id`.
    #[test]
    fn a_dead_labs_envoy_shared_memory_goes_with_it() {
        let gone = std::process::Command::new("true").spawn().unwrap();
        let pid = gone.id();
        let _ = { gone }.wait();
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{pid}-test-shm"));
        let envoy = dir.join("proxies").join("envoy-0");
        std::fs::create_dir_all(&envoy).unwrap();
        // A base id no Envoy of this machine uses.
        let id = 4_000_000_000 + u64::from(pid);
        std::fs::write(envoy.join("base-id"), format!("{id}\n")).unwrap();
        let shm = crate::proxy::envoy_shared_memory(id);
        std::fs::write(&shm, b"left by a hot restart").unwrap();
        assert_eq!(
            dead_owner(dir.file_name().unwrap().to_str().unwrap()),
            Some(pid.to_string().as_str())
        );
        let removed = remove_dead_lab(&dir);
        assert!(!shm.exists(), "{removed:?}");
        assert!(!dir.exists(), "{removed:?}");
        assert!(
            removed.iter().any(|r| r.contains(&id.to_string())),
            "{removed:?}"
        );
    }
}
