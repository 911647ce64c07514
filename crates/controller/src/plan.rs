//! The drain state machine: a snapshot of one StatefulSet and `now` → the actions that move each
//! removed ordinal's drain forward, and the state of every ordinal for the status report. Pure:
//! no client, no clock; the whole drain lifecycle is here and nowhere else.
//!
//! Per ordinal that has claims or a drain pod, highest first, by what holds the ordinal's name:
//!
//! | holds the name | observed                                       | actions                         |
//! |----------------|------------------------------------------------|---------------------------------|
//! | nothing        | out of range, live claims, slot free           | `CreateDrainPod`                |
//! | nothing        | out of range, a claim template's claim missing | `Warn` (blocked), claims kept   |
//! | nothing        | the current attempt's pod vanished             | `RecordFailure` (backoff)       |
//! | nothing        | out of range, a claim held (restored)          | wait for the scale-up           |
//! | nothing        | back in range, drain record on the claims      | `ClearRecord`                   |
//! | stateful pod   | out of range (terminating or not)              | wait for it to go               |
//! | stateful pod   | being deleted past its grace, on a node not ready | `RecordFence`; `Warn` once the node is lost |
//! | nothing        | the removed pod's fence node not ready again   | wait (blocked), claims kept     |
//! | foreign pod    | labelled as our drain pod, not owned by the set| `Warn` (blocked), never deleted |
//! | unknown pod    | made by neither the set nor us (by hand?)      | `Warn` (blocked), no slot, recheck |
//! | drain pod      | exited 0 with proof it finished (see below)    | `DeleteClaims` → `DeleteDrainPod` |
//! | drain pod      | exited 0, no proof (stopped, no record)        | `RecordFailure` → `DeleteDrainPod`; claims kept |
//! | drain pod      | Failed                                         | `RecordFailure` → `DeleteDrainPod` |
//! | drain pod      | stuck (cannot start, crash-looping)            | `RecordFailure` → `DeleteDrainPod` |
//! | drain pod      | not finished, its node lost (not ready, gone)  | `Warn` (stuck), `DeleteDrainPod`; claims kept |
//! | drain pod      | unschedulable: its volumes bound to a node it cannot use | `Warn` (blocked), kept; or replaced without the lost nodes it avoided |
//! | drain pod      | not started, its claims gone or being deleted  | `DeleteDrainPod` (nothing to drain) |
//! | drain pod      | not started, built from an older template      | `DeleteDrainPod` (replaced)     |
//! | drain pod      | running past the deadline                      | `RecordFailure` → `DeleteDrainPod` |
//! | drain pod      | running, UID not recorded on the claims        | `RecordDrainPod`                |
//! | drain pod      | back in range, `cancel` (or drains stopped)    | `DeleteDrainPod` → `ClearRecord`|
//! | drain pod      | back in range, `finish`                        | `RecordReturn`; cancel after the wait |
//!
//! A new series of attempts (its start and template hash) is recorded on the claims together
//! with the first drain pod's UID, after the create, so nothing delays the create. When a crash
//! comes in between, the claims record an earlier series or none while a drain pod of today's
//! template runs: that pod's series (started at its creation) is the record its drain is judged
//! by, and `RecordDrainPod`/`RecordFailure` write it.
//!
//! What proves a drain finished is the set's [`SuccessProof`] ([`finish`]): under the default
//! completion record, every container that uses a claim exited 0 with the record of exactly
//! the claims it uses ([`record_gaps`]: nothing else counts, and no clock is read); under `exit-code`, the pod was seen
//! `Succeeded` with no deletion requested and no `DisruptionTarget` condition, and no container
//! has a liveness or startup probe. That observation is recorded on the claims
//! (`RecordSuccess`) before anything else is done, so a later deletion request cannot make it
//! unknown; what is not known is not proven, and the drain runs again.
//!
//! Invariants (property-tested below): a claim is deleted only when a drain pod of its ordinal
//! recorded that claim's UID and proved it finished by the set's proof; no drain pod is
//! created for an ordinal in range or whose name is taken; never more drains at once than
//! allowed; a drain pod believed unfinished is only deleted with a resourceVersion precondition
//! (the act step's withdrawal of a create the live read did not confirm is not planned here).

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;

