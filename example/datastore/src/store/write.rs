//! The write path: stream the value into a temporary file behind a blank header; then, under the
//! key's lock, decide the version, write the header, `fsync` the file, rename it into place and
//! `fsync` the directory.
//!
//! What is decided under the lock depends on the kind of write ([`Commit`]):
//! - a client write or delete gets a new version, higher than the key's copy here;
//! - a create-only write is stored only if the key has no live value here;
//! - a handover keeps the higher of the copy here and the one sent ([`record::keeps_incoming`]).
//!
//! When the copy here stays, the directory is still flushed before the answer, so the copy that
//! the answer vouches for is durable.

use std::fs::{File, Permissions};
use std::io;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use drain_api::record::{self, HEADER_LEN, Header, Kind, Version};
use tempfile::TempPath;
use tokio::io::AsyncWriteExt;

use super::{Key, Shared, StoreError, TEMP_PREFIX, read_header};

/// What a create-only write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Created {
    /// The record was new (or deleted) and is now durably stored.
    Created,
    /// A record of that key already existed and was left unchanged.
    Exists,
}

/// The decision a commit makes under the key's lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Commit {
    /// A client's write (`kind` value) or delete (`kind` tombstone): a new version.
    Write(Kind),
    /// A client's create-only write.
    CreateOnly,
    /// A copy handed over with its header: the higher version stays.
    Handover(Header),
}

/// What a commit left in place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Committed {
    /// This write was stored, with this header.
    Stored(Header),
    /// The copy here was kept (create-only over a value, or a handover of a version not higher).
    Kept(Header),
}

/// A record being written: a temporary file in the data directory, invisible to readers and
/// listings until committed. Dropping it (an error, a body that broke off, a cancelled request)
/// removes the temporary file.
#[derive(Debug)]
pub struct PendingRecord {
    shared: Arc<Shared>,
    key: Key,
    file: tokio::fs::File,
    /// Removes the temporary file when dropped, unless it was persisted.
    path: TempPath,
    len: u64,
}

impl PendingRecord {
    /// Creates the temporary file for `key`, starting with a blank header.
    pub(super) async fn begin(shared: Arc<Shared>, key: Key) -> Result<Self, StoreError> {
        let dir = shared.dir.clone();
        let created = tokio::task::spawn_blocking(move || {
            tempfile::Builder::new()
                .prefix(TEMP_PREFIX)
                .permissions(Permissions::from_mode(0o644))
                .tempfile_in(&dir)
        })
        .await
        .map_err(StoreError::Task)?;
        let (file, path) = created
            .map_err(|source| StoreError::Write {
                key: key.clone(),
                source,
            })?
            .into_parts();
        let mut pending = Self {
            shared,
            key,
            file: tokio::fs::File::from_std(file),
            path,
            len: 0,
        };
        if let Err(source) = pending.file.write_all(&[b' '; HEADER_LEN]).await {
            return Err(pending.write_err(source));
        }
        Ok(pending)
    }

    /// The record's key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Value bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no value byte was written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `chunk` to the value.
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), StoreError> {
        match self.file.write_all(chunk).await {
            Ok(()) => {
                self.len += chunk.len() as u64;
                Ok(())
            }
            Err(source) => Err(self.write_err(source)),
        }
    }

    /// Makes the record durable as a new write of its key, replacing any previous value; its
    /// version is higher than the key's copy here. When this returns, the record is on stable
    /// storage.
    pub async fn commit(self) -> Result<Version, StoreError> {
        match self.persist(Commit::Write(Kind::Value)).await? {
            Committed::Stored(header) | Committed::Kept(header) => Ok(header.version),
        }
    }

    /// Makes the record durable only if its key has no value here yet (none, or a tombstone);
    /// otherwise leaves the existing one unchanged and answers [`Created::Exists`].
    pub async fn commit_new(self) -> Result<Created, StoreError> {
        Ok(match self.persist(Commit::CreateOnly).await? {
            Committed::Stored(_) => Created::Created,
            Committed::Kept(_) => Created::Exists,
        })
    }

    /// Takes this copy, handed over with `header`, if its version is higher than the key's
    /// copy here; answers the header of the copy held afterwards (durable either way).
    pub async fn hand_over(self, header: Header) -> Result<Header, StoreError> {
        match self.persist(Commit::Handover(header)).await? {
            Committed::Stored(header) | Committed::Kept(header) => Ok(header),
        }
    }

    pub(super) async fn persist(mut self, commit: Commit) -> Result<Committed, StoreError> {
        // `flush` reports the error of a write still in flight.
        if let Err(source) = self.file.flush().await {
            return Err(self.write_err(source));
        }
        let Self {
            shared,
            key,
            file,
            path,
            ..
        } = self;
        let file = file.into_std().await;
        tokio::task::spawn_blocking(move || {
            let _guard = shared.lock(&key);
            persist_blocking(&shared, key.as_str(), &file, path, commit)
                .map_err(|source| StoreError::Write { key, source })
        })
        .await
        .map_err(StoreError::Task)?
    }

    fn write_err(&self, source: io::Error) -> StoreError {
        StoreError::Write {
            key: self.key.clone(),
            source,
        }
    }
}

