//! HAProxy Ingress (`jcmoraisjr/haproxy-ingress`) as the local cluster's third ingress
//! controller, run as a process beside the control plane (IngressClass `haproxy`). It
//! writes HAProxy's configuration under a folder of its own (`--local-filesystem-prefix`)
//! and runs Debian's haproxy itself, in master-worker mode: a reload through the master
//! socket when routes change, the runtime (admin) socket for endpoints.
//!
//! HAProxy Ingress starts haproxy in a process group of its own, so stopping the
//! controller's group would leave haproxy behind if the controller died first. The
//! controller therefore runs as the first process of a PID namespace of its own
//! (util-linux `unshare --pid --fork --kill-child`): when it ends, however it ends, the
//! kernel ends every haproxy process it started.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::restart::{Again, Ready};
use super::{free_port, io, Files, LocalCluster, API_READY_TIMEOUT};
use crate::ClusterError;

/// The HAProxy Ingress release `scripts/controllers.sh` builds.
pub const HAPROXY_INGRESS_VERSION: &str = "0.14.7";
/// HAProxy Ingress's identity (a token), bound to what it reads.
pub(super) const USER: &str = "ingressbench:haproxy-ingress";
/// The IngressClass it serves.
pub(super) const CLASS: &str = "haproxy";
/// The namespace of its global ConfigMap.
const NAMESPACE: &str = "ingress-haproxy";

/// HAProxy Ingress for the local cluster.
#[derive(Clone, Debug)]
pub struct HaproxyIngressOptions {
    /// The controller's binary.
    pub binary: PathBuf,
    /// Its `rootfs/` (the templates it renders HAProxy's configuration from, and the Lua
    /// scripts that configuration loads).
    pub rootfs: PathBuf,
    /// The haproxy binary it runs.
    pub haproxy: PathBuf,
    /// Where HAProxy takes plain HTTP on 127.0.0.1 (0: a free one).
    pub http_port: u16,
    /// Where it takes HTTPS (0: a free one); certificates come from the Ingresses' TLS
    /// Secrets.
    pub https_port: u16,
}

impl HaproxyIngressOptions {
    /// HAProxy Ingress from the cache `scripts/controllers.sh` fills, haproxy from the
    /// lab's places.
    pub(super) fn discover(cache: &Path) -> Option<Self> {
        let dir = cache.join(format!("haproxy-ingress/v{HAPROXY_INGRESS_VERSION}"));
        let haproxy = ingressbench_lab::proxy::Binaries::discover()
            .locate(ingressbench_lab::proxy::ProxyKind::Haproxy)
            .ok()?;
        let binary = dir.join("haproxy-ingress");
        let rootfs = dir.join("rootfs");
        (binary.is_file() && rootfs.join("etc/templates").is_dir()).then_some(Self {
            binary,
            rootfs,
            haproxy,
            http_port: 0,
            https_port: 0,
        })
    }
}

/// Where the haproxy HAProxy Ingress runs takes runtime API commands (its `stats socket`,
/// under the controller's filesystem prefix): what a run reads its counts through.
pub(super) fn admin_socket(cluster_dir: &Path) -> PathBuf {
    cluster_dir.join("haproxy-ingress/fs/var/run/haproxy/admin.sock")
}

