//! What a proxy itself counted, read once a second beside the load: failed connections to
//! backends, requests a backend broke off, retries, the 5xx it sent, the endpoints it
//! holds up, its configuration reloads. Each proxy counts some of these and names them
//! its own way; a name here is what the report compares with the client's errors, and a
//! proxy that does not count something has no value for it (never a 0 it did not say).
//!
//! Every source is one only the tool reaches: Envoy's admin interface and HAProxy's
//! runtime API on their Unix sockets in the proxy's 0700 directory, and nginx's error log
//! and Caddy's log there. Traefik counts upstream failures only in Prometheus metrics (off
//! in the lab: on, they cost CPU on every request, and would change the Traefik compared)
//! and in its access log (off, for the same reason); it is not read.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Duration;

use super::{ProxyFiles, ProxyKind};

/// Connections to a backend that could not be made (refused, reset, timed out).
pub const CONNECT_FAILURES: &str = "upstream_connect_failures";
/// Requests whose backend connection failed after it was made (closed or reset before
/// the answer was whole).
pub const RESPONSE_ERRORS: &str = "upstream_response_errors";
/// Requests sent again to another backend.
pub const RETRIES: &str = "retries";
/// 5xx answers the proxy sent to clients (its own and the backends').
pub const RESPONSES_5XX: &str = "responses_5xx";
/// Endpoints the proxy holds up now (a gauge).
pub const ENDPOINTS_UP: &str = "endpoints_up";
/// Configuration reloads (or updates) applied.
pub const CONFIG_RELOADS: &str = "config_reloads";

/// The count of the names above called `name` (as a file wrote it), if it is one.
pub fn named(name: &str) -> Option<&'static str> {
    [
        CONNECT_FAILURES,
        RESPONSE_ERRORS,
        RETRIES,
        RESPONSES_5XX,
        ENDPOINTS_UP,
        CONFIG_RELOADS,
    ]
    .into_iter()
    .find(|known| *known == name)
}

/// What a proxy counted, by the names above.
pub type Counted = BTreeMap<&'static str, u64>;

/// Each proxy's counts by its name, or why it could not be read.
pub type Readings = Vec<(String, Result<Counted, String>)>;

/// Why Traefik's counts are not read.
pub const TRAEFIK_NOT_READ: &str = "Traefik counts failed backend attempts only in its Prometheus metrics and its access log, both off in the lab (on, they cost CPU on every request and change the Traefik compared)";

/// The most of nginx's error log read at one reading (the rest is read at the next).
const LOG_READ_MAX: u64 = 4 << 20;

/// What reading needs kept between readings: where nginx's error log was read up to, and
/// what it held until there.
#[derive(Debug, Default)]
pub(crate) struct CounterState {
    log_offset: u64,
    log_counts: Counted,
    /// A line of the log was in the format it is read in.
    log_shaped: bool,
    /// The first line that was not, until one is.
    log_unshaped: Option<String>,
}

/// Envoy's counts through the admin interface on the Unix socket at `socket` (a cluster
/// controller's Envoy, such as Contour's).
pub fn envoy_admin(socket: &std::path::Path) -> Result<Counted, String> {
    let (status, body) = super::unix_request(socket, "GET", ENVOY_STATS, None)
        .map_err(|e| format!("Envoy's admin socket {}: {e}", socket.display()))?;
    if status != 200 {
        return Err(format!("Envoy's /stats answered {status}"));
    }
    Ok(envoy(&body))
}

/// HAProxy's counts through the runtime API on the Unix socket at `socket` (a cluster
/// controller's HAProxy, such as HAProxy Ingress's).
pub fn haproxy_stat(socket: &std::path::Path) -> Result<Counted, String> {
    Ok(haproxy(&haproxy_command(socket, "show stat")?))
}

/// Reads what the proxy counted so far.
pub(crate) fn read(
    kind: ProxyKind,
    files: &ProxyFiles,
    state: &mut CounterState,
) -> Result<Counted, String> {
    match kind {
        ProxyKind::Envoy => envoy_admin(&files.admin_socket),
        ProxyKind::Haproxy => haproxy_stat(&files.admin_socket),
        ProxyKind::Nginx => log_counts(&files.dir.join("error.log"), state, &NGINX),
        ProxyKind::Caddy => log_counts(&files.dir.join("proxy.log"), state, &CADDY),
        ProxyKind::Traefik => Err(TRAEFIK_NOT_READ.into()),
    }
}

