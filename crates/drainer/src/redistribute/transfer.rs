//! One record's transfer: a versioned handover `PUT` that streams the record's value to its
//! owner.
//!
//! The peer contract (the example datastore implements it; an app that serves the peer API
//! itself must too; the rule is [`drain_api::record`]'s): `PUT <peer>/records/<key>` with the
//! value as body and the copy's version in `x-record-version` (a tombstone: also
//! `x-record-tombstone: 1`, no body). The peer keeps the higher version of its copy and this one.
//! - `200`, `201`, `204` with `x-record-version: <held>`, `held` at least the version sent: the
//!   peer holds this copy or a newer write of the key, durably; the local copy may go.
//! - a `2xx` without a version, or with an older one than sent: the peer does not implement
//!   the versioned handover; not an acknowledgement, and final.
//! - `421 Misdirected Request`: the address no longer belongs to the pod named in
//!   `x-record-owner`/`x-record-owner-uid` (sent with every handover to a peer, as read from the
//!   API): the record waits for the next round, which discovers the peers again. An
//!   acknowledgement must name the same pod in the same headers, or it is none.
//! - `413 Payload Too Large`: the peer will never take this record: a final error.
//! - `5xx`, `408`, `429`, no answer: transient, retried.
//! - anything else (`412` from a peer of the old create-only contract, another `2xx` such as
//!   `202`, a redirect, other `4xx`): not an acknowledgement; the peer refuses the record.
//!
//! A record file is a header and the value ([`drain_api::record`]); a file without a header is
//! a legacy record, sent whole at version `0.0.` (older than any versioned write).
//!
//! Peer traffic never goes through a proxy from the environment (`HTTP_PROXY`, `ALL_PROXY`),
//! and only the first [`MAX_ERROR_BODY`] bytes of an error answer are read.
//!
//! The body is streamed in [`CHUNK_BYTES`] chunks, so memory is bounded by the number of
//! transfers in flight, not by record size. Instead of a total timeout, a transfer fails when
//! no byte moved and no answer came for [`idle_timeout`](super::Options::idle_timeout): a big
//! record on a slow link is fine, a peer that stopped reading is not.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use drain_api::record::{
    self, HEADER_LEN, Header, Kind, OWNER_HEADER, OWNER_UID_HEADER, TOMBSTONE_HEADER,
    VERSION_HEADER, Version,
};
use futures::StreamExt;
use reqwest::StatusCode;
use reqwest::header::CONTENT_LENGTH;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::time::Instant;
use url::Url;

use super::rate::RateLimiter;

/// Size of the chunks a record file is read and sent in.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Most bytes of an error answer's body read (and quoted in the error).
pub const MAX_ERROR_BODY: usize = 4 * 1024;

/// What every transfer of a run shares: the cap on bytes sent per second, and the count of
/// bytes sent so far.
///
/// The count grows while a record streams, chunk by chunk (retries included), so a record that
/// takes minutes to send still shows progress; the drain's
/// [`bytesSent`](drain_api::progress::DrainProgress::bytes_sent) publishes it.
#[derive(Clone, Debug, Default)]
pub struct Wire {
    /// Caps the bytes of record values sent per second, across every transfer (`None`: no cap).
    limiter: Option<Arc<RateLimiter>>,
    /// Bytes of record values handed to the connection so far.
    sent: Arc<AtomicU64>,
}

impl Wire {
    /// A wire capped at `bytes_per_second` (`0`: no cap).
    pub fn new(bytes_per_second: u64) -> Self {
        Self {
            limiter: RateLimiter::new(bytes_per_second).map(Arc::new),
            sent: Arc::default(),
        }
    }

    /// Bytes sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// The counter of bytes sent, shared.
    pub fn counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.sent)
    }
}

/// The pod a handover is meant for, as read from the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner<'a> {
    /// The pod's name.
    pub name: &'a str,
    /// The pod's UID, when known.
    pub uid: Option<&'a str>,
}

impl<'a> Owner<'a> {
    /// The owner a peer stands for.
    pub fn of(peer: &'a crate::peers::Peer) -> Self {
        Self {
            name: &peer.name,
            uid: peer.uid.as_deref(),
        }
    }
}

/// How the owner took a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivered {
    /// It holds this copy now (or held it already: a retry).
    Stored,
    /// It holds a newer write of the key: its copy stays, this one is done.
    NewerThere,
}

/// A handover the owner acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handed {
    /// How the owner took it.
    pub delivered: Delivered,
    /// The header of the copy sent (its version is what a local release names).
    pub sent: Header,
    /// The record file's size in bytes.
    pub bytes: u64,
}

