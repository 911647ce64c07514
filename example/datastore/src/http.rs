//! The HTTP API: `PUT`/`GET /records/{key}`, `GET /records`, `GET /healthz`.
//!
//! # The peer contract
//!
//! This is also the contract a drainer relies on, for apps that implement the peer side
//! themselves. To hand over a record, a drainer sends `PUT /records/{key}` with the record's
//! bytes as body and the header `If-None-Match: *` (create only). The peer answers:
//!
//! - `200`, `201` or `204` only once the record is durable (it survives a crash of the peer);
//! - `412 Precondition Failed` if it already holds the key: its copy is newer or the same, so the
//!   drainer deletes its local copy without overwriting the peer's;
//! - `413 Payload Too Large` if the record is larger than the peer accepts.
//!
//! Anything else (other statuses, a connection that breaks, no answer) is not an
//! acknowledgement: the drainer keeps its copy and retries or fails.
//!
//! # This server
//!
//! `PUT` streams the body into a temporary file (memory bounded by one chunk, not by the
//! record's size), so a record is either wholly written or absent; a body that breaks off
//! leaves neither a record nor a temporary file. Without `If-None-Match: *` a `PUT` overwrites.
//! Bodies over [`Limits::max_record_bytes`] get `413`, at once when `Content-Length` says so,
//! otherwise as soon as the streamed bytes exceed it. `GET /records/{key}` streams the file.
//! A `500` answer names the operation and key but never a path or an OS error; the full error
//! chain goes to the log.

mod concurrency;
mod error;

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::io::ReaderStream;

use crate::store::{Created, Key, Store};
use error::ApiError;

/// Default of [`Limits::max_record_bytes`]: 1 GiB.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 1 << 30;

/// Default of [`Limits::max_concurrent_requests`].
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: NonZeroUsize = NonZeroUsize::new(64).unwrap();

/// Size of the chunks `GET /records/{key}` reads the file in.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Limits of the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest record body accepted by `PUT /records/{key}`, in bytes; larger ones get `413`.
    pub max_record_bytes: u64,
    /// Requests to `/records` and `/records/{key}` handled at once. Further requests wait
    /// (first come, first served) rather than being refused; `/healthz` never waits.
    pub max_concurrent_requests: NonZeroUsize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
        }
    }
}

/// What the record handlers share.
#[derive(Clone, Debug)]
struct AppState {
    store: Store,
    max_record_bytes: u64,
}

/// The service's routes over `store`, with the default [`Limits`].
pub fn router(store: Store) -> Router {
    router_with(store, Limits::default())
}

/// The service's routes over `store`, with `limits`.
pub fn router_with(store: Store, limits: Limits) -> Router {
    let permits = limits
        .max_concurrent_requests
        .get()
        .min(Semaphore::MAX_PERMITS);
    let state = AppState {
        store,
        max_record_bytes: limits.max_record_bytes,
    };
    Router::new()
        .route("/records", get(list_records))
        .route(
            "/records/{key}",
            get(get_record)
                .put(put_record)
                // `put_record` enforces `max_record_bytes` itself, while streaming.
                .layer(DefaultBodyLimit::disable()),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::new(Semaphore::new(permits)),
            concurrency::limit,
        ))
        .route("/healthz", get(healthz))
        .with_state(state)
}

/// Serves `store` on `listener` with the default [`Limits`]; see [`serve_with`].
pub async fn serve(
    listener: TcpListener,
    store: Store,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, store, Limits::default(), shutdown).await
}

/// Serves `store` on `listener` with `limits` until `shutdown` completes, then finishes the
/// requests in flight (so every acknowledged write is on disk) and returns.
pub async fn serve_with(
    listener: TcpListener,
    store: Store,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router_with(store, limits))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn healthz() -> &'static str {
    "ok"
}

/// `PUT /records/{key}`: streams the body into a temporary file; `204` only once the record
/// is durably on disk. `If-None-Match: *` makes it create-only (`412` if the key has a record).
async fn put_record(
    State(state): State<AppState>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key = Key::parse(&key)?;
    let create_only = is_create_only(&headers);
    let limit = state.max_record_bytes;
    if content_length(&headers).is_some_and(|len| len > limit) {
        return Err(ApiError::TooLarge { key, limit });
    }
    let mut pending = state.store.begin(key.clone()).await?;
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|source| ApiError::Body {
            key: key.clone(),
            source,
        })?;
        if pending.len() + chunk.len() as u64 > limit {
            // Dropping `pending` removes the temporary file.
            return Err(ApiError::TooLarge { key, limit });
        }
        pending.write(&chunk).await?;
    }
    let bytes = pending.len();
    if !create_only {
        pending.commit().await?;
        tracing::debug!(%key, bytes, "stored record");
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    Ok(match pending.commit_new().await? {
        Created::Created => {
            tracing::debug!(%key, bytes, "created record");
            StatusCode::NO_CONTENT.into_response()
        }
        Created::Exists => {
            tracing::debug!(%key, "record exists, left unchanged");
            (
                StatusCode::PRECONDITION_FAILED,
                format!("record {key} exists"),
            )
                .into_response()
        }
    })
}

/// Whether the request carries `If-None-Match: *`. Other `If-None-Match` values list entity
/// tags, which records do not have: they never match, so the write proceeds as a plain `PUT`.
fn is_create_only(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .any(|value| value.as_bytes().trim_ascii() == b"*")
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// `GET /records/{key}`: streams the record's file, or `404`.
async fn get_record(
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    let key = Key::parse(&key)?;
    let Some(record) = state.store.open_record(key).await? else {
        return Ok((StatusCode::NOT_FOUND, "no such record").into_response());
    };
    let body = Body::from_stream(ReaderStream::with_capacity(record.file, READ_CHUNK_BYTES));
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (header::CONTENT_LENGTH, HeaderValue::from(record.len)),
        ],
        body,
    )
        .into_response())
}

async fn list_records(State(state): State<AppState>) -> Result<Json<Vec<String>>, ApiError> {
    Ok(Json(state.store.list().await?))
}
