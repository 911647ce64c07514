//! The drainer's safety rules on the real cluster: it never overwrites a newer value on the new
//! owner, never succeeds on a directory that is not the claim, publishes its progress on its
//! pod (copied into the set's status), a drain whose progress stalls is retried, and after a
//! scale-up the example's rebalance sidecar puts every record back on its owner.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use drain_api::annotations;
use drain_api::pod_annotations::PROGRESS;
use drain_api::progress::DrainProgress;
use e2e::faults::*;
use e2e::objects::{SetBuilder, drain_template};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

const RECORDS: usize = 600;
const T: Duration = Duration::from_secs(120);

/// The example's drainer arguments, to extend.
const ARGS: &str = r#""args": ["redistribute", "--data-dir", "/data", "--peer-port", "8080""#;

/// Keys the 3-pod example placed on ordinal 2, by the example's placement.
fn keys_of_2(records: &std::collections::BTreeMap<String, Vec<u8>>) -> Vec<String> {
    records
        .keys()
        .filter(|k| drainer::placement::owner(k, &[0, 1, 2]) == 2)
        .cloned()
        .collect()
}

async fn example_with_records(
    ns: &TestNamespace,
    edits: &[(&str, &str)],
) -> Result<std::collections::BTreeMap<String, Vec<u8>>> {
    apply_example(ns, edits)?;
    wait_running(ns, &pod_names(DATASTORE, 0..3)).await?;
    write_placed_records(ns).await
}

/// Writes [`RECORDS`] records to the 3-pod example, each on its owner.
async fn write_placed_records(
    ns: &TestNamespace,
) -> Result<std::collections::BTreeMap<String, Vec<u8>>> {
    let keys: Vec<String> = (0..RECORDS).map(|i| format!("rec-{i:04}")).collect();
    write_records(ns, RECORDS, |i| {
        drainer::placement::owner(&keys[i], &[0, 1, 2])
    })
    .await
}

#[tokio::test]
async fn writes_made_to_the_new_owner_during_the_drain_are_never_overwritten() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "drainer-newer").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    // A slow drain, so clients write most keys to their new owner before the drain sends them.
    let slow = format!(r#"{ARGS}, "--max-rate", "20""#);
    let mut records = example_with_records(&ns, &[(ARGS, &slow)]).await?;
    let moved = keys_of_2(&records);
    ensure!(moved.len() > 100, "ordinal 2 holds {} records", moved.len());

    scale(&ns, DATASTORE, 2).await?;
    // Clients now route by the two remaining ordinals and write newer values at once.
    let stores = [store_of(&ns, 0).await?, store_of(&ns, 1).await?];
    for key in &moved {
        let newer = format!("{key}: newer value written after the scale-down").into_bytes();
        stores[drainer::placement::owner(key, &[0, 1]) as usize]
            .put(key, newer.clone())
            .await?;
        records.insert(key.clone(), newer);
    }
    wait_claim_gone(&ns, "data-datastore-2", T).await?;

    assert_every_record_readable(&ns, &[0, 1], &records).await?;
    Ok(())
}

/// The drain template mounts the claim with `subPath: x` (the kubelet creates `x` empty inside
/// the claim and mounts it at /data: a mount point with nothing in it), plus `edits`; the drain
/// must fail, the claim stay, and the data be served again after a scale-up. Without the check
/// the drain "succeeds" and the claim is deleted.
async fn wrong_sub_path_keeps_the_claim(ns_prefix: &str, edits: &[(&str, &str)]) -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, ns_prefix).await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let mut all_edits = vec![
        (
            r#""volumeMounts": [{"name": "data", "mountPath": "/data"}]"#,
            r#""volumeMounts": [{"name": "data", "mountPath": "/data", "subPath": "x"}]"#,
        ),
        (
            "statefulsets.kubernetes.io/drainer-pod-template: |",
            "statefulsets.kubernetes.io/drain-max-attempts: \"1\"\n    statefulsets.kubernetes.io/drainer-pod-template: |",
        ),
    ];
    all_edits.extend_from_slice(edits);
    let records = example_with_records(&ns, &all_edits).await?;
    let claim = claim_uid(&ns, "data-datastore-2").await?;

    scale(&ns, DATASTORE, 2).await?;
    wait_set_event(&ns, DATASTORE, "DrainGaveUp").await?;
    let status = wait_ordinal_state(&ns, DATASTORE, 2, "failed").await?;
    eprintln!("status: {status}");
    assert_claim_unchanged(&ns, "data-datastore-2", &claim).await?;

    // The data is still on the claim: scaled back up, ordinal 2 serves every record it had.
    scale(&ns, DATASTORE, 3).await?;
    wait_stateful_pod_back(&ns, "datastore-2").await?;
    assert_every_record_readable(&ns, &[0, 1, 2], &records).await?;
    Ok(())
}

