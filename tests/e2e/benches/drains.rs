//! Drains in bulk on the real local cluster (issue 10), each figure next to a baseline measured
//! in the same run. Not a test: it prints figures and writes them to
//! `tests/bench/results/drains.txt`. Run by `tests/bench/run`.
//!
//! - **20 drains of a Parallel set vs one drain**: wall time from `kubectl scale --replicas 0`
//!   to the last claim deleted, for a Parallel set of 20 and of 1 (each drain pod sleeps 2 s);
//!   medians of `STSD_BENCH_ROUNDS` (3) rounds. Goal: 20 drains ≤ 2× one drain. Baseline: the
//!   node alone starting 20 pods at once vs one (a set not opted in scaled from 0): a drain
//!   runs in a pod, so the node's ratio bounds the drains' ratio from below.
//! - **API requests per drain**: the controller's own requests (its `kube_requests_total`) per
//!   drain, and the API server's `apiserver_request_total` during the 20-drain rounds minus the
//!   same rounds of a set that is not opted in (the StatefulSet controller and kubelet alone),
//!   per drain. Goal: 1 pod create, 1 delete per claim, 1 pod delete, Events and status writes.
//! - **the example datastore, 10,000 records**: the drain of a pod holding 10,000 records (scale
//!   3 → 2 → claim deleted) next to writing the same records to it from this program (16 at a
//!   time, the drainer's default concurrency is 8).

#[allow(dead_code)] // each bench uses a part of what they share
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use common::{host, utc_now, write_result};
use drain_api::annotations::DRAINER_POD_TEMPLATE;
use drain_api::names::claim_name;
use e2e::faults::{DATASTORE, apply_example, write_records};
use e2e::objects::{SetBuilder, drain_template};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client, kubectl, wait_for};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::ListParams;
use serde_json::json;

const T: Duration = Duration::from_secs(600);

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Counters by `verb resource[/subresource]`, from Prometheus text: the lines of `metric`
/// whose labels pass `keep`.
fn counters(
    text: &str,
    metric: &str,
    keep: impl Fn(&BTreeMap<&str, &str>) -> Option<String>,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        let Some((labels, value)) = rest.strip_prefix('{').and_then(|r| r.rsplit_once("} ")) else {
            continue;
        };
        let labels: BTreeMap<&str, &str> = labels
            .split("\",")
            .filter_map(|kv| {
                let (k, v) = kv.split_once("=\"")?;
                Some((k.trim(), v.trim_end_matches('"')))
            })
            .collect();
        if let (Some(key), Ok(v)) = (keep(&labels), value.trim().parse::<f64>()) {
            *out.entry(key).or_default() += v;
        }
    }
    out
}

/// The API server's requests that a drain may cause, by verb and resource.
fn apiserver_requests() -> Result<BTreeMap<String, f64>> {
    let out = kubectl().args(["get", "--raw", "/metrics"]).output()?;
    ensure!(out.status.success(), "kubectl get --raw /metrics failed");
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(counters(&text, "apiserver_request_total", |l| {
        let resource = *l.get("resource")?;
        let verb = *l.get("verb")?;
        let wanted = ["pods", "persistentvolumeclaims", "statefulsets", "events"];
        if !wanted.contains(&resource) || matches!(verb, "WATCH" | "LIST") {
            return None;
        }
        Some(match l.get("subresource").filter(|s| !s.is_empty()) {
            Some(sub) => format!("{verb} {resource}/{sub}"),
            None => format!("{verb} {resource}"),
        })
    }))
}

/// The controller's own requests, by verb and resource.
async fn controller_requests(admin: &str) -> Result<BTreeMap<String, f64>> {
    let text = reqwest::get(format!("{admin}/metrics"))
        .await?
        .text()
        .await?;
    Ok(counters(
        &text,
        "statefulset_drain_kube_requests_total",
        |l| Some(format!("{} {}", l.get("verb")?, l.get("resource")?)),
    ))
}

fn delta(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v != 0.0)
        .collect()
}

