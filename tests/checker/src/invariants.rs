//! The invariants, checked by replaying a [`History`] in revision order: I1 and I2 over the
//! whole history ([`check`]), I3 on the state it ends in ([`unsettled`]).
//!
//! I1 is judged from the drains' own word ([`Witness`]), never from exit codes or clocks: a
//! claim may be deleted only once a drain told its completion naming that claim's name and
//! UID. The drain pods that exited 0 without having told it are counted
//! ([`Verdict::exits_unwitnessed`]): each is a claim a controller trusting exit 0 would have
//! deleted undrained.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Instant;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use crate::history::{Change, History, Obj};
use crate::witness::{Witness, completion_record};
use crate::{APPROVED_ANNOTATION, DRAIN_POD_LABEL, RECORD_PREFIX, TEMPLATE_ANNOTATION};

/// What the checker found in a history.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Every violation of I1 or I2, with the revision and the evidence.
    pub violations: Vec<String>,
    /// Entries replayed.
    pub entries: usize,
    /// What I1 took the drains' word from ([`Witness::describe`]).
    pub witness: &'static str,
    /// Claims whose deletion was checked (I1).
    pub claims_deleted: usize,
    /// Completions the drains told: reports received, or drain pods whose termination message
    /// was a completion record.
    pub completions_witnessed: usize,
    /// Drain pods seen ending (`Succeeded` or `Failed`).
    pub drain_pods_ended: usize,
    /// Drain pods seen `Succeeded` with every container exited 0 but no completion told while
    /// they ran (stopped by a SIGTERM they answered with `exit 0`, a probe's kill, an eviction):
    /// what a rule trusting exit 0 would have taken for a finished drain.
    pub exits_unwitnessed: usize,
    /// Stateful pods whose creation was checked (I2).
    pub stateful_pods_created: usize,
    /// Stateful pods first seen in a relist, whose creation instant is unknown (not checked).
    pub unchecked_creations: usize,
    /// Watch relists (gaps) during the recording.
    pub gaps: usize,
}

impl Verdict {
    /// Whether I1 and I2 held.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({} entries, {} relists; I1 from {}: {} claim deletions checked, {} completions \
             witnessed, {} drain pods ended, {} of them exited 0 without a witnessed completion; \
             I2: {} stateful pod creations checked, {} unchecked)",
            if self.ok() { "I1, I2 hold" } else { "VIOLATED" },
            self.entries,
            self.gaps,
            self.witness,
            self.claims_deleted,
            self.completions_witnessed,
            self.drain_pods_ended,
            self.exits_unwitnessed,
            self.stateful_pods_created,
            self.unchecked_creations,
        )?;
        for v in &self.violations {
            write!(f, "\n  - {v}")?;
        }
        Ok(())
    }
}

/// A drain pod as the replay saw it, for the count of exits without a witnessed completion.
struct DrainPod {
    name: String,
    claims: BTreeSet<String>,
    /// When it was first seen.
    first_seen: Instant,
    /// When it was first seen `Succeeded` or `Failed`, and whether every container exited 0.
    ended: Option<(Instant, bool)>,
    /// Whether a container's termination message was a completion record.
    recorded: bool,
}

/// The objects alive at a point of the replay, and what I1 needs to remember.
struct World<'w> {
    witness: &'w Witness,
    /// The first history entry's instant, for readable times in messages.
    start: Instant,
    /// When each claim (by UID) was first seen being deleted or gone.
    first_deleting: BTreeMap<String, Instant>,
    pods: BTreeMap<String, Pod>,
    claims: BTreeMap<String, PersistentVolumeClaim>,
    sets: BTreeMap<String, StatefulSet>,
    drains: BTreeMap<String, DrainPod>,
    /// Completion records seen in termination messages so far: (claim name, claim UID).
    records_seen: BTreeSet<(String, String)>,
    deletion_checked: BTreeSet<String>,
}

/// Whether a pod is controlled by a StatefulSet (a stateful pod, not a drain pod).
fn stateful(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "StatefulSet" && o.controller == Some(true))
}

/// Whether a pod is a drain pod (it carries the drain pod label).
fn drain_pod(pod: &Pod) -> bool {
    !stateful(pod)
        && pod
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(DRAIN_POD_LABEL))
}

