//! The observe step of a reconcile: the set's snapshot from the caches, with our own recent
//! writes over them (drain pods created and deleted, claims annotated, that the watches have
//! not delivered yet), names taken by hand rechecked live, and pending withdrawals retried.

use drain_api::names;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, info, warn};

use super::context::Context;
use super::expectations::{mark_deleted, mark_deleted_claims, newest_claim, with_created};
use super::memory::{SetId, Withdrawal, set_id};
use super::writes::SetWrites;

use crate::act::Deleted;
use crate::runtime::leader::Tenure;
use crate::set_kind::SetKind;
use crate::{observe, plan};

/// Deletes the drain pods of this set whose withdrawal failed before
/// ([`Cluster::withdraw_later`]), with their UIDs as precondition; one that is gone already, or
/// replaced, is done with too. A failure keeps it for the next reconcile. Returns whether some
/// are left.
pub(super) async fn retry_withdrawals(
    ctx: &Context,
    writes: &impl SetWrites,
    id: SetId,
    tenure: Tenure,
) -> bool {
    let leadership = &ctx.config.leadership;
    let pending = ctx
        .remembered
        .memory
        .update(&id, |m| m.withdrawals_of(tenure));
    if pending.is_empty() {
        return false;
    }
    for (uid, Withdrawal { name, .. }) in pending {
        if leadership.fence() != Some(tenure) {
            // Lost the Lease meanwhile: whoever leads judges the pods.
            break;
        }
        let done = match writes.delete_pod(&name, &uid, None).await {
            Ok(Deleted::Deleted) => {
                info!(pod = %name, "drain pod withdrawn (an earlier try had failed)");
                true
            }
            Ok(_) => true,
            Err(e) => {
                warn!(pod = %name, error = %e, "failed to withdraw a drain pod; retrying");
                false
            }
        };
        if done {
            ctx.remembered
                .memory
                .update(&id, |m| m.withdrawing.remove(&uid));
        }
    }
    ctx.remembered
        .memory
        .read(&id, |m| !m.withdrawing.is_empty())
}

/// Reads one set's snapshot from the caches, through the per-set indexes.
pub(super) fn observe_set(
    ctx: &Context,
    kind: SetKind,
    set: &StatefulSet,
    only_in_flight: bool,
    tenure: Tenure,
) -> plan::Snapshot {
    let name = set.name_any();
    let ns = set.namespace().unwrap_or_default();
    // Each read is at least as new as our own last write of the object (`super::expectations`).
    let templates = observe::claim_templates(set);
    // A set's claims are named `<template>-<set>-<ordinal>`; the snapshot keeps those.
    let names: std::collections::BTreeSet<String> = (templates.iter())
        .flat_map(|t| (ctx.caches.claims).names_starting_with(&ns, &format!("{t}-{name}-")))
        .collect();
    let claims: Vec<_> = names
        .iter()
        .filter_map(|c| {
            let (cached, version) = ctx.caches.claims.get_versioned(&ns, c)?;
            let entry = newest_claim(
                cached,
                ctx.remembered.recent.claims.newer_than(&ns, c, version),
            );
            Some(entry.meta(&ns, c))
        })
        .collect();
    let drain_pods = with_created(
        ctx.caches
            .drain_pod_index
            .names(&ns, &name)
            .iter()
            .filter_map(|p| ctx.caches.drain_pods.get(&ObjectRef::new(p).within(&ns)))
            .collect(),
        ctx.remembered.recent.pods.in_namespace(&ns),
        &name,
    );
    let others: Vec<_> = claims
        .iter()
        .filter_map(|c| observe::parse_claim_name(c.name.as_deref()?, &name, &templates))
        .map(|(_, o)| o)
        .collect::<std::collections::BTreeSet<i32>>()
        .iter()
        .filter_map(|o| {
            let pod = names::pod_name(&name, *o);
            Some(ctx.caches.stateful_pods.get(&ns, &pod)?.meta(&ns, &pod))
        })
        .collect();
    let mut snap = observe::snapshot(
        set,
        claims.iter(),
        drain_pods.iter().map(|p| p.as_ref()),
        others.iter(),
    );
    let withdrawing: std::collections::BTreeSet<String> =
        ctx.remembered.memory.read(&set_id(kind, set), |m| {
            (m.withdrawing.iter())
                .filter(|(_, w)| w.tenure == tenure)
                .map(|(uid, _)| uid.clone())
                .collect()
        });
    mark_deleted(&mut snap.pods, |uid| {
        ctx.remembered.recent.deleted_pods.contains(uid) || withdrawing.contains(uid)
    });
    mark_deleted_claims(&mut snap.claims, |uid| {
        ctx.remembered.recent.deleted_claims.contains(uid)
    });
    if only_in_flight {
        // Opted out: only ordinals with a drain pod of ours are finished; nothing else is touched.
        let drained: std::collections::BTreeSet<i32> = snap
            .pods
            .iter()
            .filter(|p| matches!(p.kind, plan::PodKind::Drain(_)))
            .map(|p| p.ordinal)
            .collect();
        snap.claims.retain(|c| drained.contains(&c.ordinal));
        snap.pods.retain(|p| drained.contains(&p.ordinal));
        snap.previous.retain(|o, _| drained.contains(o));
    }
    snap
}

