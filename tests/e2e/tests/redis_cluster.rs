//! The Redis Cluster example (`example/redis-cluster`, issue 25) drained by scaling its
//! StatefulSet, on the real cluster, as a user runs it (`kubectl apply -k`), with the
//! controller: 6 → 3 → 6 and 3 → 1 under a client writing all the time, a drain pod deleted in
//! the middle of its migration, and a scale-up that cancels a drain.
//!
//! Judged from facts the controller does not produce: a client pod (the witness) writes keys
//! through the cluster with `redis-cli -c` and keeps the ones Redis acknowledged, and every one
//! must read back its value at the end; `CLUSTER NODES` and `CLUSTER INFO` as Redis reports
//! them (only live members, every slot served); and the claims.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use e2e::faults::exec;
use e2e::ops::{
    claim_uid, is_drain_pod, pod_names, scale, wait_claim_gone, wait_stateful_pod_back,
};
use e2e::redis::{SET, apply_example, wait_members};
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, LogParams, PostParams};

const IMAGE: &str = "statefulset-drain.local/redis-cluster:7.0";
/// Joining members one at a time, or draining one, takes seconds to tens of seconds each.
const T: Duration = Duration::from_secs(300);
/// Keys written before the scale-down, in one pipeline.
const PRELOAD: usize = 3000;

/// The witness's script: first [`PRELOAD`] keys in one pipeline, then one write at a time
/// until `/tmp/stop` exists; every key Redis answered `OK` for goes to `/tmp/acked`, every
/// other to `/tmp/failed`. A key `<letter><n>` holds `v<n>`. Each write is given 2 s: a
/// redirect to a member's old address (its stateful pod gone, its drain pod not yet announced)
/// would otherwise hang in connect for minutes, and the witness would write nothing meanwhile
/// (it wrote 48 keys through three drains in one CI run, 9,473 in another). A write cut off is
/// not acknowledged, so it is never looked for.
const WRITER: &str = r#"
cd /tmp
i=0; while [ $i -lt PRELOAD ]; do i=$((i+1)); echo p$i; done > keys
sed 's/^p\(.*\)/SET p\1 v\1/' keys | redis-cli -c --no-raw -h redis-0.redis | grep -v '^-> Redirected' > replies
paste -d ' ' keys replies | awk '$2 == "OK" {print $1}' > acked
touch failed preloaded
i=0
while [ ! -e stop ]; do
  i=$((i+1))
  if [ "$(timeout 2 redis-cli -c -h redis-0.redis SET w$i v$i 2>/dev/null)" = OK ]; then echo w$i >> acked; else echo w$i >> failed; fi
done
touch stopped
exec sleep 3600
"#;

/// Starts the witness pod and waits until its preload was acknowledged.
async fn start_writer(ns: &TestNamespace) -> Result<()> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "writer"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "writer", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", WRITER.replace("PRELOAD", &PRELOAD.to_string())],
            }],
        },
    }))?;
    ns.api::<Pod>().create(&PostParams::default(), &pod).await?;
    wait_for(T, "the witness's preload", || async {
        Ok(writer(ns, "test -e /tmp/preloaded && echo yes || true")
            .await
            .is_ok_and(|o| o.trim() == "yes"))
    })
    .await?;
    let acked: usize = writer(ns, "grep -c '^p' /tmp/acked || true")
        .await?
        .trim()
        .parse()?;
    ensure!(
        acked == PRELOAD,
        "only {acked} of {PRELOAD} preloaded keys were acknowledged"
    );
    Ok(())
}

async fn writer(ns: &TestNamespace, script: &str) -> Result<String> {
    exec(ns, "writer", "writer", script).await
}

/// The lines in the witness's `/tmp/<file>`.
async fn count(ns: &TestNamespace, file: &str) -> Result<usize> {
    Ok(writer(ns, &format!("wc -l < /tmp/{file}"))
        .await?
        .trim()
        .parse()?)
}

