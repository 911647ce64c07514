//! High availability on the real cluster: two controller replicas with `--leader-elect`, one
//! Lease. Only the holder acts; a standby completes a drain whose leader was SIGKILLed, a leader
//! that lost its Lease (paused past its renew deadline) never acts again while another holds it,
//! SIGTERM releases the Lease and exits 0, and a SIGTERM whose reconcile hangs past the stop's
//! grace drops it and leaves the Lease to expire. A new leader leaves the sets that did not opt
//! in alone (no metric series of theirs).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use drain_api::annotations::DRAINER_POD_TEMPLATE as TEMPLATE;
use e2e::faults::{HangingWrites, count_log_lines};
use e2e::objects::{SetBuilder, drain_template};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::json;

const T: Duration = Duration::from_secs(120);
const LEASE_NAME: &str = "statefulset-drain-controller";

/// A replica named `name`, electing through a Lease in the test namespace with short durations
/// (4 s lease, 3 s renew deadline, 1 s retry period).
fn replica(ns: &str, name: &str) -> ControllerProcess {
    ControllerProcess::start_replica(ns, name)
}

async fn holder(ns: &TestNamespace) -> Result<Option<String>> {
    Ok(ns
        .api::<Lease>()
        .get_opt(LEASE_NAME)
        .await?
        .and_then(|l| l.spec?.holder_identity))
}

async fn wait_holder(ns: &TestNamespace, who: &str, timeout: Duration) -> Result<()> {
    wait_for(timeout, &format!("{who} holds the lease"), || async {
        Ok(holder(ns).await?.as_deref() == Some(who))
    })
    .await
}

fn log_lines(path: &Path, needle: &str) -> usize {
    count_log_lines(path, needle).unwrap_or(0)
}

fn drain_set(name: &str, script: &str) -> SetBuilder {
    SetBuilder::new(name).annotation(TEMPLATE, drain_template(script, &["data"], json!({})))
}

#[tokio::test]
async fn the_standby_completes_the_drain_when_the_leader_is_killed_mid_drain() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ha-kill").await?;
    let mut a = replica(&ns.name, "a");
    wait_holder(&ns, "a", T).await?;
    let b = replica(&ns.name, "b");
    start_set(&ns, &drain_set("web", "sleep 6")).await?;
    // A set that did not opt in: the new leader reconciles every set it caches when it takes
    // over, and must leave this one alone (no metric series, no periodic requeue).
    start_set(&ns, &SetBuilder::new("plain").replicas(1)).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    wait_running(&ns, &pod_names("plain", [0])).await?;

    scale(&ns, "web", 2).await?;
    wait_drain_pod(&ns, "web-2", Some("Running")).await?;
    ensure!(
        log_lines(&b.log, "acting") == 0,
        "the standby acted while the leader held the lease"
    );
    ensure!(
        log_lines(&a.log, "acting") > 0,
        "the leader did not create the drain pod"
    );
    a.kill();

    // The standby takes the Lease once it expires, and completes the drain from its warm caches.
    wait_holder(&ns, "b", Duration::from_secs(30)).await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_pod_gone(&ns, "web-2", T).await?;
    assert_claims_kept(&ns, &["data-web-0", "data-web-1"]).await?;
    ensure!(log_lines(&b.log, "this replica is the leader") == 1);
    let metrics = reqwest::get(format!("{}/metrics", b.admin_url()))
        .await?
        .text()
        .await?;
    ensure!(
        metrics.contains(r#"statefulset="web""#),
        "the new leader has no series of the set it drained:\n{metrics}"
    );
    let plain: Vec<&str> = metrics
        .lines()
        .filter(|l| l.contains(r#"statefulset="plain""#))
        .collect();
    ensure!(
        plain.is_empty(),
        "the new leader reconciled a set that did not opt in: {plain:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_leader_that_lost_its_lease_never_acts_while_another_holds_it() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ha-pause").await?;
    let a = replica(&ns.name, "a");
    wait_holder(&ns, "a", T).await?;
    let b = replica(&ns.name, "b");
    start_set(&ns, &drain_set("web", "sleep 1")).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;

    // Freeze the leader: it can neither renew nor act. The standby takes over once the Lease
    // expired.
    a.signal("STOP");
    let resumed = scopeguard(&a);
    wait_holder(&ns, "b", Duration::from_secs(30)).await?;
    let acted_before = log_lines(&a.log, "acting");

    // Work for the new leader while the old one is frozen, then more after it resumed: its
    // caches see every change, its fence keeps it from acting.
    scale(&ns, "web", 2).await?;
    wait_drain_pod(&ns, "web-2", None).await?;
    a.signal("CONT");
    drop(resumed);
    scale(&ns, "web", 1).await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_claim_gone(&ns, "data-web-1", T).await?;
    wait_pod_gone(&ns, "web-1", T).await?;
    wait_for(T, "the old leader logs that it no longer leads", || async {
        Ok(log_lines(&a.log, "no longer leads") > 0)
    })
    .await?;
    ensure!(
        log_lines(&a.log, "acting") == acted_before,
        "the old leader acted after it lost the lease (see {})",
        a.log.display()
    );
    ensure!(holder(&ns).await?.as_deref() == Some("b"));
    ensure!(log_lines(&b.log, "acting") > 0);
    assert_claims_kept(&ns, &["data-web-0"]).await?;
    Ok(())
}

/// Resumes a stopped process if the test fails before it does.
fn scopeguard(p: &ControllerProcess) -> impl Drop + '_ {
    struct Resume<'a>(&'a ControllerProcess);
    impl Drop for Resume<'_> {
        fn drop(&mut self) {
            self.0.signal("CONT");
        }
    }
    Resume(p)
}

