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
    pub(crate) async fn next(&self) -> Option<Ticket> {
        let mut registered = false;
        poll_fn(|cx| {
            if let Some(ticket) = self.queue.borrow_mut().pop_front() {
                return Poll::Ready(Some(ticket));
            }
            if self.closed.get() {
                return Poll::Ready(None);
            }
            let mut idle = self.idle.borrow_mut();
            // tokio polls a task only when it is woken, and a waker leaves the list when it
            // is woken, so one registration per wait is enough; a spurious poll must not
            // add a second entry (a ticket could then wake a busy connection only).
            let present = registered && idle.iter().any(|w| w.will_wake(cx.waker()));
            if !present {
                idle.push_back(cx.waker().clone());
                registered = true;
            }
            Poll::Pending
        })
        .await
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
}
