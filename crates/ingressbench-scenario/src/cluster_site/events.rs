//! A cell's events made through the cluster's API as a person or a pipeline would make
//! them, and their times: requested, seen in the EndpointSlices (the control plane's
//! part), reported in an HTTPRoute's status (the controller's).

use std::time::{Duration, Instant};

use ingressbench_cluster::deploy::PodState;
use ingressbench_cluster::routes::{self, gateway, Routing};
use ingressbench_lab::model::{Overlay, GENERATION_HEADER};
use ingressbench_lab::{Change, ChangeRecord};

use ingressbench_cluster::file::Restart;

use super::{ClusterSite, Expect, HEARTBEAT_EVERY, ROUTE_STATUS_TIMEOUT, STATUS_EVERY};

/// How long a controller's rollout restart may take to complete.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(300);

/// A controller's restart under way.
pub(super) enum Restarting {
    /// Its workload's rollout.
    Rollout(ingressbench_cluster::deploy::Rollout),
    /// The local cluster's serving process restarting it.
    Local(ingressbench_cluster::local::RestartRequest),
}

/// The instant of a wall-clock time (nanoseconds since the Unix epoch), by `now`.
fn instant_of(unix_ns: u64, now: Instant) -> Instant {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    now.checked_sub(Duration::from_nanos(wall.saturating_sub(unix_ns)))
        .unwrap_or(now)
}

impl ClusterSite {
    /// Makes `change` through the API (a scale, a kill, a route change, …) and records it;
    /// its index among the records.
    pub(super) fn apply(&mut self, change: Change) -> Result<usize, String> {
        match change {
            Change::Scale { pool, replicas } => self.scale(&pool, replicas),
            Change::Kill(name) => self.delete_pod(name.as_deref(), true),
            Change::Terminate(name) => self.delete_pod(name.as_deref(), false),
            Change::Overlay(overlay) => self.change_routes(&overlay),
            Change::Stall { backend, duration } => self.stall(backend.as_deref(), duration),
            Change::AddRoutes(_)
            | Change::RemoveRoutes(_)
            | Change::GeneratedRoutes(_)
            | Change::ChangeRoutes(_) => self.change_generated(&change),
            Change::Routes(_) => Err(
                "replacing the scenario's own routes is not made through the API: generated routes are (add_routes, remove_routes, change_routes, route_steps)"
                    .into(),
            ),
            Change::Restart { grace } => self.restart_controller(grace),
            Change::Upgrade { .. } => Err(
                "an upgrade of a controller in cluster mode is a change of its image: not built; upgrade runs against the lab's proxies"
                    .into(),
            ),
            Change::Reload => Err(
                "a reload has no meaning in cluster mode: the controller applies what the API holds (route changes are `config` events)"
                    .into(),
            ),
        }
    }