/// Why a `PUT` of one record failed.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    /// No answer: connection refused or reset.
    #[error("request failed")]
    Transport(#[source] reqwest::Error),
    /// Nothing moved for the idle timeout.
    #[error("no progress for {}s (idle timeout)", idle.as_secs_f64())]
    Idle {
        /// The idle timeout.
        idle: Duration,
    },
    /// The record file could not be opened or read.
    #[error("failed to read the record file")]
    ReadFile(#[source] std::io::Error),
    /// The peer refuses records this large (`413`).
    #[error("peer refuses the record as too large ({bytes} bytes): {body:?}")]
    TooLarge {
        /// The record's size.
        bytes: u64,
        /// The start of the answer's body.
        body: String,
    },
    /// The peer answered `2xx` without the version it holds, or with one older than sent: it
    /// does not implement the versioned handover.
    #[error(
        "peer answered {status} but {detail}: not an acknowledgement (does it implement the versioned handover?)"
    )]
    NotVersioned {
        /// The status.
        status: StatusCode,
        /// The version sent and the one answered (or that none was).
        detail: String,
    },
    /// The address answered as another pod than the owner the handover was meant for (`421`,
    /// or an acknowledgement naming another pod): the pod's address changed.
    #[error("the address answered as another pod: {detail}")]
    Misdirected {
        /// The pod meant, and what the address answered.
        detail: String,
    },
    /// The peer answered with a status that is not an acknowledgement.
    #[error("peer answered {status}, which is not an acknowledgement: {body:?}")]
    Status {
        /// The status.
        status: StatusCode,
        /// The start of the answer's body.
        body: String,
    },
}

impl PutError {
    /// Whether the same request may succeed later: no answer, idle, `5xx`, `408` or `429`.
    /// Any other answer means the peer refuses the record.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Transport(_) | Self::Idle { .. } => true,
            Self::ReadFile(_)
            | Self::TooLarge { .. }
            | Self::NotVersioned { .. }
            | Self::Misdirected { .. } => false,
            Self::Status { status, .. } => {
                status.is_server_error()
                    || *status == StatusCode::REQUEST_TIMEOUT
                    || *status == StatusCode::TOO_MANY_REQUESTS
            }
        }
    }
}

/// Whether an answer's status may acknowledge a handover (it must also name the version held:
/// [`judge`]).
pub fn is_acknowledging(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::OK | StatusCode::CREATED | StatusCode::NO_CONTENT
    )
}

/// What an acknowledging answer (`status`, its `x-record-version` text) means for a copy of
/// version `sent`.
pub fn judge(
    status: StatusCode,
    held: Option<&str>,
    sent: &Version,
) -> Result<Delivered, PutError> {
    let not_versioned = || PutError::NotVersioned {
        status,
        detail: match held {
            Some(held) => format!("holds version {held:?} after a handover of {sent}"),
            None => format!("named no version held after a handover of {sent}"),
        },
    };
    let held: Version = held
        .and_then(|h| h.parse().ok())
        .ok_or_else(not_versioned)?;
    if !record::acknowledges(&held, sent) {
        return Err(not_versioned());
    }
    Ok(if held == *sent {
        Delivered::Stored
    } else {
        Delivered::NewerThere
    })
}

/// Reads the header of an open record file; leaves the file at the value's start. Answers the
/// header and the value's length.
pub async fn read_header(file: &mut tokio::fs::File) -> std::io::Result<(Header, u64)> {
    let len = file.metadata().await?.len();
    let mut prefix = Vec::with_capacity(HEADER_LEN);
    (&mut *file)
        .take(HEADER_LEN as u64)
        .read_to_end(&mut prefix)
        .await?;
    let (header, offset) = Header::of_file(&prefix);
    file.seek(std::io::SeekFrom::Start(offset)).await?;
    Ok((header, len.saturating_sub(offset)))
}

/// The HTTP client of transfers: connections time out after 5 s (or the idle timeout, if
/// shorter), redirects are not followed (a redirect is not an acknowledgement), no proxy from
/// the environment is used (peers are pods, reached directly), and there is no total timeout
/// (see [`put_record`]).
pub fn client(idle: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5).min(idle))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
}

