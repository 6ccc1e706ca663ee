//! Envoy: dynamic resources from files, as a control plane would serve them. Listeners
//! (LDS), clusters (CDS), endpoints (EDS, one file per pool) and routes (RDS) each live in
//! a file Envoy watches; a change replaces the file by a rename, and Envoy applies it
//! without a restart. An endpoint change touches only the pool's EDS file. With TLS, a
//! QUIC listener on the TLS port's UDP twin serves HTTP/3 with the same routes. The admin
//! interface listens on a Unix socket (mode 0600) in the proxy's directory only.

use std::time::Duration;

use serde_json::{json, Value};

use super::{create_dir, write_json, Driver, Launch, ProxyFiles, Update, UpstreamMtls};
use crate::model::{RouteTable, ROUTE_REVISION_HEADER};
use crate::process::OwnedChild;
use crate::LabError;

fn base_id_path(files: &ProxyFiles) -> std::path::PathBuf {
    files.dir.join("base-id")
}

/// The base id the running Envoy picked (hot restart).
pub(crate) fn base_id(files: &ProxyFiles) -> Option<u64> {
    std::fs::read_to_string(base_id_path(files))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The arguments of the next epoch's Envoy, from `launch` (the first's): the same
/// configuration, `--restart-epoch epoch` with the running one's base id, which the new
/// process finds the old by; the old drains its listeners for `drain` and is told to exit
/// a second after (its connections end then).
pub(crate) fn hot_restart_args(launch: &mut Launch, epoch: u32, base_id: u64, drain: Duration) {
    let mut args = Vec::with_capacity(launch.args.len() + 4);
    let mut given = launch.args.iter();
    while let Some(arg) = given.next() {
        match arg.as_str() {
            "--restart-epoch" | "--base-id-path" => {
                given.next();
            }
            "--use-dynamic-base-id" => {}
            _ => args.push(arg.clone()),
        }
    }
    let drain_s = drain.as_secs().max(1);
    args.extend([
        "--restart-epoch".to_owned(),
        epoch.to_string(),
        "--base-id".to_owned(),
        base_id.to_string(),
        "--drain-time-s".to_owned(),
        drain_s.to_string(),
        "--parent-shutdown-time-s".to_owned(),
        (drain_s + 1).to_string(),
    ]);
    launch.args = args;
}

/// Removes the shared memory Envoy's hot restart left for `base_id` (Envoy never does,
/// even at a clean exit); whether there was any.
pub(crate) fn remove_shared_memory(base_id: u64) -> bool {
    std::fs::remove_file(shared_memory(base_id)).is_ok()
}

/// Where Envoy keeps its hot restart's shared memory for `base_id`.
pub(crate) fn shared_memory(base_id: u64) -> std::path::PathBuf {
    format!(
        "/dev/shm/envoy_shared_memory_{}",
        base_id.saturating_mul(10)
    )
    .into()
}

/// The Envoy driver.
#[derive(Debug, Default)]
pub(crate) struct Envoy {
    rendered: Option<RouteTable>,
    mtls: Option<UpstreamMtls>,
    /// Started with hot restart on (ready for an upgrade).
    hot_restart: bool,
}

impl Envoy {
    /// A driver whose clusters speak mutual TLS to the backends when `mtls` is given.
    pub(crate) fn new(mtls: Option<UpstreamMtls>, hot_restart: bool) -> Self {
        Self {
            rendered: None,
            mtls,
            hot_restart,
        }
    }
}

impl Driver for Envoy {
    fn start(&mut self, files: &ProxyFiles, table: &RouteTable) -> Result<Launch, LabError> {
        let xds = files.dir.join("xds");
        create_dir(&xds)?;
        write_all(files, table, self.mtls.as_ref())?;
        self.rendered = Some(table.clone());
        let bootstrap = json!({
            "node": { "id": "ingressbench-lab", "cluster": "ingressbench-lab" },
            "admin": { "address": { "pipe": {
                "path": files.admin_socket.display().to_string(), "mode": 0o600,
            } } },
            "dynamic_resources": {
                "cds_config": source(files, "cds.json"),
                "lds_config": source(files, "lds.json"),
            },
        });
        write_json(&files.config_path("envoy.json"), &bootstrap)?;
        let mut args: Vec<String> = vec![
            "-c".into(),
            files.config_path("envoy.json").display().to_string(),
            "--concurrency".into(),
            table.tuning.workers.to_string(),
            "--log-level".into(),
            "warn".into(),
        ];
        if let Some(drain) = table.tuning.drain {
            // Whole seconds, at least one; the parent of a hot restart goes a second after
            // (an upgrade's or restart's own grace replaces both).
            let drain_s = drain.as_secs().max(1);
            args.extend([
                "--drain-time-s".into(),
                drain_s.to_string(),
                "--parent-shutdown-time-s".into(),
                (drain_s + 1).to_string(),
            ]);
        }
        if self.hot_restart {
            // Ready for an upgrade: hot restart on, with a base id of its own that Envoy
            // picks and writes down; its shared memory is removed at the end
            // (`remove_shared_memory`).
            args.extend([
                "--restart-epoch".into(),
                "0".into(),
                "--use-dynamic-base-id".into(),
                "--base-id-path".into(),
                base_id_path(files).display().to_string(),
            ]);
        } else {
            args.push("--disable-hot-restart".into());
        }
        Ok(Launch {
            args,
            env: Vec::new(),
            detached: None,
        })
    }