/// Stops the witness's writes; returns how many it made and how many of them Redis refused
/// (a slot whose node is between its stateful pod and its drain pod is down for a moment).
async fn stop_writer(ns: &TestNamespace) -> Result<(usize, usize)> {
    writer(
        ns,
        "touch /tmp/stop; while [ ! -e /tmp/stopped ]; do sleep 0.1; done",
    )
    .await?;
    Ok((count(ns, "acked").await?, count(ns, "failed").await?))
}

/// The witness's read-back: every acknowledged key `GET` through the cluster in one pipeline
/// (`--no-raw`: one line per reply, so a reply lines up with its key), judged per key: its
/// value `v<n>` is kept; `(nil)` or another value is a loss; an error (`CLUSTERDOWN` while a
/// member rejoins, `TRYAGAIN`) or no reply answers nothing, and those keys are read again in
/// the next pass, 2 s later, up to [`READ_PASSES`]. A pass whose reply count does not match its
/// key count (a connection lost midway) judges nothing. `redis-cli -c` stays on the node a
/// redirect took it to, so one member that refuses for a moment refuses the rest of its pass:
/// a pass judged whole in one go would count a transient refusal as thousands of losses, as
/// one CI run did (every reply after the eleventh `CLUSTERDOWN The cluster is down`).
const READ_BACK: &str = r#"
cd /tmp; cp acked todo; : > lost; pass=0
while [ -s todo ] && [ $pass -lt PASSES ]; do
  pass=$((pass + 1))
  [ $pass -eq 1 ] || sleep 2
  sed 's/^/GET /' todo | redis-cli -c --no-raw -h redis-0.redis 2>/dev/null | grep -v '^-> Redirected' > got
  [ "$(wc -l < got)" -eq "$(wc -l < todo)" ] || { echo "pass $pass: $(wc -l < got) replies to $(wc -l < todo) keys"; continue; }
  : > retry
  paste -d ' ' todo got | awk '
    $2 == "\"v" substr($1, 2) "\"" {ok++; next}
    $2 == "(nil)" || substr($2, 1, 1) == "\"" {print >> "lost"; bad++; next}
    {print $1 >> "retry"; again++}
    END {print ok + bad + again}' > judged || { echo "pass $pass: awk failed"; exit 1; }
  [ "$(cat judged)" -eq "$(wc -l < todo)" ] || { echo "pass $pass: $(cat judged) of $(wc -l < todo) keys judged"; exit 1; }
  [ -s retry ] && echo "pass $pass: $(wc -l < retry) unanswered, e.g. $(grep -m 1 -v '^"' got)"
  mv retry todo
done
head -n 5 lost | sed 's/^/lost /'
echo read $(wc -l < acked) lost $(wc -l < lost) unanswered $(wc -l < todo)
"#;
/// Read-back passes at most (2 s apart): a member's rejoin delay is 5 s at most.
const READ_PASSES: usize = 30;

/// Fails unless every key Redis acknowledged reads back its value through the cluster
/// ([`READ_BACK`]); returns how many were read.
async fn assert_every_acked_write_readable(ns: &TestNamespace) -> Result<usize> {
    let out = writer(ns, &READ_BACK.replace("PASSES", &READ_PASSES.to_string())).await?;
    let last = out.lines().last().context("no output")?;
    let fields: Vec<&str> = last.split_whitespace().collect();
    let (read, lost, unanswered): (usize, usize, usize) = match fields.as_slice() {
        ["read", n, "lost", l, "unanswered", u] => (n.parse()?, l.parse()?, u.parse()?),
        _ => bail!("unexpected output: {out}"),
    };
    ensure!(
        lost == 0,
        "{lost} of {read} acknowledged writes lost or changed:\n{out}"
    );
    if unanswered > 0 {
        let views = cluster_views(ns).await.unwrap_or_default();
        bail!(
            "{unanswered} of {read} acknowledged writes unanswered after {READ_PASSES} passes:\n{out}\n{views}"
        );
    }
    Ok(read)
}

