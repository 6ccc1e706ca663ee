//! Routes through the Gateway API: an HTTPRoute per host of the run (a GRPCRoute for a
//! gRPC load), attached to the target's Gateway. A route change becomes the route's own filters, as the API defines
//! them: `ResponseHeaderModifier` (the change's header and the generation every answer
//! carries), `URLRewrite` with `ReplacePrefixMatch` (a rule of its own for the rewritten
//! prefix), and CORS the way the implementation takes it ([`support`]): the API's `CORS`
//! filter, or (Traefik) an `ExtensionRef` filter naming one of its Middlewares. The
//! controller reports each route's `Accepted` and `ResolvedRefs` conditions in its
//! status, for the generation it saw: [`verdict`] reads them.

use std::collections::BTreeMap;

use ingressbench_lab::model::Overlay;
use serde_json::{json, Value};

use super::{Can, MeshWay, Rendered, CORS_MAX_AGE_S, CORS_METHODS};
use crate::deploy::{RunObjects, Traffic};
use crate::file::GatewayRef;

/// The Gateway API's group.
pub const GROUP: &str = "gateway.networking.k8s.io";
/// The version of it the tool writes.
pub const API_VERSION: &str = "gateway.networking.k8s.io/v1";
/// The annotation that carries a route's generation where a header cannot (a GRPCRoute
/// through Traefik).
pub const GENERATION_ANNOTATION: &str = "ingressbench.dev/generation";

/// A Gateway API implementation: what of a route change it expresses, and how.
#[derive(Debug)]
pub struct Implementation {
    /// Its GatewayClass `controllerName`.
    pub controller: &'static str,
    /// Its name in messages.
    pub name: &'static str,
    /// What it expresses.
    pub can: Can,
    /// How it takes CORS.
    pub cors: CorsBy,
    /// Whether its GRPCRoutes take a `ResponseHeaderModifier` filter (what a route change
    /// through a gRPC load needs).
    pub grpc_headers: bool,
    /// How it reaches a mesh's sidecars over mutual TLS, if it can: the API's way is
    /// [`BACKEND_TLS`].
    pub mesh: Option<MeshWay>,
}

/// How an implementation takes CORS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CorsBy {
    /// The API's own `CORS` filter.
    Filter,
    /// An `ExtensionRef` filter naming a Traefik Middleware that sets the CORS headers.
    TraefikMiddleware,
}

/// The implementations the tool knows, each measured here. Traefik 3.7 reports a route
/// with the API's `CORS` filter `Accepted`, then answers every request of it with 500
/// ("unsupported filter CORS" in its log); its documented way is a Middleware named by an
/// `ExtensionRef` filter, which is what the tool makes. Contour 1.33 reports such a route
/// `Accepted=False` (`UnsupportedValue`: "only RequestHeaderModifier,
/// ResponseHeaderModifier, RequestRedirect, RequestMirror and URLRewrite are supported").
/// Traefik 3.7 leaves a GRPCRoute with a `ResponseHeaderModifier` unserved (404 for every
/// call, "unsupported filter ResponseHeaderModifier" in its log), its status silent.
const KNOWN: &[Implementation] = &[
    Implementation {
        controller: "traefik.io/gateway-controller",
        name: "Traefik",
        can: Can::ALL,
        cors: CorsBy::TraefikMiddleware,
        grpc_headers: false,
        mesh: None,
    },
    Implementation {
        controller: "projectcontour.io/gateway-controller",
        name: "Contour",
        can: Can {
            header: true,
            rewrite: true,
            cors: false,
        },
        cors: CorsBy::Filter,
        grpc_headers: true,
        mesh: None,
    },
    Implementation {
        controller: "gateway.envoyproxy.io/gatewayclass-controller",
        name: "Envoy Gateway",
        can: Can::ALL,
        cors: CorsBy::Filter,
        grpc_headers: true,
        mesh: Some(BACKEND_TLS),
    },
];

