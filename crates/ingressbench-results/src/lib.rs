//! The files of a results directory (docs/RESULTS.md) as types: what the writers (the
//! load engine, the scenario runner) write and the report reads back, one definition each.
//! A field renamed here is renamed for both; a field added after the first version of a
//! file defaults when an older file lacks it, so that results written before are read.
//!
//! Pure data: no file is opened here (the report's `files` module reads a directory from
//! elsewhere with its bounds and without following links). The two files that are not JSON,
//! the interval log ([`hlog`]) and the sampled requests ([`samples`]), have their writer
//! and reader here, over any `Write` or bytes.

pub mod capacity;
pub mod events;
pub mod hlog;
pub mod impact;
pub mod routes;
pub mod run;
pub mod samples;
pub mod site;
pub mod soak;
pub mod stream;
pub mod summary;
pub mod workers;

/// Deserializes a field leniently: a value that does not parse as its type reads as its
/// default (an optional record as absent, a figure as none), for the parts of a file that
/// a reader shows but no gate relies on, and for figures whose absence a reader's own
/// check names ([`summary::CellSummary::read`]).
pub(crate) fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned + Default,
{
    use serde::Deserialize;
    let value = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(value).unwrap_or_default())
}
