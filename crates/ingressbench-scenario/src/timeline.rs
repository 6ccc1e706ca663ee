//! A cell's events in time, and what runs beside its load: [`Timeline`] says when each
//! event fires (at a time, or in lock-step before a request), [`Driver`] fires them into
//! the site, watches the site's parts and writes events.jsonl as changes apply. Used by
//! the cell and by the sites (the cluster asks whether changes are delayed, and which
//! routes the events bring); it imports neither the runner nor a site's implementation.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_lab::model::Overlay;
use ingressbench_lab::Change;
use ingressbench_load::{thread_cpu, Plan, RequestGate};
use ingressbench_results::events::{Applied, Due, EventLine, Failed, Generation, Requested};

use crate::load::{dur, scaled, LoadThread};
use crate::model::{Action, Timing};
use crate::propagation::{RouteProbe, Sequence};
use crate::site::Site;
use crate::usage::UsageLog;
use crate::Cell;

/// How often the runner checks that the lab's parts are still running.
const ALIVE_CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// A cell's events in time: timed firings (offset from the start of measurement, event,
/// propagation delay), in order, and lock-step ones (first request, every, times, event,
/// delay).
pub(crate) struct Timeline {
    firings: Vec<(Duration, usize, Duration)>,
    next: usize,
    lockstep: Vec<(u64, u64, u32, usize, Duration)>,
}

impl Timeline {
    /// Whether any change is held back by a propagation delay (the lab's stand-in for a
    /// slow controller).
    #[cfg(feature = "cluster")]
    pub(crate) fn delays_changes(&self) -> bool {
        self.firings.iter().any(|(_, _, delay)| !delay.is_zero())
            || self.lockstep.iter().any(|l| !l.4.is_zero())
    }

    pub(crate) fn of(cell: &Cell, factor: f64) -> Result<Self, String> {
        let controller_delay = scaled(
            dur(
                "controller.propagation_delay",
                &cell.scenario.controller.propagation_delay,
            )?
            .unwrap_or_default(),
            factor,
        );
        let mut firings = Vec::new();
        let mut lockstep = Vec::new();
        for (i, e) in cell.events.iter().enumerate() {
            let delay = e
                .propagation_delay
                .map_or(controller_delay, |d| scaled(d, factor));
            match &e.timing {
                Timing::At(at) => firings.push((scaled(*at, factor), i, delay)),
                Timing::Every {
                    first,
                    every,
                    times,
                } => {
                    for k in 0..*times {
                        firings.push((scaled(*first + *every * k, factor), i, delay));
                    }
                }
                Timing::BeforeRequest {
                    first,
                    every,
                    times,
                } => lockstep.push((*first, *every, *times, i, delay)),
            }
        }
        firings.sort_by_key(|f| f.0);
        Ok(Self {
            firings,
            next: 0,
            lockstep,
        })
    }

    /// With lock-step events, a gate on the plan: the load asks before each request (its
    /// sequence number) and waits for the answer.
    pub(crate) fn gate(&self, plan: &mut Plan) -> Option<Gate> {
        if self.lockstep.is_empty() {
            return None;
        }
        let (request_tx, request_rx) = std::sync::mpsc::channel::<u64>();
        let (ack_tx, ack_rx) = std::sync::mpsc::channel::<()>();
        let ack_rx = std::sync::Mutex::new(ack_rx);
        plan.gate = Some(RequestGate(Arc::new(move |seq| {
            if request_tx.send(seq).is_ok() {
                if let Ok(ack) = ack_rx.lock() {
                    let _ = ack.recv();
                }
            }
        })));
        Some(Gate {
            requests: request_rx,
            ack: ack_tx,
            warmup_requests: 0,
        })
    }

    /// The timed firings due by `now`.
    fn due(&mut self, now: Instant, measure_from: Instant) -> Vec<(Duration, usize, Duration)> {
        let mut due = Vec::new();
        while self.next < self.firings.len() && measure_from + self.firings[self.next].0 <= now {
            due.push(self.firings[self.next]);
            self.next += 1;
        }
        due
    }

