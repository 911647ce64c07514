//! The checker itself is tested on made-up histories: each invariant is shown to catch the
//! violation it is for, and to accept the legitimate history next to it.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use serde_json::{Value, json};

use super::*;
use crate::history::{Change, Entry, History, Obj};

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
        Some((at, code)) => json!({"terminated": {"exitCode": code, "finishedAt": ts(at)}}),
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

fn history(changes: Vec<Change>) -> History {
    History {
        entries: changes
            .into_iter()
            .enumerate()
            .map(|(i, change)| Entry {
                rv: 100 + i as u64,
                change,
            })
            .collect(),
    }
}

use Change::{Applied as A, Deleted as D};

fn one_violation(v: &Verdict, needle: &str) {
    assert_eq!(v.violations.len(), 1, "{v}");
    assert!(v.violations[0].contains(needle), "{v}");
}

#[test]
fn a_claim_deleted_after_its_drain_succeeded_is_fine() {
    let v = check(&history(vec![
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
    ]));
    assert!(v.ok(), "{v}");
    assert_eq!((v.claims_deleted, v.drains_proven), (1, 1));
}

#[test]
fn a_claim_deleted_while_its_drain_runs_violates_i1() {
    let v = check(&history(vec![
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
    ]));
    one_violation(&v, "I1: claim data-web-2 (c1) deleted at revision 102");
}

#[test]
fn a_drain_that_exited_0_after_a_delete_request_proves_nothing() {
    // Asked to stop at 00:20 (deletionTimestamp 00:50 - 30 s grace), exited 0 at 00:21.
    let v = check(&history(vec![
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
    ]));
    one_violation(&v, "I1");
    assert!(
        v.violations[0].contains("not before the delete request"),
        "{v}"
    );
}

#[test]
fn a_finish_in_the_same_second_as_the_delete_request_proves_nothing() {
    let v = check(&history(vec![
        A(claim("data-web-2", "c1", false, json!({}))),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Succeeded",
            Some((20, 0)),
            Some((50, 30)),
        )),
        A(claim("data-web-2", "c1", true, json!({}))),
    ]));
    one_violation(&v, "I1");
}

#[test]
fn a_finish_before_the_delete_request_is_a_success() {
    let v = check(&history(vec![
        A(claim("data-web-2", "c1", false, json!({}))),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Succeeded",
            Some((19, 0)),
            Some((50, 30)),
        )),
        A(claim("data-web-2", "c1", true, json!({}))),
    ]));
    assert!(v.ok(), "{v}");
}

#[test]
fn a_zero_grace_deletion_carries_no_request_time() {
    let v = check(&history(vec![
        A(claim("data-web-2", "c1", false, json!({}))),
        A(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Succeeded",
            Some((19, 0)),
            Some((50, 0)),
        )),
        A(claim("data-web-2", "c1", true, json!({}))),
    ]));
    one_violation(&v, "I1");
}

#[test]
fn a_failed_drain_or_a_non_zero_exit_proves_nothing() {
    for (phase, code) in [("Failed", 1), ("Succeeded", 3)] {
        let v = check(&history(vec![
            A(claim("data-web-2", "c1", false, json!({}))),
            A(drain_pod(
                "web-2",
                "p1",
                &["data-web-2"],
                phase,
                Some((10, code)),
                None,
            )),
            A(claim("data-web-2", "c1", true, json!({}))),
        ]));
        one_violation(&v, "I1");
    }
}

#[test]
fn a_success_before_the_claim_was_recreated_does_not_cover_the_new_claim() {
    let v = check(&history(vec![
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
        D(claim("data-web-2", "c1", true, json!({}))),
        D(drain_pod(
            "web-2",
            "p1",
            &["data-web-2"],
            "Succeeded",
            Some((10, 0)),
            Some((12, 0)),
        )),
        A(claim("data-web-2", "c2", false, json!({}))),
        A(claim("data-web-2", "c2", true, json!({}))),
    ]));
    one_violation(&v, "claim data-web-2 (c2)");
}

#[test]
fn a_success_of_another_claim_does_not_count() {
    let v = check(&history(vec![
        A(claim("data-web-2", "c1", false, json!({}))),
        A(drain_pod(
            "web-1",
            "p1",
            &["data-web-1"],
            "Succeeded",
            Some((10, 0)),
            None,
        )),
        A(claim("data-web-2", "c1", true, json!({}))),
    ]));
    one_violation(&v, "I1");
}

#[test]
fn a_claim_gone_in_a_watch_gap_needs_a_proof_too() {
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
        change: Change::GoneInGap(claim("data-web-2", "c1", false, json!({}))),
    });
    let v = check(&h);
    one_violation(&v, "in a watch gap");
    assert_eq!(v.gaps, 1);
}

#[test]
fn a_stateful_pod_created_while_its_claim_is_deleting_violates_i2() {
    let v = check(&history(vec![
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
    let v = check(&history(vec![
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
    let v = check(&history(vec![
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