/// Whether an answer names the pod `owner` (its name, and its UID when the owner's is known).
pub fn answered_as(headers: &reqwest::header::HeaderMap, owner: &Owner<'_>) -> Result<(), String> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match get(OWNER_HEADER) {
        Some(name) if name == owner.name => {}
        Some(name) => return Err(format!("answered as pod {name:?}")),
        None => return Err(format!("the answer names no pod ({OWNER_HEADER})")),
    }
    match (owner.uid, get(OWNER_UID_HEADER)) {
        (None, _) => Ok(()),
        (Some(uid), Some(answered)) if answered == uid => Ok(()),
        (Some(_), Some(answered)) => Err(format!("answered with pod UID {answered:?}")),
        (Some(_), None) => Err(format!("the answer names no pod UID ({OWNER_UID_HEADER})")),
    }
}

/// `<base>/records/<key>`, the key percent-encoded as one path segment.
pub fn record_url(base: &Url, key: &str) -> Url {
    let mut url = base.clone();
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop_if_empty().extend(["records", key]);
    }
    url
}

/// Hands the record file at `path` over to `url` (a versioned `PUT` streaming its value),
/// meant for the pod `owner` (`None`: this pod's own server, on loopback), at the pace of
/// `wire`, counted in it. `Ok(None)` if the file is gone.
pub async fn put_record(
    http: &reqwest::Client,
    url: Url,
    path: &Path,
    idle: Duration,
    owner: Option<Owner<'_>>,
    wire: &Wire,
) -> Result<Option<Handed>, PutError> {
    let mut file = match tokio::fs::File::open(path).await {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(PutError::ReadFile(e)),
    };
    let bytes = file.metadata().await.map_err(PutError::ReadFile)?.len();
    let (sent, value_len) = read_header(&mut file).await.map_err(PutError::ReadFile)?;
    let start = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let (touch, wire) = (Arc::clone(&last), wire.clone());
    let body = tokio_util::io::ReaderStream::with_capacity(file, CHUNK_BYTES).then(move |chunk| {
        let (touch, wire) = (Arc::clone(&touch), wire.clone());
        async move {
            if let Ok(bytes) = &chunk {
                let len = bytes.len() as u64;
                if let Some(limiter) = &wire.limiter {
                    // Waiting for the byte cap is not idleness: the wait ends in the future.
                    let turn = limiter.reserve(len);
                    touch.store(ms_between(start, turn), Ordering::Relaxed);
                    if turn > Instant::now() {
                        tokio::time::sleep_until(turn).await;
                    }
                }
                wire.sent.fetch_add(len, Ordering::Relaxed);
            }
            touch.store(elapsed_ms(start), Ordering::Relaxed);
            chunk
        }
    });
    let mut request = http
        .put(url)
        .header(VERSION_HEADER, sent.version.to_string())
        .header(CONTENT_LENGTH, value_len);
    if sent.kind == Kind::Tombstone {
        request = request.header(TOMBSTONE_HEADER, "1");
    }
    if let Some(owner) = &owner {
        request = request.header(OWNER_HEADER, owner.name);
        if let Some(uid) = owner.uid {
            request = request.header(OWNER_UID_HEADER, uid);
        }
    }
    let request = request.body(reqwest::Body::wrap_stream(body)).send();
    let response = watch_idle(request, &last, start, idle)
        .await?
        .map_err(PutError::Transport)?;
    let status = response.status();
    let misdirected = |answered: String| PutError::Misdirected {
        detail: format!(
            "meant for {}, {answered}",
            owner.map(|o| o.name).unwrap_or("this pod's own server")
        ),
    };
    if is_acknowledging(status) {
        if let Some(owner) = &owner {
            answered_as(response.headers(), owner).map_err(misdirected)?;
        }
        let held = response
            .headers()
            .get(VERSION_HEADER)
            .and_then(|v| v.to_str().ok());
        let delivered = judge(status, held, &sent.version)?;
        return Ok(Some(Handed {
            delivered,
            sent,
            bytes,
        }));
    }
    let text = watch_idle(bounded_text(response), &last, Instant::now(), idle).await?;
    let body = truncate(text, 200);
    Err(match status {
        StatusCode::PAYLOAD_TOO_LARGE => PutError::TooLarge { bytes, body },
        StatusCode::MISDIRECTED_REQUEST => misdirected(format!("421: {body}")),
        status => PutError::Status { status, body },
    })
}

