//! Rebalance mode: moves the records a *running* pod holds but no longer owns to their owners.
//!
//! After a scale-down the drain put the drained ordinal's keys on the remaining pods. When the
//! set is scaled up again the returning ordinals own those keys once more (by
//! [`placement::owner`](crate::placement::owner) over the live members), but they sit on the
//! pods that received them, or were written there by clients meanwhile. `drainer rebalance`,
//! run next to the app in each pod (a sidecar, every `--interval`), hands each record whose
//! owner is another live member over to it, so a client that routes by the same hash finds
//! every key. The same happens after a drain that a scale-up cancelled: the returning pod holds
//! its old copies, and the newer writes clients made on the interim owners replace them.
//!
//! Each record (a value or a tombstone) is sent with its version, as a drain sends it
//! ([`transfer`](crate::redistribute::transfer)); the owner keeps the newer copy. Once the owner
//! answered that it holds this version or a newer one, the local copy is *released* through
//! the local server (`POST /records/{key}/release` with the version): the server removes it
//! only if it is still that version, under the same lock as its writes, so a client's write
//! that arrived meanwhile stays (and moves on the next pass). Nothing here renames or deletes
//! a file the server may be writing. A pod that is not a live member itself (being scaled
//! down) moves nothing: its drain does that.
//!
//! Earlier versions claimed a record by renaming it to `.rebalance-<key>` before sending it;
//! such a file left by a crash is handed to the local server (which keeps the newer copy) and
//! then removed, and a drain puts it back the same way before it starts.

use std::path::Path;
use std::time::Duration;

use drain_api::record::{VERSION_HEADER, Version};
use futures::StreamExt;
use reqwest::StatusCode;
use url::Url;

use crate::peers::{PeerSet, PeerSource};
use crate::placement;
use crate::redistribute::claimed::remove;
use crate::redistribute::rate::RateLimiter;
use crate::redistribute::transfer::{self, Delivered};
use crate::redistribute::{RedistributeError, list_records};

pub use crate::redistribute::claimed::recover_claims;
pub use crate::redistribute::records::CLAIM_PREFIX;

/// How a rebalance pass runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// The pod's data directory (one file per record).
    pub data_dir: std::path::PathBuf,
    /// The pod's own server (releases and recovered claims go there).
    pub local: Url,
    /// Records in flight at once.
    pub concurrency: usize,
    /// Records sent per second at most; `0` is no limit.
    pub max_rate: u32,
    /// Bytes of record values sent per second at most; `0` is no limit.
    pub max_bytes_per_second: u64,
    /// A `PUT` fails when nothing moved for this long.
    pub idle_timeout: Duration,
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Records handed to their owner (stored, or a newer write there) and released here.
    pub moved: u64,
    /// Of those, the ones whose owner held a newer write.
    pub newer_there: u64,
    /// Records whose owner is another member but not Ready, that failed, or that a newer write
    /// here replaced meanwhile: left for later.
    pub deferred: u64,
    /// Claimed files of an earlier version's interrupted pass, handed back to the local server.
    pub recovered: u64,
    /// Whether this pod is a live member (a pod being scaled down moves nothing).
    pub member: bool,
}

