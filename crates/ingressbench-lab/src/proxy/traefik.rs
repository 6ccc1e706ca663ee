//! Traefik: the file provider watches a directory; every change replaces the dynamic
//! configuration file there (written to a sibling and renamed over it). Traefik applies
//! provider events at most once per `providersThrottleDuration` (2 s by default, kept:
//! that is how Traefik behaves for its users).

use serde_json::{json, Map, Value};

use super::{create_dir, write_json, Driver, Launch, ProxyFiles, Update};
use crate::model::{RouteTable, UpstreamProtocol, ROUTE_REVISION_HEADER};
use crate::process::OwnedChild;
use crate::LabError;

/// The Traefik driver.
#[derive(Debug, Default)]
pub(crate) struct Traefik;

impl Driver for Traefik {
    fn start(&mut self, files: &ProxyFiles, table: &RouteTable) -> Result<Launch, LabError> {
        let dynamic = files.dir.join("dynamic");
        create_dir(&dynamic)?;
        write_dynamic(files, table)?;
        let t = &table.tuning;
        let mut args = vec![
            format!("--entryPoints.web.address={}:{}", files.ip, files.http_port),
            format!("--providers.file.directory={}", dynamic.display()),
            "--providers.file.watch=true".into(),
            "--log.level=ERROR".into(),
            "--global.checkNewVersion=false".into(),
            "--global.sendAnonymousUsage=false".into(),
            format!(
                "--serversTransport.maxIdleConnsPerHost={}",
                t.upstream_keepalive
            ),
            format!(
                "--serversTransport.forwardingTimeouts.dialTimeout={}ms",
                t.connect_timeout_ms
            ),
            format!(
                "--serversTransport.forwardingTimeouts.responseHeaderTimeout={}ms",
                t.read_timeout_ms
            ),
        ];
        if let Some(tls) = &files.tls {
            args.push(format!(
                "--entryPoints.websecure.address={}:{}",
                files.ip, tls.port
            ));
            // HTTP/3 on the UDP port of the same number, with the same routers.
            args.push("--entryPoints.websecure.http3=true".into());
        }
        if let Some(drain) = t.drain {
            let ms = drain.as_millis();
            args.push(format!(
                "--entryPoints.web.transport.lifeCycle.graceTimeOut={ms}ms"
            ));
            if files.tls.is_some() {
                args.push(format!(
                    "--entryPoints.websecure.transport.lifeCycle.graceTimeOut={ms}ms"
                ));
            }
        }
        if let Some(n) = t.keepalive_requests {
            args.push(format!(
                "--entryPoints.web.transport.keepAliveMaxRequests={n}"
            ));
            if files.tls.is_some() {
                args.push(format!(
                    "--entryPoints.websecure.transport.keepAliveMaxRequests={n}"
                ));
            }
        }
        Ok(Launch {
            args,
            env: vec![("GOMAXPROCS".into(), t.workers.to_string())],
            detached: None,
        })
    }

    fn update(
        &mut self,
        _child: &OwnedChild,
        files: &ProxyFiles,
        table: &RouteTable,
    ) -> Result<Update, LabError> {
        write_dynamic(files, table)?;
        Ok(Update {
            mechanism: "file provider (watched directory, file replaced by rename)",
            ends_connections: false,
        })
    }
}

fn write_dynamic(files: &ProxyFiles, table: &RouteTable) -> Result<(), LabError> {
    // JSON is YAML: Traefik reads the file by its .yaml name.
    write_json(
        &files.dir.join("dynamic").join("lab.yaml"),
        &render(files, table),
    )
}

fn render(files: &ProxyFiles, table: &RouteTable) -> Value {
    let mut middlewares = Map::new();
    let headers: Map<String, Value> = table
        .response_headers()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), json!(value)))
        .collect();
    middlewares.insert(
        "lab-header".into(),
        json!({ "headers": { "customResponseHeaders": headers } }),
    );
    if let Some(origin) = &table.overlay.cors_origin {
        middlewares.insert(
            "lab-cors".into(),
            json!({ "headers": {
                "accessControlAllowOriginList": [origin],
                "accessControlAllowMethods": ["GET", "POST", "PUT", "DELETE", "OPTIONS"],
                "addVaryHeader": true,
            } }),
        );
    }
    if let Some((from, to)) = &table.overlay.rewrite {
        middlewares.insert("lab-rewrite".into(), json!({ "replacePathRegex": { "regex": format!("^{from}(.*)"), "replacement": format!("{to}$1") } }));
    }
    let chain: Vec<String> = middlewares.keys().cloned().collect();
    // A changed route's revision: a headers middleware per revision, after the others.
    for revision in table.routes.iter().map(|r| r.revision).filter(|&r| r > 0) {
        middlewares
            .entry(format!("lab-revision-{revision}"))
            .or_insert_with(|| {
                json!({ "headers": { "customResponseHeaders": { ROUTE_REVISION_HEADER: revision.to_string() } } })
            });
    }
    let mut routers = Map::new();
    for (i, route) in table.ordered_routes().into_iter().enumerate() {
        let mut chain = chain.clone();
        if route.revision > 0 {
            chain.push(format!("lab-revision-{}", route.revision));
        }
        let path = format!("PathPrefix(`{}`)", route.path_prefix);
        let rule = if route.host == "*" {
            path
        } else {
            format!("Host(`{}`) && {path}", route.host)
        };
        let service = format!("pool_{}", route.pool);
        routers.insert(format!("r{i}-web"), json!({ "rule": rule, "service": service, "entryPoints": ["web"], "middlewares": chain }));
        if files.tls.is_some() {
            routers.insert(
                format!("r{i}-tls"),
                json!({ "rule": rule, "service": service, "entryPoints": ["websecure"], "middlewares": chain, "tls": {} }),
            );
        }
    }
    // `h2c://`: HTTP/2 with prior knowledge to the backends.
    let scheme = match table.tuning.upstream_protocol {
        UpstreamProtocol::Http1 => "http",
        UpstreamProtocol::Http2 | UpstreamProtocol::Grpc => "h2c",
    };
    let services: Map<String, Value> = table
        .pools
        .iter()
        .map(|p| {
            let servers: Vec<Value> = p
                .endpoints
                .iter()
                .map(|ep| json!({ "url": format!("{scheme}://{ep}") }))
                .collect();
            (
                format!("pool_{}", p.name),
                json!({ "loadBalancer": { "servers": servers, "passHostHeader": true } }),
            )
        })
        .collect();
    let mut config = json!({ "http": { "routers": routers, "services": services } });
    if !middlewares.is_empty() {
        config["http"]["middlewares"] = Value::Object(middlewares);
    }
    if let Some(tls) = &files.tls {
        config["tls"] = json!({ "certificates": [{ "certFile": tls.cert.display().to_string(), "keyFile": tls.key.display().to_string() }] });
    }
    config
}
