//! The drain state machine: a snapshot of one StatefulSet and `now` → the actions that move each
//! removed ordinal's drain forward, and the state of every ordinal for the status report. Pure:
//! no client, no clock; the whole drain lifecycle is here and nowhere else.
//!
//! Per ordinal that has claims or a drain pod, highest first, by what holds the ordinal's name:
//!
//! | holds the name | observed                                       | actions                         |
//! |----------------|------------------------------------------------|---------------------------------|
//! | nothing        | out of range, live claims, slot free           | `CreateDrainPod`                |
//! | nothing        | the current attempt's pod vanished             | `RecordFailure` (backoff)       |
//! | nothing        | back in range, drain record on the claims      | `ClearRecord`                   |
//! | stateful pod   | out of range (terminating or not)              | wait for it to go               |
//! | foreign pod    | labelled as our drain pod, not owned by the set| `Warn` (blocked), never deleted |
//! | unknown pod    | made by neither the set nor us (by hand?)      | `Warn` (blocked), no slot, recheck |
//! | drain pod      | exited 0 with proof it finished (see below)    | `DeleteClaims` → `DeleteDrainPod` |
//! | drain pod      | exited 0, no proof (stopped, no record)        | `RecordFailure` → `DeleteDrainPod`; claims kept |
//! | drain pod      | Failed                                         | `RecordFailure` → `DeleteDrainPod` |
//! | drain pod      | stuck (cannot start, crash-looping)            | `RecordFailure` → `DeleteDrainPod` |
//! | drain pod      | not started, built from an older template      | `DeleteDrainPod` (replaced)     |
//! | drain pod      | running past the deadline                      | `RecordFailure` → `DeleteDrainPod` |
//! | drain pod      | running, UID not recorded on the claims        | `RecordDrainPod`                |
//! | drain pod      | back in range, `cancel` (or drains stopped)    | `DeleteDrainPod` → `ClearRecord`|
//! | drain pod      | back in range, `finish`                        | `RecordReturn`; cancel after the wait |
//!
//! A new series of attempts (its start and template hash) is recorded on the claims together
//! with the first drain pod's UID, after the create, so nothing delays the create. When a crash
//! comes in between, the claims record an earlier series or none while a drain pod of today's
//! template runs: that pod's series (started at its creation) is the record its drain is judged
//! by, and `RecordDrainPod`/`RecordFailure` write it.
//!
//! What proves a drain finished is the set's [`SuccessProof`] ([`finish`]): under the default
//! completion record, a container that exited 0 wrote the record naming exactly the pod's
//! claims (nothing else counts, and no clock is read); under `exit-code`, the pod was seen
//! `Succeeded` with no deletion requested and no `DisruptionTarget` condition, and no container
//! has a liveness or startup probe. That observation is recorded on the claims
//! (`RecordSuccess`) before anything else is done, so a later deletion request cannot make it
//! unknown; what is not known is not proven, and the drain runs again.
//!
//! Invariants (property-tested below): a claim is deleted only when a drain pod of its ordinal
//! recorded that claim's UID and proved it finished by the set's proof; no drain pod is
//! created for an ordinal in range or whose name is taken; never more drains at once than
//! allowed; a drain pod believed unfinished is only deleted with a resourceVersion precondition
//! (the act step's withdrawal of a create the live read did not confirm is not planned here).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::config::{OnScaleUp, SuccessProof};
pub use drain_api::progress::DrainProgress;

/// What an ordinal's claims remember about its drain (annotations on the claims, see
/// [`drain_api::claim_annotations`]): all drain state lives in the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainRecord {
    /// Failed attempts so far in this series.
    pub attempts: u32,
    /// When the series' first attempt started (the deadline counts from it).
    pub first_attempt_at: Option<Timestamp>,
    /// No new drain pod before this time.
    pub retry_after: Option<Timestamp>,
    /// Why the last attempt failed.
    pub last_failure: Option<String>,
    /// UID of the drain pod of the current attempt.
    pub pod_uid: Option<String>,
    /// UID of the drain pod whose failure was last counted.
    pub counted_pod_uid: Option<String>,
    /// Hash of the drain template this series of attempts runs with.
    pub template_hash: Option<String>,
    /// When a scale-up brought the ordinal back while its drain ran under `finish`.
    pub returned_at: Option<Timestamp>,
    /// A person approved deleting this claim (`drain-approved: "true"`); per claim, not merged.
    pub approved: bool,
    /// Under the `exit-code` proof: the drain pod the controller saw succeed with no stop
    /// requested; per claim, not merged (any claim recording the pod's UID is proof).
    pub succeeded_pod_uid: Option<String>,
}

impl DrainRecord {
    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// One of the set's claims, named `<template>-<set>-<ordinal>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The claim's name.
    pub name: String,
    /// The claim's UID.
    pub uid: String,
    /// The claim template it belongs to.
    pub template: String,
    /// The ordinal it belongs to.
    pub ordinal: i32,
    /// Whether it has a deletion timestamp.
    pub terminating: bool,
    /// The drain record kept on it.
    pub record: DrainRecord,
}

/// Phase of a drain pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainPhase {
    /// Not yet running.
    Pending,
    /// Running.
    Running,
    /// Every container exited 0 (a success only with the set's proof: see [`finish`]).
    Succeeded,
    /// Failed (or evicted).
    Failed,
    /// The node lost track of it.
    Unknown,
}

/// Why a drain pod cannot start, as the kubelet or the scheduler says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    /// The waiting reason (`ErrImageNeverPull`, `ImagePullBackOff`, …) or `Unschedulable`.
    pub reason: String,
    /// The message that came with it.
    pub message: String,
    /// Whether it cannot go away by itself (`ErrImageNeverPull`, `InvalidImageName`).
    pub definitive: bool,
}

