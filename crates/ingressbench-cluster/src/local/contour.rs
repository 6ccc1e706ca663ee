//! Contour with Envoy as the local cluster's second ingress controller, run as processes
//! beside the control plane as Contour's docs allow (`contour serve` outside the cluster,
//! Envoy bootstrapped by `contour bootstrap`): IngressClass `contour` and, through the
//! Gateway API, the Gateway [`GATEWAY`] (Contour's static provisioning: its config names
//! the Gateway). Both take traffic on one Envoy listener.
//!
//! Contour makes an Envoy listener only once some route uses it, and a Gateway
//! listener's Envoy port is its port + 8000; the local cluster keeps one placeholder
//! Ingress (host `listener.invalid`, a Service without endpoints: 503) so that the
//! address answers before a run's routes exist, as a cloud load balancer's would.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::restart::Ready;
use super::{free_port, io, Files, LocalCluster, API_READY_TIMEOUT};
use crate::ClusterError;

/// The Contour release `scripts/controllers.sh` builds.
pub const CONTOUR_VERSION: &str = "1.33.8";
/// Contour's identity (a token), bound to what it reads and reports on.
pub(super) const USER: &str = "ingressbench:contour";
/// The local cluster's Contour Gateway: name, namespace and plain HTTP listener.
pub const GATEWAY: (&str, &str, &str) = ("contour", "projectcontour", "web");
/// Its HTTPS listener for HTTPRoutes.
pub const GATEWAY_TLS_LISTENER: &str = "websecure";
/// The namespace Contour's own objects live in.
const NAMESPACE: &str = "projectcontour";

/// The Secret (in Contour's namespace) with the client certificate its Envoy presents to
/// every upstream that asks for one (`tls.envoy-client-certificate`), as OSM gives Contour
/// one to reach the pods of its mesh; the cluster file names it as `mesh_client`.
pub(super) const MESH_CLIENT_SECRET: (&str, &str) = (super::MESH_CLIENT, NAMESPACE);
/// A Gateway listener's port + this is where Contour has Envoy listen.
const ENVOY_PORT_OFFSET: u16 = 8000;

/// Contour and Envoy for the local cluster.
#[derive(Clone, Debug)]
pub struct ContourOptions {
    /// Contour's binary.
    pub binary: PathBuf,
    /// Its CRDs (`examples/contour/01-crds.yaml` of its module).
    pub crds: PathBuf,
    /// Envoy's binary.
    pub envoy: PathBuf,
    /// Where Envoy takes plain HTTP on 127.0.0.1 (0: free ones; at least 8001); HTTPS on
    /// the next port.
    pub http_port: u16,
}

impl ContourOptions {
    /// Contour from the cache `scripts/controllers.sh` fills, Envoy from the lab's places.
    pub(super) fn discover(cache: &Path) -> Option<Self> {
        let dir = cache.join(format!("contour/v{CONTOUR_VERSION}"));
        let envoy = ingressbench_lab::proxy::Binaries::discover()
            .locate(ingressbench_lab::proxy::ProxyKind::Envoy)
            .ok()?;
        (dir.join("contour").is_file() && dir.join("crds.yaml").is_file()).then(|| Self {
            binary: dir.join("contour"),
            crds: dir.join("crds.yaml"),
            envoy,
            http_port: 0,
        })
    }
}

