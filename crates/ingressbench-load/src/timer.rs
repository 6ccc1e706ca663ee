//! Clocks the pacer sleeps on: a precise one for real runs, tokio's for paused-time tests.

use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use ingressbench_stats::HistogramUs;
use rustix::time::{
    ClockId, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec,
};
use tokio::io::unix::AsyncFd;

use crate::BatchWindow;

/// What the pacer needs of time.
pub(crate) trait Clock {
    /// The current time.
    fn now(&self) -> Instant;
    /// Returns at or after `deadline`.
    async fn sleep_until(&mut self, deadline: Instant);
    /// The batch windows in force, one value per adjustment period (so a time-weighted
    /// distribution), in microseconds; `None` for clocks that do not batch.
    fn windows_us(&self) -> Option<&HistogramUs> {
        None
    }
}

/// How often the automatic window looks at the thread's CPU time.
const ADJUST_EVERY: Duration = Duration::from_millis(100);
/// The share of one core the automatic window lets a worker thread spend before it
/// batches wake-ups: below it every request is sent at its time.
pub(crate) const AUTO_CPU_TARGET: f64 = 0.30;
/// The narrowest window that is not zero, and the widest.
const MIN_WINDOW: Duration = Duration::from_micros(20);
const MAX_WINDOW: Duration = Duration::from_millis(1);

/// The automatic window's controller: every [`ADJUST_EVERY`] it reads the thread's CPU
/// time and widens the window by half when the thread spent more than [`AUTO_CPU_TARGET`]
/// of a core, or narrows it by a third when it spent well under. (Doubling found its width
/// sooner but overshot it: at 20,000 req/s it settled at 640 us where 300 us was enough.)
struct AutoWindow {
    since: Instant,
    cpu_since: Duration,
}

impl AutoWindow {
    fn new(now: Instant) -> Self {
        Self {
            since: now,
            cpu_since: thread_cpu(),
        }
    }

    /// The window for the next period, or `None` if the period has not ended.
    fn adjust(&mut self, now: Instant, window: Duration) -> Option<Duration> {
        let wall = now.saturating_duration_since(self.since);
        if wall < ADJUST_EVERY {
            return None;
        }
        let cpu = thread_cpu();
        let used = cpu.saturating_sub(self.cpu_since).as_secs_f64() / wall.as_secs_f64();
        self.since = now;
        self.cpu_since = cpu;
        Some(if used > AUTO_CPU_TARGET * 1.1 {
            (window * 3 / 2).clamp(MIN_WINDOW, MAX_WINDOW)
        } else if used < AUTO_CPU_TARGET * 0.7 {
            let narrower = window * 2 / 3;
            if narrower < MIN_WINDOW {
                Duration::ZERO
            } else {
                narrower
            }
        } else {
            window
        })
    }
}

