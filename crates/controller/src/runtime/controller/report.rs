//! What a reconcile reports once it acted: its failures sorted and told ([`sort_failures`]), the
//! requeue or the error for the backoff ([`settle`]), and the dry run instead of acting.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{error, info};

use super::context::{Context, Error};
use super::events::publish;
use super::memory::set_id;
use super::writes::{SetWrites, write_status};

use crate::act::{ActCtx, ActError, EventSpec, Severity};
use crate::runtime::leader::Tenure;
use crate::runtime::watch;
use crate::set_kind::{ServedSet, SetKind};
use crate::status::StatusReport;
use crate::{act, plan};

/// The status annotation `report` renders to (`None`: nothing to report).
pub(super) fn rendered(report: &StatusReport) -> Option<String> {
    (report != &StatusReport::default()).then(|| report.render())
}
/// The failed actions of one act step, sorted.
pub(super) struct Acted {
    /// The failures, by ordinal (retried with backoff).
    pub(super) failed: Vec<(i32, ActError)>,
    /// The ordinals refused because the namespace is being deleted (not failures).
    pub(super) terminating: Vec<(i32, ActError)>,
    /// The first failure of each failed ordinal, for the status.
    pub(super) errors: BTreeMap<i32, String>,
}

impl Acted {
    /// The ordinals whose actions were not carried out, so are not counted.
    pub(super) fn not_carried_out(&self) -> std::collections::BTreeSet<i32> {
        self.errors
            .keys()
            .chain(self.terminating.iter().map(|(o, _)| o))
            .copied()
            .collect()
    }
}

/// Sorts the act step's failures and reports each real one (Warning Event, error log).
pub(super) fn sort_failures(
    ctx: &Context,
    set_ref: &ObjectReference,
    failed: Vec<(i32, ActError)>,
) -> Acted {
    // Not a failure: nothing new can be created in a namespace being deleted, and it takes
    // the set and its claims along. No retry, and no Warning (no Event can be created in it
    // either); the other ordinals' outcomes are reported as usual.
    let (terminating, failed): (Vec<_>, Vec<_>) = failed
        .into_iter()
        .partition(|(_, e)| e.namespace_terminating());
    if !terminating.is_empty() {
        info!(ordinals = ?terminating.iter().map(|(o, _)| *o).collect::<Vec<_>>(), "the namespace is being deleted: no drain pod can be created in it, and its claims go with it");
    }
    let mut errors: BTreeMap<i32, String> = BTreeMap::new();
    for (ordinal, e) in &failed {
        error!(ordinal, error = %e.describe(), "action failed; retrying with backoff");
        publish(
            &ctx.events,
            set_ref,
            Severity::Warning,
            e.reason(),
            e.describe(),
            Some(*ordinal),
        );
        errors.entry(*ordinal).or_insert_with(|| e.describe());
    }
    Acted {
        failed,
        terminating,
        errors,
    }
}

/// After the act step: the first failure as the reconcile's error (retried with backoff), or,
/// when nothing failed, the set's failure memory cleared, the success counted and the next
/// reconcile scheduled.
pub(super) fn settle<K: ServedSet>(
    ctx: &Context,
    set: &StatefulSet,
    plan: &plan::Plan,
    snap: &plan::Snapshot,
    acted: Acted,
    withdrawals_left: bool,
    status_retry: Option<Duration>,
) -> Result<Action, Error> {
    if let Some((_, first)) = acted.failed.into_iter().next() {
        return Err(Error::Act {
            count: acted.errors.len(),
            first: Box::new(first),
        });
    }
    let (kind, name, ns) = (K::KIND, set.name_any(), set.namespace().unwrap_or_default());
    ctx.remembered
        .memory
        .update(&set_id(kind, set), |m| m.failures = None);
    ctx.metrics
        .reconciles
        .get_or_create(&crate::runtime::metrics::ResultLabels {
            result: "ok".into(),
        })
        .inc();
    ctx.forget_if_gone(kind, &ns, &name);
    if !acted.terminating.is_empty() {
        return Ok(Action::await_change());
    }
    let requeue = next_requeue(ctx, kind, set, plan, snap, withdrawals_left);
    Ok(Action::requeue(
        status_retry.map_or(requeue, |r| r.min(requeue)),
    ))
}

/// When to plan a set again after a reconcile that acted without failure: at the plan's next
/// deadline or the resync period; within 2 s while withdrawals are pending; at once when a
/// create just found a name held by a pod nobody here made (plan again with that pod seen, so
/// the slot it was given goes to another ordinal).
pub(super) fn next_requeue(
    ctx: &Context,
    kind: SetKind,
    set: &StatefulSet,
    plan: &plan::Plan,
    snap: &plan::Snapshot,
    withdrawals_left: bool,
) -> Duration {
    let mut requeue = plan
        .requeue_after
        .unwrap_or(ctx.config.resync)
        .min(ctx.config.resync);
    if withdrawals_left {
        requeue = requeue.min(Duration::from_secs(2));
    }
    let newly_taken = ctx.remembered.memory.read(&set_id(kind, set), |m| {
        m.taken.keys().any(|o| {
            !snap
                .pods
                .iter()
                .any(|p| p.ordinal == *o && p.kind == plan::PodKind::Unknown)
        })
    });
    if newly_taken {
        requeue = requeue.min(Duration::from_millis(100));
    }
    requeue
}

/// Under `--dry-run`, instead of acting: logs and reports (once per change of the plan) what
/// each action would do, and writes the status marked `dryRun`.
#[allow(
    clippy::too_many_arguments,
    reason = "the reconcile's parts, each used once"
)]
pub(super) async fn dry_run<K: ServedSet>(
    ctx: &Context,
    writes: &impl SetWrites,
    set: &StatefulSet,
    set_ref: &ObjectReference,
    act_ctx: &ActCtx<'_>,
    plan: &plan::Plan,
    problem: Option<String>,
    tenure: Tenure,
) -> Result<Action, Error> {
    let events: Vec<EventSpec> = plan
        .actions
        .iter()
        .map(|a| act::dry_run_event(act_ctx, a))
        .collect();
    let fingerprint = watch::fingerprint(
        events
            .iter()
            .map(|e| (e.reason, e.note.as_str()))
            .collect::<Vec<_>>(),
    );
    let key = set_id(K::KIND, set);
    let changed = ctx
        .remembered
        .memory
        .update(&key, |m| m.dry_run_reported.replace(fingerprint))
        != Some(fingerprint);
    if changed {
        for e in &events {
            info!(reason = e.reason, note = %e.note, "dry run");
            publish(
                &ctx.events,
                set_ref,
                e.severity,
                e.reason,
                e.note.clone(),
                e.ordinal,
            );
        }
    }
    let mut status = StatusReport::of(&plan.status, problem, &BTreeMap::new());
    // Marked only where there is something to report.
    status.dry_run = status != StatusReport::default();
    let retry = write_status(ctx, writes, K::KIND, set, rendered(&status), tenure).await;
    let requeue = plan
        .requeue_after
        .unwrap_or(ctx.config.resync)
        .min(ctx.config.resync);
    Ok(Action::requeue(retry.map_or(requeue, |r| r.min(requeue))))
}
