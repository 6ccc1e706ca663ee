//! The one error type of the load engine: problems with the plan or the machine, never with
//! a request (a failed request is an [`ingressbench_stats::Outcome`]).

use std::path::PathBuf;

/// Why a load run could not start or finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The URL cannot be used.
    #[error("invalid URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong and what would be valid.
        reason: String,
    },
    /// A request header cannot be used.
    #[error("invalid header `{header}`: {reason}")]
    InvalidHeader {
        /// The header as given.
        header: String,
        /// What is wrong.
        reason: String,
    },
    /// An option has a value that cannot work.
    #[error("invalid {field}: {reason}")]
    InvalidPlan {
        /// The option, as the user wrote it.
        field: String,
        /// What is wrong and what would be valid.
        reason: String,
    },
    /// The TLS client could not be set up.
    #[error("TLS setup failed{}: {reason}", path.as_ref().map(|p| format!(" for {}", p.display())).unwrap_or_default())]
    Tls {
        /// The CA file involved, if any.
        path: Option<PathBuf>,
        /// What went wrong.
        reason: String,
    },
    /// A worker thread or its runtime could not be started.
    #[error("cannot start load worker threads: {0}")]
    Runtime(#[source] std::io::Error),
    /// A worker thread panicked; what it measured is lost.
    #[error(
        "load worker {index} crashed: {message} (this is a bug in ingressbench; please report it)"
    )]
    WorkerPanicked {
        /// Which worker.
        index: usize,
        /// The panic message.
        message: String,
    },
}
