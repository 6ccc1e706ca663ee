//! The driver: until the load ends, it fires each event when due into the site (at a
//! time, or before a request in lock-step), asks for the steps of an event that goes a
//! step at a time, moves the site's changes on, and looks at its watchers
//! ([`super::watch`]) once a turn.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_lab::Change;
use ingressbench_load::thread_cpu;
use ingressbench_results::events::{Due, EventLine, Failed, Generation, Requested};

use super::watch::{EventsLog, Liveness, SideFigures};
use super::{change_for, describe_action, offset, Gate, Timeline};
use crate::load::LoadThread;
use crate::model::Action;
use crate::propagation::{RouteProbe, Sequence};
use crate::site::Site;
use crate::Cell;

/// How long after the load a cell still waits for what the control plane will show of
/// its last events (a kill's EndpointSlice change): a lock-step cell ends at its last
/// request, which may follow its last kill by a millisecond.
const CONTROL_PLANE_GRACE: Duration = Duration::from_secs(5);

/// What runs beside the load: the events, and the watchers.
pub(crate) struct Driver<'a> {
    pub(crate) cell: &'a Cell,
    pub(crate) site: &'a mut dyn Site,
    pub(crate) measure_from: Instant,
    /// events.jsonl.
    pub(crate) events: EventsLog,
    /// usage.jsonl and proxy-metrics.jsonl.
    pub(crate) figures: SideFigures,
    /// Whether the site's parts still run.
    pub(crate) liveness: Liveness,
    /// How many times each event fired.
    pub(crate) fired: Vec<u32>,
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
    pub(crate) metrics: Option<Arc<ingressbench_load::live::Live>>,
    /// Moves the load's QUIC connections to a new local port (a `migrate` event).
    pub(crate) migrate: ingressbench_load::Migrate,
    /// A soak's samples' filter and soak.jsonl.
    pub(crate) soak: Option<crate::soak::SoakRun>,
}

impl Driver<'_> {
    /// Until the load ends: stops it on Ctrl-C or a dead part, fires events when due, and
    /// looks at the watchers.
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
        while !load.is_finished() {
            let now = Instant::now();
            if run_stop.load(Ordering::Relaxed) {
                self.stop.store(true, Ordering::Relaxed);
            }
            if self.went_wrong.is_none() {
                if let Err(why) = self.liveness.watch(now, &mut *self.site) {
                    self.fail(why);
                }
            }
            self.figures.watch(now, &mut *self.site);
            let firings: u64 = self.fired.iter().map(|&n| u64::from(n)).sum();
            if let Some(soak) = self.soak.as_mut() {
                soak.watch(now, firings);
            }
            for (due, index, delay) in timeline.due(now, self.measure_from) {
                let due = Due {
                    due_s: Some(due.as_secs_f64()),
                    ..Due::default()
                };
                self.fire(index, delay, due);
            }
            if let Some(g) = &gate {
                self.lockstep(g, timeline);
            }
            self.next_step();
            if let Err(e) = self.site.tick() {
                // A change the proxies were told and did not take.
                self.fail(format!(
                    "{:.3} s into the cell, a change could not be applied: {e}",
                    crate::usage::signed_offset(Instant::now(), self.measure_from)
                ));
            }
            self.events.watch(self.site.records());
            let busy = gate.is_some() || self.sequence.is_some() || !self.held.is_empty();
            std::thread::sleep(Duration::from_millis(if busy { 1 } else { 5 }));
        }
        let firings: u64 = self.fired.iter().map(|&n| u64::from(n)).sum();
        if let Some(soak) = self.soak.as_mut() {
            soak.finish(firings);
        }
        let until = Instant::now() + CONTROL_PLANE_GRACE;
        while self.site.awaiting_control_plane()
            && Instant::now() < until
            && !run_stop.load(Ordering::Relaxed)
        {
            if self.site.tick().is_err() {
                break;
            }
            self.events.watch(self.site.records());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The lock-step gate: fires the events due before each request the load asks about,
    /// then lets the request go.
    fn lockstep(&mut self, gate: &Gate, timeline: &Timeline) {
        while let Ok(seq) = gate.requests.try_recv() {
            // Measured requests count from 1; warm-up requests fire nothing.
            if let Some(number) = seq.checked_sub(gate.warmup_requests).map(|n| n + 1) {
                for (index, delay) in timeline.before_request(number) {
                    let due = Due {
                        due_request: Some(number),
                        ..Due::default()
                    };
                    self.fire(index, delay, due);
                }
            }
            let _ = gate.ack.send(());
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
        if let Some(soak) = &self.soak {
            soak.fired(Instant::now());
        }
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

    /// What is left undone of an event going a step at a time, or of the route events
    /// held behind it, when the load ended.
    pub(crate) fn unfinished(&self) -> Option<String> {
        const FIX: &str = "each step waits for the last to be right: the system under test did not keep up, or make load.duration longer, the event earlier, or ask for fewer";
        let held = self.held.len();
        match self.sequence.as_ref() {
            Some(seq) if !seq.steps.is_empty() => {
                let held = match held {
                    0 => String::new(),
                    n => format!(", and {n} route event(s) held behind it did not fire"),
                };
                Some(format!(
                    "events[{}] asked for {} of its {} {} before the load ended{held}; {FIX}",
                    seq.event,
                    seq.planned - seq.steps.len(),
                    seq.planned,
                    seq.unit
                ))
            }
            // Every step asked, the last not yet right: what waits for it did not fire.
            _ if held > 0 => Some(format!(
                "{held} route event(s) (events[{}]) waited for the routes asked before them to be right and did not fire before the load ended; {FIX}",
                self.held
                    .iter()
                    .map(|(i, ..)| i.to_string())
                    .collect::<Vec<_>>()
                    .join("], events[")
            )),
            _ => None,
        }
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
        // A change to the client: the load takes it, the site records it.
        if change == Change::Migrate {
            self.migrate.ask();
        }
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
        self.events.write(&line);
        if let Some(why) = failed {
            self.sequence = None;
            self.fail(why);
        }
    }
}
