//! The drain controller on the real cluster: scale-downs drain through pods of the same name,
//! claims are deleted only after a drain succeeded, failures are retried, scale-ups, crashes,
//! bad input and namespace scoping behave as documented.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;
use drain_api::annotations::{DRAINER_POD_TEMPLATE as TEMPLATE, STATUS};
use e2e::objects::{SetBuilder, drain_template};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use serde_json::json;

/// A drain that succeeds only on the right claim with the right hostname.
const CHECK_OWNER: &str = "test \"$(cat /data/owner)\" = \"$HOSTNAME\"";

fn drain_set(name: &str, script: &str) -> SetBuilder {
    SetBuilder::new(name).annotation(TEMPLATE, drain_template(script, &["data"], json!({})))
}

/// Polls the drain pods until every `claims` is gone; returns (most drain pods seen at once,
/// drain pod names in the order they first appeared).
async fn watch_drains(ns: &TestNamespace, claims: &[String]) -> Result<(usize, Vec<String>)> {
    let api = ns.api::<PersistentVolumeClaim>();
    let mut max = 0;
    let mut order: Vec<String> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let pods = drain_pods(ns).await?;
        max = max.max(pods.len());
        for p in &pods {
            let n = p.metadata.name.clone().unwrap_or_default();
            if !order.contains(&n) {
                order.push(n);
            }
        }
        let mut left = 0;
        for c in claims {
            if api.get_opt(c).await?.is_some() {
                left += 1;
            }
        }
        if left == 0 && pods.is_empty() {
            return Ok((max, order));
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "drains did not finish: {left} claims left"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn scale_down_drains_with_a_pod_of_the_same_name_then_deletes_claim_and_pod() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-basic").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    start_set(&ns, &drain_set("web", &format!("{CHECK_OWNER} && sleep 2"))).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let uid2 = claim_uid(&ns, "data-web-2").await?;

    scale(&ns, "web", 2).await?;
    let pods = ns.api::<Pod>();
    wait_drain_pod(&ns, "web-2", None).await?;
    let drain = pods.get("web-2").await?;
    let spec = drain.spec.clone().unwrap();
    assert_eq!(spec.hostname.as_deref(), Some("web-2"));
    assert_eq!(spec.subdomain.as_deref(), Some("web"));
    let claim_vol = spec
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "data")
        .unwrap();
    assert_eq!(
        claim_vol.persistent_volume_claim.unwrap().claim_name,
        "data-web-2"
    );
    let recorded = &drain.metadata.annotations.unwrap()["statefulsets.kubernetes.io/drain-claims"];
    assert_eq!(recorded, &format!("{{\"data-web-2\":\"{uid2}\"}}"));
    let owner = &drain.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("StatefulSet", "web", None)
    );

    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    assert_claims_kept(&ns, &["data-web-0", "data-web-1"]).await?;
    wait_event(&ns, "web", "DrainSucceeded").await?;
    wait_event(&ns, "web", "ClaimsDeleted").await?;
    wait_event(&ns, "web-2", "DrainPodCreated").await?;
    let set = ns.api::<StatefulSet>().get("web").await?;
    let status = &set.metadata.annotations.unwrap()[STATUS];
    assert!(
        status.contains(r#""2":{"state":"done""#),
        "status: {status}"
    );
    Ok(())
}

/// A claim of a drained ordinal made again after its drain (as the StatefulSet controller does
/// when it acts on a stale replica count: it makes the claim, then no pod) is a new claim with
/// data no drain has seen: it is drained again, by a new drain pod bound to it by its new UID,
/// and deleted only after that drain; the claims of the ordinals that run are kept.
#[tokio::test]
async fn a_claim_made_again_for_a_drained_ordinal_is_drained_again() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-claim-again").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    // (The claim made again is empty: no owner to check.)
    start_set(&ns, &drain_set("web", "sleep 1")).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    scale(&ns, "web", 2).await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;

    let claims = ns.api::<PersistentVolumeClaim>();
    let again: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data-web-2", "labels": {"app": "web"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Mi"}}},
    }))?;
    let again = claims.create(&Default::default(), &again).await?;
    let uid = again.metadata.uid.clone().unwrap_or_default();
    let drain = wait_drain_pod(&ns, "web-2", None).await?;
    let recorded =
        &drain.metadata.annotations.unwrap_or_default()["statefulsets.kubernetes.io/drain-claims"];
    assert_eq!(recorded, &format!("{{\"data-web-2\":\"{uid}\"}}"));
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    assert_claims_kept(&ns, &["data-web-0", "data-web-1"]).await?;
    Ok(())
}

