//! The capacity search (issue #33): the highest offered rate at which a system stays within
//! its objectives (`p99 < 5ms`, `errors < 0.1%`), found by trials of open-loop load.
//!
//! A trial is judged on intervals, not on single numbers: each objective's figure comes
//! with the interval the report computes for it, and a trial passes only when every
//! interval is inside its objective, fails when one is wholly outside, and is otherwise
//! repeated (up to a bound) before the search moves on. A trial still straddling after
//! its repeats counts as a failure that says so: the capacity reported is a rate that
//! clearly passed.
//!
//! The search checks `from` first (a rate that should pass; if it fails, the result says so
//! and stops), doubles the rate until a trial fails or `up_to` passes ("at least up_to"),
//! then bisects the bracket between the highest pass and the lowest failure until it is
//! `precision` narrow. From a 2× bracket to 5% is five bisections.
//!
//! This module is the search alone: what a trial is (a cell of a run, with the scenario's
//! events) is the runner's.

use std::fmt;

/// One objective: a figure that must stay below a limit.
#[derive(Clone, Debug, PartialEq)]
pub struct Objective {
    /// The text as written (`p99 < 5ms`).
    pub text: String,
    /// Which figure.
    pub figure: Figure,
    /// Whether the limit itself passes (`<=`).
    pub inclusive: bool,
    /// The limit: milliseconds for a latency, a fraction for an error rate.
    pub limit: f64,
}

/// What an objective judges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Figure {
    /// A latency figure, by its name in the report (`p50`, `p99`, `p99.9`, `mean`, `max`).
    Latency(&'static str),
    /// The share of requests that failed.
    ErrorRate,
}

impl Objective {
    /// Parses `p99 < 5ms`, `p99.9 <= 1.5s`, `errors < 0.1%`: the grammar of `compare
    /// --fail-if`, where an objective bounds a figure from above (`<` or `<=`), a latency
    /// is a duration with its unit (kept in milliseconds) and errors are a percentage of
    /// the requests below 100% (an objective that cannot fail is refused).
    pub fn parse(text: &str) -> Result<Self, String> {
        const LATENCIES: [&str; 5] = ["mean", "p50", "p99", "p99.9", "max"];
        let bad = |why: &str| {
            format!(
                "objective `{text}`: {why}; write FIGURE < VALUE, e.g. 'p99 < 5ms' or 'errors < 0.1%', with FIGURE one of {}, errors",
                LATENCIES.join(", ")
            )
        };
        let t = text.trim();
        if t.contains('>') {
            return Err(bad(
                "an objective says what must stay below a limit (< or <=)",
            ));
        }
        let (figure, rest) = t.split_once('<').ok_or_else(|| bad("no comparison"))?;
        let (inclusive, value) = match rest.strip_prefix('=') {
            Some(v) => (true, v.trim()),
            None => (false, rest.trim()),
        };
        let figure = match figure.trim() {
            "errors" => Figure::ErrorRate,
            "p999" => Figure::Latency("p99.9"),
            name => Figure::Latency(
                LATENCIES
                    .iter()
                    .find(|l| **l == name)
                    .ok_or_else(|| bad("unknown figure"))?,
            ),
        };
        let number = |n: &str| -> Result<f64, String> {
            n.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| bad("the value is not a number of at least 0"))
        };
        let limit = match figure {
            Figure::ErrorRate => {
                let percent = value
                    .strip_suffix('%')
                    .ok_or_else(|| bad("an error objective is a percentage of requests"))?;
                let share = number(percent)? / 100.0;
                // Errors are a share of the requests: at most all of them.
                if share > 1.0 || (share == 1.0 && inclusive) {
                    return Err(bad(
                        "that error objective cannot fail (errors are at most 100% of the requests); give a share below 100%",
                    ));
                }
                share
            }
            Figure::Latency(_) => {
                let duration = ingressbench_stats::parse_duration(value)
                    .map_err(|e| bad(&format!("a latency objective is a duration ({e})")))?;
                if !value.trim().ends_with(char::is_alphabetic) {
                    return Err(bad("a latency objective needs a unit (5ms, 250us, 1s)"));
                }
                duration.as_secs_f64() * 1000.0
            }
        };
        Ok(Self {
            text: t.to_owned(),
            figure,
            inclusive,
            limit,
        })
    }

    /// What a trial's figure for this objective is compared with: for a quantile, the
    /// share of requests allowed at or over the limit (`p99 < 5ms` holds when fewer than
    /// 1% took 5 ms or more); for errors, mean and max, the limit itself.
    pub fn bound(&self) -> f64 {
        match self.quantile() {
            Some(q) => 1.0 - q,
            None => self.limit,
        }
    }

    /// The quantile a latency objective bounds (0.99 for `p99`), if it bounds one.
    fn quantile(&self) -> Option<f64> {
        match self.figure {
            Figure::Latency("p50") => Some(0.5),
            Figure::Latency("p99") => Some(0.99),
            Figure::Latency("p99.9") => Some(0.999),
            _ => None,
        }
    }

    /// Whether a figure in the terms of [`Objective::bound`] keeps the objective: a share
    /// over a quantile's limit must stay under the tail (the limit's own inclusiveness is
    /// in what is counted, [`WindowFigures`]); the others compare with `<` or `<=`.
    fn within(&self, x: f64) -> bool {
        if self.inclusive && self.quantile().is_none() {
            x <= self.bound()
        } else {
            x < self.bound()
        }
    }

    /// The latency in microseconds from which an answer counts against a quantile
    /// objective: the limit (`<`), or just over it (`<=`).
    fn counted_from_us(&self) -> u64 {
        let us = (self.limit * 1000.0).ceil() as u64;
        if self.inclusive {
            us + 1
        } else {
            us
        }
    }
}

/// What one window (a second) of a trial holds for its objectives: enough to recompute
/// every objective's figure over any set of windows, so that a figure's interval is a
/// bootstrap over the windows (latencies within a second are not independent; seconds
/// are nearer to it), at a cost of a few additions per window and draw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowFigures {
    /// Requests that ended in it.
    pub requests: u64,
    /// Of them, failures.
    pub errors: u64,
    /// Answered requests.
    pub answered: u64,
    /// Their latencies summed, in ms.
    pub latency_sum_ms: f64,
    /// The largest, in ms.
    pub max_ms: f64,
    /// Per objective: answers at or over its limit (quantile objectives; 0 for others).
    /// Requests that were never answered count over every limit besides these.
    pub over: Vec<u64>,
}

