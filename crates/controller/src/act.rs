//! Act: carries out the planner's actions through a narrow seam to the cluster and reports each
//! outcome as Events (chosen by [`events`], a pure function). It decides nothing; every call is
//! idempotent (AlreadyExists and NotFound are outcomes, not errors), data-bearing deletes carry a
//! UID precondition, and deletes of drain pods believed unfinished a resourceVersion one.
//!
//! Actions of one ordinal run in order and stop at its first failure, or at the first outcome
//! showing the plan was made from a stale view (a drain pod or claim changed or gone); neither
//! stops the actions of other ordinals.

use std::collections::BTreeMap;

use drain_api::claim_annotations;
use tracing::{info, warn};

use crate::plan::Action;

mod context;
mod errors;
mod events;
mod seam;
mod steps;

use steps::{
    Failure, annotate_all, clear_record, create_drain_pod, delete_claims, delete_drain_pod,
    record_drain_pod, record_failure, record_return, retain_volumes, set,
};

use context::names;
pub use context::{ActCtx, Outcome};
pub use errors::ActError;
pub use events::{NOTE_BYTES, dry_run_event, events, fit_note};
pub use seam::{Cluster, Created, Deleted, EventSpec, Patched, Retained, Severity, Subject};

/// Carries out `actions`: each ordinal's in order up to its first failure, every ordinal
/// whatever happens to the others, and the ordinals concurrently (a scale-down of a Parallel
/// set starts all its drains at once, not one API round trip after another). Returns the
/// failures, by ordinal, in the order the ordinals first appear.
pub async fn apply<C: Cluster>(
    cluster: &C,
    ctx: &ActCtx<'_>,
    actions: &[Action],
) -> Vec<(i32, ActError)> {
    let mut by_ordinal: Vec<(i32, Vec<&Action>)> = Vec::new();
    for action in actions {
        let ordinal = action.ordinal();
        match by_ordinal.iter_mut().find(|(o, _)| *o == ordinal) {
            Some((_, list)) => list.push(action),
            None => by_ordinal.push((ordinal, vec![action])),
        }
    }
    futures::future::join_all(
        by_ordinal
            .iter()
            .map(|(ordinal, list)| apply_ordinal(cluster, ctx, *ordinal, list)),
    )
    .await
    .into_iter()
    .flatten()
    .collect()
}

/// One ordinal's actions, in order, up to the first failure or the first sign that the plan
/// was made from a stale view.
async fn apply_ordinal<C: Cluster>(
    cluster: &C,
    ctx: &ActCtx<'_>,
    ordinal: i32,
    actions: &[&Action],
) -> Option<(i32, ActError)> {
    for action in actions {
        if !cluster.may_act() {
            warn!(
                ordinal,
                "no longer the leader: the remaining actions are left to the leader"
            );
            return Some((ordinal, ActError::NotLeader));
        }
        match apply_one(cluster, ctx, action).await {
            Ok(outcome) => {
                for mut event in events(ctx, action, &outcome) {
                    event.ordinal = Some(ordinal);
                    cluster.event(&event).await;
                }
                if outcome.stops_ordinal() {
                    return None;
                }
            }
            Err(e) => {
                warn!(ordinal, error = %e.describe(), "action failed; the ordinal's other actions wait for the next try");
                return Some((ordinal, e));
            }
        }
    }
    None
}

/// Carries out one action: only the dispatch, one function per kind of action.
async fn apply_one<C: Cluster>(
    cluster: &C,
    ctx: &ActCtx<'_>,
    action: &Action,
) -> Result<Outcome, ActError> {
    match action {
        Action::CreateDrainPod {
            ordinal,
            claims,
            attempt,
            avoid_nodes,
            new_series,
        } => {
            let new = steps::NewDrainPod {
                claims,
                attempt: *attempt,
                avoid_nodes,
                new_series: new_series.as_ref(),
            };
            create_drain_pod(cluster, ctx, *ordinal, &new).await
        }
        Action::RecordDrainPod {
            claims,
            pod_uid,
            series,
            ..
        } => record_drain_pod(cluster, claims, pod_uid, series.as_ref()).await,
        Action::RecordFailure {
            ordinal,
            claims,
            pod_uid,
            attempts,
            retry_after,
            reason,
            only_if_pod_gone,
            series,
            ..
        } => {
            let failure = Failure {
                pod_uid,
                attempts: *attempts,
                retry_after: *retry_after,
                reason,
                only_if_pod_gone: *only_if_pod_gone,
                series: series.as_ref(),
            };
            record_failure(cluster, ctx, *ordinal, claims, &failure).await
        }
        Action::RecordReturn { claims, at, .. } => record_return(cluster, claims, *at).await,
        Action::RecordLostNodes { claims, nodes, .. } => {
            let record = set(&[(claim_annotations::LOST_NODES, nodes.join(","))]);
            annotate_all(cluster, claims, &record).await
        }
        Action::RecordFence { claims, node, .. } => {
            let record = BTreeMap::from([(claim_annotations::FENCE_NODE.to_owned(), node.clone())]);
            annotate_all(cluster, claims, &record).await
        }
        Action::RecordSuccess {
            claims, pod_uid, ..
        } => {
            let record = set(&[(claim_annotations::SUCCEEDED_POD_UID, pod_uid.clone())]);
            annotate_all(cluster, claims, &record).await
        }
        Action::DeleteDrainPod {
            name,
            uid,
            resource_version,
            why,
            ..
        } => delete_drain_pod(cluster, name, uid, resource_version.as_deref(), *why).await,
        Action::RetainVolumes {
            ordinal,
            claims,
            until,
        } => retain_volumes(cluster, &ctx.pod_name(*ordinal), claims, *until).await,
        Action::DeleteClaims { claims, .. } => delete_claims(cluster, claims).await,
        Action::ClearRecord { claims, .. } => clear_record(cluster, claims).await,
        Action::Warn { message, .. } => {
            warn!(%message, "drain blocked");
            Ok(Outcome::Done)
        }
        Action::AwaitApproval { claims, .. } => {
            info!(claims = %names(claims), "drain succeeded; the claims wait for approval");
            Ok(Outcome::Done)
        }
    }
}

#[cfg(test)]
mod tests;
