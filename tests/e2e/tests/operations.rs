//! What an operator runs the controller with: the admin port's /metrics, /livez and /readyz,
//! scraped while the controller drains on the real cluster.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use drain_api::annotations::{APPROVAL, DRAINER_POD_TEMPLATE, MAX_ATTEMPTS};
use drain_api::claim_annotations::APPROVED;
use e2e::faults::{
    ClaimRecordDenial, ControllerIdentity, DrainPodDeleteDenial, StatusWriteDenial,
    assert_claim_unchanged, count_log_lines, drain_status, exec, hold, ordinal_state,
    wait_ordinal_state, wait_set_event,
};
use e2e::objects::{SetBuilder, drain_template};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

const T: Duration = Duration::from_secs(120);

/// The status write denied (an admission policy refusing every change of `drain-status`): the
/// drains go on and delete their claims, the failed writes are logged and counted, and once the
/// denial is lifted the retried write lands.
#[tokio::test]
async fn a_denied_status_write_does_not_hold_up_the_drains_and_is_retried() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ops-status-denied").await?;
    let denial = StatusWriteDenial::create(&client, &ns).await?;
    let controller = ControllerProcess::start(&ns.name, &[]);
    let admin = controller.admin_url();
    let set = SetBuilder::new("web")
        .annotation(
            DRAINER_POD_TEMPLATE,
            drain_template("true", &["data"], json!({"restartPolicy": "Never"})),
        )
        .parallel();
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    denial.wait_enforced(&ns, "web").await?;

    scale(&ns, "web", 1).await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_claim_gone(&ns, "data-web-1", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    wait_pod_gone(&ns, "web-1", T).await?;
    ensure!(
        drain_status(&ns, "web").await?.is_none(),
        "a status was written through the denial"
    );
    let failed = sample(
        &http_get(&format!("{admin}/metrics")).await?.1,
        "statefulset_drain_reconcile_errors_total",
        r#"reason="PatchStatusFailed""#,
    );
    ensure!(
        failed.unwrap_or(0.0) >= 1.0,
        "failed status writes counted: {failed:?}"
    );
    let logged = count_log_lines(
        &controller.log,
        "failed to write the drain status; retrying",
    )?;
    ensure!(logged >= 1, "failed status writes logged");
    assert_claims_kept(&ns, &["data-web-0"]).await?;

    denial.lift().await?;
    wait_ordinal_state(&ns, "web", 2, "done").await?;
    wait_ordinal_state(&ns, "web", 1, "done").await?;
    Ok(())
}

/// A new drain pod's record on its claim denied (an admission policy refusing every change of
/// the claim's `drain-pod-uid`): the record is written right after the create, and its failure
/// must be seen. The drain pod runs, the failure is a Warning and a log line, the set's next
/// reconciles try again (and fail, retried with backoff), and the claim stays, unrecorded. Once the denial is lifted, the drain pod is recorded (the same pod: it was
/// never replaced) and its drain deletes the claim.
#[tokio::test]
async fn a_denied_record_of_a_new_drain_pod_is_warned_retried_and_repaired() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ops-record-denied").await?;
    let denial = ClaimRecordDenial::create(&client, &ns).await?;
    let controller = ControllerProcess::start(&ns.name, &[]);
    // The drain finishes when told to (a file the test writes), once its record is seen.
    let uid = web_of_three(&ns, "until [ -f /tmp/go ]; do sleep 0.2; done").await?;
    denial.wait_enforced(&ns, "data-web-2").await?;

    scale(&ns, "web", 2).await?;
    let warnings = wait_set_event(&ns, "web", "AnnotateClaimFailed").await?;
    ensure!(
        warnings.iter().any(|w| w.contains("e2e-denied")),
        "the Warning names the denial: {warnings:?}"
    );
    let pods = ns.api::<Pod>();
    let drain_uid = pods
        .get("web-2")
        .await?
        .metadata
        .uid
        .context("drain pod UID")?;
    hold(
        Duration::from_secs(5),
        "the claim stays, unrecorded, and the drain pod runs",
        || async {
            assert_unrecorded(&ns, &uid).await?;
            let pod = pods.get("web-2").await?;
            ensure!(
                is_drain_pod(&pod) && pod.metadata.uid.as_deref() == Some(drain_uid.as_str()),
                "the drain pod was replaced"
            );
            Ok(())
        },
    )
    .await?;
    ensure!(
        count_log_lines(&controller.log, "action failed; retrying with backoff")? >= 1,
        "the set's next reconciles tried to record it again"
    );

    denial.lift().await?;
    let claims = ns.api::<PersistentVolumeClaim>();
    wait_for(T, "the drain pod recorded on its claim", || async {
        let claim = claims.get("data-web-2").await?;
        Ok(claim
            .annotations()
            .get(drain_api::claim_annotations::POD_UID)
            == Some(&drain_uid))
    })
    .await?;
    exec(&ns, "web-2", "drain", "touch /tmp/go").await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    assert_claims_kept(&ns, &["data-web-0", "data-web-1"]).await?;
    Ok(())
}

