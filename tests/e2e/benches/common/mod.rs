//! What the benchmarks share: this program's own watches of a namespace (pods, claims,
//! ConfigMaps), from which both sides of every interval are timed the same way, the bare watch
//! latency baseline, the drain cycles of a Parallel set, and the figures' formatting.
//!
//! - **pod gone → drain pod created**: a stateful pod's Deleted event → the Added event of the
//!   drain pod of that name;
//! - **drain succeeded → claims deleted**: the drain pod's first event that shows it finished
//!   ([`finished`]) → the first event of its claim with a deletion timestamp;
//! - **baseline, bare watch latency**: a ConfigMap create request sent → its Added event;
//! - **baseline, a pod written**: the same for a Pod (the write a reaction makes). Probe pods
//!   are never scheduled (`schedulerName` of no scheduler) and are deleted once seen;
//! - **the floor**: a minimal drain controller this program runs on a twin set ([`floor`]),
//!   timed by the same watches.

pub mod floor;
pub mod load;
pub mod poc;
pub mod process;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::ops::*;
use e2e::{TestNamespace, wait_for};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};

/// How long one drain cycle may take.
pub const CYCLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The environment variable `name` as a number, or `default`.
pub fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the watches saw, by object name.
#[derive(Default)]
pub struct Seen {
    stateful_gone: HashMap<String, Instant>,
    drain_created: HashMap<String, Instant>,
    drain_succeeded: HashMap<String, Instant>,
    claim_deleting: HashMap<String, Instant>,
    /// Stateful pod gone → drain pod created.
    pub reactions: Vec<Duration>,
    /// Drain pod Succeeded → claim deleted.
    pub cleanups: Vec<Duration>,
    /// Pod and claim events (added, modified, deleted) seen after the initial lists.
    pub events: usize,
    /// Initial lists and relists of the pod and claim watches.
    pub lists: usize,
}

/// Whether a drain pod's program finished well: its phase is Succeeded, or every container
/// has terminated with status 0 (which the kubelet reports before the terminal phase: it sets
/// the phase only once the pod is torn down). The first instant either side can act on.
pub fn finished(p: &Pod) -> bool {
    let Some(status) = p.status.as_ref() else {
        return false;
    };
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    status.phase.as_deref() == Some("Succeeded")
        || (!containers.is_empty()
            && containers.iter().all(|c| {
                c.state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0)
            }))
}

/// A drain pod: ours (and the floor's), or the PoC's cleanup pod.
fn is_drain(p: &Pod) -> bool {
    p.labels().contains_key(drain_api::labels::DRAIN_POD) || p.labels().contains_key(poc::POD_LABEL)
}

/// With `STSD_BENCH_TRACE` set, prints when this program saw `what` happen to `name` (wall
/// clock, to set beside the controller's log).
pub fn trace(what: &str, name: &str) {
    if std::env::var_os("STSD_BENCH_TRACE").is_some() {
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        eprintln!("trace {:.6} {what} {name}", at.as_secs_f64());
    }
}

/// With `STSD_BENCH_TRACE` set, prints when a request of this program about `name`, sent at
/// `sent`, was answered and how long it took.
fn trace_took(what: &str, name: &str, sent: std::time::Instant) {
    if std::env::var_os("STSD_BENCH_TRACE").is_some() {
        trace(
            &format!("{what} took={:.3}ms", sent.elapsed().as_secs_f64() * 1e3),
            name,
        );
    }
}

/// The prefix of the names of the probes (ConfigMaps and Pods) of the baselines.
const PROBE: &str = "probe-";

