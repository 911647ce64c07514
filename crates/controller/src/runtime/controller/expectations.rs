//! Read-your-writes, as client-go's controllers keep expectations: the drain pods we created
//! and deleted and the claims we annotated and deleted, each until its watch delivers it (for
//! [`TTL`] at most), and how a snapshot reads them over the caches. Versions are compared as
//! integers (guaranteed since Kubernetes 1.35, KEP-5504): what is read is never newer than the
//! cluster, never older than the cache. A restarted controller starts with none.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use drain_api::labels;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::plan;
use crate::runtime::caches::{ClaimEntry, version_of};

/// How long a write is kept at most (the watch normally passes it within milliseconds).
pub const TTL: Duration = Duration::from_secs(10);

struct Kept<T> {
    version: u64,
    at: Instant,
    value: T,
}

impl<T> Kept<T> {
    /// Whether it is still read: for [`TTL`] after its answer.
    fn live(&self) -> bool {
        self.at.elapsed() < TTL
    }
}

struct State<T> {
    /// The highest resourceVersion the watch has delivered.
    seen: u64,
    kept: HashMap<(String, String), Kept<T>>,
}

/// The recent writes of one kind of object, by name: the API server's answer to each, read
/// instead of the cached object while newer, and while the cache lacks it until its watch
/// delivers an event at or after its version (not a relist), for [`TTL`] at most: it holds
/// back, never hastens, what the planner does with its ordinal.
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
        let Some(version) = version(resource_version) else {
            return;
        };
        let key = (namespace.to_owned(), name.to_owned());
        let newer = state.kept.get(&key).is_none_or(|k| k.version < version);
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

/// The UIDs of the pods (or the claims) we deleted, for [`TTL`] at most: a deleted drain pod is
/// read as terminating even while the cache shows it as it was (an unscheduled pod's delete
/// answers with no newer version, so [`Recent`] cannot keep it); a deleted claim as being
/// deleted: no new drain starts on it, nor is it deleted again. Only the flag is read.
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

/// Our writes the watches have not delivered yet.
#[derive(Default)]
pub(super) struct Expectations {
    /// Drain pods we created.
    pub(super) pods: Recent<Pod>,
    /// Claims we annotated.
    pub(super) claims: Recent<ClaimEntry>,
    /// Drain pods we deleted.
    pub(super) deleted_pods: Deleted,
    /// Claims we deleted: read as being deleted until the cache shows it (a reconcile that ran
    /// before the claim's watch event would otherwise see the drained ordinal's claims as they
    /// were, its drain pod gone, and start a new drain on claims on their way out).
    pub(super) deleted_claims: Deleted,
}

/// A claim's cached entry, or our last write of it if that is newer than the cached entry and
/// of the same claim (not one recreated under the name).
pub(super) fn newest_claim(cached: ClaimEntry, ours: Option<ClaimEntry>) -> ClaimEntry {
    ours.filter(|o| o.uid == cached.uid).unwrap_or(cached)
}

/// The cached drain pods of set `set`, with the ones we created (`created`: name, version,
/// pod) that the watch has not delivered yet: added, or in place of an older cached pod of that
/// name (a gone one: ours could be created under its name).
pub(super) fn with_created(
    mut cached: Vec<Arc<Pod>>,
    created: Vec<(String, u64, Pod)>,
    set: &str,
) -> Vec<Arc<Pod>> {
    for (name, version, pod) in created {
        if pod.labels().get(labels::DRAIN_POD).map(String::as_str) != Some(set) {
            continue;
        }
        match cached
            .iter()
            .position(|p| p.metadata.name.as_deref() == Some(&name))
        {
            Some(i) if version_of(&cached[i].metadata) < version => cached[i] = Arc::new(pod),
            Some(_) => {}
            None => cached.push(Arc::new(pod)),
        }
    }
    cached
}

/// Marks the drain pods we deleted, or failed to withdraw and will delete, as terminating,
/// whatever the cache still shows of them ([`Deleted`]): only the flag, never a
/// deletion time.
pub(super) fn mark_deleted(pods: &mut [plan::PodObs], deleted: impl Fn(&str) -> bool) {
    for pod in pods {
        if matches!(pod.kind, plan::PodKind::Drain(_)) && deleted(&pod.uid) {
            pod.terminating = true;
        }
    }
}

/// Marks the claims we deleted as being deleted, whatever the cache still shows of them
/// ([`Deleted`]).
pub(super) fn mark_deleted_claims(claims: &mut [plan::Claim], deleted: impl Fn(&str) -> bool) {
    for claim in claims {
        if deleted(&claim.uid) {
            claim.terminating = true;
        }
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
}
