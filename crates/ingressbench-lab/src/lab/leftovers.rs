//! What a lab whose owner died left behind (its directory, processes, Envoy's shared
//! memory), found by the owner's pid in the directory's name and removed at the next
//! start.

use std::path::Path;
use std::time::Duration;

use super::DIR_PREFIX;

/// The file that marks a lab directory as kept on purpose.
const KEPT: &str = "KEPT";

/// Marks a lab directory as kept on purpose, so that no later start removes it as stale.
pub(super) fn mark_kept(dir: &Path) {
    let _ = std::fs::write(
        dir.join(KEPT),
        "kept on purpose (--keep, or a process that did not start)\n",
    );
}

/// Once per process: removes what labs of an ingressbench that is gone (its reaper gone
/// too) left behind: processes still working in their lab directory (nginx workers keep
/// their listening ports), network namespaces, the host's veth, lab directories (with
/// their private keys). A lab whose owner is alive is never touched.
pub fn remove_leftovers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut removed = kill_stray_processes();
        removed.extend(crate::topology::remove_stale());
        let dirs = std::fs::read_dir(std::env::temp_dir())
            .into_iter()
            .flatten();
        for entry in dirs.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if dead_owner(&name).is_some() && !entry.path().join(KEPT).exists() {
                removed.extend(remove_dead_lab(&entry.path()));
            }
        }
        for name in removed {
            eprintln!("removed {name}, left behind by an ingressbench that is gone");
        }
    });
}

/// Removes a lab directory whose owner is gone, and the shared memory its Envoys' hot
/// restarts left in /dev/shm (Envoy never removes it; a lab removes it as it stops, which
/// a SIGKILL prevents): found by the `base-id` files in the lab's proxy directories.
/// Returns what it removed, described.
fn remove_dead_lab(dir: &Path) -> Vec<String> {
    let mut removed = Vec::new();
    let mut base_ids = Vec::new();
    find_base_ids(dir, 3, &mut base_ids);
    for id in base_ids {
        if crate::proxy::remove_envoy_shared_memory(id) {
            removed.push(format!(
                "Envoy's hot-restart shared memory for base id {id}"
            ));
        }
    }
    if std::fs::remove_dir_all(dir).is_ok() {
        removed.push(dir.display().to_string());
    }
    removed
}

/// The base ids in `base-id` files at most `depth` directories below `dir` (no link
/// followed).
fn find_base_ids(dir: &Path, depth: u32, found: &mut Vec<u64>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() && depth > 0 {
            find_base_ids(&entry.path(), depth - 1, found);
        } else if kind.is_file() && entry.file_name() == "base-id" {
            let id = std::fs::read_to_string(entry.path()).ok();
            found.extend(id.and_then(|t| t.trim().parse::<u64>().ok()));
        }
    }
}

/// For a name that starts `ingressbench-lab-PID-` (as [`private_dir`] names them): PID,
/// if that process is gone.
fn dead_owner(name: &str) -> Option<&str> {
    name.strip_prefix(DIR_PREFIX)
        .and_then(|r| r.split('-').next())
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .filter(|p| !Path::new("/proc").join(p).exists())
}

/// SIGKILLs every process of a lab whose owner is gone: those marked with
/// [`LAB_DIR_ENV`](crate::process::LAB_DIR_ENV) (every lab child gets it, and what it
/// forks inherits it), and, since some rewrite their environment (nginx workers, for
/// their process title), those whose working directory lies in such a lab's directory
/// unless the lab was kept on purpose (someone may be looking at it). Returns them,
/// described.
fn kill_stray_processes() -> Vec<String> {
    let tmp = std::env::temp_dir();
    let marker = format!("{}=", crate::process::LAB_DIR_ENV);
    // The lab's directory name, for a path inside one.
    let lab_of = |path: &Path| -> Option<String> {
        let name = path.strip_prefix(&tmp).ok()?.iter().next()?.to_str()?;
        dead_owner(name).map(|_| name.to_owned())
    };
    let mut killed = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let marked = std::fs::read(entry.path().join("environ"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .filter_map(|var| std::str::from_utf8(var).ok()?.strip_prefix(&marker))
            .find_map(|dir| lab_of(Path::new(dir)));
        let working_in = || {
            let cwd = std::fs::read_link(entry.path().join("cwd")).ok()?;
            lab_of(&cwd).filter(|lab| !tmp.join(lab).join(KEPT).exists())
        };
        let Some(lab) = marked.or_else(working_in) else {
            continue;
        };
        let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if let Some(target) = rustix::process::Pid::from_raw(pid) {
            if rustix::process::kill_process(target, rustix::process::Signal::KILL).is_ok() {
                killed.push(format!("process {pid} ({}) of {lab}", name.trim()));
            }
        }
    }
    if !killed.is_empty() {
        // Let the kernel take their files and ports back before the directories go.
        std::thread::sleep(Duration::from_millis(100));
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lab whose owner was SIGKILLed mid hot restart: its directory goes, and with it the
    /// shared memory its Envoy left in /dev/shm, found by the lab's `base-id`.
    #[test]
    fn a_dead_labs_envoy_shared_memory_goes_with_it() {
        let gone = std::process::Command::new("true").spawn().unwrap();
        let pid = gone.id();
        let _ = { gone }.wait();
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{pid}-test-shm"));
        let envoy = dir.join("proxies").join("envoy-0");
        std::fs::create_dir_all(&envoy).unwrap();
        // A base id no Envoy of this machine uses.
        let id = 4_000_000_000 + u64::from(pid);
        std::fs::write(envoy.join("base-id"), format!("{id}\n")).unwrap();
        let shm = crate::proxy::envoy_shared_memory(id);
        std::fs::write(&shm, b"left by a hot restart").unwrap();
        assert_eq!(
            dead_owner(dir.file_name().unwrap().to_str().unwrap()),
            Some(pid.to_string().as_str())
        );
        let removed = remove_dead_lab(&dir);
        assert!(!shm.exists(), "{removed:?}");
        assert!(!dir.exists(), "{removed:?}");
        assert!(
            removed.iter().any(|r| r.contains(&id.to_string())),
            "{removed:?}"
        );
    }
}
