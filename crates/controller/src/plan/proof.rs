//! What proves that a drain pod finished, under the set's [`SuccessProof`]: the one rule a claim's
//! deletion rests on.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::actions::FailureKind;
use super::observed::{DrainPhase, DrainPod, PodObs};

use crate::config::SuccessProof;

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
