//! `ingressbench capacity`: the highest open-loop rate one URL sustains within objectives
//! (issue #33), by trials of `load` judged on their intervals ([`ingressbench_scenario::capacity`]).
//! A trial that fails while the generator was behind its schedule or out of CPU says so,
//! and ends the search: that limit is this machine's, not the target's.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ingressbench_lab::usage::{Part, UsageReader};
use ingressbench_load::{Length, Mode, Observer, Plan, Target, Warmup};
use ingressbench_scenario::capacity::{
    judge, measure, Bounds, Measured, Objective, Outcome, Search, Verdict, WindowFigures,
};
use ingressbench_stats::Window;
use serde_json::json;

use crate::args::CapacityArgs;
use crate::UsageError;

/// Bootstrap draws per figure of a trial (a few additions per window each).
const DRAWS: usize = 2000;
/// Scheduler lag p99 over which the generator is behind its own schedule, in us (as the
/// load's own GENERATOR FELL BEHIND warning).
const LAG_LIMIT_US: u64 = 1000;
/// And the share of the trial's own latency p99 its lag must reach to explain a failure
/// (on a busy machine the lag passes 1 ms at any rate; a p99 of seconds is not its doing).
const LAG_SHARE: f64 = 0.1;
/// The share of its threads' time over which the generator is out of CPU.
const CPU_LIMIT: f64 = 0.9;

/// Keeps each window's figures for the objectives.
struct Windows<'a> {
    objectives: &'a [Objective],
    figures: Vec<WindowFigures>,
}

impl Observer for Windows<'_> {
    fn window(&mut self, window: &Window) {
        self.figures
            .push(WindowFigures::of(window, self.objectives));
    }
}

pub(crate) fn run(args: CapacityArgs) -> Result<ExitCode> {
    let usage = |e: String| anyhow::Error::new(UsageError(anyhow::anyhow!(e)));
    if args.slo.is_empty() {
        return Err(usage(
            "give at least one objective: --slo 'p99 < 5ms' (and --slo 'errors < 0.1%')".into(),
        ));
    }
    let objectives: Vec<Objective> = args
        .slo
        .iter()
        .map(|s| Objective::parse(s))
        .collect::<Result<_, _>>()
        .map_err(usage)?;
    let precision = args
        .precision
        .strip_suffix('%')
        .and_then(|p| p.trim().parse::<f64>().ok())
        .filter(|p| *p > 0.0 && *p < 100.0)
        .ok_or_else(|| {
            usage(format!(
                "--precision {}: a percentage between 0 and 100, e.g. 5%",
                args.precision
            ))
        })?
        / 100.0;
    if !(args.from > 0.0 && args.from.is_finite() && args.from <= args.up_to) {
        return Err(usage(format!(
            "--from {} and --up-to {}: from must be above 0 and at most up-to",
            args.from, args.up_to
        )));
    }
    if args.trial < Duration::from_secs(2) {
        return Err(usage(format!(
            "--trial {:?}: at least 2s, so that its windows (a twentieth of it, 100 ms or more) give an interval",
            args.trial
        )));
    }
    let bounds = Bounds {
        from: args.from,
        up_to: args.up_to,
        precision,
        repeats: args.repeats,
    };
    let base = base_plan(&args).map_err(|e| anyhow::Error::new(UsageError(e)))?;
    let json_out = args
        .json
        .as_deref()
        .map(|p| std::fs::File::create(p).with_context(|| format!("creating {}", p.display())))
        .transpose()?;
    let stop = crate::signals::stop_flag()?;
    let mut rng = ingressbench_stats::compare::Rng::new(0x1b5e_a7c4);
    let mut search = Search::new(bounds);
    let mut trials = Vec::new();
    let reader = UsageReader::new();
    let own = [Part::process("generator", "client", std::process::id())];
    let mut out = std::io::stdout().lock();
    let ceiling = Ceiling::measure(&base, &bounds, &stop)?;
    writeln!(out, "{}", ceiling.describe(&bounds))?;
    writeln!(
        out,
        "capacity of {} within {}: from {} up to {} req/s, to {}; each trial {:?} after {:?} of warm-up",
        args.url,
        args.slo.join(", "),
        args.from,
        args.up_to,
        args.precision,
        args.trial,
        args.warmup
    )?;
    while let Some((rate, why)) = search.next_rate() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let mut plan = base.clone();
        plan.mode = Mode::Open { rate_per_s: rate };
        let mut windows = Windows {
            objectives: &objectives,
            figures: Vec::new(),
        };
        let (cpu_before, started) = (reader.read(&own)[0].cpu_s, Instant::now());
        let report = ingressbench_load::run(&plan, stop.clone(), &mut windows)?;
        let cpu_share = (reader.read(&own)[0].cpu_s - cpu_before)
            / (started.elapsed().as_secs_f64() * base.threads as f64);
        if report.summary.interrupted {
            break;
        }
        let figures = measure(&objectives, &windows.figures, DRAWS, &mut rng);
        let lag_p99 = report.summary.scheduler_lag_us.p99;
        let mut verdict = judge(&objectives, &figures);
        if verdict != Verdict::Pass {
            let latency_p99 = report.summary.latency_us.p99;
            if let Some(why) = behind(lag_p99, latency_p99, cpu_share, base.threads) {
                verdict = Verdict::GeneratorLimited(why);
            }
        }
        writeln!(
            out,
            "  {:>9.0} req/s ({why}): {}; p99 {:.2} ms, generator lag p99 {lag_p99} us, CPU {:.0}%: {}",
            rate,
            describe(&objectives, &figures),
            report.summary.latency_us.p99 as f64 / 1000.0,
            cpu_share * 100.0,
            verdict_text(&objectives, &verdict)
        )?;
        trials.push(json!({
            "rate_per_s": rate,
            "why": why,
            "verdict": verdict_text(&objectives, &verdict),
            "figures": objectives.iter().zip(&figures).map(|(o, m)| json!({
                "objective": o.text, "value": m.value, "interval": m.interval, "bound": o.bound(),
            })).collect::<Vec<_>>(),
            "achieved_per_s": report.summary.rate.achieved_per_s,
            "latency_us": report.summary.latency_us,
            "scheduler_lag_us_p99": lag_p99,
            "generator_cpu_share": cpu_share,
        }));
        search.record(rate, verdict);
    }
    let said = match search.outcome() {
        Some(outcome) => outcome_text(&objectives, outcome),
        None => "interrupted: the search stopped before its end (the trials above are kept)".into(),
    };
    writeln!(out, "{said}; {} trials", search.trials().len())?;
    if let (Some(file), Some(path)) = (json_out, args.json.as_deref()) {
        let doc = json!({
            "url": args.url,
            "objectives": args.slo,
            "bounds": { "from": args.from, "up_to": args.up_to, "precision": precision, "repeats": args.repeats },
            "generator_ceiling": {
                "healthy_per_s": ceiling.healthy,
                "behind_at_per_s": ceiling.behind.as_ref().map(|b| b.0),
                "why": ceiling.behind.as_ref().map(|b| b.1.clone()),
            },
            "trials": trials,
            "outcome": said,
        });
        serde_json::to_writer_pretty(std::io::BufWriter::new(file), &doc)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(match search.outcome() {
        Some(Outcome::Found { .. } | Outcome::AtLeast(_)) => ExitCode::SUCCESS,
        Some(_) => ExitCode::FAILURE,
        None => ExitCode::from(130),
    })
}

