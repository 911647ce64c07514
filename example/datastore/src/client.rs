//! A small HTTP client for the datastore, for tests and example clients.

use reqwest::{StatusCode, Url, header};

pub use crate::store::Created;

/// Errors of [`Client`] calls.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The base URL could not be parsed or cannot hold paths.
    #[error("invalid datastore base url {url:?}")]
    BaseUrl {
        /// The rejected URL.
        url: String,
    },
    /// The request failed before an answer came back.
    #[error("failed to {op} {target}")]
    Request {
        /// What was attempted (`put record`, `create record`, `get record`, `list records`).
        op: &'static str,
        /// The URL requested.
        target: Url,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with an unexpected status.
    #[error("failed to {op} {target}: server answered {status}")]
    Status {
        /// What was attempted.
        op: &'static str,
        /// The URL requested.
        target: Url,
        /// The status received.
        status: StatusCode,
    },
}

/// A client of one datastore server.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
}

impl Client {
    /// A client of the server at `base` (such as `http://10.0.0.7:8080`).
    pub fn new(base: &str) -> Result<Self, ClientError> {
        let bad = || ClientError::BaseUrl {
            url: base.to_owned(),
        };
        let base = Url::parse(base).map_err(|_| bad())?;
        if base.cannot_be_a_base() {
            return Err(bad());
        }
        Ok(Self {
            http: reqwest::Client::new(),
            base,
        })
    }

    /// The server's base URL.
    pub fn base(&self) -> &Url {
        &self.base
    }

    /// Stores `value` under `key`; returns once the server acknowledged a durable write.
    pub async fn put(&self, key: &str, value: impl Into<Vec<u8>>) -> Result<(), ClientError> {
        let op = "put record";
        let (target, status) = self.send_put(op, key, value.into(), false).await?;
        expect_success(op, target, status)
    }

    /// `PUT /records/{key}` (create-only with `If-None-Match: *` when `create_only`); the URL
    /// and the answer's status.
    async fn send_put(
        &self,
        op: &'static str,
        key: &str,
        value: Vec<u8>,
        create_only: bool,
    ) -> Result<(Url, StatusCode), ClientError> {
        let target = self.record_url(key);
        let mut request = self.http.put(target.clone()).body(value);
        if create_only {
            request = request.header(header::IF_NONE_MATCH, "*");
        }
        let status = send(op, &target, request).await?;
        Ok((target, status))
    }

    /// Stores `value` under `key` only if the server has no record of that key, with
    /// `If-None-Match: *`: [`Created::Created`] once the server acknowledged a durable write
    /// (any `2xx`), [`Created::Exists`] on `412` (the server's record is left unchanged).
    pub async fn create(
        &self,
        key: &str,
        value: impl Into<Vec<u8>>,
    ) -> Result<Created, ClientError> {
        let op = "create record";
        let (target, status) = self.send_put(op, key, value.into(), true).await?;
        if status == StatusCode::PRECONDITION_FAILED {
            return Ok(Created::Exists);
        }
        expect_success(op, target, status)?;
        Ok(Created::Created)
    }

    /// Deletes `key`; returns once the server acknowledged a durable tombstone (which it keeps
    /// even if it held no value of the key).
    pub async fn delete(&self, key: &str) -> Result<(), ClientError> {
        let op = "delete record";
        let target = self.record_url(key);
        let status = send(op, &target, self.http.delete(target.clone())).await?;
        expect_success(op, target, status)
    }

    /// The value of `key`, or `None` if the server has no such record (or it was deleted).
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, ClientError> {
        let op = "get record";
        let target = self.record_url(key);
        let request_err = |source| ClientError::Request {
            op,
            target: target.clone(),
            source,
        };
        let response = self
            .http
            .get(target.clone())
            .send()
            .await
            .map_err(request_err)?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        expect_success(op, target.clone(), response.status())?;
        let bytes = response.bytes().await.map_err(request_err)?;
        Ok(Some(bytes.to_vec()))
    }

    /// All keys on the server, sorted.
    pub async fn list(&self) -> Result<Vec<String>, ClientError> {
        let op = "list records";
        let target = self.url(&["records"]);
        let request_err = |source| ClientError::Request {
            op,
            target: target.clone(),
            source,
        };
        let response = self
            .http
            .get(target.clone())
            .send()
            .await
            .map_err(request_err)?;
        expect_success(op, target.clone(), response.status())?;
        response.json().await.map_err(request_err)
    }

    /// Whether the server answers its readiness probe.
    pub async fn healthy(&self) -> bool {
        match self.http.get(self.url(&["healthz"])).send().await {
            Ok(response) => response.status().is_success(),
            Err(_) => false,
        }
    }

    fn record_url(&self, key: &str) -> Url {
        self.url(&["records", key])
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("checked in Client::new")
            .pop_if_empty()
            .extend(segments);
        url
    }
}

/// Sends `request` (to `target`, doing `op`) and answers the status.
async fn send(
    op: &'static str,
    target: &Url,
    request: reqwest::RequestBuilder,
) -> Result<StatusCode, ClientError> {
    let response = request
        .send()
        .await
        .map_err(|source| ClientError::Request {
            op,
            target: target.clone(),
            source,
        })?;
    Ok(response.status())
}

fn expect_success(op: &'static str, target: Url, status: StatusCode) -> Result<(), ClientError> {
    if status.is_success() {
        Ok(())
    } else {
        Err(ClientError::Status { op, target, status })
    }
}
