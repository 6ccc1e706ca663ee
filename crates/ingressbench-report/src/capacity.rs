//! The capacity section, for a run whose scenario searched (`search:`, issue #33): each
//! search's result (the capacity, the interval the true limit lies in, the first rate
//! that failed and the objective it broke, how many trials it took and why, the proxy's
//! CPU at capacity), every trial's p50, p99 and errors against its offered rate with the
//! objectives drawn in, and the headline's sentences, which lead it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ingressbench_results::capacity::{Ceiling, Outcome, OutcomeKind, SearchRecord, TrialRecord};

use crate::results::{CellResults, RunResults};
use crate::routes::number;
use crate::svg::{esc, short, Axis, Plot, PALETTE};

/// One search of a run, as `compare` pairs and judges it.
#[derive(Clone, Debug, PartialEq)]
pub struct Searched {
    /// The target's name.
    pub target: String,
    /// The settings besides the rate the search chose (`tuning=default`), or empty.
    pub settings: String,
    /// The highest rate that passed, if the search ended with one.
    pub capacity: Option<f64>,
    /// The lowest rate that failed (the true limit is below it), if one did.
    pub failed_at: Option<f64>,
    /// Where the search ended, in words (or that it did not).
    pub said: String,
}

/// Every search of `run` (none if it searched nothing).
pub fn searched(run: &RunResults) -> Vec<Searched> {
    let Some(searches) = &run.record.searches else {
        return Vec::new();
    };
    searches
        .iter()
        .map(|s| {
            let outcome = s.outcome.as_ref().filter(|_| s.is_done());
            Searched {
                target: s.target.clone(),
                settings: s.settings_words(),
                capacity: outcome.and_then(|o| o.kind.capacity_per_s()),
                failed_at: outcome.and_then(|o| o.kind.failed_at_per_s()),
                said: outcome.map_or_else(|| "the search did not end".into(), |o| o.said.clone()),
            }
        })
        .collect()
}

/// Two searches side by side: the baseline's and the other's capacity, the change
/// between them, and whether it is beyond the searches' brackets.
#[derive(Clone, Debug)]
pub struct CapacityChange {
    /// The baseline's search.
    pub a: Searched,
    /// The other's.
    pub b: Searched,
    /// (b - a) / a, when both found a capacity.
    pub relative: Option<f64>,
    /// In words: higher or lower beyond both brackets, or within them.
    pub words: String,
}

impl CapacityChange {
    /// `a` and `b` compared.
    pub fn of(a: &Searched, b: &Searched) -> Self {
        let relative = match (a.capacity, b.capacity) {
            (Some(x), Some(y)) if x > 0.0 => Some((y - x) / x),
            _ => None,
        };
        // Each limit lies between its capacity and its first failure (at least the
        // capacity, when nothing failed up to the search's top).
        let words = match (a.capacity, b.capacity) {
            (Some(x), Some(y)) => {
                let x_top = a.failed_at.unwrap_or(f64::INFINITY);
                let y_top = b.failed_at.unwrap_or(f64::INFINITY);
                if y_top <= x {
                    "lower, beyond both searches' brackets".to_owned()
                } else if y >= x_top {
                    "higher, beyond both searches' brackets".to_owned()
                } else {
                    "no measurable difference: the brackets overlap".to_owned()
                }
            }
            _ => format!("cannot compare: baseline {}; other {}", a.said, b.said),
        };
        Self {
            a: a.clone(),
            b: b.clone(),
            relative,
            words,
        }
    }

    /// `1,000 (limit below 1,062.5)`.
    pub fn side(s: &Searched) -> String {
        match (s.capacity, s.failed_at) {
            (Some(c), Some(f)) => format!("{} (limit below {})", rate(Some(c)), rate(Some(f))),
            (Some(c), None) => format!("at least {}", rate(Some(c))),
            _ => "none".into(),
        }
    }
}

