//! Live metrics while a load runs: a Prometheus endpoint (`--metrics-listen ADDR`) that
//! exposes what the load's one-second windows hold, in OpenMetrics text when the scraper
//! asks for it (Prometheus does) and in Prometheus's text format otherwise, encoded by
//! `prometheus-client` (the crate Prometheus's own maintainers keep for Rust).
//!
//! Nothing is added to the load's hot path: the recorder already aggregates each second
//! into a window, and the observer hands each closed window here (a lock taken once a
//! window and once a scrape). The latency histogram is the windows' HdrHistograms merged,
//! cut into fixed buckets at each scrape: 2^(1/4) apart from 10 us to 100 s, so that a
//! p99 read from them (`histogram_quantile`) is within 19% of the value at sub-millisecond
//! latencies. The text is encoded once per change (a window), however many scrape; the
//! endpoint's thread runs at the lowest priority and answers at most 100 scrapes a
//! second, so that scrapers cannot take the load's CPU. Labels are bounded: outcomes (status codes, failure kinds), event kinds, and
//! the run's own settings as one info metric; nothing per request.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ingressbench_stats::{HistogramUs, LagBuckets, OutcomeCounts, Window, LAG_BOUNDS_NS};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The most scrapes answered in a second: a flood of scrapers waits, and cannot take the
/// load's CPU (Prometheus scrapes once every few seconds).
const SCRAPES_PER_SECOND: u32 = 100;
/// The most connections held at once; a new one past it closes the oldest (a scraper
/// sends its request at once, so the oldest is the idlest): idle connections cannot
/// shut a scraper out.
const MAX_CONNECTIONS: usize = 256;
/// How long a scraper may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The most a request's head may hold.
const REQUEST_MAX_BYTES: usize = 16 * 1024;

/// What the endpoint shows, updated once a window.
#[derive(Debug, Default)]
struct State {
    outcomes: OutcomeCounts,
    latency: HistogramUs,
    /// Requests finished in the last window, per second.
    rate_per_s: f64,
    lag: LagBuckets,
    retries: u64,
    /// Requests in flight as the last window was handed over.
    in_flight: u64,
    /// The run's (or current cell's) settings.
    info: Vec<(String, String)>,
    events: BTreeMap<String, u64>,
    last_event_unix_s: Option<f64>,
    /// Windows taken so far.
    windows: u64,
    /// Changed at every change of the rest: a scrape of an unchanged state is answered
    /// with the text encoded for the last one.
    version: u64,
}

/// The live metrics of one run, served at an address while it runs.
pub struct Live {
    state: Arc<Mutex<State>>,
    addr: SocketAddr,
    /// Scrapes answered.
    scrapes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    server: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").field("addr", &self.addr).finish()
    }
}

