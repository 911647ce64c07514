//! The status annotation this controller last wanted or wrote on each set, shown to reads from
//! a watch cache that has not caught up with it (so a reconcile right after a patch does not
//! plan from the older status and write it back): pending from the moment it is wanted until
//! written (and written again after a failure), then the patch's answer, shown to a cached set
//! older than it (resource versions compared as integers, KEP-5504). A read-your-writes aid
//! only: a restarted controller starts with an empty memo.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use drain_api::annotations;
use k8s_openapi::api::apps::v1::StatefulSet;

use crate::runtime::leader::Tenure;

/// A status handed to the writer and not written yet.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pending {
    /// Which want this is (see [`StatusMemo::want`]).
    seq: u64,
    /// The tenure it was wanted in: a want of an earlier tenure (this replica lost the lease and
    /// got it back meanwhile) is never shown, and never written.
    tenure: Tenure,
    status: Option<String>,
}

/// What was wanted and written on one set.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Written {
    uid: String,
    /// The last status that landed, and the version the patch returned.
    landed: Option<(u64, Option<String>)>,
    pending: Option<Pending>,
}

/// The last status wanted and written per set (`namespace/name`).
#[derive(Debug, Default)]
pub struct StatusMemo {
    written: Mutex<HashMap<String, Written>>,
    seq: AtomicU64,
}

fn key(set: &StatefulSet) -> String {
    format!(
        "{}/{}",
        set.metadata.namespace.as_deref().unwrap_or_default(),
        set.metadata.name.as_deref().unwrap_or_default()
    )
}

fn version(set: &StatefulSet) -> Option<u64> {
    set.metadata.resource_version.as_deref()?.parse().ok()
}

fn status_of(set: &StatefulSet) -> Option<String> {
    set.metadata
        .annotations
        .as_ref()?
        .get(annotations::STATUS)
        .cloned()
}

impl StatusMemo {
    /// Remembers that `status` is wanted on `set` in tenure `tenure` (a patch is
    /// pending): reads in that tenure show it until the patch lands ([`written`](Self::written))
    /// or is given up ([`abandon`](Self::abandon)). Returns the want's number.
    pub fn want(&self, set: &StatefulSet, status: Option<String>, tenure: Tenure) -> u64 {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let fresh = Written {
            uid: set.metadata.uid.clone().unwrap_or_default(),
            landed: None,
            pending: None,
        };
        let mut written = self.written.lock().expect("status memo lock");
        let entry = written.entry(key(set)).or_insert_with(|| fresh.clone());
        if entry.uid != fresh.uid {
            // A set recreated under the name: what landed on the old one says nothing.
            *entry = fresh;
        }
        entry.pending = Some(Pending {
            seq,
            tenure,
            status,
        });
        seq
    }

    /// Remembers `patched`, the set as the API server returned it after the status patch of want
    /// `seq`: the want is no longer pending (a newer one stays), and what landed is shown to a
    /// cached set older than `patched`. Nothing if the set was forgotten meanwhile.
    pub fn written(&self, seq: u64, patched: &StatefulSet) {
        let mut written = self.written.lock().expect("status memo lock");
        let Some(entry) = written.get_mut(&key(patched)) else {
            return;
        };
        if patched.metadata.uid.as_deref() != Some(entry.uid.as_str()) {
            return;
        }
        if entry.pending.as_ref().is_some_and(|p| p.seq == seq) {
            entry.pending = None;
        }
        if let Some(v) = version(patched)
            && entry.landed.as_ref().is_none_or(|(landed, _)| *landed < v)
        {
            entry.landed = Some((v, status_of(patched)));
        }
    }

    /// Gives up want `seq` on a set (the set is gone, or this replica may not write): it is no
    /// longer shown; what landed before it still is.
    pub fn abandon(&self, namespace: &str, name: &str, seq: u64) {
        let mut written = self.written.lock().expect("status memo lock");
        if let Some(entry) = written.get_mut(&format!("{namespace}/{name}"))
            && entry.pending.as_ref().is_some_and(|p| p.seq == seq)
        {
            entry.pending = None;
        }
    }

    /// Remembers `patched`, the set as the API server returned it after a status patch.
    #[cfg(test)]
    fn remember(&self, patched: &StatefulSet) {
        let seq = self.want(patched, None, Tenure::default());
        self.written(seq, patched);
    }

    /// Whether a status wanted on `cached`'s set in tenure `tenure` has not been written yet (its
    /// write failed: it is written again, even if it is what reads show).
    pub fn pending(&self, cached: &StatefulSet, tenure: Tenure) -> bool {
        let written = self.written.lock().expect("status memo lock");
        written.get(&key(cached)).is_some_and(|e| {
            cached.metadata.uid.as_deref() == Some(e.uid.as_str())
                && e.pending.as_ref().is_some_and(|p| p.tenure == tenure)
        })
    }

    /// The status a read of `cached` in tenure `tenure` shows: the one wanted, or the
    /// one written if the cache has not caught up with it, else the cached one.
    pub fn status(&self, cached: &StatefulSet, tenure: Tenure) -> Option<String> {
        match self.shown(cached, tenure) {
            Some(status) => status,
            None => status_of(cached),
        }
    }

