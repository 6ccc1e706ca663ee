//! The route probe: beside the open-loop load, asks each new, removed or changed route
//! over and over until it answers the way the change says it should, and keeps when that
//! first happened.
//!
//! A route is probed by one request at a time (never two in flight for the same route),
//! pending routes taken in turn, all of them within one rate for the whole probe so that
//! probing 10,000 routes does not become a load of its own. Each route keeps the time of
//! its first right answer (and when that answer came back) and of the last wrong one
//! before it: the route became right between the last wrong probe's send and the first
//! right one's answer, and that gap is the figure's resolution (the per-route
//! interval, 0.5 ms, when one route is pending; the pending count over the rate when many
//! are). Answers that are neither the route's before nor its after (a 503 while a proxy
//! reloads, a reset) are counted by kind; a kept-alive connection closed under a probe is
//! asked again once on a new one. Memory is a few words per route; no histogram is kept.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_stats::Outcome;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};

use crate::connection::{exchange, Exchange, Stream};
use crate::response::ResponseParser;

/// The header in which the lab's echo backend names itself (`POOL-N`).
const BACKEND_HEADER: &str = "x-backend";
/// How long one probe may take before it counts as a timeout (and its connection is
/// dropped).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Waits longer than this are the runtime timer's; shorter ones sleep the thread.
const SLEEP_GRAIN: Duration = Duration::from_millis(1);

/// What a route answers once a change has reached it, and what it answered before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// A new route: 404 before, then a 2xx from a backend of `pool`.
    Added {
        /// The pool whose backends should answer.
        pool: String,
    },
    /// A removed route: a 2xx from `pool` before, then 404.
    Removed {
        /// The pool that answered before.
        pool: String,
    },
    /// A changed route: a 2xx from `pool` at a lower revision (or none) before, then at
    /// `revision` (read from [`ProbeOptions::revision_header`]).
    Changed {
        /// The pool that answers before and after.
        pool: String,
        /// The revision it answers once right.
        revision: u32,
    },
}

/// One route to probe.
#[derive(Clone, Debug)]
pub struct ProbeRoute {
    /// Its `Host`.
    pub host: String,
    /// The path asked for.
    pub path: String,
    /// What it answers once right.
    pub expect: Expect,
}

/// How hard the probe may ask.
#[derive(Clone, Copy, Debug)]
pub struct ProbeOptions {
    /// Probes per second, over all pending routes.
    pub rate_per_s: f64,
    /// Connections the probes share (one request in flight on each).
    pub connections: usize,
    /// A route not right this long after it was asked for is given up (never right).
    pub give_up_after: Duration,
    /// One route is asked at most this often: the finest resolution wanted, which spares
    /// the probe's and the proxy's CPU when few routes are pending.
    pub per_route_interval: Duration,
    /// The response header in which a changed route names its revision (a number), for
    /// [`Expect::Changed`].
    pub revision_header: Option<&'static str>,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            rate_per_s: 2000.0,
            connections: 4,
            give_up_after: Duration::from_secs(60),
            per_route_interval: Duration::from_micros(500),
            revision_header: None,
        }
    }
}

/// What became of one probed route.
#[derive(Clone, Debug)]
pub struct RouteOutcome {
    /// Its `Host`.
    pub host: String,
    /// When the change that made it was asked for.
    pub requested_at: Instant,
    /// When the probe that first found it right was sent.
    pub right_at: Option<Instant>,
    /// When that probe's answer came back: the route became right after `last_wrong_at`
    /// and before this.
    pub right_answered_at: Option<Instant>,
    /// When the last probe that found it not yet right was sent (before `right_at`).
    pub last_wrong_at: Option<Instant>,
    /// Probes sent to it.
    pub probes: u32,
}

/// What became of one job's routes (one event's firing).
#[derive(Clone, Debug, Default)]
pub struct JobOutcome {
    /// Its routes, in the order they were given.
    pub routes: Vec<RouteOutcome>,
    /// Answers that were neither the route's before nor its after, by kind (`503`,
    /// `reset_after_write`, `200 from another pool`).
    pub wrong: BTreeMap<String, u64>,
}

/// What the probe found, and what it cost.
#[derive(Clone, Debug, Default)]
pub struct ProbeReport {
    /// Each job's outcome, by job number.
    pub jobs: Vec<JobOutcome>,
    /// The CPU time of the probe's thread, start to finish.
    pub cpu: Duration,
}

