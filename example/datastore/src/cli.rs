//! Command-line arguments of the `datastore` binary.

use std::net::SocketAddr;
use std::path::PathBuf;

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

    /// Log filter, in `tracing_subscriber::EnvFilter` syntax.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_filter: String,

    /// Log as JSON lines instead of plain text.
    #[arg(long, env = "DATASTORE_LOG_JSON")]
    pub log_json: bool,
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
    }
}
