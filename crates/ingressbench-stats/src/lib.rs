//! Statistics for ingressbench: what one request looked like ([`Sample`]), what became
//! of it ([`Outcome`]), and how many of them are summarised without keeping them
//! ([`Recorder`], [`HistogramUs`], [`Window`], [`Summary`]).
//!
//! This crate is pure: it knows nothing of sockets, files or clocks. Times arrive as
//! nanosecond offsets from the start of a run and are recorded in whole microseconds.
//!
//! ```
//! use ingressbench_stats::{Outcome, Recorder, Sample};
//!
//! let mut recorder = Recorder::new(1_000_000_000);
//! let mut sample = Sample::new(0);
//! sample.sent_at_ns = 0;
//! sample.done_at_ns = 2_500_000; // 2.5 ms
//! sample.outcome = Outcome::Status(200);
//! recorder.record(&sample);
//! assert_eq!(recorder.latency().count(), 1);
//! // 2.5 ms, at the histogram's resolution of three significant digits
//! assert!((2_500..=2_503).contains(&recorder.latency().value_at_percentile(50.0)));
//! ```

pub mod compare;
mod connections;
mod duration;
pub mod growth;
mod histogram;
mod outcome;
mod recorder;
mod sample;
mod summary;
mod window;
pub mod wire;

pub use connections::{
    ConnectionEvents, Goaway, IdleEnd, QuicEvent, MAX_GOAWAYS_KEPT, MAX_QUIC_EVENTS_KEPT,
};
pub use duration::{number_and_unit, parse_duration};
pub use histogram::{HistogramUs, MAX_TRACKABLE_US};
pub use outcome::{Outcome, OutcomeCounts, FAILURE_KINDS};
pub use recorder::{BackendStats, GenerationSeen, PhaseHistograms, Recorder};
pub use sample::{BackendId, Phases, Sample, GENERATION_SLOTS};
pub use summary::{
    BatchWindowSummary, GenerationSummary, LoadMode, Percentiles, PhaseSummary, RateSummary,
    RequestSummary, RetrySummary, Summary, SummaryContext, LAG_FLOOR_US, LAG_SHARE_WARNING,
    LAG_WARNING_US,
};
pub use window::{LagBuckets, Window, LAG_BOUNDS_NS};
