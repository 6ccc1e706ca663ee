//! Capacity searches as results keep them: in `run.json`, a scenario's `searches` (where
//! each search ended) and each trial cell's `search` (its rate, verdict and figures); and
//! the file `ingressbench capacity --json` writes. The searches themselves are
//! `ingressbench_scenario::capacity`; these are their records, read back by `--resume`
//! and the report.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// A search's entry in run.json's `searches`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SearchRecord {
    /// The expanded cell it searches.
    #[serde(default)]
    pub of: usize,
    /// That cell's label.
    #[serde(default)]
    pub label: String,
    /// The target's name.
    #[serde(default)]
    pub target: String,
    /// Its matrix settings besides the rate, `path` to value.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// Its objectives as written (`p99 < 5ms`).
    #[serde(default)]
    pub slo: Vec<String>,
    /// Each trial's length.
    #[serde(default)]
    pub trial_s: f64,
    /// Where it searched and how finely.
    #[serde(default)]
    pub bounds: Bounds,
    /// Its trials: indices into run.json's cells, in running order.
    #[serde(default)]
    pub trials: Vec<usize>,
    /// Where it ended (none while it searches).
    #[serde(default)]
    pub outcome: Option<Outcome>,
    /// `searching` or `done`.
    #[serde(default)]
    pub status: String,
    /// Objectives a trial at `from` is too small to resolve; a first failure at or over
    /// the generator's ceiling.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The trials and why, in words (once done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<String>,
    /// What the generator sustained alone (none when the load came from a cluster's pods).
    #[serde(default)]
    pub generator_ceiling: Option<Ceiling>,
}

impl SearchRecord {
    /// Whether it ran to its end.
    pub fn is_done(&self) -> bool {
        self.status == "done"
    }

    /// Its settings as `key=value` words, or empty.
    pub fn settings_words(&self) -> String {
        (self.settings.iter())
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A search's bounds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Bounds {
    /// The first rate tried.
    pub from: f64,
    /// The highest rate a trial may offer, in requests per second.
    pub up_to: f64,
    /// How narrow the bracket had to be (its width over its low end).
    pub precision: f64,
    /// How often a straddling trial was run again.
    pub repeats: u32,
    /// Whether a failing `from` was halved down.
    #[serde(default)]
    pub down_from: bool,
}

/// Where a search ended: its `kind`'s figures, and in words.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Where the search ended, and its figures.
    #[serde(flatten)]
    pub kind: OutcomeKind,
    /// The outcome in words, as the command printed it.
    #[serde(default)]
    pub said: String,
}

/// The ends a search can come to. Rates are requests per second; `broke` is an
/// objective as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OutcomeKind {
    /// The bracket is narrow enough: the limit lies between the two rates.
    Found {
        /// The highest rate that passed.
        capacity_per_s: f64,
        /// The lowest that failed.
        failed_at_per_s: f64,
        /// The objective it broke.
        broke: Option<String>,
    },
    /// The highest rate searched passed.
    AtLeast {
        /// The highest rate that passed, in requests per second.
        capacity_per_s: f64,
    },
    /// `from` failed, and every rate halving down from it.
    FromFails {
        /// The objective the lowest broke.
        broke: Option<String>,
        /// The lowest rate tried.
        lowest_per_s: f64,
    },
    /// The generator gave out before the target did.
    Generator {
        /// The highest rate that passed before (if any).
        capacity_per_s: Option<f64>,
        /// The lowest that failed before, the target's failure (if any).
        failed_at_per_s: Option<f64>,
        /// Where the generator gave out.
        generator_at_per_s: f64,
        /// What showed the generator was the limit (its lag, its CPU).
        why: String,
    },
    /// The target stopped answering: no capacity is claimed.
    TargetStopped {
        /// The highest rate that passed before (if any).
        passed_per_s: Option<f64>,
        /// The lowest that failed before (if any).
        failed_at_per_s: Option<f64>,
        /// The rate nothing answered.
        stopped_at_per_s: f64,
        /// What that trial saw.
        why: String,
    },
    /// A trial measured too little to judge.
    CannotJudge {
        /// The highest rate that passed before (if any).
        passed_per_s: Option<f64>,
        /// That trial's rate.
        at_per_s: f64,
        /// Why, in words.
        why: String,
    },
    /// A kind a newer version wrote.
    #[serde(other)]
    Other,
}