/// The shipped Role's rule on statefulsets, and that rule without `get` (the live read).
const WITHOUT_GET_ON_SETS: [(&str, &str); 1] = [(
    r#"verbs: ["get", "list", "watch", "patch"]"#,
    r#"verbs: ["list", "watch", "patch"]"#,
)];

/// The Parallel set `web` of 3 with a drain pod running `script`, its pods running; returns the
/// UID of claim `data-web-2`.
async fn web_of_three(ns: &TestNamespace, script: &str) -> Result<String> {
    let set = SetBuilder::new("web")
        .annotation(
            DRAINER_POD_TEMPLATE,
            drain_template(script, &["data"], json!({"restartPolicy": "Never"})),
        )
        .parallel();
    start_set(ns, &set).await?;
    wait_running(ns, &pod_names("web", 0..3)).await?;
    claim_uid(ns, "data-web-2").await
}

/// Fails unless claim `data-web-2` is as it was (`uid`, Bound) and records no drain pod.
async fn assert_unrecorded(ns: &TestNamespace, uid: &str) -> Result<()> {
    assert_claim_unchanged(ns, "data-web-2", uid).await?;
    let claim = ns.api::<PersistentVolumeClaim>().get("data-web-2").await?;
    ensure!(
        !claim
            .annotations()
            .contains_key(drain_api::claim_annotations::POD_UID),
        "a drain pod not confirmed was recorded on the claim: {:?}",
        claim.annotations()
    );
    Ok(())
}

/// The controller run as the single-namespace install's account, with a Role that lacks `get`
/// on statefulsets (an RBAC denial of the live read that confirms each drain pod): the drain pod
/// created before the first read is withdrawn at once, unrecorded, with a `ReadFailed`
/// Warning and a log line; the retries read first and create nothing; the claim stays. Once the
/// Role is as shipped, the drain runs and deletes the claim. The rest of the shipped Role is
/// enough: nothing else is forbidden.
#[tokio::test]
async fn a_role_without_get_on_statefulsets_withdraws_the_drain_pod_and_keeps_the_claim()
-> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ops-rbac-read").await?;
    let identity = ControllerIdentity::create(&client, &ns, &WITHOUT_GET_ON_SETS).await?;
    identity.wait_can("get", "statefulsets.apps", false).await?;
    identity
        .wait_can("watch", "statefulsets.apps", true)
        .await?;
    let controller = ControllerProcess::start_with_kubeconfig(&ns.name, &identity.kubeconfig, &[]);
    let uid = web_of_three(&ns, "true").await?;

    scale(&ns, "web", 2).await?;
    let warnings = wait_set_event(&ns, "web", "ReadFailed").await?;
    ensure!(
        warnings.iter().any(|w| w.contains("forbidden")),
        "the Warning names the denial: {warnings:?}"
    );
    hold(
        Duration::from_secs(6),
        "the claim stays, unrecorded",
        || assert_unrecorded(&ns, &uid),
    )
    .await?;
    let withdrawn = count_log_lines(
        &controller.log,
        "drain pod withdrawn right after its create",
    )?;
    let tries = count_log_lines(&controller.log, "action failed; retrying with backoff")?;
    ensure!(
        withdrawn == 1 && tries >= 2,
        "the first drain pod withdrawn and logged, then the read made before any create: \
         {withdrawn} withdrawn in {tries} tries"
    );
    ensure!(
        events(&ns, "DrainPodCreated").await?.is_empty(),
        "a withdrawn drain pod was reported as created"
    );
    assert_claims_kept(&ns, &["data-web-0", "data-web-1", "data-web-2"]).await?;

    identity.apply_role(&[])?;
    identity.wait_can("get", "statefulsets.apps", true).await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    assert_claims_kept(&ns, &["data-web-0", "data-web-1"]).await?;
    let forbidden = count_log_lines(&controller.log, "forbidden")?;
    let denied_reads = count_log_lines(&controller.log, "failed to read the statefulset")?;
    ensure!(
        forbidden <= denied_reads,
        "only the live read was forbidden ({forbidden} lines name a denial, {denied_reads} the read)"
    );
    Ok(())
}