/// What the planner sees of a drain pod this controller made for the set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainPod {
    /// Its phase.
    pub phase: DrainPhase,
    /// The claims it drains, `{name: UID}`, from its annotation.
    pub claims: BTreeMap<String, String>,
    /// Why it failed, when it did (pod reason/message or container exit).
    pub failure: Option<String>,
    /// Hash of the template it was built from (absent on pods of older controllers).
    pub template_hash: Option<String>,
    /// Its resourceVersion: deletes of a drain pod believed unfinished are preconditioned on it.
    pub resource_version: String,
    /// When it was created.
    pub created_at: Option<Timestamp>,
    /// When someone asked for its deletion: `deletionTimestamp − deletionGracePeriodSeconds`, or
    /// [`Timestamp::MIN`] when that is unknown (a zero grace period: the API server rewrites the
    /// timestamp of a terminal pod's final delete).
    pub delete_requested_at: Option<Timestamp>,
    /// When its last container finished; `None` unless every container reports a finish time.
    /// For metrics only: no decision compares it with the API server's clock.
    pub finished_at: Option<Timestamp>,
    /// The claims `{name: UID}` named by the completion record that a container which exited 0
    /// wrote to its termination message, if one did.
    pub completion: Option<BTreeMap<String, String>>,
    /// Whether it has a `DisruptionTarget` condition (evicted, preempted, its node shutting
    /// down): it was asked to stop.
    pub disrupted: bool,
    /// Whether one of its regular containers has a liveness or startup probe, whose kill of a
    /// program that exits 0 on SIGTERM leaves a `Succeeded` pod with no deletion requested.
    pub kill_probes: bool,
    /// The set's settings when it was created (absent on pods of older controllers).
    pub settings: Option<PodSettings>,
    /// Regular containers still running after another regular container exited 0 (an
    /// injected mesh proxy, a log shipper): they keep the pod from ending.
    pub lingering: Vec<String>,
    /// Whether any of its containers ever ran.
    pub started: bool,
    /// Whether any of its containers is running now.
    pub running: bool,
    /// Most restarts of any of its containers.
    pub restarts: u32,
    /// Why it cannot start, if something says so.
    pub blocker: Option<Blocker>,
    /// When its containers last started (the latest start of any container), if they did.
    pub started_at: Option<Timestamp>,
    /// The progress it publishes on itself, if it does.
    pub progress: Option<DrainProgress>,
}

/// The settings a drain pod was created under ([`drain_api::pod_annotations::SETTINGS`]): its
/// drain is judged by them where they are stricter than the set's current ones, so opting out
/// or relaxing a setting mid-drain cannot drop an approval or lower the proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodSettings {
    /// `drain-approval: manual`.
    pub manual_approval: bool,
    /// `drain-success-proof`.
    pub proof: SuccessProof,
    /// `drain-retain-volume-for`.
    pub retain_volume_for: Option<Duration>,
}

/// What a drain pod proves about its drain, under the set's [`SuccessProof`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// Not finished (pending, running, failed or unknown).
    NotFinished,
    /// It finished: its claims may go. With `record_first`, the observation that proves it
    /// (`exit-code`) is written on the claims before anything else is done.
    Proven {
        /// Whether the observation must be recorded first.
        record_first: bool,
    },
    /// It exited 0 without proof that it finished: a failed attempt, the claims are kept.
    Unproven {
        /// Interrupted (asked to stop) or no proof.
        kind: FailureKind,
        /// Why, for people.
        why: String,
    },
}

fn claim_list(claims: &BTreeMap<String, String>) -> String {
    if claims.is_empty() {
        return "none".to_owned();
    }
    claims
        .iter()
        .map(|(name, uid)| format!("{name} ({uid})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Judges whether `pod`, a drain pod of the ordinal, finished, under `proof`; `recorded` says
/// whether a claim of the ordinal records that it was seen succeeding (`exit-code` only).
/// No clock is read: only what the pod reports and the order the API server gives.
pub fn finish(pod: &PodObs, drain: &DrainPod, proof: SuccessProof, recorded: bool) -> Finish {
    let no_proof = |why: String| Finish::Unproven {
        kind: FailureKind::Unproven,
        why,
    };
    // Something asked it to stop: exit 0 then says nothing about the drain.
    let stopped = if drain.disrupted {
        Some(
            "it was disrupted (DisruptionTarget condition: evicted, preempted or its node \
             shutting down)"
                .to_owned(),
        )
    } else {
        pod.terminating.then(|| match drain.delete_requested_at {
            Some(t) if t > Timestamp::MIN => format!("it was asked to stop at {t}"),
            _ => "it was deleted".to_owned(),
        })
    };
    let interrupted = |why: String| Finish::Unproven {
        kind: FailureKind::Interrupted,
        why,
    };
    match proof {
        // A drain container that wrote the record finished, whatever its pod does next (a
        // sidecar that never exits, such as an injected mesh proxy, keeps the pod running).
        SuccessProof::CompletionRecord => match (&drain.completion, stopped) {
            (Some(named), _) if !named.is_empty() && *named == drain.claims => Finish::Proven {
                record_first: false,
            },
            _ if drain.phase != DrainPhase::Succeeded => Finish::NotFinished,
            (Some(named), _) => no_proof(format!(
                "its completion record names claims {}, not the claims it was bound to ({})",
                claim_list(named),
                claim_list(&drain.claims)
            )),
            (None, Some(stop)) => interrupted(format!(
                "{stop} and exited 0 without writing the completion record"
            )),
            (None, None) => no_proof(
                "it exited 0 without writing the completion record (DRAIN_COMPLETION_RECORD to \
                 its termination message), so nothing shows its drain finished"
                    .to_owned(),
            ),
        },
        SuccessProof::ExitCode => {
            if drain.phase != DrainPhase::Succeeded {
                return Finish::NotFinished;
            }
            if recorded {
                return Finish::Proven {
                    record_first: false,
                };
            }
            if drain.kill_probes {
                return no_proof(
                    "a container has a liveness or startup probe, whose kill can end in exit 0, \
                     and it was not seen succeeding before that could happen"
                        .to_owned(),
                );
            }
            match stopped {
                Some(stop) => interrupted(format!(
                    "{stop} and exited 0, and it was not seen succeeding before: whether it \
                     finished is not known"
                )),
                None => Finish::Proven { record_first: true },
            }
        }
    }
}

/// What kind of pod holds an ordinal's name.
// A snapshot holds a handful of these; boxing the drain pod would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodKind {
    /// The StatefulSet's own pod, or anything else by that name.
    Other,
    /// Labelled as a drain pod of a set of this name but not owned by this set (left by an
    /// earlier set of the same name): never ours to delete.
    Foreign,
    /// Made neither by the set nor by this controller, and not labelled as either (created by
    /// hand?): found by a live read after a drain pod's create failed on its name, and read
    /// again every [`RECHECK_UNKNOWN_POD`] while it holds the name. Never ours to delete.
    Unknown,
    /// A drain pod this controller made for this set.
    Drain(DrainPod),
}

/// How often an ordinal blocked by an [`PodKind::Unknown`] pod is looked at again (that pod is
/// in no watched cache, so its deletion wakes nothing).
pub const RECHECK_UNKNOWN_POD: Duration = Duration::from_secs(15);

/// A pod named `<set>-<ordinal>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodObs {
    /// The ordinal its name carries.
    pub ordinal: i32,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
    /// Whether it has a deletion timestamp.
    pub terminating: bool,
    /// Drain pod or other.
    pub kind: PodKind,
}

/// What the planner sees of one StatefulSet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The set's name.
    pub set_name: String,
    /// `spec.replicas`.
    pub replicas: i32,
    /// `spec.ordinals.start`.
    pub ordinals_start: i32,
    /// Ordinals the set skips (an Advanced StatefulSet's `spec.reserveOrdinals`).
    pub reserved: BTreeSet<i32>,
    /// Ordinals the set may run outside its range (an Advanced StatefulSet's ordinals counted
    /// from 0, in case Kruise ignores `spec.ordinals.start`): held, never drained.
    pub also_held: Option<drain_api::names::OrdinalRange>,
    /// The set's claims (all ordinals).
    pub claims: Vec<Claim>,
    /// Pods holding one of the set's pod names.
    pub pods: Vec<PodObs>,
    /// The ordinal states of the last status report.
    pub previous: BTreeMap<i32, OrdinalState>,
}

