//! Command-line options of `statefulset-drain-controller`.

use std::time::Duration;

use clap::Parser;

/// Drains the claims a StatefulSet scale-down leaves behind, with drain pods of the same name.
///
/// StatefulSets opt in with the annotation statefulsets.kubernetes.io/drainer-pod-template.
/// The cluster is found the standard way: in-cluster config, or KUBECONFIG.
#[derive(Clone, Debug, Parser)]
#[command(version, about, long_about)]
pub struct Args {
    /// Watch and act in this namespace only (default: all namespaces).
    #[arg(long, env = "DRAIN_CONTROLLER_NAMESPACE")]
    pub namespace: Option<String>,
    /// First delay before a failed drain is retried; doubles per failed attempt.
    #[arg(long, env = "DRAIN_CONTROLLER_RETRY_BASE_DELAY", default_value = "5s", value_parser = humantime::parse_duration)]
    pub retry_base_delay: Duration,
    /// Longest delay between drain attempts.
    #[arg(long, env = "DRAIN_CONTROLLER_RETRY_MAX_DELAY", default_value = "5m", value_parser = humantime::parse_duration)]
    pub retry_max_delay: Duration,
    /// A drain pod that has not started (or is blocked: image pull, unschedulable, config error)
    /// this long after its creation is stuck: a failed attempt, deleted and retried.
    #[arg(long, env = "DRAIN_CONTROLLER_STUCK_AFTER", default_value = "5m", value_parser = humantime::parse_duration)]
    pub stuck_after: Duration,
    /// A drain pod whose containers restarted this many times is stuck (a crash loop under
    /// restartPolicy OnFailure): a failed attempt, deleted and retried.
    #[arg(long, env = "DRAIN_CONTROLLER_MAX_RESTARTS", default_value_t = 3)]
    pub max_restarts: u32,
    /// Under drain-on-scale-up: finish, the longest a returning ordinal waits for a drain that
    /// makes no progress (from the scale-up or the drain's last published progress) before the
    /// drain is cancelled (Warning ScaleUpWaitExceeded).
    #[arg(long, env = "DRAIN_CONTROLLER_SCALE_UP_WAIT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub scale_up_wait: Duration,
    /// Address of the admin HTTP server: /metrics (Prometheus), /livez, /readyz. Port 0 picks
    /// a free port (logged).
    #[arg(
        long,
        env = "DRAIN_CONTROLLER_ADMIN_ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    pub admin_address: std::net::SocketAddr,
    /// Reconcile every opted-in StatefulSet at least this often, watch events or not.
    #[arg(long, env = "DRAIN_CONTROLLER_RESYNC", default_value = "5m", value_parser = humantime::parse_duration)]
    pub resync: Duration,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_filter: String,
    /// Log JSON lines instead of plain text.
    #[arg(long, env = "DRAIN_CONTROLLER_LOG_JSON")]
    pub log_json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn args_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn durations_parse() {
        let a = Args::parse_from([
            "x",
            "--retry-base-delay",
            "500ms",
            "--namespace",
            "ns",
            "--stuck-after",
            "20s",
        ]);
        assert_eq!(a.retry_base_delay, Duration::from_millis(500));
        assert_eq!(a.stuck_after, Duration::from_secs(20));
        assert_eq!(a.max_restarts, 3);
        assert_eq!(a.scale_up_wait, Duration::from_secs(300));
        assert_eq!(a.namespace.as_deref(), Some("ns"));
    }
}
