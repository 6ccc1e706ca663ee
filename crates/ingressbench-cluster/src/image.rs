//! Images for the local cluster's node agent: an OCI image layout (what
//! `scripts/image.sh` writes, or `buildah push … oci:DIR:TAG`) unpacked with umoci into a
//! root filesystem, with the image's configuration (entrypoint, command, environment,
//! user, working directory) read from the layout itself, and the way a container of it is
//! started: chrooted into that root filesystem as the pod's user ([`enter`]), so that a
//! pod runs exactly what a user pushes to a registry.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::ClusterError;

/// The hidden command of this tool that [`enter`]s a root filesystem and runs a
/// container's command there (the node agent starts it in the pod's network namespace).
pub const ENTER_COMMAND: [&str; 3] = ["cluster", "local", "enter"];

/// An image unpacked for the agent.
#[derive(Clone, Debug)]
pub struct Image {
    /// The layout and tag it came from (`DIR:TAG`).
    pub reference: String,
    /// The digest of its manifest (`sha256:…`).
    pub digest: String,
    /// Its root filesystem.
    pub rootfs: PathBuf,
    /// `ENTRYPOINT` (a container's `command` replaces it).
    pub entrypoint: Vec<String>,
    /// `CMD` (a container's `args` replace it).
    pub cmd: Vec<String>,
    /// `ENV`, as `NAME=value`.
    pub env: Vec<(String, String)>,
    /// `USER`, numeric (`uid` or `uid:gid`); none: root.
    pub user: Option<(u32, u32)>,
    /// `WORKDIR` (default `/`).
    pub workdir: String,
    /// This tool, which [`enter`]s the root filesystem for the container.
    pub launcher: PathBuf,
}

impl Image {
    /// The image tagged `tag` in the OCI layout `layout`, unpacked under `into` (which
    /// must not exist) with umoci.
    pub fn unpack(
        layout: &Path,
        tag: &str,
        into: &Path,
        launcher: PathBuf,
    ) -> Result<Image, ClusterError> {
        let bad = |message: String| ClusterError::File {
            path: layout.to_owned(),
            message,
        };
        let index = read_json(&layout.join("index.json"))?;
        let manifest = index["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
            .ok_or_else(|| {
                bad(format!(
                    "no image tagged `{tag}` in this OCI layout (build one: bash scripts/image.sh --out {})",
                    layout.display()
                ))
            })?;
        let digest = manifest["digest"].as_str().unwrap_or_default().to_owned();
        let manifest = read_json(&blob(layout, &digest).map_err(&bad)?)?;
        let config_digest = manifest["config"]["digest"].as_str().unwrap_or_default();
        let config = read_json(&blob(layout, config_digest).map_err(&bad)?)?;
        let config = &config["config"];
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        };
        let user = match config["User"].as_str().unwrap_or("") {
            "" => None,
            spec => Some(numeric_user(spec).ok_or_else(|| {
                bad(format!(
                    "USER `{spec}` is not numeric (uid or uid:gid): a FROM scratch image has no /etc/passwd to look a name up in"
                ))
            })?),
        };
        let output = Command::new("umoci")
            .args(["unpack", "--image"])
            .arg(format!("{}:{tag}", layout.display()))
            .arg(into)
            .output()
            .map_err(|e| ClusterError::Missing {
                what: format!("umoci ({e})"),
                looked: PathBuf::from("PATH"),
                fix: "apt-get install umoci (bash scripts/install-deps.sh)".into(),
            })?;
        if !output.status.success() {
            return Err(bad(format!(
                "umoci unpack failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        // Where each container gets a /proc of its own ([`enter`]).
        let proc_dir = into.join("rootfs/proc");
        std::fs::create_dir_all(&proc_dir).map_err(|source| ClusterError::Io {
            path: proc_dir,
            source,
        })?;
        Ok(Image {
            reference: format!("{}:{tag}", layout.display()),
            digest,
            rootfs: into.join("rootfs"),
            entrypoint: strings(&config["Entrypoint"]),
            cmd: strings(&config["Cmd"]),
            env: strings(&config["Env"])
                .into_iter()
                .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.into(), v.into())))
                .collect(),
            user,
            workdir: config["WorkingDir"]
                .as_str()
                .filter(|w| !w.is_empty())
                .unwrap_or("/")
                .to_owned(),
            launcher,
        })
    }

    /// An image made here from a local binary, as the project's own builds stand for an
    /// image a chart names (`envoyproxy/envoy`, `envoyproxy/gateway`): the binary at `path`
    /// in a root filesystem of its own under `into` (which must not exist), with the
    /// shared libraries it links (`ldd`), hard-linked where they share a filesystem, else
    /// copied; its entrypoint that path, its user `user`, `PATH` the usual one.
    pub fn stage(
        reference: &str,
        binary: &Path,
        path: &str,
        user: Option<(u32, u32)>,
        into: &Path,
        launcher: PathBuf,
    ) -> Result<Image, ClusterError> {
        let rootfs = into.join("rootfs");
        let io = |path: &Path, source| ClusterError::Io {
            path: path.to_owned(),
            source,
        };
        let place = |from: &Path, to: &Path| -> Result<(), ClusterError> {
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            }
            std::fs::hard_link(from, to)
                .or_else(|_| std::fs::copy(from, to).map(|_| ()))
                .map_err(|e| io(to, e))
        };
        let inside = |p: &str| rootfs.join(p.trim_start_matches('/'));
        place(binary, &inside(path))?;
        // A static binary (Go's) links nothing: ldd says so and fails.
        let linked = Command::new("ldd")
            .arg(binary)
            .output()
            .map_err(|e| io(Path::new("ldd"), e))?;
        for lib in String::from_utf8_lossy(&linked.stdout)
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
        {
            let real = std::fs::canonicalize(lib).map_err(|e| io(Path::new(lib), e))?;
            place(&real, &inside(lib))?;
        }
        let proc_dir = rootfs.join("proc");
        std::fs::create_dir_all(&proc_dir).map_err(|e| io(&proc_dir, e))?;
        // As a distroless image has it (Envoy Gateway's shutdown manager writes there).
        let tmp = rootfs.join("tmp");
        std::fs::create_dir_all(&tmp)
            .and_then(|()| {
                std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
            })
            .map_err(|e| io(&tmp, e))?;
        Ok(Image {
            reference: format!("{reference} (staged from {})", binary.display()),
            digest: String::new(),
            rootfs,
            entrypoint: vec![path.to_owned()],
            cmd: Vec::new(),
            env: vec![(
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            )],
            user,
            workdir: "/".into(),
            launcher,
        })
    }

