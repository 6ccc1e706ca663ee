//! A controller of the local cluster restarted on a run's request: what a rollout
//! restart of its Deployment is on a real cluster. The controllers are processes of the
//! cluster's serving process (`cluster local serve`), so only it can start one again with
//! the same arguments; a run asks it through a file in the cluster's directory
//! (`restarts/ID.request`, the process and its grace) and reads what it did from
//! `restarts/ID.done`: when the old process had stopped and when the new one was ready,
//! as wall-clock times, and the new process's id.
//!
//! Only the cluster directory's owner can ask: a request whose file is not a regular file
//! of that owner is removed unread.

use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use ingressbench_lab::process::{OwnedChild, RunAs};
use serde::{Deserialize, Serialize};

use super::{io, LocalCluster, API_READY_TIMEOUT};
use crate::ClusterError;

/// The folder of requests and answers, in the cluster's directory.
const RESTARTS: &str = "restarts";
/// The most a request file may hold.
const REQUEST_MAX_BYTES: u64 = 4096;
/// The longest grace a request may ask for.
const GRACE_MAX: Duration = Duration::from_secs(300);
/// How long after a controller's first exit it is started again; doubled after each
/// exit, up to [`CRASH_BACK_OFF_MAX`] (a kubelet's are 10 s and 5 min: a local cluster's
/// controller starts in a second).
const CRASH_BACK_OFF_FIRST: Duration = Duration::from_secs(1);
const CRASH_BACK_OFF_MAX: Duration = Duration::from_secs(30);

/// How a part of the cluster is started, so that it can be started again.
#[derive(Clone, Debug)]
pub(super) struct Again {
    pub(super) name: String,
    pub(super) program: PathBuf,
    pub(super) args: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    /// Its working directory.
    pub(super) home: PathBuf,
    /// When a new process is ready (none: it is not restarted on request).
    pub(super) ready: Option<Ready>,
}

/// When a restarted controller is ready.
#[derive(Clone, Debug)]
pub(super) enum Ready {
    /// Its health endpoint answers 2xx or 3xx.
    Http(SocketAddr, &'static str),
    /// Something accepts connections at each address (after nothing did: the old
    /// process's listeners are gone first).
    Listening(Vec<SocketAddr>),
}

/// What a restart did, as the serving process writes it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Restarted {
    /// When the old process had exited (killed after its grace if it had not), in
    /// nanoseconds since the Unix epoch.
    pub stopped_unix_ns: u64,
    /// When the new one was ready.
    pub ready_unix_ns: u64,
    /// The old process's id.
    pub old_pid: u32,
    /// The new one's.
    pub pid: u32,
}

/// An answer: what was done, or why not.
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Done(Restarted),
    Failed(String),
}

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    process: String,
    grace_ms: u64,
}

/// A restart asked of the local cluster's serving process.
#[derive(Debug)]
pub struct RestartRequest {
    done: PathBuf,
    process: String,
    asked: Instant,
}

/// Asks the serving process of the local cluster in `dir` to restart `process`, giving
/// the old one `grace` to exit. Errors when the cluster is not served from there.
pub fn request_restart(
    dir: &Path,
    process: &str,
    grace: Duration,
) -> Result<RestartRequest, ClusterError> {
    let folder = dir.join(RESTARTS);
    if !folder.is_dir() {
        return Err(ClusterError::Api(format!(
            "{} is not a running local cluster's directory (no {RESTARTS}/ in it): start one with `ingressbench cluster local up`, or give the `restart: {{ local: … }}` of its cluster file",
            dir.display()
        )));
    }
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let id = format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let text = serde_json::to_string(&Request {
        process: process.to_owned(),
        grace_ms: grace.as_millis() as u64,
    })
    .map_err(|e| ClusterError::Api(e.to_string()))?;
    // Written aside and renamed: the serving process never reads half of it.
    let partial = folder.join(format!("{id}.partial"));
    std::fs::write(&partial, text).map_err(|e| io(&partial, e))?;
    let request = folder.join(format!("{id}.request"));
    std::fs::rename(&partial, &request).map_err(|e| io(&request, e))?;
    Ok(RestartRequest {
        done: folder.join(format!("{id}.done")),
        process: process.to_owned(),
        asked: Instant::now(),
    })
}

