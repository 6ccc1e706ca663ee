//! A real Kubernetes control plane on this machine: etcd (Debian's `etcd-server`) and
//! kube-apiserver, kube-controller-manager and kube-scheduler built by
//! `scripts/kube-binaries.sh`. It is how the tests get a cluster, and how anyone can try
//! cluster mode without a cloud.
//!
//! Every process is a lab child ([`OwnedChild`]): its own process group, killed with the
//! thread that started it and when dropped. The cluster lives in one directory (certificates,
//! tokens, kubeconfig, etcd's data, logs), removed when the cluster is dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use ingressbench_lab::process::OwnedChild;

use crate::agent::{Agent, AgentOptions};
use crate::api::runtime;
use crate::ClusterError;

mod cluster_file;
mod contour;
mod crds;
use crds::{condition_true, crd_names, read_yaml, traefik_objects, GATEWAY_KINDS};
mod envoy_gateway;
mod files;
use files::Files;
mod haproxy_ingress;
mod restart;
pub use contour::{
    ContourOptions, CONTOUR_VERSION, GATEWAY as CONTOUR_GATEWAY,
    GATEWAY_TLS_LISTENER as CONTOUR_GATEWAY_TLS_LISTENER,
};
pub use envoy_gateway::{
    EnvoyGatewayInstalled, EnvoyGatewayOptions, CLASS as ENVOY_GATEWAY_CLASS,
    GATEWAY as ENVOY_GATEWAY, GATEWAY_TLS_LISTENER as ENVOY_GATEWAY_TLS_LISTENER,
    METRICS_PORT as ENVOY_GATEWAY_METRICS_PORT, NAMESPACE as ENVOY_GATEWAY_NAMESPACE,
    OWNING_GATEWAY_LABEL,
};
pub use haproxy_ingress::{HaproxyIngressOptions, HAPROXY_INGRESS_VERSION};
pub use restart::{request_restart, RestartRequest, Restarted};

/// The Kubernetes release the local cluster runs (and `scripts/kube-binaries.sh` builds).
pub const KUBE_VERSION: &str = "1.33.13";
/// The Helm release `scripts/controllers.sh` builds.
pub const HELM_VERSION: &str = "3.22.0";
/// The Envoy Gateway releases `scripts/controllers.sh` builds; the last is installed (the
/// first is what an upgrade starts from).
pub const ENVOY_GATEWAY_VERSIONS: [&str; 2] = ["1.9.0", "1.9.1"];
/// The Gateway API release whose CRDs the local cluster installs (`scripts/controllers.sh`
/// copies them into the cache).
pub const GATEWAY_API_VERSION: &str = "1.5.1";
/// The local cluster's Gateway (class `traefik`, served by Traefik's Gateway provider):
/// its name and namespace, and its plain HTTP listener.
pub const GATEWAY: (&str, &str, &str) = ("traefik", "kube-system", "web");
/// Its HTTPS listener (Traefik's HTTPS port), with the Gateways' certificate.
pub const GATEWAY_TLS_LISTENER: &str = "websecure";
/// The names the Gateways' certificate is for: a run's hosts are these (`a.app.test`).
const GATEWAY_TLS_NAMES: [&str; 2] = ["app.test", "*.app.test"];
/// The Secret (in each Gateway's namespace) with the Gateways' certificate.
const GATEWAY_TLS_SECRET: &str = "gateway-tls";

/// The controllers' LoadBalancer Services: Traefik's, Contour's Envoy's, HAProxy
/// Ingress's (name, namespace).
pub const LB_TRAEFIK: (&str, &str) = ("traefik", "kube-system");
/// See [`LB_TRAEFIK`].
pub const LB_CONTOUR: (&str, &str) = ("envoy", "projectcontour");
/// See [`LB_TRAEFIK`].
pub const LB_HAPROXY_INGRESS: (&str, &str) = ("haproxy-ingress", "ingress-haproxy");

/// How long the API server may take to answer (3-4 s here; etcd's first start is slower).
const API_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Traefik's identity (a token), bound to what its Ingress provider reads.
const TRAEFIK_USER: &str = "ingressbench:traefik";

/// The range Services' cluster IPs come from.
const SERVICE_RANGE: &str = "10.96.0.0/16";

