//! Why a request failed, and the answer it gets. `500` answers name the operation and the key
//! only: paths and OS error texts go to the log, never to the client.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::store::{InvalidKey, Key, StoreError};

/// Why a request failed, mapped to a status code.
#[derive(Debug, thiserror::Error)]
pub(super) enum ApiError {
    /// The key in the path is not valid: `400`.
    #[error(transparent)]
    BadKey(#[from] InvalidKey),
    /// The record body is larger than the limit: `413`.
    #[error("record {key} is larger than {limit} bytes")]
    TooLarge {
        /// The record's key.
        key: Key,
        /// The limit, in bytes.
        limit: u64,
    },
    /// The request body broke off (client gone) or was malformed: `400`, if anyone listens.
    #[error("failed to read the body of record {key}")]
    Body {
        /// The record's key.
        key: Key,
        /// The cause.
        #[source]
        source: axum::Error,
    },
    /// The `x-record-version` header does not parse: `400`.
    #[error("bad x-record-version for record {key}")]
    BadVersion {
        /// The record's key.
        key: Key,
        /// The cause.
        #[source]
        source: drain_api::record::InvalidVersion,
    },
    /// A release without `x-record-version`: `400`.
    #[error("releasing record {key} needs its x-record-version")]
    MissingVersion {
        /// The record's key.
        key: Key,
    },
    /// A tombstone handed over with a body: `400`.
    #[error("a tombstone of record {key} has no body")]
    TombstoneWithBody {
        /// The record's key.
        key: Key,
    },
    /// The store failed: `500`.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            Self::BadKey(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
            Self::BadVersion { source, .. } => {
                (StatusCode::BAD_REQUEST, format!("{self}: {source}")).into_response()
            }
            Self::MissingVersion { .. } | Self::TombstoneWithBody { .. } => {
                (StatusCode::BAD_REQUEST, self.to_string()).into_response()
            }
            Self::TooLarge { key, limit } => {
                tracing::info!(%key, limit, "rejected record over the size limit");
                (StatusCode::PAYLOAD_TOO_LARGE, self.to_string()).into_response()
            }
            Self::Body { key, .. } => {
                let chain = crate::error_chain(&self);
                tracing::warn!(%key, error = %chain, "request body broke off, nothing stored");
                (StatusCode::BAD_REQUEST, self.to_string()).into_response()
            }
            Self::Store(e) => {
                tracing::error!(error = %crate::error_chain(e), "request failed");
                let message = format!("internal error: {}", public_message(e));
                (StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
            }
        }
    }
}

/// What a client may learn of a store failure: the operation and key, no path or cause.
fn public_message(error: &StoreError) -> String {
    match error {
        StoreError::Open { .. } => "failed to open the data directory".to_owned(),
        StoreError::Write { key, .. } => format!("failed to write record {key}"),
        StoreError::Read { key, .. } => format!("failed to read record {key}"),
        StoreError::List { .. } => "failed to list records".to_owned(),
        StoreError::Task(_) => "file I/O task failed".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn store_errors_do_not_leak_paths_or_causes() {
        let key = Key::parse("k").unwrap();
        let errors = [
            StoreError::Open {
                dir: "/secret/data".into(),
                source: io::Error::other("/secret/data: boom"),
            },
            StoreError::Write {
                key: key.clone(),
                source: io::Error::other("/secret/data/.tmp-1: boom"),
            },
            StoreError::Read {
                key,
                source: io::Error::other("/secret/data/k: boom"),
            },
            StoreError::List {
                dir: "/secret/data".into(),
                source: io::Error::other("boom"),
            },
        ];
        for error in errors {
            let message = public_message(&error);
            assert!(!message.contains('/'), "{message}");
            assert!(!message.contains("boom"), "{message}");
        }
    }
}
