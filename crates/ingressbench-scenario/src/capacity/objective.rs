//! A capacity search's objectives (`p99 < 5ms`, `errors < 0.1%`) and the figures a
//! trial gives them: what one window of its load holds for them, each objective's figure
//! over the windows with a bootstrap interval, and those in words. The verdict on the
//! figures, and the search that asks for trials, are the parent module's.

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
    pub(super) fn quantile(&self) -> Option<f64> {
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
    pub(super) fn within(&self, x: f64) -> bool {
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::capacity::{judge, Verdict};

    /// `p99 < 5ms` and `errors < 0.1%`.
    pub(crate) fn objectives() -> Vec<Objective> {
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
}
