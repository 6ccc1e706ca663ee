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

/// Creates or updates each object of the cluster's administrator `kubeconfig` (the local
/// cluster's set-up: RBAC, the ingress class, the controller's CRDs); see [`apply`].
pub async fn apply_all(
    kubeconfig: &Path,
    objects: &[serde_json::Value],
) -> Result<(), ClusterError> {
    apply(&client(kubeconfig, None).await?, objects).await
}

/// Creates or updates each object (server-side apply, as `ingressbench`), of any kind:
/// its `apiVersion` and `kind` say where it goes, `metadata.namespace` whether it is
/// namespaced.
pub async fn apply(client: &Client, objects: &[serde_json::Value]) -> Result<(), ClusterError> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
    let params = PatchParams::apply("ingressbench").force();
    for object in objects {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let (group, version) = match object["apiVersion"].as_str().unwrap_or_default() {
            v if v.contains('/') => v.split_once('/').unwrap_or_default(),
            v => ("", v),
        };
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let api: kube::Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
            Some(ns) => kube::Api::namespaced_with(client.clone(), ns, &resource),
            None => kube::Api::all_with(client.clone(), &resource),
        };
        api.patch(name, &params, &Patch::Apply(object))
            .await
            .map_err(|e| ClusterError::Api(format!("applying {kind} {name}: {e}")))?;
    }
    Ok(())
}
