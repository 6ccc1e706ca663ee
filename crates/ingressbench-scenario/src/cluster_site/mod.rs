//! A cell in a Kubernetes cluster ([`ClusterSite`]): the scenario's backends as a
//! Deployment of `ingressbench backend` pods behind a Service, its routes as an Ingress of
//! the target's class or as HTTPRoutes attached to its Gateway, in a namespace of the
//! cell's own (see [`ingressbench_cluster::deploy`] and [`ingressbench_cluster::routes`]);
//! events go through the API as a person or a pipeline would make them, and each change's
//! `endpoints_at` is when the Service's EndpointSlices showed the new set (the control
//! plane's part; the traffic shows the proxy's part). A route change through the Gateway
//! API also gets `reported_at`: when the controller reported the route's new generation
//! in its status.
//!
//! The site in six rooms: `check` (what a cluster cell refuses before anything is made),
//! `up` (the cell's namespace, routes and certificate, up to routes that answer),
//! `events` (changes through the API, and when the EndpointSlices and the controller's
//! status show them; a controller's restart and when it was complete), `errands` (the API
//! calls of events and their follow-ups, each off the events' driver), `generated` (route scale: an object per generated route, made,
//! changed and deleted K at a time), `pods` (load from the cluster's own pods). This file
//! holds the site itself and what they share.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ingressbench_cluster::deploy::{EndpointsWatch, Route, RunNamespace};
use ingressbench_cluster::file::ClusterFile;
use ingressbench_cluster::workers::LoadJob;
use ingressbench_lab::model::Overlay;
use ingressbench_lab::{Change, ChangeRecord};
use ingressbench_load::probe::ProbeOptions;
use ingressbench_load::TlsOptions;

use crate::model::{LoadFrom, Target};
use crate::site::{CellFailure, Entry, Site};

mod check;
mod errands;
mod events;
mod generated;
mod pods;
mod up;

pub use check::{check_cells, http3_refusals, route_refusals};

/// Where a run's cells go when it runs with `--cluster`.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The cluster file.
    pub file: ClusterFile,
    /// The run's connection to the cluster (its kubeconfig, and the context: `--context`,
    /// else the file's, else the current one), held for the whole run.
    pub api: ingressbench_cluster::api::ClusterApi,
    /// The run's id: namespaces are `PREFIX-ID-CELL`.
    pub run_id: String,
}

/// How long the routes may take to answer through the controller after the objects are
/// made.
const ROUTING_TIMEOUT: Duration = Duration::from_secs(90);

/// How long a controller may take to report on a new HTTPRoute (or a change of one).
const ROUTE_STATUS_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a condition reported false may stay so before it is an error (a controller
/// may report before it has seen everything).
const REFUSED_GRACE: Duration = Duration::from_secs(3);

/// How often a pending route change's status is read.
const STATUS_EVERY: Duration = Duration::from_millis(50);

/// The route configuration's generation at the start (the load reads 0 as none).
const FIRST_GENERATION: u32 = 1;

/// How often the namespace's heartbeat is refreshed.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(30);

/// A change waiting for the EndpointSlices to show it.
enum Expect {
    /// `n` ready endpoints.
    Ready(usize),
    /// This address gone from the ready ones.
    Gone(String),
}

/// What a cell runs in the cluster.
pub(crate) struct Shape {
    /// The pools and their backends at the start; events act on the first.
    pub(crate) pools: Vec<(String, usize)>,
    /// Routes: host (`*`: any), path prefix and pool.
    pub(crate) routes: Vec<Route>,
    /// The backend pods' kernel settings.
    pub(crate) sysctls: std::collections::BTreeMap<String, String>,
    /// Over TLS (the run's own CA and certificate, as a Secret the Ingress names).
    pub(crate) tls: bool,
    /// The route changes its events ask for (through the controller's own means).
    pub(crate) route_changes: Vec<Overlay>,
    /// Its load comes from pods placed beside the controller's.
    pub(crate) near_ingress: bool,
    /// A sidecar in every backend pod (a mesh), with mutual TLS from the controller or
    /// plain HTTP.
    pub(crate) mesh: Option<MeshShape>,
    /// Generated routes at the start (`routes.count`), an object each.
    pub(crate) generated: usize,
    /// An event changes generated routes (`change_routes`): each must answer its
    /// revision.
    pub(crate) revisions: bool,
    /// How the route probe asks, for the generated routes at the start.
    pub(crate) probe: ProbeOptions,
    /// An event adds, removes or changes routes: the route probe asks them.
    pub(crate) probed: bool,
    /// What the load sends, where the controller must be told (gRPC).
    pub(crate) traffic: ingressbench_cluster::deploy::Traffic,
}

/// What a mesh of a cell asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MeshShape {
    /// Mutual TLS between the controller and the sidecars.
    pub(crate) mtls: bool,
}

