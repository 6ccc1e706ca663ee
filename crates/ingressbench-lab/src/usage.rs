//! What the lab's processes spend: CPU time and resident memory, read from `/proc`.
//!
//! A part of the lab (a proxy with its workers, a replica, the front, the sidecar) is a
//! process group: every child the lab starts leads a group of its own, and what it forks
//! (nginx's and HAProxy's workers) stays in it. A part's CPU time is that of its live
//! members plus what the leader has reaped (`cutime`, `cstime`: old workers that exited
//! after a reload), so a reload's cost is not lost when its workers go.
//!
//! ```no_run
//! use ingressbench_lab::usage::{Part, UsageReader};
//!
//! let reader = UsageReader::new();
//! let parts = [
//!     Part::group("nginx", "proxy", 4242),
//!     Part::process("client", "client", std::process::id()),
//! ];
//! for u in reader.read(&parts) {
//!     println!("{}: {:.2} s CPU, {} bytes resident", u.name, u.cpu_s, u.rss_bytes);
//! }
//! ```

use std::fs;

/// A set of processes measured together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// Which one (`nginx`, `nginx-2` for a second replica, `front`, `sidecar`, `client`).
    pub name: String,
    /// What it does: `proxy` (the proxies under test, every replica), `controller`,
    /// `front`, `sidecar` or `client`.
    pub role: &'static str,
    /// Where its figures come from.
    pub source: Source,
}

/// Where a part's figures come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The process group led by this pid, with what its leader reaped.
    Group(u32),
    /// This process alone.
    Process(u32),
    /// Someone else's readings (processes on other machines: a cluster's pods, read
    /// through its API), as last [`Reported::set`].
    Reported(Reported),
}

impl Part {
    /// The process group led by `pid`.
    pub fn group(name: &str, role: &'static str, pid: u32) -> Self {
        Self::new(name, role, Source::Group(pid))
    }

    /// The process `pid` alone.
    pub fn process(name: &str, role: &'static str, pid: u32) -> Self {
        Self::new(name, role, Source::Process(pid))
    }

    /// Processes read elsewhere, whose readings come through `reported`.
    pub fn reported(name: &str, role: &'static str, reported: Reported) -> Self {
        Self::new(name, role, Source::Reported(reported))
    }

    fn new(name: &str, role: &'static str, source: Source) -> Self {
        Self {
            name: name.to_owned(),
            role,
            source,
        }
    }
}

/// The latest reading of processes this machine cannot see, shared between whoever reads
/// them (a thread asking a cluster's API) and the [`UsageReader`]. Equal when shared.
#[derive(Clone, Debug, Default)]
pub struct Reported(std::sync::Arc<std::sync::Mutex<Option<Figures>>>);

/// CPU seconds, resident bytes and live processes: one reading of a part.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    /// CPU time since its processes started, in seconds.
    pub cpu_s: f64,
    /// Resident memory, in bytes.
    pub rss_bytes: u64,
    /// How many processes (or pods) it has.
    pub processes: u32,
}

impl Reported {
    /// Replaces the reading.
    pub fn set(&self, figures: Figures) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(figures);
    }

    /// The latest reading; none before the first.
    pub fn get(&self) -> Option<Figures> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl PartialEq for Reported {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Reported {}

/// One part's CPU time and memory at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct PartUsage {
    /// The part's name.
    pub name: String,
    /// What the part is (`proxy`, `backend`, `front`…), as usage.jsonl names it.
    pub role: &'static str,
    /// CPU time (user and system) since its processes started, in seconds.
    pub cpu_s: f64,
    /// Resident memory of its live processes, in bytes.
    pub rss_bytes: u64,
    /// How many live processes it has.
    pub processes: u32,
    /// The descriptors its live processes hold open (none for a part read elsewhere, or
    /// whose `/proc/PID/fd` could not be read).
    pub fds: Option<u64>,
}

/// The fields of `/proc/PID/stat` that matter here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stat {
    ppid: u32,
    pgrp: u32,
    /// utime + stime, in clock ticks.
    own_ticks: u64,
    /// cutime + cstime: reaped children's, in clock ticks.
    reaped_ticks: u64,
    rss_pages: u64,
}

