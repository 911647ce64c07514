//! The controller at scale on the real local cluster, next to baselines measured in the same run
//! (issue 10). Not a test: it prints figures and writes them to `tests/bench/results/scale.txt`.
//!
//! 1. **Empty baseline**: the controller binary started on an empty namespace; its memory after
//!    sync and its CPU, reconciles, API requests and LIST requests over an idle minute.
//! 2. **Load**: in a namespace of its own, `STSD_SCALE_SETS` (5,000) Parallel StatefulSets of
//!    `STSD_SCALE_REPLICAS` (10), `STSD_SCALE_OPTED_IN` (10) of them opted in, whose pods no
//!    scheduler takes and whose claims name a StorageClass that does not exist: about 50,000 Pending
//!    pods and 50,000 Pending claims. This program makes the claims, then the sets (`OnDelete`),
//!    then the pods, as the StatefulSet controller makes them (it finds them made; its own
//!    client is throttled to about 20 requests/s); 16 requests in flight. The same figures as
//!    the baseline, once the controller has synced them; idle window `STSD_SCALE_IDLE_SECS`
//!    (60). Memory by kind of object: a fresh controller synced on the claims alone, then on
//!    the claims and the sets.
//! 3. **Reaction under load**: one more opted-in Parallel set of 10 with real storage and
//!    runnable pods, scaled to 0 and back `STSD_SCALE_CYCLES` (5) times: stateful pod gone →
//!    drain pod created, from this program's own watch (see `common`), next to the bare watch
//!    latency (ConfigMap created → watch event) measured while the load is present.
//!
//! Memory is `VmRSS`/`VmHWM` of `/proc/<pid>/status`, CPU `utime + stime` of `/proc/<pid>/stat`,
//! reconciles and API requests the controller's own `/metrics`. Its LIST requests are counted two
//! ways: from its log (`kube_client` request spans at debug level, one line per HTTP request it
//! sends, watches included) and from the apiserver's `apiserver_request_total{verb="LIST"}` for
//! pods, claims and StatefulSets (every client; this program lists nothing while it measures).
//! Every controller runs with the same log filter. The namespaces are deleted at the end and
//! waited for (`STSD_SCALE_HOLD_SECS`: keep the load that long first, to profile by hand). Run by
//! `tests/bench/run`.

#[allow(dead_code)]
mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use common::load::{create_all, load_claim, load_counts, load_set, make_pods};
use common::process::{Memory, memory};
use common::*;
use drain_api::annotations::DRAINER_POD_TEMPLATE;
use e2e::objects::{SetBuilder, drain_template};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use kube::api::ListParams;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::json;

/// Requests in flight while the load is created.
const IN_FLIGHT: usize = 16;
/// The controllers' log filter: the usual one, plus one line per HTTP request they send.
const LOG_FILTER: &str = "info,kube=warn,kube_client::client::builder=debug";
/// The budget of RSS after sync (issue 42 §2): at most this, and this ratio to the empty figure.
const RSS_BUDGET_MIB: f64 = 64.0;
const RSS_BUDGET_RATIO: f64 = 3.0;

/// The controller process's pid: the child of this program running the controller binary.
fn controller_pid() -> Result<u32> {
    let bin = e2e::release_dir()
        .join("statefulset-drain-controller")
        .canonicalize()?;
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(pid) = entry?.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let child_of_me = fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(me);
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        if child_of_me && fields.first() != Some(&"Z") && exe.as_deref() == Some(bin.as_path()) {
            return Ok(pid);
        }
    }
    bail!("no controller process among the children of {me}")
}

/// The clock ticks per second of `/proc/<pid>/stat`.
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// CPU seconds (user + system) a process used so far.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("a stat line")?
        .1
        .split_whitespace()
        .collect();
    // Fields 14 and 15 of stat(5); `fields` starts at field 3.
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / clock_ticks())
}

