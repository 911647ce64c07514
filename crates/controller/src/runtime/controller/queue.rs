//! Serving one kind of set: kube-runtime's [`Controller`] over its watch and triggers, with the
//! stop's grace ([`Stopped`]), and OpenKruise's kind served once it is discovered.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, Stream, StreamExt};
use kube::Client;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::backoff::error_policy;
use super::context::{Context, Error, Stopped};
use super::kinds::wait_for_advanced;
use super::reconcile::reconcile;
use super::watches::{SetWatch, set_watch};
use super::writes::Kube;

use crate::set_kind::{AdvancedStatefulSet, ServedSet};

/// Whether a stop, at this instant, may drop the controller of one kind of set at once: yes
/// while its sets are not listed or the other caches have not synced.
pub(super) fn halt_at_once(sets_listed: bool, caches_synced: bool) -> bool {
    !(sets_listed && caches_synced)
}

/// One reconcile, a panic in it taken as a failure (logged, retried with backoff) rather than
/// the end of every set's controller.
async fn reconcile_caught<K: ServedSet>(set: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = ObjectRef::from_obj(&*set);
    match AssertUnwindSafe(reconcile::<K, _>(set, ctx, &Kube))
        .catch_unwind()
        .await
    {
        Ok(Ok(action)) => {
            debug!(set = %key, "reconciled");
            Ok(action)
        }
        Ok(Err(e)) => {
            debug!(error = %e, "reconcile failed");
            Err(e)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            error!(set = %key, panic = %what, "a reconcile panicked; the set is retried with backoff");
            Err(Error::Panicked(what))
        }
    }
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
    let kind = K::KIND.label();
    // What asks for a set's reconcile: a change of the set itself (its watch), a trigger (its
    // pods, drain pods and claims), and every cached set when this replica gains leadership.
    let changed = stream.filter_map(move |set| {
        std::future::ready(match set {
            Ok(set) => Some(Ok::<_, watcher::Error>(set)),
            // The watch of the sets failed (an RBAC denial, an object that does not parse):
            // retried with backoff by the watch, and said, or the kind would go unserved in
            // silence.
            Err(e) => {
                warn!(kind, error = %e, "watching the sets failed; retrying");
                None
            }
        })
    });
    let run = Controller::for_stream(changed, sets.clone())
        .with_config(controller::Config::default())
        .reconcile_on(tokio_stream_from(triggers))
        .reconcile_all_on(ctx.config.leadership.gained())
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile_caught::<K>, error_policy::<K>, Arc::clone(&ctx))
        .for_each(|done| {
            if let Err(e) = done {
                match e {
                    // Failures are logged and counted by the error policy.
                    controller::Error::ReconcilerFailed(..) => {}
                    controller::Error::ObjectNotFound(set) => {
                        debug!(%set, "not cached (deleted); not reconciled");
                    }
                    e => error!(kind, error = %e, "the controller's queue failed"),
                }
            }
            std::future::ready(())
        });
    tokio::pin!(run);
    tokio::select! {
        () = &mut run => return Stopped::Clean,
        () = shutdown => {}
    }
    // Polled once: `Store::wait_until_ready` keeps one waker, and if it is not ready the
    // controller is dropped right away, so its own wait is not needed any more.
    let listed = matches!(sets.wait_until_ready().now_or_never(), Some(Ok(())));
    if halt_at_once(listed, *ctx.caches.ready.borrow()) {
        // No reconcile got past its wait for the caches: none acted.
        info!(
            kind,
            "stopped before the sets and caches had synced; no reconcile had started"
        );
        return Stopped::Clean;
    }
    let grace = ctx.config.stop_grace;
    if tokio::time::timeout(grace, run).await.is_ok() {
        return Stopped::Clean;
    }
    // Dropping the controller aborts the reconciles it spawned.
    warn!(
        kind,
        ?grace,
        "reconciles still running at the end of the stop's grace; dropped (the next leader resumes them)"
    );
    Stopped::DroppedReconciles
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
/// (`discovery` resolves), until `stop`; [`Stopped::Clean`] if it
/// never was. Deletions and relists are told on `gone_tx`.
pub(super) async fn serve_advanced(
    ctx: Arc<Context>,
    discovery: Discovery,
    store: Arc<OnceLock<Store<AdvancedStatefulSet>>>,
    gone_tx: mpsc::UnboundedSender<()>,
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
            in_flight: ctx.caches.drain_pod_index.clone(),
            gone: gone_tx,
            listed: tokio::sync::watch::channel(false).0,
        },
    );
    let _ = store.set(sets.clone());
    serve(Arc::clone(&ctx), sets, stream, triggers, stop).await
}