/// Envoy's counters asked for: those whose names end as these (every cluster's, every
/// listener's), the filter a regular expression.
const ENVOY_STATS: &str = "/stats?filter=%28upstream_cx_connect_fail%7Cupstream_cx_connect_timeout%7Cupstream_cx_destroy_remote_with_active_rq%7Cupstream_rq_retry%7Cmembership_healthy%7Cdownstream_rq_5xx%7Cupdate_success%29%24";

/// The clusters an Envoy's controller defines for itself in its bootstrap, not for a
/// backend: Contour's xDS (`contour`) and stats (`envoy-admin`), Envoy Gateway's
/// (`xds_cluster`, `prometheus_stats`, `ratelimit_cluster`, `wasm_cluster`).
const NOT_BACKENDS: [&str; 6] = [
    "contour",
    "envoy-admin",
    "xds_cluster",
    "prometheus_stats",
    "ratelimit_cluster",
    "wasm_cluster",
];

/// Envoy's `/stats` text (`name: value` lines) summed into the names above: per cluster,
/// `upstream_cx_connect_fail` and `_timeout` (connects that failed), `upstream_cx_destroy_
/// remote_with_active_rq` (a backend closed with a request on it), `upstream_rq_retry`,
/// `membership_healthy`; per listener, `downstream_rq_5xx` (not the admin interface's);
/// and the discovery updates it accepted (`update_success`: listeners, clusters, and each
/// cluster's endpoints), its reloads.
fn envoy(stats: &str) -> Counted {
    let mut counted = Counted::new();
    for line in stats.lines() {
        let Some((name, value)) = line.split_once(": ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<u64>() else {
            continue;
        };
        let into = if let Some(cluster) = name.strip_prefix("cluster.") {
            // A controller's own clusters (its xDS server, its stats listener's) are no
            // backend's: their members are not endpoints up.
            if NOT_BACKENDS.iter().any(|c| {
                cluster
                    .strip_prefix(c)
                    .is_some_and(|rest| rest.starts_with('.') && rest[1..].find('.').is_none())
            }) {
                continue;
            }
            match name.rsplit('.').next() {
                Some("upstream_cx_connect_fail" | "upstream_cx_connect_timeout") => {
                    CONNECT_FAILURES
                }
                Some("upstream_cx_destroy_remote_with_active_rq") => RESPONSE_ERRORS,
                Some("upstream_rq_retry") => RETRIES,
                Some("membership_healthy") => ENDPOINTS_UP,
                // Its endpoints' discovery (EDS) accepted an update.
                Some("update_success") => CONFIG_RELOADS,
                _ => continue,
            }
        } else if name.starts_with("http.") && !name.starts_with("http.admin.") {
            if !name.ends_with(".downstream_rq_5xx") {
                continue;
            }
            RESPONSES_5XX
        } else if name == "listener_manager.lds.update_success"
            || name == "cluster_manager.cds.update_success"
        {
            CONFIG_RELOADS
        } else {
            continue;
        };
        *counted.entry(into).or_default() += value;
    }
    counted
}

/// One command to HAProxy's runtime API: its answer.
fn haproxy_command(path: &std::path::Path, command: &str) -> Result<String, String> {
    let fail = |e: std::io::Error| format!("HAProxy's runtime API ({}): {e}", path.display());
    let mut sock = std::os::unix::net::UnixStream::connect(path).map_err(fail)?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(fail)?;
    sock.write_all(format!("{command}\n").as_bytes())
        .map_err(fail)?;
    let mut answer = String::new();
    sock.read_to_string(&mut answer).map_err(fail)?;
    Ok(answer)
}

