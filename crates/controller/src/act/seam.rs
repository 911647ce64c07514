//! The seam between act and the cluster: the [`Cluster`] trait the act step calls (implemented
//! for the real API server in `runtime::controller::writes` and by fakes in the tests), and the
//! Events and call outcomes that cross it.

use std::collections::BTreeMap;
use std::future::Future;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::plan::ClaimRef;
use crate::retain::RetainError;

/// Severity of an Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

/// What an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    /// The StatefulSet being reconciled.
    Set,
    /// A drain pod, by name and UID.
    Pod {
        /// Name.
        name: String,
        /// UID.
        uid: String,
    },
}

/// An Event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    /// About what.
    pub subject: Subject,
    /// Normal or Warning.
    pub severity: Severity,
    /// Reason (CamelCase, stable).
    pub reason: &'static str,
    /// Message.
    pub note: String,
    /// The ordinal it is about, if one: Events about the set that differ only in their note
    /// are kept apart by it (an Event recorder folds Events of the same reason on the same
    /// object into one series, keeping only the first note).
    pub ordinal: Option<i32>,
}

/// The outcome of a create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    /// Created, with this UID.
    Uid(String),
    /// A pod with that name exists already.
    AlreadyExists,
}

/// The outcome of a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    /// Deleted (or deletion started).
    Deleted,
    /// Gone already, or replaced by another object of that name (UID precondition failed).
    Gone,
    /// The object changed since it was observed (resourceVersion precondition failed).
    Changed,
}

/// The outcome of a UID-preconditioned patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Patched {
    /// Patched.
    Done,
    /// Gone, or replaced by another object of that name (UID precondition failed): nothing
    /// written.
    Gone,
}

/// What retaining one claim's volume came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retained {
    /// The volume is marked and its policy is `Retain` (now or from an earlier try).
    Marked {
        /// The volume.
        volume: String,
    },
    /// The volume's policy was `Retain` already, by its owner's choice: left as it is.
    KeptByOwner {
        /// The volume.
        volume: String,
    },
    /// The claim is bound to no volume (or to one that is gone): no data to keep.
    NoVolume,
    /// The claim is gone or was replaced.
    ClaimGone,
}

/// The calls the act step makes, in one namespace. The real one talks to the API server; tests
/// use a fake that records calls and injects errors.
pub trait Cluster: Sync {
    /// Creates a pod.
    fn create_pod(&self, pod: &Pod) -> impl Future<Output = Result<Created, kube::Error>> + Send;
    /// Deletes a pod if it still has this UID (and resourceVersion, when given).
    fn delete_pod(
        &self,
        name: &str,
        uid: &str,
        resource_version: Option<&str>,
    ) -> impl Future<Output = Result<Deleted, kube::Error>> + Send;
    /// Deletes a claim if it still has this UID; gone already is fine.
    fn delete_claim(
        &self,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Sets (`Some`) or removes (`None`) annotations on a claim if it still has this UID;
    /// [`Patched::Gone`] if it is gone or was replaced.
    fn annotate_claim(
        &self,
        name: &str,
        uid: &str,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> impl Future<Output = Result<Patched, kube::Error>> + Send;
    /// Whether `ordinal` is still outside the set's range, read live from the API server (a
    /// guard against a stale cache, read right after a drain pod's create); `false` if the set is
    /// gone, was replaced or is being deleted.
    fn still_orphaned(
        &self,
        ordinal: i32,
    ) -> impl Future<Output = Result<bool, kube::Error>> + Send;
    /// The UID of the pod holding `name` now, read live from the API server.
    fn pod_uid(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, kube::Error>> + Send;
    /// Sets the reclaim policy of the volume of `claim` (drained by drain pod `pod`) to
    /// `Retain` and marks it until `until` ([`crate::retain`]), reading both live.
    fn retain_volume(
        &self,
        claim: &ClaimRef,
        pod: &str,
        until: Timestamp,
    ) -> impl Future<Output = Result<Retained, RetainError>> + Send;
    /// Publishes an Event (best effort: failures are logged, not returned).
    fn event(&self, event: &EventSpec) -> impl Future<Output = ()> + Send;
    /// Whether this replica may still act (the leader-election fence, checked before each
    /// action; always `true` without leader election).
    fn may_act(&self) -> bool {
        true
    }
    /// Whether a drain pod's create must wait for the live read ([`Cluster::still_orphaned`])
    /// instead of going out before it: while the set's last read did not confirm a drain pod
    /// (it failed, or the cache lagged a scale-up or a set of the other kind: a create would
    /// only be withdrawn, and its pod's events would retry it at once).
    fn confirm_first(&self) -> bool {
        false
    }
    /// A withdrawal failed: the pod (`name`, `uid`) is deleted on the set's next reconciles, and
    /// shown to the planner as terminating meanwhile (never recorded on its claims).
    fn withdraw_later(&self, _name: &str, _uid: &str) {}
    /// A drain pod's create found `name` (of `ordinal`) taken: find out, live, what holds it.
    /// A pod made neither by the set nor by this controller is remembered, so the ordinal is
    /// shown blocked without a drain slot until it goes. Best effort.
    fn name_taken(&self, _ordinal: i32, _name: &str) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
    /// The metadata of the set's ControllerRevision `name`, read live (`None`: no such
    /// revision).
    fn revision(
        &self,
        _name: &str,
    ) -> impl Future<Output = Result<Option<ObjectMeta>, kube::Error>> + Send {
        std::future::ready(Ok(None))
    }
}
