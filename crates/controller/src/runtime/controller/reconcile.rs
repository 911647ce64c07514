//! The reconcile of one set, read top to bottom: admit, validate, observe, plan, act, report.

use std::sync::Arc;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::Instrument;
use tracing::{debug, info, info_span};

use super::admit::{admit, check, ordinals};
use super::context::{Context, Error, opted_in, set_reference};
use super::memory::set_id;
use super::report::{dry_run, rendered, settle, sort_failures};
use super::snapshot::{observe_set, read_nodes, recheck_taken, retry_withdrawals};
use super::writes::{Seam, write_status};

use crate::act::{ActCtx, ActError};
use crate::set_kind::ServedSet;
use crate::status::StatusReport;
use crate::{act, plan};

/// Reconciles one StatefulSet that opted in, or that opted out with drains in flight:
/// 1. observe: wait for the caches, then read the set's claims, drain pods and the pods holding
///    its pod names from them; a set being deleted is left alone;
/// 2. validate: [`crate::validate::validate`] (invalid → Warning Event and a status problem; drains in
///    flight are completed, no new one starts until the set changes);
/// 3. plan: [`plan::plan`], pure;
/// 4. act: [`act::apply`], idempotent, with Events; one ordinal's failure does not stop others;
/// 5. report: the status annotation (with the failed actions); requeue at the plan's next
///    deadline or the resync period, or back off when an action failed.
///
/// Its writes go through `seam` ([`Kube`](super::writes::Kube) in the controller).
pub(super) async fn reconcile<K: ServedSet, S: Seam>(
    obj: Arc<K>,
    ctx: Arc<Context>,
    seam: &S,
) -> Result<Action, Error> {
    let set = Arc::new(obj.to_statefulset());
    let (name, ns) = (set.name_any(), set.namespace().unwrap_or_default());
    let span =
        info_span!("reconcile", statefulset = %name, namespace = %ns, kind = K::KIND.label());
    async move {
        debug!("reconcile started");
        let (set, tenure) = match admit(&ctx, set).await? {
            Ok(admitted) => admitted,
            Err(requeue) => return Ok(requeue),
        };
        let set_ref = set_reference(K::KIND, &set);
        let writes = seam.writes::<K>(&ctx, &set, set_ref.clone(), tenure);
        // Before anything that may end the reconcile early (a name clash among them).
        let withdrawals_left =
            retry_withdrawals(&ctx, &writes, set_id(K::KIND, &set), tenure).await;
        let range = match ordinals(&ctx, &*obj, &set, &set_ref) {
            Ok(range) => range,
            Err(requeue) => return Ok(requeue),
        };
        // validate
        let checked = check(&ctx, &*obj, &set, &set_ref);
        let valid = checked.valid();

        // observe
        let mut snap = observe_set(&ctx, K::KIND, &set, !opted_in(&set), tenure);
        recheck_taken(&ctx, &writes, set_id(K::KIND, &set), &mut snap).await;
        read_nodes(&writes, &mut snap).await;
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
        let act_ctx = ActCtx {
            set_name: &name,
            replicas: snap.replicas,
            template: valid.ok().map(|v| &v.template),
            now,
            revision: (set.status.as_ref()).and_then(|s| s.update_revision.as_deref()),
        };
        if ctx.config.dry_run {
            return dry_run::<K>(
                &ctx,
                &writes,
                &set,
                &set_ref,
                &act_ctx,
                &plan,
                checked.problem.clone(),
                tenure,
            )
            .await;
        }
        let failed = act::apply(&writes, &act_ctx, &plan.actions).await;
        if failed.iter().any(|(_, e)| matches!(e, ActError::NotLeader)) {
            // Lost the lease mid-reconcile: the new leader plans afresh and reports.
            return Ok(Action::await_change());
        }
        let acted = sort_failures(&ctx, &set_ref, failed);
        ctx.metrics
            .record_reconcile(&ns, &name, &plan, &snap, &acted.not_carried_out());

        // report: once the actions have answered
        let outcome = StatusReport::of(&plan.status, checked.problem.clone(), &acted.errors);
        let status_retry =
            write_status(&ctx, &writes, K::KIND, &set, rendered(&outcome), tenure).await;
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
