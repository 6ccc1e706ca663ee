//! The cluster's error type.

use std::path::PathBuf;

/// Why a cluster could not be brought up or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// A binary or file it needs is not there.
    #[error("{what} is missing (looked at {}); {fix}", looked.display())]
    Missing {
        /// What is missing, and where it is looked for.
        what: String,
        /// Where it was looked for.
        looked: PathBuf,
        /// How to get it.
        fix: String,
    },
    /// A file could not be written or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file read or written.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// A cluster file is malformed.
    #[error("{}: {message}", path.display())]
    File {
        /// The cluster file.
        path: PathBuf,
        /// What is wrong and what would be valid.
        message: String,
    },
    /// The Kubernetes API refused or did not answer.
    #[error("Kubernetes API: {0}")]
    Api(String),
    /// A process of the control plane did not start, or exited.
    #[error(transparent)]
    Process(#[from] ingressbench_lab::LabError),
}
