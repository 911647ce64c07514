//! The progress a drain pod publishes on itself
//! ([`pod_annotations::PROGRESS`](crate::pod_annotations::PROGRESS)): what moved, what is left,
//! and when that last changed. The `drainer` writes it; a user's own image may too.
//!
//! ```json
//! {"recordsMoved":120,"recordsRemaining":880,"bytesMoved":12288000,"bytesRemaining":90112000,
//!  "bytesSent":12353536,"changedAt":"2026-11-23T10:00:05Z"}
//! ```

use serde::{Deserialize, Serialize};

/// A drain's progress.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainProgress {
    /// Records moved so far.
    pub records_moved: u64,
    /// Records still to move.
    pub records_remaining: u64,
    /// Bytes moved so far.
    pub bytes_moved: u64,
    /// Bytes still to move.
    pub bytes_remaining: u64,
    /// Bytes put on the wire so far, records still in flight and resends included: grows while
    /// one large record streams, so a drain that moves a single big record is not taken for
    /// stalled. `0` from writers that do not count it.
    #[serde(default)]
    pub bytes_sent: u64,
    /// RFC 3339 time the counters last changed (or the drain started).
    pub changed_at: String,
}

impl DrainProgress {
    /// The annotation value.
    pub fn render(&self) -> String {
        serde_json::to_string(self).expect("progress serializes")
    }

    /// Reads an annotation value; `None` if it is not this format.
    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    /// Whether the moved/remaining counters differ from `other`'s (the time aside).
    pub fn counters_differ(&self, other: &Self) -> bool {
        (
            self.records_moved,
            self.records_remaining,
            self.bytes_moved,
            self.bytes_remaining,
            self.bytes_sent,
        ) != (
            other.records_moved,
            other.records_remaining,
            other.bytes_moved,
            other.bytes_remaining,
            other.bytes_sent,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_in_the_documented_format() {
        let p = DrainProgress {
            records_moved: 120,
            records_remaining: 880,
            bytes_moved: 12_288_000,
            bytes_remaining: 90_112_000,
            bytes_sent: 12_353_536,
            changed_at: "2026-11-23T10:00:05Z".into(),
        };
        let text = p.render();
        assert_eq!(
            text,
            r#"{"recordsMoved":120,"recordsRemaining":880,"bytesMoved":12288000,"bytesRemaining":90112000,"bytesSent":12353536,"changedAt":"2026-11-23T10:00:05Z"}"#
        );
        assert_eq!(DrainProgress::parse(&text), Some(p.clone()));
        assert_eq!(DrainProgress::parse("{"), None);
        assert_eq!(DrainProgress::parse("{}"), None);
        let mut later = p.clone();
        later.changed_at = "2026-11-23T10:00:10Z".into();
        assert!(!p.counters_differ(&later));
        later.records_moved += 1;
        assert!(p.counters_differ(&later));
        let mut streaming = p.clone();
        streaming.bytes_sent += 65_536;
        assert!(
            p.counters_differ(&streaming),
            "bytes on the wire are progress, though no record finished"
        );
    }

    #[test]
    fn a_writer_that_does_not_count_bytes_sent_still_parses() {
        let old = r#"{"recordsMoved":1,"recordsRemaining":2,"bytesMoved":3,"bytesRemaining":4,"changedAt":"2026-11-23T10:00:05Z"}"#;
        assert_eq!(DrainProgress::parse(old).map(|p| p.bytes_sent), Some(0));
    }
}
