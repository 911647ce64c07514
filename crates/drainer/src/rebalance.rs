//! Rebalance mode: moves the records a *running* pod holds but no longer owns to their owners.
//!
//! After a scale-down the drain put the drained ordinal's keys on the remaining pods. When the
//! set is scaled up again the returning ordinals own those keys once more (by
//! [`placement::owner`](crate::placement::owner) over the live members), but they sit on the
//! pods that received them. `drainer rebalance`, run next to the app in each pod (a sidecar,
//! every `--interval`), sends each record whose owner is another live member to it, so a
//! client that routes by the same hash finds every key. The same happens after a drain that a
//! scale-up cancelled: what the drain had moved goes back to the returning pod.
//!
//! Each record is first *claimed*: its file is renamed to `.rebalance-<key>` (the datastore
//! neither lists nor serves dot files), then streamed to its owner with the same create-only
//! `PUT` as a drain ([`transfer`](crate::redistribute::transfer)). Only when the owner stored it
//! or already held the key (`412`: its value wins) is the claimed file deleted; otherwise it is
//! put back, unless a newer write of the key arrived meanwhile, which then wins. A claimed file
//! left by a crash is put back (or dropped for a newer one) on the next pass. A pod that is not
//! a live member itself (being scaled down) moves nothing: its drain does that.

use std::fs;
use std::io;
use std::path::Path;
use std::time::Duration;

use futures::StreamExt;

use crate::peers::{PeerSet, PeerSource};
use crate::placement;
use crate::redistribute::rate::RateLimiter;
use crate::redistribute::transfer::{self, Delivered};
use crate::redistribute::{RedistributeError, list_records};

/// Prefix of a record file claimed for a move.
pub const CLAIM_PREFIX: &str = ".rebalance-";

/// How a rebalance pass runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// The pod's data directory (one file per record).
    pub data_dir: std::path::PathBuf,
    /// Records in flight at once.
    pub concurrency: usize,
    /// Records sent per second at most; `0` is no limit.
    pub max_rate: u32,
    /// A `PUT` fails when nothing moved for this long.
    pub idle_timeout: Duration,
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Records handed to their owner (stored or already there) and deleted here.
    pub moved: u64,
    /// Of those, the ones the owner already held.
    pub already_there: u64,
    /// Records whose owner is another member but not Ready, or that failed: left for later.
    pub deferred: u64,
    /// Claimed files of an interrupted pass that were put back.
    pub recovered: u64,
    /// Whether this pod is a live member (a pod being scaled down moves nothing).
    pub member: bool,
}

/// One pass: put back claims of an interrupted pass, discover the members, move every record
/// this pod (`own` ordinal, the "drained" ordinal of `peers`' target) does not own.
pub async fn rebalance_once<P: PeerSource>(
    options: &Options,
    own: i32,
    peers: &P,
) -> Result<Pass, RedistributeError> {
    let dir = options.data_dir.as_path();
    let mut pass = Pass {
        recovered: recover_claims(dir).await?,
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
    let http = transfer::client(options.idle_timeout).map_err(RedistributeError::HttpClient)?;
    let limiter = RateLimiter::new(options.max_rate);
    let results: Vec<Result<Option<Delivered>, RedistributeError>> = futures::stream::iter(moves)
        .map(|(key, owner)| move_one(options, &http, limiter.as_ref(), &set, key, owner))
        .buffer_unordered(options.concurrency.max(1))
        .collect()
        .await;
    for result in results {
        match result? {
            Some(Delivered::Stored) => pass.moved += 1,
            Some(Delivered::AlreadyThere) => {
                pass.moved += 1;
                pass.already_there += 1;
            }
            None => pass.deferred += 1,
        }
    }
    Ok(pass)
}

/// Claims, sends and deletes one record; `None` if it stays for a later pass.
async fn move_one(
    options: &Options,
    http: &reqwest::Client,
    limiter: Option<&RateLimiter>,
    set: &PeerSet,
    key: String,
    owner: i32,
) -> Result<Option<Delivered>, RedistributeError> {
    let Some(peer) = set.ready_peer(owner) else {
        return Ok(None);
    };
    let dir = options.data_dir.as_path();
    let path = dir.join(&key);
    let claimed = dir.join(format!("{CLAIM_PREFIX}{key}"));
    match fs::rename(&path, &claimed) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(RedistributeError::DeleteRecord { path, source }),
    }
    if let Some(limiter) = limiter {
        limiter.wait_turn().await;
    }
    let url = transfer::record_url(&peer.url, &key);
    match transfer::put_record(http, url, &claimed, options.idle_timeout).await {
        Ok(Some((delivered, _))) => {
            fs::remove_file(&claimed).map_err(|source| RedistributeError::DeleteRecord {
                path: claimed,
                source,
            })?;
            tracing::debug!(%key, peer = %peer.name, ?delivered, "record moved to its owner");
            Ok(Some(delivered))
        }
        Ok(None) => Ok(None),
        Err(e) => {
            tracing::warn!(%key, peer = %peer.name, error = %crate::error_chain(&e), "record not moved; it stays for a later pass");
            put_back(&claimed, &path)?;
            Ok(None)
        }
    }
}

/// Moves a claimed file back to its record name, unless a newer write of the key is there:
/// then the claimed (older) copy is dropped.
fn put_back(claimed: &Path, path: &Path) -> Result<(), RedistributeError> {
    let err = |source| RedistributeError::DeleteRecord {
        path: claimed.to_path_buf(),
        source,
    };
    // A hard link fails if the name exists: the put-back never replaces a newer record.
    match fs::hard_link(claimed, path) {
        Ok(()) => fs::remove_file(claimed).map_err(err),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => fs::remove_file(claimed).map_err(err),
        Err(e) => Err(err(e)),
    }
}

/// Puts back every claimed file an interrupted pass left; returns how many. A drain does this
/// first too: a claimed file is a record, and must not stay behind on a claim about to go.
pub async fn recover_claims(dir: &Path) -> Result<u64, RedistributeError> {
    let listing = list_records(dir).await?;
    let mut recovered = 0;
    for name in listing.skipped {
        let Some(key) = name.strip_prefix(CLAIM_PREFIX) else {
            continue;
        };
        put_back(&dir.join(&name), &dir.join(key))?;
        recovered += 1;
    }
    Ok(recovered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_back_never_replaces_a_newer_record() {
        let dir = tempfile::tempdir().unwrap();
        let (claimed, path) = (dir.path().join(".rebalance-k"), dir.path().join("k"));
        fs::write(&claimed, b"old").unwrap();
        put_back(&claimed, &path).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert!(!claimed.exists());

        fs::write(&claimed, b"older").unwrap();
        put_back(&claimed, &path).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"old", "the record there wins");
        assert!(!claimed.exists());
    }

    #[tokio::test]
    async fn claims_of_an_interrupted_pass_are_put_back() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".rebalance-a"), b"1").unwrap();
        fs::write(dir.path().join(".rebalance-b"), b"old").unwrap();
        fs::write(dir.path().join("b"), b"new").unwrap();
        fs::write(dir.path().join(".tmp-x"), b"partial").unwrap();
        assert_eq!(recover_claims(dir.path()).await.unwrap(), 2);
        assert_eq!(fs::read(dir.path().join("a")).unwrap(), b"1");
        assert_eq!(fs::read(dir.path().join("b")).unwrap(), b"new");
        assert!(
            dir.path().join(".tmp-x").exists(),
            "other dot files are not ours"
        );
    }
}
