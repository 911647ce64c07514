//! kube-runtime wiring: the watches (narrowed by label selectors, metadata-only where the full
//! object is not needed, slimmed before they are cached), the mappers from pods and claims to
//! their StatefulSet, the reconcile pipeline, the error policy, and the cluster seam's real
//! implementation.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drain_api::{annotations, claim_annotations, labels};
use futures::{StreamExt, TryStreamExt, future};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::act::{self, ActError, Cluster, Created, Severity, Subject};
use crate::config::DrainConfig;
use crate::status::StatusReport;
use crate::{observe, plan, template};

/// The field manager of every write.
pub const FIELD_MANAGER: &str = "statefulset-drain-controller";

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Watch and act in this namespace only (`None`: all namespaces).
    pub namespace: Option<String>,
    /// First retry delay of a failed drain.
    pub retry_base: Duration,
    /// Longest retry delay of a failed drain.
    pub retry_max: Duration,
    /// Reconcile each opted-in set at least this often.
    pub resync: Duration,
}

/// A reconcile that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A cache stopped (the watch's writer was dropped).
    #[error("the watch caches stopped")]
    CachesStopped,
    /// An action failed.
    #[error(transparent)]
    Act(#[from] ActError),
    /// Writing the status annotation failed.
    #[error("failed to write the drain status of statefulset {name}")]
    PatchStatus {
        /// Set name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// Stable category for Event reasons and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::CachesStopped => "CachesStopped",
            Self::Act(e) => e.reason(),
            Self::PatchStatus { .. } => "PatchStatusFailed",
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    client: Client,
    stateful_pods: Store<PartialObjectMeta<Pod>>,
    drain_pods: Store<Pod>,
    claims: Store<PartialObjectMeta<PersistentVolumeClaim>>,
    recorder: Recorder,
    config: ControllerConfig,
    failures: Mutex<HashMap<ObjectRef<StatefulSet>, u32>>,
    ready: tokio::sync::watch::Receiver<bool>,
}

impl Context {
    /// Waits until every watch cache has synced (see [`gate_readiness`]).
    async fn wait_ready(&self) -> Result<(), Error> {
        let mut ready = self.ready.clone();
        ready
            .wait_for(|r| *r)
            .await
            .map(|_| ())
            .map_err(|_| Error::CachesStopped)
    }
}

/// The caches of the secondary watches (the StatefulSet cache is the controller's own).
#[derive(Clone)]
struct Caches {
    stateful_pods: Store<PartialObjectMeta<Pod>>,
    drain_pods: Store<Pod>,
    claims: Store<PartialObjectMeta<PersistentVolumeClaim>>,
}

/// Flips `ready` once every secondary cache has synced. Each cache gets exactly one waiter, this
/// task: `Store::wait_until_ready` wakes only one of several concurrent waiters, and the
/// kube-runtime controller already waits on the StatefulSet cache before any reconcile runs.
async fn gate_readiness(caches: Caches, ready: tokio::sync::watch::Sender<bool>) {
    let synced = futures::try_join!(
        caches.stateful_pods.wait_until_ready(),
        caches.drain_pods.wait_until_ready(),
        caches.claims.wait_until_ready(),
    );
    if synced.is_ok() {
        info!("watch caches synced");
        let _ = ready.send(true);
    }
}

/// Whether a set asks for drains.
pub fn opted_in(set: &StatefulSet) -> bool {
    set.annotations()
        .contains_key(annotations::DRAINER_POD_TEMPLATE)
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Keeps only what reconciling needs of a set: everything of an opted-in set but its managed
/// fields and last-applied copy; only the metadata identity of the others.
fn slim_set(set: &mut StatefulSet) {
    set.metadata.managed_fields = None;
    set.status = None;
    if opted_in(set) {
        if let Some(a) = set.metadata.annotations.as_mut() {
            a.remove("kubectl.kubernetes.io/last-applied-configuration");
        }
    } else {
        set.spec = None;
        set.metadata.annotations = None;
        set.metadata.labels = None;
    }
}

/// Keeps name, namespace, UID, deletion timestamp and owners of a stateful pod.
fn slim_pod_meta(pod: &mut PartialObjectMeta<Pod>) {
    let m = &mut pod.metadata;
    m.managed_fields = None;
    m.annotations = None;
    m.labels = None;
}

/// Keeps name, namespace, UID, deletion timestamp and the drain record of a claim.
fn slim_claim(claim: &mut PartialObjectMeta<PersistentVolumeClaim>) {
    let m = &mut claim.metadata;
    m.managed_fields = None;
    m.labels = None;
    m.owner_references = None;
    m.finalizers = None;
    if let Some(a) = m.annotations.as_mut() {
        a.retain(|k, _| claim_annotations::ALL.contains(&k.as_str()));
        if a.is_empty() {
            m.annotations = None;
        }
    }
}

fn slim_drain_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
}

fn opted_in_ref(sets: &Store<StatefulSet>, name: &str, ns: &str) -> Option<ObjectRef<StatefulSet>> {
    let r = ObjectRef::new(name).within(ns);
    sets.get(&r).filter(|s| opted_in(s)).map(|_| r)
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: ControllerConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let ns = config.namespace.as_deref();
    let wc = watcher::Config::default();

    let (sets, sets_writer) = reflector::store();
    let set_stream = watcher(api::<StatefulSet>(&client, ns), wc.clone())
        .default_backoff()
        .modify(slim_set)
        .reflect(sets_writer)
        .applied_objects()
        .try_filter(|s| future::ready(opted_in(s)));

    let (stateful_pods, sp_writer) = reflector::store();
    let sp_stream = watcher(
        api::<PartialObjectMeta<Pod>>(&client, ns),
        wc.clone().labels(labels::STATEFUL_POD_NAME),
    )
    .default_backoff()
    .modify(slim_pod_meta)
    .reflect(sp_writer)
    .touched_objects();

    let (drain_pods, dp_writer) = reflector::store();
    let dp_stream = watcher(
        api::<Pod>(&client, ns),
        wc.clone().labels(labels::DRAIN_POD),
    )
    .default_backoff()
    .modify(slim_drain_pod)
    .reflect(dp_writer)
    .touched_objects();

    let (claims, claims_writer) = reflector::store();
    let claim_stream = watcher(
        api::<PartialObjectMeta<PersistentVolumeClaim>>(&client, ns),
        wc.clone(),
    )
    .default_backoff()
    .modify(slim_claim)
    .reflect(claims_writer)
    .touched_objects();

    let reporter = Reporter {
        controller: FIELD_MANAGER.to_owned(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let (ready_tx, ready) = tokio::sync::watch::channel(false);
    let gate = tokio::spawn(gate_readiness(
        Caches {
            stateful_pods: stateful_pods.clone(),
            drain_pods: drain_pods.clone(),
            claims: claims.clone(),
        },
        ready_tx,
    ));
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        stateful_pods,
        drain_pods,
        claims,
        config,
        failures: Mutex::default(),
        ready,
    });

    let (s1, s2, s3) = (sets.clone(), sets.clone(), sets.clone());
    Controller::for_stream(set_stream, sets)
        .watches_stream(sp_stream, move |pod: PartialObjectMeta<Pod>| {
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            pod.metadata
                .owner_references
                .iter()
                .flatten()
                .filter(|o| o.kind == "StatefulSet" && o.controller == Some(true))
                .filter_map(|o| opted_in_ref(&s1, &o.name, &ns))
                .collect::<Vec<_>>()
        })
        .watches_stream(dp_stream, move |pod: Pod| {
            let ns = pod.namespace().unwrap_or_default();
            pod.labels()
                .get(labels::DRAIN_POD)
                .and_then(|set| opted_in_ref(&s2, set, &ns))
        })
        .watches_stream(
            claim_stream,
            move |claim: PartialObjectMeta<PersistentVolumeClaim>| {
                let ns = claim.metadata.namespace.clone().unwrap_or_default();
                let name = claim.metadata.name.clone().unwrap_or_default();
                observe::claim_set_candidates(&name)
                    .into_iter()
                    .filter_map(|set| {
                        let r = opted_in_ref(&s3, set, &ns)?;
                        let found = s3.get(&r)?;
                        let templates = observe::claim_templates(&found);
                        observe::parse_claim_name(&name, set, &templates).map(|_| r)
                    })
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((set, _)) => debug!(set = %set, "reconciled"),
                Err(e) => debug!(error = %e, "reconcile failed"),
            }
        })
        .await;
    gate.abort();
    info!("controller stopped");
    Ok(())
}

