//! From cells to conclusions: cells with the same target and settings form a condition;
//! each condition's metrics get 95% intervals (bootstrap over repeats, or over one-second
//! windows when there is one repeat); conditions with the same settings are compared to
//! the first target, each difference with its interval and a verdict.

use ingressbench_stats::compare::{
    bootstrap, interval, mann_whitney, mean, relative_difference, Estimate, Rng, Verdict,
    ITERATIONS,
};
use serde_json::{json, Value};

use crate::results::{CellResults, RunResults};
use ingressbench_results::hlog::Interval;

/// The metrics compared, in order: name, unit, where in summary.json.
pub const METRICS: [(&str, &str, &[&str]); 6] = [
    ("mean", "ms", &["latency_us", "mean"]),
    ("p50", "ms", &["latency_us", "p50"]),
    ("p99", "ms", &["latency_us", "p99"]),
    ("p99.9", "ms", &["latency_us", "p999"]),
    ("max", "ms", &["latency_us", "max"]),
    ("errors", "", &["requests", "errors"]),
];

/// The index of a metric by name (`p99`), if there is one.
pub fn metric_index(name: &str) -> Option<usize> {
    let name = if name == "p999" { "p99.9" } else { name };
    METRICS.iter().position(|m| m.0 == name)
}

/// One target at one combination of settings, over its repeats.
#[derive(Debug)]
pub struct Condition {
    /// The target the condition judges, by its label.
    pub target: String,
    /// The settings label (`load.rate=500`), empty without a matrix.
    pub settings: String,
    /// Indices (into the run's cells) of its finished cells, in repeat order.
    pub cells: Vec<usize>,
    /// Each metric (see [`METRICS`]) with its interval; latency in ms.
    pub metrics: Vec<Estimate>,
    /// Bootstrap draws per metric, for differences.
    pub draws: Vec<Vec<f64>>,
    /// Per-unit values of p99 (repeats or windows), for the rank test.
    pub units_p99: Vec<f64>,
    /// What the intervals were resampled over.
    pub basis: &'static str,
    /// Requests measured over all repeats.
    pub requests: f64,
}

/// A difference between two conditions in one metric.
#[derive(Debug, Clone)]
pub struct Difference {
    /// The metric's name.
    pub metric: &'static str,
    /// The baseline condition's target.
    pub baseline: String,
    /// The other condition's target.
    pub other: String,
    /// The settings both share.
    pub settings: String,
    /// B / A - 1 with its interval.
    pub relative: Estimate,
    /// Mann-Whitney p-value over the units (p99 only; 1 otherwise).
    pub p_value: f64,
    /// What it means.
    pub verdict: Verdict,
}

/// Builds the conditions of a run, in order of first appearance.
pub fn conditions(run: &RunResults, seed: u64) -> Vec<Condition> {
    let mut order: Vec<(String, String)> = Vec::new();
    for cell in run.cells.iter().filter(|c| c.summary.is_some()) {
        let key = (cell.target.clone(), cell.settings_label());
        if !order.contains(&key) {
            order.push(key);
        }
    }
    let mut rng = Rng::new(seed);
    order
        .into_iter()
        .map(|(target, settings)| {
            let cells: Vec<&CellResults> = run
                .cells
                .iter()
                .filter(|c| {
                    c.summary.is_some() && c.target == target && c.settings_label() == settings
                })
                .collect();
            condition(target, settings, &cells, &mut rng)
        })
        .collect()
}

