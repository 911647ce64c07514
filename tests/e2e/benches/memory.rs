//! The controller's memory against the number of objects that are not opted in, on the real
//! local cluster, next to the same binary's figure on an empty namespace measured in the same
//! run (issue 27 §3). Not a test: it prints figures and writes them to
//! `tests/bench/results/memory.txt`.
//!
//! 1. **Empty baseline**: a fresh controller on an empty namespace: its RSS once synced and
//!    settled, and its peak RSS (`VmHWM`).
//! 2. **Sizes**: in a namespace of its own, the load grows through `STSD_MEMORY_SIZES`
//!    (`1000,2500,5000`) StatefulSets of `STSD_MEMORY_REPLICAS` (10), of which
//!    `STSD_MEMORY_OPTED_IN` (10) opt in whatever the size: each set's Pending pods (no scheduler
//!    takes them) and Pending claims (no such StorageClass). This program makes
//!    the claims, then the sets (`OnDelete`, so the StatefulSet controller leaves the pods be),
//!    then the pods, named, labelled, owned and bound to their claims as the StatefulSet
//!    controller makes them (it finds them made); 32 requests in flight. At each size a fresh
//!    controller syncs on the namespace: RSS after sync and peak, against the empty figure.
//!    The slope (KiB per 1,000 objects not opted in, least squares over the sizes) is the
//!    figure that says whether memory grows with the cluster or with what is opted in.
//! 3. **Leader takeover at the largest size**: two replicas elect a leader; the leader is
//!    killed; once the other leads and settles, its `/metrics`: reconciles, and the sets that
//!    have metric series (goal: the opted-in sets only).
//!
//! The namespace is deleted at the end and waited for.

#[allow(dead_code)]
mod common;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use common::load::{create_all, load_claim, load_counts, load_set, make_pods};
use common::process::{Memory, memory};
use common::*;
use e2e::{ControllerProcess, TestNamespace, client};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

/// Requests in flight while the load is made.
const IN_FLIGHT: usize = 32;
/// The budget of RSS after sync (issue 42 §2): at most this ratio to the empty figure, and at
/// most this many MiB.
const STEADY_GOAL: f64 = 3.0;
const STEADY_MIB: f64 = 64.0;

/// Grows the load in `ns` from `from` sets to `to`: the claims, the sets, then their pods.
async fn grow(
    ns: &TestNamespace,
    from: usize,
    to: usize,
    replicas: i32,
    opted: usize,
) -> Result<()> {
    let names: Vec<String> = (from..to).map(|i| format!("load-{i:05}")).collect();
    let claims = names
        .iter()
        .flat_map(|s| (0..replicas).map(move |o| load_claim(s, o)))
        .collect();
    create_all(&ns.api::<PersistentVolumeClaim>(), claims, IN_FLIGHT).await?;
    let sets = (from..to)
        .zip(&names)
        .map(|(i, s)| load_set(s, replicas, i < opted))
        .collect();
    create_all(&ns.api::<StatefulSet>(), sets, IN_FLIGHT).await?;
    make_pods(ns, &names, replicas, IN_FLIGHT).await
}

/// A sum of the series of metric `name` in a `/metrics` text, and the distinct values of its
/// `statefulset` label.
fn metric(text: &str, name: &str) -> (f64, std::collections::BTreeSet<String>) {
    let mut sum = 0.0;
    let mut sets = std::collections::BTreeSet::new();
    for line in text.lines().filter(|l| l.starts_with(name)) {
        if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            sum += v;
        }
        if let Some(rest) = line.split("statefulset=\"").nth(1)
            && let Some(set) = rest.split('"').next()
        {
            sets.insert(set.to_owned());
        }
    }
    (sum, sets)
}

/// Every set that has a metric series in a `/metrics` text.
fn sets_with_series(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split("statefulset=\"").nth(1)?.split('"').next())
        .map(str::to_owned)
        .collect()
}

/// A controller synced on a namespace, and its memory then.
struct Synced {
    controller: ControllerProcess,
    mem: Memory,
    secs: f64,
}

/// Starts a controller on `ns` (with `extra` arguments), waits until it is ready and its
/// reconciles have been quiet for 5 s (at most `settle`), and reads its memory.
async fn synced(ns: &str, name: &str, extra: &[&str], settle: Duration) -> Result<Synced> {
    let started = Instant::now();
    let controller = ControllerProcess::start_named(ns, name, extra);
    let admin = controller.admin_url();
    let ready = format!("{admin}/readyz");
    e2e::wait_for(Duration::from_secs(600), "the controller synced", || {
        let ready = ready.clone();
        async move { Ok(reqwest::get(ready).await?.status().is_success()) }
    })
    .await?;
    let secs = started.elapsed().as_secs_f64();
    quiet(&admin, settle).await?;
    Ok(Synced {
        mem: memory(controller.pid())?,
        controller,
        secs,
    })
}