/// Decides and persists a commit; the key's lock is held. On failure, or when the copy here
/// stays, the temporary file is removed (dropping the `TempPath`).
fn persist_blocking(
    shared: &Shared,
    key: &str,
    file: &File,
    path: TempPath,
    commit: Commit,
) -> io::Result<Committed> {
    let dir = shared.dir.as_path();
    let target = dir.join(key);
    let held = read_header(&target)?.map(|(header, _)| header);
    let version_here = held.as_ref().map(|h| &h.version);
    let header = match commit {
        Commit::Write(kind) => Header {
            kind,
            version: shared.clock.next_after(version_here)?,
        },
        Commit::CreateOnly => match held {
            Some(held) if held.kind == Kind::Value => return keep(dir, held),
            _ => Header {
                kind: Kind::Value,
                version: shared.clock.next_after(version_here)?,
            },
        },
        Commit::Handover(sent) => {
            shared.clock.observe(&sent.version)?;
            match held {
                Some(held) if !record::keeps_incoming(Some(&held.version), &sent.version) => {
                    return keep(dir, held);
                }
                _ => sent,
            }
        }
    };
    file.write_all_at(&header.encode(), 0)?;
    file.sync_all()?;
    path.persist(&target).map_err(|e| e.error)?;
    sync_dir(dir)?;
    Ok(Committed::Stored(header))
}

/// The copy here stays: made durable before anyone is told so.
fn keep(dir: &Path, held: Header) -> io::Result<Committed> {
    sync_dir(dir)?;
    Ok(Committed::Kept(held))
}

/// Flushes the directory's entries.
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Where a record of `key` lives in `dir`.
pub(super) fn record_path(dir: &Path, key: &Key) -> PathBuf {
    dir.join(key.as_str())
}

