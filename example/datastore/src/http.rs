//! The HTTP API: `PUT`/`GET`/`DELETE /records/{key}`, `POST /records/{key}/release`,
//! `GET /records`, `GET /healthz`.
//!
//! # The peer contract
//!
//! This is also the contract a drainer relies on, for apps that implement the peer side
//! themselves (see [`drain_api::record`] for the rule). Every copy of a key carries the version
//! of the write that made it. To hand a copy over, a drainer sends `PUT /records/{key}` with
//! the value as body and its version in `x-record-version` (a tombstone: `x-record-tombstone:
//! 1`, empty body). The peer keeps whichever of its copy and the one sent has the higher
//! version, atomically, and answers:
//!
//! - `204` with `x-record-version: <the version it now holds>`, only once that copy is durable
//!   (it survives a crash of the peer); the drainer deletes its copy if that version is at least
//!   the one it sent;
//! - `413 Payload Too Large` if the value is larger than the peer accepts.
//!
//! Anything else (other statuses, an answer without the version, a connection that breaks, no
//! answer) is not an acknowledgement: the drainer keeps its copy and retries or fails.
//!
//! # Clients
//!
//! `PUT /records/{key}` without a version writes: the server gives the write a version higher
//! than the key's copy here and answers it in `x-record-version`. With `If-None-Match: *` it
//! only creates (`412` if the key has a value). `DELETE /records/{key}` leaves a versioned
//! tombstone (`204`, even if the key had no value here). `GET` answers `404` for a deleted key.
//! `POST /records/{key}/release` with `x-record-version` removes the copy here if it is still
//! of that version (`204`; `409` with the version here if a newer write came): the rebalance
//! sidecar's last step after the owner acknowledged the copy.
//!
//! # This server
//!
//! `PUT` streams the body into a temporary file (memory bounded by one chunk, not by the
//! record's size), so a record is either wholly written or absent; a body that breaks off
//! leaves neither a record nor a temporary file. Bodies over [`Limits::max_record_bytes`] get
//! `413`, at once when `Content-Length` says so, otherwise as soon as the streamed bytes exceed
//! it. `GET /records/{key}` streams the file. A `500` answer names the operation and key but
//! never a path or an OS error; the full error chain goes to the log.

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
use axum::routing::{get, post};
use futures::StreamExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::io::ReaderStream;

use drain_api::record::{
    Header, Kind, OWNER_HEADER, OWNER_UID_HEADER, TOMBSTONE_HEADER, VERSION_HEADER, Version,
};

use crate::store::{Created, Key, Released, Store};
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
                .delete(delete_record)
                // `put_record` enforces `max_record_bytes` itself, while streaming.
                .layer(DefaultBodyLimit::disable()),
        )
        .route("/records/{key}/release", post(release_record))
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
/// is durably on disk. With `x-record-version` it is a handover (the higher version stays, the
/// answer names the version held); otherwise a client write (a new version, answered), or with
/// `If-None-Match: *` a create (`412` if the key has a value).
async fn put_record(
    State(state): State<AppState>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key = Key::parse(&key)?;
    let handover = handover_header(&key, &headers)?;
    if let Some(wrong) = misdirected(&state.store, &headers) {
        tracing::warn!(%key, %wrong, "refused a handover meant for another pod");
        return Ok((StatusCode::MISDIRECTED_REQUEST, wrong).into_response());
    }
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
    if let Some(sent) = handover {
        if sent.kind == Kind::Tombstone && bytes > 0 {
            return Err(ApiError::TombstoneWithBody { key });
        }
        let held = pending.hand_over(sent.clone()).await?;
        tracing::debug!(%key, bytes, sent = %sent.version, held = %held.version, "handover");
        let mut response = held_response(StatusCode::NO_CONTENT, &held);
        name_this_pod(&state.store, &mut response);
        return Ok(response);
    }
    if !create_only {
        let version = pending.commit().await?;
        tracing::debug!(%key, bytes, %version, "stored record");
        return Ok(version_response(StatusCode::NO_CONTENT, &version));
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

/// `DELETE /records/{key}`: a tombstone with a new version, durably; `204` with the version.
async fn delete_record(
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    let key = Key::parse(&key)?;
    let version = state.store.delete(key.clone()).await?;
    tracing::debug!(%key, %version, "deleted record");
    Ok(version_response(StatusCode::NO_CONTENT, &version))
}

/// `POST /records/{key}/release` with `x-record-version`: removes the copy here if it is still
/// of that version (`204`), or keeps a newer one (`409` with its version).
async fn release_record(
    State(state): State<AppState>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = Key::parse(&key)?;
    let version =
        version_of(&key, &headers)?.ok_or(ApiError::MissingVersion { key: key.clone() })?;
    Ok(match state.store.release(key.clone(), &version).await? {
        Released::Released | Released::Gone => StatusCode::NO_CONTENT.into_response(),
        Released::Kept(held) => {
            tracing::debug!(%key, released = %version, %held, "release refused: a newer write is here");
            version_response(StatusCode::CONFLICT, &held)
        }
    })
}

/// Why a request naming its intended pod (`x-record-owner`, `x-record-owner-uid`) is not
/// meant for this one, if it is not.
fn misdirected(store: &Store, headers: &HeaderMap) -> Option<String> {
    let get = |name: &str| {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()))
    };
    if let Some(owner) = get(OWNER_HEADER)
        && owner != store.node()
    {
        return Some(format!("this is pod {}, not {owner}", store.node()));
    }
    if let (Some(uid), Some(mine)) = (get(OWNER_UID_HEADER), store.pod_uid())
        && uid != mine
    {
        return Some(format!(
            "this is pod {} with UID {mine}, not UID {uid}",
            store.node()
        ));
    }
    None
}

