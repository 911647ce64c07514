//! Acting on the pods that go, and the drains that finish, while a set's reconcile has creates
//! or claim deletes in flight.
//!
//! A set's reconciles run one at a time (`queue`), and a scale-down's pods go one after
//! another, tens of milliseconds apart: without this, a pod that goes while its set's reconcile
//! waits for a drain pod's create waits for that create, then for its own. So while a
//! reconcile's creates are in flight it is woken ([`PodsChanged`]) when a pod of its set
//! changes, plans again from the caches, and sends the creates of the ordinals it has not acted
//! on yet, beside the ones in flight. A create in flight is shown to that plan as a Pending
//! drain pod of ours (a pending write in `recent`), so the set's slots are counted right; the
//! reconcile still holds its set, so no other reconcile of it sees one. It plans from the set
//! as it was when the reconcile began, so a change of the set that can change a plan (a scale,
//! its settings, an opt-out: [`PodsChanged::set_changed`]) ends the planning again: the next
//! reconcile, which that change triggers, plans from the set as it is.
//!
//! The drains of a scale-down finish close together too, so the same holds for them: while a
//! reconcile's claim deletes are in flight, a drain pod of its set that changes has the plan
//! made again, and an ordinal not acted on yet whose drain that plan finds proven finished gets
//! its actions (its volumes retained if asked, its claims deleted, its drain pod deleted)
//! beside the ones in flight: what the next reconcile would do for it, by the same rules, from
//! the same caches, without waiting for this one's writes.
//!
//! A reconcile listens from its start (once admitted), before it reads the caches
//! ([`PodsChanged::listen`]): a pod that goes or a drain that finishes while it plans wakes it
//! as soon as it acts. Were it to listen only once it acts, such a change would wait for the
//! whole reconcile to end (all of its writes answered), then for the next one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ObjectReference;
use tokio::sync::Notify;
use tracing::info;

use super::cluster::KubeCluster;
use super::context::{Context, opted_in};
use super::memory::set_id;
use super::snapshot::observe_set;

use crate::act::{self, ActCtx, ActError};
use crate::plan::{self, Action};
use crate::runtime::leader::Tenure;
use crate::runtime::watch::SetKey;
use crate::set_kind::ServedSet;

/// The sets whose reconcile waits for creates, each with what wakes it.
#[derive(Default)]
pub(super) struct PodsChanged {
    waiting: Mutex<HashMap<SetKey, Arc<Listener>>>,
}

/// What wakes one reconcile, and whether its set changed since it began.
#[derive(Default)]
struct Listener {
    notify: Notify,
    set_changed: AtomicBool,
}

impl PodsChanged {
    /// Wakes the reconcile of the set `name` in `ns` if one waits (or keeps the wake-up for it,
    /// if it is not listening at this instant).
    pub(super) fn changed(&self, ns: &str, name: &str) {
        let waiting = self.waiting.lock().expect("pods changed lock");
        if let Some(listener) = waiting.get(&(ns.to_owned(), name.to_owned())) {
            listener.notify.notify_one();
        }
    }

    /// The set `name` in `ns` changed in what can change a plan (the set watch's fingerprint):
    /// its reconcile waiting for creates plans no more.
    pub(super) fn set_changed(&self, ns: &str, name: &str) {
        let waiting = self.waiting.lock().expect("pods changed lock");
        if let Some(listener) = waiting.get(&(ns.to_owned(), name.to_owned())) {
            listener.set_changed.store(true, Ordering::SeqCst);
            listener.notify.notify_one();
        }
    }

    /// Listens for the changes of the set's pods until the guard is dropped. A reconcile
    /// listens from its start (once admitted), before it reads the caches: a change that lands
    /// while it plans is kept (a [`Notify`] permit) and has it plan again as soon as it acts,
    /// instead of waiting for the whole reconcile to end.
    pub(super) fn listen(&self, ns: &str, name: &str) -> Listening<'_> {
        let key = (ns.to_owned(), name.to_owned());
        let listener = Arc::new(Listener::default());
        self.waiting
            .lock()
            .expect("pods changed lock")
            .insert(key.clone(), Arc::clone(&listener));
        Listening {
            changes: self,
            key,
            listener,
        }
    }
}

