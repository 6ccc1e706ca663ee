//! Route changes through ingress-nginx (`kubernetes/ingress-nginx`), as its users make
//! them: annotations of the Ingress. Response headers and the rewrite are nginx
//! directives in `configuration-snippet` (`more_set_headers`, `rewrite … break`), which
//! the controller takes only with `allow-snippet-annotations: "true"` (and, from v1.12,
//! `annotations-risk-level: Critical`) in its ConfigMap; CORS has annotations of its own.
//! Not run here (the Go module proxy this project may use refuses the controller's
//! module): what it renders is tested, and docs/CLUSTER.md says so.

use std::collections::BTreeMap;

use ingressbench_lab::model::Overlay;

use super::{Can, H2cWay, Profile, Rendered};

/// The `spec.controller` of ingress-nginx's IngressClass.
pub const CONTROLLER: &str = "k8s.io/ingress-nginx";
/// Its annotations' prefix.
const PREFIX: &str = "nginx.ingress.kubernetes.io";

/// ingress-nginx's row of the table: everything, through annotations.
pub const PROFILE: Profile = Profile {
    name: "ingress-nginx",
    controller: CONTROLLER,
    means: "annotations (configuration-snippet, enable-cors)",
    can: Can::ALL,
    render,
    routes: None,
    mesh: None,
    h2c: Some(H2cWay {
        service: &[],
        ingress: &[("nginx.ingress.kubernetes.io/backend-protocol", "GRPC")],
    }),
};

fn render(_namespace: &str, generation: u32, overlay: &Overlay) -> Rendered {
    let mut lines: Vec<String> = super::response_headers(Some(generation), overlay)
        .into_iter()
        .map(|(name, value)| {
            format!(
                "more_set_headers \"{name}: {}\";",
                value.replace('"', "\\\"")
            )
        })
        .collect();
    if let Some((from, to)) = &overlay.rewrite {
        lines.push(format!(
            "rewrite ^{}(.*)$ {}$1 break;",
            super::regex_literal(from),
            to
        ));
    }
    let mut annotations =
        BTreeMap::from([(format!("{PREFIX}/configuration-snippet"), lines.join("\n"))]);
    if let Some(origin) = &overlay.cors_origin {
        annotations.extend(super::cors_annotations(PREFIX, "enable-cors", origin));
    }
    Rendered {
        annotations,
        objects: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_becomes_a_configuration_snippet_and_cors_annotations() {
        let change = Overlay {
            response_header: Some(("X-Churn".into(), "on".into())),
            cors_origin: Some("https://app.example".into()),
            rewrite: Some(("/old".into(), "/new".into())),
            pool: None,
        };
        let r = render("ns", 2, &change);
        assert_eq!(
            r.annotations["nginx.ingress.kubernetes.io/configuration-snippet"],
            "more_set_headers \"x-ingressbench-generation: 2\";\n\
             more_set_headers \"X-Churn: on\";\n\
             rewrite ^/old(.*)$ /new$1 break;"
        );
        assert_eq!(
            r.annotations["nginx.ingress.kubernetes.io/enable-cors"],
            "true"
        );
        assert_eq!(render("ns", 3, &Overlay::default()).annotations.len(), 1);
    }
}
