//! An independent checker of the drain controller's guarantees (issues 10 and 21).
//!
//! It shares no code with the controller or the drainer: it knows the contract only from the
//! outside, as a user would (the drain pod's label key, the `statefulsets.kubernetes.io/drain-`
//! annotation prefix, the completion record's documented text, the Kubernetes objects).
//! [`Recorder`] records everything that happens to pods, claims and StatefulSets in one
//! namespace from its own watches; [`check`] replays that history in etcd revision order and
//! reports every violation of
//!
//! - **I1**: no claim is deleted unless a drain told its completion naming that claim's name
//!   and UID before the deletion was first seen ([`Witness`]). In the fault suite the drains
//!   tell it themselves: each drain script's very last step sends its completion record to a
//!   witness the test runs, which notes when each [`Report`] arrived, and a deleted claim needs
//!   a report naming it that arrived before the checker's watch first saw the claim being
//!   deleted (the watch sees a deletion after it happened, so the order cannot be inverted by
//!   a slow watch; it can only miss a report that arrives within the watch's delay after a
//!   wrong deletion). Exit codes, phases and clocks play no part in it (they only feed a count
//!   of the drain pods that exited 0 without reporting): they are how the controller decides,
//!   and a drain stopped by a SIGTERM it answers with `exit 0` (a probe's
//!   kill, an eviction, a delete) ends `Succeeded` without ever reporting. For the example
//!   datastore, whose `drainer` image the test does not script, the drains' word is the
//!   completion record in their termination message ([`Witness::TerminationMessages`]) and
//!   the drain itself is judged by I4 from the data;
//! - **I2**: no stateful pod is created while one of its claims is being deleted, and never two
//!   pods with one name;
//! - **I3** ([`unsettled`]): once faults stop, every orphaned claim of an opted-in set is drained
//!   and deleted, and no drain pod, drain record annotation or finalizer of ours is left;
//! - **I4** ([`records::Writes::check`]): the newest write of every key is readable exactly
//!   once afterwards, and a key whose newest write is a delete is held nowhere.

pub mod history;
pub mod invariants;
pub mod records;
pub mod witness;

pub use history::{Change, Entry, History, Obj, Recorder};
pub use invariants::{Verdict, check, unsettled};
pub use witness::{Report, Witness};

/// The label every drain pod carries (its value: the set's name).
pub const DRAIN_POD_LABEL: &str = "statefulsets.kubernetes.io/drain-pod";
/// The annotation that opts a StatefulSet in.
pub const TEMPLATE_ANNOTATION: &str = "statefulsets.kubernetes.io/drainer-pod-template";
/// The prefix of the drain record the controller keeps on claims.
pub const RECORD_PREFIX: &str = "statefulsets.kubernetes.io/drain-";
/// The one claim annotation of that prefix a person sets (approval), not the controller.
pub const APPROVED_ANNOTATION: &str = "statefulsets.kubernetes.io/drain-approved";
