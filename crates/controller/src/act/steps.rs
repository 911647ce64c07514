//! One function per kind of action: the calls each makes through the [`Cluster`] seam, in order,
//! with the idempotence and preconditions each needs. `apply_one` in the parent dispatches here.

use std::collections::BTreeMap;

use drain_api::claim_annotations;
use jiff::Timestamp;
use tracing::{debug, info, warn};

use super::context::{ActCtx, Outcome};
use super::errors::ActError;
use super::seam::{Cluster, Created, Deleted, EventSpec, Patched, Retained, Severity, Subject};
use crate::observe;
use crate::plan::{ClaimRef, DeleteWhy};
use crate::template::DrainPodInput;

/// Records the drain pod's UID on its claims.
pub(super) async fn record_drain_pod<C: Cluster>(
    cluster: &C,
    claims: &[ClaimRef],
    pod_uid: &str,
    series: Option<&(Timestamp, String)>,
) -> Result<Outcome, ActError> {
    let mut record = set(&[(claim_annotations::POD_UID, pod_uid.to_owned())]);
    if let Some((at, hash)) = series {
        record.extend(series_record(*at, hash, false));
    }
    annotate_all(cluster, claims, &record).await
}

/// The claim annotations that start a series of attempts: its start and template; the counts
/// of an earlier series go, and with `new_drain` also an earlier return (a series repaired
/// for a running drain pod keeps a return recorded for it).
fn series_record(at: Timestamp, hash: &str, new_drain: bool) -> BTreeMap<String, Option<String>> {
    let mut cleared = vec![
        claim_annotations::ATTEMPTS,
        claim_annotations::RETRY_AFTER,
        claim_annotations::LAST_FAILURE,
        claim_annotations::COUNTED_POD_UID,
    ];
    if new_drain {
        cleared.push(claim_annotations::RETURNED_AT);
    }
    let mut record: BTreeMap<String, Option<String>> =
        cleared.iter().map(|k| ((*k).to_owned(), None)).collect();
    record.insert(
        claim_annotations::FIRST_ATTEMPT_AT.to_owned(),
        Some(at.to_string()),
    );
    record.insert(
        claim_annotations::TEMPLATE_HASH.to_owned(),
        Some(hash.to_owned()),
    );
    record
}

/// A failed attempt, as counted on the claims.
pub(super) struct Failure<'a> {
    pub(super) pod_uid: &'a str,
    pub(super) attempts: u32,
    pub(super) retry_after: Timestamp,
    pub(super) reason: &'a str,
    /// The pod vanished from the cache: count it only once the API server confirms it is gone.
    pub(super) only_if_pod_gone: bool,
    /// The failed pod's series, when the claims do not record it yet.
    pub(super) series: Option<&'a (Timestamp, String)>,
}

/// Before counting a drain pod that vanished from the cache: whether the API server still has
/// it (the cache lagged), which is [`Outcome::Stale`] and no failure.
async fn confirm_pod_gone<C: Cluster>(
    cluster: &C,
    ctx: &ActCtx<'_>,
    ordinal: i32,
    pod_uid: &str,
) -> Result<Option<Outcome>, ActError> {
    let name = ctx.pod_name(ordinal);
    let live = cluster
        .pod_uid(&name)
        .await
        .map_err(|source| ActError::Confirm {
            what: format!("pod {name}"),
            source,
        })?;
    if live.as_deref() == Some(pod_uid) {
        info!(pod = %name, "drain pod still exists (the cache lagged); not a failure");
        return Ok(Some(Outcome::Stale("drain pod still exists")));
    }
    Ok(None)
}

