//! Built-in mode: moves every record file of the data directory to the peer that owns its key.
//!
//! The data directory holds one file per record, named after its key (the datastore's format);
//! names starting with `.` are unfinished writes and are ignored, and so is a `lost+found`
//! directory. Each record is `PUT` to `<owner>/records/<key>`, the owner being
//! [`placement::owner`](crate::placement::owner) over the set's live members, and its local file
//! is deleted only after the owner acknowledged it with a `2xx` (a durable write).
//!
//! Restart-safe: a rerun lists the files still there and sends them again. A file that was sent
//! but not yet deleted is sent twice, which overwrites the same key with the same bytes: nothing
//! is duplicated and nothing is lost. The same holds inside one run, which works in *rounds*:
//! when an owner is not Ready or stops answering, its records wait, peers are discovered again
//! after a backoff, and the next round retries what is left.
//!
//! [`Options::max_rate`] caps how many `PUT`s start per second, across all concurrent ones, so
//! a drain does not overload the remaining pods.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder, Retryable};
use bytes::Bytes;
use futures::StreamExt;
use reqwest::StatusCode;
use url::Url;

use crate::peers::{Peer, PeerSet, PeerSource, PeersError};

/// How a redistribution runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Directory holding one file per record.
    pub data_dir: PathBuf,
    /// Records in flight at once.
    pub concurrency: usize,
    /// Records sent per second at most, across all concurrent `PUT`s; `0` means no limit.
    /// Every `PUT`, a retry too, waits for its turn: they start at least `1/max_rate` seconds
    /// apart (the first at once), and idle time does not build up a burst.
    pub max_rate: u32,
    /// Retries of one `PUT` after a connection error or a `5xx`/`408`/`429` answer.
    pub put_retries: usize,
    /// First delay between `PUT` retries (doubles each time, with jitter).
    pub put_retry_delay: Duration,
    /// Rounds at most (discover peers, send what is left) before giving up.
    pub max_rounds: usize,
    /// Delay before the second round; doubles each round, capped at [`MAX_ROUND_DELAY`] (or
    /// at this value if it is larger).
    pub round_delay: Duration,
    /// Timeout of one `PUT`.
    pub request_timeout: Duration,
    /// Interval between progress log lines.
    pub progress_interval: Duration,
}

/// Longest wait between rounds.
pub const MAX_ROUND_DELAY: Duration = Duration::from_secs(30);

impl Options {
    /// Defaults for `data_dir`: 8 in flight, no rate limit, 5 retries from 200ms, 6 rounds
    /// from 2s.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            concurrency: 8,
            max_rate: 0,
            put_retries: 5,
            put_retry_delay: Duration::from_millis(200),
            max_rounds: 6,
            round_delay: Duration::from_secs(2),
            request_timeout: Duration::from_secs(60),
            progress_interval: Duration::from_secs(5),
        }
    }
}

/// What a successful redistribution did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Records moved (acknowledged by their owner and deleted locally).
    pub records: u64,
    /// Bytes of those records.
    pub bytes: u64,
    /// Rounds run (0 if the data directory was empty).
    pub rounds: usize,
}

/// Why a `PUT` of one record failed.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    /// No answer: connection refused or reset, timeout.
    #[error("request failed")]
    Transport(#[source] reqwest::Error),
    /// The peer answered with a status other than `2xx`.
    #[error("peer answered {status}: {body:?}")]
    Status {
        /// The status.
        status: StatusCode,
        /// The start of the answer's body.
        body: String,
    },
}

impl PutError {
    /// Whether the same request may succeed later: no answer, `5xx`, `408` or `429`. Any other
    /// answer means the peer refuses the record.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Transport(_) => true,
            Self::Status { status, .. } => {
                status.is_server_error()
                    || *status == StatusCode::REQUEST_TIMEOUT
                    || *status == StatusCode::TOO_MANY_REQUESTS
            }
        }
    }
}