impl OutcomeKind {
    /// The capacity it claims, if any.
    pub fn capacity_per_s(&self) -> Option<f64> {
        match self {
            OutcomeKind::Found { capacity_per_s, .. } | OutcomeKind::AtLeast { capacity_per_s } => {
                Some(*capacity_per_s)
            }
            OutcomeKind::Generator { capacity_per_s, .. } => *capacity_per_s,
            _ => None,
        }
    }

    /// The lowest rate that failed the target, if the search bracketed one.
    pub fn failed_at_per_s(&self) -> Option<f64> {
        match self {
            OutcomeKind::Found {
                failed_at_per_s, ..
            } => Some(*failed_at_per_s),
            OutcomeKind::Generator {
                failed_at_per_s, ..
            } => *failed_at_per_s,
            _ => None,
        }
    }
}

/// What the generator sustained alone against a local echo backend before a search.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ceiling {
    /// How the load was sent, in words.
    #[serde(default)]
    pub load: String,
    /// The highest rate it kept up with (none: not even `from`).
    #[serde(default)]
    pub healthy_per_s: Option<f64>,
    /// The first it did not.
    #[serde(default)]
    pub behind_at_per_s: Option<f64>,
    /// The evidence for that.
    #[serde(default)]
    pub why: Option<String>,
    /// Every rate tried, in order.
    #[serde(default)]
    pub steps: Vec<CeilingStep>,
}

/// One rate of a generator's ceiling.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CeilingStep {
    /// The rate offered, in requests per second.
    pub rate_per_s: f64,
    /// The rate answered, in requests per second.
    pub achieved_per_s: f64,
    /// The scheduler's lag, p99.
    pub scheduler_lag_us_p99: u64,
    /// The generator's CPU, a share of its threads (none with workers).
    #[serde(default)]
    pub generator_cpu_share: Option<f64>,
}

/// A trial cell's `search` in run.json.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    /// The expanded cell its search searches.
    #[serde(default)]
    pub of: usize,
    /// Its search, an index into `searches`.
    #[serde(default)]
    pub search: usize,
    /// Which trial of it (from 1).
    #[serde(default)]
    pub trial: usize,
    /// Its rate (none: a record that lost it, which `--resume` refuses).
    #[serde(default)]
    pub rate_per_s: Option<f64>,
    /// Why this rate (`from`, `doubling`, `bisecting`, `halving down`, `repeat of a
    /// straddle`).
    #[serde(default)]
    pub why: String,
    /// Its verdict (none: as for the rate).
    #[serde(default)]
    pub verdict: Option<Verdict>,
    /// The verdict and what the search made of it, in words.
    #[serde(default)]
    pub said: String,
    /// A repeat: how many straddling trials' windows were judged with its own.
    #[serde(default)]
    pub pooled_trials: usize,
    /// Each objective's figure.
    #[serde(default)]
    pub figures: Vec<Figure>,
    /// The scheduler's lag, p99.
    #[serde(default)]
    pub scheduler_lag_us_p99: u64,
    /// The generator's CPU, a share of its threads (none with workers or from pods).
    #[serde(default)]
    pub generator_cpu_share: Option<f64>,
}

/// A trial's verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Verdict {
    /// Every objective's interval inside it.
    Pass,
    /// An objective's interval wholly outside (its index).
    Fail {
        /// The objective, an index into the search's `slo`.
        objective: usize,
    },
    /// An objective's interval across its limit.
    Straddle {
        /// The objective.
        objective: usize,
    },
    /// The generator fell behind.
    Generator {
        /// What showed the generator was the limit (its lag, its CPU).
        why: String,
    },
    /// Nothing answered.
    NoAnswers {
        /// What the trial saw.
        why: String,
    },
    /// Too little measured to judge.
    CannotJudge {
        /// Why the trial cannot be judged.
        why: String,
    },
}

