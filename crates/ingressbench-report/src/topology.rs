//! The topology diagram: the nodes a run's cells ran on (what runs where, at which
//! address), left to right along the request's path, and the emulated links between them
//! with their delay, jitter, bandwidth and reset probability.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ingressbench_results::site::{Link, LinkOverhead, Topology};

use crate::results::RunResults;
use crate::svg::{document, esc};

const BOX_WIDTH: f64 = 170.0;
const COLUMN_GAP: f64 = 110.0;
const LINE: f64 = 14.0;
const MARGIN: f64 = 16.0;
/// Parts listed in a node's box before "+N more".
const MAX_PARTS: usize = 4;

/// The section: one diagram per distinct topology, naming the cells that ran on it, and
/// the links' own measured added time. `None` when no cell ran on more than one node.
pub(crate) fn section(run: &RunResults) -> Option<(String, Vec<(String, String)>)> {
    // Topology (as JSON text) -> (topology, who ran on it, the first cell's relay overhead).
    let mut seen: BTreeMap<String, (&Topology, Vec<String>, Option<LinkOverhead>)> =
        BTreeMap::new();
    for cell in &run.cells {
        let Some(entry) = run.record.cells.get(cell.index) else {
            continue;
        };
        let Some(topology) = entry.topology.as_ref() else {
            continue;
        };
        let who = format!("{} {}", cell.target, cell.settings_label())
            .trim()
            .to_owned();
        let slot = seen
            .entry(serde_json::to_string(topology).unwrap_or_default())
            .or_insert_with(|| (topology, Vec::new(), None));
        if !slot.1.contains(&who) {
            slot.1.push(who);
        }
        if slot.2.is_none() {
            slot.2 = entry.link_overhead_us;
        }
    }
    if seen.is_empty() {
        return None;
    }
    let mut html = String::from("<section><h2>Where it ran</h2><p class=\"note\">The nodes of each topology, left to right along a request's path (client, L4 front, proxies, sidecar, backends), and the emulated links between them (one-way delay ± jitter, each direction; bandwidth and reset probability when set). A request and its answer cross each link once each way. Below each, the links' own added time per chunk, as the relays measured it.</p>");
    let mut charts = Vec::new();
    for (i, (_, (topology, who, overhead))) in seen.into_iter().enumerate() {
        let svg = diagram(topology);
        let isolation = if topology.isolation == "netns" {
            "each node a network namespace"
        } else {
            "each node an address on loopback"
        };
        let _ = write!(
            html,
            "<figure><figcaption>{} ({})</figcaption>{svg}",
            esc(&who.join(", ")),
            esc(isolation)
        );
        if let Some(o) = overhead {
            let _ = write!(
                html,
                "<p class=\"note\">Links' own added time beyond their delay, first cell: p50 {} us, p99 {} us over {} chunks.</p>",
                o.p50, o.p99, o.chunks
            );
        }
        html.push_str("</figure>");
        charts.push((format!("topology {}", i + 1), svg));
    }
    html.push_str("</section>");
    Some((html, charts))
}

/// One node's box.
struct NodeBox {
    name: String,
    lines: Vec<String>,
    outside: bool,
    x: f64,
    y: f64,
    height: f64,
}

