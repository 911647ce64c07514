//! Settings, templates and sidecars of drains in flight (issue 22), on the real cluster: a drain
//! keeps the approval it started under when its set opts out; a template that names another
//! pod's claim, or mounts a claim only in an init container, is refused before any drain pod
//! exists; a sidecar that never exits (an injected mesh proxy) does not hold a finished drain,
//! and a native sidecar's restarts do not make a healthy drain stuck.
//!
//! Each fails on the controller before these changes: the claim is deleted without approval;
//! a drain pod mounts a live peer's claim; the drain stays `draining` for ever; `DrainStuck`.

use std::time::Duration;

use anyhow::{Result, ensure};
use drain_api::annotations::{APPROVAL, DRAINER_POD_TEMPLATE};
use drain_api::claim_annotations::APPROVED;
use e2e::faults::*;
use e2e::objects::{BUSYBOX, SetBuilder, drain_template, edit_template};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// How long a test watches to show that something does not happen.
const HOLD: Duration = Duration::from_secs(6);

/// A drain waiting for approval keeps waiting when its set opts out (the template annotation
/// removed): the setting it started under travels with its drain pod.
#[tokio::test]
async fn a_drain_awaiting_approval_still_waits_after_its_set_opts_out() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "flight-approval").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let set = SetBuilder::new("web")
        .annotation(
            DRAINER_POD_TEMPLATE,
            drain_template("true", &["data"], json!({})),
        )
        .annotation(APPROVAL, "manual");
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let uid = claim_uid(&ns, "data-web-2").await?;
    scale(&ns, "web", 2).await?;
    wait_ordinal_state(&ns, "web", 2, "awaitingApproval").await?;

    // Opt out: both annotations go, as `kubectl annotate sts web key-` would remove them.
    ns.api::<StatefulSet>()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                DRAINER_POD_TEMPLATE: null, APPROVAL: null
            }}})),
        )
        .await?;
    hold(HOLD, "the drained claim still waits for approval", || {
        assert_claim_unchanged(&ns, "data-web-2", &uid)
    })
    .await?;
    ns.api::<PersistentVolumeClaim>()
        .patch(
            "data-web-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {APPROVED: "true"}}})),
        )
        .await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    assert_claims_kept(&ns, &["data-web-0", "data-web-1"]).await?;
    Ok(())
}

/// A template that mounts a live peer's claim, or mounts its own claim only in an init
/// container, is refused with a Warning and no drain pod is made; fixed, the drain runs.
#[tokio::test]
async fn templates_that_mount_a_peers_claim_or_only_an_init_containers_are_refused() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "flight-templates").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let good = drain_template("true", &["data"], json!({}));
    let peer = edit_template(&good, |t| {
        t["spec"]["volumes"] =
            json!([{"name": "peer", "persistentVolumeClaim": {"claimName": "data-web-0"}}]);
        t["spec"]["containers"][0]["volumeMounts"]
            .as_array_mut()
            .expect("mounts")
            .push(json!({"name": "peer", "mountPath": "/peer"}));
    });
    start_set(
        &ns,
        &SetBuilder::new("web").annotation(DRAINER_POD_TEMPLATE, peer),
    )
    .await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let uid = claim_uid(&ns, "data-web-2").await?;
    scale(&ns, "web", 2).await?;
    let refused = wait_event(&ns, "web", "ForeignClaimInDrainTemplate").await?;
    ensure!(
        refused.iter().any(|e| e.contains("data-web-0")),
        "{refused:?}"
    );
    let no_drain_pod = || async {
        ensure!(drain_pods(&ns).await?.is_empty(), "a drain pod was created");
        assert_claim_unchanged(&ns, "data-web-2", &uid).await
    };
    hold(HOLD, "no drain pod on a peer's claim", no_drain_pod).await?;

    // The claim mounted only by an init container: nothing decides its drain.
    let init_only = edit_template(&good, |t| {
        let mounts = t["spec"]["containers"][0]["volumeMounts"].take();
        t["spec"]["initContainers"] = json!([{
            "name": "copy", "image": BUSYBOX, "imagePullPolicy": "Never",
            "command": ["true"], "volumeMounts": mounts,
        }]);
    });
    set_drain_template(&ns, "web", init_only).await?;
    let unmounted = wait_event(&ns, "web", "ClaimNotMounted").await?;
    ensure!(
        unmounted.iter().any(|e| e.contains("init container")),
        "{unmounted:?}"
    );
    hold(HOLD, "no drain pod without a deciding mount", no_drain_pod).await?;

    set_drain_template(&ns, "web", good).await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    assert_claims_kept(&ns, &["data-web-0", "data-web-1"]).await?;
    Ok(())
}

