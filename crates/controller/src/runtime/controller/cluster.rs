//! The real implementation of the act seam ([`Cluster`]) for one set: API calls with UID and
//! resourceVersion preconditions, our writes remembered until their watches deliver them, Events
//! and the status annotation's patch.

use std::collections::BTreeMap;
use std::sync::Arc;

use drain_api::{annotations, labels};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::{Instrument, debug, info, warn};

use super::context::Context;
use super::events::{Events, publish};
use super::expectations::{Recents, newest_claim};
use super::kinds::{Twin, wants};
use super::memory::{Memory, SetId, Withdrawal, set_id};
use super::watches::slim_drain_pod;

use super::api::{gone_or_replaced, ok_if_gone, preconditioned};
use crate::act::{
    ActError, Cluster, Created, Deleted, EventSpec, Patched, Retained, Severity, Subject,
};
use crate::identity::FIELD_MANAGER;
use crate::plan::ClaimRef;
use crate::retain::RetainError;
use crate::runtime::leader::{Leadership, Tenure};
use crate::runtime::meta_cache::ClaimEntry;
use crate::runtime::metrics::Metrics;
use crate::runtime::recent::{self, Recent};
use crate::runtime::urgency::Waiting;
use crate::set_kind::{AdvancedStatefulSet, ServedSet, SetKind};
use crate::{observe, retain};

/// The real cluster seam: one namespace, events on one set of kind `K`.
pub(super) struct KubeCluster<'a, K> {
    pub(super) sets: Api<K>,
    /// The sets of the other kind, when that kind is served: one of the same name blocks
    /// every drain (their pods and claims share names).
    pub(super) twin: Option<Twin>,
    pub(super) pods: Api<Pod>,
    pub(super) claims: Api<PersistentVolumeClaim>,
    pub(super) events: &'a Events,
    /// Where our writes of drain pods and claims are kept until their watches deliver them.
    pub(super) recent: &'a Recents,
    pub(super) set: ObjectReference,
    pub(super) metrics: &'a Metrics,
    pub(super) leadership: &'a Leadership,
    /// The live reads that confirm a drain pod's create (the set; whether a set of the other
    /// kind has its name), made once per act phase, after the first create answers or before it: a
    /// scale-down by several ordinals creates their drain pods at once, and one read serves them
    /// all (a failed read is not kept).
    pub(super) live: tokio::sync::OnceCell<(Option<K>, bool)>,
    /// What is remembered per set ([`Context`]'s): unconfirmed creates, pending withdrawals,
    /// names taken by hand.
    pub(super) memory: &'a Memory,
    /// The volumes, for retention (cluster-scoped).
    pub(super) volumes: Api<PersistentVolume>,
    /// Wakes the sweep of retained volumes ([`Context`]'s).
    pub(super) retained: &'a tokio::sync::Notify,
    /// This set's key in all three.
    pub(super) id: SetId,
    /// The context, for the claim records written in the background.
    pub(super) ctx: Arc<Context>,
    /// The tenure of the Lease its reconcile was admitted in ([`Leadership::fence`]): it acts
    /// only while this replica holds the Lease in it, and its withdrawals are kept for it.
    pub(super) tenure: Tenure,
}

impl<'a, K: ServedSet> KubeCluster<'a, K> {
    /// The seam for one reconcile of `set`, in its namespace.
    pub(super) fn new(
        ctx: &'a Arc<Context>,
        set: &StatefulSet,
        set_ref: ObjectReference,
        tenure: Tenure,
    ) -> Self {
        let ns = set.namespace().unwrap_or_default();
        Self {
            sets: Api::<K>::namespaced(ctx.client.clone(), &ns),
            twin: ctx.twin_api(K::KIND, &ns),
            pods: Api::namespaced(ctx.client.clone(), &ns),
            claims: Api::namespaced(ctx.client.clone(), &ns),
            events: &ctx.events,
            recent: &ctx.recent,
            set: set_ref,
            metrics: &ctx.metrics,
            leadership: &ctx.config.leadership,
            live: tokio::sync::OnceCell::new(),
            memory: &ctx.memory,
            volumes: Api::all(ctx.client.clone()),
            retained: &ctx.retained,
            id: set_id(K::KIND, set),
            ctx: Arc::clone(ctx),
            tenure,
        }
    }
}

