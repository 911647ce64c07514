//! The fault suite (issues 10 and 21): drains under faults injected at random instants, each
//! scenario watched by the independent checker (`tests/checker`), which must find I1 (no claim
//! deleted unless a drain told its completion naming it before), I2 (no stateful pod created on
//! a claim being deleted, never two pods of one name) and I3 (everything settles once the
//! faults stop) to hold, and for the example datastore I4 (the newest write of every key
//! readable exactly once, a deleted key nowhere). Each scenario prints its seed
//! (`STSD_FAULT_SEED` replays it), the faults injected and the checker's verdict.
//!
//! The drains tell their completion themselves: every drain script reports, as its very last
//! step, to a witness the test runs (`e2e::witness`, through [`Checked::drain_script`]), and
//! I1 is judged from those reports alone, never from exit codes or clocks. The exception is the
//! example datastore, whose drain pods run the real `drainer` image: there I1 is judged from
//! the completion record in the drain pods' termination messages (the evidence the controller
//! itself reads, so it checks the controller's use of it), and whether each drain really
//! finished is judged by I4 from the data.
//!
//! The API server and kubelet restarts are in `fault_restarts.rs` (a binary of their own: they
//! would disturb the scenarios running next to them).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use checker::records::{Outcome, Writes};
use drain_api::annotations::DRAINER_POD_TEMPLATE;
use drain_api::names::{claim_name, pod_name};
use e2e::faults::{
    DATASTORE, apply_example, held_by, release_set_finalizers_on_drop, write_records,
};
use e2e::objects::{SetBuilder, drain_template, edit_template};
use e2e::ops::*;
use e2e::suite::*;
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

/// How long a scenario may take to settle once its faults stop (I3's bound).
const SETTLE: Duration = Duration::from_secs(180);

/// A drain that behaves badly on purpose: its first run on a claim fails (exit 1: the kubelet
/// restarts it), and it exits 0 when asked to stop (SIGTERM) without reporting its completion,
/// which must never count as success.
const FLAKY_DRAIN: &str = "trap 'exit 0' TERM; \
    if [ ! -f /data/failed-once ]; then touch /data/failed-once; sleep 0.5; exit 1; fi; \
    sleep 2 & wait";

/// A set opted in with a drain pod running `script`, which then reports to the witness.
fn drain_set(checked: &Checked, name: &str, script: &str) -> SetBuilder {
    SetBuilder::new(name).annotation(
        DRAINER_POD_TEMPLATE,
        drain_template(&checked.drain_script(script), &["data"], json!({})),
    )
}

/// A set with claims `data` and `index`, each drained by a container of its own: `data` runs
/// `script` (on `/data`), `index` the quicker `index_script` (on `/index`); each then reports
/// only its own claim to the witness, so I1 is judged per claim, by the container that drains
/// it (a claim deleted when the other container finished first is a violation).
fn per_claim_drain_set(
    checked: &Checked,
    name: &str,
    script: &str,
    index_script: &str,
) -> SetBuilder {
    let data = checked.claim_drain_script(script, "data");
    let index = checked.claim_drain_script(index_script, "index");
    let template = edit_template(&drain_template(&data, &["data"], json!({})), |t| {
        let mut second = t["spec"]["containers"][0].clone();
        let command = drain_template(&index, &["index"], json!({}));
        let command: serde_json::Value = serde_json::from_str(&command).expect("json");
        second["name"] = json!("index");
        second["command"] = command["spec"]["containers"][0]["command"].clone();
        second["volumeMounts"] = json!([{"name": "index", "mountPath": "/index"}]);
        t["spec"]["containers"]
            .as_array_mut()
            .expect("containers")
            .push(second);
    });
    SetBuilder::new(name)
        .claims(&["data", "index"])
        .annotation(DRAINER_POD_TEMPLATE, template)
}

