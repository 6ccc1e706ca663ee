//! nginx: the configuration is rewritten and the master reloaded with SIGHUP, as classic
//! ingress-nginx did for every endpoint change.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::{create_dir, write_atomically, Driver, Launch, ProxyFiles, Update};
use crate::model::{RouteTable, UpstreamProtocol};
use crate::process::OwnedChild;
use crate::LabError;

/// The nginx driver.
#[derive(Debug, Default)]
pub(crate) struct Nginx {
    /// Started from a shell that leaves once the master has written its pid (ready for a
    /// binary upgrade).
    pub(crate) detached: bool,
}

impl Driver for Nginx {
    fn start(&mut self, files: &ProxyFiles, table: &RouteTable) -> Result<Launch, LabError> {
        for sub in ["body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            let path = files.dir.join("tmp").join(sub);
            create_dir(&path)?;
        }
        write_atomically(&files.config_path("nginx.conf"), &render(files, table))?;
        let args = vec![
            "-p".into(),
            files.dir.display().to_string(),
            "-c".into(),
            files.config_path("nginx.conf").display().to_string(),
            "-e".into(),
            files.dir.join("error.log").display().to_string(),
        ];
        // A binary upgrade is refused by a master whose parent is the one it started
        // with (nginx takes that for a new binary whose old master still runs): started
        // from a shell that leaves once the master has written its pid, the master is
        // then its own, as under a service manager.
        let pid_file = files.dir.join("nginx.pid");
        let _ = std::fs::remove_file(&pid_file);
        Ok(Launch {
            args,
            env: Vec::new(),
            detached: self.detached.then_some(pid_file),
        })
    }

    fn update(
        &mut self,
        child: &OwnedChild,
        files: &ProxyFiles,
        table: &RouteTable,
    ) -> Result<Update, LabError> {
        write_atomically(&files.config_path("nginx.conf"), &render(files, table))?;
        child
            .signal(rustix::process::Signal::HUP)
            .map_err(|e| LabError::Update {
                kind: "nginx".into(),
                mechanism: "SIGHUP reload",
                reason: e.to_string(),
            })?;
        Ok(Update {
            mechanism: "config rewrite + SIGHUP reload",
            ends_connections: true,
        })
    }
}

