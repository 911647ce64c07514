//! An independent checker of the drain controller's guarantees (issue 10).
//!
//! It shares no code with the controller or the drainer: it knows the contract only from the
//! outside, as a user would (the drain pod's label key, the `statefulsets.kubernetes.io/drain-`
//! annotation prefix, the Kubernetes objects). [`Recorder`] records everything that happens to
//! pods, claims and StatefulSets in one namespace from its own watches; [`check`] replays that
//! history in etcd revision order and reports every violation of
//!
//! - **I1**: no claim is deleted unless a drain pod that mounted it had finished successfully
//!   (phase `Succeeded`, every container exited 0) without having been asked to stop (every
//!   container finished strictly before the delete request, `deletionTimestamp −
//!   deletionGracePeriodSeconds`; a tie, a zero grace period or missing data is no proof);
//! - **I2**: no stateful pod is created while one of its claims is being deleted, and never two
//!   pods with one name;
//! - **I3** ([`unsettled`]): once faults stop, every orphaned claim of an opted-in set is drained
//!   and deleted, and no drain pod, drain record annotation or finalizer of ours is left;
//! - **I4** ([`records::check`]): every record written is readable exactly once afterwards.

pub mod history;
pub mod invariants;
pub mod records;

pub use history::{Change, Entry, History, Obj, Recorder};
pub use invariants::{Verdict, check, unsettled};

/// The label every drain pod carries (its value: the set's name).
pub const DRAIN_POD_LABEL: &str = "statefulsets.kubernetes.io/drain-pod";
/// The annotation that opts a StatefulSet in.
pub const TEMPLATE_ANNOTATION: &str = "statefulsets.kubernetes.io/drainer-pod-template";
/// The prefix of the drain record the controller keeps on claims.
pub const RECORD_PREFIX: &str = "statefulsets.kubernetes.io/drain-";
/// The one claim annotation of that prefix a person sets (approval), not the controller.
pub const APPROVED_ANNOTATION: &str = "statefulsets.kubernetes.io/drain-approved";
