//! HAProxy: endpoint changes through the runtime API on the admin socket, into server
//! slots allocated up front (as HAProxy's ingress controllers do); anything else (routes,
//! headers, CORS, rewrites, more endpoints than slots) by a master-worker reload (SIGUSR2).
//! Routes of a whole host are a map lookup (`hosts.map`), so 10,000 of them cost a tree
//! search per request, not 10,000 rules.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::{write_atomically, Driver, Launch, ProxyFiles, Update};
use crate::model::{RouteTable, UpstreamProtocol, ROUTE_REVISION_HEADER};
use crate::process::OwnedChild;
use crate::LabError;

/// Server slots per pool: at least this many, and twice the pool's size at start.
const MIN_SLOTS: usize = 16;

/// How endpoint changes reach HAProxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HaproxyUpdate {
    /// `set server … addr/state` on the admin socket: no reload.
    #[default]
    RuntimeApi,
    /// Rewrite the configuration and reload the master (SIGUSR2).
    Reload,
}

/// The HAProxy driver.
#[derive(Debug, Default)]
pub(crate) struct Haproxy {
    mode: HaproxyUpdate,
    /// Per pool, which endpoint each server slot holds.
    slots: BTreeMap<String, Vec<Option<SocketAddr>>>,
    /// The table as last rendered to the configuration file.
    rendered: Option<RouteTable>,
    /// The master's reload counts before the last reload it was asked for, until it is
    /// seen to have counted it.
    reloading: Option<(u64, u64)>,
}

impl Haproxy {
    pub(crate) fn new(mode: HaproxyUpdate) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    fn assign_slots_fresh(&mut self, table: &RouteTable) {
        self.slots = table
            .pools
            .iter()
            .map(|p| {
                let n = MIN_SLOTS.max(p.endpoints.len() * 2);
                let mut slots: Vec<Option<SocketAddr>> =
                    p.endpoints.iter().copied().map(Some).collect();
                slots.resize(n, None);
                (p.name.clone(), slots)
            })
            .collect();
    }

    /// Renders `table` with fresh slots into haproxy.cfg (and its whole-host routes into
    /// the hosts map it reads) and remembers it.
    fn write_config(&mut self, files: &ProxyFiles, table: &RouteTable) -> Result<(), LabError> {
        self.assign_slots_fresh(table);
        write_atomically(&files.config_path(HOSTS_MAP), &hosts_map(table))?;
        write_atomically(&files.config_path(REVISIONS_MAP), &revisions_map(table)?)?;
        write_atomically(
            &files.config_path("haproxy.cfg"),
            &self.render(files, table),
        )?;
        self.rendered = Some(table.clone());
        Ok(())
    }

    fn reload(
        &mut self,
        child: &OwnedChild,
        files: &ProxyFiles,
        table: &RouteTable,
    ) -> Result<Update, LabError> {
        // A SIGUSR2 that reaches the master while it still re-executes for the last one
        // is lost, so a reload first waits until the master has counted the one before
        // (a controller must); the proxies are told as soon as the signal goes, so the
        // change's applied time is when HAProxy was asked, as for the other proxies.
        if let Some(before) = self.reloading.take() {
            wait_for_reload(files, before)?;
        }
        self.write_config(files, table)?;
        let before = master_reloads_once_listening(files)?;
        child
            .signal(rustix::process::Signal::USR2)
            .map_err(|e| LabError::Update {
                kind: "haproxy".into(),
                mechanism: "SIGUSR2 reload",
                reason: e.to_string(),
            })?;
        self.reloading = Some(before);
        Ok(Update {
            mechanism: "config rewrite + master-worker reload (SIGUSR2)",
            ends_connections: true,
        })
    }