impl LocalCluster {
    /// Installs HAProxy Ingress's identity, IngressClass and global ConfigMap, starts it
    /// (with its own token) and waits until its haproxy takes connections on both ports.
    /// Returns where it takes plain HTTP and HTTPS.
    pub(super) fn start_haproxy_ingress(
        &mut self,
        options: &HaproxyIngressOptions,
        files: &Files,
    ) -> Result<(SocketAddr, SocketAddr), ClusterError> {
        let port = |p: u16| if p == 0 { free_port() } else { Ok(p) };
        let (http, https) = (port(options.http_port)?, port(options.https_port)?);
        super::runtime()?.block_on(crate::api::apply_all(
            &self.kubeconfig,
            &objects(http, https, free_port()?, free_port()?, free_port()?),
        ))?;
        // Its working folder: `rootfs` beside it (it reads its templates from that
        // relative path) and the folder it writes HAProxy's configuration into, with the
        // Lua scripts that configuration loads.
        let home = self.dir.join("haproxy-ingress");
        let prefix = home.join("fs");
        for d in ["etc/haproxy", "var/lib/haproxy", "var/run/haproxy"] {
            std::fs::create_dir_all(prefix.join(d)).map_err(|e| io(&prefix, e))?;
        }
        let link = home.join("rootfs");
        if !link.exists() {
            std::os::unix::fs::symlink(&options.rootfs, &link).map_err(|e| io(&link, e))?;
        }
        copy_dir(
            &options.rootfs.join("etc/lua"),
            &prefix.join("etc/haproxy/lua"),
        )?;
        let kubeconfig = self.dir.join("haproxy-ingress.kubeconfig");
        files.kubeconfig(&kubeconfig, &self.server, &files.haproxy_ingress_token)?;
        let mut args: Vec<String> = ["--pid", "--fork", "--kill-child", "--"]
            .map(str::to_owned)
            .to_vec();
        args.push(options.binary.display().to_string());
        args.extend([
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--local-filesystem-prefix={}", prefix.display()),
            format!("--configmap={NAMESPACE}/haproxy-ingress"),
            format!("--ingress-class={CLASS}"),
            format!("--healthz-port={}", free_port()?),
            "--master-worker".to_owned(),
            "--enable-endpointslices-api".to_owned(),
            // The local cluster's clients know its address; no Service fronts it.
            "--update-status=false".to_owned(),
            // This version reads the Gateway API's v1alpha2/v1beta1 kinds only; the local
            // cluster serves v1, through Traefik and Contour.
            "--watch-gateway=false".to_owned(),
            "--profiling=false".to_owned(),
        ]);
        // It runs `haproxy` from PATH: the one the lab found goes first.
        let path = std::env::join_paths(
            options
                .haproxy
                .parent()
                .into_iter()
                .map(Path::to_owned)
                .chain(
                    std::env::var_os("PATH")
                        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                        .unwrap_or_default(),
                ),
        )
        .map_err(|e| ClusterError::Api(format!("PATH for HAProxy Ingress: {e}")))?;
        let mut controller = self.spawn(Again {
            name: "haproxy-ingress".into(),
            program: PathBuf::from("unshare"),
            args,
            env: vec![("PATH".to_owned(), path.to_string_lossy().into_owned())],
            home,
            ready: None,
        })?;
        let local = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let started = Instant::now();
        for at in [local(http), local(https)] {
            let left = API_READY_TIMEOUT.saturating_sub(started.elapsed());
            controller.wait_listening(at, left.max(Duration::from_millis(1)))?;
        }
        self.parts.push(controller);
        self.restartable(
            "haproxy-ingress",
            Ready::Listening(vec![local(http), local(https)]),
        );
        Ok((local(http), local(https)))
    }
}

/// Copies the files of `from` into `to` (one level: the Lua scripts).
fn copy_dir(from: &Path, to: &Path) -> Result<(), ClusterError> {
    std::fs::create_dir_all(to).map_err(|e| io(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| io(from, e))? {
        let path = entry.map_err(|e| io(from, e))?.path();
        if let Some(name) = path.file_name() {
            std::fs::copy(&path, to.join(name)).map_err(|e| io(&path, e))?;
        }
    }
    Ok(())
}

/// HAProxy Ingress's namespace, identity (a ClusterRole bound to [`USER`], as its own
/// manifest grants), IngressClass [`CLASS`] and global ConfigMap: every port on
/// 127.0.0.1, and no redirect of plain HTTP to HTTPS for hosts with a certificate (the
/// run measures each as it is asked).
fn objects(http: u16, https: u16, stats: u16, healthz: u16, prometheus: u16) -> Vec<Value> {
    let read = json!(["get", "list", "watch"]);
    let mut data = serde_json::Map::new();
    for (key, port) in [
        ("http-port", http),
        ("https-port", https),
        ("stats-port", stats),
        ("healthz-port", healthz),
        ("prometheus-port", prometheus),
    ] {
        data.insert(key.into(), port.to_string().into());
    }
    for what in ["http", "healthz", "prometheus", "stats", "tcp"] {
        data.insert(format!("bind-ip-addr-{what}"), "127.0.0.1".into());
    }
    data.insert("ssl-redirect".into(), "false".into());
    vec![
        json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": NAMESPACE } }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": { "name": "ingressbench-haproxy-ingress" },
            "rules": [
                { "apiGroups": [""], "resources": ["configmaps", "endpoints", "namespaces", "nodes", "pods", "secrets", "services"], "verbs": read },
                { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read },
                { "apiGroups": ["networking.k8s.io"], "resources": ["ingresses", "ingressclasses"], "verbs": read },
                { "apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"] },
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": "ingressbench-haproxy-ingress" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ingressbench-haproxy-ingress" },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER }],
        }),
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": { "name": CLASS },
            "spec": { "controller": crate::routes::haproxy_ingress::CONTROLLER },
        }),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "haproxy-ingress", "namespace": NAMESPACE },
            "data": data,
        }),
    ]
}
