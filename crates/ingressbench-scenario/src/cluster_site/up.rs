//! A cell's objects made in the cluster: its namespace, Deployment and Service, its
//! routes (an Ingress of the target's class, or HTTPRoutes on its Gateway) and, over TLS,
//! its certificate; then the wait, bounded, until every route answers through the
//! controller. Removed by `ClusterSite`'s drop.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ingressbench_cluster::deploy::mesh::{Mesh, MeshTls};
use ingressbench_cluster::deploy::{PodState, Route, RunNamespace, RunObjects, CANNOT_START};
use ingressbench_cluster::file::ClusterTarget;
use ingressbench_cluster::routes::{gateway, Routing};
use ingressbench_lab::certs::DEFAULT_TLS_NAME;
use ingressbench_lab::model::Overlay;
use ingressbench_lab::model::GENERATION_HEADER;

use super::check::{
    refuse_grpc, refuse_unexpressible, refuse_unmeshable, refuse_unrevisable, route_support, Routed,
};
use super::{
    ClusterOptions, ClusterSite, Door, Inside, Shape, FIRST_GENERATION, REFUSED_GRACE,
    ROUTE_STATUS_TIMEOUT, ROUTING_TIMEOUT, STATUS_EVERY,
};
use crate::site::CellFailure;

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
        let (address, plain, inside) = entrances(options, target, placed, &shape)?;
        let at = resolve(&address)?;
        let generated = shape.generated;
        let probe = shape.probe;
        let probe_at = match plain {
            Some(plain) if generated > 0 || shape.probed => Some(resolve(&plain)?),
            _ => None,
        };
        let plain_parent = placed.gateway.as_ref().map(|g| g.for_traffic(false));
        // Read before anything is made: a selector that matches nothing fails the cell
        // here, not after its namespace is up.
        let usage = match &placed.usage {
            Some(usage) => Some(
                ingressbench_cluster::usage::UsageWatch::start(&options.api, target, usage)
                    .map_err(|e| format!("target `{target}`: {e}"))?,
            ),
            None => None,
        };
        // Read by a thread of their own: a reading that waits holds up no event.
        let counters = match placed.counters.as_ref() {
            Some(via) => {
                Some(counters_watch(via, options).map_err(|e| format!("target `{target}`: {e}"))?)
            }
            None => None,
        };
        let pool_names: Vec<String> = shape.pools.iter().map(|(p, _)| p.clone()).collect();
        let own_routes: Vec<ingressbench_lab::model::Route> = shape
            .routes
            .iter()
            .map(|r| ingressbench_lab::model::Route {
                host: r.host.clone(),
                path_prefix: r.prefix.clone(),
                pool: r.pool.clone(),
                revision: 0,
            })
            .collect();
        let namespace = format!(
            "{}-{}-{cell}",
            options.file.namespace_prefix, options.run_id
        );
        let (controller, routing) = routing_for(options, target, placed, &shape)?;
        let Secured {
            routing,
            tls_dir,
            door_tls,
            secret,
        } = secure(routing, placed, &namespace, &shape)?;
        let with_generations = !shape.route_changes.is_empty();
        let first_replicas = shape.pools.first().map_or(0, |p| p.1);
        let made_at = Instant::now();
        let made = mesh_for(options, placed, &namespace, &shape)
            .and_then(|mesh| objects_for(options, namespace, routing, secret, mesh, shape))
            .and_then(|objects| make(options, objects));
        let (run, endpoints) = match made {
            Ok(made) => made,
            Err(e) => {
                if let Some(dir) = &tls_dir {
                    let _ = std::fs::remove_dir_all(dir);
                }
                return Err(e.into());
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
            overlay: Overlay::default(),
            routes_record: serde_json::json!({
                "kind": if matches!(run.objects().routing, Routing::Gateway { .. }) { gateway::route_kind(run.objects()) } else { "Ingress" },
                "controller": controller,
            }),
            errands: super::errands::Errands::new(&run),
            run,
            routes: own_routes,
            pool_names,
            probe_at,
            plain_parent,
            local: (target.to_owned(), placed.local_pids),
            usage,
            records: Vec::new(),
            reporting: Vec::new(),
            status_at: Instant::now(),
            pending: Vec::new(),
            before: Vec::new(),
            beat_at: Instant::now(),
            restart: placed.restart.as_ref().map(|r| r.checked()).transpose()?,
            upgrade: placed.upgrade.as_ref().map(|u| u.checked()).transpose()?,
            counters,
            restarting: Vec::new(),
            restart_read_at: Instant::now(),
        };
        if let Routing::Gateway { parent, .. } = &site.run.objects().routing {
            // The time the controller took to accept the routes is part of the record.
            let accepted = site.wait_accepted(parent)?;
            site.routes_record["names"] =
                serde_json::json!(gateway::route_names(site.run.objects()));
            site.routes_record["accepted_after_s"] =
                serde_json::json!(accepted.saturating_duration_since(made_at).as_secs_f64());
        }
        site.wait_routing(first_replicas)?;
        if generated > 0 {
            site.make_generated(generated, probe)?;
        }
        Ok(site)
    }

    /// Reads the status of every HTTPRoute of the cell until the controller reports all
    /// `Accepted` and `ResolvedRefs` for their current generation: when it did (to
    /// [`STATUS_EVERY`]), or an error naming the route and the condition's reason.
    pub(super) fn wait_accepted(
        &self,
        parent: &ingressbench_cluster::file::GatewayRef,
    ) -> Result<Instant, CellFailure> {
        let deadline = Instant::now() + ROUTE_STATUS_TIMEOUT;
        let mut refused_since: Option<Instant> = None;
        loop {
            match super::events::route_verdict(&self.run, parent)? {
                None => return Ok(Instant::now()),
                Some((name, gateway::Verdict::Refused(why))) => {
                    let since = *refused_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= REFUSED_GRACE {
                        return Err(CellFailure::input(format!("{} {}/{name} was not accepted by Gateway {parent}: {why}; correct the target's `gateway:` (name, namespace, listener) or the Gateway's `allowedRoutes`", gateway::route_kind(self.run.objects()), self.run.name())));
                    }
                }
                Some((name, why)) => {
                    refused_since = None;
                    if Instant::now() >= deadline {
                        let why = match why {
                            gateway::Verdict::Waiting(w) => w,
                            other => format!("{other:?}"),
                        };
                        return Err(CellFailure::input(format!("{} {}/{name}: {why} after {} s; is the implementation behind Gateway {parent} running?", gateway::route_kind(self.run.objects()), self.run.name(), ROUTE_STATUS_TIMEOUT.as_secs())));
                    }
                }
            }
            std::thread::sleep(STATUS_EVERY);
        }
    }

    /// Ready means routing: every pod of every pool ready, the first pool's in the
    /// EndpointSlices, and every route answered through the controller by a pod of its
    /// pool.
    pub(super) fn wait_routing(&self, replicas: usize) -> Result<(), CellFailure> {
        let deadline = Instant::now() + ROUTING_TIMEOUT;
        let o = self.run.objects();
        let mut last = String::from("nothing asked yet");
        while Instant::now() < deadline {
            match self.not_routing(replicas)? {
                None => return Ok(()),
                Some(why) => last = why,
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

    /// What keeps the cell from routing now (`None`: nothing); a pod that cannot start
    /// is an error at once, since it will not start later.
    fn not_routing(&self, replicas: usize) -> Result<Option<String>, CellFailure> {
        let o = self.run.objects();
        let pods = self.run.all_pods().map_err(|e| e.to_string())?;
        if let Some((pod, why)) = pods.iter().find_map(|p| {
            let w = p.waiting.as_deref()?;
            CANNOT_START
                .iter()
                .any(|r| w.starts_with(r))
                .then_some((&p.name, w))
        }) {
            // An image the nodes cannot have is the cluster file's to fix; anything else
            // (a crash, a missing Secret, a refused sysctl) is said as it is.
            let fix = match ["ErrImage", "ImagePull", "InvalidImageName"]
                .iter()
                .any(|r| why.starts_with(r))
            {
                true => "; set `image:` in the cluster file to an image of ingressbench the cluster's nodes can pull (docs/CLUSTER.md)",
                false => "",
            };
            return Err(CellFailure::input(format!(
                "pod {}/{pod} cannot start: {why}{fix}",
                o.namespace
            )));
        }
        let ready = |pool: &str| pods.iter().filter(|p| p.ready && p.pool == pool).count();
        let endpoints = self.run.ready_endpoints().map_err(|e| e.to_string())?;
        let short = o
            .other_pools
            .iter()
            .map(|(pool, n)| (pool.as_str(), usize::try_from(*n).unwrap_or(0)))
            .find(|(pool, n)| ready(pool) < *n);
        if ready(&o.pool) < replicas || endpoints.len() < replicas {
            return Ok(Some(format!(
                "{} of {replicas} pods ready, {} in the EndpointSlices",
                ready(&o.pool),
                endpoints.len()
            )));
        }
        if let Some((pool, n)) = short {
            return Ok(Some(format!(
                "{} of {n} pods of pool {pool} ready",
                ready(pool)
            )));
        }
        Ok(o.routes.iter().find_map(|r| self.unanswered(r, &pods)))
    }

    /// Why route `r` is not answered as it should be through the controller (by a pod of
    /// its pool, with the run's first generation when routes change), or `None`.
    fn unanswered(&self, r: &Route, pods: &[PodState]) -> Option<String> {
        let (host, path) = (r.host.as_str(), r.prefix.as_str());
        let host = if host == "*" { DEFAULT_TLS_NAME } else { host };
        match ask(&self.door, host, path) {
            Some((b, _)) if !pods.iter().any(|p| p.name == b && p.pool == r.pool) => Some(format!(
                "{host}{path} answered by `{b}`, not one of this run's pods of pool {}",
                r.pool
            )),
            // With route changes, the first generation's Middlewares in force.
            Some((_, g))
                if self.generation.is_some()
                    && gateway::generation_answered(self.run.objects())
                    && g.as_deref() != Some(&FIRST_GENERATION.to_string()) =>
            {
                Some(format!("{host}{path} answered without the run's Middlewares ({GENERATION_HEADER}: {g:?})"))
            }
            Some(_) => None,
            None => Some(format!(
                "{host}{path} not answered by a backend through {}",
                self.door.address
            )),
        }
    }
}

/// Where the cell's traffic enters the controller (its address over the cell's scheme,
/// from the cluster file or the LoadBalancer Service's status), its plain HTTP address
/// (the route probe's), and how the cluster's own pods reach it.
/// The reader of what the target's proxy counts: its Envoy's admin socket, its HAProxy's
/// runtime API, or its pods through the API; on a thread of its own.
fn counters_watch(
    via: &ingressbench_cluster::file::CountersVia,
    options: &ClusterOptions,
) -> Result<ingressbench_cluster::counters::CountersWatch, ingressbench_cluster::ClusterError> {
    use ingressbench_cluster::counters::CountersWatch;
    use ingressbench_lab::proxy::counters::{envoy_admin, haproxy_stat};
    match (&via.envoy_admin, &via.haproxy_stat, &via.pods) {
        (Some(socket), _, _) => {
            let socket = socket.clone();
            CountersWatch::start(move || envoy_admin(&socket))
        }
        (None, Some(socket), _) => {
            let socket = socket.clone();
            CountersWatch::start(move || haproxy_stat(&socket))
        }
        (None, None, Some(pods)) => CountersWatch::pods(&options.api, pods.clone()),
        (None, None, None) => CountersWatch::start(|| Ok(Default::default())),
    }
}

fn entrances(
    options: &ClusterOptions,
    target: &str,
    placed: &ClusterTarget,
    shape: &Shape,
) -> Result<(String, Option<String>, Inside), CellFailure> {
    let (http, https) = match &placed.service {
        Some(service) => ingressbench_cluster::check::lookup_service(&options.api, service)
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
    let plain = http.clone();
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
    Ok((address, plain, inside))
}

/// How the cell's routes are made: an Ingress of the target's class when nothing changes
/// them; else the controller's own means (a profile, or its Gateway), checked before
/// anything is made, with a change it cannot express refused.
fn routing_for(
    options: &ClusterOptions,
    target: &str,
    placed: &ClusterTarget,
    shape: &Shape,
) -> Result<(Option<String>, Routing), CellFailure> {
    let mtls = shape.mesh.is_some_and(|m| m.mtls);
    // gRPC through an Ingress needs its controller's own h2c setting.
    let told = shape.traffic == ingressbench_cluster::deploy::Traffic::Grpc;
    if placed.gateway.is_none()
        && shape.route_changes.is_empty()
        && !mtls
        && !shape.revisions
        && !told
    {
        let routing = Routing::Ingress {
            class: placed.ingress_class.clone().unwrap_or_default(),
            profile: None,
        };
        return Ok((None, routing));
    }
    let input = CellFailure::input;
    let Routed {
        controller,
        support,
        routing,
    } = route_support(options, placed).map_err(|m| input(format!("target `{target}`: {m}")))?;
    let routed = Routed {
        controller,
        support,
        routing,
    };
    if !shape.route_changes.is_empty() {
        refuse_unexpressible(target, &routed.controller, support, &shape.route_changes)
            .map_err(input)?;
    }
    if mtls {
        refuse_unmeshable(target, placed, &routed).map_err(input)?;
    }
    if shape.revisions {
        refuse_unrevisable(target, &routed.routing).map_err(input)?;
    }
    if shape.traffic == ingressbench_cluster::deploy::Traffic::Grpc {
        refuse_grpc(target, &routed, &shape.route_changes).map_err(input)?;
    }
    Ok((Some(routed.controller), routed.routing))
}

/// The cell's routing over TLS, and what the run keeps for it.
struct Secured {
    routing: Routing,
    /// The cell's own certificate files (an Ingress over TLS).
    tls_dir: Option<PathBuf>,
    /// The CA the client trusts, and a client that trusts only it.
    door_tls: Option<(PathBuf, std::sync::Arc<rustls::ClientConfig>)>,
    /// The Secret an Ingress presents.
    secret: Option<(String, String)>,
}

/// Over TLS an Ingress presents the run's own certificate (a Secret from a CA of the
/// cell's); an HTTPRoute, the certificate its Gateway's owner gave the listener.
fn secure(
    routing: Routing,
    placed: &ClusterTarget,
    namespace: &str,
    shape: &Shape,
) -> Result<Secured, CellFailure> {
    let plain = |routing| Secured {
        routing,
        tls_dir: None,
        door_tls: None,
        secret: None,
    };
    if !shape.tls {
        return Ok(plain(routing));
    }
    match routing {
        Routing::Gateway {
            parent,
            implementation,
        } => {
            // check_cells made sure the file gives one.
            let ca = placed
                .ca
                .clone()
                .ok_or("a gateway target over TLS without `ca:`")?;
            let client = client_trusting(&ca)?;
            Ok(Secured {
                door_tls: Some((ca, client)),
                ..plain(Routing::Gateway {
                    parent: parent.for_traffic(true),
                    implementation,
                })
            })
        }
        routing => {
            let (dir, ca, secret) = certificate(namespace, &shape.routes)?;
            let client = client_trusting(&ca)?;
            Ok(Secured {
                routing,
                tls_dir: Some(dir),
                door_tls: Some((ca, client)),
                secret: Some(secret),
            })
        }
    }
}

/// The cell's mesh, if its target has a hop: the sidecar's image, and with mutual TLS a
/// CA of the cell's own, the sidecars' certificate for every pool's Service from it,
/// and the client certificate the controller presents: the run's, or the controller's
/// own (the cluster file's `mesh_client`), whose CA the sidecars then accept as well.
fn mesh_for(
    options: &ClusterOptions,
    placed: &ClusterTarget,
    namespace: &str,
    shape: &Shape,
) -> Result<Option<Mesh>, String> {
    let Some(asked) = shape.mesh else {
        return Ok(None);
    };
    let image = options.file.sidecar_image.clone();
    if !asked.mtls {
        return Ok(Some(Mesh { image, tls: None }));
    }
    let pools: Vec<&str> = shape.pools.iter().map(|(p, _)| p.as_str()).collect();
    let names = ingressbench_cluster::deploy::mesh::certificate_names(namespace, &pools);
    let dir = std::env::temp_dir().join(format!("ingressbench-{namespace}-mesh"));
    let made = std::fs::create_dir_all(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))
        .and_then(|()| ingressbench_lab::certs::generate(&dir, &names).map_err(|e| e.to_string()))
        .and_then(|certs| {
            let read = |p: &std::path::Path| {
                std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))
            };
            Ok(MeshTls {
                sidecar: (read(&certs.cert)?, read(&certs.key)?),
                client_cas: read(&certs.ca)?,
                client: (read(&certs.client_cert)?, read(&certs.client_key)?),
                ca: read(&certs.ca)?,
            })
        });
    // The PEMs go into the cell's Secrets; no file of them stays.
    let _ = std::fs::remove_dir_all(&dir);
    let mut tls = made?;
    if let Some(secret) = &placed.mesh_client {
        let theirs = ingressbench_cluster::deploy::secret_value(&options.api, secret, "ca.crt")
            .map_err(|e| format!("the cluster file's mesh_client: {e}"))?;
        tls.client_cas.push_str(&theirs);
    }
    Ok(Some(Mesh {
        image,
        tls: Some(tls),
    }))
}

