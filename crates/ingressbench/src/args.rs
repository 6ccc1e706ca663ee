//! Command-line arguments (clap). Nothing here is seen by the libraries: `load_cmd` turns
//! these into a validated `Plan`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Latency and resilience benchmarks for L7 proxies, load balancers and ingress controllers.
#[derive(Debug, Parser)]
#[command(name = "ingressbench", version, about, propagate_version = true)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Send HTTP/1.1 load to one URL and measure latency honestly (open loop with -R).
    #[command(after_help = LOAD_EXAMPLES)]
    Load(Box<LoadArgs>),
    /// The highest open-loop rate one URL sustains within objectives (p99, errors):
    /// trials judged on their intervals, doubling then bisecting.
    #[command(after_help = CAPACITY_EXAMPLES)]
    Capacity(CapacityArgs),
    /// Run the echo backend the lab puts behind proxies (prints the address it listens on).
    Backend(BackendArgs),
    /// The lab: real proxies in front of echo backends on this machine.
    #[command(subcommand)]
    Lab(LabCommand),
    /// Scenario files.
    #[command(subcommand)]
    Scenario(ScenarioCommand),
    /// Run a scenario: every target, matrix cell and repeat, with its events, into a
    /// results directory.
    Run(RunArgs),
    /// Write DIR/report.html (self-contained) from a results directory or a `load --json`
    /// file, and print its headline.
    Report(ReportArgs),
    /// Compare two runs, or two targets of one run: each difference with its interval and
    /// a verdict; --fail-if makes it a gate.
    #[command(after_help = COMPARE_EXAMPLES)]
    Compare(CompareArgs),
    /// Kubernetes: check a cluster, clean up after runs, a local test cluster.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// A finished run in another tool's format.
    #[command(subcommand)]
    Export(ExportCommand),
    /// A load worker: reads its part of a run (one JSON line) on standard input and
    /// writes what it measures as JSON lines on standard output, for the process that
    /// started it (`--workers`, `load.workers`) to merge.
    #[command(hide = true)]
    Worker,
}

const CAPACITY_EXAMPLES: &str = "Examples:
  ingressbench capacity http://127.0.0.1:8080/ --slo 'p99 < 5ms' --slo 'errors < 0.1%' --from 1000
  ingressbench capacity http://127.0.0.1:8080/ --slo 'p99.9 <= 20ms' --from 500 --up-to 20000 --trial 20s --json capacity.json";

/// `ingressbench capacity`.
#[derive(Debug, clap::Args)]
pub(crate) struct CapacityArgs {
    /// The URL (http:// or https://).
    pub(crate) url: String,
    /// An objective every trial must keep, in compare --fail-if's grammar: 'p99 < 5ms',
    /// 'p99.9 <= 20ms', 'mean < 2ms', 'errors < 0.1%' (repeat for several).
    #[arg(long, value_name = "OBJECTIVE")]
    pub(crate) slo: Vec<String>,
    /// A rate known to pass, tried first (requests per second).
    #[arg(long, value_name = "R")]
    pub(crate) from: f64,
    /// The highest rate tried; if it passes the capacity is "at least" it.
    #[arg(long, value_name = "R", default_value_t = 100_000.0)]
    pub(crate) up_to: f64,
    /// Stop when the bracket between the highest pass and the lowest failure is this
    /// narrow.
    #[arg(long, value_name = "P%", default_value = "5%")]
    pub(crate) precision: String,
    /// Each trial's measured length.
    #[arg(long, value_name = "D", default_value = "20s", value_parser = parse_duration)]
    pub(crate) trial: std::time::Duration,
    /// Each trial's warm-up, not judged.
    #[arg(long, value_name = "D", default_value = "2s", value_parser = parse_duration)]
    pub(crate) warmup: std::time::Duration,
    /// Connections.
    #[arg(short = 'c', long, value_name = "N", default_value_t = 50)]
    pub(crate) connections: usize,
    /// Worker threads of the generator.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) threads: usize,
    /// How many times a trial whose interval straddles an objective is run again.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub(crate) repeats: u32,
    /// When --from fails, halve the rate until one passes, then bisect (instead of
    /// stopping at --from).
    #[arg(long)]
    pub(crate) down_from: bool,
    /// Write every trial and the outcome here as JSON.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum ClusterCommand {
    /// Check a cluster before a run: the API answers, every verb a run uses is allowed,
    /// each target's ingress class exists and its address answers.
    #[command(
        after_help = "Examples:\n  ingressbench cluster check local\n  ingressbench cluster check my-aks.yaml --context my-aks"
    )]
    Check(ClusterCheckArgs),
    /// Delete what runs of this tool left in a cluster (namespaces labelled as its own
    /// whose heartbeat is older than two minutes), and nothing else.
    Cleanup(ClusterCleanupArgs),
    /// A real Kubernetes control plane on this machine (etcd, kube-apiserver,
    /// kube-controller-manager, kube-scheduler as local processes).
    #[command(subcommand)]
    Local(LocalCommand),
}

