//! Lab files: a lab described in YAML (`ingressbench lab up FILE`). Scenario files use the
//! same `backends`, `routes`, `tls`, `tuning` and `overlay` sections.
//!
//! ```yaml
//! proxies: [nginx, haproxy, envoy, traefik, caddy]
//! backends:
//!   - name: echo
//!     replicas: 3
//!     backend: { latency: 1ms, body_bytes: 615 }
//! routes:
//!   - { host: app.test, path_prefix: /, pool: echo }
//! tls: true
//! tuning: { workers: 1, keepalive_requests: 1000, upstream_keepalive: 32 }
//! haproxy_update: runtime_api
//! ```
//! Unknown keys are errors, reported with the file, line and column.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::backend::Latency;
use crate::model::{Overlay, Route, Tuning};
use crate::proxy::{Binaries, HaproxyUpdate, ProxyKind, ProxyOptions};
use crate::relay::LinkSpec;
use crate::{HopSpec, LabError, LabSpec, Links, PoolSpec};

/// A lab file as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabFile {
    /// Proxies to run, each in front of every pool.
    pub proxies: Vec<ProxyKind>,
    /// Backend pools (default: one pool `echo` of 3).
    #[serde(default = "default_pools")]
    pub backends: Vec<PoolFile>,
    /// Routes (default: every host and path to the first pool).
    #[serde(default)]
    pub routes: Vec<RouteFile>,
    /// Terminate TLS too (default: true).
    #[serde(default = "yes")]
    pub tls: bool,
    /// Tuning knobs, equal across proxies.
    #[serde(default)]
    pub tuning: TuningFile,
    /// Header, CORS and rewrite changes in force at start.
    #[serde(default)]
    pub overlay: OverlayFile,
    /// How HAProxy receives endpoint changes.
    #[serde(default)]
    pub haproxy_update: HaproxyUpdate,
    /// An L4 load balancer in front of replicas of each proxy.
    #[serde(default)]
    pub front: Option<FrontFile>,
    /// An extra hop: a sidecar between the proxies and the backends.
    #[serde(default)]
    pub hop: Option<HopFile>,
    /// Where things run, and the links between.
    #[serde(default)]
    pub topology: TopologyFile,
}

/// Placement presets and link delays as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TopologyFile {
    /// `affinity` (client, proxy and backends on one node: no links) or `anti_affinity`
    /// (every backend on its own node, the proxies on another, the client on its own).
    #[serde(default)]
    pub placement: Placement,
    /// `internal` (the client on a node of the cluster) or `external` (across `internet`).
    #[serde(default)]
    pub client: ClientPath,
    /// Link delays; unset ones keep their defaults.
    #[serde(default)]
    pub links: LinksFile,
}

/// Where processes run.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Everything on one node.
    #[default]
    Affinity,
    /// Client, proxies and each backend on nodes of their own.
    AntiAffinity,
}

/// Where the client is.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ClientPath {
    /// Inside the cluster.
    #[default]
    Internal,
    /// Across the internet link.
    External,
}

/// Link delays as written: `{ delay: 0.3ms, jitter: 0.05ms }`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LinksFile {
    /// Between nodes of the cluster (default 0.3 ms ± 0.05 ms).
    pub cross_node: Option<LinkFile>,
    /// Between an external client and the cluster (default 20 ms ± 2 ms).
    pub internet: Option<LinkFile>,
}

/// One link as written.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LinkFile {
    /// One-way delay.
    pub delay: String,
    /// Largest deviation either way (default 0).
    #[serde(default)]
    pub jitter: Option<String>,
}

impl TopologyFile {
    /// The links the placement puts on each path.
    pub fn links(&self) -> Result<Links, String> {
        let link =
            |f: &Option<LinkFile>, field: &str, default: (u64, u64)| -> Result<LinkSpec, String> {
                let parse = |v: &str| {
                    ingressbench_stats::parse_duration(v)
                        .map_err(|e| format!("topology.links.{field}: {e}"))
                };
                match f {
                    Some(l) => Ok(LinkSpec {
                        delay: parse(&l.delay)?,
                        jitter: l
                            .jitter
                            .as_deref()
                            .map(parse)
                            .transpose()?
                            .unwrap_or_default(),
                    }),
                    None => Ok(LinkSpec {
                        delay: std::time::Duration::from_micros(default.0),
                        jitter: std::time::Duration::from_micros(default.1),
                    }),
                }
            };
        let cross = link(&self.links.cross_node, "cross_node", (300, 50))?;
        let internet = link(&self.links.internet, "internet", (20_000, 2_000))?;
        for l in [cross, internet] {
            if l.jitter > l.delay {
                return Err(format!(
                    "topology.links: jitter {:?} is larger than the delay {:?}",
                    l.jitter, l.delay
                ));
            }
        }
        let anti = self.placement == Placement::AntiAffinity;
        Ok(Links {
            client: match (self.client, anti) {
                (ClientPath::External, _) => Some(internet),
                (ClientPath::Internal, true) => Some(cross),
                (ClientPath::Internal, false) => None,
            },
            backends: anti.then_some(cross),
        })
    }
}