/// The sum of the samples of a metric family in a Prometheus text (every label set), keeping
/// only the lines whose labels contain every one of `labels`.
fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The controller's reconciles and API requests so far, from its `/metrics`.
async fn controller_counts(admin: &str) -> Result<(f64, f64)> {
    let text = reqwest::get(format!("{admin}/metrics"))
        .await?
        .error_for_status()?
        .text()
        .await?;
    Ok((
        metric_sum(&text, "statefulset_drain_reconciles_total", &[]),
        metric_sum(&text, "statefulset_drain_kube_requests_total", &[]),
    ))
}

/// LIST requests the apiserver served so far for pods, claims and StatefulSets: within a
/// namespace, and in all.
fn apiserver_lists() -> Result<(f64, f64)> {
    let out = e2e::kubectl().args(["get", "--raw", "/metrics"]).output()?;
    ensure!(
        out.status.success(),
        "kubectl get --raw /metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let (mut namespaced, mut all) = (0.0, 0.0);
    for resource in ["pods", "persistentvolumeclaims", "statefulsets"] {
        let r = format!("resource=\"{resource}\"");
        let labels = [r.as_str(), "verb=\"LIST\"", "subresource=\"\""];
        all += metric_sum(&text, "apiserver_request_total", &labels);
        let mut with_scope = labels.to_vec();
        with_scope.push("scope=\"namespace\"");
        namespaced += metric_sum(&text, "apiserver_request_total", &with_scope);
    }
    Ok((namespaced, all))
}

/// The HTTP requests in a slice of a controller's log (one `requesting` line each): LISTs of
/// pods, claims or StatefulSets, and watch requests.
#[derive(Debug, Default)]
struct LoggedRequests {
    lists: usize,
    watches: usize,
    other: usize,
}

fn logged_requests(log: &str) -> LoggedRequests {
    let mut n = LoggedRequests::default();
    for l in log.lines().filter(|l| l.ends_with("requesting")) {
        let Some(url) = l
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http.url="))
        else {
            continue;
        };
        let url = url.trim_end_matches(['}', ':']);
        let (path, query) = url.split_once('?').unwrap_or((url, ""));
        let collection = ["/pods", "/persistentvolumeclaims", "/statefulsets"]
            .iter()
            .any(|c| path.ends_with(c));
        let get = l.contains("http.method=GET");
        if get && collection && query.split('&').any(|q| q == "watch=true") {
            n.watches += 1;
        } else if get && collection {
            n.lists += 1;
        } else {
            n.other += 1;
        }
    }
    n
}

fn log_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn log_since(path: &Path, from: u64) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    String::from_utf8_lossy(&text[(from as usize).min(text.len())..]).into_owned()
}

/// A controller started on a namespace, its caches synced and its first reconciles done.
struct Synced {
    controller: ControllerProcess,
    pid: u32,
    admin: String,
    /// Start → `/readyz`.
    secs: f64,
    /// CPU seconds used by then.
    cpu: f64,
    /// Its LIST requests by then (its log).
    lists: usize,
    /// Its memory then.
    mem: Memory,
}

impl Synced {
    fn line(&self, what: &str) -> String {
        format!(
            "{what}: synced in {:.1} s using {:.2} CPU s ({} LIST requests of its own); after sync {}",
            self.secs, self.cpu, self.lists, self.mem
        )
    }
}

/// Starts a controller on `ns` and waits until its caches synced and its reconciles settled (none
/// for 5 s, or `settle` passed).
async fn start_synced(ns: &str, settle: Duration) -> Result<Synced> {
    let started = Instant::now();
    let controller = ControllerProcess::start_with_log(ns, &[], LOG_FILTER);
    let pid = controller_pid()?;
    let admin = controller.admin_url();
    let ready = format!("{admin}/readyz");
    e2e::wait_for(
        Duration::from_secs(600),
        "the controller's caches synced",
        || {
            let ready = ready.clone();
            async move { Ok(reqwest::get(ready).await?.status().is_success()) }
        },
    )
    .await?;
    let secs = started.elapsed().as_secs_f64();
    let settling = Instant::now();
    let mut last = controller_counts(&admin).await?;
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(5) && settling.elapsed() < settle {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = controller_counts(&admin).await?;
        if now != last {
            last = now;
            quiet_since = Instant::now();
        }
    }
    Ok(Synced {
        cpu: cpu_seconds(pid)?,
        mem: memory(pid)?,
        lists: logged_requests(&log_since(&controller.log, 0)).lists,
        controller,
        pid,
        admin,
        secs,
    })
}

