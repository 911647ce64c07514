//! kube-runtime wiring: the watches (narrowed by label selectors, metadata-only where the full
//! object is not needed, slimmed before they are cached), the mappers from pods and claims to
//! their StatefulSet, the reconcile pipeline, the error policy, and the cluster seam's real
//! implementation.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use drain_api::names;
use drain_api::{annotations, labels};
use futures::{FutureExt, Stream, StreamExt, TryStreamExt, future};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::act::{
    self, ActCtx, ActError, Cluster, Created, Deleted, EventSpec, Patched, Retained, Severity,
    Subject,
};
use crate::leader::Leadership;
use crate::meta_cache::{Cache, ClaimEntry, Indexed, PodEntry, version_of};
use crate::metrics::Metrics;
use crate::plan::ClaimRef;
use crate::recent::{self, Recent};
use crate::retain::{self, RetainError};
use crate::set_kind::{self, ADVANCED_API_VERSION, AdvancedStatefulSet, ServedSet, SetKind};
use crate::status::StatusReport;
use crate::status_writer::{Patcher, StatusWriter, Target};
use crate::validate::{self, Flags};
use crate::watch::{self, Filter, Index, SetKey};
use crate::{observe, plan};

/// The field manager of every write.
pub const FIELD_MANAGER: &str = "statefulset-drain-controller";

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Watch and act in this namespace only (`None`: all namespaces).
    pub namespace: Option<String>,
    /// The flags that shape every set's plan.
    pub flags: Flags,
    /// Reconcile each opted-in set at least this often.
    pub resync: Duration,
    /// Whether this replica may act (leader election).
    pub leadership: Leadership,
    /// Plan and report only (`--dry-run`).
    pub dry_run: bool,
    /// Until Advanced StatefulSets are served, ask the API server this often.
    pub advanced_discovery: Duration,
    /// How long a stop waits for the reconciles in progress (`--stop-grace`; see [`Stopped`]).
    pub stop_grace: Duration,
}

/// What the controller reports to the admin server: its metrics, and whether its caches synced.
#[derive(Clone, Debug)]
pub struct Telemetry {
    /// The metrics it updates.
    pub metrics: Arc<Metrics>,
    /// Set to `true` once every watch cache synced (`/readyz`).
    pub ready: tokio::sync::watch::Sender<bool>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self {
            metrics: Arc::default(),
            ready: tokio::sync::watch::channel(false).0,
        }
    }
}

/// A reconcile that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A cache stopped (the watch's writer was dropped).
    #[error("the watch caches stopped")]
    CachesStopped,
    /// One or more actions failed (the first is the source).
    #[error("{count} action(s) failed")]
    Act {
        /// How many.
        count: usize,
        /// The first.
        #[source]
        first: ActError,
    },
}

impl Error {
    /// Stable category for Event reasons and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::CachesStopped => "CachesStopped",
            Self::Act { first, .. } => first.reason(),
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    client: Client,
    stateful_pods: Cache<PodEntry>,
    drain_pods: Store<Pod>,
    claims: Cache<ClaimEntry>,
    /// Our writes of drain pods and claims that their watches have not delivered yet.
    recent: Arc<Recents>,
    drain_pod_index: Index,
    claim_index: Index,
    recorder: Recorder,
    config: ControllerConfig,
    /// Failed reconciles in a row, by set ([`next_failure`]).
    failures: Mutex<HashMap<SetId, Failures>>,
    /// The sets whose last live read before a drain pod's create did not confirm it (it failed,
    /// or showed the ordinal back in range): their creates wait for the read until one confirms
    /// ([`Cluster::confirm_first`]).
    unconfirmed: Mutex<std::collections::HashSet<SetId>>,
    /// Drain pods whose withdrawal failed, by set: UID → name ([`Cluster::withdraw_later`]).
    withdrawing: Mutex<HashMap<SetId, BTreeMap<String, String>>>,
    /// Pods made neither by the set nor by us that hold an ordinal's name, by set: ordinal →
    /// UID ([`Cluster::name_taken`]); read again at each reconcile ([`recheck_taken`]).
    taken: Taken,
    /// Writes the status in the background, and shows the status last wanted or written per set
    /// to reads from a cache that has not caught up yet.
    status: StatusWriter,
    /// Under `--dry-run`: a fingerprint of the Events last published per set, so an unchanged
    /// plan is not reported again.
    dry_run_reported: Mutex<HashMap<SetId, u64>>,
    /// The metrics.
    metrics: Arc<Metrics>,
    ready: tokio::sync::watch::Receiver<bool>,
    /// Wakes the sweep of retained volumes when one was marked ([`retain::sweep`]).
    retained: Arc<tokio::sync::Notify>,
    /// The built-in StatefulSets' cache.
    sets: Store<StatefulSet>,
    /// The Advanced StatefulSets' cache, once that kind is served.
    advanced: Arc<OnceLock<Store<AdvancedStatefulSet>>>,
}

impl Context {
    /// Whether a set of `kind` named `name` is in `ns`, per the caches of the sets (`None`:
    /// of either kind).
    fn set_exists(&self, kind: Option<SetKind>, ns: &str, name: &str) -> bool {
        let builtin = || self.sets.get(&ObjectRef::new(name).within(ns)).is_some();
        let advanced = || {
            self.advanced
                .get()
                .is_some_and(|s| s.get(&ObjectRef::new(name).within(ns)).is_some())
        };
        match kind {
            Some(SetKind::StatefulSet) => builtin(),
            Some(SetKind::Advanced) => advanced(),
            None => builtin() || advanced(),
        }
    }

    /// Forgets what is kept per set (backoff counts, the status memo, metric series) for the
    /// sets no longer in the caches: run when a set is deleted or the sets are relisted.
    /// Without it a deleted set's gauges show its last drains for ever, and a cluster where
    /// sets come and go piles up entries. Pending withdrawals are kept: after `kubectl delete
    /// sts --cascade=orphan` the drain pod outlives its set, and the set recreated under the
    /// name withdraws it at its first reconcile (by UID), where nothing else would (it is not
    /// the new set's drain pod, and holds the name of one of its pods).
    fn forget_gone_sets(&self) {
        let keep = |(kind, ns, name): &SetId| self.set_exists(Some(*kind), ns, name);
        self.failures.lock().expect("lock").retain(|id, _| keep(id));
        self.unconfirmed.lock().expect("lock").retain(|id| keep(id));
        self.taken.lock().expect("lock").retain(|id, _| keep(id));
        self.dry_run_reported
            .lock()
            .expect("lock")
            .retain(|id, _| keep(id));
        self.status
            .retain(|ns, name| self.set_exists(None, ns, name));
        self.metrics
            .retain_sets(|s| self.set_exists(None, &s.namespace, &s.statefulset));
    }

