//! HdrHistogram interval logs: one compressed histogram per interval (V2 encoding with
//! deflate, base64), readable by HdrHistogram's `HistogramLogProcessor` and the Rust
//! crate's `IntervalLogIterator`. Values are microseconds; the `Interval_Max` column is in
//! milliseconds (`MaxValueDivisor` 1000).

use std::io::{self, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
use ingressbench_stats::{HistogramUs, Outcome, OutcomeCounts};

const MAX_VALUE_DIVISOR: f64 = 1000.0;

/// The comment that follows each interval with the outcomes counted in it
/// (`#outcomes 3.000 200=498 refused=2`): log readers skip it, and a cell cut short can be
/// rebuilt, errors included, from its log alone.
const OUTCOMES: &str = "outcomes ";

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

    /// Appends the outcomes counted in the interval that starts at `start`.
    pub fn outcomes(&mut self, start: Duration, counts: &OutcomeCounts) -> io::Result<()> {
        write!(self.out, "#{OUTCOMES}{:.3}", start.as_secs_f64())?;
        for (outcome, n) in counts.iter() {
            write!(self.out, " {}={n}", outcome.name())?;
        }
        writeln!(self.out)
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
    /// How long the interval lasted.
    pub length: Duration,
    /// Its histogram (microseconds).
    pub histogram: HistogramUs,
    /// The outcomes counted in it (every request that ended in it, answered or not), when
    /// the log has them (logs of versions before 0.1.0's cut-short recovery have none).
    pub outcomes: Option<OutcomeCounts>,
}

/// What a log written as a run went holds, read leniently: a log cut off mid-line (its
/// writer killed) loses only that line.
#[derive(Debug, Default)]
pub struct Partial {
    /// The intervals.
    pub intervals: Vec<Interval>,
    /// The outcomes of the intervals that have an outcomes comment, summed.
    pub outcomes: OutcomeCounts,
    /// How many intervals had one (logs of versions before 0.1.0's cut-short recovery
    /// have none).
    pub intervals_with_outcomes: usize,
}

impl Partial {
    /// The intervals as the load engine's windows (latency and outcomes), in order; an
    /// interval without an outcomes comment has none counted.
    pub fn windows(&self) -> Vec<ingressbench_stats::Window> {
        self.intervals
            .iter()
            .map(|i| {
                let width_ns = (i.length.as_nanos() as u64).max(1);
                let mut w = ingressbench_stats::Window::new(
                    (i.start.as_nanos() as u64 + width_ns / 2) / width_ns,
                    width_ns,
                );
                w.latency = i.histogram.clone();
                if let Some(counts) = &i.outcomes {
                    w.outcomes = counts.clone();
                }
                w
            })
            .collect()
    }
}

/// A start as the log writes it (three decimals), as a key.
fn start_ms(seconds: f64) -> u64 {
    (seconds * 1000.0).round() as u64
}

/// Reads a log that may have been cut off: up to its last complete line.
pub fn read_partial(bytes: &[u8]) -> Result<Partial, String> {
    let whole = bytes
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(&bytes[..0], |end| &bytes[..=end]);
    let intervals = read(whole)?;
    let mut outcomes = OutcomeCounts::default();
    let mut intervals_with_outcomes = 0;
    for counts in intervals.iter().filter_map(|i| i.outcomes.as_ref()) {
        outcomes.merge(counts);
        intervals_with_outcomes += 1;
    }
    Ok(Partial {
        intervals,
        outcomes,
        intervals_with_outcomes,
    })
}

/// The outcomes comments of a log, by their interval's start in milliseconds.
fn outcome_comments(bytes: &[u8]) -> std::collections::BTreeMap<u64, OutcomeCounts> {
    let text = String::from_utf8_lossy(bytes);
    let mut by_start_ms = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line
            .strip_prefix('#')
            .and_then(|l| l.strip_prefix(OUTCOMES))
        else {
            continue;
        };
        let mut fields = rest.split(' ');
        let Some(start) = fields.next().and_then(|t| t.parse::<f64>().ok()) else {
            continue;
        };
        let mut counts = OutcomeCounts::default();
        for (name, n) in fields.filter_map(|f| f.split_once('=')) {
            if let (Some(outcome), Ok(n)) = (Outcome::from_name(name), n.parse::<u64>()) {
                counts.add_n(outcome, n);
            }
        }
        by_start_ms.insert(start_ms(start), counts);
    }
    by_start_ms
}

/// When the log's run started (its `StartTime`), in seconds since the Unix epoch: interval
/// starts are offsets from it.
pub fn start_unix_s(bytes: &[u8]) -> Option<f64> {
    let head = &bytes[..bytes.len().min(64 * 1024)];
    String::from_utf8_lossy(head).lines().find_map(|line| {
        line.strip_prefix("#[StartTime: ")?
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
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
                    outcomes: None,
                });
            }
            LogEntry::StartTime(_) | LogEntry::BaseTime(_) => {}
        }
    }
    let mut comments = outcome_comments(bytes);
    for i in &mut intervals {
        i.outcomes = comments.remove(&start_ms(i.start.as_secs_f64()));
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

    #[test]
    fn a_log_cut_off_mid_line_keeps_its_whole_intervals_and_their_outcomes() {
        let mut out = Vec::new();
        let mut writer = HlogWriter::new(&mut out, SystemTime::now(), "cut").unwrap();
        for i in 0..3u64 {
            let mut h = HistogramUs::new();
            let mut counts = OutcomeCounts::default();
            for v in 0..10 {
                h.record_us(100 + v);
                counts.add(Outcome::Status(200));
            }
            counts.add_n(Outcome::Refused, i + 1);
            let start = Duration::from_secs(i);
            writer.interval(start, Duration::from_secs(1), &h).unwrap();
            writer.outcomes(start, &counts).unwrap();
        }
        writer.flush().unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(
            text.contains("\n#outcomes 1.000 200=10 refused=2\n"),
            "{text}"
        );
        // Killed while writing the third interval's line: half of it is on disk.
        let third = text.find("2.000,1.000,").unwrap();
        let cut = &out[..third + 30];
        assert!(read(cut).is_err(), "a strict read refuses the torn line");
        let partial = read_partial(cut).unwrap();
        assert_eq!(partial.intervals.len(), 2);
        assert_eq!(partial.intervals_with_outcomes, 2);
        assert_eq!(partial.outcomes.get(Outcome::Status(200)), 20);
        assert_eq!(partial.outcomes.get(Outcome::Refused), 3);
        assert_eq!(partial.outcomes.total(), 23);
        // Read back as windows: each its own latency and outcomes.
        let windows = partial.windows();
        assert_eq!(windows.len(), 2);
        assert_eq!(windows[1].index, 1);
        assert_eq!(windows[1].width_ns, 1_000_000_000);
        assert_eq!(windows[1].latency.count(), 10);
        assert_eq!(windows[1].outcomes.get(Outcome::Refused), 2);
        assert_eq!(windows[0].outcomes.get(Outcome::Refused), 1);
    }
}
