//! One cell, in the four steps `run_cell` names: bring its site up (a lab, kept between
//! cells that differ only in their load; or the cluster), plan and start its load
//! ([`crate::load`]), drive its timeline beside the load ([`crate::timeline`]), and collect
//! what it measured (summary.json, latency.hgrm, impact.json). Not the run loop
//! ([`crate::runner`]) nor what a site does ([`crate::site`], [`crate::cluster_site`]).

use std::fs::OpenOptions;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_lab::Lab;
use serde_json::Value;

#[cfg(feature = "cluster")]
use crate::cluster_site::{ClusterSite, Shape};
use crate::impact::write_impact;
use crate::load::{load_plan, spawn_load, LoadThread, Senders};
use crate::lock::{is_full, ResultsLock};
use crate::model::{LoadFrom, Target};
use crate::options::RunOptions;
use crate::propagation::RouteProbe;
use crate::record::write_json;
use crate::site::{lab_file, CellFailure, LabSite, Site, Upstream};
use crate::timeline::{unfired, Driver, EventsLog, Gate, Liveness, SideFigures, Timeline};
use crate::usage::UsageLog;
use crate::Cell;
use ingressbench_load::streams::{ProgressFn, Streams};
use ingressbench_report::websocket::{Cuts, StreamFile};
use ingressbench_results::routes::RoutesFile;
use ingressbench_results::site::{Kernel, LinkOverhead, Topology, Usage};
use ingressbench_results::summary::LineSummary;

/// How long the lab and load get before the first request is due.
const START_DELAY: Duration = Duration::from_millis(300);
/// How long before its start a load from the cluster's pods is set going (`load.start_margin`
/// changes it): the time the cluster has to schedule and start them.
#[cfg(feature = "cluster")]
const CLUSTER_START_MARGIN: Duration = Duration::from_secs(5);

/// What a cell returns to the run loop: its record in run.json and a line to print.
pub(crate) struct CellDone {
    pub(crate) summary: LineSummary,
    pub(crate) link_overhead_us: Option<LinkOverhead>,
    /// The kernel each proxy ran with, and its listen queues' drops in the cell.
    pub(crate) kernel: Option<Kernel>,
    pub(crate) topology: Option<Topology>,
    /// How a cluster cell's routes were made.
    pub(crate) routes: Option<Value>,
    /// What the lab's processes spent (see `usage.rs`).
    pub(crate) usage: Option<Usage>,
    /// A soak's verdict.
    pub(crate) soak: Option<ingressbench_results::soak::SoakRecord>,
    pub(crate) lab_reused: bool,
    pub(crate) measure_from_s: f64,
    pub(crate) proxy_version: Option<String>,
    /// Where the load went: the URL, and the address its name was sent to.
    pub(crate) entry: Value,
    pub(crate) interrupted: bool,
    /// Why the cell stopped before its end other than Ctrl-C (the disk filled).
    pub(crate) cut_short: Option<String>,
    pub(crate) line: String,
}

/// Runs one cell into `dir`: bring its site up, start its load, drive its timeline beside
/// the load, collect what it measured. A site without events is kept in `sites` for the
/// next cell that needs the same.
pub(crate) fn run_cell(
    cell: &Cell,
    dir: &Path,
    options: &RunOptions,
    factor: f64,
    live: Option<ProgressFn>,
    sites: &mut SiteCache,
    lock: &ResultsLock,
) -> Result<CellDone, CellFailure> {
    let SiteUp {
        mut site,
        key,
        reused,
    } = bring_up(cell, options, sites)?;
    let mut load = start_load(cell, dir, site.as_mut(), options, factor, live)?;
    let beside = drive(cell, dir, site.as_mut(), &mut load, options)?;
    let done = collect(cell, dir, site.as_mut(), (load, beside, reused), lock)?;
    // Only cells without events share sites, so a kept site is as it started.
    if let (Some(key), true) = (key, cell.events.is_empty()) {
        sites.put(key, site);
    }
    Ok(done)
}

