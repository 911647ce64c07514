//! The unavailability window of a Redis Cluster scale-down (issue 25), on the real local
//! cluster with the example (`example/redis-cluster`), next to a baseline measured in the same
//! run. Not a test: it prints figures and writes them to `tests/bench/results/redis-window.txt`.
//! Run by `tests/bench/run`.
//!
//! A cluster of 4 masters is scaled to 3 and back, `STSD_BENCH_REDIS_CYCLES` (5) times. Before
//! each scale-down this program writes a key that lives in one of member 3's slots and then
//! reads it every 10 ms through the cluster (sent to member 0, following `MOVED` and `ASK`, as
//! a cluster client does; each read on a new connection, 200 ms at most). What users feel:
//!
//! - **window**: the last successful read before the member stopped → the first successful
//!   read after (through the drain pod, which serves the member's slots while it hands them
//!   over), and its parts, each timed by this program's own pod watch: the member's shutdown
//!   (last read → its pod's Deleted event), the controller's reaction (→ the drain pod's Added
//!   event), scheduling (→ bound to the node), the container's start (→ running) and Redis's
//!   start in the drain pod (→ the first successful read);
//! - **during the handover**: reads that failed after the window, while the slots moved;
//! - **baseline, a restart**: the same window for a restart of the same member (its pod
//!   deleted, the StatefulSet starts it again on its claim), what a rolling update costs.

#[allow(dead_code)] // each bench uses a part of what they share
mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use common::{env_or, host, utc_now, write_result};
use e2e::ops::{is_drain_pod, pod_names, scale, wait_claim_gone};
use e2e::redis::{
    Reply, SET, apply_example, cluster_command, command, key_slot, member_addr, own_slots,
    wait_members,
};
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::runtime::watcher;

const T: Duration = Duration::from_secs(300);
const PROBE_EVERY: Duration = Duration::from_millis(10);
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// The member drained (scale 4 → 3) and restarted.
const ORDINAL: i32 = 3;

/// One read of the probe key: when it was sent, and whether it returned the value.
#[derive(Clone, Copy)]
struct Probe {
    at: Instant,
    ok: bool,
}

/// What this program saw of the pods named like member 3, each the first time.
#[derive(Default)]
struct Seen {
    stateful_deleted: Option<Instant>,
    drain_added: Option<Instant>,
    drain_scheduled: Option<Instant>,
    drain_running: Option<Instant>,
}

/// Writes a key that lives in one of member 3's slots (its value: the key) and returns it.
async fn key_on_member(ns: &TestNamespace, cycle: usize, entry: SocketAddr) -> Result<String> {
    let member = member_addr(ns, &pod_names(SET, [ORDINAL]).remove(0)).await?;
    let Reply::Bulk(Some(nodes)) = command(member, &[b"CLUSTER", b"NODES"], false, T).await? else {
        bail!("CLUSTER NODES of member {ORDINAL}: not a bulk reply");
    };
    let slots = own_slots(&String::from_utf8_lossy(&nodes));
    ensure!(!slots.is_empty(), "member {ORDINAL} serves no slot");
    let key = (0..)
        .map(|n| format!("window-{cycle}-{n}"))
        .find(|k| slots.iter().any(|r| r.contains(&key_slot(k.as_bytes()))))
        .expect("some key hashes to the member's slots");
    let (reply, _) = cluster_command(entry, &[b"SET", key.as_bytes(), key.as_bytes()], T).await?;
    ensure!(reply == Reply::Simple("OK".into()), "SET {key}: {reply:?}");
    Ok(key)
}

/// Reads `key` every [`PROBE_EVERY`] until `stop`; returns every read.
fn start_probe(
    entry: SocketAddr,
    key: String,
) -> (Arc<Mutex<bool>>, tokio::task::JoinHandle<Vec<Probe>>) {
    let stop = Arc::new(Mutex::new(false));
    let flag = stop.clone();
    let task = tokio::spawn(async move {
        let mut probes = Vec::new();
        while !*flag.lock().expect("flag") {
            let at = Instant::now();
            let got = cluster_command(entry, &[b"GET", key.as_bytes()], PROBE_TIMEOUT).await;
            let ok = matches!(&got, Ok((Reply::Bulk(Some(v)), _)) if v == key.as_bytes());
            probes.push(Probe { at, ok });
            tokio::time::sleep_until((at + PROBE_EVERY).into()).await;
        }
        probes
    });
    (stop, task)
}

