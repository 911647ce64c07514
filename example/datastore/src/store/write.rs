//! The write path: stream into a temporary file, `fsync` it, rename it into place (over the old
//! record or with no-clobber), `fsync` the directory.

use std::fs::{File, Permissions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tempfile::TempPath;
use tokio::io::AsyncWriteExt;

use super::{Key, StoreError, TEMP_PREFIX};

/// What a create-only write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Created {
    /// The record was new and is now durably stored.
    Created,
    /// A record of that key already existed and was left unchanged.
    Exists,
}

/// A record being written: a temporary file in the data directory, invisible to readers and
/// listings until committed. Dropping it (an error, a body that broke off, a cancelled request)
/// removes the temporary file.
#[derive(Debug)]
pub struct PendingRecord {
    dir: Arc<PathBuf>,
    key: Key,
    file: tokio::fs::File,
    /// Removes the temporary file when dropped, unless it was persisted.
    path: TempPath,
    len: u64,
}

impl PendingRecord {
    /// Creates the temporary file for `key` in `dir`.
    pub(super) async fn begin(dir: Arc<PathBuf>, key: Key) -> Result<Self, StoreError> {
        let in_dir = Arc::clone(&dir);
        let created = tokio::task::spawn_blocking(move || {
            tempfile::Builder::new()
                .prefix(TEMP_PREFIX)
                .permissions(Permissions::from_mode(0o644))
                .tempfile_in(in_dir.as_path())
        })
        .await
        .map_err(StoreError::Task)?;
        let (file, path) = created
            .map_err(|source| StoreError::Write {
                key: key.clone(),
                source,
            })?
            .into_parts();
        Ok(Self {
            dir,
            key,
            file: tokio::fs::File::from_std(file),
            path,
            len: 0,
        })
    }

    /// The record's key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `chunk` to the temporary file.
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), StoreError> {
        match self.file.write_all(chunk).await {
            Ok(()) => {
                self.len += chunk.len() as u64;
                Ok(())
            }
            Err(source) => Err(self.write_err(source)),
        }
    }

    /// Makes the record durable, replacing any previous value of its key. When this returns
    /// `Ok`, the record is on stable storage.
    pub async fn commit(self) -> Result<(), StoreError> {
        self.persist(Mode::Overwrite).await.map(|_| ())
    }

    /// Makes the record durable only if its key has no record yet; otherwise leaves the
    /// existing one unchanged, removes the temporary file and answers [`Created::Exists`].
    /// Atomic: the rename itself refuses to replace an existing file (no check-then-write).
    pub async fn commit_new(self) -> Result<Created, StoreError> {
        self.persist(Mode::NoClobber).await
    }

    async fn persist(mut self, mode: Mode) -> Result<Created, StoreError> {
        // `flush` reports the error of a write still in flight; `sync_all` puts the data on disk.
        if let Err(source) = self.file.flush().await {
            return Err(self.write_err(source));
        }
        if let Err(source) = self.file.sync_all().await {
            return Err(self.write_err(source));
        }
        let Self { dir, key, path, .. } = self;
        tokio::task::spawn_blocking(move || {
            persist_blocking(&dir, key.as_str(), path, mode)
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

#[derive(Clone, Copy, Debug)]
enum Mode {
    Overwrite,
    NoClobber,
}

/// Renames `path` to `dir/key` and flushes `dir`. On failure, or when a no-clobber rename finds
/// the record already there, the temporary file is removed (dropping the `TempPath`).
fn persist_blocking(dir: &Path, key: &str, path: TempPath, mode: Mode) -> io::Result<Created> {
    let target = dir.join(key);
    match mode {
        Mode::Overwrite => path.persist(&target).map_err(|e| e.error)?,
        Mode::NoClobber => match path.persist_noclobber(&target) {
            Ok(()) => {}
            Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => {
                drop(e.path);
                // Only a record answers "exists"; a directory squatting on the name is a fault.
                return if std::fs::symlink_metadata(&target)?.is_file() {
                    Ok(Created::Exists)
                } else {
                    Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        "the record's name is taken by something that is not a file",
                    ))
                };
            }
            Err(e) => return Err(e.error),
        },
    }
    File::open(dir)?.sync_all()?;
    Ok(Created::Created)
}

#[cfg(test)]
mod tests {
    use super::super::Store;
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn key(text: &str) -> Key {
        Key::parse(text).unwrap()
    }

    #[tokio::test]
    async fn create_keeps_the_first_value() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
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
    async fn put_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.put(key("k"), b"one".to_vec()).await.unwrap();
        store.put(key("k"), b"two".to_vec()).await.unwrap();
        assert_eq!(store.get(key("k")).await.unwrap().unwrap(), b"two");
        assert_eq!(names(dir.path()), ["k"]);
    }

    #[tokio::test]
    async fn dropped_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
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
        let store = Store::open(dir.path()).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let err = store.create(key("d"), b"v".to_vec()).await.unwrap_err();
        assert!(matches!(err, StoreError::Write { .. }), "{err}");
        assert_eq!(names(dir.path()), ["d"]);
        assert_eq!(store.get(key("d")).await.unwrap(), None);
    }
}