impl WindowFigures {
    /// The figures of one window of the load for `objectives`.
    pub fn of(window: &ingressbench_stats::Window, objectives: &[Objective]) -> Self {
        let h = window.latency.as_hdr();
        Self {
            requests: window.outcomes.total(),
            errors: window.outcomes.errors(),
            answered: h.len(),
            latency_sum_ms: window.latency.mean() * h.len() as f64 / 1000.0,
            max_ms: if h.is_empty() {
                0.0
            } else {
                window.latency.max() as f64 / 1000.0
            },
            over: objectives
                .iter()
                .map(|o| match o.quantile() {
                    Some(_) => h.count_between(o.counted_from_us(), u64::MAX),
                    None => 0,
                })
                .collect(),
        }
    }
}

/// Each objective's figure over `windows` (in the terms of [`Objective::bound`]), with a
/// 95% interval from `draws` bootstrap resamples of the windows.
pub fn measure(
    objectives: &[Objective],
    windows: &[WindowFigures],
    draws: usize,
    rng: &mut ingressbench_stats::compare::Rng,
) -> Vec<Measured> {
    use ingressbench_stats::compare::{bootstrap, interval};
    objectives
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let figure = |ws: &[&WindowFigures]| -> f64 {
                let sum = |f: &dyn Fn(&WindowFigures) -> f64| ws.iter().map(|w| f(w)).sum::<f64>();
                let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
                match o.figure {
                    Figure::ErrorRate => {
                        ratio(sum(&|w| w.errors as f64), sum(&|w| w.requests as f64))
                    }
                    Figure::Latency("mean") => {
                        ratio(sum(&|w| w.latency_sum_ms), sum(&|w| w.answered as f64))
                    }
                    Figure::Latency("max") => ws.iter().map(|w| w.max_ms).fold(0.0, f64::max),
                    // A request never answered took longer than any limit: it counts
                    // over it, among all the requests (the SRE book's latency SLI).
                    Figure::Latency(_) => ratio(
                        sum(&|w| {
                            (w.over.get(i).copied().unwrap_or(0) + w.requests
                                - w.answered.min(w.requests)) as f64
                        }),
                        sum(&|w| w.requests as f64),
                    ),
                }
            };
            let all: Vec<&WindowFigures> = windows.iter().collect();
            let value = figure(&all);
            let e = interval(value, &bootstrap(windows, draws, rng, figure), 0.95);
            Measured {
                value,
                interval: [e.low, e.high],
            }
        })
        .collect()
}

/// A figure of one trial with its interval, in the terms of [`Objective::bound`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measured {
    /// The figure.
    pub value: f64,
    /// Its interval, low then high.
    pub interval: [f64; 2],
}

/// What a trial says of its rate.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Every objective's interval is inside it.
    Pass,
    /// The interval of objective `.0` (an index) is wholly outside it.
    Fail(usize),
    /// No interval is wholly outside, but that of objective `.0` is not wholly inside.
    Straddle(usize),
    /// The generator, not the system, was the limit at this rate (its lateness or CPU):
    /// nothing can be said of the system here.
    GeneratorLimited(String),
    /// Nothing in the trial was answered: the target stopped answering (or never did).
    /// A pass needs answers; the search ends saying so.
    NoAnswers(String),
    /// The trial measured too little to judge an objective (why, in words): never a pass.
    CannotJudge(String),
}

/// Judges one trial: `figures[i]` is objective `i`'s figure ([`measure`]).
pub fn judge(objectives: &[Objective], figures: &[Measured]) -> Verdict {
    let mut straddle = None;
    for (i, (o, m)) in objectives.iter().zip(figures).enumerate() {
        if !o.within(m.interval[0]) {
            return Verdict::Fail(i);
        }
        if !o.within(m.interval[1]) && straddle.is_none() {
            straddle = Some(i);
        }
    }
    match straddle {
        Some(i) => Verdict::Straddle(i),
        None => Verdict::Pass,
    }
}

/// How a search is bounded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    /// A rate known to pass, tried first.
    pub from: f64,
    /// The highest rate tried.
    pub up_to: f64,
    /// Stop when the bracket's width over its low end is at most this (0.05: 5%).
    pub precision: f64,
    /// How many times a straddling trial is run again at the same rate.
    pub repeats: u32,
    /// When `from` fails, halve the rate until one passes (down to [`LOWEST_RATE`]),
    /// then bisect as above; without it the search stops at `from`.
    pub down_from: bool,
}

/// The lowest rate a search halving down from a failing `from` tries (requests per
/// second).
pub const LOWEST_RATE: f64 = 1.0;

/// One trial of a search.
#[derive(Clone, Debug, PartialEq)]
pub struct Trial {
    /// Its offered rate, requests per second.
    pub rate: f64,
    /// Its verdict.
    pub verdict: Verdict,
    /// Why it was run (`from`, `doubling`, `bisecting`, `repeat of a straddle`).
    pub why: &'static str,
}

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
        /// The evidence.
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

/// A search in progress: ask [`Search::next_rate`], run a trial there, [`Search::record`]
/// its verdict, until [`Search::outcome`] is some.
#[derive(Clone, Debug)]
pub struct Search {
    bounds: Bounds,
    trials: Vec<Trial>,
    /// The highest rate that passed.
    passed: Option<f64>,
    /// The lowest rate that failed, and the objective it broke.
    failed: Option<(f64, usize)>,
    /// Straddles so far at the rate being tried.
    straddles: u32,
    outcome: Option<Outcome>,
}

impl Search {
    /// A search within `bounds` (checked by the caller: 0 < from <= up_to, precision > 0).
    pub fn new(bounds: Bounds) -> Self {
        Self {
            bounds,
            trials: Vec::new(),
            passed: None,
            failed: None,
            straddles: 0,
            outcome: None,
        }
    }

    /// The search as far as `trials` (a search's record, read back) took it: how
    /// `--resume` continues one.
    pub fn resumed(bounds: Bounds, trials: &[Trial]) -> Self {
        let mut search = Self::new(bounds);
        for t in trials {
            if search.outcome.is_some() {
                break;
            }
            search.record(t.rate, t.verdict.clone());
        }
        search
    }

    /// The rate of the next trial, and why; none once the search has ended.
    pub fn next_rate(&self) -> Option<(f64, &'static str)> {
        if self.outcome.is_some() {
            return None;
        }
        if self.straddles > 0 {
            let last = self.trials.last()?;
            return Some((last.rate, "repeat of a straddle"));
        }
        Some(match (self.passed, self.failed) {
            (None, None) => (self.bounds.from, "from"),
            (Some(lo), None) => ((lo * 2.0).min(self.bounds.up_to), "doubling"),
            (Some(lo), Some((hi, _))) => ((lo + hi) / 2.0, "bisecting"),
            // Only with `down_from`: otherwise a failure before any pass ends the search.
            (None, Some((hi, _))) => (hi / 2.0, "halving down"),
        })
    }

