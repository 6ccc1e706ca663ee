//! `cluster check`: everything a run needs from a cluster, asked before anything is made.
//! The API answers (and its version); every verb the run uses is allowed
//! (SelfSubjectAccessReview); each target's IngressClass exists; each address answers.
//! Each failure names its fix.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::IngressClass;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::file::{ClusterFile, ClusterTarget, GatewayRef, ServiceRef};
use crate::ClusterError;

/// How long one question to the API may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an address may take to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The verbs a run uses: (API group, resource or `resource/subresource`, verb).
/// deploy/rbac.yaml grants exactly these.
pub const NEEDED: &[(&str, &str, &str)] = &[
    ("", "namespaces", "create"),
    ("", "namespaces", "delete"),
    ("", "namespaces", "list"),
    ("", "namespaces", "patch"),
    ("", "pods", "list"),
    ("", "pods", "get"),
    ("", "pods", "delete"),
    ("", "pods/log", "get"),
    ("", "pods/proxy", "create"),
    ("", "secrets", "create"),
    ("", "services", "create"),
    ("", "services", "get"),
    ("apps", "deployments", "create"),
    ("apps", "deployments/scale", "patch"),
    ("batch", "jobs", "create"),
    ("batch", "jobs", "delete"),
    ("discovery.k8s.io", "endpointslices", "list"),
    ("discovery.k8s.io", "endpointslices", "watch"),
    ("gateway.networking.k8s.io", "gatewayclasses", "get"),
    ("gateway.networking.k8s.io", "gateways", "get"),
    ("gateway.networking.k8s.io", "httproutes", "create"),
    ("gateway.networking.k8s.io", "httproutes", "delete"),
    (
        "gateway.networking.k8s.io",
        "httproutes",
        "deletecollection",
    ),
    ("gateway.networking.k8s.io", "httproutes", "get"),
    ("gateway.networking.k8s.io", "httproutes", "patch"),
    ("gateway.networking.k8s.io", "grpcroutes", "create"),
    ("gateway.networking.k8s.io", "grpcroutes", "get"),
    ("gateway.networking.k8s.io", "grpcroutes", "patch"),
    ("gateway.networking.k8s.io", "backendtlspolicies", "create"),
    ("gateway.networking.k8s.io", "backendtlspolicies", "patch"),
    ("networking.k8s.io", "ingresses", "create"),
    ("networking.k8s.io", "ingresses", "delete"),
    ("networking.k8s.io", "ingresses", "deletecollection"),
    ("networking.k8s.io", "ingresses", "patch"),
    ("networking.k8s.io", "ingressclasses", "get"),
    ("projectcontour.io", "httpproxies", "create"),
    ("projectcontour.io", "httpproxies", "delete"),
    ("projectcontour.io", "httpproxies", "patch"),
    ("traefik.io", "middlewares", "create"),
    ("traefik.io", "middlewares", "delete"),
    ("traefik.io", "middlewares", "deletecollection"),
    ("traefik.io", "middlewares", "patch"),
    ("traefik.io", "serverstransports", "create"),
    ("traefik.io", "serverstransports", "delete"),
    ("traefik.io", "serverstransports", "patch"),
];

/// One thing checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// What was checked.
    pub what: String,
    /// Whether it holds.
    pub ok: bool,
    /// What was seen, and for a failure the fix.
    pub detail: String,
}

fn finding(what: impl Into<String>, ok: bool, detail: impl Into<String>) -> Finding {
    Finding {
        what: what.into(),
        ok,
        detail: detail.into(),
    }
}