fn record_pod(seen: &mut Seen, event: watcher::Event<Pod>, at: Instant) {
    match event {
        watcher::Event::Apply(p) => {
            seen.events += 1;
            let name = p.name_any();
            if is_drain(&p) {
                if let Some(gone) = seen.stateful_gone.remove(&name)
                    && !seen.drain_created.contains_key(&name)
                {
                    seen.drain_created.insert(name.clone(), at);
                    seen.reactions.push(at - gone);
                    trace("created", &name);
                }
                if finished(&p) && !seen.drain_succeeded.contains_key(&name) {
                    trace("finished", &name);
                    seen.drain_succeeded.insert(name, at);
                }
            }
        }
        watcher::Event::Delete(p) => {
            seen.events += 1;
            let name = p.name_any();
            if is_drain(&p) {
                seen.drain_created.remove(&name);
                seen.drain_succeeded.remove(&name);
            } else {
                trace("gone", &name);
                seen.stateful_gone.insert(name, at);
            }
        }
        watcher::Event::Init => seen.lists += 1,
        _ => {}
    }
}

fn record_claim(seen: &mut Seen, event: watcher::Event<PersistentVolumeClaim>, at: Instant) {
    let c = match event {
        watcher::Event::Apply(c) | watcher::Event::Delete(c) => c,
        watcher::Event::Init => {
            seen.lists += 1;
            return;
        }
        _ => return,
    };
    seen.events += 1;
    let name = c.name_any();
    if c.metadata.deletion_timestamp.is_none() {
        seen.claim_deleting.remove(&name);
        return;
    }
    if seen.claim_deleting.contains_key(&name) {
        return;
    }
    trace("deleting", &name);
    seen.claim_deleting.insert(name.clone(), at);
    // data-web-<o> → web-<o>
    let pod = name.trim_start_matches("data-");
    if let Some(succeeded) = seen.drain_succeeded.get(pod) {
        seen.cleanups.push(at - *succeeded);
    }
}

/// Names seen by a watch, with the instant each was seen.
type Probes = tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>;

/// The baselines measured alongside a piece of work, one probe of each every 100 ms.
pub struct During {
    /// A ConfigMap create request sent → its Added event.
    pub configmaps: Vec<Duration>,
    /// A Pod create request sent → its Added event.
    pub pods: Vec<Duration>,
}

