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
use crate::plan::ClaimRef;
use crate::retain::{self, RetainError};
use crate::runtime::leader::Leadership;
use crate::runtime::meta_cache::{Cache, ClaimEntry, Indexed, PodEntry, version_of};
use crate::runtime::metrics::Metrics;
use crate::runtime::recent::{self, Recent};
use crate::runtime::status_writer::{Patcher, StatusWriter, Target};
use crate::runtime::watch::{self, Filter, Index, SetKey};
use crate::set_kind::{self, ADVANCED_API_VERSION, AdvancedStatefulSet, ServedSet, SetKind};
use crate::status::StatusReport;
use crate::validate::{self, Flags};
use crate::{observe, plan};

mod cluster;
mod kinds;
mod memory;
mod reconcile;

use cluster::*;
use kinds::*;
use memory::*;
use reconcile::*;

pub use crate::identity::FIELD_MANAGER;

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
    /// What is remembered per set between reconciles: backoff, unconfirmed creates, pending
    /// withdrawals, names taken by hand, dry-run reports ([`memory`]).
    memory: Memory,
    /// Writes the status in the background, and shows the status last wanted or written per set
    /// to reads from a cache that has not caught up yet.
    status: StatusWriter,
    /// The metrics.
    metrics: Arc<Metrics>,
    ready: tokio::sync::watch::Receiver<bool>,
    /// Wakes the sweep of retained volumes when one was marked ([`crate::runtime::sweep`]).
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

    /// Forgets what is kept per set (the set's [`memory`], the status memo, metric series) for
    /// the sets no longer in the caches: run when a set is deleted or the sets are relisted.
    /// Without it a deleted set's gauges show its last drains for ever, and a cluster where
    /// sets come and go piles up entries.
    fn forget_gone_sets(&self) {
        self.memory
            .forget_gone(|(kind, ns, name)| self.set_exists(Some(*kind), ns, name));
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

/// Our recent writes (see [`crate::runtime::recent`]).
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
        memory: Memory::default(),
        status,
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
    let sweeper = tokio::spawn(crate::runtime::sweep::sweep(
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

#[cfg(test)]
mod tests;