use crate::config::SuccessProof;
pub use drain_api::progress::DrainProgress;

mod actions;
mod failures;
mod nodes;
mod observed;
mod ordinal;
mod proof;
mod scale_up;
mod settings;
mod slots;
mod success;

pub use actions::*;
pub use nodes::OUT_OF_SERVICE;
pub use observed::*;
pub use proof::*;
pub use settings::*;

pub use ordinal::backoff;
use ordinal::*;

/// Plans one reconcile of a set: see the module documentation for the state machine.
pub fn plan(snap: &Snapshot, settings: &Settings, now: Timestamp) -> Plan {
    let mut p = Planner {
        settings,
        set_name: &snap.set_name,
        claim_templates: &snap.claim_templates,
        nodes: &snap.nodes,
        now,
        plan: Plan::default(),
        busy: 0,
        candidates: Vec::new(),
    };
    let range = drain_api::names::OrdinalRange::new(Some(snap.ordinals_start), Some(snap.replicas))
        .with_reserved(snap.reserved.clone());

    let ordinals: BTreeSet<i32> = snap
        .claims
        .iter()
        .map(|c| c.ordinal)
        .chain(
            snap.pods
                .iter()
                .filter(|p| !matches!(p.kind, PodKind::Other))
                .map(|p| p.ordinal),
        )
        .chain(
            snap.previous
                .iter()
                .filter(|(_, s)| matches!(s, OrdinalState::Done { .. }))
                .map(|(o, _)| *o),
        )
        .collect();

    for &o in ordinals.iter().rev() {
        let claims: Vec<&Claim> = snap.claims.iter().filter(|c| c.ordinal == o).collect();
        let live: Vec<&Claim> = claims.iter().copied().filter(|c| !c.terminating).collect();
        let pod = snap.pods.iter().find(|p| p.ordinal == o);
        let (record, series) = record_of(merged_record(&live), pod, &settings.new_drains, now);
        let ord = Ordinal {
            ordinal: o,
            in_range: range.contains(o) || snap.also_held.as_ref().is_some_and(|r| r.contains(o)),
            record,
            series,
            claims,
            live,
            previous: snap.previous.get(&o),
        };
        let state = match pod {
            None => p.no_pod(&ord),
            Some(pod) => match &pod.kind {
                PodKind::Other => p.stateful_pod(&ord, pod),
                PodKind::Foreign => p.foreign_pod(&ord, pod),
                PodKind::Unknown => p.unknown_pod(&ord, pod),
                PodKind::Drain(drain) => {
                    // A drain pod holds a slot until it is gone, whatever its phase.
                    p.busy += 1;
                    p.drain_pod(&ord, pod, drain)
                }
            },
        };
        if let Some(state) = state {
            p.plan.status.insert(o, state);
        }
    }
    p.assign_slots();
    forget_oldest_done(&mut p.plan.status);
    p.plan
}

/// Most `done` ordinals the status keeps: the newest, so a long-lived set's status annotation
/// stays far below the API's 256 KiB for all annotations.
pub const DONE_KEPT: usize = 50;

/// Drops all but the [`DONE_KEPT`] newest `done` ordinals (by time, then ordinal; a time that
/// does not parse counts as oldest).
fn forget_oldest_done(status: &mut std::collections::BTreeMap<i32, OrdinalState>) {
    let mut done: Vec<(Option<Timestamp>, i32)> = status
        .iter()
        .filter_map(|(o, s)| match s {
            OrdinalState::Done { at } => Some((at.parse().ok(), *o)),
            _ => None,
        })
        .collect();
    if done.len() <= DONE_KEPT {
        return;
    }
    done.sort_unstable_by(|a, b| b.cmp(a));
    for (_, o) in &done[DONE_KEPT..] {
        status.remove(o);
    }
}

impl<'a> Planner<'a> {
    fn requeue_at(&mut self, t: Timestamp) {
        let d = until(self.now, t).max(Duration::from_millis(100));
        self.plan.requeue_after = Some(self.plan.requeue_after.map_or(d, |r| r.min(d)));
    }

