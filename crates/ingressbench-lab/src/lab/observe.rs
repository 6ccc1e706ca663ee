//! What a run reads off a running lab: its parts' usage, the proxies' own counters,
//! whether every part is alive, the kernel's settings and counters, the map of nodes
//! and links, and where the load enters.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ingressbench_results::site as record;
use ingressbench_stats::HistogramUs;

use crate::certs::LabCerts;
use crate::front::Front;
use crate::kernel::{self, ListenCounters};
use crate::proxy::{Proxy, ProxyKind};
use crate::relay::Relay;
use crate::topology::Node;
use crate::usage::Part;
use crate::LabError;

use super::{mark_kept, Backend, Lab};

impl Lab {
    /// The running proxies.
    pub fn proxies(&self) -> &[Proxy] {
        &self.proxies
    }

    /// The lab's processes to measure, each part a process group: every proxy (each
    /// replica, named `kind` or `kind-N`), the front and the sidecar; and each backend,
    /// a process of its own (a soak asks what grows there too).
    pub fn usage_parts(&self) -> Vec<Part> {
        let mut parts: Vec<Part> = self
            .proxies
            .iter()
            .enumerate()
            .map(|(i, p)| Part::group(&self.proxy_name(i), "proxy", p.pgid()))
            .collect();
        if let Some(front) = &self.front {
            parts.push(Part::group("front", "front", front.pid()));
        }
        if let Some(sidecar) = &self.sidecar {
            parts.push(Part::group("sidecar", "sidecar", sidecar.pid()));
        }
        for b in &self.backends {
            parts.push(Part::process(&b.name, "backend", b.pid()));
        }
        parts
    }

    /// A proxy's name in readings: its kind, numbered when a front spreads the load over
    /// several.
    fn proxy_name(&self, i: usize) -> String {
        let kind = self.proxies[i].kind().to_string();
        if self.proxies.len() > 1 && self.front.is_some() {
            format!("{kind}-{}", i + 1)
        } else {
            kind
        }
    }

    /// What each proxy counted so far, by its name in readings (see
    /// [`crate::proxy::counters`]); a proxy that could not be read says why.
    pub fn proxy_counters(&mut self) -> crate::proxy::counters::Readings {
        (0..self.proxies.len())
            .map(|i| (self.proxy_name(i), self.proxies[i].counted()))
            .collect()
    }

    /// Checks that every part nothing asked to stop is still running: each proxy (and
    /// replica), the front, the sidecar and every backend no event killed or drained. The
    /// first one that exited is the error, with how it ended and its log's end.
    pub fn check_alive(&mut self) -> Result<(), LabError> {
        // A proxy whose restart is under way has left on purpose.
        let proxies = (self.proxies.iter_mut())
            .filter(|p| !p.restarting())
            .map(|p| (p.kind().to_string(), p.child()));
        let front = self
            .front
            .iter_mut()
            .map(|f| ("front".to_owned(), f.child()));
        let sidecar = self
            .sidecar
            .iter_mut()
            .map(|s| ("sidecar".to_owned(), s.child()));
        let backends = self
            .backends
            .iter_mut()
            .map(|b| (format!("backend {}", b.name), &mut b.child));
        for (part, child) in proxies.chain(front).chain(sidecar).chain(backends) {
            if let Some(status) = child.try_wait() {
                return Err(LabError::PartExited {
                    part,
                    status: status.to_string(),
                    log_tail: child.log_tail(),
                });
            }
        }
        Ok(())
    }

    /// The running proxies, to update one at a time.
    pub fn proxies_mut(&mut self) -> &mut [Proxy] {
        &mut self.proxies
    }

    /// The L4 front, if the lab has one.
    pub fn front(&self) -> Option<&Front> {
        self.front.as_ref()
    }

    /// Where clients connect (plain, TLS): through the client's link if it has one, else
    /// the front if there is one, else the first proxy.
    pub fn entry(&self) -> Option<(SocketAddr, Option<SocketAddr>)> {
        if let Some((http, https)) = &self.entry_relays {
            return Some((http.addr(), https.as_ref().map(Relay::addr)));
        }
        self.direct_entry()
    }

