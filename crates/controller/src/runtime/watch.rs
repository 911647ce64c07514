//! Watch plumbing for a large cluster: pass on only the changes that can change a decision (a
//! fingerprint per object; deletions always pass), and index cached objects by the StatefulSet
//! they may belong to, so a reconcile reads its own set's objects instead of scanning them all.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, RwLock};

use futures::{Stream, TryStreamExt, stream};
use kube::Resource;
use kube::runtime::watcher;

/// `(namespace, name)` of a StatefulSet.
pub type SetKey = (String, String);

/// Object names by the StatefulSet they may belong to.
#[derive(Clone, Default)]
pub struct Index(Arc<RwLock<HashMap<SetKey, BTreeSet<String>>>>);

impl Index {
    /// The names indexed under the set `name` in `namespace`.
    pub fn names(&self, namespace: &str, name: &str) -> Vec<String> {
        let key = (namespace.to_owned(), name.to_owned());
        let map = self.0.read().expect("index lock");
        map.get(&key)
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub(crate) fn insert(&self, sets: &[SetKey], name: &str) {
        let mut map = self.0.write().expect("index lock");
        for set in sets {
            map.entry(set.clone()).or_default().insert(name.to_owned());
        }
    }

    pub(crate) fn remove(&self, sets: &[SetKey], name: &str) {
        let mut map = self.0.write().expect("index lock");
        for set in sets {
            if let Some(names) = map.get_mut(set) {
                names.remove(name);
                if names.is_empty() {
                    map.remove(set);
                }
            }
        }
    }
}

/// A 64-bit fingerprint of the parts of an object that can change a decision.
pub fn fingerprint(parts: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
}

/// How [`changes`] treats one kind of object.
pub struct Filter<K> {
    /// The fingerprint of what matters in an object.
    pub fingerprint: fn(&K) -> u64,
    /// The sets an object may belong to (for the index).
    pub sets: fn(&K) -> Vec<SetKey>,
    /// The index to keep (if any).
    pub index: Option<Index>,
}

/// What is remembered of an object passed on: its fingerprint and the sets it was indexed under.
struct Seen {
    fingerprint: u64,
    sets: Vec<SetKey>,
}

struct State<K> {
    filter: Filter<K>,
    seen: HashMap<(String, String), Seen>,
    relisting: Option<HashSet<(String, String)>>,
}

fn key_of<K: Resource>(obj: &K) -> (String, String) {
    let meta = obj.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

impl<K: Resource> State<K> {
    /// The objects to pass on for one watch event.
    fn on(&mut self, event: watcher::Event<K>) -> Vec<K> {
        match event {
            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
                let key = key_of(&obj);
                if let Some(relist) = self.relisting.as_mut() {
                    relist.insert(key.clone());
                }
                let fingerprint = (self.filter.fingerprint)(&obj);
                let sets = (self.filter.sets)(&obj);
                if let Some(index) = &self.filter.index {
                    if let Some(before) = self.seen.get(&key) {
                        // Indexed under sets it no longer names (its labels changed).
                        let left: Vec<SetKey> = before
                            .sets
                            .iter()
                            .filter(|s| !sets.contains(s))
                            .cloned()
                            .collect();
                        index.remove(&left, &key.1);
                    }
                    index.insert(&sets, &key.1);
                }
                let before = self.seen.insert(key, Seen { fingerprint, sets });
                if before.is_some_and(|b| b.fingerprint == fingerprint) {
                    Vec::new()
                } else {
                    vec![obj]
                }
            }
            watcher::Event::Delete(obj) => {
                let key = key_of(&obj);
                self.seen.remove(&key);
                if let Some(index) = &self.filter.index {
                    index.remove(&(self.filter.sets)(&obj), &key.1);
                }
                vec![obj]
            }
            watcher::Event::Init => {
                self.relisting = Some(HashSet::new());
                Vec::new()
            }
            watcher::Event::InitDone => {
                // Objects deleted while the watch was down: forget them, and unindex them (the
                // cache no longer holds them either). Their sets are looked at again by the
                // periodic resync.
                if let Some(listed) = self.relisting.take() {
                    let index = self.filter.index.as_ref();
                    self.seen.retain(|k, seen| {
                        let keep = listed.contains(k);
                        if !keep && let Some(index) = index {
                            index.remove(&seen.sets, &k.1);
                        }
                        keep
                    });
                }
                Vec::new()
            }
        }
    }
}

/// Passes on the objects of a (reflected) watch whose fingerprint changed, and every deleted
/// one; keeps `filter.index` up to date.
pub fn changes<K, S>(events: S, filter: Filter<K>) -> impl Stream<Item = Result<K, watcher::Error>>
where
    K: Resource + Send + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut state = State {
        filter,
        seen: HashMap::new(),
        relisting: None,
    };
    events
        .map_ok(move |event| stream::iter(state.on(event).into_iter().map(Ok)))
        .try_flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(name: &str, value: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("ns".to_owned()),
                resource_version: Some(value.len().to_string()),
                ..ObjectMeta::default()
            },
            data: Some([("v".to_owned(), value.to_owned())].into()),
            ..ConfigMap::default()
        }
    }

    fn filter(index: &Index) -> Filter<ConfigMap> {
        Filter {
            fingerprint: |c| fingerprint(&c.data),
            sets: |c| vec![("ns".to_owned(), c.metadata.name.clone().unwrap_or_default())],
            index: Some(index.clone()),
        }
    }

    #[test]
    fn only_changes_and_deletions_pass_and_the_index_follows() {
        let index = Index::default();
        let mut s = State {
            filter: filter(&index),
            seen: HashMap::new(),
            relisting: None,
        };
        assert_eq!(s.on(watcher::Event::Apply(cm("a", "1"))).len(), 1);
        // 100 updates that change nothing that matters: none passes.
        for _ in 0..100 {
            assert!(s.on(watcher::Event::Apply(cm("a", "1"))).is_empty());
        }
        assert_eq!(s.on(watcher::Event::Apply(cm("a", "2"))).len(), 1);
        assert_eq!(index.names("ns", "a"), vec!["a".to_owned()]);
        // A deletion passes even though nothing changed.
        assert_eq!(s.on(watcher::Event::Delete(cm("a", "2"))).len(), 1);
        assert!(index.names("ns", "a").is_empty());
        assert_eq!(s.on(watcher::Event::Apply(cm("a", "2"))).len(), 1);
    }

    #[test]
    fn a_relist_forgets_what_it_did_not_list() {
        let index = Index::default();
        let mut s = State {
            filter: filter(&index),
            seen: HashMap::new(),
            relisting: None,
        };
        s.on(watcher::Event::Apply(cm("a", "1")));
        s.on(watcher::Event::Apply(cm("b", "1")));
        s.on(watcher::Event::Init);
        assert!(s.on(watcher::Event::InitApply(cm("a", "1"))).is_empty());
        s.on(watcher::Event::InitDone);
        assert_eq!(s.seen.len(), 1);
        assert!(
            index.names("ns", "b").is_empty(),
            "what the relist did not list is unindexed"
        );
        assert_eq!(index.names("ns", "a"), vec!["a".to_owned()]);
        // b comes back: it passes again.
        assert_eq!(s.on(watcher::Event::Apply(cm("b", "1"))).len(), 1);
    }

    #[test]
    fn an_object_whose_set_changed_is_indexed_under_the_new_one_only() {
        let index = Index::default();
        let mut s = State {
            filter: Filter {
                fingerprint: |c: &ConfigMap| fingerprint(&c.data),
                // The set is named by the value (as a drain pod's label names its set).
                sets: |c| vec![("ns".to_owned(), c.data.as_ref().unwrap()["v"].clone())],
                index: Some(index.clone()),
            },
            seen: HashMap::new(),
            relisting: None,
        };
        s.on(watcher::Event::Apply(cm("a", "web")));
        assert_eq!(index.names("ns", "web"), vec!["a".to_owned()]);
        s.on(watcher::Event::Apply(cm("a", "db")));
        assert!(index.names("ns", "web").is_empty());
        assert_eq!(index.names("ns", "db"), vec!["a".to_owned()]);
    }
}