/// Waits until the reconciles counted at `admin` have not changed for 5 s, or `settle` passed.
async fn quiet(admin: &str, settle: Duration) -> Result<()> {
    let reconciles = || async {
        let text = reqwest::get(format!("{admin}/metrics"))
            .await?
            .text()
            .await?;
        anyhow::Ok(metric(&text, "statefulset_drain_reconciles_total").0)
    };
    let settling = Instant::now();
    let mut last = reconciles().await?;
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(5) && settling.elapsed() < settle {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = reconciles().await?;
        if now != last {
            last = now;
            quiet_since = Instant::now();
        }
    }
    Ok(())
}

/// One size's figures.
struct Size {
    sets: usize,
    not_opted: usize,
    synced: Synced,
}

/// Least-squares slope of `y` over `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let num: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let den: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    if den == 0.0 { 0.0 } else { num / den }
}

/// Empties the namespace of the load and deletes it, waiting until it is gone. The
/// namespace's own deletion would take the controllers' pace (about 20 requests/s: the claims'
/// protection finalizers alone would take most of an hour at 50,000 claims), so this program
/// deletes the pods at once, the sets (orphaning nothing left), the claims, and takes the
/// claims' finalizers off itself (no pod uses them any more).
async fn delete_and_wait(client: &Client, ns: TestNamespace) -> Result<Duration> {
    let started = Instant::now();
    let all = ListParams::default();
    let now = DeleteParams::default().grace_period(0);
    e2e::wait_for(Duration::from_secs(1800), "the load deleted", || async {
        let pods = ns.api::<Pod>();
        let sets = ns.api::<StatefulSet>();
        let claims = ns.api::<PersistentVolumeClaim>();
        // Each may time out on a large collection: what is left is deleted on the next round.
        let _ = pods.delete_collection(&now, &all).await;
        let _ = sets.delete_collection(&DeleteParams::orphan(), &all).await;
        let _ = claims.delete_collection(&now, &all).await;
        let held: Vec<String> = claims
            .list_metadata(&all)
            .await?
            .items
            .into_iter()
            .filter(|c| {
                c.metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty())
            })
            .filter_map(|c| c.metadata.name)
            .collect();
        let unhold = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        futures::stream::iter(held)
            .map(|c| {
                let (claims, unhold) = (claims.clone(), &unhold);
                async move { claims.patch(&c, &PatchParams::default(), unhold).await }
            })
            .buffer_unordered(IN_FLIGHT)
            .for_each(|_| async {})
            .await;
        let left = pods.list_metadata(&all.clone().limit(1)).await?.items.len()
            + claims
                .list_metadata(&all.clone().limit(1))
                .await?
                .items
                .len()
            + sets.list_metadata(&all.clone().limit(1)).await?.items.len();
        Ok(left == 0)
    })
    .await?;
    let name = ns.name.clone();
    drop(ns);
    let api: Api<Namespace> = Api::all(client.clone());
    e2e::wait_for(Duration::from_secs(1800), "the namespace deleted", || {
        let api = api.clone();
        let name = name.clone();
        async move { Ok(api.get_opt(&name).await?.is_none()) }
    })
    .await?;
    Ok(started.elapsed())
}

/// The holder of the Lease `name` in `ns`.
async fn holder(ns: &TestNamespace, name: &str) -> Option<String> {
    let lease = ns.api::<Lease>().get_opt(name).await.ok()??;
    lease.spec?.holder_identity
}

