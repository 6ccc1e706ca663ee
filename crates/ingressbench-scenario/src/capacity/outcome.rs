//! Where a search ended ([`Outcome`]), in words and as results keep it.

use std::fmt;

use ingressbench_results::capacity as record;

use super::{Measured, Objective};

/// Where a search ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The bracket is narrow enough: the highest rate that passed and the lowest that
    /// failed, with the objective it broke (an index).
    Found {
        /// The capacity: the highest rate that passed.
        capacity: f64,
        /// The lowest rate that failed.
        failed_at: f64,
        /// The objective that lowest failure broke (or straddled to the end).
        broke: usize,
    },
    /// `up_to` passed: the capacity is at least that.
    AtLeast(f64),
    /// `from` failed, and with `down_from` every rate halving down to `lowest` did too
    /// (without it, `lowest` is `from`).
    FromFails {
        /// The objective the lowest rate tried broke.
        broke: usize,
        /// The lowest rate tried.
        lowest: f64,
        /// The rate the search started from.
        from: f64,
    },
    /// The target stopped answering at this rate (none of a trial's requests was): no
    /// capacity is claimed past what passed before it.
    TargetStopped {
        /// The highest rate that passed before it (if any).
        passed: Option<f64>,
        /// The lowest rate that failed before it (if any).
        failed: Option<f64>,
        /// The rate of the trial nothing answered.
        at: f64,
        /// What that trial saw.
        why: String,
    },
    /// A trial measured too little to judge its objectives: the search cannot go on.
    CannotJudge {
        /// The highest rate that passed before it (if any).
        passed: Option<f64>,
        /// The rate of that trial.
        at: f64,
        /// Why, in words.
        why: String,
    },
    /// The generator was the limit before the system was, at this rate.
    GeneratorLimited {
        /// The highest rate that passed before it (if any).
        passed: Option<f64>,
        /// The lowest rate that failed before it, the system's failure (if any).
        failed: Option<f64>,
        /// The rate at which the generator gave out.
        at: f64,
        /// What showed the generator was the limit (its lag, its CPU).
        why: String,
    },
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Found {
                capacity,
                failed_at,
                ..
            } => write!(
                f,
                "capacity {capacity:.0} req/s (passed; {failed_at:.0} req/s failed)"
            ),
            Outcome::AtLeast(r) => write!(f, "capacity at least {r:.0} req/s (up_to passed)"),
            Outcome::FromFails { .. } => write!(f, "the starting rate already fails"),
            Outcome::TargetStopped {
                passed,
                failed,
                at,
                why,
            } => {
                write!(
                    f,
                    "no capacity: the target stopped answering at {at:.0} req/s ({why})"
                )?;
                before_it(f, *passed, *failed, "")
            }
            Outcome::CannotJudge { passed, at, why } => {
                write!(
                    f,
                    "no capacity: the trial at {at:.0} req/s cannot be judged ({why})"
                )?;
                before_it(f, *passed, None, "")
            }
            Outcome::GeneratorLimited {
                at,
                why,
                passed,
                failed,
            } => {
                write!(f, "limited by the generator at {at:.0} req/s ({why})")?;
                before_it(
                    f,
                    *passed,
                    *failed,
                    ", the limit between them not narrowed to the precision",
                )
            }
        }
    }
}

/// What a search that ended early had seen before: `; before it 800 req/s passed and
/// 1600 req/s failed` and `bracketed` when both are known.
fn before_it(
    f: &mut fmt::Formatter<'_>,
    passed: Option<f64>,
    failed: Option<f64>,
    bracketed: &str,
) -> fmt::Result {
    match (passed, failed) {
        (Some(p), Some(x)) => write!(
            f,
            "; before it {p:.0} req/s passed and {x:.0} req/s failed{bracketed}"
        ),
        (Some(p), None) => write!(f, "; before it {p:.0} req/s passed"),
        _ => Ok(()),
    }
}

/// Objective `i`'s text (`?` if there is none).
pub(super) fn named(objectives: &[Objective], i: usize) -> String {
    objectives
        .get(i)
        .map_or("?", |o| o.text.as_str())
        .to_owned()
}

impl Outcome {
    /// In words, naming the objective broken.
    pub fn text(&self, objectives: &[Objective]) -> String {
        let named = |i: &usize| named(objectives, *i);
        match self {
            Outcome::Found {
                capacity,
                failed_at,
                broke,
            } => format!(
                "capacity {capacity:.0} req/s: passed there, {failed_at:.0} req/s broke {}",
                named(broke)
            ),
            Outcome::FromFails {
                broke,
                lowest,
                from,
            } if lowest < from => format!(
                "no rate passes: every rate halving down to {lowest} req/s fails ({})",
                named(broke)
            ),
            Outcome::FromFails { broke, .. } => format!(
                "the starting rate already fails ({}): no search below it; start lower, or search down from it with down_from",
                named(broke)
            ),
            other => other.to_string(),
        }
    }

    /// As a results file keeps it.
    pub fn record(&self, objectives: &[Objective]) -> record::Outcome {
        use record::OutcomeKind as Kind;
        let named = |i: &usize| objectives.get(*i).map(|o| o.text.clone());
        let kind = match self {
            Outcome::Found {
                capacity,
                failed_at,
                broke,
            } => Kind::Found {
                capacity_per_s: *capacity,
                failed_at_per_s: *failed_at,
                broke: named(broke),
            },
            Outcome::AtLeast(r) => Kind::AtLeast { capacity_per_s: *r },
            Outcome::FromFails { broke, lowest, .. } => Kind::FromFails {
                broke: named(broke),
                lowest_per_s: *lowest,
            },
            Outcome::GeneratorLimited {
                passed,
                failed,
                at,
                why,
            } => Kind::Generator {
                capacity_per_s: *passed,
                failed_at_per_s: *failed,
                generator_at_per_s: *at,
                why: why.clone(),
            },
            // No capacity is claimed: what passed before is `passed_per_s`.
            Outcome::TargetStopped {
                passed,
                failed,
                at,
                why,
            } => Kind::TargetStopped {
                passed_per_s: *passed,
                failed_at_per_s: *failed,
                stopped_at_per_s: *at,
                why: why.clone(),
            },
            Outcome::CannotJudge { passed, at, why } => Kind::CannotJudge {
                passed_per_s: *passed,
                at_per_s: *at,
                why: why.clone(),
            },
        };
        record::Outcome {
            kind,
            said: self.text(objectives),
        }
    }
}

/// Each objective's figure in a trial, as results keep them.
pub fn figure_records(objectives: &[Objective], figures: &[Measured]) -> Vec<record::Figure> {
    (objectives.iter().zip(figures))
        .map(|(o, m)| record::Figure {
            objective: o.text.clone(),
            value: m.value,
            interval: m.interval,
            bound: o.bound(),
        })
        .collect()
}
