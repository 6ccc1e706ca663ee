//! The Kubernetes objects of a run, built from [`RunObjects`] without calling anything:
//! the pools' Deployments and Services, the Ingress and its TLS Secret, and the labels
//! and metadata every object carries.

use std::collections::BTreeMap;

use ingressbench_lab::backend::CONTROL_TOKEN_ENV;
use ingressbench_lab::certs::DEFAULT_TLS_NAME;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile,
    Secret, SecretKeySelector, SecurityContext, Service, ServicePort, ServiceSpec, Sysctl,
};
use k8s_openapi::api::networking::v1::{
    HTTPIngressPath, HTTPIngressRuleValue, Ingress, IngressBackend, IngressRule,
    IngressServiceBackend, IngressSpec, IngressTLS, ServiceBackendPort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{RunObjects, BACKEND_PORT, CONTROL_PORT};
use crate::meta::{MANAGED_BY, POOL_LABEL, RUN_LABEL, TOOL};

/// The labels of every object of the run.
pub(crate) fn labels(o: &RunObjects) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.to_owned(), TOOL.to_owned()),
        (RUN_LABEL.to_owned(), o.run_id.clone()),
    ])
}

/// A pool's pods' labels.
pub(crate) fn pool_labels(o: &RunObjects, pool: &str) -> BTreeMap<String, String> {
    let mut l = labels(o);
    l.insert(POOL_LABEL.into(), pool.to_owned());
    l
}

pub(crate) fn pool_selector(pool: &str) -> String {
    format!("{POOL_LABEL}={pool}")
}

/// Metadata of an object named after the (first) pool.
pub(crate) fn meta(o: &RunObjects, labels: BTreeMap<String, String>) -> ObjectMeta {
    named(o, &o.pool, labels)
}

pub(crate) fn named(o: &RunObjects, name: &str, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(o.namespace.clone()),
        labels: Some(labels),
        ..ObjectMeta::default()
    }
}

