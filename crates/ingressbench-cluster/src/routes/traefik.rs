//! Route changes through Traefik, as its users make them: Middleware objects (its CRD
//! provider) that the run's Ingress names in its `router.middlewares` annotation. One
//! Middleware sets the response headers (the change's own, CORS, and the generation
//! header every answer carries so that the traffic shows when a change took effect), one
//! rewrites the path (the identity when the change has none, so that the Ingress never
//! changes).

use std::collections::BTreeMap;

use ingressbench_lab::model::Overlay;
use serde_json::{json, Value};

use super::{Can, H2cWay, MeshWay, Profile, Rendered, CORS_MAX_AGE_S, CORS_METHODS};
use crate::deploy::RunObjects;

/// The `spec.controller` of Traefik's IngressClass.
pub const CONTROLLER: &str = "traefik.io/ingress-controller";

/// Traefik's row of the table: everything, through Middlewares.
pub const PROFILE: Profile = Profile {
    name: "Traefik",
    controller: CONTROLLER,
    means: "Middlewares",
    can: Can::ALL,
    render,
    routes: None,
    mesh: Some(MeshWay {
        render: mesh,
        own_client_certificate: None,
    }),
    h2c: Some(H2cWay {
        service: &[("traefik.ingress.kubernetes.io/service.serversscheme", "h2c")],
        ingress: &[],
    }),
};

/// A pool's ServersTransport for a mesh, and its Service's annotations naming it: HTTPS
/// to the sidecar, its certificate checked against the mesh's CA for the Service's name
/// (also the SNI), the run's client certificate presented.
fn mesh(o: &RunObjects, pool: &str) -> Rendered {
    let name = format!("ib-mesh-{pool}");
    let secret = crate::deploy::mesh::CLIENT_SECRET;
    let transport = json!({
        "apiVersion": "traefik.io/v1alpha1", "kind": "ServersTransport",
        "metadata": { "name": name },
        "spec": {
            "serverName": crate::deploy::mesh::service_name(o, pool),
            "rootCAs": [{ "secret": secret }],
            "certificatesSecrets": [secret],
        },
    });
    let annotations = BTreeMap::from([
        (
            "traefik.ingress.kubernetes.io/service.serversscheme".to_owned(),
            "https".to_owned(),
        ),
        (
            "traefik.ingress.kubernetes.io/service.serverstransport".to_owned(),
            format!("{}-{name}@kubernetescrd", o.namespace),
        ),
    ]);
    Rendered {
        annotations,
        objects: vec![transport],
    }
}

fn render(namespace: &str, generation: u32, overlay: &Overlay) -> Rendered {
    Rendered {
        annotations: annotations(namespace),
        objects: middlewares(generation, overlay),
    }
}
/// The Middleware setting headers.
const HEADERS: &str = "ib-headers";
/// The Middleware rewriting the path.
const REWRITE: &str = "ib-rewrite";
/// The Middlewares answering CORS (Gateway API routes): `ib-cors-N`.
const CORS: &str = "ib-cors";

/// The Ingress annotation that puts the run's Middlewares (in `namespace`) on its routes.
fn annotations(namespace: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(
        "traefik.ingress.kubernetes.io/router.middlewares".to_owned(),
        format!("{namespace}-{HEADERS}@kubernetescrd,{namespace}-{REWRITE}@kubernetescrd"),
    )])
}

/// The Middlewares for `overlay` as configuration generation `generation`.
fn middlewares(generation: u32, overlay: &Overlay) -> Vec<Value> {
    let response: serde_json::Map<String, Value> =
        super::response_headers(Some(generation), overlay)
            .into_iter()
            .map(|(n, v)| (n, v.into()))
            .collect();
    let mut headers = json!({ "customResponseHeaders": response });
    if let Some(origin) = &overlay.cors_origin {
        add_cors(&mut headers, origin);
    }
    let (regex, replacement) = match &overlay.rewrite {
        Some((from, to)) => (
            format!("^{}(.*)$", super::regex_literal(from)),
            format!("{to}$1"),
        ),
        None => ("^(.*)$".to_owned(), "$1".to_owned()),
    };
    vec![
        middleware(HEADERS, json!({ "headers": headers })),
        middleware(
            REWRITE,
            json!({ "replacePathRegex": { "regex": regex, "replacement": replacement } }),
        ),
    ]
}

/// Traefik's `headers` settings that answer CORS for `origin`.
fn add_cors(headers: &mut Value, origin: &str) {
    headers["accessControlAllowOriginList"] = json!([origin]);
    headers["accessControlAllowMethods"] = json!(CORS_METHODS);
    headers["accessControlMaxAge"] = json!(CORS_MAX_AGE_S);
}

/// CORS on Gateway API routes served by Traefik: a Middleware for each origin of
/// `origins` (`ib-cors-1`, …), made with the routes and never changed, so that a change
/// only names one of them (a route naming a Middleware Traefik does not know yet is
/// dropped: 404s for about a second here).
pub(crate) fn cors_middlewares(origins: &[String]) -> Vec<Value> {
    origins
        .iter()
        .enumerate()
        .map(|(i, origin)| {
            let mut headers = json!({});
            add_cors(&mut headers, origin);
            middleware(&format!("{CORS}-{}", i + 1), json!({ "headers": headers }))
        })
        .collect()
}

/// The route's `ExtensionRef` filter naming the Middleware of `origins` for `origin`
/// (which must be one of them).
pub(crate) fn cors_filter(origins: &[String], origin: &str) -> Value {
    let n = origins
        .iter()
        .position(|o| o == origin)
        .map_or(0, |i| i + 1);
    json!({ "type": "ExtensionRef", "extensionRef": {
        "group": "traefik.io", "kind": "Middleware", "name": format!("{CORS}-{n}") } })
}

pub(crate) fn middleware(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "traefik.io/v1alpha1", "kind": "Middleware",
        "metadata": { "name": name },
        "spec": spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingressbench_lab::model::GENERATION_HEADER;

    #[test]
    fn a_change_becomes_headers_cors_and_a_rewrite_and_a_revert_the_identity() {
        let change = Overlay {
            response_header: Some(("X-Churn".into(), "on".into())),
            cors_origin: Some("https://app.example".into()),
            rewrite: Some(("/old.v1".into(), "/new".into())),
            pool: None,
        };
        let Rendered {
            annotations,
            objects: m,
        } = render("ib-1", 3, &change);
        let headers = &m[0]["spec"]["headers"];
        assert_eq!(headers["customResponseHeaders"][GENERATION_HEADER], "3");
        assert_eq!(headers["customResponseHeaders"]["X-Churn"], "on");
        assert_eq!(
            headers["accessControlAllowOriginList"][0],
            "https://app.example"
        );
        let rewrite = &m[1]["spec"]["replacePathRegex"];
        assert_eq!(rewrite["regex"], "^/old\\.v1(.*)$");
        assert_eq!(rewrite["replacement"], "/new$1");
        let revert = middlewares(4, &Overlay::default());
        assert_eq!(
            revert[0]["spec"]["headers"],
            json!({ "customResponseHeaders": { GENERATION_HEADER: "4" } })
        );
        assert_eq!(revert[1]["spec"]["replacePathRegex"]["regex"], "^(.*)$");
        assert_eq!(
            annotations["traefik.ingress.kubernetes.io/router.middlewares"],
            "ib-1-ib-headers@kubernetescrd,ib-1-ib-rewrite@kubernetescrd"
        );
    }
}