/// The registry's view of the state, read at each scrape.
#[derive(Debug)]
struct Exposition(Arc<Mutex<State>>);

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut requests = encoder.encode_descriptor(
            "ingressbench_requests",
            "Requests finished after the warm-up, by outcome (an HTTP status, a gRPC status, or how it failed)",
            None,
            MetricType::Counter,
        )?;
        for (outcome, n) in state.outcomes.to_map() {
            let labels = [("outcome", outcome)];
            ConstCounter::new(n).encode(requests.encode_family(&labels)?)?;
        }
        let bounds = HistogramUs::prometheus_bounds_s();
        let (counts, sum) = state.latency.cut_s(&bounds);
        // Per bucket, not cumulative: prometheus-client adds them up as it writes.
        let buckets: Vec<(f64, u64)> = (bounds.iter().copied())
            .chain([f64::INFINITY])
            .zip(counts)
            .collect();
        let latency = encoder.encode_descriptor(
            "ingressbench_latency_seconds",
            "Latency of the answered requests after the warm-up, from when each was due (coordinated omission corrected)",
            None,
            MetricType::Histogram,
        )?;
        let mut latency = latency;
        latency.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            sum,
            state.latency.count(),
            &buckets,
            None,
        )?;
        // Per bucket, not cumulative: prometheus-client adds them up as it writes.
        let lag_buckets: Vec<(f64, u64)> = (state.lag.counts.iter().enumerate())
            .map(|(i, n)| {
                let bound = LAG_BOUNDS_NS
                    .get(i)
                    .map_or(f64::INFINITY, |ns| *ns as f64 / 1e9);
                (bound, *n)
            })
            .collect();
        let mut lag = encoder.encode_descriptor(
            "ingressbench_scheduler_lag_seconds",
            "How late the generator sent each request after its due time (its own lateness, not the server's)",
            None,
            MetricType::Histogram,
        )?;
        lag.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            state.lag.sum_ns as f64 / 1e9,
            state.lag.count(),
            &lag_buckets,
            None,
        )?;
        let retries = encoder.encode_descriptor(
            "ingressbench_retries",
            "Requests sent again on a fresh connection after their first one failed before an answer",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(state.retries).encode(retries)?;
        let in_flight = encoder.encode_descriptor(
            "ingressbench_requests_in_flight",
            "Requests sent and not yet answered, as the last window closed",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(state.in_flight as i64).encode(in_flight)?;
        let rate = encoder.encode_descriptor(
            "ingressbench_rate_per_second",
            "Requests finished in the last one-second window, per second",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(state.rate_per_s).encode(rate)?;
        let windows = encoder.encode_descriptor(
            "ingressbench_windows",
            "One-second windows of the load closed so far",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(state.windows).encode(windows)?;
        if !state.info.is_empty() {
            let mut info = encoder.encode_descriptor(
                "ingressbench_run",
                "The run's settings (the current cell's in a scenario)",
                None,
                MetricType::Info,
            )?;
            info.encode_info(&state.info)?;
        }
        let mut events = encoder.encode_descriptor(
            "ingressbench_events",
            "Events fired, by kind",
            None,
            MetricType::Counter,
        )?;
        for (kind, n) in &state.events {
            let labels = [("kind", kind.as_str())];
            ConstCounter::new(*n).encode(events.encode_family(&labels)?)?;
        }
        if let Some(at) = state.last_event_unix_s {
            let last = encoder.encode_descriptor(
                "ingressbench_last_event_timestamp_seconds",
                "When the last event fired (Unix time)",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(at).encode(last)?;
        }
        Ok(())
    }
}

impl Live {
    /// Serves the metrics at `addr` (port 0: a free one) until [`Live::finish`].
    pub fn start(addr: SocketAddr, info: Vec<(String, String)>) -> io::Result<Self> {
        let listener = std::net::TcpListener::bind(addr).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "--metrics-listen {addr}: {e} (give a free address, such as 127.0.0.1:9464)"
                ),
            )
        })?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            info: redacted(info),
            ..State::default()
        }));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Exposition(state.clone())));
        let (scrapes, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let server = {
            let (scrapes, stop) = (scrapes.clone(), stop.clone());
            std::thread::Builder::new().name("metrics".into()).spawn({
                let state = state.clone();
                move || serve(listener, Exposer::new(registry, state), scrapes, stop)
            })?
        };
        Ok(Self {
            state,
            addr,
            scrapes,
            stop,
            server: Some(server),
        })
    }

    /// Where it is served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A warning when it is served on every address of the machine (`0.0.0.0`, `[::]`):
    /// whatever reaches the machine reads the run's settings and figures.
    pub fn exposure_warning(&self) -> Option<String> {
        self.addr.ip().is_unspecified().then(|| {
            format!(
                "warning: --metrics-listen {} serves the metrics on every address of this machine; \
                 anyone who reaches it reads the run's settings and figures (give 127.0.0.1:PORT to keep \
                 them on this machine)",
                self.addr
            )
        })
    }

    /// Takes a closed window's requests.
    pub fn window(&self, window: &Window) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.outcomes.merge(&window.outcomes);
        state.latency.merge(&window.latency);
        state.lag.merge(&window.lag);
        state.retries += window.retries;
        state.in_flight = window.in_flight;
        state.rate_per_s = window.outcomes.total() as f64 * 1e9 / window.width_ns.max(1) as f64;
        state.windows += 1;
        state.version += 1;
    }

    /// An event of `kind` fired now.
    pub fn event(&self, kind: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *state.events.entry(kind.to_owned()).or_default() += 1;
        state.version += 1;
        state.last_event_unix_s = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs_f64());
    }

    /// The settings the info metric shows from now on (a scenario's next cell).
    pub fn settings(&self, info: Vec<(String, String)>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.info = redacted(info);
        state.version += 1;
    }

    /// Stops serving once a scrape has read the final figures, or after `linger` (a
    /// scraper that comes once a `linger` sees them; none is waited for longer).
    pub fn finish(&self, linger: Duration) {
        let seen = self.scrapes.load(Ordering::Relaxed);
        let started = Instant::now();
        while self.scrapes.load(Ordering::Relaxed) == seen && started.elapsed() < linger {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Scrapes answered so far.
    pub fn scrapes(&self) -> u64 {
        self.scrapes.load(Ordering::Relaxed)
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// The settings as shown: a URL's user name, password, query and fragment (tokens often
/// ride there) are left out; whatever reads the endpoint needs none of them.
fn redacted(info: Vec<(String, String)>) -> Vec<(String, String)> {
    info.into_iter().map(|(k, v)| (k, redact_url(&v))).collect()
}

/// `https://user:secret@host/path?token=x#f` as `https://host/path`; anything that is
/// not a URL as it is.
pub fn redact_url(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_owned();
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    format!("{scheme}://{host}{path}")
}

/// Prometheus's text format (0.0.4) from the OpenMetrics text prometheus-client writes:
/// a counter's HELP and TYPE name its samples' `_total`, an info metric is a gauge named
/// `_info`, and the lines only OpenMetrics has (`# UNIT`, `# EOF`) go. What passes
/// `promtool check metrics`.
fn prometheus_text(openmetrics: &str) -> String {
    let types: BTreeMap<&str, &str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    let renamed = |name: &str| -> String {
        match types.get(name) {
            Some(&"counter") => format!("{name}_total"),
            Some(&"info") => format!("{name}_info"),
            _ => name.to_owned(),
        }
    };
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        if let Some((name, help)) = line.strip_prefix("# HELP ").and_then(|l| l.split_once(' ')) {
            out += &format!("# HELP {} {help}\n", renamed(name));
        } else if let Some((name, kind)) =
            line.strip_prefix("# TYPE ").and_then(|l| l.split_once(' '))
        {
            let kind = if kind == "info" { "gauge" } else { kind };
            out += &format!("# TYPE {} {kind}\n", renamed(name));
        } else {
            out += line;
            out.push('\n');
        }
    }
    out
}

/// The registry's text in both formats, encoded again only when what it shows changed
/// (once a window): scrapers that come more often than that share one encoding.
struct Exposer {
    registry: Registry,
    state: Arc<Mutex<State>>,
    last: std::cell::RefCell<Option<Encoded>>,
}

/// One encoding of the state: its version, its OpenMetrics text and Prometheus's text.
#[derive(Clone)]
struct Encoded {
    version: u64,
    openmetrics: std::rc::Rc<str>,
    prometheus: std::rc::Rc<str>,
}

impl Exposer {
    fn new(registry: Registry, state: Arc<Mutex<State>>) -> Self {
        Self {
            registry,
            state,
            last: std::cell::RefCell::new(None),
        }
    }

    /// The state now, in both formats.
    fn text(&self) -> Result<Encoded, std::fmt::Error> {
        let version = self.state.lock().unwrap_or_else(|e| e.into_inner()).version;
        if let Some(last) = self.last.borrow().as_ref().filter(|l| l.version == version) {
            return Ok(last.clone());
        }
        let mut body = String::new();
        prometheus_client::encoding::text::encode(&mut body, &self.registry)?;
        let encoded = Encoded {
            version,
            prometheus: prometheus_text(&body).into(),
            openmetrics: body.into(),
        };
        *self.last.borrow_mut() = Some(encoded.clone());
        Ok(encoded)
    }
}

/// Answers scrapes on `listener` until `stop`: each connection on its own task, at most
/// [`MAX_CONNECTIONS`] held at once (the oldest closed for a new one), each request read
/// within [`REQUEST_TIMEOUT`]; counts the scrapes answered in `scrapes`.
fn serve(
    listener: std::net::TcpListener,
    exposer: Exposer,
    scrapes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) {
    // The load's threads first: at the lowest priority, this thread takes only what they
    // leave (Linux's nice value is a thread's own; 0 is the calling thread).
    let _ = rustix::process::setpriority_process(None, 19);
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let exposer = std::rc::Rc::new(exposer);
    // At most SCRAPES_PER_SECOND answered a second; more wait to be accepted.
    let mut second = (Instant::now(), 0u32);
    let tasks = tokio::task::LocalSet::new();
    tasks.block_on(&runtime, async {
        let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
            return;
        };
        // The connections held, oldest first, by number.
        let held: std::rc::Rc<
            std::cell::RefCell<std::collections::VecDeque<(u64, tokio::task::AbortHandle)>>,
        > = std::rc::Rc::default();
        let mut numbered = 0u64;
        while !stop.load(Ordering::Relaxed) {
            // Woken at least every 50 ms to see `stop`.
            let accepted = tokio::time::timeout(Duration::from_millis(50), listener.accept()).await;
            let Ok(Ok((stream, _))) = accepted else {
                continue;
            };
            if second.0.elapsed() >= Duration::from_secs(1) {
                second = (Instant::now(), 0);
            }
            second.1 += 1;
            if second.1 > SCRAPES_PER_SECOND {
                tokio::time::sleep_until((second.0 + Duration::from_secs(1)).into()).await;
                second = (Instant::now(), 1);
            }
            if held.borrow().len() >= MAX_CONNECTIONS {
                if let Some((_, oldest)) = held.borrow_mut().pop_front() {
                    oldest.abort();
                }
            }
            numbered += 1;
            let number = numbered;
            let (exposer, scrapes, mine) = (exposer.clone(), scrapes.clone(), held.clone());
            let task = tokio::task::spawn_local(async move {
                if answer(stream, &exposer).await {
                    scrapes.fetch_add(1, Ordering::Relaxed);
                }
                mine.borrow_mut().retain(|(n, _)| *n != number);
            });
            held.borrow_mut().push_back((number, task.abort_handle()));
        }
    });
}

/// Reads one request and answers it: the metrics at `GET /metrics` (and `/`), 404
/// elsewhere, 405 for other methods. Returns whether metrics were sent.
async fn answer(mut stream: tokio::net::TcpStream, exposer: &Exposer) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::with_capacity(1024);
    let read = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut chunk = [0u8; 2048];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut chunk).await?;
            if n == 0 || head.len() + n > REQUEST_MAX_BYTES {
                return Err(io::Error::other("no whole request"));
            }
            head.extend_from_slice(&chunk[..n]);
        }
        Ok(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return false;
    }
    let head = String::from_utf8_lossy(&head);
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (method, path) = (
        first.next().unwrap_or_default(),
        first.next().unwrap_or_default(),
    );
    let openmetrics = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.eq_ignore_ascii_case("accept") && v.contains("application/openmetrics-text")
        })
    });
    let path = path.split('?').next().unwrap_or_default();
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics" | "/") => match exposer.text() {
            Err(_) => (
                "500 Internal Server Error",
                "text/plain",
                "encoding failed\n".to_owned(),
            ),
            Ok(text) if openmetrics => (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                text.openmetrics.to_string(),
            ),
            Ok(text) => (
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                text.prometheus.to_string(),
            ),
        },
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "the metrics are at /metrics\n".into(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n".into(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await.is_ok() && status.starts_with("200")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingressbench_stats::Outcome;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut all = String::new();
        s.read_to_string(&mut all).unwrap();
        all
    }

    #[test]
    fn the_text_format_names_counters_and_info_as_prometheus_reads_them() {
        let om = "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total{x=\"1\"} 3\n\
                  # HELP a_run The run.\n# TYPE a_run info\na_run_info{t=\"u\"} 1\n\
                  # HELP a_lat Latency.\n# TYPE a_lat histogram\n# UNIT a_lat seconds\na_lat_count 1\n# EOF\n";
        let text = prometheus_text(om);
        for line in [
            "# HELP a_requests_total Requests.",
            "# TYPE a_requests_total counter",
            "# TYPE a_run_info gauge",
            "# HELP a_run_info The run.",
            "# TYPE a_lat histogram",
            "a_lat_count 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}: {text}");
        }
        assert!(
            !text.contains("# UNIT") && !text.contains("# EOF"),
            "{text}"
        );
    }

    #[test]
    fn credentials_and_queries_never_reach_the_endpoint() {
        assert_eq!(
            redact_url("https://user:secret@example.test:8443/a/b?token=x#frag"),
            "https://example.test:8443/a/b"
        );
        assert_eq!(redact_url("http://h?token=1"), "http://h");
        assert_eq!(redact_url("nginx"), "nginx");
        let live = Live::start(
            "127.0.0.1:0".parse().unwrap(),
            vec![("target".into(), "http://127.0.0.1:1/p?token=sekrit".into())],
        )
        .unwrap();
        assert!(live.exposure_warning().is_none());
        live.settings(vec![(
            "target".into(),
            "http://u:pw@127.0.0.1:1/q?token=sekrit".into(),
        )]);
        let text = get(live.addr(), "GET /metrics HTTP/1.1\r\n\r\n");
        assert!(!text.contains("sekrit") && !text.contains("pw@"), "{text}");
        assert!(text.contains("target=\"http://127.0.0.1:1/q\""), "{text}");
    }

    #[test]
    fn idle_connections_cannot_shut_a_scraper_out() {
        let live = Live::start("127.0.0.1:0".parse().unwrap(), Vec::new()).unwrap();
        // Twice the connections held at once, each sending nothing.
        let idle: Vec<_> = (0..2 * MAX_CONNECTIONS)
            .map(|_| std::net::TcpStream::connect(live.addr()).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut s = std::net::TcpStream::connect(live.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut all = String::new();
        s.read_to_string(&mut all).unwrap();
        assert!(all.starts_with("HTTP/1.1 200"), "{all}");
        drop(idle);
    }

    #[test]
    fn the_endpoint_shows_the_windows_in_either_format_and_counts_its_scrapes() {
        let live = Live::start(
            "127.0.0.1:0".parse().unwrap(),
            vec![("target".into(), "http://x/".into())],
        )
        .unwrap();
        let mut window = Window::new(0, 1_000_000_000);
        for us in [100, 200, 5_000] {
            window.outcomes.add(Outcome::Status(200));
            window.latency.record_us(us);
        }
        window.outcomes.add(Outcome::Status(502));
        window.lag.record_ns(30_000);
        window.lag.record_ns(2_000_000_000);
        window.retries = 1;
        window.in_flight = 7;
        live.window(&window);
        live.event("scale");
        let plain = get(live.addr(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            plain.contains("Content-Type: text/plain; version=0.0.4"),
            "{plain}"
        );
        assert!(!plain.contains("# EOF"), "{plain}");
        for line in [
            "ingressbench_requests_total{outcome=\"200\"} 3",
            "ingressbench_requests_total{outcome=\"502\"} 1",
            "ingressbench_latency_seconds_count 3",
            "ingressbench_rate_per_second 4",
            "ingressbench_events_total{kind=\"scale\"} 1",
            "ingressbench_run_info{target=\"http://x/\"} 1",
            "ingressbench_scheduler_lag_seconds_count 2",
            "ingressbench_scheduler_lag_seconds_bucket{le=\"0.05\"} 1",
            "ingressbench_scheduler_lag_seconds_bucket{le=\"1.0\"} 1",
            "ingressbench_scheduler_lag_seconds_bucket{le=\"2.5\"} 2",
            "ingressbench_retries_total 1",
            "ingressbench_requests_in_flight 7",
        ] {
            assert!(plain.contains(line), "{line}: {plain}");
        }
        // Cumulative buckets: the first bound at or over 200 us holds 100 and 200 us, the
        // one before it 100 us only, +Inf all three.
        let buckets: Vec<(f64, u64)> = plain
            .lines()
            .filter_map(|l| l.strip_prefix("ingressbench_latency_seconds_bucket{le=\""))
            .filter_map(|l| {
                let (le, n) = l.split_once("\"} ")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, n.parse().ok()?))
            })
            .collect();
        assert_eq!(
            buckets.len(),
            HistogramUs::prometheus_bounds_s().len() + 1,
            "{plain}"
        );
        let at = buckets.iter().position(|(le, _)| *le >= 200e-6).unwrap();
        assert_eq!((buckets[at - 1].1, buckets[at].1), (1, 2), "{plain}");
        assert_eq!(buckets.last().unwrap().1, 3, "{plain}");
        let open = get(
            live.addr(),
            "GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n",
        );
        assert!(
            open.contains("application/openmetrics-text; version=1.0.0"),
            "{open}"
        );
        assert!(open.trim_end().ends_with("# EOF"), "{open}");
        assert!(get(live.addr(), "GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(live.addr(), "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert_eq!(live.scrapes(), 2);
        // A scrape after the end is waited for, and then the endpoint goes.
        let addr = live.addr();
        let scraper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            get(addr, "GET /metrics HTTP/1.1\r\n\r\n")
        });
        live.finish(Duration::from_secs(30));
        assert!(scraper
            .join()
            .unwrap()
            .contains("ingressbench_windows_total 1"));
        drop(live);
        assert!(std::net::TcpStream::connect(addr).is_err());
    }
}