/// Why a redistribution failed. In every case, every record that no peer acknowledged is still
/// in the data directory.
#[derive(Debug, thiserror::Error)]
pub enum RedistributeError {
    /// The data directory does not exist (the claim is not mounted where expected).
    #[error("data directory {} does not exist", dir.display())]
    DataDirMissing {
        /// The data directory.
        dir: PathBuf,
    },
    /// The data directory is a file or something else.
    #[error("data directory {} is not a directory", dir.display())]
    DataDirNotADirectory {
        /// The data directory.
        dir: PathBuf,
    },
    /// The data directory cannot be read.
    #[error("failed to read data directory {}", dir.display())]
    ReadDataDir {
        /// The data directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The data directory holds something that is not a record file.
    #[error("unexpected {kind} {} in the data directory: records are regular files", path.display())]
    UnexpectedEntry {
        /// The entry.
        path: PathBuf,
        /// What it is (`directory`, `symlink`, `special file`).
        kind: &'static str,
    },
    /// A record file's name is not UTF-8, so it is no key.
    #[error("record file {} has a name that is not UTF-8", path.display())]
    NonUtf8Name {
        /// The file.
        path: PathBuf,
    },
    /// A record file could not be read.
    #[error("failed to read record file {}", path.display())]
    ReadRecord {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A moved record's file could not be deleted.
    #[error("failed to delete moved record file {}", path.display())]
    DeleteRecord {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Peers could not be discovered.
    #[error("failed to discover peers")]
    Discover(#[source] Box<PeersError>),
    /// The set has no other members to hold the data (scaled to zero or to only the drained one).
    #[error("no peers: the statefulset has no members besides the drained ordinal")]
    NoPeers,
    /// No member is Ready.
    #[error("no ready peers among members {members:?}")]
    NoReadyPeers {
        /// The members.
        members: Vec<i32>,
    },
    /// The owner of some records stayed not Ready.
    #[error("peer with ordinal {ordinal} owns records but is not ready")]
    OwnerNotReady {
        /// The owner.
        ordinal: i32,
    },
    /// A peer refused a record (answered `4xx`, or anything not retryable).
    #[error("peer {peer} refused record {key:?} at {url}")]
    PeerRefused {
        /// The record's key.
        key: String,
        /// The peer pod.
        peer: String,
        /// The URL of the `PUT`.
        url: String,
        /// The answer.
        #[source]
        source: PutError,
    },
    /// A peer kept failing (no answer or `5xx`) through every retry and round.
    #[error("peer {peer} did not accept record {key:?} at {url}")]
    PeerUnavailable {
        /// The record's key.
        key: String,
        /// The peer pod.
        peer: String,
        /// The URL of the `PUT`.
        url: String,
        /// The last failure.
        #[source]
        source: PutError,
    },
    /// New record files kept appearing while records were moved (something still writes to
    /// the drained claim).
    #[error("{count} new record files appeared in the data directory during the drain")]
    RecordsAppeared {
        /// Record files found after the last round.
        count: usize,
    },
    /// The HTTP client could not be built.
    #[error("failed to build the http client")]
    HttpClient(#[source] reqwest::Error),
    /// A blocking file task panicked.
    #[error("file task failed")]
    Task(#[source] tokio::task::JoinError),
}

impl RedistributeError {
    /// A short category for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::DataDirMissing { .. } => "DataDirMissing",
            Self::DataDirNotADirectory { .. } => "DataDirNotADirectory",
            Self::ReadDataDir { .. } => "ReadDataDir",
            Self::UnexpectedEntry { .. } => "UnexpectedEntry",
            Self::NonUtf8Name { .. } => "NonUtf8Name",
            Self::ReadRecord { .. } => "ReadRecord",
            Self::DeleteRecord { .. } => "DeleteRecord",
            Self::Discover(_) => "DiscoverPeers",
            Self::NoPeers => "NoPeers",
            Self::NoReadyPeers { .. } => "NoReadyPeers",
            Self::OwnerNotReady { .. } => "OwnerNotReady",
            Self::PeerRefused { .. } => "PeerRefused",
            Self::PeerUnavailable { .. } => "PeerUnavailable",
            Self::RecordsAppeared { .. } => "RecordsAppeared",
            Self::HttpClient(_) => "HttpClient",
            Self::Task(_) => "Task",
        }
    }
}

/// Moves every record in `options.data_dir` to its owner among the peers from `peers`.
///
/// Steps: list the record files (an empty directory succeeds at once, without discovery); then
/// rounds of: discover peers → send each record to its owner and delete it once acknowledged
/// (bounded concurrency, each `PUT` retried on transient failures) → list what is left. Records
/// whose owner is not Ready or not answering wait for the next round; a peer refusing a record
/// ends the run at once.
pub async fn redistribute<P: PeerSource>(
    options: &Options,
    peers: &P,
) -> Result<Summary, RedistributeError> {
    let dir = options.data_dir.as_path();
    let mut names = list_records(dir).await?;
    if names.is_empty() {
        tracing::info!(data_dir = %dir.display(), "data directory holds no records, nothing to move");
        return Ok(Summary::default());
    }
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5).min(options.request_timeout))
        .timeout(options.request_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(RedistributeError::HttpClient)?;
    let limiter = RateLimiter::new(options.max_rate);
    let mut progress = Progress::new(names.len());
    tracing::info!(
        data_dir = %dir.display(),
        records = names.len(),
        max_rate = options.max_rate,
        "starting redistribution"
    );
    let mut round_delays = ExponentialBuilder::default()
        .with_min_delay(options.round_delay)
        .with_max_delay(options.round_delay.max(MAX_ROUND_DELAY))
        .with_max_times(options.max_rounds.saturating_sub(1))
        .build();
    let mut rounds = 0;
    loop {
        rounds += 1;
        let deferral = match peers.discover().await {
            Err(e) if !e.is_transient() => return Err(RedistributeError::Discover(Box::new(e))),
            Err(e) => Some(RedistributeError::Discover(Box::new(e))),
            Ok(set) if set.members.is_empty() => Some(RedistributeError::NoPeers),
            Ok(set) if set.ready.is_empty() => Some(RedistributeError::NoReadyPeers {
                members: set.members,
            }),
            Ok(set) => {
                log_peers(&set, rounds);
                let round = Round {
                    options,
                    http: &http,
                    peers: &set,
                    limiter: limiter.as_ref(),
                    down: Mutex::default(),
                };
                round.run(std::mem::take(&mut names), &mut progress).await?
            }
        };
        names = list_records(dir).await?;
        if names.is_empty() {
            break;
        }
        let deferral =
            deferral.unwrap_or(RedistributeError::RecordsAppeared { count: names.len() });
        let Some(delay) = round_delays.next() else {
            progress.log("redistribution stopped");
            return Err(deferral);
        };
        tracing::warn!(
            round = rounds,
            remaining = names.len(),
            retry_in = ?delay,
            reason = deferral.reason(),
            error = %crate::error_chain(&deferral),
            "records left for the next round"
        );
        tokio::time::sleep(delay).await;
    }
    progress.log("redistribution finished");
    Ok(Summary {
        records: progress.records,
        bytes: progress.bytes,
        rounds,
    })
}

fn log_peers(set: &PeerSet, round: usize) {
    let ready: Vec<String> = set.ready.values().map(Peer::base_url).collect();
    tracing::info!(
        round,
        members = ?set.members,
        ready = ?ready,
        not_ready = ?set.not_ready(),
        "discovered peers"
    );
}

/// What became of one record in a round.
enum Outcome {
    /// Acknowledged by its owner and deleted locally.
    Moved { bytes: u64 },
    /// Its file was gone already.
    Gone,
    /// Left for the next round, with the reason (`None`: its owner already failed this round).
    Deferred(Option<RedistributeError>),
}

/// One pass over the records with one peer set.
struct Round<'a> {
    options: &'a Options,
    http: &'a reqwest::Client,
    peers: &'a PeerSet,
    /// Spaces out the `PUT`s (`None`: no limit). Shared by the rounds of a run.
    limiter: Option<&'a RateLimiter>,
    /// Owners that stopped answering this round: their other records wait for the next one.
    down: Mutex<HashSet<i32>>,
}

impl Round<'_> {
    /// Sends `names`; returns why some records were left over, if any were. A refusal or a
    /// local I/O error ends the run.
    async fn run(
        &self,
        names: Vec<String>,
        progress: &mut Progress,
    ) -> Result<Option<RedistributeError>, RedistributeError> {
        let mut moves = futures::stream::iter(names)
            .map(|name| self.move_record(name))
            .buffer_unordered(self.options.concurrency.max(1));
        let interval = self
            .options
            .progress_interval
            .max(Duration::from_millis(10));
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        let mut deferral = None;
        let mut deferred = 0usize;
        loop {
            tokio::select! {
                next = moves.next() => match next {
                    None => break,
                    Some(Ok(Outcome::Moved { bytes })) => progress.moved(bytes),
                    Some(Ok(Outcome::Gone)) => {}
                    Some(Ok(Outcome::Deferred(reason))) => {
                        deferred += 1;
                        if deferral.is_none() {
                            deferral = reason;
                        }
                    }
                    Some(Err(e)) => {
                        progress.log("redistribution stopped");
                        return Err(e);
                    }
                },
                _ = ticker.tick() => progress.log("redistribution progress"),
            }
        }
        if deferred > 0 {
            tracing::info!(deferred, "records deferred this round");
        }
        Ok(deferral)
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn move_record(&self, name: String) -> Result<Outcome, RedistributeError> {
        let Some(owner) = self.peers.owner(&name) else {
            return Ok(Outcome::Deferred(Some(RedistributeError::NoPeers)));
        };
        let Some(peer) = self.peers.ready_peer(owner) else {
            return Ok(Outcome::Deferred(Some(RedistributeError::OwnerNotReady {
                ordinal: owner,
            })));
        };
        if self.is_down(owner) {
            return Ok(Outcome::Deferred(None));
        }
        let path = self.options.data_dir.join(&name);
        let body = match tokio::fs::read(&path).await {
            Ok(body) => Bytes::from(body),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Outcome::Gone),
            Err(source) => return Err(RedistributeError::ReadRecord { path, source }),
        };
        let url = record_url(&peer.url, &name);
        let backoff = ExponentialBuilder::default()
            .with_min_delay(self.options.put_retry_delay)
            .with_max_delay(self.options.put_retry_delay.max(Duration::from_secs(10)))
            .with_max_times(self.options.put_retries)
            .with_jitter();
        let (url_ref, body_ref) = (&url, &body);
        let put = || async move {
            if let Some(limiter) = self.limiter {
                limiter.wait_turn().await;
            }
            put_record(self.http, url_ref.clone(), body_ref.clone()).await
        };
        let result = put
            .retry(backoff)
            .when(PutError::is_transient)
            .notify(|e, delay| {
                tracing::debug!(key = %name, peer = %peer.name, retry_in = ?delay, error = %crate::error_chain(e), "retrying put");
            })
            .await;
        match result {
            Ok(()) => {}
            Err(source) if source.is_transient() => {
                self.down.lock().expect("lock poisoned").insert(owner);
                tracing::warn!(peer = %peer.name, key = %name, error = %crate::error_chain(&source), "peer not accepting records");
                return Ok(Outcome::Deferred(Some(
                    RedistributeError::PeerUnavailable {
                        key: name,
                        peer: peer.name.clone(),
                        url: url.to_string(),
                        source,
                    },
                )));
            }
            Err(source) => {
                return Err(RedistributeError::PeerRefused {
                    key: name,
                    peer: peer.name.clone(),
                    url: url.to_string(),
                    source,
                });
            }
        }
        delete_record(&self.options.data_dir, &name).await?;
        Ok(Outcome::Moved {
            bytes: body.len() as u64,
        })
    }

    fn is_down(&self, ordinal: i32) -> bool {
        self.down.lock().expect("lock poisoned").contains(&ordinal)
    }
}

/// Caps how many `PUT`s start per second, across every task sharing it.
///
/// Each caller reserves the next free slot, `period` after the previous slot or now, whichever
/// is later, and sleeps until it: slots are at least `period` apart, the first is immediate,
/// and time spent idle does not accumulate into a burst.
#[derive(Debug)]
struct RateLimiter {
    period: Duration,
    next: Mutex<tokio::time::Instant>,
}

impl RateLimiter {
    /// A limiter for `per_second` starts a second, or `None` for `0` (no limit).
    fn new(per_second: u32) -> Option<Self> {
        if per_second == 0 {
            return None;
        }
        // Rounded up, so the rate never exceeds `per_second`.
        let nanos = 1_000_000_000u64.div_ceil(u64::from(per_second));
        Some(Self {
            period: Duration::from_nanos(nanos),
            next: Mutex::new(tokio::time::Instant::now()),
        })
    }

