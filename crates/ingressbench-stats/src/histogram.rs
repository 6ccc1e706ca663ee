//! A latency histogram in whole microseconds, on top of HdrHistogram.

use hdrhistogram::Histogram;

/// The highest latency a histogram tracks: one hour, in microseconds. Longer values are
/// clamped to it (and a request that long has timed out long before).
pub const MAX_TRACKABLE_US: u64 = 3_600_000_000;

/// Three significant digits: 0.1% value resolution, as wrk2 and HdrHistogram's defaults.
const SIGNIFICANT_DIGITS: u8 = 3;

/// A histogram of durations in whole microseconds, from 0 to [`MAX_TRACKABLE_US`] with
/// three significant digits.
#[derive(Clone)]
pub struct HistogramUs {
    inner: Histogram<u64>,
}

/// Its count and a few percentiles, not its thousands of buckets.
impl std::fmt::Debug for HistogramUs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("HistogramUs");
        d.field("count", &self.count());
        if !self.is_empty() {
            d.field("min_us", &self.min())
                .field("p50_us", &self.value_at_percentile(50.0))
                .field("p99_us", &self.value_at_percentile(99.0))
                .field("max_us", &self.max());
        }
        d.finish()
    }
}

impl Default for HistogramUs {
    fn default() -> Self {
        Self::new()
    }
}

impl HistogramUs {
    /// An empty histogram.
    pub fn new() -> Self {
        let inner = Histogram::new_with_bounds(1, MAX_TRACKABLE_US, SIGNIFICANT_DIGITS)
            .expect("constant bounds are valid");
        Self { inner }
    }

    /// Records a duration given in nanoseconds (truncated to whole microseconds).
    #[inline]
    pub fn record_ns(&mut self, ns: u64) {
        self.record_us(ns / 1_000);
    }

    /// Records a duration in microseconds; values past [`MAX_TRACKABLE_US`] are clamped.
    #[inline]
    pub fn record_us(&mut self, us: u64) {
        self.inner.saturating_record(us.min(MAX_TRACKABLE_US));
    }

    /// Records `count` occurrences of one value in microseconds.
    pub fn record_us_n(&mut self, us: u64, count: u64) {
        // Cannot fail: the value is clamped into range and counts saturate.
        let _ = self.inner.record_n(us.min(MAX_TRACKABLE_US), count);
    }