/// This program's watches of one namespace: pods and claims into [`Seen`], the Added events of
/// probe ConfigMaps and Pods to the baseline probes.
pub struct Watches {
    /// What the pod and claim watches saw.
    pub seen: Arc<Mutex<Seen>>,
    probes: Probes,
    pod_probes: Probes,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Watches {
    /// Starts the three watches of `ns` and waits until each has listed the namespace.
    pub async fn start(ns: &TestNamespace) -> Result<Self> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (synced_tx, mut synced) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut tasks = Vec::new();

        let pods = watcher(ns.api::<Pod>(), watcher::Config::default());
        let (s, done) = (Arc::clone(&seen), synced_tx.clone());
        let (pod_tx, pod_probes) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
        tasks.push(tokio::spawn(async move {
            let mut pods = std::pin::pin!(pods);
            while let Some(Ok(e)) = pods.next().await {
                let at = Instant::now();
                match &e {
                    watcher::Event::InitDone => {
                        let _ = done.send(());
                    }
                    watcher::Event::Apply(p) | watcher::Event::Delete(p)
                        if p.name_any().starts_with(PROBE) =>
                    {
                        if matches!(e, watcher::Event::Apply(_)) {
                            let _ = pod_tx.send((p.name_any(), at));
                        }
                        continue;
                    }
                    _ => {}
                }
                record_pod(&mut s.lock().expect("lock"), e, at);
            }
        }));
        let claims = watcher(
            ns.api::<PersistentVolumeClaim>(),
            watcher::Config::default(),
        );
        let (s, done) = (Arc::clone(&seen), synced_tx.clone());
        tasks.push(tokio::spawn(async move {
            let mut claims = std::pin::pin!(claims);
            while let Some(Ok(e)) = claims.next().await {
                let at = Instant::now();
                if matches!(e, watcher::Event::InitDone) {
                    let _ = done.send(());
                }
                record_claim(&mut s.lock().expect("lock"), e, at);
            }
        }));
        let maps = watcher(ns.api::<ConfigMap>(), watcher::Config::default());
        let (tx, probes) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
        let done = synced_tx;
        tasks.push(tokio::spawn(async move {
            let mut maps = std::pin::pin!(maps);
            while let Some(Ok(e)) = maps.next().await {
                match e {
                    watcher::Event::Apply(m) => {
                        let _ = tx.send((m.name_any(), Instant::now()));
                    }
                    watcher::Event::InitDone => {
                        let _ = done.send(());
                    }
                    _ => {}
                }
            }
        }));
        for _ in 0..3 {
            tokio::time::timeout(Duration::from_secs(300), synced.recv())
                .await
                .context("the initial lists of the watches")?
                .context("a watch ended")?;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(Self {
            seen,
            probes,
            pod_probes,
            tasks,
        })
    }

    /// The bare watch latency: `n` ConfigMaps created one after the other in `ns`, each timed
    /// from its create request sent to its Added event.
    pub async fn baseline(&mut self, ns: &TestNamespace, n: usize) -> Result<Vec<Duration>> {
        let cms: Api<ConfigMap> = ns.api();
        let mut baseline = Vec::new();
        for i in 0..n {
            baseline.push(probe(&cms, &mut self.probes, &format!("{PROBE}{i}")).await?);
        }
        Ok(baseline)
    }

    /// The same as [`baseline`](Self::baseline) for Pods, the kind of write a reaction makes:
    /// `n` probe pods created one after the other, each deleted once seen.
    pub async fn pod_baseline(&mut self, ns: &TestNamespace, n: usize) -> Result<Vec<Duration>> {
        let pods: Api<Pod> = ns.api();
        let mut baseline = Vec::new();
        for i in 0..n {
            let name = format!("{PROBE}pod-{i}");
            baseline.push(probe(&pods, &mut self.pod_probes, &name).await?);
        }
        Ok(baseline)
    }

    /// Runs `work` while timing the bare watch latency alongside it: a ConfigMap and then a
    /// Pod created every 100 ms until `work` ends, each timed like
    /// [`baseline`](Self::baseline). The baselines under the same load as `work` (the node
    /// starting and stopping pods).
    pub async fn baseline_during<T>(
        &mut self,
        ns: &TestNamespace,
        work: impl Future<Output = Result<T>>,
    ) -> Result<(T, During)> {
        self.baseline_every(ns, Duration::from_millis(100), true, work)
            .await
    }

    /// As [`baseline_during`](Self::baseline_during), a ConfigMap every `every`, and a Pod
    /// after each only if `pods` (a probe pod is two writes, its create and its delete).
    pub async fn baseline_every<T>(
        &mut self,
        ns: &TestNamespace,
        every: Duration,
        pods: bool,
        work: impl Future<Output = Result<T>>,
    ) -> Result<(T, During)> {
        let with_pods = pods;
        let done = std::sync::atomic::AtomicBool::new(false);
        let cms: Api<ConfigMap> = ns.api();
        let pods: Api<Pod> = ns.api();
        let (probes, pod_probes) = (&mut self.probes, &mut self.pod_probes);
        let probing = async {
            let mut during = During {
                configmaps: Vec::new(),
                pods: Vec::new(),
            };
            let mut i = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let name = format!("{PROBE}during-{i}");
                during.configmaps.push(probe(&cms, probes, &name).await?);
                if with_pods {
                    during.pods.push(probe(&pods, pod_probes, &name).await?);
                }
                i += 1;
                tokio::time::sleep(every).await;
            }
            anyhow::Ok(during)
        };
        let work = async {
            let result = work.await;
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            result
        };
        let (result, samples) = tokio::join!(work, probing);
        Ok((result?, samples?))
    }

    /// Stops the watches.
    pub fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A kind of probe object: a ConfigMap, or a Pod that no scheduler takes and that is deleted
/// once seen (not timed).
trait ProbeObject:
    kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
    + Clone
    + k8s_openapi::serde::Serialize
    + k8s_openapi::serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// The probe named `name`.
    fn named(name: &str) -> Self;
    /// Whether it is deleted once seen.
    const DELETE: bool;
}

