//! What a controller and its proxy spend on a cluster whose processes this machine cannot
//! see: their pods (a namespace and a label selector, the cluster file's `usage:`) read
//! once a second through the API, by a thread of its own, into the same parts the lab
//! reads from `/proc` ([`ingressbench_lab::usage::Reported`]).
//!
//! Two sources, the cluster file says which per part:
//! - the pod's own Prometheus endpoint, through the API server's pod proxy: the process
//!   collector's `process_cpu_seconds_total` and `process_resident_memory_bytes`, which
//!   every Go controller and Envoy-based proxy exports. Exact CPU time (a counter) and RSS.
//! - the metrics API (`metrics.k8s.io` PodMetrics, served by metrics-server): CPU as a rate
//!   averaged over the server's window (15 s by default), which is summed over the time
//!   between readings here, and the containers' working set, not RSS. What a cluster
//!   without the pods' metrics endpoints offers; docs/CLUSTER.md says what it cannot show
//!   (a spike shorter than the window).
//!
//! A pod that goes (or restarts, its counter starting again) keeps what it spent in the
//! part's CPU time, as the lab keeps what a process group's leader reaped.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_lab::usage::{Figures, Part, Reported};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client};

use crate::file::{PodsUsage, TargetUsage};
use crate::ClusterError;

/// How often the pods are read.
const INTERVAL: Duration = Duration::from_secs(1);
/// How long one reading of one part may take before it is skipped (the part keeps its
/// last figures).
const READ_TIMEOUT: Duration = Duration::from_secs(3);

