//! A cell's load: its plan from the scenario (times scaled for `--quick`, a tail kept
//! after the last event), and the thread that sends it, from this machine (one process or
//! several) or from the cluster's pods. Not the load engine itself ([`ingressbench_load`]).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_load::{
    parse_duration, parse_header, Mode, Plan, RequestSpec, Resolve, RetryPolicy, Shape,
    Target as Url, TlsOptions, Warmup,
};

use crate::model::{LoadModeFile, Timing};
use crate::site::Entry;
use crate::Cell;
use ingressbench_load::streams::Streams;
use ingressbench_results::workers::WorkersFile;
#[cfg(feature = "cluster")]
use ingressbench_results::workers::{Placement, WorkerNode};

pub(crate) fn scaled(d: Duration, factor: f64) -> Duration {
    d.mul_f64(factor)
}

/// Scaled down (`--quick`), the time after a cell's last timed event shrinks with the rest,
/// to 0.3 s in `churn.yaml`, and a change applied slowly (a reload) delays the events
/// behind it past the load's end, which fails the cell. So a scaled load runs at least
/// this long after its last timed event (or the whole unscaled tail, if shorter).
const QUICK_EVENT_TAIL: Duration = Duration::from_secs(1);

/// How long a cell's measured load of `duration` runs, scaled by `factor`.
fn measured_length(duration: Duration, cell: &Cell, factor: f64) -> Duration {
    let length = scaled(duration, factor).max(Duration::from_millis(200));
    if factor >= 1.0 {
        return length;
    }
    let last_event = cell
        .events
        .iter()
        .filter_map(|e| match e.timing {
            Timing::At(at) => Some(at),
            Timing::Every {
                first,
                every,
                times,
            } => Some(first + every * times.saturating_sub(1)),
            Timing::BeforeRequest { .. } => None,
        })
        .max();
    match last_event {
        Some(last) if last < duration => {
            let tail = (duration - last).min(QUICK_EVENT_TAIL);
            length.max(scaled(last, factor) + tail)
        }
        _ => length,
    }
}

pub(crate) fn dur(field: &str, v: &Option<String>) -> Result<Option<Duration>, String> {
    v.as_deref()
        .map(|s| parse_duration(s).map_err(|e| format!("{field}: {e}")))
        .transpose()
}

/// The load of a cell against `entry`, starting `delay` from now: the plan, when it
/// starts and when measurement starts (after the warm-up).
pub(crate) fn load_plan(
    cell: &Cell,
    entry: &Entry,
    (host, delay): (&str, Duration),
    factor: f64,
) -> Result<(Plan, Instant, Instant), String> {
    let host_header = entry.host_header.then_some(host);
    let mut plan = plan_for(cell, &entry.url, host_header, factor)?;
    if let Some((options, at)) = &entry.tls {
        plan.tls = TlsOptions {
            zero_rtt: cell.scenario.load.zero_rtt,
            ..options.clone()
        };
        if let Some(at) = at {
            plan.resolve = vec![Resolve::parse(&format!("{host}:{}:{}", at.port(), at.ip()))
                .map_err(|e| e.to_string())?];
        }
    }
    let warmup = match plan.warmup {
        Warmup::Duration(d) => d,
        _ => Duration::ZERO,
    };
    let start = Instant::now() + delay;
    plan.start = Some(start);
    plan.validate().map_err(|e| e.to_string())?;
    Ok((plan, start, start + warmup))
}

/// Who sends a cell's load.
pub(crate) enum Senders {
    /// This process.
    One,
    /// This many local processes of this program (this tool).
    Local(usize, PathBuf),
    /// This many pods of this Job.
    #[cfg(feature = "cluster")]
    Cluster(Box<ingressbench_cluster::workers::LoadJob>, usize),
}

