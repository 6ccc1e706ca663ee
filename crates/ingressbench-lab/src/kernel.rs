//! Kernel settings per node: `net.*` sysctls set inside a node's network namespace before
//! anything starts on it, and read back; and the kernel's own account of a node's listen
//! queues (the backlog each listening socket got, the connections it dropped).
//!
//! Most `net.*` settings (`net.core.somaxconn`, `net.ipv4.ip_local_port_range`,
//! `net.ipv4.tcp_max_syn_backlog`, …) are kept per network namespace, so with namespace
//! isolation a node can be tuned as a Kubernetes pod is (`securityContext.sysctls`) while
//! the machine's own values stay as they are. Which ones are is the kernel's to say: a
//! setting is per namespace when a fresh namespace has it ([`check_namespaced`]).
//!
//! Every read and write happens on a short-lived thread that entered the namespace:
//! `/proc/sys/net` and `/proc/thread-self/net` show the namespace of the thread that reads
//! them, so nothing is run through a shell and nothing outside the namespace changes.
//!
//! ```no_run
//! use std::collections::BTreeMap;
//! use ingressbench_lab::kernel;
//!
//! let settings = BTreeMap::from([("net.core.somaxconn".to_owned(), "32768".to_owned())]);
//! kernel::check_namespaced(settings.keys().map(String::as_str))?;
//! # Ok::<(), ingressbench_lab::LabError>(())
//! ```

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::LabError;

/// Sysctls by name (`net.core.somaxconn`), each value as the kernel takes it (`32768`,
/// `1024 65000`).
pub type Sysctls = BTreeMap<String, String>;

/// Which nodes get which settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSysctls {
    /// On the proxies' node (each replica's, when each has its own).
    pub proxies: Sysctls,
    /// On any node, by name; a proxy's node gets these over `proxies`.
    pub nodes: BTreeMap<String, Sysctls>,
}

impl NodeSysctls {
    /// Whether no node gets any setting.
    pub fn is_empty(&self) -> bool {
        self.proxies.is_empty() && self.nodes.values().all(BTreeMap::is_empty)
    }

    /// Every setting named, once.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .proxies
            .keys()
            .chain(self.nodes.values().flat_map(BTreeMap::keys))
            .cloned()
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// The settings of node `name` (`proxy`: it holds a proxy).
    pub fn of(&self, name: &str, proxy: bool) -> Sysctls {
        let mut settings = if proxy {
            self.proxies.clone()
        } else {
            Sysctls::new()
        };
        if let Some(own) = self.nodes.get(name) {
            settings.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        settings
    }

    /// Checks every name and value (see [`check_namespaced`]).
    pub fn check(&self) -> Result<(), LabError> {
        for (name, value) in self
            .proxies
            .iter()
            .chain(self.nodes.values().flat_map(|m| m.iter()))
        {
            check_value(name, value)?;
        }
        check_namespaced(self.names().iter().map(String::as_str))
    }
}

/// The kernel's counters of connections a node's listeners could not take
/// (`/proc/net/netstat`, `TcpExt`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ListenCounters {
    /// `ListenOverflows`: handshakes completed while the accept queue was full.
    pub overflows: u64,
    /// `ListenDrops`: connection requests dropped at a listener, for any reason
    /// (overflows included).
    pub drops: u64,
}

impl ListenCounters {
    /// What was counted since `earlier`.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            overflows: self.overflows.saturating_sub(earlier.overflows),
            drops: self.drops.saturating_sub(earlier.drops),
        }
    }
}

/// Checks a setting's name without touching the machine: only `net.*` settings can be
/// kept per network namespace.
pub fn check_name(name: &str) -> Result<(), LabError> {
    let well_formed = !name.is_empty()
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        });
    if !well_formed {
        return Err(invalid(
            name,
            "a sysctl name is dotted words, as `sysctl -a` prints it (net.core.somaxconn)",
        ));
    }
    if !name.starts_with("net.") {
        return Err(invalid(
            name,
            "only net.* settings are kept per network namespace; this one is machine-wide, so setting it for one node would change the whole machine (the tool never does)",
        ));
    }
    Ok(())
}

/// Checks a value: printable, one line.
pub fn check_value(name: &str, value: &str) -> Result<(), LabError> {
    if value.trim().is_empty() || value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(LabError::InvalidValue {
            field: format!("value of sysctl {name}"),
            value: value.to_owned(),
            reason: "a number, or numbers separated by spaces (\"1024 65000\")".into(),
        });
    }
    Ok(())
}

