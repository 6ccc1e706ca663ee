//! The validated description of one load run.

use std::time::Duration;

use crate::{LoadError, RequestSpec, Resolve, Target, TlsOptions};

/// How requests are paced.
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    /// A constant arrival rate, whatever the answers do (wrk2's `-R`). Latency is measured
    /// from each request's intended send time.
    Open {
        /// Requests per second, in total over all threads.
        rate_per_s: f64,
    },
    /// Every connection sends its next request as soon as the previous one is answered
    /// (wrk, hey, `ab -c`).
    Closed,
    /// One request at a time on one connection, with a pause between them (a curl loop).
    Sequential {
        /// Pause after each answer.
        interval: Duration,
    },
}

/// What the client does when a request fails on a reused connection before any byte of
/// the answer: the server closed the connection just as the request went out (an idle
/// timeout or a reload racing the write). Closes seen while a connection is idle never
/// reach a request; this is only for the race that remains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RetryPolicy {
    /// Count the failure (wrk's behaviour).
    None,
    /// Send idempotent requests (GET, HEAD, PUT, DELETE, OPTIONS, TRACE) once more on a
    /// new connection, as RFC 9112 §9.3.1.1 allows and browsers and Go's net/http do.
    #[default]
    Idempotent,
    /// Send any request once more on a new connection.
    Always,
}

impl RetryPolicy {
    /// The policy called `name` (`none`, `idempotent`, `always`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "none" => Some(Self::None),
            "idempotent" => Some(Self::Idempotent),
            "always" => Some(Self::Always),
            _ => None,
        }
    }

    /// Its name, as [`RetryPolicy::parse`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Idempotent => "idempotent",
            Self::Always => "always",
        }
    }

    /// Whether a request with `method` may be sent again under this policy.
    pub fn allows(self, method: &str) -> bool {
        const IDEMPOTENT: [&str; 6] = ["GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"];
        match self {
            Self::None => false,
            Self::Idempotent => IDEMPOTENT.iter().any(|m| m.eq_ignore_ascii_case(method)),
            Self::Always => true,
        }
    }
}

/// The HTTP version spoken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 (ALPN `http/1.1` over TLS).
    #[default]
    Http1,
    /// HTTP/2: ALPN `h2` over TLS, `h2c` with prior knowledge for `http://`. One
    /// connection carries many requests at once, each on a stream of its own.
    Http2,
    /// HTTP/3: QUIC (always TLS, ALPN `h3`) over UDP, many requests at once per
    /// connection as over HTTP/2, with no head-of-line blocking between them.
    Http3,
}

impl Protocol {
    /// The protocol called `name` (`http1`, `http2`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "http1" | "http/1.1" | "h1" => Some(Self::Http1),
            "http2" | "h2" | "h2c" => Some(Self::Http2),
            "http3" | "h3" => Some(Self::Http3),
            _ => None,
        }
    }

    /// Its name, as [`Protocol::parse`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Http1 => "http1",
            Self::Http2 => "http2",
            Self::Http3 => "http3",
        }
    }
}

/// HTTP/2 streams per connection when the plan does not say: the server's limit, but no
/// more than this (most servers announce 100 or 128; Envoy announces 2^31-1).
pub const DEFAULT_STREAMS: u32 = 100;
/// The most streams per connection a plan may ask for.
pub const MAX_STREAMS: u32 = 10_000;

/// How the open-loop pacer batches its wake-ups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BatchWindow {
    /// No batching while the worker thread has CPU to spare (it spends under about a
    /// third of a core): every request is sent at its time. When it does not, the window
    /// widens only as far as needed, up to 1 ms, and narrows again when it can. The
    /// windows used are reported, and the lateness is in every latency figure.
    #[default]
    Auto,
    /// Wake at most once per this window and send every request due by then.
    Fixed(Duration),
}

impl BatchWindow {
    /// `auto` or a duration (`500us`, `0us`).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == "auto" {
            return Ok(Self::Auto);
        }
        ingressbench_stats::parse_duration(text)
            .map(Self::Fixed)
            .map_err(|e| format!("{e}; or `auto`"))
    }
}

