//! Records on disk: one file per key in the data directory, each written atomically and
//! versioned.
//!
//! A record file is a [`drain_api::record`] header (kind and version) followed by the value; a
//! delete leaves a *tombstone* (a header alone), which reads as absent but keeps its version, so
//! an older copy of the key handed over later cannot bring it back. Tombstones are kept for
//! good: an older copy may wait on an undrained claim for as long as that claim exists.
//!
//! A write streams into a temporary file in the same directory (its name starts with `.`, so it
//! is never listed as a record); then, under the key's lock, its version is decided
//! ([`write`]), the header written, the file flushed with `fsync`, renamed to the record's file
//! and the directory itself flushed. A record is therefore either wholly old or wholly new, and
//! once a write returns `Ok` it survives a crash. Versions come from the server's
//! [`clock::Clock`].

pub mod clock;
mod write;

pub use write::{Created, PendingRecord};

use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use drain_api::record::{HEADER_LEN, Header, Kind, Version};
use tokio::io::AsyncReadExt;

use clock::Clock;
use write::Commit;

pub use drain_api::record::{MAX_KEY_LEN, TEMP_PREFIX};

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

/// Whether `key` is a valid record key (see [`Key`]; the rule is
/// [`drain_api::record::valid_key`], shared with the drainer).
pub fn is_valid_key(key: &str) -> bool {
    drain_api::record::valid_key(key)
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

/// Locks a key's record while a commit decides and persists (one of [`LOCK_STRIPES`] locks,
/// chosen by the key's hash).
const LOCK_STRIPES: usize = 64;

/// What the handles of one data directory share.
#[derive(Debug)]
pub(crate) struct Shared {
    dir: PathBuf,
    clock: Clock,
    locks: Vec<Mutex<()>>,
    /// The pod's UID, when known: handovers meant for another pod are refused.
    pod_uid: Option<String>,
}

impl Shared {
    /// The lock of `key`'s stripe: held while a commit or release of the key decides and acts.
    fn lock(&self, key: &Key) -> MutexGuard<'_, ()> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut hasher);
        let stripe = (hasher.finish() % LOCK_STRIPES as u64) as usize;
        self.locks[stripe].lock().expect("key lock poisoned")
    }
}

/// What a release of a handed-over copy did ([`Store::release`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Released {
    /// The copy of that version was removed.
    Released,
    /// There was no copy of the key.
    Gone,
    /// The copy here has another version (a newer write): it stays.
    Kept(Version),
}

/// The records of one data directory. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    shared: Arc<Shared>,
}

