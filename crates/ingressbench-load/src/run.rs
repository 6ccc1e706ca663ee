//! The coordinator: splits a plan over worker threads, gathers their windows and samples
//! while they run, and merges what they recorded.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_stats::{HistogramUs, Recorder, Summary, Window};

use crate::connection::{ensure_descriptors, nanos, Address, Connector};
use crate::plan::split;
use crate::report::{progress_after, summarize, LoadReport, Observer};
use crate::schedule::Schedule;
use crate::target::Scheme;
use crate::worker::{self, Assignment, Feed, Message, Shared};
use crate::{tls, Kind, Length, LoadError, Mode, Plan, Protocol, Warmup};

/// Time given to worker threads to start before the first request is due.
const START_DELAY: Duration = Duration::from_millis(20);

/// Runs `plan` to its end or until `stop` is set (Ctrl-C), and returns what was measured.
/// Windows and samples reach `observer` while the run goes.
pub fn run(
    plan: &Plan,
    stop: Arc<AtomicBool>,
    observer: &mut dyn Observer,
) -> Result<LoadReport, LoadError> {
    plan.validate()?;
    match &plan.kind {
        Kind::WebSocket(options) => return crate::websocket::run(plan, options, stop, observer),
        Kind::Sse(options) => return crate::sse::run(plan, options, stop, observer),
        Kind::Grpc(options) => return crate::grpc::run_unary(plan, options, stop, observer),
        Kind::GrpcStream(options) => return crate::grpc::run_stream(plan, options, stop, observer),
        Kind::Http => {}
    }
    ensure_descriptors(plan.connections)?;
    let request = plan.request.render(&plan.target, !plan.keepalive)?;
    let tls = match plan.target.scheme {
        Scheme::Https => Some((
            tls::client_config_for(&plan.tls, plan.protocol)?,
            tls::server_name(&plan.tls, &plan.target.host)?,
        )),
        Scheme::Http => None,
    };
    let (http2, http3) = match plan.protocol {
        Protocol::Http1 => (None, None),
        Protocol::Http2 => (Some(crate::worker::Http2::new(plan)?), None),
        Protocol::Http3 => (None, Some(crate::worker::Http3::new(plan)?)),
    };
    let fixed = plan.resolve.iter().find_map(|r| r.applies_to(&plan.target));
    let address = || match (fixed, plan.target.ip()) {
        (Some(addr), _) => Address::Fixed(addr, "from --resolve"),
        (None, Some(ip)) => Address::Fixed((ip, plan.target.port).into(), "the URL's address"),
        (None, None) => Address::Lookup {
            host: plan.target.host.clone(),
            port: plan.target.port,
        },
    };

    let launched = Instant::now();
    // A fixed start (events or other processes are timed against it) is kept; else the
    // run starts once the workers' connections are open, when the plan says to wait.
    let wait = plan.start.is_none() && plan.wait_for_connections && plan.keepalive;
    let (start_tx, start_rx) = tokio::sync::watch::channel(match plan.start {
        Some(start) => Some(start),
        None if wait => None,
        None => Some(launched + START_DELAY),
    });
    let warmup_ns = match plan.warmup {
        Warmup::Duration(d) => nanos(d),
        _ => 0,
    };
    let warmup_requests = match plan.warmup {
        Warmup::Requests(n) => n,
        _ => 0,
    };
    let end_ns = match plan.length {
        Length::Duration(d) => Some(warmup_ns.saturating_add(nanos(d))),
        Length::Requests(_) => None,
    };
    let shared = Arc::new(Shared {
        request,
        head_request: plan.request.is_head(),
        timeout: plan.timeout,
        keepalive: plan.keepalive,
        // Without keep-alive a connection carries one request, whatever the protocol
        // (HTTP/2 and HTTP/3 reused theirs one stream at a time before).
        max_requests_per_connection: match plan.keepalive {
            true => plan.max_requests_per_connection.unwrap_or(u64::MAX),
            false => 1,
        },
        retry: plan.retry.allows(&plan.request.method),
        backend_header: plan.backend_header.clone(),
        generation_headers: plan.generation_headers.clone(),
        sample_rate: plan.sample_rate,
        window_ns: nanos(plan.window),
        warmup_ns,
        end_ns,
        stop: stop.clone(),
        batch_window: plan.batch_window,
        gate: plan.gate.clone(),
        http2,
        http3,
    });

    // Threads stripe this process's share: thread t of T in process k of n owns stripe
    // t * n + k of the n * T stripes of the whole schedule.
    let workers = plan.threads;
    let share = plan.share;
    let stripes = (workers * share.of) as u64;
    let (tx, rx) = mpsc::channel();
    let mut handles = Vec::with_capacity(workers);
    for index in 0..workers {
        let mine = |total: u64| split(share.part(total), index, workers);
        let connections = mine(plan.connections as u64) as usize;
        let total_requests = match plan.length {
            Length::Requests(n) => Some(n + warmup_requests),
            Length::Duration(_) => None,
        };
        let feed = match plan.mode {
            Mode::Open { rate_per_s } => Feed::Open(Schedule::new(
                rate_per_s,
                (index * share.of + share.index) as u64,
                stripes,
                total_requests,
                end_ns,
            )),
            Mode::Closed => Feed::Loop {
                budget: total_requests.map(mine),
                pause: None,
            },
            Mode::Sequential { interval } => Feed::Loop {
                budget: total_requests,
                pause: Some(interval),
            },
        };
        let assignment = Assignment {
            index,
            connections,
            feed,
            // Open-loop numbers are global; loops number their own requests.
            warmup_requests: if matches!(plan.mode, Mode::Open { .. }) {
                warmup_requests
            } else {
                mine(warmup_requests)
            },
            seed: 0x9E37_79B9_7F4A_7C15
                ^ ((index * share.of + share.index) as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9),
            start: start_rx.clone(),
        };
        let connector = Connector::new(address(), tls.clone());
        let (shared, tx) = (shared.clone(), tx.clone());
        let handle = std::thread::Builder::new()
            .name(format!("ib-load-{index}"))
            .spawn(move || worker::run(shared, connector, assignment, tx))
            .map_err(LoadError::Runtime)?;
        handles.push(handle);
    }
    drop(tx);

    let mut windows = WindowMerger::new(workers);
    let mut cumulative = HistogramUs::new();
    let (mut requests, mut errors) = (0u64, 0u64);
    let mut ramp = Ramp::default();
    loop {
        let opening = wait && start_tx.borrow().is_none();
        if opening && ramp.over(workers, launched, plan, &stop) {
            let _ = start_tx.send(Some(Instant::now() + START_DELAY));
        }
        match rx.recv_timeout(Duration::from_millis(if opening { 1 } else { 200 })) {
            Ok(Message::Opened { at }) => ramp.opened(at),
            Ok(Message::Samples { samples, backends }) => observer.samples(&samples, &backends),
            Ok(Message::Windows {
                worker,
                windows: batch,
            }) => {
                for window in windows.add(worker, batch) {
                    cumulative.merge(&window.latency);
                    requests += window.outcomes.total();
                    errors += window.outcomes.errors();
                    observer.window(&window);
                    observer.progress(&progress_after(&window, &cumulative, requests, errors));
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    for window in windows.finish() {
        observer.window(&window);
    }

    let mut merged: Option<Recorder> = None;
    for (index, handle) in handles.into_iter().enumerate() {
        let recorder = match handle.join() {
            Ok(Ok(recorder)) => recorder,
            Ok(Err(e)) => return Err(LoadError::Runtime(e)),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "unknown panic".to_owned());
                return Err(LoadError::WorkerPanicked { index, message });
            }
        };
        match merged.as_mut() {
            Some(m) => m.merge(&recorder),
            None => merged = Some(recorder),
        }
    }
    let recorder = merged.unwrap_or_else(|| Recorder::new(nanos(plan.window)));
    let interrupted = stop.load(std::sync::atomic::Ordering::Relaxed);
    let mut summary = summarize(&recorder, plan, plan.rate_per_s(), interrupted);
    let start = (*start_tx.borrow()).unwrap_or(launched);
    ramp.report(&mut summary, plan, launched, start, wait);
    Ok(LoadReport {
        recorder,
        summary,
        stream: None,
    })
}

/// Keep-alive runs open their connections before the first request is due; the workers
/// say when theirs are.
#[derive(Default)]
struct Ramp {
    workers_done: usize,
    last: Option<Instant>,
}

impl Ramp {
    fn opened(&mut self, at: Instant) {
        self.workers_done += 1;
        self.last = Some(self.last.map_or(at, |last| last.max(at)));
    }

    /// Whether the run may start: every worker's connections are open (or failed), or
    /// the run was stopped meanwhile, or a timeout and more passed (each connect is
    /// bounded by the timeout, so only a lost worker gets here).
    fn over(&self, workers: usize, launched: Instant, plan: &Plan, stop: &AtomicBool) -> bool {
        self.workers_done >= workers
            || stop.load(std::sync::atomic::Ordering::Relaxed)
            || launched.elapsed() > plan.timeout + Duration::from_secs(1)
    }

    /// Puts how long opening took in `summary`, and warns when the connections were
    /// still opening after the first request was due (a fixed start did not wait).
    fn report(
        &self,
        summary: &mut Summary,
        plan: &Plan,
        launched: Instant,
        start: Instant,
        waited: bool,
    ) {
        let Some(last) = self.last.filter(|_| plan.keepalive) else {
            return;
        };
        summary.connect_ramp_ms =
            Some(last.saturating_duration_since(launched).as_secs_f64() * 1e3);
        let late = last.saturating_duration_since(start);
        if !waited && late > LATE_RAMP {
            // The lag it caused is the ramp's, not the generator's: say it once, as that.
            summary
                .warnings
                .retain(|w| !w.starts_with("GENERATOR FELL BEHIND"));
            summary.warnings.push(format!(
                "CONNECT RAMP: the {} connections were still opening {:.0} ms after the first request was due; \
                 requests due meanwhile waited for them, so the first latencies and the scheduler lag (p99 {} us) \
                 include the connect storm, not a slow server or generator. Let the run wait for them (drop \
                 --no-connect-wait), start later, or open fewer connections",
                plan.connections,
                late.as_secs_f64() * 1e3,
                summary.scheduler_lag_us.p99
            ));
        }
    }
}

/// How long after the first request was due connections may still be opening before
/// the summary says so (a few timer ticks).
const LATE_RAMP: Duration = Duration::from_millis(5);

/// Merges the workers' windows of the same interval and hands them out in order, once
/// every worker has closed that interval or will send no more.
pub(crate) struct WindowMerger {
    /// The last interval each worker closed.
    sent: Vec<Option<u64>>,
    /// Workers that will send no more.
    retired: Vec<bool>,
    pending: BTreeMap<u64, Window>,
}

impl WindowMerger {
    pub(crate) fn new(workers: usize) -> Self {
        Self {
            sent: vec![None; workers],
            retired: vec![false; workers],
            pending: BTreeMap::new(),
        }
    }

    pub(crate) fn add(&mut self, worker: usize, batch: Vec<Window>) -> Vec<Window> {
        for window in batch {
            self.sent[worker] = Some(window.index);
            match self.pending.get_mut(&window.index) {
                Some(merged) => merged.merge(&window),
                None => {
                    self.pending.insert(window.index, window);
                }
            }
        }
        self.ready()
    }

    /// Stops waiting for `worker` (it ended), and hands out what that completes.
    pub(crate) fn retire(&mut self, worker: usize) -> Vec<Window> {
        self.retired[worker] = true;
        self.ready()
    }

    fn ready(&mut self) -> Vec<Window> {
        let mut ready = Vec::new();
        while let Some(entry) = self.pending.first_entry() {
            let index = *entry.key();
            let closed = self
                .sent
                .iter()
                .zip(&self.retired)
                .all(|(sent, retired)| *retired || sent.is_some_and(|s| s >= index));
            if !closed {
                break;
            }
            ready.push(entry.remove());
        }
        ready
    }

    pub(crate) fn finish(&mut self) -> Vec<Window> {
        std::mem::take(&mut self.pending).into_values().collect()
    }
}
