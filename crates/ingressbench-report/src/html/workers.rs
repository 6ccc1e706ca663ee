//! The workers section: for a load sent by several processes, the merged percentile
//! spectrum beside each worker's own, each worker's health, and how far the average of
//! the workers' p99s (what tools that average per-generator percentiles report) is from
//! the merged p99.

use std::fmt::Write as _;

use ingressbench_results::workers::WorkersFile;
use ingressbench_stats::HistogramUs;
use ingressbench_stats::Percentiles;

use super::charts::spectrum_points;
use crate::analysis;
use crate::results::{CellResults, RunResults};
use crate::svg::{esc, short, Axis, Plot, PALETTE};

/// One percentile of a summary's latency.
type Percentile = fn(&Percentiles) -> u64;

/// Percentiles a worker's summary gives, each with its value.
const POINTS: [(Percentile, f64); 6] = [
    (|p| p.p50, 50.0),
    (|p| p.p75, 75.0),
    (|p| p.p90, 90.0),
    (|p| p.p99, 99.0),
    (|p| p.p999, 99.9),
    (|p| p.p9999, 99.99),
];

/// A line of the chart: its name, its points, its width.
type Curve = (String, Vec<(f64, f64)>, f64);

/// x of percentile `p` on the 1/(1-p) axis.
fn x_of(p: f64) -> f64 {
    (1.0 / (1.0 - p / 100.0)).log10()
}

/// The section, or `None` when no cell's load came from several workers. Charts go to
/// `charts` under their names.
pub(crate) fn section(run: &RunResults, charts: &mut Vec<(String, String)>) -> Option<String> {
    let cells: Vec<&CellResults> = run.cells.iter().filter(|c| c.workers.is_some()).collect();
    if cells.is_empty() {
        return None;
    }
    let mut body = String::from(
        "<section><h2>Workers</h2><p class=\"note\">Cells whose load several processes, or pods of the cluster, sent between them. The merged spectrum (thick) is every request's, from histograms that add exactly; each worker's line is its own requests'. The average of the workers' p99s is what tools that average per-generator percentiles report: it is not a percentile of anything.</p>",
    );
    for cell in cells {
        let workers = cell.workers.as_ref().expect("filtered");
        let title = format!("{} {}", cell.target, cell.settings_label());
        let (svg, table) = cell_parts(cell, workers, &title);
        let merged = workers.merged_p99_us.map(|p| p as f64);
        let average = workers.p99_average_of_workers_us;
        let p99_line = match (merged, average) {
            (Some(m), Some(a)) if m > 0.0 => format!(
                "p99: merged {}, average of the workers' p99s {} ({:+.1}%).",
                analysis::ms(m * 1e-3),
                analysis::ms(a * 1e-3),
                (a - m) / m * 100.0
            ),
            _ => String::new(),
        };
        let from_cluster = match &workers.cluster {
            Some(cluster) => format!(
                " Sent from the pods of Job {}; the backends were on {} when they started.",
                cluster.job,
                cluster.backend_nodes.join(", ")
            ),
            None => String::new(),
        };
        let _ = write!(
            body,
            "<h3>{}</h3><p>{}{}</p><figure>{svg}</figure>{table}",
            esc(&title),
            esc(&p99_line),
            esc(&from_cluster)
        );
        charts.push((format!("workers {title}"), svg));
    }
    body.push_str("</section>");
    Some(body)
}

fn cell_parts(cell: &CellResults, workers: &WorkersFile, title: &str) -> (String, String) {
    let mut merged = HistogramUs::new();
    for w in &cell.windows {
        merged.merge(&w.histogram);
    }
    let mut curves: Vec<Curve> = Vec::new();
    if !merged.is_empty() {
        curves.push(("merged".into(), spectrum_points(&merged), 2.6));
    }
    let mut rows = String::new();
    for w in &workers.workers {
        let k = w.index;
        let s = &w.summary;
        let lat = &s.latency_us;
        let points: Vec<(f64, f64)> = POINTS
            .iter()
            .map(|(value, p)| (x_of(*p), (value(lat) as f64 * 1e-3).max(0.001)))
            .collect();
        if lat.count > 0 {
            curves.push((format!("worker {k}"), points, 1.2));
        }
        let us = |v: u64| analysis::ms(v as f64 * 1e-3);
        let _ = write!(
            rows,
            "<tr><td>{k}</td><td class=\"l\">{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
            // Where the cluster placed it, else the host it named.
            esc(w.place.as_deref().unwrap_or(&w.host)),
            s.requests.total,
            s.rate.achieved_per_s,
            us(lat.p99),
            us(s.scheduler_lag_us.p99),
            w.start_late_ms.map_or("-".into(), |l| format!("{l:.1} ms")),
            if w.complete { "yes" } else { "no" },
            esc(&w.exit),
            esc(&w.warnings.join("; ")),
        );
    }
    let table = format!(
        "<table><tr><th>worker</th><th class=\"l\">where</th><th>requests</th><th>req/s</th><th>p99</th><th>lag p99</th><th>start late</th><th>results handed over</th><th class=\"l\">ended</th><th class=\"l\">warnings</th></tr>{rows}</table>"
    );
    let y = Axis::covering(curves.iter().flat_map(|c| c.1.iter().map(|p| p.1)), true);
    let x = Axis {
        min: 0.0,
        max: 5.0,
        log: false,
    };
    let mut plot = Plot::new(900.0, 240.0, x, y);
    plot.axes("percentile", "latency (ms)", &|v| match v.round() as i32 {
        0 => "0%".into(),
        _ => format!("{}%", short(100.0 * (1.0 - 10f64.powf(-v)))),
    });
    let mut legend = Vec::new();
    for (i, (name, points, width)) in curves.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        plot.line(points, colour, *width, i > 0);
        legend.push((name.clone(), colour.to_owned()));
    }
    plot.legend(&legend);
    (plot.finish(&format!("Workers: {title}")), table)
}