/// Reads again, live, each pod remembered as holding one of the set's names without being the
/// set's or ours ([`Cluster::name_taken`]): while it is there (same UID), the planner sees it as
/// [`plan::PodKind::Unknown`]; once it is gone, replaced, or a cached pod holds the ordinal, it
/// is forgotten. Such pods are in no cache, so this read is what notices their deletion (the
/// planner requeues blocked ordinals every [`plan::RECHECK_UNKNOWN_POD`]).
pub(super) async fn recheck_taken(
    ctx: &Context,
    writes: &impl SetWrites,
    id: SetId,
    snap: &mut plan::Snapshot,
) {
    let remembered = ctx.remembered.memory.read(&id, |m| m.taken.clone());
    if remembered.is_empty() {
        return;
    }
    let mut gone = Vec::new();
    for (ordinal, uid) in remembered {
        let name = names::pod_name(&snap.set_name, ordinal);
        // A cached pod holds the ordinal now, or no claim is left to drain (or the set opted
        // out and the ordinal has no drain in flight): nothing to remember.
        if snap.pods.iter().any(|p| p.ordinal == ordinal)
            || !snap.claims.iter().any(|c| c.ordinal == ordinal)
        {
            gone.push(ordinal);
            continue;
        }
        match writes.live_pod(&name).await {
            Ok(Some(pod)) if pod.metadata.uid.as_deref() == Some(uid.as_str()) => {
                let mut seen = observe::other_pod(&pod.metadata, ordinal);
                seen.kind = plan::PodKind::Unknown;
                snap.pods.push(seen);
            }
            Ok(_) => gone.push(ordinal),
            Err(e) => {
                // Unknown now: kept as blocked rather than risk a create that fails again.
                debug!(pod = %name, error = %e, "could not read the pod holding the name again");
                let mut seen = observe::other_pod(&Default::default(), ordinal);
                seen.name = name;
                seen.uid = uid;
                seen.kind = plan::PodKind::Unknown;
                snap.pods.push(seen);
            }
        }
    }
    snap.pods.sort_by_key(|p| p.ordinal);
    if !gone.is_empty() {
        ctx.remembered
            .memory
            .update(&id, |m| m.taken.retain(|o, _| !gone.contains(o)));
    }
}

/// Reads live what [`observe::nodes_to_read`] names: the node of each removed pod still being
/// deleted past its grace period (the stateful pods' cache holds no spec), then each node the
/// planner judges by. One read per node per reconcile.
pub(super) async fn read_nodes(writes: &impl SetWrites, snap: &mut plan::Snapshot) {
    let now = jiff::Timestamp::now();
    for pod in observe::pods_to_locate(snap, now) {
        match writes.live_pod(&pod.name).await {
            Ok(Some(live)) if live.metadata.uid.as_deref() == Some(pod.uid.as_str()) => {
                let node = live.spec.and_then(|s| s.node_name);
                pod.deletion
                    .iter_mut()
                    .for_each(|d| d.node.clone_from(&node));
            }
            Ok(_) => {}
            Err(e) => debug!(pod = %pod.name, error = %e, "could not read the pod's node"),
        }
    }
    for node in observe::nodes_to_read(snap, now) {
        let health = match writes.node(&node).await {
            Ok(found) => observe::node_health(found.as_ref()),
            Err(e) => plan::NodeHealth::Unreadable {
                error: e.to_string(),
            },
        };
        snap.nodes.insert(node, health);
    }
}