    /// Only endpoints changed, and they fit the slots: runtime API commands for the change.
    fn runtime_commands(&mut self, table: &RouteTable) -> Option<Vec<String>> {
        let rendered = self.rendered.as_ref()?;
        let same_shape = rendered.differs_only_in_endpoints(table);
        if !same_shape {
            return None;
        }
        let mut next = self.slots.clone();
        let mut commands = Vec::new();
        for pool in &table.pools {
            let slots = next.get_mut(&pool.name)?;
            // Endpoints that left: their slots go to maintenance.
            for (i, slot) in slots.iter_mut().enumerate() {
                if slot.is_some_and(|ep| !pool.endpoints.contains(&ep)) {
                    *slot = None;
                    commands.push(format!(
                        "set server be_{}/s{} state maint",
                        pool.name,
                        i + 1
                    ));
                }
            }
            // New endpoints: the first free slot gets the address and is made ready.
            let arriving: Vec<SocketAddr> = pool
                .endpoints
                .iter()
                .copied()
                .filter(|ep| !slots.contains(&Some(*ep)))
                .collect();
            for ep in &arriving {
                let i = slots.iter().position(Option::is_none)?;
                slots[i] = Some(*ep);
                commands.push(format!(
                    "set server be_{}/s{} addr {} port {}",
                    pool.name,
                    i + 1,
                    ep.ip(),
                    ep.port()
                ));
                commands.push(format!(
                    "set server be_{}/s{} state ready",
                    pool.name,
                    i + 1
                ));
            }
        }
        self.slots = next;
        Some(commands)
    }

    fn render(&self, files: &ProxyFiles, table: &RouteTable) -> String {
        let t = &table.tuning;
        let dir = files.dir.display();
        let mut c = String::new();
        let _ = writeln!(
            c,
            "# Rendered by ingressbench. Endpoint changes arrive through the runtime API"
        );
        let _ = writeln!(
            c,
            "# (admin.sock) into pre-allocated server slots; other changes reload (SIGUSR2)."
        );
        let _ = writeln!(
            c,
            "global\n  nbthread {}\n  maxconn {}",
            t.workers,
            max_connections()
        );
        let _ = writeln!(
            c,
            "  stats socket {} mode 600 level admin expose-fd listeners\n  pidfile {dir}/haproxy.pid",
            files.admin_socket.display()
        );
        if let Some(drain) = t.drain {
            let _ = writeln!(c, "  hard-stop-after {}ms", drain.as_millis());
        }
        let _ = writeln!(c, "defaults\n  mode http\n  option http-keep-alive");
        if t.no_delay {
            let _ = writeln!(c, "  option http-no-delay");
        }
        let _ = writeln!(
            c,
            "  timeout connect {}ms\n  timeout server {}ms",
            t.connect_timeout_ms, t.read_timeout_ms
        );
        let _ = writeln!(c, "  timeout client 75s\n  timeout http-keep-alive 75s");
        let _ = writeln!(
            c,
            "  # Retries off: a failed upstream request is an error the client sees.\n  retries 0"
        );
        let _ = writeln!(c, "frontend fe\n  bind {}:{}", files.ip, files.http_port);
        if let Some(b) = t.listen_backlog {
            let _ = writeln!(c, "  backlog {b}");
        }
        if let Some(tls) = &files.tls {
            let _ = writeln!(
                c,
                "  bind {}:{} ssl crt {} alpn h2,http/1.1",
                files.ip,
                tls.port,
                tls.combined.display()
            );
        }
        for (name, value) in table.response_headers() {
            let _ = writeln!(c, "  http-after-response set-header {name} \"{value}\"");
        }
        if let Some(origin) = &table.overlay.cors_origin {
            let _ = writeln!(
                c,
                "  http-after-response set-header Access-Control-Allow-Origin \"{origin}\""
            );
            let _ = writeln!(c, "  http-after-response set-header Access-Control-Allow-Methods \"GET, POST, PUT, DELETE, OPTIONS\"");
            let _ = writeln!(c, "  http-after-response set-header Vary Origin");
        }
        // Routes of a whole host (path `/`) are one lookup in a map of host to backend, a
        // tree whatever its size, as HAProxy's ingress controllers render them; the rest
        // are rules in order. Whole-host routes come after a host's longer paths and before
        // any host's, so the lookup goes there.
        let mut looked_up = false;
        for route in table.ordered_routes() {
            if by_host(route) {
                if !looked_up {
                    looked_up = true;
                    let _ = writeln!(
                        c,
                        "  http-request set-var(txn.host_pool) req.hdr(host),field(1,:),lower,map_str({})",
                        files.config_path(HOSTS_MAP).display()
                    );
                    let _ = writeln!(
                        c,
                        "  use_backend %[var(txn.host_pool)] if {{ var(txn.host_pool) -m found }}"
                    );
                }
                continue;
            }
            let host = if route.host == "*" {
                String::new()
            } else {
                format!("{{ req.hdr(host),field(1,:) -i {} }} ", route.host)
            };
            let _ = writeln!(
                c,
                "  use_backend be_{} if {host}{{ path_beg {} }}",
                route.pool, route.path_prefix
            );
        }
        // A changed route's revision: one lookup of the host in the revisions map (only
        // whole-host routes have one here; see `revisions_map`).
        if table.routes.iter().any(|r| r.revision > 0) {
            let _ = writeln!(
                c,
                "  http-request set-var(txn.route_revision) req.hdr(host),field(1,:),lower,map_str({})",
                files.config_path(REVISIONS_MAP).display()
            );
            let _ = writeln!(
                c,
                "  http-after-response set-header {ROUTE_REVISION_HEADER} %[var(txn.route_revision)] if {{ var(txn.route_revision) -m found }}"
            );
        }
        let _ = writeln!(c, "  default_backend be_not_found");
        let _ = writeln!(c, "backend be_not_found\n  http-request return status 404");
        for pool in &table.pools {
            let _ = writeln!(
                c,
                "backend be_{}\n  balance roundrobin\n  http-reuse safe",
                pool.name
            );
            let _ = writeln!(
                c,
                "  default-server pool-max-conn {}{}",
                t.upstream_keepalive,
                match t.upstream_protocol {
                    UpstreamProtocol::Http1 => "",
                    UpstreamProtocol::Http2 | UpstreamProtocol::Grpc => " proto h2",
                }
            );
            if let Some((from, to)) = &table.overlay.rewrite {
                let _ = writeln!(c, "  http-request replace-path ^{from}(.*) {to}\\1");
            }
            for (i, slot) in self.slots.get(&pool.name).into_iter().flatten().enumerate() {
                match slot {
                    Some(ep) => {
                        let _ = writeln!(c, "  server s{} {ep}", i + 1);
                    }
                    None => {
                        let _ = writeln!(c, "  server s{} 127.0.0.1:9 disabled", i + 1);
                    }
                }
            }
        }
        c
    }
}