/// An implementation not in [`KNOWN`]: the Extended features the API names for header
/// changes and rewrites, and CORS through the API's filter, which it may refuse in the
/// route's status (then the change fails the cell, naming the condition).
const OTHER: Implementation = Implementation {
    controller: "",
    name: "this Gateway API implementation",
    can: Can::ALL,
    cors: CorsBy::Filter,
    grpc_headers: true,
    mesh: None,
};

/// The implementations that reach a mesh's sidecars ([`Implementation::mesh`]).
pub fn meshable() -> impl Iterator<Item = &'static str> {
    KNOWN.iter().filter(|i| i.mesh.is_some()).map(|i| i.name)
}

/// The Gateway API's way to a mesh's sidecars: TLS to a Service that a BackendTLSPolicy
/// names ([`backend_tls_policy`]), presenting the client certificate its Gateway names
/// (`spec.tls.backend.clientCertificateRef`, in the API since v1.4).
const BACKEND_TLS: MeshWay = MeshWay {
    render: |o, pool| Rendered {
        annotations: BTreeMap::new(),
        objects: vec![backend_tls_policy(o, pool)],
    },
    own_client_certificate: Some("its Gateway (`spec.tls.backend.clientCertificateRef`)"),
};

/// A pool's BackendTLSPolicy in a mesh with mutual TLS: TLS to its Service's sidecars,
/// their certificate checked for the Service's name (also the SNI) against the mesh's CA,
/// the `ca.crt` of the run's client Secret (a Secret, which Envoy Gateway takes beside the
/// API's ConfigMap). The client certificate presented is the Gateway's.
fn backend_tls_policy(o: &RunObjects, pool: &str) -> Value {
    json!({
        "apiVersion": API_VERSION, "kind": "BackendTLSPolicy",
        "metadata": { "name": format!("ib-mesh-{pool}") },
        "spec": {
            "targetRefs": [{ "group": "", "kind": "Service", "name": pool }],
            "validation": {
                "caCertificateRefs": [{ "group": "", "kind": "Secret", "name": crate::deploy::mesh::CLIENT_SECRET }],
                "hostname": crate::deploy::mesh::service_name(o, pool),
            },
        },
    })
}

/// The implementation behind GatewayClass `controllerName` `controller`.
pub fn support(controller: &str) -> &'static Implementation {
    KNOWN
        .iter()
        .find(|i| i.controller == controller)
        .unwrap_or(&OTHER)
}

/// The run's routes, one HTTPRoute per host (`*`: a route without hostnames), named
/// after the pool (`echo`, or `echo-1`, `echo-2`, … with several hosts).
pub fn route_names(o: &RunObjects) -> Vec<String> {
    let hosts = by_host(o);
    if hosts.len() == 1 {
        return vec![o.pool.clone()];
    }
    (1..=hosts.len())
        .map(|i| format!("{}-{i}", o.pool))
        .collect()
}

/// Each host's path prefixes, each with its pool.
fn by_host(o: &RunObjects) -> BTreeMap<&str, Vec<(&str, &str)>> {
    let mut hosts: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for r in &o.routes {
        hosts.entry(&r.host).or_default().push((&r.prefix, &r.pool));
    }
    hosts
}

