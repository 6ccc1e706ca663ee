//! Writing what a load measures while it runs: its interval log and sampled requests are
//! streamed and flushed at every window (once a second), so that a run that is interrupted
//! or dies keeps what it measured. Used by the `load` command and by each cell of a
//! scenario; the formats are [`ingressbench_results::hlog`] and
//! [`ingressbench_results::samples`].

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use flate2::write::GzEncoder;
use ingressbench_results::hlog::HlogWriter;
use ingressbench_results::samples::SampleWriter;
use ingressbench_stats::{Sample, Window};

use crate::kept::Kept;
use crate::{Observer, Progress};

/// Creates a file, with an error that names it.
pub fn create(path: &Path) -> io::Result<File> {
    File::create(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot create {} ({e}; does its directory exist and is it writable?)",
                path.display()
            ),
        )
    })
}

fn named(path: &Path) -> impl Fn(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("writing {}: {e}", path.display()))
}

/// Where samples go: plain or gzip-compressed CSV.
enum SamplesOut {
    Plain(BufWriter<File>),
    Gzip(GzEncoder<BufWriter<File>>),
}

impl Write for SamplesOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            SamplesOut::Plain(w) => w.write(buf),
            SamplesOut::Gzip(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            SamplesOut::Plain(w) => w.flush(),
            SamplesOut::Gzip(w) => w.flush(),
        }
    }
}

/// What is told the state of a run after every window.
pub type ProgressFn = Box<dyn FnMut(&Progress) + Send>;

/// Streams a run's windows to an interval log and its samples to CSV, as the load engine
/// hands them over; tells a progress callback after every window.
pub struct Streams {
    hlog: Option<(PathBuf, HlogWriter<BufWriter<File>>)>,
    samples: Option<(PathBuf, SampleWriter<SamplesOut>)>,
    progress: Option<ProgressFn>,
    error: Option<io::Error>,
    /// Set at the first write error: the load stops (what it measured so far is kept).
    stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// The live metrics each window goes to (`--metrics-listen`).
    live: Option<std::sync::Arc<crate::live::Live>>,
    /// Which samples are written (a soak's): all of them without it.
    kept: Option<Kept>,
    /// The backends' names as last handed over (for the reservoir's last writing).
    backends: Vec<String>,
    /// Counts the requests of every window handed over.
    requests: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

impl Streams {
    /// Opens the files asked for (a `.gz` samples path is compressed); `comment` heads the
    /// interval log.
    pub fn new(hlog: Option<&Path>, samples: Option<&Path>, comment: &str) -> io::Result<Self> {
        let hlog = match hlog {
            Some(path) => {
                let writer =
                    HlogWriter::new(BufWriter::new(create(path)?), SystemTime::now(), comment)
                        .map_err(named(path))?;
                Some((path.to_owned(), writer))
            }
            None => None,
        };
        let samples = match samples {
            Some(path) => {
                let file = BufWriter::new(create(path)?);
                let out = if path.extension().is_some_and(|e| e == "gz") {
                    SamplesOut::Gzip(GzEncoder::new(file, flate2::Compression::fast()))
                } else {
                    SamplesOut::Plain(file)
                };
                Some((
                    path.to_owned(),
                    SampleWriter::new(out).map_err(named(path))?,
                ))
            }
            None => None,
        };
        Ok(Self {
            hlog,
            samples,
            progress: None,
            error: None,
            stop: None,
            live: None,
            kept: None,
            backends: Vec::new(),
            requests: None,
        })
    }

    /// Hands every window to `live` as well (the live metrics' endpoint).
    pub fn with_live(mut self, live: std::sync::Arc<crate::live::Live>) -> Self {
        self.live = Some(live);
        self
    }

    /// Sets `stop` at the first write error (a full disk): a load that cannot be written
    /// down ends there.
    pub fn stop_on_error(mut self, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Writes only the samples `kept` keeps; the others go to its reservoir.
    pub fn keep_only(mut self, kept: Kept) -> Self {
        self.kept = Some(kept);
        self
    }

    /// Adds every window's requests (all outcomes) to `requests`.
    pub fn count_into(mut self, requests: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Self {
        self.requests = Some(requests);
        self
    }

    /// Calls `f` with the state of the run after every window.
    pub fn on_progress(mut self, f: impl FnMut(&Progress) + Send + 'static) -> Self {
        self.progress = Some(Box::new(f));
        self
    }

    fn keep(&mut self, result: io::Result<()>) {
        if let Err(e) = result {
            self.error.get_or_insert(e);
            if let Some(stop) = &self.stop {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Closes the files (warnings go into the interval log as comments) and reports the
    /// first write error, if any.
    pub fn finish(&mut self, warnings: &[String]) -> io::Result<()> {
        if let Some((path, mut w)) = self.hlog.take() {
            let result = warnings
                .iter()
                .try_for_each(|warning| w.comment(&format!("WARNING: {warning}")))
                .and_then(|()| w.flush());
            self.keep(result.map_err(named(&path)));
        }
        if let Some((path, w)) = self.samples.take() {
            let result = match w.into_inner() {
                SamplesOut::Plain(mut w) => w.flush(),
                SamplesOut::Gzip(gz) => gz.finish().and_then(|mut w| w.flush()),
            };
            self.keep(result.map_err(named(&path)));
        }
        if let Some(kept) = self.kept.as_mut() {
            let result = kept.write(&self.backends);
            self.keep(result);
        }
        self.error.take().map_or(Ok(()), Err)
    }
}

impl Observer for Streams {
    fn window(&mut self, window: &Window) {
        if let Some(live) = &self.live {
            live.window(window);
        }
        if let Some(requests) = &self.requests {
            requests.fetch_add(
                window.outcomes.total(),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        if let Some((path, w)) = self.hlog.as_mut() {
            let start = Duration::from_nanos(window.start_ns());
            let length = Duration::from_nanos(window.width_ns);
            let result = w
                .interval(start, length, &window.latency)
                .and_then(|()| w.outcomes(start, &window.outcomes))
                .and_then(|()| w.flush())
                .map_err(named(path));
            self.keep(result);
        }
        if let Some((path, w)) = self.samples.as_mut() {
            let result = w.flush().map_err(named(path));
            self.keep(result);
        }
    }

    fn samples(&mut self, samples: &[Sample], backends: &[String]) {
        let kept = match self.kept.as_mut() {
            Some(kept) => {
                if self.backends.len() != backends.len() {
                    self.backends = backends.to_vec();
                }
                let (now, written) = kept.split(samples, backends);
                self.keep(written);
                Some(now)
            }
            None => None,
        };
        if let Some((path, w)) = self.samples.as_mut() {
            let result = w
                .write(kept.as_deref().unwrap_or(samples), backends)
                .map_err(named(path));
            self.keep(result);
        }
    }

    fn progress(&mut self, p: &Progress) {
        if let Some(f) = self.progress.as_mut() {
            f(p);
        }
    }
}
