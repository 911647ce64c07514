//! Tests of the act step against a fake cluster that records calls and injects errors.

use std::collections::BTreeMap;
use std::sync::Mutex;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::*;
use crate::config::DrainConfig;
use crate::fixtures::{SetBuilder, drain_template_json};
use crate::plan::{ClaimRef, DeleteWhy, FailureKind};
use crate::retain::RetainError;
use crate::template::DrainTemplate;
use crate::template::validate;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Create(String),
    DeletePod(String, String, Option<String>),
    DeleteClaim(String, String),
    Annotate(String, Vec<(String, Option<String>)>),
    Retain(String, String),
    Event(String),
}

#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<Call>>,
    fail_on: Option<&'static str>,
    exists: bool,
    /// The live set has the ordinal back in range.
    back_in_range: bool,
    /// Reading the live set fails.
    live_set_unreadable: bool,
    /// Creates wait for the live read.
    confirm_first: bool,
    /// The withdrawals left for later.
    withdraw_later: Mutex<Vec<(String, String)>>,
    /// The live pod UID behind the drain pod's name.
    live_pod: Option<String>,
    /// What a pod delete comes to.
    delete_outcome: Option<Deleted>,
    /// Fail calls on this claim only.
    fail_claim: Option<&'static str>,
    /// This claim is gone or was replaced: patching it comes to [`Patched::Gone`].
    gone_claim: Option<&'static str>,
    /// Lead (may act) for this many actions only.
    lead_for: Option<usize>,
    /// How often the fence was checked.
    fence_checks: std::sync::atomic::AtomicUsize,
    /// The set's revision as read (`Err(code)`: the read fails with this HTTP code).
    revision: Option<Result<ObjectMeta, u16>>,
    /// The pods created.
    created: Mutex<Vec<Pod>>,
}

fn err() -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure("injected", "InternalError")
            .with_code(500)
            .boxed(),
    )
}

