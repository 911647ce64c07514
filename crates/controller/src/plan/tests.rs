//! Tests of the drain state machine: one table row per transition, and properties over arbitrary
//! snapshots for the invariants that keep data safe.

use std::collections::BTreeMap;

use super::*;
use crate::config::OnScaleUp;
use proptest::prelude::*;
use rstest::rstest;

const SET: &str = "web";

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn claim(template: &str, ordinal: i32) -> Claim {
    Claim {
        name: format!("{template}-{SET}-{ordinal}"),
        uid: format!("uid-{template}-{ordinal}"),
        template: template.to_owned(),
        ordinal,
        terminating: false,
        record: DrainRecord::default(),
    }
}

fn with_record(mut c: Claim, record: DrainRecord) -> Claim {
    c.record = record;
    c
}

fn terminating(mut c: Claim) -> Claim {
    c.terminating = true;
    c
}

fn stateful_pod(ordinal: i32) -> PodObs {
    PodObs {
        ordinal,
        name: format!("{SET}-{ordinal}"),
        uid: format!("sts-pod-{ordinal}"),
        terminating: false,
        deletion: None,
        kind: PodKind::Other,
    }
}

/// The hash of the current drain template in these tests.
const HASH: &str = "h1";

fn drain_pod(ordinal: i32, phase: DrainPhase, claims: &[&Claim]) -> PodObs {
    let finished = matches!(phase, DrainPhase::Succeeded | DrainPhase::Failed);
    PodObs {
        ordinal,
        name: format!("{SET}-{ordinal}"),
        uid: format!("drain-pod-{ordinal}"),
        terminating: false,
        deletion: None,
        kind: PodKind::Drain(DrainPod {
            phase,
            claims: claims
                .iter()
                .map(|c| (c.name.clone(), c.uid.clone()))
                .collect(),
            failure: (phase == DrainPhase::Failed).then(|| "exit code 1".to_owned()),
            template_hash: Some(HASH.to_owned()),
            resource_version: format!("rv-{ordinal}"),
            created_at: Some(t(-100)),
            delete_requested_at: None,
            finished_at: finished.then(|| t(-1)),
            changed_at: (phase != DrainPhase::Pending).then(|| t(-90)),
            // One container drains every claim; when the pod succeeded it wrote its completion
            // record (see `without_record`).
            containers: vec![DrainContainer {
                name: "drain".to_owned(),
                claims: claims
                    .iter()
                    .map(|c| (c.name.clone(), c.uid.clone()))
                    .collect(),
                record: (phase == DrainPhase::Succeeded).then(|| {
                    claims
                        .iter()
                        .map(|c| (c.name.clone(), c.uid.clone()))
                        .collect()
                }),
            }],
            disrupted: false,
            kill_probes: false,
            settings: None,
            lingering: Vec::new(),
            started: phase != DrainPhase::Pending,
            running: phase == DrainPhase::Running,
            restarts: 0,
            blocker: None,
            started_at: (phase != DrainPhase::Pending).then(|| t(-90)),
            progress: None,
            node: (phase != DrainPhase::Pending).then(|| "n1".to_owned()),
            ready: phase == DrainPhase::Running,
        }),
    }
}

fn drain_of(pod: &mut PodObs) -> &mut DrainPod {
    match &mut pod.kind {
        PodKind::Drain(d) => d,
        _ => panic!("not a drain pod"),
    }
}

/// The pod, without a completion record (a program that was stopped, or that never writes it).
fn without_record(mut pod: PodObs) -> PodObs {
    for c in &mut drain_of(&mut pod).containers {
        c.record = None;
    }
    pod
}

/// A container of a drain pod named for what the test knows of it: `finished` when its program
/// drained all it uses, else `unfinished`; the planner never reads the name.
fn container(
    finished: bool,
    claims: &BTreeMap<String, String>,
    record: Option<&BTreeMap<String, String>>,
) -> DrainContainer {
    DrainContainer {
        name: if finished { "finished" } else { "unfinished" }.to_owned(),
        claims: claims.clone(),
        record: record.cloned(),
    }
}

/// Whether every container of `d` that uses the claim `name` with `uid` finished its drain, by
/// the test's own knowledge (the containers' names), and at least one does use it.
fn truly_drained(d: &DrainPod, name: &str, uid: &str) -> bool {
    let mut users = d
        .containers
        .iter()
        .filter(|c| c.claims.get(name).map(String::as_str) == Some(uid))
        .peekable();
    users.peek().is_some() && users.all(|c| c.name == "finished")
}

/// The pod, with a deletion requested at `asked`.
fn asked_to_stop(mut pod: PodObs, asked: Timestamp) -> PodObs {
    pod.terminating = true;
    drain_of(&mut pod).delete_requested_at = Some(asked);
    pod
}

fn snap(replicas: i32, claims: Vec<Claim>, pods: Vec<PodObs>) -> Snapshot {
    Snapshot {
        set_name: SET.to_owned(),
        replicas,
        ordinals_start: 0,
        reserved: Default::default(),
        also_held: None,
        // Every template some claim of the test belongs to.
        claim_templates: claims
            .iter()
            .map(|c| c.template.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect(),
        claims,
        pods,
        previous: BTreeMap::new(),
        nodes: BTreeMap::new(),
    }
}

/// Fails if the plan deletes a drain pod.
fn assert_deletes_no_drain_pod(plan: &Plan) {
    assert!(
        !plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::DeleteDrainPod { .. })),
        "{:?}",
        plan.actions
    );
}

fn refs(claims: &[&Claim]) -> Vec<ClaimRef> {
    claims
        .iter()
        .map(|c| ClaimRef {
            name: c.name.clone(),
            uid: c.uid.clone(),
        })
        .collect()
}

fn create(ordinal: i32, claims: &[&Claim], attempt: u32, first: Option<Timestamp>) -> Action {
    Action::CreateDrainPod {
        ordinal,
        claims: claims
            .iter()
            .map(|c| {
                (
                    c.template.clone(),
                    ClaimRef {
                        name: c.name.clone(),
                        uid: c.uid.clone(),
                    },
                )
            })
            .collect(),
        attempt,
        avoid_nodes: Vec::new(),
        new_series: first.map(|at| (at, HASH.to_owned())),
    }
}

fn delete_pod(ordinal: i32, why: DeleteWhy) -> Action {
    Action::DeleteDrainPod {
        ordinal,
        name: format!("{SET}-{ordinal}"),
        uid: format!("drain-pod-{ordinal}"),
        resource_version: None,
        why,
    }
}

/// The delete of a drain pod believed unfinished: preconditioned on its resourceVersion.
fn stop_pod(ordinal: i32, why: DeleteWhy) -> Action {
    Action::DeleteDrainPod {
        ordinal,
        name: format!("{SET}-{ordinal}"),
        uid: format!("drain-pod-{ordinal}"),
        resource_version: Some(format!("rv-{ordinal}")),
        why,
    }
}

fn settings() -> Settings {
    Settings {
        new_drains: NewDrains::Allowed {
            template_hash: HASH.to_owned(),
        },
        max_concurrent: Some(1),
        retry_base: Duration::from_secs(10),
        retry_max: Duration::from_secs(300),
        ..Settings::default()
    }
}

fn finish() -> Settings {
    Settings {
        on_scale_up: OnScaleUp::Finish,
        ..settings()
    }
}

fn running_record(ordinal: i32) -> DrainRecord {
    DrainRecord {
        first_attempt_at: Some(t(-100)),
        pod_uid: Some(format!("drain-pod-{ordinal}")),
        template_hash: Some(HASH.to_owned()),
        ..DrainRecord::default()
    }
}

#[test]
fn nothing_to_do_when_every_ordinal_is_in_range() {
    let claims = vec![claim("data", 0), claim("data", 1)];
    let plan = plan(
        &snap(2, claims, vec![stateful_pod(0), stateful_pod(1)]),
        &settings(),
        t(0),
    );
    assert_eq!(plan, Plan::default());
}

#[test]
fn stateful_pod_still_there_blocks_the_drain() {
    let plan = plan(
        &snap(2, vec![claim("data", 2)], vec![stateful_pod(2)]),
        &settings(),
        t(0),
    );
    assert!(plan.actions.is_empty());
    assert_eq!(
        plan.status[&2],
        OrdinalState::Waiting {
            reason: "pod web-2 still exists".to_owned()
        }
    );
}

#[test]
fn terminating_stateful_pod_blocks_the_drain() {
    let mut pod = stateful_pod(2);
    pod.terminating = true;
    let plan = plan(
        &snap(2, vec![claim("data", 2)], vec![pod]),
        &settings(),
        t(0),
    );
    assert!(plan.actions.is_empty());
}

#[test]
fn orphaned_claim_gets_a_drain_pod() {
    let c = claim("data", 2);
    let plan = plan(&snap(2, vec![c.clone()], vec![]), &settings(), t(0));
    assert_eq!(plan.actions, vec![create(2, &[&c], 1, Some(t(0)))]);
    assert_eq!(
        plan.status[&2],
        OrdinalState::Draining {
            attempt: 1,
            progress: None,
            note: None,
        }
    );
}

#[test]
fn two_claim_templates_are_drained_by_one_pod() {
    let (a, b) = (claim("data", 1), claim("logs", 1));
    let plan = plan(
        &snap(1, vec![a.clone(), b.clone()], vec![]),
        &settings(),
        t(0),
    );
    assert_eq!(plan.actions, vec![create(1, &[&a, &b], 1, Some(t(0)))]);
}

#[test]
fn ordinals_start_shifts_the_range() {
    let mut s = snap(
        2,
        vec![claim("data", 5), claim("data", 6), claim("data", 7)],
        vec![],
    );
    s.ordinals_start = 5;
    let plan = plan(&s, &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![create(7, &[&claim("data", 7)], 1, Some(t(0)))]
    );
}

#[test]
fn below_ordinals_start_is_out_of_range_too() {
    let mut s = snap(1, vec![claim("data", 0)], vec![]);
    s.ordinals_start = 3;
    let plan = plan(&s, &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![create(0, &[&claim("data", 0)], 1, Some(t(0)))]
    );
}

#[test]
fn a_reserved_ordinal_in_the_middle_is_drained_while_its_neighbours_run() {
    // An Advanced StatefulSet of 0..2 with ordinal 1 reserved: replicas 2, pods 0 and 2 run.
    let claims = vec![claim("data", 0), claim("data", 1), claim("data", 2)];
    let mut s = snap(2, claims, vec![stateful_pod(0), stateful_pod(2)]);
    s.reserved = [1].into();
    let plan = plan(&s, &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![create(1, &[&claim("data", 1)], 1, Some(t(0)))]
    );
}

#[test]
fn ordinals_kruise_may_run_from_0_are_never_drained() {
    // An Advanced StatefulSet with start 3 and replicas 2: Kruise runs 3, 4 with its start
    // gate, 0, 1 without. Pod 0 is briefly gone: its claim is not drained; ordinal 5's is.
    let claims = vec![claim("data", 0), claim("data", 1), claim("data", 5)];
    let mut s = snap(2, claims, vec![stateful_pod(1)]);
    s.ordinals_start = 3;
    s.also_held = Some(drain_api::names::OrdinalRange::new(Some(0), Some(2)));
    let plan = plan(&s, &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![create(5, &[&claim("data", 5)], 1, Some(t(0)))]
    );
}

#[test]
fn un_reserving_an_ordinal_mid_drain_is_a_scale_up() {
    // Ordinal 1 drains, then is un-reserved (replicas 3): under `cancel` the drain pod goes and
    // the claims stay for the returning pod, as for a built-in set scaled back up.
    let c = with_record(claim("data", 1), running_record(1));
    let pods = vec![
        stateful_pod(0),
        drain_pod(1, DrainPhase::Running, &[&c]),
        stateful_pod(2),
    ];
    let mut s = snap(2, vec![c.clone()], pods.clone());
    s.reserved = [1].into();
    assert!(plan(&s, &settings(), t(0)).actions.is_empty());
    let back = snap(3, vec![c.clone()], pods);
    assert_eq!(
        plan(&back, &settings(), t(0)).actions,
        vec![
            stop_pod(1, DeleteWhy::Cancelled),
            Action::ClearRecord {
                ordinal: 1,
                claims: refs(&[&c])
            }
        ]
    );
}

#[test]
fn ordered_ready_drains_one_at_a_time_highest_first() {
    let claims = vec![claim("data", 0), claim("data", 1), claim("data", 2)];
    let plan = plan(&snap(0, claims.clone(), vec![]), &settings(), t(0));
    assert_eq!(plan.actions, vec![create(2, &[&claims[2]], 1, Some(t(0)))]);
    assert!(matches!(plan.status[&1], OrdinalState::Waiting { .. }));
    assert!(matches!(plan.status[&0], OrdinalState::Waiting { .. }));
}

