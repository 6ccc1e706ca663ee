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
//! A trial passes only on what it measured: a request never answered counts over every
//! latency limit, a trial nothing answered ends the search (the target stopped
//! answering), and one too small for its quantile is no verdict.
//!
//! Here: the search (its bounds and its state) and a scenario's `search:` plan. The
//! objectives and a trial's figures are in `objective`, the verdict on them in `trial`,
//! where a search ended (in words and as results keep it) in `outcome`; what a trial is
//! (a cell of a run, with the scenario's events) is the runner's.

mod objective;
mod outcome;
mod trial;

pub use objective::{describe, measure, Figure, Measured, Objective, WindowFigures};
use outcome::named;
pub use outcome::{figure_records, Outcome};
pub use trial::{
    behind, evidence, judge, judge_trial, pooled_text, GeneratorSeen, Judged, Pool, Verdict,
    LAG_LIMIT_US,
};

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

impl Bounds {
    /// As results keep them.
    pub fn record(&self) -> ingressbench_results::capacity::Bounds {
        ingressbench_results::capacity::Bounds {
            from: self.from,
            up_to: self.up_to,
            precision: self.precision,
            repeats: self.repeats,
            down_from: self.down_from,
        }
    }
}

/// Why a trial is run: again at the rate whose trial was the generator's, once.
const REPEAT_OF_LIMITED: &str = "repeat of a generator-limited trial";

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
    /// Whether the last trial was the generator's and its rate has not been repeated for
    /// that yet: it is run again, once a rate. A stall of the machine (a virtual
    /// machine's stolen time) makes one trial late and passes; a generator short of CPU
    /// is late again.
    limited_once: bool,
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
            limited_once: false,
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
        if self.limited_once {
            let last = self.trials.last()?;
            return Some((last.rate, REPEAT_OF_LIMITED));
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
        self.limited_once = false;
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
            // A trial of the generator's breaks a streak of straddles: the repeat after it
            // is judged on its own windows (see `Pool`), so a straddle there starts a
            // streak of its own. One such repeat a rate keeps the search bounded.
            Verdict::GeneratorLimited(_) if !self.repeated_for_generator(rate) => {
                self.limited_once = true;
                self.straddles = 0;
                return;
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

    /// Whether a trial at `rate` was already a repeat of a generator-limited one.
    fn repeated_for_generator(&self, rate: f64) -> bool {
        (self.trials.iter()).any(|t| t.rate == rate && t.why == REPEAT_OF_LIMITED)
    }

    /// The straddles in a row that end the trials so far: the last trial's and the
    /// repeats of a straddle before it, back to the one that started the streak.
    fn straddles_in_a_row(&self) -> usize {
        let mut n = 0;
        for t in self.trials.iter().rev() {
            if !matches!(t.verdict, Verdict::Straddle(_)) {
                break;
            }
            n += 1;
            if t.why != "repeat of a straddle" {
                break;
            }
        }
        n
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
            Verdict::GeneratorLimited(_) if self.limited_once => {
                format!("{text}: run again (a stall of the machine passes, a generator short of CPU does not)")
            }
            Verdict::Straddle(_) if self.straddles > 0 => format!("{text}: run again"),
            Verdict::Straddle(_) => format!(
                "{text} {} times in a row: counted as a failure",
                self.straddles_in_a_row()
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
                (REPEAT_OF_LIMITED, n) if n > 1 => {
                    format!("{n} repeats of a generator-limited trial")
                }
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

#[cfg(test)]
mod tests {
    use super::objective::tests::objectives;
    use super::*;

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
            past_ceiling: None,
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
        let json = serde_json::to_value(outcome.record(&latency)).unwrap();
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
            assert_eq!(round_trip(&v), v);
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
        let late = Verdict::GeneratorLimited("lateness p99 3 ms".into());
        search.record(2000.0, late.clone());
        // Once is run again: a stall of the machine passes.
        assert_eq!(search.outcome(), None);
        assert_eq!(
            search.next_rate(),
            Some((2000.0, "repeat of a generator-limited trial"))
        );
        assert!(search.last_said(&objectives()).ends_with("does not)"));
        search.record(2000.0, Verdict::Pass);
        assert_eq!(search.next_rate(), Some((4000.0, "doubling")));
        // Twice in a row ends the search.
        search.record(4000.0, late.clone());
        search.record(4000.0, late);
        assert_eq!(search.next_rate(), None);
        assert!(search
            .outcome()
            .unwrap()
            .to_string()
            .starts_with("limited by the generator at 4000 req/s"));
        // Inside a bracket: the bracket is said with it.
        let mut search = Search::new(BOUNDS);
        search.record(1000.0, Verdict::Pass);
        search.record(2000.0, Verdict::Fail(0));
        search.record(1500.0, Verdict::GeneratorLimited("lag".into()));
        search.record(1500.0, Verdict::GeneratorLimited("lag".into()));
        let said = search.outcome().unwrap().to_string();
        assert!(
            said.ends_with("(lag); before it 1000 req/s passed and 2000 req/s failed, the limit between them not narrowed to the precision"),
            "{said}"
        );
        assert_eq!(
            serde_json::to_value(search.outcome().unwrap().record(&objectives())).unwrap()
                ["failed_at_per_s"],
            2000.0
        );
    }

    #[test]
    fn a_trial_of_the_generators_breaks_a_streak_of_straddles_once_a_rate() {
        let mut search = Search::new(BOUNDS);
        let late = || Verdict::GeneratorLimited("lag".into());
        search.record(1000.0, Verdict::Pass);
        search.record(2000.0, Verdict::Straddle(0));
        search.record(2000.0, Verdict::Straddle(0));
        search.record(2000.0, late());
        // Its repeat straddles: a streak of its own starts, with every repeat.
        search.record(2000.0, Verdict::Straddle(0));
        assert!(search.last_said(&objectives()).ends_with(": run again"));
        search.record(2000.0, Verdict::Straddle(0));
        assert_eq!(search.next_rate(), Some((2000.0, "repeat of a straddle")));
        // The generator again at that rate: no second repeat for it, the search ends.
        search.record(2000.0, late());
        assert_eq!(search.next_rate(), None);
        assert!(search
            .outcome()
            .unwrap()
            .to_string()
            .starts_with("limited by the generator at 2000 req/s"));
        // A streak that is spent says how many it was, all of them in a row.
        let mut search = Search::new(BOUNDS);
        search.record(1000.0, Verdict::Pass);
        search.record(2000.0, Verdict::Straddle(0));
        search.record(2000.0, late());
        for _ in 0..3 {
            search.record(2000.0, Verdict::Straddle(0));
        }
        let said = search.last_said(&objectives());
        assert!(
            said.ends_with(" 3 times in a row: counted as a failure"),
            "{said}"
        );
        assert_eq!(search.next_rate(), Some((1500.0, "bisecting")));
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
        assert_eq!(
            ingressbench_load::trial_window(good.trial),
            std::time::Duration::from_secs(1)
        );
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

    /// `v` written to JSON and read back.
    fn round_trip(v: &Verdict) -> Verdict {
        let text = serde_json::to_string(&v.record()).unwrap();
        Verdict::from_record(&serde_json::from_str(&text).unwrap())
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
            assert_eq!(round_trip(&v), v);
        }
        assert!(
            serde_json::from_value::<ingressbench_results::capacity::Verdict>(
                serde_json::json!({"kind": "x"})
            )
            .is_err()
        );
        let found = Outcome::Found {
            capacity: 3000.0,
            failed_at: 3125.0,
            broke: 0,
        };
        let j = serde_json::to_value(found.record(&o)).unwrap();
        assert_eq!(j["capacity_per_s"], 3000.0);
        assert_eq!(j["broke"], "p99 < 5ms");
        assert!(j["said"]
            .as_str()
            .unwrap()
            .contains("3125 req/s broke p99 < 5ms"));
    }
}
