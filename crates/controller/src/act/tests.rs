//! Tests of the act step against a fake cluster that records calls and injects errors.

use std::sync::Mutex;

use super::*;
use crate::config::DrainConfig;
use crate::fixtures::{SetBuilder, drain_template_json};
use crate::template::validate;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Create(String),
    DeletePod(String, String),
    DeleteClaim(String, String),
    Annotate(String, Vec<(String, Option<String>)>),
    Event(String),
}

#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<Call>>,
    fail_on: Option<&'static str>,
    exists: bool,
    /// The live set has the ordinal back in range.
    back_in_range: bool,
    /// The live pod UID behind the drain pod's name.
    live_pod: Option<String>,
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
        self.calls.lock().unwrap().push(call);
        if self.fail_on == Some(kind) {
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
        Ok(if self.exists {
            Created::AlreadyExists
        } else {
            Created::Uid("new-uid".to_owned())
        })
    }
    async fn delete_pod(&self, name: &str, uid: &str) -> Result<(), kube::Error> {
        self.push(
            Call::DeletePod(name.to_owned(), uid.to_owned()),
            "delete_pod",
        )
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
    ) -> Result<(), kube::Error> {
        let pairs = annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.push(Call::Annotate(name.to_owned(), pairs), "annotate")
    }
    async fn still_orphaned(&self, _ordinal: i32) -> Result<bool, kube::Error> {
        Ok(!self.back_in_range)
    }
    async fn pod_uid(&self, _name: &str) -> Result<Option<String>, kube::Error> {
        Ok(self.live_pod.clone())
    }
    async fn event(&self, _: &Subject, _: Severity, reason: &str, _: String) {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Event(reason.to_owned()));
    }
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
        first_attempt_at: first.then(now),
    }
}

#[tokio::test]
async fn create_records_the_first_attempt_then_creates_then_records_the_uid() {
    let fake = Fake::default();
    apply(&fake, &template(), 2, &[create(1, true)], now())
        .await
        .unwrap();
    assert_eq!(
        fake.calls(),
        vec![
            Call::Annotate(
                "data-web-2".to_owned(),
                vec![(
                    claim_annotations::FIRST_ATTEMPT_AT.to_owned(),
                    Some(now().to_string())
                )]
            ),
            Call::Create("web-2".to_owned()),
            Call::Annotate(
                "data-web-2".to_owned(),
                vec![(
                    claim_annotations::POD_UID.to_owned(),
                    Some("new-uid".to_owned())
                )]
            ),
            Call::Event("DrainPodCreated".to_owned()),
            Call::Event("DrainPodCreated".to_owned()),
        ]
    );
}

#[tokio::test]
async fn a_retry_is_reported_as_such() {
    let fake = Fake::default();
    apply(&fake, &template(), 2, &[create(2, false)], now())
        .await
        .unwrap();
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
    apply(&fake, &template(), 2, &[create(1, false)], now())
        .await
        .unwrap();
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
        Action::DeleteDrainPod {
            ordinal: 2,
            name: "web-2".to_owned(),
            uid: "p".to_owned(),
            why: DeleteWhy::Succeeded,
        },
    ];
    apply(&fake, &template(), 2, &actions, now()).await.unwrap();
    assert_eq!(
        fake.calls(),
        vec![
            Call::Event("DrainSucceeded".to_owned()),
            Call::DeleteClaim("data-web-2".to_owned(), "c2".to_owned()),
            Call::Event("ClaimsDeleted".to_owned()),
            Call::DeletePod("web-2".to_owned(), "p".to_owned()),
        ]
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
        Action::DeleteDrainPod {
            ordinal: 2,
            name: "web-2".to_owned(),
            uid: "p".to_owned(),
            why: DeleteWhy::Succeeded,
        },
    ];
    let e = apply(&fake, &template(), 2, &actions, now())
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "DeleteClaimFailed");
    assert_eq!(e.to_string(), "failed to delete claim data-web-2");
    assert!(
        !fake
            .calls()
            .iter()
            .any(|c| matches!(c, Call::DeletePod(..)))
    );
}

#[tokio::test]
async fn a_failed_failure_record_stops_before_the_pod_delete() {
    let fake = Fake::failing("annotate");
    let actions = [
        Action::RecordFailure {
            ordinal: 2,
            claims: vec![claim(2)],
            pod_uid: "p".to_owned(),
            attempts: 1,
            retry_after: now(),
            reason: "x".to_owned(),
            gave_up: false,
            only_if_pod_gone: false,
        },
        Action::DeleteDrainPod {
            ordinal: 2,
            name: "web-2".to_owned(),
            uid: "p".to_owned(),
            why: DeleteWhy::Failed,
        },
    ];
    let e = apply(&fake, &template(), 2, &actions, now())
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "AnnotateClaimFailed");
    assert!(
        !fake
            .calls()
            .iter()
            .any(|c| matches!(c, Call::DeletePod(..)))
    );
}

#[tokio::test]
async fn giving_up_is_a_warning_on_the_set() {
    let fake = Fake::default();
    let action = Action::RecordFailure {
        ordinal: 2,
        claims: vec![claim(2)],
        pod_uid: "p".to_owned(),
        attempts: 3,
        retry_after: now(),
        reason: "container drain exited with code 1".to_owned(),
        gave_up: true,
        only_if_pod_gone: false,
    };
    apply(&fake, &template(), 2, &[action], now())
        .await
        .unwrap();
    let calls = fake.calls();
    assert!(matches!(&calls[0], Call::Annotate(n, pairs) if n == "data-web-2" && pairs.len() == 4));
    assert!(calls.contains(&Call::Event("DrainGaveUp".to_owned())));
}

#[tokio::test]
async fn clearing_removes_every_drain_annotation() {
    let fake = Fake::default();
    apply(
        &fake,
        &template(),
        2,
        &[Action::ClearRecord {
            ordinal: 2,
            claims: vec![claim(2)],
        }],
        now(),
    )
    .await
    .unwrap();
    let Call::Annotate(_, pairs) = &fake.calls()[0] else {
        panic!()
    };
    assert_eq!(pairs.len(), claim_annotations::ALL.len());
    assert!(pairs.iter().all(|(_, v)| v.is_none()));
}

#[tokio::test]
async fn no_drain_pod_when_the_live_set_has_the_ordinal_back() {
    let fake = Fake {
        back_in_range: true,
        ..Fake::default()
    };
    apply(&fake, &template(), 2, &[create(1, true)], now())
        .await
        .unwrap();
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
}

fn vanished() -> Action {
    Action::RecordFailure {
        ordinal: 2,
        claims: vec![claim(2)],
        pod_uid: "p".to_owned(),
        attempts: 1,
        retry_after: now(),
        reason: "drain pod was deleted before it finished".to_owned(),
        gave_up: false,
        only_if_pod_gone: true,
    }
}

#[tokio::test]
async fn a_vanished_pod_that_the_api_server_still_has_is_not_a_failure() {
    let fake = Fake {
        live_pod: Some("p".to_owned()),
        ..Fake::default()
    };
    apply(&fake, &template(), 2, &[vanished()], now())
        .await
        .unwrap();
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
}

#[tokio::test]
async fn a_vanished_pod_confirmed_gone_is_counted() {
    let fake = Fake {
        live_pod: Some("another-uid".to_owned()),
        ..Fake::default()
    };
    apply(&fake, &template(), 2, &[vanished()], now())
        .await
        .unwrap();
    assert!(matches!(&fake.calls()[0], Call::Annotate(..)));
}
