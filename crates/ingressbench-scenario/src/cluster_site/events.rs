//! A cell's events made through the cluster's API as a person or a pipeline would make
//! them, and their times: requested, seen in the EndpointSlices (the control plane's
//! part), reported in an HTTPRoute's status (the controller's). The calls themselves go
//! out as errands (see [`super::errands`]): an event is recorded when it is asked, and
//! what the API answered fills its record in when the driver next ticks.

use std::time::{Duration, Instant};

use ingressbench_cluster::deploy::{EndpointsWatch, PodState, RunNamespace};
use ingressbench_cluster::routes::{self, gateway, Routing};
use ingressbench_lab::model::{Overlay, GENERATION_HEADER};
use ingressbench_lab::{Change, ChangeRecord};

use ingressbench_cluster::file::Restart;

use super::errands::{Answer, Back, Errand, Lane};
use super::{ClusterSite, Expect, HEARTBEAT_EVERY, ROUTE_STATUS_TIMEOUT, STATUS_EVERY};

/// How long a controller's rollout restart may take to complete.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(300);

/// A controller's restart under way.
pub(super) enum Restarting {
    /// Its workloads' rollouts (a restart's one, an upgrade's each).
    Rollout(Vec<ingressbench_cluster::deploy::Rollout>),
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
    /// Asks for `change` through the API (a scale, a kill, a route change, …) and records
    /// it, requested now; its index among the records. Its calls go out as an errand.
    pub(super) fn apply(&mut self, change: Change) -> Result<usize, String> {
        match change {
            Change::Scale { pool, replicas } => Ok(self.scale(&pool, replicas)),
            Change::Kill(name) => Ok(self.delete_pod(name, true)),
            Change::Terminate(name) => Ok(self.delete_pod(name, false)),
            Change::Overlay(overlay) => self.change_routes(overlay, None),
            Change::Stall { backend, duration } => Ok(self.stall(backend, duration)),
            // The client's own change (the load rebinds its sockets): done when asked.
            Change::Migrate => {
                let index = self.record("migrate the client's QUIC connections".into(), None);
                let record = &mut self.records[index];
                record.applied_at = Some(record.requested_at);
                Ok(index)
            }
            Change::AddRoutes(_)
            | Change::RemoveRoutes(_)
            | Change::GeneratedRoutes(_)
            | Change::ChangeRoutes(_) => self.change_generated(&change),
            Change::Routes(_) => Err(
                "replacing the scenario's own routes is not made through the API: generated routes are (add_routes, remove_routes, change_routes, route_steps)"
                    .into(),
            ),
            Change::Restart { grace } => self.restart_controller(grace, ""),
            Change::Upgrade {
                controller: Some(version),
                ..
            } => self.upgrade_controller(version),
            // To the version it runs (`same`, or versions of lab proxies only): what rolling
            // a controller's pods to the image they run is, a restart.
            Change::Upgrade {
                controller: None,
                grace,
                ..
            } => self.restart_controller(grace, "upgrade to the version it runs, a "),
            // What a user's no-op edit of a route makes: the controller takes the route
            // again and pushes its configuration, as a proxy's reload does.
            Change::Reload => self.change_routes(
                self.overlay.clone(),
                Some("reload: the routes applied again, only their generation changed"),
            ),
        }
    }

    /// Scales the pool's Deployment; done when the EndpointSlices show that many ready.
    fn scale(&mut self, pool: &str, replicas: usize) -> usize {
        let index = self.record(
            format!("scale {pool} to {replicas}"),
            Some(Expect::Ready(replicas)),
        );
        let pool = pool.to_owned();
        self.errands.event(
            index,
            Some(Lane::Pods),
            Box::new(move |run| {
                let before: Vec<String> = live_pods(run)?.into_iter().map(|p| p.name).collect();
                let count = i32::try_from(replicas).map_err(|e| e.to_string())?;
                run.scale(count).map_err(|e| e.to_string())?;
                Ok(Answer::Scaled {
                    what: format!("scale {pool} {}->{replicas}", before.len()),
                    before,
                })
            }),
        );
        index
    }

