//! What the driver does beside firing events, one small watcher per job, each looked at
//! once a turn of its loop: whether the site's parts still run ([`Liveness`]), the side
//! figures read on their one-second grid ([`SideFigures`]: usage.jsonl and
//! proxy-metrics.jsonl), and the record of what happened ([`EventsLog`]: events.jsonl).

use std::fs::File;
use std::io::Write;
use std::time::{Duration, Instant};

use ingressbench_lab::proxy::ProxyKind;
use ingressbench_lab::ChangeRecord;
use ingressbench_results::events::{Applied, EventLine};

use super::offset;
use crate::proxy_counts::ProxyCounts;
use crate::site::Site;
use crate::usage::{signed_offset, UsageLog};

/// How often the site's parts are checked to be running.
const ALIVE_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// Whether the site's parts (a proxy, the front, a sidecar, a backend) still run: one
/// that dies is not the system under test any more, and fails the cell.
pub(crate) struct Liveness {
    checked_at: Instant,
    measure_from: Instant,
}

impl Liveness {
    /// Checks from now on, for a cell measured from `measure_from`.
    pub(crate) fn new(measure_from: Instant) -> Self {
        Self {
            checked_at: Instant::now(),
            measure_from,
        }
    }

    /// At `now`, if a check is due: why the site is not alive, if it is not.
    pub(crate) fn watch(&mut self, now: Instant, site: &mut dyn Site) -> Result<(), String> {
        if now.duration_since(self.checked_at) < ALIVE_CHECK_INTERVAL {
            return Ok(());
        }
        self.checked_at = now;
        site.check_alive().map_err(|e| {
            format!(
                "{:.3} s into the cell: {e}",
                signed_offset(now, self.measure_from)
            )
        })
    }
}

/// The figures read beside the load on their one-second grid: what the site's parts
/// spend (usage.jsonl) and what its proxies count (proxy-metrics.jsonl). Each is a side
/// figure: a file that cannot be written ends it, not the cell.
pub(crate) struct SideFigures {
    /// What the site's parts spend.
    pub(crate) usage: Option<UsageLog>,
    /// What the proxies themselves count.
    pub(crate) counts: Option<ProxyCounts>,
}

impl SideFigures {
    /// Reads each figure whose reading is due by `now`.
    pub(crate) fn watch(&mut self, now: Instant, site: &mut dyn Site) {
        let parts = &*site;
        if (self.usage.as_mut()).is_some_and(|u| u.poll(now, || parts.usage_parts()).is_err()) {
            self.usage = None;
        }
        if (self.counts.as_mut()).is_some_and(|c| c.poll(now, site).is_err()) {
            self.counts = None;
        }
    }
}

/// events.jsonl: a line for each event as it fires (requested, or failed), and one for
/// each change as the site applies it. A line that cannot be written is left out; the
/// cell goes on.
pub(crate) struct EventsLog {
    file: File,
    measure_from: Instant,
    /// The site's records already written as applied.
    reported: usize,
}

impl EventsLog {
    /// The log in `file`, for a cell measured from `measure_from`.
    pub(crate) fn new(file: File, measure_from: Instant) -> Self {
        Self {
            file,
            measure_from,
            reported: 0,
        }
    }

    /// Appends `line`.
    pub(crate) fn write(&mut self, line: &EventLine) {
        let text = serde_json::to_string(line).unwrap_or_default();
        let _ = writeln!(self.file, "{text}").and_then(|()| self.file.flush());
    }

    /// Writes each of the site's `records` applied since the last call, in order.
    pub(crate) fn watch(&mut self, records: &[ChangeRecord]) {
        for rec in &records[self.reported.min(records.len())..] {
            let Some(applied) = rec.applied_at else { break };
            let at = |t: Option<Instant>| t.map(|t| offset(t, self.measure_from));
            let line = EventLine::Applied(Applied {
                what: rec.what.clone(),
                applied_s: offset(applied, self.measure_from),
                mechanisms: named(&rec.mechanisms),
                endpoints_s: at(rec.endpoints_at),
                // In a cluster, known once the API answered (the pod an event picked).
                started: rec.started.clone(),
                removed: rec.removed.clone(),
                completed_s: at(rec.completed_at),
                versions_after: named(&rec.versions),
            });
            self.write(&line);
            self.reported += 1;
        }
    }
}

/// `nginx: reload` for each (proxy, what) pair.
fn named<T: std::fmt::Display>(pairs: &[(ProxyKind, T)]) -> Vec<String> {
    pairs.iter().map(|(k, m)| format!("{k}: {m}")).collect()
}