impl Store {
    /// Opens `dir` as the server named by this machine's host name (a pod's name); see
    /// [`Store::open_as`].
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        Self::open_as(dir, &default_node())
    }

    /// Opens `dir` (created if missing) as the server `node` (the name in the versions it
    /// gives), removes temporary files that a crash left behind (their writes were never
    /// acknowledged), and starts the clock after the one a previous run left.
    pub fn open_as(dir: impl Into<PathBuf>, node: &str) -> Result<Self, StoreError> {
        Self::open_pod(dir, node, None)
    }

    /// [`Store::open_as`] for the pod `node` whose UID is `pod_uid` (from the downward API): a
    /// handover naming another pod or UID is refused ([`crate::http`]).
    pub fn open_pod(
        dir: impl Into<PathBuf>,
        node: &str,
        pod_uid: Option<&str>,
    ) -> Result<Self, StoreError> {
        let dir = dir.into();
        let open_err = |source| StoreError::Open {
            dir: dir.clone(),
            source,
        };
        if !drain_api::record::valid_node(node) || node.is_empty() {
            return Err(open_err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid node name {node:?}: want 1 to 63 characters of [A-Za-z0-9._-]"),
            )));
        }
        fs::create_dir_all(&dir).map_err(open_err)?;
        for entry in fs::read_dir(&dir).map_err(open_err)? {
            let entry = entry.map_err(open_err)?;
            let name = entry.file_name();
            if name.to_string_lossy().starts_with(TEMP_PREFIX) {
                tracing::info!(file = %name.to_string_lossy(), "removing unfinished write");
                fs::remove_file(entry.path()).map_err(open_err)?;
            }
        }
        let clock = Clock::open(&dir, node).map_err(open_err)?;
        Ok(Self {
            shared: Arc::new(Shared {
                dir,
                clock,
                locks: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
                pod_uid: pod_uid.filter(|u| !u.is_empty()).map(str::to_owned),
            }),
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The server's name in the versions it gives: its pod's name.
    pub fn node(&self) -> &str {
        self.shared.clock.node()
    }

    /// Its pod's UID, when it was given one.
    pub fn pod_uid(&self) -> Option<&str> {
        self.shared.pod_uid.as_deref()
    }

    /// Writes the record `key` durably (overwriting any previous value) with a new version,
    /// higher than the key's copy here; answers it. When this returns `Ok`, the record is on
    /// stable storage.
    pub async fn put(&self, key: Key, value: Vec<u8>) -> Result<Version, StoreError> {
        let mut pending = self.begin(key).await?;
        pending.write(&value).await?;
        pending.commit().await
    }

    /// Writes the record `key` durably only if it has no value here (none, or a tombstone),
    /// atomically: of concurrent creates of one key exactly one answers [`Created::Created`].
    /// An existing record is left as it is ([`Created::Exists`]).
    pub async fn create(&self, key: Key, value: Vec<u8>) -> Result<Created, StoreError> {
        let mut pending = self.begin(key).await?;
        pending.write(&value).await?;
        pending.commit_new().await
    }

    /// Deletes the record `key`: leaves a tombstone with a new version (even if no value was
    /// here: an older copy may be elsewhere); answers the version.
    pub async fn delete(&self, key: Key) -> Result<Version, StoreError> {
        let pending = self.begin(key).await?;
        match pending.persist(Commit::Write(Kind::Tombstone)).await? {
            write::Committed::Stored(h) | write::Committed::Kept(h) => Ok(h.version),
        }
    }

    /// Takes a copy of `key` handed over by another server (a drain, a rebalance) if its
    /// `version` is higher than the copy here; answers the header held afterwards, durably.
    /// A tombstone's `value` must be empty.
    pub async fn hand_over(
        &self,
        key: Key,
        kind: Kind,
        version: Version,
        value: Vec<u8>,
    ) -> Result<Header, StoreError> {
        let mut pending = self.begin(key).await?;
        pending.write(&value).await?;
        pending.hand_over(Header { kind, version }).await
    }

    /// Removes the copy of `key` if it is still of `version` (the owner acknowledged holding
    /// it or newer); a newer write here stays ([`Released::Kept`]). Durable when it returns.
    pub async fn release(&self, key: Key, version: &Version) -> Result<Released, StoreError> {
        let shared = Arc::clone(&self.shared);
        let version = version.clone();
        tokio::task::spawn_blocking(move || {
            let _guard = shared.lock(&key);
            release_blocking(&shared.dir, &key, &version)
                .map_err(|source| StoreError::Write { key, source })
        })
        .await
        .map_err(StoreError::Task)?
    }

    /// Starts a streamed write of the record `key` into a temporary file; nothing is visible
    /// until it is committed ([`PendingRecord::commit`], [`PendingRecord::commit_new`],
    /// [`PendingRecord::hand_over`]), and dropping the pending record removes the temporary
    /// file.
    pub async fn begin(&self, key: Key) -> Result<PendingRecord, StoreError> {
        PendingRecord::begin(Arc::clone(&self.shared), key).await
    }

    /// Reads the value of `key` into memory; `None` if there is none (or a tombstone).
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

    /// The header of the copy of `key` here (a value, a tombstone, or a legacy record), or
    /// `None`.
    pub async fn header(&self, key: Key) -> Result<Option<Header>, StoreError> {
        let path = write::record_path(self.dir(), &key);
        tokio::task::spawn_blocking(move || match read_header(&path) {
            Ok(found) => Ok(found.map(|(h, _)| h)),
            Err(source) => Err(StoreError::Read { key, source }),
        })
        .await
        .map_err(StoreError::Task)?
    }

    /// Opens the value of `key` for streaming, positioned after the header; `None` if there is
    /// none (a tombstone, or a directory of that name: see [`Store::list`]). The file stays
    /// readable and unchanged even if the record is overwritten meanwhile (writes replace the
    /// file, never change it).
    pub async fn open_record(&self, key: Key) -> Result<Option<Record>, StoreError> {
        let path = write::record_path(self.dir(), &key);
        let opened = tokio::task::spawn_blocking(move || open_value(&path))
            .await
            .map_err(StoreError::Task)?;
        match opened {
            Ok(Some((file, header, len))) => Ok(Some(Record {
                file: tokio::fs::File::from_std(file),
                len,
                version: header.version,
            })),
            Ok(None) => Ok(None),
            Err(source) => Err(StoreError::Read { key, source }),
        }
    }

    /// The keys of all values, sorted. Tombstones, temporary files, directories (such as
    /// `lost+found`) and files whose names are not valid keys are left out.
    pub async fn list(&self) -> Result<Vec<String>, StoreError> {
        let dir = self.shared.dir.clone();
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

/// This machine's host name (in a pod, the pod's name), or `datastore`: the default node name.
pub fn default_node() -> String {
    let name = fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let name = name.trim();
    if name.is_empty() || !drain_api::record::valid_node(name) {
        "datastore".to_owned()
    } else {
        name.to_owned()
    }
}

/// The header of the record file at `path` and where its value starts; `None` if there is no
/// file. Something else squatting on the name (a directory) is an error.
pub(crate) fn read_header(path: &Path) -> io::Result<Option<(Header, u64)>> {
    let mut file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the record's name is taken by something that is not a file",
        ));
    }
    header_of(&mut file).map(Some)
}