    /// Scales the pool's Deployment; done when the EndpointSlices show that many ready.
    fn scale(&mut self, pool: &str, replicas: usize) -> Result<usize, String> {
        let now: Vec<String> = self.live_pods()?.into_iter().map(|p| p.name).collect();
        let before = now.len();
        let asked = Instant::now();
        self.run
            .scale(i32::try_from(replicas).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let index = self.record(
            format!("scale {pool} {before}->{replicas}"),
            Vec::new(),
            Some(Expect::Ready(replicas)),
            asked,
        );
        self.before.push((index, now));
        Ok(index)
    }

    /// Deletes a pod (`name`, or one at random): at once (`kill`, a crash) or with its
    /// grace period (a drain); done when its address leaves the ready endpoints.
    fn delete_pod(&mut self, name: Option<&str>, kill: bool) -> Result<usize, String> {
        let pod = self.pick(name)?;
        let asked = Instant::now();
        self.run
            .delete_pod(&pod.name, kill.then_some(0))
            .map_err(|e| e.to_string())?;
        let verb = if kill { "kill" } else { "terminate" };
        let expect = match pod.ip {
            Some(ip) => Expect::Gone(ip),
            None => Expect::Ready(0),
        };
        Ok(self.record(
            format!("{verb} {}", pod.name),
            vec![pod.name],
            Some(expect),
            asked,
        ))
    }

    /// Applies the routes of the next generation with `overlay`. Applied when the API
    /// stored it; the traffic shows when the proxies had it, and an HTTPRoute's status
    /// when its controller says it did.
    fn change_routes(&mut self, overlay: &Overlay) -> Result<usize, String> {
        let generation = self
            .generation
            .ok_or("the cell was made without route changes")?
            + 1;
        let asked = Instant::now();
        self.run
            .apply(&routes::render(
                self.run.objects(),
                Some(generation),
                overlay,
            ))
            .map_err(|e| e.to_string())?;
        self.generation = Some(generation);
        let index = self.applied(
            overlay.describe(),
            asked,
            vec![(GENERATION_HEADER, generation)],
        );
        if matches!(self.run.objects().routing, Routing::Gateway { .. }) {
            self.reporting.push(index);
        }
        Ok(index)
    }

    /// Stops a backend pod (`backend`, or one at random) answering for `duration`;
    /// applied when the backend said so (through the API server's proxy).
    fn stall(&mut self, backend: Option<&str>, duration: Duration) -> Result<usize, String> {
        let pod = self.pick(backend)?;
        let asked = Instant::now();
        self.run
            .stall_pod(&pod.name, duration)
            .map_err(|e| e.to_string())?;
        Ok(self.applied(
            format!("stall {} for {duration:?}", pod.name),
            asked,
            Vec::new(),
        ))
    }

    /// Restarts the target's controller as the cluster file says: a rollout restart of
    /// its workload (the pods' own termination grace applies), or the local cluster's
    /// process stopped (`grace` to exit) and started again. Applied when the first new
    /// pod (process) is ready, complete when the rollout is.
    fn restart_controller(&mut self, grace: Duration) -> Result<usize, String> {
        let restart = self.restart.clone().ok_or(
            "the cluster file does not say how to restart the target's controller: give it `restart: { deployment: NAME, namespace: NS }`",
        )?;
        let asked = Instant::now();
        let (what, restarting) = match &restart {
            Restart::Rollout {
                kind,
                namespace,
                name,
            } => {
                let rollout = self
                    .run
                    .rollout_restart(kind, namespace, name)
                    .map_err(|e| e.to_string())?;
                let what = format!(
                    "restart: rollout of {kind} {namespace}/{name} ({} pods)",
                    rollout.before.len()
                );
                (what, Restarting::Rollout(rollout))
            }
            Restart::Local { dir, process } => {
                let request = ingressbench_cluster::local::request_restart(dir, process, grace)
                    .map_err(|e| e.to_string())?;
                (
                    format!("restart: {process} process"),
                    Restarting::Local(request),
                )
            }
        };
        // Not an EndpointSlice's change: followed on its own. A change to the proxies.
        let index = self.record(what, Vec::new(), None, asked);
        self.records[index].on_proxies = true;
        self.restarting.push((index, restarting));
        Ok(index)
    }

    /// Follows each restart not yet complete: the first new pod ready (applied), every
    /// one (complete); the local cluster's process ready (both), whose id the usage
    /// readings follow from then.
    fn follow_restarts(&mut self, now: Instant) -> Result<(), String> {
        let mut done = Vec::new();
        for (k, (index, restarting)) in self.restarting.iter().enumerate() {
            let record = &mut self.records[*index];
            match restarting {
                Restarting::Rollout(rollout) => {
                    let state = self.run.rollout_state(rollout).map_err(|e| e.to_string())?;
                    if !state.new_ready.is_empty() && record.applied_at.is_none() {
                        record.applied_at = Some(now);
                    }
                    if state.complete {
                        record.completed_at = Some(now);
                        record.applied_at.get_or_insert(now);
                        done.push(k);
                    } else if now.duration_since(record.requested_at) > ROLLOUT_TIMEOUT {
                        return Err(format!(
                            "{} {}/{}: the rollout restart was not complete within {} s ({} of its {} pods replaced, {} new ready)",
                            rollout.kind,
                            rollout.namespace,
                            rollout.name,
                            ROLLOUT_TIMEOUT.as_secs(),
                            state.old_gone.len(),
                            rollout.before.len(),
                            state.new_ready.len()
                        ));
                    }
                }
                Restarting::Local(request) => {
                    let Some(restarted) = request.poll().map_err(|e| e.to_string())? else {
                        continue;
                    };
                    let ready = instant_of(restarted.ready_unix_ns, now);
                    record.applied_at = Some(ready);
                    record.completed_at = Some(ready);
                    let stopped = instant_of(restarted.stopped_unix_ns, now)
                        .saturating_duration_since(record.requested_at);
                    record.what = format!(
                        "{} {} -> {} (old stopped after {:.0} ms)",
                        record.what,
                        restarted.old_pid,
                        restarted.pid,
                        stopped.as_secs_f64() * 1e3
                    );
                    if let (_, Some(pids)) = &mut self.local {
                        for pid in [&mut pids.controller]
                            .into_iter()
                            .chain(pids.proxy.as_mut())
                        {
                            if *pid == restarted.old_pid {
                                *pid = restarted.pid;
                            }
                        }
                    }
                    done.push(k);
                }
            }
        }
        for k in done.into_iter().rev() {
            self.restarting.remove(k);
        }
        Ok(())
    }

    /// Moves pending changes on: when the EndpointSlices show them, when the controller
    /// reports a route change, restarts, and the namespace's heartbeat.
    pub(super) fn advance(&mut self) -> Result<(), String> {
        let now = Instant::now();
        if now.duration_since(self.beat_at) >= HEARTBEAT_EVERY {
            self.beat_at = now;
            self.run.heartbeat().map_err(|e| e.to_string())?;
        }
        self.read_route_status(now)?;
        if !self.restarting.is_empty() && now.duration_since(self.restart_read_at) >= STATUS_EVERY {
            self.restart_read_at = now;
            self.follow_restarts(now)?;
        }
        // Each pending change is shown by the first set the watch delivered after it was
        // asked that has it.
        let mut done = Vec::new();
        for (i, (index, expect, asked)) in self.pending.iter().enumerate() {
            let shown = self
                .endpoints
                .since(*asked)
                .into_iter()
                .filter(|(at, _)| at > asked)
                .find(|(_, set)| match expect {
                    Expect::Ready(n) => set.len() == *n,
                    Expect::Gone(ip) => !set.contains(ip),
                });
            if let Some((at, _)) = shown {
                done.push(i);
                self.records[*index].endpoints_at = Some(at);
                self.records[*index].applied_at = Some(at);
            }
        }
        for i in done.into_iter().rev() {
            let (index, _, _) = self.pending.remove(i);
            if let Some(at) = self.before.iter().position(|(k, _)| *k == index) {
                let (_, before) = self.before.remove(at);
                let pods = self.run.pods().map_err(|e| e.to_string())?;
                let live = |name: &String| pods.iter().any(|p| &p.name == name && !p.terminating);
                // A scale-up's new pods; a scale-down's pods the Deployment chose to stop.
                self.records[index].started = pods
                    .iter()
                    .filter(|p| p.ready && !before.contains(&p.name))
                    .map(|p| p.name.clone())
                    .collect();
                self.records[index].removed = before.iter().filter(|n| !live(n)).cloned().collect();
            }
        }
        Ok(())
    }

    /// The pool's pods not being deleted, by name.
    pub(super) fn live_pods(&self) -> Result<Vec<PodState>, String> {
        let pods = self.run.pods().map_err(|e| e.to_string())?;
        Ok(pods.into_iter().filter(|p| !p.terminating).collect())
    }

    /// The pod an event names: `POOL-N` is the N-th by name of the pods not being deleted,
    /// `None` one of them at random.
    pub(super) fn pick(&self, name: Option<&str>) -> Result<PodState, String> {
        let pods = self.live_pods()?;
        if pods.is_empty() {
            return Err("no pod of the pool is running".into());
        }
        let index = match name {
            None => {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .subsec_nanos() as usize
                    % pods.len()
            }
            Some(n) => n
                .rsplit_once('-')
                .and_then(|(_, k)| k.parse::<usize>().ok())
                .and_then(|k| k.checked_sub(1))
                .filter(|k| *k < pods.len())
                .ok_or_else(|| format!("`{n}`: the pool has {} pods", pods.len()))?,
        };
        Ok(pods[index].clone())
    }

    /// Records a change asked at `asked` that is applied now (no EndpointSlice shows it);
    /// one with `generations` is a change of the routes, made to the proxies.
    pub(super) fn applied(
        &mut self,
        what: String,
        asked: Instant,
        generations: Vec<(&'static str, u32)>,
    ) -> usize {
        self.records.push(ChangeRecord {
            applied_at: Some(Instant::now()),
            on_proxies: !generations.is_empty(),
            generations,
            ..ChangeRecord::asked(what, asked)
        });
        self.records.len() - 1
    }

    pub(super) fn record(
        &mut self,
        what: String,
        removed: Vec<String>,
        expect: Option<Expect>,
        asked: Instant,
    ) -> usize {
        // Requested when the tool sent it (the call then succeeded): the control plane
        // can publish the change before the API's answer is back here.
        self.records.push(ChangeRecord {
            removed,
            ..ChangeRecord::asked(what, asked)
        });
        let index = self.records.len() - 1;
        if let Some(expect) = expect {
            self.pending.push((index, expect, asked));
        }
        index
    }

    /// For the oldest route change not yet reported: reads the routes' status (at most
    /// every [`STATUS_EVERY`]) and records when the controller reported the change's
    /// generation. A condition false for it is an error at once (the controller judged
    /// that very generation; waiting would let a later change hide it), as is no report
    /// within [`ROUTE_STATUS_TIMEOUT`].
    pub(super) fn read_route_status(&mut self, now: Instant) -> Result<(), String> {
        let (Some(&index), Routing::Gateway { parent, .. }) =
            (self.reporting.first(), &self.run.objects().routing)
        else {
            return Ok(());
        };
        if now.duration_since(self.status_at) < STATUS_EVERY {
            return Ok(());
        }
        self.status_at = now;
        let what = self.records[index].what.clone();
        match self.route_verdict(parent)? {
            None => {
                self.records[index].reported_at = Some(now);
                self.reporting.remove(0);
            }
            Some((name, gateway::Verdict::Refused(why))) => {
                return Err(format!(
                    "HTTPRoute {}/{name} refused the change `{what}`: {why}",
                    self.run.name()
                ));
            }
            Some((name, why)) => {
                let asked = self.records[index].requested_at;
                if now.duration_since(asked) >= ROUTE_STATUS_TIMEOUT {
                    return Err(format!(
                        "HTTPRoute {}/{name}: the controller did not report the change `{what}` within {} s ({why:?})",
                        self.run.name(),
                        ROUTE_STATUS_TIMEOUT.as_secs()
                    ));
                }
            }
        }
        Ok(())
    }
}
