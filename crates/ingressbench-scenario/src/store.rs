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
///
/// The holder also keeps [`RESERVE_BYTES`] of the disk in `.reserve`, given back when a
/// write finds the disk full: the cell in progress and run.json can then still record
/// what was measured and why the run stopped. Removed when the lock is dropped.
#[derive(Debug)]
pub struct ResultsLock {
    _dir: std::os::fd::OwnedFd,
    _file: File,
    reserve: PathBuf,
    reserved: std::cell::Cell<bool>,
}

/// Room kept for the records that end a run (a cell's summary, hgrm and impact, and
/// run.json: tens of KiB for a run of a hundred cells).
pub const RESERVE_BYTES: u64 = 256 << 10;

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
        let reserve = dir.join(".reserve");
        take_reserve(&reserve).map_err(|source| crate::ScenarioError::Write {
            path: reserve.clone(),
            source: io::Error::new(
                source.kind(),
                format!(
                    "cannot keep {} KiB for the run's last records ({source}): free space on that disk",
                    RESERVE_BYTES >> 10
                ),
            ),
        })?;
        Ok(Self {
            _dir: locked,
            _file: file,
            reserve,
            reserved: std::cell::Cell::new(true),
        })
    }

    /// Gives the reserved room back to the disk; `false` if it was given already.
    pub fn free_reserve(&self) -> bool {
        self.reserved.replace(false) && std::fs::remove_file(&self.reserve).is_ok()
    }

    /// Runs `write`; if it finds the disk full, gives the reserve back and runs it once
    /// more.
    pub fn write_even_if_full<T>(&self, mut write: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        match write() {
            Err(e) if is_full(&e) && self.free_reserve() => write(),
            other => other,
        }
    }
}

impl Drop for ResultsLock {
    fn drop(&mut self) {
        self.free_reserve();
    }
}

/// Whether `e` says the disk is full.
pub fn is_full(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull || e.kind() == io::ErrorKind::QuotaExceeded
}

/// Writes `.reserve` (never through a link), its blocks allocated: `fallocate` where the
/// file system has it, else written out (a sparse file would reserve nothing).
fn take_reserve(path: &Path) -> io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)?;
    let allocated =
        rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, RESERVE_BYTES);
    match allocated {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::NOSPC || e == rustix::io::Errno::DQUOT => {
            let _ = std::fs::remove_file(path);
            Err(e.into())
        }
        Err(_) => {
            let block = [0xA5u8; 4096];
            let mut out = BufWriter::new(file);
            let written = (0..RESERVE_BYTES / 4096)
                .try_for_each(|_| out.write_all(&block))
                .and_then(|()| out.flush());
            if written.is_err() {
                let _ = std::fs::remove_file(path);
            }
            written
        }
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
    /// Set at the first write error: the load stops (what it measured so far is kept).
    stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// The live metrics each window goes to (`--metrics-listen`).
    live: Option<std::sync::Arc<crate::live::Live>>,
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
        self.error.take().map_or(Ok(()), Err)
    }
}

impl Observer for Streams {
    fn window(&mut self, window: &Window) {
        if let Some(live) = &self.live {
            live.window(window);
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
