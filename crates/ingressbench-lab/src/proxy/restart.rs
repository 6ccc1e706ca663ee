//! A proxy's restart and upgrade, each its own way: a restart in two steps that the
//! lab's tick joins (the old process asked to stop, the new one started once the old has
//! left or its grace is over), nginx's binary upgrade, HAProxy's master re-exec, Envoy's
//! hot restart.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::process::Signal;

use super::{envoy, launch, nginx, spawn, start_timeout, Proxy, ProxyKind};
use crate::model::RouteTable;
use crate::LabError;

/// A restart under way (see [`Proxy::begin_restart`]).
pub(super) struct Restart {
    asked: Instant,
    grace: Duration,
    /// Another binary and its version line to start (an upgrade by stop and start).
    to: Option<(PathBuf, String)>,
}

impl Proxy {
    /// Begins a restart as a service manager's does (nothing listens between the old
    /// process and the new): asks the proxy to stop its own graceful way (nginx QUIT,
    /// HAProxy's soft stop USR1, TERM for Envoy, Traefik and Caddy), and returns at once.
    /// [`Proxy::restart_waits`] says when the old process has left or its `grace` is over;
    /// [`Proxy::finish_restart`] starts the new one, from `to` if given (another version:
    /// an upgrade by stop and start).
    pub fn begin_restart(&mut self, grace: Duration, to: Option<(&Path, String)>) {
        self.child.signal_group(self.kind.graceful_stop());
        for mut old in self.retiring.drain(..) {
            old.terminate(Duration::ZERO);
        }
        self.restart = Some(Restart {
            asked: Instant::now(),
            grace,
            to: to.map(|(binary, version)| (binary.to_owned(), version)),
        });
    }

    /// Whether a restart waits for the old process: it is still there, and its grace is
    /// not over (it ends early when `cut` is set: the run was stopped, and the grace is
    /// the proxy's to drain a benchmark's connections, not worth waiting out).
    pub fn restart_waits(&mut self, cut: &AtomicBool) -> bool {
        let Some(restart) = &self.restart else {
            return false;
        };
        let within_grace = restart.asked.elapsed() < restart.grace && !cut.load(Ordering::Relaxed);
        within_grace && self.child.try_wait().is_none()
    }

    /// Whether a restart is under way (the old process may have left, the new one is not
    /// started).
    pub fn restarting(&self) -> bool {
        self.restart.is_some()
    }

    /// Ends a restart begun with [`Proxy::begin_restart`]: kills what is left of the old
    /// process's group (nginx workers, say) and starts the proxy again on the same ports
    /// with `table`; `spawned` is told the new process id. Returns how long the proxy was
    /// gone (from the stop's signal to the new one routing), or nothing when no restart
    /// was under way.
    pub fn finish_restart(
        &mut self,
        table: &RouteTable,
        spawned: &mut dyn FnMut(u32),
    ) -> Result<Option<Duration>, LabError> {
        let Some(restart) = self.restart.take() else {
            return Ok(None);
        };
        self.child.stop(Signal::KILL, Duration::ZERO);
        self.forget_shared_memory();
        self.epoch = 0;
        if let Some((binary, version)) = restart.to {
            self.binary = binary;
            self.version = version;
        }
        table.validate()?;
        self.table = table.clone();
        let (child, startup) = launch(
            (self.kind, &self.binary, &mut *self.driver),
            &self.files,
            &self.table,
            self.netns.as_deref(),
            spawned,
        )?;
        self.child = child;
        self.startup = startup;
        Ok(Some(restart.asked.elapsed()))
    }

    /// Envoy's hot restart: a process of the next epoch, from the same files with
    /// `table`, takes the listening sockets from the running one (found by its base id),
    /// which drains its listeners for `grace` and exits a second after; the old process is
    /// kept until it has (and stopped with the proxy if it has not).
    fn hot_restart(
        &mut self,
        table: &RouteTable,
        grace: Duration,
        to: Option<(&Path, String)>,
        spawned: &mut dyn FnMut(u32),
    ) -> Result<(), LabError> {
        let base_id = envoy::base_id(&self.files).ok_or_else(|| LabError::Update {
            kind: "envoy".into(),
            mechanism: "hot restart",
            reason: format!(
                "the running Envoy wrote no base id to {} (a lab is started ready for an upgrade only when its scenario has an upgrade event)",
                self.files.dir.join("base-id").display()
            ),
        })?;
        table.validate()?;
        if let Some((binary, version)) = to {
            self.binary = binary.to_owned();
            self.version = version;
        }
        let mut launch = self.driver.start(&self.files, table)?;
        self.epoch += 1;
        envoy::hot_restart_args(&mut launch, self.epoch, base_id, grace);
        let mut child = spawn(
            self.kind,
            &self.binary,
            &self.files,
            &launch,
            self.netns.as_deref(),
        )?;
        spawned(child.pgid());
        child.wait_listening(self.http_addr(), start_timeout(table.routes.len()))?;
        let old = std::mem::replace(&mut self.child, child);
        self.retiring.retain_mut(|c| c.try_wait().is_none());
        self.retiring.push(old);
        self.table = table.clone();
        Ok(())
    }

    /// Removes what Envoy's hot restart left in shared memory for the base id it ran
    /// with (nothing for the other proxies).
    pub(super) fn forget_shared_memory(&self) {
        if self.kind == ProxyKind::Envoy {
            if let Some(id) = envoy::base_id(&self.files) {
                envoy::remove_shared_memory(id);
            }
        }
    }

    /// Upgrades the proxy to the binary it runs, its own way: nginx's binary upgrade (USR2
    /// starts a new master from the binary beside the old, WINCH ends the old workers
    /// gracefully, QUIT the old master: its workers finish what they serve, WebSockets
    /// included, however long that takes, as nginx does), HAProxy's master re-exec (USR2:
    /// the master executes the binary again, the new workers take the listening sockets,
    /// the old ones finish theirs), Envoy's hot restart (the next epoch takes the listening
    /// sockets, the old drains for `grace` and exits a second after); Traefik and Caddy
    /// document no such mechanism, so theirs is a restart with `grace`, begun here and
    /// finished as a restart is. Returns the mechanism.
    pub fn upgrade(
        &mut self,
        table: &RouteTable,
        grace: Duration,
        to: Option<(&Path, String)>,
        spawned: &mut dyn FnMut(u32),
    ) -> Result<&'static str, LabError> {
        if let (ProxyKind::Nginx | ProxyKind::Haproxy, Some((_, version))) = (self.kind, &to) {
            return Err(LabError::Update {
                kind: self.kind.name().into(),
                mechanism: "upgrade",
                reason: format!(
                    "to `{version}`: one {} is installed here (Debian's), so its upgrade is to the binary it runs (`upgrade: same`)",
                    self.kind.name()
                ),
            });
        }
        match self.kind {
            ProxyKind::Nginx => {
                nginx::binary_upgrade(&mut self.child, &self.files, table)?;
                self.table = table.clone();
                Ok("binary upgrade (USR2, then WINCH and QUIT to the old master)")
            }
            ProxyKind::Haproxy => {
                self.update(table)?;
                Ok("master re-exec (USR2), listening sockets passed on")
            }
            ProxyKind::Traefik | ProxyKind::Caddy => {
                self.begin_restart(grace, to);
                Ok("stop and start (no zero-downtime upgrade documented)")
            }
            ProxyKind::Envoy => {
                self.hot_restart(table, grace, to, spawned)?;
                Ok("hot restart (a new epoch takes the listeners, the old drains)")
            }
        }
    }
}