#[tokio::main]
async fn main() -> Result<()> {
    let sizes: Vec<usize> = std::env::var("STSD_MEMORY_SIZES")
        .unwrap_or_else(|_| "1000,2500,5000".into())
        .split(',')
        .map(|s| s.trim().parse().context("STSD_MEMORY_SIZES: numbers"))
        .collect::<Result<_>>()?;
    let replicas = env_or("STSD_MEMORY_REPLICAS", 10) as i32;
    let opted = env_or("STSD_MEMORY_OPTED_IN", 10);
    let settle = Duration::from_secs(120);
    let client = client().await;
    let run_started = Instant::now();

    eprintln!("== empty baseline");
    let empty_ns = TestNamespace::new(&client, "bench-memory-empty").await?;
    let mut empty = synced(&empty_ns.name, "empty", &[], settle).await?;
    empty.controller.kill();
    delete_and_wait(&client, empty_ns).await?;

    let ns = TestNamespace::new(&client, "bench-memory").await?;
    let mut results: Vec<Size> = Vec::new();
    let mut made = 0;
    for &size in &sizes {
        eprintln!("== load of {size} sets of {replicas} ({opted} opted in)");
        let growing = Instant::now();
        grow(&ns, made, size, replicas, opted).await?;
        made = size;
        let want = size * replicas as usize;
        e2e::wait_for(
            Duration::from_secs(600),
            "the load's pods and claims",
            || async {
                let (p, c) = load_counts(&ns).await?;
                Ok(p >= want && c >= want)
            },
        )
        .await?;
        eprintln!(
            "{size} sets, {want} pods, {want} claims made in {:.0} s",
            growing.elapsed().as_secs_f64()
        );
        let mut s = synced(&ns.name, &format!("size-{size}"), &[], settle).await?;
        s.controller.kill();
        let not_opted = (size - opted.min(size)) * (1 + 2 * replicas as usize);
        eprintln!("{size} sets: {}", s.mem);
        results.push(Size {
            sets: size,
            not_opted,
            synced: s,
        });
    }

    eprintln!("== leader takeover at {made} sets");
    let lease = "statefulset-drain-controller";
    let mut first = ControllerProcess::start_replica(&ns.name, "first");
    let first_admin = first.admin_url();
    e2e::wait_for(
        Duration::from_secs(600),
        "the first replica leads",
        || async { Ok(holder(&ns, lease).await.as_deref() == Some("first")) },
    )
    .await?;
    let second = ControllerProcess::start_replica(&ns.name, "second");
    let second_admin = second.admin_url();
    e2e::wait_for(
        Duration::from_secs(600),
        "the second replica synced",
        || {
            let ready = format!("{second_admin}/readyz");
            async move { Ok(reqwest::get(ready).await?.status().is_success()) }
        },
    )
    .await?;
    quiet(&first_admin, settle).await?;
    first.kill();
    let took_over = Instant::now();
    e2e::wait_for(
        Duration::from_secs(120),
        "the second replica leads",
        || async { Ok(holder(&ns, lease).await.as_deref() == Some("second")) },
    )
    .await?;
    let took = took_over.elapsed().as_secs_f64();
    quiet(&second_admin, settle).await?;
    let text = reqwest::get(format!("{second_admin}/metrics"))
        .await?
        .text()
        .await?;
    let (reconciles, _) = metric(&text, "statefulset_drain_reconciles_total");
    let series = sets_with_series(&text);
    let takeover_mem = memory(second.pid())?;
    drop(second);

    let base = empty.mem;
    let points: Vec<(f64, f64)> = results
        .iter()
        .map(|r| (r.not_opted as f64, r.synced.mem.rss * 1024.0))
        .collect();
    let per_1000 = slope(&points) * 1000.0;
    let mut report = vec![
        format!(
            "controller memory against objects not opted in: {} on {}; sets of {replicas} Pending pods and claims, {opted} opted in at every size, one namespace",
            utc_now(),
            host()
        ),
        format!(
            "empty namespace (baseline): synced in {:.1} s, RSS {:.1} MiB, peak {:.1} MiB",
            empty.secs, base.rss, base.hwm
        ),
        "sets | objects not opted in | synced in | RSS MiB (x empty) | peak MiB (x empty)"
            .to_owned(),
    ];
    for r in &results {
        report.push(format!(
            "{} | {} | {:.1} s | {:.1} ({:.2}x) | {:.1} ({:.2}x)",
            r.sets,
            r.not_opted,
            r.synced.secs,
            r.synced.mem.rss,
            r.synced.mem.rss / base.rss,
            r.synced.mem.hwm,
            r.synced.mem.hwm / base.hwm,
        ));
    }
    let met =
        |r: &Size| r.synced.mem.rss <= STEADY_GOAL * base.rss && r.synced.mem.rss <= STEADY_MIB;
    report.push(format!(
        "slope: {per_1000:.1} KiB of RSS per 1,000 objects not opted in (least squares over the sizes)"
    ));
    report.push(format!(
        "budget: RSS after sync <= {STEADY_GOAL}x the empty figure and <= {STEADY_MIB} MiB at every size: {}",
        if results.iter().all(met) {
            "met"
        } else {
            "NOT met"
        }
    ));
    let opted_names: std::collections::BTreeSet<String> =
        (0..opted).map(|i| format!("load-{i:05}")).collect();
    let strays: Vec<&String> = series.difference(&opted_names).collect();
    report.push(format!(
        "leader takeover at {made} sets: the standby led {took:.1} s after the leader was killed; once settled, {reconciles:.0} reconciles, metric series for {} sets ({} not opted in), RSS {:.1} MiB (peak {:.1})",
        series.len(),
        strays.len(),
        takeover_mem.rss,
        takeover_mem.hwm
    ));
    let report = report.join("\n");
    println!("{report}");
    write_result("memory.txt", &report)?;
    ensure!(
        strays.is_empty(),
        "sets not opted in got metric series after the takeover: {strays:?}"
    );

    eprintln!("== cleanup");
    let gone = delete_and_wait(&client, ns).await?;
    eprintln!(
        "namespace deleted in {:.0} s; whole run {:.0} s",
        gone.as_secs_f64(),
        run_started.elapsed().as_secs_f64()
    );
    Ok(())
}
