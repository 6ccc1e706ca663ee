//! A run's objects in a cluster: a namespace of its own (labelled as the tool's, with the
//! run's id and a heartbeat the run refreshes), the backends (a Deployment of
//! `ingressbench backend` pods and a Service) and the routes (an Ingress of the target's
//! class). Changes go through the API as a person or a pipeline makes them (scale the
//! Deployment, delete a pod), and everything goes with the namespace, on every exit path.
//! Whatever a run of the tool left behind is found again by its label, never by name
//! ([`cleanup`]).
//!
//! The objects themselves are built in `objects.rs`; the EndpointSlice watch that times a
//! change is `endpoints.rs`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};

use crate::api::ClusterApi;
use crate::ClusterError;

mod endpoints;
pub mod mesh;
mod objects;
mod rollout;
pub use rollout::{Rollout, RolloutState, RESTARTED_AT};

pub use crate::meta::{
    CANNOT_START, HEARTBEAT, MANAGED_BY, OWNER, POOL_LABEL, RUN_LABEL, STALE_AFTER, TOOL,
};
use endpoints::ready_addresses;
pub use endpoints::EndpointsWatch;
use objects::{
    control_secret, deployment, labels, pool_selector, service, tls_secret, CONTROL_SECRET,
};
pub(crate) use objects::{ingress_object, tls_secret_name};

/// The port the backends listen on.
pub const BACKEND_PORT: i32 = 8080;

/// The port of the backends' control endpoint (`POST /stall?for=2s`), reached through
/// the API server's pod proxy, never through the Service, with the run's token (a Secret
/// of the run's namespace): another pod that reaches it is refused.
pub const CONTROL_PORT: i32 = 8081;

/// What a run puts in its namespace.
#[derive(Clone, Debug)]
pub struct RunObjects {
    /// The namespace's name (a prefix and the run's id).
    pub namespace: String,
    /// The run's id (label value).
    pub run_id: String,
    /// The pool: the Deployment's and the Service's name (`echo`). Events scale it and
    /// delete its pods; its EndpointSlices are watched.
    pub pool: String,
    /// Replicas at the start.
    pub replicas: i32,
    /// More pools (a Deployment and a Service each, by name, with replicas at the start)
    /// that routes may go to; nothing acts on them.
    pub other_pools: Vec<(String, i32)>,
    /// The image that runs `ingressbench backend`.
    pub image: String,
    /// Extra `ingressbench backend` options (`--latency 2ms`).
    pub backend_args: Vec<String>,
    /// Routes: host, path prefix and pool.
    pub routes: Vec<Route>,
    /// Where the routes go: an Ingress of a class, or HTTPRoutes of a Gateway.
    pub routing: crate::routes::Routing,
    /// The route configuration's generation at the start (none: a run without route
    /// changes, whose answers carry none).
    pub generation: Option<u32>,
    /// Every CORS origin the run's route changes will ask for: what a change names is
    /// made with the first routes (Traefik's Middlewares for Gateway API routes).
    pub cors_origins: Vec<String>,
    /// Kernel settings of the backends' pods (`securityContext.sysctls`).
    pub sysctls: BTreeMap<String, String>,
    /// Seconds a deleted pod gets to drain.
    pub grace_s: i64,
    /// The routes' certificate (chain) and key, PEM: a `kubernetes.io/tls` Secret the
    /// Ingress names for its hosts.
    pub tls: Option<(String, String)>,
    /// A sidecar in every backend pod, and how the controller reaches it.
    pub mesh: Option<mesh::Mesh>,
    /// What the load sends through the routes.
    pub traffic: Traffic,
}

/// What a run's load sends, where a controller must be told of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Traffic {
    /// Requests (HTTP/1.1 or HTTP/2 from the client, HTTP/1.1 to the backends), event
    /// streams and WebSockets: every controller here lets upgrades through as it is
    /// (measured: Contour 1.33's Ingress and HTTPProxy routes take them without
    /// `websocket-routes` or `enableWebsockets`).
    #[default]
    Http,
    /// gRPC: HTTP/2 without TLS (h2c) to the backends, through the controller's routes
    /// for gRPC (a Gateway's GRPCRoutes; an Ingress's backend-protocol setting).
    Grpc,
}