/// As above, and the drain pod's withdrawal denied too (an admission policy refusing to delete
/// drain pods): the pod stays, never recorded on its claim nor reported as created, and the
/// claim stays; once deletes are allowed again, the next reconciles withdraw it.
#[tokio::test]
async fn a_drain_pod_whose_withdrawal_is_denied_is_never_adopted_and_is_withdrawn_later()
-> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ops-withdraw-denied").await?;
    let identity = ControllerIdentity::create(&client, &ns, &WITHOUT_GET_ON_SETS).await?;
    identity.wait_can("get", "statefulsets.apps", false).await?;
    let denial = DrainPodDeleteDenial::create(&client, &ns).await?;
    denial.wait_enforced(&ns).await?;
    let controller = ControllerProcess::start_with_kubeconfig(&ns.name, &identity.kubeconfig, &[]);
    let uid = web_of_three(&ns, "sleep 3600").await?;

    scale(&ns, "web", 2).await?;
    wait_set_event(&ns, "web", "DeleteDrainPodFailed").await?;
    let pods = ns.api::<Pod>();
    hold(
        Duration::from_secs(6),
        "the drain pod stays unadopted",
        || async {
            assert_unrecorded(&ns, &uid).await?;
            ensure!(
                pods.get_opt("web-2")
                    .await?
                    .is_some_and(|p| is_drain_pod(&p)),
                "the drain pod whose withdrawal is denied is there"
            );
            Ok(())
        },
    )
    .await?;
    ensure!(
        events(&ns, "DrainPodCreated").await?.is_empty(),
        "a drain pod left to withdraw was reported as created"
    );

    denial.lift().await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    ensure!(
        count_log_lines(
            &controller.log,
            "drain pod withdrawn (an earlier try had failed)"
        )? == 1,
        "the withdrawal was retried and logged"
    );
    assert_claims_kept(&ns, &["data-web-0", "data-web-1", "data-web-2"]).await?;
    assert_claim_unchanged(&ns, "data-web-2", &uid).await?;
    Ok(())
}

/// The shipped Role's rule on statefulsets without `list` and `watch`: the sets are never listed.
const WITHOUT_LIST_ON_SETS: [(&str, &str); 1] = [(
    r#"verbs: ["get", "list", "watch", "patch"]"#,
    r#"verbs: ["get", "patch"]"#,
)];

/// The shipped Role's rule on pods without `list` and `watch`: the pod caches never sync.
const WITHOUT_LIST_ON_PODS: [(&str, &str); 1] = [(
    r#"verbs: ["get", "list", "watch", "create", "delete"]"#,
    r#"verbs: ["get", "create", "delete"]"#,
)];