/// The controller SIGKILLed at least 50 times at random instants while two sets (OrderedReady
/// and Parallel) flap between sizes (down, up again within seconds, to 0 and back) and their
/// drain pods fail, are deleted and are evicted (exiting 0 on SIGTERM).
#[tokio::test]
async fn the_controller_killed_at_random_instants_across_flapping_drains() -> Result<()> {
    const SCENARIO: &str = "kills";
    const MIN_KILLS: u32 = 50;
    let mut rng = Rng::for_scenario(SCENARIO);
    let mut faults = FaultLog::new(SCENARIO);
    let client = client().await;
    let ns = TestNamespace::new(&client, "fault-kills").await?;
    let checked = Checked::start(&client, &ns, SCENARIO, I1From::Witness).await?;
    let sets = [("ord", 3, false), ("par", 5, true)];
    for (name, replicas, parallel) in sets {
        let mut set = drain_set(&checked, name, FLAKY_DRAIN).replicas(replicas);
        if parallel {
            set = set.parallel();
        }
        start_set(&ns, &set).await?;
    }
    for (name, replicas, _) in sets {
        wait_running(&ns, &pod_names(name, 0..replicas)).await?;
    }
    let mut controller = ControllerProcess::start(&ns.name, &[]);

    let start = Instant::now();
    while faults.count("controller killed") < MIN_KILLS || start.elapsed() < Duration::from_secs(60)
    {
        ensure!(
            start.elapsed() < Duration::from_secs(240),
            "the fault loop ran out of time"
        );
        tokio::time::sleep(rng.millis(100, 900)).await;
        match rng.range(0, 100) {
            0..55 => {
                controller.kill();
                let down = rng.millis(0, 500);
                faults.add("controller killed", format!("restarted after {down:?}"));
                tokio::time::sleep(down).await;
                controller = ControllerProcess::start(&ns.name, &[]);
            }
            55..80 => {
                let (name, max, _) = *rng.pick(&sets).context("sets")?;
                let replicas = rng.range(0, max as u64 + 1) as i32;
                scale(&ns, name, replicas).await?;
                faults.add("scaled", format!("{name} to {replicas}"));
            }
            80..91 => {
                if let Some(pod) = rng.pick(&live_drain_pods(&ns).await?).cloned() {
                    delete_pod(&ns, &pod).await?;
                    faults.add("drain pod deleted", pod);
                }
            }
            _ => {
                if let Some(pod) = rng.pick(&live_drain_pods(&ns).await?).cloned() {
                    evict_pod(&ns, &pod).await?;
                    faults.add("drain pod evicted", pod);
                }
            }
        }
    }
    // The faults stop: every set ends smaller than it started, so drains must finish.
    scale(&ns, "ord", 1).await?;
    scale(&ns, "par", 2).await?;
    faults.add("scaled", "ord to 1, par to 2 (final)");
    faults.print();
    checked.settle(SETTLE).await?;
    drop(controller);
    let verdict = checked.verdict()?;
    ensure!(
        verdict.claims_deleted >= 3,
        "too few drains completed to show anything: {verdict}"
    );
    Ok(())
}

