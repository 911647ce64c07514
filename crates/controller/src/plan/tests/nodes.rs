//! Drain pods on lost nodes: stuck with the node and the remedy, warned once, asked to stop,
//! never a claim deleted for it; a node not ready for a moment is waited for.

use super::*;
use crate::plan::nodes::{FENCE_SETTLE, RECHECK_FENCE};

fn on_node(mut s: Snapshot, node: &str, health: NodeHealth) -> Snapshot {
    s.nodes.insert(node.to_owned(), health);
    s
}

fn not_ready(since: i64) -> NodeHealth {
    NodeHealth::NotReady {
        since: Some(t(since)),
        why: "Unknown: NodeStatusUnknown: Kubelet stopped posting node status.".to_owned(),
        out_of_service: false,
    }
}

fn not_ready_pod(ordinal: i32, c: &Claim) -> PodObs {
    let mut pod = drain_pod(ordinal, DrainPhase::Running, &[c]);
    drain_of(&mut pod).ready = false;
    pod
}

fn warnings(p: &Plan) -> Vec<&str> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::Warn {
                reason, message, ..
            } if *reason == "DrainNodeLost" => Some(message.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_drain_pod_on_a_node_lost_is_stuck_naming_it_warned_once_and_asked_to_stop() {
    let c = with_record(claim("data", 2), running_record(2));
    let s = on_node(
        snap(2, vec![c.clone()], vec![not_ready_pod(2, &c)]),
        "n1",
        not_ready(-61),
    );
    let p = plan(&s, &settings(), t(0));
    assert!(
        p.actions.contains(&stop_pod(2, DeleteWhy::NodeLost)),
        "{:?}",
        p.actions
    );
    let told = warnings(&p);
    assert_eq!(told.len(), 1, "{:?}", p.actions);
    for named in [
        "node n1",
        "web-2",
        "Kubelet stopped posting node status",
        "kubectl delete node n1",
        "kubectl taint node n1 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
        "claims are kept",
    ] {
        assert!(told[0].contains(named), "{named:?} not in {}", told[0]);
    }
    assert!(
        matches!(&p.status[&2], OrdinalState::Stuck { attempt: 1, reason } if reason == told[0])
    );
    assert_eq!(p.on_lost_nodes.get(&2).map(String::as_str), Some("n1"));
    // The node is recorded on the claims, so that later drain pods are kept off it.
    assert!(
        p.actions.contains(&Action::RecordLostNodes {
            ordinal: 2,
            claims: refs(&[&c]),
            nodes: vec!["n1".to_owned()],
        }),
        "{:?}",
        p.actions
    );
    // Not a failed attempt, and nothing else is done to the claims.
    assert_eq!(p.actions.len(), 3, "{:?}", p.actions);

    // The next reconcile, with that status shown and the node recorded: asked again (its
    // delete may have failed), not warned again.
    let mut again = s.clone();
    again.previous = p.status.clone();
    again.claims[0].record.lost_nodes = vec!["n1".to_owned()];
    let p2 = plan(&again, &settings(), t(30));
    assert!(warnings(&p2).is_empty(), "{:?}", p2.actions);
    assert_eq!(p2.actions, vec![stop_pod(2, DeleteWhy::NodeLost)]);
    assert_eq!(p2.status, p.status);
}

#[test]
fn a_node_not_ready_for_less_than_the_lost_time_is_waited_for() {
    let c = with_record(claim("data", 2), running_record(2));
    let s = on_node(
        snap(2, vec![c.clone()], vec![not_ready_pod(2, &c)]),
        "n1",
        not_ready(-20),
    );
    let p = plan(&s, &settings(), t(0));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(
        matches!(p.status[&2], OrdinalState::Draining { .. }),
        "{:?}",
        p.status
    );
    assert_eq!(p.requeue_after, Some(Duration::from_secs(40)));
    assert!(p.on_lost_nodes.is_empty());
    // A shorter lost time counts it lost already.
    let quick = Settings {
        node_lost_after: Duration::from_secs(10),
        ..settings()
    };
    assert!(matches!(
        plan(&s, &quick, t(0)).status[&2],
        OrdinalState::Stuck { .. }
    ));
}

#[test]
fn a_ready_node_or_a_drain_pod_on_another_node_changes_nothing() {
    let c = with_record(claim("data", 2), running_record(2));
    for s in [
        on_node(
            snap(2, vec![c.clone()], vec![not_ready_pod(2, &c)]),
            "n1",
            NodeHealth::Ready { since: None },
        ),
        on_node(
            snap(2, vec![c.clone()], vec![not_ready_pod(2, &c)]),
            "n9",
            not_ready(-600),
        ),
    ] {
        let p = plan(&s, &settings(), t(0));
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert!(matches!(p.status[&2], OrdinalState::Draining { .. }));
    }
}

#[test]
fn a_deleted_node_or_one_declared_out_of_service_says_the_cluster_removes_the_pod() {
    let c = with_record(claim("data", 2), running_record(2));
    let tainted = NodeHealth::NotReady {
        since: Some(t(-600)),
        why: "Unknown".to_owned(),
        out_of_service: true,
    };
    for (health, said) in [
        (NodeHealth::Gone, "Node object was deleted"),
        (tainted, "it is tainted node.kubernetes.io/out-of-service"),
    ] {
        let s = on_node(
            snap(2, vec![c.clone()], vec![not_ready_pod(2, &c)]),
            "n1",
            health,
        );
        let p = plan(&s, &settings(), t(0));
        let told = warnings(&p);
        assert!(told.len() == 1 && told[0].contains(said), "{:?}", p.actions);
        assert!(told[0].contains("resumes on another node"), "{}", told[0]);
        assert!(matches!(p.status[&2], OrdinalState::Stuck { .. }));
    }
}

#[test]
fn a_drain_pod_terminating_on_a_lost_node_is_not_a_stuck_attempt_however_long() {
    let c = with_record(claim("data", 2), running_record(2));
    let pod = deleting(not_ready_pod(2, &c), -4000, &[], Some("n1"));
    let s = on_node(snap(2, vec![c.clone()], vec![pod]), "n1", not_ready(-4000));
    let p = plan(&s, &settings(), t(0));
    assert!(
        !p.actions.iter().any(|a| matches!(
            a,
            Action::RecordFailure { .. }
                | Action::DeleteDrainPod { .. }
                | Action::DeleteClaims { .. }
        )),
        "{:?}",
        p.actions
    );
    assert_eq!(warnings(&p).len(), 1);
    assert!(matches!(p.status[&2], OrdinalState::Stuck { .. }));
}

#[test]
fn a_drain_that_proved_it_finished_deletes_its_claims_though_its_node_is_lost() {
    let c = with_record(claim("data", 2), running_record(2));
    let pod = drain_pod(2, DrainPhase::Succeeded, &[&c]);
    let s = on_node(snap(2, vec![c.clone()], vec![pod]), "n1", NodeHealth::Gone);
    let p = plan(&s, &settings(), t(0));
    assert!(
        p.actions
            .iter()
            .any(|a| matches!(a, Action::DeleteClaims { .. })),
        "{:?}",
        p.actions
    );
    assert!(warnings(&p).is_empty());
}

#[test]
fn a_drain_pod_on_a_lost_node_whose_ordinal_came_back_is_told_too() {
    // Scaled back up: the returning pod needs the name the drain pod holds on the lost node.
    let c = with_record(claim("data", 2), running_record(2));
    let s = on_node(
        snap(3, vec![c.clone()], vec![not_ready_pod(2, &c)]),
        "n1",
        NodeHealth::Gone,
    );
    let p = plan(&s, &settings(), t(0));
    assert_eq!(warnings(&p).len(), 1, "{:?}", p.actions);
    assert!(p.actions.contains(&stop_pod(2, DeleteWhy::NodeLost)));
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::DeleteClaims { .. }))
    );
}