/// HAProxy's `show stat` CSV summed into the names above: the backends' `econ`
/// (connection errors), `eresp` (response errors: the server closed or reset), `wretr`
/// (retries) and `wredis` (redispatches, a retry on another server); the frontends'
/// `hrsp_5xx`; servers whose `status` is UP (or `no check`: not checked, not put down). A reload starts new processes whose counters
/// start again from 0 (the reader takes a fall as a new start).
fn haproxy(csv: &str) -> Counted {
    let mut lines = csv.lines();
    let Some(header) = lines.next().and_then(|h| h.strip_prefix("# ")) else {
        return Counted::new();
    };
    let columns: Vec<&str> = header.split(',').collect();
    let at = |name: &str| columns.iter().position(|c| *c == name);
    let (Some(sv), Some(econ), Some(eresp), Some(wretr), Some(wredis), Some(h5xx), Some(status)) = (
        at("svname"),
        at("econ"),
        at("eresp"),
        at("wretr"),
        at("wredis"),
        at("hrsp_5xx"),
        at("status"),
    ) else {
        return Counted::new();
    };
    let mut counted = Counted::new();
    for line in lines {
        let fields: Vec<&str> = line.split(',').collect();
        let number = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        match fields.get(sv).copied() {
            Some("BACKEND") => {
                *counted.entry(CONNECT_FAILURES).or_default() += number(econ);
                *counted.entry(RESPONSE_ERRORS).or_default() += number(eresp);
                *counted.entry(RETRIES).or_default() += number(wretr) + number(wredis);
            }
            Some("FRONTEND") => *counted.entry(RESPONSES_5XX).or_default() += number(h5xx),
            // Servers without health checks say `no check`: up unless put down.
            Some(_)
                if fields
                    .get(status)
                    .is_some_and(|s| s.starts_with("UP") || *s == "no check") =>
            {
                *counted.entry(ENDPOINTS_UP).or_default() += 1;
            }
            Some(_) => {
                counted.entry(ENDPOINTS_UP).or_default();
            }
            None => {}
        }
    }
    counted
}

/// A proxy's log, read as it grows: what each line counts toward, and every name it can
/// say (0 until a line says otherwise).
struct LogCounts {
    line: fn(&str) -> Option<&'static str>,
    names: &'static [&'static str],
    /// Whether a line is in the format `line` reads (the proxy's own, as it writes it):
    /// a log none of whose lines is says the counts cannot be read from it, instead of
    /// counting nothing without a word when a version changes its format.
    shaped: fn(&str) -> bool,
    /// The log's name, for that message.
    log: &'static str,
}

/// nginx counts upstream failures only in its error log (stub_status has connections and
/// requests, no upstreams). nginx does not say when it retried (`proxy_next_upstream`),
/// nor count its 5xx.
const NGINX: LogCounts = LogCounts {
    line: nginx_line,
    names: &[CONNECT_FAILURES, RESPONSE_ERRORS, CONFIG_RELOADS],
    shaped: nginx_shaped,
    log: "nginx's error.log",
};

/// An nginx error log line: `2026/11/26 10:00:00 [error] 1#1: …`.
fn nginx_shaped(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 21
        && [4, 7].iter().all(|&i| b[i] == b'/')
        && b[10] == b' '
        && [13, 16].iter().all(|&i| b[i] == b':')
        && line[19..].starts_with(" [")
}

/// A Caddy log line: a JSON object with its level, time and message.
fn caddy_shaped(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line)
        .is_ok_and(|v| v["level"].is_string() && v["ts"].is_number() && v["msg"].is_string())
}

/// Caddy logs each error its handlers return (`http.log.error`, at the default level),
/// with the status it sent: a failed dial to a backend, or a backend that broke off. Its
/// per-request metrics are off unless configured (and cost CPU on every request when on),
/// so its log is what says what it did.
const CADDY: LogCounts = LogCounts {
    line: caddy_line,
    names: &[CONNECT_FAILURES, RESPONSE_ERRORS],
    shaped: caddy_shaped,
    log: "Caddy's log",
};

