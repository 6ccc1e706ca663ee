//! The mesh a scenario's `hop` stands for in a cluster, built the Kubernetes way: an
//! Envoy sidecar container in every backend pod (as OSM, Istio and Consul inject one),
//! the pool's Service pointing at the sidecar's port, and with mutual TLS the sidecar's
//! certificate and the CAs it accepts clients from taken from a Secret (environment
//! variables from `secretKeyRef`, which Envoy reads as data sources). The controller
//! outside the mesh is given a client certificate, as OSM gives Contour or NGINX one
//! (the OSM experiment's "outside the mesh with an mTLS certificate"): each controller's
//! [`crate::routes::MeshWay`] says how.
//!
//! Envoy's configuration is one JSON document in its arguments (`--config-yaml`): no
//! admin interface, a listener for the mesh's traffic to the backend on the pod's
//! loopback (each request logged, [`ACCESS_LOG`]), and a plain listener answering the
//! readiness probe (`/ready` on [`READY_PORT`], as Istio's 15021).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, EnvVarSource, Secret, SecretKeySelector};
use serde_json::{json, Value};

use super::{objects, RunObjects, BACKEND_PORT};

pub use crate::file::SIDECAR_IMAGE;

/// The port the sidecar takes the mesh's traffic on (the Service's target).
pub const MESH_PORT: i32 = 8443;

/// The port its readiness endpoint answers on.
pub const READY_PORT: i32 = 15021;

/// The user it runs as (the official image's default is root; the pod asks for the
/// restricted Pod Security Standard).
const SIDECAR_USER: i64 = 65532;

/// The line the sidecar logs for each request it passes on (as OSM's sidecars log every
/// request by default): who sent it, on which of its connections (so how often the
/// controller reuses one shows), and the subject of the client certificate they
/// presented (`-` without one).
pub const ACCESS_LOG: &str = "mesh %START_TIME% \"%REQ(:METHOD)% %REQ(:PATH)%\" %RESPONSE_CODE% peer=%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT% conn=%CONNECTION_ID% client=\"%DOWNSTREAM_PEER_SUBJECT%\"\n";

/// The Secret with the sidecars' certificate, key and the CAs they accept clients from.
pub const SIDECAR_SECRET: &str = "ib-mesh-sidecar";

/// The `kubernetes.io/tls` Secret with the controller's client certificate and key, and
/// (`ca.crt`) the CA of the sidecars' certificate.
pub const CLIENT_SECRET: &str = "ib-mesh-client";

/// A run's mesh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    /// The sidecar's image.
    pub image: String,
    /// Mutual TLS between the controller and the sidecars (none: plain HTTP to them).
    pub tls: Option<MeshTls>,
}

/// The mesh's certificates, PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshTls {
    /// The sidecars' certificate chain and key (for every pool's Service name).
    pub sidecar: (String, String),
    /// The CAs whose client certificates the sidecars accept.
    pub client_cas: String,
    /// The run's client certificate chain and key for the controller.
    pub client: (String, String),
    /// The CA of the sidecars' certificate.
    pub ca: String,
}

/// The name a pool's sidecar answers to (and its certificate carries): its Service's.
pub fn service_name(o: &RunObjects, pool: &str) -> String {
    format!("{pool}.{}.svc", o.namespace)
}

/// The names the sidecars' certificate carries: every pool's Service, short and full.
pub fn certificate_names(namespace: &str, pools: &[&str]) -> Vec<String> {
    pools
        .iter()
        .flat_map(|p| {
            [
                format!("{p}.{namespace}.svc"),
                format!("{p}.{namespace}.svc.cluster.local"),
            ]
        })
        .collect()
}

