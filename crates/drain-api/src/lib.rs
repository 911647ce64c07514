//! Names both sides of a drain agree on: the controller that creates drain pods and the programs
//! (the `drainer`, or a user's own image) that run inside them. No I/O, no Kubernetes client.

/// Prefix of every annotation and label this project reads or writes.
pub const PREFIX: &str = "statefulsets.kubernetes.io/";

/// Annotations a user sets on a StatefulSet to opt in and tune draining.
pub mod annotations {
    /// Opt-in: a JSON pod template (`metadata` + `spec`) for the drain pods of this StatefulSet.
    pub const DRAINER_POD_TEMPLATE: &str = "statefulsets.kubernetes.io/drainer-pod-template";
    /// Most drain pods that run at once for this set (positive integer). Default: 1 for
    /// `OrderedReady` sets, unlimited for `Parallel` ones.
    pub const MAX_CONCURRENT: &str = "statefulsets.kubernetes.io/drain-max-concurrent";
    /// What a scale-up does to a drain in flight for an ordinal that comes back in range:
    /// `cancel` (default: the drain pod is stopped and the returning pod gets its claims back,
    /// unless the drain already succeeded) or `finish` (the drain completes and the returning pod
    /// gets a fresh claim; the returning pod waits at most the controller's `--scale-up-wait`
    /// without progress).
    pub const ON_SCALE_UP: &str = "statefulsets.kubernetes.io/drain-on-scale-up";
    /// `false` stops the drain pod from inheriting placement and identity (tolerations, node
    /// selector, affinity, image pull secrets, service account, security context) from the
    /// StatefulSet's pod template. Default `true`.
    pub const INHERIT_POD_SPEC: &str = "statefulsets.kubernetes.io/drain-inherit-pod-spec";
    /// Most failed attempts per ordinal before retrying stops (positive integer; default unlimited).
    pub const MAX_ATTEMPTS: &str = "statefulsets.kubernetes.io/drain-max-attempts";
    /// Seconds after the first attempt of an ordinal after which retrying stops (default unlimited).
    pub const DEADLINE_SECONDS: &str = "statefulsets.kubernetes.io/drain-deadline-seconds";
    /// Seconds a running drain pod may go without its published progress
    /// ([`pod_annotations::PROGRESS`](crate::pod_annotations::PROGRESS)) changing before the
    /// controller takes it as stalled: a failed attempt (Warning `DrainStalled`), retried.
    /// Default: no stall detection.
    pub const STALL_SECONDS: &str = "statefulsets.kubernetes.io/drain-stall-seconds";
    /// `automatic` (the default): claims are deleted as soon as their drain succeeded.
    /// `manual`: a drained claim is deleted only once someone annotated it
    /// [`drain-approved=true`](crate::claim_annotations::APPROVED); until then the succeeded
    /// drain is shown as awaiting approval. Any other value is invalid and, for safety, also
    /// holds deletes for approval.
    pub const APPROVAL: &str = "statefulsets.kubernetes.io/drain-approval";
    /// What proves that a drain pod finished, and so that its claims may be deleted:
    ///
    /// - `completion-record` (the default): a container of the drain pod that exited 0 wrote
    ///   the [completion record](crate::completion) naming exactly the claims the pod was bound
    ///   to. A stopped, killed or failed program never writes it, so nothing but a finished
    ///   drain produces this proof. A pod that exits 0 without it is a failed attempt.
    /// - `exit-code`: every container exited 0 (any image; the 2018 proof of concept's
    ///   contract), and the controller saw the pod `Succeeded` with no deletion requested and no
    ///   `DisruptionTarget` condition. Liveness and startup probes on drain containers are
    ///   refused under it (their kill of a program that exits 0 on SIGTERM would look like a
    ///   success). Whatever the controller cannot tell is taken as not finished: the drain runs
    ///   again.
    ///
    /// Any other value is invalid, and until it is fixed the completion record is required.
    pub const SUCCESS_PROOF: &str = "statefulsets.kubernetes.io/drain-success-proof";
    /// A duration (`72h`, `7d`, `30m`): before a drained claim is deleted, its
    /// PersistentVolume's reclaim policy is set to `Retain` and the volume is marked
    /// ([`retained`](crate::retained)), so the data outlives the claim for this long and can be
    /// restored; then its original policy is put back (for a dynamically provisioned volume,
    /// `Delete`: the provisioner frees it). If the volume cannot be marked, the claim is kept.
    /// Default: no retention.
    pub const RETAIN_VOLUME_FOR: &str = "statefulsets.kubernetes.io/drain-retain-volume-for";
    /// Written by the controller on the StatefulSet: a JSON summary of every ordinal it tracks
    /// (waiting, draining, retrying, failed, done), for `kubectl get -o yaml` readers.
    pub const STATUS: &str = "statefulsets.kubernetes.io/drain-status";
    /// Written by the controller on an OpenKruise Advanced StatefulSet when a drain pod that
    /// held the name of an ordinal the set wants again is gone: `<pod name> <time>`. Kruise does
    /// not watch pods it does not control, so without this write it would retry creating its
    /// pod only at its next backoff (up to minutes later).
    pub const RELEASED: &str = "statefulsets.kubernetes.io/drain-pod-released";
}