/// The probe's thread. Dropping it stops it.
pub struct Prober {
    jobs: mpsc::UnboundedSender<(usize, Vec<ProbeRoute>, Instant)>,
    stop: Arc<Notify>,
    settled: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<ProbeReport>>,
    /// What `before` said when the thread could not start.
    started: std::sync::mpsc::Receiver<Result<(), String>>,
}

impl Prober {
    /// Starts probing through `addr` (plain HTTP). `before` runs first on the probe's
    /// thread (to enter the client's network namespace); its error is returned.
    pub fn start(
        addr: SocketAddr,
        options: ProbeOptions,
        before: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> Result<Self, String> {
        let (jobs, rx) = mpsc::unbounded_channel();
        let stop = Arc::new(Notify::new());
        let settled = Arc::new(AtomicU64::new(0));
        let (started_tx, started) = std::sync::mpsc::channel();
        let thread = {
            let stop = stop.clone();
            let settled = settled.clone();
            std::thread::Builder::new()
                .name("ib-route-probe".into())
                .spawn(move || {
                    if let Err(e) = before() {
                        let _ = started_tx.send(Err(e));
                        return ProbeReport::default();
                    }
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = started_tx.send(Err(format!("the route probe's runtime: {e}")));
                            return ProbeReport::default();
                        }
                    };
                    let _ = started_tx.send(Ok(()));
                    let local = tokio::task::LocalSet::new();
                    let jobs = local.block_on(&runtime, run(addr, options, rx, stop, settled));
                    ProbeReport {
                        jobs,
                        cpu: crate::timer::thread_cpu(),
                    }
                })
                .map_err(|e| e.to_string())?
        };
        let mut prober = Self {
            jobs,
            stop,
            settled,
            thread: Some(thread),
            started,
        };
        match prober.started.recv() {
            Ok(Ok(())) => Ok(prober),
            Ok(Err(e)) => {
                prober.join();
                Err(e)
            }
            Err(_) => Err("the route probe's thread ended at its start".into()),
        }
    }

    /// Probes `routes` as part of job `job` (one event's firing; a later call adds to it),
    /// their change asked for at `requested_at`. A route still pending in an earlier job
    /// is given up there: the later change decides what it answers.
    pub fn probe(&self, job: usize, routes: Vec<ProbeRoute>, requested_at: Instant) {
        let _ = self.jobs.send((job, routes, requested_at));
    }

    /// Routes settled so far (right, or given up), over every job.
    pub fn settled(&self) -> u64 {
        self.settled.load(Ordering::Relaxed)
    }

    /// Stops probing (routes still pending are never right) and returns each job's
    /// outcome, by job number, and the probe's CPU time.
    pub fn finish(mut self) -> ProbeReport {
        self.join()
    }

    fn join(&mut self) -> ProbeReport {
        self.stop.notify_one();
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.join();
    }
}

/// One pending route: its job, its place in the job, and its request.
struct Pending {
    job: usize,
    index: usize,
    request: Rc<[u8]>,
    /// Not asked again before this.
    not_before: Instant,
}

/// The probe's state, shared by its connections (one thread, no lock).
struct State {
    jobs: Vec<JobOutcome>,
    expects: Vec<Vec<Expect>>,
    queue: VecDeque<Pending>,
    /// Where each pending route is, by host (one pending probe per host).
    pending_hosts: HashMap<String, (usize, usize)>,
    next_slot: Instant,
    interval: Duration,
    give_up_after: Duration,
    per_route_interval: Duration,
}

async fn run(
    addr: SocketAddr,
    options: ProbeOptions,
    mut jobs: mpsc::UnboundedReceiver<(usize, Vec<ProbeRoute>, Instant)>,
    stop: Arc<Notify>,
    settled: Arc<AtomicU64>,
) -> Vec<JobOutcome> {
    let state = Rc::new(RefCell::new(State {
        jobs: Vec::new(),
        expects: Vec::new(),
        queue: VecDeque::new(),
        pending_hosts: HashMap::new(),
        next_slot: Instant::now(),
        interval: Duration::from_secs_f64(1.0 / options.rate_per_s.max(1.0)),
        give_up_after: options.give_up_after,
        per_route_interval: options.per_route_interval,
    }));
    let work = Rc::new(Notify::new());
    for _ in 0..options.connections.max(1) {
        tokio::task::spawn_local(connection(
            addr,
            options.revision_header,
            state.clone(),
            work.clone(),
            settled.clone(),
        ));
    }
    loop {
        tokio::select! {
            () = stop.notified() => break,
            job = jobs.recv() => match job {
                Some((job, routes, at)) => {
                    add(&mut state.borrow_mut(), job, routes, at, &settled);
                    work.notify_waiters();
                }
                None => break,
            },
        }
    }
    let jobs = std::mem::take(&mut state.borrow_mut().jobs);
    jobs
}