#[test]
fn a_running_drain_holds_the_only_slot() {
    let c2 = with_record(claim("data", 2), running_record(2));
    let c1 = claim("data", 1);
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c2])];
    let plan = plan(&snap(1, vec![c1, c2], pods), &settings(), t(0));
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(
        plan.status[&2],
        OrdinalState::Draining {
            attempt: 1,
            progress: None,
            note: None,
        }
    );
}

#[test]
fn parallel_drains_all_at_once() {
    let claims = vec![claim("data", 0), claim("data", 1), claim("data", 2)];
    let s = Settings {
        max_concurrent: None,
        ..settings()
    };
    let plan = plan(&snap(0, claims.clone(), vec![]), &s, t(0));
    assert_eq!(
        plan.actions,
        vec![
            create(2, &[&claims[2]], 1, Some(t(0))),
            create(1, &[&claims[1]], 1, Some(t(0))),
            create(0, &[&claims[0]], 1, Some(t(0))),
        ]
    );
}

#[test]
fn running_pod_without_recorded_uid_gets_it_recorded() {
    let c = with_record(
        claim("data", 2),
        DrainRecord {
            first_attempt_at: Some(t(-5)),
            ..Default::default()
        },
    );
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c])];
    let plan = plan(&snap(2, vec![c.clone()], pods), &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![Action::RecordDrainPod {
            ordinal: 2,
            claims: refs(&[&c]),
            pod_uid: "drain-pod-2".to_owned(),
            series: None,
        }]
    );
}

#[test]
fn success_deletes_the_claims_then_the_pod() {
    let (a, b) = (claim("data", 2), claim("logs", 2));
    let pods = vec![drain_pod(2, DrainPhase::Succeeded, &[&a, &b])];
    let plan = plan(
        &snap(2, vec![a.clone(), b.clone()], pods),
        &settings(),
        t(0),
    );
    assert_eq!(
        plan.actions,
        vec![
            Action::DeleteClaims {
                ordinal: 2,
                claims: refs(&[&a, &b])
            },
            delete_pod(2, DeleteWhy::Succeeded),
        ]
    );
    assert!(matches!(plan.status[&2], OrdinalState::Done { .. }));
}

#[test]
fn success_after_a_crash_with_claims_terminating_still_deletes_the_pod() {
    let c = terminating(claim("data", 2));
    let pods = vec![drain_pod(2, DrainPhase::Succeeded, &[&c])];
    let plan = plan(&snap(2, vec![c], pods), &settings(), t(0));
    assert_eq!(plan.actions, vec![delete_pod(2, DeleteWhy::Succeeded)]);
}

#[test]
fn success_after_a_crash_with_claims_gone_still_deletes_the_pod() {
    let c = claim("data", 2);
    let pods = vec![drain_pod(2, DrainPhase::Succeeded, &[&c])];
    let plan = plan(&snap(2, vec![], pods), &settings(), t(0));
    assert_eq!(plan.actions, vec![delete_pod(2, DeleteWhy::Succeeded)]);
}

#[rstest]
#[case::being_deleted(true)]
#[case::gone(false)]
fn a_drain_pod_whose_claims_went_before_it_started_is_removed(#[case] terminating_claim: bool) {
    // Made from a view that had not seen its claim go (or the claim deleted by hand): it could
    // never start, and it holds the name the returning pod needs.
    let c = claim("data", 2);
    let pods = vec![drain_pod(2, DrainPhase::Pending, &[&c])];
    let claims = if terminating_claim {
        vec![terminating(c)]
    } else {
        vec![]
    };
    let plan = plan(&snap(2, claims, pods), &settings(), t(0));
    assert_eq!(plan.actions, vec![stop_pod(2, DeleteWhy::ClaimsGone)]);
    assert!(matches!(plan.status[&2], OrdinalState::Waiting { .. }));
}

#[test]
fn a_drain_pod_that_started_is_not_removed_because_its_claims_are_being_deleted() {
    // Running on them: the claims stay until it ends (Kubernetes' claim protection), and its
    // end is judged as any other.
    let c = claim("data", 2);
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c])];
    let plan = plan(&snap(2, vec![terminating(c)], pods), &settings(), t(0));
    assert_deletes_no_drain_pod(&plan);
}

#[test]
fn success_never_deletes_a_claim_recreated_since() {
    let drained = claim("data", 2);
    let mut fresh = claim("data", 2);
    fresh.uid = "uid-fresh".to_owned();
    let pods = vec![drain_pod(2, DrainPhase::Succeeded, &[&drained])];
    let plan = plan(&snap(2, vec![fresh], pods), &settings(), t(0));
    assert_eq!(plan.actions, vec![delete_pod(2, DeleteWhy::Succeeded)]);
}

#[test]
fn after_success_the_terminating_claims_show_done() {
    let mut s = snap(2, vec![terminating(claim("data", 2))], vec![]);
    s.previous.insert(
        2,
        OrdinalState::Done {
            at: t(-3).to_string(),
        },
    );
    let plan = plan(&s, &settings(), t(0));
    assert!(plan.actions.is_empty());
    assert_eq!(
        plan.status[&2],
        OrdinalState::Done {
            at: t(-3).to_string()
        }
    );
}

#[test]
fn done_is_remembered_until_the_ordinal_returns() {
    let mut s = snap(2, vec![], vec![]);
    s.previous.insert(
        2,
        OrdinalState::Done {
            at: t(-3).to_string(),
        },
    );
    assert_eq!(
        plan(&s, &settings(), t(0)).status[&2],
        OrdinalState::Done {
            at: t(-3).to_string()
        }
    );
    s.claims.push(terminating(claim("data", 2)));
    assert!(matches!(
        plan(&s, &settings(), t(0)).status[&2],
        OrdinalState::Done { .. }
    ));
    s.replicas = 3;
    assert!(
        plan(&s, &settings(), t(0)).status.is_empty(),
        "back in range: forgotten"
    );
}

#[test]
fn failure_is_counted_with_backoff_then_the_pod_deleted() {
    let c = with_record(claim("data", 2), running_record(2));
    let pods = vec![drain_pod(2, DrainPhase::Failed, &[&c])];
    let plan = plan(&snap(2, vec![c.clone()], pods), &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![
            Action::RecordFailure {
                ordinal: 2,
                claims: refs(&[&c]),
                pod_uid: "drain-pod-2".to_owned(),
                kind: FailureKind::Failed,
                attempts: 1,
                retry_after: t(10),
                reason: "exit code 1".to_owned(),
                gave_up: false,
                only_if_pod_gone: false,
                series: None,
            },
            delete_pod(2, DeleteWhy::Failed),
        ]
    );
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(10)));
}

#[test]
fn a_counted_failure_is_not_counted_again() {
    let record = DrainRecord {
        attempts: 1,
        retry_after: Some(t(10)),
        counted_pod_uid: Some("drain-pod-2".to_owned()),
        ..running_record(2)
    };
    let c = with_record(claim("data", 2), record);
    let pods = vec![drain_pod(2, DrainPhase::Failed, &[&c])];
    let plan = plan(&snap(2, vec![c], pods), &settings(), t(0));
    assert_eq!(plan.actions, vec![delete_pod(2, DeleteWhy::Failed)]);
}

#[test]
fn retry_waits_for_the_backoff() {
    let record = DrainRecord {
        attempts: 1,
        retry_after: Some(t(10)),
        counted_pod_uid: Some("drain-pod-2".to_owned()),
        ..running_record(2)
    };
    let c = with_record(claim("data", 2), record);
    let plan = plan(&snap(2, vec![c.clone()], vec![]), &settings(), t(4));
    assert!(plan.actions.is_empty());
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(6)));
    assert!(matches!(
        plan.status[&2],
        OrdinalState::Retrying { attempts: 1, .. }
    ));
}

#[test]
fn retry_after_the_backoff_creates_attempt_two() {
    let record = DrainRecord {
        attempts: 1,
        retry_after: Some(t(10)),
        counted_pod_uid: Some("drain-pod-2".to_owned()),
        ..running_record(2)
    };
    let c = with_record(claim("data", 2), record);
    let plan = plan(&snap(2, vec![c.clone()], vec![]), &settings(), t(10));
    assert_eq!(plan.actions, vec![create(2, &[&c], 2, None)]);
}

#[test]
fn a_drain_pod_deleted_by_someone_counts_as_a_failure() {
    let c = with_record(claim("data", 2), running_record(2));
    let plan = plan(&snap(2, vec![c.clone()], vec![]), &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![Action::RecordFailure {
            ordinal: 2,
            claims: refs(&[&c]),
            pod_uid: "drain-pod-2".to_owned(),
            kind: FailureKind::Vanished,
            attempts: 1,
            retry_after: t(10),
            reason: "drain pod was deleted before it finished".to_owned(),
            gave_up: false,
            only_if_pod_gone: true,
            series: None,
        }]
    );
}

#[rstest]
#[case::attempts_exhausted(Some(2), None, 1, true)]
#[case::attempts_left(Some(3), None, 1, false)]
#[case::deadline_before_next_try(None, Some(105), 1, true)]
#[case::deadline_after_next_try(None, Some(1000), 1, false)]
fn giving_up(
    #[case] max_attempts: Option<u32>,
    #[case] deadline_secs: Option<u64>,
    #[case] attempts_before: u32,
    #[case] gave_up: bool,
) {
    let record = DrainRecord {
        attempts: attempts_before,
        ..running_record(2)
    };
    let c = with_record(claim("data", 2), record);
    let pods = vec![drain_pod(2, DrainPhase::Failed, &[&c])];
    let s = Settings {
        max_attempts,
        deadline: deadline_secs.map(Duration::from_secs),
        ..settings()
    };
    let plan = plan(&snap(2, vec![c], pods), &s, t(0));
    match &plan.actions[0] {
        Action::RecordFailure {
            gave_up: g,
            attempts,
            ..
        } => {
            assert_eq!(*g, gave_up);
            assert_eq!(*attempts, attempts_before + 1);
        }
        other => panic!("expected RecordFailure, got {other:?}"),
    }
    assert_eq!(
        matches!(plan.status[&2], OrdinalState::Failed { .. }),
        gave_up
    );
}

#[test]
fn given_up_ordinal_gets_no_new_pod_and_frees_its_slot() {
    let record = DrainRecord {
        attempts: 3,
        counted_pod_uid: Some("drain-pod-2".to_owned()),
        last_failure: Some("exit code 1".to_owned()),
        ..running_record(2)
    };
    let c2 = with_record(claim("data", 2), record);
    let c1 = claim("data", 1);
    let s = Settings {
        max_attempts: Some(3),
        ..settings()
    };
    let plan = plan(&snap(1, vec![c1.clone(), c2], vec![]), &s, t(0));
    assert_eq!(plan.actions, vec![create(1, &[&c1], 1, Some(t(0)))]);
    assert!(matches!(
        plan.status[&2],
        OrdinalState::Failed { attempts: 3, .. }
    ));
}

#[test]
fn a_drain_past_its_deadline_is_stopped() {
    let c = with_record(claim("data", 2), running_record(2));
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c])];
    let s = Settings {
        deadline: Some(Duration::from_secs(50)),
        ..settings()
    };
    let plan = plan(&snap(2, vec![c], pods), &s, t(0));
    assert!(matches!(
        plan.actions[0],
        Action::RecordFailure { gave_up: true, .. }
    ));
    assert_eq!(plan.actions[1], stop_pod(2, DeleteWhy::DeadlineExceeded));
}

#[test]
fn a_running_drain_requeues_at_its_deadline() {
    let c = with_record(claim("data", 2), running_record(2));
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c])];
    let s = Settings {
        deadline: Some(Duration::from_secs(130)),
        ..settings()
    };
    let plan = plan(&snap(2, vec![c], pods), &s, t(0));
    assert!(plan.actions.is_empty());
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(30)));
}

#[test]
fn scale_up_finish_lets_the_drain_complete() {
    let c = with_record(claim("data", 2), running_record(2));
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c])];
    let plan = plan(&snap(3, vec![c.clone()], pods), &finish(), t(0));
    assert_eq!(
        plan.actions,
        vec![Action::RecordReturn {
            ordinal: 2,
            claims: refs(&[&c]),
            at: t(0)
        }]
    );
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(300)));
    let pods = vec![drain_pod(2, DrainPhase::Succeeded, &[&c])];
    let plan = super::plan(&snap(3, vec![c.clone()], pods), &finish(), t(0));
    assert_eq!(
        plan.actions,
        vec![
            Action::DeleteClaims {
                ordinal: 2,
                claims: refs(&[&c])
            },
            delete_pod(2, DeleteWhy::Succeeded)
        ]
    );
}