#[tokio::test]
async fn a_drain_template_mounting_the_wrong_sub_path_fails_and_keeps_the_claim() -> Result<()> {
    wrong_sub_path_keeps_the_claim("drainer-subpath", &[]).await
}

#[tokio::test]
async fn a_drain_pod_without_credentials_cannot_prove_its_volume_and_keeps_the_claim() -> Result<()>
{
    // The same wrong subPath, and no service account token in the drain pod: the check that
    // would catch it cannot read the pod and the set. It used to be skipped with a warning, and
    // the empty directory "drained" in no time: the claim was deleted with all its data.
    wrong_sub_path_keeps_the_claim(
        "drainer-notoken",
        &[(
            r#""serviceAccountName": "datastore-drainer","#,
            r#""serviceAccountName": "datastore-drainer", "automountServiceAccountToken": false,"#,
        )],
    )
    .await
}

#[tokio::test]
async fn progress_is_published_on_the_drain_pod_and_copied_into_the_status() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "drainer-progress").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let slow = format!(r#"{ARGS}, "--max-rate", "25", "--progress-interval", "1s""#);
    let records = example_with_records(&ns, &[(ARGS, &slow)]).await?;
    let total = keys_of_2(&records).len() as u64;

    scale(&ns, DATASTORE, 2).await?;
    // What a user sees with kubectl while the drain runs.
    let jsonpath = format!(
        "jsonpath={{.metadata.annotations.{}}}",
        PROGRESS.replace('.', "\\.")
    );
    let mid = std::sync::Mutex::new(None);
    wait_for(T, "progress part-way on the drain pod", || async {
        let out = e2e::kubectl()
            .args(["-n", &ns.name, "get", "pod", "datastore-2", "-o", &jsonpath])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if let Some(p) = DrainProgress::parse(&text)
            && p.records_moved > 0
            && p.records_remaining > 0
        {
            ensure!(
                p.records_moved + p.records_remaining == total,
                "counts add up: {text}"
            );
            ensure!(p.bytes_moved > 0 && p.bytes_remaining > 0, "bytes: {text}");
            *mid.lock().unwrap() = Some(p);
            return Ok(true);
        }
        Ok(false)
    })
    .await?;
    eprintln!("progress seen with kubectl: {:?}", mid.lock().unwrap());
    wait_for(T, "progress in the set's status", || async {
        let status = drain_status(&ns, DATASTORE).await?.unwrap_or_default();
        Ok(status["ordinals"]["2"]["progress"]["recordsMoved"]
            .as_u64()
            .unwrap_or(0)
            > 0)
    })
    .await?;
    wait_claim_gone(&ns, "data-datastore-2", T).await?;
    assert_every_record_readable(&ns, &[0, 1], &records).await?;
    Ok(())
}

