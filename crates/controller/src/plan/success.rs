//! The rules for a drain proven finished: retain the volumes if asked, delete exactly the drained
//! claims (once approved, under manual approval), then the drain pod.

use jiff::Timestamp;

use super::actions::{Action, DeleteWhy, OrdinalState};
use super::observed::{Claim, DrainPod, PodObs};
use super::ordinal::{Ordinal, Planner, claim_refs, delete_finished};

impl Planner<'_> {
    /// The drain pod proved that it finished: its claims go, then the pod. With
    /// `record_first`, the observation that proves it is recorded on the claims first.
    pub(super) fn succeeded(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
        record_first: bool,
    ) -> Option<OrdinalState> {
        if record_first && !ord.live.is_empty() {
            self.act(Action::RecordSuccess {
                ordinal: ord.ordinal,
                claims: ord.live_refs(),
                pod_uid: pod.uid.clone(),
            });
        }
        // Only exactly the claims this pod drained; a claim recreated since is not touched.
        let drained: Vec<&Claim> = ord
            .live
            .iter()
            .copied()
            .filter(|c| drain.claims.get(&c.name) == Some(&c.uid))
            .collect();
        let manual =
            self.settings.manual_approval || drain.settings.is_some_and(|s| s.manual_approval);
        if manual {
            let unapproved: Vec<&Claim> = drained
                .iter()
                .copied()
                .filter(|c| !c.record.approved)
                .collect();
            if !unapproved.is_empty() {
                return self.awaiting_approval(ord, pod, &unapproved);
            }
        }
        let done = claim_refs(&drained);
        // The longer of the set's retention and the one the drain started under.
        let retain = self
            .settings
            .retain_volume_for
            .max(drain.settings.and_then(|s| s.retain_volume_for));
        if let Some(retain) = retain.filter(|_| !done.is_empty()) {
            self.act(Action::RetainVolumes {
                ordinal: ord.ordinal,
                claims: done.clone(),
                // Whole seconds: people read it, and repeat it in commands.
                until: self
                    .now
                    .checked_add(retain)
                    .and_then(|t| t.round(jiff::Unit::Second))
                    .unwrap_or(Timestamp::MAX),
            });
        }
        if !done.is_empty() {
            self.act(Action::DeleteClaims {
                ordinal: ord.ordinal,
                claims: done,
            });
        }
        if !pod.terminating {
            self.act(delete_finished(ord, pod, DeleteWhy::Succeeded));
        }
        (!ord.in_range).then(|| OrdinalState::Done {
            at: ord.done_at().unwrap_or_else(|| self.now.to_string()),
        })
    }

    /// A succeeded drain whose claims a person must approve before they are deleted: nothing is
    /// deleted; the drain pod keeps the name, but not a drain slot (its work is done). If the
    /// ordinal came back in range meanwhile, the drain pod goes and the claims stay for the
    /// returning pod.
    pub(super) fn awaiting_approval(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        unapproved: &[&Claim],
    ) -> Option<OrdinalState> {
        if ord.in_range {
            if !pod.terminating {
                self.act(delete_finished(ord, pod, DeleteWhy::ReturnedBeforeApproval));
            }
            self.clear_record(ord);
            return None;
        }
        self.busy = self.busy.saturating_sub(1);
        let since = match ord.previous {
            Some(OrdinalState::AwaitingApproval { since, .. }) => since.clone(),
            _ => {
                self.act(Action::AwaitApproval {
                    ordinal: ord.ordinal,
                    claims: claim_refs(unapproved),
                });
                self.now.to_string()
            }
        };
        Some(OrdinalState::AwaitingApproval {
            since,
            claims: unapproved.iter().map(|c| c.name.clone()).collect(),
        })
    }
}
