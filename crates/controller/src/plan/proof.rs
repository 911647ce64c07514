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

/// What keeps the completion records of `drain`'s containers from proving every claim it
/// drains, for people; empty when each claim is proven. A claim is proven when a regular
/// container uses it and every regular container that uses it exited 0 with the record of
/// exactly the claims it uses: one container's record never proves a claim another drains.
pub fn record_gaps(drain: &DrainPod) -> Vec<String> {
    let mut gaps = Vec::new();
    for (claim, uid) in &drain.claims {
        if !drain
            .containers
            .iter()
            .any(|c| c.claims.get(claim) == Some(uid))
        {
            gaps.push(format!(
                "no container of it uses claim {claim}, so nothing can prove it drained"
            ));
        }
    }
    for c in drain.containers.iter().filter(|c| !c.claims.is_empty()) {
        match &c.record {
            Some(named) if *named == c.claims => {}
            Some(named) => gaps.push(format!(
                "container {}'s completion record names claims {}, not the claims it uses ({})",
                c.name,
                claim_list(named),
                claim_list(&c.claims)
            )),
            None => gaps.push(format!(
                "container {} (draining {}) has not exited 0 with its completion record",
                c.name,
                claim_list(&c.claims)
            )),
        }
    }
    gaps
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
        // Every claim is proven by the containers that use it, whatever the pod does next (a
        // sidecar that never exits, such as an injected mesh proxy, keeps the pod running).
        SuccessProof::CompletionRecord => {
            let gaps = record_gaps(drain);
            if !drain.claims.is_empty() && gaps.is_empty() {
                return Finish::Proven {
                    record_first: false,
                };
            }
            if drain.phase != DrainPhase::Succeeded {
                return Finish::NotFinished;
            }
            let wrote_none = drain.containers.iter().all(|c| c.record.is_none());
            match stopped {
                Some(stop) if wrote_none => interrupted(format!(
                    "{stop} and exited 0 without writing the completion record"
                )),
                _ if wrote_none => no_proof(
                    "it exited 0 without writing the completion record (DRAIN_COMPLETION_RECORD \
                     to its termination message), so nothing shows its drain finished"
                        .to_owned(),
                ),
                Some(stop) => interrupted(format!("{stop} and {}", gaps.join("; "))),
                None if drain.claims.is_empty() => no_proof(
                    "it names no claims it was bound to, so no record proves a drain".to_owned(),
                ),
                None => no_proof(gaps.join("; ")),
            }
        }
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