#[tokio::test]
async fn a_drain_without_progress_for_the_stall_time_is_retried() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "drainer-stall").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    // Runs, never publishes progress, never finishes: a hung drain.
    let set = SetBuilder::new("web")
        .annotation(
            annotations::DRAINER_POD_TEMPLATE,
            drain_template("sleep 3600", &["data"], json!({})),
        )
        .annotation(annotations::STALL_SECONDS, "4");
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let claim = claim_uid(&ns, "data-web-2").await?;

    scale(&ns, "web", 2).await?;
    let first = wait_drain_pod(&ns, "web-2", Some("Running")).await?;
    let first_uid = first.metadata.uid.clone().context("uid")?;
    let events = wait_set_event(&ns, "web", "DrainStalled").await?;
    eprintln!("events: {events:?}");
    // Retried: a new drain pod under the same name.
    wait_for(T, "a second drain pod", || async {
        Ok(ns.api::<Pod>().get_opt("web-2").await?.is_some_and(|p| {
            p.metadata.uid.as_deref() != Some(first_uid.as_str())
                && p.metadata.deletion_timestamp.is_none()
        }))
    })
    .await?;
    let status = drain_status(&ns, "web").await?.unwrap_or_default();
    eprintln!("status: {status}");
    assert_claim_unchanged(&ns, "data-web-2", &claim).await?;
    Ok(())
}

