//! The route-scale section: for cells whose events added or removed routes, what the
//! route probe found per step (each route's time to its first right answer, the
//! resolution of that figure, wrong answers, routes never right), the errors on the
//! routes that were there, the proxy's memory at each count, and the tool's own CPU; a
//! chart of memory and of p99 time to right against the routes in force (a line per
//! cell), and each cell's CDF per step. Also the headline's sentences on it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ingressbench_results::routes::{Firing, Memory};

use crate::results::{CellResults, RunResults};
use crate::svg::{esc, short, Axis, Plot, PALETTE};

/// The section and its headline sentences, or `None` when no cell probed routes. Charts
/// go to `charts` under their names.
pub(crate) fn section(
    run: &RunResults,
    colours: &BTreeMap<String, &str>,
    charts: &mut Vec<(String, String)>,
) -> Option<(String, Vec<String>)> {
    let cells: Vec<(&CellResults, &Vec<Firing>)> = run
        .cells
        .iter()
        .filter_map(|c| Some((c, &c.routes.as_ref()?.firings)))
        .collect();
    if cells.is_empty() {
        return None;
    }
    // A probe that ran and saw no change fired (the cell was stopped first) is said, not
    // left out.
    let (cells, unfired): (Vec<_>, Vec<_>) = cells.into_iter().partition(|(_, f)| !f.is_empty());
    let mut html = String::from("<section><h2>Route scale</h2><p class=\"note\">Per step of each cell: the routes it added or removed, each probed beside the load until it answered as the change says (a 2xx from its pool after 404s; 404 after its pool's answers), timed from the change's request to the probe that first found it right. <em>Resolution</em> is the median gap between a route's last wrong probe and its first right one's answer: the route became right within it (the pending routes over the probe's rate for a bulk step, under a millisecond one at a time). <em>Wrong</em>: answers that were neither the before nor the after. <em>Errors on existing routes</em>: the load's failed requests from the step's request to the next step's. Memory: the proxy's resident memory (every process) read just before the next step, once this step's routes were right; in a local cluster also the controller's, when it runs apart from its proxy (Traefik is both, counted as the proxy). Proxy CPU: what the proxy spent from the step's request to the next step's (read once a second). Config: the size of the proxy's configuration files as rendered for the step (the lab's). Tool CPU: what this tool spent rendering and applying the step (the probe's own CPU is in the cell's total).</p>");
    let mut headline = Vec::new();
    let colour = |c: &CellResults| {
        colours
            .get(&c.target)
            .copied()
            .unwrap_or(PALETTE[0])
            .to_owned()
    };
    for (name, unit, figure) in [
        (
            "memory",
            "proxy memory (MiB)",
            rss_mib as fn(&Firing) -> Option<f64>,
        ),
        ("cpu", "proxy CPU over the step (ms)", proxy_cpu_ms),
        (
            "p99 to right",
            "p99 time to first right answer (ms)",
            p99_ms,
        ),
    ] {
        if let Some(svg) = against_routes(&cells, unit, figure, &colour) {
            let _ = write!(
                html,
                "<figure><figcaption>{} against routes in force</figcaption>{svg}</figure>",
                esc(unit)
            );
            charts.push((format!("routes {name}"), svg));
        }
    }
    for (cell, firings) in &cells {
        let label = cell.label();
        let _ = write!(html, "<h3>{}</h3>", esc(&label));
        html.push_str(&table(cell, firings));
        if let Some(svg) = cdf(firings, &label) {
            html.push_str(&svg);
            charts.push((format!("routes cdf {label}"), svg));
        }
        if let Some(routes) = &cell.routes {
            let _ = write!(
                html,
                "<p class=\"note\">The tool's CPU for the route changes and the probe: {} ms (the probe {} ms, at {} probes/s over {} connections).</p>",
                number(Some(routes.tool_cpu_ms), 0),
                number(Some(routes.probe.cpu_ms), 0),
                number(Some(routes.probe.rate), 0),
                number(Some(routes.probe.connections as f64), 0),
            );
        }
        headline.extend(sentences(&label, firings));
    }
    for (cell, _) in unfired {
        let said = format!(
            "{}: the route probe ran and no route change fired (the cell ended first), so there is nothing to show.",
            cell.label()
        );
        let _ = write!(html, "<p class=\"note\">{}</p>", esc(&said));
        headline.push(said);
    }
    html.push_str("</section>");
    Some((html, headline))
}

fn mib(bytes: Option<&Memory>) -> Option<f64> {
    bytes?.after.map(|b| b as f64 / (1024.0 * 1024.0))
}

fn rss_mib(f: &Firing) -> Option<f64> {
    mib(f.proxy_rss_bytes.as_ref())
}

