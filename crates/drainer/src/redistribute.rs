//! Built-in mode: moves every record file of the data directory to the peer that owns its key.
//!
//! The data directory holds one file per record, named after its key (the datastore's format).
//! It must be the drained claim's mount point ([`records::check_data_dir`]): an empty directory
//! that is not the claim would otherwise "succeed" and the controller would delete the claim.
//! The datastore's own files (unfinished writes, its clock) and an empty `lost+found` are
//! skipped, and listed in the log and the [`Summary`]. Any other entry that is not a record (a
//! subdirectory, another dot file, a name that is not a valid key, a `lost+found` holding
//! recovered files: [`records::Foreign`]) fails the drain by name once the records have moved,
//! so the claim stays, unless [`Options::leave_behind`] names it.
//!
//! Each record is streamed to `<owner>/records/<key>` as a versioned handover `PUT` (see
//! [`transfer`] for the peer contract), the owner being
//! [`placement::owner`](crate::placement::owner) over the set's live members. The owner keeps
//! the newer of its copy and this one (a value written there after the scale-down is newer and
//! stays; a key deleted there stays deleted), and its local file is deleted only once the
//! owner answered that it holds this version or a newer one.
//!
//! Restart-safe: a rerun lists the files still there and sends them again; one that was
//! delivered but not yet deleted is acknowledged again and deleted. The same holds inside one run,
//! which works in *rounds*: when an owner is not Ready or stops answering, its records wait,
//! peers are discovered again after a backoff, and the next round retries what is left.
//!
//! [`Options::max_rate`] caps how many `PUT`s start per second, across all concurrent ones, so
//! a drain does not overload the remaining pods. Progress is logged and, in a drain pod,
//! published on the pod ([`PodAnnotator`]).

pub mod claimed;
mod errors;
mod progress;
pub(crate) mod rate;
pub mod records;
pub mod transfer;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder, Retryable};
use futures::StreamExt;

use crate::peers::{Peer, PeerSet, PeerSource};
pub use errors::{Foreign, RedistributeError};
pub use progress::PodAnnotator;
use progress::Progress;
use rate::RateLimiter;
pub use records::{Listing, Mounted, check_data_dir, list_records};
pub use transfer::{CHUNK_BYTES, Delivered, PutError, record_url};

/// How a redistribution runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Directory holding one file per record: the drained claim's mount point.
    pub data_dir: PathBuf,
    /// Accept a data directory that is not a mount point (the claim is mounted above it).
    pub allow_unmounted: bool,
    /// Records in flight at once.
    pub concurrency: usize,
    /// Records sent per second at most, across all concurrent `PUT`s; `0` means no limit.
    /// Every `PUT`, a retry too, waits for its turn: they start at least `1/max_rate` seconds
    /// apart (the first at once), and idle time does not build up a burst.
    pub max_rate: u32,
    /// Bytes of record values sent per second at most, across all concurrent `PUT`s; `0`
    /// means no limit. Caps the bandwidth a drain of large records takes from the peers.
    pub max_bytes_per_second: u64,
    /// Retries of one `PUT` after a connection error, an idle timeout, or a `5xx`/`408`/`429`.
    pub put_retries: usize,
    /// First delay between `PUT` retries (doubles each time, with jitter).
    pub put_retry_delay: Duration,
    /// Rounds at most (discover peers, send what is left) before giving up.
    pub max_rounds: usize,
    /// Delay before the second round; doubles each round, capped at [`MAX_ROUND_DELAY`] (or
    /// at this value if it is larger).
    pub round_delay: Duration,
    /// A `PUT` fails when no byte moved and no answer came for this long.
    pub idle_timeout: Duration,
    /// Interval between progress log lines and progress publishes.
    pub progress_interval: Duration,
    /// Where progress is published (the drain pod), if anywhere.
    pub progress: Option<PodAnnotator>,
    /// Entries that are not records but may stay on the claim and go with it: exact names, or
    /// prefixes ending with `*`. Any other such entry fails the drain.
    pub leave_behind: Vec<String>,
}

