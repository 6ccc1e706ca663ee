//! Which sampled requests a long run keeps (a soak's, hours at thousands a second): every
//! one in the windows around its events, as a short run keeps them all, and a uniform
//! reservoir of a fixed size from the rest, rewritten to a file of its own now and then so
//! that a run that is killed keeps it. The interval log still holds every request.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flate2::write::GzEncoder;
use ingressbench_results::samples::SampleWriter;
use ingressbench_stats::Sample;

/// Which samples go to the samples file, and the reservoir that takes the others.
pub struct Kept {
    /// Times (nanoseconds from the load's start, as samples carry them) whose samples are
    /// all kept, sorted and apart.
    windows: Vec<(u64, u64)>,
    /// What the run's other threads see of it.
    shared: Arc<Shared>,
    reservoir: Reservoir,
    path: PathBuf,
    every: Duration,
    written: Instant,
}

/// A [`Kept`] as the run's other threads see it, while the load thread holds it.
#[derive(Clone, Debug)]
pub struct KeptHandle(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    /// Samples due before this (nanoseconds from the load's start) are kept, set while a
    /// run goes (an event fired later than planned, behind a slow one).
    until_ns: AtomicU64,
    seen: AtomicU64,
    kept: AtomicU64,
}

impl KeptHandle {
    /// Keeps every sample due before `ns` (from the load's start) from now on, as well as
    /// those in the windows: a window that was not planned.
    pub fn keep_until(&self, ns: u64) {
        self.0.until_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// What the filter has seen and kept outside its windows so far.
    pub fn counts(&self) -> KeptCounts {
        KeptCounts {
            seen: self.0.seen.load(Ordering::Relaxed),
            kept: self.0.kept.load(Ordering::Relaxed),
        }
    }
}

/// What a [`Kept`] has seen and kept of the samples outside its windows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeptCounts {
    /// Samples outside the windows.
    pub seen: u64,
    /// Of them, those in the reservoir.
    pub kept: u64,
}

impl Kept {
    /// Keeps the samples within `windows` (from, to: nanoseconds from the load's start, in
    /// any order, overlapping or not) and `size` of the others in a reservoir written to
    /// `path` (gzip-compressed CSV) every `every` and at the end.
    pub fn new(windows: Vec<(u64, u64)>, size: usize, path: &Path, every: Duration) -> Self {
        Self {
            windows: merged(windows),
            shared: Arc::new(Shared::default()),
            reservoir: Reservoir::new(size),
            path: path.to_owned(),
            every,
            written: Instant::now(),
        }
    }

    /// What the run's other threads hold of it.
    pub fn handle(&self) -> KeptHandle {
        KeptHandle(self.shared.clone())
    }

    /// Whether a sample (by when it was due) goes to the samples file.
    fn keeps(&self, sample: &Sample) -> bool {
        let at = sample.intended_at_ns;
        if at < self.shared.until_ns.load(Ordering::Relaxed) {
            return true;
        }
        let i = self.windows.partition_point(|&(_, to)| to < at);
        self.windows.get(i).is_some_and(|&(from, _)| from <= at)
    }

    /// The samples of `samples` to write now; the others are offered to the reservoir,
    /// which is written out if it is due.
    pub fn split(
        &mut self,
        samples: &[Sample],
        backends: &[String],
    ) -> (Vec<Sample>, io::Result<()>) {
        let mut now = Vec::new();
        for s in samples {
            if self.keeps(s) {
                now.push(*s);
            } else {
                self.reservoir.offer(*s);
            }
        }
        let counts = self.counts();
        self.shared.seen.store(counts.seen, Ordering::Relaxed);
        self.shared.kept.store(counts.kept, Ordering::Relaxed);
        let written = if self.written.elapsed() >= self.every {
            self.write(backends)
        } else {
            Ok(())
        };
        (now, written)
    }