    /// After a reconcile of a set of `kind`: if the set was deleted meanwhile, what the
    /// reconcile kept for it is forgotten now (the deletion's own sweep may have run before).
    fn forget_if_gone(&self, kind: SetKind, ns: &str, name: &str) {
        if !self.set_exists(Some(kind), ns, name) {
            self.forget_gone_sets();
        }
    }

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

/// Our recent writes (see [`crate::recent`]).
#[derive(Default)]
struct Recents {
    /// Drain pods we created.
    pods: Recent<Pod>,
    /// Claims we annotated.
    claims: Recent<ClaimEntry>,
    /// Drain pods we deleted.
    deleted_pods: recent::Deleted,
}

/// What readiness waits for: the built-in StatefulSets listed (their cache is the
/// controller's own), and the caches of the secondary watches.
#[derive(Clone)]
struct Caches {
    sets_listed: tokio::sync::watch::Receiver<bool>,
    stateful_pods: Cache<PodEntry>,
    drain_pods: Store<Pod>,
    claims: Cache<ClaimEntry>,
}

/// Flips `ready` once the built-in StatefulSets have been listed and every secondary cache has
/// synced. The drain pod store gets exactly one waiter, this task: `Store::wait_until_ready`
/// wakes only one of several concurrent waiters, and the kube-runtime controller waits on the
/// StatefulSet store, so the sets' listing is seen through their watch's events instead.
/// OpenKruise's Advanced StatefulSets, served or not, do not hold readiness.
async fn gate_readiness(caches: Caches, ready: tokio::sync::watch::Sender<bool>) {
    async fn listed(mut flag: tokio::sync::watch::Receiver<bool>) -> Result<(), ()> {
        flag.wait_for(|listed| *listed)
            .await
            .map(drop)
            .map_err(drop)
    }
    let synced = futures::try_join!(
        listed(caches.sets_listed.clone()),
        caches
            .stateful_pods
            .wait_until_ready()
            .map(|r| r.map_err(|_| ())),
        caches
            .drain_pods
            .wait_until_ready()
            .map(|r| r.map_err(|_| ())),
        caches.claims.wait_until_ready().map(|r| r.map_err(|_| ())),
    );
    if synced.is_ok() {
        info!("watch caches synced");
        let _ = ready.send(true);
    }
}

/// Whether a set asks for drains.
pub fn opted_in(set: &StatefulSet) -> bool {
    set_kind::opted_in(&set.metadata)
}

/// A set's identity for per-set bookkeeping: its kind, namespace and name.
type SetId = (SetKind, String, String);

fn set_id(kind: SetKind, set: &StatefulSet) -> SetId {
    (kind, set.namespace().unwrap_or_default(), set.name_any())
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

/// What of a set can change a decision: not its status, nor the annotations we write.
fn set_fingerprint<K: Resource>(set: &K) -> u64 {
    let m = set.meta();
    let annotations: Vec<(&String, &String)> = m
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != annotations::STATUS && k.as_str() != annotations::RELEASED)
        .collect();
    watch::fingerprint((
        &m.uid,
        m.generation,
        m.deletion_timestamp.is_some(),
        annotations,
    ))
}

/// What of a drain pod can change a decision: everything the planner sees but its
/// resourceVersion, and whose it is.
fn drain_pod_fingerprint(pod: &Pod) -> u64 {
    let obs = observe::drain_pod(pod, 0);
    let owners: Vec<&str> = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| o.uid.as_str())
        .collect();
    // Every field the planner reads but the resourceVersion, which changes with every write.
    let mut kind = obs.kind;
    if let plan::PodKind::Drain(d) = &mut kind {
        d.resource_version.clear();
    }
    watch::fingerprint((
        format!("{kind:?}"),
        obs.uid,
        obs.terminating,
        owners,
        pod.labels().get(labels::DRAIN_POD),
    ))
}

fn drain_pod_sets(pod: &Pod) -> Vec<SetKey> {
    let ns = pod.namespace().unwrap_or_default();
    pod.labels()
        .get(labels::DRAIN_POD)
        .map(|set| vec![(ns, set.clone())])
        .unwrap_or_default()
}

fn claim_sets(ns: &str, name: &str) -> Vec<SetKey> {
    observe::claim_set_candidates(name)
        .into_iter()
        .map(|set| (ns.to_owned(), set.to_owned()))
        .collect()
}

fn slim_drain_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
}

fn opted_in_ref<K: ServedSet>(sets: &Store<K>, name: &str, ns: &str) -> Option<ObjectRef<K>> {
    let r = ObjectRef::new(name).within(ns);
    sets.get(&r)
        .filter(|s| set_kind::opted_in(s.meta()))
        .map(|_| r)
}

fn any_set_ref<K: ServedSet>(sets: &Store<K>, name: &str, ns: &str) -> Option<ObjectRef<K>> {
    let r = ObjectRef::new(name).within(ns);
    sets.get(&r).map(|_| r)
}

/// The sets of either kind that changes of pods and claims are routed to: each kind's cache of
/// sets (the Advanced StatefulSet one once that kind is served) and its controller's trigger.
#[derive(Clone)]
struct Routes {
    sets: Store<StatefulSet>,
    to_sets: mpsc::UnboundedSender<ObjectRef<StatefulSet>>,
    advanced: Arc<OnceLock<Store<AdvancedStatefulSet>>>,
    to_advanced: mpsc::UnboundedSender<ObjectRef<AdvancedStatefulSet>>,
    /// Drain pods by set: a set that opted out with a drain in flight still hears of its
    /// claims (an approval given while it waits).
    in_flight: Index,
}

impl Routes {
    /// Triggers the opted-in set that controls a stateful pod (by its controller reference).
    fn stateful_pod(&self, pod: &PartialObjectMeta<Pod>) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let owners = pod.metadata.owner_references.iter().flatten();
        for o in owners.filter(|o| o.kind == "StatefulSet" && o.controller == Some(true)) {
            match SetKind::of_api_version(&o.api_version) {
                Some(SetKind::StatefulSet) => {
                    if let Some(r) = opted_in_ref(&self.sets, &o.name, &ns) {
                        let _ = self.to_sets.send(r);
                    }
                }
                Some(SetKind::Advanced) => {
                    if let Some(r) = self
                        .advanced
                        .get()
                        .and_then(|s| opted_in_ref(s, &o.name, &ns))
                    {
                        let _ = self.to_advanced.send(r);
                    }
                }
                None => {}
            }
        }
    }

    /// Triggers the set a drain pod is labelled with, of either kind, opted in or not: a drain
    /// in flight is completed either way.
    fn drain_pod(&self, pod: &Pod) {
        let ns = pod.namespace().unwrap_or_default();
        let Some(set) = pod.labels().get(labels::DRAIN_POD) else {
            return;
        };
        if let Some(r) = any_set_ref(&self.sets, set, &ns) {
            let _ = self.to_sets.send(r);
        }
        if let Some(r) = self.advanced.get().and_then(|s| any_set_ref(s, set, &ns)) {
            let _ = self.to_advanced.send(r);
        }
    }

    /// Triggers every set, of either kind, that a claim's name makes it a claim of, if the
    /// set opted in or has a drain in flight.
    fn claim(&self, claim: &PartialObjectMeta<PersistentVolumeClaim>) {
        let ns = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        for set in observe::claim_set_candidates(&name) {
            let draining = !self.in_flight.names(&ns, set).is_empty();
            if let Some(r) = claim_ref(&self.sets, &name, set, &ns, draining) {
                let _ = self.to_sets.send(r);
            }
            if let Some(r) = self
                .advanced
                .get()
                .and_then(|s| claim_ref(s, &name, set, &ns, draining))
            {
                let _ = self.to_advanced.send(r);
            }
        }
    }
}

fn claim_ref<K: ServedSet>(
    sets: &Store<K>,
    claim: &str,
    set: &str,
    ns: &str,
    draining: bool,
) -> Option<ObjectRef<K>> {
    let r = if draining {
        any_set_ref(sets, set, ns)?
    } else {
        opted_in_ref(sets, set, ns)?
    };
    let found = sets.get(&r)?;
    observe::parse_claim_name(claim, set, &found.claim_templates()).map(|_| r)
}

