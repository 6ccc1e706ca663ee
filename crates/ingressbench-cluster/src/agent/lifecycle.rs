//! A container's `preStop` hook, as the kubelet runs it when the container's pod is
//! deleted: an HTTP GET to the pod, or a command run inside the container; the container
//! is sent SIGTERM once its hook has ended, and everything is killed when the pod's grace
//! period is over, hook or not. Each hook runs on a thread of its own, so that a hook that
//! waits (Envoy Gateway's Envoy asks its shutdown manager, which answers once the
//! listeners drained) holds up nothing else.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ingressbench_lab::process::{OwnedChild, RunAs};
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A container's preStop hook, ready to run.
pub(super) enum Hook {
    /// `httpGet`: a GET of `path` at `addr`; any answer (or none) ends it.
    Http { addr: SocketAddr, path: String },
    /// `exec`: the command run inside the container, as `kubectl exec` runs one.
    Exec(ExecHook),
}

/// A command run inside a running container: `nsenter` into the namespaces of its
/// process 1 (mounts, processes, network; its root and working directory), as the
/// container's user, with its environment.
pub(super) struct ExecHook {
    pub(super) command: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    pub(super) user: (u32, u32),
    /// The directory it starts in, and where its output goes.
    pub(super) dir: PathBuf,
    pub(super) log: PathBuf,
}

/// The command of a container's `exec` preStop hook, if it has one.
pub(super) fn exec_command(container: &Container) -> Option<Vec<String>> {
    let exec = container
        .lifecycle
        .as_ref()?
        .pre_stop
        .as_ref()?
        .exec
        .as_ref()?;
    exec.command.clone().filter(|c| !c.is_empty())
}

/// A container's `httpGet` preStop hook, asked at the pod's address `ip` (or its `host`).
pub(super) fn http_hook(container: &Container, ip: IpAddr) -> Option<Hook> {
    let http = container
        .lifecycle
        .as_ref()?
        .pre_stop
        .as_ref()?
        .http_get
        .as_ref()?;
    let host = http
        .host
        .as_deref()
        .and_then(|h| h.parse().ok())
        .unwrap_or(ip);
    Some(Hook::Http {
        addr: SocketAddr::new(host, port_of(container, &http.port)),
        path: http.path.clone().unwrap_or_else(|| "/".into()),
    })
}

/// A port a probe or hook names: a number, or the name of one of the container's ports
/// (0 when it has none of that name: nothing answers there).
pub(super) fn port_of(container: &Container, port: &IntOrString) -> u16 {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).unwrap_or(0),
        IntOrString::String(named) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(named.as_str()))
            .map_or(0, |p| u16::try_from(p.container_port).unwrap_or(0)),
    }
}

impl Hook {
    /// Runs the hook on a thread of its own, until it ends or `deadline`; an `exec` hook in
    /// the container whose `enter` process is `container` (its process 1 is that
    /// process's child).
    pub(super) fn start(
        self,
        label: String,
        container: u32,
        deadline: Instant,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || match self {
            Hook::Http { addr, path } => {
                let left = || deadline.saturating_duration_since(Instant::now());
                let Ok(stream) =
                    TcpStream::connect_timeout(&addr, left().max(Duration::from_millis(1)))
                else {
                    return;
                };
                let _ = stream.set_read_timeout(Some(left().max(Duration::from_millis(1))));
                let host = addr.to_string();
                let request = ingressbench_lab::http1::Request::get(&host, &path);
                let _ = ingressbench_lab::http1::exchange(
                    stream,
                    &request,
                    ingressbench_lab::http1::Until::End,
                );
            }
            Hook::Exec(exec) => {
                let children = format!("/proc/{container}/task/{container}/children");
                let Some(first) = std::fs::read_to_string(children)
                    .ok()
                    .and_then(|c| c.split_whitespace().next().map(str::to_owned))
                else {
                    return;
                };
                let argv: Vec<String> = [
                    "--target",
                    &first,
                    "--mount",
                    "--pid",
                    "--net",
                    "--root",
                    "--wd",
                    "--setuid",
                    &exec.user.0.to_string(),
                    "--setgid",
                    &exec.user.1.to_string(),
                    "--",
                ]
                .into_iter()
                .map(str::to_owned)
                .chain(exec.command)
                .collect();
                let child = OwnedChild::spawn_with_env(
                    &label,
                    std::path::Path::new("nsenter"),
                    &argv,
                    &exec.env,
                    &exec.dir,
                    &exec.log,
                    RunAs {
                        netns: None,
                        user: None,
                    },
                );
                let Ok(mut child) = child else {
                    return;
                };
                while child.try_wait().is_none() {
                    if Instant::now() >= deadline {
                        child.terminate(Duration::ZERO);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        })
    }
}