#[test]
fn scale_up_cancel_deletes_the_drain_pod_and_keeps_the_claims() {
    let c = with_record(claim("data", 2), running_record(2));
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c])];
    let plan = plan(&snap(3, vec![c.clone()], pods), &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![
            stop_pod(2, DeleteWhy::Cancelled),
            Action::ClearRecord {
                ordinal: 2,
                claims: refs(&[&c])
            }
        ]
    );
}

#[test]
fn a_drain_failed_after_scale_up_is_not_retried() {
    let c = with_record(claim("data", 2), running_record(2));
    let pods = vec![drain_pod(2, DrainPhase::Failed, &[&c])];
    let plan = plan(&snap(3, vec![c.clone()], pods), &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![
            delete_pod(2, DeleteWhy::Failed),
            Action::ClearRecord {
                ordinal: 2,
                claims: refs(&[&c])
            }
        ]
    );
}

#[test]
fn returning_pod_finds_its_claims_cleared() {
    let c = with_record(
        claim("data", 2),
        DrainRecord {
            attempts: 2,
            ..running_record(2)
        },
    );
    let plan = plan(&snap(3, vec![c.clone()], vec![]), &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![Action::ClearRecord {
            ordinal: 2,
            claims: refs(&[&c])
        }]
    );
}

#[test]
fn terminating_drain_pod_is_waited_for() {
    let c = with_record(claim("data", 2), running_record(2));
    let mut pod = drain_pod(2, DrainPhase::Running, &[&c]);
    pod.terminating = true;
    let plan = plan(&snap(2, vec![c], vec![pod]), &settings(), t(0));
    assert!(plan.actions.is_empty());
}

#[test]
fn backoff_doubles_and_caps() {
    let (b, m) = (Duration::from_secs(5), Duration::from_secs(60));
    let got: Vec<u64> = (1..=6).map(|n| backoff(n, b, m).as_secs()).collect();
    assert_eq!(got, vec![5, 10, 20, 40, 60, 60]);
    assert_eq!(backoff(u32::MAX, b, m), m);
}

// ---- properties ---------------------------------------------------------------------------

fn arb_phase() -> impl Strategy<Value = DrainPhase> {
    prop_oneof![
        Just(DrainPhase::Pending),
        Just(DrainPhase::Running),
        Just(DrainPhase::Succeeded),
        Just(DrainPhase::Failed),
        Just(DrainPhase::Unknown),
    ]
}

fn arb_record() -> impl Strategy<Value = DrainRecord> {
    (
        0u32..5,
        prop::option::of(-200i64..200),
        prop::option::of(-50i64..50),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(-400i64..50),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(attempts, first, retry, has_pod, counted, stale, returned, held, fenced)| {
                DrainRecord {
                    attempts,
                    first_attempt_at: first.map(t),
                    retry_after: retry.map(t),
                    last_failure: (attempts > 0).then(|| "x".to_owned()),
                    pod_uid: has_pod.then(|| "uid-p".to_owned()),
                    counted_pod_uid: counted.then(|| "uid-p".to_owned()),
                    template_hash: Some(if stale { "h0" } else { HASH }.to_owned()),
                    returned_at: returned.map(t),
                    approved: false,
                    succeeded_pod_uid: None,
                    held,
                    // A fence node no snapshot reads: never ready, so no drain may start.
                    fence_node: fenced.then(|| "n9".to_owned()),
                    lost_nodes: Vec::new(),
                }
            },
        )
}

#[derive(Clone, Debug)]
enum PodChoice {
    None,
    Stateful {
        terminating: bool,
    },
    Drain {
        phase: DrainPhase,
        /// Deletion requested at this time (seconds), if at all.
        asked: Option<i64>,
        /// Containers finished at this time (seconds), if they report it.
        finished: Option<i64>,
        same_uids: bool,
        started: bool,
        running: bool,
        restarts: u32,
        blocker: Option<bool>,
        stale_template: bool,
        /// Its containers and their records, see `containers_of`.
        completion: u8,
        disrupted: bool,
        kill_probes: bool,
        /// Its success is recorded on the ordinal's claims (`exit-code`).
        seen: bool,
        /// The settings it was made under: (manual approval, exit-code proof, retain volumes).
        made_under: Option<(bool, bool, bool)>,
    },
    Foreign,
    Unknown,
}

/// The containers of a drain pod of `claims` for layout `layout`, each named for whether it
/// truly finished (see `container`):
/// 0: one container, no record; 1: one, its record; 2: one, a record naming other claims;
/// 3: one per claim and a proxy that uses none, each with its record; 4: one per claim, the
/// first finished with a record naming every claim of the pod while the others still drain;
/// 5: one per claim, the first finished with its record while the others still drain.
fn containers_of(layout: u8, claims: &BTreeMap<String, String>) -> Vec<DrainContainer> {
    let each: Vec<BTreeMap<String, String>> = claims
        .iter()
        .map(|(n, u)| BTreeMap::from([(n.clone(), u.clone())]))
        .collect();
    let others = BTreeMap::from([("data-web-9".to_owned(), "u".to_owned())]);
    match layout {
        0 => vec![container(false, claims, None)],
        1 => vec![container(true, claims, Some(claims))],
        2 => vec![container(false, claims, Some(&others))],
        3 => each
            .iter()
            .map(|c| container(true, c, Some(c)))
            .chain([container(false, &BTreeMap::new(), None)])
            .collect(),
        4 => each
            .iter()
            .enumerate()
            .map(|(i, c)| match i {
                0 => container(true, c, Some(claims)),
                _ => container(false, c, None),
            })
            .collect(),
        _ => each
            .iter()
            .enumerate()
            .map(|(i, c)| match i {
                0 => container(true, c, Some(c)),
                _ => container(false, c, None),
            })
            .collect(),
    }
}

fn arb_drain_choice() -> impl Strategy<Value = PodChoice> {
    (
        arb_phase(),
        prop::option::of(-10i64..10),
        prop::option::of(-10i64..10),
        any::<bool>(),
        any::<bool>(),
        (any::<bool>(), 0u32..5),
        prop::option::of(any::<bool>()),
        any::<bool>(),
        (
            0u8..6,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            prop::option::of((any::<bool>(), any::<bool>(), any::<bool>())),
        ),
    )
        .prop_map(
            |(
                phase,
                asked,
                finished,
                same_uids,
                started,
                (running, restarts),
                blocker,
                stale_template,
                (completion, disrupted, kill_probes, seen, made_under),
            )| {
                PodChoice::Drain {
                    phase,
                    asked,
                    finished,
                    same_uids,
                    started,
                    running,
                    restarts,
                    blocker,
                    stale_template,
                    completion,
                    disrupted,
                    kill_probes,
                    seen,
                    made_under,
                }
            },
        )
}

fn arb_pod_choice() -> impl Strategy<Value = PodChoice> {
    prop_oneof![
        Just(PodChoice::None),
        any::<bool>().prop_map(|terminating| PodChoice::Stateful { terminating }),
        arb_drain_choice(),
        arb_drain_choice(),
        Just(PodChoice::Foreign),
        Just(PodChoice::Unknown),
    ]
}

fn arb_ordinal() -> impl Strategy<Value = (Vec<(bool, bool, bool)>, DrainRecord, PodChoice)> {
    // Per claim template (data, logs): (exists, terminating, approved).
    (
        prop::collection::vec((any::<bool>(), any::<bool>(), any::<bool>()), 2),
        arb_record(),
        arb_pod_choice(),
    )
}

fn arb_snapshot() -> impl Strategy<Value = (Snapshot, Settings)> {
    (
        0i32..5,
        0i32..3,
        prop::collection::vec(arb_ordinal(), 0..7),
        prop::option::of(1u32..4),
        any::<bool>(),
        prop::option::of(1u32..4),
        any::<bool>(),
        (prop::collection::btree_set(0i32..7, 0..3), any::<bool>()),
        (any::<bool>(), any::<bool>()),
    )
        .prop_map(
            |(
                replicas,
                start,
                ordinals,
                max_concurrent,
                cancel,
                max_attempts,
                manual_approval,
                (reserved, fallback),
                (exit_code, retain),
            )| {
                let mut claims = Vec::new();
                let mut pods = Vec::new();
                for (i, (templates, record, pod)) in ordinals.into_iter().enumerate() {
                    let o = i as i32;
                    let mut mine = Vec::new();
                    for ((exists, term, approved), template) in
                        templates.into_iter().zip(["data", "logs"])
                    {
                        if exists {
                            let mut c = with_record(claim(template, o), record.clone());
                            c.terminating = term;
                            c.record.approved = approved;
                            mine.push(c);
                        }
                    }
                    match pod {
                        PodChoice::None => {}
                        PodChoice::Stateful { terminating } => {
                            let mut p = stateful_pod(o);
                            p.terminating = terminating;
                            pods.push(p);
                        }
                        PodChoice::Drain {
                            phase,
                            asked,
                            finished,
                            same_uids,
                            started,
                            running,
                            restarts,
                            blocker,
                            stale_template,
                            completion,
                            disrupted,
                            kill_probes,
                            seen,
                            made_under,
                        } => {
                            let mut drained: Vec<Claim> = mine.clone();
                            if !same_uids {
                                for c in &mut drained {
                                    c.uid.push_str("-old");
                                }
                            }
                            let refs: Vec<&Claim> = drained.iter().collect();
                            let mut p = drain_pod(o, phase, &refs);
                            if let Some(a) = asked {
                                p = asked_to_stop(p, t(a));
                            }
                            let d = drain_of(&mut p);
                            d.finished_at = finished.map(t);
                            d.started = started || phase != DrainPhase::Pending;
                            // Only a started pod of an unfinished phase runs now (Pending:
                            // an init container).
                            d.running = running
                                && d.started
                                && matches!(
                                    phase,
                                    DrainPhase::Running | DrainPhase::Unknown | DrainPhase::Pending
                                );
                            d.restarts = restarts;
                            d.blocker = blocker.map(|definitive| Blocker {
                                reason: "ImagePullBackOff".to_owned(),
                                message: String::new(),
                                definitive,
                            });
                            if stale_template {
                                d.template_hash = Some("h0".to_owned());
                            }
                            d.containers = containers_of(completion, &d.claims);
                            d.disrupted = disrupted;
                            d.kill_probes = kill_probes;
                            d.settings =
                                made_under.map(|(manual, exit_code, retain)| PodSettings {
                                    manual_approval: manual,
                                    proof: if exit_code {
                                        SuccessProof::ExitCode
                                    } else {
                                        SuccessProof::CompletionRecord
                                    },
                                    retain_volume_for: retain.then_some(Duration::from_secs(60)),
                                });
                            if seen {
                                for c in &mut mine {
                                    c.record.succeeded_pod_uid = Some(p.uid.clone());
                                }
                            }
                            pods.push(p);
                        }
                        PodChoice::Foreign => {
                            let mut p = stateful_pod(o);
                            p.kind = PodKind::Foreign;
                            pods.push(p);
                        }
                        PodChoice::Unknown => {
                            let mut p = stateful_pod(o);
                            p.kind = PodKind::Unknown;
                            pods.push(p);
                        }
                    }
                    claims.extend(mine);
                }
                let settings = Settings {
                    max_concurrent,
                    on_scale_up: if cancel {
                        OnScaleUp::Cancel
                    } else {
                        OnScaleUp::Finish
                    },
                    max_attempts,
                    manual_approval,
                    proof: if exit_code {
                        SuccessProof::ExitCode
                    } else {
                        SuccessProof::CompletionRecord
                    },
                    retain_volume_for: retain.then_some(Duration::from_secs(3600)),
                    ..settings()
                };
                let mut s = snap(replicas, claims, pods);
                // Both templates, whichever claims exist: an ordinal may miss one.
                s.claim_templates = vec!["data".to_owned(), "logs".to_owned()];
                s.ordinals_start = start;
                // An Advanced StatefulSet with a start other than 0 also holds the ordinals
                // counted from 0 (Kruise may ignore the start).
                if fallback && start != 0 {
                    s.also_held = Some(
                        drain_api::names::OrdinalRange::new(Some(0), Some(replicas))
                            .with_reserved(reserved.clone()),
                    );
                }
                s.reserved = reserved;
                (s, settings)
            },
        )
}

