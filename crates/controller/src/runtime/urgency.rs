//! Urgent writes first: while a drain pod's create or a drained claim's delete is in flight,
//! the writes that can wait (a new drain pod's record on its claims, the status annotations,
//! Events) hold back until none is, for at most a bound.
//!
//! On a busy API server every request slows the others (the test machine's 2 cores run the API
//! server, etcd and the node that is stopping the pods), and a reaction is measured by its
//! create or its delete alone: a scale-down of ten pods used to send some fifty requests in
//! half a second (each drain pod's create, live read, record, status and Events) where a bare
//! reactor sends ten. Holding the others back until the creates have answered keeps those in
//! the gaps between them (issue 27). Nothing that waits here decides anything: a record held
//! back is shown to the reconciles as written meanwhile (`recent`), a status is a report, an
//! Event a message; and the bound keeps a steady stream of urgent writes from holding them
//! back for longer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The longest a write that can wait is held back by urgent ones.
pub const HOLD_AT_MOST: Duration = Duration::from_millis(250);

/// The urgent writes in flight, which the others wait for.
#[derive(Debug)]
pub struct Urgency {
    in_flight: AtomicUsize,
    none_in_flight: Notify,
    at_most: Duration,
}

impl Default for Urgency {
    fn default() -> Self {
        Self::new(HOLD_AT_MOST)
    }
}

impl Urgency {
    /// Writes that can wait are held back for at most `at_most`.
    pub fn new(at_most: Duration) -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            none_in_flight: Notify::new(),
            at_most,
        }
    }

    /// Marks an urgent write in flight until the guard is dropped.
    pub fn urgent(self: &Arc<Self>) -> Urgent {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Urgent(Arc::clone(self))
    }

    /// How many urgent writes are in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Resolves once no urgent write is in flight, or after the bound: to be awaited before a
    /// write that can wait. Whether it was held back at all.
    pub async fn after_urgent(&self) -> bool {
        let until = Instant::now() + self.at_most;
        let mut held = false;
        loop {
            let notified = self.none_in_flight.notified();
            tokio::pin!(notified);
            // Registered before the count is read: a last urgent write that answers in between
            // still wakes it.
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                return held;
            }
            held = true;
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return held;
            }
        }
    }
}

/// An urgent write in flight ([`Urgency::urgent`]).
#[derive(Debug)]
pub struct Urgent(Arc<Urgency>);

impl Drop for Urgent {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.none_in_flight.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn nothing_in_flight_holds_nothing_back() {
        let u = Arc::new(Urgency::default());
        let t0 = Instant::now();
        assert!(!u.after_urgent().await);
        assert_eq!(Instant::now(), t0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_can_wait_goes_once_the_urgent_ones_answered() {
        let u = Arc::new(Urgency::default());
        let (a, b) = (u.urgent(), u.urgent());
        let t0 = Instant::now();
        let waiter = tokio::spawn({
            let u = Arc::clone(&u);
            async move {
                assert!(u.after_urgent().await);
                Instant::now()
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(a);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished(), "one is still in flight");
        drop(b);
        let went = waiter.await.unwrap();
        assert_eq!(went - t0, Duration::from_millis(20));
        assert_eq!(u.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn urgent_writes_in_a_row_hold_it_back_for_the_bound_only() {
        let u = Arc::new(Urgency::new(Duration::from_millis(250)));
        let _forever = u.urgent();
        let t0 = Instant::now();
        assert!(u.after_urgent().await);
        assert_eq!(Instant::now() - t0, Duration::from_millis(250));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_urgent_write_before_it_woke_keeps_it_waiting() {
        let u = Arc::new(Urgency::default());
        let first = u.urgent();
        let waiter = tokio::spawn({
            let u = Arc::clone(&u);
            async move { u.after_urgent().await }
        });
        tokio::task::yield_now().await;
        drop(first);
        let second = u.urgent();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "an urgent write is in flight again");
        drop(second);
        assert!(waiter.await.unwrap());
    }
}
