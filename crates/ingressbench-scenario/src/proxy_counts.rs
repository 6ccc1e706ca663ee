//! What the proxies themselves counted while a cell ran, read once a second beside the
//! load (`proxy-metrics.jsonl`), and per event what they counted in its window, to stand
//! beside the errors the client saw there (`impact.json`'s `proxy_counted`).
//!
//! The counts are each proxy's own (see `ingressbench_lab::proxy::counters`): connects to
//! backends that failed, responses a backend broke off, retries, 5xx sent, endpoints up,
//! reloads. A count that falls between two readings started again (a reload's new
//! processes): what it holds then is what was counted since.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use ingressbench_lab::proxy::counters::{named, Counted, Readings, ENDPOINTS_UP};
use ingressbench_results::impact::{EndpointsUp, Increases, ProxyCounted};
use ingressbench_results::site::CountsReading;

use crate::site::Site;
use crate::usage::{signed_offset, Grid};

/// One reading: seconds from the start of measurement, and each proxy's counts.
struct Reading {
    t_s: f64,
    proxies: BTreeMap<String, Counted>,
    /// The proxies that could not be read, and why.
    errors: BTreeMap<String, String>,
}

/// The proxies' counts, read on the usage log's one-second grid and appended to
/// `proxy-metrics.jsonl` as they come.
pub(crate) struct ProxyCounts {
    file: File,
    measure_from: Instant,
    grid: Grid,
    readings: Vec<Reading>,
    /// Where the readings go; with `on_disk`, read back from there when the load ends.
    path: std::path::PathBuf,
    /// Only the last reading is held while the load runs (a soak's hours would grow the
    /// tool's memory with time); [`ProxyCounts::read_back`] reads the rest.
    on_disk: bool,
}

impl ProxyCounts {
    /// Holds only the last reading while the load runs; the others are read back from
    /// the file by [`ProxyCounts::read_back`].
    pub(crate) fn on_disk(mut self) -> Self {
        self.on_disk = true;
        self
    }

    /// Once the load has ended, the readings an `on_disk` log did not hold, from its file
    /// (a count by a name this tool does not know is left out).
    pub(crate) fn read_back(&mut self) -> std::io::Result<()> {
        if !self.on_disk {
            return Ok(());
        }
        let mut readings = Vec::new();
        for r in crate::usage::read_jsonl::<CountsReading>(&self.path)? {
            let proxies = (r.proxies.into_iter())
                .map(|(name, counts)| {
                    let counted = (counts.into_iter())
                        .filter_map(|(k, v)| Some((named(&k)?, v)))
                        .collect();
                    (name, counted)
                })
                .collect();
            readings.push(Reading {
                t_s: r.t_s,
                proxies,
                errors: r.errors,
            });
        }
        self.readings = readings;
        self.on_disk = false;
        Ok(())
    }

    /// Starts the file at `path` with a first reading now, if the site's proxies count
    /// anything it can read (none: no file).
    pub(crate) fn new(
        path: &Path,
        site: &mut dyn Site,
        start: Instant,
        measure_from: Instant,
    ) -> std::io::Result<Option<Self>> {
        let (at, first) = site.proxy_counters();
        if first
            .iter()
            .all(|(_, c)| c.as_ref().is_ok_and(BTreeMap::is_empty))
        {
            return Ok(None);
        }
        let mut counts = Self {
            file: File::create(path)?,
            measure_from,
            grid: Grid::new(start, measure_from),
            readings: Vec::new(),
            path: path.to_owned(),
            on_disk: false,
        };
        counts.write(at, first)?;
        Ok(Some(counts))
    }

    /// Reads the proxies if a reading is due by `now`.
    pub(crate) fn poll(&mut self, now: Instant, site: &mut dyn Site) -> std::io::Result<()> {
        if !self.grid.due(now) {
            return Ok(());
        }
        let (at, counted) = site.proxy_counters();
        self.write(at, counted)
    }

    /// The last reading, once the load has ended: one taken from then on.
    pub(crate) fn read_last(&mut self, site: &mut dyn Site) -> std::io::Result<()> {
        let (at, counted) = site.last_proxy_counters();
        self.write(at, counted)
    }