/// The ordinals the set runs, counted independently of `OrdinalRange`: from the start up, the
/// first `replicas` not reserved.
fn held(s: &Snapshot) -> Vec<i32> {
    let count_from = |mut o: i32| {
        let mut out = Vec::new();
        while out.len() < usize::try_from(s.replicas.max(0)).unwrap() {
            if !s.reserved.contains(&o) {
                out.push(o);
            }
            o += 1;
        }
        out
    };
    let mut out = count_from(s.ordinals_start);
    if s.also_held.is_some() {
        out.extend(count_from(0));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn no_claim_is_deleted_unless_its_drain_pod_succeeded((s, settings) in arb_snapshot(), now in -100i64..100) {
        let plan = plan(&s, &settings, t(now));
        for (i, action) in plan.actions.iter().enumerate() {
            if let Action::DeleteClaims { ordinal, claims } = action {
                let pod = s.pods.iter().find(|p| p.ordinal == *ordinal).expect("a pod for the ordinal");
                let PodKind::Drain(d) = &pod.kind else {
                    panic!("claims deleted without a drain pod: {action:?}");
                };
                let drained = &d.claims;
                // The completion record if the set or the pod's own settings ask for it.
                let record = settings.proof == SuccessProof::CompletionRecord
                    || d.settings.is_some_and(|p| p.proof == SuccessProof::CompletionRecord);
                match if record { SuccessProof::CompletionRecord } else { SuccessProof::ExitCode } {
                    // Only the containers that drain a claim prove it, whatever the phase (a
                    // sidecar may still run); no time counts.
                    SuccessProof::CompletionRecord => {
                        for c in claims {
                            prop_assert!(truly_drained(d, &c.name, &c.uid), "claim {} deleted while a container draining it had not finished: {:?}", c.name, d.containers);
                        }
                    }
                    // Seen succeeding with no stop requested, and recorded before anything else.
                    SuccessProof::ExitCode => {
                        prop_assert_eq!(d.phase, DrainPhase::Succeeded);
                        let seen_before = s.claims.iter().any(|c| c.ordinal == *ordinal && !c.terminating && c.record.succeeded_pod_uid.as_deref() == Some(pod.uid.as_str()));
                        let recorded_first = plan.actions[..i].iter().any(|a| matches!(a, Action::RecordSuccess { ordinal: o, pod_uid, .. } if o == ordinal && *pod_uid == pod.uid));
                        prop_assert!(seen_before || (recorded_first && !pod.terminating && !d.disrupted && !d.kill_probes), "claims deleted on an exit code not seen before a stop request");
                    }
                }
                for c in claims {
                    prop_assert_eq!(drained.get(&c.name), Some(&c.uid), "claim not drained by that pod");
                    prop_assert!(s.claims.iter().any(|x| x.name == c.name && x.uid == c.uid && x.ordinal == *ordinal));
                }
            }
        }
    }

    #[test]
    fn no_drain_pod_for_an_ordinal_in_range_or_a_taken_name((s, settings) in arb_snapshot(), now in -100i64..100) {
        let plan = plan(&s, &settings, t(now));
        for action in &plan.actions {
            if let Action::CreateDrainPod { ordinal, claims, .. } = action {
                prop_assert!(!held(&s).contains(ordinal), "drain pod for ordinal {} in range", ordinal);
                prop_assert!(s.pods.iter().all(|p| p.ordinal != *ordinal), "name taken");
                prop_assert!(!claims.is_empty());
                for c in claims.values() {
                    prop_assert!(s.claims.iter().any(|x| x.uid == c.uid && !x.terminating && x.ordinal == *ordinal));
                }
            }
        }
    }

    #[test]
    fn a_drain_pod_starts_only_with_a_live_claim_of_every_template_and_none_held((s, settings) in arb_snapshot(), now in -100i64..100) {
        let plan = plan(&s, &settings, t(now));
        for action in &plan.actions {
            if let Action::CreateDrainPod { ordinal, claims, .. } = action {
                let live: Vec<&Claim> = s.claims.iter().filter(|c| c.ordinal == *ordinal && !c.terminating).collect();
                for template in &s.claim_templates {
                    prop_assert!(live.iter().any(|c| &c.template == template), "ordinal {} drained without its {} claim", ordinal, template);
                    prop_assert!(claims.contains_key(template));
                }
                prop_assert!(live.iter().all(|c| !c.record.held), "a held claim drained");
            }
        }
    }

    #[test]
    fn under_retention_every_claim_delete_follows_the_retention_of_exactly_its_volumes((s, settings) in arb_snapshot(), now in -100i64..100) {
        let plan = plan(&s, &settings, t(now));
        for (i, action) in plan.actions.iter().enumerate() {
            let retain_of = |ordinal: &i32| {
                let pod = s.pods.iter().find(|p| p.ordinal == *ordinal);
                let recorded = pod.and_then(|p| match &p.kind {
                    PodKind::Drain(d) => d.settings.and_then(|x| x.retain_volume_for),
                    _ => None,
                });
                settings.retain_volume_for.max(recorded)
            };
            match action {
                Action::DeleteClaims { ordinal, claims } => {
                    let Some(retain) = retain_of(ordinal) else {
                        continue;
                    };
                    let before = plan.actions[..i].iter().rev().find(|a| a.ordinal() == *ordinal);
                    prop_assert_eq!(
                        before,
                        Some(&Action::RetainVolumes { ordinal: *ordinal, claims: claims.clone(), until: t(now) + retain }),
                        "claims deleted without retaining their volumes first"
                    );
                }
                Action::RetainVolumes { ordinal, claims, .. } => {
                    prop_assert!(retain_of(ordinal).is_some(), "retained without the setting");
                    let next = plan.actions.get(i + 1);
                    prop_assert!(matches!(next, Some(Action::DeleteClaims { ordinal: o, claims: c }) if o == ordinal && c == claims), "retention not followed by the delete of its claims");
                }
                _ => {}
            }
        }
    }

    #[test]
    fn under_manual_approval_no_claim_is_deleted_unless_approved((s, settings) in arb_snapshot(), now in -100i64..100) {
        let plan = plan(&s, &settings, t(now));
        for action in &plan.actions {
            let manual = |ordinal: &i32| settings.manual_approval || s.pods.iter().any(|p| p.ordinal == *ordinal && matches!(&p.kind, PodKind::Drain(d) if d.settings.is_some_and(|x| x.manual_approval)));
            if let Action::DeleteClaims { ordinal, claims } = action
                && manual(ordinal)
            {
                for c in claims {
                    let observed = s.claims.iter().find(|x| x.uid == c.uid).expect("observed");
                    prop_assert!(observed.record.approved, "{} deleted without approval", c.name);
                }
            }
        }
    }

    #[test]
    fn never_more_concurrent_drains_than_allowed((s, settings) in arb_snapshot(), now in -100i64..100) {
        let plan = plan(&s, &settings, t(now));
        let creates = plan.actions.iter().filter(|a| matches!(a, Action::CreateDrainPod { .. })).count() as u32;
        if creates > 0 {
            // A succeeded drain that only waits for approval holds its name, not a slot.
            let awaiting: BTreeSet<i32> = plan.status.iter().filter(|(_, st)| matches!(st, OrdinalState::AwaitingApproval { .. })).map(|(o, _)| *o).collect();
            let existing = s.pods.iter().filter(|p| matches!(p.kind, PodKind::Drain(_)) && !awaiting.contains(&p.ordinal)).count() as u32;
            let limit = settings.max_concurrent.unwrap_or(u32::MAX);
            prop_assert!(existing + creates <= limit, "{} existing + {} new > {}", existing, creates, limit);
        }
    }

    #[test]
    fn every_deleted_pod_is_a_drain_pod((s, settings) in arb_snapshot(), now in -100i64..100) {
        let plan = plan(&s, &settings, t(now));
        for action in &plan.actions {
            if let Action::DeleteDrainPod { uid, .. } = action {
                let pod = s.pods.iter().find(|p| &p.uid == uid).expect("deleted pod observed");
                let is_drain = matches!(pod.kind, PodKind::Drain(_));
                prop_assert!(is_drain);
            }
        }
    }

    #[test]
    fn claims_are_deleted_before_their_pod((s, settings) in arb_snapshot(), now in -100i64..100) {
        let plan = plan(&s, &settings, t(now));
        for (i, action) in plan.actions.iter().enumerate() {
            if let Action::DeleteClaims { ordinal, .. } = action {
                let pod_delete = plan.actions.iter().position(|a| matches!(a, Action::DeleteDrainPod { ordinal: o, .. } if o == ordinal));
                prop_assert!(pod_delete.is_none_or(|p| p > i));
            }
        }
    }

    #[test]
    fn an_unfinished_drain_pod_is_only_stopped_with_a_resource_version((s, settings) in arb_snapshot(), now in -100i64..100) {
        let plan = plan(&s, &settings, t(now));
        for action in &plan.actions {
            if let Action::DeleteDrainPod { uid, resource_version, why, .. } = action {
                let pod = s.pods.iter().find(|p| &p.uid == uid).expect("deleted pod observed");
                let PodKind::Drain(d) = &pod.kind else { panic!("not a drain pod") };
                let finished = matches!(d.phase, DrainPhase::Succeeded | DrainPhase::Failed)
                    || (!d.claims.is_empty() && d.claims.iter().all(|(n, u)| truly_drained(d, n, u)));
                prop_assert!(finished || resource_version.as_deref() == Some(d.resource_version.as_str()), "{:?} of an unfinished pod without a precondition", why);
            }
        }
    }

    #[test]
    fn no_new_drain_when_drains_are_stopped((s, settings) in arb_snapshot(), now in -100i64..100) {
        let stopped = Settings { new_drains: NewDrains::Stopped { why: "opted out".to_owned() }, ..settings };
        let plan = plan(&s, &stopped, t(now));
        let creates = plan.actions.iter().filter(|a| matches!(a, Action::CreateDrainPod { .. })).count();
        prop_assert_eq!(creates, 0);
    }

    #[test]
    fn planning_is_deterministic((s, settings) in arb_snapshot(), now in -100i64..100) {
        prop_assert_eq!(plan(&s, &settings, t(now)), plan(&s, &settings, t(now)));
    }
}

#[test]
fn done_time_is_stable_across_reconciles_of_a_succeeded_pod() {
    let c = claim("data", 2);
    let mut s = snap(
        2,
        vec![c.clone()],
        vec![drain_pod(2, DrainPhase::Succeeded, &[&c])],
    );
    assert_eq!(
        plan(&s, &settings(), t(0)).status[&2],
        OrdinalState::Done {
            at: t(0).to_string()
        }
    );
    s.previous.insert(
        2,
        OrdinalState::Done {
            at: t(0).to_string(),
        },
    );
    // A later reconcile (stale cache) reports the same time: the status is not rewritten.
    assert_eq!(
        plan(&s, &settings(), t(5)).status[&2],
        OrdinalState::Done {
            at: t(0).to_string()
        }
    );
}

#[test]
fn a_deadline_failure_is_not_counted_twice() {
    let record = DrainRecord {
        attempts: 1,
        counted_pod_uid: Some("drain-pod-2".to_owned()),
        ..running_record(2)
    };
    let c = with_record(claim("data", 2), record);
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c])];
    let s = Settings {
        deadline: Some(Duration::from_secs(50)),
        ..settings()
    };
    let plan = plan(&snap(2, vec![c], pods), &s, t(0));
    assert_eq!(plan.actions, vec![stop_pod(2, DeleteWhy::DeadlineExceeded)]);
    assert!(matches!(
        plan.status[&2],
        OrdinalState::Failed { attempts: 1, .. }
    ));
}

// ---- interrupted, stuck, overtaken drains -------------------------------------------------

fn failure(c: &Claim, kind: FailureKind, reason: &str) -> Action {
    Action::RecordFailure {
        ordinal: 2,
        claims: refs(&[c]),
        pod_uid: "drain-pod-2".to_owned(),
        kind,
        attempts: 1,
        retry_after: t(10),
        reason: format!("{reason}; the claims are kept and the drain runs again"),
        gave_up: false,
        only_if_pod_gone: false,
        series: None,
    }
}

const NO_RECORD: &str = "it exited 0 without writing the completion record \
    (DRAIN_COMPLETION_RECORD to its termination message), so nothing shows its drain finished";

#[test]
fn a_drain_pod_that_exits_0_without_the_completion_record_is_a_failed_attempt_and_goes() {
    let c = with_record(claim("data", 2), running_record(2));
    // As after a liveness probe's kill of a program that exits 0 on SIGTERM: no deletion
    // was requested, every container exited 0, no record.
    let pod = without_record(drain_pod(2, DrainPhase::Succeeded, &[&c]));
    let plan = plan(&snap(2, vec![c.clone()], vec![pod]), &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![
            failure(&c, FailureKind::Unproven, NO_RECORD),
            delete_pod(2, DeleteWhy::Failed),
        ]
    );
    assert!(matches!(plan.status[&2], OrdinalState::Retrying { .. }));
}

#[test]
fn a_drain_pod_asked_to_stop_that_exits_0_without_the_record_is_not_a_success() {
    let c = with_record(claim("data", 2), running_record(2));
    let pod = without_record(asked_to_stop(
        drain_pod(2, DrainPhase::Succeeded, &[&c]),
        t(-5),
    ));
    let plan = plan(&snap(2, vec![c.clone()], vec![pod]), &settings(), t(0));
    // Being deleted, it goes by itself.
    assert_eq!(
        plan.actions,
        vec![failure(
            &c,
            FailureKind::Interrupted,
            &format!(
                "it was asked to stop at {} and exited 0 without writing the completion record",
                t(-5)
            )
        )]
    );
}