/// Redis' own view, through `member`: the nodes `CLUSTER NODES` lists, as (address, flags,
/// slots served), and the `CLUSTER INFO` fields that matter.
async fn cluster_view(
    ns: &TestNamespace,
    member: &str,
) -> Result<(Vec<(String, String, usize)>, String)> {
    let nodes = exec(ns, member, "redis", "redis-cli cluster nodes").await?;
    let info = exec(ns, member, "redis", "redis-cli cluster info").await?;
    let view = nodes
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let slots = f
                .iter()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .map(|s| match s.split_once('-') {
                    Some((a, b)) => {
                        b.parse::<usize>().unwrap_or(0) + 1 - a.parse::<usize>().unwrap_or(0)
                    }
                    None => 1,
                })
                .sum();
            (f[1].to_owned(), f[2].to_owned(), slots)
        })
        .collect();
    Ok((view, info.replace('\r', "")))
}

/// Every member's view of the cluster (its `CLUSTER NODES` and state), for a failure message.
async fn cluster_views(ns: &TestNamespace) -> Result<String> {
    let mut out = String::new();
    for p in ns.api::<Pod>().list(&Default::default()).await? {
        if is_drain_pod(&p) {
            continue;
        }
        let Some(name) = p.metadata.name.filter(|n| n.starts_with(SET)) else {
            continue;
        };
        let nodes = exec(ns, &name, "redis", "redis-cli cluster nodes").await;
        let info = exec(
            ns,
            &name,
            "redis",
            "redis-cli cluster info | grep cluster_state",
        )
        .await;
        out += &format!("{name}: {info:?}\n{nodes:?}\n");
    }
    Ok(out)
}

/// Fails unless every one of the `n` members reports exactly `n` masters, all connected and
/// none failing, sharing all 16384 slots (each serving some when `each_serves`), and its own
/// cluster state `ok`: a member whose view differs (one that still takes another for failed,
/// or is itself in its rejoin delay) refuses what it is asked.
async fn assert_cluster(ns: &TestNamespace, n: usize, each_serves: bool) -> Result<()> {
    // Membership settles by gossip: give it a few seconds.
    let mut last = String::new();
    let start = Instant::now();
    'wait: while start.elapsed() < Duration::from_secs(30) {
        for member in pod_names(SET, 0..n as i32) {
            let (view, info) = cluster_view(ns, &member).await?;
            let total: usize = view.iter().map(|v| v.2).sum();
            let healthy = view.len() == n
                && view.iter().all(|(_, flags, slots)| {
                    // Flags are a list: `nofailover` is not `fail`.
                    let flags: Vec<&str> = flags.split(',').collect();
                    flags.contains(&"master")
                        && !flags.iter().any(|f| *f == "fail" || *f == "fail?")
                        && (*slots > 0 || !each_serves)
                })
                && total == 16384
                && info.contains("cluster_state:ok")
                && info.contains(&format!("cluster_known_nodes:{n}\n"));
            if !healthy {
                last = format!("as {member} sees it: {view:?}\n{info}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue 'wait;
            }
        }
        return Ok(());
    }
    bail!("Redis does not report {n} healthy masters serving every slot:\n{last}")
}

/// Waits until the drain pod of `ordinal` says it is moving slots.
async fn wait_migrating(ns: &TestNamespace, ordinal: i32) -> Result<Pod> {
    let name = pod_names(SET, [ordinal]).remove(0);
    let pods = ns.api::<Pod>();
    let params = LogParams {
        container: Some("drain".into()),
        ..LogParams::default()
    };
    wait_for(T, &format!("drain pod {name} moving slots"), || async {
        let Some(p) = pods.get_opt(&name).await? else {
            return Ok(false);
        };
        Ok(is_drain_pod(&p)
            && pods
                .logs(&name, &params)
                .await
                .is_ok_and(|l| l.contains("moving")))
    })
    .await?;
    Ok(pods.get(&name).await?)
}

