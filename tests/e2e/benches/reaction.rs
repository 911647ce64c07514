//! Reaction latency of the controller on the real local cluster, next to a baseline measured in
//! the same run (issue 10). Not a test: it prints figures and writes them to
//! `tests/bench/results/reaction.txt`.
//!
//! All times come from this program's own watch of the namespace, so both sides of each
//! interval are seen the same way:
//! - **pod gone → drain pod created**: a stateful pod's Deleted event → the Added event of the
//!   drain pod of that name;
//! - **drain succeeded → claims deleted**: the drain pod's first event in phase Succeeded → the
//!   first event of its claim with a deletion timestamp;
//! - **baseline, bare watch latency**: a ConfigMap create request sent → its Added event.
//!
//! Drains: a Parallel set of `STSD_BENCH_REPLICAS` (10) scaled to 0 and back,
//! `STSD_BENCH_CYCLES` (10) times: 100 drains by default. Run by `tests/bench/run`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use drain_api::annotations::DRAINER_POD_TEMPLATE;
use e2e::objects::{SetBuilder, drain_template};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;

const T: Duration = Duration::from_secs(300);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the watches saw, by object name.
#[derive(Default)]
struct Seen {
    stateful_gone: HashMap<String, Instant>,
    drain_created: HashMap<String, Instant>,
    drain_succeeded: HashMap<String, Instant>,
    claim_deleting: HashMap<String, Instant>,
    reactions: Vec<Duration>,
    cleanups: Vec<Duration>,
}

fn is_drain(p: &Pod) -> bool {
    p.labels().contains_key(drain_api::labels::DRAIN_POD)
}

fn record_pod(seen: &mut Seen, event: watcher::Event<Pod>, at: Instant) {
    match event {
        watcher::Event::Apply(p) => {
            let name = p.name_any();
            if is_drain(&p) {
                if let Some(gone) = seen.stateful_gone.remove(&name)
                    && !seen.drain_created.contains_key(&name)
                {
                    seen.drain_created.insert(name.clone(), at);
                    seen.reactions.push(at - gone);
                }
                let succeeded =
                    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded");
                if succeeded && !seen.drain_succeeded.contains_key(&name) {
                    seen.drain_succeeded.insert(name, at);
                }
            }
        }
        watcher::Event::Delete(p) => {
            let name = p.name_any();
            if is_drain(&p) {
                seen.drain_created.remove(&name);
                seen.drain_succeeded.remove(&name);
            } else {
                seen.stateful_gone.insert(name, at);
            }
        }
        _ => {}
    }
}

fn record_claim(seen: &mut Seen, event: watcher::Event<PersistentVolumeClaim>, at: Instant) {
    let (watcher::Event::Apply(c) | watcher::Event::Delete(c)) = event else {
        return;
    };
    let name = c.name_any();
    if c.metadata.deletion_timestamp.is_none() {
        seen.claim_deleting.remove(&name);
        return;
    }
    if seen.claim_deleting.contains_key(&name) {
        return;
    }
    seen.claim_deleting.insert(name.clone(), at);
    // data-web-<o> → web-<o>
    let pod = name.trim_start_matches("data-");
    if let Some(succeeded) = seen.drain_succeeded.get(pod) {
        seen.cleanups.push(at - *succeeded);
    }
}

/// p50, p99, max in milliseconds.
fn summary(samples: &[Duration]) -> (f64, f64, f64, usize) {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99), *ms.last().unwrap_or(&0.0), ms.len())
}

fn line(what: &str, samples: &[Duration]) -> String {
    let (p50, p99, max, n) = summary(samples);
    format!("{what:<44} n={n:<4} p50 {p50:>7.1} ms  p99 {p99:>7.1} ms  max {max:>7.1} ms")
}

