//! Tests of the pure helpers of the controller wiring: error classification, watch
//! fingerprints, and how the scopes of several namespaces share the process.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use drain_api::{annotations, claim_annotations, labels};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use serde_json::json;

use super::Stopped;
use super::api::gone_or_replaced;
use super::backoff::next_failure;
use super::context::keep_series;
use super::expectations::{mark_deleted, mark_deleted_claims, newest_claim, with_created};
use super::kinds::Released;
use super::queue::halt_at_once;
use super::watches::{drain_pod_fingerprint, ready_when_all, set_fingerprint};
use crate::runtime::caches::{ClaimEntry, Compact};
use crate::runtime::metrics::Metrics;
use crate::runtime::watch;
use crate::set_kind::CachedStatefulSet;
use crate::{observe, plan};

/// A stateful pod's cached entry, as a fingerprint: what passes its watch on.
fn stateful_pod_fingerprint(pod: &PartialObjectMeta<Pod>) -> u64 {
    watch::fingerprint(format!("{:?}", pod.entry()))
}

/// A claim's cached entry, as a fingerprint: what passes its watch on.
fn claim_fingerprint(claim: &PartialObjectMeta<PersistentVolumeClaim>) -> u64 {
    watch::fingerprint(format!("{:?}", claim.entry()))
}

/// A failure as the API server sends it.
fn api_error(code: u16, message: &str, cause_field: Option<&str>) -> kube::Error {
    let causes: Vec<_> = cause_field
        .map(|field| json!({"reason": "FieldValueInvalid", "field": field}))
        .into_iter()
        .collect();
    let status: kube::core::Status = serde_json::from_value(json!({
        "status": "Failure",
        "code": code,
        "message": message,
        "details": {"name": "data-web-2", "kind": "persistentvolumeclaims", "causes": causes},
    }))
    .expect("a status");
    kube::Error::Api(status.boxed())
}

#[rstest::rstest]
#[case::not_found(404, "persistentvolumeclaims \"data-web-2\" not found", None, true)]
#[case::uid_precondition_conflict(
    409,
    "Operation cannot be fulfilled on persistentvolumeclaims \"data-web-2\": Precondition failed: \
     UID in precondition: c2, UID in object meta: c9",
    None,
    true
)]
#[case::uid_rejected_by_message(
    422,
    "PersistentVolumeClaim \"data-web-2\" is invalid: metadata.uid: Invalid value: \"c2\": field \
     is immutable",
    None,
    true
)]
#[case::uid_rejected_by_cause(
    422,
    "PersistentVolumeClaim \"data-web-2\" is invalid",
    Some("metadata.uid"),
    true
)]
#[case::unrelated_invalid(
    422,
    "PersistentVolumeClaim \"data-web-2\" is invalid: metadata.annotations: Invalid value: \
     \"drain.example/pod-uid\": name part must consist of alphanumeric characters",
    Some("metadata.annotations"),
    false
)]
#[case::denied(403, "denied by webhook: uid", None, false)]
#[case::server_error(500, "etcd timeout", None, false)]
fn gone_or_replaced_tells_a_replaced_object_from_a_failed_write(
    #[case] code: u16,
    #[case] message: &str,
    #[case] cause_field: Option<&str>,
    #[case] gone: bool,
) {
    assert_eq!(
        gone_or_replaced(&api_error(code, message, cause_field)),
        gone
    );
}

/// A change to an object, and whether the fingerprint must notice it.
type Case<T> = (&'static str, fn(&mut T), bool);

/// Applies each change to a fresh `base()` and checks the fingerprint moves exactly when the
/// case says it must.
fn check<T>(base: fn() -> T, fingerprint: fn(&T) -> u64, cases: &[Case<T>]) {
    let before = fingerprint(&base());
    assert_eq!(before, fingerprint(&base()), "stable");
    for (name, change, must_change) in cases {
        let mut obj = base();
        change(&mut obj);
        let changed = fingerprint(&obj) != before;
        assert_eq!(changed, *must_change, "{name}");
    }
}

fn deleted_at() -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-01-01T00:00:00Z".parse().unwrap(),
    ))
}

fn annotate(meta: &mut ObjectMeta, key: &str, value: &str) {
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.to_owned(), value.to_owned());
}

