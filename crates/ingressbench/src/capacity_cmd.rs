//! `ingressbench capacity`: the highest open-loop rate one URL sustains within objectives
//! (issue #33), by trials of `load` judged on their intervals ([`ingressbench_scenario::capacity`]).
//! A trial that fails while the generator was behind its schedule or out of CPU says so,
//! and ends the search: that limit is this machine's, not the target's.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, Result};
use ingressbench_lab::usage::{Part, UsageReader};
use ingressbench_load::{Mode, Observer, Plan, Shape, Target};
use ingressbench_results::capacity::{CapacityFile, CapacityTrial};
use ingressbench_scenario::capacity::{
    describe, figure_records, parse_precision, pooled_text, Bounds, GeneratorSeen, Objective,
    Outcome, Pool, Search, WindowFigures, SHORTEST_TRIAL,
};
use ingressbench_scenario::ceiling::Ceiling;
use ingressbench_stats::Window;

use crate::args::CapacityArgs;
use crate::UsageError;

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
    let precision = parse_precision(&args.precision).map_err(|e| usage(format!("--{e}")))?;
    if !(args.from > 0.0 && args.from.is_finite() && args.from <= args.up_to) {
        return Err(usage(format!(
            "--from {} and --up-to {}: from must be above 0 and at most up-to",
            args.from, args.up_to
        )));
    }
    if args.trial < SHORTEST_TRIAL {
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
        down_from: args.down_from,
    };
    let base = base_plan(&args).map_err(|e| anyhow::Error::new(UsageError(e)))?;
    let json_out = args
        .json
        .as_deref()
        .map(|p| std::fs::File::create(p).with_context(|| format!("creating {}", p.display())))
        .transpose()?;
    let stop = crate::signals::stop_flag()?;
    let mut search = Search::new(bounds);
    let mut pool = Pool::default();
    let mut trials = Vec::new();
    let reader = UsageReader::new();
    let own = [Part::process("generator", "client", std::process::id())];
    let mut out = std::io::stdout().lock();
    let binary = std::env::current_exe().context("finding the ingressbench binary")?;
    let ceiling =
        Ceiling::measure(&base, (&binary, 1), &bounds, &stop).map_err(anyhow::Error::msg)?;
    writeln!(out, "{}", ceiling.describe(bounds.up_to))?;
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
        let lag_p99 = report.summary.scheduler_lag_us.p99;
        let seen = GeneratorSeen {
            lag_p99_us: lag_p99,
            latency_p99_us: report.summary.latency_us.p99,
            cpu_share: Some(cpu_share),
            threads: base.threads,
            past_ceiling: ceiling.past(rate),
        };
        let seed = 0x1b5e_a7c4 + search.trials().len() as u64;
        let judged = pool.judge_next(
            &mut search,
            (&objectives, rate),
            windows.figures,
            &seen,
            seed,
        );
        let (figures, pooled) = (judged.figures, judged.pooled);
        let said = search.last_said(&objectives);
        writeln!(
            out,
            "  {:>9.0} req/s ({why}): {}{}; p99 {:.2} ms, generator lag p99 {lag_p99} us, CPU {:.0}%: {said}",
            rate,
            describe(&objectives, &figures),
            pooled_text(pooled),
            report.summary.latency_us.p99 as f64 / 1000.0,
            cpu_share * 100.0,
        )?;
        trials.push(CapacityTrial {
            rate_per_s: rate,
            why: why.to_owned(),
            verdict: said,
            pooled_trials: pooled,
            figures: figure_records(&objectives, &figures),
            achieved_per_s: report.summary.rate.achieved_per_s,
            latency_us: report.summary.latency_us.clone(),
            scheduler_lag_us_p99: lag_p99,
            generator_cpu_share: cpu_share,
        });
    }
    let said = match search.outcome() {
        Some(outcome) => outcome.text(&objectives),
        None => "interrupted: the search stopped before its end (the trials above are kept)".into(),
    };
    writeln!(out, "{said}; {}", search.spent())?;
    if let (Some(file), Some(path)) = (json_out, args.json.as_deref()) {
        let doc = CapacityFile {
            url: args.url.clone(),
            objectives: args.slo.clone(),
            bounds: bounds.record(),
            generator_ceiling: ceiling.record(),
            trials,
            // The result as numbers (capacity_per_s, failed_at_per_s, broke, …; its
            // `kind` says which), and in words.
            result: search.outcome().map(|o| o.record(&objectives)),
            outcome: said,
            spent: search.spent(),
        };
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
    let shape = Shape {
        connections: Some(args.connections),
        threads: Some(args.threads),
        duration: Some(args.trial),
        warmup: Some(args.warmup),
        trial: Some(args.trial),
        ..Shape::new(Mode::Open {
            rate_per_s: args.from,
        })
    };
    let plan = shape.plan(Target::parse(&args.url)?);
    plan.validate()?;
    Ok(plan)
}