    /// `cached` with the status wanted in tenure `tenure`, or with the status written if the cache
    /// has not caught up with it yet; `None` if `cached` is current.
    pub fn overlay(&self, cached: &StatefulSet, tenure: Tenure) -> Option<StatefulSet> {
        let status = self.shown(cached, tenure)?;
        let mut set = cached.clone();
        let annotations = set
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        match status {
            Some(status) => annotations.insert(annotations::STATUS.to_owned(), status),
            None => annotations.remove(annotations::STATUS),
        };
        Some(set)
    }

    /// The status to show instead of `cached`'s, if any (entries that have nothing left to show
    /// are dropped).
    fn shown(&self, cached: &StatefulSet, tenure: Tenure) -> Option<Option<String>> {
        let k = key(cached);
        let mut written = self.written.lock().expect("status memo lock");
        let entry = written.get_mut(&k)?;
        if cached.metadata.uid.as_deref() != Some(entry.uid.as_str()) {
            written.remove(&k);
            return None;
        }
        if entry.pending.as_ref().is_some_and(|p| p.tenure != tenure) {
            entry.pending = None;
        }
        if let Some(p) = &entry.pending {
            return Some(p.status.clone());
        }
        match &entry.landed {
            Some((v, status)) if version(cached).is_some_and(|c| c < *v) => Some(status.clone()),
            _ => {
                written.remove(&k);
                None
            }
        }
    }

    /// Forgets a set (deleted).
    pub fn forget(&self, set: &StatefulSet) {
        self.written
            .lock()
            .expect("status memo lock")
            .remove(&key(set));
    }

