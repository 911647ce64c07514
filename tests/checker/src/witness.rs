//! What I1 is judged from (issue 21): the drains' own word that they finished, as plain data.
//!
//! A drain's completion is told by the drain program itself, never inferred from an exit code
//! or a clock. In the fault suite each drain script, as its very last step, sends the
//! completion record it was handed (the claims it drained, by name and UID) to a witness the
//! test runs on the host; the witness notes the [`Instant`] each [`Report`] arrived, on the same
//! clock as the history's [`Entry::at`](crate::history::Entry::at). A script stopped early (a
//! SIGTERM it answers with `exit 0`, a probe's kill, an eviction) never gets there.
//!
//! The text is the drain contract's completion record, read here from its documented form
//! (the checker shares no code with the controller): exactly
//! `{"drainCompleted":{"claims":{"<claim name>":"<claim UID>",...}}}`.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Deserialize;

/// One completion report that reached the witness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// When the witness received it (before it acknowledged it).
    pub at: Instant,
    /// The claims the drain says it drained: name → UID.
    pub claims: BTreeMap<String, String>,
}

impl Report {
    /// A report received at `at`: `Some` only if the whole text, surrounding whitespace aside,
    /// is a completion record naming at least one claim.
    pub fn parse(text: &str, at: Instant) -> Option<Self> {
        let claims = completion_record(text)?;
        Some(Self { at, claims })
    }

    /// Whether it names the claim `name` with the UID `uid`.
    pub fn names(&self, name: &str, uid: &str) -> bool {
        self.claims.get(name).is_some_and(|u| u == uid)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Wire {
    drain_completed: Completed,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Completed {
    claims: BTreeMap<String, String>,
}

/// Reads a completion record (`{"drainCompleted":{"claims":{name: UID}}}`, surrounding
/// whitespace aside): the claims it names, `None` for any other text or a record naming none.
pub fn completion_record(text: &str) -> Option<BTreeMap<String, String>> {
    let wire: Wire = serde_json::from_str(text.trim()).ok()?;
    let claims = wire.drain_completed.claims;
    (!claims.is_empty() && claims.iter().all(|(n, u)| !n.is_empty() && !u.is_empty()))
        .then_some(claims)
}

/// Where a scenario's I1 takes the drains' word from.
#[derive(Clone, Debug)]
pub enum Witness {
    /// The reports the drain scripts sent the test's witness. A deleted claim needs a report
    /// naming its name and UID that arrived before its deletion was first seen. Independent of
    /// the controller: it is how the scripts, not the cluster, tell their completion.
    Reports(Vec<Report>),
    /// For drains whose program the test cannot make report (the example datastore's own
    /// `drainer` image): the completion record in a drain pod's termination message
    /// (`state.terminated.message`), as the checker's own watch saw it. A deleted claim needs a
    /// drain pod whose container's message names its name and UID, seen at an earlier revision.
    /// This is the evidence the controller itself reads under its default proof, so it checks
    /// the controller's use of it (UIDs, order, recreated claims, exit 0 without it) but not
    /// whether the drain program wrote it only when done: for that the data is the witness (I4,
    /// every record readable exactly once).
    TerminationMessages,
}

impl Witness {
    /// What it is, for the verdict.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Reports(_) => "the drains' reports to the witness",
            Self::TerminationMessages => "the drain pods' termination messages",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_documented_record_only() {
        let now = Instant::now();
        let text = r#"{"drainCompleted":{"claims":{"data-web-2":"u-2","logs-web-2":"u-3"}}}"#;
        let r = Report::parse(&format!("{text}\n"), now).expect("a record");
        assert!(r.names("data-web-2", "u-2") && r.names("logs-web-2", "u-3"));
        assert!(!r.names("data-web-2", "u-3") && !r.names("data-web-1", "u-2"));
        for other in [
            "",
            "ok",
            "{}",
            r#"{"drainCompleted":{}}"#,
            r#"{"drainCompleted":{"claims":{}}}"#,
            r#"{"drainCompleted":{"claims":{"data-web-2":""}}}"#,
            r#"{"drainCompleted":{"claims":{"data-web-2":"u-2"}},"more":1}"#,
            r#"{"drainCompleted":{"claims":{"data-web-2":"u-2"},"more":1}}"#,
            r#"{"drainCompleted":{"claims":{"data-web-2":7}}}"#,
            &format!("starting\n{text}"),
            &format!("{text} trailing"),
        ] {
            assert_eq!(Report::parse(other, now), None, "{other:?}");
        }
    }
}
