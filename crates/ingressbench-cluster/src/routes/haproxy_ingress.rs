//! Route changes through HAProxy Ingress (`jcmoraisjr/haproxy-ingress`), as its users make
//! them: annotations of the Ingress. Response headers and the rewrite are HAProxy
//! directives in the backend's `config-backend` snippet (`http-response set-header`,
//! `http-request replace-path`); CORS has annotations of its own.

use std::collections::BTreeMap;

use ingressbench_lab::model::Overlay;

use super::{Can, H2cWay, MeshWay, Profile, Rendered};
use crate::deploy::RunObjects;

/// The `spec.controller` of HAProxy Ingress's IngressClass.
pub const CONTROLLER: &str = "haproxy-ingress.github.io/controller";
/// Its annotations' prefix.
const PREFIX: &str = "haproxy-ingress.github.io";

/// HAProxy Ingress's row of the table: everything, through annotations.
pub const PROFILE: Profile = Profile {
    name: "HAProxy Ingress",
    controller: CONTROLLER,
    means: "annotations (config-backend, cors-*)",
    can: Can::ALL,
    render,
    routes: None,
    mesh: Some(MeshWay {
        render: mesh,
        own_client_certificate: None,
    }),
    h2c: Some(H2cWay {
        service: &[("haproxy-ingress.github.io/backend-protocol", "h2")],
        ingress: &[],
    }),
};

/// The pool's Service annotations for a mesh: TLS to the sidecar with the run's client
/// certificate (`secure-crt-secret`), its certificate checked against the mesh's CA
/// (`secure-verify-ca-secret`) for the Service's name, which is also the SNI.
fn mesh(o: &RunObjects, pool: &str) -> Rendered {
    let name = crate::deploy::mesh::service_name(o, pool);
    let secret = crate::deploy::mesh::CLIENT_SECRET;
    let annotations = [
        ("backend-protocol", "h1-ssl"),
        ("secure-crt-secret", secret),
        ("secure-verify-ca-secret", secret),
        ("secure-verify-hostname", &name),
        ("secure-sni", &name),
    ]
    .into_iter()
    .map(|(k, v)| (format!("{PREFIX}/{k}"), v.to_owned()))
    .collect();
    Rendered {
        annotations,
        objects: Vec::new(),
    }
}

fn render(_namespace: &str, generation: u32, overlay: &Overlay) -> Rendered {
    let mut lines: Vec<String> = super::response_headers(Some(generation), overlay)
        .into_iter()
        .map(|(name, value)| format!("http-response set-header {name} \"{}\"", quoted(&value)))
        .collect();
    if let Some((from, to)) = &overlay.rewrite {
        lines.push(format!(
            "http-request replace-path ^{}(.*)$ {}\\1",
            super::regex_literal(from),
            to
        ));
    }
    let mut annotations = BTreeMap::from([(format!("{PREFIX}/config-backend"), lines.join("\n"))]);
    if let Some(origin) = &overlay.cors_origin {
        annotations.extend(super::cors_annotations(PREFIX, "cors-enable", origin));
    }
    Rendered {
        annotations,
        objects: Vec::new(),
    }
}

/// `value` inside HAProxy's double quotes.
fn quoted(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_becomes_backend_directives_and_cors_annotations() {
        let change = Overlay {
            response_header: Some(("X-Churn".into(), "o\"n".into())),
            cors_origin: Some("https://app.example".into()),
            rewrite: Some(("/old.v1".into(), "/new".into())),
            pool: None,
        };
        let r = render("ns", 3, &change);
        assert_eq!(
            r.annotations["haproxy-ingress.github.io/config-backend"],
            "http-response set-header x-ingressbench-generation \"3\"\n\
             http-response set-header X-Churn \"o\\\"n\"\n\
             http-request replace-path ^/old\\.v1(.*)$ /new\\1"
        );
        assert_eq!(
            r.annotations["haproxy-ingress.github.io/cors-allow-origin"],
            "https://app.example"
        );
        // A revert leaves only the generation.
        let revert = render("ns", 4, &Overlay::default());
        assert_eq!(revert.annotations.len(), 1);
        assert!(revert.objects.is_empty());
    }
}
