//! The rules for an ordinal that comes back in range while its drain is in flight (`cancel` or
//! `finish`).

use jiff::Timestamp;

use super::actions::{Action, DeleteWhy, OrdinalState};
use super::observed::DrainPod;
use super::ordinal::{Ordinal, Planner, add};
use super::settings::NewDrains;

use crate::config::OnScaleUp;

impl Planner<'_> {
    /// A scale-up brought back an ordinal whose drain has not finished.
    pub(super) fn returned(
        &mut self,
        ord: &Ordinal<'_>,
        drain: &DrainPod,
        delete: impl Fn(DeleteWhy, bool) -> Action,
    ) -> Option<OrdinalState> {
        let finish = self.settings.on_scale_up == OnScaleUp::Finish
            && matches!(self.settings.new_drains, NewDrains::Allowed { .. })
            && !ord.live.is_empty()
            && drain.started;
        if !finish {
            self.act(delete(DeleteWhy::Cancelled, true));
            self.clear_record(ord);
            return None;
        }
        let returned_at = match ord.record.returned_at {
            None => {
                self.act(Action::RecordReturn {
                    ordinal: ord.ordinal,
                    claims: ord.live_refs(),
                    at: self.now,
                });
                self.now
            }
            Some(at) => at,
        };
        // The returning pod waits as long as the drain makes progress, and at most
        // `scale_up_wait` without any (measured from the return or the last progress).
        let progressed = drain
            .progress
            .as_ref()
            .and_then(|p| p.changed_at.parse::<Timestamp>().ok());
        let wait_until = add(
            progressed.map_or(returned_at, |p| p.max(returned_at)),
            self.settings.scale_up_wait,
        );
        if wait_until <= self.now {
            self.act(delete(DeleteWhy::ScaleUpWaitExceeded, true));
            self.clear_record(ord);
            return None;
        }
        self.requeue_at(wait_until);
        Some(OrdinalState::Draining {
            attempt: ord.record.attempts + 1,
            progress: drain.progress.clone(),
            note: None,
        })
    }
}