/// SIGTERM while the controller cannot list what it watches (an RBAC denial, retried with
/// backoff), once for the sets and once for the pods with an opted-in set whose reconcile waits
/// for the pod caches: the controller is not Ready (`/readyz`), no reconcile has acted, and it
/// exits 0 at once, saying no reconcile had started. (With kube-runtime's controller loop, which
/// held its runner until the sets were listed and stopped polling their watch at shutdown, and a
/// graceful stop that waits for the reconciles in progress, both stops used to hang.)
#[tokio::test]
async fn sigterm_exits_0_at_once_while_the_watches_cannot_list() -> Result<()> {
    let client = client().await;
    type Edits = &'static [(&'static str, &'static str)];
    let cases: [(&str, Edits, &str); 2] = [
        (
            "ops-term-unlisted-sets",
            &WITHOUT_LIST_ON_SETS,
            "statefulsets.apps",
        ),
        ("ops-term-unlisted-pods", &WITHOUT_LIST_ON_PODS, "pods"),
    ];
    for (prefix, edits, denied) in cases {
        let ns = TestNamespace::new(&client, prefix).await?;
        let identity = ControllerIdentity::create(&client, &ns, edits).await?;
        identity.wait_can("list", denied, false).await?;
        let set = SetBuilder::new("web").annotation(
            DRAINER_POD_TEMPLATE,
            drain_template("true", &["data"], json!({"restartPolicy": "Never"})),
        );
        start_set(&ns, &set).await?;
        let mut controller =
            ControllerProcess::start_with_kubeconfig(&ns.name, &identity.kubeconfig, &[]);
        wait_for(
            T,
            &format!("the denied list of {denied} logged"),
            || async { Ok(count_log_lines(&controller.log, "is forbidden")? > 0) },
        )
        .await?;
        // What cannot be listed is not synced: the controller is not Ready, also once the
        // watches that can list have (well within 3 s).
        let readyz = format!("{}/readyz", controller.admin_url());
        hold(Duration::from_secs(3), "not Ready", || async {
            let (code, _) = http_get(&readyz).await?;
            ensure!(code == 503, "{denied} denied: /readyz answered {code}");
            Ok(())
        })
        .await?;

        controller.signal("TERM");
        let code = controller.wait_exit(Duration::from_secs(10));
        ensure!(
            code == Some(Some(0)),
            "{denied} denied: exit after SIGTERM: {code:?} (log: {})",
            controller.log.display()
        );
        ensure!(
            count_log_lines(&controller.log, "no reconcile had started")? >= 1
                && count_log_lines(&controller.log, "controller stopped")? == 1,
            "{denied} denied: no orderly stop in {}",
            controller.log.display()
        );
    }
    Ok(())
}