/// A route of the run: requests for `host` (`*`: any) under `prefix` go to `pool`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The host (`*`: any).
    pub host: String,
    /// The path prefix.
    pub prefix: String,
    /// The pool's name (its Service's).
    pub pool: String,
}

/// A pod of a pool as the API reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodState {
    /// Its name (what the backend answers in `x-backend`).
    pub name: String,
    /// The backend pool it serves (its `ingressbench.dev/pool` label).
    pub pool: String,
    /// Its address, once it has one.
    pub ip: Option<String>,
    /// Ready, by its readiness probe.
    pub ready: bool,
    /// Being deleted.
    pub terminating: bool,
    /// Why its container is not running, as the node says (`ErrImagePull: …`).
    pub waiting: Option<String>,
}

/// A run's namespace, made and changed through the API; deleted by [`RunNamespace::delete`]
/// (and, if the run is killed, by [`cleanup`] once its heartbeat is stale).
pub struct RunNamespace {
    /// The run's connection to the cluster.
    api: ClusterApi,
    objects: RunObjects,
    /// What the backends' control endpoints obey (from [`objects::control_secret`]).
    control_token: String,
}

/// A run's namespace as another thread reaches it (see [`RunNamespace::twin`]).
#[derive(Clone, Debug)]
pub struct Twin {
    api: ClusterApi,
    objects: RunObjects,
    control_token: String,
}

impl Twin {
    /// The namespace, on the run's connection. Dropping it deletes nothing.
    pub fn open(self) -> Result<RunNamespace, ClusterError> {
        Ok(RunNamespace {
            api: self.api,
            objects: self.objects,
            control_token: self.control_token,
        })
    }
}

impl RunNamespace {
    /// Makes the namespace and everything in it; on an error, deletes what it made.
    pub fn create(api: &ClusterApi, objects: RunObjects) -> Result<Self, ClusterError> {
        let run = Self {
            api: api.clone(),
            objects,
            control_token: crate::api::random_token(16)?,
        };
        run.api
            .runtime
            .block_on(create_namespace(&run.api.client, &run.objects))?;
        // From here on, the namespace is ours to delete if the rest fails.
        if let Err(e) = run.api.runtime.block_on(create_objects(
            &run.api.client,
            &run.objects,
            &run.control_token,
        )) {
            let _ = run.delete();
            return Err(e);
        }
        Ok(run)
    }

    /// What another thread needs to reach this namespace ([`Twin::open`]).
    pub fn twin(&self) -> Twin {
        Twin {
            api: self.api.clone(),
            objects: self.objects.clone(),
            control_token: self.control_token.clone(),
        }
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.objects.namespace
    }

    /// What it holds.
    pub fn objects(&self) -> &RunObjects {
        &self.objects
    }

    /// Sets the pool's replicas (a patch of the Deployment's scale, as `kubectl scale`).
    pub fn scale(&self, replicas: i32) -> Result<(), ClusterError> {
        let api: Api<Deployment> = Api::namespaced(self.api.client.clone(), self.name());
        let patch = serde_json::json!({ "spec": { "replicas": replicas } });
        self.api
            .runtime
            .block_on(api.patch_scale(
                &self.objects.pool,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ))
            .map(|_| ())
            .map_err(|e| api_error(&format!("scaling deployment {}", self.objects.pool), e))
    }

    /// Deletes pod `name`, with `grace` seconds to drain (`Some(0)`: killed at once;
    /// `None`: its own grace period).
    pub fn delete_pod(&self, name: &str, grace: Option<u32>) -> Result<(), ClusterError> {
        let api: Api<Pod> = Api::namespaced(self.api.client.clone(), self.name());
        let params = DeleteParams {
            grace_period_seconds: grace,
            ..DeleteParams::default()
        };
        self.api
            .runtime
            .block_on(api.delete(name, &params))
            .map(|_| ())
            .map_err(|e| api_error(&format!("deleting pod {name}"), e))
    }

