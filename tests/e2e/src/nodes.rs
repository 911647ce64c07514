//! The local cluster's nodes for the node tests: its workers (the nodes `tests/cluster/node` can
//! fail: the host node runs the control plane and the tests' controllers), and faults on them
//! that are undone when dropped, even when the test failed mid-way. Node tests take
//! [`exclusive`] for their whole run, so no two of them fail nodes at once.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client};

use crate::faults::{apply_example, store_of};
use crate::{TestNamespace, repo_root};

/// A way a node fails (`tests/cluster/node`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Its kubelet stops; its containers run on.
    Stop,
    /// Everything on it hangs.
    Freeze,
    /// Power loss: every process of it dies, its disk stays.
    Kill,
    /// Cut off the network: it runs on, unreachable.
    Cut,
}

impl Fault {
    fn verb(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Freeze => "freeze",
            Self::Kill => "kill",
            Self::Cut => "cut",
        }
    }
}

fn node_script(args: &[&str]) -> Result<String> {
    let out = Command::new(repo_root().join("tests/cluster/node"))
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("run tests/cluster/node")?;
    ensure!(
        out.status.success(),
        "tests/cluster/node {} failed ({})",
        args.join(" "),
        out.status
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A failed node, restored (`tests/cluster/node restore`, which also removes the out-of-service
/// taint and re-registers a deleted Node) when dropped.
#[must_use = "the node is restored when this is dropped"]
pub struct Failed {
    node: String,
}

impl Failed {
    /// Fails `node` as `fault` says.
    pub fn new(fault: Fault, node: &str) -> Result<Self> {
        crate::suite::say(format_args!("node {node}: {}", fault.verb()));
        node_script(&[fault.verb(), node])?;
        Ok(Self {
            node: node.to_owned(),
        })
    }

    /// Brings the node back now, and waits until it is Ready.
    pub fn restore(self) -> Result<()> {
        let node = self.node.clone();
        std::mem::forget(self);
        node_script(&["restore", &node]).map(|_| ())
    }
}

impl Drop for Failed {
    fn drop(&mut self) {
        if let Err(e) = node_script(&["restore", &self.node]) {
            eprintln!("restoring node {} failed: {e:#}", self.node);
        }
    }
}

/// Held by a node test for its whole run: node faults of two tests never overlap.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// The cluster's worker nodes, by name; fails (never skips) when it has fewer than `at_least`
/// (`STSD_NODES=N tests/cluster/up` makes N nodes: the host and N−1 workers).
pub async fn workers(client: &Client, at_least: usize) -> Result<Vec<String>> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await?;
    let workers: Vec<String> = nodes
        .items
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .filter(|n| n.starts_with("stsd-w"))
        .collect();
    if workers.len() < at_least {
        bail!(
            "this test needs {at_least} worker nodes and the cluster has {} ({workers:?}): \
             bring it up with STSD_NODES={} tests/cluster/up (after tests/cluster/down)",
            workers.len(),
            at_least + 1
        );
    }
    Ok(workers)
}

/// The host node (the one that is not a worker): it runs the control plane and is never failed.
pub async fn host(client: &Client) -> Result<String> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await?;
    nodes
        .items
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .find(|n| !n.starts_with("stsd-w"))
        .context("no host node")
}

/// Taints `node` `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`, as a person who
/// knows it is down for good does (non-graceful node shutdown).
pub fn declare_out_of_service(node: &str) -> Result<()> {
    kubectl_ok(&[
        "taint",
        "node",
        node,
        "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
    ])
}

/// Runs `kubectl ARGS`; fails with its stderr unless it succeeds.
pub fn kubectl_ok(args: &[&str]) -> Result<()> {
    let out = crate::kubectl().args(args).output()?;
    ensure!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Cordons `node` (marks it unschedulable), or uncordons it.
pub fn cordon(node: &str, cordoned: bool) -> Result<()> {
    kubectl_ok(&[if cordoned { "cordon" } else { "uncordon" }, node])
}

/// The example datastore with `replicas` pods on the host node (never failed) and drain pods
/// that run on the workers only (so that the test can fail the node of one), its drain slowed
/// to 150 records/s so that it can be caught mid-way; with `tolerate_all`, the drain pods
/// tolerate every taint, as database templates often do.
pub fn datastore_on_host_drained_on_workers(
    ns: &TestNamespace,
    host: &str,
    workers: &[String],
    replicas: u32,
    tolerate_all: bool,
) -> Result<()> {
    let placement = format!("nodeSelector: {{kubernetes.io/hostname: {host}}}");
    datastore(ns, &placement, Some(workers), replicas, tolerate_all)
}

/// The example datastore, its pods placed by `placement` (a line of the pod spec), its drain
/// pods on `drain_nodes` only (`None`: where the set's pods may go, the placement they inherit).
pub fn datastore(
    ns: &TestNamespace,
    placement: &str,
    drain_nodes: Option<&[String]>,
    replicas: u32,
    tolerate_all: bool,
) -> Result<()> {
    datastore_with(ns, placement, drain_nodes, replicas, tolerate_all, &[])
}

/// [`datastore`], with further edits of the example's manifest.
pub fn datastore_with(
    ns: &TestNamespace,
    placement: &str,
    drain_nodes: Option<&[String]>,
    replicas: u32,
    tolerate_all: bool,
    more: &[(&str, &str)],
) -> Result<()> {
    let tolerations = if tolerate_all {
        r#""tolerations": [{"operator": "Exists"}],"#
    } else {
        ""
    };
    let mut edits = vec![
        ("replicas: 3".to_owned(), format!("replicas: {replicas}")),
        (
            r#""--peer-port", "8080"]"#.to_owned(),
            r#""--peer-port", "8080", "--max-rate", "150"]"#.to_owned(),
        ),
        (
            r#""--interval", "30s""#.to_owned(),
            r#""--interval", "1h""#.to_owned(),
        ),
        (
            "      terminationGracePeriodSeconds: 10\n".to_owned(),
            format!("      terminationGracePeriodSeconds: 10\n      {placement}\n"),
        ),
    ];
    let account = r#""serviceAccountName": "datastore-drainer","#;
    match drain_nodes {
        Some(nodes) => {
            let nodes = serde_json::to_string(nodes)?;
            // The drain pods go where the template says, not where the set's pods go.
            edits.push((
                "    statefulsets.kubernetes.io/drainer-pod-template: |\n".to_owned(),
                "    statefulsets.kubernetes.io/drain-inherit-pod-spec: \"false\"\n    statefulsets.kubernetes.io/drainer-pod-template: |\n".to_owned(),
            ));
            edits.push((
                account.to_owned(),
                format!(
                    r#"{account}{tolerations}
          "affinity": {{"nodeAffinity": {{"requiredDuringSchedulingIgnoredDuringExecution": {{"nodeSelectorTerms": [{{"matchExpressions": [{{"key": "kubernetes.io/hostname", "operator": "In", "values": {nodes}}}]}}]}}}}}},"#
                ),
            ));
        }
        None => edits.push((account.to_owned(), format!("{account}{tolerations}"))),
    }
    let edits: Vec<(&str, &str)> = (edits.iter())
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .chain(more.iter().copied())
        .collect();
    apply_example(ns, &edits)
}

/// Every record readable from the pod of `ordinal`, with its exact value.
pub async fn all_records_on(
    ns: &TestNamespace,
    ordinal: i32,
    records: &BTreeMap<String, Vec<u8>>,
) -> Result<()> {
    let store = store_of(ns, ordinal).await?;
    let held = store.list().await?;
    ensure!(
        held.len() == records.len(),
        "pod {ordinal} holds {} of {} records",
        held.len(),
        records.len()
    );
    for (key, value) in records {
        let got = store
            .get(key)
            .await?
            .with_context(|| format!("{key} missing"))?;
        ensure!(got == *value, "record {key} differs");
    }
    Ok(())
}

/// The node `pod` is bound to.
pub fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.node_name.clone()
}

/// A cordoned node, uncordoned when dropped.
#[must_use = "the node is uncordoned when this is dropped"]
pub struct Cordoned {
    node: String,
}

impl Cordoned {
    /// Cordons `node`.
    pub fn new(node: &str) -> Result<Self> {
        cordon(node, true)?;
        Ok(Self {
            node: node.to_owned(),
        })
    }
}

impl Drop for Cordoned {
    fn drop(&mut self) {
        if let Err(e) = cordon(&self.node, false) {
            eprintln!("uncordoning node {} failed: {e:#}", self.node);
        }
    }
}

/// A node drained with `kubectl drain` as an administrator does for maintenance (evictions;
/// never `--force`), uncordoned when dropped.
#[must_use = "the node is uncordoned when this is dropped"]
pub struct Drained {
    node: String,
}

impl Drained {
    /// Runs `kubectl drain NODE --ignore-daemonsets --delete-emptydir-data` until it returns
    /// (it waits for every pod it evicted to be gone); fails with its stderr unless it succeeds.
    pub async fn new(node: &str) -> Result<Self> {
        crate::suite::say(format_args!("kubectl drain {node}"));
        let drained = Self {
            node: node.to_owned(),
        };
        let args = [
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=240s",
        ]
        .map(str::to_owned);
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kubectl_ok(&args)
        })
        .await??;
        Ok(drained)
    }
}

impl Drop for Drained {
    fn drop(&mut self) {
        if let Err(e) = cordon(&self.node, false) {
            eprintln!("uncordoning node {} failed: {e:#}", self.node);
        }
    }
}
