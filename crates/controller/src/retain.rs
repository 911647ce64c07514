//! The safety net under the one irreversible step (`drain-retain-volume-for`): before a drained
//! claim is deleted, its PersistentVolume's reclaim policy is set to `Retain` and the volume is
//! marked ([`drain_api::retained`]); a sweep puts the original policy back once the retention
//! ends, or as soon as the volume is bound to another claim (restored).
//!
//! The decisions ([`mark`], [`sweep_step`]) are pure; the leader's loop around them is
//! `runtime::sweep`. Every write carries the volume's resourceVersion, so a volume changed in between is
//! read again rather than overwritten.

use std::collections::BTreeMap;

use drain_api::retained;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::{Value, json};

/// The reclaim policy that keeps a volume after its claim is deleted.
pub const RETAIN: &str = "Retain";

/// The drained claim a volume is retained for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retention<'a> {
    /// The claim's namespace (the set's).
    pub namespace: &'a str,
    /// The StatefulSet.
    pub set: &'a str,
    /// The drain pod that drained it.
    pub pod: &'a str,
    /// The claim's name.
    pub claim: &'a str,
    /// The claim's UID.
    pub claim_uid: &'a str,
    /// When the retention ends.
    pub until: Timestamp,
}

/// What marking a volume for a retention comes to.
#[derive(Clone, Debug, PartialEq)]
pub enum Marking {
    /// Write this merge patch (policy `Retain`, the marks, the resourceVersion read).
    Patch(Value),
    /// Marked for this claim already (an earlier try, before a crash or a failed delete).
    Already,
    /// The volume's policy is `Retain` by someone else's choice: it outlives the claim anyway,
    /// and is not marked (so never swept).
    KeptByOwner,
}

/// Why a volume cannot be marked: the claim is kept.
#[derive(Debug, thiserror::Error)]
pub enum RetainError {
    /// The volume the claim names is bound to another claim.
    #[error("volume {volume} is bound to another claim, not to {claim}")]
    BoundElsewhere {
        /// The volume.
        volume: String,
        /// The claim.
        claim: String,
    },
    /// An API call failed (an RBAC denial, a conflict, the server).
    #[error("failed to {what} volume {volume}")]
    Api {
        /// What was tried: `read`, `patch`.
        what: &'static str,
        /// The volume.
        volume: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Reading the claim failed.
    #[error("failed to read claim {claim}")]
    Claim {
        /// The claim.
        claim: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// A label value if `value` is one (63 characters at most, alphanumerics at both ends, `-_.`
/// inside); names that are not go in the annotations only.
fn label_value(value: &str) -> Option<&str> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric())
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    ok.then_some(value)
}

fn annotation<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn policy(pv: &PersistentVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        // The API server defaults it; a volume read back without one is `Retain` for the
        // PV controller.
        .unwrap_or(RETAIN)
}

/// Whether `pv` carries this controller's retention marks.
pub fn is_marked(pv: &PersistentVolume) -> bool {
    pv.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(retained::LABEL))
        .is_some_and(|v| v == "true")
}

/// How to mark `pv`, bound to the drained claim, for `r`.
pub fn mark(pv: &PersistentVolume, r: &Retention<'_>) -> Result<Marking, RetainError> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let bound_here = claim_ref.is_some_and(|c| {
        c.namespace.as_deref() == Some(r.namespace)
            && c.name.as_deref() == Some(r.claim)
            && c.uid.as_deref().is_none_or(|uid| uid == r.claim_uid)
    });
    if !bound_here {
        return Err(RetainError::BoundElsewhere {
            volume: name,
            claim: r.claim.to_owned(),
        });
    }
    let for_this_claim = annotation(pv, retained::CLAIM_UID) == Some(r.claim_uid);
    // Our marks, for this claim or for an earlier one on the same volume (restored from a
    // retention and drained again): the `Retain` is ours, not the owner's.
    let ours = for_this_claim || is_marked(pv);
    let current = policy(pv);
    if for_this_claim && current == RETAIN && is_marked(pv) {
        return Ok(Marking::Already);
    }
    if !ours && current == RETAIN {
        return Ok(Marking::KeptByOwner);
    }
    // Marked before, but for another claim, or the policy or the label was changed since: mark
    // again, keeping the policy it had before the first mark.
    let from = match annotation(pv, retained::FROM_POLICY) {
        Some(from) if ours => from.to_owned(),
        _ => current.to_owned(),
    };
    let mut labels = BTreeMap::from([(retained::LABEL, "true")]);
    for (key, value) in [
        (retained::NAMESPACE_LABEL, r.namespace),
        (retained::SET_LABEL, r.set),
        (retained::CLAIM_LABEL, r.claim),
        (retained::POD_LABEL, r.pod),
    ] {
        if let Some(value) = label_value(value) {
            labels.insert(key, value);
        }
    }
    let annotations = BTreeMap::from([
        (retained::CLAIM, format!("{}/{}", r.namespace, r.claim)),
        (retained::CLAIM_UID, r.claim_uid.to_owned()),
        (retained::SET, format!("{}/{}", r.namespace, r.set)),
        (retained::POD, r.pod.to_owned()),
        (retained::FROM_POLICY, from),
        (retained::UNTIL, r.until.to_string()),
    ]);
    Ok(Marking::Patch(json!({
        "metadata": {
            "resourceVersion": pv.metadata.resource_version,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"persistentVolumeReclaimPolicy": RETAIN},
    })))
}