impl std::fmt::Display for BatchWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Fixed(d) => write!(f, "{}us", d.as_micros()),
        }
    }
}

/// What a run sends.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Kind {
    /// HTTP requests.
    #[default]
    Http,
    /// Messages over WebSockets (one per connection), at the open-loop rate.
    WebSocket(crate::stream::options::StreamOptions),
    /// Server-sent events (one stream per connection), at the open-loop rate.
    Sse(crate::stream::options::StreamOptions),
    /// gRPC unary calls (many at once on each connection's HTTP/2), at the open-loop rate.
    Grpc(crate::stream::options::StreamOptions),
    /// gRPC server streams (one per connection), at the open-loop rate.
    GrpcStream(crate::stream::options::StreamOptions),
}

impl Kind {
    /// A long-lived load's own settings; none for HTTP requests.
    pub fn stream_options(&self) -> Option<&crate::stream::options::StreamOptions> {
        match self {
            Kind::Http => None,
            Kind::WebSocket(o) | Kind::Sse(o) | Kind::Grpc(o) | Kind::GrpcStream(o) => Some(o),
        }
    }
}

/// How long a run lasts (after its warm-up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Length {
    /// This many measured requests.
    Requests(u64),
    /// This long.
    Duration(Duration),
}

/// What is excluded at the start of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Warmup {
    /// Nothing.
    None,
    /// Requests due within this time.
    Duration(Duration),
    /// This many requests.
    Requests(u64),
}

/// Connections when a load does not say (open and closed loop).
pub const DEFAULT_CONNECTIONS: usize = 10;

/// A load's pacing and length as its user wrote them, before defaults: the `load`
/// command's flags, a scenario's `load:` block and each capacity trial fill one, and
/// [`Shape::plan`] is the one place their defaults are filled in. What only one caller
/// has (a request's headers and body, TLS, a stream's options) it sets on the plan after.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// How requests are paced.
    pub mode: Mode,
    /// Connections; by default one for sequential load (the only number it takes) and
    /// [`DEFAULT_CONNECTIONS`] for the rest.
    pub connections: Option<usize>,
    /// Worker threads; one by default.
    pub threads: Option<usize>,
    /// How long the measured part lasts (it wins over `requests`); [`Plan::new`]'s ten
    /// seconds when neither is given.
    pub duration: Option<Duration>,
    /// How many requests the measured part holds.
    pub requests: Option<u64>,
    /// A warm-up this long (zero is none); `warmup_requests` when not given.
    pub warmup: Option<Duration>,
    /// A warm-up of this many requests.
    pub warmup_requests: Option<u64>,
    /// A capacity trial this long, judged on its windows: their width is
    /// [`trial_window`]'s, not one second.
    pub trial: Option<Duration>,
}

impl Shape {
    /// A shape with `mode` and every other choice left to the defaults.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            connections: None,
            threads: None,
            duration: None,
            requests: None,
            warmup: None,
            warmup_requests: None,
            trial: None,
        }
    }

    /// A plan for `target` with this shape: what it leaves out is [`Plan::new`]'s, but
    /// for sequential load's one connection.
    pub fn plan(&self, target: Target) -> Plan {
        let mut plan = Plan::new(target);
        plan.mode = self.mode.clone();
        if let Mode::Sequential { .. } = self.mode {
            plan.connections = 1;
        }
        plan.connections = self.connections.unwrap_or(plan.connections);
        plan.threads = self.threads.unwrap_or(plan.threads);
        if let Some(n) = self.requests {
            plan.length = Length::Requests(n);
        }
        if let Some(d) = self.duration {
            plan.length = Length::Duration(d);
        }
        if let Some(n) = self.warmup_requests {
            plan.warmup = Warmup::Requests(n);
        }
        if let Some(d) = self.warmup.filter(|d| !d.is_zero()) {
            plan.warmup = Warmup::Duration(d);
        }
        if let Some(trial) = self.trial {
            plan.window = trial_window(trial);
        }
        plan
    }
}

