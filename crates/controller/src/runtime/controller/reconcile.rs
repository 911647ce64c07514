//! The reconcile of one set, read top to bottom: admit, validate, observe, plan, act, report
//! (with what each step needs of the runtime); and the dry run instead of acting.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::ResourceExt;
use tracing::Instrument;
use tracing::{debug, error, info, info_span, warn};

use super::cluster::{KubeCluster, write_status};
use super::context::{Context, Error, opted_in, set_reference};
use super::events::publish;
use super::memory::set_id;
use super::snapshot::{observe_set, recheck_taken, retry_withdrawals};
use kube::runtime::controller::Action;

use crate::act::{ActCtx, ActError, EventSpec, Severity};
use crate::runtime::leader::Tenure;
use crate::runtime::watch;
use crate::set_kind::{self, ServedSet, SetKind};
use crate::status::StatusReport;
use crate::{act, plan, validate};

/// The status annotation `report` renders to (`None`: nothing to report).
pub(super) fn rendered(report: &StatusReport) -> Option<String> {
    (report != &StatusReport::default()).then(|| report.render())
}

/// Reconciles one StatefulSet that opted in, or that opted out with drains in flight:
/// 1. observe: wait for the caches, then read the set's claims, drain pods and the pods holding
///    its pod names from them; a set being deleted is left alone;
/// 2. validate: [`validate::validate`] (invalid → Warning Event and a status problem; drains in
///    flight are completed, no new one starts until the set changes);
/// 3. plan: [`plan::plan`], pure;
/// 4. act: [`act::apply`], idempotent, with Events; one ordinal's failure does not stop others;
/// 5. report: the status annotation (with the failed actions); requeue at the plan's next
///    deadline or the resync period, or back off when an action failed.
pub(super) async fn reconcile<K: ServedSet>(
    obj: Arc<K>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let set = Arc::new(obj.to_statefulset());
    let (name, ns) = (set.name_any(), set.namespace().unwrap_or_default());
    let span =
        info_span!("reconcile", statefulset = %name, namespace = %ns, kind = K::KIND.label());
    async move {
        debug!("reconcile started");
        let (set, set_ref, range, withdrawals_left, tenure) = match admit(&ctx, &*obj, set).await? {
            Ok(a) => (a.set, a.set_ref, a.range, a.withdrawals_left, a.tenure),
            Err(requeue) => return Ok(requeue),
        };
        // validate
        let checked = check(&ctx, &*obj, &set, &set_ref);
        let valid = checked.valid();

        // observe
        let mut snap = observe_set(&ctx, K::KIND, &set, !opted_in(&set), tenure);
        recheck_taken(&ctx, set_id(K::KIND, &set), &ns, &mut snap).await;
        snap.reserved = range.reserved;
        snap.also_held = obj.start_fallback();

        // plan
        let now = Timestamp::now();
        let plan = plan::plan(&snap, &checked.settings, now);
        if !plan.actions.is_empty() && !ctx.config.dry_run {
            info!(actions = ?plan.actions, "acting");
            debug!(pods = ?snap.pods, claims = ?snap.claims, "observed");
        }

        // act
        let cluster = KubeCluster::<K>::new(&ctx, &set, set_ref.clone(), tenure);
        let act_ctx = ActCtx {
            set_name: &name,
            replicas: snap.replicas,
            template: valid.ok().map(|v| &v.template),
            now,
        };
        if ctx.config.dry_run {
            return dry_run::<K>(
                &ctx,
                &set,
                &set_ref,
                &act_ctx,
                &plan,
                checked.problem.clone(),
                tenure,
            )
            .await;
        }
        let failed = act::apply(&cluster, &act_ctx, &plan.actions).await;
        if failed.iter().any(|(_, e)| matches!(e, ActError::NotLeader)) {
            // Lost the lease mid-reconcile: the new leader plans afresh and reports.
            return Ok(Action::await_change());
        }
        let acted = sort_failures(&ctx, &set_ref, failed);
        ctx.metrics
            .record_reconcile(&ns, &name, &plan, &snap, &acted.not_carried_out());

        // report: once the actions have answered
        let outcome = StatusReport::of(&plan.status, checked.problem.clone(), &acted.errors);
        let status_retry = write_status(&ctx, K::KIND, &set, rendered(&outcome), tenure).await;
        settle::<K>(
            &ctx,
            &set,
            &plan,
            &snap,
            acted,
            withdrawals_left,
            status_retry,
        )
    }
    .instrument(span)
    .await
}

/// A set [`admit`] lets through to be planned.
pub(super) struct Admitted {
    /// The set, with our own last status write over the cached one.
    pub(super) set: Arc<StatefulSet>,
    /// The set, for Events.
    pub(super) set_ref: ObjectReference,
    /// The ordinals it runs.
    pub(super) range: drain_api::names::OrdinalRange,
    /// Whether withdrawals of drain pods are still pending (plan again soon).
    pub(super) withdrawals_left: bool,
    /// The tenure of the Lease it was admitted in: it is planned with that tenure's memory, and
    /// acts only while this replica still holds the Lease in it.
    pub(super) tenure: Tenure,
}

