//! `ingressbench cluster local up | down | kubeconfig`: the local test cluster.
//!
//! `up` starts `cluster local serve` in a process group of its own (so that the terminal's
//! Ctrl-C does not reach it) and returns once the API answers; `serve` owns every process
//! of the control plane, so they all die with it, restarts a controller when a run asks
//! (a `restart` event), and stops them all on SIGTERM; `down` sends that SIGTERM and waits
//! until everything is gone.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ingressbench_cluster::local::{LocalCluster, LocalOptions, KUBE_VERSION};

use crate::args::{ClusterCheckArgs, ClusterCommand, LocalCommand, LocalUpArgs};
use crate::UsageError;

/// How long `up` waits for `serve` to report the cluster up (Envoy Gateway's install
/// included: its chart's wait and its Gateway's are each bounded below this).
const UP_TIMEOUT: Duration = Duration::from_secs(360);
/// How long `down` waits for `serve` to stop everything before killing it.
const DOWN_GRACE: Duration = Duration::from_secs(30);

pub(crate) fn run(command: ClusterCommand) -> Result<ExitCode> {
    match command {
        ClusterCommand::Check(args) => check(&args),
        ClusterCommand::Cleanup(args) => {
            let kubeconfig = crate::user_kubeconfig::chosen_kubeconfig(args.kubeconfig.as_deref())?;
            let api = ingressbench_cluster::api::ClusterApi::connect(
                &kubeconfig,
                args.context.as_deref(),
            )?;
            let removed = ingressbench_cluster::deploy::cleanup(&api)?;
            if removed.is_empty() {
                println!("nothing to clean up");
            }
            for name in removed {
                println!("deleted namespace {name}");
            }
            Ok(ExitCode::SUCCESS)
        }
        ClusterCommand::Local(LocalCommand::Up(args)) => up(&args.local.dir, &args),
        ClusterCommand::Local(LocalCommand::Down(args)) => down(&args.dir),
        ClusterCommand::Local(LocalCommand::Kubeconfig(args)) => {
            let path = kubeconfig(&args.dir);
            if !path.is_file() {
                return Err(not_up(&args.dir));
            }
            println!("{}", path.display());
            Ok(ExitCode::SUCCESS)
        }
        ClusterCommand::Local(LocalCommand::Serve(args)) => serve(&args.local.dir, &args),
        ClusterCommand::Local(LocalCommand::Enter(args)) => {
            let user = args
                .user
                .split_once(':')
                .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)))
                .ok_or_else(|| UsageError(anyhow::anyhow!("--user takes UID:GID")))?;
            let mounts: Vec<ingressbench_cluster::image::Bind> =
                [(&args.bind, false), (&args.bind_ro, true)]
                    .into_iter()
                    .flat_map(|(pairs, read_only)| {
                        pairs
                            .chunks(2)
                            .map(move |p| ingressbench_cluster::image::Bind {
                                source: p[0].clone().into(),
                                target: p[1].clone(),
                                read_only,
                            })
                    })
                    .collect();
            let failed = ingressbench_cluster::image::enter(
                &args.root,
                user,
                &args.groups,
                &args.workdir,
                &mounts,
                &args.argv,
                args.inner,
            );
            eprintln!("error: {failed}");
            // As a container runtime says a command it could not run.
            Ok(ExitCode::from(127))
        }
    }
}

fn check(args: &ClusterCheckArgs) -> Result<ExitCode> {
    let mut file =
        ingressbench_cluster::file::ClusterFile::read(&crate::cluster_run::named(&args.file))
            .map_err(|e| UsageError(e.into()))?;
    if args.context.is_some() {
        file.context = args.context.clone();
    }
    let kubeconfig = crate::user_kubeconfig::chosen_kubeconfig(args.kubeconfig.as_deref())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let findings = runtime.block_on(ingressbench_cluster::check::check(&file, &kubeconfig));
    let mut failed = 0;
    for f in &findings {
        if !f.ok {
            failed += 1;
        }
        println!(
            "{} {}: {}",
            if f.ok { "ok  " } else { "FAIL" },
            f.what,
            ingressbench_report::terminal::printable(&f.detail)
        );
    }
    if failed > 0 {
        return Err(UsageError(anyhow::anyhow!(
            "{failed} of {} checks failed (each FAIL line names its fix)",
            findings.len()
        ))
        .into());
    }
    Ok(ExitCode::SUCCESS)
}

fn kubeconfig(dir: &Path) -> PathBuf {
    dir.join("cluster").join("kubeconfig")
}

fn not_up(dir: &Path) -> anyhow::Error {
    UsageError(anyhow::anyhow!(
        "no local cluster is up in {}; start one with: ingressbench cluster local up",
        dir.display()
    ))
    .into()
}

