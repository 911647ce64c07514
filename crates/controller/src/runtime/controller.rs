//! The controller: one scope per watched namespace, each with its watches and caches
//! ([`watches`]), kube-runtime's controller for each kind of set ([`queue`]), the reconcile
//! ([`reconcile`], [`admit`], [`report`]) and the writes to the cluster ([`writes`]).

use std::sync::{Arc, OnceLock};

use futures::FutureExt;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;
use tokio::sync::{Notify, mpsc};
use tracing::info;

use crate::runtime::metrics::Metrics;
use crate::set_kind::{AdvancedStatefulSet, CachedStatefulSet};
use events::Events;
use kinds::tell_kruise;
use queue::{Discovery, discover_advanced, serve, serve_advanced};
use watches::{Routes, Secondary, SetWatch, drive_all, gate_readiness, ready_when_all, set_watch};

mod admit;
mod api;
mod backoff;
mod context;
mod events;
mod expectations;
mod kinds;
mod memory;
mod queue;
mod reconcile;
mod report;
mod snapshot;
mod watches;
mod writes;

pub use crate::identity::FIELD_MANAGER;
pub use context::{Context, ControllerConfig, Error, Stopped, Telemetry, opted_in};

/// Forgets what is kept for sets that are gone, each time the sets' watch tells of a deletion
/// or a relist (several at once count as one).
async fn forget_gone_sets(ctx: Arc<Context>, mut gone: mpsc::UnboundedReceiver<()>) {
    while gone.recv().await.is_some() {
        while gone.try_recv().is_ok() {}
        ctx.forget_gone_sets();
    }
}

/// What every scope shares: the client, the configuration, the metrics, the wake-up of the
/// volume sweep (one for the process) and the discovery of Advanced StatefulSets (asked once).
/// Leadership is in the configuration: its `gained()` is a watch channel each scope subscribes
/// to.
#[derive(Clone)]
struct Shared {
    client: Client,
    config: ControllerConfig,
    metrics: Arc<Metrics>,
    retained: Arc<Notify>,
    discovery: Discovery,
}

impl Context {
    /// The context of one scope's controllers, over the caches of its sets (built-in;
    /// Advanced, once served) and of its secondary watches.
    fn new(
        shared: &Shared,
        scope: Option<String>,
        ready: tokio::sync::watch::Receiver<bool>,
        (sets, advanced): (
            Store<CachedStatefulSet>,
            Arc<OnceLock<Store<AdvancedStatefulSet>>>,
        ),
        secondary: Secondary,
    ) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let Shared {
            client,
            config,
            metrics,
            retained,
            ..
        } = shared.clone();
        Self {
            caches: context::Caches {
                stateful_pods: secondary.stateful_pods,
                drain_pods: secondary.drain_pods,
                claims: secondary.claims,
                drain_pod_index: secondary.drain_pod_index,
                sets,
                advanced,
                ready,
            },
            remembered: context::Remembered {
                recent: secondary.recent,
                ..Default::default()
            },
            events: Events {
                recorder: Recorder::new(client.clone(), reporter),
                sending: tokio_util::task::TaskTracker::new(),
            },
            retained,
            metrics,
            config,
            scope,
            client,
        }
    }
}

/// The scopes the controller runs: one per watched namespace, or one over all namespaces.
fn scopes(namespaces: &[String]) -> Vec<Option<String>> {
    if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    }
}

