//! The checker itself is tested on made-up histories: each invariant is shown to catch the
//! violation it is for, and to accept the legitimate history next to it.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use serde_json::{Value, json};

use super::*;
use crate::history::{Change, Entry, History, Obj};
use crate::witness::{Report, Witness};

fn claim(name: &str, uid: &str, deleting: bool, annotations: Value) -> Obj {
    let mut meta = json!({"name": name, "uid": uid, "annotations": annotations});
    if deleting {
        meta["deletionTimestamp"] = json!("2026-01-01T00:10:00Z");
    }
    Obj::Claim(Box::new(
        serde_json::from_value::<PersistentVolumeClaim>(json!({"metadata": meta})).unwrap(),
    ))
}

/// A drain pod `name` mounting `claims`, in `phase`, its container finished at `finished`
/// (seconds past 00:00) with `code`; `deleted`: (deletionTimestamp seconds, grace seconds).
fn drain_pod(
    name: &str,
    uid: &str,
    claims: &[&str],
    phase: &str,
    finished: Option<(u32, i32)>,
    deleted: Option<(u32, i64)>,
) -> Obj {
    drain_pod_with_message(name, uid, claims, phase, finished, deleted, None)
}

/// As [`drain_pod`], its container's termination message `message`.
fn drain_pod_with_message(
    name: &str,
    uid: &str,
    claims: &[&str],
    phase: &str,
    finished: Option<(u32, i32)>,
    deleted: Option<(u32, i64)>,
    message: Option<&str>,
) -> Obj {
    let volumes: Vec<Value> = claims
        .iter()
        .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    let mut meta = json!({"name": name, "uid": uid,
        "labels": {crate::DRAIN_POD_LABEL: "web"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                             "uid": "set-uid"}]});
    if let Some((at, grace)) = deleted {
        meta["deletionTimestamp"] = json!(ts(at));
        meta["deletionGracePeriodSeconds"] = json!(grace);
    }
    let state = match finished {
        Some((at, code)) => json!({"terminated": {"exitCode": code, "finishedAt": ts(at),
                                                  "message": message}}),
        None => json!({"running": {}}),
    };
    pod(json!({"metadata": meta,
        "spec": {"containers": [{"name": "drain"}], "volumes": volumes},
        "status": {"phase": phase, "containerStatuses": [{"name": "drain", "ready": false,
            "restartCount": 0, "image": "x", "imageID": "", "state": state}]}}))
}

fn stateful_pod(name: &str, uid: &str, claims: &[&str]) -> Obj {
    let volumes: Vec<Value> = claims
        .iter()
        .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    pod(json!({"metadata": {"name": name, "uid": uid,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                             "uid": "set-uid", "controller": true}]},
        "spec": {"containers": [{"name": "app"}], "volumes": volumes}}))
}

fn pod(v: Value) -> Obj {
    Obj::Pod(Box::new(serde_json::from_value::<Pod>(v).unwrap()))
}

fn set(replicas: i32, opted_in: bool) -> Obj {
    let annotations = if opted_in {
        json!({crate::TEMPLATE_ANNOTATION: "{}"})
    } else {
        json!({})
    };
    Obj::Set(Box::new(
        serde_json::from_value::<StatefulSet>(json!({
            "metadata": {"name": "web", "uid": "set-uid", "annotations": annotations},
            "spec": {"replicas": replicas, "serviceName": "web",
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}},
                "volumeClaimTemplates": [{"metadata": {"name": "data"}}]}
        }))
        .unwrap(),
    ))
}

fn ts(seconds: u32) -> String {
    format!("2026-01-01T00:{:02}:{:02}Z", seconds / 60, seconds % 60)
}

/// The instant the made-up histories start at.
static START: LazyLock<Instant> = LazyLock::new(Instant::now);

/// `seconds` after [`START`].
fn t(seconds: f64) -> Instant {
    *START + Duration::from_secs_f64(seconds)
}

/// A history of `changes`, entry `i` at revision `100 + i`, received at `t(i)`.
fn history(changes: Vec<Change>) -> History {
    History {
        entries: changes
            .into_iter()
            .enumerate()
            .map(|(i, change)| Entry {
                rv: 100 + i as u64,
                at: t(i as f64),
                change,
            })
            .collect(),
    }
}

/// A completion report naming `claims` (name, UID) that reached the witness at `t(at)`.
fn report(at: f64, claims: &[(&str, &str)]) -> Report {
    Report {
        at: t(at),
        claims: claims
            .iter()
            .map(|(n, u)| ((*n).to_owned(), (*u).to_owned()))
            .collect(),
    }
}

