//! Command-line arguments of the `drainer` binary. Every option can also come from the
//! environment variable named in its help.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use drain_api::env;

/// Runs inside a drain pod: moves a drained StatefulSet ordinal's data to the remaining pods.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "drainer", version, about)]
pub struct Args {
    /// The drain's context, set by the controller.
    #[command(flatten)]
    pub drain: DrainContext,

    /// Log filter, in `tracing_subscriber::EnvFilter` syntax.
    #[arg(
        long,
        env = "RUST_LOG",
        default_value = "info",
        global = true,
        help_heading = "Logging"
    )]
    pub log_filter: String,

    /// Log as JSON lines instead of plain text.
    #[arg(
        long,
        env = "DRAINER_LOG_JSON",
        global = true,
        help_heading = "Logging"
    )]
    pub log_json: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The drain's context: the controller sets these variables in every container of a drain pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Drain context (set by the controller)")]
pub struct DrainContext {
    /// Name of the StatefulSet being scaled down.
    #[arg(long, env = env::STATEFULSET, global = true)]
    pub statefulset: Option<String>,

    /// Namespace of the StatefulSet and of this pod.
    #[arg(long, env = env::NAMESPACE, global = true)]
    pub namespace: Option<String>,

    /// The ordinal being drained.
    #[arg(long, env = env::ORDINAL, global = true)]
    pub ordinal: Option<i32>,

    /// `spec.replicas` when the drain pod was created (informational: peers are read live).
    #[arg(long, env = env::REPLICAS, global = true)]
    pub replicas: Option<i32>,

    /// `spec.ordinals.start` when the drain pod was created (informational: read live).
    #[arg(long, env = env::ORDINALS_START, global = true)]
    pub ordinals_start: Option<i32>,

    /// This drain pod's name.
    #[arg(long, env = env::POD_NAME, global = true)]
    pub pod_name: Option<String>,

    /// The set's `apiVersion`: `apps/v1` (the default) or `apps.kruise.io/v1beta1` for an
    /// OpenKruise Advanced StatefulSet, whose `reserveOrdinals` are then not peers.
    #[arg(long, env = env::STATEFULSET_API_VERSION, global = true)]
    pub statefulset_api_version: Option<String>,

    /// The completion record the controller hands this drain pod: written to the termination
    /// log when, and only when, the drain finished (redistribute and exec modes).
    #[arg(long, env = env::COMPLETION_RECORD, global = true, hide_env_values = true)]
    pub completion_record: Option<String>,

    /// Where the completion record is written: the container's `terminationMessagePath`.
    #[arg(long, env = "DRAIN_TERMINATION_LOG", global = true, default_value = drain_api::completion::TERMINATION_LOG)]
    pub termination_log: PathBuf,
}

impl DrainContext {
    /// The context as `DRAIN_*` variables, for a hook (only the values that are set).
    pub fn env_vars(&self) -> Vec<(String, String)> {
        let mut vars = Vec::new();
        let mut add = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                vars.push((name.to_owned(), value));
            }
        };
        add(env::STATEFULSET, self.statefulset.clone());
        add(env::NAMESPACE, self.namespace.clone());
        add(env::ORDINAL, self.ordinal.map(|v| v.to_string()));
        add(env::REPLICAS, self.replicas.map(|v| v.to_string()));
        add(
            env::ORDINALS_START,
            self.ordinals_start.map(|v| v.to_string()),
        );
        add(env::POD_NAME, self.pod_name.clone());
        add(
            env::STATEFULSET_API_VERSION,
            self.statefulset_api_version.clone(),
        );
        vars
    }
}

/// The modes.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Built-in mode: send every record file to the peer that owns its key, deleting each file
    /// once its owner acknowledged it.
    Redistribute(RedistributeArgs),
    /// Hook mode: run a command with the drain's context in its environment.
    Exec(ExecArgs),
    /// Sidecar mode, next to the app in each pod: move the records this pod holds but no longer
    /// owns (after a scale-up) to their owners, every `--interval`.
    Rebalance(RebalanceArgs),
}

/// How peers are found and addressed.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct PeerArgs {
    /// The peers' service port.
    #[arg(long, env = "DRAINER_PEER_PORT", default_value_t = 8080)]
    pub peer_port: u16,

    /// Address peers as `<pod>.<suffix>` (such as `datastore.ns.svc`) instead of by pod IP.
    #[arg(long, env = "DRAINER_PEER_DNS_SUFFIX")]
    pub peer_dns_suffix: Option<String>,
}

