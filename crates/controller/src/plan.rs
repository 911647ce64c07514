//! The drain state machine: a snapshot of one StatefulSet and `now` → the actions that move each
//! removed ordinal's drain forward, and the state of every ordinal for the status report. Pure:
//! no client, no clock; the whole drain lifecycle is here and nowhere else.
//!
//! Per ordinal that has claims or a drain pod, highest first:
//!
//! | observed                                           | actions                                  |
//! |----------------------------------------------------|------------------------------------------|
//! | another pod with the ordinal's name (stateful pod) | wait for it to go                        |
//! | out of range, no pod, live claims, slot free       | `CreateDrainPod`                         |
//! | drain pod running, UID not recorded on claims      | `RecordDrainPod`                         |
//! | drain pod Succeeded                                | `DeleteClaims` (recorded UIDs) → `DeleteDrainPod` |
//! | drain pod Failed, or deleted by someone            | `RecordFailure` (backoff) → `DeleteDrainPod` |
//! | drain pod running past the deadline                | `RecordFailure` (gave up) → `DeleteDrainPod` |
//! | back in range, drain running, `cancel` policy      | `DeleteDrainPod` → `ClearRecord`         |
//! | back in range, no drain pod, drain record on claims| `ClearRecord`                            |
//!
//! Invariants (property-tested below): a claim is deleted only when a Succeeded drain pod of its
//! ordinal recorded that claim's UID; no drain pod is created for an ordinal in range or whose
//! name is taken; never more drains at once than allowed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::config::OnScaleUp;

/// What an ordinal's claims remember about its drain (annotations on the claims, see
/// [`drain_api::claim_annotations`]): all drain state lives in the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainRecord {
    /// Failed attempts so far.
    pub attempts: u32,
    /// When the first attempt started (the deadline counts from it).
    pub first_attempt_at: Option<Timestamp>,
    /// No new drain pod before this time.
    pub retry_after: Option<Timestamp>,
    /// Why the last attempt failed.
    pub last_failure: Option<String>,
    /// UID of the drain pod of the current attempt.
    pub pod_uid: Option<String>,
    /// UID of the drain pod whose failure was last counted.
    pub counted_pod_uid: Option<String>,
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
    /// Every container exited 0: the drain is done.
    Succeeded,
    /// Failed (or evicted).
    Failed,
    /// The node lost track of it.
    Unknown,
}

/// What kind of pod holds an ordinal's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodKind {
    /// Not a drain pod of this set: the StatefulSet's own pod, or anything else by that name.
    Other,
    /// A drain pod this controller made for this set.
    Drain {
        /// Its phase.
        phase: DrainPhase,
        /// The claims it drains, `{name: UID}`, from its annotation.
        claims: BTreeMap<String, String>,
        /// Why it failed, when it did (pod reason/message or container exit).
        failure: Option<String>,
    },
}

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
    /// Drain pod or other.
    pub kind: PodKind,
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
    /// The set's claims (all ordinals).
    pub claims: Vec<Claim>,
    /// Pods holding one of the set's pod names.
    pub pods: Vec<PodObs>,
    /// Ordinals the last status report showed as done, with when.
    pub previous_done: BTreeMap<i32, Timestamp>,
}

/// The per-set knobs of the planner (validated annotations and controller flags).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Most drains at once (`None`: unlimited).
    pub max_concurrent: Option<u32>,
    /// What a scale-up does to a drain in flight.
    pub on_scale_up: OnScaleUp,
    /// Most failed attempts before giving up.
    pub max_attempts: Option<u32>,
    /// Time after the first attempt after which retrying stops.
    pub deadline: Option<Duration>,
    /// First retry delay; doubles per failed attempt.
    pub retry_base: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_concurrent: Some(1),
            on_scale_up: OnScaleUp::Finish,
            max_attempts: None,
            deadline: None,
            retry_base: Duration::from_secs(5),
            retry_max: Duration::from_secs(300),
        }
    }
}

/// A claim, by name and UID (deletes are preconditioned on the UID).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimRef {
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// Why a drain pod is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteWhy {
    /// It succeeded and its claims are deleted.
    Succeeded,
    /// It failed; a new one follows after a backoff.
    Failed,
    /// Its ordinal came back in range and the set's policy is `cancel`.
    Cancelled,
    /// It ran past the set's deadline.
    DeadlineExceeded,
}