/// Whether the set is planned at all now, before anything is read for it: not while it is
/// being deleted, not by a standby, not before the caches synced, not while a set of the other
/// kind shares its name, not while its ordinals cannot be read. `Err` is the requeue to return.
pub(super) async fn admit<K: ServedSet>(
    ctx: &Context,
    obj: &K,
    set: Arc<StatefulSet>,
) -> Result<Result<Admitted, Action>, Error> {
    let (name, ns) = (set.name_any(), set.namespace().unwrap_or_default());
    if set.metadata.deletion_timestamp.is_some() {
        // Being deleted: drain pods go with the set (garbage collector), claims stay.
        debug!("statefulset is being deleted; leaving it alone");
        ctx.statuses.forget(&set);
        return Ok(Err(Action::await_change()));
    }
    let in_flight = !ctx.drain_pod_index.names(&ns, &name).is_empty();
    if !set_kind::concerns_us(&set.metadata, in_flight) {
        // Not opted in, nothing in flight, no status of ours: reached only when a replica
        // became the leader (which reconciles every cached set) or by a requeue of a set that
        // has just opted out. Nothing to do until it changes: no metric series, no requeue.
        debug!("not opted in and nothing in flight; nothing to do");
        return Ok(Err(Action::await_change()));
    }
    let Some(tenure) = ctx.config.leadership.fence() else {
        // A standby: the leader acts; becoming the leader reconciles every set.
        debug!("not the leader; standing by");
        return Ok(Err(Action::await_change()));
    };
    // Read our own last status write even if the cache has not seen it yet.
    let set = match ctx.statuses.overlay(&set, tenure) {
        Some(fresher) => Arc::new(fresher),
        None => set,
    };
    ctx.wait_ready().await?;
    // Before anything that may end the reconcile early (a name clash among them).
    let withdrawals_left = retry_withdrawals(ctx, set_id(K::KIND, &set), tenure).await;
    let set_ref = set_reference(K::KIND, &set);
    if let Some(twin) = ctx.twin_cached(K::KIND, &ns, &name) {
        // Pods and claims named `<name>-<ordinal>` could be either set's: none is drained.
        let note = format!(
            "a {} named {name} exists in this namespace too: their pods and claims have the same names, so neither is drained until one is renamed or deleted",
            twin.label()
        );
        warn!(
            twin = twin.label(),
            "name shared with a set of the other kind; nothing is drained"
        );
        publish(
            &ctx.events,
            &set_ref,
            Severity::Warning,
            "NameClash",
            note,
            None,
        );
        return Ok(Err(Action::requeue(
            Duration::from_secs(30).min(ctx.config.resync),
        )));
    }
    let range = match obj.ordinals() {
        Ok(range) => range,
        Err(e) => {
            // Which ordinals the set runs is unknown: nothing is planned, nothing deleted.
            warn!(error = %e, "unreadable reserveOrdinals; nothing is drained until the set changes");
            publish(
                &ctx.events,
                &set_ref,
                Severity::Warning,
                "InvalidReserveOrdinals",
                format!("{e}; nothing is drained or deleted until this is fixed"),
                None,
            );
            return Ok(Err(Action::await_change()));
        }
    };
    Ok(Ok(Admitted {
        set,
        set_ref,
        range,
        withdrawals_left,
        tenure,
    }))
}

/// The set's drain settings, checked ([`check`]).
pub(super) struct Checked {
    /// Absent when the set opted out; the problems when its settings are invalid.
    pub(super) validated: Option<Result<validate::ValidatedSet, Vec<validate::Problem>>>,
    /// The problems, as one line for the status.
    pub(super) problem: Option<String>,
    /// What the planner works with.
    pub(super) settings: plan::Settings,
}

impl Checked {
    /// The validated settings, or why no new drain may start.
    pub(super) fn valid(&self) -> Result<&validate::ValidatedSet, &'static str> {
        valid_of(&self.validated)
    }
}

fn valid_of(
    validated: &Option<Result<validate::ValidatedSet, Vec<validate::Problem>>>,
) -> Result<&validate::ValidatedSet, &'static str> {
    match validated {
        Some(Ok(v)) => Ok(v),
        Some(Err(_)) => Err("the drain settings are invalid (see problem)"),
        None => Err("the set opted out of draining"),
    }
}

/// Validates an opted-in set's drain settings; each problem is a Warning Event and a log line
/// (drains in flight are completed, no new one starts until the set changes).
pub(super) fn check<K: ServedSet>(
    ctx: &Context,
    obj: &K,
    set: &StatefulSet,
    set_ref: &ObjectReference,
) -> Checked {
    let validated = opted_in(set).then(|| {
        validate::validate(set).map(|mut v| {
            v.template.set_owner_api_version(K::KIND.api_version());
            v
        })
    });
    let problems = match &validated {
        Some(Err(problems)) => problems.clone(),
        _ => Vec::new(),
    };
    for p in &problems {
        warn!(reason = p.reason, message = %p.message, "invalid drain settings; no new drain until the set changes");
        publish(
            &ctx.events,
            set_ref,
            Severity::Warning,
            p.reason,
            format!("{}; no new drain starts until this is fixed", p.message),
            None,
        );
    }
    let problem = (!problems.is_empty()).then(|| {
        problems
            .iter()
            .map(|p| p.message.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    });
    let settings = validate::settings(
        set,
        valid_of(&validated),
        &ctx.config.flags,
        obj.default_max_concurrent(),
    );
    Checked {
        validated,
        problem,
        settings,
    }
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
    ctx.memory.update(&set_id(kind, set), |m| m.failures = None);
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
    let newly_taken = ctx.memory.read(&set_id(kind, set), |m| {
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
pub(super) async fn dry_run<K: ServedSet>(
    ctx: &Context,
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
    let retry = write_status(ctx, K::KIND, set, rendered(&status), tenure).await;
    let requeue = plan
        .requeue_after
        .unwrap_or(ctx.config.resync)
        .min(ctx.config.resync);
    Ok(Action::requeue(retry.map_or(requeue, |r| r.min(requeue))))
}
