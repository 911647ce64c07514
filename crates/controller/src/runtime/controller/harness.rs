//! Tests of `reconcile()` itself without a cluster: its caches fed through the watches' own
//! plumbing from a fake world, its writes through a fake seam that changes that world, time
//! paused. The world is the judge: what exists after the reconciles, not what they said.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use drain_api::completion::CompletionRecord;
use drain_api::{annotations, labels};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Node, ObjectReference,
    PersistentVolumeClaim, Pod, PodStatus,
};
use kube::api::ObjectMeta;
use kube::core::PartialObjectMetaExt;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};

use super::context::{Caches, Context, ControllerConfig, Error, Remembered};
use super::events::Events;
use super::reconcile::reconcile;
use super::watches::{drain_pod_fingerprint, drain_pod_sets, slim_drain_pod};
use super::writes::{Seam, SetWrites};

use crate::act::{Cluster, Created, Deleted, EventSpec, Patched, Retained};
use crate::fixtures::{ClaimBuilder, NAMESPACE, SetBuilder, drain_template_json};
use crate::plan::ClaimRef;
use crate::retain::RetainError;
use crate::runtime::caches::{Cache, ClaimEntry};
use crate::runtime::leader::{Leadership, Tenure};
use crate::runtime::watch::{self, Filter, Index};
use crate::set_kind::{CachedStatefulSet, ServedSet};

/// What the fake cluster holds: the set's status, the pods and claims by name, every write.
#[derive(Default)]
struct World {
    replicas: i32,
    status: Option<String>,
    stateful_pods: BTreeMap<String, String>,
    drain_pods: BTreeMap<String, Pod>,
    claims: BTreeMap<String, PersistentVolumeClaim>,
    version: u64,
    writes: Vec<String>,
    /// Status patches fail while this is set.
    status_fails: bool,
}

impl World {
    fn next_version(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }
}

/// The fake seam: writes change the world, and are noted as the cluster's writes are.
#[derive(Default)]
struct Fake(Mutex<World>);

struct FakeWrites<'a> {
    world: &'a Mutex<World>,
    ctx: &'a Context,
}

impl Seam for Fake {
    type Writes<'a, K: ServedSet> = FakeWrites<'a>;
    fn writes<'a, K: ServedSet>(
        &'a self,
        ctx: &'a Context,
        _set: &StatefulSet,
        _set_ref: ObjectReference,
        _tenure: Tenure,
    ) -> FakeWrites<'a> {
        FakeWrites {
            world: &self.0,
            ctx,
        }
    }
}

fn failure() -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure("injected", "InternalError")
            .with_code(500)
            .boxed(),
    )
}

