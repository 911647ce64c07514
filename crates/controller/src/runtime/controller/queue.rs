//! The work queue of one kind of set, in place of kube-runtime's controller loop: a set is
//! reconciled the instant a change asks for it, one reconcile at a time per set, and again when
//! its reconcile asks to be (a timer).
//!
//! Why not kube-runtime's: its scheduler puts every request, even one due now, on a timer
//! (`DelayQueue`, which rounds a deadline up to its next millisecond, then tokio's timer rounds
//! up again), so every reaction waited 1–2 ms before its reconcile began: a fifth of what a
//! drain's claim deletion takes in all (issue 27, `reaction.rs`). Here only requeues wait on a
//! timer. What it keeps of kube-runtime's semantics:
//! - nothing runs before the sets are listed (the requests are kept until then);
//! - a set's reconciles never overlap: a request while one runs runs it once more when it
//!   ends, and the requeue of the one that ended is then dropped (the next one asks its own);
//! - a request due earlier replaces a requeue due later;
//! - a set gone from the cache is not reconciled (nor requeued);
//! - a stop starts nothing new and ends once the reconciles in progress have ended, or, when
//!   its caller gives up on them, once they have been aborted and have ended (so none acts
//!   after `run` returned);
//! - a requeue is due at most [`LONGEST_REQUEUE`] ahead (kube-rs#1772: a timer further away
//!   panics).
//!
//! Reconciles run as tasks of their own, so a long one holds up neither the queue nor others.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::task::{Id, JoinSet};
use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};
use tracing::{debug, error};

/// When a set's reconcile asks to be run again if nothing changes meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Requeue(Option<Duration>);

impl Requeue {
    /// Run again after `delay`, or sooner if a change asks.
    pub(crate) const fn after(delay: Duration) -> Self {
        Self(Some(delay))
    }

    /// Run again only when a change asks.
    pub(crate) const fn await_change() -> Self {
        Self(None)
    }

    /// The delay asked for, if any.
    pub(crate) const fn delay(self) -> Option<Duration> {
        self.0
    }
}

/// Which keys run, which are to run again once they end, and which wait on a timer: the
/// queue's bookkeeping, without the tasks and the clock (tested on its own).
#[derive(Debug)]
struct Ledger<T> {
    /// Keys whose reconcile runs, each with whether it was asked for meanwhile.
    running: HashMap<T, bool>,
    /// Keys due later, each with its timer and deadline.
    due: HashMap<T, (delay_queue::Key, Instant)>,
    timers: DelayQueue<T>,
    /// A stop began: nothing runs again, no timer is set.
    stopped: bool,
}

impl<T> Default for Ledger<T> {
    fn default() -> Self {
        Self {
            running: HashMap::new(),
            due: HashMap::new(),
            timers: DelayQueue::new(),
            stopped: false,
        }
    }
}

impl<T: Clone + Eq + Hash> Ledger<T> {
    /// A request for `key` now: whether to start it (it is marked running), or it runs once
    /// more when the one in progress ends. A timer it had is dropped: the run asks its own.
    fn request(&mut self, key: &T) -> bool {
        if let Some(again) = self.running.get_mut(key) {
            *again = true;
            return false;
        }
        if let Some((timer, _)) = self.due.remove(key) {
            self.timers.remove(&timer);
        }
        self.running.insert(key.clone(), false);
        true
    }

    /// `key`'s reconcile ended at `now`, asking for `requeue`: whether to start it again at
    /// once (it was asked for meanwhile; the requeue is dropped), else its timer is set.
    fn ended(&mut self, key: &T, requeue: Requeue, now: Instant) -> bool {
        match self.running.remove(key) {
            Some(true) if !self.stopped => {
                self.running.insert(key.clone(), false);
                true
            }
            _ => {
                if let Some(after) = requeue.delay().filter(|_| !self.stopped) {
                    self.set_timer(key, now + after);
                }
                false
            }
        }
    }

