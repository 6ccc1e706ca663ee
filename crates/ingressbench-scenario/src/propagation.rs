//! When each route an event adds or removes first answers as it should, read by the route
//! probe ([`ingressbench_load::probe`]) beside the open-loop load, and what the cell
//! writes of it: `routes.json` (per event firing: the distribution of times to the first
//! right answer, the time the last route became right, the figure's resolution, wrong
//! answers by kind, routes never right by name) and `routes.csv` (one line per route).
//!
//! An event with `one_at_a_time` asks for its routes one per update, the next once the
//! probe has settled the last (right, or given up), as gateway-api-bench's probe test
//! does: each route's time is then read by one probe after another on that route alone.
//! `route_steps` goes the same way from count to count, each step a firing of its own
//! (the driver in `timeline.rs` holds the [`Sequence`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ingressbench_lab::model::{Route, ROUTE_REVISION_HEADER};
use ingressbench_lab::RoutesDelta;
use ingressbench_load::probe::{Expect, JobOutcome, ProbeOptions, ProbeRoute, Prober};
use ingressbench_results::routes::{self as file, RoutesFile};

use crate::record::write_json;
use crate::timeline::offset;
use crate::usage::UsageLog;
use crate::Cell;

/// Points of the CDF kept per firing (quantiles, evenly spaced).
const CDF_POINTS: usize = 100;

/// One firing of a route event, as probed.
struct Firing {
    event: usize,
    what: String,
    one_at_a_time: bool,
    /// Routes the event asks for in all (one at a time: how many it would add).
    planned: usize,
    /// CPU time the tool spent making and applying its changes (on the driver's thread).
    tool_cpu: Duration,
    /// Routes in force once its changes were asked for.
    routes_after: Option<usize>,
    /// The proxy's configuration as rendered for them, in bytes.
    config_bytes: Option<u64>,
}

/// An event going a step at a time (one route at a time, or `route_steps`): what is
/// left of it.
pub(crate) struct Sequence {
    pub(crate) event: usize,
    pub(crate) delay: Duration,
    /// The changes still to ask for: each with its name in `routes.json`, and whether it
    /// goes on the firing before (one route at a time) or is a firing of its own.
    pub(crate) steps: std::collections::VecDeque<(ingressbench_lab::Change, String, bool)>,
    /// Steps in all.
    pub(crate) planned: usize,
    /// What a step is, in the message when the load ends first (`routes`, `steps`).
    pub(crate) unit: &'static str,
    /// How long the routes of a step are held once right, before the next.
    pub(crate) pause: Duration,
    /// When the probe was first seen with the last step settled.
    pub(crate) settled_at: Option<Instant>,
}

/// How the scenario's route probe asks (`routes.probe`).
pub(crate) fn probe_options(scenario: &crate::Scenario) -> Result<ProbeOptions, String> {
    let p = &scenario.routes.probe;
    let give_up_after = ingressbench_stats::parse_duration(&p.give_up_after)
        .map_err(|e| format!("routes.probe.give_up_after: {e}"))?;
    Ok(ProbeOptions {
        rate_per_s: p.rate,
        connections: p.connections,
        give_up_after,
        revision_header: Some(ROUTE_REVISION_HEADER),
        ..ProbeOptions::default()
    })
}

/// The route probe of a cell, and what it has been asked.
pub(crate) struct RouteProbe {
    prober: Prober,
    firings: Vec<Firing>,
    /// The probe's rate and connections, as asked.
    rate: f64,
    connections: usize,
    /// Routes handed to the probe so far.
    asked: u64,
}

impl RouteProbe {
    /// A probe through `addr` (plain HTTP), in `netns` when the client has one, if the
    /// cell has route events.
    pub(crate) fn start(
        cell: &Cell,
        addr: std::net::SocketAddr,
        netns: Option<PathBuf>,
    ) -> Option<Result<Self, String>> {
        let routes = cell.events.iter().any(|e| e.action.is_route_event());
        if !routes {
            return None;
        }
        let options = match probe_options(&cell.scenario) {
            Ok(o) => o,
            Err(e) => return Some(Err(e)),
        };
        let before = move || {
            netns.as_deref().map_or(Ok(()), |ns| {
                ingressbench_lab::topology::enter_netns(ns).map_err(|e| {
                    format!(
                        "the route probe cannot enter the client's network namespace {}: {e}",
                        ns.display()
                    )
                })
            })
        };
        Some(Prober::start(addr, options, before).map(|prober| Self {
            prober,
            firings: Vec::new(),
            rate: options.rate_per_s,
            connections: options.connections,
            asked: 0,
        }))
    }