fn condition(target: String, settings: String, cells: &[&CellResults], rng: &mut Rng) -> Condition {
    let scale = |i: usize| if METRICS[i].1 == "ms" { 1e-3 } else { 1.0 };
    let requests: f64 = cells
        .iter()
        .filter_map(|c| c.number(&["requests", "total"]))
        .sum();
    let indices = cells.iter().map(|c| c.index).collect();
    // Three repeats or more: each repeat is a unit. Fewer: the one-second windows of
    // every repeat are (bootstrapping two values says little).
    let windows: Vec<&Interval> = cells
        .iter()
        .flat_map(|c| c.windows.iter().filter(|w| w.histogram.count() > 0))
        .collect();
    if cells.len() >= 3 || windows.len() < 2 {
        // Over repeats: each repeat's value is one unit; the interval is of their mean.
        let mut metrics = Vec::new();
        let mut draws = Vec::new();
        let mut units_p99 = Vec::new();
        for (i, (_, _, path)) in METRICS.iter().enumerate() {
            // A cell without the figure makes it unknown (NaN), never the mean of the rest.
            let values: Vec<f64> = cells
                .iter()
                .map(|c| c.number(path).map_or(f64::NAN, |v| v * scale(i)))
                .collect();
            let all: Vec<&f64> = values.iter().collect();
            let d = bootstrap(&values, ITERATIONS, rng, mean);
            metrics.push(interval(mean(&all), &d, 0.95));
            draws.push(d);
            if METRICS[i].0 == "p99" {
                units_p99 = values;
            }
        }
        return Condition {
            target,
            settings,
            cells: indices,
            metrics,
            draws,
            units_p99,
            basis: if cells.len() >= 2 {
                "repeats"
            } else {
                "none (one run, under two windows)"
            },
            requests,
        };
    }
    // Resample the windows. Errors are counted (a mean per run), not estimated.
    let sparse: Vec<Vec<(u64, u64)>> = windows
        .iter()
        .map(|w| {
            w.histogram
                .as_hdr()
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect()
        })
        .collect();
    let mut merger = Merger::new(&sparse);
    let measured = merger.stats(0..sparse.len());
    let mut draws: Vec<Vec<f64>> = vec![Vec::with_capacity(ITERATIONS); METRICS.len()];
    let draw_count = ITERATIONS / 2;
    let mut draw: Vec<usize> = Vec::with_capacity(sparse.len());
    for _ in 0..draw_count {
        draw.clear();
        draw.extend((0..sparse.len()).map(|_| rng.below(sparse.len())));
        let s = merger.stats(draw.iter().copied());
        for (i, v) in s.iter().enumerate() {
            draws[i].push(*v);
        }
    }
    // A cell without an error count makes the count unknown (NaN), not zero.
    let errors = cells
        .iter()
        .map(|c| c.number(&["requests", "errors"]).unwrap_or(f64::NAN))
        .sum::<f64>()
        / cells.len() as f64;
    let mut metrics: Vec<Estimate> = (0..5)
        .map(|i| interval(measured[i], &draws[i], 0.95))
        .collect();
    metrics.push(Estimate {
        value: errors,
        low: errors,
        high: errors,
    });
    draws[5] = vec![errors; draw_count];
    let units_p99 = windows
        .iter()
        .map(|w| w.histogram.value_at_percentile(99.0) as f64 * 1e-3)
        .collect();
    Condition {
        target,
        settings,
        cells: indices,
        metrics,
        draws,
        units_p99,
        basis: "one-second windows",
        requests,
    }
}

/// Sparse histograms (value in us, count) over one sorted list of every value they hold,
/// so that a draw of them merges by adding counts into one array: the bootstrap's
/// thousands of merges, by concatenating and sorting, were most of a report's time (10 s
/// for 18 cells).
struct Merger {
    values: Vec<u64>,
    /// Each histogram's (index into `values`, count).
    histograms: Vec<Vec<(usize, u64)>>,
    counts: Vec<u64>,
}

impl Merger {
    fn new(sparse: &[Vec<(u64, u64)>]) -> Merger {
        let mut values: Vec<u64> = sparse.iter().flatten().map(|x| x.0).collect();
        values.sort_unstable();
        values.dedup();
        let histograms = sparse
            .iter()
            .map(|h| {
                h.iter()
                    .filter_map(|&(v, c)| Some((values.binary_search(&v).ok()?, c)))
                    .collect()
            })
            .collect();
        let counts = vec![0; values.len()];
        Merger {
            values,
            histograms,
            counts,
        }
    }

    /// Mean, p50, p99, p99.9 and max (ms) of the histograms `picked` merged (one that is
    /// picked twice counts twice).
    fn stats(&mut self, picked: impl Iterator<Item = usize>) -> [f64; 5] {
        self.counts.fill(0);
        for h in picked {
            for &(i, c) in &self.histograms[h] {
                self.counts[i] += c;
            }
        }
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return [f64::NAN; 5];
        }
        // The sum, and the value at each quantile's rank, in one pass.
        let ranks = [0.50, 0.99, 0.999].map(|q| ((q * total as f64).ceil() as u64).clamp(1, total));
        let mut at = [f64::NAN; 3];
        let (mut sum, mut seen, mut next, mut max) = (0.0, 0, 0, 0);
        for (&v, &c) in self.values.iter().zip(&self.counts) {
            if c == 0 {
                continue;
            }
            sum += v as f64 * c as f64;
            seen += c;
            while next < ranks.len() && seen >= ranks[next] {
                at[next] = v as f64;
                next += 1;
            }
            max = v;
        }
        [
            sum / total as f64 * 1e-3,
            at[0] * 1e-3,
            at[1] * 1e-3,
            at[2] * 1e-3,
            max as f64 * 1e-3,
        ]
    }
}

