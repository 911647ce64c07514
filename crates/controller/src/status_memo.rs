//! The status annotation this controller last wanted or wrote on each set, kept until the watch
//! cache catches up with it.
//!
//! A reconcile reads the set (and the previous status, which carries the `done` ordinals) from
//! the watch cache. Right after a status patch the cache can still hold the set from before it,
//! and a reconcile that starts then would plan from the older status and write it back, losing
//! what the patch recorded (seen in CI: an ordinal's `done` entry vanished). The status is also
//! written in the background ([`crate::status_writer`]), so the next reconcile may start before
//! the patch is even sent. So each wanted status is remembered here from the moment it is
//! handed to the writer (pending: shown to every read), and then the patch's answer (shown to a
//! cached set older than it). Resource versions are compared as integers, which Kubernetes
//! guarantees since 1.35 (KEP-5504, comparable resource versions); a version that is not an
//! integer is never taken as older. This is only a read-your-writes aid: the cluster still holds
//! every bit of state, and a restarted controller starts with an empty memo.

use std::collections::HashMap;
use std::sync::Mutex;

use drain_api::annotations;
use k8s_openapi::api::apps::v1::StatefulSet;

/// What was wanted or written on one set.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Written {
    uid: String,
    /// The version the patch returned; `None` while the patch is pending.
    resource_version: Option<u64>,
    status: Option<String>,
    /// Which want this is (see [`StatusMemo::want`]).
    seq: u64,
}

/// The last status written per set (`namespace/name`).
#[derive(Debug, Default)]
pub struct StatusMemo {
    written: Mutex<HashMap<String, Written>>,
    seq: std::sync::atomic::AtomicU64,
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

impl StatusMemo {
    /// Remembers that `status` is wanted on `set` (a patch is pending): every read shows it until
    /// the patch lands ([`written`](Self::written)) or fails for good ([`forget`](Self::forget)).
    /// Returns the want's number.
    pub fn want(&self, set: &StatefulSet, status: Option<String>) -> u64 {
        let seq = self
            .seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .wrapping_add(1);
        self.written.lock().expect("status memo lock").insert(
            key(set),
            Written {
                uid: set.metadata.uid.clone().unwrap_or_default(),
                resource_version: None,
                status,
                seq,
            },
        );
        seq
    }