/// Checks `file`'s cluster (through `kubeconfig`): every finding, failures included. When
/// the API does not answer, that is the only finding.
pub async fn check(file: &ClusterFile, kubeconfig: &Path) -> Vec<Finding> {
    let mut out = Vec::new();
    let context = file.context.as_deref();
    let client = match crate::api::client(kubeconfig, context).await {
        Ok(c) => c,
        Err(e) => {
            out.push(finding(
                "kubeconfig",
                false,
                format!("{e}; point KUBECONFIG (or --kubeconfig) at the cluster's, and --context at the right context"),
            ));
            return out;
        }
    };
    match ask(client.apiserver_version()).await {
        Ok(v) => out.push(finding(
            "API",
            true,
            format!("answers, Kubernetes {}", v.git_version),
        )),
        Err(e) => {
            out.push(finding("API", false, api_fix(&e)));
            return out;
        }
    }
    out.push(verbs(&client).await);
    for (name, target) in &file.targets {
        out.push(match (&target.ingress_class, &target.gateway) {
            (Some(class), _) => ingress_class(&client, name, class).await,
            (None, Some(gateway)) => gateway_finding(&client, name, gateway).await,
            (None, None) => finding(name.as_str(), false, "neither ingress_class nor gateway"),
        });
        out.push(address(&client, name, target).await);
        if let Some(ca) = &target.ca {
            out.push(ca_finding(name, ca));
        }
        if let Some(secret) = &target.mesh_client {
            out.push(mesh_client_finding(&client, name, secret).await);
        }
        if let Some(pods) = target.counters.as_ref().and_then(|c| c.pods.as_ref()) {
            let what = format!("{name}: counters");
            out.push(match crate::counters::read_once(&client, pods).await {
                Ok(found) => finding(what, true, found),
                Err(e) => finding(what, false, e),
            });
        }
        if let Some(usage) = &target.usage {
            for (part, pods) in [("controller", &usage.controller), ("proxy", &usage.proxy)] {
                if let Some(pods) = pods {
                    let what = format!("{name}: usage.{part}");
                    out.push(match crate::usage::read_once(&client, pods).await {
                        Ok(found) => finding(what, true, found),
                        Err(e) => finding(what, false, e),
                    });
                }
            }
        }
    }
    out
}

/// Whether the run can read the `ca.crt` of a target's `mesh_client` Secret (the CA of
/// the client certificate its controller presents to a mesh's sidecars). Reading it is
/// granted for that one Secret, not by deploy/rbac.yaml: the fix says how.
async fn mesh_client_finding(client: &Client, target: &str, secret: &ServiceRef) -> Finding {
    let what = format!("{target}: mesh_client");
    let (ns, name) = (&secret.namespace, &secret.name);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ns);
    match ask(secrets.get_opt(name)).await {
        Ok(Some(s)) if s.data.as_ref().is_some_and(|d| d.contains_key("ca.crt")) => {
            finding(what, true, format!("secret {ns}/{name} has ca.crt"))
        }
        Ok(Some(_)) => finding(
            what,
            false,
            format!("secret {ns}/{name} has no ca.crt; the sidecars need the CA of the controller's client certificate there"),
        ),
        Ok(None) => finding(
            what,
            false,
            format!("no secret {ns}/{name}; name the Secret of the controller's client certificate (Contour: tls.envoy-client-certificate), or drop mesh_client"),
        ),
        Err(e) if e.contains("403") => finding(
            what,
            false,
            format!("{e}: a run reads this one Secret's ca.crt; grant it with: kubectl create role ingressbench-mesh-client -n {ns} --verb=get --resource=secrets --resource-name={name} && kubectl create rolebinding ingressbench-mesh-client -n {ns} --role=ingressbench-mesh-client --serviceaccount=ingressbench-system:ingressbench"),
        ),
        Err(e) => finding(what, false, e),
    }
}

/// Whether a gateway target's `ca:` is a PEM certificate the run can trust.
fn ca_finding(target: &str, ca: &std::path::Path) -> Finding {
    let what = format!("{target}: ca");
    match std::fs::read_to_string(ca) {
        Ok(text) if text.contains("-----BEGIN CERTIFICATE-----") => {
            finding(what, true, format!("{} is a PEM certificate", ca.display()))
        }
        Ok(_) => finding(
            what,
            false,
            format!(
                "{} holds no PEM certificate; give the CA certificate that signed the Gateway's HTTPS listener certificate",
                ca.display()
            ),
        ),
        Err(e) => finding(
            what,
            false,
            format!(
                "{}: {e}; give the CA certificate (PEM) that signed the Gateway's HTTPS listener certificate",
                ca.display()
            ),
        ),
    }
}

/// Runs one API call with [`ASK_TIMEOUT`].
async fn ask<T>(
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(ASK_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(describe(&e)),
        Err(_) => Err(format!("no answer within {ASK_TIMEOUT:?}")),
    }
}

fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 401 => {
            "the API refused the credentials (401 Unauthorized)".into()
        }
        kube::Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        other => other.to_string(),
    }
}

fn api_fix(e: &str) -> String {
    if e.contains("403") {
        format!("{e}: the API answers but this identity may not even read its version; grant what a run needs with: kubectl apply -f deploy/rbac.yaml")
    } else if e.contains("401") {
        format!("{e}: the token or certificate in the kubeconfig is not valid for this cluster; get a fresh one (kubectl create token ingressbench -n ingressbench-system, after kubectl apply -f deploy/rbac.yaml)")
    } else {
        format!("{e}: is the API server running, and is the kubeconfig's `server` its address?")
    }
}