/// The HTTPRoutes of generation `generation` of `overlay` (none: no generation header).
pub fn httproutes(
    o: &RunObjects,
    parent: &GatewayRef,
    implementation: &Implementation,
    generation: Option<u32>,
    overlay: &Overlay,
) -> Vec<Value> {
    let mut parent_ref = json!({ "group": GROUP, "kind": "Gateway", "name": parent.name, "namespace": parent.namespace });
    if let Some(listener) = &parent.listener {
        parent_ref["sectionName"] = json!(listener);
    }
    let mut filters = Vec::new();
    let headers = super::response_headers(generation, overlay);
    if !headers.is_empty() {
        let set: Vec<Value> = headers
            .iter()
            .map(|(name, value)| json!({ "name": name, "value": value }))
            .collect();
        filters.push(
            json!({ "type": "ResponseHeaderModifier", "responseHeaderModifier": { "set": set } }),
        );
    }
    // Every CORS Middleware the run will name, with the first routes already.
    let extra = match implementation.cors {
        CorsBy::TraefikMiddleware => super::traefik::cors_middlewares(&o.cors_origins),
        CorsBy::Filter => Vec::new(),
    };
    if let Some(origin) = &overlay.cors_origin {
        filters.push(match implementation.cors {
            CorsBy::Filter => json!({ "type": "CORS", "cors": {
                "allowOrigins": [origin], "allowMethods": CORS_METHODS, "maxAge": CORS_MAX_AGE_S } }),
            CorsBy::TraefikMiddleware => super::traefik::cors_filter(&o.cors_origins, origin),
        });
    }
    if o.traffic == Traffic::Grpc {
        // An implementation that leaves a GRPCRoute with a ResponseHeaderModifier unserved
        // gets the generation as an annotation: a gRPC load reads no header, and the
        // route is still applied again (a reload) for its controller to take. A header
        // change through it is refused before anything is made (`refuse_grpc`).
        if !implementation.grpc_headers {
            let annotations = generation.map(|g| json!({ GENERATION_ANNOTATION: g.to_string() }));
            return grpcroutes(o, parent_ref, Vec::new(), annotations);
        }
        return grpcroutes(o, parent_ref, filters, None);
    }
    let rule = |prefix: &str, pool: &str, extra: Option<Value>| {
        let mut f = filters.clone();
        f.extend(extra);
        json!({ "matches": [{ "path": { "type": "PathPrefix", "value": prefix } }],
                "filters": f, "backendRefs": [{ "name": pool, "port": 80 }] })
    };
    let routes = by_host(o)
        .into_iter()
        .zip(route_names(o))
        .map(|((host, prefixes), name)| {
            let mut rules: Vec<Value> = prefixes
                .iter()
                .map(|(prefix, pool)| rule(prefix, pool, None))
                .collect();
            // The rewritten prefix gets a rule of its own, under a route that covers it,
            // to the pool of the longest prefix that covers it.
            if let Some((from, to)) = &overlay.rewrite {
                if let Some((_, pool)) = super::covering(&prefixes, from) {
                    rules.push(rule(
                        from,
                        pool,
                        Some(json!({ "type": "URLRewrite", "urlRewrite": { "path": {
                            "type": "ReplacePrefixMatch", "replacePrefixMatch": to } } })),
                    ));
                }
            }
            let mut spec = json!({ "parentRefs": [parent_ref], "rules": rules });
            if host != "*" {
                spec["hostnames"] = json!([host]);
            }
            json!({ "apiVersion": API_VERSION, "kind": "HTTPRoute",
                    "metadata": { "name": name }, "spec": spec })
        });
    // What the routes name first, so that no route names what is not there yet.
    extra.into_iter().chain(routes).collect()
}

/// The run's routes for gRPC: a GRPCRoute per host, its one rule (matching every
/// method) to the pool of the host's routes (one pool a host, checked before), with the
/// response headers of `filters` (a GRPCRoute has no rewrite or CORS filter).
fn grpcroutes(
    o: &RunObjects,
    parent_ref: Value,
    filters: Vec<Value>,
    annotations: Option<Value>,
) -> Vec<Value> {
    by_host(o)
        .into_iter()
        .zip(route_names(o))
        .map(|((host, prefixes), name)| {
            let pool = prefixes.first().map_or(o.pool.as_str(), |(_, pool)| pool);
            let rule = json!({ "filters": filters, "backendRefs": [{ "name": pool, "port": 80 }] });
            let mut spec = json!({ "parentRefs": [parent_ref], "rules": [rule] });
            if host != "*" {
                spec["hostnames"] = json!([host]);
            }
            let mut metadata = json!({ "name": name });
            if let Some(a) = &annotations {
                metadata["annotations"] = a.clone();
            }
            json!({ "apiVersion": API_VERSION, "kind": "GRPCRoute",
                    "metadata": metadata, "spec": spec })
        })
        .collect()
}

