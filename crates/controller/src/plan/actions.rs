//! What the planner decides: the actions the act step carries out, each ordinal's state for the
//! status report, and the plan that holds both.

use std::collections::BTreeMap;
use std::time::Duration;

use drain_api::progress::DrainProgress;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// A claim, by name and UID (deletes are preconditioned on the UID).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimRef {
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// Why a drain pod is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteWhy {
    /// It succeeded and its claims are deleted.
    Succeeded,
    /// It failed; a new one follows after a backoff.
    Failed,
    /// Its ordinal came back in range (policy `cancel`, or drains stopped).
    Cancelled,
    /// Its ordinal came back under `finish` and the drain ran past the scale-up wait.
    ScaleUpWaitExceeded,
    /// It ran past the set's deadline.
    DeadlineExceeded,
    /// It is stuck (cannot start, or crash-loops).
    Stuck,
    /// Its progress did not change for the set's stall time.
    Stalled,
    /// It had not started and the drain template changed.
    TemplateChanged,
    /// It succeeded, but its ordinal came back in range before the claims' deletion was
    /// approved: the claims are kept for the returning pod.
    ReturnedBeforeApproval,
    /// It had not started and its claims are gone or being deleted: nothing is left to drain,
    /// and it would wait for them for ever, holding the ordinal's name.
    ClaimsGone,
    /// Its node is lost: asked to stop, so that the pod goes as soon as the node is deleted or
    /// declared out of service, whatever taints its template tolerates.
    NodeLost,
    /// It had not started, its volume can only be used on a node lost earlier, which it was
    /// kept off: replaced by one that may go there.
    NodeBound,
}

/// What kind of failed attempt is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The drain pod failed.
    Failed,
    /// The drain pod exited 0 after someone asked it to stop: not a success.
    Interrupted,
    /// The drain pod exited 0 without the proof the set asks for (no completion record, one
    /// naming other claims, or a probe that could have killed it).
    Unproven,
    /// The drain pod could not start or crash-looped.
    Stuck,
    /// The drain pod's progress did not change for the set's stall time.
    Stalled,
    /// The drain ran past the deadline.
    DeadlineExceeded,
    /// The drain pod disappeared before it finished.
    Vanished,
}

/// One step the act side carries out, in order; it decides nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create the drain pod for `ordinal` bound to `claims` (by claim template), then record
    /// its UID on the claims, with the start of a new series when `new_series` is set (after
    /// the create, so nothing delays it; a crash in between is repaired from the pod: see
    /// [`Action::RecordDrainPod`]).
    CreateDrainPod {
        /// Ordinal.
        ordinal: i32,
        /// Live claims by claim template name.
        claims: BTreeMap<String, ClaimRef>,
        /// 1 for the first attempt of the series.
        attempt: u32,
        /// Nodes earlier drain pods of the ordinal were lost on: the pod is kept off them.
        avoid_nodes: Vec<String>,
        /// Set when this starts a new series of attempts: its start time and template hash.
        new_series: Option<(Timestamp, String)>,
    },
    /// Record a running drain pod's UID on the claims.
    RecordDrainPod {
        /// Ordinal.
        ordinal: i32,
        /// Claims to annotate.
        claims: Vec<ClaimRef>,
        /// The drain pod's UID.
        pod_uid: String,
        /// Set when the claims do not record the pod's series yet (its start and template
        /// hash are written after the create, and a crash may come in between): the series,
        /// started at the pod's creation; the counts of an earlier series go.
        series: Option<(Timestamp, String)>,
    },
    /// Count a failed attempt on the claims.
    RecordFailure {
        /// Ordinal.
        ordinal: i32,
        /// Claims to annotate.
        claims: Vec<ClaimRef>,
        /// The failed drain pod's UID (counted once).
        pod_uid: String,
        /// What kind of failure.
        kind: FailureKind,
        /// Failed attempts including this one.
        attempts: u32,
        /// No new drain pod before this.
        retry_after: Timestamp,
        /// Why it failed.
        reason: String,
        /// Whether retrying stops here (attempts or deadline exhausted).
        gave_up: bool,
        /// The pod was not seen in the cache: count it only if the API server confirms that
        /// no pod with `pod_uid` holds the name (the cache may lag behind a fresh create).
        only_if_pod_gone: bool,
        /// As for [`Action::RecordDrainPod`]: the failed pod's series, when the claims do not
        /// record it yet.
        series: Option<(Timestamp, String)>,
    },
    /// Record on the claims the node the removed pod was seen on while it was not ready (no
    /// drain pod starts until that node is ready again, deleted or out of service), or forget
    /// it (`None`).
    RecordFence {
        /// Ordinal.
        ordinal: i32,
        /// Claims to annotate.
        claims: Vec<ClaimRef>,
        /// The node, or `None` to forget it.
        node: Option<String>,
    },
    /// Record on the claims the nodes the ordinal's drain pods were lost on (all of them).
    RecordLostNodes {
        /// Ordinal.
        ordinal: i32,
        /// Claims to annotate.
        claims: Vec<ClaimRef>,
        /// The nodes.
        nodes: Vec<String>,
    },
    /// Record when a scale-up brought the ordinal back under `finish`.
    RecordReturn {
        /// Ordinal.
        ordinal: i32,
        /// Claims to annotate.
        claims: Vec<ClaimRef>,
        /// When.
        at: Timestamp,
    },
    /// Delete the drain pod (UID precondition; resourceVersion too when it is believed
    /// unfinished, so a pod that succeeded in the meantime is not stopped).
    DeleteDrainPod {
        /// Ordinal.
        ordinal: i32,
        /// Pod name.
        name: String,
        /// Pod UID.
        uid: String,
        /// The resourceVersion it must still have.
        resource_version: Option<String>,
        /// Why.
        why: DeleteWhy,
    },
    /// Record on the claims that their drain pod was seen succeeding with no stop requested
    /// (`exit-code` proof), before anything else happens to it.
    RecordSuccess {
        /// Ordinal.
        ordinal: i32,
        /// Claims to annotate.
        claims: Vec<ClaimRef>,
        /// The drain pod's UID.
        pod_uid: String,
    },
    /// Before [`Action::DeleteClaims`] under `drain-retain-volume-for`: set the reclaim policy
    /// of each claim's PersistentVolume to `Retain` and mark it with its claim, set, drain pod
    /// and `until`, so the data outlives the claim. A volume that cannot be marked keeps its
    /// claim (the ordinal's next actions do not run).
    RetainVolumes {
        /// Ordinal.
        ordinal: i32,
        /// The claims about to be deleted.
        claims: Vec<ClaimRef>,
        /// When the retention ends (the original policy is put back).
        until: Timestamp,
    },
    /// Delete claims whose drain succeeded (UID precondition).
    DeleteClaims {
        /// Ordinal.
        ordinal: i32,
        /// Exactly the claims the succeeded drain pod recorded.
        claims: Vec<ClaimRef>,
    },
    /// Remove the drain record from claims whose ordinal is back in range.
    ClearRecord {
        /// Ordinal.
        ordinal: i32,
        /// Claims to clear.
        claims: Vec<ClaimRef>,
    },
    /// Tell the user that a succeeded drain waits for a person to approve deleting `claims`
    /// (no call: an Event).
    AwaitApproval {
        /// Ordinal.
        ordinal: i32,
        /// The drained claims not approved yet.
        claims: Vec<ClaimRef>,
    },
    /// Tell the user about a state the controller will not resolve by itself.
    Warn {
        /// Ordinal.
        ordinal: i32,
        /// Event reason.
        reason: &'static str,
        /// What is wrong and what to do.
        message: String,
    },
}