/// nginx's binary upgrade, as its documentation gives it: the configuration for `table`
/// written, USR2 to the master (it renames its pid file `nginx.pid.oldbin` and starts a new
/// master from the binary, which inherits the listening sockets), then once the new master
/// has written its pid file and started a worker, WINCH to the old master (its workers
/// stop gracefully) and QUIT (it exits once they have). `child` hands over to the new
/// master, which is in the same process group.
pub(crate) fn binary_upgrade(
    child: &mut OwnedChild,
    files: &ProxyFiles,
    table: &RouteTable,
) -> Result<(), LabError> {
    use rustix::process::Signal;
    let failed = |reason: String| LabError::Update {
        kind: "nginx".into(),
        mechanism: "binary upgrade",
        reason,
    };
    write_atomically(&files.config_path("nginx.conf"), &render(files, table))?;
    let old = child.pid();
    if old == child.pgid() {
        return Err(failed(
            "this nginx was started as the tool's own child, and its master ignores USR2 then (a lab is started ready for an upgrade only when its scenario has an upgrade event)".into(),
        ));
    }
    let pid_file = files.dir.join("nginx.pid");
    child
        .signal(Signal::USR2)
        .map_err(|e| failed(format!("USR2 to the master {old}: {e}")))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let new = loop {
        let written = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .filter(|&pid| pid != old && crate::process::process_alive(pid));
        if let Some(pid) = written.filter(|&pid| has_child(pid)) {
            break pid;
        }
        if Instant::now() > deadline {
            return Err(failed(format!(
                "no new master with a worker 10 s after USR2 (its log: {})",
                files.dir.join("error.log").display()
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    for signal in [Signal::WINCH, Signal::QUIT] {
        child
            .signal(signal)
            .map_err(|e| failed(format!("{signal:?} to the old master {old}: {e}")))?;
    }
    child.hand_over(new);
    Ok(())
}

/// Whether process `pid` has a child (nginx's master, a worker).
fn has_child(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .is_ok_and(|c| !c.trim().is_empty())
}

fn render(files: &ProxyFiles, table: &RouteTable) -> String {
    let t = &table.tuning;
    let dir = files.dir.display();
    let mut c = String::new();
    let _ = writeln!(
        c,
        "# Rendered by ingressbench; rewritten and reloaded (SIGHUP) on every change."
    );
    let _ = writeln!(c, "worker_processes {};", t.workers);
    if let Some(drain) = t.drain {
        let _ = writeln!(c, "worker_shutdown_timeout {}ms;", drain.as_millis());
    }
    let _ = writeln!(
        c,
        "daemon off;\nmaster_process on;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log notice;"
    );
    let _ = writeln!(
        c,
        "worker_rlimit_nofile 65536;\nevents {{ worker_connections 16384; }}\nhttp {{"
    );
    let _ = writeln!(c, "  access_log off;");
    for sub in ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"] {
        let name = if sub == "client_body" { "body" } else { sub };
        let _ = writeln!(c, "  {sub}_temp_path {dir}/tmp/{name};");
    }
    if let Some(n) = t.keepalive_requests {
        let _ = writeln!(c, "  keepalive_requests {n};");
    }
    let _ = writeln!(c, "  keepalive_timeout 75s;");
    // No request body limit, as the other four have none by default (nginx's own is
    // 1 MiB: a 413 there would measure a default, not the proxy). Bodies over the
    // buffer go to tmp/body, which is the lab user's.
    let _ = writeln!(c, "  client_max_body_size 0;");
    let _ = writeln!(c, "  proxy_http_version 1.1;");
    // WebSockets pass as nginx documents it: the client's Upgrade on to the upstream, with
    // `Connection: upgrade`; every other request keeps an empty Connection, so the
    // upstream's connections stay alive.
    let _ = writeln!(
        c,
        "  map $http_upgrade $connection_upgrade {{ default upgrade; '' ''; }}"
    );
    let _ = writeln!(
        c,
        "  proxy_connect_timeout {}ms;\n  proxy_read_timeout {}ms;\n  proxy_send_timeout {}ms;",
        t.connect_timeout_ms, t.read_timeout_ms, t.read_timeout_ms
    );
    let _ = writeln!(c, "  # Retries off: a failed upstream request is an error the client sees.\n  proxy_next_upstream off;");
    let grpc = t.upstream_protocol == UpstreamProtocol::Grpc;
    if grpc {
        // gRPC to the backends (HTTP/2 with prior knowledge), its timeouts as the proxy's.
        let _ = writeln!(
            c,
            "  grpc_connect_timeout {}ms;\n  grpc_read_timeout {}ms;\n  grpc_send_timeout {}ms;\n  grpc_next_upstream off;",
            t.connect_timeout_ms, t.read_timeout_ms, t.read_timeout_ms
        );
    }
    for pool in &table.pools {
        let _ = writeln!(c, "  upstream pool_{} {{", pool.name);
        if pool.endpoints.is_empty() {
            // nginx needs one server per upstream; this one is never used.
            let _ = writeln!(c, "    server 127.0.0.1:9 down;");
        }
        for ep in &pool.endpoints {
            let _ = writeln!(c, "    server {ep};");
        }
        let _ = writeln!(c, "    keepalive {};\n  }}", t.upstream_keepalive);
    }
    // Listen options go once per address, on its default server.
    let backlog = t
        .listen_backlog
        .map(|b| format!(" backlog={b}"))
        .unwrap_or_default();
    let listen = |c: &mut String, default: bool| {
        let d = if default {
            format!(" default_server{backlog}")
        } else {
            String::new()
        };
        let _ = writeln!(c, "    listen {}:{}{d};", files.ip, files.http_port);
        if let Some(tls) = &files.tls {
            // `http2` on the TLS listener offers h2 by ALPN beside http/1.1 (nginx 1.22's
            // syntax; 1.25 moved it to `http2 on;`). The plain port stays HTTP/1.1: nginx's
            // h2c is prior knowledge only, which would refuse HTTP/1.1 there.
            let _ = writeln!(c, "    listen {}:{} ssl http2{d};", files.ip, tls.port);
            // TLS 1.3 as the other four proxies and ingress-nginx negotiate; nginx before
            // 1.23.4 (Debian 12 ships 1.22) leaves it out by default.
            let _ = writeln!(
                c,
                "    ssl_certificate {};\n    ssl_certificate_key {};\n    ssl_protocols TLSv1.2 TLSv1.3;",
                tls.cert.display(),
                tls.key.display()
            );
        }
    };
    let hosts = table.routes_by_host();
    if !hosts.iter().any(|(host, _)| *host == "*") {
        let _ = writeln!(c, "  server {{");
        listen(&mut c, true);
        let _ = writeln!(c, "    server_name _;\n    return 404;\n  }}");
    }
    for (host, routes) in hosts {
        let _ = writeln!(c, "  server {{");
        listen(&mut c, host == "*");
        let _ = writeln!(
            c,
            "    server_name {};",
            if host == "*" { "_" } else { host }
        );
        for route in routes {
            let _ = writeln!(c, "    location {} {{", route.path_prefix);
            if let Some((from, to)) = &table.overlay.rewrite {
                let _ = writeln!(c, "      rewrite ^{from}(.*)$ {to}$1 break;");
            }
            if grpc {
                let _ = writeln!(c, "      grpc_pass grpc://pool_{};", route.pool);
            } else {
                let _ = writeln!(c, "      proxy_pass http://pool_{};", route.pool);
            }
            let _ = writeln!(
                c,
                "      proxy_set_header Host $host;\n      proxy_set_header Upgrade $http_upgrade;\n      proxy_set_header Connection $connection_upgrade;"
            );
            for (name, value) in table.route_headers(route) {
                let _ = writeln!(c, "      add_header {name} \"{value}\" always;");
            }
            if let Some(origin) = &table.overlay.cors_origin {
                let _ = writeln!(
                    c,
                    "      add_header Access-Control-Allow-Origin \"{origin}\" always;"
                );
                let _ = writeln!(c, "      add_header Access-Control-Allow-Methods \"GET, POST, PUT, DELETE, OPTIONS\" always;");
                let _ = writeln!(c, "      add_header Vary Origin always;");
            }
            let _ = writeln!(c, "    }}");
        }
        let _ = writeln!(c, "  }}");
    }
    let _ = writeln!(c, "}}");
    c
}
