//! The names of every set of one kind, by namespace: all that is kept of the sets that do not
//! concern us (for the name clash between the two kinds of set, and for forgetting what is kept
//! for sets that are gone).

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

#[derive(Default)]
struct NamesInner {
    by_namespace: HashMap<Box<str>, HashSet<Box<str>>>,
    /// While a relist runs: the names it listed so far.
    relisting: Option<HashMap<Box<str>, HashSet<Box<str>>>>,
}

/// The names of every set of one kind, by namespace: all that is kept of the sets that do not
/// concern us.
#[derive(Default)]
pub struct SetNames(RwLock<NamesInner>);

impl SetNames {
    /// Whether a set named `name` is in `namespace`.
    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        let inner = self.0.read().expect("names lock");
        inner
            .by_namespace
            .get(namespace)
            .is_some_and(|names| names.contains(name))
    }

    /// How many sets there are.
    pub fn len(&self) -> usize {
        let inner = self.0.read().expect("names lock");
        inner.by_namespace.values().map(HashSet::len).sum()
    }

    /// Whether there is no set.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps up with one event of the sets' watch.
    pub fn on<K>(&self, event: &kube::runtime::watcher::Event<K>)
    where
        K: kube::Resource,
    {
        use kube::runtime::watcher::Event;
        let key = |obj: &K| {
            let m = obj.meta();
            (
                Box::<str>::from(m.namespace.as_deref().unwrap_or_default()),
                Box::<str>::from(m.name.as_deref().unwrap_or_default()),
            )
        };
        let mut guard = self.0.write().expect("names lock");
        let inner = &mut *guard;
        match event {
            Event::Apply(obj) | Event::InitApply(obj) => {
                let (ns, name) = key(obj);
                if let Some(relist) = inner.relisting.as_mut() {
                    relist.entry(ns.clone()).or_default().insert(name.clone());
                }
                inner.by_namespace.entry(ns).or_default().insert(name);
            }
            Event::Delete(obj) => {
                let (ns, name) = key(obj);
                for map in std::iter::once(&mut inner.by_namespace).chain(inner.relisting.as_mut())
                {
                    if let Some(names) = map.get_mut(&ns) {
                        names.remove(&name);
                        if names.is_empty() {
                            map.remove(&ns);
                        }
                    }
                }
            }
            Event::Init => inner.relisting = Some(HashMap::new()),
            Event::InitDone => {
                if let Some(mut listed) = inner.relisting.take() {
                    for names in listed.values_mut() {
                        names.shrink_to_fit();
                    }
                    listed.shrink_to_fit();
                    inner.by_namespace = listed;
                }
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSet;
    use kube::api::ObjectMeta;
    use kube::runtime::watcher::Event;

    fn set(name: &str) -> StatefulSet {
        StatefulSet {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("ns".to_owned()),
                ..ObjectMeta::default()
            },
            ..StatefulSet::default()
        }
    }

    #[test]
    fn set_names_follow_the_watch_and_a_relist_forgets_what_it_did_not_list() {
        let n = SetNames::default();
        n.on(&Event::Apply(set("a")));
        n.on(&Event::Apply(set("b")));
        assert!(n.contains("ns", "a") && n.contains("ns", "b"));
        n.on(&Event::Delete(set("a")));
        assert!(!n.contains("ns", "a"));
        n.on(&Event::<StatefulSet>::Init);
        n.on(&Event::InitApply(set("c")));
        // Until the relist ends, what was known still answers.
        assert!(n.contains("ns", "b"));
        n.on(&Event::<StatefulSet>::InitDone);
        assert!(!n.contains("ns", "b"));
        assert!(n.contains("ns", "c"));
        assert_eq!(n.len(), 1);
    }
}
