//! A window: what finished within one interval of a run (the latency of its answers,
//! the outcomes of every request that ended in it, how late the generator was), the unit
//! of the time series, the interval log and the figures around an event.

use serde::{Deserialize, Serialize};

use crate::{HistogramUs, OutcomeCounts};

/// What finished within one interval of the run (one second by default): the latency of
/// the requests answered in it and the outcomes of all that ended in it. Interval histograms are what the time
/// series, the interval log and the event impact figures are built from.
#[derive(Clone, Debug)]
pub struct Window {
    /// Position of the interval: it covers `[index * width, (index + 1) * width)`.
    pub index: u64,
    /// Width of the interval in nanoseconds.
    pub width_ns: u64,
    /// Latency of the requests answered (any status) in the interval.
    pub latency: HistogramUs,
    /// Their outcomes.
    pub outcomes: OutcomeCounts,
    /// How late the requests that ended in it were sent (scheduler lag), in fixed buckets:
    /// the live metrics' histogram, a few words whatever the rate.
    pub lag: LagBuckets,
    /// Requests among them that were sent again after their first connection failed.
    pub retries: u64,
    /// Requests in flight when the window was handed over (within a tenth of a second of
    /// its end), summed over the workers; 0 where nobody sampled it.
    pub in_flight: u64,
}

/// The scheduler lag's bucket bounds, in nanoseconds (upper, inclusive); past the last is
/// the overflow bucket.
pub const LAG_BOUNDS_NS: [u64; 19] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Scheduler lag counted in [`LAG_BOUNDS_NS`]'s buckets, and its sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LagBuckets {
    /// Requests per bucket (not cumulative); the last is past every bound.
    pub counts: [u64; LAG_BOUNDS_NS.len() + 1],
    /// Their lags added up, in nanoseconds.
    pub sum_ns: u64,
}

impl LagBuckets {
    /// Counts one request sent `lag_ns` late.
    #[inline]
    pub fn record_ns(&mut self, lag_ns: u64) {
        self.counts[LAG_BOUNDS_NS.partition_point(|b| *b < lag_ns)] += 1;
        self.sum_ns = self.sum_ns.saturating_add(lag_ns);
    }

    /// Adds `other`'s counts.
    pub fn merge(&mut self, other: &LagBuckets) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts) {
            *mine += theirs;
        }
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
    }

    /// Requests counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

impl Window {
    /// An empty interval.
    pub fn new(index: u64, width_ns: u64) -> Self {
        Self {
            index,
            width_ns,
            latency: HistogramUs::new(),
            outcomes: OutcomeCounts::default(),
            lag: LagBuckets::default(),
            retries: 0,
            in_flight: 0,
        }
    }

    /// Start of the interval, in nanoseconds from the start of the run.
    pub fn start_ns(&self) -> u64 {
        self.index * self.width_ns
    }

    /// End of the interval (exclusive).
    pub fn end_ns(&self) -> u64 {
        (self.index + 1) * self.width_ns
    }

    /// Adds another recorder's view of the same interval.
    pub fn merge(&mut self, other: &Window) {
        debug_assert_eq!(self.index, other.index);
        self.latency.merge(&other.latency);
        self.outcomes.merge(&other.outcomes);
        self.lag.merge(&other.lag);
        self.retries += other.retries;
        self.in_flight += other.in_flight;
    }
}