/// A drain pod with a second container that never exits (an injected mesh proxy, a log
/// shipper): once the drain container has exited 0 with its completion record, the claim is
/// deleted and the pod with its proxy goes.
#[tokio::test]
async fn a_sidecar_that_never_exits_does_not_hold_a_finished_drain() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "flight-mesh").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let template = edit_template(&drain_template("sleep 1", &["data"], json!({})), |t| {
        t["spec"]["containers"]
            .as_array_mut()
            .expect("containers")
            .push(json!({
                "name": "proxy", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"],
            }));
    });
    start_set(
        &ns,
        &SetBuilder::new("web").annotation(DRAINER_POD_TEMPLATE, template),
    )
    .await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    scale(&ns, "web", 2).await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    ensure!(events(&ns, "DrainStuck").await?.is_empty());
    assert_claims_kept(&ns, &["data-web-0", "data-web-1"]).await?;
    Ok(())
}

/// A native sidecar (an init container with `restartPolicy: Always`) that crash-loops beside a
/// healthy drain does not make the drain stuck: the drain finishes and its claim goes.
#[tokio::test]
async fn a_native_sidecars_restarts_do_not_make_a_healthy_drain_stuck() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "flight-sidecar").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let wait_for_go = "while [ ! -f /data/go ]; do sleep 0.2; done";
    let template = edit_template(&drain_template(wait_for_go, &["data"], json!({})), |t| {
        t["spec"]["initContainers"] = json!([{
            "name": "shipper", "image": BUSYBOX, "imagePullPolicy": "Never",
            "restartPolicy": "Always", "command": ["sh", "-c", "sleep 0.3; exit 1"],
        }]);
    });
    start_set(
        &ns,
        &SetBuilder::new("web").annotation(DRAINER_POD_TEMPLATE, template),
    )
    .await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    scale(&ns, "web", 2).await?;
    // The kubelet's back-off makes three restarts take about half a minute.
    wait_for(
        Duration::from_secs(120),
        "three restarts of the sidecar",
        || async {
            let pod = ns.api::<Pod>().get_opt("web-2").await?;
            Ok(pod
                .and_then(|p| p.status)
                .and_then(|s| s.init_container_statuses)
                .unwrap_or_default()
                .iter()
                .any(|c| c.name == "shipper" && c.restart_count >= 3))
        },
    )
    .await?;
    ensure!(
        events(&ns, "DrainStuck").await?.is_empty(),
        "the sidecar's restarts made the drain stuck"
    );
    exec(&ns, "web-2", "drain", "touch /data/go").await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    ensure!(events(&ns, "DrainStuck").await?.is_empty());
    Ok(())
}

/// Under the exit-code proof a drain pod whose proxy never exits can never succeed: the status
/// and a Warning say so (once), and the claim stays.
#[tokio::test]
async fn under_exit_code_a_drain_pod_kept_running_by_its_proxy_says_so() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "flight-mesh-exit").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let template = edit_template(
        &e2e::objects::drain_template_without_record("true", &["data"], json!({})),
        |t| {
            t["spec"]["containers"]
                .as_array_mut()
                .expect("containers")
                .push(json!({
                    "name": "proxy", "image": BUSYBOX, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"],
                }));
        },
    );
    start_set(
        &ns,
        &SetBuilder::new("web")
            .annotation(DRAINER_POD_TEMPLATE, template)
            .annotation(drain_api::annotations::SUCCESS_PROOF, "exit-code"),
    )
    .await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let uid = claim_uid(&ns, "data-web-2").await?;
    scale(&ns, "web", 2).await?;
    let said = wait_event(&ns, "web", "DrainPodNotEnding").await?;
    ensure!(said.iter().any(|e| e.contains("proxy")), "{said:?}");
    let status = wait_ordinal_state(&ns, "web", 2, "draining").await?;
    ensure!(
        status["ordinals"]["2"]["note"]
            .as_str()
            .is_some_and(|n| n.contains("proxy")),
        "{status}"
    );
    hold(
        HOLD,
        "the claim stays, and the Warning is not repeated",
        || async {
            assert_claim_unchanged(&ns, "data-web-2", &uid).await?;
            ensure!(events(&ns, "DrainPodNotEnding").await?.len() == 1);
            Ok(())
        },
    )
    .await?;
    Ok(())
}