#[test]
fn a_node_that_cannot_be_read_is_a_note_warned_once() {
    let c = with_record(claim("data", 2), running_record(2));
    let unreadable = NodeHealth::Unreadable {
        error: "nodes \"n1\" is forbidden".to_owned(),
    };
    let s = on_node(
        snap(2, vec![c.clone()], vec![not_ready_pod(2, &c)]),
        "n1",
        unreadable,
    );
    let p = plan(&s, &settings(), t(0));
    let Some(OrdinalState::Draining {
        note: Some(note), ..
    }) = p.status.get(&2)
    else {
        panic!("{:?}", p.status)
    };
    assert!(
        note.contains("forbidden") && note.contains("get on nodes"),
        "{note}"
    );
    assert!(
        matches!(
            p.actions.as_slice(),
            [Action::Warn {
                reason: "DrainNodeUnreadable",
                ..
            }]
        ),
        "{:?}",
        p.actions
    );
    let mut again = s.clone();
    again.previous = p.status.clone();
    assert!(plan(&again, &settings(), t(5)).actions.is_empty());
}

// ---- the removed stateful pod on a lost node: the fence ----------------------------------

fn fenced(mut c: Claim, node: &str) -> Claim {
    c.record.fence_node = Some(node.to_owned());
    c
}