#[tokio::main]
async fn main() -> Result<()> {
    let replicas = env_or("STSD_BENCH_REPLICAS", 10) as i32;
    let cycles = env_or("STSD_BENCH_CYCLES", 10);
    let client = client().await;
    let ns = TestNamespace::new(&client, "bench-reaction").await?;
    let seen = Arc::new(Mutex::new(Seen::default()));

    let pods = watcher(ns.api::<Pod>(), watcher::Config::default());
    let s = Arc::clone(&seen);
    let pod_watch = tokio::spawn(async move {
        let mut pods = std::pin::pin!(pods);
        while let Some(Ok(e)) = pods.next().await {
            let at = Instant::now();
            record_pod(&mut s.lock().expect("lock"), e, at);
        }
    });
    let claims = watcher(
        ns.api::<PersistentVolumeClaim>(),
        watcher::Config::default(),
    );
    let s = Arc::clone(&seen);
    let claim_watch = tokio::spawn(async move {
        let mut claims = std::pin::pin!(claims);
        while let Some(Ok(e)) = claims.next().await {
            let at = Instant::now();
            record_claim(&mut s.lock().expect("lock"), e, at);
        }
    });
    let maps = watcher(ns.api::<ConfigMap>(), watcher::Config::default());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let map_watch = tokio::spawn(async move {
        let mut maps = std::pin::pin!(maps);
        while let Some(Ok(e)) = maps.next().await {
            if let watcher::Event::Apply(m) = e {
                let _ = tx.send((m.name_any(), Instant::now()));
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Baseline: the same cluster's bare watch latency, interleaved with nothing else.
    let cms: Api<ConfigMap> = ns.api();
    let mut baseline = Vec::new();
    for i in 0..100 {
        let name = format!("probe-{i}");
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let sent = Instant::now();
        cms.create(&PostParams::default(), &cm).await?;
        loop {
            let (got, at) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .context("watch event of a ConfigMap")?
                .context("watch ended")?;
            if got == name {
                baseline.push(at - sent);
                break;
            }
        }
    }

    let controller = ControllerProcess::start_named(&ns.name, "bench", &[]);
    let set = SetBuilder::new("web")
        .replicas(replicas)
        .parallel()
        .annotation(
            DRAINER_POD_TEMPLATE,
            drain_template("true", &["data"], json!({"restartPolicy": "Never"})),
        );
    start_set(&ns, &set).await?;
    let started = Instant::now();
    for cycle in 0..cycles {
        wait_running(&ns, &pod_names("web", 0..replicas)).await?;
        scale(&ns, "web", 0).await?;
        let claims: Api<PersistentVolumeClaim> = ns.api();
        wait_for(T, "every claim drained and deleted", || async {
            Ok(claims.list(&Default::default()).await?.items.is_empty()
                && drain_pods(&ns).await?.is_empty())
        })
        .await?;
        eprintln!("cycle {}/{cycles} done", cycle + 1);
        if cycle + 1 < cycles {
            scale(&ns, "web", replicas).await?;
        }
    }
    let wall = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(controller);
    pod_watch.abort();
    claim_watch.abort();
    map_watch.abort();

    let seen = seen.lock().expect("lock");
    let expected = replicas as usize * cycles;
    ensure!(
        seen.reactions.len() == expected,
        "saw {} reactions for {expected} drains",
        seen.reactions.len()
    );
    let (base_p50, ..) = summary(&baseline);
    let (react_p50, react_p99, ..) = summary(&seen.reactions);
    let report = [
        format!(
            "reaction latency, {expected} drains ({cycles} x a Parallel set of {replicas} scaled to 0), {} on {}",
            utc_now(),
            host()
        ),
        line("baseline: ConfigMap created -> watch event", &baseline),
        line("stateful pod gone -> drain pod created", &seen.reactions),
        line("drain pod Succeeded -> claim deleted", &seen.cleanups),
        format!(
            "median reaction / median baseline: {:.2} (goal <= 1.5); p99 reaction {:.1} ms (goal <= 30)",
            react_p50 / base_p50,
            react_p99
        ),
        format!("wall time of the drain cycles: {:.1} s", wall.as_secs_f64()),
    ]
    .join("\n");
    println!("{report}");
    let out = e2e::repo_root().join("tests/bench/results/reaction.txt");
    std::fs::create_dir_all(out.parent().expect("dir"))?;
    std::fs::write(&out, format!("{report}\n"))?;
    eprintln!("written to {}", out.display());
    Ok(())
}

fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%MZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn host() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpus} cores")
}