/// I1 judged from these reports.
fn reports(r: Vec<Report>) -> Witness {
    Witness::Reports(r)
}

use Change::{Applied as A, Deleted as D};

fn one_violation(v: &Verdict, needle: &str) {
    assert_eq!(v.violations.len(), 1, "{v}");
    assert!(v.violations[0].contains(needle), "{v}");
}

/// A drain that ran, reported at t(2.5) and exited 0; its claim deleted at entry 3.
fn drained_and_deleted() -> History {
    history(vec![
        A(claim("data-web-2", "c1", false, json!({}))),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Running",
            None,
            None,
        )),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Succeeded",
            Some((10, 0)),
            None,
        )),
        A(claim("data-web-2", "c1", true, json!({}))),
        D(claim("data-web-2", "c1", true, json!({}))),
        D(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Succeeded",
            Some((10, 0)),
            Some((12, 0)),
        )),
    ])
}

#[test]
fn a_claim_deleted_after_its_drain_reported_completion_is_fine() {
    let v = check(
        &drained_and_deleted(),
        &reports(vec![report(1.5, &[("data-web-2", "c1")])]),
    );
    assert!(v.ok(), "{v}");
    assert_eq!(
        (
            v.claims_deleted,
            v.completions_witnessed,
            v.drain_pods_ended,
            v.exits_unwitnessed
        ),
        (1, 1, 1, 0)
    );
}

#[test]
fn a_claim_deleted_after_its_drain_exited_0_on_sigterm_without_reporting_violates_i1() {
    // The mutation a controller trusting exit 0 makes: the drain pod was stopped with SIGTERM
    // (here by a liveness probe: no delete request, so the old rule of "every container exited
    // 0 before any delete request" held) and its script answered with `exit 0`; it never
    // reported, and its claim was deleted.
    let h = history(vec![
        A(claim("data-web-2", "c1", false, json!({}))),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Running",
            None,
            None,
        )),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Succeeded",
            Some((10, 0)),
            None,
        )),
        A(claim("data-web-2", "c1", true, json!({}))),
    ]);
    let v = check(&h, &reports(vec![]));
    one_violation(&v, "I1: claim data-web-2 (c1) deleted at revision 103");
    assert!(
        v.violations[0].contains("exited 0: [\"web-2 (p1)\"]"),
        "{v}"
    );
    assert_eq!((v.drain_pods_ended, v.exits_unwitnessed), (1, 1));
    // The same with a delete request the script answered with `exit 0`.
    let h = history(vec![
        A(claim("data-web-2", "c1", false, json!({}))),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Running",
            None,
            Some((50, 30)),
        )),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Succeeded",
            Some((21, 0)),
            Some((50, 30)),
        )),
        A(claim("data-web-2", "c1", true, json!({}))),
    ]);
    one_violation(&check(&h, &reports(vec![])), "I1: claim data-web-2 (c1)");
}

#[test]
fn a_claim_deleted_while_its_drain_runs_violates_i1() {
    let v = check(
        &history(vec![
            A(claim("data-web-2", "c1", false, json!({}))),
            A(drain_pod(
                "web-2",
                "p1",
                &["data-web-2"],
                "Running",
                None,
                None,
            )),
            A(claim("data-web-2", "c1", true, json!({}))),
        ]),
        &reports(vec![]),
    );
    one_violation(&v, "I1: claim data-web-2 (c1) deleted at revision 102");
    assert_eq!((v.drain_pods_ended, v.exits_unwitnessed), (0, 0));
}

#[test]
fn a_report_that_arrives_after_the_deletion_was_seen_does_not_count() {
    // The deletion was first seen at t(3) (its deletion timestamp); the report at t(3.5).
    let v = check(
        &drained_and_deleted(),
        &reports(vec![report(3.5, &[("data-web-2", "c1")])]),
    );
    one_violation(
        &v,
        "(first seen +3.000s) with no completion report naming it before",
    );
    assert!(v.violations[0].contains("c1 at +3.500s"), "{v}");
}

