//! Every static check of a scenario, made before anything starts: [`scenario`] for the
//! file as a whole (targets, load, events, matrix values), [`cell`] for each cell with its
//! matrix values in place (its lab, its load plan, its events against its pools and its
//! length). `scenario check` and `run` both make them all, so what the tool refuses is
//! answered here. The message names the scenario field and the fix. Checks against a
//! cluster file are [`crate::cluster_site::check_cells`].

use std::path::{Path, PathBuf};

use ingressbench_lab::model::Overlay;
use ingressbench_lab::proxy::Binaries;
use ingressbench_lab::proxy::ProxyKind;
use ingressbench_lab::Change;
use ingressbench_load::Length;

use crate::load::{dur, plan_for};
use crate::model::{Action, LoadFrom, LoadModeFile, Target, Timing};
use crate::model::{EventSpec, Scenario};
use crate::site::lab_file;
use crate::timeline::route_changes;
use crate::{Cell, ScenarioError};

/// Every check a cell makes before it starts anything, made without starting anything:
/// its lab (pool names, routes, every value that reaches a proxy, with each route change
/// its events ask for), its load plan and the open files its connections need, and its
/// events against its pools and its length. [`crate::expand`] makes them for every cell,
/// so `scenario check` and `run` find a bad matrix value before the first cell starts.
/// The message names the scenario field and the fix.
pub(crate) fn cell(cell: &Cell) -> Result<(), String> {
    let s = &cell.scenario;
    // Before the lab's routes are made: a count too large would take the memory first.
    check_route_count(cell)?;
    check_probe(&s.routes.probe)?;
    check_pool_changes(cell)?;
    let (url, pools) = match (lab_file(cell), &cell.target) {
        (Some(file), target) => {
            if let (Target::Proxy { kind, .. }, true) = (target, s.load.kind.is_grpc()) {
                check_grpc(*kind, &file)?;
            }
            let spec = file
                .to_spec(Path::new("scenario"), PathBuf::new(), Binaries::default())
                .map_err(|e| e.to_string())?;
            spec.check(&route_changes(cell))
                .map_err(|e| e.to_string())?;
            let pools = spec.pools.iter().map(|p| p.name.clone()).collect();
            (
                format!("{}://127.0.0.1{}", scheme(s.tls), s.load.path),
                pools,
            )
        }
        (None, Target::Upstream { url, name }) => {
            if !cell.events.is_empty() {
                return Err(format!(
                    "events: target `{name}` is an upstream URL the tool did not start, so it cannot scale, kill, stall or reconfigure it; give the events to proxy targets (a lab), or run this target in a scenario without events"
                ));
            }
            (url.clone(), Vec::new())
        }
        (None, Target::Proxy { .. }) => return Err("a proxy target without a lab".into()),
        // The cluster file says where it runs; `run --cluster` checks it against the file.
        (None, Target::Cluster { .. }) => (
            format!("{}://127.0.0.1{}", scheme(s.tls), s.load.path),
            s.backends.iter().map(|b| b.name.clone()).collect(),
        ),
    };
    check_from(&s.load)?;
    if s.load.kind != crate::model::LoadKindFile::Http && s.search.is_some() {
        return Err("search: a capacity search sends HTTP requests (its generator ceiling is measured with them); drop `search` or `load.kind`".into());
    }
    let mut plan = plan_for(cell, &url, None, 1.0)?;
    plan.share.of = s.load.workers.unwrap_or(1);
    plan.validate().map_err(|e| match e {
        ingressbench_load::LoadError::InvalidPlan { field, reason } => {
            format!("{}: {reason}", scenario_field(&field))
        }
        e => e.to_string(),
    })?;
    ingressbench_load::ensure_descriptors(plan.connections)
        .map_err(|e| format!("load.connections: {e}"))?;
    for (i, e) in cell.events.iter().enumerate() {
        check_event(i, e, &pools, &plan.length)?;
        if e.action.change() == Some(&Change::Migrate) {
            migrate_reaches_the_load(i, &plan, s.load.workers.unwrap_or(1))?;
        }
    }
    Ok(())
}