    /// Starts probing what `delta` adds, removes and changes, asked for now: a new firing
    /// of `event`, or the next step of the last one (`continuing`).
    pub(crate) fn probe(&mut self, event: usize, what: &str, delta: RoutesDelta, continuing: bool) {
        if !continuing || self.firings.is_empty() {
            self.firings.push(Firing {
                event,
                what: what.to_owned(),
                one_at_a_time: false,
                planned: delta.len(),
                tool_cpu: Duration::ZERO,
                routes_after: None,
                config_bytes: None,
            });
        }
        let RoutesDelta {
            added,
            removed,
            changed,
        } = delta;
        let routes: Vec<ProbeRoute> = added
            .into_iter()
            .map(|r| probe_route(r, |r| Expect::Added { pool: r.pool }))
            .chain(
                removed
                    .into_iter()
                    .map(|r| probe_route(r, |r| Expect::Removed { pool: r.pool })),
            )
            .chain(changed.into_iter().map(|r| {
                probe_route(r, |r| Expect::Changed {
                    pool: r.pool,
                    revision: r.revision,
                })
            }))
            .collect();
        self.asked += routes.len() as u64;
        self.prober
            .probe(self.firings.len() - 1, routes, Instant::now());
    }

    /// Adds CPU time the tool spent on the current firing's change, after which the
    /// site holds `routes` and the proxy's configuration is `config` bytes.
    pub(crate) fn spent(&mut self, cpu: Duration, routes: Option<usize>, config: Option<u64>) {
        if let Some(f) = self.firings.last_mut() {
            f.tool_cpu += cpu;
            f.routes_after = routes;
            f.config_bytes = config;
        }
    }

    /// Marks the firing just begun as `planned` routes asked one at a time.
    pub(crate) fn one_at_a_time(&mut self, planned: usize) {
        if let Some(f) = self.firings.last_mut() {
            f.one_at_a_time = true;
            f.planned = planned;
        }
    }

    /// Whether the probe has settled every route it was asked (the next of a sequence
    /// may go).
    pub(crate) fn all_settled(&self) -> bool {
        self.prober.settled() >= self.asked
    }

    /// Stops the probe and writes `routes.json` and `routes.csv` into `dir`; `usage` gives
    /// the proxy's memory at each step. Returns what `routes.json` holds.
    pub(crate) fn finish(
        self,
        dir: &Path,
        measure_from: Instant,
        usage: Option<&UsageLog>,
    ) -> Result<(RoutesFile, Vec<Probed>), String> {
        let report = self.prober.finish();
        let mut probed: Vec<Probed> = Vec::new();
        for r in report.jobs.iter().flat_map(|j| &j.routes) {
            let requested_s = offset(r.requested_at, measure_from);
            let right_s = r.right_at.map(|t| offset(t, measure_from));
            match probed.iter_mut().find(|p| p.requested_s == requested_s) {
                Some(p) => p.last_right_s = p.last_right_s.zip(right_s).map(|(a, b)| a.max(b)),
                None => probed.push(Probed {
                    requested_s,
                    last_right_s: right_s,
                }),
            }
        }
        probed.sort_by(|a, b| a.requested_s.total_cmp(&b.requested_s));
        let mut lines = String::from("event,firing,host,requested_s,right_s,last_wrong_s,probes\n");
        let mut firings = Vec::new();
        for (i, firing) in self.firings.iter().enumerate() {
            let job = report.jobs.get(i).cloned().unwrap_or_default();
            let at = |t: Option<Instant>| {
                t.map_or(String::new(), |t| format!("{:.6}", offset(t, measure_from)))
            };
            for r in &job.routes {
                lines.push_str(&format!(
                    "{},{i},{},{:.6},{},{},{}\n",
                    firing.event,
                    r.host,
                    offset(r.requested_at, measure_from),
                    at(r.right_at),
                    at(r.last_wrong_at),
                    r.probes
                ));
            }
            let mut summary = summarize(firing, &job, measure_from);
            if let Some(usage) = usage {
                // The proxy's (and a local controller's) memory just before this step, and
                // just before the next (or at the end): what it holds at each number of
                // routes; and the CPU it spent in between.
                let from = summary.requested_s.unwrap_or(0.0);
                let next = self.firings.get(i + 1).and_then(|_| {
                    report
                        .jobs
                        .get(i + 1)?
                        .routes
                        .first()
                        .map(|r| offset(r.requested_at, measure_from))
                });
                let to = next.unwrap_or(f64::INFINITY);
                for (role, rss, cpu) in [
                    (
                        "proxy",
                        &mut summary.proxy_rss_bytes,
                        &mut summary.proxy_cpu_ms,
                    ),
                    (
                        "controller",
                        &mut summary.controller_rss_bytes,
                        &mut summary.controller_cpu_ms,
                    ),
                ] {
                    let before = usage.rss_before(role, from);
                    if before.is_some() {
                        *rss = Some(file::Memory {
                            before,
                            after: usage.rss_before(role, to),
                        });
                        // What it spent on the step, to the next (to a second).
                        *cpu = usage.cpu_between(role, from, to).map(|s| s * 1e3);
                    }
                }
            }
            firings.push(summary);
        }
        std::fs::write(dir.join("routes.csv"), lines).map_err(|e| e.to_string())?;
        let tool_ms: f64 =
            self.firings.iter().map(|f| ms(f.tool_cpu)).sum::<f64>() + ms(report.cpu);
        let value = RoutesFile {
            probe: file::Probe {
                rate: self.rate,
                connections: self.connections,
                cpu_ms: ms(report.cpu),
            },
            tool_cpu_ms: tool_ms,
            firings,
        };
        write_json(&dir.join("routes.json"), &value).map_err(|e| e.to_string())?;
        Ok((value, probed))
    }
}

