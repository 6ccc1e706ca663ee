//! A cell in a Kubernetes cluster ([`ClusterSite`]): the scenario's backends as a
//! Deployment of `ingressbench backend` pods behind a Service, its routes as an Ingress of
//! the target's class, in a namespace of the cell's own (see
//! [`ingressbench_cluster::deploy`]); events go through the API as a person or a pipeline
//! would make them, and each change's `endpoints_at` is when the Service's EndpointSlices
//! showed the new set (the control plane's part; the traffic shows the proxy's part).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ingressbench_cluster::deploy::{EndpointsWatch, PodState, RunNamespace, RunObjects};
use ingressbench_cluster::file::ClusterFile;
use ingressbench_lab::{Change, ChangeRecord};

use crate::site::{CellFailure, Entry, Site};

/// Where a run's cells go when it runs with `--cluster`.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The cluster file.
    pub file: ClusterFile,
    /// The kubeconfig.
    pub kubeconfig: PathBuf,
    /// The context (`--context`, else the file's, else the current one).
    pub context: Option<String>,
    /// The run's id: namespaces are `PREFIX-ID-CELL`.
    pub run_id: String,
}

/// Checks, before anything is made, that every cell can run in the cluster the file
/// describes: its target placed (a target the file does not name is an error, never
/// skipped), plain HTTP, and only the events cluster mode makes through the API.
pub fn check_cells(cells: &[crate::Cell], file: &ClusterFile) -> Result<(), String> {
    let names: Vec<String> = cells.iter().map(|c| c.target.name()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let unplaced = file.unplaced(&names);
    if !unplaced.is_empty() {
        return Err(format!(
            "the cluster file does not place target(s) {}: add each under `targets:` with its ingress_class and address (the cluster file says where, the scenario what)",
            unplaced.join(", ")
        ));
    }
    for cell in cells {
        if cell.scenario.tls {
            return Err(format!(
                "cell {} ({}): cluster mode does not terminate TLS yet; run with --set tls=false",
                cell.index,
                cell.label()
            ));
        }
        for (i, e) in cell.events.iter().enumerate() {
            if matches!(
                e.action,
                crate::model::Action::Config(_)
                    | crate::model::Action::Reload
                    | crate::model::Action::StallBackend { .. }
            ) {
                return Err(format!(
                    "events[{i}]: route changes, reloads and backend stalls are not done in cluster mode yet (scale, kill and terminate are)"
                ));
            }
        }
    }
    Ok(())
}

/// How long the routes may take to answer through the controller after the objects are
/// made.
const ROUTING_TIMEOUT: Duration = Duration::from_secs(90);
/// Container waiting reasons that mean a pod will not start without a change.
const CANNOT_START: &[&str] = &[
    "ErrImageNotKnown",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CrashLoopBackOff",
    "SysctlForbidden",
];
/// How often the namespace's heartbeat is refreshed.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(30);

/// A change waiting for the EndpointSlices to show it.
enum Expect {
    /// `n` ready endpoints.
    Ready(usize),
    /// This address gone from the ready ones.
    Gone(String),
}

/// One cell's objects in a cluster; the namespace is deleted when it is dropped.
pub(crate) struct ClusterSite {
    /// The pool's EndpointSlices as the watch delivers them.
    endpoints: EndpointsWatch,
    run: RunNamespace,
    address: String,
    records: Vec<ChangeRecord>,
    /// Changes not yet in the EndpointSlices: record, what to look for, and when it was
    /// asked (just before the API call).
    pending: Vec<(usize, Expect, Instant)>,
    /// Pods before each pending scale, to name the ones it started.
    before: Vec<(usize, Vec<String>)>,
    beat_at: Instant,
}

impl ClusterSite {
    /// Makes the cell's namespace for target `target`, with `replicas` backends routed at
    /// `routes`, and waits (bounded) until every route answers through the controller.
    pub(crate) fn up(
        options: &ClusterOptions,
        target: &str,
        cell: usize,
        replicas: usize,
        routes: Vec<(String, String)>,
        sysctls: std::collections::BTreeMap<String, String>,
    ) -> Result<Self, CellFailure> {
        let placed = options.file.targets.get(target).ok_or_else(|| {
            format!("target `{target}` is not in the cluster file: add it under `targets:` with its ingress_class and address")
        })?;
        let address = placed.address.clone().ok_or_else(|| {
            format!("target `{target}`: reading the address from a LoadBalancer Service is not done yet; give `address:` in the cluster file")
        })?;
        let objects = RunObjects {
            namespace: format!(
                "{}-{}-{cell}",
                options.file.namespace_prefix, options.run_id
            ),
            run_id: options.run_id.clone(),
            pool: "echo".into(),
            replicas: i32::try_from(replicas).map_err(|e| e.to_string())?,
            image: options.file.image.clone(),
            backend_args: Vec::new(),
            routes,
            ingress_class: placed.ingress_class.clone(),
            sysctls,
            grace_s: 10,
        };
        let run = RunNamespace::create(&options.kubeconfig, options.context.as_deref(), objects)
            .map_err(|e| e.to_string())?;
        let endpoints = match run.watch_endpoints(&options.kubeconfig, options.context.as_deref()) {
            Ok(w) => w,
            Err(e) => {
                let _ = run.delete();
                return Err(e.to_string().into());
            }
        };
        let site = Self {
            endpoints,
            run,
            address,
            records: Vec::new(),
            pending: Vec::new(),
            before: Vec::new(),
            beat_at: Instant::now(),
        };
        site.wait_routing(replicas)?;
        Ok(site)
    }

    /// Ready means routing: every pod ready and in the EndpointSlices, and every route
    /// answered through the controller by one of them.
    fn wait_routing(&self, replicas: usize) -> Result<(), CellFailure> {
        let deadline = Instant::now() + ROUTING_TIMEOUT;
        let o = self.run.objects();
        let mut last = String::from("nothing asked yet");
        while Instant::now() < deadline {
            let pods = self.run.pods().map_err(|e| e.to_string())?;
            // A pod that cannot start will not start later: say so now.
            if let Some((pod, why)) = pods.iter().find_map(|p| {
                let w = p.waiting.as_deref()?;
                CANNOT_START
                    .iter()
                    .any(|r| w.starts_with(r))
                    .then_some((&p.name, w))
            }) {
                return Err(CellFailure {
                    message: format!(
                        "pod {}/{pod} cannot start: {why}; set `image:` in the cluster file to an image of ingressbench the cluster's nodes can pull (docs/CLUSTER.md)",
                        o.namespace
                    ),
                    input: true,
                });
            }
            let ready: Vec<&PodState> = pods.iter().filter(|p| p.ready).collect();
            let endpoints = self.run.ready_endpoints().map_err(|e| e.to_string())?;
            if ready.len() < replicas || endpoints.len() < replicas {
                last = format!(
                    "{} of {replicas} pods ready, {} in the EndpointSlices",
                    ready.len(),
                    endpoints.len()
                );
            } else {
                let answered = o.routes.iter().all(|(host, path)| {
                    let host = if host == "*" { "app.test" } else { host };
                    match ask(&self.address, host, path) {
                        Some(b) if pods.iter().any(|p| p.name == b) => true,
                        Some(b) => {
                            last = format!(
                                "{host}{path} answered by `{b}`, not one of this run's pods"
                            );
                            false
                        }
                        None => {
                            last = format!(
                                "{host}{path} not answered by a backend through {}",
                                self.address
                            );
                            false
                        }
                    }
                });
                if answered {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(CellFailure::from(format!(
            "the routes of ingress {}/{} did not answer through {} within {} s ({last}); is a controller serving ingress class `{}` and reachable there? `ingressbench cluster check` says",
            o.namespace,
            o.pool,
            self.address,
            ROUTING_TIMEOUT.as_secs(),
            o.ingress_class
        )))
    }

    /// The pool's pods not being deleted, by name.
    fn live_pods(&self) -> Result<Vec<PodState>, String> {
        let pods = self.run.pods().map_err(|e| e.to_string())?;
        Ok(pods.into_iter().filter(|p| !p.terminating).collect())
    }

    /// The pod an event names: `POOL-N` is the N-th by name of the pods not being deleted,
    /// `None` one of them at random.
    fn pick(&self, name: Option<&str>) -> Result<PodState, String> {
        let pods = self.live_pods()?;
        if pods.is_empty() {
            return Err("no pod of the pool is running".into());
        }
        let index = match name {
            None => {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .subsec_nanos() as usize
                    % pods.len()
            }
            Some(n) => n
                .rsplit_once('-')
                .and_then(|(_, k)| k.parse::<usize>().ok())
                .and_then(|k| k.checked_sub(1))
                .filter(|k| *k < pods.len())
                .ok_or_else(|| format!("`{n}`: the pool has {} pods", pods.len()))?,
        };
        Ok(pods[index].clone())
    }

    fn record(
        &mut self,
        what: String,
        removed: Vec<String>,
        expect: Expect,
        asked: Instant,
    ) -> usize {
        // Requested when the tool sent it (the call then succeeded): the control plane
        // can publish the change before the API's answer is back here.
        self.records.push(ChangeRecord {
            what,
            requested_at: asked,
            applied_at: None,
            endpoints_at: None,
            mechanisms: Vec::new(),
            started: Vec::new(),
            removed,
            generations: Vec::new(),
        });
        let index = self.records.len() - 1;
        self.pending.push((index, expect, asked));
        index
    }
}

impl Site for ClusterSite {
    fn entry(&self, tls: bool, _host: &str, path: &str) -> Result<Entry, String> {
        if tls {
            return Err("cluster mode does not terminate TLS yet: run with --set tls=false".into());
        }
        Ok(Entry {
            url: format!("{}{path}", self.address.trim_end_matches('/')),
            tls: None,
            host_header: true,
            proxy_version: None,
        })
    }

    fn request(&mut self, change: Change, _delay: Duration) -> Result<usize, String> {
        let kill = matches!(change, Change::Kill(_));
        match change {
            Change::Scale { pool, replicas } => {
                let now: Vec<String> = self.live_pods()?.into_iter().map(|p| p.name).collect();
                let before = now.len();
                let asked = Instant::now();
                self.run
                    .scale(i32::try_from(replicas).map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
                let index = self.record(
                    format!("scale {pool} {before}->{replicas}"),
                    Vec::new(),
                    Expect::Ready(replicas),
                    asked,
                );
                self.before.push((index, now));
                Ok(index)
            }
            Change::Kill(name) | Change::Terminate(name) => {
                let pod = self.pick(name.as_deref())?;
                let asked = Instant::now();
                self.run
                    .delete_pod(&pod.name, kill.then_some(0))
                    .map_err(|e| e.to_string())?;
                let verb = if kill { "kill" } else { "terminate" };
                let expect = match pod.ip {
                    Some(ip) => Expect::Gone(ip),
                    None => Expect::Ready(0),
                };
                Ok(self.record(
                    format!("{verb} {}", pod.name),
                    vec![pod.name],
                    expect,
                    asked,
                ))
            }
            Change::Overlay(_) | Change::Reload | Change::Stall { .. } => Err(
                "route changes, reloads and backend stalls are not done in cluster mode yet: scale, kill and terminate are"
                    .into(),
            ),
        }
    }

    fn tick(&mut self) -> Result<(), String> {
        let now = Instant::now();
        if now.duration_since(self.beat_at) >= HEARTBEAT_EVERY {
            self.beat_at = now;
            self.run.heartbeat().map_err(|e| e.to_string())?;
        }
        // Each pending change is shown by the first set the watch delivered after it was
        // asked that has it.
        let mut done = Vec::new();
        for (i, (index, expect, asked)) in self.pending.iter().enumerate() {
            let shown = self
                .endpoints
                .since(*asked)
                .into_iter()
                .filter(|(at, _)| at > asked)
                .find(|(_, set)| match expect {
                    Expect::Ready(n) => set.len() == *n,
                    Expect::Gone(ip) => !set.contains(ip),
                });
            if let Some((at, _)) = shown {
                done.push(i);
                self.records[*index].endpoints_at = Some(at);
                self.records[*index].applied_at = Some(at);
            }
        }
        for i in done.into_iter().rev() {
            let (index, _, _) = self.pending.remove(i);
            if let Some(at) = self.before.iter().position(|(k, _)| *k == index) {
                let (_, before) = self.before.remove(at);
                let pods = self.run.pods().map_err(|e| e.to_string())?;
                let live = |name: &String| pods.iter().any(|p| &p.name == name && !p.terminating);
                // A scale-up's new pods; a scale-down's pods the Deployment chose to stop.
                self.records[index].started = pods
                    .iter()
                    .filter(|p| p.ready && !before.contains(&p.name))
                    .map(|p| p.name.clone())
                    .collect();
                self.records[index].removed = before.iter().filter(|n| !live(n)).cloned().collect();
            }
        }
        Ok(())
    }

    fn records(&self) -> &[ChangeRecord] {
        &self.records
    }
}

impl Drop for ClusterSite {
    fn drop(&mut self) {
        let _ = self.run.delete();
    }
}

/// `GET path` with `Host: host` through `address` (`http://host:port`); the `x-backend`
/// of the answer.
fn ask(address: &str, host: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let authority = address.strip_prefix("http://")?.trim_end_matches('/');
    let addr = std::net::ToSocketAddrs::to_socket_addrs(authority)
        .ok()?
        .next()?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("x-backend: ")
            .map(|v| v.trim().to_owned())
    })
}
