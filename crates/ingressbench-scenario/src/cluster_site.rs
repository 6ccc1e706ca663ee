//! A cell in a Kubernetes cluster ([`ClusterSite`]): the scenario's backends as a
//! Deployment of `ingressbench backend` pods behind a Service, its routes as an Ingress of
//! the target's class or as HTTPRoutes attached to its Gateway, in a namespace of the
//! cell's own (see [`ingressbench_cluster::deploy`] and [`ingressbench_cluster::routes`]);
//! events go through the API as a person or a pipeline would make them, and each change's
//! `endpoints_at` is when the Service's EndpointSlices showed the new set (the control
//! plane's part; the traffic shows the proxy's part). A route change through the Gateway
//! API also gets `reported_at`: when the controller reported the route's new generation
//! in its status.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ingressbench_cluster::deploy::{
    EndpointsWatch, PodState, Route, RunNamespace, RunObjects, CANNOT_START,
};
use ingressbench_cluster::file::{ClusterFile, ClusterTarget};
use ingressbench_cluster::routes::{self, gateway, Can, Routing};
use ingressbench_cluster::workers::{FleetSpec, LoadJob, Placement};
use ingressbench_lab::certs::DEFAULT_TLS_NAME;
use ingressbench_lab::model::{Overlay, GENERATION_HEADER};
use ingressbench_lab::{Change, ChangeRecord};
use ingressbench_load::TlsOptions;

use crate::site::{CellFailure, Entry, Site};

/// Where a run's cells go when it runs with `--cluster`.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The cluster file.
    pub file: ClusterFile,
    /// The kubeconfig.
    pub kubeconfig: PathBuf,
    /// The context (`--context`, else the file's, else the current one).
    pub context: Option<String>,
    /// The run's id: namespaces are `PREFIX-ID-CELL`.
    pub run_id: String,
}