/// The load on a thread of its own, in `netns` if the site has one for the client (the
/// local workers it starts inherit it). With more than one sender, their health comes
/// back as `workers.json`.
pub(crate) fn spawn_load(
    plan: Plan,
    senders: Senders,
    netns: Option<PathBuf>,
    stop: Arc<AtomicBool>,
    mut streams: Streams,
) -> Result<LoadThread, String> {
    std::thread::Builder::new()
        .name("ib-cell-load".into())
        .spawn(move || {
            let entered = netns.as_deref().map_or(Ok(()), |ns| {
                ingressbench_lab::topology::enter_netns(ns).map_err(|e| {
                    ingressbench_load::LoadError::InvalidPlan {
                        field: "topology".into(),
                        reason: format!(
                            "cannot enter the client's network namespace {}: {e}",
                            ns.display()
                        ),
                    }
                })
            });
            use ingressbench_load::fleet;
            let ran = entered.and_then(|()| {
                let with_workers = |fleet: fleet::FleetReport| {
                    let file = fleet::workers_file(&fleet);
                    (fleet.load, Some(file))
                };
                match senders {
                    Senders::One => {
                        ingressbench_load::run(&plan, stop, &mut streams).map(|r| (r, None))
                    }
                    Senders::Local(workers, binary) => {
                        fleet::run_local(&plan, workers, &binary, stop, &mut streams)
                            .map(with_workers)
                    }
                    #[cfg(feature = "cluster")]
                    Senders::Cluster(job, workers) => {
                        run_in_cluster(&plan, *job, workers, stop, &mut streams).map(
                            |(fleet, cluster)| {
                                let (load, mut file) = with_workers(fleet);
                                if let Some(file) = file.as_mut() {
                                    file.cluster = Some(cluster);
                                }
                                (load, file)
                            },
                        )
                    }
                }
            });
            match ran {
                Ok((report, workers)) => (Ok(report), workers, streams),
                Err(e) => (Err(e), None, streams),
            }
        })
        .map_err(|e| e.to_string())
}

/// Sends `plan` from `workers` pods of `job`, which starts them with the plan in their
/// environment (its CA's certificates in it: the pods do not share this machine's files),
/// and merges what their logs carry; the Job is deleted once they are done. Also says
/// where the pods ran beside the backends, as the API said when they started.
#[cfg(feature = "cluster")]
fn run_in_cluster(
    plan: &Plan,
    job: ingressbench_cluster::workers::LoadJob,
    workers: usize,
    stop: Arc<AtomicBool>,
    observer: &mut Streams,
) -> Result<(ingressbench_load::fleet::FleetReport, Placement), ingressbench_load::LoadError> {
    use ingressbench_load::fleet;
    let start = plan.start.unwrap_or_else(Instant::now);
    let wall = std::time::SystemTime::now() + start.saturating_duration_since(Instant::now());
    let mut wire = fleet::PlanWire::of(plan, 0, workers, wall);
    wire.embed_ca()?;
    let deadline = fleet::deadline(plan, start);
    // The cluster ends the Job if this process cannot: a minute past the coordinator's own
    // deadline (an hour for a run of a number of requests).
    let active_for = deadline.map_or(Duration::from_secs(3600), |d| {
        d.saturating_duration_since(Instant::now()) + Duration::from_secs(60)
    });
    let (sources, running) = job.start(&wire, active_for, &stop).map_err(|e| {
        ingressbench_load::LoadError::InvalidPlan {
            field: "load.from".into(),
            reason: e.to_string(),
        }
    })?;
    let placement = job_placement(&running);
    let report = fleet::coordinate(plan, sources, stop, deadline, observer);
    drop(running);
    report.map(|r| (r, placement))
}

/// Where a load Job's pods and the backends ran.
#[cfg(feature = "cluster")]
fn job_placement(running: &ingressbench_cluster::workers::RunningJob) -> Placement {
    Placement {
        job: ingressbench_cluster::workers::JOB_NAME.to_owned(),
        worker_nodes: (running.pods.iter())
            .map(|p| WorkerNode {
                index: p.index,
                pod: p.pod.clone(),
                node: p.node.clone(),
            })
            .collect(),
        backend_nodes: running.backend_nodes.clone(),
    }
}

pub(crate) type LoadThread = std::thread::JoinHandle<(
    Result<ingressbench_load::LoadReport, ingressbench_load::LoadError>,
    Option<WorkersFile>,
    Streams,
)>;

/// What a scenario's load sends, its settings checked.
pub(crate) fn kind_of(l: &crate::model::LoadFile) -> Result<ingressbench_load::Kind, String> {
    use crate::model::LoadKindFile;
    use ingressbench_load::stream::{Reconnect, StreamOptions};
    if l.kind == LoadKindFile::Http {
        return match l.stream {
            None => Ok(ingressbench_load::Kind::Http),
            Some(_) => Err(
                "load.stream: only a WebSocket, event stream or gRPC load has these settings; add `kind: websocket`, `sse`, `grpc` or `grpc_stream`, or drop them".into(),
            ),
        };
    }
    let settings = l.stream.clone().unwrap_or_default();
    let defaults = StreamOptions::default();
    let options = StreamOptions {
        message_bytes: settings.message_bytes.unwrap_or(defaults.message_bytes),
        reconnect: settings
            .reconnect
            .as_deref()
            .map(Reconnect::parse)
            .transpose()
            .map_err(|e| format!("load.stream.reconnect: {e}"))?
            .unwrap_or(defaults.reconnect),
    };
    Ok(match l.kind {
        LoadKindFile::Sse => ingressbench_load::Kind::Sse(options),
        LoadKindFile::Grpc => ingressbench_load::Kind::Grpc(options),
        LoadKindFile::GrpcStream => ingressbench_load::Kind::GrpcStream(options),
        LoadKindFile::Websocket | LoadKindFile::Http => ingressbench_load::Kind::WebSocket(options),
    })
}