    /// What a container of this image runs, as the kubelet decides it: its `command`
    /// replaces the entrypoint, its `args` the image's command.
    pub fn argv(&self, command: Option<&[String]>, args: Option<&[String]>) -> Vec<String> {
        match command {
            Some(command) => command.iter().chain(args.unwrap_or(&[])).cloned().collect(),
            None => self
                .entrypoint
                .iter()
                .chain(args.unwrap_or(&self.cmd))
                .cloned()
                .collect(),
        }
    }
}

fn numeric_user(spec: &str) -> Option<(u32, u32)> {
    match spec.split_once(':') {
        Some((u, g)) => Some((u.parse().ok()?, g.parse().ok()?)),
        None => {
            let u = spec.parse().ok()?;
            Some((u, u))
        }
    }
}

/// The blob `sha256:HEX` of a layout.
fn blob(layout: &Path, digest: &str) -> Result<PathBuf, String> {
    let (algorithm, hex) = digest
        .split_once(':')
        .filter(|(_, h)| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| format!("`{digest}` is not a digest"))?;
    Ok(layout.join("blobs").join(algorithm).join(hex))
}

fn read_json(path: &Path) -> Result<Value, ClusterError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClusterError::Io {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ClusterError::File {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// A directory or file of the host mounted at a path inside a root filesystem (a pod's
/// volume).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    /// What is mounted.
    pub source: PathBuf,
    /// Where, inside the root filesystem (absolute, as a container's `mountPath`).
    pub target: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// Runs `argv` inside `rootfs` as `uid:gid` (in `groups` besides, no new privileges),
/// in `workdir`, as a container runtime runs a container's process: in a mount namespace
/// and a PID namespace of its own, where it is process 1 and its `/proc` shows its own
/// processes (a hook run in the container, `nsenter`ed, sees it there as process 1, and
/// its output as `/proc/1/fd/1`); with a container's `/dev`, a `/tmp` of its own (the
/// writable layer's, where the image has one) and `mounts` in place; chrooted, as the
/// user, asking to be killed when its parent goes. This process stays outside as the
/// container's parent: it passes on the signals the node agent sends (TERM above all) and
/// exits as the container did. Called single-threaded, as root, by the hidden
/// [`ENTER_COMMAND`] (and again by itself, `inner`, as that process 1); returns only on
/// failure.
pub fn enter(
    rootfs: &Path,
    (uid, gid): (u32, u32),
    groups: &[u32],
    workdir: &str,
    mounts: &[Bind],
    argv: &[String],
    inner: bool,
) -> String {
    use std::os::unix::process::CommandExt;
    let Some((program, args)) = argv.split_first() else {
        return "no command to run: the image has no ENTRYPOINT or CMD and the container no command".into();
    };
    // The node's own root would have its /dev covered by the container's.
    if rootfs.canonicalize().is_ok_and(|r| r == Path::new("/")) {
        return "the root filesystem is the node's own (/): give an image's".into();
    }
    if !inner {
        if let Err(e) = own_mount_namespace() {
            return format!("cannot make a mount namespace of its own: {e}");
        }
        return match parent_of_container() {
            Ok(code) => std::process::exit(code),
            Err(e) => {
                format!("cannot start the container's process 1 in a PID namespace of its own: {e}")
            }
        };
    }
    let proc = rootfs.join("proc");
    if let Err(e) = std::fs::create_dir_all(&proc).and_then(|()| {
        rustix::mount::mount(
            "proc",
            &proc,
            "proc",
            rustix::mount::MountFlags::NOSUID
                | rustix::mount::MountFlags::NODEV
                | rustix::mount::MountFlags::NOEXEC,
            c"",
        )
        .map_err(std::io::Error::from)
    }) {
        return format!("cannot mount /proc in {}: {e}", rootfs.display());
    }
    if let Err(e) = container_tmp(rootfs) {
        return format!("cannot make /tmp in {}: {e}", rootfs.display());
    }
    if let Err(e) = container_dev(rootfs) {
        return format!("cannot make /dev in {}: {e}", rootfs.display());
    }
    for bind in mounts {
        if let Err(e) = mount_inside(rootfs, bind) {
            return format!(
                "cannot mount {} at {} in {}: {e}",
                bind.source.display(),
                bind.target,
                rootfs.display()
            );
        }
    }
    // The container's output is its user's, as a runtime hands its stdio over: a process
    // that opens `/dev/stdout` again (Envoy's access log) may.
    for fd in [rustix::stdio::stdout(), rustix::stdio::stderr()] {
        let _ = rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        );
    }
    let steps = || -> std::io::Result<()> {
        rustix::process::chroot(rootfs)?;
        std::env::set_current_dir(workdir)?;
        let gid = rustix::process::Gid::from_raw(gid);
        let all: Vec<rustix::process::Gid> = std::iter::once(gid)
            .chain(groups.iter().map(|g| rustix::process::Gid::from_raw(*g)))
            .collect();
        rustix::thread::set_thread_groups(&all)?;
        rustix::thread::set_thread_res_gid(gid, gid, gid)?;
        let uid = rustix::process::Uid::from_raw(uid);
        rustix::thread::set_thread_res_uid(uid, uid, uid)?;
        rustix::thread::set_no_new_privs(true)?;
        // After the change of user, which clears it.
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
        Ok(())
    };
    if let Err(e) = steps() {
        return format!("cannot enter {} as {uid}:{gid}: {e}", rootfs.display());
    }
    let e = Command::new(program).args(args).exec();
    format!("cannot run {program} in the image: {e}")
}

/// Moves this process into a mount namespace of its own whose mounts propagate nowhere,
/// so that the container's mounts are its alone however it was started (the node agent
/// starts it in one already; run by hand, the mounts would otherwise land in the node's).
fn own_mount_namespace() -> std::io::Result<()> {
    use rustix::mount::{mount_change, MountPropagationFlags};
    // `unshare` is deprecated for its FILES flag, whose descriptor tables threads could
    // disagree on; NEWNS alone is safe, and this process has one thread here.
    #[allow(deprecated)]
    rustix::thread::unshare(rustix::thread::UnshareFlags::NEWNS)?;
    mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )?;
    Ok(())
}

