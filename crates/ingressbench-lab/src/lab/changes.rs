//! Changes to a lab: what they are ([`Change`]), what became of each ([`ChangeRecord`]),
//! and how the lab applies them: the backend side when asked, the proxies after the
//! propagation delay, a restart across ticks.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::model::{Overlay, GENERATION_HEADER, SIDECAR_GENERATION_HEADER};
use crate::proxy::ProxyKind;
use crate::LabError;

use super::{watching, Backend, Lab, DRAIN_GRACE};
use crate::change::{Change, ChangeRecord, Synced};

/// A restart (or an upgrade by stop and start) begun and not finished: the records it
/// applies, and the mechanism each proxy takes it by.
pub(super) struct Restarting {
    records: Vec<usize>,
    synced: Synced,
}

/// What an upgrade goes to: per kind of proxy named, the binary and its version line.
pub(super) type UpgradeTo = BTreeMap<ProxyKind, (PathBuf, String)>;

impl Lab {
    /// Starts or drains backends of `pool` until it has `replicas`, without telling the
    /// proxies (see [`Lab::sync_proxies`]). Returns the names started and drained.
    pub fn scale(
        &mut self,
        pool: &str,
        replicas: usize,
    ) -> Result<(Vec<String>, Vec<Backend>), LabError> {
        let spec = self
            .spec
            .pools
            .iter()
            .find(|p| p.name == pool)
            .cloned()
            .ok_or_else(|| LabError::InvalidValue {
                field: "pool".into(),
                value: pool.into(),
                reason: "no pool has that name".into(),
            })?;
        let mut started = Vec::new();
        while self.backends.iter().filter(|b| b.pool == pool).count() < replicas {
            self.start_backend(&spec)?;
            started.push(
                self.backends
                    .last()
                    .map(|b| b.name.clone())
                    .unwrap_or_default(),
            );
        }
        let mut removed = Vec::new();
        while self.backends.iter().filter(|b| b.pool == pool).count() > replicas {
            let i = self
                .backends
                .iter()
                .rposition(|b| b.pool == pool)
                .unwrap_or(0);
            removed.push(self.backends.remove(i));
        }
        Ok((started, removed))
    }

    /// Removes a backend from the lab's view and returns it (to kill or drain).
    pub fn take_backend(&mut self, name: &str) -> Option<Backend> {
        let i = self.backends.iter().position(|b| b.name == name)?;
        Some(self.backends.remove(i))
    }

    /// Sets the overlay (header, CORS, rewrite) the next sync applies, as a new
    /// configuration generation.
    pub fn set_overlay(&mut self, overlay: Overlay) {
        self.overlay = overlay;
        self.generation += 1;
    }

    /// Pushes the current table to every proxy, each its own way; returns how they took it.
    pub fn sync_proxies(&mut self) -> Result<Synced, LabError> {
        let mut synced = Synced::default();
        let mut took = |kind, update: crate::proxy::Update| {
            synced.mechanisms.push((kind, update.mechanism));
            synced.ends_connections |= update.ends_connections;
        };
        let sidecar_table = self.sidecar_table();
        if let Some(sidecar) = self.sidecar.as_mut() {
            took(sidecar.kind(), sidecar.update(&sidecar_table)?);
        }
        // With a sidecar, endpoint changes stop there: the proxies hear only of theirs
        // (a reload is pushed to them all the same).
        let table = self.proxies_table();
        let reload = std::mem::take(&mut self.reload_due);
        if let Some((grace, upgrade)) = self.restart_due.take() {
            for p in &mut self.proxies {
                let mut watch = watching(&mut self.reaper);
                let mechanism = if let Some(to) = &upgrade {
                    let to = to
                        .get(&p.kind())
                        .map(|(binary, line)| (binary.as_path(), line.clone()));
                    p.upgrade(&table, grace, to, &mut watch)?
                } else {
                    p.begin_restart(grace, None);
                    "restart (a graceful stop, then a new process)"
                };
                // Every restart and upgrade replaces processes.
                took(
                    p.kind(),
                    crate::proxy::Update {
                        mechanism,
                        ends_connections: true,
                    },
                );
            }
            self.told_proxies = Some(table);
        } else if self.sidecar.is_none() || reload || self.told_proxies.as_ref() != Some(&table) {
            for p in &mut self.proxies {
                took(p.kind(), p.update(&table)?);
            }
            self.told_proxies = Some(table);
        }
        Ok(synced)
    }