impl Driver for Haproxy {
    fn start(&mut self, files: &ProxyFiles, table: &RouteTable) -> Result<Launch, LabError> {
        // A new master (a restart) has counted no reload of the old one's.
        self.reloading = None;
        self.write_config(files, table)?;
        let args = vec![
            "-W".into(),
            "-S".into(),
            format!("{},mode,600", master_socket(files).display()),
            "-f".into(),
            files.config_path("haproxy.cfg").display().to_string(),
        ];
        Ok(Launch {
            args,
            env: Vec::new(),
            detached: None,
        })
    }

    fn update(
        &mut self,
        child: &OwnedChild,
        files: &ProxyFiles,
        table: &RouteTable,
    ) -> Result<Update, LabError> {
        if self.mode == HaproxyUpdate::RuntimeApi {
            if let Some(commands) = self.runtime_commands(table) {
                if !commands.is_empty() {
                    admin_command(files, &commands.join("; "))?;
                }
                return Ok(Update {
                    mechanism: "runtime API (set server addr/state on the admin socket)",
                    ends_connections: false,
                });
            }
        }
        self.reload(child, files, table)
    }
}

/// The map of whole-host routes (host to backend), beside haproxy.cfg.
const HOSTS_MAP: &str = "hosts.map";

/// A route of a whole host (one name, every path): a line of the hosts map.
fn by_host(route: &crate::model::Route) -> bool {
    route.host != "*" && route.path_prefix == "/"
}