#[cfg(test)]
mod tests {
    use super::super::Store;
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.starts_with(".clock"))
            .collect();
        names.sort();
        names
    }

    fn key(text: &str) -> Key {
        Key::parse(text).unwrap()
    }

    fn v(millis: u64, counter: u32, node: &str) -> Version {
        Version::new(millis, counter, node)
    }

    #[tokio::test]
    async fn create_keeps_the_first_value() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_as(dir.path(), "n").unwrap();
        assert_eq!(
            store.create(key("k"), b"one".to_vec()).await.unwrap(),
            Created::Created
        );
        assert_eq!(
            store.create(key("k"), b"two".to_vec()).await.unwrap(),
            Created::Exists
        );
        assert_eq!(store.get(key("k")).await.unwrap().unwrap(), b"one");
        assert_eq!(names(dir.path()), ["k"]);
    }

    #[tokio::test]
    async fn put_overwrites_with_a_higher_version() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_as(dir.path(), "n").unwrap();
        let first = store.put(key("k"), b"one".to_vec()).await.unwrap();
        let second = store.put(key("k"), b"two".to_vec()).await.unwrap();
        assert!(second > first);
        assert_eq!(store.get(key("k")).await.unwrap().unwrap(), b"two");
        assert_eq!(names(dir.path()), ["k"]);
    }

    #[tokio::test]
    async fn a_write_after_a_handed_over_copy_from_a_clock_ahead_is_newer() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_as(dir.path(), "a").unwrap();
        let far = v(u64::MAX / 2, 0, "z");
        store
            .hand_over(key("k"), Kind::Value, far.clone(), b"theirs".to_vec())
            .await
            .unwrap();
        let mine = store.put(key("k"), b"mine".to_vec()).await.unwrap();
        assert!(mine > far);
        // And for another key too: the clock took note of the version it saw.
        assert!(store.put(key("other"), b"x".to_vec()).await.unwrap() > far);
    }

    #[tokio::test]
    async fn a_handover_keeps_the_higher_version_and_answers_what_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_as(dir.path(), "a").unwrap();
        let here = store.put(key("k"), b"newer".to_vec()).await.unwrap();
        let older = v(1, 0, "b");
        let held = store
            .hand_over(key("k"), Kind::Value, older, b"older".to_vec())
            .await
            .unwrap();
        assert_eq!(held.version, here);
        assert_eq!(store.get(key("k")).await.unwrap().unwrap(), b"newer");

        let newer = v(here.millis + 1, 0, "b");
        let held = store
            .hand_over(key("k"), Kind::Value, newer.clone(), b"newest".to_vec())
            .await
            .unwrap();
        assert_eq!(held.version, newer);
        assert_eq!(store.get(key("k")).await.unwrap().unwrap(), b"newest");
        assert_eq!(names(dir.path()), ["k"]);
    }

    #[tokio::test]
    async fn a_delete_leaves_a_tombstone_that_an_older_copy_does_not_undo() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_as(dir.path(), "a").unwrap();
        let written = store.put(key("k"), b"v".to_vec()).await.unwrap();
        let deleted = store.delete(key("k")).await.unwrap();
        assert!(deleted > written);
        assert_eq!(store.get(key("k")).await.unwrap(), None);
        assert!(store.list().await.unwrap().is_empty());
        let held = store
            .hand_over(key("k"), Kind::Value, written, b"v".to_vec())
            .await
            .unwrap();
        assert_eq!(held.kind, Kind::Tombstone);
        assert_eq!(store.get(key("k")).await.unwrap(), None);
        // A later write brings the key back.
        store.put(key("k"), b"again".to_vec()).await.unwrap();
        assert_eq!(store.get(key("k")).await.unwrap().unwrap(), b"again");
        // A delete of a key never held here still leaves a tombstone: an older copy may be
        // on a claim that has not been drained yet.
        store.delete(key("never")).await.unwrap();
        let held = store
            .hand_over(key("never"), Kind::Value, v(1, 0, "b"), b"old".to_vec())
            .await
            .unwrap();
        assert_eq!(held.kind, Kind::Tombstone);
    }

    #[tokio::test]
    async fn a_release_removes_only_the_version_handed_over() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_as(dir.path(), "a").unwrap();
        let first = store.put(key("k"), b"one".to_vec()).await.unwrap();
        let second = store.put(key("k"), b"two".to_vec()).await.unwrap();
        assert_eq!(
            store.release(key("k"), &first).await.unwrap(),
            super::super::Released::Kept(second.clone())
        );
        assert_eq!(store.get(key("k")).await.unwrap().unwrap(), b"two");
        assert_eq!(
            store.release(key("k"), &second).await.unwrap(),
            super::super::Released::Released
        );
        assert_eq!(
            store.release(key("k"), &second).await.unwrap(),
            super::super::Released::Gone
        );
        assert!(names(dir.path()).is_empty());
    }

    #[tokio::test]
    async fn legacy_files_are_values_older_than_any_write() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("old"), b"from before versions").unwrap();
        let store = Store::open_as(dir.path(), "a").unwrap();
        assert_eq!(
            store.get(key("old")).await.unwrap().unwrap(),
            b"from before versions"
        );
        assert_eq!(store.list().await.unwrap(), ["old"]);
        let held = store
            .hand_over(key("old"), Kind::Value, v(1, 0, "b"), b"versioned".to_vec())
            .await
            .unwrap();
        assert_eq!(held.version, v(1, 0, "b"));
        assert_eq!(store.get(key("old")).await.unwrap().unwrap(), b"versioned");
    }

    #[tokio::test]
    async fn dropped_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_as(dir.path(), "n").unwrap();
        let mut pending = store.begin(key("k")).await.unwrap();
        pending.write(b"partial").await.unwrap();
        assert_eq!(pending.len(), 7);
        assert_eq!(names(dir.path()).len(), 1, "the temporary file");
        drop(pending);
        assert!(names(dir.path()).is_empty());
    }

    #[tokio::test]
    async fn create_over_a_directory_is_an_error_not_exists() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_as(dir.path(), "n").unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let err = store.create(key("d"), b"v".to_vec()).await.unwrap_err();
        assert!(matches!(err, StoreError::Write { .. }), "{err}");
        assert_eq!(names(dir.path()), ["d"]);
        assert_eq!(store.get(key("d")).await.unwrap(), None);
    }
}