/// An extra hop as written: `{ proxy: envoy, mtls: true }`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HopFile {
    /// The sidecar (Envoy, as in the meshes it stands for).
    pub proxy: ProxyKind,
    /// Mutual TLS from the sidecar to the backends.
    #[serde(default)]
    pub mtls: bool,
}

/// An L4 front as written: `{ replicas: 2 }`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FrontFile {
    /// How many replicas of each proxy it spreads connections over.
    pub replicas: usize,
}

/// A pool as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolFile {
    /// Name.
    pub name: String,
    /// Replicas.
    pub replicas: usize,
    /// How its backends behave.
    #[serde(default)]
    pub backend: BackendFile,
}

/// Backend behaviour as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendFile {
    /// `5ms`, `uniform:1ms-5ms`, `lognormal:2ms,p99=20ms`.
    pub latency: Option<String>,
    /// Body size.
    pub body_bytes: Option<usize>,
    /// Status.
    pub status: Option<u16>,
    /// Share of 500s.
    pub error_rate: Option<f64>,
}

/// A route as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    /// Host (`*` for any).
    pub host: String,
    /// Path prefix (default `/`).
    #[serde(default = "root")]
    pub path_prefix: String,
    /// Pool.
    pub pool: String,
}

/// Tuning as written; unset knobs keep the defaults.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TuningFile {
    /// Worker processes or threads.
    pub workers: Option<u32>,
    /// Requests per client connection.
    pub keepalive_requests: Option<u64>,
    /// Idle upstream connections per pool.
    pub upstream_keepalive: Option<u32>,
}

/// Route changes as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlayFile {
    /// `{ name: X-Lab, value: on }`
    pub response_header: Option<HeaderFile>,
    /// An origin, or `*`.
    pub cors_origin: Option<String>,
    /// `{ from: /old, to: /new }`
    pub rewrite: Option<RewriteFile>,
}

/// A header as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderFile {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

/// A rewrite as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewriteFile {
    /// Prefix to replace.
    pub from: String,
    /// Replacement.
    pub to: String,
}

/// A YAML error as (line and column, message without the position), for messages of the
/// form `file:line:column: message`. Scenario files use it too.
pub fn yaml_error(e: &serde_yaml_ng::Error) -> (Option<(usize, usize)>, String) {
    let location = e.location().map(|l| (l.line(), l.column()));
    let message = e
        .to_string()
        .split(" at line ")
        .next()
        .unwrap_or_default()
        .to_owned();
    (location, message)
}

fn yes() -> bool {
    true
}

fn root() -> String {
    "/".to_owned()
}

/// The backends of a lab or scenario file that names none: one pool `echo` of 3.
pub fn default_pools() -> Vec<PoolFile> {
    vec![PoolFile {
        name: "echo".into(),
        replicas: 3,
        backend: BackendFile::default(),
    }]
}

impl OverlayFile {
    /// The overlay it describes.
    pub fn to_overlay(&self) -> Overlay {
        Overlay {
            response_header: self
                .response_header
                .as_ref()
                .map(|h| (h.name.clone(), h.value.clone())),
            cors_origin: self.cors_origin.clone(),
            rewrite: self
                .rewrite
                .as_ref()
                .map(|r| (r.from.clone(), r.to.clone())),
        }
    }
}

impl LabFile {
    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<Self, LabError> {
        let text = std::fs::read_to_string(path).map_err(|e| LabError::LabFile {
            path: path.to_owned(),
            location: None,
            message: format!("cannot read it: {e}"),
        })?;
        Self::parse(&text, path)
    }

    /// Parses lab-file text (`path` is only for messages).
    pub fn parse(text: &str, path: &Path) -> Result<Self, LabError> {
        serde_yaml_ng::from_str(text).map_err(|e| {
            let (location, message) = yaml_error(&e);
            LabError::LabFile {
                path: path.to_owned(),
                location,
                message,
            }
        })
    }

