//! Versioned records: the on-disk format the drainer's built-in modes share with the example
//! datastore, and the rule that decides which copy of a key wins when copies meet.
//!
//! Every write of a key gets a [`Version`] from the server that takes it: a hybrid logical clock
//! reading (milliseconds and a counter) and the server's node name. Versions are unique per
//! write and totally ordered (milliseconds, then counter, then node name), so two copies of one
//! key always compare the same way on both sides. A delete is a write too: it leaves a
//! *tombstone* ([`Kind::Tombstone`]) with its own version, so an older copy of the key met later
//! (on a claim a drain has not emptied yet) cannot bring the key back.
//!
//! # The handover (peer contract)
//!
//! A sender hands a copy to its owner with `PUT /records/{key}`, the value as body and its
//! version in [`VERSION_HEADER`] (a tombstone: [`TOMBSTONE_HEADER`]`: 1` and no body). The
//! owner keeps the higher version of its copy and the one sent ([`keeps_incoming`]), durably,
//! and answers `2xx` with the version it now holds in [`VERSION_HEADER`]. The sender deletes
//! its copy only if that version is at least the one it sent ([`acknowledges`]); any other
//! answer, or none, keeps it.
//!
//! # The record file
//!
//! One file per key, named after the key: a [`HEADER_LEN`]-byte header ([`Header::encode`]),
//! then the value. A file that does not start with a header is a *legacy* record (written
//! before versions): its whole content is the value and its version is [`Version::ZERO`],
//! older than any versioned write.

use std::fmt;
use std::str::FromStr;

/// Longest key, in bytes.
pub const MAX_KEY_LEN: usize = 200;

/// Whether `key` is a valid record key, and so a record file's name: 1 to [`MAX_KEY_LEN`]
/// characters of `[A-Za-z0-9._-]`, not starting with `.` (names starting with `.` are the
/// server's own files).
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && !key.starts_with('.')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Prefix of the temporary files of writes in progress (never acknowledged: not records).
pub const TEMP_PREFIX: &str = ".tmp-";

/// The server's clock file (its high-water mark), and the prefix of its temporary copy.
pub const CLOCK_FILE: &str = ".clock";

/// HTTP header carrying a record's version (sent with a handover, answered by the owner and by
/// client writes).
pub const VERSION_HEADER: &str = "x-record-version";

/// HTTP header marking a handed-over copy as a tombstone (value `1`; the body is empty).
pub const TOMBSTONE_HEADER: &str = "x-record-tombstone";

/// HTTP header naming the pod a handover is meant for (its name). The peer refuses a handover
/// meant for another pod (`421 Misdirected Request`: the address now belongs to someone else)
/// and names itself in the same header of its answer; the sender takes an answer naming another
/// pod as no acknowledgement.
pub const OWNER_HEADER: &str = "x-record-owner";

/// HTTP header with the UID of the pod a handover is meant for, as the sender read it from the
/// API; checked and answered like [`OWNER_HEADER`] (a pod of the same name in another namespace,
/// or a recreated one, has another UID).
pub const OWNER_UID_HEADER: &str = "x-record-owner-uid";

/// Length of a record file's header, in bytes.
pub const HEADER_LEN: usize = 128;

/// The bytes a record file's header starts with.
pub const MAGIC: &[u8] = b"DSR1 ";

/// Longest node name in a version (a DNS label: a pod name fits).
pub const MAX_NODE_LEN: usize = 63;

/// The version of one write of a key. Ordered by `millis`, then `counter`, then `node`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// The clock reading's milliseconds (wall-clock based, never going back on one server).
    pub millis: u64,
    /// Orders writes within one millisecond, and writes that must follow a higher version seen.
    pub counter: u32,
    /// The server that took the write: breaks ties between servers deterministically.
    pub node: String,
}

impl Version {
    /// The version `millis.counter.node`.
    pub fn new(millis: u64, counter: u32, node: impl Into<String>) -> Self {
        Self {
            millis,
            counter,
            node: node.into(),
        }
    }

    /// The version of a legacy record (written before versions): older than any other.
    pub const ZERO: Version = Version {
        millis: 0,
        counter: 0,
        node: String::new(),
    };
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.millis, self.counter, self.node)
    }
}

/// A version that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid record version {text:?}: want <millis>.<counter>.<node>")]
pub struct InvalidVersion {
    /// The rejected text.
    pub text: String,
}