/// Whether new drains may start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewDrains {
    /// Yes, from the drain template with this hash.
    Allowed {
        /// Hash of the current drain template.
        template_hash: String,
    },
    /// No: the set opted out or its drain settings are invalid. Drains in flight are still
    /// completed and cleaned up.
    Stopped {
        /// Why, for the status.
        why: String,
    },
}

/// The per-set knobs of the planner (validated annotations and controller flags).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Whether new drains may start.
    pub new_drains: NewDrains,
    /// Most drains at once (`None`: unlimited).
    pub max_concurrent: Option<u32>,
    /// What a scale-up does to a drain in flight.
    pub on_scale_up: OnScaleUp,
    /// Most failed attempts before giving up.
    pub max_attempts: Option<u32>,
    /// Time after the first attempt after which retrying stops.
    pub deadline: Option<Duration>,
    /// A running drain pod whose progress has not changed this long is stalled.
    pub stall_after: Option<Duration>,
    /// First retry delay; doubles per failed attempt.
    pub retry_base: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
    /// A drain pod that has not started (or is blocked) this long after its creation is stuck.
    pub stuck_after: Duration,
    /// A drain pod whose containers restarted this often is stuck.
    pub max_restarts: u32,
    /// Under `finish`, the longest a returning ordinal waits for its drain.
    pub scale_up_wait: Duration,
    /// Whether drained claims are deleted only once approved (`drain-approval: manual`).
    pub manual_approval: bool,
    /// What proves that a drain pod finished (`drain-success-proof`).
    pub proof: SuccessProof,
    /// How long a drained claim's volume is retained after the claim is deleted
    /// (`drain-retain-volume-for`).
    pub retain_volume_for: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            new_drains: NewDrains::Allowed {
                template_hash: String::new(),
            },
            max_concurrent: Some(1),
            on_scale_up: OnScaleUp::Cancel,
            max_attempts: None,
            deadline: None,
            stall_after: None,
            retry_base: Duration::from_secs(5),
            retry_max: Duration::from_secs(300),
            stuck_after: Duration::from_secs(300),
            max_restarts: 3,
            scale_up_wait: Duration::from_secs(300),
            manual_approval: false,
            proof: SuccessProof::CompletionRecord,
            retain_volume_for: None,
        }
    }
}

/// How long a volume is retained when `drain-retain-volume-for` is set but cannot be read (on
/// the set, or in a drain pod's recorded settings): retaining costs storage for a while, not
/// retaining would cost the data the user asked to keep.
pub const RETAIN_FALLBACK: Duration = Duration::from_secs(7 * 86_400);

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
}

/// Delay before attempt `failed + 1` after `failed` failed attempts: `base * 2^(failed-1)`,
/// capped at `max`.
pub fn backoff(failed: u32, base: Duration, max: Duration) -> Duration {
    let exp = failed.saturating_sub(1).min(30);
    base.saturating_mul(1u32 << exp).min(max)
}