/// The sidecar container of a backend pod.
pub(crate) fn sidecar(mesh: &Mesh) -> Container {
    let from_secret = |name: &str, key: &str| EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: SIDECAR_SECRET.to_owned(),
                key: key.to_owned(),
                optional: None,
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    let env = mesh.tls.as_ref().map(|_| {
        vec![
            from_secret("MESH_CERT", "tls.crt"),
            from_secret("MESH_KEY", "tls.key"),
            from_secret("MESH_CLIENT_CA", "ca.crt"),
        ]
    });
    Container {
        name: "envoy".into(),
        image: Some(mesh.image.clone()),
        command: Some(vec!["envoy".into()]),
        args: Some(vec![
            "--config-yaml".into(),
            config(mesh.tls.is_some()).to_string(),
            "--disable-hot-restart".into(),
            // The access log within a second (Envoy's default holds it for 10 s).
            "--file-flush-interval-msec".into(),
            "1000".into(),
            "--log-level".into(),
            "warning".into(),
        ]),
        env,
        ports: objects::named_ports(&[(MESH_PORT, "mesh"), (READY_PORT, "mesh-ready")]),
        readiness_probe: objects::http_probe("/ready", "mesh-ready"),
        security_context: objects::locked_down(Some(SIDECAR_USER)),
        ..Container::default()
    }
}

/// The sidecar's Envoy configuration: the mesh listener (with mutual TLS: the pod's
/// certificate, a client certificate required and checked against the accepted CAs) to
/// the backend on the pod's loopback; the readiness listener.
fn config(mtls: bool) -> Value {
    let env = |name: &str| json!({ "environment_variable": name });
    // An HTTP connection manager answering every request with `action` (`route` to a
    // cluster, or a `direct_response`), logging each (`log`) to its output.
    let manager = |prefix: &str, action: Value, log: bool| {
        let mut route = json!({ "match": { "prefix": "/" } });
        if let (Some(r), Some(a)) = (route.as_object_mut(), action.as_object()) {
            r.extend(a.clone());
        }
        let access_log = match log {
            true => json!([{ "name": "envoy.access_loggers.stdout", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
                "log_format": { "text_format_source": { "inline_string": ACCESS_LOG } } } }]),
            false => json!([]),
        };
        json!({
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": prefix,
                "access_log": access_log,
                "route_config": { "virtual_hosts": [{ "name": prefix, "domains": ["*"],
                    "routes": [route] }] },
                "http_filters": [{ "name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" } }],
            },
        })
    };
    let to_app = manager("mesh", json!({ "route": { "cluster": "app" } }), true);
    let ready = manager(
        "ready",
        json!({ "direct_response": { "status": 200 } }),
        false,
    );
    let mut mesh_chain = json!({ "filters": [to_app] });
    if mtls {
        mesh_chain["transport_socket"] = json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "require_client_certificate": true,
                "common_tls_context": {
                    "tls_certificates": [{ "certificate_chain": env("MESH_CERT"),
                                           "private_key": env("MESH_KEY") }],
                    "validation_context": { "trusted_ca": env("MESH_CLIENT_CA") },
                },
            },
        });
    }
    let listener = |name: &str, port: i32, chain: Value| {
        json!({ "name": name,
                "address": { "socket_address": { "address": "0.0.0.0", "port_value": port } },
                "filter_chains": [chain] })
    };
    json!({
        "static_resources": {
            "listeners": [
                listener("mesh", MESH_PORT, mesh_chain),
                listener("ready", READY_PORT, json!({ "filters": [ready] })),
            ],
            "clusters": [{
                "name": "app", "type": "STATIC", "connect_timeout": "1s",
                "load_assignment": { "cluster_name": "app", "endpoints": [{ "lb_endpoints": [{
                    "endpoint": { "address": { "socket_address": {
                        "address": "127.0.0.1", "port_value": BACKEND_PORT } } } }] }] },
            }],
        },
    })
}