#[test]
fn a_completion_record_that_names_other_claims_proves_nothing() {
    let c = with_record(claim("data", 2), running_record(2));
    for named in [
        BTreeMap::from([("data-web-2".to_owned(), "uid-of-an-older-claim".to_owned())]),
        BTreeMap::from([("data-web-1".to_owned(), "uid-data-1".to_owned())]),
        BTreeMap::new(),
    ] {
        let mut pod = drain_pod(2, DrainPhase::Succeeded, &[&c]);
        drain_of(&mut pod).containers[0].record = Some(named.clone());
        let plan = plan(&snap(2, vec![c.clone()], vec![pod]), &settings(), t(0));
        assert!(
            !plan
                .actions
                .iter()
                .any(|a| matches!(a, Action::DeleteClaims { .. })),
            "{named:?}: {:?}",
            plan.actions
        );
        let Action::RecordFailure { kind, reason, .. } = &plan.actions[0] else {
            panic!("{:?}", plan.actions)
        };
        assert_eq!(*kind, FailureKind::Unproven);
        assert!(
            reason.contains("container drain's completion record names claims")
                && reason.contains("not the claims it uses (data-web-2 (uid-data-2))"),
            "{reason}"
        );
    }
}

#[rstest]
#[case::finished_before_the_request(Some(-3), -2)]
#[case::finished_after_the_request(Some(-1), -2)]
#[case::no_finish_time(None, -2)]
fn under_the_completion_record_no_clock_decides(#[case] finished: Option<i64>, #[case] asked: i64) {
    for recorded in [true, false] {
        let c = with_record(claim("data", 2), running_record(2));
        let mut pod = asked_to_stop(drain_pod(2, DrainPhase::Succeeded, &[&c]), t(asked));
        drain_of(&mut pod).finished_at = finished.map(t);
        if !recorded {
            pod = without_record(pod);
        }
        let plan = plan(&snap(2, vec![c], vec![pod]), &settings(), t(0));
        let deletes_claims = plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::DeleteClaims { .. }));
        assert_eq!(deletes_claims, recorded, "{:?}", plan.actions);
    }
}

fn exit_code() -> Settings {
    Settings {
        proof: SuccessProof::ExitCode,
        ..settings()
    }
}

#[rstest]
// Seen succeeding with no stop requested: recorded first, then the claims go.
#[case::seen_succeeding(false, false, false, false, "proven, record first")]
// Seen before (recorded on a claim): a later deletion request changes nothing.
#[case::recorded_then_asked(true, false, false, true, "proven")]
#[case::recorded_then_disrupted(false, true, false, true, "proven")]
// Not seen before a stop request: not known, so drained again.
#[case::asked_to_stop(true, false, false, false, "interrupted")]
#[case::disrupted(false, true, false, false, "interrupted")]
#[case::probed(false, false, true, false, "unproven")]
fn under_exit_code_success_is_seen_by_the_controller_before_any_stop_request(
    #[case] terminating: bool,
    #[case] disrupted: bool,
    #[case] kill_probes: bool,
    #[case] recorded: bool,
    #[case] expected: &str,
) {
    let mut record = running_record(2);
    if recorded {
        record.succeeded_pod_uid = Some("drain-pod-2".to_owned());
    }
    let c = with_record(claim("data", 2), record);
    // The exit-code proof never looks at a record, nor at any clock.
    let mut pod = without_record(drain_pod(2, DrainPhase::Succeeded, &[&c]));
    if terminating {
        pod = asked_to_stop(pod, t(-5));
        drain_of(&mut pod).finished_at = Some(t(-10));
    }
    drain_of(&mut pod).disrupted = disrupted;
    drain_of(&mut pod).kill_probes = kill_probes;
    let plan = plan(&snap(2, vec![c.clone()], vec![pod]), &exit_code(), t(0));
    let record_success = Action::RecordSuccess {
        ordinal: 2,
        claims: refs(&[&c]),
        pod_uid: "drain-pod-2".to_owned(),
    };
    let delete_claims = Action::DeleteClaims {
        ordinal: 2,
        claims: refs(&[&c]),
    };
    match expected {
        "proven, record first" => assert_eq!(
            plan.actions,
            vec![
                record_success,
                delete_claims,
                delete_pod(2, DeleteWhy::Succeeded)
            ]
        ),
        "proven" => {
            assert_eq!(plan.actions[0], delete_claims);
            assert!(!plan.actions.contains(&record_success));
        }
        kind => {
            let Action::RecordFailure { kind: got, .. } = &plan.actions[0] else {
                panic!("{:?}", plan.actions)
            };
            let want = if kind == "interrupted" {
                FailureKind::Interrupted
            } else {
                FailureKind::Unproven
            };
            assert_eq!(*got, want);
            assert!(
                !plan.actions.iter().any(|a| matches!(
                    a,
                    Action::DeleteClaims { .. } | Action::RecordSuccess { .. }
                )),
                "{:?}",
                plan.actions
            );
        }
    }
}

#[test]
fn under_exit_code_a_success_awaiting_approval_is_recorded_before_it_waits() {
    let c = with_record(claim("data", 2), running_record(2));
    let pod = without_record(drain_pod(2, DrainPhase::Succeeded, &[&c]));
    let settings = Settings {
        manual_approval: true,
        ..exit_code()
    };
    let plan = plan(&snap(2, vec![c.clone()], vec![pod]), &settings, t(0));
    assert_eq!(
        plan.actions,
        vec![
            Action::RecordSuccess {
                ordinal: 2,
                claims: refs(&[&c]),
                pod_uid: "drain-pod-2".to_owned(),
            },
            Action::AwaitApproval {
                ordinal: 2,
                claims: refs(&[&c])
            }
        ]
    );
}

#[test]
fn an_interrupted_drain_is_counted_once_and_retried_after_it_is_gone() {
    let record = DrainRecord {
        attempts: 1,
        retry_after: Some(t(10)),
        counted_pod_uid: Some("drain-pod-2".to_owned()),
        last_failure: Some("interrupted".to_owned()),
        ..running_record(2)
    };
    let c = with_record(claim("data", 2), record);
    let pod = without_record(asked_to_stop(
        drain_pod(2, DrainPhase::Succeeded, &[&c]),
        t(-5),
    ));
    let plan1 = plan(&snap(2, vec![c.clone()], vec![pod]), &settings(), t(1));
    assert!(plan1.actions.is_empty(), "{:?}", plan1.actions);
    // Gone, backoff over: attempt 2.
    let plan2 = plan(&snap(2, vec![c.clone()], vec![]), &settings(), t(10));
    assert_eq!(plan2.actions, vec![create(2, &[&c], 2, None)]);
}

#[test]
fn a_cancelled_drain_that_exits_0_keeps_the_claims_for_the_returning_ordinal() {
    let c = with_record(claim("data", 2), running_record(2));
    let pod = without_record(asked_to_stop(
        drain_pod(2, DrainPhase::Succeeded, &[&c]),
        t(-5),
    ));
    let plan = plan(&snap(3, vec![c.clone()], vec![pod]), &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![Action::ClearRecord {
            ordinal: 2,
            claims: refs(&[&c])
        }]
    );
}

#[test]
fn cancel_is_the_default_and_stops_the_pod_with_a_resource_version() {
    assert_eq!(Settings::default().on_scale_up, OnScaleUp::Cancel);
    let c = with_record(claim("data", 2), running_record(2));
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c])];
    let plan = plan(&snap(3, vec![c], pods), &settings(), t(0));
    assert_eq!(plan.actions[0], stop_pod(2, DeleteWhy::Cancelled));
}

#[test]
fn under_finish_the_returning_ordinal_waits_at_most_the_scale_up_wait() {
    let record = DrainRecord {
        returned_at: Some(t(-300)),
        ..running_record(2)
    };
    let c = with_record(claim("data", 2), record);
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c])];
    let plan = plan(&snap(3, vec![c.clone()], pods.clone()), &finish(), t(0));
    assert_eq!(
        plan.actions,
        vec![
            stop_pod(2, DeleteWhy::ScaleUpWaitExceeded),
            Action::ClearRecord {
                ordinal: 2,
                claims: refs(&[&c])
            }
        ]
    );
    // Before the wait is over it keeps waiting and looks again when it ends.
    let plan = super::plan(&snap(3, vec![c.clone()], pods.clone()), &finish(), t(-100));
    assert!(plan.actions.is_empty());
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(100)));
}

#[test]
fn under_finish_a_drain_that_makes_progress_keeps_the_returning_ordinal_waiting() {
    let record = DrainRecord {
        returned_at: Some(t(-1000)),
        ..running_record(2)
    };
    let c = with_record(claim("data", 2), record);
    let mut pod = drain_pod(2, DrainPhase::Running, &[&c]);
    drain_of(&mut pod).progress = Some(progress(500, t(-60)));
    let plan = plan(
        &snap(3, vec![c.clone()], vec![pod.clone()]),
        &finish(),
        t(0),
    );
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(240)));
    // Progress that stopped longer than the wait ago: cancelled.
    drain_of(&mut pod).progress = Some(progress(500, t(-301)));
    let plan = super::plan(&snap(3, vec![c], vec![pod]), &finish(), t(0));
    assert_eq!(plan.actions[0], stop_pod(2, DeleteWhy::ScaleUpWaitExceeded));
}

#[test]
fn under_finish_a_drain_that_never_started_is_cancelled_at_once() {
    let c = with_record(claim("data", 2), running_record(2));
    let pods = vec![drain_pod(2, DrainPhase::Pending, &[&c])];
    let plan = plan(&snap(3, vec![c], pods), &finish(), t(0));
    assert_eq!(plan.actions[0], stop_pod(2, DeleteWhy::Cancelled));
}

fn stuck_pod(c: &Claim, edit: impl FnOnce(&mut DrainPod)) -> PodObs {
    let mut pod = drain_pod(2, DrainPhase::Pending, &[c]);
    edit(drain_of(&mut pod));
    pod
}

#[rstest]
#[case::image_never_pulled(|d: &mut DrainPod| d.blocker = Some(Blocker { reason: "ErrImageNeverPull".into(), message: "no image".into(), definitive: true }), "stuck: ErrImageNeverPull: no image")]
#[case::pull_backoff_too_long(|d: &mut DrainPod| { d.blocker = Some(Blocker { reason: "ImagePullBackOff".into(), message: String::new(), definitive: false }); d.created_at = Some(t(-400)); }, "stuck: ImagePullBackOff")]
#[case::never_started(|d: &mut DrainPod| d.created_at = Some(t(-400)), "stuck: not started after 5m")]
#[case::crash_loop(|d: &mut DrainPod| { d.started = true; d.phase = DrainPhase::Running; d.restarts = 3; d.failure = Some("container drain exited with code 1".into()); }, "stuck: containers restarted 3 times (container drain exited with code 1)")]
fn a_stuck_drain_pod_is_a_failed_attempt(#[case] edit: fn(&mut DrainPod), #[case] reason: &str) {
    let c = with_record(claim("data", 2), running_record(2));
    let pod = stuck_pod(&c, edit);
    let plan = plan(&snap(2, vec![c.clone()], vec![pod]), &settings(), t(0));
    assert_eq!(plan.actions.len(), 2, "{:?}", plan.actions);
    match &plan.actions[0] {
        Action::RecordFailure {
            kind,
            reason: got,
            attempts,
            ..
        } => {
            assert_eq!(*kind, FailureKind::Stuck);
            assert_eq!(got, reason);
            assert_eq!(*attempts, 1);
        }
        other => panic!("expected RecordFailure, got {other:?}"),
    }
    assert_eq!(plan.actions[1], stop_pod(2, DeleteWhy::Stuck));
    assert!(matches!(plan.status[&2], OrdinalState::Stuck { .. }));
}

#[test]
fn a_pod_blocked_for_less_than_stuck_after_waits_and_looks_again() {
    let c = with_record(claim("data", 2), running_record(2));
    let pod = stuck_pod(&c, |d| {
        d.blocker = Some(Blocker {
            reason: "ImagePullBackOff".into(),
            message: String::new(),
            definitive: false,
        });
        d.created_at = Some(t(-100));
    });
    let plan = plan(&snap(2, vec![c], vec![pod]), &settings(), t(0));
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(200)));
}

#[test]
fn stuck_attempts_count_against_max_attempts() {
    let record = DrainRecord {
        attempts: 1,
        ..running_record(2)
    };
    let c = with_record(claim("data", 2), record);
    let pod = stuck_pod(&c, |d| {
        d.blocker = Some(Blocker {
            reason: "ErrImageNeverPull".into(),
            message: String::new(),
            definitive: true,
        })
    });
    let s = Settings {
        max_attempts: Some(2),
        ..settings()
    };
    let plan = plan(&snap(2, vec![c], vec![pod]), &s, t(0));
    assert!(matches!(
        plan.actions[0],
        Action::RecordFailure {
            gave_up: true,
            attempts: 2,
            ..
        }
    ));
    assert!(matches!(plan.status[&2], OrdinalState::Failed { .. }));
}

