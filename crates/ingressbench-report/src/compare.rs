//! `compare`: two runs (or two targets of one run) side by side, each difference with its
//! interval and verdict, and `--fail-if` conditions that gate a change in CI.

use crate::analysis::{compare_pair, metric_index, Condition, Difference, METRICS};
use crate::results::RunResults;

/// Pairs of conditions to compare: `(baseline, other)`.
pub fn pairs<'a>(a: &'a [Condition], b: &'a [Condition]) -> Vec<(&'a Condition, &'a Condition)> {
    let mut out = Vec::new();
    for x in a {
        // The same target at the same settings; else, when each side has one target at
        // these settings, those two (an upgrade compared with itself under a new name).
        let same = b
            .iter()
            .find(|y| y.target == x.target && y.settings == x.settings);
        let only = || {
            let here: Vec<&Condition> = a.iter().filter(|c| c.settings == x.settings).collect();
            let there: Vec<&Condition> = b.iter().filter(|c| c.settings == x.settings).collect();
            (here.len() == 1 && there.len() == 1).then(|| there[0])
        };
        if let Some(y) = same.or_else(only) {
            out.push((x, y));
        }
    }
    out
}

/// Why a comparison of `a` (from the runs `a_runs`) with `b` (from `b_runs`) cannot be
/// trusted to judge: a run that did not complete, a cell recorded as done whose files
/// cannot be read (its figures would be missing from its condition's), a condition
/// measured on one side only, a metric that `metrics` need and that is not a number on
/// either side of a pair. A gate must fail on any of these rather than pass on what is
/// missing.
pub fn cannot_judge(
    runs: &[&RunResults],
    (a, b): (&[&Condition], &[&Condition]),
    pairs: &[(&Condition, &Condition)],
    metrics: &[usize],
) -> Vec<String> {
    let mut why = Vec::new();
    for run in runs {
        let status = run.record.status();
        if status != "complete" {
            why.push(format!("{} is {status}, not complete", run.dir.display()));
        }
        for cell in run.cells.iter().filter(|c| !c.unreadable.is_empty()) {
            why.push(format!(
                "{}: {} was recorded as {} but cannot be read: {}",
                run.dir.display(),
                cell.label(),
                cell.status,
                cell.unreadable.join("; ")
            ));
        }
    }
    let at = |c: &Condition| {
        if c.settings.is_empty() {
            c.target.clone()
        } else {
            format!("{} at {}", c.target, c.settings)
        }
    };
    for c in a {
        if !pairs.iter().any(|(x, _)| std::ptr::eq(*x, *c)) {
            why.push(format!("{} was measured in the baseline only", at(c)));
        }
    }
    for c in b {
        if !pairs.iter().any(|(_, y)| std::ptr::eq(*y, *c)) {
            why.push(format!("{} was measured in the other run only", at(c)));
        }
    }
    for (x, y) in pairs {
        for &m in metrics {
            for (side, c) in [("baseline", x), ("other run", y)] {
                if !c.metrics[m].value.is_finite() {
                    why.push(format!(
                        "{} of {} in the {side} cannot be computed (its summary lacks it or is not a number)",
                        METRICS[m].0,
                        at(c)
                    ));
                }
            }
        }
    }
    why
}

/// Every difference of every pair.
pub fn compare(pairs: &[(&Condition, &Condition)], noise_floor: f64) -> Vec<Difference> {
    pairs
        .iter()
        .flat_map(|(a, b)| compare_pair(a, b, noise_floor))
        .collect()
}

/// A `--fail-if` condition: `p99 > +10%` (the relative difference), `errors > 0` or
/// `p99 > 5` (B's own value, in the metric's unit).
#[derive(Clone, Debug, PartialEq)]
pub struct FailIf {
    /// The text as given.
    pub text: String,
    /// Which metric (index into [`METRICS`]).
    pub metric: usize,
    /// The comparison.
    pub op: Op,
    /// The threshold.
    pub value: f64,
    /// Whether the threshold is a relative change (a fraction) or B's value.
    pub relative: bool,
    /// It gates a capacity search's result (`capacity < -10%`), not a metric of cells
    /// (`metric` is then unused): see [`crate::capacity::compare`].
    pub capacity: bool,
}

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `<`
    Lt,
    /// `<=`
    Le,
}

impl Op {
    /// Whether `x OP y`.
    pub fn holds(self, x: f64, y: f64) -> bool {
        match self {
            Op::Gt => x > y,
            Op::Ge => x >= y,
            Op::Lt => x < y,
            Op::Le => x <= y,
        }
    }
}