/// Waits until `then`, or until `stop` is set (looked at every 50 ms).
pub(crate) async fn pause_until(then: Instant, stop: &AtomicBool) {
    while Instant::now() < then && !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The thread reading a target's pods; stops when dropped.
pub struct UsageWatch {
    parts: Vec<Part>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UsageWatch {
    /// Starts reading `usage`'s pods for target `name`; returns once each part has been
    /// read once (an error names the part and what to fix: no pod matches, the metrics API
    /// is not served, the endpoint has no process series).
    pub fn start(
        api: &crate::api::ClusterApi,
        name: &str,
        usage: &TargetUsage,
    ) -> Result<Self, ClusterError> {
        let named: Vec<(Part, PodsUsage)> = [
            (
                "controller",
                format!("{name}-controller"),
                &usage.controller,
            ),
            ("proxy", format!("{name}-proxy"), &usage.proxy),
        ]
        .into_iter()
        .filter_map(|(role, part, pods)| {
            let pods = pods.clone()?;
            Some((Part::reported(&part, role, Reported::default()), pods))
        })
        .collect();
        let parts: Vec<Part> = named.iter().map(|(p, _)| p.clone()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), ClusterError>>();
        let stop_w = stop.clone();
        let thread = api.on_own_thread("ib-usage", |client| async move {
            let mut readers: Vec<PartReader> = named.into_iter().map(PartReader::new).collect();
            let mut first = Some(ready_tx);
            while !stop_w.load(Ordering::Relaxed) {
                let started = Instant::now();
                for reader in &mut readers {
                    let read = tokio::time::timeout(READ_TIMEOUT, reader.read(&client))
                        .await
                        .unwrap_or_else(|_| {
                            Err(format!("no answer in {} s", READ_TIMEOUT.as_secs()))
                        });
                    if let (Err(e), Some(tx)) = (read, first.as_ref()) {
                        let _ = tx.send(Err(ClusterError::Api(format!(
                            "reading the usage of {}: {e}",
                            reader.part.name
                        ))));
                        return;
                    }
                }
                if let Some(tx) = first.take() {
                    let _ = tx.send(Ok(()));
                }
                pause_until(started + INTERVAL, &stop_w).await;
            }
        })?;
        let watch = Self {
            parts,
            stop,
            thread: Some(thread),
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(watch),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ClusterError::Api("the usage thread ended".into())),
        }
    }

    /// The parts as the usage log reads them: `NAME-controller` and `NAME-proxy`.
    pub fn parts(&self) -> Vec<Part> {
        self.parts.clone()
    }
}

impl Drop for UsageWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads `pods` once, as a run would: what it found (`2 pods, 45.1 MiB, 3.20 s CPU,
/// through their /metrics on port 8000`), or why it cannot, with what to grant when the
/// API refused.
pub async fn read_once(client: &Client, pods: &PodsUsage) -> Result<String, String> {
    let part = Part::reported("check", "controller", Reported::default());
    let mut reader = PartReader::new((part, pods.clone()));
    let read = tokio::time::timeout(READ_TIMEOUT, reader.read(client))
        .await
        .unwrap_or_else(|_| Err(format!("no answer in {} s", READ_TIMEOUT.as_secs())));
    if let Err(e) = read {
        if !e.contains("403") && !e.contains("forbidden") {
            return Err(e);
        }
        let ns = &pods.namespace;
        let grant = match &pods.metrics {
            Some(_) => format!("kubectl create role ingressbench-usage -n {ns} --verb=get,list --resource=pods,pods/proxy"),
            None => format!("kubectl create role ingressbench-usage -n {ns} --verb=list --resource=pods.metrics.k8s.io"),
        };
        return Err(format!("{e}: a run reads these pods' usage; grant it in their namespace only with: {grant} && kubectl create rolebinding ingressbench-usage -n {ns} --role=ingressbench-usage --serviceaccount=ingressbench-system:ingressbench"));
    }
    let f = reader.part_reported().get().unwrap_or_default();
    let how = match &pods.metrics {
        Some(m) => format!(
            "{:.2} s CPU so far, through their {} on port {}",
            f.cpu_s, m.path, m.port
        ),
        None => "through the metrics API (working set; CPU as a rate)".into(),
    };
    Ok(format!(
        "{} pod{}, {:.1} MiB, {how}",
        f.processes,
        if f.processes == 1 { "" } else { "s" },
        f.rss_bytes as f64 / 1048576.0,
    ))
}

/// One part's pods and what has been counted of them.
struct PartReader {
    part: Part,
    pods: PodsUsage,
    tally: CpuTally,
}

impl PartReader {
    fn new((part, pods): (Part, PodsUsage)) -> Self {
        Self {
            part,
            pods,
            tally: CpuTally::default(),
        }
    }

    /// Reads the pods once and sets the part's figures.
    async fn read(&mut self, client: &Client) -> Result<(), String> {
        let figures = match &self.pods.metrics {
            Some(endpoint) => {
                let ns = &self.pods.namespace;
                let pods = running_pods(client, ns, &self.pods.selector).await?;
                let mut counters = BTreeMap::new();
                let mut rss_bytes = 0u64;
                for (name, uid) in &pods {
                    let text = pod_get(client, ns, name, endpoint.port, &endpoint.path).await?;
                    let (cpu_s, rss) = process_series(&text).map_err(|e| {
                        format!(
                            "pod {name}'s {} on port {}: {e}",
                            endpoint.path, endpoint.port
                        )
                    })?;
                    counters.insert(uid.clone(), cpu_s);
                    rss_bytes += rss as u64;
                }
                Figures {
                    cpu_s: self.tally.counters(counters),
                    rss_bytes,
                    processes: pods.len() as u32,
                }
            }
            None => {
                let (cores, working_set, pods) = pod_metrics(client, &self.pods).await?;
                Figures {
                    cpu_s: self.tally.rate(cores, Instant::now()),
                    rss_bytes: working_set as u64,
                    processes: pods,
                }
            }
        };
        self.part_reported().set(figures);
        Ok(())
    }

    fn part_reported(&self) -> &Reported {
        match &self.part.source {
            ingressbench_lab::usage::Source::Reported(r) => r,
            _ => unreachable!("a usage watch makes reported parts only"),
        }
    }
}

/// `GET path` on port `port` of pod `name` through the API server's pod proxy: the text.
pub(crate) async fn pod_get(
    client: &Client,
    namespace: &str,
    name: &str,
    port: u16,
    path: &str,
) -> Result<String, String> {
    let uri = format!("/api/v1/namespaces/{namespace}/pods/{name}:{port}/proxy{path}");
    let request = http::Request::get(&uri)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map_err(|e| format!("GET {uri} through the API server: {e}"))
}

/// The running pods the selector matches in `namespace`: (name, uid). None is an error:
/// what they hold would read as zero, which is not what they counted or spent.
pub(crate) async fn running_pods(
    client: &Client,
    namespace: &str,
    selector: &str,
) -> Result<Vec<(String, String)>, String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| format!("listing pods {selector} in {namespace}: {e}"))?;
    let running: Vec<(String, String)> = list
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| Some((p.metadata.name?, p.metadata.uid?)))
        .collect();
    if running.is_empty() {
        return Err(format!(
            "no running pod in namespace {namespace} matches {selector}; fix the namespace or selector in the cluster file"
        ));
    }
    Ok(running)
}