async fn verbs(client: &Client) -> Finding {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut denied = Vec::new();
    for (group, resource, verb) in NEEDED {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        let review: SelfSubjectAccessReview = match serde_json::from_value(serde_json::json!({
            "spec": { "resourceAttributes": { "group": group, "resource": resource, "subresource": subresource, "verb": verb } }
        })) {
            Ok(r) => r,
            Err(e) => return finding("permissions", false, e.to_string()),
        };
        match ask(reviews.create(&PostParams::default(), &review)).await {
            Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => denied.push(format!(
                "{verb} {}{}",
                qualified(group, resource),
                if subresource.is_empty() {
                    String::new()
                } else {
                    format!("/{subresource}")
                }
            )),
            Err(e) => return finding("permissions", false, format!("cannot ask the API: {e}")),
        }
    }
    if denied.is_empty() {
        finding(
            "permissions",
            true,
            format!("all {} verbs a run uses are allowed", NEEDED.len()),
        )
    } else {
        finding(
            "permissions",
            false,
            format!(
                "not allowed to {}; grant them with: kubectl apply -f deploy/rbac.yaml (and use the ingressbench service account's token)",
                denied.join(", ")
            ),
        )
    }
}

fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

async fn ingress_class(client: &Client, target: &str, class: &str) -> Finding {
    let what = format!("{target}: ingress class");
    let classes: Api<IngressClass> = Api::all(client.clone());
    match ask(classes.get_opt(class)).await {
        Ok(Some(c)) => finding(
            what,
            true,
            format!(
                "`{class}` exists (controller {})",
                c.spec.and_then(|s| s.controller).unwrap_or_default()
            ),
        ),
        Ok(None) => {
            let known = ask(classes.list(&Default::default()))
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .filter_map(|c| c.metadata.name.clone())
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            finding(
                what,
                false,
                format!(
                    "no IngressClass `{class}` (there are: {}); install the controller that serves it, or correct targets.{target}.ingress_class",
                    if known.is_empty() { "none" } else { &known }
                ),
            )
        }
        Err(e) => finding(what, false, e),
    }
}

async fn gateway_finding(client: &Client, target: &str, gateway: &GatewayRef) -> Finding {
    let what = format!("{target}: gateway");
    match tokio::time::timeout(
        ASK_TIMEOUT,
        crate::routes::gateway::controller_of(client, gateway),
    )
    .await
    {
        Ok(Ok(controller)) => finding(
            what,
            true,
            format!("{gateway} exists (controller {controller})"),
        ),
        Ok(Err(e)) => finding(what, false, e),
        Err(_) => finding(what, false, format!("no answer within {ASK_TIMEOUT:?}")),
    }
}

async fn address(client: &Client, target: &str, t: &ClusterTarget) -> Finding {
    let what = format!("{target}: address");
    let url = match (&t.address, &t.service) {
        (Some(a), _) => a.clone(),
        (None, Some(s)) => match service_addresses(client, s).await {
            Ok((http, https)) => http.or(https).unwrap_or_default(),
            Err(e) => {
                return finding(
                    what,
                    false,
                    format!("{e}; correct targets.{target}.service or give `address`"),
                )
            }
        },
        (None, None) => return finding(what, false, "neither address nor service"),
    };
    match host_port(&url) {
        Some((host, port)) => {
            let dial = tokio::net::TcpStream::connect((host.as_str(), port));
            match tokio::time::timeout(CONNECT_TIMEOUT, dial).await {
                Ok(Ok(_)) => finding(what, true, format!("{url} accepts connections")),
                Ok(Err(e)) => finding(
                    what,
                    false,
                    format!("{url}: {e}; is the controller running and exposed there?"),
                ),
                Err(_) => finding(
                    what,
                    false,
                    format!("{url}: no answer within {CONNECT_TIMEOUT:?}; a firewall, or the wrong address?"),
                ),
            }
        }
        None => finding(what, false, format!("{url} is not http://host[:port]")),
    }
}