/// The controller keeps the pods and claims of the sets that opted in only: a set that opts in
/// while it runs has its pods and claims listed then. Its claim orphaned before it opted in is
/// drained (by the right drain pod: the drain checks the owner its pod wrote), its pods are
/// followed from then on (a later scale-down drains too), and the claim of the set that stays
/// out is kept. Meanwhile nothing of either set is touched before the opt-in.
#[tokio::test]
async fn a_set_that_opts_in_while_the_controller_runs_has_its_claims_found_and_drained()
-> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-opt-in-late").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    start_set(&ns, &SetBuilder::new("web")).await?;
    start_set(&ns, &SetBuilder::new("other")).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    wait_running(&ns, &pod_names("other", 0..3)).await?;
    scale(&ns, "web", 2).await?;
    scale(&ns, "other", 2).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    wait_pod_gone(&ns, "other-2", T).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    anyhow::ensure!(
        drain_pods(&ns).await?.is_empty(),
        "a drain pod for a set that has not opted in"
    );
    assert_claims_kept(&ns, &["data-web-2", "data-other-2"]).await?;

    set_drain_template(
        &ns,
        "web",
        drain_template(&format!("{CHECK_OWNER} && sleep 1"), &["data"], json!({})),
    )
    .await?;
    wait_drain_pod(&ns, "web-2", None).await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    // Its pods are followed now: the next scale-down drains at once.
    scale(&ns, "web", 1).await?;
    wait_claim_gone(&ns, "data-web-1", T).await?;
    wait_pod_gone(&ns, "web-1", T).await?;
    assert_claims_kept(
        &ns,
        &["data-web-0", "data-other-0", "data-other-1", "data-other-2"],
    )
    .await?;
    anyhow::ensure!(drain_pods(&ns).await?.is_empty(), "a drain pod left behind");
    Ok(())
}

#[tokio::test]
async fn ordered_ready_scale_to_zero_drains_one_at_a_time_highest_first() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-ordered").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    start_set(&ns, &drain_set("db", &format!("{CHECK_OWNER} && sleep 2"))).await?;
    wait_running(&ns, &pod_names("db", 0..3)).await?;
    scale(&ns, "db", 0).await?;
    let claims: Vec<String> = (0..3).map(|o| format!("data-db-{o}")).collect();
    let (max, order) = watch_drains(&ns, &claims).await?;
    assert_eq!(max, 1, "OrderedReady drains one ordinal at a time");
    assert_eq!(order, vec!["db-2", "db-1", "db-0"]);
    Ok(())
}

#[tokio::test]
async fn parallel_scale_to_zero_drains_all_at_once() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-parallel").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    start_set(
        &ns,
        &drain_set("db", &format!("{CHECK_OWNER} && sleep 4")).parallel(),
    )
    .await?;
    wait_running(&ns, &pod_names("db", 0..3)).await?;
    scale(&ns, "db", 0).await?;
    let claims: Vec<String> = (0..3).map(|o| format!("data-db-{o}")).collect();
    let (max, order) = watch_drains(&ns, &claims).await?;
    assert!(
        max >= 2,
        "Parallel drains overlap (saw at most {max} at once)"
    );
    assert_eq!(order.iter().collect::<BTreeSet<_>>().len(), 3);
    Ok(())
}

#[tokio::test]
async fn two_claim_templates_are_drained_and_deleted_together() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-two").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let script = format!("{CHECK_OWNER} && test -d /logs");
    let set = SetBuilder::new("kv")
        .replicas(2)
        .claims(&["data", "logs"])
        .annotation(
            TEMPLATE,
            drain_template(&script, &["data", "logs"], json!({})),
        );
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("kv", 0..2)).await?;
    scale(&ns, "kv", 1).await?;
    wait_claim_gone(&ns, "data-kv-1", T).await?;
    wait_claim_gone(&ns, "logs-kv-1", T).await?;
    wait_pod_gone(&ns, "kv-1", T).await?;
    assert_claims_kept(&ns, &["data-kv-0", "logs-kv-0"]).await?;
    Ok(())
}

