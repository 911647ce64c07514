//! Our own recent writes of drain pods and claims, shown to reads until the watch caches have
//! seen them.
//!
//! Drain pods and claims come from two watches, and a reconcile can run between the event of
//! one of our writes and the event of the next. A drain pod is created and then recorded on its
//! claims: if the pod's Added event triggers a reconcile before the claims' events arrived, the
//! planner sees a drain pod its claims do not record and records it again (a second patch of
//! each claim); the other way round, it sees a recorded pod missing from the cache, takes it
//! for vanished and checks with a live read. Each reconcile of that kind holds up the next one
//! of its set. So the answer to each of our writes is kept here, for [`TTL`] at most, and read
//! instead of the cached object only while it is newer than that object (resourceVersions are
//! compared as integers, which Kubernetes guarantees since 1.35, KEP-5504): never newer than the
//! cluster, never older than the cache. A kept drain pod the cache does not hold is read until
//! its watch delivers an event at or after its version ([`Recent::saw`]; a relist does not
//! count, as kube's reflector applies a list only at its end), so a pod deleted right after
//! we created it may be read as Pending for up to [`TTL`] after a relist: that holds back, never
//! hastens, what the planner does with its ordinal. This is only a read-your-writes aid, like
//! [`crate::runtime::status_memo`]: a restarted controller starts with none.
//!
//! A write may also be kept before it is answered ([`Recent::pending`]): a new drain pod's
//! record goes to its claims in the background, and the set's next reconciles read it as
//! written meanwhile. Writes of one claim go out one at a time, in the order they were asked
//! for ([`Gates`]), so a later write is never overtaken by a record still on its way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a write is kept at most (the watch normally passes it within milliseconds).
pub const TTL: Duration = Duration::from_secs(10);

/// The version of a write not answered yet: newer than any the cache can hold.
const PENDING: u64 = u64::MAX;

struct Kept<T> {
    version: u64,
    at: Instant,
    value: T,
}

impl<T> Kept<T> {
    /// Whether it is still read: a write for [`TTL`] after its answer; a pending one until it is
    /// answered or failed (its writer always says which, or is dropped with the process).
    fn live(&self) -> bool {
        self.version == PENDING || self.at.elapsed() < TTL
    }
}

struct State<T> {
    /// The highest resourceVersion the watch has delivered.
    seen: u64,
    kept: HashMap<(String, String), Kept<T>>,
}

/// The recent writes of one kind of object, by namespace and name.
pub struct Recent<T> {
    state: Mutex<State<T>>,
}

impl<T> Default for Recent<T> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                seen: 0,
                kept: HashMap::new(),
            }),
        }
    }
}

fn version(rv: Option<&str>) -> Option<u64> {
    rv?.parse().ok()
}

impl<T: Clone> Recent<T> {
    /// The watch delivered an object at this resourceVersion, and its cache and index hold what
    /// it delivered: the writes up to it are in the cache (or gone from it).
    pub fn saw(&self, resource_version: Option<&str>) {
        let Some(v) = version(resource_version) else {
            return;
        };
        let mut state = self.state.lock().expect("recent writes lock");
        if v > state.seen {
            state.seen = v;
            let seen = state.seen;
            state.kept.retain(|_, k| k.version > seen);
        }
    }

    /// Keeps `value`, what the API server answered to our write of `namespace/name` at
    /// `resource_version` (a version that is not an integer is not kept).
    pub fn wrote(&self, namespace: &str, name: &str, resource_version: Option<&str>, value: T) {
        let mut state = self.state.lock().expect("recent writes lock");
        state.kept.retain(|_, k| k.live());
        let key = (namespace.to_owned(), name.to_owned());
        // The answer to a pending write takes its place, or, when the watch has passed it
        // already or its version cannot be kept, drops it.
        let pending = state.kept.get(&key).is_some_and(|k| k.version == PENDING);
        let Some(version) = version(resource_version) else {
            if pending {
                state.kept.remove(&key);
            }
            return;
        };
        let newer = pending || state.kept.get(&key).is_none_or(|k| k.version < version);
        if pending && version <= state.seen {
            state.kept.remove(&key);
        }
        if version > state.seen && newer {
            state.kept.insert(
                key,
                Kept {
                    version,
                    at: Instant::now(),
                    value,
                },
            );
        }
    }