/// Names this pod in an acknowledgement, so the sender can tell it reached the pod it meant.
fn name_this_pod(store: &Store, response: &mut Response) {
    let headers = response.headers_mut();
    if let Ok(name) = HeaderValue::from_str(store.node()) {
        headers.insert(OWNER_HEADER, name);
    }
    if let Some(uid) = store.pod_uid().and_then(|u| HeaderValue::from_str(u).ok()) {
        headers.insert(OWNER_UID_HEADER, uid);
    }
}

/// The handed-over copy's header, if the request is a handover (`x-record-version` set).
fn handover_header(key: &Key, headers: &HeaderMap) -> Result<Option<Header>, ApiError> {
    let Some(version) = version_of(key, headers)? else {
        return Ok(None);
    };
    let tombstone = headers
        .get(TOMBSTONE_HEADER)
        .is_some_and(|v| v.as_bytes().trim_ascii() == b"1");
    let kind = if tombstone {
        Kind::Tombstone
    } else {
        Kind::Value
    };
    Ok(Some(Header { kind, version }))
}

/// The `x-record-version` of the request, if any.
fn version_of(key: &Key, headers: &HeaderMap) -> Result<Option<Version>, ApiError> {
    let Some(value) = headers.get(VERSION_HEADER) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default();
    text.parse()
        .map(Some)
        .map_err(|source| ApiError::BadVersion {
            key: key.clone(),
            source,
        })
}

fn version_response(status: StatusCode, version: &Version) -> Response {
    let mut response = status.into_response();
    if let Ok(value) = HeaderValue::from_str(&version.to_string()) {
        response.headers_mut().insert(VERSION_HEADER, value);
    }
    response
}

fn held_response(status: StatusCode, held: &Header) -> Response {
    let mut response = version_response(status, &held.version);
    if held.kind == Kind::Tombstone {
        response
            .headers_mut()
            .insert(TOMBSTONE_HEADER, HeaderValue::from_static("1"));
    }
    response
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
    let version = HeaderValue::from_str(&record.version.to_string())
        .unwrap_or_else(|_| HeaderValue::from_static(""));
    let body = Body::from_stream(ReaderStream::with_capacity(record.file, READ_CHUNK_BYTES));
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (header::CONTENT_LENGTH, HeaderValue::from(record.len)),
            (header::HeaderName::from_static(VERSION_HEADER), version),
        ],
        body,
    )
        .into_response())
}

async fn list_records(State(state): State<AppState>) -> Result<Json<Vec<String>>, ApiError> {
    Ok(Json(state.store.list().await?))
}