/// A reconcile listening ([`PodsChanged::listen`]).
pub(super) struct Listening<'a> {
    changes: &'a PodsChanged,
    key: SetKey,
    listener: Arc<Listener>,
}

impl Listening<'_> {
    /// Whether its set changed since it began listening.
    fn set_changed(&self) -> bool {
        self.listener.set_changed.load(Ordering::SeqCst)
    }
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        let mut waiting = self.changes.waiting.lock().expect("pods changed lock");
        if waiting
            .get(&self.key)
            .is_some_and(|l| Arc::ptr_eq(l, &self.listener))
        {
            waiting.remove(&self.key);
        }
    }
}

/// What a plan made again while creates are in flight needs of the reconcile.
pub(super) struct Replan<'a> {
    pub(super) ctx: &'a Arc<Context>,
    pub(super) set: &'a StatefulSet,
    pub(super) set_ref: &'a ObjectReference,
    pub(super) settings: &'a plan::Settings,
    /// The snapshot's `reserved` and `also_held`, as the reconcile set them.
    pub(super) reserved: &'a BTreeSet<i32>,
    pub(super) also_held: &'a Option<drain_api::names::OrdinalRange>,
    /// The tenure of the Lease the reconcile was admitted in.
    pub(super) tenure: Tenure,
}

type Round<'a> = Pin<Box<dyn Future<Output = Vec<(i32, ActError)>> + Send + 'a>>;

/// What [`act_while_pods_go`] carried out.
pub(super) struct Carried {
    /// The actions that failed, by ordinal.
    pub(super) failed: Vec<(i32, ActError)>,
    /// Every action carried out: the plan's, then those planned meanwhile.
    pub(super) actions: Vec<Action>,
    /// The state of each ordinal acted on meanwhile, as the plan that acted on it saw it (the
    /// reconcile's own plan is older for those: a drain it saw running has finished, a pod it
    /// saw has gone). Without it, an ordinal cleaned up meanwhile would never be reported done:
    /// its claims and drain pod are gone by the next reconcile.
    pub(super) status: BTreeMap<i32, plan::OrdinalState>,
    /// The pods of the ordinals acted on meanwhile, as that plan observed them (for the
    /// metrics: a drain's duration is read from its pod).
    pub(super) pods: Vec<plan::PodObs>,
}

impl Carried {
    /// `plan` and `snap` with what was acted on meanwhile: its actions, and the newer state
    /// and pods of those ordinals.
    pub(super) fn merge_into(
        self,
        plan: &mut plan::Plan,
        snap: &mut plan::Snapshot,
    ) -> Vec<(i32, ActError)> {
        plan.actions = self.actions;
        plan.status.extend(self.status);
        let newer: BTreeSet<i32> = self.pods.iter().map(|p| p.ordinal).collect();
        snap.pods.retain(|p| !newer.contains(&p.ordinal));
        snap.pods.extend(self.pods);
        snap.pods.sort_by_key(|p| p.ordinal);
        self.failed
    }
}

/// The actions planned meanwhile for the ordinals not acted on yet, with their state and pods.
#[derive(Default)]
struct Meanwhile {
    actions: Vec<Action>,
    status: BTreeMap<i32, plan::OrdinalState>,
    pods: Vec<plan::PodObs>,
}

