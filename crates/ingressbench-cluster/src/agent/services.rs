//! The local cluster's network beyond a pod's own address: its Services reachable at
//! their cluster IPs, and their names answered, as kube-proxy and the cluster's DNS make
//! them on a real cluster. Pods reach them through the hub (the namespace holding the
//! pods' bridge), which takes the whole Service range as its own: a pod routes that range
//! to the hub's address on the bridge, which is also its nameserver.
//!
//! - **Services** in kube-proxy's userspace way: for every TCP port of every Service with
//!   a cluster IP, a listener on that address in the hub; each connection it takes goes
//!   to one of the Service's ready endpoints (its EndpointSlices, the port matched by
//!   name), in turn, the next one tried when a connect fails; when none is ready, to the
//!   ones still serving while they terminate (as kube-proxy does since Kubernetes 1.28:
//!   a Deployment of one pod rolled, Envoy Gateway's data plane, keeps answering while its
//!   old pod drains); with none it is closed.
//!   The `kubernetes` Service goes to the API server (which has no endpoints here: it
//!   listens on 127.0.0.1, which an EndpointSlice may not hold).
//! - **Load balancers**, as kind's cloud provider gives them: a Service of type
//!   LoadBalancer (of no `loadBalancerClass`: the local cluster's own controllers' have
//!   one, and an L4 front of their own) gets an address of its own on the host's
//!   loopback (127.1.B.N, never reused; B is the first block of 254 that no other local
//!   cluster's agent holds, 0 when it is alone), written in its status; connections to its ports
//!   there go to its endpoints as above. This is how a load generator on the host reaches
//!   the data plane a Gateway controller creates. Its UDP ports are relayed too (QUIC:
//!   HTTP/3 to Envoy Gateway's data plane): each client address's datagrams go to one
//!   endpoint, through a socket of its own (as a NAT gives a port), and move to another
//!   when that endpoint is no longer ready (as kube-proxy clears a UDP flow's conntrack
//!   entry when its endpoint goes).
//! - **DNS**: `SERVICE.NAMESPACE.svc.cluster.local` is the Service's cluster IP (a
//!   headless one's ready endpoints), on UDP port 53 of the hub's address; any other name
//!   does not exist (there is no upstream). Each pod gets the `resolv.conf` and `hosts`
//!   the kubelet writes.
//!
//! It runs on a thread of its own, in the host's namespace (it reaches the pods through
//! the host's link to the bridge, and the API server on 127.0.0.1), with its listening
//! sockets made in the hub. It reads the Services and EndpointSlices every
//! [`REFRESH`]: a new Service is reachable, and an endpoint's change followed, within
//! that.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointSlice};
use kube::api::ListParams;
use kube::{Api, Client};

use crate::ClusterError;

/// How often the Services and their endpoints are read.
pub const REFRESH: Duration = Duration::from_millis(500);
/// The cluster's DNS domain.
pub(super) const DOMAIN: &str = "cluster.local";
/// The hub bridge's own MAC address (locally administered), fixed.
const HUB_MAC: &str = "02:69:62:00:00:01";
/// How long a connection to an endpoint may take to be made before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a client's UDP flow through a load balancer lasts without an answer.
const FLOW_IDLE: Duration = Duration::from_secs(60);
/// Client addresses one UDP port relays at once; a datagram from one more is dropped.
const MAX_FLOWS: usize = 1024;

/// The addresses given to LoadBalancer Services, by namespace and name: 127.1.B.N, in
/// the block B this cluster holds.
#[derive(Debug, Default)]
struct Balancers {
    block: u8,
    /// What holds the block while the agent runs (none in the unit tests).
    _claim: Option<std::os::unix::net::UnixListener>,
    given: BTreeMap<(String, String), Ipv4Addr>,
    /// Those whose status says so.
    announced: std::collections::BTreeSet<(String, String)>,
}

impl Balancers {
    /// The first block no other agent on this host holds, held from now on: an abstract
    /// Unix socket named for it (`ingressbench/balancers/127.1.B`), which only one process
    /// can bind and which goes when the process does, however it ends. Two local clusters
    /// side by side would otherwise give two data planes the same address and port.
    fn claim() -> Result<Balancers, ClusterError> {
        use std::os::linux::net::SocketAddrExt;
        for block in 0..=u8::MAX {
            let name = format!("ingressbench/balancers/127.1.{block}");
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                .map_err(|e| ClusterError::Api(format!("the load balancers' block: {e}")))?;
            if let Ok(claim) = std::os::unix::net::UnixListener::bind_addr(&addr) {
                return Ok(Balancers {
                    block,
                    _claim: Some(claim),
                    ..Balancers::default()
                });
            }
        }
        Err(ClusterError::Api(
            "every block of load-balancer addresses (127.1.0.0/16) is held by another local \
             cluster's node agent: take one of them down (`ingressbench cluster local down`)"
                .into(),
        ))
    }

