//! Hands due requests of an open-loop schedule to idle connections, on one thread.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::task::{Poll, Waker};

/// A request the schedule has released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(crate) seq: u64,
    pub(crate) intended_ns: u64,
    pub(crate) released_ns: u64,
    pub(crate) warmup: bool,
    /// Set when it comes back to be sent again (HTTP/2: a stream the server did not
    /// process).
    pub(crate) retry: Option<Retry>,
}

/// A request's first attempt, when it is sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Retry {
    /// How the first attempt ended.
    pub(crate) after: ingressbench_stats::Outcome,
    /// When it started.
    pub(crate) first_sent_ns: u64,
    /// Attempts made so far (at least 1).
    pub(crate) attempts: u8,
}

/// A queue of released tickets and the connections waiting for one. Single-threaded (one
/// per worker), so it needs no lock; waiting costs no allocation once the vectors have
/// grown to the number of connections.
#[derive(Default)]
pub(crate) struct Dispatch {
    queue: RefCell<VecDeque<Ticket>>,
    idle: RefCell<VecDeque<Waker>>,
    closed: Cell<bool>,
}

impl Dispatch {
    /// Queues a due ticket and wakes one idle connection.
    pub(crate) fn push(&self, ticket: Ticket) {
        self.queue.borrow_mut().push_back(ticket);
        let waker = self.idle.borrow_mut().pop_front();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Puts a ticket back at the head of the queue (it was taken by a connection that
    /// could not send it) and wakes one idle connection.
    pub(crate) fn push_front(&self, ticket: Ticket) {
        self.queue.borrow_mut().push_front(ticket);
        let waker = self.idle.borrow_mut().pop_front();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// No more tickets will come: idle connections may end.
    pub(crate) fn close(&self) {
        self.closed.set(true);
        let wakers: Vec<Waker> = self.idle.borrow_mut().drain(..).collect();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Tickets released but not taken by any connection yet.
    pub(crate) fn backlog(&self) -> usize {
        self.queue.borrow().len()
    }

    /// Removes and returns every ticket not taken yet.
    pub(crate) fn take_backlog(&self) -> Vec<Ticket> {
        self.queue.borrow_mut().drain(..).collect()
    }

    /// The next ticket, waiting while there is none; `None` once closed and empty.
    /// Cancel-safe: a wait dropped before it took a ticket leaves the idle list, and if
    /// a ticket had already woken it, passes the wake-up on to the next idle connection.
    pub(crate) async fn next(&self) -> Option<Ticket> {
        let mut wait = Wait {
            dispatch: self,
            waker: None,
        };
        poll_fn(|cx| {
            if let Some(ticket) = self.queue.borrow_mut().pop_front() {
                wait.waker = None;
                return Poll::Ready(Some(ticket));
            }
            if self.closed.get() {
                wait.waker = None;
                return Poll::Ready(None);
            }
            let mut idle = self.idle.borrow_mut();
            // tokio polls a task only when it is woken, and a waker leaves the list when it
            // is woken, so one registration per wait is enough; a spurious poll must not
            // add a second entry (a ticket could then wake a busy connection only).
            let present = wait.waker.is_some() && idle.iter().any(|w| w.will_wake(cx.waker()));
            if !present {
                idle.push_back(cx.waker().clone());
                wait.waker = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

/// A connection's wait for a ticket, undone if the wait is dropped.
struct Wait<'a> {
    dispatch: &'a Dispatch,
    /// The waker registered, while the wait is on.
    waker: Option<Waker>,
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let Some(mine) = self.waker.take() else {
            return;
        };
        let mut idle = self.dispatch.idle.borrow_mut();
        let before = idle.len();
        idle.retain(|w| !w.will_wake(&mine));
        let woken = idle.len() == before;
        let next = (woken && !self.dispatch.queue.borrow().is_empty())
            .then(|| idle.pop_front())
            .flatten();
        drop(idle);
        if let Some(waker) = next {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    fn ticket(seq: u64) -> Ticket {
        Ticket {
            seq,
            intended_ns: seq,
            released_ns: seq,
            warmup: false,
            retry: None,
        }
    }

    #[tokio::test]
    async fn waiting_connections_get_tickets_in_order_then_none() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let dispatch = Rc::new(Dispatch::default());
                let got = Rc::new(RefCell::new(Vec::new()));
                let mut tasks = Vec::new();
                for _ in 0..3 {
                    let (d, g) = (dispatch.clone(), got.clone());
                    tasks.push(tokio::task::spawn_local(async move {
                        while let Some(t) = d.next().await {
                            g.borrow_mut().push(t.seq);
                            tokio::task::yield_now().await;
                        }
                    }));
                }
                tokio::task::yield_now().await;
                for seq in 0..10 {
                    dispatch.push(ticket(seq));
                }
                dispatch.close();
                for t in tasks {
                    t.await.unwrap();
                }
                let mut seen = got.borrow().clone();
                seen.sort_unstable();
                assert_eq!(seen, (0..10).collect::<Vec<_>>());
            })
            .await;
    }

    /// A wait dropped after a ticket woke it hands the wake-up on: the ticket is not
    /// left in the queue while another connection sleeps.
    #[tokio::test]
    async fn a_dropped_wait_passes_its_wake_up_on() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let dispatch = Rc::new(Dispatch::default());
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let d = dispatch.clone();
                // Waits for a ticket or a stop, whichever is first: the stop will win.
                let quitter = tokio::task::spawn_local(async move {
                    tokio::select! {
                        biased;
                        _ = stopped => None,
                        t = d.next() => t,
                    }
                });
                let d = dispatch.clone();
                let taker = tokio::task::spawn_local(async move { d.next().await });
                tokio::task::yield_now().await;
                // The ticket wakes the quitter (first in line), which is stopped instead.
                dispatch.push(ticket(7));
                let _ = stop.send(());
                assert_eq!(quitter.await.unwrap(), None);
                let got = tokio::time::timeout(std::time::Duration::from_secs(1), taker)
                    .await
                    .expect("the other connection was woken")
                    .unwrap();
                assert_eq!(got.map(|t| t.seq), Some(7));
            })
            .await;
    }
}