    /// Asks pod `name`'s backend, through the API server's pod proxy, to hold its answers
    /// for `duration` (its control endpoint).
    pub fn stall_pod(&self, name: &str, duration: Duration) -> Result<(), ClusterError> {
        let path = format!(
            "/api/v1/namespaces/{}/pods/{name}:{CONTROL_PORT}/proxy/stall?for={}ms",
            self.name(),
            duration.as_millis()
        );
        let request = http::Request::post(path)
            .header(
                ingressbench_lab::backend::CONTROL_TOKEN_HEADER,
                &self.control_token,
            )
            .body(Vec::new())
            .map_err(|e| ClusterError::Api(e.to_string()))?;
        self.api
            .runtime
            .block_on(self.api.client.request_text(request))
            .map(|_| ())
            .map_err(|e| api_error(&format!("stalling pod {name}"), e))
    }

    /// The pool's pods, by name.
    pub fn pods(&self) -> Result<Vec<PodState>, ClusterError> {
        self.pods_matching(&pool_selector(&self.objects.pool))
    }

    /// The pods of every pool of the run, by name.
    pub fn all_pods(&self) -> Result<Vec<PodState>, ClusterError> {
        self.pods_matching(POOL_LABEL)
    }

    fn pods_matching(&self, selector: &str) -> Result<Vec<PodState>, ClusterError> {
        let api: Api<Pod> = Api::namespaced(self.api.client.clone(), self.name());
        // A read, asked again when the connection failed (twice, 250 ms apart): the
        // cluster test's capacity search lost a cell to one `client error (Connect)` on
        // a machine busy with the tests beside it.
        let mut tries = 0;
        let list = loop {
            tries += 1;
            match (self.api.runtime).block_on(api.list(&ListParams::default().labels(selector))) {
                Err(e)
                    if tries < 3
                        && matches!(e, kube::Error::Service(_) | kube::Error::HyperError(_)) =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(250));
                }
                other => break other.map_err(|e| api_error("listing pods", e))?,
            }
        };
        let mut pods: Vec<PodState> = list
            .items
            .into_iter()
            .map(|p| {
                let status = p.status.unwrap_or_default();
                PodState {
                    pool: p
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(POOL_LABEL).cloned())
                        .unwrap_or_default(),
                    name: p.metadata.name.unwrap_or_default(),
                    ip: status.pod_ip,
                    ready: status
                        .conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True"),
                    terminating: p.metadata.deletion_timestamp.is_some(),
                    waiting: status
                        .container_statuses
                        .iter()
                        .flatten()
                        .find_map(|c| c.state.as_ref()?.waiting.clone())
                        .and_then(|w| {
                            let reason = w.reason?;
                            Some(match w.message {
                                Some(m) => format!("{reason}: {m}"),
                                None => reason,
                            })
                        }),
                }
            })
            .collect();
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(pods)
    }

    /// The addresses the Service's EndpointSlices list as ready: what the control plane
    /// tells the ingress controllers.
    pub fn ready_endpoints(&self) -> Result<Vec<String>, ClusterError> {
        let api: Api<EndpointSlice> = Api::namespaced(self.api.client.clone(), self.name());
        let selector = format!("kubernetes.io/service-name={}", self.objects.pool);
        let list = self
            .api
            .runtime
            .block_on(api.list(&ListParams::default().labels(&selector)))
            .map_err(|e| api_error("listing endpoint slices", e))?;
        let mut ready: Vec<String> = list.items.iter().flat_map(ready_addresses).collect();
        ready.sort();
        ready.dedup();
        Ok(ready)
    }

    /// Creates or updates objects of any kind in the namespace (the routes, a
    /// controller's own resources), by server-side apply.
    pub fn apply(&self, objects: &[serde_json::Value]) -> Result<(), ClusterError> {
        self.api
            .runtime
            .block_on(apply_here(&self.api.client, &self.objects, objects))
    }

    /// Applies `objects` as [`RunNamespace::apply`] does, up to `in_flight` at a time.
    pub fn apply_concurrently(
        &self,
        objects: &[serde_json::Value],
        in_flight: usize,
    ) -> Result<(), ClusterError> {
        let objects = self.own(objects);
        self.api.runtime.block_on(crate::api::apply_concurrently(
            &self.api.client,
            &objects,
            in_flight,
        ))
    }

    /// Deletes objects of the namespace (`apiVersion`, kind, name), up to `in_flight` at
    /// a time; one gone already is fine.
    pub fn delete_concurrently(
        &self,
        objects: &[(&str, &str, String)],
        in_flight: usize,
    ) -> Result<(), ClusterError> {
        self.api.runtime.block_on(crate::api::delete_concurrently(
            &self.api.client,
            self.name(),
            objects,
            in_flight,
        ))
    }

    /// Deletes the run's generated routes (and what they name), one call per kind.
    pub fn delete_generated(&self) -> Result<(), ClusterError> {
        let selector = format!("{}=true", crate::routes::generated::GENERATED_LABEL);
        self.api.runtime.block_on(async {
            for (api_version, kind) in crate::routes::generated::KINDS {
                crate::api::delete_labelled(
                    &self.api.client,
                    api_version,
                    kind,
                    self.name(),
                    &selector,
                )
                .await?;
            }
            Ok(())
        })
    }

    /// `objects` as the run's: in its namespace, with its labels beside their own.
    fn own(&self, objects: &[serde_json::Value]) -> Vec<serde_json::Value> {
        own(&self.objects, objects)
    }

    /// Object `name` of any kind in the namespace, as the API returns it (`None`: there is
    /// none).
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        name: &str,
    ) -> Result<Option<serde_json::Value>, ClusterError> {
        self.api.runtime.block_on(crate::api::get(
            &self.api.client,
            api_version,
            kind,
            Some(self.name()),
            name,
        ))
    }

    /// Deletes the run's routes (the Ingress or HTTPRoutes, and what they name), before
    /// the namespace: its pods take their grace period to go, and until then a route
    /// left in it would still claim its hosts and paths on a shared controller (Contour
    /// refuses a later route with the same match).
    pub fn delete_routes(&self) -> Result<(), ClusterError> {
        let routes =
            crate::routes::render(&self.objects, self.objects.generation, &Default::default());
        self.api.runtime.block_on(async {
            for r in routes.iter().rev() {
                crate::api::delete(
                    &self.api.client,
                    r["apiVersion"].as_str().unwrap_or_default(),
                    r["kind"].as_str().unwrap_or_default(),
                    Some(self.name()),
                    r["metadata"]["name"].as_str().unwrap_or_default(),
                )
                .await?;
            }
            Ok(())
        })
    }

    /// The Job of `spec`'s load workers, to be made in this namespace (see
    /// [`crate::workers`]).
    pub fn load_job(&self, spec: crate::workers::FleetSpec) -> crate::workers::LoadJob {
        crate::workers::LoadJob {
            api: self.api.clone(),
            object: crate::workers::JobObject {
                namespace: self.objects.namespace.clone(),
                run_id: self.objects.run_id.clone(),
                image: self.objects.image.clone(),
                spec,
            },
        }
    }

    /// Refreshes the heartbeat, so that [`cleanup`] leaves the namespace alone.
    pub fn heartbeat(&self) -> Result<(), ClusterError> {
        let api: Api<Namespace> = Api::all(self.api.client.clone());
        let patch = serde_json::json!({ "metadata": { "annotations": { HEARTBEAT: now_s().to_string() } } });
        self.api
            .runtime
            .block_on(api.patch(self.name(), &PatchParams::default(), &Patch::Merge(&patch)))
            .map(|_| ())
            .map_err(|e| api_error("refreshing the heartbeat", e))
    }

    /// Asks for the namespace's deletion (and with it everything the run made); does not
    /// wait for it to be gone.
    pub fn delete(&self) -> Result<(), ClusterError> {
        let api: Api<Namespace> = Api::all(self.api.client.clone());
        self.api
            .runtime
            .block_on(api.delete(self.name(), &DeleteParams::foreground()))
            .map(|_| ())
            .or_else(|e| match e {
                kube::Error::Api(s) if s.code == 404 => Ok(()),
                e => Err(api_error(&format!("deleting namespace {}", self.name()), e)),
            })
    }
}