impl Shape {
    /// What `cell` asks of a cluster.
    pub(crate) fn of(cell: &crate::Cell) -> Self {
        let s = &cell.scenario;
        // Each pool a Deployment and a Service of its name (a scenario without one: `echo`,
        // three backends); without routes, every request to the first.
        let pools: Vec<(String, usize)> = if s.backends.is_empty() {
            vec![("echo".into(), 3)]
        } else {
            s.backends
                .iter()
                .map(|p| (p.name.clone(), p.replicas))
                .collect()
        };
        let route = |host: &str, prefix: &str, pool: &str| ingressbench_cluster::deploy::Route {
            host: host.to_owned(),
            prefix: prefix.to_owned(),
            pool: pool.to_owned(),
        };
        let routes: Vec<ingressbench_cluster::deploy::Route> = if s.routes.own.is_empty() {
            vec![route("*", "/", &pools[0].0)]
        } else {
            s.routes
                .own
                .iter()
                .map(|r| route(&r.host, &r.path_prefix, &r.pool))
                .collect()
        };
        // The scenario's kernel settings (with the target's over them) become the backend
        // pods' `securityContext.sysctls`: a pod is a network namespace, as a lab node is.
        let mut sysctls: std::collections::BTreeMap<String, String> = s
            .tuning
            .sysctls
            .iter()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        if let Target::Proxy { sysctls: own, .. } = &cell.target {
            sysctls.extend(own.iter().map(|(k, v)| (k.clone(), v.0.clone())));
        }
        Shape {
            pools,
            routes,
            sysctls,
            tls: s.tls,
            route_changes: check::route_changes(cell),
            near_ingress: s.load.from == LoadFrom::Cluster
                && s.load.placement.as_ref().and_then(|p| p.node)
                    == Some(crate::model::NodePlacement::SameAsIngress),
            mesh: cell.target.hop().map(|h| MeshShape { mtls: h.mtls }),
            generated: s.routes.count,
            revisions: check::changes_generated_routes(cell),
            // The scenario's check read it already.
            probe: crate::propagation::probe_options(s).unwrap_or_default(),
            probed: cell.events.iter().any(|e| e.action.is_route_event()),
            traffic: traffic(s.load.kind),
        }
    }
}

/// What a load of `kind` needs the controller told: gRPC's h2c (an event stream is a
/// long HTTP answer, and a WebSocket an upgrade every controller here lets through).
pub(crate) fn traffic(kind: crate::model::LoadKindFile) -> ingressbench_cluster::deploy::Traffic {
    use crate::model::LoadKindFile;
    use ingressbench_cluster::deploy::Traffic;
    match kind {
        LoadKindFile::Http | LoadKindFile::Sse | LoadKindFile::Websocket => Traffic::Http,
        LoadKindFile::Grpc | LoadKindFile::GrpcStream => Traffic::Grpc,
    }
}

