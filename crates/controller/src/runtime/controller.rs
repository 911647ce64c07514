//! kube-runtime wiring: the watches (narrowed by label selectors, metadata-only where the full
//! object is not needed, slimmed before they are cached), the mappers from pods and claims to
//! their StatefulSet, the reconcile pipeline, the error policy, and the cluster seam's real
//! implementation.

use std::sync::{Arc, OnceLock};

use futures::FutureExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;
use tokio::sync::mpsc;
use tracing::info;

use crate::runtime::metrics::Metrics;
use crate::runtime::status_writer::StatusWriter;
use crate::set_kind::AdvancedStatefulSet;
use cluster::status_patcher;
use kinds::tell_kruise;
use memory::Memory;
use serve::{serve, serve_advanced};
use watches::{Routes, Secondary, drive_all, gate_readiness, set_watch};

mod api;
mod backoff;
mod cluster;
mod context;
mod kinds;
mod memory;
mod reconcile;
mod serve;
mod snapshot;
mod watches;

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

impl Context {
    /// The context of the controllers, over the caches of the sets (built-in; Advanced, once
    /// served) and of the secondary watches.
    fn new(
        client: Client,
        config: ControllerConfig,
        metrics: Arc<Metrics>,
        ready: tokio::sync::watch::Receiver<bool>,
        (sets, advanced): (
            Store<StatefulSet>,
            Arc<OnceLock<Store<AdvancedStatefulSet>>>,
        ),
        secondary: Secondary,
    ) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            sets,
            advanced,
            recorder: Recorder::new(client.clone(), reporter),
            stateful_pods: secondary.stateful_pods,
            drain_pods: secondary.drain_pods,
            claims: secondary.claims,
            recent: secondary.recent,
            drain_pod_index: secondary.drain_pod_index,
            claim_index: secondary.claim_index,
            memory: Memory::default(),
            status: StatusWriter::new(
                status_patcher(client.clone(), Arc::clone(&metrics)),
                config.leadership.clone(),
                Arc::clone(&metrics),
                (config.flags.retry_base, config.flags.retry_max),
            ),
            retained: Arc::default(),
            metrics,
            ready,
            config,
            client,
        }
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

    let (secondary, streams, released_rx) = Secondary::watch(&client, ns, &telemetry.metrics);
    // Each kind of set has its own controller; the pod and claim watches are shared, and a
    // change is routed to the sets of either kind it concerns.
    let (gone_tx, gone_rx) = mpsc::unbounded_channel();
    let (sets, set_stream, sets_listed) = set_watch::<StatefulSet>(
        &client,
        ns,
        secondary.drain_pod_index.clone(),
        gone_tx.clone(),
    );
    let ready = telemetry.ready.subscribe();
    let gate = tokio::spawn(gate_readiness(
        secondary.caches(sets_listed),
        telemetry.ready,
    ));
    let advanced_sets: Arc<OnceLock<Store<AdvancedStatefulSet>>> = Arc::default();
    let ctx = Arc::new(Context::new(
        client,
        config,
        telemetry.metrics,
        ready,
        (sets.clone(), Arc::clone(&advanced_sets)),
        secondary,
    ));

    let (routes, set_triggers, advanced_triggers) =
        Routes::new(sets.clone(), advanced_sets, ctx.drain_pod_index.clone());
    let background = [
        tokio::spawn(drive_all(routes.clone(), streams)),
        tokio::spawn(forget_gone_sets(Arc::clone(&ctx), gone_rx)),
        tokio::spawn(crate::runtime::sweep::sweep(
            ctx.client.clone(),
            ctx.config.leadership.clone(),
            ctx.config.namespace.clone().into_iter().collect(),
            Arc::clone(&ctx.retained),
            FIELD_MANAGER,
        )),
        tokio::spawn(tell_kruise(
            Arc::clone(&ctx),
            Arc::clone(&routes.advanced),
            released_rx,
        )),
        gate,
    ];
    let shutdown = shutdown.shared();
    let builtin = serve(
        Arc::clone(&ctx),
        sets,
        set_stream,
        set_triggers,
        shutdown.clone(),
    );
    let advanced = serve_advanced(
        Arc::clone(&ctx),
        routes.advanced.clone(),
        gone_tx,
        advanced_triggers,
        shutdown.clone(),
    );
    let stopped = match futures::join!(builtin, advanced) {
        (Stopped::Clean, Stopped::Clean) => Stopped::Clean,
        _ => Stopped::DroppedReconciles,
    };
    for task in background {
        task.abort();
    }
    info!("controller stopped");
    Ok(stopped)
}

#[cfg(test)]
mod tests;
