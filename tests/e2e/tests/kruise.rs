//! OpenKruise Advanced StatefulSets (`apps.kruise.io/v1beta1`) with the real kruise-manager
//! (`tests/cluster/kruise`): drained exactly like built-in sets, including an ordinal removed
//! from the middle with `reserveOrdinals`, a drain interrupted by un-reserving it, and a
//! controller started without the API that picks it up when it appears.
//!
//! The last test removes the CRD for a while (every Advanced StatefulSet with it), so it holds
//! the write side of [`CRD_LOCK`] and the others the read side.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use drain_api::annotations::DRAINER_POD_TEMPLATE as TEMPLATE;
use drain_api::env;
use e2e::faults::{
    DATASTORE, apply_example, assert_every_record_readable, hold, store_of, wait_set_event,
    write_records,
};
use e2e::objects::{SetBuilder, drain_template, sleeper};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client, kruise, wait_for};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tokio::sync::RwLock;

static CRD_LOCK: RwLock<()> = RwLock::const_new(());

/// A drain that succeeds only on the right claim with the right hostname.
const CHECK_OWNER: &str = "test \"$(cat /data/owner)\" = \"$HOSTNAME\"";

fn set(name: &str, script: &str) -> SetBuilder {
    SetBuilder::new(name).annotation(TEMPLATE, drain_template(script, &["data"], json!({})))
}

/// A test's start: Kruise required, a namespace of its own, the controller watching it.
async fn setup(prefix: &str) -> Result<(TestNamespace, ControllerProcess)> {
    let client = client().await;
    kruise::require(&client).await?;
    let ns = TestNamespace::new(&client, prefix).await?;
    let controller = ControllerProcess::start(&ns.name, &[]);
    Ok((ns, controller))
}

fn env_of<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    pod.spec.as_ref()?.containers[0]
        .env
        .as_ref()?
        .iter()
        .find(|v| v.name == name)?
        .value
        .as_deref()
}

#[tokio::test]
async fn an_advanced_statefulset_of_3_scaled_to_2_is_drained_like_a_built_in_set() -> Result<()> {
    let _shared = CRD_LOCK.read().await;
    let (ns, _controller) = setup("kruise-basic").await?;
    kruise::start(&ns, &set("web", CHECK_OWNER), json!({})).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let set_uid = kruise::api(&ns)
        .get("web")
        .await?
        .metadata
        .uid
        .unwrap_or_default();
    // Kruise's own pods: controlled by the Advanced StatefulSet.
    let pod0 = ns.api::<Pod>().get("web-0").await?;
    ensure!(
        pod0.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.api_version == "apps.kruise.io/v1beta1"
                && o.uid == set_uid
                && o.controller == Some(true)),
        "web-0 is Kruise's pod: {:?}",
        pod0.metadata.owner_references
    );

    kruise::patch_spec(&ns, "web", json!({"replicas": 2})).await?;
    let drain = wait_drain_pod(&ns, "web-2", None).await?;
    let spec = drain.spec.as_ref().expect("spec");
    ensure!(spec.hostname.as_deref() == Some("web-2"), "same hostname");
    let owner = &drain.metadata.owner_references.as_ref().expect("owner")[0];
    ensure!(
        owner.api_version == "apps.kruise.io/v1beta1"
            && owner.kind == "StatefulSet"
            && owner.uid == set_uid
            && owner.controller.is_none(),
        "the drain pod is owned (not controlled) by the Advanced StatefulSet: {owner:?}"
    );
    ensure!(
        env_of(&drain, env::STATEFULSET_API_VERSION) == Some("apps.kruise.io/v1beta1"),
        "the drain pod is told its set's kind"
    );

    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    wait_set_event(&ns, "web", "DrainSucceeded").await?;
    kruise::wait_ordinal_state(&ns, "web", 2, "done").await?;
    assert_claims_kept(&ns, &["data-web-0", "data-web-1"]).await?;
    ensure!(drain_pods(&ns).await?.is_empty(), "no drain pod left");
    Ok(())
}