/// Writes records into the example datastore before and during a run in which it is scaled
/// down, up again within seconds, to 0 and back, while the controller is killed at random
/// instants; the writes overwrite and delete the same keys on different pods again and again,
/// and I4 is judged on the newest write of each key.
#[tokio::test]
async fn every_datastore_record_survives_flapping_scales_and_controller_kills() -> Result<()> {
    const SCENARIO: &str = "datastore";
    let mut rng = Rng::for_scenario(SCENARIO);
    let mut faults = FaultLog::new(SCENARIO);
    let client = client().await;
    let ns = TestNamespace::new(&client, "fault-data").await?;
    // The drain pods run the real `drainer`, not a script that can report: I1 is judged from
    // the completion records in their termination messages, and the drains themselves by I4.
    let checked = Checked::start(&client, &ns, SCENARIO, I1From::TerminationMessages).await?;
    apply_example(&ns, &[])?;
    wait_running(&ns, &pod_names(DATASTORE, 0..3)).await?;
    let mut controller = ControllerProcess::start(&ns.name, &[]);
    let mut writes = Writes::new();
    let written = write_records(&ns, PREWRITTEN, |i| (i % 3) as i32).await?;
    for (key, value) in written {
        writes.put(key, value, Outcome::Acked);
    }

    // A client keeps overwriting and deleting keys on whichever pods run, as an application
    // would.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = tokio::spawn({
        let (client, ns_name, writing) = (client.clone(), ns.name.clone(), Arc::clone(&writing));
        let rng = Rng::for_scenario(&format!("{SCENARIO} writes"));
        async move { write_while(client, ns_name, writes, rng, writing).await }
    });

    let steps: [(i32, u64); 7] = [
        (1, 3000),
        (3, 1500),
        (2, 4000),
        (0, 2500),
        (3, 500),
        (1, 6000),
        (2, 0),
    ];
    for (replicas, hold_ms) in steps {
        scale(&ns, DATASTORE, replicas).await?;
        faults.add("scaled", format!("{DATASTORE} to {replicas}"));
        let until = Instant::now() + Duration::from_millis(hold_ms);
        while Instant::now() < until {
            tokio::time::sleep(rng.millis(300, 1500)).await;
            if rng.range(0, 3) == 0 {
                controller.kill();
                faults.add("controller killed", "");
                tokio::time::sleep(rng.millis(0, 400)).await;
                controller = ControllerProcess::start(&ns.name, &[]);
            }
        }
    }
    faults.print();
    checked.settle(SETTLE).await?;
    writing.store(false, Ordering::SeqCst);
    let writes = writer.await??;
    let summary = writes.summary();
    say(format_args!(
        "[{SCENARIO}] {} keys written: {} overwrites, {} deletes ({} acknowledged), {} \
         requests unanswered",
        summary.keys,
        summary.overwrites,
        summary.deletes,
        summary.deletes_acked,
        summary.unanswered
    ));
    wait_running(&ns, &pod_names(DATASTORE, 0..2)).await?;
    // The returning pods' rebalance sidecars move what a cancelled drain left behind: I4 must
    // hold once they have had their turn (every 30 s).
    let mut problems = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let held = held_by(&ns, 0..2).await?;
        problems = writes.check(&held);
        if problems.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    ensure!(
        problems.is_empty(),
        "[{SCENARIO}] I4 violated ({} problems, the first 20): {:#?}",
        problems.len(),
        &problems[..problems.len().min(20)]
    );
    say(format_args!(
        "[{SCENARIO}] I4 holds: {} keys judged ({} overwrites, {} deletes), the newest write of \
         each on at most one pod",
        summary.keys, summary.overwrites, summary.deletes
    ));
    drop(controller);
    let verdict = checked.verdict()?;
    ensure!(verdict.claims_deleted >= 1, "no drain completed: {verdict}");
    Ok(())
}

/// The records written before the datastore scenario's faults begin (`rec-NNNN`).
const PREWRITTEN: usize = 300;
/// The keys the datastore scenario's client writes only while the faults run (`live-NNNN`).
const LIVE_KEYS: usize = 100;

/// One sequential client, every 50 ms until told to stop: picks a key (a pre-written
/// `rec-NNNN` or a `live-NNNN`) and overwrites it with a value no other write carries or, one
/// time in eight, deletes it, sending each request to the next running datastore pod in turn
/// (so a key's copies land on different pods and only versions decide which wins). Notes
/// every request and its outcome in `writes`, which it returns.
async fn write_while(
    client: kube::Client,
    ns: String,
    mut writes: Writes,
    mut rng: Rng,
    writing: Arc<AtomicBool>,
) -> Result<Writes> {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, &ns);
    let lp = ListParams::default().labels("app=datastore");
    let keys: Vec<String> = (0..PREWRITTEN)
        .map(|i| format!("rec-{i:04}"))
        .chain((0..LIVE_KEYS).map(|i| format!("live-{i:04}")))
        .collect();
    let mut n = 0u32;
    while writing.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Ok(list) = pods.list(&lp).await else {
            continue;
        };
        let running: Vec<_> = list
            .items
            .iter()
            .filter(|p| {
                running_ready(p)
                    && p.metadata.deletion_timestamp.is_none()
                    && !p.labels().contains_key(drain_api::labels::DRAIN_POD)
            })
            .collect();
        let target = (!running.is_empty()).then(|| running[n as usize % running.len()]);
        let Some(ip) = target.and_then(|p| p.status.as_ref()?.pod_ip.clone()) else {
            continue;
        };
        let store = datastore::Client::new(&format!("http://{ip}:8080"))?;
        let key = rng.pick(&keys).context("keys")?.clone();
        if rng.range(0, 8) == 0 {
            let outcome = Outcome::of(&store.delete(&key).await);
            writes.delete(key, outcome);
        } else {
            let value = format!("{key}: w{n} {}", "payload ".repeat(n as usize % 5 + 1));
            let outcome = Outcome::of(&store.put(&key, value.clone()).await);
            writes.put(key, value, outcome);
        }
        n += 1;
    }
    Ok(writes)
}

