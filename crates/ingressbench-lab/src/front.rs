//! An L4 load balancer in front of the lab's proxies, as a cloud network load balancer
//! sits in front of an ingress controller's replicas: HAProxy in TCP mode, spreading
//! connections round-robin and passing TLS through to the proxies.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::{free_port, OwnedChild};
use crate::proxy::{Binaries, Proxy, ProxyKind};
use crate::LabError;

/// How long the front may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running L4 front.
pub struct Front {
    http_port: u16,
    https_port: Option<u16>,
    version: String,
    config: PathBuf,
    child: OwnedChild,
}

impl Front {
    /// Starts HAProxy in TCP mode in `dir/front`, balancing over every proxy in `proxies`
    /// (their HTTP ports, and their HTTPS ports when they all have one).
    pub fn start(
        binaries: &Binaries,
        dir: &Path,
        proxies: &[Proxy],
        spawned: impl FnOnce(u32),
    ) -> Result<Self, LabError> {
        let binary = binaries.locate(ProxyKind::Haproxy)?;
        let version = binaries.version(ProxyKind::Haproxy, &binary);
        let dir = dir.join("front");
        crate::proxy::create_dir(&dir)?;
        let port = || {
            free_port().map_err(|source| LabError::Io {
                action: "finding a free port for",
                path: dir.clone(),
                source,
            })
        };
        let http_port = port()?;
        let https: Option<Vec<u16>> = proxies.iter().map(Proxy::https_port).collect();
        let https_port = match https {
            Some(_) if !proxies.is_empty() => Some(port()?),
            _ => None,
        };
        let config = dir.join("front.cfg");
        let text = render(
            http_port,
            proxies.iter().map(Proxy::http_port).collect(),
            https_port.zip(https),
        );
        std::fs::write(&config, text).map_err(|source| LabError::Io {
            action: "writing",
            path: config.clone(),
            source,
        })?;
        let args = vec!["-W".into(), "-f".into(), config.display().to_string()];
        let mut child = OwnedChild::spawn(
            "front (haproxy, TCP mode)",
            &binary,
            &args,
            &dir,
            &dir.join("front.log"),
        )?;
        spawned(child.pid());
        child.wait_listening(([127, 0, 0, 1], http_port).into(), START_TIMEOUT)?;
        if let Some(port) = https_port {
            child.wait_listening(([127, 0, 0, 1], port).into(), START_TIMEOUT)?;
        }
        Ok(Self {
            http_port,
            https_port,
            version,
            config,
            child,
        })
    }

    /// Its plain port.
    pub fn http_port(&self) -> u16 {
        self.http_port
    }

    /// Its TLS port (passed through to the proxies), if they terminate TLS.
    pub fn https_port(&self) -> Option<u16> {
        self.https_port
    }

    /// HAProxy's version.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Its rendered configuration.
    pub fn config(&self) -> &Path {
        &self.config
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Stops it (SIGTERM, then SIGKILL after `grace`).
    pub fn stop(mut self, grace: Duration) {
        self.child.terminate(grace);
    }
}

/// The configuration: one TCP frontend per port, round-robin over the proxies' ports.
fn render(http_port: u16, http: Vec<u16>, https: Option<(u16, Vec<u16>)>) -> String {
    let mut c = String::new();
    let _ = writeln!(
        c,
        "# Rendered by ingressbench: an L4 front (TCP mode, TLS passed through), a new\n\
         # connection to each proxy in turn, as a cloud network load balancer does.\n\
         global\n  maxconn {}\n  nbthread 1\n\
         defaults\n  mode tcp\n  balance roundrobin\n  timeout connect 5s\n  timeout client 75s\n  timeout server 75s",
        crate::proxy::haproxy_max_connections()
    );
    let mut section = |name: &str, port: u16, targets: &[u16]| {
        let _ = writeln!(
            c,
            "frontend {name}\n  bind 127.0.0.1:{port}\n  default_backend {name}_proxies\nbackend {name}_proxies"
        );
        for (i, target) in targets.iter().enumerate() {
            let _ = writeln!(c, "  server p{} 127.0.0.1:{target}", i + 1);
        }
    };
    section("http", http_port, &http);
    if let Some((port, targets)) = https {
        section("https", port, &targets);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_proxy_is_a_server_of_each_frontend() {
        let c = render(8000, vec![8001, 8002], Some((8443, vec![8444, 8445])));
        assert!(
            c.contains("mode tcp") && c.contains("balance roundrobin"),
            "{c}"
        );
        assert!(c.contains("frontend http\n  bind 127.0.0.1:8000\n"), "{c}");
        assert!(
            c.contains("  server p1 127.0.0.1:8001\n  server p2 127.0.0.1:8002\n"),
            "{c}"
        );
        assert!(c.contains("frontend https\n  bind 127.0.0.1:8443\n"), "{c}");
        assert!(c.contains("  server p2 127.0.0.1:8445\n"), "{c}");
        assert!(!render(8000, vec![8001], None).contains("https"));
    }
}