    /// The lock-step events to fire before measured request `number` (from 1).
    fn before_request(&self, number: u64) -> Vec<(usize, Duration)> {
        self.lockstep
            .iter()
            .filter(|&&(first, every, times, _, _)| {
                number
                    .checked_sub(first)
                    .filter(|d| d % every == 0)
                    .map(|d| d / every)
                    .is_some_and(|k| k < u64::from(times))
            })
            .map(|&(_, _, _, index, delay)| (index, delay))
            .collect()
    }
}

/// The runner's side of lock-step events: the load's requests, and the answer it waits
/// for.
pub(crate) struct Gate {
    pub(crate) requests: std::sync::mpsc::Receiver<u64>,
    pub(crate) ack: std::sync::mpsc::Sender<()>,
    /// Requests before these are warm-up and fire nothing.
    pub(crate) warmup_requests: u64,
}

/// What runs beside the load: the site's liveness, its changes and the events.
pub(crate) struct Driver<'a> {
    pub(crate) cell: &'a Cell,
    pub(crate) site: &'a mut dyn Site,
    pub(crate) measure_from: Instant,
    pub(crate) events: std::fs::File,
    pub(crate) usage: Option<UsageLog>,
    /// What the proxies themselves counted (`proxy-metrics.jsonl`).
    pub(crate) counts: Option<crate::proxy_counts::ProxyCounts>,
    /// How many times each event fired.
    pub(crate) fired: Vec<u32>,
    /// Records already written to `events.jsonl` as applied.
    pub(crate) reported: usize,
    /// Why the cell must fail (a part of the site exited, an event could not be applied):
    /// the load stops, what was measured is kept, and the cell is not done.
    pub(crate) went_wrong: Option<String>,
    pub(crate) stop: Arc<AtomicBool>,
    /// Probes the routes that events add or remove.
    pub(crate) probe: Option<RouteProbe>,
    /// The event going a step at a time, if one is.
    pub(crate) sequence: Option<Sequence>,
    /// Route events due while a sequence went on: fired in turn once it is done.
    pub(crate) held: VecDeque<(usize, Duration, Due)>,
    /// The live metrics, told of each event as it fires.
    pub(crate) metrics: Option<Arc<crate::live::Live>>,
}

