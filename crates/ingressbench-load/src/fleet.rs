//! One run sent by several worker processes: the coordinator starts them on one instant,
//! each sends its stripe of the schedule, streams its windows, samples and finally its
//! whole recorder as lines of JSON on its standard output, and the coordinator merges
//! them exactly (histograms add; nothing is averaged). A worker's output is the only
//! transport, so a worker may be a local process or a pod whose log is followed.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ingressbench_stats::wire::{RecorderWire, SampleWire, WindowWire};
use ingressbench_stats::{HistogramUs, Recorder, Sample, Window};
use serde::{Deserialize, Serialize};

use crate::report::{progress_after, summarize};
use crate::run::WindowMerger;
use crate::{
    BatchWindow, Length, LoadError, LoadReport, Mode, Observer, Plan, Protocol, RequestSpec,
    Resolve, RetryPolicy, Share, Target, TlsOptions, Warmup,
};

/// How long after their start the coordinator gives local worker processes to begin,
/// when the caller did not fix the start.
pub const LOCAL_MARGIN: Duration = Duration::from_millis(300);

/// The environment variable a worker in a pod reads its plan from (else it reads it on
/// its standard input).
pub const PLAN_ENV: &str = "INGRESSBENCH_PLAN";
/// The environment variable with a worker's index, which overrides the plan's (an
/// Indexed Job's pods get it from the Job).
pub const INDEX_ENV: &str = "JOB_COMPLETION_INDEX";
/// The environment variable with a worker pod's name, which it reports as its host.
pub const POD_ENV: &str = "INGRESSBENCH_POD";

/// How long workers asked to stop have, beyond a request's timeout, to hand over what
/// they hold before they are ended.
pub const HAND_OVER: Duration = Duration::from_secs(10);

/// How long an ended worker's output has to end before the coordinator gives up on it (a
/// pod's log that is still followed, a process whose output another holds open).
pub const AFTER_KILL: Duration = Duration::from_secs(5);

/// A worker that starts later than this after the common start is named in the warnings.
const LATE_START_WARNING: Duration = Duration::from_millis(50);

/// A plan as a worker process receives it: everything but the caller's hooks, with the
/// start as wall-clock time and the worker's share.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PlanWire {
    url: String,
    request: RequestSpec,
    /// `open:<rate>`, `closed`, `sequential:<ns>`.
    mode: String,
    connections: usize,
    threads: usize,
    /// `requests:<n>` or `duration:<ns>`.
    length: String,
    /// `none`, `duration:<ns>`, `requests:<n>`.
    warmup: String,
    keepalive: bool,
    /// `http1` or `http2`.
    #[serde(default = "http1")]
    protocol: String,
    #[serde(default)]
    streams: Option<u32>,
    max_requests_per_connection: Option<u64>,
    retry: String,
    timeout_ns: u64,
    tls: TlsOptions,
    resolve: Vec<Resolve>,
    backend_header: String,
    generation_headers: Vec<String>,
    sample_rate: f64,
    window_ns: u64,
    batch_window: String,
    /// Which worker, of how many.
    pub index: usize,
    /// How many workers.
    pub of: usize,
    /// When the first request is due, in nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
}

fn http1() -> String {
    Protocol::Http1.name().to_owned()
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, ns)
}

impl PlanWire {
    /// Worker `index` of `of`'s part of `plan`, starting at `start`.
    pub fn of(plan: &Plan, index: usize, of: usize, start: SystemTime) -> Self {
        Self {
            url: plan.target.to_string(),
            request: plan.request.clone(),
            mode: match plan.mode {
                Mode::Open { rate_per_s } => format!("open:{rate_per_s}"),
                Mode::Closed => "closed".into(),
                Mode::Sequential { interval } => format!("sequential:{}", ns(interval)),
            },
            connections: plan.connections,
            threads: plan.threads,
            length: match plan.length {
                Length::Requests(n) => format!("requests:{n}"),
                Length::Duration(d) => format!("duration:{}", ns(d)),
            },
            warmup: match plan.warmup {
                Warmup::None => "none".into(),
                Warmup::Duration(d) => format!("duration:{}", ns(d)),
                Warmup::Requests(n) => format!("requests:{n}"),
            },
            keepalive: plan.keepalive,
            protocol: plan.protocol.name().to_owned(),
            streams: plan.streams,
            max_requests_per_connection: plan.max_requests_per_connection,
            retry: plan.retry.name().into(),
            timeout_ns: ns(plan.timeout),
            tls: plan.tls.clone(),
            resolve: plan.resolve.clone(),
            backend_header: plan.backend_header.clone(),
            generation_headers: plan.generation_headers.clone(),
            sample_rate: plan.sample_rate,
            window_ns: ns(plan.window),
            batch_window: plan.batch_window.to_string(),
            index,
            of,
            start_unix_ns: unix_ns(start),
        }
    }

