//! The lab's error type.

use std::path::PathBuf;

/// Why the lab could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LabError {
    /// A backend option has a value that cannot work.
    #[error("invalid backend {field}: {reason}")]
    InvalidBackend {
        /// The option, as the user wrote it.
        field: String,
        /// What is wrong and what would be valid.
        reason: String,
    },
    /// A value that would reach a proxy's configuration is not allowed.
    #[error("invalid {field} `{value}`: {reason}")]
    InvalidValue {
        /// Where the value was given.
        field: String,
        /// The value (as given).
        value: String,
        /// What would be valid.
        reason: String,
    },
    /// A process could not be started at all.
    #[error("cannot start {name} ({}): {source}", program.display())]
    Spawn {
        /// What it is (`nginx`, `backend b1`).
        name: String,
        /// The program that did not start.
        program: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// A process started but did not become ready.
    #[error("{name} ({}) did not become ready: {reason}\nits configuration and log are in {}; the log ({}) ends with:\n{log_tail}", program.display(), log.parent().map(|d| d.display().to_string()).unwrap_or_default(), log.display())]
    NotReady {
        /// What it is.
        name: String,
        /// The program that did not become ready.
        program: PathBuf,
        /// Its log file.
        log: PathBuf,
        /// What was seen.
        reason: String,
        /// The end of its log.
        log_tail: String,
    },
    /// A proxy binary did not answer the question every build of its kind answers (its
    /// version) in time.
    #[error("{} does not behave like {kind}: {reason}; if it is not {kind}, point --proxy-bin {kind}=PATH at the right binary, else reinstall it ({install})", program.display())]
    Unresponsive {
        /// The proxy kind.
        kind: String,
        /// The program that stopped answering.
        program: PathBuf,
        /// What happened.
        reason: String,
        /// The command that installs it.
        install: String,
    },
    /// A proxy binary was not found.
    #[error("{kind} is not installed (looked for `{binary}` on PATH and in .venv/bin); install it with: {install}")]
    MissingBinary {
        /// The proxy kind.
        kind: String,
        /// The binary name looked for.
        binary: String,
        /// The command that installs it.
        install: String,
    },
    /// A file of the lab could not be written or read.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory acted on.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The user the lab's processes run as (when the tool runs as root) is missing.
    #[error("the lab runs its processes as an unprivileged user of their own, so that no other local user reaches them, and cannot: {reason}; fix: {fix}")]
    LabUser {
        /// What is wrong.
        reason: String,
        /// The command that fixes it.
        fix: String,
    },
    /// A lab file could not be read or does not describe a lab.
    #[error("{}{}: {message}", path.display(), location.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
    LabFile {
        /// The lab file.
        path: PathBuf,
        /// Line and column, when known.
        location: Option<(usize, usize)>,
        /// What is wrong and what would be valid.
        message: String,
    },
    /// Nodes (addresses, namespaces, veths) could not be set up.
    #[error("cannot set up the lab's nodes ({action}): {reason}")]
    Network {
        /// What was being done.
        action: String,
        /// Why it failed, and the fix when there is one.
        reason: String,
    },
    /// A proxy refused an update.
    #[error("{kind} refused the update ({mechanism}): {reason}")]
    Update {
        /// The proxy kind.
        kind: String,
        /// How the update was sent.
        mechanism: &'static str,
        /// What the proxy said.
        reason: String,
    },
    /// A node's namespace did not take a kernel setting.
    #[error("node {node} did not take sysctl {setting}: {reason}")]
    Kernel {
        /// The node whose kernel settings were refused.
        node: String,
        /// The setting, as `name=value`.
        setting: String,
        /// What the kernel said, or the value it kept.
        reason: String,
    },
    /// A part of the lab that nothing asked to stop (a proxy, the front, the sidecar, a
    /// backend no event killed) exited while it was being measured.
    #[error("{part} exited during the cell ({status}), so what was measured after is not the system under test; its log ends:\n{log_tail}")]
    PartExited {
        /// Which part (`haproxy`, `front`, `sidecar`, `backend echo-2`).
        part: String,
        /// How it ended.
        status: String,
        /// The end of its log.
        log_tail: String,
    },
}
