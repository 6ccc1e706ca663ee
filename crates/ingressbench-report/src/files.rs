//! Reading the files of a results directory that may come from elsewhere (a CI artifact,
//! a colleague's run): every file is opened from the directory down, one path component
//! at a time, never through a link; only a regular file is read (a FIFO or a device
//! could hang the reader or never end); and no more than a limit is read, which the
//! caller derives from what the run recorded. Every refusal names the file and the rule
//! it broke.
//!
//! Not here: what the files mean ([`crate::results`], [`ingressbench_results::hlog`]).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags};

/// The most a `run.json` may hold: its scenario echo and a record per cell.
pub const RUN_RECORD_LIMIT: u64 = 64 << 20;

/// The most any one small JSON file of a cell (summary, impact, workers) may hold.
pub const CELL_JSON_LIMIT: u64 = 16 << 20;

/// The most one line of a text file may hold, whatever the file's limit.
pub const LINE_LIMIT: usize = 1 << 20;

/// Opens `root/parts…` for reading: each directory below `root` and the file itself
/// without following a link, the file only if it is a regular file. Never blocks.
pub fn open_in(root: &Path, parts: &[&str]) -> Result<File, String> {
    let shown = parts
        .iter()
        .fold(root.to_owned(), |path, part| path.join(part));
    let refuse = |why: String| format!("{}: not read: {why}", shown.display());
    let Some((name, dirs)) = parts.split_last() else {
        return Err(refuse("no file named".into()));
    };
    let open = |at: &OwnedFd, part: &str, flags: OFlags| {
        rustix::fs::openat(at, part, flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| match e {
                rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
                    refuse(format!("`{part}` is a link or not a directory, and no link is followed in a results directory"))
                }
                e => refuse(std::io::Error::from(e).to_string()),
            })
    };
    let mut dir: OwnedFd =
        rustix::fs::open(root, OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| refuse(std::io::Error::from(e).to_string()))?;
    for part in dirs {
        dir = open(&dir, part, OFlags::DIRECTORY | OFlags::RDONLY)?;
    }
    let fd = open(&dir, name, OFlags::RDONLY | OFlags::NONBLOCK)?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| refuse(std::io::Error::from(e).to_string()))?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(refuse("it is not a regular file".into()));
    }
    Ok(File::from(fd))
}

/// The first `limit` bytes of the file at `path` (lossy UTF-8), if it is a regular file
/// and not a link: for showing a file, not for reading figures from it.
pub fn read_prefix(path: &Path, limit: usize) -> Option<String> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let stat = rustix::fs::fstat(&fd).ok()?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return None;
    }
    let mut bytes = Vec::new();
    File::from(fd)
        .take(limit as u64)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Writes `bytes` to `path` in a directory that may come from elsewhere: into a new file
/// beside it (created, never opened through a link), then renamed over `path`, which
/// replaces whatever was there, a link included, without following it.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace_file_with(path, |f| f.write_all(bytes))
}