/// Options of `drainer redistribute`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct RedistributeArgs {
    /// Directory of the drained claim holding one file per record.
    #[arg(long, env = "DRAINER_DATA_DIR", default_value = "/data")]
    pub data_dir: PathBuf,

    /// Peers.
    #[command(flatten)]
    pub peers: PeerArgs,

    /// Records in flight at once.
    #[arg(long, env = "DRAINER_CONCURRENCY", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,

    /// Rate limits.
    #[command(flatten)]
    pub limits: LimitArgs,

    /// Retries of one record's PUT after a connection error or a 5xx/408/429 answer.
    #[arg(long, env = "DRAINER_PUT_RETRIES", default_value_t = 5)]
    pub put_retries: u32,

    /// First delay between PUT retries (doubles each time), such as `200ms` or `1s`.
    #[arg(long, env = "DRAINER_PUT_RETRY_DELAY", default_value = "200ms", value_parser = parse_duration)]
    pub put_retry_delay: Duration,

    /// Rounds at most (discover peers, send what is left) before failing.
    #[arg(long, env = "DRAINER_MAX_ROUNDS", default_value_t = 6,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rounds: u32,

    /// Delay before the second round (doubles each round, at most 30s).
    #[arg(long, env = "DRAINER_ROUND_DELAY", default_value = "2s", value_parser = parse_duration)]
    pub round_delay: Duration,

    /// A PUT fails (and is retried) when no byte moved and no answer came for this long. There
    /// is no total timeout: a big record on a slow link is fine, a stuck peer is not.
    #[arg(long, env = "DRAINER_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// Accept a data directory that is not a mount point, for layouts where the claim is
    /// mounted above it. Without it, a data directory that is not where a volume is mounted
    /// fails the drain (an empty or wrong directory would otherwise look drained).
    #[arg(long, env = "DRAINER_ALLOW_UNMOUNTED_DATA_DIR")]
    pub allow_unmounted_data_dir: bool,

    /// An entry of the data directory that is not a record but may be deleted with the claim:
    /// an exact name, or a prefix ending with `*` (repeat the flag, or separate with commas).
    /// Any other entry that is neither a record nor the datastore's own file (a subdirectory,
    /// a dot file, a name that is not a valid key, a lost+found holding recovered files) fails
    /// the drain by name after the records moved, and the claim stays.
    #[arg(
        long,
        env = "DRAINER_LEAVE_BEHIND",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub leave_behind: Vec<String>,

    /// Do not publish progress on the drain pod (the `drain-progress` annotation, which needs
    /// `patch` on pods).
    #[arg(long, env = "DRAINER_NO_PROGRESS_ANNOTATION")]
    pub no_progress_annotation: bool,

    /// Interval between progress log lines and progress annotation updates.
    #[arg(long, env = "DRAINER_PROGRESS_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub progress_interval: Duration,
}

/// How fast records are sent to the peers (`redistribute` and `rebalance`).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct LimitArgs {
    /// Records sent per second at most, across all concurrent PUTs; 0 means no limit.
    ///
    /// Caps the load on the remaining pods. Every PUT (a retry too) waits for its turn: PUTs
    /// start at least 1/N s apart, the first at once, and time spent idle (between rounds,
    /// waiting on slow answers) does not build up a burst. A PUT's wait for its turn does not
    /// count toward --idle-timeout.
    #[arg(
        long,
        env = "DRAINER_MAX_RATE",
        default_value_t = 0,
        value_name = "RECORDS_PER_SEC"
    )]
    pub max_rate: u32,

    /// Bytes of record values sent per second at most, across all concurrent PUTs; 0 means no
    /// limit.
    ///
    /// Caps the bandwidth large records take from the remaining pods, paced per 64 KiB chunk.
    /// A record still streaming counts as progress (`bytesSent` in the progress annotation),
    /// so a record that takes longer than `drain-stall-seconds` to send at this rate is not
    /// taken for a stalled drain.
    #[arg(
        long,
        env = "DRAINER_MAX_BYTES_PER_SECOND",
        default_value_t = 0,
        value_name = "BYTES_PER_SEC"
    )]
    pub max_bytes_per_second: u64,
}