impl Driver<'_> {
    /// Until the load ends: stops it on Ctrl-C or a dead part, fires events when due, and
    /// writes each change as it is applied.
    pub(crate) fn drive(
        &mut self,
        load: &LoadThread,
        timeline: &mut Timeline,
        mut gate: Option<Gate>,
        run_stop: &AtomicBool,
    ) {
        if let Some(g) = gate.as_mut() {
            g.warmup_requests = self.cell.scenario.load.warmup_requests.unwrap_or(0);
        }
        let mut checked_at = Instant::now();
        while !load.is_finished() {
            let now = Instant::now();
            if run_stop.load(Ordering::Relaxed) {
                self.stop.store(true, Ordering::Relaxed);
            }
            // A proxy (or front, sidecar, backend) that dies is not the system under test
            // any more: stop, keep what was measured, and fail the cell.
            if self.went_wrong.is_none() && now.duration_since(checked_at) >= ALIVE_CHECK_INTERVAL {
                checked_at = now;
                if let Err(e) = self.site.check_alive() {
                    self.fail(format!(
                        "{:.3} s into the cell: {e}",
                        crate::usage::signed_offset(now, self.measure_from)
                    ));
                }
            }
            let site = &self.site;
            if self
                .usage
                .as_mut()
                .is_some_and(|u| u.poll(now, || site.usage_parts()).is_err())
            {
                self.usage = None;
            }
            // Like the usage log, a side figure: a file that cannot be written ends it.
            if (self.counts.as_mut()).is_some_and(|c| c.poll(now, &mut *self.site).is_err()) {
                self.counts = None;
            }
            for (due, index, delay) in timeline.due(now, self.measure_from) {
                let due = Due {
                    due_s: Some(due.as_secs_f64()),
                    ..Due::default()
                };
                self.fire(index, delay, due);
            }
            if let Some(g) = &gate {
                while let Ok(seq) = g.requests.try_recv() {
                    // Measured requests count from 1; warm-up requests fire nothing.
                    if let Some(number) = seq.checked_sub(g.warmup_requests).map(|n| n + 1) {
                        for (index, delay) in timeline.before_request(number) {
                            let due = Due {
                                due_request: Some(number),
                                ..Due::default()
                            };
                            self.fire(index, delay, due);
                        }
                    }
                    let _ = g.ack.send(());
                }
            }
            self.next_step();
            if let Err(e) = self.site.tick() {
                // A change the proxies were told and did not take.
                self.fail(format!(
                    "{:.3} s into the cell, a change could not be applied: {e}",
                    crate::usage::signed_offset(Instant::now(), self.measure_from)
                ));
            }
            self.write_applied();
            let busy = gate.is_some() || self.sequence.is_some() || !self.held.is_empty();
            std::thread::sleep(Duration::from_millis(if busy { 1 } else { 5 }));
        }
    }

    /// Stops the load and fails the cell (the first reason is kept).
    fn fail(&mut self, why: String) {
        self.went_wrong.get_or_insert(why);
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Fires event `index`: asks the site for its change. An event that goes a step at a
    /// time (`one_at_a_time`, `route_steps`) asks for its first step now and the rest as
    /// [`Driver::next_step`] finds each right.
    fn fire(&mut self, index: usize, delay: Duration, due: Due) {
        let routes = self.cell.events[index].action.is_route_event();
        if routes && (self.sequence.is_some() || !self.held.is_empty()) {
            // One step at a time means the steps are measured alone: a route event due
            // meanwhile waits for them (and for the route events held before it).
            self.held.push_back((index, delay, due));
            return;
        }
        self.fire_now(index, delay, due);
    }

    /// Fires event `index` now (see [`Driver::fire`]).
    fn fire_now(&mut self, index: usize, delay: Duration, due: Due) {
        let event = &self.cell.events[index];
        self.fired[index] += 1;
        if let Some(metrics) = &self.metrics {
            metrics.event(event.action.kind());
        }
        let what = describe_action(&event.action, event.one_at_a_time);
        let (mut steps, unit, pause): (VecDeque<(Change, String, bool)>, _, _) =
            match (&event.action, change_for(&event.action, self.cell)) {
                (Action::RouteSteps { to, pause }, _) => (
                    to.iter()
                        .map(|n| (Change::GeneratedRoutes(*n), format!("to {n} routes"), false))
                        .collect(),
                    "steps",
                    *pause,
                ),
                (_, change @ (Change::AddRoutes(n) | Change::RemoveRoutes(n)))
                    if event.one_at_a_time =>
                {
                    let one = if matches!(change, Change::AddRoutes(_)) {
                        Change::AddRoutes(1)
                    } else {
                        Change::RemoveRoutes(1)
                    };
                    // The first route is a new firing; the rest go on it.
                    let steps = (0..n).map(|k| (one.clone(), what.clone(), k > 0)).collect();
                    (steps, "routes", Duration::ZERO)
                }
                (_, change) => {
                    self.ask(index, change, delay, due, (&what, false));
                    return;
                }
            };
        let planned = steps.len();
        let Some((first, first_what, _)) = steps.pop_front() else {
            return;
        };
        self.ask(index, first, delay, due, (&first_what, false));
        if event.one_at_a_time {
            if let Some(probe) = self.probe.as_mut() {
                probe.one_at_a_time(planned);
            }
        }
        self.sequence = Some(Sequence {
            event: index,
            delay,
            steps,
            planned,
            unit,
            pause,
            settled_at: None,
        });
    }

    /// Asks for the next step of the event going a step at a time, once the probe has
    /// settled the last (without a probe, at once) and its pause has passed; with none
    /// going, fires the next route event held for one.
    fn next_step(&mut self) {
        let settled = self.probe.as_ref().is_none_or(RouteProbe::all_settled);
        let Some(seq) = self.sequence.as_mut() else {
            // Route events held for a sequence go once its last routes are right.
            if settled {
                if let Some((index, delay, due)) = self.held.pop_front() {
                    self.fire_now(index, delay, due);
                }
            }
            return;
        };
        if !settled {
            seq.settled_at = None;
            return;
        }
        if seq.steps.is_empty() {
            self.sequence = None;
            return;
        }
        let now = Instant::now();
        let settled_at = *seq.settled_at.get_or_insert(now);
        if now < settled_at + seq.pause {
            return;
        }
        seq.settled_at = None;
        let Some((step, what, continuing)) = seq.steps.pop_front() else {
            return;
        };
        let (event, delay) = (seq.event, seq.delay);
        let number = seq.planned - seq.steps.len();
        let due = Due {
            step: Some(number as u64),
            ..Due::default()
        };
        self.ask(event, step, delay, due, (&what, continuing));
    }

    /// What is left undone of an event going a step at a time when the load ended.
    pub(crate) fn unfinished(&self) -> Option<String> {
        let seq = self.sequence.as_ref().filter(|s| !s.steps.is_empty())?;
        let held = match self.held.len() {
            0 => String::new(),
            n => format!(", and {n} route event(s) held behind it did not fire"),
        };
        Some(format!(
            "events[{}] asked for {} of its {} {} before the load ended{held}; each step waits for the last to be right: the system under test did not keep up, or make load.duration longer, the event earlier, or ask for fewer",
            seq.event,
            seq.planned - seq.steps.len(),
            seq.planned,
            seq.unit
        ))
    }

    /// Asks the site for `change` on behalf of event `index` (the probe starting on the
    /// routes it makes, as `what`, a new firing unless `continuing`) and writes it to
    /// `events.jsonl`.
    fn ask(
        &mut self,
        index: usize,
        change: Change,
        delay: Duration,
        due: Due,
        (what, continuing): (&str, bool),
    ) {
        let cpu = thread_cpu();
        let mut probed = None;
        if let Some(probe) = self.probe.as_mut() {
            if let Some(delta) = self.site.route_delta(&change) {
                probe.probe(index, what, delta, continuing);
                probed = Some(probe);
            }
        }
        let measure_from = self.measure_from;
        let requested = self.site.request(change, delay);
        // The tool's own part of a route change: working out its routes, rendering and
        // writing each proxy's configuration, the calls it makes (not their waits).
        if let Some(probe) = probed {
            probe.spent(
                thread_cpu().saturating_sub(cpu),
                self.site.route_count(),
                self.site.config_bytes(),
            );
        }
        let (line, failed) = match requested {
            Ok(r) => {
                let rec = &self.site.records()[r];
                let line = EventLine::Requested(Requested {
                    event: index,
                    kind: Some(self.cell.events[index].action.kind().to_owned()),
                    what: rec.what.clone(),
                    requested_s: offset(rec.requested_at, measure_from),
                    propagation_delay_s: delay.as_secs_f64(),
                    started: rec.started.clone(),
                    removed: rec.removed.clone(),
                    generations: (rec.generations.iter())
                        .map(|(header, generation)| Generation {
                            header: (*header).to_owned(),
                            generation: *generation,
                        })
                        .collect(),
                    due,
                });
                (line, None)
            }
            Err(e) => {
                let why = format!(
                    "events[{index}] could not be applied {:.3} s into the cell: {e}",
                    crate::usage::signed_offset(Instant::now(), measure_from)
                );
                let line = EventLine::Failed(Failed {
                    event: index,
                    error: e,
                    due,
                });
                (line, Some(why))
            }
        };
        self.write_line(&line);
        if let Some(why) = failed {
            self.sequence = None;
            self.fail(why);
        }
    }

    /// Writes each change the site applied since the last call to `events.jsonl`.
    fn write_applied(&mut self) {
        let records = self.site.records();
        let mut lines = Vec::new();
        for rec in &records[self.reported..] {
            let Some(applied) = rec.applied_at else { break };
            let at = |t: Option<Instant>| t.map(|t| offset(t, self.measure_from));
            lines.push(EventLine::Applied(Applied {
                what: rec.what.clone(),
                applied_s: offset(applied, self.measure_from),
                mechanisms: named(&rec.mechanisms),
                endpoints_s: at(rec.endpoints_at),
                // In a cluster, known once the API answered (the pod an event picked).
                started: rec.started.clone(),
                removed: rec.removed.clone(),
                completed_s: at(rec.completed_at),
                versions_after: named(&rec.versions),
            }));
        }
        for line in &lines {
            self.write_line(line);
            self.reported += 1;
        }
    }

    /// Appends `line` to `events.jsonl` (a side record: a line that cannot be written is
    /// left out, the cell goes on).
    fn write_line(&mut self, line: &EventLine) {
        let text = serde_json::to_string(line).unwrap_or_default();
        let _ = writeln!(self.events, "{text}").and_then(|()| self.events.flush());
    }
}