    fn act(&mut self, action: Action) {
        self.plan.actions.push(action);
    }

    fn deadline_of(&self, record: &DrainRecord) -> Option<Timestamp> {
        Some(add(record.first_attempt_at?, self.settings.deadline?))
    }

    /// Whether the record belongs to a series run with another template than today's.
    fn stale_series(&self, record: &DrainRecord) -> bool {
        match (&self.settings.new_drains, &record.template_hash) {
            (NewDrains::Allowed { template_hash }, Some(h)) => h != template_hash,
            _ => false,
        }
    }

    fn clear_record(&mut self, ord: &Ordinal<'_>) {
        if !ord.live.is_empty() && !ord.record.is_empty() {
            self.act(Action::ClearRecord {
                ordinal: ord.ordinal,
                claims: ord.live_refs(),
            });
        }
    }

    /// Nothing holds the ordinal's name.
    fn no_pod(&mut self, ord: &Ordinal<'a>) -> Option<OrdinalState> {
        if ord.in_range {
            self.clear_record(ord);
            return None;
        }
        if ord.live.is_empty() {
            // Every claim is gone or being deleted: a drain finished here.
            let at = ord.done_at().unwrap_or_else(|| self.now.to_string());
            return (!ord.claims.is_empty() || ord.previous.is_some())
                .then_some(OrdinalState::Done { at });
        }
        if ord.record.held {
            // Restored from a retained volume: the set is about to bring its pod back.
            let held: Vec<&str> = ord
                .live
                .iter()
                .filter(|c| c.record.held)
                .map(|c| c.name.as_str())
                .collect();
            return Some(OrdinalState::Waiting {
                reason: format!(
                    "claim {} is held (annotation {}: restored from a retained volume): no drain \
                     starts; scale the set up to bring its pod back, or remove the annotation to \
                     drain it",
                    held.join(", "),
                    drain_api::claim_annotations::HOLD
                ),
            });
        }
        let record = &ord.record;
        let stale = self.stale_series(record);
        if !stale
            && let Some(uid) = record
                .pod_uid
                .clone()
                .filter(|u| Some(u) != record.counted_pod_uid.as_ref())
        {
            // The drain pod of the current attempt vanished before it finished.
            let state = self.record_failure(
                ord,
                &uid,
                FailureKind::Vanished,
                "drain pod was deleted before it finished".to_owned(),
            );
            if !matches!(state, OrdinalState::Failed { .. }) {
                self.busy += 1;
            }
            return Some(state);
        }
        if !stale {
            if let Some(why) = self.gave_up(record) {
                return Some(OrdinalState::Failed {
                    attempts: record.attempts,
                    last_failure: record.last_failure.clone().unwrap_or_default(),
                    reason: why,
                });
            }
            if let Some(t) = record.retry_after.filter(|t| *t > self.now) {
                self.busy += 1;
                self.requeue_at(t);
                return Some(OrdinalState::Retrying {
                    attempts: record.attempts,
                    retry_after: t.to_string(),
                    last_failure: record.last_failure.clone().unwrap_or_default(),
                });
            }
        }
        if let Some(state) = self.missing_claims(ord) {
            return Some(state);
        }
        if let Some(state) = self.fenced(ord) {
            return Some(state);
        }
        let record = if stale {
            DrainRecord::default()
        } else {
            record.clone()
        };
        self.candidates
            .push((ord.ordinal, ord.live.clone(), record));
        None
    }

