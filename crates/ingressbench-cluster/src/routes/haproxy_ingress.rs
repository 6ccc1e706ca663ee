//! Route changes through HAProxy Ingress (`jcmoraisjr/haproxy-ingress`), as its users make
//! them: annotations of the Ingress. Response headers and the rewrite are HAProxy
//! directives in the backend's `config-backend` snippet (`http-response set-header`,
//! `http-request replace-path`); CORS has annotations of its own.

use std::collections::BTreeMap;

use ingressbench_lab::model::Overlay;

use super::{Can, Profile, Rendered};

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
};

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
