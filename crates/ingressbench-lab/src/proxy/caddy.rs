//! Caddy: the whole configuration is loaded through the admin API (`POST /load` on its
//! Unix socket in the proxy's directory), which swaps it in without a restart.

use serde_json::{json, Value};

use super::{admin_request, write_atomically, Driver, Launch, ProxyFiles, Update};
use crate::model::RouteTable;
use crate::process::OwnedChild;
use crate::LabError;

/// The Caddy driver.
#[derive(Debug, Default)]
pub(crate) struct Caddy;

impl Driver for Caddy {
    fn start(&mut self, files: &ProxyFiles, table: &RouteTable) -> Result<Launch, LabError> {
        write_atomically(&files.config_path("caddy.json"), &render(files, table))?;
        let dir = files.dir.display().to_string();
        Ok(Launch {
            args: vec![
                "run".into(),
                "--config".into(),
                files.config_path("caddy.json").display().to_string(),
            ],
            env: vec![
                ("GOMAXPROCS".into(), table.tuning.workers.to_string()),
                ("XDG_DATA_HOME".into(), format!("{dir}/data")),
                ("XDG_CONFIG_HOME".into(), format!("{dir}/config")),
                ("HOME".into(), dir),
            ],
            detached: None,
        })
    }

    fn update(
        &mut self,
        _child: &OwnedChild,
        files: &ProxyFiles,
        table: &RouteTable,
    ) -> Result<Update, LabError> {
        let config = render(files, table);
        write_atomically(&files.config_path("caddy.json"), &config)?;
        let (status, body) =
            admin_request(files, "POST", "/load", Some(&config)).map_err(|e| LabError::Update {
                kind: "caddy".into(),
                mechanism: "admin API POST /load",
                reason: e.to_string(),
            })?;
        if status != 200 {
            return Err(LabError::Update {
                kind: "caddy".into(),
                mechanism: "admin API POST /load",
                reason: format!("HTTP {status}: {body}"),
            });
        }
        // A new configuration closes every WebSocket the old one held.
        Ok(Update {
            mechanism: "admin API (POST /load)",
            ends_connections: true,
        })
    }
}

/// Where the routes go in the configuration's text: a string no value of the lab can be
/// (values are checked printable).
const ROUTES_MARK: &str = "\u{0}routes";