    /// Why no drain pod may start for `ord` while a claim template has no live claim of it, if
    /// one has none: a drain pod without that claim would prove the others drained and get them
    /// deleted while nothing drained the missing one's data (nor may an empty directory stand in
    /// for it). A claim being deleted is waited for; a claim that is gone is a Warning.
    fn missing_claims(&mut self, ord: &Ordinal<'_>) -> Option<OrdinalState> {
        let unlive = |t: &&String| !ord.live.iter().any(|c| c.template == **t);
        let (terminating, gone): (Vec<&String>, Vec<&String>) = self
            .claim_templates
            .iter()
            .filter(unlive)
            .partition(|t| ord.claims.iter().any(|c| c.template == **t));
        let name = |t: &String| drain_api::names::claim_name(t, self.set_name, ord.ordinal);
        if !gone.is_empty() {
            let missing: Vec<String> = gone.iter().map(|t| name(t)).collect();
            let live: Vec<&str> = ord.live.iter().map(|c| c.name.as_str()).collect();
            let reason = format!(
                "claim {} of this ordinal is missing (deleted by hand?), so no drain pod starts:                  without it nothing could drain its data, and a drain of the others alone would                  get them deleted; claims {} are kept. Recreate the missing claim (an empty one                  lets the drain run), scale the set up over ordinal {}, or delete the kept                  claims by hand if their data is not needed",
                missing.join(", "),
                live.join(", "),
                ord.ordinal
            );
            return self.blocked(ord, reason);
        }
        if !terminating.is_empty() {
            let names: Vec<String> = terminating.iter().map(|t| name(t)).collect();
            return Some(OrdinalState::Waiting {
                reason: format!(
                    "claim {} of this ordinal is being deleted; no drain pod starts until it is                      gone or recreated",
                    names.join(", ")
                ),
            });
        }
        None
    }

    /// The StatefulSet's own pod (or another pod that is not ours) holds the name.
    fn stateful_pod(&mut self, ord: &Ordinal<'_>, pod: &PodObs) -> Option<OrdinalState> {
        if ord.in_range {
            self.clear_record(ord);
            return None;
        }
        if let Some(state) = self.removed_pod_on_lost_node(ord, pod) {
            return Some(state);
        }
        if let Some(why) = self.stuck_deleting(pod) {
            let reason = format!("{why}; its drain cannot start until it is gone");
            return self.blocked(ord, reason);
        }
        if let Some(due) = pod.deletion.as_ref().and_then(|d| d.due)
            && due > self.now
        {
            // Still there after its grace period: its node is read then (is it lost?).
            self.requeue_at(add(due, Duration::from_secs(2)));
        }
        Some(OrdinalState::Waiting {
            reason: format!("pod {} still exists", pod.name),
        })
    }

    /// A drain pod of an earlier set of the same name holds the name: report, never touch.
    fn foreign_pod(&mut self, ord: &Ordinal<'_>, pod: &PodObs) -> Option<OrdinalState> {
        if ord.in_range && ord.live.is_empty() {
            return None;
        }
        let reason = format!(
            "pod {} is labelled as a drain pod of this set's name but is not owned by this set \
             (left by an earlier set of the same name?); it is left alone: delete it to {}",
            pod.name,
            unblocks(ord)
        );
        self.blocked(ord, reason)
    }

    /// A pod made neither by the set nor by us holds the name: report, never touch, hold no
    /// slot, and look again soon (its deletion wakes no watch).
    fn unknown_pod(&mut self, ord: &Ordinal<'_>, pod: &PodObs) -> Option<OrdinalState> {
        if ord.in_range && ord.live.is_empty() {
            return None;
        }
        self.requeue_at(add(self.now, RECHECK_UNKNOWN_POD));
        let reason = format!(
            "pod {} holds the name of this ordinal's drain pod but was made neither by the set \
             nor by this controller (created by hand?); it is left alone and the claims are \
             kept: delete it to {}",
            pod.name,
            unblocks(ord)
        );
        self.blocked(ord, reason)
    }

    /// The ordinal is blocked for `reason`: warned once (while the reason stays the same).
    fn blocked(&mut self, ord: &Ordinal<'_>, reason: String) -> Option<OrdinalState> {
        let state = OrdinalState::Blocked { reason };
        if ord.previous != Some(&state) {
            let OrdinalState::Blocked { reason } = &state else {
                unreachable!()
            };
            self.act(Action::Warn {
                ordinal: ord.ordinal,
                reason: "DrainBlocked",
                message: reason.clone(),
            });
        }
        Some(state)
    }

