//! Compact caches of every stateful pod and claim, of sets that opted in or not (a set that
//! opts in later is planned from them): per namespace and name, one small entry of the fields
//! reconciling reads (UID, deletion, our annotations), which also tells a change that matters
//! from one that does not. A reflector store would keep each whole `ObjectMeta`. Names are kept
//! in order, so a set's claims are found by their prefix (`<template>-<set>-`) without an index.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, RwLock};

use drain_api::claim_annotations;
use futures::{Stream, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;

/// An object whose cached entry is compact.
pub trait Compact {
    /// What is kept of one object; equal entries mean no change that matters.
    type Entry: Clone + PartialEq + Send + Sync + 'static;

    /// The object's namespace and name.
    fn key(&self) -> (&str, &str) {
        let meta = self.metadata();
        let ns = meta.namespace.as_deref().unwrap_or_default();
        (ns, meta.name.as_deref().unwrap_or_default())
    }

    /// What is kept of the object.
    fn entry(&self) -> Self::Entry;

    /// The object's metadata (for its resourceVersion).
    fn metadata(&self) -> &ObjectMeta;
}

/// A resourceVersion as an integer (Kubernetes guarantees it since 1.35, KEP-5504; 0 if not).
pub fn version_of(meta: &ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// What is kept of a stateful pod: whether it exists (its UID) and whether it is going, and
/// what keeps it while it goes (its finalizers, kept only then).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEntry {
    /// The pod's UID.
    pub uid: Box<str>,
    /// Its deletion timestamp, once it is being deleted.
    pub deletion: Option<Time>,
    /// Its finalizers while it is being deleted.
    pub finalizers: Option<Box<[String]>>,
}

/// What is kept of a claim: its UID, whether it is going, and the annotations of ours on it
/// (its drain record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimEntry {
    /// The claim's UID.
    pub uid: Box<str>,
    /// Its deletion timestamp, once it is being deleted.
    pub deletion: Option<Time>,
    /// Our annotations on it (none on most claims).
    pub annotations: Option<Box<BTreeMap<String, String>>>,
}

impl Compact for PartialObjectMeta<Pod> {
    type Entry = PodEntry;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn entry(&self) -> PodEntry {
        let deletion = self.metadata.deletion_timestamp.clone();
        PodEntry {
            uid: self.metadata.uid.as_deref().unwrap_or_default().into(),
            finalizers: deletion
                .as_ref()
                .and(self.metadata.finalizers.as_ref())
                .filter(|f| !f.is_empty())
                .map(|f| f.clone().into_boxed_slice()),
            deletion,
        }
    }
}

impl Compact for PartialObjectMeta<PersistentVolumeClaim> {
    type Entry = ClaimEntry;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn entry(&self) -> ClaimEntry {
        ClaimEntry::of(&self.metadata)
    }
}

/// The metadata the observers read, rebuilt from what an entry keeps.
fn rebuilt(namespace: &str, name: &str, uid: &str, deletion: Option<&Time>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        uid: Some(uid.to_owned()),
        deletion_timestamp: deletion.cloned(),
        ..ObjectMeta::default()
    }
}

impl PodEntry {
    /// The metadata the observers read, rebuilt for one pod.
    pub fn meta(&self, namespace: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            finalizers: self.finalizers.as_deref().map(<[String]>::to_vec),
            ..rebuilt(namespace, name, &self.uid, self.deletion.as_ref())
        }
    }
}

impl ClaimEntry {
    /// What is kept of a claim with this metadata.
    pub fn of(meta: &ObjectMeta) -> Self {
        let ours: BTreeMap<String, String> = meta
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| claim_annotations::ALL.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Self {
            uid: meta.uid.as_deref().unwrap_or_default().into(),
            deletion: meta.deletion_timestamp.clone(),
            annotations: (!ours.is_empty()).then(|| Box::new(ours)),
        }
    }

    /// This entry as a write of `changes` makes it: each annotation set (`Some`) or removed.
    pub fn with(mut self, changes: &BTreeMap<String, Option<String>>) -> Self {
        let mut ours = self.annotations.take().map(|a| *a).unwrap_or_default();
        for (k, v) in changes {
            match v {
                Some(v) => ours.insert(k.clone(), v.clone()),
                None => ours.remove(k),
            };
        }
        self.annotations = (!ours.is_empty()).then(|| Box::new(ours));
        self
    }

    /// The metadata the observers read, rebuilt for one claim.
    pub fn meta(&self, namespace: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            annotations: self.annotations.as_deref().cloned(),
            ..rebuilt(namespace, name, &self.uid, self.deletion.as_ref())
        }
    }
}

