//! Urgent writes first: while a drain pod's create or a drained claim's delete is in flight,
//! the writes that can wait (a new drain pod's record on its claims, the status annotations,
//! Events) hold back until none has been for a quiet spell, for at most a bound.
//!
//! On a busy API server every request slows the others (the test machine's 2 cores run the API
//! server, etcd and the node that is stopping the pods), and a reaction is measured by its
//! create or its delete alone: a scale-down of ten pods used to send some fifty requests in
//! half a second (each drain pod's create, live read, record, status and Events) where a bare
//! reactor sends ten. Holding the others back until the creates have answered keeps those in
//! the gaps between them (issue 27). The pods of a scale-down go tens to hundreds of
//! milliseconds apart, so a write that went as soon as one create answered met the next one:
//! a trace of the reaction benchmark showed four or five writes (the record, two Events, the
//! status) sent the instant each create answered, still in flight when the next pod's create
//! went. So they wait for a quiet spell ([`QUIET`]) after the last urgent write. Nothing that
//! waits here decides anything: a record held back is shown to the reconciles as written
//! meanwhile (`recent`), a status is a report, an Event a message; and the bounds keep a steady
//! stream of urgent writes from holding them back for longer: [`RECORD_AT_MOST`] for a record
//! (its claim's delete waits for it), [`REPORT_AT_MOST`] for a status or an Event.
//!
//! And they go a few at a time ([`AT_ONCE`] of each kind, [`Urgency::turn`]), each after its
//! own look at the quiet spell: held back for a burst of ten drains, some forty of them (ten
//! records, a status, thirty Events) would otherwise all go the instant the spell is reached,
//! each on a connection of its own, and the next pod's create, if its pod goes then, would
//! meet all of them at the API server (the create's round trip in bursts had a tail twice the
//! floor's: development.md, "An eighth round"). So a write may also wait for a place beyond
//! its bound: behind at most the writes of its kind queued before it, each of which keeps its
//! place for [`PLACE_AT_MOST`] at most ([`Turn::during`]), so that one that hangs holds up no
//! other for longer.
//!
//! And they wait for a scale-down to finish removing pods ([`Urgency::removing`]): the pods of
//! a burst go over one to three seconds, tens to hundreds of milliseconds apart, and paced
//! writes that go in the gaps still meet the next pod's create (the full reaction run on
//! pacing alone: the create's round trip in bursts p50 18.3 ms against the floor's 15.4, while
//! level in singles; development.md, "A ninth round"). So while a stateful pod of a set that
//! concerns us is being deleted, they hold back, for [`REMOVAL_AT_MOST`] at most; its going
//! starts the quiet spell again, which its drain pod's create, sent within milliseconds, then
//! extends. While a claim's delete waits for its claim's earlier writes
//! ([`Urgency::claim_waits`]), records are not held back at all: the one it waits for may be
//! among them, and a drain that finished within the burst has its claims deleted without
//! waiting for the burst's end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// How long no urgent write must have been in flight before the writes that can wait go.
pub const QUIET: Duration = Duration::from_millis(100);

/// The longest a drain pod's record is held back by urgent writes.
pub const RECORD_AT_MOST: Duration = Duration::from_millis(250);

/// The longest a status or an Event is held back by urgent writes.
pub const REPORT_AT_MOST: Duration = Duration::from_secs(1);

/// How many writes that can wait, of each [`Waiting`] kind, are in flight at most.
pub const AT_ONCE: usize = 2;

/// The longest a write that can wait is held back by pods being removed ([`Urgency::removing`]),
/// before it waits for the quiet spell: longer than a scale-down's burst takes to remove its
/// pods (the reaction benchmark's take 0.5 to 2.4 s), short beside a drain.
pub const REMOVAL_AT_MOST: Duration = Duration::from_secs(3);

/// How long a pod being deleted counts as being removed at most: a pod whose Delete event was
/// missed (a watch that relisted) is not waited for after that, nor one that takes its whole
/// grace period.
pub const REMOVING_AT_MOST: Duration = Duration::from_secs(60);