impl Verdict {
    /// Whether the trial passed.
    pub fn passed(&self) -> bool {
        matches!(self, Verdict::Pass)
    }
}

/// An objective's figure in a trial, in the terms of the verdict: a quantile's share of
/// answers at or over its limit, errors as a fraction, mean/max in ms.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// The objective as written.
    pub objective: String,
    /// The figure (NaN, written as null, when nothing measured it).
    #[serde(deserialize_with = "nan_if_null")]
    pub value: f64,
    /// Its interval, low then high.
    #[serde(deserialize_with = "nan_pair_if_null")]
    pub interval: [f64; 2],
    /// The objective's limit in the same terms.
    pub bound: f64,
}

/// The file `ingressbench capacity --json` writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapacityFile {
    /// The URL searched.
    pub url: String,
    /// The objectives as given.
    pub objectives: Vec<String>,
    /// The search's bounds.
    pub bounds: Bounds,
    /// What the generator sustained alone.
    pub generator_ceiling: Ceiling,
    /// Every trial, in order.
    pub trials: Vec<CapacityTrial>,
    /// Where it ended as figures (none: interrupted).
    pub result: Option<Outcome>,
    /// Where it ended, in words.
    pub outcome: String,
    /// The trials and why, in words.
    pub spent: String,
}

/// A trial of `ingressbench capacity`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapacityTrial {
    /// The rate the trial offered, in requests per second.
    pub rate_per_s: f64,
    /// Why this rate.
    pub why: String,
    /// The verdict and what the search made of it, in words.
    pub verdict: String,
    /// A repeat: how many straddling trials' windows were judged with its own.
    pub pooled_trials: usize,
    /// Each objective's figure.
    pub figures: Vec<Figure>,
    /// Answered per second.
    pub achieved_per_s: f64,
    /// Its latency's summary (as summary.json's `latency_us`).
    pub latency_us: ingressbench_stats::Percentiles,
    /// The scheduler's lag, p99.
    pub scheduler_lag_us_p99: u64,
    /// This process's CPU, a share of its threads.
    pub generator_cpu_share: f64,
}

fn nan_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn nan_pair_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<[f64; 2], D::Error> {
    let [a, b] = <[Option<f64>; 2]>::deserialize(d)?;
    Ok([a.unwrap_or(f64::NAN), b.unwrap_or(f64::NAN)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_reads_by_its_kind_and_an_unknown_kind_is_kept_as_other() {
        let found: Outcome = serde_json::from_str(
            r#"{"kind":"found","capacity_per_s":1000.0,"failed_at_per_s":1062.5,"broke":"p99 < 5ms","said":"x"}"#,
        )
        .unwrap();
        assert_eq!(found.kind.capacity_per_s(), Some(1000.0));
        assert_eq!(found.kind.failed_at_per_s(), Some(1062.5));
        let again = serde_json::to_value(&found).unwrap();
        assert_eq!(again["kind"], "found");
        assert_eq!(again["said"], "x");
        let later: Outcome =
            serde_json::from_str(r#"{"kind":"plateau","said":"y","at":3}"#).unwrap();
        assert_eq!(later.kind, OutcomeKind::Other);
        assert_eq!(later.said, "y");
    }

    #[test]
    fn a_figure_nothing_measured_reads_back_as_nan() {
        let figure = Figure {
            objective: "p99 < 5ms".into(),
            value: f64::NAN,
            interval: [f64::NAN, 0.5],
            bound: 0.01,
        };
        let text = serde_json::to_string(&figure).unwrap();
        assert!(text.contains(r#""value":null"#), "{text}");
        let back: Figure = serde_json::from_str(&text).unwrap();
        assert!(back.value.is_nan() && back.interval[0].is_nan());
        assert_eq!(back.interval[1], 0.5);
    }
}