/// The searches of `a` and `b` paired by target and settings (with `targets`, two
/// targets of `a` at the same settings instead); what has no partner, in words.
pub fn pair(
    a: &[Searched],
    b: &[Searched],
    targets: Option<(&str, &str)>,
) -> (Vec<CapacityChange>, Vec<String>) {
    let mut changes = Vec::new();
    let mut alone = Vec::new();
    let at = |s: &Searched| match s.settings.is_empty() {
        true => s.target.clone(),
        false => format!("{} at {}", s.target, s.settings),
    };
    match targets {
        None => {
            for x in a {
                match b
                    .iter()
                    .find(|y| y.target == x.target && y.settings == x.settings)
                {
                    Some(y) => changes.push(CapacityChange::of(x, y)),
                    None => alone.push(format!("{} was searched in the baseline only", at(x))),
                }
            }
            for y in b {
                if !a
                    .iter()
                    .any(|x| x.target == y.target && x.settings == y.settings)
                {
                    alone.push(format!("{} was searched in the other run only", at(y)));
                }
            }
        }
        Some((tx, ty)) => {
            for x in a.iter().filter(|s| s.target == tx) {
                match a
                    .iter()
                    .find(|y| y.target == ty && y.settings == x.settings)
                {
                    Some(y) => changes.push(CapacityChange::of(x, y)),
                    None => alone.push(format!("{} has no search of {ty} beside it", at(x))),
                }
            }
        }
    }
    (changes, alone)
}

/// The table's "limit between" and "first failure" of a search's `outcome`: where the
/// limit lies and what failed first, or, where no capacity is claimed (the target
/// stopped answering, a trial could not be judged), what passed before and why not.
fn bracket(outcome: &OutcomeKind) -> (String, String) {
    let passed = |p: &Option<f64>| match p {
        Some(_) => format!("none claimed (passed up to {})", rate(*p)),
        None => "none claimed (nothing passed)".into(),
    };
    let broke = |b: &Option<String>| b.clone().unwrap_or_else(|| "?".into());
    match outcome {
        OutcomeKind::Found {
            capacity_per_s,
            failed_at_per_s,
            broke: b,
        } => (
            format!(
                "{}-{}",
                rate(Some(*capacity_per_s)),
                rate(Some(*failed_at_per_s))
            ),
            format!("{} broke {}", rate(Some(*failed_at_per_s)), broke(b)),
        ),
        OutcomeKind::AtLeast { capacity_per_s } => (
            format!("over {}", rate(Some(*capacity_per_s))),
            "none up to up_to".into(),
        ),
        OutcomeKind::Generator {
            capacity_per_s,
            failed_at_per_s: Some(failed),
            generator_at_per_s,
            ..
        } => (
            format!(
                "{}-{} (not narrowed: the generator fell behind at {})",
                rate(*capacity_per_s),
                rate(Some(*failed)),
                rate(Some(*generator_at_per_s))
            ),
            format!("{} failed", rate(Some(*failed))),
        ),
        OutcomeKind::TargetStopped {
            passed_per_s,
            stopped_at_per_s,
            why,
            ..
        } => (
            passed(passed_per_s),
            format!(
                "{}: the target stopped answering ({why})",
                rate(Some(*stopped_at_per_s))
            ),
        ),
        OutcomeKind::CannotJudge {
            passed_per_s,
            at_per_s,
            why,
        } => (
            passed(passed_per_s),
            format!("{}: cannot judge ({why})", rate(Some(*at_per_s))),
        ),
        OutcomeKind::FromFails {
            broke: b,
            lowest_per_s,
        } => (
            format!("under {}", rate(Some(*lowest_per_s))),
            format!("{} broke {}", rate(Some(*lowest_per_s)), broke(b)),
        ),
        OutcomeKind::Generator { .. } | OutcomeKind::Other => ("-".into(), "-".into()),
    }
}

/// A rate as people read it: `1,000`, `1,062.5`.
fn rate(v: Option<f64>) -> String {
    match v {
        Some(x) if x.fract() == 0.0 => number(v, 0),
        Some(_) => number(v, 1),
        None => "-".into(),
    }
}

/// One trial's figures for the charts: offered rate, p50 and p99 in ms, errors in %.
struct Point {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors_pct: f64,
}

fn point(cell: &CellResults) -> Option<Point> {
    let s = cell.summary.as_ref()?;
    let total = s.requests.total? as f64;
    Some(Point {
        rate: cell
            .settings
            .iter()
            .find(|(k, _)| k == "load.rate")?
            .1
            .parse()
            .ok()?,
        p50_ms: s.latency_us.p50? / 1000.0,
        p99_ms: s.latency_us.p99? / 1000.0,
        errors_pct: if total > 0.0 {
            s.requests.errors? as f64 * 100.0 / total
        } else {
            0.0
        },
    })
}

