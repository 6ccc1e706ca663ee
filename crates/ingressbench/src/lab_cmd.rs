//! `ingressbench lab check` and `ingressbench lab up`.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use ingressbench_lab::certs::DEFAULT_TLS_NAME;
use ingressbench_lab::labfile::LabFile;
use ingressbench_lab::model::{Tuning, UpstreamProtocol};
use ingressbench_lab::proxy::{Binaries, ProxyKind};
use ingressbench_lab::{Lab, LabError, LabSpec};

use crate::args::{LabCommand, LabUpArgs, ProxyBinArgs};
use crate::UsageError;

pub(crate) fn run(command: LabCommand) -> Result<ExitCode> {
    match command {
        LabCommand::Check(args) => check(&args),
        LabCommand::Up(args) => up(&args),
        LabCommand::Reaper => {
            ingressbench_lab::reaper::serve(std::io::stdin().lock());
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub(crate) fn binaries(args: &ProxyBinArgs) -> Result<Binaries> {
    let mut binaries = Binaries::discover();
    for raw in &args.proxy_bins {
        let (kind, path) = raw.split_once('=').ok_or_else(|| {
            UsageError(anyhow::anyhow!(
                "--proxy-bin `{raw}`: write KIND=PATH, e.g. envoy=/opt/envoy/bin/envoy"
            ))
        })?;
        let kind: ProxyKind = kind
            .parse()
            .map_err(|e: ingressbench_lab::LabError| UsageError(e.into()))?;
        binaries.overrides.insert(kind, path.into());
    }
    Ok(binaries)
}

fn check(args: &ProxyBinArgs) -> Result<ExitCode> {
    let binaries = binaries(args)?;
    let mut out = std::io::stdout().lock();
    let mut missing = 0;
    for kind in ProxyKind::ALL {
        let found = binaries.locate(kind).and_then(|path| {
            let version = binaries.version(kind, &path)?;
            Ok((path, version))
        });
        match found {
            Ok((path, version)) => {
                writeln!(out, "{:<8} {version}  ({})", kind.name(), path.display())?
            }
            Err(LabError::MissingBinary { .. }) => {
                missing += 1;
                writeln!(
                    out,
                    "{:<8} MISSING: install with: {}",
                    kind.name(),
                    kind.install_hint()
                )?;
            }
            Err(e) => {
                missing += 1;
                writeln!(out, "{:<8} UNUSABLE: {e}", kind.name())?;
            }
        }
    }
    Ok(if missing == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn up(args: &LabUpArgs) -> Result<ExitCode> {
    let exe =
        std::env::current_exe().context("finding the ingressbench binary to run backends with")?;
    let mut spec = match &args.file {
        Some(path) => LabFile::read(path)
            .and_then(|f| f.to_spec(path, exe, Binaries::default()))
            .map_err(|e| UsageError(e.into()))?,
        None => {
            let mut proxies = Vec::new();
            for name in &args.proxies {
                proxies.push(
                    name.parse::<ProxyKind>()
                        .map_err(|e| UsageError(e.into()))?,
                );
            }
            let mut spec = LabSpec::simple(proxies, args.backends, exe);
            spec.pools[0].backend_args = args.backend_args.clone();
            spec.tuning = Tuning {
                workers: args.workers,
                upstream_protocol: if args.upstream_http2 {
                    UpstreamProtocol::Http2
                } else {
                    UpstreamProtocol::Http1
                },
                ..Tuning::default()
            };
            spec.tls = !args.no_tls;
            spec.front = args.front.map(usize::from);
            spec
        }
    };
    spec.keep = args.keep;
    spec.binaries = binaries(&args.bins)?;
    let stop = crate::signals::stop_flag()?;
    let lab = Lab::up(spec)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "lab up in {:.0?}: {} backends, directory {}",
        lab.startup(),
        lab.backends().len(),
        lab.dir().display()
    )?;
    for b in lab.backends() {
        writeln!(
            out,
            "  backend {:<10} {} (pid {}, node {})",
            b.name,
            b.addr,
            b.pid(),
            b.node
        )?;
    }
    for p in lab.proxies() {
        writeln!(
            out,
            "\n{} {} (pid {}, started in {:.0?})",
            p.kind(),
            p.version(),
            p.pid(),
            p.startup()
        )?;
        writeln!(out, "  {}", p.http_url())?;
        writeln!(out, "  curl -si {}", p.http_url())?;
        if let (Some(at), Some(certs)) = (p.https_addr(), lab.certs()) {
            let (ip, port) = (at.ip(), at.port());
            writeln!(out, "  https://{DEFAULT_TLS_NAME}:{port}/")?;
            writeln!(
                out,
                "  curl -si --resolve {DEFAULT_TLS_NAME}:{port}:{ip} --cacert {} https://{DEFAULT_TLS_NAME}:{port}/",
                certs.ca.display()
            )?;
        }
    }
    if let Some(front) = lab.front() {
        writeln!(
            out,
            "\nL4 front in TCP mode: {} (pid {}), over {} proxies",
            front.version(),
            front.pid(),
            lab.proxies().len()
        )?;
        writeln!(out, "  curl -si http://{}/", front.http_addr())?;
        if let Some(at) = front.https_addr() {
            writeln!(
                out,
                "  https://{DEFAULT_TLS_NAME}:{}/ at {at} (TLS passed through)",
                at.port()
            )?;
        }
    }
    if lab.nodes().len() > 1 {
        writeln!(
            out,
            "
nodes:"
        )?;
        for n in lab.nodes() {
            let ns = n
                .netns
                .as_ref()
                .map(|p| format!(" (namespace {})", p.display()));
            writeln!(out, "  {:<16} {}{}", n.name, n.ip, ns.unwrap_or_default())?;
        }
        if let Some((http, _)) = lab.entry() {
            writeln!(out, "the client's way in, across its link: http://{http}/")?;
        }
    }
    writeln!(out, "\nCtrl-C to tear everything down.")?;
    out.flush()?;
    drop(out);
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(lab);
    eprintln!("lab down: every process stopped");
    Ok(ExitCode::SUCCESS)
}