fn add(
    state: &mut State,
    job: usize,
    routes: Vec<ProbeRoute>,
    requested_at: Instant,
    settled: &AtomicU64,
) {
    if state.jobs.len() <= job {
        state.jobs.resize_with(job + 1, JobOutcome::default);
        state.expects.resize_with(job + 1, Vec::new);
    }
    for route in routes {
        let index = state.jobs[job].routes.len();
        // A route pending in an earlier job is given up there (its queue entry is
        // dropped when it comes round).
        if state
            .pending_hosts
            .insert(route.host.clone(), (job, index))
            .is_some()
        {
            settled.fetch_add(1, Ordering::Relaxed);
        }
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: ingressbench-probe\r\n\r\n",
            route.path, route.host
        );
        state.queue.push_back(Pending {
            job,
            index,
            request: request.into_bytes().into(),
            not_before: requested_at,
        });
        state.jobs[job].routes.push(RouteOutcome {
            host: route.host,
            requested_at,
            right_at: None,
            right_answered_at: None,
            last_wrong_at: None,
            probes: 0,
        });
        state.expects[job].push(route.expect);
    }
}

/// One connection's loop: takes the next pending route when its slot comes, asks it, and
/// puts it back unless it was right.
async fn connection(
    addr: SocketAddr,
    revision_header: Option<&'static str>,
    state: Rc<RefCell<State>>,
    work: Rc<Notify>,
    settled: Arc<AtomicU64>,
) {
    let buffer = RefCell::new(vec![0u8; 16 * 1024].into_boxed_slice());
    let revision: Vec<String> = revision_header.map(str::to_owned).into_iter().collect();
    let mut parser = ResponseParser::new(BACKEND_HEADER, &revision);
    let mut stream: Option<Stream> = None;
    loop {
        let Some((pending, sent_at)) = next(&state, &settled).await else {
            // Nothing pending: wait for a job (or a route put back by another connection).
            let woken = work.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if state.borrow().queue.is_empty() {
                woken.await;
            }
            continue;
        };
        let answer = ask(addr, &mut stream, &pending, &mut parser, &buffer).await;
        let answered_at = Instant::now();
        let mut s = state.borrow_mut();
        let s = &mut *s;
        let expect = &s.expects[pending.job][pending.index];
        let verdict = judge(expect, &answer);
        let job = &mut s.jobs[pending.job];
        let route = &mut job.routes[pending.index];
        route.probes += 1;
        match verdict {
            Verdict::Right => {
                route.right_at = Some(sent_at);
                route.right_answered_at = Some(answered_at);
                s.pending_hosts.remove(&route.host);
                settled.fetch_add(1, Ordering::Relaxed);
            }
            Verdict::Before | Verdict::Wrong(_) => {
                route.last_wrong_at = Some(sent_at);
                if let Verdict::Wrong(kind) = verdict {
                    *job.wrong.entry(kind).or_default() += 1;
                }
                let mut pending = pending;
                pending.not_before = sent_at + s.per_route_interval;
                s.queue.push_back(pending);
                work.notify_one();
            }
        }
    }
}

