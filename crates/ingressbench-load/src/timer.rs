//! Clocks the pacer sleeps on: a precise one for real runs, tokio's for paused-time tests.

use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec};
use tokio::io::unix::AsyncFd;

/// What the pacer needs of time.
pub(crate) trait Clock {
    /// The current time.
    fn now(&self) -> Instant;
    /// Returns at or after `deadline`.
    async fn sleep_until(&mut self, deadline: Instant);
}

/// A timerfd registered with the runtime's reactor: sub-millisecond wake-ups without
/// busy-waiting (tokio's own timer has 1 ms slots, which would delay sends by up to 1 ms).
///
/// It wakes at each deadline, but at most once per batch window (see
/// [`crate::Plan::batch_window`]): every wake-up costs a sleep and a wake of this thread
/// and, on loopback, of the server, so at high rates one wake-up releases every request
/// due since the last one. An isolated request is still sent at its time.
pub(crate) struct PreciseClock {
    fd: AsyncFd<OwnedFd>,
    window: Duration,
    last_wake: Instant,
}

impl PreciseClock {
    pub(crate) fn new(origin: Instant, window: Duration) -> io::Result<Self> {
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
        })
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

    async fn sleep_until(&mut self, deadline: Instant) {
        let now = Instant::now();
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
        let mut clock = PreciseClock::new(origin, Duration::from_micros(100)).unwrap();
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