#[derive(Debug, clap::Args)]
pub(crate) struct ClusterCheckArgs {
    /// The cluster file (which controller each target is, and where it is reached);
    /// `local` is the file of the local cluster `cluster local up` started.
    pub(crate) file: PathBuf,
    /// The kubeconfig (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: the cluster file's, else the current one).
    #[arg(long, value_name = "NAME")]
    pub(crate) context: Option<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ClusterCleanupArgs {
    /// The kubeconfig (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: the current one).
    #[arg(long, value_name = "NAME")]
    pub(crate) context: Option<String>,
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum LocalCommand {
    /// Start it in the background and print the kubeconfig to use.
    #[command(
        after_help = "Example:\n  ingressbench cluster local up && kubectl get nodes && ingressbench run scenarios/churn.yaml --quick --cluster local"
    )]
    Up(LocalUpArgs),
    /// Stop it and remove everything it made.
    Down(LocalArgs),
    /// Print the path of its kubeconfig.
    Kubeconfig(LocalArgs),
    /// (internal) Run the control plane in the foreground until SIGTERM.
    #[command(hide = true)]
    Serve(LocalUpArgs),
    /// (internal) Run a container's command inside its image's root filesystem as its
    /// user (the node agent starts it in the pod's network namespace).
    #[command(hide = true)]
    Enter(EnterArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct EnterArgs {
    /// The image's root filesystem.
    #[arg(long, value_name = "DIR")]
    pub(crate) root: PathBuf,
    /// The user and group, numeric.
    #[arg(long, value_name = "UID:GID")]
    pub(crate) user: String,
    /// The working directory inside the root filesystem.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub(crate) workdir: String,
    /// A supplementary group, numeric (repeated: a pod's fsGroup and supplementalGroups).
    #[arg(long, value_name = "GID")]
    pub(crate) groups: Vec<u32>,
    /// A directory or file bind-mounted at a path inside the root filesystem (repeated:
    /// a pod's volumes).
    #[arg(long, num_args = 2, value_names = ["SOURCE", "TARGET"])]
    pub(crate) bind: Vec<String>,
    /// The same, read-only.
    #[arg(long, num_args = 2, value_names = ["SOURCE", "TARGET"])]
    pub(crate) bind_ro: Vec<String>,
    /// (internal) Process 1 of the container's PID namespace, which the first `enter`
    /// started: mount, chroot and run the command.
    #[arg(long, hide = true)]
    pub(crate) inner: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub(crate) argv: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct LocalUpArgs {
    #[command(flatten)]
    pub(crate) local: LocalArgs,
    /// Where Traefik, the cluster's ingress controller, takes HTTP traffic on 127.0.0.1
    /// (0, the default, picks a free port; the cluster file `up` writes gives the ports
    /// taken).
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    pub(crate) http_port: u16,
    /// Where Traefik takes HTTPS traffic on 127.0.0.1 (0 picks a free port).
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    pub(crate) https_port: u16,
    /// Where Contour's Envoy takes HTTP traffic on 127.0.0.1 (0 picks a free port; above
    /// 8000: Contour listens on a Gateway listener's port + 8000).
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    pub(crate) contour_port: u16,
    /// Where HAProxy Ingress's haproxy takes HTTP traffic on 127.0.0.1 (0 picks a free
    /// port).
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    pub(crate) haproxy_ingress_port: u16,
    /// Where HAProxy Ingress's haproxy takes HTTPS traffic on 127.0.0.1 (0 picks a free
    /// port).
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    pub(crate) haproxy_ingress_https_port: u16,
    /// The OCI image layout the pods run from (`DIR` or `DIR:TAG`, tag `latest` by
    /// default), as `scripts/image.sh` writes it; default: ~/.cache/ingressbench/image
    /// when it is there.
    #[arg(long, value_name = "LAYOUT[:TAG]", conflicts_with = "no_image")]
    pub(crate) image: Option<String>,
    /// Run the pods from this binary, not from an image.
    #[arg(long)]
    pub(crate) no_image: bool,
    /// How many nodes the node agent registers (pods are spread over them by the real
    /// scheduler).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub(crate) nodes: u16,
    /// The Envoy Gateway release `up` installs (default: the newest built,
    /// `scripts/controllers.sh` builds 1.9.0 and 1.9.1): an older one, for an `upgrade`
    /// event to take it to the newer.
    #[arg(long, value_name = "VERSION")]
    pub(crate) envoy_gateway: Option<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct LocalArgs {
    /// Where the cluster lives (certificates, kubeconfig, etcd's data, logs).
    #[arg(long, value_name = "DIR", default_value_os_t = local_cluster_dir())]
    pub(crate) dir: PathBuf,
}

const COMPARE_EXAMPLES: &str = "Examples:
  ingressbench compare results/before results/after --fail-if 'p99 > +10%' --fail-if 'errors > 0'
  ingressbench compare results/run --targets nginx,envoy --metric p99 --json";

/// `ingressbench export`.
#[derive(Debug, Subcommand)]
pub(crate) enum ExportCommand {
    /// A results directory (or a `load --json` file with its interval log) as OpenMetrics
    /// text with timestamps, to backfill into Prometheus:
    /// `promtool tsdb create-blocks-from openmetrics FILE DATA_DIR`.
    #[command(after_help = EXPORT_EXAMPLES)]
    Prometheus(ExportArgs),
}

const EXPORT_EXAMPLES: &str = "Examples:
  ingressbench export prometheus results/run --out run.om
  promtool tsdb create-blocks-from openmetrics run.om /var/lib/prometheus/metrics2";

/// `ingressbench export prometheus`.
#[derive(Debug, clap::Args)]
pub(crate) struct ExportArgs {
    /// A results directory (from `ingressbench run`) or a `load --json` file.
    pub(crate) path: PathBuf,
    /// Write here (a new file, replacing one there) instead of to standard output.
    #[arg(long, value_name = "FILE")]
    pub(crate) out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ReportArgs {
    /// A results directory (from `ingressbench run`) or a `load --json` file.
    pub(crate) path: PathBuf,
    /// Open the report in a browser (xdg-open).
    #[arg(long)]
    pub(crate) open: bool,
    /// Also write each chart as a PNG (needs chromium).
    #[arg(long)]
    pub(crate) png: bool,
    /// Relative differences smaller than this are no measurable difference (e.g. 1%).
    #[arg(long, value_name = "PERCENT", default_value = "1%", value_parser = parse_percent)]
    pub(crate) noise_floor: f64,
    /// The target the others are judged against (default: the first at each setting).
    #[arg(long, value_name = "TARGET")]
    pub(crate) baseline: Option<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct CompareArgs {
    /// The baseline: a results directory or a `load --json` file.
    pub(crate) baseline: PathBuf,
    /// The run compared with it (omit it to compare two --targets of the baseline run).
    pub(crate) other: Option<PathBuf>,
    /// Two targets of one run: BASELINE,OTHER.
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub(crate) targets: Vec<String>,
    /// Show only these metrics (mean, p50, p99, p99.9, max, errors; repeatable).
    #[arg(long = "metric", value_name = "NAME")]
    pub(crate) metrics: Vec<String>,
    /// Exit 1 if this holds for any pair: 'p99 > +10%', 'errors > 0', 'p99 > 5ms'.
    #[arg(long = "fail-if", value_name = "EXPR")]
    pub(crate) fail_if: Vec<String>,
    /// Relative differences smaller than this are no measurable difference.
    #[arg(long, value_name = "PERCENT", default_value = "1%", value_parser = parse_percent)]
    pub(crate) noise_floor: f64,
    /// Print the comparison as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `2%` or `0.02` as a fraction.
fn parse_percent(s: &str) -> Result<f64, String> {
    let v = match s.trim().strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
        None => s.trim().parse::<f64>(),
    }
    .map_err(|_| format!("`{s}` is not a percentage (e.g. 1% or 0.01)"))?;
    if (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("`{s}` is not between 0% and 100%"))
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The scenario file (YAML).
    #[arg(required_unless_present = "resume")]
    pub(crate) file: Option<std::path::PathBuf>,
    /// Finish the cells of an interrupted or failed run in its results directory.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["file", "out", "sets", "quick"])]
    pub(crate) resume: Option<std::path::PathBuf>,
    /// The results directory [default: results/<UTC time>-<scenario name>]. One that
    /// already holds a run is refused unless --force.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<std::path::PathBuf>,
    /// Replace the run already in --out (its run.json and cells).
    #[arg(long, requires = "out")]
    pub(crate) force: bool,
    /// Serve live metrics for Prometheus at this address while the run goes (`GET
    /// /metrics`): every cell's requests by outcome and latency as they come, the cell in
    /// progress as labels, each event as it fires. After the run it waits up to 5 s for a
    /// last scrape.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
    /// Scale durations and intervals down so that the run takes about 90 seconds.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Override a field, e.g. --set load.rate=200 (repeatable).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub(crate) sets: Vec<String>,
    /// Soak: run each cell's load this long (1h) with its events repeating every
    /// load.duration (the same as --set soak.duration=DURATION; docs/SCENARIOS.md, "Soaks").
    #[arg(long, value_name = "DURATION", conflicts_with = "resume")]
    pub(crate) soak: Option<String>,
    #[command(flatten)]
    pub(crate) bins: ProxyBinArgs,
    /// Run each cell in a Kubernetes cluster: the cluster file says which controller each
    /// target is and where it is reached (docs/CLUSTER.md); `local` is the file of the
    /// local cluster `cluster local up` started.
    #[arg(long, value_name = "CLUSTER.yaml", conflicts_with = "resume")]
    pub(crate) cluster: Option<std::path::PathBuf>,
    /// With --cluster: the kubeconfig (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, value_name = "PATH", requires = "cluster")]
    pub(crate) kubeconfig: Option<std::path::PathBuf>,
    /// With --cluster: the kubeconfig context (default: the cluster file's, else the
    /// current one).
    #[arg(long, value_name = "NAME", requires = "cluster")]
    pub(crate) context: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ScenarioCommand {
    /// Check a scenario file and list the cells it expands to, in running order.
    Check {
        /// The scenario file (YAML).
        file: std::path::PathBuf,
        /// Override a field, e.g. --set load.rate=200 (repeatable).
        #[arg(long = "set", value_name = "PATH=VALUE")]
        sets: Vec<String>,
        /// The cells `run --quick` would run (the file's `quick` section applied).
        #[arg(long)]
        quick: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum LabCommand {
    /// Which proxies are installed, their versions and paths, and how to install the rest.
    Check(ProxyBinArgs),
    /// Bring up proxies in front of echo backends and keep them up until Ctrl-C.
    #[command(
        after_help = "Example:\n  ingressbench lab up --proxy nginx --proxy haproxy --backends 3"
    )]
    Up(LabUpArgs),
    /// (internal) Kill the process groups read from standard input when it closes.
    #[command(hide = true)]
    Reaper,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ProxyBinArgs {
    /// Use this binary for a proxy kind, e.g. envoy=/opt/envoy/bin/envoy (repeatable).
    #[arg(long = "proxy-bin", value_name = "KIND=PATH")]
    pub(crate) proxy_bins: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct LabUpArgs {
    /// A lab file (YAML; see examples/lab-all-proxies.yaml). Without it, --proxy says what
    /// to run.
    #[arg(value_name = "FILE", conflicts_with_all = ["proxies", "backends", "backend_args", "workers", "no_tls", "front", "upstream_http2"])]
    pub(crate) file: Option<std::path::PathBuf>,

    /// Proxy to run (repeatable): nginx, haproxy, envoy, traefik, caddy.
    #[arg(long = "proxy", value_name = "KIND", required_unless_present = "file")]
    pub(crate) proxies: Vec<String>,

    /// Echo backends in the pool behind the proxies.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub(crate) backends: usize,

    /// Extra option for every backend, e.g. --backend-arg=--latency=2ms (repeatable).
    #[arg(long = "backend-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub(crate) backend_args: Vec<String>,

    /// Worker processes or threads of every proxy.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) workers: u32,

    /// Plain HTTP only (no TLS listener).
    #[arg(long)]
    pub(crate) no_tls: bool,

    /// The proxies speak HTTP/2 to the backends (h2c; not nginx, which has no HTTP/2
    /// upstream for HTTP).
    #[arg(long)]
    pub(crate) upstream_http2: bool,
    /// An L4 load balancer (HAProxy, TCP mode) in front of N replicas of each proxy
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) front: Option<u16>,

    /// Keep the lab's directory (configs, logs, keys) after tear-down.
    #[arg(long)]
    pub(crate) keep: bool,

    #[command(flatten)]
    pub(crate) bins: ProxyBinArgs,
}

#[derive(Debug, clap::Args)]
pub(crate) struct BackendArgs {
    /// Address to listen on; port 0 picks a free one.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub(crate) listen: std::net::SocketAddr,

    /// Name sent back in the x-backend header.
    #[arg(long, default_value = "backend")]
    pub(crate) name: String,

    /// Body size of a normal answer (615 is nginx's welcome page).
    #[arg(long, value_name = "N", default_value_t = 615)]
    pub(crate) body_bytes: usize,

    /// Status of a normal answer.
    #[arg(long, value_name = "CODE", default_value_t = 200)]
    pub(crate) status: u16,

    /// Time before answering: 5ms, uniform:1ms-5ms, or lognormal:2ms,p99=20ms.
    #[arg(long, value_name = "SPEC", default_value = "0ms")]
    pub(crate) latency: String,

    /// Share of requests answered 500 instead (0 to 1).
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    pub(crate) error_rate: f64,

    /// Answer at most R requests a second, one after another (each takes 1/R s), the rest
    /// waiting their turn: a server whose capacity is known by construction.
    #[arg(long, value_name = "R")]
    pub(crate) serve_at_most: Option<f64>,

    /// Keep N bytes for every request answered and never free them: a server whose leak
    /// is known by construction (its resident memory grows N bytes a request), for
    /// testing what a run says grew.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) leak_per_request: usize,

    /// Stop answering periodically: the period (with --stall-for).
    #[arg(long, value_name = "D", requires = "stall_for", value_parser = parse_duration)]
    pub(crate) stall_every: Option<std::time::Duration>,

    /// How long each stall lasts.
    #[arg(long, value_name = "D", requires = "stall_every", value_parser = parse_duration)]
    pub(crate) stall_for: Option<std::time::Duration>,

    /// Serve a control endpoint here: `POST /stall?for=2s` makes the backend stop
    /// answering (health checks included) for that long, as cluster mode's
    /// `stall_backend` asks through the API server. A stall is obeyed only with the token
    /// in $INGRESSBENCH_CONTROL_TOKEN (header x-ingressbench-token), or, without one, on
    /// a loopback address.
    #[arg(long, value_name = "ADDR")]
    pub(crate) control: Option<std::net::SocketAddr>,

    /// On SIGTERM, how long in-flight requests may take before connections are dropped.
    #[arg(long, value_name = "D", default_value = "30s", value_parser = parse_duration)]
    pub(crate) drain_timeout: std::time::Duration,

    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub(crate) tls_cert: Option<std::path::PathBuf>,

    /// The private key of --tls-cert (PEM)
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub(crate) tls_key: Option<std::path::PathBuf>,

    /// Require client certificates issued by this CA (mutual TLS); needs --tls-cert
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub(crate) client_ca: Option<std::path::PathBuf>,

    /// Serve HTTP/3 too, on the UDP port of the same number as --listen's (QUIC is always
    /// TLS: needs --tls-cert)
    #[arg(long, requires = "tls_cert")]
    pub(crate) http3: bool,

    /// HTTP/3: how many request streams a client may have open at once on a connection
    /// (QUIC's MAX_STREAMS; 0 allows none, a hostile server for tests)
    #[arg(long, value_name = "N", requires = "http3", default_value_t = 100)]
    pub(crate) http3_max_streams: u32,

    /// HTTP/3: derive QUIC's stateless-reset tokens from this secret rather than a random
    /// one: a backend started again with the same secret ends the old process's
    /// connections with a stateless reset, where a new random one leaves them to the
    /// client's idle timeout
    #[arg(long, value_name = "SECRET", requires = "http3")]
    pub(crate) quic_reset_key: Option<String>,

    /// WebSockets, event streams and gRPC streams: leave every Nth message unanswered,
    /// skip every Nth event or stream message (a lossy server, for tests)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) ws_drop_every: Option<u64>,

    /// WebSockets, event streams and gRPC streams: answer every Nth message twice, send
    /// every Nth event or stream message twice (for tests)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) ws_duplicate_every: Option<u64>,

    /// WebSockets, event streams and gRPC streams: on SIGTERM keep echoing and sending
    /// until --drain-timeout drops them, instead of closing each WebSocket with 1001
    /// (going away), ending each event stream and each gRPC stream (UNAVAILABLE)
    #[arg(long)]
    pub(crate) ws_no_close_on_drain: bool,
}

const LOAD_EXAMPLES: &str = "Examples:
  ingressbench load -R 1000 -c 50 -d 30s http://127.0.0.1:8080/          # wrk2-style open loop
  ingressbench load -c 50 -d 10s http://127.0.0.1:8080/                  # wrk-style closed loop
  ingressbench load --sequential --interval 500ms -n 100 http://app.test/ # a curl loop
  ingressbench load -R 500 -d 1m --cacert ca.pem --resolve app.test:8443:127.0.0.1 \\
      --json out.json --hgrm out.hgrm --hlog out.hlog https://app.test:8443/";

#[derive(Debug, clap::Args)]
pub(crate) struct LoadArgs {
    /// The URL to load (http:// or https://).
    pub(crate) url: String,

    /// Open loop: constant rate in requests per second (fractions allowed). Latency is then
    /// measured from each request's intended send time. Without it, load is closed-loop.
    #[arg(short = 'R', long, value_name = "N")]
    pub(crate) rate: Option<f64>,

    /// Connections, in total over all threads [default: 10; 1 with --sequential].
    #[arg(short = 'c', long, value_name = "N")]
    pub(crate) connections: Option<usize>,

    /// One request at a time on one connection, each answered before the next.
    #[arg(long, conflicts_with = "rate")]
    pub(crate) sequential: bool,

    /// Pause after each answer (with --sequential), e.g. 500ms.
    #[arg(long, value_name = "D", requires = "sequential", value_parser = parse_duration)]
    pub(crate) interval: Option<std::time::Duration>,

    /// Number of measured requests (warm-up not included).
    #[arg(short = 'n', long, value_name = "N", conflicts_with = "duration")]
    pub(crate) requests: Option<u64>,

    /// Measured duration, e.g. 30s, 2m [default: 10s].
    #[arg(short = 'd', long, value_name = "D", value_parser = parse_duration)]
    pub(crate) duration: Option<std::time::Duration>,

    /// Run this long first and leave it out of the results.
    #[arg(long, value_name = "D", value_parser = parse_duration, conflicts_with = "warmup_requests")]
    pub(crate) warmup: Option<std::time::Duration>,

    /// Send this many requests first and leave them out of the results.
    #[arg(long, value_name = "N")]
    pub(crate) warmup_requests: Option<u64>,

    /// Open loop: wake at most once per D and send every request due by then. Requests
    /// further apart are sent on time; above 1/D req/s a shorter window sends closer to
    /// the schedule and costs more CPU per request. `auto` sends every request at its time
    /// while the generator's thread has CPU to spare, and widens the window (up to 1ms)
    /// only as far as it must.
    #[arg(long, value_name = "D|auto", default_value = "auto", value_parser = BatchWindow::parse)]
    pub(crate) batch_window: BatchWindow,

    /// Worker threads, each with its own connections.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) threads: usize,

    /// Send from N processes of this tool sharing one schedule (each with --threads
    /// threads and its share of -c), merged exactly; each one's health is checked.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) workers: usize,

    /// With --workers: write each worker's summary and health here (JSON).
    #[arg(long, value_name = "FILE", requires = "workers")]
    pub(crate) workers_json: Option<PathBuf>,

    /// Speak HTTP/2: ALPN `h2` over TLS, h2c with prior knowledge for http:// URLs. Each
    /// of the -c connections carries up to --streams requests at once.
    #[arg(long, conflicts_with = "http3")]
    pub(crate) http2: bool,

    /// Speak HTTP/3: QUIC over UDP (always TLS: an https:// URL, ALPN `h3`), to the URL's
    /// port. Each of the -c connections carries up to --streams requests at once; the
    /// handshake (transport and TLS in one) is the connect phase. Requests only: the
    /// WebSocket, event-stream and gRPC loads go over TCP.
    #[arg(long, conflicts_with = "long_lived")]
    pub(crate) http3: bool,

    /// HTTP/3: keep the server's session tickets and open each later connection as a
    /// resumed session that sends its first requests as 0-RTT data, as browsers do; the
    /// server may take or reject that data (`quic_0rtt_rejected`, sent again)
    #[arg(long, requires = "http3")]
    pub(crate) zero_rtt: bool,

    /// With --http2 or --http3: the most streams in flight on one connection (default:
    /// what the server allows, at most 100).
    #[arg(long, value_name = "N")]
    pub(crate) streams: Option<u32>,

    /// Send messages over WebSockets instead of requests: each of the -c connections is
    /// upgraded (ws:// over http://, wss:// over https://) and sends its share of -R
    /// messages a second, each timed from when it was due to its echo; a message counts
    /// as a request in the summary (101 when echoed; lost ones by how). Closes, reconnects
    /// and the messages' accounting are printed below it.
    #[arg(long, group = "long_lived", requires = "rate", conflicts_with_all = ["http2", "sequential", "requests", "body", "body_file", "no_keepalive", "warmup_requests", "threads", "workers"])]
    pub(crate) websocket: bool,

    /// Read server-sent events instead of sending requests: each of the -c connections
    /// holds a `text/event-stream` response open and the server (ingressbench's backend)
    /// sends its share of -R numbered events a second, each timed from when it was due to
    /// when it came; a cut stream resumes with `Last-Event-ID`. An event counts as a
    /// request in the summary (200 when it came; lost ones by how).
    #[arg(long, group = "long_lived", requires = "rate", conflicts_with_all = ["websocket", "http2", "sequential", "requests", "body", "body_file", "no_keepalive", "warmup_requests", "threads", "workers"])]
    pub(crate) sse: bool,

    /// Make gRPC unary calls instead of requests: each of the -c connections is one
    /// HTTP/2 connection (ALPN h2 over https://, h2c over http://) to ingressbench's echo
    /// service (proto/ingressbench/echo/v1/echo.proto) making its share of -R calls a
    /// second, as many at once as are outstanding, each timed from when it was due to its
    /// answer. A call counts as a request in the summary (grpc:ok, grpc:unavailable, or
    /// how HTTP/2 failed it); one a GOAWAY refused is sent again on a new connection, as
    /// gRPC's clients do.
    #[arg(long, group = "long_lived", requires = "rate", conflicts_with_all = ["websocket", "sse", "http2", "sequential", "requests", "body", "body_file", "no_keepalive", "warmup_requests", "threads", "workers"])]
    pub(crate) grpc: bool,

    /// Read gRPC server streams instead of sending requests: each of the -c connections
    /// holds one stream of the echo service open and the server sends its share of -R
    /// numbered messages a second, each timed from when it was due to when it came; an
    /// ended stream is asked again from the message after the last it saw.
    #[arg(long, group = "long_lived", requires = "rate", conflicts_with_all = ["websocket", "sse", "grpc", "http2", "sequential", "requests", "body", "body_file", "no_keepalive", "warmup_requests", "threads", "workers"])]
    pub(crate) grpc_stream: bool,

    /// With --websocket, --sse, --grpc or --grpc-stream: each message's (event's) size in
    /// bytes (at least 16).
    #[arg(
        long,
        value_name = "BYTES",
        default_value_t = 64,
        requires = "long_lived"
    )]
    pub(crate) message_size: usize,

    /// With --websocket, --sse, --grpc or --grpc-stream: what a cut WebSocket, event
    /// stream, gRPC connection or stream does: `none`,
    /// `immediate`, `backoff` (exponential from 100ms to 10s with full jitter, as
    /// browsers' libraries) or `backoff:FIRST-MAX`.
    #[arg(long, value_name = "POLICY", default_value = "backoff", requires = "long_lived", value_parser = ingressbench_load::stream::Reconnect::parse)]
    pub(crate) reconnect: ingressbench_load::stream::Reconnect,

    /// With --websocket, --sse, --grpc or --grpc-stream: write its closes, reconnects and
    /// message accounting here (JSON).
    #[arg(
        long,
        value_name = "FILE",
        alias = "websocket-json",
        requires = "long_lived"
    )]
    pub(crate) stream_json: Option<PathBuf>,

    /// Serve live metrics for Prometheus at this address while the load runs (`GET
    /// /metrics`, OpenMetrics when the scraper asks for it): requests by outcome, latency
    /// as a histogram, the rate, the load's settings. After the load it waits up to 5 s
    /// for a last scrape, so that the final figures are seen.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,

    /// Open a new connection (TCP, and TLS for https) for every request.
    #[arg(long)]
    pub(crate) no_keepalive: bool,

    /// Start the schedule at once instead of once every connection is open: requests
    /// due meanwhile wait for connections still opening (to measure a connect storm).
    #[arg(long)]
    pub(crate) no_connect_wait: bool,

    /// Close each connection after this many requests.
    #[arg(long, value_name = "N")]
    pub(crate) max_requests_per_connection: Option<u64>,

    /// When a reused connection fails before any byte of the answer (the server closed it
    /// as the request went out): `none` counts the failure (as wrk), `idempotent` sends
    /// GET/HEAD/PUT/DELETE/OPTIONS/TRACE once more on a new connection (as browsers and
    /// Go clients), `always` sends any method again. Retries are counted apart.
    #[arg(long, value_name = "POLICY", default_value = "idempotent", value_parser = ["none", "idempotent", "always"])]
    pub(crate) retry_policy: String,

    /// Request method.
    #[arg(
        short = 'X',
        long = "method",
        value_name = "METHOD",
        default_value = "GET"
    )]
    pub(crate) method: String,

    /// Request header `Name: value` (repeatable). `Host:` sets the routing host.
    #[arg(short = 'H', long = "header", value_name = "HEADER")]
    pub(crate) headers: Vec<String>,

    /// Request body.
    #[arg(long, value_name = "TEXT", conflicts_with = "body_file")]
    pub(crate) body: Option<String>,

    /// Request body from a file.
    #[arg(long, value_name = "FILE")]
    pub(crate) body_file: Option<PathBuf>,

    /// Limit for a whole request (connect, TLS, write, read).
    #[arg(long, value_name = "D", default_value = "10s", value_parser = parse_duration)]
    pub(crate) timeout: std::time::Duration,

    /// Trust the CA certificates in this PEM file (https).
    #[arg(long, value_name = "FILE")]
    pub(crate) cacert: Option<PathBuf>,

    /// Accept any server certificate (https).
    #[arg(short = 'k', long)]
    pub(crate) insecure: bool,

    /// TLS server name to send and verify instead of the URL's host.
    #[arg(long, value_name = "NAME")]
    pub(crate) sni: Option<String>,

    /// Connect to ADDR for HOST:PORT, as curl's --resolve (repeatable).
    #[arg(long, value_name = "HOST:PORT:ADDR")]
    pub(crate) resolve: Vec<String>,

    /// Response header naming the backend that answered; counted per value.
    #[arg(long, value_name = "NAME", default_value = "x-backend")]
    pub(crate) backend_header: String,

    /// Write the summary as JSON (schema: docs/schema/load-summary.schema.json).
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,

    /// Write the full percentile spectrum (HdrHistogram .hgrm text, milliseconds).
    #[arg(long, value_name = "FILE")]
    pub(crate) hgrm: Option<PathBuf>,

    /// Write per-second histograms as an HdrHistogram interval log (microseconds).
    #[arg(long, value_name = "FILE")]
    pub(crate) hlog: Option<PathBuf>,

    /// Write sampled requests as CSV (gzip-compressed if FILE ends in .gz).
    #[arg(long, value_name = "FILE")]
    pub(crate) samples: Option<PathBuf>,

    /// Share of requests written to --samples (0.1 keeps one in ten) [default: 1].
    #[arg(long, value_name = "F", requires = "samples")]
    pub(crate) sample_rate: Option<f64>,

    /// Also print the full percentile spectrum (as wrk2 --latency).
    #[arg(long)]
    pub(crate) latency: bool,

    /// No live progress line.
    #[arg(short = 'q', long)]
    pub(crate) quiet: bool,
}

use ingressbench_load::BatchWindow;

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    ingressbench_load::parse_duration(s)
}

/// Where the local cluster lives unless `--dir` says.
pub(crate) fn local_cluster_dir() -> PathBuf {
    std::env::temp_dir().join("ingressbench-cluster-local")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Args::command().debug_assert();
    }
}