/// The kinds of writes that can wait: each has its bound and its own [`AT_ONCE`] places, so
/// that a record, which its claim's delete waits for, never queues behind Events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// A new drain pod's record on its claims: held back for [`RECORD_AT_MOST`] at most.
    Record,
    /// A status annotation or an Event: held back for [`REPORT_AT_MOST`] at most.
    Report,
}

impl Waiting {
    /// The longest a write of this kind is held back by urgent writes.
    pub fn at_most(self) -> Duration {
        match self {
            Self::Record => RECORD_AT_MOST,
            Self::Report => REPORT_AT_MOST,
        }
    }
}

/// The urgent writes in flight, which the others wait for.
#[derive(Debug)]
pub struct Urgency {
    in_flight: AtomicUsize,
    none_in_flight: Notify,
    /// When the last urgent write answered (`None`: none yet).
    last_answered: Mutex<Option<Instant>>,
    quiet: Duration,
    /// The places of the records in flight, and of the reports ([`Urgency::turn`]).
    records: Semaphore,
    reports: Semaphore,
    /// The pods being removed, by UID, since when ([`Urgency::removing`]).
    removing: Mutex<HashMap<String, Instant>>,
    /// The claim deletes waiting for their claims' earlier writes ([`Urgency::claim_waits`]).
    claims_waiting: AtomicUsize,
    /// Told of each change of the removals and the claims waiting.
    changed: Notify,
}

/// The longest a write that can wait keeps its place ([`Turn::during`]).
pub const PLACE_AT_MOST: Duration = Duration::from_secs(1);

/// A write that can wait, given its turn ([`Urgency::turn`]): it holds one of its kind's places
/// until dropped, or for [`PLACE_AT_MOST`] of the write it runs ([`Turn::during`]).
#[derive(Debug)]
pub struct Turn<'a> {
    _place: SemaphorePermit<'a>,
}

impl Turn<'_> {
    /// Runs `write`, keeping the place for [`PLACE_AT_MOST`] at most: a write that hangs (an
    /// API call that waits for the client's timeout, minutes) does not keep the others of its
    /// kind waiting, nor the claims' deletes that wait for their records.
    pub async fn during<F: Future>(self, write: F) -> F::Output {
        let mut write = std::pin::pin!(write);
        tokio::select! {
            out = &mut write => out,
            () = tokio::time::sleep(PLACE_AT_MOST) => {
                drop(self);
                write.await
            }
        }
    }
}

impl Default for Urgency {
    fn default() -> Self {
        Self::new(QUIET)
    }
}