    /// Waits for this caller's turn.
    async fn wait_turn(&self) {
        let now = tokio::time::Instant::now();
        let slot = {
            let mut next = self.next.lock().expect("lock poisoned");
            let slot = (*next).max(now);
            *next = slot + self.period;
            slot
        };
        if slot > now {
            tokio::time::sleep_until(slot).await;
        }
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

async fn put_record(http: &reqwest::Client, url: Url, body: Bytes) -> Result<(), PutError> {
    let response = http
        .put(url)
        .body(body)
        .send()
        .await
        .map_err(PutError::Transport)?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let mut body = response.text().await.unwrap_or_default();
    if let Some((cut, _)) = body.char_indices().nth(200) {
        body.truncate(cut);
    }
    Err(PutError::Status { status, body })
}

/// Deletes the moved record's file, then flushes the directory so the deletion is durable.
async fn delete_record(dir: &Path, name: &str) -> Result<(), RedistributeError> {
    let dir = dir.to_path_buf();
    let path = dir.join(name);
    tokio::task::spawn_blocking(move || {
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(RedistributeError::DeleteRecord { path, source }),
        }
        fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| RedistributeError::DeleteRecord { path, source })
    })
    .await
    .map_err(RedistributeError::Task)?
}

/// The record files of `dir`, sorted by name, after checking that `dir` is a readable directory.
pub async fn list_records(dir: &Path) -> Result<Vec<String>, RedistributeError> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || list_records_blocking(&dir))
        .await
        .map_err(RedistributeError::Task)?
}