    /// The address of Service `key`, given now if it has none (none once the block's 254
    /// are given).
    fn address(&mut self, key: &(String, String)) -> Option<Ipv4Addr> {
        if let Some(ip) = self.given.get(key) {
            return Some(*ip);
        }
        // 127.1.B.1 … 127.1.B.254 (the lab's loopback nodes are 127.0.N.1).
        let n = u8::try_from(self.given.len() + 1)
            .ok()
            .filter(|n| *n < 255)?;
        let ip = Ipv4Addr::new(127, 1, self.block, n);
        self.given.insert(key.clone(), ip);
        Some(ip)
    }
}

/// Where each Service address goes, and what each name is.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tables {
    /// A Service's cluster IP and port: its ready endpoints.
    routes: BTreeMap<SocketAddr, Vec<SocketAddr>>,
    /// A load balancer's UDP port: its ready endpoints.
    datagrams: BTreeMap<SocketAddr, Vec<SocketAddr>>,
    /// `service.namespace.svc.cluster.local`: its addresses.
    names: BTreeMap<String, Vec<Ipv4Addr>>,
}

/// The network's thread; stopped when dropped.
#[derive(Debug)]
pub(super) struct Network {
    /// The hub's address on the pods' bridge: their way to the Services, their
    /// nameserver.
    pub gateway: Ipv4Addr,
    /// The Service range (`10.96.0.0/16`).
    range: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Network {
    /// Gives the hub its address on the bridge (`.253`) and the Service range, and starts
    /// serving both.
    pub(super) fn start(
        nodes: &mut ingressbench_lab::topology::Nodes,
        kubeconfig: &Path,
        api: SocketAddr,
        range: &str,
    ) -> Result<Network, ClusterError> {
        let (hub, subnet) = nodes.hub(&mut |_| {})?;
        let gateway = Ipv4Addr::from(u32::from(subnet) + 253);
        let ns = hub
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        use ingressbench_lab::topology::ip_cmd;
        ip_cmd(&["-n", &ns, "link", "set", "lo", "up"])?;
        // A bridge takes the lowest address of its ports unless given one: a pod joining
        // with a lower one would move the hub's address to a new MAC that the other pods'
        // neighbour entries do not know (seen: Envoy Gateway's calls to the API server
        // stalled 30 s when the pods of a Deployment joined).
        ip_cmd(&["-n", &ns, "link", "set", "br0", "address", HUB_MAC])?;
        ip_cmd(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{gateway}/24"),
            "dev",
            "br0",
        ])?;
        // The whole range is the hub's own: a listener binds any address in it.
        ip_cmd(&["-n", &ns, "route", "add", "local", range, "dev", "lo"])?;
        let dns = in_namespace(&hub, || std::net::UdpSocket::bind((gateway, 53)))
            .map_err(|e| ClusterError::Api(format!("the cluster's DNS on {gateway}:53: {e}")))?;
        let balancers = Balancers::claim()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let kubeconfig = kubeconfig.to_owned();
        let thread = std::thread::Builder::new()
            .name("ib-cluster-network".into())
            .spawn(move || {
                let Ok(runtime) = crate::api::runtime() else {
                    return;
                };
                runtime.block_on(serve(&kubeconfig, api, hub, dns, balancers, &flag));
            })
            .map_err(|e| ClusterError::Api(format!("cannot start the network's thread: {e}")))?;
        Ok(Network {
            gateway,
            range: range.to_owned(),
            stop,
            thread: Some(thread),
        })
    }

    /// Routes the Service range from the pod's namespace to the hub.
    pub(super) fn join(&self, pod_netns: &Path) -> Result<(), ClusterError> {
        let ns = pod_netns
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let via = self.gateway.to_string();
        ingressbench_lab::topology::ip_cmd(&[
            "-n",
            &ns,
            "route",
            "replace",
            &self.range,
            "via",
            &via,
        ])?;
        Ok(())
    }