impl Cluster for FakeWrites<'_> {
    async fn create_pod(&self, pod: &Pod) -> Result<Created, kube::Error> {
        let mut w = self.world.lock().unwrap();
        let name = pod.name_any();
        w.writes.push(format!("create pod {name}"));
        if w.drain_pods.contains_key(&name) || w.stateful_pods.contains_key(&name) {
            return Ok(Created::AlreadyExists);
        }
        let mut made = pod.clone();
        made.metadata.uid = Some(format!("uid-drain-{name}-{}", w.version));
        made.metadata.resource_version = Some(w.next_version());
        made.metadata.namespace = Some(NAMESPACE.to_owned());
        w.drain_pods.insert(name.clone(), made.clone());
        slim_drain_pod(&mut made);
        let version = made.metadata.resource_version.clone();
        let uid = made.metadata.uid.clone().unwrap();
        let recent = &self.ctx.remembered.recent;
        recent
            .pods
            .wrote(NAMESPACE, &name, version.as_deref(), made);
        Ok(Created::Uid(uid))
    }
    async fn delete_pod(
        &self,
        name: &str,
        uid: &str,
        _resource_version: Option<&str>,
    ) -> Result<Deleted, kube::Error> {
        let mut w = self.world.lock().unwrap();
        w.writes.push(format!("delete pod {name}"));
        if w.drain_pods
            .get(name)
            .and_then(|p| p.metadata.uid.as_deref())
            != Some(uid)
        {
            return Ok(Deleted::Gone);
        }
        w.drain_pods.remove(name);
        self.ctx.remembered.recent.deleted_pods.deleted(uid);
        Ok(Deleted::Deleted)
    }
    async fn delete_claim(&self, name: &str, uid: &str) -> Result<(), kube::Error> {
        let mut w = self.world.lock().unwrap();
        w.writes.push(format!("delete claim {name}"));
        if w.claims.get(name).and_then(|c| c.metadata.uid.as_deref()) == Some(uid) {
            w.claims.remove(name);
        }
        self.ctx.remembered.recent.deleted_claims.deleted(uid);
        Ok(())
    }
    async fn annotate_claim(
        &self,
        name: &str,
        uid: &str,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<Patched, kube::Error> {
        let mut w = self.world.lock().unwrap();
        w.writes.push(format!("annotate claim {name}"));
        let version = w.next_version();
        let Some(claim) = w.claims.get_mut(name) else {
            return Ok(Patched::Gone);
        };
        if claim.metadata.uid.as_deref() != Some(uid) {
            return Ok(Patched::Gone);
        }
        let kept = claim
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        for (k, v) in changes {
            match v {
                Some(v) => kept.insert(k.clone(), v.clone()),
                None => kept.remove(k),
            };
        }
        claim.metadata.resource_version = Some(version.clone());
        let entry = ClaimEntry::of(&claim.metadata);
        let recent = &self.ctx.remembered.recent;
        recent.claims.wrote(NAMESPACE, name, Some(&version), entry);
        Ok(Patched::Done)
    }
    async fn still_orphaned(&self, ordinal: i32) -> Result<bool, kube::Error> {
        Ok(ordinal >= self.world.lock().unwrap().replicas)
    }
    async fn pod_uid(&self, name: &str) -> Result<Option<String>, kube::Error> {
        let w = self.world.lock().unwrap();
        Ok(w.drain_pods.get(name).and_then(|p| p.metadata.uid.clone()))
    }
    async fn retain_volume(
        &self,
        _claim: &ClaimRef,
        _pod: &str,
        _until: Timestamp,
    ) -> Result<Retained, RetainError> {
        Ok(Retained::NoVolume)
    }
    async fn event(&self, event: &EventSpec) {
        let mut w = self.world.lock().unwrap();
        w.writes.push(format!("event {}", event.reason));
    }
    fn may_act(&self) -> bool {
        self.ctx.config.leadership.fence().is_some()
    }
}

impl SetWrites for FakeWrites<'_> {
    async fn patch_status(
        &self,
        set: &StatefulSet,
        status: Option<String>,
    ) -> Result<Option<StatefulSet>, kube::Error> {
        let mut w = self.world.lock().unwrap();
        w.writes.push("patch status".to_owned());
        if w.status_fails {
            return Err(failure());
        }
        w.status = status.clone();
        let mut patched = set.clone();
        patched.metadata.resource_version = Some(w.next_version());
        let kept = patched
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        match status {
            Some(s) => kept.insert(annotations::STATUS.to_owned(), s),
            None => kept.remove(annotations::STATUS),
        };
        Ok(Some(patched))
    }
    async fn live_pod(&self, _name: &str) -> Result<Option<Pod>, kube::Error> {
        Ok(None)
    }
    async fn node(&self, _name: &str) -> Result<Option<Node>, kube::Error> {
        Ok(None)
    }
}

type DrainEvents =
    futures::channel::mpsc::UnboundedSender<Result<watcher::Event<Pod>, watcher::Error>>;

/// One set `web` (claim template `data`) in the fake world, its reconcile's context, and the
/// drain pods' watch pipeline, fed by hand.
struct Harness {
    ctx: Arc<Context>,
    seam: Fake,
    drain_events: DrainEvents,
    drain_changes: BoxStream<'static, Result<Pod, watcher::Error>>,
}

fn claim(ordinal: i32) -> String {
    format!("data-web-{ordinal}")
}