impl Fake {
    fn failing(kind: &'static str) -> Self {
        Self {
            fail_on: Some(kind),
            ..Self::default()
        }
    }
    fn push(&self, call: Call, kind: &str) -> Result<(), kube::Error> {
        let on_failing_claim = match (&call, self.fail_claim) {
            (Call::DeleteClaim(n, _) | Call::Annotate(n, _), Some(bad)) => n == bad,
            _ => false,
        };
        self.calls.lock().unwrap().push(call);
        if self.fail_on == Some(kind) || on_failing_claim {
            Err(err())
        } else {
            Ok(())
        }
    }
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

impl Cluster for Fake {
    async fn create_pod(&self, pod: &Pod) -> Result<Created, kube::Error> {
        self.push(Call::Create(pod.metadata.name.clone().unwrap()), "create")?;
        self.created.lock().unwrap().push(pod.clone());
        Ok(if self.exists {
            Created::AlreadyExists
        } else {
            Created::Uid("new-uid".to_owned())
        })
    }
    async fn delete_pod(
        &self,
        name: &str,
        uid: &str,
        resource_version: Option<&str>,
    ) -> Result<Deleted, kube::Error> {
        self.push(
            Call::DeletePod(
                name.to_owned(),
                uid.to_owned(),
                resource_version.map(str::to_owned),
            ),
            "delete_pod",
        )?;
        Ok(self.delete_outcome.unwrap_or(Deleted::Deleted))
    }
    async fn delete_claim(&self, name: &str, uid: &str) -> Result<(), kube::Error> {
        self.push(
            Call::DeleteClaim(name.to_owned(), uid.to_owned()),
            "delete_claim",
        )
    }
    async fn annotate_claim(
        &self,
        name: &str,
        _uid: &str,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> Result<Patched, kube::Error> {
        let pairs = annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.push(Call::Annotate(name.to_owned(), pairs), "annotate")?;
        Ok(if self.gone_claim == Some(name) {
            Patched::Gone
        } else {
            Patched::Done
        })
    }
    async fn revision(&self, _name: &str) -> Result<Option<ObjectMeta>, kube::Error> {
        match self.revision.clone() {
            Some(Err(code)) => Err(kube::Error::Api(
                kube::core::Status::failure("injected", "Forbidden")
                    .with_code(code)
                    .boxed(),
            )),
            read => Ok(read.map(Result::unwrap)),
        }
    }
    async fn still_orphaned(&self, _ordinal: i32) -> Result<bool, kube::Error> {
        if self.live_set_unreadable {
            return Err(err());
        }
        Ok(!self.back_in_range)
    }
    async fn retain_volume(
        &self,
        claim: &ClaimRef,
        pod: &str,
        _until: Timestamp,
    ) -> Result<Retained, RetainError> {
        self.push(Call::Retain(claim.name.clone(), pod.to_owned()), "retain")
            .map_err(|source| RetainError::Api {
                what: "patch",
                volume: format!("pv-{}", claim.name),
                source,
            })?;
        Ok(if self.gone_claim == Some(claim.name.as_str()) {
            Retained::ClaimGone
        } else {
            Retained::Marked {
                volume: format!("pv-{}", claim.name),
            }
        })
    }
    async fn pod_uid(&self, _name: &str) -> Result<Option<String>, kube::Error> {
        Ok(self.live_pod.clone())
    }
    async fn event(&self, event: &EventSpec) {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Event(event.reason.to_owned()));
    }
    fn confirm_first(&self) -> bool {
        self.confirm_first
    }
    fn withdraw_later(&self, name: &str, uid: &str) {
        self.withdraw_later
            .lock()
            .unwrap()
            .push((name.to_owned(), uid.to_owned()));
    }
    fn may_act(&self) -> bool {
        let n = self
            .fence_checks
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.lead_for.is_none_or(|lead| n < lead)
    }
}

#[tokio::test]
async fn a_replica_that_stops_leading_makes_no_further_call() {
    let fake = Fake {
        lead_for: Some(1),
        ..Fake::default()
    };
    let actions = [
        Action::DeleteClaims {
            ordinal: 2,
            claims: vec![claim(2)],
        },
        delete_pod(2, DeleteWhy::Succeeded, None),
        Action::DeleteClaims {
            ordinal: 3,
            claims: vec![claim(3)],
        },
    ];
    let failed = run(&fake, &actions).await;
    assert!(
        matches!(
            failed.as_slice(),
            [(2, ActError::NotLeader), (3, ActError::NotLeader)]
        ),
        "{failed:?}"
    );
    assert_eq!(
        fake.calls(),
        vec![
            Call::DeleteClaim("data-web-2".to_owned(), "c2".to_owned()),
            Call::Event("DrainSucceeded".to_owned()),
            Call::Event("ClaimsDeleted".to_owned()),
        ]
    );
}

fn template() -> DrainTemplate {
    let set = SetBuilder::new("web")
        .replicas(2)
        .claim_template("data")
        .drain_template(&drain_template_json(&["data"]))
        .build();
    validate(&set, &DrainConfig::default()).expect("valid")
}

fn claim(ordinal: i32) -> ClaimRef {
    ClaimRef {
        name: format!("data-web-{ordinal}"),
        uid: format!("c{ordinal}"),
    }
}

fn now() -> Timestamp {
    "2026-01-01T00:00:00Z".parse().unwrap()
}

fn create(attempt: u32, first: bool) -> Action {
    Action::CreateDrainPod {
        ordinal: 2,
        claims: BTreeMap::from([("data".to_owned(), claim(2))]),
        attempt,
        avoid_nodes: Vec::new(),
        new_series: first.then(|| (now(), "h1".to_owned())),
    }
}

fn delete_pod(ordinal: i32, why: DeleteWhy, rv: Option<&str>) -> Action {
    Action::DeleteDrainPod {
        ordinal,
        name: format!("web-{ordinal}"),
        uid: "p".to_owned(),
        resource_version: rv.map(str::to_owned),
        why,
    }
}

fn failure(ordinal: i32, kind: FailureKind, gave_up: bool, only_if_pod_gone: bool) -> Action {
    Action::RecordFailure {
        ordinal,
        claims: vec![claim(ordinal)],
        pod_uid: "p".to_owned(),
        kind,
        attempts: 1,
        retry_after: now(),
        reason: "x".to_owned(),
        gave_up,
        only_if_pod_gone,
        series: None,
    }
}

async fn run<C: Cluster>(fake: &C, actions: &[Action]) -> Vec<(i32, ActError)> {
    let template = template();
    let ctx = ActCtx {
        set_name: "web",
        replicas: 2,
        template: Some(&template),
        now: now(),
        revision: None,
    };
    apply(fake, &ctx, actions).await
}

fn ok(failed: Vec<(i32, ActError)>) {
    assert!(
        failed.is_empty(),
        "{:?}",
        failed
            .iter()
            .map(|(o, e)| (o, e.describe()))
            .collect::<Vec<_>>()
    );
}

/// The controller references of the pods `fake` created.
fn controllers(fake: &Fake) -> Vec<Vec<(String, String)>> {
    let created = fake.created.lock().unwrap();
    (created.iter())
        .map(|p| {
            (p.metadata.owner_references.iter().flatten())
                .filter(|o| o.controller == Some(true))
                .map(|o| (o.kind.clone(), o.uid.clone()))
                .collect()
        })
        .collect()
}

/// A ControllerRevision with this UID, controlled by the owner with UID `owner`.
fn revision(uid: &str, owner: &str) -> ObjectMeta {
    ObjectMeta {
        uid: Some(uid.to_owned()),
        owner_references: Some(vec![OwnerReference {
            uid: owner.to_owned(),
            controller: Some(true),
            ..OwnerReference::default()
        }]),
        ..ObjectMeta::default()
    }
}

#[rstest::rstest]
#[case::the_sets(Some(Ok(revision("r", "uid-web"))), &[("ControllerRevision", "r")], &[])]
#[case::another_sets(Some(Ok(revision("r", "u-other"))), &[], &[])]
#[case::gone(None, &[], &[])]
#[case::unreadable(Some(Err(500)), &[], &[])]
#[case::denied_is_a_warning(Some(Err(403)), &[], &["DrainPodUncontrolled"])]
#[tokio::test]
async fn a_drain_pod_is_controlled_by_the_sets_update_revision(
    #[case] read: Option<Result<ObjectMeta, u16>>,
    #[case] controller: &[(&str, &str)],
    #[case] warned: &[&str],
) {
    let fake = Fake {
        revision: read,
        ..Fake::default()
    };
    let template = template();
    assert_eq!(template.set_uid(), "uid-web");
    let ctx = ActCtx {
        set_name: "web",
        replicas: 2,
        template: Some(&template),
        now: now(),
        revision: Some("web-7f9c"),
    };
    ok(apply(&fake, &ctx, &[create(1, true)]).await);
    let expected: Vec<(String, String)> = (controller.iter())
        .map(|(k, u)| ((*k).to_owned(), (*u).to_owned()))
        .collect();
    assert_eq!(controllers(&fake), vec![expected]);
    let events: Vec<String> = (fake.calls().into_iter())
        .filter_map(|c| match c {
            Call::Event(reason) => Some(reason),
            _ => None,
        })
        .filter(|r| r != "DrainPodCreated")
        .collect();
    assert_eq!(events, warned);
}

#[tokio::test]
async fn create_creates_first_then_records_the_uid_and_the_new_series() {
    let fake = Fake::default();
    ok(run(&fake, &[create(1, true)]).await);
    let calls = fake.calls();
    // Nothing is written before the create: the pod is the first call that changes anything.
    assert_eq!(calls[0], Call::Create("web-2".to_owned()), "{calls:?}");
    let Call::Annotate(name, record) = &calls[1] else {
        panic!("{calls:?}")
    };
    assert_eq!(name, "data-web-2");
    let record: BTreeMap<_, _> = record.iter().cloned().collect();
    assert_eq!(
        record[claim_annotations::POD_UID],
        Some("new-uid".to_owned())
    );
    assert_eq!(
        record[claim_annotations::FIRST_ATTEMPT_AT],
        Some(now().to_string())
    );
    assert_eq!(
        record[claim_annotations::TEMPLATE_HASH],
        Some("h1".to_owned())
    );
    // The counts of an earlier series go, and an earlier return.
    for k in [
        claim_annotations::ATTEMPTS,
        claim_annotations::RETRY_AFTER,
        claim_annotations::LAST_FAILURE,
        claim_annotations::COUNTED_POD_UID,
        claim_annotations::RETURNED_AT,
    ] {
        assert_eq!(record[k], None, "{k}");
    }
    assert_eq!(
        calls[2..],
        [
            Call::Event("DrainPodCreated".to_owned()),
            Call::Event("DrainPodCreated".to_owned()),
        ]
    );
}

#[tokio::test]
async fn a_repaired_series_keeps_a_recorded_return() {
    let fake = Fake::default();
    let action = Action::RecordDrainPod {
        ordinal: 2,
        claims: vec![claim(2)],
        pod_uid: "p".to_owned(),
        series: Some((now(), "h1".to_owned())),
    };
    ok(run(&fake, &[action]).await);
    let calls = fake.calls();
    let Call::Annotate(_, record) = &calls[0] else {
        panic!("{calls:?}")
    };
    let record: BTreeMap<_, _> = record.iter().cloned().collect();
    assert_eq!(record[claim_annotations::POD_UID], Some("p".to_owned()));
    assert_eq!(
        record[claim_annotations::TEMPLATE_HASH],
        Some("h1".to_owned())
    );
    assert_eq!(record[claim_annotations::ATTEMPTS], None);
    assert!(
        !record.contains_key(claim_annotations::RETURNED_AT),
        "{record:?}"
    );
}

#[tokio::test]
async fn a_retry_is_reported_as_such() {
    let fake = Fake::default();
    ok(run(&fake, &[create(2, false)]).await);
    let calls = fake.calls();
    assert_eq!(calls[0], Call::Create("web-2".to_owned()));
    assert!(calls.contains(&Call::Event("DrainRetrying".to_owned())));
}

#[tokio::test]
async fn create_of_a_taken_name_is_an_outcome_not_an_error() {
    let fake = Fake {
        exists: true,
        ..Fake::default()
    };
    ok(run(&fake, &[create(1, false)]).await);
    assert_eq!(fake.calls(), vec![Call::Create("web-2".to_owned())]);
}

#[tokio::test]
async fn success_deletes_claims_before_the_pod() {
    let fake = Fake::default();
    let actions = [
        Action::DeleteClaims {
            ordinal: 2,
            claims: vec![claim(2)],
        },
        delete_pod(2, DeleteWhy::Succeeded, None),
    ];
    ok(run(&fake, &actions).await);
    assert_eq!(
        fake.calls(),
        vec![
            Call::DeleteClaim("data-web-2".to_owned(), "c2".to_owned()),
            Call::Event("DrainSucceeded".to_owned()),
            Call::Event("ClaimsDeleted".to_owned()),
            Call::DeletePod("web-2".to_owned(), "p".to_owned(), None),
        ]
    );
}

fn retain(ordinal: i32) -> Action {
    Action::RetainVolumes {
        ordinal,
        claims: vec![claim(ordinal)],
        until: "2026-11-27T00:00:00Z".parse().unwrap(),
    }
}

#[tokio::test]
async fn a_retained_volume_comes_before_the_claim_delete_and_is_announced() {
    let fake = Fake::default();
    let actions = [
        retain(2),
        Action::DeleteClaims {
            ordinal: 2,
            claims: vec![claim(2)],
        },
    ];
    ok(run(&fake, &actions).await);
    let calls = fake.calls();
    assert_eq!(
        calls[..2],
        [
            Call::Retain("data-web-2".to_owned(), "web-2".to_owned()),
            Call::Event("VolumesRetained".to_owned()),
        ]
    );
    assert_eq!(
        calls[2],
        Call::DeleteClaim("data-web-2".to_owned(), "c2".to_owned())
    );
}

#[tokio::test]
async fn a_volume_that_cannot_be_retained_keeps_its_claim() {
    let fake = Fake::failing("retain");
    let actions = [
        retain(2),
        Action::DeleteClaims {
            ordinal: 2,
            claims: vec![claim(2)],
        },
        delete_pod(2, DeleteWhy::Succeeded, None),
    ];
    let failed = run(&fake, &actions).await;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].1.reason(), "RetainVolumeFailed");
    assert!(
        failed[0].1.describe().starts_with(
            "failed to retain the volume of claim data-web-2; the claim is kept: failed to patch volume pv-data-web-2: "
        ),
        "{}",
        failed[0].1.describe()
    );
    assert_eq!(
        fake.calls(),
        vec![Call::Retain("data-web-2".to_owned(), "web-2".to_owned())]
    );
}