/// The lines of the log at `path` written since the last reading, added to what was
/// counted before.
fn log_counts(
    path: &std::path::Path,
    state: &mut CounterState,
    counts: &LogCounts,
) -> Result<Counted, String> {
    let base = |state: &CounterState| {
        let mut counted = state.log_counts.clone();
        for name in counts.names {
            counted.entry(name).or_default();
        }
        counted
    };
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(base(state)),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len < state.log_offset {
        // Truncated or replaced: read it from its start.
        state.log_offset = 0;
    }
    file.seek(SeekFrom::Start(state.log_offset))
        .map_err(|e| e.to_string())?;
    let mut new = Vec::new();
    file.take(LOG_READ_MAX)
        .read_to_end(&mut new)
        .map_err(|e| e.to_string())?;
    // Whole lines only; a line still being written is read next time.
    let whole = new.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    state.log_offset += whole as u64;
    for line in String::from_utf8_lossy(&new[..whole]).lines() {
        if !state.log_shaped && !line.trim().is_empty() {
            if !(counts.shaped)(line) {
                state
                    .log_unshaped
                    .get_or_insert_with(|| line.chars().take(120).collect());
                continue;
            }
            state.log_shaped = true;
        }
        if let Some(name) = (counts.line)(line) {
            *state.log_counts.entry(name).or_default() += 1;
        }
    }
    if let (false, Some(first)) = (state.log_shaped, &state.log_unshaped) {
        return Err(format!(
            "{} ({}) is not in the format its counts are read from (its first line: {first:?}): the counts are unread",
            counts.log,
            path.display()
        ));
    }
    Ok(base(state))
}

/// Which count one nginx error log line adds to: `connect() failed … while connecting to
/// upstream`, `upstream timed out … while connecting` and `no live upstreams` are failed
/// connects; `upstream prematurely closed`, `recv() failed` and other `upstream` errors
/// while reading are response errors; a `reconfiguring` notice is a reload.
fn nginx_line(line: &str) -> Option<&'static str> {
    if line.contains("[notice]") && line.contains("reconfiguring") {
        return Some(CONFIG_RELOADS);
    }
    if !(line.contains("[error]") || line.contains("[crit]")) || !line.contains("upstream") {
        return None;
    }
    if line.contains("while connecting to upstream") || line.contains("no live upstreams") {
        Some(CONNECT_FAILURES)
    } else {
        Some(RESPONSE_ERRORS)
    }
}