impl Harness {
    /// The set scaled from `was` to `replicas`: a claim for each ordinal below `was`, a
    /// stateful pod for each below `replicas`. Nothing is in the caches until [`Self::sync`].
    fn new(was: i32, replicas: i32, leadership: Leadership) -> Self {
        let client = Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
            .expect("a client (it is never answered)");
        let (drain_pods, writer) = reflector::store();
        let drain_pod_index = Index::default();
        let (drain_events, events) = futures::channel::mpsc::unbounded();
        let filter = Filter {
            fingerprint: drain_pod_fingerprint,
            sets: drain_pod_sets,
            index: Some(drain_pod_index.clone()),
        };
        let remembered = Remembered::default();
        let recent = Arc::clone(&remembered.recent);
        let drain_changes = watch::changes(events.reflect(writer), filter)
            .inspect(move |pod| {
                if let Ok(pod) = pod {
                    recent.pods.saw(pod.metadata.resource_version.as_deref());
                }
            })
            .boxed();
        let ctx = Context {
            caches: Caches {
                stateful_pods: Cache::default(),
                drain_pods,
                claims: Cache::default(),
                drain_pod_index,
                sets: reflector::store().0,
                advanced: Arc::new(OnceLock::new()),
                ready: tokio::sync::watch::channel(true).1,
            },
            remembered,
            events: Events {
                recorder: Recorder::new(
                    client.clone(),
                    Reporter {
                        controller: "test".to_owned(),
                        instance: None,
                    },
                ),
                sending: tokio_util::task::TaskTracker::new(),
            },
            config: ControllerConfig {
                namespaces: Vec::new(),
                flags: Default::default(),
                resync: Duration::from_secs(300),
                leadership,
                dry_run: false,
                advanced_discovery: Duration::from_secs(60),
                stop_grace: Duration::from_secs(1),
            },
            scope: None,
            metrics: Arc::default(),
            retained: Arc::default(),
            client,
        };
        let mut world = World {
            replicas,
            version: 100,
            ..World::default()
        };
        for o in 0..was {
            let c = ClaimBuilder::for_ordinal("data", "web", o).build();
            world.claims.insert(claim(o), c);
        }
        for o in 0..replicas {
            world
                .stateful_pods
                .insert(format!("web-{o}"), format!("uid-web-{o}"));
        }
        Self {
            ctx: Arc::new(ctx),
            seam: Fake(Mutex::new(world)),
            drain_events,
            drain_changes,
        }
    }

    fn world<R>(&self, f: impl FnOnce(&mut World) -> R) -> R {
        f(&mut self.seam.0.lock().unwrap())
    }

    /// The set as the watch shows it, with the status last written.
    fn set(&self) -> StatefulSet {
        let (replicas, status) = self.world(|w| (w.replicas, w.status.clone()));
        let mut set = SetBuilder::new("web")
            .replicas(replicas)
            .claim_template("data")
            .drain_template(&drain_template_json(&["data"]))
            .build();
        set.metadata.resource_version = Some("1".to_owned());
        if let Some(s) = status {
            set.annotations_mut()
                .insert(annotations::STATUS.to_owned(), s);
        }
        set
    }