/// The controller that serves a target's routes: its IngressClass's `spec.controller`
/// (e.g. [`crate::routes::traefik::CONTROLLER`]), or its Gateway's class's
/// `controllerName`.
pub fn route_controller(
    api: &ClusterApi,
    target: &crate::file::ClusterTarget,
) -> Result<String, ClusterError> {
    use k8s_openapi::api::networking::v1::IngressClass;
    api.run(async {
        let client = api.client();
        match (&target.ingress_class, &target.gateway) {
            (Some(class), _) => {
                let found = Api::<IngressClass>::all(client)
                    .get(class)
                    .await
                    .map_err(|e| api_error(&format!("reading ingress class {class}"), e))?;
                Ok(found.spec.and_then(|s| s.controller).unwrap_or_default())
            }
            (None, Some(gateway)) => crate::routes::gateway::controller_of(&client, gateway)
                .await
                .map_err(ClusterError::Api),
            (None, None) => Err(ClusterError::Api(
                "the target names neither an ingress class nor a gateway".into(),
            )),
        }
    })
}

/// The value of `key` in Secret `secret` (as text).
pub fn secret_value(
    api: &ClusterApi,
    secret: &crate::file::ServiceRef,
    key: &str,
) -> Result<String, ClusterError> {
    api.run(async {
        let client = api.client();
        let api: Api<Secret> = Api::namespaced(client, &secret.namespace);
        let what = format!("secret {}/{}", secret.namespace, secret.name);
        let found = api
            .get(&secret.name)
            .await
            .map_err(|e| api_error(&format!("reading {what}"), e))?;
        found
            .data
            .and_then(|d| {
                d.get(key)
                    .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            })
            .ok_or_else(|| ClusterError::Api(format!("{what} has no `{key}`")))
    })
}

