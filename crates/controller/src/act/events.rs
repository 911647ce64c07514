//! What each outcome is reported as: the Events of an action's outcome ([`events`]) and of a
//! dry run ([`dry_run_event`]), pure functions of the action and its outcome.

use std::collections::BTreeMap;

use drain_api::claim_annotations;

use super::context::{ActCtx, Outcome, names};
use super::seam::{EventSpec, Severity, Subject};
use crate::plan::{Action, ClaimRef, DeleteWhy, FailureKind};

/// Most bytes of an Event's note the API server accepts.
pub const NOTE_BYTES: usize = 1024;

/// `note` cut to [`NOTE_BYTES`] at a character boundary, ending in `…` when cut: a longer note
/// (a quoted termination message of non-ASCII text) would make the API refuse the Event.
pub fn fit_note(mut note: String) -> String {
    if note.len() <= NOTE_BYTES {
        return note;
    }
    let mut cut = NOTE_BYTES - '…'.len_utf8();
    while !note.is_char_boundary(cut) {
        cut -= 1;
    }
    note.truncate(cut);
    note.push('…');
    note
}

fn on_set(severity: Severity, reason: &'static str, note: String) -> EventSpec {
    EventSpec {
        subject: Subject::Set,
        severity,
        reason,
        note,
        ordinal: None,
    }
}

/// The Event that reports what `action` would do, under `--dry-run` (pure; no time in the
/// note, so an unchanged plan gives unchanged Events).
pub fn dry_run_event(ctx: &ActCtx<'_>, action: &Action) -> EventSpec {
    let pod = ctx.pod_name(action.ordinal());
    let (reason, note) = match action {
        Action::CreateDrainPod {
            claims, attempt, ..
        } => {
            let refs: Vec<ClaimRef> = claims.values().cloned().collect();
            (
                "DryRunCreateDrainPod",
                format!(
                    "would create drain pod {pod} (attempt {attempt}) for claims {}",
                    names(&refs)
                ),
            )
        }
        Action::RecordDrainPod { claims, .. } => (
            "DryRunRecordDrainPod",
            format!("would record drain pod {pod} on claims {}", names(claims)),
        ),
        Action::RecordFailure {
            claims,
            attempts,
            reason,
            gave_up,
            ..
        } => (
            "DryRunRecordFailure",
            format!(
                "would count failed attempt {attempts} of drain pod {pod} on claims {} ({reason}){}",
                names(claims),
                if *gave_up { "; and give up" } else { "" }
            ),
        ),
        Action::RecordLostNodes { claims, nodes, .. } => (
            "DryRunRecordLostNodes",
            format!(
                "would record on claims {} that drain pods of {pod} were lost on nodes {}",
                names(claims),
                nodes.join(", ")
            ),
        ),
        Action::RecordFence { claims, node, .. } => (
            "DryRunRecordFence",
            match node {
                Some(node) => format!(
                    "would record on claims {} that {pod} was last seen on node {node}, not ready",
                    names(claims)
                ),
                None => format!("would clear the fence node on claims {}", names(claims)),
            },
        ),
        Action::RecordReturn { claims, .. } => (
            "DryRunRecordReturn",
            format!(
                "would record the scale-up that brought {pod} back on claims {}",
                names(claims)
            ),
        ),
        Action::RecordSuccess { claims, .. } => (
            "DryRunRecordSuccess",
            format!(
                "would record on claims {} that drain pod {pod} was seen succeeding",
                names(claims)
            ),
        ),
        Action::DeleteDrainPod { why, .. } => (
            "DryRunDeleteDrainPod",
            format!("would delete drain pod {pod} ({why:?})"),
        ),
        Action::RetainVolumes { claims, until, .. } => (
            "DryRunRetainVolumes",
            format!(
                "would retain the volumes of claims {} until {until}",
                names(claims)
            ),
        ),
        Action::DeleteClaims { claims, .. } => (
            "DryRunDeleteClaims",
            format!(
                "would delete claims {} (drain pod {pod} succeeded)",
                names(claims)
            ),
        ),
        Action::ClearRecord { claims, .. } => (
            "DryRunClearRecord",
            format!("would clear the drain record of claims {}", names(claims)),
        ),
        Action::AwaitApproval { claims, .. } => (
            "DryRunAwaitApproval",
            format!(
                "drain pod {pod} succeeded; claims {} would wait for approval",
                names(claims)
            ),
        ),
        Action::Warn {
            reason, message, ..
        } => ("DryRunWarn", format!("{reason}: {message}")),
    };
    EventSpec {
        ordinal: Some(action.ordinal()),
        ..on_set(Severity::Normal, reason, note)
    }
}