#[tokio::test]
async fn ordinals_start_is_respected() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-start").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    start_set(&ns, &drain_set("st", CHECK_OWNER).ordinals_start(5)).await?;
    wait_running(&ns, &pod_names("st", 5..8)).await?;
    scale(&ns, "st", 2).await?;
    wait_claim_gone(&ns, "data-st-7", T).await?;
    wait_pod_gone(&ns, "st-7", T).await?;
    assert_claims_kept(&ns, &["data-st-5", "data-st-6"]).await?;
    Ok(())
}

#[tokio::test]
async fn a_drain_that_fails_twice_is_retried_until_it_succeeds() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-retry").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    // Counts its runs on the claim itself: fails on runs 1 and 2, succeeds on run 3.
    let script = "n=$(cat /data/runs 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/runs; \
                  echo run $n; test $n -ge 3";
    let set = SetBuilder::new("r").replicas(2).annotation(
        TEMPLATE,
        drain_template(script, &["data"], json!({"restartPolicy": "Never"})),
    );
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("r", 0..2)).await?;
    scale(&ns, "r", 1).await?;
    let claims = ns.api::<PersistentVolumeClaim>();
    let attempts_seen = std::sync::Mutex::new(BTreeSet::new());
    let seen = &attempts_seen;
    let claims = &claims;
    wait_for(T, "claim data-r-1 gone after retries", || async move {
        match claims.get_opt("data-r-1").await? {
            Some(c) => {
                if let Some(a) = c
                    .metadata
                    .annotations
                    .unwrap_or_default()
                    .get("statefulsets.kubernetes.io/drain-attempts")
                {
                    seen.lock().unwrap().insert(a.clone());
                }
                Ok(false)
            }
            None => Ok(true),
        }
    })
    .await?;
    let failed = events(&ns, "DrainFailed").await?;
    assert_eq!(
        failed.iter().filter(|e| e.starts_with("r-1: ")).count(),
        2,
        "{failed:?}"
    );
    let attempts_seen = attempts_seen.into_inner().unwrap();
    assert!(
        attempts_seen.contains("2"),
        "attempts visible on the claim: {attempts_seen:?}"
    );
    wait_event(&ns, "r", "DrainRetrying").await?;
    wait_pod_gone(&ns, "r-1", T).await?;
    Ok(())
}

#[tokio::test]
async fn scale_up_during_a_drain_finishes_it_and_the_returning_pod_gets_a_fresh_claim() -> Result<()>
{
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-up-finish").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    start_set(
        &ns,
        &drain_set("f", &format!("{CHECK_OWNER} && sleep 4"))
            .replicas(2)
            .annotation(drain_api::annotations::ON_SCALE_UP, "finish"),
    )
    .await?;
    wait_running(&ns, &pod_names("f", 0..2)).await?;
    let old = claim_uid(&ns, "data-f-1").await?;
    scale(&ns, "f", 1).await?;
    wait_drain_pod(&ns, "f-1", Some("Running")).await?;
    scale(&ns, "f", 2).await?;
    // The stateful pod comes back only after the drain, on a fresh claim with no old data.
    wait_stateful_pod_back(&ns, "f-1").await?;
    let fresh = claim_uid(&ns, "data-f-1").await?;
    assert_ne!(
        old, fresh,
        "the returning pod must not get the drained claim"
    );
    wait_event(&ns, "f", "ClaimsDeleted").await?;
    Ok(())
}

#[tokio::test]
async fn under_finish_a_returning_pod_waits_at_most_the_scale_up_wait() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-up-wait").await?;
    let _controller = ControllerProcess::start(&ns.name, &["--scale-up-wait", "4s"]);
    // A drain that can never finish (it waits for a peer that will not come).
    let set = drain_set("w", "sleep 3600")
        .replicas(2)
        .annotation(drain_api::annotations::ON_SCALE_UP, "finish");
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("w", 0..2)).await?;
    let old = claim_uid(&ns, "data-w-1").await?;
    scale(&ns, "w", 1).await?;
    wait_drain_pod(&ns, "w-1", Some("Running")).await?;
    scale(&ns, "w", 2).await?;
    let started = std::time::Instant::now();
    wait_event(&ns, "w", "ScaleUpWaitExceeded").await?;
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "cancelled before the scale-up wait: {:?}",
        started.elapsed()
    );
    wait_stateful_pod_back(&ns, "w-1").await?;
    assert_eq!(
        claim_uid(&ns, "data-w-1").await?,
        old,
        "the returning pod gets its claim back"
    );
    Ok(())
}