#[tokio::test]
async fn metrics_and_health_show_a_drain() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ops-metrics").await?;
    let controller = ControllerProcess::start(&ns.name, &[]);
    let admin = controller.admin_url();
    wait_for(T, "/readyz 200", || async {
        Ok(http_get(&format!("{admin}/readyz")).await?.0 == 200)
    })
    .await?;
    ensure!(
        http_get(&format!("{admin}/livez")).await?.0 == 200,
        "/livez"
    );

    // One ordinal drains and succeeds; another fails once for good (max attempts 1).
    let script = r#"if [ "$HOSTNAME" = web-1 ]; then exit 3; fi; sleep 1"#;
    let set = SetBuilder::new("web")
        .annotation(
            DRAINER_POD_TEMPLATE,
            drain_template(script, &["data"], json!({"restartPolicy": "Never"})),
        )
        .annotation(MAX_ATTEMPTS, "1")
        .parallel();
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    scale(&ns, "web", 1).await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_ordinal_state(&ns, "web", 1, "failed").await?;

    let labels = format!(r#"namespace="{}",statefulset="web""#, ns.name);
    let metrics_url = format!("{admin}/metrics");
    let last = std::sync::Mutex::new(String::new());
    wait_for(T, "metrics of the drains", || async {
        let text = http_get(&metrics_url).await?.1;
        let done = sample(&text, "statefulset_drain_drains_succeeded_total", &labels) == Some(1.0)
            && sample(&text, "statefulset_drain_drains_gave_up_total", &labels) == Some(1.0);
        *last.lock().unwrap() = text;
        Ok(done)
    })
    .await
    .with_context(|| format!("metrics:\n{}", last.lock().unwrap()))?;
    let text = last.into_inner().unwrap();
    eprintln!("{text}");
    ensure!(
        sample(&text, "statefulset_drain_drains_started_total", &labels) == Some(2.0),
        "started"
    );
    ensure!(
        sample(
            &text,
            "statefulset_drain_drains_failed_total",
            &format!(r#"{labels},kind="failed""#)
        ) == Some(1.0),
        "failed"
    );
    ensure!(
        sample(&text, "statefulset_drain_reaction_seconds_count", "").unwrap_or(0.0) >= 1.0,
        "reaction time observed"
    );
    ensure!(
        sample(
            &text,
            "statefulset_drain_drain_duration_seconds_count",
            &labels
        ) == Some(1.0),
        "drain duration observed"
    );
    ensure!(
        sample(
            &text,
            "statefulset_drain_kube_requests_total",
            r#"verb="create",resource="pods",code="200""#
        )
        .unwrap_or(0.0)
            >= 2.0,
        "API requests counted"
    );
    ensure!(
        sample(
            &text,
            "statefulset_drain_reconciles_total",
            r#"result="ok""#
        )
        .unwrap_or(0.0)
            >= 1.0,
        "reconciles counted"
    );
    ensure!(!text.contains("web-2"), "no pod or claim names in labels");

    // The kubectl view of the same drains, as a user runs it (the plugin binary on PATH).
    let plugin = e2e::release_dir().join("kubectl-drain_status");
    let out = std::process::Command::new(&plugin)
        .args(["-n", &ns.name])
        .env("KUBECONFIG", e2e::kubeconfig_path())
        .output()
        .with_context(|| format!("run {}", plugin.display()))?;
    let shown = String::from_utf8_lossy(&out.stdout);
    eprintln!("{shown}{}", String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "kubectl drain-status failed");
    let row = |ordinal: &str| {
        shown
            .lines()
            .find(|l| l.split_whitespace().take(2).eq(["web", ordinal]))
            .map(str::to_owned)
    };
    ensure!(
        row("2").is_some_and(|r| r.contains("done")),
        "ordinal 2 done:\n{shown}"
    );
    ensure!(
        row("1").is_some_and(|r| r.contains("failed") && r.contains("data-web-1")),
        "ordinal 1 failed with its claim:\n{shown}"
    );
    Ok(())
}

/// A set deleted mid-drain takes its metric series with it (its gauges would otherwise show a
/// drain in progress for ever, and the labels of sets come and gone would pile up); another
/// set's series stay, and the deleted set's claims are kept.
#[tokio::test]
async fn a_deleted_set_takes_its_metrics_with_it_and_leaves_its_claims() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ops-metrics-gone").await?;
    let controller = ControllerProcess::start(&ns.name, &[]);
    let metrics_url = format!("{}/metrics", controller.admin_url());
    // web's drain never ends on its own; db is opted in and has nothing to drain.
    let template = drain_template("sleep 3600", &["data"], json!({"restartPolicy": "Never"}));
    for (name, replicas) in [("web", 2), ("db", 1)] {
        let set = SetBuilder::new(name)
            .replicas(replicas)
            .annotation(DRAINER_POD_TEMPLATE, template.clone())
            .parallel();
        start_set(&ns, &set).await?;
    }
    wait_running(
        &ns,
        &[pod_names("web", 0..2), pod_names("db", 0..1)].concat(),
    )
    .await?;
    scale(&ns, "web", 1).await?;
    wait_drain_pod(&ns, "web-1", Some("Running")).await?;

    let of = |set: &str| format!(r#"namespace="{}",statefulset="{set}""#, ns.name);
    let in_progress = "statefulset_drain_drains_in_progress";
    let last = std::sync::Mutex::new(String::new());
    wait_for(
        T,
        "web's drain in progress and db's gauge in the metrics",
        || async {
            let text = http_get(&metrics_url).await?.1;
            let shown = sample(&text, in_progress, &of("web")) == Some(1.0)
                && sample(&text, in_progress, &of("db")) == Some(0.0);
            *last.lock().unwrap() = text;
            Ok(shown)
        },
    )
    .await
    .with_context(|| format!("metrics:\n{}", last.lock().unwrap()))?;

    ns.api::<StatefulSet>()
        .delete("web", &DeleteParams::background())
        .await?;
    wait_for(T, "web's series gone from the metrics", || async {
        let text = http_get(&metrics_url).await?.1;
        let gone = !text.contains(&of("web"));
        *last.lock().unwrap() = text;
        Ok(gone)
    })
    .await
    .with_context(|| format!("metrics:\n{}", last.lock().unwrap()))?;
    let text = last.into_inner().unwrap();
    ensure!(
        sample(&text, in_progress, &of("db")) == Some(0.0),
        "db's series stay:\n{text}"
    );
    // The drain pod went with its set (garbage collector); the claims stay, undrained.
    wait_pod_gone(&ns, "web-1", T).await?;
    assert_claims_kept(&ns, &["data-web-0", "data-web-1"]).await?;
    Ok(())
}

#[tokio::test]
async fn dry_run_plans_and_reports_but_creates_and_deletes_nothing() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ops-dry-run").await?;
    let mut dry = ControllerProcess::start_named(&ns.name, "dry", &["--dry-run"]);
    let set = SetBuilder::new("web").annotation(
        DRAINER_POD_TEMPLATE,
        drain_template("sleep 1", &["data"], json!({})),
    );
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let uid = claim_uid(&ns, "data-web-2").await?;
    scale(&ns, "web", 2).await?;
    wait_pod_gone(&ns, "web-2", T).await?;

    let said = wait_set_event(&ns, "web", "DryRunCreateDrainPod").await?;
    ensure!(
        said.iter()
            .any(|e| e.contains("would create drain pod web-2")),
        "{said:?}"
    );
    wait_for(T, "a status marked dryRun", || async {
        Ok(drain_status(&ns, "web")
            .await?
            .is_some_and(|s| s["dryRun"] == json!(true)))
    })
    .await?;
    hold(
        Duration::from_secs(6),
        "nothing is created or deleted",
        || async {
            ensure!(drain_pods(&ns).await?.is_empty(), "a drain pod was created");
            assert_claim_unchanged(&ns, "data-web-2", &uid).await
        },
    )
    .await?;

    // The same cluster state, without --dry-run: the drain the dry run announced happens.
    dry.kill();
    let _real = ControllerProcess::start_named(&ns.name, "real", &[]);
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    wait_for(T, "the status without dryRun", || async {
        Ok(drain_status(&ns, "web")
            .await?
            .is_some_and(|s| s.get("dryRun").is_none() && ordinal_state(&s, 2) == Some("done")))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn manual_approval_deletes_a_drained_claim_only_once_approved() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ops-approval").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let set = SetBuilder::new("web")
        .annotation(
            DRAINER_POD_TEMPLATE,
            drain_template("sleep 1", &["data"], json!({})),
        )
        .annotation(APPROVAL, "manual");
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let uid = claim_uid(&ns, "data-web-2").await?;
    scale(&ns, "web", 2).await?;

    let said = wait_set_event(&ns, "web", "DrainAwaitingApproval").await?;
    ensure!(
        said.iter()
            .any(|e| e.contains("kubectl annotate pvc data-web-2")),
        "{said:?}"
    );
    let status = wait_ordinal_state(&ns, "web", 2, "awaitingApproval").await?;
    ensure!(
        status["ordinals"]["2"]["claims"] == json!(["data-web-2"]),
        "{status}"
    );
    hold(
        Duration::from_secs(6),
        "the drained claim waits for approval",
        || async {
            assert_claim_unchanged(&ns, "data-web-2", &uid).await?;
            let pod = ns.api::<Pod>().get_opt("web-2").await?;
            // Its completion record is read from the container's state, which the kubelet
            // reports about a second before the pod's phase turns Succeeded.
            ensure!(
                pod.as_ref().is_some_and(|p| is_drain_pod(p)
                    && matches!(phase(p), "Running" | "Succeeded")),
                "the finished drain pod keeps the name"
            );
            Ok(())
        },
    )
    .await?;

    // Approval by hand, as the Event says.
    ns.api::<PersistentVolumeClaim>()
        .patch(
            "data-web-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {APPROVED: "true"}}})),
        )
        .await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    wait_set_event(&ns, "web", "ClaimsDeleted").await?;
    assert_claims_kept(&ns, &["data-web-0", "data-web-1"]).await?;
    Ok(())
}

/// A drain that fails with a long non-ASCII termination message (the kubelet keeps 4 KiB): the
/// Warnings that quote it are published, cut within the API's 1,024 bytes at a character
/// boundary (cut by characters, the landed controller's notes went over and the API refused
/// them: no `DrainFailed` at all).
#[tokio::test]
async fn a_failure_in_non_ascii_text_is_reported_within_the_event_limit() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ops-note-bytes").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    // 700 three-byte characters, then exit 1.
    let script =
        "i=0; while [ $i -lt 700 ]; do printf '€'; i=$((i+1)); done > /dev/termination-log; exit 1";
    let set = SetBuilder::new("web").annotation(
        DRAINER_POD_TEMPLATE,
        e2e::objects::drain_template_without_record(
            script,
            &["data"],
            json!({"restartPolicy": "Never"}),
        ),
    );
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let claim = claim_uid(&ns, "data-web-2").await?;
    scale(&ns, "web", 2).await?;
    for object in ["web-2", "web"] {
        let failed = wait_event(&ns, object, "DrainFailed").await?;
        ensure!(
            failed.iter().any(|e| e.contains("exited with code 1")
                && e.contains("€€€")
                && e.len() <= 1024 + object.len() + 2),
            "{object}: {failed:?}"
        );
    }
    assert_claim_unchanged(&ns, "data-web-2", &claim).await?;
    Ok(())
}

/// A long-lived set's status keeps only the newest `done` ordinals: seeded with 70 drains done
/// long ago, the status after one more drain holds 50, the new one among them (the landed
/// controller kept every one for ever, towards the 256 KiB annotation limit).
#[tokio::test]
async fn the_status_keeps_a_bounded_number_of_done_ordinals() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ops-done-bounded").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let old: serde_json::Map<String, serde_json::Value> = (100..170)
        .map(|o| {
            let at = format!("2026-01-01T00:{:02}:{:02}Z", (o - 100) / 60, (o - 100) % 60);
            (o.to_string(), json!({"state": "done", "at": at}))
        })
        .collect();
    let set = SetBuilder::new("web")
        .annotation(
            DRAINER_POD_TEMPLATE,
            drain_template("true", &["data"], json!({"restartPolicy": "Never"})),
        )
        .annotation(
            drain_api::annotations::STATUS,
            json!({"ordinals": old}).to_string(),
        );
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    scale(&ns, "web", 2).await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    let status = wait_ordinal_state(&ns, "web", 2, "done").await?;
    let done: Vec<&String> = status["ordinals"]
        .as_object()
        .context("ordinals")?
        .iter()
        .filter(|(_, s)| s["state"] == "done")
        .map(|(o, _)| o)
        .collect();
    ensure!(done.len() == 50, "{} done ordinals: {done:?}", done.len());
    // The oldest went first.
    ensure!(!done.iter().any(|o| *o == "100"), "{done:?}");
    Ok(())
}

