//! Drains whose node is lost, on the multi-node local cluster (`tests/cluster/node` fails a
//! worker): the set is told which node and what to do, the claims stay, and once the cluster
//! lets the drain pod go a new one resumes on another node; the data decides, not the
//! controller's words: every record reads back from the remaining pod.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use drain_api::names::claim_name;
use e2e::faults::{drain_status, ordinal_state, store_of, wait_set_event, write_records};
use e2e::nodes::{
    self, Failed, Fault, all_records_on, datastore, datastore_on_host_drained_on_workers,
    datastore_with, node_of,
};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};

const RECORDS: usize = 1000;

/// The controller's `statefulset_drain_drains_on_lost_nodes` for the set.
async fn on_lost_nodes(controller: &ControllerProcess, ns: &TestNamespace) -> Result<f64> {
    let text = reqwest::get(format!("{}/metrics", controller.admin_url()))
        .await?
        .text()
        .await?;
    let series = format!(
        "statefulset_drain_drains_on_lost_nodes{{namespace=\"{}\",statefulset=\"datastore\"}} ",
        ns.name
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .context("no drains_on_lost_nodes series for the set")?
        .trim()
        .parse()
        .context("gauge value")
}

#[tokio::test]
async fn a_drain_whose_node_loses_power_is_reported_and_resumes_on_another_node() -> Result<()> {
    lost_mid_drain("node-lost", false).await
}

/// A template that tolerates every taint is never evicted from the dead node, nor removed by
/// the out-of-service taint alone (the cluster force-deletes only pods being deleted there):
/// without the controller's own delete it would stay `draining` for ever.
#[tokio::test]
async fn a_drain_pod_tolerating_every_taint_is_not_left_on_a_dead_node() -> Result<()> {
    lost_mid_drain("node-lost-tol", true).await
}

/// The drain pod's node loses power mid-drain: told, claims kept; declared out of service:
/// a new drain pod on the other worker finishes, and every record reads back from pod 0.
async fn lost_mid_drain(scenario: &str, tolerate_all: bool) -> Result<()> {
    let _exclusive = nodes::exclusive().await;
    let client = client().await;
    let workers = nodes::workers(&client, 2).await?;
    let host = nodes::host(&client).await?;
    let ns = TestNamespace::new(&client, scenario).await?;
    let controller = ControllerProcess::start(&ns.name, &["--node-lost-after=10s"]);
    datastore_on_host_drained_on_workers(&ns, &host, &workers, 2, tolerate_all)?;
    wait_running(&ns, &pod_names("datastore", 0..2)).await?;
    // Everything on pod 1, the one to be drained.
    let records = write_records(&ns, RECORDS, |_| 1).await?;
    let claims = ns.api::<PersistentVolumeClaim>();
    let claim = claims.get(&claim_name("data", "datastore", 1)).await?;

    scale(&ns, "datastore", 1).await?;
    let first = wait_drain_pod(&ns, "datastore-1", Some("Running")).await?;
    let lost = node_of(&first).context("drain pod bound to a node")?;
    ensure!(workers.contains(&lost), "drain pod on {lost}, not a worker");
    let target = store_of(&ns, 0).await?;
    wait_for(T, "some records moved", || async {
        Ok(target.list().await?.len() >= 100)
    })
    .await?;
    let failed = Failed::new(Fault::Kill, &lost)?;
    let moved = target.list().await?.len();
    ensure!(
        moved < RECORDS,
        "the drain must still be in progress ({moved} moved)"
    );

    // Told: a Warning naming the node and the remedy, status `stuck` naming it, the metric.
    let warned = wait_set_event(&ns, "datastore", "DrainNodeLost").await?;
    ensure!(
        warned.iter().any(|w| w.contains(&format!("node {lost}"))
            && w.contains("node.kubernetes.io/out-of-service")
            && w.contains("kubectl delete node")),
        "{warned:?}"
    );
    let status = drain_status(&ns, "datastore").await?.context("status")?;
    ensure!(
        ordinal_state(&status, 1) == Some("stuck")
            && status["ordinals"]["1"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains(&lost)),
        "{status}"
    );
    ensure!(
        on_lost_nodes(&controller, &ns).await? == 1.0,
        "the metric counts it"
    );
    // The claim stays, and the drain pod, asked to stop, holds the name until the cluster
    // lets it go.
    let kept = claims.get(&claim_name("data", "datastore", 1)).await?;
    ensure!(
        kept.metadata.uid == claim.metadata.uid && kept.metadata.deletion_timestamp.is_none(),
        "the claim was kept"
    );
    let pods = ns.api::<Pod>();
    wait_for(
        T,
        "the drain pod on the lost node asked to stop",
        || async {
            Ok(pods.get_opt("datastore-1").await?.is_some_and(|p| {
                p.metadata.uid == first.metadata.uid && p.metadata.deletion_timestamp.is_some()
            }))
        },
    )
    .await?;

    // A person declares the node shut down: the pod goes, a new one resumes elsewhere.
    nodes::declare_out_of_service(&lost)?;
    let first_uid = first.metadata.uid.clone();
    wait_for(
        Duration::from_secs(180),
        "a new drain pod on another node",
        || async {
            Ok(pods.get_opt("datastore-1").await?.is_some_and(|p| {
                p.metadata.uid != first_uid && node_of(&p).is_some_and(|n| n != lost)
            }))
        },
    )
    .await?;
    let second = node_of(&pods.get("datastore-1").await?).unwrap_or_default();
    wait_claim_gone(&ns, "data-datastore-1", Duration::from_secs(180)).await?;
    all_records_on(&ns, 0, &records).await?;
    e2e::suite::say(format_args!("drain pod moved from {lost} to {second}"));
    failed.restore()?;
    Ok(())
}

/// The removed pod is still on a node cut off the network, where its containers run on, when
/// someone force deletes it: no drain pod may start on its volume until the node is back (its
/// kubelet then stops them) and has been ready for a while; then the drain moves every record.
#[tokio::test]
async fn a_removed_pod_force_deleted_on_a_cut_off_node_starts_no_drain_until_the_node_is_back()
-> Result<()> {
    let _exclusive = nodes::exclusive().await;
    let client = client().await;
    let workers = nodes::workers(&client, 2).await?;
    let host = nodes::host(&client).await?;
    let (cut, spare) = (workers[0].clone(), workers[1].clone());
    let ns = TestNamespace::new(&client, "node-fence").await?;
    let _controller = ControllerProcess::start(&ns.name, &["--node-lost-after=10s"]);
    // Pod 0 on the host, pod 1 on the node to be cut: the set's pods on those two, one per
    // node, pod 0 placed while the other is cordoned.
    let placement = format!(
        "affinity: {{nodeAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: \
         {{nodeSelectorTerms: [{{matchExpressions: [{{key: kubernetes.io/hostname, operator: In, \
         values: [{host}, {cut}]}}]}}]}}}}, podAntiAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: \
         [{{topologyKey: kubernetes.io/hostname, labelSelector: {{matchLabels: {{app: datastore}}}}}}]}}}}"
    );
    nodes::cordon(&cut, true)?;
    let placed = async {
        datastore(
            &ns,
            &placement,
            Some(std::slice::from_ref(&spare)),
            1,
            false,
        )?;
        wait_running(&ns, &pod_names("datastore", 0..1)).await
    }
    .await;
    nodes::cordon(&cut, false)?;
    placed?;
    scale(&ns, "datastore", 2).await?;
    wait_running(&ns, &pod_names("datastore", 0..2)).await?;
    let pods = ns.api::<Pod>();
    let on = node_of(&pods.get("datastore-1").await?);
    ensure!(
        on.as_deref() == Some(cut.as_str()),
        "datastore-1 on {on:?}, not {cut}"
    );
    let records = write_records(&ns, 300, |_| 1).await?;

    let failed = Failed::new(Fault::Cut, &cut)?;
    scale(&ns, "datastore", 1).await?;
    // The pod cannot stop there: told, naming the node.
    let warned = wait_set_event(&ns, "datastore", "DrainNodeLost").await?;
    ensure!(
        warned
            .iter()
            .any(|w| w.contains("datastore-1") && w.contains(&format!("node {cut}"))),
        "{warned:?}"
    );
    // Someone force deletes it while its containers still run on the cut node.
    nodes::kubectl_ok(&[
        "-n",
        &ns.name,
        "delete",
        "pod",
        "datastore-1",
        "--grace-period=0",
        "--force",
    ])?;
    e2e::faults::wait_ordinal_state(&ns, "datastore", 1, "blocked").await?;
    e2e::faults::hold(
        Duration::from_secs(20),
        "no drain pod while the node is cut off",
        || async {
            ensure!(
                pods.get_opt("datastore-1").await?.is_none(),
                "a drain pod started on the volume of a pod that may still run on {cut}"
            );
            let status = drain_status(&ns, "datastore").await?.context("status")?;
            ensure!(ordinal_state(&status, 1) == Some("blocked"), "{status}");
            Ok(())
        },
    )
    .await?;
    let kept = ns
        .api::<PersistentVolumeClaim>()
        .get(&claim_name("data", "datastore", 1))
        .await?;
    ensure!(
        kept.metadata.deletion_timestamp.is_none(),
        "the claim was kept"
    );

    // The node comes back: its kubelet stops the pod's containers; the drain then runs.
    let back = std::time::Instant::now();
    failed.restore()?;
    wait_drain_pod(&ns, "datastore-1", None).await?;
    let waited = back.elapsed();
    ensure!(
        waited >= Duration::from_secs(20),
        "the drain started {waited:?} after the node came back"
    );
    wait_claim_gone(&ns, "data-datastore-1", Duration::from_secs(180)).await?;
    all_records_on(&ns, 0, &records).await?;
    Ok(())
}

/// `local` volumes (the cluster's `node-local` class), for pod `i` of the datastore on
/// `nodes[i]`, each reserved for its claim; removed (with their directories) when dropped.
struct LocalVolumes {
    names: Vec<String>,
    dirs: Vec<std::path::PathBuf>,
}

impl LocalVolumes {
    async fn new(client: &kube::Client, ns: &TestNamespace, nodes: &[&str]) -> Result<Self> {
        let api = kube::Api::<PersistentVolume>::all(client.clone());
        let mut made = Self {
            names: Vec::new(),
            dirs: Vec::new(),
        };
        for (i, node) in nodes.iter().enumerate() {
            // In the cluster's state directory, which `tests/cluster/down` removes.
            let state =
                std::env::var("STSD_CLUSTER_DIR").unwrap_or_else(|_| "/var/tmp/stsd".into());
            let dir = std::path::PathBuf::from(format!("{state}/local-volumes/{}/{i}", ns.name));
            std::fs::create_dir_all(&dir)?;
            std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
            made.dirs.push(dir.clone());
            let name = format!("{}-{i}", ns.name);
            let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": "100Mi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "node-local",
                    "claimRef": {"namespace": ns.name, "name": claim_name("data", "datastore", i32::try_from(i)?)},
                    "local": {"path": dir},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                    ]}]}},
                },
            }))?;
            api.create(&Default::default(), &pv).await?;
            made.names.push(name);
        }
        Ok(made)
    }
}