impl Urgency {
    /// Writes that can wait go once no urgent write has been in flight for `quiet`.
    pub fn new(quiet: Duration) -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            none_in_flight: Notify::new(),
            last_answered: Mutex::new(None),
            quiet,
            records: Semaphore::new(AT_ONCE),
            reports: Semaphore::new(AT_ONCE),
            removing: Mutex::new(HashMap::new()),
            claims_waiting: AtomicUsize::new(0),
            changed: Notify::new(),
        }
    }

    /// A stateful pod (by UID) of a set that concerns us is being deleted: the writes that can
    /// wait hold back until it is gone ([`Urgency::removed`]), for [`REMOVAL_AT_MOST`] at most.
    pub fn removing(&self, uid: &str) {
        let mut removing = self.removing.lock().expect("urgency lock");
        removing.retain(|_, since| since.elapsed() < REMOVING_AT_MOST);
        removing.entry(uid.to_owned()).or_insert_with(Instant::now);
    }

    /// The pod is gone (or no longer being deleted): if it was being removed, the quiet spell
    /// starts again from now, so that its drain pod's create, which follows within
    /// milliseconds, is not met by the writes it held back.
    pub fn removed(&self, uid: &str) {
        let was = self
            .removing
            .lock()
            .expect("urgency lock")
            .remove(uid)
            .is_some();
        if was {
            self.quiet_from_now();
            self.changed.notify_waiters();
        }
    }

    /// The quiet spell starts again from now (as when an urgent write answers).
    fn quiet_from_now(&self) {
        // Under the lock, so two at once never store the older instant.
        let mut last = self.last_answered.lock().expect("urgency lock");
        let now = Instant::now();
        *last = Some(last.map_or(now, |before| before.max(now)));
    }

    /// Runs `write` as a write that can wait of `kind`: after its turn ([`Urgency::turn`]),
    /// keeping its place for [`PLACE_AT_MOST`] at most ([`Turn::during`]).
    pub async fn paced<F: Future>(&self, kind: Waiting, write: F) -> F::Output {
        self.turn(kind).await.during(write).await
    }

    /// Whether pods are being removed (each for [`REMOVING_AT_MOST`] at most).
    pub fn removals(&self) -> bool {
        let removing = self.removing.lock().expect("urgency lock");
        removing
            .values()
            .any(|since| since.elapsed() < REMOVING_AT_MOST)
    }

    /// A claim's delete waits for the writes of the claim before it (a new drain pod's record
    /// among them), until the guard is dropped: meanwhile records are not held back at all.
    pub fn claim_waits(self: &Arc<Self>) -> ClaimWaits {
        self.claims_waiting.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        ClaimWaits(Arc::clone(self))
    }

    /// Resolves once no pod is being removed, or after `at_most`. Whether it was held back.
    async fn after_removals(&self, at_most: Duration) -> bool {
        let until = Instant::now() + at_most;
        let mut held = false;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.removals() {
                return held;
            }
            held = true;
            // Woken by a change, and at least every 100 ms (a removal that expires tells no one).
            let next = until.min(Instant::now() + QUIET);
            let _ = tokio::time::timeout_at(next, changed).await;
            if Instant::now() >= until {
                return held;
            }
        }
    }

    /// Resolves once a claim's delete waits for its claim's earlier writes.
    async fn a_claim_waits(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.claims_waiting.load(Ordering::SeqCst) > 0 {
                return;
            }
            changed.await;
        }
    }

    /// Waits for a place among the [`AT_ONCE`] writes of `kind` in flight, then for the pods
    /// being removed ([`Urgency::removing`], [`REMOVAL_AT_MOST`] at most), then as
    /// [`Urgency::after_urgent`] for what is left of the kind's bound (counted from this call, or
    /// from the end of the wait for removals if there was one): to be held while the write is
    /// in flight. Once the bound has passed it still waits for a place, so no more than
    /// [`AT_ONCE`] of a kind are ever in flight.
    pub async fn turn(&self, kind: Waiting) -> Turn<'_> {
        let until = Instant::now() + kind.at_most();
        let places = match kind {
            Waiting::Record => &self.records,
            Waiting::Report => &self.reports,
        };
        let place = places.acquire().await.expect("the places are never closed");
        let held_back = async {
            // Held back by removals, it then waits for the quiet spell for its whole bound.
            let until = if self.after_removals(REMOVAL_AT_MOST).await {
                Instant::now() + kind.at_most()
            } else {
                until
            };
            self.after_urgent(until.saturating_duration_since(Instant::now()))
                .await;
        };
        match kind {
            // A claim's delete, urgent, may be waiting for this very record: it goes now.
            Waiting::Record => tokio::select! {
                () = held_back => {}
                () = self.a_claim_waits() => {}
            },
            Waiting::Report => {
                held_back.await;
            }
        }
        Turn { _place: place }
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

    /// Resolves once no urgent write has been in flight for the quiet spell, or after
    /// `at_most`: to be awaited before a write that can wait. Whether it was held back at all.
    pub async fn after_urgent(&self, at_most: Duration) -> bool {
        let until = Instant::now() + at_most;
        let mut held = false;
        loop {
            let notified = self.none_in_flight.notified();
            tokio::pin!(notified);
            // Registered before the count is read: a last urgent write that answers in between
            // still wakes it.
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                let last = *self.last_answered.lock().expect("urgency lock");
                let quiet_from = last.map_or_else(Instant::now, |at| at + self.quiet);
                if Instant::now() >= quiet_from {
                    return held;
                }
                held = true;
                // An urgent write that starts and answers meanwhile moves the quiet spell on.
                tokio::time::sleep_until(quiet_from.min(until)).await;
            } else {
                held = true;
                if tokio::time::timeout_at(until, notified).await.is_err() {
                    return held;
                }
            }
            if Instant::now() >= until {
                return held;
            }
        }
    }
}