    /// Appends the reading taken at `at`, unless it is the last one again (a reading
    /// from a thread of its own that has not read since).
    fn write(&mut self, at: Instant, counted: Readings) -> std::io::Result<()> {
        let t_s = signed_offset(at, self.measure_from);
        if self.readings.last().is_some_and(|r| r.t_s >= t_s) {
            return Ok(());
        }
        let mut proxies = BTreeMap::new();
        let mut errors = BTreeMap::new();
        for (name, c) in counted {
            match c {
                Ok(c) => {
                    proxies.insert(name, c);
                }
                Err(e) => {
                    errors.insert(name, e);
                }
            }
        }
        let line = CountsReading {
            t_s: (t_s * 1e6).round() / 1e6,
            proxies: (proxies.iter())
                .map(|(name, c)| {
                    let counts = c.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
                    (name.clone(), counts)
                })
                .collect(),
            errors: errors.clone(),
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
        self.readings.push(Reading {
            t_s,
            proxies,
            errors,
        });
        Ok(())
    }

    /// What each proxy counted between `from_s` and `to_s` (seconds from the start of
    /// measurement): from the last reading at or before `from_s` to the first at or after
    /// `to_s` (the last one, if none is), each count's increase (a count that started
    /// again adds what it holds after), and the endpoints up before, at the fewest, and
    /// after. `None` when no reading brackets the window.
    pub(crate) fn between(&self, from_s: f64, to_s: f64) -> Option<BTreeMap<String, ProxyCounted>> {
        let first = self.readings.iter().rposition(|r| r.t_s <= from_s)?;
        let last = (self.readings.iter())
            .position(|r| r.t_s >= to_s)
            .unwrap_or(self.readings.len() - 1);
        if last <= first {
            return None;
        }
        let span = &self.readings[first..=last];
        let mut out = BTreeMap::new();
        for name in span[0].proxies.keys() {
            let values = |key: &str| -> Vec<u64> {
                (span.iter())
                    .filter_map(|r| r.proxies.get(name)?.get(key).copied())
                    .collect()
            };
            let mut counted = Increases {
                read_from_s: (span[0].t_s * 1e3).round() / 1e3,
                read_to_s: (span[span.len() - 1].t_s * 1e3).round() / 1e3,
                ..Increases::default()
            };
            for key in span[0].proxies[name].keys() {
                let v = values(key);
                if *key == ENDPOINTS_UP {
                    counted.endpoints_up = Some(EndpointsUp {
                        before: v.first().copied(),
                        fewest: v.iter().min().copied(),
                        after: v.last().copied(),
                    });
                    continue;
                }
                let increase: u64 = (v.windows(2))
                    .map(|w| if w[1] >= w[0] { w[1] - w[0] } else { w[1] })
                    .sum();
                counted.increases.insert((*key).to_owned(), increase);
            }
            out.insert(name.clone(), ProxyCounted::Counted(counted));
        }
        // A proxy not read at the window's start: why, so the report can say it.
        for (name, why) in &span[0].errors {
            out.insert(
                name.clone(),
                ProxyCounted::NotRead {
                    not_read: why.clone(),
                },
            );
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingressbench_lab::proxy::counters::CONNECT_FAILURES;

    fn reading(t_s: f64, failures: u64, up: u64) -> Reading {
        let counted: Counted = [(CONNECT_FAILURES, failures), (ENDPOINTS_UP, up)].into();
        Reading {
            t_s,
            proxies: [("envoy".to_owned(), counted)].into(),
            errors: BTreeMap::new(),
        }
    }

    #[test]
    fn an_events_window_takes_each_counts_increase_across_a_restart() {
        let dir = std::env::temp_dir().join(format!("ib-proxy-counts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let counts = ProxyCounts {
            file: File::create(dir.join("proxy-metrics.jsonl")).unwrap(),
            measure_from: Instant::now(),
            grid: Grid::new(Instant::now(), Instant::now()),
            path: dir.join("proxy-metrics.jsonl"),
            on_disk: false,
            readings: vec![
                reading(0.0, 5, 3),
                reading(1.0, 5, 3),
                reading(2.0, 9, 2),
                // Started again (a reload): 2 since.
                reading(3.0, 2, 2),
                reading(4.0, 4, 2),
            ],
        };
        let got = counts.between(1.5, 3.5).unwrap();
        // From the reading at 1 s to the one at 4 s: 4, then 2, then 2 more.
        let ProxyCounted::Counted(envoy) = &got["envoy"] else {
            panic!("{got:?}")
        };
        assert_eq!(envoy.increases[CONNECT_FAILURES], 8);
        let up = envoy.endpoints_up.unwrap();
        assert_eq!((up.before, up.fewest), (Some(3), Some(2)));
        assert_eq!((envoy.read_from_s, envoy.read_to_s), (1.0, 4.0));
        assert!(counts.between(-1.0, 2.0).is_none(), "no reading before");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
