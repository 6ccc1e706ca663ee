//! Bringing a lab up: its directory, nodes and links, certificates, backends, the
//! sidecar, the proxies and the front, each waited for until it listens.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::certs;
use crate::front::Front;
use crate::kernel;
use crate::model::{check_name, generated_index, GENERATED_DOMAIN};
use crate::process::{OwnedChild, RunAs};
use crate::proxy::{Proxy, ProxyKind, UpstreamMtls};
use crate::reaper::Reaper;
use crate::relay::Relay;
use crate::topology::{Node, Nodes, Topology};
use crate::LabError;

use super::{
    mark_kept, remove_leftovers, watching, Backend, HopSpec, Lab, LabSpec, PoolSpec, DIR_PREFIX,
};

/// How long a backend may take to say where it listens.
const BACKEND_START_TIMEOUT: Duration = Duration::from_secs(10);

impl Lab {
    /// Starts the backends, then the proxies, and waits until each listens.
    pub fn up(spec: LabSpec) -> Result<Lab, LabError> {
        let started = Instant::now();
        for pool in &spec.pools {
            check_name("pool", &pool.name)?;
        }
        spec.check_upstream_protocol()?;
        spec.check_kernel()?;
        remove_leftovers();
        let nodes = Nodes::new(spec.topology.isolation)?;
        let dir = private_dir()?;
        let mut reaper = Reaper::start(&spec.backend_binary)?;
        if spec.keep {
            mark_kept(&dir);
        } else {
            reaper.remove_on_death(&dir);
        }
        let mut lab = Lab {
            reaper: Some(reaper),
            overlay: spec.overlay.clone(),
            spec,
            dir,
            certs: None,
            backends: Vec::new(),
            proxies: Vec::new(),
            proxy_nodes: Vec::new(),
            front: None,
            nodes,
            entry_relays: None,
            front_relays: Vec::new(),
            sidecar: None,
            sidecar_relay: None,
            told_proxies: None,
            reload_due: false,
            restart_due: None,
            restarting: None,
            stopping: Arc::default(),
            generation: 1,
            sidecar_generation: 1,
            serial: 0,
            startup: Duration::ZERO,
            terminating: Vec::new(),
            pending: Vec::new(),
            stalled: Vec::new(),
            records: Vec::new(),
        };
        match lab.start_all() {
            Ok(()) => {
                lab.startup = started.elapsed();
                Ok(lab)
            }
            Err(e) => {
                // A process that would not start left a log the error points to: keep it.
                if matches!(e, LabError::NotReady { .. }) {
                    lab.spec.keep = true;
                    mark_kept(&lab.dir);
                }
                Err(e)
            }
        }
    }

    /// Starts every part, in the order each needs the one before: the client's node
    /// (first, so that on loopback it is 127.0.0.1), certificates, backends, the sidecar,
    /// the proxies, the L4 front, and the links the client's traffic crosses.
    fn start_all(&mut self) -> Result<(), LabError> {
        let topology = self.spec.topology.clone();
        self.node(&topology.client)?;
        self.start_certs()?;
        for pool in self.spec.pools.clone() {
            for _ in 0..pool.replicas {
                self.start_backend(&pool)?;
            }
        }
        self.table().validate()?;
        if self.spec.hop.is_some() {
            self.start_sidecar(&topology)?;
        }
        self.start_proxies(&topology)?;
        if self.spec.front.is_some() {
            self.start_front(&topology)?;
        }
        if let Some((http, https)) = self.direct_entry() {
            self.link_entry(&topology, http, https)?;
        }
        Ok(())
    }

    /// The lab's CA and certificates, over TLS or for the sidecar's mutual TLS, owned by
    /// the lab's user.
    fn start_certs(&mut self) -> Result<(), LabError> {
        let mtls = self.spec.hop.as_ref().is_some_and(|h| h.mtls);
        if self.spec.tls || mtls {
            // Generated routes, thousands of them, and any added later: one wildcard.
            let mut hosts: Vec<String> = Vec::new();
            for r in &self.spec.routes {
                let host = match generated_index(r) {
                    Some(_) => format!("*.{GENERATED_DOMAIN}"),
                    None => r.host.clone(),
                };
                if !hosts.contains(&host) {
                    hosts.push(host);
                }
            }
            let certs = certs::generate(&self.dir, &hosts)?;
            certs
                .files()
                .into_iter()
                .try_for_each(crate::identity::own)?;
            self.certs = Some(certs);
        }
        Ok(())
    }