/// The next route to ask and when its probe goes, after waiting for its slot; `None`
/// when nothing is pending. Routes given up (their time is over, or a later change took
/// them) are dropped here.
async fn next(state: &Rc<RefCell<State>>, settled: &AtomicU64) -> Option<(Pending, Instant)> {
    let at = {
        let mut s = state.borrow_mut();
        let first_due = s.queue.front()?.not_before;
        let now = Instant::now();
        // The next slot of the rate, and not before the first pending route may be asked
        // again (routes go back in the order they were asked, so the first is the
        // earliest).
        let at = s.next_slot.max(now).max(first_due);
        s.next_slot = at + s.interval;
        at
    };
    // The runtime's timer has 1 ms slots: a shorter wait blocks the probe's own thread
    // (its sends are timed when they go, so nothing measured waits with it).
    let wait = at.saturating_duration_since(Instant::now());
    if wait > SLEEP_GRAIN {
        tokio::time::sleep_until(at.into()).await;
    } else if !wait.is_zero() {
        std::thread::sleep(wait);
    }
    let mut s = state.borrow_mut();
    let now = Instant::now();
    while let Some(p) = s.queue.pop_front() {
        let route = &s.jobs[p.job].routes[p.index];
        let current = s.pending_hosts.get(&route.host) == Some(&(p.job, p.index));
        if !current {
            continue;
        }
        if now.duration_since(route.requested_at) > s.give_up_after {
            let host = route.host.clone();
            s.pending_hosts.remove(&host);
            settled.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        return Some((p, now));
    }
    None
}

/// What one probe got back.
enum Answer {
    /// A response: its status, the backend that answered and the route's revision (0
    /// when it named none).
    Response {
        status: u16,
        backend: Option<Vec<u8>>,
        revision: u32,
    },
    /// No response.
    Failed(Outcome),
}

/// Asks one route over the connection (opened if there is none). A kept-alive
/// connection the proxy closed as the probe was sent on it (an old worker going away at a
/// reload) is not the route's answer: the probe asks again once on a new connection, as
/// clients do.
async fn ask(
    addr: SocketAddr,
    stream: &mut Option<Stream>,
    pending: &Pending,
    parser: &mut ResponseParser,
    buffer: &RefCell<Box<[u8]>>,
) -> Answer {
    let mut retried = false;
    loop {
        let reused = stream.is_some();
        if stream.is_none() {
            match connect(addr).await {
                Ok(s) => *stream = Some(s),
                Err(outcome) => return Answer::Failed(outcome),
            }
        }
        let Some(s) = stream.as_mut() else {
            return Answer::Failed(Outcome::NotSent);
        };
        parser.reset(false);
        let mut progress = Exchange {
            bytes: 0,
            first_byte: None,
            reusable: false,
            written: false,
        };
        let outcome = tokio::time::timeout(
            PROBE_TIMEOUT,
            exchange(s, &pending.request, parser, buffer, &mut progress),
        )
        .await
        .unwrap_or(Outcome::ReadTimeout);
        if !progress.reusable {
            *stream = None;
        }
        let closed_under_us = matches!(
            outcome,
            Outcome::Eof | Outcome::ResetBeforeWrite | Outcome::ResetAfterWrite
        ) && progress.first_byte.is_none();
        if reused && closed_under_us && !retried {
            retried = true;
            continue;
        }
        return match outcome {
            Outcome::Status(status) => Answer::Response {
                status,
                backend: parser.backend().map(<[u8]>::to_vec),
                revision: parser.generations()[0],
            },
            failed => Answer::Failed(failed),
        };
    }
}

async fn connect(addr: SocketAddr) -> Result<Stream, Outcome> {
    match tokio::time::timeout(PROBE_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(Stream::Plain(s))
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Err(Outcome::Refused),
        Ok(Err(_)) => Err(Outcome::ConnectError),
        Err(_) => Err(Outcome::ConnectTimeout),
    }
}

/// How an answer stands against what the route should say.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Right,
    /// What it answered before the change.
    Before,
    /// Neither: by kind.
    Wrong(String),
}

fn judge(expect: &Expect, answer: &Answer) -> Verdict {
    let (status, backend, revision) = match answer {
        Answer::Response {
            status,
            backend,
            revision,
        } => (*status, backend.as_deref(), *revision),
        Answer::Failed(outcome) => return Verdict::Wrong(outcome.name().into_owned()),
    };
    let from_pool = |pool: &str| backend.is_some_and(|b| of_pool(b, pool));
    let ok = (200..300).contains(&status);
    match expect {
        Expect::Added { pool } if ok && from_pool(pool) => Verdict::Right,
        Expect::Added { .. } if status == 404 => Verdict::Before,
        Expect::Removed { .. } if status == 404 => Verdict::Right,
        Expect::Removed { pool } if ok && from_pool(pool) => Verdict::Before,
        Expect::Changed { pool, revision: r } if ok && from_pool(pool) => match revision.cmp(r) {
            std::cmp::Ordering::Equal => Verdict::Right,
            std::cmp::Ordering::Less => Verdict::Before,
            std::cmp::Ordering::Greater => Verdict::Wrong(format!("{status} at a later revision")),
        },
        Expect::Added { .. } | Expect::Removed { .. } | Expect::Changed { .. } if ok => {
            Verdict::Wrong(format!("{status} from another pool"))
        }
        _ => Verdict::Wrong(status.to_string()),
    }
}