/// The labels Service `service` selects its pods by (none: it has no selector: its
/// endpoints are made by hand, or the controller runs outside the cluster's pods).
pub fn service_selector(
    api: &ClusterApi,
    service: &crate::file::ServiceRef,
) -> Result<Option<BTreeMap<String, String>>, ClusterError> {
    api.run(async {
        let client = api.client();
        let api: Api<Service> = Api::namespaced(client, &service.namespace);
        let found = api.get(&service.name).await.map_err(|e| {
            api_error(
                &format!("reading service {}/{}", service.namespace, service.name),
                e,
            )
        })?;
        Ok(found
            .spec
            .and_then(|s| s.selector)
            .filter(|s| !s.is_empty()))
    })
}

/// Deletes every namespace of the tool left by a run that is gone: its heartbeat older
/// than [`STALE_AFTER`], or its owner a process of this machine that is not running. Only
/// namespaces with the tool's label are looked at. Returns their names.
pub fn cleanup(api: &ClusterApi) -> Result<Vec<String>, ClusterError> {
    api.run(async {
        let client = api.client();
        let api: Api<Namespace> = Api::all(client);
        let ours = api
            .list(&ListParams::default().labels(&format!("{MANAGED_BY}={TOOL}")))
            .await
            .map_err(|e| api_error("listing the tool's namespaces", e))?;
        let now = now_s();
        let mut removed = Vec::new();
        for ns in ours.items {
            let name = ns.metadata.name.clone().unwrap_or_default();
            let beat = ns
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(HEARTBEAT))
                .and_then(|b| b.parse::<u64>().ok())
                .unwrap_or(0);
            let terminating = ns.metadata.deletion_timestamp.is_some();
            let owner_gone = ns
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(OWNER))
                .is_some_and(|o| gone_here(o));
            if terminating || (!owner_gone && now.saturating_sub(beat) < STALE_AFTER.as_secs()) {
                continue;
            }
            match api.delete(&name, &DeleteParams::foreground()).await {
                Ok(_) => removed.push(name),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(api_error(&format!("deleting namespace {name}"), e)),
            }
        }
        Ok(removed)
    })
}

async fn create_namespace(client: &Client, o: &RunObjects) -> Result<(), ClusterError> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(o.namespace.clone()),
            labels: Some(labels(o)),
            annotations: Some(BTreeMap::from([
                (HEARTBEAT.to_owned(), now_s().to_string()),
                (OWNER.to_owned(), owner()),
            ])),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map(|_| ())
        .map_err(|e| api_error(&format!("creating namespace {}", o.namespace), e))
}