/// Counts a failed attempt on the claims: attempts, when to retry, why, and which pod.
pub(super) async fn record_failure<C: Cluster>(
    cluster: &C,
    ctx: &ActCtx<'_>,
    ordinal: i32,
    claims: &[ClaimRef],
    failure: &Failure<'_>,
) -> Result<Outcome, ActError> {
    if failure.only_if_pod_gone
        && let Some(stale) = confirm_pod_gone(cluster, ctx, ordinal, failure.pod_uid).await?
    {
        return Ok(stale);
    }
    let mut record = BTreeMap::new();
    if let Some((at, hash)) = failure.series {
        record.extend(series_record(*at, hash, false));
    }
    record.extend(set(&[
        (claim_annotations::ATTEMPTS, failure.attempts.to_string()),
        (
            claim_annotations::RETRY_AFTER,
            failure.retry_after.to_string(),
        ),
        (claim_annotations::LAST_FAILURE, failure.reason.to_owned()),
        (
            claim_annotations::COUNTED_POD_UID,
            failure.pod_uid.to_owned(),
        ),
        // The attempt counted is the current one: a record whose pod was never written (a
        // crash, or a failed write, after the create) is made whole.
        (claim_annotations::POD_UID, failure.pod_uid.to_owned()),
    ]));
    annotate_all(cluster, claims, &record).await
}

/// Records on the claims when the scale-up that brought the ordinal back was seen.
pub(super) async fn record_return<C: Cluster>(
    cluster: &C,
    claims: &[ClaimRef],
    at: Timestamp,
) -> Result<Outcome, ActError> {
    let record = set(&[(claim_annotations::RETURNED_AT, at.to_string())]);
    annotate_all(cluster, claims, &record).await
}

/// Deletes a drain pod with its preconditions; one that is gone or changed stops the ordinal.
pub(super) async fn delete_drain_pod<C: Cluster>(
    cluster: &C,
    name: &str,
    uid: &str,
    resource_version: Option<&str>,
    why: DeleteWhy,
) -> Result<Outcome, ActError> {
    let deleted = cluster
        .delete_pod(name, uid, resource_version)
        .await
        .map_err(|source| ActError::DeleteDrainPod {
            name: name.to_owned(),
            source,
        })?;
    info!(pod = %name, ?why, ?deleted, "deleted drain pod");
    Ok(match deleted {
        Deleted::Deleted => Outcome::Done,
        Deleted::Gone | Deleted::Changed => Outcome::Changed,
    })
}

/// Deletes drained claims, each with its UID precondition, stopping at the first failure.
pub(super) async fn delete_claims<C: Cluster>(
    cluster: &C,
    claims: &[ClaimRef],
) -> Result<Outcome, ActError> {
    for c in claims {
        cluster
            .delete_claim(&c.name, &c.uid)
            .await
            .map_err(|source| ActError::DeleteClaim {
                name: c.name.clone(),
                source,
            })?;
        info!(claim = %c.name, "deleted drained claim");
    }
    Ok(Outcome::Done)
}

/// Retains the volume of each claim before it is deleted; stops at the first that cannot be.
pub(super) async fn retain_volumes<C: Cluster>(
    cluster: &C,
    pod: &str,
    claims: &[ClaimRef],
    until: Timestamp,
) -> Result<Outcome, ActError> {
    let mut lines = Vec::new();
    for c in claims {
        let retained = cluster
            .retain_volume(c, pod, until)
            .await
            .map_err(|source| ActError::RetainVolume {
                name: c.name.clone(),
                source,
            })?;
        let line = match retained {
            Retained::Marked { volume } => {
                info!(claim = %c.name, %volume, %until, "retained the drained claim's volume");
                format!(
                    "volume {volume} of claim {} is retained until {until}",
                    c.name
                )
            }
            Retained::KeptByOwner { volume } => format!(
                "volume {volume} of claim {} has reclaim policy Retain already; left as it is",
                c.name
            ),
            Retained::NoVolume => format!("claim {} is bound to no volume", c.name),
            Retained::ClaimGone => return Ok(Outcome::ClaimGone(c.name.clone())),
        };
        lines.push(line);
    }
    Ok(Outcome::Retained(lines))
}

