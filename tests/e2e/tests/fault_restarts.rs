//! The fault suite's cluster restarts (issue 10): the kube-apiserver and the kubelet restarted
//! while drains run, and the controller SIGKILLed while the API server is away. A binary of its
//! own with one test, so no other test runs while the cluster's components restart. The
//! independent checker must find I1 (judged from the drain scripts' reports to the witness the
//! test runs, which the restarts do not touch), I2 and I3 to hold.

use std::time::Duration;

use anyhow::{Result, ensure};
use drain_api::annotations::DRAINER_POD_TEMPLATE;
use drain_api::names::{claim_name, pod_name};
use e2e::faults::exec;
use e2e::objects::{SetBuilder, drain_template};
use e2e::ops::*;
use e2e::suite::*;
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use serde_json::json;

/// Runs until someone creates `/data/go` on its claim; exits 0 when asked to stop, without
/// reporting its completion (which must never count as success).
const WAIT_FOR_GO: &str = "trap 'exit 0' TERM; while [ ! -f /data/go ]; do sleep 0.2; done";

#[tokio::test]
async fn the_api_server_and_the_kubelet_restarted_mid_drain() -> Result<()> {
    const SCENARIO: &str = "restarts";
    let mut faults = FaultLog::new(SCENARIO);
    let client = client().await;
    let ns = TestNamespace::new(&client, "fault-restart").await?;
    let checked = Checked::start(&client, &ns, SCENARIO, I1From::Witness).await?;
    let set = SetBuilder::new("web").replicas(4).parallel().annotation(
        DRAINER_POD_TEMPLATE,
        drain_template(&checked.drain_script(WAIT_FOR_GO), &["data"], json!({})),
    );
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..4)).await?;
    let mut controller = ControllerProcess::start(&ns.name, &[]);
    scale(&ns, "web", 2).await?;
    for o in [2, 3] {
        wait_drain_pod(&ns, &pod_name("web", o), Some("Running")).await?;
    }

    // 1. The API server restarts mid-drain; the controller is killed while it is away and
    //    started again before it is back.
    let restart = tokio::spawn(restart_component("kube-apiserver"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    controller.kill();
    faults.add("controller killed", "while the API server restarts");
    controller = ControllerProcess::start(&ns.name, &[]);
    let away = restart.await??;
    faults.add(
        "kube-apiserver killed and restarted",
        format!("away {away:.1}s"),
    );
    // Its watches usually have to list again (410 Gone: the new API server's watch cache
    // starts at the current revision); give the checker the time to, so the drain released
    // next is seen by a watch and not only by a list.
    checked
        .recorder()
        .wait_listed(2, Duration::from_secs(10))
        .await;
    say(format_args!(
        "[{SCENARIO}] checker lists after the restart: {:?}",
        checked.recorder().lists()
    ));
    exec_with_retry(&ns, &pod_name("web", 3), "touch /data/go").await?;
    faults.add("drain released", pod_name("web", 3));
    wait_claim_gone(&ns, &claim_name("data", "web", 3), T).await?;

    // 2. The kubelet restarts while ordinal 2 drains; the drain goes on and finishes after.
    let away = restart_component("kubelet").await?;
    faults.add("kubelet killed and restarted", format!("away {away:.1}s"));
    exec_with_retry(&ns, &pod_name("web", 2), "touch /data/go").await?;
    faults.add("drain released", pod_name("web", 2));

    // 3. Another scale-down drains on the restarted node.
    scale(&ns, "web", 1).await?;
    wait_drain_pod(&ns, &pod_name("web", 1), Some("Running")).await?;
    exec_with_retry(&ns, &pod_name("web", 1), "touch /data/go").await?;
    faults.add("drain released", pod_name("web", 1));
    faults.print();
    checked.settle(Duration::from_secs(180)).await?;
    drop(controller);
    let verdict = checked.verdict()?;
    ensure!(
        verdict.claims_deleted == 3,
        "expected 3 drained claims: {verdict}"
    );
    Ok(())
}

/// `exec` into the drain container, retried while the node or API server is still coming back.
async fn exec_with_retry(ns: &TestNamespace, pod: &str, script: &str) -> Result<()> {
    wait_for(T, &format!("exec {script:?} in {pod}"), || async {
        Ok(exec(ns, pod, "drain", script).await.is_ok())
    })
    .await
}
