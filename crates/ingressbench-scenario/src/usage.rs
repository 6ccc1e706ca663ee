//! What the system under test spent while a cell ran: each part's CPU time and resident
//! memory, sampled once a second from `/proc` and written to `usage.jsonl` as the cell
//! goes, then summarised per cell (CPU per 1,000 requests, peak and mean memory) and per
//! event (the CPU spike around it).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use ingressbench_lab::usage::{Part, PartUsage, UsageReader};
use ingressbench_results::impact::CpuAround;
use ingressbench_results::site::{PartReading, PartSpent, Slope, Spent, Usage, UsageReading};

/// How often the parts are sampled.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);
/// How far before and after an event its CPU figures look.
const EVENT_SPAN_S: f64 = 5.0;

/// One reading of every part, at `t_s` seconds from the start of measurement.
#[derive(Clone, Debug)]
pub(crate) struct Reading {
    pub(crate) t_s: f64,
    pub(crate) parts: Vec<PartUsage>,
}

impl Reading {
    /// CPU seconds of the parts with `role`, together.
    fn cpu_s(&self, role: &str) -> f64 {
        self.parts
            .iter()
            .filter(|p| p.role == role)
            .map(|p| p.cpu_s)
            .sum()
    }
}

/// A one-second grid aligned to the start of measurement (so one reading falls exactly
/// there), from the first of its points at or after the load's start: when the usage log
/// and the proxies' counts read.
pub(crate) struct Grid {
    next_at: Instant,
}

impl Grid {
    /// The grid of a load that starts at `start` and is measured from `measure_from`.
    pub(crate) fn new(start: Instant, measure_from: Instant) -> Self {
        let behind = measure_from.saturating_duration_since(start);
        Self {
            next_at: measure_from - Duration::from_secs(behind.as_secs()),
        }
    }

    /// Whether a reading is due by `now` (the next one is then the grid's next point
    /// after `now`).
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        if now < self.next_at {
            return false;
        }
        while self.next_at <= now {
            self.next_at += INTERVAL;
        }
        true
    }
}

/// Samples the parts on the one-second [`Grid`], appending each reading to `usage.jsonl`.
pub(crate) struct UsageLog {
    reader: UsageReader,
    parts: Vec<Part>,
    file: File,
    measure_from: Instant,
    grid: Grid,
    readings: Vec<Reading>,
    /// CPU seconds of processes a part had before they were replaced (a proxy restarted),
    /// by part name: added beneath what its processes now spend.
    spent_before: std::collections::BTreeMap<String, f64>,
    /// Where the readings go; with `on_disk`, read back from there when the load ends.
    path: std::path::PathBuf,
    /// Only the last reading is held while the load runs (a soak: hours of readings would
    /// grow the tool's memory with time); [`UsageLog::read_back`] reads the rest.
    on_disk: bool,
}

impl UsageLog {
    /// Starts the log at `path` with a first reading now; `start` is when the load starts
    /// (the grid's first point at or after it is the next reading).
    pub(crate) fn new(
        path: &Path,
        mut parts: Vec<Part>,
        start: Instant,
        measure_from: Instant,
    ) -> std::io::Result<Self> {
        parts.push(Part::process("client", "client", std::process::id()));
        let mut log = Self {
            reader: UsageReader::new(),
            parts,
            file: File::create(path)?,
            measure_from,
            grid: Grid::new(start, measure_from),
            readings: Vec::new(),
            spent_before: std::collections::BTreeMap::new(),
            path: path.to_owned(),
            on_disk: false,
        };
        log.read_now(Instant::now())?;
        Ok(log)
    }

    /// Holds only the last reading while the load runs; the others are read back from
    /// the file by [`UsageLog::read_back`].
    pub(crate) fn on_disk(mut self) -> Self {
        self.on_disk = true;
        self
    }