/// The start of an answer's body: at most [`MAX_ERROR_BODY`] bytes are read, however much the
/// peer sends; a body that breaks off gives what came.
async fn bounded_text(response: reqwest::Response) -> String {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        let room = MAX_ERROR_BODY - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= MAX_ERROR_BODY {
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

fn elapsed_ms(start: Instant) -> u64 {
    ms_between(start, Instant::now())
}

fn ms_between(start: Instant, then: Instant) -> u64 {
    u64::try_from(then.saturating_duration_since(start).as_millis()).unwrap_or(u64::MAX)
}

/// Runs `work` until it completes, or fails with [`PutError::Idle`] once `last` (ms after
/// `start` of the last activity) is older than `idle`.
async fn watch_idle<T>(
    work: impl std::future::Future<Output = T>,
    last: &AtomicU64,
    start: Instant,
    idle: Duration,
) -> Result<T, PutError> {
    let check = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut ticker = tokio::time::interval(check);
    tokio::pin!(work);
    let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
    loop {
        tokio::select! {
            out = &mut work => return Ok(out),
            _ = ticker.tick() => {
                let quiet = elapsed_ms(start).saturating_sub(last.load(Ordering::Relaxed));
                if quiet >= idle_ms {
                    return Err(PutError::Idle { idle });
                }
            }
        }
    }
}

fn truncate(mut text: String, chars: usize) -> String {
    if let Some((cut, _)) = text.char_indices().nth(chars) {
        text.truncate(cut);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_urls_encode_the_key() {
        let base = Url::parse("http://10.0.0.1:8080/").unwrap();
        assert_eq!(
            record_url(&base, "k-1.x").as_str(),
            "http://10.0.0.1:8080/records/k-1.x"
        );
        assert_eq!(
            record_url(&base, "a b/c?").as_str(),
            "http://10.0.0.1:8080/records/a%20b%2Fc%3F"
        );
        let prefixed = Url::parse("http://h/api").unwrap();
        assert_eq!(
            record_url(&prefixed, "k").as_str(),
            "http://h/api/records/k"
        );
    }

    #[test]
    fn only_200_201_204_may_acknowledge_and_412_no_longer_does() {
        for code in 100..600u16 {
            let Ok(status) = StatusCode::from_u16(code) else {
                continue;
            };
            assert_eq!(
                is_acknowledging(status),
                matches!(code, 200 | 201 | 204),
                "{code}"
            );
        }
    }

    #[test]
    fn an_answer_acknowledges_only_a_version_at_least_the_one_sent() {
        let sent: Version = "100.2.ds-1".parse().unwrap();
        let ok = StatusCode::NO_CONTENT;
        assert_eq!(
            judge(ok, Some("100.2.ds-1"), &sent).unwrap(),
            Delivered::Stored
        );
        assert_eq!(
            judge(ok, Some("100.3.ds-0"), &sent).unwrap(),
            Delivered::NewerThere
        );
        assert_eq!(
            judge(ok, Some("100.2.ds-2"), &sent).unwrap(),
            Delivered::NewerThere,
            "a tie on the clock is broken by the node name, the same way on both sides"
        );
        for held in [Some("100.2.ds-0"), Some("99.9.ds-9"), Some("garbage"), None] {
            let err = judge(ok, held, &sent).unwrap_err();
            assert!(matches!(err, PutError::NotVersioned { .. }), "{held:?}");
            assert!(!err.is_transient());
        }
    }

    #[test]
    fn transient_put_errors() {
        let status = |code: u16| PutError::Status {
            status: StatusCode::from_u16(code).unwrap(),
            body: String::new(),
        };
        for code in [500, 502, 503, 408, 429] {
            assert!(status(code).is_transient(), "{code}");
        }
        for code in [202, 400, 403, 404, 409, 301] {
            assert!(!status(code).is_transient(), "{code}");
        }
        let too_large = PutError::TooLarge {
            bytes: 1,
            body: String::new(),
        };
        assert!(!too_large.is_transient());
        assert!(
            PutError::Idle {
                idle: Duration::from_secs(1)
            }
            .is_transient()
        );
    }

    #[tokio::test]
    async fn idle_watch_fires_only_without_activity() {
        let last = AtomicU64::new(0);
        let start = Instant::now();
        let idle = Duration::from_millis(50);
        let slow = tokio::time::sleep(Duration::from_millis(300));
        assert!(matches!(
            watch_idle(slow, &last, start, idle).await,
            Err(PutError::Idle { .. })
        ));

        // Activity every 10ms keeps a 300ms piece of work alive under a 50ms idle timeout.
        let last = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let bump = Arc::clone(&last);
        let busy = async move {
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                bump.store(elapsed_ms(start), Ordering::Relaxed);
            }
        };
        assert!(watch_idle(busy, &last, start, idle).await.is_ok());
    }
}