#[tokio::test]
async fn a_claim_gone_before_its_volume_is_retained_stops_the_ordinal() {
    let fake = Fake {
        gone_claim: Some("data-web-2"),
        ..Fake::default()
    };
    let actions = [
        retain(2),
        Action::DeleteClaims {
            ordinal: 2,
            claims: vec![claim(2)],
        },
    ];
    ok(run(&fake, &actions).await);
    assert_eq!(
        fake.calls(),
        vec![Call::Retain("data-web-2".to_owned(), "web-2".to_owned())]
    );
}

#[tokio::test]
async fn a_failed_claim_delete_stops_before_the_pod_delete() {
    let fake = Fake::failing("delete_claim");
    let actions = [
        Action::DeleteClaims {
            ordinal: 2,
            claims: vec![claim(2)],
        },
        delete_pod(2, DeleteWhy::Succeeded, None),
    ];
    let failed = run(&fake, &actions).await;
    assert_eq!(failed.len(), 1);
    let (ordinal, e) = &failed[0];
    assert_eq!(*ordinal, 2);
    assert_eq!(e.reason(), "DeleteClaimFailed");
    assert_eq!(e.to_string(), "failed to delete claim data-web-2");
    assert!(
        e.describe()
            .starts_with("failed to delete claim data-web-2: "),
        "{}",
        e.describe()
    );
    assert!(
        !fake
            .calls()
            .iter()
            .any(|c| matches!(c, Call::DeletePod(..)))
    );
}

