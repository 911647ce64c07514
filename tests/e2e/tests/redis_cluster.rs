//! The Redis Cluster example (`example/redis-cluster`, issue 25) drained by scaling its
//! StatefulSet, on the real cluster, as a user runs it (`kubectl apply -k`), with the
//! controller: 6 → 3 → 6 and 3 → 1 under a client writing and overwriting all the time, a drain
//! pod evicted in the middle of its migration, and a scale-up that cancels a drain.
//!
//! Judged from facts the controller does not produce: a client pod (the witness) writes keys
//! through the cluster with `redis-cli -c` and keeps the ones Redis acknowledged, and every one
//! must read back its value at the end, read by the test's own Redis client; `CLUSTER NODES`
//! and `CLUSTER INFO` as every member reports them (only live members, every slot served by
//! the same owner in every view, none migrating); and the claims.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use e2e::faults::exec;
use e2e::nodes::Cordoned;
use e2e::ops::{
    claim_uid, is_drain_pod, pod_names, scale, wait_claim_gone, wait_stateful_pod_back,
};
use e2e::redis::{
    DrainLogs, Reply, SET, apply_example, key_slot, member_addr, pipeline, slot_owners,
    wait_members,
};
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{EvictParams, LogParams, PostParams};

const IMAGE: &str = "statefulset-drain.local/redis-cluster:7.0";
/// Joining members one at a time, or draining one, takes seconds to tens of seconds each.
const T: Duration = Duration::from_secs(300);
/// Keys written before the scale-down, in one pipeline.
const PRELOAD: usize = 3000;

/// The witness's script: first [`PRELOAD`] keys in one pipeline, then one write at a time
/// until `/tmp/stop` exists; every key Redis answered `OK` for goes to `/tmp/acked`, every
/// other to `/tmp/failed`. A key `<letter><n>` holds `v<n>`. After each new key, the witness
/// overwrites a preloaded key `p<k>` with `u<i>` (`i` the write's number), listed as `p<k> u<i>`
/// in `/tmp/overwritten` when acknowledged, else in `/tmp/overwrite-failed`. Each write is given 2 s: a
/// redirect to a member's old address (its stateful pod gone, its drain pod not yet announced)
/// would otherwise hang in connect for minutes, and the witness would write nothing meanwhile
/// (it wrote 48 keys through three drains in one CI run, 9,473 in another). A write cut off is
/// not acknowledged, so it is never looked for.
const WRITER: &str = r#"
cd /tmp
i=0; while [ $i -lt PRELOAD ]; do i=$((i+1)); echo p$i; done > keys
sed 's/^p\(.*\)/SET p\1 v\1/' keys | redis-cli -c --no-raw -h redis-0.redis | grep -v -e '^-> Redirected' -e '^([0-9.]*s)$' > replies
paste -d ' ' keys replies | awk '$2 == "OK" {print $1}' > acked
touch failed overwritten overwrite-failed preloaded
i=0
while [ ! -e stop ]; do
  i=$((i+1))
  if [ "$(timeout 2 redis-cli -c -h redis-0.redis SET w$i v$i 2>/dev/null)" = OK ]; then echo w$i >> acked; else echo w$i >> failed; fi
  k=$(( (i * 37) % PRELOAD + 1 ))
  if [ "$(timeout 2 redis-cli -c -h redis-0.redis SET p$k u$i 2>/dev/null)" = OK ]; then echo "p$k u$i" >> overwritten; else echo "p$k u$i" >> overwrite-failed; fi
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

/// The witness's overwrites of preloaded keys: by key, each write's number and whether it was
/// acknowledged.
struct Overwrites(HashMap<String, Vec<(u64, bool)>>);

impl Overwrites {
    /// Reads the witness's lists.
    async fn read(ns: &TestNamespace) -> Result<Self> {
        let mut by_key: HashMap<String, Vec<(u64, bool)>> = HashMap::new();
        for (file, acked) in [("overwritten", true), ("overwrite-failed", false)] {
            for line in writer(ns, &format!("cat /tmp/{file}")).await?.lines() {
                let (key, value) = line.split_once(' ').context("an overwrite line")?;
                let i: u64 = value.trim_start_matches('u').parse()?;
                by_key.entry(key.to_owned()).or_default().push((i, acked));
            }
        }
        Ok(Self(by_key))
    }

