//! Nodes: where each part of a lab runs, as an address of its own (127.0.N.1 on loopback)
//! or a Linux network namespace of its own (addresses from 198.18.0.0/15, the range
//! reserved for benchmarking), and the emulated links between them.
//!
//! With network namespaces, each lab has a hub namespace holding a bridge; every node is a
//! namespace joined to the bridge by a veth pair, and the host joins it too (one veth
//! whose address is the only thing the lab adds to the host's own namespace), so that the
//! tool's control plane (readiness checks, admin APIs) reaches every node. Every name
//! carries the owner's process id and the lab's number (`ingressbench-PID-N-…` for
//! namespaces, `ibPIDxN` for the host's veth); the lab's reaper removes them if the tool
//! dies, and [`remove_stale`] removes those whose owner is gone.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::relay::LinkSpec;
use crate::LabError;

/// Where network namespaces are bound (`ip netns`).
const NETNS_DIR: &str = "/run/netns";
/// The prefix of every namespace a lab makes.
const NETNS_PREFIX: &str = "ingressbench-";
/// The prefix of the host-side veth a lab makes.
const LINK_PREFIX: &str = "ib";

/// How nodes are kept apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// Each node an address on loopback (127.0.N.1): no root needed.
    #[default]
    Loopback,
    /// Each node a network namespace joined by veth pairs (root).
    Netns,
}

/// Where each part of a lab runs, and the links between nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    /// How nodes are kept apart.
    pub isolation: Isolation,
    /// The load generator's node.
    pub client: String,
    /// The L4 front's node.
    pub front: String,
    /// The proxies' node (every replica), or with `proxies_each` the stem of one node per
    /// replica (`ingress-1`, `ingress-2`, …).
    pub proxies: String,
    /// Each replica of a proxy on a node of its own.
    pub proxies_each: bool,
    /// The sidecar's node.
    pub sidecar: String,
    /// The backends' node; `None`: each backend on a node of its own, named after it.
    pub backends: Option<String>,
    /// Nodes outside the cluster: every link to one of them is `internet`.
    pub outside: Vec<String>,
    /// The link between two nodes of the cluster.
    pub cross_node: LinkSpec,
    /// The link between a node outside and one inside.
    pub internet: LinkSpec,
    /// Links for particular pairs of nodes, either way round.
    pub between: Vec<(String, String, LinkSpec)>,
}

impl Default for Topology {
    /// Everything on one node: no links.
    fn default() -> Self {
        Self::on_one_node("node-1")
    }
}

impl Topology {
    /// Every part on `node`.
    pub fn on_one_node(node: &str) -> Self {
        Self {
            isolation: Isolation::Loopback,
            client: node.into(),
            front: node.into(),
            proxies: node.into(),
            proxies_each: false,
            sidecar: node.into(),
            backends: Some(node.into()),
            outside: Vec::new(),
            cross_node: LinkSpec::delay(
                std::time::Duration::from_micros(300),
                std::time::Duration::from_micros(50),
            ),
            internet: LinkSpec::delay(
                std::time::Duration::from_millis(20),
                std::time::Duration::from_millis(2),
            ),
            between: Vec::new(),
        }
    }

    /// The link on the path from node `a` to node `b` (`None`: the same node).
    pub fn link(&self, a: &str, b: &str) -> Option<LinkSpec> {
        if a == b {
            return None;
        }
        let pair = self
            .between
            .iter()
            .find(|(x, y, _)| (x == a && y == b) || (x == b && y == a));
        if let Some((_, _, link)) = pair {
            return Some(*link);
        }
        if self.outside.iter().any(|n| n == a || n == b) {
            Some(self.internet)
        } else {
            Some(self.cross_node)
        }
    }

    /// The node of the backend called `name`.
    pub fn backend_node(&self, name: &str) -> String {
        self.backends.clone().unwrap_or_else(|| name.to_owned())
    }

    /// The node of a proxy's `replica` (from 1).
    pub fn proxy_node(&self, replica: usize) -> String {
        if self.proxies_each {
            format!("{}-{replica}", self.proxies)
        } else {
            self.proxies.clone()
        }
    }

