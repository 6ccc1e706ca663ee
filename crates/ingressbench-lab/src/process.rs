//! Child processes the lab owns: each in its own process group, its output in a log file,
//! killed with its whole group when dropped, and killed by the kernel if the tool itself
//! dies (Linux's parent-death signal, set by util-linux `setpriv --pdeathsig`, so that no
//! `unsafe` pre-exec hook is needed).
//!
//! The parent-death signal fires when the *thread* that started the child ends, so a lab is
//! started and dropped on one long-lived thread (the CLI's main thread, or a test's).

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, kill_process_group, Pid, Signal};

use crate::LabError;

/// The environment variable every lab child gets: its working directory, inside the lab's
/// directory. What it forks inherits it, so that leftovers of a lab whose owner is gone
/// can be told apart from anything else (see [`crate::remove_leftovers`]).
pub const LAB_DIR_ENV: &str = "INGRESSBENCH_LAB_DIR";

/// How much of a log a failure message quotes.
const LOG_TAIL_BYTES: u64 = 4096;

/// Where and as whom a child runs: the network namespace it enters (none: the tool's) and
/// the user it runs as (none: the tool's).
#[derive(Clone, Copy, Debug, Default)]
pub struct RunAs<'a> {
    /// The network namespace's path (`/run/netns/NAME`).
    pub netns: Option<&'a Path>,
    /// The user and group.
    pub user: Option<crate::identity::Identity>,
}

/// A running child the lab owns.
#[derive(Debug)]
pub struct OwnedChild {
    name: String,
    program: PathBuf,
    child: Child,
    log: PathBuf,
    /// A process of its group that took over from it (nginx's new master after a binary
    /// upgrade): signals go to it, and the child is alive while it is.
    successor: Option<u32>,
}

