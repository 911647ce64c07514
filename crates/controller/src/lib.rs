//! The StatefulSet drain controller: when a scale-down leaves the claims of an ordinal without
//! their pod, it runs a drain pod of the same name bound to them, and deletes the claims only
//! once that pod succeeded.
//!
//! Each reconcile is observe ([`observe`]) → validate ([`validate`], from [`config`] and
//! [`template`]) → plan ([`plan`], pure) → act ([`act`], idempotent; [`retain`] for the volumes
//! it keeps) → report ([`status`], Events); [`runtime`] runs it: the watches, the reconcile
//! itself ([`runtime::controller`]), leader election, the admin server and metrics.

pub mod act;
pub mod claim_use;
pub mod cli;
pub mod config;
#[cfg(test)]
pub mod fixtures;
pub mod identity;
pub mod observe;
pub mod plan;
pub mod retain;
pub mod runtime;
pub mod set_kind;
pub mod status;
pub mod template;
pub mod validate;

pub use drain_logging::{LogError, error_chain};

/// Sets up logging: plain or JSON lines on stderr, filtered by `filter`.
pub fn init_logging(filter: &str, json: bool) -> Result<(), LogError> {
    drain_logging::init(filter, json)
}

/// Runs the controller with these options until SIGTERM or SIGINT.
pub async fn run(args: cli::Args) -> anyhow::Result<()> {
    let namespaces = args.watched_namespaces()?;
    let watching = if namespaces.is_empty() {
        "all namespaces".to_owned()
    } else {
        namespaces.join(",")
    };
    tracing::info!(version = env!("CARGO_PKG_VERSION"), namespaces = %watching, "starting statefulset-drain-controller");
    let client = kube::Client::try_default().await?;
    let election_config = args.election()?;
    let telemetry = runtime::controller::Telemetry::default();
    let admin = runtime::admin::AdminState {
        metrics: std::sync::Arc::clone(&telemetry.metrics),
        ready: telemetry.ready.subscribe(),
    };
    let bound = runtime::admin::serve(args.admin_address, admin).await?;
    tracing::info!(address = %bound, "admin server listening (/metrics, /livez, /readyz)");
    if args.dry_run {
        tracing::warn!("dry run: planning and reporting only; nothing is created or deleted");
    }
    let election = match election_config {
        Some(c) => Some(
            runtime::leader::Election::start(client.clone(), c, telemetry.metrics.leader.clone())
                .await?,
        ),
        None => {
            telemetry.metrics.leader.set(1);
            None
        }
    };
    let leadership = election.as_ref().map_or_else(
        runtime::leader::Leadership::always,
        runtime::leader::Election::leadership,
    );
    let config = runtime::controller::ControllerConfig {
        namespaces,
        flags: validate::Flags {
            retry_base: args.retry_base_delay,
            retry_max: args.retry_max_delay,
            stuck_after: args.stuck_after,
            quiet_after: args.quiet_after,
            max_restarts: args.max_restarts,
            node_lost_after: args.node_lost_after,
            scale_up_wait: args.scale_up_wait,
        },
        resync: args.resync,
        leadership,
        dry_run: args.dry_run,
        advanced_discovery: args.advanced_discovery_interval,
        stop_grace: args.stop_grace,
    };
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
        tracing::info!("shutting down");
    };
    // On SIGTERM the controller finishes the reconciles in progress, then the Lease is released
    // so a standby takes over at once; unless reconciles had to be dropped, whose requests may
    // still be on their way: then the Lease expires as after a crash.
    let stopped = runtime::controller::run(client, config, telemetry, shutdown).await?;
    if let Some(e) = election {
        match stopped {
            runtime::controller::Stopped::Clean => e.release().await,
            runtime::controller::Stopped::DroppedReconciles => e.abandon(),
        }
    }
    Ok(())
}