/// Longest wait between rounds.
pub const MAX_ROUND_DELAY: Duration = Duration::from_secs(30);

impl Options {
    /// Defaults for `data_dir`: must be a mount point, 8 in flight, no rate limit, 5 retries
    /// from 200ms, 6 rounds from 2s, 60s idle timeout, progress every 5s, not published.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            allow_unmounted: false,
            concurrency: 8,
            max_rate: 0,
            max_bytes_per_second: 0,
            put_retries: 5,
            put_retry_delay: Duration::from_millis(200),
            max_rounds: 6,
            round_delay: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(60),
            progress_interval: Duration::from_secs(5),
            progress: None,
            leave_behind: Vec::new(),
        }
    }
}

/// What a successful redistribution did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Records handed over (their owner stored them or already held them) and deleted locally.
    pub records: u64,
    /// Bytes of those records.
    pub bytes: u64,
    /// Of those records, the ones whose owner held a newer write of the key: not overwritten.
    pub newer_there: u64,
    /// Entries of the data directory that hold no record and were left in place: the
    /// datastore's own files, an empty `lost+found`, and those [`Options::leave_behind`] names.
    pub skipped: Vec<String>,
    /// Rounds run (0 if the data directory held no records).
    pub rounds: usize,
}

/// Moves every record in `options.data_dir` to its owner among the peers from `peers`.
///
/// Steps: check that the data directory is the claim's mount point, list the record files (no
/// records succeeds at once, without discovery); then rounds of: discover peers → stream each
/// record to its owner and delete it once handed over (bounded concurrency, each `PUT` retried
/// on transient failures) → list what is left. Records whose owner is not Ready or not
/// answering wait for the next round; a peer refusing a record ends the run at once.
pub async fn redistribute<P: PeerSource>(
    options: &Options,
    peers: &P,
) -> Result<Summary, RedistributeError> {
    let dir = options.data_dir.as_path();
    let mounted = check_data_dir(dir, options.allow_unmounted)?;
    let recovered = claimed::recover_claims(dir).await?;
    if recovered > 0 {
        tracing::info!(
            recovered,
            "put back records an interrupted rebalance had claimed"
        );
    }
    let listing = list_records(dir).await?;
    let (skipped, foreign) = sort_out(&listing, &options.leave_behind);
    if !skipped.is_empty() {
        tracing::info!(data_dir = %dir.display(), ?skipped, "entries that hold no record stay on the claim");
    }
    let not_records = |foreign: Vec<Foreign>| RedistributeError::NotRecords {
        dir: dir.to_path_buf(),
        entries: foreign,
    };
    if !foreign.is_empty() {
        let named: Vec<String> = foreign.iter().map(ToString::to_string).collect();
        tracing::warn!(data_dir = %dir.display(), entries = ?named, "entries that are not records: the records move, then the drain fails and the claim stays");
    }
    if listing.records.is_empty() {
        if !foreign.is_empty() {
            return Err(not_records(foreign));
        }
        tracing::info!(data_dir = %dir.display(), ?mounted, "data directory holds no records, nothing to move");
        return Ok(Summary {
            skipped,
            ..Summary::default()
        });
    }
    let http = transfer::client(options.idle_timeout).map_err(RedistributeError::HttpClient)?;
    let limiter = RateLimiter::new(options.max_rate.into());
    let wire = transfer::Wire::new(options.max_bytes_per_second);
    let mut progress = Progress::new(
        listing.records.len(),
        listing.bytes(),
        options.progress.clone(),
        wire.counter(),
    );
    tracing::info!(
        data_dir = %dir.display(),
        ?mounted,
        records = listing.records.len(),
        bytes = listing.bytes(),
        max_rate = options.max_rate,
        max_bytes_per_second = options.max_bytes_per_second,
        "starting redistribution"
    );
    progress.publish().await;
    let mut names = listing.names();
    let mut round_delays = ExponentialBuilder::default()
        .with_min_delay(options.round_delay)
        .with_max_delay(options.round_delay.max(MAX_ROUND_DELAY))
        .with_max_times(options.max_rounds.saturating_sub(1))
        .build();
    let mut rounds = 0;
    let mut foreign_left;
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
                    source: peers,
                    fresh: tokio::sync::Mutex::default(),
                    limiter: limiter.as_ref(),
                    wire: &wire,
                    down: Mutex::default(),
                };
                round.run(std::mem::take(&mut names), &mut progress).await?
            }
        };
        records::sync_dir(dir).await?;
        let left = list_records(dir).await?;
        foreign_left = sort_out(&left, &options.leave_behind).1;
        names = left.names();
        progress.at_least(names.len(), left.bytes());
        progress.publish().await;
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
            error = %drain_logging::error_chain(&deferral),
            "records left for the next round"
        );
        tokio::time::sleep(delay).await;
    }
    progress.log("redistribution finished");
    if !foreign_left.is_empty() {
        return Err(not_records(foreign_left));
    }
    Ok(Summary {
        records: progress.records,
        bytes: progress.bytes,
        newer_there: progress.newer_there,
        skipped,
        rounds,
    })
}

