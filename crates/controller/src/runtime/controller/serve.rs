//! Serving one kind of set: the work queue ([`queue`]) over its watch and triggers, with the stop's grace
//! ([`Stopped`]), and OpenKruise's kind served once it is discovered.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, Stream, StreamExt};
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::backoff::error_policy;
use super::context::{Context, Stopped};
use super::kinds::wait_for_advanced;
use super::queue;
use super::reconcile::reconcile;
use super::watches::{SetWatch, set_watch};

use crate::set_kind::{AdvancedStatefulSet, ServedSet};

/// Whether a stop, at this instant, may drop the controller of one kind of set at once: yes
/// while its sets are not listed or the other caches have not synced.
pub(super) fn halt_at_once(sets_listed: bool, caches_synced: bool) -> bool {
    !(sets_listed && caches_synced)
}

/// Runs the controller of one kind of set until `shutdown` resolves, then lets the reconciles
/// in progress finish, for at most the stop's grace (see [`Stopped`]). Returns how it stopped.
pub(super) async fn serve<K: ServedSet>(
    ctx: Arc<Context>,
    sets: Store<K>,
    stream: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    triggers: mpsc::UnboundedReceiver<ObjectRef<K>>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) -> Stopped {
    let gained = ctx.config.leadership.gained();
    let grace = ctx.config.stop_grace;
    // When the reconciles still running after a stop are dropped: at once if the sets or the
    // caches had not synced (none can have got past its wait for them), else at the end of the
    // stop's grace. Whether it was at once.
    let abandon = {
        let (sets, ctx, stop) = (sets.clone(), Arc::clone(&ctx), shutdown.clone());
        async move {
            stop.await;
            // Polled once: `Store::wait_until_ready` keeps one waker, and if it is not ready the
            // reconciles are dropped right away, so the queue's waker is not needed any more.
            let listed = matches!(sets.wait_until_ready().now_or_never(), Some(Ok(())));
            let at_once = halt_at_once(listed, *ctx.ready.borrow());
            if !at_once {
                tokio::time::sleep(grace).await;
            }
            at_once
        }
    };
    // What asks for a set's reconcile: a change of the set itself (its watch), a trigger (its
    // pods, drain pods and claims), and every cached set when this replica gains leadership.
    let changed = stream.filter_map(|set| {
        std::future::ready(match set {
            Ok(set) => Some(ObjectRef::from_obj(&set)),
            // The watch of the sets failed (an RBAC denial, an object that does not parse):
            // retried with backoff, and said, or the kind would go unserved in silence.
            Err(e) => {
                warn!(kind = K::KIND.label(), error = %e, "watching the sets failed; retrying");
                None
            }
        })
    });
    let every = {
        let sets = sets.clone();
        gained.flat_map(move |()| {
            futures::stream::iter(
                sets.state()
                    .iter()
                    .map(|s| ObjectRef::from_obj(&**s))
                    .collect::<Vec<_>>(),
            )
        })
    };
    let requests = futures::stream::select(
        futures::stream::select(changed, tokio_stream_from(triggers)),
        every,
    );
    let reconciler = {
        let ctx = Arc::clone(&ctx);
        move |set: Arc<K>| {
            let ctx = Arc::clone(&ctx);
            async move {
                match reconcile::<K>(Arc::clone(&set), Arc::clone(&ctx)).await {
                    Ok(requeue) => {
                        debug!(set = %ObjectRef::from_obj(&*set), "reconciled");
                        requeue
                    }
                    Err(e) => {
                        debug!(error = %e, "reconcile failed");
                        error_policy(set, &e, ctx)
                    }
                }
            }
        }
    };
    let listed_sets = sets.clone();
    match queue::run(sets, requests, reconciler, shutdown, abandon).await {
        None => {
            // Nothing was running at the stop; before the sets and caches synced, nothing had
            // got past its wait for them either.
            let listed = matches!(listed_sets.wait_until_ready().now_or_never(), Some(Ok(())));
            if halt_at_once(listed, *ctx.ready.borrow()) {
                info!(
                    kind = K::KIND.label(),
                    "stopped before the sets and caches had synced; no reconcile had started"
                );
            }
            Stopped::Clean
        }
        // Dropped, and ended, before the caches synced: none had got past its wait for them.
        Some(true) if !*ctx.ready.borrow() => {
            info!(
                kind = K::KIND.label(),
                "stopped before the sets and caches had synced; no reconcile had started"
            );
            Stopped::Clean
        }
        Some(false) => {
            warn!(
                kind = K::KIND.label(),
                grace = ?grace,
                "reconciles still running at the end of the stop's grace; dropped (the next leader resumes them)"
            );
            Stopped::DroppedReconciles
        }
        Some(true) => {
            // The caches synced while the reconciles were being dropped: one may have acted.
            warn!(
                kind = K::KIND.label(),
                "reconciles dropped at the stop as the caches synced; one may have acted (the next leader resumes them)"
            );
            Stopped::DroppedReconciles
        }
    }
}

pub(super) fn tokio_stream_from<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The discovery of Advanced StatefulSets ([`wait_for_advanced`]), run once for every scope:
/// resolves once the kind is served.
pub(super) type Discovery = Shared<BoxFuture<'static, ()>>;

/// Starts asking the API server's discovery every `every` whether Advanced StatefulSets are
/// served, once for the whole process (polled by the scopes that wait on it).
pub(super) fn discover_advanced(client: Client, every: Duration) -> Discovery {
    async move { wait_for_advanced(&client, every).await }
        .boxed()
        .shared()
}

/// Serves OpenKruise's Advanced StatefulSets of the context's scope once that kind is served
/// (`discovery` resolves) and the drain pods are listed, until `stop`; [`Stopped::Clean`] if it
/// never was. Sets that concern us are filled in through `fills_tx`; deletions and relists are
/// told on `gone_tx`.
pub(super) async fn serve_advanced(
    ctx: Arc<Context>,
    discovery: Discovery,
    store: Arc<OnceLock<Store<AdvancedStatefulSet>>>,
    (gone_tx, fills_tx, drain_pods_listed): (
        mpsc::UnboundedSender<()>,
        mpsc::UnboundedSender<crate::runtime::watch::SetKey>,
        tokio::sync::watch::Receiver<bool>,
    ),
    triggers: mpsc::UnboundedReceiver<ObjectRef<AdvancedStatefulSet>>,
    stop: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) -> Stopped {
    let found = tokio::select! {
        () = discovery => true,
        () = stop.clone() => false,
    };
    if !found {
        return Stopped::Clean;
    }
    let (sets, stream) = set_watch::<AdvancedStatefulSet>(
        &ctx.client,
        ctx.scope.as_deref(),
        SetWatch {
            in_flight: ctx.drain_pod_index.clone(),
            gone: gone_tx,
            interest: Arc::clone(&ctx.interest),
            names: Arc::clone(&ctx.advanced_names),
            fills: fills_tx,
            listed: tokio::sync::watch::channel(false).0,
            pods_changed: Arc::clone(&ctx.pods_changed),
        },
        // Like the built-in sets: judged once the drain pods are known.
        super::watches::flipped(drain_pods_listed),
    );
    let _ = store.set(sets.clone());
    serve(Arc::clone(&ctx), sets, stream, triggers, stop).await
}