/// One step the act side carries out, in order; it decides nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Record the first attempt's time on the claims (when `first_attempt_at` is set), create
    /// the drain pod for `ordinal` bound to `claims` (by claim template), then record its UID.
    CreateDrainPod {
        /// Ordinal.
        ordinal: i32,
        /// Live claims by claim template name.
        claims: BTreeMap<String, ClaimRef>,
        /// 1 for the first attempt.
        attempt: u32,
        /// Set when this is the first attempt.
        first_attempt_at: Option<Timestamp>,
    },
    /// Record a running drain pod's UID on the claims.
    RecordDrainPod {
        /// Ordinal.
        ordinal: i32,
        /// Claims to annotate.
        claims: Vec<ClaimRef>,
        /// The drain pod's UID.
        pod_uid: String,
    },
    /// Count a failed attempt on the claims.
    RecordFailure {
        /// Ordinal.
        ordinal: i32,
        /// Claims to annotate.
        claims: Vec<ClaimRef>,
        /// The failed drain pod's UID (counted once).
        pod_uid: String,
        /// Failed attempts including this one.
        attempts: u32,
        /// No new drain pod before this.
        retry_after: Timestamp,
        /// Why it failed.
        reason: String,
        /// Whether retrying stops here (attempts or deadline exhausted).
        gave_up: bool,
        /// The pod was not seen in the cache: count it only if the API server confirms that
        /// no pod with `pod_uid` holds the name (the cache may lag behind a fresh create).
        only_if_pod_gone: bool,
    },
    /// Delete the drain pod (UID precondition).
    DeleteDrainPod {
        /// Ordinal.
        ordinal: i32,
        /// Pod name.
        name: String,
        /// Pod UID.
        uid: String,
        /// Why.
        why: DeleteWhy,
    },
    /// Delete claims whose drain succeeded (UID precondition).
    DeleteClaims {
        /// Ordinal.
        ordinal: i32,
        /// Exactly the claims the Succeeded drain pod recorded.
        claims: Vec<ClaimRef>,
    },
    /// Remove the drain record from claims whose ordinal is back in range.
    ClearRecord {
        /// Ordinal.
        ordinal: i32,
        /// Claims to clear.
        claims: Vec<ClaimRef>,
    },
}

/// Where one ordinal's drain stands, for the status annotation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum OrdinalState {
    /// Not started: its pod still exists, or it waits for a drain slot.
    Waiting {
        /// Why.
        reason: String,
    },
    /// A drain pod is running.
    Draining {
        /// Attempt number (1 for the first).
        attempt: u32,
    },
    /// The last attempt failed; another follows.
    Retrying {
        /// Failed attempts.
        attempts: u32,
        /// Next attempt not before.
        #[serde(rename = "retryAfter")]
        retry_after: String,
        /// Why the last attempt failed.
        #[serde(rename = "lastFailure")]
        last_failure: String,
    },
    /// Retrying stopped; the claims are kept.
    Failed {
        /// Failed attempts.
        attempts: u32,
        /// Why the last attempt failed.
        #[serde(rename = "lastFailure")]
        last_failure: String,
        /// Why retrying stopped.
        reason: String,
    },
    /// The drain succeeded; claims deleted (or being deleted).
    Done {
        /// When the success was seen.
        at: String,
    },
}

/// The planner's output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Steps to carry out, in order.
    pub actions: Vec<Action>,
    /// State of every ordinal with a drain to report.
    pub status: BTreeMap<i32, OrdinalState>,
    /// Look again after this long (backoff expiry, deadline), even without a watch event.
    pub requeue_after: Option<Duration>,
}

/// Delay before attempt `failed + 1` after `failed` failed attempts: `base * 2^(failed-1)`,
/// capped at `max`.
pub fn backoff(failed: u32, base: Duration, max: Duration) -> Duration {
    let exp = failed.saturating_sub(1).min(30);
    base.saturating_mul(1u32 << exp).min(max)
}