/// The signals a container runtime passes on to a container's process 1.
const PASSED: [rustix::process::Signal; 7] = [
    rustix::process::Signal::TERM,
    rustix::process::Signal::INT,
    rustix::process::Signal::HUP,
    rustix::process::Signal::QUIT,
    rustix::process::Signal::USR1,
    rustix::process::Signal::USR2,
    rustix::process::Signal::WINCH,
];

/// The container's parent: makes a PID namespace for its next child, starts this
/// command again in it (`--inner`: process 1 there, which goes on to run the container's
/// process), passes each signal of [`PASSED`] on to it until it exits, and returns its
/// exit code (a signal's: 128 + its number, as a shell says it).
fn parent_of_container() -> std::io::Result<i32> {
    #[allow(deprecated)]
    rustix::thread::unshare(rustix::thread::UnshareFlags::NEWPID)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        // Listening before the child exists, so that no signal meant for it ends this
        // process instead.
        let mut listening = Vec::new();
        for passed in PASSED {
            listening.push((passed, signal(SignalKind::from_raw(passed.as_raw()))?));
        }
        let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        args.insert(ENTER_COMMAND.len(), "--inner".into());
        let mut child = Command::new(std::env::current_exe()?).args(args).spawn()?;
        let pid = rustix::process::Pid::from_child(&child);
        for (passed, mut stream) in listening {
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    let _ = rustix::process::kill_process(pid, passed);
                }
            });
        }
        loop {
            if let Some(status) = child.try_wait()? {
                use std::os::unix::process::ExitStatusExt;
                return Ok(status
                    .code()
                    .or_else(|| status.signal().map(|n| 128 + n))
                    .unwrap_or(1));
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
}

/// The container's own `/tmp`, as its writable layer would hold it: a tmpfs where the
/// image has the directory (the image's files are shared by every container of it).
fn container_tmp(rootfs: &Path) -> std::io::Result<()> {
    let tmp = rootfs.join("tmp");
    if !tmp.is_dir() {
        return Ok(());
    }
    rustix::mount::mount(
        "tmpfs",
        &tmp,
        "tmpfs",
        rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
        c"mode=1777,size=64m",
    )?;
    Ok(())
}

/// The `/dev` a container runtime gives a container: a small tmpfs with the node's
/// `null`, `zero`, `full`, `random` and `urandom` bound in, the usual links, and a
/// tmpfs of its own at `/dev/shm` (Envoy's hot restart keeps its shared memory there).
fn container_dev(rootfs: &Path) -> std::io::Result<()> {
    use rustix::mount::{mount, mount_bind, MountFlags};
    let dev = rootfs.join("dev");
    std::fs::create_dir_all(&dev)?;
    mount(
        "tmpfs",
        &dev,
        "tmpfs",
        MountFlags::NOSUID,
        c"mode=755,size=64k",
    )?;
    for name in ["null", "zero", "full", "random", "urandom"] {
        let node = dev.join(name);
        std::fs::File::create(&node)?;
        mount_bind(Path::new("/dev").join(name), &node)?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(link))?;
    }
    let shm = dev.join("shm");
    std::fs::create_dir(&shm)?;
    mount(
        "shm",
        &shm,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        c"mode=1777,size=64m",
    )?;
    Ok(())
}