    /// Keeps `value`, what our write of `namespace/name` will make of it, before the API server
    /// answered: read as newer than any cached version until [`Recent::wrote`] keeps the answer
    /// or [`Recent::failed`] drops it (however long the write takes: a create held by a slow
    /// admission webhook still holds its drain slot).
    pub fn pending(&self, namespace: &str, name: &str, value: T) {
        let mut state = self.state.lock().expect("recent writes lock");
        state.kept.retain(|_, k| k.live());
        state.kept.insert(
            (namespace.to_owned(), name.to_owned()),
            Kept {
                version: PENDING,
                at: Instant::now(),
                value,
            },
        );
    }

    /// Our pending write of `namespace/name` did not happen: it is no longer read.
    pub fn failed(&self, namespace: &str, name: &str) {
        let mut state = self.state.lock().expect("recent writes lock");
        let key = (namespace.to_owned(), name.to_owned());
        if state.kept.get(&key).is_some_and(|k| k.version == PENDING) {
            state.kept.remove(&key);
        }
    }

    /// Our write of `namespace/name` if it is newer than `cached`, the version the cache holds
    /// (else it is dropped: the cache has caught up).
    pub fn newer_than(&self, namespace: &str, name: &str, cached: u64) -> Option<T> {
        let mut state = self.state.lock().expect("recent writes lock");
        let key = (namespace.to_owned(), name.to_owned());
        let kept = state.kept.get(&key)?;
        if kept.version > cached && kept.live() {
            return Some(kept.value.clone());
        }
        state.kept.remove(&key);
        None
    }

    /// Our writes in `namespace` kept now, with their names and versions.
    pub fn in_namespace(&self, namespace: &str) -> Vec<(String, u64, T)> {
        let mut state = self.state.lock().expect("recent writes lock");
        state.kept.retain(|_, k| k.live());
        state
            .kept
            .iter()
            .filter(|((ns, _), _)| ns == namespace)
            .map(|((_, name), k)| (name.clone(), k.version, k.value.clone()))
            .collect()
    }
}

/// One write at a time per object (by namespace and name), in the order they were asked for
/// (tokio's mutex is fair): held across a write, so that one asked for later never overtakes
/// a write still on its way. A failed write leaves a mark on its gate ([`mark_failed`]; the
/// writes of [`Recent::pending`]): the next write may have been planned from it as made, so it
/// is not sent ([`follows_failure`], which clears the mark; one planned after the failure is so
/// refused once, and planned again). The mark outlives the failed write's
/// guard, for [`TTL`] (as long as the pending write was read), whether or not a write waits.
#[derive(Default)]
pub struct Gates {
    gates: Mutex<HashMap<(String, String), Gate>>,
}

/// One object's gate: held by the write on its way, waited for by the later ones; marked with
/// the instant of a failed write, until the next one finds it.
type Gate = Arc<tokio::sync::Mutex<Option<Instant>>>;

/// A gate held ([`Gates::enter`]).
pub type Entered = tokio::sync::OwnedMutexGuard<Option<Instant>>;

/// Marks on a held gate that the write made under it failed.
pub fn mark_failed(gate: &mut Entered) {
    **gate = Some(Instant::now());
}

/// Whether a write of ours made under the gate before this one failed within [`TTL`] (this
/// one was then planned from it as made); clears the mark.
pub fn follows_failure(gate: &mut Entered) -> bool {
    gate.take().is_some_and(|at| at.elapsed() < TTL)
}

/// Whether a mark is still to be found.
fn marked(at: Option<Instant>) -> bool {
    at.is_some_and(|at| at.elapsed() < TTL)
}

