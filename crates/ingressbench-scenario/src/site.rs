//! Where a cell runs: the one seam between the runner and the system under test.
//!
//! The runner drives a cell the same way wherever it runs: it asks the site for the
//! address to load, starts the load, fires events through [`Site::request`], ticks the
//! site while the load runs and reads back what each change did ([`ChangeRecord`]), then
//! asks the site what to record of itself. A [`LabSite`] is a lab of real proxies on this
//! machine; an [`Upstream`] is a URL nothing here manages (no events, nothing to record).
//! Events, times, the results store and the report are the same code for every site.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ingressbench_lab::kernel::ListenCounters;
use ingressbench_lab::labfile::LabFile;
use ingressbench_lab::model::UpstreamProtocol;

use ingressbench_lab::proxy::counters::Readings;
use ingressbench_lab::usage::Part;
use ingressbench_lab::{Change, ChangeRecord, Lab, RoutesDelta};
use ingressbench_load::TlsOptions;
use ingressbench_results::site::{Kernel, LinkOverhead, ListenQueue, Topology};
use serde_json::Value;

use crate::model::Target;
use crate::Cell;

/// How the load reaches a site.
pub(crate) struct Entry {
    /// The URL loaded.
    pub(crate) url: String,
    /// With TLS: the client's TLS options and the address the TLS name resolves to (none:
    /// the URL names the address and the options the TLS name).
    pub(crate) tls: Option<(TlsOptions, Option<SocketAddr>)>,
    /// Send the scenario's host in a `Host` header (plain HTTP to an address).
    pub(crate) host_header: bool,
    /// The proxy's version, when the site runs one it knows.
    pub(crate) proxy_version: Option<String>,
}

/// Why a cell could not run: what went wrong, and whether it was the input's fault (a
/// cluster file's image no node can run), which the command reports as a usage error.
#[derive(Debug)]
pub(crate) struct CellFailure {
    /// What went wrong and, where known, the fix.
    pub(crate) message: String,
    /// The input is wrong (exit 2), not the run.
    pub(crate) input: bool,
    /// A soak cell's verdict on what it measured before it failed (a proxy that died
    /// hours in).
    pub(crate) soak: Option<Box<ingressbench_results::soak::SoakRecord>>,
}

impl CellFailure {
    /// A failure that is the input's fault (exit 2), saying `message`.
    pub(crate) fn input(message: impl Into<String>) -> Self {
        Self {
            input: true,
            ..Self::from(message.into())
        }
    }
}

impl From<String> for CellFailure {
    fn from(message: String) -> Self {
        Self {
            message,
            input: false,
            soak: None,
        }
    }
}

impl From<&str> for CellFailure {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

/// What a site records of itself at the end of a cell (`run.json`).
#[derive(Default)]
pub(crate) struct SiteRecord {
    /// What the emulated links added (lab relays).
    pub(crate) link_overhead_us: Option<LinkOverhead>,
    /// Where each part ran, when it ran on more than one node.
    pub(crate) topology: Option<Topology>,
    /// The kernel as the proxies ran with it.
    pub(crate) kernel: Option<Kernel>,
    /// How a cluster cell's routes were made (kind, names, controller, and how long the
    /// controller took to accept them).
    pub(crate) routes: Option<Value>,
}

/// A system under test a cell runs against.
pub(crate) trait Site {
    /// How the load reaches it: `tls` asks for https, `host` is the TLS name and `Host`.
    fn entry(&self, tls: bool, host: &str, path: &str) -> Result<Entry, String>;

    /// The network namespace the load generator runs in, if the site has one for it.
    fn client_netns(&self) -> Option<PathBuf> {
        None
    }

    /// Called just before the load starts: what the site measures of itself starts here.
    fn start_measuring(&mut self) {}

    /// Its processes whose CPU and memory are read while the load runs.
    fn usage_parts(&self) -> Vec<Part> {
        Vec::new()
    }

    /// What each proxy itself counted so far (failed connects to backends, retries, …),
    /// by name, and when it was read (a reading taken beside the run, by a thread of its
    /// own, can be older than now); none where the site reads no proxy's counts.
    fn proxy_counters(&mut self) -> (Instant, Readings) {
        (Instant::now(), Vec::new())
    }

