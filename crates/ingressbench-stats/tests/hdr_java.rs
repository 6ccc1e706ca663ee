//! Percentiles checked against values HdrHistogram's Java implementation computed for the
//! same data (`tests/data/hdr-java-percentiles.txt`, made by
//! `scripts/hdr-vectors/generate.sh`).

use ingressbench_stats::HistogramUs;

/// The data set the Java generator records for `(count, seed)`.
fn data(count: u64, seed: u64) -> HistogramUs {
    let mut h = HistogramUs::new();
    let mut x = seed;
    for _ in 0..count {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        h.record_us(1 + ((x >> 33) % 1000) * ((x >> 20) % 100 + 1));
    }
    h
}

#[test]
fn percentiles_match_hdrhistogram_java() {
    let text = include_str!("data/hdr-java-percentiles.txt");
    let mut checked = 0;
    let mut p999_at_multiple_of_1000 = 0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (count, seed): (u64, u64) = (f[0].parse().unwrap(), f[1].parse().unwrap());
        let (p, want): (f64, u64) = (f[2].parse().unwrap(), f[3].parse().unwrap());
        let h = data(count, seed);
        assert_eq!(h.count(), count);
        assert_eq!(
            h.value_at_percentile(p),
            want,
            "p{p} of {count} values (seed {seed})"
        );
        if p == 99.9 && count % 1000 == 0 {
            p999_at_multiple_of_1000 += 1;
        }
        checked += 1;
    }
    assert!(checked >= 60, "{checked} values checked");
    assert!(p999_at_multiple_of_1000 >= 3);
}

/// The `.hgrm` footer's sub-bucket count is the Java one: 2,048 for three digits.
#[test]
fn the_reference_footer_names_2048_sub_buckets() {
    let text = include_str!("data/hdr-java-percentiles.txt");
    assert!(text
        .lines()
        .next()
        .unwrap()
        .contains("SubBuckets     =         2048]"));
    assert_eq!(HistogramUs::new().sub_bucket_count(), 2048);
}