/// Which count one line of Caddy's log adds to: an `http.log.error` whose message is a
/// failed dial (`dial tcp …`) is a failed connect; any other with a 502, 503 or 504 is a
/// backend that failed after it (closed, reset, timed out).
fn caddy_line(line: &str) -> Option<&'static str> {
    if !line.contains("\"logger\":\"http.log.error\"") {
        return None;
    }
    let entry: serde_json::Value = serde_json::from_str(line).ok()?;
    let msg = entry["msg"].as_str().unwrap_or_default();
    if msg.starts_with("dial tcp") || msg.contains("no upstreams available") {
        return Some(CONNECT_FAILURES);
    }
    matches!(entry["status"].as_u64(), Some(502..=504)).then_some(RESPONSE_ERRORS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_stats_sum_over_clusters_and_listeners() {
        let stats = "cluster.echo.upstream_cx_connect_fail: 3\n\
                     cluster.other.upstream_cx_connect_fail: 2\n\
                     cluster.echo.upstream_cx_connect_timeout: 1\n\
                     cluster.echo.upstream_rq_retry: 4\n\
                     cluster.echo.membership_healthy: 2\n\
                     cluster.echo.upstream_cx_destroy_remote_with_active_rq: 7\n\
                     http.ingress_http.downstream_rq_5xx: 9\n\
                     http.admin.downstream_rq_5xx: 100\n\
                     cluster_manager.cds.update_success: 1\n\
                     listener_manager.lds.update_success: 2\n\
                     cluster.echo.update_success: 50\n\
                     cluster.contour.membership_healthy: 1\n\
                     cluster.envoy-admin.membership_healthy: 1\n\
                     cluster.envoy-admin.upstream_rq_retry: 8\n";
        let c = envoy(stats);
        assert_eq!(c[CONNECT_FAILURES], 6);
        assert_eq!(c[RETRIES], 4);
        assert_eq!(c[ENDPOINTS_UP], 2);
        assert_eq!(c[RESPONSE_ERRORS], 7);
        assert_eq!(c[RESPONSES_5XX], 9);
        assert_eq!(c[CONFIG_RELOADS], 53);
    }

    #[test]
    fn haproxy_show_stat_sums_backends_and_counts_servers_up() {
        let csv = "# pxname,svname,qcur,econ,eresp,wretr,wredis,status,hrsp_5xx,\n\
                   web,FRONTEND,,,,,,OPEN,12,\n\
                   echo,s1,0,0,0,0,0,UP,0,\n\
                   echo,s2,0,3,1,2,1,DOWN,0,\n\
                   echo,s3,0,0,0,0,0,MAINT,0,\n\
                   echo,s4,0,0,0,0,0,no check,0,\n\
                   echo,BACKEND,0,3,1,2,1,UP,5,\n";
        let c = haproxy(csv);
        assert_eq!(c[CONNECT_FAILURES], 3);
        assert_eq!(c[RESPONSE_ERRORS], 1);
        assert_eq!(c[RETRIES], 3);
        assert_eq!(c[RESPONSES_5XX], 12);
        assert_eq!(c[ENDPOINTS_UP], 2);
        assert!(haproxy("not a csv").is_empty());
    }

    #[test]
    fn nginx_error_lines_are_counted_once_each_as_the_log_grows() {
        let dir = std::env::temp_dir().join(format!("ib-nginx-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("error.log");
        std::fs::write(&log, "2026/11/26 10:00:00 [error] 1#1: *5 connect() failed (111: Connection refused) while connecting to upstream, client: 127.0.0.1\n2026/11/26 10:00:00 [notice] 1#1: signal 1 (SIGHUP) received from 9, reconfiguring\n2026/11/26 10:00:00 [error] 1#1: *6 upstream prematurely closed connection while reading response header from upstream\n2026/11/26 10:00:00 [error] 1#1: *7 connect() fa").unwrap();
        let mut state = CounterState::default();
        let c = log_counts(&log, &mut state, &NGINX).unwrap();
        assert_eq!(
            (c[CONNECT_FAILURES], c[RESPONSE_ERRORS], c[CONFIG_RELOADS]),
            (1, 1, 1)
        );
        // The cut line is read once it is whole, and nothing twice.
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        writeln!(
            f,
            "iled (111: Connection refused) while connecting to upstream"
        )
        .unwrap();
        let c = log_counts(&log, &mut state, &NGINX).unwrap();
        assert_eq!((c[CONNECT_FAILURES], c[RESPONSE_ERRORS]), (2, 1));
        assert_eq!(
            log_counts(&log, &mut state, &NGINX).unwrap()[CONNECT_FAILURES],
            2
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_log_in_another_format_says_its_counts_are_unread() {
        let dir = std::env::temp_dir().join(format!("ib-log-format-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("error.log");
        std::fs::write(
            &log,
            "{\"level\":\"error\",\"msg\":\"connect() failed while connecting to upstream\"}\n",
        )
        .unwrap();
        let why = log_counts(&log, &mut CounterState::default(), &NGINX).unwrap_err();
        assert!(
            why.contains("not in the format") && why.contains("unread"),
            "{why}"
        );
        let why = log_counts(&log, &mut CounterState::default(), &CADDY).unwrap_err();
        assert!(why.contains("Caddy's log"), "{why}");
        // nginx's own lines, and Caddy's, are read.
        std::fs::write(
            &log,
            "2026/11/26 10:00:00 [notice] 1#1: start worker processes\n",
        )
        .unwrap();
        assert!(log_counts(&log, &mut CounterState::default(), &NGINX).is_ok());
        std::fs::write(
            &log,
            r#"{"level":"info","ts":1.5,"logger":"http","msg":"server running"}"#.to_owned() + "\n",
        )
        .unwrap();
        assert!(log_counts(&log, &mut CounterState::default(), &CADDY).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn caddy_error_lines_are_failed_dials_or_broken_responses() {
        let dial = r#"{"level":"error","ts":1.0,"logger":"http.log.error","msg":"dial tcp 127.0.0.1:43177: connect: connection refused","status":502}"#;
        let eof =
            r#"{"level":"error","ts":1.0,"logger":"http.log.error","msg":"EOF","status":502}"#;
        let other = r#"{"level":"warn","ts":1.0,"logger":"http","msg":"automatic HTTPS is completely disabled for server"}"#;
        let not_found =
            r#"{"level":"error","ts":1.0,"logger":"http.log.error","msg":"no route","status":404}"#;
        assert_eq!(caddy_line(dial), Some(CONNECT_FAILURES));
        assert_eq!(caddy_line(eof), Some(RESPONSE_ERRORS));
        assert_eq!(caddy_line(other), None);
        assert_eq!(caddy_line(not_found), None);
    }
}
