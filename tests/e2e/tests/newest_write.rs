//! The newest write of every key wins on the real cluster (issue 23): the example datastore is
//! scaled 3 → 2 while its drain runs slowly; clients overwrite and delete the moved keys on
//! their interim owners; the set is scaled back to 3 before the drain is done, with the default
//! `cancel` (the returning pod gets its claim back, holding the old copies) and with `finish`
//! (the drain completes). After the rebalance sidecars' passes, every acknowledged write reads
//! its newest value on its owner, on no other pod, and no deleted key comes back.
//!
//! Judged from the client's own record of what it wrote and deleted
//! ([`checker::records::Writes`]), not from versions. With the create-only (`412`) rule, the
//! cancelled case lost every overwrite: the returning pod's old copy was "already there".

use std::time::Duration;

use anyhow::{Result, ensure};
use checker::records::{Outcome, Writes};
use drain_api::names::pod_name;
use e2e::faults::*;
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client};

const RECORDS: usize = 600;
const T: Duration = Duration::from_secs(120);

/// The example's drainer arguments, slowed so the scale-up comes mid-drain.
const ARGS: &str = r#""args": ["redistribute", "--data-dir", "/data", "--peer-port", "8080""#;
const SLOW_ARGS: &str =
    r#""args": ["redistribute", "--data-dir", "/data", "--peer-port", "8080", "--max-rate", "15""#;
const TEMPLATE_KEY: &str = "    statefulsets.kubernetes.io/drainer-pod-template: |";

/// Scales 3 → 2 with a slow drain, overwrites and deletes the moved keys on their interim
/// owners, scales back to 3 (`on_scale_up`: `cancel` or `finish`), and waits until every key
/// holds its newest write, on its owner only.
async fn interim_writes_survive_the_scale_up(on_scale_up: &str) -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, &format!("newest-{on_scale_up}")).await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    let annotation =
        format!("    statefulsets.kubernetes.io/drain-on-scale-up: {on_scale_up}\n{TEMPLATE_KEY}");
    apply_example(
        &ns,
        &[
            (ARGS, SLOW_ARGS),
            (r#""--interval", "30s""#, r#""--interval", "2s""#),
            (TEMPLATE_KEY, &annotation),
        ],
    )?;
    wait_running(&ns, &pod_names(DATASTORE, 0..3)).await?;
    let keys: Vec<String> = (0..RECORDS).map(|i| format!("rec-{i:04}")).collect();
    let owner3 = |k: &str| drainer::placement::owner(k, &[0, 1, 2]);
    let written = write_records(&ns, RECORDS, |i| owner3(&keys[i])).await?;
    let mut writes = Writes::new();
    for (key, value) in &written {
        writes.put(key.clone(), value.clone(), Outcome::Acked);
    }
    let moved: Vec<&String> = keys.iter().filter(|k| owner3(k) == 2).collect();
    ensure!(moved.len() > 100, "ordinal 2 holds {} records", moved.len());

    scale(&ns, DATASTORE, 2).await?;
    wait_drain_pod(&ns, &pod_name(DATASTORE, 2), Some("Running")).await?;
    // Clients route by the two remaining ordinals: a third of the moved keys are deleted, a
    // third overwritten, a third left alone.
    let interim = [store_of(&ns, 0).await?, store_of(&ns, 1).await?];
    let (mut overwritten, mut deleted) = (0, 0);
    for (i, key) in moved.iter().enumerate() {
        let store = &interim[drainer::placement::owner(key, &[0, 1]) as usize];
        match i % 3 {
            0 => {
                store.delete(key).await?;
                writes.delete(key.to_string(), Outcome::Acked);
                deleted += 1;
            }
            1 => {
                let newer = format!("{key}: written on the interim owner").into_bytes();
                store.put(key, newer.clone()).await?;
                writes.put(key.to_string(), newer, Outcome::Acked);
                overwritten += 1;
            }
            _ => {}
        }
    }
    let claim_kept_until_scale_up = ns
        .api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>()
        .get_opt("data-datastore-2")
        .await?
        .is_some();
    ensure!(
        claim_kept_until_scale_up,
        "the drain finished before the scale-up; slow it down further"
    );
    scale(&ns, DATASTORE, 3).await?;
    wait_stateful_pod_back(&ns, &pod_name(DATASTORE, 2)).await?;

    // The rebalance sidecars pass every 2 s; judge once they have had their turns.
    let deadline = std::time::Instant::now() + T;
    let problems = loop {
        let held = held_by(&ns, 0..3).await?;
        let mut problems = writes.check(&held);
        for (pod, records) in &held {
            for key in records.keys() {
                let owner = pod_name(DATASTORE, owner3(key));
                if *pod != owner {
                    problems.push(format!("{key} on {pod}, not on its owner {owner}"));
                }
            }
        }
        if problems.is_empty() || std::time::Instant::now() > deadline {
            break problems;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    ensure!(
        problems.is_empty(),
        "[{on_scale_up}] {} problems, the first 20: {:#?}",
        problems.len(),
        &problems[..problems.len().min(20)]
    );
    eprintln!(
        "[{on_scale_up}] {} records; of ordinal 2's {}, {overwritten} overwritten and {deleted} \
         deleted on their interim owners: every key at its newest write on its owner",
        RECORDS,
        moved.len()
    );
    Ok(())
}

#[tokio::test]
async fn interim_writes_and_deletes_survive_a_drain_cancelled_by_a_scale_up() -> Result<()> {
    interim_writes_survive_the_scale_up("cancel").await
}

#[tokio::test]
async fn interim_writes_and_deletes_survive_a_drain_finished_after_a_scale_up() -> Result<()> {
    interim_writes_survive_the_scale_up("finish").await
}
