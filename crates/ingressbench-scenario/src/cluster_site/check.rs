//! What a cluster cell refuses before anything is made: targets the cluster file does
//! not hold, events cluster mode cannot make, route changes a controller cannot express
//! (`route_refusals`, also for `cluster check`).

use ingressbench_cluster::file::{ClusterFile, ClusterTarget};
use ingressbench_cluster::routes::{self, gateway, Can, Routing};
use ingressbench_lab::model::Overlay;
use ingressbench_lab::Change;

use super::ClusterOptions;

/// Checks, before anything is made, that every cell can run in the cluster the file
/// describes: its target placed (a target the file does not name is an error, never
/// skipped), plain HTTP, and only the events cluster mode makes through the API.
pub fn check_cells(cells: &[crate::Cell], file: &ClusterFile) -> Result<(), String> {
    let names: Vec<String> = cells.iter().map(|c| c.target.file_key()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let unplaced = file.unplaced(&names);
    if !unplaced.is_empty() {
        return Err(format!(
            "the cluster file does not place target(s) {}: add each under `targets:` with its ingress_class and address (the cluster file says where, the scenario what)",
            unplaced.join(", ")
        ));
    }
    for cell in cells {
        let placed = &file.targets[&cell.target.file_key()];
        let (http, https) = placed.addresses();
        let generated =
            cell.scenario.routes.count > 0 || cell.events.iter().any(|e| e.action.is_route_event());
        if generated && placed.service.is_none() && http.is_none() {
            return Err(format!(
                "cell {} ({}): the route probe asks generated routes over plain HTTP, and the cluster file gives target `{}` no `address: http://…`; add it",
                cell.index,
                cell.label(),
                cell.target.name()
            ));
        }
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
        if cell.scenario.load.kind.is_grpc() {
            check_grpc(cell)?;
        }
        let t = &cell.scenario.tuning;
        let knobs = [
            ("workers", t.workers.is_some()),
            ("keepalive_requests", t.keepalive_requests.is_some()),
            ("upstream_keepalive", t.upstream_keepalive.is_some()),
            ("listen_backlog", t.listen_backlog.is_some()),
            ("upstream_protocol", t.upstream_protocol.is_some()),
            ("drain", t.drain.is_some()),
            ("nodes", !t.nodes.is_empty()),
        ];
        if let Some((knob, _)) = knobs.iter().find(|(_, set)| *set) {
            return Err(format!(
                "cell {} ({}): tuning.{knob} tunes the lab's proxies, and a cluster's controller takes none of it from the tool: {} (run with --set tuning.{knob}=null)",
                cell.index,
                cell.label(),
                crate::model::cluster_refusal(knob)
            ));
        }
        if crate::timeline::Timeline::of(cell, 1.0)?.delays_changes() {
            return Err(format!(
                "cell {} ({}): a propagation_delay is the lab's stand-in for a slow controller; in a cluster the real control plane's delay is measured: run with --set controller.propagation_delay=0s (and no event's own)",
                cell.index,
                cell.label()
            ));
        }
        for (i, e) in cell.events.iter().enumerate() {
            if let crate::model::Action::Upgrade { to, .. } = &e.action {
                upgradable(i, &cell.target.name(), placed, to)?;
            }
            if matches!(e.action.change(), Some(Change::Restart { .. })) && placed.restart.is_none()
            {
                return Err(format!(
                    "events[{i}]: a restart of target `{}`'s controller: the cluster file does not say how; add `restart: {{ deployment: NAME, namespace: NS }}` (or `daemonset:`) to the target, the workload a rollout restart rolls as `kubectl rollout restart` does (the local cluster's file says `restart: {{ local: DIR, process: NAME }}`)",
                    cell.target.name()
                ));
            }
        }
    }
    Ok(())
}

/// The route changes a cell's events make in a cluster, in order: its `config` events',
/// and for a reload the routes applied again (at most what the others make, or the
/// first routes when it comes first).
pub(super) fn route_changes(cell: &crate::Cell) -> Vec<Overlay> {
    let mut changes = crate::timeline::route_changes(cell);
    if (cell.events.iter()).any(|e| matches!(e.action.change(), Some(Change::Reload))) {
        changes.push(Overlay::default());
    }
    changes
}

/// What a gRPC cell cannot have in a cluster, found without asking it: a mesh (the
/// controllers' ways to its sidecars are HTTP/1.1 over TLS), generated routes or route
/// events (the route probe asks HTTP), a route change's rewrite or CORS (a GRPCRoute
/// has neither filter; a call's path is its method), or a host whose paths go to
/// different pools (gRPC routes match methods, not path prefixes).
fn check_grpc(cell: &crate::Cell) -> Result<(), String> {
    let s = &cell.scenario;
    let at = format!("cell {} ({})", cell.index, cell.label());
    if cell.target.hop().is_some() {
        return Err(format!("{at}: a gRPC load through a mesh is not built: the controllers reach its sidecars over HTTP/1.1 with TLS, and gRPC needs HTTP/2; run gRPC without a hop"));
    }
    if s.routes.count > 0 || cell.events.iter().any(|e| e.action.is_route_event()) {
        return Err(format!("{at}: the route probe asks generated routes over HTTP, not gRPC; run route-scale scenarios with an HTTP load"));
    }
    for change in route_changes(cell) {
        if change.rewrite.is_some() || change.cors_origin.is_some() {
            return Err(format!("{at}: a route change's {} has no meaning for gRPC calls (a call's path is its method; a GRPCRoute has no rewrite or CORS filter): keep to response headers, or run it with an HTTP load", if change.rewrite.is_some() { "path rewrite" } else { "CORS" }));
        }
    }
    let mut pools: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
    for r in &s.routes.own {
        if let Some(other) = pools.insert(&r.host, &r.pool).filter(|p| *p != r.pool) {
            return Err(format!("{at}: host `{}` sends paths to pools `{other}` and `{}`; gRPC routes (a GRPCRoute, an Ingress of gRPC backends) match methods, not path prefixes: give each host one pool", r.host, r.pool));
        }
    }
    Ok(())
}

/// A target's routes as its controller takes them.
pub(super) struct Routed {
    /// The controller (IngressClass `spec.controller`, GatewayClass `controllerName`).
    pub(super) controller: String,
    /// Its name and what of a route change it can express (none: a controller the tool
    /// has no profile for, whose routes take no changes).
    pub(super) support: Option<(&'static str, Can)>,
    pub(super) routing: Routing,
}

/// Asks the cluster which controller serves a target's routes.
pub(super) fn route_support(
    options: &ClusterOptions,
    placed: &ClusterTarget,
) -> Result<Routed, String> {
    let controller = ingressbench_cluster::deploy::route_controller(&options.api, placed)
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
        let changes = route_changes(cell);
        let target = cell.target.name();
        let mtls = cell.target.hop().is_some_and(|h| h.mtls);
        let revisions = changes_generated_routes(cell);
        let grpc = cell.scenario.load.kind.is_grpc();
        if (changes.is_empty() && !mtls && !revisions && !grpc) || refused.contains_key(&target) {
            continue;
        }
        let key = cell.target.file_key();
        let Some(placed) = options.file.targets.get(&key) else {
            continue;
        };
        if !asked.contains_key(&key) {
            asked.insert(key.clone(), route_support(options, placed)?);
        }
        let routed: &Routed = &asked[&key];
        let refusal = match changes.is_empty() {
            true => Ok(()),
            false => refuse_unexpressible(&target, &routed.controller, routed.support, &changes),
        }
        .and_then(|()| match mtls {
            true => refuse_unmeshable(&target, placed, routed),
            false => Ok(()),
        })
        .and_then(|()| match revisions {
            true => refuse_unrevisable(&target, &routed.routing),
            false => Ok(()),
        })
        .and_then(|()| match grpc {
            true => refuse_grpc(&target, routed, &changes),
            false => Ok(()),
        });
        if let Err(e) = refusal {
            refused.insert(
                target,
                format!("cell {} ({}): {e}", cell.index, cell.label()),
            );
        }
    }
    Ok(refused)
}

/// The targets whose cells send HTTP/3 but whose cluster file entries do not say they
/// take it (`http3: true`), by their names in the file, each with why: in its
/// controller's words where the tool knows them (one that has no way to serve it is
/// named, with the way it lacks). Asks the cluster once per such target.
pub fn http3_refusals(
    options: &ClusterOptions,
    cells: &[crate::Cell],
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut refused = std::collections::BTreeMap::new();
    for cell in cells {
        let key = cell.target.file_key();
        if cell.scenario.load.protocol.as_deref() != Some("http3") || refused.contains_key(&key) {
            continue;
        }
        let Some(placed) = options.file.targets.get(&key) else {
            continue;
        };
        if placed.http3 {
            continue;
        }
        let controller = ingressbench_cluster::deploy::route_controller(&options.api, placed)
            .map_err(|e| e.to_string())?;
        let why = match routes::http3_way(&controller) {
            Some(Err(why)) => format!("target `{key}` takes no HTTP/3: {why}"),
            Some(Ok(how)) => format!(
                "target `{key}`: its cluster file entry does not say it takes HTTP/3 on its TLS address's UDP port; {how}: then add `http3: true` to the target"
            ),
            None => format!(
                "target `{key}`: its cluster file entry does not say it takes HTTP/3; where `{controller}` serves QUIC on the TLS address's UDP port, add `http3: true` to the target"
            ),
        };
        refused.insert(key, why);
    }
    Ok(refused)
}

/// Whether an event of `cell` changes generated routes (`change_routes`).
pub(super) fn changes_generated_routes(cell: &crate::Cell) -> bool {
    cell.events
        .iter()
        .any(|e| matches!(e.action.change(), Some(Change::ChangeRoutes(_))))
}

/// A target whose routes cannot each answer their own revision (`change_routes`): an
/// Ingress controller that sets headers for many Ingresses at once.
pub(super) fn refuse_unrevisable(target: &str, routing: &Routing) -> Result<(), String> {
    routes::generated::revisions(routing).map_err(|why| {
        format!(
            "target `{target}`: change_routes needs each generated route to answer its revision in a response header, and {why}; drop the change_routes events for this target (--set targets=[…] runs the others)"
        )
    })
}

/// A target whose controller cannot reach a mesh's sidecars over mutual TLS: one the
/// tool has no way for (a Gateway's routes, a controller without a profile that says
/// how), or one whose client certificate is its own configuration when the cluster file
/// does not name its Secret.
pub(super) fn refuse_unmeshable(
    target: &str,
    placed: &ClusterTarget,
    routed: &Routed,
) -> Result<(), String> {
    match routes::mesh_way(&routed.routing) {
        None => Err(format!(
            "target `{target}`: the tool knows no way to give `{}` a client certificate for a mesh's sidecars through {} (it knows {}, and {}'s Gateways); run its hop with `mtls: false`, or without a hop",
            routed.controller,
            if placed.gateway.is_some() { "a Gateway's routes" } else { "its Ingress" },
            profiles_that(|p| p.mesh.is_some()),
            gateway::meshable().collect::<Vec<_>>().join(", ")
        )),
        Some((name, routes::MeshWay { own_client_certificate: Some(set_in), .. }))
            if placed.mesh_client.is_none() =>
        {
            Err(format!(
            "target `{target}`: {name} presents one client certificate to every upstream, set in {set_in}; name that Secret in the cluster file as `mesh_client: {{ name, namespace }}` (its `ca.crt` is what the sidecars accept), as `cluster local up` does"
            ))
        }
        Some(_) => Ok(()),
    }
}

/// A target that cannot carry a cell's gRPC: an Ingress controller the tool cannot tell
/// to speak HTTP/2 to the backends (one without a profile, or whose profile has no way),
/// or a Gateway implementation whose GRPCRoutes take no response header when the cell
/// changes its routes.
pub(super) fn refuse_grpc(
    target: &str,
    routed: &Routed,
    changes: &[Overlay],
) -> Result<(), String> {
    match &routed.routing {
        Routing::Ingress {
            profile: Some(routes::Profile { h2c: Some(_), .. }),
            ..
        } => Ok(()),
        Routing::Gateway { implementation, .. } if changes.iter().any(|c| c.response_header.is_some()) && !implementation.grpc_headers => Err(format!(
            "target `{target}`: {} takes no `ResponseHeaderModifier` on a GRPCRoute (it leaves such a route unserved), so a route change's response header through a gRPC load cannot be made; drop it from the `config` events for it, or run them with an HTTP load",
            implementation.name
        )),
        Routing::Gateway { .. } => Ok(()),
        Routing::Ingress { .. } => Err(format!(
            "target `{target}`: the tool knows no way to make `{}` speak HTTP/2 to the backends, as gRPC needs (it knows {}, and a Gateway's GRPCRoutes); run gRPC through a Gateway, or an HTTP load for this target",
            routed.controller,
            profiles_that(|p| p.h2c.is_some())
        )),
    }
}

/// The names of the Ingress controllers whose profile `has`, for messages.
fn profiles_that(has: impl Fn(&routes::Profile) -> bool) -> String {
    routes::PROFILES
        .iter()
        .filter(|p| has(p))
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn refuse_unexpressible(
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

/// Whether an `upgrade` event (the `i`-th) can upgrade target `target`'s controller: the
/// cluster file says how, the event names one version, and a chart on this machine for
/// that version is there.
fn upgradable(
    i: usize,
    target: &str,
    placed: &ingressbench_cluster::file::ClusterTarget,
    to: &crate::model::UpgradeTo,
) -> Result<(), String> {
    use ingressbench_cluster::file::UpgradeBy;
    // To the version it runs: a roll of its pods (processes), as its restart.
    let crate::model::UpgradeTo::Version(version) = to else {
        if placed.restart.is_none() {
            return Err(format!(
                "events[{i}]: an upgrade of target `{target}`'s controller to the version it runs (`same`, or versions of lab proxies only) is a restart of it, and the cluster file does not say how to restart it; add `restart: {{ deployment: NAME, namespace: NS }}` to the target, or give the event a version of the controller (`upgrade: 1.9.1`) and the target `upgrade:` (docs/CLUSTER.md)"
            ));
        }
        return Ok(());
    };
    let Some(via) = &placed.upgrade else {
        return Err(format!(
            "events[{i}]: an upgrade of target `{target}`'s controller: the cluster file does not say how; add `upgrade: {{ helm: {{ release: NAME, namespace: NS, chart: \"…{{version}}…\" }}, follow: [{{ deployment: NAME, namespace: NS }}] }}` (or `image: {{ deployment, namespace, container, image }}`) to the target (docs/CLUSTER.md)"
        ));
    };
    let upgrade = via
        .checked()
        .map_err(|e| format!("targets.{target}.upgrade: {e}"))?;
    if let UpgradeBy::Helm { chart, .. } = &upgrade.by {
        let chart = chart.replace("{version}", version);
        let local = chart.starts_with('/') || chart.starts_with('.');
        if local && !std::path::Path::new(&chart).exists() {
            return Err(format!(
                "events[{i}]: no chart of version {version} for target `{target}` at {chart} (the local cluster's: bash scripts/controllers.sh builds Envoy Gateway's)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_is_refused_where_the_controller_has_no_way_for_it() {
        let gateway = |controller: &str| Routed {
            controller: controller.to_owned(),
            support: None,
            routing: Routing::Gateway {
                parent: ingressbench_cluster::file::GatewayRef {
                    name: "gw".into(),
                    namespace: "infra".into(),
                    listener: None,
                    tls_listener: None,
                },
                implementation: gateway::support(controller),
            },
        };
        let change = [Overlay {
            response_header: Some(("X-Churn".into(), "on".into())),
            ..Overlay::default()
        }];
        let traefik = gateway("traefik.io/gateway-controller");
        refuse_grpc("t", &traefik, &[]).unwrap();
        // A reload (the routes applied again) needs no header.
        refuse_grpc("t", &traefik, &[Overlay::default()]).unwrap();
        let err = refuse_grpc("t", &traefik, &change).unwrap_err();
        assert!(
            err.contains("Traefik takes no `ResponseHeaderModifier` on a GRPCRoute"),
            "{err}"
        );
        refuse_grpc(
            "t",
            &gateway("gateway.envoyproxy.io/gatewayclass-controller"),
            &change,
        )
        .unwrap();
        let ingress = |controller: &str| Routed {
            controller: controller.to_owned(),
            support: None,
            routing: Routing::Ingress {
                class: "c".into(),
                profile: routes::profile(controller),
            },
        };
        refuse_grpc("t", &ingress(routes::haproxy_ingress::CONTROLLER), &change).unwrap();
        let err = refuse_grpc("t", &ingress("example.com/unknown"), &[]).unwrap_err();
        assert!(
            err.contains("no way to make `example.com/unknown` speak HTTP/2"),
            "{err}"
        );
        assert!(
            err.contains("Traefik, Contour, HAProxy Ingress, ingress-nginx"),
            "{err}"
        );
    }
}
