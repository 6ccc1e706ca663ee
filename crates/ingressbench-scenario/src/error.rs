//! The scenario crate's error type.

use std::path::PathBuf;

/// Why a scenario file cannot be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The file is not a valid scenario: where, and what would be valid.
    #[error("{}{}: {message}", path.display(), location.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
    Invalid {
        /// The scenario file.
        path: PathBuf,
        /// Line and column, when known.
        location: Option<(usize, usize)>,
        /// The field and what is wrong with it.
        message: String,
    },
    /// The results directory already holds a run, and replacing it was not asked for.
    #[error("{} already holds a run (status {status}); give a new --out, finish it with `ingressbench run --resume {}`, or replace it with --force", dir.display(), dir.display())]
    ResultsExist {
        /// The results directory.
        dir: PathBuf,
        /// The status its run.json records.
        status: String,
    },
    /// Another process is writing the results directory.
    #[error("{} is being written by {holder}; wait for it to end, or give another --out", dir.display())]
    ResultsLocked {
        /// The results directory.
        dir: PathBuf,
        /// Who holds it, as its lock file says (process id and command).
        holder: String,
    },
    /// The results directory holds something this tool did not make where it would write
    /// or delete: it is left alone.
    #[error("{}: not touched: {why}; remove it yourself if it can go, or give another --out", path.display())]
    NotOurs {
        /// What is there.
        path: PathBuf,
        /// Why it is not taken for the tool's own.
        why: String,
    },
    /// The results directory cannot be written.
    #[error("{}: cannot write results: {source}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
}

impl ScenarioError {
    pub(crate) fn at(path: &std::path::Path, message: impl Into<String>) -> Self {
        ScenarioError::Invalid {
            path: path.to_owned(),
            location: None,
            message: message.into(),
        }
    }
}
