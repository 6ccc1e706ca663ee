//! Route changes through Contour, as its users make them: its own HTTPProxy, which has
//! what its Ingress annotations lack (response headers, `corsPolicy`, path rewrites).
//! A cell with route changes gets HTTPProxies instead of an Ingress (one per host; a
//! route for any host, `*`, takes the scenario's default name, `app.test`, as its
//! `fqdn`: an HTTPProxy needs one); a cell without gets the Ingress, as any class. gRPC
//! needs `projectcontour.io/upstream-protocol.h2c` on the Service either way.

use std::collections::BTreeMap;

use ingressbench_lab::certs::DEFAULT_TLS_NAME;
use ingressbench_lab::model::Overlay;
use serde_json::{json, Value};

use super::{Can, H2cWay, MeshWay, Profile, Rendered, CORS_MAX_AGE_S, CORS_METHODS};
use crate::deploy::RunObjects;

/// The `spec.controller` of Contour's IngressClass.
pub const CONTROLLER: &str = "projectcontour.io/ingress-controller";

/// Contour's row of the table: everything, through HTTPProxies.
pub const PROFILE: Profile = Profile {
    name: "Contour",
    controller: CONTROLLER,
    means: "HTTPProxies (instead of the Ingress)",
    can: Can::ALL,
    render: |_, _, _| Rendered::default(),
    routes: Some(httpproxies),
    mesh: Some(MeshWay {
        render: |_, _| Rendered::default(),
        own_client_certificate: Some("its own configuration (`tls.envoy-client-certificate`)"),
    }),
    h2c: Some(H2cWay {
        service: &[("projectcontour.io/upstream-protocol.h2c", "80")],
        ingress: &[],
    }),
};

/// The run's HTTPProxies of class `class` for generation `generation` of `overlay`. With
/// a mesh over mutual TLS, each route's service is reached over TLS and its certificate
/// checked against the mesh's CA for the Service's name (`upstreamValidation`); the
/// client certificate Envoy presents is Contour's own configuration
/// (`tls.envoy-client-certificate`). gRPC's h2c to the backends is the Service's
/// annotation, which Contour reads for HTTPProxies as for Ingresses.
fn httpproxies(
    o: &RunObjects,
    class: &str,
    generation: Option<u32>,
    overlay: &Overlay,
) -> Vec<Value> {
    let mut hosts: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for r in &o.routes {
        let host = if r.host == "*" {
            DEFAULT_TLS_NAME
        } else {
            &r.host
        };
        hosts.entry(host).or_default().push((&r.prefix, &r.pool));
    }
    let set: Vec<Value> = super::response_headers(generation, overlay)
        .into_iter()
        .map(|(name, value)| json!({ "name": name, "value": value }))
        .collect();
    let route = |prefix: &str, pool: &str, rewrite: Option<&str>| {
        let mut service = json!({ "name": pool, "port": 80 });
        if super::mesh_tls(o) {
            service["protocol"] = json!("tls");
            service["validation"] = json!({
                "caSecret": crate::deploy::mesh::CLIENT_SECRET,
                "subjectName": crate::deploy::mesh::service_name(o, pool),
            });
        }
        let mut r = json!({
            "conditions": [{ "prefix": prefix }],
            "services": [service],
            "responseHeadersPolicy": { "set": set },
        });
        if let Some(to) = rewrite {
            r["pathRewritePolicy"] =
                json!({ "replacePrefix": [{ "prefix": prefix, "replacement": to }] });
        }
        r
    };
    let several = hosts.len() > 1;
    hosts
        .into_iter()
        .enumerate()
        .map(|(i, (fqdn, prefixes))| {
            let mut routes: Vec<Value> = prefixes
                .iter()
                .map(|(prefix, pool)| route(prefix, pool, None))
                .collect();
            // The rewritten prefix, to the pool of the longest prefix that covers it.
            if let Some((from, to)) = &overlay.rewrite {
                if let Some((_, pool)) = super::covering(&prefixes, from) {
                    routes.push(route(from, pool, Some(to)));
                }
            }
            let mut virtualhost = json!({ "fqdn": fqdn });
            if o.tls.is_some() {
                virtualhost["tls"] = json!({ "secretName": crate::deploy::tls_secret_name(o) });
            }
            if let Some(origin) = &overlay.cors_origin {
                virtualhost["corsPolicy"] = json!({ "allowOrigin": [origin],
                    "allowMethods": CORS_METHODS, "maxAge": format!("{CORS_MAX_AGE_S}s") });
            }
            let name = if several {
                format!("{}-{}", o.pool, i + 1)
            } else {
                o.pool.clone()
            };
            json!({ "apiVersion": "projectcontour.io/v1", "kind": "HTTPProxy",
                "metadata": { "name": name },
                "spec": { "ingressClassName": class, "virtualhost": virtualhost, "routes": routes } })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::Routing;

    #[test]
    fn a_change_becomes_the_proxys_headers_cors_and_a_rewritten_route() {
        let routing = Routing::Ingress {
            class: "contour".into(),
            profile: Some(&PROFILE),
        };
        let o = RunObjects {
            tls: Some(("C".into(), "K".into())),
            ..crate::routes::test_objects(&[("*", "/")], routing)
        };
        let change = Overlay {
            response_header: Some(("X-Churn".into(), "on".into())),
            cors_origin: Some("https://app.example".into()),
            rewrite: Some(("/old".into(), "/new".into())),
            pool: None,
        };
        let all = crate::routes::render(&o, Some(2), &change);
        assert_eq!(all.len(), 1, "an HTTPProxy instead of the Ingress");
        let spec = &all[0]["spec"];
        assert_eq!(spec["virtualhost"]["fqdn"], "app.test");
        assert_eq!(spec["virtualhost"]["tls"]["secretName"], "echo-tls");
        assert_eq!(spec["virtualhost"]["corsPolicy"]["maxAge"], "600s");
        assert_eq!(
            spec["routes"][0]["responseHeadersPolicy"]["set"][0],
            json!({ "name": "x-ingressbench-generation", "value": "2" })
        );
        assert_eq!(
            spec["routes"][1]["pathRewritePolicy"]["replacePrefix"][0],
            json!({ "prefix": "/old", "replacement": "/new" })
        );
        // Without route changes: the Ingress, as for any class.
        assert_eq!(
            crate::routes::render(&o, None, &Overlay::default())[0]["kind"],
            "Ingress"
        );
    }
}