/// The claims a pod mounts, by name.
fn mounts(pod: &Pod) -> BTreeSet<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
        .collect()
}

/// The completion records in a pod's containers' termination messages (current or last
/// state): every (claim name, claim UID) they name.
fn recorded_claims(pod: &Pod) -> BTreeSet<(String, String)> {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .flat_map(|c| [c.state.as_ref(), c.last_state.as_ref()])
        .flatten()
        .filter_map(|s| s.terminated.as_ref()?.message.as_deref())
        .filter_map(completion_record)
        .flatten()
        .collect()
}

/// Whether a pod ended `Succeeded` with every container terminated with exit code 0: what a
/// rule trusting exit 0 takes for a finished drain.
fn exited_0(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    status.phase.as_deref() == Some("Succeeded")
        && !containers.is_empty()
        && containers.iter().all(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        })
}

impl World<'_> {
    fn upsert(&mut self, obj: &Obj, rv: u64, at: Instant, exact: bool, v: &mut Verdict) {
        match obj {
            Obj::Pod(pod) => self.upsert_pod(pod, rv, at, exact, v),
            Obj::Claim(claim) => {
                self.claims.insert(obj.uid(), (**claim).clone());
                if claim.metadata.deletion_timestamp.is_some() {
                    self.claim_deleted(claim, rv, at, false, v);
                }
            }
            Obj::Set(set) => {
                self.sets.insert(obj.uid(), (**set).clone());
            }
        }
    }

    fn upsert_pod(&mut self, pod: &Pod, rv: u64, at: Instant, exact: bool, v: &mut Verdict) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        if !self.pods.contains_key(&uid) {
            if exact {
                if let Some(other) = self
                    .pods
                    .values()
                    .find(|p| p.metadata.name.as_deref() == Some(&name))
                {
                    v.violations.push(format!(
                        "I2: pod {name} ({uid}) created at revision {rv} while pod {} of that \
                         name still exists",
                        other.metadata.uid.as_deref().unwrap_or_default()
                    ));
                }
                if stateful(pod) {
                    v.stateful_pods_created += 1;
                    for claim in mounts(pod) {
                        let deleting = self.claims.values().find(|c| {
                            c.metadata.name.as_deref() == Some(&claim)
                                && c.metadata.deletion_timestamp.is_some()
                        });
                        if let Some(c) = deleting {
                            v.violations.push(format!(
                                "I2: stateful pod {name} created at revision {rv} while its \
                                 claim {claim} ({}) is being deleted",
                                c.metadata.uid.as_deref().unwrap_or_default()
                            ));
                        }
                    }
                }
            } else if stateful(pod) {
                v.unchecked_creations += 1;
            }
        }
        self.pods.insert(uid.clone(), pod.clone());
        if !drain_pod(pod) {
            return;
        }
        let records = recorded_claims(pod);
        let drain = self.drains.entry(uid).or_insert_with(|| DrainPod {
            name,
            claims: mounts(pod),
            first_seen: at,
            ended: None,
            recorded: false,
        });
        drain.recorded |= !records.is_empty();
        self.records_seen.extend(records);
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if drain.ended.is_none() && matches!(phase, Some("Succeeded" | "Failed")) {
            drain.ended = Some((at, exited_0(pod)));
        }
    }

    fn delete(&mut self, obj: &Obj, rv: u64, at: Instant, in_gap: bool, v: &mut Verdict) {
        let uid = obj.uid();
        match obj {
            Obj::Pod(_) => {
                self.pods.remove(&uid);
            }
            Obj::Claim(claim) => {
                self.claim_deleted(claim, rv, at, in_gap, v);
                self.claims.remove(&uid);
            }
            Obj::Set(_) => {
                self.sets.remove(&uid);
            }
        }
    }

    /// Seconds since the history started, for messages.
    fn since_start(&self, at: Instant) -> String {
        match at.checked_duration_since(self.start) {
            Some(d) => format!("+{:.3}s", d.as_secs_f64()),
            None => format!("-{:.3}s", self.start.duration_since(at).as_secs_f64()),
        }
    }

    /// I1, once per claim: its deletion, met at `rv` (received at `at`), needs the drains' word
    /// from before it was first seen.
    fn claim_deleted(
        &mut self,
        claim: &PersistentVolumeClaim,
        rv: u64,
        at: Instant,
        in_gap: bool,
        v: &mut Verdict,
    ) {
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        if !self.deletion_checked.insert(uid.clone()) {
            return;
        }
        v.claims_deleted += 1;
        let name = claim.metadata.name.clone().unwrap_or_default();
        let when = if in_gap {
            "in a watch gap".to_owned()
        } else {
            format!("at revision {rv}")
        };
        let evidence = match self.witness {
            Witness::Reports(reports) => {
                let seen = self.first_deleting.get(&uid).map_or(at, |&f| f.min(at));
                if reports.iter().any(|r| r.names(&name, &uid) && r.at < seen) {
                    return;
                }
                let naming: Vec<String> = reports
                    .iter()
                    .filter_map(|r| {
                        let u = r.claims.get(&name)?;
                        Some(format!("{u} at {}", self.since_start(r.at)))
                    })
                    .collect();
                format!(
                    "(first seen {}) with no completion report naming it before (reports naming \
                     {name}: {naming:?})",
                    self.since_start(seen)
                )
            }
            Witness::TerminationMessages => {
                if self.records_seen.contains(&(name.clone(), uid.clone())) {
                    return;
                }
                let naming: Vec<&String> = self
                    .records_seen
                    .iter()
                    .filter(|(n, _)| *n == name)
                    .map(|(_, u)| u)
                    .collect();
                format!(
                    "with no drain pod's completion record naming it seen before (records \
                     naming {name} for other UIDs: {naming:?})"
                )
            }
        };
        let exits: Vec<String> = self
            .drains
            .iter()
            .filter(|(_, d)| d.claims.contains(&name) && d.ended.is_some_and(|(_, ok)| ok))
            .map(|(pod_uid, d)| format!("{} ({pod_uid})", d.name))
            .collect();
        v.violations.push(format!(
            "I1: claim {name} ({uid}) deleted {when} {evidence}; drain pods that mounted it and \
             exited 0: {exits:?}"
        ));
    }

    /// Whether a drain pod told its completion while it ran.
    fn witnessed(&self, drain: &DrainPod) -> bool {
        match self.witness {
            Witness::Reports(reports) => {
                let Some((ended, _)) = drain.ended else {
                    return false;
                };
                reports.iter().any(|r| {
                    r.at >= drain.first_seen
                        && r.at <= ended
                        && r.claims.keys().any(|c| drain.claims.contains(c))
                })
            }
            Witness::TerminationMessages => drain.recorded,
        }
    }
}