    /// How many overwrites were acknowledged.
    fn acked(&self) -> usize {
        self.0.values().flatten().filter(|(_, a)| *a).count()
    }

    /// Whether `key` may hold `value`: its own `v<n>` if no overwrite of it was acknowledged;
    /// else an overwrite's `u<i>` no older than the last acknowledged one (a later write that
    /// got no answer may have been applied all the same).
    fn accepts(&self, key: &str, value: &[u8]) -> bool {
        let value = String::from_utf8_lossy(value);
        let writes = self.0.get(key).map(Vec::as_slice).unwrap_or_default();
        let last_acked = writes.iter().filter(|(_, a)| *a).map(|(i, _)| *i).max();
        if last_acked.is_none() && value == format!("v{}", key.get(1..).unwrap_or_default()) {
            return true;
        }
        writes
            .iter()
            .any(|(i, _)| last_acked.is_none_or(|last| *i >= last) && value == format!("u{i}"))
    }
}

/// Read-back passes at most, 2 s apart: a member's rejoin delay is 5 s at most.
const READ_PASSES: usize = 30;

/// Fails unless every one of the `acked` keys the witness had acknowledged reads back its
/// value (its last acknowledged overwrite's, for an overwritten one: [`Overwrites`]), and
/// unless some overwrites were acknowledged; returns how many keys were read. The test reads them itself, with its own Redis client:
/// each pass asks member 0 which master serves which slot (`CLUSTER SLOTS`) and sends each
/// master the `GET`s of its keys in one pipeline, so each reply is its own key's. A value
/// `v<n>` is kept; none (`nil`) or another value is a loss; an error reply (`CLUSTERDOWN`
/// while a member rejoins, `TRYAGAIN`, `MOVED` after a slot moved) or no reply answers
/// nothing, and the key is read again in the next pass, up to [`READ_PASSES`]; a key still
/// unanswered then fails the test. (One `redis-cli -c` pipeline read them all before: it
/// stays on the node a redirect took it to, so a member refusing for a moment refused the
/// rest of the keys, and raw mode's extra line after each error slid every later reply off its
/// key; one CI run counted 6,386 losses of 3,203 writes that way.)
async fn assert_every_acked_write_readable(ns: &TestNamespace, acked: usize) -> Result<usize> {
    let keys = writer(ns, "cat /tmp/acked").await?;
    let keys: Vec<&str> = keys.lines().collect();
    ensure!(
        keys.len() == acked,
        "the witness's list has {} keys, its count {acked}",
        keys.len()
    );
    ensure!(
        acked >= PRELOAD,
        "the witness acknowledged {acked} writes, fewer than its {PRELOAD} preloaded"
    );
    let overwrites = Overwrites::read(ns).await?;
    ensure!(
        overwrites.acked() >= 1,
        "the witness had no overwrite acknowledged: the read-back would not show a lost update"
    );
    let overwrites = &overwrites;
    let entry = member_addr(ns, &pod_names(SET, [0]).remove(0)).await?;
    let mut todo: Vec<&str> = keys.clone();
    let mut lost = Vec::new();
    let mut why = String::new();
    for pass in 1..=READ_PASSES {
        if pass > 1 {
            eprintln!(
                "read-back pass {}: {} unanswered, e.g. {why}",
                pass - 1,
                todo.len()
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let owners = match slot_owners(entry, Duration::from_secs(5)).await {
            Ok(o) => o,
            Err(e) => {
                why = format!("{e:#}");
                continue;
            }
        };
        let mut by_owner: HashMap<SocketAddr, Vec<&str>> = HashMap::new();
        let mut again = Vec::new();
        for key in todo {
            let slot = key_slot(key.as_bytes());
            match owners.iter().find(|(r, _)| r.contains(&slot)) {
                Some((_, addr)) => by_owner.entry(*addr).or_default().push(key),
                None => {
                    why = format!("slot {slot} served by none");
                    again.push(key);
                }
            }
        }
        // Every master at once, each within 10 s: one that does not answer costs a pass 10 s.
        let reads = by_owner.into_iter().map(|(addr, keys)| async move {
            let gets: Vec<Vec<&[u8]>> = keys
                .iter()
                .map(|k| vec![&b"GET"[..], k.as_bytes()])
                .collect();
            let replies = pipeline(addr, &gets, Duration::from_secs(10)).await;
            (addr, keys, replies)
        });
        for (addr, keys, replies) in futures::future::join_all(reads).await {
            let replies = match replies {
                Ok(r) => r,
                Err(e) => {
                    why = format!("{e:#}");
                    again.extend(keys);
                    continue;
                }
            };
            for (key, reply) in keys.into_iter().zip(replies) {
                match reply {
                    Reply::Bulk(Some(v)) if overwrites.accepts(key, &v) => {}
                    Reply::Bulk(Some(v)) => {
                        lost.push(format!(
                            "{key}: {:?} at {addr}",
                            String::from_utf8_lossy(&v)
                        ));
                    }
                    Reply::Bulk(None) => lost.push(format!("{key}: none at {addr}")),
                    Reply::Error(e) => {
                        why = format!("{addr}: {e}");
                        again.push(key);
                    }
                    other => lost.push(format!("{key}: {other:?} at {addr}")),
                }
            }
        }
        todo = again;
        if todo.is_empty() {
            break;
        }
    }
    ensure!(
        lost.is_empty(),
        "{} of {acked} acknowledged writes lost or changed, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    if !todo.is_empty() {
        let views = cluster_views(ns).await.unwrap_or_else(|e| e.to_string());
        bail!(
            "{} of {acked} acknowledged writes unanswered after {READ_PASSES} passes ({why}):\n{views}",
            todo.len()
        );
    }
    eprintln!(
        "the witness's {} acknowledged overwrites of preloaded keys read back",
        overwrites.acked()
    );
    Ok(acked)
}

/// One line of `CLUSTER NODES`: a node as a member sees it.
struct Node {
    id: String,
    addr: String,
    flags: String,
    link: String,
    /// The slot ranges it serves, as printed (`0-5460 5461`).
    slots: String,
    count: usize,
    /// Slots migrating from or importing to it (`[5462->-<id>]`), printed on a member's own
    /// line only.
    open: String,
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Node {
            id,
            addr,
            flags,
            link,
            slots,
            open,
            ..
        } = self;
        write!(f, "{id} {addr} {flags} {link} {slots} {open}")
    }
}

/// Redis' own view, through `member` (one `kubectl exec`, within 10 s): the nodes `CLUSTER
/// NODES` lists, sorted by ID, and `CLUSTER INFO`.
async fn cluster_view(ns: &TestNamespace, member: &str) -> Result<(Vec<Node>, String)> {
    let script = "redis-cli cluster nodes && echo === && redis-cli cluster info";
    let out = tokio::time::timeout(Duration::from_secs(10), exec(ns, member, "redis", script))
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 10 s"))??;
    let out = out.replace('\r', "");
    let (nodes, info) = out.split_once("===\n").context("no CLUSTER INFO")?;
    let mut view = Vec::new();
    for l in nodes.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        ensure!(f.len() >= 8, "not a CLUSTER NODES line: {l:?}");
        let (open, ranges): (Vec<&str>, Vec<&str>) =
            f[8..].iter().copied().partition(|s| s.starts_with('['));
        let count = ranges
            .iter()
            .map(|s| match s.split_once('-') {
                Some((a, b)) => {
                    b.parse::<usize>().unwrap_or(0) + 1 - a.parse::<usize>().unwrap_or(0)
                }
                None => 1,
            })
            .sum();
        view.push(Node {
            id: f[0].to_owned(),
            addr: f[1].to_owned(),
            flags: f[2].to_owned(),
            link: f[7].to_owned(),
            slots: ranges.join(" "),
            count,
            open: open.join(" "),
        });
    }
    view.sort_by(|a, b| a.id.cmp(&b.id));
    Ok((view, info.to_owned()))
}

