//! Which sets' pods and claims the caches keep, and which sets exist at all.
//!
//! A large cluster holds thousands of StatefulSets and tens of thousands of their pods and
//! claims, nearly all of sets that never opted in. The caches keep only what concerns us
//! ([`crate::set_kind::concerns_us`]): the sets that opted in or have drains in flight
//! ([`Interest`]), and the pods and claims that may be theirs; of every other set, only that it
//! exists ([`SetNames`], for the name clash between the two kinds of set and for forgetting what
//! is kept for sets that are gone).
//!
//! A set that comes to concern us once the pod and claim watches have listed has no pods or
//! claims cached: it is [`Fill::Pending`] until they are listed for it
//! ([`crate::runtime::meta_cache::Cache::merge`]), and is not planned before. A set that
//! concerned us before the pod and claim watches started is covered by their first list.

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

use crate::set_kind::SetKind;

/// Whether a set's pods and claims are all in the caches yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// Not yet: they are being listed for it.
    Pending,
    /// Yes: every change since is kept, and so was everything before.
    Done,
}

/// What is known of one set that concerns us: of which kinds it is (a set of each kind may
/// share the name), and whether its pods and claims are cached.
#[derive(Clone, Copy, Debug)]
struct Wanted {
    kinds: u8,
    fill: Fill,
    /// Which entry of this name it is: a fill marks only the entry it was started for (a set
    /// that left and came back while a fill was in flight is filled again).
    generation: u64,
}

fn bit(kind: SetKind) -> u8 {
    match kind {
        SetKind::StatefulSet => 1,
        SetKind::Advanced => 2,
    }
}

#[derive(Default)]
struct InterestInner {
    by_namespace: HashMap<Box<str>, HashMap<Box<str>, Wanted>>,
    /// Whether the pod and claim watches have started: a set entering after needs a fill.
    caches_started: bool,
    /// The generation of the last entry made.
    generations: u64,
}

/// The sets whose pods and claims the caches keep, by namespace and name.
#[derive(Default)]
pub struct Interest(RwLock<InterestInner>);

/// What [`Interest::enter`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entered {
    /// The set concerned us already (as this kind or the other).
    Known,
    /// It is new, and the first lists of the pod and claim watches will cover it.
    Covered,
    /// It is new, and its pods and claims must be listed for it: fill it.
    NeedsFill,
}

impl Interest {
    /// The entry of the set `name` in `namespace`, if it concerns us.
    fn get(&self, namespace: &str, name: &str) -> Option<Wanted> {
        let inner = self.0.read().expect("interest lock");
        inner.by_namespace.get(namespace)?.get(name).copied()
    }

    /// Whether the pods and claims of the set `name` in `namespace` are kept.
    pub fn wants(&self, namespace: &str, name: &str) -> bool {
        self.get(namespace, name).is_some()
    }

    /// Whether the set `name` in `namespace` concerns us and its pods and claims are all cached.
    pub fn ready(&self, namespace: &str, name: &str) -> bool {
        self.get(namespace, name)
            .is_some_and(|w| w.fill == Fill::Done)
    }

    /// The set of `kind` concerns us (from now on its pods and claims are kept); whether its
    /// pods and claims must be listed for it.
    pub fn enter(&self, kind: SetKind, namespace: &str, name: &str) -> Entered {
        // Called for every change of every set that concerns us: the common case (known as
        // this kind already) takes the read lock only.
        if self
            .get(namespace, name)
            .is_some_and(|w| w.kinds & bit(kind) != 0)
        {
            return Entered::Known;
        }
        let mut inner = self.0.write().expect("interest lock");
        let fill = if inner.caches_started {
            Fill::Pending
        } else {
            Fill::Done
        };
        inner.generations += 1;
        let generation = inner.generations;
        let sets = inner.by_namespace.entry(namespace.into()).or_default();
        match sets.get_mut(name) {
            Some(w) => {
                w.kinds |= bit(kind);
                Entered::Known
            }
            None => {
                sets.insert(
                    name.into(),
                    Wanted {
                        kinds: bit(kind),
                        fill,
                        generation,
                    },
                );
                match fill {
                    Fill::Pending => Entered::NeedsFill,
                    Fill::Done => Entered::Covered,
                }
            }
        }
    }

