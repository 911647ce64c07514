//! The invariants, checked by replaying a [`History`] in revision order: I1 and I2 over the
//! whole history ([`check`]), I3 on the state it ends in ([`unsettled`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use crate::history::{Change, History, Obj};
use crate::{APPROVED_ANNOTATION, DRAIN_POD_LABEL, RECORD_PREFIX, TEMPLATE_ANNOTATION};

/// What the checker found in a history.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Every violation of I1 or I2, with the revision and the evidence.
    pub violations: Vec<String>,
    /// Entries replayed.
    pub entries: usize,
    /// Claims whose deletion was checked (I1).
    pub claims_deleted: usize,
    /// Drain pods seen succeeding without having been asked to stop.
    pub drains_proven: usize,
    /// Drain pods seen finishing otherwise (failed, or exited 0 after a delete request).
    pub drains_not_proven: usize,
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
            "{} ({} entries, {} relists; I1: {} claim deletions checked, {} drains proven, {} \
             not proven; I2: {} stateful pod creations checked, {} unchecked)",
            if self.ok() { "I1, I2 hold" } else { "VIOLATED" },
            self.entries,
            self.gaps,
            self.claims_deleted,
            self.drains_proven,
            self.drains_not_proven,
            self.stateful_pods_created,
            self.unchecked_creations,
        )?;
        for v in &self.violations {
            write!(f, "\n  - {v}")?;
        }
        Ok(())
    }
}

/// A drain pod seen succeeding without having been asked to stop.
struct Proof {
    pod: String,
    /// Revision of its creation, when seen.
    created: Option<u64>,
    claims: BTreeSet<String>,
}

/// The objects alive at a point of the replay.
#[derive(Default)]
struct World {
    pods: BTreeMap<String, Pod>,
    claims: BTreeMap<String, PersistentVolumeClaim>,
    sets: BTreeMap<String, StatefulSet>,
    pod_created: BTreeMap<String, u64>,
    claim_created: BTreeMap<String, u64>,
    proofs: Vec<Proof>,
    proven: BTreeSet<String>,
    not_proven: BTreeMap<String, String>,
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

/// The claims a pod mounts, by name.
fn mounts(pod: &Pod) -> BTreeSet<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
        .collect()
}

/// Whether this state of a pod proves a successful drain: `Ok`, or why not.
pub fn proves_success(pod: &Pod) -> Result<(), String> {
    if stateful(pod) {
        return Err("a stateful pod".into());
    }
    let status = pod.status.as_ref().ok_or("no status")?;
    if status.phase.as_deref() != Some("Succeeded") {
        return Err(format!("phase {:?}", status.phase));
    }
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    if containers.is_empty() {
        return Err("no container statuses".into());
    }
    let mut finished = Vec::new();
    for c in containers {
        let t = c
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .ok_or_else(|| format!("container {} not terminated", c.name))?;
        if t.exit_code != 0 {
            return Err(format!("container {} exited {}", c.name, t.exit_code));
        }
        let at = t
            .finished_at
            .as_ref()
            .ok_or_else(|| format!("container {} has no finish time", c.name))?;
        finished.push(at.0.as_second());
    }
    if let Some(deleted) = &pod.metadata.deletion_timestamp {
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
        if grace <= 0 {
            return Err("deleted with a zero grace period: no request time".into());
        }
        let asked = deleted.0.as_second() - grace;
        if let Some(last) = finished.iter().copied().filter(|&f| f >= asked).max() {
            return Err(format!(
                "a container finished at {last}, not before the delete request at {asked}"
            ));
        }
    }
    Ok(())
}

impl World {
    fn upsert(&mut self, obj: &Obj, rv: u64, exact: bool, v: &mut Verdict) {
        match obj {
            Obj::Pod(pod) => self.upsert_pod(pod, rv, exact, v),
            Obj::Claim(claim) => {
                let uid = obj.uid();
                if !self.claims.contains_key(&uid) && exact {
                    self.claim_created.insert(uid.clone(), rv);
                }
                self.claims.insert(uid.clone(), (**claim).clone());
                if claim.metadata.deletion_timestamp.is_some() {
                    self.claim_deleted(claim, rv, false, v);
                }
            }
            Obj::Set(set) => {
                self.sets.insert(obj.uid(), (**set).clone());
            }
        }
    }

