//! A trial's verdict: its figures judged against the objectives on their intervals,
//! only on what it measured (no answers, or too few for a quantile, is no verdict), and
//! the generator's own limits told from the system's; the windows a repeat pools. The
//! search that runs trials is the parent module's.

use ingressbench_results::capacity as record;

use super::{measure, named, Measured, Objective, Search, WindowFigures};

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

/// Scheduler lag p99 over which the generator is behind its own schedule, in us (as the
/// load's own GENERATOR FELL BEHIND warning).
pub const LAG_LIMIT_US: u64 = 1000;
/// And the share of the trial's own latency p99 its lag must reach to explain a failure
/// (on a busy machine the lag passes 1 ms at any rate; a p99 of seconds is not its doing).
const LAG_SHARE: f64 = 0.1;
/// The share of its threads' time over which the generator is out of CPU.
const CPU_LIMIT: f64 = 0.9;
/// The share over which a generator sending at or past its ceiling is working at it: a
/// one-second ceiling step can fall behind on a stall of the machine (7 ms of lag at
/// 8,000 req/s with the thread half idle, seen in CI), and a trial whose generator idles
/// beside a target's backlog of seconds is the target's whatever that step said.
const BUSY_PAST_CEILING: f64 = 0.5;
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
    /// The rate at which the generator alone fell behind (its ceiling, measured against
    /// the echo backend), when the trial was sent at or past it; none otherwise or when
    /// not measured.
    pub past_ceiling: Option<f64>,
}

/// The evidence that the generator, not the target, made a trial fail: its CPU, a
/// scheduler lag over [`LAG_LIMIT_US`] that is a real share of the latency judged, or a
/// rate at or past the one it fell behind at alone with its thread busy (over
/// [`BUSY_PAST_CEILING`]): against a fast echo backend it could not keep that rate, so
/// against the target the trial cannot show the target's limit (CI saw such a trial's
/// requests wait seconds for its 20 connections with the pacer on time, 1.1 ms of lag,
/// and its thread 89% busy).
pub fn behind(seen: &GeneratorSeen) -> Option<String> {
    let GeneratorSeen {
        lag_p99_us,
        latency_p99_us,
        cpu_share,
        past_ceiling,
        ..
    } = *seen;
    let lag = lag_p99_us > LAG_LIMIT_US && lag_p99_us as f64 >= LAG_SHARE * latency_p99_us as f64;
    let out_of_cpu = cpu_share.is_some_and(|c| c > CPU_LIMIT);
    let past_ceiling = past_ceiling.filter(|_| cpu_share.is_some_and(|c| c > BUSY_PAST_CEILING));
    (lag || out_of_cpu || past_ceiling.is_some()).then(|| {
        let past = past_ceiling.map_or(String::new(), |at| {
            format!(", at or past the {at:.0} req/s the generator alone fell behind at")
        });
        format!("{}{past}", evidence(seen))
    })
}

/// The generator's lag and CPU in words: `scheduler lag p99 680 us (limit 1000), its
/// CPU 93% of 1 thread`.
pub fn evidence(seen: &GeneratorSeen) -> String {
    let cpu = match seen.cpu_share {
        Some(c) => format!(
            ", its CPU {:.0}% of {} thread{}",
            c * 100.0,
            seen.threads,
            if seen.threads == 1 { "" } else { "s" }
        ),
        None => String::new(),
    };
    format!(
        "scheduler lag p99 {} us (limit {LAG_LIMIT_US}){cpu}",
        seen.lag_p99_us
    )
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

    /// Judges the trial `search` runs next, at `rate`, on its `own` windows (with those
    /// of the straddles it repeats; its own are kept if it straddles too), and records
    /// the verdict in `search`: the step of a trial that `ingressbench capacity` and a
    /// scenario's search share, whatever ran the trial.
    pub fn judge_next(
        &mut self,
        search: &mut Search,
        (objectives, rate): (&[Objective], f64),
        own: Vec<WindowFigures>,
        seen: &GeneratorSeen,
        seed: u64,
    ) -> Judged {
        let windows = self.with(search, &own);
        let pooled = self.trials();
        let (figures, verdict) = judge_trial(objectives, &windows, seen, seed);
        if matches!(verdict, Verdict::Straddle(_)) {
            self.keep(own);
        }
        search.record(rate, verdict.clone());
        Judged {
            figures,
            verdict,
            pooled,
        }
    }
}

/// A trial's verdict and what it rests on.
#[derive(Clone, Debug)]
pub struct Judged {
    /// Each objective's figure with its interval.
    pub figures: Vec<Measured>,
    /// The verdict.
    pub verdict: Verdict,
    /// How many earlier trials' windows were judged with its own (a repeat's).
    pub pooled: usize,
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
    pub fn record(&self) -> record::Verdict {
        match self.clone() {
            Verdict::Pass => record::Verdict::Pass,
            Verdict::Fail(objective) => record::Verdict::Fail { objective },
            Verdict::Straddle(objective) => record::Verdict::Straddle { objective },
            Verdict::GeneratorLimited(why) => record::Verdict::Generator { why },
            Verdict::NoAnswers(why) => record::Verdict::NoAnswers { why },
            Verdict::CannotJudge(why) => record::Verdict::CannotJudge { why },
        }
    }

    /// Read back from [`Verdict::record`].
    pub fn from_record(v: &record::Verdict) -> Self {
        match v.clone() {
            record::Verdict::Pass => Verdict::Pass,
            record::Verdict::Fail { objective } => Verdict::Fail(objective),
            record::Verdict::Straddle { objective } => Verdict::Straddle(objective),
            record::Verdict::Generator { why } => Verdict::GeneratorLimited(why),
            record::Verdict::NoAnswers { why } => Verdict::NoAnswers(why),
            record::Verdict::CannotJudge { why } => Verdict::CannotJudge(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::objective::tests::objectives;
    use super::*;

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
    fn a_failure_is_the_generators_only_when_its_lag_cpu_or_ceiling_explains_it() {
        let seen = |lag_p99_us, latency_p99_us, cpu_share, threads| GeneratorSeen {
            lag_p99_us,
            latency_p99_us,
            cpu_share,
            threads,
            past_ceiling: None,
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
        // A backlog of seconds with the pacer on time and the thread under 90%: the
        // target's, unless the rate is one the generator alone could not keep.
        let backlog = seen(1_142, 1_508_000, Some(0.89), 1);
        assert_eq!(behind(&backlog), None);
        let past = GeneratorSeen {
            past_ceiling: Some(200_000.0),
            ..backlog
        };
        assert!(behind(&past)
            .unwrap()
            .ends_with("at or past the 200000 req/s the generator alone fell behind at"));
        // Past a ceiling that a stall of the machine set, the generator idle beside the
        // target's backlog: the target's.
        let idle = GeneratorSeen {
            past_ceiling: Some(8_000.0),
            ..seen(2_937, 7_442_000, Some(0.13), 1)
        };
        assert_eq!(behind(&idle), None);
    }
}
