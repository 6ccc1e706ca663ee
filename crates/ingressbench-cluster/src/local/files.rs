//! The files the local control plane reads, written before it starts.

use std::path::{Path, PathBuf};

use rcgen::KeyPair;

use super::{contour, haproxy_ingress, write_private, TRAEFIK_USER};
use crate::ClusterError;

/// The files the control plane reads: a CA and the API server's certificate, the
/// service-account signing key, the token file and kubeconfigs.
pub(super) struct Files {
    pub(super) ca: PathBuf,
    pub(super) serving_cert: PathBuf,
    pub(super) serving_key: PathBuf,
    pub(super) service_account_key: PathBuf,
    pub(super) service_account_public: PathBuf,
    pub(super) tokens: PathBuf,
    pub(super) admin_token: String,
    pub(super) controller_token: String,
    pub(super) scheduler_token: String,
    pub(super) traefik_token: String,
    pub(super) contour_token: String,
    pub(super) haproxy_ingress_token: String,
}

impl Files {
    pub(super) fn write(dir: &Path) -> Result<Self, ClusterError> {
        // The API server is reached as 127.0.0.1 from here and as the `kubernetes`
        // Service from pods.
        let names = [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "10.96.0.1",
        ]
        .map(str::to_owned);
        let certs = ingressbench_lab::certs::generate(dir, &names)?;
        let service_account_key = dir.join("service-account.key");
        let key = KeyPair::generate().map_err(|e| ClusterError::Api(e.to_string()))?;
        write_private(&service_account_key, &key.serialize_pem())?;
        let service_account_public = dir.join("service-account.pub");
        write_private(&service_account_public, &key.public_key_pem())?;
        let token = || crate::api::random_token(24);
        let (admin_token, controller_token, scheduler_token) = (token()?, token()?, token()?);
        let (traefik_token, contour_token, haproxy_ingress_token) = (token()?, token()?, token()?);
        let tokens = dir.join("tokens.csv");
        write_private(
            &tokens,
            &format!(
                "{admin_token},admin,admin,\"system:masters\"\n{controller_token},system:kube-controller-manager,kube-controller-manager\n{scheduler_token},system:kube-scheduler,kube-scheduler\n{traefik_token},{TRAEFIK_USER},traefik\n{contour_token},{},contour\n{haproxy_ingress_token},{},haproxy-ingress\n",
                contour::USER,
                haproxy_ingress::USER
            ),
        )?;
        Ok(Self {
            ca: certs.ca,
            serving_cert: certs.cert,
            serving_key: certs.key,
            service_account_key,
            service_account_public,
            tokens,
            admin_token,
            controller_token,
            scheduler_token,
            traefik_token,
            contour_token,
            haproxy_ingress_token,
        })
    }

    /// Writes a kubeconfig for `server` that trusts the cluster's CA and sends `token`.
    pub(super) fn kubeconfig(
        &self,
        path: &Path,
        server: &str,
        token: &str,
    ) -> Result<(), ClusterError> {
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{ "name": "ingressbench-local", "cluster": {
                "server": server, "certificate-authority": self.ca } }],
            "users": [{ "name": "ingressbench-local", "user": { "token": token } }],
            "contexts": [{ "name": "ingressbench-local", "context": {
                "cluster": "ingressbench-local", "user": "ingressbench-local" } }],
            "current-context": "ingressbench-local",
        });
        // JSON is YAML: every kubeconfig reader takes it.
        write_private(path, &format!("{config:#}\n"))
    }
}