/// When each claim (by UID) was first seen being deleted (a deletion timestamp, its deletion,
/// or gone in a watch gap).
fn first_deleting(history: &History) -> BTreeMap<String, Instant> {
    let mut first: BTreeMap<String, Instant> = BTreeMap::new();
    for e in &history.entries {
        let (obj, deleting) = match &e.change {
            Change::Applied(o) | Change::Listed(o) => (o, o.meta().deletion_timestamp.is_some()),
            Change::Deleted(o) | Change::GoneInGap(o) => (o, true),
            Change::Relisted { .. } => continue,
        };
        if deleting && matches!(obj, Obj::Claim(_)) {
            let at = first.entry(obj.uid()).or_insert(e.at);
            *at = (*at).min(e.at);
        }
    }
    first
}

fn replay<'w>(history: &History, witness: &'w Witness) -> (World<'w>, Verdict) {
    let mut world = World {
        witness,
        start: history
            .entries
            .iter()
            .map(|e| e.at)
            .min()
            .unwrap_or_else(Instant::now),
        first_deleting: first_deleting(history),
        pods: BTreeMap::new(),
        claims: BTreeMap::new(),
        sets: BTreeMap::new(),
        drains: BTreeMap::new(),
        records_seen: BTreeSet::new(),
        deletion_checked: BTreeSet::new(),
    };
    let mut v = Verdict {
        entries: history.entries.len(),
        witness: witness.describe(),
        ..Verdict::default()
    };
    for e in &history.entries {
        match &e.change {
            Change::Applied(o) => world.upsert(o, e.rv, e.at, true, &mut v),
            Change::Listed(o) => world.upsert(o, e.rv, e.at, false, &mut v),
            Change::Deleted(o) => world.delete(o, e.rv, e.at, false, &mut v),
            Change::GoneInGap(o) => world.delete(o, e.rv, e.at, true, &mut v),
            Change::Relisted { .. } => v.gaps += 1,
        }
    }
    v.completions_witnessed = match witness {
        Witness::Reports(reports) => reports.len(),
        Witness::TerminationMessages => world.drains.values().filter(|d| d.recorded).count(),
    };
    for d in world.drains.values() {
        if let Some((_, ok)) = d.ended {
            v.drain_pods_ended += 1;
            if ok && !world.witnessed(d) {
                v.exits_unwitnessed += 1;
            }
        }
    }
    (world, v)
}

