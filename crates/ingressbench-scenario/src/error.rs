//! The scenario crate's error type.

use std::path::PathBuf;

/// Why a scenario file cannot be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The file is not a valid scenario: where, and what would be valid.
    #[error("{}{}: {message}", path.display(), location.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Line and column, when known.
        location: Option<(usize, usize)>,
        /// The field and what is wrong with it.
        message: String,
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