/// The hosts map: `host be_POOL` per whole-host route, in the routes' order (the first
/// line of a host wins, as the first rule would).
fn hosts_map(table: &RouteTable) -> String {
    let mut map =
        String::from("# Rendered by ingressbench: host -> backend, for routes of a whole host.\n");
    for route in table.ordered_routes().into_iter().filter(|r| by_host(r)) {
        let _ = writeln!(map, "{} be_{}", route.host.to_ascii_lowercase(), route.pool);
    }
    map
}

/// The map of changed routes' revisions (host to revision), beside haproxy.cfg.
const REVISIONS_MAP: &str = "revisions.map";

/// The revisions map: `host revision` per changed route. A revision is looked up by host,
/// so only a route that is its host's one route may have one (generated routes are):
/// any other is refused rather than answered with another route's revision.
fn revisions_map(table: &RouteTable) -> Result<String, LabError> {
    let shared: std::collections::HashSet<&str> = table
        .routes
        .iter()
        .filter(|r| !by_host(r))
        .map(|r| r.host.as_str())
        .collect();
    let mut map =
        String::from("# Rendered by ingressbench: host -> revision, for changed routes.\n");
    for route in table.routes.iter().filter(|r| r.revision > 0) {
        if !by_host(route) || shared.contains(route.host.as_str()) {
            return Err(LabError::InvalidValue {
                field: "route revision".into(),
                value: format!("{}{}", route.host, route.path_prefix),
                reason: "the HAProxy driver changes only routes that are their host's one route (every path)".into(),
            });
        }
        let _ = writeln!(
            map,
            "{} {}",
            route.host.to_ascii_lowercase(),
            route.revision
        );
    }
    Ok(map)
}

/// As many connections as the file-descriptor limit allows (two descriptors each, as
/// HAProxy counts them), at most 50,000.
pub(crate) fn max_connections() -> u64 {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .unwrap_or(65_536);
    (limit.saturating_sub(200) / 2).clamp(256, 50_000)
}

/// The master CLI's socket, beside the admin socket (mode 600 in the lab's private
/// directory, as the admin socket is).
fn master_socket(files: &ProxyFiles) -> std::path::PathBuf {
    files.admin_socket.with_file_name("master.sock")
}

/// The master's reloads so far, and how many of them failed (`show proc` on the master
/// CLI; it answers once the master is in its loop, ready for the next signal).
fn master_reloads(files: &ProxyFiles) -> Result<(u64, u64), LabError> {
    let fail = |reason: String| LabError::Update {
        kind: "haproxy".into(),
        mechanism: "master CLI",
        reason,
    };
    let path = master_socket(files);
    let mut sock = UnixStream::connect(&path)
        .map_err(|e| fail(format!("cannot connect to {}: {e}", path.display())))?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| fail(e.to_string()))?;
    sock.write_all(b"show proc\n")
        .and_then(|()| sock.shutdown(std::net::Shutdown::Write))
        .map_err(|e| fail(e.to_string()))?;
    let mut answer = String::new();
    sock.read_to_string(&mut answer)
        .map_err(|e| fail(e.to_string()))?;
    parse_master_reloads(&answer)
        .ok_or_else(|| fail(format!("`show proc` named no master: {}", answer.trim())))
}

/// The master's reloads so far, waiting (at most 10 s) for its CLI to listen: the worker
/// serves a few milliseconds before the master accepts on its CLI (measured with HAProxy
/// 2.6: refused every time, for 6-7 ms, right after the first response), so a reload
/// asked for just after a start finds the socket refusing.
fn master_reloads_once_listening(files: &ProxyFiles) -> Result<(u64, u64), LabError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match master_reloads(files) {
            Err(e) if std::time::Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
            counted => return counted,
        }
    }
}

/// `30313  master  2 [failed: 0]  0d00h00m01s  2.6.12` -> (2, 0).
fn parse_master_reloads(show_proc: &str) -> Option<(u64, u64)> {
    let line = show_proc
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("master"))?;
    let mut fields = line.split_whitespace().skip(2);
    let reloads = fields.next()?.parse().ok()?;
    let failed = match (fields.next(), fields.next()) {
        (Some("[failed:"), Some(n)) => n.trim_end_matches(']').parse().ok()?,
        _ => 0,
    };
    Some((reloads, failed))
}