/// The Events that report an action's outcome (pure: the act step publishes them).
pub fn events(ctx: &ActCtx<'_>, action: &Action, outcome: &Outcome) -> Vec<EventSpec> {
    use Severity::{Normal, Warning};
    if outcome.stops_ordinal() || *outcome == Outcome::NameTaken {
        return Vec::new();
    }
    match action {
        Action::CreateDrainPod {
            ordinal,
            claims,
            attempt,
            ..
        } => created(ctx, *ordinal, claims, *attempt, outcome),
        Action::RecordFailure { .. } => failed(ctx, action),
        Action::DeleteDrainPod { name, why, .. } => withdrawn(name, *why),
        Action::DeleteClaims { ordinal, claims } => {
            let name = ctx.pod_name(*ordinal);
            vec![
                on_set(
                    Normal,
                    "DrainSucceeded",
                    format!(
                        "drain pod {name} succeeded; deleting claims {}",
                        names(claims)
                    ),
                ),
                on_set(
                    Normal,
                    "ClaimsDeleted",
                    format!("deleted claims {} drained by {name}", names(claims)),
                ),
            ]
        }
        Action::RetainVolumes { .. } => match outcome {
            Outcome::Retained(lines) => vec![on_set(
                Normal,
                "VolumesRetained",
                format!(
                    "{}; kubectl drain-status {} --volumes shows how to restore one",
                    lines.join("; "),
                    ctx.set_name
                ),
            )],
            _ => Vec::new(),
        },
        Action::Warn {
            reason, message, ..
        } => vec![on_set(Warning, reason, message.clone())],
        Action::AwaitApproval { ordinal, claims } => {
            let list = names(claims);
            vec![on_set(
                Normal,
                "DrainAwaitingApproval",
                format!(
                    "drain pod {} succeeded; claims {list} are deleted once approved: kubectl \
                     annotate pvc {} {}=true",
                    ctx.pod_name(*ordinal),
                    claims
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                    claim_annotations::APPROVED
                ),
            )]
        }
        Action::RecordDrainPod { .. }
        | Action::RecordReturn { .. }
        | Action::RecordFence { .. }
        | Action::RecordLostNodes { .. }
        | Action::RecordSuccess { .. }
        | Action::ClearRecord { .. } => Vec::new(),
    }
}

/// The Events of a created drain pod: on the set and on the pod.
fn created(
    ctx: &ActCtx<'_>,
    ordinal: i32,
    claims: &BTreeMap<String, ClaimRef>,
    attempt: u32,
    outcome: &Outcome,
) -> Vec<EventSpec> {
    use Severity::Normal;
    let Outcome::Created(uid) = outcome else {
        return Vec::new();
    };
    let name = ctx.pod_name(ordinal);
    let refs: Vec<ClaimRef> = claims.values().cloned().collect();
    let (reason, note) = if attempt > 1 {
        let note = format!(
            "created drain pod {name} (attempt {attempt}) for {}",
            names(&refs)
        );
        ("DrainRetrying", note)
    } else {
        (
            "DrainPodCreated",
            format!("created drain pod {name} for {}", names(&refs)),
        )
    };
    vec![
        on_set(Normal, reason, note.clone()),
        EventSpec {
            subject: Subject::Pod {
                name,
                uid: uid.clone(),
            },
            severity: Normal,
            reason,
            note,
            ordinal: None,
        },
    ]
}

