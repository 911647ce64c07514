//! What happened in a namespace: the checker's own watches of pods, claims and StatefulSets,
//! merged into one history in etcd revision order.
//!
//! Every write to etcd has its own revision, and an object's `resourceVersion` is the revision
//! of its last write (for a deletion event, of the deletion), so sorting the three streams by
//! it gives the order in which things happened (resource versions are comparable integers,
//! guaranteed since Kubernetes 1.35). When a watch has to list again (after `410 Gone`, e.g.
//! across an API server restart) the history says so ([`Change::Relisted`]): objects missing
//! from the new list are recorded as [`Change::GoneInGap`].
//!
//! Every entry also carries the instant this process received it ([`Entry::at`]), on the same
//! clock ([`Instant`]) the witness of the drains' completion reports uses
//! ([`crate::witness::Report::at`]), so that a report can be ordered against the first sight of
//! a claim's deletion.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};

/// One observed object.
#[derive(Clone, Debug)]
pub enum Obj {
    /// A pod (stateful or drain pod).
    Pod(Box<Pod>),
    /// A PersistentVolumeClaim.
    Claim(Box<PersistentVolumeClaim>),
    /// A StatefulSet.
    Set(Box<StatefulSet>),
}

impl Obj {
    /// Its metadata.
    pub fn meta(&self) -> &kube::api::ObjectMeta {
        match self {
            Self::Pod(o) => o.meta(),
            Self::Claim(o) => o.meta(),
            Self::Set(o) => o.meta(),
        }
    }

    /// Its UID.
    pub fn uid(&self) -> String {
        self.meta().uid.clone().unwrap_or_default()
    }

    /// Its name.
    pub fn name(&self) -> String {
        self.meta().name.clone().unwrap_or_default()
    }

    /// Its kind, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Pod(_) => "pod",
            Self::Claim(_) => "claim",
            Self::Set(_) => "statefulset",
        }
    }

    fn rv(&self) -> u64 {
        self.meta()
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

/// What one entry of the history says.
#[derive(Clone, Debug)]
pub enum Change {
    /// Created or changed (seen by the watch: its revision is exact).
    Applied(Obj),
    /// Present in a (re)list; its revision is that of its last write, which may lie in a gap.
    Listed(Obj),
    /// Deleted.
    Deleted(Obj),
    /// Known before a relist and missing from it: deleted at some revision in the gap, which
    /// the list does not tell; recorded at the end of the history (revision `u64::MAX`).
    GoneInGap(Obj),
    /// The watch listed again: what happened since its last event is known only from the list.
    Relisted {
        /// Which kind's watch.
        kind: &'static str,
    },
}

/// One entry: a change, the revision it happened at and when this process received it.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The etcd revision (`resourceVersion`).
    pub rv: u64,
    /// When the checker's watch delivered it (for a [`Change::GoneInGap`], when the relist
    /// that no longer had the object finished): always after the change itself happened.
    pub at: Instant,
    /// What changed.
    pub change: Change,
}

/// Everything recorded, in revision order.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// The entries, sorted by revision (ties keep their arrival order).
    pub entries: Vec<Entry>,
}

#[derive(Default)]
struct Log {
    /// Entries in arrival order: revision, arrival sequence number, arrival instant, change.
    entries: Vec<(u64, u64, Instant, Change)>,
    seq: u64,
}

impl Log {
    fn push(&mut self, rv: u64, change: Change) {
        self.seq += 1;
        self.entries.push((rv, self.seq, Instant::now(), change));
    }
}

/// Records a namespace from its own watches until stopped (or dropped).
pub struct Recorder {
    log: Arc<Mutex<Log>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    synced: Arc<Mutex<BTreeMap<&'static str, u64>>>,
}

/// A watch's restarts: retried every 100 ms, so a restarted API server is seen again at once.
#[derive(Clone)]
struct Every100ms;

impl Iterator for Every100ms {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(Duration::from_millis(100))
    }
}

impl kube::runtime::utils::Backoff for Every100ms {
    fn reset(&mut self) {}
}

