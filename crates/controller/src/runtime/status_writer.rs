//! Writes of the status annotation (`drain-status`), off the reconcile's path.
//!
//! A reconcile holds up the next one of its set (the pods that go meanwhile wait), and a status
//! patch is one of the slower calls under load: a whole StatefulSet is written and sent to every
//! watcher of sets. So a reconcile only hands the status it wants to this writer and goes on.
//! One task per set writes the newest status wanted (one handed in while a patch is in flight
//! replaces any other that waits: only the newest is written), and retries a failed write with
//! backoff until it lands or a newer one replaces it. From the moment it is handed in, the
//! [`StatusMemo`] shows the wanted status to the next reconcile, so it neither plans from an
//! older status nor hands in the same one again.
//!
//! The status is a report: nothing that decides what is deleted is read from it. A write lost
//! to a crash is written again by the next reconcile after the restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::StatefulSet;
use tracing::{debug, warn};

use crate::plan;
use crate::runtime::leader::Leadership;
use crate::runtime::metrics::{Metrics, ReasonLabels};
use crate::runtime::status_memo::StatusMemo;
use crate::runtime::urgency::{Urgency, Waiting};
use crate::set_kind::SetKind;

/// The set a status is written on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// Its kind.
    pub kind: SetKind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID: the patch does not apply to a set recreated under the name.
    pub uid: String,
}

/// Writes `status` (`None`: removes it) on a set; `Ok(None)` when the set is gone or was
/// replaced, else the set as the API server returned it.
pub type Patcher = Arc<
    dyn Fn(Target, Option<String>) -> BoxFuture<'static, Result<Option<StatefulSet>, kube::Error>>
        + Send
        + Sync,
>;

/// A status waiting to be written.
#[derive(Clone, Debug)]
struct Job {
    target: Target,
    status: Option<String>,
    seq: u64,
    /// The leadership term it was wanted in.
    term: u64,
}

/// One set's writer.
#[derive(Default)]
struct Slot {
    /// The status waiting to be written.
    job: Option<Job>,
    /// Ends the wait before a retry when a newer status is handed in.
    wake: Arc<tokio::sync::Notify>,
}

/// Per set: its writer. A set has an entry exactly while its task runs.
type Slots = HashMap<(SetKind, String, String), Slot>;

/// The status writer of every set (see the module documentation).
#[derive(Clone)]
pub struct StatusWriter {
    inner: Arc<Inner>,
}

struct Inner {
    memo: StatusMemo,
    slots: Mutex<Slots>,
    patch: Patcher,
    leadership: Leadership,
    metrics: Arc<Metrics>,
    /// The first and the longest delay before a failed write is tried again.
    retry: (Duration, Duration),
    /// Urgent writes in flight: a status waits for them (a status wanted meanwhile replaces it).
    urgency: Arc<Urgency>,
}

impl StatusWriter {
    /// A writer that writes with `patch`, while `leadership` says this replica may act, each
    /// write after the urgent ones in flight (`urgency`).
    pub fn new(
        patch: Patcher,
        leadership: Leadership,
        metrics: Arc<Metrics>,
        retry: (Duration, Duration),
        urgency: Arc<Urgency>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                memo: StatusMemo::default(),
                slots: Mutex::default(),
                patch,
                leadership,
                metrics,
                retry,
                urgency,
            }),
        }
    }

    /// `cached` with the status last wanted or written on it, if the cache has not caught up
    /// with it yet (see [`StatusMemo::overlay`]).
    pub fn overlay(&self, cached: &StatefulSet) -> Option<StatefulSet> {
        self.inner
            .memo
            .overlay(cached, self.inner.leadership.term())
    }

    /// Forgets a set (being deleted).
    pub fn forget(&self, set: &StatefulSet) {
        self.inner.memo.forget(set);
    }

    /// Forgets every set for which `keep(namespace, name)` is false (sets gone).
    pub fn retain(&self, keep: impl Fn(&str, &str) -> bool) {
        self.inner.memo.retain(keep);
    }

    /// Has `status` written on `set` (`None`: removed), in the background, unless it is what the
    /// set shows already (read through the memo) or this replica may not act.
    pub fn submit(&self, kind: SetKind, set: &StatefulSet, status: Option<String>) {
        let inner = &self.inner;
        let term = inner.leadership.term();
        if inner.memo.status(set, term) == status || !inner.leadership.is_leading() {
            return;
        }
        let seq = inner.memo.want(set, status.clone(), term);
        let target = Target {
            kind,
            namespace: set.metadata.namespace.clone().unwrap_or_default(),
            name: set.metadata.name.clone().unwrap_or_default(),
            uid: set.metadata.uid.clone().unwrap_or_default(),
        };
        let key = (kind, target.namespace.clone(), target.name.clone());
        let job = Job {
            target,
            status,
            seq,
            term,
        };
        let mut slots = inner.slots.lock().expect("status writer lock");
        match slots.get_mut(&key) {
            // Its task runs: it writes this one next (a status waiting before it is dropped),
            // at once if it waits to retry an older one.
            Some(slot) => {
                if slot.job.is_some() {
                    debug!(statefulset = %job.target.name, namespace = %job.target.namespace, "a newer status replaces one not written yet");
                }
                slot.job = Some(job);
                slot.wake.notify_one();
            }
            None => {
                slots.insert(
                    key.clone(),
                    Slot {
                        job: Some(job),
                        wake: Arc::default(),
                    },
                );
                tokio::spawn(Arc::clone(inner).write(key));
            }
        }
    }
}