/// The PodMetrics of the selector's pods, together: CPU in cores, working set in bytes,
/// and how many pods.
async fn pod_metrics(client: &Client, pods: &PodsUsage) -> Result<(f64, f64, u32), String> {
    let resource = ApiResource {
        group: "metrics.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "metrics.k8s.io/v1beta1".into(),
        kind: "PodMetrics".into(),
        plural: "pods".into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &pods.namespace, &resource);
    let list = match api
        .list(&ListParams::default().labels(&pods.selector))
        .await
    {
        Ok(l) => l,
        Err(kube::Error::Api(s)) if s.code == 404 => return Err(METRICS_API_MISSING.into()),
        Err(e) => return Err(format!("reading PodMetrics: {e}")),
    };
    if list.items.is_empty() {
        return Err(format!(
            "the metrics API has no pod in namespace {} matching {} (none runs, or metrics-server has not scraped it yet)",
            pods.namespace, pods.selector
        ));
    }
    let values: Vec<serde_json::Value> = list.items.iter().map(|o| o.data.clone()).collect();
    let (cores, bytes) = sum_pod_metrics(&values)?;
    Ok((cores, bytes, list.items.len() as u32))
}

/// What to do when the metrics API is not served.
pub const METRICS_API_MISSING: &str = "the metrics API (metrics.k8s.io) is not served by this cluster: install metrics-server, or give the part's own Prometheus endpoint as usage.PART.metrics: { port, path }";

/// CPU cores and working-set bytes of PodMetrics objects (their `containers[].usage`),
/// summed.
fn sum_pod_metrics(items: &[serde_json::Value]) -> Result<(f64, f64), String> {
    let (mut cores, mut bytes) = (0.0, 0.0);
    for item in items {
        for c in item["containers"].as_array().into_iter().flatten() {
            let q = |key: &str| {
                let text = c["usage"][key].as_str().unwrap_or("");
                quantity(text)
                    .ok_or_else(|| format!("PodMetrics usage.{key}: {text:?} is not a quantity"))
            };
            cores += q("cpu")?;
            bytes += q("memory")?;
        }
    }
    Ok((cores, bytes))
}

/// A Kubernetes quantity (`250m`, `12345n`, `128Mi`, `1.5G`, `1e3`) as a number.
fn quantity(text: &str) -> Option<f64> {
    const SUFFIXES: [(&str, f64); 12] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("", 1.0),
    ];
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    SUFFIXES.iter().find_map(|(suffix, scale)| {
        let number = text.strip_suffix(suffix)?;
        let value: f64 = number.parse().ok()?;
        (value.is_finite() && value >= 0.0).then_some(value * scale)
    })
}

/// `process_cpu_seconds_total` and `process_resident_memory_bytes` from Prometheus text
/// exposition (the process collector's series, unlabelled).
fn process_series(text: &str) -> Result<(f64, f64), String> {
    let value = |name: &str| {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let rest = l.strip_prefix(name)?;
                let rest = rest.strip_prefix("{}").unwrap_or(rest);
                if !rest.starts_with([' ', '\t']) {
                    return None;
                }
                rest.split_whitespace().next()?.parse::<f64>().ok()
            })
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| {
                format!("no {name} in it (the Prometheus client's process collector exports it; is this the process's own endpoint?)")
            })
    };
    Ok((
        value("process_cpu_seconds_total")?,
        value("process_resident_memory_bytes")?,
    ))
}