/// A `migrate` event moves the QUIC connections of the load this process sends.
fn migrate_reaches_the_load(
    i: usize,
    plan: &ingressbench_load::Plan,
    workers: usize,
) -> Result<(), String> {
    if plan.protocol != ingressbench_load::Protocol::Http3 {
        return Err(format!(
            "events[{i}]: migrate moves the client's QUIC connections; set load.protocol: http3"
        ));
    }
    if workers > 1 {
        return Err(format!(
            "events[{i}]: migrate reaches the load this process sends, not its worker processes; drop load.workers"
        ));
    }
    Ok(())
}

/// A route change's `pool` names one of the scenario's `backends`.
fn check_pool_changes(cell: &Cell) -> Result<(), String> {
    let pools: Vec<&str> = cell
        .scenario
        .backends
        .iter()
        .map(|b| b.name.as_str())
        .collect();
    for (i, e) in cell.events.iter().enumerate() {
        if let Some(Change::Overlay(Overlay {
            pool: Some(pool), ..
        })) = e.action.change()
        {
            if !pools.contains(&pool.as_str()) {
                return Err(format!(
                    "events[{i}]: config.pool `{pool}` is not a pool of this scenario ({}): name one of its `backends`, or add a backend of that name",
                    pools.join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// The most generated routes a cell may hold at once: each is a line (or a block) of every
/// proxy's configuration and a string in the tool's memory.
const MAX_GENERATED_ROUTES: usize = 100_000;

/// A cell whose generated routes could pass [`MAX_GENERATED_ROUTES`] (its `routes.count`
/// and every `add_routes` as many times as it fires) is refused before anything starts.
fn check_route_count(cell: &Cell) -> Result<(), String> {
    let added: usize = cell
        .events
        .iter()
        .map(|e| match e.action.change() {
            Some(Change::AddRoutes(n)) => n.saturating_mul(e.timing.times() as usize),
            _ => 0,
        })
        .fold(0, usize::saturating_add);
    let stepped = cell
        .events
        .iter()
        .filter_map(|e| match &e.action {
            Action::RouteSteps { to, .. } => to.iter().max().copied(),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let most = cell
        .scenario
        .routes
        .count
        .saturating_add(added)
        .max(stepped);
    if most > MAX_GENERATED_ROUTES {
        return Err(format!(
            "routes: up to {most} generated routes (routes.count and every add_routes, or a route step); at most {MAX_GENERATED_ROUTES} in a cell"
        ));
    }
    Ok(())
}

/// The route probe's settings: a rate it can keep, connections it can open, a time.
fn check_probe(p: &crate::model::ProbeFile) -> Result<(), String> {
    if !(p.rate.is_finite() && (1.0..=100_000.0).contains(&p.rate)) {
        return Err(format!(
            "routes.probe.rate: {} probes/s; give 1 to 100000 (each probe is a request to the proxy beside the load)",
            p.rate
        ));
    }
    if !(1..=64).contains(&p.connections) {
        return Err(format!(
            "routes.probe.connections: {}; give 1 to 64",
            p.connections
        ));
    }
    ingressbench_stats::parse_duration(&p.give_up_after)
        .map(|_| ())
        .map_err(|e| format!("routes.probe.give_up_after: {e}"))
}

/// Whether `protocol` (`written`, if the file gave one) carries a load of `kind`: the
/// stream loads have one protocol each here, and a cell labelled with another would say
/// what was not measured.
fn protocol_carries(
    kind: crate::model::LoadKindFile,
    written: Option<&str>,
    protocol: ingressbench_load::Protocol,
) -> Result<(), String> {
    use crate::model::LoadKindFile as K;
    use ingressbench_load::Protocol as P;
    match (kind, protocol) {
        (K::Http, _) | (K::Websocket | K::Sse, P::Http1) | (K::Grpc | K::GrpcStream, P::Http2) => {
            Ok(())
        }
        (K::Grpc | K::GrpcStream, P::Http1) if written.is_none() => Ok(()),
        (K::Grpc | K::GrpcStream, _) => Err(format!(
            "load.protocol: {} with a gRPC load: gRPC goes over HTTP/2 here; drop load.protocol (or set kind: http for HTTP/3 requests)",
            written.unwrap_or("http1")
        )),
        (K::Websocket | K::Sse, _) => Err(format!(
            "load.protocol: {} with a WebSocket or event-stream load: those go over HTTP/1.1 here (WebSockets over HTTP/2 and HTTP/3, RFC 8441 and 9220, are not sent); drop load.protocol (or set kind: http for requests over it)",
            written.unwrap_or("http1")
        )),
    }
}

/// A gRPC load: HTTP/2 to the backends, and from the client over a listener that speaks
/// HTTP/2 (nginx's plain port is HTTP/1.1 only: its h2c is prior knowledge only, which
/// would refuse HTTP/1.1 there).
fn check_grpc(kind: ProxyKind, file: &ingressbench_lab::labfile::LabFile) -> Result<(), String> {
    use ingressbench_lab::model::UpstreamProtocol;
    if file.tuning.upstream_protocol == Some(UpstreamProtocol::Http1) {
        return Err(format!(
            "upstream_protocol: http1 with load.kind gRPC: gRPC is HTTP/2 end to end, so {} must speak HTTP/2 to the backends; drop upstream_protocol (a gRPC load sets it)",
            kind.name()
        ));
    }
    if kind == ProxyKind::Nginx && !file.tls {
        return Err("load.kind gRPC through nginx needs `tls: true`: nginx speaks HTTP/2 (and so gRPC) on its TLS listener here, its plain port stays HTTP/1.1 (nginx's h2c is prior knowledge only, which would refuse HTTP/1.1 there)".into());
    }
    Ok(())
}

/// Where the load comes from: placement and start margin only for load from the
/// cluster, and a placement says one thing.
fn check_from(l: &crate::model::LoadFile) -> Result<(), String> {
    if l.kind != crate::model::LoadKindFile::Http && l.from == LoadFrom::Cluster {
        return Err("load.from: a WebSocket, event stream or gRPC load is sent from this machine, by one process; drop `from: cluster`".into());
    }
    if l.from == LoadFrom::Here {
        for (field, set) in [
            ("load.placement", l.placement.is_some()),
            ("load.start_margin", l.start_margin.is_some()),
        ] {
            if set {
                return Err(format!(
                    "{field}: only load from the cluster has pods to place; add `load.from: cluster` (with run --cluster FILE) or drop it"
                ));
            }
        }
    }
    if let Some(p) = &l.placement {
        if p.node.is_some() != p.node_selector.is_empty() {
            return Err("load.placement: give either `node:` (same_as_backends, other_than_backends, same_as_ingress or any) or `node_selector: { label: value }`".into());
        }
    }
    if dur("load.start_margin", &l.start_margin)?.is_some_and(|d| d.is_zero()) {
        return Err("load.start_margin: the pods need some time to start; give at least 1s".into());
    }
    Ok(())
}

/// The scenario field behind a load-plan option, for messages.
fn scenario_field(option: &str) -> &str {
    match option {
        "-R/--rate" => "load.rate",
        "-c/--connections" => "load.connections",
        "--threads" => "load.threads",
        "--sequential" => "load.mode",
        "--workers" => "load.workers",
        "-n/--requests" => "load.requests",
        "-d/--duration" => "load.duration",
        "--timeout" => "load.timeout",
        "--sample-rate" => "load.sample_rate",
        "protocol" => "load.protocol",
        "--warmup-requests" => "load.warmup_requests",
        "message size" => "load.stream.message_bytes",
        other => other,
    }
}

/// An event that would name a backend no pool has, or fire after the load ends.
fn check_event(
    i: usize,
    e: &crate::model::EventSpec,
    pools: &[String],
    length: &Length,
) -> Result<(), String> {
    let named = match e.action.change() {
        Some(Change::Kill(name) | Change::Terminate(name)) => name.as_deref(),
        Some(Change::Stall { backend, .. }) => backend.as_deref(),
        _ => None,
    };
    if let Some(name) = named {
        let of_a_pool = pools.iter().any(|p| {
            name.strip_prefix(p.as_str())
                .and_then(|n| n.strip_prefix('-'))
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|n| n >= 1)
        });
        if !of_a_pool {
            let examples: Vec<String> = pools.iter().map(|p| format!("{p}-1")).collect();
            return Err(format!(
                "events[{i}]: `{name}` is not a backend of this scenario: backends are named POOL-N ({}), or leave the name out for one at random",
                examples.join(", ")
            ));
        }
    }
    let never = |what: String, limit: String| {
        Err(format!(
            "events[{i}]: {what} is past the end of the load ({limit}), so it would never fire; make the event earlier or the load longer"
        ))
    };
    match (&e.timing, length) {
        (Timing::At(at), Length::Duration(d)) if at >= d => {
            never(format!("at {at:?}"), format!("load.duration {d:?}"))
        }
        (
            Timing::Every {
                first,
                every,
                times,
            },
            Length::Duration(d),
        ) if *first + *every * times.saturating_sub(1) >= *d => never(
            format!(
                "the last of {times} firings ({:?})",
                *first + *every * times.saturating_sub(1)
            ),
            format!("load.duration {d:?}"),
        ),
        (
            Timing::BeforeRequest {
                first,
                every,
                times,
            },
            Length::Requests(n),
        ) if first + every * u64::from(times.saturating_sub(1)) > *n => never(
            format!(
                "the last of {times} firings (before request {})",
                first + every * u64::from(times.saturating_sub(1))
            ),
            format!("load.requests {n}"),
        ),
        _ => Ok(()),
    }
}

/// The longest target name, in characters.
const MAX_TARGET_NAME: usize = 100;

/// Checks what the types cannot: that the load, the events and the targets make sense
/// together. Returns the validated events.
pub(crate) fn scenario(s: &Scenario, path: &Path) -> Result<Vec<EventSpec>, ScenarioError> {
    let bad = |m: String| ScenarioError::at(path, m);
    // The name becomes part of the results directory's path: it must stay a name.
    let name_ok = s.name.len() <= 64
        && s.name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !name_ok {
        return Err(bad(format!(
            "name: {:?} cannot name a results directory; use 1-64 letters, digits, '-', '_' or '.', starting with a letter or digit",
            s.name
        )));
    }
    if s.targets.is_empty() {
        return Err(bad("targets: name at least one system to compare".into()));
    }
    let mut names: Vec<String> = s.targets.iter().map(Target::name).collect();
    // A name is printed, stored in run.json and part of its cells' directory names.
    if let Some(name) = names.iter().find(|n| {
        n.is_empty() || n.chars().count() > MAX_TARGET_NAME || n.chars().any(char::is_control)
    }) {
        return Err(bad(format!(
            "targets: the name {name:?} cannot be stored or printed as it is; give 1-{MAX_TARGET_NAME} characters with no control characters (a line break, a tab, an escape)"
        )));
    }
    names.sort();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(bad(format!(
            "targets: two targets are called `{}`; give one a `name`",
            w[0]
        )));
    }
    for target in &s.targets {
        if let Target::Proxy { front, .. } = target {
            if front.as_ref().is_some_and(|f| f.replicas == 0) {
                return Err(bad(format!(
                    "targets: `{}`: front.replicas is 0; a front needs at least one proxy behind it",
                    target.name()
                )));
            }
        }
        if let Some(hop) = target.hop().filter(|h| h.proxy != ProxyKind::Envoy) {
            return Err(bad(format!(
                "targets: `{}`: hop.proxy is `{}`; the sidecar is envoy (as in Istio, OSM and Consul)",
                target.name(),
                hop.proxy
            )));
        }
    }
    let pools: Vec<&str> = s.backends.iter().map(|p| p.name.as_str()).collect();
    if let Some(r) = s.routes.own.iter().find(|r| {
        r.host
            .to_ascii_lowercase()
            .ends_with(&format!(".{}", ingressbench_lab::model::GENERATED_DOMAIN))
    }) {
        return Err(bad(format!(
            "routes: host `{}` is in {}, the generated routes' domain; give the scenario's own routes another host",
            r.host,
            ingressbench_lab::model::GENERATED_DOMAIN
        )));
    }
    s.topology
        .to_topology()
        .and_then(|t| t.check_between(&pools))
        .map_err(&bad)?;
    let l = &s.load;
    let path_ok = l.path.starts_with('/')
        && l.path.len() <= 2048
        && l.path.bytes().all(|b| b.is_ascii_graphic());
    if !path_ok {
        return Err(bad(format!(
            "load.path: {:?} is not a request path; write one that starts with `/` and has no spaces or control characters, e.g. /api/v1?x=1",
            l.path
        )));
    }
    match (l.mode, l.rate) {
        (LoadModeFile::Open, None) => {
            return Err(bad(
                "load.rate: open-loop load needs a rate (requests per second)".into(),
            ))
        }
        (LoadModeFile::Open, Some(r)) if !(r.is_finite() && r > 0.0) => {
            return Err(bad(format!("load.rate: {r} is not a positive rate")))
        }
        (LoadModeFile::Closed | LoadModeFile::Sequential, Some(_)) => {
            return Err(bad(
                "load.rate: only open-loop load has a rate (mode: open)".into(),
            ));
        }
        _ => {}
    }
    if l.mode == LoadModeFile::Sequential && l.connections.is_some_and(|c| c != 1) {
        return Err(bad(
            "load.connections: sequential load uses one connection".into()
        ));
    }
    if l.mode != LoadModeFile::Sequential && l.interval.is_some() {
        return Err(bad(
            "load.interval: only sequential load pauses between requests".into(),
        ));
    }
    match (&l.duration, l.requests) {
        (Some(_), Some(_)) => {
            return Err(bad("load: give `duration` or `requests`, not both".into()))
        }
        (None, None) => {
            return Err(bad(
                "load: give a `duration` (60s) or a number of `requests`".into(),
            ))
        }
        _ => {}
    }
    if l.warmup.is_some() && l.warmup_requests.is_some() {
        return Err(bad(
            "load: give `warmup` or `warmup_requests`, not both".into()
        ));
    }
    for (field, value) in [
        ("load.duration", &l.duration),
        ("load.warmup", &l.warmup),
        ("load.interval", &l.interval),
        ("load.timeout", &l.timeout),
        (
            "controller.propagation_delay",
            &s.controller.propagation_delay,
        ),
    ] {
        if let Some(v) = value {
            ingressbench_stats::parse_duration(v).map_err(|e| bad(format!("{field}: {e}")))?;
        }
    }
    let protocol = match l.protocol.as_deref() {
        None => ingressbench_load::Protocol::Http1,
        Some(p) => ingressbench_load::Protocol::parse(p).ok_or_else(|| {
            bad(format!(
                "load.protocol: `{p}` is not a protocol; use http1, http2 or http3"
            ))
        })?,
    };
    protocol_carries(l.kind, l.protocol.as_deref(), protocol).map_err(bad)?;
    if protocol == ingressbench_load::Protocol::Http3 {
        http3_reaches_every_target(s).map_err(bad)?;
    }
    if let Some(streams) = l.streams {
        if protocol == ingressbench_load::Protocol::Http1 {
            return Err(bad(
                "load.streams: streams are HTTP/2's and HTTP/3's; set load.protocol: http2 or http3".to_owned(),
            ));
        }
        if !(1..=ingressbench_load::MAX_STREAMS).contains(&streams) {
            return Err(bad(format!(
                "load.streams: {streams} is not between 1 and {}",
                ingressbench_load::MAX_STREAMS
            )));
        }
    }
    if protocol == ingressbench_load::Protocol::Http2 && !s.tls {
        let nginx = s.targets.iter().find(|t| {
            matches!(
                t,
                Target::Proxy {
                    kind: ProxyKind::Nginx,
                    hop: None,
                    front: None,
                    ..
                }
            )
        });
        if let Some(t) = nginx {
            return Err(bad(format!(
                "load.protocol: http2 without TLS is h2c, which nginx serves only instead of HTTP/1.1 on a port (prior knowledge); the lab's `{}` speaks HTTP/2 over TLS: set tls: true",
                t.name()
            )));
        }
    }
    if let Some(policy) = &l.retry {
        if ingressbench_load::RetryPolicy::parse(policy).is_none() {
            return Err(bad(format!(
                "load.retry: `{policy}` is not a retry policy; use none, idempotent or always"
            )));
        }
    }
    if !(0.0..=1.0).contains(&l.sample_rate) {
        return Err(bad(format!(
            "load.sample_rate: {} is not between 0 and 1",
            l.sample_rate
        )));
    }
    let mut events = Vec::new();
    for (i, e) in s.events.iter().enumerate() {
        let spec = e.validate(i).map_err(&bad)?;
        if matches!(spec.timing, crate::Timing::BeforeRequest { .. })
            && l.mode != LoadModeFile::Sequential
        {
            return Err(bad(format!(
                "events[{i}]: `before_request` needs sequential load (load.mode: sequential)"
            )));
        }
        events.push(spec);
    }
    Ok(events)
}

/// The URL scheme of a scenario's entry, to check its load against.
fn scheme(tls: bool) -> &'static str {
    if tls {
        "https"
    } else {
        "http"
    }
}

/// HTTP/3 goes to a target only where something serves it: over TLS (QUIC is always
/// TLS), to Caddy, Envoy or Traefik in the lab (each serves it on its HTTPS port's UDP
/// twin) or to a URL of the user's; the others are refused before anything starts, each
/// with its reason. A cluster target's is its cluster file's (`http3: true`), which the
/// run checks when it reads the file (`cluster_site::http3_refusals`).
/// Why `target` cannot be sent HTTP/3; none when it can.
pub(crate) fn http3_refusal(target: &Target) -> Option<&'static str> {
    Some(match target {
        Target::Upstream { .. } | Target::Cluster { .. } => return None,
        Target::Proxy { front: Some(_), .. } => {
            "its L4 front balances TCP only; QUIC needs a UDP balancer"
        }
        Target::Proxy { kind, .. } => match kind {
            ProxyKind::Caddy | ProxyKind::Envoy | ProxyKind::Traefik => return None,
            ProxyKind::Nginx => "nginx 1.22 as packaged here has no HTTP/3 (it came in 1.25)",
            ProxyKind::Haproxy => {
                "HAProxy 2.6 as packaged here is built without a QUIC TLS library"
            }
        },
    })
}

fn http3_reaches_every_target(s: &Scenario) -> Result<(), String> {
    if !s.tls {
        return Err(
            "load.protocol: http3 runs over QUIC, which is always TLS: set tls: true".to_owned(),
        );
    }
    let refusals: Vec<String> = (s.targets.iter())
        .filter_map(|t| Some(format!("`{}`: {}", t.name(), http3_refusal(t)?)))
        .collect();
    if refusals.is_empty() {
        return Ok(());
    }
    Err(format!(
        "load.protocol: http3 cannot reach {} (--set 'targets=[caddy, envoy, traefik]' runs HTTP/3 through those)",
        refusals.join("; ")
    ))
}