impl RestartRequest {
    /// What the serving process did, once it has answered (the answer is then removed);
    /// an error if it could not restart the process, or has not answered within its
    /// grace and [`API_READY_TIMEOUT`] (it is not serving the cluster, or hangs).
    pub fn poll(&self) -> Result<Option<Restarted>, ClusterError> {
        let text = match read_bounded(&self.done) {
            Ok(text) => text,
            Err(_) if self.asked.elapsed() < GRACE_MAX + API_READY_TIMEOUT => return Ok(None),
            Err(_) => {
                return Err(ClusterError::Api(format!(
                    "the local cluster did not answer the restart of {} within {:?}: is its serving process running (ingressbench cluster local up)?",
                    self.process,
                    GRACE_MAX + API_READY_TIMEOUT
                )))
            }
        };
        let _ = std::fs::remove_file(&self.done);
        match serde_json::from_str(&text) {
            Ok(Answer::Done(restarted)) => Ok(Some(restarted)),
            Ok(Answer::Failed(why)) => Err(ClusterError::Api(format!(
                "the local cluster could not restart {}: {why}",
                self.process
            ))),
            Err(e) => Err(ClusterError::Api(format!(
                "the local cluster's answer {} is not one: {e}",
                self.done.display()
            ))),
        }
    }
}

/// A regular file (not a link) of at most [`REQUEST_MAX_BYTES`].
fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_file() || meta.len() > REQUEST_MAX_BYTES {
        return Err(std::io::Error::other("not a small regular file"));
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(REQUEST_MAX_BYTES)
        .read_to_string(&mut text)?;
    Ok(text)
}