    /// Due at `at` (at most [`LONGEST_REQUEUE`] ahead), unless due sooner already.
    fn set_timer(&mut self, key: &T, at: Instant) {
        let at = at.min(Instant::now() + LONGEST_REQUEUE);
        match self.due.get_mut(key) {
            Some((_, sooner)) if *sooner <= at => {}
            Some((timer, when)) => {
                self.timers.reset_at(timer, at);
                *when = at;
            }
            None => {
                let timer = self.timers.insert_at(key.clone(), at);
                self.due.insert(key.clone(), (timer, at));
            }
        }
    }

    /// A timer went off: its key is no longer due.
    fn expired(&mut self, key: &T) {
        self.due.remove(key);
    }

    /// A stop began: nothing runs again, no timer goes off.
    fn stop(&mut self) {
        self.stopped = true;
        self.due.clear();
        self.timers.clear();
    }
}

/// What the queue asks of the reconcile it drives.
pub(super) trait Reconciler<K>: Send + 'static {
    /// The future of one reconcile.
    type Fut: Future<Output = Requeue> + Send + 'static;
    /// Starts the reconcile of `set`.
    fn start(&self, set: Arc<K>) -> Self::Fut;
}

impl<K, F, Fut> Reconciler<K> for F
where
    F: Fn(Arc<K>) -> Fut + Send + 'static,
    Fut: Future<Output = Requeue> + Send + 'static,
{
    type Fut = Fut;
    fn start(&self, set: Arc<K>) -> Fut {
        self(set)
    }
}

/// How long a set waits after its reconcile panicked (a bug: logged as an error).
const AFTER_PANIC: Duration = Duration::from_secs(5);

/// The furthest ahead a requeue is due (as kube-runtime's: `DelayQueue` panics on a deadline
/// more than about two years ahead).
pub(super) const LONGEST_REQUEUE: Duration = Duration::from_secs(180 * 24 * 3600);

