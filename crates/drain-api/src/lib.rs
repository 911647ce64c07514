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
    /// `finish` (default: the drain completes and the returning pod gets a fresh claim) or
    /// `cancel` (the drain pod is deleted and the returning pod gets its claims back).
    pub const ON_SCALE_UP: &str = "statefulsets.kubernetes.io/drain-on-scale-up";
    /// `false` stops the drain pod from inheriting placement and identity (tolerations, node
    /// selector, affinity, image pull secrets, service account, security context) from the
    /// StatefulSet's pod template. Default `true`.
    pub const INHERIT_POD_SPEC: &str = "statefulsets.kubernetes.io/drain-inherit-pod-spec";
    /// Most failed attempts per ordinal before retrying stops (positive integer; default unlimited).
    pub const MAX_ATTEMPTS: &str = "statefulsets.kubernetes.io/drain-max-attempts";
    /// Seconds after the first attempt of an ordinal after which retrying stops (default unlimited).
    pub const DEADLINE_SECONDS: &str = "statefulsets.kubernetes.io/drain-deadline-seconds";
    /// Written by the controller on the StatefulSet: a JSON summary of every ordinal it tracks
    /// (waiting, draining, retrying, failed, done), for `kubectl get -o yaml` readers.
    pub const STATUS: &str = "statefulsets.kubernetes.io/drain-status";
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
    /// Every annotation above: what clearing an ordinal's drain record removes.
    pub const ALL: [&str; 6] = [
        ATTEMPTS,
        FIRST_ATTEMPT_AT,
        RETRY_AFTER,
        LAST_FAILURE,
        POD_UID,
        COUNTED_POD_UID,
    ];
}

/// Annotations the controller sets on each drain pod it creates.
pub mod pod_annotations {
    /// JSON object `{claim name: claim UID}`: the exact claims this drain pod drains. Only claims
    /// with these UIDs are deleted when it succeeds.
    pub const CLAIMS: &str = "statefulsets.kubernetes.io/drain-claims";
}

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