/// The addresses a LoadBalancer Service gives its controller: `http://HOST:PORT` from
/// the port named `http` or `web` (or port 80), `https://HOST:PORT` from `https` or
/// `websecure` (or 443), HOST the first address in its status; a Service with one port
/// that is neither gives it as plain HTTP. At least one, or why not.
pub async fn service_addresses(
    client: &Client,
    s: &ServiceRef,
) -> Result<(Option<String>, Option<String>), String> {
    let services: Api<Service> = Api::namespaced(client.clone(), &s.namespace);
    let svc = ask(services.get_opt(&s.name))
        .await?
        .ok_or_else(|| format!("no Service {}/{}", s.namespace, s.name))?;
    let host = svc
        .status
        .and_then(|st| st.load_balancer)
        .and_then(|lb| lb.ingress)
        .and_then(|i| i.into_iter().next())
        .and_then(|i| i.ip.or(i.hostname))
        .ok_or_else(|| {
            format!(
                "Service {}/{} has no LoadBalancer address yet; wait for the cloud to give it one",
                s.namespace, s.name
            )
        })?;
    let ports = svc.spec.and_then(|sp| sp.ports).unwrap_or_default();
    let find = |names: [&str; 2], number: i32| {
        ports
            .iter()
            .find(|p| p.name.as_deref().is_some_and(|n| names.contains(&n)) || p.port == number)
            .map(|p| p.port)
    };
    let mut http = find(["http", "web"], 80).map(|p| format!("http://{host}:{p}"));
    let https = find(["https", "websecure"], 443).map(|p| format!("https://{host}:{p}"));
    if let ([only], None, None) = (&ports[..], &http, &https) {
        http = Some(format!("http://{host}:{}", only.port));
    }
    if http.is_none() && https.is_none() {
        return Err(format!(
            "Service {}/{} has no port named http, web, https or websecure (nor 80 or 443)",
            s.namespace, s.name
        ));
    }
    Ok((http, https))
}

/// The plain and TLS addresses the LoadBalancer Service `service` gives its controller
/// (see [`service_addresses`]).
pub fn lookup_service(
    api: &crate::api::ClusterApi,
    service: &crate::file::ServiceRef,
) -> Result<(Option<String>, Option<String>), ClusterError> {
    api.run(async {
        let client = api.client();
        service_addresses(&client, service)
            .await
            .map_err(ClusterError::Api)
    })
}

/// `http://host[:port]/…` → (host, port), parsed as the load generator parses URLs.
fn host_port(url: &str) -> Option<(String, u16)> {
    ingressbench_load::Target::parse(url)
        .ok()
        .map(|t| (t.host, t.port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateway_ca_must_be_a_pem_certificate_there() {
        let dir = std::env::temp_dir().join(format!("ib-check-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (good, bad) = (dir.join("ca.pem"), dir.join("key.pem"));
        std::fs::write(
            &good,
            "-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        std::fs::write(&bad, "-----BEGIN PRIVATE KEY-----\n").unwrap();
        let (ok, wrong, missing) = (
            ca_finding("g", &good),
            ca_finding("g", &bad),
            ca_finding("g", &dir.join("none.pem")),
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(ok.ok, "{}", ok.detail);
        assert!(!wrong.ok && wrong.detail.contains("holds no PEM certificate"));
        assert!(!missing.ok && missing.detail.contains("give the CA certificate"));
        assert_eq!(missing.what, "g: ca");
    }

    #[test]
    fn addresses_give_host_and_port() {
        assert_eq!(host_port("http://a.test"), Some(("a.test".into(), 80)));
        assert_eq!(host_port("https://a.test/x"), Some(("a.test".into(), 443)));
        assert_eq!(
            host_port("http://127.0.0.1:8080/"),
            Some(("127.0.0.1".into(), 8080))
        );
        assert_eq!(host_port("ftp://x"), None);
    }

    #[test]
    fn the_shipped_rbac_grants_exactly_the_verbs_a_run_uses() {
        use serde::Deserialize;
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/rbac.yaml");
        let text = std::fs::read_to_string(path).unwrap();
        let mut granted: Vec<(String, String, String)> = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v = serde_yaml_ng::Value::deserialize(doc).unwrap();
            if v["kind"] != "ClusterRole" {
                continue;
            }
            for rule in v["rules"].as_sequence().unwrap() {
                let list = |k: &str| -> Vec<String> {
                    rule[k]
                        .as_sequence()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_str().unwrap().to_owned())
                        .collect()
                };
                for g in list("apiGroups") {
                    for r in list("resources") {
                        for verb in list("verbs") {
                            granted.push((g.clone(), r.clone(), verb));
                        }
                    }
                }
            }
        }
        granted.sort();
        let mut needed: Vec<(String, String, String)> = NEEDED
            .iter()
            .map(|(g, r, v)| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
            .collect();
        needed.sort();
        assert_eq!(granted, needed);
    }
}
