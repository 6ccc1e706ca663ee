//! The generator's own ceiling on this machine (issue #33): before a capacity search, the
//! search's load (its connections, threads, protocol, workers) is sent to this tool's echo
//! backend, a child process on loopback that answers at once, a second at each rate from
//! the search's `from`, doubling up to its `up_to`, until the generator falls behind its
//! schedule or runs out of CPU ([`behind`]), or sends under [`SENT_SHARE`] of what was due. A search's capacity is then read beside what
//! the generator alone sustains: a trial at or past that rate that fails is looked at for
//! the generator's lag and CPU before it is blamed on the target.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingressbench_lab::usage::{Part, UsageReader};
use ingressbench_load::{Length, Mode, NoObserver, Plan, Target, Warmup};

use crate::capacity::{behind, evidence, Bounds, GeneratorSeen};

/// The share of a step's requests due that the generator must send to keep up: against
/// an echo backend that answers at once, one that sends fewer was short of the machine
/// even when its thread's CPU share stayed under [`behind`]'s limit (CI once called
/// 200,000 and 400,000 req/s kept up by one thread that sends about 165,000 here, 85% of
/// what was due, at 93% CPU).
const SENT_SHARE: f64 = 0.95;

/// One rate of the measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The rate offered, requests per second.
    pub rate_per_s: f64,
    /// Requests answered per second.
    pub achieved_per_s: f64,
    /// The scheduler's lag, p99, microseconds.
    pub lag_p99_us: u64,
    /// This process's CPU over the second, a share of its threads (none with workers,
    /// whose CPU is their own).
    pub cpu_share: Option<f64>,
}

/// What the generator sustained against the echo backend.
#[derive(Clone, Debug, PartialEq)]
pub struct Ceiling {
    /// The highest rate it kept up with (none: not even `from`).
    pub healthy: Option<f64>,
    /// The first it did not, with the evidence.
    pub behind: Option<(f64, String)>,
    /// Every rate tried, in order.
    pub steps: Vec<Step>,
    /// How the load was sent, in a few words ("100 connections, 1 thread, http1").
    pub load: String,
}

impl Ceiling {
    /// Measures `base` (the search's load; its target, length, warm-up and rate are
    /// replaced) against an echo backend started from `binary`, from `workers` local
    /// processes of `binary` when more than one.
    pub fn measure(
        base: &Plan,
        (binary, workers): (&Path, usize),
        bounds: &Bounds,
        stop: &Arc<AtomicBool>,
    ) -> Result<Self, String> {
        let mut backend = EchoChild::start(binary)?;
        let mut plan = base.clone();
        plan.target = Target::parse(&format!("http://{}/", backend.addr))
            .map_err(|e| format!("the echo backend's address: {e}"))?;
        // No TLS, no Host header of the lab's, no start time set for a cell.
        plan.tls = Default::default();
        plan.resolve.clear();
        plan.start = None;
        plan.request.headers.clear();
        plan.length = Length::Duration(Duration::from_secs(1));
        plan.warmup = Warmup::None;
        let reader = UsageReader::new();
        let own = [Part::process("generator", "client", std::process::id())];
        let mut ceiling = Ceiling {
            healthy: None,
            behind: None,
            steps: Vec::new(),
            load: format!(
                "{} connection{}, {} thread{}{}, {}",
                plan.connections,
                plural(plan.connections),
                plan.threads,
                plural(plan.threads),
                if workers > 1 {
                    format!(", {workers} local workers")
                } else {
                    String::new()
                },
                plan.protocol.name()
            ),
        };
        let mut rate = bounds.from;
        while !stop.load(Ordering::Relaxed) {
            plan.mode = Mode::Open { rate_per_s: rate };
            let (before, started) = (reader.read(&own)[0].cpu_s, Instant::now());
            let report = if workers > 1 {
                ingressbench_load::fleet::run_local(
                    &plan,
                    workers,
                    binary,
                    stop.clone(),
                    &mut NoObserver,
                )
                .map(|f| f.load)
            } else {
                ingressbench_load::run(&plan, stop.clone(), &mut NoObserver)
            }
            .map_err(|e| format!("the generator's ceiling at {rate} req/s: {e}"))?;
            let cpu_share = (workers <= 1).then(|| {
                (reader.read(&own)[0].cpu_s - before)
                    / (started.elapsed().as_secs_f64() * plan.threads as f64)
            });
            if report.summary.interrupted {
                break;
            }
            let summary = &report.summary;
            let seen = GeneratorSeen {
                lag_p99_us: summary.scheduler_lag_us.p99,
                latency_p99_us: summary.latency_us.p99,
                cpu_share,
                threads: plan.threads,
                past_ceiling: None,
            };
            ceiling.steps.push(Step {
                rate_per_s: rate,
                achieved_per_s: summary.rate.achieved_per_s,
                lag_p99_us: seen.lag_p99_us,
                cpu_share,
            });
            let sent = summary.rate.achieved_per_s / rate;
            let short = (sent < SENT_SHARE).then(|| {
                format!(
                    "{}, sent {:.1}% of the requests due (under {:.0}%)",
                    evidence(&seen),
                    sent * 100.0,
                    SENT_SHARE * 100.0
                )
            });
            match behind(&seen).or(short) {
                Some(why) => {
                    ceiling.behind = Some((rate, why));
                    break;
                }
                None => ceiling.healthy = Some(rate),
            }
            if rate >= bounds.up_to {
                break;
            }
            rate = (rate * 2.0).min(bounds.up_to);
        }
        backend.stop();
        Ok(ceiling)
    }