    /// Carries the CA file's certificates in the plan itself, for workers that do not
    /// share this machine's files (pods).
    pub fn embed_ca(&mut self) -> Result<(), LoadError> {
        if let (Some(path), None) = (&self.tls.cacert, &self.tls.cacert_pem) {
            let pem = std::fs::read_to_string(path).map_err(|e| LoadError::Tls {
                path: Some(path.clone()),
                reason: format!("cannot read it: {e}"),
            })?;
            self.tls.cacert_pem = Some(pem);
            self.tls.cacert = None;
        }
        Ok(())
    }

    /// The plan back, starting at the instant that corresponds to its wall-clock start
    /// (in the past if this process started late), and how late this process is.
    pub fn plan(&self) -> Result<(Plan, Duration), LoadError> {
        let bad = |what: &str, text: &str| LoadError::InvalidPlan {
            field: "worker plan".into(),
            reason: format!("{what} `{text}` is not understood"),
        };
        let number = |text: &str, what: &str| -> Result<u64, LoadError> {
            text.parse().map_err(|_| bad(what, text))
        };
        let mut plan = Plan::new(Target::parse(&self.url)?);
        plan.request = self.request.clone();
        plan.mode = match self.mode.split_once(':') {
            Some(("open", rate)) => Mode::Open {
                rate_per_s: rate.parse().map_err(|_| bad("mode", &self.mode))?,
            },
            Some(("sequential", n)) => Mode::Sequential {
                interval: Duration::from_nanos(number(n, "mode")?),
            },
            None if self.mode == "closed" => Mode::Closed,
            _ => return Err(bad("mode", &self.mode)),
        };
        plan.connections = self.connections;
        plan.threads = self.threads;
        plan.length = match self.length.split_once(':') {
            Some(("requests", n)) => Length::Requests(number(n, "length")?),
            Some(("duration", n)) => Length::Duration(Duration::from_nanos(number(n, "length")?)),
            _ => return Err(bad("length", &self.length)),
        };
        plan.warmup = match self.warmup.split_once(':') {
            Some(("requests", n)) => Warmup::Requests(number(n, "warm-up")?),
            Some(("duration", n)) => Warmup::Duration(Duration::from_nanos(number(n, "warm-up")?)),
            None if self.warmup == "none" => Warmup::None,
            _ => return Err(bad("warm-up", &self.warmup)),
        };
        plan.keepalive = self.keepalive;
        plan.protocol =
            Protocol::parse(&self.protocol).ok_or_else(|| bad("protocol", &self.protocol))?;
        plan.streams = self.streams;
        plan.max_requests_per_connection = self.max_requests_per_connection;
        plan.retry = RetryPolicy::parse(&self.retry).ok_or_else(|| bad("retry", &self.retry))?;
        plan.timeout = Duration::from_nanos(self.timeout_ns);
        plan.tls = self.tls.clone();
        plan.resolve = self.resolve.clone();
        plan.backend_header = self.backend_header.clone();
        plan.generation_headers = self.generation_headers.clone();
        plan.sample_rate = self.sample_rate;
        plan.window = Duration::from_nanos(self.window_ns);
        plan.batch_window = BatchWindow::parse(&self.batch_window)
            .map_err(|_| bad("batch window", &self.batch_window))?;
        plan.share = Share {
            index: self.index,
            of: self.of,
        };
        let (now, wall) = (Instant::now(), SystemTime::now());
        let start = UNIX_EPOCH + Duration::from_nanos(self.start_unix_ns);
        let (start, late) = match start.duration_since(wall) {
            Ok(ahead) => (now + ahead, Duration::ZERO),
            Err(behind) => {
                let late = behind.duration();
                (now.checked_sub(late).unwrap_or(now), late)
            }
        };
        plan.start = Some(start);
        Ok((plan, late))
    }
}