impl Recorder {
    /// Starts watching pods, claims and StatefulSets in `namespace`.
    pub fn start(client: &Client, namespace: &str) -> Self {
        let log = Arc::new(Mutex::new(Log::default()));
        let synced = Arc::new(Mutex::new(BTreeMap::new()));
        let tasks = vec![
            spawn::<Pod>(client, namespace, "pod", &log, &synced, |o| {
                Obj::Pod(Box::new(o))
            }),
            spawn::<PersistentVolumeClaim>(client, namespace, "claim", &log, &synced, |o| {
                Obj::Claim(Box::new(o))
            }),
            spawn::<StatefulSet>(client, namespace, "statefulset", &log, &synced, |o| {
                Obj::Set(Box::new(o))
            }),
        ];
        Self { log, tasks, synced }
    }

    /// Waits until every watch has listed at least `lists` times (1: started; 2: listed again
    /// after a gap), at most `timeout`; whether they have.
    pub async fn wait_listed(&self, lists: u64, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let done = {
                let s = self.synced.lock().expect("synced");
                s.len() == 3 && s.values().all(|&n| n >= lists)
            };
            if done {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many times each watch has listed so far (1 = no gap).
    pub fn lists(&self) -> BTreeMap<&'static str, u64> {
        self.synced.lock().expect("synced").clone()
    }

    /// The history so far, in revision order.
    pub fn history(&self) -> History {
        let log = self.log.lock().expect("log");
        let mut entries = log.entries.clone();
        entries.sort_by_key(|(rv, seq, _, _)| (*rv, *seq));
        History {
            entries: entries
                .into_iter()
                .map(|(rv, _, at, change)| Entry { rv, at, change })
                .collect(),
        }
    }

    /// Stops the watches; the history recorded.
    pub fn stop(self) -> History {
        for t in &self.tasks {
            t.abort();
        }
        self.history()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn spawn<K>(
    client: &Client,
    namespace: &str,
    kind: &'static str,
    log: &Arc<Mutex<Log>>,
    synced: &Arc<Mutex<BTreeMap<&'static str, u64>>>,
    wrap: fn(K) -> Obj,
) -> tokio::task::JoinHandle<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
    <K as Resource>::DynamicType: Default,
{
    use kube::runtime::WatchStreamExt;
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let log = Arc::clone(log);
    let synced = Arc::clone(synced);
    tokio::spawn(async move {
        // Objects alive as far as this watch knows (uid → last object), to find what a relist
        // no longer has.
        let mut alive: BTreeMap<String, Obj> = BTreeMap::new();
        let mut listed: Option<BTreeMap<String, Obj>> = None;
        // The newest revision this watch has seen.
        let mut last_rv = 0;
        let mut stream = watcher(api, watcher::Config::default())
            .backoff(Every100ms)
            .boxed();
        while let Some(event) = stream.next().await {
            let Ok(event) = event else { continue };
            let mut log = log.lock().expect("log");
            match event {
                watcher::Event::Init => {
                    listed = Some(BTreeMap::new());
                }
                watcher::Event::InitApply(o) => {
                    let obj = wrap(o);
                    if let Some(l) = listed.as_mut() {
                        l.insert(obj.uid(), obj.clone());
                    }
                    last_rv = last_rv.max(obj.rv());
                    let known = alive.get(&obj.uid()).map(Obj::rv);
                    if known.is_none_or(|rv| rv < obj.rv()) {
                        log.push(obj.rv(), Change::Listed(obj));
                    }
                }
                watcher::Event::InitDone => {
                    let listed = listed.take().unwrap_or_default();
                    let first = synced
                        .lock()
                        .expect("synced")
                        .get(kind)
                        .copied()
                        .unwrap_or(0);
                    if first > 0 {
                        let at = listed.values().map(Obj::rv).max().unwrap_or(0).max(last_rv);
                        log.push(at, Change::Relisted { kind });
                        for (uid, obj) in &alive {
                            if !listed.contains_key(uid) {
                                log.push(u64::MAX, Change::GoneInGap(obj.clone()));
                            }
                        }
                    }
                    alive = listed;
                    *synced.lock().expect("synced").entry(kind).or_default() += 1;
                }
                watcher::Event::Apply(o) => {
                    let obj = wrap(o);
                    last_rv = last_rv.max(obj.rv());
                    alive.insert(obj.uid(), obj.clone());
                    log.push(obj.rv(), Change::Applied(obj));
                }
                watcher::Event::Delete(o) => {
                    let obj = wrap(o);
                    last_rv = last_rv.max(obj.rv());
                    alive.remove(&obj.uid());
                    log.push(obj.rv(), Change::Deleted(obj));
                }
            }
        }
    })
}
