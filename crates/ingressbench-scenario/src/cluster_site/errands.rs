//! API work done off the events' driver, each thread with a client of its own. An
//! event's calls (a stall with the list that picks its pod, a rollout restart) run on a
//! thread of their own; those whose order matters (route changes; scales and deletes)
//! run in turn on their lane's thread, as a pipeline would apply them; the follow-ups (a
//! rollout's state, a route's status, the pods after a scale, the heartbeat) in turn on
//! one more. The driver sends them and takes what came back when it ticks: an event never
//! waits on another's work, nor on a reading of the API.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Instant;

use ingressbench_cluster::deploy::{PodState, Rollout, RolloutState, RunNamespace, Twin};
use ingressbench_cluster::routes::gateway::Verdict;

use super::Expect;

/// What an errand is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Errand {
    /// The calls of the event of this record.
    Event(usize),
    /// A follow-up of this record's change: its rollout's state, its routes' status, the
    /// pods after it.
    Follow(usize),
    /// The namespace's heartbeat.
    Heartbeat,
}

/// Calls made in turn on a thread of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Lane {
    /// Route changes: a later generation must not land before an earlier one.
    Routes,
    /// Changes to the pool's pods, scales and deletes: `3->4` then `4->3` must not end
    /// at 4, and a kill must see the pod an earlier one took as going.
    Pods,
    /// The follow-ups.
    Follow,
}

/// What came back from the API.
pub(super) enum Answer {
    /// Done, nothing to say.
    Done,
    /// A scale was asked: what it was (`scale echo 3->4`), and the pods before it.
    Scaled { what: String, before: Vec<String> },
    /// A pod was picked and deleted (or stalled): what was done, the pod, and what the
    /// EndpointSlices will show (none for a stall).
    Picked {
        what: String,
        pod: String,
        expect: Option<Expect>,
    },
    /// The API stored a change of the routes.
    Stored,
    /// A rollout restart or an upgrade was asked: what it was, and the rollouts to follow
    /// (the first's first new pod ready: applied).
    RolledOut {
        what: String,
        rollouts: Vec<Rollout>,
    },
    /// Those rollouts' states, in their order.
    Rollout(Vec<RolloutState>),
    /// The first route that is not ready, and why (none: all are).
    Verdict(Option<(String, Verdict)>),
    /// The pool's pods.
    Pods(Vec<PodState>),
}

/// API work for an errand, given the namespace on its thread.
pub(super) type Job = Box<dyn FnOnce(&RunNamespace) -> Result<Answer, String> + Send>;

/// An errand's answer, with the instant its last call returned.
pub(super) struct Back {
    pub(super) errand: Errand,
    pub(super) answer: Result<Answer, String>,
    pub(super) at: Instant,
}

/// The errands out and their answers.
pub(super) struct Errands {
    twin: Twin,
    /// Each lane's thread, started with its first call.
    lanes: Vec<(Lane, Sender<(Errand, Job)>)>,
    back_tx: Sender<Back>,
    back: Receiver<Back>,
    out: Vec<Errand>,
}

impl Errands {
    pub(super) fn new(run: &RunNamespace) -> Self {
        let (back_tx, back) = channel();
        Self {
            twin: run.twin(),
            lanes: Vec::new(),
            back_tx,
            back,
            out: Vec::new(),
        }
    }

    /// Sends an event's calls: on their lane's thread after what is out on it, or, with
    /// none, on a thread of their own.
    pub(super) fn event(&mut self, index: usize, lane: Option<Lane>, job: Job) {
        let errand = Errand::Event(index);
        if let Some(lane) = lane {
            self.send(lane, errand, job);
            return;
        }
        self.out.push(errand);
        let (twin, tx) = (self.twin.clone(), self.back_tx.clone());
        let spawned = std::thread::Builder::new()
            .name("ib-event".into())
            .spawn(move || {
                let answer = twin.open().map_err(|e| e.to_string()).and_then(|r| job(&r));
                let at = Instant::now();
                let _ = tx.send(Back { errand, answer, at });
            });
        if let Err(e) = spawned {
            self.failed(errand, &e);
        }
    }

    /// Sends a follow-up, unless one for `errand` is out already. Returns whether it was
    /// sent.
    pub(super) fn follow(&mut self, errand: Errand, job: Job) -> bool {
        if self.is_out(errand) {
            return false;
        }
        self.send(Lane::Follow, errand, job);
        true
    }

    /// Whether an event's calls have not come back yet.
    pub(super) fn event_out(&self) -> bool {
        self.out.iter().any(|e| matches!(e, Errand::Event(_)))
    }

    /// Whether `errand` has not come back yet.
    pub(super) fn is_out(&self, errand: Errand) -> bool {
        self.out.contains(&errand)
    }

    /// Sends `job` to `lane`'s thread, starting it first if need be.
    fn send(&mut self, lane: Lane, errand: Errand, job: Job) {
        self.out.push(errand);
        if !self.lanes.iter().any(|(l, _)| *l == lane) {
            match self.start_lane() {
                Ok(tx) => self.lanes.push((lane, tx)),
                Err(e) => return self.failed(errand, &e),
            }
        }
        let sent = (self.lanes.iter())
            .find(|(l, _)| *l == lane)
            .is_some_and(|(_, tx)| tx.send((errand, job)).is_ok());
        if !sent {
            self.failed(errand, &"its thread has ended");
        }
    }

    /// A lane's thread: opens the namespace once, then does each job in turn until the
    /// errands are dropped (an error opening it is every job's answer).
    fn start_lane(&self) -> std::io::Result<Sender<(Errand, Job)>> {
        let (tx, rx) = channel::<(Errand, Job)>();
        let (twin, back) = (self.twin.clone(), self.back_tx.clone());
        std::thread::Builder::new()
            .name("ib-api-lane".into())
            .spawn(move || {
                let run = twin.open().map_err(|e| e.to_string());
                for (errand, job) in rx {
                    let answer = match &run {
                        Ok(run) => job(run),
                        Err(e) => Err(e.clone()),
                    };
                    let at = Instant::now();
                    if back.send(Back { errand, answer, at }).is_err() {
                        return;
                    }
                }
            })?;
        Ok(tx)
    }

    /// Answers for `errand` that no thread could be started (or reached) for it.
    fn failed(&self, errand: Errand, why: &dyn std::fmt::Display) {
        let _ = self.back_tx.send(Back {
            errand,
            answer: Err(format!("starting a thread for its API calls: {why}")),
            at: Instant::now(),
        });
    }

    /// What came back since the last call, in the order it came.
    pub(super) fn back(&mut self) -> Vec<Back> {
        let back: Vec<Back> = self.back.try_iter().collect();
        for b in &back {
            if let Some(i) = self.out.iter().position(|e| *e == b.errand) {
                self.out.remove(i);
            }
        }
        back
    }
}
