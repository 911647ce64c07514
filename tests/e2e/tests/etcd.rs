//! The etcd example (`example/etcd`, issue 25) drained by scaling its StatefulSet, on the real
//! cluster, as a user runs it (`kubectl apply -k`), with the controller: 5 → 3 leaves a cluster
//! of 3 members whose quorum is 2, 3 → 5 adds two fresh members, a drain pod killed after it
//! removed its member finishes on the retry, and a member whose drain removed it comes back
//! (a scale-up) as a working member.
//!
//! Judged from etcd itself: the membership as a linearizable read reports it, and writes that
//! need a quorum succeeding while one of the three members is frozen (with the two removed
//! members still counted, 2 of 5 would be no quorum and the write would fail).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::faults::{exec, freeze_pod, kubectl_apply_in};
use e2e::ops::{
    claim_uid, is_drain_pod, pod_names, scale, serving, wait_claim_gone, wait_stateful_pod_back,
};
use e2e::{ControllerProcess, TestNamespace, client, kubectl, repo_root, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, LogParams};

const SET: &str = "etcd";
const T: Duration = Duration::from_secs(240);

/// The drain command, and the same command pausing after a successful removal the first time
/// (a marker on the claim), so a test can kill the drain pod between the removal and its exit.
const DRAIN: &str = r#""--", "sh", "/scripts/drain.sh"]"#;
const DRAIN_THEN_PAUSE: &str = r#""--", "sh", "-c", "sh /scripts/drain.sh && { [ -e /data/paused ] || { touch /data/paused; echo paused after the removal; sleep 3600; }; }"]"#;