    /// The sidecar (an Envoy between the proxies and the backends), and the link to it.
    fn start_sidecar(&mut self, topology: &Topology) -> Result<(), LabError> {
        let mtls = self.spec.hop.as_ref().is_some_and(|h| h.mtls);
        let mut options = self.spec.proxy_options.clone();
        options.upstream_mtls = match (&self.certs, mtls) {
            (Some(c), true) => Some(UpstreamMtls {
                ca: c.ca.clone(),
                cert: c.client_cert.clone(),
                key: c.client_key.clone(),
            }),
            _ => None,
        };
        let node = self.node(&topology.sidecar)?;
        let table = self.sidecar_table();
        let sidecar = Proxy::start(
            ProxyKind::Envoy,
            &node,
            &self.spec.binaries,
            &self.dir.join("sidecar"),
            &table,
            None,
            &options,
            watching(&mut self.reaper),
        )?;
        let at = sidecar.http_addr();
        self.sidecar = Some(sidecar);
        self.sidecar_relay = self.link(&topology.proxy_node(1), &node, at, "the sidecar", false)?;
        Ok(())
    }

    /// Each proxy of the spec, `front` replicas of each (one without a front), every one
    /// told the same routing table.
    fn start_proxies(&mut self, topology: &Topology) -> Result<(), LabError> {
        let table = self.proxies_table();
        self.told_proxies = Some(table.clone());
        let replicas = self.spec.front.unwrap_or(1);
        for kind in self.spec.proxies.clone() {
            for replica in 1..=replicas {
                let node = self.node(&topology.proxy_node(replica))?;
                let tls = self
                    .certs
                    .as_ref()
                    .map(|c| (c.cert.as_path(), c.key.as_path(), c.combined.as_path()));
                // Replicas of a proxy live in directories of their own.
                let dir = if replicas > 1 {
                    self.dir.join(format!("replica-{replica}"))
                } else {
                    self.dir.clone()
                };
                let proxy = Proxy::start(
                    kind,
                    &node,
                    &self.spec.binaries,
                    &dir,
                    &table,
                    tls,
                    &self.spec.proxy_options,
                    watching(&mut self.reaper),
                )?;
                self.proxies.push(proxy);
                self.proxy_nodes.push(node.name);
            }
        }
        Ok(())
    }

    /// The L4 front before the proxy replicas, reaching each through the link between
    /// their nodes.
    fn start_front(&mut self, topology: &Topology) -> Result<(), LabError> {
        let front_node = self.node(&topology.front)?;
        // The front reaches each replica through the link between their nodes.
        let targets: Vec<(String, SocketAddr, Option<SocketAddr>)> = self
            .proxies
            .iter()
            .zip(&self.proxy_nodes)
            .map(|(p, n)| (n.clone(), p.http_addr(), p.https_addr()))
            .collect();
        let mut reach = |node: &str, addr: SocketAddr| -> Result<SocketAddr, LabError> {
            let node = self.node(node)?;
            Ok(
                match self.link(&topology.front, &node, addr, "a proxy replica", false)? {
                    Some(relay) => {
                        let at = relay.addr();
                        self.front_relays.push(relay);
                        at
                    }
                    None => addr,
                },
            )
        };
        let mut http = Vec::new();
        let mut https = Some(Vec::new());
        for (node, plain, tls) in &targets {
            http.push(reach(node, *plain)?);
            https = match (https, tls) {
                (Some(mut all), Some(at)) => {
                    all.push(reach(node, *at)?);
                    Some(all)
                }
                _ => None,
            };
        }
        let front = Front::start(
            &self.spec.binaries,
            &front_node,
            &self.dir,
            &http,
            https.as_deref(),
            watching(&mut self.reaper),
        )?;
        self.front = Some(front);
        Ok(())
    }

    /// The link from the client's node to where its traffic enters (the front, or the
    /// first proxy), when the topology puts one there.
    fn link_entry(
        &mut self,
        topology: &Topology,
        http: SocketAddr,
        https: Option<SocketAddr>,
    ) -> Result<(), LabError> {
        let entry_node = if self.front.is_some() {
            topology.front.clone()
        } else {
            topology.proxy_node(1)
        };
        let entry = self.node(&entry_node)?;
        if let Some(relay) = self.link(&topology.client, &entry, http, "the entry", false)? {
            // The TLS port's relay carries its UDP twin too: the proxies that serve HTTP/3
            // listen for QUIC there.
            let https = match https {
                Some(at) => self.link(&topology.client, &entry, at, "the entry", true)?,
                None => None,
            };
            self.entry_relays = Some((relay, https));
        }
        Ok(())
    }

    /// The node called `name`, made if it is new (the reaper is told of its namespace).
    /// A new node gets its kernel settings before anything starts on it.
    fn node(&mut self, name: &str) -> Result<Node, LabError> {
        check_name("node", name)?;
        let new = !self.nodes.all().iter().any(|n| n.name == name);
        let reaper = &mut self.reaper;
        let node = self.nodes.get(name, &mut |ns| {
            if let Some(r) = reaper.as_mut() {
                r.remove_netns_on_death(ns);
            }
        })?;
        let settings = self
            .spec
            .sysctls
            .of(name, self.spec.topology.is_proxy_node(name));
        if let (true, false, Some(ns)) = (new, settings.is_empty(), &node.netns) {
            kernel::apply(name, ns, &settings)?;
        }
        Ok(node)
    }