/// Carries out `actions` ([`act::apply`]); while creates of drain pods or deletes of drained
/// claims are among them and in flight, plans again each time a pod or drain pod of the set
/// changes and carries out, beside them, the creates and the cleanups of the ordinals not acted
/// on yet. Returns what it carried out.
pub(super) async fn act_while_pods_go<K: ServedSet>(
    replan: &Replan<'_>,
    listening: &Listening<'_>,
    cluster: &KubeCluster<'_, K>,
    act_ctx: &ActCtx<'_>,
    actions: &[Action],
) -> Carried {
    let urgent = |a: &Action| {
        matches!(
            a,
            Action::CreateDrainPod { .. } | Action::DeleteClaims { .. }
        )
    };
    if !actions.iter().any(urgent) || !opted_in(replan.set) {
        return Carried {
            failed: act::apply(cluster, act_ctx, actions).await,
            actions: actions.to_vec(),
            status: BTreeMap::new(),
            pods: Vec::new(),
        };
    }
    let mut acted: BTreeSet<i32> = actions.iter().map(Action::ordinal).collect();
    let mut all = actions.to_vec();
    let (mut status, mut pods) = (BTreeMap::new(), Vec::new());
    let mut rounds: FuturesUnordered<Round<'_>> = FuturesUnordered::new();
    rounds.push(Box::pin(act::apply(cluster, act_ctx, actions)));
    let mut failed = Vec::new();
    let mut replanning = true;
    loop {
        tokio::select! {
            biased;
            done = rounds.next() => match done {
                Some(f) => failed.extend(f),
                None => break,
            },
            () = listening.listener.notify.notified(), if replanning => {
                if listening.set_changed() {
                    info!("the set changed while creates or claim deletes were in flight; its next reconcile plans the rest");
                    replanning = false;
                    continue;
                }
                let Meanwhile { actions: new, status: states, pods: seen } =
                    actions_meanwhile::<K>(replan, &acted);
                if new.is_empty() || !cluster_may_act(replan) {
                    continue;
                }
                status.extend(states);
                pods.extend(seen);
                if new.iter().any(|a| matches!(a, Action::CreateDrainPod { .. })) {
                    info!(actions = ?new, "acting on pods gone while creates were in flight");
                } else {
                    info!(actions = ?new, "acting on drains finished while claim deletes were in flight");
                }
                acted.extend(new.iter().map(Action::ordinal));
                all.extend(new.iter().cloned());
                rounds.push(Box::pin(async move {
                    // A seam of its own: its own live read of the set, after its creates.
                    let cluster =
                        KubeCluster::<K>::new(
                            replan.ctx,
                            replan.set,
                            replan.set_ref.clone(),
                            replan.tenure,
                        );
                    act::apply(&cluster, act_ctx, &new).await
                }));
            }
        }
    }
    Carried {
        failed,
        actions: all,
        status,
        pods,
    }
}

fn cluster_may_act(replan: &Replan<'_>) -> bool {
    replan.ctx.config.leadership.fence() == Some(replan.tenure)
}

/// What a plan made now from the caches (with the creates in flight shown as Pending drain
/// pods) asks for, of the ordinals not `acted` on yet and not held by a pod made by hand
/// ([`meanwhile`]).
fn actions_meanwhile<K: ServedSet>(replan: &Replan<'_>, acted: &BTreeSet<i32>) -> Meanwhile {
    let ctx = replan.ctx;
    let id = set_id(K::KIND, replan.set);
    let unconfirmed = ctx.memory.read(&id, |m| m.unconfirmed);
    let mut snap = observe_set(ctx, K::KIND, replan.set, false, replan.tenure);
    snap.reserved = replan.reserved.clone();
    snap.also_held = replan.also_held.clone();
    let taken: BTreeSet<i32> = ctx.memory.read(&id, |m| m.taken.keys().copied().collect());
    let skip: BTreeSet<i32> = acted.union(&taken).copied().collect();
    let planned = plan::plan(&snap, replan.settings, Timestamp::now());
    let actions = meanwhile(planned.actions, &skip, unconfirmed);
    let taken: BTreeSet<i32> = actions.iter().map(Action::ordinal).collect();
    Meanwhile {
        status: (planned.status.into_iter())
            .filter(|(o, _)| taken.contains(o))
            .collect(),
        pods: (snap.pods.into_iter())
            .filter(|p| taken.contains(&p.ordinal))
            .collect(),
        actions,
    }
}

