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
    /// Watch and act in these namespaces only (default: all namespaces). Repeat the flag or
    /// separate the names with commas (`--namespace a,b`; the env var takes the comma form).
    #[arg(
        long = "namespace",
        env = "DRAIN_CONTROLLER_NAMESPACE",
        value_name = "NAMESPACE",
        value_delimiter = ',',
        action = clap::ArgAction::Append,
        value_parser = namespace_name,
    )]
    pub namespaces: Vec<String>,
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
    /// A running drain pod that published no progress and changed no container state this long
    /// is quiet: a Warning DrainQuiet, once, and the quiet_drains metric; it is left running
    /// (drain-stall-seconds makes such a drain a failed attempt). 0 never warns.
    #[arg(long, env = "DRAIN_CONTROLLER_QUIET_AFTER", default_value = "30m", value_parser = humantime::parse_duration)]
    pub quiet_after: Duration,
    /// A drain pod whose containers restarted this many times is stuck (a crash loop under
    /// restartPolicy OnFailure): a failed attempt, deleted and retried.
    #[arg(long, env = "DRAIN_CONTROLLER_MAX_RESTARTS", default_value_t = 3)]
    pub max_restarts: u32,
    /// A drain pod's node whose Ready condition has not been true this long is lost: a Warning
    /// DrainNodeLost naming the node and the remedy, status `stuck`, the drain pod asked to
    /// stop (it goes once the node is deleted or tainted out-of-service), the claims kept.
    #[arg(long, env = "DRAIN_CONTROLLER_NODE_LOST_AFTER", default_value = "1m", value_parser = humantime::parse_duration)]
    pub node_lost_after: Duration,
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

/// Parses one `--namespace` value: a namespace's name (a DNS label). An empty name (a stray
/// comma, `--namespace a,`) or one with spaces (`a, b`) would be watched as given and match
/// nothing, so it is refused here.
fn namespace_name(name: &str) -> Result<String, String> {
    let label = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if name.is_empty() {
        return Err("an empty namespace name (a stray comma?)".to_owned());
    }
    if name.len() > 63 || !name.chars().all(label) || name.starts_with('-') || name.ends_with('-') {
        return Err(format!(
            "{name:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
        ));
    }
    Ok(name.to_owned())
}

/// Where the service account's namespace is mounted in a pod.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

impl Args {
    /// The namespaces to watch, each once (empty: all namespaces). A name given twice is an
    /// error: each namespace is watched by a controller scope of its own, and two scopes on one
    /// namespace would both act on its sets.
    pub fn watched_namespaces(&self) -> Result<Vec<String>, ArgsError> {
        let mut seen = std::collections::BTreeSet::new();
        for ns in &self.namespaces {
            if !seen.insert(ns.as_str()) {
                return Err(ArgsError::DuplicateNamespace(ns.clone()));
            }
        }
        Ok(self.namespaces.clone())
    }

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
    /// A namespace named twice in `--namespace`.
    #[error("--namespace names {0} twice: name each namespace once")]
    DuplicateNamespace(String),
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
        assert_eq!(a.namespaces, ["ns"]);
    }

    /// `--namespace` repeated, comma-separated, or both; none is every namespace.
    #[rstest::rstest]
    #[case::none(&[], &[])]
    #[case::one(&["--namespace", "a"], &["a"])]
    #[case::repeated(&["--namespace", "a", "--namespace", "b"], &["a", "b"])]
    #[case::equals_form(&["--namespace=a", "--namespace=b"], &["a", "b"])]
    #[case::comma_separated(&["--namespace", "a,b"], &["a", "b"])]
    #[case::both(&["--namespace", "a,b", "--namespace", "c"], &["a", "b", "c"])]
    fn namespaces_parse(#[case] flags: &[&str], #[case] want: &[&str]) {
        let a =
            Args::try_parse_from(std::iter::once("x").chain(flags.iter().copied())).expect("valid");
        assert_eq!(a.watched_namespaces().expect("no duplicates"), want);
    }

    /// A name given twice is refused, with the name.
    #[rstest::rstest]
    #[case::repeated(&["--namespace", "a", "--namespace", "a"])]
    #[case::in_one_list(&["--namespace", "a,b,a"])]
    fn a_namespace_named_twice_is_refused(#[case] flags: &[&str]) {
        let a = Args::try_parse_from(std::iter::once("x").chain(flags.iter().copied()))
            .expect("parses");
        let e = a.watched_namespaces().expect_err("a duplicate");
        assert_eq!(
            e.to_string(),
            "--namespace names a twice: name each namespace once"
        );
    }

    /// An empty name (a stray comma) or one that is no namespace name is refused by clap, with
    /// the reason.
    #[rstest::rstest]
    #[case::empty(&["--namespace", ""], "an empty namespace name")]
    #[case::trailing_comma(&["--namespace", "a,"], "an empty namespace name")]
    #[case::double_comma(&["--namespace", "a,,b"], "an empty namespace name")]
    #[case::space(&["--namespace", "a, b"], "\" b\" is not a namespace name")]
    #[case::upper(&["--namespace", "Shop"], "\"Shop\" is not a namespace name")]
    fn a_bad_namespace_name_is_refused(#[case] flags: &[&str], #[case] why: &str) {
        let e = Args::try_parse_from(std::iter::once("x").chain(flags.iter().copied()))
            .expect_err("refused");
        assert!(e.to_string().contains(why), "{e}");
    }

    /// The env var takes one name or a comma-separated list. Run in a child process of this
    /// test binary (the environment is the process's, and setting it in a test is unsafe).
    #[test]
    fn namespaces_from_the_env_var() {
        const CHILD: &str = "STSD_CLI_TEST_CHILD";
        if let Ok(want) = std::env::var(CHILD) {
            let a = Args::try_parse_from(["x"]).expect("valid");
            assert_eq!(a.namespaces.join(","), want);
            return;
        }
        for value in ["a", "a,b", "a,b,c"] {
            let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", "cli::tests::namespaces_from_the_env_var"])
                .env("DRAIN_CONTROLLER_NAMESPACE", value)
                .env(CHILD, value)
                .output()
                .expect("run the test binary");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.contains("1 passed"),
                "DRAIN_CONTROLLER_NAMESPACE={value}: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
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
