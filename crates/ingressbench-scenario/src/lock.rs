//! The lock a run holds on its results directory, with a reserve of disk that lets it
//! record why it stopped when the disk fills. The files a load streams while it runs are
//! [`ingressbench_load::streams`].

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

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
pub(crate) struct ResultsLock {
    _dir: std::os::fd::OwnedFd,
    _file: File,
    reserve: PathBuf,
    reserved: std::cell::Cell<bool>,
}

/// Room kept for the records that end a run (a cell's summary, hgrm and impact, and
/// run.json: tens of KiB for a run of a hundred cells).
pub(crate) const RESERVE_BYTES: u64 = 256 << 10;

impl ResultsLock {
    /// Takes the lock of `dir` (created if missing), or says who holds it.
    pub(crate) fn acquire(dir: &Path) -> Result<Self, crate::ScenarioError> {
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
    pub(crate) fn free_reserve(&self) -> bool {
        self.reserved.replace(false) && std::fs::remove_file(&self.reserve).is_ok()
    }

    /// Runs `write`; if it finds the disk full, gives the reserve back and runs it once
    /// more.
    pub(crate) fn write_even_if_full<T>(
        &self,
        mut write: impl FnMut() -> io::Result<T>,
    ) -> io::Result<T> {
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
pub(crate) fn is_full(e: &io::Error) -> bool {
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
