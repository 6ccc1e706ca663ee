//! The percentile spectrum in HdrHistogram's classic percentile-distribution layout: what
//! the Java implementation's `outputPercentileDistribution` writes and what HdrHistogram_c's
//! `hdr_percentiles_print` (the one `wrk2 --latency` calls) prints, with values in
//! milliseconds, so that existing plotters (HdrHistogram's plotFiles.html, hdr-plot) read it.

use std::io::{self, Write};

use ingressbench_stats::HistogramUs;

/// Percentile ticks per half distance, as HdrHistogram's default.
const TICKS_PER_HALF_DISTANCE: u32 = 5;
/// Values are recorded in microseconds and printed in milliseconds.
const US_PER_MS: f64 = 1000.0;

/// One row of the spectrum.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Latency in milliseconds.
    pub value_ms: f64,
    /// Percentile as a fraction (0.99 is p99).
    pub percentile: f64,
    /// Values at or below `value_ms`.
    pub total_count: u64,
}

/// Writes the spectrum of `h`.
pub fn write(out: &mut impl Write, h: &HistogramUs) -> io::Result<()> {
    writeln!(
        out,
        "{:>12} {:>14} {:>10} {:>14}\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    )?;
    let hdr = h.as_hdr();
    if !h.is_empty() {
        let mut total = 0u64;
        for v in hdr.iter_quantiles(TICKS_PER_HALF_DISTANCE) {
            total += v.count_since_last_iteration();
            let value_ms = hdr.highest_equivalent(v.value_iterated_to()) as f64 / US_PER_MS;
            let q = v.quantile_iterated_to();
            if q < 1.0 {
                writeln!(
                    out,
                    "{value_ms:12.3} {q:2.12} {total:10} {:14.2}",
                    1.0 / (1.0 - q)
                )?;
            } else {
                writeln!(out, "{value_ms:12.3} {q:2.12} {:10}", hdr.len())?;
            }
        }
    }
    writeln!(
        out,
        "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]",
        h.mean() / US_PER_MS,
        h.stdev() / US_PER_MS
    )?;
    writeln!(
        out,
        "#[Max     = {:12.3}, Total count    = {:12}]",
        h.max() as f64 / US_PER_MS,
        h.count()
    )?;
    writeln!(
        out,
        "#[Buckets = {:12}, SubBuckets     = {:12}]",
        hdr.buckets(),
        h.sub_bucket_count()
    )?;
    Ok(())
}

/// Reads the rows back from `.hgrm` text (header and footer lines are skipped).
pub fn parse(text: &str) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("Value") {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let bad = || {
            format!(
                "line {}: expected `value percentile total_count [1/(1-p)]`, got `{line}`",
                i + 1
            )
        };
        if fields.len() < 3 {
            return Err(bad());
        }
        rows.push(Row {
            value_ms: fields[0].parse().map_err(|_| bad())?,
            percentile: fields[1].parse().map_err(|_| bad())?,
            total_count: fields[2].parse().map_err(|_| bad())?,
        });
    }
    Ok(rows)
}

/// The value at percentile `p` (0 to 100) from parsed rows: the first row at or past it.
pub fn value_at(rows: &[Row], p: f64) -> Option<f64> {
    rows.iter()
        .find(|r| r.percentile * 100.0 >= p - 1e-9)
        .map(|r| r.value_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_back_into_the_same_percentiles() {
        let mut h = HistogramUs::new();
        let mut x: u64 = 12345;
        for _ in 0..100_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            h.record_us(100 + (x >> 33) % 50_000);
        }
        let mut out = Vec::new();
        write(&mut out, &h).unwrap();
        let text = String::from_utf8(out).unwrap();
        let rows = parse(&text).unwrap();
        assert!(rows.len() > 50);
        for p in [50.0, 90.0, 99.0, 99.9] {
            let want = h.value_at_percentile(p) as f64 / 1000.0;
            let got = value_at(&rows, p).unwrap();
            assert!(
                (got - want).abs() <= want * 0.001 + 0.001,
                "p{p}: {got} vs {want}"
            );
        }
        assert_eq!(rows.last().unwrap().total_count, 100_000);
        assert!(rows
            .windows(2)
            .all(|w| w[0].percentile <= w[1].percentile && w[0].total_count <= w[1].total_count));
        assert!(text.contains("#[Max     ="));
        assert!(text.contains("Total count    =       100000]"));
        // HdrHistogram's own footer for these bounds (its Java implementation's output).
        assert!(text.contains("#[Buckets =           22, SubBuckets     =         2048]"));
    }

    #[test]
    fn empty_histogram_has_header_and_footer_only() {
        let mut out = Vec::new();
        write(&mut out, &HistogramUs::new()).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(parse(&text).unwrap().is_empty());
        assert!(text.contains("Total count"));
    }
}