/// The load of every trial but its rate.
fn base_plan(args: &CapacityArgs) -> anyhow::Result<Plan> {
    let mut plan = Plan::new(Target::parse(&args.url)?);
    plan.connections = args.connections;
    plan.threads = args.threads;
    plan.length = Length::Duration(args.trial);
    // Twenty windows or more to resample (each a twentieth of the trial, 100 ms to 1 s).
    plan.window = (args.trial / 20).clamp(Duration::from_millis(100), Duration::from_secs(1));
    plan.warmup = if args.warmup.is_zero() {
        Warmup::None
    } else {
        Warmup::Duration(args.warmup)
    };
    plan.mode = Mode::Open {
        rate_per_s: args.from,
    };
    plan.validate()?;
    Ok(plan)
}

/// Each objective's figure with its interval: `share at or over 5 ms 0.20% (0.10-0.40%)`.
fn describe(objectives: &[Objective], figures: &[Measured]) -> String {
    objectives
        .iter()
        .zip(figures)
        .map(|(o, m)| match o.figure {
            ingressbench_scenario::capacity::Figure::Latency(name @ ("mean" | "max")) => format!(
                "{name} {:.2} ms ({:.2}-{:.2})",
                m.value, m.interval[0], m.interval[1]
            ),
            ingressbench_scenario::capacity::Figure::Latency(_) => format!(
                "at or over {} ms {:.2}% ({:.2}-{:.2}%, under {:.2}% keeps {})",
                o.limit,
                m.value * 100.0,
                m.interval[0] * 100.0,
                m.interval[1] * 100.0,
                o.bound() * 100.0,
                o.text
            ),
            ingressbench_scenario::capacity::Figure::ErrorRate => format!(
                "errors {:.3}% ({:.3}-{:.3}%)",
                m.value * 100.0,
                m.interval[0] * 100.0,
                m.interval[1] * 100.0
            ),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn verdict_text(objectives: &[Objective], verdict: &Verdict) -> String {
    match verdict {
        Verdict::Pass => "pass".into(),
        Verdict::Fail(i) => format!("fail ({})", objectives[*i].text),
        Verdict::Straddle(i) => format!("straddles {}: repeated", objectives[*i].text),
        Verdict::GeneratorLimited(why) => format!("generator-limited ({why})"),
    }
}

fn outcome_text(objectives: &[Objective], outcome: &Outcome) -> String {
    match outcome {
        Outcome::Found {
            capacity,
            failed_at,
            broke,
        } => format!(
            "capacity {capacity:.0} req/s: passed there, {failed_at:.0} req/s broke {}",
            objectives[*broke].text
        ),
        Outcome::FromFails { broke } => format!(
            "--from already fails ({}): no search below it; give a lower --from",
            objectives[*broke].text
        ),
        other => other.to_string(),
    }
}

/// What the generator sustains on this machine with the search's connections and threads:
/// the same load against this tool's echo backend (a child process on loopback, answering
/// at once), from `from` doubling to `up_to`, a second a rate, until its scheduler lag p99
/// passes [`LAG_LIMIT_US`] or its CPU [`CPU_LIMIT`].
struct Ceiling {
    /// The highest rate it kept up with (none: not even `from`).
    healthy: Option<f64>,
    /// The first it did not, with the evidence.
    behind: Option<(f64, String)>,
}

impl Ceiling {
    fn measure(base: &Plan, bounds: &Bounds, stop: &Arc<AtomicBool>) -> Result<Self> {
        let mut backend = EchoChild::start()?;
        let mut plan = base.clone();
        plan.target = Target::parse(&format!("http://{}/", backend.addr))?;
        plan.length = Length::Duration(Duration::from_secs(1));
        plan.warmup = Warmup::None;
        let reader = UsageReader::new();
        let own = [Part::process("generator", "client", std::process::id())];
        let mut ceiling = Ceiling {
            healthy: None,
            behind: None,
        };
        let mut rate = bounds.from;
        while !stop.load(Ordering::Relaxed) {
            plan.mode = Mode::Open { rate_per_s: rate };
            let (before, started) = (reader.read(&own)[0].cpu_s, Instant::now());
            let report =
                ingressbench_load::run(&plan, stop.clone(), &mut ingressbench_load::NoObserver)?;
            let cpu_share = (reader.read(&own)[0].cpu_s - before)
                / (started.elapsed().as_secs_f64() * plan.threads as f64);
            let summary = &report.summary;
            let (lag, latency) = (summary.scheduler_lag_us.p99, summary.latency_us.p99);
            match behind(lag, latency, cpu_share, plan.threads) {
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

    fn describe(&self, bounds: &Bounds) -> String {
        let healthy = match self.healthy {
            Some(r) => format!("kept up with {r:.0} req/s"),
            None => "did not keep up even at --from".into(),
        };
        match &self.behind {
            Some((r, why)) => format!(
                "the generator, against a local echo backend: {healthy}, fell behind at {r:.0} req/s ({why}); a failure at or above that is looked at for its lag and CPU"
            ),
            None => format!(
                "the generator, against a local echo backend: {healthy} (up to --up-to {:.0})",
                bounds.up_to
            ),
        }
    }
}

/// The evidence that the generator, not the target, made a trial fail: its CPU, or a
/// scheduler lag over [`LAG_LIMIT_US`] that is a real share of the latency judged.
fn behind(lag_p99_us: u64, latency_p99_us: u64, cpu_share: f64, threads: usize) -> Option<String> {
    let lag = lag_p99_us > LAG_LIMIT_US && lag_p99_us as f64 >= LAG_SHARE * latency_p99_us as f64;
    (lag || cpu_share > CPU_LIMIT).then(|| {
        format!(
            "scheduler lag p99 {lag_p99_us} us (limit {LAG_LIMIT_US}), its CPU {:.0}% of {threads} thread{}",
            cpu_share * 100.0,
            if threads == 1 { "" } else { "s" }
        )
    })
}

/// `ingressbench backend` as a child on loopback, killed when dropped.
struct EchoChild {
    child: std::process::Child,
    addr: std::net::SocketAddr,
}

impl EchoChild {
    fn start() -> Result<Self> {
        use std::io::BufRead;
        let program = std::env::current_exe().context("finding the ingressbench binary")?;
        let mut child = std::process::Command::new(program)
            .args(["backend", "--listen", "127.0.0.1:0", "--name", "ceiling"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting the echo backend that measures the generator's ceiling")?;
        let mut line = String::new();
        let stdout = child.stdout.take().context("the echo backend's output")?;
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok());
        match addr {
            Some(addr) => Ok(Self { child, addr }),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("the echo backend did not say where it listens ({line:?})")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_the_generators_only_when_its_lag_or_cpu_explains_it() {
        // A busy machine: 1.4 ms of lag beside a p99 of 4 s is the target's queue.
        assert_eq!(behind(1_427, 3_973_000, 0.2, 1), None);
        // Lag that is most of the latency, or a generator out of CPU, is its own limit.
        assert!(behind(50_000, 60_000, 0.5, 1)
            .unwrap()
            .starts_with("scheduler lag p99 50000 us"));
        assert!(behind(500, 1_000, 0.95, 2)
            .unwrap()
            .contains("95% of 2 threads"));
        assert_eq!(behind(900, 1_000, 0.5, 1), None);
    }
}