#[test]
fn a_report_for_another_uid_of_the_claim_does_not_count() {
    // The claim was recreated (c2): the report of the first claim's drain names c1.
    let v = check(
        &history(vec![
            A(claim("data-web-2", "c1", false, json!({}))),
            A(claim("data-web-2", "c1", true, json!({}))),
            D(claim("data-web-2", "c1", true, json!({}))),
            A(claim("data-web-2", "c2", false, json!({}))),
            A(drain_pod(
                "web-2",
                "p2",
                &["data-web-2"],
                "Running",
                None,
                None,
            )),
            A(claim("data-web-2", "c2", true, json!({}))),
        ]),
        &reports(vec![report(0.5, &[("data-web-2", "c1")])]),
    );
    one_violation(&v, "I1: claim data-web-2 (c2)");
}

#[test]
fn a_report_for_another_claim_does_not_count() {
    let witness = reports(vec![report(
        1.5,
        &[("data-web-1", "c1"), ("logs-web-2", "c1")],
    )]);
    let v = check(&drained_and_deleted(), &witness);
    one_violation(&v, "I1: claim data-web-2 (c1)");
    assert_eq!(v.exits_unwitnessed, 1, "{v}");
}

#[test]
fn a_report_naming_every_claim_of_a_multi_claim_drain_covers_each() {
    let v = check(
        &history(vec![
            A(claim("data-web-2", "c1", false, json!({}))),
            A(claim("logs-web-2", "c2", false, json!({}))),
            A(claim("data-web-2", "c1", true, json!({}))),
            A(claim("logs-web-2", "c2", true, json!({}))),
        ]),
        &reports(vec![report(
            1.5,
            &[("data-web-2", "c1"), ("logs-web-2", "c2")],
        )]),
    );
    assert!(v.ok(), "{v}");
    assert_eq!(v.claims_deleted, 2);
}

#[test]
fn an_exit_0_counts_as_witnessed_only_with_a_report_while_its_pod_ran() {
    // p1 fails, p2 runs from t(3) and ends at t(4): a report at t(3.5) is p2's; one at t(1.5),
    // while p1 ran, is not.
    let h = history(vec![
        A(claim("data-web-2", "c1", false, json!({}))),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Failed",
            Some((10, 1)),
            None,
        )),
        D(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Failed",
            Some((10, 1)),
            None,
        )),
        A(drain_pod(
            "web-2",
            "p2",
            &["data-web-2"],
            "Running",
            None,
            None,
        )),
        A(drain_pod(
            "web-2",
            "p2",
            &["data-web-2"],
            "Succeeded",
            Some((12, 0)),
            None,
        )),
    ]);
    let v = check(&h, &reports(vec![report(3.5, &[("data-web-2", "c1")])]));
    assert!(v.ok(), "{v}");
    assert_eq!((v.drain_pods_ended, v.exits_unwitnessed), (2, 0));
    let v = check(&h, &reports(vec![report(1.5, &[("data-web-2", "c1")])]));
    assert_eq!((v.drain_pods_ended, v.exits_unwitnessed), (2, 1));
}

#[test]
fn a_claim_gone_in_a_watch_gap_needs_a_report_too() {
    let mut h = history(vec![
        A(claim("data-web-2", "c1", false, json!({}))),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Running",
            None,
            None,
        )),
        Change::Relisted { kind: "claim" },
    ]);
    h.entries.push(Entry {
        rv: u64::MAX,
        at: t(3.0),
        change: Change::GoneInGap(claim("data-web-2", "c1", false, json!({}))),
    });
    let v = check(&h, &reports(vec![]));
    one_violation(&v, "in a watch gap");
    assert_eq!(v.gaps, 1);
    let v = check(&h, &reports(vec![report(2.5, &[("data-web-2", "c1")])]));
    assert!(v.ok(), "{v}");
}

const RECORD_C1: &str = r#"{"drainCompleted":{"claims":{"data-web-2":"c1"}}}"#;

#[test]
fn a_termination_message_record_seen_before_the_deletion_counts() {
    let v = check(
        &history(vec![
            A(claim("data-web-2", "c1", false, json!({}))),
            A(drain_pod_with_message(
                "web-2",
                "p1",
                &["data-web-2"],
                "Succeeded",
                Some((10, 0)),
                None,
                Some(RECORD_C1),
            )),
            A(claim("data-web-2", "c1", true, json!({}))),
        ]),
        &Witness::TerminationMessages,
    );
    assert!(v.ok(), "{v}");
    assert_eq!((v.completions_witnessed, v.exits_unwitnessed), (1, 0));
}

