//! Record files claimed by an interrupted rebalance pass (`.rebalance-<key>`): a claimed file is
//! a record moved aside, and goes back under its key unless the record there is newer. Below both
//! the drain (`redistribute`) and `rebalance`, which share it.

use std::fs;
use std::io;
use std::path::Path;

use drain_api::record::Header;

use super::errors::RedistributeError;
use super::records::{CLAIM_PREFIX, list_records};

/// In a drain pod (nothing else writes the claim): puts every claimed file an earlier
/// version's interrupted rebalance left back under its key, unless the record there is newer;
/// returns how many. A claimed file is a record, and must not stay behind on a claim about to go.
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

/// Moves a claimed file back to its record name if it is newer than the record there (or there
/// is none); otherwise drops it.
pub(crate) fn put_back(claimed: &Path, path: &Path) -> Result<(), RedistributeError> {
    let err = |source| RedistributeError::DeleteRecord {
        path: claimed.to_path_buf(),
        source,
    };
    let claimed_version = header_at(claimed).map_err(err)?.map(|h| h.version);
    let here = header_at(path).map_err(err)?.map(|h| h.version);
    match (claimed_version, here) {
        (Some(claimed_version), Some(here)) if claimed_version <= here => remove(claimed),
        (Some(_), _) => fs::rename(claimed, path).map_err(err),
        (None, _) => Ok(()),
    }
}

/// The header of the record file at `path`, or `None` if there is none.
fn header_at(path: &Path) -> io::Result<Option<Header>> {
    use std::io::Read;
    let file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut prefix = Vec::new();
    file.take(drain_api::record::HEADER_LEN as u64)
        .read_to_end(&mut prefix)?;
    Ok(Some(Header::of_file(&prefix).0))
}

pub(crate) fn remove(path: &Path) -> Result<(), RedistributeError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(RedistributeError::DeleteRecord {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drain_api::record::{Kind, Version};

    fn versioned(millis: u64, value: &[u8]) -> Vec<u8> {
        let header = Header {
            kind: Kind::Value,
            version: Version {
                millis,
                counter: 0,
                node: "n".into(),
            },
        };
        [&header.encode()[..], value].concat()
    }

    #[test]
    fn put_back_keeps_the_newer_copy() {
        let dir = tempfile::tempdir().unwrap();
        let (claimed, path) = (dir.path().join(".rebalance-k"), dir.path().join("k"));
        fs::write(&claimed, versioned(5, b"old")).unwrap();
        put_back(&claimed, &path).unwrap();
        assert_eq!(fs::read(&path).unwrap(), versioned(5, b"old"));
        assert!(!claimed.exists());

        fs::write(&claimed, versioned(3, b"older")).unwrap();
        put_back(&claimed, &path).unwrap();
        assert_eq!(
            fs::read(&path).unwrap(),
            versioned(5, b"old"),
            "the newer record there wins"
        );
        assert!(!claimed.exists());

        fs::write(&claimed, versioned(9, b"newest")).unwrap();
        put_back(&claimed, &path).unwrap();
        assert_eq!(
            fs::read(&path).unwrap(),
            versioned(9, b"newest"),
            "a claimed copy newer than the record there wins"
        );
    }

    #[tokio::test]
    async fn claims_of_an_interrupted_pass_are_put_back() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".rebalance-a"), b"1").unwrap();
        fs::write(dir.path().join(".rebalance-b"), versioned(1, b"old")).unwrap();
        fs::write(dir.path().join("b"), versioned(2, b"new")).unwrap();
        fs::write(dir.path().join(".tmp-x"), b"partial").unwrap();
        assert_eq!(recover_claims(dir.path()).await.unwrap(), 2);
        assert_eq!(fs::read(dir.path().join("a")).unwrap(), b"1");
        assert_eq!(
            fs::read(dir.path().join("b")).unwrap(),
            versioned(2, b"new")
        );
        assert!(
            dir.path().join(".tmp-x").exists(),
            "other dot files are not ours"
        );
    }
}