/// The p99's 95% interval over the step's routes, as `95% 280-320 ms, ` (empty when the
/// results have none).
fn p99_interval(f: &Firing) -> String {
    match f.time_to_right_ms.p99_interval {
        Some([low, high]) => format!(
            "95% {}-{} ms, ",
            number(Some(low), 0),
            number(Some(high), 0)
        ),
        None => String::new(),
    }
}

/// A cluster controller's resident memory (MiB) once the step's routes were right, when
/// it runs apart from its proxy and was measured.
fn controller_mib(f: &Firing) -> Option<f64> {
    mib(f.controller_rss_bytes.as_ref())
}

/// The CPU the proxy spent from the step's request to the next step's (to a second).
fn proxy_cpu_ms(f: &Firing) -> Option<f64> {
    f.proxy_cpu_ms
}

fn p99_ms(f: &Firing) -> Option<f64> {
    f.time_to_right_ms.p99
}

/// A figure of each step against the routes in force after it, a line per cell in step
/// order (steps down come back along it); `None` with fewer than two points.
fn against_routes(
    cells: &[(&CellResults, &Vec<Firing>)],
    unit: &str,
    figure: fn(&Firing) -> Option<f64>,
    colour: &dyn Fn(&CellResults) -> String,
) -> Option<String> {
    let lines: Vec<(&CellResults, Vec<(f64, f64)>)> = cells
        .iter()
        .map(|(c, firings)| {
            let points = firings
                .iter()
                .filter(|f| !f.one_at_a_time)
                .filter_map(|f| Some((f.routes_after? as f64, figure(f)?)))
                .filter(|(x, _)| *x > 0.0)
                .collect();
            (*c, points)
        })
        .collect();
    let all: Vec<(f64, f64)> = lines.iter().flat_map(|l| l.1.iter().copied()).collect();
    if all.len() < 2 {
        return None;
    }
    let x = Axis::covering(all.iter().map(|p| p.0), true);
    let y = Axis::covering(all.iter().map(|p| p.1).chain([0.0]), false);
    let mut plot = Plot::new(900.0, 280.0, x, y);
    plot.axes("routes in force (log)", unit, &|v| short(v));
    let mut legend = Vec::new();
    for (cell, points) in &lines {
        if points.is_empty() {
            continue;
        }
        let c = colour(cell);
        plot.line(points, &c, 1.6, false);
        plot.dots(points, &c, 2.5, 1.0);
        legend.push((cell.label(), c));
    }
    plot.legend(&legend);
    Some(plot.finish(&format!("{unit} against routes in force")))
}

/// A cell's steps as a table.
fn table(cell: &CellResults, firings: &[Firing]) -> String {
    let mut t = String::from("<table><tr><th class=\"l\">step</th><th>routes after</th><th>asked</th><th>right</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>max ms</th><th>last right ms</th><th>resolution ms</th><th class=\"l\">wrong</th><th class=\"l\">never right</th><th>errors on existing routes</th><th>proxy MiB</th><th>proxy CPU ms</th><th>controller MiB</th><th>config KiB</th><th>tool CPU ms</th></tr>");
    for (i, f) in firings.iter().enumerate() {
        let from = f.requested_s.unwrap_or(f64::INFINITY);
        let to = (firings.get(i + 1))
            .and_then(|n| n.requested_s)
            .unwrap_or(f64::INFINITY);
        let errors: u64 = cell
            .impact
            .iter()
            .filter(|e| e.requested_s >= from - 1e-6 && e.requested_s < to)
            .filter_map(|e| e.requests.errors)
            .sum();
        let wrong: Vec<String> = (f.wrong.iter())
            .map(|(k, v)| format!("{v} × {k}"))
            .collect();
        let never = &f.never_right;
        let never_cell = if never.is_empty() {
            "0".to_owned()
        } else {
            format!(
                "<details><summary>{}</summary>{}</details>",
                never.len(),
                esc(&never.join(" "))
            )
        };
        let ms = |v: Option<f64>| number(v, 1);
        let times = &f.time_to_right_ms;
        let _ = write!(
            t,
            "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{never_cell}</td><td>{errors}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&f.what),
            number(f.routes_after.map(|r| r as f64), 0),
            number(Some(f.asked as f64), 0),
            number(Some(f.right as f64), 0),
            ms(times.p50),
            ms(times.p90),
            ms(times.p99),
            ms(times.max),
            number(f.last_right_ms, 1),
            number(f.resolution_ms.p50, 2),
            esc(&wrong.join(", ")),
            rss_mib(f).map_or("-".to_owned(), |m| format!("{m:.0}")),
            proxy_cpu_ms(f).map_or("-".to_owned(), |m| format!("{m:.0}")),
            controller_mib(f).map_or("-".to_owned(), |m| format!("{m:.0}")),
            (f.config_bytes).map_or("-".to_owned(), |b| format!("{:.0}", b as f64 / 1024.0)),
            number(Some(f.tool_cpu_ms), 1),
        );
    }
    t.push_str("</table>");
    t
}

