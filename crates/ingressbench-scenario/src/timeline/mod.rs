//! A cell's events in time, and what runs beside its load: [`Timeline`] says when each
//! event fires (at a time, or in lock-step before a request), [`Driver`] (`driver.rs`)
//! fires them into the site, and its watchers (`watch.rs`) check the site's parts, read
//! the side figures and write events.jsonl as changes apply. Used by
//! the cell and by the sites (the cluster asks whether changes are delayed, and which
//! routes the events bring); it imports neither the runner nor a site's implementation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_lab::model::Overlay;
use ingressbench_lab::Change;
use ingressbench_load::{Plan, RequestGate};

use crate::load::{dur, scaled};
use crate::model::{Action, Timing};
use crate::Cell;

mod driver;
mod watch;
pub(crate) use driver::Driver;
pub(crate) use watch::{EventsLog, Liveness, SideFigures};

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
        if let Some(soak) = crate::soak::Soak::of(cell, factor)? {
            firings = soak.repeat(&firings);
        }
        firings.sort_by_key(|f| f.0);
        Ok(Self {
            firings,
            next: 0,
            lockstep,
        })
    }

    /// The timed firings (offset from the start of measurement, event, propagation
    /// delay), in order.
    pub(crate) fn firings(&self) -> &[(Duration, usize, Duration)] {
        &self.firings
    }

    /// How many times event `index` is planned to fire: its timed firings (a soak's
    /// repeated), or its lock-step `times`.
    pub(crate) fn planned(&self, index: usize) -> u32 {
        let timed = self.firings.iter().filter(|f| f.1 == index).count() as u32;
        timed
            + (self.lockstep.iter())
                .filter(|l| l.3 == index)
                .map(|l| l.2)
                .sum::<u32>()
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
            controller: match (&cell.target, to) {
                (crate::model::Target::Proxy { .. }, _) => None,
                (_, crate::model::UpgradeTo::Version(v)) => Some(v.clone()),
                _ => None,
            },
        },
        Action::RouteSteps { to, .. } => Change::GeneratedRoutes(to.first().copied().unwrap_or(0)),
    }
}

pub(crate) fn offset(t: Instant, measure_from: Instant) -> f64 {
    t.saturating_duration_since(measure_from).as_secs_f64()
}

/// Says which event fired fewer times than planned (the run ended first), if one did.
pub(crate) fn unfired(
    cell: &Cell,
    timeline: &Timeline,
    fired: &[u32],
    requests: u64,
    held_behind_unfinished: bool,
) -> Option<String> {
    cell.events.iter().zip(fired).enumerate().find_map(|(i, (e, n))| {
        // Route events held behind steps the load ended first are in that warning.
        if held_behind_unfinished && e.action.is_route_event() {
            return None;
        }
        let planned = timeline.planned(i);
        (*n < planned).then(|| {
            format!(
                "events[{i}] fired {n} of {planned} times: the load ended first ({requests} requests); make load.duration (or load.requests) longer, or the event earlier"
            )
        })
    })
}
