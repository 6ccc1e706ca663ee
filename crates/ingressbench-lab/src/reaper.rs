//! The reaper: a small watcher process that kills every process group of a lab when the
//! lab's owner dies, however it dies.
//!
//! The parent-death signal set on each child covers the child itself, but not what the
//! child forks: nginx workers, for one, keep running after their master is killed. So the
//! lab also starts `ingressbench lab reaper` with a pipe on its standard input and writes
//! the process-group id of every child it starts. The kernel closes that pipe when the
//! owner exits for any reason (SIGKILL included); on end-of-file the reaper sends SIGKILL
//! to every group it was told about, and removes the lab's directory if it was told one
//! (`dir PATH`). On a normal tear-down the lab says `clear` first, so nothing is killed
//! or removed twice.

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

use rustix::process::{kill_process_group, Pid, Signal};

use crate::LabError;

/// The lab's handle on its reaper.
#[derive(Debug)]
pub struct Reaper {
    child: Child,
    input: Option<ChildStdin>,
}

impl Reaper {
    /// Starts `binary lab reaper`.
    pub fn start(binary: &Path) -> Result<Self, LabError> {
        let mut child = Command::new(binary)
            .args(["lab", "reaper"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own group, so that a Ctrl-C to the terminal's group does not reach it first.
            .process_group(0)
            .spawn()
            .map_err(|source| LabError::Spawn {
                name: "lab reaper".into(),
                program: binary.to_owned(),
                source,
            })?;
        let input = child.stdin.take();
        Ok(Self { child, input })
    }

    /// Tells the reaper about a process group to kill if the owner dies.
    pub fn watch(&mut self, pgid: u32) {
        if let Some(input) = self.input.as_mut() {
            let _ = writeln!(input, "{pgid}").and_then(|()| input.flush());
        }
    }

    /// Tells the reaper to remove `dir` if the owner dies.
    pub fn remove_on_death(&mut self, dir: &Path) {
        if let Some(input) = self.input.as_mut() {
            let _ = writeln!(input, "dir {}", dir.display()).and_then(|()| input.flush());
        }
    }

    /// Tells the reaper to remove the network namespace `name` if the owner dies.
    pub fn remove_netns_on_death(&mut self, name: &str) {
        if let Some(input) = self.input.as_mut() {
            let _ = writeln!(input, "netns {name}").and_then(|()| input.flush());
        }
    }

    /// The owner stopped everything itself: the reaper forgets it all and exits.
    pub fn dismiss(mut self) {
        if let Some(mut input) = self.input.take() {
            let _ = writeln!(input, "clear").and_then(|()| input.flush());
        }
        let _ = self.child.wait();
    }
}

use std::os::unix::process::CommandExt;

/// The reaper's main loop: reads process-group ids, `dir PATH`, `netns NAME` or `clear`
/// until end-of-file, then kills every group still on its list, removes the directory
/// and the namespaces (their veths go with them). Returns how many groups it signalled.
pub fn serve(input: impl BufRead) -> usize {
    let mut groups: Vec<u32> = Vec::new();
    let mut dir: Option<std::path::PathBuf> = None;
    let mut namespaces: Vec<String> = Vec::new();
    for line in input.lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "clear" => {
                groups.clear();
                dir = None;
                namespaces.clear();
            }
            other if other.starts_with("netns ") => {
                namespaces.push(other["netns ".len()..].trim().to_owned());
            }
            other if other.starts_with("dir") => {
                let path = other["dir".len()..].trim();
                dir = (!path.is_empty()).then(|| path.into());
            }
            other => {
                if let Ok(pgid) = other.parse::<u32>() {
                    groups.push(pgid);
                }
            }
        }
    }
    let mut signalled = 0;
    for pgid in groups {
        if let Some(pid) = Pid::from_raw(pgid as i32) {
            if kill_process_group(pid, Signal::KILL).is_ok() {
                signalled += 1;
            }
        }
    }
    for ns in namespaces.iter().rev() {
        let _ = crate::topology::ip(&["netns", "del", ns]);
    }
    if let Some(dir) = dir {
        // Give the killed processes a moment to let go of their files.
        std::thread::sleep(std::time::Duration::from_millis(100));
        let _ = std::fs::remove_dir_all(dir);
    }
    signalled
}
