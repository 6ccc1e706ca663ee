//! A run's routes, made and changed the way each controller's users make them. A route
//! change (`config` event: a response header, CORS, a path-prefix rewrite, a revert) is
//! one server-side apply of the run's route objects as a new *generation*: every answer
//! then carries that generation in [`GENERATION_HEADER`], so the traffic shows when the
//! controller's proxies had it.
//!
//! - An Ingress of a class: its controller's [`Profile`], one row of [`PROFILES`], says
//!   which annotations and objects carry a change ([`traefik`]: Middlewares;
//!   [`haproxy_ingress`] and [`ingress_nginx`]: annotations; [`contour`]: its HTTPProxies
//!   instead of the Ingress). A class served by a
//!   controller without a profile routes, but takes no route changes.
//! - HTTPRoutes attached to a Gateway ([`gateway`]): a change becomes the route's own
//!   filters, as the Gateway API defines them.
//!
//! A change a controller cannot express is refused before the run starts
//! ([`Can::missing`]), naming the controller and the change.

pub mod contour;
pub mod gateway;
pub mod generated;
pub mod haproxy_ingress;
pub mod ingress_nginx;
pub mod traefik;

use std::collections::BTreeMap;

use ingressbench_lab::model::{Overlay, GENERATION_HEADER};
use serde_json::Value;

use crate::deploy::{RunObjects, Traffic};
use crate::file::GatewayRef;

/// What a route change asks for, or what a controller can express.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Can {
    /// A response header on every answer (and so the generation header).
    pub header: bool,
    /// A path-prefix rewrite.
    pub rewrite: bool,
    /// CORS for an origin.
    pub cors: bool,
}

impl Can {
    /// Everything.
    pub const ALL: Can = Can {
        header: true,
        rewrite: true,
        cors: true,
    };

    /// The parts of `overlay` this cannot express, in words (empty: all of it). A change
    /// always needs the header: its generation rides on one.
    pub fn missing(&self, overlay: &Overlay) -> Vec<&'static str> {
        let mut out = Vec::new();
        if !self.header {
            out.push("a response header (the generation header every change needs)");
        }
        if overlay.rewrite.is_some() && !self.rewrite {
            out.push("a path rewrite");
        }
        if overlay.cors_origin.is_some() && !self.cors {
            out.push("CORS");
        }
        out
    }
}

/// One Ingress controller's way of carrying route changes.
#[derive(Debug)]
pub struct Profile {
    /// Its name in messages (`Traefik`).
    pub name: &'static str,
    /// Its IngressClass's `spec.controller`.
    pub controller: &'static str,
    /// By what means, in words (`Middlewares`), for messages.
    pub means: &'static str,
    /// What it can express.
    pub can: Can,
    /// The Ingress annotations and the other objects (in the run's namespace) that make
    /// `overlay` generation `generation`.
    pub render: fn(namespace: &str, generation: u32, overlay: &Overlay) -> Rendered,
    /// The controller's own route objects that replace the Ingress in a run with route
    /// changes or a mesh, of a class, for a generation of a change (none: the Ingress
    /// stays).
    pub routes: Option<RouteObjects>,
    /// How it speaks mutual TLS to a mesh's sidecars (none: it cannot, and a mesh with
    /// mutual TLS is refused for it).
    pub mesh: Option<MeshWay>,
    /// How it is told to speak gRPC's HTTP/2 without TLS (h2c) to a pool (none: it
    /// cannot, and a gRPC load is refused for it).
    pub h2c: Option<H2cWay>,
}

/// The annotations that make a controller speak HTTP/2 without TLS (h2c) to a pool, as
/// gRPC needs: of the pool's Service, and of the Ingress.
#[derive(Debug)]
pub struct H2cWay {
    /// On each pool's Service.
    pub service: &'static [(&'static str, &'static str)],
    /// On the Ingress.
    pub ingress: &'static [(&'static str, &'static str)],
}

