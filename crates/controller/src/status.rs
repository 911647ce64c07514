//! The drain status the controller writes on each StatefulSet (annotation
//! [`drain_api::annotations::STATUS`]): every ordinal being drained, waiting, failed or done,
//! and the set's problem if its drain settings are invalid.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::plan::OrdinalState;

/// The content of the status annotation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    /// State per ordinal (keys are the ordinals in decimal, for JSON).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ordinals: BTreeMap<String, OrdinalState>,
    /// Why the set's new drains are on hold (an invalid template or annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Actions that failed in the last reconcile, per ordinal (retried with backoff).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, String>,
    /// The controller runs with `--dry-run`: these states are what it would do; nothing was
    /// created or deleted.
    #[serde(default, rename = "dryRun", skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

impl StatusReport {
    /// A report of the planner's ordinal states, the set's problem and the failed actions.
    pub fn of(
        states: &BTreeMap<i32, OrdinalState>,
        problem: Option<String>,
        errors: &BTreeMap<i32, String>,
    ) -> Self {
        Self {
            ordinals: states
                .iter()
                .map(|(o, s)| (o.to_string(), s.clone()))
                .collect(),
            problem,
            errors: errors
                .iter()
                .map(|(o, e)| (o.to_string(), e.clone()))
                .collect(),
            dry_run: false,
        }
    }

    /// Parses the annotation; `None` if it is not a report.
    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    /// The annotation's text.
    pub fn render(&self) -> String {
        serde_json::to_string(self).expect("a report serializes")
    }

    /// The ordinals reported, with their states.
    pub fn states(&self) -> BTreeMap<i32, OrdinalState> {
        self.ordinals
            .iter()
            .filter_map(|(o, s)| Some((o.parse().ok()?, s.clone())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reads_done_ordinals() {
        let states = BTreeMap::from([
            (
                2,
                OrdinalState::Done {
                    at: "2026-01-01T00:00:00Z".to_owned(),
                },
            ),
            (
                1,
                OrdinalState::Draining {
                    attempt: 2,
                    progress: None,
                    note: None,
                },
            ),
            (
                0,
                OrdinalState::Failed {
                    attempts: 3,
                    last_failure: "container drain exited with code 1".to_owned(),
                    reason: "3 of 3 attempts failed".to_owned(),
                },
            ),
        ]);
        let report = StatusReport::of(&states, None, &BTreeMap::new());
        let text = report.render();
        assert_eq!(
            text,
            r#"{"ordinals":{"0":{"state":"failed","attempts":3,"lastFailure":"container drain exited with code 1","reason":"3 of 3 attempts failed"},"1":{"state":"draining","attempt":2},"2":{"state":"done","at":"2026-01-01T00:00:00Z"}}}"#
        );
        let parsed = StatusReport::parse(&text).unwrap();
        assert_eq!(parsed, report);
        assert_eq!(parsed.states(), states);
        let with_errors = StatusReport::of(
            &states,
            Some("bad template".to_owned()),
            &BTreeMap::from([(2, "failed to delete claim data-web-2: denied".to_owned())]),
        );
        let text = with_errors.render();
        assert!(text.ends_with(r#""problem":"bad template","errors":{"2":"failed to delete claim data-web-2: denied"}}"#), "{text}");
        assert_eq!(StatusReport::parse(&text), Some(with_errors));
        assert!(StatusReport::parse("not json").is_none());
        let mut dry = StatusReport::of(&states, None, &BTreeMap::new());
        dry.dry_run = true;
        let text = dry.render();
        assert!(text.ends_with(r#","dryRun":true}"#), "{text}");
        assert_eq!(StatusReport::parse(&text), Some(dry));
    }
}
