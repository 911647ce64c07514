//! The concurrency limit: a semaphore that requests wait on (first come, first served) instead
//! of being refused with `503`, so a drainer pushing records is slowed down, never failed.

use std::sync::Arc;

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use futures::StreamExt;
use tokio::sync::Semaphore;

/// Waits for a permit, runs the request, and holds the permit until the response is sent: a
/// streamed body (a record being read) keeps it until the stream ends or is dropped, so a slow
/// reader counts against the limit. Bodies already in memory release it at once.
pub(super) async fn limit(
    State(permits): State<Arc<Semaphore>>,
    request: Request,
    next: Next,
) -> Response {
    let permit = Arc::clone(&permits)
        .acquire_owned()
        .await
        .expect("the request semaphore is never closed");
    let response = next.run(request).await;
    if response.body().size_hint().exact().is_some() {
        return response;
    }
    response.map(|body| {
        Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _held = &permit;
            chunk
        }))
    })
}