/// What an idle window measured.
struct Idle {
    secs: f64,
    cpu_per_min: f64,
    reconciles_per_min: f64,
    requests_per_min: f64,
    own_lists: usize,
    own_watches: usize,
    apiserver_lists_ns: f64,
    apiserver_lists_all: f64,
}

impl Idle {
    fn line(&self, what: &str) -> String {
        format!(
            "{what}: idle {:.0} s: CPU {:.3} s/min, {:.1} reconciles/min, {:.1} API requests/min, LIST requests {} of its own ({} watch requests); apiserver LISTs of pods/claims/sets {} namespaced, {} in all",
            self.secs,
            self.cpu_per_min,
            self.reconciles_per_min,
            self.requests_per_min,
            self.own_lists,
            self.own_watches,
            self.apiserver_lists_ns,
            self.apiserver_lists_all,
        )
    }
}

/// Measures a synced controller over an idle window of `idle`.
async fn idle_window(c: &Synced, idle: Duration) -> Result<Idle> {
    eprintln!(
        "idle window of {} s (controller pid {})",
        idle.as_secs(),
        c.pid
    );
    let log_at_start = log_len(&c.controller.log);
    let (reconciles0, requests0) = controller_counts(&c.admin).await?;
    let (ns_lists0, all_lists0) = apiserver_lists()?;
    let cpu0 = cpu_seconds(c.pid)?;
    let window = Instant::now();
    tokio::time::sleep(idle).await;
    let cpu1 = cpu_seconds(c.pid)?;
    let secs = window.elapsed().as_secs_f64();
    let (ns_lists1, all_lists1) = apiserver_lists()?;
    let (reconciles1, requests1) = controller_counts(&c.admin).await?;
    let per_min = |d: f64| d * 60.0 / secs;
    let in_window = logged_requests(&log_since(&c.controller.log, log_at_start));
    Ok(Idle {
        secs,
        cpu_per_min: per_min(cpu1 - cpu0),
        reconciles_per_min: per_min(reconciles1 - reconciles0),
        requests_per_min: per_min(requests1 - requests0),
        own_lists: in_window.lists,
        own_watches: in_window.watches,
        apiserver_lists_ns: ns_lists1 - ns_lists0,
        apiserver_lists_all: all_lists1 - all_lists0,
    })
}

/// The memory of a fresh controller synced on `ns` (stopped again): 3 s after its sync, as the
/// StatefulSet controller may still be making pods.
async fn probe(ns: &str) -> Result<Memory> {
    let c = start_synced(ns, Duration::from_secs(3)).await?;
    Ok(c.mem)
}