impl FromStr for Version {
    type Err = InvalidVersion;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || InvalidVersion {
            text: text.to_owned(),
        };
        let (millis, rest) = text.split_once('.').ok_or_else(bad)?;
        let (counter, node) = rest.split_once('.').ok_or_else(bad)?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(millis) || !digits(counter) || !valid_node(node) {
            return Err(bad());
        }
        let version = Version {
            millis: millis.parse().map_err(|_| bad())?,
            counter: counter.parse().map_err(|_| bad())?,
            node: node.to_owned(),
        };
        // A node-less version is only ever the legacy zero.
        if version.node.is_empty() && version != Version::ZERO {
            return Err(bad());
        }
        Ok(version)
    }
}

/// Whether `node` can name a server in a version: up to [`MAX_NODE_LEN`] characters of
/// `[A-Za-z0-9._-]` (empty only in [`Version::ZERO`]).
pub fn valid_node(node: &str) -> bool {
    node.len() <= MAX_NODE_LEN
        && node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// What a record file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A value (the bytes after the header).
    Value,
    /// A tombstone: the key was deleted by the write of this version.
    Tombstone,
}

/// A record file's header: the kind and version of the copy.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// Value or tombstone.
    pub kind: Kind,
    /// The write's version.
    pub version: Version,
}

impl Header {
    /// The header of a legacy record file: a value at [`Version::ZERO`].
    pub fn legacy() -> Self {
        Self {
            kind: Kind::Value,
            version: Version::ZERO,
        }
    }

    /// The header at the start of a record file (`prefix`: its first [`HEADER_LEN`] bytes, or
    /// all of a shorter file) and the offset where the value starts: a parsed header and
    /// [`HEADER_LEN`], or a legacy record ([`Header::legacy`]) and 0.
    pub fn of_file(prefix: &[u8]) -> (Self, u64) {
        match Self::parse(prefix) {
            Some(header) => (header, HEADER_LEN as u64),
            None => (Self::legacy(), 0),
        }
    }

    /// The fixed-size encoding: `DSR1 <V|T> <millis, 20 digits> <counter, 10 digits> <node>`,
    /// padded with spaces, ending in a newline at byte [`HEADER_LEN`]` - 1`.
    ///
    /// # Panics
    /// If the node name is not [`valid_node`] (a [`Version`] built by hand).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        assert!(valid_node(&self.version.node), "invalid node name");
        let kind = match self.kind {
            Kind::Value => 'V',
            Kind::Tombstone => 'T',
        };
        let text = format!(
            "DSR1 {kind} {:020} {:010} {}",
            self.version.millis, self.version.counter, self.version.node
        );
        let mut out = [b' '; HEADER_LEN];
        out[..text.len()].copy_from_slice(text.as_bytes());
        out[HEADER_LEN - 1] = b'\n';
        out
    }

    /// Reads a header from the start of a record file; `None` if `bytes` does not start with
    /// one (a legacy record: see [`Header::legacy`]).
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let head = bytes.get(..HEADER_LEN)?;
        if !head.starts_with(MAGIC) || head[HEADER_LEN - 1] != b'\n' {
            return None;
        }
        let text = std::str::from_utf8(&head[MAGIC.len()..HEADER_LEN - 1]).ok()?;
        let mut fields = text.split_ascii_whitespace();
        let kind = match fields.next()? {
            "V" => Kind::Value,
            "T" => Kind::Tombstone,
            _ => return None,
        };
        let millis: u64 = fields.next()?.parse().ok()?;
        let counter: u32 = fields.next()?.parse().ok()?;
        let node = fields.next().unwrap_or("");
        if fields.next().is_some() || !valid_node(node) {
            return None;
        }
        Some(Self {
            kind,
            version: Version {
                millis,
                counter,
                node: node.to_owned(),
            },
        })
    }
}

/// The merge rule on the receiving side: whether an incoming copy of `incoming` version
/// replaces the copy held (`None`: no copy, not even a tombstone). Only a strictly higher
/// version replaces; an equal one is the same write, and the held copy stays.
pub fn keeps_incoming(held: Option<&Version>, incoming: &Version) -> bool {
    held.is_none_or(|held| incoming > held)
}