    fn update(
        &mut self,
        _child: &OwnedChild,
        files: &ProxyFiles,
        table: &RouteTable,
    ) -> Result<Update, LabError> {
        let only_endpoints = self
            .rendered
            .as_ref()
            .is_some_and(|old| old.differs_only_in_endpoints(table));
        let mechanism = if only_endpoints {
            for pool in &table.pools {
                if self.rendered.as_ref().and_then(|old| old.pool(&pool.name)) != Some(pool) {
                    write_json(
                        &xds_path(files, &format!("eds_{}.json", pool.name)),
                        &eds(pool),
                    )?;
                }
            }
            "file-based xDS (EDS file replaced by rename)"
        } else {
            write_all(files, table, self.mtls.as_ref())?;
            "file-based xDS (CDS/EDS/RDS files replaced by rename)"
        };
        self.rendered = Some(table.clone());
        Ok(Update {
            mechanism,
            ends_connections: false,
        })
    }
}

fn xds_path(files: &ProxyFiles, name: &str) -> std::path::PathBuf {
    files.dir.join("xds").join(name)
}

fn source(files: &ProxyFiles, name: &str) -> Value {
    json!({ "resource_api_version": "V3", "path_config_source": { "path": xds_path(files, name).display().to_string() } })
}

fn socket(ip: std::net::IpAddr, port: u16) -> Value {
    json!({ "socket_address": { "address": ip.to_string(), "port_value": port } })
}

fn resources(items: Vec<Value>) -> Value {
    json!({ "resources": items })
}

/// Writes every resource file: endpoints first, then clusters, routes and listeners, so
/// that each file only refers to what already exists.
fn write_all(
    files: &ProxyFiles,
    table: &RouteTable,
    mtls: Option<&UpstreamMtls>,
) -> Result<(), LabError> {
    for pool in &table.pools {
        write_json(
            &xds_path(files, &format!("eds_{}.json", pool.name)),
            &eds(pool),
        )?;
    }
    let clusters: Vec<Value> = table
        .pools
        .iter()
        .map(|pool| {
            let mut cluster = json!({
                "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                "name": format!("pool_{}", pool.name),
                "type": "EDS",
                "eds_cluster_config": { "eds_config": source(files, &format!("eds_{}.json", pool.name)) },
                "connect_timeout": format!("{:.3}s", table.tuning.connect_timeout_ms as f64 / 1000.0),
                "lb_policy": "ROUND_ROBIN",
                // Retries off, and no circuit breaking below what a benchmark sends.
                "circuit_breakers": { "thresholds": [{
                    "max_connections": 1_000_000, "max_pending_requests": 1_000_000,
                    "max_requests": 1_000_000, "max_retries": 0,
                }] },
            });
            if let Some(m) = mtls {
                cluster["transport_socket"] = upstream_tls(m);
            }
            if table.tuning.upstream_protocol.is_http2() {
                // HTTP/2 whatever the downstream spoke (prior knowledge without TLS).
                cluster["typed_extension_protocol_options"] = json!({
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": { "http2_protocol_options": {} },
                    },
                });
            }
            cluster
        })
        .collect();
    write_json(&xds_path(files, "cds.json"), &resources(clusters))?;
    super::write_atomically(&xds_path(files, "rds.json"), &rds_text(table))?;
    let mut listeners = vec![listener(files, table, "http", files.http_port, None)];
    if let Some(tls) = &files.tls {
        let tls_socket = json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "common_tls_context": certificate(tls, &["h2", "http/1.1"]),
            },
        });
        listeners.push(listener(files, table, "https", tls.port, Some(tls_socket)));
        listeners.push(quic_listener(files, table, tls));
    }
    write_json(&xds_path(files, "lds.json"), &resources(listeners))
}

