//! The drainer and the example datastore on the real cluster: a scale-down moves every record to
//! the remaining pods, a drain pod deleted mid-drain resumes without loss or duplicates, and hook
//! mode retries the retry exit code.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use drain_api::annotations::DRAINER_POD_TEMPLATE;
use drain_api::names::claim_name;
use e2e::faults::{apply_example, grant_drainer_rights, store_of, write_records};
use e2e::objects::{SetBuilder, drain_template};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;

const RECORDS: usize = 1000;

/// Every record readable from exactly one of the remaining pods, with its exact contents.
async fn assert_all_records_on(
    ns: &TestNamespace,
    ordinals: &[i32],
    records: &BTreeMap<String, Vec<u8>>,
) -> Result<()> {
    let mut seen: BTreeMap<String, i32> = BTreeMap::new();
    for &o in ordinals {
        let store = store_of(ns, o).await?;
        for key in store.list().await? {
            if let Some(first) = seen.insert(key.clone(), o) {
                anyhow::bail!("record {key} is on pods {first} and {o}");
            }
            let got = store.get(&key).await?.context("listed record readable")?;
            ensure!(
                records.get(&key) == Some(&got),
                "record {key} differs or is unknown"
            );
        }
    }
    ensure!(
        seen.len() == records.len(),
        "{} of {} records found",
        seen.len(),
        records.len()
    );
    Ok(())
}

#[tokio::test]
async fn scale_down_moves_every_record_to_the_remaining_pod() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "drain-move").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    apply_example(&ns, &[])?;
    wait_running(&ns, &pod_names("datastore", 0..3)).await?;
    let records = write_records(&ns, RECORDS, |i| {
        drainer::placement::owner(&format!("rec-{i:04}"), &[0, 1, 2])
    })
    .await?;
    for o in 0..3 {
        let n = store_of(&ns, o).await?.list().await?.len();
        assert!(
            n > RECORDS / 5,
            "pod {o} holds {n} records: placement spreads them"
        );
    }
    let mut volumes = Vec::new();
    for o in [1, 2] {
        let claim = ns
            .api::<PersistentVolumeClaim>()
            .get(&claim_name("data", "datastore", o))
            .await?;
        volumes.push(
            claim
                .spec
                .and_then(|s| s.volume_name)
                .context("bound volume")?,
        );
    }

    scale(&ns, "datastore", 1).await?;
    wait_claim_gone(&ns, "data-datastore-2", T).await?;
    wait_claim_gone(&ns, "data-datastore-1", T).await?;
    wait_pod_gone(&ns, "datastore-1", T).await?;
    assert_all_records_on(&ns, &[0], &records).await?;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for v in &volumes {
        wait_for(T, &format!("volume {v} released"), || async {
            Ok(pvs.get_opt(v).await?.is_none_or(|pv| {
                pv.status
                    .and_then(|s| s.phase)
                    .is_some_and(|p| p == "Released")
            }))
        })
        .await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_drain_pod_deleted_mid_drain_is_recreated_and_resumes_without_loss() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "drain-resume").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    // Two replicas, and a drain slowed to 150 records/s so it can be interrupted.
    // Records are placed on pod 1 on purpose: no rebalance may move them before the drain.
    apply_example(
        &ns,
        &[
            ("replicas: 3", "replicas: 2"),
            (
                r#""--peer-port", "8080"]"#,
                r#""--peer-port", "8080", "--max-rate", "150"]"#,
            ),
            (r#""--interval", "30s""#, r#""--interval", "1h""#),
        ],
    )?;
    wait_running(&ns, &pod_names("datastore", 0..2)).await?;
    // Everything on pod 1, the one to be drained.
    let records = write_records(&ns, RECORDS, |_| 1).await?;
    let first_uid = {
        scale(&ns, "datastore", 1).await?;
        let pods = ns.api::<Pod>();
        wait_drain_pod(&ns, "datastore-1", Some("Running")).await?;
        let target = store_of(&ns, 0).await?;
        wait_for(T, "some records moved", || async {
            Ok(target.list().await?.len() >= 100)
        })
        .await?;
        let moved = target.list().await?.len();
        assert!(
            moved < RECORDS,
            "the drain must still be in progress ({moved} moved)"
        );
        let pod = pods.get("datastore-1").await?;
        pods.delete("datastore-1", &DeleteParams::default()).await?;
        pod.metadata.uid.unwrap_or_default()
    };
    // Recreated (a new UID), resumes, finishes.
    let pods = ns.api::<Pod>();
    wait_for(T, "a new drain pod datastore-1", || async {
        Ok(pods
            .get_opt("datastore-1")
            .await?
            .is_some_and(|p| p.metadata.uid.as_deref() != Some(first_uid.as_str())))
    })
    .await?;
    wait_claim_gone(&ns, "data-datastore-1", Duration::from_secs(120)).await?;
    assert_all_records_on(&ns, &[0], &records).await?;
    let failed = wait_event(&ns, "datastore-1", "DrainFailed").await?;
    assert!(
        failed
            .iter()
            .any(|e| e.contains("deleted before it finished")),
        "{failed:?}"
    );
    wait_event(&ns, "datastore", "DrainRetrying").await?;
    Ok(())
}

#[tokio::test]
async fn hook_mode_reruns_the_retry_exit_code_then_succeeds() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "drain-hook").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    // The first run asks for a retry (75); the second checks its context and succeeds. With
    // restartPolicy Never any other failure would fail the pod and show as DrainFailed.
    let script = "if [ ! -e /data/.tried ]; then touch /data/.tried; echo retry please; exit 75; fi; \
                  test \"$DRAIN_DATA_DIR\" = /data && test \"$DRAIN_ORDINAL\" = 1 && test -e /data/owner";
    // The drainer checks through the API that /data is the drained claim: its account needs
    // the rights the example's drain pods have (without them the drain fails closed).
    grant_drainer_rights(&ns, "hook-drainer")?;
    let mut template: serde_json::Value = serde_json::from_str(&drain_template(
        script,
        &["data"],
        json!({"restartPolicy": "Never", "serviceAccountName": "hook-drainer"}),
    ))?;
    let container = &mut template["spec"]["containers"][0];
    container["image"] = json!("statefulset-drain.local/drainer-hook:test");
    container["command"] = json!([
        "/usr/local/bin/drainer",
        "exec",
        "--no-peers",
        "--retry-base-delay",
        "200ms",
        "--",
        "sh",
        "-c",
        script
    ]);
    let set = SetBuilder::new("h")
        .replicas(2)
        .annotation(DRAINER_POD_TEMPLATE, template.to_string());
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("h", 0..2)).await?;
    scale(&ns, "h", 1).await?;
    wait_claim_gone(&ns, "data-h-1", T).await?;
    wait_pod_gone(&ns, "h-1", T).await?;
    assert!(
        events(&ns, "DrainFailed").await?.is_empty(),
        "the retry happened inside the pod"
    );
    wait_event(&ns, "h", "DrainSucceeded").await?;
    Ok(())
}