#[test]
fn a_changed_template_replaces_a_pod_that_has_not_started() {
    let c = with_record(claim("data", 2), running_record(2));
    let mut pod = drain_pod(2, DrainPhase::Pending, &[&c]);
    drain_of(&mut pod).template_hash = Some("h0".to_owned());
    let plan = plan(
        &snap(2, vec![c.clone()], vec![pod.clone()]),
        &settings(),
        t(0),
    );
    assert_eq!(plan.actions, vec![stop_pod(2, DeleteWhy::TemplateChanged)]);
    // A running one is left to finish.
    let mut running = drain_pod(2, DrainPhase::Running, &[&c]);
    drain_of(&mut running).template_hash = Some("h0".to_owned());
    let plan = super::plan(&snap(2, vec![c], vec![running]), &settings(), t(0));
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
}

#[test]
fn a_changed_template_replaces_a_pod_waiting_to_be_restarted_in_place_but_not_one_running() {
    // restartPolicy OnFailure: the kubelet would rerun the old template in the same pod.
    let c = with_record(claim("data", 2), running_record(2));
    let crash_looping = |hash: &str, running: bool| {
        let mut pod = drain_pod(2, DrainPhase::Running, &[&c]);
        let d = drain_of(&mut pod);
        d.template_hash = Some(hash.to_owned());
        d.restarts = 1;
        d.running = running;
        d.failure = Some("exit code 1".to_owned());
        pod
    };
    let plan_for = |pod: PodObs| plan(&snap(2, vec![c.clone()], vec![pod]), &settings(), t(0));

    let waiting = plan_for(crash_looping("h0", false));
    assert_eq!(
        waiting.actions,
        vec![stop_pod(2, DeleteWhy::TemplateChanged)]
    );
    assert!(
        matches!(&waiting.status[&2], OrdinalState::Waiting { reason } if reason.contains("template changed")),
        "{:?}",
        waiting.status
    );
    // Restarted and running again: it finishes.
    let running = plan_for(crash_looping("h0", true));
    assert!(running.actions.is_empty(), "{:?}", running.actions);
    // Today's template waits for its restart (up to --max-restarts).
    let today = plan_for(crash_looping(HASH, false));
    assert!(today.actions.is_empty(), "{:?}", today.actions);
}

#[test]
fn a_changed_template_starts_a_new_series_even_after_giving_up() {
    let record = DrainRecord {
        attempts: 2,
        retry_after: Some(t(50)),
        counted_pod_uid: Some("drain-pod-2".to_owned()),
        last_failure: Some("stuck".to_owned()),
        template_hash: Some("h0".to_owned()),
        ..running_record(2)
    };
    let c = with_record(claim("data", 2), record);
    let s = Settings {
        max_attempts: Some(2),
        ..settings()
    };
    let plan = plan(&snap(2, vec![c.clone()], vec![]), &s, t(0));
    assert_eq!(plan.actions, vec![create(2, &[&c], 1, Some(t(0)))]);
    // With the same template it stays given up.
    let same = with_record(
        claim("data", 2),
        DrainRecord {
            template_hash: Some(HASH.to_owned()),
            ..c.record.clone()
        },
    );
    let plan = super::plan(&snap(2, vec![same], vec![]), &s, t(0));
    assert!(plan.actions.is_empty());
    assert!(matches!(plan.status[&2], OrdinalState::Failed { .. }));
}

#[test]
fn the_vanished_pod_of_an_older_template_is_not_counted() {
    let record = DrainRecord {
        template_hash: Some("h0".to_owned()),
        ..running_record(2)
    };
    let c = with_record(claim("data", 2), record);
    let plan = plan(&snap(2, vec![c.clone()], vec![]), &settings(), t(0));
    assert_eq!(plan.actions, vec![create(2, &[&c], 1, Some(t(0)))]);
}

#[test]
fn with_drains_stopped_flights_complete_but_nothing_new_starts() {
    let stopped = Settings {
        new_drains: NewDrains::Stopped {
            why: "the set opted out of draining".to_owned(),
        },
        ..settings()
    };
    let c2 = with_record(claim("data", 2), running_record(2));
    let c1 = claim("data", 1);
    let pods = vec![drain_pod(2, DrainPhase::Succeeded, &[&c2])];
    let plan = plan(&snap(1, vec![c1, c2.clone()], pods), &stopped, t(0));
    assert_eq!(
        plan.actions,
        vec![
            Action::DeleteClaims {
                ordinal: 2,
                claims: refs(&[&c2])
            },
            delete_pod(2, DeleteWhy::Succeeded),
        ]
    );
    assert_eq!(
        plan.status[&1],
        OrdinalState::Waiting {
            reason: "no new drain: the set opted out of draining".to_owned()
        }
    );
}

#[test]
fn with_drains_stopped_a_returning_ordinal_is_cancelled_even_under_finish() {
    let stopped = Settings {
        new_drains: NewDrains::Stopped {
            why: "invalid".to_owned(),
        },
        ..finish()
    };
    let c = with_record(claim("data", 2), running_record(2));
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c])];
    let plan = plan(&snap(3, vec![c], pods), &stopped, t(0));
    assert_eq!(plan.actions[0], stop_pod(2, DeleteWhy::Cancelled));
}

#[test]
fn a_foreign_pod_blocks_is_reported_once_and_never_touched() {
    let c = claim("data", 2);
    let mut foreign = stateful_pod(2);
    foreign.kind = PodKind::Foreign;
    let mut s = snap(2, vec![c], vec![foreign]);
    let plan1 = plan(&s, &settings(), t(0));
    assert_eq!(plan1.actions.len(), 1);
    assert!(matches!(
        plan1.actions[0],
        Action::Warn {
            reason: "DrainBlocked",
            ..
        }
    ));
    assert!(matches!(plan1.status[&2], OrdinalState::Blocked { .. }));
    // Reported already: no new warning.
    s.previous = plan1.status.clone();
    let plan2 = plan(&s, &settings(), t(1));
    assert!(plan2.actions.is_empty(), "{:?}", plan2.actions);
    assert_eq!(plan2.status, plan1.status);
}

#[test]
fn a_pod_made_by_hand_blocks_its_ordinal_without_a_slot_and_is_looked_at_again() {
    // Ordinal 2's name is held by a pod nobody here made; ordinal 1 must still drain with one
    // slot, and ordinal 2 shows blocked (not draining), warned once, rechecked soon.
    let mut by_hand = stateful_pod(2);
    by_hand.kind = PodKind::Unknown;
    let c1 = claim("data", 1);
    let c2 = claim("data", 2);
    let mut s = snap(1, vec![c2, c1.clone()], vec![by_hand]);
    let plan1 = plan(&s, &settings(), t(0));
    assert!(plan1.actions.contains(&create(1, &[&c1], 1, Some(t(0)))));
    assert!(
        !plan1
            .actions
            .iter()
            .any(|a| matches!(a, Action::CreateDrainPod { ordinal: 2, .. })),
        "{:?}",
        plan1.actions
    );
    let OrdinalState::Blocked { reason } = &plan1.status[&2] else {
        panic!("{:?}", plan1.status[&2]);
    };
    assert!(
        reason.contains("made neither by the set nor by this controller"),
        "{reason}"
    );
    assert!(plan1.actions.iter().any(|a| matches!(
        a,
        Action::Warn {
            ordinal: 2,
            reason: "DrainBlocked",
            ..
        }
    )));
    assert!(
        plan1
            .requeue_after
            .is_some_and(|r| r <= RECHECK_UNKNOWN_POD)
    );
    s.previous = plan1.status.clone();
    let plan2 = plan(&s, &settings(), t(1));
    assert!(
        !plan2
            .actions
            .iter()
            .any(|a| matches!(a, Action::Warn { .. })),
        "warned once: {:?}",
        plan2.actions
    );
}

#[test]
fn a_foreign_pod_does_not_take_a_drain_slot() {
    let mut foreign = stateful_pod(2);
    foreign.kind = PodKind::Foreign;
    let c1 = claim("data", 1);
    let plan = plan(
        &snap(1, vec![claim("data", 2), c1.clone()], vec![foreign]),
        &settings(),
        t(0),
    );
    assert!(plan.actions.contains(&create(1, &[&c1], 1, Some(t(0)))));
}

// ---- progress and stalls -------------------------------------------------------------------

fn progress(moved: u64, changed_at: Timestamp) -> DrainProgress {
    DrainProgress {
        records_moved: moved,
        records_remaining: 10,
        bytes_moved: moved * 100,
        bytes_remaining: 1000,
        bytes_sent: moved * 100,
        changed_at: changed_at.to_string(),
    }
}

fn stalls_after(secs: u64) -> Settings {
    Settings {
        stall_after: Some(Duration::from_secs(secs)),
        ..settings()
    }
}

fn running_with(c: &Claim, progress: Option<DrainProgress>) -> PodObs {
    let mut pod = drain_pod(2, DrainPhase::Running, &[c]);
    drain_of(&mut pod).progress = progress;
    pod
}

#[test]
fn published_progress_is_copied_into_the_status() {
    let c = with_record(claim("data", 2), running_record(2));
    let p = progress(3, t(-5));
    let pods = vec![running_with(&c, Some(p.clone()))];
    let plan = plan(&snap(2, vec![c], pods), &stalls_after(60), t(0));
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(
        plan.status[&2],
        OrdinalState::Draining {
            attempt: 1,
            progress: Some(p),
            note: None,
        }
    );
    assert_eq!(
        plan.requeue_after,
        Some(Duration::from_secs(55)),
        "looks again when it would stall"
    );
}

#[rstest]
#[case::progress_too_old(Some(-61), "stalled: no progress for 1m")]
#[case::never_published_since_start(None, "stalled: no published progress for 1m")]
fn a_drain_without_progress_for_the_stall_time_is_a_failed_attempt(
    #[case] changed: Option<i64>,
    #[case] reason_starts: &str,
) {
    let c = with_record(claim("data", 2), running_record(2));
    let mut pod = running_with(&c, changed.map(|s| progress(3, t(s))));
    drain_of(&mut pod).started_at = Some(t(-80));
    let plan = plan(&snap(2, vec![c], vec![pod]), &stalls_after(60), t(0));
    assert_eq!(plan.actions.len(), 2, "{:?}", plan.actions);
    match &plan.actions[0] {
        Action::RecordFailure { kind, reason, .. } => {
            assert_eq!(*kind, FailureKind::Stalled);
            assert!(reason.starts_with(reason_starts), "{reason}");
        }
        other => panic!("expected RecordFailure, got {other:?}"),
    }
    assert_eq!(plan.actions[1], stop_pod(2, DeleteWhy::Stalled));
    assert!(matches!(plan.status[&2], OrdinalState::Retrying { .. }));
}

#[test]
fn recent_progress_or_a_recent_start_is_no_stall() {
    let c = with_record(claim("data", 2), running_record(2));
    // Progress is old but the container restarted recently: measured from the restart.
    let mut pod = running_with(&c, Some(progress(3, t(-500))));
    drain_of(&mut pod).started_at = Some(t(-10));
    let plan1 = plan(
        &snap(2, vec![c.clone()], vec![pod]),
        &stalls_after(60),
        t(0),
    );
    assert!(plan1.actions.is_empty(), "{:?}", plan1.actions);
    // Without the annotation on the set, nothing is ever a stall.
    let pod = running_with(&c, Some(progress(3, t(-5000))));
    let plan2 = plan(&snap(2, vec![c.clone()], vec![pod]), &settings(), t(0));
    assert!(plan2.actions.is_empty(), "{:?}", plan2.actions);
    // A pod that has not started is the stuck rule's business, not the stall rule's.
    let pending = drain_pod(2, DrainPhase::Pending, &[&c]);
    let plan3 = plan(&snap(2, vec![c], vec![pending]), &stalls_after(1), t(0));
    assert!(plan3.actions.is_empty(), "{:?}", plan3.actions);
}

#[test]
fn a_stall_counts_against_max_attempts() {
    let record = DrainRecord {
        attempts: 2,
        ..running_record(2)
    };
    let c = with_record(claim("data", 2), record);
    let pod = running_with(&c, Some(progress(3, t(-100))));
    let settings = Settings {
        max_attempts: Some(3),
        ..stalls_after(60)
    };
    let plan = plan(&snap(2, vec![c], vec![pod]), &settings, t(0));
    assert!(
        matches!(
            &plan.actions[0],
            Action::RecordFailure {
                gave_up: true,
                kind: FailureKind::Stalled,
                ..
            }
        ),
        "{:?}",
        plan.actions
    );
    assert!(matches!(plan.status[&2], OrdinalState::Failed { .. }));
}