/// CPU time this thread has used.
pub fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(ClockId::ThreadCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// A timerfd registered with the runtime's reactor: sub-millisecond wake-ups without
/// busy-waiting (tokio's own timer has 1 ms slots, which would delay sends by up to 1 ms).
///
/// It wakes at each deadline, but at most once per batch window (see
/// [`crate::Plan::batch_window`]): every wake-up costs a sleep and a wake of this thread
/// and, on loopback, of the server, so at high rates one wake-up releases every request
/// due since the last one. An isolated request is still sent at its time. The automatic
/// window starts at zero and widens only while the thread is short of CPU.
pub(crate) struct PreciseClock {
    fd: AsyncFd<OwnedFd>,
    window: Duration,
    last_wake: Instant,
    auto: Option<AutoWindow>,
    windows_us: HistogramUs,
    sampled_at: Instant,
}

impl PreciseClock {
    pub(crate) fn new(origin: Instant, batch: BatchWindow) -> io::Result<Self> {
        let (window, auto) = match batch {
            BatchWindow::Fixed(window) => (window, None),
            BatchWindow::Auto => (Duration::ZERO, Some(AutoWindow::new(origin))),
        };
        let fd = rustix::time::timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // `AsyncFd::new` is deprecated because a borrowed fd could be closed behind the
        // reactor's back; this one is an `OwnedFd` nobody else holds, and its replacement
        // `register` is `unsafe`, which this crate forbids.
        #[allow(deprecated)]
        let fd = AsyncFd::new(fd)?;
        Ok(Self {
            fd,
            window,
            last_wake: origin.checked_sub(window).unwrap_or(origin),
            auto,
            windows_us: HistogramUs::new(),
            sampled_at: origin,
        })
    }

    /// Adjusts the automatic window, and samples the window in force, once a period.
    fn tend(&mut self, now: Instant) {
        if now.saturating_duration_since(self.sampled_at) < ADJUST_EVERY {
            return;
        }
        self.sampled_at = now;
        self.windows_us
            .record_us(u64::try_from(self.window.as_micros()).unwrap_or(u64::MAX));
        if let Some(auto) = &mut self.auto {
            if let Some(window) = auto.adjust(now, self.window) {
                self.window = window;
            }
        }
    }

    fn arm(&self, wait: Duration) -> io::Result<()> {
        let value = Timespec {
            tv_sec: wait.as_secs() as i64,
            tv_nsec: i64::from(wait.subsec_nanos()),
        };
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        rustix::time::timerfd_settime(self.fd.get_ref(), TimerfdTimerFlags::empty(), &spec)?;
        Ok(())
    }
}

impl Clock for PreciseClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn windows_us(&self) -> Option<&HistogramUs> {
        Some(&self.windows_us)
    }

    async fn sleep_until(&mut self, deadline: Instant) {
        let now = Instant::now();
        self.tend(now);
        if deadline <= now {
            return;
        }
        let target = deadline.max(self.last_wake + self.window);
        let wait = target - now;
        if self.arm(wait.max(Duration::from_nanos(1))).is_err() {
            tokio::time::sleep_until(deadline.into()).await;
            return;
        }
        loop {
            let Ok(mut guard) = self.fd.readable().await else {
                tokio::time::sleep_until(deadline.into()).await;
                return;
            };
            let mut expirations = [0u8; 8];
            match guard.try_io(|fd| {
                rustix::io::read(fd.get_ref(), &mut expirations).map_err(io::Error::from)
            }) {
                Ok(_) => {
                    // The read emptied the timer, which stays unreadable until it is
                    // armed again: without this the next sleep would first read it in
                    // vain (a wasted system call per wake-up).
                    guard.clear_ready();
                    self.last_wake = Instant::now();
                    return;
                }
                Err(_would_block) => continue,
            }
        }
    }
}

/// tokio's timer (1 ms slots): the fallback where no timerfd can be had.
pub(crate) struct TokioFallback;

impl Clock for TokioFallback {
    fn now(&self) -> Instant {
        Instant::now()
    }

    async fn sleep_until(&mut self, deadline: Instant) {
        tokio::time::sleep_until(deadline.into()).await;
    }
}

/// tokio's timer, which follows paused time in tests.
#[cfg(test)]
pub(crate) struct TokioClock;

#[cfg(test)]
impl Clock for TokioClock {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    async fn sleep_until(&mut self, deadline: Instant) {
        tokio::time::sleep_until(deadline.into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn precise_clock_wakes_after_the_deadline_and_not_much_later() {
        let origin = Instant::now();
        let mut clock =
            PreciseClock::new(origin, BatchWindow::Fixed(Duration::from_micros(100))).unwrap();
        let mut worst = Duration::ZERO;
        for i in 1..=20u32 {
            let deadline = origin + Duration::from_micros(250) * i;
            clock.sleep_until(deadline).await;
            let now = Instant::now();
            assert!(now >= deadline, "woke early");
            worst = worst.max(now - deadline);
        }
        // Not a timing assertion on a noisy machine: only that it did not sleep for ever.
        assert!(worst < Duration::from_secs(1), "worst lateness {worst:?}");
    }
}