/// Reads the header at the start of `file`: a versioned one and [`HEADER_LEN`], or a legacy
/// record and 0.
fn header_of(file: &mut fs::File) -> io::Result<(Header, u64)> {
    let mut head = Vec::with_capacity(HEADER_LEN);
    file.by_ref()
        .take(HEADER_LEN as u64)
        .read_to_end(&mut head)?;
    Ok(Header::of_file(&head))
}

/// The value of the record file at `path`: the file positioned at its start, its header and its
/// length; `None` for no file, a tombstone or something that is not a file.
fn open_value(path: &Path) -> io::Result<Option<(fs::File, Header, u64)>> {
    let mut file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Ok(None);
    }
    let (header, offset) = header_of(&mut file)?;
    if header.kind == Kind::Tombstone {
        return Ok(None);
    }
    file.seek(SeekFrom::Start(offset))?;
    Ok(Some((file, header, metadata.len().saturating_sub(offset))))
}

fn release_blocking(dir: &Path, key: &Key, version: &Version) -> io::Result<Released> {
    let path = write::record_path(dir, key);
    let Some((held, _)) = read_header(&path)? else {
        return Ok(Released::Gone);
    };
    if held.version != *version {
        return Ok(Released::Kept(held.version));
    }
    fs::remove_file(&path)?;
    write::sync_dir(dir)?;
    Ok(Released::Released)
}

/// A record's value opened for reading.
#[derive(Debug)]
pub struct Record {
    /// The open file, positioned at the value's start.
    pub file: tokio::fs::File,
    /// The value's length in bytes.
    pub len: u64,
    /// The record's version.
    pub version: Version,
}

fn list_keys(dir: &Path) -> io::Result<Vec<String>> {
    let mut keys = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !is_valid_key(&name) || !entry.file_type()?.is_file() {
            continue;
        }
        let mut file = match fs::File::open(entry.path()) {
            Ok(file) => file,
            // Gone since listed (released, or replaced and the old name reused).
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if header_of(&mut file)?.0.kind == Kind::Value {
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
        Store::open_as(dir.path(), "n").unwrap();
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["kept"]);
        assert!(Store::open_as(dir.path(), "bad name").is_err());
    }

    #[tokio::test]
    async fn list_skips_directories_and_invalid_names() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_as(dir.path(), "n").unwrap();
        fs::create_dir(dir.path().join("lost+found")).unwrap();
        fs::create_dir(dir.path().join("subdir")).unwrap();
        fs::write(dir.path().join("b"), b"2").unwrap();
        fs::write(dir.path().join("a"), b"1").unwrap();
        fs::write(dir.path().join(".tmp-x"), b"partial").unwrap();
        assert_eq!(store.list().await.unwrap(), ["a", "b"]);
    }
}