    /// Once the load has ended, the readings an `on_disk` log did not hold, from its file.
    pub(crate) fn read_back(&mut self) -> std::io::Result<()> {
        if !self.on_disk {
            return Ok(());
        }
        let mut readings = Vec::new();
        for r in read_jsonl::<UsageReading>(&self.path)? {
            let parts = (r.parts.into_iter())
                .map(|p| PartUsage {
                    role: role_named(&p.role),
                    name: p.name,
                    cpu_s: p.cpu_s,
                    rss_bytes: p.rss_bytes,
                    processes: p.processes as u32,
                    fds: p.fds,
                })
                .collect();
            readings.push(Reading { t_s: r.t_s, parts });
        }
        self.readings = readings;
        self.on_disk = false;
        Ok(())
    }

    /// Takes a reading if one is due by `now`, of the site's parts as `parts` gives them
    /// then (a restart replaces a proxy's processes).
    pub(crate) fn poll(
        &mut self,
        now: Instant,
        parts: impl FnOnce() -> Vec<Part>,
    ) -> std::io::Result<()> {
        if !self.grid.due(now) {
            return Ok(());
        }
        self.follow(parts());
        self.read_now(now)
    }

    /// Reads `parts` from now on (the client's own part kept): a part whose processes were
    /// replaced keeps, beneath what the new ones spend, what the old ones had spent at the
    /// last reading (what they spent after it, up to their end, is not seen).
    fn follow(&mut self, parts: Vec<Part>) {
        let last = self.readings.last();
        for part in &parts {
            let Some(old) = self.parts.iter().find(|o| o.name == part.name) else {
                continue;
            };
            if old.source == part.source {
                continue;
            }
            let before = last
                .and_then(|r| r.parts.iter().find(|p| p.name == part.name))
                .map_or(0.0, |p| p.cpu_s);
            // The last reading already holds what earlier replaced processes spent.
            self.spent_before.insert(part.name.clone(), before);
        }
        let client = self.parts.iter().find(|p| p.role == "client").cloned();
        self.parts = parts;
        self.parts.extend(client);
    }

    /// Takes a reading now (the last, when the load has ended).
    pub(crate) fn read_now(&mut self, now: Instant) -> std::io::Result<()> {
        let t_s = signed_offset(now, self.measure_from);
        let mut parts = self.reader.read(&self.parts);
        for p in &mut parts {
            p.cpu_s += self.spent_before.get(&p.name).copied().unwrap_or(0.0);
        }
        let line = UsageReading {
            t_s: round6(t_s),
            parts: (parts.iter())
                .map(|p| PartReading {
                    name: p.name.clone(),
                    role: p.role.to_owned(),
                    cpu_s: round6(p.cpu_s),
                    rss_bytes: p.rss_bytes,
                    processes: u64::from(p.processes),
                    fds: p.fds,
                })
                .collect(),
        };
        writeln!(
            self.file,
            "{}",
            serde_json::to_string(&line).map_err(std::io::Error::other)?
        )?;
        self.file.flush()?;
        if self.on_disk {
            self.readings.clear();
        }
        self.readings.push(Reading { t_s, parts });
        Ok(())
    }

    /// Every reading so far, in order.
    pub(crate) fn readings(&self) -> &[Reading] {
        &self.readings
    }

    /// The cell's figures, per part and per role: CPU seconds during measurement, CPU
    /// milliseconds per 1,000 of `requests`, and resident memory (peak and mean of the
    /// readings), for `run.json`.
    pub(crate) fn summary(&self, requests: u64) -> Option<Usage> {
        summarise(&self.readings, requests)
    }

    /// The CPU each role spent around an event at `t_s`, for `impact.json`.
    pub(crate) fn around(&self, t_s: f64) -> BTreeMap<String, CpuAround> {
        (self.roles().into_iter())
            .filter_map(|role| Some((role.to_owned(), spike(&self.readings, role, t_s)?)))
            .collect()
    }

    /// The resident memory of the parts with `role`, together, at the last reading
    /// before `t_s` (the first reading when none is before it).
    pub(crate) fn rss_before(&self, role: &str, t_s: f64) -> Option<u64> {
        let reading = self
            .readings
            .iter()
            .rev()
            .find(|r| r.t_s < t_s)
            .or(self.readings.first())?;
        let mut of_role = reading.parts.iter().filter(|p| p.role == role).peekable();
        of_role.peek()?;
        Some(of_role.map(|p| p.rss_bytes).sum())
    }