#[tokio::test]
async fn one_ordinal_failing_does_not_stop_the_others() {
    // The delete of data-web-2 is denied; ordinal 1 still gets its claim and pod deleted.
    let fake = Fake {
        fail_claim: Some("data-web-2"),
        ..Fake::default()
    };
    let actions = [
        Action::DeleteClaims {
            ordinal: 2,
            claims: vec![claim(2)],
        },
        delete_pod(2, DeleteWhy::Succeeded, None),
        Action::DeleteClaims {
            ordinal: 1,
            claims: vec![claim(1)],
        },
        delete_pod(1, DeleteWhy::Succeeded, None),
    ];
    let failed = run(&fake, &actions).await;
    assert_eq!(failed.iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![2]);
    let calls = fake.calls();
    assert!(calls.contains(&Call::DeleteClaim("data-web-1".to_owned(), "c1".to_owned())));
    assert!(calls.contains(&Call::DeletePod("web-1".to_owned(), "p".to_owned(), None)));
    assert!(!calls.contains(&Call::DeletePod("web-2".to_owned(), "p".to_owned(), None)));
}

#[tokio::test]
async fn a_failed_failure_record_stops_before_the_pod_delete() {
    let fake = Fake::failing("annotate");
    let actions = [
        failure(2, FailureKind::Failed, false, false),
        delete_pod(2, DeleteWhy::Failed, None),
    ];
    let failed = run(&fake, &actions).await;
    assert_eq!(failed[0].1.reason(), "AnnotateClaimFailed");
    assert!(
        !fake
            .calls()
            .iter()
            .any(|c| matches!(c, Call::DeletePod(..)))
    );
}