/// One line of a worker's output.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Line {
    /// First: who it is and how late it began against the common start.
    Hello {
        /// The worker's index (0 to N-1).
        worker: usize,
        /// Its host name (a pod's name in a cluster).
        host: String,
        /// How late it was, by its own clock.
        start_late_ns: u64,
    },
    /// One closed interval, merged over its threads.
    Window(Box<WindowWire>),
    /// Sampled requests, with the backend names their ids refer to.
    Samples {
        /// The samples.
        samples: Vec<SampleWire>,
        /// Backend names by id.
        backends: Vec<String>,
    },
    /// Its wall clock as it wrote this line (after each window), nanoseconds since the
    /// Unix epoch: the coordinator bounds the worker's clock offset with it.
    Clock(u64),
    /// Last: everything it recorded.
    Done(Box<RecorderWire>),
    /// It could not run.
    Failed(String),
}

/// Writes a worker's lines to `out` as the run goes.
struct LineWriter<'a> {
    out: &'a mut dyn Write,
    failed: Option<std::io::Error>,
    stop: Arc<AtomicBool>,
}

impl LineWriter<'_> {
    fn send(&mut self, line: &Line) {
        if self.failed.is_some() {
            return;
        }
        let written = serde_json::to_writer(&mut *self.out, line)
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"))
            .and_then(|()| self.out.flush());
        if let Err(e) = written {
            // Nobody reads any more: the coordinator is gone, so the run has no point.
            self.stop.store(true, Ordering::SeqCst);
            self.failed = Some(e);
        }
    }
}

impl Observer for LineWriter<'_> {
    fn window(&mut self, window: &Window) {
        self.send(&Line::Window(Box::new(WindowWire::of(window))));
        self.send(&Line::Clock(unix_ns(SystemTime::now())));
    }

    fn samples(&mut self, samples: &[Sample], backends: &[String]) {
        self.send(&Line::Samples {
            samples: samples.iter().map(SampleWire::of).collect(),
            backends: backends.to_vec(),
        });
    }
}

/// The worker's side: runs its part of `wire` and writes its lines to `out`. Errors are
/// written as a [`Line::Failed`] too, for the coordinator to name.
pub fn serve(
    wire: &PlanWire,
    host: String,
    stop: Arc<AtomicBool>,
    out: &mut dyn Write,
) -> Result<(), LoadError> {
    let mut lines = LineWriter {
        out,
        failed: None,
        stop: stop.clone(),
    };
    let result = wire.plan().and_then(|(plan, late)| {
        lines.send(&Line::Hello {
            worker: wire.index,
            host,
            start_late_ns: ns(late),
        });
        crate::run(&plan, stop, &mut lines)
    });
    match result {
        Ok(report) => {
            lines.send(&Line::Done(Box::new(report.recorder.to_wire())));
            Ok(())
        }
        Err(e) => {
            lines.send(&Line::Failed(e.to_string()));
            Err(e)
        }
    }
}

/// What became of one worker: a record of workers.json.
pub use ingressbench_results::workers::{Worker as WorkerReport, WorkersFile};

/// What a fleet run measured: the merged run and each worker's part.
#[derive(Debug)]
pub struct FleetReport {
    /// The merged run, as one process would have recorded it.
    pub load: LoadReport,
    /// Each worker, by index.
    pub workers: Vec<WorkerReport>,
    /// The average of the workers' p99 latencies, in microseconds: what tools that
    /// average per-worker percentiles report instead of the merged p99.
    pub p99_average_of_workers_us: Option<f64>,
}

