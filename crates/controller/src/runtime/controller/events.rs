//! Events on the sets: published in the background, so reporting never delays a drain's
//! actions; a failure is only logged.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::warn;

use crate::act::Severity;

/// What Events are published with: the recorder, and the Events on their way (a stop waits for
/// them within its grace).
#[derive(Clone)]
pub(super) struct Events {
    pub(super) recorder: Recorder,
    pub(super) sending: tokio_util::task::TaskTracker,
}

/// Publishes an Event in the background: reporting never delays the drain actions of the
/// reconcile (each Event is one or two API calls); a failure is only logged.
pub(super) fn publish(
    events: &Events,
    reference: &ObjectReference,
    severity: Severity,
    reason: &str,
    note: String,
    ordinal: Option<i32>,
) {
    let ev = Event {
        type_: match severity {
            Severity::Normal => EventType::Normal,
            Severity::Warning => EventType::Warning,
        },
        reason: reason.to_owned(),
        note: Some(crate::act::fit_note(note)),
        // Part of the recorder's key for folding Events into series (the note is not).
        action: ordinal.map_or_else(|| "Drain".to_owned(), |o| format!("Drain-ordinal-{o}")),
        secondary: None,
    };
    let (events, reference) = (events.clone(), reference.clone());
    events.sending.clone().spawn(async move {
        if let Err(e) = events.recorder.publish(&ev, &reference).await {
            warn!(error = %e, reason = %ev.reason, "failed to publish event");
        }
    });
}