/// Deletes the pod `name` if it still has this UID (and resourceVersion, when given), and notes
/// a delete the API server accepted in `recent` ([`recent::Deleted`]).
pub(super) async fn delete_pod(
    pods: &Api<Pod>,
    metrics: &Metrics,
    recent: &Recents,
    name: &str,
    uid: &str,
    resource_version: Option<&str>,
) -> Result<Deleted, kube::Error> {
    let result = pods
        .delete(name, &preconditioned(uid, resource_version))
        .await;
    metrics.request("delete", "pods", &result);
    match result {
        Ok(_) => {
            recent.deleted_pods.deleted(uid);
            Ok(Deleted::Deleted)
        }
        Err(kube::Error::Api(s))
            if s.code == 409
                && resource_version.is_some()
                && s.message.contains("ResourceVersion") =>
        {
            Ok(Deleted::Changed)
        }
        Err(e) if gone_or_replaced(&e) => Ok(Deleted::Gone),
        Err(e) => Err(e),
    }
}

impl<K: ServedSet> KubeCluster<'_, K> {
    /// [`Cluster::still_orphaned`], without noting whether it confirmed.
    pub(super) async fn read_orphaned(&self, ordinal: i32) -> Result<bool, kube::Error> {
        let name = self.set.name.clone().unwrap_or_default();
        let (set, twin) = self
            .live
            .get_or_try_init(|| async {
                // Both reads at once, after (or before) the drain pod's create.
                let sent = std::time::Instant::now();
                let (result, twin) = futures::join!(self.sets.get_opt(&name), async {
                    match &self.twin {
                        Some(twin) => twin.exists(&name, self.metrics).await,
                        None => Ok(false),
                    }
                });
                self.metrics.request("get", "statefulsets", &result);
                debug!(took = ?sent.elapsed(), "live read of the set answered");
                Ok::<_, kube::Error>((result?, twin?))
            })
            .await?;
        let Some(set) = set else {
            return Ok(false);
        };
        if set.meta().uid != self.set.uid || set.meta().deletion_timestamp.is_some() {
            return Ok(false);
        }
        // Membership that cannot be read is never taken for a scale-down.
        if wants(set, ordinal) {
            return Ok(false);
        }
        Ok(!twin)
    }
}

