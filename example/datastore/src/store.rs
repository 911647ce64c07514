//! Records on disk: one file per key in the data directory, each written atomically.
//!
//! A write streams into a temporary file in the same directory (its name starts with `.`, so it
//! is never listed as a record), is flushed with `fsync`, renamed to the record's file (over the
//! old one, or with no-clobber for a create-only write), and then the directory itself is
//! flushed. A record is therefore either wholly old or wholly new, and once a write returns `Ok`
//! it survives a crash. See [`PendingRecord`] for the write path.

mod write;

pub use write::{Created, PendingRecord};

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::AsyncReadExt;

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 200;

/// Prefix of the temporary files of writes in progress.
pub const TEMP_PREFIX: &str = ".tmp-";

/// A validated record key: 1 to [`MAX_KEY_LEN`] characters of `[A-Za-z0-9._-]`, not starting
/// with `.` (so it is a safe file name and never a temporary file).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(String);

/// A key that is not valid.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid key {key:?}: want 1 to 200 characters of [A-Za-z0-9._-], not starting with '.'")]
pub struct InvalidKey {
    /// The rejected key.
    pub key: String,
}

impl Key {
    /// Checks `key` and wraps it.
    pub fn parse(key: &str) -> Result<Self, InvalidKey> {
        if is_valid_key(key) {
            Ok(Self(key.to_owned()))
        } else {
            Err(InvalidKey {
                key: key.to_owned(),
            })
        }
    }

    /// The key as text (also its file name).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `key` is a valid record key (see [`Key`]).
pub fn is_valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && !key.starts_with('.')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Errors of the record store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The data directory could not be created or opened.
    #[error("failed to open data directory {}", dir.display())]
    Open {
        /// The data directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A record could not be written durably.
    #[error("failed to write record {key}")]
    Write {
        /// The record's key.
        key: Key,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A record could not be read.
    #[error("failed to read record {key}")]
    Read {
        /// The record's key.
        key: Key,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The data directory could not be listed.
    #[error("failed to list records in {}", dir.display())]
    List {
        /// The data directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The blocking task doing the file I/O panicked or was cancelled.
    #[error("file I/O task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// The records of one data directory. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    dir: Arc<PathBuf>,
}

impl Store {
    /// Opens `dir` (created if missing) and removes temporary files that a crash left behind:
    /// their writes were never acknowledged.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        let open_err = |source| StoreError::Open {
            dir: dir.clone(),
            source,
        };
        fs::create_dir_all(&dir).map_err(open_err)?;
        for entry in fs::read_dir(&dir).map_err(open_err)? {
            let entry = entry.map_err(open_err)?;
            let name = entry.file_name();
            if name.to_string_lossy().starts_with(TEMP_PREFIX) {
                tracing::info!(file = %name.to_string_lossy(), "removing unfinished write");
                fs::remove_file(entry.path()).map_err(open_err)?;
            }
        }
        Ok(Self { dir: Arc::new(dir) })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes the record `key` durably (overwriting any previous value). When this returns
    /// `Ok`, the record is on stable storage.
    pub async fn put(&self, key: Key, value: Vec<u8>) -> Result<(), StoreError> {
        let mut pending = self.begin(key).await?;
        pending.write(&value).await?;
        pending.commit().await
    }

    /// Writes the record `key` durably only if there is none yet, atomically: of concurrent
    /// creates of one key exactly one answers [`Created::Created`]. An existing record is left
    /// as it is ([`Created::Exists`]).
    pub async fn create(&self, key: Key, value: Vec<u8>) -> Result<Created, StoreError> {
        let mut pending = self.begin(key).await?;
        pending.write(&value).await?;
        pending.commit_new().await
    }

    /// Starts a streamed write of the record `key` into a temporary file; nothing is visible
    /// until [`PendingRecord::commit`] or [`PendingRecord::commit_new`], and dropping the
    /// pending record removes the temporary file.
    pub async fn begin(&self, key: Key) -> Result<PendingRecord, StoreError> {
        PendingRecord::begin(Arc::clone(&self.dir), key).await
    }

    /// Reads the record `key` into memory; `None` if there is none.
    pub async fn get(&self, key: Key) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(record) = self.open_record(key.clone()).await? else {
            return Ok(None);
        };
        let mut file = record.file;
        let mut value = Vec::with_capacity(usize::try_from(record.len).unwrap_or(0));
        file.read_to_end(&mut value)
            .await
            .map_err(|source| StoreError::Read { key, source })?;
        Ok(Some(value))
    }

    /// Opens the record `key` for streaming; `None` if there is none (a directory of that name
    /// is not a record, as in [`Store::list`]). The file stays readable and unchanged even if
    /// the record is overwritten meanwhile (writes replace the file, never change it).
    pub async fn open_record(&self, key: Key) -> Result<Option<Record>, StoreError> {
        let path = self.dir.join(key.as_str());
        let read_err = |source| StoreError::Read {
            key: key.clone(),
            source,
        };
        let file = match tokio::fs::File::open(&path).await {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(read_err(source)),
        };
        let metadata = file.metadata().await.map_err(read_err)?;
        if !metadata.is_file() {
            return Ok(None);
        }
        Ok(Some(Record {
            file,
            len: metadata.len(),
        }))
    }

    /// The keys of all records, sorted. Temporary files, directories (such as `lost+found`)
    /// and files whose names are not valid keys are left out.
    pub async fn list(&self) -> Result<Vec<String>, StoreError> {
        let dir = Arc::clone(&self.dir);
        tokio::task::spawn_blocking(move || {
            list_keys(&dir).map_err(|source| StoreError::List {
                dir: dir.to_path_buf(),
                source,
            })
        })
        .await
        .map_err(StoreError::Task)?
    }
}

/// A record opened for reading.
#[derive(Debug)]
pub struct Record {
    /// The open file, positioned at its start.
    pub file: tokio::fs::File,
    /// Its length in bytes.
    pub len: u64,
}

fn list_keys(dir: &Path) -> io::Result<Vec<String>> {
    let mut keys = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if is_valid_key(&name) && entry.file_type()?.is_file() {
            keys.push(name);
        }
    }
    keys.sort_unstable();
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("a", true)]
    #[case("key-1", true)]
    #[case("A.b_c-9", true)]
    #[case("a..b", true)]
    #[case(&"x".repeat(MAX_KEY_LEN), true)]
    #[case(&"x".repeat(MAX_KEY_LEN + 1), false)]
    #[case("", false)]
    #[case(".hidden", false)]
    #[case("..", false)]
    #[case(".tmp-abc", false)]
    #[case("a/b", false)]
    #[case("a b", false)]
    #[case("lost+found", false)]
    #[case("é", false)]
    fn validates_keys(#[case] key: &str, #[case] valid: bool) {
        assert_eq!(is_valid_key(key), valid);
        assert_eq!(Key::parse(key).is_ok(), valid);
    }

    #[test]
    fn open_removes_unfinished_writes_only() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".tmp-123"), b"partial").unwrap();
        fs::write(dir.path().join("kept"), b"v").unwrap();
        Store::open(dir.path()).unwrap();
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["kept"]);
    }

    #[tokio::test]
    async fn list_skips_directories_and_invalid_names() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        fs::create_dir(dir.path().join("lost+found")).unwrap();
        fs::create_dir(dir.path().join("subdir")).unwrap();
        fs::write(dir.path().join("b"), b"2").unwrap();
        fs::write(dir.path().join("a"), b"1").unwrap();
        fs::write(dir.path().join(".tmp-x"), b"partial").unwrap();
        assert_eq!(store.list().await.unwrap(), ["a", "b"]);
    }
}
