//! Drain pods on lost nodes. A node that stops answering keeps its pods, and a deleted pod of it
//! stays `Terminating`, until the node comes back, its Node object is deleted, or a person
//! declares it shut down (the `node.kubernetes.io/out-of-service` taint). The drain cannot go on
//! there: the set is told which node and what to do, the pod is asked to stop (so that it goes
//! as soon as the cluster lets it, whatever taints its template tolerates), and a new drain pod
//! starts elsewhere once it is gone. A removed stateful pod stuck on such a node fences its
//! ordinal: no drain starts, even if the pod is force deleted, until the node is ready again,
//! deleted or declared out of service. The claims are kept throughout.

use std::time::Duration;

use super::actions::{Action, DeleteWhy, OrdinalState};
use super::observed::{DrainPod, NodeHealth, PodObs};
use super::ordinal::{Ordinal, Planner, add, delete_unfinished};

/// The taint that declares a node shut down (non-graceful node shutdown).
pub const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

impl Planner<'_> {
    /// The state of a drain pod, not finished, whose node is lost, if it is: `stuck` naming the
    /// node and the remedy, warned once; the pod is asked to stop unless it is being deleted.
    /// A node not ready for less than `node_lost_after` is waited for (requeued).
    pub(super) fn on_lost_node(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let node = drain.node.as_deref()?;
        let what = match self.nodes.get(node)? {
            NodeHealth::Ready { .. } | NodeHealth::Unreadable { .. } => return None,
            NodeHealth::Gone => format!(
                "drain pod {} is bound to node {node}, whose Node object was deleted: the \
                 cluster removes the pod, then a new drain pod resumes on another node from \
                 what the claims hold",
                pod.name
            ),
            NodeHealth::NotReady {
                since,
                why,
                out_of_service,
            } => {
                let since = since.unwrap_or(jiff::Timestamp::MIN);
                let lost_at = add(since, self.settings.node_lost_after);
                if lost_at > self.now {
                    self.requeue_at(lost_at);
                    return None;
                }
                let remedy = if *out_of_service {
                    format!(
                        "it is tainted {OUT_OF_SERVICE}: the cluster removes the pod, then a new \
                         drain pod resumes on another node from what the claims hold"
                    )
                } else {
                    format!(
                        "if the node is down for good, delete its Node object (kubectl delete \
                         node {node}) or declare it shut down (kubectl taint node {node} \
                         {OUT_OF_SERVICE}=nodeshutdown:NoExecute); the cluster then removes the \
                         pod and a new drain pod resumes on another node from what the claims \
                         hold. If the node comes back, the drain resumes by itself"
                    )
                };
                format!(
                    "drain pod {} is bound to node {node}, which has not been ready since \
                     {since} ({why}): the drain cannot go on there and the pod was asked to \
                     stop; the claims are kept. {remedy}",
                    pod.name
                )
            }
        };
        if !pod.terminating {
            self.act(delete_unfinished(
                ord,
                pod,
                drain,
                DeleteWhy::NodeLost,
                true,
            ));
        }
        if !ord.record.lost_nodes.iter().any(|n| n == node) && !ord.live.is_empty() {
            let mut nodes = ord.record.lost_nodes.clone();
            nodes.push(node.to_owned());
            nodes.sort();
            self.act(Action::RecordLostNodes {
                ordinal: ord.ordinal,
                claims: ord.live_refs(),
                nodes,
            });
        }
        self.plan.on_lost_nodes.insert(ord.ordinal, node.to_owned());
        let state = OrdinalState::Stuck {
            attempt: ord.record.attempts + 1,
            reason: what,
        };
        Some(self.told(ord, state, "DrainNodeLost"))
    }

    /// A note for the `draining` status when the drain pod's node could not be read (RBAC
    /// denied `get` on nodes?): a lost node would go unnoticed.
    pub(super) fn node_unreadable(
        &mut self,
        ord: &Ordinal<'_>,
        drain: &DrainPod,
    ) -> Option<String> {
        let node = drain.node.as_deref()?;
        let NodeHealth::Unreadable { error } = self.nodes.get(node)? else {
            return None;
        };
        let note = format!(
            "could not read node {node} of the drain pod, which is not ready ({error}): a lost \
             node would go unnoticed; grant the controller get on nodes (docs/operations.md: \
             Nodes that fail)"
        );
        Some(self.noted(ord, "DrainNodeUnreadable", note))
    }
}