    /// Remembers `patched`, the set as the API server returned it after the status patch of want
    /// `seq`; nothing if a newer want is pending (its status is what reads must show).
    pub fn written(&self, seq: u64, patched: &StatefulSet) {
        let mut written = self.written.lock().expect("status memo lock");
        let k = key(patched);
        if written.get(&k).is_some_and(|w| w.seq != seq) {
            return;
        }
        let (Some(uid), Some(resource_version)) = (patched.metadata.uid.clone(), version(patched))
        else {
            written.remove(&k);
            return;
        };
        let status = patched
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::STATUS))
            .cloned();
        written.insert(
            k,
            Written {
                uid,
                resource_version: Some(resource_version),
                status,
                seq,
            },
        );
    }

    /// Remembers `patched`, the set as the API server returned it after a status patch.
    #[cfg(test)]
    fn remember(&self, patched: &StatefulSet) {
        let seq = self.want(patched, None);
        self.written(seq, patched);
    }

    /// The status a read of `cached` shows: the one wanted or written, if the cache has not
    /// caught up with it, else the cached one.
    pub fn status(&self, cached: &StatefulSet) -> Option<String> {
        match self.overlay(cached) {
            Some(set) => set.metadata.annotations?.remove(annotations::STATUS),
            None => cached
                .metadata
                .annotations
                .as_ref()?
                .get(annotations::STATUS)
                .cloned(),
        }
    }

    /// Forgets want `seq` on a set (its patch failed for good), unless a newer one is pending.
    pub fn abandon(&self, namespace: &str, name: &str, seq: u64) {
        let mut written = self.written.lock().expect("status memo lock");
        let k = format!("{namespace}/{name}");
        if written.get(&k).is_some_and(|w| w.seq == seq) {
            written.remove(&k);
        }
    }

    /// `cached` with the remembered status if the cache has not caught up with the last patch
    /// yet; `None` if `cached` is current (the memo entry is then dropped).
    pub fn overlay(&self, cached: &StatefulSet) -> Option<StatefulSet> {
        let k = key(cached);
        let mut written = self.written.lock().expect("status memo lock");
        let w = written.get(&k)?;
        let same = cached.metadata.uid.as_deref() == Some(w.uid.as_str());
        let older = match w.resource_version {
            None => same,
            Some(written) => same && version(cached).is_some_and(|v| v < written),
        };
        if !older {
            written.remove(&k);
            return None;
        }
        let mut set = cached.clone();
        let annotations = set
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        match &w.status {
            Some(status) => annotations.insert(annotations::STATUS.to_owned(), status.clone()),
            None => annotations.remove(annotations::STATUS),
        };
        Some(set)
    }

    /// Forgets a set (deleted).
    pub fn forget(&self, set: &StatefulSet) {
        self.written
            .lock()
            .expect("status memo lock")
            .remove(&key(set));
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
        let stale = memo.overlay(&set("u", "100", Some("draining"))).unwrap();
        assert_eq!(status(&stale), Some("done"));
        assert_eq!(stale.metadata.resource_version.as_deref(), Some("100"));
        // Still stale on the next read.
        assert!(memo.overlay(&set("u", "119", None)).is_some());
    }

    #[test]
    fn a_removed_status_is_removed_from_a_stale_cache_too() {
        let memo = StatusMemo::default();
        memo.remember(&set("u", "120", None));
        let stale = memo.overlay(&set("u", "100", Some("draining"))).unwrap();
        assert_eq!(status(&stale), None);
    }

    #[test]
    fn a_current_or_newer_cache_wins_and_ends_the_memo() {
        let memo = StatusMemo::default();
        memo.remember(&set("u", "120", Some("done")));
        assert!(memo.overlay(&set("u", "120", Some("done"))).is_none());
        assert!(
            memo.overlay(&set("u", "100", Some("old"))).is_none(),
            "entry dropped"
        );

        memo.remember(&set("u", "120", Some("done")));
        assert!(memo.overlay(&set("u", "130", Some("other"))).is_none());
    }

    #[test]
    fn a_recreated_set_or_an_opaque_version_is_never_overlaid() {
        let memo = StatusMemo::default();
        memo.remember(&set("u", "120", Some("done")));
        assert!(memo.overlay(&set("other-uid", "100", None)).is_none());

        memo.remember(&set("u", "120", Some("done")));
        assert!(memo.overlay(&set("u", "not-a-number", None)).is_none());

        memo.remember(&set("u", "opaque", Some("done")));
        assert!(
            memo.overlay(&set("u", "1", None)).is_none(),
            "not remembered"
        );
    }

    #[test]
    fn forget_drops_the_entry() {
        let memo = StatusMemo::default();
        memo.remember(&set("u", "120", Some("done")));
        memo.forget(&set("u", "100", None));
        assert!(memo.overlay(&set("u", "100", None)).is_none());
    }

    #[test]
    fn a_pending_want_is_shown_to_every_read_of_the_same_set() {
        let memo = StatusMemo::default();
        memo.want(&set("u", "100", None), Some("wanted".into()));
        for rv in ["90", "100", "500"] {
            assert_eq!(
                memo.status(&set("u", rv, Some("cached"))).as_deref(),
                Some("wanted")
            );
        }
        assert_eq!(
            memo.status(&set("other-uid", "1", Some("cached")))
                .as_deref(),
            Some("cached"),
            "a recreated set is read as it is"
        );
    }

    #[test]
    fn an_older_want_written_late_does_not_hide_a_newer_pending_one() {
        let memo = StatusMemo::default();
        let first = memo.want(&set("u", "100", None), Some("first".into()));
        memo.want(&set("u", "100", None), Some("second".into()));
        memo.written(first, &set("u", "120", Some("first")));
        assert_eq!(
            memo.status(&set("u", "130", Some("first"))).as_deref(),
            Some("second")
        );
    }

    #[test]
    fn a_written_want_is_shown_until_the_cache_catches_up() {
        let memo = StatusMemo::default();
        let seq = memo.want(&set("u", "100", None), Some("wanted".into()));
        memo.written(seq, &set("u", "120", Some("wanted")));
        assert_eq!(
            memo.status(&set("u", "110", None)).as_deref(),
            Some("wanted")
        );
        assert_eq!(
            memo.status(&set("u", "120", Some("cache"))).as_deref(),
            Some("cache")
        );
    }

    #[test]
    fn abandon_drops_only_its_own_want() {
        let memo = StatusMemo::default();
        let first = memo.want(&set("u", "100", None), Some("first".into()));
        let second = memo.want(&set("u", "100", None), Some("second".into()));
        memo.abandon("ns", "web", first);
        assert_eq!(
            memo.status(&set("u", "100", None)).as_deref(),
            Some("second")
        );
        memo.abandon("ns", "web", second);
        assert_eq!(memo.status(&set("u", "100", None)), None);
    }
}