/// Options of `drainer rebalance`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct RebalanceArgs {
    /// The pod's data directory, one file per record.
    #[arg(long, env = "DRAINER_DATA_DIR", default_value = "/data")]
    pub data_dir: PathBuf,

    /// Peers.
    #[command(flatten)]
    pub peers: PeerArgs,

    /// Records in flight at once.
    #[arg(long, env = "DRAINER_CONCURRENCY", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,

    /// Rate limits.
    #[command(flatten)]
    pub limits: LimitArgs,

    /// A PUT fails when no byte moved and no answer came for this long.
    #[arg(long, env = "DRAINER_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// This pod's own server, which releases a record once its owner holds it (`POST
    /// /records/{key}/release`). Default: `http://127.0.0.1:<peer-port>`.
    #[arg(long, env = "DRAINER_LOCAL_URL")]
    pub local_url: Option<url::Url>,

    /// Time between passes; 0 runs one pass and exits.
    #[arg(long, env = "DRAINER_REBALANCE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub interval: Duration,
}

/// Options of `drainer exec`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ExecArgs {
    /// Directory of the drained claim, passed to the command as `DRAIN_DATA_DIR`. It must be
    /// where the claim is mounted (as for `redistribute`), or the hook is not run.
    #[arg(long, env = "DRAINER_DATA_DIR", default_value = "/data")]
    pub data_dir: PathBuf,

    /// Accept a data directory that is not a mount point (the claim is mounted above it, or
    /// the hook does not use the data directory).
    #[arg(long, env = "DRAINER_ALLOW_UNMOUNTED_DATA_DIR")]
    pub allow_unmounted_data_dir: bool,

    /// Peers.
    #[command(flatten)]
    pub peers: PeerArgs,

    /// Do not discover peers: the command runs with `DRAIN_PEERS_STATUS=disabled` and the peer
    /// variables empty. Without it the command only runs once discovery worked, which needs the
    /// drain context and the Kubernetes API.
    #[arg(long, env = "DRAINER_NO_PEERS")]
    pub no_peers: bool,

    /// Run the command even when discovery finds no Ready peer: `DRAIN_PEERS_STATUS` is then
    /// `not-ready` (the set has other members, none Ready) or `none` (no other members: scaled
    /// to zero), and `DRAIN_PEERS` is empty. Without it such an attempt does not run the
    /// command and counts as one asking for a retry, so a command that loops over an empty
    /// `DRAIN_PEERS` cannot exit 0 having moved nothing.
    #[arg(
        long,
        env = "DRAINER_RUN_WITHOUT_READY_PEERS",
        conflicts_with = "no_peers"
    )]
    pub run_without_ready_peers: bool,

    /// After the command exits 0, how long the processes it started (the rest of its process
    /// group) may take to exit. If some still run then, they are stopped and the drain fails:
    /// it is not finished while they may still be moving or writing data.
    #[arg(long, env = "DRAINER_PROCESSES_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub processes_timeout: Duration,

    /// Retries at most when the command exits 75, peer discovery fails or finds no Ready peer
    /// (then the drainer fails).
    #[arg(long, env = "DRAINER_MAX_RETRIES", default_value_t = 10)]
    pub max_retries: u32,

    /// Delay before the first retry (doubles each time), such as `1s` or `500ms`.
    #[arg(long, env = "DRAINER_RETRY_BASE_DELAY", default_value = "1s", value_parser = parse_duration)]
    pub retry_base_delay: Duration,

    /// Longest delay between retries.
    #[arg(long, env = "DRAINER_RETRY_MAX_DELAY", default_value = "5m", value_parser = parse_duration)]
    pub retry_max_delay: Duration,

    /// The command and its arguments, after `--`.
    #[arg(required = true, num_args = 1.., last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// Parses `250ms`, `2s`, `5m`, `1h` (or a bare number of seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: want a number and ms, s, m or h"))?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        other => {
            return Err(format!(
                "invalid duration unit {other:?}: want ms, s, m or h"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("invalid duration {text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};
    use rstest::rstest;

    #[test]
    fn args_are_consistent() {
        Args::command().debug_assert();
    }

    #[rstest]
    #[case("250ms", Duration::from_millis(250))]
    #[case("2s", Duration::from_secs(2))]
    #[case("3", Duration::from_secs(3))]
    #[case("1.5s", Duration::from_millis(1500))]
    #[case("5m", Duration::from_secs(300))]
    #[case("1h", Duration::from_secs(3600))]
    fn parses_durations(#[case] text: &str, #[case] expected: Duration) {
        assert_eq!(parse_duration(text), Ok(expected));
    }

    #[rstest]
    #[case("")]
    #[case("s")]
    #[case("1d")]
    #[case("-1s")]
    #[case("1..2s")]
    fn rejects_bad_durations(#[case] text: &str) {
        assert!(parse_duration(text).is_err());
    }

    #[test]
    fn redistribute_flags() {
        let args = Args::try_parse_from([
            "drainer",
            "redistribute",
            "--data-dir",
            "/d",
            "--peer-port",
            "9000",
            "--peer-dns-suffix",
            "ds.ns.svc",
            "--statefulset",
            "ds",
            "--namespace",
            "ns",
            "--ordinal",
            "2",
        ])
        .unwrap();
        assert_eq!(args.drain.statefulset.as_deref(), Some("ds"));
        assert_eq!(args.drain.ordinal, Some(2));
        let Command::Redistribute(r) = args.command else {
            panic!("not redistribute");
        };
        assert_eq!(r.data_dir, PathBuf::from("/d"));
        assert_eq!(r.peers.peer_port, 9000);
        assert_eq!(r.peers.peer_dns_suffix.as_deref(), Some("ds.ns.svc"));
        assert_eq!(r.concurrency, 8);
        assert_eq!(r.max_rounds, 6);
        assert_eq!(r.limits.max_rate, 0, "unlimited by default");
        assert_eq!(r.limits.max_bytes_per_second, 0, "unlimited by default");
    }

    #[test]
    fn redistribute_max_rate() {
        let parse = |rate: &str| {
            Args::try_parse_from(["drainer", "redistribute", "--max-rate", rate]).map(|args| {
                let Command::Redistribute(r) = args.command else {
                    panic!("not redistribute");
                };
                r.limits.max_rate
            })
        };
        assert_eq!(parse("40").unwrap(), 40);
        assert_eq!(parse("0").unwrap(), 0);
        assert!(parse("-1").is_err());
        assert!(parse("1.5").is_err());
        assert!(parse("fast").is_err());
    }

    #[test]
    fn exec_takes_the_command_after_dashes() {
        let args = Args::try_parse_from([
            "drainer",
            "exec",
            "--max-retries",
            "3",
            "--retry-base-delay",
            "10ms",
            "--",
            "sh",
            "-c",
            "exit 0",
            "--not-a-drainer-flag",
        ])
        .unwrap();
        let Command::Exec(e) = args.command else {
            panic!("not exec");
        };
        assert_eq!(e.command, ["sh", "-c", "exit 0", "--not-a-drainer-flag"]);
        assert_eq!(e.max_retries, 3);
        assert_eq!(e.retry_base_delay, Duration::from_millis(10));
        assert_eq!(e.data_dir, PathBuf::from("/data"));
        assert!(!e.no_peers);
    }

    #[test]
    fn exec_needs_a_command_after_dashes() {
        assert!(Args::try_parse_from(["drainer", "exec"]).is_err());
        assert!(Args::try_parse_from(["drainer", "exec", "--"]).is_err());
        assert!(Args::try_parse_from(["drainer", "exec", "true"]).is_err());
    }

    #[test]
    fn context_env_vars() {
        let context = DrainContext {
            statefulset: Some("ds".to_owned()),
            namespace: Some("ns".to_owned()),
            ordinal: Some(2),
            replicas: Some(2),
            ordinals_start: None,
            pod_name: Some("ds-2".to_owned()),
            statefulset_api_version: Some("apps.kruise.io/v1beta1".to_owned()),
            completion_record: None,
            termination_log: PathBuf::from(drain_api::completion::TERMINATION_LOG),
        };
        let vars = context.env_vars();
        assert!(vars.contains(&(env::ORDINAL.to_owned(), "2".to_owned())));
        assert!(vars.contains(&(env::POD_NAME.to_owned(), "ds-2".to_owned())));
        assert!(vars.contains(&(
            env::STATEFULSET_API_VERSION.to_owned(),
            "apps.kruise.io/v1beta1".to_owned()
        )));
        assert!(!vars.iter().any(|(k, _)| k == env::ORDINALS_START));
    }
}