#[tokio::test]
async fn reserving_ordinal_1_drains_it_into_0_and_2_and_loses_no_record() -> Result<()> {
    let _shared = CRD_LOCK.read().await;
    let (ns, _controller) = setup("kruise-reserve").await?;
    // The example datastore as an Advanced StatefulSet: its rebalance sidecars are told the kind
    // like drain pods are.
    apply_example(
        &ns,
        &[
            (
                "apiVersion: apps/v1\nkind: StatefulSet",
                "apiVersion: apps.kruise.io/v1beta1\nkind: StatefulSet",
            ),
            (
                "            - name: DRAIN_STATEFULSET\n              value: datastore\n",
                "            - name: DRAIN_STATEFULSET\n              value: datastore\n            - name: DRAIN_STATEFULSET_API_VERSION\n              value: apps.kruise.io/v1beta1\n",
            ),
        ],
    )?;
    wait_running(&ns, &pod_names(DATASTORE, 0..3)).await?;
    let records = write_records(&ns, 300, |i| (i % 3) as i32).await?;
    let pods = ns.api::<Pod>();
    let uid = |p: Pod| p.metadata.uid.unwrap_or_default();
    let (uid0, uid2) = (
        uid(pods.get("datastore-0").await?),
        uid(pods.get("datastore-2").await?),
    );
    let held_by_2 = store_of(&ns, 2).await?.list().await?.len();

    // Ordinal 1 out of 0..2: replicas 2 with 1 reserved keeps 0 and 2.
    kruise::patch_spec(
        &ns,
        DATASTORE,
        json!({"replicas": 2, "reserveOrdinals": [1]}),
    )
    .await?;
    let drain = wait_drain_pod(&ns, "datastore-1", None).await?;
    ensure!(
        env_of(&drain, env::STATEFULSET_API_VERSION) == Some("apps.kruise.io/v1beta1"),
        "the drain pod is told its set's kind"
    );
    wait_claim_gone(&ns, "data-datastore-1", Duration::from_secs(180)).await?;
    wait_pod_gone(&ns, "datastore-1", T).await?;

    ensure!(
        uid(pods.get("datastore-0").await?) == uid0 && uid(pods.get("datastore-2").await?) == uid2,
        "pods 0 and 2 kept running untouched"
    );
    assert_claims_kept(&ns, &["data-datastore-0", "data-datastore-2"]).await?;
    assert_every_record_readable(&ns, &[0, 2], &records).await?;
    // The drain placed records over the members 0 and 2: ordinal 2 received some (a drainer
    // that took 2 for out of range would have sent everything to 0).
    let now_on_2 = store_of(&ns, 2).await?.list().await?.len();
    ensure!(
        now_on_2 > held_by_2,
        "pod 2 received records of ordinal 1 ({held_by_2} before, {now_on_2} after)"
    );
    ensure!(drain_pods(&ns).await?.is_empty(), "no drain pod left");
    Ok(())
}

#[tokio::test]
async fn un_reserving_an_ordinal_mid_drain_cancels_the_drain_and_keeps_its_claim() -> Result<()> {
    let _shared = CRD_LOCK.read().await;
    let (ns, _controller) = setup("kruise-unreserve").await?;
    // A drain that never finishes by itself and exits 0 when told to stop: never a success.
    kruise::start(&ns, &set("web", &sleeper("true")), json!({})).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let claim = claim_uid(&ns, "data-web-1").await?;

    kruise::patch_spec(&ns, "web", json!({"replicas": 2, "reserveOrdinals": [1]})).await?;
    wait_drain_pod(&ns, "web-1", Some("Running")).await?;
    // Un-reserved: ordinal 1 is wanted again. The default policy (cancel) stops the drain, keeps
    // the claims, and Kruise's pod comes back on them.
    kruise::patch_spec(&ns, "web", json!({"replicas": 3, "reserveOrdinals": []})).await?;
    let cancelled = wait_set_event(&ns, "web", "DrainCancelled").await?;
    ensure!(
        cancelled.iter().any(|e| e.contains("web-1")),
        "a DrainCancelled event for ordinal 1: {cancelled:?}"
    );
    wait_stateful_pod_back(&ns, "web-1").await?;
    ensure!(
        claim_uid(&ns, "data-web-1").await? == claim,
        "the returning pod has its own claim back"
    );
    assert_claims_kept(&ns, &["data-web-0", "data-web-1", "data-web-2"]).await?;
    ensure!(drain_pods(&ns).await?.is_empty(), "no drain pod left");
    Ok(())
}