#[tokio::test]
async fn scale_up_during_a_drain_with_cancel_gives_the_returning_pod_its_data() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-up-cancel").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let set = drain_set("c", "sleep 600")
        .replicas(2)
        .annotation("statefulsets.kubernetes.io/drain-on-scale-up", "cancel")
        // The returning pod checks that it finds its own data (written by its first run).
        .script("test ! -e /data/owner || test \"$(cat /data/owner)\" = \"$HOSTNAME\"; echo $HOSTNAME > /data/owner; echo back >> /data/log");
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("c", 0..2)).await?;
    let old = claim_uid(&ns, "data-c-1").await?;
    scale(&ns, "c", 1).await?;
    wait_drain_pod(&ns, "c-1", Some("Running")).await?;
    scale(&ns, "c", 2).await?;
    wait_stateful_pod_back(&ns, "c-1").await?;
    assert_eq!(
        claim_uid(&ns, "data-c-1").await?,
        old,
        "the returning pod gets its claim back"
    );
    wait_event(&ns, "c", "DrainCancelled").await?;
    let claim = ns.api::<PersistentVolumeClaim>().get("data-c-1").await?;
    let annotations = claim.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations
            .keys()
            .any(|k| k.starts_with("statefulsets.kubernetes.io/drain-")),
        "drain record cleared: {annotations:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_controller_killed_mid_drain_resumes_after_a_restart() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-crash").await?;
    let mut controller = ControllerProcess::start(&ns.name, &[]);
    start_set(
        &ns,
        &drain_set("k", &format!("{CHECK_OWNER} && sleep 3")).replicas(2),
    )
    .await?;
    wait_running(&ns, &pod_names("k", 0..2)).await?;
    scale(&ns, "k", 1).await?;
    wait_drain_pod(&ns, "k-1", None).await?;
    controller.kill();
    wait_drain_pod(&ns, "k-1", Some("Succeeded")).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let claim = ns.api::<PersistentVolumeClaim>().get("data-k-1").await?;
    assert!(
        claim.metadata.deletion_timestamp.is_none(),
        "nothing acts while the controller is down"
    );
    let _restarted = ControllerProcess::start(&ns.name, &[]);
    wait_claim_gone(&ns, "data-k-1", T).await?;
    wait_pod_gone(&ns, "k-1", T).await?;
    Ok(())
}

