//! `ingressbench load`: one URL, one load pattern, the summary and the files asked for.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use ingressbench_load::live::Live;
use ingressbench_load::streams::{self, Streams};
use ingressbench_load::{
    parse_header, Length, LoadError, Mode, Plan, Progress, RequestSpec, Resolve, RetryPolicy,
    Shape, Target, TlsOptions,
};
use ingressbench_report::{hgrm, terminal};

use crate::args::LoadArgs;
use crate::UsageError;

/// Exit status after an interrupted run whose results were kept.
const EXIT_INTERRUPTED: u8 = 130;

/// How long `--metrics-listen` waits after the load (a run) for a last scrape.
pub(crate) const METRICS_LINGER: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) fn run(args: LoadArgs) -> Result<ExitCode> {
    let plan = plan_from(&args).map_err(|e| anyhow::Error::new(UsageError(e)))?;
    let mut whole = plan.clone();
    whole.share.of = args.workers;
    whole
        .validate()
        .map_err(|e| anyhow::Error::new(UsageError(e.into())))?;
    // Open every output first: a bad path should fail now, not after a long run.
    let json = args.json.as_deref().map(create).transpose()?;
    let hgrm_file = args.hgrm.as_deref().map(create).transpose()?;
    let (mut sink, progress) = streams(&args, &plan)?;
    let stop = crate::signals::stop_flag()?;
    let title = describe(&plan, args.workers);
    let live = args
        .metrics_listen
        .map(|addr| {
            let info = vec![
                ("target".to_owned(), plan.target.to_string()),
                ("load".to_owned(), title.clone()),
            ];
            Live::start(addr, info).map(std::sync::Arc::new)
        })
        .transpose()
        .map_err(|e| UsageError(e.into()))?;
    if let Some(live) = &live {
        if let Some(warning) = live.exposure_warning() {
            eprintln!("{warning}");
        }
        sink = sink.with_live(live.clone());
        eprintln!("metrics: http://{}/metrics", live.addr());
    }
    if progress {
        eprintln!("{title}");
    }
    let workers_json = args.workers_json.as_deref().map(create).transpose()?;
    let stream_json = args.stream_json.as_deref().map(create).transpose()?;
    let ran = if args.workers > 1 {
        let program = std::env::current_exe().context("finding the ingressbench binary")?;
        ingressbench_load::fleet::run_local(&plan, args.workers, &program, stop, &mut sink).map(
            |fleet| {
                let json = ingressbench_load::fleet::workers_file(&fleet);
                (fleet.load, Some(json))
            },
        )
    } else {
        ingressbench_load::run(&plan, stop, &mut sink).map(|report| (report, None))
    };
    let (report, workers) = match ran {
        Ok(ran) => ran,
        Err(
            e @ (LoadError::InvalidUrl { .. }
            | LoadError::InvalidHeader { .. }
            | LoadError::InvalidPlan { .. }
            | LoadError::Tls { .. }),
        ) => {
            return Err(UsageError(e.into()).into());
        }
        Err(e) => return Err(e.into()),
    };
    let summary = &report.summary;
    if progress {
        eprint!("\r\x1b[2K");
    }
    sink.finish(&summary.warnings)?;
    if let Some(live) = &live {
        live.finish(METRICS_LINGER);
    }
    if let Some((path, file)) = json {
        write_json(&path, file, summary)?;
    }
    if let (Some((path, file)), Some(workers)) = (workers_json, &workers) {
        write_json(&path, file, workers)?;
    }
    if let Some((path, file)) = hgrm_file {
        let mut out = BufWriter::new(file);
        hgrm::write(&mut out, report.recorder.latency())
            .and_then(|()| warning_comments(&mut out, &summary.warnings))
            .and_then(|()| out.flush())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let stream = report
        .stream
        .as_deref()
        .map(|w| {
            let value = serde_json::to_value(w)?;
            Ok::<_, serde_json::Error>((
                serde_json::from_value::<ingressbench_report::websocket::StreamFile>(
                    value.clone(),
                )?,
                value,
            ))
        })
        .transpose()
        .context("the WebSocket or event stream report")?;
    if let (Some((path, file)), Some((_, value))) = (stream_json, &stream) {
        write_json(&path, file, value)?;
    }
    let mut stdout = std::io::stdout().lock();
    write!(stdout, "{}", terminal::render(summary, &title))?;
    if let Some((file, _)) = &stream {
        write!(stdout, "{}", ingressbench_report::websocket::text(file))?;
    }
    if args.latency {
        writeln!(stdout, "\n  Detailed percentile spectrum (milliseconds):")?;
        hgrm::write(&mut stdout, report.recorder.latency())?;
    }
    stdout.flush()?;
    Ok(if summary.interrupted {
        ExitCode::from(EXIT_INTERRUPTED)
    } else if summary.requests.total > 0 && summary.requests.ok == 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn plan_from(args: &LoadArgs) -> Result<Plan> {
    let mut headers = Vec::new();
    for raw in &args.headers {
        headers.push(parse_header(raw)?);
    }
    let body = match (&args.body, &args.body_file) {
        (Some(text), _) => text.clone().into_bytes(),
        (None, Some(path)) => std::fs::read(path)
            .with_context(|| format!("--body-file {}: cannot read it", path.display()))?,
        (None, None) => Vec::new(),
    };
    let mode = match (args.rate, args.sequential) {
        (Some(rate_per_s), _) => Mode::Open { rate_per_s },
        (None, true) => Mode::Sequential {
            interval: args.interval.unwrap_or(Duration::ZERO),
        },
        (None, false) => Mode::Closed,
    };
    let shape = Shape {
        connections: args.connections,
        threads: Some(args.threads),
        duration: args.duration,
        requests: args.requests,
        warmup: args.warmup,
        warmup_requests: args.warmup_requests,
        ..Shape::new(mode)
    };
    let mut plan = shape.plan(Target::parse(&websocket_url(&args.url, args.websocket)?)?);
    plan.request = RequestSpec {
        method: args.method.clone(),
        headers,
        body,
    };
    plan.keepalive = !args.no_keepalive;
    let options = ingressbench_load::stream::StreamOptions {
        message_bytes: args.message_size,
        reconnect: args.reconnect,
    };
    if args.websocket {
        plan.kind = ingressbench_load::Kind::WebSocket(options);
    } else if args.sse {
        plan.kind = ingressbench_load::Kind::Sse(options);
    } else if args.grpc {
        plan.kind = ingressbench_load::Kind::Grpc(options);
    } else if args.grpc_stream {
        plan.kind = ingressbench_load::Kind::GrpcStream(options);
    }
    plan.wait_for_connections = !args.no_connect_wait;
    if args.http2 {
        plan.protocol = ingressbench_load::Protocol::Http2;
    }
    if args.http3 {
        plan.protocol = ingressbench_load::Protocol::Http3;
    }
    plan.streams = args.streams;
    plan.max_requests_per_connection = args.max_requests_per_connection;
    plan.retry = RetryPolicy::parse(&args.retry_policy).unwrap_or_default();
    plan.timeout = args.timeout;
    plan.tls = TlsOptions {
        cacert: args.cacert.clone(),
        insecure: args.insecure,
        sni: args.sni.clone(),
        cacert_pem: None,
        zero_rtt: args.zero_rtt,
    };
    plan.resolve = args
        .resolve
        .iter()
        .map(|r| Resolve::parse(r))
        .collect::<Result<_, _>>()?;
    plan.backend_header = args.backend_header.clone();
    plan.batch_window = args.batch_window;
    plan.sample_rate = match (&args.samples, args.sample_rate) {
        (Some(_), rate) => rate.unwrap_or(1.0),
        (None, _) => 0.0,
    };
    plan.validate()?;
    Ok(plan)
}

fn describe(plan: &Plan, workers: usize) -> String {
    let pacing = match &plan.mode {
        Mode::Open { rate_per_s } => format!("open loop at {rate_per_s} req/s"),
        Mode::Closed => "closed loop".to_owned(),
        Mode::Sequential { interval } => format!("sequential, {interval:?} between requests"),
    };
    let length = match plan.length {
        Length::Requests(n) => format!("{n} requests"),
        Length::Duration(d) => format!("{d:?}"),
    };
    if let Some(options) = plan.kind.stream_options() {
        let (what, items, streams) = match plan.kind {
            ingressbench_load::Kind::Sse(_) => ("Events", "events", "event stream(s)"),
            ingressbench_load::Kind::Grpc(_) => ("gRPC unary", "calls", "HTTP/2 connection(s)"),
            ingressbench_load::Kind::GrpcStream(_) => ("gRPC streams", "messages", "stream(s)"),
            _ => ("WebSocket", "messages", "WebSocket(s)"),
        };
        return format!(
            "{what} {} ({} {items}/s of {} bytes, {length}, {} {streams}, reconnect {})",
            plan.target,
            plan.rate_per_s().unwrap_or_default(),
            options.message_bytes,
            plan.connections,
            options.reconnect,
        );
    }
    format!(
        "{} {} ({pacing}, {length}, {} connection(s), {} thread(s){}, {})",
        plan.request.method,
        plan.target,
        plan.connections,
        plan.threads,
        if workers > 1 {
            format!(" in each of {workers} worker processes")
        } else {
            String::new()
        },
        match (plan.protocol, plan.keepalive) {
            (ingressbench_load::Protocol::Http1, true) => "keep-alive".to_owned(),
            (ingressbench_load::Protocol::Http1, false) => "new connection per request".to_owned(),
            (protocol, true) => format!(
                "{}, {} streams per connection",
                protocol_name(protocol),
                plan.streams.map_or_else(
                    || format!("up to {}", ingressbench_load::DEFAULT_STREAMS),
                    |n| n.to_string()
                )
            ),
            (protocol, false) => format!("{}, new connection per request", protocol_name(protocol)),
        }
    )
}

/// HTTP/2 or HTTP/3, as the run's description says it.
fn protocol_name(protocol: ingressbench_load::Protocol) -> &'static str {
    match protocol {
        ingressbench_load::Protocol::Http3 => "HTTP/3",
        _ => "HTTP/2",
    }
}

/// Appends warnings as `#` comment lines, which HdrHistogram tools skip.
fn warning_comments(out: &mut impl Write, warnings: &[String]) -> std::io::Result<()> {
    warnings
        .iter()
        .try_for_each(|w| writeln!(out, "#[WARNING: {w}]"))
}

/// Creates an output file; failing to is the user's input error (exit 2).
fn create(path: &Path) -> Result<(PathBuf, File)> {
    let file = streams::create(path).map_err(|e| UsageError(e.into()))?;
    Ok((path.to_owned(), file))
}

/// The streams of a `load` run, with the live progress line when stderr is a terminal.
fn streams(args: &LoadArgs, plan: &Plan) -> Result<(Streams, bool)> {
    let comment = format!(
        "ingressbench {} load {}\nvalues in microseconds",
        env!("CARGO_PKG_VERSION"),
        plan.target
    );
    let streams = Streams::new(args.hlog.as_deref(), args.samples.as_deref(), &comment)
        .map_err(|e| UsageError(e.into()))?;
    let progress = !args.quiet && std::io::stderr().is_terminal();
    if !progress {
        return Ok((streams, false));
    }
    let streams = streams.on_progress(|p: &Progress| {
        eprint!(
            "\r\x1b[2K[{:>6.1}s] {} requests  {:.0} req/s  p50 {}  p99 {}  errors {}",
            p.elapsed.as_secs_f64(),
            p.requests,
            p.rate_per_s,
            terminal::human_us(p.p50_us as f64),
            terminal::human_us(p.p99_us as f64),
            p.errors
        );
    });
    Ok((streams, true))
}

/// Writes `value` as indented JSON to `file` (at `path`, for the error).
fn write_json(path: &Path, file: File, value: &impl serde::Serialize) -> Result<()> {
    let mut out = BufWriter::new(file);
    serde_json::to_writer_pretty(&mut out, value)
        .map_err(std::io::Error::from)
        .and_then(|()| writeln!(out))
        .and_then(|()| out.flush())
        .with_context(|| format!("writing {}", path.display()))
}

/// `ingressbench worker`: one JSON plan line in, JSON lines out (see
/// `ingressbench_load::fleet`).
pub(crate) fn worker() -> Result<ExitCode> {
    use ingressbench_load::fleet::{PlanWire, INDEX_ENV, PLAN_ENV, POD_ENV};
    let line = match std::env::var(PLAN_ENV) {
        Ok(line) => line,
        Err(_) => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("reading the worker's plan on standard input")?;
            line
        }
    };
    let mut wire: PlanWire = serde_json::from_str(&line)
        .map_err(|e| UsageError(anyhow::anyhow!("the worker's plan is not understood: {e}")))?;
    if let Ok(index) = std::env::var(INDEX_ENV) {
        wire.index = index.trim().parse().map_err(|_| {
            UsageError(anyhow::anyhow!("{INDEX_ENV}={index} is not a worker index"))
        })?;
    }
    let stop = crate::signals::stop_flag()?;
    let host = std::env::var(POD_ENV).or_else(|_| {
        std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned())
    });
    let host = host.unwrap_or_default();
    let mut stdout = BufWriter::new(std::io::stdout().lock());
    Ok(
        match ingressbench_load::fleet::serve(&wire, host, stop, &mut stdout) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        },
    )
}

