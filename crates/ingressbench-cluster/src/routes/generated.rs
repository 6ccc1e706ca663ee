//! Generated routes in a cluster (route scale): one object per route, as users have them
//! (one per service, per tenant): an Ingress of the target's class with one rule, or an
//! HTTPRoute attached to the target's Gateway with one hostname, named `route-N` after
//! the route's number and labelled [`GENERATED_LABEL`] so that all of them go in one call
//! per kind. Both go over plain HTTP: the route probe asks them there (an HTTPRoute
//! attaches to the Gateway's plain listener), while the load may stay on TLS.
//!
//! A changed route (`change_routes`) answers its revision in
//! [`ROUTE_REVISION_HEADER`], by the controller's own means: the HTTPRoute's
//! `ResponseHeaderModifier` filter, or for Traefik's Ingress a headers Middleware per
//! revision named in the Ingress's `router.middlewares` annotation. Contour and HAProxy
//! Ingress cannot set a header on one Ingress alone (Contour only in its HTTPProxy,
//! HAProxy Ingress per backend, which every route of a pool shares): [`revisions`] says
//! so before anything is made.

use ingressbench_lab::model::{generated_index, Route, ROUTE_REVISION_HEADER};
use serde_json::{json, Value};

use super::{gateway, Routing};
use crate::deploy::RunObjects;
use crate::file::GatewayRef;

/// The label every generated route object carries (value `true`).
pub const GENERATED_LABEL: &str = "ingressbench.dev/generated";

/// The kinds generated route objects can be, as `(apiVersion, kind)`: what is deleted by
/// [`GENERATED_LABEL`] (the kinds a cluster does not serve are skipped).
pub const KINDS: &[(&str, &str)] = &[
    ("networking.k8s.io/v1", "Ingress"),
    (gateway::API_VERSION, "HTTPRoute"),
    ("traefik.io/v1alpha1", "Middleware"),
];

/// Whether routes routed by `routing` can answer a revision; the reason when not.
pub fn revisions(routing: &Routing) -> Result<(), String> {
    match routing {
        Routing::Gateway { implementation, .. } if implementation.can.header => Ok(()),
        Routing::Gateway { implementation, .. } => Err(format!(
            "{} sets no response header on an HTTPRoute",
            implementation.name
        )),
        Routing::Ingress {
            profile: Some(p), ..
        } if p.controller == super::traefik::CONTROLLER => Ok(()),
        Routing::Ingress {
            profile: Some(p), ..
        } => Err(format!(
            "{} sets response headers through {}, which cannot single out one Ingress of many to the same Service; route it through a Gateway (HTTPRoutes) if it serves one",
            p.name, p.means
        )),
        Routing::Ingress { class, .. } => Err(format!(
            "the tool knows no way to set a response header on one Ingress of class `{class}`"
        )),
    }
}

/// The object name of generated route `route` (`route-N`).
pub fn name(route: &Route) -> String {
    match generated_index(route) {
        Some(i) => format!("route-{i}"),
        None => format!("route-{}", route.host.replace('.', "-")),
    }
}

/// The objects to apply for `routes` (new or changed), in two waves: what the routes
/// name (a Traefik Middleware per revision), then one object per route. `plain` is the
/// Gateway's plain HTTP listener the HTTPRoutes attach to (the run's own routes may be on
/// its TLS one).
pub fn objects(
    o: &RunObjects,
    plain: Option<&GatewayRef>,
    routes: &[Route],
) -> (Vec<Value>, Vec<Value>) {
    let mut first: Vec<Value> = Vec::new();
    let mut revisions: Vec<u32> = routes
        .iter()
        .map(|r| r.revision)
        .filter(|r| *r > 0)
        .collect();
    revisions.sort_unstable();
    revisions.dedup();
    let traefik_ingress = matches!(&o.routing, Routing::Ingress { profile: Some(p), .. } if p.controller == super::traefik::CONTROLLER);
    if traefik_ingress {
        first.extend(revisions.iter().map(|r| {
            super::traefik::middleware(
                &middleware_name(*r),
                json!({ "headers": { "customResponseHeaders": { ROUTE_REVISION_HEADER: r.to_string() } } }),
            )
        }));
    }
    let then = routes.iter().map(|r| object(o, plain, r)).collect();
    (first, then)
}

/// The Traefik Middleware that answers revision `revision`.
fn middleware_name(revision: u32) -> String {
    format!("ib-revision-{revision}")
}