#[tokio::test]
async fn bad_input_gets_a_warning_and_nothing_is_touched() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-bad").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let ok = |s| drain_template(s, &["data"], json!({}));
    let cases: Vec<(&str, SetBuilder, &str)> = vec![
        ("bad-json", SetBuilder::new("bad-json").annotation(TEMPLATE, "{not json"), "InvalidDrainTemplate"),
        (
            "bad-kind",
            SetBuilder::new("bad-kind").annotation(TEMPLATE, r#"{"apiVersion":"apps/v1","kind":"Deployment","spec":{}}"#),
            "InvalidDrainTemplate",
        ),
        (
            "bad-labels",
            SetBuilder::new("bad-labels").annotation(
                TEMPLATE,
                json!({"metadata": {"labels": {"app": "bad-labels"}},
                       "spec": {"containers": [{"name": "d", "image": "x", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}})
                .to_string(),
            ),
            "DrainPodAdoptable",
        ),
        (
            "bad-restart",
            SetBuilder::new("bad-restart")
                .annotation(TEMPLATE, drain_template("true", &["data"], json!({"restartPolicy": "Always"}))),
            "RestartPolicyAlways",
        ),
        (
            "bad-mount",
            SetBuilder::new("bad-mount").annotation(TEMPLATE, drain_template("true", &[], json!({}))),
            "ClaimNotMounted",
        ),
        (
            "bad-retention",
            SetBuilder::new("bad-retention")
                .annotation(TEMPLATE, ok("true"))
                .spec_extra(json!({"persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete", "whenDeleted": "Retain"}})),
            "ClaimsDeletedOnScaleDown",
        ),
    ];
    for (_, set, _) in &cases {
        start_set(&ns, &set.clone().replicas(1).parallel()).await?;
    }
    for (name, _, _) in &cases {
        wait_running(&ns, &pod_names(name, 0..1)).await?;
    }
    for (name, _, _) in &cases {
        scale(&ns, name, 0).await?;
    }
    for (name, _, reason) in &cases {
        let warnings = wait_event(&ns, name, reason).await?;
        assert!(
            warnings.iter().all(|w| w.contains("no new drain starts")),
            "{warnings:?}"
        );
        let set = ns.api::<StatefulSet>().get(name).await?;
        let status = set
            .metadata
            .annotations
            .unwrap_or_default()
            .get(STATUS)
            .cloned()
            .unwrap_or_default();
        assert!(status.contains("problem"), "{name}: status {status}");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        drain_pods(&ns).await?.is_empty(),
        "no drain pod for bad input"
    );
    for (name, _, _) in &cases {
        let claim = format!("data-{name}-0");
        match ns.api::<PersistentVolumeClaim>().get_opt(&claim).await? {
            Some(c) if *name == "bad-retention" => {
                // Kubernetes itself deletes claims on scale-down with whenScaled: Delete; the
                // controller refused to drain (the warning above) rather than race it.
                let _ = c;
            }
            Some(c) => assert!(c.metadata.deletion_timestamp.is_none(), "{claim} touched"),
            None if *name == "bad-retention" => {}
            None => panic!("{claim} deleted"),
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_namespaced_controller_leaves_other_namespaces_alone() -> Result<()> {
    let client = client().await;
    let mine = TestNamespace::new(&client, "ctl-ns-mine").await?;
    let other = TestNamespace::new(&client, "ctl-ns-other").await?;
    let _controller = ControllerProcess::start(&mine.name, &[]);
    for ns in [&mine, &other] {
        start_set(ns, &drain_set("w", CHECK_OWNER).replicas(2)).await?;
    }
    for ns in [&mine, &other] {
        wait_running(ns, &pod_names("w", 0..2)).await?;
        scale(ns, "w", 1).await?;
    }
    wait_claim_gone(&mine, "data-w-1", T).await?;
    wait_pod_gone(&other, "w-1", T).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        drain_pods(&other).await?.is_empty(),
        "no drain pod in the other namespace"
    );
    let claim = other.api::<PersistentVolumeClaim>().get("data-w-1").await?;
    assert!(claim.metadata.deletion_timestamp.is_none() && bound(&claim));
    assert!(events(&other, "DrainPodCreated").await?.is_empty());
    Ok(())
}

/// A set whose own pod template carries the drain pods' label is refused with a Warning, and
/// its running pods (which the set controls) are never taken for drain pods: the landed
/// controller took them for drain pods back in range and deleted them.
#[tokio::test]
async fn a_set_whose_pods_carry_the_drain_label_is_refused_and_its_pods_left_alone() -> Result<()> {
    use kube::api::PostParams;
    let client = client().await;
    let ns = TestNamespace::new(&client, "ctl-reserved-label").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let builder = drain_set("web", "true");
    let mut set = builder.build();
    set.spec
        .as_mut()
        .and_then(|s| s.template.metadata.as_mut())
        .and_then(|m| m.labels.as_mut())
        .expect("pod labels")
        .insert(drain_api::labels::DRAIN_POD.to_owned(), "web".to_owned());
    ns.api::<k8s_openapi::api::core::v1::Service>()
        .create(&PostParams::default(), &builder.service())
        .await?;
    ns.api::<StatefulSet>()
        .create(&PostParams::default(), &set)
        .await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let pods = ns.api::<Pod>();
    let mut uids = Vec::new();
    for name in pod_names("web", 0..3) {
        uids.push(pods.get(&name).await?.metadata.uid.unwrap_or_default());
    }
    let refused = wait_event(&ns, "web", "ReservedLabelOnSetPods").await?;
    anyhow::ensure!(
        refused
            .iter()
            .any(|e| e.contains(drain_api::labels::DRAIN_POD)),
        "{refused:?}"
    );
    e2e::faults::hold(
        Duration::from_secs(6),
        "the set's pods left alone",
        || async {
            for (name, uid) in pod_names("web", 0..3).iter().zip(&uids) {
                let pod = pods.get(name).await?;
                anyhow::ensure!(
                    pod.metadata.uid.as_deref() == Some(uid.as_str())
                        && pod.metadata.deletion_timestamp.is_none(),
                    "pod {name} was deleted or replaced"
                );
            }
            Ok(())
        },
    )
    .await?;
    assert_claims_kept(&ns, &["data-web-0", "data-web-1", "data-web-2"]).await?;
    Ok(())
}