/// Whether the backend named `backend` is one of pool `pool`'s: `POOL-N` in the lab,
/// `POOL-HASH-SUFFIX` in a cluster (a pod of the pool's Deployment). Neither is one of
/// another pool whose name starts with `POOL-` (`echo-2-1`, `echo-2-7d9f-x2k4p` are not
/// `echo`'s).
fn of_pool(backend: &[u8], pool: &str) -> bool {
    let Some(rest) = backend
        .strip_prefix(pool.as_bytes())
        .and_then(|rest| rest.strip_prefix(b"-"))
    else {
        return false;
    };
    let word = |w: &[u8]| {
        !w.is_empty()
            && w.iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    let parts: Vec<&[u8]> = rest.split(|b| *b == b'-').collect();
    match parts.as_slice() {
        [n] => !n.is_empty() && n.iter().all(u8::is_ascii_digit),
        // A ReplicaSet's pod: its template hash (the API writes 8-10 characters) and five
        // random ones.
        [hash, suffix] => word(hash) && hash.len() >= 5 && word(suffix) && suffix.len() == 5,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, backend: &str) -> Answer {
        answer_at(status, backend, 0)
    }

    fn answer_at(status: u16, backend: &str, revision: u32) -> Answer {
        Answer::Response {
            status,
            backend: (!backend.is_empty()).then(|| backend.as_bytes().to_vec()),
            revision,
        }
    }

    #[test]
    fn an_added_route_is_right_once_its_pool_answers() {
        let added = Expect::Added {
            pool: "echo".into(),
        };
        assert_eq!(judge(&added, &answer(200, "echo-3")), Verdict::Right);
        assert_eq!(judge(&added, &answer(404, "")), Verdict::Before);
        assert_eq!(
            judge(&added, &answer(200, "echo2-1")),
            Verdict::Wrong("200 from another pool".into())
        );
        assert_eq!(
            judge(&added, &answer(200, "echo-")),
            Verdict::Wrong("200 from another pool".into())
        );
        assert_eq!(
            judge(&added, &answer(503, "")),
            Verdict::Wrong("503".into())
        );
        assert_eq!(
            judge(&added, &Answer::Failed(Outcome::ResetAfterWrite)),
            Verdict::Wrong("reset_after_write".into())
        );
    }

    #[test]
    fn a_backend_is_of_a_pool_by_its_lab_name_or_its_pod_name() {
        assert!(of_pool(b"echo-3", "echo"));
        assert!(of_pool(b"echo-6f7d8c9b5-x2k4p", "echo"));
        assert!(!of_pool(b"echo-2-1", "echo"));
        assert!(!of_pool(b"echo-2-6f7d8c9b5-x2k4p", "echo"));
        assert!(of_pool(b"echo-2-6f7d8c9b5-x2k4p", "echo-2"));
        assert!(!of_pool(b"echo-", "echo"));
        assert!(!of_pool(b"echo", "echo"));
        assert!(!of_pool(b"other-1", "echo"));
    }

    #[test]
    fn a_removed_route_is_right_once_it_answers_404() {
        let removed = Expect::Removed {
            pool: "echo".into(),
        };
        assert_eq!(judge(&removed, &answer(404, "")), Verdict::Right);
        assert_eq!(judge(&removed, &answer(200, "echo-1")), Verdict::Before);
        assert_eq!(
            judge(&removed, &answer(502, "")),
            Verdict::Wrong("502".into())
        );
    }

    #[test]
    fn a_changed_route_is_right_once_it_answers_its_revision() {
        let changed = Expect::Changed {
            pool: "echo".into(),
            revision: 2,
        };
        assert_eq!(
            judge(&changed, &answer_at(200, "echo-1", 2)),
            Verdict::Right
        );
        assert_eq!(
            judge(&changed, &answer_at(200, "echo-1", 1)),
            Verdict::Before
        );
        assert_eq!(judge(&changed, &answer(200, "echo-1")), Verdict::Before);
        assert_eq!(
            judge(&changed, &answer_at(200, "echo-1", 3)),
            Verdict::Wrong("200 at a later revision".into())
        );
        assert_eq!(
            judge(&changed, &answer_at(200, "other-1", 2)),
            Verdict::Wrong("200 from another pool".into())
        );
        assert_eq!(
            judge(&changed, &answer(404, "")),
            Verdict::Wrong("404".into())
        );
    }
}
