//! The data directory: checking that it is the drained claim, listing its record files, and
//! deleting a moved record durably.
//!
//! The directory must be where the claim is mounted. An empty directory that is not the claim
//! (the flag points elsewhere, the image happens to have `/data`, a `subPath` the kubelet
//! created empty) would otherwise "drain" in no time and the controller would delete the claim
//! with all its data. So [`check_data_dir`] requires a mount point: the path is listed as one in
//! `/proc/self/mountinfo`, or it is on a different device than its parent. Layouts where the
//! claim is mounted above the data directory opt out explicitly
//! ([`Options::allow_unmounted`](super::Options::allow_unmounted)).
//!
//! Every entry is accounted for in the [`Listing`]: a *record* (a regular file named by a valid
//! key, [`drain_api::record::valid_key`]), one of the datastore's own files that hold no record
//! (*skipped*: unfinished writes `.tmp-*`, the clock `.clock*`, claims `.rebalance-*` of an
//! earlier version, which a drain puts back first, and an empty `lost+found`), or a *foreign*
//! entry: anything else (a subdirectory, a symlink, another dot file, a name that is not a valid
//! key, a `lost+found` holding files fsck recovered). A drain moves the records and then fails
//! naming the foreign entries, so the claim is not deleted with data nobody looked at.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::errors::{Foreign, RedistributeError};

/// Prefix of a record file claimed for a move by an interrupted rebalance pass
/// ([`claimed`](super::claimed)).
pub const CLAIM_PREFIX: &str = ".rebalance-";

/// The entries of a data directory, each in one list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Record files (name, size in bytes), sorted by name.
    pub records: Vec<(String, u64)>,
    /// The datastore's own files that hold no record, sorted.
    pub skipped: Vec<String>,
    /// Entries that are neither, sorted by name.
    pub foreign: Vec<Foreign>,
}

/// Whether `name` is one of the datastore's own files that hold no record.
pub fn is_own_file(name: &str) -> bool {
    name.starts_with(drain_api::record::TEMP_PREFIX)
        || name.starts_with(drain_api::record::CLOCK_FILE)
        || name.starts_with(CLAIM_PREFIX)
}

/// Whether `name` matches one of `patterns`: an exact name, or a prefix ending with `*`.
pub fn matches_any(name: &str, patterns: &[String]) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == p,
    })
}

impl Listing {
    /// The record names.
    pub fn names(&self) -> Vec<String> {
        self.records.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Total size of the records.
    pub fn bytes(&self) -> u64 {
        self.records.iter().map(|(_, b)| b).sum()
    }
}

/// How the data directory was found to be the claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mounted {
    /// It is a mount point.
    MountPoint,
    /// It is on another device than its parent.
    OtherDevice,
    /// Not a mount, accepted because the caller allowed it.
    Allowed,
}

/// Checks that `dir` exists, is a directory, and is a mount point (unless `allow_unmounted`).
pub fn check_data_dir(dir: &Path, allow_unmounted: bool) -> Result<Mounted, RedistributeError> {
    let meta = dir_metadata(dir)?;
    let canonical = fs::canonicalize(dir).map_err(|source| RedistributeError::ReadDataDir {
        dir: dir.to_path_buf(),
        source,
    })?;
    if let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo")
        && mount_points(&mountinfo).any(|p| p == canonical)
    {
        return Ok(Mounted::MountPoint);
    }
    let parent = canonical.parent().unwrap_or(&canonical);
    if let Ok(parent_meta) = fs::metadata(parent)
        && parent_meta.dev() != meta.dev()
    {
        return Ok(Mounted::OtherDevice);
    }
    if allow_unmounted {
        return Ok(Mounted::Allowed);
    }
    Err(RedistributeError::DataDirNotMounted {
        dir: dir.to_path_buf(),
    })
}