    /// Deletes a pod (`name`, or one at random): at once (`kill`, a crash) or with its
    /// grace period (a drain); done when its address leaves the ready endpoints.
    fn delete_pod(&mut self, name: Option<String>, kill: bool) -> usize {
        let verb = if kill { "kill" } else { "terminate" };
        let index = self.record(
            format!("{verb} {}", name.as_deref().unwrap_or("a pod at random")),
            None,
        );
        self.errands.event(
            index,
            Some(Lane::Pods),
            Box::new(move |run| {
                let pod = pick(run, name.as_deref())?;
                run.delete_pod(&pod.name, kill.then_some(0))
                    .map_err(|e| e.to_string())?;
                Ok(Answer::Picked {
                    what: format!("{verb} {}", pod.name),
                    expect: Some(match pod.ip {
                        Some(ip) => Expect::Gone(ip),
                        None => Expect::Ready(0),
                    }),
                    pod: pod.name,
                })
            }),
        );
        index
    }

    /// Applies the routes of the next generation with `overlay` (said as `what`, or as
    /// the overlay's change). Applied when the API stored it; the traffic shows when the
    /// proxies had it, and an HTTPRoute's status when its controller says it did.
    fn change_routes(&mut self, overlay: Overlay, what: Option<&str>) -> Result<usize, String> {
        let generation = self
            .generation
            .ok_or("the cell was made without route changes")?
            + 1;
        let objects = routes::render(self.run.objects(), Some(generation), &overlay);
        self.generation = Some(generation);
        let index = self.record(what.map_or_else(|| overlay.describe(), str::to_owned), None);
        self.overlay = overlay;
        let record = &mut self.records[index];
        // Where the routes carry it in an annotation only (a GRPCRoute through Traefik),
        // neither the answers nor the route's status (whose generation an annotation
        // does not raise) can say when it was taken.
        if gateway::generation_answered(self.run.objects()) {
            record.generations = vec![(GENERATION_HEADER, generation)];
        }
        record.on_proxies = true;
        self.errands.event(
            index,
            Some(Lane::Routes),
            Box::new(move |run| {
                run.apply(&objects).map_err(|e| e.to_string())?;
                Ok(Answer::Stored)
            }),
        );
        Ok(index)
    }

    /// Stops a backend pod (`backend`, or one at random) answering for `duration`;
    /// applied when the backend said so (through the API server's proxy).
    fn stall(&mut self, backend: Option<String>, duration: Duration) -> usize {
        let index = self.record(
            format!(
                "stall {} for {duration:?}",
                backend.as_deref().unwrap_or("a pod at random")
            ),
            None,
        );
        self.errands.event(
            index,
            None,
            Box::new(move |run| {
                let pod = pick(run, backend.as_deref())?;
                run.stall_pod(&pod.name, duration)
                    .map_err(|e| e.to_string())?;
                Ok(Answer::Picked {
                    what: format!("stall {} for {duration:?}", pod.name),
                    pod: pod.name,
                    expect: None,
                })
            }),
        );
        index
    }

    /// Restarts the target's controller as the cluster file says: a rollout restart of
    /// its workload (the pods' own termination grace applies), or the local cluster's
    /// process stopped (`grace` to exit) and started again. Applied when the first new
    /// pod (process) is ready, complete when the rollout is. Its record says `as_` before
    /// what it did.
    fn restart_controller(&mut self, grace: Duration, as_: &str) -> Result<usize, String> {
        let restart = self.restart.clone().ok_or(
            "the cluster file does not say how to restart the target's controller: give it `restart: { deployment: NAME, namespace: NS }`",
        )?;
        let index = match restart {
            Restart::Rollout {
                kind,
                namespace,
                name,
            } => {
                let index = self.record(
                    format!("{as_}restart: rollout of {kind} {namespace}/{name}"),
                    None,
                );
                let as_ = as_.to_owned();
                self.errands.event(
                    index,
                    None,
                    Box::new(move |run| {
                        let rollout = run
                            .rollout_restart(kind, &namespace, &name)
                            .map_err(|e| e.to_string())?;
                        Ok(Answer::RolledOut {
                            what: format!(
                                "{as_}restart: rollout of {kind} {namespace}/{name} ({} pods)",
                                rollout.before.len()
                            ),
                            rollouts: vec![rollout],
                        })
                    }),
                );
                index
            }
            Restart::Local { dir, process } => {
                // A request written to a file: nothing to wait for.
                let asked = Instant::now();
                let request = ingressbench_cluster::local::request_restart(&dir, &process, grace)
                    .map_err(|e| e.to_string())?;
                self.records.push(ChangeRecord::asked(
                    format!("{as_}restart: {process} process"),
                    asked,
                ));
                let index = self.records.len() - 1;
                self.restarting.push((index, Restarting::Local(request)));
                index
            }
        };
        // Not an EndpointSlice's change: followed on its own. A change to the proxies.
        self.records[index].on_proxies = true;
        Ok(index)
    }