/// A cell's load on its way, and what the rest of the cell needs of it.
struct Started {
    thread: LoadThread,
    timeline: Timeline,
    gate: Option<Gate>,
    /// Set to stop the load (Ctrl-C, a dead part, a full disk).
    stop: Arc<AtomicBool>,
    /// When the load starts (warm-up included), and when measurement does.
    start: Instant,
    measure_from: Instant,
    proxy_version: Option<String>,
    entry: Value,
    /// Probes the routes that events add or remove.
    probe: Option<RouteProbe>,
    /// Moves the load's QUIC connections (a `migrate` event).
    migrate: ingressbench_load::Migrate,
    /// A soak's samples' filter, request count and log.
    soak: Option<crate::soak::SoakRun>,
}

/// Plans the cell's load against its site and sets it going, from this machine (one
/// process, or `workers` of them) or from the cluster's pods (given time to start), its
/// windows and samples streamed into `dir`.
fn start_load(
    cell: &Cell,
    dir: &Path,
    site: &mut dyn Site,
    options: &RunOptions,
    factor: f64,
    live: Option<ProgressFn>,
) -> Result<Started, CellFailure> {
    let l = &cell.scenario.load;
    let host = l
        .host
        .clone()
        .unwrap_or_else(|| ingressbench_lab::certs::DEFAULT_TLS_NAME.to_owned());
    let workers = l.workers.unwrap_or(1);
    let (entry, senders, delay) = match l.from {
        LoadFrom::Here => (
            site.entry(cell.scenario.tls, &host, &l.path)?,
            match workers {
                1 => Senders::One,
                _ => Senders::Local(workers, options.backend_binary.clone()),
            },
            START_DELAY,
        ),
        #[cfg(feature = "cluster")]
        LoadFrom::Cluster => {
            let request = (cell.scenario.tls, host.as_str(), l.path.as_str());
            let (entry, job) = site.cluster_load(request, workers, l.placement.as_ref())?;
            let margin = crate::load::dur("load.start_margin", &l.start_margin)?;
            (
                entry,
                Senders::Cluster(Box::new(job), workers),
                margin.unwrap_or(CLUSTER_START_MARGIN),
            )
        }
        #[cfg(not(feature = "cluster"))]
        LoadFrom::Cluster => {
            return Err(CellFailure::input("load.from: cluster needs cluster mode, which this build leaves out (build with: cargo build --release -p ingressbench)"))
        }
    };
    let (mut plan, start, measure_from) = load_plan(cell, &entry, (&host, delay), factor)?;
    let timeline = Timeline::of(cell, factor)?;
    let comment = format!(
        "ingressbench {} cell {}\nvalues in microseconds",
        env!("CARGO_PKG_VERSION"),
        cell.label()
    );
    // The load stops when the run is stopped (Ctrl-C), when a part of the site dies, or
    // when what it measures cannot be written (a full disk).
    let stop = Arc::new(AtomicBool::new(false));
    let mut streams = Streams::new(
        Some(&dir.join("latency.hlog")),
        Some(&dir.join("samples.csv.gz")),
        &comment,
    )
    .map_err(|e| e.to_string())?
    .stop_on_error(stop.clone());
    if let Some(live) = live {
        streams = streams.on_progress(live);
    }
    let mut soak = None;
    if let Some(s) = crate::soak::Soak::of(cell, factor)? {
        let kept = s.kept(
            timeline.firings(),
            measure_from.saturating_duration_since(start),
            &dir.join("samples-rest.csv.gz"),
        );
        let requests = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let log = crate::soak::SoakLog::new(
            &dir.join("soak.jsonl"),
            (s.every, s.from),
            measure_from,
            &options.dir,
        )
        .ok();
        soak = Some(crate::soak::SoakRun {
            soak: s,
            kept: kept.handle(),
            requests: requests.clone(),
            start,
            log,
        });
        streams = streams.keep_only(kept).count_into(requests);
    }
    if let Some(metrics) = &options.metrics {
        metrics.settings(vec![
            ("scenario".to_owned(), cell.scenario.name.clone()),
            ("cell".to_owned(), cell.index.to_string()),
            ("label".to_owned(), cell.label()),
            ("target".to_owned(), cell.target.name().to_owned()),
        ]);
        streams = streams.with_live(metrics.clone());
    }
    let gate = timeline.gate(&mut plan);
    let probe = match site.route_probe() {
        Some(addr) => RouteProbe::start(cell, addr, site.client_netns()).transpose()?,
        None => None,
    };
    site.start_measuring();
    let migrate = plan.migrate.clone();
    let thread = spawn_load(plan, senders, site.client_netns(), stop.clone(), streams)?;
    Ok(Started {
        thread,
        timeline,
        gate,
        stop,
        start,
        measure_from,
        entry: serde_json::json!({
            "url": entry.url,
            "address": entry.tls.as_ref().and_then(|(_, at)| *at).map(|a| a.to_string()),
        }),
        proxy_version: entry.proxy_version,
        probe,
        migrate,
        soak,
    })
}