/// A drain that runs on and shows nothing (no progress published, no container started or
/// stopped) for `--quiet-after` is warned about once (`DrainQuiet`), noted in the status and
/// counted in `quiet_drains`, and left running with its claim (the landed controller showed
/// `draining` for ever, with no Warning).
#[tokio::test]
async fn a_drain_that_shows_nothing_is_warned_about_and_left_running() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ops-quiet").await?;
    let controller = ControllerProcess::start(&ns.name, &["--quiet-after", "5s"]);
    let set = SetBuilder::new("web").annotation(
        DRAINER_POD_TEMPLATE,
        drain_template("sleep 600", &["data"], json!({})),
    );
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let claim = claim_uid(&ns, "data-web-2").await?;
    scale(&ns, "web", 2).await?;
    let drain = wait_drain_pod(&ns, "web-2", Some("Running")).await?;
    let quiet = wait_set_event(&ns, "web", "DrainQuiet").await?;
    ensure!(
        quiet
            .iter()
            .any(|e| e.contains("published no progress") && e.contains("left running")),
        "{quiet:?}"
    );
    let status = drain_status(&ns, "web").await?.context("a status")?;
    ensure!(
        status["ordinals"]["2"]["state"] == "draining"
            && status["ordinals"]["2"]["note"]
                .as_str()
                .is_some_and(|n| n.contains("published no progress")),
        "{status}"
    );
    let metrics = http_get(&format!("{}/metrics", controller.admin_url()))
        .await?
        .1;
    ensure!(
        sample(
            &metrics,
            "statefulset_drain_quiet_drains",
            &format!(r#"namespace="{}",statefulset="web""#, ns.name)
        ) == Some(1.0),
        "{metrics}"
    );
    // Told once, and never stopped for it.
    hold(
        Duration::from_secs(6),
        "the quiet drain left running",
        || async {
            let pod = ns.api::<Pod>().get("web-2").await?;
            ensure!(
                pod.metadata.uid == drain.metadata.uid && pod.metadata.deletion_timestamp.is_none(),
                "the drain pod was stopped"
            );
            assert_claim_unchanged(&ns, "data-web-2", &claim).await
        },
    )
    .await?;
    ensure!(
        events(&ns, "DrainQuiet")
            .await?
            .iter()
            .filter(|e| e.starts_with("web: "))
            .count()
            == 1,
        "told more than once"
    );
    Ok(())
}

