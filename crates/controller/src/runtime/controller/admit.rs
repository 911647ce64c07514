//! Whether a set is planned now ([`admit`]: not while deleted, by a standby, before the caches
//! synced; [`ordinals`]: not on a name clash or unreadable ordinals) and its drain settings
//! checked ([`check`]).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{debug, warn};

use super::context::{Context, Error, opted_in};
use super::events::publish;

use drain_api::names::OrdinalRange;

use crate::act::Severity;
use crate::runtime::leader::Tenure;
use crate::set_kind::{self, ServedSet};
use crate::{plan, validate};

/// Whether the set is planned at all now, before anything is read for it: not while it is
/// being deleted, not by a standby, not before the caches synced. `Ok` is the set, with our own
/// last status write over the cached one, and the tenure of the Lease it was admitted in (it
/// acts only while this replica holds the Lease in it); `Err` is the requeue to return.
pub(super) async fn admit(
    ctx: &Context,
    set: Arc<StatefulSet>,
) -> Result<Result<(Arc<StatefulSet>, Tenure), Action>, Error> {
    let (name, ns) = (set.name_any(), set.namespace().unwrap_or_default());
    if set.metadata.deletion_timestamp.is_some() {
        // Being deleted: drain pods go with the set (garbage collector), claims stay.
        debug!("statefulset is being deleted; leaving it alone");
        ctx.remembered.statuses.forget(&set);
        return Ok(Err(Action::await_change()));
    }
    let in_flight = !ctx.caches.drain_pod_index.names(&ns, &name).is_empty();
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
    let set = match ctx.remembered.statuses.overlay(&set, tenure) {
        Some(fresher) => Arc::new(fresher),
        None => set,
    };
    ctx.wait_ready().await?;
    Ok(Ok((set, tenure)))
}

/// The ordinals an admitted set runs, unless it cannot be planned: not while a set of the other
/// kind shares its name, not while its ordinals cannot be read (each a Warning). `Err` is the
/// requeue to return.
pub(super) fn ordinals<K: ServedSet>(
    ctx: &Context,
    obj: &K,
    set: &StatefulSet,
    set_ref: &ObjectReference,
) -> Result<OrdinalRange, Action> {
    let (name, ns) = (set.name_any(), set.namespace().unwrap_or_default());
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
            set_ref,
            Severity::Warning,
            "NameClash",
            note,
            None,
        );
        return Err(Action::requeue(
            Duration::from_secs(30).min(ctx.config.resync),
        ));
    }
    obj.ordinals().map_err(|e| {
        // Which ordinals the set runs is unknown: nothing is planned, nothing deleted.
        warn!(error = %e, "unreadable reserveOrdinals; nothing is drained until the set changes");
        publish(
            &ctx.events,
            set_ref,
            Severity::Warning,
            "InvalidReserveOrdinals",
            format!("{e}; nothing is drained or deleted until this is fixed"),
            None,
        );
        Action::await_change()
    })
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