/// Runs the reconciles of the sets in `sets` that `requests` ask for (and that their
/// reconciles ask for again), as the module says, until `stop` resolves or `requests` ends,
/// and then until the reconciles in progress have ended: `None`. If `abandon` resolves first,
/// they are aborted, and once they have ended: `Some` of what it resolved to.
pub(super) async fn run<K, T>(
    sets: Store<K>,
    requests: impl Stream<Item = ObjectRef<K>> + Send,
    reconciler: impl Reconciler<K>,
    stop: impl Future<Output = ()> + Send,
    abandon: impl Future<Output = T> + Send,
) -> Option<T>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let mut ledger: Ledger<ObjectRef<K>> = Ledger::default();
    let mut tasks: JoinSet<Requeue> = JoinSet::new();
    let mut keys: HashMap<Id, ObjectRef<K>> = HashMap::new();
    // Asked for before the sets were listed.
    let mut early: HashSet<ObjectRef<K>> = HashSet::new();
    let mut listed = false;
    let mut stopping = false;
    let mut abandoned = None;

    let start = |key: ObjectRef<K>,
                 ledger: &mut Ledger<ObjectRef<K>>,
                 tasks: &mut JoinSet<Requeue>,
                 keys: &mut HashMap<Id, ObjectRef<K>>| {
        match sets.get(&key) {
            Some(set) => {
                let handle = tasks.spawn(reconciler.start(set));
                keys.insert(handle.id(), key);
            }
            None => {
                // Gone from the cache: nothing to reconcile, nothing to requeue.
                debug!(set = %key, "not cached (deleted); not reconciled");
                ledger.ended(&key, Requeue::await_change(), Instant::now());
            }
        }
    };

    let requests = requests.fuse();
    tokio::pin!(requests);
    let ready = sets.wait_until_ready();
    tokio::pin!(ready);
    tokio::pin!(stop);
    tokio::pin!(abandon);
    loop {
        if stopping && tasks.is_empty() {
            return abandoned;
        }
        tokio::select! {
            () = &mut stop, if !stopping => {
                stopping = true;
                early.clear();
                ledger.stop();
            }
            given_up = &mut abandon, if abandoned.is_none() => {
                abandoned = Some(given_up);
                stopping = true;
                early.clear();
                ledger.stop();
                tasks.abort_all();
            }
            result = &mut ready, if !listed => {
                listed = true;
                if result.is_err() {
                    // The cache's writer was dropped: nothing can be reconciled any more.
                    stopping = true;
                    continue;
                }
                for key in std::mem::take(&mut early) {
                    if ledger.request(&key) {
                        start(key, &mut ledger, &mut tasks, &mut keys);
                    }
                }
            }
            request = requests.next(), if !stopping => match request {
                Some(key) if !listed => {
                    early.insert(key);
                }
                Some(key) => {
                    if ledger.request(&key) {
                        start(key, &mut ledger, &mut tasks, &mut keys);
                    }
                }
                None => {
                    stopping = true;
                    ledger.stop();
                }
            },
            Some(expired) = ledger.timers.next(), if listed && !stopping => {
                let key = expired.into_inner();
                ledger.expired(&key);
                if ledger.request(&key) {
                    start(key, &mut ledger, &mut tasks, &mut keys);
                }
            }
            Some(joined) = tasks.join_next_with_id() => {
                let (id, requeue) = match joined {
                    Ok((id, requeue)) => (id, requeue),
                    Err(e) => {
                        // (Cancelled: abandoned at a stop.)
                        if e.is_panic() {
                            error!(error = %e, "a reconcile panicked; the set is reconciled again in 5 s");
                        }
                        (e.id(), Requeue::after(AFTER_PANIC))
                    }
                };
                let Some(key) = keys.remove(&id) else { continue };
                if ledger.ended(&key, requeue, Instant::now()) {
                    start(key, &mut ledger, &mut tasks, &mut keys);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    #[tokio::test]
    async fn a_request_starts_at_once_unless_running() {
        let mut l = Ledger::default();
        assert!(l.request(&"a"));
        assert!(!l.request(&"a"), "running: not started twice");
        assert!(l.request(&"b"), "another key is not held up");
    }

    #[tokio::test]
    async fn a_request_while_running_runs_once_more_and_drops_the_requeue() {
        let mut l = Ledger::default();
        assert!(l.request(&"a"));
        assert!(!l.request(&"a"));
        assert!(!l.request(&"a"));
        assert!(l.ended(&"a", Requeue::after(Duration::from_secs(9)), at(0)));
        assert!(
            l.due.is_empty(),
            "the requeue of the run that ended is dropped"
        );
        assert!(
            !l.ended(&"a", Requeue::await_change(), at(0)),
            "once, not per request"
        );
        assert!(l.running.is_empty());
    }

    #[tokio::test]
    async fn an_ended_run_sets_its_timer_and_a_request_replaces_it() {
        let mut l = Ledger::default();
        assert!(l.request(&"a"));
        assert!(!l.ended(&"a", Requeue::after(Duration::from_secs(9)), at(0)));
        assert_eq!(l.due.len(), 1);
        assert_eq!(l.timers.len(), 1);
        assert!(l.request(&"a"), "due later, asked for now: runs now");
        assert!(l.due.is_empty() && l.timers.is_empty());
    }

    #[tokio::test]
    async fn await_change_sets_no_timer() {
        let mut l = Ledger::default();
        assert!(l.request(&"a"));
        assert!(!l.ended(&"a", Requeue::await_change(), at(0)));
        assert!(l.due.is_empty() && l.running.is_empty());
    }

    #[tokio::test]
    async fn the_sooner_deadline_wins() {
        let mut l = Ledger::default();
        let t0 = Instant::now();
        let secs = |s| t0 + Duration::from_secs(s);
        l.set_timer(&"a", secs(5));
        l.set_timer(&"a", secs(9));
        assert_eq!(l.due[&"a"].1, secs(5), "a later deadline does not delay it");
        l.set_timer(&"a", secs(1));
        assert_eq!(l.due[&"a"].1, secs(1), "a sooner one brings it forward");
        assert_eq!(l.timers.len(), 1, "one timer per key");
    }

    #[tokio::test]
    async fn a_requeue_years_ahead_is_due_at_most_the_longest_ahead() {
        let mut l = Ledger::default();
        assert!(l.request(&"a"));
        let now = Instant::now();
        assert!(!l.ended(
            &"a",
            Requeue::after(Duration::from_secs(3 * 365 * 86_400)),
            now
        ));
        assert!(l.due[&"a"].1 <= Instant::now() + LONGEST_REQUEUE);
    }

    #[tokio::test]
    async fn a_stop_drops_reruns_and_timers() {
        let mut l = Ledger::default();
        assert!(l.request(&"a"));
        assert!(!l.request(&"a"));
        l.set_timer(&"b", at(1_000));
        l.stop();
        assert!(!l.ended(&"a", Requeue::after(Duration::from_secs(1)), at(0)));
        assert!(l.due.is_empty() && l.timers.is_empty());
    }

    mod run {
        use std::sync::Mutex;

        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::runtime::reflector::store::Writer;
        use kube::runtime::watcher::Event;
        use tokio::sync::{mpsc, oneshot};

        use super::super::*;
        use crate::runtime::controller::serve::tokio_stream_from;

        fn cm(name: &str) -> ConfigMap {
            let mut c = ConfigMap::default();
            c.metadata.name = Some(name.to_owned());
            c.metadata.namespace = Some("ns".to_owned());
            c
        }

        fn key(name: &str) -> ObjectRef<ConfigMap> {
            ObjectRef::new(name).within("ns")
        }

        /// A reconciler that records each start (name, instant) and holds each reconcile until
        /// the test releases it with the requeue to return.
        #[derive(Clone, Default)]
        struct Probe {
            starts: Arc<Mutex<Vec<(String, Instant)>>>,
            holds: Arc<Mutex<Vec<oneshot::Sender<Requeue>>>>,
            hold: bool,
        }

        impl Probe {
            fn holding() -> Self {
                Self {
                    hold: true,
                    ..Self::default()
                }
            }
            fn reconciler(&self) -> impl Reconciler<ConfigMap> {
                let probe = self.clone();
                move |set: Arc<ConfigMap>| {
                    let probe = probe.clone();
                    async move {
                        probe
                            .starts
                            .lock()
                            .unwrap()
                            .push((set.metadata.name.clone().unwrap(), Instant::now()));
                        if !probe.hold {
                            return Requeue::await_change();
                        }
                        let (tx, rx) = oneshot::channel();
                        probe.holds.lock().unwrap().push(tx);
                        rx.await.unwrap_or(Requeue::await_change())
                    }
                }
            }
            fn names(&self) -> Vec<String> {
                self.starts
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(n, _)| n.clone())
                    .collect()
            }
            fn release(&self, requeue: Requeue) {
                let tx = self.holds.lock().unwrap().remove(0);
                let _ = tx.send(requeue);
            }
        }

        async fn settle() {
            for _ in 0..50 {
                tokio::task::yield_now().await;
            }
        }

        struct Harness {
            writer: Writer<ConfigMap>,
            tx: mpsc::UnboundedSender<ObjectRef<ConfigMap>>,
            stop: Option<oneshot::Sender<()>>,
            abandon: Option<oneshot::Sender<()>>,
            done: tokio::task::JoinHandle<Option<&'static str>>,
        }

        fn harness(probe: &Probe) -> Harness {
            let writer = Writer::<ConfigMap>::default();
            let sets = writer.as_reader();
            let (tx, rx) = mpsc::unbounded_channel();
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            let (abandon_tx, abandon_rx) = oneshot::channel::<()>();
            let done = tokio::spawn(run(
                sets,
                tokio_stream_from(rx),
                probe.reconciler(),
                async move {
                    let _ = stop_rx.await;
                },
                async move {
                    if abandon_rx.await.is_err() {
                        std::future::pending::<()>().await;
                    }
                    "abandoned"
                },
            ));
            Harness {
                writer,
                tx,
                stop: Some(stop_tx),
                abandon: Some(abandon_tx),
                done,
            }
        }

        fn list(h: &mut Harness, names: &[&str]) {
            h.writer.apply_watcher_event(&Event::Init);
            for n in names {
                h.writer.apply_watcher_event(&Event::InitApply(cm(n)));
            }
            h.writer.apply_watcher_event(&Event::InitDone);
        }

        #[tokio::test(start_paused = true)]
        async fn a_request_starts_its_reconcile_at_the_same_instant() {
            // kube-runtime's scheduler would start it a timer tick (1 ms or more) later.
            let probe = Probe::default();
            let mut h = harness(&probe);
            list(&mut h, &["a"]);
            settle().await;
            let sent = Instant::now();
            h.tx.send(key("a")).unwrap();
            settle().await;
            let starts = probe.starts.lock().unwrap().clone();
            assert_eq!(starts.len(), 1);
            assert_eq!(
                starts[0].1, sent,
                "no timer between the request and the reconcile"
            );
        }

        #[tokio::test(start_paused = true)]
        async fn requests_before_the_sets_are_listed_run_once_they_are() {
            let probe = Probe::default();
            let mut h = harness(&probe);
            h.tx.send(key("a")).unwrap();
            h.tx.send(key("a")).unwrap();
            settle().await;
            assert!(
                probe.names().is_empty(),
                "nothing runs before the sets are listed"
            );
            list(&mut h, &["a"]);
            settle().await;
            assert_eq!(probe.names(), ["a"]);
        }

        #[tokio::test(start_paused = true)]
        async fn requests_during_a_reconcile_run_it_once_more_after_it() {
            let probe = Probe::holding();
            let mut h = harness(&probe);
            list(&mut h, &["a", "b"]);
            h.tx.send(key("a")).unwrap();
            settle().await;
            for _ in 0..3 {
                h.tx.send(key("a")).unwrap();
            }
            h.tx.send(key("b")).unwrap();
            settle().await;
            assert_eq!(
                probe.names(),
                ["a", "b"],
                "a set's reconciles never overlap"
            );
            // `a` asks for a requeue in 60 s; it is dropped for the run asked for meanwhile.
            probe.release(Requeue::after(Duration::from_secs(60)));
            settle().await;
            assert_eq!(probe.names(), ["a", "b", "a"]);
            probe.release(Requeue::await_change()); // b
            probe.release(Requeue::await_change()); // a again
            settle().await;
            tokio::time::sleep(Duration::from_secs(120)).await;
            settle().await;
            assert_eq!(probe.names(), ["a", "b", "a"], "once, and no requeue left");
        }

        #[tokio::test(start_paused = true)]
        async fn a_requeue_runs_it_again_after_its_delay_and_a_request_sooner() {
            let probe = Probe::holding();
            let mut h = harness(&probe);
            list(&mut h, &["a"]);
            h.tx.send(key("a")).unwrap();
            settle().await;
            let ended = Instant::now();
            probe.release(Requeue::after(Duration::from_secs(30)));
            tokio::time::sleep(Duration::from_secs(31)).await;
            settle().await;
            let starts = probe.starts.lock().unwrap().clone();
            assert_eq!(starts.len(), 2);
            assert_eq!(starts[1].1.duration_since(ended).as_secs(), 30);
            // Due in 30 s again, asked for now: runs now, and the timer is gone.
            probe.release(Requeue::after(Duration::from_secs(30)));
            settle().await;
            h.tx.send(key("a")).unwrap();
            settle().await;
            assert_eq!(probe.names().len(), 3);
            probe.release(Requeue::await_change());
            tokio::time::sleep(Duration::from_secs(60)).await;
            settle().await;
            assert_eq!(probe.names().len(), 3, "the earlier timer was replaced");
        }

        #[tokio::test(start_paused = true)]
        async fn a_set_not_cached_is_not_reconciled() {
            let probe = Probe::default();
            let mut h = harness(&probe);
            list(&mut h, &["a"]);
            h.tx.send(key("gone")).unwrap();
            h.tx.send(key("a")).unwrap();
            settle().await;
            assert_eq!(probe.names(), ["a"]);
        }

        #[tokio::test(start_paused = true)]
        async fn a_stop_waits_for_the_reconciles_in_progress_and_starts_none() {
            let probe = Probe::holding();
            let mut h = harness(&probe);
            list(&mut h, &["a", "b"]);
            h.tx.send(key("a")).unwrap();
            settle().await;
            h.tx.send(key("a")).unwrap(); // would run again
            settle().await;
            let _ = h.stop.take().unwrap().send(());
            settle().await;
            h.tx.send(key("b")).ok();
            settle().await;
            assert!(!h.done.is_finished(), "waits for the reconcile in progress");
            probe.release(Requeue::after(Duration::from_secs(1)));
            settle().await;
            assert!(h.done.is_finished(), "ends once it ended");
            assert_eq!(h.done.await.unwrap(), None, "none abandoned");
            assert_eq!(probe.names(), ["a"], "nothing started after the stop began");
        }

        #[tokio::test(start_paused = true)]
        async fn reconciles_given_up_on_are_aborted_and_have_ended_when_it_returns() {
            let probe = Probe::holding();
            let mut h = harness(&probe);
            list(&mut h, &["a", "b"]);
            h.tx.send(key("a")).unwrap();
            h.tx.send(key("b")).unwrap();
            settle().await;
            let _ = h.stop.take().unwrap().send(());
            settle().await;
            assert!(
                !h.done.is_finished(),
                "waits for the reconciles in progress"
            );
            let _ = h.abandon.take().unwrap().send(());
            settle().await;
            assert!(h.done.is_finished(), "aborted, without their release");
            assert_eq!(h.done.await.unwrap(), Some("abandoned"));
            assert!(
                probe.holds.lock().unwrap().iter().all(|tx| tx.is_closed()),
                "both reconciles were dropped, not left running"
            );
        }

        #[tokio::test(start_paused = true)]
        async fn a_reconcile_that_panics_runs_again_later_and_others_go_on() {
            let starts: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
            let reconciler = {
                let starts = Arc::clone(&starts);
                move |set: Arc<ConfigMap>| {
                    let starts = Arc::clone(&starts);
                    async move {
                        let name = set.metadata.name.clone().unwrap();
                        let first = {
                            let mut s = starts.lock().unwrap();
                            let first = !s.iter().any(|(n, _)| *n == name);
                            s.push((name.clone(), Instant::now()));
                            first
                        };
                        assert!(!(first && name == "boom"), "a bug");
                        Requeue::await_change()
                    }
                }
            };
            let mut writer = Writer::<ConfigMap>::default();
            let (tx, rx) = mpsc::unbounded_channel();
            let _done = tokio::spawn(run(
                writer.as_reader(),
                tokio_stream_from(rx),
                reconciler,
                std::future::pending(),
                std::future::pending::<()>(),
            ));
            writer.apply_watcher_event(&Event::Init);
            writer.apply_watcher_event(&Event::InitApply(cm("boom")));
            writer.apply_watcher_event(&Event::InitApply(cm("a")));
            writer.apply_watcher_event(&Event::InitDone);
            let t0 = Instant::now();
            tx.send(key("boom")).unwrap();
            settle().await;
            tx.send(key("a")).unwrap();
            settle().await;
            tokio::time::sleep(AFTER_PANIC + Duration::from_millis(10)).await;
            settle().await;
            let starts = starts.lock().unwrap().clone();
            let names: Vec<&str> = starts.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["boom", "a", "boom"]);
            assert_eq!(starts[2].1.duration_since(t0), AFTER_PANIC);
        }

        #[tokio::test(start_paused = true)]
        async fn a_stop_before_the_sets_are_listed_ends_at_once() {
            let probe = Probe::default();
            let mut h = harness(&probe);
            h.tx.send(key("a")).unwrap();
            let _ = h.stop.take().unwrap().send(());
            settle().await;
            assert!(h.done.is_finished());
            assert!(probe.names().is_empty());
        }
    }
}