/// Annotations the controller keeps on an ordinal's claims: the drain's state lives in the cluster.
pub mod claim_annotations {
    /// Number of drain attempts that failed for this ordinal.
    pub const ATTEMPTS: &str = "statefulsets.kubernetes.io/drain-attempts";
    /// RFC 3339 time of the first drain attempt (the deadline counts from it).
    pub const FIRST_ATTEMPT_AT: &str = "statefulsets.kubernetes.io/drain-first-attempt-at";
    /// RFC 3339 time before which no new drain pod is created (exponential backoff).
    pub const RETRY_AFTER: &str = "statefulsets.kubernetes.io/drain-retry-after";
    /// Why the last attempt failed, in a few words.
    pub const LAST_FAILURE: &str = "statefulsets.kubernetes.io/drain-last-failure";
    /// UID of the drain pod of the current attempt, so a drain pod deleted by someone else is
    /// noticed (and counted as a failed attempt).
    pub const POD_UID: &str = "statefulsets.kubernetes.io/drain-pod-uid";
    /// UID of the drain pod whose failure was last counted, so a failure is counted once.
    pub const COUNTED_POD_UID: &str = "statefulsets.kubernetes.io/drain-counted-pod-uid";
    /// Hash of the drain template the current series of attempts runs with: a changed template
    /// starts a new series (attempts, backoff and deadline start over).
    pub const TEMPLATE_HASH: &str = "statefulsets.kubernetes.io/drain-template-hash";
    /// RFC 3339 time a scale-up brought the ordinal back while its drain ran under the `finish`
    /// policy: the returning pod waits for the drain at most `--scale-up-wait` from then.
    pub const RETURNED_AT: &str = "statefulsets.kubernetes.io/drain-returned-at";
    /// Set by a person (`true`) under `drain-approval: manual`: this claim's drain succeeded and
    /// it may be deleted. Cleared with the record when the ordinal comes back in range.
    pub const APPROVED: &str = "statefulsets.kubernetes.io/drain-approved";
    /// Under the `exit-code` proof: UID of the drain pod the controller saw `Succeeded` with no
    /// deletion requested and no disruption. Written before anything else happens to the pod, so
    /// a later deletion request cannot make an observed success unknown. Proof only while that
    /// pod still holds the ordinal's name.
    pub const SUCCEEDED_POD_UID: &str = "statefulsets.kubernetes.io/drain-succeeded-pod-uid";
    /// On a claim restored from a retained volume (the claim `kubectl drain-status --volumes`
    /// prints carries it, value `restored`): the claim is held, not drained, while its ordinal
    /// is out of range, until the set brings its pod back (which clears it with the record) or
    /// a person removes it.
    pub const HOLD: &str = "statefulsets.kubernetes.io/drain-hold";
    /// The node the ordinal's removed pod was seen on while that node was not ready: its
    /// containers may still run there and write the volume, so no drain pod starts until the
    /// node is ready again, deleted, or tainted out of service.
    pub const FENCE_NODE: &str = "statefulsets.kubernetes.io/drain-fence-node";
    /// Comma-separated nodes an earlier drain pod of this ordinal was lost on: later drain pods
    /// are kept off them (a template that tolerates every taint would go back there).
    pub const LOST_NODES: &str = "statefulsets.kubernetes.io/drain-lost-nodes";
    /// Every annotation above: what clearing an ordinal's drain record removes.
    pub const ALL: [&str; 13] = [
        ATTEMPTS,
        FIRST_ATTEMPT_AT,
        RETRY_AFTER,
        LAST_FAILURE,
        POD_UID,
        COUNTED_POD_UID,
        TEMPLATE_HASH,
        RETURNED_AT,
        APPROVED,
        SUCCEEDED_POD_UID,
        HOLD,
        FENCE_NODE,
        LOST_NODES,
    ];
}