/// The objects of the cell's namespace: its pools as Deployments and Services, its routes,
/// the CORS origins its route changes name, its sysctls, certificate and mesh.
fn objects_for(
    options: &ClusterOptions,
    namespace: String,
    routing: Routing,
    secret: Option<(String, String)>,
    mesh: Option<Mesh>,
    shape: Shape,
) -> Result<RunObjects, String> {
    let pools = shape
        .pools
        .iter()
        .map(|(name, n)| Ok((name.clone(), i32::try_from(*n)?)))
        .collect::<Result<Vec<(String, i32)>, std::num::TryFromIntError>>()
        .map_err(|e| e.to_string())?;
    if pools.is_empty() {
        return Err("the scenario has no backend pool".into());
    }
    let with_generations = !shape.route_changes.is_empty();
    Ok(RunObjects {
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
        traffic: shape.traffic,
        sysctls: shape.sysctls,
        grace_s: 10,
        tls: secret,
        mesh,
    })
}

/// Makes the namespace and its objects and starts watching the pool's EndpointSlices;
/// what was made is deleted if the watch cannot start.
fn make(
    options: &ClusterOptions,
    objects: RunObjects,
) -> Result<(RunNamespace, ingressbench_cluster::deploy::EndpointsWatch), String> {
    let run = RunNamespace::create(&options.api, objects).map_err(|e| e.to_string())?;
    match run.watch_endpoints() {
        Ok(watch) => Ok((run, watch)),
        Err(e) => {
            let _ = run.delete();
            Err(e.to_string())
        }
    }
}

