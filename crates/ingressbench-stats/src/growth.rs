//! Whether a figure grows over a run, and how fast: the least-squares slope of a series
//! (a proxy's resident memory each second against time, or against the reloads done so
//! far) with a 95% interval that allows for readings that are not independent (issue
//! 52's verdicts).
//!
//! Memory held now is mostly held a second later, so consecutive residuals from the line
//! are correlated, and the textbook interval, which takes them for independent, is far
//! too narrow: a flat series that wanders would read as growth. The interval here is the
//! one climate-trend work uses for the same problem (Santer et al., 2000): the residuals'
//! lag-1 autocorrelation `r` shrinks the number of independent readings to
//! `n (1 - r) / (1 + r)`, which widens the slope's standard error and sets the Student t
//! quantile's degrees of freedom. "No measurable growth" is an interval that holds zero;
//! a single first-versus-last difference is never the verdict.
//!
//! A moving-block bootstrap was tried first: with blocks of the cube root of the length
//! (5 for two minutes of readings) it called a flat series whose noise keeps 90% of
//! itself each second a shrinkage, its blocks too short for that memory.

use crate::compare::Estimate;

/// Fewer points than this give no slope: a line through a handful of readings says
/// nothing of a trend.
pub const MIN_POINTS: usize = 10;

/// The least-squares line through `points`: slope, intercept, and the spread of `x`
/// (the sum of squared deviations from its mean, 0 when it does not vary).
fn line(points: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let (sx, sy) = (points.iter()).fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (x, y) in points {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
    }
    (sxx > 0.0).then(|| {
        let slope = sxy / sxx;
        (slope, my - slope * mx, sxx)
    })
}

/// The slope of `points` (in y per unit of x, the points in order of x) with its 95%
/// interval, allowing for residuals correlated from one point to the next; `None` with
/// fewer than [`MIN_POINTS`] points or an `x` that does not vary.
pub fn growth(points: &[(f64, f64)]) -> Option<Estimate> {
    if points.len() < MIN_POINTS {
        return None;
    }
    let (slope, intercept, sxx) = line(points)?;
    let residuals: Vec<f64> = (points.iter())
        .map(|(x, y)| y - (intercept + slope * x))
        .collect();
    let squares: f64 = residuals.iter().map(|e| e * e).sum();
    let n = points.len() as f64;
    if squares == 0.0 {
        // On the line exactly: nothing to be unsure of.
        return Some(Estimate {
            value: slope,
            low: slope,
            high: slope,
        });
    }
    let lagged: f64 = residuals.windows(2).map(|w| w[0] * w[1]).sum();
    // A negative correlation would narrow the interval below the independent one's; it
    // is taken as none.
    let r = (lagged / squares).clamp(0.0, 0.99);
    let effective = (n * (1.0 - r) / (1.0 + r)).max(3.0);
    let spread = squares / (n - 2.0);
    let se = (spread / sxx * (n - 2.0) / (effective - 2.0)).sqrt();
    let half = t_975(effective - 2.0) * se;
    Some(Estimate {
        value: slope,
        low: slope - half,
        high: slope + half,
    })
}

/// Student's t distribution's 97.5th percentile with `df` degrees of freedom (at least
/// 1): the Cornish-Fisher expansion from the normal's 1.96, within 1% of the tables from
/// 3 degrees of freedom, and from the tables below that.
fn t_975(df: f64) -> f64 {
    if df < 3.0 {
        return if df < 2.0 { 12.706 } else { 4.303 };
    }
    let z: f64 = 1.959_964;
    z + (z.powi(3) + z) / (4.0 * df)
        + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * df * df)
        + (3.0 * z.powi(7) + 19.0 * z.powi(5) + 17.0 * z.powi(3) - 15.0 * z) / (384.0 * df.powi(3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::Rng;

    /// `n` readings a second of `base + rate * t` with noise of amplitude `noise` that
    /// wanders (each reading keeps 90% of the last one's), as memory readings do.
    fn series(n: usize, rate: f64, noise: f64, seed: u64) -> Vec<(f64, f64)> {
        let mut rng = Rng::new(seed);
        let mut wander = 0.0;
        (0..n)
            .map(|i| {
                wander = 0.9 * wander + noise * (rng.unit() - 0.5);
                let t = i as f64;
                (t, 50e6 + rate * t + wander)
            })
            .collect()
    }

    #[test]
    fn a_steady_leak_is_found_within_its_interval_and_within_10_percent() {
        // 1 KiB a second over an hour, under noise of 256 KiB that wanders.
        for seed in 1..=5 {
            let leak = growth(&series(3600, 1024.0, 262_144.0, seed)).unwrap();
            assert!(leak.contains(1024.0), "{leak:?}");
            assert!(leak.low > 0.0, "measurable: {leak:?}");
            assert!((leak.value - 1024.0).abs() < 102.4, "within 10%: {leak:?}");
        }
    }

    #[test]
    fn a_flat_series_that_wanders_holds_zero_as_often_as_its_interval_says() {
        // Two minutes of readings whose noise keeps 90% of itself each second: the
        // textbook interval, taking them for independent, leaves zero out most of the
        // time; this one about 5% of the time.
        let holds = (1..=40)
            .filter(|seed| growth(&series(120, 0.0, 1e6, *seed)).unwrap().contains(0.0))
            .count();
        eprintln!("{holds} of 40 flat series' intervals held zero");
        assert!(holds >= 34, "{holds} of 40 held zero");
    }

    #[test]
    fn the_t_quantile_is_the_tables() {
        for (df, table) in [
            (3.0, 3.182),
            (5.0, 2.571),
            (10.0, 2.228),
            (30.0, 2.042),
            (1000.0, 1.962),
        ] {
            assert!(
                (t_975(df) - table).abs() / table < 0.01,
                "{df}: {}",
                t_975(df)
            );
        }
    }

    #[test]
    fn too_few_points_or_no_spread_give_no_verdict_and_a_line_is_exact() {
        assert_eq!(growth(&series(MIN_POINTS - 1, 5.0, 0.0, 1)), None);
        let same_x: Vec<(f64, f64)> = (0..20).map(|i| (1.0, i as f64)).collect();
        assert_eq!(growth(&same_x), None);
        assert_eq!(line(&[(0.0, 1.0), (2.0, 5.0)]), Some((2.0, 1.0, 2.0)));
        let exact: Vec<(f64, f64)> = (0..20).map(|i| (i as f64, 3.0 * i as f64)).collect();
        let g = growth(&exact).unwrap();
        assert_eq!((g.value, g.low, g.high), (3.0, 3.0, 3.0));
    }
}