fn add(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

fn until(now: Timestamp, t: Timestamp) -> Duration {
    Duration::try_from(t.duration_since(now)).unwrap_or(Duration::ZERO)
}

/// The merged record of an ordinal's live claims (they are written together; the one with the
/// most attempts wins if a crash left them apart).
fn merged_record(claims: &[&Claim]) -> DrainRecord {
    let mut best = claims
        .iter()
        .max_by_key(|c| c.record.attempts)
        .map(|c| c.record.clone())
        .unwrap_or_default();
    for c in claims {
        let r = &c.record;
        best.first_attempt_at = match (best.first_attempt_at, r.first_attempt_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if best.pod_uid.is_none() {
            best.pod_uid.clone_from(&r.pod_uid);
        }
        if best.template_hash.is_none() {
            best.template_hash.clone_from(&r.template_hash);
        }
        if best.returned_at.is_none() {
            best.returned_at = r.returned_at;
        }
    }
    best
}

/// The delete of a drain pod that finished (no resourceVersion precondition: nothing left to
/// interrupt).
fn delete_finished(ord: &Ordinal<'_>, pod: &PodObs, why: DeleteWhy) -> Action {
    Action::DeleteDrainPod {
        ordinal: ord.ordinal,
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        resource_version: None,
        why,
    }
}

/// Deletes a drain pod that has not (provably) finished; with `rv`, only if it has not changed
/// since it was observed (so one that succeeded meanwhile is not cancelled).
fn delete_unfinished(
    ord: &Ordinal<'_>,
    pod: &PodObs,
    drain: &DrainPod,
    why: DeleteWhy,
    rv: bool,
) -> Action {
    Action::DeleteDrainPod {
        ordinal: ord.ordinal,
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        resource_version: rv.then(|| drain.resource_version.clone()),
        why,
    }
}

/// The record an ordinal's drain runs under, and the series to write when the claims do not
/// record the series of its drain pod: the claims' record, unless a drain pod made from
/// today's template exists and the claims record another series or none (a series' start is
/// written after its first create, and a crash may come in between); then the pod's series,
/// started when the pod was created.
fn record_of(
    claims: DrainRecord,
    pod: Option<&PodObs>,
    new_drains: &NewDrains,
    now: Timestamp,
) -> (DrainRecord, Option<(Timestamp, String)>) {
    let (
        Some(PodObs {
            kind: PodKind::Drain(drain),
            ..
        }),
        NewDrains::Allowed { template_hash },
    ) = (pod, new_drains)
    else {
        return (claims, None);
    };
    let Some(hash) = drain.template_hash.as_ref().filter(|h| *h == template_hash) else {
        return (claims, None);
    };
    // A record without a hash (written by an older controller) is taken as the pod's series.
    let recorded = claims.first_attempt_at.is_some()
        && claims.template_hash.as_ref().is_none_or(|h| h == hash);
    if recorded {
        return (claims, None);
    }
    let start = drain.created_at.unwrap_or(now);
    // The counts belong to the earlier series; a return and an approval to the claims.
    let record = DrainRecord {
        first_attempt_at: Some(start),
        template_hash: Some(hash.clone()),
        returned_at: claims.returned_at,
        approved: claims.approved,
        ..DrainRecord::default()
    };
    (record, Some((start, hash.clone())))
}

fn claim_refs(claims: &[&Claim]) -> Vec<ClaimRef> {
    claims
        .iter()
        .map(|c| ClaimRef {
            name: c.name.clone(),
            uid: c.uid.clone(),
        })
        .collect()
}

/// What the planner knows of one ordinal.
struct Ordinal<'a> {
    ordinal: i32,
    in_range: bool,
    /// All its claims, live or terminating.
    claims: Vec<&'a Claim>,
    /// Its claims that are not being deleted.
    live: Vec<&'a Claim>,
    record: DrainRecord,
    /// The series of its drain pod when the claims do not record it (see
    /// [`Action::RecordDrainPod`]); `record` is then that series' start.
    series: Option<(Timestamp, String)>,
    previous: Option<&'a OrdinalState>,
}

impl Ordinal<'_> {
    fn live_refs(&self) -> Vec<ClaimRef> {
        claim_refs(&self.live)
    }

    /// Whether the failure of this drain pod is already counted in the record.
    fn counted(&self, pod: &PodObs) -> bool {
        self.record.counted_pod_uid.as_deref() == Some(pod.uid.as_str())
    }

    /// The time the last report showed it done, if it did.
    fn done_at(&self) -> Option<String> {
        match self.previous {
            Some(OrdinalState::Done { at }) => Some(at.clone()),
            _ => None,
        }
    }
}

struct Planner<'a> {
    settings: &'a Settings,
    now: Timestamp,
    plan: Plan,
    /// Slots taken by drains in flight (a drain pod exists, or a retry is pending).
    busy: u32,
    /// Ordinals ready for a new drain pod, highest first.
    candidates: Vec<(i32, Vec<&'a Claim>, DrainRecord)>,
}

/// Plans one reconcile of a set: see the module documentation for the state machine.
pub fn plan(snap: &Snapshot, settings: &Settings, now: Timestamp) -> Plan {
    let mut p = Planner {
        settings,
        now,
        plan: Plan::default(),
        busy: 0,
        candidates: Vec::new(),
    };
    let range = drain_api::names::OrdinalRange::new(Some(snap.ordinals_start), Some(snap.replicas))
        .with_reserved(snap.reserved.clone());

    let ordinals: BTreeSet<i32> = snap
        .claims
        .iter()
        .map(|c| c.ordinal)
        .chain(
            snap.pods
                .iter()
                .filter(|p| !matches!(p.kind, PodKind::Other))
                .map(|p| p.ordinal),
        )
        .chain(
            snap.previous
                .iter()
                .filter(|(_, s)| matches!(s, OrdinalState::Done { .. }))
                .map(|(o, _)| *o),
        )
        .collect();

    for &o in ordinals.iter().rev() {
        let claims: Vec<&Claim> = snap.claims.iter().filter(|c| c.ordinal == o).collect();
        let live: Vec<&Claim> = claims.iter().copied().filter(|c| !c.terminating).collect();
        let pod = snap.pods.iter().find(|p| p.ordinal == o);
        let (record, series) = record_of(merged_record(&live), pod, &settings.new_drains, now);
        let ord = Ordinal {
            ordinal: o,
            in_range: range.contains(o) || snap.also_held.as_ref().is_some_and(|r| r.contains(o)),
            record,
            series,
            claims,
            live,
            previous: snap.previous.get(&o),
        };
        let state = match pod {
            None => p.no_pod(&ord),
            Some(pod) => match &pod.kind {
                PodKind::Other => p.stateful_pod(&ord, pod),
                PodKind::Foreign => p.foreign_pod(&ord, pod),
                PodKind::Unknown => p.unknown_pod(&ord, pod),
                PodKind::Drain(drain) => {
                    // A drain pod holds a slot until it is gone, whatever its phase.
                    p.busy += 1;
                    p.drain_pod(&ord, pod, drain)
                }
            },
        };
        if let Some(state) = state {
            p.plan.status.insert(o, state);
        }
    }
    p.assign_slots();
    p.plan
}