async fn create_objects(
    client: &Client,
    o: &RunObjects,
    control_token: &str,
) -> Result<(), ClusterError> {
    let post = PostParams::default();
    let ns = o.namespace.as_str();
    // Before the pods that read it.
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&post, &control_secret(o, control_token))
        .await
        .map_err(|e| api_error(&format!("creating secret {CONTROL_SECRET}"), e))?;
    let pools = std::iter::once((&o.pool, o.replicas)).chain(
        o.other_pools
            .iter()
            .map(|(name, replicas)| (name, *replicas)),
    );
    for (pool, replicas) in pools {
        Api::<Deployment>::namespaced(client.clone(), ns)
            .create(&post, &deployment(o, pool, replicas))
            .await
            .map_err(|e| api_error(&format!("creating deployment {pool}"), e))?;
        Api::<Service>::namespaced(client.clone(), ns)
            .create(&post, &service(o, pool))
            .await
            .map_err(|e| api_error(&format!("creating service {pool}"), e))?;
    }
    for secret in mesh::secrets(o) {
        let name = secret.metadata.name.clone().unwrap_or_default();
        Api::<Secret>::namespaced(client.clone(), ns)
            .create(&post, &secret)
            .await
            .map_err(|e| api_error(&format!("creating secret {name}"), e))?;
    }
    if let Some(secret) = tls_secret(o) {
        Api::<Secret>::namespaced(client.clone(), ns)
            .create(&post, &secret)
            .await
            .map_err(|e| api_error(&format!("creating secret {}-tls", o.pool), e))?;
    }
    // What makes the controller reach the mesh's sidecars (Traefik's ServersTransports),
    // then the routes (as the run's first generation), as every later change: one apply.
    let mut routes: Vec<serde_json::Value> = std::iter::once(&o.pool)
        .chain(o.other_pools.iter().map(|(name, _)| name))
        .flat_map(|pool| crate::routes::mesh_rendered(o, pool).objects)
        .collect();
    routes.extend(crate::routes::render(o, o.generation, &Default::default()));
    apply_here(client, o, &routes).await
}

/// Applies `objects` in the run's namespace, with the run's labels.
async fn apply_here(
    client: &Client,
    o: &RunObjects,
    objects: &[serde_json::Value],
) -> Result<(), ClusterError> {
    crate::api::apply(client, &own(o, objects)).await
}

/// `objects` in the run's namespace, with the run's labels beside their own.
fn own(o: &RunObjects, objects: &[serde_json::Value]) -> Vec<serde_json::Value> {
    objects
        .iter()
        .cloned()
        .map(|mut v| {
            v["metadata"]["namespace"] = o.namespace.clone().into();
            let mut all = labels(o);
            if let Some(own) = v["metadata"]["labels"].as_object() {
                all.extend(
                    own.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))),
                );
            }
            v["metadata"]["labels"] = serde_json::json!(all);
            v
        })
        .collect()
}

/// This process as an owner: the machine's boot id and the pid.
fn owner() -> String {
    format!("{}/{}", boot_id(), std::process::id())
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Whether `owner` (`BOOT_ID/PID`) was a process of this machine, since its last boot,
/// that is not running any more. An owner elsewhere is never judged gone.
fn gone_here(owner: &str) -> bool {
    let Some((boot, pid)) = owner.split_once('/') else {
        return false;
    };
    let here = boot_id();
    !here.is_empty()
        && boot == here
        && pid
            .parse::<u32>()
            .is_ok_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn api_error(action: &str, e: kube::Error) -> ClusterError {
    let fix = match &e {
        kube::Error::Api(s) if s.code == 403 => {
            " (the run's identity lacks this permission: apply deploy/rbac.yaml and bind it, then `ingressbench cluster check`)"
        }
        kube::Error::Api(s) if s.code == 409 => " (it exists already: a run id was reused)",
        _ => "",
    };
    // What lies under it: `client error (Connect)` alone does not say what failed.
    let mut said = format!("{action}: {e}");
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !said.contains(&text) {
            said.push_str(&format!(": {text}"));
        }
        cause = c.source();
    }
    ClusterError::Api(format!("{said}{fix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_error_says_what_lies_under_a_failed_connection() {
        let under =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = kube::Error::Service(Box::new(under));
        let said = api_error("listing pods", e).to_string();
        assert!(
            said.contains("listing pods: ServiceError: connection refused"),
            "{said}"
        );
        // Said once, not again for each level that repeats it.
        assert_eq!(said.matches("connection refused").count(), 1, "{said}");
    }
}