/// The routes of one change as the probe saw them: when they were asked for and when
/// the last of them answered right (none: one never did), in seconds of the cell.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Probed {
    pub(crate) requested_s: f64,
    pub(crate) last_right_s: Option<f64>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn probe_route(route: Route, expect: impl FnOnce(Route) -> Expect) -> ProbeRoute {
    ProbeRoute {
        host: route.host.clone(),
        path: route.path_prefix.clone(),
        expect: expect(route),
    }
}

/// What one firing's routes did: the times to first right answer (p50/p90/p99/max and a
/// CDF), when the last became right, the resolution, wrong answers, never right by name.
fn summarize(firing: &Firing, job: &JobOutcome, measure_from: Instant) -> file::Firing {
    let mut times: Vec<f64> = Vec::new();
    let mut resolution: Vec<f64> = Vec::new();
    let mut never = Vec::new();
    let mut last_right: Option<Instant> = None;
    for r in &job.routes {
        match r.right_at {
            Some(right) => {
                times.push(ms(right.saturating_duration_since(r.requested_at)));
                let since = r.last_wrong_at.unwrap_or(r.requested_at);
                let until = r.right_answered_at.unwrap_or(right);
                resolution.push(ms(until.saturating_duration_since(since)));
                last_right = Some(last_right.map_or(right, |l| l.max(right)));
            }
            None => never.push(r.host.clone()),
        }
    }
    times.sort_by(f64::total_cmp);
    resolution.sort_by(f64::total_cmp);
    let first_request = job.routes.iter().map(|r| r.requested_at).min();
    let cdf = (1..=CDF_POINTS.min(times.len()))
        .filter_map(|k| {
            let q = k as f64 / CDF_POINTS.min(times.len()) as f64;
            Some([quantile(&times, q)?, q])
        })
        .collect();
    file::Firing {
        event: firing.event,
        what: firing.what.clone(),
        one_at_a_time: firing.one_at_a_time,
        planned: firing.planned,
        routes_after: firing.routes_after.map(|r| r as u64),
        config_bytes: firing.config_bytes,
        asked: job.routes.len() as u64,
        right: times.len() as u64,
        requested_s: first_request.map(|t| offset(t, measure_from)),
        time_to_right_ms: file::TimeToRight {
            p50: quantile(&times, 0.5),
            p90: quantile(&times, 0.9),
            p99: quantile(&times, 0.99),
            p99_interval: quantile_interval(&times, 0.99),
            max: times.last().copied(),
        },
        last_right_ms: (first_request.zip(last_right))
            .map(|(f, l)| ms(l.saturating_duration_since(f))),
        resolution_ms: file::Resolution {
            p50: quantile(&resolution, 0.5),
            max: resolution.last().copied(),
        },
        wrong: job.wrong.clone(),
        probes: job.routes.iter().map(|r| u64::from(r.probes)).sum(),
        tool_cpu_ms: ms(firing.tool_cpu),
        never_right: never,
        cdf,
        proxy_rss_bytes: None,
        proxy_cpu_ms: None,
        controller_rss_bytes: None,
        controller_cpu_ms: None,
    }
}

/// The nearest-rank quantile `q` of sorted `v` (`None` when empty).
fn quantile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i])
}

/// A 95% interval for the quantile `q` of sorted `v`, from order statistics (distribution
/// free: the ranks the binomial count of values below the true quantile falls between,
/// by its normal approximation, one rank wider on each side for its discreteness). With
/// few values the upper end is the largest one.
fn quantile_interval(v: &[f64], q: f64) -> Option<[f64; 2]> {
    if v.is_empty() {
        return None;
    }
    let n = v.len() as f64;
    let spread = 1.96 * (n * q * (1.0 - q)).sqrt();
    let rank = |r: f64| (r.max(1.0).min(n) as usize) - 1;
    Some([
        v[rank((n * q - spread).floor())],
        v[rank((n * q + spread).ceil() + 1.0)],
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantiles_interval_holds_it_and_narrows_with_more_routes() {
        let v: Vec<f64> = (1..=10_000).map(f64::from).collect();
        let [low, high] = quantile_interval(&v, 0.99).unwrap();
        assert!(low <= 9_900.0 && 9_900.0 <= high, "{low}-{high}");
        assert!(high - low < 50.0, "{low}-{high}");
        let few: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(quantile_interval(&few, 0.99), Some([18.0, 20.0]));
        let [low, high] = quantile_interval(&few, 0.5).unwrap();
        assert!(low < 10.0 && high > 10.0, "{low}-{high}");
        assert_eq!(quantile_interval(&[], 0.5), None);
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(50.0));
        assert_eq!(quantile(&v, 0.99), Some(99.0));
        assert_eq!(quantile(&v, 1.0), Some(100.0));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[7.0], 0.01), Some(7.0));
    }
}