/// Each condition compared with the first target at the same settings, per metric.
pub fn differences(conditions: &[Condition], noise_floor: f64) -> Vec<Difference> {
    let mut out = Vec::new();
    for (i, c) in conditions.iter().enumerate() {
        let Some(base) = conditions[..i].iter().find(|b| b.settings == c.settings) else {
            continue;
        };
        out.extend(compare_pair(base, c, noise_floor));
    }
    out
}

/// `b` against `a`, per metric.
pub fn compare_pair(a: &Condition, b: &Condition, noise_floor: f64) -> Vec<Difference> {
    METRICS
        .iter()
        .enumerate()
        .map(|(m, (name, _, _))| {
            let relative = relative_difference(
                a.metrics[m].value,
                b.metrics[m].value,
                &a.draws[m],
                &b.draws[m],
            );
            let verdict = if relative.value.is_nan()
                || (*name == "errors" && a.metrics[m].value == b.metrics[m].value)
            {
                Verdict::NoMeasurableDifference
            } else if relative.value.is_infinite() {
                // From zero (errors) to some: worse, with no ratio to give.
                Verdict::Worse
            } else {
                Verdict::of(&relative, noise_floor)
            };
            Difference {
                metric: name,
                baseline: a.target.clone(),
                other: b.target.clone(),
                settings: b.settings.clone(),
                relative,
                p_value: if *name == "p99" {
                    mann_whitney(&a.units_p99, &b.units_p99)
                } else {
                    1.0
                },
                verdict,
            }
        })
        .collect()
}

/// `4.1 ms (95% CI 3.8-4.5)`, or a count.
pub fn with_interval(e: &Estimate, unit: &str) -> String {
    if unit.is_empty() {
        return format!("{}", e.value.round());
    }
    if (e.high - e.low).abs() < 1e-12 {
        return format!("{} {unit}", ms(e.value));
    }
    format!(
        "{} {unit} (95% CI {}-{})",
        ms(e.value),
        ms(e.low),
        ms(e.high)
    )
}

/// A latency in ms with three significant digits.
pub fn ms(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else if v >= 1.0 {
        2
    } else {
        3
    };
    format!("{v:.digits$}")
}

/// `+12% (+8 to +16%)`.
pub fn percent(e: &Estimate) -> String {
    if e.value.is_nan() {
        return "no change (both zero)".into();
    }
    if e.value.is_infinite() {
        return "from zero".into();
    }
    format!(
        "{:+.1}% ({:+.1} to {:+.1}%)",
        e.value * 100.0,
        e.low * 100.0,
        e.high * 100.0
    )
}

/// Conditions grouped by settings, in order of first appearance.
pub fn groups(conditions: &[Condition]) -> Vec<(String, Vec<&Condition>)> {
    let mut out: Vec<(String, Vec<&Condition>)> = Vec::new();
    for c in conditions {
        match out.iter_mut().find(|(s, _)| *s == c.settings) {
            Some((_, m)) => m.push(c),
            None => out.push((c.settings.clone(), vec![c])),
        }
    }
    out
}

/// One sentence per group of settings: each target's p99 with its interval, its errors,
/// and the p99 difference against the first target.
pub fn headline(conditions: &[Condition], diffs: &[Difference]) -> Vec<String> {
    let p99 = metric_index("p99").unwrap_or(2);
    let errors = metric_index("errors").unwrap_or(5);
    groups(conditions)
        .into_iter()
        .map(|(settings, members)| {
            let mut parts: Vec<String> = members
                .iter()
                .map(|c| format!("{} p99 {}", c.target, with_interval(&c.metrics[p99], "ms")))
                .collect();
            let mut s = if settings.is_empty() {
                String::new()
            } else {
                format!("At {settings}: ")
            };
            s.push_str(&parts.remove(0));
            if !parts.is_empty() {
                s.push_str(" vs ");
                s.push_str(&parts.join(", "));
            }
            let with_errors: Vec<String> = members
                .iter()
                .filter(|c| c.metrics[errors].value > 0.0)
                .map(|c| format!("{} {}", c.target, c.metrics[errors].value.round()))
                .collect();
            if !with_errors.is_empty() {
                s.push_str(&format!("; errors: {}", with_errors.join(", ")));
            }
            for d in diffs
                .iter()
                .filter(|d| d.settings == settings && d.metric == "p99")
            {
                s.push_str(&format!(
                    "; {} vs {}: {}",
                    d.other,
                    d.baseline,
                    match d.verdict {
                        Verdict::NoMeasurableDifference => "no measurable difference".to_owned(),
                        v => format!("{} {}", percent(&d.relative), v.words()),
                    }
                ));
            }
            s.push('.');
            s
        })
        .collect()
}