/// [`replace_file`] with what `write` writes, as it writes it (a file too large to hold).
pub fn replace_file_with(
    path: &Path,
    write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|f| {
            let mut out = std::io::BufWriter::new(f);
            write(&mut out)?;
            out.into_inner()
                .map_err(std::io::IntoInnerError::into_error)?
                .sync_data()
        });
    match written.and_then(|()| std::fs::rename(&tmp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Whether `root/parts…` is a directory reached through no link.
pub fn is_dir_in(root: &Path, parts: &[&str]) -> bool {
    let mut path = root.to_owned();
    parts.iter().all(|part| {
        path.push(part);
        path.symlink_metadata().is_ok_and(|m| m.is_dir())
    })
}

/// Whether `root/parts…` exists (as anything: what it is, is [`open_in`]'s to judge).
pub fn exists_in(root: &Path, parts: &[&str]) -> bool {
    let path = parts
        .iter()
        .fold(root.to_owned(), |path, part| path.join(part));
    path.symlink_metadata().is_ok()
}

/// The whole of `root/parts…`, refused when it holds more than `limit` bytes, with what
/// allows that limit in words (`"the cell's 800 requests"`).
pub fn read_in(root: &Path, parts: &[&str], limit: u64, allows: &str) -> Result<Vec<u8>, String> {
    let file = open_in(root, parts)?;
    let shown = parts.iter().fold(root.to_owned(), |p, part| p.join(part));
    let size = file
        .metadata()
        .map_err(|e| format!("{}: {e}", shown.display()))?
        .len();
    let over = |size: u64| {
        format!(
            "{}: not read: it holds {size} bytes, more than the {limit} that {allows} allow",
            shown.display()
        )
    };
    if size > limit {
        return Err(over(size));
    }
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", shown.display()))?;
    if bytes.len() as u64 > limit {
        return Err(over(bytes.len() as u64));
    }
    Ok(bytes)
}

/// A text file's lines (a `.gz` one decompressed as it is read), each at most
/// [`LINE_LIMIT`] bytes and at most `max_lines` of them: a small compressed file cannot
/// expand into more than the run recorded.
pub struct Lines {
    reader: Box<dyn BufRead>,
    shown: String,
    max_lines: u64,
    read: u64,
    /// An error was given: the lines end there.
    failed: bool,
}

impl Lines {
    /// Opens `root/parts…` as [`open_in`] does.
    pub fn open(root: &Path, parts: &[&str], max_lines: u64) -> Result<Self, String> {
        let file = open_in(root, parts)?;
        let gz = parts.last().is_some_and(|p| p.ends_with(".gz"));
        let reader: Box<dyn BufRead> = if gz {
            Box::new(BufReader::new(flate2::read::GzDecoder::new(file)))
        } else {
            Box::new(BufReader::new(file))
        };
        let shown = parts
            .iter()
            .fold(root.to_owned(), |p, part| p.join(part))
            .display()
            .to_string();
        Ok(Self {
            reader,
            shown,
            max_lines,
            read: 0,
            failed: false,
        })
    }
}

impl Iterator for Lines {
    type Item = Result<String, String>;

    fn next(&mut self) -> Option<Self::Item> {
        let line = self.next_line();
        self.failed |= matches!(line, Some(Err(_)));
        line
    }
}

impl Lines {
    fn next_line(&mut self) -> Option<Result<String, String>> {
        if self.failed {
            return None;
        }
        let mut line = Vec::new();
        let got = (&mut self.reader)
            .take(LINE_LIMIT as u64 + 1)
            .read_until(b'\n', &mut line);
        match got {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) => return Some(Err(format!("{}: {e}", self.shown))),
        }
        if line.len() > LINE_LIMIT {
            return Some(Err(format!(
                "{}: a line longer than {LINE_LIMIT} bytes",
                self.shown
            )));
        }
        self.read += 1;
        if self.read > self.max_lines {
            return Some(Err(format!(
                "{}: more than the {} lines the run's counts allow",
                self.shown, self.max_lines
            )));
        }
        while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            line.pop();
        }
        Some(Ok(String::from_utf8_lossy(&line).into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ib-files-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("cells/a")).unwrap();
        dir
    }

    #[test]
    fn links_fifos_and_oversized_files_are_refused_by_name() {
        let root = scratch("refuse");
        std::fs::write(root.join("cells/a/summary.json"), "{}").unwrap();
        assert_eq!(
            read_in(&root, &["cells", "a", "summary.json"], 10, "test").unwrap(),
            b"{}"
        );
        let err = read_in(
            &root,
            &["cells", "a", "summary.json"],
            1,
            "the cell's 1 request",
        )
        .unwrap_err();
        assert!(
            err.contains("holds 2 bytes, more than the 1 that the cell's 1 request allow"),
            "{err}"
        );
        // A link to a file outside, and a directory that is a link.
        let outside = root.join("outside.json");
        std::fs::write(&outside, "{}").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("cells/a/impact.json")).unwrap();
        let err = read_in(&root, &["cells", "a", "impact.json"], 10, "t").unwrap_err();
        assert!(err.contains("is a link"), "{err}");
        std::os::unix::fs::symlink(root.join("cells/a"), root.join("cells/b")).unwrap();
        let err = read_in(&root, &["cells", "b", "summary.json"], 10, "t").unwrap_err();
        assert!(err.contains("`b` is a link"), "{err}");
        // A FIFO: refused at once, not waited on.
        let fifo = root.join("cells/a/latency.hlog");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let err = read_in(&root, &["cells", "a", "latency.hlog"], 10, "t").unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_compressed_file_cannot_expand_past_its_lines() {
        use std::io::Write;
        let root = scratch("gz");
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(root.join("cells/a/samples.csv.gz")).unwrap(),
            flate2::Compression::best(),
        );
        for _ in 0..10_000 {
            gz.write_all(b"1,2,3\n").unwrap();
        }
        gz.finish().unwrap();
        let lines: Vec<_> = Lines::open(&root, &["cells", "a", "samples.csv.gz"], 100)
            .unwrap()
            .collect();
        assert_eq!(lines.len(), 101);
        assert!(lines[..100].iter().all(|l| l.as_deref() == Ok("1,2,3")));
        assert!(lines[100]
            .as_ref()
            .unwrap_err()
            .contains("more than the 100 lines"));
        // One endless line.
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(root.join("cells/a/long.csv.gz")).unwrap(),
            flate2::Compression::best(),
        );
        gz.write_all(&vec![b'x'; LINE_LIMIT + 10]).unwrap();
        gz.finish().unwrap();
        let first = Lines::open(&root, &["cells", "a", "long.csv.gz"], 100)
            .unwrap()
            .next()
            .unwrap();
        assert!(first.unwrap_err().contains("a line longer than"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
