//! A lab: echo backends as separate processes, a CA and certificate, and proxies in front,
//! all in a private directory, all torn down when the lab is dropped.
//!
//! The lab in four rooms besides this one, which holds what they share (the spec, the
//! lab itself, the route tables it makes): `up` (bring-up: nodes, links, certificates,
//! backends, proxies, front), `changes` (what a change is, and the machine that applies
//! it: a method per kind of change, the propagation delay, restarts that span ticks),
//! `observe` (what the run reads off the lab: usage parts, the proxies' counters,
//! liveness, the kernel's settings, the map), `leftovers` (what a lab whose owner died
//! left behind, and its removal).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::certs::LabCerts;
use crate::front::Front;
use crate::kernel::NodeSysctls;
use crate::model::{
    check_name, Generation, Overlay, Pool, Route, RouteTable, Tuning, UpstreamProtocol,
    GENERATION_HEADER, SIDECAR_GENERATION_HEADER,
};
use crate::process::OwnedChild;
use crate::proxy::{Binaries, Proxy, ProxyKind, ProxyOptions};
use crate::reaper::Reaper;
use crate::relay::Relay;
use crate::routes::{is_route_change, RoutesDelta};
use crate::topology::{Isolation, Nodes, Topology};
use crate::LabError;

mod changes;
mod leftovers;
mod observe;
mod up;

use crate::change::{Change, ChangeRecord};
use changes::{Restarting, UpgradeTo};
use leftovers::mark_kept;
pub use leftovers::remove_leftovers;

/// The start of a lab directory's name (then the owner's pid and a time stamp).
pub(super) const DIR_PREFIX: &str = "ingressbench-lab-";
/// How long a drained backend may take to exit.
pub(super) const DRAIN_GRACE: Duration = Duration::from_secs(10);

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
            routes: overlay.reroute(&self.routes),
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
    /// The pool it belongs to.
    pub pool: String,
    /// Where it listens.
    pub addr: SocketAddr,
    /// The node it runs on (its name in the topology).
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

impl Lab {
    /// Waits the lab makes for a proxy to drain (a restart's grace) end when `stopping`
    /// is set: a run stopped with Ctrl-C does not wait out a 15 s grace.
    pub fn cut_waits_short_on(&mut self, stopping: Arc<AtomicBool>) {
        self.stopping = stopping;
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
}

/// What a part is told to call with each process it starts: the lab's reaper watches
/// that process's group (a lab without a reaper tells no one).
fn watching(reaper: &mut Option<Reaper>) -> impl FnMut(u32) + '_ {
    move |pid| {
        if let Some(r) = reaper.as_mut() {
            r.watch(pid);
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