#[tokio::test]
async fn a_returning_ordinal_gets_its_kruise_pod_as_soon_as_a_slow_drain_pod_is_gone() -> Result<()>
{
    let _shared = CRD_LOCK.read().await;
    let (ns, _controller) = setup("kruise-release").await?;
    // A drain pod that ignores SIGTERM: deleted, it holds the name for its whole 25 s grace
    // period. Kruise, un-reserved, retries creating web-1 with a doubling backoff (…, 20 s,
    // 40 s) and does not watch our pod: only the controller's touch of the set brings web-1
    // back as soon as the name is free.
    let template = drain_template(
        "trap '' TERM; while true; do sleep 0.2; done",
        &["data"],
        json!({"terminationGracePeriodSeconds": 25}),
    );
    kruise::start(
        &ns,
        &SetBuilder::new("web").annotation(TEMPLATE, template),
        json!({}),
    )
    .await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    kruise::patch_spec(&ns, "web", json!({"replicas": 2, "reserveOrdinals": [1]})).await?;
    wait_drain_pod(&ns, "web-1", Some("Running")).await?;
    kruise::patch_spec(&ns, "web", json!({"replicas": 3, "reserveOrdinals": []})).await?;
    wait_set_event(&ns, "web", "DrainCancelled").await?;

    let pods = ns.api::<Pod>();
    let mut gone_at = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    let back_after = loop {
        ensure!(Instant::now() < deadline, "web-1 did not come back");
        match pods.get_opt("web-1").await? {
            None => {
                gone_at.get_or_insert_with(Instant::now);
            }
            Some(p) if !is_drain_pod(&p) => break gone_at.map(|g| g.elapsed()),
            Some(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Not seen absent at all: created within one 100 ms poll.
    let back_after = back_after.unwrap_or_default();
    eprintln!(
        "Kruise's web-1 created {back_after:?} after the drain pod was gone (0: within a 100 ms poll)"
    );
    ensure!(
        back_after < Duration::from_secs(5),
        "Kruise's pod came back {back_after:?} after the name was free"
    );
    wait_stateful_pod_back(&ns, "web-1").await?;
    // What told Kruise: the controller's note on the set.
    let set = kruise::api(&ns).get("web").await?;
    let released = set.metadata.annotations.unwrap_or_default();
    let released = released.get(drain_api::annotations::RELEASED);
    ensure!(
        released.is_some_and(|v| v.starts_with("web-1 ")),
        "drain-pod-released on the set: {released:?}"
    );
    assert_claims_kept(&ns, &["data-web-0", "data-web-1", "data-web-2"]).await?;
    Ok(())
}

#[tokio::test]
async fn a_built_in_and_an_advanced_set_of_one_name_are_never_drained() -> Result<()> {
    let _shared = CRD_LOCK.read().await;
    let (ns, _controller) = setup("kruise-clash").await?;
    // A built-in `web` (not opted in) scaled 3 → 2 leaves data-web-2 behind; an opted-in
    // Advanced `web` that wants no pod would take it for its own scale-down.
    start_set(&ns, &SetBuilder::new("web")).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    scale(&ns, "web", 2).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    kruise::api(&ns)
        .create(
            &kube::api::PostParams::default(),
            &kruise::advanced(&set("web", "true"), json!({"replicas": 0}))?,
        )
        .await?;
    let clash = wait_set_event(&ns, "web", "NameClash").await?;
    eprintln!("{clash:?}");
    hold(Duration::from_secs(5), "nothing drained", || async {
        ensure!(drain_pods(&ns).await?.is_empty(), "a drain pod was created");
        Ok(())
    })
    .await?;
    assert_claims_kept(&ns, &["data-web-0", "data-web-1", "data-web-2"]).await?;
    Ok(())
}

#[tokio::test]
async fn without_the_kruise_api_the_controller_serves_built_in_sets_and_picks_kruise_up_later()
-> Result<()> {
    let _exclusive = CRD_LOCK.write().await;
    let client = client().await;
    kruise::require(&client).await?;
    let ns = TestNamespace::new(&client, "kruise-absent").await?;
    let _restore = kruise::CrdGuard;
    kruise::remove_crd(&client).await?;

    let controller =
        ControllerProcess::start(&ns.name, &["--advanced-discovery-interval", "500ms"]);
    let log = || std::fs::read_to_string(&controller.log).unwrap_or_default();
    let not_served = "Advanced StatefulSets are not served";

    // Built-in sets are served as ever.
    start_set(&ns, &set("web", CHECK_OWNER)).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    scale(&ns, "web", 2).await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    // Asked many times (every 500 ms while the drain ran), said once.
    let said = log().matches(not_served).count();
    ensure!(
        said == 1,
        "said {said} times that Advanced StatefulSets are not served"
    );

    // The API appears: the controller serves it without a restart.
    let appeared = Instant::now();
    kruise::reinstall_crd(&client).await?;
    wait_for(
        T,
        "the controller serving Advanced StatefulSets",
        || async { Ok(log().contains("serving OpenKruise Advanced StatefulSets")) },
    )
    .await?;
    eprintln!(
        "Advanced StatefulSets served {:?} after the CRD was applied",
        appeared.elapsed()
    );
    kruise::start(&ns, &set("adv", CHECK_OWNER).replicas(2), json!({})).await?;
    wait_running(&ns, &pod_names("adv", 0..2)).await?;
    kruise::patch_spec(&ns, "adv", json!({"replicas": 1})).await?;
    wait_drain_pod(&ns, "adv-1", None).await?;
    wait_claim_gone(&ns, "data-adv-1", T).await?;
    wait_pod_gone(&ns, "adv-1", T).await?;
    assert_claims_kept(&ns, &["data-adv-0", "data-web-0", "data-web-1"]).await?;
    ensure!(log().matches(not_served).count() == 1, "still said once");
    Ok(())
}