fn add(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

fn until(now: Timestamp, t: Timestamp) -> Duration {
    Duration::try_from(t.duration_since(now)).unwrap_or(Duration::ZERO)
}

/// The merged record of an ordinal's live claims (they are written together; the one with the
/// most attempts wins if a crash left them apart).
fn merged_record(claims: &[&Claim]) -> DrainRecord {
    let mut best = claims
        .iter()
        .max_by_key(|c| c.record.attempts)
        .map(|c| c.record.clone())
        .unwrap_or_default();
    for c in claims {
        let r = &c.record;
        best.first_attempt_at = match (best.first_attempt_at, r.first_attempt_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if best.pod_uid.is_none() {
            best.pod_uid.clone_from(&r.pod_uid);
        }
    }
    best
}

fn claim_refs(claims: &[&Claim]) -> Vec<ClaimRef> {
    claims
        .iter()
        .map(|c| ClaimRef {
            name: c.name.clone(),
            uid: c.uid.clone(),
        })
        .collect()
}

struct Planner<'a> {
    settings: &'a Settings,
    now: Timestamp,
    plan: Plan,
}

impl Planner<'_> {
    fn requeue_at(&mut self, t: Timestamp) {
        let d = until(self.now, t).max(Duration::from_millis(100));
        self.plan.requeue_after = Some(self.plan.requeue_after.map_or(d, |r| r.min(d)));
    }

    fn deadline_of(&self, record: &DrainRecord) -> Option<Timestamp> {
        Some(add(record.first_attempt_at?, self.settings.deadline?))
    }

    /// Why retrying has stopped for this record, if it has.
    fn gave_up(&self, record: &DrainRecord) -> Option<String> {
        if let Some(max) = self.settings.max_attempts
            && record.attempts >= max
        {
            return Some(format!("{} of {max} attempts failed", record.attempts));
        }
        let deadline = self.deadline_of(record)?;
        let next = record.retry_after.unwrap_or(self.now).max(self.now);
        (next >= deadline).then(|| format!("deadline passed at {deadline}"))
    }

    /// Counts a failure of `pod_uid` and says what state follows.
    fn record_failure(
        &mut self,
        ordinal: i32,
        live: &[&Claim],
        record: &DrainRecord,
        pod_uid: &str,
        reason: String,
        only_if_pod_gone: bool,
    ) -> OrdinalState {
        let attempts = record.attempts + 1;
        let retry_after = add(
            self.now,
            backoff(attempts, self.settings.retry_base, self.settings.retry_max),
        );
        let next = DrainRecord {
            attempts,
            retry_after: Some(retry_after),
            first_attempt_at: record.first_attempt_at.or(Some(self.now)),
            ..DrainRecord::default()
        };
        let gave_up = self.gave_up(&next);
        if !live.is_empty() {
            self.plan.actions.push(Action::RecordFailure {
                ordinal,
                claims: claim_refs(live),
                pod_uid: pod_uid.to_owned(),
                attempts,
                retry_after,
                reason: reason.clone(),
                gave_up: gave_up.is_some(),
                only_if_pod_gone,
            });
        }
        match gave_up {
            Some(why) => OrdinalState::Failed {
                attempts,
                last_failure: reason,
                reason: why,
            },
            None => {
                self.requeue_at(retry_after);
                OrdinalState::Retrying {
                    attempts,
                    retry_after: retry_after.to_string(),
                    last_failure: reason,
                }
            }
        }
    }
}

