//! Events on the sets: published in the background, after the urgent writes in flight, so
//! reporting never delays a drain's actions; a failure is only logged.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::warn;

use crate::act::Severity;
use crate::runtime::urgency::{Urgency, Waiting};

/// What Events are published with: the recorder, the urgent writes they wait for, and the
/// Events on their way (a stop waits for them within its grace).
#[derive(Clone)]
pub(super) struct Events {
    pub(super) recorder: Recorder,
    pub(super) urgency: Arc<Urgency>,
    pub(super) sending: tokio_util::task::TaskTracker,
}

/// Publishes an Event in the background, after the urgent writes in flight ([`Urgency`]):
/// reporting never delays the drain actions of the reconcile (each Event is one or two API
/// calls); a failure is only logged.
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
        let published = (events.urgency)
            .paced(Waiting::Report, events.recorder.publish(&ev, &reference))
            .await;
        if let Err(e) = published {
            warn!(error = %e, reason = %ev.reason, "failed to publish event");
        }
    });
}