fn set() -> StatefulSet {
    let mut set = crate::fixtures::SetBuilder::new("web")
        .generation(4)
        .replicas(3)
        .claim_template("data")
        .drain_template(&crate::fixtures::drain_template_json(&["data"]))
        .annotation(annotations::STATUS, "{}")
        .status(k8s_openapi::api::apps::v1::StatefulSetStatus {
            replicas: 3,
            ready_replicas: Some(3),
            observed_generation: Some(4),
            ..Default::default()
        })
        .build();
    set.metadata.resource_version = Some("48213".to_owned());
    set
}

#[test]
fn set_fingerprint_ignores_status_and_follows_spec_deletion_and_annotations() {
    check(
        set,
        |s: &StatefulSet| set_fingerprint(&CachedStatefulSet::from(s.clone())),
        &[
            (
                "status: readiness",
                |s| {
                    s.status.as_mut().unwrap().ready_replicas = Some(1);
                },
                false,
            ),
            (
                "status: observed generation",
                |s| {
                    s.status.as_mut().unwrap().observed_generation = Some(5);
                },
                false,
            ),
            (
                "resourceVersion",
                |s| {
                    s.metadata.resource_version = Some("48377".to_owned());
                },
                false,
            ),
            (
                "our status annotation",
                |s| {
                    annotate(&mut s.metadata, annotations::STATUS, r#"{"2":"draining"}"#);
                },
                false,
            ),
            // A scale changes the spec, and the API server bumps the generation with it.
            (
                "replicas (scale)",
                |s| {
                    s.spec.as_mut().unwrap().replicas = Some(1);
                    s.metadata.generation = Some(5);
                },
                true,
            ),
            (
                "deletion timestamp",
                |s| s.metadata.deletion_timestamp = deleted_at(),
                true,
            ),
            (
                "a drain annotation",
                |s| {
                    annotate(&mut s.metadata, annotations::MAX_ATTEMPTS, "2");
                },
                true,
            ),
            (
                "recreated (uid)",
                |s| s.metadata.uid = Some("other".to_owned()),
                true,
            ),
        ],
    );
}

fn stateful_pod() -> PartialObjectMeta<Pod> {
    use kube::core::PartialObjectMetaExt;
    ObjectMeta {
        name: Some("web-1".to_owned()),
        uid: Some("p1".to_owned()),
        resource_version: Some("48213".to_owned()),
        labels: Some(BTreeMap::from([(
            "apps.kubernetes.io/pod-index".to_owned(),
            "1".to_owned(),
        )])),
        ..ObjectMeta::default()
    }
    .into_response_partial()
}

#[test]
fn stateful_pod_fingerprint_follows_only_identity_and_deletion() {
    check(
        stateful_pod,
        stateful_pod_fingerprint,
        &[
            (
                "resourceVersion (readiness and other status updates)",
                |p| {
                    p.metadata.resource_version = Some("48377".to_owned());
                },
                false,
            ),
            (
                "a label",
                |p| {
                    p.labels_mut().insert("team".to_owned(), "a".to_owned());
                },
                false,
            ),
            (
                "an annotation",
                |p| annotate(&mut p.metadata, "note", "x"),
                false,
            ),
            (
                "deletion timestamp",
                |p| p.metadata.deletion_timestamp = deleted_at(),
                true,
            ),
            (
                "recreated (uid)",
                |p| p.metadata.uid = Some("p2".to_owned()),
                true,
            ),
        ],
    );
}

fn drain_pod() -> Pod {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStatus, PodCondition,
    };
    let mut pod = crate::fixtures::PodBuilder::new("web-2")
        .uid("d2")
        .label(labels::DRAIN_POD, "web")
        .annotation(drain_api::pod_annotations::CLAIMS, r#"{"data-web-2":"c2"}"#)
        .annotation(drain_api::pod_annotations::TEMPLATE_HASH, "h1")
        .phase("Running")
        .build();
    pod.metadata.resource_version = Some("48213".to_owned());
    let status = pod.status.as_mut().unwrap();
    status.container_statuses = Some(vec![ContainerStatus {
        name: "drainer".to_owned(),
        ready: false,
        state: Some(ContainerState {
            running: Some(ContainerStateRunning {
                started_at: deleted_at(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    status.conditions = Some(vec![PodCondition {
        type_: "Ready".to_owned(),
        status: "False".to_owned(),
        ..Default::default()
    }]);
    pod
}

#[test]
fn drain_pod_fingerprint_follows_readiness_phase_deletion_and_annotations() {
    check(
        drain_pod,
        drain_pod_fingerprint,
        &[
            (
                "resourceVersion",
                |p| {
                    p.metadata.resource_version = Some("48377".to_owned());
                },
                false,
            ),
            (
                "a container's readiness",
                |p| {
                    let status = p.status.as_mut().unwrap();
                    status.container_statuses.as_mut().unwrap()[0].ready = true;
                },
                false,
            ),
            // The node lifecycle controller makes every pod of a node that stops answering not
            // ready: the first sign of a lost node.
            (
                "the pod's readiness",
                |p| {
                    let status = p.status.as_mut().unwrap();
                    status.conditions.as_mut().unwrap()[0].status = "True".to_owned();
                },
                true,
            ),
            (
                "pod IP",
                |p| p.status.as_mut().unwrap().pod_ip = Some("10.0.0.7".to_owned()),
                false,
            ),
            (
                "phase",
                |p| p.status.as_mut().unwrap().phase = Some("Succeeded".to_owned()),
                true,
            ),
            (
                "deletion timestamp",
                |p| p.metadata.deletion_timestamp = deleted_at(),
                true,
            ),
            (
                "progress annotation",
                |p| {
                    annotate(
                        &mut p.metadata,
                        drain_api::pod_annotations::PROGRESS,
                        &drain_api::progress::DrainProgress {
                            records_moved: 1,
                            records_remaining: 1,
                            changed_at: "2026-01-01T00:01:00Z".to_owned(),
                            ..Default::default()
                        }
                        .render(),
                    );
                },
                true,
            ),
            (
                "template hash annotation",
                |p| {
                    annotate(
                        &mut p.metadata,
                        drain_api::pod_annotations::TEMPLATE_HASH,
                        "h2",
                    );
                },
                true,
            ),
            (
                "restarts",
                |p| {
                    p.status
                        .as_mut()
                        .unwrap()
                        .container_statuses
                        .as_mut()
                        .unwrap()[0]
                        .restart_count = 1;
                },
                true,
            ),
            (
                "drain-pod label",
                |p| {
                    p.labels_mut().remove(labels::DRAIN_POD);
                },
                true,
            ),
            (
                "recreated (uid)",
                |p| p.metadata.uid = Some("d3".to_owned()),
                true,
            ),
        ],
    );
}

fn claim() -> PartialObjectMeta<PersistentVolumeClaim> {
    use kube::core::PartialObjectMetaExt;
    ObjectMeta {
        name: Some("data-web-2".to_owned()),
        uid: Some("c2".to_owned()),
        resource_version: Some("48213".to_owned()),
        annotations: Some(BTreeMap::from([(
            claim_annotations::ATTEMPTS.to_owned(),
            "1".to_owned(),
        )])),
        ..ObjectMeta::default()
    }
    .into_response_partial()
}

#[test]
fn claim_fingerprint_follows_identity_deletion_and_annotations() {
    check(
        claim,
        claim_fingerprint,
        &[
            (
                "resourceVersion (status updates: bound, resized)",
                |c| {
                    c.metadata.resource_version = Some("48377".to_owned());
                },
                false,
            ),
            (
                "a label",
                |c| {
                    c.labels_mut().insert("team".to_owned(), "a".to_owned());
                },
                false,
            ),
            (
                "our annotation",
                |c| {
                    annotate(&mut c.metadata, claim_annotations::ATTEMPTS, "2");
                },
                true,
            ),
            (
                "approval",
                |c| {
                    annotate(&mut c.metadata, claim_annotations::APPROVED, "true");
                },
                true,
            ),
            (
                "someone else's annotation",
                |c| annotate(&mut c.metadata, "note", "x"),
                false,
            ),
            (
                "deletion timestamp",
                |c| c.metadata.deletion_timestamp = deleted_at(),
                true,
            ),
            (
                "recreated (uid)",
                |c| c.metadata.uid = Some("c3".to_owned()),
                true,
            ),
        ],
    );
}

#[test]
fn a_deleted_drain_pod_of_an_advanced_statefulset_is_released_by_name_and_ordinal() {
    let pod = |api_version: &str, owner: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "ns",
                         "labels": {labels::DRAIN_POD: "web"},
                         "ownerReferences": [{"apiVersion": api_version, "kind": "StatefulSet",
                                              "name": owner, "uid": "u"}]}
        }))
        .unwrap()
    };
    assert_eq!(
        Released::of(&pod("apps.kruise.io/v1beta1", "web")),
        Some(Released {
            namespace: "ns".into(),
            set: "web".into(),
            set_uid: "u".into(),
            pod: "web-1".into(),
            ordinal: 1,
        })
    );
    // Built-in sets watch every pod with their name: nothing to tell them.
    assert_eq!(Released::of(&pod("apps/v1", "web")), None);
    // Owned by another set than its label names: not ours to report.
    assert_eq!(Released::of(&pod("apps.kruise.io/v1beta1", "other")), None);
}

#[test]
fn set_fingerprint_ignores_the_annotations_the_controller_writes() {
    let mut set = StatefulSet::default();
    let before = set_fingerprint(&set);
    set.metadata.annotations = Some(
        [
            (annotations::STATUS.to_owned(), "{}".to_owned()),
            (annotations::RELEASED.to_owned(), "web-1 now".to_owned()),
        ]
        .into(),
    );
    assert_eq!(set_fingerprint(&set), before);
}

fn drain_pod_named(name: &str, uid: &str, set: &str, version: u64) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("ns".to_owned()),
            uid: Some(uid.to_owned()),
            resource_version: Some(version.to_string()),
            labels: Some([(labels::DRAIN_POD.to_owned(), set.to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

fn created(name: &str, uid: &str, set: &str, version: u64) -> (String, u64, Pod) {
    (
        name.to_owned(),
        version,
        drain_pod_named(name, uid, set, version),
    )
}

#[test]
fn a_drain_pod_we_created_is_read_before_its_watch_delivers_it() {
    let cached = vec![Arc::new(drain_pod_named("web-1", "cached", "web", 10))];
    let ours = vec![
        created("web-2", "ours", "web", 20),
        created("db-2", "other set", "db", 21),
    ];
    let read = with_created(cached, ours, "web");
    let uids: Vec<_> = read.iter().map(|p| p.uid().unwrap()).collect();
    assert_eq!(uids, ["cached", "ours"]);
}

#[test]
fn a_drain_pod_we_created_replaces_only_an_older_cached_pod_of_its_name() {
    // The cache still shows the gone pod of an earlier attempt.
    let cached = vec![Arc::new(drain_pod_named("web-2", "gone", "web", 10))];
    let read = with_created(cached, vec![created("web-2", "ours", "web", 20)], "web");
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].uid().as_deref(), Some("ours"));

    // The cache holds ours already, updated since (or a newer pod of that name): it wins.
    for uid in ["ours", "newer"] {
        let cached = vec![Arc::new(drain_pod_named("web-2", uid, "web", 30))];
        let read = with_created(cached, vec![created("web-2", "ours", "web", 20)], "web");
        assert_eq!(read.len(), 1, "not twice");
        assert_eq!(read[0].resource_version().as_deref(), Some("30"));
    }
}

#[test]
fn our_write_of_a_claim_is_read_only_for_that_same_claim() {
    let entry = |uid: &str, attempts: Option<&str>| {
        ClaimEntry::of(&ObjectMeta {
            uid: Some(uid.to_owned()),
            annotations: attempts
                .map(|a| [(claim_annotations::ATTEMPTS.to_owned(), a.to_owned())].into()),
            ..ObjectMeta::default()
        })
    };
    let ours = entry("c1", Some("2"));
    assert_eq!(newest_claim(entry("c1", None), Some(ours.clone())), ours);
    assert_eq!(
        newest_claim(entry("c2", None), Some(ours)),
        entry("c2", None),
        "a claim recreated under the name is read from the cache"
    );
    assert_eq!(newest_claim(entry("c1", None), None), entry("c1", None));
}

#[test]
fn a_drain_pod_we_deleted_is_read_as_terminating_without_a_deletion_time() {
    let deleted = super::expectations::Deleted::default();
    deleted.deleted("ours");
    let mut pods = vec![
        observe::drain_pod(&drain_pod_named("web-2", "ours", "web", 10), 2),
        observe::drain_pod(&drain_pod_named("web-3", "other", "web", 10), 3),
        observe::other_pod(
            &ObjectMeta {
                name: Some("web-1".into()),
                uid: Some("ours".into()),
                ..ObjectMeta::default()
            },
            1,
        ),
    ];
    let before = pods.clone();
    mark_deleted(&mut pods, |uid| deleted.contains(uid));
    assert!(pods[0].terminating, "the pod we deleted");
    assert!(!pods[1].terminating, "a pod we did not delete");
    assert!(!pods[2].terminating, "a stateful pod is never marked");
    let (plan::PodKind::Drain(after), plan::PodKind::Drain(was)) = (&pods[0].kind, &before[0].kind)
    else {
        panic!("drain pods")
    };
    assert_eq!(
        after, was,
        "no deletion time is made up: success is judged from the pod"
    );
}

/// A CI run caught it: a restarted controller deleted a drained ordinal's claim, then its drain
/// pod; the next reconcile ran after the pod's watch event and before the claim's, saw the
/// claim as it was and no drain pod, and created a new drain pod on a claim on its way out.
#[test]
fn a_claim_we_deleted_is_read_as_being_deleted_and_no_drain_starts_on_it() {
    use crate::plan::{self, Claim, DrainRecord, NewDrains, Settings, Snapshot};
    let deleted = super::expectations::Deleted::default();
    deleted.deleted("drained");
    let claim = |name: &str, uid: &str, ordinal| Claim {
        name: name.to_owned(),
        uid: uid.to_owned(),
        template: "data".to_owned(),
        ordinal,
        terminating: false,
        record: DrainRecord::default(),
    };
    let mut snap = Snapshot {
        set_name: "web".into(),
        replicas: 1,
        // Ordinal 1 drained (its claim deleted by us, the cache not there yet); ordinal 2 not.
        claims: vec![
            claim("data-web-1", "drained", 1),
            claim("data-web-2", "fresh", 2),
        ],
        ..Snapshot::default()
    };
    let settings = Settings {
        new_drains: NewDrains::Allowed {
            template_hash: "h".into(),
        },
        max_concurrent: Some(10),
        ..Settings::default()
    };
    let creates = |snap: &Snapshot| -> Vec<i32> {
        plan::plan(snap, &settings, jiff::Timestamp::now())
            .actions
            .iter()
            .filter(|a| matches!(a, plan::Action::CreateDrainPod { .. }))
            .map(plan::Action::ordinal)
            .collect()
    };
    assert_eq!(
        creates(&snap),
        [2, 1],
        "what the stale cache alone would do"
    );
    mark_deleted_claims(&mut snap.claims, |uid| deleted.contains(uid));
    assert!(snap.claims[0].terminating, "the claim we deleted");
    assert!(!snap.claims[1].terminating, "a claim we did not delete");
    assert_eq!(creates(&snap), [2], "no drain on the claim we deleted");
}

#[test]
fn a_stop_waits_for_reconciles_only_once_the_sets_and_caches_have_synced() {
    // Before both have synced, every reconcile is held by the controller (sets not listed) or
    // waits in `Context::wait_ready` (caches not synced): none has acted.
    assert!(halt_at_once(false, false));
    assert!(halt_at_once(false, true));
    assert!(halt_at_once(true, false));
    assert!(!halt_at_once(true, true));
}

#[test]
fn a_reconcile_failing_during_its_backoff_does_not_double_it() {
    let t0 = std::time::Instant::now();
    let s = Duration::from_secs;
    let (first, delay) = next_failure(None, t0);
    assert_eq!((first.count, delay), (1, s(1)));
    // Watch events bring reconciles that fail again before the retry is due: the retry keeps
    // its time and the count does not grow.
    let mut last = first;
    for ms in [100, 300, 900] {
        let (again, delay) = next_failure(Some(last), t0 + Duration::from_millis(ms));
        assert_eq!(again, first);
        assert_eq!(delay, s(1) - Duration::from_millis(ms));
        last = again;
    }
    // The due retry fails: the backoff doubles from then.
    let (second, delay) = next_failure(Some(last), t0 + s(1));
    assert_eq!((second.count, delay), (2, s(2)));
    let (third, delay) = next_failure(Some(second), t0 + s(3));
    assert_eq!((third.count, delay), (3, s(4)));
    // Capped at 5 minutes.
    let mut at = t0 + s(3);
    let mut f = third;
    for _ in 0..20 {
        at = f.retry_at;
        f = next_failure(Some(f), at).0;
    }
    assert_eq!(f.retry_at - at, s(300));
}

#[test]
fn one_scope_per_namespace_or_one_over_all() {
    assert_eq!(super::scopes(&[]), [None]);
    assert_eq!(super::scopes(&["a".into()]), [Some("a".to_owned())]);
    assert_eq!(
        super::scopes(&["a".into(), "b".into()]),
        [Some("a".to_owned()), Some("b".to_owned())]
    );
}

/// The series of sets `web` in `a`, `b` and `c` (the metrics every scope shares).
fn series_in_three_namespaces() -> Metrics {
    use crate::plan::{self, Settings, Snapshot};
    let m = Metrics::default();
    let snap = Snapshot {
        set_name: "web".into(),
        replicas: 1,
        ..Snapshot::default()
    };
    let p = plan::plan(&snap, &Settings::default(), jiff::Timestamp::now());
    for ns in ["a", "b", "c"] {
        m.record_reconcile(ns, "web", &p, &snap, &std::collections::BTreeSet::new());
    }
    m
}

fn has_series(m: &Metrics, ns: &str) -> bool {
    m.render().contains(&format!(
        r#"statefulset_drain_drains_in_progress{{namespace="{ns}",statefulset="web"}}"#
    ))
}

#[test]
fn a_scope_forgetting_its_gone_sets_keeps_the_other_namespaces_series() {
    // Scope `a` lost its set: its caches hold no set at all, of any namespace.
    let m = series_in_three_namespaces();
    m.retain_sets(|s| keep_series(Some("a"), s, |_, _| false));
    assert!(!has_series(&m, "a"), "a's gone set keeps its series");
    assert!(
        has_series(&m, "b") && has_series(&m, "c"),
        "the series of b and c, the other scopes', went:\n{}",
        m.render()
    );
    // Scope `b` still has its set: nothing goes.
    m.retain_sets(|s| keep_series(Some("b"), s, |ns, name| (ns, name) == ("b", "web")));
    assert!(has_series(&m, "b") && has_series(&m, "c"));
}

#[test]
fn the_scope_over_all_namespaces_forgets_every_gone_set() {
    let m = series_in_three_namespaces();
    m.retain_sets(|s| keep_series(None, s, |ns, _| ns == "c"));
    assert!(!has_series(&m, "a") && !has_series(&m, "b") && has_series(&m, "c"));
}

#[tokio::test]
async fn ready_once_every_scope_is() {
    let (a, a_rx) = tokio::sync::watch::channel(false);
    let (b, b_rx) = tokio::sync::watch::channel(false);
    let (ready, mut ready_rx) = tokio::sync::watch::channel(false);
    let gate = tokio::spawn(ready_when_all(vec![a_rx, b_rx], ready));
    let wait = Duration::from_millis(50);
    a.send_replace(true);
    assert!(
        tokio::time::timeout(wait, ready_rx.wait_for(|r| *r))
            .await
            .is_err(),
        "ready with b not synced"
    );
    b.send_replace(true);
    tokio::time::timeout(Duration::from_secs(5), ready_rx.wait_for(|r| *r))
        .await
        .expect("ready once both synced")
        .expect("sender kept");
    gate.await.expect("gate");
}

#[tokio::test]
async fn never_ready_if_a_scope_stops_before_it_synced() {
    let (a, a_rx) = tokio::sync::watch::channel(false);
    let (b, b_rx) = tokio::sync::watch::channel(false);
    let (ready, ready_rx) = tokio::sync::watch::channel(false);
    let gate = tokio::spawn(ready_when_all(vec![a_rx, b_rx], ready));
    a.send_replace(true);
    drop(b);
    gate.await.expect("the gate ends");
    assert!(!*ready_rx.borrow());
}

#[tokio::test]
async fn one_scope_over_all_namespaces_is_ready_when_it_is() {
    let (a, a_rx) = tokio::sync::watch::channel(false);
    let (ready, mut ready_rx) = tokio::sync::watch::channel(false);
    let gate = tokio::spawn(ready_when_all(vec![a_rx], ready));
    a.send_replace(true);
    ready_rx.wait_for(|r| *r).await.expect("ready");
    gate.await.expect("gate");
}

#[rstest::rstest]
#[case::none(&[], Stopped::Clean)]
#[case::all_clean(&[Stopped::Clean, Stopped::Clean, Stopped::Clean], Stopped::Clean)]
#[case::one_dropped(&[Stopped::Clean, Stopped::DroppedReconciles, Stopped::Clean], Stopped::DroppedReconciles)]
#[case::all_dropped(&[Stopped::DroppedReconciles, Stopped::DroppedReconciles], Stopped::DroppedReconciles)]
fn dropped_reconciles_in_any_scope_win(#[case] stops: &[Stopped], #[case] merged: Stopped) {
    assert_eq!(Stopped::merge(stops.iter().copied()), merged);
}