/// Checks, before anything is made, that every cell can run in the cluster the file
/// describes: its target placed (a target the file does not name is an error, never
/// skipped), plain HTTP, and only the events cluster mode makes through the API.
pub fn check_cells(cells: &[crate::Cell], file: &ClusterFile) -> Result<(), String> {
    let names: Vec<String> = cells.iter().map(|c| c.target.name()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let unplaced = file.unplaced(&names);
    if !unplaced.is_empty() {
        return Err(format!(
            "the cluster file does not place target(s) {}: add each under `targets:` with its ingress_class and address (the cluster file says where, the scenario what)",
            unplaced.join(", ")
        ));
    }
    for cell in cells {
        let placed = &file.targets[&cell.target.name()];
        let (http, https) = placed.addresses();
        let needed = if cell.scenario.tls { https } else { http };
        if placed.service.is_none() && needed.is_none() {
            return Err(format!(
                "cell {} ({}): the scenario is over {} but the cluster file gives target `{}` no {}; add it (or run with --set tls={})",
                cell.index,
                cell.label(),
                if cell.scenario.tls { "TLS" } else { "plain HTTP" },
                cell.target.name(),
                if cell.scenario.tls { "`tls_address: https://…`" } else { "`address: http://…`" },
                !cell.scenario.tls
            ));
        }
        if cell.scenario.topology != ingressbench_lab::labfile::TopologyFile::default() {
            return Err(format!(
                "cell {} ({}): `topology` (placement, client path, links) is the lab's emulation; in a cluster the pods run where its scheduler puts them and the client on this machine: run with --set topology.placement=affinity --set topology.client=internal (and no links)",
                cell.index,
                cell.label()
            ));
        }
        if cell.scenario.tls && placed.gateway.is_some() {
            match &placed.ca {
                None => return Err(format!(
                    "cell {} ({}): the scenario is over TLS and target `{}` is a Gateway, whose HTTPS listener presents the certificate its owner gave it; add `ca:` (the CA certificate that signed it) to the target in the cluster file (or run with --set tls=false)",
                    cell.index,
                    cell.label(),
                    cell.target.name()
                )),
                Some(ca) if !ca.is_file() => return Err(format!(
                    "cell {} ({}): target `{}`'s `ca:` {} is not a file: give the CA certificate (PEM) that signed the Gateway's HTTPS listener certificate",
                    cell.index,
                    cell.label(),
                    cell.target.name(),
                    ca.display()
                )),
                Some(_) => {}
            }
        }
        if crate::runner::Timeline::of(cell, 1.0)?.delays_changes() {
            return Err(format!(
                "cell {} ({}): a propagation_delay is the lab's stand-in for a slow controller; in a cluster the real control plane's delay is measured: run with --set controller.propagation_delay=0s (and no event's own)",
                cell.index,
                cell.label()
            ));
        }
        for (i, e) in cell.events.iter().enumerate() {
            if matches!(e.action, crate::model::Action::Reload) {
                return Err(format!(
                    "events[{i}]: a reload has no meaning in cluster mode: the controller applies what the API holds (scale, kill, terminate, stall_backend and config events are made through it)"
                ));
            }
        }
    }
    Ok(())
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
}

/// A target's routes as its controller takes them.
struct Routed {
    /// The controller (IngressClass `spec.controller`, GatewayClass `controllerName`).
    controller: String,
    /// Its name and what of a route change it can express (none: a controller the tool
    /// has no profile for, whose routes take no changes).
    support: Option<(&'static str, Can)>,
    routing: Routing,
}

/// Asks the cluster which controller serves a target's routes.
fn route_support(options: &ClusterOptions, placed: &ClusterTarget) -> Result<Routed, String> {
    let controller = ingressbench_cluster::deploy::route_controller(
        &options.kubeconfig,
        options.context.as_deref(),
        placed,
    )
    .map_err(|e| e.to_string())?;
    Ok(match (&placed.ingress_class, &placed.gateway) {
        (Some(class), _) => {
            let profile = routes::profile(&controller);
            Routed {
                controller,
                support: profile.map(|p| (p.name, p.can)),
                routing: Routing::Ingress {
                    class: class.clone(),
                    profile,
                },
            }
        }
        (None, Some(g)) => {
            let implementation = gateway::support(&controller);
            Routed {
                controller,
                support: Some((implementation.name, implementation.can)),
                routing: Routing::Gateway {
                    parent: g.clone(),
                    implementation,
                },
            }
        }
        (None, None) => return Err("the target names neither ingress_class nor gateway".into()),
    })
}

/// The targets whose controllers cannot express a route change their cells ask for, each
/// with why (the first such cell's), found before anything is made: the command refuses
/// them, naming the controller and the change. Asks the cluster once per target.
pub fn route_refusals(
    options: &ClusterOptions,
    cells: &[crate::Cell],
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut asked = std::collections::BTreeMap::new();
    let mut refused = std::collections::BTreeMap::new();
    for cell in cells {
        let changes = crate::runner::route_changes(cell);
        let target = cell.target.name();
        if changes.is_empty() || refused.contains_key(&target) {
            continue;
        }
        let Some(placed) = options.file.targets.get(&target) else {
            continue;
        };
        if !asked.contains_key(&target) {
            asked.insert(target.clone(), route_support(options, placed)?);
        }
        let routed: &Routed = &asked[&target];
        if let Err(e) = refuse_unexpressible(&target, &routed.controller, routed.support, &changes)
        {
            refused.insert(
                target,
                format!("cell {} ({}): {e}", cell.index, cell.label()),
            );
        }
    }
    Ok(refused)
}

fn refuse_unexpressible(
    target: &str,
    controller: &str,
    support: Option<(&str, Can)>,
    changes: &[Overlay],
) -> Result<(), String> {
    let Some((name, can)) = support else {
        return Err(format!(
            "target `{target}`: its routes are served by `{controller}`, for which the tool knows no way to make route changes (it knows {}, and the Gateway API); run the scenario without `config` events for it, or route it through a Gateway",
            routes::PROFILES
                .iter()
                .map(|p| format!("{} through {}", p.name, p.means))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    };
    for change in changes {
        let missing = can.missing(change);
        if !missing.is_empty() {
            return Err(format!(
                "target `{target}`: {name} (`{controller}`) cannot express {} of the route change `{}`; drop it from the scenario's events for this target (--set targets=[…] runs the others)",
                missing.join(" or "),
                change.describe()
            ));
        }
    }
    Ok(())
}

/// The controller's pods, for load placed beside them: its Service's namespace and
/// selector. A target without `service:`, or whose Service selects no pods, is the
/// input's error.
fn ingress_pods(
    options: &ClusterOptions,
    target: &str,
    placed: &ClusterTarget,
) -> Result<(String, std::collections::BTreeMap<String, String>), CellFailure> {
    let input = |message: String| CellFailure {
        message,
        input: true,
    };
    let Some(service) = &placed.service else {
        return Err(input(format!(
            "load.placement.node: same_as_ingress places the load beside the controller's pods, which the run finds through its Service: give target `{target}` `service: {{ name, namespace }}` in the cluster file"
        )));
    };
    let selector = ingressbench_cluster::deploy::service_selector(
        &options.kubeconfig,
        options.context.as_deref(),
        service,
    )
    .map_err(|e| e.to_string())?
    .ok_or_else(|| input(format!(
        "load.placement.node: same_as_ingress: Service {}/{} selects no pods (the controller runs outside the cluster's pods, as the local cluster's do), so there is no node to be beside; use another placement",
        service.namespace, service.name
    )))?;
    Ok((service.namespace.clone(), selector))
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
    /// How the routes were made, for the results: kind, names, controller, and for
    /// HTTPRoutes how long the controller took to accept them.
    routes_record: serde_json::Value,
    records: Vec<ChangeRecord>,
    /// Route changes whose status the controller has not reported yet (HTTPRoutes), by
    /// record.
    reporting: Vec<usize>,
    status_at: Instant,
    /// Changes not yet in the EndpointSlices: record, what to look for, and when it was
    /// asked (just before the API call).
    pending: Vec<(usize, Expect, Instant)>,
    /// Pods before each pending scale, to name the ones it started.
    before: Vec<(usize, Vec<String>)>,
    beat_at: Instant,
}

impl ClusterSite {
    /// Makes the cell's namespace for target `target` with what `shape` says, and waits
    /// (bounded) until every route answers through the controller.
    pub(crate) fn up(
        options: &ClusterOptions,
        target: &str,
        cell: usize,
        shape: Shape,
    ) -> Result<Self, CellFailure> {
        let placed = options.file.targets.get(target).ok_or_else(|| {
            format!("target `{target}` is not in the cluster file: add it under `targets:` with its ingress_class and address")
        })?;
        // From the cluster file, or the LoadBalancer Service's status.
        let (http, https) = match &placed.service {
            Some(service) => ingressbench_cluster::deploy::lookup_service(
                &options.kubeconfig,
                options.context.as_deref(),
                service,
            )
            .map_err(|e| e.to_string())?,
            None => placed.addresses(),
        };
        let inside = Inside {
            addresses: placed.cluster_addresses((http.clone(), https.clone())),
            host_network: options.file.workers.host_network,
            ingress_pods: match shape.near_ingress {
                true => Some(ingress_pods(options, target, placed)?),
                false => None,
            },
        };
        let address = if shape.tls { https } else { http };
        let address = address.ok_or_else(|| {
            format!(
                "target `{target}`: the cluster file (or its Service) gives no {} address for it",
                if shape.tls {
                    "`tls_address: https://…`"
                } else {
                    "`address: http://…`"
                }
            )
        })?;
        let at = resolve(&address)?;
        let namespace = format!(
            "{}-{}-{cell}",
            options.file.namespace_prefix, options.run_id
        );
        // Route changes go through the controller's own means; a Gateway is checked (and
        // its implementation known) before anything is made.
        let (controller, routing) = match (&placed.gateway, shape.route_changes.is_empty()) {
            (None, true) => (
                None,
                Routing::Ingress {
                    class: placed.ingress_class.clone().unwrap_or_default(),
                    profile: None,
                },
            ),
            _ => {
                let Routed {
                    controller,
                    support,
                    routing,
                } = route_support(options, placed).map_err(|message| CellFailure {
                    message: format!("target `{target}`: {message}"),
                    input: true,
                })?;
                refuse_unexpressible(target, &controller, support, &shape.route_changes).map_err(
                    |message| CellFailure {
                        message,
                        input: true,
                    },
                )?;
                (Some(controller), routing)
            }
        };
        // Over TLS an Ingress presents the run's own certificate (a Secret from a CA of
        // the cell's); an HTTPRoute, the certificate its Gateway's owner gave the listener.
        let (routing, tls_dir, door_tls, secret) = match (routing, shape.tls) {
            (routing, false) => (routing, None, None, None),
            (
                Routing::Gateway {
                    parent,
                    implementation,
                },
                true,
            ) => {
                // check_cells made sure the file gives one.
                let ca = placed
                    .ca
                    .clone()
                    .ok_or("a gateway target over TLS without `ca:`")?;
                let routing = Routing::Gateway {
                    parent: parent.for_traffic(true),
                    implementation,
                };
                (
                    routing,
                    None,
                    Some((ca.clone(), client_trusting(&ca)?)),
                    None,
                )
            }
            (routing, true) => {
                let (dir, ca, secret) = certificate(&namespace, &shape.routes)?;
                let client = client_trusting(&ca)?;
                (routing, Some(dir), Some((ca, client)), Some(secret))
            }
        };
        let with_generations = !shape.route_changes.is_empty();
        let pools = shape
            .pools
            .iter()
            .map(|(name, n)| Ok((name.clone(), i32::try_from(*n)?)))
            .collect::<Result<Vec<(String, i32)>, std::num::TryFromIntError>>()
            .map_err(|e| e.to_string())?;
        if pools.is_empty() {
            return Err("the scenario has no backend pool".into());
        }
        let objects = RunObjects {
            routing,
            generation: with_generations.then_some(FIRST_GENERATION),
            cors_origins: shape
                .route_changes
                .iter()
                .filter_map(|o| o.cors_origin.clone())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
            namespace,
            run_id: options.run_id.clone(),
            pool: pools[0].0.clone(),
            replicas: pools[0].1,
            other_pools: pools[1..].to_vec(),
            image: options.file.image.clone(),
            backend_args: Vec::new(),
            routes: shape.routes,
            sysctls: shape.sysctls,
            grace_s: 10,
            tls: secret,
        };
        let remove_certs = |dir: &Option<PathBuf>| {
            if let Some(d) = dir {
                let _ = std::fs::remove_dir_all(d);
            }
        };
        let made_at = Instant::now();
        let run =
            match RunNamespace::create(&options.kubeconfig, options.context.as_deref(), objects) {
                Ok(run) => run,
                Err(e) => {
                    remove_certs(&tls_dir);
                    return Err(e.to_string().into());
                }
            };
        let endpoints = match run.watch_endpoints(&options.kubeconfig, options.context.as_deref()) {
            Ok(w) => w,
            Err(e) => {
                let _ = run.delete();
                remove_certs(&tls_dir);
                return Err(e.to_string().into());
            }
        };
        let mut site = Self {
            inside,
            endpoints,
            door: Door {
                address,
                at,
                tls: door_tls,
            },
            tls_dir,
            generation: with_generations.then_some(FIRST_GENERATION),
            routes_record: serde_json::json!({
                "kind": if matches!(run.objects().routing, Routing::Gateway { .. }) { "HTTPRoute" } else { "Ingress" },
                "controller": controller,
            }),
            run,
            records: Vec::new(),
            reporting: Vec::new(),
            status_at: Instant::now(),
            pending: Vec::new(),
            before: Vec::new(),
            beat_at: Instant::now(),
        };
        if let Routing::Gateway { parent, .. } = &site.run.objects().routing {
            // The time the controller took to accept the routes is part of the record.
            let accepted = site.wait_accepted(parent)?;
            site.routes_record["names"] =
                serde_json::json!(gateway::route_names(site.run.objects()));
            site.routes_record["accepted_after_s"] =
                serde_json::json!(accepted.saturating_duration_since(made_at).as_secs_f64());
        }
        site.wait_routing(shape.pools[0].1)?;
        Ok(site)
    }

    /// Reads the status of every HTTPRoute of the cell until the controller reports all
    /// `Accepted` and `ResolvedRefs` for their current generation: when it did (to
    /// [`STATUS_EVERY`]), or an error naming the route and the condition's reason.
    fn wait_accepted(
        &self,
        parent: &ingressbench_cluster::file::GatewayRef,
    ) -> Result<Instant, CellFailure> {
        let deadline = Instant::now() + ROUTE_STATUS_TIMEOUT;
        let mut refused_since: Option<Instant> = None;
        loop {
            match self.route_verdict(parent)? {
                None => return Ok(Instant::now()),
                Some((name, gateway::Verdict::Refused(why))) => {
                    let since = *refused_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= REFUSED_GRACE {
                        return Err(CellFailure {
                            message: format!("HTTPRoute {}/{name} was not accepted by Gateway {parent}: {why}; correct the target's `gateway:` (name, namespace, listener) or the Gateway's `allowedRoutes`", self.run.name()),
                            input: true,
                        });
                    }
                }
                Some((name, why)) => {
                    refused_since = None;
                    if Instant::now() >= deadline {
                        let why = match why {
                            gateway::Verdict::Waiting(w) => w,
                            other => format!("{other:?}"),
                        };
                        return Err(CellFailure {
                            message: format!("HTTPRoute {}/{name}: {why} after {} s; is the implementation behind Gateway {parent} running?", self.run.name(), ROUTE_STATUS_TIMEOUT.as_secs()),
                            input: true,
                        });
                    }
                }
            }
            std::thread::sleep(STATUS_EVERY);
        }
    }

    /// The first of the cell's HTTPRoutes that is not ready, with what its status says
    /// (none: all are).
    fn route_verdict(
        &self,
        parent: &ingressbench_cluster::file::GatewayRef,
    ) -> Result<Option<(String, gateway::Verdict)>, String> {
        for name in gateway::route_names(self.run.objects()) {
            let route = self
                .run
                .get(gateway::API_VERSION, "HTTPRoute", &name)
                .map_err(|e| e.to_string())?
                .unwrap_or_default();
            match gateway::verdict(&route, parent) {
                gateway::Verdict::Ready => {}
                other => return Ok(Some((name, other))),
            }
        }
        Ok(None)
    }

    /// Ready means routing: every pod of every pool ready, the first pool's in the
    /// EndpointSlices, and every route answered through the controller by a pod of its
    /// pool.
    fn wait_routing(&self, replicas: usize) -> Result<(), CellFailure> {
        let deadline = Instant::now() + ROUTING_TIMEOUT;
        let o = self.run.objects();
        let mut last = String::from("nothing asked yet");
        while Instant::now() < deadline {
            let pods = self.run.all_pods().map_err(|e| e.to_string())?;
            // A pod that cannot start will not start later: say so now.
            if let Some((pod, why)) = pods.iter().find_map(|p| {
                let w = p.waiting.as_deref()?;
                CANNOT_START
                    .iter()
                    .any(|r| w.starts_with(r))
                    .then_some((&p.name, w))
            }) {
                return Err(CellFailure {
                    message: format!(
                        "pod {}/{pod} cannot start: {why}; set `image:` in the cluster file to an image of ingressbench the cluster's nodes can pull (docs/CLUSTER.md)",
                        o.namespace
                    ),
                    input: true,
                });
            }
            let ready = |pool: &str| pods.iter().filter(|p| p.ready && p.pool == pool).count();
            let endpoints = self.run.ready_endpoints().map_err(|e| e.to_string())?;
            let short = o
                .other_pools
                .iter()
                .map(|(pool, n)| (pool.as_str(), usize::try_from(*n).unwrap_or(0)))
                .find(|(pool, n)| ready(pool) < *n);
            if ready(&o.pool) < replicas || endpoints.len() < replicas {
                last = format!(
                    "{} of {replicas} pods ready, {} in the EndpointSlices",
                    ready(&o.pool),
                    endpoints.len()
                );
            } else if let Some((pool, n)) = short {
                last = format!("{} of {n} pods of pool {pool} ready", ready(pool));
            } else {
                let answered = o.routes.iter().all(|r| {
                    let (host, path) = (r.host.as_str(), r.prefix.as_str());
                    let host = if host == "*" { DEFAULT_TLS_NAME } else { host };
                    match ask(&self.door, host, path) {
                        Some((b, _)) if !pods.iter().any(|p| p.name == b && p.pool == r.pool) => {
                            last = format!(
                                "{host}{path} answered by `{b}`, not one of this run's pods of pool {}",
                                r.pool
                            );
                            false
                        }
                        // With route changes, the first generation's Middlewares in force.
                        Some((_, g))
                            if self.generation.is_some()
                                && g.as_deref() != Some(&FIRST_GENERATION.to_string()) =>
                        {
                            last = format!("{host}{path} answered without the run's Middlewares ({GENERATION_HEADER}: {g:?})");
                            false
                        }
                        Some(_) => true,
                        None => {
                            last = format!(
                                "{host}{path} not answered by a backend through {}",
                                self.door.address
                            );
                            false
                        }
                    }
                });
                if answered {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(CellFailure::from(format!(
            "the routes of {}/{} did not answer through {} within {} s ({last}); is a controller serving {} and reachable there? `ingressbench cluster check` says",
            o.namespace,
            o.pool,
            self.door.address,
            ROUTING_TIMEOUT.as_secs(),
            match &o.routing {
                Routing::Ingress { class, .. } => format!("ingress class `{class}`"),
                Routing::Gateway { parent, .. } => format!("Gateway {parent}"),
            }
        )))
    }

    /// The pool's pods not being deleted, by name.
    fn live_pods(&self) -> Result<Vec<PodState>, String> {
        let pods = self.run.pods().map_err(|e| e.to_string())?;
        Ok(pods.into_iter().filter(|p| !p.terminating).collect())
    }

    /// The pod an event names: `POOL-N` is the N-th by name of the pods not being deleted,
    /// `None` one of them at random.
    fn pick(&self, name: Option<&str>) -> Result<PodState, String> {
        let pods = self.live_pods()?;
        if pods.is_empty() {
            return Err("no pod of the pool is running".into());
        }
        let index = match name {
            None => {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .subsec_nanos() as usize
                    % pods.len()
            }
            Some(n) => n
                .rsplit_once('-')
                .and_then(|(_, k)| k.parse::<usize>().ok())
                .and_then(|k| k.checked_sub(1))
                .filter(|k| *k < pods.len())
                .ok_or_else(|| format!("`{n}`: the pool has {} pods", pods.len()))?,
        };
        Ok(pods[index].clone())
    }

    /// Records a change asked at `asked` that is applied now (no EndpointSlice shows it).
    fn applied(
        &mut self,
        what: String,
        asked: Instant,
        generations: Vec<(&'static str, u32)>,
    ) -> usize {
        self.records.push(ChangeRecord {
            what,
            requested_at: asked,
            applied_at: Some(Instant::now()),
            endpoints_at: None,
            mechanisms: Vec::new(),
            started: Vec::new(),
            removed: Vec::new(),
            generations,
            reported_at: None,
        });
        self.records.len() - 1
    }

    fn record(
        &mut self,
        what: String,
        removed: Vec<String>,
        expect: Expect,
        asked: Instant,
    ) -> usize {
        // Requested when the tool sent it (the call then succeeded): the control plane
        // can publish the change before the API's answer is back here.
        self.records.push(ChangeRecord {
            what,
            requested_at: asked,
            applied_at: None,
            endpoints_at: None,
            mechanisms: Vec::new(),
            started: Vec::new(),
            removed,
            generations: Vec::new(),
            reported_at: None,
        });
        let index = self.records.len() - 1;
        self.pending.push((index, expect, asked));
        index
    }
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
        (tls, host, path): (bool, &str, &str),
        workers: usize,
        placement: Option<&crate::model::PlacementFile>,
    ) -> Result<(Entry, LoadJob), CellFailure> {
        let input = |message: String| CellFailure {
            message,
            input: true,
        };
        let (http, https) = &self.inside.addresses;
        let address = if tls { https } else { http };
        let address = address.as_deref().ok_or_else(|| {
            input(format!(
                "load.from: cluster: the cluster file gives the target no {} (nor `cluster_{}`)",
                if tls { "tls_address" } else { "address" },
                if tls { "tls_address" } else { "address" },
            ))
        })?;
        // The pods resolve the address themselves; over TLS they send the scenario's host
        // as the TLS name and trust the cell's CA, which travels in their plan.
        let entry = Entry {
            url: format!("{}{path}", address.trim_end_matches('/')),
            tls: match (&self.door.tls, tls) {
                (Some((ca, _)), true) => Some((
                    TlsOptions {
                        cacert: Some(ca.clone()),
                        sni: Some(host.to_owned()),
                        ..TlsOptions::default()
                    },
                    None,
                )),
                _ => None,
            },
            host_header: true,
            proxy_version: None,
        };
        use crate::model::NodePlacement;
        let placement = match placement {
            None => Placement::Any,
            Some(p) => match p.node {
                None => Placement::Nodes(p.node_selector.clone()),
                Some(NodePlacement::Any) => Placement::Any,
                Some(NodePlacement::SameAsBackends) => Placement::SameAsBackends,
                Some(NodePlacement::OtherThanBackends) => Placement::OtherThanBackends,
                Some(NodePlacement::SameAsIngress) => Placement::SameAsIngress,
            },
        };
        let job = self.run.load_job(FleetSpec {
            workers,
            placement,
            host_network: self.inside.host_network,
            ingress_pods: self.inside.ingress_pods.clone(),
        });
        Ok((entry, job))
    }

    fn request(&mut self, change: Change, _delay: Duration) -> Result<usize, String> {
        let kill = matches!(change, Change::Kill(_));
        match change {
            Change::Scale { pool, replicas } => {
                let now: Vec<String> = self.live_pods()?.into_iter().map(|p| p.name).collect();
                let before = now.len();
                let asked = Instant::now();
                self.run
                    .scale(i32::try_from(replicas).map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
                let index = self.record(
                    format!("scale {pool} {before}->{replicas}"),
                    Vec::new(),
                    Expect::Ready(replicas),
                    asked,
                );
                self.before.push((index, now));
                Ok(index)
            }
            Change::Kill(name) | Change::Terminate(name) => {
                let pod = self.pick(name.as_deref())?;
                let asked = Instant::now();
                self.run
                    .delete_pod(&pod.name, kill.then_some(0))
                    .map_err(|e| e.to_string())?;
                let verb = if kill { "kill" } else { "terminate" };
                let expect = match pod.ip {
                    Some(ip) => Expect::Gone(ip),
                    None => Expect::Ready(0),
                };
                Ok(self.record(
                    format!("{verb} {}", pod.name),
                    vec![pod.name],
                    expect,
                    asked,
                ))
            }
            Change::Overlay(overlay) => {
                let generation = self
                    .generation
                    .ok_or("the cell was made without route changes")?
                    + 1;
                let asked = Instant::now();
                self.run
                    .apply(&routes::render(
                        self.run.objects(),
                        Some(generation),
                        &overlay,
                    ))
                    .map_err(|e| e.to_string())?;
                self.generation = Some(generation);
                // Applied when the API stored it; the traffic shows when the proxies had
                // it, and an HTTPRoute's status when its controller says it did.
                let index = self.applied(
                    overlay.describe(),
                    asked,
                    vec![(GENERATION_HEADER, generation)],
                );
                if matches!(self.run.objects().routing, Routing::Gateway { .. }) {
                    self.reporting.push(index);
                }
                Ok(index)
            }
            Change::Stall { backend, duration } => {
                let pod = self.pick(backend.as_deref())?;
                let asked = Instant::now();
                self.run
                    .stall_pod(&pod.name, duration)
                    .map_err(|e| e.to_string())?;
                // Applied when the backend said so (through the API server's proxy).
                Ok(self.applied(
                    format!("stall {} for {duration:?}", pod.name),
                    asked,
                    Vec::new(),
                ))
            }
            Change::Reload => Err(
                "a reload has no meaning in cluster mode: the controller applies what the API holds (route changes are `config` events)"
                    .into(),
            ),
        }
    }

    fn tick(&mut self) -> Result<(), String> {
        let now = Instant::now();
        if now.duration_since(self.beat_at) >= HEARTBEAT_EVERY {
            self.beat_at = now;
            self.run.heartbeat().map_err(|e| e.to_string())?;
        }
        self.read_route_status(now)?;
        // Each pending change is shown by the first set the watch delivered after it was
        // asked that has it.
        let mut done = Vec::new();
        for (i, (index, expect, asked)) in self.pending.iter().enumerate() {
            let shown = self
                .endpoints
                .since(*asked)
                .into_iter()
                .filter(|(at, _)| at > asked)
                .find(|(_, set)| match expect {
                    Expect::Ready(n) => set.len() == *n,
                    Expect::Gone(ip) => !set.contains(ip),
                });
            if let Some((at, _)) = shown {
                done.push(i);
                self.records[*index].endpoints_at = Some(at);
                self.records[*index].applied_at = Some(at);
            }
        }
        for i in done.into_iter().rev() {
            let (index, _, _) = self.pending.remove(i);
            if let Some(at) = self.before.iter().position(|(k, _)| *k == index) {
                let (_, before) = self.before.remove(at);
                let pods = self.run.pods().map_err(|e| e.to_string())?;
                let live = |name: &String| pods.iter().any(|p| &p.name == name && !p.terminating);
                // A scale-up's new pods; a scale-down's pods the Deployment chose to stop.
                self.records[index].started = pods
                    .iter()
                    .filter(|p| p.ready && !before.contains(&p.name))
                    .map(|p| p.name.clone())
                    .collect();
                self.records[index].removed = before.iter().filter(|n| !live(n)).cloned().collect();
            }
        }
        Ok(())
    }

    fn records(&self) -> &[ChangeRecord] {
        &self.records
    }

    fn record(&self, _dir: &std::path::Path) -> crate::site::SiteRecord {
        crate::site::SiteRecord {
            routes: Some(self.routes_record.clone()),
            ..Default::default()
        }
    }
}

impl ClusterSite {
    /// For the oldest route change not yet reported: reads the routes' status (at most
    /// every [`STATUS_EVERY`]) and records when the controller reported the change's
    /// generation. A condition false for it is an error at once (the controller judged
    /// that very generation; waiting would let a later change hide it), as is no report
    /// within [`ROUTE_STATUS_TIMEOUT`].
    fn read_route_status(&mut self, now: Instant) -> Result<(), String> {
        let (Some(&index), Routing::Gateway { parent, .. }) =
            (self.reporting.first(), &self.run.objects().routing)
        else {
            return Ok(());
        };
        if now.duration_since(self.status_at) < STATUS_EVERY {
            return Ok(());
        }
        self.status_at = now;
        let what = self.records[index].what.clone();
        match self.route_verdict(parent)? {
            None => {
                self.records[index].reported_at = Some(now);
                self.reporting.remove(0);
            }
            Some((name, gateway::Verdict::Refused(why))) => {
                return Err(format!(
                    "HTTPRoute {}/{name} refused the change `{what}`: {why}",
                    self.run.name()
                ));
            }
            Some((name, why)) => {
                let asked = self.records[index].requested_at;
                if now.duration_since(asked) >= ROUTE_STATUS_TIMEOUT {
                    return Err(format!(
                        "HTTPRoute {}/{name}: the controller did not report the change `{what}` within {} s ({why:?})",
                        self.run.name(),
                        ROUTE_STATUS_TIMEOUT.as_secs()
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Drop for ClusterSite {
    fn drop(&mut self) {
        let _ = self.run.delete_routes();
        let _ = self.run.delete();
        if let Some(dir) = &self.tls_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The address of `http(s)://host[:port]`.
fn resolve(address: &str) -> Result<std::net::SocketAddr, String> {
    let target =
        ingressbench_load::Target::parse(address).map_err(|e| format!("{address}: {e}"))?;
    std::net::ToSocketAddrs::to_socket_addrs(&(target.host.as_str(), target.port))
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("{address}: cannot resolve {}", target.host))
}

/// A TLS client that trusts the CA certificate in `ca` (and verifies hosts' names).
fn client_trusting(ca: &std::path::Path) -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    ingressbench_load::tls_client_config(&ingressbench_load::TlsOptions {
        cacert: Some(ca.to_owned()),
        ..Default::default()
    })
    .map_err(|e| format!("{}: {e}", ca.display()))
}

/// A CA and a certificate for the routes' hosts, in a directory of the cell's own: the
/// directory, the CA file, and the certificate chain and key for the Secret.
fn certificate(
    namespace: &str,
    routes: &[Route],
) -> Result<(PathBuf, PathBuf, (String, String)), String> {
    let dir = std::env::temp_dir().join(format!("ingressbench-{namespace}-tls"));
    let hosts: Vec<String> = routes.iter().map(|r| r.host.clone()).collect();
    let made = std::fs::create_dir_all(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))
        .and_then(|()| ingressbench_lab::certs::generate(&dir, &hosts).map_err(|e| e.to_string()))
        .and_then(|certs| {
            let read = |p: &std::path::Path| {
                std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))
            };
            Ok((certs.ca.clone(), (read(&certs.cert)?, read(&certs.key)?)))
        });
    match made {
        Ok((ca, secret)) => Ok((dir, ca, secret)),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            Err(e)
        }
    }
}

/// `GET path` with `Host: host` through `door` (over TLS with the run's CA, verifying
/// `host`): the answer's `x-backend` and generation header.
fn ask(door: &Door, host: &str, path: &str) -> Option<(String, Option<String>)> {
    use std::io::{Read, Write};
    let tcp = std::net::TcpStream::connect_timeout(&door.at, Duration::from_secs(2)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    match &door.tls {
        None => {
            let mut s = tcp;
            s.write_all(request.as_bytes()).ok()?;
            let _ = s.read_to_string(&mut text);
        }
        Some((_, config)) => {
            let name = rustls::pki_types::ServerName::try_from(host.to_owned()).ok()?;
            let conn = rustls::ClientConnection::new(config.clone(), name).ok()?;
            let mut s = rustls::StreamOwned::new(conn, tcp);
            s.write_all(request.as_bytes()).ok()?;
            // A close without close_notify still leaves what was read.
            let _ = s.read_to_string(&mut text);
        }
    }
    let header = |name: &str| {
        text.lines().take_while(|l| !l.is_empty()).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    };
    Some((header("x-backend")?, header(GENERATION_HEADER)))
}
