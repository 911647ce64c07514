//! The watches the controller runs: the sets of each kind, the drain pods, the stateful pods
//! and the claims; what a change of each is fingerprinted by; which sets
//! it is routed to ([`Routes`]); and the readiness gate that waits for their caches.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use drain_api::{annotations, labels};
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, future};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::mpsc;
use tracing::{debug, info};

use super::api::api;
use super::expectations::Expectations;
use super::kinds::Released;

use crate::runtime::caches::{Cache, ClaimEntry, PodEntry};
use crate::runtime::metrics::Metrics;
use crate::runtime::watch;
use crate::runtime::watch::{Filter, Index, SetKey};
use crate::set_kind::{AdvancedStatefulSet, CachedStatefulSet, ServedSet, SetKind};
use crate::{observe, plan, set_kind};

/// What readiness waits for: the built-in StatefulSets listed (their cache is the
/// controller's own), and the caches of the secondary watches.
#[derive(Clone)]
pub(super) struct Synced {
    pub(super) sets_listed: tokio::sync::watch::Receiver<bool>,
    pub(super) stateful_pods: Cache<PodEntry>,
    pub(super) drain_pods: Store<Pod>,
    pub(super) claims: Cache<ClaimEntry>,
}

/// Flips `ready` once the built-in StatefulSets are listed (seen through their watch's events:
/// `Store::wait_until_ready` wakes one waiter only, and the controller waits on that store) and
/// every secondary cache synced; Advanced StatefulSets do not hold it. `scope`: for the log.
pub(super) async fn gate_readiness(
    caches: Synced,
    scope: Option<String>,
    ready: tokio::sync::watch::Sender<bool>,
) {
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
            .map(|r| r.map_err(drop)),
        caches
            .drain_pods
            .wait_until_ready()
            .map(|r| r.map_err(drop)),
        caches.claims.wait_until_ready().map(|r| r.map_err(drop)),
    );
    if synced.is_ok() {
        info!(
            namespace = scope.as_deref().unwrap_or("(all)"),
            "watch caches synced"
        );
        let _ = ready.send(true);
    }
}

/// Flips `ready` (the process's readiness, `/readyz`) once every scope's readiness is `true`:
/// the controller is ready only when it watches every namespace it was given. Never if a
/// scope's readiness is dropped before.
pub(super) async fn ready_when_all(
    scopes: Vec<tokio::sync::watch::Receiver<bool>>,
    ready: tokio::sync::watch::Sender<bool>,
) {
    let each = scopes
        .into_iter()
        .map(|mut scope| async move { scope.wait_for(|r| *r).await.map(drop).map_err(drop) });
    if futures::future::try_join_all(each).await.is_ok() {
        let _ = ready.send(true);
    }
}