/// The section and its headline sentences, or `None` when the run searched nothing.
pub(crate) fn section(
    run: &RunResults,
    colours: &BTreeMap<String, &str>,
    charts: &mut Vec<(String, String)>,
) -> Option<(String, Vec<String>)> {
    let searches: &[SearchRecord] = run.record.searches.as_ref()?;
    if searches.is_empty() {
        return None;
    }
    let cell = |i: &usize| run.cells.iter().find(|c| c.index == *i);
    let mut html = String::from("<section><h2>Capacity</h2><p class=\"note\">Each search offered open-loop rates, one trial (a cell of the run, with the scenario's events) at a time: from <code>from</code>, doubling until a trial failed, then halving the bracket until it was as narrow as the search's precision. A trial passes only when the 95% interval of every objective's figure (bootstrapped over the trial's windows) is inside the objective, fails when one is wholly outside, and is run again when one straddles it. The capacity is the highest rate that passed; the true limit lies between it and the lowest rate that failed. A failure while the generator was behind its schedule or out of CPU is the generator's, and ends the search without a capacity. Generator alone: the same load (connections, threads, protocol, workers; no TLS) sent to a local echo backend before the search, a second at each rate from <code>from</code> doubling, and where it fell behind. Proxy CPU: the proxy's cores in use, on average, during the trial at capacity.</p>");
    html.push_str("<table><tr><th class=\"l\">target and settings</th><th class=\"l\">objectives</th><th>capacity req/s</th><th>limit between req/s</th><th class=\"l\">first failure</th><th>trials</th><th>repeats of a straddle</th><th>proxy CPU at capacity</th><th class=\"l\">generator alone</th><th class=\"l\">status</th></tr>");
    let mut headline = Vec::new();
    let mut lines: Vec<(String, String, Vec<Point>)> = Vec::new();
    let mut limits: BTreeMap<&str, f64> = BTreeMap::new();
    for s in searches {
        let label = s.label.as_str();
        let slo: Vec<&str> = s.slo.iter().map(String::as_str).collect();
        for o in &slo {
            if let Some((figure, limit)) = objective_line(o) {
                limits.entry(figure).or_insert(limit);
            }
        }
        let trials: Vec<&CellResults> = s.trials.iter().filter_map(cell).collect();
        let repeats = (trials.iter())
            .filter(|c| trial(run, c).is_some_and(|t| t.why == "repeat of a straddle"))
            .count();
        let outcome = s.outcome.as_ref();
        let capacity = outcome.and_then(|o| o.kind.capacity_per_s());
        let at_capacity = trials.iter().find(|c| {
            c.settings
                .iter()
                .any(|(k, v)| k == "load.rate" && v.parse::<f64>().ok() == capacity)
                && trial(run, c).is_some_and(|t| t.verdict.as_ref().is_some_and(|v| v.passed()))
        });
        let cpu = at_capacity
            .and_then(|c| c.usage.as_ref())
            .and_then(|u| u.cores("proxy"));
        let cpu_text = cpu.map_or("-".into(), |c| format!("{c:.2} cores"));
        let (between, failure) = outcome.map_or(("-".into(), "-".into()), |o| bracket(&o.kind));
        let generator = generator_alone(s.generator_ceiling.as_ref());
        let status = match (s.status.as_str(), outcome) {
            ("done", Some(o)) => o.said.clone(),
            ("done", None) => "done".into(),
            ("", _) => "?".into(),
            (other, _) => format!("{other}: the search did not end"),
        };
        let _ = write!(
            html,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{repeats}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
            esc(label),
            esc(&slo.join(", ")),
            rate(capacity),
            esc(&between),
            esc(&failure),
            trials.len(),
            esc(&cpu_text),
            esc(&generator),
            esc(&status)
        );
        let spent = s.spent.as_deref().map_or_else(
            || match trials.len() {
                1 => "1 trial".to_owned(),
                n => format!("{n} trials"),
            },
            str::to_owned,
        );
        headline.push(sentence(label, &slo, outcome, &spent, cpu));
        let mut points: Vec<Point> = trials.iter().filter_map(|c| point(c)).collect();
        points.sort_by(|a, b| a.rate.total_cmp(&b.rate));
        let colour = colours
            .get(&s.target)
            .copied()
            .unwrap_or(PALETTE[0])
            .to_owned();
        lines.push((label.to_owned(), colour, points));
    }
    html.push_str("</table>");
    for s in searches {
        for w in &s.warnings {
            let _ = write!(html, "<p class=\"note\">{}: {}</p>", esc(&s.label), esc(w));
        }
    }
    for (name, unit, figure, limit) in [
        (
            "p50",
            "p50 (ms)",
            (|p: &Point| p.p50_ms) as fn(&Point) -> f64,
            limits.get("p50"),
        ),
        ("p99", "p99 (ms)", |p: &Point| p.p99_ms, limits.get("p99")),
        (
            "errors",
            "errors (% of requests)",
            |p: &Point| p.errors_pct,
            limits.get("errors"),
        ),
    ] {
        if let Some(svg) = against_rate(&lines, unit, figure, limit.copied()) {
            let _ = write!(
                html,
                "<figure><figcaption>{} against offered rate, every trial</figcaption>{svg}</figure>",
                esc(unit)
            );
            charts.push((format!("capacity {name}"), svg));
        }
    }
    html.push_str("</section>");
    Some((html, headline))
}