/// One pass: hand claims of an interrupted earlier pass back, discover the members, move every
/// record this pod (`own` ordinal, the "drained" ordinal of `peers`' target) does not own.
pub async fn rebalance_once<P: PeerSource>(
    options: &Options,
    own: i32,
    peers: &P,
) -> Result<Pass, RedistributeError> {
    let dir = options.data_dir.as_path();
    let http = transfer::client(options.idle_timeout).map_err(RedistributeError::HttpClient)?;
    let mut pass = Pass {
        recovered: recover_claims_through(&http, options, dir).await?,
        ..Pass::default()
    };
    let set = peers
        .discover()
        .await
        .map_err(|e| RedistributeError::Discover(Box::new(e)))?;
    if !set.drained_in_range {
        return Ok(pass);
    }
    pass.member = true;
    let mut members = set.members.clone();
    members.push(own);
    members.sort_unstable();
    let listing = list_records(dir).await?;
    let moves: Vec<(String, i32)> = listing
        .records
        .into_iter()
        .filter_map(|(key, _)| {
            let owner = placement::try_owner(&key, &members)?;
            (owner != own).then_some((key, owner))
        })
        .collect();
    if moves.is_empty() {
        return Ok(pass);
    }
    tracing::info!(
        records = moves.len(),
        ?members,
        "moving records this pod does not own"
    );
    let limiter = RateLimiter::new(options.max_rate.into());
    let wire = transfer::Wire::new(options.max_bytes_per_second);
    let results: Vec<Option<Delivered>> = futures::stream::iter(moves)
        .map(|(key, owner)| move_one(options, &http, limiter.as_ref(), &wire, &set, key, owner))
        .buffer_unordered(options.concurrency.max(1))
        .collect()
        .await;
    for result in results {
        match result {
            Some(Delivered::Stored) => pass.moved += 1,
            Some(Delivered::NewerThere) => {
                pass.moved += 1;
                pass.newer_there += 1;
            }
            None => pass.deferred += 1,
        }
    }
    Ok(pass)
}

/// Hands one record over and releases it here; `None` if it stays for a later pass.
async fn move_one(
    options: &Options,
    http: &reqwest::Client,
    limiter: Option<&RateLimiter>,
    wire: &transfer::Wire,
    set: &PeerSet,
    key: String,
    owner: i32,
) -> Option<Delivered> {
    let peer = set.ready_peer(owner)?;
    let path = options.data_dir.join(&key);
    if let Some(limiter) = limiter {
        limiter.wait_turn().await;
    }
    let url = transfer::record_url(&peer.url, &key);
    let owner = Some(transfer::Owner::of(peer));
    let handed = match transfer::put_record(http, url, &path, options.idle_timeout, owner, wire)
        .await
    {
        Ok(Some(handed)) => handed,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(%key, peer = %peer.name, error = %drain_logging::error_chain(&e), "record not moved; it stays for a later pass");
            return None;
        }
    };
    match release(http, &options.local, &key, &handed.sent.version).await {
        Ok(true) => {
            tracing::debug!(%key, peer = %peer.name, delivered = ?handed.delivered, "record moved to its owner");
            Some(handed.delivered)
        }
        Ok(false) => {
            tracing::debug!(%key, "a newer write arrived here meanwhile; it moves on the next pass");
            None
        }
        Err(e) => {
            tracing::warn!(%key, error = %e, "the owner holds the record but the local copy was not released; the next pass sends it again");
            None
        }
    }
}

/// Asks the local server to remove its copy of `key` if it is still of `version`: `true` if
/// removed (or gone), `false` if a newer write is there.
async fn release(
    http: &reqwest::Client,
    local: &Url,
    key: &str,
    version: &Version,
) -> Result<bool, String> {
    let mut url = transfer::record_url(local, key);
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.push("release");
    }
    let response = http
        .post(url)
        .header(VERSION_HEADER, version.to_string())
        .send()
        .await
        .map_err(|e| drain_logging::error_chain(&e))?;
    match response.status() {
        StatusCode::OK | StatusCode::NO_CONTENT => Ok(true),
        StatusCode::CONFLICT => Ok(false),
        status => Err(format!("local server answered {status} to the release")),
    }
}

/// Hands every claimed file an earlier version's interrupted pass left to the local server
/// (which keeps the newer of it and its current copy) and removes it once acknowledged.
async fn recover_claims_through(
    http: &reqwest::Client,
    options: &Options,
    dir: &Path,
) -> Result<u64, RedistributeError> {
    let listing = list_records(dir).await?;
    let mut recovered = 0;
    for name in listing.skipped {
        let Some(key) = name.strip_prefix(CLAIM_PREFIX) else {
            continue;
        };
        let claimed = dir.join(&name);
        let url = transfer::record_url(&options.local, key);
        match transfer::put_record(
            http,
            url,
            &claimed,
            options.idle_timeout,
            None,
            &transfer::Wire::default(),
        )
        .await
        {
            Ok(Some(_)) => {
                remove(&claimed)?;
                recovered += 1;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(file = %name, error = %drain_logging::error_chain(&e), "claimed record not handed back yet");
            }
        }
    }
    Ok(recovered)
}