#[tokio::test]
async fn a_single_record_that_takes_longer_than_the_stall_time_to_send_is_no_stall() -> Result<()> {
    // One 5 MiB record at 256 KiB/s takes 20 s to send; the stall time is 6 s. No record
    // finishes before 20 s, so only the bytes on the wire (`bytesSent`) show progress: counted
    // by records alone, the drain was deleted as stalled every 6 s and never finished.
    let client = client().await;
    let ns = TestNamespace::new(&client, "drainer-big-record").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let capped =
        format!(r#"{ARGS}, "--max-bytes-per-second", "262144", "--progress-interval", "1s""#);
    let template_key = "    statefulsets.kubernetes.io/drainer-pod-template: |";
    let stall =
        format!("    statefulsets.kubernetes.io/drain-stall-seconds: \"6\"\n{template_key}");
    apply_example(&ns, &[(ARGS, &capped), (template_key, &stall)])?;
    wait_running(&ns, &pod_names(DATASTORE, 0..3)).await?;
    let key = (0..)
        .map(|i| format!("big-{i}"))
        .find(|k| drainer::placement::owner(k, &[0, 1, 2]) == 2)
        .context("a key of ordinal 2")?;
    let value: Vec<u8> = (0..5u32 << 20).map(|i| (i % 253) as u8).collect();
    store_of(&ns, 2).await?.put(&key, value.clone()).await?;
    let started = std::time::Instant::now();

    scale(&ns, DATASTORE, 2).await?;
    let first = wait_drain_pod(&ns, "datastore-2", Some("Running")).await?;
    wait_claim_gone(&ns, "data-datastore-2", T).await?;
    let took = started.elapsed();
    let stalled = events(&ns, "DrainStalled").await?;
    ensure!(stalled.is_empty(), "taken for stalled: {stalled:?}");
    ensure!(
        took >= Duration::from_secs(15),
        "the drain took only {took:?}: the byte cap did not apply, so this proves nothing"
    );
    let owner = drainer::placement::owner(&key, &[0, 1]);
    let held = store_of(&ns, owner).await?.get(&key).await?;
    ensure!(
        held.as_deref() == Some(value.as_slice()),
        "the record on its owner differs"
    );
    eprintln!(
        "one 5 MiB record drained in {took:?} under a 6 s stall time, by drain pod {:?}",
        first.metadata.uid
    );
    Ok(())
}

/// Runs `script` in a busybox pod named `name` that mounts `claim` at `/data`; fails unless it
/// succeeds. The pod is deleted afterwards.
async fn on_claim(ns: &TestNamespace, name: &str, claim: &str, script: &str) -> Result<()> {
    let pods = ns.api::<Pod>();
    pods.create(
        &kube::api::PostParams::default(),
        &e2e::objects::job_pod(name, claim, script),
    )
    .await?;
    let phase = || async {
        anyhow::Ok(
            pods.get(name)
                .await?
                .status
                .and_then(|s| s.phase)
                .unwrap_or_default(),
        )
    };
    wait_for(T, &format!("pod {name} finished"), || async {
        Ok(matches!(phase().await?.as_str(), "Succeeded" | "Failed"))
    })
    .await?;
    let phase = phase().await?;
    pods.delete(name, &kube::api::DeleteParams::default())
        .await?;
    ensure!(phase == "Succeeded", "{script:?} failed in pod {name}");
    Ok(())
}

#[tokio::test]
async fn entries_on_the_claim_that_are_not_records_keep_it_and_are_named_in_the_event() -> Result<()>
{
    // An operator's note and files fsck recovered, on ordinal 2's claim. The drain used to skip
    // dot files and lost+found "by design" and finish: the claim went, and these with it.
    let client = client().await;
    let ns = TestNamespace::new(&client, "drainer-foreign").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let records = example_with_records(&ns, &[]).await?;
    // The datastore image has no shell: a busybox pod mounts the claim beside it.
    on_claim(
        &ns,
        "put-notes",
        "data-datastore-2",
        "echo 'restore from s3://backups/2' > /data/.operator-notes && mkdir -p /data/lost+found \
         && echo recovered > '/data/lost+found/#4711'",
    )
    .await?;
    let claim = claim_uid(&ns, "data-datastore-2").await?;

    scale(&ns, DATASTORE, 2).await?;
    // The example's drain pods restart on failure, so the controller reports a crash loop
    // (`DrainStuck`, or `DrainFailed` for a pod that ended): the event quotes the drainer's
    // error from the termination message.
    let named = std::sync::Mutex::new(None);
    wait_for(T, "a failure event naming the entries", || async {
        for reason in ["DrainStuck", "DrainFailed"] {
            if let Some(e) = events(&ns, reason)
                .await?
                .into_iter()
                .find(|e| e.contains(".operator-notes") && e.contains("lost+found"))
            {
                *named.lock().unwrap() = Some(e);
                return Ok(true);
            }
        }
        Ok(false)
    })
    .await?;
    eprintln!("event: {:?}", named.lock().unwrap());
    // The records moved; the claim stays with what is not a record.
    assert_every_record_readable(&ns, &[0, 1], &records).await?;
    assert_claim_unchanged(&ns, "data-datastore-2", &claim).await?;

    // Scaling back up returns the claim with the entries, and the records to their owner.
    scale(&ns, DATASTORE, 3).await?;
    wait_stateful_pod_back(&ns, "datastore-2").await?;
    on_claim(
        &ns,
        "check-notes",
        "data-datastore-2",
        "test \"$(cat /data/.operator-notes)\" = 'restore from s3://backups/2' \
         && test \"$(cat '/data/lost+found/#4711')\" = recovered",
    )
    .await
    .context("the entries came back with the claim")?;
    assert_claim_unchanged(&ns, "data-datastore-2", &claim).await?;
    assert_every_record_readable(&ns, &[0, 1, 2], &records).await?;
    Ok(())
}

#[tokio::test]
async fn after_3_to_1_to_3_every_record_is_on_its_owner_again() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "drainer-rebalance").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let records =
        example_with_records(&ns, &[(r#""--interval", "30s""#, r#""--interval", "2s""#)]).await?;

    scale(&ns, DATASTORE, 1).await?;
    wait_claim_gone(&ns, "data-datastore-2", T).await?;
    wait_claim_gone(&ns, "data-datastore-1", T).await?;
    ensure!(
        store_of(&ns, 0).await?.list().await?.len() == RECORDS,
        "pod 0 holds every record after the drains"
    );
    scale(&ns, DATASTORE, 3).await?;
    for name in pod_names(DATASTORE, 0..3) {
        wait_stateful_pod_back(&ns, &name).await?;
    }
    // A client routing by the same hash over 0..3 finds every key on its owner, and only there.
    wait_for(T, "every record on its owner", || async {
        let mut held = std::collections::BTreeMap::new();
        for o in 0..3 {
            for key in store_of(&ns, o).await?.list().await? {
                held.entry(key).or_insert_with(Vec::new).push(o);
            }
        }
        Ok(records.keys().all(|k| {
            held.get(k).map(Vec::as_slice) == Some(&[drainer::placement::owner(k, &[0, 1, 2])][..])
        }) && held.len() == records.len())
    })
    .await?;
    for o in 0..3 {
        let store = store_of(&ns, o).await?;
        for key in store.list().await? {
            let value = store.get(&key).await?.context("readable")?;
            ensure!(
                records.get(&key) == Some(&value),
                "record {key} on pod {o} differs"
            );
        }
    }
    Ok(())
}

/// The readiness gate the test adds to the example's pods: a pod is Ready only while the test
/// says so, whatever its server answers.
const SERVING: &str = "e2e.statefulset-drain.local/serving";

/// Sets the example pod of `ordinal`'s readiness gate, and waits until its Ready condition
/// follows.
async fn set_serving(ns: &TestNamespace, ordinal: i32, serving: bool) -> Result<()> {
    let pods = ns.api::<Pod>();
    let name = drain_api::names::pod_name(DATASTORE, ordinal);
    let status = if serving { "True" } else { "False" };
    wait_for(T, &format!("pod {name} Running"), || async {
        Ok(pods
            .get_opt(&name)
            .await?
            .is_some_and(|p| phase(&p) == "Running"))
    })
    .await?;
    // Conditions merge by type (strategic merge patch), as a readiness-gate controller writes.
    let patch = json!({"status": {"conditions": [{
        "type": SERVING,
        "status": status,
    }]}});
    pods.patch_status(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Strategic(patch),
    )
    .await?;
    wait_for(T, &format!("pod {name} Ready={status}"), || async {
        Ok(pods
            .get_opt(&name)
            .await?
            .is_some_and(|p| running_ready(&p) == serving))
    })
    .await
}

/// A remaining pod that is not Ready gets no records (a Parallel set, which scales down whatever
/// the readiness of its pods): the drain moves what the Ready peers own,
/// and the records the not-Ready one owns wait (its server answers all along: only readiness
/// keeps them back); the claim stays until the peer is Ready again and the drain has finished.
#[tokio::test]
async fn records_wait_for_a_peer_that_is_not_ready_and_the_claim_stays_meanwhile() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "drainer-unready").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let gate = format!(
        "      readinessGates:\n        - conditionType: {SERVING}\n      terminationGracePeriodSeconds: 10"
    );
    // Parallel: under OrderedReady the StatefulSet controller does not scale down while a pod
    // is not Ready, so no drain would start.
    apply_example(
        &ns,
        &[
            ("      terminationGracePeriodSeconds: 10", &gate),
            (
                "podManagementPolicy: OrderedReady",
                "podManagementPolicy: Parallel",
            ),
        ],
    )?;
    for o in 0..3 {
        set_serving(&ns, o, true).await?;
    }
    let records = write_placed_records(&ns).await?;
    let moved = keys_of_2(&records);
    let owner = |k: &String| drainer::placement::owner(k, &[0, 1]);
    let (to_0, to_1): (Vec<String>, Vec<String>) =
        moved.iter().cloned().partition(|k| owner(k) == 0);
    ensure!(
        !to_0.is_empty() && !to_1.is_empty(),
        "ordinal 2's records go to both: {} / {}",
        to_0.len(),
        to_1.len()
    );
    let claim = claim_uid(&ns, "data-datastore-2").await?;

    set_serving(&ns, 0, false).await?;
    scale(&ns, DATASTORE, 2).await?;
    // The records of the Ready peer move.
    let store_1 = store_of(&ns, 1).await?;
    wait_for(
        T,
        "ordinal 2's records owned by ordinal 1 on ordinal 1",
        || async {
            let held: std::collections::BTreeSet<String> =
                store_1.list().await?.into_iter().collect();
            Ok(to_1.iter().all(|k| held.contains(k)))
        },
    )
    .await?;
    // Those of the not-Ready one do not, and nothing is deleted.
    let store_0 = store_of(&ns, 0).await?;
    hold(
        Duration::from_secs(8),
        "records kept back from a peer that is not Ready",
        || async {
            let held: std::collections::BTreeSet<String> =
                store_0.list().await?.into_iter().collect();
            let sent: Vec<&String> = to_0.iter().filter(|k| held.contains(*k)).collect();
            ensure!(
                sent.is_empty(),
                "{} records sent to the not-Ready ordinal 0, e.g. {:?}",
                sent.len(),
                sent.first()
            );
            let drain = ns.api::<Pod>().get_opt("datastore-2").await?;
            ensure!(
                drain.as_ref().is_none_or(|p| phase(p) != "Succeeded"),
                "the drain succeeded with a peer not Ready"
            );
            assert_claim_unchanged(&ns, "data-datastore-2", &claim).await
        },
    )
    .await?;

    set_serving(&ns, 0, true).await?;
    wait_claim_gone(&ns, "data-datastore-2", T).await?;
    assert_every_record_readable(&ns, &[0, 1], &records).await?;
    Ok(())
}