/// Reads parts' usage from `/proc`; cheap enough to call once a second during a run (one
/// scan of `/proc` per call).
#[derive(Clone, Copy, Debug)]
pub struct UsageReader {
    ticks_per_s: f64,
    page_bytes: u64,
}

impl Default for UsageReader {
    fn default() -> Self {
        Self::new()
    }
}

impl UsageReader {
    /// A reader for this machine's clock tick and page size.
    pub fn new() -> Self {
        Self {
            ticks_per_s: rustix::param::clock_ticks_per_second() as f64,
            page_bytes: rustix::param::page_size() as u64,
        }
    }

    /// The usage of each part now; a part whose processes are gone reads as zero.
    pub fn read(&self, parts: &[Part]) -> Vec<PartUsage> {
        let mut totals: Vec<(u64, u64, u32, Option<u64>)> = vec![(0, 0, 0, Some(0)); parts.len()];
        let mut add = |i: usize, pid: u32, stat: &Stat, leader: bool| {
            let t = &mut totals[i];
            t.0 += stat.own_ticks + if leader { stat.reaped_ticks } else { 0 };
            t.1 += stat.rss_pages;
            t.2 += 1;
            t.3 = t.3.zip(open_fds(pid)).map(|(a, b)| a + b);
        };
        let group = |part: &Part| match part.source {
            Source::Group(pid) => Some(pid),
            _ => None,
        };
        if parts.iter().any(|p| group(p).is_some()) {
            let members: Vec<(u32, Stat)> = proc_stats()
                .filter(|(_, stat)| parts.iter().any(|p| group(p) == Some(stat.pgrp)))
                .collect();
            // What a group's top processes (those whose parent is not of the group: its
            // leader, or nginx's master once the shell that started it has left) reaped
            // is the group's: its exited members.
            let top = |stat: &Stat| {
                !members
                    .iter()
                    .any(|(pid, other)| *pid == stat.ppid && other.pgrp == stat.pgrp)
            };
            for (pid, stat) in &members {
                for (i, part) in parts.iter().enumerate() {
                    if group(part) == Some(stat.pgrp) {
                        add(i, *pid, stat, top(stat));
                    }
                }
            }
        }
        for (i, part) in parts.iter().enumerate() {
            if let Source::Process(pid) = part.source {
                if let Some(stat) = read_stat(pid) {
                    add(i, pid, &stat, false);
                }
            }
        }
        parts
            .iter()
            .zip(totals)
            .map(|(part, (ticks, pages, processes, fds))| {
                let (figures, fds) = match &part.source {
                    Source::Reported(r) => (r.get().unwrap_or_default(), None),
                    _ => (
                        Figures {
                            cpu_s: ticks as f64 / self.ticks_per_s,
                            rss_bytes: pages * self.page_bytes,
                            processes,
                        },
                        fds.filter(|_| processes > 0),
                    ),
                };
                PartUsage {
                    name: part.name.clone(),
                    role: part.role,
                    cpu_s: figures.cpu_s,
                    rss_bytes: figures.rss_bytes,
                    processes: figures.processes,
                    fds,
                }
            })
            .collect()
    }
}

/// The process groups a member of group `pgid` started (each led by a child of one of
/// its members), by the pid that leads each: a proxy a controller runs as its own
/// group (HAProxy Ingress's HAProxy master).
pub fn child_groups(pgid: u32) -> Vec<u32> {
    let stats: Vec<(u32, Stat)> = proc_stats().collect();
    let members: std::collections::HashSet<u32> = stats
        .iter()
        .filter(|(_, s)| s.pgrp == pgid)
        .map(|(pid, _)| *pid)
        .collect();
    stats
        .iter()
        .filter(|(pid, s)| s.pgrp == *pid && s.pgrp != pgid && members.contains(&s.ppid))
        .map(|(pid, _)| *pid)
        .collect()
}

/// Every process's stat, by pid.
fn proc_stats() -> impl Iterator<Item = (u32, Stat)> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, read_stat(pid)?)))
}

