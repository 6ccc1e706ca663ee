//! HdrHistogram interval logs: one compressed histogram per interval (V2 encoding with
//! deflate, base64), readable by HdrHistogram's `HistogramLogProcessor` and the Rust
//! crate's `IntervalLogIterator`. Values are microseconds; the `Interval_Max` column is in
//! milliseconds (`MaxValueDivisor` 1000).

use std::io::{self, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
use ingressbench_stats::HistogramUs;

const MAX_VALUE_DIVISOR: f64 = 1000.0;

/// Writes an interval log as intervals arrive.
pub struct HlogWriter<W: Write> {
    out: W,
    serializer: V2DeflateSerializer,
    buffer: Vec<u8>,
}

impl<W: Write> HlogWriter<W> {
    /// Starts a log for a run that started at `start` (wall clock), writing the header.
    pub fn new(mut out: W, start: SystemTime, comment: &str) -> io::Result<Self> {
        let secs = start
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        for line in comment.lines() {
            writeln!(out, "#{line}")?;
        }
        writeln!(out, "#[StartTime: {secs:.3} (seconds since epoch)]")?;
        writeln!(out, "#[BaseTime: {secs:.3} (seconds since epoch)]")?;
        writeln!(out, "#[MaxValueDivisor: {MAX_VALUE_DIVISOR:.3}]")?;
        writeln!(out, "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"")?;
        Ok(Self {
            out,
            serializer: V2DeflateSerializer::new(),
            buffer: Vec::new(),
        })
    }

    /// Appends one interval: `start` after the run's start, `length` long.
    pub fn interval(
        &mut self,
        start: Duration,
        length: Duration,
        h: &HistogramUs,
    ) -> io::Result<()> {
        self.buffer.clear();
        self.serializer
            .serialize(h.as_hdr(), &mut self.buffer)
            .map_err(|e| io::Error::other(format!("histogram serialization failed: {e:?}")))?;
        let encoded = base64::engine::general_purpose::STANDARD.encode(&self.buffer);
        writeln!(
            self.out,
            "{:.3},{:.3},{:.3},{encoded}",
            start.as_secs_f64(),
            length.as_secs_f64(),
            h.max() as f64 / MAX_VALUE_DIVISOR
        )
    }

    /// Appends a comment line (`#...`), which log readers skip.
    pub fn comment(&mut self, text: &str) -> io::Result<()> {
        for line in text.lines() {
            writeln!(self.out, "#{line}")?;
        }
        Ok(())
    }

    /// Flushes what was written.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// One interval read back from a log.
#[derive(Clone, Debug)]
pub struct Interval {
    /// Start, from the log's base time.
    pub start: Duration,
    /// Length.
    pub length: Duration,
    /// Its histogram (microseconds).
    pub histogram: HistogramUs,
}

/// Reads every interval of a log.
pub fn read(bytes: &[u8]) -> Result<Vec<Interval>, String> {
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    let mut deserializer = hdrhistogram::serialization::Deserializer::new();
    let mut intervals = Vec::new();
    for entry in IntervalLogIterator::new(bytes) {
        match entry.map_err(|e| format!("not an interval log: {e:?}"))? {
            LogEntry::Interval(i) => {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(i.encoded_histogram())
                    .map_err(|e| {
                        format!("bad base64 in interval at {:?}: {e}", i.start_timestamp())
                    })?;
                let h: hdrhistogram::Histogram<u64> =
                    deserializer.deserialize(&mut &raw[..]).map_err(|e| {
                        format!(
                            "bad histogram in interval at {:?}: {e:?}",
                            i.start_timestamp()
                        )
                    })?;
                intervals.push(Interval {
                    start: i.start_timestamp(),
                    length: i.duration(),
                    histogram: HistogramUs::from_hdr(h),
                });
            }
            LogEntry::StartTime(_) | LogEntry::BaseTime(_) => {}
        }
    }
    Ok(intervals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_round_trip_losslessly() {
        let mut out = Vec::new();
        let mut writer = HlogWriter::new(
            &mut out,
            SystemTime::now(),
            "ingressbench test\nsecond line",
        )
        .unwrap();
        let mut expected = Vec::new();
        for i in 0..5u64 {
            let mut h = HistogramUs::new();
            for v in 0..(100 * (i + 1)) {
                h.record_us(50 + v * 7 * (i + 1));
            }
            writer
                .interval(Duration::from_secs(i), Duration::from_secs(1), &h)
                .unwrap();
            expected.push(h);
        }
        writer
            .comment("WARNING: a comment after the intervals")
            .unwrap();
        writer.flush().unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(text.starts_with("#ingressbench test\n#second line\n#[StartTime: "));
        let intervals = read(&out).unwrap();
        assert_eq!(intervals.len(), 5);
        for (i, (got, want)) in intervals.iter().zip(&expected).enumerate() {
            assert_eq!(got.start, Duration::from_secs(i as u64));
            assert_eq!(got.histogram.count(), want.count());
            assert_eq!(
                got.histogram.value_at_percentile(99.0),
                want.value_at_percentile(99.0)
            );
            assert_eq!(got.histogram.max(), want.max());
        }
    }
}