/// What a local cluster needs.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// The directory it lives in (created; removed when the cluster is dropped).
    pub dir: PathBuf,
    /// Where kube-apiserver, kube-controller-manager and kube-scheduler are.
    pub kube_bin: PathBuf,
    /// The etcd binary.
    pub etcd: PathBuf,
    /// How many nodes the node agent registers (none: no pod runs).
    pub nodes: usize,
    /// Images the node agent can run, and what runs for each (where no image was built:
    /// this tool's binary for `ingressbench`).
    pub images: BTreeMap<String, crate::agent::Runs>,
    /// Images made at `up` from local binaries ([`crate::image::Image::stage`]), by name:
    /// `envoy` (a mesh's sidecar) is the lab's Envoy.
    pub staged: BTreeMap<String, StagedImage>,
    /// The OCI image layout and tag of the `ingressbench` image (what
    /// `scripts/image.sh` builds): unpacked, the pods run from it instead of the binary.
    pub image: Option<(PathBuf, String)>,
    /// The ingress controller to run beside the control plane, if any.
    pub traefik: Option<TraefikOptions>,
    /// The Gateway API's CRDs (a folder of YAML files): with them, Traefik's Gateway
    /// provider runs too, serving the Gateway [`GATEWAY`], and Contour can run.
    pub gateway_crds: Option<PathBuf>,
    /// Contour and Envoy, the second controller (needs the Gateway API's CRDs).
    pub contour: Option<ContourOptions>,
    /// HAProxy Ingress, the third.
    pub haproxy_ingress: Option<HaproxyIngressOptions>,
    /// Envoy Gateway, the fourth, installed by Helm (needs the Gateway API's CRDs and
    /// nodes: it runs as pods).
    pub envoy_gateway: Option<EnvoyGatewayOptions>,
}

/// An image the node agent runs from a local binary: the binary, where it sits in the
/// image, and the image's user.
#[derive(Clone, Debug)]
pub struct StagedImage {
    /// The binary.
    pub binary: PathBuf,
    /// Its path in the image (its entrypoint).
    pub path: &'static str,
    /// The image's `USER`.
    pub user: Option<(u32, u32)>,
}

/// Traefik as the local cluster's ingress controller (`--providers.kubernetesingress`),
/// serving IngressClass `traefik`.
#[derive(Clone, Debug)]
pub struct TraefikOptions {
    /// The `traefik` binary the controller runs.
    pub binary: PathBuf,
    /// Its HTTP entry port on 127.0.0.1 (0: a free one).
    pub http_port: u16,
    /// Its HTTPS entry port on 127.0.0.1 (0: a free one); certificates come from the
    /// Ingresses' TLS Secrets.
    pub https_port: u16,
}

impl LocalOptions {
    /// The usual places: binaries in the cache `scripts/kube-binaries.sh` fills (or
    /// `INGRESSBENCH_KUBE_BIN`), etcd on PATH.
    pub fn discover(dir: PathBuf) -> Self {
        let kube_bin = std::env::var_os("INGRESSBENCH_KUBE_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| cache().join(format!("kube/v{KUBE_VERSION}")));
        let mut images = BTreeMap::new();
        if let Ok(exe) = std::env::current_exe() {
            images.insert(
                crate::agent::IMAGE.to_owned(),
                crate::agent::Runs::Binary {
                    binary: exe,
                    user: Some(crate::agent::IMAGE_USER),
                },
            );
        }
        // The `envoy` image (a mesh's sidecar) is the Envoy the lab runs, where the
        // `envoyproxy/envoy` image has it, as its non-root user.
        let mut staged = BTreeMap::new();
        if let Ok(envoy) = ingressbench_lab::proxy::Binaries::discover()
            .locate(ingressbench_lab::proxy::ProxyKind::Envoy)
        {
            staged.insert(
                "envoy".to_owned(),
                StagedImage {
                    binary: envoy,
                    path: "/usr/local/bin/envoy",
                    user: Some(crate::agent::IMAGE_USER),
                },
            );
        }
        // `envoyproxy/gateway` of each version built (`scripts/controllers.sh`): its
        // binary, as its distroless image has it.
        for version in ENVOY_GATEWAY_VERSIONS {
            let binary = envoy_gateway_chart(version).with_file_name("envoy-gateway");
            if binary.is_file() {
                staged.insert(
                    format!("gateway:v{version}"),
                    StagedImage {
                        binary,
                        path: "/usr/local/bin/envoy-gateway",
                        user: Some(crate::agent::IMAGE_USER),
                    },
                );
            }
        }
        let traefik = ingressbench_lab::proxy::Binaries::discover()
            .locate(ingressbench_lab::proxy::ProxyKind::Traefik)
            .ok()
            .map(|binary| TraefikOptions {
                binary,
                http_port: 0,
                https_port: 0,
            });
        let gateway_crds =
            Some(cache().join(format!("gateway-api/v{GATEWAY_API_VERSION}-experimental")))
                .filter(|d| d.join("httproutes.yaml").is_file());
        Self {
            dir,
            kube_bin,
            etcd: PathBuf::from("etcd"),
            nodes: 2,
            images,
            staged,
            image: Some(cache().join("image"))
                .filter(|l| l.join("index.json").is_file())
                .map(|l| (l, "latest".to_owned())),
            traefik,
            contour: gateway_crds
                .is_some()
                .then(|| ContourOptions::discover(&cache()))
                .flatten(),
            gateway_crds,
            haproxy_ingress: HaproxyIngressOptions::discover(&cache()),
            envoy_gateway: EnvoyGatewayOptions::discover(),
        }
    }
}

/// The cache folder of `scripts/kube-binaries.sh` and `scripts/controllers.sh`.
/// Helm, as `scripts/controllers.sh` builds it into the cache.
pub fn helm() -> PathBuf {
    cache().join(format!("helm/v{HELM_VERSION}/helm"))
}

/// Envoy Gateway `version`'s Helm chart, as `scripts/controllers.sh` puts it in the cache
/// (its image references written in, as its release writes them).
pub fn envoy_gateway_chart(version: &str) -> PathBuf {
    cache().join(format!("envoy-gateway/v{version}/chart"))
}

fn cache() -> PathBuf {
    std::env::var_os("INGRESSBENCH_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("ingressbench"))
        })
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ingressbench")))
        .unwrap_or_else(|| PathBuf::from(".cache/ingressbench"))
}

