//! What a controller's proxy counted, on a cluster whose sockets this machine cannot
//! reach: each of its pods' Prometheus endpoint (the cluster file's `counters: { pods }`),
//! read through the API server's pod proxy, the same path and grant as `usage`'s, and
//! mapped to the lab's names ([`ingressbench_lab::proxy::exposition`]).
//!
//! Per pod, not through the Service: a Service's proxy answers from one pod at random,
//! and two readings from different pods would look like counters going back. The pods'
//! counts are summed; a pod that goes, or restarts (a count that fell), keeps what it had
//! counted, as the usage reader keeps a gone pod's CPU time. Endpoints up is each pod's
//! own view of the same backends: the fewest any pod holds up, not their sum.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ingressbench_lab::proxy::counters::{Counted, ENDPOINTS_UP};
use ingressbench_lab::proxy::exposition;
use kube::Client;

use crate::file::CounterPods;
use crate::usage::{pod_get, running_pods};
use crate::ClusterError;

/// How long one reading of every pod may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// A proxy's pods and what they have counted so far.
#[derive(Debug)]
pub struct PodCounters {
    pods: CounterPods,
    tally: Tally,
}

impl PodCounters {
    /// The pods, nothing counted yet.
    pub fn new(pods: CounterPods) -> Self {
        Self {
            pods,
            tally: Tally::default(),
        }
    }

    /// The pods, read now: their counts together, with those of pods gone.
    pub async fn read(&mut self, client: &Client) -> Result<Counted, String> {
        let each = tokio::time::timeout(READ_TIMEOUT, read_pods(client, &self.pods))
            .await
            .unwrap_or_else(|_| Err(format!("no answer in {} s", READ_TIMEOUT.as_secs())))?;
        Ok(self.tally.add(each))
    }
}

/// How often the watch reads the pods (the proxy-metrics log's grid).
const INTERVAL: Duration = Duration::from_secs(1);

/// One reading: when it was asked, and what came of it.
pub type Reading = (Instant, Result<Counted, String>);