/// Plans one reconcile of a set: see the module documentation for the state machine.
pub fn plan(snap: &Snapshot, settings: &Settings, now: Timestamp) -> Plan {
    let mut p = Planner {
        settings,
        now,
        plan: Plan::default(),
    };
    let start = snap.ordinals_start;
    let end = start.saturating_add(snap.replicas.max(0));
    let in_range = |o: i32| o >= start && o < end;

    let ordinals: BTreeSet<i32> = snap
        .claims
        .iter()
        .map(|c| c.ordinal)
        .chain(
            snap.pods
                .iter()
                .filter(|p| matches!(p.kind, PodKind::Drain { .. }))
                .map(|p| p.ordinal),
        )
        .chain(snap.previous_done.keys().copied())
        .collect();

    // Slots taken by drains in flight (a drain pod exists, or a retry is pending).
    let mut busy: u32 = 0;
    // Ordinals ready for a new drain pod, highest first.
    let mut candidates: Vec<(i32, Vec<&Claim>, DrainRecord)> = Vec::new();

    for &o in ordinals.iter().rev() {
        let claims: Vec<&Claim> = snap.claims.iter().filter(|c| c.ordinal == o).collect();
        let live: Vec<&Claim> = claims.iter().copied().filter(|c| !c.terminating).collect();
        let record = merged_record(&live);
        let pod = snap.pods.iter().find(|p| p.ordinal == o);
        let here = in_range(o);

        let state = match pod {
            Some(pod) => match &pod.kind {
                PodKind::Other => {
                    if here {
                        if !record.is_empty() {
                            p.plan.actions.push(Action::ClearRecord {
                                ordinal: o,
                                claims: claim_refs(&live),
                            });
                        }
                        None
                    } else {
                        Some(OrdinalState::Waiting {
                            reason: format!("pod {} still exists", pod.name),
                        })
                    }
                }
                PodKind::Drain {
                    phase,
                    claims: drained,
                    failure,
                } => {
                    // A drain pod holds a slot until it is gone, whatever its phase.
                    busy += 1;
                    let ordinal = OrdinalObs {
                        ordinal: o,
                        in_range: here,
                        live: &live,
                        record: &record,
                        done_at: snap.previous_done.get(&o).copied(),
                    };
                    plan_drain_pod(&mut p, &ordinal, pod, *phase, drained, failure.as_ref())
                }
            },
            None if here => {
                if !record.is_empty() && !live.is_empty() {
                    p.plan.actions.push(Action::ClearRecord {
                        ordinal: o,
                        claims: claim_refs(&live),
                    });
                }
                None
            }
            None if live.is_empty() => {
                // Every claim is gone or being deleted: a drain finished here.
                let at = snap.previous_done.get(&o).copied().unwrap_or(now);
                (!claims.is_empty() || snap.previous_done.contains_key(&o))
                    .then(|| OrdinalState::Done { at: at.to_string() })
            }
            None => {
                if let Some(uid) = record
                    .pod_uid
                    .clone()
                    .filter(|u| Some(u) != record.counted_pod_uid.as_ref())
                {
                    // The drain pod of the current attempt vanished before it finished.
                    let state = p.record_failure(
                        o,
                        &live,
                        &record,
                        &uid,
                        "drain pod was deleted before it finished".to_owned(),
                        true,
                    );
                    if !matches!(state, OrdinalState::Failed { .. }) {
                        busy += 1;
                    }
                    Some(state)
                } else if let Some(why) = p.gave_up(&record) {
                    Some(OrdinalState::Failed {
                        attempts: record.attempts,
                        last_failure: record.last_failure.clone().unwrap_or_default(),
                        reason: why,
                    })
                } else if let Some(t) = record.retry_after.filter(|t| *t > now) {
                    busy += 1;
                    p.requeue_at(t);
                    Some(OrdinalState::Retrying {
                        attempts: record.attempts,
                        retry_after: t.to_string(),
                        last_failure: record.last_failure.clone().unwrap_or_default(),
                    })
                } else {
                    candidates.push((o, live.clone(), record.clone()));
                    None
                }
            }
        };
        if let Some(state) = state {
            p.plan.status.insert(o, state);
        }
    }

    let limit = settings.max_concurrent.unwrap_or(u32::MAX);
    for (o, live, record) in candidates {
        if busy < limit {
            busy += 1;
            let attempt = record.attempts + 1;
            p.plan.actions.push(Action::CreateDrainPod {
                ordinal: o,
                claims: live
                    .iter()
                    .map(|c| {
                        (
                            c.template.clone(),
                            ClaimRef {
                                name: c.name.clone(),
                                uid: c.uid.clone(),
                            },
                        )
                    })
                    .collect(),
                attempt,
                first_attempt_at: record.first_attempt_at.is_none().then_some(now),
            });
            p.plan.status.insert(o, OrdinalState::Draining { attempt });
            if let Some(deadline) = p.deadline_of(&DrainRecord {
                first_attempt_at: Some(record.first_attempt_at.unwrap_or(now)),
                ..record
            }) {
                p.requeue_at(deadline);
            }
        } else {
            p.plan.status.insert(
                o,
                OrdinalState::Waiting {
                    reason: format!("waiting for a drain slot ({limit} at a time)"),
                },
            );
        }
    }
    p.plan
}

/// What the planner knows of one ordinal while it looks at its drain pod.
struct OrdinalObs<'a> {
    ordinal: i32,
    in_range: bool,
    live: &'a [&'a Claim],
    record: &'a DrainRecord,
    /// When the last report showed it done.
    done_at: Option<Timestamp>,
}

