//! Drain slots: which waiting ordinals may start a drain now, highest first, within the set's
//! concurrency.

use super::actions::{Action, ClaimRef, OrdinalState};
use super::observed::DrainRecord;
use super::ordinal::{Planner, add};
use super::settings::NewDrains;

impl Planner<'_> {
    /// Starts new drains in the free slots, highest ordinal first.
    pub(super) fn assign_slots(&mut self) {
        let limit = self.settings.max_concurrent.unwrap_or(u32::MAX);
        let candidates = std::mem::take(&mut self.candidates);
        for (o, live, record) in candidates {
            let template_hash = match &self.settings.new_drains {
                NewDrains::Allowed { template_hash } => template_hash.clone(),
                NewDrains::Stopped { why } => {
                    let reason = format!("no new drain: {why}");
                    self.plan.status.insert(o, OrdinalState::Waiting { reason });
                    continue;
                }
            };
            if self.busy >= limit {
                let reason = format!("waiting for a drain slot ({limit} at a time)");
                self.plan.status.insert(o, OrdinalState::Waiting { reason });
                continue;
            }
            self.busy += 1;
            let attempt = record.attempts + 1;
            let new_series = record
                .first_attempt_at
                .is_none()
                .then_some((self.now, template_hash));
            self.act(Action::CreateDrainPod {
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
                avoid_nodes: record.lost_nodes.clone(),
                new_series,
            });
            self.plan.status.insert(
                o,
                OrdinalState::Draining {
                    attempt,
                    progress: None,
                    note: None,
                },
            );
            if let Some(deadline) = self.deadline_of(&DrainRecord {
                first_attempt_at: Some(record.first_attempt_at.unwrap_or(self.now)),
                ..record
            }) {
                self.requeue_at(deadline);
            }
            self.requeue_at(add(self.now, self.settings.stuck_after));
        }
    }
}