/// How a controller outside a mesh reaches the sidecars of the backends inside it, over
/// mutual TLS (the OSM experiment's "given an mTLS certificate").
#[derive(Debug)]
pub struct MeshWay {
    /// A pool's Service annotations and other objects that make it speak TLS to the
    /// sidecars, check their certificate against the mesh's CA and present its client
    /// certificate.
    pub render: fn(o: &RunObjects, pool: &str) -> Rendered,
    /// Where the one client certificate it presents to every upstream is set, if it is
    /// its own (Contour's configuration, a Gateway's `tls.backend`): the cluster file
    /// names its Secret (`mesh_client`), whose CA the sidecars then accept. None: it
    /// presents the run's ([`crate::deploy::mesh::CLIENT_SECRET`]).
    pub own_client_certificate: Option<&'static str>,
}

/// A controller's own route objects for the run, its class, a generation and a change.
pub type RouteObjects = fn(&RunObjects, &str, Option<u32>, &Overlay) -> Vec<Value>;

/// What a profile renders for one generation.
#[derive(Debug, Default)]
pub struct Rendered {
    /// The Ingress's annotations.
    pub annotations: BTreeMap<String, String>,
    /// Other objects, applied before the Ingress.
    pub objects: Vec<Value>,
}

/// The Ingress controllers whose route changes the tool knows how to make.
pub const PROFILES: &[Profile] = &[
    traefik::PROFILE,
    contour::PROFILE,
    haproxy_ingress::PROFILE,
    ingress_nginx::PROFILE,
];

/// The profile of the controller named `controller` (an IngressClass's
/// `spec.controller`).
pub fn profile(controller: &str) -> Option<&'static Profile> {
    PROFILES.iter().find(|p| p.controller == controller)
}

/// How the controller named `controller` (an IngressClass's `spec.controller` or a
/// GatewayClass's `controllerName`) is made to serve HTTP/3, in words; or why it cannot.
/// None: a controller the tool knows nothing of.
pub fn http3_way(controller: &str) -> Option<Result<&'static str, &'static str>> {
    Some(match controller {
        traefik::CONTROLLER | "traefik.io/gateway-controller" => {
            Ok("Traefik serves it on an entry point with `http3` (`--entrypoints.websecure.http3`)")
        }
        "gateway.envoyproxy.io/gatewayclass-controller" => {
            Ok("Envoy Gateway serves it on a Gateway a ClientTrafficPolicy with `http3: {}` targets")
        }
        contour::CONTROLLER | "projectcontour.io/gateway-controller" => {
            Err("Contour has no setting that makes its Envoy listen for QUIC")
        }
        haproxy_ingress::CONTROLLER => Err(
            "HAProxy Ingress has no setting for QUIC, and the HAProxy it runs here (2.6, as Debian packages it) is built without a QUIC TLS library",
        ),
        _ => return None,
    })
}

/// Where a run's routes go.
#[derive(Clone, Debug)]
pub enum Routing {
    /// An Ingress of this class, changed through `profile` (none: the routes do not
    /// change).
    Ingress {
        /// The IngressClass.
        class: String,
        /// How its controller takes changes.
        profile: Option<&'static Profile>,
    },
    /// HTTPRoutes attached to a Gateway.
    Gateway {
        /// The Gateway (and listener).
        parent: GatewayRef,
        /// The implementation behind it.
        implementation: &'static gateway::Implementation,
    },
}

/// The run's route objects for generation `generation` of `overlay` (none: a run without
/// route changes, whose answers carry no generation), in the order to apply them.
pub fn render(o: &RunObjects, generation: Option<u32>, overlay: &Overlay) -> Vec<Value> {
    // A change of the routes' pool is a change of their backend (an Ingress path's
    // `service`, an HTTPRoute's `backendRefs`), as its user would edit it.
    let rerouted;
    let o = match &overlay.pool {
        Some(pool) => {
            rerouted = RunObjects {
                routes: (o.routes.iter())
                    .map(|r| crate::deploy::Route {
                        pool: pool.clone(),
                        ..r.clone()
                    })
                    .collect(),
                ..o.clone()
            };
            &rerouted
        }
        None => o,
    };
    match &o.routing {
        Routing::Gateway {
            parent,
            implementation,
        } => gateway::httproutes(o, parent, implementation, generation, overlay),
        Routing::Ingress {
            class,
            profile:
                Some(Profile {
                    routes: Some(routes),
                    ..
                }),
        } if generation.is_some() || mesh_tls(o) => routes(o, class, generation, overlay),
        Routing::Ingress { class, profile } => {
            let mut rendered = match (generation, profile) {
                (Some(g), Some(p)) => (p.render)(&o.namespace, g, overlay),
                _ => Rendered::default(),
            };
            if let (Traffic::Grpc, Some(Profile { h2c: Some(way), .. })) = (o.traffic, profile) {
                rendered.annotations.extend(
                    way.ingress
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
                );
            }
            let mut objects = rendered.objects;
            objects.push(crate::deploy::ingress_object(
                o,
                class,
                rendered.annotations,
            ));
            objects
        }
    }
}

