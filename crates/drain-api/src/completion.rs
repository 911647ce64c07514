//! The completion record: the one proof of a finished drain that an interrupted program cannot
//! produce. A drain pod's program writes it to its container's termination message
//! (`/dev/termination-log`) as its very last step, and only when the drain finished; the
//! controller reads it back from the container's `state.terminated.message` and deletes the
//! claims it names only if they are exactly the claims the drain pod was bound to.
//!
//! The controller hands each container of a drain pod the exact text in
//! [`env::COMPLETION_RECORD`](crate::env::COMPLETION_RECORD), so a shell drain ends with one line:
//!
//! ```sh
//! printf '%s' "$DRAIN_COMPLETION_RECORD" > /dev/termination-log
//! ```
//!
//! The text is JSON naming the drained claims by name and UID:
//!
//! ```json
//! {"drainCompleted":{"claims":{"data-web-2":"6f0c4f3e-…"}}}
//! ```
//!
//! A program that is stopped (SIGTERM, a liveness probe's kill, an eviction), fails, or drains
//! only part of the data never writes it; an exit code of 0 alone proves nothing under the
//! default proof ([`annotations::SUCCESS_PROOF`](crate::annotations::SUCCESS_PROOF)).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where a container's termination message is written unless its `terminationMessagePath` says
/// otherwise.
pub const TERMINATION_LOG: &str = "/dev/termination-log";

/// A completion record: the claims a finished drain drained, `{name: UID}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletionRecord {
    /// The drained claims, by name, with their UIDs.
    pub claims: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Wire {
    drain_completed: CompletionRecord,
}

impl CompletionRecord {
    /// The record of a drain of `claims` (`{name: UID}`).
    pub fn new(claims: BTreeMap<String, String>) -> Self {
        Self { claims }
    }

    /// The text written to the termination message.
    pub fn render(&self) -> String {
        serde_json::to_string(&Wire {
            drain_completed: self.clone(),
        })
        .expect("a completion record serializes")
    }

    /// Reads a termination message: `Some` only if the whole message, surrounding whitespace
    /// aside, is a completion record.
    pub fn parse(message: &str) -> Option<Self> {
        serde_json::from_str::<Wire>(message.trim())
            .ok()
            .map(|w| w.drain_completed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn renders_the_documented_text() {
        let record = CompletionRecord::new(BTreeMap::from([("data-web-2".into(), "u-1".into())]));
        assert_eq!(
            record.render(),
            r#"{"drainCompleted":{"claims":{"data-web-2":"u-1"}}}"#
        );
    }

    #[test]
    fn reads_only_a_whole_record() {
        let text = r#"{"drainCompleted":{"claims":{"data-web-2":"u-1"}}}"#;
        assert!(CompletionRecord::parse(&format!("{text}\n")).is_some());
        for other in [
            "",
            "done",
            "{}",
            r#"{"drainCompleted":{}}"#,
            r#"{"drainCompleted":{"claims":{"a":"b"}},"more":1}"#,
            &format!("starting\n{text}"),
            &format!("{text} trailing"),
        ] {
            assert_eq!(CompletionRecord::parse(other), None, "{other:?}");
        }
    }

    proptest! {
        #[test]
        fn render_then_parse_is_identity(claims in proptest::collection::btree_map("[a-z0-9-]{1,20}", "[a-f0-9-]{1,36}", 0..4)) {
            let record = CompletionRecord::new(claims);
            prop_assert_eq!(CompletionRecord::parse(&record.render()), Some(record));
        }
    }
}
