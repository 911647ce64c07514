//! The admin HTTP server: `/metrics` (Prometheus text format), `/livez` and `/readyz`.
//!
//! `/livez` answers `200` as long as the runtime serves requests. `/readyz` answers `200` once
//! every watch cache has synced (before that, `503`): the probe a Deployment's rollout waits on.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::runtime::metrics::Metrics;

/// What the endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// Whether the caches synced.
    pub ready: tokio::sync::watch::Receiver<bool>,
}

/// The routes.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Binds `address` and serves the admin endpoints until the process ends; returns the bound
/// address (useful with port 0).
pub async fn serve(address: SocketAddr, state: AdminState) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(state)).await {
            tracing::error!(error = %e, "admin server stopped");
        }
    });
    Ok(bound)
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    if *state.ready.borrow() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced yet")
    }
}
