//! The kernel section: what each target and setting ran with, as read back from the
//! kernel (the proxy node's sysctls, the backlog each listener got, the proxies' open-file
//! limit), what the proxy node's listen queues dropped, and the client's connect times
//! beside it: a full accept queue shows in both, counted by each side.

use std::fmt::Write as _;

use ingressbench_results::site::Kernel;

use crate::analysis::{self, Condition};
use crate::results::RunResults;
use crate::svg::esc;

/// The section, or `None` when no cell recorded its kernel (upstream targets, results
/// from before it was recorded).
pub(crate) fn section(run: &RunResults, conditions: &[Condition]) -> Option<String> {
    let mut rows = String::new();
    for c in conditions {
        let records: Vec<&Kernel> = (c.cells.iter())
            .filter_map(|i| run.record.cells.get(*i)?.kernel.as_ref())
            .collect();
        let Some(first) = records.first() else {
            continue;
        };
        let cell = run.cells.iter().find(|x| Some(&x.index) == c.cells.first());
        let phase = |name: &str| -> String {
            let Some(cell) = cell else {
                return "-".into();
            };
            let n = cell.number(&["phases_us", name, "count"]).unwrap_or(0.0);
            if n == 0.0 {
                return "-".into();
            }
            let ms = |key: &str| {
                analysis::ms(cell.number(&["phases_us", name, key]).unwrap_or(0.0) * 1e-3)
            };
            format!("{n} / {} / {}", ms("p99"), ms("max"))
        };
        // Summed over repeats: each cell counted from its own load's start.
        let mut queue = (0u64, 0u64, false);
        for nodes in records.iter().filter_map(|k| k.listen_queue.as_ref()) {
            queue.2 = true;
            for c in nodes.values() {
                queue.0 += c.overflows;
                queue.1 += c.drops;
            }
        }
        let _ = write!(
            rows,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&c.target),
            esc(&c.settings),
            esc(&sysctls(first)),
            esc(&backlogs(first)),
            (first.open_files.values())
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            if queue.2 {
                format!("{} / {}", queue.0, queue.1)
            } else {
                "not counted (loopback)".into()
            },
            phase("warmup_connect"),
            phase("connect"),
        );
    }
    if rows.is_empty() {
        return None;
    }
    Some(format!(
        "<section><h2>Kernel</h2><p class=\"note\">What each proxy ran with, read back from its node's kernel: sysctls in force (every one the scenario set, and net.core.somaxconn of the proxy's node), the accept-queue length each listener got (its own backlog, capped by somaxconn; port: length) and the proxies' open-file limit. Then what the proxy node's listen queues dropped from the load's start to its end, warm-up included (the kernel's ListenOverflows / ListenDrops, summed over repeats; namespace isolation only), and the client's TCP connect times, first repeat: connections opened during warm-up, whose requests are not measured, and during measurement (count / p99 / max, ms). A connect that waited about 1 s or more waited for a retransmitted SYN: the listener's queue was full.</p><table><tr><th class=\"l\">target</th><th class=\"l\">settings</th><th class=\"l\">sysctls in force</th><th class=\"l\">accept queue</th><th>open files</th><th>overflows / drops</th><th>connects at start</th><th>connects measured</th></tr>{rows}</table></section>"
    ))
}

/// `node: name=value, …; node: …` of a kernel record.
fn sysctls(kernel: &Kernel) -> String {
    (kernel.sysctls.iter())
        .map(|(node, settings)| {
            let list: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{node}: {}", list.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `port: backlog, …` of a kernel record's listeners.
fn backlogs(kernel: &Kernel) -> String {
    (kernel.listeners.iter())
        .map(|l| {
            let backlog = l.backlog.map_or("?".into(), |b| b.to_string());
            format!("{}: {backlog}", l.port)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_record_reads_as_settings_and_queue_lengths() {
        let k: Kernel = serde_json::from_value(json!({
            "sysctls": { "node-1": { "net.core.somaxconn": "128", "net.ipv4.ip_local_port_range": "1024 65000" } },
            "listeners": [{ "proxy": "nginx", "node": "node-1", "port": 8080, "backlog": 128 }, { "proxy": "nginx", "node": "node-1", "port": 8443, "backlog": null }],
        }))
        .unwrap();
        assert_eq!(
            sysctls(&k),
            "node-1: net.core.somaxconn=128, net.ipv4.ip_local_port_range=1024 65000"
        );
        assert_eq!(backlogs(&k), "8080: 128, 8443: ?");
    }
}
