//! The load engine of ingressbench: open-loop (constant rate, latency measured from each
//! request's intended send time, so no coordinated omission), closed-loop and sequential
//! HTTP/1.1 load over plain TCP or TLS, with curl-style phase timings per request.
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
mod plan;
mod request;
mod response;
mod run;
mod schedule;
mod target;
mod timer;
mod tls;
mod worker;

pub use error::LoadError;
pub use plan::{parse_duration, Length, Mode, Plan, Warmup, DEFAULT_BATCH_WINDOW};
pub use request::{parse_header, RequestSpec};
pub use run::{run, LoadReport, NoObserver, Observer, Progress};
pub use target::{Resolve, Scheme, Target};
pub use tls::TlsOptions;
