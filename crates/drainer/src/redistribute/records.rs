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
//! Entries skipped by design (names starting with `.`, unfinished writes of the datastore, and
//! a `lost+found` directory) are reported in the [`Listing`], never silently dropped.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::RedistributeError;

/// The record files of a data directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Record files (name, size in bytes), sorted by name.
    pub records: Vec<(String, u64)>,
    /// Entries skipped by design, sorted.
    pub skipped: Vec<String>,
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
        let name = entry.file_name();
        let file_type = entry.file_type().map_err(read_err)?;
        if name.as_encoded_bytes().starts_with(b".") || (file_type.is_dir() && name == "lost+found")
        {
            listing.skipped.push(name.to_string_lossy().into_owned());
            continue;
        }
        if file_type.is_file() {
            let name = name
                .into_string()
                .map_err(|_| RedistributeError::NonUtf8Name { path: entry.path() })?;
            let len = entry.metadata().map_err(read_err)?.len();
            listing.records.push((name, len));
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
    listing.records.sort_unstable();
    listing.skipped.sort_unstable();
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
        fs::create_dir(data.join(".hidden-dir")).unwrap();
        let listing = list_records(&data).await.unwrap();
        assert_eq!(listing.records, [("a".into(), 1), ("b".into(), 2)]);
        assert_eq!(listing.skipped, [".hidden-dir", ".tmp-1", "lost+found"]);
        assert_eq!(listing.bytes(), 3);

        fs::create_dir(data.join("nested")).unwrap();
        assert!(matches!(
            list_records(&data).await,
            Err(RedistributeError::UnexpectedEntry {
                kind: "directory",
                ..
            })
        ));
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