/// The metadata of `dir`, which must exist and be a directory.
fn dir_metadata(dir: &Path) -> Result<fs::Metadata, RedistributeError> {
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(meta),
        Ok(_) => Err(RedistributeError::DataDirNotADirectory {
            dir: dir.to_path_buf(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(RedistributeError::DataDirMissing {
            dir: dir.to_path_buf(),
        }),
        Err(source) => Err(RedistributeError::ReadDataDir {
            dir: dir.to_path_buf(),
            source,
        }),
    }
}

/// The mount points listed in `/proc/self/mountinfo` text (field 5, octal escapes decoded).
pub fn mount_points(mountinfo: &str) -> impl Iterator<Item = PathBuf> + '_ {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
}

/// Decodes the `\ooo` octal escapes the kernel writes for space, tab, newline and backslash.
fn unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        if bytes[i] == b'\\'
            && let Some(digits) = octal
        {
            let code = digits.iter().fold(0u32, |n, d| n * 8 + u32::from(d - b'0'));
            out.push(u8::try_from(code).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The record files of `dir`, after checking that `dir` is a readable directory.
pub async fn list_records(dir: &Path) -> Result<Listing, RedistributeError> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || list_records_blocking(&dir))
        .await
        .map_err(RedistributeError::Task)?
}

fn list_records_blocking(dir: &Path) -> Result<Listing, RedistributeError> {
    let read_err = |source| RedistributeError::ReadDataDir {
        dir: dir.to_path_buf(),
        source,
    };
    dir_metadata(dir)?;
    let mut listing = Listing::default();
    for entry in fs::read_dir(dir).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        let file_type = entry.file_type().map_err(read_err)?;
        let Ok(name) = entry.file_name().into_string() else {
            listing.foreign.push(Foreign {
                name: entry.file_name().to_string_lossy().into_owned(),
                what: "a name that is not UTF-8",
            });
            continue;
        };
        let foreign = if file_type.is_dir() && name == "lost+found" {
            let empty = fs::read_dir(entry.path())
                .map_err(read_err)?
                .next()
                .is_none();
            (!empty).then_some("a lost+found holding files fsck recovered")
        } else if is_own_file(&name) && !file_type.is_dir() {
            None
        } else if file_type.is_dir() {
            Some("a directory")
        } else if file_type.is_symlink() {
            Some("a symlink")
        } else if !file_type.is_file() {
            Some("a special file")
        } else if name.starts_with('.') {
            Some("a dot file the datastore does not write")
        } else if !drain_api::record::valid_key(&name) {
            Some("a file whose name is not a valid key")
        } else {
            let len = entry.metadata().map_err(read_err)?.len();
            listing.records.push((name, len));
            continue;
        };
        match foreign {
            Some(what) => listing.foreign.push(Foreign { name, what }),
            None => listing.skipped.push(name),
        }
    }
    listing.records.sort_unstable();
    listing.skipped.sort_unstable();
    listing.foreign.sort_unstable();
    Ok(listing)
}

/// Deletes a handed-over record's file. The directory is flushed once per round
/// ([`sync_dir`]), not per record: a deletion lost to a node crash only brings back a file
/// the owner already holds, which the next attempt sends again and the owner answers `412`.
pub async fn delete_record(dir: &Path, name: &str) -> Result<(), RedistributeError> {
    let path = dir.join(name);
    match tokio::fs::remove_file(&path).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(RedistributeError::DeleteRecord { path, source }),
    }
}