    /// CPU seconds the parts with `role` spent between the last readings before `from_s`
    /// and before `to_s` (see [`cpu_between`]).
    pub(crate) fn cpu_between(&self, role: &str, from_s: f64, to_s: f64) -> Option<f64> {
        cpu_between(&self.readings, role, from_s, to_s)
    }

    fn roles(&self) -> Vec<&'static str> {
        let mut roles: Vec<&'static str> = Vec::new();
        for p in &self.parts {
            if !roles.contains(&p.role) {
                roles.push(p.role);
            }
        }
        roles
    }
}

/// Every line of a JSON-lines file this cell wrote, as `T` (one that does not parse is an
/// error: the file is the tool's own).
pub(crate) fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> std::io::Result<Vec<T>> {
    let text = std::fs::read_to_string(path)?;
    (text.lines())
        .map(|line| serde_json::from_str(line).map_err(std::io::Error::other))
        .collect()
}

/// A role as the parts name it, from its name in usage.jsonl.
fn role_named(role: &str) -> &'static str {
    match role {
        "proxy" => "proxy",
        "backend" => "backend",
        "client" => "client",
        "controller" => "controller",
        "front" => "front",
        "sidecar" => "sidecar",
        _ => "other",
    }
}

/// Seconds from `zero` to `t`, negative before it.
pub(crate) fn signed_offset(t: Instant, zero: Instant) -> f64 {
    match t.checked_duration_since(zero) {
        Some(d) => d.as_secs_f64(),
        None => -zero.duration_since(t).as_secs_f64(),
    }
}

fn summarise(readings: &[Reading], requests: u64) -> Option<Usage> {
    // Measurement starts at the first reading at or after 0 (the grid puts one there).
    let measured: Vec<&Reading> = readings.iter().filter(|r| r.t_s >= -1e-3).collect();
    let (first, last) = (measured.first()?, measured.last()?);
    let per_1000 =
        |cpu_s: f64| (requests > 0).then(|| round3(cpu_s * 1e3 / (requests as f64 / 1e3)));
    let memory = |rss: Vec<u64>| {
        let peak = rss.iter().copied().max().unwrap_or(0);
        let mean = rss.iter().sum::<u64>() / rss.len().max(1) as u64;
        (peak, mean)
    };
    // Resident memory against minutes from the start of measurement, as a slope with
    // its interval.
    let growth = |rss: Vec<(f64, u64)>| {
        let points: Vec<(f64, f64)> = rss.into_iter().map(|(t, b)| (t / 60.0, b as f64)).collect();
        ingressbench_stats::growth::growth(&points).map(|e| Slope {
            value: e.value.round(),
            low: e.low.round(),
            high: e.high.round(),
        })
    };
    // By name: a restart can change a site's parts (a controller whose proxy it starts
    // has none between its processes).
    let of = |r: &'_ Reading, name: &str| r.parts.iter().find(|q| q.name == name).cloned();
    let parts = first
        .parts
        .iter()
        .map(|p| {
            let cpu_s = of(last, &p.name).map_or(0.0, |l| l.cpu_s - p.cpu_s);
            let rss: Vec<(f64, u64)> = (measured.iter())
                .filter_map(|r| Some((r.t_s, of(r, &p.name)?.rss_bytes)))
                .collect();
            let (peak, mean) = memory(rss.iter().map(|(_, b)| *b).collect());
            PartSpent {
                name: p.name.clone(),
                role: p.role.to_owned(),
                spent: Spent {
                    cpu_s: round3(cpu_s),
                    cpu_ms_per_1000_requests: per_1000(cpu_s),
                    cpu_cores_mean: None,
                    rss_peak_bytes: peak,
                    rss_mean_bytes: mean,
                    rss_growth_bytes_per_min: growth(rss),
                },
            }
        })
        .collect();
    let mut roles = BTreeMap::new();
    for p in &first.parts {
        if roles.contains_key(p.role) {
            continue;
        }
        let cpu_s = last.cpu_s(p.role) - first.cpu_s(p.role);
        let rss = |r: &Reading| -> u64 {
            r.parts
                .iter()
                .filter(|q| q.role == p.role)
                .map(|q| q.rss_bytes)
                .sum()
        };
        let (peak, mean) = memory(measured.iter().map(|r| rss(r)).collect());
        let over_time = measured.iter().map(|r| (r.t_s, rss(r))).collect();
        roles.insert(
            p.role.to_owned(),
            Spent {
                cpu_s: round3(cpu_s),
                cpu_ms_per_1000_requests: per_1000(cpu_s),
                cpu_cores_mean: Some(round3(cpu_s / (last.t_s - first.t_s).max(1e-9))),
                rss_peak_bytes: peak,
                rss_mean_bytes: mean,
                rss_growth_bytes_per_min: growth(over_time),
            },
        );
    }
    Some(Usage {
        interval_s: INTERVAL.as_secs_f64(),
        measured_s: round3(last.t_s - first.t_s),
        requests,
        by_role: roles,
        parts,
    })
}