/// What the scheduler says of a pod whose volumes may only be used on nodes it cannot run on
/// (the volume binding plugin's words in Kubernetes 1.36, and in older versions).
const VOLUME_NODE_AFFINITY: [&str; 2] = [
    "didn't match PersistentVolume's node affinity",
    "volume node affinity conflict",
];

impl Planner<'_> {
    /// The state of a drain pod that cannot be scheduled because its claims' volumes are bound
    /// to a node it cannot run on (`local` volumes, whose data cannot move), if it is: `blocked`
    /// and warned once, never deleted nor counted as an attempt; the scheduler starts it when
    /// that node is back. When the ordinal keeps lost nodes off its drain pods, the node the
    /// volumes need may be one of them: the record is cleared and the pod, which has not
    /// started, replaced by one that may go there.
    pub(super) fn node_bound(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let blocker = drain.blocker.as_ref().filter(|b| {
            !drain.started
                && b.reason == "Unschedulable"
                && VOLUME_NODE_AFFINITY.iter().any(|m| b.message.contains(m))
        })?;
        if !ord.record.lost_nodes.is_empty() {
            // The pod goes before the record is cleared: a crash in between leaves the record,
            // so the next pod (made with the avoidance again) is replaced the same way; cleared
            // first, a crash would leave this pod, which can never be placed, blocked for ever.
            if !pod.terminating {
                self.act(delete_unfinished(
                    ord,
                    pod,
                    drain,
                    DeleteWhy::NodeBound,
                    true,
                ));
            }
            if !ord.live.is_empty() {
                self.act(Action::RecordLostNodes {
                    ordinal: ord.ordinal,
                    claims: ord.live_refs(),
                    nodes: Vec::new(),
                });
            }
            return Some(OrdinalState::Waiting {
                reason: format!(
                    "drain pod {} cannot be scheduled: its volumes can only be used on a node \
                     it was kept off ({} lost there earlier): replacing it by one that may go \
                     there",
                    pod.name,
                    ord.record.lost_nodes.join(", ")
                ),
            });
        }
        let state = OrdinalState::Blocked {
            reason: format!(
                "drain pod {} cannot be scheduled: its claims' volumes can only be used on a \
                 node it cannot run on ({}). The data cannot move: the drain starts when that \
                 node is back; the claims are kept (if the node is gone for good, so is its \
                 data: delete the claims yourself once you gave it up)",
                pod.name, blocker.message
            ),
        };
        Some(self.told(ord, state, "DrainNodeBound"))
    }
}

/// How long a node must have been ready again before a drain starts on the volumes of a pod
/// removed while it was not: a kubelet that comes back kills the containers of pods no longer
/// in the API within seconds (a housekeeping pass every 2 s, a 1 s grace period).
pub const FENCE_SETTLE: Duration = Duration::from_secs(30);

/// How often an ordinal fenced by a node that is not ready looks at it again (a node's changes
/// wake no watch).
pub const RECHECK_FENCE: Duration = Duration::from_secs(15);