    /// The client's network namespace, with namespace isolation: the load generator's
    /// threads enter it (see [`crate::process::enter_netns`]).
    pub fn client_netns(&self) -> Option<PathBuf> {
        let client = &self.spec.topology.client;
        self.nodes
            .all()
            .iter()
            .find(|n| &n.name == client)
            .and_then(|n| n.netns.clone())
    }

    /// The kernel as each proxy runs with it, read back, not as asked: each node's
    /// settings (those the spec sets, and `net.core.somaxconn` of every proxy's node), the
    /// backlog each proxy listener got (its own, capped by `somaxconn`) and the proxies'
    /// open-file limit.
    pub fn kernel(&self) -> record::Kernel {
        let mut sysctls = BTreeMap::new();
        for node in self.nodes.all() {
            let proxy = self.proxy_nodes.contains(&node.name);
            let mut names: Vec<String> = self
                .spec
                .sysctls
                .of(&node.name, proxy)
                .into_keys()
                .collect();
            if proxy {
                names.push("net.core.somaxconn".into());
            }
            if names.is_empty() {
                continue;
            }
            sysctls.insert(
                node.name.clone(),
                kernel::read(node.netns.as_deref(), &names),
            );
        }
        let mut listeners = Vec::new();
        let mut open_files = BTreeMap::new();
        for (p, node) in self.proxies.iter().zip(&self.proxy_nodes) {
            let Some(node) = self.nodes.all().iter().find(|n| &n.name == node) else {
                continue;
            };
            let got = kernel::listen_backlogs(node.netns.as_deref(), node.ip);
            for port in std::iter::once(p.http_port()).chain(p.https_port()) {
                listeners.push(record::Listener {
                    proxy: p.kind().name().to_owned(),
                    node: node.name.clone(),
                    port,
                    backlog: got.get(&port).map(|b| u64::from(*b)),
                });
            }
            if let Some(n) = kernel::open_files_limit(p.pid()) {
                open_files.insert(p.kind().name().to_owned(), n);
            }
        }
        record::Kernel {
            sysctls,
            listeners,
            open_files,
            listen_queue: None,
        }
    }

    /// The listen-queue counters of each proxy node's namespace (none on loopback, where
    /// the counters are the whole machine's).
    pub fn listen_counters(&self) -> Vec<(String, ListenCounters)> {
        let mut out: Vec<(String, ListenCounters)> = Vec::new();
        for node in self.nodes.all() {
            if !self.proxy_nodes.contains(&node.name) || node.netns.is_none() {
                continue;
            }
            if let Some(c) = kernel::listen_counters(node.netns.as_deref()) {
                out.push((node.name.clone(), c));
            }
        }
        out
    }

    /// The nodes made so far (the client's first).
    pub fn nodes(&self) -> &[Node] {
        self.nodes.all()
    }