struct Slot<E> {
    entry: E,
    /// The resourceVersion of the object last seen (not part of the entry: a change of it
    /// alone does not pass).
    version: u64,
    /// The list (see [`Inner::epoch`]) that last saw the object.
    epoch: u32,
}

struct Inner<E> {
    by_namespace: HashMap<Box<str>, BTreeMap<Box<str>, Slot<E>>>,
    /// Counts the watch's (re)lists: at the end of one, the objects it did not list are gone.
    epoch: u32,
}

/// A compact cache of one kind of object, filled by [`Cache::changes`].
pub struct Cache<E> {
    inner: Arc<RwLock<Inner<E>>>,
    synced: Arc<tokio::sync::watch::Sender<bool>>,
}

impl<E> Clone for Cache<E> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            synced: Arc::clone(&self.synced),
        }
    }
}

impl<E> Default for Cache<E> {
    fn default() -> Self {
        Self {
            inner: Arc::new(RwLock::new(Inner {
                by_namespace: HashMap::new(),
                epoch: 0,
            })),
            synced: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }
}

/// Whether a state seen at `version` is older than one seen at `than` (0: unknown, never older).
fn older(version: u64, than: u64) -> bool {
    version != 0 && than != 0 && version < than
}

/// Takes `namespace/name` out of the cache's map (the caller holds its lock).
fn forget<E>(inner: &mut Inner<E>, namespace: &str, name: &str) {
    if let Some(names) = inner.by_namespace.get_mut(namespace) {
        names.remove(name);
        if names.is_empty() {
            inner.by_namespace.remove(namespace);
        }
    }
}

/// The watch feeding a cache ended before its first list completed.
#[derive(Debug, thiserror::Error)]
#[error("the watch stopped before its cache synced")]
pub struct Stopped;

impl<E: Clone + PartialEq + Send + Sync + 'static> Cache<E> {
    /// The entry of the object `name` in `namespace`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<E> {
        let inner = self.inner.read().expect("cache lock");
        inner
            .by_namespace
            .get(namespace)?
            .get(name)
            .map(|s| s.entry.clone())
    }

    /// The names in `namespace` that start with `prefix`, in order.
    pub fn names_starting_with(&self, namespace: &str, prefix: &str) -> Vec<String> {
        let inner = self.inner.read().expect("cache lock");
        let Some(names) = inner.by_namespace.get(namespace) else {
            return Vec::new();
        };
        (names.range::<str, _>((Bound::Included(prefix), Bound::Unbounded)))
            .map(|(name, _)| name)
            .take_while(|name| name.starts_with(prefix))
            .map(|name| name.to_string())
            .collect()
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        let inner = self.inner.read().expect("cache lock");
        inner.by_namespace.values().map(BTreeMap::len).sum()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves once the first list has been cached whole.
    pub async fn wait_until_ready(&self) -> Result<(), Stopped> {
        let mut synced = self.synced.subscribe();
        synced
            .wait_for(|s| *s)
            .await
            .map(|_| ())
            .map_err(|_| Stopped)
    }

    /// The entry of `namespace/name` and the resourceVersion it was last seen at.
    pub fn get_versioned(&self, namespace: &str, name: &str) -> Option<(E, u64)> {
        let inner = self.inner.read().expect("cache lock");
        let slot = inner.by_namespace.get(namespace)?.get(name)?;
        Some((slot.entry.clone(), slot.version))
    }

    /// Stores `entry`, seen at `version`; whether the object is new or its entry changed. A
    /// state older than the cached one is not stored (the object counts as listed, though).
    fn upsert(&self, (namespace, name, meta): (&str, &str, &ObjectMeta), entry: E) -> bool {
        let version = version_of(meta);
        let mut inner = self.inner.write().expect("cache lock");
        let epoch = inner.epoch;
        match inner
            .by_namespace
            .get_mut(namespace)
            .and_then(|names| names.get_mut(name))
        {
            Some(slot) => {
                slot.epoch = epoch;
                if older(version, slot.version) {
                    false
                } else {
                    slot.version = version;
                    let changed = slot.entry != entry;
                    slot.entry = entry;
                    changed
                }
            }
            None => {
                let slot = Slot {
                    entry,
                    version,
                    epoch,
                };
                (inner.by_namespace.entry(namespace.into()).or_default()).insert(name.into(), slot);
                true
            }
        }
    }

    /// Forgets the object deleted at `version`, unless the cache holds a newer state of it.
    fn remove(&self, namespace: &str, name: &str, version: u64) {
        let mut inner = self.inner.write().expect("cache lock");
        let removed = match inner.by_namespace.get(namespace).and_then(|n| n.get(name)) {
            Some(slot) => !older(version, slot.version),
            None => false,
        };
        if removed {
            forget(&mut inner, namespace, name);
        }
    }

    /// A (re)list starts: what it does not list is forgotten when it ends.
    fn list_started(&self) {
        let mut inner = self.inner.write().expect("cache lock");
        inner.epoch = inner.epoch.wrapping_add(1);
    }

    /// A (re)list ended: forgets the objects it did not list (deleted while the watch was
    /// down; their sets are looked at again by the periodic resync), and returns them.
    fn list_done(&self) {
        {
            let mut inner = self.inner.write().expect("cache lock");
            let epoch = inner.epoch;
            inner.by_namespace.retain(|_, names| {
                // Rebuilt from the listed entries, in order: a tree built at once has full
                // nodes, one filled in the list's (sorted) order has half-empty ones.
                *names = std::mem::take(names)
                    .into_iter()
                    .filter(|(_, slot)| slot.epoch == epoch)
                    .collect();
                !names.is_empty()
            });
            inner.by_namespace.shrink_to_fit();
        }
        self.synced.send_replace(true);
    }

    /// The objects to pass on for one watch event: those whose entry changed, and every
    /// deleted one.
    fn on<K: Compact<Entry = E>>(&self, event: watcher::Event<K>) -> Option<K> {
        match event {
            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
                let (ns, name) = obj.key();
                self.upsert((ns, name, obj.metadata()), obj.entry())
                    .then_some(obj)
            }
            watcher::Event::Delete(obj) => {
                let (ns, name) = obj.key();
                self.remove(ns, name, version_of(obj.metadata()));
                Some(obj)
            }
            watcher::Event::Init => {
                self.list_started();
                None
            }
            watcher::Event::InitDone => {
                self.list_done();
                None
            }
        }
    }

    /// Keeps this cache from a watch, and passes on the objects whose entry
    /// changed and every deleted one.
    pub fn changes<K, S>(
        &self,
        events: S,
    ) -> impl Stream<Item = Result<K, watcher::Error>> + use<K, S, E>
    where
        K: Compact<Entry = E> + Send + 'static,
        S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    {
        let cache = self.clone();
        events
            .map_ok(move |event| stream::iter(cache.on(event).map(Ok)))
            .try_flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str, deleting: bool) -> PartialObjectMeta<Pod> {
        use kube::core::PartialObjectMetaExt;
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("ns".to_owned()),
            uid: Some(uid.to_owned()),
            resource_version: Some(format!("{name}{uid}{deleting}")),
            deletion_timestamp: deleting.then(|| Time("2026-01-01T00:00:00Z".parse().unwrap())),
            ..ObjectMeta::default()
        }
        .into_response_partial()
    }

    fn claim(name: &str, record: Option<&str>) -> PartialObjectMeta<PersistentVolumeClaim> {
        use kube::core::PartialObjectMetaExt;
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("ns".to_owned()),
            uid: Some(format!("uid-{name}")),
            annotations: record.map(|r| {
                BTreeMap::from([
                    (claim_annotations::ATTEMPTS.to_owned(), r.to_owned()),
                    ("other".to_owned(), "x".to_owned()),
                ])
            }),
            ..ObjectMeta::default()
        }
        .into_response_partial()
    }

    fn passed<K: Compact>(cache: &Cache<K::Entry>, event: watcher::Event<K>) -> bool {
        cache.on(event).is_some()
    }

    #[test]
    fn only_changes_that_matter_and_deletions_pass() {
        let cache = Cache::default();
        assert!(passed(
            &cache,
            watcher::Event::Apply(pod("web-0", "a", false))
        ));
        // A new resourceVersion alone (a status update) changes nothing that matters.
        let mut again = pod("web-0", "a", false);
        again.metadata.resource_version = Some("later".to_owned());
        assert!(!passed(&cache, watcher::Event::Apply(again)));
        assert!(passed(
            &cache,
            watcher::Event::Apply(pod("web-0", "a", true))
        ));
        assert!(cache.get("ns", "web-0").unwrap().deletion.is_some());
        // A pod of one name with another UID: a new pod.
        assert!(passed(
            &cache,
            watcher::Event::Apply(pod("web-0", "b", false))
        ));
        assert_eq!(&*cache.get("ns", "web-0").unwrap().uid, "b");
        assert!(passed(
            &cache,
            watcher::Event::Delete(pod("web-0", "b", false))
        ));
        assert_eq!(cache.get("ns", "web-0"), None);
        assert!(cache.is_empty());
    }

    #[test]
    fn a_claim_passes_when_its_record_changes_and_the_entry_rebuilds_its_metadata() {
        let cache = Cache::default();
        assert!(passed(
            &cache,
            watcher::Event::Apply(claim("data-web-1", None))
        ));
        assert!(!passed(
            &cache,
            watcher::Event::Apply(claim("data-web-1", None))
        ));
        assert!(passed(
            &cache,
            watcher::Event::Apply(claim("data-web-1", Some("1")))
        ));
        assert!(!passed(
            &cache,
            watcher::Event::Apply(claim("data-web-1", Some("1")))
        ));
        let meta = cache
            .get("ns", "data-web-1")
            .unwrap()
            .meta("ns", "data-web-1");
        assert_eq!(meta.uid.as_deref(), Some("uid-data-web-1"));
        // Only our annotations are kept.
        let ours = BTreeMap::from([(claim_annotations::ATTEMPTS.to_owned(), "1".to_owned())]);
        assert_eq!(meta.annotations, Some(ours));
        assert_eq!(meta.name.as_deref(), Some("data-web-1"));
        // Annotations of others alone are kept as none: the same entry.
        let mut others = claim("data-web-2", None);
        others.metadata.annotations = Some(BTreeMap::from([("a".to_owned(), "b".to_owned())]));
        assert_eq!(others.entry(), claim("data-web-2", None).entry());
    }

    #[tokio::test]
    async fn a_relist_forgets_what_it_did_not_list() {
        let cache = Cache::default();
        let on = |e| cache.on(e).is_some();
        assert!(!on(watcher::Event::Init));
        assert!(on(watcher::Event::InitApply(claim("data-web-0", None))));
        assert!(on(watcher::Event::InitApply(claim("data-web-1", None))));
        assert!(!on(watcher::Event::InitDone));
        cache.wait_until_ready().await.unwrap();
        assert_eq!(cache.names_starting_with("ns", "data-web-").len(), 2);
        // The watch is down while data-web-1 is deleted; the relist does not list it.
        assert!(!on(watcher::Event::Init));
        assert!(!on(watcher::Event::InitApply(claim("data-web-0", None))));
        // Until the relist ends, the cache still answers with what it had.
        assert!(cache.get("ns", "data-web-1").is_some());
        assert!(!on(watcher::Event::InitDone));
        assert!(cache.get("ns", "data-web-1").is_none());
        assert!(cache.get("ns", "data-web-0").is_some());
        assert_eq!(cache.names_starting_with("ns", "data-web-"), ["data-web-0"]);
        // It comes back: it passes again.
        assert!(on(watcher::Event::Apply(claim("data-web-1", None))));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn names_are_found_by_prefix_in_their_namespace_only() {
        let cache = Cache::default();
        for name in [
            "data-web-0",
            "data-web-x-1",
            "data-wea-2",
            "data-web-10",
            "logs-web-0",
        ] {
            cache.on(watcher::Event::Apply(claim(name, None)));
        }
        let mut elsewhere = claim("data-web-3", None);
        elsewhere.metadata.namespace = Some("other".to_owned());
        cache.on(watcher::Event::Apply(elsewhere));
        assert_eq!(
            cache.names_starting_with("ns", "data-web-"),
            ["data-web-0", "data-web-10", "data-web-x-1"]
        );
        assert_eq!(
            cache.names_starting_with("other", "data-web-"),
            ["data-web-3"]
        );
        assert!(cache.names_starting_with("none", "data-web-").is_empty());
    }

    fn pod_at(name: &str, uid: &str, version: u64) -> PartialObjectMeta<Pod> {
        let mut p = pod(name, uid, false);
        p.metadata.resource_version = Some(version.to_string());
        p
    }

    #[test]
    fn an_older_state_never_overwrites_a_newer_one() {
        let cache = Cache::default();
        cache.on(watcher::Event::Apply(pod_at("web-0", "b", 20)));
        // A watch event older than what a list brought: not applied.
        assert!(!passed(
            &cache,
            watcher::Event::Apply(pod_at("web-0", "a", 10))
        ));
        assert_eq!(&*cache.get("ns", "web-0").unwrap().uid, "b");
        // A deletion older than the cached state (of the object that had the name before).
        cache.on(watcher::Event::Delete(pod_at("web-0", "a", 15)));
        assert_eq!(&*cache.get("ns", "web-0").unwrap().uid, "b");
        cache.on(watcher::Event::Delete(pod_at("web-0", "b", 25)));
        assert!(cache.get("ns", "web-0").is_none());
    }

    #[tokio::test]
    async fn not_ready_until_the_first_list_is_cached() {
        let cache: Cache<PodEntry> = Cache::default();
        cache.on(watcher::Event::<PartialObjectMeta<Pod>>::Init);
        cache.on(watcher::Event::InitApply(pod("web-0", "a", false)));
        let early = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            cache.wait_until_ready(),
        )
        .await;
        assert!(early.is_err(), "ready before the list was done");
        cache.on(watcher::Event::<PartialObjectMeta<Pod>>::InitDone);
        cache.wait_until_ready().await.unwrap();
    }
}