/// Checks on this machine's kernel that each setting is kept per network namespace: a
/// fresh namespace must have it. Needs root (as namespaces do); without root only the
/// names are checked.
pub fn check_namespaced<'a>(names: impl Iterator<Item = &'a str>) -> Result<(), LabError> {
    let names: Vec<&str> = names.collect();
    for name in &names {
        check_name(name)?;
    }
    // Each name is looked up once per process: a matrix of many cells asks again and again.
    let mut known = NAMESPACED.lock().unwrap_or_else(|p| p.into_inner());
    let unknown: Vec<String> = names
        .iter()
        .filter(|n| !known.iter().any(|k| k == *n))
        .map(|n| (*n).to_owned())
        .collect();
    if unknown.is_empty() || !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    let asked = unknown.clone();
    let missing = on_thread(move || {
        // Deprecated for `FILES` (fd tables torn between threads); `NEWNET` only moves
        // this thread, which ends with the closure, into a namespace of its own.
        #[allow(deprecated)]
        rustix::thread::unshare(rustix::thread::UnshareFlags::NEWNET)?;
        Ok(asked
            .into_iter()
            .filter(|n| !sysctl_path(n).exists())
            .collect::<Vec<_>>())
    })
    .map_err(|e| LabError::Network {
        action: "making a scratch network namespace to check sysctls".into(),
        reason: e.to_string(),
    })?;
    let Some(name) = missing.first() else {
        known.extend(unknown);
        return Ok(());
    };
    // This thread is in the machine's namespace: the setting may exist here.
    Err(invalid(
        name,
        if sysctl_path(name).exists() {
            "this kernel keeps it machine-wide, not per network namespace (a fresh namespace does not have it), so it cannot be set for one node"
        } else {
            "this kernel has no such setting (`sysctl -a | grep` for the name)"
        },
    ))
}

/// Settings already found in a fresh namespace.
static NAMESPACED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Sets each setting inside the network namespace at `netns` and reads it back; an error
/// names the setting, the value and the node.
pub fn apply(node: &str, netns: &Path, settings: &Sysctls) -> Result<(), LabError> {
    let wanted = settings.clone();
    let ns = netns.to_owned();
    let result = on_thread(move || {
        crate::process::enter_netns(&ns)?;
        let mut refused = Vec::new();
        for (name, value) in &wanted {
            let path = sysctl_path(name);
            if let Err(e) = std::fs::write(&path, value.as_bytes()) {
                refused.push((name.clone(), value.clone(), e.to_string()));
                continue;
            }
            let now = std::fs::read_to_string(&path).unwrap_or_default();
            if normal(&now) != normal(value) {
                refused.push((
                    name.clone(),
                    value.clone(),
                    format!("the kernel kept {}", normal(&now)),
                ));
            }
        }
        Ok(refused)
    });
    let refused = result.map_err(|e| LabError::Network {
        action: format!("entering node {node}'s namespace to set sysctls"),
        reason: e.to_string(),
    })?;
    match refused.into_iter().next() {
        None => Ok(()),
        Some((setting, value, reason)) => Err(LabError::Kernel {
            node: node.to_owned(),
            setting: format!("{setting}={value}"),
            reason,
        }),
    }
}

/// The values in force of `names` in the namespace at `netns` (the machine's own without
/// one), whitespace made single spaces; a setting that cannot be read is left out.
pub fn read(netns: Option<&Path>, names: &[String]) -> Sysctls {
    let names = names.to_vec();
    in_node(netns, move || {
        Ok(names
            .into_iter()
            .filter_map(|n| {
                let v = std::fs::read_to_string(sysctl_path(&n)).ok()?;
                Some((n, normal(&v)))
            })
            .collect())
    })
    .unwrap_or_default()
}

/// The listen-queue counters of the namespace at `netns` (the machine's own without one).
pub fn listen_counters(netns: Option<&Path>) -> Option<ListenCounters> {
    let text = in_node(netns, || {
        std::fs::read_to_string("/proc/thread-self/net/netstat")
    })
    .ok()?;
    let ext = tcp_ext(&text)?;
    Some(ListenCounters {
        overflows: *ext.get("ListenOverflows")?,
        drops: *ext.get("ListenDrops")?,
    })
}

/// The `TcpExt` counters of a `/proc/net/netstat` text (a line of names, then a line of
/// values).
fn tcp_ext(text: &str) -> Option<BTreeMap<&str, u64>> {
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let names = lines.next()?.split_whitespace().skip(1);
    let values = lines.next()?.split_whitespace().skip(1);
    Some(
        names
            .zip(values)
            .filter_map(|(n, v)| Some((n, v.parse().ok()?)))
            .collect(),
    )
}