/// The URL as the load engine takes it: with `--websocket`, `ws://` and `wss://` (what
/// users type for a WebSocket) are `http://` and `https://` upgraded; without it they
/// are refused with the flag to add.
fn websocket_url(url: &str, websocket: bool) -> anyhow::Result<String> {
    let upgraded = [("ws://", "http://"), ("wss://", "https://")]
        .into_iter()
        .find_map(|(ws, http)| url.strip_prefix(ws).map(|rest| format!("{http}{rest}")));
    match upgraded {
        Some(http) if websocket => Ok(http),
        Some(_) => Err(UsageError(anyhow::anyhow!(
            "{url} is a WebSocket URL: add --websocket to send messages over it, or give http(s):// for requests"
        ))
        .into()),
        None => Ok(url.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_urls_are_taken_with_websocket_and_refused_without() {
        assert_eq!(
            websocket_url("ws://h:1/p?q", true).unwrap(),
            "http://h:1/p?q"
        );
        assert_eq!(websocket_url("wss://h/", true).unwrap(), "https://h/");
        assert_eq!(websocket_url("http://h/", true).unwrap(), "http://h/");
        let e = websocket_url("ws://h/", false).unwrap_err();
        assert!(format!("{e:#}").contains("add --websocket"), "{e:#}");
    }
}