/// What the generator sustained alone before the search (a search's
/// `generator_ceiling`), in a few words.
fn generator_alone(ceiling: Option<&Ceiling>) -> String {
    let Some(ceiling) = ceiling else {
        return "not measured (load from the cluster's pods)".into();
    };
    let kept = match ceiling.healthy_per_s {
        None => "never kept up".to_owned(),
        Some(r) => format!("kept up with {}", rate(Some(r))),
    };
    match ceiling.behind_at_per_s {
        None => kept,
        Some(r) => format!("{kept}, behind at {}", rate(Some(r))),
    }
}

/// The trial entry run.json keeps for `cell`.
fn trial<'a>(run: &'a RunResults, cell: &CellResults) -> Option<&'a TrialRecord> {
    run.record.cells.get(cell.index)?.search.as_ref()
}

/// The figure an objective draws a line on (`p50`, `p99`, `errors`) and its limit in the
/// chart's unit (ms, %).
fn objective_line(objective: &str) -> Option<(&'static str, f64)> {
    let (figure, rest) = objective.split_once('<')?;
    let value = rest.trim_start_matches('=').trim();
    match figure.trim() {
        "p50" => Some(("p50", value.strip_suffix("ms")?.trim().parse().ok()?)),
        "p99" => Some(("p99", value.strip_suffix("ms")?.trim().parse().ok()?)),
        "errors" => Some(("errors", value.strip_suffix('%')?.trim().parse().ok()?)),
        _ => None,
    }
}

/// The headline's sentence for one search.
/// `spent`: the trials in words (a search's `spent`, else a count).
fn sentence(
    label: &str,
    slo: &[&str],
    outcome: Option<&Outcome>,
    spent: &str,
    cpu: Option<f64>,
) -> String {
    let within = slo.join(" and ");
    let cpu = cpu.map_or(String::new(), |c| {
        format!("; the proxy used {c:.2} cores there")
    });
    let Some(outcome) = outcome else {
        return format!("{label}: the search did not end ({spent} so far).");
    };
    match &outcome.kind {
        OutcomeKind::Found {
            capacity_per_s,
            failed_at_per_s,
            broke,
        } => format!(
            "{label}: capacity {} req/s within {within} (the limit lies between {} and {} req/s, where {} broke); {spent}{cpu}.",
            rate(Some(*capacity_per_s)),
            rate(Some(*capacity_per_s)),
            rate(Some(*failed_at_per_s)),
            broke.as_deref().unwrap_or("?")
        ),
        OutcomeKind::AtLeast { capacity_per_s } => format!(
            "{label}: capacity at least {} req/s within {within} (the highest rate searched passed); {spent}{cpu}.",
            rate(Some(*capacity_per_s))
        ),
        _ => format!("{label}: no capacity: {}; {spent}.", outcome.said),
    }
}