impl Gates {
    /// Waits for the writes of `namespace/name` asked for before, and holds its gate until the
    /// guard is dropped.
    pub async fn enter(&self, namespace: &str, name: &str) -> Entered {
        let gate = {
            let mut gates = self.gates.lock().expect("gates lock");
            // A gate no one holds or waits for, and not marked, is done with.
            gates.retain(|_, g| {
                Arc::strong_count(g) > 1 || g.try_lock().map_or(true, |at| marked(*at))
            });
            Arc::clone(
                gates
                    .entry((namespace.to_owned(), name.to_owned()))
                    .or_default(),
            )
        };
        gate.lock_owned().await
    }
}

/// The UIDs of the pods (or the claims) we deleted, for [`TTL`] at most: a deleted drain pod is read as
/// terminating (waited for: neither recorded on its claims nor deleted again) even while the
/// cache still shows it as it was. Deleting a pod that was not scheduled yet removes it at once,
/// and the API server's answer then carries no deletion timestamp nor a newer version than the
/// cache may hold, so [`Recent`] cannot keep it. Only the flag is read, never a time: whether a
/// drain pod finished before it was asked to stop is judged from the pod's own fields. A deleted
/// claim is read as being deleted: no new drain starts on it, nor is it deleted again.
#[derive(Default)]
pub struct Deleted {
    at: Mutex<HashMap<String, Instant>>,
}

impl Deleted {
    /// We deleted the object with this UID (the API server accepted the delete).
    pub fn deleted(&self, uid: &str) {
        let mut at = self.at.lock().expect("deleted objects lock");
        at.retain(|_, t| t.elapsed() < TTL);
        at.insert(uid.to_owned(), Instant::now());
    }