#[test]
fn exit_0_without_a_record_or_with_another_claims_record_proves_nothing_by_termination_messages() {
    let other = r#"{"drainCompleted":{"claims":{"data-web-2":"c0"}}}"#;
    for message in [None, Some(""), Some("done"), Some(other)] {
        let v = check(
            &history(vec![
                A(claim("data-web-2", "c1", false, json!({}))),
                A(drain_pod_with_message(
                    "web-2",
                    "p1",
                    &["data-web-2"],
                    "Succeeded",
                    Some((10, 0)),
                    None,
                    message,
                )),
                A(claim("data-web-2", "c1", true, json!({}))),
            ]),
            &Witness::TerminationMessages,
        );
        one_violation(&v, "I1: claim data-web-2 (c1)");
    }
    // A record seen only after the deletion does not count either.
    let v = check(
        &history(vec![
            A(claim("data-web-2", "c1", false, json!({}))),
            A(claim("data-web-2", "c1", true, json!({}))),
            A(drain_pod_with_message(
                "web-2",
                "p1",
                &["data-web-2"],
                "Succeeded",
                Some((10, 0)),
                None,
                Some(RECORD_C1),
            )),
        ]),
        &Witness::TerminationMessages,
    );
    one_violation(&v, "I1: claim data-web-2 (c1)");
}

/// I1 and I2, with the drain of claim `data-web-2` (`c1`) reported at the start (the I2 tests
/// delete it).
fn check_i2(h: &History) -> Verdict {
    check(h, &reports(vec![report(0.5, &[("data-web-2", "c1")])]))
}

#[test]
fn a_stateful_pod_created_while_its_claim_is_deleting_violates_i2() {
    let v = check_i2(&history(vec![
        A(claim("data-web-2", "c1", false, json!({}))),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Succeeded",
            Some((10, 0)),
            None,
        )),
        A(claim("data-web-2", "c1", true, json!({}))),
        D(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Succeeded",
            Some((10, 0)),
            Some((12, 0)),
        )),
        A(stateful_pod("web-2", "s1", &["data-web-2"])),
    ]));
    one_violation(&v, "I2: stateful pod web-2 created at revision 104");
}

#[test]
fn two_pods_of_one_name_violate_i2() {
    let v = check_i2(&history(vec![
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Running",
            None,
            None,
        )),
        A(stateful_pod("web-2", "s1", &["data-web-2"])),
    ]));
    one_violation(&v, "I2: pod web-2 (s1) created");
}

#[test]
fn a_stateful_pod_after_its_claim_is_gone_is_fine() {
    let v = check_i2(&history(vec![
        A(claim("data-web-2", "c1", false, json!({}))),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Succeeded",
            Some((10, 0)),
            None,
        )),
        A(claim("data-web-2", "c1", true, json!({}))),
        D(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Succeeded",
            Some((10, 0)),
            Some((12, 0)),
        )),
        D(claim("data-web-2", "c1", true, json!({}))),
        A(claim("data-web-2", "c2", false, json!({}))),
        A(stateful_pod("web-2", "s1", &["data-web-2"])),
    ]));
    assert!(v.ok(), "{v}");
    assert_eq!(v.stateful_pods_created, 1);
}

#[test]
fn unsettled_names_orphaned_claims_drain_pods_records_and_finalizers() {
    let h = history(vec![
        A(set(2, true)),
        A(claim("data-web-0", "c0", false, json!({}))),
        A(claim(
            "data-web-1",
            "c1",
            false,
            json!({"statefulsets.kubernetes.io/drain-attempts": "1",
                   "statefulsets.kubernetes.io/drain-approved": "true"}),
        )),
        A(claim("data-web-2", "c2", false, json!({}))),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Running",
            None,
            None,
        )),
    ]);
    let u = unsettled(&h);
    assert_eq!(u.len(), 3, "{u:?}");
    assert!(u[0].starts_with("drain pod web-2"), "{u:?}");
    assert!(
        u.iter()
            .any(|m| m == "orphaned claim data-web-2 is not drained"),
        "{u:?}"
    );
    assert!(
        u.iter()
            .any(|m| m.contains("data-web-1 in use still carries")),
        "{u:?}"
    );
    assert!(!u.iter().any(|m| m.contains("drain-approved")), "{u:?}");
}

#[test]
fn a_settled_namespace_and_sets_not_opted_in_are_settled() {
    let h = history(vec![
        A(set(1, false)),
        A(claim("data-web-0", "c0", false, json!({}))),
        A(claim("data-web-1", "c1", false, json!({}))),
        A(claim("data-other-7", "c7", false, json!({}))),
    ]);
    assert!(unsettled(&h).is_empty(), "{:?}", unsettled(&h));
}
