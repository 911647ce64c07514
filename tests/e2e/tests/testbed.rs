//! The test bed is real: a StatefulSet runs on the local cluster with claims bound through the PV
//! controller, a scale-down strands a claim (the problem this project solves), and a
//! run-to-completion pod reads data an earlier pod wrote.

use std::time::Duration;

use anyhow::Result;
use e2e::objects::{SetBuilder, job_pod};
use e2e::ops::{T, bound, pod_names, running_ready, scale, start_set, wait_pod_gone, wait_running};
use e2e::{TestNamespace, client, wait_for};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::PostParams;

#[tokio::test]
async fn statefulset_runs_with_bound_claims_on_kubernetes_1_36() -> Result<()> {
    let client = client().await;
    let version = client.apiserver_version().await?;
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "36"),
        "{version:?}"
    );

    let ns = TestNamespace::new(&client, "bed-run").await?;
    start_set(&ns, &SetBuilder::new("web")).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let claims = ns.api::<PersistentVolumeClaim>();
    for i in 0..3 {
        let c = claims.get(&format!("data-web-{i}")).await?;
        assert!(bound(&c), "data-web-{i} is not Bound: {:?}", c.status);
        assert!(
            c.spec
                .and_then(|s| s.volume_name)
                .is_some_and(|v| !v.is_empty())
        );
    }
    Ok(())
}

#[tokio::test]
async fn scale_down_deletes_the_pod_and_strands_its_claim() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "bed-scale").await?;
    start_set(&ns, &SetBuilder::new("web")).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;

    scale(&ns, "web", 2).await?;
    let pods = ns.api::<Pod>();
    wait_pod_gone(&ns, "web-2", T).await?;
    // Give the StatefulSet controller time to act on the claim, if it ever would.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let claim = ns.api::<PersistentVolumeClaim>().get("data-web-2").await?;
    assert!(
        claim.metadata.deletion_timestamp.is_none(),
        "claim is being deleted"
    );
    assert!(
        bound(&claim),
        "data-web-2 should stay Bound: {:?}",
        claim.status
    );
    assert!(
        pods.get_opt("web-1")
            .await?
            .is_some_and(|p| running_ready(&p))
    );
    Ok(())
}

#[tokio::test]
async fn run_to_completion_pod_reads_data_an_earlier_pod_wrote() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "bed-data").await?;
    start_set(&ns, &SetBuilder::new("web").replicas(1)).await?;
    wait_running(&ns, &pod_names("web", 0..1)).await?;
    // web-0 wrote its hostname to /data/owner; stop it and read the file from another pod.
    scale(&ns, "web", 0).await?;
    let pods = ns.api::<Pod>();
    wait_pod_gone(&ns, "web-0", T).await?;
    pods.create(
        &PostParams::default(),
        &job_pod(
            "reader",
            "data-web-0",
            "test \"$(cat /data/owner)\" = web-0",
        ),
    )
    .await?;
    let phase = || async {
        anyhow::Ok(
            pods.get("reader")
                .await?
                .status
                .and_then(|s| s.phase)
                .unwrap_or_default(),
        )
    };
    wait_for(T, "reader finished", || async {
        Ok(matches!(phase().await?.as_str(), "Succeeded" | "Failed"))
    })
    .await?;
    assert_eq!(
        phase().await?,
        "Succeeded",
        "the reader did not find web-0's data"
    );
    Ok(())
}