/// Two replicas with leader election; the leader is SIGKILLed mid-drain, again and again, and
/// comes back as the standby.
#[tokio::test]
async fn two_replicas_with_the_leader_killed_mid_drain() -> Result<()> {
    const SCENARIO: &str = "leader";
    let mut rng = Rng::for_scenario(SCENARIO);
    let mut faults = FaultLog::new(SCENARIO);
    let client = client().await;
    let ns = TestNamespace::new(&client, "fault-leader").await?;
    let checked = Checked::start(&client, &ns, SCENARIO, I1From::Witness).await?;
    let set = drain_set(&checked, "web", FLAKY_DRAIN)
        .replicas(4)
        .parallel();
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..4)).await?;
    let replica = |name: &str| ControllerProcess::start_replica(&ns.name, name);
    let mut replicas = BTreeMap::from([("a", replica("a")), ("b", replica("b"))]);
    let leases = ns.api::<Lease>();
    for round in 0..3 {
        if round > 0 {
            scale(&ns, "web", 4).await?;
            faults.add("scaled", "web to 4");
            wait_running(&ns, &pod_names("web", 0..4)).await?;
        }
        let target = rng.range(0, 3) as i32;
        scale(&ns, "web", target).await?;
        faults.add("scaled", format!("web to {target}"));
        wait_for(T, "a drain pod running", || async {
            Ok(!live_drain_pods(&ns).await?.is_empty())
        })
        .await?;
        tokio::time::sleep(rng.millis(0, 1500)).await;
        let holder = leases
            .get_opt("statefulset-drain-controller")
            .await?
            .and_then(|l| l.spec?.holder_identity)
            .context("no lease holder")?;
        let name = if holder == "a" { "a" } else { "b" };
        if let Some(mut leader) = replicas.remove(name) {
            leader.kill();
        }
        faults.add("leader killed", format!("round {round}: {holder}"));
        tokio::time::sleep(rng.millis(200, 2000)).await;
        replicas.insert(name, replica(name));
    }
    scale(&ns, "web", 1).await?;
    faults.add("scaled", "web to 1 (final)");
    faults.print();
    checked.settle(SETTLE).await?;
    drop(replicas);
    let verdict = checked.verdict()?;
    ensure!(
        verdict.claims_deleted >= 3,
        "too few drains completed: {verdict}"
    );
    Ok(())
}

/// Two controllers without leader election acting on the same sets at once (a misconfigured
/// install: a Deployment scaled to 2, or two installs watching one namespace), while a Parallel
/// set flaps and its drain pods fail once and exit 0 on SIGTERM: every action is idempotent and
/// every delete preconditioned, so I1–I3 hold with both racing for each create and delete. The
/// set has two claims, each drained by a container of its own that reports only its claim.
#[tokio::test]
async fn two_controllers_without_leader_election_at_once() -> Result<()> {
    const SCENARIO: &str = "unelected";
    let mut rng = Rng::for_scenario(SCENARIO);
    let mut faults = FaultLog::new(SCENARIO);
    let client = client().await;
    let ns = TestNamespace::new(&client, "fault-unelected").await?;
    let checked = Checked::start(&client, &ns, SCENARIO, I1From::Witness).await?;
    let set = per_claim_drain_set(&checked, "web", FLAKY_DRAIN, "true")
        .replicas(4)
        .parallel();
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..4)).await?;
    let controllers = [
        ControllerProcess::start_named(&ns.name, "a", &[]),
        ControllerProcess::start_named(&ns.name, "b", &[]),
    ];
    for round in 0..4 {
        if round > 0 {
            let up = rng.range(2, 5) as i32;
            scale(&ns, "web", up).await?;
            faults.add("scaled", format!("web to {up}"));
            tokio::time::sleep(rng.millis(0, 3000)).await;
        }
        let down = rng.range(0, 2) as i32;
        scale(&ns, "web", down).await?;
        faults.add("scaled", format!("web to {down}"));
        tokio::time::sleep(rng.millis(1000, 6000)).await;
    }
    scale(&ns, "web", 1).await?;
    faults.add("scaled", "web to 1 (final)");
    faults.print();
    checked.settle(SETTLE).await?;
    let verdict = checked.verdict()?;
    drop(controllers);
    ensure!(
        verdict.claims_deleted >= 3,
        "too few drains completed: {verdict}"
    );
    Ok(())
}

