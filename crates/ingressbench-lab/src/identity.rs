//! Who the lab's processes run as, and what that takes: the files they read and write
//! are theirs, and the binaries they run are reachable by them.
//!
//! Run as root, the tool starts every proxy, backend and front as the system user
//! [`LAB_USER`] (the way Debian's packages run nginx as `www-data` and HAProxy as
//! `haproxy`), with no supplementary groups and `no_new_privs`; nothing they do needs
//! root (ports are ephemeral, namespaces and kernel settings are made by the tool before
//! they start). The lab's directory is theirs and mode 0700, so neither its files nor the
//! control sockets in it answer any other local user. Run as anyone else, the tool starts
//! them as itself: they can have no less.
//!
//! Not here: starting processes ([`crate::process`]), the lab's directory
//! ([`crate::Lab`]).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::LabError;

/// The system user the lab's processes run as when the tool runs as root.
pub const LAB_USER: &str = "ingressbench";

/// The command that creates [`LAB_USER`].
pub const CREATE_LAB_USER: &str =
    "useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin ingressbench";

/// A user and group to run as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

/// Who the lab's processes run as: [`LAB_USER`] when the tool runs as root, `None`
/// (the tool's own user) otherwise. An error says how to create the user when it is
/// missing.
pub fn lab_identity() -> Result<Option<Identity>, LabError> {
    static FOUND: OnceLock<Option<Identity>> = OnceLock::new();
    if let Some(found) = FOUND.get() {
        return Ok(*found);
    }
    let found = if rustix::process::geteuid().is_root() {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        Some(
            find_user(&passwd, LAB_USER).ok_or_else(|| LabError::LabUser {
                reason: format!("the system user `{LAB_USER}` does not exist"),
                fix: format!("{CREATE_LAB_USER} (bash scripts/install-deps.sh does it)"),
            })?,
        )
    } else {
        None
    };
    Ok(*FOUND.get_or_init(|| found))
}

/// The user named `name` in a passwd file's text.
fn find_user(passwd: &str, name: &str) -> Option<Identity> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == name).then_some(())?;
        let uid = fields.nth(1)?.parse().ok()?;
        let gid = fields.next()?.parse().ok()?;
        Some(Identity { uid, gid })
    })
}

/// Makes `path` (not what a link there points to) belong to the lab's processes, when
/// they run as a user of their own.
pub(crate) fn own(path: &Path) -> Result<(), LabError> {
    match lab_identity()? {
        Some(who) => hand_to(path, who),
        None => Ok(()),
    }
}

/// Makes `path` (not what a link there points to) belong to `who`.
fn hand_to(path: &Path, who: Identity) -> Result<(), LabError> {
    rustix::fs::chownat(
        rustix::fs::CWD,
        path,
        Some(rustix::process::Uid::from_raw(who.uid)),
        Some(rustix::process::Gid::from_raw(who.gid)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| LabError::Io {
        action: "handing to the lab's user",
        path: path.to_owned(),
        source: e.into(),
    })
}

/// `binary` as the lab's processes can run it: the binary itself when `who` can reach
/// it, else a link to it (a copy across file systems) in `stage`, a directory of the
/// lab. (A build under root's 0700 home is the usual case.)
pub fn runnable(binary: &Path, who: Option<Identity>, stage: &Path) -> Result<PathBuf, LabError> {
    let Some(who) = who else {
        return Ok(binary.to_owned());
    };
    // Judged where it really is; named as the caller named it.
    let real = binary.canonicalize().unwrap_or_else(|_| binary.to_owned());
    if reachable(&real, who) {
        return Ok(binary.to_owned());
    }
    let binary = real;
    let name = binary.file_name().unwrap_or_default();
    let staged = stage.join(name);
    if staged.exists() {
        return Ok(staged);
    }
    let io = |source| LabError::Io {
        action: "staging for the lab's user",
        path: staged.clone(),
        source,
    };
    std::fs::create_dir_all(stage).map_err(io)?;
    hand_to(stage, who)?;
    if std::fs::hard_link(&binary, &staged).is_err() {
        std::fs::copy(&binary, &staged).map_err(io)?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755)).map_err(io)?;
    }
    Ok(staged)
}

/// Whether `who` may run `path`: every directory above it searchable, the file
/// executable, by owner, group or others' bits as the kernel would judge.
fn reachable(path: &Path, who: Identity) -> bool {
    let allowed = |p: &Path, bit: u32| {
        std::fs::metadata(p).is_ok_and(|m| {
            let shift = if m.uid() == who.uid {
                6
            } else if m.gid() == who.gid {
                3
            } else {
                0
            };
            (m.mode() >> shift) & bit != 0
        })
    };
    path.ancestors().skip(1).all(|dir| allowed(dir, 0o1)) && allowed(path, 0o1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_user_by_name_and_nothing_else() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\ningressbench-old:x:5:5::/:/bin/false\ningressbench:x:998:997::/nonexistent:/usr/sbin/nologin\n";
        assert_eq!(
            find_user(passwd, "ingressbench"),
            Some(Identity { uid: 998, gid: 997 })
        );
        assert_eq!(find_user(passwd, "nobody"), None);
        assert_eq!(
            find_user("ingressbench:x:abc:1::/:/\n", "ingressbench"),
            None
        );
    }

    #[test]
    fn a_binary_under_a_closed_directory_is_not_reachable() {
        let dir = std::env::temp_dir().join(format!("ib-identity-{}", std::process::id()));
        let closed = dir.join("closed");
        std::fs::create_dir_all(&closed).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = closed.join("tool");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let stranger = Identity {
            uid: 4_000_000_001,
            gid: 4_000_000_001,
        };
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(reachable(&bin, stranger));
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(!reachable(&bin, stranger));
        let stage = dir.join("stage");
        let staged = runnable(&bin, Some(stranger), &stage).unwrap();
        assert_eq!(staged, stage.join("tool"));
        assert!(staged.is_file());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