#[tokio::test]
async fn a_pod_that_changed_since_it_was_seen_is_not_cancelled_and_its_record_is_kept() {
    let fake = Fake {
        delete_outcome: Some(Deleted::Changed),
        ..Fake::default()
    };
    let actions = [
        delete_pod(2, DeleteWhy::Cancelled, Some("rv-7")),
        Action::ClearRecord {
            ordinal: 2,
            claims: vec![claim(2)],
        },
    ];
    ok(run(&fake, &actions).await);
    assert_eq!(
        fake.calls(),
        vec![Call::DeletePod(
            "web-2".to_owned(),
            "p".to_owned(),
            Some("rv-7".to_owned())
        )],
        "no DrainCancelled event, no record cleared"
    );
}

#[tokio::test]
async fn giving_up_is_a_warning_on_the_set() {
    let fake = Fake::default();
    ok(run(&fake, &[failure(2, FailureKind::Failed, true, false)]).await);
    let calls = fake.calls();
    // The counts, and the pod counted as the record's current one.
    assert!(
        matches!(&calls[0], Call::Annotate(n, pairs) if n == "data-web-2" && pairs.len() == 5
        && pairs.contains(&(claim_annotations::POD_UID.to_owned(), Some("p".to_owned()))))
    );
    assert!(calls.contains(&Call::Event("DrainGaveUp".to_owned())));
}

#[rstest::rstest]
#[case::failed(FailureKind::Failed, "DrainFailed")]
#[case::vanished(FailureKind::Vanished, "DrainFailed")]
#[case::interrupted(FailureKind::Interrupted, "DrainInterrupted")]
#[case::stuck(FailureKind::Stuck, "DrainStuck")]
#[case::deadline(FailureKind::DeadlineExceeded, "DrainDeadlineExceeded")]
#[case::stalled(FailureKind::Stalled, "DrainStalled")]
fn each_kind_of_failure_has_its_event(#[case] kind: FailureKind, #[case] reason: &str) {
    let template = template();
    let ctx = ActCtx {
        set_name: "web",
        replicas: 2,
        template: Some(&template),
        now: now(),
        revision: None,
    };
    let events = events(&ctx, &failure(2, kind, false, false), &Outcome::Done);
    assert_eq!(events.len(), 2);
    assert!(
        events
            .iter()
            .all(|e| e.reason == reason && e.severity == Severity::Warning)
    );
    assert!(matches!(events[0].subject, Subject::Pod { .. }));
    assert_eq!(events[1].subject, Subject::Set);
}