/// A running local control plane.
pub struct LocalCluster {
    dir: PathBuf,
    kubeconfig: PathBuf,
    server: String,
    /// In start order; stopped in reverse.
    parts: Vec<OwnedChild>,
    /// Stopped first, so that the pods go before the control plane.
    agent: Option<Agent>,
    /// Where the ingress controller takes traffic: plain HTTP, then HTTPS.
    ingress: Option<(SocketAddr, SocketAddr)>,
    /// Whether Traefik serves the Gateway [`GATEWAY`] too.
    gateway: bool,
    /// Where Contour's Envoy takes plain HTTP and HTTPS, if Contour runs.
    contour: Option<[SocketAddr; 2]>,
    /// The CA certificate that signed the Gateways' certificate, with the Gateway API.
    gateway_ca: Option<PathBuf>,
    /// Where HAProxy Ingress's haproxy takes plain HTTP and HTTPS, if it runs.
    haproxy_ingress: Option<(SocketAddr, SocketAddr)>,
    /// Envoy Gateway, if its chart was installed.
    envoy_gateway: Option<EnvoyGatewayInstalled>,
    /// The cloud load balancers' stand-ins: one L4 front per controller's LoadBalancer
    /// Service (its name and namespace, and the front).
    load_balancers: Vec<(String, String, ingressbench_lab::front::Front)>,
    /// How each part was started, to start a controller again on request.
    again: Vec<restart::Again>,
    /// Per controller that exited by itself: how many times, and when it may be started
    /// again (the back-off).
    crashes: BTreeMap<String, (u32, Instant)>,
}