/// A drain whose first run on a claim never finishes by itself: after `delay` it makes its
/// liveness probe (`test ! -e /tmp/die`) fail, and the kubelet's kill (SIGTERM, no delete
/// request) is answered with `exit 0`, without reporting. Its next run on the claim finishes.
fn stopped_by_liveness_once(delay: Duration) -> String {
    format!(
        "trap 'exit 0' TERM; \
         if [ ! -f /data/probe-killed-once ]; then touch /data/probe-killed-once; \
         sleep {:.2}; touch /tmp/die; while :; do sleep 1 & wait; done; fi; \
         sleep 1 & wait",
        delay.as_secs_f64()
    )
}

/// A drain whose first run on a claim never tells its startup probe (`test -e /tmp/started`)
/// it started, so the kubelet kills it (SIGTERM, no delete request), which it answers with
/// `exit 0`, without reporting. Its next run on the claim starts at once and finishes.
const STOPPED_BY_STARTUP_ONCE: &str = "trap 'exit 0' TERM; \
    if [ -f /data/probe-killed-once ]; then touch /tmp/started; \
    else touch /data/probe-killed-once; while :; do sleep 1 & wait; done; fi; \
    sleep 1 & wait";

/// A drain template running `script` (then reporting to the witness) with `probe` (e.g.
/// `("livenessProbe", {...})`) on its container and the pod's `restartPolicy`.
fn probed_drain_template(
    checked: &Checked,
    script: &str,
    probe: (&str, serde_json::Value),
    restart_policy: &str,
) -> Result<String> {
    let template = drain_template(
        &checked.drain_script(script),
        &["data"],
        json!({"restartPolicy": restart_policy}),
    );
    Ok(edit_template(&template, |t| {
        t["spec"]["containers"][0][probe.0] = probe.1;
    }))
}

/// Drains stopped by the kubelet, not by a delete (issue 21 §2): each claim's first drain run
/// is killed by its own liveness probe (`restartPolicy: Never`: the pod ends `Succeeded`, exit
/// 0, no delete request, which a rule of "exit 0 before any delete request" takes for a
/// finished drain) or startup probe (`OnFailure`), and exits 0 without reporting. No claim may
/// be deleted before its drain reports (I1 from the witness), and every drain must finish on a
/// later run once the faults (controller kills, flapping scales) stop (I3).
#[tokio::test]
async fn drains_stopped_by_their_probes_never_count_and_finish_on_a_later_run() -> Result<()> {
    const SCENARIO: &str = "probes";
    let mut rng = Rng::for_scenario(SCENARIO);
    let mut faults = FaultLog::new(SCENARIO);
    let client = client().await;
    let ns = TestNamespace::new(&client, "fault-probes").await?;
    let checked = Checked::start(&client, &ns, SCENARIO, I1From::Witness).await?;
    let liveness = json!({"exec": {"command": ["sh", "-c", "test ! -e /tmp/die"]},
                          "periodSeconds": 1, "failureThreshold": 1});
    let startup = json!({"exec": {"command": ["test", "-e", "/tmp/started"]},
                         "periodSeconds": 1, "failureThreshold": 2});
    let live = probed_drain_template(
        &checked,
        &stopped_by_liveness_once(rng.millis(0, 2000)),
        ("livenessProbe", liveness),
        "Never",
    )?;
    let start = probed_drain_template(
        &checked,
        STOPPED_BY_STARTUP_ONCE,
        ("startupProbe", startup),
        "OnFailure",
    )?;
    let sets = [("live", live), ("start", start)];
    for (name, template) in &sets {
        let set = SetBuilder::new(name)
            .replicas(3)
            .parallel()
            .annotation(DRAINER_POD_TEMPLATE, template.clone());
        start_set(&ns, &set).await?;
    }
    for (name, _) in &sets {
        wait_running(&ns, &pod_names(name, 0..3)).await?;
    }
    let mut controller = ControllerProcess::start(&ns.name, &[]);

    // 1. Each set 3 → 1 with nothing else going on: every first run is stopped by its probe,
    //    and the claims go only after a later run reported.
    for (name, _) in &sets {
        scale(&ns, name, 1).await?;
        faults.add("scaled", format!("{name} to 1"));
    }
    for (name, _) in &sets {
        for o in [1, 2] {
            wait_claim_gone(&ns, &claim_name("data", name, o), Duration::from_secs(150)).await?;
        }
    }
    faults.add("drained", "ordinals 1 and 2 of both sets");

    // 2. Back to 3 (new claims, new first runs) and flapping with controller kills.
    let flapping = Instant::now();
    for (name, _) in &sets {
        scale(&ns, name, 3).await?;
        faults.add("scaled", format!("{name} to 3"));
    }
    while flapping.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(rng.millis(300, 1500)).await;
        if rng.range(0, 2) == 0 {
            controller.kill();
            let down = rng.millis(0, 500);
            faults.add("controller killed", format!("restarted after {down:?}"));
            tokio::time::sleep(down).await;
            controller = ControllerProcess::start(&ns.name, &[]);
        } else {
            let (name, _) = rng.pick(&sets).context("sets")?;
            let replicas = rng.range(0, 4) as i32;
            scale(&ns, name, replicas).await?;
            faults.add("scaled", format!("{name} to {replicas}"));
        }
    }
    for (name, _) in &sets {
        scale(&ns, name, 1).await?;
    }
    faults.add("scaled", "live and start to 1 (final)");
    faults.print();
    checked.settle(SETTLE).await?;
    drop(controller);
    let verdict = checked.verdict()?;
    ensure!(
        verdict.claims_deleted >= 4,
        "too few drains completed: {verdict}"
    );
    // The liveness set's first runs (phase 1) ended `Succeeded`, exit 0, without reporting:
    // the scenario showed the stops it is about.
    ensure!(
        verdict.exits_unwitnessed >= 2,
        "the probes stopped too few drains to show anything: {verdict}"
    );
    Ok(())
}