/// Runs the controller until `shutdown` resolves; returns how it stopped. Each watched
/// namespace gets its own scope ([`run_scope`]: watches, caches, context, controllers), as a
/// relist replaces a whole cache; the client, metrics, leadership, sweep and discovery are
/// shared. Ready once every scope is.
pub async fn run(
    client: Client,
    config: ControllerConfig,
    telemetry: Telemetry,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<Stopped, Error> {
    let shared = Shared {
        discovery: discover_advanced(client.clone(), config.advanced_discovery),
        client,
        metrics: telemetry.metrics,
        retained: Arc::default(),
        config,
    };
    let sweep = tokio::spawn(crate::runtime::sweep::sweep(
        shared.client.clone(),
        shared.config.leadership.clone(),
        shared.config.namespaces.clone(),
        Arc::clone(&shared.retained),
        FIELD_MANAGER,
        Arc::clone(&shared.metrics),
    ));
    let shutdown = shutdown.shared();
    let mut readiness = Vec::new();
    let mut running = tokio::task::JoinSet::new();
    for scope in scopes(&shared.config.namespaces) {
        let (ready, ready_rx) = tokio::sync::watch::channel(false);
        readiness.push(ready_rx);
        running.spawn(run_scope(shared.clone(), scope, ready, shutdown.clone()));
    }
    let gate = tokio::spawn(ready_when_all(readiness, telemetry.ready));
    let mut stops = Vec::new();
    while let Some(stopped) = running.join_next().await {
        match stopped {
            Ok(stopped) => stops.push(stopped),
            // A scope that panicked takes the process down, as it did before scopes.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => stops.push(Stopped::DroppedReconciles),
        }
    }
    sweep.abort();
    gate.abort();
    info!("controller stopped");
    Ok(Stopped::merge(stops))
}

/// Runs one scope, the controllers of the sets in `scope` (`None`: all namespaces), until
/// `shutdown` resolves: the secondary watches (pods, claims) and the watch of each kind of set,
/// their context, the routes from pods and claims to sets, and the background tasks (forgetting
/// gone sets, telling OpenKruise of released names, the readiness gate, which sets `ready` once
/// this scope's caches synced). Returns how it stopped.
async fn run_scope(
    shared: Shared,
    scope: Option<String>,
    ready_tx: tokio::sync::watch::Sender<bool>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) -> Stopped {
    let ns = scope.as_deref();
    let client = &shared.client;
    let (sets_listed_tx, sets_listed) = tokio::sync::watch::channel(false);
    let (secondary, streams, released_rx) = Secondary::watch(client, ns, &shared.metrics);
    // Each kind of set has its own controller; the pod and claim watches are shared, and a
    // change is routed to the sets of either kind it concerns.
    let (gone_tx, gone_rx) = mpsc::unbounded_channel();
    let (sets, set_stream) = set_watch::<CachedStatefulSet>(
        client,
        ns,
        SetWatch {
            in_flight: secondary.drain_pod_index.clone(),
            gone: gone_tx.clone(),
            listed: sets_listed_tx,
        },
    );
    let ready = ready_tx.subscribe();
    let gate = tokio::spawn(gate_readiness(
        secondary.caches(sets_listed),
        scope.clone(),
        ready_tx,
    ));
    let advanced_sets: Arc<OnceLock<Store<AdvancedStatefulSet>>> = Arc::default();
    let stop_began: Arc<OnceLock<tokio::time::Instant>> = Arc::default();
    let ctx = Arc::new(Context::new(
        &shared,
        scope.clone(),
        ready,
        (sets.clone(), Arc::clone(&advanced_sets)),
        secondary,
    ));

    let (routes, set_triggers, advanced_triggers) = Routes::new(
        sets.clone(),
        advanced_sets,
        ctx.caches.drain_pod_index.clone(),
    );
    let background = [
        tokio::spawn(drive_all(routes.clone(), streams)),
        tokio::spawn(forget_gone_sets(Arc::clone(&ctx), gone_rx)),
        tokio::spawn(tell_kruise(
            (
                ctx.client.clone(),
                ctx.config.leadership.clone(),
                ctx.config.dry_run,
                Arc::clone(&ctx.metrics),
            ),
            Arc::clone(&routes.advanced),
            released_rx,
        )),
        tokio::spawn({
            let (began, stop) = (Arc::clone(&stop_began), shutdown.clone());
            async move {
                stop.await;
                let _ = began.set(tokio::time::Instant::now());
            }
        }),
        gate,
    ];
    let builtin = serve(
        Arc::clone(&ctx),
        sets,
        set_stream,
        set_triggers,
        shutdown.clone(),
    );
    let advanced = serve_advanced(
        Arc::clone(&ctx),
        shared.discovery.clone(),
        routes.advanced.clone(),
        gone_tx,
        advanced_triggers,
        shutdown,
    );
    let (builtin, advanced) = futures::join!(builtin, advanced);
    let events = wait_events(&ctx, stop_began.get().copied()).await;
    for task in background {
        task.abort();
    }
    Stopped::merge([builtin, advanced, events])
}

/// After the controllers stopped: waits for the Events still being sent until the stop's
/// grace, counted from `began`, is over; those left then are dropped (a report only).
async fn wait_events(ctx: &Context, began: Option<tokio::time::Instant>) -> Stopped {
    ctx.events.sending.close();
    let until = began.unwrap_or_else(tokio::time::Instant::now) + ctx.config.stop_grace;
    if tokio::time::timeout_at(until, ctx.events.sending.wait())
        .await
        .is_err()
    {
        info!(
            left = ctx.events.sending.len(),
            "Events still being sent at the end of the stop's grace; dropped"
        );
    }
    Stopped::Clean
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod harness;