    /// Upgrades the target's controller to `version` as the cluster file says (`helm
    /// upgrade`, or its image changed). Applied when the first workload it rolls has a
    /// new pod ready, complete when every one of them has rolled.
    fn upgrade_controller(&mut self, version: String) -> Result<usize, String> {
        let upgrade = self.upgrade.clone().ok_or(
            "the cluster file does not say how to upgrade the target's controller: give it `upgrade: { helm: { release, namespace, chart } , follow: [...] }`",
        )?;
        let what = upgrade.by.describe(&version);
        let index = self.record(what.clone(), None);
        self.errands.event(
            index,
            None,
            Box::new(move |run| {
                let rollouts = run.upgrade(&upgrade, &version).map_err(|e| e.to_string())?;
                Ok(Answer::RolledOut {
                    what: format!(
                        "{what} ({})",
                        rollouts
                            .iter()
                            .map(|r| format!("{} {}: {} pods", r.kind, r.name, r.before.len()))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    rollouts,
                })
            }),
        );
        // A change to the proxies, followed on its own.
        self.records[index].on_proxies = true;
        Ok(index)
    }

    /// Takes what each errand brought back into the records.
    fn take_answers(&mut self) -> Result<(), String> {
        for Back { errand, answer, at } in self.errands.back() {
            let index = match errand {
                Errand::Event(i) | Errand::Follow(i) => i,
                Errand::Heartbeat => {
                    answer?;
                    continue;
                }
            };
            let answer = answer.map_err(|e| format!("`{}`: {e}", self.records[index].what))?;
            let record = &mut self.records[index];
            match (errand, answer) {
                (Errand::Event(_), Answer::Scaled { what, before }) => {
                    record.what = what;
                    self.before.push((index, before, None));
                }
                (Errand::Event(_), Answer::Picked { what, pod, expect }) => {
                    record.what = what;
                    record.removed = vec![pod];
                    match expect {
                        // A pod the endpoints did not hold when it was asked (not yet
                        // ready, or not yet published): nothing for them to show.
                        Some(Expect::Gone(ip))
                            if !held(&self.endpoints, &ip, record.requested_at) =>
                        {
                            record.what.push_str(" (not a ready endpoint)");
                            record.endpoints_at = Some(record.requested_at);
                            record.applied_at = Some(record.requested_at);
                        }
                        Some(expect) => self.pending.push((index, expect)),
                        None => record.applied_at = Some(at),
                    }
                }
                (Errand::Event(_), Answer::Stored) => {
                    record.applied_at = Some(at);
                    if matches!(self.run.objects().routing, Routing::Gateway { .. })
                        && !record.generations.is_empty()
                    {
                        self.reporting.push(index);
                    }
                }
                (Errand::Event(_), Answer::RolledOut { what, rollouts }) => {
                    record.what = what;
                    self.restarting.push((index, Restarting::Rollout(rollouts)));
                }
                (Errand::Follow(_), Answer::Rollout(states)) => {
                    self.rollout_read(index, &states, at)?
                }
                (Errand::Follow(_), Answer::Verdict(verdict)) => {
                    self.status_read(index, verdict, at)?
                }
                (Errand::Follow(_), Answer::Pods(pods)) => self.pods_after_scale(index, &pods),
                _ => {}
            }
        }
        Ok(())
    }

    /// What a read of the rollouts' states says: applied when the first's first new pod
    /// is ready, complete when every rollout is.
    fn rollout_read(
        &mut self,
        index: usize,
        states: &[ingressbench_cluster::deploy::RolloutState],
        at: Instant,
    ) -> Result<(), String> {
        let Some(k) = self.restarting.iter().position(|(i, _)| *i == index) else {
            return Ok(());
        };
        let Restarting::Rollout(rollouts) = &self.restarting[k].1 else {
            return Ok(());
        };
        let record = &mut self.records[index];
        if states.first().is_some_and(|s| !s.new_ready.is_empty()) && record.applied_at.is_none() {
            record.applied_at = Some(at);
        }
        let waiting = rollouts.iter().zip(states).find(|(_, s)| !s.complete);
        match waiting {
            None => {
                record.completed_at = Some(at);
                record.applied_at.get_or_insert(at);
                self.restarting.remove(k);
            }
            Some((rollout, state)) if at.duration_since(record.requested_at) > ROLLOUT_TIMEOUT => {
                return Err(format!(
                    "{} {}/{}: the rollout was not complete within {} s ({} of its {} pods replaced, {} new ready)",
                    rollout.kind,
                    rollout.namespace,
                    rollout.name,
                    ROLLOUT_TIMEOUT.as_secs(),
                    state.old_gone.len(),
                    rollout.before.len(),
                    state.new_ready.len()
                ));
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Follows each restart not yet complete: a rollout's state is read by the
    /// follow-ups' thread (at most every [`STATUS_EVERY`]); the local cluster's process is
    /// ready when its answer file says so (applied and complete), and the usage readings
    /// follow its id from then.
    fn follow_restarts(&mut self, now: Instant) -> Result<(), String> {
        let mut done = Vec::new();
        let read = now.duration_since(self.restart_read_at) >= STATUS_EVERY;
        for (k, (index, restarting)) in self.restarting.iter().enumerate() {
            match restarting {
                Restarting::Rollout(rollouts) => {
                    if read {
                        let rollouts = rollouts.clone();
                        self.errands.follow(
                            Errand::Follow(*index),
                            Box::new(move |run| {
                                rollouts
                                    .iter()
                                    .map(|r| run.rollout_state(r))
                                    .collect::<Result<Vec<_>, _>>()
                                    .map(Answer::Rollout)
                                    .map_err(|e| e.to_string())
                            }),
                        );
                    }
                }
                Restarting::Local(request) => {
                    let Some(restarted) = request.poll().map_err(|e| e.to_string())? else {
                        continue;
                    };
                    let record = &mut self.records[*index];
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
        if read {
            self.restart_read_at = now;
        }
        for k in done.into_iter().rev() {
            self.restarting.remove(k);
        }
        Ok(())
    }

    /// Moves pending changes on: what the API answered, when the EndpointSlices show
    /// them, when the controller reports a route change, restarts, and the namespace's
    /// heartbeat. Every call to the API goes out as an errand.
    pub(super) fn advance(&mut self) -> Result<(), String> {
        let now = Instant::now();
        self.take_answers()?;
        if now.duration_since(self.beat_at) >= HEARTBEAT_EVERY {
            self.beat_at = now;
            self.errands.follow(
                Errand::Heartbeat,
                Box::new(|run| {
                    run.heartbeat()
                        .map(|()| Answer::Done)
                        .map_err(|e| e.to_string())
                }),
            );
        }
        self.read_route_status(now);
        self.follow_restarts(now)?;
        // Each pending change is shown by the first set the watch delivered after it was
        // asked that has it.
        let mut done = Vec::new();
        for (i, (index, expect)) in self.pending.iter().enumerate() {
            // A scale is judged once its calls are back (the pods before it are known);
            // the watch's log keeps every set with its time meanwhile.
            if self.errands.is_out(Errand::Event(*index)) {
                continue;
            }
            let asked = self.records[*index].requested_at;
            let shown = self
                .endpoints
                .since(asked)
                .into_iter()
                .filter(|(at, _)| *at > asked)
                .find(|(_, set)| match expect {
                    Expect::Ready(n) => set.len() == *n,
                    Expect::Gone(ip) => !set.contains(ip),
                });
            if let Some((at, _)) = shown {
                done.push((i, at));
            }
        }
        for (i, at) in done.into_iter().rev() {
            let (index, _) = self.pending.remove(i);
            match self.before.iter_mut().find(|(k, _, _)| *k == index) {
                // A scale: applied once the pods it started and stopped are read.
                Some((_, _, shown)) => {
                    *shown = Some(at);
                    self.errands.follow(
                        Errand::Follow(index),
                        Box::new(|run| run.pods().map(Answer::Pods).map_err(|e| e.to_string())),
                    );
                }
                None => {
                    self.records[index].endpoints_at = Some(at);
                    self.records[index].applied_at = Some(at);
                }
            }
        }
        Ok(())
    }

    /// A scale the EndpointSlices showed, with the pods after it: the new pods it
    /// started, the pods the Deployment chose to stop; applied when the slices showed it.
    fn pods_after_scale(&mut self, index: usize, pods: &[PodState]) {
        let Some(k) = self.before.iter().position(|(i, _, _)| *i == index) else {
            return;
        };
        let (_, before, shown) = self.before.remove(k);
        let live = |name: &String| pods.iter().any(|p| &p.name == name && !p.terminating);
        let record = &mut self.records[index];
        record.started = pods
            .iter()
            .filter(|p| p.ready && !before.contains(&p.name))
            .map(|p| p.name.clone())
            .collect();
        record.removed = before.iter().filter(|n| !live(n)).cloned().collect();
        record.endpoints_at = shown;
        record.applied_at = shown;
    }

    /// Records a change asked now, applied when its errand or the EndpointSlices say
    /// (`expect`: what they will show).
    pub(super) fn record(&mut self, what: String, expect: Option<Expect>) -> usize {
        // Requested when the tool asked for it: the control plane can publish the change
        // before the API's answer is back here.
        self.records.push(ChangeRecord::asked(what, Instant::now()));
        let index = self.records.len() - 1;
        if let Some(expect) = expect {
            self.pending.push((index, expect));
        }
        index
    }

    /// For the oldest route change not yet reported: has the routes' status read (at
    /// most every [`STATUS_EVERY`]) by the follow-ups' thread.
    fn read_route_status(&mut self, now: Instant) {
        let (Some(&index), Routing::Gateway { parent, .. }) =
            (self.reporting.first(), &self.run.objects().routing)
        else {
            return;
        };
        if now.duration_since(self.status_at) < STATUS_EVERY {
            return;
        }
        let parent = parent.clone();
        if self.errands.follow(
            Errand::Follow(index),
            Box::new(move |run| route_verdict(run, &parent).map(Answer::Verdict)),
        ) {
            self.status_at = now;
        }
    }

    /// What a read of the routes' status says of the oldest route change not reported:
    /// reported when every route is ready. A condition false for it is an error at once
    /// (the controller judged that very generation; waiting would let a later change hide
    /// it), as is no report within [`ROUTE_STATUS_TIMEOUT`].
    fn status_read(
        &mut self,
        index: usize,
        verdict: Option<(String, gateway::Verdict)>,
        at: Instant,
    ) -> Result<(), String> {
        if self.reporting.first() != Some(&index) {
            return Ok(());
        }
        let what = &self.records[index].what;
        match verdict {
            None => {
                self.records[index].reported_at = Some(at);
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
                if at.duration_since(asked) >= ROUTE_STATUS_TIMEOUT {
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

/// Whether the ready endpoints in force at `at` held `ip`.
fn held(endpoints: &EndpointsWatch, ip: &str, at: Instant) -> bool {
    endpoints
        .since(at)
        .first()
        .is_some_and(|(_, set)| set.iter().any(|a| a == ip))
}

/// The pool's pods not being deleted, by name.
pub(super) fn live_pods(run: &RunNamespace) -> Result<Vec<PodState>, String> {
    let pods = run.pods().map_err(|e| e.to_string())?;
    Ok(pods.into_iter().filter(|p| !p.terminating).collect())
}

/// The pod an event names: `POOL-N` is the N-th by name of the pods not being deleted,
/// `None` one of them at random, a ready one if any is.
fn pick(run: &RunNamespace, name: Option<&str>) -> Result<PodState, String> {
    let pods = live_pods(run)?;
    if pods.is_empty() {
        return Err("no pod of the pool is running".into());
    }
    let index = match name {
        // A backend that serves, when one does: killing a pod still starting shows
        // nothing of what a crash does to traffic.
        None => {
            let ready: Vec<usize> = (0..pods.len()).filter(|&k| pods[k].ready).collect();
            let from = if ready.is_empty() {
                (0..pods.len()).collect()
            } else {
                ready
            };
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .subsec_nanos() as usize;
            from[nanos % from.len()]
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

/// The first of the cell's HTTPRoutes that is not ready, with what its status says
/// (none: all are).
pub(super) fn route_verdict(
    run: &RunNamespace,
    parent: &ingressbench_cluster::file::GatewayRef,
) -> Result<Option<(String, gateway::Verdict)>, String> {
    for name in gateway::route_names(run.objects()) {
        let route = run
            .get(
                gateway::API_VERSION,
                gateway::route_kind(run.objects()),
                &name,
            )
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        match gateway::verdict(&route, parent) {
            gateway::Verdict::Ready => {}
            other => return Ok(Some((name, other))),
        }
    }
    Ok(None)
}