    /// One of our drain pods holds the name: dispatches on what became of it.
    fn drain_pod(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let recorded = ord
            .live
            .iter()
            .any(|c| c.record.succeeded_pod_uid.as_deref() == Some(pod.uid.as_str()));
        // The proof the pod was made under counts too: the completion record if either asks it.
        let proof = match drain.settings {
            Some(PodSettings {
                proof: SuccessProof::CompletionRecord,
                ..
            }) => SuccessProof::CompletionRecord,
            _ => self.settings.proof,
        };
        match finish(pod, drain, proof, recorded) {
            Finish::Proven { record_first } => {
                return self.succeeded(ord, pod, drain, record_first);
            }
            Finish::Unproven { kind, why } => return self.unproven(ord, pod, kind, why),
            Finish::NotFinished => {}
        }
        if let Some(state) = self.on_lost_node(ord, pod, drain) {
            return Some(state);
        }
        if pod.terminating {
            return self.terminating(ord, pod);
        }
        if drain.phase == DrainPhase::Failed {
            return self.failed(ord, pod, drain);
        }
        // Pending, Running or Unknown: the drain has not finished.
        if ord.in_range {
            return self.returned(ord, drain, |why, rv| {
                delete_unfinished(ord, pod, drain, why, rv)
            });
        }
        self.unfinished(ord, pod, drain)
    }

    /// The drain pod, not finished, is being deleted: wait until it is gone.
    fn terminating(&mut self, ord: &Ordinal<'_>, pod: &PodObs) -> Option<OrdinalState> {
        if ord.in_range {
            return None;
        }
        if ord.counted(pod) {
            return Some(self.counted_state(&ord.record, "drain pod stopped"));
        }
        if let Some(why) = self.stuck_deleting(pod) {
            // A stuck attempt: counted (so the deadline and the attempt limit give up), and
            // told in the failure's Warning.
            return Some(self.record_failure(ord, &pod.uid, FailureKind::Stuck, why));
        }
        Some(OrdinalState::Waiting {
            reason: format!("drain pod {} is terminating", pod.name),
        })
    }

    /// Why `pod`, being deleted, is stuck, if it still holds its name `stuck_after` past the
    /// end of its grace period: the finalizers that keep it, or its node, which does not
    /// confirm it stopped. Requeues for the time it would be stuck otherwise.
    fn stuck_deleting(&mut self, pod: &PodObs) -> Option<String> {
        let deletion = pod.deletion.as_ref()?;
        let late = add(deletion.due?, self.settings.stuck_after);
        if late > self.now {
            self.requeue_at(late);
            return None;
        }
        let after = humantime::format_duration(self.settings.stuck_after);
        let held = if !deletion.finalizers.is_empty() {
            format!(
                "finalizers {} keep it: remove them (kubectl patch pod {} --type json -p \
                 '[{{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}}]') once what \
                 they wait for is done",
                deletion.finalizers.join(", "),
                pod.name
            )
        } else {
            let node = deletion
                .node
                .as_deref()
                .map_or_else(|| "its node".to_owned(), |n| format!("its node {n}"));
            format!(
                "{node} does not confirm it stopped (unreachable?): if the node is gone, delete \
                 its Node object, or force the pod's deletion (kubectl delete pod {} \
                 --grace-period=0 --force) once you know it no longer runs",
                pod.name
            )
        };
        Some(format!(
            "pod {} is still terminating {after} after its grace period ended ({}); {held}",
            pod.name,
            deletion.due.map(|d| d.to_string()).unwrap_or_default()
        ))
    }

    /// A drain pod that has not finished, of an ordinal still out of range: stuck, stalled,
    /// made from an older template, past the deadline, or draining.
    fn unfinished(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        if ord.live.is_empty() && !drain.started {
            // Its claims went before it started (deleted by hand, or the pod was made from a
            // view that had not seen them go): it could never start, and it holds the name
            // the returning pod needs. Only if it still has not started when deleted.
            self.act(delete_unfinished(
                ord,
                pod,
                drain,
                DeleteWhy::ClaimsGone,
                true,
            ));
            return Some(OrdinalState::Waiting {
                reason: format!(
                    "the claims of drain pod {} went before it started: removing it",
                    pod.name
                ),
            });
        }
        if let Some(state) = self.node_bound(ord, pod, drain) {
            return Some(state);
        }
        if let Some(state) = self.stuck_attempt(ord, pod, drain) {
            return Some(state);
        }
        if let Some(state) = self.stalled_attempt(ord, pod, drain) {
            return Some(state);
        }
        if let Some(state) = self.template_changed(ord, pod, drain) {
            return Some(state);
        }
        if let Some(state) = self.deadline_exceeded(ord, pod, drain) {
            return Some(state);
        }
        if !ord.live.is_empty() && ord.record.pod_uid.as_deref() != Some(pod.uid.as_str()) {
            self.act(Action::RecordDrainPod {
                ordinal: ord.ordinal,
                claims: ord.live_refs(),
                pod_uid: pod.uid.clone(),
                series: ord.series.clone(),
            });
        }
        let note = self
            .lingering(ord, pod, drain)
            .or_else(|| self.quiet(ord, pod, drain))
            .or_else(|| self.node_unreadable(ord, drain));
        Some(OrdinalState::Draining {
            attempt: ord.record.attempts + 1,
            progress: drain.progress.clone(),
            note,
        })
    }