/// A proxy's counts read once a second by a thread of its own (its pods through the API,
/// or a socket on this machine), so that a reading that waits (a pod that does not
/// answer, up to [`READ_TIMEOUT`]; an admin socket of a proxy that is restarting, up to
/// its own timeout) holds up neither the events nor the load beside it. Stops when
/// dropped.
pub struct CountersWatch {
    latest: Arc<Mutex<Option<Reading>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CountersWatch {
    /// Starts reading `pods` through the API; returns once they have been read once (an
    /// error: the client could not be made).
    pub fn pods(api: &crate::api::ClusterApi, pods: CounterPods) -> Result<Self, ClusterError> {
        let api = api.clone();
        let mut counters = PodCounters::new(pods);
        Self::start(move || api.run(counters.read(&api.client)))
    }

    /// Starts calling `read` once a second; returns once it has been called once.
    pub fn start(
        mut read: impl FnMut() -> Result<Counted, String> + Send + 'static,
    ) -> Result<Self, ClusterError> {
        let (first_tx, first_rx) = std::sync::mpsc::channel::<()>();
        let stop = Arc::new(AtomicBool::new(false));
        let latest: Arc<Mutex<Option<Reading>>> = Arc::default();
        let (stop_w, latest_w) = (stop.clone(), latest.clone());
        let thread = std::thread::Builder::new()
            .name("ib-counters".into())
            .spawn(move || {
                while !stop_w.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    let reading = (asked, read());
                    *latest_w.lock().unwrap_or_else(|p| p.into_inner()) = Some(reading);
                    let _ = first_tx.send(());
                    while Instant::now() < asked + INTERVAL && !stop_w.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            })
            .map_err(|e| ClusterError::Api(format!("starting the counters' reader: {e}")))?;
        let watch = Self {
            latest,
            stop,
            thread: Some(thread),
        };
        first_rx
            .recv()
            .map_err(|_| ClusterError::Api("the counters' reader ended".into()))?;
        Ok(watch)
    }

    /// A reading begun at `since` or later: waits for the reader's next one, at most
    /// until the reading it begins by then would have timed out; else the last there is.
    pub fn after(&self, since: Instant) -> Reading {
        let deadline = since + INTERVAL + READ_TIMEOUT;
        loop {
            let latest = self.latest();
            if latest.0 >= since || Instant::now() >= deadline {
                return latest;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last reading (there is one from the start).
    pub fn latest(&self) -> Reading {
        let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        latest
            .clone()
            .unwrap_or_else(|| (Instant::now(), Err("not read yet".into())))
    }
}

impl Drop for CountersWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads the pods once, as a run would: what it found (`2 pods, /stats/prometheus on port
/// 8002: endpoints_up 3, …`), or why it cannot, with what to grant when the API refused.
pub async fn read_once(client: &Client, pods: &CounterPods) -> Result<String, String> {
    let n = running_pods(client, &pods.namespace, &pods.selector)
        .await
        .map(|p| p.len())
        .unwrap_or(0);
    match PodCounters::new(pods.clone()).read(client).await {
        Ok(c) => Ok(format!(
            "{n} pod{}, {} on port {}: {}",
            if n == 1 { "" } else { "s" },
            pods.path(),
            pods.port,
            (c.iter())
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Err(e) if e.contains("403") || e.contains("forbidden") => {
            let ns = &pods.namespace;
            Err(format!("{e}: a run reads these pods' counts; grant it in their namespace only with: kubectl create role ingressbench-counters -n {ns} --verb=get,list --resource=pods,pods/proxy && kubectl create rolebinding ingressbench-counters -n {ns} --role=ingressbench-counters --serviceaccount=ingressbench-system:ingressbench"))
        }
        Err(e) => Err(e),
    }
}

/// Each running pod's counts, by uid.
async fn read_pods(
    client: &Client,
    pods: &CounterPods,
) -> Result<BTreeMap<String, Counted>, String> {
    let ns = &pods.namespace;
    let running = running_pods(client, ns, &pods.selector).await?;
    let reads = running.iter().map(|(name, uid)| async move {
        let text = pod_get(client, ns, name, pods.port, pods.path()).await?;
        let counted = exposition::counted(pods.exposition, &text)
            .map_err(|e| format!("pod {name}'s {} on port {}: {e}", pods.path(), pods.port))?;
        Ok::<_, String>((uid.clone(), counted))
    });
    futures_util::future::join_all(reads)
        .await
        .into_iter()
        .collect()
}

/// Counts kept whole across pods that go and counts that start again.
#[derive(Debug, Default)]
struct Tally {
    /// Each live pod's last counts, by uid.
    last: BTreeMap<String, Counted>,
    /// What pods that went (or restarted) had counted.
    gone: Counted,
}

impl Tally {
    fn add(&mut self, now: BTreeMap<String, Counted>) -> Counted {
        for (uid, before) in &self.last {
            for (key, value) in before.iter().filter(|(k, _)| **k != ENDPOINTS_UP) {
                let still = now.get(uid).and_then(|c| c.get(key));
                if still.is_none_or(|v| v < value) {
                    *self.gone.entry(key).or_default() += value;
                }
            }
        }
        self.last = now;
        let mut total = self.gone.clone();
        for counted in self.last.values() {
            for (key, value) in counted {
                if *key == ENDPOINTS_UP {
                    let fewest = total.entry(key).or_insert(*value);
                    *fewest = (*fewest).min(*value);
                } else {
                    *total.entry(key).or_default() += value;
                }
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingressbench_lab::proxy::counters::CONNECT_FAILURES;

    fn pods(list: &[(&str, u64, u64)]) -> BTreeMap<String, Counted> {
        list.iter()
            .map(|(uid, fails, up)| {
                let c = Counted::from([(CONNECT_FAILURES, *fails), (ENDPOINTS_UP, *up)]);
                (uid.to_string(), c)
            })
            .collect()
    }

    #[test]
    fn pods_that_go_or_restart_keep_what_they_counted() {
        let mut t = Tally::default();
        let c = t.add(pods(&[("a", 3, 3), ("b", 4, 2)]));
        assert_eq!((c[CONNECT_FAILURES], c[ENDPOINTS_UP]), (7, 2));
        // b restarted (its count fell to 1): the 4 it had stay.
        let c = t.add(pods(&[("a", 5, 3), ("b", 1, 3)]));
        assert_eq!((c[CONNECT_FAILURES], c[ENDPOINTS_UP]), (10, 3));
        // a went, c came.
        let c = t.add(pods(&[("b", 1, 3), ("c", 2, 3)]));
        assert_eq!(c[CONNECT_FAILURES], 4 + 5 + 1 + 2);
        assert_eq!(c[ENDPOINTS_UP], 3);
    }
}
