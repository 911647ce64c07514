//! Node maintenance while drains run, on the multi-node local cluster: `kubectl drain` of the
//! node a drain pod runs on evicts it (no `--force`), and the drain resumes on another node
//! the placement it inherits allows; every record reads back from the remaining pod.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::faults::{store_of, write_records};
use e2e::nodes::{self, Drained, all_records_on, datastore, node_of};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use k8s_openapi::api::core::v1::Pod;

/// At 150 records/s, a drain of 20 s: `kubectl drain` comes well before its end.
const RECORDS: usize = 3000;

/// The datastore's pods may run on the two workers only (a required node affinity), and its
/// drain pods inherit that. Mid-drain, the drain pod's node is drained with `kubectl drain`
/// (its remaining stateful pod too, when it shares the node): the drain pod is evicted, a new
/// one runs on the other worker, never on the host its placement forbids, and finishes; every
/// record reads back from pod 0.
#[tokio::test]
async fn kubectl_drain_evicts_a_drain_pod_and_the_drain_finishes_on_another_allowed_node()
-> Result<()> {
    let _exclusive = nodes::exclusive().await;
    let client = client().await;
    let workers = nodes::workers(&client, 2).await?;
    let host = nodes::host(&client).await?;
    let (w1, w2) = (&workers[0], &workers[1]);
    let ns = TestNamespace::new(&client, "node-maint").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let placement = format!(
        "affinity: {{nodeAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: \
         {{nodeSelectorTerms: [{{matchExpressions: [{{key: kubernetes.io/hostname, operator: In, \
         values: [{w1}, {w2}]}}]}}]}}}}}}"
    );
    datastore(&ns, &placement, None, 2, false)?;
    wait_running(&ns, &pod_names("datastore", 0..2)).await?;
    let records = write_records(&ns, RECORDS, |_| 1).await?;

    scale(&ns, "datastore", 1).await?;
    let first = wait_drain_pod(&ns, "datastore-1", Some("Running")).await?;
    let drained = node_of(&first).context("drain pod bound to a node")?;
    ensure!(
        workers.contains(&drained),
        "the drain pod runs on {drained}, outside the placement it inherits"
    );
    let target = store_of(&ns, 0).await?;
    wait_for(T, "some records moved", || async {
        Ok(target.list().await?.len() >= 100)
    })
    .await?;
    let moved = target.list().await?.len();
    ensure!(
        moved < RECORDS / 2,
        "the drain must be in progress ({moved} moved)"
    );

    let maintenance = Drained::new(&drained).await?;
    let pods = ns.api::<Pod>();
    ensure!(
        pods.get_opt("datastore-1")
            .await?
            .is_none_or(|p| p.metadata.uid != first.metadata.uid),
        "kubectl drain returned with the drain pod still there"
    );
    let first_uid = first.metadata.uid.clone();
    wait_for(
        Duration::from_secs(180),
        "a new drain pod on another node",
        || async {
            Ok(pods
                .get_opt("datastore-1")
                .await?
                .is_some_and(|p| p.metadata.uid != first_uid && node_of(&p).is_some()))
        },
    )
    .await?;
    // A new drain pod at all: the first did not finish (its claims would be gone, and no drain
    // pod made again).
    let second = node_of(&pods.get("datastore-1").await?).unwrap_or_default();
    ensure!(
        second != drained && second != host,
        "the new drain pod runs on {second} (drained: {drained}; the placement allows {workers:?})"
    );
    wait_claim_gone(&ns, "data-datastore-1", Duration::from_secs(240)).await?;
    wait_running(&ns, &pod_names("datastore", 0..1)).await?;
    all_records_on(&ns, 0, &records).await?;
    e2e::suite::say(format_args!(
        "kubectl drain {drained}: the drain pod moved to {second} and finished"
    ));
    drop(maintenance);
    Ok(())
}