/// Removes every drain annotation from the claims.
pub(super) async fn clear_record<C: Cluster>(
    cluster: &C,
    claims: &[ClaimRef],
) -> Result<Outcome, ActError> {
    let clear: BTreeMap<String, Option<String>> = claim_annotations::ALL
        .iter()
        .map(|k| ((*k).to_owned(), None))
        .collect();
    annotate_all(cluster, claims, &clear).await
}

/// The drain pod [`create_drain_pod`] makes: its claims by template, its attempt, the nodes it
/// is kept off, and the series to record when it starts one.
#[derive(Clone, Copy)]
pub(super) struct NewDrainPod<'a> {
    pub(super) claims: &'a BTreeMap<String, ClaimRef>,
    pub(super) attempt: u32,
    pub(super) avoid_nodes: &'a [String],
    pub(super) new_series: Option<&'a (Timestamp, String)>,
}

/// Starts a new series on the claims if the plan says so, creates the drain pod and records its
/// UID on the claims, right after the create.
///
/// The live check that the ordinal is still out of range (a guard against a stale cache) runs
/// once the create has answered rather than before it: one round trip instead of two between a
/// pod's going and its drain pod. A create the live set proves wrong, or cannot confirm, is withdrawn
/// at once (deleted with its UID as the only precondition, its claims unrecorded), normally
/// before the node starts it; had it started, it would be a drain stopped by a delete, not a
/// success. A withdrawal that fails is left to the set's next reconciles
/// ([`Cluster::withdraw_later`]). The read goes first when [`Cluster::confirm_first`] says so.
pub(super) async fn create_drain_pod<C: Cluster>(
    cluster: &C,
    ctx: &ActCtx<'_>,
    ordinal: i32,
    new: &NewDrainPod<'_>,
) -> Result<Outcome, ActError> {
    let NewDrainPod {
        claims,
        attempt,
        avoid_nodes,
        new_series,
    } = *new;
    let name = ctx.pod_name(ordinal);
    let template = ctx
        .template
        .ok_or_else(|| ActError::NoTemplate { name: name.clone() })?;
    let refs: Vec<ClaimRef> = claims.values().cloned().collect();
    let revision = controller_revision(cluster, template.set_uid(), ctx.revision).await;
    let pod = template.pod(&DrainPodInput {
        ordinal,
        replicas: ctx.replicas,
        claims: claims
            .iter()
            .map(|(t, c)| (t.clone(), (c.name.clone(), c.uid.clone())))
            .collect(),
        avoid_nodes: avoid_nodes.to_vec(),
        revision,
    });
    let confirm = |source| ActError::Confirm {
        what: "the statefulset".to_owned(),
        source,
    };
    let (orphaned, created) = if cluster.confirm_first() {
        if !cluster.still_orphaned(ordinal).await.map_err(confirm)? {
            return Ok(back_in_range(ordinal));
        }
        (Ok(true), cluster.create_pod(&pod).await)
    } else {
        // The create goes out alone and the read once it has answered: sent together, the read
        // (a quorum read of etcd, 10–50 ms under a scale-down's load) competed with the create
        // for the API server, etcd and the node's two cores and slowed it by a millisecond or
        // two (issue 27). Read after the create, the set is at least as new as the pod.
        let created = cluster.create_pod(&pod).await;
        (
            cluster.still_orphaned(ordinal).await.map_err(confirm),
            created,
        )
    };
    let created = match (created, &orphaned) {
        (Ok(created), _) => created,
        (Err(_), Ok(false)) => return Ok(back_in_range(ordinal)),
        (Err(source), _) => return Err(ActError::CreateDrainPod { name, source }),
    };
    match (created, orphaned) {
        (Created::Uid(uid), Ok(true)) => {
            info!(pod = %name, attempt, "created drain pod");
            let mut record = set(&[(claim_annotations::POD_UID, uid.clone())]);
            if let Some((at, hash)) = new_series {
                // A new series: written with the pod, after the create, so nothing delays it.
                record.extend(series_record(*at, hash, true));
            }
            // Right after the create. A claim replaced just now leaves the pod unrecorded: the
            // next reconcile plans from what it finds. The pod exists either way, so it is
            // reported.
            annotate_all(cluster, &refs, &record).await?;
            Ok(Outcome::Created(uid))
        }
        (Created::Uid(uid), unconfirmed) => {
            // The UID alone as precondition: the pod is withdrawn whatever became of it (it has
            // been scheduled by now, which changes its resourceVersion).
            if let Err(source) = cluster.delete_pod(&name, &uid, None).await {
                cluster.withdraw_later(&name, &uid);
                return Err(ActError::DeleteDrainPod { name, source });
            }
            info!(pod = %name, "drain pod withdrawn right after its create: the live set did not confirm its ordinal out of range");
            unconfirmed.map(|_| back_in_range(ordinal))
        }
        (Created::AlreadyExists, Ok(false)) => Ok(back_in_range(ordinal)),
        (Created::AlreadyExists, Err(e)) => Err(e),
        (Created::AlreadyExists, Ok(true)) => {
            info!(pod = %name, "a pod named like the drain pod exists; waiting for it");
            cluster.name_taken(ordinal, &name).await;
            Ok(Outcome::NameTaken)
        }
    }
}

