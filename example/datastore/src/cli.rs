//! Command-line arguments of the `datastore` binary.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;

use crate::http::{DEFAULT_MAX_CONCURRENT_REQUESTS, DEFAULT_MAX_RECORD_BYTES, Limits};

/// A partitioned key-value HTTP service keeping one file per record.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "datastore", version, about)]
pub struct Args {
    /// Directory holding the records (one file each).
    #[arg(long, env = "DATASTORE_DATA_DIR", default_value = "/data")]
    pub data_dir: PathBuf,

    /// Address to serve HTTP on.
    #[arg(long, env = "DATASTORE_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,

    /// Largest record body accepted, in bytes; larger ones get `413 Payload Too Large`.
    #[arg(long, env = "DATASTORE_MAX_RECORD_BYTES", default_value_t = DEFAULT_MAX_RECORD_BYTES)]
    pub max_record_bytes: u64,

    /// Record requests handled at once; further ones wait for a free slot.
    #[arg(
        long,
        env = "DATASTORE_MAX_CONCURRENT_REQUESTS",
        default_value_t = DEFAULT_MAX_CONCURRENT_REQUESTS
    )]
    pub max_concurrent_requests: NonZeroUsize,

    /// This server's name in the versions it gives writes (unique among the servers that
    /// exchange records: the pod's name). Default: the host name, which in a pod is its name.
    #[arg(long, env = "DATASTORE_NODE_NAME")]
    pub node_name: Option<String>,

    /// This pod's UID (the downward API's `metadata.uid`): a handover naming another pod's UID
    /// (the address was reused) is refused with `421`, and acknowledgements name it.
    #[arg(long, env = "DATASTORE_POD_UID")]
    pub pod_uid: Option<String>,

    /// Log filter, in `tracing_subscriber::EnvFilter` syntax.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_filter: String,

    /// Log as JSON lines instead of plain text.
    #[arg(long, env = "DATASTORE_LOG_JSON")]
    pub log_json: bool,
}

impl Args {
    /// The service limits these arguments ask for.
    pub fn limits(&self) -> Limits {
        Limits {
            max_record_bytes: self.max_record_bytes,
            max_concurrent_requests: self.max_concurrent_requests,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[test]
    fn args_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let args = Args::try_parse_from(["datastore"]).unwrap();
        assert_eq!(args.data_dir, PathBuf::from("/data"));
        assert_eq!(args.listen, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(args.limits(), Limits::default());
        assert_eq!(args.max_record_bytes, 1_073_741_824);
        assert_eq!(args.max_concurrent_requests.get(), 64);
    }

    #[test]
    fn limits_from_flags() {
        let args = Args::try_parse_from([
            "datastore",
            "--max-record-bytes",
            "1024",
            "--max-concurrent-requests",
            "2",
        ])
        .unwrap();
        assert_eq!(args.limits().max_record_bytes, 1024);
        assert_eq!(args.limits().max_concurrent_requests.get(), 2);
        assert!(Args::try_parse_from(["datastore", "--max-concurrent-requests", "0"]).is_err());
    }
}
