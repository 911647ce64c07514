//! The status annotation this controller last wrote on each set, kept until the watch cache
//! catches up with it.
//!
//! A reconcile reads the set (and the previous status, which carries the `done` ordinals) from
//! the watch cache. Right after a status patch the cache can still hold the set from before it,
//! and a reconcile that starts then would plan from the older status and write it back, losing
//! what the patch recorded (seen in CI: an ordinal's `done` entry vanished). So each patch's
//! answer is remembered here, and a cached set older than it is read with the remembered status
//! instead. Resource versions are compared as integers, which Kubernetes guarantees since 1.35
//! (KEP-5504, comparable resource versions); a version that is not an integer is never taken as
//! older. This is only a read-your-writes aid: the cluster still holds every bit of state, and a
//! restarted controller starts with an empty memo.

use std::collections::HashMap;
use std::sync::Mutex;

use drain_api::annotations;
use k8s_openapi::api::apps::v1::StatefulSet;

/// What was written on one set.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Written {
    uid: String,
    resource_version: u64,
    status: Option<String>,
}

/// The last status written per set (`namespace/name`).
#[derive(Debug, Default)]
pub struct StatusMemo {
    written: Mutex<HashMap<String, Written>>,
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
    /// Remembers `patched`, the set as the API server returned it after a status patch.
    pub fn remember(&self, patched: &StatefulSet) {
        let (Some(uid), Some(resource_version)) = (patched.metadata.uid.clone(), version(patched))
        else {
            return;
        };
        let status = patched
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::STATUS))
            .cloned();
        self.written.lock().expect("status memo lock").insert(
            key(patched),
            Written {
                uid,
                resource_version,
                status,
            },
        );
    }

    /// `cached` with the remembered status if the cache has not caught up with the last patch
    /// yet; `None` if `cached` is current (the memo entry is then dropped).
    pub fn overlay(&self, cached: &StatefulSet) -> Option<StatefulSet> {
        let k = key(cached);
        let mut written = self.written.lock().expect("status memo lock");
        let w = written.get(&k)?;
        let older = cached.metadata.uid.as_deref() == Some(w.uid.as_str())
            && version(cached).is_some_and(|v| v < w.resource_version);
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
}