/// The whole configuration as JSON text. The routes are written as text one by one and
/// put into both servers' places: 10,000 routes are 17 MB of text each time, where a
/// `serde_json::Value` tree of the whole (both servers, then its text, pretty for the
/// file and compact for the API) took this tool to 464 MiB.
fn render(files: &ProxyFiles, table: &RouteTable) -> String {
    let t = &table.tuning;
    let mut routes = String::from("[");
    for route in table.ordered_routes() {
        let mut matcher = json!({ "path": [format!("{}*", route.path_prefix)] });
        if route.host != "*" {
            matcher["host"] = json!([route.host]);
        }
        let mut handle = Vec::new();
        let set: serde_json::Map<String, Value> = table
            .route_headers(route)
            .into_iter()
            .map(|(name, value)| (name.to_owned(), json!([value])))
            .collect();
        handle.push(json!({ "handler": "headers", "response": { "set": set, "deferred": true } }));
        if let Some(origin) = &table.overlay.cors_origin {
            handle.push(
                json!({ "handler": "headers", "response": { "deferred": true, "set": {
                "Access-Control-Allow-Origin": [origin],
                "Access-Control-Allow-Methods": ["GET, POST, PUT, DELETE, OPTIONS"],
                "Vary": ["Origin"],
            } } }),
            );
        }
        if let Some((from, to)) = &table.overlay.rewrite {
            handle.push(json!({ "handler": "rewrite", "path_regexp": [{ "find": format!("^{from}"), "replace": to }] }));
        }
        let upstreams: Vec<Value> = table
            .pool(&route.pool)
            .map(|p| {
                p.endpoints
                    .iter()
                    .map(|ep| json!({ "dial": ep.to_string() }))
                    .collect()
            })
            .unwrap_or_default();
        let mut transport = json!({
            "protocol": "http",
            "keep_alive": { "max_idle_conns_per_host": t.upstream_keepalive },
            "dial_timeout": format!("{}ms", t.connect_timeout_ms),
            "response_header_timeout": format!("{}ms", t.read_timeout_ms),
        });
        if t.upstream_protocol.is_http2() {
            // HTTP/2 with prior knowledge, and only that.
            transport["versions"] = json!(["h2c"]);
        }
        // No retries: Caddy retries only when given a try_duration, which stays unset.
        handle.push(json!({
            "handler": "reverse_proxy",
            "upstreams": upstreams,
            "load_balancing": { "selection_policy": { "policy": "round_robin" } },
            "transport": transport,
        }));
        routes.push_str(
            &json!({ "match": [matcher], "handle": handle, "terminal": true }).to_string(),
        );
        routes.push(',');
    }
    routes.push_str(
        &json!({ "handle": [{ "handler": "static_response", "status_code": 404 }] }).to_string(),
    );
    routes.push(']');
    let mut servers = json!({
        "plain": { "listen": [format!("{}:{}", files.ip, files.http_port)], "routes": ROUTES_MARK, "automatic_https": { "disable": true } },
    });
    let mut apps = json!({});
    if let Some(tls) = &files.tls {
        servers["tls"] = json!({
            "listen": [format!("{}:{}", files.ip, tls.port)],
            "routes": ROUTES_MARK,
            "automatic_https": { "disable": true },
            "tls_connection_policies": [{ "certificate_selection": { "any_tag": ["lab"] } }],
        });
        apps["tls"] = json!({ "certificates": { "load_files": [{
            "certificate": tls.cert.display().to_string(),
            "key": tls.key.display().to_string(),
            "tags": ["lab"],
        }] } });
    }
    apps["http"] = json!({ "servers": servers });
    if let Some(drain) = table.tuning.drain {
        apps["http"]["grace_period"] = json!(format!("{}ms", drain.as_millis()));
    }
    let config = json!({
        "admin": { "listen": format!("unix/{}", files.admin_socket.display()) },
        "logging": { "logs": { "default": { "level": "WARN" } } },
        "apps": apps,
    })
    .to_string();
    let mark = Value::from(ROUTES_MARK).to_string();
    config.replace(&mark, &routes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{generated_route, Generation, Overlay, Pool, Tuning};

    #[test]
    fn both_servers_get_every_route_in_one_json_text() {
        let pools = vec!["echo".to_owned()];
        let table = RouteTable {
            pools: vec![Pool {
                name: "echo".into(),
                endpoints: vec!["127.0.0.1:8080".parse().unwrap()],
            }],
            routes: (0..3).map(|i| generated_route(i, &pools)).collect(),
            overlay: Overlay::default(),
            tuning: Tuning::default(),
            generation: Generation::default(),
        };
        let files = ProxyFiles {
            dir: "/lab/caddy".into(),
            ip: "127.0.0.1".parse().unwrap(),
            http_port: 8000,
            admin_socket: "/lab/caddy/admin.sock".into(),
            tls: Some(crate::proxy::TlsFiles {
                port: 8443,
                cert: "/lab/cert.pem".into(),
                key: "/lab/key.pem".into(),
                combined: "/lab/combined.pem".into(),
            }),
        };
        let text = render(&files, &table);
        assert!(!text.contains("\\u0000"), "the mark is gone");
        let config: Value = serde_json::from_str(&text).unwrap();
        for server in ["plain", "tls"] {
            let routes = config["apps"]["http"]["servers"][server]["routes"]
                .as_array()
                .unwrap();
            assert_eq!(routes.len(), 4, "three routes and the 404: {server}");
            assert_eq!(routes[0]["match"][0]["host"][0], "r0.routes.test");
            assert_eq!(routes[3]["handle"][0]["status_code"], 404);
        }
    }
}