impl<K: ServedSet> Cluster for KubeCluster<'_, K> {
    fn may_act(&self) -> bool {
        self.leadership.fence() == Some(self.tenure)
    }

    fn confirm_first(&self) -> bool {
        self.memory.read(&self.id, |m| m.unconfirmed)
    }

    async fn name_taken(&self, ordinal: i32, name: &str) {
        let result = self.pods.get_opt(name).await;
        self.metrics.request("get", "pods", &result);
        let pod = match result {
            Ok(Some(pod)) => pod,
            Ok(None) => return,
            Err(e) => {
                debug!(pod = name, error = %e, "could not read the pod holding the drain pod's name");
                return;
            }
        };
        let set = self.set.name.as_deref().unwrap_or_default();
        let labels = pod.metadata.labels.as_ref();
        // The set's own pod or a drain pod: the caches see those and the planner judges them.
        let stateful = labels.is_some_and(|l| l.contains_key(labels::STATEFUL_POD_NAME));
        if stateful || observe::labelled_drain_pod_of(&pod.metadata, set) {
            return;
        }
        let Some(uid) = pod.metadata.uid else {
            return;
        };
        warn!(pod = name, %uid, "a pod made neither by the set nor by this controller holds the drain pod's name; the ordinal is blocked until it goes");
        self.memory
            .update(&self.id, |m| m.taken.insert(ordinal, uid));
    }

    fn withdraw_later(&self, name: &str, uid: &str) {
        self.memory.update(&self.id, |m| {
            m.withdrawing.insert(
                uid.to_owned(),
                Withdrawal {
                    name: name.to_owned(),
                    tenure: self.tenure,
                },
            )
        });
    }

    async fn create_pod(&self, pod: &Pod) -> Result<Created, kube::Error> {
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        // While in flight, shown as a Pending drain pod of ours to a plan made meanwhile by this
        // reconcile (`pods_gone`): its slot is taken. Dropped when the create fails, or is
        // dropped itself; replaced by the answer.
        let ns = self.set.namespace.clone().unwrap_or_default();
        let _in_flight = InFlight::new(&self.recent.pods, &ns, pod);
        let _urgent = self.ctx.urgency.urgent();
        let sent = std::time::Instant::now();
        let result = self.pods.create(&pp, pod).await;
        debug!(pod = ?pod.metadata.name, took = ?sent.elapsed(), "drain pod create answered");
        self.metrics.request("create", "pods", &result);
        match result {
            Ok(mut p) => {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                slim_drain_pod(&mut p);
                let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
                let version = p.metadata.resource_version.clone();
                self.recent.pods.wrote(&ns, &name, version.as_deref(), p);
                Ok(Created::Uid(uid))
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Created::AlreadyExists),
            Err(e) => Err(e),
        }
    }

    async fn delete_pod(
        &self,
        name: &str,
        uid: &str,
        resource_version: Option<&str>,
    ) -> Result<Deleted, kube::Error> {
        delete_pod(
            &self.pods,
            self.metrics,
            self.recent,
            name,
            uid,
            resource_version,
        )
        .await
    }

    async fn retain_volume(
        &self,
        claim: &ClaimRef,
        pod: &str,
        until: Timestamp,
    ) -> Result<Retained, RetainError> {
        let result = self.claims.get_opt(&claim.name).await;
        self.metrics
            .request("get", "persistentvolumeclaims", &result);
        let live = match result {
            Ok(Some(c)) if c.metadata.uid.as_deref() == Some(claim.uid.as_str()) => c,
            Ok(_) => return Ok(Retained::ClaimGone),
            Err(source) => {
                return Err(RetainError::Claim {
                    claim: claim.name.clone(),
                    source,
                });
            }
        };
        let Some(volume) = live
            .spec
            .and_then(|s| s.volume_name)
            .filter(|v| !v.is_empty())
        else {
            return Ok(Retained::NoVolume);
        };
        let api_error = |what, source| RetainError::Api {
            what,
            volume: volume.clone(),
            source,
        };
        let result = self.volumes.get_opt(&volume).await;
        self.metrics.request("get", "persistentvolumes", &result);
        let Some(pv) = result.map_err(|e| api_error("read", e))? else {
            return Ok(Retained::NoVolume);
        };
        let namespace = self.set.namespace.as_deref().unwrap_or_default();
        let retention = retain::Retention {
            namespace,
            set: self.set.name.as_deref().unwrap_or_default(),
            pod,
            claim: &claim.name,
            claim_uid: &claim.uid,
            until,
        };
        match retain::mark(&pv, &retention)? {
            retain::Marking::Patch(patch) => {
                let pp = PatchParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..PatchParams::default()
                };
                let result = self.volumes.patch(&volume, &pp, &Patch::Merge(patch)).await;
                self.metrics.request("patch", "persistentvolumes", &result);
                result.map_err(|e| api_error("patch", e))?;
                self.retained.notify_one();
                Ok(Retained::Marked { volume })
            }
            retain::Marking::Already => Ok(Retained::Marked { volume }),
            retain::Marking::KeptByOwner => Ok(Retained::KeptByOwner { volume }),
        }
    }

    async fn delete_claim(&self, name: &str, uid: &str) -> Result<(), kube::Error> {
        let ns = self.set.namespace.as_deref().unwrap_or_default();
        // A record this delete waits for, held back by a scale-down's removals, goes now.
        let waits = self.ctx.urgency.claim_waits();
        let _in_order = self.recent.claim_gates.enter(ns, name).await;
        drop(waits);
        let _urgent = self.ctx.urgency.urgent();
        let sent = std::time::Instant::now();
        let result = self.claims.delete(name, &preconditioned(uid, None)).await;
        debug!(claim = %name, took = ?sent.elapsed(), "claim delete answered");
        self.metrics
            .request("delete", "persistentvolumeclaims", &result);
        let result = ok_if_gone(result.map(|_| ()));
        if result.is_ok() {
            // Deleted, or gone already: either way not to be drained again.
            self.recent.deleted_claims.deleted(uid);
        }
        result
    }

    async fn annotate_claim(
        &self,
        name: &str,
        uid: &str,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> Result<Patched, kube::Error> {
        let ns = self.set.namespace.as_deref().unwrap_or_default();
        let mut gate = self.recent.claim_gates.enter(ns, name).await;
        if recent::follows_failure(&mut gate) {
            // Planned while the failed write was read as made: planned again instead.
            return Ok(Patched::Stale);
        }
        patch_claim(
            &self.claims,
            self.metrics,
            self.recent,
            name,
            uid,
            annotations,
        )
        .await
    }

    async fn record_in_background(
        &self,
        ordinal: i32,
        claims: &[ClaimRef],
        annotations: &BTreeMap<String, Option<String>>,
    ) -> bool {
        let ns = self.set.namespace.clone().unwrap_or_default();
        // Each claim's gate, in name order (no two holders of several can wait on each other),
        // is taken before the reconcile goes on, so its later writes queue behind this one.
        let mut by_name: Vec<&ClaimRef> = claims.iter().collect();
        by_name.sort_by(|a, b| a.name.cmp(&b.name));
        let mut gates = BTreeMap::new();
        for c in by_name {
            let gate = self.recent.claim_gates.enter(&ns, &c.name).await;
            gates.insert(c.name.clone(), gate);
            if let Some((cached, version)) = self.ctx.claims.get_versioned(&ns, &c.name) {
                let ours = self.recent.claims.newer_than(&ns, &c.name, version);
                let entry = newest_claim(cached, ours);
                if *entry.uid == *c.uid {
                    let written = entry.with(annotations);
                    self.recent.claims.pending(&ns, &c.name, written);
                }
            }
        }
        let record = Record {
            ctx: Arc::clone(&self.ctx),
            claims_api: self.claims.clone(),
            set: self.set.clone(),
            ordinal,
            claims: claims.to_vec(),
            annotations: annotations.clone(),
            tenure: self.tenure,
        };
        // Tracked: a stop waits for it, within its grace (`run_scope`).
        self.ctx
            .background
            .spawn(record.write(gates).in_current_span());
        true
    }

    async fn still_orphaned(&self, ordinal: i32) -> Result<bool, kube::Error> {
        let answer = self.read_orphaned(ordinal).await;
        let confirmed = matches!(answer, Ok(true));
        self.memory.update(&self.id, |m| m.unconfirmed = !confirmed);
        answer
    }

    async fn pod_uid(&self, name: &str) -> Result<Option<String>, kube::Error> {
        let result = self.pods.get_opt(name).await;
        self.metrics.request("get", "pods", &result);
        Ok(result?.and_then(|p| p.metadata.uid))
    }

    async fn event(&self, event: &EventSpec) {
        let reference = match &event.subject {
            Subject::Set => self.set.clone(),
            Subject::Pod { name, uid } => ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                name: Some(name.clone()),
                namespace: self.set.namespace.clone(),
                uid: Some(uid.clone()),
                ..ObjectReference::default()
            },
        };
        publish(
            self.events,
            &reference,
            event.severity,
            event.reason,
            event.note.clone(),
            event.ordinal,
        );
    }
}