/// The comparison as JSON (for `compare --json` and the report's data).
pub fn differences_json(diffs: &[Difference]) -> Value {
    Value::Array(
        diffs
            .iter()
            .map(|d| {
                json!({
                    "metric": d.metric, "baseline": d.baseline, "other": d.other,
                    "settings": d.settings, "relative": d.relative.value,
                    "relative_low": d.relative.low, "relative_high": d.relative.high,
                    "p_value": d.p_value, "verdict": d.verdict,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_sparse_histograms_give_exact_percentiles() {
        let a: Vec<(u64, u64)> = (1..=100).map(|v| (v * 10, 1)).collect();
        let b: Vec<(u64, u64)> = vec![(5000, 1), (10, 2)];
        let mut merger = Merger::new(&[a, b]);
        let s = merger.stats(0..2);
        assert!((s[1] - 0.50).abs() < 1e-9, "p50 {}", s[1]);
        assert!((s[2] - 1.0).abs() < 1e-9, "p99 {}", s[2]);
        assert!((s[4] - 5.0).abs() < 1e-9, "max {}", s[4]);
        let sum: u64 = (1..=100).map(|v| v * 10).sum::<u64>() + 5000 + 20;
        assert!(
            (s[0] - sum as f64 / 103.0 * 1e-3).abs() < 1e-12,
            "mean {}",
            s[0]
        );
        // The first picked twice: its counts twice, the second's not at all.
        let twice = merger.stats([0, 0].into_iter());
        assert!((twice[1] - 0.50).abs() < 1e-9, "p50 {}", twice[1]);
        assert!((twice[4] - 1.0).abs() < 1e-9, "max {}", twice[4]);
        assert!(merger.stats(std::iter::empty())[0].is_nan());
    }

    fn errors_only(target: &str, errors: f64) -> Condition {
        let e = |v: f64| Estimate {
            value: v,
            low: v,
            high: v,
        };
        Condition {
            target: target.into(),
            settings: String::new(),
            cells: vec![0],
            metrics: vec![e(1.0), e(1.0), e(1.0), e(1.0), e(1.0), e(errors)],
            draws: vec![vec![1.0; 10]; 5]
                .into_iter()
                .chain([vec![errors; 10]])
                .collect(),
            units_p99: vec![1.0],
            basis: "test",
            requests: 100.0,
        }
    }

    #[test]
    fn from_zero_errors_is_worse_and_zero_to_zero_is_no_change() {
        let none = errors_only("a", 0.0);
        let some = errors_only("b", 3.0);
        let d = compare_pair(&none, &some, 0.01);
        assert_eq!(d[5].verdict, Verdict::Worse);
        assert_eq!(percent(&d[5].relative), "from zero");
        let d = compare_pair(&none, &errors_only("c", 0.0), 0.01);
        assert_eq!(d[5].verdict, Verdict::NoMeasurableDifference);
        assert_eq!(percent(&d[5].relative), "no change (both zero)");
        assert_eq!(d[2].verdict, Verdict::NoMeasurableDifference, "equal p99");
    }

    #[test]
    fn numbers_read_as_people_write_them() {
        let e = Estimate {
            value: 4.123,
            low: 3.81,
            high: 4.5,
        };
        assert_eq!(with_interval(&e, "ms"), "4.12 ms (95% CI 3.81-4.50)");
        assert_eq!(
            percent(&Estimate {
                value: -0.58,
                low: -0.62,
                high: -0.54
            }),
            "-58.0% (-62.0 to -54.0%)"
        );
        assert_eq!(metric_index("p999"), Some(3));
    }
}