// ---- manual approval ------------------------------------------------------------------------

fn manual() -> Settings {
    Settings {
        manual_approval: true,
        ..settings()
    }
}

fn approved(mut c: Claim) -> Claim {
    c.record.approved = true;
    c
}

#[test]
fn a_succeeded_drain_waits_for_approval_and_says_so_once() {
    let c = claim("data", 2);
    let mut s = snap(
        2,
        vec![c.clone()],
        vec![drain_pod(2, DrainPhase::Succeeded, &[&c])],
    );
    let first = plan(&s, &manual(), t(0));
    assert_eq!(
        first.actions,
        vec![Action::AwaitApproval {
            ordinal: 2,
            claims: refs(&[&c])
        }]
    );
    let waiting = OrdinalState::AwaitingApproval {
        since: t(0).to_string(),
        claims: vec![c.name.clone()],
    };
    assert_eq!(first.status[&2], waiting);
    // Later reconciles: nothing to do, the same state (no new Event, no status rewrite).
    s.previous.insert(2, waiting.clone());
    let later = plan(&s, &manual(), t(60));
    assert_eq!(later.actions, vec![]);
    assert_eq!(later.status[&2], waiting);
}

#[test]
fn approved_claims_are_deleted_then_the_drain_pod() {
    let c = approved(claim("data", 2));
    let s = snap(
        2,
        vec![c.clone()],
        vec![drain_pod(2, DrainPhase::Succeeded, &[&c])],
    );
    assert_eq!(
        plan(&s, &manual(), t(0)).actions,
        vec![
            Action::DeleteClaims {
                ordinal: 2,
                claims: refs(&[&c])
            },
            delete_pod(2, DeleteWhy::Succeeded)
        ]
    );
}

#[test]
fn one_unapproved_claim_holds_every_claim_of_the_ordinal() {
    let (data, logs) = (approved(claim("data", 2)), claim("logs", 2));
    let s = snap(
        2,
        vec![data.clone(), logs.clone()],
        vec![drain_pod(2, DrainPhase::Succeeded, &[&data, &logs])],
    );
    let p = plan(&s, &manual(), t(0));
    assert_eq!(
        p.actions,
        vec![Action::AwaitApproval {
            ordinal: 2,
            claims: refs(&[&logs])
        }]
    );
}

#[test]
fn without_manual_approval_an_approval_is_not_needed() {
    let c = claim("data", 2);
    let s = snap(
        2,
        vec![c.clone()],
        vec![drain_pod(2, DrainPhase::Succeeded, &[&c])],
    );
    assert!(matches!(
        plan(&s, &settings(), t(0)).actions[0],
        Action::DeleteClaims { .. }
    ));
}

#[test]
fn a_drain_awaiting_approval_frees_its_slot_for_the_next_ordinal() {
    let (c2, c1) = (claim("data", 2), claim("data", 1));
    let s = snap(
        1,
        vec![c2.clone(), c1.clone()],
        vec![drain_pod(2, DrainPhase::Succeeded, &[&c2])],
    );
    let p = plan(&s, &manual(), t(0));
    assert!(
        p.actions.contains(&create(1, &[&c1], 1, Some(t(0)))),
        "{:?}",
        p.actions
    );
}

#[test]
fn a_scale_up_before_approval_gives_the_claims_back() {
    let c = with_record(
        claim("data", 2),
        DrainRecord {
            pod_uid: Some("drain-pod-2".to_owned()),
            ..DrainRecord::default()
        },
    );
    let s = snap(
        3,
        vec![c.clone()],
        vec![drain_pod(2, DrainPhase::Succeeded, &[&c])],
    );
    let p = plan(&s, &manual(), t(0));
    assert_eq!(
        p.actions,
        vec![
            delete_pod(2, DeleteWhy::ReturnedBeforeApproval),
            Action::ClearRecord {
                ordinal: 2,
                claims: refs(&[&c])
            }
        ]
    );
    assert!(!p.status.contains_key(&2));
}

// --- a crash between a drain pod's create and the record of its series ---------------------

/// The claims' record of an earlier series of another template, with counts and an old start.
fn earlier_series() -> DrainRecord {
    DrainRecord {
        attempts: 2,
        first_attempt_at: Some(t(-1000)),
        retry_after: Some(t(-500)),
        last_failure: Some("exit code 1".to_owned()),
        counted_pod_uid: Some("old-pod".to_owned()),
        pod_uid: Some("old-pod".to_owned()),
        template_hash: Some("h0".to_owned()),
        ..DrainRecord::default()
    }
}

#[rstest]
#[case::no_record(DrainRecord::default())]
#[case::an_earlier_series(earlier_series())]
fn a_drain_pod_whose_series_was_not_recorded_records_it_from_its_creation(
    #[case] record: DrainRecord,
) {
    let c = with_record(claim("data", 2), record);
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c])];
    let plan = plan(&snap(2, vec![c.clone()], pods), &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![Action::RecordDrainPod {
            ordinal: 2,
            claims: refs(&[&c]),
            pod_uid: "drain-pod-2".to_owned(),
            series: Some((t(-100), HASH.to_owned())),
        }]
    );
    assert_eq!(
        plan.status[&2],
        OrdinalState::Draining {
            attempt: 1,
            progress: None,
            note: None,
        }
    );
}

#[test]
fn an_unrecorded_series_is_not_judged_by_the_earlier_series_counts_or_deadline() {
    // Under the earlier series' counts (2 of 3 attempts) and start (t(-1000), deadline 500 s),
    // this failure would give up; it is the first attempt of a series started at t(-100).
    let c = with_record(claim("data", 2), earlier_series());
    let pods = vec![drain_pod(2, DrainPhase::Failed, &[&c])];
    let s = Settings {
        max_attempts: Some(3),
        deadline: Some(Duration::from_secs(500)),
        ..settings()
    };
    let plan = plan(&snap(2, vec![c.clone()], pods), &s, t(0));
    assert_eq!(
        plan.actions[0],
        Action::RecordFailure {
            ordinal: 2,
            claims: refs(&[&c]),
            pod_uid: "drain-pod-2".to_owned(),
            kind: FailureKind::Failed,
            attempts: 1,
            retry_after: t(10),
            reason: "exit code 1".to_owned(),
            gave_up: false,
            only_if_pod_gone: false,
            series: Some((t(-100), HASH.to_owned())),
        }
    );
    assert!(matches!(plan.status[&2], OrdinalState::Retrying { .. }));
    // A running pod of that series is not stopped for the earlier series' deadline either.
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c])];
    let plan = super::plan(&snap(2, vec![c], pods), &s, t(0));
    assert_deletes_no_drain_pod(&plan);
}

#[test]
fn a_recorded_series_or_a_pod_of_another_template_is_left_as_it_is() {
    let c = with_record(claim("data", 2), running_record(2));
    let pods = vec![drain_pod(2, DrainPhase::Running, &[&c])];
    assert!(
        plan(&snap(2, vec![c], pods), &settings(), t(0))
            .actions
            .is_empty()
    );
    // A pod of an earlier template keeps its own series' record (no repair toward today's).
    let c = with_record(claim("data", 2), earlier_series());
    let mut pod = drain_pod(2, DrainPhase::Running, &[&c]);
    drain_of(&mut pod).template_hash = Some("h0".to_owned());
    let plan = plan(&snap(2, vec![c.clone()], vec![pod]), &settings(), t(0));
    assert_eq!(
        plan.actions,
        vec![Action::RecordDrainPod {
            ordinal: 2,
            claims: refs(&[&c]),
            pod_uid: "drain-pod-2".to_owned(),
            series: None,
        }]
    );
}

// ---- settings a drain pod was made under, and sidecars (issue 22) -----------------------

#[test]
fn a_drain_made_under_retention_retains_its_volumes_after_the_set_opts_out() {
    let c = with_record(claim("data", 2), running_record(2));
    let mut pod = drain_pod(2, DrainPhase::Succeeded, &[&c]);
    drain_of(&mut pod).settings = Some(PodSettings {
        manual_approval: false,
        proof: SuccessProof::CompletionRecord,
        retain_volume_for: Some(Duration::from_secs(600)),
    });
    let opted_out = Settings {
        new_drains: NewDrains::Stopped {
            why: "the set opted out of draining".to_owned(),
        },
        ..settings()
    };
    let plan_now = plan(
        &snap(2, vec![c.clone()], vec![pod.clone()]),
        &opted_out,
        t(0),
    );
    assert_eq!(
        plan_now.actions[..2],
        [
            Action::RetainVolumes {
                ordinal: 2,
                claims: refs(&[&c]),
                until: t(600),
            },
            Action::DeleteClaims {
                ordinal: 2,
                claims: refs(&[&c]),
            },
        ]
    );
    // A retention too long to add to the time retains for ever rather than panicking.
    let ages = Settings {
        retain_volume_for: Some(Duration::from_secs(u64::MAX / 4)),
        ..settings()
    };
    let plan_ages = plan(&snap(2, vec![c.clone()], vec![pod]), &ages, t(0));
    assert!(matches!(
        plan_ages.actions[0],
        Action::RetainVolumes { until, .. } if until == Timestamp::MAX
    ));
}

#[test]
fn a_drain_made_under_manual_approval_still_waits_after_the_set_opts_out() {
    let c = with_record(claim("data", 2), running_record(2));
    let mut pod = drain_pod(2, DrainPhase::Succeeded, &[&c]);
    drain_of(&mut pod).settings = Some(PodSettings {
        manual_approval: true,
        proof: SuccessProof::CompletionRecord,
        retain_volume_for: None,
    });
    // Opted out: the set's own settings are the defaults (automatic approval).
    let opted_out = Settings {
        new_drains: NewDrains::Stopped {
            why: "the set opted out of draining".to_owned(),
        },
        ..settings()
    };
    let waiting = plan(&snap(2, vec![c.clone()], vec![pod]), &opted_out, t(0));
    assert_eq!(
        waiting.actions,
        vec![Action::AwaitApproval {
            ordinal: 2,
            claims: refs(&[&c])
        }]
    );
    // Approved: the claim goes.
    let approved = with_record(
        claim("data", 2),
        DrainRecord {
            approved: true,
            ..running_record(2)
        },
    );
    let mut pod = drain_pod(2, DrainPhase::Succeeded, &[&approved]);
    drain_of(&mut pod).settings = Some(PodSettings {
        manual_approval: true,
        proof: SuccessProof::CompletionRecord,
        retain_volume_for: None,
    });
    let plan = plan(
        &snap(2, vec![approved.clone()], vec![pod]),
        &opted_out,
        t(0),
    );
    assert_eq!(
        plan.actions[0],
        Action::DeleteClaims {
            ordinal: 2,
            claims: refs(&[&approved])
        }
    );
}

#[test]
fn a_drain_made_under_the_record_proof_still_needs_it_after_the_set_switches_to_exit_code() {
    let c = with_record(claim("data", 2), running_record(2));
    let mut pod = without_record(drain_pod(2, DrainPhase::Succeeded, &[&c]));
    drain_of(&mut pod).settings = Some(PodSettings {
        manual_approval: false,
        proof: SuccessProof::CompletionRecord,
        retain_volume_for: None,
    });
    let plan = plan(&snap(2, vec![c.clone()], vec![pod]), &exit_code(), t(0));
    assert_eq!(
        plan.actions,
        vec![
            failure(&c, FailureKind::Unproven, NO_RECORD),
            delete_pod(2, DeleteWhy::Failed),
        ]
    );
}

#[test]
fn a_completion_record_proves_the_drain_while_a_sidecar_keeps_the_pod_running() {
    let c = with_record(claim("data", 2), running_record(2));
    let mut pod = drain_pod(2, DrainPhase::Running, &[&c]);
    // The drain container exited 0 with its record; an injected proxy still runs.
    let d = drain_of(&mut pod);
    d.containers[0].record = Some(d.containers[0].claims.clone());
    d.containers.push(container(false, &BTreeMap::new(), None));
    let proven = plan(
        &snap(2, vec![c.clone()], vec![pod.clone()]),
        &settings(),
        t(0),
    );
    assert_eq!(
        proven.actions,
        vec![
            Action::DeleteClaims {
                ordinal: 2,
                claims: refs(&[&c])
            },
            delete_pod(2, DeleteWhy::Succeeded),
        ]
    );
    // Under exit-code the running pod has not finished.
    let running = plan(&snap(2, vec![c], vec![pod]), &exit_code(), t(0));
    assert!(
        !running
            .actions
            .iter()
            .any(|a| matches!(a, Action::DeleteClaims { .. })),
        "{:?}",
        running.actions
    );
}

