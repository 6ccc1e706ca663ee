//! The lab's error type.

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
}