/// Counts the changes of the StatefulSets in `ns` (metadata watch) after its initial list.
fn count_set_changes(ns: &TestNamespace) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    let sets = watcher(
        ns.api::<PartialObjectMeta<StatefulSet>>(),
        watcher::Config::default(),
    );
    let task = tokio::spawn(async move {
        let mut sets = std::pin::pin!(sets);
        while let Some(Ok(e)) = sets.next().await {
            if let watcher::Event::Apply(_) | watcher::Event::Delete(_) = e {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    (count, task)
}

/// The controller binary's size and modification time: a rebuild during the run would mix two
/// builds in the figures.
fn binary_stamp() -> String {
    let bin = e2e::release_dir().join("statefulset-drain-controller");
    std::fs::metadata(&bin)
        .and_then(|m| {
            let at = m.modified()?.duration_since(std::time::UNIX_EPOCH);
            Ok(format!(
                "{} bytes, mtime {}",
                m.len(),
                at.map_or(0, |d| d.as_secs())
            ))
        })
        .unwrap_or_default()
}

/// Deletes the namespace (by dropping it) and waits until it is gone.
async fn delete_and_wait(client: &Client, ns: TestNamespace) -> Result<Duration> {
    let name = ns.name.clone();
    let started = Instant::now();
    drop(ns);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut said = Instant::now();
    loop {
        if namespaces.get_opt(&name).await?.is_none() {
            return Ok(started.elapsed());
        }
        ensure!(
            started.elapsed() < Duration::from_secs(3600),
            "namespace {name} still there after an hour"
        );
        if said.elapsed() > Duration::from_secs(60) {
            eprintln!(
                "waiting for namespace {name} to go ({:.0} s)",
                started.elapsed().as_secs_f64()
            );
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn mib(v: f64) -> String {
    format!("{v:.1} MiB")
}

#[tokio::main]
async fn main() -> Result<()> {
    let sets = env_or("STSD_SCALE_SETS", 5000);
    let replicas = env_or("STSD_SCALE_REPLICAS", 10) as i32;
    let opted = env_or("STSD_SCALE_OPTED_IN", 10).min(sets);
    let idle = Duration::from_secs(env_or("STSD_SCALE_IDLE_SECS", 60) as u64);
    let cycles = env_or("STSD_SCALE_CYCLES", 5);
    let hold = Duration::from_secs(env_or("STSD_SCALE_HOLD_SECS", 0) as u64);
    let web_replicas = 10;
    let client = client().await;
    let run_started = Instant::now();
    let stamp = binary_stamp();

    // 1. The same binary on an empty namespace.
    eprintln!("== empty baseline");
    let empty_ns = TestNamespace::new(&client, "bench-scale-empty").await?;
    let mut empty = start_synced(&empty_ns.name, T).await?;
    let empty_idle = idle_window(&empty, idle).await?;
    empty.controller.kill();
    delete_and_wait(&client, empty_ns).await?;

    // 2. The load.
    eprintln!("== load: {sets} sets of {replicas}, {opted} opted in");
    let ns = TestNamespace::new(&client, "bench-scale").await?;
    let created = Instant::now();
    // The claims first, named and labelled as the StatefulSet controller names and labels them
    // (it uses a claim it finds): its client is throttled (about 20 requests/s, its Events
    // included), so 10,000 claims would double the time it takes to make the load.
    let names: Vec<String> = (0..sets).map(|i| format!("load-{i:05}")).collect();
    let claims = names
        .iter()
        .flat_map(|s| (0..replicas).map(move |o| load_claim(s, o)))
        .collect();
    create_all(&ns.api::<PersistentVolumeClaim>(), claims, IN_FLIGHT)
        .await
        .context("create the load's claims")?;
    let claims_secs = created.elapsed().as_secs_f64();
    let want = sets * replicas as usize;
    eprintln!("{want} claims created in {claims_secs:.1} s");
    // Memory by kind of object: a fresh controller on the claims alone.
    let mem_claims = probe(&ns.name).await?;
    let sets_started = Instant::now();
    let every = (sets / opted.max(1)).max(1);
    let load_sets = names
        .iter()
        .enumerate()
        .map(|(i, s)| load_set(s, replicas, i % every == 0 && i / every < opted))
        .collect();
    create_all(&ns.api::<StatefulSet>(), load_sets, IN_FLIGHT)
        .await
        .context("create the load's StatefulSets")?;
    let sets_secs = sets_started.elapsed().as_secs_f64();
    eprintln!("{sets} sets created in {sets_secs:.1} s");
    // ... and on the claims and the sets (and the few pods made by then).
    let (pods_then, _) = load_counts(&ns).await?;
    let mem_sets = probe(&ns.name).await?;
    let pods_started = Instant::now();
    make_pods(&ns, &names, replicas, IN_FLIGHT)
        .await
        .context("create the load's pods")?;
    let pods_secs = pods_started.elapsed().as_secs_f64();
    let mut said = Instant::now();
    loop {
        let (pods, claims) = load_counts(&ns).await?;
        if pods >= want && claims >= want {
            break;
        }
        ensure!(
            created.elapsed()
                < Duration::from_secs(env_or("STSD_SCALE_CREATE_MINUTES", 90) as u64 * 60),
            "{pods} pods and {claims} claims of {want} exist after {:.0} s",
            created.elapsed().as_secs_f64()
        );
        if said.elapsed() > Duration::from_secs(30) {
            eprintln!(
                "{pods}/{want} pods, {claims}/{want} claims after {:.0} s",
                created.elapsed().as_secs_f64()
            );
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let load_secs = created.elapsed().as_secs_f64();
    eprintln!("{want} pods and claims exist after {load_secs:.0} s");
    // This program's watches of the namespace (for the reaction part); then wait for the load
    // to settle before the controller starts: the StatefulSet controller, its client throttled
    // to 20 requests/s, writes a revision and a status for every set, and a set created after
    // the load waits its turn behind them.
    let mut watches = Watches::start(&ns).await?;
    let (set_changes, set_watch) = count_set_changes(&ns);
    let settle = Instant::now();
    let settle_cap = Duration::from_secs(env_or("STSD_SCALE_SETTLE_MINUTES", 30) as u64 * 60);
    let settled = loop {
        let before = watches.seen.lock().expect("lock").events;
        let sets_before = set_changes.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let changes = watches.seen.lock().expect("lock").events - before;
        let set_writes = set_changes.load(Ordering::Relaxed) - sets_before;
        eprintln!("{changes} pod and claim changes, {set_writes} StatefulSet changes in 10 s");
        if changes <= 10 && set_writes <= 10 {
            break true;
        }
        if settle.elapsed() > settle_cap {
            break false;
        }
    };
    let settle_secs = settle.elapsed().as_secs_f64();
    let (pods, claims) = load_counts(&ns).await?;

    eprintln!("== controller on the load");
    let events_before = watches.seen.lock().expect("lock").events;
    let lists_before = watches.seen.lock().expect("lock").lists;
    let mut loaded = start_synced(&ns.name, T).await?;
    let sets_before = set_changes.load(Ordering::Relaxed);
    let loaded_idle = idle_window(&loaded, idle).await?;
    let sets_during = set_changes.load(Ordering::Relaxed) - sets_before;
    let events_during = watches.seen.lock().expect("lock").events - events_before;
    let bench_relists = watches.seen.lock().expect("lock").lists - lists_before;
    set_watch.abort();

    // 3. Reaction under load.
    eprintln!("== reaction under load");
    let baseline = watches.baseline(&ns, 100).await?;
    let set = SetBuilder::new("web")
        .replicas(web_replicas)
        .parallel()
        .annotation(
            DRAINER_POD_TEMPLATE,
            drain_template("true", &["data"], json!({"restartPolicy": "Never"})),
        );
    start_set(&ns, &set).await?;
    let (
        wall,
        During {
            configmaps: during, ..
        },
    ) = watches
        .baseline_during(
            &ns,
            drain_cycles(
                &ns,
                "web",
                web_replicas,
                cycles,
                &ListParams::default().labels("app=web"),
            ),
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mem_end = memory(loaded.pid)?;
    loaded.controller.kill();
    watches.stop();
    let (reactions, cleanups) = {
        let seen = watches.seen.lock().expect("lock");
        (seen.reactions.clone(), seen.cleanups.clone())
    };
    drop(watches);
    let expected = web_replicas as usize * cycles;
    ensure!(
        reactions.len() == expected,
        "saw {} reactions for {expected} drains",
        reactions.len()
    );

    let (base_p50, ..) = summary(&baseline);
    let (react_p50, react_p99, react_max, _) = summary(&reactions);
    let no_lists = loaded_idle.own_lists == 0 && loaded_idle.apiserver_lists_ns == 0.0;
    // RSS growth per object, KiB: claims alone, then sets (less the pods made by then), then pods.
    let kib = |mib: f64, n: usize| mib * 1024.0 / n.max(1) as f64;
    let per_claim = kib(mem_claims.rss - empty.mem.rss, claims);
    let per_pod = kib(
        loaded.mem.rss - mem_sets.rss,
        pods.saturating_sub(pods_then),
    );
    let per_set = kib(
        mem_sets.rss - mem_claims.rss - per_pod * pods_then as f64 / 1024.0,
        sets,
    );
    let rebuilt = binary_stamp() != stamp;
    let report = [
        format!(
            "controller at scale: {sets} StatefulSets x {replicas} ({opted} opted in), {pods} Pending pods, {claims} Pending claims in one namespace, {} on {}",
            utc_now(),
            host()
        ),
        format!(
            "load: made by this program ({IN_FLIGHT} requests in flight): claims in {claims_secs:.0} s, sets in {sets_secs:.0} s, pods in {pods_secs:.0} s; all of it in {load_secs:.0} s; {} {settle_secs:.0} s later",
            if settled {
                "the StatefulSet controller done writing"
            } else {
                "STILL WRITING: the StatefulSet controller had not settled"
            }
        ),
        empty.line("empty namespace (baseline)"),
        empty_idle.line("empty namespace (baseline)"),
        loaded.line("under load"),
        loaded_idle.line("under load"),
        format!(
            "under load, while idle: {events_during} pod/claim and {sets_during} StatefulSet changes in the namespace; this program's own watches relisted {bench_relists} times"
        ),
        format!(
            "memory by kind (a fresh controller synced on each stage): {claims} claims alone {}; + {sets} sets (+ {pods_then} pods) {}; + every pod {}",
            mem_claims, mem_sets, loaded.mem
        ),
        format!(
            "RSS growth per object: {per_claim:.2} KiB per claim, {per_pod:.2} KiB per pod, {per_set:.2} KiB per set"
        ),
        format!(
            "RSS after sync: {} under load, {} empty (budget <= {RSS_BUDGET_MIB:.0} MiB and <= {RSS_BUDGET_RATIO}x empty: {}); after the drain cycles {}",
            mib(loaded.mem.rss),
            mib(empty.mem.rss),
            if loaded.mem.rss <= RSS_BUDGET_MIB
                && loaded.mem.rss <= RSS_BUDGET_RATIO * empty.mem.rss
            {
                "met"
            } else {
                "NOT met"
            },
            mem_end
        ),
        format!(
            "idle CPU: {:.3} s/min under load, {:.3} s/min empty (goal ~0)",
            loaded_idle.cpu_per_min, empty_idle.cpu_per_min
        ),
        format!(
            "periodic full lists while idle: {} (goal: none; its own LISTs {}, apiserver namespaced LISTs {})",
            if no_lists { "none" } else { "yes" },
            loaded_idle.own_lists,
            loaded_idle.apiserver_lists_ns
        ),
        line("baseline under load: ConfigMap -> watch event", &baseline),
        line("baseline during the cycles (every 100 ms)", &during),
        line("under load: stateful pod gone -> drain pod", &reactions),
        line("under load: drain Succeeded -> claim deleted", &cleanups),
        format!(
            "median reaction / median baseline: {:.2}, / median baseline during the cycles: {:.2}; p99 reaction {:.1} ms, max {:.1} ms (budget: none over 1 s: {}); {cycles} cycles of {web_replicas} drains in {:.1} s",
            react_p50 / base_p50,
            react_p50 / summary(&during).0,
            react_p99,
            react_max,
            if react_max <= 1000.0 { "met" } else { "NOT met" },
            wall.as_secs_f64()
        ),
    ]
    .into_iter()
    .chain(rebuilt.then(|| {
        "WARNING: the controller binary was rebuilt during the run: the figures mix two builds"
            .to_owned()
    }))
    .collect::<Vec<_>>()
    .join("\n");
    println!("{report}");
    write_result("scale.txt", &report)?;

    if !hold.is_zero() {
        eprintln!(
            "holding the load for {} s (namespace {})",
            hold.as_secs(),
            ns.name
        );
        tokio::time::sleep(hold).await;
    }
    eprintln!("== cleanup");
    let gone = delete_and_wait(&client, ns).await?;
    let tail = format!(
        "namespace deleted in {:.0} s; whole run {:.0} s",
        gone.as_secs_f64(),
        run_started.elapsed().as_secs_f64()
    );
    println!("{tail}");
    write_result("scale.txt", &format!("{report}\n{tail}"))?;
    Ok(())
}