    /// The lab it describes, run with `backend_binary` and proxies from `binaries`.
    pub fn to_spec(
        &self,
        path: &Path,
        backend_binary: PathBuf,
        binaries: Binaries,
    ) -> Result<LabSpec, LabError> {
        let err = |message: String| LabError::LabFile {
            path: path.to_owned(),
            location: None,
            message,
        };
        if self.proxies.is_empty() {
            return Err(err(
                "`proxies` is empty: name at least one of nginx, haproxy, envoy, traefik, caddy"
                    .into(),
            ));
        }
        if self.front.as_ref().is_some_and(|f| f.replicas == 0) {
            return Err(err(
                "front.replicas: 0; a front needs at least one proxy replica behind it".into(),
            ));
        }
        let links = self.topology.links().map_err(err)?;
        if let Some(hop) = &self.hop {
            if hop.proxy != ProxyKind::Envoy {
                return Err(err(format!(
                    "hop.proxy: `{}`; the sidecar is envoy (as in Istio, OSM and Consul)",
                    hop.proxy
                )));
            }
        }
        let mut pools = Vec::new();
        for pool in &self.backends {
            let mut args = Vec::new();
            let b = &pool.backend;
            if let Some(latency) = &b.latency {
                latency
                    .parse::<Latency>()
                    .map_err(|e| err(format!("pool `{}`: {e}", pool.name)))?;
                args.extend(["--latency".to_owned(), latency.clone()]);
            }
            if let Some(n) = b.body_bytes {
                args.extend(["--body-bytes".to_owned(), n.to_string()]);
            }
            if let Some(s) = b.status {
                args.extend(["--status".to_owned(), s.to_string()]);
            }
            if let Some(r) = b.error_rate {
                args.extend(["--error-rate".to_owned(), r.to_string()]);
            }
            pools.push(PoolSpec {
                name: pool.name.clone(),
                replicas: pool.replicas,
                backend_args: args,
            });
        }
        let first_pool = pools
            .first()
            .map(|p| p.name.clone())
            .ok_or_else(|| err("`backends` is empty: name at least one pool".into()))?;
        let routes = if self.routes.is_empty() {
            vec![Route {
                host: "*".into(),
                path_prefix: "/".into(),
                pool: first_pool,
            }]
        } else {
            self.routes
                .iter()
                .map(|r| Route {
                    host: r.host.clone(),
                    path_prefix: r.path_prefix.clone(),
                    pool: r.pool.clone(),
                })
                .collect()
        };
        let defaults = Tuning::default();
        let tuning = Tuning {
            workers: self.tuning.workers.unwrap_or(defaults.workers),
            keepalive_requests: self.tuning.keepalive_requests,
            upstream_keepalive: self
                .tuning
                .upstream_keepalive
                .unwrap_or(defaults.upstream_keepalive),
            ..defaults
        };
        Ok(LabSpec {
            proxies: self.proxies.clone(),
            pools,
            routes,
            overlay: self.overlay.to_overlay(),
            tuning,
            tls: self.tls,
            backend_binary,
            binaries,
            keep: false,
            proxy_options: ProxyOptions {
                haproxy_update: self.haproxy_update,
                upstream_mtls: None,
            },
            front: self.front.as_ref().map(|f| f.replicas),
            hop: self.hop.as_ref().map(|h| HopSpec { mtls: h.mtls }),
            links,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_put_links_on_the_paths_that_cross_nodes() {
        let links = |yaml: &str| {
            serde_yaml_ng::from_str::<TopologyFile>(yaml)
                .unwrap()
                .links()
        };
        let near = links("{}").unwrap();
        assert_eq!((near.client, near.backends), (None, None));
        let anti =
            links("{ placement: anti_affinity, links: { cross_node: { delay: 1ms } } }").unwrap();
        let ms = std::time::Duration::from_millis(1);
        assert_eq!(anti.client.map(|l| l.delay), Some(ms));
        assert_eq!(anti.backends.map(|l| l.delay), Some(ms));
        let external = links("{ client: external }").unwrap();
        assert_eq!(
            external
                .client
                .map(|l| (l.delay.as_millis(), l.jitter.as_millis())),
            Some((20, 2))
        );
        assert_eq!(external.backends, None);
        let e = links("{ links: { internet: { delay: 1ms, jitter: 2ms } } }").unwrap_err();
        assert!(e.contains("larger than the delay"), "{e}");
    }

    fn parse(text: &str) -> Result<LabFile, String> {
        LabFile::parse(text, Path::new("lab.yaml")).map_err(|e| e.to_string())
    }

    #[test]
    fn a_minimal_file_gets_the_defaults() {
        let f = parse("proxies: [nginx, envoy]\n").unwrap();
        let spec = f
            .to_spec(Path::new("lab.yaml"), "ib".into(), Binaries::default())
            .unwrap();
        assert_eq!(spec.proxies, vec![ProxyKind::Nginx, ProxyKind::Envoy]);
        assert_eq!(spec.pools[0].replicas, 3);
        assert_eq!(spec.routes[0].host, "*");
        assert!(spec.tls);
    }

    #[test]
    fn errors_name_the_file_line_and_column() {
        for (text, want) in [
            ("proxies: [nginx]\nbogus: 1\n", "lab.yaml:2:1: unknown field `bogus`"),
            ("proxies: [nginz]\n", "lab.yaml:1:11: proxies[0]: unknown variant `nginz`, expected one of `nginx`"),
            ("proxies: [nginx]\nbackends:\n  - name: echo\n    replicas: three\n", "lab.yaml:4:15: backends[0].replicas: invalid type: string \"three\", expected usize"),
            ("proxies: [nginx]\nhaproxy_update: sometimes\n", "unknown variant `sometimes`, expected `runtime_api` or `reload`"),
            ("proxies: [nginx]\nbackends:\n  - { name: echo, replicas: 1, backend: { latency: soon } }\n", "lab.yaml: pool `echo`: invalid backend --latency"),
        ] {
            let result = parse(text).and_then(|f| f.to_spec(Path::new("lab.yaml"), "ib".into(), Binaries::default()).map_err(|e| e.to_string()));
            let message = result.err().unwrap_or_default();
            assert!(!message.is_empty(), "{text:?} should fail");
            assert!(message.contains(want), "{text:?}: {message}");
        }
    }
}