/// A drain pod's create in flight, kept in `recent` as a pending write until it is answered
/// ([`Recent::wrote`] takes its place) or fails (dropped with this guard).
struct InFlight<'a> {
    pods: &'a Recent<Pod>,
    ns: &'a str,
    name: String,
}

impl<'a> InFlight<'a> {
    fn new(pods: &'a Recent<Pod>, ns: &'a str, pod: &Pod) -> Self {
        let name = pod.name_any();
        let mut pending = pod.clone();
        pending.metadata.namespace = Some(ns.to_owned());
        pods.pending(ns, &name, pending);
        Self { pods, ns, name }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // Only a pending write goes: an answer kept meanwhile stays.
        self.pods.failed(self.ns, &self.name);
    }
}

/// Patches annotations of the claim `name` if it still has this UID (a precondition: a claim
/// recreated under the name is left alone), and keeps the answer in `recent`.
async fn patch_claim(
    claims: &Api<PersistentVolumeClaim>,
    metrics: &Metrics,
    recent: &Recents,
    name: &str,
    uid: &str,
    annotations: &BTreeMap<String, Option<String>>,
) -> Result<Patched, kube::Error> {
    let patch = json!({"metadata": {"uid": uid, "annotations": annotations}});
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let result = claims.patch(name, &pp, &Patch::Merge(patch)).await;
    metrics.request("patch", "persistentvolumeclaims", &result);
    match result {
        Ok(patched) => {
            let m = &patched.metadata;
            recent.claims.wrote(
                m.namespace.as_deref().unwrap_or_default(),
                name,
                m.resource_version.as_deref(),
                ClaimEntry::of(m),
            );
            Ok(Patched::Done)
        }
        Err(e) if gone_or_replaced(&e) => Ok(Patched::Gone),
        Err(e) => Err(e),
    }
}