    /// The `resolv.conf` and `hosts` of a pod, as the kubelet writes them, in `dir`.
    pub(super) fn pod_files(
        &self,
        dir: &Path,
        namespace: &str,
        name: &str,
        ip: IpAddr,
    ) -> std::io::Result<[(PathBuf, &'static str); 2]> {
        std::fs::create_dir_all(dir)?;
        let resolv = dir.join(".resolv.conf");
        std::fs::write(
            &resolv,
            format!(
                "nameserver {}\nsearch {namespace}.svc.{DOMAIN} svc.{DOMAIN} {DOMAIN}\noptions ndots:5\n",
                self.gateway
            ),
        )?;
        let hosts = dir.join(".hosts");
        std::fs::write(
            &hosts,
            format!(
                "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{ip}\t{name}\n"
            ),
        )?;
        for f in [&resolv, &hosts] {
            std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        }
        Ok([(resolv, "/etc/resolv.conf"), (hosts, "/etc/hosts")])
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The first address of `range` (`10.96.0.0/16` → `10.96.0.1`): the `kubernetes`
/// Service's.
pub(super) fn first_address(range: &str) -> Ipv4Addr {
    let base = range
        .split('/')
        .next()
        .and_then(|a| a.parse::<Ipv4Addr>().ok())
        .unwrap_or(Ipv4Addr::UNSPECIFIED);
    Ipv4Addr::from(u32::from(base) + 1)
}

/// Runs `make` on a thread in the namespace at `netns`: the socket it makes lives there.
fn in_namespace<T: Send>(
    netns: &Path,
    make: impl FnOnce() -> std::io::Result<T> + Send,
) -> std::io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            ingressbench_lab::process::enter_netns(netns)?;
            make()
        })
        .join()
        .unwrap_or_else(|_| {
            Err(std::io::Error::other(
                "the thread making the socket panicked",
            ))
        })
    })
}

/// Reads the Services every [`REFRESH`], listens on each one's addresses in the hub,
/// relays what they take, and answers DNS, until `stop`.
async fn serve(
    kubeconfig: &Path,
    api: SocketAddr,
    hub: PathBuf,
    dns: std::net::UdpSocket,
    mut balancers: Balancers,
    stop: &AtomicBool,
) {
    let Ok(client) = crate::api::client(kubeconfig, None).await else {
        return;
    };
    let tables = Arc::new(Mutex::new(Tables::default()));
    let dns_task = tokio::spawn(answer_dns(dns, tables.clone()));
    let mut listening: BTreeMap<SocketAddr, tokio::task::JoinHandle<()>> = BTreeMap::new();
    let mut relaying: BTreeMap<SocketAddr, tokio::task::JoinHandle<()>> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(read) = read_tables(&client, api, &mut balancers).await {
            announce(&client, &mut balancers).await;
            relaying.retain(|addr, task| {
                let kept = read.datagrams.contains_key(addr);
                if !kept {
                    task.abort();
                }
                kept
            });
            for addr in read.datagrams.keys() {
                if relaying.contains_key(addr) {
                    continue;
                }
                let bound = std::net::UdpSocket::bind(addr).and_then(|s| {
                    s.set_nonblocking(true)?;
                    tokio::net::UdpSocket::from_std(s)
                });
                if let Ok(socket) = bound {
                    let task = relay_datagrams(socket, *addr, tables.clone());
                    relaying.insert(*addr, tokio::spawn(task));
                }
            }
            for (addr, task) in std::mem::take(&mut listening) {
                if read.routes.contains_key(&addr) {
                    listening.insert(addr, task);
                } else {
                    task.abort();
                }
            }
            for addr in read.routes.keys() {
                if listening.contains_key(addr) {
                    continue;
                }
                let listen = || {
                    let l = std::net::TcpListener::bind(addr)?;
                    l.set_nonblocking(true)?;
                    Ok(l)
                };
                // A load balancer's address is the host's; a cluster IP, the hub's.
                let bound = match addr.ip().is_loopback() {
                    true => listen(),
                    false => in_namespace(&hub, listen),
                };
                if let Ok(l) = bound.and_then(tokio::net::TcpListener::from_std) {
                    listening.insert(*addr, tokio::spawn(relay_all(l, *addr, tables.clone())));
                }
            }
            *tables.lock().unwrap_or_else(|p| p.into_inner()) = read;
        }
        tokio::time::sleep(REFRESH).await;
    }
    dns_task.abort();
    for task in listening.into_values().chain(relaying.into_values()) {
        task.abort();
    }
}