/// The window a capacity trial of this length is judged on: a twentieth of it, from
/// 100 ms to 1 s, so that there are twenty or more to resample.
pub fn trial_window(trial: Duration) -> Duration {
    (trial / 20).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// Everything a load run needs. Build one with [`Shape::plan`] (or [`Plan::new`]), set
/// fields, then [`crate::run`] validates it.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Where to send.
    pub target: Target,
    /// What to send.
    pub request: RequestSpec,
    /// HTTP requests, messages over WebSockets or server-sent events.
    pub kind: Kind,
    /// How to pace it.
    pub mode: Mode,
    /// Connections in total (open and closed loop); sequential load uses one.
    pub connections: usize,
    /// Worker threads, each owning its share of the connections.
    pub threads: usize,
    /// How long to run.
    pub length: Length,
    /// What to exclude at the start.
    pub warmup: Warmup,
    /// HTTP/1.1 or HTTP/2.
    pub protocol: Protocol,
    /// HTTP/2: the most streams in flight on one connection (`None`: the server's limit,
    /// at most [`DEFAULT_STREAMS`]).
    pub streams: Option<u32>,
    /// Reuse connections (HTTP keep-alive); false opens one per request.
    pub keepalive: bool,
    /// Close a connection after this many requests.
    pub max_requests_per_connection: Option<u64>,
    /// What to do when a reused connection fails before any byte of the answer.
    pub retry: RetryPolicy,
    /// Limit for a request from its send: connect, TLS, write and read (HTTP/2: its
    /// resends too). A wait for a free connection is not in it.
    pub timeout: Duration,
    /// TLS options for `https://` targets.
    pub tls: TlsOptions,
    /// curl-style `--resolve` entries.
    pub resolve: Vec<Resolve>,
    /// The response header naming the backend that answered.
    pub backend_header: String,
    /// Response headers carrying a configuration generation (a number each hop stamps on
    /// its answers; at most two): answers are counted per generation, with the first and
    /// last of each, so that route changes can be read from the traffic. Defaults to the
    /// lab's: `x-ingressbench-generation` (the proxies) and
    /// `x-ingressbench-sidecar-generation` (the sidecar).
    pub generation_headers: Vec<String>,
    /// Share of requests kept as individual samples (0 to 1).
    pub sample_rate: f64,
    /// Width of the interval windows.
    pub window: Duration,
    /// Open loop: the pacer wakes at most once per window and then releases every
    /// request due by then. Isolated requests are sent at their time; at rates above one
    /// per window, a shorter window sends closer to the schedule and costs more CPU per
    /// request (see docs/PERFORMANCE.md). The default adapts to the CPU the thread has.
    pub batch_window: BatchWindow,
    /// When the run starts (the first request is due, warm-up included); `None` starts it
    /// right away. A caller that times other things against the run (events) sets it.
    pub start: Option<std::time::Instant>,
    /// With keep-alive and no fixed `start`: start the schedule once every connection is
    /// open (or failed), as wrk does, so that opening thousands of them is not counted
    /// as the generator falling behind; how long it took is the summary's connect ramp.
    /// `false` starts at once, and requests due meanwhile wait for connections still
    /// opening (what a connect storm costs the first requests).
    pub wait_for_connections: bool,
    /// Sequential load: called before each request with its number (from 0, warm-up
    /// included); the request waits until it returns. A caller uses it to act in
    /// lock-step with requests (kill a backend, send a request, repeat).
    pub gate: Option<RequestGate>,
    /// The part of the load this process sends when several processes share one run
    /// (see [`Share`]); the whole by default.
    pub share: Share,
    /// Asks the run's QUIC connections to move to a new local port (a `migrate` event).
    pub migrate: Migrate,
}