/// The rule on the sending side: whether the owner's answer (the version it holds after the
/// handover) lets the sender delete its copy of version `sent`.
pub fn acknowledges(held: &Version, sent: &Version) -> bool {
    held >= sent
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(millis: u64, counter: u32, node: &str) -> Version {
        Version::new(millis, counter, node)
    }

    #[test]
    fn versions_order_by_millis_then_counter_then_node() {
        assert!(v(1, 9, "z") < v(2, 0, "a"));
        assert!(v(2, 0, "z") < v(2, 1, "a"));
        assert!(v(2, 1, "a") < v(2, 1, "b"));
        assert!(Version::ZERO < v(0, 0, "a"));
    }

    #[test]
    fn versions_print_and_parse() {
        let version = v(1_700_000_000_123, 7, "datastore-2.x");
        assert_eq!(version.to_string(), "1700000000123.7.datastore-2.x");
        assert_eq!(version.to_string().parse::<Version>().unwrap(), version);
        assert_eq!("0.0.".parse::<Version>().unwrap(), Version::ZERO);
        for bad in [
            "", "1", "1.2", "a.2.n", "1.b.n", "1.2.", "1.2.a b", "-1.2.n",
        ] {
            assert!(bad.parse::<Version>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn headers_encode_to_a_fixed_size_and_parse_back() {
        let header = Header {
            kind: Kind::Tombstone,
            version: v(u64::MAX, u32::MAX, &"n".repeat(MAX_NODE_LEN)),
        };
        let bytes = header.encode();
        assert_eq!(bytes.len(), HEADER_LEN);
        assert_eq!(Header::parse(&bytes), Some(header));
        let legacy = Header::legacy();
        assert_eq!(Header::parse(&legacy.encode()), Some(legacy));
    }

    #[test]
    fn a_file_without_a_header_is_legacy() {
        assert_eq!(Header::parse(b"plain value"), None);
        assert_eq!(Header::parse(&[b'x'; 300]), None);
        let mut almost = Header::legacy().encode();
        almost[HEADER_LEN - 1] = b' ';
        assert_eq!(Header::parse(&almost), None);
        let mut bad_kind = Header::legacy().encode();
        bad_kind[MAGIC.len()] = b'X';
        assert_eq!(Header::parse(&bad_kind), None);
    }

    fn version() -> impl Strategy<Value = Version> {
        (0u64..4, 0u32..4, prop::sample::select(vec!["a", "b", "c"]))
            .prop_map(|(m, c, n)| v(m, c, n))
    }

    /// A copy held after a sequence of handovers: the merge as the receiver applies it.
    fn merge(held: Option<Version>, incoming: &Version) -> Option<Version> {
        if keeps_incoming(held.as_ref(), incoming) {
            Some(incoming.clone())
        } else {
            held
        }
    }

    proptest! {
        #[test]
        fn the_copy_held_is_the_highest_version_sent_in_any_order(
            versions in prop::collection::vec(version(), 1..8),
            seed in any::<u64>(),
        ) {
            let mut shuffled = versions.clone();
            // A deterministic shuffle from the seed: order of arrival must not matter.
            let len = shuffled.len();
            for i in 0..len {
                let j = (seed as usize).wrapping_mul(i + 7) % len;
                shuffled.swap(i, j);
            }
            let held = shuffled.iter().fold(None, merge);
            prop_assert_eq!(held.as_ref(), versions.iter().max());
            // Sending a copy again (a retry, a restarted drain) changes nothing.
            let again = versions.iter().fold(held.clone(), merge);
            prop_assert_eq!(again, held);
        }

        #[test]
        fn a_sender_deletes_its_copy_only_if_the_owner_holds_it_or_newer(
            held in prop::option::of(version()),
            sent in version(),
        ) {
            let after = merge(held.clone(), &sent).expect("something is held after a handover");
            prop_assert!(acknowledges(&after, &sent));
            prop_assert!(after >= sent);
            if let Some(held) = held {
                prop_assert_eq!(after == sent, sent >= held);
            }
        }

        #[test]
        fn comparisons_agree_on_both_sides(a in version(), b in version()) {
            // An owner holding `a` replaces it with `b` exactly when it could not have
            // acknowledged `b` with `a`: one total order, the same on both sides.
            prop_assert_eq!(keeps_incoming(Some(&a), &b), b > a);
            prop_assert_eq!(acknowledges(&a, &b), b <= a);
            prop_assert_eq!(a.cmp(&b), b.cmp(&a).reverse());
        }

        #[test]
        fn headers_round_trip(m in any::<u64>(), c in any::<u32>(), node in "[a-z0-9.-]{1,63}", tomb in any::<bool>()) {
            let header = Header {
                kind: if tomb { Kind::Tombstone } else { Kind::Value },
                version: v(m, c, &node),
            };
            prop_assert_eq!(Header::parse(&header.encode()), Some(header.clone()));
            prop_assert_eq!(header.version.to_string().parse::<Version>().unwrap(), header.version);
        }
    }
}