/// How long `ss` may take.
const SS_TIMEOUT: Duration = Duration::from_secs(10);

/// The accept-queue length each listening TCP socket on `ip` got from the kernel (what
/// `ss -lt` shows as Send-Q: the listener's backlog, capped by `net.core.somaxconn`), by
/// port. `netns` is the node's namespace, if it has one.
pub fn listen_backlogs(netns: Option<&Path>, ip: IpAddr) -> BTreeMap<u16, u32> {
    let name = netns
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned());
    let mut args: Vec<&str> = Vec::new();
    if let Some(n) = &name {
        args.extend(["-N", n]);
    }
    args.push("-Hltn");
    let Ok(out) = crate::process::run_bounded(Path::new("ss"), &args, SS_TIMEOUT) else {
        return BTreeMap::new();
    };
    parse_listeners(&String::from_utf8_lossy(&out.stdout), ip)
}

/// `LISTEN 0 511 198.18.3.2:8080 0.0.0.0:*` lines, those on `ip`: port → backlog.
fn parse_listeners(text: &str, ip: IpAddr) -> BTreeMap<u16, u32> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let backlog = f.get(2)?.parse().ok()?;
            let local: std::net::SocketAddr = f.get(3)?.parse().ok()?;
            (local.ip() == ip).then_some((local.port(), backlog))
        })
        .collect()
}

/// The open-file limit (soft, as the process runs with it) of process `pid`.
pub fn open_files_limit(pid: u32) -> Option<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// `/proc/sys/…` of a setting.
fn sysctl_path(name: &str) -> PathBuf {
    Path::new("/proc/sys").join(name.replace('.', "/"))
}

/// A value with its whitespace made single spaces (`1024\t65000` → `1024 65000`).
fn normal(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn invalid(name: &str, reason: &str) -> LabError {
    LabError::InvalidValue {
        field: "sysctl".into(),
        value: name.to_owned(),
        reason: reason.to_owned(),
    }
}

/// Runs `f` in the namespace at `netns` (here, without one).
fn in_node<T: Send + 'static>(
    netns: Option<&Path>,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let ns = netns.map(Path::to_owned);
    on_thread(move || {
        if let Some(ns) = &ns {
            crate::process::enter_netns(ns)?;
        }
        f()
    })
}

/// Runs `f` on a thread of its own, which ends with it: whatever namespace the thread
/// entered goes with it.
fn on_thread<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    std::thread::Builder::new()
        .name("ib-kernel".into())
        .spawn(f)?
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the thread panicked")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_outside_net_are_refused_with_the_reason() {
        assert!(check_name("net.core.somaxconn").is_ok());
        assert!(check_name("net.ipv4.conf.eth0.rp_filter").is_ok());
        let e = check_name("fs.file-max").unwrap_err().to_string();
        assert!(e.contains("machine-wide"), "{e}");
        for bad in ["", "net..core", "net.core/somaxconn", "net.core.somaxconn "] {
            assert!(check_name(bad).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn netstat_counters_are_read_by_name() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 0 17 19\nIpExt: InNoRoutes\nIpExt: 0\n";
        let ext = tcp_ext(text).unwrap();
        assert_eq!(ext["ListenOverflows"], 17);
        assert_eq!(ext["ListenDrops"], 19);
        let a = ListenCounters {
            overflows: 17,
            drops: 19,
        };
        let b = ListenCounters {
            overflows: 20,
            drops: 25,
        };
        assert_eq!(
            b.since(a),
            ListenCounters {
                overflows: 3,
                drops: 6
            }
        );
    }

    #[test]
    fn listeners_are_matched_on_the_node_address() {
        let text = "LISTEN 0      511    198.18.3.2:8080    0.0.0.0:*\nLISTEN 0 4096 127.0.0.1:9000 0.0.0.0:*\nLISTEN 0 128 [::1]:53 [::]:*\n";
        let ip: IpAddr = "198.18.3.2".parse().unwrap();
        assert_eq!(parse_listeners(text, ip), BTreeMap::from([(8080, 511)]));
        let v6: IpAddr = "::1".parse().unwrap();
        assert_eq!(parse_listeners(text, v6), BTreeMap::from([(53, 128)]));
    }

    #[test]
    fn values_compare_whatever_their_spacing() {
        assert_eq!(normal("1024\t65000\n"), "1024 65000");
        assert!(check_value("net.core.somaxconn", "").is_err());
        assert!(check_value("net.core.somaxconn", "1\n2").is_err());
        assert!(check_value("net.ipv4.ip_local_port_range", "1024 65000").is_ok());
    }
}
