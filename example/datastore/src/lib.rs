//! The example datastore: a partitioned key-value HTTP service keeping one file per record.
//!
//! Which server holds a key is the client's choice (the project's clients use
//! `drainer::placement::owner` over the StatefulSet's ordinals); each server only stores what
//! it is given. Every write gets a version (a hybrid logical clock reading and the server's
//! name, [`store::clock`]) kept with the record, and a delete leaves a versioned tombstone, so
//! when copies of one key meet (a drain, a rebalance) the newest write wins. [`http`] spells
//! out this peer contract for apps that implement it themselves.

pub mod cli;
pub mod client;
pub mod http;
pub mod store;

use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

pub use client::Client;
pub use store::{Created, Key, Store};

/// Errors that stop the service.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The data directory could not be opened.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The listen address could not be bound.
    #[error("failed to listen on {addr}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The signal handlers could not be installed.
    #[error("failed to install signal handlers")]
    Signal(#[source] std::io::Error),
    /// The server failed while serving.
    #[error("server failed")]
    Serve(#[source] std::io::Error),
}

pub use drain_logging::{LogError, error_chain};

/// Installs the global `tracing` subscriber: `filter` in `EnvFilter` syntax, JSON or plain text.
pub fn init_tracing(filter: &str, json: bool) -> Result<(), LogError> {
    drain_logging::init(filter, json)
}

/// Runs the service with `args` until SIGTERM or SIGINT, then shuts down gracefully.
pub async fn run(args: cli::Args) -> Result<(), RunError> {
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        data_dir = %args.data_dir.display(),
        listen = %args.listen,
        max_record_bytes = args.max_record_bytes,
        max_concurrent_requests = args.max_concurrent_requests.get(),
        "starting datastore"
    );
    let node = args.node_name.clone().unwrap_or_else(store::default_node);
    let store = Store::open_pod(&args.data_dir, &node, args.pod_uid.as_deref())?;
    tracing::info!(
        node = store.node(),
        pod_uid = store.pod_uid().unwrap_or(""),
        "versions name this server; handovers must name this pod"
    );
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|source| RunError::Listen {
            addr: args.listen,
            source,
        })?;
    let mut term = signal(SignalKind::terminate()).map_err(RunError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(RunError::Signal)?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("received SIGTERM, shutting down"),
            _ = int.recv() => tracing::info!("received SIGINT, shutting down"),
        }
    };
    http::serve_with(listener, store, args.limits(), shutdown)
        .await
        .map_err(RunError::Serve)?;
    tracing::info!("stopped");
    Ok(())
}