impl std::fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCluster")
            .field("dir", &self.dir)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl LocalCluster {
    /// Starts etcd, the API server, the controller manager and the scheduler, and waits
    /// until the API server answers. Anything that does not start is an error naming it,
    /// its log and the log's end; what was started is stopped again.
    pub fn up(options: &LocalOptions) -> Result<Self, ClusterError> {
        let bins = [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ];
        for b in bins {
            if !options.kube_bin.join(b).is_file() {
                return Err(ClusterError::Missing {
                    what: format!("{b} v{KUBE_VERSION}"),
                    looked: options.kube_bin.join(b),
                    fix: "bash scripts/kube-binaries.sh (builds the control plane from the Go module proxy into the cache; about 11 minutes the first time), or set INGRESSBENCH_KUBE_BIN".into(),
                });
            }
        }
        let etcd = locate(&options.etcd).ok_or_else(|| ClusterError::Missing {
            what: "etcd".into(),
            looked: options.etcd.clone(),
            fix: "apt-get install etcd-server (or: bash scripts/install-deps.sh)".into(),
        })?;
        let dir = &options.dir;
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let mut cluster = LocalCluster {
            dir: dir.clone(),
            kubeconfig: dir.join("kubeconfig"),
            server: String::new(),
            parts: Vec::new(),
            agent: None,
            ingress: None,
            gateway: false,
            contour: None,
            gateway_ca: None,
            haproxy_ingress: None,
            envoy_gateway: None,
            load_balancers: Vec::new(),
            again: Vec::new(),
            crashes: BTreeMap::new(),
        };
        cluster.open_restarts()?;
        let files = Files::write(dir)?;
        // etcd.
        let (client, peer) = (free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let args = [
            "--name=ingressbench".to_owned(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=ingressbench={peer_url}"),
        ];
        let mut etcd = cluster.start("etcd", &etcd, &args)?;
        etcd.wait_listening(
            SocketAddr::from(([127, 0, 0, 1], client)),
            API_READY_TIMEOUT,
        )
        .map_err(ClusterError::from)?;
        cluster.parts.push(etcd);
        // The API server.
        let port = free_port()?;
        cluster.server = format!("https://127.0.0.1:{port}");
        let sa = files.service_account_key.display().to_string();
        let sa_public = files.service_account_public.display().to_string();
        let args = [
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", files.serving_cert.display()),
            format!("--tls-private-key-file={}", files.serving_key.display()),
            format!("--token-auth-file={}", files.tokens.display()),
            "--authorization-mode=Node,RBAC".to_owned(),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
            format!("--service-account-key-file={sa_public}"),
            format!("--service-account-signing-key-file={sa}"),
            format!("--service-cluster-ip-range={SERVICE_RANGE}"),
            "--endpoint-reconciler-type=none".to_owned(),
            "--enable-priority-and-fairness=false".to_owned(),
            // Pods' logs come from the node agent's endpoint at the node's InternalIP.
            "--kubelet-preferred-address-types=InternalIP".to_owned(),
        ];
        let apiserver = cluster.start(
            "kube-apiserver",
            &options.kube_bin.join("kube-apiserver"),
            &args,
        )?;
        cluster.parts.push(apiserver);
        files.kubeconfig(&cluster.kubeconfig, &cluster.server, &files.admin_token)?;
        cluster.wait_api()?;
        // The controllers and the scheduler, each with its own identity.
        let kcm_config = dir.join("kube-controller-manager.kubeconfig");
        files.kubeconfig(&kcm_config, &cluster.server, &files.controller_token)?;
        let args = [
            format!("--kubeconfig={}", kcm_config.display()),
            format!("--service-account-private-key-file={sa}"),
            format!("--root-ca-file={}", files.ca.display()),
            "--leader-elect=false".to_owned(),
            // Each controller acts as its own service account, which the bootstrap RBAC
            // policy grants what it needs.
            "--use-service-account-credentials=true".to_owned(),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={}", free_port()?),
            // No cloud, no node IP allocation, no certificate signing: the node agent
            // gives pods their addresses and uses tokens.
            "--controllers=*,-nodeipam,-csrsigning,-csrapproving,-csrcleaner,-service-lb-controller,-cloud-node-lifecycle,-route".to_owned(),
        ];
        let kcm = cluster.start(
            "kube-controller-manager",
            &options.kube_bin.join("kube-controller-manager"),
            &args,
        )?;
        cluster.parts.push(kcm);
        let sched_config = dir.join("kube-scheduler.kubeconfig");
        files.kubeconfig(&sched_config, &cluster.server, &files.scheduler_token)?;
        let args = [
            format!("--kubeconfig={}", sched_config.display()),
            "--leader-elect=false".to_owned(),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={}", free_port()?),
        ];
        let scheduler = cluster.start(
            "kube-scheduler",
            &options.kube_bin.join("kube-scheduler"),
            &args,
        )?;
        cluster.parts.push(scheduler);
        // Give both a moment to fail on their flags, so that a bad start is an error here.
        std::thread::sleep(Duration::from_millis(500));
        cluster.check_alive()?;
        if options.nodes > 0 {
            let pods = dir.join("pods");
            std::fs::create_dir_all(&pods).map_err(|e| io(&pods, e))?;
            let mut images = options.images.clone();
            let launcher =
                std::env::current_exe().map_err(|e| io(Path::new("/proc/self/exe"), e))?;
            for (name, s) in &options.staged {
                let into = dir.join("images").join(name);
                let image = crate::image::Image::stage(
                    name,
                    &s.binary,
                    s.path,
                    s.user,
                    &into,
                    launcher.clone(),
                )?;
                images.insert(name.clone(), crate::agent::Runs::Image(Box::new(image)));
            }
            if let Some((layout, tag)) = &options.image {
                let image = crate::image::Image::unpack(layout, tag, &dir.join("image"), launcher)?;
                images.insert(
                    crate::agent::IMAGE.to_owned(),
                    crate::agent::Runs::Image(Box::new(image)),
                );
            }
            cluster.agent = Some(Agent::start(AgentOptions {
                kubeconfig: cluster.kubeconfig.clone(),
                nodes: options.nodes,
                dir: pods,
                images,
                kubelet_version: KUBE_VERSION,
                api: api_address(&cluster.server)?,
                service_range: SERVICE_RANGE,
            })?);
        }
        let gateway_secret = match &options.gateway_crds {
            Some(dir) => {
                cluster.install_gateway_api(dir)?;
                Some(cluster.gateway_certificate()?)
            }
            None => None,
        };
        if let Some(traefik) = &options.traefik {
            cluster.start_traefik(traefik, &files, gateway_secret.as_ref())?;
        }
        match (&options.contour, &gateway_secret) {
            (Some(contour), Some(secret)) => cluster.start_contour(contour, &files, secret)?,
            (Some(_), None) => return Err(no_gateway_api("Contour watches")),
            _ => {}
        }
        if let Some(haproxy_ingress) = &options.haproxy_ingress {
            cluster.haproxy_ingress = Some(cluster.start_haproxy_ingress(haproxy_ingress, &files)?);
        }
        match (&options.envoy_gateway, &gateway_secret) {
            (Some(eg), Some(secret)) if cluster.agent.is_some() => {
                cluster.start_envoy_gateway(eg, secret)?;
            }
            (Some(_), None) => return Err(no_gateway_api("Envoy Gateway serves")),
            _ => {}
        }
        let controllers = [
            (LB_TRAEFIK, cluster.ingress.map(|(h, s)| [h, s])),
            (LB_CONTOUR, cluster.contour),
            (
                LB_HAPROXY_INGRESS,
                cluster.haproxy_ingress.map(|(h, s)| [h, s]),
            ),
        ];
        for (n, ((name, namespace), at)) in (1u8..).zip(controllers) {
            if let Some(at) = at {
                cluster.load_balancer(name, namespace, at, n)?;
            }
        }
        Ok(cluster)
    }

    /// Where the ingress controller (Traefik, class `traefik`) takes plain HTTP and HTTPS
    /// traffic.
    pub fn ingress(&self) -> Option<(SocketAddr, SocketAddr)> {
        self.ingress
    }

    /// Grants Traefik what its Kubernetes Ingress, CRD and Gateway providers read, makes
    /// IngressClass `traefik` and Traefik's custom resource kinds (its Middlewares are how
    /// a run changes routes) and, with the Gateway API's CRDs, those; starts Traefik with
    /// its own token, waits until it answers its ping, and then (with the Gateway API)
    /// until it accepted the Gateway [`GATEWAY`].
    fn start_traefik(
        &mut self,
        options: &TraefikOptions,
        files: &Files,
        gateway_secret: Option<&serde_json::Value>,
    ) -> Result<(), ClusterError> {
        let gateway = gateway_secret.is_some();
        let runtime = runtime()?;
        let objects = traefik_objects();
        runtime.block_on(crate::api::apply_all(&self.kubeconfig, &objects))?;
        runtime.block_on(self.wait_established(&crd_names(&objects)))?;
        let port = |p: u16| if p == 0 { free_port() } else { Ok(p) };
        let (http, https, ping) = (
            port(options.http_port)?,
            port(options.https_port)?,
            free_port()?,
        );
        let mut args = vec![
            format!("--entrypoints.web.address=127.0.0.1:{http}"),
            format!("--entrypoints.websecure.address=127.0.0.1:{https}"),
            "--entrypoints.websecure.http.tls=true".to_owned(),
            // HTTP/3 on the same port's UDP twin, as its users turn it on.
            "--entrypoints.websecure.http3=true".to_owned(),
            format!("--entrypoints.ping.address=127.0.0.1:{ping}"),
            "--ping=true".to_owned(),
            "--ping.entrypoint=ping".to_owned(),
            "--providers.kubernetesingress.ingressclass=traefik".to_owned(),
            "--log.level=INFO".to_owned(),
        ];
        // Every provider reads the same API server with Traefik's own token.
        let providers: &[&str] = if gateway {
            &["kubernetesingress", "kubernetescrd", "kubernetesgateway"]
        } else {
            &["kubernetesingress", "kubernetescrd"]
        };
        for provider in providers {
            args.extend([
                format!("--providers.{provider}=true"),
                format!("--providers.{provider}.endpoint={}", self.server),
                format!("--providers.{provider}.token={}", files.traefik_token),
                format!(
                    "--providers.{provider}.certauthfilepath={}",
                    files.ca.display()
                ),
            ]);
        }
        let mut traefik = self.start("traefik", &options.binary, &args)?;
        let started = Instant::now();
        let ping_at = SocketAddr::from(([127, 0, 0, 1], ping));
        while !crate::agent::http_ok(ping_at, "/ping") {
            if let Some(status) = traefik.try_wait() {
                return Err(traefik.not_ready(format!("exited with {status}")).into());
            }
            if started.elapsed() > API_READY_TIMEOUT {
                return Err(traefik
                    .not_ready(format!("no answer to /ping after {API_READY_TIMEOUT:?}"))
                    .into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.parts.push(traefik);
        self.restartable("traefik", restart::Ready::Http(ping_at, "/ping"));
        let local = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        self.ingress = Some((local(http), local(https)));
        if let Some(secret) = gateway_secret {
            runtime.block_on(self.make_gateway(http, https, secret))?;
            self.gateway = true;
        }
        Ok(())
    }

    /// GatewayClass `traefik` and the Gateway [`GATEWAY`] with a plain HTTP listener on
    /// Traefik's web entry point (a listener's port must be an entry point's) and an HTTPS
    /// one on its websecure entry point, with the Gateways' certificate (`secret`, made in
    /// the Gateway's namespace); waits (bounded) until Traefik reports the Gateway
    /// accepted.
    async fn make_gateway(
        &self,
        http: u16,
        https: u16,
        secret: &serde_json::Value,
    ) -> Result<(), ClusterError> {
        use crate::routes::gateway::API_VERSION;
        let (name, namespace, listener) = GATEWAY;
        let all = serde_json::json!({ "namespaces": { "from": "All" } });
        let mut secret = secret.clone();
        secret["metadata"]["namespace"] = serde_json::json!(namespace);
        let objects = [
            secret,
            serde_json::json!({
                "apiVersion": API_VERSION, "kind": "GatewayClass",
                "metadata": { "name": "traefik" },
                "spec": { "controllerName": "traefik.io/gateway-controller" },
            }),
            serde_json::json!({
                "apiVersion": API_VERSION, "kind": "Gateway",
                "metadata": { "name": name, "namespace": namespace },
                "spec": { "gatewayClassName": "traefik", "listeners": [
                    { "name": listener, "port": http, "protocol": "HTTP", "allowedRoutes": all },
                    { "name": GATEWAY_TLS_LISTENER, "port": https, "protocol": "HTTPS", "allowedRoutes": all,
                      "tls": { "mode": "Terminate", "certificateRefs": [{ "name": GATEWAY_TLS_SECRET }] } },
                ] },
            }),
        ];
        crate::api::apply_all(&self.kubeconfig, &objects).await?;
        let client = crate::api::client(&self.kubeconfig, None).await?;
        let started = Instant::now();
        loop {
            let gateway = crate::api::get(&client, API_VERSION, "Gateway", Some(namespace), name)
                .await?
                .unwrap_or_default();
            if condition_true(&gateway, "Accepted") {
                return Ok(());
            }
            if started.elapsed() > API_READY_TIMEOUT {
                return Err(ClusterError::Api(format!(
                    "Traefik did not accept Gateway {namespace}/{name} within {API_READY_TIMEOUT:?} (its status: {}); see {}",
                    gateway["status"],
                    self.dir.join("traefik.log").display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A CA and a certificate for [`GATEWAY_TLS_NAMES`], in `gateway-tls/` (the CA is
    /// what the cluster file's gateway targets give as `ca:`): the Secret the Gateways'
    /// HTTPS listeners name, without a namespace (each Gateway's own is given).
    fn gateway_certificate(&mut self) -> Result<serde_json::Value, ClusterError> {
        let dir = self.dir.join("gateway-tls");
        std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        let certs = ingressbench_lab::certs::generate(&dir, &GATEWAY_TLS_NAMES.map(str::to_owned))?;
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| io(p, e));
        let secret = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": { "name": GATEWAY_TLS_SECRET },
            "stringData": { "tls.crt": read(&certs.cert)?, "tls.key": read(&certs.key)? },
        });
        self.gateway_ca = Some(certs.ca);
        Ok(secret)
    }

    /// Installs the Gateway API's kinds (every YAML file in `dir`) and waits until they
    /// are served.
    fn install_gateway_api(&self, dir: &Path) -> Result<(), ClusterError> {
        let mut crds = Vec::new();
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        paths.sort();
        for path in paths {
            crds.extend(read_yaml(&path)?);
        }
        let runtime = runtime()?;
        runtime.block_on(crate::api::apply_all(&self.kubeconfig, &crds))?;
        runtime.block_on(self.wait_established(&crd_names(&crds)))
    }

    /// A Service of type LoadBalancer for a controller, and the stand-in of the cloud's
    /// network load balancer before it: an L4 front (HAProxy in TCP mode, the lab's front)
    /// on an address of its own (127.0.1.`n`) passing connections to the controller's
    /// plain and TLS ports `at`, with that address in the Service's status as a cloud's
    /// load-balancer controller writes it. What a cluster file's `service:` reads, so a
    /// target placed by its Service is reached through the extra hop a cloud puts there.
    fn load_balancer(
        &mut self,
        name: &str,
        namespace: &str,
        at: [SocketAddr; 2],
        n: u8,
    ) -> Result<(), ClusterError> {
        use k8s_openapi::api::core::v1::Service;
        use kube::api::{Patch, PatchParams};
        let node = ingressbench_lab::topology::Node {
            name: format!("lb-{name}"),
            ip: std::net::Ipv4Addr::new(127, 0, 1, n).into(),
            netns: None,
        };
        let dir = self.dir.join(format!("lb-{name}"));
        std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        let front = ingressbench_lab::front::Front::start(
            &ingressbench_lab::proxy::Binaries::discover(),
            &node,
            &dir,
            &at[..1],
            Some(&at[1..]),
            |_| {},
        )?;
        let (http, https) = (front.http_addr(), front.https_addr().unwrap_or(at[1]));
        let service = serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": name, "namespace": namespace },
            // Of a class of its own: the node agent's load balancers (kind's cloud
            // provider's stand-in) leave it to this front.
            "spec": { "type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
                "loadBalancerClass": "ingressbench.dev/l4-front",
                "ports": [{ "name": "http", "port": http.port() }, { "name": "https", "port": https.port() }] },
        });
        self.load_balancers
            .push((name.to_owned(), namespace.to_owned(), front));
        let status = serde_json::json!({ "status": { "loadBalancer": { "ingress": [{ "ip": http.ip().to_string() }] } } });
        runtime()?.block_on(async {
            crate::api::apply_all(&self.kubeconfig, &[service]).await?;
            let api: kube::Api<Service> =
                kube::Api::namespaced(crate::api::client(&self.kubeconfig, None).await?, namespace);
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .map(|_| ())
                .map_err(|e| {
                    ClusterError::Api(format!(
                        "giving Service {namespace}/{name} its load balancer's address: {e}"
                    ))
                })
        })
    }

    /// Envoy Gateway as installed, if it was.
    pub fn envoy_gateway(&self) -> Option<&EnvoyGatewayInstalled> {
        self.envoy_gateway.as_ref()
    }

    /// The controllers' LoadBalancer Services (name, namespace) and where each one's
    /// stand-in takes plain HTTP and TLS.
    pub fn load_balancers(&self) -> Vec<(String, String, SocketAddr, Option<SocketAddr>)> {
        self.load_balancers
            .iter()
            .map(|(n, ns, f)| (n.clone(), ns.clone(), f.http_addr(), f.https_addr()))
            .collect()
    }

    /// Waits until every custom resource definition named is `Established` (its kind
    /// served).
    async fn wait_established(&self, crds: &[String]) -> Result<(), ClusterError> {
        let client = crate::api::client(&self.kubeconfig, None).await?;
        let started = Instant::now();
        for name in crds {
            loop {
                let crd = crate::api::get(
                    &client,
                    "apiextensions.k8s.io/v1",
                    "CustomResourceDefinition",
                    None,
                    name,
                )
                .await?
                .unwrap_or_default();
                if condition_true(&crd, "Established") {
                    break;
                }
                if started.elapsed() > API_READY_TIMEOUT {
                    return Err(ClusterError::Api(format!(
                        "the API does not serve the kind of {name} after {API_READY_TIMEOUT:?}"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// The kubeconfig of the cluster's administrator (a token in `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The directory the cluster lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The process ids of the control plane's parts, by name.
    pub fn processes(&self) -> Vec<(&str, u32)> {
        let fronts = self
            .load_balancers
            .iter()
            .map(|(name, _, f)| (name.as_str(), f.pid()));
        self.parts
            .iter()
            .map(|p| (p.name(), p.pid()))
            .chain(fronts)
            .collect()
    }

    /// An error naming the first part that exited, with how and its log's end.
    pub fn check_alive(&mut self) -> Result<(), ClusterError> {
        self.check_agent_and_fronts()?;
        for part in &mut self.parts {
            if let Some(status) = part.try_wait() {
                return Err(part.not_ready(format!("exited with {status}")).into());
            }
        }
        Ok(())
    }

    /// An error when the node agent stopped or a load balancer's front exited.
    fn check_agent_and_fronts(&mut self) -> Result<(), ClusterError> {
        if self.agent.as_ref().is_some_and(Agent::failed) {
            return match self.agent.take().map(Agent::stop) {
                Some(Err(e)) => Err(e),
                _ => Err(ClusterError::Api("the node agent stopped".into())),
            };
        }
        for (_, _, front) in &mut self.load_balancers {
            let part = front.child();
            if let Some(status) = part.try_wait() {
                return Err(part.not_ready(format!("exited with {status}")).into());
            }
        }
        Ok(())
    }

    fn start(
        &mut self,
        name: &str,
        program: &Path,
        args: &[String],
    ) -> Result<OwnedChild, ClusterError> {
        self.spawn(restart::Again {
            name: name.to_owned(),
            program: program.to_owned(),
            args: args.to_vec(),
            env: Vec::new(),
            home: self.dir.clone(),
            ready: None,
        })
    }

    /// Polls the API server's `/readyz` with the admin kubeconfig until it says ok (the
    /// controllers start only then: before the bootstrap RBAC policy is in, they are
    /// refused and back off for seconds).
    fn wait_api(&mut self) -> Result<(), ClusterError> {
        let started = Instant::now();
        let runtime = runtime()?;
        let mut last = String::new();
        while started.elapsed() < API_READY_TIMEOUT {
            self.check_alive()?;
            match runtime.block_on(crate::api::ready(&self.kubeconfig)) {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let apiserver = self
            .parts
            .iter()
            .find(|p| p.name() == "kube-apiserver")
            .map(|p| p.not_ready(format!("no answer after {API_READY_TIMEOUT:?}: {last}")));
        Err(apiserver.map_or_else(|| ClusterError::Api(last), ClusterError::from))
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if let Some(agent) = self.agent.take() {
            let _ = agent.stop();
        }
        for (_, _, front) in self.load_balancers.drain(..) {
            front.stop(Duration::from_secs(1));
        }
        // The scheduler and controllers first, then the API server, then etcd.
        while let Some(mut part) = self.parts.pop() {
            part.terminate(Duration::from_secs(5));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The Gateway API's CRDs are not in the cache, and a controller needs them (`which`:
/// what it does with them).
fn no_gateway_api(which: &str) -> ClusterError {
    ClusterError::Missing {
        what: format!("the Gateway API's CRDs, which {which}"),
        looked: cache().join("gateway-api"),
        fix: "bash scripts/controllers.sh".into(),
    }
}

/// The Secret, in a controller's namespace, with the client certificate it presents to
/// every upstream that asks for one (Contour's `tls.envoy-client-certificate`, Envoy
/// Gateway's Gateway's `tls.backend.clientCertificateRef`), as OSM gives a controller one
/// to reach the pods of its mesh; the cluster file names it as `mesh_client`.
const MESH_CLIENT: &str = "ingressbench-mesh-client";

impl LocalCluster {
    /// A CA of its own and a client certificate from it, in `mesh-client-NAMESPACE/`: the
    /// Secret [`MESH_CLIENT`] in `namespace` (`ca.crt` the CA, which a mesh's sidecars
    /// then accept).
    fn mesh_client_secret(&self, namespace: &str) -> Result<serde_json::Value, ClusterError> {
        let dir = self.dir.join(format!("mesh-client-{namespace}"));
        std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        let certs = ingressbench_lab::certs::generate(&dir, &[format!("controller.{namespace}")])?;
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| io(p, e));
        Ok(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": { "name": MESH_CLIENT, "namespace": namespace },
            "stringData": { "tls.crt": read(&certs.client_cert)?, "tls.key": read(&certs.client_key)?,
                            "ca.crt": read(&certs.ca)? },
        }))
    }
}

fn write_private(path: &Path, text: &str) -> Result<(), ClusterError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).map_err(|e| io(path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| io(path, e))
}

fn io(path: &Path, source: std::io::Error) -> ClusterError {
    ClusterError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The address in the API server's URL (`https://127.0.0.1:PORT`).
fn api_address(server: &str) -> Result<SocketAddr, ClusterError> {
    server
        .strip_prefix("https://")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| {
            ClusterError::Api(format!(
                "the API server's URL `{server}` is not https://ADDRESS:PORT"
            ))
        })
}

/// A free port on 127.0.0.1, never one this process handed out before (the lab's).
fn free_port() -> Result<u16, ClusterError> {
    let node = ingressbench_lab::topology::Node {
        name: "local-cluster".into(),
        ip: std::net::Ipv4Addr::LOCALHOST.into(),
        netns: None,
    };
    ingressbench_lab::topology::free_port(&node).map_err(|e| io(Path::new("127.0.0.1"), e))
}

/// `program` as given if it is a path, else found on PATH.
fn locate(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_owned());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}
