//! Writing what a run measures while it runs: interval logs and sampled requests are
//! streamed and flushed at every window (once a second), so a run that is interrupted or
//! dies keeps what it measured.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use flate2::write::GzEncoder;
use ingressbench_load::{Observer, Progress};
use ingressbench_report::hlog::HlogWriter;
use ingressbench_report::samples::SampleWriter;
use ingressbench_stats::{Sample, Window};

/// The lock a writer holds on a results directory while it writes: the directory itself
/// is `flock`ed (so deleting a file cannot let a second writer in beside the first), and
/// `.lock` in it names the holder: a second writer is refused with the first one's
/// process id and command, instead of both writing the same files. The kernel releases
/// the lock when the holder exits, however it exits, so a killed run leaves nothing to
/// clean up.
#[derive(Debug)]
pub struct ResultsLock {
    _dir: std::os::fd::OwnedFd,
    _file: File,
}

impl ResultsLock {
    /// Takes the lock of `dir` (created if missing), or says who holds it.
    pub fn acquire(dir: &Path) -> Result<Self, crate::ScenarioError> {
        use rustix::fs::{flock, FlockOperation, Mode, OFlags};
        let path = dir.join(".lock");
        let write_error = |source| crate::ScenarioError::Write {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(write_error)?;
        let locked = rustix::fs::open(
            dir,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| write_error(e.into()))?;
        match flock(&locked, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let holder = ingressbench_report::files::read_in(dir, &[".lock"], 4096, "a lock's")
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                let holder = holder.trim();
                return Err(crate::ScenarioError::ResultsLocked {
                    dir: dir.to_owned(),
                    holder: if holder.is_empty() {
                        "another process".to_owned()
                    } else {
                        holder.to_owned()
                    },
                });
            }
            Err(e) => return Err(write_error(e.into())),
        }
        // Never through a link: a `.lock` that leads elsewhere is not truncated.
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(OFlags::NOFOLLOW.bits() as i32)
            .open(&path)
            .map_err(write_error)?;
        let command: Vec<String> = std::env::args().collect();
        file.set_len(0)
            .and_then(|()| {
                write!(
                    file,
                    "process {} ({})",
                    std::process::id(),
                    command.join(" ")
                )
            })
            .and_then(|()| file.flush())
            .map_err(write_error)?;
        Ok(Self {
            _dir: locked,
            _file: file,
        })
    }
}

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
pub(crate) type ProgressFn = Box<dyn FnMut(&Progress) + Send>;

/// Streams a run's windows to an interval log and its samples to CSV, as the load engine
/// hands them over; tells a progress callback after every window.
pub struct Streams {
    hlog: Option<(PathBuf, HlogWriter<BufWriter<File>>)>,
    samples: Option<(PathBuf, SampleWriter<SamplesOut>)>,
    progress: Option<ProgressFn>,
    error: Option<io::Error>,
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
        })
    }

    /// Calls `f` with the state of the run after every window.
    pub fn on_progress(mut self, f: impl FnMut(&Progress) + Send + 'static) -> Self {
        self.progress = Some(Box::new(f));
        self
    }

    fn keep(&mut self, result: io::Result<()>) {
        if let Err(e) = result {
            self.error.get_or_insert(e);
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
        self.error.take().map_or(Ok(()), Err)
    }
}

impl Observer for Streams {
    fn window(&mut self, window: &Window) {
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
        if let Some((path, w)) = self.samples.as_mut() {
            let result = w.write(samples, backends).map_err(named(path));
            self.keep(result);
        }
    }

    fn progress(&mut self, p: &Progress) {
        if let Some(f) = self.progress.as_mut() {
            f(p);
        }
    }
}