/// The lab's certificate for a downstream TLS context that offers `alpn`.
fn certificate(tls: &super::TlsFiles, alpn: &[&str]) -> Value {
    json!({
        "tls_certificates": [{
            "certificate_chain": { "filename": tls.cert.display().to_string() },
            "private_key": { "filename": tls.key.display().to_string() },
        }],
        "alpn_protocols": alpn,
    })
}

/// HTTP/3 beside TLS: a QUIC listener on the UDP port of the TLS listener's number (as
/// Caddy serves it), its connection manager the TLS one's with the HTTP/3 codec, its
/// stats under `http.quic.`.
fn quic_listener(files: &ProxyFiles, table: &RouteTable, tls: &super::TlsFiles) -> Value {
    let mut hcm = connection_manager(files, table, "quic");
    hcm["codec_type"] = json!("HTTP3");
    hcm["http3_protocol_options"] = json!({});
    json!({
        "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
        "name": "quic",
        "address": { "socket_address": {
            "protocol": "UDP", "address": files.ip.to_string(), "port_value": tls.port,
        } },
        "udp_listener_config": {
            "quic_options": {},
            "downstream_socket_config": { "prefer_gro": true },
        },
        "filter_chains": [{
            "transport_socket": {
                "name": "envoy.transport_sockets.quic",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.quic.v3.QuicDownstreamTransport",
                    "downstream_tls_context": { "common_tls_context": certificate(tls, &["h3"]) },
                },
            },
            "filters": [{ "name": "envoy.filters.network.http_connection_manager", "typed_config": hcm }],
        }],
    })
}

/// Mutual TLS to the backends: the lab CA verifies them, the client certificate is shown.
fn upstream_tls(m: &UpstreamMtls) -> Value {
    let file = |p: &std::path::Path| json!({ "filename": p.display().to_string() });
    json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "sni": "localhost",
            "common_tls_context": {
                "tls_certificates": [{ "certificate_chain": file(&m.cert), "private_key": file(&m.key) }],
                "validation_context": { "trusted_ca": file(&m.ca) },
            },
        },
    })
}

fn eds(pool: &crate::model::Pool) -> Value {
    let endpoints: Vec<Value> = pool
        .endpoints
        .iter()
        .map(|ep| json!({ "endpoint": { "address": { "socket_address": { "address": ep.ip().to_string(), "port_value": ep.port() } } } }))
        .collect();
    resources(vec![json!({
        "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        "cluster_name": format!("pool_{}", pool.name),
        "endpoints": [{ "lb_endpoints": endpoints }],
    })])
}

/// The route configuration as `rds.json`'s text, written route by route: a virtual host
/// per line, compact, what all virtual hosts share rendered once (at 10,000 routes a tree
/// of `Value`s made pretty was 13% of Envoy's own time to take them).
fn rds_text(table: &RouteTable) -> String {
    let quoted = |s: &str| Value::from(s).to_string();
    // The read timeout bounds the time between reads, as nginx's proxy_read_timeout and
    // HAProxy's `timeout server` do: Envoy's route `timeout` bounds a whole response (an
    // event stream's included, which it would cut at 30 s), its `idle_timeout` a stream
    // with nothing moving.
    let timeout = quoted(&format!(
        "{:.3}s",
        table.tuning.read_timeout_ms as f64 / 1000.0
    ));
    let rewrite = table.overlay.rewrite.as_ref().map_or(String::new(), |(from, to)| {
        format!(
            r#","regex_rewrite":{}"#,
            json!({ "pattern": { "regex": format!("^{from}(.*)") }, "substitution": format!("{to}\\1") })
        )
    });
    let headers = Value::Array(
        table
            .response_headers()
            .into_iter()
            .map(|(name, value)| json!({ "header": { "key": name, "value": value }, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD" }))
            .collect(),
    );
    let cors = table
        .overlay
        .cors_origin
        .as_ref()
        .map_or(String::new(), |origin| {
            format!(
                r#","typed_per_filter_config":{}"#,
                json!({ "envoy.filters.http.cors": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy",
                "allow_origin_string_match": [{ "exact": origin }],
                "allow_methods": "GET, POST, PUT, DELETE, OPTIONS",
            } })
            )
        });
    let mut text = String::from(
        "{\"resources\": [{\"@type\": \"type.googleapis.com/envoy.config.route.v3.RouteConfiguration\", \"name\": \"lab_routes\", \"virtual_hosts\": [\n",
    );
    for (i, (host, routes)) in table.routes_by_host().into_iter().enumerate() {
        if i > 0 {
            text.push_str(",\n");
        }
        let routes: Vec<String> = routes
            .into_iter()
            .map(|r| {
                let revision = if r.revision > 0 {
                    format!(
                        r#","response_headers_to_add":[{{"header":{{"key":"{ROUTE_REVISION_HEADER}","value":"{}"}},"append_action":"OVERWRITE_IF_EXISTS_OR_ADD"}}]"#,
                        r.revision
                    )
                } else {
                    String::new()
                };
                format!(
                    r#"{{"match":{{"prefix":{}}},"route":{{"cluster":{},"timeout":"0s","idle_timeout":{timeout}{rewrite}}}{revision}}}"#,
                    quoted(&r.path_prefix),
                    quoted(&format!("pool_{}", r.pool)),
                )
            })
            .collect();
        text.push_str(&format!(
            r#"{{"name":"vh{i}","domains":[{}],"routes":[{}],"response_headers_to_add":{headers}{cors}}}"#,
            quoted(host),
            routes.join(",")
        ));
    }
    text.push_str("\n]}]}\n");
    text
}

/// The HTTP connection manager of every listener, its stats under `http.NAME.`.
fn connection_manager(files: &ProxyFiles, table: &RouteTable, name: &str) -> Value {
    let mut hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": name,
        "codec_type": "AUTO",
        "strip_any_host_port": true,
        // WebSockets are upgraded through (Envoy refuses an Upgrade it was not told of).
        "upgrade_configs": [{ "upgrade_type": "websocket" }],
        "rds": { "route_config_name": "lab_routes", "config_source": source(files, "rds.json") },
        "http_filters": [
            { "name": "envoy.filters.http.cors", "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors" } },
            { "name": "envoy.filters.http.router", "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" } },
        ],
    });
    if let Some(n) = table.tuning.keepalive_requests {
        hcm["common_http_protocol_options"] = json!({ "max_requests_per_connection": n });
    }
    hcm
}