/// Rounds of: scale the running set to 0, wait until its claims are gone; the wall times.
async fn rounds(ns: &TestNamespace, set: &str, replicas: i32, n: usize) -> Result<Vec<Duration>> {
    let claims: kube::Api<PersistentVolumeClaim> = ns.api();
    let lp = ListParams::default();
    let prefix = format!("data-{set}-");
    let mut times = Vec::new();
    for round in 0..n {
        wait_running(ns, &pod_names(set, 0..replicas)).await?;
        let start = Instant::now();
        scale(ns, set, 0).await?;
        wait_for(T, &format!("the claims of {set} drained"), || async {
            let left = claims
                .list(&lp)
                .await?
                .items
                .iter()
                .filter(|c| {
                    c.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(&prefix))
                })
                .count();
            Ok(left == 0)
        })
        .await?;
        times.push(start.elapsed());
        eprintln!(
            "{set}: round {}/{n}: {:.1} s",
            round + 1,
            start.elapsed().as_secs_f64()
        );
        if round + 1 < n {
            scale(ns, set, replicas).await?;
        }
    }
    Ok(times)
}

/// The same rounds for a set that is not opted in: scale to 0, wait until its pods are gone
/// (and back up between rounds, as [`rounds`] does).
async fn plain_rounds(ns: &TestNamespace, set: &str, replicas: i32, n: usize) -> Result<()> {
    for round in 0..n {
        wait_running(ns, &pod_names(set, 0..replicas)).await?;
        scale(ns, set, 0).await?;
        for name in pod_names(set, 0..replicas) {
            wait_pod_gone(ns, &name, T).await?;
        }
        if round + 1 < n {
            scale(ns, set, replicas).await?;
        }
    }
    Ok(())
}

/// The node's share of a drain: rounds of starting a set that is not opted in from 0 to
/// `replicas` Running pods; the wall times.
async fn start_rounds(
    ns: &TestNamespace,
    set: &str,
    replicas: i32,
    n: usize,
) -> Result<Vec<Duration>> {
    let mut times = Vec::new();
    for _ in 0..n {
        for name in pod_names(set, 0..replicas) {
            wait_pod_gone(ns, &name, T).await?;
        }
        let start = Instant::now();
        scale(ns, set, replicas).await?;
        wait_running(ns, &pod_names(set, 0..replicas)).await?;
        times.push(start.elapsed());
        scale(ns, set, 0).await?;
    }
    Ok(times)
}

fn table(title: &str, per_drain: &BTreeMap<String, f64>) -> String {
    let mut s = format!("{title}\n");
    for (k, v) in per_drain {
        s.push_str(&format!("  {k:<46} {v:>6.2}\n"));
    }
    let total: f64 = per_drain.values().sum();
    s.push_str(&format!("  {:<46} {total:>6.2}", "total"));
    s
}