/// What ran beside the load: what the site's parts spent, what went wrong with the site,
/// and how often each event fired.
struct Beside {
    usage: Option<UsageLog>,
    counts: Option<crate::proxy_counts::ProxyCounts>,
    went_wrong: Option<String>,
    fired: Vec<u32>,
    probe: Option<RouteProbe>,
    /// What an event going one route at a time left undone.
    unfinished: Option<String>,
    /// A soak's filter and log.
    soak: Option<crate::soak::SoakRun>,
}

/// Until the load ends: fires the timeline's events into the site, watches its parts
/// and what they spend (see [`Driver`]).
fn drive(
    cell: &Cell,
    dir: &Path,
    site: &mut dyn Site,
    load: &mut Started,
    options: &RunOptions,
) -> Result<Beside, CellFailure> {
    let events = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("events.jsonl"))
        .map_err(|e| e.to_string())?;
    // What the parts spend is a side figure: if its file cannot be written, the cell
    // goes on without it (the load is already running; latency is what it measures).
    let usage = UsageLog::new(
        &dir.join("usage.jsonl"),
        site.usage_parts(),
        load.start,
        load.measure_from,
    )
    .ok();
    // A soak's hours of readings stay on disk until the load ends.
    let soaks = load.soak.is_some();
    let usage = usage.map(|u| if soaks { u.on_disk() } else { u });
    let counts = crate::proxy_counts::ProxyCounts::new(
        &dir.join("proxy-metrics.jsonl"),
        site,
        load.start,
        load.measure_from,
    )
    .ok()
    .flatten()
    .map(|c| if soaks { c.on_disk() } else { c });
    let mut driver = Driver {
        cell,
        site,
        measure_from: load.measure_from,
        events: EventsLog::new(events, load.measure_from),
        figures: SideFigures { usage, counts },
        liveness: Liveness::new(load.measure_from),
        fired: vec![0; cell.events.len()],
        went_wrong: None,
        stop: load.stop.clone(),
        probe: load.probe.take(),
        sequence: None,
        held: std::collections::VecDeque::new(),
        metrics: options.metrics.clone(),
        migrate: load.migrate.clone(),
        soak: load.soak.take(),
    };
    driver.drive(
        &load.thread,
        &mut load.timeline,
        load.gate.take(),
        &options.stop,
    );
    Ok(Beside {
        unfinished: driver.unfinished(),
        usage: driver.figures.usage,
        counts: driver.figures.counts,
        went_wrong: driver.went_wrong,
        fired: driver.fired,
        probe: driver.probe,
        soak: driver.soak,
    })
}