impl Planner<'_> {
    /// The removed stateful pod, still being deleted past its grace period, is on a node that
    /// is not ready: the node is recorded on the claims (so that a force delete of the pod does
    /// not start the drain while its containers may still write the volume), and once the node
    /// is lost the set is told, as for a drain pod.
    pub(super) fn removed_pod_on_lost_node(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
    ) -> Option<OrdinalState> {
        let node = pod.deletion.as_ref()?.node.as_deref()?;
        let lost = match self.nodes.get(node)? {
            NodeHealth::Ready { .. } | NodeHealth::Unreadable { .. } => {
                // Still there after its grace period on a node that answers, so far: its
                // node is looked at again soon (a node's changes wake no watch).
                self.requeue_at(add(self.now, RECHECK_FENCE));
                return None;
            }
            NodeHealth::Gone => Some("its Node object was deleted".to_owned()),
            NodeHealth::NotReady { since, why, .. } => {
                let since = since.unwrap_or(jiff::Timestamp::MIN);
                let lost_at = add(since, self.settings.node_lost_after);
                if lost_at > self.now {
                    self.requeue_at(lost_at);
                    None
                } else {
                    Some(format!("it has not been ready since {since} ({why})"))
                }
            }
        };
        if ord.record.fence_node.as_deref() != Some(node) && !ord.live.is_empty() {
            self.act(Action::RecordFence {
                ordinal: ord.ordinal,
                claims: ord.live_refs(),
                node: Some(node.to_owned()),
            });
        }
        let Some(lost) = lost else {
            return Some(OrdinalState::Waiting {
                reason: format!(
                    "pod {} is being deleted on node {node}, which is not ready",
                    pod.name
                ),
            });
        };
        let reason = format!(
            "pod {} is still being deleted on node {node}: {lost}. Its containers may still run \
             there and write the volumes, so its drain does not start, also if the pod is force \
             deleted. If the node is down for good, delete its Node object (kubectl delete node \
             {node}) or declare it shut down (kubectl taint node {node} \
             {OUT_OF_SERVICE}=nodeshutdown:NoExecute): the cluster then removes the pod and the \
             drain starts on another node. The claims are kept",
            pod.name
        );
        Some(self.told(ord, OrdinalState::Blocked { reason }, "DrainNodeLost"))
    }

    /// The state of an ordinal whose removed pod was seen on a node that was not ready (its
    /// claims record that node), if its drain may not start yet: the node must be ready again
    /// for [`FENCE_SETTLE`], deleted, or declared out of service. Once it is, the record is
    /// cleared and the drain may start.
    pub(super) fn fenced(&mut self, ord: &Ordinal<'_>) -> Option<OrdinalState> {
        let node = ord.record.fence_node.as_deref()?;
        let clear = Action::RecordFence {
            ordinal: ord.ordinal,
            claims: ord.live_refs(),
            node: None,
        };
        let why = match self.nodes.get(node) {
            Some(NodeHealth::Ready { since }) => {
                let at = add(since.unwrap_or(jiff::Timestamp::MIN), FENCE_SETTLE);
                if at <= self.now {
                    self.act(clear);
                    return None;
                }
                self.requeue_at(at);
                return Some(OrdinalState::Waiting {
                    reason: format!(
                        "node {node}, where the removed pod was last seen, is ready again: the \
                         drain starts at {at}, once its kubelet has stopped the pod's containers"
                    ),
                });
            }
            Some(
                NodeHealth::Gone
                | NodeHealth::NotReady {
                    out_of_service: true,
                    ..
                },
            ) => {
                self.act(clear);
                return None;
            }
            Some(NodeHealth::NotReady { why, .. }) => format!("not ready: {why}"),
            Some(NodeHealth::Unreadable { error }) => format!("could not be read: {error}"),
            None => "not read".to_owned(),
        };
        self.requeue_at(add(self.now, RECHECK_FENCE));
        let reason = format!(
            "the removed pod {}-{} was last seen on node {node} while that node was not ready \
             (force deleted?), and the node is {why}: the pod's containers may still run there \
             and write the volumes, so no drain pod starts until the node is ready again, \
             deleted (kubectl delete node {node}), or declared shut down (kubectl taint node \
             {node} {OUT_OF_SERVICE}=nodeshutdown:NoExecute). The claims are kept",
            self.set_name, ord.ordinal
        );
        Some(self.told(ord, OrdinalState::Blocked { reason }, "DrainNodeLost"))
    }

    /// `state`, warned as `reason` unless the last status showed it already.
    fn told(
        &mut self,
        ord: &Ordinal<'_>,
        state: OrdinalState,
        reason: &'static str,
    ) -> OrdinalState {
        if ord.previous != Some(&state) {
            let (OrdinalState::Blocked { reason: message }
            | OrdinalState::Stuck {
                reason: message, ..
            }) = &state
            else {
                unreachable!("told of a state without a reason")
            };
            self.act(Action::Warn {
                ordinal: ord.ordinal,
                reason,
                message: message.clone(),
            });
        }
        state
    }
}