/// The process serving the cluster in `dir`, if it is alive.
fn serving(dir: &Path) -> Option<u32> {
    let pid = std::fs::read_to_string(dir.join("serve.pid"))
        .ok()?
        .trim()
        .parse::<u32>()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let zombie = stat
        .rsplit_once(')')
        .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
    (!zombie).then_some(pid)
}

fn up(dir: &Path, args: &LocalUpArgs) -> Result<ExitCode> {
    if let Some(pid) = serving(dir) {
        return Err(UsageError(anyhow::anyhow!(
            "a local cluster is already up in {} (process {pid}); its kubeconfig is {}; stop it with: ingressbench cluster local down",
            dir.display(),
            kubeconfig(dir).display()
        ))
        .into());
    }
    let ports = [
        ("--http-port", args.http_port),
        ("--https-port", args.https_port),
        ("--contour-port", args.contour_port),
        ("--haproxy-ingress-port", args.haproxy_ingress_port),
        (
            "--haproxy-ingress-https-port",
            args.haproxy_ingress_https_port,
        ),
    ];
    for (flag, port) in ports.into_iter().filter(|(_, p)| *p != 0) {
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            return Err(UsageError(anyhow::anyhow!(
                "port {port} on 127.0.0.1 ({flag}) is taken{}; give another, or leave {flag} out for a free one",
                holder(port)
                    .map(|(pid, name)| format!(" by process {pid} ({name})"))
                    .unwrap_or_default()
            ))
            .into());
        }
    }
    build_missing_parts()?;
    if let Some(v) = &args.envoy_gateway {
        if ingressbench_cluster::local::EnvoyGatewayOptions::of(v).is_none() {
            return Err(UsageError(anyhow::anyhow!(
                "Envoy Gateway {v} is not built here (or Helm is not): bash scripts/controllers.sh builds {}",
                ingressbench_cluster::local::ENVOY_GATEWAY_VERSIONS.join(" and ")
            ))
            .into());
        }
    }
    // Whatever a serve that was SIGKILLed left, its context in the user's kubeconfig too.
    let _ = crate::user_kubeconfig::remove(dir);
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let log_path = dir.join("serve.log");
    let log = std::fs::File::create(&log_path)?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["cluster", "local", "serve", "--dir"])
        .arg(dir)
        .arg("--http-port")
        .arg(args.http_port.to_string())
        .arg("--https-port")
        .arg(args.https_port.to_string())
        .arg("--contour-port")
        .arg(args.contour_port.to_string())
        .arg("--haproxy-ingress-port")
        .arg(args.haproxy_ingress_port.to_string())
        .arg("--haproxy-ingress-https-port")
        .arg(args.haproxy_ingress_https_port.to_string())
        .arg("--nodes")
        .arg(args.nodes.to_string())
        .args(args.image.iter().flat_map(|i| ["--image", i]))
        .args(args.no_image.then_some("--no-image"))
        .args(
            args.envoy_gateway
                .iter()
                .flat_map(|v| ["--envoy-gateway", v]),
        )
        // The user's KUBECONFIG names their clusters, not this one; Traefik reads the
        // variable before its own flags and would watch the user's cluster instead.
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting the cluster's serving process")?;
    let started = Instant::now();
    let ready = dir.join("ready");
    loop {
        if let Ok(server) = std::fs::read_to_string(&ready) {
            println!(
                "local cluster up: Kubernetes v{KUBE_VERSION}, API {} ({:.1} s)",
                server.trim(),
                started.elapsed().as_secs_f64()
            );
            // As kind does: usable without a flag, and `down` takes it out again.
            let added = crate::user_kubeconfig::users()
                .ok_or_else(|| anyhow::anyhow!("no HOME and no KUBECONFIG"))
                .and_then(|theirs| crate::user_kubeconfig::add(dir, &kubeconfig(dir), &theirs));
            match added {
                Ok(said) => println!("{said}"),
                Err(e) => println!(
                    "kubeconfig: not added to yours ({e:#}); use: export KUBECONFIG={}",
                    kubeconfig(dir).display()
                ),
            }
            if dir.join("cluster.yaml").is_file() {
                let text = std::fs::read_to_string(dir.join("cluster.yaml")).unwrap_or_default();
                let targets: Vec<&str> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("  ")?.split_once(':').map(|(n, _)| n))
                    .collect();
                println!(
                    "cluster file ({}): {}",
                    targets.join(", "),
                    dir.join("cluster.yaml").display()
                );
            }
            if let Ok(runs) = std::fs::read_to_string(dir.join("pods-run")) {
                println!("pods run {runs}");
            }
            if let Ok(eg) = std::fs::read_to_string(dir.join("envoy-gateway")) {
                println!("{eg}");
            }
            println!("stop it with: ingressbench cluster local down");
            return Ok(ExitCode::SUCCESS);
        }
        if let Some(status) = child.try_wait()? {
            let mut said = String::new();
            let _ = std::fs::File::open(&log_path).and_then(|mut f| f.read_to_string(&mut said));
            let _ = std::fs::remove_dir_all(dir);
            anyhow::bail!(
                "the local cluster did not start ({status}):\n{}",
                said.trim()
            );
        }
        if started.elapsed() > UP_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "the local cluster was not up after {UP_TIMEOUT:?}; its logs are in {}",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn serve(dir: &Path, args: &LocalUpArgs) -> Result<ExitCode> {
    let stop = crate::signals::stop_flag()?;
    std::fs::write(dir.join("serve.pid"), std::process::id().to_string())?;
    let mut options = LocalOptions::discover(dir.join("cluster"));
    options.nodes = usize::from(args.nodes);
    if args.no_image {
        options.image = None;
    }
    if let Some(spec) = &args.image {
        // `DIR:TAG`, unless the whole of it is a directory.
        let (layout, tag) = match spec.rsplit_once(':') {
            Some((l, t)) if !Path::new(spec).is_dir() => (l, t),
            _ => (spec.as_str(), "latest"),
        };
        options.image = Some((PathBuf::from(layout), tag.to_owned()));
    }
    std::fs::write(
        dir.join("pods-run"),
        match &options.image {
            Some((layout, tag)) => format!("the image {}:{tag}", layout.display()),
            None => format!(
                "this binary as the image's user {}:{} (no image: scripts/image.sh builds one)",
                ingressbench_cluster::agent::IMAGE_USER.0,
                ingressbench_cluster::agent::IMAGE_USER.1
            ),
        },
    )?;
    match options.traefik.as_mut() {
        Some(t) => (t.http_port, t.https_port) = (args.http_port, args.https_port),
        None => {
            eprintln!("traefik not found (bash scripts/install-deps.sh): no ingress controller")
        }
    }
    match options.contour.as_mut() {
        Some(c) => c.http_port = args.contour_port,
        None => eprintln!(
            "contour or the Gateway API's CRDs not found (bash scripts/controllers.sh): no Contour, no Gateway"
        ),
    }
    match options.haproxy_ingress.as_mut() {
        Some(h) => (h.http_port, h.https_port) = (args.haproxy_ingress_port, args.haproxy_ingress_https_port),
        None => eprintln!(
            "haproxy-ingress or haproxy not found (bash scripts/controllers.sh, bash scripts/install-deps.sh): no HAProxy Ingress"
        ),
    }
    if let Some(v) = &args.envoy_gateway {
        options.envoy_gateway = ingressbench_cluster::local::EnvoyGatewayOptions::of(v);
    }
    if options.envoy_gateway.is_none() {
        eprintln!("helm or Envoy Gateway's chart not found (bash scripts/controllers.sh): no Envoy Gateway");
    }
    let mut cluster = LocalCluster::up(&options)?;
    if let Some(eg) = cluster.envoy_gateway() {
        std::fs::write(
            dir.join("envoy-gateway"),
            format!(
                "Envoy Gateway v{}: helm install of its chart, its Gateway answering at {} ({:.1} s)",
                eg.version,
                eg.at[0].ip(),
                eg.took.as_secs_f64()
            ),
        )?;
    }
    if let Some(text) = cluster.cluster_file() {
        // A cluster file for this cluster, for `cluster check` and `run --cluster`.
        write_cluster_file(dir, &text)?;
    }
    std::fs::write(dir.join("ready"), cluster.server())?;
    for (name, pid) in cluster.processes() {
        eprintln!("{name}: process {pid}");
    }
    while !stop.load(Ordering::Relaxed) {
        match cluster.keep_alive() {
            Ok(said) if said.is_empty() => {}
            Ok(said) => {
                for line in said {
                    eprintln!("{line}");
                }
                // The controller's new process id.
                if let Some(text) = cluster.cluster_file() {
                    write_cluster_file(dir, &text)?;
                }
            }
            Err(e) => {
                // The directory stays, its logs with it, until `down`: they say why
                // (written before the parts are stopped, which takes their grace).
                eprintln!("error: the local cluster stopped: {e}");
                std::fs::write(
                    dir.join(crate::cluster_run::LOCAL_STOPPED),
                    format!("{e}\n"),
                )?;
                drop(cluster);
                return Ok(ExitCode::FAILURE);
            }
        }
        // A run's `restart` of a controller: the new process's id goes into the file.
        if cluster.serve_restarts() {
            if let Some(text) = cluster.cluster_file() {
                write_cluster_file(dir, &text)?;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(dir);
    Ok(ExitCode::SUCCESS)
}

/// Builds what the local cluster needs and the cache lacks, as `scripts/test.sh` would
/// (the control plane, the controllers), once, saying what and for how long; found through
/// the project's scripts (in the working directory or above it, or above this binary).
/// Without the scripts the cluster's own start says what is missing.
fn build_missing_parts() -> Result<()> {
    let options = LocalOptions::discover(PathBuf::new());
    let kube = [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ]
    .iter()
    .any(|b| !options.kube_bin.join(b).is_file());
    let controllers = options.gateway_crds.is_none()
        || options.contour.is_none()
        || options.haproxy_ingress.is_none()
        || options.envoy_gateway.is_none();
    let parts = [
        (
            kube,
            "kube-binaries.sh",
            format!("the control plane (Kubernetes v{KUBE_VERSION}: kube-apiserver, kube-controller-manager, kube-scheduler)"),
            "6 to 11 minutes on 2 cores",
        ),
        (
            controllers,
            "controllers.sh",
            "the controllers (the Gateway API's CRDs, Contour, HAProxy Ingress, Helm and Envoy Gateway)".to_owned(),
            "about 3 minutes",
        ),
    ];
    for (missing, script, what, takes) in parts {
        if !missing {
            continue;
        }
        let Some(path) = project_script(script) else {
            return Ok(());
        };
        let started = Instant::now();
        println!(
            "building {what} from the Go module proxy, once ({takes}; cached by version): {}",
            path.display()
        );
        let built = Command::new("bash")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .with_context(|| format!("running {}", path.display()))?;
        if !built.success() {
            anyhow::bail!(
                "building {what} failed ({built}; its output is above); fix that and run `ingressbench cluster local up` again, or run {} yourself",
                path.display()
            );
        }
        println!("built {what} in {:.0} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// `scripts/NAME` of the project: in the working directory or one above it, or above
/// this binary (`target/release/ingressbench`).
fn project_script(name: &str) -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok();
    let exe = std::env::current_exe().ok();
    cwd.iter()
        .chain(exe.iter())
        .flat_map(|start| start.ancestors())
        .map(|dir| dir.join("scripts").join(name))
        .find(|p| p.is_file())
}

/// The process listening on TCP `port` (its pid and name), from /proc: the socket's inode
/// in /proc/net/tcp{,6}, then the process with a descriptor on it (one this user may see).
fn holder(port: u16) -> Option<(u32, String)> {
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields.get(1)?.rsplit(':').next()?;
            // State 0A: listening.
            (u16::from_str_radix(local_port, 16).ok()? == port && fields.get(3) == Some(&"0A"))
                .then(|| fields.get(9).map(|s| (*s).to_owned()))?
        })
        .collect();
    let sockets: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find_map(|pid| {
            let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
            fds.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .any(|target| sockets.iter().any(|s| target.as_os_str() == s.as_str()))
                .then(|| {
                    let name =
                        std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                    (pid, name.trim().to_owned())
                })
        })
}

fn down(dir: &Path) -> Result<ExitCode> {
    if let Some(said) = crate::user_kubeconfig::remove(dir)? {
        println!("{said}");
    }
    let Some(pid) = serving(dir) else {
        if dir.exists() {
            // A serve that stopped on a part's exit, or was SIGKILLed, took its processes
            // with it; only files remain.
            if let Ok(why) = std::fs::read_to_string(dir.join(crate::cluster_run::LOCAL_STOPPED)) {
                println!("it had stopped: {}", why.trim());
            }
            std::fs::remove_dir_all(dir)?;
            println!(
                "removed {} (its processes were gone already)",
                dir.display()
            );
            return Ok(ExitCode::SUCCESS);
        }
        return Err(not_up(dir));
    };
    let target = rustix::process::Pid::from_raw(pid as i32).context("bad pid")?;
    let _ = rustix::process::kill_process(target, rustix::process::Signal::TERM);
    let started = Instant::now();
    while serving(dir).is_some() && started.elapsed() < DOWN_GRACE {
        std::thread::sleep(Duration::from_millis(100));
    }
    if serving(dir).is_some() {
        // Its children die with it (parent-death signal).
        let _ = rustix::process::kill_process(target, rustix::process::Signal::KILL);
    }
    let _ = std::fs::remove_dir_all(dir);
    println!(
        "local cluster down ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes the cluster file aside and renames it into place: a run never reads half of it.
fn write_cluster_file(dir: &Path, text: &str) -> std::io::Result<()> {
    let partial = dir.join("cluster.yaml.partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, dir.join("cluster.yaml"))
}
