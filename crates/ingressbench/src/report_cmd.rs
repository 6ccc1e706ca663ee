//! `ingressbench report` and `ingressbench compare`.

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};
use ingressbench_report::analysis::{self, differences_json, METRICS};
use ingressbench_report::compare::{self, FailIf};
use ingressbench_report::files;
use ingressbench_report::openmetrics::Export;
use ingressbench_report::results::{self, RunResults};
use ingressbench_report::terminal;

use crate::args::{CompareArgs, ExportArgs, ReportArgs};
use crate::UsageError;

/// Seed of the bootstrap: the same results give the same report.
const SEED: u64 = 0x1b_e5c4;
/// `compare --fail-if` could not judge: a run incomplete, a cell recorded as done that
/// cannot be read, a condition on one side only, a metric that is not a number; it wins
/// over a condition that held. (1: a condition held; 2: usage.)
const EXIT_CANNOT_JUDGE: u8 = 3;

fn read(path: &Path) -> Result<RunResults> {
    results::read(path).map_err(|e| UsageError(anyhow::anyhow!(e)).into())
}

/// `ingressbench report PATH`.
pub(crate) fn report(args: ReportArgs) -> Result<ExitCode> {
    let run = read(&args.path)?;
    if let Some(baseline) = &args.baseline {
        if !run.cells.iter().any(|c| &c.target == baseline) {
            let targets: std::collections::BTreeSet<&str> =
                run.cells.iter().map(|c| c.target.as_str()).collect();
            return Err(UsageError(anyhow::anyhow!(
                "--baseline {baseline}: the run has no such target (it has {})",
                targets.into_iter().collect::<Vec<_>>().join(", ")
            ))
            .into());
        }
    }
    let (report, out) = write_report(&args.path, &run, args.noise_floor, args.baseline.as_deref())?;
    if args.png {
        let dir = out.with_file_name("charts");
        let written = write_pngs(&dir, &report.charts)?;
        println!("charts: {written} PNG files in {}", dir.display());
    }
    if args.open {
        // The desktop's opener starts a browser meant to outlive us: neither bounded nor
        // in a group we kill.
        let opened = Command::new("xdg-open")
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !opened.is_ok_and(|s| s.success()) {
            eprintln!(
                "could not open a browser (xdg-open); open {} yourself",
                out.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `ingressbench export prometheus PATH`: the run as OpenMetrics text with timestamps.
pub(crate) fn export_prometheus(args: ExportArgs) -> Result<ExitCode> {
    let run = read(&args.path)?;
    let export = Export::of(&run).map_err(|e| UsageError(anyhow::anyhow!(e)))?;
    let exported = match &args.out {
        Some(path) => {
            let mut exported = None;
            files::replace_file_with(path, |out| {
                exported = Some(export.write(out)?);
                Ok(())
            })
            .with_context(|| format!("--out {}", path.display()))?;
            exported.unwrap_or_default()
        }
        None => export
            .write(&mut std::io::BufWriter::new(std::io::stdout().lock()))
            .context("writing to standard output")?,
    };
    for why in &export.left_out {
        eprintln!("left out: {why}");
    }
    let (first, last) = exported.span.unwrap_or_default();
    eprintln!(
        "{} cells, {} samples, from {first:.3} to {last:.3} (Unix seconds){}",
        exported.cells,
        exported.samples,
        args.out.as_ref().map_or(String::new(), |out| format!(
            "; to load it: promtool tsdb create-blocks-from openmetrics {} DATA_DIR",
            out.display()
        ))
    );
    Ok(ExitCode::SUCCESS)
}

/// How long the headless browser may take to draw one chart.
const BROWSER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The headless browser that draws PNGs.
fn chromium() -> Result<PathBuf> {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Some(p) = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        }) {
            return Ok(p);
        }
    }
    Err(UsageError(anyhow::anyhow!(
        "--png needs a headless browser and none was found (chromium); install it with: apt-get install chromium"
    ))
    .into())
}

/// Writes each chart as SVG and PNG into `dir`; returns how many PNGs were written.
fn write_pngs(dir: &Path, charts: &[(String, String)]) -> Result<usize> {
    let browser = chromium()?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // The results directory may come from elsewhere: its charts/ must be a directory, not
    // a link that would send what is written somewhere else.
    if !dir.symlink_metadata().is_ok_and(|m| m.is_dir()) {
        anyhow::bail!(
            "{} is not a directory (a link?): not writing charts through it; remove it and run again",
            dir.display()
        );
    }
    let mut written = 0;
    for (i, (name, svg)) in charts.iter().enumerate() {
        let stem: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let base = dir.join(format!("{:02}-{}", i + 1, stem.trim_matches('-')));
        let svg_path = base.with_extension("svg");
        ingressbench_report::files::replace_file(&svg_path, svg.as_bytes())?;
        let (w, h) = svg_size(svg);
        let png = base.with_extension("png");
        let args = [
            "--headless".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--hide-scrollbars".to_owned(),
            format!("--screenshot={}", png.display()),
            format!("--window-size={w},{h}"),
            format!("file://{}", svg_path.canonicalize()?.display()),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // In a group of its own, killed with what it forked if it hangs.
        let status = ingressbench_lab::process::run_bounded(&browser, &args, BROWSER_TIMEOUT)
            .with_context(|| format!("running {}", browser.display()))?
            .status;
        if !status.success() || !png.is_file() {
            anyhow::bail!(
                "{} could not draw {} ({status})",
                browser.display(),
                svg_path.display()
            );
        }
        written += 1;
    }
    Ok(written)
}

/// The `width` and `height` attributes of an `<svg>`.
fn svg_size(svg: &str) -> (u32, u32) {
    let attr = |name: &str| {
        svg.split(&format!(" {name}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(800, |v| v.ceil() as u32)
    };
    (attr("width"), attr("height"))
}

/// Renders the report of the results at `path` and writes it beside them; prints the
/// headline table, the unreadable cells, the warnings by kind (one line each) and where
/// the report is.
pub(crate) fn write_report(
    path: &Path,
    run: &RunResults,
    noise_floor: f64,
    baseline: Option<&str>,
) -> Result<(ingressbench_report::html::Report, PathBuf)> {
    let started = Instant::now();
    let report = ingressbench_report::html::render(run, noise_floor, baseline);
    let out = if path.is_file() {
        path.with_extension("html")
    } else {
        path.join("report.html")
    };
    ingressbench_report::files::replace_file(&out, report.html.as_bytes())
        .with_context(|| format!("cannot write {}", out.display()))?;
    let took = started.elapsed();
    let mut stdout = std::io::stdout().lock();
    for line in (report.soak.iter())
        .chain(report.capacity.iter())
        .map(String::as_str)
        .chain(report.table.lines())
        .chain(report.routes.iter().map(String::as_str))
        .chain(report.websocket.iter().map(String::as_str))
    {
        writeln!(stdout, "{}", terminal::printable(line))?;
    }
    let unreadable: Vec<_> = run
        .cells
        .iter()
        .filter(|c| !c.unreadable.is_empty())
        .collect();
    if !unreadable.is_empty() {
        writeln!(
            stdout,
            "UNREADABLE: {} of the cells the run recorded as done cannot be read, and are in none of the figures:",
            unreadable.len()
        )?;
        for c in unreadable {
            writeln!(
                stdout,
                "  {}: {}",
                terminal::printable(&c.label()),
                terminal::printable(&c.unreadable.join("; "))
            )?;
        }
    }
    if !report.warning_groups.is_empty() {
        writeln!(
            stdout,
            "{} warnings, by kind (the report lists each):",
            report.warnings.len()
        )?;
        for (first, members) in &report.warning_groups {
            let mut line: String = first.chars().take(150).collect();
            if first.chars().count() > 150 {
                line.push('…');
            }
            writeln!(
                stdout,
                "  {} × {}",
                members.len(),
                terminal::printable(&line)
            )?;
        }
    }
    writeln!(
        stdout,
        "report: {} ({} KiB, {} charts, written in {:.2} s)",
        out.display(),
        report.html.len() / 1024,
        report.charts.len(),
        took.as_secs_f64()
    )?;
    Ok((report, out))
}

/// `ingressbench compare A [B]`.
pub(crate) fn compare(args: CompareArgs) -> Result<ExitCode> {
    let fail_ifs: Vec<FailIf> = args
        .fail_if
        .iter()
        .map(|t| t.parse::<FailIf>())
        .collect::<Result<_, _>>()
        .map_err(|e| UsageError(anyhow::anyhow!(e)))?;
    for m in &args.metrics {
        if analysis::metric_index(m).is_none() {
            return Err(UsageError(anyhow::anyhow!(
                "--metric {m}: expected one of mean, p50, p99, p99.9, max, errors"
            ))
            .into());
        }
    }
    let a_run = read(&args.baseline)?;
    let b_run = match &args.other {
        Some(other) => Some(read(other)?),
        None => None,
    };
    let targets = match (&b_run, args.targets.as_slice()) {
        (Some(_), []) => None,
        (None, [x, y]) => Some((x.clone(), y.clone())),
        (Some(_), _) => {
            return Err(UsageError(anyhow::anyhow!(
                "give two runs, or one run and --targets A,B, not both"
            ))
            .into())
        }
        (None, [_, ..]) => {
            return Err(UsageError(anyhow::anyhow!(
                "--targets takes two names, the baseline and the other: --targets nginx,envoy"
            ))
            .into())
        }
        (None, _) => {
            return Err(UsageError(anyhow::anyhow!(
                "give a second run to compare with, or --targets A,B to compare two targets of {}",
                args.baseline.display()
            ))
            .into())
        }
    };
    if run_searched(&a_run) || b_run.as_ref().is_some_and(run_searched) {
        return compare_capacities(&args, &fail_ifs, (&a_run, b_run.as_ref()), targets);
    }
    if let Some(f) = fail_ifs.iter().find(|f| f.capacity) {
        return Err(UsageError(anyhow::anyhow!(
            "--fail-if {}: neither run searched a capacity (a scenario with `search:`)",
            f.text
        ))
        .into());
    }
    // Latency conditions: runs that searched are compared by capacity above instead.
    let a = analysis::conditions(&a_run, SEED);
    let b_all = b_run
        .as_ref()
        .map_or_else(Vec::new, |b| analysis::conditions(b, SEED ^ 1));
    let pairs = match &targets {
        None => compare::pairs(&a, &b_all),
        Some((x, y)) => {
            let pairs: Vec<_> = a
                .iter()
                .filter(|c| &c.target == x)
                .filter_map(|c| {
                    a.iter()
                        .find(|d| &d.target == y && d.settings == c.settings)
                        .map(|d| (c, d))
                })
                .collect();
            if pairs.is_empty() {
                let names: Vec<&str> = a.iter().map(|c| c.target.as_str()).collect();
                return Err(UsageError(anyhow::anyhow!(
                    "--targets {x},{y}: no settings at which both were measured (targets: {})",
                    names.join(", ")
                ))
                .into());
            }
            pairs
        }
    };
    if pairs.is_empty() {
        return Err(UsageError(anyhow::anyhow!(
            "nothing to compare: no target and settings measured in both runs"
        ))
        .into());
    }
    // What the gate could not see: each side's conditions that should have a partner.
    let (a_side, b_side): (Vec<&analysis::Condition>, Vec<&analysis::Condition>) = match &targets {
        None => (a.iter().collect(), b_all.iter().collect()),
        Some((x, y)) => (
            a.iter().filter(|c| &c.target == x).collect(),
            a.iter().filter(|c| &c.target == y).collect(),
        ),
    };
    let runs: Vec<&RunResults> = std::iter::once(&a_run).chain(b_run.as_ref()).collect();
    let gate_metrics: Vec<usize> = fail_ifs.iter().map(|f| f.metric).collect();
    let unjudged = compare::cannot_judge(&runs, (&a_side, &b_side), &pairs, &gate_metrics);
    let diffs = compare::compare(&pairs, args.noise_floor);
    let shown: Vec<&analysis::Difference> = diffs
        .iter()
        .filter(|d| {
            args.metrics.is_empty()
                || args
                    .metrics
                    .iter()
                    .any(|m| analysis::metric_index(m) == analysis::metric_index(d.metric))
        })
        .collect();
    let failures: Vec<String> = fail_ifs
        .iter()
        .flat_map(|f| f.holds_for(&diffs, &pairs))
        .collect();
    let mut out = std::io::stdout().lock();
    if args.json {
        let owned: Vec<analysis::Difference> = shown.iter().map(|d| (*d).clone()).collect();
        let doc = serde_json::json!({
            "baseline": args.baseline, "other": args.other,
            "noise_floor": args.noise_floor,
            "differences": differences_json(&owned),
            "failed": failures,
            "cannot_judge": unjudged,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        // Written whole, then printed a line at a time with control characters shown.
        let mut text = String::new();
        for (a, b) in &pairs {
            writeln!(
                text,
                "{} vs {}{} ({} vs {}):",
                b.target,
                a.target,
                if a.settings.is_empty() {
                    String::new()
                } else {
                    format!(" at {}", a.settings)
                },
                a.basis,
                b.basis
            )?;
            for d in shown.iter().filter(|d| {
                d.baseline == a.target && d.other == b.target && d.settings == b.settings
            }) {
                let m = analysis::metric_index(d.metric).unwrap_or(0);
                let unit = METRICS[m].1;
                writeln!(
                    text,
                    "  {:<7} {:>28} -> {:<28} {:<26} {}{}",
                    d.metric,
                    analysis::with_interval(&a.metrics[m], unit),
                    analysis::with_interval(&b.metrics[m], unit),
                    analysis::percent(&d.relative),
                    d.verdict.words(),
                    if d.metric == "p99" {
                        format!(" (Mann-Whitney p = {:.3})", d.p_value)
                    } else {
                        String::new()
                    }
                )?;
            }
        }
        gate_lines(&mut text, &failures, &unjudged, !fail_ifs.is_empty())?;
        for line in text.lines() {
            writeln!(out, "{}", terminal::printable(line))?;
        }
    }
    Ok(gate_exit(&failures, &unjudged, !fail_ifs.is_empty()))
}

/// The gate's lines after the comparison's: each failure, then what could not be judged
/// (a note when nothing is gated).
fn gate_lines(
    text: &mut String,
    failures: &[String],
    unjudged: &[String],
    gated: bool,
) -> std::fmt::Result {
    for f in failures {
        writeln!(text, "FAIL: {f}")?;
    }
    let label = if gated { "CANNOT JUDGE" } else { "note" };
    for why in unjudged {
        writeln!(text, "{label}: {why}")?;
    }
    Ok(())
}

/// A gate's exit code. What could not be seen comes first: a condition that held on part
/// of the cells was judged on figures that are not the run's.
fn gate_exit(failures: &[String], unjudged: &[String], gated: bool) -> ExitCode {
    if gated && !unjudged.is_empty() {
        ExitCode::from(EXIT_CANNOT_JUDGE)
    } else if !failures.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Whether `run` is a capacity search's.
fn run_searched(run: &RunResults) -> bool {
    !ingressbench_report::capacity::searched(run).is_empty()
}

/// `compare` of runs that searched capacities: each search's capacity against its
/// partner's (same target and settings; or `--targets`), the change and whether it is
/// beyond both searches' brackets; `--fail-if 'capacity < -10%'` gates on the change.
fn compare_capacities(
    args: &CompareArgs,
    fail_ifs: &[FailIf],
    (a_run, b_run): (&RunResults, Option<&RunResults>),
    targets: Option<(String, String)>,
) -> Result<ExitCode> {
    use ingressbench_report::capacity::{pair, searched, CapacityChange};
    if let Some(f) = fail_ifs.iter().find(|f| !f.capacity) {
        return Err(UsageError(anyhow::anyhow!(
            "--fail-if {}: these runs searched capacities, whose trials differ in rate from run to run; gate them with --fail-if 'capacity < -10%'",
            f.text
        ))
        .into());
    }
    let a = searched(a_run);
    let b = b_run.map(searched).unwrap_or_default();
    let (changes, mut unjudged) = pair(
        &a,
        &b,
        targets.as_ref().map(|(x, y)| (x.as_str(), y.as_str())),
    );
    if changes.is_empty() {
        return Err(UsageError(anyhow::anyhow!(
            "nothing to compare: no search of the same target and settings on both sides ({})",
            unjudged.join("; ")
        ))
        .into());
    }
    for run in std::iter::once(a_run).chain(b_run) {
        let status = run.record.status();
        if status != "complete" {
            unjudged.push(format!("{} is {status}, not complete", run.dir.display()));
        }
    }
    let at = |c: &CapacityChange| match c.a.settings.is_empty() {
        true => String::new(),
        false => format!(" at {}", c.a.settings),
    };
    for c in changes.iter().filter(|c| c.relative.is_none()) {
        unjudged.push(format!(
            "{} vs {}{}: {}",
            c.b.target,
            c.a.target,
            at(c),
            c.words
        ));
    }
    let mut failures = Vec::new();
    for f in fail_ifs {
        for c in &changes {
            if let Some(r) = c.relative.filter(|r| f.op.holds(*r, f.value)) {
                failures.push(format!(
                    "{} {} vs {}{}: capacity {:+.1}% ({} -> {})",
                    f.text,
                    c.b.target,
                    c.a.target,
                    at(c),
                    r * 100.0,
                    CapacityChange::side(&c.a),
                    CapacityChange::side(&c.b)
                ));
            }
        }
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = serde_json::json!({
            "baseline": args.baseline, "other": args.other,
            "capacities": changes.iter().map(|c| serde_json::json!({
                "baseline": { "target": c.a.target, "settings": c.a.settings, "capacity_per_s": c.a.capacity, "failed_at_per_s": c.a.failed_at },
                "other": { "target": c.b.target, "settings": c.b.settings, "capacity_per_s": c.b.capacity, "failed_at_per_s": c.b.failed_at },
                "relative": c.relative, "verdict": c.words,
            })).collect::<Vec<_>>(),
            "failed": failures,
            "cannot_judge": unjudged,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        let mut text = String::new();
        for c in &changes {
            writeln!(
                text,
                "{} vs {}{}: capacity {} -> {} req/s {}: {}",
                c.b.target,
                c.a.target,
                at(c),
                CapacityChange::side(&c.a),
                CapacityChange::side(&c.b),
                c.relative
                    .map_or("-".into(), |r| format!("{:+.1}%", r * 100.0)),
                c.words
            )?;
        }
        gate_lines(&mut text, &failures, &unjudged, !fail_ifs.is_empty())?;
        for line in text.lines() {
            writeln!(out, "{}", terminal::printable(line))?;
        }
    }
    Ok(gate_exit(&failures, &unjudged, !fail_ifs.is_empty()))
}