/// A part's CPU seconds, kept whole across pods that go and counters that restart, and
/// summed from rates when the source gives rates.
#[derive(Debug, Default)]
struct CpuTally {
    /// Each live pod's last counter, by uid.
    last: BTreeMap<String, f64>,
    /// What pods that went (or restarted) had counted.
    gone_s: f64,
    /// For rates: the sum so far and when it was last added to.
    summed_s: f64,
    at: Option<Instant>,
}

impl CpuTally {
    /// The CPU seconds of the pods with these counters, with what went before.
    fn counters(&mut self, now: BTreeMap<String, f64>) -> f64 {
        for (uid, before) in &self.last {
            match now.get(uid) {
                Some(v) if *v >= *before => {}
                _ => self.gone_s += before,
            }
        }
        self.last = now;
        self.gone_s + self.last.values().sum::<f64>()
    }

    /// The CPU seconds so far, given `cores` in use now (the first reading adds nothing).
    fn rate(&mut self, cores: f64, now: Instant) -> f64 {
        if let Some(at) = self.at {
            self.summed_s += cores * now.saturating_duration_since(at).as_secs_f64();
        }
        self.at = Some(now);
        self.summed_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_the_api_writes_them() {
        assert_eq!(quantity("250m"), Some(0.25));
        assert!((quantity("12345678n").unwrap() - 0.012345678).abs() < 1e-12);
        assert_eq!(quantity("2"), Some(2.0));
        assert_eq!(quantity("128Mi"), Some(134217728.0));
        assert_eq!(quantity("1.5G"), Some(1.5e9));
        assert_eq!(quantity("1e3"), Some(1000.0));
        assert_eq!(quantity("40Ki"), Some(40960.0));
        assert_eq!(quantity(""), None);
        assert_eq!(quantity("lots"), None);
        assert_eq!(quantity("-1"), None);
    }

    #[test]
    fn pod_metrics_sum_every_container_of_every_pod() {
        let items = [
            serde_json::json!({ "containers": [
                { "name": "contour", "usage": { "cpu": "150m", "memory": "64Mi" } },
                { "name": "shutdown-manager", "usage": { "cpu": "1000000n", "memory": "1Mi" } },
            ]}),
            serde_json::json!({ "containers": [
                { "name": "contour", "usage": { "cpu": "50m", "memory": "63Mi" } },
            ]}),
        ];
        let (cores, bytes) = sum_pod_metrics(&items).unwrap();
        assert!((cores - 0.201).abs() < 1e-9, "{cores}");
        assert_eq!(bytes, 128.0 * 1048576.0);
        let bad =
            [serde_json::json!({ "containers": [{ "usage": { "cpu": "x", "memory": "1" } }] })];
        assert!(sum_pod_metrics(&bad)
            .unwrap_err()
            .contains("usage.cpu: \"x\""));
    }

    #[test]
    fn the_process_series_are_read_and_their_absence_named() {
        let text =
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n\
                    # TYPE process_cpu_seconds_total counter\n\
                    process_cpu_seconds_total 12.34\n\
                    process_cpu_seconds_total_other 99\n\
                    process_resident_memory_bytes{} 5.0331648e+07\n";
        assert_eq!(process_series(text).unwrap(), (12.34, 50331648.0));
        let err = process_series("go_goroutines 12\n").unwrap_err();
        assert!(err.contains("no process_cpu_seconds_total"), "{err}");
    }

    #[test]
    fn cpu_of_pods_that_go_or_restart_is_kept() {
        let mut tally = CpuTally::default();
        let pods = |v: &[(&str, f64)]| v.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert_eq!(tally.counters(pods(&[("a", 1.0), ("b", 2.0)])), 3.0);
        // b restarts (its counter from 0 again), a goes, c comes.
        assert_eq!(tally.counters(pods(&[("b", 0.5), ("c", 1.0)])), 4.5);
        assert_eq!(tally.counters(pods(&[("b", 1.5), ("c", 1.0)])), 5.5);
        // Rates are summed over the time between readings.
        let mut rates = CpuTally::default();
        let t0 = Instant::now();
        assert_eq!(rates.rate(0.5, t0), 0.0);
        assert_eq!(rates.rate(0.25, t0 + Duration::from_secs(2)), 0.5);
    }
}
