//! What the planner works with: one ordinal's view ([`Ordinal`]), the planner's state
//! ([`Planner`]), and the small rules its families share (backoff, the actions that delete a
//! drain pod, the merged drain record of an ordinal's claims).

use std::time::Duration;

use jiff::Timestamp;

use super::actions::{Action, ClaimRef, DeleteWhy, OrdinalState, Plan};
use super::observed::{Claim, DrainPod, DrainRecord, PodKind, PodObs};
use super::settings::{NewDrains, Settings};

/// Delay before attempt `failed + 1` after `failed` failed attempts: `base * 2^(failed-1)`,
/// capped at `max`.
pub fn backoff(failed: u32, base: Duration, max: Duration) -> Duration {
    let exp = failed.saturating_sub(1).min(30);
    base.saturating_mul(1u32 << exp).min(max)
}

pub(super) fn add(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

pub(super) fn until(now: Timestamp, t: Timestamp) -> Duration {
    Duration::try_from(t.duration_since(now)).unwrap_or(Duration::ZERO)
}

/// The merged record of an ordinal's live claims (they are written together; the one with the
/// most attempts wins if a crash left them apart).
pub(super) fn merged_record(claims: &[&Claim]) -> DrainRecord {
    let mut best = claims
        .iter()
        .max_by_key(|c| c.record.attempts)
        .map(|c| c.record.clone())
        .unwrap_or_default();
    for c in claims {
        let r = &c.record;
        best.first_attempt_at = match (best.first_attempt_at, r.first_attempt_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if best.pod_uid.is_none() {
            best.pod_uid.clone_from(&r.pod_uid);
        }
        if best.template_hash.is_none() {
            best.template_hash.clone_from(&r.template_hash);
        }
        if best.returned_at.is_none() {
            best.returned_at = r.returned_at;
        }
        best.held |= r.held;
        if best.fence_node.is_none() {
            best.fence_node.clone_from(&r.fence_node);
        }
        best.lost_nodes.extend(r.lost_nodes.iter().cloned());
        best.lost_nodes.sort();
        best.lost_nodes.dedup();
    }
    best
}

/// The delete of a drain pod that finished (no resourceVersion precondition: nothing left to
/// interrupt).
pub(super) fn delete_finished(ord: &Ordinal<'_>, pod: &PodObs, why: DeleteWhy) -> Action {
    Action::DeleteDrainPod {
        ordinal: ord.ordinal,
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        resource_version: None,
        why,
    }
}

/// Deletes a drain pod that has not (provably) finished; with `rv`, only if it has not changed
/// since it was observed (so one that succeeded meanwhile is not cancelled).
pub(super) fn delete_unfinished(
    ord: &Ordinal<'_>,
    pod: &PodObs,
    drain: &DrainPod,
    why: DeleteWhy,
    rv: bool,
) -> Action {
    Action::DeleteDrainPod {
        ordinal: ord.ordinal,
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        resource_version: rv.then(|| drain.resource_version.clone()),
        why,
    }
}

/// The record an ordinal's drain runs under, and the series to write when the claims do not
/// record the series of its drain pod: the claims' record, unless a drain pod made from
/// today's template exists and the claims record another series or none (a series' start is
/// written after its first create, and a crash may come in between); then the pod's series,
/// started when the pod was created.
pub(super) fn record_of(
    claims: DrainRecord,
    pod: Option<&PodObs>,
    new_drains: &NewDrains,
    now: Timestamp,
) -> (DrainRecord, Option<(Timestamp, String)>) {
    let (
        Some(PodObs {
            kind: PodKind::Drain(drain),
            ..
        }),
        NewDrains::Allowed { template_hash },
    ) = (pod, new_drains)
    else {
        return (claims, None);
    };
    let Some(hash) = drain.template_hash.as_ref().filter(|h| *h == template_hash) else {
        return (claims, None);
    };
    // A record without a hash (written by an older controller) is taken as the pod's series.
    let recorded = claims.first_attempt_at.is_some()
        && claims.template_hash.as_ref().is_none_or(|h| h == hash);
    if recorded {
        return (claims, None);
    }
    let start = drain.created_at.unwrap_or(now);
    // The counts belong to the earlier series; a return and an approval to the claims.
    let record = DrainRecord {
        first_attempt_at: Some(start),
        template_hash: Some(hash.clone()),
        returned_at: claims.returned_at,
        approved: claims.approved,
        held: claims.held,
        ..DrainRecord::default()
    };
    (record, Some((start, hash.clone())))
}

pub(super) fn claim_refs(claims: &[&Claim]) -> Vec<ClaimRef> {
    claims
        .iter()
        .map(|c| ClaimRef {
            name: c.name.clone(),
            uid: c.uid.clone(),
        })
        .collect()
}

/// What the planner knows of one ordinal.
pub(super) struct Ordinal<'a> {
    pub(super) ordinal: i32,
    pub(super) in_range: bool,
    /// All its claims, live or terminating.
    pub(super) claims: Vec<&'a Claim>,
    /// Its claims that are not being deleted.
    pub(super) live: Vec<&'a Claim>,
    pub(super) record: DrainRecord,
    /// The series of its drain pod when the claims do not record it (see
    /// [`Action::RecordDrainPod`]); `record` is then that series' start.
    pub(super) series: Option<(Timestamp, String)>,
    pub(super) previous: Option<&'a OrdinalState>,
}

impl Ordinal<'_> {
    pub(super) fn live_refs(&self) -> Vec<ClaimRef> {
        claim_refs(&self.live)
    }

    /// Whether the failure of this drain pod is already counted in the record.
    pub(super) fn counted(&self, pod: &PodObs) -> bool {
        self.record.counted_pod_uid.as_deref() == Some(pod.uid.as_str())
    }

    /// The time the last report showed it done, if it did.
    pub(super) fn done_at(&self) -> Option<String> {
        match self.previous {
            Some(OrdinalState::Done { at }) => Some(at.clone()),
            _ => None,
        }
    }
}

pub(super) struct Planner<'a> {
    pub(super) settings: &'a Settings,
    pub(super) set_name: &'a str,
    pub(super) claim_templates: &'a [String],
    /// The health of drain pods' nodes that were read ([`super::Snapshot::nodes`]).
    pub(super) nodes: &'a std::collections::BTreeMap<String, super::observed::NodeHealth>,
    pub(super) now: Timestamp,
    pub(super) plan: Plan,
    /// Slots taken by drains in flight (a drain pod exists, or a retry is pending).
    pub(super) busy: u32,
    /// Ordinals ready for a new drain pod, highest first.
    pub(super) candidates: Vec<(i32, Vec<&'a Claim>, DrainRecord)>,
}

/// What deleting the pod that blocks `ord` lets happen.
pub(super) fn unblocks(ord: &Ordinal<'_>) -> &'static str {
    if ord.in_range {
        "let the set start its pod"
    } else {
        "let the drain run"
    }
}