/// Annotations the controller sets on each drain pod it creates.
pub mod pod_annotations {
    /// JSON object `{claim name: claim UID}`: the exact claims this drain pod drains. Only claims
    /// with these UIDs are deleted when it succeeds.
    pub const CLAIMS: &str = "statefulsets.kubernetes.io/drain-claims";
    /// Hash of the drain template the pod was built from (see
    /// [`claim_annotations::TEMPLATE_HASH`](crate::claim_annotations::TEMPLATE_HASH)).
    pub const TEMPLATE_HASH: &str = "statefulsets.kubernetes.io/drain-template-hash";
    /// Written by the program in the drain pod on its own pod: its progress, as JSON
    /// ([`progress::DrainProgress`](crate::progress::DrainProgress)). The controller copies it
    /// into the set's status and measures stalls by it.
    pub const PROGRESS: &str = "statefulsets.kubernetes.io/drain-progress";
    /// JSON `{"approval": "manual"|"automatic", "successProof": "completion-record"|"exit-code"}`:
    /// the set's settings when the drain pod was created. Its drain is judged by them (and by
    /// the set's current ones where those are stricter), so opting out or changing an
    /// annotation mid-drain cannot drop an approval or lower the proof.
    pub const SETTINGS: &str = "statefulsets.kubernetes.io/drain-settings";
}

/// Marks the controller puts on a PersistentVolume it retains after its claim was drained
/// ([`annotations::RETAIN_VOLUME_FOR`]). Label values are the names when they are valid label
/// values; the annotations always hold them.
pub mod retained {
    /// Label `"true"` on every retained volume (`kubectl get pv -l
    /// statefulsets.kubernetes.io/drain-retained=true`).
    pub const LABEL: &str = "statefulsets.kubernetes.io/drain-retained";
    /// Label: the namespace of the drained claim.
    pub const NAMESPACE_LABEL: &str = "statefulsets.kubernetes.io/drain-retained-namespace";
    /// Label: the StatefulSet.
    pub const SET_LABEL: &str = "statefulsets.kubernetes.io/drain-retained-set";
    /// Label: the drained claim.
    pub const CLAIM_LABEL: &str = "statefulsets.kubernetes.io/drain-retained-claim";
    /// Label: the drain pod that drained it.
    pub const POD_LABEL: &str = "statefulsets.kubernetes.io/drain-retained-pod";
    /// Annotation: `<namespace>/<claim>` of the drained claim.
    pub const CLAIM: &str = "statefulsets.kubernetes.io/drain-retained-claim";
    /// Annotation: the drained claim's UID (the volume is retained for that claim only).
    pub const CLAIM_UID: &str = "statefulsets.kubernetes.io/drain-retained-claim-uid";
    /// Annotation: `<namespace>/<set>`.
    pub const SET: &str = "statefulsets.kubernetes.io/drain-retained-set";
    /// Annotation: the drain pod's name.
    pub const POD: &str = "statefulsets.kubernetes.io/drain-retained-pod";
    /// Annotation: the reclaim policy the volume had before (`Delete`, `Recycle`); put back
    /// when the retention ends.
    pub const FROM_POLICY: &str = "statefulsets.kubernetes.io/drain-retained-from-policy";
    /// Annotation: RFC 3339 time after which the original policy is put back.
    pub const UNTIL: &str = "statefulsets.kubernetes.io/drain-retained-until";
    /// Every label, for removal when a retention ends without the volume going.
    pub const LABELS: [&str; 5] = [LABEL, NAMESPACE_LABEL, SET_LABEL, CLAIM_LABEL, POD_LABEL];
    /// Every annotation, likewise.
    pub const ANNOTATIONS: [&str; 6] = [CLAIM, CLAIM_UID, SET, POD, FROM_POLICY, UNTIL];
}