/// Draws one topology.
fn diagram(topology: &Topology) -> String {
    let nodes = &topology.nodes;
    // The columns in use, in path order, numbered from 0.
    let mut columns: Vec<u64> = nodes.iter().map(|n| n.column).collect();
    columns.sort_unstable();
    columns.dedup();
    let mut heights = vec![MARGIN + 3.0 * LINE; columns.len()];
    let mut boxes = Vec::new();
    for n in nodes {
        let Some(col) = columns.iter().position(|x| *x == n.column) else {
            continue;
        };
        let parts = &n.runs;
        let mut lines = vec![n.address.clone()];
        lines.extend(parts.iter().take(MAX_PARTS).cloned());
        if parts.len() > MAX_PARTS {
            lines.push(format!("+{} more", parts.len() - MAX_PARTS));
        }
        let height = LINE * (lines.len() as f64 + 1.0) + 10.0;
        let x = MARGIN + col as f64 * (BOX_WIDTH + COLUMN_GAP);
        let y = heights[col];
        heights[col] += height + 14.0;
        boxes.push(NodeBox {
            name: n.name.clone(),
            lines,
            outside: n.outside,
            x,
            y,
            height,
        });
    }
    let width = MARGIN * 2.0 + columns.len() as f64 * (BOX_WIDTH + COLUMN_GAP) - COLUMN_GAP;
    let height = heights.iter().copied().fold(0.0, f64::max) + MARGIN;
    let mut body = String::new();
    for link in &topology.links {
        let find = |name: &str| boxes.iter().find(|b| b.name == name);
        let (Some(from), Some(to)) = (find(&link.from), find(&link.to)) else {
            continue;
        };
        let (x1, y1) = (from.x + BOX_WIDTH, from.y + from.height / 2.0);
        let (x2, y2) = (to.x, to.y + to.height / 2.0);
        let _ = write!(
            body,
            r##"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="#0072b2" stroke-width="1.5"/>"##
        );
        // The label by the line's start, one part per line, above it.
        let parts = link_label(link);
        for (i, part) in parts.iter().rev().enumerate() {
            let _ = write!(
                body,
                r##"<text class="link" x="{:.1}" y="{:.1}">{}</text>"##,
                x1 + 6.0,
                y1 - 5.0 - 12.0 * i as f64,
                esc(part)
            );
        }
    }
    for b in &boxes {
        let dash = if b.outside {
            r#" stroke-dasharray="5 3""#
        } else {
            ""
        };
        let _ = write!(
            body,
            r##"<rect x="{:.1}" y="{:.1}" width="{BOX_WIDTH}" height="{:.1}" rx="6" fill="#f5f9fc" stroke="#555"{dash}/><text class="axis" x="{:.1}" y="{:.1}" font-weight="bold">{}{}</text>"##,
            b.x,
            b.y,
            b.height,
            b.x + 8.0,
            b.y + LINE + 2.0,
            esc(&b.name),
            if b.outside { " (outside)" } else { "" }
        );
        for (i, line) in b.lines.iter().enumerate() {
            let _ = write!(
                body,
                r##"<text class="tick" x="{:.1}" y="{:.1}">{}</text>"##,
                b.x + 8.0,
                b.y + LINE * (i as f64 + 2.0) + 2.0,
                esc(line)
            );
        }
    }
    document(width, height, "topology", &body)
}

/// `["0.3 ms ± 0.05 ms", "100 Mbit/s", "reset 0.1%"]`.
fn link_label(link: &Link) -> Vec<String> {
    let ms = |us: u64| us as f64 / 1000.0;
    let mut delay = format!("{} ms", trim(ms(link.delay_us)));
    if link.jitter_us > 0 {
        let _ = write!(delay, " ± {} ms", trim(ms(link.jitter_us)));
    }
    let mut parts = vec![delay];
    if let Some(b) = link.bandwidth_bytes_per_s {
        parts.push(format!("{} Mbit/s", trim(b as f64 * 8.0 / 1e6)));
    }
    if link.reset > 0.0 {
        parts.push(format!("reset {}%", trim(link.reset * 100.0)));
    }
    parts
}

/// A number without trailing zeros (`0.3`, `20`, `0.05`).
fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nodes_go_left_to_right_along_the_path_and_links_are_labelled() {
        let t: Topology = serde_json::from_value(json!({
            "isolation": "loopback",
            "nodes": [
                { "name": "internet-client", "address": "127.0.0.1", "column": 0, "outside": true, "runs": ["client"] },
                { "name": "echo-1", "address": "127.0.1.1", "column": 4, "outside": false, "runs": ["echo-1"] },
                { "name": "ingress", "address": "127.0.2.1", "column": 2, "outside": false, "runs": ["nginx x2", "<b>"] },
            ],
            "links": [
                { "from": "internet-client", "to": "ingress", "delay_us": 20000, "jitter_us": 2000, "bandwidth_bytes_per_s": 12500000, "reset": 0.001 },
                { "from": "ingress", "to": "echo-1", "delay_us": 300, "jitter_us": 50, "bandwidth_bytes_per_s": null, "reset": 0.0 },
            ],
        }))
        .unwrap();
        let svg = diagram(&t);
        for part in ["20 ms ± 2 ms", "100 Mbit/s", "reset 0.1%"] {
            assert!(svg.contains(part), "{part}: {svg}");
        }
        assert!(svg.contains("0.3 ms ± 0.05 ms"), "{svg}");
        assert!(svg.contains("internet-client (outside)"), "{svg}");
        assert!(svg.contains("&lt;b&gt;") && !svg.contains("<b>"), "escaped");
        // Three columns in use: client, proxies, backends, left to right.
        let x_of = |name: &str| {
            let at = svg.find(&format!(">{name}")).unwrap();
            let tag = &svg[..at];
            let x = tag.rsplit("x=\"").next().unwrap();
            x.split('"').next().unwrap().parse::<f64>().unwrap()
        };
        assert!(x_of("internet-client") < x_of("ingress"));
        assert!(x_of("ingress") < x_of("echo-1"));
        assert_eq!(svg.matches("<line").count(), 2);
    }
}
