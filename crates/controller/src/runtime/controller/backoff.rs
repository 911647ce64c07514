//! The error policy: a reconcile whose actions failed is retried with a per-set exponential
//! backoff ([`Failures`]), bounded by the flags' retry base and maximum.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use tracing::warn;

use super::context::{Context, Error};
use kube::runtime::controller::Action;

use super::memory::Failures;
use crate::plan;
use crate::set_kind::ServedSet;

/// Retries a failed reconcile with exponential backoff per set (1 s doubling, at most 5 min).
pub(super) fn error_policy<K: ServedSet>(set: Arc<K>, err: &Error, ctx: Arc<Context>) -> Action {
    let (ns, name) = (set.namespace().unwrap_or_default(), set.name_any());
    let key = (K::KIND, ns.clone(), name.clone());
    let delay = ctx.remembered.memory.update(&key, |m| {
        let (now, delay) = next_failure(m.failures, std::time::Instant::now());
        m.failures = Some(now);
        delay
    });
    ctx.forget_if_gone(K::KIND, &ns, &name);
    ctx.metrics
        .reconciles
        .get_or_create(&crate::runtime::metrics::ResultLabels {
            result: "error".into(),
        })
        .inc();
    ctx.metrics
        .reconcile_errors
        .get_or_create(&crate::runtime::metrics::ReasonLabels {
            reason: err.reason().to_owned(),
        })
        .inc();
    warn!(statefulset = %set.name_any(), reason = err.reason(), error = %err, ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// The count and the delay after a reconcile failed at `now`: the backoff (1 s doubling to
/// 5 min) grows only with failures of retries that were due, not with failures of reconciles
/// that watch events brought in between, which keep the retry already scheduled. Otherwise a
/// burst of events during one denial (a drain pod's status changes, the other ordinals) would
/// push the next retry minutes past the denial's end.
pub(super) fn next_failure(
    last: Option<Failures>,
    now: std::time::Instant,
) -> (Failures, Duration) {
    match last {
        Some(last) if now < last.retry_at => (last, last.retry_at - now),
        _ => {
            let count = last.map_or(1, |l| l.count.saturating_add(1));
            let delay = plan::backoff(count, Duration::from_secs(1), Duration::from_secs(300));
            (
                Failures {
                    count,
                    retry_at: now + delay,
                },
                delay,
            )
        }
    }
}