/// Whether the run's answers carry its routes' generation in a header: not through a
/// GRPCRoute of an implementation that takes no header filter on one (the annotation
/// carries it there).
pub fn generation_answered(o: &RunObjects) -> bool {
    match &o.routing {
        super::Routing::Gateway { implementation, .. } => {
            o.traffic != Traffic::Grpc || implementation.grpc_headers
        }
        super::Routing::Ingress { .. } => true,
    }
}

/// The kind of the run's routes: GRPCRoute for a gRPC load, HTTPRoute otherwise.
pub fn route_kind(o: &RunObjects) -> &'static str {
    match o.traffic {
        Traffic::Grpc => "GRPCRoute",
        Traffic::Http => "HTTPRoute",
    }
}

/// The `controllerName` of the GatewayClass of `parent`, read through the API: an error
/// names what is missing (the Gateway, with the ones there are; its listener; its class)
/// and the fix.
pub async fn controller_of(client: &kube::Client, parent: &GatewayRef) -> Result<String, String> {
    let get = |kind: &'static str, namespace: Option<&str>, name: &str| {
        let (namespace, name) = (namespace.map(str::to_owned), name.to_owned());
        async move {
            crate::api::get(client, API_VERSION, kind, namespace.as_deref(), &name)
                .await
                .map_err(|e| e.to_string())
        }
    };
    let Some(gateway) = get("Gateway", Some(&parent.namespace), &parent.name).await? else {
        return Err(format!(
            "no Gateway {}/{}: install the implementation and its Gateway, or correct the target's `gateway:`",
            parent.namespace, parent.name
        ));
    };
    let listeners: Vec<&str> = gateway["spec"]["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["name"].as_str())
        .collect();
    for (key, listener) in [
        ("listener", &parent.listener),
        ("tls_listener", &parent.tls_listener),
    ] {
        if let Some(l) = listener.as_deref().filter(|l| !listeners.contains(l)) {
            return Err(format!(
                "Gateway {}/{} has no listener `{l}` (it has: {}); correct the target's `gateway.{key}`",
                parent.namespace,
                parent.name,
                listeners.join(", ")
            ));
        }
    }
    let class = gateway["spec"]["gatewayClassName"]
        .as_str()
        .unwrap_or_default();
    match get("GatewayClass", None, class).await? {
        Some(c) => Ok(c["spec"]["controllerName"]
            .as_str()
            .unwrap_or_default()
            .to_owned()),
        None => Err(format!(
            "Gateway {}/{} names GatewayClass `{class}`, which does not exist",
            parent.namespace, parent.name
        )),
    }
}

/// What a route's status says about it on `parent`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not reported on yet for its current generation: why, in words.
    Waiting(String),
    /// `Accepted` and `ResolvedRefs` true for its current generation.
    Ready,
    /// A condition false for its current generation: which, with reason and message.
    Refused(String),
}