impl std::str::FromStr for FailIf {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            let metrics: Vec<&str> = METRICS.iter().map(|m| m.0).collect();
            format!(
                "--fail-if `{text}`: {why}; write METRIC OP VALUE, e.g. 'p99 > +10%' (relative to the baseline) or 'errors > 0' (the new value), with METRIC one of {}, capacity and OP one of > >= < <=",
                metrics.join(", ")
            )
        };
        let t = text.trim();
        let at = t.find(['>', '<']).ok_or_else(|| bad("no comparison"))?;
        let (metric, rest) = t.split_at(at);
        let (op, value) = if let Some(v) = rest.strip_prefix(">=") {
            (Op::Ge, v)
        } else if let Some(v) = rest.strip_prefix("<=") {
            (Op::Le, v)
        } else if let Some(v) = rest.strip_prefix('>') {
            (Op::Gt, v)
        } else {
            (Op::Lt, &rest[1..])
        };
        let capacity = metric.trim() == "capacity";
        let metric = match capacity {
            true => 0,
            false => metric_index(metric.trim()).ok_or_else(|| bad("unknown metric"))?,
        };
        let value = value.trim();
        let (number, relative) = match value.strip_suffix('%') {
            Some(n) => (n.trim(), true),
            None => (value.strip_suffix("ms").unwrap_or(value).trim(), false),
        };
        let number: f64 = number
            .parse()
            .map_err(|_| bad("the value is not a number"))?;
        if !number.is_finite() {
            return Err(bad("the value is not a number"));
        }
        if capacity && !relative {
            return Err(bad(
                "a capacity is gated on its change from the baseline's, e.g. 'capacity < -10%'",
            ));
        }
        Ok(FailIf {
            text: t.to_owned(),
            metric,
            op,
            value: if relative { number / 100.0 } else { number },
            relative,
            capacity,
        })
    }
}

impl FailIf {
    /// The differences for which the condition holds, each with why.
    pub fn holds_for(
        &self,
        diffs: &[Difference],
        pairs: &[(&Condition, &Condition)],
    ) -> Vec<String> {
        if self.capacity {
            return Vec::new();
        }
        let name = METRICS[self.metric].0;
        let mut out = Vec::new();
        for (d, (_, b)) in diffs.iter().filter(|d| d.metric == name).zip(pairs.iter()) {
            let (x, shown) = if self.relative {
                (d.relative.value, crate::analysis::percent(&d.relative))
            } else {
                let v = b.metrics[self.metric].value;
                (v, format!("{v}"))
            };
            // From zero errors to some is an infinite rise.
            let x = if self.relative && !x.is_finite() && b.metrics[self.metric].value > 0.0 {
                f64::INFINITY
            } else {
                x
            };
            if self.op.holds(x, self.value) {
                out.push(format!(
                    "{} {} vs {}{}: {name} {shown}",
                    self.text,
                    d.other,
                    d.baseline,
                    if d.settings.is_empty() {
                        String::new()
                    } else {
                        format!(" at {}", d.settings)
                    }
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_parse_as_written() {
        let f: FailIf = "p99 > +10%".parse().unwrap();
        assert_eq!((f.metric, f.op, f.relative), (2, Op::Gt, true));
        assert!((f.value - 0.1).abs() < 1e-12);
        let f: FailIf = "errors>0".parse().unwrap();
        assert_eq!(
            (f.metric, f.op, f.value, f.relative),
            (5, Op::Gt, 0.0, false)
        );
        let f: FailIf = "p99.9 <= -5%".parse().unwrap();
        assert_eq!((f.metric, f.op), (3, Op::Le));
        let f: FailIf = "mean >= 2ms".parse().unwrap();
        assert_eq!((f.value, f.relative), (2.0, false));
        let f: FailIf = "capacity < -10%".parse().unwrap();
        assert!(f.capacity && f.relative && (f.value + 0.1).abs() < 1e-12);
        assert!("capacity < 500"
            .parse::<FailIf>()
            .unwrap_err()
            .contains("change from the baseline"));
        for bad in ["p99", "p98 > 1", "p99 > lots", "> 5", "p99 = 5"] {
            let e = bad.parse::<FailIf>().unwrap_err();
            assert!(e.contains("write METRIC OP VALUE"), "{bad}: {e}");
        }
    }
}