/// A handle that moves an HTTP/3 run's connections to a new local port, as a client
/// whose address changes (a NAT rebinding, a phone moving networks) is moved: each
/// [`Migrate::ask`] rebinds every worker thread's UDP socket once, and QUIC carries the
/// connections over (connection migration, RFC 9000 §9) if the server takes it.
#[derive(Clone, Debug, Default)]
pub struct Migrate(std::sync::Arc<Migrations>);

/// How many migrations were asked for, and a wake-up for the workers waiting on them.
#[derive(Debug, Default)]
struct Migrations {
    asked: std::sync::atomic::AtomicU32,
    changed: tokio::sync::Notify,
}

impl Migrate {
    /// Asks for one migration.
    pub fn ask(&self) {
        (self.0.asked).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.changed.notify_waiters();
    }

    /// How many were asked for so far.
    pub(crate) fn asked(&self) -> u32 {
        self.0.asked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Once more than `taken` were asked for: how many (a worker's wait, which costs
    /// nothing while none is asked).
    pub(crate) async fn next(&self, taken: u32) -> u32 {
        loop {
            let notified = self.0.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let asked = self.asked();
            if asked != taken {
                return asked;
            }
            notified.await;
        }
    }
}

/// Process `index` of `of` that send one run between them: it owns stripes
/// `index, index + of, …` of the open-loop schedule (threads stripe further), and its
/// part of the connections and of a request budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// Which process, from 0.
    pub index: usize,
    /// How many processes share the run.
    pub of: usize,
}

impl Share {
    /// All of it.
    pub const WHOLE: Share = Share { index: 0, of: 1 };

    /// This process's part of `total` things (the first `total % of` get one more).
    pub fn part(self, total: u64) -> u64 {
        split(total, self.index, self.of)
    }
}

/// Part `index` of `parts` of `total`, the first `total % parts` parts one larger.
pub(crate) fn split(total: u64, index: usize, parts: usize) -> u64 {
    total / parts as u64 + u64::from((index as u64) < total % parts as u64)
}

/// A function called before each sequential request (see [`Plan::gate`]).
#[derive(Clone)]
pub struct RequestGate(pub std::sync::Arc<dyn Fn(u64) + Send + Sync>);

impl std::fmt::Debug for RequestGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestGate")
    }
}

/// The most requests per second one worker thread could ever send: one per microsecond
/// of CPU, ten times the best measured (docs/PERFORMANCE.md), so that no rate a machine
/// could keep is refused.
pub(crate) const MAX_RATE_PER_THREAD: f64 = 1_000_000.0;

/// The longest `--timeout`: a day (a request's deadline is a time, and must be one).
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

impl Plan {
    /// A plan with the defaults: 10 s of closed-loop load over 10 connections, one thread.
    pub fn new(target: Target) -> Self {
        Self {
            target,
            request: RequestSpec::default(),
            kind: Kind::Http,
            mode: Mode::Closed,
            connections: DEFAULT_CONNECTIONS,
            threads: 1,
            length: Length::Duration(Duration::from_secs(10)),
            warmup: Warmup::None,
            protocol: Protocol::Http1,
            streams: None,
            keepalive: true,
            max_requests_per_connection: None,
            retry: RetryPolicy::default(),
            timeout: Duration::from_secs(10),
            tls: TlsOptions::default(),
            resolve: Vec::new(),
            backend_header: "x-backend".to_owned(),
            generation_headers: vec![
                "x-ingressbench-generation".to_owned(),
                "x-ingressbench-sidecar-generation".to_owned(),
            ],
            sample_rate: 0.0,
            window: Duration::from_secs(1),
            batch_window: BatchWindow::Auto,
            start: None,
            wait_for_connections: true,
            gate: None,
            share: Share::WHOLE,
            migrate: Migrate::default(),
        }
    }

    /// The target rate, for open-loop plans.
    pub fn rate_per_s(&self) -> Option<f64> {
        match self.mode {
            Mode::Open { rate_per_s } => Some(rate_per_s),
            _ => None,
        }
    }

