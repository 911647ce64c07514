//! How a redistribution fails ([`RedistributeError`]), and the foreign entries of a data
//! directory that stop it ([`Foreign`]).

use std::path::PathBuf;

use crate::peers::PeersError;

use super::transfer::PutError;

/// Why a redistribution failed. In every case, every record that no peer acknowledged is still
/// in the data directory.
#[derive(Debug, thiserror::Error)]
pub enum RedistributeError {
    /// The data directory does not exist (the claim is not mounted where expected).
    #[error("data directory {} does not exist", dir.display())]
    DataDirMissing {
        /// The data directory.
        dir: PathBuf,
    },
    /// The data directory is a file or something else.
    #[error("data directory {} is not a directory", dir.display())]
    DataDirNotADirectory {
        /// The data directory.
        dir: PathBuf,
    },
    /// The data directory is not where a volume is mounted, so it is not the drained claim.
    #[error(
        "data directory {} is not a mount point, so it is not the drained claim: mount the claim \
         there (check the drain template's volumeMounts, subPath and --data-dir), or pass \
         --allow-unmounted-data-dir if the claim is mounted above it", dir.display()
    )]
    DataDirNotMounted {
        /// The data directory.
        dir: PathBuf,
    },
    /// The data directory cannot be read.
    #[error("failed to read data directory {}", dir.display())]
    ReadDataDir {
        /// The data directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The data directory holds entries that are neither records nor the datastore's own
    /// files. Their content would go with the claim, so the drain does not finish.
    #[error(
        "{} {} in {} {}: {}; the records were moved, the claim stays. Move or delete {}, or \
         name {} with --leave-behind if {} may be deleted with the claim",
        entries.len(),
        if entries.len() == 1 { "entry" } else { "entries" },
        dir.display(),
        if entries.len() == 1 { "is not a record" } else { "are not records" },
        entries.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        if entries.len() == 1 { "it" } else { "them" },
        if entries.len() == 1 { "it" } else { "them" },
        if entries.len() == 1 { "it" } else { "they" },
    )]
    NotRecords {
        /// The data directory.
        dir: PathBuf,
        /// The entries.
        entries: Vec<Foreign>,
    },
    /// A record file could not be read.
    #[error("failed to read record file {}", path.display())]
    ReadRecord {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: PutError,
    },
    /// A moved record's file could not be deleted.
    #[error("failed to delete moved record file {}", path.display())]
    DeleteRecord {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Peers could not be discovered.
    #[error("failed to discover peers")]
    Discover(#[source] Box<PeersError>),
    /// The set has no other members to hold the data (scaled to zero or to only the drained one).
    #[error("no peers: the statefulset has no members besides the drained ordinal")]
    NoPeers,
    /// No member is Ready.
    #[error("no ready peers among members {members:?}")]
    NoReadyPeers {
        /// The members.
        members: Vec<i32>,
    },
    /// The owner of some records stayed not Ready.
    #[error("peer with ordinal {ordinal} owns records but is not ready")]
    OwnerNotReady {
        /// The owner.
        ordinal: i32,
    },
    /// A peer refused a record (answered `4xx`, or anything not retryable).
    #[error("peer {peer} refused record {key:?} at {url}")]
    PeerRefused {
        /// The record's key.
        key: String,
        /// The peer pod.
        peer: String,
        /// The URL of the `PUT`.
        url: String,
        /// The answer.
        #[source]
        source: PutError,
    },
    /// A peer refuses a record as too large (`413`): no retry will help.
    #[error(
        "peer {peer} refuses record {key:?} ({bytes} bytes) as too large; raise the peer's limit or split the record"
    )]
    RecordTooLarge {
        /// The record's key.
        key: String,
        /// The peer pod.
        peer: String,
        /// The record's size.
        bytes: u64,
        /// The answer.
        #[source]
        source: PutError,
    },
    /// A peer kept failing (no answer or `5xx`) through every retry and round.
    #[error("peer {peer} did not accept record {key:?} at {url}")]
    PeerUnavailable {
        /// The record's key.
        key: String,
        /// The peer pod.
        peer: String,
        /// The URL of the `PUT`.
        url: String,
        /// The last failure.
        #[source]
        source: PutError,
    },
    /// New record files kept appearing while records were moved (something still writes to
    /// the drained claim).
    #[error("{count} new record files appeared in the data directory during the drain")]
    RecordsAppeared {
        /// Record files found after the last round.
        count: usize,
    },
    /// The HTTP client could not be built.
    #[error("failed to build the http client")]
    HttpClient(#[source] reqwest::Error),
    /// A blocking file task panicked.
    #[error("file task failed")]
    Task(#[source] tokio::task::JoinError),
}

impl RedistributeError {
    /// A short category for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::DataDirMissing { .. } => "DataDirMissing",
            Self::DataDirNotADirectory { .. } => "DataDirNotADirectory",
            Self::DataDirNotMounted { .. } => "DataDirNotMounted",
            Self::RecordTooLarge { .. } => "RecordTooLarge",
            Self::ReadDataDir { .. } => "ReadDataDir",
            Self::NotRecords { .. } => "NotRecords",
            Self::ReadRecord { .. } => "ReadRecord",
            Self::DeleteRecord { .. } => "DeleteRecord",
            Self::Discover(_) => "DiscoverPeers",
            Self::NoPeers => "NoPeers",
            Self::NoReadyPeers { .. } => "NoReadyPeers",
            Self::OwnerNotReady { .. } => "OwnerNotReady",
            Self::PeerRefused { .. } => "PeerRefused",
            Self::PeerUnavailable { .. } => "PeerUnavailable",
            Self::RecordsAppeared { .. } => "RecordsAppeared",
            Self::HttpClient(_) => "HttpClient",
            Self::Task(_) => "Task",
        }
    }
}

/// An entry of the data directory that is not a record nor one of the datastore's own files.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Foreign {
    /// Its name (lossily decoded if it is not UTF-8).
    pub name: String,
    /// What it is.
    pub what: &'static str,
}

impl std::fmt::Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} ({})", self.name, self.what)
    }
}