/// Every Redis pod's view of the cluster (its `CLUSTER NODES` and state), drain pods' too,
/// for a failure message.
async fn cluster_views(ns: &TestNamespace) -> Result<String> {
    let mut out = String::new();
    for p in ns.api::<Pod>().list(&Default::default()).await? {
        let container = if is_drain_pod(&p) { "drain" } else { "redis" };
        let Some(name) = p.metadata.name.filter(|n| n.starts_with(SET)) else {
            continue;
        };
        let script = "redis-cli cluster nodes; redis-cli cluster info | grep cluster_state";
        let view =
            tokio::time::timeout(Duration::from_secs(10), exec(ns, &name, container, script)).await;
        out += &format!("{name} ({container}): {view:?}\n");
    }
    Ok(out)
}

/// Fails unless every one of the `n` members reports exactly `n` masters, connected and none
/// failing, sharing all 16384 slots (each serving some when `each_serves`) with no slot
/// migrating, its own cluster state `ok`, and the same owner for every slot as member 0: a
/// member whose view differs (one that still takes another for failed, is itself in its
/// rejoin delay, or gives a slot to another node) refuses or misroutes what it is asked. A
/// member that does not answer is not healthy yet: it is asked again, within the minute that
/// gossip is given to settle.
async fn assert_cluster(ns: &TestNamespace, n: usize, each_serves: bool) -> Result<()> {
    let mut last = String::new();
    let start = Instant::now();
    'wait: while start.elapsed() < Duration::from_secs(60) {
        let mut first: Option<(Vec<(String, String)>, String)> = None;
        for member in pod_names(SET, 0..n as i32) {
            let (view, info) = match cluster_view(ns, &member).await {
                Ok(v) => v,
                Err(e) => {
                    last = format!("{member} did not answer: {e:#}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue 'wait;
                }
            };
            let total: usize = view.iter().map(|v| v.count).sum();
            let owners: Vec<(String, String)> = view
                .iter()
                .map(|v| (v.id.clone(), v.slots.clone()))
                .collect();
            let healthy = view.len() == n
                && view.iter().all(|node| {
                    // Flags are a list: `nofailover` is not `fail`.
                    let flags: Vec<&str> = node.flags.split(',').collect();
                    flags.contains(&"master")
                        && !flags.iter().any(|f| *f == "fail" || *f == "fail?")
                        && node.link == "connected"
                        && node.open.is_empty()
                        && (node.count > 0 || !each_serves)
                })
                && total == 16384
                && info.contains("cluster_state:ok")
                && info.contains(&format!("cluster_known_nodes:{n}\n"))
                && first.as_ref().is_none_or(|(o, _)| *o == owners);
            let shown: Vec<String> = view.iter().map(Node::to_string).collect();
            let shown = format!("as {member} sees it:\n{}", shown.join("\n"));
            if !healthy {
                let member_0 = first.map(|(_, s)| s).unwrap_or_default();
                last = format!("{shown}\n{info}\n{member_0}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue 'wait;
            }
            first.get_or_insert((owners, shown));
        }
        return Ok(());
    }
    let mut logs = String::new();
    let params = LogParams {
        tail_lines: Some(20),
        ..LogParams::default()
    };
    for member in pod_names(SET, 0..n as i32) {
        let log = ns.api::<Pod>().logs(&member, &params).await;
        logs.push_str(&format!(
            "{member}'s log ends:\n{}\n",
            log.unwrap_or_default()
        ));
    }
    bail!("Redis does not report {n} healthy masters serving every slot:\n{last}\n{logs}")
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

    let drains = DrainLogs::follow(&ns, 3..6);
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
    assert_cluster(&ns, 3, true)
        .await
        .with_context(|| format!("the drains' logs:\n{}", drains.text()))?;

    scale(&ns, SET, 6).await?;
    wait_members(&ns, 6).await?;
    assert_cluster(&ns, 6, true).await?;
    let (acked, refused) = stop_writer(&ns).await?;
    let read = assert_every_acked_write_readable(&ns, acked).await?;
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

    let drains = DrainLogs::follow(&ns, [2]);
    scale(&ns, SET, 2).await?;
    wait_migrating(&ns, 2).await?;
    scale(&ns, SET, 3).await?;
    wait_stateful_pod_back(&ns, &pod_names(SET, [2]).remove(0)).await?;
    wait_members(&ns, 3).await?;
    ensure!(
        claim_uid(&ns, &claim).await? == uid,
        "claim {claim} was replaced"
    );
    assert_cluster(&ns, 3, false)
        .await
        .with_context(|| format!("the drain's log:\n{}", drains.text()))?;
    let (acked, refused) = stop_writer(&ns).await?;
    let read = assert_every_acked_write_readable(&ns, acked).await?;
    eprintln!(
        "3 → 2 → 3 mid-drain: {read} acknowledged writes all read back; {refused} refused ({acked} acknowledged)"
    );
    Ok(())
}

/// 3 → 1 with the witness writing and overwriting, and the first drain pod evicted in the
/// middle of its migration, its node cordoned (what `kubectl drain` of the node does to it): its
/// attempt fails, a new drain pod on another node finishes the half-moved slot and the rest;
/// both drained members leave, and nothing acknowledged is lost.
#[tokio::test]
async fn three_to_one_with_a_drain_pod_evicted_mid_migration_loses_nothing() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "redis-3-1").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    apply_example(&ns, 3)?;
    wait_members(&ns, 3).await?;
    start_writer(&ns).await?;

    let drains = DrainLogs::follow(&ns, 1..3);
    scale(&ns, SET, 1).await?;
    let first = wait_migrating(&ns, 2).await?;
    let first_uid = first.metadata.uid.clone().unwrap_or_default();
    let node = first
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .context("the drain pod's node")?;
    let cordoned = Cordoned::new(&node)?;
    let name = pod_names(SET, [2]).remove(0);
    let pods = ns.api::<Pod>();
    pods.evict(&name, &EvictParams::default()).await?;
    // A later drain pod of the same ordinal, on another node, finishes the job.
    wait_for(
        T,
        "a new drain pod for ordinal 2 on another node",
        || async {
            Ok(pods.get_opt(&name).await?.is_some_and(|p| {
                is_drain_pod(&p)
                    && p.metadata.uid.as_deref() != Some(first_uid.as_str())
                    && p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_deref())
                        .is_some()
            }))
        },
    )
    .await?;
    let second = pods.get(&name).await?;
    let moved_to = second.spec.and_then(|s| s.node_name).unwrap_or_default();
    ensure!(
        moved_to != node,
        "the new drain pod is on the cordoned node {node}"
    );
    drop(cordoned);
    eprintln!("3 → 1: the evicted drain pod moved from {node} to {moved_to}");
    for ordinal in [2, 1] {
        wait_drained(&ns, ordinal).await?;
    }
    assert_cluster(&ns, 1, true)
        .await
        .with_context(|| format!("the drains' logs:\n{}", drains.text()))?;
    let (acked, refused) = stop_writer(&ns).await?;
    let read = assert_every_acked_write_readable(&ns, acked).await?;
    eprintln!(
        "3 → 1, a drain pod evicted mid-migration: {read} acknowledged writes all read back; {refused} refused ({acked} acknowledged)"
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

    let drains = DrainLogs::follow(&ns, [3]);
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
    assert_cluster(&ns, 3, true)
        .await
        .with_context(|| format!("the drains' logs:\n{}", drains.text()))?;
    let (acked, refused) = stop_writer(&ns).await?;
    let read = assert_every_acked_write_readable(&ns, acked).await?;
    eprintln!(
        "4 → 3, the drain's Redis killed mid-migration: {read} acknowledged writes all read back; {refused} refused ({acked} acknowledged)"
    );
    Ok(())
}