impl ProbeObject for ConfigMap {
    fn named(name: &str) -> Self {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }
    const DELETE: bool = false;
}

impl ProbeObject for Pod {
    fn named(name: &str) -> Self {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "schedulerName": "no-scheduler",
                "containers": [{"name": "probe", "image": "busybox", "imagePullPolicy": "Never"}],
            },
        }))
        .expect("probe pod")
    }
    const DELETE: bool = true;
}

/// One probe of the bare watch latency: the object `name` created, timed from its create
/// request sent to its Added event on `probes`.
async fn probe<K: ProbeObject>(api: &Api<K>, probes: &mut Probes, name: &str) -> Result<Duration> {
    let sent = Instant::now();
    api.create(&PostParams::default(), &K::named(name)).await?;
    loop {
        let (got, at) = tokio::time::timeout(Duration::from_secs(10), probes.recv())
            .await
            .context("watch event of a probe")?
            .context("watch ended")?;
        if got == name {
            if K::DELETE {
                api.delete(name, &DeleteParams::default().grace_period(0))
                    .await?;
            }
            return Ok(at - sent);
        }
    }
}

/// Scales the running Parallel set `set` of `replicas` to 0 and waits until every claim
/// (`claims`: those of the set) is drained and deleted, `cycles` times, scaling it back up in
/// between; the wall time of the cycles.
pub async fn drain_cycles(
    ns: &TestNamespace,
    set: &str,
    replicas: i32,
    cycles: usize,
    claims: &ListParams,
) -> Result<Duration> {
    let started = Instant::now();
    let claims_api: Api<PersistentVolumeClaim> = ns.api();
    for cycle in 0..cycles {
        wait_running(ns, &pod_names(set, 0..replicas)).await?;
        scale(ns, set, 0).await?;
        wait_for(CYCLE_TIMEOUT, "every claim drained and deleted", || async {
            Ok(claims_api.list(claims).await?.items.is_empty() && drain_pods(ns).await?.is_empty())
        })
        .await?;
        eprintln!("cycle {}/{cycles} done", cycle + 1);
        if cycle + 1 < cycles {
            scale(ns, set, replicas).await?;
        }
    }
    Ok(started.elapsed())
}

/// p50, p99, max in milliseconds, and the number of samples.
pub fn summary(samples: &[Duration]) -> (f64, f64, f64, usize) {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return (0.0, 0.0, 0.0, 0);
    }
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99), *ms.last().unwrap_or(&0.0), ms.len())
}

/// The `q` quantile (0..=1) of `samples`, in milliseconds (0 without samples):
/// [`e2e::stats::quantile`].
pub fn quantile(samples: &[Duration], q: f64) -> f64 {
    e2e::stats::quantile(samples, q)
}

/// One line of figures with p90: `what`, the number of samples, p50, p90, p99, max.
pub fn line90(what: &str, samples: &[Duration]) -> String {
    let q = |q| quantile(samples, q);
    format!(
        "{what:<46} n={:<4} p50 {:>7.1}  p90 {:>7.1}  p99 {:>7.1}  max {:>7.1} ms",
        samples.len(),
        q(0.5),
        q(0.9),
        q(0.99),
        q(1.0)
    )
}

/// One line of figures: `what`, the number of samples, p50, p99, max.
pub fn line(what: &str, samples: &[Duration]) -> String {
    let (p50, p99, max, n) = summary(samples);
    format!("{what:<44} n={n:<4} p50 {p50:>7.1} ms  p99 {p99:>7.1} ms  max {max:>7.1} ms")
}

/// The time now, UTC, to the minute.
pub fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%MZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// The machine: its number of cores.
pub fn host() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpus} cores")
}

/// Writes `report` to `tests/bench/results/<file>` and says where.
pub fn write_result(file: &str, report: &str) -> Result<()> {
    let out = e2e::repo_root().join("tests/bench/results").join(file);
    std::fs::create_dir_all(out.parent().expect("dir"))?;
    std::fs::write(&out, format!("{report}\n"))?;
    eprintln!("written to {}", out.display());
    Ok(())
}