/// Where the lines of worker `k` come from, and how it is stopped and reaped.
pub trait WorkerHandle: Send {
    /// Asks it to stop and hand over what it has (once).
    fn interrupt(&mut self);
    /// Ends it now.
    fn kill(&mut self);
    /// Waits for it to end and says how it ended.
    fn wait(&mut self) -> String;
}

struct LocalWorker(Child);

impl WorkerHandle for LocalWorker {
    fn interrupt(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        }
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
    }

    fn wait(&mut self) -> String {
        use std::os::unix::process::ExitStatusExt;
        match self.0.wait() {
            Ok(status) => match (status.code(), status.signal()) {
                (Some(code), _) => format!("exit {code}"),
                (None, Some(signal)) => format!("killed by signal {signal}"),
                _ => status.to_string(),
            },
            Err(e) => format!("cannot be waited for: {e}"),
        }
    }
}

/// Starts `workers` local processes from `command(k)` (which must run [`serve`] with the
/// plan line it reads on its standard input), each in a process group of its own (a
/// terminal's Ctrl-C reaches the coordinator, which passes it on once) and ended by the
/// kernel if the coordinator's thread dies.
pub fn spawn_local(
    plan: &Plan,
    workers: usize,
    start: SystemTime,
    command: &dyn Fn(usize) -> Command,
) -> Result<Vec<Source>, LoadError> {
    use std::os::unix::process::CommandExt;
    let mut sources = Vec::with_capacity(workers);
    for k in 0..workers {
        // Under util-linux `setpriv --pdeathsig KILL`, as the lab's processes run.
        let asked = command(k);
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--"])
            .arg(asked.get_program())
            .args(asked.get_args());
        for (key, value) in asked.get_envs() {
            match value {
                Some(v) => cmd.env(key, v),
                None => cmd.env_remove(key),
            };
        }
        if let Some(dir) = asked.get_current_dir() {
            cmd.current_dir(dir);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd.spawn().map_err(LoadError::Runtime)?;
        let line = serde_json::to_string(&PlanWire::of(plan, k, workers, start))
            .expect("a plan serializes");
        let mut stdin = child.stdin.take().expect("piped");
        // A worker that dies before reading its plan shows in its exit status.
        let _ = writeln!(stdin, "{line}");
        drop(stdin);
        let stdout = Box::new(BufReader::new(child.stdout.take().expect("piped")));
        let stderr = Box::new(BufReader::new(child.stderr.take().expect("piped")));
        sources.push(Source {
            lines: stdout,
            stderr: Some(stderr),
            handle: Box::new(LocalWorker(child)),
            place: None,
        });
    }
    Ok(sources)
}

/// One worker as the coordinator sees it.
pub struct Source {
    /// Its output, a [`Line`] per line.
    pub lines: Box<dyn BufRead + Send>,
    /// Its diagnostics, if they come separately.
    pub stderr: Option<Box<dyn BufRead + Send>>,
    /// How to stop and reap it.
    pub handle: Box<dyn WorkerHandle>,
    /// Where it was placed, if the coordinator placed it (`pod … on node …`).
    pub place: Option<String>,
}

enum Event {
    Line(usize, Line),
    Stray(usize, String),
    Ended(usize),
}

/// Per worker, while the run goes.
struct Seen {
    host: String,
    start_late: Option<Duration>,
    partial: Recorder,
    /// Where its last window ended, in nanoseconds from the start.
    sent_until_ns: u64,
    /// The largest (its clock − ours) seen over its clock lines, in nanoseconds.
    clock_ahead_ns: Option<i128>,
    /// Samples that ended after its last window so far, with the batch's backend names:
    /// passed on once a window (or its whole recorder) covers them, so that the samples
    /// written are exactly the requests the merged figures hold, even if it dies.
    held: Vec<(Vec<Sample>, Vec<String>)>,
    /// How many held samples its end left uncovered.
    dropped_samples: usize,
    done: Option<Recorder>,
    error: Option<String>,
    ended: bool,
}

/// Passes on the worker's held samples that ended before `until` (its windows' end, in
/// nanoseconds from the start; `None`: all, its whole recorder came).
fn release(seen: &mut Seen, until: Option<u64>, observer: &mut dyn Observer) {
    for (samples, backends) in std::mem::take(&mut seen.held) {
        let (ready, later): (Vec<Sample>, Vec<Sample>) = samples
            .into_iter()
            .partition(|s| until.is_none_or(|u| s.done_at_ns < u));
        if !ready.is_empty() {
            observer.samples(&ready, &backends);
        }
        if !later.is_empty() {
            seen.held.push((later, backends));
        }
    }
}

/// Workers send HTTP load only: a WebSocket, event stream or gRPC load is sent by one
/// process.
fn http_only(plan: &Plan) -> Result<(), LoadError> {
    match plan.kind.stream_options() {
        None => Ok(()),
        Some(_) => Err(LoadError::InvalidPlan {
            field: "workers".into(),
            reason: "a WebSocket, event stream or gRPC load is sent by this process alone; leave out workers (and load.from: cluster)".into(),
        }),
    }
}

/// The coordinator's side: follows every source to its end, passing merged windows and
/// every worker's samples to `observer` as they come, forwards `stop` to the workers, and
/// ends any still running `grace` after `deadline`.
pub fn coordinate(
    plan: &Plan,
    sources: Vec<Source>,
    stop: Arc<AtomicBool>,
    deadline: Option<Instant>,
    observer: &mut dyn Observer,
) -> Result<FleetReport, LoadError> {
    http_only(plan)?;
    let workers = sources.len();
    let (tx, rx) = mpsc::channel();
    let mut handles = Vec::with_capacity(workers);
    let mut places = Vec::with_capacity(workers);
    let mut stderr_tails = Vec::with_capacity(workers);
    for (k, source) in sources.into_iter().enumerate() {
        let tail = Arc::new(std::sync::Mutex::new(VecDeque::new()));
        if let Some(stderr) = source.stderr {
            let tail = tail.clone();
            std::thread::Builder::new()
                .name(format!("ib-fleet-err-{k}"))
                .spawn(move || {
                    for line in stderr.lines().map_while(Result::ok) {
                        let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                        if t.len() == 20 {
                            t.pop_front();
                        }
                        t.push_back(line);
                    }
                })
                .map_err(LoadError::Runtime)?;
        }
        stderr_tails.push(tail);
        let tx = tx.clone();
        let lines = source.lines;
        std::thread::Builder::new()
            .name(format!("ib-fleet-{k}"))
            .spawn(move || {
                for text in lines.lines().map_while(Result::ok) {
                    let event = match serde_json::from_str::<Line>(&text) {
                        Ok(line) => Event::Line(k, line),
                        Err(_) => Event::Stray(k, text),
                    };
                    if tx.send(event).is_err() {
                        return;
                    }
                }
                let _ = tx.send(Event::Ended(k));
            })
            .map_err(LoadError::Runtime)?;
        handles.push(source.handle);
        places.push(source.place);
    }
    drop(tx);

    let window_ns = ns(plan.window);
    let mut seen: Vec<Seen> = (0..workers)
        .map(|_| Seen {
            host: String::new(),
            start_late: None,
            partial: Recorder::new(window_ns),
            sent_until_ns: 0,
            clock_ahead_ns: None,
            held: Vec::new(),
            dropped_samples: 0,
            done: None,
            error: None,
            ended: false,
        })
        .collect();
    let mut merger = WindowMerger::new(workers);
    let mut cumulative = HistogramUs::new();
    let (mut requests, mut errors) = (0u64, 0u64);
    let mut emit = |windows: Vec<Window>, observer: &mut dyn Observer| {
        for window in windows {
            cumulative.merge(&window.latency);
            requests += window.outcomes.total();
            errors += window.outcomes.errors();
            observer.window(&window);
            observer.progress(&progress_after(&window, &cumulative, requests, errors));
        }
    };
    // Bounded whatever the workers do: asked to stop, they have a request's timeout and
    // HAND_OVER to send what they hold; then they are ended, and what has not ended its
    // output AFTER_KILL later is given up (what it sent is kept).
    let (mut interrupted_at, mut killed_at): (Option<Instant>, Option<Instant>) = (None, None);
    while seen.iter().any(|s| !s.ended) {
        let now = Instant::now();
        if stop.load(Ordering::Relaxed) && interrupted_at.is_none() {
            interrupted_at = Some(now);
            handles.iter_mut().for_each(|h| h.interrupt());
        }
        let handed_over = interrupted_at.is_some_and(|at| now > at + plan.timeout + HAND_OVER);
        if (deadline.is_some_and(|d| now > d) || handed_over) && killed_at.is_none() {
            killed_at = Some(now);
            handles.iter_mut().for_each(|h| h.kill());
        }
        if killed_at.is_some_and(|at| now > at + AFTER_KILL) {
            for (k, s) in seen.iter_mut().enumerate().filter(|(_, s)| !s.ended) {
                s.ended = true;
                s.error.get_or_insert_with(|| {
                    format!("its output had not ended {AFTER_KILL:?} after it was ended: what it sent before is kept")
                });
                s.dropped_samples = s.held.drain(..).map(|(h, _)| h.len()).sum();
                let ready = merger.retire(k);
                emit(ready, observer);
            }
            break;
        }
        let event = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(event) => event,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        match event {
            Event::Line(
                k,
                Line::Hello {
                    host,
                    start_late_ns,
                    ..
                },
            ) => {
                seen[k].host = host;
                seen[k].start_late = Some(Duration::from_nanos(start_late_ns));
            }
            Event::Line(k, Line::Window(w)) => match w.decode() {
                Ok(window) => {
                    let end = window.start_ns() + window.width_ns;
                    seen[k].sent_until_ns = seen[k].sent_until_ns.max(end);
                    seen[k].partial.absorb_window(&window);
                    let ready = merger.add(k, vec![window]);
                    emit(ready, observer);
                    release(&mut seen[k], Some(end), observer);
                }
                Err(e) => seen[k].error = Some(format!("sent a window that does not decode: {e}")),
            },
            Event::Line(k, Line::Samples { samples, backends }) => {
                let decoded: Vec<Sample> = samples.iter().filter_map(|s| s.decode().ok()).collect();
                seen[k].held.push((decoded, backends));
                let until = seen[k].sent_until_ns;
                release(&mut seen[k], Some(until), observer);
            }
            Event::Line(k, Line::Done(wire)) => match Recorder::from_wire(&wire) {
                Ok(recorder) => {
                    seen[k].done = Some(recorder);
                    release(&mut seen[k], None, observer);
                }
                Err(e) => {
                    seen[k].error = Some(format!("sent a recorder that does not decode: {e}"))
                }
            },
            Event::Line(k, Line::Failed(why)) => seen[k].error = Some(why),
            Event::Line(k, Line::Clock(theirs)) => {
                let ahead = i128::from(theirs) - i128::from(unix_ns(SystemTime::now()));
                let best = seen[k].clock_ahead_ns.get_or_insert(ahead);
                *best = (*best).max(ahead);
            }
            Event::Stray(k, text) => {
                let mut t = stderr_tails[k].lock().unwrap_or_else(|p| p.into_inner());
                t.push_back(text);
            }
            Event::Ended(k) => {
                seen[k].ended = true;
                // What no window covers is not in the merged figures: not in the samples.
                seen[k].dropped_samples = seen[k].held.drain(..).map(|(s, _)| s.len()).sum();
                // Its later windows will not come: stop waiting for them.
                let ready = merger.retire(k);
                emit(ready, observer);
            }
        }
    }
    emit(merger.finish(), observer);

    // Every worker failed to start the same way: that is the run's error (a bad URL, a
    // TLS file), not a measurement.
    if seen.iter().all(|s| s.done.is_none() && s.error.is_some()) {
        let why = seen[0].error.clone().unwrap_or_default();
        handles.iter_mut().for_each(|h| {
            h.wait();
        });
        return Err(LoadError::InvalidPlan {
            field: "--workers".into(),
            reason: format!("worker 0 could not run: {why}"),
        });
    }

    let share_rate = plan.rate_per_s().map(|r| r / workers as f64);
    let interrupted = stop.load(Ordering::Relaxed);
    let mut merged = Recorder::new(window_ns);
    let mut reports = Vec::with_capacity(workers);
    let mut warnings = Vec::new();
    let last_end = seen.iter().map(|s| s.sent_until_ns).max().unwrap_or(0);
    for (k, ((s, handle), place)) in seen
        .into_iter()
        .zip(handles.iter_mut())
        .zip(places)
        .enumerate()
    {
        let exit = handle.wait();
        let complete = s.done.is_some();
        let recorder = s.done.unwrap_or(s.partial);
        merged.merge(&recorder);
        let summary = summarize(&recorder, plan, share_rate, interrupted);
        let mut mine: Vec<String> = summary
            .warnings
            .iter()
            .map(|w| format!("worker {k} ({}): {w}", s.host))
            .collect();
        if !complete {
            mine.push(format!(
                "worker {k} ({}) ended before handing over its results ({exit}{}); the merged figures hold its latency and outcomes up to its last window, not its service time, phases or backends{}",
                s.host,
                s.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default(),
                match s.dropped_samples {
                    0 => String::new(),
                    n => format!(", and its {n} sampled requests after that window are left out of the samples too"),
                }
            ));
        }
        // Two windows short of the others: it stopped (was stopped) early.
        let short_ns = last_end.saturating_sub(s.sent_until_ns);
        if short_ns >= 2 * window_ns && !interrupted {
            mine.push(format!(
                "worker {k} ({}) stopped sending {:.1} s before the others ({exit}); the merged figures hold what it sent until then, and its share of the rate is missing after",
                s.host,
                short_ns as f64 / 1e9
            ));
        }
        if let Some(ahead) = s
            .clock_ahead_ns
            .filter(|a| *a > LATE_START_WARNING.as_nanos() as i128)
        {
            mine.push(format!(
                "worker {k} ({}): its clock is at least {:.0} ms ahead of this machine's, so it started its share that much early and its start lateness reads that much short",
                s.host,
                ahead as f64 / 1e6
            ));
        }
        if let Some(late) = s.start_late.filter(|l| *l > LATE_START_WARNING) {
            mine.push(format!(
                "worker {k} ({}) started {:.0} ms after the common start; its first requests went out late and their latency counts from when they were due",
                s.host,
                late.as_secs_f64() * 1e3
            ));
        }
        warnings.extend(mine.iter().cloned());
        let stderr = stderr_tails[k]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        reports.push(WorkerReport {
            index: k,
            host: s.host,
            place,
            start_late_ms: s.start_late.map(|l| l.as_secs_f64() * 1e3),
            clock_ahead_at_least_ms: s.clock_ahead_ns.map(|a| a as f64 / 1e6),
            complete,
            exit,
            error: s.error,
            stderr,
            summary,
            warnings: mine,
        });
    }
    let mut summary = summarize(&merged, plan, plan.rate_per_s(), interrupted);
    summary.warnings.extend(warnings);
    let p99s: Vec<f64> = reports
        .iter()
        .map(|r| &r.summary)
        .filter(|s| s.latency_us.count > 0)
        .map(|s| s.latency_us.p99 as f64)
        .collect();
    Ok(FleetReport {
        load: LoadReport {
            recorder: merged,
            summary,
            stream: None,
        },
        workers: reports,
        p99_average_of_workers_us: (!p99s.is_empty())
            .then(|| p99s.iter().sum::<f64>() / p99s.len() as f64),
    })
}

/// Runs `plan` on `workers` local processes of `program worker` (a program whose `worker`
/// command runs [`serve`]: this tool), starting at `plan.start` if set, else
/// [`LOCAL_MARGIN`] from now.
pub fn run_local(
    plan: &Plan,
    workers: usize,
    program: &std::path::Path,
    stop: Arc<AtomicBool>,
    observer: &mut dyn Observer,
) -> Result<FleetReport, LoadError> {
    http_only(plan)?;
    let command = |_: usize| {
        let mut c = Command::new(program);
        c.arg("worker");
        c
    };
    let mut whole = plan.clone();
    whole.share = Share {
        index: 0,
        of: workers,
    };
    whole.validate()?;
    let start = plan.start.unwrap_or_else(|| Instant::now() + LOCAL_MARGIN);
    let wall = SystemTime::now() + start.saturating_duration_since(Instant::now());
    let sources = spawn_local(plan, workers, wall, &command)?;
    coordinate(plan, sources, stop, deadline(plan, start), observer)
}

/// When every worker should have ended: the run's length, its warm-up, a request's
/// timeout and ten seconds to hand over; none for a run of a number of requests.
pub fn deadline(plan: &Plan, start: Instant) -> Option<Instant> {
    let warmup = match plan.warmup {
        Warmup::Duration(d) => d,
        _ => Duration::ZERO,
    };
    match plan.length {
        Length::Duration(d) => Some(start + warmup + d + plan.timeout + Duration::from_secs(10)),
        Length::Requests(_) => None,
    }
}

/// Each worker's summary and health (in index order), for `workers.json`.
pub fn workers_file(report: &FleetReport) -> WorkersFile {
    WorkersFile {
        workers: report.workers.clone(),
        merged_p99_us: Some(report.load.summary.latency_us.p99),
        p99_average_of_workers_us: report.p99_average_of_workers_us,
        cluster: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker whose output never ends, whatever it is told (a followed log that hangs).
    struct Deaf(Arc<std::sync::Mutex<Vec<&'static str>>>);

    impl WorkerHandle for Deaf {
        fn interrupt(&mut self) {
            self.0.lock().unwrap().push("interrupt");
        }
        fn kill(&mut self) {
            self.0.lock().unwrap().push("kill");
        }
        fn wait(&mut self) -> String {
            "still there".into()
        }
    }

    /// Stopped (Ctrl-C, SIGTERM) with a worker whose output never ends, the coordinator
    /// asks it to hand over, ends it after a request's timeout and HAND_OVER, and gives
    /// up on it AFTER_KILL later, saying so: it does not wait for ever.
    #[test]
    fn a_worker_whose_output_never_ends_cannot_hold_the_coordinator() {
        let mut plan = Plan::new(Target::parse("http://127.0.0.1:9/").unwrap());
        plan.length = Length::Requests(10);
        plan.timeout = Duration::from_millis(100);
        let (reader, writer) = std::io::pipe().unwrap();
        let told = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sources = vec![Source {
            lines: Box::new(BufReader::new(reader)),
            stderr: None,
            handle: Box::new(Deaf(told.clone())),
            place: None,
        }];
        let stop = Arc::new(AtomicBool::new(true));
        let outcome = coordinate(&plan, sources, stop, None, &mut crate::NoObserver);
        drop(writer);
        let Err(err) = outcome else {
            panic!("a worker that sent nothing is an error");
        };
        assert!(err.to_string().contains("had not ended"), "{err}");
        assert_eq!(*told.lock().unwrap(), ["interrupt", "kill"]);
    }

    /// A worker gets the HTTP version and streams its coordinator was given; a plan from
    /// a coordinator that predates them reads as HTTP/1.1.
    #[test]
    fn the_plan_carries_the_protocol_and_streams() {
        let mut plan = Plan::new(Target::parse("https://app.test/").unwrap());
        plan.protocol = Protocol::Http2;
        plan.streams = Some(64);
        let text = serde_json::to_string(&PlanWire::of(&plan, 0, 2, SystemTime::now())).unwrap();
        let (back, _) = serde_json::from_str::<PlanWire>(&text)
            .unwrap()
            .plan()
            .unwrap();
        assert_eq!((back.protocol, back.streams), (Protocol::Http2, Some(64)));
        let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
        let fields = old.as_object_mut().unwrap();
        fields.remove("protocol");
        fields.remove("streams");
        let (back, _) = serde_json::from_value::<PlanWire>(old)
            .unwrap()
            .plan()
            .unwrap();
        assert_eq!((back.protocol, back.streams), (Protocol::Http1, None));
    }
}