/// Checks I1 (judged from `witness`) and I2 over the whole history.
pub fn check(history: &History, witness: &Witness) -> Verdict {
    replay(history, witness).1
}

/// I3 on the state the history ends in: what is not settled yet (empty once every orphaned
/// claim of an opted-in set is drained and gone, and nothing of ours is left). Claims of sets
/// that no longer exist are not drained by design and are not counted.
pub fn unsettled(history: &History) -> Vec<String> {
    let (world, _) = replay(history, &Witness::TerminationMessages);
    let mut out = Vec::new();
    for pod in world.pods.values() {
        if let Some(set) = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(DRAIN_POD_LABEL))
        {
            out.push(format!(
                "drain pod {} of set {set} is left (phase {:?})",
                pod.metadata.name.as_deref().unwrap_or_default(),
                pod.status.as_ref().and_then(|s| s.phase.clone())
            ));
        }
    }
    let live_sets: Vec<&StatefulSet> = world
        .sets
        .values()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .collect();
    for claim in world.claims.values() {
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        if claim.metadata.deletion_timestamp.is_some() {
            out.push(format!("claim {name} is still terminating"));
            continue;
        }
        let Some((set, ordinal)) = live_sets.iter().find_map(|s| owner_of(s, name)) else {
            continue;
        };
        let opted_in = set
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(TEMPLATE_ANNOTATION));
        let spec = set.spec.as_ref();
        let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
        let start = spec
            .and_then(|s| s.ordinals.as_ref())
            .and_then(|o| o.start)
            .unwrap_or(0);
        let in_range = ordinal >= start && ordinal - start < replicas;
        if opted_in && !in_range {
            out.push(format!("orphaned claim {name} is not drained"));
        }
        let record: Vec<&String> = claim
            .metadata
            .annotations
            .iter()
            .flatten()
            .map(|(k, _)| k)
            .filter(|k| k.starts_with(RECORD_PREFIX) && *k != APPROVED_ANNOTATION)
            .collect();
        if in_range && !record.is_empty() {
            out.push(format!("claim {name} in use still carries {record:?}"));
        }
    }
    let all_meta = world
        .pods
        .values()
        .map(|p| ("pod", &p.metadata))
        .chain(world.claims.values().map(|c| ("claim", &c.metadata)))
        .chain(world.sets.values().map(|s| ("statefulset", &s.metadata)));
    for (kind, meta) in all_meta {
        for f in meta.finalizers.iter().flatten() {
            if f.contains("statefulsets.kubernetes.io") || f.contains("drain") {
                out.push(format!(
                    "{kind} {} carries the finalizer {f}",
                    meta.name.as_deref().unwrap_or_default()
                ));
            }
        }
    }
    out
}

/// The set and ordinal a claim named `<template>-<set>-<ordinal>` belongs to.
fn owner_of<'a>(set: &'a StatefulSet, claim: &str) -> Option<(&'a StatefulSet, i32)> {
    let set_name = set.metadata.name.as_deref()?;
    set.spec
        .as_ref()?
        .volume_claim_templates
        .iter()
        .flatten()
        .find_map(|t| {
            let prefix = format!("{}-{set_name}-", t.metadata.name.as_deref()?);
            let ordinal = claim.strip_prefix(&prefix)?;
            if ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            ordinal.parse().ok()
        })
        .map(|o| (set, o))
}

#[cfg(test)]
mod tests;
