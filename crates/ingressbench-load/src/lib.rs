//! The load engine of ingressbench: open-loop (constant rate, latency measured from each
//! request's intended send time, so no coordinated omission), closed-loop and sequential
//! HTTP/1.1 or HTTP/2 load over plain TCP or TLS, with curl-style phase timings per request.
//!
//! Each worker thread runs its own single-threaded runtime and owns its connections, its
//! share of the schedule and its [`Recorder`](ingressbench_stats::Recorder); the hot path
//! writes a request rendered once, parses the response as it streams through a buffer
//! shared by the worker's connections, and records into fixed-size histograms.
//!
//! ```no_run
//! use std::sync::{atomic::AtomicBool, Arc};
//! use ingressbench_load::{run, Length, Mode, NoObserver, Plan, Target};
//!
//! let mut plan = Plan::new(Target::parse("http://127.0.0.1:8080/")?);
//! plan.mode = Mode::Open { rate_per_s: 1000.0 };
//! plan.connections = 50;
//! plan.length = Length::Duration(std::time::Duration::from_secs(10));
//! let report = run(&plan, Arc::new(AtomicBool::new(false)), &mut NoObserver)?;
//! println!("p99 {} us", report.summary.latency_us.p99);
//! # Ok::<(), ingressbench_load::LoadError>(())
//! ```

mod connection;
mod dispatch;
mod error;
pub mod fleet;
pub mod grpc;
pub mod kept;
pub mod live;
mod plan;
pub mod probe;
mod report;
mod request;
mod response;
mod run;
mod schedule;
pub mod sse;
pub mod stream;
pub mod streams;
mod target;
mod timer;
mod tls;
pub mod websocket;
mod worker;

pub use error::LoadError;
pub use timer::thread_cpu;

/// Entry points for fuzz targets (`fuzz/`) and benches (`benches/`); not part of the
/// supported API.
#[doc(hidden)]
pub mod fuzzing {
    use crate::response::{Progress, ResponseParser};

    /// Walks worker `worker` of `workers`'s schedule at `rate_per_s` up to request number
    /// `limit`; returns the sum of intended times (so that nothing is optimized away).
    pub fn schedule_sum(rate_per_s: f64, worker: u64, workers: u64, limit: u64) -> u64 {
        crate::schedule::Schedule::new(rate_per_s, worker, workers, Some(limit), None)
            .map(|(_, at)| at)
            .fold(0u64, u64::wrapping_add)
    }

    /// What parsing one response made of `data`.
    #[derive(Debug, PartialEq, Eq)]
    pub enum Parsed {
        /// Complete after this many bytes, with this status.
        Done {
            /// Bytes consumed.
            consumed: usize,
            /// Status code.
            status: u16,
        },
        /// Not complete by the end of the data.
        Incomplete,
        /// Not HTTP.
        Malformed,
    }

    /// Feeds `data` to a fresh parser in pieces cut at `cuts` (offsets, any order).
    pub fn parse_response(data: &[u8], cuts: &[usize], head_request: bool) -> Parsed {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
        points.extend([0, data.len()]);
        points.sort_unstable();
        points.dedup();
        let generation = ["x-ingressbench-generation".to_owned()];
        let mut parser = ResponseParser::new("x-backend", &generation);
        parser.reset(head_request);
        for w in points.windows(2) {
            match parser.feed(&data[w[0]..w[1]]) {
                Ok(Progress::Done { consumed }) => {
                    return Parsed::Done {
                        consumed: w[0] + consumed,
                        status: parser.status(),
                    };
                }
                Ok(Progress::NeedMore) => {}
                Err(_) => return Parsed::Malformed,
            }
        }
        Parsed::Incomplete
    }
}
pub use connection::ensure_descriptors;
pub use ingressbench_stats::parse_duration;
pub use plan::{
    trial_window, BatchWindow, Kind, Length, Migrate, Mode, Plan, Protocol, RequestGate,
    RetryPolicy, Shape, Share, Warmup, DEFAULT_CONNECTIONS, DEFAULT_STREAMS, MAX_STREAMS,
};
pub use report::{LoadReport, NoObserver, Observer, Progress};
pub use request::{parse_header, RequestSpec};
pub use run::run;
pub use target::{Resolve, Scheme, Target};
pub use tls::{client_config as tls_client_config, TlsOptions};
