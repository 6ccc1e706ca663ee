//! The open-loop schedule: when each request is due, independent of when answers come.

/// The intended send times of one worker's share of an open-loop run.
///
/// Requests are numbered globally `0, 1, 2, …` and request `j` is due at `j / rate`
/// seconds after the start. With `workers` workers, worker `k` owns the numbers
/// `k, k + workers, k + 2 * workers, …`, so together they send at exactly the target rate
/// and evenly spaced, whatever the number of threads.
#[derive(Clone, Debug)]
pub(crate) struct Schedule {
    rate_per_s: f64,
    stride: u64,
    next: u64,
    limit: Option<u64>,
    end_ns: Option<u64>,
}

impl Schedule {
    /// Worker `worker` of `workers`, at `rate_per_s` in total, stopping before request number
    /// `limit` (a count) or before `end_ns` (a time), whichever comes first.
    pub(crate) fn new(
        rate_per_s: f64,
        worker: u64,
        workers: u64,
        limit: Option<u64>,
        end_ns: Option<u64>,
    ) -> Self {
        assert!(
            rate_per_s > 0.0 && rate_per_s.is_finite(),
            "a schedule has a positive rate"
        );
        assert!(worker < workers, "worker index within the worker count");
        Self {
            rate_per_s,
            stride: workers,
            next: worker,
            limit,
            end_ns,
        }
    }

    /// When request number `j` is due, in nanoseconds from the start.
    pub(crate) fn intended_ns(rate_per_s: f64, j: u64) -> u64 {
        (j as f64 * 1e9 / rate_per_s).round() as u64
    }
}

impl Iterator for Schedule {
    /// (request number, intended time in ns)
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        let j = self.next;
        if self.limit.is_some_and(|limit| j >= limit) {
            return None;
        }
        let at = Self::intended_ns(self.rate_per_s, j);
        if self.end_ns.is_some_and(|end| at >= end) {
            return None;
        }
        self.next += self.stride;
        Some((j, at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn workers_interleave_into_one_even_schedule() {
        let mut all: Vec<(u64, u64)> = (0..3)
            .flat_map(|k| Schedule::new(1000.0, k, 3, Some(10), None))
            .collect();
        all.sort_unstable();
        let times: Vec<u64> = all.iter().map(|(_, t)| *t).collect();
        assert_eq!(times, (0..10).map(|j| j * 1_000_000).collect::<Vec<_>>());
    }

    #[test]
    fn duration_bounds_the_schedule() {
        let n = Schedule::new(1000.0, 0, 1, None, Some(1_000_000_000)).count();
        assert_eq!(n, 1000);
        let n = Schedule::new(0.5, 0, 1, None, Some(10_000_000_000)).count();
        assert_eq!(n, 5);
    }

    proptest! {
        #[test]
        fn times_increase_and_count_is_exact(rate in 0.1f64..100_000.0, workers in 1u64..8, limit in 0u64..500) {
            let mut total = 0;
            for k in 0..workers {
                let times: Vec<u64> = Schedule::new(rate, k, workers, Some(limit), None).map(|(_, t)| t).collect();
                prop_assert!(times.windows(2).all(|w| w[0] < w[1] || rate > 1e9));
                total += times.len() as u64;
            }
            prop_assert_eq!(total, limit);
        }
    }
}
