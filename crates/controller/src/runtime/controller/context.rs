//! What the controllers share: their configuration and telemetry, the context every reconcile
//! reads ([`Context`]: the caches, what this replica remembers, the wiring), how a reconcile
//! fails ([`Error`]) and how the controller stopped ([`Stopped`]).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};

use super::kinds::Twin;
use super::memory::Memory;

use crate::act::ActError;
use crate::runtime::caches::{Cache, ClaimEntry, PodEntry};
use crate::runtime::leader::Leadership;
use crate::runtime::metrics::{Metrics, SetLabels};
use crate::runtime::status_memo::StatusMemo;
use crate::runtime::watch::Index;
use crate::set_kind::{self, AdvancedStatefulSet, CachedStatefulSet, SetKind};
use crate::validate::Flags;

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Watch and act in these namespaces only, each by a scope of its own (empty: all
    /// namespaces, one scope). Each name once: two scopes on one namespace would both act.
    pub namespaces: Vec<String>,
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
    /// Set to `true` once every watch cache of every scope synced (`/readyz`).
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
    /// The reconcile panicked (a bug), with the panic's message.
    #[error("the reconcile panicked: {0}")]
    Panicked(String),
    /// One or more actions failed (the first is the source).
    #[error("{count} action(s) failed")]
    Act {
        /// How many.
        count: usize,
        /// The first (boxed: an `ActError` is large, and this travels in every `Result`).
        #[source]
        first: Box<ActError>,
    },
}

impl Error {
    /// Stable category for Event reasons and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::CachesStopped => "CachesStopped",
            Self::Panicked(_) => "Panicked",
            Self::Act { first, .. } => first.reason(),
        }
    }
}

/// What every reconcile shares: what the watches keep ([`Caches`]), what this replica
/// remembers of its own doings ([`Remembered`]), and the wiring.
pub struct Context {
    pub(super) caches: Caches,
    pub(super) remembered: Remembered,
    pub(super) client: Client,
    pub(super) events: super::events::Events,
    pub(super) config: ControllerConfig,
    /// The namespace this context's scope watches (`None`: all namespaces). The caches hold
    /// this namespace only; what is shared with the other scopes (the metrics) is touched for
    /// it only.
    pub(super) scope: Option<String>,
    pub(super) metrics: Arc<Metrics>,
    /// Wakes the sweep of retained volumes when one was marked ([`crate::runtime::sweep`]).
    pub(super) retained: Arc<tokio::sync::Notify>,
}

/// What the watches keep of this scope: the objects, the drain pods' index by set, and whether
/// they synced.
pub(super) struct Caches {
    pub(super) stateful_pods: Cache<PodEntry>,
    pub(super) drain_pods: Store<Pod>,
    pub(super) claims: Cache<ClaimEntry>,
    pub(super) drain_pod_index: Index,
    /// Every built-in StatefulSet, slimmed (kube-runtime's controller reads it too).
    pub(super) sets: Store<CachedStatefulSet>,
    /// The Advanced StatefulSets' cache, once that kind is served.
    pub(super) advanced: Arc<OnceLock<Store<AdvancedStatefulSet>>>,
    /// Whether this scope's watch caches synced.
    pub(super) ready: tokio::sync::watch::Receiver<bool>,
}

/// What this replica remembers of its own writes and their outcomes, none of it the cluster's
/// state: a restarted controller starts without it.
#[derive(Default)]
pub(super) struct Remembered {
    /// Our writes of drain pods and claims that their watches have not delivered yet.
    pub(super) recent: Arc<super::expectations::Expectations>,
    /// Per set between reconciles: backoff, unconfirmed creates, pending withdrawals, names
    /// taken by hand, dry-run reports ([`memory`]).
    pub(super) memory: Memory,
    /// The status last wanted or written per set, shown to reads from a cache that has not
    /// caught up with it yet.
    pub(super) statuses: StatusMemo,
}

impl Context {
    /// The kind of the set of the other kind named like this one, if the watches know one.
    pub(super) fn twin_cached(&self, kind: SetKind, ns: &str, name: &str) -> Option<SetKind> {
        let twin = match kind {
            SetKind::StatefulSet => SetKind::Advanced,
            SetKind::Advanced => SetKind::StatefulSet,
        };
        self.set_exists(Some(twin), ns, name).then_some(twin)
    }