/// The CPU of `role` around an event at `t_s`, from the readings on each side of it (the
/// one at or before the event starts the "after" span): the mean rate over the 5 s before
/// and its highest one-second rate (in cores), the highest one-second rate in the 5 s
/// after and when its second began (seconds from the event), and the CPU spent in those
/// 5 s beyond the rate before (`extra_cpu_ms`). `None` without a reading after it.
fn spike(readings: &[Reading], role: &str, t_s: f64) -> Option<CpuAround> {
    // Readings are taken a few milliseconds after their grid point: a little slack.
    const SLACK_S: f64 = 0.1;
    let at = readings.iter().rposition(|r| r.t_s <= t_s)?;
    let at_s = readings[at].t_s;
    let from = readings
        .iter()
        .position(|r| r.t_s >= at_s - EVENT_SPAN_S - SLACK_S)
        .filter(|&i| i < at);
    let until = readings
        .iter()
        .position(|r| r.t_s >= at_s + EVENT_SPAN_S - SLACK_S)
        .unwrap_or(readings.len() - 1);
    if until <= at {
        return None;
    }
    let rate = |a: &Reading, b: &Reading| (b.cpu_s(role) - a.cpu_s(role)) / (b.t_s - a.t_s);
    let peak = |span: &[Reading]| {
        span.windows(2)
            .map(|w| (rate(&w[0], &w[1]), w[0].t_s))
            .fold(None, |best: Option<(f64, f64)>, x| match best {
                Some(b) if b.0 >= x.0 => Some(b),
                _ => Some(x),
            })
    };
    let before = from.map(|i| rate(&readings[i], &readings[at]));
    let peak_before = from.and_then(|i| peak(&readings[i..=at]));
    let peak_after = peak(&readings[at..=until]);
    let spent = readings[until].cpu_s(role) - readings[at].cpu_s(role);
    let span = readings[until].t_s - at_s;
    Some(CpuAround {
        cores_before: before.map(round3),
        peak_cores_before: peak_before.map(|p| round3(p.0)),
        peak_cores_after: peak_after.map(|p| round3(p.0)),
        peak_after_at_s: peak_after.map(|p| round3(p.1 - t_s)),
        cpu_ms_after: round3(spent * 1e3),
        extra_cpu_ms: before.map(|b| round3((spent - b * span) * 1e3)),
        after_s: round3(span),
    })
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// CPU seconds the parts with `role` spent between the last readings before `from_s` and
/// before `to_s` (the readings are a second apart, so this is to a second); none when no
/// part has the role.
fn cpu_between(readings: &[Reading], role: &str, from_s: f64, to_s: f64) -> Option<f64> {
    let at = |t: f64| {
        readings
            .iter()
            .rev()
            .find(|r| r.t_s < t)
            .or(readings.first())
    };
    let (from, to) = (at(from_s)?, at(to_s)?);
    from.parts
        .iter()
        .any(|p| p.role == role)
        .then(|| (to.cpu_s(role) - from.cpu_s(role)).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_has_a_point_at_the_start_of_measurement_and_one_a_second_from_the_load() {
        let measure_from = Instant::now() + Duration::from_secs(10);
        // A warm-up of 2.5 s: the grid starts 2 s before measurement.
        let mut grid = Grid::new(measure_from - Duration::from_millis(2500), measure_from);
        let at = |s: f64| {
            if s < 0.0 {
                measure_from - Duration::from_secs_f64(-s)
            } else {
                measure_from + Duration::from_secs_f64(s)
            }
        };
        assert!(!grid.due(at(-2.1)));
        assert!(grid.due(at(-2.0)));
        assert!(!grid.due(at(-1.5)));
        // Late by 1.2 s: one reading, and the next on the grid.
        assert!(grid.due(at(0.2)));
        assert!(!grid.due(at(0.9)));
        assert!(grid.due(at(1.0)));
    }

    #[test]
    fn a_steps_cpu_is_read_between_the_readings_around_it() {
        let r = readings();
        // From 10.5 s to 12.5 s: the readings at 10 and 12, 0.2 s and the 0.3 s spike.
        let spent = cpu_between(&r, "proxy", 10.5, 12.5).unwrap();
        assert!((spent - 0.5).abs() < 1e-9, "{spent}");
        assert_eq!(cpu_between(&r, "controller", 10.5, 12.5), None);
        let to_end = cpu_between(&r, "proxy", 19.5, f64::INFINITY).unwrap();
        assert!((to_end - 0.1).abs() < 1e-9, "{to_end}");
    }

    fn reading(t_s: f64, proxy_cpu_s: f64, rss: u64) -> Reading {
        let part = |name: &str, role, cpu_s| PartUsage {
            name: name.into(),
            role,
            cpu_s,
            rss_bytes: rss,
            processes: 1,
            fds: None,
        };
        Reading {
            t_s,
            parts: vec![
                part("nginx-1", "proxy", proxy_cpu_s / 2.0),
                part("nginx-2", "proxy", proxy_cpu_s / 2.0),
                part("client", "client", t_s.max(0.0) * 0.2),
            ],
        }
    }

    /// The proxies spend 0.1 core, except 0.3 s extra in the second after 10 s.
    fn readings() -> Vec<Reading> {
        (-2..=20)
            .map(|t| {
                let t = f64::from(t);
                let cpu = 5.0 + 0.1 * t + if t >= 11.0 { 0.3 } else { 0.0 };
                reading(t, cpu, 1_000_000 + if t == 11.0 { 500_000 } else { 0 })
            })
            .collect()
    }

    #[test]
    fn a_cell_spends_what_its_readings_say_from_the_start_of_measurement() {
        let v = serde_json::to_value(summarise(&readings(), 4_000)).unwrap();
        let proxy = &v["by_role"]["proxy"];
        // 20 s at 0.1 core, plus 0.3 s: 2.3 s for 4,000 requests.
        assert_eq!(proxy["cpu_s"], 2.3);
        assert_eq!(proxy["cpu_ms_per_1000_requests"], 575.0);
        assert_eq!(proxy["cpu_cores_mean"], 0.115);
        // Two replicas, each 1 MB, one reading at 1.5 MB each.
        assert_eq!(proxy["rss_peak_bytes"], 3_000_000);
        assert_eq!(v["parts"][0]["cpu_s"], 1.15);
        assert_eq!(v["by_role"]["client"]["cpu_s"], 4.0);
        assert_eq!(v["measured_s"], 20.0);
    }

    #[test]
    fn an_event_shows_its_spike_beyond_the_rate_before_it() {
        let v = spike(&readings(), "proxy", 10.2).unwrap();
        assert_eq!(v.cores_before, Some(0.1));
        assert_eq!(v.peak_cores_before, Some(0.1));
        assert_eq!(v.peak_cores_after, Some(0.4));
        assert_eq!(v.peak_after_at_s, Some(-0.2));
        assert_eq!(v.extra_cpu_ms, Some(300.0));
        assert_eq!(v.after_s, 5.0);
        // Nothing after the last reading to compare with.
        assert!(spike(&readings(), "proxy", 20.5).is_none());
        // Nothing before the first: no rate before, but the spike is still measured.
        let early = spike(&readings(), "proxy", -2.0).unwrap();
        assert_eq!(early.cores_before, None);
    }
}