/// The entries of `listing` left on the claim (its skipped ones and the foreign ones
/// `leave_behind` names), and the foreign ones that fail the drain.
fn sort_out(listing: &Listing, leave_behind: &[String]) -> (Vec<String>, Vec<Foreign>) {
    let mut skipped = listing.skipped.clone();
    let mut foreign = Vec::new();
    for entry in &listing.foreign {
        if records::matches_any(&entry.name, leave_behind) {
            skipped.push(entry.name.clone());
        } else {
            foreign.push(entry.clone());
        }
    }
    skipped.sort_unstable();
    (skipped, foreign)
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
    /// Handed over and deleted locally.
    Moved { bytes: u64, newer_there: bool },
    /// Its file was gone already.
    Gone,
    /// Left for the next round, with the reason (`None`: its owner already failed this round).
    Deferred(Option<RedistributeError>),
}

/// One pass over the records with one peer set.
struct Round<'a, P> {
    options: &'a Options,
    http: &'a reqwest::Client,
    peers: &'a PeerSet,
    /// Spaces out the `PUT`s (`None`: no limit). Shared by the rounds of a run.
    limiter: Option<&'a RateLimiter>,
    /// Caps and counts the bytes sent. Shared by the rounds of a run.
    wire: &'a transfer::Wire,
    /// Where peers come from: asked again when an owner's address fails mid-round.
    source: &'a P,
    /// The last discovery made mid-round, and when.
    fresh: tokio::sync::Mutex<Fresh>,
    /// Owners that stopped answering this round: their other records wait for the next one.
    down: Mutex<HashSet<i32>>,
}

/// A discovery made mid-round.
#[derive(Default)]
struct Fresh {
    at: Option<tokio::time::Instant>,
    set: Option<PeerSet>,
}

/// Shortest time between two discoveries made mid-round.
pub const READDRESS_EVERY: Duration = Duration::from_secs(1);