/// Route `route`'s object.
fn object(o: &RunObjects, plain: Option<&GatewayRef>, route: &Route) -> Value {
    let mut metadata = json!({ "name": name(route), "labels": { GENERATED_LABEL: "true" } });
    match &o.routing {
        Routing::Gateway { parent, .. } => {
            let parent = plain.unwrap_or(parent);
            let mut parent_ref = json!({ "group": gateway::GROUP, "kind": "Gateway", "name": parent.name, "namespace": parent.namespace });
            if let Some(listener) = &parent.listener {
                parent_ref["sectionName"] = json!(listener);
            }
            let mut rule = json!({
                "matches": [{ "path": { "type": "PathPrefix", "value": route.path_prefix } }],
                "backendRefs": [{ "name": route.pool, "port": 80 }],
            });
            if route.revision > 0 {
                rule["filters"] = json!([{ "type": "ResponseHeaderModifier", "responseHeaderModifier": {
                    "set": [{ "name": ROUTE_REVISION_HEADER, "value": route.revision.to_string() }] } }]);
            }
            json!({ "apiVersion": gateway::API_VERSION, "kind": "HTTPRoute", "metadata": metadata,
                    "spec": { "parentRefs": [parent_ref], "hostnames": [route.host], "rules": [rule] } })
        }
        Routing::Ingress { class, .. } => {
            if route.revision > 0 {
                metadata["annotations"] = json!({
                    "traefik.ingress.kubernetes.io/router.middlewares":
                        format!("{}-{}@kubernetescrd", o.namespace, middleware_name(route.revision)),
                });
            }
            json!({ "apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": metadata,
                    "spec": { "ingressClassName": class, "rules": [{ "host": route.host, "http": { "paths": [{
                        "path": route.path_prefix, "pathType": "Prefix",
                        "backend": { "service": { "name": route.pool, "port": { "number": 80 } } } }] } }] } })
        }
    }
}

/// `(apiVersion, kind, name)` of route `route`'s object.
pub fn object_ref(o: &RunObjects, route: &Route) -> (&'static str, &'static str, String) {
    let (api_version, kind) = match o.routing {
        Routing::Gateway { .. } => KINDS[1],
        Routing::Ingress { .. } => KINDS[0],
    };
    (api_version, kind, name(route))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingressbench_lab::model::generated_route;

    fn route(i: usize, revision: u32) -> Route {
        Route {
            revision,
            ..generated_route(i, &["echo".to_owned()])
        }
    }

    #[test]
    fn an_ingress_per_route_and_a_middleware_per_revision_for_traefik() {
        let o = super::super::test_objects(
            &[("app.test", "/")],
            Routing::Ingress {
                class: "traefik".into(),
                profile: Some(&super::super::traefik::PROFILE),
            },
        );
        let (first, then) = objects(&o, None, &[route(7, 0), route(8, 3), route(9, 3)]);
        assert_eq!(first.len(), 1, "one Middleware for revision 3: {first:?}");
        assert_eq!(first[0]["metadata"]["name"], "ib-revision-3");
        assert_eq!(
            first[0]["spec"]["headers"]["customResponseHeaders"][ROUTE_REVISION_HEADER],
            "3"
        );
        assert_eq!(then.len(), 3);
        assert_eq!(then[0]["metadata"]["name"], "route-7");
        assert_eq!(then[0]["metadata"]["labels"][GENERATED_LABEL], "true");
        assert_eq!(then[0]["spec"]["ingressClassName"], "traefik");
        assert_eq!(then[0]["spec"]["rules"][0]["host"], "r7.routes.test");
        assert!(then[0]["metadata"]["annotations"].is_null());
        assert_eq!(
            then[1]["metadata"]["annotations"]["traefik.ingress.kubernetes.io/router.middlewares"],
            "ib-1-ib-revision-3@kubernetescrd"
        );
        assert_eq!(
            object_ref(&o, &route(7, 0)),
            ("networking.k8s.io/v1", "Ingress", "route-7".to_owned())
        );
        assert!(revisions(&o.routing).is_ok());
        let contour = Routing::Ingress {
            class: "contour".into(),
            profile: Some(&super::super::contour::PROFILE),
        };
        assert!(revisions(&contour).unwrap_err().contains("Contour"));
    }

    #[test]
    fn an_httproute_per_route_on_the_plain_listener_with_its_revision_as_a_filter() {
        let parent = GatewayRef {
            name: "gw".into(),
            namespace: "infra".into(),
            listener: Some("web".into()),
            tls_listener: Some("websecure".into()),
        };
        let o = super::super::test_objects(
            &[("app.test", "/")],
            Routing::Gateway {
                parent: parent.for_traffic(true),
                implementation: gateway::support("traefik.io/gateway-controller"),
            },
        );
        let (first, then) = objects(&o, Some(&parent), &[route(0, 0), route(1, 2)]);
        assert!(first.is_empty());
        assert_eq!(then[0]["kind"], "HTTPRoute");
        assert_eq!(then[0]["spec"]["hostnames"][0], "r0.routes.test");
        assert_eq!(then[0]["spec"]["parentRefs"][0]["sectionName"], "web");
        assert!(then[0]["spec"]["rules"][0]["filters"].is_null());
        let set = &then[1]["spec"]["rules"][0]["filters"][0]["responseHeaderModifier"]["set"][0];
        assert_eq!(set["name"], ROUTE_REVISION_HEADER);
        assert_eq!(set["value"], "2");
    }
}