/// Once the load has ended: writes what the cell measured (workers.json, summary.json,
/// latency.hgrm, impact.json) and says whether the cell holds: a part that died, an event
/// that never fired or a file that cannot be written fails it; a full disk cuts it short.
fn collect(
    cell: &Cell,
    dir: &Path,
    site: &mut dyn Site,
    (load, beside, reused): (Started, Beside, bool),
    lock: &ResultsLock,
) -> Result<CellDone, CellFailure> {
    let Beside {
        usage: mut usage_log,
        counts: mut proxy_counts,
        went_wrong,
        fired,
        probe,
        unfinished,
        soak,
    } = beside;
    let (report, workers_json, streams) = load
        .thread
        .join()
        .map_err(|_| "the load thread panicked".to_owned())?;
    if let Some(workers) = &workers_json {
        write_json(&dir.join("workers.json"), workers).map_err(|e| e.to_string())?;
    }
    if usage_log
        .as_mut()
        .is_some_and(|u| u.read_now(Instant::now()).is_err())
    {
        usage_log = None;
    }
    if (proxy_counts.as_mut()).is_some_and(|c| c.read_last(site).is_err()) {
        proxy_counts = None;
    }
    if usage_log.as_mut().is_some_and(|u| u.read_back().is_err()) {
        usage_log = None;
    }
    if proxy_counts
        .as_mut()
        .is_some_and(|c| c.read_back().is_err())
    {
        proxy_counts = None;
    }
    let (routes_line, probed) = match probe {
        Some(probe) => {
            let (firings, probed) = probe.finish(dir, load.measure_from, usage_log.as_ref())?;
            (probe_line(&firings), probed)
        }
        None => (String::new(), Vec::new()),
    };
    let mut report = report.map_err(|e| e.to_string())?;
    // Steps the system under test did not get to before the load ended are a finding
    // (a controller that cannot keep up), said loudly, not a failed cell.
    if let Some(why) = &unfinished {
        report
            .summary
            .warnings
            .push(format!("ROUTE STEPS UNFINISHED: {why}"));
    }
    let cut_short = write_measured(dir, &report, streams, lock)?;
    let websocket = write_websocket(dir, &report)?;
    let record = site.record(dir);
    let impact = write_impact(
        (site.records(), &probed, websocket.map(|w| &w.closes[..])),
        dir,
        &report.summary,
        (usage_log.as_ref(), proxy_counts.as_ref()),
        cell.scenario.load.sample_rate,
        (load.measure_from, load.start),
    );
    // Cut samples make no event's impact: none is written then.
    let impact = match cut_short {
        None => impact?,
        Some(_) => impact.unwrap_or_default(),
    };
    let rate = report.summary.requests.total as f64 / report.summary.duration_s.max(1e-9);
    let soak = soak.map(|run| crate::soak::record(cell, &run, (usage_log.as_ref(), rate), &impact));
    if let Some(why) = went_wrong {
        // Its files are copied into the cell: the lab's own directory goes with the lab.
        // A soak keeps its verdict on the hours before (a proxy that died: when is `why`).
        return Err(CellFailure {
            soak: soak.map(Box::new),
            ..CellFailure::from(site.at_copies(why, dir))
        });
    }
    let s = &report.summary;
    // An event that never fired would leave a report of a scenario that did not happen.
    if !s.interrupted {
        if let Some(why) = unfired(
            cell,
            &load.timeline,
            &fired,
            s.requests.total,
            unfinished.is_some(),
        ) {
            return Err(why.into());
        }
    }
    Ok(CellDone {
        summary: LineSummary {
            requests: s.requests.total,
            errors: Some(s.requests.errors),
            min_us: Some(s.latency_us.min),
            p50_us: Some(s.latency_us.p50),
            p99_us: Some(s.latency_us.p99),
            max_us: Some(s.latency_us.max),
        },
        link_overhead_us: record.link_overhead_us,
        kernel: record.kernel,
        topology: record.topology,
        routes: record.routes,
        usage: usage_log.and_then(|u| u.summary(s.requests.total)),
        soak,
        lab_reused: reused,
        measure_from_s: load
            .measure_from
            .saturating_duration_since(load.start)
            .as_secs_f64(),
        proxy_version: load.proxy_version,
        entry: load.entry,
        interrupted: s.interrupted || cut_short.is_some(),
        cut_short,
        line: one_line(s) + &websocket.map(websocket_line).unwrap_or_default() + &routes_line,
    })
}