fn unix_ns(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl LocalCluster {
    /// Makes the folder restart requests go to (only the cluster's owner can write
    /// there).
    pub(super) fn open_restarts(&self) -> Result<(), ClusterError> {
        let folder = self.dir.join(RESTARTS);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&folder)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            })
            .map_err(|e| io(&folder, e))
    }

    /// Starts a part of the cluster and keeps how, so that a restart can start it again.
    pub(super) fn spawn(&mut self, again: Again) -> Result<OwnedChild, ClusterError> {
        let child = spawn_again(&again, &self.dir)?;
        self.again.retain(|a| a.name != again.name);
        self.again.push(again);
        Ok(child)
    }

    /// From now on `name` can be restarted on request, and is ready again when `ready`.
    pub(super) fn restartable(&mut self, name: &str, ready: Ready) {
        if let Some(again) = self.again.iter_mut().find(|a| a.name == name) {
            again.ready = Some(ready);
        }
    }

    /// Answers each restart request waiting in the cluster's directory, in turn. Returns
    /// whether a process was restarted (the cluster file's process ids changed).
    pub fn serve_restarts(&mut self) -> bool {
        let folder = self.dir.join(RESTARTS);
        let Ok(owner) = std::fs::metadata(&self.dir).map(|m| m.uid()) else {
            return false;
        };
        let Ok(entries) = std::fs::read_dir(&folder) else {
            return false;
        };
        let mut requests: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "request"))
            .collect();
        requests.sort();
        let mut restarted = false;
        for path in requests {
            let mine = std::fs::symlink_metadata(&path).is_ok_and(|m| m.uid() == owner);
            let request = read_bounded(&path).ok().filter(|_| mine);
            let _ = std::fs::remove_file(&path);
            let Some(request) = request else { continue };
            let answer = match serde_json::from_str::<Request>(&request) {
                Ok(r) => match self
                    .restart(&r.process, Duration::from_millis(r.grace_ms).min(GRACE_MAX))
                {
                    Ok(done) => {
                        restarted = true;
                        Answer::Done(done)
                    }
                    Err(e) => Answer::Failed(e.to_string()),
                },
                Err(e) => Answer::Failed(format!("not a restart request: {e}")),
            };
            let done = path.with_extension("done");
            let partial = path.with_extension("answer");
            let text = serde_json::to_string(&answer).unwrap_or_default();
            if std::fs::write(&partial, text).is_ok() {
                let _ = std::fs::rename(&partial, &done);
            }
        }
        restarted
    }

    /// For the serving process, every 50 ms: an error naming the part when the node agent,
    /// a part of the control plane (etcd, the API server, the controller manager, the
    /// scheduler) or a load balancer's front exited, since the cluster is not one without
    /// it. A controller that exited unasked (Traefik, Contour, its Envoy, HAProxy
    /// Ingress) is started again as it was, as a kubelet starts a crashed container again,
    /// after a back-off of 1 s doubling to 30 s, its log going on in the same file. Returns
    /// what it did, in words, for the serving process's log.
    pub fn keep_alive(&mut self) -> Result<Vec<String>, ClusterError> {
        let exited: Vec<(String, std::process::ExitStatus)> = self
            .parts
            .iter_mut()
            .filter_map(|p| Some((p.name().to_owned(), p.try_wait()?)))
            .collect();
        let mut said = Vec::new();
        for (name, status) in exited {
            if !self
                .again
                .iter()
                .any(|a| a.name == name && a.ready.is_some())
            {
                let part = self.parts.iter().find(|p| p.name() == name);
                let why = format!("exited with {status}");
                return Err(match part {
                    Some(part) => part.not_ready(why).into(),
                    None => ClusterError::Api(format!("{name} {why}")),
                });
            }
            let (count, next) = self
                .crashes
                .get(&name)
                .copied()
                .unwrap_or((0, Instant::now()));
            if Instant::now() < next {
                continue;
            }
            let count = count + 1;
            let back_off = CRASH_BACK_OFF_FIRST
                .saturating_mul(1 << (count - 1).min(5))
                .min(CRASH_BACK_OFF_MAX);
            self.crashes
                .insert(name.clone(), (count, Instant::now() + back_off));
            said.push(match self.restart(&name, Duration::ZERO) {
                Ok(done) => format!(
                    "{name} exited ({status}); started again as process {} (its {} exit; its log goes on in {name}.log)",
                    done.pid,
                    ordinal(count)
                ),
                Err(e) => format!(
                    "{name} exited ({status}); starting it again failed, next try in {back_off:?}: {e}"
                ),
            });
        }
        self.check_agent_and_fronts()?;
        Ok(said)
    }

    /// Stops `name` (SIGTERM to its group, SIGKILL after `grace`), starts it again as it
    /// was started, and waits until it is ready.
    pub fn restart(&mut self, name: &str, grace: Duration) -> Result<Restarted, ClusterError> {
        let restartable: Vec<&str> = self
            .again
            .iter()
            .filter(|a| a.ready.is_some())
            .map(|a| a.name.as_str())
            .collect();
        let (Some(again), Some(index)) = (
            self.again
                .iter()
                .find(|a| a.name == name && a.ready.is_some())
                .cloned(),
            self.parts.iter().position(|p| p.name() == name),
        ) else {
            return Err(ClusterError::Api(format!(
                "no process `{name}` to restart in this local cluster; it restarts {}",
                restartable.join(", ")
            )));
        };
        let old = &mut self.parts[index];
        let old_pid = old.pid();
        old.terminate(grace);
        let stopped = SystemTime::now();
        let ready = again.ready.clone().unwrap_or(Ready::Listening(Vec::new()));
        if let Ready::Listening(addresses) = &ready {
            // What the old process left listening (a child of its group that outlived
            // it) goes before the new one is looked for there.
            let started = Instant::now();
            while addresses.iter().any(|a| accepts(*a)) && started.elapsed() < API_READY_TIMEOUT {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let mut child = spawn_again(&again, &self.dir)?;
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait() {
                return Err(child.not_ready(format!("exited with {status}")).into());
            }
            let up = match &ready {
                Ready::Http(at, path) => crate::agent::http_ok(*at, path),
                Ready::Listening(addresses) => addresses.iter().all(|a| accepts(*a)),
            };
            if up {
                break;
            }
            if started.elapsed() > API_READY_TIMEOUT {
                return Err(child
                    .not_ready(format!("not ready ({ready:?}) after {API_READY_TIMEOUT:?}"))
                    .into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let ready_at = SystemTime::now();
        let pid = child.pid();
        self.parts[index] = child;
        Ok(Restarted {
            stopped_unix_ns: unix_ns(stopped),
            ready_unix_ns: unix_ns(ready_at),
            old_pid,
            pid,
        })
    }
}

/// `1st`, `2nd`, `3rd`, `4th`.
fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

fn accepts(at: SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&at, Duration::from_millis(100)).is_ok()
}

fn spawn_again(again: &Again, dir: &Path) -> Result<OwnedChild, ClusterError> {
    let log = dir.join(format!("{}.log", again.name));
    OwnedChild::spawn_with_env(
        &again.name,
        &again.program,
        &again.args,
        &again.env,
        &again.home,
        &log,
        RunAs::default(),
    )
    .map_err(ClusterError::from)
}
