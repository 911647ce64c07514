//! Drains whose node is lost, on the multi-node local cluster (`tests/cluster/node` fails a
//! worker): the set is told which node and what to do, the claims stay, and once the cluster
//! lets the drain pod go a new one resumes on another node; the data decides, not the
//! controller's words: every record reads back from the remaining pod.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use drain_api::names::claim_name;
use e2e::faults::{drain_status, ordinal_state, store_of, wait_set_event, write_records};
use e2e::nodes::{
    self, Failed, Fault, all_records_on, datastore, datastore_on_host_drained_on_workers, node_of,
};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

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
