//! The rules for drains that did not finish: failed, interrupted or unproven attempts, stuck
//! and stalled drain pods, the deadline, and how each is counted toward giving up.

use super::actions::{Action, DeleteWhy, FailureKind, OrdinalState};
use super::observed::{DrainPod, DrainRecord, PodObs};
use super::ordinal::{Ordinal, Planner, add, backoff, delete_finished, delete_unfinished};

impl Planner<'_> {
    /// Why retrying has stopped for this record, if it has.
    pub(super) fn gave_up(&self, record: &DrainRecord) -> Option<String> {
        if let Some(max) = self.settings.max_attempts
            && record.attempts >= max
        {
            return Some(format!("{} of {max} attempts failed", record.attempts));
        }
        let deadline = self.deadline_of(record)?;
        let next = record.retry_after.unwrap_or(self.now).max(self.now);
        (next >= deadline).then(|| format!("deadline passed at {deadline}"))
    }

    /// The state of an ordinal whose last failure is already counted.
    pub(super) fn counted_state(&mut self, record: &DrainRecord, fallback: &str) -> OrdinalState {
        let last_failure = record
            .last_failure
            .clone()
            .unwrap_or_else(|| fallback.to_owned());
        match self.gave_up(record) {
            Some(reason) => OrdinalState::Failed {
                attempts: record.attempts,
                last_failure,
                reason,
            },
            None => {
                let at = record.retry_after.unwrap_or(self.now);
                if at > self.now {
                    self.requeue_at(at);
                }
                OrdinalState::Retrying {
                    attempts: record.attempts,
                    retry_after: at.to_string(),
                    last_failure,
                }
            }
        }
    }

    /// Counts a failure of `pod_uid` and says what state follows.
    pub(super) fn record_failure(
        &mut self,
        ord: &Ordinal<'_>,
        pod_uid: &str,
        kind: FailureKind,
        reason: String,
    ) -> OrdinalState {
        let record = &ord.record;
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
        if !ord.live.is_empty() {
            self.act(Action::RecordFailure {
                ordinal: ord.ordinal,
                claims: ord.live_refs(),
                pod_uid: pod_uid.to_owned(),
                kind,
                attempts,
                retry_after,
                reason: reason.clone(),
                gave_up: gave_up.is_some(),
                only_if_pod_gone: kind == FailureKind::Vanished,
                series: ord.series.clone(),
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

    /// The state after a failed attempt by `pod`: counted the first time it is seen (with
    /// `reason`), read back from the record after that (`fallback` if it has no reason).
    pub(super) fn failed_attempt(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        kind: FailureKind,
        fallback: &str,
        reason: String,
    ) -> OrdinalState {
        if ord.counted(pod) {
            self.counted_state(&ord.record, fallback)
        } else {
            self.record_failure(ord, &pod.uid, kind, reason)
        }
    }

    /// The drain pod exited 0 without proof that its drain finished (asked to stop, no
    /// completion record, ...): a failed attempt, and the pod goes; the claims are kept.
    pub(super) fn unproven(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        kind: FailureKind,
        why: String,
    ) -> Option<OrdinalState> {
        let delete = (!pod.terminating).then(|| delete_finished(ord, pod, DeleteWhy::Failed));
        if ord.in_range {
            self.plan.actions.extend(delete);
            self.clear_record(ord);
            return None;
        }
        if ord.live.is_empty() {
            // Nothing left to drain (the claims are gone or going): the pod only holds the name.
            self.plan.actions.extend(delete);
            return Some(match ord.done_at() {
                Some(at) => OrdinalState::Done { at },
                None => OrdinalState::Waiting {
                    reason: format!("drain pod {} is terminating", pod.name),
                },
            });
        }
        let state = self.failed_attempt(
            ord,
            pod,
            kind,
            "exited 0 without proof it finished",
            format!("{why}; the claims are kept and the drain runs again"),
        );
        self.plan.actions.extend(delete);
        Some(state)
    }

    /// The drain pod failed: a failed attempt (none if the ordinal is back), and the pod goes.
    pub(super) fn failed(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let delete = delete_unfinished(ord, pod, drain, DeleteWhy::Failed, false);
        if ord.in_range {
            self.act(delete);
            self.clear_record(ord);
            return None;
        }
        let reason = drain
            .failure
            .clone()
            .unwrap_or_else(|| "drain pod failed".to_owned());
        let state = self.failed_attempt(ord, pod, FailureKind::Failed, &reason, reason.clone());
        self.act(delete);
        Some(state)
    }

    /// A stuck drain pod is a failed attempt: counted, and the pod goes.
    pub(super) fn stuck_attempt(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let reason = self.stuck(drain)?;
        let state = self.failed_attempt(
            ord,
            pod,
            FailureKind::Stuck,
            &reason,
            format!("stuck: {reason}"),
        );
        self.act(delete_unfinished(ord, pod, drain, DeleteWhy::Stuck, true));
        if let OrdinalState::Retrying { .. } = state {
            return Some(OrdinalState::Stuck {
                attempt: ord.record.attempts + 1,
                reason,
            });
        }
        Some(state)
    }

    /// A stalled drain pod is a failed attempt: counted, and the pod goes.
    pub(super) fn stalled_attempt(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let reason = self.stalled(drain)?;
        let state = self.failed_attempt(
            ord,
            pod,
            FailureKind::Stalled,
            &reason,
            format!("stalled: {reason}"),
        );
        self.act(delete_unfinished(ord, pod, drain, DeleteWhy::Stalled, true));
        Some(state)
    }

    /// A drain pod still running at the series' deadline is a failed attempt: counted, and the
    /// pod goes. Before the deadline, requeues at it.
    pub(super) fn deadline_exceeded(
        &mut self,
        ord: &Ordinal<'_>,
        pod: &PodObs,
        drain: &DrainPod,
    ) -> Option<OrdinalState> {
        let deadline = self.deadline_of(&ord.record)?;
        if deadline > self.now {
            self.requeue_at(deadline);
            return None;
        }
        let state = self.failed_attempt(
            ord,
            pod,
            FailureKind::DeadlineExceeded,
            "deadline exceeded",
            "deadline exceeded".to_owned(),
        );
        self.act(delete_unfinished(
            ord,
            pod,
            drain,
            DeleteWhy::DeadlineExceeded,
            true,
        ));
        Some(state)
    }

    /// Why a drain pod that has not finished is stuck, if it is; requeues at the time it would
    /// become stuck otherwise.
    pub(super) fn stuck(&mut self, drain: &DrainPod) -> Option<String> {
        if drain.restarts >= self.settings.max_restarts {
            let why = drain.failure.as_deref().unwrap_or("crash loop");
            return Some(format!(
                "containers restarted {} times ({why})",
                drain.restarts
            ));
        }
        let blocker = drain.blocker.as_ref().map(|b| {
            format!("{}: {}", b.reason, b.message)
                .trim_end_matches([':', ' '])
                .to_owned()
        });
        if drain.blocker.as_ref().is_some_and(|b| b.definitive) {
            return blocker;
        }
        if drain.started && blocker.is_none() {
            return None;
        }
        let since = drain.created_at.unwrap_or(self.now);
        let stuck_at = add(since, self.settings.stuck_after);
        if stuck_at <= self.now {
            let after = humantime::format_duration(self.settings.stuck_after);
            return Some(blocker.unwrap_or_else(|| format!("not started after {after}")));
        }
        self.requeue_at(stuck_at);
        None
    }

    /// Why a running drain pod is stalled, if the set asks for stall detection and it is:
    /// its published progress (or, before any, its start) is older than the stall time.
    /// Requeues at the time it would stall otherwise. The progress time is the drain pod's
    /// clock; the stall time should be well above any clock skew between nodes.
    pub(super) fn stalled(&mut self, drain: &DrainPod) -> Option<String> {
        let stall = self.settings.stall_after?;
        if !drain.started {
            return None;
        }
        let changed = drain.published_progress_at();
        let since = drain.last_progress().unwrap_or(self.now);
        let stalls_at = add(since, stall);
        if stalls_at <= self.now {
            let what = if changed.is_some() {
                "progress"
            } else {
                "published progress"
            };
            return Some(format!(
                "no {what} for {} (since {since})",
                humantime::format_duration(stall)
            ));
        }
        self.requeue_at(stalls_at);
        None
    }
}