/// The set's update revision `name`, as `(name, UID)`, if the set controls it: the drain pod's
/// controller. Best effort: a failed read is logged (a denial is also a Warning) and the pod is
/// made without it.
async fn controller_revision<C: Cluster>(
    cluster: &C,
    set_uid: &str,
    name: Option<&str>,
) -> Option<(String, String)> {
    let name = name?;
    match cluster.revision(name).await {
        Ok(Some(meta)) if observe::controlled_by(&meta, set_uid) => {
            meta.uid.map(|uid| (name.to_owned(), uid))
        }
        Ok(_) => {
            debug!(
                revision = name,
                "the set's update revision is gone or not the set's: the drain pod has no controller"
            );
            None
        }
        Err(e) => {
            warn!(revision = name, error = %e, "could not read the set's update revision: the drain pod has no controller, and `kubectl drain` refuses to evict it without --force");
            if matches!(&e, kube::Error::Api(s) if s.code == 403) {
                let note = format!(
                    "could not read ControllerRevision {name} ({e}): drain pods are made without \
                     a controller, so `kubectl drain` refuses to evict them without --force; \
                     grant `get` on `controllerrevisions` (apps)"
                );
                cluster
                    .event(&EventSpec {
                        subject: Subject::Set,
                        severity: Severity::Warning,
                        reason: "DrainPodUncontrolled",
                        note,
                        ordinal: None,
                    })
                    .await;
            }
            None
        }
    }
}

/// The live set has `ordinal` in range again: the plan was made from a stale cache.
fn back_in_range(ordinal: i32) -> Outcome {
    info!(
        ordinal,
        "the ordinal is back in range (the cache lagged); no drain pod"
    );
    Outcome::Stale("ordinal back in range")
}

/// Writes `annotations` to each claim in turn; [`Outcome::ClaimGone`] (and nothing written to
/// the claims after it) at the first one that is gone or was replaced, else [`Outcome::Done`].
pub(super) async fn annotate_all<C: Cluster>(
    cluster: &C,
    claims: &[ClaimRef],
    annotations: &BTreeMap<String, Option<String>>,
) -> Result<Outcome, ActError> {
    for c in claims {
        let patched = cluster
            .annotate_claim(&c.name, &c.uid, annotations)
            .await
            .map_err(|source| ActError::AnnotateClaim {
                name: c.name.clone(),
                source,
            })?;
        match patched {
            Patched::Done => {}
            Patched::Gone => {
                info!(claim = %c.name, "claim gone or replaced since it was observed; planning the ordinal again");
                return Ok(Outcome::ClaimGone(c.name.clone()));
            }
        }
    }
    Ok(Outcome::Done)
}

pub(super) fn set(pairs: &[(&str, String)]) -> BTreeMap<String, Option<String>> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Some(v.clone())))
        .collect()
}
