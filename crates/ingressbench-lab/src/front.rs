//! An L4 load balancer in front of the lab's proxies, as a cloud network load balancer
//! sits in front of an ingress controller's replicas: HAProxy in TCP mode, spreading
//! connections round-robin and passing TLS through to the proxies.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::{OwnedChild, RunAs};
use crate::proxy::{Binaries, ProxyKind};
use crate::topology::free_port;
use crate::topology::Node;
use crate::LabError;

/// How long the front may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running L4 front.
pub struct Front {
    ip: IpAddr,
    http_port: u16,
    https_port: Option<u16>,
    version: String,
    config: PathBuf,
    child: OwnedChild,
}

impl Front {
    /// Starts HAProxy in TCP mode on `node`, in `dir/front`, balancing over the proxies'
    /// `http` addresses, and their `https` addresses when they terminate TLS.
    pub fn start(
        binaries: &Binaries,
        node: &Node,
        dir: &Path,
        http: &[SocketAddr],
        https: Option<&[SocketAddr]>,
        spawned: impl FnOnce(u32),
    ) -> Result<Self, LabError> {
        let binary = binaries.locate(ProxyKind::Haproxy)?;
        let version = binaries.version(ProxyKind::Haproxy, &binary)?;
        let dir = dir.join("front");
        crate::proxy::create_dir(&dir)?;
        let port = || {
            free_port(node).map_err(|source| LabError::Io {
                action: "finding a free port for",
                path: dir.clone(),
                source,
            })
        };
        let http_port = port()?;
        let https_port = match https {
            Some(_) if !http.is_empty() => Some(port()?),
            _ => None,
        };
        let config = dir.join("front.cfg");
        let text = render(
            (node.ip, http_port).into(),
            http,
            https_port.map(|p| (node.ip, p).into()).zip(https),
        );
        crate::proxy::write_atomically(&config, &text)?;
        let args = vec!["-W".into(), "-f".into(), config.display().to_string()];
        let user = crate::identity::lab_identity()?;
        let program = crate::identity::runnable(&binary, user, &dir.join("bin"))?;
        let mut child = OwnedChild::spawn_with_env(
            "front (haproxy, TCP mode)",
            &program,
            &args,
            &[],
            &dir,
            &dir.join("front.log"),
            RunAs {
                netns: node.netns.as_deref(),
                user,
            },
        )?;
        spawned(child.pid());
        let waited = child.wait_listening((node.ip, http_port).into(), START_TIMEOUT)?;
        if let Some(port) = https_port {
            child.wait_listening((node.ip, port).into(), START_TIMEOUT)?;
        }
        if !http.is_empty() {
            wait_forwarding(
                &mut child,
                (node.ip, http_port).into(),
                START_TIMEOUT.saturating_sub(waited),
            )?;
        }
        Ok(Self {
            ip: node.ip,
            http_port,
            https_port,
            version,
            config,
            child,
        })
    }

    /// Where it listens for plain connections.
    pub fn http_addr(&self) -> SocketAddr {
        (self.ip, self.http_port).into()
    }

    /// Where it listens for TLS (passed through to the proxies), if they terminate TLS.
    pub fn https_addr(&self) -> Option<SocketAddr> {
        self.https_port.map(|p| (self.ip, p).into())
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

    /// The HAProxy process, to signal or wait for.
    pub fn child(&mut self) -> &mut OwnedChild {
        &mut self.child
    }

    /// Stops it (SIGTERM, then SIGKILL after `grace`).
    pub fn stop(mut self, grace: Duration) {
        self.child.terminate(grace);
    }
}

/// Waits until a request sent to the front at `addr` comes back answered by a proxy
/// behind it. A connect alone is not enough: HAProxy's master binds and listens before it
/// forks the worker, and the worker enables its listeners only once it runs (seen here:
/// the worker holding a socket that did not accept, a moment after a connect succeeded).
fn wait_forwarding(
    child: &mut OwnedChild,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<(), LabError> {
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait() {
            return Err(child.not_ready(format!("exited with {status} before forwarding")));
        }
        if answered_through(addr) {
            return Ok(());
        }
        if started.elapsed() > timeout {
            return Err(child.not_ready(format!(
                "listening on {addr} but no request through it answered by a proxy after \
                 {timeout:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether one HTTP/1.1 request through `addr` gets the start of an HTTP answer (any
/// status) within a second: a HEAD for `front.check`, a host no route serves, so the
/// proxy answers it and no backend sees it.
fn answered_through(addr: SocketAddr) -> bool {
    let second = Duration::from_secs(1);
    let Ok(stream) = std::net::TcpStream::connect_timeout(&addr, second) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(second));
    let _ = stream.set_write_timeout(Some(second));
    let head = crate::http1::Request {
        method: "HEAD",
        ..crate::http1::Request::get("front.check", "/")
    };
    crate::http1::exchange(stream, &head, crate::http1::Until::Status).is_ok()
}

/// The configuration: one TCP frontend per port, round-robin over the proxies' ports.
fn render(
    http: SocketAddr,
    targets: &[SocketAddr],
    https: Option<(SocketAddr, &[SocketAddr])>,
) -> String {
    let mut c = String::new();
    let _ = writeln!(
        c,
        "# Rendered by ingressbench: an L4 front (TCP mode, TLS passed through), a new\n\
         # connection to each proxy in turn, as a cloud network load balancer does.\n\
         global\n  maxconn {}\n  nbthread 1\n\
         defaults\n  mode tcp\n  balance roundrobin\n  timeout connect 5s\n  timeout client 75s\n  timeout server 75s",
        crate::proxy::haproxy_max_connections()
    );
    let mut section = |name: &str, bind: SocketAddr, targets: &[SocketAddr]| {
        let _ = writeln!(
            c,
            "frontend {name}\n  bind {bind}\n  default_backend {name}_proxies\nbackend {name}_proxies"
        );
        for (i, target) in targets.iter().enumerate() {
            let _ = writeln!(c, "  server p{} {target}", i + 1);
        }
    };
    section("http", http, targets);
    if let Some((bind, targets)) = https {
        section("https", bind, targets);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_proxy_is_a_server_of_each_frontend() {
        let at = |s: &str| -> SocketAddr { s.parse().unwrap() };
        let http = [at("127.0.1.1:8001"), at("127.0.1.1:8002")];
        let https = [at("127.0.1.1:8444"), at("127.0.1.1:8445")];
        let c = render(
            at("127.0.2.1:8000"),
            &http,
            Some((at("127.0.2.1:8443"), &https)),
        );
        assert!(
            c.contains("mode tcp") && c.contains("balance roundrobin"),
            "{c}"
        );
        assert!(c.contains("frontend http\n  bind 127.0.2.1:8000\n"), "{c}");
        assert!(
            c.contains("  server p1 127.0.1.1:8001\n  server p2 127.0.1.1:8002\n"),
            "{c}"
        );
        assert!(c.contains("frontend https\n  bind 127.0.2.1:8443\n"), "{c}");
        assert!(c.contains("  server p2 127.0.1.1:8445\n"), "{c}");
        assert!(!render(at("127.0.0.1:8000"), &http[..1], None).contains("https"));
    }
}