/// Drives a secondary watch, routing each change it passes on with `route`.
async fn drive<K>(
    changes: impl Stream<Item = Result<K, watcher::Error>>,
    routes: Routes,
    route: fn(&Routes, &K),
) {
    changes
        .for_each(|change| {
            match change {
                Ok(obj) => route(&routes, &obj),
                Err(e) => debug!(error = %e, "watch error; retrying with backoff"),
            }
            future::ready(())
        })
        .await;
}

/// The watch of one kind of set: its cache, the sets that opted in or have drains in flight,
/// and a flag that turns `true` once the sets have been listed. Each deletion and each
/// (re)list, once in the cache, is told on `gone` (see [`Context::forget_gone_sets`]).
fn set_watch<K: ServedSet>(
    client: &Client,
    ns: Option<&str>,
    in_flight: Index,
    gone: mpsc::UnboundedSender<()>,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    tokio::sync::watch::Receiver<bool>,
) {
    let (sets, writer) = reflector::store();
    let (listed, listed_rx) = tokio::sync::watch::channel(false);
    let stream = watch::changes(
        watcher(api::<K>(client, ns), watcher::Config::default())
            .default_backoff()
            .modify(K::slim)
            .reflect(writer)
            .inspect_ok(move |event| match event {
                watcher::Event::InitDone => {
                    listed.send_replace(true);
                    let _ = gone.send(());
                }
                watcher::Event::Delete(_) => {
                    let _ = gone.send(());
                }
                _ => {}
            }),
        Filter {
            fingerprint: set_fingerprint::<K>,
            sets: |_| Vec::new(),
            index: None,
        },
    )
    .try_filter(move |s| {
        let draining = !in_flight
            .names(&s.namespace().unwrap_or_default(), &s.name_any())
            .is_empty();
        future::ready(set_kind::opted_in(s.meta()) || draining)
    });
    (sets, stream, listed_rx)
}

/// Whether a stop, at this instant, may drop the controller of one kind of set at once: yes
/// while its sets are not listed or the other caches have not synced.
fn halt_at_once(sets_listed: bool, caches_synced: bool) -> bool {
    !(sets_listed && caches_synced)
}

/// Runs the controller of one kind of set until `shutdown` resolves, then lets the reconciles
/// in progress finish, for at most the stop's grace (see [`Stopped`]). Returns how it stopped.
async fn serve<K: ServedSet>(
    ctx: Arc<Context>,
    sets: Store<K>,
    stream: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    triggers: mpsc::UnboundedReceiver<ObjectRef<K>>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) -> Stopped {
    let gained = ctx.config.leadership.gained();
    let grace = ctx.config.stop_grace;
    let halt = {
        let (sets, ctx, stop) = (sets.clone(), Arc::clone(&ctx), shutdown.clone());
        async move {
            stop.await;
            // Polled once: `Store::wait_until_ready` keeps one waker, and if it is not ready the
            // controller is dropped right away, so the runner's waker is not needed any more.
            let listed = matches!(sets.wait_until_ready().now_or_never(), Some(Ok(())));
            if halt_at_once(listed, *ctx.ready.borrow()) {
                info!(
                    kind = K::KIND.label(),
                    "stopped before the sets and caches had synced; no reconcile had started"
                );
                return Stopped::Clean;
            }
            tokio::time::sleep(grace).await;
            warn!(
                kind = K::KIND.label(),
                grace = ?grace,
                "reconciles still running at the end of the stop's grace; dropped (the next leader resumes them)"
            );
            Stopped::DroppedReconciles
        }
    };
    let run = Controller::for_stream(stream, sets)
        .reconcile_all_on(gained)
        .reconcile_on(tokio_stream_from(triggers))
        .graceful_shutdown_on(shutdown)
        .run(reconcile::<K>, error_policy::<K>, ctx)
        .for_each(|res| async move {
            match res {
                Ok((set, _)) => debug!(set = %set, "reconciled"),
                // The watch of the sets failed (an RBAC denial, an object that does not parse):
                // retried with backoff, and said, or the kind would go unserved in silence.
                Err(kube::runtime::controller::Error::QueueError(e)) => {
                    warn!(kind = K::KIND.label(), error = %e, "watching the sets failed; retrying");
                }
                Err(e) => debug!(error = %e, "reconcile failed"),
            }
        });
    tokio::select! {
        () = run => Stopped::Clean,
        stopped = halt => stopped,
    }
}

/// How the controller stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// No reconcile was left running: kube-runtime's graceful shutdown ended, or the sets or
    /// the other caches had not synced, so no reconcile had got past its wait for them and none
    /// had acted. (kube-runtime holds its runner until the sets are listed and stops polling
    /// their watch once a shutdown begins, so its graceful shutdown would never end then.)
    Clean,
    /// The stop's grace ([`ControllerConfig::stop_grace`], 20 s by default: inside
    /// Kubernetes' default 30 s grace period) passed with reconciles still running, and they
    /// were dropped. Every action is idempotent and all state is in the cluster, so the next
    /// leader resumes them as after a crash; but requests of theirs may still be on their way,
    /// so the Lease is left to expire, as after a crash, rather than released for a standby to
    /// act at once.
    DroppedReconciles,
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Whether `set` may run a pod for `ordinal`: it is in the set's range, or in the range Kruise
/// runs if it ignores `spec.ordinals.start` ([`ServedSet::start_fallback`]), or the set's
/// membership cannot be read.
fn wants<K: ServedSet>(set: &K, ordinal: i32) -> bool {
    let Ok(range) = set.ordinals() else {
        return true;
    };
    range.contains(ordinal) || set.start_fallback().is_some_and(|r| r.contains(ordinal))
}

/// The API of the sets of the other kind than the one reconciled.
enum Twin {
    /// Built-in StatefulSets.
    StatefulSets(Api<StatefulSet>),
    /// Advanced StatefulSets.
    Advanced(Api<AdvancedStatefulSet>),
}

impl Twin {
    /// Whether a set named `name` exists, read live.
    async fn exists(&self, name: &str, metrics: &Metrics) -> Result<bool, kube::Error> {
        let found = match self {
            Self::StatefulSets(api) => api.get_metadata_opt(name).await.map(|m| m.is_some()),
            Self::Advanced(api) => api.get_metadata_opt(name).await.map(|m| m.is_some()),
        };
        metrics.request("get", "statefulsets", &found);
        found
    }
}

impl Context {
    /// The kind of the cached set of the other kind named like this one, if there is one.
    fn twin_cached(&self, kind: SetKind, ns: &str, name: &str) -> Option<SetKind> {
        match kind {
            SetKind::StatefulSet => self
                .advanced
                .get()
                .and_then(|s| s.get(&ObjectRef::new(name).within(ns)))
                .map(|_| SetKind::Advanced),
            SetKind::Advanced => self
                .sets
                .get(&ObjectRef::new(name).within(ns))
                .map(|_| SetKind::StatefulSet),
        }
    }

    /// The live API of the other kind, when it is served.
    fn twin_api(&self, kind: SetKind, ns: &str) -> Option<Twin> {
        match kind {
            SetKind::StatefulSet => self
                .advanced
                .get()
                .map(|_| Twin::Advanced(Api::namespaced(self.client.clone(), ns))),
            SetKind::Advanced => Some(Twin::StatefulSets(Api::namespaced(self.client.clone(), ns))),
        }
    }
}