/// The mesh's Secrets: the sidecars' and the controller's client certificate.
pub(crate) fn secrets(o: &RunObjects) -> Vec<Secret> {
    let Some(tls) = o.mesh.as_ref().and_then(|m| m.tls.as_ref()) else {
        return Vec::new();
    };
    let secret = |name: &str, kind: &str, data: [(&str, &String); 3]| {
        let mut metadata = objects::meta(o, objects::labels(o));
        metadata.name = Some(name.to_owned());
        Secret {
            metadata,
            type_: Some(kind.to_owned()),
            string_data: Some(
                data.into_iter()
                    .map(|(k, v)| (k.to_owned(), v.clone()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Secret::default()
        }
    };
    vec![
        secret(
            SIDECAR_SECRET,
            "Opaque",
            [
                ("tls.crt", &tls.sidecar.0),
                ("tls.key", &tls.sidecar.1),
                ("ca.crt", &tls.client_cas),
            ],
        ),
        secret(
            CLIENT_SECRET,
            "kubernetes.io/tls",
            [
                ("tls.crt", &tls.client.0),
                ("tls.key", &tls.client.1),
                ("ca.crt", &tls.ca),
            ],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_takes_the_sidecars_configuration_with_and_without_mutual_tls() {
        use ingressbench_lab::proxy::ProxyKind;
        let envoy = ingressbench_lab::proxy::Binaries::discover()
            .locate(ProxyKind::Envoy)
            .expect("the project's Envoy (scripts/install-deps.sh installs it)");
        let dir = std::env::temp_dir().join(format!("ib-mesh-validate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let certs = ingressbench_lab::certs::generate(&dir, &["echo.ns.svc".into()]).unwrap();
        for tls in [true, false] {
            let c = sidecar(&Mesh {
                image: SIDECAR_IMAGE.into(),
                tls: None,
            });
            let mut args = c.args.unwrap();
            args[1] = config(tls).to_string();
            let out = std::process::Command::new(&envoy)
                .args(["--mode", "validate"])
                .args(&args)
                .env("MESH_CERT", std::fs::read_to_string(&certs.cert).unwrap())
                .env("MESH_KEY", std::fs::read_to_string(&certs.key).unwrap())
                .env(
                    "MESH_CLIENT_CA",
                    std::fs::read_to_string(&certs.ca).unwrap(),
                )
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "mtls {tls}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_sidecar_takes_its_certificates_from_the_secret_and_requires_a_client_certificate() {
        let mesh = Mesh {
            image: SIDECAR_IMAGE.into(),
            tls: Some(MeshTls {
                sidecar: ("C".into(), "K".into()),
                client_cas: "CA1CA2".into(),
                client: ("c".into(), "k".into()),
                ca: "CA".into(),
            }),
        };
        let c = sidecar(&mesh);
        let env = c.env.unwrap();
        assert_eq!(env.len(), 3);
        assert!(env.iter().all(|v| v
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap()
            .name
            == SIDECAR_SECRET));
        let args = c.args.unwrap();
        let config: Value = serde_json::from_str(&args[1]).unwrap();
        let listeners = &config["static_resources"]["listeners"];
        let tls = &listeners[0]["filter_chains"][0]["transport_socket"]["typed_config"];
        assert_eq!(tls["require_client_certificate"], true);
        assert_eq!(
            tls["common_tls_context"]["validation_context"]["trusted_ca"]["environment_variable"],
            "MESH_CLIENT_CA"
        );
        let route = &listeners[0]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
            ["virtual_hosts"][0]["routes"][0];
        assert_eq!(route["route"]["cluster"], "app");
        let log = &listeners[0]["filter_chains"][0]["filters"][0]["typed_config"]["access_log"];
        assert_eq!(
            log[0]["typed_config"]["log_format"]["text_format_source"]["inline_string"],
            ACCESS_LOG
        );
        assert!(config.get("admin").is_none(), "no admin interface");
        let ready = &listeners[1]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
            ["virtual_hosts"][0]["routes"][0];
        assert_eq!(ready["direct_response"]["status"], 200);
        assert_eq!(c.security_context.unwrap().run_as_user, Some(65532));
        // Without mutual TLS: plain HTTP, no Secret.
        let plain = sidecar(&Mesh {
            image: SIDECAR_IMAGE.into(),
            tls: None,
        });
        assert!(plain.env.is_none());
        let config: Value = serde_json::from_str(&plain.args.unwrap()[1]).unwrap();
        assert!(
            config["static_resources"]["listeners"][0]["filter_chains"][0]
                .get("transport_socket")
                .is_none()
        );
    }
}