/// Writes each load balancer's address in its Service's status (once it is there, not
/// again; one the API refuses is tried at the next read).
async fn announce(client: &Client, balancers: &mut Balancers) {
    use kube::api::{Patch, PatchParams};
    for (key, ip) in &balancers.given {
        if balancers.announced.contains(key) {
            continue;
        }
        let (ns, name) = key;
        let status = serde_json::json!({ "status": { "loadBalancer": { "ingress": [{ "ip": ip.to_string(), "ipMode": "VIP" }] } } });
        let api: Api<Service> = Api::namespaced(client.clone(), ns);
        if api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .is_ok()
        {
            balancers.announced.insert(key.clone());
        }
    }
}

/// The Services and their ready endpoints, now.
async fn read_tables(
    client: &Client,
    api: SocketAddr,
    balancers: &mut Balancers,
) -> Result<Tables, kube::Error> {
    // From the API server's cache (resourceVersion 0), as informers start: a consistent
    // read of every Service and EndpointSlice from etcd, twice a second, would be load on
    // the control plane whose times the runs beside it measure.
    let cached = ListParams::default().match_any();
    let services = Api::<Service>::all(client.clone()).list(&cached).await?;
    let slices = Api::<EndpointSlice>::all(client.clone())
        .list(&cached)
        .await?;
    Ok(tables_of(&services.items, &slices.items, api, balancers))
}

/// What `services` and `slices` say: each Service's addresses (a LoadBalancer's given
/// one from `balancers`), and its name's.
fn tables_of(
    services: &[Service],
    slices: &[EndpointSlice],
    api: SocketAddr,
    balancers: &mut Balancers,
) -> Tables {
    let mut tables = Tables::default();
    for service in services {
        let (Some(name), Some(ns)) = (&service.metadata.name, &service.metadata.namespace) else {
            continue;
        };
        let Some(spec) = &service.spec else {
            continue;
        };
        let own: Vec<&EndpointSlice> = slices
            .iter()
            .filter(|s| {
                s.metadata.namespace.as_ref() == Some(ns)
                    && s.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("kubernetes.io/service-name"))
                        == Some(name)
            })
            .collect();
        // The ready endpoints' addresses, with the slice's number for the port named so;
        // with `terminating`, when none is ready, those serving while they terminate.
        let endpoints = |(port_name, protocol): (Option<&str>, &str),
                         terminating: bool|
         -> Vec<SocketAddr> {
            let (mut found, mut draining) = (Vec::new(), Vec::new());
            for slice in &own {
                let port = slice.ports.iter().flatten().find(|p| {
                    p.name.as_deref().unwrap_or("") == port_name.unwrap_or("")
                        && p.protocol.as_deref().unwrap_or("TCP") == protocol
                });
                let Some(port) = port
                    .and_then(|p| p.port)
                    .and_then(|p| u16::try_from(p).ok())
                else {
                    continue;
                };
                for endpoint in &slice.endpoints {
                    let condition = |c: fn(&EndpointConditions) -> Option<bool>, or: bool| {
                        endpoint.conditions.as_ref().and_then(c).unwrap_or(or)
                    };
                    let into = if condition(|c| c.ready, true) {
                        &mut found
                    } else if condition(|c| c.serving, false) && condition(|c| c.terminating, false)
                    {
                        &mut draining
                    } else {
                        continue;
                    };
                    into.extend(
                        endpoint
                            .addresses
                            .iter()
                            .filter_map(|a| a.parse::<IpAddr>().ok())
                            .map(|ip| SocketAddr::new(ip, port)),
                    );
                }
            }
            if found.is_empty() && terminating {
                found = draining;
            }
            found.sort();
            found.dedup();
            found
        };
        let fqdn = format!("{name}.{ns}.svc.{DOMAIN}");
        let key = (ns.clone(), name.clone());
        let balancer = (spec.type_.as_deref() == Some("LoadBalancer")
            && spec.load_balancer_class.is_none())
        .then(|| balancers.address(&key))
        .flatten();
        let cluster_ip = spec
            .cluster_ip
            .as_deref()
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
        match cluster_ip {
            Some(ip) => {
                tables.names.insert(fqdn, vec![ip]);
                for port in spec.ports.iter().flatten() {
                    let Ok(number) = u16::try_from(port.port) else {
                        continue;
                    };
                    match port.protocol.as_deref().unwrap_or("TCP") {
                        "TCP" => {}
                        // A load balancer's; not a cluster IP's (nothing in the pods
                        // sends a Service UDP but DNS, which the hub answers).
                        "UDP" => {
                            if let Some(lb) = balancer.filter(|_| number != 0) {
                                let to = endpoints((port.name.as_deref(), "UDP"), true);
                                tables.datagrams.insert(SocketAddr::from((lb, number)), to);
                            }
                            continue;
                        }
                        _ => continue,
                    }
                    let to = if (name.as_str(), ns.as_str()) == ("kubernetes", "default") {
                        vec![api]
                    } else {
                        endpoints((port.name.as_deref(), "TCP"), true)
                    };
                    if let Some(lb) = balancer.filter(|_| number != 0) {
                        tables
                            .routes
                            .insert(SocketAddr::from((lb, number)), to.clone());
                    }
                    tables.routes.insert(SocketAddr::from((ip, number)), to);
                }
            }
            // Headless: the name is the ready endpoints' addresses.
            None => {
                let mut ips: Vec<Ipv4Addr> = spec
                    .ports
                    .iter()
                    .flatten()
                    .flat_map(|p| endpoints((p.name.as_deref(), "TCP"), false))
                    .filter_map(|a| match a.ip() {
                        IpAddr::V4(v4) => Some(v4),
                        IpAddr::V6(_) => None,
                    })
                    .collect();
                ips.sort();
                ips.dedup();
                tables.names.insert(fqdn, ips);
            }
        }
    }
    tables
}

