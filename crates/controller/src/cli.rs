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
    /// On SIGTERM, how long the reconciles in progress may take to finish before they are
    /// dropped (and the Lease, under --leader-elect, is left to expire instead of released).
    /// Keep it below the pod's terminationGracePeriodSeconds, minus a few seconds.
    #[arg(long, env = "DRAIN_CONTROLLER_STOP_GRACE", default_value = "20s", value_parser = humantime::parse_duration)]
    pub stop_grace: Duration,
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
    /// Until OpenKruise Advanced StatefulSets (`apps.kruise.io/v1beta1`) are served, ask the
    /// API server's discovery this often, and serve them as soon as the API appears.
    #[arg(long, env = "DRAIN_CONTROLLER_ADVANCED_DISCOVERY_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub advanced_discovery_interval: Duration,
    /// Watch, plan and report (log, Events with a DryRun prefix, the status annotation marked
    /// dryRun) but create and delete nothing: to see what the controller would do.
    #[arg(long, env = "DRAIN_CONTROLLER_DRY_RUN")]
    pub dry_run: bool,
    /// Run as one of several replicas: only the holder of a Lease acts; the others keep their
    /// caches warm and take over when the Lease expires or is released.
    #[arg(long, env = "DRAIN_CONTROLLER_LEADER_ELECT")]
    pub leader_elect: bool,
    /// Namespace of the leader-election Lease (default: POD_NAMESPACE, else the service
    /// account's namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_elect_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "statefulset-drain-controller")]
    pub leader_elect_lease_name: String,
    /// This replica's identity in the Lease (default: POD_NAME, else hostname_pid).
    #[arg(long, env = "POD_NAME")]
    pub leader_elect_identity: Option<String>,
    /// How long the Lease stays valid after its last renew (whole seconds): how soon a standby
    /// takes over from a leader that died.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long after its last successful renew the leader stops acting; the rest of the lease
    /// duration is the clock skew tolerated between replicas.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often the leader renews the Lease (whole seconds).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_filter: String,
    /// Log JSON lines instead of plain text.
    #[arg(long, env = "DRAIN_CONTROLLER_LOG_JSON")]
    pub log_json: bool,
}

/// Where the service account's namespace is mounted in a pod.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

impl Args {
    /// The leader-election settings, when `--leader-elect` is on.
    pub fn election(&self) -> Result<Option<crate::runtime::leader::ElectionConfig>, ArgsError> {
        if !self.leader_elect {
            return Ok(None);
        }
        let namespace = match &self.leader_elect_namespace {
            Some(ns) => ns.clone(),
            None => std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                .map(|s| s.trim().to_owned())
                .map_err(|_| ArgsError::NoLeaseNamespace)?,
        };
        let identity = match &self.leader_elect_identity {
            Some(id) => id.clone(),
            None => {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|s| s.trim().to_owned())
                    .unwrap_or_else(|_| "controller".to_owned());
                format!("{host}_{}", std::process::id())
            }
        };
        Ok(Some(crate::runtime::leader::ElectionConfig {
            namespace,
            lease_name: self.leader_elect_lease_name.clone(),
            identity,
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        }))
    }
}

/// Options that do not fit together.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// No namespace for the Lease.
    #[error(
        "--leader-elect needs the Lease's namespace: --leader-elect-namespace, POD_NAMESPACE, or a service account"
    )]
    NoLeaseNamespace,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn args_are_consistent() {
        Args::command().debug_assert();
    }

    /// Every flag is documented in docs/ (the operations page, or the install page for leader
    /// election), and the flags the operations page lists exist: a flag added, renamed or
    /// removed fails here until the docs say so.
    #[test]
    fn the_docs_name_every_flag_and_only_real_ones() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
        let read = |page: &str| std::fs::read_to_string(dir.join(page)).expect(page);
        let (operations, install) = (read("operations.md"), read("install.md"));
        let command = Args::command();
        let flags: Vec<String> = command
            .get_arguments()
            .filter_map(|a| a.get_long())
            .filter(|l| !matches!(*l, "help" | "version"))
            .map(|l| format!("--{l}"))
            .collect();
        for flag in &flags {
            assert!(
                operations.contains(&format!("`{flag}`")) || install.contains(&format!("`{flag}`")),
                "{flag} is not documented in docs/operations.md or docs/install.md"
            );
        }
        let listed = operations
            .split("- **Flags**")
            .nth(1)
            .and_then(|rest| rest.split("\n- **").next())
            .expect("the Flags item of docs/operations.md");
        for word in listed.split('`').skip(1).step_by(2) {
            if let Some(flag) = word.strip_prefix("--") {
                let flag = format!("--{}", flag.split_whitespace().next().unwrap_or(flag));
                assert!(
                    flags.contains(&flag),
                    "docs list {flag}, which the binary lacks"
                );
            }
        }
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
        assert_eq!(a.stop_grace, Duration::from_secs(20));
        assert_eq!(a.scale_up_wait, Duration::from_secs(300));
        assert_eq!(a.namespace.as_deref(), Some("ns"));
    }

    #[test]
    fn leader_election_is_off_by_default_and_configurable() {
        let a = Args::parse_from(["x"]);
        assert!(a.election().expect("no election").is_none());
        let a = Args::parse_from([
            "x",
            "--leader-elect",
            "--leader-elect-namespace",
            "sys",
            "--leader-elect-identity",
            "pod-a",
            "--leader-elect-lease-duration",
            "4s",
            "--leader-elect-renew-deadline",
            "3s",
            "--leader-elect-retry-period",
            "1s",
        ]);
        let e = a.election().expect("valid").expect("on");
        assert_eq!(
            (
                e.namespace.as_str(),
                e.identity.as_str(),
                e.lease_name.as_str()
            ),
            ("sys", "pod-a", "statefulset-drain-controller")
        );
        assert_eq!(e.lease_duration, Duration::from_secs(4));
        assert_eq!(e.check(), Ok(()));
    }
}