fn set_reference(set: &StatefulSet) -> ObjectReference {
    ObjectReference {
        api_version: Some("apps/v1".to_owned()),
        kind: Some("StatefulSet".to_owned()),
        name: set.metadata.name.clone(),
        namespace: set.metadata.namespace.clone(),
        uid: set.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

/// The real cluster seam: one namespace, events on one StatefulSet.
struct KubeCluster<'a> {
    sets: Api<StatefulSet>,
    pods: Api<Pod>,
    claims: Api<PersistentVolumeClaim>,
    recorder: &'a Recorder,
    set: ObjectReference,
}

fn ok_if_gone(r: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match r {
        // 404: gone already; 409: the UID precondition failed, so the object we meant is gone.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        other => other,
    }
}

fn with_uid(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    }
}

impl Cluster for KubeCluster<'_> {
    async fn create_pod(&self, pod: &Pod) -> Result<Created, kube::Error> {
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        match self.pods.create(&pp, pod).await {
            Ok(p) => Ok(Created::Uid(p.metadata.uid.unwrap_or_default())),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Created::AlreadyExists),
            Err(e) => Err(e),
        }
    }

    async fn delete_pod(&self, name: &str, uid: &str) -> Result<(), kube::Error> {
        ok_if_gone(self.pods.delete(name, &with_uid(uid)).await.map(|_| ()))
    }

    async fn delete_claim(&self, name: &str, uid: &str) -> Result<(), kube::Error> {
        ok_if_gone(self.claims.delete(name, &with_uid(uid)).await.map(|_| ()))
    }

    async fn annotate_claim(
        &self,
        name: &str,
        uid: &str,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> Result<(), kube::Error> {
        // The UID in the patch is a precondition: a claim recreated under the name is left alone.
        let patch = json!({"metadata": {"uid": uid, "annotations": annotations}});
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let patched = self.claims.patch(name, &pp, &Patch::Merge(patch)).await;
        ok_if_gone(patched.map(|_| ()))
    }

    async fn still_orphaned(&self, ordinal: i32) -> Result<bool, kube::Error> {
        let name = self.set.name.clone().unwrap_or_default();
        let Some(set) = self.sets.get_opt(&name).await? else {
            return Ok(false);
        };
        if set.metadata.uid != self.set.uid {
            return Ok(false);
        }
        let spec = set.spec.unwrap_or_default();
        let start = spec.ordinals.and_then(|o| o.start).unwrap_or(0);
        let end = start.saturating_add(spec.replicas.unwrap_or(1).max(0));
        Ok(ordinal < start || ordinal >= end)
    }

    async fn pod_uid(&self, name: &str) -> Result<Option<String>, kube::Error> {
        Ok(self.pods.get_opt(name).await?.and_then(|p| p.metadata.uid))
    }

    async fn event(&self, subject: &Subject, severity: Severity, reason: &str, note: String) {
        let reference = match subject {
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
        publish(self.recorder, &reference, severity, reason, note).await;
    }
}

async fn publish(
    recorder: &Recorder,
    reference: &ObjectReference,
    severity: Severity,
    reason: &str,
    note: String,
) {
    let ev = Event {
        type_: match severity {
            Severity::Normal => EventType::Normal,
            Severity::Warning => EventType::Warning,
        },
        reason: reason.to_owned(),
        note: Some(note.chars().take(1000).collect()),
        action: "Drain".to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, reference).await {
        warn!(error = %e, reason, "failed to publish event");
    }
}

/// Writes the status annotation on the set when it changed (removes it when there is nothing
/// to report).
async fn report(ctx: &Context, set: &StatefulSet, report: &StatusReport) -> Result<(), Error> {
    let name = set.name_any();
    let current = set.annotations().get(annotations::STATUS);
    let wanted = (report != &StatusReport::default()).then(|| report.render());
    if current == wanted.as_ref() {
        return Ok(());
    }
    let api: Api<StatefulSet> =
        Api::namespaced(ctx.client.clone(), &set.namespace().unwrap_or_default());
    let patch = json!({"metadata": {"annotations": {annotations::STATUS: wanted}}});
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match api.patch(&name, &pp, &Patch::Merge(patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::PatchStatus { name, source }),
    }
}

/// Reconciles one opted-in StatefulSet:
/// 1. observe: wait for the caches, then read the set's claims, drain pods and the pods holding
///    its pod names from them;
/// 2. validate: the drain annotations and template (invalid → Warning Event, status problem,
///    nothing touched, wait for a change);
/// 3. plan: [`plan::plan`], pure;
/// 4. act: [`act::apply`], idempotent, with Events;
/// 5. report: the status annotation; requeue at the plan's next deadline or the resync period.
async fn reconcile(set: Arc<StatefulSet>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let name = set.name_any();
    let ns = set.namespace().unwrap_or_default();
    let span = info_span!("reconcile", statefulset = %name, namespace = %ns);
    async move {
        if !opted_in(&set) {
            // A requeue scheduled before the set opted out (its cached copy is slimmed).
            return Ok(Requeue::await_change());
        }
        ctx.wait_ready().await?;
        let set_ref = set_reference(&set);
        let previous = set.annotations().get(annotations::STATUS).and_then(|t| StatusReport::parse(t));

        // validate
        let validated = DrainConfig::from_set(&set)
            .map_err(|e| vec![(e.reason(), e.to_string())])
            .and_then(|config| {
                template::validate(&set, &config)
                    .map(|t| (config, t))
                    .map_err(|errs| errs.iter().map(|e| (e.reason(), e.to_string())).collect())
            });
        let (config, template) = match validated {
            Ok(v) => v,
            Err(problems) => {
                for (reason, message) in &problems {
                    warn!(reason, %message, "invalid drain settings; nothing is touched until the set changes");
                    publish(&ctx.recorder, &set_ref, Severity::Warning, reason, format!("{message}; no drain runs until this is fixed")).await;
                }
                let text = problems.iter().map(|(_, m)| m.as_str()).collect::<Vec<_>>().join("; ");
                report(&ctx, &set, &StatusReport::problem(previous, text)).await?;
                return Ok(Requeue::await_change());
            }
        };

        // observe
        let claim_metas: Vec<_> = ctx
            .claims
            .state()
            .into_iter()
            .filter(|c| c.metadata.namespace.as_deref() == Some(ns.as_str()))
            .collect();
        let drain_pods: Vec<_> = ctx
            .drain_pods
            .state()
            .into_iter()
            .filter(|p| {
                p.metadata.namespace.as_deref() == Some(ns.as_str())
                    && p.labels().get(labels::DRAIN_POD) == Some(&name)
            })
            .collect();
        let templates = observe::claim_templates(&set);
        let ordinals: BTreeSet<i32> = claim_metas
            .iter()
            .filter_map(|c| observe::parse_claim_name(c.metadata.name.as_deref()?, &name, &templates))
            .map(|(_, o)| o)
            .collect();
        let others: Vec<_> = ordinals
            .iter()
            .filter_map(|o| ctx.stateful_pods.get(&ObjectRef::new(&format!("{name}-{o}")).within(&ns)))
            .collect();
        let snap = observe::snapshot(
            &set,
            claim_metas.iter().map(|c| &c.metadata),
            drain_pods.iter().map(|p| p.as_ref()),
            others.iter().map(|p| &p.metadata),
        );

        // plan
        let settings = plan::Settings {
            max_concurrent: config.concurrency_limit(&set),
            on_scale_up: config.on_scale_up,
            max_attempts: config.max_attempts,
            deadline: config.deadline,
            retry_base: ctx.config.retry_base,
            retry_max: ctx.config.retry_max,
        };
        let now = Timestamp::now();
        let plan = plan::plan(&snap, &settings, now);
        if !plan.actions.is_empty() {
            info!(actions = ?plan.actions, "acting");
        }

        // act
        let cluster = KubeCluster {
            sets: Api::namespaced(ctx.client.clone(), &ns),
            pods: Api::namespaced(ctx.client.clone(), &ns),
            claims: Api::namespaced(ctx.client.clone(), &ns),
            recorder: &ctx.recorder,
            set: set_ref.clone(),
        };
        if let Err(e) = act::apply(&cluster, &template, snap.replicas, &plan.actions, now).await {
            error!(error = %e, source = ?std::error::Error::source(&e), "action failed; retrying with backoff");
            let note = format!("{e}: {}", std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default());
            publish(&ctx.recorder, &set_ref, Severity::Warning, e.reason(), note).await;
            return Err(e.into());
        }

        // report
        report(&ctx, &set, &StatusReport::of(&plan.status)).await?;
        ctx.failures.lock().expect("failures lock").remove(&ObjectRef::from_obj(set.as_ref()));
        Ok(Requeue::requeue(plan.requeue_after.unwrap_or(ctx.config.resync).min(ctx.config.resync)))
    }
    .instrument(span)
    .await
}

/// Retries a failed reconcile with exponential backoff per set (1 s doubling, at most 5 min).
fn error_policy(set: Arc<StatefulSet>, err: &Error, ctx: Arc<Context>) -> Requeue {
    let mut failures = ctx.failures.lock().expect("failures lock");
    let n = failures
        .entry(ObjectRef::from_obj(set.as_ref()))
        .or_insert(0);
    *n = n.saturating_add(1);
    let delay = plan::backoff(*n, Duration::from_secs(1), Duration::from_secs(300));
    warn!(statefulset = %set.name_any(), reason = err.reason(), error = %err, ?delay, "reconcile failed");
    Requeue::requeue(delay)
}
