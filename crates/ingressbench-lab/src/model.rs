//! The shared route model every proxy driver renders its configuration from, and the
//! checks that keep any value from injecting configuration.

use std::net::SocketAddr;

use crate::LabError;

/// A pool of backend replicas, addressed by name from routes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// Name (letters, digits, `-`, `_`).
    pub name: String,
    /// Where its replicas listen.
    pub endpoints: Vec<SocketAddr>,
}

/// Requests for `host` whose path starts with `path_prefix` go to `pool`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// Host name (`*` for any).
    pub host: String,
    /// Path prefix, starting with `/`.
    pub path_prefix: String,
    /// Target pool.
    pub pool: String,
    /// The route's revision, answered in [`ROUTE_REVISION_HEADER`] when above 0: a
    /// `change_routes` event raises it on the routes it changes, so each answer says
    /// which version of its route served it.
    pub revision: u32,
}

/// The response header in which a route that has been changed names its revision.
pub const ROUTE_REVISION_HEADER: &str = "x-ingressbench-route-revision";

/// The domain of generated routes (route scale): route `i` is host `r{i}.routes.test`.
pub const GENERATED_DOMAIN: &str = "routes.test";

/// Generated route `i`: host `r{i}.routes.test`, every path, to `pools[i % pools.len()]`.
pub fn generated_route(i: usize, pools: &[String]) -> Route {
    Route {
        host: format!("r{i}.{GENERATED_DOMAIN}"),
        path_prefix: "/".into(),
        pool: pools
            .get(i % pools.len().max(1))
            .cloned()
            .unwrap_or_default(),
        revision: 0,
    }
}

/// The index of a generated route (`None` for any other).
pub fn generated_index(route: &Route) -> Option<usize> {
    route
        .host
        .strip_prefix('r')?
        .strip_suffix(GENERATED_DOMAIN)?
        .strip_suffix('.')?
        .parse()
        .ok()
}

/// Route changes applied on top of the routes (and reverted by clearing them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overlay {
    /// A response header added to every answer.
    pub response_header: Option<(String, String)>,
    /// CORS: `Access-Control-Allow-Origin` (and friends) for this origin.
    pub cors_origin: Option<String>,
    /// Path-prefix rewrite: a path starting with `.0` is sent to the backend as `.1` + rest.
    pub rewrite: Option<(String, String)>,
    /// The pool every route of the scenario's own (not the generated ones) goes to
    /// instead of its own: a route's backend changed, as a blue/green switch or a Gateway
    /// API backendRef's edit.
    pub pool: Option<String>,
}

impl Overlay {
    /// What it changes, in a few words (`header X-A: 1, CORS https://a`), or `revert
    /// route changes` when it is empty.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some((name, value)) = &self.response_header {
            parts.push(format!("header {name}: {value}"));
        }
        if let Some(origin) = &self.cors_origin {
            parts.push(format!("CORS {origin}"));
        }
        if let Some((from, to)) = &self.rewrite {
            parts.push(format!("rewrite {from} -> {to}"));
        }
        if let Some(pool) = &self.pool {
            parts.push(format!("routes to {pool}"));
        }
        if parts.is_empty() {
            "revert route changes".to_owned()
        } else {
            parts.join(", ")
        }
    }

    /// `routes` as this sends them: the scenario's own to [`Self::pool`] when it names
    /// one, the generated ones to theirs.
    pub fn reroute(&self, routes: &[Route]) -> Vec<Route> {
        let mut routes = routes.to_vec();
        if let Some(pool) = &self.pool {
            for route in routes.iter_mut().filter(|r| generated_index(r).is_none()) {
                route.pool.clone_from(pool);
            }
        }
        routes
    }
}

/// The knobs people tune, equal across proxies by default so comparisons are fair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Worker processes or threads.
    pub workers: u32,
    /// Requests per client connection before the proxy closes it (nginx's
    /// `keepalive_requests`); `None` keeps each proxy's own default.
    pub keepalive_requests: Option<u64>,
    /// Idle keep-alive connections kept per upstream pool.
    pub upstream_keepalive: u32,
    /// Upstream connect timeout, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Upstream response timeout, in milliseconds.
    pub read_timeout_ms: u64,
    /// The listen backlog the proxy asks for (nginx `backlog=`, HAProxy `backlog`, Envoy
    /// `tcp_backlog_size`); `None` keeps its own default. The kernel caps it at the node's
    /// `net.core.somaxconn`.
    pub listen_backlog: Option<u32>,
    /// What the proxies speak to the backends.
    pub upstream_protocol: UpstreamProtocol,
    /// Pass each piece of a response on as it comes: HAProxy's `option http-no-delay`
    /// (by default HAProxy holds a small piece while more is expected, 100-200 ms for a
    /// server-sent event); nginx (told by the backend's `X-Accel-Buffering: no`), Envoy,
    /// Traefik and Caddy pass event streams on at once already.
    pub no_delay: bool,
    /// How long what a reload or a restart replaced may go on serving its connections
    /// before it is stopped: nginx's `worker_shutdown_timeout` (old workers), HAProxy's
    /// `hard-stop-after` (old processes), Envoy's `--drain-time-s` (drained listeners,
    /// the parent process of a hot restart a second after), Traefik's entry points'
    /// `lifeCycle.graceTimeOut`, Caddy's `grace_period`. `None` keeps each proxy's
    /// default: nginx and HAProxy wait for the last connection, however long; Envoy
    /// 600 s; Traefik 10 s; Caddy without end.
    pub drain: Option<std::time::Duration>,
}