/// Waits until the claim of `ordinal` is gone (its drain finished); on a timeout the error
/// carries the end of the drain pod's log.
async fn wait_drained(ns: &TestNamespace, ordinal: i32) -> Result<()> {
    let r = wait_claim_gone(ns, &format!("data-{SET}-{ordinal}"), T).await;
    if r.is_err() {
        let name = pod_names(SET, [ordinal]).remove(0);
        let params = LogParams {
            container: Some("drain".into()),
            tail_lines: Some(40),
            ..LogParams::default()
        };
        let log = ns
            .api::<Pod>()
            .logs(&name, &params)
            .await
            .unwrap_or_default();
        return r.with_context(|| format!("the drain pod {name}'s log ends:\n{log}"));
    }
    Ok(())
}

/// 6 → 3 → 6 with the witness writing throughout: the three drained members' slots and keys
/// move to the others, the members leave the cluster and their claims go; the three new members
/// join empty and take their share; no acknowledged write is lost.
#[tokio::test]
async fn six_to_three_and_back_under_a_writing_client_loses_no_acknowledged_write() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "redis-6-3-6").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    apply_example(&ns, 6)?;
    wait_members(&ns, 6).await?;
    assert_cluster(&ns, 6, true).await?;
    start_writer(&ns).await?;

    scale(&ns, SET, 3).await?;
    // The witness must have been writing while the members' slots moved, or "nothing lost"
    // says little: its acknowledged writes are counted from the scale-down to each drain's end
    // (one at a time, highest first: OrderedReady); each span must hold one at least (a write
    // to a slot whose member is between its pods waits its 2 s), and all three 10.
    let start = count(&ns, "acked").await?;
    let mut acked = start;
    for ordinal in [5, 4, 3] {
        wait_drained(&ns, ordinal).await?;
        let (now, refused) = (count(&ns, "acked").await?, count(&ns, "failed").await?);
        let during = now - acked;
        eprintln!(
            "6 → 3: {during} writes acknowledged while ordinal {ordinal} drained ({refused} refused so far)"
        );
        ensure!(
            during >= 1,
            "the witness had no write acknowledged while ordinal {ordinal} drained ({refused} \
             refused so far)"
        );
        acked = now;
    }
    ensure!(
        acked - start >= 10,
        "the witness had only {} writes acknowledged during the drains",
        acked - start
    );
    assert_cluster(&ns, 3, true).await?;

    scale(&ns, SET, 6).await?;
    wait_members(&ns, 6).await?;
    assert_cluster(&ns, 6, true).await?;
    let (acked, refused) = stop_writer(&ns).await?;
    let read = assert_every_acked_write_readable(&ns).await?;
    eprintln!(
        "6 → 3 → 6: {read} acknowledged writes all read back; {refused} writes refused along the way ({acked} acknowledged)"
    );
    Ok(())
}

/// 3 → 2 and back to 3 while the drain is moving slots (the default `cancel`): the drain pod
/// is stopped, the member returns on its claim (same node, its remaining slots), the half-moved
/// slot is finished, and the cluster is whole: 3 masters, every slot served, nothing lost.
#[tokio::test]
async fn a_scale_up_mid_drain_brings_the_member_back_whole() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "redis-cancel").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    apply_example(&ns, 3)?;
    wait_members(&ns, 3).await?;
    let claim = format!("data-{SET}-2");
    let uid = claim_uid(&ns, &claim).await?;
    start_writer(&ns).await?;

    scale(&ns, SET, 2).await?;
    wait_migrating(&ns, 2).await?;
    scale(&ns, SET, 3).await?;
    wait_stateful_pod_back(&ns, &pod_names(SET, [2]).remove(0)).await?;
    wait_members(&ns, 3).await?;
    ensure!(
        claim_uid(&ns, &claim).await? == uid,
        "claim {claim} was replaced"
    );
    assert_cluster(&ns, 3, false).await?;
    let (acked, refused) = stop_writer(&ns).await?;
    let read = assert_every_acked_write_readable(&ns).await?;
    eprintln!(
        "3 → 2 → 3 mid-drain: {read} acknowledged writes all read back; {refused} refused ({acked} acknowledged)"
    );
    Ok(())
}

