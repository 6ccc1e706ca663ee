//! The objects the local control plane installs beside the controllers: the Gateway
//! API's and Traefik's custom resource definitions (read from their YAML), Traefik's
//! IngressClass and role, and what tells that a definition is served.

use std::path::Path;

use super::{io, TRAEFIK_USER};
use crate::ClusterError;

/// The API group of Traefik's custom resources.
pub(super) const TRAEFIK_GROUP: &str = "traefik.io";
/// The kinds of Traefik's CRD provider: it watches every one of them, so each must exist
/// (the run itself makes only Middlewares).
pub(super) const TRAEFIK_KINDS: [&str; 10] = [
    "IngressRoute",
    "IngressRouteTCP",
    "IngressRouteUDP",
    "Middleware",
    "MiddlewareTCP",
    "ServersTransport",
    "ServersTransportTCP",
    "TLSOption",
    "TLSStore",
    "TraefikService",
];

/// The Gateway API kinds the controllers' Gateway providers read (and report on).
pub(super) const GATEWAY_KINDS: [&str; 9] = [
    "gatewayclasses",
    "gateways",
    "httproutes",
    "grpcroutes",
    "tlsroutes",
    "tcproutes",
    "referencegrants",
    "backendtlspolicies",
    "listenersets",
];

/// Every object of a YAML file (of several documents too), as JSON.
pub(super) fn read_yaml(path: &Path) -> Result<Vec<serde_json::Value>, ClusterError> {
    let text = std::fs::read_to_string(path).map_err(|e| io(path, e))?;
    let mut out = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value =
            <serde_json::Value as serde::Deserialize>::deserialize(document).map_err(|e| {
                ClusterError::File {
                    path: path.to_owned(),
                    message: e.to_string(),
                }
            })?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

/// Whether an object's status has condition `kind` true.
pub(super) fn condition_true(object: &serde_json::Value, kind: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

/// The names of the custom resource definitions among `objects`.
pub(super) fn crd_names(objects: &[serde_json::Value]) -> Vec<String> {
    objects
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// IngressClass `traefik`, the custom resource kinds of Traefik's CRD provider (their
/// schema left open: Traefik checks what it reads), and the ClusterRole (bound to
/// Traefik's user) its providers need: read Services, EndpointSlices, Secrets, Ingresses
/// and their classes and its own kinds; write Ingress status.
pub(super) fn traefik_objects() -> Vec<serde_json::Value> {
    let plurals: Vec<String> = TRAEFIK_KINDS
        .iter()
        .map(|k| format!("{}s", k.to_ascii_lowercase()))
        .collect();
    let kinds = TRAEFIK_KINDS.iter().zip(&plurals).map(|(kind, plural)| {
        serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": { "name": format!("{plural}.{TRAEFIK_GROUP}") },
            "spec": {
                "group": TRAEFIK_GROUP, "scope": "Namespaced",
                "names": { "kind": kind, "listKind": format!("{kind}List"), "plural": plural,
                           "singular": kind.to_ascii_lowercase() },
                "versions": [{ "name": "v1alpha1", "served": true, "storage": true,
                    "schema": { "openAPIV3Schema": { "type": "object",
                        "x-kubernetes-preserve-unknown-fields": true } } }],
            },
        })
    });
    kinds.chain([
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": { "name": "ingressbench-traefik" },
            "rules": [
                { "apiGroups": [""], "resources": ["services", "secrets", "nodes", "configmaps", "namespaces"],
                  "verbs": ["get", "list", "watch"] },
                { "apiGroups": [crate::routes::gateway::GROUP], "resources": GATEWAY_KINDS,
                  "verbs": ["get", "list", "watch"] },
                { "apiGroups": [crate::routes::gateway::GROUP],
                  "resources": GATEWAY_KINDS.iter().map(|k| format!("{k}/status")).collect::<Vec<_>>(),
                  "verbs": ["update", "patch"] },
                { "apiGroups": [TRAEFIK_GROUP], "resources": plurals,
                  "verbs": ["get", "list", "watch"] },
                { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                  "verbs": ["get", "list", "watch"] },
                { "apiGroups": ["networking.k8s.io"], "resources": ["ingresses", "ingressclasses"],
                  "verbs": ["get", "list", "watch"] },
                { "apiGroups": ["networking.k8s.io"], "resources": ["ingresses/status"],
                  "verbs": ["update"] },
            ],
        }),
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": "ingressbench-traefik" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": "ingressbench-traefik" },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                           "name": TRAEFIK_USER }],
        }),
        serde_json::json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": { "name": "traefik" },
            "spec": { "controller": "traefik.io/ingress-controller" },
        }),
    ])
    .collect()
}