/// The protocol a proxy speaks to its backends.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 over pooled keep-alive connections (every proxy's default).
    #[default]
    Http1,
    /// HTTP/2: h2c with prior knowledge to plain backends, ALPN `h2` to TLS ones (HAProxy
    /// `proto h2`, Envoy's explicit `http2_protocol_options`, Traefik `h2c://` servers,
    /// Caddy's `versions: [h2c]`). nginx has none (it proxies HTTP/2 only to gRPC).
    Http2,
    /// gRPC: HTTP/2 as `http2` for HAProxy, Envoy, Traefik and Caddy, and nginx's
    /// `grpc_pass` (which carries gRPC only). What a scenario's gRPC load gives its lab.
    Grpc,
}

impl UpstreamProtocol {
    /// The name used in files (`http1`, `http2`, `grpc`).
    pub fn name(self) -> &'static str {
        match self {
            UpstreamProtocol::Http1 => "http1",
            UpstreamProtocol::Http2 => "http2",
            UpstreamProtocol::Grpc => "grpc",
        }
    }

    /// Whether the proxy speaks HTTP/2 to the backends.
    pub fn is_http2(self) -> bool {
        self != UpstreamProtocol::Http1
    }
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            workers: 1,
            keepalive_requests: None,
            upstream_keepalive: 32,
            connect_timeout_ms: 2_000,
            read_timeout_ms: 30_000,
            listen_backlog: None,
            upstream_protocol: UpstreamProtocol::Http1,
            no_delay: false,
            drain: None,
        }
    }
}

/// The response header in which the proxies in front of the backends name the generation
/// of the configuration that answered.
pub const GENERATION_HEADER: &str = "x-ingressbench-generation";
/// The response header in which the sidecar (the extra hop) names its generation.
pub const SIDECAR_GENERATION_HEADER: &str = "x-ingressbench-sidecar-generation";

/// The configuration generation a proxy stamps on every answer: which header, and its
/// value. The lab bumps it with every route change and reload, so the answers themselves
/// say when each proxy (each worker, each replica) started serving a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    /// The header's name ([`GENERATION_HEADER`] or [`SIDECAR_GENERATION_HEADER`]).
    pub header: &'static str,
    /// The generation, from 1.
    pub value: u32,
}

impl Default for Generation {
    fn default() -> Self {
        Self {
            header: GENERATION_HEADER,
            value: 1,
        }
    }
}

/// Everything a proxy serves: pools, routes, the overlay, TLS files and tuning.
/// Retries are off in every driver: a failed upstream request is an error the client
/// sees, so that what a proxy does on a backend's death is measured, not hidden.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteTable {
    /// Pools by name.
    pub pools: Vec<Pool>,
    /// Routes, most specific first.
    pub routes: Vec<Route>,
    /// Header, CORS and rewrite changes.
    pub overlay: Overlay,
    /// Tuning knobs.
    pub tuning: Tuning,
    /// The generation stamped on every answer.
    pub generation: Generation,
}

