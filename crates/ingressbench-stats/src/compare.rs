//! Telling signal from noise: bootstrap confidence intervals, a rank test, and verdicts.
//!
//! The unit of resampling is what repeats independently: a whole run when there are
//! repeats, else a one-second window of one run. Intervals are percentile intervals of the
//! bootstrap distribution; a relative difference pairs the two sides' independent draws.

/// A small, fast, deterministic generator (xorshift64*), so that a report is the same every
/// time it is written from the same results.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value; 0 is remapped).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A uniform index below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// A uniform value in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// An estimate with its interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// The statistic on the data as measured.
    pub value: f64,
    /// Lower end of the interval.
    pub low: f64,
    /// Upper end of the interval.
    pub high: f64,
}

impl Estimate {
    /// Whether the interval contains `x`.
    pub fn contains(&self, x: f64) -> bool {
        self.low <= x && x <= self.high
    }
}

/// How many bootstrap draws intervals use.
pub const ITERATIONS: usize = 2000;

/// The bootstrap distribution of `stat` over `units` resampled with replacement.
pub fn bootstrap<T>(
    units: &[T],
    iterations: usize,
    rng: &mut Rng,
    mut stat: impl FnMut(&[&T]) -> f64,
) -> Vec<f64> {
    if units.is_empty() {
        return Vec::new();
    }
    let mut draw: Vec<&T> = Vec::with_capacity(units.len());
    (0..iterations)
        .map(|_| {
            draw.clear();
            draw.extend((0..units.len()).map(|_| &units[rng.below(units.len())]));
            stat(&draw)
        })
        .collect()
}

/// The central `level` interval (0.95 for 95%) of a bootstrap distribution, around `value`.
pub fn interval(value: f64, distribution: &[f64], level: f64) -> Estimate {
    let mut d: Vec<f64> = distribution
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .collect();
    if d.is_empty() {
        return Estimate {
            value,
            low: value,
            high: value,
        };
    }
    d.sort_by(f64::total_cmp);
    let tail = (1.0 - level) / 2.0;
    let at = |q: f64| d[((q * (d.len() - 1) as f64).round() as usize).min(d.len() - 1)];
    Estimate {
        value,
        low: at(tail),
        high: at(1.0 - tail),
    }
}

/// The mean of some values.
pub fn mean(values: &[&f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.iter().copied().sum::<f64>() / values.len() as f64
}

/// The mean of `values` with its 95% bootstrap interval.
pub fn mean_interval(values: &[f64], rng: &mut Rng) -> Estimate {
    let all: Vec<&f64> = values.iter().collect();
    let d = bootstrap(values, ITERATIONS, rng, mean);
    interval(mean(&all), &d, 0.95)
}

/// The relative difference `b / a - 1` of two statistics with its 95% interval, from their
/// bootstrap distributions (drawn independently, paired by draw).
pub fn relative_difference(a: f64, b: f64, a_draws: &[f64], b_draws: &[f64]) -> Estimate {
    // From zero: no change if still zero, else an unbounded rise (NaN and infinity).
    let ratio = |x: f64, y: f64| match (x == 0.0, y == 0.0) {
        (true, true) => f64::NAN,
        (true, false) => f64::INFINITY,
        _ => y / x - 1.0,
    };
    let d: Vec<f64> = a_draws
        .iter()
        .zip(b_draws)
        .map(|(x, y)| ratio(*x, *y))
        .collect();
    interval(ratio(a, b), &d, 0.95)
}

/// Two-sided p-value of the Mann-Whitney U test (normal approximation with a correction
/// for ties): whether one group's values tend to be larger than the other's, with no
/// assumption about the shape of either distribution (latencies are far from normal).
pub fn mann_whitney(a: &[f64], b: &[f64]) -> f64 {
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    if a.is_empty() || b.is_empty() {
        return 1.0;
    }
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|x| (*x, true))
        .chain(b.iter().map(|x| (*x, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len() as f64;
    let mut rank_a = 0.0;
    let mut ties = 0.0;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j + 1 < all.len() && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let rank = (i + j) as f64 / 2.0 + 1.0;
        let t = (j - i + 1) as f64;
        ties += t * t * t - t;
        rank_a += rank * all[i..=j].iter().filter(|x| x.1).count() as f64;
        i = j + 1;
    }
    let u = rank_a - n1 * (n1 + 1.0) / 2.0;
    let mu = n1 * n2 / 2.0;
    let sigma = (n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)))).sqrt();
    if sigma == 0.0 {
        return 1.0;
    }
    let z = ((u - mu).abs() - 0.5).max(0.0) / sigma;
    (2.0 * normal_tail(z)).min(1.0)
}