    /// Records the verdict of a trial at `rate` (the rate [`Search::next_rate`] gave).
    pub fn record(&mut self, rate: f64, verdict: Verdict) {
        let why = self.next_rate().map_or("after the end", |(_, why)| why);
        self.trials.push(Trial {
            rate,
            verdict: verdict.clone(),
            why,
        });
        let failed = match verdict {
            Verdict::Pass => {
                self.straddles = 0;
                self.passed = Some(self.passed.map_or(rate, |p| p.max(rate)));
                None
            }
            Verdict::Fail(i) => Some(i),
            Verdict::Straddle(i) => {
                self.straddles += 1;
                if self.straddles <= self.bounds.repeats {
                    return;
                }
                Some(i)
            }
            Verdict::GeneratorLimited(why) => {
                self.outcome = Some(Outcome::GeneratorLimited {
                    passed: self.passed,
                    failed: self.failed.map(|(r, _)| r),
                    at: rate,
                    why,
                });
                return;
            }
            Verdict::NoAnswers(why) => {
                self.outcome = Some(Outcome::TargetStopped {
                    passed: self.passed,
                    failed: self.failed.map(|(r, _)| r),
                    at: rate,
                    why,
                });
                return;
            }
            Verdict::CannotJudge(why) => {
                self.outcome = Some(Outcome::CannotJudge {
                    passed: self.passed,
                    at: rate,
                    why,
                });
                return;
            }
        };
        if let Some(broke) = failed {
            self.straddles = 0;
            if self.passed.is_none() && !(self.bounds.down_from && rate / 2.0 >= LOWEST_RATE) {
                self.outcome = Some(Outcome::FromFails {
                    broke,
                    lowest: rate,
                    from: self.bounds.from,
                });
                return;
            }
            if self.failed.is_none_or(|(hi, _)| rate < hi) {
                self.failed = Some((rate, broke));
            }
        }
        self.outcome = match (self.passed, self.failed) {
            (Some(lo), None) if lo >= self.bounds.up_to => Some(Outcome::AtLeast(lo)),
            (Some(lo), Some((hi, broke))) if (hi - lo) / lo <= self.bounds.precision => {
                Some(Outcome::Found {
                    capacity: lo,
                    failed_at: hi,
                    broke,
                })
            }
            _ => None,
        };
    }

    /// Every trial so far, in order.
    pub fn trials(&self) -> &[Trial] {
        &self.trials
    }

    /// Where the search ended; none while it goes on.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// The last trial's verdict in words, with what the search made of it: a straddle is
    /// run again, or, once its repeats are spent, counted as a failure.
    pub fn last_said(&self, objectives: &[Objective]) -> String {
        let Some(last) = self.trials.last() else {
            return String::new();
        };
        let text = last.verdict.text(objectives);
        match last.verdict {
            Verdict::Straddle(_) if self.straddles > 0 => format!("{text}: run again"),
            Verdict::Straddle(_) => format!(
                "{text} {} times in a row: counted as a failure",
                self.bounds.repeats + 1
            ),
            _ => text,
        }
    }

    /// How many trials were spent and why: `9 trials (1 from, 3 doubling, 3 bisecting, 2
    /// repeats of a straddle)`.
    pub fn spent(&self) -> String {
        let mut why: Vec<(&str, usize)> = Vec::new();
        for t in &self.trials {
            match why.iter_mut().find(|(w, _)| *w == t.why) {
                Some((_, n)) => *n += 1,
                None => why.push((t.why, 1)),
            }
        }
        let parts: Vec<String> = why
            .iter()
            .map(|(w, n)| match (*w, *n) {
                ("repeat of a straddle", n) if n > 1 => format!("{n} repeats of a straddle"),
                (w, n) => format!("{n} {w}"),
            })
            .collect();
        let n = self.trials.len();
        format!(
            "{n} trial{} ({})",
            if n == 1 { "" } else { "s" },
            parts.join(", ")
        )
    }
}

/// A scenario's `search:` block, read: what a search of one cell needs.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchPlan {
    /// The objectives.
    pub objectives: Vec<Objective>,
    /// Where it looks and when it stops.
    pub bounds: Bounds,
    /// Each trial's measured length.
    pub trial: std::time::Duration,
}

/// The shortest trial: twenty windows of 100 ms, enough for an interval.
pub const SHORTEST_TRIAL: std::time::Duration = std::time::Duration::from_secs(2);