/// `nginx: reload` for each (proxy, what) pair.
fn named<T: std::fmt::Display>(pairs: &[(ingressbench_lab::proxy::ProxyKind, T)]) -> Vec<String> {
    pairs.iter().map(|(k, m)| format!("{k}: {m}")).collect()
}

pub(crate) fn offset(t: Instant, measure_from: Instant) -> f64 {
    t.saturating_duration_since(measure_from).as_secs_f64()
}

/// Says which event fired fewer times than planned (the run ended first), if one did.
pub(crate) fn unfired(
    cell: &Cell,
    fired: &[u32],
    requests: u64,
    held_behind_unfinished: bool,
) -> Option<String> {
    cell.events.iter().zip(fired).enumerate().find_map(|(i, (e, n))| {
        // Route events held behind steps the load ended first are in that warning.
        if held_behind_unfinished && e.action.is_route_event() {
            return None;
        }
        let planned = e.timing.times();
        (*n < planned).then(|| {
            format!(
                "events[{i}] fired {n} of {planned} times: the load ended first ({requests} requests); make load.duration (or load.requests) longer, or the event earlier"
            )
        })
    })
}

/// The route changes a cell's events ask for, in order (a revert as the routes it
/// restores).
pub(crate) fn route_changes(cell: &Cell) -> Vec<Overlay> {
    cell.events
        .iter()
        .filter_map(|e| match change_for(&e.action, cell) {
            Change::Overlay(o) => Some(o),
            _ => None,
        })
        .collect()
}