    /// The watches catch up with the world: the stateful pods and claims relisted, the drain
    /// pods' changes passed on as their watch passes them.
    async fn sync(&mut self) {
        let (pods, claims, drain_pods) = self.world(|w| {
            (
                w.stateful_pods.clone(),
                w.claims.clone(),
                w.drain_pods.clone(),
            )
        });
        let pod_events = pods.iter().map(|(name, uid)| {
            let meta = ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(NAMESPACE.to_owned()),
                uid: Some(uid.clone()),
                labels: Some([(labels::STATEFUL_POD_NAME.to_owned(), name.clone())].into()),
                resource_version: Some("1".to_owned()),
                ..ObjectMeta::default()
            };
            watcher::Event::InitApply(meta.into_response_partial::<Pod>())
        });
        let claim_events = claims.values().map(|c| {
            watcher::Event::InitApply(
                c.metadata
                    .clone()
                    .into_response_partial::<PersistentVolumeClaim>(),
            )
        });
        let _: Vec<_> = self
            .ctx
            .caches
            .stateful_pods
            .changes(relist(pod_events.collect()))
            .collect()
            .await;
        let _: Vec<_> = self
            .ctx
            .caches
            .claims
            .changes(relist(claim_events.collect()))
            .collect()
            .await;
        let cached: Vec<Arc<Pod>> = self.ctx.caches.drain_pods.state();
        for gone in cached
            .iter()
            .filter(|p| !drain_pods.contains_key(&p.name_any()))
        {
            let event = watcher::Event::Delete(Pod::clone(gone));
            self.drain_events.unbounded_send(Ok(event)).unwrap();
        }
        for pod in drain_pods.into_values() {
            self.drain_events
                .unbounded_send(Ok(watcher::Event::Apply(pod)))
                .unwrap();
        }
        while let Some(Some(_)) = self.drain_changes.next().now_or_never() {}
    }

    async fn reconcile(&self) -> Result<Action, Error> {
        reconcile::<CachedStatefulSet, _>(
            Arc::new(self.set().into()),
            Arc::clone(&self.ctx),
            &self.seam,
        )
        .await
    }

    /// The writes since the last call.
    fn writes(&self) -> Vec<String> {
        self.world(|w| std::mem::take(&mut w.writes))
    }

    /// The drain pod `name` ran and exited 0, its container having written the completion
    /// record of the claims it is bound to.
    fn finish(&self, name: &str) {
        self.world(|w| {
            let claims: BTreeMap<String, String> = w
                .claims
                .values()
                .filter(|c| c.name_any() == format!("data-{name}"))
                .map(|c| (c.name_any(), c.metadata.uid.clone().unwrap()))
                .collect();
            let version = w.next_version();
            let pod = w.drain_pods.get_mut(name).expect("the drain pod exists");
            let container = pod.spec.as_ref().unwrap().containers[0].name.clone();
            pod.metadata.resource_version = Some(version);
            pod.status = Some(PodStatus {
                phase: Some("Succeeded".to_owned()),
                container_statuses: Some(vec![ContainerStatus {
                    name: container,
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: 0,
                            message: Some(CompletionRecord::new(claims).render()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            });
        });
    }
}

/// A relist of `items`, as a watch passes it on.
fn relist<K>(
    items: Vec<watcher::Event<K>>,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> {
    let mut all = vec![watcher::Event::Init];
    all.extend(items);
    all.push(watcher::Event::InitDone);
    futures::stream::iter(all.into_iter().map(Ok))
}

fn has_record(w: &World, claim: &str) -> bool {
    w.claims[claim]
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| !a.is_empty())
}

#[tokio::test(start_paused = true)]
async fn a_scale_down_gets_a_drain_pod_of_the_same_name_its_record_and_a_status() {
    let mut h = Harness::new(3, 2, Leadership::always());
    h.sync().await;
    let action = h.reconcile().await.expect("reconciled");
    assert!(
        action != Action::await_change(),
        "a drain in flight is requeued"
    );
    let writes = h.writes();
    assert_eq!(
        writes.first().map(String::as_str),
        Some("create pod web-2"),
        "{writes:?}"
    );
    h.world(|w| {
        let pod = &w.drain_pods["web-2"];
        assert_eq!(
            pod.spec.as_ref().unwrap().hostname.as_deref(),
            Some("web-2")
        );
        assert!(
            has_record(w, "data-web-2"),
            "the drain is recorded on its claim"
        );
        assert!(
            !has_record(w, "data-web-1"),
            "a running member's claim is left alone"
        );
        assert!(
            w.status.as_deref().is_some_and(|s| s.contains("draining")),
            "{:?}",
            w.status
        );
        assert_eq!(w.claims.len(), 3, "no claim is deleted");
    });
}

#[tokio::test(start_paused = true)]
async fn a_reconcile_before_the_watch_shows_our_create_creates_nothing_again() {
    let mut h = Harness::new(3, 2, Leadership::always());
    h.sync().await;
    h.reconcile().await.expect("reconciled");
    h.writes();
    // The caches have not seen the drain pod nor the record yet.
    h.reconcile().await.expect("reconciled");
    let again = h.writes();
    assert!(!again.iter().any(|w| w.starts_with("create")), "{again:?}");
    assert_eq!(h.world(|w| w.drain_pods.len()), 1);
}

#[tokio::test(start_paused = true)]
async fn a_proven_drain_deletes_its_claims_then_its_pod_and_no_drain_starts_on_them_again() {
    let mut h = Harness::new(3, 2, Leadership::always());
    h.sync().await;
    h.reconcile().await.expect("reconciled");
    h.sync().await;
    h.finish("web-2");
    h.sync().await;
    h.writes();
    h.reconcile().await.expect("reconciled");
    let writes = h.writes();
    let claim_at = writes.iter().position(|w| w == "delete claim data-web-2");
    let pod_at = writes.iter().position(|w| w == "delete pod web-2");
    assert!(claim_at.is_some() && pod_at.is_some(), "{writes:?}");
    assert!(
        claim_at < pod_at,
        "the claim goes before the drain pod: {writes:?}"
    );
    h.world(|w| {
        assert!(!w.claims.contains_key("data-web-2"));
        assert!(w.claims.contains_key("data-web-1") && w.claims.contains_key("data-web-0"));
    });
    // The watches have shown none of it: the claim is still cached, the drain pod gone from
    // the world. No drain pod is started on the claim just deleted.
    for _ in 0..3 {
        h.reconcile().await.expect("reconciled");
    }
    let later = h.writes();
    assert!(!later.iter().any(|w| w.starts_with("create")), "{later:?}");
    h.sync().await;
    h.reconcile().await.expect("reconciled");
    assert!(!h.writes().iter().any(|w| w.starts_with("create")));
    assert!(h.world(|w| w.drain_pods.is_empty()));
}

#[tokio::test(start_paused = true)]
async fn a_drain_pod_that_exited_0_without_its_record_deletes_no_claim() {
    let mut h = Harness::new(3, 2, Leadership::always());
    h.sync().await;
    h.reconcile().await.expect("reconciled");
    h.world(|w| {
        let pod = w.drain_pods.get_mut("web-2").unwrap();
        pod.status = Some(PodStatus {
            phase: Some("Succeeded".to_owned()),
            ..Default::default()
        });
        pod.metadata.resource_version = Some("999".to_owned());
    });
    h.sync().await;
    h.writes();
    for _ in 0..3 {
        h.reconcile().await.expect("reconciled");
        h.sync().await;
    }
    let writes = h.writes();
    assert!(
        !writes.iter().any(|w| w.starts_with("delete claim")),
        "{writes:?}"
    );
    assert_eq!(h.world(|w| w.claims.len()), 3);
}

#[tokio::test(start_paused = true)]
async fn a_standby_writes_nothing() {
    let mut h = Harness::new(3, 2, Leadership::standby_for_tests());
    h.sync().await;
    assert_eq!(
        h.reconcile().await.expect("reconciled"),
        Action::await_change()
    );
    assert_eq!(h.writes(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_failed_status_write_holds_no_drain_back_and_is_written_by_the_next_reconcile() {
    let mut h = Harness::new(3, 2, Leadership::always());
    h.world(|w| w.status_fails = true);
    h.sync().await;
    let action = h
        .reconcile()
        .await
        .expect("a failed status write is no failed reconcile");
    assert!(
        h.world(|w| w.drain_pods.contains_key("web-2")),
        "the drain started"
    );
    assert!(h.world(|w| w.status.is_none()));
    assert!(action != Action::await_change());
    h.world(|w| w.status_fails = false);
    h.sync().await;
    h.reconcile().await.expect("reconciled");
    let status = h.world(|w| w.status.clone());
    assert!(status.is_some_and(|s| s.contains("draining")));
}

#[tokio::test(start_paused = true)]
async fn a_scale_up_mid_drain_withdraws_the_drain_pod_and_keeps_the_claim() {
    let mut h = Harness::new(3, 2, Leadership::always());
    h.sync().await;
    h.reconcile().await.expect("reconciled");
    h.sync().await;
    h.world(|w| w.replicas = 3);
    h.writes();
    h.reconcile().await.expect("reconciled");
    let writes = h.writes();
    assert!(writes.iter().any(|w| w == "delete pod web-2"), "{writes:?}");
    assert!(
        !writes.iter().any(|w| w.starts_with("delete claim")),
        "{writes:?}"
    );
    assert_eq!(h.world(|w| w.claims.len()), 3);
}
