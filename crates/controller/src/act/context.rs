//! What the act step's parts share: the context of one reconcile's actions ([`ActCtx`]) and
//! what carrying out one action came to ([`Outcome`]).

use jiff::Timestamp;

use crate::plan::ClaimRef;
use crate::template::DrainTemplate;

/// What every action of one reconcile shares.
pub struct ActCtx<'a> {
    /// The set's name.
    pub set_name: &'a str,
    /// `spec.replicas` now.
    pub replicas: i32,
    /// The validated drain template (absent when new drains are stopped).
    pub template: Option<&'a DrainTemplate>,
    /// The time the plan was made for.
    pub now: Timestamp,
    /// The set's `status.updateRevision` as cached (the drain pods' controller).
    pub revision: Option<&'a str>,
}

impl ActCtx<'_> {
    pub(super) fn pod_name(&self, ordinal: i32) -> String {
        drain_api::names::pod_name(self.set_name, ordinal)
    }
}

/// What carrying out one action came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done as planned.
    Done,
    /// A drain pod was created with this UID.
    Created(String),
    /// A pod with the drain pod's name exists (the cache lagged): nothing created.
    NameTaken,
    /// A live read showed the cached view was stale; nothing done.
    Stale(&'static str),
    /// The drain pod changed since it was observed (or is gone); the ordinal's remaining actions
    /// are skipped and it is planned again.
    Changed,
    /// The volumes of the claims were retained: one line per claim, for the Event.
    Retained(Vec<String>),
    /// This claim is gone or was replaced since it was observed: nothing more is written to it,
    /// the ordinal's remaining actions are skipped and it is planned again from fresh state.
    ClaimGone(String),
}

impl Outcome {
    /// Whether the plan was made from a view this outcome proved stale, so the ordinal's
    /// remaining actions must not run.
    pub(super) fn stops_ordinal(&self) -> bool {
        matches!(self, Self::Changed | Self::Stale(_) | Self::ClaimGone(_))
    }
}

/// The claims' names, comma-separated, for Events and logs.
pub(super) fn names(claims: &[ClaimRef]) -> String {
    claims
        .iter()
        .map(|c| c.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