    /// Writes the reservoir as it is (to a file beside it, then renamed over it).
    pub(crate) fn write(&mut self, backends: &[String]) -> io::Result<()> {
        self.written = Instant::now();
        let part = self.path.with_extension("part");
        let file = BufWriter::new(crate::streams::create(&part)?);
        let mut w = SampleWriter::new(GzEncoder::new(file, flate2::Compression::fast()))?;
        let mut held = self.reservoir.held.clone();
        held.sort_by_key(|s| s.intended_at_ns);
        w.write(&held, backends)?;
        w.into_inner().finish()?.flush()?;
        std::fs::rename(&part, &self.path)
    }

    /// What it has seen and kept outside its windows.
    pub fn counts(&self) -> KeptCounts {
        KeptCounts {
            seen: self.reservoir.seen,
            kept: self.reservoir.held.len() as u64,
        }
    }
}

/// The windows sorted, those that touch or overlap made one.
fn merged(mut windows: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    windows.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(windows.len());
    for (from, to) in windows {
        match out.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => out.push((from, to)),
        }
    }
    out
}

/// A uniform sample of fixed size from a stream of unknown length (Vitter's algorithm R).
struct Reservoir {
    held: Vec<Sample>,
    size: usize,
    seen: u64,
    state: u64,
}

impl Reservoir {
    fn new(size: usize) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9, |d| d.as_nanos() as u64);
        Self {
            held: Vec::with_capacity(size.min(1 << 20)),
            size,
            seen: 0,
            state: seed,
        }
    }

    fn offer(&mut self, sample: Sample) {
        self.seen += 1;
        if self.held.len() < self.size {
            self.held.push(sample);
            return;
        }
        // The n-th offered replaces a held one with probability size/n.
        let pick = self.next() % self.seen;
        if let Some(slot) = self.held.get_mut(pick as usize) {
            *slot = sample;
        }
    }

    /// splitmix64.
    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> Sample {
        Sample::new(s * 1_000_000_000)
    }

    #[test]
    fn samples_in_a_window_are_kept_and_the_rest_reach_the_reservoir() {
        let dir = std::env::temp_dir().join(format!("ib-kept-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rest.csv.gz");
        // Two overlapping windows make one, 10-25 s; a third at 40-45 s.
        let s = 1_000_000_000;
        let mut kept = Kept::new(
            vec![(40 * s, 45 * s), (10 * s, 20 * s), (15 * s, 25 * s)],
            5,
            &path,
            Duration::from_secs(3600),
        );
        let all: Vec<Sample> = (0..60).map(at).collect();
        let (now, written) = kept.split(&all, &[]);
        written.unwrap();
        let times: Vec<u64> = now
            .iter()
            .map(|s| s.intended_at_ns / 1_000_000_000)
            .collect();
        let expected: Vec<u64> = (10..=25).chain(40..=45).collect();
        assert_eq!(times, expected);
        assert_eq!(kept.counts(), KeptCounts { seen: 38, kept: 5 });
        assert_eq!(kept.handle().counts(), kept.counts());
        // Set while running: everything due before 55 s is kept from then on.
        kept.handle().keep_until(55 * s);
        let (now, _) = kept.split(&[at(50), at(56)], &[]);
        assert_eq!(now, [at(50)]);
        kept.write(&[]).unwrap();
        let text = {
            use std::io::Read;
            let mut out = String::new();
            flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap())
                .read_to_string(&mut out)
                .unwrap();
            out
        };
        assert_eq!(text.lines().count(), 1 + 5, "{text}");
        assert!(!path.with_extension("part").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_reservoir_is_a_uniform_sample() {
        // 100 kept of 10,000 offered, 200 times: each tenth of the stream holds about a
        // tenth of what is kept (10 on average; the mean over 200 draws within 1).
        let mut per_tenth = [0u64; 10];
        for _ in 0..200 {
            let mut r = Reservoir::new(100);
            for i in 0..10_000 {
                r.offer(at(i));
            }
            assert_eq!(r.held.len(), 100);
            for s in &r.held {
                per_tenth[(s.intended_at_ns / 1_000_000_000 / 1000) as usize] += 1;
            }
        }
        for n in per_tenth {
            let mean = n as f64 / 200.0;
            assert!((9.0..=11.0).contains(&mean), "{per_tenth:?}");
        }
    }
}
