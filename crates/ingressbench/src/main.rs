//! `ingressbench`: benchmarks L7 proxies, load balancers and ingress controllers for latency
//! and resilience. This binary only turns arguments into validated configurations and calls
//! the library crates; see `docs/ARCHITECTURE.md`.

mod args;
mod backend_cmd;
mod capacity_cmd;
#[cfg(feature = "cluster")]
mod cluster_cmd;
mod cluster_run;
mod lab_cmd;
mod load_cmd;
mod report_cmd;
mod scenario_cmd;
mod signals;
mod stamp;
#[cfg(feature = "cluster")]
mod user_kubeconfig;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Args, Command};

/// Exit code for a run that failed (nothing succeeded, a worker crashed).
const EXIT_FAILED: u8 = 1;
/// Exit code for bad usage or input.
const EXIT_USAGE: u8 = 2;

/// An error that is the user's input, not the run: exits 2.
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) anyhow::Error);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for UsageError {}

/// What a build without cluster mode (`cargo build --no-default-features`, the lab alone,
/// as `scripts/demo.sh` builds it) says when asked for it.
#[cfg(not(feature = "cluster"))]
pub(crate) fn no_cluster() -> anyhow::Error {
    UsageError(anyhow::anyhow!(
        "this ingressbench was built for the lab alone (without the `cluster` feature); for cluster mode build it with: cargo build --release -p ingressbench"
    ))
    .into()
}

/// Raises the soft limit on open files to the hard limit, as a load generator holding
/// thousands of connections needs (the soft limit is often 1024); proxies and backends
/// inherit it. A failure leaves the limit as it was: runs that need more say so then.
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    raise_open_file_limit();
    let result = match args.command {
        Command::Load(load) => load_cmd::run(*load),
        Command::Capacity(args) => capacity_cmd::run(args),
        Command::Backend(backend) => backend_cmd::run(backend),
        Command::Lab(lab) => lab_cmd::run(lab),
        Command::Scenario(command) => scenario_cmd::run(command),
        Command::Run(args) => scenario_cmd::run_scenario(args),
        Command::Report(args) => report_cmd::report(args),
        Command::Compare(args) => report_cmd::compare(args),
        Command::Export(args::ExportCommand::Prometheus(args)) => {
            report_cmd::export_prometheus(args)
        }
        #[cfg(feature = "cluster")]
        Command::Cluster(command) => cluster_cmd::run(command),
        #[cfg(not(feature = "cluster"))]
        Command::Cluster(_) => Err(no_cluster()),
        Command::Worker => load_cmd::worker(),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {err:#}");
            if err.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::from(EXIT_FAILED)
            }
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
        .any(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}