/// A drain pod of an Advanced StatefulSet that is gone (its watch saw it deleted).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Released {
    namespace: String,
    set: String,
    set_uid: String,
    pod: String,
    ordinal: i32,
}

impl Released {
    fn of(pod: &Pod) -> Option<Self> {
        let set = pod.labels().get(labels::DRAIN_POD)?;
        let owner = pod.metadata.owner_references.iter().flatten().find(|o| {
            o.kind == "StatefulSet"
                && o.name == *set
                && SetKind::of_api_version(&o.api_version) == Some(SetKind::Advanced)
        })?;
        let name = pod.metadata.name.clone()?;
        Some(Self {
            namespace: pod.namespace()?,
            ordinal: names::parse_pod_name(&name, set)?,
            set: set.clone(),
            set_uid: owner.uid.clone(),
            pod: name,
        })
    }
}

/// When a drain pod of an Advanced StatefulSet is gone and the set wants its ordinal again (a
/// cancelled drain, an un-reserved ordinal), touches the set ([`annotations::RELEASED`]) so
/// Kruise creates its pod at once: Kruise reacts to changes of the pods it controls only, and
/// retries a create that found our pod in the way with a backoff of up to 1,000 s.
async fn tell_kruise(
    ctx: Arc<Context>,
    advanced: Arc<OnceLock<Store<AdvancedStatefulSet>>>,
    mut released: mpsc::UnboundedReceiver<Released>,
) {
    while let Some(r) = released.recv().await {
        if !ctx.config.leadership.is_leading() || ctx.config.dry_run {
            continue;
        }
        let Some(set) = advanced
            .get()
            .and_then(|s| s.get(&ObjectRef::new(&r.set).within(&r.namespace)))
        else {
            continue;
        };
        if set.metadata.uid.as_deref() != Some(r.set_uid.as_str())
            || !wants(set.as_ref(), r.ordinal)
        {
            continue;
        }
        let api: Api<AdvancedStatefulSet> = Api::namespaced(ctx.client.clone(), &r.namespace);
        let value = format!("{} {}", r.pod, Timestamp::now());
        let patch =
            json!({"metadata": {"uid": r.set_uid, "annotations": {annotations::RELEASED: value}}});
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let result = api.patch(&r.set, &pp, &Patch::Merge(patch)).await;
        ctx.metrics.request("patch", "statefulsets", &result);
        match result {
            Ok(_) => {
                info!(statefulset = %r.set, namespace = %r.namespace, pod = %r.pod, "drain pod gone; told Kruise the name is free")
            }
            Err(e) if gone_or_replaced(&e) => {}
            Err(e) => {
                warn!(statefulset = %r.set, namespace = %r.namespace, pod = %r.pod, error = %e, "failed to tell Kruise a drain pod is gone; it creates its pod at its next retry")
            }
        }
    }
}