    /// Requests a change. The backend side happens now (a pod starts, dies or drains
    /// whatever the control plane does); the proxies are told after `propagation_delay`,
    /// when [`Lab::tick`] runs past it, as a controller going through a slow API would.
    /// Returns the index of the change's record.
    pub fn request(
        &mut self,
        change: Change,
        propagation_delay: Duration,
    ) -> Result<usize, LabError> {
        let requested_at = Instant::now();
        let mut generations = Vec::new();
        let (what, started, removed) = match &change {
            Change::Scale { pool, replicas } => {
                let before = self.backends.iter().filter(|b| &b.pool == pool).count();
                let (started, removed) = self.scale(pool, *replicas)?;
                let names = removed.iter().map(|b| b.name.clone()).collect();
                for backend in removed {
                    self.begin_termination(backend);
                }
                (format!("scale {pool} {before}->{replicas}"), started, names)
            }
            Change::Migrate => {
                let what = "migrate the client's QUIC connections".to_owned();
                return Ok(self.record_done_when_asked(what, requested_at));
            }
            Change::Stall { backend, duration } => {
                let name = self.pick_backend(backend.as_deref())?;
                let child = self
                    .backends
                    .iter()
                    .find(|b| b.name == name)
                    .map(|b| &b.child)
                    .ok_or_else(|| self.no_such_backend(&name))?;
                child
                    .signal(rustix::process::Signal::STOP)
                    .map_err(|source| LabError::Io {
                        action: "stopping",
                        path: PathBuf::from(&name),
                        source,
                    })?;
                self.stalled.push((name.clone(), requested_at + *duration));
                let what = format!("stall {name} for {duration:?}");
                return Ok(self.record_done_when_asked(what, requested_at));
            }
            Change::Kill(name) | Change::Terminate(name) => {
                let name = self.pick_backend(name.as_deref())?;
                let backend = self
                    .take_backend(&name)
                    .ok_or_else(|| self.no_such_backend(&name))?;
                if matches!(change, Change::Kill(_)) {
                    backend.kill();
                    (format!("kill {name}"), Vec::new(), vec![name])
                } else {
                    self.begin_termination(backend);
                    (format!("terminate {name}"), Vec::new(), vec![name])
                }
            }
            Change::Overlay(overlay) => {
                // Refused here, before anything changes, if a proxy would be given a
                // value it must not get.
                self.spec.check(std::slice::from_ref(overlay))?;
                self.set_overlay(overlay.clone());
                generations.push((GENERATION_HEADER, self.generation));
                (overlay.describe(), Vec::new(), Vec::new())
            }
            Change::Routes(_)
            | Change::AddRoutes(_)
            | Change::RemoveRoutes(_)
            | Change::GeneratedRoutes(_)
            | Change::ChangeRoutes(_) => {
                let routes = self.routes_after(&change);
                let what = crate::routes::routes_change(&self.spec.routes, &routes);
                // One that changes no route (remove_routes with none generated) is said as
                // `routes N (unchanged)`, and no proxy is told or reloaded for it.
                if routes == self.spec.routes {
                    return Ok(self.record_done_when_asked(what, requested_at));
                }
                // Refused here, before anything changes, as an overlay is.
                let mut next = self.spec.clone();
                next.routes = routes.clone();
                next.check(&[])?;
                self.spec.routes = routes;
                self.generation += 1;
                generations.push((GENERATION_HEADER, self.generation));
                (what, Vec::new(), Vec::new())
            }
            Change::Upgrade { grace, to, .. } => {
                // Refused now, before anything changes, if a version is not installed.
                let mut binaries = BTreeMap::new();
                for (kind, version) in to {
                    binaries.insert(*kind, self.spec.binaries.locate_version(*kind, version)?);
                }
                self.restart_due = Some((*grace, Some(binaries)));
                self.generation += 1;
                generations.push((GENERATION_HEADER, self.generation));
                let versions: Vec<String> = to
                    .iter()
                    .map(|(kind, v)| format!("{} {v}", kind.name()))
                    .collect();
                let what = if versions.is_empty() {
                    "upgrade".to_owned()
                } else {
                    format!("upgrade to {}", versions.join(", "))
                };
                (what, Vec::new(), Vec::new())
            }
            Change::Restart { grace } => {
                self.restart_due = Some((*grace, None));
                self.generation += 1;
                generations.push((GENERATION_HEADER, self.generation));
                ("restart".to_owned(), Vec::new(), Vec::new())
            }
            Change::Reload => {
                self.reload_due = true;
                self.generation += 1;
                generations.push((GENERATION_HEADER, self.generation));
                if self.sidecar.is_some() {
                    self.sidecar_generation += 1;
                    generations.push((SIDECAR_GENERATION_HEADER, self.sidecar_generation));
                }
                ("reload".to_owned(), Vec::new(), Vec::new())
            }
        };
        self.records.push(ChangeRecord {
            started,
            removed,
            // Every change to the proxies makes a generation of their configuration.
            on_proxies: !generations.is_empty(),
            generations,
            ..ChangeRecord::asked(what, requested_at)
        });
        let index = self.records.len() - 1;
        self.pending.push((requested_at + propagation_delay, index));
        self.tick()?;
        Ok(index)
    }