#[rstest::rstest]
#[case::cancelled(DeleteWhy::Cancelled, Some("DrainCancelled"))]
#[case::scale_up_wait(DeleteWhy::ScaleUpWaitExceeded, Some("ScaleUpWaitExceeded"))]
#[case::template(DeleteWhy::TemplateChanged, Some("DrainTemplateChanged"))]
#[case::succeeded(DeleteWhy::Succeeded, None)]
#[case::stuck(DeleteWhy::Stuck, None)]
fn pod_deletes_report_what_the_user_must_know(
    #[case] why: DeleteWhy,
    #[case] reason: Option<&str>,
) {
    let ctx = ActCtx {
        set_name: "web",
        replicas: 2,
        template: None,
        now: now(),
        revision: None,
    };
    let action = delete_pod(2, why, None);
    let got: Vec<&str> = events(&ctx, &action, &Outcome::Done)
        .iter()
        .map(|e| e.reason)
        .collect();
    assert_eq!(got, reason.into_iter().collect::<Vec<_>>());
    assert!(events(&ctx, &action, &Outcome::Changed).is_empty());
}

#[tokio::test]
async fn clearing_removes_every_drain_annotation() {
    let fake = Fake::default();
    ok(run(
        &fake,
        &[Action::ClearRecord {
            ordinal: 2,
            claims: vec![claim(2)],
        }],
    )
    .await);
    let Call::Annotate(_, pairs) = &fake.calls()[0] else {
        panic!()
    };
    assert_eq!(pairs.len(), claim_annotations::ALL.len());
    assert!(pairs.iter().all(|(_, v)| v.is_none()));
}

#[tokio::test]
async fn a_drain_pod_the_live_set_has_back_in_range_is_withdrawn_at_once_and_unrecorded() {
    let fake = Fake {
        back_in_range: true,
        ..Fake::default()
    };
    ok(run(&fake, &[create(1, true)]).await);
    assert_eq!(
        fake.calls(),
        vec![
            Call::Create("web-2".into()),
            Call::DeletePod("web-2".into(), "new-uid".into(), None),
        ],
        "no claim is annotated and no DrainStarted event is published"
    );
}

#[tokio::test]
async fn a_drain_pod_whose_set_cannot_be_read_is_withdrawn_and_the_failure_retried() {
    let fake = Fake {
        live_set_unreadable: true,
        ..Fake::default()
    };
    let failed = run(&fake, &[create(1, true)]).await;
    assert_eq!(failed.len(), 1);
    assert!(
        matches!(failed[0].1, ActError::Confirm { .. }),
        "{:?}",
        failed[0].1
    );
    assert_eq!(
        fake.calls(),
        vec![
            Call::Create("web-2".into()),
            Call::DeletePod("web-2".into(), "new-uid".into(), None),
        ]
    );
}

#[tokio::test]
async fn a_withdrawal_that_fails_is_a_failure_and_no_claim_is_recorded() {
    let fake = Fake {
        back_in_range: true,
        fail_on: Some("delete_pod"),
        ..Fake::default()
    };
    let failed = run(&fake, &[create(1, true)]).await;
    assert_eq!(failed[0].1.reason(), "DeleteDrainPodFailed");
    assert_eq!(
        *fake.withdraw_later.lock().unwrap(),
        vec![("web-2".to_owned(), "new-uid".to_owned())],
        "left to the next reconciles"
    );
    assert!(
        fake.calls()
            .iter()
            .all(|c| !matches!(c, Call::Annotate(..) | Call::Event(_))),
        "{:?}",
        fake.calls()
    );
}

#[tokio::test]
async fn while_the_live_read_fails_no_drain_pod_is_created_before_it() {
    let fake = Fake {
        live_set_unreadable: true,
        confirm_first: true,
        ..Fake::default()
    };
    let failed = run(&fake, &[create(1, true)]).await;
    assert_eq!(failed[0].1.reason(), "ReadFailed");
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    let fake = Fake {
        back_in_range: true,
        confirm_first: true,
        ..Fake::default()
    };
    ok(run(&fake, &[create(1, true)]).await);
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    let fake = Fake {
        confirm_first: true,
        ..Fake::default()
    };
    ok(run(&fake, &[create(1, true)]).await);
    assert_eq!(fake.calls()[0], Call::Create("web-2".into()));
    assert!(
        matches!(fake.calls()[1], Call::Annotate(..)),
        "{:?}",
        fake.calls()
    );
}

