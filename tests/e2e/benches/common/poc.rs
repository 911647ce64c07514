//! The 2018 proof of concept of this idea (`tests/bench/poc`: Marko Luksa's
//! statefulset-scaledown-controller), run out of cluster on a namespace of its own as the peer
//! in the benchmarks' tables.
//!
//! Its contract differs from ours in what the benchmarks see: its annotation is
//! `scaledown-pod-template` (a JSON Pod), its cleanup pods carry the label `scaledown-pod` and
//! must restart `OnFailure`, and it puts a finalizer on each set it handles.

use std::path::PathBuf;
use std::process::{Child, Command};

use anyhow::{Context, Result};
use e2e::{TestNamespace, kubeconfig_path, release_dir, wait_for};
use k8s_openapi::api::apps::v1::StatefulSet;

/// Its annotation on a set: the cleanup pod, a JSON `v1.Pod`.
pub const ANNOTATION: &str = "statefulsets.kubernetes.io/scaledown-pod-template";
/// The label of its cleanup pods.
pub const POD_LABEL: &str = "scaledown-pod";
/// The finalizer it puts on the sets it handles.
const FINALIZER: &str = "statefulsets.kubernetes.io/scaledown";

/// The PoC's binary (`tests/bench/poc/build`: built once, then cached).
fn binary() -> Result<PathBuf> {
    let text = e2e::harness("tests/bench/poc/build")?;
    let path = text
        .lines()
        .last()
        .context("tests/bench/poc/build printed no path")?;
    Ok(PathBuf::from(path.trim()))
}

/// The PoC running on one namespace (`--localOnly --namespace`), logging to
/// `e2e-logs/poc-<namespace>.log`; stopped when dropped, and its finalizer taken off the set
/// `web` then (so that the namespace can go, whether the run ended well or not).
pub struct Poc {
    child: Child,
    namespace: String,
}

impl Poc {
    /// Starts it on `ns`.
    pub fn start(ns: &str) -> Result<Self> {
        let logs = release_dir().join("e2e-logs");
        std::fs::create_dir_all(&logs)?;
        let log = std::fs::File::create(logs.join(format!("poc-{ns}.log")))?;
        let child = Command::new(binary()?)
            .arg("--kubeconfig")
            .arg(kubeconfig_path())
            .args([
                "--logtostderr",
                "--v",
                "2",
                "--localOnly",
                "--namespace",
                ns,
            ])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start the PoC")?;
        Ok(Self {
            child,
            namespace: ns.to_owned(),
        })
    }

    /// Waits until it has taken the set `set` in (its finalizer is on it): it acts on a set
    /// only from its next pass.
    pub async fn wait_handles(&self, ns: &TestNamespace, set: &str) -> Result<()> {
        let sets = ns.api::<StatefulSet>();
        wait_for(
            std::time::Duration::from_secs(120),
            "the PoC's finalizer on the set",
            || async {
                let s = sets.get(set).await?;
                Ok(s.metadata
                    .finalizers
                    .unwrap_or_default()
                    .iter()
                    .any(|f| f == FINALIZER))
            },
        )
        .await
    }
}

impl Drop for Poc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = e2e::kubectl()
            .args([
                "-n",
                &self.namespace,
                "patch",
                "statefulset",
                "web",
                "--type",
                "merge",
            ])
            .args(["-p", r#"{"metadata":{"finalizers":null}}"#])
            .output();
    }
}
