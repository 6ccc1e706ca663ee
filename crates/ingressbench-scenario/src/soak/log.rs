//! soak.jsonl: the tool's own cost as a soak goes.

use std::path::Path;
use std::time::{Duration, Instant};

use ingressbench_lab::usage::{Part, UsageReader};
use ingressbench_load::kept::KeptCounts;
use ingressbench_results::soak::SoakLine;

/// soak.jsonl: every `every`, what the tool itself spends (its memory, CPU per 1,000
/// requests, open descriptors), the results directory's size and what the samples'
/// filter kept. A line that cannot be written is left out; the cell goes on.
pub(crate) struct SoakLog {
    file: std::fs::File,
    every: Duration,
    measure_from: Instant,
    /// Where in the soak this run started.
    from: Duration,
    last: Option<(Instant, f64, u64)>,
    results: std::path::PathBuf,
    /// Every line written (one a minute: 1,440 a day).
    pub(crate) lines: Vec<SoakLine>,
}

impl SoakLog {
    /// The log at `path`, written every `every` from `measure_from`; `results` is the run's
    /// directory, whose size each line gives.
    pub(crate) fn new(
        path: &Path,
        (every, from): (Duration, Duration),
        measure_from: Instant,
        results: &Path,
    ) -> std::io::Result<Self> {
        // The first line's CPU per request counts from here.
        let me = UsageReader::new().read(&[Part::process("tool", "client", std::process::id())]);
        Ok(Self {
            file: std::fs::File::create(path)?,
            every,
            measure_from,
            from,
            last: me.first().map(|me| (Instant::now(), me.cpu_s, 0)),
            results: results.to_owned(),
            lines: Vec::new(),
        })
    }

    /// At `now`, if a line is due (every `every` from the start of measurement): writes
    /// it, with the load's `requests` so far, the events' `firings` and the samples'
    /// filter's counts.
    pub(crate) fn watch(
        &mut self,
        now: Instant,
        requests: u64,
        firings: u64,
        kept: Option<KeptCounts>,
    ) {
        let due = match self.last {
            Some((at, _, _)) if at > self.measure_from => now.duration_since(at) >= self.every,
            _ => now >= self.measure_from + self.every,
        };
        if due {
            self.write(now, requests, firings, kept);
        }
    }

    /// Writes a line now.
    pub(crate) fn write(
        &mut self,
        now: Instant,
        requests: u64,
        firings: u64,
        kept: Option<KeptCounts>,
    ) {
        use std::io::Write;
        let me = UsageReader::new().read(&[Part::process("tool", "client", std::process::id())]);
        let Some(me) = me.first() else { return };
        let per_1000 = self.last.and_then(|(_, cpu_s, before)| {
            let n = requests.checked_sub(before).filter(|n| *n > 0)?;
            Some(((me.cpu_s - cpu_s) * 1e6 / n as f64 * 100.0).round() / 100.0)
        });
        let kept = kept.unwrap_or_default();
        let t_s = (crate::usage::signed_offset(now, self.measure_from) * 1e3).round() / 1e3;
        let line = SoakLine {
            t_s,
            soak_t_s: t_s + self.from.as_secs_f64(),
            requests,
            rss_bytes: me.rss_bytes,
            cpu_s: me.cpu_s,
            cpu_ms_per_1000_requests: per_1000,
            fds: me.fds,
            results_bytes: size_of(&self.results),
            firings,
            outside_windows_seen: kept.seen,
            outside_windows_kept: kept.kept,
        };
        self.last = Some((now, me.cpu_s, requests));
        let text = serde_json::to_string(&line).unwrap_or_default();
        let _ = writeln!(self.file, "{text}").and_then(|()| self.file.flush());
        self.lines.push(line);
    }
}

/// The bytes of the regular files under `dir` (links not followed), at most four levels
/// down: a run's directory, its cells and their `proxy/` files.
fn size_of(dir: &Path) -> u64 {
    fn walk(dir: &Path, depth: u32) -> u64 {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return 0;
        };
        entries
            .flatten()
            .map(|e| match e.file_type() {
                Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
                Ok(t) if t.is_dir() && depth > 0 => walk(&e.path(), depth - 1),
                _ => 0,
            })
            .sum()
    }
    walk(dir, 4)
}