impl OwnedChild {
    /// Starts `program args` in `dir`, its stdout and stderr appended to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        dir: &Path,
        log: &Path,
    ) -> Result<Self, LabError> {
        Self::spawn_with_env(name, program, args, &[], dir, log, RunAs::default())
    }

    /// Like [`OwnedChild::spawn`], with extra environment variables, in the network
    /// namespace and as the user `run_as` names (entered with util-linux `nsenter`, then
    /// `setpriv`).
    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        dir: &Path,
        log: &Path,
        run_as: RunAs<'_>,
    ) -> Result<Self, LabError> {
        let start_error = |source: io::Error| LabError::Spawn {
            name: name.to_owned(),
            program: program.to_owned(),
            source,
        };
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(start_error)?;
        let err = out.try_clone().map_err(start_error)?;
        // nsenter and setpriv each exec the next, so the child's pid is the program's.
        let mut command = match run_as.netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", ns.display()))
                    .args(["--", "setpriv"]);
                c
            }
            None => Command::new("setpriv"),
        };
        if let Some(who) = run_as.user {
            // Its home is its directory: the tool's (root's) is closed to it, and programs
            // look there for configuration (Traefik stats ~/.config/traefik.toml).
            command.env("HOME", dir);
            command.args([
                format!("--reuid={}", who.uid),
                format!("--regid={}", who.gid),
                "--clear-groups".into(),
                "--no-new-privs".into(),
            ]);
        }
        let child = command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env(LAB_DIR_ENV, dir)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    start_error(io::Error::new(
                        e.kind(),
                        "setpriv or nsenter (util-linux) is missing: apt-get install util-linux",
                    ))
                } else {
                    start_error(e)
                }
            })?;
        Ok(Self {
            name: name.to_owned(),
            program: program.to_owned(),
            child,
            log: log.to_owned(),
            successor: None,
        })
    }

    /// The process id: the one started, or the successor it handed over to.
    pub fn pid(&self) -> u32 {
        self.successor.unwrap_or_else(|| self.child.id())
    }

    /// Its process group (the started process's id, whoever leads it now).
    pub fn pgid(&self) -> u32 {
        self.child.id()
    }

    /// From now on `pid`, a process of the same group that took over (nginx's new master
    /// after a binary upgrade), is this child: signals go to it, and it is alive while
    /// that process is.
    pub fn hand_over(&mut self, pid: u32) {
        self.successor = Some(pid);
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// What the child is called in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends `signal` to the child itself (not its group), e.g. SIGHUP to reload nginx.
    pub fn signal(&self, signal: Signal) -> io::Result<()> {
        let pid = Pid::from_raw(self.pid() as i32).ok_or_else(|| io::Error::other("no pid"))?;
        kill_process(pid, signal).map_err(io::Error::from)
    }

    /// Whether it has exited, and how (a successor that is gone reads as exited with 0:
    /// it is not this process's child, so its status cannot be read).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let started = self.child.try_wait().ok().flatten();
        match self.successor {
            None => started,
            Some(pid) if process_alive(pid) => None,
            Some(_) => Some(std::os::unix::process::ExitStatusExt::from_raw(0)),
        }
    }

    /// SIGTERM to the group, up to `grace` to exit, then SIGKILL. Returns how it ended.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.stop(Signal::TERM, grace)
    }

    /// `signal` to the group, up to `grace` to exit, then SIGKILL to what is left of it.
    /// Returns how it ended.
    pub fn stop(&mut self, signal: Signal, grace: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.try_wait() {
            self.kill_group(Signal::KILL);
            return Some(status);
        }
        self.kill_group(signal);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.try_wait() {
                // Leftovers of the group (nginx workers, say) go too.
                self.kill_group(Signal::KILL);
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill_group(Signal::KILL);
        self.child.wait().ok()
    }

    /// `signal` to its group, unless it has exited.
    pub fn signal_group(&mut self, signal: Signal) {
        if self.try_wait().is_none() {
            self.kill_group(signal);
        }
    }

    fn kill_group(&self, signal: Signal) {
        if let Some(pgid) = Pid::from_raw(self.pgid() as i32) {
            let _ = kill_process_group(pgid, signal);
        }
    }

    /// The last few KiB of its log, for error messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Waits until `addr` accepts connections, the child exits, or `timeout` passes.
    pub fn wait_listening(
        &mut self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Duration, LabError> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.try_wait() {
                return Err(
                    self.not_ready(format!("exited with {status} before listening on {addr}"))
                );
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                return Err(self.not_ready(format!("not listening on {addr} after {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// An error naming the child, its binary, its log and the log's tail.
    pub fn not_ready(&self, reason: String) -> LabError {
        LabError::NotReady {
            name: self.name.clone(),
            program: self.program.clone(),
            log: self.log.clone(),
            reason,
            log_tail: self.log_tail(),
        }
    }
}

impl Drop for OwnedChild {
    fn drop(&mut self) {
        self.kill_group(Signal::KILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `program args` to its end with its output captured, in a process group of its own
/// that dies with the tool (the parent-death signal, as for the lab's children). If it has
/// not ended after `timeout`, the whole group is killed and the error says so (kind
/// `TimedOut`): a binary that hangs (a wrong `--proxy-bin`, say) cannot freeze the tool.
pub fn run_bounded(program: &Path, args: &[&str], timeout: Duration) -> io::Result<Output> {
    let mut child = Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--"])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()?;
    // Read on threads, so that a full pipe cannot stall it; received with a deadline, so
    // that a grandchild that escaped the group and keeps a pipe open cannot stall us.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            let _ = tx.send(bytes);
        });
        rx
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let group = Pid::from_raw(child.id() as i32);
    let kill_group = || {
        if let Some(group) = group {
            let _ = kill_process_group(group, Signal::KILL);
        }
    };
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            kill_group();
            let _ = child.wait();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "`{} {}` did not finish within {timeout:?} (killed)",
                    program.display(),
                    args.join(" ")
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // What it forked and left behind goes too, so that the pipes close.
    kill_group();
    let collect = |rx: std::sync::mpsc::Receiver<Vec<u8>>| {
        rx.recv_timeout(Duration::from_secs(1)).unwrap_or_default()
    };
    Ok(Output {
        status,
        stdout: collect(stdout),
        stderr: collect(stderr),
    })
}

/// The last few KiB of a file (lossy UTF-8), or a note that it cannot be read.
pub fn log_tail(path: &Path) -> String {
    let read = || -> io::Result<String> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    read().unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()))
}

/// Moves the calling thread into the network namespace at `path`: sockets it makes from
/// then on (and threads it starts) live there.
pub fn enter_netns(path: &Path) -> std::io::Result<()> {
    let file = std::fs::File::open(path)?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&file),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(std::io::Error::from)
}

/// Whether process `pid` exists and is not a zombie.
pub(crate) fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}