/// Watches the pods named like member 3 and records what [`Seen`] holds.
fn start_watch(ns: &TestNamespace) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let into = seen.clone();
    let name = pod_names(SET, [ORDINAL]).remove(0);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher(ns.api::<Pod>(), config);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let now = Instant::now();
            let mut s = into.lock().expect("seen");
            match event {
                Ok(watcher::Event::Delete(p)) if !is_drain_pod(&p) => {
                    s.stateful_deleted.get_or_insert(now);
                }
                Ok(watcher::Event::Apply(p)) if is_drain_pod(&p) => {
                    s.drain_added.get_or_insert(now);
                    if p.spec.as_ref().is_some_and(|sp| sp.node_name.is_some()) {
                        s.drain_scheduled.get_or_insert(now);
                    }
                    let running = p
                        .status
                        .as_ref()
                        .and_then(|st| st.container_statuses.as_ref())
                        .is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
                        });
                    if running {
                        s.drain_running.get_or_insert(now);
                    }
                }
                _ => {}
            }
        }
    });
    (seen, task)
}

/// The outage that follows `after`: the last successful read before the first failure, and
/// the first successful read after it; then the time reads failed after that, and how many.
fn outage(probes: &[Probe], after: Instant) -> Result<(Instant, Instant, Duration, usize)> {
    let first_fail = probes
        .iter()
        .position(|p| p.at >= after && !p.ok)
        .context("no read failed")?;
    let last_ok = probes[..first_fail]
        .iter()
        .rev()
        .find(|p| p.ok)
        .context("no successful read before the outage")?;
    let back = first_fail
        + probes[first_fail..]
            .iter()
            .position(|p| p.ok)
            .context("reads never came back")?;
    let mut failed_after = Duration::ZERO;
    let mut count = 0;
    for w in probes[back..].windows(2) {
        if !w[0].ok {
            failed_after += w[1].at - w[0].at;
            count += 1;
        }
    }
    Ok((last_ok.at, probes[back].at, failed_after, count))
}

/// Median and worst, in milliseconds.
fn med_max(v: &[Duration]) -> (f64, f64) {
    let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    (ms[ms.len() / 2], *ms.last().unwrap_or(&0.0))
}

