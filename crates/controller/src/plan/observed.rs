//! What the planner sees of one set: its claims with their drain records, the pods holding its
//! ordinals' names (drain pods with what they show), and the snapshot that gathers them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use drain_api::progress::DrainProgress;
use jiff::Timestamp;

use super::actions::OrdinalState;

use crate::config::SuccessProof;

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
    /// Whether the claim is held ([`drain_api::claim_annotations::HOLD`]): restored from a
    /// retained volume, not to be drained.
    pub held: bool,
    /// The node the removed pod was seen on while it was not ready
    /// ([`drain_api::claim_annotations::FENCE_NODE`]).
    pub fence_node: Option<String>,
    /// Nodes an earlier drain pod of the ordinal was lost on, sorted
    /// ([`drain_api::claim_annotations::LOST_NODES`]): new drain pods are kept off them.
    pub lost_nodes: Vec<String>,
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
    /// The latest time a container of it started or finished (its state's, or its last state's).
    pub changed_at: Option<Timestamp>,
    /// When its last container finished; `None` unless every container reports a finish time.
    /// For metrics only: no decision compares it with the API server's clock.
    pub finished_at: Option<Timestamp>,
    /// Its regular containers (not init containers, not native sidecars), as the completion
    /// record's proof sees them.
    pub containers: Vec<DrainContainer>,
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
    /// The node it is bound to, once scheduled.
    pub node: Option<String>,
    /// Whether its `Ready` condition is true (the node lifecycle controller makes it false on
    /// every pod of a node that stops answering).
    pub ready: bool,
}

impl DrainPod {
    /// When its published progress last changed (the drain pod's clock), if it published any.
    pub fn published_progress_at(&self) -> Option<Timestamp> {
        self.progress
            .as_ref()
            .and_then(|p| p.changed_at.parse::<Timestamp>().ok())
    }

    /// The latest of its published progress, its start and its creation.
    pub fn last_progress(&self) -> Option<Timestamp> {
        [
            self.published_progress_at(),
            self.started_at,
            self.created_at,
        ]
        .into_iter()
        .flatten()
        .max()
    }
}

/// One regular container of a drain pod: the claims it uses and the record it wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainContainer {
    /// Its name.
    pub name: String,
    /// The pod's claims `{name: UID}` it mounts or attaches.
    pub claims: BTreeMap<String, String>,
    /// The claims named by the completion record it wrote to its termination message, when it
    /// exited 0 with one (its current run's, not an earlier one's).
    pub record: Option<BTreeMap<String, String>>,
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
    /// What holds it while it is being deleted, if it is.
    pub deletion: Option<Deletion>,
    /// Drain pod or other.
    pub kind: PodKind,
}

/// A pod being deleted: when it should be gone, and what may keep it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deletion {
    /// Its deletion timestamp: the end of its grace period (the API server's clock).
    pub due: Option<Timestamp>,
    /// Its finalizers.
    pub finalizers: Vec<String>,
    /// The node it runs on, when known.
    pub node: Option<String>,
}

/// What the controller learned of a node: the node of a drain pod that is not ready or is being
/// deleted, of a removed stateful pod still being deleted past its grace period, or the fence
/// node an ordinal's claims record (read live; see [`Snapshot::nodes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeHealth {
    /// Its `Ready` condition is true (or it has none yet).
    Ready {
        /// When the condition last changed.
        since: Option<Timestamp>,
    },
    /// Its `Ready` condition is not true: the kubelet stopped posting status (`Unknown`) or
    /// reports the node not ready (`False`).
    NotReady {
        /// When the condition last changed.
        since: Option<Timestamp>,
        /// The condition's status, reason and message, in a few words.
        why: String,
        /// Whether it is tainted `node.kubernetes.io/out-of-service` (a person declared it
        /// shut down: the cluster removes its pods).
        out_of_service: bool,
    },
    /// No Node object has its name (deleted: the cluster removes its pods).
    Gone,
    /// It could not be read.
    Unreadable {
        /// The error.
        error: String,
    },
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
    /// The set's claim templates (`spec.volumeClaimTemplates` names): a drain pod starts only
    /// while the ordinal has a live claim of each.
    pub claim_templates: Vec<String>,
    /// The set's claims (all ordinals).
    pub claims: Vec<Claim>,
    /// Pods holding one of the set's pod names.
    pub pods: Vec<PodObs>,
    /// The ordinal states of the last status report.
    pub previous: BTreeMap<i32, OrdinalState>,
    /// The health of the nodes read live, by name (see [`NodeHealth`]); a drain pod's node not
    /// here is taken as ready, a fence node not here as not ready.
    pub nodes: BTreeMap<String, NodeHealth>,
}