    /// Whether we deleted the object with this UID within [`TTL`].
    pub fn contains(&self, uid: &str) -> bool {
        let at = self.at.lock().expect("deleted objects lock");
        at.get(uid).is_some_and(|t| t.elapsed() < TTL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_kept_until_its_watch_passes_its_version() {
        let r = Recent::default();
        r.saw(Some("100"));
        r.wrote("ns", "a", Some("120"), "written");
        assert_eq!(r.in_namespace("ns"), vec![("a".to_owned(), 120, "written")]);
        assert!(r.in_namespace("other").is_empty());
        r.saw(Some("119"));
        assert_eq!(r.in_namespace("ns").len(), 1, "still before it");
        r.saw(Some("120"));
        assert!(r.in_namespace("ns").is_empty(), "the watch delivered it");
    }

    #[test]
    fn a_write_the_watch_passed_already_or_with_an_opaque_version_is_not_kept() {
        let r = Recent::default();
        r.saw(Some("200"));
        r.wrote("ns", "a", Some("150"), 1);
        r.wrote("ns", "b", Some("opaque"), 2);
        r.wrote("ns", "c", None, 3);
        assert!(r.in_namespace("ns").is_empty());
        r.saw(Some("not-a-number"));
        r.wrote("ns", "d", Some("201"), 4);
        assert_eq!(
            r.in_namespace("ns"),
            vec![("d".to_owned(), 201, 4)],
            "an opaque version seen changes nothing"
        );
    }

    #[test]
    fn the_newest_write_of_a_name_is_kept() {
        let r = Recent::default();
        r.wrote("ns", "a", Some("10"), "first");
        r.wrote("ns", "a", Some("11"), "second");
        assert_eq!(r.newer_than("ns", "a", 5), Some("second"));
        r.wrote("ns", "a", Some("9"), "answered late");
        assert_eq!(r.newer_than("ns", "a", 5), Some("second"));
    }

    #[test]
    fn a_deleted_pod_is_known_by_its_uid_only() {
        let d = Deleted::default();
        assert!(!d.contains("u1"));
        d.deleted("u1");
        assert!(d.contains("u1"));
        assert!(!d.contains("u2"), "another pod, perhaps of the same name");
    }

    #[test]
    fn a_write_is_read_only_while_it_is_newer_than_the_cache() {
        let r = Recent::default();
        r.wrote("ns", "a", Some("10"), "ours");
        assert_eq!(r.newer_than("ns", "a", 9), Some("ours"));
        assert_eq!(r.newer_than("ns", "a", 10), None, "the cache caught up");
        assert_eq!(r.newer_than("ns", "a", 0), None, "and it is dropped");
    }

    #[test]
    fn a_pending_write_is_read_until_answered_or_failed() {
        let r = Recent::default();
        r.saw(Some("50"));
        r.pending("ns", "a", "pending");
        assert_eq!(r.newer_than("ns", "a", 49), Some("pending"));
        r.saw(Some("60"));
        assert_eq!(
            r.newer_than("ns", "a", 60),
            Some("pending"),
            "no watch event can pass an unanswered write"
        );
        r.wrote("ns", "a", Some("61"), "answered");
        assert_eq!(r.newer_than("ns", "a", 60), Some("answered"));
        r.saw(Some("61"));
        assert_eq!(r.newer_than("ns", "a", 61), None, "the watch delivered it");

        r.pending("ns", "d", "pending");
        r.wrote("ns", "d", Some("55"), "answered after its event");
        assert_eq!(
            r.newer_than("ns", "d", 0),
            None,
            "an answer the watch passed already drops the pending write"
        );

        r.pending("ns", "e", "pending");
        r.wrote("ns", "e", Some("opaque"), "answered");
        assert_eq!(
            r.newer_than("ns", "e", 0),
            None,
            "an answer whose version cannot be kept drops the pending write too"
        );

        r.pending("ns", "b", "pending");
        r.failed("ns", "b");
        assert_eq!(
            r.newer_than("ns", "b", 0),
            None,
            "a failed write is not read"
        );
        r.wrote("ns", "c", Some("70"), "answered");
        r.failed("ns", "c");
        assert_eq!(
            r.newer_than("ns", "c", 0),
            Some("answered"),
            "only a pending write is dropped as failed"
        );
    }

    #[tokio::test]
    async fn writes_of_one_object_go_in_the_order_asked_for() {
        let gates = Arc::new(Gates::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = gates.enter("ns", "a").await;
        let mut waiting = Vec::new();
        for i in 0..3 {
            let (gates, order) = (Arc::clone(&gates), Arc::clone(&order));
            waiting.push(tokio::spawn(async move {
                let _g = gates.enter("ns", "a").await;
                order.lock().unwrap().push(i);
            }));
            // Each asks in turn.
            tokio::task::yield_now().await;
        }
        let other = gates.enter("ns", "b").await;
        drop(other);
        assert!(order.lock().unwrap().is_empty(), "all wait for the first");
        drop(first);
        for w in waiting {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        let _again = gates.enter("ns", "c").await;
        assert_eq!(
            gates.gates.lock().unwrap().len(),
            1,
            "idle gates are dropped"
        );
    }

    #[tokio::test]
    async fn the_write_after_a_failed_one_finds_the_flag_once() {
        let gates = Gates::default();
        let mut failed = gates.enter("ns", "a").await;
        mark_failed(&mut failed);
        let gates = Arc::new(gates);
        let next = {
            let gates = Arc::clone(&gates);
            tokio::spawn(async move {
                let mut g = gates.enter("ns", "a").await;
                follows_failure(&mut g)
            })
        };
        tokio::task::yield_now().await;
        drop(failed);
        assert!(next.await.unwrap(), "the write queued behind it is told");
        assert!(
            !follows_failure(&mut gates.enter("ns", "a").await),
            "and only that one"
        );

        // No write waits when it fails: the mark is kept for the next one all the same.
        let mut failed = gates.enter("ns", "b").await;
        mark_failed(&mut failed);
        drop(failed);
        let _other = gates.enter("ns", "c").await;
        assert!(follows_failure(&mut gates.enter("ns", "b").await));
    }
}