/// Flushes the directory, making the deletions so far durable.
pub async fn sync_dir(dir: &Path) -> Result<(), RedistributeError> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| RedistributeError::DeleteRecord { path: dir, source })
    })
    .await
    .map_err(RedistributeError::Task)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_entry_is_a_record_an_own_file_or_foreign_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        fs::write(data.join("key-1"), b"1").unwrap();
        fs::write(data.join(".tmp-77"), b"partial").unwrap();
        fs::write(data.join(".clock"), b"1").unwrap();
        fs::write(data.join(".clock.tmp"), b"1").unwrap();
        fs::write(data.join(".rebalance-key-2"), b"2").unwrap();
        fs::create_dir(data.join("lost+found")).unwrap();
        fs::write(data.join(".bash_history"), b"x").unwrap();
        fs::write(data.join("has space"), b"x").unwrap();
        fs::write(data.join("x".repeat(201)), b"x").unwrap();
        fs::create_dir(data.join("snapshots")).unwrap();
        fs::create_dir(data.join(".tmp-dir")).unwrap();
        std::os::unix::fs::symlink("key-1", data.join("alias")).unwrap();
        let listing = list_records(data).await.unwrap();
        assert_eq!(listing.records, [("key-1".to_owned(), 1)]);
        assert_eq!(
            listing.skipped,
            [
                ".clock",
                ".clock.tmp",
                ".rebalance-key-2",
                ".tmp-77",
                "lost+found"
            ]
        );
        let named: Vec<String> = listing.foreign.iter().map(ToString::to_string).collect();
        assert_eq!(
            named,
            [
                r#"".bash_history" (a dot file the datastore does not write)"#.to_owned(),
                r#"".tmp-dir" (a directory)"#.to_owned(),
                r#""alias" (a symlink)"#.to_owned(),
                r#""has space" (a file whose name is not a valid key)"#.to_owned(),
                r#""snapshots" (a directory)"#.to_owned(),
                format!(
                    r#""{}" (a file whose name is not a valid key)"#,
                    "x".repeat(201)
                ),
            ]
        );

        // A lost+found that holds files is data fsck recovered: foreign.
        fs::write(data.join("lost+found").join("#1234"), b"x").unwrap();
        let listing = list_records(data).await.unwrap();
        assert!(!listing.skipped.contains(&"lost+found".to_owned()));
        assert!(
            listing
                .foreign
                .iter()
                .any(|f| f.name == "lost+found" && f.what.contains("fsck"))
        );
    }

    #[test]
    fn leave_behind_patterns_are_exact_or_prefixes() {
        let patterns = ["VERSION".to_owned(), "snap-*".to_owned()];
        assert!(matches_any("VERSION", &patterns));
        assert!(!matches_any("VERSION2", &patterns));
        assert!(matches_any("snap-1", &patterns));
        assert!(matches_any("snap-", &patterns));
        assert!(!matches_any("snap", &patterns));
        assert!(!matches_any("x", &[]));
    }

    #[tokio::test]
    async fn lists_records_with_sizes_and_reports_what_it_skips() {
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
        assert_eq!(list_records(&data).await.unwrap(), Listing::default());
        fs::write(data.join("b"), b"22").unwrap();
        fs::write(data.join("a"), b"1").unwrap();
        fs::write(data.join(".tmp-1"), b"partial").unwrap();
        fs::create_dir(data.join("lost+found")).unwrap();
        let listing = list_records(&data).await.unwrap();
        assert_eq!(listing.records, [("a".into(), 1), ("b".into(), 2)]);
        assert_eq!(listing.skipped, [".tmp-1", "lost+found"]);
        assert!(listing.foreign.is_empty());
        assert_eq!(listing.bytes(), 3);
    }

    #[test]
    fn a_plain_directory_is_not_the_claim() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        fs::create_dir(&data).unwrap();
        assert!(matches!(
            check_data_dir(&data, false),
            Err(RedistributeError::DataDirNotMounted { .. })
        ));
        assert_eq!(check_data_dir(&data, true).unwrap(), Mounted::Allowed);
        assert!(matches!(
            check_data_dir(&dir.path().join("missing"), true),
            Err(RedistributeError::DataDirMissing { .. })
        ));
    }

    #[test]
    fn mount_points_are_found() {
        // `/` and `/proc` are mount points in any Linux process's view.
        assert_eq!(
            check_data_dir(Path::new("/"), false).unwrap(),
            Mounted::MountPoint
        );
        assert_eq!(
            check_data_dir(Path::new("/proc"), false).unwrap(),
            Mounted::MountPoint
        );
        assert_eq!(
            check_data_dir(Path::new("/proc/"), false).unwrap(),
            Mounted::MountPoint
        );
    }

    #[test]
    fn mountinfo_is_parsed_with_escapes() {
        let text = "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n\
                    30 22 8:2 /vol /var/lib/my\\040data rw - ext4 /dev/sdb rw\n";
        let points: Vec<PathBuf> = mount_points(text).collect();
        assert_eq!(
            points,
            [PathBuf::from("/"), PathBuf::from("/var/lib/my data")]
        );
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape("trailing\\"), "trailing\\");
    }
}