impl Action {
    /// The ordinal the action is about.
    pub fn ordinal(&self) -> i32 {
        match self {
            Self::CreateDrainPod { ordinal, .. }
            | Self::RecordDrainPod { ordinal, .. }
            | Self::RecordFailure { ordinal, .. }
            | Self::RecordReturn { ordinal, .. }
            | Self::RecordFence { ordinal, .. }
            | Self::RecordLostNodes { ordinal, .. }
            | Self::RecordSuccess { ordinal, .. }
            | Self::DeleteDrainPod { ordinal, .. }
            | Self::RetainVolumes { ordinal, .. }
            | Self::DeleteClaims { ordinal, .. }
            | Self::ClearRecord { ordinal, .. }
            | Self::AwaitApproval { ordinal, .. }
            | Self::Warn { ordinal, .. } => *ordinal,
        }
    }
}

/// Where one ordinal's drain stands, for the status annotation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum OrdinalState {
    /// Not started: its pod still exists, or it waits for a drain slot.
    Waiting {
        /// Why.
        reason: String,
    },
    /// A drain pod is running.
    Draining {
        /// Attempt number (1 for the first).
        attempt: u32,
        /// The progress the drain pod publishes, if it does.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        progress: Option<DrainProgress>,
        /// Something the user should know about this drain (a container that never exits).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// The drain pod cannot start or crash-loops; it is replaced.
    Stuck {
        /// Attempt number.
        attempt: u32,
        /// Why.
        reason: String,
    },
    /// The last attempt failed; another follows.
    Retrying {
        /// Failed attempts.
        attempts: u32,
        /// Next attempt not before.
        #[serde(rename = "retryAfter")]
        retry_after: String,
        /// Why the last attempt failed.
        #[serde(rename = "lastFailure")]
        last_failure: String,
    },
    /// Retrying stopped; the claims are kept.
    Failed {
        /// Failed attempts.
        attempts: u32,
        /// Why the last attempt failed.
        #[serde(rename = "lastFailure")]
        last_failure: String,
        /// Why retrying stopped.
        reason: String,
    },
    /// Something the controller must not touch holds the ordinal's name.
    Blocked {
        /// What, and what to do.
        reason: String,
    },
    /// The drain succeeded; its claims wait for a person's approval to be deleted
    /// (`drain-approval: manual`).
    AwaitingApproval {
        /// When the wait was first reported.
        since: String,
        /// The claims to annotate `drain-approved=true`.
        claims: Vec<String>,
    },
    /// The drain succeeded; claims deleted (or being deleted).
    Done {
        /// When the success was seen.
        at: String,
    },
}

/// The planner's output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Steps to carry out, in order.
    pub actions: Vec<Action>,
    /// State of every ordinal with a drain to report.
    pub status: BTreeMap<i32, OrdinalState>,
    /// Look again after this long (backoff expiry, deadline), even without a watch event.
    pub requeue_after: Option<Duration>,
    /// Ordinals whose drain pod runs but showed nothing for the quiet time (for the metric).
    pub quiet: std::collections::BTreeSet<i32>,
    /// Ordinals whose drain pod is bound to a lost node, with the node (for the metric).
    pub on_lost_nodes: BTreeMap<i32, String>,
}