fn fence(ordinal: i32, claims: &[&Claim], node: Option<&str>) -> Action {
    Action::RecordFence {
        ordinal,
        claims: refs(claims),
        node: node.map(str::to_owned),
    }
}

fn creates(p: &Plan) -> bool {
    p.actions
        .iter()
        .any(|a| matches!(a, Action::CreateDrainPod { .. }))
}

#[test]
fn a_removed_pod_stuck_on_a_node_not_ready_fences_its_claims_then_is_told_once_lost() {
    let c = claim("data", 2);
    // Past its grace period (due 5 s ago) on a node not ready for 20 s: fenced, not told yet.
    let pod = deleting(stateful_pod(2), -5, &[], Some("n1"));
    let s = on_node(
        snap(2, vec![c.clone()], vec![pod.clone()]),
        "n1",
        not_ready(-20),
    );
    let p = plan(&s, &settings(), t(0));
    assert_eq!(p.actions, vec![fence(2, &[&c], Some("n1"))]);
    assert!(
        matches!(p.status[&2], OrdinalState::Waiting { .. }),
        "{:?}",
        p.status
    );
    assert_eq!(p.requeue_after, Some(Duration::from_secs(40)));
    // Lost: told, with the node and the remedy; the fence already recorded is not written again.
    let c = fenced(c, "n1");
    let s = on_node(snap(2, vec![c.clone()], vec![pod]), "n1", not_ready(-61));
    let p = plan(&s, &settings(), t(0));
    let told = warnings(&p);
    assert_eq!((p.actions.len(), told.len()), (1, 1), "{:?}", p.actions);
    for named in [
        "pod web-2",
        "node n1",
        "also if the pod is force deleted",
        "kubectl delete node n1",
    ] {
        assert!(told[0].contains(named), "{named:?} not in {}", told[0]);
    }
    assert!(matches!(p.status[&2], OrdinalState::Blocked { .. }));
}

#[test]
fn a_removed_pod_past_its_grace_period_on_a_ready_node_is_looked_at_again_soon() {
    let c = claim("data", 2);
    let pod = deleting(stateful_pod(2), -5, &[], Some("n1"));
    let s = on_node(
        snap(2, vec![c], vec![pod]),
        "n1",
        NodeHealth::Ready { since: None },
    );
    let p = plan(&s, &settings(), t(0));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(p.requeue_after, Some(RECHECK_FENCE));
}

#[test]
fn a_removed_pod_within_its_grace_period_is_waited_for_and_looked_at_when_it_ends() {
    let c = claim("data", 2);
    let pod = deleting(stateful_pod(2), 10, &[], None);
    let p = plan(&snap(2, vec![c], vec![pod]), &settings(), t(0));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(p.requeue_after, Some(Duration::from_secs(12)));
}