impl Drop for LocalVolumes {
    fn drop(&mut self) {
        // The claims go with the test's namespace; the volumes and their directories here (with
        // kubectl: the test's client needs the runtime this may be dropped in).
        for name in &self.names {
            let _ = e2e::kubectl()
                .args(["delete", "pv", name, "--wait=false", "--ignore-not-found"])
                .output();
        }
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
            let _ = dir.parent().map(std::fs::remove_dir);
            let _ = dir
                .parent()
                .and_then(|d| d.parent())
                .map(std::fs::remove_dir);
        }
    }
}

/// Data bound to a node: pod 1's claim is a `local` volume on a worker, so its drain pod runs
/// there. The worker loses power mid-drain and is declared out of service: the drain cannot
/// move. It is `blocked` (`DrainNodeBound`), its pod kept, not retried, the claim kept; once
/// the node is back, the drain finishes there and every record reads back from pod 0.
#[tokio::test]
async fn a_drain_of_data_bound_to_a_lost_node_waits_for_it_and_is_never_retried() -> Result<()> {
    let _exclusive = nodes::exclusive().await;
    let client = client().await;
    let workers = nodes::workers(&client, 2).await?;
    let host = nodes::host(&client).await?;
    let bound = workers[0].clone();
    let ns = TestNamespace::new(&client, "node-bound").await?;
    let _volumes = LocalVolumes::new(&client, &ns, &[&host, &bound]).await?;
    let _controller = ControllerProcess::start(&ns.name, &["--node-lost-after=10s"]);
    datastore_with(
        &ns,
        "enableServiceLinks: false",
        None,
        2,
        false,
        &[("storageClassName: standard", "storageClassName: node-local")],
    )?;
    wait_running(&ns, &pod_names("datastore", 0..2)).await?;
    let records = write_records(&ns, RECORDS, |_| 1).await?;

    scale(&ns, "datastore", 1).await?;
    let first = wait_drain_pod(&ns, "datastore-1", Some("Running")).await?;
    ensure!(
        node_of(&first).as_deref() == Some(bound.as_str()),
        "the drain pod runs on {:?}, not on {bound} where its volume is",
        node_of(&first)
    );
    let target = store_of(&ns, 0).await?;
    wait_for(T, "some records moved", || async {
        Ok(target.list().await?.len() >= 100)
    })
    .await?;
    let failed = Failed::new(Fault::Kill, &bound)?;
    let moved = target.list().await?.len();
    ensure!(
        moved < RECORDS,
        "the drain must still be in progress ({moved} moved)"
    );
    wait_set_event(&ns, "datastore", "DrainNodeLost").await?;
    // The remedy for data other nodes reach, applied here to data they cannot.
    nodes::declare_out_of_service(&bound)?;

    let warned = wait_set_event(&ns, "datastore", "DrainNodeBound").await?;
    ensure!(
        warned
            .iter()
            .any(|w| w.contains("PersistentVolume's node affinity")),
        "{warned:?}"
    );
    e2e::faults::wait_ordinal_state(&ns, "datastore", 1, "blocked").await?;
    let pods = ns.api::<Pod>();
    let waiting = pods.get("datastore-1").await?;
    ensure!(
        waiting.metadata.uid != first.metadata.uid && node_of(&waiting).is_none(),
        "a new drain pod, not scheduled"
    );
    let claims = ns.api::<PersistentVolumeClaim>();
    let claim = claims.get(&claim_name("data", "datastore", 1)).await?;
    e2e::faults::hold(
        Duration::from_secs(30),
        "the blocked drain pod kept, not retried, the claim kept",
        || async {
            let now = pods.get_opt("datastore-1").await?;
            ensure!(
                now.as_ref()
                    .is_some_and(|p| p.metadata.uid == waiting.metadata.uid
                        && p.metadata.deletion_timestamp.is_none()),
                "the blocked drain pod was replaced or deleted"
            );
            let kept = claims.get(&claim_name("data", "datastore", 1)).await?;
            ensure!(
                kept.metadata.uid == claim.metadata.uid
                    && kept.metadata.deletion_timestamp.is_none(),
                "the claim was not kept"
            );
            Ok(())
        },
    )
    .await?;

    // The node back: the same drain pod starts there and finishes.
    failed.restore()?;
    wait_claim_gone(&ns, "data-datastore-1", Duration::from_secs(240)).await?;
    all_records_on(&ns, 0, &records).await?;
    Ok(())
}