/// Closes the streamed files and writes summary.json and latency.hgrm. A full disk cut
/// the interval log or the samples: the load stopped there, what it measured is still
/// written (the reserve makes room), and why is returned.
fn write_measured(
    dir: &Path,
    report: &ingressbench_load::LoadReport,
    mut streams: Streams,
    lock: &ResultsLock,
) -> Result<Option<String>, String> {
    let cut_short = match streams.finish(&report.summary.warnings) {
        Ok(()) => None,
        Err(e) if is_full(&e) => {
            lock.free_reserve();
            Some(format!(
                "the disk filled while the cell was measured ({e}); the load stopped there and what it measured \
                 is kept (summary.json; the interval log and samples as far as they were written): free space, \
                 then run again with --resume"
            ))
        }
        Err(e) => return Err(e.to_string()),
    };
    let summary = serde_json::to_value(&report.summary).map_err(|e| e.to_string())?;
    lock.write_even_if_full(|| write_json(&dir.join("summary.json"), &summary))
        .map_err(|e| e.to_string())?;
    lock.write_even_if_full(|| {
        let mut hgrm = std::fs::File::create(dir.join("latency.hgrm"))?;
        ingressbench_report::hgrm::write(&mut hgrm, report.recorder.latency())
    })
    .map_err(|e| e.to_string())?;
    Ok(cut_short)
}

/// What the route probe found, for the cell's line: per firing, routes right of those
/// asked and the p99 and last time to a right answer.
fn probe_line(routes: &RoutesFile) -> String {
    let mut line = String::new();
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |m| format!("{m:.1} ms"));
    for f in &routes.firings {
        line.push_str(&format!(
            "; {}: {}/{} right, p99 {}, last {}",
            f.what,
            f.right,
            f.asked,
            ms(f.time_to_right_ms.p99),
            ms(f.last_right_ms),
        ));
    }
    // The tool's own CPU for the route changes and the probe, against the time the steps
    // took to be right: the tool must not be what is slow.
    let took: f64 = routes.firings.iter().filter_map(|f| f.last_right_ms).sum();
    if took > 0.0 {
        let tool = routes.tool_cpu_ms;
        line.push_str(&format!(
            "; the tool's CPU for routes and probe {tool:.0} ms, {:.1}% of the {took:.0} ms its steps took",
            tool / took * 100.0
        ));
    }
    line
}

/// The line printed when a cell ends.
/// Where `cell`'s proxy binary is: the version its target names, installed beside the
/// default; and, before anything starts, every version its upgrade events go to must be
/// installed too (an error naming what to install otherwise).
fn binaries_for(
    cell: &Cell,
    binaries: &ingressbench_lab::proxy::Binaries,
) -> Result<ingressbench_lab::proxy::Binaries, String> {
    let mut binaries = binaries.clone();
    let Target::Proxy { kind, version, .. } = &cell.target else {
        return Ok(binaries);
    };
    let upgrades = cell.events.iter().filter_map(|e| match &e.action {
        crate::model::Action::Upgrade { to, .. } => to.for_kind(*kind),
        _ => None,
    });
    for (kind, to) in upgrades {
        binaries
            .locate_version(kind, &to)
            .map_err(|e| format!("upgrade to {to}: {e}"))?;
    }
    if let Some(version) = version {
        let (binary, _) = binaries
            .locate_version(*kind, version)
            .map_err(|e| format!("version {version}: {e}"))?;
        binaries.overrides.insert(*kind, binary);
    }
    Ok(binaries)
}

/// A long-lived load's own results as websocket.json, sse.json, grpc.json or
/// grpc-stream.json (closes, reconnects, the messages' accounting, how many were open over
/// time): the load engine's [`StreamFile`], the type the report reads.
fn write_websocket<'a>(
    dir: &Path,
    report: &'a ingressbench_load::LoadReport,
) -> Result<Option<&'a StreamFile>, String> {
    let Some(file) = report.stream.as_deref() else {
        return Ok(None);
    };
    let name = file.kind.file_name();
    write_json(&dir.join(name), file).map_err(|e| format!("writing {name}: {e}"))?;
    Ok(Some(file))
}