/// The controller's pods, for load placed beside them: its Service's namespace and
/// selector. A target without `service:`, or whose Service selects no pods, is the
/// input's error.
fn ingress_pods(
    options: &ClusterOptions,
    target: &str,
    placed: &ClusterTarget,
) -> Result<(String, std::collections::BTreeMap<String, String>), CellFailure> {
    let input = CellFailure::input;
    let Some(service) = &placed.service else {
        return Err(input(format!(
            "load.placement.node: same_as_ingress places the load beside the controller's pods, which the run finds through its Service: give target `{target}` `service: {{ name, namespace }}` in the cluster file"
        )));
    };
    let selector = ingressbench_cluster::deploy::service_selector(
        &options.api,
        service,
    )
    .map_err(|e| e.to_string())?
    .ok_or_else(|| input(format!(
        "load.placement.node: same_as_ingress: Service {}/{} selects no pods (the controller runs outside the cluster's pods, as the local cluster's do), so there is no node to be beside; use another placement",
        service.namespace, service.name
    )))?;
    Ok((service.namespace.clone(), selector))
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
    use ingressbench_lab::http1::{exchange, Request, Until};
    let tcp = std::net::TcpStream::connect_timeout(&door.at, Duration::from_secs(2)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let request = Request::get(host, path);
    let answer = match &door.tls {
        None => exchange(tcp, &request, Until::End),
        Some((_, config)) => {
            let name = rustls::pki_types::ServerName::try_from(host.to_owned()).ok()?;
            let conn = rustls::ClientConnection::new(config.clone(), name).ok()?;
            // A close without close_notify still leaves what was read.
            exchange(rustls::StreamOwned::new(conn, tcp), &request, Until::End)
        }
    }
    .ok()?;
    Some((
        answer.header("x-backend")?.to_owned(),
        answer.header(GENERATION_HEADER).map(str::to_owned),
    ))
}
