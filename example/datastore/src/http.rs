//! The HTTP API: `PUT`/`GET /records/{key}`, `GET /records`, `GET /healthz`.

use std::future::Future;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, body::Bytes};
use tokio::net::TcpListener;

use crate::store::{InvalidKey, Key, Store, StoreError};

/// Largest record body accepted by `PUT /records/{key}`, in bytes.
pub const MAX_RECORD_BYTES: usize = 64 * 1024 * 1024;

/// The service's routes over `store`.
pub fn router(store: Store) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/records", get(list_records))
        .route("/records/{key}", get(get_record).put(put_record))
        .layer(DefaultBodyLimit::max(MAX_RECORD_BYTES))
        .with_state(store)
}

/// Serves `store` on `listener` until `shutdown` completes, then finishes the requests in
/// flight (so every acknowledged write is on disk) and returns.
pub async fn serve(
    listener: TcpListener,
    store: Store,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(store))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn healthz() -> &'static str {
    "ok"
}

/// `204` only once the record is durably on disk.
async fn put_record(
    State(store): State<Store>,
    Path(key): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let key = Key::parse(&key)?;
    let len = body.len();
    store.put(key.clone(), body.to_vec()).await?;
    tracing::debug!(%key, bytes = len, "stored record");
    Ok(StatusCode::NO_CONTENT)
}

async fn get_record(
    State(store): State<Store>,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    let key = Key::parse(&key)?;
    Ok(match store.get(key).await? {
        Some(bytes) => {
            ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no such record").into_response(),
    })
}

async fn list_records(State(store): State<Store>) -> Result<Json<Vec<String>>, ApiError> {
    Ok(Json(store.list().await?))
}

/// Why a request failed, mapped to a status code.
enum ApiError {
    BadKey(InvalidKey),
    Store(StoreError),
}

impl From<InvalidKey> for ApiError {
    fn from(e: InvalidKey) -> Self {
        Self::BadKey(e)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            Self::BadKey(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
            Self::Store(e) => {
                let message = crate::error_chain(&e);
                tracing::error!(error = %message, "request failed");
                (StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
            }
        }
    }
}
