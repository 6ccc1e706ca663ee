//! The echo backend run as a process of its own by the tests (`ingressbench backend`), in
//! a file of its own so that the capacity tests' binary (tests/capacity.rs) takes it too.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::BIN;

/// A backend process, killed when dropped (so a failing test leaves nothing behind).
pub(crate) struct Backend {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
}

impl Backend {
    pub(crate) fn start(args: &[&str]) -> Backend {
        Self::start_with(args, &[])
    }

    /// A backend started with `env` set.
    pub(crate) fn start_with(args: &[&str], env: &[(&str, &str)]) -> Backend {
        let mut child = Command::new(BIN)
            .arg("backend")
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .unwrap();
        Backend { child, addr }
    }

    /// SIGTERM, then its exit status and what it wrote on stderr once it has drained.
    pub(crate) fn terminate(&mut self) -> (std::process::ExitStatus, String) {
        self.signal("-TERM");
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "still running after the drain"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        (status, stderr)
    }

    pub(crate) fn signal(&self, sig: &str) {
        assert!(Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success());
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