/// Waits until the master has counted a reload past `before` (at most 30 s): a reload
/// asked for while the master still re-executes for the last one is lost (seen in the
/// lab: the second of two SIGUSR2 50 ms apart, under load, never happened), so the next
/// reload waits for this one, as HAProxy's controllers do. A reload the master counts as
/// failed is an error naming the log.
fn wait_for_reload(files: &ProxyFiles, before: (u64, u64)) -> Result<(), LabError> {
    let fail = |reason: String| LabError::Update {
        kind: "haproxy".into(),
        mechanism: "SIGUSR2 reload",
        reason,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((reloads, failed)) = master_reloads(files) {
            if failed > before.1 {
                return Err(fail(format!(
                    "HAProxy's master counts the reload as failed; see {}",
                    files.dir.join("proxy.log").display()
                )));
            }
            if reloads > before.0 {
                return Ok(());
            }
        }
        if std::time::Instant::now() > deadline {
            return Err(fail(
                "the master has not reloaded 30 s after SIGUSR2; see the proxy log".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends commands to the admin socket and checks the answer for errors.
fn admin_command(files: &ProxyFiles, commands: &str) -> Result<String, LabError> {
    let fail = |reason: String| LabError::Update {
        kind: "haproxy".into(),
        mechanism: "runtime API",
        reason,
    };
    let path = &files.admin_socket;
    let mut sock = UnixStream::connect(path)
        .map_err(|e| fail(format!("cannot connect to {}: {e}", path.display())))?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| fail(e.to_string()))?;
    sock.write_all(format!("{commands}\n").as_bytes())
        .map_err(|e| fail(e.to_string()))?;
    let mut answer = String::new();
    sock.read_to_string(&mut answer)
        .map_err(|e| fail(e.to_string()))?;
    let lowered = answer.to_ascii_lowercase();
    if [
        "no such",
        "unknown",
        "invalid",
        "require",
        "not found",
        "error",
    ]
    .iter()
    .any(|w| lowered.contains(w))
    {
        return Err(fail(format!("`{commands}` answered: {}", answer.trim())));
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{generated_route, Generation, Overlay, Pool, Tuning};

    #[test]
    fn no_delay_passes_each_piece_of_a_response_on_as_it_comes() {
        let pools = vec!["echo".to_owned()];
        let mut table = RouteTable {
            pools: vec![Pool {
                name: "echo".into(),
                endpoints: vec!["127.0.0.1:8080".parse().unwrap()],
            }],
            routes: vec![generated_route(0, &pools)],
            overlay: Overlay::default(),
            tuning: Tuning::default(),
            generation: Generation::default(),
        };
        let files = ProxyFiles {
            dir: "/lab/haproxy".into(),
            ip: "127.0.0.1".parse().unwrap(),
            http_port: 8000,
            admin_socket: "/lab/haproxy/admin.sock".into(),
            tls: None,
        };
        let haproxy = Haproxy::new(HaproxyUpdate::default());
        assert!(!haproxy.render(&files, &table).contains("http-no-delay"));
        table.tuning.no_delay = true;
        let text = haproxy.render(&files, &table);
        let defaults = text.split("defaults").nth(1).unwrap();
        assert!(
            defaults
                .split("frontend")
                .next()
                .unwrap()
                .contains("  option http-no-delay\n"),
            "{text}"
        );
    }

    #[test]
    fn the_master_reload_count_is_read_from_show_proc() {
        let answer = "#<PID>          <type>          <reloads>       <uptime>        <version>\n\
                      30313           master          2 [failed: 1]   0d00h00m01s     2.6.12-1+deb12u4\n\
                      # workers\n\
                      30316           worker          0               0d00h00m01s     2.6.12-1+deb12u4\n";
        assert_eq!(parse_master_reloads(answer), Some((2, 1)));
        assert_eq!(parse_master_reloads("# workers\n1 worker 0\n"), None);
    }
}