fn plan_drain_pod(
    p: &mut Planner<'_>,
    obs: &OrdinalObs<'_>,
    pod: &PodObs,
    phase: DrainPhase,
    drained: &BTreeMap<String, String>,
    failure: Option<&String>,
) -> Option<OrdinalState> {
    let (o, here, live, record) = (obs.ordinal, obs.in_range, obs.live, obs.record);
    let delete = |why| Action::DeleteDrainPod {
        ordinal: o,
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        why,
    };
    match phase {
        DrainPhase::Succeeded => {
            // Only exactly the claims this pod drained; a claim recreated since is not touched.
            let done: Vec<ClaimRef> = live
                .iter()
                .filter(|c| drained.get(&c.name) == Some(&c.uid))
                .map(|c| ClaimRef {
                    name: c.name.clone(),
                    uid: c.uid.clone(),
                })
                .collect();
            if !done.is_empty() {
                p.plan.actions.push(Action::DeleteClaims {
                    ordinal: o,
                    claims: done,
                });
            }
            if !pod.terminating {
                p.plan.actions.push(delete(DeleteWhy::Succeeded));
            }
            (!here).then(|| OrdinalState::Done {
                at: obs.done_at.unwrap_or(p.now).to_string(),
            })
        }
        _ if pod.terminating => (!here).then(|| OrdinalState::Waiting {
            reason: format!("drain pod {} is terminating", pod.name),
        }),
        DrainPhase::Failed if here => {
            p.plan.actions.push(delete(DeleteWhy::Failed));
            if !live.is_empty() && !record.is_empty() {
                p.plan.actions.push(Action::ClearRecord {
                    ordinal: o,
                    claims: claim_refs(live),
                });
            }
            None
        }
        DrainPhase::Failed => {
            let reason = failure
                .cloned()
                .unwrap_or_else(|| "drain pod failed".to_owned());
            let state = if record.counted_pod_uid.as_deref() == Some(pod.uid.as_str()) {
                // Counted already (a crash between counting and deleting).
                match p.gave_up(record) {
                    Some(why) => OrdinalState::Failed {
                        attempts: record.attempts,
                        last_failure: record.last_failure.clone().unwrap_or(reason),
                        reason: why,
                    },
                    None => OrdinalState::Retrying {
                        attempts: record.attempts,
                        retry_after: record.retry_after.unwrap_or(p.now).to_string(),
                        last_failure: record.last_failure.clone().unwrap_or(reason),
                    },
                }
            } else {
                p.record_failure(o, live, record, &pod.uid, reason, false)
            };
            p.plan.actions.push(delete(DeleteWhy::Failed));
            Some(state)
        }
        DrainPhase::Pending | DrainPhase::Running | DrainPhase::Unknown => {
            if here && p.settings.on_scale_up == OnScaleUp::Cancel {
                p.plan.actions.push(delete(DeleteWhy::Cancelled));
                if !live.is_empty() {
                    p.plan.actions.push(Action::ClearRecord {
                        ordinal: o,
                        claims: claim_refs(live),
                    });
                }
                return None;
            }
            if let Some(deadline) = p.deadline_of(record) {
                if deadline <= p.now && record.counted_pod_uid.as_deref() == Some(pod.uid.as_str())
                {
                    // Counted already (a crash between counting and deleting).
                    p.plan.actions.push(delete(DeleteWhy::DeadlineExceeded));
                    return Some(OrdinalState::Failed {
                        attempts: record.attempts,
                        last_failure: record.last_failure.clone().unwrap_or_default(),
                        reason: format!("deadline passed at {deadline}"),
                    });
                }
                if deadline <= p.now {
                    let state = p.record_failure(
                        o,
                        live,
                        record,
                        &pod.uid,
                        "deadline exceeded".to_owned(),
                        false,
                    );
                    p.plan.actions.push(delete(DeleteWhy::DeadlineExceeded));
                    return Some(state);
                }
                p.requeue_at(deadline);
            }
            if !live.is_empty() && record.pod_uid.as_deref() != Some(pod.uid.as_str()) {
                p.plan.actions.push(Action::RecordDrainPod {
                    ordinal: o,
                    claims: claim_refs(live),
                    pod_uid: pod.uid.clone(),
                });
            }
            Some(OrdinalState::Draining {
                attempt: record.attempts + 1,
            })
        }
    }
}

#[cfg(test)]
mod tests;