    /// The live API of the other kind, when it is served.
    pub(super) fn twin_api(&self, kind: SetKind, ns: &str) -> Option<Twin> {
        match kind {
            SetKind::StatefulSet => self
                .caches
                .advanced
                .get()
                .map(|_| Twin::Advanced(Api::namespaced(self.client.clone(), ns))),
            SetKind::Advanced => Some(Twin::StatefulSets(Api::namespaced(self.client.clone(), ns))),
        }
    }

    /// Whether a set of `kind` named `name` is in `ns`, per the caches of sets (`None`: of
    /// either kind).
    pub(super) fn set_exists(&self, kind: Option<SetKind>, ns: &str, name: &str) -> bool {
        let builtin = || {
            let set = ObjectRef::new(name).within(ns);
            self.caches.sets.get(&set).is_some()
        };
        let advanced = || {
            let set = ObjectRef::new(name).within(ns);
            (self.caches.advanced.get()).is_some_and(|sets| sets.get(&set).is_some())
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
    /// sets come and go piles up entries. The metrics are shared by every scope: only the
    /// series of this scope's namespace are looked at ([`keep_series`]).
    pub(super) fn forget_gone_sets(&self) {
        self.remembered
            .memory
            .forget_gone(|(kind, ns, name)| self.set_exists(Some(*kind), ns, name));
        self.remembered
            .statuses
            .retain(|ns, name| self.set_exists(None, ns, name));
        self.metrics.retain_sets(|s| {
            keep_series(self.scope.as_deref(), s, |ns, name| {
                self.set_exists(None, ns, name)
            })
        });
    }

    /// After a reconcile of a set of `kind`: if the set was deleted meanwhile, what the
    /// reconcile kept for it is forgotten now (the deletion's own sweep may have run before).
    pub(super) fn forget_if_gone(&self, kind: SetKind, ns: &str, name: &str) {
        if !self.set_exists(Some(kind), ns, name) {
            self.forget_gone_sets();
        }
    }

    /// Waits until every watch cache has synced (see [`gate_readiness`]).
    pub(super) async fn wait_ready(&self) -> Result<(), Error> {
        let mut ready = self.caches.ready.clone();
        ready
            .wait_for(|r| *r)
            .await
            .map(|_| ())
            .map_err(|_| Error::CachesStopped)
    }
}

/// Whether a scope watching `scope` (`None`: every namespace) keeps the metric series of the
/// set `s` when it forgets its gone sets: a set of another namespace is another scope's to
/// judge (this scope's caches do not hold it), so it is kept; one of its own is kept while it
/// `exists` (namespace, name).
pub(super) fn keep_series(
    scope: Option<&str>,
    s: &SetLabels,
    exists: impl Fn(&str, &str) -> bool,
) -> bool {
    let ours = scope.is_none_or(|ns| ns == s.namespace);
    !ours || exists(&s.namespace, &s.statefulset)
}

/// Whether a set asks for drains.
pub fn opted_in(set: &StatefulSet) -> bool {
    set_kind::opted_in(&set.metadata)
}

/// How the controller stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// No reconcile was left running: the reconciles in progress when the stop began ended
    /// (the controller starts none after it), or the sets or the other caches had not synced,
    /// so no reconcile had got past its wait for them and none had acted.
    Clean,
    /// The stop's grace ([`ControllerConfig::stop_grace`], 20 s by default: inside
    /// Kubernetes' default 30 s grace period) passed with reconciles still running, and they
    /// were dropped. Every action is idempotent and all state is in the cluster, so the next
    /// leader resumes them as after a crash; but requests of theirs may still be on their way,
    /// so the Lease is left to expire, as after a crash, rather than released for a standby to
    /// act at once.
    DroppedReconciles,
}

impl Stopped {
    /// How several controllers (each kind of set, each scope) stopped, together: dropped
    /// reconciles if any dropped some (their requests may still be on their way), else clean.
    pub fn merge(stops: impl IntoIterator<Item = Self>) -> Self {
        if stops.into_iter().any(|s| s == Self::DroppedReconciles) {
            Self::DroppedReconciles
        } else {
            Self::Clean
        }
    }
}

pub(super) fn set_reference(kind: SetKind, set: &StatefulSet) -> ObjectReference {
    ObjectReference {
        api_version: Some(kind.api_version().to_owned()),
        kind: Some("StatefulSet".to_owned()),
        name: set.metadata.name.clone(),
        namespace: set.metadata.namespace.clone(),
        uid: set.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}