    /// What a WebSocket, event stream or gRPC load cannot be: closed-loop or sequential
    /// (messages and events go at a rate), HTTP/2 for the first two (RFC 8441 is not
    /// sent; events are read over HTTP/1.1; gRPC is always HTTP/2), shared between
    /// processes, a number of messages.
    fn validate_stream(
        &self,
        options: &crate::stream::options::StreamOptions,
    ) -> Result<(), LoadError> {
        use crate::stream::options::MESSAGE_HEADER;
        let what = match self.kind {
            Kind::Sse(_) => "an event stream load",
            Kind::Grpc(_) => "a gRPC unary load",
            Kind::GrpcStream(_) => "a gRPC stream load",
            _ => "a WebSocket load",
        };
        let why = match () {
            () if !matches!(self.mode, Mode::Open { .. }) => Some((
                "-R/--rate",
                format!("{what} goes at a rate (messages or events a second, open loop): give one"),
            )),
            () if self.protocol == Protocol::Http3 => Some((
                "protocol",
                format!("{what} is not sent over HTTP/3 here: HTTP/3 carries requests; drop --http3"),
            )),
            () if self.protocol != Protocol::Http1
                && matches!(self.kind, Kind::WebSocket(_) | Kind::Sse(_)) =>
            {
                Some((
                "protocol",
                "WebSockets are upgraded from HTTP/1.1 here (RFC 8441's WebSockets over HTTP/2 are not sent), and event streams read over HTTP/1.1".to_owned(),
                ))
            }
            () if self.share.of > 1 => Some((
                "--workers",
                format!("{what} is sent by one process; leave out workers"),
            )),
            () if matches!(self.length, Length::Requests(_)) => Some((
                "-n/--requests",
                format!("{what} runs for a duration, not a number of messages"),
            )),
            () if matches!(self.warmup, Warmup::Requests(_)) => Some((
                "--warmup-requests",
                format!("{what}'s warm-up is a time (--warmup)"),
            )),
            () if !(MESSAGE_HEADER..=16 << 20).contains(&options.message_bytes) => Some((
                "message size",
                format!(
                    "{} bytes: from {MESSAGE_HEADER} (a sequence number and a due time) to 16 MiB",
                    options.message_bytes
                ),
            )),
            () => None,
        };
        match why {
            Some((field, reason)) => Err(LoadError::InvalidPlan {
                field: field.to_owned(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Checks every field, naming the one that is wrong and what would be valid.
    pub fn validate(&self) -> Result<(), LoadError> {
        let bad = |field: &str, reason: String| {
            Err(LoadError::InvalidPlan {
                field: field.to_owned(),
                reason,
            })
        };
        let covered = self
            .resolve
            .iter()
            .any(|r| r.applies_to(&self.target).is_some());
        if let (false, Some(unused)) = (covered, self.resolve.first()) {
            let t = &self.target;
            return bad(
                "--resolve",
                format!(
                    "{}:{}:{} does not cover the URL's {}:{} (host and port must both match); \
                     without it every connection would look {} up in DNS. Use --resolve {}:{}:{}",
                    unused.host,
                    unused.port,
                    unused.addr,
                    t.host,
                    t.port,
                    t.host,
                    t.host,
                    t.port,
                    unused.addr
                ),
            );
        }
        if let Mode::Open { rate_per_s } = self.mode {
            if !(rate_per_s.is_finite() && rate_per_s > 0.0) {
                return bad(
                    "-R/--rate",
                    format!("{rate_per_s} is not a positive number of requests per second"),
                );
            }
            // Whatever the connections, each request costs its thread CPU to release,
            // send and read: past this no schedule can be kept, only counted as not sent.
            let threads = self.threads.max(1) * self.share.of.max(1);
            let most = threads as f64 * MAX_RATE_PER_THREAD;
            if rate_per_s > most {
                return bad(
                    "-R/--rate",
                    format!(
                        "{rate_per_s} req/s is one request every {:.3} us; a worker thread spends \
                         more than {:.0} us of CPU on each request it sends (docs/PERFORMANCE.md \
                         measures 11-24 us here), so {threads} thread(s) can send at most \
                         {most:.0} req/s, whatever the connections. Lower -R, or add --threads \
                         or --workers (processes)",
                        1e6 / rate_per_s,
                        1e6 / MAX_RATE_PER_THREAD
                    ),
                );
            }
        }
        if self.connections == 0 || self.connections > 1_000_000 {
            return bad(
                "-c/--connections",
                format!("{} is not between 1 and 1000000", self.connections),
            );
        }
        if self.threads == 0 || self.threads > 1024 {
            return bad(
                "--threads",
                format!("{} is not between 1 and 1024", self.threads),
            );
        }
        let Share { index, of } = self.share;
        if of == 0 || of > 1024 {
            return bad("--workers", format!("{of} is not between 1 and 1024"));
        }
        if index >= of {
            return bad(
                "--workers",
                format!("worker {index} of {of} does not exist"),
            );
        }
        if of > 1 && matches!(self.mode, Mode::Sequential { .. }) {
            return bad(
                "--workers",
                "sequential load is one request at a time on one connection, which one process sends; leave out --workers".to_owned(),
            );
        }
        if of > 1 && self.gate.is_some() {
            return bad(
                "--workers",
                "requests in lock-step with events are sent by one process".to_owned(),
            );
        }
        if matches!(self.mode, Mode::Sequential { .. }) {
            if self.connections != 1 || self.threads != 1 {
                return bad(
                    "--sequential",
                    "sends one request at a time on one connection: leave out the connections and threads (-c, --threads)".to_owned(),
                );
            }
        } else if self.threads * of > self.connections {
            return bad(
                if of > 1 { "--workers" } else { "--threads" },
                format!(
                    "{} threads need at least as many connections (-c {})",
                    self.threads * of,
                    self.connections
                ),
            );
        }
        match self.length {
            Length::Requests(0) => return bad("-n/--requests", "must be at least 1".to_owned()),
            Length::Duration(d) if d.is_zero() => {
                return bad("-d/--duration", "must be longer than 0".to_owned())
            }
            _ => {}
        }
        if self.protocol == Protocol::Http3 && self.target.scheme != crate::Scheme::Https {
            return bad(
                "--http3",
                "HTTP/3 runs over QUIC, which is always TLS: give an https:// URL".to_owned(),
            );
        }
        if let Some(streams) = self.streams {
            if self.protocol == Protocol::Http1 {
                return bad(
                    "--streams",
                    "streams are HTTP/2's and HTTP/3's: add --http2 or --http3 (HTTP/1.1 sends one request at a time per connection)".to_owned(),
                );
            }
            if !(1..=MAX_STREAMS).contains(&streams) {
                return bad(
                    "--streams",
                    format!("{streams} is not between 1 and {MAX_STREAMS}"),
                );
            }
        }
        if self.max_requests_per_connection == Some(0) {
            return bad(
                "--max-requests-per-connection",
                "must be at least 1".to_owned(),
            );
        }
        if self.timeout.is_zero() {
            return bad("--timeout", "must be longer than 0".to_owned());
        }
        if self.timeout > MAX_TIMEOUT {
            return bad(
                "--timeout",
                format!(
                    "{:?} is longer than a day, the most a request may wait",
                    self.timeout
                ),
            );
        }
        if !(0.0..=1.0).contains(&self.sample_rate) {
            return bad(
                "--sample-rate",
                format!("{} is not between 0 and 1", self.sample_rate),
            );
        }
        if let BatchWindow::Fixed(window) = self.batch_window {
            if window > Duration::from_millis(100) {
                return bad("--batch-window", format!("{window:?} is longer than 100ms"));
            }
        }
        if self.gate.is_some() && !matches!(self.mode, Mode::Sequential { .. }) {
            return bad("gate", "runs only with sequential load".to_owned());
        }
        if self.window < Duration::from_millis(10) {
            return bad("window", "must be at least 10ms".to_owned());
        }
        if let Some(options) = self.kind.stream_options() {
            self.validate_stream(options)?;
        }
        let header_name = |name: &str| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !header_name(&self.backend_header) {
            return bad(
                "--backend-header",
                format!("`{}` is not a header name", self.backend_header),
            );
        }
        if let Some(name) = self.generation_headers.iter().find(|h| !header_name(h)) {
            return bad(
                "generation_headers",
                format!("`{name}` is not a header name"),
            );
        }
        if self.generation_headers.len() > ingressbench_stats::GENERATION_SLOTS {
            return bad(
                "generation_headers",
                format!(
                    "{} headers; at most {} are read",
                    self.generation_headers.len(),
                    ingressbench_stats::GENERATION_SLOTS
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shape_gets_one_set_of_defaults_and_keeps_what_was_said() {
        let target = || Target::parse("http://127.0.0.1:1/").unwrap();
        let open = Mode::Open { rate_per_s: 50.0 };
        let plan = Shape::new(open.clone()).plan(target());
        assert_eq!(plan.mode, open);
        assert_eq!((plan.connections, plan.threads), (DEFAULT_CONNECTIONS, 1));
        assert_eq!(plan.length, Length::Duration(Duration::from_secs(10)));
        assert_eq!(plan.warmup, Warmup::None);
        assert_eq!(plan.window, Duration::from_secs(1));
        // Sequential load takes one connection unless told otherwise, and a number it
        // cannot take is kept for the check to refuse by name.
        let sequential = Mode::Sequential {
            interval: Duration::ZERO,
        };
        assert_eq!(Shape::new(sequential.clone()).plan(target()).connections, 1);
        let five = Shape {
            connections: Some(5),
            ..Shape::new(sequential)
        }
        .plan(target());
        assert!(five
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--sequential"));
        // A duration wins over a request count; a zero warm-up is none, and a count is
        // used when no time is given.
        let said = Shape {
            connections: Some(3),
            threads: Some(2),
            duration: Some(Duration::from_secs(4)),
            requests: Some(100),
            warmup: Some(Duration::ZERO),
            warmup_requests: Some(7),
            ..Shape::new(Mode::Closed)
        }
        .plan(target());
        assert_eq!((said.connections, said.threads), (3, 2));
        assert_eq!(said.length, Length::Duration(Duration::from_secs(4)));
        assert_eq!(said.warmup, Warmup::Requests(7));
        let counted = Shape {
            requests: Some(100),
            ..Shape::new(Mode::Closed)
        }
        .plan(target());
        assert_eq!(counted.length, Length::Requests(100));
        // A capacity trial is judged on a twentieth of it, 100 ms to 1 s.
        for (trial, window) in [(1, 100), (4, 200), (20, 1000), (60, 1000)] {
            let plan = Shape {
                trial: Some(Duration::from_secs(trial)),
                ..Shape::new(Mode::Closed)
            }
            .plan(target());
            assert_eq!(plan.window, Duration::from_millis(window), "{trial} s");
        }
    }

    #[test]
    fn validation_names_the_field() {
        let target = Target::parse("http://127.0.0.1:1/").unwrap();
        let mut plan = Plan::new(target);
        assert!(plan.validate().is_ok());
        plan.mode = Mode::Open { rate_per_s: 0.0 };
        assert!(plan.validate().unwrap_err().to_string().contains("--rate"));
        // A rate past what the threads (of every worker process) could send.
        plan.mode = Mode::Open {
            rate_per_s: 1_500_000.0,
        };
        let err = plan.validate().unwrap_err().to_string();
        assert!(
            err.contains("1 thread(s) can send at most 1000000 req/s"),
            "{err}"
        );
        plan.threads = 2;
        assert!(plan.validate().is_ok());
        plan.threads = 1;
        plan.share = Share { index: 0, of: 2 };
        assert!(plan.validate().is_ok());
        plan.share = Share::WHOLE;
        plan.mode = Mode::Closed;
        plan.threads = 20;
        assert!(plan
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--threads"));
        plan.threads = 1;
        plan.sample_rate = 2.0;
        assert!(plan
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--sample-rate"));
    }
}
