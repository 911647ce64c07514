//! The real implementation of the act seam ([`Cluster`]) for one set: API calls with UID and
//! resourceVersion preconditions, our writes remembered until their watches deliver them, Events
//! and the status annotation's patch.

use std::collections::BTreeMap;

use drain_api::{annotations, labels};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{
    Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::{debug, warn};

use super::context::Context;
use super::events::publish;
use super::kinds::{Twin, wants};
use super::memory::{SetId, Withdrawal, set_id};
use super::watches::slim_drain_pod;

use super::api::{gone_or_replaced, ok_if_gone, preconditioned};
use crate::act::{Cluster, Created, Deleted, EventSpec, Patched, Retained, Subject};
use crate::identity::FIELD_MANAGER;
use crate::plan::ClaimRef;
use crate::retain::RetainError;
use crate::runtime::caches::ClaimEntry;
use crate::runtime::leader::Tenure;
use crate::set_kind::{ServedSet, SetKind};
use crate::{observe, retain};

/// The writes of one reconcile of a set beyond the act seam: the status patch, and the live
/// read of a pod holding one of its names.
pub(super) trait SetWrites: Cluster + Send {
    /// Patches the set's status annotation (`None`: removes it), with its UID as a
    /// precondition: `Ok(None)` when the set is gone or was replaced, else the set patched.
    fn patch_status(
        &self,
        set: &StatefulSet,
        status: Option<String>,
    ) -> impl Future<Output = Result<Option<StatefulSet>, kube::Error>> + Send;
    /// The pod holding `name` now, read live.
    fn live_pod(&self, name: &str)
    -> impl Future<Output = Result<Option<Pod>, kube::Error>> + Send;
    /// The Node `name` now, read live (`None`: no such Node).
    fn node(&self, name: &str) -> impl Future<Output = Result<Option<Node>, kube::Error>> + Send;
}

/// Where a reconcile's writes go: the cluster ([`Kube`]), or a test's fake.
pub(super) trait Seam: Send + Sync + 'static {
    /// The writes of one reconcile of a set of kind `K`.
    type Writes<'a, K: ServedSet>: SetWrites
    where
        Self: 'a;
    /// The writes of one reconcile of `set`, admitted in `tenure`.
    fn writes<'a, K: ServedSet>(
        &'a self,
        ctx: &'a Context,
        set: &StatefulSet,
        set_ref: ObjectReference,
        tenure: Tenure,
    ) -> Self::Writes<'a, K>;
}

/// The cluster's API server.
pub(super) struct Kube;

impl Seam for Kube {
    type Writes<'a, K: ServedSet> = KubeCluster<'a, K>;
    fn writes<'a, K: ServedSet>(
        &'a self,
        ctx: &'a Context,
        set: &StatefulSet,
        set_ref: ObjectReference,
        tenure: Tenure,
    ) -> KubeCluster<'a, K> {
        KubeCluster::new(ctx, set, set_ref, tenure)
    }
}

/// The real cluster seam: one namespace, events on one set of kind `K`.
pub(super) struct KubeCluster<'a, K> {
    pub(super) sets: Api<K>,
    /// The sets of the other kind, when that kind is served: one of the same name blocks
    /// every drain (their pods and claims share names).
    pub(super) twin: Option<Twin>,
    pub(super) pods: Api<Pod>,
    pub(super) claims: Api<PersistentVolumeClaim>,
    /// The context's events, expectations, memory, metrics, fence and sweep.
    pub(super) ctx: &'a Context,
    pub(super) set: ObjectReference,
    /// The live reads that confirm a drain pod's create (the set; whether a set of the other
    /// kind has its name), made once per act phase, after the first create answers or before it: a
    /// scale-down by several ordinals creates their drain pods at once, and one read serves them
    /// all (a failed read is not kept).
    pub(super) live: tokio::sync::OnceCell<(Option<K>, bool)>,
    /// The volumes, for retention (cluster-scoped).
    pub(super) volumes: Api<PersistentVolume>,
    /// This set's key in the memory.
    pub(super) id: SetId,
    /// The tenure of the Lease its reconcile was admitted in ([`crate::runtime::leader::Leadership::fence`]): it acts
    /// only while this replica holds the Lease in it, and its withdrawals are kept for it.
    pub(super) tenure: Tenure,
}