/// The Events of a failed drain: a Warning on the pod, and on the set either the retry or
/// that it gave up.
fn failed(ctx: &ActCtx<'_>, action: &Action) -> Vec<EventSpec> {
    use Severity::Warning;
    let Action::RecordFailure {
        ordinal,
        claims,
        pod_uid,
        kind,
        attempts,
        retry_after,
        reason,
        gave_up,
        ..
    } = action
    else {
        return Vec::new();
    };
    let name = ctx.pod_name(*ordinal);
    let (event_reason, what) = match kind {
        FailureKind::Failed | FailureKind::Vanished => ("DrainFailed", "failed"),
        FailureKind::Interrupted => ("DrainInterrupted", "was interrupted"),
        FailureKind::Unproven => ("DrainUnproven", "exited 0 without proof it finished"),
        FailureKind::Stuck => ("DrainStuck", "is stuck"),
        FailureKind::Stalled => ("DrainStalled", "made no progress"),
        FailureKind::DeadlineExceeded => ("DrainDeadlineExceeded", "ran past the drain deadline"),
    };
    let note = format!("drain pod {name} {what} (attempt {attempts}): {reason}");
    let mut out = vec![EventSpec {
        subject: Subject::Pod {
            name,
            uid: pod_uid.clone(),
        },
        severity: Warning,
        reason: event_reason,
        note: note.clone(),
        ordinal: None,
    }];
    if *gave_up {
        let note = format!(
            "{note}; giving up: claims {} are kept (remove the drain-* annotations from them, \
             raise the limit, or change the drain template to retry)",
            names(claims)
        );
        out.push(on_set(Warning, "DrainGaveUp", note));
    } else {
        let secs = retry_after.duration_since(ctx.now).as_secs().max(0);
        out.push(on_set(
            Warning,
            event_reason,
            format!("{note}; retrying in {secs}s"),
        ));
    }
    out
}

/// The Event of a drain pod deleted before it finished, by why (none for a drain pod deleted
/// once it finished or failed: those have their own Events).
fn withdrawn(name: &str, why: DeleteWhy) -> Vec<EventSpec> {
    use Severity::{Normal, Warning};
    match why {
        DeleteWhy::Cancelled => vec![on_set(
            Normal,
            "DrainCancelled",
            format!(
                "scale-up: cancelled the drain of {name}; its claims are kept for the returning pod"
            ),
        )],
        DeleteWhy::ScaleUpWaitExceeded => vec![on_set(
            Warning,
            "ScaleUpWaitExceeded",
            format!(
                "scale-up: the returning pod waited too long for drain {name} (policy finish); \
                 cancelled it, its claims are kept for the returning pod"
            ),
        )],
        DeleteWhy::ReturnedBeforeApproval => vec![on_set(
            Normal,
            "DrainReturnedBeforeApproval",
            format!(
                "scale-up: the ordinal of drain pod {name} came back before the deletion of its \
                 drained claims was approved; removed the drain pod, the claims are kept for \
                 the returning pod"
            ),
        )],
        DeleteWhy::TemplateChanged => vec![on_set(
            Normal,
            "DrainTemplateChanged",
            format!(
                "drain template changed: replacing drain pod {name}, which was not running \
                 (not started yet, or waiting to be restarted after a failure)"
            ),
        )],
        DeleteWhy::ClaimsGone => vec![on_set(
            Warning,
            "DrainClaimsGone",
            format!(
                "the claims of drain pod {name} were deleted before it started (by hand?): \
                 removed the drain pod, which could never start; nothing was drained"
            ),
        )],
        DeleteWhy::Succeeded
        | DeleteWhy::Failed
        | DeleteWhy::DeadlineExceeded
        | DeleteWhy::Stuck
        | DeleteWhy::Stalled
        | DeleteWhy::NodeLost
        | DeleteWhy::NodeBound => Vec::new(),
    }
}