    /// Records a change that is done when it is asked and that no proxy is told of (a
    /// stall; a route change that changes nothing). Returns its index.
    fn record_done_when_asked(&mut self, what: String, requested_at: Instant) -> usize {
        self.records.push(ChangeRecord {
            applied_at: Some(requested_at),
            ..ChangeRecord::asked(what, requested_at)
        });
        self.records.len() - 1
    }

    /// Applies the changes whose propagation delay has passed (the proxies get the state
    /// of the backends as it is now, as a reconciling controller would), and reaps
    /// terminated backends. Call it often while changes are pending.
    pub fn tick(&mut self) -> Result<(), LabError> {
        let now = Instant::now();
        self.terminating.retain_mut(|(backend, since)| {
            let exited = backend.child.try_wait().is_some();
            if !exited && since.elapsed() > DRAIN_GRACE {
                backend.child.terminate(Duration::ZERO);
                return false;
            }
            !exited
        });
        let backends = &self.backends;
        self.stalled.retain(|(name, until)| {
            if *until > now {
                return true;
            }
            if let Some(b) = backends.iter().find(|b| &b.name == name) {
                let _ = b.child.signal(rustix::process::Signal::CONT);
            }
            false
        });
        // A restart holds every change to the proxies until its new processes route.
        if self.restarting.is_some() && !self.finish_restart()? {
            return Ok(());
        }
        let (due, waiting): (Vec<_>, Vec<_>) = self.pending.iter().partition(|(at, _)| *at <= now);
        self.pending = waiting;
        if due.is_empty() {
            return Ok(());
        }
        let restart = self.restart_due.is_some();
        let synced = self.sync_proxies()?;
        let records = due.into_iter().map(|(_, index)| index).collect();
        if restart {
            // Applied when the new processes route; the old ones drain meanwhile, and
            // events go on firing.
            self.restarting = Some(Restarting { records, synced });
            self.finish_restart()?;
            return Ok(());
        }
        self.applied(records, synced, false);
        Ok(())
    }

    /// Finishes the restart under way once no proxy waits for its old process any more
    /// (each has left, or its grace is over): starts the new processes with the table as
    /// it is now, and records the restart applied. Returns whether none is under way.
    fn finish_restart(&mut self) -> Result<bool, LabError> {
        let cut = &self.stopping;
        if self.proxies.iter_mut().any(|p| p.restart_waits(cut)) {
            return Ok(false);
        }
        let Some(restarting) = self.restarting.take() else {
            return Ok(true);
        };
        let table = self.proxies_table();
        for p in &mut self.proxies {
            let mut watch = watching(&mut self.reaper);
            p.finish_restart(&table, &mut watch)?;
        }
        self.told_proxies = Some(table);
        self.applied(restarting.records, restarting.synced, true);
        Ok(true)
    }

    /// Records the changes `records` applied now, as `synced` says; after a restart or an
    /// upgrade, with the version line each proxy runs.
    fn applied(&mut self, records: Vec<usize>, synced: Synced, restarted: bool) {
        let applied = Instant::now();
        let versions: Vec<(ProxyKind, String)> = if restarted {
            self.proxies
                .iter()
                .map(|p| (p.kind(), p.version().to_owned()))
                .collect()
        } else {
            Vec::new()
        };
        for index in records {
            if let Some(record) = self.records.get_mut(index) {
                record.applied_at = Some(applied);
                record.mechanisms = synced.mechanisms.clone();
                record.versions = versions.clone();
                // A backend's change that nginx applies by a reload ends connections as
                // a reload does.
                record.on_proxies |= synced.ends_connections;
            }
        }
    }

    /// Whether changes are still waiting for their propagation delay, or backends to
    /// be let go on.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty() || !self.stalled.is_empty() || self.restarting.is_some()
    }

    /// Every change requested so far.
    pub fn records(&self) -> &[ChangeRecord] {
        &self.records
    }

    fn begin_termination(&mut self, backend: Backend) {
        let _ = backend.child.signal(rustix::process::Signal::TERM);
        // A stalled backend drains too.
        let _ = backend.child.signal(rustix::process::Signal::CONT);
        self.stalled.retain(|(name, _)| name != &backend.name);
        self.terminating.push((backend, Instant::now()));
    }

    /// `name`, or a running backend at random.
    fn pick_backend(&self, name: Option<&str>) -> Result<String, LabError> {
        match name {
            Some(name) => Ok(name.to_owned()),
            None => self.random_backend().ok_or_else(|| LabError::InvalidValue {
                field: "backend".into(),
                value: "random".into(),
                reason: "no backend is running".into(),
            }),
        }
    }

    fn no_such_backend(&self, name: &str) -> LabError {
        LabError::InvalidValue {
            field: "backend".into(),
            value: name.to_owned(),
            reason: format!(
                "no running backend has that name (running: {})",
                self.backends
                    .iter()
                    .map(|b| b.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    fn random_backend(&self) -> Option<String> {
        if self.backends.is_empty() {
            return None;
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos() as usize;
        Some(self.backends[nanos % self.backends.len()].name.clone())
    }
}
