//! Writers and readers of what ingressbench measures: the full percentile spectrum in the
//! `.hgrm` text that wrk2 and HdrHistogram print ([`hgrm`]), a results directory read back
//! ([`results`]) and shown ([`html`], [`terminal`]). The interval log's and the samples'
//! formats are [`ingressbench_results::hlog`] and [`ingressbench_results::samples`].
//!
//! ```
//! use ingressbench_stats::HistogramUs;
//!
//! let mut h = HistogramUs::new();
//! (1..=1000).for_each(|us| h.record_us(us));
//! let mut out = Vec::new();
//! ingressbench_report::hgrm::write(&mut out, &h).unwrap();
//! let rows = ingressbench_report::hgrm::parse(std::str::from_utf8(&out).unwrap()).unwrap();
//! assert_eq!(rows.last().unwrap().total_count, 1000);
//! ```

pub mod analysis;
pub mod capacity;
pub mod compare;
pub mod counted;
pub mod files;
pub mod headline;
pub mod hgrm;
pub mod html;
mod kernel;
pub mod openmetrics;
mod protocols;
pub mod results;
mod routes;
mod soak;
pub mod svg;
pub mod terminal;
mod topology;
pub mod websocket;