/// P(Z > z) for a standard normal Z (Abramowitz and Stegun 7.1.26, error below 1.5e-7).
fn normal_tail(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    0.5 * poly * (-x * x).exp()
}

/// What a comparison concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// B is lower (for latency and errors, lower is better) beyond noise.
    Better,
    /// B is higher beyond noise.
    Worse,
    /// The interval contains zero, or the change is inside the noise floor.
    NoMeasurableDifference,
}

impl Verdict {
    /// From the relative difference B/A - 1 and a noise floor (0.02 for 2%): a difference
    /// counts only when its whole interval is beyond the floor on one side.
    pub fn of(difference: &Estimate, noise_floor: f64) -> Self {
        if difference.low > noise_floor {
            Verdict::Worse
        } else if difference.high < -noise_floor {
            Verdict::Better
        } else {
            Verdict::NoMeasurableDifference
        }
    }

    /// The verdict in words, as the comparison prints it.
    pub fn words(self) -> &'static str {
        match self {
            Verdict::Better => "better",
            Verdict::Worse => "worse",
            Verdict::NoMeasurableDifference => "no measurable difference",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lognormal draw (latency-like): exp(mu + sigma * N(0, 1)).
    fn lognormal(rng: &mut Rng, mu: f64, sigma: f64) -> f64 {
        let (u1, u2) = (rng.unit().max(1e-12), rng.unit());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        (mu + sigma * z).exp()
    }

    #[test]
    fn intervals_of_a_relative_difference_cover_the_truth_near_the_nominal_rate() {
        // Two systems whose per-repeat means are lognormal; B's true mean is 10% higher.
        let (mu, sigma) = (0.0_f64, 0.3_f64);
        let true_mean = (mu + sigma * sigma / 2.0).exp();
        let truth = 0.10;
        let mut rng = Rng::new(42);
        let trials = 400;
        let mut covered = 0;
        for _ in 0..trials {
            let a: Vec<f64> = (0..20).map(|_| lognormal(&mut rng, mu, sigma)).collect();
            let b: Vec<f64> = (0..20)
                .map(|_| lognormal(&mut rng, mu, sigma) * (1.0 + truth))
                .collect();
            let da = bootstrap(&a, 1000, &mut rng, mean);
            let db = bootstrap(&b, 1000, &mut rng, mean);
            let ma = a.iter().sum::<f64>() / 20.0;
            let mb = b.iter().sum::<f64>() / 20.0;
            let d = relative_difference(ma, mb, &da, &db);
            covered += usize::from(d.contains(truth));
        }
        let rate = covered as f64 / trials as f64;
        assert!(true_mean > 0.0);
        eprintln!("coverage of the 95% interval over {trials} trials: {rate}");
        // Percentile intervals from 20 units undercover a little; 0.88-0.99 is close.
        assert!((0.88..=0.99).contains(&rate), "coverage {rate}");
    }

    #[test]
    fn mann_whitney_separates_shifted_groups_and_not_equal_ones() {
        let mut rng = Rng::new(7);
        let a: Vec<f64> = (0..50).map(|_| lognormal(&mut rng, 0.0, 0.5)).collect();
        let same: Vec<f64> = (0..50).map(|_| lognormal(&mut rng, 0.0, 0.5)).collect();
        let shifted: Vec<f64> = (0..50).map(|_| lognormal(&mut rng, 0.6, 0.5)).collect();
        assert!(mann_whitney(&a, &shifted) < 0.001);
        assert!(mann_whitney(&a, &same) > 0.05);
        assert_eq!(mann_whitney(&[1.0, 1.0], &[1.0, 1.0]), 1.0);
        // Textbook value: a = 1..5, b = 6..10 gives U = 0, p ~ 0.012 (normal, continuity).
        let p = mann_whitney(&[1.0, 2.0, 3.0, 4.0, 5.0], &[6.0, 7.0, 8.0, 9.0, 10.0]);
        assert!((p - 0.0122).abs() < 0.001, "{p}");
    }

    #[test]
    fn verdicts_need_the_whole_interval_beyond_the_floor() {
        let e = |low, high| Estimate {
            value: (low + high) / 2.0,
            low,
            high,
        };
        assert_eq!(Verdict::of(&e(0.05, 0.2), 0.02), Verdict::Worse);
        assert_eq!(Verdict::of(&e(-0.2, -0.05), 0.02), Verdict::Better);
        assert_eq!(
            Verdict::of(&e(-0.01, 0.2), 0.02),
            Verdict::NoMeasurableDifference
        );
        assert_eq!(
            Verdict::of(&e(0.01, 0.015), 0.02),
            Verdict::NoMeasurableDifference
        );
    }
}