    /// Whether `name` is the node of a proxy replica.
    pub fn is_proxy_node(&self, name: &str) -> bool {
        if self.proxies_each {
            numbered(name, &self.proxies)
        } else {
            name == self.proxies
        }
    }

    /// Checks that each node a `between` link names is a node of a lab with these pools.
    pub fn check_between(&self, pools: &[&str]) -> Result<(), String> {
        for (a, b, _) in &self.between {
            for node in [a, b] {
                self.check_node(node, pools, "topology.links.between")?;
            }
        }
        Ok(())
    }

    /// Checks that `node` is a node of a lab with these pools: one the placement names, or
    /// a backend's (`POOL-N`) when each has its own, or a replica's (`STEM-N`) when each
    /// has its own. A misspelt node would never match; the error starts with `field`.
    pub fn check_node(&self, node: &str, pools: &[&str], field: &str) -> Result<(), String> {
        let mut named: Vec<&str> = vec![&self.client, &self.front, &self.sidecar];
        if !self.proxies_each {
            named.push(&self.proxies);
        }
        named.extend(self.backends.as_deref());
        let known = named.contains(&node)
            || self.is_proxy_node(node)
            || (self.backends.is_none() && pools.iter().any(|p| numbered(node, p)));
        if known {
            return Ok(());
        }
        named.sort_unstable();
        named.dedup();
        Err(format!(
            "{field}: `{node}` is not a node of this lab (its nodes: {}{}{})",
            named.join(", "),
            if self.proxies_each {
                format!(", {}-N", self.proxies)
            } else {
                String::new()
            },
            if self.backends.is_none() {
                ", POOL-N for each backend"
            } else {
                ""
            },
        ))
    }
}

/// One node as the lab made it: its address, and its namespace if it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The node's name in the lab file (`node-1`…).
    pub name: String,
    /// The address its processes listen on.
    pub ip: IpAddr,
    /// Its network namespace (`/run/netns/…`), with namespace isolation.
    pub netns: Option<PathBuf>,
}

/// A lab's nodes, made as they are first used. (The local cluster's node agent uses them
/// too: a pod is a node of its own.)
#[derive(Debug)]
pub struct Nodes {
    isolation: Isolation,
    /// `PID-N`: who made them.
    id: String,
    /// The third and fourth octets' base: nodes are 198.18.0.0 + subnet * 256 + index.
    subnet: Option<u32>,
    nodes: Vec<Node>,
    /// How many nodes were ever made: an address is given once while the lab's
    /// [`NODES_PER_LAB`] last.
    made_count: u32,
    /// After that, the released ones (their index), the longest released first.
    released: std::collections::VecDeque<u32>,
    /// The namespaces made, hub first.
    made: Vec<String>,
    host_link: Option<String>,
}

/// The nodes of one lab: `.1` to `.252` of its /24 (`.253` is the local cluster's hub,
/// `.254` the host's side of the lab).
const NODES_PER_LAB: u32 = 252;

/// Numbers the labs of this process.
static LABS: AtomicUsize = AtomicUsize::new(0);
/// Subnets are picked one lab at a time.
static PICKING: Mutex<()> = Mutex::new(());

impl Nodes {
    /// No node yet; namespaces need root.
    pub fn new(isolation: Isolation) -> Result<Self, LabError> {
        let lab = LABS.fetch_add(1, Ordering::Relaxed) % 10_000;
        if isolation == Isolation::Netns {
            check_netns_possible()?;
        }
        Ok(Self {
            isolation,
            id: format!("{}x{lab}", std::process::id()),
            subnet: None,
            nodes: Vec::new(),
            made_count: 0,
            released: std::collections::VecDeque::new(),
            made: Vec::new(),
            host_link: None,
        })
    }

    /// Every node made so far.
    pub fn all(&self) -> &[Node] {
        &self.nodes
    }