/// `; 8 WebSockets, 4 cut (4 × 1001 by server), 3 messages lost, reconnect p99 12.0 ms`.
fn websocket_line(w: &StreamFile) -> String {
    let cuts = Cuts::between(&w.closes, f64::NEG_INFINITY, f64::INFINITY);
    let (streams, items) = w.kind.nouns();
    let mut line = format!("; {} {streams} opened", w.opened);
    if cuts.closed > 0 {
        line += &format!(", {} cut ({})", cuts.closed, cuts.codes());
    }
    line += &format!(", {} {items} lost", w.lost);
    if let Some(p99) = cuts.reconnect_percentile_ms(99.0) {
        line += &format!(", reconnect p99 {p99:.1} ms");
    }
    line
}

fn one_line(s: &ingressbench_stats::Summary) -> String {
    format!(
        "{} requests, {} errors, p50 {:.2} ms, p99 {:.2} ms{}",
        s.requests.total,
        s.requests.errors,
        s.latency_us.p50 as f64 / 1e3,
        s.latency_us.p99 as f64 / 1e3,
        if s.warnings.is_empty() {
            String::new()
        } else {
            format!(" ({} warnings)", s.warnings.len())
        }
    )
}

/// A cell's system under test, as [`bring_up`] found it.
struct SiteUp {
    site: Box<dyn Site>,
    /// What it is kept under between cells (`None`: it is not kept).
    key: Option<String>,
    /// Kept from an earlier cell.
    reused: bool,
}

/// The system under test of a cell: a site kept from an earlier cell with the same one
/// (only cells without events share them), or a new one.
fn bring_up(
    cell: &Cell,
    options: &RunOptions,
    sites: &mut SiteCache,
) -> Result<SiteUp, CellFailure> {
    #[cfg(not(feature = "cluster"))]
    if let Some(cluster) = &options.cluster {
        match *cluster {}
    }
    #[cfg(feature = "cluster")]
    if let Some(cluster) = &options.cluster {
        let shape = Shape::of(cell);
        let placed = cell.target.file_key();
        let site = ClusterSite::up(cluster, &placed, cell.index, shape)?;
        return Ok(SiteUp {
            site: Box::new(site),
            key: None,
            reused: false,
        });
    }
    let Some(file) = lab_file(cell) else {
        return match &cell.target {
            Target::Upstream { url, .. } => Ok(SiteUp {
                site: Box::new(Upstream { url: url.clone() }),
                key: None,
                reused: false,
            }),
            Target::Proxy { .. } => Err("a proxy target without a lab".into()),
            Target::Cluster { name, .. } => Err(CellFailure::input(format!(
                "target `{name}` is placed by a cluster file: run with --cluster FILE"
            ))),
        };
    };
    let key = format!("{:?}", (&cell.target, &file));
    if cell.events.is_empty() {
        if let Some(site) = sites.take(&key) {
            return Ok(SiteUp {
                site,
                key: Some(key),
                reused: true,
            });
        }
    }
    let spec = file
        .to_spec(
            Path::new("scenario"),
            options.backend_binary.clone(),
            binaries_for(cell, &options.binaries)?,
        )
        .map_err(|e| e.to_string())?;
    let mut lab = Lab::up(spec).map_err(|e| e.to_string())?;
    lab.cut_waits_short_on(options.stop.clone());
    Ok(SiteUp {
        site: Box::new(LabSite::new(lab)),
        key: Some(key),
        reused: false,
    })
}

/// Sites kept up between cells that differ only in their load (a sweep over rates and
/// connections), so that each cell does not pay for a lab's start; at most
/// [`SiteCache::MAX`], the oldest torn down first.
#[derive(Default)]
pub(crate) struct SiteCache(Vec<(String, Box<dyn Site>)>);

impl SiteCache {
    const MAX: usize = 10;

    fn take(&mut self, key: &str) -> Option<Box<dyn Site>> {
        let i = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(i).1)
    }

    fn put(&mut self, key: String, site: Box<dyn Site>) {
        if self.0.len() == Self::MAX {
            self.0.remove(0);
        }
        self.0.push((key, site));
    }
}