impl RouteTable {
    /// Checks every value that reaches a configuration file.
    pub fn validate(&self) -> Result<(), LabError> {
        for pool in &self.pools {
            check_name("pool", &pool.name)?;
        }
        for route in &self.routes {
            check_host(&route.host)?;
            check_path("path prefix", &route.path_prefix)?;
            if !self.pools.iter().any(|p| p.name == route.pool) {
                return Err(invalid("route pool", &route.pool, "no pool has that name"));
            }
        }
        if let Some((name, value)) = &self.overlay.response_header {
            check_name("response header name", name)?;
            check_header_value("response header value", value)?;
            if [
                GENERATION_HEADER,
                SIDECAR_GENERATION_HEADER,
                ROUTE_REVISION_HEADER,
            ]
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
            {
                return Err(invalid(
                    "response header name",
                    name,
                    "that header carries the lab's configuration generation or a route's revision; use another name",
                ));
            }
        }
        if let Some(origin) = &self.overlay.cors_origin {
            check_header_value("CORS origin", origin)?;
            if origin != "*" && !(origin.starts_with("http://") || origin.starts_with("https://")) {
                return Err(invalid(
                    "CORS origin",
                    origin,
                    "an origin such as https://app.example or *",
                ));
            }
        }
        if let Some((from, to)) = &self.overlay.rewrite {
            check_path("rewrite prefix", from)?;
            check_path("rewrite target", to)?;
        }
        if let Some(b) = self.tuning.listen_backlog {
            if b == 0 || b > i32::MAX as u32 {
                return Err(invalid(
                    "listen_backlog",
                    &b.to_string(),
                    "between 1 and 2147483647 (the kernel caps it at net.core.somaxconn)",
                ));
            }
        }
        if self.tuning.workers == 0 || self.tuning.workers > 256 {
            return Err(invalid(
                "workers",
                &self.tuning.workers.to_string(),
                "between 1 and 256",
            ));
        }
        Ok(())
    }

    /// Routes in matching order: the longest path prefix first within each host (proxies
    /// that take the first matching route, like HAProxy, Envoy and Caddy, need it; the
    /// others pick the longest match themselves).
    pub fn ordered_routes(&self) -> Vec<&Route> {
        let mut routes: Vec<&Route> = self.routes.iter().collect();
        routes.sort_by_key(|r| (r.host == "*", std::cmp::Reverse(r.path_prefix.len())));
        routes
    }

    /// The routes grouped by host, hosts in the order their first route comes in
    /// [`RouteTable::ordered_routes`] and each host's routes in that order (one pass: a
    /// proxy's virtual hosts for 10,000 routes).
    pub fn routes_by_host(&self) -> Vec<(&str, Vec<&Route>)> {
        let mut hosts: Vec<(&str, Vec<&Route>)> = Vec::new();
        let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for route in self.ordered_routes() {
            let i = *at.entry(route.host.as_str()).or_insert_with(|| {
                hosts.push((route.host.as_str(), Vec::new()));
                hosts.len() - 1
            });
            hosts[i].1.push(route);
        }
        hosts
    }

    /// The headers added to every answer: the overlay's, then the generation's.
    pub fn response_headers(&self) -> Vec<(&str, String)> {
        let overlay = self
            .overlay
            .response_header
            .iter()
            .map(|(name, value)| (name.as_str(), value.clone()));
        overlay
            .chain([(self.generation.header, self.generation.value.to_string())])
            .collect()
    }

    /// The headers added to the answers of `route`: [`RouteTable::response_headers`], then
    /// its revision once it has one.
    pub fn route_headers(&self, route: &Route) -> Vec<(&str, String)> {
        let mut headers = self.response_headers();
        if route.revision > 0 {
            headers.push((ROUTE_REVISION_HEADER, route.revision.to_string()));
        }
        headers
    }

    /// Whether `other` differs from this table in its endpoints only (same pools, routes,
    /// overlay, tuning and generation): the change a proxy can take without touching its
    /// routes.
    pub fn differs_only_in_endpoints(&self, other: &RouteTable) -> bool {
        self.routes == other.routes
            && self.overlay == other.overlay
            && self.tuning == other.tuning
            && self.generation == other.generation
            && self
                .pools
                .iter()
                .map(|p| &p.name)
                .eq(other.pools.iter().map(|p| &p.name))
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }
}

/// `Ok` when `ok`, else the error naming `field`, `value` and what would be valid.
fn require(ok: bool, field: &str, value: &str, reason: &str) -> Result<(), LabError> {
    if ok {
        Ok(())
    } else {
        Err(invalid(field, value, reason))
    }
}

fn invalid(field: &str, value: &str, reason: &str) -> LabError {
    LabError::InvalidValue {
        field: field.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

/// Names: letters, digits, `-` and `_`, 1-64 characters.
pub fn check_name(field: &str, value: &str) -> Result<(), LabError> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    require(ok, field, value, "use 1-64 letters, digits, '-' or '_'")
}

/// Host names: `*`, or DNS labels of letters, digits and `-` separated by dots.
pub fn check_host(value: &str) -> Result<(), LabError> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
    };
    let ok = value == "*" || (value.len() <= 253 && value.split('.').all(label_ok));
    require(
        ok,
        "host",
        value,
        "a host name such as app.test (letters, digits, '-', dots) or *",
    )
}

/// Paths: start with `/`, then unreserved URL characters and `/`.
pub fn check_path(field: &str, value: &str) -> Result<(), LabError> {
    let ok = value.starts_with('/')
        && value.len() <= 256
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-._~".contains(&b));
    require(
        ok,
        field,
        value,
        "a path such as /api/v1 (letters, digits, '/', '-', '.', '_', '~')",
    )
}