    /// The set of `kind` no longer concerns us (opted out with nothing in flight, or deleted).
    pub fn leave(&self, kind: SetKind, namespace: &str, name: &str) {
        // Called for every change of every set that does not concern us: the common case
        // takes the read lock only.
        if !self.wants(namespace, name) {
            return;
        }
        let mut inner = self.0.write().expect("interest lock");
        let Some(sets) = inner.by_namespace.get_mut(namespace) else {
            return;
        };
        if let Some(w) = sets.get_mut(name) {
            w.kinds &= !bit(kind);
            if w.kinds == 0 {
                sets.remove(name);
            }
        }
        if sets.is_empty() {
            inner.by_namespace.remove(namespace);
        }
    }

    /// Keeps, of the sets of `kind`, only those `listed` (after a relist of that kind).
    pub fn retain(&self, kind: SetKind, listed: &HashSet<(String, String)>) {
        let mut inner = self.0.write().expect("interest lock");
        for (ns, sets) in inner.by_namespace.iter_mut() {
            sets.retain(|name, w| {
                if w.kinds & bit(kind) != 0 && !listed.contains(&(ns.to_string(), name.to_string()))
                {
                    w.kinds &= !bit(kind);
                }
                w.kinds != 0
            });
        }
        inner.by_namespace.retain(|_, sets| !sets.is_empty());
    }

    /// Which entry the set `name` in `namespace` is (`None`: it does not concern us), for
    /// [`Interest::filled`].
    pub fn generation(&self, namespace: &str, name: &str) -> Option<u64> {
        self.get(namespace, name).map(|w| w.generation)
    }

    /// The pods and claims of the set are all cached now, if it is still the entry of
    /// `generation` (taken before the fill began); whether it was marked.
    pub fn filled(&self, namespace: &str, name: &str, generation: u64) -> bool {
        let mut inner = self.0.write().expect("interest lock");
        match inner
            .by_namespace
            .get_mut(namespace)
            .and_then(|sets| sets.get_mut(name))
        {
            Some(w) if w.generation == generation => {
                w.fill = Fill::Done;
                true
            }
            _ => false,
        }
    }

    /// The pod and claim watches start now: a set that enters from now on needs a fill. Called
    /// before their first list is asked for.
    pub fn caches_start(&self) {
        self.0.write().expect("interest lock").caches_started = true;
    }

    /// How many sets concern us.
    pub fn len(&self) -> usize {
        let inner = self.0.read().expect("interest lock");
        inner.by_namespace.values().map(HashMap::len).sum()
    }

    /// Whether no set concerns us.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether the pod `name` in `namespace`, controlled by the sets named `owners`, may be a pod
/// of a set that concerns us: by its name (`<set>-<ordinal>`, which a pod holding a set's name
/// has whoever made it) or by its controller.
pub fn wants_pod<'a>(
    interest: &Interest,
    namespace: &str,
    name: &str,
    owners: impl IntoIterator<Item = &'a str>,
) -> bool {
    let by_name = name
        .rsplit_once('-')
        .filter(|(_, o)| drain_api::names::parse_ordinal(o).is_some())
        .is_some_and(|(set, _)| interest.wants(namespace, set));
    by_name || owners.into_iter().any(|o| interest.wants(namespace, o))
}