impl Inner {
    /// The task of one set: writes the status waiting until none is left.
    async fn write(self: Arc<Self>, key: (SetKind, String, String)) {
        // Failed tries of the status last tried (a newer status starts at the first delay).
        let mut failures: (u64, u32) = (0, 0);
        loop {
            {
                // Nothing left to write: no turn is taken for nothing.
                let mut slots = self.slots.lock().expect("status writer lock");
                if slots.get(&key).is_none_or(|s| s.job.is_none()) {
                    slots.remove(&key);
                    return;
                }
            }
            // After the urgent writes in flight, a few reports at a time; a status wanted
            // meanwhile is the one written.
            let turn = self.urgency.turn(Waiting::Report).await;
            let (job, wake) = {
                let mut slots = self.slots.lock().expect("status writer lock");
                let slot = slots.get_mut(&key);
                match slot.and_then(|s| Some((s.job.take()?, Arc::clone(&s.wake)))) {
                    Some(next) => next,
                    None => {
                        slots.remove(&key);
                        return;
                    }
                }
            };
            let Job {
                target,
                status,
                seq,
                term,
            } = job.clone();
            if failures.0 != seq {
                failures = (seq, 0);
            }
            if !self.leadership.is_leading() || self.leadership.term() != term {
                // The new leader plans and writes afresh.
                self.memo.abandon(&target.namespace, &target.name, seq);
                continue;
            }
            let started = tokio::time::Instant::now();
            match turn.during((self.patch)(target.clone(), status)).await {
                Ok(Some(patched)) => {
                    debug!(statefulset = %target.name, namespace = %target.namespace, took = ?started.elapsed(), "status written");
                    self.memo.written(seq, &patched);
                }
                Ok(None) => {
                    debug!(statefulset = %target.name, namespace = %target.namespace, "set gone or replaced; its status is not written");
                    self.memo.abandon(&target.namespace, &target.name, seq);
                }
                Err(e) => {
                    failures.1 += 1;
                    let delay = plan::backoff(failures.1, self.retry.0, self.retry.1);
                    warn!(statefulset = %target.name, namespace = %target.namespace, error = %e, ?delay, "failed to write the drain status; retrying");
                    self.metrics
                        .reconcile_errors
                        .get_or_create(&ReasonLabels {
                            reason: "PatchStatusFailed".to_owned(),
                        })
                        .inc();
                    {
                        // Tried again, unless a newer status is waiting by now.
                        let mut slots = self.slots.lock().expect("status writer lock");
                        if let Some(slot) = slots.get_mut(&key)
                            && slot.job.is_none()
                        {
                            slot.job = Some(job);
                        }
                    }
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = wake.notified() => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tokio::sync::{Semaphore, mpsc};

    fn set(rv: &str, status: Option<&str>) -> StatefulSet {
        StatefulSet {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                resource_version: Some(rv.into()),
                annotations: status
                    .map(|s| [(drain_api::annotations::STATUS.to_owned(), s.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..StatefulSet::default()
        }
    }

    fn status(s: &StatefulSet) -> Option<&str> {
        s.metadata
            .annotations
            .as_ref()?
            .get(drain_api::annotations::STATUS)
            .map(String::as_str)
    }

    /// A fake API server: each patch is reported on `seen`, waits for a permit of `gate`, and
    /// answers with the next of `answers` (a written set at an increasing version when empty).
    struct Fake {
        seen: mpsc::UnboundedReceiver<Option<String>>,
        gate: Arc<Semaphore>,
    }

    fn writer(answers: Vec<Result<bool, u16>>) -> (StatusWriter, Fake) {
        let (tx, seen) = mpsc::unbounded_channel();
        let gate = Arc::new(Semaphore::new(0));
        let answers = Arc::new(Mutex::new(answers.into_iter()));
        let version = Arc::new(std::sync::atomic::AtomicU64::new(200));
        let patch: Patcher = Arc::new({
            let gate = Arc::clone(&gate);
            move |_target, status| {
                let (tx, gate, answers, version) = (
                    tx.clone(),
                    Arc::clone(&gate),
                    Arc::clone(&answers),
                    Arc::clone(&version),
                );
                Box::pin(async move {
                    tx.send(status.clone()).unwrap();
                    gate.acquire().await.unwrap().forget();
                    let rv = version.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    match answers.lock().unwrap().next().unwrap_or(Ok(true)) {
                        Ok(true) => Ok(Some(set(&rv.to_string(), status.as_deref()))),
                        Ok(false) => Ok(None),
                        Err(code) => Err(kube::Error::Api(Box::new(
                            kube::core::Status::failure("no", "Forbidden").with_code(code),
                        ))),
                    }
                })
            }
        });
        let w = StatusWriter::new(
            patch,
            Leadership::always(),
            Arc::default(),
            (Duration::from_millis(5), Duration::from_millis(20)),
            Arc::default(),
        );
        (w, Fake { seen, gate })
    }

    async fn idle(w: &StatusWriter) {
        for _ in 0..200 {
            if w.inner.slots.lock().unwrap().is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the writer did not finish");
    }

    #[tokio::test]
    async fn a_status_handed_in_while_a_write_is_in_flight_replaces_the_one_waiting() {
        let (w, mut fake) = writer(vec![]);
        let cached = set("100", None);
        w.submit(SetKind::StatefulSet, &cached, Some("a".into()));
        assert_eq!(fake.seen.recv().await, Some(Some("a".into())));
        // While "a" is in flight: "b" waits, then "c" replaces it.
        w.submit(SetKind::StatefulSet, &cached, Some("b".into()));
        w.submit(SetKind::StatefulSet, &cached, Some("c".into()));
        assert_eq!(
            status(&w.overlay(&cached).unwrap()),
            Some("c"),
            "reads show the newest wanted status at once"
        );
        fake.gate.add_permits(10);
        assert_eq!(fake.seen.recv().await, Some(Some("c".into())));
        idle(&w).await;
        assert!(fake.seen.try_recv().is_err(), "\"b\" is never written");
        assert_eq!(status(&w.overlay(&set("150", None)).unwrap()), Some("c"));
        assert!(w.overlay(&set("999", Some("c"))).is_none(), "caught up");
    }

    #[tokio::test]
    async fn a_status_waits_for_the_urgent_writes_in_flight_and_the_newest_is_written() {
        let (w, mut fake) = writer(vec![]);
        let cached = set("100", None);
        let urgent = w.inner.urgency.urgent();
        w.submit(SetKind::StatefulSet, &cached, Some("a".into()));
        w.submit(SetKind::StatefulSet, &cached, Some("b".into()));
        fake.gate.add_permits(10);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            fake.seen.try_recv().is_err(),
            "held back by the create in flight"
        );
        assert_eq!(
            status(&w.overlay(&cached).unwrap()),
            Some("b"),
            "shown meanwhile"
        );
        drop(urgent);
        assert_eq!(fake.seen.recv().await, Some(Some("b".into())));
        idle(&w).await;
        assert!(fake.seen.try_recv().is_err(), "\"a\" is never written");
    }

    #[tokio::test]
    async fn the_status_the_set_shows_already_is_not_written() {
        let (w, mut fake) = writer(vec![]);
        w.submit(
            SetKind::StatefulSet,
            &set("100", Some("a")),
            Some("a".into()),
        );
        w.submit(SetKind::StatefulSet, &set("100", None), None);
        fake.gate.add_permits(10);
        w.submit(SetKind::StatefulSet, &set("100", None), Some("b".into()));
        // Handed in again while pending: shown by the memo already, so not written twice.
        w.submit(SetKind::StatefulSet, &set("100", None), Some("b".into()));
        assert_eq!(fake.seen.recv().await, Some(Some("b".into())));
        idle(&w).await;
        assert!(fake.seen.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_failed_write_is_retried_until_it_lands() {
        let (w, mut fake) = writer(vec![Err(403), Err(500)]);
        fake.gate.add_permits(10);
        w.submit(SetKind::StatefulSet, &set("100", None), Some("a".into()));
        for _ in 0..3 {
            assert_eq!(fake.seen.recv().await, Some(Some("a".into())));
        }
        idle(&w).await;
        assert_eq!(status(&w.overlay(&set("150", None)).unwrap()), Some("a"));
        let failed = w
            .inner
            .metrics
            .reconcile_errors
            .get_or_create(&ReasonLabels {
                reason: "PatchStatusFailed".into(),
            })
            .get();
        assert_eq!(failed, 2);
    }

    #[tokio::test]
    async fn a_newer_status_replaces_a_failed_one_before_its_retry() {
        let (w, mut fake) = writer(vec![Err(500)]);
        w.submit(SetKind::StatefulSet, &set("100", None), Some("a".into()));
        assert_eq!(fake.seen.recv().await, Some(Some("a".into())));
        w.submit(SetKind::StatefulSet, &set("100", None), Some("b".into()));
        fake.gate.add_permits(10);
        assert_eq!(fake.seen.recv().await, Some(Some("b".into())));
        idle(&w).await;
        assert!(fake.seen.try_recv().is_err(), "\"a\" is not retried");
    }

    #[tokio::test]
    async fn a_newer_status_is_written_at_once_while_a_failed_one_waits_to_be_retried() {
        let (w, mut fake) = writer(vec![Err(500)]);
        let long = StatusWriter {
            inner: Arc::new(Inner {
                retry: (Duration::from_secs(3600), Duration::from_secs(3600)),
                memo: StatusMemo::default(),
                slots: Mutex::default(),
                patch: Arc::clone(&w.inner.patch),
                leadership: Leadership::always(),
                metrics: Arc::default(),
                urgency: Arc::default(),
            }),
        };
        fake.gate.add_permits(10);
        long.submit(SetKind::StatefulSet, &set("100", None), Some("a".into()));
        assert_eq!(fake.seen.recv().await, Some(Some("a".into())));
        // "a" failed and waits an hour; "b" does not.
        tokio::time::sleep(Duration::from_millis(20)).await;
        long.submit(SetKind::StatefulSet, &set("100", None), Some("b".into()));
        let next = tokio::time::timeout(Duration::from_secs(5), fake.seen.recv()).await;
        assert_eq!(next.expect("written at once"), Some(Some("b".into())));
        idle(&long).await;
    }

    #[tokio::test]
    async fn a_set_gone_or_replaced_ends_its_want() {
        let (w, mut fake) = writer(vec![Ok(false)]);
        fake.gate.add_permits(10);
        w.submit(SetKind::StatefulSet, &set("100", None), Some("a".into()));
        assert_eq!(fake.seen.recv().await, Some(Some("a".into())));
        idle(&w).await;
        assert!(w.overlay(&set("100", None)).is_none());
    }

    #[tokio::test]
    async fn a_replica_that_may_not_act_writes_nothing() {
        let (tx, mut seen) = mpsc::unbounded_channel::<()>();
        let patch: Patcher = Arc::new(move |_, _| {
            let _ = tx.send(());
            Box::pin(async { Ok(None) })
        });
        let standby = Leadership::standby_for_tests();
        let w = StatusWriter::new(
            patch,
            standby,
            Arc::default(),
            (Duration::from_millis(5), Duration::from_millis(20)),
            Arc::default(),
        );
        w.submit(SetKind::StatefulSet, &set("100", None), Some("a".into()));
        idle(&w).await;
        assert!(seen.try_recv().is_err());
        assert!(w.overlay(&set("100", None)).is_none());
    }
}