impl<P: PeerSource> Round<'_, P> {
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
                    Some(Ok(Outcome::Moved { bytes, newer_there })) => progress.moved(bytes, newer_there),
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
                _ = ticker.tick() => {
                    progress.log("redistribution progress");
                    progress.publish().await;
                }
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
        let mut peer = peer.clone();
        let mut result = self.send(&name, &path, &peer).await;
        // The owner's address failed or answers as another pod: its pod may have been replaced
        // (a new IP). Ask the API again and, if the address changed, send there at once.
        if let Err(e) = &result
            && (e.is_transient() || matches!(e, PutError::Misdirected { .. }))
            && let Some(moved) = self.readdress(owner, &peer).await
        {
            tracing::info!(key = %name, peer = %peer.name, from = %peer.url, to = %moved.url, "the owner's address changed mid-round; sending there");
            peer = moved;
            result = self.send(&name, &path, &peer).await;
        }
        let peer = &peer;
        let url = transfer::record_url(&peer.url, &name);
        let transfer::Handed {
            delivered, bytes, ..
        } = match result {
            Ok(Some(done)) => done,
            Ok(None) => return Ok(Outcome::Gone),
            // Unreachable, or its address now answers as another pod: wait for the next round,
            // which discovers the peers (and their addresses) again.
            Err(source)
                if source.is_transient() || matches!(source, PutError::Misdirected { .. }) =>
            {
                self.down.lock().expect("lock poisoned").insert(owner);
                tracing::warn!(peer = %peer.name, key = %name, error = %drain_logging::error_chain(&source), "peer not accepting records");
                return Ok(Outcome::Deferred(Some(
                    RedistributeError::PeerUnavailable {
                        key: name,
                        peer: peer.name.clone(),
                        url: url.to_string(),
                        source,
                    },
                )));
            }
            Err(source @ PutError::ReadFile(_)) => {
                return Err(RedistributeError::ReadRecord { path, source });
            }
            Err(PutError::TooLarge { bytes, body }) => {
                return Err(RedistributeError::RecordTooLarge {
                    key: name,
                    peer: peer.name.clone(),
                    bytes,
                    source: PutError::TooLarge { bytes, body },
                });
            }
            Err(source) => {
                return Err(RedistributeError::PeerRefused {
                    key: name,
                    peer: peer.name.clone(),
                    url: url.to_string(),
                    source,
                });
            }
        };
        let newer_there = delivered == Delivered::NewerThere;
        if newer_there {
            tracing::info!(key = %name, peer = %peer.name, "owner holds a newer write of the key; its copy is kept and the local one is done");
        }
        records::delete_record(&self.options.data_dir, &name).await?;
        Ok(Outcome::Moved { bytes, newer_there })
    }

    /// One record's `PUT` to `peer`, retried on transient failures.
    async fn send(
        &self,
        name: &str,
        path: &std::path::Path,
        peer: &Peer,
    ) -> Result<Option<transfer::Handed>, PutError> {
        let url = transfer::record_url(&peer.url, name);
        let backoff = ExponentialBuilder::default()
            .with_min_delay(self.options.put_retry_delay)
            .with_max_delay(self.options.put_retry_delay.max(Duration::from_secs(10)))
            .with_max_times(self.options.put_retries)
            .with_jitter();
        let put = || async {
            if let Some(limiter) = self.limiter {
                limiter.wait_turn().await;
            }
            transfer::put_record(
                self.http,
                url.clone(),
                path,
                self.options.idle_timeout,
                Some(transfer::Owner::of(peer)),
                self.wire,
            )
            .await
        };
        put.retry(backoff)
            .when(PutError::is_transient)
            .notify(|e, delay| {
                tracing::debug!(key = %name, peer = %peer.name, retry_in = ?delay, error = %drain_logging::error_chain(e), "retrying put");
            })
            .await
    }

    /// A new address for `owner`, after `used` failed: peers are discovered again (at most
    /// once per [`READDRESS_EVERY`], shared by the round's records); `None` if the owner is not
    /// Ready now or its address and UID did not change.
    async fn readdress(&self, owner: i32, used: &Peer) -> Option<Peer> {
        let mut fresh = self.fresh.lock().await;
        if fresh.at.is_none_or(|at| at.elapsed() >= READDRESS_EVERY) {
            fresh.at = Some(tokio::time::Instant::now());
            match self.source.discover().await {
                Ok(set) => fresh.set = Some(set),
                Err(e) => {
                    tracing::warn!(error = %drain_logging::error_chain(&e), "failed to discover peers again mid-round");
                }
            }
        }
        let now = fresh.set.as_ref()?.ready_peer(owner)?;
        (now.url != used.url || now.uid != used.uid).then(|| now.clone())
    }

    fn is_down(&self, ordinal: i32) -> bool {
        self.down.lock().expect("lock poisoned").contains(&ordinal)
    }
}