fn list_records_blocking(dir: &Path) -> Result<Vec<String>, RedistributeError> {
    let read_err = |source| RedistributeError::ReadDataDir {
        dir: dir.to_path_buf(),
        source,
    };
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(RedistributeError::DataDirNotADirectory {
                dir: dir.to_path_buf(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(RedistributeError::DataDirMissing {
                dir: dir.to_path_buf(),
            });
        }
        Err(e) => return Err(read_err(e)),
    }
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        let name = entry.file_name();
        if name.as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let file_type = entry.file_type().map_err(read_err)?;
        if file_type.is_file() {
            let name = name
                .into_string()
                .map_err(|_| RedistributeError::NonUtf8Name { path: entry.path() })?;
            names.push(name);
        } else if file_type.is_dir() && name == "lost+found" {
            continue;
        } else {
            let kind = if file_type.is_dir() {
                "directory"
            } else if file_type.is_symlink() {
                "symlink"
            } else {
                "special file"
            };
            return Err(RedistributeError::UnexpectedEntry {
                path: entry.path(),
                kind,
            });
        }
    }
    names.sort_unstable();
    Ok(names)
}

/// Counters for the progress log lines.
struct Progress {
    total: usize,
    records: u64,
    bytes: u64,
    started: Instant,
}

impl Progress {
    fn new(total: usize) -> Self {
        Self {
            total,
            records: 0,
            bytes: 0,
            started: Instant::now(),
        }
    }