/// The load plan of a cell against `url` (a `Host` header added if given), its times
/// scaled by `factor`; what depends on the running lab (TLS, `--resolve`, the start) is
/// added by the caller.
pub(crate) fn plan_for(
    cell: &Cell,
    url: &str,
    host_header: Option<&str>,
    factor: f64,
) -> Result<Plan, String> {
    let l = &cell.scenario.load;
    let mut headers = Vec::new();
    if let Some(host) = host_header {
        headers.push(("Host".to_owned(), host.to_owned()));
    }
    for (name, value) in &l.headers {
        headers.push(parse_header(&format!("{name}: {value}")).map_err(|e| e.to_string())?);
    }
    let mode = match l.mode {
        LoadModeFile::Open => Mode::Open {
            rate_per_s: l.rate.unwrap_or(1.0),
        },
        LoadModeFile::Closed => Mode::Closed,
        LoadModeFile::Sequential => Mode::Sequential {
            interval: scaled(
                dur("load.interval", &l.interval)?.unwrap_or_default(),
                factor,
            ),
        },
    };
    let shape = Shape {
        connections: l.connections,
        threads: l.threads,
        // Checked when the scenario was read: one of the two is given.
        duration: match crate::soak::Soak::of(cell, factor)? {
            Some(soak) => Some(soak.length()),
            None => dur("load.duration", &l.duration)?.map(|d| measured_length(d, cell, factor)),
        },
        requests: l.requests,
        warmup: dur("load.warmup", &l.warmup)?.map(|d| scaled(d, factor)),
        warmup_requests: l.warmup_requests,
        trial: match &cell.scenario.search {
            Some(search) => Some(crate::capacity::SearchPlan::of(search)?.trial),
            None => None,
        },
        ..Shape::new(mode)
    };
    let mut plan = shape.plan(Url::parse(url).map_err(|e| e.to_string())?);
    plan.request = RequestSpec {
        headers,
        ..RequestSpec::default()
    };
    plan.keepalive = l.keepalive;
    // Checked when the scenario was read.
    plan.protocol = l
        .protocol
        .as_deref()
        .and_then(ingressbench_load::Protocol::parse)
        .unwrap_or_default();
    plan.streams = l.streams;
    plan.kind = kind_of(l)?;
    plan.retry = l
        .retry
        .as_deref()
        .and_then(RetryPolicy::parse)
        .unwrap_or_default();
    plan.timeout = dur("load.timeout", &l.timeout)?.unwrap_or(Duration::from_secs(10));
    plan.sample_rate = l.sample_rate;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn cell(events: &str) -> Cell {
        let text = format!(
            "name: t\ntargets: [nginx]\nload: {{ mode: open, rate: 100, duration: 300s }}\n{events}"
        );
        crate::expand::expand(&text, Path::new("s.yaml"), &[], false)
            .unwrap()
            .remove(0)
    }

    #[test]
    fn a_scaled_load_keeps_a_tail_after_its_last_event() {
        let secs = |d: Duration| (d.as_secs_f64() * 1000.0).round() / 1000.0;
        let s = Duration::from_secs;
        // churn.yaml's shape: the last event 10 s before the end.
        let churn = cell(
            "events: [{ at: 30s, every: 60s, times: 3, scale: 4 }, { at: 290s, config: revert }]\n",
        );
        assert_eq!(secs(measured_length(s(300), &churn, 1.0)), 300.0);
        // 0.03: 9 s of load, the last event at 8.7 s; it gets 1 s after it, not 0.3 s.
        assert_eq!(secs(measured_length(s(300), &churn, 0.03)), 9.7);
        // The last of a repeated event counts (220 s: 6.6 + 1 is under 9 s).
        let repeated = cell("events: [{ at: 100s, every: 60s, times: 3, scale: 4 }]\n");
        assert_eq!(secs(measured_length(s(300), &repeated, 0.03)), 9.0);
        let late = cell("events: [{ at: 280s, every: 10s, times: 2, scale: 4 }]\n");
        assert_eq!(secs(measured_length(s(300), &late, 0.03)), 9.7);
        // A tail already shorter than that is kept as written.
        let at_end = cell("events: [{ at: 299.5s, reload: true }]\n");
        assert_eq!(secs(measured_length(s(300), &at_end, 0.03)), 9.485);
        // No timed event: scaled as before.
        assert_eq!(secs(measured_length(s(300), &cell(""), 0.03)), 9.0);
    }
}