fn listener(
    files: &ProxyFiles,
    table: &RouteTable,
    name: &str,
    port: u16,
    tls: Option<Value>,
) -> Value {
    let hcm = connection_manager(files, table, name);
    let mut chain = json!({ "filters": [{ "name": "envoy.filters.network.http_connection_manager", "typed_config": hcm }] });
    if let Some(tls) = tls {
        chain["transport_socket"] = tls;
    }
    let mut listener = json!({
        "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
        "name": name,
        "address": socket(files.ip, port),
        "filter_chains": [chain],
    });
    if let Some(b) = table.tuning.listen_backlog {
        listener["tcp_backlog_size"] = json!(b);
    }
    listener
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{generated_route, Generation, Overlay, Pool, Tuning};

    #[test]
    fn the_route_configuration_written_as_text_is_the_json_envoy_reads() {
        let pools = vec!["a".to_owned(), "b".to_owned()];
        let mut table = RouteTable {
            pools: pools
                .iter()
                .map(|p| Pool {
                    name: p.clone(),
                    endpoints: vec!["127.0.0.1:8080".parse().unwrap()],
                })
                .collect(),
            routes: (0..3).map(|i| generated_route(i, &pools)).collect(),
            overlay: Overlay {
                rewrite: Some(("/old".into(), "/new".into())),
                cors_origin: Some("https://x.test".into()),
                response_header: Some(("X-Lab".into(), "on \"quoted\"".into())),
                pool: None,
            },
            tuning: Tuning::default(),
            generation: Generation::default(),
        };
        table.routes[1].revision = 4;
        let doc: Value = serde_json::from_str(&rds_text(&table)).unwrap();
        let config = &doc["resources"][0];
        assert_eq!(
            config["@type"],
            "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
        );
        let hosts = config["virtual_hosts"].as_array().unwrap();
        assert_eq!(hosts.len(), 3);
        let second = &hosts[1];
        assert_eq!(second["domains"], json!([table.routes[1].host]));
        let route = &second["routes"][0];
        assert_eq!(route["match"]["prefix"], "/");
        assert_eq!(route["route"]["cluster"], "pool_b");
        assert_eq!(route["route"]["regex_rewrite"]["substitution"], "/new\\1");
        assert_eq!(
            route["response_headers_to_add"][0]["header"],
            json!({ "key": ROUTE_REVISION_HEADER, "value": "4" })
        );
        assert!(hosts[0]["routes"][0]
            .get("response_headers_to_add")
            .is_none());
        assert_eq!(
            second["response_headers_to_add"][0]["header"],
            json!({ "key": "X-Lab", "value": "on \"quoted\"" })
        );
        assert_eq!(
            second["typed_per_filter_config"]["envoy.filters.http.cors"]
                ["allow_origin_string_match"][0]["exact"],
            "https://x.test"
        );
    }
}