#[tokio::main]
async fn main() -> Result<()> {
    let rounds_n = common::env_or("STSD_BENCH_ROUNDS", 3);
    let client = client().await;
    let ns = TestNamespace::new(&client, "bench-drains").await?;
    let controller = ControllerProcess::start(&ns.name, &[]);
    let admin = controller.admin_url();
    let drain = |name: &str, n: i32| {
        SetBuilder::new(name).replicas(n).parallel().annotation(
            DRAINER_POD_TEMPLATE,
            drain_template("sleep 2", &["data"], json!({})),
        )
    };
    start_set(&ns, &drain("one", 1)).await?;
    start_set(&ns, &drain("twenty", 20)).await?;
    start_set(&ns, &SetBuilder::new("plain").replicas(20).parallel()).await?;
    start_set(&ns, &SetBuilder::new("single").replicas(0).parallel()).await?;

    // 1. One drain, then twenty at once.
    let one = median(rounds(&ns, "one", 1, rounds_n).await?);
    let ctl_before = controller_requests(&admin).await?;
    let api_before = apiserver_requests()?;
    let twenty = median(rounds(&ns, "twenty", 20, rounds_n).await?);
    let api_drains = delta(&apiserver_requests()?, &api_before);
    let ctl = delta(&controller_requests(&admin).await?, &ctl_before);
    scale(&ns, "one", 0).await?;
    scale(&ns, "twenty", 0).await?;

    // 2. The same rounds of a set that is not opted in: what the cluster does without drains.
    let api_before = apiserver_requests()?;
    plain_rounds(&ns, "plain", 20, rounds_n).await?;
    let api_plain = delta(&apiserver_requests()?, &api_before);

    // 3. The node alone: starting 20 pods at once against starting one.
    let start_twenty = median(start_rounds(&ns, "plain", 20, rounds_n).await?);
    let start_one = median(start_rounds(&ns, "single", 1, rounds_n).await?);
    let drains = (20 * rounds_n) as f64;
    let per = |m: &BTreeMap<String, f64>| -> BTreeMap<String, f64> {
        m.iter().map(|(k, v)| (k.clone(), v / drains)).collect()
    };
    let attributable: BTreeMap<String, f64> = api_drains
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                (v - api_plain.get(k).copied().unwrap_or(0.0)) / drains,
            )
        })
        .filter(|(_, v)| v.abs() >= 0.05)
        .collect();

    // 4. The example datastore: 10,000 records drained off one pod.
    let records = common::env_or("STSD_BENCH_RECORDS", 10_000);
    let ds = TestNamespace::new(&client, "bench-datastore").await?;
    let ds_controller = ControllerProcess::start(&ds.name, &[]);
    apply_example(&ds, &[])?;
    wait_running(&ds, &pod_names(DATASTORE, 0..3)).await?;
    let start = Instant::now();
    write_records(&ds, records, |_| 2).await?;
    let write_time = start.elapsed();
    let start = Instant::now();
    scale(&ds, DATASTORE, 2).await?;
    wait_claim_gone(&ds, &claim_name("data", DATASTORE, 2), T).await?;
    let drain_time = start.elapsed();
    drop(ds_controller);

    let mut report = format!(
        "drains in bulk, {} rounds each, {} on {}\n\
         one drain (Parallel set of 1 -> 0, drain pod sleeps 2 s)   median {:>6.1} s\n\
         20 drains (Parallel set of 20 -> 0, each sleeps 2 s)       median {:>6.1} s\n\
         20 drains / one drain: {:.2} (goal <= 2)\n\
         baseline, the node alone (a set not opted in, 0 -> Running, no controller involved):\n\
         one pod started                                            median {:>6.1} s\n\
         20 pods started at once                                    median {:>6.1} s\n\
         20 pods / one pod: {:.2}\n\n",
        rounds_n,
        utc_now(),
        host(),
        one.as_secs_f64(),
        twenty.as_secs_f64(),
        twenty.as_secs_f64() / one.as_secs_f64(),
        start_one.as_secs_f64(),
        start_twenty.as_secs_f64(),
        start_twenty.as_secs_f64() / start_one.as_secs_f64(),
    );
    report.push_str(&table(
        "the controller's own API requests per drain (its kube_requests_total)",
        &per(&ctl),
    ));
    report.push_str("\n\n");
    report.push_str(&table(
        "API server requests per drain caused by drains (apiserver_request_total during the \
         20-drain rounds minus the same rounds of a set not opted in; pods, claims, sets, Events)",
        &attributable,
    ));
    report.push_str(&format!(
        "\n\nthe example datastore, {records} records on one pod\n\
         writing them to the pod from this program (16 at a time)  {:>6.1} s ({:.0} records/s)\n\
         draining them (scale 3 -> 2 until the claim is deleted)    {:>6.1} s ({:.0} records/s)\n",
        write_time.as_secs_f64(),
        records as f64 / write_time.as_secs_f64(),
        drain_time.as_secs_f64(),
        records as f64 / drain_time.as_secs_f64(),
    ));
    println!("{report}");
    write_result("drains.txt", &report).context("write the results")?;
    drop(controller);
    Ok(())
}