    fn upsert_pod(&mut self, pod: &Pod, rv: u64, exact: bool, v: &mut Verdict) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        if !self.pods.contains_key(&uid) {
            if exact {
                self.pod_created.insert(uid.clone(), rv);
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
        if self.proven.contains(&uid) {
            return;
        }
        match proves_success(pod) {
            Ok(()) => {
                self.proven.insert(uid.clone());
                self.not_proven.remove(&uid);
                v.drains_proven += 1;
                self.proofs.push(Proof {
                    pod: format!("{name} ({uid})"),
                    created: self.pod_created.get(&uid).copied(),
                    claims: mounts(pod),
                });
            }
            Err(why) => {
                let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                if !stateful(pod) && matches!(phase, Some("Succeeded" | "Failed")) {
                    self.not_proven.insert(uid, format!("{name}: {why}"));
                }
            }
        }
    }

    fn delete(&mut self, obj: &Obj, rv: u64, in_gap: bool, v: &mut Verdict) {
        let uid = obj.uid();
        match obj {
            Obj::Pod(_) => {
                self.pods.remove(&uid);
            }
            Obj::Claim(claim) => {
                self.claim_deleted(claim, rv, in_gap, v);
                self.claims.remove(&uid);
            }
            Obj::Set(_) => {
                self.sets.remove(&uid);
            }
        }
    }

    /// I1, once per claim: its deletion (first seen at `rv`) needs a proof from before.
    fn claim_deleted(
        &mut self,
        claim: &PersistentVolumeClaim,
        rv: u64,
        in_gap: bool,
        v: &mut Verdict,
    ) {
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        if !self.deletion_checked.insert(uid.clone()) {
            return;
        }
        v.claims_deleted += 1;
        let name = claim.metadata.name.clone().unwrap_or_default();
        let created = self.claim_created.get(&uid).copied();
        let proven = self.proofs.iter().any(|p| {
            p.claims.contains(&name)
                && match (created, p.created) {
                    (Some(c), Some(pc)) => pc > c,
                    _ => true,
                }
        });
        if proven {
            return;
        }
        let tried: Vec<&String> = self
            .not_proven
            .values()
            .filter(|w| w.starts_with(&format!("{}:", name_suffix_pod(&name))))
            .collect();
        let older: Vec<&String> = self
            .proofs
            .iter()
            .filter(|p| p.claims.contains(&name))
            .map(|p| &p.pod)
            .collect();
        v.violations.push(format!(
            "I1: claim {name} ({uid}) deleted {} with no drain pod that mounted it and succeeded \
             without being asked to stop (drain pods that finished otherwise: {tried:?}; proofs \
             older than this claim: {older:?})",
            if in_gap {
                "in a watch gap".to_owned()
            } else {
                format!("at revision {rv}")
            }
        ));
    }
}

/// The pod name a claim `<template>-<pod>` belongs to is not known without its set; for the
/// evidence in messages, anything after the first `-`.
fn name_suffix_pod(claim: &str) -> &str {
    claim.split_once('-').map_or(claim, |(_, pod)| pod)
}

fn replay(history: &History) -> (World, Verdict) {
    let mut world = World::default();
    let mut v = Verdict {
        entries: history.entries.len(),
        ..Verdict::default()
    };
    for e in &history.entries {
        match &e.change {
            Change::Applied(o) => world.upsert(o, e.rv, true, &mut v),
            Change::Listed(o) => world.upsert(o, e.rv, false, &mut v),
            Change::Deleted(o) => world.delete(o, e.rv, false, &mut v),
            Change::GoneInGap(o) => world.delete(o, e.rv, true, &mut v),
            Change::Relisted { .. } => v.gaps += 1,
        }
    }
    v.drains_not_proven = world.not_proven.len();
    (world, v)
}

/// Checks I1 and I2 over the whole history.
pub fn check(history: &History) -> Verdict {
    replay(history).1
}

/// I3 on the state the history ends in: what is not settled yet (empty once every orphaned
/// claim of an opted-in set is drained and gone, and nothing of ours is left). Claims of sets
/// that no longer exist are not drained by design and are not counted.
pub fn unsettled(history: &History) -> Vec<String> {
    let (world, _) = replay(history);
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