#[test]
fn a_fenced_ordinal_starts_no_drain_while_its_node_is_not_ready_or_unknown() {
    let c = fenced(claim("data", 2), "n1");
    let unreadable = NodeHealth::Unreadable {
        error: "forbidden".to_owned(),
    };
    for s in [
        on_node(snap(2, vec![c.clone()], vec![]), "n1", not_ready(-600)),
        on_node(snap(2, vec![c.clone()], vec![]), "n1", unreadable),
        // Not read at all: not taken as ready.
        snap(2, vec![c.clone()], vec![]),
    ] {
        let p = plan(&s, &settings(), t(0));
        assert!(!creates(&p), "{:?}", p.actions);
        let told = warnings(&p);
        assert!(
            told.len() == 1
                && told[0].contains("may still run there")
                && told[0].contains("node n1"),
            "{:?}",
            p.actions
        );
        assert!(matches!(p.status[&2], OrdinalState::Blocked { .. }));
        assert_eq!(p.requeue_after, Some(RECHECK_FENCE));
        // Told once.
        let mut again = s.clone();
        again.previous = p.status.clone();
        assert!(plan(&again, &settings(), t(5)).actions.is_empty());
    }
}

#[test]
fn a_fenced_ordinal_drains_once_its_node_is_ready_long_enough_deleted_or_out_of_service() {
    let c = fenced(claim("data", 2), "n1");
    // Ready again 10 s ago: its kubelet may still be stopping the pod's containers.
    let s = on_node(
        snap(2, vec![c.clone()], vec![]),
        "n1",
        NodeHealth::Ready {
            since: Some(t(-10)),
        },
    );
    let p = plan(&s, &settings(), t(0));
    assert!(!creates(&p) && p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(
        p.requeue_after,
        Some(FENCE_SETTLE - Duration::from_secs(10))
    );
    let out = NodeHealth::NotReady {
        since: Some(t(-600)),
        why: "Unknown".to_owned(),
        out_of_service: true,
    };
    for health in [
        NodeHealth::Ready {
            since: Some(t(-31)),
        },
        NodeHealth::Gone,
        out,
    ] {
        let s = on_node(snap(2, vec![c.clone()], vec![]), "n1", health);
        let p = plan(&s, &settings(), t(0));
        assert_eq!(
            p.actions.first(),
            Some(&fence(2, &[&c], None)),
            "{:?}",
            p.actions
        );
        assert!(creates(&p), "{:?}", p.actions);
    }
}

#[test]
fn a_fence_goes_with_the_record_when_the_ordinal_comes_back() {
    let c = fenced(claim("data", 2), "n1");
    let p = plan(&snap(3, vec![c.clone()], vec![]), &settings(), t(0));
    assert!(
        matches!(
            p.actions.as_slice(),
            [Action::ClearRecord { ordinal: 2, .. }]
        ),
        "{:?}",
        p.actions
    );
}

#[test]
fn a_new_drain_pod_is_kept_off_every_node_an_earlier_one_was_lost_on() {
    // Two claims recording different lost nodes (a crash between their writes): both avoided.
    let mut data = claim("data", 2);
    data.record.lost_nodes = vec!["n1".to_owned()];
    let mut logs = claim("logs", 2);
    logs.record.lost_nodes = vec!["n2".to_owned(), "n1".to_owned()];
    let p = plan(&snap(2, vec![data, logs], vec![]), &settings(), t(0));
    let Some(Action::CreateDrainPod { avoid_nodes, .. }) = p.actions.first() else {
        panic!("{:?}", p.actions)
    };
    assert_eq!(avoid_nodes, &["n1".to_owned(), "n2".to_owned()]);
    // A second node lost: both recorded.
    let mut c = with_record(claim("data", 2), running_record(2));
    c.record.lost_nodes = vec!["n1".to_owned()];
    let mut pod = not_ready_pod(2, &c);
    drain_of(&mut pod).node = Some("n3".to_owned());
    let s = on_node(snap(2, vec![c.clone()], vec![pod]), "n3", NodeHealth::Gone);
    let p = plan(&s, &settings(), t(0));
    assert!(
        p.actions.contains(&Action::RecordLostNodes {
            ordinal: 2,
            claims: refs(&[&c]),
            nodes: vec!["n1".to_owned(), "n3".to_owned()],
        }),
        "{:?}",
        p.actions
    );
}

// ---- data bound to a node: `local` volumes -----------------------------------------------

/// What Kubernetes 1.36's scheduler says (seen on the local cluster).
const BOUND: &str = "0/3 nodes are available: 1 node(s) didn't match Pod's node \
     affinity/selector, 2 node(s) didn't match PersistentVolume's node affinity. no new claims \
     to deallocate, preemption: 0/3 nodes are available: 3 Preemption is not helpful for \
     scheduling.";

/// A drain pod the scheduler cannot place: its volume may only be used on another node.
fn unschedulable(c: &Claim, message: &str, created: i64) -> PodObs {
    let mut pod = drain_pod(2, DrainPhase::Pending, &[c]);
    let drain = drain_of(&mut pod);
    drain.blocker = Some(Blocker {
        reason: "Unschedulable".into(),
        message: message.into(),
        definitive: false,
    });
    drain.created_at = Some(t(created));
    drain.ready = false;
    pod
}

#[test]
fn a_drain_pod_whose_volume_is_bound_to_a_node_it_cannot_use_is_blocked_never_deleted_nor_counted()
{
    let c = with_record(claim("data", 2), running_record(2));
    let mut limited = settings();
    limited.max_attempts = Some(1);
    limited.deadline = Some(Duration::from_secs(600));
    // Long past the stuck time and the deadline: still never deleted nor counted.
    let s = snap(2, vec![c.clone()], vec![unschedulable(&c, BOUND, -7200)]);
    let p = plan(&s, &limited, t(0));
    let Some(OrdinalState::Blocked { reason }) = p.status.get(&2) else {
        panic!("{:?}", p.status)
    };
    for said in [
        "web-2",
        "PersistentVolume's node affinity",
        "claims are kept",
    ] {
        assert!(reason.contains(said), "{said}: {reason}");
    }
    assert!(
        matches!(
            p.actions.as_slice(),
            [Action::Warn {
                reason: "DrainNodeBound",
                ..
            }]
        ),
        "{:?}",
        p.actions
    );
    let mut again = s.clone();
    again.previous = p.status.clone();
    let p = plan(&again, &limited, t(600));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(matches!(
        p.status.get(&2),
        Some(OrdinalState::Blocked { .. })
    ));
}

#[test]
fn the_older_schedulers_words_for_it_are_known_too() {
    let c = with_record(claim("data", 2), running_record(2));
    let older = "0/3 nodes are available: 3 node(s) had volume node affinity conflict.";
    let p = plan(
        &snap(2, vec![c.clone()], vec![unschedulable(&c, older, -7200)]),
        &settings(),
        t(0),
    );
    assert!(matches!(
        p.status.get(&2),
        Some(OrdinalState::Blocked { .. })
    ));
}

#[test]
fn a_pod_unschedulable_for_another_reason_is_still_a_stuck_attempt() {
    let c = with_record(claim("data", 2), running_record(2));
    let other = "0/3 nodes are available: 3 Insufficient cpu.";
    let p = plan(
        &snap(2, vec![c.clone()], vec![unschedulable(&c, other, -400)]),
        &settings(),
        t(0),
    );
    assert!(
        p.actions.contains(&stop_pod(2, DeleteWhy::Stuck)),
        "{:?}",
        p.actions
    );
}

#[test]
fn a_node_bound_drain_pod_kept_off_a_lost_node_is_replaced_without_the_avoidance() {
    let mut c = with_record(claim("data", 2), running_record(2));
    c.record.lost_nodes = vec!["n1".to_owned()];
    let p = plan(
        &snap(2, vec![c.clone()], vec![unschedulable(&c, BOUND, -10)]),
        &settings(),
        t(0),
    );
    assert_eq!(
        p.actions,
        vec![
            stop_pod(2, DeleteWhy::NodeBound),
            Action::RecordLostNodes {
                ordinal: 2,
                claims: refs(&[&c]),
                nodes: Vec::new(),
            },
        ]
    );
    assert!(matches!(
        p.status.get(&2),
        Some(OrdinalState::Waiting { .. })
    ));
    // The next drain pod, once the replaced one is gone and counted, may go anywhere, the
    // lost node included.
    c.record.lost_nodes.clear();
    c.record.counted_pod_uid = c.record.pod_uid.clone();
    c.record.attempts = 1;
    c.record.retry_after = Some(t(30));
    let p = plan(&snap(2, vec![c], vec![]), &settings(), t(60));
    assert!(
        p.actions.iter().any(|a| matches!(
            a,
            Action::CreateDrainPod { avoid_nodes, .. } if avoid_nodes.is_empty()
        )),
        "{:?}",
        p.actions
    );
}