#[tokio::test]
async fn sigterm_releases_the_lease_and_exits_0() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ha-term").await?;
    let mut a = replica(&ns.name, "a");
    wait_holder(&ns, "a", T).await?;
    let b = replica(&ns.name, "b");
    wait_for(T, "the standby is standing by", || async {
        Ok(log_lines(&b.log, "standing by") > 0)
    })
    .await?;

    a.signal("TERM");
    let code = a.wait_exit(Duration::from_secs(20));
    ensure!(code == Some(Some(0)), "exit after SIGTERM: {code:?}");
    ensure!(
        log_lines(&a.log, "lease released") == 1,
        "no release in {}",
        a.log.display()
    );
    ensure!(
        holder(&ns).await?.as_deref() != Some("a"),
        "the lease still names the replica that exited"
    );
    // The standby takes it at its next check, within the lease duration.
    wait_holder(&ns, "b", Duration::from_secs(10)).await?;
    Ok(())
}

/// SIGTERM while a reconcile hangs in a drain pod create (an admission webhook that never
/// answers, for 15 s): after `--stop-grace` (2 s here) the reconcile is dropped, the replica
/// exits 0, and the Lease is left to expire as after a crash instead of released, because the
/// dropped create may still land. The standby then takes over and completes the drain.
#[tokio::test]
async fn sigterm_drops_a_hung_reconcile_after_the_grace_and_lets_the_lease_expire() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ha-grace").await?;
    let hang = HangingWrites::drain_pod_creates(&client, &ns, 15).await?;
    start_set(&ns, &drain_set("web", "true").replicas(2)).await?;
    wait_running(&ns, &pod_names("web", 0..2)).await?;
    let elect =
        |name: &str| ControllerProcess::start_replica_with(&ns.name, name, &["--stop-grace", "2s"]);
    let mut a = elect("a");
    wait_holder(&ns, "a", T).await?;
    let b = elect("b");
    wait_for(T, "the standby is standing by", || async {
        Ok(log_lines(&b.log, "standing by") > 0)
    })
    .await?;

    scale(&ns, "web", 1).await?;
    wait_for(T, "the leader creating the drain pod", || async {
        Ok(log_lines(&a.log, "CreateDrainPod") > 0)
    })
    .await?;
    let signalled = Instant::now();
    a.signal("TERM");
    let code = a.wait_exit(Duration::from_secs(12));
    let took = signalled.elapsed();
    ensure!(code == Some(Some(0)), "exit after SIGTERM: {code:?}");
    ensure!(
        took >= Duration::from_millis(1500),
        "exited after {took:?}, before the grace: was the create hanging?"
    );
    ensure!(
        log_lines(&a.log, "at the end of the stop's grace; dropped") >= 1
            && log_lines(&a.log, "left to expire") == 1
            && log_lines(&a.log, "lease released") == 0,
        "no dropped reconcile or a released Lease in {}",
        a.log.display()
    );
    ensure!(
        holder(&ns).await?.as_deref() == Some("a"),
        "the Lease was released"
    );
    drop(hang);
    // The standby takes the Lease once it expires, and the drain completes.
    wait_holder(&ns, "b", T).await?;
    wait_claim_gone(&ns, "data-web-1", T).await?;
    wait_pod_gone(&ns, "web-1", T).await?;
    assert_claims_kept(&ns, &["data-web-0"]).await?;
    Ok(())
}