/// The annotations of `pool`'s Service: how the controller reaches the mesh's sidecars
/// over mutual TLS, or speaks gRPC's h2c to the backends, as its profile says.
pub fn service_annotations(o: &RunObjects, pool: &str) -> BTreeMap<String, String> {
    let mut out = mesh_rendered(o, pool).annotations;
    if let (
        Traffic::Grpc,
        Routing::Ingress {
            profile: Some(Profile { h2c: Some(way), .. }),
            ..
        },
    ) = (o.traffic, &o.routing)
    {
        out.extend(
            way.service
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
    }
    out
}

/// Whether the run's mesh speaks mutual TLS.
pub(crate) fn mesh_tls(o: &RunObjects) -> bool {
    o.mesh.as_ref().is_some_and(|m| m.tls.is_some())
}

/// The annotations of `pool`'s Service and the other objects that make the run's
/// controller speak mutual TLS to the mesh's sidecars (none without it, or for a
/// controller that cannot): [`mesh_way`]'s.
pub fn mesh_rendered(o: &RunObjects, pool: &str) -> Rendered {
    match mesh_way(&o.routing) {
        Some((_, way)) if mesh_tls(o) => (way.render)(o, pool),
        _ => Rendered::default(),
    }
}

/// How the controller behind `routing` reaches a mesh's sidecars, with its name: its
/// Ingress profile's way, or its Gateway implementation's.
pub fn mesh_way(routing: &Routing) -> Option<(&'static str, &'static MeshWay)> {
    match routing {
        Routing::Ingress {
            profile: Some(p), ..
        } => p.mesh.as_ref().map(|w| (p.name, w)),
        Routing::Ingress { profile: None, .. } => None,
        Routing::Gateway { implementation, .. } => implementation
            .mesh
            .as_ref()
            .map(|w| (implementation.name, w)),
    }
}

/// The response headers of a generation of `overlay`: the generation's, then the
/// change's own.
pub(crate) fn response_headers(
    generation: Option<u32>,
    overlay: &Overlay,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(g) = generation {
        out.push((GENERATION_HEADER.to_owned(), g.to_string()));
    }
    if let Some((name, value)) = &overlay.response_header {
        out.push((name.clone(), value.clone()));
    }
    out
}

/// `text` as a regular expression matching itself.
pub(crate) fn regex_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The annotations `KEY-allow-origin`, `-allow-methods`, `-max-age` (after `PREFIX/`)
/// and `enable` set to true: CORS for `origin` as ingress-nginx and HAProxy Ingress name
/// it.
pub(crate) fn cors_annotations(prefix: &str, enable: &str, origin: &str) -> Vec<(String, String)> {
    [
        (enable.to_owned(), "true".to_owned()),
        ("cors-allow-origin".to_owned(), origin.to_owned()),
        ("cors-allow-methods".to_owned(), CORS_METHODS.join(", ")),
        ("cors-max-age".to_owned(), CORS_MAX_AGE_S.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (format!("{prefix}/{k}"), v))
    .collect()
}

/// Of `prefixes` (path prefix, pool), the longest that `path` starts with: where a
/// request for `path` goes.
fn covering<'a>(prefixes: &[(&'a str, &'a str)], path: &str) -> Option<(&'a str, &'a str)> {
    prefixes
        .iter()
        .filter(|(prefix, _)| path.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .copied()
}

/// A run of `routes` (host, path prefix; all to pool `echo`) routed by `routing`, for the
/// tests.
#[cfg(test)]
pub(crate) fn test_objects(routes: &[(&str, &str)], routing: Routing) -> RunObjects {
    RunObjects {
        namespace: "ib-1".into(),
        run_id: "1".into(),
        pool: "echo".into(),
        replicas: 1,
        other_pools: Vec::new(),
        image: "ingressbench".into(),
        backend_args: Vec::new(),
        routes: routes
            .iter()
            .map(|(h, p)| crate::deploy::Route {
                host: (*h).to_owned(),
                prefix: (*p).to_owned(),
                pool: "echo".into(),
            })
            .collect(),
        routing,
        generation: Some(1),
        cors_origins: Vec::new(),
        sysctls: BTreeMap::new(),
        grace_s: 1,
        tls: None,
        mesh: None,
        traffic: Traffic::Http,
    }
}

/// The methods a CORS change allows, and how long a preflight is cached (s).
pub(crate) const CORS_METHODS: [&str; 3] = ["GET", "POST", "OPTIONS"];
pub(crate) const CORS_MAX_AGE_S: u32 = 600;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_goes_to_the_pool_of_the_longest_prefix_that_covers_it() {
        let prefixes = [("/", "web"), ("/api", "api"), ("/api/v2", "v2")];
        assert_eq!(covering(&prefixes, "/api/v2/x"), Some(("/api/v2", "v2")));
        assert_eq!(covering(&prefixes, "/apiary"), Some(("/api", "api")));
        assert_eq!(covering(&prefixes, "/other"), Some(("/", "web")));
        assert_eq!(covering(&prefixes[1..], "/other"), None);
    }

    /// The Services the route objects send to: an Ingress path's `service`, an
    /// HTTPProxy route's `services`, an HTTPRoute rule's `backendRefs`.
    fn backends(objects: &[Value]) -> Vec<String> {
        fn walk(v: &Value, under: bool, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    if under {
                        if let Some(name) = m.get("name").and_then(Value::as_str) {
                            out.push(name.to_owned());
                        }
                    }
                    for (k, v) in m {
                        walk(
                            v,
                            ["service", "services", "backendRefs"].contains(&k.as_str()),
                            out,
                        );
                    }
                }
                Value::Array(a) => a.iter().for_each(|v| walk(v, under, out)),
                _ => {}
            }
        }
        let mut out = Vec::new();
        objects.iter().for_each(|o| walk(o, false, &mut out));
        out
    }

    #[test]
    fn a_pool_change_sends_every_route_to_that_pool_through_every_routing() {
        let parent = GatewayRef {
            name: "gw".into(),
            namespace: "infra".into(),
            listener: Some("web".into()),
            tls_listener: None,
        };
        let routings = std::iter::once(Routing::Gateway {
            parent,
            implementation: gateway::support("gateway.envoyproxy.io/gatewayclass-controller"),
        })
        .chain(std::iter::once(Routing::Ingress {
            class: "any".into(),
            profile: None,
        }))
        .chain(PROFILES.iter().map(|p| Routing::Ingress {
            class: "c".into(),
            profile: Some(p),
        }));
        let green = Overlay {
            response_header: Some(("my-added-header".into(), "added-value".into())),
            pool: Some("green".into()),
            ..Overlay::default()
        };
        for routing in routings {
            let what = format!("{routing:?}");
            let o = test_objects(&[("a.example", "/"), ("a.example", "/api")], routing);
            let before = backends(&render(&o, Some(2), &Overlay::default()));
            assert!(
                !before.is_empty() && before.iter().all(|b| b == "echo"),
                "{what}: {before:?}"
            );
            let after = backends(&render(&o, Some(3), &green));
            assert!(
                !after.is_empty() && after.iter().all(|b| b == "green"),
                "{what}: {after:?}"
            );
        }
    }

    #[test]
    fn what_a_controller_cannot_express_is_named() {
        let change = Overlay {
            response_header: Some(("X-Churn".into(), "on".into())),
            cors_origin: Some("https://app.example".into()),
            rewrite: Some(("/old".into(), "/new".into())),
            pool: None,
        };
        assert!(Can::ALL.missing(&change).is_empty());
        let no_cors = Can {
            cors: false,
            ..Can::ALL
        };
        assert_eq!(no_cors.missing(&change), vec!["CORS"]);
        assert!(no_cors.missing(&Overlay::default()).is_empty());
        let none = Can {
            header: false,
            rewrite: false,
            cors: false,
        };
        assert_eq!(none.missing(&change).len(), 3);
        // Every profile is found by its controller, and no two share one.
        for p in PROFILES {
            assert_eq!(profile(p.controller).map(|q| q.name), Some(p.name));
        }
        assert!(profile("example.com/unknown").is_none());
    }
}