    /// A relay on the link from node `from` to `to` (where `target` listens), or `None`
    /// when both are the same node. It listens on `to`'s address, in `to`'s namespace;
    /// with `udp`, for datagrams to `target`'s UDP port too.
    fn link(
        &self,
        from: &str,
        to: &Node,
        target: SocketAddr,
        what: &str,
        udp: bool,
    ) -> Result<Option<Relay>, LabError> {
        let Some(link) = self.spec.topology.link(from, &to.name) else {
            return Ok(None);
        };
        Relay::start((to.ip, 0).into(), target, link, udp, to.netns.as_deref())
            .map(Some)
            .map_err(|e| LabError::Network {
                action: format!(
                    "starting the link relay in front of {what} on node {}",
                    to.name
                ),
                reason: e.to_string(),
            })
    }

    pub(super) fn start_backend(&mut self, pool: &PoolSpec) -> Result<(), LabError> {
        self.serial += 1;
        let index = self.backends.iter().filter(|b| b.pool == pool.name).count() + 1;
        let mut name = format!("{}-{index}", pool.name);
        while self.backends.iter().any(|b| b.name == name) {
            name = format!("{}-{}", pool.name, self.serial);
        }
        let node = self.node(&self.spec.topology.backend_node(&name))?;
        let log = self.dir.join(format!("backend-{name}.log"));
        let mut args = vec![
            "backend".to_owned(),
            "--name".into(),
            name.clone(),
            "--listen".into(),
            SocketAddr::from((node.ip, 0)).to_string(),
        ];
        args.extend(pool.backend_args.iter().cloned());
        if let (Some(certs), Some(HopSpec { mtls: true })) = (&self.certs, &self.spec.hop) {
            for (flag, path) in [
                ("--tls-cert", &certs.cert),
                ("--tls-key", &certs.key),
                ("--client-ca", &certs.ca),
            ] {
                args.extend([flag.to_owned(), path.display().to_string()]);
            }
        }
        // A replica that takes the name of one removed earlier appends to its log: only
        // what this process writes tells its address.
        let logged_before = std::fs::metadata(&log).map_or(0, |m| m.len());
        let user = crate::identity::lab_identity()?;
        let program =
            crate::identity::runnable(&self.spec.backend_binary, user, &self.dir.join("bin"))?;
        let mut child = OwnedChild::spawn_with_env(
            &format!("backend {name}"),
            &program,
            &args,
            &[],
            &self.dir,
            &log,
            RunAs {
                netns: node.netns.as_deref(),
                user,
            },
        )?;
        self.watch(child.pid());
        let addr = wait_for_address(&mut child, &log, logged_before)?;
        // The proxies (or the sidecar, with a hop) call the backends; with a node per
        // replica, the link is the first replica's (the same unless `between` says).
        let caller = if self.spec.hop.is_some() {
            self.spec.topology.sidecar.clone()
        } else {
            self.spec.topology.proxy_node(1)
        };
        let relay = self.link(&caller, &node, addr, &format!("backend {name}"), false)?;
        self.backends.push(Backend {
            name,
            pool: pool.name.clone(),
            addr,
            node: node.name,
            relay,
            child,
        });
        Ok(())
    }

    fn watch(&mut self, pid: u32) {
        watching(&mut self.reaper)(pid);
    }
}

fn private_dir() -> Result<PathBuf, LabError> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| LabError::Io {
        action: "creating",
        path: dir.clone(),
        source,
    })?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(|source| {
        LabError::Io {
            action: "securing",
            path: dir.clone(),
            source,
        }
    })?;
    crate::identity::own(&dir)?;
    Ok(dir)
}

/// Reads the `listening on ADDR` line a backend writes first, in its log from byte `from`
/// (what it appended).
fn wait_for_address(child: &mut OwnedChild, log: &Path, from: u64) -> Result<SocketAddr, LabError> {
    let started = Instant::now();
    loop {
        if let Ok(bytes) = std::fs::read(log) {
            let ours = bytes.get(usize::try_from(from).unwrap_or(usize::MAX)..);
            if let Some(addr) = String::from_utf8_lossy(ours.unwrap_or_default())
                .lines()
                .find_map(|l| l.strip_prefix("listening on "))
                .and_then(|a| a.trim().parse().ok())
            {
                return Ok(addr);
            }
        }
        if let Some(status) = child.try_wait() {
            return Err(child.not_ready(format!("exited with {status}")));
        }
        if started.elapsed() > BACKEND_START_TIMEOUT {
            return Err(child.not_ready(format!(
                "no `listening on` line after {BACKEND_START_TIMEOUT:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