impl<'a, K: ServedSet> KubeCluster<'a, K> {
    /// The seam for one reconcile of `set`, in its namespace.
    pub(super) fn new(
        ctx: &'a Context,
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
            ctx,
            set: set_ref,
            live: tokio::sync::OnceCell::new(),
            volumes: Api::all(ctx.client.clone()),
            id: set_id(K::KIND, set),
            tenure,
        }
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
                        Some(twin) => twin.exists(&name, &self.ctx.metrics).await,
                        None => Ok(false),
                    }
                });
                self.ctx.metrics.request("get", "statefulsets", &result);
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
        self.ctx.config.leadership.fence() == Some(self.tenure)
    }

    fn confirm_first(&self) -> bool {
        self.ctx.remembered.memory.read(&self.id, |m| m.unconfirmed)
    }

    async fn name_taken(&self, ordinal: i32, name: &str) {
        let result = self.pods.get_opt(name).await;
        self.ctx.metrics.request("get", "pods", &result);
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
        self.ctx
            .remembered
            .memory
            .update(&self.id, |m| m.taken.insert(ordinal, uid));
    }

    fn withdraw_later(&self, name: &str, uid: &str) {
        self.ctx.remembered.memory.update(&self.id, |m| {
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
        let sent = std::time::Instant::now();
        let result = self.pods.create(&pp, pod).await;
        debug!(pod = ?pod.metadata.name, took = ?sent.elapsed(), "drain pod create answered");
        self.ctx.metrics.request("create", "pods", &result);
        match result {
            Ok(mut p) => {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                slim_drain_pod(&mut p);
                let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
                let version = p.metadata.resource_version.clone();
                self.ctx
                    .remembered
                    .recent
                    .pods
                    .wrote(&ns, &name, version.as_deref(), p);
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
        let result = self
            .pods
            .delete(name, &preconditioned(uid, resource_version))
            .await;
        self.ctx.metrics.request("delete", "pods", &result);
        match result {
            Ok(_) => {
                self.ctx.remembered.recent.deleted_pods.deleted(uid);
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

    async fn retain_volume(
        &self,
        claim: &ClaimRef,
        pod: &str,
        until: Timestamp,
    ) -> Result<Retained, RetainError> {
        let result = self.claims.get_opt(&claim.name).await;
        self.ctx
            .metrics
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
        self.ctx
            .metrics
            .request("get", "persistentvolumes", &result);
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
                self.ctx
                    .metrics
                    .request("patch", "persistentvolumes", &result);
                result.map_err(|e| api_error("patch", e))?;
                self.ctx.retained.notify_one();
                Ok(Retained::Marked { volume })
            }
            retain::Marking::Already => Ok(Retained::Marked { volume }),
            retain::Marking::KeptByOwner => Ok(Retained::KeptByOwner { volume }),
        }
    }

    async fn delete_claim(&self, name: &str, uid: &str) -> Result<(), kube::Error> {
        let sent = std::time::Instant::now();
        let result = self.claims.delete(name, &preconditioned(uid, None)).await;
        debug!(claim = %name, took = ?sent.elapsed(), "claim delete answered");
        self.ctx
            .metrics
            .request("delete", "persistentvolumeclaims", &result);
        let result = ok_if_gone(result.map(|_| ()));
        if result.is_ok() {
            // Deleted, or gone already: either way not to be drained again.
            self.ctx.remembered.recent.deleted_claims.deleted(uid);
        }
        result
    }

    async fn annotate_claim(
        &self,
        name: &str,
        uid: &str,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> Result<Patched, kube::Error> {
        let patch = json!({"metadata": {"uid": uid, "annotations": annotations}});
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let result = self.claims.patch(name, &pp, &Patch::Merge(patch)).await;
        self.ctx
            .metrics
            .request("patch", "persistentvolumeclaims", &result);
        match result {
            Ok(patched) => {
                let m = &patched.metadata;
                self.ctx.remembered.recent.claims.wrote(
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

    async fn still_orphaned(&self, ordinal: i32) -> Result<bool, kube::Error> {
        let answer = self.read_orphaned(ordinal).await;
        let confirmed = matches!(answer, Ok(true));
        self.ctx
            .remembered
            .memory
            .update(&self.id, |m| m.unconfirmed = !confirmed);
        answer
    }

    async fn pod_uid(&self, name: &str) -> Result<Option<String>, kube::Error> {
        let result = self.pods.get_opt(name).await;
        self.ctx.metrics.request("get", "pods", &result);
        Ok(result?.and_then(|p| p.metadata.uid))
    }

    async fn revision(&self, name: &str) -> Result<Option<ObjectMeta>, kube::Error> {
        let ns = self.set.namespace.as_deref().unwrap_or_default();
        let revisions = Api::<ControllerRevision>::namespaced(self.ctx.client.clone(), ns);
        let result = revisions.get_metadata_opt(name).await;
        self.ctx
            .metrics
            .request("get", "controllerrevisions", &result);
        result.map(|r| r.map(|r| r.metadata))
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
            &self.ctx.events,
            &reference,
            event.severity,
            event.reason,
            event.note.clone(),
            event.ordinal,
        );
    }
}

impl<K: ServedSet> SetWrites for KubeCluster<'_, K> {
    async fn patch_status(
        &self,
        set: &StatefulSet,
        status: Option<String>,
    ) -> Result<Option<StatefulSet>, kube::Error> {
        let patch = Patch::Merge(json!({"metadata": {
            "uid": set.metadata.uid,
            "annotations": {annotations::STATUS: status},
        }}));
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let result = self.sets.patch(&set.name_any(), &pp, &patch).await;
        self.ctx.metrics.request("patch", "statefulsets", &result);
        match result {
            Ok(patched) => Ok(Some(patched.to_statefulset())),
            Err(e) if gone_or_replaced(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn live_pod(&self, name: &str) -> Result<Option<Pod>, kube::Error> {
        let result = self.pods.get_opt(name).await;
        self.ctx.metrics.request("get", "pods", &result);
        result
    }

    async fn node(&self, name: &str) -> Result<Option<Node>, kube::Error> {
        let result = Api::<Node>::all(self.ctx.client.clone())
            .get_opt(name)
            .await;
        self.ctx.metrics.request("get", "nodes", &result);
        result
    }
}

/// Writes `status` on `set` (read through [`StatusMemo`](crate::runtime::status_memo)) at the
/// end of its reconcile, unless it shows that already or this replica no longer acts in
/// `tenure`. The status is a report: a failed write holds no drain back; it is logged, counted,
/// and shown to the next reconcile, which is due after the returned backoff and writes it again.
pub(super) async fn write_status(
    ctx: &Context,
    writes: &impl SetWrites,
    kind: SetKind,
    set: &StatefulSet,
    status: Option<String>,
    tenure: Tenure,
) -> Option<std::time::Duration> {
    let memo = &ctx.remembered.statuses;
    if !memo.pending(set, tenure) && memo.status(set, tenure) == status {
        return None;
    }
    if ctx.config.leadership.fence() != Some(tenure) {
        return None;
    }
    let id = set_id(kind, set);
    let seq = memo.want(set, status.clone(), tenure);
    match writes.patch_status(set, status).await {
        Ok(Some(patched)) => {
            debug!("status written");
            memo.written(seq, &patched);
            ctx.remembered.memory.update(&id, |m| m.status_failures = 0);
            None
        }
        Ok(None) => {
            debug!("set gone or replaced; its status is not written");
            memo.abandon(&set.namespace().unwrap_or_default(), &set.name_any(), seq);
            None
        }
        Err(e) => {
            let failures = ctx.remembered.memory.update(&id, |m| {
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