/// A drain pod and a removed stateful pod that stay terminating (a finalizer keeps them) do not
/// hold their ordinals in silence: past `--stuck-after` the stateful pod's is a `DrainBlocked`
/// Warning naming the finalizer, and the drain pod's a stuck attempt (`DrainStuck`, naming it)
/// that counts, so the attempt limit gives up; the claim stays throughout (the landed
/// controller showed `waiting` with no Warning, and never gave up).
#[tokio::test]
async fn pods_stuck_terminating_are_told_and_counted() -> Result<()> {
    const HOLD_FINALIZER: &str = "e2e.statefulset-drain.test/hold";
    let client = client().await;
    let ns = TestNamespace::new(&client, "ops-stuck-deleting").await?;
    let _controller = ControllerProcess::start(&ns.name, &["--stuck-after", "5s"]);
    let set = SetBuilder::new("web")
        .annotation(
            DRAINER_POD_TEMPLATE,
            drain_template("sleep 600", &["data"], json!({})),
        )
        .annotation(MAX_ATTEMPTS, "1");
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let claim = claim_uid(&ns, "data-web-2").await?;
    let pods = ns.api::<Pod>();
    let hold_on = json!({"metadata": {"finalizers": [HOLD_FINALIZER]}});
    let release = json!({"metadata": {"finalizers": null}});
    pods.patch("web-2", &PatchParams::default(), &Patch::Merge(&hold_on))
        .await?;
    let result = async {
        // The stateful pod, removed by the scale-down, stays terminating.
        scale(&ns, "web", 2).await?;
        let blocked = wait_set_event(&ns, "web", "DrainBlocked").await?;
        ensure!(
            blocked
                .iter()
                .any(|e| e.contains(HOLD_FINALIZER) && e.contains("web-2")),
            "{blocked:?}"
        );
        pods.patch("web-2", &PatchParams::default(), &Patch::Merge(&release))
            .await?;
        // Its drain pod, deleted mid-drain, stays terminating too.
        wait_drain_pod(&ns, "web-2", Some("Running")).await?;
        pods.patch("web-2", &PatchParams::default(), &Patch::Merge(&hold_on))
            .await?;
        pods.delete(
            "web-2",
            &DeleteParams {
                grace_period_seconds: Some(1),
                ..DeleteParams::default()
            },
        )
        .await?;
        let stuck = wait_event(&ns, "web-2", "DrainStuck").await?;
        ensure!(
            stuck
                .iter()
                .any(|e| e.contains(HOLD_FINALIZER) && e.contains("still terminating")),
            "{stuck:?}"
        );
        wait_ordinal_state(&ns, "web", 2, "failed").await?;
        assert_claim_unchanged(&ns, "data-web-2", &claim).await
    }
    .await;
    let _ = pods
        .patch("web-2", &PatchParams::default(), &Patch::Merge(&release))
        .await;
    result?;
    // Released, the pod goes; the drain gave up, so the claim stays.
    wait_pod_gone(&ns, "web-2", T).await?;
    hold(
        Duration::from_secs(4),
        "the claim of a drain that gave up",
        || assert_claim_unchanged(&ns, "data-web-2", &claim),
    )
    .await?;
    Ok(())
}