/// One scale-down of member 3, measured; then the scale-up that brings it back.
async fn drain_cycle(
    ns: &TestNamespace,
    cycle: usize,
    parts: &mut HashMap<&'static str, Vec<Duration>>,
) -> Result<()> {
    let entry = member_addr(ns, &pod_names(SET, [0]).remove(0)).await?;
    let key = key_on_member(ns, cycle, entry).await?;
    let (seen, watch) = start_watch(ns);
    let (stop, probe) = start_probe(entry, key.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let scaled = Instant::now();
    scale(ns, SET, ORDINAL).await?;
    wait_claim_gone(ns, &format!("data-{SET}-{ORDINAL}"), T).await?;
    wait_read_back(entry, &key).await?;
    *stop.lock().expect("flag") = true;
    let probes = probe.await?;
    watch.abort();
    let (last_ok, back, failed_after, count) = outage(&probes, scaled)?;
    let (deleted, added, scheduled, running) = {
        let s = seen.lock().expect("seen");
        (
            s.stateful_deleted,
            s.drain_added,
            s.drain_scheduled,
            s.drain_running,
        )
    };
    let deleted = deleted.context("no Deleted event of the member's pod")?;
    let added = added.context("no drain pod seen")?;
    let scheduled = scheduled.context("the drain pod was not seen bound")?;
    let running = running.context("the drain pod was not seen running")?;
    let mut add = |what, d: Duration| parts.entry(what).or_default().push(d);
    add("window", back - last_ok);
    add(
        "  member's shutdown (last read -> pod Deleted)",
        deleted.saturating_duration_since(last_ok),
    );
    add(
        "  controller (-> drain pod Added)",
        added.saturating_duration_since(deleted),
    );
    add(
        "  scheduling (-> bound)",
        scheduled.saturating_duration_since(added),
    );
    add(
        "  container start (-> running)",
        running.saturating_duration_since(scheduled),
    );
    add(
        "  Redis start in the drain pod (-> read ok)",
        back.saturating_duration_since(running),
    );
    add(
        "failed reads after the window, during the handover",
        failed_after,
    );
    eprintln!(
        "cycle {cycle}: window {:.0} ms, then {count} failed reads ({:.0} ms) during the handover",
        (back - last_ok).as_secs_f64() * 1000.0,
        failed_after.as_secs_f64() * 1000.0
    );
    scale(ns, SET, ORDINAL + 1).await?;
    wait_members(ns, ORDINAL + 1).await
}

/// Waits until `key` reads back through the cluster, then 500 ms more (the probe sees it too).
async fn wait_read_back(entry: SocketAddr, key: &str) -> Result<()> {
    wait_for(
        Duration::from_secs(60),
        &format!("{key} read back"),
        || async {
            let got = cluster_command(entry, &[b"GET", key.as_bytes()], PROBE_TIMEOUT).await;
            Ok(matches!(&got, Ok((Reply::Bulk(Some(v)), _)) if v == key.as_bytes()))
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

/// The baseline: member 3 restarted (its pod deleted; the StatefulSet starts it again).
async fn restart_cycle(ns: &TestNamespace, cycle: usize) -> Result<Duration> {
    let entry = member_addr(ns, &pod_names(SET, [0]).remove(0)).await?;
    let key = key_on_member(ns, 1000 + cycle, entry).await?;
    let (stop, probe) = start_probe(entry, key.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let deleted = Instant::now();
    let name = pod_names(SET, [ORDINAL]).remove(0);
    let pods = ns.api::<Pod>();
    let uid = pods.get(&name).await?.metadata.uid;
    pods.delete(&name, &DeleteParams::default()).await?;
    wait_for(T, "the member restarted", || async {
        Ok(pods
            .get_opt(&name)
            .await?
            .is_some_and(|p| p.metadata.uid != uid))
    })
    .await?;
    wait_members(ns, ORDINAL + 1).await?;
    wait_read_back(entry, &key).await?;
    *stop.lock().expect("flag") = true;
    let probes = probe.await?;
    let (last_ok, back, _, _) = outage(&probes, deleted)?;
    eprintln!(
        "restart {cycle}: window {:.0} ms",
        (back - last_ok).as_secs_f64() * 1000.0
    );
    Ok(back - last_ok)
}

#[tokio::main]
async fn main() -> Result<()> {
    let cycles = env_or("STSD_BENCH_REDIS_CYCLES", 5);
    let client = client().await;
    let ns = TestNamespace::new(&client, "bench-redis-window").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    apply_example(&ns, ORDINAL + 1)?;
    wait_members(&ns, ORDINAL + 1).await?;

    let mut parts: HashMap<&'static str, Vec<Duration>> = HashMap::new();
    let mut restarts = Vec::new();
    for cycle in 0..cycles {
        drain_cycle(&ns, cycle, &mut parts).await?;
        restarts.push(restart_cycle(&ns, cycle).await?);
    }

    let (base_med, base_max) = med_max(&restarts);
    let mut report = format!(
        "Redis Cluster scale-down: unavailability of the removed member's keys ({}, {}, {cycles} scale-downs 4 -> 3, reads every {} ms)\n",
        utc_now(),
        host(),
        PROBE_EVERY.as_millis()
    );
    let order = [
        "window",
        "  member's shutdown (last read -> pod Deleted)",
        "  controller (-> drain pod Added)",
        "  scheduling (-> bound)",
        "  container start (-> running)",
        "  Redis start in the drain pod (-> read ok)",
        "failed reads after the window, during the handover",
    ];
    for what in order {
        let (med, max) = med_max(&parts[what]);
        report += &format!("{what:<52} median {med:>7.0} ms  worst {max:>7.0} ms\n");
    }
    report += &format!(
        "{:<52} median {base_med:>7.0} ms  worst {base_max:>7.0} ms\n",
        "baseline: a restart of the same member"
    );
    let (med, max) = med_max(&parts["window"]);
    report += &format!(
        "window / restart: median {:.2}x, worst {:.2}x",
        med / base_med,
        max / base_max
    );
    println!("{report}");
    write_result("redis-window.txt", &report)
}