/// Takes connections on a Service's address and relays each to an endpoint.
async fn relay_all(
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    tables: Arc<Mutex<Tables>>,
) {
    let turn = Arc::new(AtomicUsize::new(0));
    while let Ok((mut conn, _)) = listener.accept().await {
        let endpoints = tables
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .routes
            .get(&addr)
            .cloned()
            .unwrap_or_default();
        let first = turn.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            // In turn, the next tried when one does not take the connection.
            for i in 0..endpoints.len() {
                let to = endpoints[(first + i) % endpoints.len()];
                let Ok(Ok(mut upstream)) =
                    tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(to)).await
                else {
                    continue;
                };
                let _ = conn.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
                return;
            }
        });
    }
}

/// Takes datagrams on a load balancer's UDP port `addr` and relays each client address's
/// to one of its endpoints (in turn, a flow each), and the answers back. A flow whose
/// endpoint is no longer among the ready ones goes to another at its next datagram.
async fn relay_datagrams(
    socket: tokio::net::UdpSocket,
    addr: SocketAddr,
    tables: Arc<Mutex<Tables>>,
) {
    let socket = Arc::new(socket);
    let mut flows: std::collections::HashMap<SocketAddr, Flow> = Default::default();
    let mut turn = 0usize;
    let mut buf = vec![0u8; 65_536];
    while let Ok((n, client)) = socket.recv_from(&mut buf).await {
        // This client's flow, if it still has one to a ready endpoint; else the endpoint
        // a new one goes to (the tables' lock is not held across the await below).
        let to = {
            let tables = tables.lock().unwrap_or_else(|p| p.into_inner());
            let endpoints = tables.datagrams.get(&addr).map_or(&[][..], Vec::as_slice);
            let kept = flows
                .get(&client)
                .is_some_and(|f| !f.answers.is_finished() && endpoints.contains(&f.to));
            if kept {
                None
            } else {
                flows.remove(&client);
                flows.retain(|_, f| !f.answers.is_finished());
                if endpoints.is_empty() || flows.len() >= MAX_FLOWS {
                    continue;
                }
                let to = endpoints[turn % endpoints.len()];
                turn = turn.wrapping_add(1);
                Some(to)
            }
        };
        if let Some(to) = to {
            let Ok(flow) = Flow::open(to, client, socket.clone()).await else {
                continue;
            };
            flows.insert(client, flow);
        }
        let _ = flows[&client].upstream.send(&buf[..n]).await;
    }
}

/// One client address's datagrams through a load balancer: a socket of its own towards
/// the endpoint `to`, and the task that sends its answers back (ended after
/// [`FLOW_IDLE`] without one, or when the endpoint refuses; aborted when dropped).
struct Flow {
    to: SocketAddr,
    upstream: Arc<tokio::net::UdpSocket>,
    answers: tokio::task::JoinHandle<()>,
}