/// Bind-mounts `bind` at its target inside `rootfs`, making the mount point (a directory,
/// or an empty file for a file) where the image has none. A target that leaves the root
/// filesystem (`..`, or a link in the image pointing out) is refused.
fn mount_inside(rootfs: &Path, bind: &Bind) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    let relative = Path::new(&bind.target);
    if !relative.is_absolute()
        || relative
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "the target is not an absolute path without `..`",
        ));
    }
    let target = rootfs.join(relative.strip_prefix("/").unwrap_or(relative));
    let root = rootfs.canonicalize()?;
    let leaves =
        |path: &Path| -> std::io::Result<bool> { Ok(!path.canonicalize()?.starts_with(&root)) };
    let outside = || {
        Error::new(
            ErrorKind::InvalidInput,
            "the target leaves the root filesystem through a link",
        )
    };
    // Before anything is made, where the path already exists; after, all of it.
    if leaves(target.ancestors().find(|p| p.exists()).unwrap_or(rootfs))? {
        return Err(outside());
    }
    let is_file = std::fs::metadata(&bind.source)?.is_file();
    match (is_file, target.parent()) {
        (true, Some(parent)) => {
            std::fs::create_dir_all(parent)?;
            if !target.exists() {
                std::fs::File::create(&target)?;
            }
        }
        _ => std::fs::create_dir_all(&target)?,
    }
    if leaves(&target)? {
        return Err(outside());
    }
    use rustix::mount::{mount_bind, mount_remount, MountFlags};
    mount_bind(&bind.source, &target)?;
    if bind.read_only {
        mount_remount(&target, MountFlags::BIND | MountFlags::RDONLY, "")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_containers_command_and_args_replace_the_images_as_the_kubelet_does() {
        let image = Image {
            reference: "x:y".into(),
            digest: String::new(),
            rootfs: PathBuf::new(),
            entrypoint: vec!["/bin/tool".into()],
            cmd: vec!["serve".into()],
            env: Vec::new(),
            user: None,
            workdir: "/".into(),
            launcher: PathBuf::new(),
        };
        let v = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(image.argv(None, None), v(&["/bin/tool", "serve"]));
        assert_eq!(
            image.argv(None, Some(&v(&["worker"]))),
            v(&["/bin/tool", "worker"])
        );
        assert_eq!(
            image.argv(Some(&v(&["/bin/other"])), None),
            v(&["/bin/other"])
        );
        assert_eq!(numeric_user("65532:65532"), Some((65532, 65532)));
        assert_eq!(numeric_user("10"), Some((10, 10)));
        assert_eq!(numeric_user("nobody"), None);
        assert!(blob(Path::new("/l"), "sha256:../../etc").is_err());
    }
}