#[tokio::test]
async fn a_name_taken_or_a_failed_create_with_the_ordinal_back_is_no_failure() {
    for (exists, fail_on) in [(true, None), (false, Some("create"))] {
        let fake = Fake {
            back_in_range: true,
            exists,
            fail_on,
            ..Fake::default()
        };
        ok(run(&fake, &[create(1, true)]).await);
        assert_eq!(fake.calls(), vec![Call::Create("web-2".into())]);
    }
}

#[tokio::test]
async fn a_failed_create_is_reported_as_such_even_if_the_set_cannot_be_read() {
    let fake = Fake {
        live_set_unreadable: true,
        fail_on: Some("create"),
        ..Fake::default()
    };
    let failed = run(&fake, &[create(1, true)]).await;
    assert_eq!(failed[0].1.reason(), "CreateDrainPodFailed");
}

#[tokio::test]
async fn creating_without_a_template_is_an_error_not_a_panic() {
    let fake = Fake::default();
    let ctx = ActCtx {
        set_name: "web",
        replicas: 2,
        template: None,
        now: now(),
        revision: None,
    };
    let failed = apply(&fake, &ctx, &[create(1, true)]).await;
    assert_eq!(failed[0].1.reason(), "CreateDrainPodFailed");
    assert!(fake.calls().is_empty());
}

#[tokio::test]
async fn a_vanished_pod_that_the_api_server_still_has_is_not_a_failure() {
    let fake = Fake {
        live_pod: Some("p".to_owned()),
        ..Fake::default()
    };
    ok(run(&fake, &[failure(2, FailureKind::Vanished, false, true)]).await);
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
}

#[tokio::test]
async fn a_vanished_pod_confirmed_gone_is_counted() {
    let fake = Fake {
        live_pod: Some("another-uid".to_owned()),
        ..Fake::default()
    };
    ok(run(&fake, &[failure(2, FailureKind::Vanished, false, true)]).await);
    assert!(matches!(&fake.calls()[0], Call::Annotate(..)));
}

#[test]
fn dry_run_events_say_what_would_happen_without_times() {
    let template = template();
    let ctx = ActCtx {
        set_name: "web",
        replicas: 2,
        template: Some(&template),
        now: now(),
        revision: None,
    };
    let cases = [
        (
            create(1, true),
            "DryRunCreateDrainPod",
            "would create drain pod web-2 (attempt 1) for claims data-web-2",
        ),
        (
            Action::DeleteClaims {
                ordinal: 2,
                claims: vec![claim(2)],
            },
            "DryRunDeleteClaims",
            "would delete claims data-web-2 (drain pod web-2 succeeded)",
        ),
        (
            delete_pod(2, DeleteWhy::Cancelled, Some("7")),
            "DryRunDeleteDrainPod",
            "would delete drain pod web-2 (Cancelled)",
        ),
        (
            failure(2, FailureKind::Failed, true, false),
            "DryRunRecordFailure",
            "and give up",
        ),
    ];
    for (action, reason, note) in cases {
        let e = dry_run_event(&ctx, &action);
        assert_eq!(e.reason, reason);
        assert!(e.note.contains(note), "{}", e.note);
        assert!(
            !e.note.contains("2027") && !e.note.contains("2026"),
            "no time: {}",
            e.note
        );
        assert_eq!(e.subject, Subject::Set);
    }
}

fn gone(claim: &'static str) -> Fake {
    Fake {
        gone_claim: Some(claim),
        ..Fake::default()
    }
}

fn is_annotate(call: &Call) -> bool {
    matches!(call, Call::Annotate(..))
}

#[tokio::test]
async fn a_claim_replaced_before_a_new_series_is_recorded_still_reports_the_pod() {
    // The series is written with the UID after the create: the pod exists either way, and the
    // next reconcile repairs the record from it.
    let fake = gone("data-web-2");
    ok(run(&fake, &[create(1, true)]).await);
    let calls = fake.calls();
    assert_eq!(calls[0], Call::Create("web-2".to_owned()), "{calls:?}");
    assert!(is_annotate(&calls[1]), "{calls:?}");
    assert!(
        calls.contains(&Call::Event("DrainPodCreated".to_owned())),
        "{calls:?}"
    );
}