    /// The node called `name`, made if it is new (`told` hears of each namespace made,
    /// so that the reaper can remove it).
    pub fn get(&mut self, name: &str, told: &mut dyn FnMut(&str)) -> Result<Node, LabError> {
        if let Some(n) = self.nodes.iter().find(|n| n.name == name) {
            return Ok(n.clone());
        }
        let mut index = self.made_count;
        let node = match self.isolation {
            Isolation::Loopback => {
                if index > 255 {
                    return Err(network("placing nodes", "more than 256 nodes on loopback"));
                }
                Node {
                    name: name.to_owned(),
                    ip: IpAddr::V4(Ipv4Addr::new(127, 0, index as u8, 1)),
                    netns: None,
                }
            }
            Isolation::Netns => {
                if index >= NODES_PER_LAB {
                    // A long-lived lab (the local cluster's pods) gives out again the
                    // address released longest ago, with the MAC address it had (below).
                    index = self.released.pop_front().ok_or_else(|| {
                        network("placing nodes", "more than 252 nodes at once in one lab")
                    })?;
                }
                let subnet = match self.subnet {
                    Some(s) => s,
                    None => self.make_hub(told)?,
                };
                let ns = format!("{NETNS_PREFIX}{}-{}", self.id, index + 1);
                let hub = self.made[0].clone();
                let ip = subnet_ip(subnet, index + 1);
                self.made.push(ns.clone());
                told(&ns);
                let port = format!("n{}", index + 1);
                ip_cmd(&["netns", "add", &ns])?;
                ip_cmd(&["-n", &ns, "link", "set", "lo", "up"])?;
                ip_cmd(&[
                    "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                    "netns", &ns,
                ])?;
                ip_cmd(&["-n", &hub, "link", "set", &port, "master", "br0", "up"])?;
                // Its MAC address follows from its IP address (as Docker's do): a
                // neighbour entry another namespace still holds for an address given out
                // again points at the right node (a stale one kept a new pod unreachable
                // for 9 s).
                let [_, _, a, b] = ip.octets();
                let mac = format!("02:42:c6:12:{a:02x}:{b:02x}");
                ip_cmd(&["-n", &ns, "link", "set", "eth0", "address", &mac])?;
                ip_cmd(&["-n", &ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
                ip_cmd(&["-n", &ns, "link", "set", "eth0", "up"])?;
                Node {
                    name: name.to_owned(),
                    ip: IpAddr::V4(ip),
                    netns: Some(Path::new(NETNS_DIR).join(&ns)),
                }
            }
        };
        self.made_count = self.made_count.max(index + 1);
        self.nodes.push(node.clone());
        Ok(node)
    }

    /// The hub's namespace and the lab's subnet (`198.18.X.0`), the hub made if it is not
    /// yet (with namespace isolation only: on loopback there is none). The local cluster's
    /// node agent serves what stands for the cluster's network there (its Services and
    /// DNS).
    pub fn hub(&mut self, told: &mut dyn FnMut(&str)) -> Result<(PathBuf, Ipv4Addr), LabError> {
        if self.isolation != Isolation::Netns {
            return Err(network("making the hub", "nodes on loopback have no hub"));
        }
        let subnet = match self.subnet {
            Some(s) => s,
            None => self.make_hub(told)?,
        };
        Ok((
            Path::new(NETNS_DIR).join(&self.made[0]),
            subnet_ip(subnet, 0),
        ))
    }

    /// Removes the node called `name` and its namespace (its address is given out again
    /// only once the lab's [`NODES_PER_LAB`] have all been, the one released longest ago
    /// first).
    pub fn release(&mut self, name: &str) {
        let Some(at) = self.nodes.iter().position(|n| n.name == name) else {
            return;
        };
        let node = self.nodes.remove(at);
        if let Some(ns) = node.netns.as_ref().and_then(|p| p.file_name()) {
            let ns = ns.to_string_lossy().into_owned();
            // Node `index` is at `.index + 1`, its port on the hub `n(index + 1)`: deleted
            // first, since a namespace goes (and its veth pair with it) only once nothing
            // holds it, after `netns del` returns.
            if let (IpAddr::V4(ip), Some(hub)) = (node.ip, self.made.first()) {
                let host = ip.octets()[3];
                let _ = ip_cmd(&["-n", hub, "link", "del", &format!("n{host}")]);
                self.released.push_back(u32::from(host) - 1);
            }
            let _ = ip_cmd(&["netns", "del", &ns]);
            self.made.retain(|m| *m != ns);
        }
    }

    /// Makes the hub (a namespace with a bridge) and joins the host to it; returns the
    /// lab's subnet.
    fn make_hub(&mut self, told: &mut dyn FnMut(&str)) -> Result<u32, LabError> {
        let _one_at_a_time = PICKING.lock();
        let hub = format!("{NETNS_PREFIX}{}-hub", self.id);
        let link = format!("{LINK_PREFIX}{}", self.id);
        self.made.push(hub.clone());
        told(&hub);
        ip_cmd(&["netns", "add", &hub])?;
        ip_cmd(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip_cmd(&["-n", &hub, "link", "set", "br0", "up"])?;
        self.host_link = Some(link.clone());
        ip_cmd(&[
            "link", "add", &link, "type", "veth", "peer", "name", "host", "netns", &hub,
        ])?;
        ip_cmd(&["-n", &hub, "link", "set", "host", "master", "br0", "up"])?;
        let subnet = free_subnet(&self.id)?;
        ip_cmd(&[
            "addr",
            "add",
            &format!("{}/24", subnet_ip(subnet, 254)),
            "dev",
            &link,
        ])?;
        ip_cmd(&["link", "set", &link, "up"])?;
        self.subnet = Some(subnet);
        Ok(subnet)
    }

    /// Removes every namespace and link made (the host's veth goes with the hub).
    pub fn remove(&mut self) {
        for ns in self.made.drain(..).rev() {
            let _ = ip_cmd(&["netns", "del", &ns]);
        }
        if let Some(link) = self.host_link.take() {
            // Gone with its peer in the hub already, unless the hub was never made.
            let _ = ip(&["link", "del", &link]);
        }
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Whether `name` is `STEM-N`.
fn numbered(name: &str, stem: &str) -> bool {
    name.strip_prefix(stem)
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn subnet_ip(subnet: u32, host: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + subnet * 256 + host)
}

/// One of the 512 /24s of 198.18.0.0/15 that no interface of the host uses, starting from
/// one picked from `id` (so that concurrent labs rarely even try the same one).
fn free_subnet(id: &str) -> Result<u32, LabError> {
    let out = ip(&["-o", "-4", "addr", "show"])
        .map_err(|e| network("listing the host's addresses", &e.to_string()))?;
    let used = String::from_utf8_lossy(&out.stdout).into_owned();
    let start = id
        .bytes()
        .fold(17u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()))
        % 512;
    (0..512)
        .map(|i| (start + i) % 512)
        .find(|s| {
            let [a, b, c, _] = subnet_ip(*s, 0).octets();
            !used.contains(&format!(" {a}.{b}.{c}."))
        })
        .ok_or_else(|| network("picking a subnet", "every /24 of 198.18.0.0/15 is in use"))
}

/// Whether this machine lets us make namespaces: root, and `ip` installed.
fn check_netns_possible() -> Result<(), LabError> {
    if !rustix::process::geteuid().is_root() {
        return Err(network(
            "isolation: netns",
            "network namespaces need root (CAP_NET_ADMIN): run as root, or use `isolation: loopback` (each node an address on 127.0.0.0/8)",
        ));
    }
    match ip(&["-V"]) {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err(network(
            "isolation: netns",
            "`ip` (iproute2) is missing: apt-get install iproute2",
        )),
    }
}

/// How long one `ip` command may take.
const IP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `ip ARGS` to its end, bounded like every child of the tool.
pub(crate) fn ip(args: &[&str]) -> std::io::Result<std::process::Output> {
    crate::process::run_bounded(Path::new("ip"), args, IP_TIMEOUT)
}

/// Runs `ip ARGS`; an error quotes what it said.
pub fn ip_cmd(args: &[&str]) -> Result<(), LabError> {
    let out = ip(args).map_err(|e| network(&format!("ip {}", args.join(" ")), &e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(network(
            &format!("ip {}", args.join(" ")),
            String::from_utf8_lossy(&out.stderr).trim(),
        ))
    }
}

fn network(action: &str, reason: &str) -> LabError {
    LabError::Network {
        action: action.to_owned(),
        reason: reason.to_owned(),
    }
}

pub use crate::process::enter_netns;

/// A TCP port free on `node`'s address (in its namespace, if it has one), for a proxy
/// whose config must name its port up front. Checking on the address the proxy will bind,
/// not on 127.0.0.1, matters: a port free on one loopback address may be taken on another.
/// Never one this process handed out before: the kernel may give the same free port to
/// two picks in a row (an Envoy got the same port for its admin and its HTTPS listener,
/// and answered TLS clients in plain HTTP).
pub fn free_port(node: &Node) -> io::Result<u16> {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    for _ in 0..64 {
        let port = pick_free_port(node)?;
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if given.insert(port) {
            return Ok(port);
        }
    }
    Err(io::Error::other(
        "no free port that was not handed out before, in 64 tries",
    ))
}

fn pick_free_port(node: &Node) -> io::Result<u16> {
    let (ip, netns) = (node.ip, node.netns.clone());
    let pick = move || -> io::Result<u16> {
        if let Some(ns) = &netns {
            enter_netns(ns)?;
        }
        Ok(std::net::TcpListener::bind((ip, 0))?.local_addr()?.port())
    };
    if node.netns.is_none() {
        return pick();
    }
    // Entering a namespace changes the calling thread's: do it on a thread of its own.
    std::thread::spawn(pick)
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the port-picking thread panicked")))
}

/// Removes namespaces and host links a lab of this tool made and whose owning process is
/// gone (a tool and its reaper both SIGKILLed). Touches nothing else: only names with the
/// tool's prefix, a process id, and the lab-number marker. Returns what it removed.
pub fn remove_stale() -> Vec<String> {
    let mut removed = Vec::new();
    if let Ok(entries) = std::fs::read_dir(NETNS_DIR) {
        for name in entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
        {
            let Some(rest) = name.strip_prefix(NETNS_PREFIX) else {
                continue;
            };
            if owner_gone(rest) && ip_cmd(&["netns", "del", &name]).is_ok() {
                removed.push(name);
            }
        }
    }
    let links = ip(&["-o", "link", "show"])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for line in links.lines() {
        // `7: ib1234x0@if2: <…`
        let Some(name) = line
            .split(": ")
            .nth(1)
            .map(|n| n.split('@').next().unwrap_or(n))
        else {
            continue;
        };
        let Some(rest) = name.strip_prefix(LINK_PREFIX) else {
            continue;
        };
        if owner_gone(rest) && ip_cmd(&["link", "del", name]).is_ok() {
            removed.push(name.to_owned());
        }
    }
    removed
}

/// For `PIDxN…`: whether process PID no longer exists. Anything else is not ours.
fn owner_gone(rest: &str) -> bool {
    let Some((pid, after)) = rest.split_once('x') else {
        return false;
    };
    let lab_number = after.split('-').next().unwrap_or("");
    if pid.is_empty()
        || !pid.bytes().all(|b| b.is_ascii_digit())
        || lab_number.is_empty()
        || !lab_number.bytes().all(|b| b.is_ascii_digit())
    {
        return false;
    }
    !Path::new("/proc").join(pid).exists()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn free_ports_are_never_handed_out_twice() {
        let node = Node {
            name: "n".into(),
            ip: std::net::Ipv4Addr::LOCALHOST.into(),
            netns: None,
        };
        let mut ports: Vec<u16> = (0..300).map(|_| free_port(&node).unwrap()).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 300);
    }

    #[test]
    fn links_follow_nodes_pairs_and_the_outside() {
        let mut t = Topology::on_one_node("a");
        t.outside = vec!["out".into()];
        let slow = LinkSpec::delay(Duration::from_millis(5), Duration::ZERO);
        t.between = vec![("b".into(), "c".into(), slow)];
        assert_eq!(t.link("a", "a"), None);
        assert_eq!(t.link("a", "b"), Some(t.cross_node));
        assert_eq!(t.link("c", "b"), Some(slow), "either way round");
        assert_eq!(t.link("out", "a"), Some(t.internet));
        t.backends = None;
        assert_eq!(t.backend_node("echo-2"), "echo-2");
        assert_eq!(t.proxy_node(2), "a");
        t.proxies_each = true;
        assert_eq!(t.proxy_node(2), "a-2");
    }

    #[test]
    fn between_links_must_name_nodes_of_the_lab() {
        let mut t = Topology::on_one_node("a");
        let link = LinkSpec::delay(Duration::from_millis(1), Duration::ZERO);
        t.between = vec![("a".into(), "echo-3".into(), link)];
        let e = t.check_between(&["echo"]).unwrap_err();
        assert!(e.contains("`echo-3` is not a node"), "{e}");
        t.backends = None;
        t.check_between(&["echo"]).unwrap();
        t.between = vec![("ingres".into(), "a".into(), link)];
        assert!(t.check_between(&["echo"]).is_err(), "a typo");
        t.proxies = "ingress".into();
        t.proxies_each = true;
        t.between = vec![("ingress-2".into(), "a".into(), link)];
        t.check_between(&["echo"]).unwrap();
    }

    #[test]
    fn loopback_nodes_get_their_own_addresses_in_order() {
        let mut nodes = Nodes::new(Isolation::Loopback).unwrap();
        let mut told = |_: &str| panic!("loopback makes no namespace");
        let a = nodes.get("client", &mut told).unwrap();
        let b = nodes.get("ingress", &mut told).unwrap();
        assert_eq!(a.ip.to_string(), "127.0.0.1");
        assert_eq!(b.ip.to_string(), "127.0.1.1");
        assert_eq!(nodes.get("client", &mut told).unwrap(), a, "made once");
    }

    /// Once a lab's 252 addresses have each been given, a released one is given again,
    /// the one released longest ago first, with the MAC address it had; 253 at once are
    /// refused. (Namespaces: root, as the end-to-end tests.)
    #[test]
    fn a_long_lived_labs_addresses_are_given_again_oldest_released_first_with_their_mac() {
        let mut nodes = Nodes::new(Isolation::Netns).unwrap();
        let mut told = |_: &str| {};
        let mac = |node: &Node| {
            let ns = node.netns.as_ref().unwrap().file_name().unwrap().to_owned();
            let out = std::process::Command::new("ip")
                .arg("-n")
                .arg(ns)
                .args(["-o", "link", "show", "eth0"])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.split("link/ether ").nth(1).unwrap()[..17].to_owned()
        };
        let first: Vec<Node> = (0..NODES_PER_LAB)
            .map(|i| nodes.get(&format!("pod-{i}"), &mut told).unwrap())
            .collect();
        assert_eq!(first[251].ip.to_string().rsplit('.').next(), Some("252"));
        let (third, fortieth) = (mac(&first[3]), mac(&first[40]));
        let e = nodes
            .get("one-too-many", &mut told)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than 252 nodes at once"), "{e}");
        nodes.release("pod-40");
        nodes.release("pod-3");
        let again = nodes.get("new-a", &mut told).unwrap();
        assert_eq!(again.ip, first[40].ip, "released longest ago");
        assert_eq!(mac(&again), fortieth);
        assert_ne!(third, fortieth);
        let next = nodes.get("new-b", &mut told).unwrap();
        assert_eq!((next.ip, mac(&next)), (first[3].ip, third));
    }

    #[test]
    fn only_names_of_gone_owners_are_stale() {
        assert!(owner_gone("4194399x3-hub"), "no such pid");
        assert!(!owner_gone(&format!("{}x0-1", std::process::id())), "alive");
        assert!(!owner_gone("lab-7"), "not a name this tool makes");
        assert!(!owner_gone("4194399-hub"), "no lab-number marker");
        assert!(!owner_gone("x1"));
        assert_eq!(subnet_ip(0, 254).to_string(), "198.18.0.254");
        assert_eq!(subnet_ip(511, 1).to_string(), "198.19.255.1");
    }
}