    /// The proxies' counts once the load has ended: a reading taken from now on, so that
    /// the last event's window has one after it (a thread that reads once a second may
    /// hold one from before).
    fn last_proxy_counters(&mut self) -> (Instant, Readings) {
        self.proxy_counters()
    }

    /// An error if a part nothing asked to stop is gone (what is measured after is not the
    /// system under test).
    fn check_alive(&mut self) -> Result<(), String> {
        Ok(())
    }

    /// Asks for a change, to reach the proxies after `delay`; the index of its record.
    fn request(&mut self, change: Change, delay: Duration) -> Result<usize, String>;

    /// Where the route probe asks the routes that events add or remove (plain HTTP), if
    /// the site can say which routes a change makes.
    fn route_probe(&self) -> Option<SocketAddr> {
        None
    }

    /// The routes a change would add and remove, before it is asked for.
    fn route_delta(&self, _change: &Change) -> Option<RoutesDelta> {
        None
    }

    /// The routes in force (own and generated), where the site keeps them.
    fn route_count(&self) -> Option<usize> {
        None
    }

    /// The size of the proxy's configuration as rendered, in bytes, where the site
    /// renders it.
    fn config_bytes(&self) -> Option<u64> {
        None
    }

    /// Moves pending changes on (called every few milliseconds while the load runs).
    fn tick(&mut self) -> Result<(), String> {
        Ok(())
    }

    /// Every change asked for, in order.
    fn records(&self) -> &[ChangeRecord] {
        &[]
    }

    /// Whether a change still waits for what the control plane will show of it (a
    /// cluster's EndpointSlices), which the cell waits for a little after its load.
    fn awaiting_control_plane(&self) -> bool {
        false
    }

    /// What to record of the site once the load is over; its files go under `dir`.
    fn record(&self, _dir: &Path) -> SiteRecord {
        SiteRecord::default()
    }

    /// `why` (a failure that names the site's files) pointing at the copies
    /// [`Site::record`] made under `dir`, which outlive the site's own directory.
    fn at_copies(&self, why: String, _dir: &Path) -> String {
        why
    }

    /// The load from pods of the site's cluster: how they reach it (`tls`, `host`,
    /// `path` as for [`Site::entry`]) and the Job of `workers` pods placed as `placement`
    /// says that will send it.
    #[cfg(feature = "cluster")]
    fn cluster_load(
        &self,
        _request: (bool, &str, &str),
        _workers: usize,
        _placement: Option<&crate::model::PlacementFile>,
    ) -> Result<(Entry, ingressbench_cluster::workers::LoadJob), CellFailure> {
        Err(CellFailure::input(
            "load.from: cluster sends the load from pods of a cluster: run with --cluster FILE (or --set load.from=here)",
        ))
    }
}

/// A lab of real proxies on this machine.
pub(crate) struct LabSite {
    lab: Lab,
    /// The proxy nodes' listen-queue counters when the load started.
    listen_before: Vec<(String, ListenCounters)>,
}

impl LabSite {
    /// A site of `lab`.
    pub(crate) fn new(lab: Lab) -> Self {
        Self {
            lab,
            listen_before: Vec::new(),
        }
    }