#[tokio::test]
async fn a_claim_replaced_before_its_failure_is_counted_stops_the_ordinal_not_the_others() {
    let fake = gone("data-web-2");
    let actions = [
        failure(2, FailureKind::Failed, false, false),
        delete_pod(2, DeleteWhy::Failed, None),
        failure(1, FailureKind::Failed, false, false),
        delete_pod(1, DeleteWhy::Failed, None),
    ];
    ok(run(&fake, &actions).await);
    let calls = fake.calls();
    assert!(
        !calls.contains(&Call::DeletePod("web-2".to_owned(), "p".to_owned(), None)),
        "{calls:?}"
    );
    assert!(
        calls.contains(&Call::DeletePod("web-1".to_owned(), "p".to_owned(), None)),
        "{calls:?}"
    );
    let reported = calls.iter().filter(|c| matches!(c, Call::Event(_))).count();
    assert_eq!(
        reported, 2,
        "only ordinal 1's failure is reported: {calls:?}"
    );
}

#[tokio::test]
async fn a_claim_replaced_stops_writing_to_the_claims_after_it() {
    let fake = gone("data-web-2");
    let other = ClaimRef {
        name: "logs-web-2".to_owned(),
        uid: "l2".to_owned(),
    };
    let actions = [
        Action::RecordReturn {
            ordinal: 2,
            claims: vec![claim(2), other],
            at: now(),
        },
        Action::ClearRecord {
            ordinal: 2,
            claims: vec![claim(2)],
        },
    ];
    ok(run(&fake, &actions).await);
    let calls = fake.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(matches!(&calls[0], Call::Annotate(n, _) if n == "data-web-2"));
}

#[tokio::test]
async fn a_claim_replaced_after_the_create_still_reports_the_pod() {
    // Not a new series: the only write is the UID record after the create.
    let fake = gone("data-web-2");
    ok(run(&fake, &[create(2, false)]).await);
    let calls = fake.calls();
    assert_eq!(calls[0], Call::Create("web-2".to_owned()));
    assert!(is_annotate(&calls[1]), "{calls:?}");
    assert!(calls.contains(&Call::Event("DrainRetrying".to_owned())));
}

#[test]
fn a_replaced_claim_is_reported_by_no_event() {
    let ctx = ActCtx {
        set_name: "web",
        replicas: 2,
        template: None,
        now: now(),
        revision: None,
    };
    let action = failure(2, FailureKind::Failed, true, false);
    assert!(events(&ctx, &action, &Outcome::ClaimGone("data-web-2".to_owned())).is_empty());
}

#[test]
fn only_a_create_refused_for_a_namespace_being_deleted_is_namespace_terminating() {
    // As the NamespaceLifecycle admission plugin answers (its cause type is `reason` in JSON).
    let terminating: kube::core::Status = serde_json::from_value(serde_json::json!({
        "status": "Failure", "code": 403, "reason": "Forbidden",
        "message": "pods \"web-2\" is forbidden: unable to create new content in namespace ns because it is being terminated",
        "details": {"name": "web-2", "kind": "pods", "causes": [{
            "reason": "NamespaceTerminating", "message": "namespace ns is being terminated",
            "field": "metadata.namespace"}]},
    }))
    .unwrap();
    let create = |status: kube::core::Status| ActError::CreateDrainPod {
        name: "web-2".to_owned(),
        source: kube::Error::Api(Box::new(status)),
    };
    assert!(create(terminating.clone()).namespace_terminating());
    // Another 403 (RBAC) is a failure like any other.
    let rbac = kube::core::Status::failure("pods is forbidden", "Forbidden").with_code(403);
    assert!(!create(rbac).namespace_terminating());
    assert!(
        !ActError::NoTemplate {
            name: "web-2".to_owned()
        }
        .namespace_terminating()
    );
}

#[test]
fn an_event_note_is_cut_at_a_character_boundary_within_the_api_limit() {
    assert_eq!(fit_note("short".to_owned()), "short");
    let exact = "a".repeat(NOTE_BYTES);
    assert_eq!(fit_note(exact.clone()), exact);
    // Two-, three- and four-byte characters, each at every offset against the limit.
    for c in ['é', '€', '𝄞'] {
        for prefix in 0..4 {
            let note = format!("{}{}", "a".repeat(prefix), c.to_string().repeat(600));
            let cut = fit_note(note.clone());
            assert!(cut.len() <= NOTE_BYTES, "{c} {prefix}: {} bytes", cut.len());
            assert!(cut.ends_with('…'));
            assert!(note.starts_with(cut.trim_end_matches('…')));
            assert!(cut.len() > NOTE_BYTES - 4 - '…'.len_utf8());
        }
    }
}