/// A new drain pod's record, on its way to its claims ([`Cluster::record_in_background`]).
struct Record {
    ctx: Arc<Context>,
    claims_api: Api<PersistentVolumeClaim>,
    set: ObjectReference,
    ordinal: i32,
    claims: Vec<ClaimRef>,
    annotations: BTreeMap<String, Option<String>>,
    /// The tenure of the Lease it was planned in: written only while it lasts.
    tenure: Tenure,
}

impl Record {
    /// Writes the record to each claim in turn, only while the tenure it was planned in lasts,
    /// holding the claims' `gates`, and stops at the first claim that is gone or was replaced,
    /// or at the first failure: the claims not written are no longer read as written, the
    /// writes queued behind them are not sent ([`Patched::Stale`]: they were planned from the
    /// record as written), and the set is planned again (a failure is a Warning Event and a log
    /// line first). The planner then sees the drain pod unrecorded and records it again.
    async fn write(self, mut gates: BTreeMap<String, recent::Entered>) {
        let ns = self.set.namespace.clone().unwrap_or_default();
        let set_name = self.set.name.clone().unwrap_or_default();
        let ctx = &self.ctx;
        // After the urgent writes in flight (the next pods' creates of a scale-down), a few
        // records at a time: the reconciles read this record as written meanwhile.
        ctx.urgency.paced(Waiting::Record, async {
            for (i, c) in self.claims.iter().enumerate() {
                let stop = if ctx.config.leadership.fence() == Some(self.tenure) {
                    let patched = patch_claim(
                        &self.claims_api,
                        &ctx.metrics,
                        &ctx.recent,
                        &c.name,
                        &c.uid,
                        &self.annotations,
                    )
                    .await;
                    match patched {
                        // (`Stale` is the gate's answer, never a patch's.)
                        Ok(Patched::Done | Patched::Stale) => continue,
                        Ok(Patched::Gone) => {
                            info!(claim = %c.name, "claim gone or replaced since it was observed; planning the ordinal again");
                            true
                        }
                        Err(source) => {
                            let e = ActError::AnnotateClaim {
                                name: c.name.clone(),
                                source,
                            };
                            warn!(ordinal = self.ordinal, error = %e.describe(), "failed to record the new drain pod on its claims; the set's next reconcile records it again");
                            publish(
                                &ctx.events,
                                &self.set,
                                Severity::Warning,
                                e.reason(),
                                e.describe(),
                                Some(self.ordinal),
                            );
                            true
                        }
                    }
                } else {
                    info!(claim = %c.name, "no longer the leader: the drain pod's record is left to the leader");
                    true
                };
                if stop {
                    for c in &self.claims[i..] {
                        ctx.recent.claims.failed(&ns, &c.name);
                        if let Some(gate) = gates.get_mut(&c.name) {
                            recent::mark_failed(gate);
                        }
                    }
                    let _ = ctx.replan.send((ns, set_name));
                    return;
                }
            }
        })
        .await;
    }
}