pub(crate) fn deployment(o: &RunObjects, pool: &str, replicas: i32) -> Deployment {
    let field = |path: &str| EnvVarSource {
        field_ref: Some(ObjectFieldSelector {
            field_path: path.to_owned(),
            ..ObjectFieldSelector::default()
        }),
        ..EnvVarSource::default()
    };
    let mut args: Vec<String> = [
        "backend",
        "--listen",
        &format!("0.0.0.0:{BACKEND_PORT}"),
        "--name",
        "$(POD_NAME)",
        "--control",
        &format!("0.0.0.0:{CONTROL_PORT}"),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.extend(o.backend_args.iter().cloned());
    let container = Container {
        name: "backend".into(),
        image: Some(o.image.clone()),
        args: Some(args),
        env: Some(vec![
            EnvVar {
                name: "POD_NAME".into(),
                value_from: Some(field("metadata.name")),
                ..EnvVar::default()
            },
            // The stall a run asks for through the API server carries the token; any
            // other pod's is refused.
            EnvVar {
                name: CONTROL_TOKEN_ENV.into(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: CONTROL_SECRET.into(),
                        key: CONTROL_SECRET_KEY.into(),
                        optional: Some(false),
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            },
        ]),
        ports: named_ports(&[(BACKEND_PORT, "http"), (CONTROL_PORT, "control")]),
        readiness_probe: http_probe("/healthz", "http"),
        security_context: locked_down(None),
        ..Container::default()
    };
    // What the "restricted" Pod Security Standard asks (a namespace that enforces it
    // admits these pods): not root (the image's user, 65532), no privilege to gain, no
    // capability, the runtime's seccomp profile.
    let security_context = Some(PodSecurityContext {
        run_as_non_root: Some(true),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        sysctls: (!o.sysctls.is_empty()).then(|| {
            o.sysctls
                .iter()
                .map(|(name, value)| Sysctl {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect()
        }),
        ..PodSecurityContext::default()
    });
    Deployment {
        metadata: named(o, pool, labels(o)),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(POOL_LABEL.to_owned(), pool.to_owned())])),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pool_labels(o, pool)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: std::iter::once(container)
                        .chain(o.mesh.as_ref().map(super::mesh::sidecar))
                        .collect(),
                    termination_grace_period_seconds: Some(o.grace_s),
                    security_context,
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

/// A pool's Service: port 80 to the backends' port, or with a mesh to their sidecars',
/// annotated as the run's controller needs to reach them (through a mesh, or with gRPC's
/// h2c, which the port's `appProtocol` also says).
pub(crate) fn service(o: &RunObjects, pool: &str) -> Service {
    let mut metadata = named(o, pool, labels(o));
    let annotations = crate::routes::service_annotations(o, pool);
    if !annotations.is_empty() {
        metadata.annotations = Some(annotations);
    }
    let target = if o.mesh.is_some() { "mesh" } else { "http" };
    Service {
        metadata,
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(POOL_LABEL.to_owned(), pool.to_owned())])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::String(target.into())),
                // The Gateway API's way to say a backend's protocol (GEP-1911): without
                // it, Contour speaks HTTP/2 over TLS to the backends of a GRPCRoute on an
                // HTTPS listener (measured: every call timed out connecting).
                app_protocol: (o.traffic == super::Traffic::Grpc)
                    .then(|| "kubernetes.io/h2c".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The run's Ingress of class `class`, with `annotations`, as the API takes it.
pub(crate) fn ingress_object(
    o: &RunObjects,
    class: &str,
    annotations: BTreeMap<String, String>,
) -> serde_json::Value {
    serde_json::to_value(ingress(o, class, annotations)).unwrap_or_default()
}

pub(crate) fn ingress<'a>(
    o: &'a RunObjects,
    class: &str,
    annotations: BTreeMap<String, String>,
) -> Ingress {
    let backend = |pool: &str| IngressBackend {
        service: Some(IngressServiceBackend {
            name: pool.to_owned(),
            port: Some(ServiceBackendPort {
                number: Some(80),
                ..ServiceBackendPort::default()
            }),
        }),
        ..IngressBackend::default()
    };
    // One rule per host, its paths in it; `*` is a rule without a host, or over TLS one
    // for the name the certificate gives a catch-all (controllers differ on which
    // certificate a TLS entry without hosts serves: HAProxy Ingress keeps its own).
    let host_of = |h: &'a str| match (h, &o.tls) {
        ("*", Some(_)) => DEFAULT_TLS_NAME,
        _ => h,
    };
    let mut by_host: BTreeMap<&str, Vec<HTTPIngressPath>> = BTreeMap::new();
    for r in &o.routes {
        by_host
            .entry(host_of(&r.host))
            .or_default()
            .push(HTTPIngressPath {
                path: Some(r.prefix.clone()),
                path_type: "Prefix".into(),
                backend: backend(&r.pool),
            });
    }
    let rules = by_host
        .into_iter()
        .map(|(host, paths)| IngressRule {
            host: (host != "*").then(|| host.to_owned()),
            http: Some(HTTPIngressRuleValue { paths }),
        })
        .collect();
    let mut metadata = meta(o, labels(o));
    if !annotations.is_empty() {
        metadata.annotations = Some(annotations);
    }
    // TLS for every host.
    let hosts: Vec<String> = o
        .routes
        .iter()
        .map(|r| host_of(&r.host).to_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let tls = o.tls.as_ref().map(|_| {
        vec![IngressTLS {
            hosts: (!hosts.is_empty()).then_some(hosts),
            secret_name: Some(tls_secret_name(o)),
        }]
    });
    Ingress {
        metadata,
        spec: Some(IngressSpec {
            ingress_class_name: Some(class.to_owned()),
            rules: Some(rules),
            tls,
            ..IngressSpec::default()
        }),
        ..Ingress::default()
    }
}

pub(crate) fn tls_secret_name(o: &RunObjects) -> String {
    format!("{}-tls", o.pool)
}

/// The routes' certificate as a `kubernetes.io/tls` Secret.
pub(crate) fn tls_secret(o: &RunObjects) -> Option<Secret> {
    let (cert, key) = o.tls.as_ref()?;
    let mut metadata = meta(o, labels(o));
    metadata.name = Some(tls_secret_name(o));
    Some(Secret {
        metadata,
        type_: Some("kubernetes.io/tls".into()),
        string_data: Some(BTreeMap::from([
            ("tls.crt".to_owned(), cert.clone()),
            ("tls.key".to_owned(), key.clone()),
        ])),
        ..Secret::default()
    })
}

/// The Secret with the backends' control token.
pub(crate) const CONTROL_SECRET: &str = "ingressbench-control";

/// The key in that Secret that holds the control endpoint's token.
const CONTROL_SECRET_KEY: &str = "token";

/// The run's control token as the Secret its backends read it from.
pub(crate) fn control_secret(o: &RunObjects, token: &str) -> Secret {
    Secret {
        metadata: named(o, CONTROL_SECRET, labels(o)),
        type_: Some("Opaque".into()),
        string_data: Some(BTreeMap::from([(
            CONTROL_SECRET_KEY.to_owned(),
            token.to_owned(),
        )])),
        ..Secret::default()
    }
}

/// A container's ports, each with its name.
pub(crate) fn named_ports(ports: &[(i32, &str)]) -> Option<Vec<ContainerPort>> {
    Some(
        ports
            .iter()
            .map(|(port, name)| ContainerPort {
                container_port: *port,
                name: Some((*name).to_owned()),
                ..ContainerPort::default()
            })
            .collect(),
    )
}

/// A readiness probe: `GET path` on the named port, every second.
pub(crate) fn http_probe(path: &str, port: &str) -> Option<Probe> {
    Some(Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String(port.to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(1),
        ..Probe::default()
    })
}

/// A container's part of the restricted Pod Security Standard: no privilege to gain, no
/// capability; as `user` (and its group) when given, else the image's.
pub(crate) fn locked_down(user: Option<i64>) -> Option<SecurityContext> {
    Some(SecurityContext {
        run_as_user: user,
        run_as_group: user,
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    })
}

#[cfg(test)]
mod tests {
    use super::super::Route;
    use super::*;

    fn objects() -> RunObjects {
        RunObjects {
            namespace: "ib-run-1".into(),
            run_id: "run-1".into(),
            pool: "echo".into(),
            replicas: 3,
            image: "ingressbench".into(),
            backend_args: vec!["--latency".into(), "1ms".into()],
            other_pools: vec![("api".into(), 2)],
            routes: [
                ("app.test", "/", "echo"),
                ("app.test", "/api", "api"),
                ("*", "/", "echo"),
            ]
            .map(|(host, prefix, pool)| Route {
                host: host.into(),
                prefix: prefix.into(),
                pool: pool.into(),
            })
            .to_vec(),
            routing: crate::routes::Routing::Ingress {
                class: "traefik".into(),
                profile: Some(&crate::routes::traefik::PROFILE),
            },
            generation: Some(1),
            cors_origins: Vec::new(),
            sysctls: BTreeMap::from([("net.core.somaxconn".into(), "1024".into())]),
            grace_s: 5,
            tls: Some(("CERT".into(), "KEY".into())),
            mesh: None,
            traffic: crate::deploy::Traffic::Http,
        }
    }

    #[test]
    fn a_mesh_puts_a_sidecar_in_each_pod_and_the_service_before_it() {
        let o = RunObjects {
            mesh: Some(crate::deploy::mesh::Mesh {
                image: "envoyproxy/envoy:v1".into(),
                tls: Some(crate::deploy::mesh::MeshTls {
                    sidecar: ("C".into(), "K".into()),
                    client_cas: "CAS".into(),
                    client: ("c".into(), "k".into()),
                    ca: "CA".into(),
                }),
            }),
            routing: crate::routes::Routing::Ingress {
                class: "haproxy".into(),
                profile: Some(&crate::routes::haproxy_ingress::PROFILE),
            },
            ..objects()
        };
        let pod = deployment(&o, "api", 2)
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["backend", "envoy"]);
        assert_eq!(
            pod.containers[1].image.as_deref(),
            Some("envoyproxy/envoy:v1")
        );
        let svc = service(&o, "api");
        assert_eq!(
            svc.spec.unwrap().ports.unwrap()[0].target_port,
            Some(IntOrString::String("mesh".into()))
        );
        let annotations = svc.metadata.annotations.unwrap();
        assert_eq!(
            annotations["haproxy-ingress.github.io/secure-verify-hostname"],
            "api.ib-run-1.svc"
        );
        assert_eq!(
            annotations["haproxy-ingress.github.io/secure-crt-secret"],
            crate::deploy::mesh::CLIENT_SECRET
        );
        let secrets = crate::deploy::mesh::secrets(&o);
        let data = |i: usize| secrets[i].string_data.clone().unwrap();
        assert_eq!(
            data(0)["ca.crt"],
            "CAS",
            "the sidecars accept the clients' CAs"
        );
        assert_eq!(
            data(1)["ca.crt"],
            "CA",
            "the controller checks the sidecars' CA"
        );
        assert_eq!(secrets[1].type_.as_deref(), Some("kubernetes.io/tls"));
        // Without a mesh: the backends' port, no annotation, no Secret.
        let plain = objects();
        let svc = service(&plain, "api");
        assert!(svc.metadata.annotations.is_none());
        assert_eq!(
            svc.spec.unwrap().ports.unwrap()[0].target_port,
            Some(IntOrString::String("http".into()))
        );
        assert!(crate::deploy::mesh::secrets(&plain).is_empty());
    }

    #[test]
    fn traefik_and_contour_reach_the_sidecars_their_own_ways() {
        let mesh = crate::deploy::mesh::Mesh {
            image: "envoy".into(),
            tls: Some(crate::deploy::mesh::MeshTls {
                sidecar: ("C".into(), "K".into()),
                client_cas: "CAS".into(),
                client: ("c".into(), "k".into()),
                ca: "CA".into(),
            }),
        };
        let traefik = RunObjects {
            mesh: Some(mesh.clone()),
            ..objects()
        };
        let r = crate::routes::mesh_rendered(&traefik, "echo");
        assert_eq!(r.objects[0]["kind"], "ServersTransport");
        assert_eq!(r.objects[0]["spec"]["serverName"], "echo.ib-run-1.svc");
        assert_eq!(
            r.annotations["traefik.ingress.kubernetes.io/service.serverstransport"],
            "ib-run-1-ib-mesh-echo@kubernetescrd"
        );
        let contour = RunObjects {
            mesh: Some(mesh),
            generation: None,
            routing: crate::routes::Routing::Ingress {
                class: "contour".into(),
                profile: Some(&crate::routes::contour::PROFILE),
            },
            ..objects()
        };
        // HTTPProxies (an Ingress cannot ask for the upstream's validation), no headers.
        let routes = crate::routes::render(&contour, None, &Default::default());
        assert!(routes.iter().all(|r| r["kind"] == "HTTPProxy"));
        let service = &routes[0]["spec"]["routes"][0]["services"][0];
        assert_eq!(service["protocol"], "tls");
        assert_eq!(
            service["validation"]["caSecret"],
            crate::deploy::mesh::CLIENT_SECRET
        );
        assert!(
            routes[0]["spec"]["routes"][0]["responseHeadersPolicy"]["set"]
                .as_array()
                .unwrap()
                .is_empty()
        );
    }

    fn ingress_of(o: &RunObjects) -> Ingress {
        ingress(
            o,
            "traefik",
            BTreeMap::from([("a.example/b".into(), "c".into())]),
        )
    }

    #[test]
    fn every_object_carries_the_tools_label_and_the_run() {
        let o = objects();
        for meta in [
            &deployment(&o, "echo", 3).metadata,
            &service(&o, "api").metadata,
            &ingress_of(&o).metadata,
            &tls_secret(&o).unwrap().metadata,
        ] {
            let labels = meta.labels.as_ref().unwrap();
            assert_eq!(labels[MANAGED_BY], TOOL);
            assert_eq!(labels[RUN_LABEL], "run-1");
        }
    }

    #[test]
    fn routes_become_one_rule_per_host_to_their_pools_and_sysctls_the_pods_security_context() {
        let o = RunObjects {
            tls: None,
            ..objects()
        };
        let rules = ingress_of(&o).spec.unwrap().rules.unwrap();
        assert_eq!(rules.len(), 2);
        let app = rules
            .iter()
            .find(|r| r.host.as_deref() == Some("app.test"))
            .unwrap();
        let services: Vec<(&str, &str)> = app
            .http
            .as_ref()
            .unwrap()
            .paths
            .iter()
            .map(|p| {
                let service = p.backend.service.as_ref().unwrap();
                (p.path.as_deref().unwrap(), service.name.as_str())
            })
            .collect();
        assert_eq!(services, [("/", "echo"), ("/api", "api")]);
        // Each pool its own Deployment and Service, selecting its own pods.
        let api = deployment(&o, "api", 2);
        assert_eq!(api.metadata.name.as_deref(), Some("api"));
        let spec = api.spec.unwrap();
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(
            spec.template.metadata.unwrap().labels.unwrap()[POOL_LABEL],
            "api"
        );
        assert_eq!(
            service(&o, "api").spec.unwrap().selector.unwrap()[POOL_LABEL],
            "api"
        );
        assert!(
            rules.iter().any(|r| r.host.is_none()),
            "`*` is a rule without a host"
        );
        // Over TLS, the rule of the name the certificate gives a catch-all.
        let tls_rules = ingress_of(&objects()).spec.unwrap().rules.unwrap();
        assert_eq!(tls_rules.len(), 1);
        assert_eq!(tls_rules[0].host.as_deref(), Some("app.test"));
        assert_eq!(tls_rules[0].http.as_ref().unwrap().paths.len(), 3);
        let pod = deployment(&o, "echo", 3)
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let sysctls = pod.security_context.unwrap().sysctls.unwrap();
        assert_eq!(sysctls[0].name, "net.core.somaxconn");
        let args = pod.containers[0].args.clone().unwrap();
        assert_eq!(
            &args[..5],
            [
                "backend",
                "--listen",
                "0.0.0.0:8080",
                "--name",
                "$(POD_NAME)"
            ]
        );
        assert_eq!(&args[5..7], ["--control", "0.0.0.0:8081"]);
        // Its control token from the run's Secret, never on its command line.
        let env = pod.containers[0].env.clone().unwrap();
        let token = env
            .iter()
            .find(|e| e.name == CONTROL_TOKEN_ENV)
            .and_then(|e| e.value_from.clone()?.secret_key_ref)
            .unwrap();
        assert_eq!(token.name, CONTROL_SECRET);
        assert_eq!(
            control_secret(&o, "t0k").string_data.unwrap()[&token.key],
            "t0k"
        );
        assert_eq!(&args[7..], ["--latency", "1ms"]);
    }

    #[test]
    fn tls_names_the_secret_for_the_named_hosts_and_annotations_reach_the_ingress() {
        let o = objects();
        let ingress = ingress_of(&o);
        let tls = ingress.spec.unwrap().tls.unwrap();
        // `*` over TLS: the name its certificate gives a catch-all.
        assert_eq!(tls[0].hosts.as_deref(), Some(&["app.test".to_owned()][..]));
        assert_eq!(tls[0].secret_name.as_deref(), Some("echo-tls"));
        assert_eq!(ingress.metadata.annotations.unwrap()["a.example/b"], "c");
        let secret = tls_secret(&o).unwrap();
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(secret.string_data.unwrap()["tls.key"], "KEY");
        let plain = RunObjects { tls: None, ..o };
        assert!(tls_secret(&plain).is_none());
        assert!(ingress_of(&plain).spec.unwrap().tls.is_none());
    }

    #[test]
    fn the_routes_are_the_profiles_objects_then_the_ingress_with_its_annotations() {
        let o = objects();
        let first = crate::routes::render(&o, o.generation, &Default::default());
        let kinds: Vec<&str> = first.iter().map(|v| v["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["Middleware", "Middleware", "Ingress"]);
        let ingress = &first[2];
        assert_eq!(ingress["apiVersion"], "networking.k8s.io/v1");
        assert_eq!(ingress["spec"]["ingressClassName"], "traefik");
        assert!(ingress["metadata"]["annotations"]
            ["traefik.ingress.kubernetes.io/router.middlewares"]
            .is_string());
        // Without route changes: the Ingress alone, no annotations.
        let plain = crate::routes::render(&o, None, &Default::default());
        assert_eq!(plain.len(), 1);
        assert!(plain[0]["metadata"].get("annotations").is_none());
    }

    #[test]
    fn grpc_is_said_each_controllers_own_way() {
        use crate::deploy::Traffic;
        use crate::routes::{self, Routing};
        let with = |profile: &'static routes::Profile, traffic: Traffic| RunObjects {
            traffic,
            ..routes::test_objects(
                &[("a.test", "/"), ("a.test", "/ws")],
                Routing::Ingress {
                    class: "c".into(),
                    profile: Some(profile),
                },
            )
        };
        let service_says =
            |o: &RunObjects| service(o, "echo").metadata.annotations.unwrap_or_default();
        let ingress_says = |o: &RunObjects| {
            let all = routes::render(o, None, &Default::default());
            serde_json::from_value::<BTreeMap<String, String>>(
                all.last().unwrap()["metadata"]["annotations"].clone(),
            )
            .unwrap_or_default()
        };
        // gRPC: h2c to the backends, on the Service (or ingress-nginx's Ingress).
        for (profile, key, value) in [
            (
                &routes::traefik::PROFILE,
                "traefik.ingress.kubernetes.io/service.serversscheme",
                "h2c",
            ),
            (
                &routes::contour::PROFILE,
                "projectcontour.io/upstream-protocol.h2c",
                "80",
            ),
            (
                &routes::haproxy_ingress::PROFILE,
                "haproxy-ingress.github.io/backend-protocol",
                "h2",
            ),
        ] {
            let grpc = with(profile, Traffic::Grpc);
            assert_eq!(service_says(&grpc)[key], value, "{}", profile.name);
            assert!(service_says(&with(profile, Traffic::Http)).is_empty());
        }
        let port = |o: &RunObjects| service(o, "echo").spec.unwrap().ports.unwrap()[0].clone();
        assert_eq!(
            port(&with(&routes::traefik::PROFILE, Traffic::Grpc))
                .app_protocol
                .as_deref(),
            Some("kubernetes.io/h2c")
        );
        assert!(port(&with(&routes::traefik::PROFILE, Traffic::Http))
            .app_protocol
            .is_none());
        let nginx = with(&routes::ingress_nginx::PROFILE, Traffic::Grpc);
        assert!(service_says(&nginx).is_empty());
        assert_eq!(
            ingress_says(&nginx)["nginx.ingress.kubernetes.io/backend-protocol"],
            "GRPC"
        );
        // Contour's HTTPProxies (a run with route changes) reach the same Service.
        let contour = with(&routes::contour::PROFILE, Traffic::Grpc);
        let proxies = routes::render(&contour, Some(1), &Default::default());
        assert_eq!(proxies[0]["kind"], "HTTPProxy");
        assert_eq!(
            proxies[0]["spec"]["routes"][0]["services"][0]["name"],
            "echo"
        );
        assert!(ingress_says(&with(&routes::traefik::PROFILE, Traffic::Grpc)).is_empty());
    }
}
