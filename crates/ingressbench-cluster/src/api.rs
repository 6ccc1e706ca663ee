//! Calls to a cluster's API, through `kube`.

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::ClusterError;

/// A secret token: `bytes` random bytes from the kernel, in hex.
pub(crate) fn random_token(bytes: usize) -> Result<String, ClusterError> {
    use std::io::Read;
    let mut read = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut r| r.read_exact(&mut read))
        .map_err(|source| ClusterError::Io {
            path: "/dev/urandom".into(),
            source,
        })?;
    Ok(read.iter().map(|b| format!("{b:02x}")).collect())
}

/// A held connection to a cluster's API for the length of a run: one runtime and one
/// client on it, cloned (cheaply) into every part of the run that calls the API. The
/// runtime has two worker threads of its own, so that any thread can make a call
/// ([`ClusterApi::run`]) and the client's connections are served between calls; a part
/// that waits on the API beside the run (a watch, a poll) does so on a thread of its own
/// ([`ClusterApi::on_own_thread`]) with the same client.
#[derive(Clone)]
pub struct ClusterApi {
    pub(crate) runtime: std::sync::Arc<tokio::runtime::Runtime>,
    pub(crate) client: Client,
    kubeconfig: PathBuf,
    context: Option<String>,
}

impl std::fmt::Debug for ClusterApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterApi")
            .field("kubeconfig", &self.kubeconfig)
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

impl ClusterApi {
    /// A connection to the cluster `kubeconfig` describes (its current context, or
    /// `context`). Nothing is asked of the API yet.
    pub fn connect(kubeconfig: &Path, context: Option<&str>) -> Result<Self, ClusterError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cluster-api")
            .enable_all()
            .build()
            .map_err(|e| ClusterError::Api(format!("starting the API client: {e}")))?;
        let client = runtime.block_on(client(kubeconfig, context))?;
        Ok(Self {
            runtime: std::sync::Arc::new(runtime),
            client,
            kubeconfig: kubeconfig.to_owned(),
            context: context.map(str::to_owned),
        })
    }

    /// Runs `work` to its end on the run's runtime, from the calling thread.
    pub fn run<F: std::future::Future>(&self, work: F) -> F::Output {
        self.runtime.block_on(work)
    }

    /// The client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The kubeconfig it was made from.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The context it uses, if not the kubeconfig's current one.
    pub fn context(&self) -> Option<&str> {
        self.context.as_deref()
    }

    /// Runs `work` on a thread of its own named `name`, with the run's client: for reads
    /// beside a run that must not hold the run up while they wait on the API.
    pub fn on_own_thread<W, F>(
        &self,
        name: &str,
        work: W,
    ) -> Result<std::thread::JoinHandle<()>, ClusterError>
    where
        W: FnOnce(Client) -> F + Send + 'static,
        F: std::future::Future<Output = ()>,
    {
        let api = self.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || api.run(work(api.client())))
            .map_err(|e| ClusterError::Api(format!("starting the {name} thread: {e}")))
    }
}

/// A runtime of its own for a caller of the API outside a run (the local control plane,
/// its node agent), on the calling thread.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, ClusterError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClusterError::Api(format!("cannot start an async runtime: {e}")))
}

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
    use kube::api::{Patch, PatchParams};
    let params = PatchParams::apply("ingressbench").force();
    for object in objects {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let api = dynamic(
            client,
            object["apiVersion"].as_str().unwrap_or_default(),
            kind,
            object["metadata"]["namespace"].as_str(),
        );
        api.patch(name, &params, &Patch::Apply(object))
            .await
            .map_err(|e| ClusterError::Api(format!("applying {kind} {name}: {}", refusal(&e))))?;
    }
    Ok(())
}

/// Applies `objects` as [`apply`] does, up to `in_flight` at a time (a controller's
/// thousands of routes are made the way a pipeline or kube-burner makes them, not one
/// round trip after another); the first error, naming its object, once all are answered.
pub async fn apply_concurrently(
    client: &Client,
    objects: &[serde_json::Value],
    in_flight: usize,
) -> Result<(), ClusterError> {
    at_most(objects, in_flight, |o| {
        apply(client, std::slice::from_ref(o))
    })
    .await
}

/// Deletes each of `objects` (`apiVersion`, kind, name) in `namespace` as [`delete`]
/// does, up to `in_flight` at a time; the first error once all are answered.
pub async fn delete_concurrently(
    client: &Client,
    namespace: &str,
    objects: &[(&str, &str, String)],
    in_flight: usize,
) -> Result<(), ClusterError> {
    at_most(objects, in_flight, |(api_version, kind, name)| {
        delete(client, api_version, kind, Some(namespace), name)
    })
    .await
}

/// `call` on each of `items`, at most `in_flight` at a time; the first error once all
/// are answered.
async fn at_most<'a, T, F>(
    items: &'a [T],
    in_flight: usize,
    call: impl FnMut(&'a T) -> F,
) -> Result<(), ClusterError>
where
    F: std::future::Future<Output = Result<(), ClusterError>>,
{
    use futures_util::StreamExt;
    let results: Vec<Result<(), ClusterError>> = futures_util::stream::iter(items)
        .map(call)
        .buffered(in_flight.max(1))
        .collect()
        .await;
    results.into_iter().collect()
}

/// Deletes every object of a kind in `namespace` that has `selector`'s labels, in one
/// call (a kind the API does not serve: nothing to delete).
pub async fn delete_labelled(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: &str,
    selector: &str,
) -> Result<(), ClusterError> {
    use kube::api::{DeleteParams, ListParams};
    let api = dynamic(client, api_version, kind, Some(namespace));
    match api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(selector),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(ClusterError::Api(format!(
            "deleting the {kind}s labelled {selector}: {e}"
        ))),
    }
}

/// What the API said of a refused call: its message and reason (`… is forbidden: … (422
/// Invalid)`), not the whole status; any other error as it is.
fn refusal(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        other => other.to_string(),
    }
}

/// Object `name` of any kind, as the API returns it (`None`: there is none).
pub async fn get(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<serde_json::Value>, ClusterError> {
    match dynamic(client, api_version, kind, namespace)
        .get(name)
        .await
    {
        Ok(o) => serde_json::to_value(o)
            .map(Some)
            .map_err(|e| ClusterError::Api(e.to_string())),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(ClusterError::Api(format!("reading {kind} {name}: {e}"))),
    }
}

/// Deletes object `name` of any kind (gone already: fine).
pub async fn delete(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> Result<(), ClusterError> {
    let api = dynamic(client, api_version, kind, namespace);
    match api.delete(name, &Default::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(ClusterError::Api(format!("deleting {kind} {name}: {e}"))),
    }
}

/// The API of one kind (`apiVersion` `group/version`, or `version` for the core group).
fn dynamic(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
) -> kube::Api<kube::api::DynamicObject> {
    use kube::api::{ApiResource, GroupVersionKind};
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    match namespace {
        Some(ns) => kube::Api::namespaced_with(client.clone(), ns, &resource),
        None => kube::Api::all_with(client.clone(), &resource),
    }
}
