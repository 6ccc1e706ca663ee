//! Route changes through Traefik, as its users make them: Middleware objects (its CRD
//! provider) that the run's Ingress names in its `router.middlewares` annotation. One
//! Middleware sets the response headers (the change's own, CORS, and the generation
//! header every answer carries so that the traffic shows when a change took effect), one
//! rewrites the path (the identity when the change has none, so that the Ingress never
//! changes).

use std::collections::BTreeMap;

use ingressbench_lab::model::{Overlay, GENERATION_HEADER};
use serde_json::{json, Value};

/// The `spec.controller` of Traefik's IngressClass.
pub const CONTROLLER: &str = "traefik.io/ingress-controller";
/// The Middleware setting headers.
const HEADERS: &str = "ib-headers";
/// The Middleware rewriting the path.
const REWRITE: &str = "ib-rewrite";

/// The Ingress annotation that puts the run's Middlewares (in `namespace`) on its routes.
pub fn annotations(namespace: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(
        "traefik.ingress.kubernetes.io/router.middlewares".to_owned(),
        format!("{namespace}-{HEADERS}@kubernetescrd,{namespace}-{REWRITE}@kubernetescrd"),
    )])
}

/// The Middlewares for `overlay` as configuration generation `generation`.
pub fn middlewares(generation: u32, overlay: &Overlay) -> Vec<Value> {
    let mut response = serde_json::Map::new();
    response.insert(GENERATION_HEADER.to_owned(), generation.to_string().into());
    if let Some((name, value)) = &overlay.response_header {
        response.insert(name.clone(), value.clone().into());
    }
    let mut headers = json!({ "customResponseHeaders": response });
    if let Some(origin) = &overlay.cors_origin {
        headers["accessControlAllowOriginList"] = json!([origin]);
        headers["accessControlAllowMethods"] = json!(["GET", "POST", "OPTIONS"]);
        headers["accessControlMaxAge"] = json!(600);
    }
    let (regex, replacement) = match &overlay.rewrite {
        Some((from, to)) => (format!("^{}(.*)$", regex_literal(from)), format!("{to}$1")),
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

fn middleware(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "traefik.io/v1alpha1", "kind": "Middleware",
        "metadata": { "name": name },
        "spec": spec,
    })
}

/// `text` as a regular expression matching itself.
fn regex_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_becomes_headers_cors_and_a_rewrite_and_a_revert_the_identity() {
        let change = Overlay {
            response_header: Some(("X-Churn".into(), "on".into())),
            cors_origin: Some("https://app.example".into()),
            rewrite: Some(("/old.v1".into(), "/new".into())),
        };
        let m = middlewares(3, &change);
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
            annotations("ib-1")["traefik.ingress.kubernetes.io/router.middlewares"],
            "ib-1-ib-headers@kubernetescrd,ib-1-ib-rewrite@kubernetescrd"
        );
    }
}
