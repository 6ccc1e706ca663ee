//! Envoy Gateway as the local cluster's fourth controller, installed the way its users
//! install it: `helm install` of its own chart (`scripts/controllers.sh` builds Helm and
//! the chart of each version). Its controller, its certgen Job and the data plane it makes
//! for the Gateway [`GATEWAY`] (Envoy and its shutdown manager) are pods the node agent
//! runs from the staged images (`gateway:vX`, the built controller; `envoy`, the lab's
//! Envoy); the data plane's LoadBalancer Service gets an address of its own (127.1.B.N) as
//! kind's cloud provider gives one.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{condition_true, envoy_gateway_chart, helm, LocalCluster, ENVOY_GATEWAY_VERSIONS};
use crate::ClusterError;

/// The namespace its chart installs into, and where the Gateway lives.
pub const NAMESPACE: &str = "envoy-gateway-system";
/// The Secret with the client certificate its Gateway presents to backends over TLS
/// (`tls.backend.clientCertificateRef`); the cluster file names it as `mesh_client`.
pub(super) const MESH_CLIENT_SECRET: (&str, &str) = (super::MESH_CLIENT, NAMESPACE);
/// The local cluster's Envoy Gateway Gateway: name, namespace and plain HTTP listener.
pub const GATEWAY: (&str, &str, &str) = ("eg", NAMESPACE, "http");
/// Its HTTPS listener.
pub const GATEWAY_TLS_LISTENER: &str = "https";
/// Its GatewayClass.
pub const CLASS: &str = "envoy-gateway";
/// The Helm release.
const RELEASE: &str = "eg";
/// How long the chart's install may take (the controller's image is local: seconds).
const INSTALL_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the Gateway may take to be programmed with an address.
const PROGRAMMED_TIMEOUT: Duration = Duration::from_secs(90);
/// The label Envoy Gateway puts on its data plane's pods: the Gateway they serve.
pub const OWNING_GATEWAY_LABEL: &str = "gateway.envoyproxy.io/owning-gateway-name";
/// Where its Envoy pods serve their Prometheus statistics (`/stats/prometheus`), and its
/// controller pod its own metrics (`/metrics`).
pub const METRICS_PORT: u16 = 19001;

/// Envoy Gateway of one version, from the cache.
#[derive(Clone, Debug)]
pub struct EnvoyGatewayOptions {
    /// Its release (`1.9.1`).
    pub version: String,
    /// Helm.
    pub helm: PathBuf,
    /// Its chart.
    pub chart: PathBuf,
}

impl EnvoyGatewayOptions {
    /// The newest version built in the cache (chart and controller binary), with Helm.
    pub fn discover() -> Option<Self> {
        let version = ENVOY_GATEWAY_VERSIONS.iter().rev().find(|v| built(v))?;
        Self::of(version)
    }

    /// Version `version`, if it is built in the cache, with Helm.
    pub fn of(version: &str) -> Option<Self> {
        let helm = helm();
        (built(version) && helm.is_file()).then(|| Self {
            version: version.to_owned(),
            chart: envoy_gateway_chart(version),
            helm,
        })
    }
}

/// Whether version `version`'s chart and controller binary are in the cache.
fn built(version: &str) -> bool {
    let chart = envoy_gateway_chart(version);
    chart.join("Chart.yaml").is_file() && chart.with_file_name("envoy-gateway").is_file()
}