/// 3 → 1 with the witness writing, and the first drain pod deleted in the middle of its
/// migration (as an eviction would): its attempt fails, a new drain pod finishes the
/// half-moved slot and the rest; both drained members leave, and nothing acknowledged is lost.
#[tokio::test]
async fn three_to_one_with_a_drain_pod_deleted_mid_migration_loses_nothing() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "redis-3-1").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    apply_example(&ns, 3)?;
    wait_members(&ns, 3).await?;
    start_writer(&ns).await?;

    scale(&ns, SET, 1).await?;
    let first = wait_migrating(&ns, 2).await?;
    let first_uid = first.metadata.uid.clone().unwrap_or_default();
    ns.api::<Pod>()
        .delete(&pod_names(SET, [2]).remove(0), &DeleteParams::default())
        .await?;
    // A later drain pod of the same ordinal finishes the job.
    let pods = ns.api::<Pod>();
    wait_for(T, "a new drain pod for ordinal 2", || async {
        Ok(pods
            .get_opt(&pod_names(SET, [2]).remove(0))
            .await?
            .is_some_and(|p| {
                is_drain_pod(&p) && p.metadata.uid.as_deref() != Some(first_uid.as_str())
            }))
    })
    .await?;
    for ordinal in [2, 1] {
        wait_drained(&ns, ordinal).await?;
    }
    assert_cluster(&ns, 1, true).await?;
    let (acked, refused) = stop_writer(&ns).await?;
    let read = assert_every_acked_write_readable(&ns).await?;
    eprintln!(
        "3 → 1, a drain pod deleted mid-migration: {read} acknowledged writes all read back; {refused} refused ({acked} acknowledged)"
    );
    Ok(())
}

/// 4 → 3 with the witness writing, and the drain pod's Redis killed in the middle of the
/// migration while its script lives on (as an OOM kill of the server would): the script must
/// not take the dead node's silence for "no keys left" and hand slots over without their keys;
/// the attempt fails, the next one starts the node again and finishes, and nothing
/// acknowledged is lost.
#[tokio::test]
async fn a_drain_whose_redis_dies_mid_migration_loses_nothing() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "redis-node-dies").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    apply_example(&ns, 4)?;
    wait_members(&ns, 4).await?;
    start_writer(&ns).await?;

    scale(&ns, SET, 3).await?;
    let drain = wait_migrating(&ns, 3).await?;
    let name = drain.metadata.name.clone().unwrap_or_default();
    exec(&ns, &name, "drain", "kill -9 $(pidof redis-server)").await?;
    // The attempt the kill hit does not finish: the drainer runs the script again (in the same
    // drain pod, whose log goes with it once the drain is done).
    let params = LogParams {
        container: Some("drain".into()),
        ..LogParams::default()
    };
    let pods = ns.api::<Pod>();
    wait_for(T, "the drain's next attempt", || async {
        Ok(pods
            .logs(&name, &params)
            .await
            .is_ok_and(|l| l.contains("running hook attempt=2")))
    })
    .await?;
    wait_drained(&ns, 3).await?;
    assert_cluster(&ns, 3, true).await?;
    let (acked, refused) = stop_writer(&ns).await?;
    let read = assert_every_acked_write_readable(&ns).await?;
    eprintln!(
        "4 → 3, the drain's Redis killed mid-migration: {read} acknowledged writes all read back; {refused} refused ({acked} acknowledged)"
    );
    Ok(())
}