/// StatefulSets deleted mid-drain, one held by another controller's finalizer and one not:
/// no claim is deleted, and nothing of ours is left once the sets are gone.
#[tokio::test]
async fn statefulsets_deleted_mid_drain_with_and_without_a_finalizer() -> Result<()> {
    const SCENARIO: &str = "set-deleted";
    let mut faults = FaultLog::new(SCENARIO);
    let client = client().await;
    let ns = TestNamespace::new(&client, "fault-setdel").await?;
    let _release = release_set_finalizers_on_drop(&ns, "held");
    let checked = Checked::start(&client, &ns, SCENARIO, I1From::Witness).await?;
    let never_done = "trap 'exit 0' TERM; while [ ! -f /data/go ]; do sleep 0.2; done";
    start_set(&ns, &drain_set(&checked, "held", never_done)).await?;
    start_set(&ns, &drain_set(&checked, "bare", never_done)).await?;
    ns.api::<StatefulSet>()
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["e2e.example/hold"]}})),
        )
        .await?;
    for set in ["held", "bare"] {
        wait_running(&ns, &pod_names(set, 0..3)).await?;
    }
    let _controller = ControllerProcess::start(&ns.name, &[]);
    for set in ["held", "bare"] {
        scale(&ns, set, 1).await?;
    }
    for set in ["held", "bare"] {
        wait_drain_pod(&ns, &pod_name(set, 2), Some("Running")).await?;
    }
    let claims_before = ns
        .api::<PersistentVolumeClaim>()
        .list(&ListParams::default())
        .await?;
    for set in ["held", "bare"] {
        ns.api::<StatefulSet>()
            .delete(set, &DeleteParams::background())
            .await?;
        faults.add("statefulset deleted", set);
    }
    // The held set stays, being deleted: the controller leaves it alone. Let the drains that
    // were in flight finish now: nothing may delete their claims.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for pod in live_drain_pods(&ns).await? {
        let _ = e2e::faults::exec(&ns, &pod, "drain", "touch /data/go").await;
        faults.add("drain finished after its set was deleted", pod);
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    ns.api::<StatefulSet>()
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    faults.add("finalizer removed", "held");
    faults.print();
    checked.settle(SETTLE).await?;
    let claims_after = ns
        .api::<PersistentVolumeClaim>()
        .list(&ListParams::default())
        .await?;
    let uids = |l: &kube::api::ObjectList<PersistentVolumeClaim>| {
        l.items
            .iter()
            .map(|c| c.uid().unwrap_or_default())
            .collect::<std::collections::BTreeSet<_>>()
    };
    ensure!(
        uids(&claims_before) == uids(&claims_after),
        "claims of deleted sets changed: before {:?}, after {:?}",
        uids(&claims_before),
        uids(&claims_after)
    );
    let verdict = checked.verdict()?;
    ensure!(
        verdict.claims_deleted == 0,
        "a claim was deleted: {verdict}"
    );
    Ok(())
}
