//! Our own writes until their watches deliver them (read-your-writes): the drain pods we
//! created and deleted, the claims we annotated and deleted, and how a snapshot reads them over
//! the caches.

use std::sync::Arc;

use drain_api::labels;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::plan;
use crate::runtime::meta_cache::{ClaimEntry, version_of};
use crate::runtime::recent::{self, Recent};

/// Our recent writes (see [`crate::runtime::recent`]).
#[derive(Default)]
pub(super) struct Recents {
    /// Drain pods we created.
    pub(super) pods: Recent<Pod>,
    /// Claims we annotated.
    pub(super) claims: Recent<ClaimEntry>,
    /// Drain pods we deleted.
    pub(super) deleted_pods: recent::Deleted,
    /// Claims we deleted: read as being deleted until the cache shows it (a reconcile that ran
    /// before the claim's watch event would otherwise see the drained ordinal's claims as they
    /// were, its drain pod gone, and start a new drain on claims on their way out).
    pub(super) deleted_claims: recent::Deleted,
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
/// whatever the cache still shows of them ([`recent::Deleted`]): only the flag, never a
/// deletion time.
pub(super) fn mark_deleted(pods: &mut [plan::PodObs], deleted: impl Fn(&str) -> bool) {
    for pod in pods {
        if matches!(pod.kind, plan::PodKind::Drain(_)) && deleted(&pod.uid) {
            pod.terminating = true;
        }
    }
}

/// Marks the claims we deleted as being deleted, whatever the cache still shows of them
/// ([`recent::Deleted`]).
pub(super) fn mark_deleted_claims(claims: &mut [plan::Claim], deleted: impl Fn(&str) -> bool) {
    for claim in claims {
        if deleted(&claim.uid) {
            claim.terminating = true;
        }
    }
}