    /// A drain pod kept running, without proof, by containers that do not exit after another
    /// exited 0 (a mesh proxy): said in the status, and once in a Warning, instead of holding
    /// the slot silently until the deadline.
    fn lingering(&mut self, ord: &Ordinal<'_>, pod: &PodObs, drain: &DrainPod) -> Option<String> {
        if drain.lingering.is_empty() {
            return None;
        }
        let note = format!(
            "containers {} still run after another exited 0 without proof it finished, so drain \
             pod {} does not end (an injected proxy or log shipper?): have the drain write its \
             completion record, or keep such sidecars out of drain pods (docs/annotations.md: Sidecars)",
            drain.lingering.join(", "),
            pod.name
        );
        Some(self.noted(ord, "DrainPodNotEnding", note))
    }

    /// `note` for the ordinal's `draining` status, told in a Warning `reason` unless the last
    /// status already showed it.
    fn noted(&mut self, ord: &Ordinal<'_>, reason: &'static str, note: String) -> String {
        let told = matches!(ord.previous, Some(OrdinalState::Draining { note: Some(n), .. }) if *n == note);
        if !told {
            self.act(Action::Warn {
                ordinal: ord.ordinal,
                reason,
                message: note.clone(),
            });
        }
        note
    }

    /// A running drain pod that published no progress and changed no container state for the
    /// quiet time (a hook blocked on a dead connection): said in the status, once in a Warning,
    /// and counted in the metric; never stopped for it (`drain-stall-seconds` does that).
    fn quiet(&mut self, ord: &Ordinal<'_>, pod: &PodObs, drain: &DrainPod) -> Option<String> {
        let quiet = self.settings.quiet_after?;
        if !drain.running {
            return None;
        }
        let since = drain
            .last_progress()
            .into_iter()
            .chain(drain.changed_at)
            .max()?;
        let at = add(since, quiet);
        if at > self.now {
            self.requeue_at(at);
            return None;
        }
        let note = format!(
            "drain pod {} has published no progress and no container of it started or stopped \
             for {} (since {since}): it may be blocked (a hook waiting on a dead connection?). \
             It is left running: read its logs, or delete it to retry",
            pod.name,
            humantime::format_duration(quiet)
        );
        self.plan.quiet.insert(ord.ordinal);
        Some(self.noted(ord, "DrainQuiet", note))
    }

    /// A drain pod made from another template than today's is replaced (not a failed attempt)
    /// when nothing of it runs: it has not started, or it failed and waits for the kubelet to
    /// restart it in place (`restartPolicy: OnFailure`), which would run the old template
    /// again. A running one finishes.
    fn template_changed(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let NewDrains::Allowed { template_hash } = &self.settings.new_drains else {
            return None;
        };
        let idle = !drain.started || (drain.restarts > 0 && !drain.running);
        let changed = idle
            && drain
                .template_hash
                .as_ref()
                .is_some_and(|h| h != template_hash);
        if !changed {
            return None;
        }
        self.act(delete_unfinished(
            ord,
            pod,
            drain,
            DeleteWhy::TemplateChanged,
            true,
        ));
        Some(OrdinalState::Waiting {
            reason: format!("drain template changed: replacing drain pod {}", pod.name),
        })
    }
}

#[cfg(test)]
mod tests;
