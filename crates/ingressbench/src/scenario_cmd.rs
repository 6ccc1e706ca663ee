//! `ingressbench scenario check`: validate a scenario file and show its cells.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::args::ScenarioCommand;
use crate::UsageError;

pub(crate) fn run(command: ScenarioCommand) -> Result<ExitCode> {
    match command {
        ScenarioCommand::Check { file, sets } => {
            let sets = parse_sets(&sets)?;
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))
                .map_err(UsageError)?;
            let cells = ingressbench_scenario::expand(&text, &file, &sets)
                .map_err(|e| UsageError(e.into()))?;
            let mut out = std::io::stdout().lock();
            let first = &cells[0].scenario;
            writeln!(
                out,
                "{}: {} cells ({} targets, {} repeats)",
                first.name,
                cells.len(),
                first.targets.len(),
                first.repeat
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