/// What the sweep does with one marked volume.
#[derive(Clone, Debug, PartialEq)]
pub enum SweepStep {
    /// Not this controller's to sweep (no marks, or a claim of a namespace not watched).
    Skip,
    /// Retained until then.
    Wait(Timestamp),
    /// The retention is over, or the volume is no longer the drained claim's (restored): put
    /// the original policy back and remove the labels with this merge patch. A volume still
    /// `Released` then goes the way its policy says (`Delete`: the provisioner frees it).
    Release {
        /// The patch.
        patch: Value,
        /// Why, for the log.
        why: &'static str,
    },
}

/// The sweep's decision for `pv` at `now`; `namespaces` are the namespaces watched (empty:
/// all), and a volume whose drained claim was in none of them is another controller's.
pub fn sweep_step(pv: &PersistentVolume, now: Timestamp, namespaces: &[String]) -> SweepStep {
    if !is_marked(pv) {
        return SweepStep::Skip;
    }
    let claim = annotation(pv, retained::CLAIM).unwrap_or_default();
    let claim_ns = claim.split_once('/').map(|(n, _)| n);
    if !namespaces.is_empty() && !namespaces.iter().any(|ns| claim_ns == Some(ns.as_str())) {
        return SweepStep::Skip;
    }
    let claim_uid = annotation(pv, retained::CLAIM_UID);
    let still_the_drained_claims = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .is_some_and(|c| c.uid.is_some() && c.uid.as_deref() == claim_uid);
    let until = annotation(pv, retained::UNTIL).and_then(|t| t.parse::<Timestamp>().ok());
    let why = match until {
        _ if !still_the_drained_claims => "restored: no longer bound to the drained claim",
        Some(until) if now < until => return SweepStep::Wait(until),
        Some(_) => "retention over",
        // Unreadable marks: keep the volume (a person can remove the label to let it go).
        None => return SweepStep::Skip,
    };
    // A policy missing or unreadable in the marks: `Delete`, what a provisioned volume has.
    let from = annotation(pv, retained::FROM_POLICY).unwrap_or("Delete");
    // Every mark goes: a volume handed back carries nothing of ours.
    let labels: BTreeMap<&str, Option<&str>> =
        retained::LABELS.iter().map(|l| (*l, None)).collect();
    let annotations: BTreeMap<&str, Option<&str>> =
        retained::ANNOTATIONS.iter().map(|a| (*a, None)).collect();
    SweepStep::Release {
        patch: json!({
            "metadata": {
                "resourceVersion": pv.metadata.resource_version,
                "labels": labels,
                "annotations": annotations,
            },
            "spec": {"persistentVolumeReclaimPolicy": from},
        }),
        why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const UID: &str = "claim-uid-1";

    fn retention() -> Retention<'static> {
        Retention {
            namespace: "ns",
            set: "web",
            pod: "web-2",
            claim: "data-web-2",
            claim_uid: UID,
            until: "2026-11-27T00:00:00Z".parse().unwrap(),
        }
    }

    fn volume(policy: Option<&str>, claim_uid: Option<&str>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pv-1".into()),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                persistent_volume_reclaim_policy: policy.map(Into::into),
                claim_ref: Some(ObjectReference {
                    namespace: Some("ns".into()),
                    name: Some("data-web-2".into()),
                    uid: claim_uid.map(Into::into),
                    ..ObjectReference::default()
                }),
                ..PersistentVolumeSpec::default()
            }),
            status: None,
        }
    }

    /// `pv` with the merge patch applied (maps merged, nulls removing keys).
    fn patched(pv: &PersistentVolume, patch: &Value) -> PersistentVolume {
        fn merge(target: &mut Value, patch: &Value) {
            match (target, patch) {
                (Value::Object(t), Value::Object(p)) => {
                    for (k, v) in p {
                        if v.is_null() {
                            t.remove(k);
                        } else {
                            merge(t.entry(k.clone()).or_insert(Value::Null), v);
                        }
                    }
                }
                (t, p) => *t = p.clone(),
            }
        }
        let mut value = serde_json::to_value(pv).unwrap();
        merge(&mut value, patch);
        serde_json::from_value(value).unwrap()
    }

    fn marked(pv: &PersistentVolume) -> PersistentVolume {
        let Ok(Marking::Patch(patch)) = mark(pv, &retention()) else {
            panic!("not marked")
        };
        patched(pv, &patch)
    }

    #[test]
    fn a_deletable_volume_is_set_to_retain_and_marked_with_everything_needed_to_restore_it() {
        let pv = marked(&volume(Some("Delete"), Some(UID)));
        assert_eq!(policy(&pv), RETAIN);
        assert!(is_marked(&pv));
        let labels = pv.metadata.labels.clone().unwrap();
        assert_eq!(labels[retained::SET_LABEL], "web");
        assert_eq!(labels[retained::CLAIM_LABEL], "data-web-2");
        assert_eq!(labels[retained::POD_LABEL], "web-2");
        assert_eq!(labels[retained::NAMESPACE_LABEL], "ns");
        assert_eq!(annotation(&pv, retained::CLAIM), Some("ns/data-web-2"));
        assert_eq!(annotation(&pv, retained::FROM_POLICY), Some("Delete"));
        assert_eq!(
            annotation(&pv, retained::UNTIL),
            Some("2026-11-27T00:00:00Z")
        );
        // Marking again is a no-op, and keeps the original policy.
        assert_eq!(mark(&pv, &retention()).unwrap(), Marking::Already);
        let mut reset = pv.clone();
        reset
            .spec
            .as_mut()
            .unwrap()
            .persistent_volume_reclaim_policy = Some("Delete".into());
        assert_eq!(
            annotation(&marked(&reset), retained::FROM_POLICY),
            Some("Delete")
        );
    }

    #[test]
    fn the_patch_carries_the_resource_version_read() {
        let Ok(Marking::Patch(patch)) = mark(&volume(Some("Delete"), Some(UID)), &retention())
        else {
            panic!()
        };
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn a_volume_its_owner_retains_is_left_alone_and_never_swept() {
        let pv = volume(Some(RETAIN), Some(UID));
        assert_eq!(mark(&pv, &retention()).unwrap(), Marking::KeptByOwner);
        assert_eq!(sweep_step(&pv, Timestamp::MAX, &[]), SweepStep::Skip);
    }

    #[test]
    fn a_volume_bound_to_another_claim_is_an_error() {
        assert!(matches!(
            mark(&volume(Some("Delete"), Some("other")), &retention()),
            Err(RetainError::BoundElsewhere { .. })
        ));
        let mut pv = volume(Some("Delete"), Some(UID));
        pv.spec.as_mut().unwrap().claim_ref = None;
        assert!(mark(&pv, &retention()).is_err());
    }

    #[test]
    fn names_that_are_not_label_values_are_only_annotated() {
        let long = "d".repeat(64);
        let r = Retention {
            claim: &long,
            ..retention()
        };
        let mut pv = volume(Some("Delete"), Some(UID));
        pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().name = Some(long.clone());
        let Ok(Marking::Patch(patch)) = mark(&pv, &r) else {
            panic!()
        };
        assert!(
            patch["metadata"]["labels"]
                .get(retained::CLAIM_LABEL)
                .is_none()
        );
        assert_eq!(
            patch["metadata"]["annotations"][retained::CLAIM],
            format!("ns/{long}")
        );
    }

    #[test]
    fn the_sweep_waits_for_the_end_then_puts_the_original_policy_back() {
        let pv = marked(&volume(Some("Delete"), Some(UID)));
        let until: Timestamp = "2026-11-27T00:00:00Z".parse().unwrap();
        let before = until - std::time::Duration::from_secs(1);
        assert_eq!(sweep_step(&pv, before, &[]), SweepStep::Wait(until));
        let SweepStep::Release { patch, .. } = sweep_step(&pv, until, &[]) else {
            panic!()
        };
        let released = patched(&pv, &patch);
        assert_eq!(policy(&released), "Delete");
        assert!(!is_marked(&released));
        assert!(released.metadata.labels.unwrap_or_default().is_empty());
        // Every mark goes, the annotations too.
        assert!(released.metadata.annotations.unwrap_or_default().is_empty());
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn our_marks_for_an_earlier_claim_are_ours_when_the_restored_claim_is_drained_again() {
        // Retained for the first claim, restored as a new claim (same name, new UID), which is
        // drained again before the sweep handed the volume back.
        let mut pv = marked(&volume(Some("Delete"), Some(UID)));
        pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("restored-uid".into());
        let again = Retention {
            claim_uid: "restored-uid",
            ..retention()
        };
        let Ok(Marking::Patch(patch)) = mark(&pv, &again) else {
            panic!("{:?}", mark(&pv, &again))
        };
        let remarked = patched(&pv, &patch);
        assert!(is_marked(&remarked));
        // The policy to put back is still the one from before the first mark.
        assert_eq!(annotation(&remarked, retained::FROM_POLICY), Some("Delete"));
        assert_eq!(
            annotation(&remarked, retained::CLAIM_UID),
            Some("restored-uid")
        );
        // Swept while still bound to it: kept until the new retention ends.
        assert!(matches!(
            sweep_step(&remarked, "2026-11-26T00:00:00Z".parse().unwrap(), &[]),
            SweepStep::Wait(_)
        ));
    }

    #[test]
    fn a_restored_volume_is_handed_back_at_once() {
        let mut pv = marked(&volume(Some("Delete"), Some(UID)));
        let early: Timestamp = "2026-11-26T00:00:00Z".parse().unwrap();
        // claimRef removed by hand (to bind it to a new claim), or bound to the new claim.
        for claim_ref in [
            None,
            Some(ObjectReference {
                uid: Some("new".into()),
                ..ObjectReference::default()
            }),
        ] {
            pv.spec.as_mut().unwrap().claim_ref = claim_ref;
            let SweepStep::Release { patch, why } = sweep_step(&pv, early, &[]) else {
                panic!()
            };
            assert!(why.starts_with("restored"));
            assert_eq!(policy(&patched(&pv, &patch)), "Delete");
        }
    }

    #[test]
    fn a_namespaced_controller_sweeps_only_its_namespace() {
        let pv = marked(&volume(Some("Delete"), Some(UID)));
        assert_eq!(
            sweep_step(&pv, Timestamp::MAX, &["other".into()]),
            SweepStep::Skip
        );
        assert!(matches!(
            sweep_step(&pv, Timestamp::MAX, &["ns".into()]),
            SweepStep::Release { .. }
        ));
    }

    /// Watching a list of namespaces, the volumes of claims in any of them are swept, others
    /// not; watching every namespace (an empty list), all are.
    #[rstest::rstest]
    #[case::first(&["ns", "b"], true)]
    #[case::second(&["a", "ns"], true)]
    #[case::neither(&["a", "b"], false)]
    #[case::a_prefix_is_not_the_namespace(&["n", "ns-2"], false)]
    #[case::all(&[], true)]
    fn a_controller_over_several_namespaces_sweeps_theirs(
        #[case] watched: &[&str],
        #[case] swept: bool,
    ) {
        let pv = marked(&volume(Some("Delete"), Some(UID)));
        let watched: Vec<String> = watched.iter().map(|s| (*s).to_owned()).collect();
        let step = sweep_step(&pv, Timestamp::MAX, &watched);
        assert_eq!(
            matches!(step, SweepStep::Release { .. }),
            swept,
            "{watched:?}: {step:?}"
        );
    }

    #[test]
    fn unreadable_marks_keep_the_volume() {
        let mut pv = marked(&volume(Some("Delete"), Some(UID)));
        pv.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(retained::UNTIL.into(), "soon".into());
        assert_eq!(sweep_step(&pv, Timestamp::MAX, &[]), SweepStep::Skip);
    }

    #[test]
    fn label_values() {
        assert_eq!(label_value("data-web-2"), Some("data-web-2"));
        for bad in ["", "-a", "a-", "a/b", &"x".repeat(64)] {
            assert_eq!(label_value(bad), None, "{bad}");
        }
    }
}
