//! What the EndpointSlices of a run's pool show, as they change: a thread lists and then
//! watches them ([`RunNamespace::watch_endpoints`]) and logs every new ready set with its
//! time, which is when a change became the control plane's to route.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::Api;

use crate::ClusterError;

use super::{api_error, RunNamespace};

/// Each ready set of addresses the watch saw, with the instant it arrived.
type EndpointsLog = Vec<(Instant, Vec<String>)>;

/// The ready addresses of a Service's EndpointSlices, as a watch delivers them: every
/// set the control plane published, with the instant it arrived. What the control plane
/// tells the ingress controllers, timed when it told it, not when someone polled.
pub struct EndpointsWatch {
    log: Arc<Mutex<EndpointsLog>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EndpointsWatch {
    /// Every set seen from `since` on, oldest first: the one in force at `since`, then
    /// each that came after.
    pub fn since(&self, since: Instant) -> Vec<(Instant, Vec<String>)> {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let first = log.iter().rposition(|(at, _)| *at <= since).unwrap_or(0);
        log[first..].to_vec()
    }
}

impl Drop for EndpointsWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl RunNamespace {
    /// Starts watching the pool's EndpointSlices on a thread of its own (a list, then a
    /// watch from its version, again whenever the watch ends); returns once the first set
    /// is known.
    pub fn watch_endpoints(&self) -> Result<EndpointsWatch, ClusterError> {
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), ClusterError>>();
        let namespace = self.objects.namespace.clone();
        let selector = format!("kubernetes.io/service-name={}", self.objects.pool);
        let (log_w, stop_w) = (log.clone(), stop.clone());
        let thread = self
            .api
            .on_own_thread("ib-endpoints", move |client| async move {
                let watched = async {
                    let api: Api<EndpointSlice> = Api::namespaced(client, &namespace);
                    let mut told = Some(ready_tx.clone());
                    while !stop_w.load(Ordering::Relaxed) {
                        let result = watch_once(&api, &selector, &log_w, &stop_w, &mut || {
                            if let Some(tx) = told.take() {
                                let _ = tx.send(Ok(()));
                            }
                        })
                        .await;
                        match result {
                            // Before the first list: nothing to watch.
                            Err(e) if told.is_some() => return Err(e),
                            // Later: the watch expired or broke; list and watch again.
                            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                            Ok(()) => {}
                        }
                    }
                    Ok(())
                };
                if let Err(e) = watched.await {
                    let _ = ready_tx.send(Err(e));
                }
            })?;
        let watch = EndpointsWatch {
            log,
            stop,
            thread: Some(thread),
        };
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(watch),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ClusterError::Api(
                "the EndpointSlice watch did not start within 10 s".into(),
            )),
        }
    }
}

/// Lists the slices and logs their ready set, then watches from the list's version,
/// logging the set after every change, until the watch ends, `stop`, or an error.
async fn watch_once(
    api: &Api<EndpointSlice>,
    selector: &str,
    log: &Mutex<EndpointsLog>,
    stop: &AtomicBool,
    listed: &mut dyn FnMut(),
) -> Result<(), ClusterError> {
    let list = api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| api_error("listing endpoint slices", e))?;
    let mut slices: BTreeMap<String, Vec<String>> = list
        .items
        .iter()
        .map(|s| {
            (
                s.metadata.name.clone().unwrap_or_default(),
                ready_addresses(s),
            )
        })
        .collect();
    let record = |slices: &BTreeMap<String, Vec<String>>| {
        let mut all: Vec<String> = slices.values().flatten().cloned().collect();
        all.sort();
        all.dedup();
        let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
        if log.last().is_none_or(|(_, last)| *last != all) {
            log.push((Instant::now(), all));
        }
    };
    record(&slices);
    listed();
    let version = list.metadata.resource_version.unwrap_or_default();
    let params = WatchParams::default().labels(selector).timeout(60);
    let mut stream = api
        .watch(&params, &version)
        .await
        .map_err(|e| api_error("watching endpoint slices", e))?
        .boxed();
    loop {
        // Woken at least every 200 ms to see `stop`.
        let next = tokio::time::timeout(Duration::from_millis(200), stream.next()).await;
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let event = match next {
            Err(_) => continue,
            Ok(None) => return Ok(()),
            Ok(Some(e)) => e.map_err(|e| api_error("watching endpoint slices", e))?,
        };
        match event {
            WatchEvent::Added(s) | WatchEvent::Modified(s) => {
                slices.insert(
                    s.metadata.name.clone().unwrap_or_default(),
                    ready_addresses(&s),
                );
            }
            WatchEvent::Deleted(s) => {
                slices.remove(&s.metadata.name.clone().unwrap_or_default());
            }
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => {
                return Err(ClusterError::Api(format!(
                    "watching endpoint slices: {}",
                    e.message
                )))
            }
        }
        record(&slices);
    }
}

/// The ready addresses of one slice.
pub(super) fn ready_addresses(slice: &EndpointSlice) -> Vec<String> {
    slice
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
        .flat_map(|e| e.addresses.iter().cloned())
        .collect()
}