    /// Forgets every set for which `keep(namespace, name)` is false (sets gone).
    pub fn retain(&self, keep: impl Fn(&str, &str) -> bool) {
        self.written
            .lock()
            .expect("status memo lock")
            .retain(|k, _| {
                let (ns, name) = k.split_once('/').unwrap_or(("", k));
                keep(ns, name)
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn set(uid: &str, rv: &str, status: Option<&str>) -> StatefulSet {
        StatefulSet {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.into()),
                annotations: status
                    .map(|s| [(annotations::STATUS.to_owned(), s.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..StatefulSet::default()
        }
    }

    /// The calls of the tenure without election.
    impl StatusMemo {
        fn overlay_(&self, cached: &StatefulSet) -> Option<StatefulSet> {
            self.overlay(cached, Tenure::default())
        }
        fn status_(&self, cached: &StatefulSet) -> Option<String> {
            self.status(cached, Tenure::default())
        }
        fn want_(&self, set: &StatefulSet, status: Option<String>) -> u64 {
            self.want(set, status, Tenure::default())
        }
    }

    #[test]
    fn a_want_is_pending_until_written_and_only_in_its_tenure() {
        let memo = StatusMemo::default();
        let cached = set("u", "100", None);
        assert!(!memo.pending(&cached, Tenure::for_tests(1)));
        let seq = memo.want(&cached, Some("wanted".into()), Tenure::for_tests(1));
        assert!(
            memo.pending(&cached, Tenure::for_tests(1)),
            "a failed write is written again"
        );
        assert!(
            !memo.pending(&cached, Tenure::for_tests(2)),
            "not in another tenure"
        );
        assert!(
            !memo.pending(&set("other", "100", None), Tenure::for_tests(1)),
            "not for a set recreated"
        );
        memo.written(seq, &set("u", "101", Some("wanted")));
        assert!(!memo.pending(&cached, Tenure::for_tests(1)));
        assert_eq!(
            memo.status(&cached, Tenure::for_tests(1)).as_deref(),
            Some("wanted")
        );
    }

    #[test]
    fn a_want_of_an_earlier_tenure_is_never_shown() {
        let memo = StatusMemo::default();
        memo.want(
            &set("u", "100", None),
            Some("stale".into()),
            Tenure::for_tests(1),
        );
        assert_eq!(
            memo.status(&set("u", "100", Some("cached")), Tenure::for_tests(2))
                .as_deref(),
            Some("cached")
        );
        assert_eq!(
            memo.status(&set("u", "100", Some("cached")), Tenure::for_tests(1))
                .as_deref(),
            Some("cached"),
            "dropped for good"
        );
    }

    #[test]
    fn giving_up_a_want_still_shows_what_landed_before_it() {
        let memo = StatusMemo::default();
        memo.remember(&set("u", "120", Some("done")));
        let next = memo.want_(&set("u", "100", None), Some("next".into()));
        memo.abandon("ns", "web", next);
        assert_eq!(
            memo.status_(&set("u", "100", Some("draining"))).as_deref(),
            Some("done")
        );
    }

    #[test]
    fn a_late_answer_for_a_forgotten_set_is_not_remembered() {
        let memo = StatusMemo::default();
        let seq = memo.want_(&set("u", "100", None), Some("a".into()));
        memo.forget(&set("u", "100", None));
        memo.written(seq, &set("u", "120", Some("a")));
        assert_eq!(
            memo.status_(&set("u", "100", Some("x"))).as_deref(),
            Some("x")
        );
        assert!(memo.written.lock().unwrap().is_empty());
    }

    fn status(s: &StatefulSet) -> Option<&str> {
        s.metadata
            .annotations
            .as_ref()?
            .get(annotations::STATUS)
            .map(String::as_str)
    }

    #[test]
    fn a_stale_cache_reads_the_written_status() {
        let memo = StatusMemo::default();
        memo.remember(&set("u", "120", Some("done")));
        let stale = memo.overlay_(&set("u", "100", Some("draining"))).unwrap();
        assert_eq!(status(&stale), Some("done"));
        assert_eq!(stale.metadata.resource_version.as_deref(), Some("100"));
        // Still stale on the next read.
        assert!(memo.overlay_(&set("u", "119", None)).is_some());
    }

    #[test]
    fn a_removed_status_is_removed_from_a_stale_cache_too() {
        let memo = StatusMemo::default();
        memo.remember(&set("u", "120", None));
        let stale = memo.overlay_(&set("u", "100", Some("draining"))).unwrap();
        assert_eq!(status(&stale), None);
    }

    #[test]
    fn a_current_or_newer_cache_wins_and_ends_the_memo() {
        let memo = StatusMemo::default();
        memo.remember(&set("u", "120", Some("done")));
        assert!(memo.overlay_(&set("u", "120", Some("done"))).is_none());
        assert!(
            memo.overlay_(&set("u", "100", Some("old"))).is_none(),
            "entry dropped"
        );

        memo.remember(&set("u", "120", Some("done")));
        assert!(memo.overlay_(&set("u", "130", Some("other"))).is_none());
    }

    #[test]
    fn a_recreated_set_or_an_opaque_version_is_never_overlaid() {
        let memo = StatusMemo::default();
        memo.remember(&set("u", "120", Some("done")));
        assert!(memo.overlay_(&set("other-uid", "100", None)).is_none());

        memo.remember(&set("u", "120", Some("done")));
        assert!(memo.overlay_(&set("u", "not-a-number", None)).is_none());

        memo.remember(&set("u", "opaque", Some("done")));
        assert!(
            memo.overlay_(&set("u", "1", None)).is_none(),
            "not remembered"
        );
    }

    #[test]
    fn retain_forgets_the_sets_not_kept() {
        let memo = StatusMemo::default();
        let mut other = set("v", "100", None);
        other.metadata.name = Some("db".into());
        memo.want(&set("u", "100", None), Some("a".into()), Tenure::default());
        memo.want(&other, Some("b".into()), Tenure::default());
        memo.retain(|ns, name| ns == "ns" && name == "db");
        assert_eq!(memo.status(&set("u", "100", None), Tenure::default()), None);
        assert_eq!(memo.status(&other, Tenure::default()), Some("b".into()));
    }

    #[test]
    fn forget_drops_the_entry() {
        let memo = StatusMemo::default();
        memo.remember(&set("u", "120", Some("done")));
        memo.forget(&set("u", "100", None));
        assert!(memo.overlay_(&set("u", "100", None)).is_none());
    }

    #[test]
    fn a_pending_want_is_shown_to_every_read_of_the_same_set() {
        let memo = StatusMemo::default();
        memo.want_(&set("u", "100", None), Some("wanted".into()));
        for rv in ["90", "100", "500"] {
            assert_eq!(
                memo.status_(&set("u", rv, Some("cached"))).as_deref(),
                Some("wanted")
            );
        }
        assert_eq!(
            memo.status_(&set("other-uid", "1", Some("cached")))
                .as_deref(),
            Some("cached"),
            "a recreated set is read as it is"
        );
    }

    #[test]
    fn an_older_want_written_late_does_not_hide_a_newer_pending_one() {
        let memo = StatusMemo::default();
        let first = memo.want_(&set("u", "100", None), Some("first".into()));
        memo.want_(&set("u", "100", None), Some("second".into()));
        memo.written(first, &set("u", "120", Some("first")));
        assert_eq!(
            memo.status_(&set("u", "130", Some("first"))).as_deref(),
            Some("second")
        );
    }

    #[test]
    fn a_written_want_is_shown_until_the_cache_catches_up() {
        let memo = StatusMemo::default();
        let seq = memo.want_(&set("u", "100", None), Some("wanted".into()));
        memo.written(seq, &set("u", "120", Some("wanted")));
        assert_eq!(
            memo.status_(&set("u", "110", None)).as_deref(),
            Some("wanted")
        );
        assert_eq!(
            memo.status_(&set("u", "120", Some("cache"))).as_deref(),
            Some("cache")
        );
    }

    #[test]
    fn abandon_drops_only_its_own_want() {
        let memo = StatusMemo::default();
        let first = memo.want_(&set("u", "100", None), Some("first".into()));
        let second = memo.want_(&set("u", "100", None), Some("second".into()));
        memo.abandon("ns", "web", first);
        assert_eq!(
            memo.status_(&set("u", "100", None)).as_deref(),
            Some("second")
        );
        memo.abandon("ns", "web", second);
        assert_eq!(memo.status_(&set("u", "100", None)), None);
    }
}