    /// Where everything runs and the links on the request's path, for the results: each
    /// node with its address, what runs on it and its column along the path (client 0,
    /// front 1, proxies 2, sidecar 3, backends 4), and each link crossed with its settings.
    pub fn map(&self) -> record::Topology {
        let t = &self.spec.topology;
        let mut runs: Vec<(String, usize, String)> = vec![(t.client.clone(), 0, "client".into())];
        if self.front.is_some() {
            runs.push((t.front.clone(), 1, "L4 front (haproxy)".into()));
        }
        // Each proxy kind on each node, counted.
        let mut placed: Vec<(&str, ProxyKind, usize)> = Vec::new();
        for (p, node) in self.proxies.iter().zip(&self.proxy_nodes) {
            match placed
                .iter_mut()
                .find(|(n, k, _)| n == node && *k == p.kind())
            {
                Some(entry) => entry.2 += 1,
                None => placed.push((node, p.kind(), 1)),
            }
        }
        for (node, kind, n) in &placed {
            let times = if *n > 1 {
                format!(" x{n}")
            } else {
                String::new()
            };
            runs.push(((*node).to_owned(), 2, format!("{kind}{times}")));
        }
        if self.sidecar.is_some() {
            runs.push((t.sidecar.clone(), 3, "sidecar (envoy)".into()));
        }
        for b in &self.backends {
            runs.push((b.node.clone(), 4, b.name.clone()));
        }
        let proxy_nodes: Vec<&str> = placed.iter().map(|(n, _, _)| *n).collect();
        let callers: Vec<&str> = if self.sidecar.is_some() {
            vec![t.sidecar.as_str()]
        } else {
            proxy_nodes.clone()
        };
        let mut hops: Vec<(&str, &str)> = Vec::new();
        match &self.front {
            Some(_) => {
                hops.push((&t.client, &t.front));
                hops.extend(proxy_nodes.iter().map(|n| (t.front.as_str(), *n)));
            }
            None => hops.extend(proxy_nodes.first().map(|n| (t.client.as_str(), *n))),
        }
        if self.sidecar.is_some() {
            hops.extend(proxy_nodes.iter().map(|n| (*n, t.sidecar.as_str())));
        }
        for b in &self.backends {
            hops.extend(callers.iter().map(|c| (*c, b.node.as_str())));
        }
        hops.sort();
        hops.dedup();
        let links = hops
            .into_iter()
            .filter_map(|(from, to)| {
                let l = t.link(from, to)?;
                Some(record::Link {
                    from: from.to_owned(),
                    to: to.to_owned(),
                    delay_us: l.delay.as_micros() as u64,
                    jitter_us: l.jitter.as_micros() as u64,
                    bandwidth_bytes_per_s: l.bandwidth,
                    reset: l.reset,
                })
            })
            .collect();
        let nodes = self
            .nodes
            .all()
            .iter()
            .filter_map(|n| {
                let here: Vec<&(String, usize, String)> =
                    runs.iter().filter(|r| r.0 == n.name).collect();
                let column = here.iter().map(|r| r.1).min()?;
                let parts: Vec<&str> = here.iter().map(|r| r.2.as_str()).collect();
                Some(record::Node {
                    name: n.name.clone(),
                    address: n.ip.to_string(),
                    namespace: n.netns.as_ref().map(|p| p.display().to_string()),
                    column: column as u64,
                    outside: t.outside.contains(&n.name),
                    runs: parts.into_iter().map(str::to_owned).collect(),
                })
            })
            .collect();
        record::Topology {
            isolation: match t.isolation {
                crate::topology::Isolation::Loopback => "loopback",
                crate::topology::Isolation::Netns => "netns",
            }
            .to_owned(),
            nodes,
            links,
        }
    }

    /// Every link relay's own added time per chunk (microseconds), merged, since the lab
    /// started or [`Lab::reset_link_overhead`].
    pub fn link_overhead(&self) -> HistogramUs {
        let mut h = HistogramUs::new();
        for relay in self.relays() {
            h.merge(&relay.overhead());
        }
        h
    }

    /// Starts the links' overhead measurement afresh (a reused lab, a new cell).
    pub fn reset_link_overhead(&self) {
        for relay in self.relays() {
            relay.reset_overhead();
        }
    }

    /// Every link relay.
    fn relays(&self) -> impl Iterator<Item = &Relay> {
        let entry = self
            .entry_relays
            .iter()
            .flat_map(|(a, b)| std::iter::once(a).chain(b.as_ref()))
            .chain(&self.front_relays)
            .chain(&self.sidecar_relay);
        let backends = self
            .backends
            .iter()
            .chain(self.terminating.iter().map(|(b, _)| b))
            .filter_map(|b| b.relay.as_ref());
        entry.chain(backends)
    }

    /// The entry without the client's link.
    pub(super) fn direct_entry(&self) -> Option<(SocketAddr, Option<SocketAddr>)> {
        match &self.front {
            Some(front) => Some((front.http_addr(), front.https_addr())),
            None => self
                .proxies
                .first()
                .map(|p| (p.http_addr(), p.https_addr())),
        }
    }

    /// The running backends.
    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// The lab's TLS files.
    pub fn certs(&self) -> Option<&LabCerts> {
        self.certs.as_ref()
    }

    /// The lab's private directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// From `up` to every proxy listening.
    pub fn startup(&self) -> Duration {
        self.startup
    }

    /// Keeps the directory after tear-down (to look at configs and logs after a failure).
    pub fn keep(&mut self) {
        self.spec.keep = true;
        mark_kept(&self.dir);
        if let Some(reaper) = self.reaper.as_mut() {
            reaper.remove_on_death(Path::new(""));
        }
    }
}