#[test]
fn a_drain_pod_kept_running_by_a_container_that_never_exits_says_so_once() {
    let c = with_record(claim("data", 2), running_record(2));
    let mut pod = drain_pod(2, DrainPhase::Running, &[&c]);
    // The drain container exited 0 without a record (exit-code image); a proxy runs on.
    drain_of(&mut pod).lingering = vec!["proxy".to_owned()];
    let first = plan(
        &snap(2, vec![c.clone()], vec![pod.clone()]),
        &exit_code(),
        t(0),
    );
    let Some(Action::Warn {
        reason, message, ..
    }) = first.actions.first()
    else {
        panic!("{:?}", first.actions)
    };
    assert_eq!(*reason, "DrainPodNotEnding");
    assert!(message.contains("proxy"), "{message}");
    let OrdinalState::Draining {
        note: Some(note), ..
    } = &first.status[&2]
    else {
        panic!("{:?}", first.status)
    };
    assert_eq!(note, message);
    // Told once: the next reconcile reports it in the status only.
    let mut again = snap(2, vec![c], vec![pod]);
    again.previous = first.status.clone();
    let second = plan(&again, &exit_code(), t(1));
    assert!(second.actions.is_empty(), "{:?}", second.actions);
    assert_eq!(second.status, first.status);
}

/// A drain pod of `data` and `index` claims with one container per claim: `data` still
/// draining, `index` done with the record `index_record`.
fn per_claim_pod(data: &Claim, index: &Claim, index_record: &BTreeMap<String, String>) -> PodObs {
    let mut pod = drain_pod(2, DrainPhase::Running, &[data, index]);
    let own = |c: &Claim| BTreeMap::from([(c.name.clone(), c.uid.clone())]);
    drain_of(&mut pod).containers = vec![
        container(false, &own(data), None),
        container(true, &own(index), Some(index_record)),
    ];
    pod
}

#[test]
fn one_containers_record_proves_no_claim_another_container_drains() {
    let data = with_record(claim("data", 2), running_record(2));
    let index = with_record(claim("index", 2), running_record(2));
    let own_index = BTreeMap::from([(index.name.clone(), index.uid.clone())]);
    let whole_pod = BTreeMap::from([
        (data.name.clone(), data.uid.clone()),
        (index.name.clone(), index.uid.clone()),
    ]);
    // The index container finished (with its own record, or one naming the whole pod, as every
    // container was given before) while the data container still drains: nothing is deleted.
    for record in [&own_index, &whole_pod] {
        let pod = per_claim_pod(&data, &index, record);
        let s = snap(2, vec![data.clone(), index.clone()], vec![pod]);
        let plan = plan(&s, &settings(), t(0));
        assert!(
            !plan.actions.iter().any(|a| matches!(
                a,
                Action::DeleteClaims { .. } | Action::DeleteDrainPod { .. }
            )),
            "{record:?}: {:?}",
            plan.actions
        );
        assert!(matches!(plan.status[&2], OrdinalState::Draining { .. }));
    }
    // Once the data container exited 0 with its record, both claims go.
    let mut pod = per_claim_pod(&data, &index, &own_index);
    drain_of(&mut pod).containers[0].record =
        Some(BTreeMap::from([(data.name.clone(), data.uid.clone())]));
    let s = snap(2, vec![data.clone(), index.clone()], vec![pod]);
    assert_eq!(
        plan(&s, &settings(), t(0)).actions,
        vec![
            Action::DeleteClaims {
                ordinal: 2,
                claims: refs(&[&data, &index])
            },
            delete_pod(2, DeleteWhy::Succeeded),
        ]
    );
}

#[test]
fn a_pod_that_ended_with_a_claim_its_container_did_not_prove_is_unproven() {
    let data = with_record(claim("data", 2), running_record(2));
    let index = with_record(claim("index", 2), running_record(2));
    let whole_pod = BTreeMap::from([
        (data.name.clone(), data.uid.clone()),
        (index.name.clone(), index.uid.clone()),
    ]);
    // The data container exited 0 without its record (stopped mid-drain by a program that
    // exits 0 on SIGTERM); the index one wrote a record naming both claims.
    let mut pod = per_claim_pod(&data, &index, &whole_pod);
    drain_of(&mut pod).phase = DrainPhase::Succeeded;
    let s = snap(2, vec![data.clone(), index.clone()], vec![pod]);
    let plan = plan(&s, &settings(), t(0));
    assert!(
        !plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::DeleteClaims { .. })),
        "{:?}",
        plan.actions
    );
    let Action::RecordFailure { kind, reason, .. } = &plan.actions[0] else {
        panic!("{:?}", plan.actions)
    };
    assert_eq!(*kind, FailureKind::Unproven);
    assert!(
        reason.contains(&format!(
            "container unfinished (draining {} ({})) has not exited 0 with its completion record",
            data.name, data.uid
        )) && reason.contains("container finished's completion record names claims"),
        "{reason}"
    );
}

#[test]
fn the_status_keeps_only_the_newest_done_ordinals() {
    let mut s = snap(1, vec![], vec![]);
    for o in 1..=(DONE_KEPT as i32 + 20) {
        s.previous.insert(
            o,
            OrdinalState::Done {
                at: t(i64::from(o)).to_string(),
            },
        );
    }
    // One with a time that does not parse is the first to go.
    s.previous.insert(
        500,
        OrdinalState::Done {
            at: "garbage".to_owned(),
        },
    );
    let first = plan(&s, &settings(), t(1000));
    let kept: Vec<i32> = first.status.keys().copied().collect();
    let newest: Vec<i32> = (21..=(DONE_KEPT as i32 + 20)).collect();
    assert_eq!(kept, newest);
    // A fresh success is among the kept.
    let c = with_record(claim("data", 600), running_record(600));
    s.claims.push(c.clone());
    s.pods.push(drain_pod(600, DrainPhase::Succeeded, &[&c]));
    let plan = plan(&s, &settings(), t(1000));
    assert!(matches!(plan.status[&600], OrdinalState::Done { .. }));
    assert_eq!(plan.status.len(), DONE_KEPT);
}

#[test]
fn a_claim_restored_from_a_retained_volume_is_held_until_its_pod_comes_back() {
    let mut c = claim("data", 2);
    c.record.held = true;
    let plan = plan(&snap(2, vec![c.clone()], vec![]), &settings(), t(0));
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    let OrdinalState::Waiting { reason } = &plan.status[&2] else {
        panic!("{:?}", plan.status)
    };
    assert!(reason.contains("data-web-2 is held"), "{reason}");
    // The set brings its pod back: the hold is cleared with the record.
    let back = plan_fn(&snap(3, vec![c.clone()], vec![stateful_pod(2)]));
    assert_eq!(
        back.actions,
        vec![Action::ClearRecord {
            ordinal: 2,
            claims: refs(&[&c])
        }]
    );
}

fn plan_fn(s: &Snapshot) -> Plan {
    plan(s, &settings(), t(0))
}

fn quiet_after(secs: u64) -> Settings {
    Settings {
        quiet_after: Some(Duration::from_secs(secs)),
        ..settings()
    }
}

#[test]
fn a_drain_that_shows_nothing_for_the_quiet_time_is_warned_once_and_left_running() {
    let c = with_record(claim("data", 2), running_record(2));
    // Started at -90, no progress, no container change since.
    let pod = drain_pod(2, DrainPhase::Running, &[&c]);
    let before = plan(
        &snap(2, vec![c.clone()], vec![pod.clone()]),
        &quiet_after(100),
        t(0),
    );
    assert!(before.actions.is_empty(), "{:?}", before.actions);
    assert!(before.quiet.is_empty());
    assert_eq!(before.requeue_after, Some(Duration::from_secs(10)));
    let first = plan(
        &snap(2, vec![c.clone()], vec![pod.clone()]),
        &quiet_after(100),
        t(20),
    );
    let [
        Action::Warn {
            reason, message, ..
        },
    ] = first.actions.as_slice()
    else {
        panic!("{:?}", first.actions)
    };
    assert_eq!(*reason, "DrainQuiet");
    assert!(message.contains("left running"), "{message}");
    assert!(first.quiet.contains(&2));
    // Told once; never stopped for it.
    let mut again = snap(2, vec![c.clone()], vec![pod.clone()]);
    again.previous = first.status.clone();
    let second = plan(&again, &quiet_after(100), t(500));
    assert!(second.actions.is_empty(), "{:?}", second.actions);
    assert!(second.quiet.contains(&2));
    // A container that restarted, or progress published, is a change: quiet no more.
    let mut changed = pod.clone();
    drain_of(&mut changed).changed_at = Some(t(15));
    let p = plan(
        &snap(2, vec![c.clone()], vec![changed]),
        &quiet_after(100),
        t(20),
    );
    assert!(
        p.actions.is_empty() && p.quiet.is_empty(),
        "{:?}",
        p.actions
    );
    let p = plan(
        &snap(
            2,
            vec![c.clone()],
            vec![running_with(&c, Some(progress(3, t(15))))],
        ),
        &quiet_after(100),
        t(20),
    );
    assert!(
        p.actions.is_empty() && p.quiet.is_empty(),
        "{:?}",
        p.actions
    );
    // Off: never.
    let off = Settings {
        quiet_after: None,
        ..settings()
    };
    let p = plan(&snap(2, vec![c.clone()], vec![pod]), &off, t(5000));
    assert!(
        p.actions.is_empty() && p.quiet.is_empty(),
        "{:?}",
        p.actions
    );
}

fn deleting(mut pod: PodObs, due: i64, finalizers: &[&str], node: Option<&str>) -> PodObs {
    pod.terminating = true;
    pod.deletion = Some(Deletion {
        due: Some(t(due)),
        finalizers: finalizers.iter().map(|f| (*f).to_owned()).collect(),
        node: node.map(str::to_owned),
    });
    pod
}

#[test]
fn a_drain_pod_stuck_terminating_is_a_stuck_attempt_naming_what_holds_it() {
    let c = with_record(claim("data", 2), running_record(2));
    let pod = |finalizers: &[&str], node| {
        deleting(
            drain_pod(2, DrainPhase::Running, &[&c]),
            -400,
            finalizers,
            node,
        )
    };
    // Within stuck_after (300 s) of its grace period's end: waited for.
    let early = plan(
        &snap(2, vec![c.clone()], vec![pod(&[], Some("n1"))]),
        &settings(),
        t(-200),
    );
    assert!(early.actions.is_empty(), "{:?}", early.actions);
    assert!(matches!(early.status[&2], OrdinalState::Waiting { .. }));
    for (finalizers, node, named) in [
        (
            &["example.com/hold"][..],
            Some("n1"),
            "finalizers example.com/hold keep it",
        ),
        (
            &[][..],
            Some("n1"),
            "its node n1 does not confirm it stopped",
        ),
    ] {
        let p = plan(
            &snap(2, vec![c.clone()], vec![pod(finalizers, node)]),
            &settings(),
            t(0),
        );
        let Some(Action::RecordFailure { kind, reason, .. }) = p.actions.first() else {
            panic!("{:?}", p.actions)
        };
        assert_eq!(*kind, FailureKind::Stuck);
        assert!(reason.contains(named), "{reason}");
        assert!(
            !p.actions
                .iter()
                .any(|a| matches!(a, Action::DeleteClaims { .. }))
        );
    }
    // Past the deadline, counted: it gives up (the claims are kept).
    let mut counted = with_record(claim("data", 2), running_record(2));
    counted.record.counted_pod_uid = Some("drain-pod-2".to_owned());
    counted.record.first_attempt_at = Some(t(-10_000));
    let with_deadline = Settings {
        deadline: Some(Duration::from_secs(600)),
        ..settings()
    };
    let p = plan(
        &snap(
            2,
            vec![counted.clone()],
            vec![deleting(
                drain_pod(2, DrainPhase::Running, &[&counted]),
                -400,
                &[],
                None,
            )],
        ),
        &with_deadline,
        t(0),
    );
    assert!(
        matches!(p.status[&2], OrdinalState::Failed { .. }),
        "{:?}",
        p.status
    );
}

#[test]
fn a_removed_stateful_pod_stuck_terminating_blocks_with_a_warning() {
    let c = with_record(claim("data", 2), DrainRecord::default());
    let pod = deleting(stateful_pod(2), -400, &["example.com/hold"], None);
    let p = plan(
        &snap(2, vec![c.clone()], vec![pod.clone()]),
        &settings(),
        t(0),
    );
    let [
        Action::Warn {
            reason, message, ..
        },
    ] = p.actions.as_slice()
    else {
        panic!("{:?}", p.actions)
    };
    assert_eq!(*reason, "DrainBlocked");
    assert!(
        message.contains("example.com/hold") && message.contains("web-2"),
        "{message}"
    );
    let fresh = deleting(stateful_pod(2), -10, &[], None);
    let p = plan(&snap(2, vec![c], vec![fresh]), &settings(), t(0));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(matches!(p.status[&2], OrdinalState::Waiting { .. }));
}

mod nodes;