/// Whether the API server serves Advanced StatefulSets (OpenKruise's CRD is installed).
async fn advanced_served(client: &Client) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(ADVANCED_API_VERSION).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "statefulsets")),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Waits until Advanced StatefulSets are served, asking the API server's discovery every
/// `every`; says once (at info) that they are not served yet.
async fn wait_for_advanced(client: &Client, every: Duration) {
    let mut said = false;
    loop {
        match advanced_served(client).await {
            Ok(true) => {
                info!(
                    api_version = ADVANCED_API_VERSION,
                    "serving OpenKruise Advanced StatefulSets"
                );
                return;
            }
            Ok(false) if !said => {
                info!(
                    api_version = ADVANCED_API_VERSION,
                    every = %humantime::format_duration(every),
                    "OpenKruise Advanced StatefulSets are not served: the API is not installed; built-in StatefulSets are, and the API server is asked again periodically"
                );
                said = true;
            }
            Ok(false) => {}
            Err(e) => {
                warn!(error = %e, "failed to ask the API server whether Advanced StatefulSets are served; asking again")
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Runs the controller until `shutdown` resolves; returns how it stopped.
pub async fn run(
    client: Client,
    config: ControllerConfig,
    telemetry: Telemetry,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<Stopped, Error> {
    let namespace = config.namespace.clone();
    let ns = namespace.as_deref();
    let wc = watcher::Config::default();

    let drain_pod_index = Index::default();
    let claim_index = Index::default();

    let (released_tx, released_rx) = mpsc::unbounded_channel();
    let (drain_pods, dp_writer) = reflector::store();
    let recent = Arc::new(Recents::default());
    let relisting = Arc::new(AtomicBool::new(false));
    let dp_stream = watch::changes(
        watcher(
            api::<Pod>(&client, ns),
            wc.clone().labels(labels::DRAIN_POD),
        )
        .default_backoff()
        .modify(slim_drain_pod)
        .inspect_ok({
            let released = released_tx.clone();
            move |event| {
                if let watcher::Event::Delete(pod) = event
                    && let Some(r) = Released::of(pod)
                {
                    let _ = released.send(r);
                }
            }
        })
        .reflect(dp_writer)
        .inspect_ok({
            let relisting = Arc::clone(&relisting);
            move |event| match event {
                watcher::Event::Init => relisting.store(true, Ordering::Relaxed),
                watcher::Event::InitDone => relisting.store(false, Ordering::Relaxed),
                _ => {}
            }
        }),
        Filter {
            fingerprint: drain_pod_fingerprint,
            sets: drain_pod_sets,
            index: Some(drain_pod_index.clone()),
        },
    )
    // A drain pod passed on is in the cache and the index (an Added or Deleted event passes
    // always), except during a relist: kube's reflector applies a list only at its end.
    .inspect_ok({
        let recent = Arc::clone(&recent);
        move |pod: &Pod| {
            if !relisting.load(Ordering::Relaxed) {
                recent.pods.saw(pod.metadata.resource_version.as_deref());
            }
        }
    });

    let stateful_pods = Cache::default();
    let gone = Arc::clone(&telemetry.metrics);
    let sp_stream = stateful_pods.changes(
        watcher(
            api::<PartialObjectMeta<Pod>>(&client, ns),
            wc.clone().labels(labels::STATEFUL_POD_NAME),
        )
        .default_backoff()
        .inspect_ok(move |event| {
            // For the reaction-time histogram: when a stateful pod disappeared.
            if let watcher::Event::Delete(pod) = event {
                gone.pod_gone(&pod.namespace().unwrap_or_default(), &pod.name_any());
            }
        }),
        None,
    );

    let claims = Cache::default();
    let claim_stream = claims.changes(
        watcher(
            api::<PartialObjectMeta<PersistentVolumeClaim>>(&client, ns),
            wc.clone(),
        )
        .default_backoff(),
        Some(Indexed {
            sets: claim_sets,
            index: claim_index.clone(),
        }),
    );

    let reporter = Reporter {
        controller: FIELD_MANAGER.to_owned(),
        instance: std::env::var("POD_NAME").ok(),
    };
    // Each kind of set has its own controller; the pod and claim watches are shared, and a
    // change is routed to the sets of either kind it concerns.
    let (gone_tx, mut gone_rx) = mpsc::unbounded_channel();
    let (sets, set_stream, sets_listed) =
        set_watch::<StatefulSet>(&client, ns, drain_pod_index.clone(), gone_tx.clone());
    let ready = telemetry.ready.subscribe();
    let gate = tokio::spawn(gate_readiness(
        Caches {
            sets_listed,
            stateful_pods: stateful_pods.clone(),
            drain_pods: drain_pods.clone(),
            claims: claims.clone(),
        },
        telemetry.ready,
    ));
    let advanced_sets: Arc<OnceLock<Store<AdvancedStatefulSet>>> = Arc::default();
    let status = StatusWriter::new(
        status_patcher(client.clone(), Arc::clone(&telemetry.metrics)),
        config.leadership.clone(),
        Arc::clone(&telemetry.metrics),
        (config.flags.retry_base, config.flags.retry_max),
    );
    let ctx = Arc::new(Context {
        sets: sets.clone(),
        advanced: Arc::clone(&advanced_sets),
        recorder: Recorder::new(client.clone(), reporter),
        stateful_pods,
        drain_pods,
        claims,
        recent,
        drain_pod_index,
        claim_index,
        config,
        failures: Mutex::default(),
        unconfirmed: Mutex::default(),
        withdrawing: Mutex::default(),
        taken: Mutex::default(),
        status,
        dry_run_reported: Mutex::default(),
        retained: Arc::default(),
        metrics: telemetry.metrics,
        ready,
        client,
    });

    let (to_sets, set_triggers) = mpsc::unbounded_channel();
    let (to_advanced, advanced_triggers) = mpsc::unbounded_channel();
    let routes = Routes {
        sets: sets.clone(),
        to_sets,
        advanced: advanced_sets,
        to_advanced,
        in_flight: ctx.drain_pod_index.clone(),
    };
    let secondary = tokio::spawn({
        let routes = routes.clone();
        async move {
            futures::join!(
                drive(sp_stream, routes.clone(), Routes::stateful_pod),
                drive(dp_stream, routes.clone(), Routes::drain_pod),
                drive(claim_stream, routes, Routes::claim),
            );
        }
    });
    let forgetter = tokio::spawn({
        let ctx = Arc::clone(&ctx);
        async move {
            while gone_rx.recv().await.is_some() {
                while gone_rx.try_recv().is_ok() {}
                ctx.forget_gone_sets();
            }
        }
    });
    let sweeper = tokio::spawn(retain::sweep(
        ctx.client.clone(),
        ctx.config.leadership.clone(),
        ctx.config.namespace.clone(),
        Arc::clone(&ctx.retained),
        FIELD_MANAGER,
    ));
    let nudger = tokio::spawn(tell_kruise(
        Arc::clone(&ctx),
        Arc::clone(&routes.advanced),
        released_rx,
    ));
    let shutdown = shutdown.shared();
    let builtin = serve(
        Arc::clone(&ctx),
        sets,
        set_stream,
        set_triggers,
        shutdown.clone(),
    );
    let advanced = {
        let ctx = Arc::clone(&ctx);
        let stop = shutdown.clone();
        let every = ctx.config.advanced_discovery;
        async move {
            let found = async {
                wait_for_advanced(&ctx.client, every).await;
                true
            };
            let found = tokio::select! {
                f = found => f,
                () = stop.clone() => false,
            };
            if !found {
                return Stopped::Clean;
            }
            let ns = ctx.config.namespace.clone();
            let (sets, stream, _) = set_watch::<AdvancedStatefulSet>(
                &ctx.client,
                ns.as_deref(),
                ctx.drain_pod_index.clone(),
                gone_tx,
            );
            let _ = routes.advanced.set(sets.clone());
            serve(Arc::clone(&ctx), sets, stream, advanced_triggers, stop).await
        }
    };
    let stopped = match futures::join!(builtin, advanced) {
        (Stopped::Clean, Stopped::Clean) => Stopped::Clean,
        _ => Stopped::DroppedReconciles,
    };
    nudger.abort();
    sweeper.abort();
    forgetter.abort();
    secondary.abort();
    gate.abort();
    info!("controller stopped");
    Ok(stopped)
}

fn set_reference(kind: SetKind, set: &StatefulSet) -> ObjectReference {
    ObjectReference {
        api_version: Some(kind.api_version().to_owned()),
        kind: Some("StatefulSet".to_owned()),
        name: set.metadata.name.clone(),
        namespace: set.metadata.namespace.clone(),
        uid: set.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

/// The real cluster seam: one namespace, events on one set of kind `K`.
struct KubeCluster<'a, K> {
    sets: Api<K>,
    /// The sets of the other kind, when that kind is served: one of the same name blocks
    /// every drain (their pods and claims share names).
    twin: Option<Twin>,
    pods: Api<Pod>,
    claims: Api<PersistentVolumeClaim>,
    recorder: &'a Recorder,
    /// Where our writes of drain pods and claims are kept until their watches deliver them.
    recent: &'a Recents,
    set: ObjectReference,
    metrics: &'a Metrics,
    leadership: &'a Leadership,
    /// The live reads that confirm a drain pod's create (the set; whether a set of the other
    /// kind has its name), made once per act phase, alongside the first create or before it: a
    /// scale-down by several ordinals creates their drain pods at once, and one read serves them
    /// all (a failed read is not kept).
    live: tokio::sync::OnceCell<(Option<K>, bool)>,
    /// The sets whose last live read did not confirm a drain pod ([`Context`]'s).
    unconfirmed: &'a Mutex<std::collections::HashSet<SetId>>,
    /// Drain pods whose withdrawal failed ([`Context`]'s).
    withdrawing: &'a Mutex<HashMap<SetId, BTreeMap<String, String>>>,
    /// Pods by hand holding a name ([`Context`]'s).
    taken: &'a Taken,
    /// The volumes, for retention (cluster-scoped).
    volumes: Api<PersistentVolume>,
    /// Wakes the sweep of retained volumes ([`Context`]'s).
    retained: &'a tokio::sync::Notify,
    /// This set's key in all three.
    id: SetId,
}

fn ok_if_gone(r: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match r {
        // 404: gone already; 409: the UID precondition failed, so the object we meant is gone.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        other => other,
    }
}

/// Whether a failed write means the object we meant is gone or replaced: 404, 409 (UID
/// precondition), or 422 rejecting the `metadata.uid` sent in a patch (immutable field: the
/// object under that name has another UID). Any other 422 stays an error.
fn gone_or_replaced(e: &kube::Error) -> bool {
    let kube::Error::Api(s) = e else {
        return false;
    };
    match s.code {
        404 | 409 => true,
        422 => uid_rejected(s),
        _ => false,
    }
}

/// Whether an Invalid (422) status is about `metadata.uid`: by its causes, or by its message
/// when it has none ("... is invalid: metadata.uid: Invalid value: ...: field is immutable").
fn uid_rejected(s: &kube::core::Status) -> bool {
    s.details
        .iter()
        .flat_map(|d| &d.causes)
        .any(|c| c.field == "metadata.uid")
        || s.message.contains("metadata.uid")
}

fn preconditioned(uid: &str, resource_version: Option<&str>) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: resource_version.map(str::to_owned),
        }),
        ..DeleteParams::background()
    }
}

/// Deletes the pod `name` if it still has this UID (and resourceVersion, when given), and notes
/// a delete the API server accepted in `recent` ([`recent::Deleted`]).
async fn delete_pod(
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
    async fn read_orphaned(&self, ordinal: i32) -> Result<bool, kube::Error> {
        let name = self.set.name.clone().unwrap_or_default();
        let (set, twin) = self
            .live
            .get_or_try_init(|| async {
                // Both reads at once, alongside (or before) the drain pod's create.
                let (result, twin) = futures::join!(self.sets.get_opt(&name), async {
                    match &self.twin {
                        Some(twin) => twin.exists(&name, self.metrics).await,
                        None => Ok(false),
                    }
                });
                self.metrics.request("get", "statefulsets", &result);
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
        self.leadership.is_leading()
    }

    fn confirm_first(&self) -> bool {
        self.unconfirmed.lock().expect("lock").contains(&self.id)
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
        self.taken
            .lock()
            .expect("lock")
            .entry(self.id.clone())
            .or_default()
            .insert(ordinal, uid);
    }

    fn withdraw_later(&self, name: &str, uid: &str) {
        self.withdrawing
            .lock()
            .expect("lock")
            .entry(self.id.clone())
            .or_default()
            .insert(uid.to_owned(), name.to_owned());
    }

    async fn create_pod(&self, pod: &Pod) -> Result<Created, kube::Error> {
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let result = self.pods.create(&pp, pod).await;
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
        let result = self.claims.delete(name, &preconditioned(uid, None)).await;
        self.metrics
            .request("delete", "persistentvolumeclaims", &result);
        ok_if_gone(result.map(|_| ()))
    }

    async fn annotate_claim(
        &self,
        name: &str,
        uid: &str,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> Result<Patched, kube::Error> {
        // The UID in the patch is a precondition: a claim recreated under the name is left alone.
        let patch = json!({"metadata": {"uid": uid, "annotations": annotations}});
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let result = self.claims.patch(name, &pp, &Patch::Merge(patch)).await;
        self.metrics
            .request("patch", "persistentvolumeclaims", &result);
        match result {
            Ok(patched) => {
                let m = &patched.metadata;
                self.recent.claims.wrote(
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
        let mut unconfirmed = self.unconfirmed.lock().expect("lock");
        if matches!(answer, Ok(true)) {
            unconfirmed.remove(&self.id);
        } else {
            unconfirmed.insert(self.id.clone());
        }
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
            self.recorder,
            &reference,
            event.severity,
            event.reason,
            event.note.clone(),
            event.ordinal,
        );
    }
}

/// Publishes an Event in the background: reporting never delays the drain actions of the
/// reconcile (each Event is one or two API calls); a failure is only logged.
fn publish(
    recorder: &Recorder,
    reference: &ObjectReference,
    severity: Severity,
    reason: &str,
    note: String,
    ordinal: Option<i32>,
) {
    let ev = Event {
        type_: match severity {
            Severity::Normal => EventType::Normal,
            Severity::Warning => EventType::Warning,
        },
        reason: reason.to_owned(),
        note: Some(note.chars().take(1000).collect()),
        // Part of the recorder's key for folding Events into series (the note is not).
        action: ordinal.map_or_else(|| "Drain".to_owned(), |o| format!("Drain-ordinal-{o}")),
        secondary: None,
    };
    let (recorder, reference) = (recorder.clone(), reference.clone());
    tokio::spawn(async move {
        if let Err(e) = recorder.publish(&ev, &reference).await {
            warn!(error = %e, reason = %ev.reason, "failed to publish event");
        }
    });
}

/// Patches the status annotation of a set (`None`: removes it), with the set's UID as a
/// precondition: `Ok(None)` when the set is gone or was replaced.
fn status_patcher(client: Client, metrics: Arc<Metrics>) -> Patcher {
    Arc::new(move |target: Target, status: Option<String>| {
        let (client, metrics) = (client.clone(), Arc::clone(&metrics));
        Box::pin(async move {
            let patch = Patch::Merge(json!({"metadata": {
                "uid": target.uid,
                "annotations": {annotations::STATUS: status},
            }}));
            let pp = PatchParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            };
            let result = match target.kind {
                SetKind::StatefulSet => Api::<StatefulSet>::namespaced(client, &target.namespace)
                    .patch(&target.name, &pp, &patch)
                    .await
                    .map(|s| s.to_statefulset()),
                SetKind::Advanced => {
                    Api::<AdvancedStatefulSet>::namespaced(client, &target.namespace)
                        .patch(&target.name, &pp, &patch)
                        .await
                        .map(|s| s.to_statefulset())
                }
            };
            metrics.request("patch", "statefulsets", &result);
            match result {
                Ok(patched) => Ok(Some(patched)),
                Err(e) if gone_or_replaced(&e) => Ok(None),
                Err(e) => Err(e),
            }
        })
    })
}

/// The status annotation `report` renders to (`None`: nothing to report).
fn rendered(report: &StatusReport) -> Option<String> {
    (report != &StatusReport::default()).then(|| report.render())
}

/// The errors of the set's last report on the ordinals `actions` act on again: kept in the
/// status written alongside the actions, so an action that keeps failing does not clear and
/// re-add its error on every try (errors of ordinals with no action left are cleared).
fn errors_kept(set: &StatefulSet, actions: &[plan::Action]) -> BTreeMap<i32, String> {
    let Some(last) = set
        .annotations()
        .get(annotations::STATUS)
        .and_then(|s| StatusReport::parse(s))
    else {
        return BTreeMap::new();
    };
    last.errors
        .into_iter()
        .filter_map(|(o, e)| Some((o.parse::<i32>().ok()?, e)))
        .filter(|(o, _)| actions.iter().any(|a| a.ordinal() == *o))
        .collect()
}

/// A claim's cached entry, or our last write of it if that is newer than the cached entry and
/// of the same claim (not one recreated under the name).
fn newest_claim(cached: ClaimEntry, ours: Option<ClaimEntry>) -> ClaimEntry {
    ours.filter(|o| o.uid == cached.uid).unwrap_or(cached)
}

/// The cached drain pods of set `set`, with the ones we created (`created`: name, version,
/// pod) that the watch has not delivered yet: added, or in place of an older cached pod of that
/// name (a gone one: ours could be created under its name).
fn with_created(
    mut cached: Vec<Arc<Pod>>,
    created: Vec<(String, u64, Pod)>,
    set: &str,
) -> Vec<Arc<Pod>> {
    for (name, version, pod) in created {
        if pod.labels().get(labels::DRAIN_POD).map(String::as_str) != Some(set) {
            continue;
        }
        match cached
            .iter()
            .position(|p| p.metadata.name.as_deref() == Some(&name))
        {
            Some(i) if version_of(&cached[i].metadata) < version => cached[i] = Arc::new(pod),
            Some(_) => {}
            None => cached.push(Arc::new(pod)),
        }
    }
    cached
}

/// Marks the drain pods we deleted, or failed to withdraw and will delete, as terminating,
/// whatever the cache still shows of them ([`recent::Deleted`]): only the flag, never a
/// deletion time.
fn mark_deleted(pods: &mut [plan::PodObs], deleted: impl Fn(&str) -> bool) {
    for pod in pods {
        if matches!(pod.kind, plan::PodKind::Drain(_)) && deleted(&pod.uid) {
            pod.terminating = true;
        }
    }
}

/// Deletes the drain pods of this set whose withdrawal failed before
/// ([`Cluster::withdraw_later`]), with their UIDs as precondition; one that is gone already, or
/// replaced, is done with too. A failure keeps it for the next reconcile. Returns whether some
/// are left.
async fn retry_withdrawals(ctx: &Context, id: SetId) -> bool {
    let pending = ctx
        .withdrawing
        .lock()
        .expect("lock")
        .get(&id)
        .cloned()
        .unwrap_or_default();
    if pending.is_empty() {
        return false;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &id.1);
    for (uid, name) in pending {
        let done = match delete_pod(&pods, &ctx.metrics, &ctx.recent, &name, &uid, None).await {
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
            let mut withdrawing = ctx.withdrawing.lock().expect("lock");
            if let Some(set) = withdrawing.get_mut(&id) {
                set.remove(&uid);
                if set.is_empty() {
                    withdrawing.remove(&id);
                }
            }
        }
    }
    ctx.withdrawing.lock().expect("lock").contains_key(&id)
}

/// Reads one set's snapshot from the caches, through the per-set indexes.
fn observe_set(
    ctx: &Context,
    kind: SetKind,
    set: &StatefulSet,
    only_in_flight: bool,
) -> plan::Snapshot {
    let name = set.name_any();
    let ns = set.namespace().unwrap_or_default();
    // Each read is at least as new as our own last write of the object (`crate::recent`).
    let claims: Vec<_> = ctx
        .claim_index
        .names(&ns, &name)
        .iter()
        .filter_map(|c| {
            let (cached, version) = ctx.claims.get_versioned(&ns, c)?;
            let entry = newest_claim(cached, ctx.recent.claims.newer_than(&ns, c, version));
            Some(entry.meta(&ns, c))
        })
        .collect();
    let drain_pods = with_created(
        ctx.drain_pod_index
            .names(&ns, &name)
            .iter()
            .filter_map(|p| ctx.drain_pods.get(&ObjectRef::new(p).within(&ns)))
            .collect(),
        ctx.recent.pods.in_namespace(&ns),
        &name,
    );
    let templates = observe::claim_templates(set);
    let others: Vec<_> = claims
        .iter()
        .filter_map(|c| observe::parse_claim_name(c.name.as_deref()?, &name, &templates))
        .map(|(_, o)| o)
        .collect::<std::collections::BTreeSet<i32>>()
        .iter()
        .filter_map(|o| {
            let pod = names::pod_name(&name, *o);
            Some(ctx.stateful_pods.get(&ns, &pod)?.meta(&ns, &pod))
        })
        .collect();
    let mut snap = observe::snapshot(
        set,
        claims.iter(),
        drain_pods.iter().map(|p| p.as_ref()),
        others.iter(),
    );
    let withdrawing: std::collections::BTreeSet<String> = ctx
        .withdrawing
        .lock()
        .expect("lock")
        .get(&set_id(kind, set))
        .map(|w| w.keys().cloned().collect())
        .unwrap_or_default();
    mark_deleted(&mut snap.pods, |uid| {
        ctx.recent.deleted_pods.contains(uid) || withdrawing.contains(uid)
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

/// Pods made neither by a set nor by us that hold one of its pod names, by set: ordinal → UID.
type Taken = Mutex<HashMap<SetId, BTreeMap<i32, String>>>;

/// Reads again, live, each pod remembered as holding one of the set's names without being the
/// set's or ours ([`Cluster::name_taken`]): while it is there (same UID), the planner sees it as
/// [`plan::PodKind::Unknown`]; once it is gone, replaced, or a cached pod holds the ordinal, it
/// is forgotten. Such pods are in no cache, so this read is what notices their deletion (the
/// planner requeues blocked ordinals every [`plan::RECHECK_UNKNOWN_POD`]).
async fn recheck_taken(ctx: &Context, id: SetId, ns: &str, snap: &mut plan::Snapshot) {
    let remembered = ctx.taken.lock().expect("lock").get(&id).cloned();
    let Some(remembered) = remembered else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
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
        let result = pods.get_opt(&name).await;
        ctx.metrics.request("get", "pods", &result);
        match result {
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
        let mut taken = ctx.taken.lock().expect("lock");
        if let Some(set) = taken.get_mut(&id) {
            set.retain(|o, _| !gone.contains(o));
            if set.is_empty() {
                taken.remove(&id);
            }
        }
    }
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
async fn reconcile<K: ServedSet>(obj: Arc<K>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let kind = K::KIND;
    let set = Arc::new(obj.to_statefulset());
    let name = set.name_any();
    let ns = set.namespace().unwrap_or_default();
    let span = info_span!("reconcile", statefulset = %name, namespace = %ns, kind = kind.label());
    async move {
        if set.metadata.deletion_timestamp.is_some() {
            // Being deleted: drain pods go with the set (garbage collector), claims stay.
            debug!("statefulset is being deleted; leaving it alone");
            ctx.status.forget(&set);
            return Ok(Requeue::await_change());
        }
        if !ctx.config.leadership.is_leading() {
            // A standby: the leader acts; becoming the leader reconciles every set.
            debug!("not the leader; standing by");
            return Ok(Requeue::await_change());
        }
        // Read our own last status write even if the cache has not seen it yet.
        let set = match ctx.status.overlay(&set) {
            Some(fresher) => Arc::new(fresher),
            None => set,
        };
        ctx.wait_ready().await?;
        // Before anything that may end the reconcile early (a name clash among them).
        let withdrawals_left = retry_withdrawals(&ctx, set_id(kind, &set)).await;
        let set_ref = set_reference(kind, &set);
        let opted_in = opted_in(&set);
        if let Some(twin) = ctx.twin_cached(K::KIND, &ns, &name) {
            // Pods and claims named `<name>-<ordinal>` could be either set's: none is drained.
            let note = format!("a {} named {name} exists in this namespace too: their pods and claims have the same names, so neither is drained until one is renamed or deleted", twin.label());
            warn!(twin = twin.label(), "name shared with a set of the other kind; nothing is drained");
            publish(&ctx.recorder, &set_ref, Severity::Warning, "NameClash", note, None);
            return Ok(Requeue::requeue(Duration::from_secs(30).min(ctx.config.resync)));
        }
        let range = match obj.ordinals() {
            Ok(range) => range,
            Err(e) => {
                // Which ordinals the set runs is unknown: nothing is planned, nothing deleted.
                warn!(error = %e, "unreadable reserveOrdinals; nothing is drained until the set changes");
                publish(&ctx.recorder, &set_ref, Severity::Warning, "InvalidReserveOrdinals", format!("{e}; nothing is drained or deleted until this is fixed"), None);
                return Ok(Requeue::await_change());
            }
        };

        // validate
        let validated = opted_in.then(|| {
            validate::validate(&set).map(|mut v| {
                v.template.set_owner_api_version(kind.api_version());
                v
            })
        });
        let problems = match &validated {
            Some(Err(problems)) => problems.clone(),
            _ => Vec::new(),
        };
        for p in &problems {
            warn!(reason = p.reason, message = %p.message, "invalid drain settings; no new drain until the set changes");
            publish(&ctx.recorder, &set_ref, Severity::Warning, p.reason, format!("{}; no new drain starts until this is fixed", p.message), None);
        }
        let problem = (!problems.is_empty())
            .then(|| problems.iter().map(|p| p.message.as_str()).collect::<Vec<_>>().join("; "));
        let valid = match &validated {
            Some(Ok(v)) => Ok(v),
            Some(Err(_)) => Err("the drain settings are invalid (see problem)"),
            None => Err("the set opted out of draining"),
        };
        let settings = validate::settings(&set, valid, &ctx.config.flags, obj.default_max_concurrent());

        // observe
        let mut snap = observe_set(&ctx, kind, &set, !opted_in);
        recheck_taken(&ctx, set_id(kind, &set), &ns, &mut snap).await;
        snap.reserved = range.reserved;
        snap.also_held = obj.start_fallback();

        // plan
        let now = Timestamp::now();
        let plan = plan::plan(&snap, &settings, now);
        if !plan.actions.is_empty() && !ctx.config.dry_run {
            info!(actions = ?plan.actions, "acting");
            debug!(pods = ?snap.pods, claims = ?snap.claims, "observed");
        }

        // act
        let cluster = KubeCluster {
            sets: Api::<K>::namespaced(ctx.client.clone(), &ns),
            twin: ctx.twin_api(K::KIND, &ns),
            pods: Api::namespaced(ctx.client.clone(), &ns),
            claims: Api::namespaced(ctx.client.clone(), &ns),
            recorder: &ctx.recorder,
            recent: &ctx.recent,
            set: set_ref.clone(),
            metrics: &ctx.metrics,
            leadership: &ctx.config.leadership,
            live: tokio::sync::OnceCell::new(),
            unconfirmed: &ctx.unconfirmed,
            withdrawing: &ctx.withdrawing,
            taken: &ctx.taken,
            volumes: Api::all(ctx.client.clone()),
            retained: &ctx.retained,
            id: set_id(kind, &set),
        };
        let act_ctx = ActCtx {
            set_name: &name,
            replicas: snap.replicas,
            template: valid.ok().map(|v| &v.template),
            now,
        };
        if ctx.config.dry_run {
            return dry_run::<K>(&ctx, &set, &set_ref, &act_ctx, &plan, problem).await;
        }
        // The status is handed to the writer before the actions, and written in the background
        // (`status_writer`): a reconcile holds up the next one of its set (pods that go
        // meanwhile wait), so it lasts only as long as its actions. It says what the plan
        // expects, keeping the last errors of the ordinals acted on again; if an action fails,
        // the errors are handed in once the actions are done.
        let expected = StatusReport::of(&plan.status, problem.clone(), &errors_kept(&set, &plan.actions));
        ctx.status.submit(K::KIND, &set, rendered(&expected));
        let failed = act::apply(&cluster, &act_ctx, &plan.actions).await;
        if failed.iter().any(|(_, e)| matches!(e, ActError::NotLeader)) {
            // Lost the lease mid-reconcile: the new leader plans afresh and reports.
            return Ok(Requeue::await_change());
        }
        // Not a failure: nothing new can be created in a namespace being deleted, and it takes
        // the set and its claims along. No retry, and no Warning (no Event can be created in it
        // either); the other ordinals' outcomes are reported as usual.
        let (terminating, failed): (Vec<_>, Vec<_>) =
            failed.into_iter().partition(|(_, e)| e.namespace_terminating());
        if !terminating.is_empty() {
            info!(ordinals = ?terminating.iter().map(|(o, _)| *o).collect::<Vec<_>>(), "the namespace is being deleted: no drain pod can be created in it, and its claims go with it");
        }
        let mut errors: BTreeMap<i32, String> = BTreeMap::new();
        for (ordinal, e) in &failed {
            error!(ordinal, error = %e.describe(), "action failed; retrying with backoff");
            publish(&ctx.recorder, &set_ref, Severity::Warning, e.reason(), e.describe(), Some(*ordinal));
            errors.entry(*ordinal).or_insert_with(|| e.describe());
        }
        // Not carried out, so not counted: the failed ordinals and those refused for the namespace.
        let failed_ordinals = errors.keys().chain(terminating.iter().map(|(o, _)| o)).copied().collect();
        ctx.metrics.record_reconcile(&ns, &name, &plan, &snap, &failed_ordinals);

        // report: only if the outcome differs from what was handed in before the actions
        let outcome = StatusReport::of(&plan.status, problem, &errors);
        if outcome != expected {
            ctx.status.submit(K::KIND, &set, rendered(&outcome));
        }
        if let Some((_, first)) = failed.into_iter().next() {
            return Err(Error::Act { count: errors.len(), first });
        }
        ctx.failures.lock().expect("failures lock").remove(&set_id(kind, &set));
        ctx.metrics.reconciles.get_or_create(&crate::metrics::ResultLabels { result: "ok".into() }).inc();
        ctx.forget_if_gone(kind, &ns, &name);
        if !terminating.is_empty() {
            return Ok(Requeue::await_change());
        }
        let mut requeue = plan.requeue_after.unwrap_or(ctx.config.resync).min(ctx.config.resync);
        if withdrawals_left {
            requeue = requeue.min(Duration::from_secs(2));
        }
        // A create just found a name held by a pod nobody here made: plan again at once, with
        // that pod seen, so the slot it was given goes to another ordinal.
        let newly_taken = ctx.taken.lock().expect("lock").get(&set_id(kind, &set)).is_some_and(|t| {
            t.keys().any(|o| !snap.pods.iter().any(|p| p.ordinal == *o && p.kind == plan::PodKind::Unknown))
        });
        if newly_taken {
            requeue = requeue.min(Duration::from_millis(100));
        }
        Ok(Requeue::requeue(requeue))
    }
    .instrument(span)
    .await
}

/// Under `--dry-run`, instead of acting: logs and reports (once per change of the plan) what
/// each action would do, and writes the status marked `dryRun`.
async fn dry_run<K: ServedSet>(
    ctx: &Context,
    set: &StatefulSet,
    set_ref: &ObjectReference,
    act_ctx: &ActCtx<'_>,
    plan: &plan::Plan,
    problem: Option<String>,
) -> Result<Requeue, Error> {
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
        .dry_run_reported
        .lock()
        .expect("dry-run lock")
        .insert(key, fingerprint)
        != Some(fingerprint);
    if changed {
        for e in &events {
            info!(reason = e.reason, note = %e.note, "dry run");
            publish(
                &ctx.recorder,
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
    ctx.status.submit(K::KIND, set, rendered(&status));
    Ok(Requeue::requeue(
        plan.requeue_after
            .unwrap_or(ctx.config.resync)
            .min(ctx.config.resync),
    ))
}

/// Retries a failed reconcile with exponential backoff per set (1 s doubling, at most 5 min).
fn error_policy<K: ServedSet>(set: Arc<K>, err: &Error, ctx: Arc<Context>) -> Requeue {
    let (ns, name) = (set.namespace().unwrap_or_default(), set.name_any());
    let delay = {
        let mut failures = ctx.failures.lock().expect("failures lock");
        let key = (K::KIND, ns.clone(), name.clone());
        let (now, delay) = next_failure(failures.get(&key).copied(), std::time::Instant::now());
        failures.insert(key, now);
        delay
    };
    ctx.forget_if_gone(K::KIND, &ns, &name);
    ctx.metrics
        .reconciles
        .get_or_create(&crate::metrics::ResultLabels {
            result: "error".into(),
        })
        .inc();
    ctx.metrics
        .reconcile_errors
        .get_or_create(&crate::metrics::ReasonLabels {
            reason: err.reason().to_owned(),
        })
        .inc();
    warn!(statefulset = %set.name_any(), reason = err.reason(), error = %err, ?delay, "reconcile failed");
    Requeue::requeue(delay)
}

/// A set's failed reconciles in a row, and when the retry the last one scheduled is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failures {
    /// Failures counted toward the backoff.
    count: u32,
    /// When the scheduled retry is due.
    retry_at: std::time::Instant,
}

/// The count and the delay after a reconcile failed at `now`: the backoff (1 s doubling to
/// 5 min) grows only with failures of retries that were due, not with failures of reconciles
/// that watch events brought in between, which keep the retry already scheduled. Otherwise a
/// burst of events during one denial (a drain pod's status changes, the other ordinals) would
/// push the next retry minutes past the denial's end.
fn next_failure(last: Option<Failures>, now: std::time::Instant) -> (Failures, Duration) {
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

#[cfg(test)]
mod tests;