impl Flow {
    async fn open(
        to: SocketAddr,
        client: SocketAddr,
        answering: Arc<tokio::net::UdpSocket>,
    ) -> std::io::Result<Flow> {
        let upstream = Arc::new(tokio::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).await?);
        upstream.connect(to).await?;
        let reader = upstream.clone();
        let answers = tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            while let Ok(Ok(n)) = tokio::time::timeout(FLOW_IDLE, reader.recv(&mut buf)).await {
                let _ = answering.send_to(&buf[..n], client).await;
            }
        });
        Ok(Flow {
            to,
            upstream,
            answers,
        })
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        self.answers.abort();
    }
}

/// Answers every DNS query from the names of `tables`.
async fn answer_dns(socket: std::net::UdpSocket, tables: Arc<Mutex<Tables>>) {
    if socket.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(socket) = tokio::net::UdpSocket::from_std(socket) else {
        return;
    };
    let mut buf = [0u8; 1500];
    while let Ok((n, from)) = socket.recv_from(&mut buf).await {
        let reply = {
            let t = tables.lock().unwrap_or_else(|p| p.into_inner());
            dns_reply(&buf[..n], |name| t.names.get(name).cloned())
        };
        if let Some(reply) = reply {
            let _ = socket.send_to(&reply, from).await;
        }
    }
}