/// An event's action in words, for the route probe's record (`add 100 routes one at a
/// time`).
fn describe_action(action: &Action, one_at_a_time: bool) -> String {
    let (verb, n) = match action.change() {
        Some(Change::AddRoutes(n)) => ("add", *n),
        Some(Change::RemoveRoutes(n)) => ("remove", *n),
        Some(Change::ChangeRoutes(n)) => ("change", *n),
        _ => return String::new(),
    };
    let s = if n == 1 { "" } else { "s" };
    let how = if one_at_a_time { " one at a time" } else { "" };
    format!("{verb} {n} route{s}{how}")
}

/// The change an action asks for of `cell`: as it is, unless it needs the cell (its
/// first pool, its own overlay, its target's kind, a route step's first count).
fn change_for(action: &Action, cell: &Cell) -> Change {
    let s = &cell.scenario;
    match action {
        Action::Change(change) => change.clone(),
        Action::Scale(n) => Change::Scale {
            pool: (s.backends.first()).map_or_else(|| "echo".to_owned(), |p| p.name.clone()),
            replicas: *n,
        },
        Action::Revert => Change::Overlay(s.overlay.to_overlay()),
        Action::Upgrade { grace, to } => Change::Upgrade {
            grace: *grace,
            to: match &cell.target {
                crate::model::Target::Proxy { kind, .. } => {
                    to.for_kind(*kind).into_iter().collect()
                }
                _ => std::collections::BTreeMap::new(),
            },
        },
        Action::RouteSteps { to, .. } => Change::GeneratedRoutes(to.first().copied().unwrap_or(0)),
    }
}