/// Where the cell's traffic enters the controller.
struct Door {
    /// `http://host:port` or `https://host:port`, as the cluster file gives it.
    address: String,
    /// What it resolves to.
    at: std::net::SocketAddr,
    /// Over TLS: the run's CA file and a client that trusts only it.
    tls: Option<(PathBuf, std::sync::Arc<rustls::ClientConfig>)>,
}

/// How the cluster's own pods reach the controller, for load from the cluster.
struct Inside {
    /// Its plain HTTP and TLS addresses from inside.
    addresses: (Option<String>, Option<String>),
    /// Load pods on the nodes' network.
    host_network: bool,
    /// The controller's pods (its Service's namespace and selector), found before
    /// anything is made when the load is to be placed beside them.
    ingress_pods: Option<(String, std::collections::BTreeMap<String, String>)>,
}

/// One cell's objects in a cluster; the namespace (and the cell's certificate files) are
/// deleted when it is dropped.
pub(crate) struct ClusterSite {
    inside: Inside,
    /// The pool's EndpointSlices as the watch delivers them.
    endpoints: EndpointsWatch,
    run: RunNamespace,
    door: Door,
    /// The cell's certificate files, if it is over TLS.
    tls_dir: Option<PathBuf>,
    /// The route configuration's generation (route changes only).
    generation: Option<u32>,
    /// The route change in force (a reload applies it again).
    overlay: Overlay,
    /// How the routes were made, for the results: kind, names, controller, and for
    /// HTTPRoutes how long the controller took to accept them.
    routes_record: serde_json::Value,
    records: Vec<ChangeRecord>,
    /// Route changes whose status the controller has not reported yet (HTTPRoutes), by
    /// record.
    reporting: Vec<usize>,
    status_at: Instant,
    /// The routes in force: the scenario's own, then the generated ones (an object
    /// each).
    routes: Vec<ingressbench_lab::model::Route>,
    /// The pools generated routes go to, in turn.
    pool_names: Vec<String>,
    /// Where the route probe asks the generated routes (the target's plain HTTP
    /// address), if the cell has any.
    probe_at: Option<std::net::SocketAddr>,
    /// The Gateway's plain HTTP listener, which generated HTTPRoutes attach to.
    plain_parent: Option<ingressbench_cluster::file::GatewayRef>,
    /// The target's name, and its processes when it is a controller of the local cluster
    /// (their CPU and memory are read from `/proc`).
    local: (String, Option<ingressbench_cluster::file::LocalPids>),
    /// Or the thread reading its pods through the API (the cluster file's `usage:`).
    usage: Option<ingressbench_cluster::usage::UsageWatch>,
    /// Changes not yet in the EndpointSlices: record, and what to look for after it was
    /// asked.
    pending: Vec<(usize, Expect)>,
    /// Pods before each scale, to name the ones it started and stopped, and when the
    /// EndpointSlices showed it.
    before: Vec<(usize, Vec<String>, Option<Instant>)>,
    /// The API calls out on threads of their own.
    errands: errands::Errands,
    beat_at: Instant,
    /// How the target's controller is restarted (the cluster file's `restart:`).
    restart: Option<ingressbench_cluster::file::Restart>,
    /// How it is upgraded (the cluster file's `upgrade:`).
    upgrade: Option<ingressbench_cluster::file::Upgrade>,
    /// Where its proxy's own counts are read (the cluster file's `counters:`).
    counters: Option<ingressbench_cluster::counters::CountersWatch>,
    /// Restarts not yet complete, by record.
    restarting: Vec<(usize, events::Restarting)>,
    restart_read_at: Instant,
}