/// What deleting the pod that blocks `ord` lets happen.
fn unblocks(ord: &Ordinal<'_>) -> &'static str {
    if ord.in_range {
        "let the set start its pod"
    } else {
        "let the drain run"
    }
}

impl<'a> Planner<'a> {
    fn requeue_at(&mut self, t: Timestamp) {
        let d = until(self.now, t).max(Duration::from_millis(100));
        self.plan.requeue_after = Some(self.plan.requeue_after.map_or(d, |r| r.min(d)));
    }

    fn act(&mut self, action: Action) {
        self.plan.actions.push(action);
    }

    fn deadline_of(&self, record: &DrainRecord) -> Option<Timestamp> {
        Some(add(record.first_attempt_at?, self.settings.deadline?))
    }

    /// Whether the record belongs to a series run with another template than today's.
    fn stale_series(&self, record: &DrainRecord) -> bool {
        match (&self.settings.new_drains, &record.template_hash) {
            (NewDrains::Allowed { template_hash }, Some(h)) => h != template_hash,
            _ => false,
        }
    }

    /// Why retrying has stopped for this record, if it has.
    fn gave_up(&self, record: &DrainRecord) -> Option<String> {
        if let Some(max) = self.settings.max_attempts
            && record.attempts >= max
        {
            return Some(format!("{} of {max} attempts failed", record.attempts));
        }
        let deadline = self.deadline_of(record)?;
        let next = record.retry_after.unwrap_or(self.now).max(self.now);
        (next >= deadline).then(|| format!("deadline passed at {deadline}"))
    }

    /// The state of an ordinal whose last failure is already counted.
    fn counted_state(&mut self, record: &DrainRecord, fallback: &str) -> OrdinalState {
        let last_failure = record
            .last_failure
            .clone()
            .unwrap_or_else(|| fallback.to_owned());
        match self.gave_up(record) {
            Some(reason) => OrdinalState::Failed {
                attempts: record.attempts,
                last_failure,
                reason,
            },
            None => {
                let at = record.retry_after.unwrap_or(self.now);
                if at > self.now {
                    self.requeue_at(at);
                }
                OrdinalState::Retrying {
                    attempts: record.attempts,
                    retry_after: at.to_string(),
                    last_failure,
                }
            }
        }
    }

    /// Counts a failure of `pod_uid` and says what state follows.
    fn record_failure(
        &mut self,
        ord: &Ordinal<'_>,
        pod_uid: &str,
        kind: FailureKind,
        reason: String,
    ) -> OrdinalState {
        let record = &ord.record;
        let attempts = record.attempts + 1;
        let retry_after = add(
            self.now,
            backoff(attempts, self.settings.retry_base, self.settings.retry_max),
        );
        let next = DrainRecord {
            attempts,
            retry_after: Some(retry_after),
            first_attempt_at: record.first_attempt_at.or(Some(self.now)),
            ..DrainRecord::default()
        };
        let gave_up = self.gave_up(&next);
        if !ord.live.is_empty() {
            self.act(Action::RecordFailure {
                ordinal: ord.ordinal,
                claims: ord.live_refs(),
                pod_uid: pod_uid.to_owned(),
                kind,
                attempts,
                retry_after,
                reason: reason.clone(),
                gave_up: gave_up.is_some(),
                only_if_pod_gone: kind == FailureKind::Vanished,
                series: ord.series.clone(),
            });
        }
        match gave_up {
            Some(why) => OrdinalState::Failed {
                attempts,
                last_failure: reason,
                reason: why,
            },
            None => {
                self.requeue_at(retry_after);
                OrdinalState::Retrying {
                    attempts,
                    retry_after: retry_after.to_string(),
                    last_failure: reason,
                }
            }
        }
    }

    fn clear_record(&mut self, ord: &Ordinal<'_>) {
        if !ord.live.is_empty() && !ord.record.is_empty() {
            self.act(Action::ClearRecord {
                ordinal: ord.ordinal,
                claims: ord.live_refs(),
            });
        }
    }

    /// Nothing holds the ordinal's name.
    fn no_pod(&mut self, ord: &Ordinal<'a>) -> Option<OrdinalState> {
        if ord.in_range {
            self.clear_record(ord);
            return None;
        }
        if ord.live.is_empty() {
            // Every claim is gone or being deleted: a drain finished here.
            let at = ord.done_at().unwrap_or_else(|| self.now.to_string());
            return (!ord.claims.is_empty() || ord.previous.is_some())
                .then_some(OrdinalState::Done { at });
        }
        let record = &ord.record;
        let stale = self.stale_series(record);
        if !stale
            && let Some(uid) = record
                .pod_uid
                .clone()
                .filter(|u| Some(u) != record.counted_pod_uid.as_ref())
        {
            // The drain pod of the current attempt vanished before it finished.
            let state = self.record_failure(
                ord,
                &uid,
                FailureKind::Vanished,
                "drain pod was deleted before it finished".to_owned(),
            );
            if !matches!(state, OrdinalState::Failed { .. }) {
                self.busy += 1;
            }
            return Some(state);
        }
        if !stale {
            if let Some(why) = self.gave_up(record) {
                return Some(OrdinalState::Failed {
                    attempts: record.attempts,
                    last_failure: record.last_failure.clone().unwrap_or_default(),
                    reason: why,
                });
            }
            if let Some(t) = record.retry_after.filter(|t| *t > self.now) {
                self.busy += 1;
                self.requeue_at(t);
                return Some(OrdinalState::Retrying {
                    attempts: record.attempts,
                    retry_after: t.to_string(),
                    last_failure: record.last_failure.clone().unwrap_or_default(),
                });
            }
        }
        let record = if stale {
            DrainRecord::default()
        } else {
            record.clone()
        };
        self.candidates
            .push((ord.ordinal, ord.live.clone(), record));
        None
    }

    /// The StatefulSet's own pod (or another pod that is not ours) holds the name.
    fn stateful_pod(&mut self, ord: &Ordinal<'_>, pod: &PodObs) -> Option<OrdinalState> {
        if ord.in_range {
            self.clear_record(ord);
            return None;
        }
        Some(OrdinalState::Waiting {
            reason: format!("pod {} still exists", pod.name),
        })
    }

    /// A drain pod of an earlier set of the same name holds the name: report, never touch.
    fn foreign_pod(&mut self, ord: &Ordinal<'_>, pod: &PodObs) -> Option<OrdinalState> {
        if ord.in_range && ord.live.is_empty() {
            return None;
        }
        let reason = format!(
            "pod {} is labelled as a drain pod of this set's name but is not owned by this set \
             (left by an earlier set of the same name?); it is left alone: delete it to {}",
            pod.name,
            unblocks(ord)
        );
        self.blocked(ord, reason)
    }

    /// A pod made neither by the set nor by us holds the name: report, never touch, hold no
    /// slot, and look again soon (its deletion wakes no watch).
    fn unknown_pod(&mut self, ord: &Ordinal<'_>, pod: &PodObs) -> Option<OrdinalState> {
        if ord.in_range && ord.live.is_empty() {
            return None;
        }
        self.requeue_at(add(self.now, RECHECK_UNKNOWN_POD));
        let reason = format!(
            "pod {} holds the name of this ordinal's drain pod but was made neither by the set \
             nor by this controller (created by hand?); it is left alone and the claims are \
             kept: delete it to {}",
            pod.name,
            unblocks(ord)
        );
        self.blocked(ord, reason)
    }

    /// The ordinal is blocked for `reason`: warned once (while the reason stays the same).
    fn blocked(&mut self, ord: &Ordinal<'_>, reason: String) -> Option<OrdinalState> {
        let state = OrdinalState::Blocked { reason };
        if ord.previous != Some(&state) {
            let OrdinalState::Blocked { reason } = &state else {
                unreachable!()
            };
            self.act(Action::Warn {
                ordinal: ord.ordinal,
                reason: "DrainBlocked",
                message: reason.clone(),
            });
        }
        Some(state)
    }

    /// One of our drain pods holds the name: dispatches on what became of it.
    fn drain_pod(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let recorded = ord
            .live
            .iter()
            .any(|c| c.record.succeeded_pod_uid.as_deref() == Some(pod.uid.as_str()));
        // The proof the pod was made under counts too: the completion record if either asks it.
        let proof = match drain.settings {
            Some(PodSettings {
                proof: SuccessProof::CompletionRecord,
                ..
            }) => SuccessProof::CompletionRecord,
            _ => self.settings.proof,
        };
        match finish(pod, drain, proof, recorded) {
            Finish::Proven { record_first } => {
                return self.succeeded(ord, pod, drain, record_first);
            }
            Finish::Unproven { kind, why } => return self.unproven(ord, pod, kind, why),
            Finish::NotFinished => {}
        }
        if pod.terminating {
            return self.terminating(ord, pod);
        }
        if drain.phase == DrainPhase::Failed {
            return self.failed(ord, pod, drain);
        }
        // Pending, Running or Unknown: the drain has not finished.
        if ord.in_range {
            return self.returned(ord, drain, |why, rv| {
                delete_unfinished(ord, pod, drain, why, rv)
            });
        }
        self.unfinished(ord, pod, drain)
    }

    /// The state after a failed attempt by `pod`: counted the first time it is seen (with
    /// `reason`), read back from the record after that (`fallback` if it has no reason).
    fn failed_attempt(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        kind: FailureKind,
        fallback: &str,
        reason: String,
    ) -> OrdinalState {
        if ord.counted(pod) {
            self.counted_state(&ord.record, fallback)
        } else {
            self.record_failure(ord, &pod.uid, kind, reason)
        }
    }

    /// The drain pod exited 0 without proof that its drain finished (asked to stop, no
    /// completion record, ...): a failed attempt, and the pod goes; the claims are kept.
    fn unproven(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        kind: FailureKind,
        why: String,
    ) -> Option<OrdinalState> {
        let delete = (!pod.terminating).then(|| delete_finished(ord, pod, DeleteWhy::Failed));
        if ord.in_range {
            self.plan.actions.extend(delete);
            self.clear_record(ord);
            return None;
        }
        if ord.live.is_empty() {
            // Nothing left to drain (the claims are gone or going): the pod only holds the name.
            self.plan.actions.extend(delete);
            return Some(match ord.done_at() {
                Some(at) => OrdinalState::Done { at },
                None => OrdinalState::Waiting {
                    reason: format!("drain pod {} is terminating", pod.name),
                },
            });
        }
        let state = self.failed_attempt(
            ord,
            pod,
            kind,
            "exited 0 without proof it finished",
            format!("{why}; the claims are kept and the drain runs again"),
        );
        self.plan.actions.extend(delete);
        Some(state)
    }

    /// The drain pod, not finished, is being deleted: wait until it is gone.
    fn terminating(&mut self, ord: &Ordinal<'_>, pod: &PodObs) -> Option<OrdinalState> {
        if ord.in_range {
            return None;
        }
        if ord.counted(pod) {
            return Some(self.counted_state(&ord.record, "drain pod stopped"));
        }
        Some(OrdinalState::Waiting {
            reason: format!("drain pod {} is terminating", pod.name),
        })
    }

    /// The drain pod failed: a failed attempt (none if the ordinal is back), and the pod goes.
    fn failed(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let delete = delete_unfinished(ord, pod, drain, DeleteWhy::Failed, false);
        if ord.in_range {
            self.act(delete);
            self.clear_record(ord);
            return None;
        }
        let reason = drain
            .failure
            .clone()
            .unwrap_or_else(|| "drain pod failed".to_owned());
        let state = self.failed_attempt(ord, pod, FailureKind::Failed, &reason, reason.clone());
        self.act(delete);
        Some(state)
    }

    /// A drain pod that has not finished, of an ordinal still out of range: stuck, stalled,
    /// made from an older template, past the deadline, or draining.
    fn unfinished(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        if let Some(state) = self.stuck_attempt(ord, pod, drain) {
            return Some(state);
        }
        if let Some(state) = self.stalled_attempt(ord, pod, drain) {
            return Some(state);
        }
        if let Some(state) = self.template_changed(ord, pod, drain) {
            return Some(state);
        }
        if let Some(state) = self.deadline_exceeded(ord, pod, drain) {
            return Some(state);
        }
        if !ord.live.is_empty() && ord.record.pod_uid.as_deref() != Some(pod.uid.as_str()) {
            self.act(Action::RecordDrainPod {
                ordinal: ord.ordinal,
                claims: ord.live_refs(),
                pod_uid: pod.uid.clone(),
                series: ord.series.clone(),
            });
        }
        let note = self.lingering(ord, pod, drain);
        Some(OrdinalState::Draining {
            attempt: ord.record.attempts + 1,
            progress: drain.progress.clone(),
            note,
        })
    }

    /// A drain pod kept running, without proof, by containers that do not exit after another
    /// exited 0 (a mesh proxy): said in the status, and once in a Warning, instead of holding
    /// the slot silently until the deadline.
    fn lingering(&mut self, ord: &Ordinal<'_>, pod: &PodObs, drain: &DrainPod) -> Option<String> {
        if drain.lingering.is_empty() {
            return None;
        }
        let note = format!(
            "containers {} still run after another exited 0 without proof it finished, so drain \
             pod {} does not end (an injected proxy or log shipper?): have the drain write its \
             completion record, or keep such sidecars out of drain pods (docs/annotations.md: Sidecars)",
            drain.lingering.join(", "),
            pod.name
        );
        let told = matches!(ord.previous, Some(OrdinalState::Draining { note: Some(n), .. }) if *n == note);
        if !told {
            self.act(Action::Warn {
                ordinal: ord.ordinal,
                reason: "DrainPodNotEnding",
                message: note.clone(),
            });
        }
        Some(note)
    }

    /// A stuck drain pod is a failed attempt: counted, and the pod goes.
    fn stuck_attempt(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let reason = self.stuck(drain)?;
        let state = self.failed_attempt(
            ord,
            pod,
            FailureKind::Stuck,
            &reason,
            format!("stuck: {reason}"),
        );
        self.act(delete_unfinished(ord, pod, drain, DeleteWhy::Stuck, true));
        if let OrdinalState::Retrying { .. } = state {
            return Some(OrdinalState::Stuck {
                attempt: ord.record.attempts + 1,
                reason,
            });
        }
        Some(state)
    }

    /// A stalled drain pod is a failed attempt: counted, and the pod goes.
    fn stalled_attempt(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let reason = self.stalled(drain)?;
        let state = self.failed_attempt(
            ord,
            pod,
            FailureKind::Stalled,
            &reason,
            format!("stalled: {reason}"),
        );
        self.act(delete_unfinished(ord, pod, drain, DeleteWhy::Stalled, true));
        Some(state)
    }

    /// A drain pod made from another template than today's is replaced (not a failed attempt)
    /// when nothing of it runs: it has not started, or it failed and waits for the kubelet to
    /// restart it in place (`restartPolicy: OnFailure`), which would run the old template
    /// again. A running one finishes.
    fn template_changed(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let NewDrains::Allowed { template_hash } = &self.settings.new_drains else {
            return None;
        };
        let idle = !drain.started || (drain.restarts > 0 && !drain.running);
        let changed = idle
            && drain
                .template_hash
                .as_ref()
                .is_some_and(|h| h != template_hash);
        if !changed {
            return None;
        }
        self.act(delete_unfinished(
            ord,
            pod,
            drain,
            DeleteWhy::TemplateChanged,
            true,
        ));
        Some(OrdinalState::Waiting {
            reason: format!("drain template changed: replacing drain pod {}", pod.name),
        })
    }

    /// A drain pod still running at the series' deadline is a failed attempt: counted, and the
    /// pod goes. Before the deadline, requeues at it.
    fn deadline_exceeded(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let deadline = self.deadline_of(&ord.record)?;
        if deadline > self.now {
            self.requeue_at(deadline);
            return None;
        }
        let state = self.failed_attempt(
            ord,
            pod,
            FailureKind::DeadlineExceeded,
            "deadline exceeded",
            "deadline exceeded".to_owned(),
        );
        self.act(delete_unfinished(
            ord,
            pod,
            drain,
            DeleteWhy::DeadlineExceeded,
            true,
        ));
        Some(state)
    }

    /// The drain pod proved that it finished: its claims go, then the pod. With
    /// `record_first`, the observation that proves it is recorded on the claims first.
    fn succeeded(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
        record_first: bool,
    ) -> Option<OrdinalState> {
        if record_first && !ord.live.is_empty() {
            self.act(Action::RecordSuccess {
                ordinal: ord.ordinal,
                claims: ord.live_refs(),
                pod_uid: pod.uid.clone(),
            });
        }
        // Only exactly the claims this pod drained; a claim recreated since is not touched.
        let drained: Vec<&Claim> = ord
            .live
            .iter()
            .copied()
            .filter(|c| drain.claims.get(&c.name) == Some(&c.uid))
            .collect();
        let manual =
            self.settings.manual_approval || drain.settings.is_some_and(|s| s.manual_approval);
        if manual {
            let unapproved: Vec<&Claim> = drained
                .iter()
                .copied()
                .filter(|c| !c.record.approved)
                .collect();
            if !unapproved.is_empty() {
                return self.awaiting_approval(ord, pod, &unapproved);
            }
        }
        let done = claim_refs(&drained);
        // The longer of the set's retention and the one the drain started under.
        let retain = self
            .settings
            .retain_volume_for
            .max(drain.settings.and_then(|s| s.retain_volume_for));
        if let Some(retain) = retain.filter(|_| !done.is_empty()) {
            self.act(Action::RetainVolumes {
                ordinal: ord.ordinal,
                claims: done.clone(),
                // Whole seconds: people read it, and repeat it in commands.
                until: self
                    .now
                    .checked_add(retain)
                    .and_then(|t| t.round(jiff::Unit::Second))
                    .unwrap_or(Timestamp::MAX),
            });
        }
        if !done.is_empty() {
            self.act(Action::DeleteClaims {
                ordinal: ord.ordinal,
                claims: done,
            });
        }
        if !pod.terminating {
            self.act(delete_finished(ord, pod, DeleteWhy::Succeeded));
        }
        (!ord.in_range).then(|| OrdinalState::Done {
            at: ord.done_at().unwrap_or_else(|| self.now.to_string()),
        })
    }

    /// A succeeded drain whose claims a person must approve before they are deleted: nothing is
    /// deleted; the drain pod keeps the name, but not a drain slot (its work is done). If the
    /// ordinal came back in range meanwhile, the drain pod goes and the claims stay for the
    /// returning pod.
    fn awaiting_approval(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        unapproved: &[&Claim],
    ) -> Option<OrdinalState> {
        if ord.in_range {
            if !pod.terminating {
                self.act(delete_finished(ord, pod, DeleteWhy::ReturnedBeforeApproval));
            }
            self.clear_record(ord);
            return None;
        }
        self.busy = self.busy.saturating_sub(1);
        let since = match ord.previous {
            Some(OrdinalState::AwaitingApproval { since, .. }) => since.clone(),
            _ => {
                self.act(Action::AwaitApproval {
                    ordinal: ord.ordinal,
                    claims: claim_refs(unapproved),
                });
                self.now.to_string()
            }
        };
        Some(OrdinalState::AwaitingApproval {
            since,
            claims: unapproved.iter().map(|c| c.name.clone()).collect(),
        })
    }

    /// A scale-up brought back an ordinal whose drain has not finished.
    fn returned(
        &mut self,
        ord: &Ordinal<'_>,
        drain: &DrainPod,
        delete: impl Fn(DeleteWhy, bool) -> Action,
    ) -> Option<OrdinalState> {
        let finish = self.settings.on_scale_up == OnScaleUp::Finish
            && matches!(self.settings.new_drains, NewDrains::Allowed { .. })
            && !ord.live.is_empty()
            && drain.started;
        if !finish {
            self.act(delete(DeleteWhy::Cancelled, true));
            self.clear_record(ord);
            return None;
        }
        let returned_at = match ord.record.returned_at {
            None => {
                self.act(Action::RecordReturn {
                    ordinal: ord.ordinal,
                    claims: ord.live_refs(),
                    at: self.now,
                });
                self.now
            }
            Some(at) => at,
        };
        // The returning pod waits as long as the drain makes progress, and at most
        // `scale_up_wait` without any (measured from the return or the last progress).
        let progressed = drain
            .progress
            .as_ref()
            .and_then(|p| p.changed_at.parse::<Timestamp>().ok());
        let wait_until = add(
            progressed.map_or(returned_at, |p| p.max(returned_at)),
            self.settings.scale_up_wait,
        );
        if wait_until <= self.now {
            self.act(delete(DeleteWhy::ScaleUpWaitExceeded, true));
            self.clear_record(ord);
            return None;
        }
        self.requeue_at(wait_until);
        Some(OrdinalState::Draining {
            attempt: ord.record.attempts + 1,
            progress: drain.progress.clone(),
            note: None,
        })
    }

    /// Why a drain pod that has not finished is stuck, if it is; requeues at the time it would
    /// become stuck otherwise.
    fn stuck(&mut self, drain: &DrainPod) -> Option<String> {
        if drain.restarts >= self.settings.max_restarts {
            let why = drain.failure.as_deref().unwrap_or("crash loop");
            return Some(format!(
                "containers restarted {} times ({why})",
                drain.restarts
            ));
        }
        let blocker = drain.blocker.as_ref().map(|b| {
            format!("{}: {}", b.reason, b.message)
                .trim_end_matches([':', ' '])
                .to_owned()
        });
        if drain.blocker.as_ref().is_some_and(|b| b.definitive) {
            return blocker;
        }
        if drain.started && blocker.is_none() {
            return None;
        }
        let since = drain.created_at.unwrap_or(self.now);
        let stuck_at = add(since, self.settings.stuck_after);
        if stuck_at <= self.now {
            let after = humantime::format_duration(self.settings.stuck_after);
            return Some(blocker.unwrap_or_else(|| format!("not started after {after}")));
        }
        self.requeue_at(stuck_at);
        None
    }

    /// Why a running drain pod is stalled, if the set asks for stall detection and it is:
    /// its published progress (or, before any, its start) is older than the stall time.
    /// Requeues at the time it would stall otherwise. The progress time is the drain pod's
    /// clock; the stall time should be well above any clock skew between nodes.
    fn stalled(&mut self, drain: &DrainPod) -> Option<String> {
        let stall = self.settings.stall_after?;
        if !drain.started {
            return None;
        }
        let changed = drain
            .progress
            .as_ref()
            .and_then(|p| p.changed_at.parse::<Timestamp>().ok());
        let since = [changed, drain.started_at, drain.created_at]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(self.now);
        let stalls_at = add(since, stall);
        if stalls_at <= self.now {
            let what = if changed.is_some() {
                "progress"
            } else {
                "published progress"
            };
            return Some(format!(
                "no {what} for {} (since {since})",
                humantime::format_duration(stall)
            ));
        }
        self.requeue_at(stalls_at);
        None
    }

    /// Starts new drains in the free slots, highest ordinal first.
    fn assign_slots(&mut self) {
        let limit = self.settings.max_concurrent.unwrap_or(u32::MAX);
        let candidates = std::mem::take(&mut self.candidates);
        for (o, live, record) in candidates {
            let template_hash = match &self.settings.new_drains {
                NewDrains::Allowed { template_hash } => template_hash.clone(),
                NewDrains::Stopped { why } => {
                    let reason = format!("no new drain: {why}");
                    self.plan.status.insert(o, OrdinalState::Waiting { reason });
                    continue;
                }
            };
            if self.busy >= limit {
                let reason = format!("waiting for a drain slot ({limit} at a time)");
                self.plan.status.insert(o, OrdinalState::Waiting { reason });
                continue;
            }
            self.busy += 1;
            let attempt = record.attempts + 1;
            let new_series = record
                .first_attempt_at
                .is_none()
                .then_some((self.now, template_hash));
            self.act(Action::CreateDrainPod {
                ordinal: o,
                claims: live
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
                new_series,
            });
            self.plan.status.insert(
                o,
                OrdinalState::Draining {
                    attempt,
                    progress: None,
                    note: None,
                },
            );
            if let Some(deadline) = self.deadline_of(&DrainRecord {
                first_attempt_at: Some(record.first_attempt_at.unwrap_or(self.now)),
                ..record
            }) {
                self.requeue_at(deadline);
            }
            self.requeue_at(add(self.now, self.settings.stuck_after));
        }
    }
}

#[cfg(test)]
mod tests;