/// Each step's CDF of time to right, a line per step.
fn cdf(firings: &[Firing], label: &str) -> Option<String> {
    let lines: Vec<(String, Vec<(f64, f64)>)> = firings
        .iter()
        .map(|f| {
            let points = f.cdf.iter().map(|[ms, q]| (ms.max(0.001), *q)).collect();
            (f.what.clone(), points)
        })
        .filter(|(_, p): &(String, Vec<(f64, f64)>)| !p.is_empty())
        .collect();
    if lines.is_empty() {
        return None;
    }
    let x = Axis::covering(lines.iter().flat_map(|l| l.1.iter().map(|p| p.0)), true);
    let y = Axis {
        min: 0.0,
        max: 1.0,
        log: false,
    };
    let mut plot = Plot::new(900.0, 240.0, x, y);
    plot.axes(
        "time to first right answer (ms, log)",
        "fraction of the step's routes",
        &|v| short(v),
    );
    let mut legend = Vec::new();
    for (i, (what, points)) in lines.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        plot.line(points, colour, 1.4, false);
        legend.push((format!("{}. {what}", i + 1), colour.to_owned()));
    }
    plot.legend(&legend);
    Some(plot.finish(&format!("routes right over time since each step's request (the CDF of time to first right answer), {label}")))
}

/// The headline's sentences for a cell: the bulk step nearest 1,000 routes, and the
/// routes added one at a time.
fn sentences(label: &str, firings: &[Firing]) -> Vec<String> {
    let mut out = Vec::new();
    let bulk = firings
        .iter()
        .filter(|f| !f.one_at_a_time)
        .filter_map(|f| Some((f.routes_after? as f64, f)))
        .min_by(|a, b| (a.0 - 1000.0).abs().total_cmp(&(b.0 - 1000.0).abs()));
    if let Some((routes, f)) = bulk {
        out.push(format!(
            "{label}: at {} routes ({}), p99 time to first right answer {} ms ({}resolution {} ms){}{}.",
            number(Some(routes), 0),
            f.what,
            number(f.time_to_right_ms.p99, 0),
            p99_interval(f),
            number(f.resolution_ms.p50, 0),
            rss_mib(f).map_or(String::new(), |m| format!(", proxy memory {m:.0} MiB")),
            never_note(f),
        ));
    }
    for f in firings.iter().filter(|f| f.one_at_a_time) {
        out.push(format!(
            "{label}: {} with {} present, p99 {} ms (resolution {} ms){}.",
            f.what,
            number(Some(f.routes_before()), 0),
            number(f.time_to_right_ms.p99, 1),
            number(f.resolution_ms.p50, 2),
            never_note(f),
        ));
    }
    out
}

fn never_note(f: &Firing) -> String {
    match f.never_right.len() {
        0 => String::new(),
        n => format!(", {n} never right"),
    }
}

/// A number with `decimals`, thousands grouped; `-` when absent.
pub(crate) fn number(x: Option<f64>, decimals: usize) -> String {
    let Some(x) = x else {
        return "-".into();
    };
    let text = format!("{x:.decimals$}");
    let (whole, frac) = text
        .split_once('.')
        .map_or((text.as_str(), None), |(w, f)| (w, Some(f)));
    let (sign, digits) = whole.strip_prefix('-').map_or(("", whole), |d| ("-", d));
    let mut grouped = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(ch);
    }
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(number(Some(10000.0), 0), "10,000");
        assert_eq!(number(Some(1187.44), 1), "1,187.4");
        assert_eq!(number(Some(-999.0), 0), "-999");
        assert_eq!(number(None, 0), "-");
    }

    #[test]
    fn the_headline_takes_the_bulk_step_nearest_a_thousand_routes() {
        let firings: Vec<Firing> = serde_json::from_str(
            r#"[{"what":"to 100 routes","routes_after":101,"one_at_a_time":false,"time_to_right_ms":{"p99":30},"resolution_ms":{"p50":5},"proxy_rss_bytes":{"after":104857600},"never_right":[]},
                {"what":"to 1000 routes","routes_after":1001,"one_at_a_time":false,"time_to_right_ms":{"p99":300,"p99_interval":[280,320]},"resolution_ms":{"p50":50},"proxy_rss_bytes":{"after":209715200},"never_right":["r9.routes.test"]},
                {"what":"add 2 routes one at a time","routes_after":1003,"asked":2,"one_at_a_time":true,"time_to_right_ms":{"p99":7.6},"resolution_ms":{"p50":0.5},"never_right":[]}]"#,
        )
        .unwrap();
        assert_eq!(
            sentences("envoy", &firings),
            [
                "envoy: at 1,001 routes (to 1000 routes), p99 time to first right answer 300 ms (95% 280-320 ms, resolution 50 ms), proxy memory 200 MiB, 1 never right.",
                "envoy: add 2 routes one at a time with 1,001 present, p99 7.6 ms (resolution 0.50 ms)."
            ]
        );
    }
}