/// The example with a second claim template, `index`, which the drain template mounts into
/// the drainer's container beside `data` (as a user might, to pass the template check): the
/// drainer drains `/data` only, so it refuses the record that names both claims, before any
/// data moves; the drain fails and both claims stay with their data. The landed drainer wrote
/// that record, and the controller deleted `index-datastore-2` undrained.
#[tokio::test]
async fn a_drainer_given_a_second_claim_refuses_to_prove_it_and_both_claims_stay() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "drainer-two-claims").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let edits = [
        (
            r#""volumeMounts": [{"name": "data", "mountPath": "/data"}]"#,
            r#""volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "index", "mountPath": "/index"}]"#,
        ),
        (
            "statefulsets.kubernetes.io/drainer-pod-template: |",
            "statefulsets.kubernetes.io/drain-max-attempts: \"1\"\n    statefulsets.kubernetes.io/drainer-pod-template: |",
        ),
        (
            "  volumeClaimTemplates:\n",
            "  volumeClaimTemplates:\n    - metadata:\n        name: index\n      spec:\n        \
             accessModes: [\"ReadWriteOnce\"]\n        storageClassName: standard\n        \
             resources:\n          requests:\n            storage: 10Mi\n",
        ),
    ];
    let records = example_with_records(&ns, &edits).await?;
    // The witness on the second claim: a file only this test wrote.
    on_claim(
        &ns,
        "put-index",
        "index-datastore-2",
        "echo 'index of 2' > /data/witness",
    )
    .await?;
    let data = claim_uid(&ns, "data-datastore-2").await?;
    let index = claim_uid(&ns, "index-datastore-2").await?;

    scale(&ns, DATASTORE, 2).await?;
    // The example's drain pods restart on failure: a crash loop (`DrainStuck`) or an ended pod
    // (`DrainFailed`), the event quoting the drainer's error.
    wait_for(
        T,
        "a failure event naming the claim it would prove",
        || async {
            for reason in ["DrainStuck", "DrainFailed"] {
                if events(&ns, reason).await?.iter().any(|e| {
                    e.contains("index-datastore-2")
                        && e.contains("drains only claim data-datastore-2")
                }) {
                    return Ok(true);
                }
            }
            Ok(false)
        },
    )
    .await?;
    wait_set_event(&ns, DATASTORE, "DrainGaveUp").await?;
    assert_claim_unchanged(&ns, "data-datastore-2", &data).await?;
    assert_claim_unchanged(&ns, "index-datastore-2", &index).await?;

    on_claim(
        &ns,
        "check-index",
        "index-datastore-2",
        "test \"$(cat /data/witness)\" = 'index of 2'",
    )
    .await
    .context("the second claim kept its data")?;

    // Scaled back up, ordinal 2 serves every record it had, on the same claims.
    scale(&ns, DATASTORE, 3).await?;
    wait_stateful_pod_back(&ns, "datastore-2").await?;
    assert_every_record_readable(&ns, &[0, 1, 2], &records).await?;
    assert_claim_unchanged(&ns, "data-datastore-2", &data).await?;
    assert_claim_unchanged(&ns, "index-datastore-2", &index).await?;
    Ok(())
}