    fn moved(&mut self, bytes: u64) {
        self.records += 1;
        self.bytes += bytes;
    }

    fn log(&self, message: &'static str) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        tracing::info!(
            records_moved = self.records,
            records_total = self.total,
            bytes_moved = self.bytes,
            elapsed_secs = format!("{secs:.1}"),
            records_per_sec = format!("{:.1}", self.records as f64 / secs),
            mib_per_sec = format!("{:.2}", self.bytes as f64 / secs / (1024.0 * 1024.0)),
            "{message}"
        );
    }
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

    #[tokio::test]
    async fn rate_limiter_lets_the_first_through_at_once_and_never_bursts() {
        use futures::FutureExt;

        assert!(RateLimiter::new(0).is_none(), "0 is no limit");
        assert_eq!(
            RateLimiter::new(3).unwrap().period,
            Duration::from_nanos(333_333_334),
            "rounded up"
        );
        assert_eq!(
            RateLimiter::new(u32::MAX).unwrap().period,
            Duration::from_nanos(1)
        );

        // One a second: the first is immediate, the second must wait.
        let limiter = RateLimiter::new(1).unwrap();
        assert!(limiter.wait_turn().now_or_never().is_some());
        assert!(limiter.wait_turn().now_or_never().is_none());

        // Idle time does not build up a burst: after a pause, one goes through, not several.
        let limiter = RateLimiter::new(10).unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(limiter.wait_turn().now_or_never().is_some());
        assert!(limiter.wait_turn().now_or_never().is_none());
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
        for code in [400, 403, 404, 409, 413, 301] {
            assert!(!status(code).is_transient(), "{code}");
        }
    }

    #[tokio::test]
    async fn lists_records_and_checks_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        assert!(matches!(
            list_records(&missing).await,
            Err(RedistributeError::DataDirMissing { .. })
        ));
        let file = dir.path().join("file");
        fs::write(&file, b"x").unwrap();
        assert!(matches!(
            list_records(&file).await,
            Err(RedistributeError::DataDirNotADirectory { .. })
        ));

        let data = dir.path().join("data");
        fs::create_dir(&data).unwrap();
        assert!(list_records(&data).await.unwrap().is_empty());
        fs::write(data.join("b"), b"2").unwrap();
        fs::write(data.join("a"), b"1").unwrap();
        fs::write(data.join(".tmp-1"), b"partial").unwrap();
        fs::create_dir(data.join("lost+found")).unwrap();
        fs::create_dir(data.join(".hidden-dir")).unwrap();
        assert_eq!(list_records(&data).await.unwrap(), ["a", "b"]);

        fs::create_dir(data.join("nested")).unwrap();
        assert!(matches!(
            list_records(&data).await,
            Err(RedistributeError::UnexpectedEntry {
                kind: "directory",
                ..
            })
        ));
    }
}