/// What of a set can change a decision: not its status, nor the annotations we write.
pub(super) fn set_fingerprint<K: Resource>(set: &K) -> u64 {
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
pub(super) fn drain_pod_fingerprint(pod: &Pod) -> u64 {
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

pub(super) fn drain_pod_sets(pod: &Pod) -> Vec<SetKey> {
    let ns = pod.namespace().unwrap_or_default();
    pod.labels()
        .get(labels::DRAIN_POD)
        .map(|set| vec![(ns, set.clone())])
        .unwrap_or_default()
}

pub(super) fn slim_drain_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
}

/// The set `name` in `ns`, if it is cached and (unless `any`) opted in.
fn cached_ref<K: ServedSet>(
    sets: &Store<K>,
    name: &str,
    ns: &str,
    any: bool,
) -> Option<ObjectRef<K>> {
    let r = ObjectRef::new(name).within(ns);
    (sets.get(&r))
        .filter(|s| any || set_kind::opted_in(s.meta()))
        .map(|_| r)
}

/// The sets of either kind that changes of pods and claims are routed to: each kind's cache of
/// sets (the Advanced StatefulSet one once that kind is served) and its controller's trigger.
#[derive(Clone)]
pub(super) struct Routes {
    pub(super) sets: Store<CachedStatefulSet>,
    pub(super) to_sets: mpsc::UnboundedSender<ObjectRef<CachedStatefulSet>>,
    pub(super) advanced: Arc<OnceLock<Store<AdvancedStatefulSet>>>,
    pub(super) to_advanced: mpsc::UnboundedSender<ObjectRef<AdvancedStatefulSet>>,
    /// Drain pods by set: a set that opted out with a drain in flight still hears of its
    /// claims (an approval given while it waits).
    pub(super) in_flight: Index,
}

impl Routes {
    /// Routes to the controllers of both kinds of set: the routes, and the controllers' ends of
    /// their trigger channels.
    pub(super) fn new(
        sets: Store<CachedStatefulSet>,
        advanced: Arc<OnceLock<Store<AdvancedStatefulSet>>>,
        in_flight: Index,
    ) -> (
        Self,
        mpsc::UnboundedReceiver<ObjectRef<CachedStatefulSet>>,
        mpsc::UnboundedReceiver<ObjectRef<AdvancedStatefulSet>>,
    ) {
        let (to_sets, set_triggers) = mpsc::unbounded_channel();
        let (to_advanced, advanced_triggers) = mpsc::unbounded_channel();
        let routes = Self {
            sets,
            to_sets,
            advanced,
            to_advanced,
            in_flight,
        };
        (routes, set_triggers, advanced_triggers)
    }

    /// Triggers the opted-in set that controls a stateful pod (by its controller reference).
    pub(super) fn stateful_pod(&self, pod: &PartialObjectMeta<Pod>) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let owners = pod.metadata.owner_references.iter().flatten();
        for o in owners.filter(|o| o.kind == "StatefulSet" && o.controller == Some(true)) {
            match SetKind::of_api_version(&o.api_version) {
                Some(SetKind::StatefulSet) => {
                    if let Some(r) = cached_ref(&self.sets, &o.name, &ns, false) {
                        debug!(pod = ?pod.metadata.name, statefulset = %o.name, "stateful pod changed: its set triggered");
                        let _ = self.to_sets.send(r);
                    }
                }
                Some(SetKind::Advanced) => {
                    if let Some(r) = self
                        .advanced
                        .get()
                        .and_then(|s| cached_ref(s, &o.name, &ns, false))
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
    pub(super) fn drain_pod(&self, pod: &Pod) {
        let ns = pod.namespace().unwrap_or_default();
        let Some(set) = pod.labels().get(labels::DRAIN_POD) else {
            return;
        };
        debug!(pod = ?pod.metadata.name, statefulset = %set, "drain pod changed: its set triggered");
        if let Some(r) = cached_ref(&self.sets, set, &ns, true) {
            let _ = self.to_sets.send(r);
        }
        if let Some(r) = self
            .advanced
            .get()
            .and_then(|s| cached_ref(s, set, &ns, true))
        {
            let _ = self.to_advanced.send(r);
        }
    }

    /// Triggers every set, of either kind, that a claim's name makes it a claim of, if the
    /// set opted in or has a drain in flight.
    pub(super) fn claim(&self, claim: &PartialObjectMeta<PersistentVolumeClaim>) {
        let ns = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        for set in observe::claim_set_candidates(&name) {
            let draining = !self.in_flight.names(&ns, set).is_empty();
            let builtin = claim_ref(&self.sets, &name, set, &ns, draining);
            let advanced =
                (self.advanced.get()).and_then(|s| claim_ref(s, &name, set, &ns, draining));
            if let Some(r) = builtin {
                let _ = self.to_sets.send(r);
            }
            if let Some(r) = advanced {
                let _ = self.to_advanced.send(r);
            }
        }
    }
}

/// The set `set` in `ns` that `claim` is a claim of, if it is cached and opted in or `draining`.
fn claim_ref<K: ServedSet>(
    sets: &Store<K>,
    claim: &str,
    set: &str,
    ns: &str,
    draining: bool,
) -> Option<ObjectRef<K>> {
    let r = cached_ref(sets, set, ns, draining)?;
    let found = sets.get(&r)?;
    observe::parse_claim_name(claim, set, &found.claim_templates()).map(|_| r)
}

/// The changes the secondary watches pass on: stateful pods, drain pods, claims.
pub(super) type Streams = (
    BoxStream<'static, Result<PartialObjectMeta<Pod>, watcher::Error>>,
    BoxStream<'static, Result<Pod, watcher::Error>>,
    BoxStream<'static, Result<PartialObjectMeta<PersistentVolumeClaim>, watcher::Error>>,
);

/// The secondary watches (of pods and claims), shared by the controllers of both kinds of set:
/// their caches and indexes, and their streams of changes to drive ([`drive_all`]).
pub(super) struct Secondary {
    pub(super) stateful_pods: Cache<PodEntry>,
    pub(super) drain_pods: Store<Pod>,
    pub(super) claims: Cache<ClaimEntry>,
    /// Our writes that the watches have not delivered yet.
    pub(super) recent: Arc<Expectations>,
    pub(super) drain_pod_index: Index,
}

impl Secondary {
    /// Starts the watches (they run once their streams are driven): the caches, the streams,
    /// and the drain pods released to OpenKruise that were deleted ([`tell_kruise`]).
    pub(super) fn watch(
        client: &Client,
        ns: Option<&str>,
        metrics: &Arc<Metrics>,
    ) -> (Self, Streams, mpsc::UnboundedReceiver<Released>) {
        let drain_pod_index = Index::default();
        let (released_tx, released) = mpsc::unbounded_channel();
        let (drain_pods, dp_writer) = reflector::store();
        let recent = Arc::new(Expectations::default());
        let (stateful_pods, claims) = (Cache::default(), Cache::default());
        let streams = (
            stateful_pod_watch(client, ns, &stateful_pods, Arc::clone(metrics)).boxed(),
            drain_pod_watch(
                client,
                ns,
                dp_writer,
                drain_pod_index.clone(),
                released_tx,
                Arc::clone(&recent),
            )
            .boxed(),
            claim_watch(client, ns, &claims).boxed(),
        );
        let secondary = Self {
            stateful_pods,
            drain_pods,
            claims,
            recent,
            drain_pod_index,
        };
        (secondary, streams, released)
    }

    /// What readiness waits for, with the sets' listing flag.
    pub(super) fn caches(&self, sets_listed: tokio::sync::watch::Receiver<bool>) -> Synced {
        Synced {
            sets_listed,
            stateful_pods: self.stateful_pods.clone(),
            drain_pods: self.drain_pods.clone(),
            claims: self.claims.clone(),
        }
    }
}

/// Drives the three secondary watches (stateful pods, drain pods, claims) until they end.
pub(super) async fn drive_all(routes: Routes, streams: Streams) {
    let (stateful_pods, drain_pods, claims) = streams;
    futures::join!(
        drive(stateful_pods, routes.clone(), Routes::stateful_pod),
        drive(drain_pods, routes.clone(), Routes::drain_pod),
        drive(claims, routes, Routes::claim),
    );
}

/// Drives a secondary watch, routing each change it passes on with `route`.
pub(super) async fn drive<K>(
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

/// Objects per page of the watches' lists (metadata: a pod's is about 4 KiB of JSON with its
/// managed fields). A page is decoded whole, so the page size, not the cluster, sets the peak
/// memory of a list: kube's default of 500 took the peak of a synced controller to 1.6x its
/// empty figure at 1,000 pods.
pub(super) const LIST_PAGE: u32 = 100;
/// Objects per page of the lists of sets (whole objects, larger).
const LIST_PAGE_SETS: u32 = 50;

/// A watch configuration listing in pages of `page`.
fn list_in_pages(page: u32) -> watcher::Config {
    watcher::Config::default().page_size(page)
}

/// What the watch of one kind of set shares with the rest of its scope.
pub(super) struct SetWatch {
    /// Drain pods by set: whether a set has drains in flight.
    pub(super) in_flight: Index,
    /// Told of each deletion and each (re)list (see [`Context::forget_gone_sets`]).
    pub(super) gone: mpsc::UnboundedSender<()>,
    /// Flipped once the sets are listed.
    pub(super) listed: tokio::sync::watch::Sender<bool>,
}

/// The watch of one kind of set: its cache (every set, slimmed: [`ServedSet::slim`]), the
/// stream of changes of the sets that concern us, and `shared.listed` flipped once the sets
/// have been listed. Each deletion and each (re)list, once in the cache, is told on `gone`.
pub(super) fn set_watch<K: ServedSet>(
    client: &Client,
    ns: Option<&str>,
    shared: SetWatch,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
) {
    let SetWatch {
        in_flight,
        gone,
        listed,
    } = shared;
    let (sets, writer) = reflector::store();
    let events = watcher(api::<K>(client, ns), list_in_pages(LIST_PAGE_SETS))
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
        });
    let stream = watch::changes(
        events,
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
        future::ready(set_kind::concerns_us(s.meta(), draining))
    });
    (sets, stream)
}

/// The watch of drain pods (label `DRAIN_POD`), slimmed, into `writer`'s store and `index`.
/// Each deleted drain pod that had been released to OpenKruise is told on `released`; each one
/// passed on outside a relist is marked seen in `recent` (a drain pod passed on is in the cache
/// and the index, except during a relist: kube's reflector applies a list only at its end).
pub(super) fn drain_pod_watch(
    client: &Client,
    ns: Option<&str>,
    writer: reflector::store::Writer<Pod>,
    index: Index,
    released: mpsc::UnboundedSender<Released>,
    recent: Arc<Expectations>,
) -> impl Stream<Item = Result<Pod, watcher::Error>> + Send + use<> {
    let relisting = Arc::new(AtomicBool::new(false));
    let events = watcher(
        api::<Pod>(client, ns),
        list_in_pages(LIST_PAGE).labels(labels::DRAIN_POD),
    )
    .default_backoff()
    .modify(slim_drain_pod)
    .inspect_ok(move |event| {
        if let watcher::Event::Delete(pod) = event
            && let Some(r) = Released::of(pod)
        {
            let _ = released.send(r);
        }
    })
    .reflect(writer)
    .inspect_ok({
        let relisting = Arc::clone(&relisting);
        move |event| match event {
            watcher::Event::Init => relisting.store(true, Ordering::Relaxed),
            watcher::Event::InitDone => relisting.store(false, Ordering::Relaxed),
            _ => {}
        }
    });
    let filter = Filter {
        fingerprint: drain_pod_fingerprint,
        sets: drain_pod_sets,
        index: Some(index),
    };
    watch::changes(events, filter).inspect_ok(move |pod: &Pod| {
        if !relisting.load(Ordering::Relaxed) {
            recent.pods.saw(pod.metadata.resource_version.as_deref());
        }
    })
}

/// The watch of stateful pods (label `STATEFUL_POD_NAME`), metadata only, into `cache`; each
/// deletion is told to the reaction-time histogram.
pub(super) fn stateful_pod_watch(
    client: &Client,
    ns: Option<&str>,
    cache: &Cache<PodEntry>,
    metrics: Arc<Metrics>,
) -> impl Stream<Item = Result<PartialObjectMeta<Pod>, watcher::Error>> + Send + use<> {
    let events = watcher(
        api::<PartialObjectMeta<Pod>>(client, ns),
        list_in_pages(LIST_PAGE).labels(labels::STATEFUL_POD_NAME),
    )
    .default_backoff()
    .inspect_ok(move |event| {
        if let watcher::Event::Delete(pod) = event {
            metrics.pod_gone(&pod.namespace().unwrap_or_default(), &pod.name_any());
        }
    });
    cache.changes(events)
}

/// The watch of claims, metadata only, into `cache` (and its index).
pub(super) fn claim_watch(
    client: &Client,
    ns: Option<&str>,
    cache: &Cache<ClaimEntry>,
) -> impl Stream<Item = Result<PartialObjectMeta<PersistentVolumeClaim>, watcher::Error>> + Send + use<>
{
    let events = watcher(
        api::<PartialObjectMeta<PersistentVolumeClaim>>(client, ns),
        list_in_pages(LIST_PAGE),
    )
    .default_backoff();
    cache.changes(events)
}