    /// The rate the generator fell behind at, if `rate` is at or past it.
    pub fn past(&self, rate: f64) -> Option<f64> {
        self.behind
            .as_ref()
            .map(|(at, _)| *at)
            .filter(|at| rate >= *at)
    }

    /// One sentence: what the generator kept up with and where it fell behind.
    pub fn describe(&self, up_to: f64) -> String {
        let healthy = match self.healthy {
            Some(r) => format!("kept up with {r:.0} req/s"),
            None => "did not keep up even at the search's first rate".into(),
        };
        let said = format!(
            "the generator alone ({}, to a local echo backend): {healthy}",
            self.load
        );
        match &self.behind {
            Some((r, why)) => format!("{said}, fell behind at {r:.0} req/s ({why})"),
            None => format!("{said} (the search goes no higher than {up_to:.0})"),
        }
    }

    /// As run.json keeps it (a search's `generator_ceiling`).
    pub fn record(&self) -> ingressbench_results::capacity::Ceiling {
        use ingressbench_results::capacity::{Ceiling, CeilingStep};
        Ceiling {
            load: self.load.clone(),
            healthy_per_s: self.healthy,
            behind_at_per_s: self.behind.as_ref().map(|b| b.0),
            why: self.behind.as_ref().map(|b| b.1.clone()),
            steps: (self.steps.iter())
                .map(|s| CeilingStep {
                    rate_per_s: s.rate_per_s,
                    achieved_per_s: s.achieved_per_s,
                    scheduler_lag_us_p99: s.lag_p99_us,
                    generator_cpu_share: s.cpu_share,
                })
                .collect(),
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `BINARY backend` as a child on loopback, killed when dropped.
struct EchoChild {
    child: std::process::Child,
    addr: std::net::SocketAddr,
}

impl EchoChild {
    fn start(binary: &Path) -> Result<Self, String> {
        use std::io::BufRead;
        let program: PathBuf = binary.to_owned();
        let mut child = std::process::Command::new(&program)
            .args(["backend", "--listen", "127.0.0.1:0", "--name", "ceiling"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "starting the echo backend that measures the generator's ceiling ({}): {e}",
                    program.display()
                )
            })?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        }
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok());
        match addr {
            Some(addr) => Ok(Self { child, addr }),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!(
                    "the echo backend that measures the generator's ceiling did not say where it listens ({line:?})"
                ))
            }
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for EchoChild {
    fn drop(&mut self) {
        self.stop();
    }
}