pub mod completion;
pub mod progress;
pub mod record;

/// Labels the controller puts on each drain pod it creates.
pub mod labels {
    /// Marks a drain pod; the value is the StatefulSet's name.
    pub const DRAIN_POD: &str = "statefulsets.kubernetes.io/drain-pod";
    /// The ordinal a drain pod drains.
    pub const ORDINAL: &str = "statefulsets.kubernetes.io/drain-ordinal";
    /// Set by the StatefulSet controller on its own pods: the pod's name.
    pub const STATEFUL_POD_NAME: &str = "statefulset.kubernetes.io/pod-name";
}

/// Environment variables the controller gives every container of a drain pod.
pub mod env {
    /// Name of the StatefulSet being scaled down.
    pub const STATEFULSET: &str = "DRAIN_STATEFULSET";
    /// Namespace of the StatefulSet and of the drain pod.
    pub const NAMESPACE: &str = "DRAIN_NAMESPACE";
    /// The ordinal being drained.
    pub const ORDINAL: &str = "DRAIN_ORDINAL";
    /// `spec.replicas` of the set when the drain pod was created.
    pub const REPLICAS: &str = "DRAIN_REPLICAS";
    /// `spec.ordinals.start` of the set (0 unless set).
    pub const ORDINALS_START: &str = "DRAIN_ORDINALS_START";
    /// The drain pod's own name (same as the removed stateful pod's).
    pub const POD_NAME: &str = "DRAIN_POD_NAME";
    /// The set's `apiVersion`: `apps/v1`, or `apps.kruise.io/v1beta1` for an OpenKruise
    /// Advanced StatefulSet.
    pub const STATEFULSET_API_VERSION: &str = "DRAIN_STATEFULSET_API_VERSION";
    /// The exact [completion record](crate::completion) this drain pod writes to its
    /// termination message when, and only when, its drain finished.
    pub const COMPLETION_RECORD: &str = "DRAIN_COMPLETION_RECORD";
}

/// Exit codes of the `drainer` and of hooks run by it.
pub mod exit_codes {
    /// The drain finished: the pod succeeds and the controller deletes the claims.
    pub const SUCCESS: i32 = 0;
    /// A hook asks to be run again after a backoff (a transient problem).
    pub const RETRY: i32 = 75;
    /// The drainer failed for good in this attempt; the pod fails and the controller retries it.
    pub const FAILURE: i32 = 1;
}

/// How a StatefulSet names its pods and claims, and which ordinals it holds: the one naming
/// contract the controller, the drainer and the tests share. Pure functions, no Kubernetes types.
///
/// A StatefulSet `web` names its pod of ordinal 2 `web-2` ([`pod_name`]) and that pod's claim
/// from the claim template `data` `data-web-2` ([`claim_name`]). Ordinals are written in plain
/// decimal ([`parse_ordinal`]), and a set holds the ordinals `[start, start + replicas)`
/// ([`OrdinalRange`]).
pub mod names {
    use std::collections::BTreeSet;

    /// The name of the pod with `ordinal` of the StatefulSet `set`: `<set>-<ordinal>`.
    pub fn pod_name(set: &str, ordinal: i32) -> String {
        format!("{set}-{ordinal}")
    }

    /// The name of the claim from `claim_template` of the pod with `ordinal` of the StatefulSet
    /// `set`: `<template>-<set>-<ordinal>`.
    pub fn claim_name(claim_template: &str, set: &str, ordinal: i32) -> String {
        format!("{claim_template}-{set}-{ordinal}")
    }