/// Of the actions `planned`, those carried out beside the ones in flight, for the ordinals not
/// in `skip`:
/// - a drain proven finished: all of its ordinal's actions, in order (the ordinal's plan has
///   its claims deleted);
/// - a pod gone: its drain pod's create, unless the set's creates wait for their live reads
///   (`unconfirmed`, [`act::Cluster::confirm_first`]): a create is shown in flight only once it
///   is sent, so one waiting for its read would not hold its slot.
fn meanwhile(planned: Vec<Action>, skip: &BTreeSet<i32>, unconfirmed: bool) -> Vec<Action> {
    let finished: BTreeSet<i32> = planned
        .iter()
        .filter(|a| matches!(a, Action::DeleteClaims { .. }))
        .map(Action::ordinal)
        .collect();
    planned
        .into_iter()
        .filter(|a| !skip.contains(&a.ordinal()))
        .filter(|a| {
            finished.contains(&a.ordinal())
                || (!unconfirmed && matches!(a, Action::CreateDrainPod { .. }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::DeleteWhy;

    fn create(ordinal: i32) -> Action {
        Action::CreateDrainPod {
            ordinal,
            claims: Default::default(),
            attempt: 1,
            new_series: None,
        }
    }

    /// The actions of an ordinal whose drain is proven finished.
    fn cleanup(ordinal: i32) -> Vec<Action> {
        vec![
            Action::RetainVolumes {
                ordinal,
                claims: vec![],
                until: Timestamp::UNIX_EPOCH,
            },
            Action::DeleteClaims {
                ordinal,
                claims: vec![],
            },
            Action::DeleteDrainPod {
                ordinal,
                name: format!("web-{ordinal}"),
                uid: "u".into(),
                resource_version: None,
                why: DeleteWhy::Succeeded,
            },
        ]
    }

    fn failure(ordinal: i32) -> Action {
        Action::DeleteDrainPod {
            ordinal,
            name: format!("web-{ordinal}"),
            uid: "u".into(),
            resource_version: None,
            why: DeleteWhy::Failed,
        }
    }

    #[test]
    fn what_was_acted_on_meanwhile_is_reported_with_the_state_that_plan_saw() {
        let draining = plan::OrdinalState::Draining {
            attempt: 1,
            progress: None,
            note: None,
        };
        let done = plan::OrdinalState::Done { at: "now".into() };
        let mut plan = plan::Plan {
            actions: vec![create(4)],
            status: BTreeMap::from([(4, draining.clone()), (2, draining.clone())]),
            requeue_after: None,
            quiet: Default::default(),
        };
        let mut snap = plan::Snapshot::default();
        let mut actions = vec![create(4)];
        actions.extend(cleanup(2));
        let carried = Carried {
            failed: Vec::new(),
            actions: actions.clone(),
            status: BTreeMap::from([(2, done.clone())]),
            pods: Vec::new(),
        };
        assert!(carried.merge_into(&mut plan, &mut snap).is_empty());
        assert_eq!(
            plan.actions, actions,
            "counted with the actions carried out meanwhile"
        );
        assert_eq!(
            plan.status,
            BTreeMap::from([(4, draining), (2, done)]),
            "a drain cleaned up meanwhile is reported done, not still draining"
        );
    }

    #[test]
    fn meanwhile_takes_the_creates_and_the_whole_cleanups_of_the_ordinals_not_acted_on() {
        let mut planned = vec![create(4), failure(3)];
        planned.extend(cleanup(2));
        planned.extend(cleanup(1));
        planned.push(create(0));
        let skip = BTreeSet::from([1, 0]);
        let taken = meanwhile(planned.clone(), &skip, false);
        let mut want = vec![create(4)];
        want.extend(cleanup(2));
        assert_eq!(
            taken, want,
            "a failure's handling waits for the next reconcile"
        );
        let unconfirmed = meanwhile(planned, &skip, true);
        assert_eq!(
            unconfirmed,
            cleanup(2),
            "no create while the set's creates wait for their live reads; cleanups go on"
        );
    }

    #[tokio::test]
    async fn a_change_wakes_the_reconcile_that_listens_and_only_while_it_does() {
        let changes = PodsChanged::default();
        changes.changed("ns", "web");
        let listening = changes.listen("ns", "web");
        let woken =
            || futures::FutureExt::now_or_never(listening.listener.notify.notified()).is_some();
        assert!(!woken(), "a change before it listened is not kept");
        changes.changed("ns", "other");
        assert!(!woken(), "another set's change");
        changes.changed("ns", "web");
        assert!(woken(), "a change while it listens, kept until it looks");
        assert!(!listening.set_changed());
        changes.set_changed("ns", "web");
        assert!(woken() && listening.set_changed(), "its set changed");
        drop(listening);
        assert!(
            changes.waiting.lock().unwrap().is_empty(),
            "no longer listening"
        );
    }
}