impl SearchPlan {
    /// Reads and checks `search:`; the message names the field and what to write.
    pub fn of(file: &crate::model::SearchFile) -> Result<Self, String> {
        if file.slo.is_empty() {
            return Err(
                "search.slo: give at least one objective, e.g. [\"p99 < 5ms\", \"errors < 0.1%\"]"
                    .into(),
            );
        }
        let objectives = file
            .slo
            .iter()
            .map(|s| Objective::parse(s).map_err(|e| format!("search.slo: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let precision = parse_precision(&file.precision).map_err(|e| format!("search.{e}"))?;
        if !(file.from > 0.0 && file.from.is_finite() && file.from <= file.up_to) {
            return Err(format!(
                "search.from {} and search.up_to {}: from must be above 0 and at most up_to",
                file.from, file.up_to
            ));
        }
        let trial = ingressbench_load::parse_duration(&file.trial)
            .map_err(|e| format!("search.trial: {e}"))?;
        if trial < SHORTEST_TRIAL {
            return Err(format!(
                "search.trial {}: at least {SHORTEST_TRIAL:?}, so that its windows (a twentieth of it, 100 ms or more) give an interval",
                file.trial
            ));
        }
        if file.repeats > 10 {
            return Err(format!(
                "search.repeats {}: at most 10 repeats of a straddling trial",
                file.repeats
            ));
        }
        Ok(Self {
            objectives,
            bounds: Bounds {
                from: file.from,
                up_to: file.up_to,
                precision,
                repeats: file.repeats,
                down_from: file.down_from,
            },
            trial,
        })
    }

    /// What a trial at `rate` is too small to tell: objectives on a share (a quantile's
    /// tail, errors) that fewer than ten of its requests would break, where one slow or
    /// failed request moves the verdict.
    pub fn too_small_at(&self, rate: f64) -> Vec<String> {
        let requests = rate * self.trial.as_secs_f64();
        self.objectives
            .iter()
            .filter(|o| o.quantile().is_some() || o.figure == Figure::ErrorRate)
            .filter(|o| o.bound() * requests < 10.0)
            .map(|o| {
                format!(
                    "a trial at {rate} req/s has {requests:.0} requests, of which {:.1} would break `{}`: a single request moves its verdict; a longer search.trial resolves it",
                    o.bound() * requests,
                    o.text
                )
            })
            .collect()
    }

    /// The width of a trial's windows: a twentieth of it, 100 ms to 1 s, so that there are
    /// twenty or more to resample.
    pub fn window(&self) -> std::time::Duration {
        (self.trial / 20).clamp(
            std::time::Duration::from_millis(100),
            std::time::Duration::from_secs(1),
        )
    }
}

/// Makes `scenario` (which has `search:`) its search's first trial, as its checks see it:
/// open-loop at `from`, for `trial`. Refuses what a search cannot take.
pub(crate) fn first_trial(scenario: &mut crate::model::Scenario) -> Result<(), String> {
    let Some(file) = &scenario.search else {
        return Ok(());
    };
    let plan = SearchPlan::of(file)?;
    let load = &mut scenario.load;
    if load.mode != crate::model::LoadModeFile::Open {
        return Err(
            "load.mode: a capacity search offers open-loop rates; leave load.mode out (open)"
                .into(),
        );
    }
    if load.requests.is_some() {
        return Err(format!(
            "load.requests: each trial of a search runs for search.trial ({}); leave load.requests out",
            file.trial
        ));
    }
    load.duration = Some(file.trial.clone());
    load.rate = Some(plan.bounds.from);
    Ok(())
}

/// `5%` as 0.05; the message starts with `precision`.
pub fn parse_precision(text: &str) -> Result<f64, String> {
    text.strip_suffix('%')
        .and_then(|p| p.trim().parse::<f64>().ok())
        .filter(|p| *p > 0.0 && *p < 100.0)
        .map(|p| p / 100.0)
        .ok_or_else(|| format!("precision {text}: a percentage between 0 and 100, e.g. 5%"))
}

/// Scheduler lag p99 over which the generator is behind its own schedule, in us (as the
/// load's own GENERATOR FELL BEHIND warning).
pub const LAG_LIMIT_US: u64 = 1000;
/// And the share of the trial's own latency p99 its lag must reach to explain a failure
/// (on a busy machine the lag passes 1 ms at any rate; a p99 of seconds is not its doing).
const LAG_SHARE: f64 = 0.1;
/// The share of its threads' time over which the generator is out of CPU.
const CPU_LIMIT: f64 = 0.9;
/// Bootstrap draws per figure of a trial (a few additions per window each).
const DRAWS: usize = 2000;

/// What the generator showed of itself in a trial.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GeneratorSeen {
    /// Its scheduler lag p99, us.
    pub lag_p99_us: u64,
    /// The trial's latency p99, us (what the lag is weighed against).
    pub latency_p99_us: u64,
    /// CPU it spent over the time its threads had (1.0: all of it); none if unknown.
    pub cpu_share: Option<f64>,
    /// Its threads.
    pub threads: usize,
}

/// The evidence that the generator, not the target, made a trial fail: its CPU, or a
/// scheduler lag over [`LAG_LIMIT_US`] that is a real share of the latency judged.
pub fn behind(seen: &GeneratorSeen) -> Option<String> {
    let GeneratorSeen {
        lag_p99_us,
        latency_p99_us,
        cpu_share,
        threads,
    } = *seen;
    let lag = lag_p99_us > LAG_LIMIT_US && lag_p99_us as f64 >= LAG_SHARE * latency_p99_us as f64;
    let out_of_cpu = cpu_share.is_some_and(|c| c > CPU_LIMIT);
    (lag || out_of_cpu).then(|| {
        let cpu = match cpu_share {
            Some(c) => format!(
                ", its CPU {:.0}% of {threads} thread{}",
                c * 100.0,
                if threads == 1 { "" } else { "s" }
            ),
            None => String::new(),
        };
        format!("scheduler lag p99 {lag_p99_us} us (limit {LAG_LIMIT_US}){cpu}")
    })
}

/// ` (with the windows of the 2 trials before it)` when a trial's figures pooled earlier
/// trials' windows; empty when not.
pub fn pooled_text(trials: usize) -> String {
    match trials {
        0 => String::new(),
        1 => " (with the windows of the trial before it)".into(),
        n => format!(" (with the windows of the {n} trials before it)"),
    }
}

/// The windows a repeat of a straddling trial is judged on, beside its own: those of the
/// trials before it at the same rate that straddled. A repeat adds data rather than
/// drawing again: three trials' windows give a narrower interval than one, and a figure
/// that sits near its objective is then told apart from it, or is still at it.
#[derive(Clone, Debug, Default)]
pub struct Pool {
    windows: Vec<WindowFigures>,
    trials: usize,
}

impl Pool {
    /// The windows to judge the trial `search` runs next on: `own`, after those of the
    /// straddles it repeats (none when it is not a repeat).
    pub fn with(&mut self, search: &Search, own: &[WindowFigures]) -> Vec<WindowFigures> {
        if !matches!(search.next_rate(), Some((_, "repeat of a straddle"))) {
            self.windows.clear();
            self.trials = 0;
        }
        let mut all = self.windows.clone();
        all.extend_from_slice(own);
        all
    }

    /// Keeps `own`, the windows of a trial that straddled, for its repeats.
    pub fn keep(&mut self, own: Vec<WindowFigures>) {
        self.windows.extend(own);
        self.trials += 1;
    }

    /// How many earlier trials' windows [`Pool::with`] adds (as of its last call).
    pub fn trials(&self) -> usize {
        self.trials
    }
}

/// Judges one trial from its windows: each objective's figure and interval, and the
/// verdict; a trial that does not pass while the generator was behind ([`behind`]) is
/// the generator's. `seed` makes the bootstrap repeatable (the same windows, the same
/// verdict).
pub fn judge_trial(
    objectives: &[Objective],
    windows: &[WindowFigures],
    seen: &GeneratorSeen,
    seed: u64,
) -> (Vec<Measured>, Verdict) {
    let mut rng = ingressbench_stats::compare::Rng::new(seed);
    let figures = measure(objectives, windows, DRAWS, &mut rng);
    if let Some(unjudged) = unmeasured(objectives, windows) {
        return (figures, unjudged);
    }
    let mut verdict = judge(objectives, &figures);
    if verdict != Verdict::Pass {
        if let Some(why) = behind(seen) {
            verdict = Verdict::GeneratorLimited(why);
        }
    }
    (figures, verdict)
}

/// What makes a trial's windows no ground for a verdict, if anything: no request ended
/// in it, none was answered (the target stopped answering), or a quantile objective of
/// which not even one request may break (`p99.9` over 500 requests: the maximum, not a
/// percentile). A trial passes only on what it measured.
fn unmeasured(objectives: &[Objective], windows: &[WindowFigures]) -> Option<Verdict> {
    let requests: u64 = windows.iter().map(|w| w.requests).sum();
    let answered: u64 = windows.iter().map(|w| w.answered).sum();
    let errors: u64 = windows.iter().map(|w| w.errors).sum();
    if requests == 0 {
        return Some(Verdict::CannotJudge("no request ended in the trial".into()));
    }
    if answered == 0 {
        return Some(Verdict::NoAnswers(format!(
            "none of its {requests} requests was answered; {errors} failed"
        )));
    }
    let few = objectives
        .iter()
        .find(|o| o.quantile().is_some() && o.bound() * (requests as f64) < 1.0)?;
    Some(Verdict::CannotJudge(format!(
        "{requests} requests: not one of them may break `{}`, so the trial says nothing of it; a longer trial or a higher rate can",
        few.text
    )))
}

/// Each objective's figure with its interval: `share at or over 5 ms 0.20% (0.10-0.40%)`.
pub fn describe(objectives: &[Objective], figures: &[Measured]) -> String {
    objectives
        .iter()
        .zip(figures)
        .map(|(o, m)| match o.figure {
            Figure::Latency(name @ ("mean" | "max")) => format!(
                "{name} {:.2} ms ({:.2}-{:.2})",
                m.value, m.interval[0], m.interval[1]
            ),
            Figure::Latency(_) => format!(
                "at or over {} ms {:.2}% ({:.2}-{:.2}%, under {:.2}% keeps {})",
                o.limit,
                m.value * 100.0,
                m.interval[0] * 100.0,
                m.interval[1] * 100.0,
                o.bound() * 100.0,
                o.text
            ),
            Figure::ErrorRate => format!(
                "errors {:.3}% ({:.3}-{:.3}%)",
                m.value * 100.0,
                m.interval[0] * 100.0,
                m.interval[1] * 100.0
            ),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Objective `i`'s text (`?` if there is none).
fn named(objectives: &[Objective], i: usize) -> String {
    objectives
        .get(i)
        .map_or("?", |o| o.text.as_str())
        .to_owned()
}

impl Verdict {
    /// In words: `pass`, `fail (p99 < 5ms)`.
    pub fn text(&self, objectives: &[Objective]) -> String {
        let named = |i: &usize| named(objectives, *i);
        match self {
            Verdict::Pass => "pass".into(),
            Verdict::Fail(i) => format!("fail ({})", named(i)),
            Verdict::Straddle(i) => format!("straddles {}", named(i)),
            Verdict::GeneratorLimited(why) => format!("generator-limited ({why})"),
            Verdict::NoAnswers(why) => format!("no answers ({why})"),
            Verdict::CannotJudge(why) => format!("cannot judge ({why})"),
        }
    }

    /// As a results file keeps it.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Verdict::Pass => json!({ "kind": "pass" }),
            Verdict::Fail(i) => json!({ "kind": "fail", "objective": i }),
            Verdict::Straddle(i) => json!({ "kind": "straddle", "objective": i }),
            Verdict::GeneratorLimited(why) => json!({ "kind": "generator", "why": why }),
            Verdict::NoAnswers(why) => json!({ "kind": "no_answers", "why": why }),
            Verdict::CannotJudge(why) => json!({ "kind": "cannot_judge", "why": why }),
        }
    }

    /// Read back from [`Verdict::to_json`]; none if it is not one.
    pub fn from_json(v: &serde_json::Value) -> Option<Self> {
        let objective = || v["objective"].as_u64().map(|i| i as usize);
        Some(match v["kind"].as_str()? {
            "pass" => Verdict::Pass,
            "fail" => Verdict::Fail(objective()?),
            "straddle" => Verdict::Straddle(objective()?),
            "generator" => Verdict::GeneratorLimited(v["why"].as_str()?.to_owned()),
            "no_answers" => Verdict::NoAnswers(v["why"].as_str()?.to_owned()),
            "cannot_judge" => Verdict::CannotJudge(v["why"].as_str()?.to_owned()),
            _ => return None,
        })
    }
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
    pub fn to_json(&self, objectives: &[Objective]) -> serde_json::Value {
        use serde_json::json;
        let named = |i: &usize| objectives.get(*i).map(|o| o.text.clone());
        let mut v = match self {
            Outcome::Found {
                capacity,
                failed_at,
                broke,
            } => json!({
                "kind": "found", "capacity_per_s": capacity, "failed_at_per_s": failed_at,
                "broke": named(broke),
            }),
            Outcome::AtLeast(r) => json!({ "kind": "at_least", "capacity_per_s": r }),
            Outcome::FromFails { broke, lowest, .. } => {
                json!({ "kind": "from_fails", "broke": named(broke), "lowest_per_s": lowest })
            }
            Outcome::GeneratorLimited {
                passed,
                failed,
                at,
                why,
            } => json!({
                "kind": "generator", "capacity_per_s": passed, "failed_at_per_s": failed,
                "generator_at_per_s": at, "why": why,
            }),
            // No capacity is claimed: what passed before is `passed_per_s`.
            Outcome::TargetStopped {
                passed,
                failed,
                at,
                why,
            } => json!({
                "kind": "target_stopped", "passed_per_s": passed, "failed_at_per_s": failed,
                "stopped_at_per_s": at, "why": why,
            }),
            Outcome::CannotJudge { passed, at, why } => json!({
                "kind": "cannot_judge", "passed_per_s": passed, "at_per_s": at, "why": why,
            }),
        };
        v["said"] = json!(self.text(objectives));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objectives() -> Vec<Objective> {
        vec![
            Objective::parse("p99 < 5ms").unwrap(),
            Objective::parse("errors < 0.1%").unwrap(),
        ]
    }

    #[test]
    fn objectives_read_as_compare_writes_them_and_bad_ones_are_named() {
        let o = objectives();
        assert_eq!(o[0].figure, Figure::Latency("p99"));
        assert_eq!(o[0].limit, 5.0);
        assert_eq!(o[1].figure, Figure::ErrorRate);
        assert!((o[1].limit - 0.001).abs() < 1e-12);
        // A quantile is judged by the share of answers at or over its limit.
        assert!((o[0].bound() - 0.01).abs() < 1e-12);
        assert_eq!(o[0].counted_from_us(), 5000);
        let le = Objective::parse("p99.9 <= 20ms").unwrap();
        assert!(le.inclusive && (le.bound() - 0.001).abs() < 1e-12);
        assert_eq!(le.counted_from_us(), 20_001);
        let mean = Objective::parse("mean <= 2ms").unwrap();
        assert!(mean.within(2.0) && !mean.within(2.01));
        // Any duration, kept in ms.
        assert_eq!(Objective::parse("p99 < 1s").unwrap().limit, 1000.0);
        assert_eq!(Objective::parse("p50 < 250us").unwrap().limit, 0.25);
        assert_eq!(Objective::parse("errors < 100%").unwrap().limit, 1.0);
        for (bad, says) in [
            ("p99 > 5ms", "must stay below"),
            ("p98 < 5ms", "unknown figure"),
            ("p99 < 5", "needs a unit"),
            ("p99 < 5 parsecs", "duration"),
            ("errors < 3", "percentage"),
            ("errors < 200%", "cannot fail"),
            ("errors <= 100%", "cannot fail"),
            ("p99 < -1ms", "duration"),
            ("p99", "no comparison"),
        ] {
            let e = Objective::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_trial_passes_fails_or_straddles_on_its_intervals() {
        let o = objectives();
        let at = |p99: [f64; 2], errors: [f64; 2]| {
            judge(
                &o,
                &[
                    Measured {
                        value: p99[0],
                        interval: p99,
                    },
                    Measured {
                        value: errors[0],
                        interval: errors,
                    },
                ],
            )
        };
        // p99's figure: the share of answers at or over 5 ms (under 1% keeps it).
        assert_eq!(at([0.001, 0.005], [0.0, 0.0005]), Verdict::Pass);
        assert_eq!(at([0.02, 0.05], [0.0, 0.0]), Verdict::Fail(0));
        assert_eq!(at([0.001, 0.005], [0.002, 0.003]), Verdict::Fail(1));
        assert_eq!(at([0.005, 0.02], [0.0, 0.0]), Verdict::Straddle(0));
        // A failure outranks a straddle.
        assert_eq!(at([0.005, 0.02], [0.01, 0.02]), Verdict::Fail(1));
    }

    #[test]
    fn figures_and_their_intervals_come_from_the_windows() {
        let o = objectives();
        let window = |over: u64, errors: u64| WindowFigures {
            requests: 1000,
            errors,
            answered: 1000 - errors,
            latency_sum_ms: 1000.0,
            max_ms: 6.0,
            over: vec![over, 0],
        };
        let mut rng = ingressbench_stats::compare::Rng::new(7);
        // Every second alike: 0.5% over 5 ms, no error; the interval is the figure.
        let steady: Vec<WindowFigures> = (0..10).map(|_| window(5, 0)).collect();
        let m = measure(&o, &steady, 500, &mut rng);
        assert!((m[0].value - 0.005).abs() < 1e-12, "{m:?}");
        assert_eq!(m[0].interval, [m[0].value, m[0].value]);
        assert_eq!(judge(&o, &m), Verdict::Pass);
        // Half the seconds with 2% over: 1% in all, and an interval either side of it.
        let bursty: Vec<WindowFigures> = (0..20).map(|i| window(20 * (i % 2), 0)).collect();
        let m = measure(&o, &bursty, 500, &mut rng);
        assert!((m[0].value - 0.01).abs() < 1e-12, "{m:?}");
        assert!(m[0].interval[0] < 0.01 && m[0].interval[1] > 0.01, "{m:?}");
        assert_eq!(judge(&o, &m), Verdict::Straddle(0));
        // Errors in every second: wholly over 0.1%.
        let failing: Vec<WindowFigures> = (0..10).map(|_| window(0, 5)).collect();
        let m = measure(&o, &failing, 500, &mut rng);
        assert!((m[1].value - 0.005).abs() < 1e-12);
        assert_eq!(judge(&o, &m), Verdict::Fail(1));
    }

    #[test]
    fn a_windows_figures_count_what_its_objectives_need() {
        let o = objectives();
        let mut w = ingressbench_stats::Window::new(0, 1_000_000_000);
        for us in [1_000, 4_999, 5_000, 9_000] {
            w.latency.record_us(us);
            w.outcomes.add(ingressbench_stats::Outcome::Status(200));
        }
        w.outcomes.add(ingressbench_stats::Outcome::Refused);
        let f = WindowFigures::of(&w, &o);
        assert_eq!((f.requests, f.errors, f.answered), (5, 1, 4));
        assert_eq!(f.over, vec![2, 0]);
        assert!((f.max_ms - 9.0).abs() < 0.01, "{f:?}");
    }

    /// A steady system whose p99 crosses the objective at `capacity`: every trial's
    /// interval is on one side, except within `fuzz` of the knee, where it straddles.
    fn run(capacity: f64, bounds: Bounds, fuzz: f64) -> Search {
        let mut search = Search::new(bounds);
        while let Some((rate, _)) = search.next_rate() {
            let verdict = if rate < capacity * (1.0 - fuzz) {
                Verdict::Pass
            } else if rate > capacity * (1.0 + fuzz) {
                Verdict::Fail(0)
            } else {
                Verdict::Straddle(0)
            };
            search.record(rate, verdict);
            assert!(search.trials().len() < 50, "no end: {:?}", search.trials());
        }
        search
    }

    const BOUNDS: Bounds = Bounds {
        from: 1000.0,
        up_to: 100_000.0,
        precision: 0.05,
        repeats: 2,
        down_from: false,
    };

    #[test]
    fn a_trial_passes_only_on_what_it_measured() {
        let latency = vec![Objective::parse("p99 < 10ms").unwrap()];
        let window = |requests: u64, answered: u64| WindowFigures {
            requests,
            errors: requests - answered,
            answered,
            latency_sum_ms: answered as f64,
            max_ms: 1.0,
            over: vec![0],
        };
        let seen = GeneratorSeen {
            lag_p99_us: 10,
            latency_p99_us: 1000,
            cpu_share: Some(0.1),
            threads: 1,
        };
        let judged =
            |windows: Vec<WindowFigures>, o: &[Objective]| judge_trial(o, &windows, &seen, 1).1;
        // A dead target: every request refused, none answered. Not "0% slow".
        let dead = (0..20).map(|_| window(100, 0)).collect::<Vec<_>>();
        let verdict = judged(dead.clone(), &latency);
        assert!(
            matches!(&verdict, Verdict::NoAnswers(w) if w.contains("none of its 2000")),
            "{verdict:?}"
        );
        // A request never answered is over every limit: 5% unanswered breaks p99 < 10ms
        // though every answer was fast.
        let half = (0..20).map(|_| window(100, 95)).collect::<Vec<_>>();
        assert_eq!(judged(half, &latency), Verdict::Fail(0));
        // Too few requests for the quantile: p99.9 over 400 requests is no percentile.
        let p999 = vec![Objective::parse("p99.9 < 10ms").unwrap()];
        let few = (0..20).map(|_| window(20, 20)).collect::<Vec<_>>();
        assert!(matches!(judged(few, &p999), Verdict::CannotJudge(_)));
        assert!(matches!(
            judged(Vec::new(), &latency),
            Verdict::CannotJudge(_)
        ));
        // A search whose target stops answering ends there, claiming nothing past it.
        let mut search = Search::new(BOUNDS);
        search.record(1000.0, Verdict::Pass);
        search.record(2000.0, judged(dead, &latency));
        let outcome = search.outcome().expect("ended");
        assert!(
            matches!(outcome, Outcome::TargetStopped { passed: Some(p), .. } if *p == 1000.0),
            "{outcome:?}"
        );
        let json = outcome.to_json(&latency);
        assert_eq!(json["kind"], "target_stopped");
        assert!(json.get("capacity_per_s").is_none(), "{json}");
        assert!(
            json["said"]
                .as_str()
                .unwrap()
                .contains("stopped answering at 2000 req/s"),
            "{json}"
        );
        for v in [
            Verdict::NoAnswers("x".into()),
            Verdict::CannotJudge("y".into()),
        ] {
            assert_eq!(Verdict::from_json(&v.to_json()), Some(v));
        }
    }

    #[test]
    fn a_steady_system_is_bracketed_to_five_percent_in_at_most_ten_trials() {
        for capacity in [1500.0, 1999.0, 3100.0, 7777.0, 40_000.0] {
            let search = run(capacity, BOUNDS, 0.0);
            let Some(Outcome::Found {
                capacity: found,
                failed_at,
                broke,
            }) = search.outcome().cloned()
            else {
                panic!("{:?}", search.outcome());
            };
            assert!(
                found <= capacity && failed_at >= capacity,
                "{found} {failed_at}"
            );
            assert!((failed_at - found) / found <= 0.05);
            assert_eq!(broke, 0);
            // The doublings to the 2x bracket, then at most five bisections.
            let doublings = search
                .trials()
                .iter()
                .filter(|t| t.why != "bisecting")
                .count();
            let bisections = search.trials().len() - doublings;
            assert!(bisections <= 5, "{:?}", search.trials());
            if capacity < 2000.0 {
                assert!(search.trials().len() <= 10, "{:?}", search.trials());
            }
        }
    }

    #[test]
    fn straddles_are_repeated_a_bounded_number_of_times_then_count_as_failures() {
        let search = run(1600.0, BOUNDS, 0.03);
        let repeats = search
            .trials()
            .iter()
            .filter(|t| t.why == "repeat of a straddle")
            .count();
        assert!(repeats >= 2, "{:?}", search.trials());
        // The result says how many trials were spent and why, each counted once.
        let spent = search.spent();
        let n = search.trials().len();
        assert!(
            spent.starts_with(&format!("{n} trials (1 from, ")),
            "{spent}"
        );
        assert!(
            spent.ends_with(&format!("{repeats} repeats of a straddle)"))
                || spent.contains(&format!(", {repeats} repeats of a straddle, ")),
            "{spent}"
        );
        let counted: usize = spent[spent.find('(').unwrap() + 1..spent.len() - 1]
            .split(", ")
            .map(|p| p.split(' ').next().unwrap().parse::<usize>().unwrap())
            .sum();
        assert_eq!(counted, n, "{spent}");
        let Some(Outcome::Found { capacity, .. }) = search.outcome() else {
            panic!("{:?}", search.outcome());
        };
        // What is reported passed clearly.
        assert!(*capacity < 1600.0 * 0.97, "{capacity}");
    }

    #[test]
    fn a_repeat_is_judged_on_its_windows_and_those_of_the_straddles_it_repeats() {
        let window = |requests| WindowFigures {
            requests,
            ..WindowFigures::default()
        };
        let mut search = Search::new(BOUNDS);
        let mut pool = Pool::default();
        // The first trial: its own windows only.
        assert_eq!(pool.with(&search, &[window(1)]).len(), 1);
        search.record(1000.0, Verdict::Straddle(0));
        pool.keep(vec![window(1)]);
        // Its repeat: the straddle's windows and its own.
        let judged = pool.with(&search, &[window(2), window(2)]);
        assert_eq!(
            judged.iter().map(|w| w.requests).collect::<Vec<_>>(),
            [1, 2, 2]
        );
        assert_eq!(pool.trials(), 1);
        search.record(1000.0, Verdict::Straddle(0));
        pool.keep(vec![window(2), window(2)]);
        assert_eq!(pool.with(&search, &[window(3)]).len(), 4);
        assert_eq!(pool.trials(), 2);
        search.record(1000.0, Verdict::Pass);
        // The next rate starts afresh.
        assert_eq!(pool.with(&search, &[window(4)]).len(), 1);
        assert_eq!(pool.trials(), 0);
    }

    #[test]
    fn with_down_from_a_failing_from_is_halved_until_a_rate_passes_then_bisected() {
        let down = Bounds {
            down_from: true,
            ..BOUNDS
        };
        // A system that holds 300 req/s, searched from 1,000.
        let search = run(300.0, down, 0.0);
        let whys: Vec<&str> = search.trials().iter().map(|t| t.why).collect();
        assert_eq!(whys[..3], ["from", "halving down", "halving down"]);
        assert_eq!(search.trials()[2].rate, 250.0);
        assert!(whys[3..].iter().all(|w| *w == "bisecting"), "{whys:?}");
        let Some(Outcome::Found {
            capacity,
            failed_at,
            ..
        }) = search.outcome()
        else {
            panic!("{:?}", search.outcome());
        };
        assert!(
            *capacity <= 300.0 && *failed_at > 300.0,
            "{capacity} {failed_at}"
        );
        assert!((failed_at - capacity) / capacity <= 0.05);
        // A system that holds nothing: halved down to the lowest rate, and said so.
        let search = run(0.5, down, 0.0);
        let Some(Outcome::FromFails { lowest, from, .. }) = search.outcome() else {
            panic!("{:?}", search.outcome());
        };
        assert!(
            *lowest >= LOWEST_RATE && *lowest < 2.0 * LOWEST_RATE,
            "{lowest}"
        );
        assert_eq!(*from, 1000.0);
        assert_eq!(search.trials().len(), 10, "1,000 halved nine times to 1.95");
        let said = search.outcome().unwrap().text(&objectives());
        assert!(
            said.starts_with("no rate passes: every rate halving down to 1.953125 req/s fails"),
            "{said}"
        );
    }

    #[test]
    fn from_failing_up_to_passing_and_the_generator_end_the_search_saying_so() {
        let search = run(500.0, BOUNDS, 0.0);
        assert_eq!(
            search.outcome(),
            Some(&Outcome::FromFails {
                broke: 0,
                lowest: 1000.0,
                from: 1000.0
            })
        );
        assert_eq!(search.trials().len(), 1);
        let search = run(1e9, BOUNDS, 0.0);
        assert_eq!(search.outcome(), Some(&Outcome::AtLeast(100_000.0)));
        let mut search = Search::new(BOUNDS);
        search.record(1000.0, Verdict::Pass);
        search.record(
            2000.0,
            Verdict::GeneratorLimited("lateness p99 3 ms".into()),
        );
        assert_eq!(search.next_rate(), None);
        assert!(search
            .outcome()
            .unwrap()
            .to_string()
            .starts_with("limited by the generator at 2000 req/s"));
        // Inside a bracket: the bracket is said with it.
        let mut search = Search::new(BOUNDS);
        search.record(1000.0, Verdict::Pass);
        search.record(2000.0, Verdict::Fail(0));
        search.record(1500.0, Verdict::GeneratorLimited("lag".into()));
        let said = search.outcome().unwrap().to_string();
        assert!(
            said.ends_with("(lag); before it 1000 req/s passed and 2000 req/s failed, the limit between them not narrowed to the precision"),
            "{said}"
        );
        assert_eq!(
            search.outcome().unwrap().to_json(&objectives())["failed_at_per_s"],
            2000.0
        );
    }

    #[test]
    fn a_search_resumed_from_its_trials_goes_on_where_it_stopped() {
        let whole = run(3100.0, BOUNDS, 0.0);
        let cut = &whole.trials()[..4];
        let mut resumed = Search::resumed(BOUNDS, cut);
        assert_eq!(
            resumed.next_rate().map(|r| r.0),
            Some(whole.trials()[4].rate)
        );
        while let Some((rate, _)) = resumed.next_rate() {
            let verdict = whole
                .trials()
                .iter()
                .find(|t| t.rate == rate)
                .unwrap()
                .verdict
                .clone();
            resumed.record(rate, verdict);
        }
        assert_eq!(resumed.outcome(), whole.outcome());
    }

    #[test]
    fn a_failure_is_the_generators_only_when_its_lag_or_cpu_explains_it() {
        let seen = |lag_p99_us, latency_p99_us, cpu_share, threads| GeneratorSeen {
            lag_p99_us,
            latency_p99_us,
            cpu_share,
            threads,
        };
        // A busy machine: 1.4 ms of lag beside a p99 of 4 s is the target's queue.
        assert_eq!(behind(&seen(1_427, 3_973_000, Some(0.2), 1)), None);
        // Lag that is most of the latency, or a generator out of CPU, is its own limit.
        assert!(behind(&seen(50_000, 60_000, Some(0.5), 1))
            .unwrap()
            .starts_with("scheduler lag p99 50000 us"));
        assert!(behind(&seen(500, 1_000, Some(0.95), 2))
            .unwrap()
            .contains("95% of 2 threads"));
        assert_eq!(behind(&seen(900, 1_000, Some(0.5), 1)), None);
        assert_eq!(behind(&seen(900, 1_000, None, 1)), None);
    }

    #[test]
    fn a_search_block_is_refused_with_the_field_and_the_fix() {
        let file = |slo: &[&str], from: f64, up_to: f64, precision: &str, trial: &str| {
            crate::model::SearchFile {
                slo: slo.iter().map(|s| s.to_string()).collect(),
                from,
                up_to,
                precision: precision.into(),
                trial: trial.into(),
                repeats: 2,
                down_from: false,
            }
        };
        let good = SearchPlan::of(&file(&["p99 < 5ms"], 500.0, 1000.0, "5%", "20s")).unwrap();
        assert_eq!(good.window(), std::time::Duration::from_secs(1));
        assert!((good.bounds.precision - 0.05).abs() < 1e-12);
        for (bad, says) in [
            (
                file(&[], 500.0, 1000.0, "5%", "20s"),
                "search.slo: give at least one",
            ),
            (
                file(&["p99 > 5ms"], 500.0, 1000.0, "5%", "20s"),
                "search.slo: objective",
            ),
            (
                file(&["p99 < 5ms"], 0.0, 1000.0, "5%", "20s"),
                "search.from 0",
            ),
            (
                file(&["p99 < 5ms"], 2000.0, 1000.0, "5%", "20s"),
                "at most up_to",
            ),
            (
                file(&["p99 < 5ms"], 500.0, 1000.0, "5", "20s"),
                "search.precision 5",
            ),
            (
                file(&["p99 < 5ms"], 500.0, 1000.0, "5%", "1s"),
                "search.trial 1s: at least",
            ),
        ] {
            let e = SearchPlan::of(&bad).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
    }

    #[test]
    fn a_trial_too_small_for_its_objectives_is_named() {
        let plan = SearchPlan {
            objectives: objectives(),
            bounds: Bounds {
                from: 500.0,
                up_to: 1000.0,
                precision: 0.05,
                repeats: 2,
                down_from: false,
            },
            trial: std::time::Duration::from_secs(2),
        };
        // 1,000 requests: 10 may break p99 (enough), 1 breaks errors < 0.1%.
        let said = plan.too_small_at(500.0);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("`errors < 0.1%`"), "{said:?}");
        assert!(plan.too_small_at(10_000.0).is_empty());
    }

    #[test]
    fn verdicts_and_outcomes_read_back_as_written() {
        let o = objectives();
        for v in [
            Verdict::Pass,
            Verdict::Fail(1),
            Verdict::Straddle(0),
            Verdict::GeneratorLimited("lag".into()),
        ] {
            assert_eq!(Verdict::from_json(&v.to_json()), Some(v.clone()));
        }
        assert_eq!(Verdict::from_json(&serde_json::json!({"kind": "x"})), None);
        let found = Outcome::Found {
            capacity: 3000.0,
            failed_at: 3125.0,
            broke: 0,
        };
        let j = found.to_json(&o);
        assert_eq!(j["capacity_per_s"], 3000.0);
        assert_eq!(j["broke"], "p99 < 5ms");
        assert!(j["said"]
            .as_str()
            .unwrap()
            .contains("3125 req/s broke p99 < 5ms"));
    }
}