impl LocalCluster {
    /// Installs Contour's kinds, identity, classes and Gateway, starts Contour (with its
    /// own token) and Envoy, and waits until Envoy takes connections where the cluster
    /// file says. Needs the Gateway API's kinds in place.
    pub(super) fn start_contour(
        &mut self,
        options: &ContourOptions,
        files: &Files,
        gateway_secret: &Value,
    ) -> Result<(), ClusterError> {
        let runtime = super::runtime()?;
        let crds = super::read_yaml(&options.crds)?;
        let names = super::crd_names(&crds);
        runtime.block_on(crate::api::apply_all(&self.kubeconfig, &crds))?;
        runtime.block_on(self.wait_established(&names))?;
        // Envoy's ports: plain HTTP and HTTPS (Contour serves every HTTPS listener of its
        // Gateway, and every Ingress's TLS, on one Envoy listener per port).
        let envoy_ports = match options.http_port {
            0 => {
                let mut ports = [0; 2];
                for p in &mut ports {
                    *p = (0..20)
                        .map(|_| free_port())
                        .find(|p| p.as_ref().map_or(true, |p| *p > ENVOY_PORT_OFFSET))
                        .unwrap_or_else(free_port)?;
                }
                ports
            }
            p => [p, p.saturating_add(1)],
        };
        let listener_port = |envoy_port: u16| {
            envoy_port.checked_sub(ENVOY_PORT_OFFSET).filter(|p| *p > 0).ok_or_else(|| {
            ClusterError::Api(format!(
                "Contour's Envoy port {envoy_port} is too low: Contour listens on a Gateway listener's port + {ENVOY_PORT_OFFSET}; give one above {ENVOY_PORT_OFFSET}"
            ))
        })
        };
        let listener_ports = [
            listener_port(envoy_ports[0])?,
            listener_port(envoy_ports[1])?,
        ];
        let mut objects = objects(listener_ports, gateway_secret);
        objects.push(self.mesh_client_secret(MESH_CLIENT_SECRET.1)?);
        runtime.block_on(crate::api::apply_all(&self.kubeconfig, &objects))?;
        // Contour, with its own kubeconfig and a config naming its Gateway.
        let kubeconfig = self.dir.join("contour.kubeconfig");
        files.kubeconfig(&kubeconfig, &self.server, &files.contour_token)?;
        let (admin, xds, health) = (free_port()?, free_port()?, free_port()?);
        let config = self.dir.join("contour.yaml");
        let (name, namespace, _) = GATEWAY;
        std::fs::write(
            &config,
            format!(
                "gateway:\n  gatewayRef: {{ name: {name}, namespace: {namespace} }}\nnetwork:\n  admin-port: {admin}\ntls:\n  envoy-client-certificate: {{ name: {}, namespace: {} }}\n",
                MESH_CLIENT_SECRET.0, MESH_CLIENT_SECRET.1
            ),
        )
        .map_err(|e| io(&config, e))?;
        let port = |p: u16| p.to_string();
        let mut args: Vec<String> = [
            "serve",
            "--no-incluster",
            "--insecure",
            "--disable-leader-election",
            "--ingress-class-name=contour",
            "--xds-address=127.0.0.1",
            "--envoy-service-http-address=127.0.0.1",
            "--envoy-service-https-address=127.0.0.1",
            "--stats-address=127.0.0.1",
            "--http-address=127.0.0.1",
            "--health-address=127.0.0.1",
            "--debug-http-address=127.0.0.1",
        ]
        .map(str::to_owned)
        .to_vec();
        for (flag, value) in [
            ("--kubeconfig", kubeconfig.display().to_string()),
            ("--config-path", config.display().to_string()),
            ("--xds-port", port(xds)),
            ("--envoy-service-http-port", port(envoy_ports[0])),
            ("--envoy-service-https-port", port(envoy_ports[1])),
            ("--stats-port", port(free_port()?)),
            ("--http-port", port(free_port()?)),
            ("--health-port", port(health)),
            ("--debug-http-port", port(free_port()?)),
        ] {
            args.push(format!("{flag}={value}"));
        }
        let contour = self.start("contour", &options.binary, &args)?;
        self.parts.push(contour);
        let local = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        self.restartable("contour", Ready::Http(local(health), "/healthz"));
        // Envoy, bootstrapped by Contour to fetch everything from it.
        let bootstrap = self.dir.join("envoy.json");
        let made = std::process::Command::new(&options.binary)
            .arg("bootstrap")
            .arg(&bootstrap)
            .args([
                "--xds-address=127.0.0.1",
                &format!("--xds-port={xds}"),
                "--xds-resource-version=v3",
                &format!(
                    "--admin-address={}",
                    self.dir.join("envoy-admin.sock").display()
                ),
            ])
            .output()
            .map_err(|e| io(&options.binary, e))?;
        if !made.status.success() {
            return Err(ClusterError::Api(format!(
                "contour bootstrap: {}",
                String::from_utf8_lossy(&made.stderr).trim()
            )));
        }
        // Envoy's parser takes `--flag value`, never `--flag=value`.
        let args = [
            "-c",
            &bootstrap.display().to_string(),
            "--use-dynamic-base-id",
            "--service-cluster",
            NAMESPACE,
            "--service-node",
            "envoy",
            "--log-level",
            "warn",
        ]
        .map(str::to_owned);
        let envoy = self.start("contour-envoy", &options.envoy, &args)?;
        self.parts.push(envoy);
        let at = local(envoy_ports[0]);
        self.restartable("contour-envoy", Ready::Listening(vec![at]));
        let started = Instant::now();
        while std::net::TcpStream::connect_timeout(&at, Duration::from_millis(200)).is_err() {
            self.check_alive()?;
            if started.elapsed() > API_READY_TIMEOUT {
                return Err(ClusterError::Api(format!(
                    "Contour's Envoy did not listen on {at} within {API_READY_TIMEOUT:?}; see contour.log and contour-envoy.log in {}",
                    self.dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.contour = Some(envoy_ports.map(local));
        Ok(())
    }
}

/// Contour's namespace, identity (a ClusterRole bound to [`USER`]: what it reads and the
/// status it writes), IngressClass `contour`, GatewayClass `contour`, the Gateway, the
/// placeholder route and the Gateway's certificate (`secret`, made in its namespace).
///
/// The Gateway's listeners, on `ports`: plain HTTP (`web`) and HTTPS with the Gateway's
/// certificate (`websecure`). Contour needs exactly one HTTPS listener to serve
/// Ingresses over TLS (with their own certificates, chosen by name): that one.
fn objects(ports: [u16; 2], secret: &Value) -> Vec<Value> {
    let (name, namespace, listener) = GATEWAY;
    let (tls_listener, secret_name) = (GATEWAY_TLS_LISTENER, &secret["metadata"]["name"]);
    let mut secret = secret.clone();
    secret["metadata"]["namespace"] = json!(NAMESPACE);
    let all = json!({ "namespaces": { "from": "All" } });
    let gateway_kinds = super::GATEWAY_KINDS;
    let contour_kinds = [
        "httpproxies",
        "tlscertificatedelegations",
        "extensionservices",
        "contourconfigurations",
    ];
    let status = |kinds: &[&str]| {
        kinds
            .iter()
            .map(|k| format!("{k}/status"))
            .collect::<Vec<_>>()
    };
    let read = json!(["get", "list", "watch"]);
    vec![
        json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": NAMESPACE } }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": { "name": "ingressbench-contour" },
            "rules": [
                { "apiGroups": [""], "resources": ["configmaps", "namespaces", "secrets", "services"], "verbs": read },
                { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read },
                { "apiGroups": [crate::routes::gateway::GROUP], "resources": gateway_kinds, "verbs": read },
                { "apiGroups": [crate::routes::gateway::GROUP], "resources": status(&gateway_kinds), "verbs": ["update"] },
                { "apiGroups": ["networking.k8s.io"], "resources": ["ingresses", "ingressclasses"], "verbs": read },
                { "apiGroups": ["networking.k8s.io"], "resources": ["ingresses/status"], "verbs": ["create", "get", "update"] },
                { "apiGroups": ["projectcontour.io"], "resources": contour_kinds, "verbs": read },
                { "apiGroups": ["projectcontour.io"], "resources": status(&contour_kinds), "verbs": ["create", "get", "update"] },
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": "ingressbench-contour" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ingressbench-contour" },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER }],
        }),
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": { "name": "contour" },
            "spec": { "controller": "projectcontour.io/ingress-controller" },
        }),
        json!({
            "apiVersion": crate::routes::gateway::API_VERSION, "kind": "GatewayClass",
            "metadata": { "name": "contour" },
            "spec": { "controllerName": "projectcontour.io/gateway-controller" },
        }),
        json!({
            "apiVersion": crate::routes::gateway::API_VERSION, "kind": "Gateway",
            "metadata": { "name": name, "namespace": namespace },
            "spec": { "gatewayClassName": "contour", "listeners": [
                { "name": listener, "port": ports[0], "protocol": "HTTP", "allowedRoutes": all },
                { "name": tls_listener, "port": ports[1], "protocol": "HTTPS", "allowedRoutes": all,
                  "tls": { "mode": "Terminate", "certificateRefs": [{ "name": secret_name }] } },
            ] },
        }),
        secret,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": "listener", "namespace": NAMESPACE },
            "spec": { "ports": [{ "name": "http", "port": 80 }] },
        }),
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": { "name": "listener", "namespace": NAMESPACE },
            "spec": { "ingressClassName": "contour", "rules": [{ "host": "listener.invalid",
                "http": { "paths": [{ "path": "/", "pathType": "Prefix",
                    "backend": { "service": { "name": "listener", "port": { "number": 80 } } } }] } }] },
        }),
    ]
}