    /// How many values were recorded.
    pub fn count(&self) -> u64 {
        self.inner.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// The value at a percentile (0 to 100), in microseconds; 0 when empty.
    ///
    /// Ranked as HdrHistogram's Java implementation ranks it: one ulp is taken off the
    /// percentile before the count at it is rounded up, so that p99.9 of 1,000 values is
    /// the 999th, not the 1,000th (the `hdrhistogram` crate's own method multiplies
    /// `0.999000…01` by the count and lands one rank high whenever the count is a
    /// multiple of 1,000).
    pub fn value_at_percentile(&self, percentile: f64) -> u64 {
        if self.is_empty() {
            return 0;
        }
        let requested = next_down(percentile).clamp(0.0, 100.0);
        let count_at = ((requested * self.count() as f64) / 100.0).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for v in self.inner.iter_recorded() {
            seen += v.count_at_value();
            if seen >= count_at {
                let value = v.value_iterated_to();
                return if percentile == 0.0 {
                    self.inner.lowest_equivalent(value)
                } else {
                    self.inner.highest_equivalent(value)
                };
            }
        }
        self.max()
    }

    /// The mean in microseconds; 0 when empty.
    pub fn mean(&self) -> f64 {
        self.inner.mean()
    }

    /// The standard deviation in microseconds; 0 when empty.
    pub fn stdev(&self) -> f64 {
        self.inner.stdev()
    }

    /// The largest value recorded (at histogram resolution), in microseconds.
    pub fn max(&self) -> u64 {
        if self.is_empty() {
            0
        } else {
            self.inner.max()
        }
    }

    /// The smallest value recorded (at histogram resolution), in microseconds.
    pub fn min(&self) -> u64 {
        if self.is_empty() {
            0
        } else {
            self.inner.min()
        }
    }

    /// Sub-buckets per bucket, as HdrHistogram's Java and C implementations count them (the
    /// smallest power of two that holds 2 x 10^digits): what `.hgrm` footers print.
    pub fn sub_bucket_count(&self) -> u64 {
        let single_unit = 2.0 * 10f64.powi(i32::from(self.inner.sigfig()));
        1u64 << single_unit.log2().ceil() as u32
    }

    /// The latency buckets of the Prometheus histograms (live and exported), upper
    /// bounds in seconds: 10 us × 2^(k/4) up to 100 s, so that a quantile read from them is
    /// within 19% (one bucket) of the histogram's at sub-millisecond latencies.
    pub fn prometheus_bounds_s() -> Vec<f64> {
        (0..=93)
            .map(|k| 10e-6 * 2f64.powf(f64::from(k) / 4.0))
            .collect()
    }

    /// The values cut into `bounds` (ascending, seconds; a value goes to the first bound
    /// at or over it): counts per bucket, not cumulative, with one more for the values past
    /// the last bound; and the values' sum in seconds.
    pub fn cut_s(&self, bounds: &[f64]) -> (Vec<u64>, f64) {
        let mut counts = vec![0; bounds.len() + 1];
        let mut sum = 0.0;
        for v in self.inner.iter_recorded() {
            let seconds = v.value_iterated_to() as f64 / 1e6;
            let n = v.count_at_value();
            sum += seconds * n as f64;
            counts[bounds.partition_point(|b| *b < seconds)] += n;
        }
        (counts, sum)
    }

    /// Adds every value of `other` to this histogram. Lossless: merging histograms of parts
    /// gives the histogram of the whole.
    pub fn merge(&mut self, other: &HistogramUs) {
        self.inner
            .add(&other.inner)
            .expect("histograms of equal bounds always merge");
    }

    /// Forgets every value.
    pub fn reset(&mut self) {
        self.inner.reset();
    }

    /// The HdrHistogram underneath, for serializers (hgrm, interval logs).
    pub fn as_hdr(&self) -> &Histogram<u64> {
        &self.inner
    }

    /// Wraps an HdrHistogram read back from a serialized form.
    pub fn from_hdr(inner: Histogram<u64>) -> Self {
        Self { inner }
    }
}

/// The largest f64 below `x` (Java's `Math.nextAfter(x, -inf)`) for the finite,
/// non-negative percentiles this is given.
fn next_down(x: f64) -> f64 {
    if x > 0.0 && x.is_finite() {
        f64::from_bits(x.to_bits() - 1)
    } else {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn percentiles_of_a_uniform_spread() {
        let mut h = HistogramUs::new();
        for us in 1..=10_000 {
            h.record_us(us);
        }
        assert_eq!(h.count(), 10_000);
        let p50 = h.value_at_percentile(50.0) as f64;
        let p99 = h.value_at_percentile(99.0) as f64;
        assert!((p50 - 5_000.0).abs() / 5_000.0 < 0.002, "p50 {p50}");
        assert!((p99 - 9_900.0).abs() / 9_900.0 < 0.002, "p99 {p99}");
        assert!((h.mean() - 5_000.5).abs() < 10.0);
    }

    #[test]
    fn p999_of_a_thousand_values_is_the_999th() {
        let mut h = HistogramUs::new();
        for us in 1..=1_000 {
            h.record_us(us);
        }
        assert_eq!(h.value_at_percentile(99.9), 999);
        assert_eq!(h.value_at_percentile(100.0), 1_000);
        assert_eq!(h.value_at_percentile(0.0), 1);
        // The crate's own rank lands one high here: the reason for ranking ourselves.
        assert_eq!(h.as_hdr().value_at_percentile(99.9), 1_000);
    }

    #[test]
    fn huge_values_are_clamped_not_lost() {
        let mut h = HistogramUs::new();
        h.record_us(u64::MAX);
        assert_eq!(h.count(), 1);
        assert!(h.max() >= MAX_TRACKABLE_US);
    }

    #[test]
    fn empty_histogram_reports_zeroes() {
        let h = HistogramUs::new();
        assert_eq!(h.value_at_percentile(99.0), 0);
        assert_eq!(h.max(), 0);
        assert_eq!(h.min(), 0);
    }

    proptest! {
        #[test]
        fn merge_equals_recording_everything_in_one(
            a in proptest::collection::vec(0u64..5_000_000, 0..200),
            b in proptest::collection::vec(0u64..5_000_000, 0..200),
        ) {
            let mut ha = HistogramUs::new();
            let mut hb = HistogramUs::new();
            let mut all = HistogramUs::new();
            for &v in &a { ha.record_us(v); all.record_us(v); }
            for &v in &b { hb.record_us(v); all.record_us(v); }
            ha.merge(&hb);
            prop_assert_eq!(ha.count(), all.count());
            for p in [0.0, 50.0, 90.0, 99.0, 99.9, 100.0] {
                prop_assert_eq!(ha.value_at_percentile(p), all.value_at_percentile(p));
            }
            prop_assert_eq!(ha.max(), all.max());
        }
    }
}