    /// The kernel as the cell's proxies ran with it (see [`Lab::kernel`]), and what each
    /// proxy node's listen queues dropped from the load's start (warm-up included, when
    /// connections open) to its end: the kernel's own count, beside the client's connect
    /// times.
    fn kernel_record(&self) -> Kernel {
        let mut record = self.lab.kernel();
        let dropped: BTreeMap<String, ListenQueue> = self
            .lab
            .listen_counters()
            .into_iter()
            .map(|(node, now)| {
                let earlier = self
                    .listen_before
                    .iter()
                    .find(|(n, _)| *n == node)
                    .map(|(_, c)| *c)
                    .unwrap_or_default();
                let counted = now.since(earlier);
                let queue = ListenQueue {
                    overflows: counted.overflows,
                    drops: counted.drops,
                };
                (node, queue)
            })
            .collect();
        if !dropped.is_empty() {
            record.listen_queue = Some(dropped);
        }
        record
    }
}

impl Site for LabSite {
    fn entry(&self, tls: bool, host: &str, path: &str) -> Result<Entry, String> {
        let lab = &self.lab;
        let proxy_version = Some(
            lab.proxies()
                .first()
                .ok_or("the lab has no proxy")?
                .version()
                .to_owned(),
        );
        let (http, https) = lab.entry().ok_or("the lab has no proxy")?;
        Ok(match (tls, https) {
            (true, Some(at)) => Entry {
                url: format!("https://{host}:{}{path}", at.port()),
                tls: Some((
                    TlsOptions {
                        cacert: lab.certs().map(|c| c.ca.clone()),
                        ..TlsOptions::default()
                    },
                    Some(at),
                )),
                host_header: false,
                proxy_version,
            },
            _ => Entry {
                url: format!("http://{http}{path}"),
                tls: None,
                host_header: true,
                proxy_version,
            },
        })
    }

    fn client_netns(&self) -> Option<PathBuf> {
        self.lab.client_netns()
    }

    fn start_measuring(&mut self) {
        // A reused lab's links measured earlier cells: this cell's overhead starts from
        // zero.
        self.lab.reset_link_overhead();
        self.listen_before = self.lab.listen_counters();
    }

    fn usage_parts(&self) -> Vec<Part> {
        self.lab.usage_parts()
    }

    fn proxy_counters(&mut self) -> (Instant, Readings) {
        let asked = Instant::now();
        (asked, self.lab.proxy_counters())
    }

    fn check_alive(&mut self) -> Result<(), String> {
        self.lab.check_alive().map_err(|e| e.to_string())
    }

    fn request(&mut self, change: Change, delay: Duration) -> Result<usize, String> {
        self.lab.request(change, delay).map_err(|e| e.to_string())
    }

    fn route_probe(&self) -> Option<SocketAddr> {
        self.lab.entry().map(|(http, _)| http)
    }

    fn route_delta(&self, change: &Change) -> Option<RoutesDelta> {
        self.lab.routes_delta(change)
    }

    fn route_count(&self) -> Option<usize> {
        Some(self.lab.routes().len())
    }

    fn config_bytes(&self) -> Option<u64> {
        self.lab.proxies().first().map(|p| p.files().config_bytes())
    }

    fn tick(&mut self) -> Result<(), String> {
        self.lab.tick().map_err(|e| e.to_string())
    }

    fn records(&self) -> &[ChangeRecord] {
        self.lab.records()
    }

    fn at_copies(&self, why: String, dir: &Path) -> String {
        copied_dirs(&self.lab, &dir.join("proxy"))
            .into_iter()
            .fold(why, |why, (from, to)| {
                why.replace(&from.display().to_string(), &to.display().to_string())
            })
    }

    fn record(&self, dir: &Path) -> SiteRecord {
        copy_proxy_files(&self.lab, &dir.join("proxy"));
        let overhead = self.lab.link_overhead();
        SiteRecord {
            link_overhead_us: (!overhead.is_empty()).then(|| LinkOverhead {
                chunks: overhead.count(),
                p50: overhead.value_at_percentile(50.0),
                p99: overhead.value_at_percentile(99.0),
                max: overhead.max(),
            }),
            // One node means no topology to show.
            topology: (self.lab.nodes().len() > 1).then(|| self.lab.map()),
            kernel: Some(self.kernel_record()),
            routes: None,
        }
    }
}

/// A URL the tool did not start (a cloud load balancer, an ingress it does not manage).
pub(crate) struct Upstream {
    /// The URL loaded.
    pub(crate) url: String,
}

impl Site for Upstream {
    fn entry(&self, _tls: bool, _host: &str, _path: &str) -> Result<Entry, String> {
        Ok(Entry {
            url: self.url.clone(),
            tls: None,
            host_header: false,
            proxy_version: None,
        })
    }