/// Applies the example as `kubectl apply -k example/etcd` does, with each edit made.
fn apply_example(ns: &TestNamespace, edits: &[(&str, &str)]) -> Result<()> {
    let out = kubectl()
        .arg("kustomize")
        .arg(repo_root().join("example/etcd"))
        .output()
        .context("kubectl kustomize")?;
    ensure!(
        out.status.success(),
        "kubectl kustomize example/etcd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut text = String::from_utf8(out.stdout)?;
    for (from, to) in edits {
        ensure!(text.contains(from), "the example has no {from:?}");
        text = text.replace(from, to);
    }
    kubectl_apply_in(Some(&ns.name), &text, "the etcd example")
}

/// Waits until members `0..n` are Running and Ready (etcd answers healthy).
async fn wait_members(ns: &TestNamespace, n: i32) -> Result<()> {
    let pods = ns.api::<Pod>();
    for name in pod_names(SET, 0..n) {
        wait_for(T, &format!("member {name} Ready"), || async {
            Ok(pods.get_opt(&name).await?.is_some_and(|p| serving(&p)))
        })
        .await?;
    }
    Ok(())
}

/// `etcdctl` in member 0 (against its own endpoint unless the arguments say otherwise).
async fn etcdctl(ns: &TestNamespace, args: &str) -> Result<String> {
    exec(
        ns,
        &pod_names(SET, [0]).remove(0),
        "etcd",
        &format!("etcdctl --command-timeout=5s {args}"),
    )
    .await
}

/// The members' names (a member added but not started has none: "-").
async fn membership(ns: &TestNamespace) -> Result<Vec<String>> {
    let list = etcdctl(ns, "member list --consistency=l").await?;
    let mut names: Vec<String> = list
        .lines()
        .map(|l| {
            l.split(", ")
                .nth(2)
                .filter(|n| !n.is_empty())
                .unwrap_or("-")
                .to_owned()
        })
        .collect();
    names.sort();
    Ok(names)
}

/// Waits until the membership is exactly these members, all started.
async fn wait_membership(ns: &TestNamespace, n: i32) -> Result<()> {
    let want: Vec<String> = pod_names(SET, 0..n);
    let r = wait_for(
        Duration::from_secs(60),
        &format!("a membership of {want:?}"),
        || async { Ok(membership(ns).await.is_ok_and(|m| m == want)) },
    )
    .await;
    if r.is_err() {
        let now = membership(ns).await;
        let raw = etcdctl(ns, "member list --consistency=l").await;
        let logs = member_logs(ns, n).await;
        return r.with_context(|| {
            format!(
                "the membership is {now:?}\nmember list: {raw:?}\nthe members' logs end:\n{logs}"
            )
        });
    }
    Ok(())
}

/// Of the `etcd` container's log of members `0..n` (for a failure's message): member.sh's lines
/// (what it decided) and etcd's last few.
async fn member_logs(ns: &TestNamespace, n: i32) -> String {
    let pods = ns.api::<Pod>();
    let params = LogParams {
        container: Some("etcd".into()),
        ..LogParams::default()
    };
    let mut out = String::new();
    for name in pod_names(SET, 0..n) {
        let log = pods
            .logs(&name, &params)
            .await
            .unwrap_or_else(|e| e.to_string());
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines.len().saturating_sub(6);
        out.push_str(&format!("--- {name}\n"));
        for (i, line) in lines.iter().enumerate() {
            if !line.starts_with('{') || i >= tail {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// 5 → 3: the two members leave the membership and their claims go; with member 2 frozen, a
/// write still commits (2 of 3); 3 → 5: two fresh members join and hold the data written
/// before.
#[tokio::test]
async fn five_to_three_leaves_a_quorum_of_two_and_back_to_five() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "etcd-5-3-5").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    apply_example(&ns, &[])?;
    wait_members(&ns, 5).await?;
    wait_membership(&ns, 5).await?;
    etcdctl(&ns, "put before-scale-down 1").await?;

    scale(&ns, SET, 3).await?;
    for ordinal in [3, 4] {
        wait_claim_gone(&ns, &format!("data-{SET}-{ordinal}"), T).await?;
    }
    wait_membership(&ns, 3).await?;

    // One of the three stops answering: the other two are a quorum of the membership. The
    // write is retried for a while: when the frozen member led, the two elect a new leader
    // first (an election timeout and a vote, seconds on a loaded machine). With two of five a
    // write would never commit, however long it is retried.
    let frozen = pod_names(SET, [2]).remove(0);
    freeze_pod(&ns, &frozen, true).await?;
    let write = wait_for(
        Duration::from_secs(45),
        "a write to commit with one of the three members frozen",
        || async {
            etcdctl(&ns, "put with-one-of-three-frozen 1")
                .await
                .map(|_| true)
        },
    )
    .await;
    freeze_pod(&ns, &frozen, false).await?;
    write.context("a write with one of the three members frozen")?;

    scale(&ns, SET, 5).await?;
    wait_members(&ns, 5).await?;
    wait_membership(&ns, 5).await?;
    let new = pod_names(SET, [4]).remove(0);
    let got = exec(
        &ns,
        &new,
        "etcd",
        "etcdctl --command-timeout=5s get before-scale-down --print-value-only --consistency=s",
    )
    .await?;
    ensure!(
        got.trim() == "1",
        "the new member {new} does not hold the data: {got:?}"
    );
    let health = etcdctl(&ns, "endpoint health --cluster").await?;
    ensure!(
        health.lines().filter(|l| l.contains("is healthy")).count() == 5,
        "not every member is healthy:\n{health}"
    );
    Ok(())
}

/// Waits until the drain pod of `ordinal` has removed its member and paused.
async fn wait_removed_and_paused(ns: &TestNamespace, ordinal: i32) -> Result<Pod> {
    let name = pod_names(SET, [ordinal]).remove(0);
    let pods = ns.api::<Pod>();
    let params = LogParams {
        container: Some("drain".into()),
        ..LogParams::default()
    };
    wait_for(
        T,
        &format!("drain pod {name} paused after the removal"),
        || async {
            let Some(p) = pods.get_opt(&name).await? else {
                return Ok(false);
            };
            Ok(is_drain_pod(&p)
                && pods
                    .logs(&name, &params)
                    .await
                    .is_ok_and(|l| l.contains("paused after the removal")))
        },
    )
    .await?;
    Ok(pods.get(&name).await?)
}

/// 3 → 2 with the drain pod killed after it removed the member and before it exited: that
/// attempt proves nothing (no completion record) and fails; the next drain pod finds the member
/// gone and finishes, and the claim goes.
#[tokio::test]
async fn a_drain_pod_killed_after_member_remove_finishes_on_the_retry() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "etcd-retry").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    apply_example(
        &ns,
        &[
            (DRAIN, DRAIN_THEN_PAUSE),
            ("replicas: 5", "replicas: 3"),
            (r#"value: "5""#, r#"value: "3""#),
        ],
    )?;
    wait_members(&ns, 3).await?;
    wait_membership(&ns, 3).await?;

    scale(&ns, SET, 2).await?;
    let first = wait_removed_and_paused(&ns, 2).await?;
    wait_membership(&ns, 2).await?;
    // Removed from the membership, but no completion record yet: the claim is still there.
    let claim = format!("data-{SET}-2");
    claim_uid(&ns, &claim)
        .await
        .context("the claim, before the drain finished")?;
    ns.api::<Pod>()
        .delete(&pod_names(SET, [2]).remove(0), &DeleteParams::default())
        .await?;
    wait_claim_gone(&ns, &claim, T).await?;
    // The deleted attempt counted as failed, and a later drain pod finished the job.
    let uid = first.metadata.uid.unwrap_or_default();
    let failed = e2e::ops::events(&ns, "DrainFailed").await?;
    ensure!(
        failed.iter().any(|m| m.contains("deleted")),
        "the deleted attempt (pod {uid}) was not reported as failed: {failed:?}"
    );
    ensure!(
        !e2e::ops::events(&ns, "DrainRetrying").await?.is_empty(),
        "no later drain pod was created"
    );
    wait_membership(&ns, 2).await?;
    etcdctl(&ns, "put after-the-retry 1").await?;
    Ok(())
}

/// 3 → 2, and back to 3 after the drain removed the member but before it finished: the drain
/// is cancelled and the member comes back on its claim, whose data etcd would refuse (a removed
/// member's); the member sets it aside and joins as new, and the cluster has 3 healthy members.
#[tokio::test]
async fn a_member_removed_by_a_cancelled_drain_comes_back_as_a_member() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "etcd-cancel").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    apply_example(
        &ns,
        &[
            (DRAIN, DRAIN_THEN_PAUSE),
            ("replicas: 5", "replicas: 3"),
            (r#"value: "5""#, r#"value: "3""#),
        ],
    )?;
    wait_members(&ns, 3).await?;
    wait_membership(&ns, 3).await?;
    let claim = format!("data-{SET}-2");
    let uid = claim_uid(&ns, &claim).await?;

    scale(&ns, SET, 2).await?;
    wait_removed_and_paused(&ns, 2).await?;
    wait_membership(&ns, 2).await?;
    scale(&ns, SET, 3).await?;
    wait_stateful_pod_back(&ns, &pod_names(SET, [2]).remove(0)).await?;
    ensure!(
        claim_uid(&ns, &claim).await? == uid,
        "claim {claim} was replaced"
    );
    wait_membership(&ns, 3).await?;
    let health = etcdctl(&ns, "endpoint health --cluster").await?;
    ensure!(
        health.lines().filter(|l| l.contains("is healthy")).count() == 3,
        "not every member is healthy:\n{health}"
    );
    Ok(())
}