/// Whether the claim `name` in `namespace` may be a claim of a set that concerns us (by its
/// name, `<template>-<set>-<ordinal>`).
pub fn wants_claim(interest: &Interest, namespace: &str, name: &str) -> bool {
    drain_api::names::claim_set_candidates(name)
        .into_iter()
        .any(|set| interest.wants(namespace, set))
}

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
    fn a_set_entering_before_the_caches_start_is_covered_and_after_needs_a_fill() {
        let i = Interest::default();
        assert_eq!(i.enter(SetKind::StatefulSet, "ns", "a"), Entered::Covered);
        assert!(i.ready("ns", "a"));
        i.caches_start();
        assert_eq!(i.enter(SetKind::StatefulSet, "ns", "b"), Entered::NeedsFill);
        assert!(i.wants("ns", "b"));
        assert!(
            !i.ready("ns", "b"),
            "planned before its pods and claims were listed"
        );
        assert_eq!(i.enter(SetKind::StatefulSet, "ns", "b"), Entered::Known);
        let generation = i.generation("ns", "b").unwrap();
        assert!(i.filled("ns", "b", generation));
        assert!(i.ready("ns", "b"));
        assert!(!i.wants("other", "b"));
    }

    #[test]
    fn a_fill_marks_only_the_entry_it_was_started_for() {
        let i = Interest::default();
        i.caches_start();
        i.enter(SetKind::StatefulSet, "ns", "a");
        let started_for = i.generation("ns", "a").unwrap();
        // The set leaves and comes back while the fill is in flight: pods made meanwhile were
        // not kept, so the fill begun before must not mark it.
        i.leave(SetKind::StatefulSet, "ns", "a");
        assert_eq!(i.enter(SetKind::Advanced, "ns", "a"), Entered::NeedsFill);
        assert!(!i.filled("ns", "a", started_for));
        assert!(!i.ready("ns", "a"));
        let again = i.generation("ns", "a").unwrap();
        assert!(i.filled("ns", "a", again));
        assert!(i.ready("ns", "a"));
        assert!(!i.filled("ns", "gone", again));
    }

    #[test]
    fn a_name_shared_by_both_kinds_is_wanted_until_both_leave() {
        let i = Interest::default();
        i.enter(SetKind::StatefulSet, "ns", "a");
        assert_eq!(i.enter(SetKind::Advanced, "ns", "a"), Entered::Known);
        i.leave(SetKind::StatefulSet, "ns", "a");
        assert!(i.wants("ns", "a"));
        i.leave(SetKind::Advanced, "ns", "a");
        assert!(!i.wants("ns", "a"));
        assert!(i.is_empty());
        // Entering again after leaving, once the caches run: a fill.
        i.caches_start();
        assert_eq!(i.enter(SetKind::Advanced, "ns", "a"), Entered::NeedsFill);
    }

    #[test]
    fn a_relist_of_one_kind_drops_only_that_kinds_sets_it_did_not_list() {
        let i = Interest::default();
        i.enter(SetKind::StatefulSet, "ns", "a");
        i.enter(SetKind::StatefulSet, "ns", "b");
        i.enter(SetKind::Advanced, "ns", "b");
        i.enter(SetKind::Advanced, "ns", "c");
        i.retain(
            SetKind::StatefulSet,
            &HashSet::from([("ns".to_owned(), "a".to_owned())]),
        );
        assert!(i.wants("ns", "a"));
        assert!(i.wants("ns", "b"), "still an Advanced StatefulSet's");
        assert!(i.wants("ns", "c"));
        assert_eq!(i.len(), 3);
        i.retain(SetKind::Advanced, &HashSet::new());
        assert_eq!(i.len(), 1);
    }

    #[test]
    fn pods_are_wanted_by_name_or_by_controller_and_claims_by_name() {
        let i = Interest::default();
        i.enter(SetKind::StatefulSet, "ns", "my-web");
        assert!(wants_pod(&i, "ns", "my-web-3", []));
        assert!(wants_pod(&i, "ns", "odd-name", ["my-web"]));
        assert!(!wants_pod(&i, "ns", "web-3", ["web"]));
        assert!(!wants_pod(&i, "ns", "my-web-x", []));
        assert!(!wants_pod(&i, "other", "my-web-3", []));
        assert!(wants_claim(&i, "ns", "data-my-web-3"));
        assert!(!wants_claim(&i, "ns", "data-web-3"));
        assert!(!wants_claim(&i, "ns", "my-web-3"));
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