    fn request(&mut self, _change: Change, _delay: Duration) -> Result<usize, String> {
        Err(format!(
            "{} is an upstream URL the tool did not start, so it cannot change it",
            self.url
        ))
    }
}

/// Copies the proxies' rendered configurations and logs (and the front's) into the
/// cell's directory; replicas each into a directory of their own.
fn copy_proxy_files(lab: &Lab, to: &Path) {
    for (from, to) in copied_dirs(lab, to) {
        copy_config_files(&from, &to);
    }
}

/// Each directory of the lab's proxies (and the sidecar's and the front's) and where its
/// files are copied under `to`.
fn copied_dirs(lab: &Lab, to: &Path) -> Vec<(PathBuf, PathBuf)> {
    let replicas = lab.proxies().len();
    let mut dirs = Vec::new();
    for (i, proxy) in lab.proxies().iter().enumerate() {
        let to = if replicas > 1 {
            to.join(format!("replica-{}", i + 1))
        } else {
            to.to_owned()
        };
        dirs.push((proxy.files().dir.clone(), to));
    }
    if let Some(sidecar) = lab.sidecar() {
        dirs.push((sidecar.files().dir.clone(), to.join("sidecar")));
    }
    if let Some(dir) = lab
        .front()
        .and_then(|f| f.config().parent().map(Path::to_owned))
    {
        dirs.push((dir, to.join("front")));
    }
    dirs
}

/// Copies the configuration and log files under `from` into `to`, flattening paths.
fn copy_config_files(from: &Path, to: &Path) {
    if std::fs::create_dir_all(to).is_err() {
        return;
    }
    let mut stack = vec![from.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| {
                ["conf", "cfg", "json", "yaml", "log", "map"]
                    .iter()
                    .any(|x| e == *x)
            }) {
                let name = p
                    .strip_prefix(from)
                    .map(|r| r.to_string_lossy().replace('/', "_"))
                    .unwrap_or_default();
                let _ = std::fs::copy(&p, to.join(name));
            }
        }
    }
}

/// The lab a proxy target needs; `None` for an upstream URL.
pub(crate) fn lab_file(cell: &Cell) -> Option<LabFile> {
    let s = &cell.scenario;
    let Target::Proxy {
        kind,
        update,
        workers,
        keepalive_requests,
        upstream_keepalive,
        listen_backlog,
        upstream_protocol,
        sysctls,
        front,
        hop,
        ..
    } = &cell.target
    else {
        return None;
    };
    let mut tuning = s.tuning.clone();
    tuning.workers = workers.or(tuning.workers);
    tuning.keepalive_requests = keepalive_requests.or(tuning.keepalive_requests);
    tuning.upstream_keepalive = upstream_keepalive.or(tuning.upstream_keepalive);
    tuning.listen_backlog = listen_backlog.or(tuning.listen_backlog);
    tuning.upstream_protocol = upstream_protocol.or(tuning.upstream_protocol);
    if s.load.kind.is_grpc() && tuning.upstream_protocol != Some(UpstreamProtocol::Http1) {
        // gRPC goes to the backends as HTTP/2 (nginx's grpc_pass); http1 is refused
        // by the scenario's check.
        tuning.upstream_protocol = Some(UpstreamProtocol::Grpc);
    }
    tuning
        .sysctls
        .extend(sysctls.iter().map(|(k, v)| (k.clone(), v.clone())));
    let backends = if s.backends.is_empty() {
        ingressbench_lab::labfile::default_pools()
    } else {
        s.backends.clone()
    };
    let pools: Vec<String> = backends.iter().map(|p| p.name.clone()).collect();
    Some(LabFile {
        proxies: vec![*kind],
        routes: s.routes.all(&pools),
        backends,
        tls: s.tls,
        tuning,
        overlay: s.overlay.clone(),
        haproxy_update: update.unwrap_or_default(),
        upgradeable: cell
            .events
            .iter()
            .any(|e| matches!(e.action, crate::model::Action::Upgrade { .. })),
        front: front.clone(),
        hop: hop.clone(),
        topology: s.topology.clone(),
    })
}