/// Reads an HTTPRoute as the API returns it: its `metadata.generation` and the
/// conditions its controller reported for `parent`.
pub fn verdict(route: &Value, parent: &GatewayRef) -> Verdict {
    let generation = route["metadata"]["generation"].as_i64().unwrap_or(0);
    let ours = route["status"]["parents"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| {
            let r = &p["parentRef"];
            r["name"] == parent.name.as_str()
                && r["namespace"] == parent.namespace.as_str()
                && parent
                    .listener
                    .as_deref()
                    .is_none_or(|l| r["sectionName"] == l)
        });
    let Some(ours) = ours else {
        return Verdict::Waiting(format!(
            "no controller has reported on it for Gateway {parent} yet"
        ));
    };
    let condition = |kind: &str| {
        ours["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == kind)
            .cloned()
    };
    let mut waiting = Vec::new();
    for kind in ["Accepted", "ResolvedRefs"] {
        let Some(c) = condition(kind) else {
            waiting.push(format!("no {kind} condition"));
            continue;
        };
        let seen = c["observedGeneration"].as_i64().unwrap_or(0);
        if seen < generation {
            waiting.push(format!(
                "{kind} is for generation {seen}, the route is at {generation}"
            ));
        } else if c["status"] != "True" {
            let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            let message = text("message");
            return Verdict::Refused(format!(
                "{kind}={} ({}{})",
                text("status"),
                text("reason"),
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {message}")
                }
            ));
        }
    }
    if waiting.is_empty() {
        Verdict::Ready
    } else {
        Verdict::Waiting(waiting.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::Routing;

    fn objects(routes: &[(&str, &str)]) -> RunObjects {
        let parent = GatewayRef {
            name: "gw".into(),
            namespace: "infra".into(),
            listener: Some("web".into()),
            tls_listener: None,
        };
        let routing = Routing::Gateway {
            parent,
            implementation: &OTHER,
        };
        RunObjects {
            cors_origins: vec!["https://app.example".into()],
            ..crate::routes::test_objects(routes, routing)
        }
    }

    #[test]
    fn a_route_per_host_with_the_change_as_filters_and_the_rewrite_as_a_rule() {
        let o = objects(&[
            ("a.example", "/"),
            ("b.example", "/api"),
            ("a.example", "/x"),
        ]);
        let Routing::Gateway { parent, .. } = &o.routing else {
            unreachable!()
        };
        let change = Overlay {
            response_header: Some(("X-Churn".into(), "on".into())),
            cors_origin: Some("https://app.example".into()),
            rewrite: Some(("/old".into(), "/new".into())),
            pool: None,
        };
        let routes = httproutes(&o, parent, &OTHER, Some(3), &change);
        assert_eq!(routes.len(), 2);
        assert_eq!(routes[0]["metadata"]["name"], "echo-1");
        assert_eq!(routes[0]["spec"]["hostnames"], json!(["a.example"]));
        assert_eq!(routes[0]["spec"]["parentRefs"][0]["sectionName"], "web");
        let rules = routes[0]["spec"]["rules"].as_array().unwrap();
        // `/`, `/x`, then `/old` (under `/`) rewritten; b.example's `/api` does not cover it.
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[2]["matches"][0]["path"]["value"], "/old");
        let filters = rules[2]["filters"].as_array().unwrap();
        assert_eq!(
            filters[0]["responseHeaderModifier"]["set"],
            json!([{ "name": "x-ingressbench-generation", "value": "3" }, { "name": "X-Churn", "value": "on" }])
        );
        assert_eq!(
            filters[1]["cors"]["allowOrigins"],
            json!(["https://app.example"])
        );
        assert_eq!(
            filters[2]["urlRewrite"]["path"]["replacePrefixMatch"],
            "/new"
        );
        assert_eq!(routes[1]["spec"]["rules"].as_array().unwrap().len(), 1);
        // Without route changes: no filters; `*` is a route without hostnames.
        let plain = httproutes(
            &objects(&[("*", "/")]),
            parent,
            &OTHER,
            None,
            &Overlay::default(),
        );
        assert_eq!(plain[0]["metadata"]["name"], "echo");
        assert!(plain[0]["spec"].get("hostnames").is_none());
        assert_eq!(plain[0]["spec"]["rules"][0]["filters"], json!([]));
        // Traefik takes CORS as a Middleware the route names.
        let traefik = support("traefik.io/gateway-controller");
        let with_cors = httproutes(&o, parent, traefik, Some(3), &change);
        assert_eq!(with_cors[0]["kind"], "Middleware");
        assert_eq!(with_cors.len(), 3);
        // Made with the first routes, before any change names it.
        let first = httproutes(&o, parent, traefik, Some(1), &Overlay::default());
        assert_eq!(first[0], with_cors[0]);
        let filters = with_cors[1]["spec"]["rules"][0]["filters"]
            .as_array()
            .unwrap();
        assert_eq!(filters[1]["type"], "ExtensionRef");
        assert_eq!(
            filters[1]["extensionRef"]["name"],
            with_cors[0]["metadata"]["name"]
        );
        assert_eq!(support("example.com/other").cors, CorsBy::Filter);
        // Each rule to its route's pool; the rewritten prefix to the pool of the longest
        // prefix that covers it.
        let mut two = objects(&[("a.example", "/"), ("a.example", "/old")]);
        two.routes[1].pool = "legacy".into();
        let routes = httproutes(&two, parent, &OTHER, Some(3), &change);
        let pools: Vec<&Value> = routes[0]["spec"]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| &r["backendRefs"][0]["name"])
            .collect();
        assert_eq!(pools, [&json!("echo"), &json!("legacy"), &json!("legacy")]);
        assert!(!support("projectcontour.io/gateway-controller").can.cors);
    }

    #[test]
    fn a_grpc_load_gets_a_grpcroute_per_host_to_its_pool_with_the_headers() {
        let mut o = objects(&[("a.example", "/"), ("b.example", "/")]);
        o.traffic = Traffic::Grpc;
        o.routes[1].pool = "other".into();
        let Routing::Gateway { parent, .. } = &o.routing else {
            unreachable!()
        };
        let change = Overlay {
            response_header: Some(("X-Churn".into(), "on".into())),
            ..Overlay::default()
        };
        let routes = httproutes(&o, parent, &OTHER, Some(2), &change);
        assert_eq!(route_kind(&o), "GRPCRoute");
        assert_eq!(routes.len(), 2);
        for (route, (host, pool)) in routes
            .iter()
            .zip([("a.example", "echo"), ("b.example", "other")])
        {
            assert_eq!(route["kind"], "GRPCRoute");
            assert_eq!(route["spec"]["hostnames"], json!([host]));
            let rules = route["spec"]["rules"].as_array().unwrap();
            assert_eq!(rules.len(), 1);
            // Every method: no matches.
            assert!(rules[0].get("matches").is_none());
            assert_eq!(rules[0]["backendRefs"][0]["name"], pool);
            assert_eq!(
                rules[0]["filters"][0]["responseHeaderModifier"]["set"][0],
                json!({ "name": "x-ingressbench-generation", "value": "2" })
            );
        }
        // Through Traefik, which leaves a GRPCRoute with the filter unserved, the
        // generation is an annotation and the rule has no filter.
        let traefik = support("traefik.io/gateway-controller");
        let routes = httproutes(&o, parent, traefik, Some(3), &Overlay::default());
        for route in &routes {
            assert_eq!(route["spec"]["rules"][0]["filters"], json!([]), "{route}");
            assert_eq!(
                route["metadata"]["annotations"][GENERATION_ANNOTATION], "3",
                "{route}"
            );
        }
        o.traffic = Traffic::Http;
        assert_eq!(route_kind(&o), "HTTPRoute");
    }

    #[test]
    fn the_status_says_ready_refused_or_what_is_awaited() {
        let parent = GatewayRef {
            name: "gw".into(),
            namespace: "infra".into(),
            listener: None,
            tls_listener: None,
        };
        let route = |generation: i64, conditions: Value| {
            json!({ "metadata": { "generation": generation }, "status": { "parents": [
                { "parentRef": { "name": "gw", "namespace": "infra" }, "conditions": conditions } ] } })
        };
        let ok = |kind: &str, g: i64| json!({ "type": kind, "status": "True", "reason": kind, "observedGeneration": g });
        assert_eq!(
            verdict(
                &route(2, json!([ok("Accepted", 2), ok("ResolvedRefs", 2)])),
                &parent
            ),
            Verdict::Ready
        );
        assert!(matches!(
            verdict(&route(3, json!([ok("Accepted", 2), ok("ResolvedRefs", 2)])), &parent),
            Verdict::Waiting(w) if w.contains("generation 2, the route is at 3")
        ));
        let refused = json!([
            { "type": "Accepted", "status": "False", "reason": "NoMatchingParent", "message": "", "observedGeneration": 1 },
            ok("ResolvedRefs", 1)
        ]);
        assert_eq!(
            verdict(&route(1, refused), &parent),
            Verdict::Refused("Accepted=False (NoMatchingParent)".into())
        );
        assert!(matches!(
            verdict(&json!({ "metadata": { "generation": 1 } }), &parent),
            Verdict::Waiting(w) if w.contains("no controller has reported")
        ));
    }
}