    /// Parses an ordinal as the StatefulSet controller writes it: plain decimal, digits only, no
    /// sign, no leading zero (except `0` itself), within `i32`.
    pub fn parse_ordinal(s: &str) -> Option<i32> {
        let canonical = !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'));
        if canonical { s.parse().ok() } else { None }
    }

    /// The ordinal of a pod of the StatefulSet `set`, if `name` is `<set>-<ordinal>`.
    pub fn parse_pod_name(name: &str, set: &str) -> Option<i32> {
        parse_ordinal(name.strip_prefix(set)?.strip_prefix('-')?)
    }

    /// The claim template and ordinal of a claim of the StatefulSet `set`, if `name` is
    /// `<template>-<set>-<ordinal>` for one of the set's claim `templates`.
    pub fn parse_claim_name<'t>(
        name: &str,
        set: &str,
        templates: &'t [String],
    ) -> Option<(&'t str, i32)> {
        let (rest, ordinal) = name.rsplit_once('-')?;
        let ordinal = parse_ordinal(ordinal)?;
        let template = rest.strip_suffix(set)?.strip_suffix('-')?;
        templates
            .iter()
            .find(|t| *t == template)
            .map(|t| (t.as_str(), ordinal))
    }

    /// Every StatefulSet name a claim called `name` could belong to, whatever the set's claim
    /// templates: in `<template>-<set>-<ordinal>`, each non-empty suffix after a dash of
    /// `<template>-<set>`. Empty unless `name` ends in `-<ordinal>`.
    pub fn claim_set_candidates(name: &str) -> Vec<&str> {
        let Some((rest, ordinal)) = name.rsplit_once('-') else {
            return Vec::new();
        };
        if parse_ordinal(ordinal).is_none() {
            return Vec::new();
        }
        rest.match_indices('-')
            .map(|(i, _)| &rest[i + 1..])
            .filter(|s| !s.is_empty())
            .collect()
    }

    /// The ordinals a set runs pods for: counting up from `start` (`spec.ordinals.start`), the
    /// first `replicas` (`spec.replicas`) that are not `reserved`.
    ///
    /// For a built-in StatefulSet nothing is reserved, so this is `[start, start + replicas)`.
    /// An OpenKruise Advanced StatefulSet skips its `spec.reserveOrdinals`: with `replicas: 2`
    /// and ordinal 1 reserved it runs 0 and 2 ([`reserved_ordinals`] reads the field).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct OrdinalRange {
        /// The first ordinal (`spec.ordinals.start`).
        pub start: i32,
        /// How many ordinals (`spec.replicas`), never negative.
        pub replicas: i32,
        /// Ordinals skipped (an Advanced StatefulSet's `spec.reserveOrdinals`).
        pub reserved: BTreeSet<i32>,
    }

    impl OrdinalRange {
        /// The range of a set with these `spec.ordinals.start` and `spec.replicas`, defaulted as
        /// Kubernetes does (start 0, replicas 1); negative replicas count as 0.
        pub fn new(start: Option<i32>, replicas: Option<i32>) -> Self {
            Self {
                start: start.unwrap_or(0),
                replicas: replicas.unwrap_or(1).max(0),
                reserved: BTreeSet::new(),
            }
        }

        /// The same range skipping `reserved` ordinals.
        #[must_use]
        pub fn with_reserved(mut self, reserved: BTreeSet<i32>) -> Self {
            self.reserved = reserved;
            self
        }

        /// One past the last ordinal held (`start + replicas`, plus one for each reserved ordinal
        /// skipped on the way; saturating at `i32::MAX`).
        pub fn end(&self) -> i32 {
            let mut end = self.start.saturating_add(self.replicas);
            for &r in self.reserved.range(self.start..) {
                if r < end {
                    end = end.saturating_add(1);
                } else {
                    break;
                }
            }
            end
        }

        /// Whether the set holds `ordinal`.
        pub fn contains(&self, ordinal: i32) -> bool {
            self.start <= ordinal && ordinal < self.end() && !self.reserved.contains(&ordinal)
        }

        /// The ordinals held, lowest first.
        pub fn iter(&self) -> impl Iterator<Item = i32> + use<> {
            let reserved = self.reserved.clone();
            (self.start..self.end()).filter(move |o| !reserved.contains(o))
        }
    }

    /// An entry of an Advanced StatefulSet's `spec.reserveOrdinals` that cannot be read.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct BadReservedOrdinal(pub String);

    impl std::fmt::Display for BadReservedOrdinal {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "reserveOrdinals entry {} is neither an ordinal nor a range \"a-b\" (Kruise then reserves no ordinal at all)",
                self.0
            )
        }
    }

    impl std::error::Error for BadReservedOrdinal {}

    /// The ordinals an OpenKruise Advanced StatefulSet's `spec.reserveOrdinals` names, read as
    /// Kruise v1.8.0 reads them (`GetReserveOrdinalIntSet` and `ParseRange` in
    /// `pkg/util/api/asts.go`): an integer is an ordinal; a string is an inclusive range `"a-b"`
    /// (exactly one dash, each side a decimal integer with an optional `+`, `a <= b`).
    ///
    /// Kruise drops the whole list, reserving nothing, when one string is not such a range (its
    /// admission webhook refuses them); here that is an error, so the controller acts on nothing
    /// rather than guess. A range wider than 100,000 ordinals is an error too, not expanded.
    pub fn reserved_ordinals(
        entries: &[serde_json::Value],
    ) -> Result<BTreeSet<i32>, BadReservedOrdinal> {
        // Go's strconv.Atoi: an optional sign, then decimal digits, nothing else.
        fn atoi(t: &str) -> Option<i32> {
            let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
            (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| t.parse().ok())
                .flatten()
        }
        let mut out = BTreeSet::new();
        for e in entries {
            let bad = || BadReservedOrdinal(e.to_string());
            match e {
                serde_json::Value::Number(n) => {
                    out.insert(
                        n.as_i64()
                            .and_then(|n| i32::try_from(n).ok())
                            .ok_or_else(bad)?,
                    );
                }
                serde_json::Value::String(s) => {
                    let mut parts = s.split('-');
                    let (Some(a), Some(b), None) = (parts.next(), parts.next(), parts.next())
                    else {
                        return Err(bad());
                    };
                    let (a, b) = (atoi(a).ok_or_else(bad)?, atoi(b).ok_or_else(bad)?);
                    if a > b || i64::from(b) - i64::from(a) > 100_000 {
                        return Err(bad());
                    }
                    out.extend(a..=b);
                }
                _ => return Err(bad()),
            }
        }
        Ok(out)
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use proptest::prelude::*;
        use rstest::rstest;

        fn templates(names: &[&str]) -> Vec<String> {
            names.iter().map(|s| (*s).to_owned()).collect()
        }

        #[test]
        fn formats_pod_and_claim_names() {
            assert_eq!(pod_name("web", 2), "web-2");
            assert_eq!(pod_name("my-web", 0), "my-web-0");
            assert_eq!(claim_name("data", "web", 2), "data-web-2");
            assert_eq!(claim_name("my-data", "my-web", 10), "my-data-my-web-10");
        }

        #[rstest]
        #[case("0", Some(0))]
        #[case("7", Some(7))]
        #[case("10", Some(10))]
        #[case("2147483647", Some(i32::MAX))]
        #[case("2147483648", None)]
        #[case("", None)]
        #[case("00", None)]
        #[case("02", None)]
        #[case("+2", None)]
        #[case("-2", None)]
        #[case(" 2", None)]
        #[case("2x", None)]
        #[case("٣", None)]
        fn ordinals(#[case] text: &str, #[case] want: Option<i32>) {
            assert_eq!(parse_ordinal(text), want);
        }

        #[rstest]
        #[case("data-web-2", "web", &["data"], Some(("data", 2)))]
        #[case("data-web-0", "web", &["data"], Some(("data", 0)))]
        #[case("data-web-10", "web", &["data"], Some(("data", 10)))]
        #[case("my-data-web-3", "web", &["data", "my-data"], Some(("my-data", 3)))]
        #[case("data-my-web-1", "my-web", &["data"], Some(("data", 1)))]
        #[case("data-my-web-1", "web", &["data"], None)]
        #[case("data-web-02", "web", &["data"], None)]
        #[case("data-web-+2", "web", &["data"], None)]
        #[case("data-web--2", "web", &["data"], None)]
        #[case("data-web-2x", "web", &["data"], None)]
        #[case("data-web-", "web", &["data"], None)]
        #[case("logs-web-2", "web", &["data"], None)]
        #[case("data-web2-2", "web", &["data"], None)]
        #[case("data-web-99999999999", "web", &["data"], None)]
        #[case("data-web-2", "web", &[], None)]
        fn claim_names(
            #[case] name: &str,
            #[case] set: &str,
            #[case] tmpl: &[&str],
            #[case] want: Option<(&str, i32)>,
        ) {
            let t = templates(tmpl);
            assert_eq!(parse_claim_name(name, set, &t), want);
        }

        #[rstest]
        #[case("web-2", "web", Some(2))]
        #[case("web-0", "web", Some(0))]
        #[case("web-12", "web", Some(12))]
        #[case("web-02", "web", None)]
        #[case("web-012", "web", None)]
        #[case("web-+1", "web", None)]
        #[case("web--1", "web", None)]
        #[case("web-", "web", None)]
        #[case("web2", "web", None)]
        #[case("web0", "web", None)]
        #[case("my-web-1", "web", None)]
        #[case("web-a-0", "web", None)]
        #[case("web-a-0", "web-a", Some(0))]
        #[case("web-x", "web", None)]
        fn pod_names(#[case] name: &str, #[case] set: &str, #[case] want: Option<i32>) {
            assert_eq!(parse_pod_name(name, set), want);
        }

        #[test]
        fn claim_candidates_cover_every_split() {
            assert_eq!(claim_set_candidates("a-b-c-3"), vec!["b-c", "c"]);
            assert!(claim_set_candidates("a-b-c").is_empty());
            assert!(claim_set_candidates("a-b-03").is_empty());
            assert!(claim_set_candidates("nodash").is_empty());
        }

        #[rstest]
        #[case(None, None, OrdinalRange { start: 0, replicas: 1, reserved: BTreeSet::new() }, &[0])]
        #[case(Some(3), Some(2), OrdinalRange { start: 3, replicas: 2, reserved: BTreeSet::new() }, &[3, 4])]
        #[case(None, Some(0), OrdinalRange { start: 0, replicas: 0, reserved: BTreeSet::new() }, &[])]
        #[case(Some(5), Some(-4), OrdinalRange { start: 5, replicas: 0, reserved: BTreeSet::new() }, &[])]
        fn ordinal_ranges(
            #[case] start: Option<i32>,
            #[case] replicas: Option<i32>,
            #[case] want: OrdinalRange,
            #[case] ordinals: &[i32],
        ) {
            let range = OrdinalRange::new(start, replicas);
            assert_eq!(range, want);
            assert_eq!(range.iter().collect::<Vec<_>>(), ordinals);
            assert_eq!(range.end(), want.start + want.replicas);
            for o in -1..10 {
                assert_eq!(range.contains(o), ordinals.contains(&o), "ordinal {o}");
            }
        }

        #[test]
        fn ordinal_range_saturates_instead_of_overflowing() {
            let range = OrdinalRange::new(Some(i32::MAX - 1), Some(i32::MAX));
            assert_eq!(range.end(), i32::MAX);
            assert!(range.contains(i32::MAX - 1));
            assert!(!range.contains(i32::MAX - 2));
            assert_eq!(range.iter().collect::<Vec<_>>(), [i32::MAX - 1]);
        }

        #[rstest]
        // Kruise's documented example: replicas 4, ordinal 1 reserved → pods 0, 2, 3, 4.
        #[case(0, 4, &[1], &[0, 2, 3, 4])]
        // Reserving ordinal 1 of 0..2 with replicas 2: 0 and 2 keep running.
        #[case(0, 2, &[1], &[0, 2])]
        #[case(0, 3, &[0, 1], &[2, 3, 4])]
        // Reserved ordinals past the end or below the start change nothing.
        #[case(0, 3, &[7], &[0, 1, 2])]
        #[case(5, 2, &[1, 6], &[5, 7])]
        #[case(0, 0, &[0], &[])]
        fn reserved_ordinals_are_skipped(
            #[case] start: i32,
            #[case] replicas: i32,
            #[case] reserved: &[i32],
            #[case] held: &[i32],
        ) {
            let range = OrdinalRange::new(Some(start), Some(replicas))
                .with_reserved(reserved.iter().copied().collect());
            assert_eq!(range.iter().collect::<Vec<_>>(), held);
            for o in -1..12 {
                assert_eq!(range.contains(o), held.contains(&o), "ordinal {o}");
            }
        }

        #[rstest]
        #[case(serde_json::json!([1, 3]), Ok(vec![1, 3]))]
        #[case(serde_json::json!(["2-2", "4-6", 0]), Ok(vec![0, 2, 4, 5, 6]))]
        #[case(serde_json::json!(["+7-8"]), Ok(vec![7, 8]))]
        #[case(serde_json::json!([]), Ok(vec![]))]
        // Strings Kruise's ParseRange refuses (and with them the whole list).
        #[case(serde_json::json!(["2"]), Err(()))]
        #[case(serde_json::json!([1, " 7 - 8 "]), Err(()))]
        #[case(serde_json::json!(["7 -8"]), Err(()))]
        #[case(serde_json::json!(["1-2-3"]), Err(()))]
        #[case(serde_json::json!(["-3"]), Err(()))]
        #[case(serde_json::json!(["6-4"]), Err(()))]
        #[case(serde_json::json!(["x"]), Err(()))]
        #[case(serde_json::json!(["1-"]), Err(()))]
        #[case(serde_json::json!([1.5]), Err(()))]
        #[case(serde_json::json!([4294967296_i64]), Err(()))]
        #[case(serde_json::json!(["0-2000000000"]), Err(()))]
        #[case(serde_json::json!([null]), Err(()))]
        fn reserve_ordinals_entries(
            #[case] value: serde_json::Value,
            #[case] want: Result<Vec<i32>, ()>,
        ) {
            let entries = value.as_array().unwrap();
            let got = reserved_ordinals(entries)
                .map(|s| s.into_iter().collect::<Vec<_>>())
                .map_err(|_| ());
            assert_eq!(got, want);
        }

        proptest! {
            #[test]
            fn names_round_trip(
                set in "[a-z0-9-]{1,20}",
                template in "[a-z0-9-]{1,20}",
                ordinal in 0..=i32::MAX,
            ) {
                prop_assert_eq!(parse_ordinal(&ordinal.to_string()), Some(ordinal));
                prop_assert_eq!(parse_pod_name(&pod_name(&set, ordinal), &set), Some(ordinal));
                let claim = claim_name(&template, &set, ordinal);
                let templates = [template.clone()];
                prop_assert_eq!(
                    parse_claim_name(&claim, &set, &templates),
                    Some((template.as_str(), ordinal))
                );
                prop_assert!(claim_set_candidates(&claim).contains(&set.as_str()));
            }

            #[test]
            fn negative_ordinals_never_parse(set in "[a-z0-9-]{1,20}", ordinal in i32::MIN..0) {
                prop_assert_eq!(parse_ordinal(&ordinal.to_string()), None);
                prop_assert_eq!(parse_pod_name(&pod_name(&set, ordinal), &set), None);
            }

            #[test]
            fn a_range_holds_exactly_its_ordinals(
                start in proptest::option::of(any::<i32>()),
                replicas in proptest::option::of(-3..50i32),
                ordinal in any::<i32>(),
            ) {
                let range = OrdinalRange::new(start, replicas);
                let held = range.iter().any(|o| o == ordinal);
                prop_assert_eq!(range.contains(ordinal), held);
                prop_assert!(range.iter().count() <= range.replicas as usize);
            }
        }
    }
}
