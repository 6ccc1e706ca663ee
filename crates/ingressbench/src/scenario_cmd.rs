//! `ingressbench scenario check`: validate a scenario file and show its cells.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use ingressbench_report::terminal;
use ingressbench_scenario::runner::{Live, LiveFn};
use ingressbench_scenario::ScenarioError;

use crate::args::{RunArgs, ScenarioCommand};
use crate::UsageError;

pub(crate) fn run(command: ScenarioCommand) -> Result<ExitCode> {
    match command {
        ScenarioCommand::Check { file, sets, quick } => {
            let sets = parse_sets(&sets)?;
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))
                .map_err(UsageError)?;
            let (cells, left_out) =
                ingressbench_scenario::expand_noting(&text, &file, &sets, quick)
                    .map_err(|e| UsageError(e.into()))?;
            let mut out = std::io::stdout().lock();
            let first = &cells[0].scenario;
            writeln!(
                out,
                "{}: {} cells ({} targets, {} repeats)",
                first.name,
                cells.len(),
                first.targets.len(),
                cells.iter().map(|c| c.repeat + 1).max().unwrap_or(0)
            )?;
            for cell in &cells {
                writeln!(
                    out,
                    "  {:>3}  repeat {}  {}  ({} events)",
                    cell.index,
                    cell.repeat + 1,
                    cell.label(),
                    cell.events.len()
                )?;
            }
            for why in left_out {
                writeln!(out, "  left out: {why}")?;
            }
            if let Some(soak) = ingressbench_scenario::soak::plan(&cells) {
                writeln!(out, "{soak}")?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `path=value` pairs from `--set`.
pub(crate) fn parse_sets(raw: &[String]) -> Result<Vec<(String, String)>> {
    raw.iter()
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
                .ok_or_else(|| {
                    UsageError(anyhow::anyhow!(
                        "--set `{s}`: write PATH=VALUE, e.g. load.rate=200"
                    ))
                    .into()
                })
        })
        .collect()
}