impl LocalCluster {
    /// Installs Envoy Gateway's chart and waits for it (`helm install --wait`), then makes
    /// its GatewayClass and the Gateway [`GATEWAY`] (plain HTTP on 80, HTTPS on 443 with
    /// `secret`'s certificate, and [`MESH_CLIENT_SECRET`]'s client certificate for the
    /// backends it reaches over TLS, as a mesh's sidecars ask) and waits until the Gateway
    /// is programmed at an address that answers. Returns where it takes plain HTTP and
    /// HTTPS.
    pub(super) fn start_envoy_gateway(
        &mut self,
        options: &EnvoyGatewayOptions,
        secret: &Value,
    ) -> Result<[SocketAddr; 2], ClusterError> {
        let started = Instant::now();
        let timeout = format!("{}s", INSTALL_TIMEOUT.as_secs());
        let chart = options.chart.display().to_string();
        self.helm(
            options,
            &[
                "install",
                RELEASE,
                &chart,
                "--namespace",
                NAMESPACE,
                "--create-namespace",
                // Its webhook sets a pod's zone from its node's labels: nodes here have none.
                "--set",
                "topologyInjector.enabled=false",
                "--wait",
                "--timeout",
                &timeout,
            ],
        )?;
        let (name, namespace, listener) = GATEWAY;
        let mut secret = secret.clone();
        secret["metadata"]["namespace"] = json!(namespace);
        let secret_name = secret["metadata"]["name"].clone();
        let all = json!({ "namespaces": { "from": "All" } });
        let objects = [
            json!({
                "apiVersion": crate::routes::gateway::API_VERSION, "kind": "GatewayClass",
                "metadata": { "name": CLASS },
                "spec": { "controllerName": "gateway.envoyproxy.io/gatewayclass-controller" },
            }),
            secret,
            self.mesh_client_secret(MESH_CLIENT_SECRET.1)?,
            json!({
                "apiVersion": crate::routes::gateway::API_VERSION, "kind": "Gateway",
                "metadata": { "name": name, "namespace": namespace },
                "spec": { "gatewayClassName": CLASS, "listeners": [
                    { "name": listener, "port": 80, "protocol": "HTTP", "allowedRoutes": all },
                    { "name": GATEWAY_TLS_LISTENER, "port": 443, "protocol": "HTTPS", "allowedRoutes": all,
                      "tls": { "mode": "Terminate", "certificateRefs": [{ "name": secret_name }] } },
                  ],
                  "tls": { "backend": { "clientCertificateRef": { "name": MESH_CLIENT_SECRET.0 } } },
                },
            }),
            // HTTP/3 on the HTTPS listener, as its users turn it on: Envoy Gateway adds
            // UDP 443 to its data plane's Service, which the node agent's load balancer
            // relays.
            json!({
                "apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "ClientTrafficPolicy",
                "metadata": { "name": "http3", "namespace": namespace },
                "spec": {
                    "targetRefs": [{ "group": "gateway.networking.k8s.io", "kind": "Gateway", "name": name }],
                    "http3": {},
                },
            }),
        ];
        let runtime = crate::api::runtime()?;
        runtime.block_on(crate::api::apply_all(&self.kubeconfig, &objects))?;
        let ip = runtime.block_on(self.gateway_programmed(name, namespace))?;
        let at = [SocketAddr::new(ip, 80), SocketAddr::new(ip, 443)];
        // Programmed is the controller's word; the address answers once its Envoy has
        // the listener (404: no route yet).
        let deadline = Instant::now() + PROGRAMMED_TIMEOUT;
        while !answers(at[0]) {
            if Instant::now() > deadline {
                return Err(ClusterError::Api(format!(
                    "Envoy Gateway's Gateway {namespace}/{name} is programmed at {} but nothing answers there after {PROGRAMMED_TIMEOUT:?}; its pods: kubectl -n {NAMESPACE} get pods",
                    at[0]
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let data_plane = runtime.block_on(self.data_plane(name))?;
        self.envoy_gateway = Some(EnvoyGatewayInstalled {
            version: options.version.clone(),
            at,
            took: started.elapsed(),
            data_plane,
            helm: options.helm.clone(),
        });
        Ok(at)
    }

    /// Runs Helm on this cluster; an error gives its output's end.
    fn helm(&self, options: &EnvoyGatewayOptions, args: &[&str]) -> Result<(), ClusterError> {
        let out = Command::new(&options.helm)
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            // Its caches and settings in the cluster's directory, not the user's.
            .env("HELM_CACHE_HOME", self.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.join("helm/data"))
            .output()
            .map_err(|e| super::io(&options.helm, e))?;
        if out.status.success() {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = said.lines().rev().take(10).collect();
        Err(ClusterError::Api(format!(
            "helm {} of Envoy Gateway {} failed ({}): {}; its pods: kubectl -n {NAMESPACE} get pods",
            args[0],
            options.version,
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        )))
    }

    /// The Deployment Envoy Gateway made for Gateway `gateway`'s data plane.
    async fn data_plane(&self, gateway: &str) -> Result<String, ClusterError> {
        use k8s_openapi::api::apps::v1::Deployment;
        let client = crate::api::client(&self.kubeconfig, None).await?;
        let api: kube::Api<Deployment> = kube::Api::namespaced(client, NAMESPACE);
        let selector = format!("{OWNING_GATEWAY_LABEL}={gateway}");
        let list = api
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .map_err(|e| ClusterError::Api(format!("listing Envoy Gateway's data plane: {e}")))?;
        list.items
            .into_iter()
            .find_map(|d| d.metadata.name)
            .ok_or_else(|| {
                ClusterError::Api(format!(
                    "Envoy Gateway made no Deployment labelled {selector} for its Gateway"
                ))
            })
    }

    /// Waits until Gateway `namespace/name` is Programmed with an address; returns it.
    async fn gateway_programmed(
        &self,
        name: &str,
        namespace: &str,
    ) -> Result<std::net::IpAddr, ClusterError> {
        let client = crate::api::client(&self.kubeconfig, None).await?;
        let started = Instant::now();
        loop {
            let gateway = crate::api::get(
                &client,
                crate::routes::gateway::API_VERSION,
                "Gateway",
                Some(namespace),
                name,
            )
            .await?
            .unwrap_or_default();
            let address = gateway["status"]["addresses"][0]["value"]
                .as_str()
                .and_then(|a| a.parse().ok());
            if let (true, Some(ip)) = (condition_true(&gateway, "Programmed"), address) {
                return Ok(ip);
            }
            if started.elapsed() > PROGRAMMED_TIMEOUT {
                return Err(ClusterError::Api(format!(
                    "Envoy Gateway did not program Gateway {namespace}/{name} within {PROGRAMMED_TIMEOUT:?} (its status: {}); its pods: kubectl -n {NAMESPACE} get pods",
                    gateway["status"]
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Envoy Gateway as installed.
#[derive(Clone, Debug)]
pub struct EnvoyGatewayInstalled {
    /// Its release.
    pub version: String,
    /// Where its Gateway takes plain HTTP and HTTPS.
    pub at: [SocketAddr; 2],
    /// How long the install took, to the Gateway answering.
    pub took: Duration,
    /// The Deployment of its data plane (Envoy and the shutdown manager).
    pub data_plane: String,
    /// The Helm that installed it.
    pub helm: PathBuf,
}

impl EnvoyGatewayInstalled {
    /// How the cluster file's target upgrades it: `helm upgrade` to the cached chart of
    /// the event's version, following the controller's Deployment and then its data
    /// plane's, which the new controller rolls.
    pub fn upgrade_via(&self) -> String {
        let chart = envoy_gateway_chart("{version}");
        format!(
            "upgrade: {{ helm: {{ release: {RELEASE}, namespace: {NAMESPACE}, chart: \"{}\", binary: \"{}\" }}, follow: [{{ deployment: envoy-gateway, namespace: {NAMESPACE} }}, {{ deployment: {}, namespace: {NAMESPACE} }}] }}",
            chart.display(),
            self.helm.display(),
            self.data_plane
        )
    }
}

/// Whether an HTTP request to `at` gets any answer.
fn answers(at: SocketAddr) -> bool {
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&at, Duration::from_secs(1)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    let request = ingressbench_lab::http1::Request::get("listener.invalid", "/");
    ingressbench_lab::http1::exchange(
        &mut stream,
        &request,
        ingressbench_lab::http1::Until::Status,
    )
    .is_ok()
}