/// How many descriptors process `pid` holds open.
fn open_fds(pid: u32) -> Option<u64> {
    Some(fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

fn read_stat(pid: u32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses `/proc/PID/stat` (proc(5)). The command name may hold spaces and parentheses,
/// so fields are counted from its closing parenthesis.
fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    // After the name: state (field 3) is f[0], so field n is f[n - 3].
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        ppid: u32::try_from(field(4)?).ok()?,
        pgrp: u32::try_from(field(5)?).ok()?,
        own_ticks: field(14)? + field(15)?,
        reaped_ticks: field(16)? + field(17)?,
        rss_pages: field(24)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_started_by_a_member_is_found_as_a_child_group() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .process_group(0)
            .spawn()
            .unwrap();
        let own = rustix::process::getpgrp().as_raw_nonzero().get() as u32;
        let found = child_groups(own);
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&child.id()), "{found:?}");
        assert!(!found.contains(&own));
    }

    #[test]
    fn a_part_counts_the_descriptors_its_processes_hold_open() {
        // A process holding stdin, stdout and stderr (and any descriptor another test's
        // thread had open, not yet marked close-on-exec, when it was forked).
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let part = [Part::process("held", "backend", child.id())];
        let fds = UsageReader::new().read(&part)[0].fds;
        let running = child.try_wait().unwrap().is_none();
        let _ = child.kill();
        let _ = child.wait();
        assert!(running);
        assert!(fds >= Some(3), "{fds:?}");
        // Gone, it holds none it can be asked about.
        assert_eq!(UsageReader::new().read(&part)[0].fds, None);
    }

    #[test]
    fn a_reported_part_reads_what_was_last_set_and_zero_before() {
        let reported = Reported::default();
        let parts = [Part::reported("remote", "controller", reported.clone())];
        let reader = UsageReader::new();
        assert_eq!(reader.read(&parts)[0].rss_bytes, 0);
        let figures = Figures {
            cpu_s: 1.5,
            rss_bytes: 4096,
            processes: 2,
        };
        reported.set(figures);
        let read = &reader.read(&parts)[0];
        assert_eq!((read.cpu_s, read.rss_bytes, read.processes), (1.5, 4096, 2));
        assert_eq!(parts[0], Part::reported("remote", "controller", reported));
        assert_ne!(
            parts[0],
            Part::reported("remote", "controller", Reported::default())
        );
    }

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "4242 (nginx: (worker) x) S 1 4200 4200 0 -1 4194560 100 0 0 0 \
                    12 7 30 5 20 0 1 0 123 100000 345 18446744073709551615";
        let stat = parse_stat(line).unwrap();
        assert_eq!(
            stat,
            Stat {
                ppid: 1,
                pgrp: 4200,
                own_ticks: 19,
                reaped_ticks: 35,
                rss_pages: 345
            }
        );
        assert_eq!(parse_stat("12 (cut short) S 1"), None);
    }

    #[test]
    fn a_group_counts_its_live_members_and_what_its_leader_reaped() {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        // A shell in a group of its own: it spins in a subshell it then reaps, and
        // forks a sleeper it keeps.
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "(i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done); sleep 30 & echo forked; wait",
            ])
            .process_group(0)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "forked");
        let parts = [
            Part::group("shell", "proxy", pid),
            Part::process("me", "client", std::process::id()),
        ];
        let seen = UsageReader::new().read(&parts);
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .status();
        let _ = child.wait();
        assert_eq!(seen[0].processes, 2, "the shell and its sleeper: {seen:?}");
        assert!(seen[0].cpu_s > 0.0, "the reaped subshell's time: {seen:?}");
        assert!(seen[0].rss_bytes > 0 && seen[1].rss_bytes > 0, "{seen:?}");
        assert_eq!(seen[1].processes, 1, "{seen:?}");
        // Gone (once the killed sleeper is reaped by whoever inherited it), it reads as
        // nothing.
        let mut gone = UsageReader::new().read(&parts[..1]);
        for _ in 0..200 {
            if gone[0].processes == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            gone = UsageReader::new().read(&parts[..1]);
        }
        assert_eq!((gone[0].processes, gone[0].cpu_s), (0, 0.0), "{gone:?}");
    }
}