impl Site for ClusterSite {
    fn entry(&self, tls: bool, host: &str, path: &str) -> Result<Entry, String> {
        Ok(match (&self.door.tls, tls) {
            (Some((ca, _)), true) => Entry {
                url: format!("https://{host}:{}{path}", self.door.at.port()),
                tls: Some((
                    TlsOptions {
                        cacert: Some(ca.clone()),
                        ..TlsOptions::default()
                    },
                    Some(self.door.at),
                )),
                host_header: false,
                proxy_version: None,
            },
            (None, false) => Entry {
                url: format!("{}{path}", self.door.address.trim_end_matches('/')),
                tls: None,
                host_header: true,
                proxy_version: None,
            },
            _ => return Err("the cell's entry was made for the other scheme".into()),
        })
    }

    fn cluster_load(
        &self,
        request: (bool, &str, &str),
        workers: usize,
        placement: Option<&crate::model::PlacementFile>,
    ) -> Result<(Entry, LoadJob), CellFailure> {
        self.load_job(request, workers, placement)
    }

    fn request(&mut self, change: Change, _delay: Duration) -> Result<usize, String> {
        self.apply(change)
    }

    fn route_probe(&self) -> Option<std::net::SocketAddr> {
        self.probe_at
    }

    /// What the controller's proxy counted (its Envoy's `/stats` or its HAProxy's `show
    /// stat`, on the socket the cluster file's `counters:` names; or its pods' Prometheus
    /// endpoints, through the API server): the last reading of the thread that reads it
    /// (one that waits holds up nothing here).
    fn proxy_counters(&mut self) -> (Instant, ingressbench_lab::proxy::counters::Readings) {
        match &self.counters {
            Some(watch) => {
                let (at, counted) = watch.latest();
                (at, vec![(self.local.0.clone(), counted)])
            }
            None => (Instant::now(), Vec::new()),
        }
    }

    /// A reading its thread began from now on (at most its interval and time-out away).
    fn last_proxy_counters(&mut self) -> (Instant, ingressbench_lab::proxy::counters::Readings) {
        match &self.counters {
            Some(watch) => {
                let (at, counted) = watch.after(Instant::now());
                (at, vec![(self.local.0.clone(), counted)])
            }
            None => (Instant::now(), Vec::new()),
        }
    }

    /// The pods the cluster file's `usage:` names, read through the API; or a local
    /// controller's process groups: the controller, and its proxy when that runs apart
    /// (named in the file, or a group the controller started); a controller that is its
    /// own proxy (Traefik) is one part, the proxy.
    fn usage_parts(&self) -> Vec<ingressbench_lab::usage::Part> {
        use ingressbench_lab::usage::{child_groups, Part};
        if let Some(watch) = &self.usage {
            return watch.parts();
        }
        let (name, Some(pids)) = &self.local else {
            return Vec::new();
        };
        let proxy = pids
            .proxy
            .or_else(|| child_groups(pids.controller).first().copied());
        match proxy {
            Some(proxy) => vec![
                Part::group(name, "controller", pids.controller),
                Part::group(&format!("{name}-proxy"), "proxy", proxy),
            ],
            None => vec![Part::group(name, "proxy", pids.controller)],
        }
    }

    fn route_delta(&self, change: &Change) -> Option<ingressbench_lab::RoutesDelta> {
        self.generated_delta(change)
    }

    fn route_count(&self) -> Option<usize> {
        Some(self.routes.len())
    }

    fn tick(&mut self) -> Result<(), String> {
        self.advance()
    }

    fn records(&self) -> &[ChangeRecord] {
        &self.records
    }

    fn awaiting_control_plane(&self) -> bool {
        // A kill's EndpointSlice change is pending once its calls have picked the pod.
        !self.pending.is_empty() || self.errands.event_out()
    }

    fn record(&self, _dir: &std::path::Path) -> crate::site::SiteRecord {
        crate::site::SiteRecord {
            routes: Some(self.routes_record.clone()),
            ..Default::default()
        }
    }
}

impl Drop for ClusterSite {
    fn drop(&mut self) {
        let _ = self.run.delete_generated();
        let _ = self.run.delete_routes();
        let _ = self.run.delete();
        if let Some(dir) = &self.tls_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