/// Patches the status annotation of a set of `kind` (`None`: removes it), with the set's UID as
/// a precondition: `Ok(None)` when the set is gone or was replaced, else the set as the API
/// server returned it.
async fn patch_status(
    ctx: &Context,
    kind: SetKind,
    set: &StatefulSet,
    status: Option<String>,
) -> Result<Option<StatefulSet>, kube::Error> {
    let (ns, name) = (set.namespace().unwrap_or_default(), set.name_any());
    let patch = Patch::Merge(json!({"metadata": {
        "uid": set.metadata.uid,
        "annotations": {annotations::STATUS: status},
    }}));
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let client = ctx.client.clone();
    let result = match kind {
        SetKind::StatefulSet => Api::<StatefulSet>::namespaced(client, &ns)
            .patch(&name, &pp, &patch)
            .await
            .map(|s| s.to_statefulset()),
        SetKind::Advanced => Api::<AdvancedStatefulSet>::namespaced(client, &ns)
            .patch(&name, &pp, &patch)
            .await
            .map(|s| s.to_statefulset()),
    };
    ctx.metrics.request("patch", "statefulsets", &result);
    match result {
        Ok(patched) => Ok(Some(patched)),
        Err(e) if gone_or_replaced(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `status` on `set` (read through [`StatusMemo`](crate::runtime::status_memo)) at the
/// end of its reconcile, unless it shows that already or this replica no longer acts in
/// `tenure`. The status is a report: a failed write holds no drain back; it is logged, counted,
/// and shown to the next reconcile, which is due after the returned backoff and writes it again.
pub(super) async fn write_status(
    ctx: &Context,
    kind: SetKind,
    set: &StatefulSet,
    status: Option<String>,
    tenure: Tenure,
) -> Option<std::time::Duration> {
    let leadership = &ctx.config.leadership;
    let term = leadership.term();
    let memo = &ctx.statuses;
    if !memo.pending(set, term) && memo.status(set, term) == status {
        return None;
    }
    if leadership.fence() != Some(tenure) {
        return None;
    }
    let id = set_id(kind, set);
    let seq = memo.want(set, status.clone(), term);
    match patch_status(ctx, kind, set, status).await {
        Ok(Some(patched)) => {
            debug!("status written");
            memo.written(seq, &patched);
            ctx.memory.update(&id, |m| m.status_failures = 0);
            None
        }
        Ok(None) => {
            debug!("set gone or replaced; its status is not written");
            memo.abandon(&set.namespace().unwrap_or_default(), &set.name_any(), seq);
            None
        }
        Err(e) => {
            let failures = ctx.memory.update(&id, |m| {
                m.status_failures = m.status_failures.saturating_add(1);
                m.status_failures
            });
            let flags = &ctx.config.flags;
            let delay = crate::plan::backoff(failures, flags.retry_base, flags.retry_max);
            warn!(error = %e, ?delay, "failed to write the drain status; retrying");
            ctx.metrics
                .reconcile_errors
                .get_or_create(&crate::runtime::metrics::ReasonLabels {
                    reason: "PatchStatusFailed".to_owned(),
                })
                .inc();
            Some(delay)
        }
    }
}