/// `ingressbench run FILE`.
pub(crate) fn run_scenario(mut args: RunArgs) -> Result<ExitCode> {
    if let Some(path) = args.cluster.as_mut() {
        *path = crate::cluster_run::named(path);
    }
    // What an earlier run killed with its reaper left (processes, namespaces, private
    // keys) goes before anything else starts, whether or not this run starts a lab.
    ingressbench_lab::remove_leftovers();
    // Whether the targets are the cluster file's, not the scenario's or the command's.
    let mut implicit = false;
    let (text, file, mut sets, quick, dir) = match (&args.resume, &args.file) {
        (Some(dir), _) => {
            let r =
                ingressbench_scenario::runner::recorded(dir).map_err(|e| UsageError(e.into()))?;
            (
                r.scenario_text,
                dir.join("run.json"),
                r.sets,
                r.quick,
                Some(dir.clone()),
            )
        }
        (None, Some(file)) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))
                .map_err(UsageError)?;
            let mut sets = parse_sets(&args.sets)?;
            if let Some(soak) = &args.soak {
                sets.push(("soak.duration".to_owned(), soak.clone()));
            }
            if let Some(cluster) = &args.cluster {
                implicit = crate::cluster_run::targets(cluster, &text, &mut sets)?;
            }
            (text, file.clone(), sets, args.quick, args.out.clone())
        }
        (None, None) => {
            return Err(UsageError(anyhow::anyhow!("give a scenario file or --resume DIR")).into())
        }
    };
    let (mut cells, mut left_out) =
        ingressbench_scenario::expand_noting(&text, &file, &sets, quick)
            .map_err(|e| UsageError(e.into()))?;
    for why in &left_out {
        eprintln!("left out: {why}");
    }
    let cluster = match &args.cluster {
        Some(path) => Some(crate::cluster_run::prepare(
            path,
            &args,
            (&text, &file, quick),
            implicit,
            &mut sets,
            (&mut cells, &mut left_out),
        )?),
        None => {
            if let Some(cell) = cells
                .iter()
                .find(|c| c.scenario.load.from == ingressbench_scenario::LoadFrom::Cluster)
            {
                return Err(UsageError(anyhow::anyhow!(
                    "cell {} ({}): load.from: cluster sends the load from pods of a cluster: run with --cluster FILE (or --set load.from=here)",
                    cell.index,
                    cell.label()
                ))
                .into());
            }
            if let Some(cell) = cells.iter().find(|c| c.target.placed().is_some()) {
                return Err(UsageError(anyhow::anyhow!(
                    "cell {} ({}): target `{}` is a controller a cluster file places: run with --cluster FILE (`ingressbench cluster local up` makes one; --cluster local names it)",
                    cell.index,
                    cell.label(),
                    cell.target.name()
                ))
                .into());
            }
            None
        }
    };
    let name = cells[0].scenario.name.clone();
    let dir = dir.unwrap_or_else(|| {
        std::path::PathBuf::from("results").join(format!("{}-{name}", crate::stamp::utc_stamp()))
    });
    let tty = std::io::stderr().is_terminal();
    let metrics = args
        .metrics_listen
        .map(|addr| {
            let info = vec![("scenario".to_owned(), name.clone())];
            ingressbench_load::live::Live::start(addr, info).map(Arc::new)
        })
        .transpose()
        .map_err(|e| UsageError(e.into()))?;
    if let Some(metrics) = &metrics {
        if let Some(warning) = metrics.exposure_warning() {
            eprintln!("{warning}");
        }
        eprintln!("metrics: http://{}/metrics", metrics.addr());
    }
    let options = ingressbench_scenario::runner::RunOptions {
        metrics,
        cluster,
        dir,
        quick,
        backend_binary: std::env::current_exe().context("finding the ingressbench binary")?,
        binaries: crate::lab_cmd::binaries(&args.bins)?,
        stop: crate::signals::stop_flag()?,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        scenario_text: text,
        sets,
        left_out,
        resume: args.resume.is_some(),
        force: args.force,
        live: tty.then(|| {
            Arc::new(|l: &Live| {
                use std::io::Write;
                let _ = write!(
                    std::io::stderr(),
                    "\r\x1b[2K[cell {}/{} {}] {} elapsed, ~{} left | {:.0} req/s  p99 {}  errors {}",
                    l.cell,
                    l.cells,
                    l.label,
                    clock(l.run_elapsed),
                    clock(l.remaining),
                    l.load.rate_per_s,
                    terminal::human_us(l.load.p99_us as f64),
                    l.load.errors
                );
            }) as LiveFn
        }),
    };
    let searches = cells.iter().any(|c| c.scenario.search.is_some());
    eprintln!(
        "{name}: {} {}{}",
        cells.len(),
        match (searches, cells.len()) {
            (true, 1) => "capacity search, run as the trials it chooses",
            (true, _) => "capacity searches, each run as the trials it chooses",
            (false, 1) => "cell",
            (false, _) => "cells",
        },
        if options.quick { " (quick)" } else { "" }
    );
    if let Some(soak) = ingressbench_scenario::soak::plan(&cells) {
        eprintln!("{soak}");
    }
    let outcome = ingressbench_scenario::run(&cells, &options, |line| {
        // Over the live line, if there is one.
        let clear = if tty { "\r\x1b[2K" } else { "" };
        crate::signals::say(&format!("{clear}{line}"));
    })
    .map_err(|e| match e {
        // Where the results would go is the user's to change: a usage error.
        e @ (ScenarioError::ResultsExist { .. }
        | ScenarioError::ResultsLocked { .. }
        | ScenarioError::NotOurs { .. }) => anyhow::Error::from(UsageError(e.into())),
        e => e.into(),
    })?;
    if let Some(metrics) = &options.metrics {
        metrics.finish(crate::load_cmd::METRICS_LINGER);
    }
    {
        use std::io::Write;
        let _ = writeln!(
            std::io::stdout(),
            "{}: {} of {} cells done; results in {}",
            outcome.status,
            outcome.done,
            outcome.total,
            outcome.dir.display()
        );
    }
    if outcome.done > 0 {
        // The headline table and the report, as `ingressbench report DIR` writes them.
        let written = ingressbench_report::results::read(&outcome.dir)
            .map_err(|e| anyhow::anyhow!(e))
            .and_then(|run| crate::report_cmd::write_report(&outcome.dir, &run, 0.01, None));
        if let Err(e) = written {
            crate::signals::say(&format!(
                "warning: no report ({e:#}); `ingressbench report {}` tries again",
                outcome.dir.display()
            ));
        }
    }
    if let Some(error) = &outcome.error {
        crate::signals::say(&format!("error: {error}"));
        if let Some(why) = args
            .cluster
            .as_deref()
            .and_then(crate::cluster_run::local_cluster_stopped)
        {
            crate::signals::say(&why);
        }
    }
    Ok(match outcome.status {
        // The run stopped on the input (a cluster file's image no node can run).
        _ if outcome.input_error => ExitCode::from(2),
        "complete" => ExitCode::SUCCESS,
        // Stopped by the user (Ctrl-C, a hang-up); one stopped by the run's own trouble
        // (a full disk) says why and fails.
        "incomplete" if outcome.error.is_none() => ExitCode::from(130),
        _ => ExitCode::FAILURE,
    })
}

/// `1m05s`, `42s`.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}
