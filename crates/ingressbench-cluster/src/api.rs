//! Calls to a cluster's API, through `kube`.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::ClusterError;

/// A client for the cluster `kubeconfig` describes (its current context, or `context`).
pub async fn client(kubeconfig: &Path, context: Option<&str>) -> Result<Client, ClusterError> {
    let file = Kubeconfig::read_from(kubeconfig)
        .map_err(|e| ClusterError::Api(format!("{}: {e}", kubeconfig.display())))?;
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let config = Config::from_custom_kubeconfig(file, &options)
        .await
        .map_err(|e| ClusterError::Api(format!("{}: {e}", kubeconfig.display())))?;
    Client::try_from(config).map_err(|e| ClusterError::Api(e.to_string()))
}

/// The API server's version (`v1.33.13`).
pub async fn version(kubeconfig: &Path, context: Option<&str>) -> Result<String, ClusterError> {
    let info = client(kubeconfig, context)
        .await?
        .apiserver_version()
        .await
        .map_err(|e| ClusterError::Api(e.to_string()))?;
    Ok(info.git_version)
}

/// Whether the API server says it is ready (`/readyz`: etcd reachable, the bootstrap RBAC
/// policy and priority levels in place), not merely answering.
pub async fn ready(kubeconfig: &Path) -> Result<(), ClusterError> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| ClusterError::Api(e.to_string()))?;
    let text = client(kubeconfig, None)
        .await?
        .request_text(request)
        .await
        .map_err(|e| ClusterError::Api(e.to_string()))?;
    if text.trim() == "ok" {
        Ok(())
    } else {
        Err(ClusterError::Api(format!("/readyz: {text}")))
    }
}

/// Creates or updates each object (server-side apply, as `ingressbench`): ClusterRoles,
/// ClusterRoleBindings and IngressClasses, the cluster-wide kinds the local cluster sets up.
pub async fn apply_all(
    kubeconfig: &Path,
    objects: &[serde_json::Value],
) -> Result<(), ClusterError> {
    use k8s_openapi::api::networking::v1::IngressClass;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::{Patch, PatchParams};
    let client = client(kubeconfig, None).await?;
    let params = PatchParams::apply("ingressbench").force();
    for object in objects {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let patch = Patch::Apply(object);
        let result = match object["kind"].as_str() {
            Some("ClusterRole") => kube::Api::<ClusterRole>::all(client.clone())
                .patch(name, &params, &patch)
                .await
                .map(|_| ()),
            Some("ClusterRoleBinding") => kube::Api::<ClusterRoleBinding>::all(client.clone())
                .patch(name, &params, &patch)
                .await
                .map(|_| ()),
            Some("IngressClass") => kube::Api::<IngressClass>::all(client.clone())
                .patch(name, &params, &patch)
                .await
                .map(|_| ()),
            other => return Err(ClusterError::Api(format!("cannot apply a {other:?}"))),
        };
        result.map_err(|e| ClusterError::Api(format!("applying {name}: {e}")))?;
    }
    Ok(())
}