/// Header values: printable ASCII and spaces, none of the characters that end a value or a
/// directive in some proxy's syntax (quotes, `;`, `{`, `}`, `\`, `$`, `#`).
pub fn check_header_value(field: &str, value: &str) -> Result<(), LabError> {
    let ok = value.len() <= 256
        && value
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && !b"\"'`;{}\\$#%".contains(&b));
    require(
        ok && !value.trim().is_empty(),
        field,
        value,
        "printable text without quotes, ';', '{', '}', '\\', '$', '#' or '%'",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> RouteTable {
        RouteTable {
            pools: vec![Pool {
                name: "echo".into(),
                endpoints: vec!["127.0.0.1:8080".parse().unwrap()],
            }],
            routes: vec![Route {
                host: "app.test".into(),
                path_prefix: "/".into(),
                pool: "echo".into(),
                revision: 0,
            }],
            overlay: Overlay::default(),
            tuning: Tuning::default(),
            generation: Generation::default(),
        }
    }

    #[test]
    fn a_plain_table_is_valid() {
        table().validate().unwrap();
    }

    #[test]
    fn every_answer_carries_the_generation_after_the_overlay_header() {
        let mut t = table();
        t.generation.value = 3;
        assert_eq!(t.response_headers(), vec![(GENERATION_HEADER, "3".into())]);
        t.overlay.response_header = Some(("X-Lab".into(), "on".into()));
        assert_eq!(
            t.response_headers(),
            vec![("X-Lab", "on".into()), (GENERATION_HEADER, "3".into())]
        );
        let mut next = t.clone();
        next.generation.value = 4;
        assert!(!t.differs_only_in_endpoints(&next));
    }

    #[test]
    fn hostile_values_are_rejected_with_the_field_named() {
        type Mutation = Box<dyn Fn(&mut RouteTable)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (
                Box::new(|t| t.routes[0].host = "app.test; return 200".into()),
                "host",
            ),
            (Box::new(|t| t.routes[0].host = "a{{b}}".into()), "host"),
            (
                Box::new(|t| t.routes[0].path_prefix = "/x\"; }".into()),
                "path prefix",
            ),
            (
                Box::new(|t| {
                    t.overlay.response_header = Some(("X-A".into(), "v\nX-Injected: 1".into()))
                }),
                "response header value",
            ),
            (
                Box::new(|t| t.overlay.response_header = Some(("X-A".into(), "{{ .Env }}".into()))),
                "response header value",
            ),
            (
                Box::new(|t| t.overlay.response_header = Some(("X A".into(), "v".into()))),
                "response header name",
            ),
            (
                Box::new(|t| t.overlay.cors_origin = Some("https://x'; drop".into())),
                "CORS origin",
            ),
            (
                Box::new(|t| t.overlay.rewrite = Some(("/a".into(), "/b$1".into()))),
                "rewrite target",
            ),
            (Box::new(|t| t.pools[0].name = "echo pool".into()), "pool"),
            (
                Box::new(|t| {
                    t.overlay.response_header =
                        Some(("X-Ingressbench-Generation".into(), "7".into()))
                }),
                "response header name",
            ),
        ];
        for (mutate, field) in cases {
            let mut t = table();
            mutate(&mut t);
            let err = t.validate().unwrap_err().to_string();
            assert!(err.starts_with(&format!("invalid {field} ")), "{err}");
        }
    }

    #[test]
    fn generated_routes_spread_over_the_pools_and_know_their_index() {
        let pools = ["a".to_owned(), "b".to_owned()];
        let r = generated_route(7, &pools);
        assert_eq!((r.host.as_str(), r.pool.as_str()), ("r7.routes.test", "b"));
        assert_eq!(generated_index(&r), Some(7));
        let own = Route {
            host: "r7.app.test".into(),
            path_prefix: "/".into(),
            pool: "a".into(),
            revision: 0,
        };
        assert_eq!(generated_index(&own), None);
    }

    #[test]
    fn a_pool_change_sends_the_own_routes_and_leaves_the_generated_ones() {
        let pools = ["a".to_owned(), "b".to_owned()];
        let own = Route {
            host: "app.test".into(),
            path_prefix: "/".into(),
            pool: "a".into(),
            revision: 0,
        };
        let routes = [own, generated_route(0, &pools), generated_route(1, &pools)];
        let to_c = Overlay {
            pool: Some("c".into()),
            ..Overlay::default()
        };
        let pools_after: Vec<String> = to_c.reroute(&routes).into_iter().map(|r| r.pool).collect();
        assert_eq!(pools_after, ["c", "a", "b"]);
        assert_eq!(Overlay::default().reroute(&routes), routes);
        assert_eq!(to_c.describe(), "routes to c");
    }
}