/// A figure of every trial against its offered rate, a line per search, the objective's
/// limit as a dashed line; `None` with fewer than two points.
fn against_rate(
    lines: &[(String, String, Vec<Point>)],
    unit: &str,
    figure: fn(&Point) -> f64,
    limit: Option<f64>,
) -> Option<String> {
    // Latencies span decades on the way past capacity; errors start at 0.
    let log = !unit.starts_with("errors");
    let floor = |v: f64| if log { v.max(1e-3) } else { v };
    let all: Vec<(f64, f64)> = lines
        .iter()
        .flat_map(|l| l.2.iter().map(|p| (p.rate, figure(p))))
        .collect();
    if all.len() < 2 {
        return None;
    }
    let x = Axis::covering(all.iter().map(|p| p.0), true);
    let y = Axis::covering(all.iter().map(|p| floor(p.1)).chain(limit), log);
    let mut plot = Plot::new(900.0, 280.0, x, y);
    let y_title = if log {
        format!("{unit}, log")
    } else {
        unit.to_owned()
    };
    plot.axes("offered rate, req/s (log)", &y_title, &|v| short(v));
    let mut legend = Vec::new();
    if let Some(limit) = limit {
        let (lo, hi) = all.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), p| {
            (lo.min(p.0), hi.max(p.0))
        });
        plot.line(&[(lo, limit), (hi, limit)], "#b00", 1.2, true);
        legend.push(("objective".to_owned(), "#b00".to_owned()));
    }
    for (label, colour, points) in lines {
        let xy: Vec<(f64, f64)> = points.iter().map(|p| (p.rate, floor(figure(p)))).collect();
        if xy.is_empty() {
            continue;
        }
        plot.line(&xy, colour, 1.6, false);
        plot.dots(&xy, colour, 2.5, 1.0);
        legend.push((label.clone(), colour.clone()));
    }
    plot.legend(&legend);
    Some(plot.finish(&format!("{unit} against offered rate")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn searched(capacity: Option<f64>, failed_at: Option<f64>) -> Searched {
        Searched {
            target: "nginx".into(),
            settings: String::new(),
            capacity,
            failed_at,
            said: "x".into(),
        }
    }

    #[test]
    fn a_search_that_claims_no_capacity_says_what_passed_and_why_in_the_table() {
        let stopped: OutcomeKind = serde_json::from_value(serde_json::json!({
            "kind": "target_stopped", "passed_per_s": 800.0, "failed_at_per_s": 1600.0,
            "stopped_at_per_s": 1600.0, "why": "3200 of 3200 requests refused",
        }))
        .unwrap();
        assert_eq!(
            bracket(&stopped),
            (
                "none claimed (passed up to 800)".to_owned(),
                "1,600: the target stopped answering (3200 of 3200 requests refused)".to_owned()
            )
        );
        let unjudged: OutcomeKind = serde_json::from_value(serde_json::json!({
            "kind": "cannot_judge", "passed_per_s": null, "at_per_s": 200.0,
            "why": "p99 over 3 answers",
        }))
        .unwrap();
        assert_eq!(
            bracket(&unjudged),
            (
                "none claimed (nothing passed)".to_owned(),
                "200: cannot judge (p99 over 3 answers)".to_owned()
            )
        );
    }

    #[test]
    fn capacities_differ_only_beyond_both_brackets() {
        let a = searched(Some(1000.0), Some(1050.0));
        let lower = CapacityChange::of(&a, &searched(Some(800.0), Some(840.0)));
        assert!((lower.relative.unwrap() + 0.2).abs() < 1e-12);
        assert!(lower.words.starts_with("lower"), "{}", lower.words);
        let overlap = CapacityChange::of(&a, &searched(Some(1025.0), Some(1075.0)));
        assert!(
            overlap.words.starts_with("no measurable"),
            "{}",
            overlap.words
        );
        let higher = CapacityChange::of(&a, &searched(Some(1050.0), None));
        assert!(higher.words.starts_with("higher"), "{}", higher.words);
        let none = CapacityChange::of(&a, &searched(None, None));
        assert_eq!(none.relative, None);
        assert!(none.words.starts_with("cannot compare"));
        assert_eq!(CapacityChange::side(&a), "1,000 (limit below 1,050)");
    }
}