/// A claim's delete waiting for the claim's earlier writes ([`Urgency::claim_waits`]).
#[derive(Debug)]
pub struct ClaimWaits(Arc<Urgency>);

impl Drop for ClaimWaits {
    fn drop(&mut self) {
        self.0.claims_waiting.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// An urgent write in flight ([`Urgency::urgent`]).
#[derive(Debug)]
pub struct Urgent(Arc<Urgency>);

impl Drop for Urgent {
    fn drop(&mut self) {
        self.0.quiet_from_now();
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.none_in_flight.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn waiter(u: &Arc<Urgency>, at_most: Duration) -> tokio::task::JoinHandle<(bool, Instant)> {
        let u = Arc::clone(u);
        tokio::spawn(async move {
            let held = u.after_urgent(at_most).await;
            (held, Instant::now())
        })
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_in_flight_holds_nothing_back() {
        let u = Arc::new(Urgency::default());
        let t0 = Instant::now();
        assert!(!u.after_urgent(REPORT_AT_MOST).await);
        assert_eq!(Instant::now(), t0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_can_wait_goes_a_quiet_spell_after_the_urgent_ones_answered() {
        let u = Arc::new(Urgency::new(MS(100)));
        let (a, b) = (u.urgent(), u.urgent());
        let t0 = Instant::now();
        let w = waiter(&u, REPORT_AT_MOST);
        tokio::time::sleep(MS(10)).await;
        drop(a);
        tokio::time::sleep(MS(10)).await;
        assert!(!w.is_finished(), "one is still in flight");
        drop(b);
        tokio::time::sleep(MS(99)).await;
        assert!(!w.is_finished(), "the quiet spell has not passed");
        let (held, went) = w.await.unwrap();
        assert!(held);
        assert_eq!(went - t0, MS(120));
        assert_eq!(u.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_spell_already_passed_holds_nothing_back() {
        let u = Arc::new(Urgency::new(MS(100)));
        drop(u.urgent());
        tokio::time::sleep(MS(100)).await;
        let t0 = Instant::now();
        assert!(!u.after_urgent(REPORT_AT_MOST).await);
        assert_eq!(Instant::now(), t0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_urgent_write_in_the_quiet_spell_starts_it_again() {
        let u = Arc::new(Urgency::new(MS(100)));
        drop(u.urgent());
        let t0 = Instant::now();
        let w = waiter(&u, REPORT_AT_MOST);
        tokio::time::sleep(MS(60)).await;
        let next = u.urgent();
        tokio::time::sleep(MS(20)).await;
        drop(next);
        let (held, went) = w.await.unwrap();
        assert!(held);
        assert_eq!(went - t0, MS(180));
    }

    #[tokio::test(start_paused = true)]
    async fn urgent_writes_in_a_row_hold_it_back_for_the_bound_only() {
        let u = Arc::new(Urgency::new(MS(100)));
        let _forever = u.urgent();
        let t0 = Instant::now();
        assert!(u.after_urgent(RECORD_AT_MOST).await);
        assert_eq!(Instant::now() - t0, RECORD_AT_MOST);
    }

    #[tokio::test(start_paused = true)]
    async fn the_bound_cuts_the_quiet_spell_short() {
        let u = Arc::new(Urgency::new(MS(100)));
        drop(u.urgent());
        let t0 = Instant::now();
        assert!(u.after_urgent(MS(30)).await);
        assert_eq!(Instant::now() - t0, MS(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_urgent_write_before_it_woke_keeps_it_waiting() {
        let u = Arc::new(Urgency::new(MS(100)));
        let first = u.urgent();
        let t0 = Instant::now();
        let w = waiter(&u, REPORT_AT_MOST);
        tokio::task::yield_now().await;
        drop(first);
        let second = u.urgent();
        tokio::time::sleep(MS(50)).await;
        assert!(!w.is_finished(), "an urgent write is in flight again");
        drop(second);
        let (held, went) = w.await.unwrap();
        assert!(held);
        assert_eq!(went - t0, MS(150));
    }

    /// Starts a write of `kind` that is in flight for `lasts` once it has its turn; returns
    /// when it went (its turn given) and when it answered.
    fn write(
        u: &Arc<Urgency>,
        kind: Waiting,
        lasts: Duration,
    ) -> tokio::task::JoinHandle<(Instant, Instant)> {
        let u = Arc::clone(u);
        tokio::spawn(async move {
            let turn = u.turn(kind).await;
            let went = Instant::now();
            turn.during(tokio::time::sleep(lasts)).await;
            (went, Instant::now())
        })
    }

    #[tokio::test(start_paused = true)]
    async fn writes_that_can_wait_go_a_few_of_each_kind_at_a_time() {
        let u = Arc::new(Urgency::new(MS(100)));
        let t0 = Instant::now();
        let reports: Vec<_> = (0..5).map(|_| write(&u, Waiting::Report, MS(10))).collect();
        let record = write(&u, Waiting::Record, MS(10));
        let mut went = Vec::new();
        for r in reports {
            went.push(r.await.unwrap());
        }
        // Never more than AT_ONCE in flight at any instant.
        for (start, _) in &went {
            let in_flight = went.iter().filter(|(s, e)| s <= start && start < e).count();
            assert!(
                in_flight <= AT_ONCE,
                "{in_flight} reports in flight at once"
            );
        }
        let mut starts: Vec<_> = went.iter().map(|(s, _)| *s - t0).collect();
        starts.sort();
        assert_eq!(starts, [MS(0), MS(0), MS(10), MS(10), MS(20)]);
        // A record does not queue behind the reports.
        assert_eq!(record.await.unwrap().0, t0);
    }

    #[tokio::test(start_paused = true)]
    async fn each_write_that_can_wait_looks_at_the_quiet_spell_when_its_turn_comes() {
        let u = Arc::new(Urgency::new(MS(100)));
        let t0 = Instant::now();
        let first: Vec<_> = (0..AT_ONCE)
            .map(|_| write(&u, Waiting::Report, MS(50)))
            .collect();
        let next = write(&u, Waiting::Report, MS(10));
        tokio::time::sleep(MS(20)).await;
        // A create goes while the first reports are in flight, and answers 20 ms later.
        let create = u.urgent();
        tokio::time::sleep(MS(20)).await;
        drop(create);
        for f in first {
            assert_eq!(f.await.unwrap().0, t0);
        }
        // Its turn came at 50 ms, but the create had answered at 40: it went at 140.
        let (went, _) = next.await.unwrap();
        assert_eq!(went - t0, MS(140));
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_past_its_bound_still_waits_for_a_place() {
        let u = Arc::new(Urgency::new(MS(100)));
        let _forever = u.urgent();
        let t0 = Instant::now();
        let long: Vec<_> = (0..AT_ONCE)
            .map(|_| write(&u, Waiting::Record, MS(600)))
            .collect();
        let next = write(&u, Waiting::Record, MS(10));
        for l in long {
            // Held for the bound by the urgent write that never answers.
            assert_eq!(l.await.unwrap().0 - t0, RECORD_AT_MOST);
        }
        // Its bound passed long ago; it went when a place was free.
        assert_eq!(next.await.unwrap().0 - t0, RECORD_AT_MOST + MS(600));
    }

    #[tokio::test(start_paused = true)]
    async fn writes_that_can_wait_hold_back_while_a_pod_is_removed() {
        let u = Arc::new(Urgency::new(MS(100)));
        u.removing("p1");
        let t0 = Instant::now();
        let report = write(&u, Waiting::Report, MS(10));
        let record = write(&u, Waiting::Record, MS(10));
        tokio::time::sleep(MS(500)).await;
        assert!(!report.is_finished() && !record.is_finished());
        // The pod goes: its drain pod's create follows at once and answers 30 ms later.
        u.removed("p1");
        let create = u.urgent();
        tokio::time::sleep(MS(30)).await;
        drop(create);
        assert_eq!(
            report.await.unwrap().0 - t0,
            MS(630),
            "a quiet spell after the create"
        );
        assert_eq!(record.await.unwrap().0 - t0, MS(630));
    }

    #[tokio::test(start_paused = true)]
    async fn the_pod_going_starts_the_quiet_spell_again() {
        let u = Arc::new(Urgency::new(MS(100)));
        u.removing("p1");
        let t0 = Instant::now();
        let report = write(&u, Waiting::Report, MS(10));
        tokio::time::sleep(MS(200)).await;
        // No create follows (a pod of a rolling update, say): a quiet spell from its going.
        u.removed("p1");
        assert_eq!(report.await.unwrap().0 - t0, MS(300));
    }

    #[tokio::test(start_paused = true)]
    async fn removals_hold_back_for_their_bound_only() {
        let u = Arc::new(Urgency::new(MS(100)));
        u.removing("never-goes");
        let t0 = Instant::now();
        assert_eq!(
            write(&u, Waiting::Report, MS(10)).await.unwrap().0 - t0,
            REMOVAL_AT_MOST
        );
        // A pod being removed for longer than REMOVING_AT_MOST (its Delete missed) holds none.
        tokio::time::sleep(REMOVING_AT_MOST).await;
        let t1 = Instant::now();
        assert_eq!(write(&u, Waiting::Report, MS(10)).await.unwrap().0, t1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_of_another_set_going_or_not_being_removed_moves_nothing() {
        let u = Arc::new(Urgency::new(MS(100)));
        // Never told `removing` (not a set that concerns us): its going is no quiet spell.
        u.removed("other");
        let t0 = Instant::now();
        assert_eq!(write(&u, Waiting::Report, MS(10)).await.unwrap().0, t0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_a_claim_delete_waits_for_is_not_held_back() {
        let u = Arc::new(Urgency::new(MS(100)));
        u.removing("p1");
        let t0 = Instant::now();
        let record = write(&u, Waiting::Record, MS(10));
        let report = write(&u, Waiting::Report, MS(10));
        tokio::time::sleep(MS(200)).await;
        assert!(!record.is_finished());
        // A drain finished within the burst: its claim's delete waits for the record, while
        // another create is in flight. The record goes now: the delete is urgent too.
        let create = u.urgent();
        let waits = u.claim_waits();
        assert_eq!(record.await.unwrap().0 - t0, MS(200));
        drop(waits);
        drop(create);
        // Reports still wait for the removal.
        tokio::time::sleep(MS(100)).await;
        assert!(!report.is_finished());
        let gone = Instant::now();
        u.removed("p1");
        assert_eq!(
            report.await.unwrap().0 - gone,
            MS(100),
            "a quiet spell after"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_hangs_keeps_its_place_for_a_while_only() {
        let u = Arc::new(Urgency::new(MS(100)));
        let t0 = Instant::now();
        let hung: Vec<_> = (0..AT_ONCE)
            .map(|_| write(&u, Waiting::Report, Duration::from_secs(300)))
            .collect();
        let next = write(&u, Waiting::Report, MS(10));
        assert_eq!(next.await.unwrap().0 - t0, PLACE_AT_MOST);
        for h in hung {
            // Each still ran to its end.
            let (went, answered) = h.await.unwrap();
            assert_eq!(answered - went, Duration::from_secs(300));
        }
    }
}