/// The answer to one DNS query (RFC 1035): its A records where `lookup` knows the name,
/// no records for another type of a known name, NXDOMAIN for an unknown one; `None` for
/// what is not a query of one question.
fn dns_reply(query: &[u8], lookup: impl Fn(&str) -> Option<Vec<Ipv4Addr>>) -> Option<Vec<u8>> {
    if query.len() < 12 || query[2] & 0x80 != 0 || u16::from_be_bytes([query[4], query[5]]) != 1 {
        return None;
    }
    // The question: labels to the empty one, then its type and class.
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question_end = at + 4;
    query.get(..question_end)?;
    let name = labels.join(".");
    let found = lookup(&name);
    let answers: Vec<Ipv4Addr> = match (&found, qtype) {
        (Some(ips), 1) => ips.clone(),
        _ => Vec::new(),
    };
    let rcode = if found.is_some() { 0 } else { 3 };
    let mut reply = Vec::with_capacity(question_end + answers.len() * 16);
    reply.extend_from_slice(&query[..2]);
    // A response, recursion desired as asked, recursion available, the code.
    reply.push(0x80 | (query[2] & 0x01));
    reply.push(0x80 | rcode);
    reply.extend_from_slice(&1u16.to_be_bytes());
    reply.extend_from_slice(&(answers.len() as u16).to_be_bytes());
    reply.extend_from_slice(&[0, 0, 0, 0]);
    reply.extend_from_slice(&query[12..question_end]);
    for ip in answers {
        // The name is the question's (a pointer to offset 12), class IN, 5 s.
        reply.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4]);
        reply.extend_from_slice(&ip.octets());
    }
    Some(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&[0, 1]);
        q
    }

    #[test]
    fn a_services_name_is_its_address_and_an_unknown_name_does_not_exist() {
        let lookup = |name: &str| {
            (name == "eg.envoy-gateway-system.svc.cluster.local")
                .then(|| vec![Ipv4Addr::new(10, 96, 0, 7)])
        };
        let q = query("EG.envoy-gateway-system.svc.cluster.local", 1);
        let r = dns_reply(&q, lookup).unwrap();
        assert_eq!(&r[..2], &[0x12, 0x34]);
        assert_eq!(r[3] & 0x0f, 0, "NOERROR");
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 1, "one answer");
        assert_eq!(&r[r.len() - 4..], &[10, 96, 0, 7]);
        // AAAA of a known name: no records, no error.
        let r = dns_reply(
            &query("eg.envoy-gateway-system.svc.cluster.local", 28),
            lookup,
        )
        .unwrap();
        assert_eq!((r[3] & 0x0f, u16::from_be_bytes([r[6], r[7]])), (0, 0));
        // Unknown: NXDOMAIN.
        let r = dns_reply(&query("example.com", 1), lookup).unwrap();
        assert_eq!((r[3] & 0x0f, u16::from_be_bytes([r[6], r[7]])), (3, 0));
        // Not a query, or cut short: no answer.
        let mut answer = q.clone();
        answer[2] |= 0x80;
        assert!(dns_reply(&answer, lookup).is_none());
        assert!(dns_reply(&q[..q.len() - 3], lookup).is_none());
    }

    #[test]
    fn a_service_goes_to_its_ready_endpoints_on_the_port_named_and_kubernetes_to_the_api() {
        let services: Vec<Service> = serde_json::from_value(serde_json::json!([
            { "metadata": { "name": "eg", "namespace": "sys" }, "spec": { "clusterIP": "10.96.0.7",
              "ports": [{ "name": "grpc", "port": 18000, "targetPort": 18000 }, { "name": "metrics", "port": 19001 }] } },
            { "metadata": { "name": "kubernetes", "namespace": "default" }, "spec": { "clusterIP": "10.96.0.1",
              "ports": [{ "name": "https", "port": 443 }] } },
            { "metadata": { "name": "peers", "namespace": "sys" }, "spec": { "clusterIP": "None",
              "ports": [{ "name": "grpc", "port": 18000 }] } },
        ]))
        .unwrap();
        let slices: Vec<EndpointSlice> = serde_json::from_value(serde_json::json!([
            { "metadata": { "name": "eg-1", "namespace": "sys", "labels": { "kubernetes.io/service-name": "eg" } },
              "addressType": "IPv4",
              "ports": [{ "name": "grpc", "port": 18001, "protocol": "TCP" }],
              "endpoints": [
                { "addresses": ["198.18.0.5"], "conditions": { "ready": true } },
                { "addresses": ["198.18.0.6"], "conditions": { "ready": false } } ] },
            { "metadata": { "name": "eg-2", "namespace": "sys", "labels": { "kubernetes.io/service-name": "eg" } },
              "addressType": "IPv4",
              "ports": [{ "name": "metrics", "port": 19001, "protocol": "TCP" }],
              "endpoints": [
                { "addresses": ["198.18.0.7"], "conditions": { "ready": false, "serving": true, "terminating": true } },
                { "addresses": ["198.18.0.8"], "conditions": { "ready": false, "serving": false, "terminating": true } } ] },
            { "metadata": { "name": "peers-1", "namespace": "sys", "labels": { "kubernetes.io/service-name": "peers" } },
              "addressType": "IPv4",
              "ports": [{ "name": "grpc", "port": 18000 }],
              "endpoints": [{ "addresses": ["198.18.0.9"] }] },
        ]))
        .unwrap();
        let api: SocketAddr = "127.0.0.1:6443".parse().unwrap();
        let t = tables_of(&services, &slices, api, &mut Balancers::default());
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            t.routes[&addr("10.96.0.7:18000")],
            [addr("198.18.0.5:18001")]
        );
        // None ready: the one still serving while it terminates, not the one that stopped.
        assert_eq!(
            t.routes[&addr("10.96.0.7:19001")],
            [addr("198.18.0.7:19001")]
        );
        assert_eq!(t.routes[&addr("10.96.0.1:443")], [api]);
        assert_eq!(
            t.names["eg.sys.svc.cluster.local"],
            [Ipv4Addr::new(10, 96, 0, 7)]
        );
        assert_eq!(
            t.names["peers.sys.svc.cluster.local"],
            [Ipv4Addr::new(198, 18, 0, 9)]
        );
        assert!(!t
            .routes
            .keys()
            .any(|a| a.port() == 18000 && a.ip() != addr("10.96.0.7:1").ip()));
    }
    #[test]
    fn a_load_balancer_of_no_class_gets_an_address_of_its_own_that_it_keeps() {
        let services: Vec<Service> = serde_json::from_value(serde_json::json!([
            { "metadata": { "name": "envoy-gw", "namespace": "sys" }, "spec": { "type": "LoadBalancer",
              "clusterIP": "10.96.0.9", "ports": [{ "name": "http-80", "port": 80 },
                { "name": "https-443", "port": 443 }, { "name": "https-443-h3", "port": 443, "protocol": "UDP" }] } },
            { "metadata": { "name": "traefik", "namespace": "kube-system" }, "spec": { "type": "LoadBalancer",
              "loadBalancerClass": "ingressbench.dev/l4-front", "clusterIP": "10.96.0.10", "ports": [{ "name": "http", "port": 8000 }] } },
        ]))
        .unwrap();
        let slices: Vec<EndpointSlice> = serde_json::from_value(serde_json::json!([
            { "metadata": { "name": "envoy-gw-1", "namespace": "sys", "labels": { "kubernetes.io/service-name": "envoy-gw" } },
              "addressType": "IPv4", "ports": [{ "name": "http-80", "port": 10080 },
                { "name": "https-443", "port": 10443 }, { "name": "https-443-h3", "port": 10443, "protocol": "UDP" }],
              "endpoints": [{ "addresses": ["198.18.0.5"] }] },
        ]))
        .unwrap();
        let api: SocketAddr = "127.0.0.1:6443".parse().unwrap();
        let mut balancers = Balancers::default();
        let t = tables_of(&services, &slices, api, &mut balancers);
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(t.routes[&addr("127.1.0.1:80")], [addr("198.18.0.5:10080")]);
        assert_eq!(t.routes[&addr("10.96.0.9:80")], [addr("198.18.0.5:10080")]);
        // Its UDP port (HTTP/3 beside HTTPS) is relayed on the load balancer's address.
        assert_eq!(t.routes[&addr("127.1.0.1:443")], [addr("198.18.0.5:10443")]);
        assert_eq!(
            t.datagrams[&addr("127.1.0.1:443")],
            [addr("198.18.0.5:10443")]
        );
        assert_eq!(t.datagrams.len(), 1);
        // One of a class: someone else's to serve.
        assert!(!t
            .routes
            .keys()
            .any(|a| a.port() == 8000 && a.ip().is_loopback()));
        // Read again, the same address; the block's 254th is the last.
        let again = tables_of(&services, &slices, api, &mut balancers);
        assert_eq!(again, t);
        assert_eq!(balancers.given.len(), 1);
        for i in 0..253 {
            balancers.address(&("ns".into(), format!("s{i}")));
        }
        assert_eq!(
            balancers.given[&("ns".into(), "s252".into())],
            Ipv4Addr::new(127, 1, 0, 254)
        );
        assert_eq!(balancers.address(&("ns".into(), "one more".into())), None);
    }

    /// A UDP server on loopback that answers every datagram with `tag` and the datagram.
    async fn tagged_echo(tag: &'static str) -> SocketAddr {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let at = socket.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                let answer = [tag.as_bytes(), &buf[..n]].concat();
                let _ = socket.send_to(&answer, from).await;
            }
        });
        at
    }

    #[tokio::test]
    async fn a_load_balancers_udp_port_keeps_each_client_on_one_endpoint_until_it_goes() {
        let (a, b) = (tagged_echo("a:").await, tagged_echo("b:").await);
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let lb = socket.local_addr().unwrap();
        let tables = Arc::new(Mutex::new(Tables::default()));
        tables.lock().unwrap().datagrams.insert(lb, vec![a, b]);
        let relay = tokio::spawn(relay_datagrams(socket, lb, tables.clone()));
        let ask = |client: Arc<tokio::net::UdpSocket>, what: &'static str| async move {
            client.send_to(what.as_bytes(), lb).await.unwrap();
            let mut buf = [0u8; 1500];
            let n = tokio::time::timeout(Duration::from_secs(2), client.recv(&mut buf))
                .await
                .expect("an answer")
                .unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        };
        let one = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let two = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
        // Each client its own endpoint, in turn, and it keeps it.
        assert_eq!(ask(one.clone(), "1").await, "a:1");
        assert_eq!(ask(two.clone(), "2").await, "b:2");
        assert_eq!(ask(one.clone(), "3").await, "a:3");
        assert_eq!(ask(two.clone(), "4").await, "b:4");
        // Its endpoint no longer ready: the client's next datagram goes to the other.
        tables.lock().unwrap().datagrams.insert(lb, vec![b]);
        assert_eq!(ask(one.clone(), "5").await, "b:5");
        assert_eq!(ask(two.clone(), "6").await, "b:6");
        // None ready: nothing is sent on.
        tables.lock().unwrap().datagrams.insert(lb, vec![]);
        one.send_to(b"7", lb).await.unwrap();
        let mut buf = [0u8; 16];
        let silent = tokio::time::timeout(Duration::from_millis(300), one.recv(&mut buf)).await;
        assert!(silent.is_err(), "no endpoint, no answer");
        relay.abort();
    }

    #[test]
    fn two_agents_hold_two_blocks_of_load_balancer_addresses_until_one_ends() {
        let mut a = Balancers::claim().unwrap();
        let b = Balancers::claim().unwrap();
        assert_ne!(a.block, b.block);
        assert_eq!(
            a.address(&("sys".into(), "envoy".into())),
            Some(Ipv4Addr::new(127, 1, a.block, 1))
        );
        // Released with its holder: the next claim takes it again.
        let held = b.block;
        drop(b);
        assert_eq!(Balancers::claim().unwrap().block, held);
    }
}
