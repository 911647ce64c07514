//! I4 for the example datastore: the newest write of every key is held by exactly one pod (or,
//! for a deleted key, by none); nothing older, nothing twice, nothing nobody wrote.
//!
//! [`Writes`] records what one sequential client asked of each key, in order, and whether each
//! request was acknowledged; [`Writes::check`] judges what the pods hold against it. The
//! client's order is the truth: it sends a request only once the previous one was answered (or
//! given up), so a write acknowledged after another must win over it on every transfer path,
//! whichever pods the two copies landed on.

use std::collections::BTreeMap;

/// What the pods hold: pod name → key → value.
pub type Held = BTreeMap<String, BTreeMap<String, Vec<u8>>>;

/// One request a client sent for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Store this value under the key (a create or an overwrite).
    Put(Vec<u8>),
    /// Remove the key (the store keeps a tombstone).
    Delete,
}

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The server acknowledged it as durable.
    Acked,
    /// Sent, but no acknowledgement came back (an error or a lost connection): it may or may
    /// not have landed.
    Unanswered,
}

impl Outcome {
    /// [`Outcome::Acked`] for `Ok`, [`Outcome::Unanswered`] for `Err`.
    pub fn of<T, E>(result: &Result<T, E>) -> Self {
        match result {
            Ok(_) => Self::Acked,
            Err(_) => Self::Unanswered,
        }
    }
}

/// Every request one sequential client sent, per key, in the order it sent them.
#[derive(Debug, Clone, Default)]
pub struct Writes {
    keys: BTreeMap<String, Vec<(Op, Outcome)>>,
}

/// How many requests a [`Writes`] holds, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Keys written or deleted at least once.
    pub keys: usize,
    /// Puts of a key that had been written or deleted before.
    pub overwrites: usize,
    /// Deletes.
    pub deletes: usize,
    /// Deletes that were acknowledged.
    pub deletes_acked: usize,
    /// Requests of any kind that went unanswered.
    pub unanswered: usize,
}

/// One state the check accepts for a key: a value or absence, and the request that leaves it
/// (`None`: absent because nothing was acknowledged).
#[derive(Debug, Clone, Copy)]
struct Allowed<'a> {
    value: Option<&'a [u8]>,
    by: Option<usize>,
}

impl Writes {
    /// No requests yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes the next request for `key`, after every request noted before.
    pub fn record(&mut self, key: impl Into<String>, op: Op, outcome: Outcome) {
        self.keys.entry(key.into()).or_default().push((op, outcome));
    }

    /// Notes a put of `value` under `key`.
    pub fn put(&mut self, key: impl Into<String>, value: impl Into<Vec<u8>>, outcome: Outcome) {
        self.record(key, Op::Put(value.into()), outcome);
    }

    /// Notes a delete of `key`.
    pub fn delete(&mut self, key: impl Into<String>, outcome: Outcome) {
        self.record(key, Op::Delete, outcome);
    }

    /// How many keys and requests of each kind were noted.
    pub fn summary(&self) -> Summary {
        let mut s = Summary {
            keys: self.keys.len(),
            ..Summary::default()
        };
        for ops in self.keys.values() {
            for (i, (op, outcome)) in ops.iter().enumerate() {
                match op {
                    Op::Put(_) if i > 0 => s.overwrites += 1,
                    Op::Put(_) => {}
                    Op::Delete => {
                        s.deletes += 1;
                        if *outcome == Outcome::Acked {
                            s.deletes_acked += 1;
                        }
                    }
                }
                if *outcome == Outcome::Unanswered {
                    s.unanswered += 1;
                }
            }
        }
        s
    }

    /// The states `key` may be left in: the one its last acknowledged request leaves (absent
    /// if none was acknowledged), and the one of every later unanswered request (it may have
    /// landed, and then it is the newest).
    fn allowed(ops: &[(Op, Outcome)]) -> Vec<Allowed<'_>> {
        let last_acked = ops.iter().rposition(|(_, o)| *o == Outcome::Acked);
        let state = |i: usize| Allowed {
            value: match &ops[i].0 {
                Op::Put(v) => Some(v.as_slice()),
                Op::Delete => None,
            },
            by: Some(i),
        };
        let mut allowed = vec![match last_acked {
            Some(i) => state(i),
            None => Allowed {
                value: None,
                by: None,
            },
        }];
        let after = last_acked.map_or(0, |i| i + 1);
        allowed.extend((after..ops.len()).map(state));
        allowed
    }

    /// Checks what the pods hold against the requests: each key is held on at most one pod;
    /// its one copy (or its absence, if no pod holds it) is a state [`Writes`] allows (see
    /// `allowed`); a key nobody wrote is held nowhere. Every problem, each naming its key, what
    /// was expected and what was found; empty when I4 holds.
    pub fn check(&self, held: &Held) -> Vec<String> {
        let mut holders: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let mut problems = Vec::new();
        for (pod, records) in held {
            for (key, value) in records {
                holders.entry(key).or_default().push(pod);
                let Some(ops) = self.keys.get(key) else {
                    problems.push(format!("pod {pod} holds {key}, which nobody wrote"));
                    continue;
                };
                let allowed = Self::allowed(ops);
                if !allowed.iter().any(|a| a.value == Some(value.as_slice())) {
                    problems.push(format!(
                        "pod {pod} holds {key} = {}, expected {}",
                        found(ops, value),
                        expected(ops, &allowed)
                    ));
                }
            }
        }
        for (key, pods) in &holders {
            if pods.len() > 1 {
                problems.push(format!("{key} is held {} times: {pods:?}", pods.len()));
            }
        }
        for (key, ops) in &self.keys {
            let allowed = Self::allowed(ops);
            if !holders.contains_key(key.as_str()) && allowed.iter().all(|a| a.value.is_some()) {
                problems.push(format!(
                    "{key} is lost: held nowhere, expected {}",
                    expected(ops, &allowed)
                ));
            }
        }
        problems
    }
}

/// Checks that each `acknowledged` record is held exactly once with its value, and each
/// `unanswered` one (sent, no answer) at most once with its value: [`Writes::check`] for keys
/// written once each.
pub fn check(
    acknowledged: &BTreeMap<String, Vec<u8>>,
    unanswered: &BTreeMap<String, Vec<u8>>,
    held: &Held,
) -> Vec<String> {
    let mut writes = Writes::new();
    for (key, value) in acknowledged {
        writes.put(key.clone(), value.clone(), Outcome::Acked);
    }
    for (key, value) in unanswered {
        writes.put(key.clone(), value.clone(), Outcome::Unanswered);
    }
    writes.check(held)
}

/// A held `value` of a key with requests `ops`, named by the request that wrote it if any.
fn found(ops: &[(Op, Outcome)], value: &[u8]) -> String {
    let by = ops
        .iter()
        .rposition(|(op, _)| matches!(op, Op::Put(v) if v == value));
    match by {
        Some(i) => format!("{} (written by {})", show(value), request(ops, i)),
        None => format!("{}, which no request wrote", show(value)),
    }
}

/// The states `allowed`, for a message.
fn expected(ops: &[(Op, Outcome)], allowed: &[Allowed<'_>]) -> String {
    let states: Vec<String> = allowed
        .iter()
        .map(|a| {
            let what = a.value.map_or_else(|| "absent".to_owned(), show);
            match a.by {
                Some(i) => format!("{what} (after {})", request(ops, i)),
                None => format!("{what} (no request acknowledged)"),
            }
        })
        .collect();
    match states.as_slice() {
        [one] => one.clone(),
        _ => format!("one of [{}]", states.join(", ")),
    }
}

/// Request `i` of `ops`, for a message: "put 3 of 7, acknowledged".
fn request(ops: &[(Op, Outcome)], i: usize) -> String {
    let (op, outcome) = &ops[i];
    let kind = match op {
        Op::Put(_) => "put",
        Op::Delete => "delete",
    };
    let outcome = match outcome {
        Outcome::Acked => "acknowledged",
        Outcome::Unanswered => "unanswered",
    };
    format!("{kind} {} of {}, {outcome}", i + 1, ops.len())
}

/// A value for a message: its text, quoted, cut to 40 characters.
fn show(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{:?}…", &text[..cut]),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Outcome::{Acked, Unanswered};

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    fn held(pods: &[(&str, &[(&str, &str)])]) -> Held {
        pods.iter().map(|(p, r)| (p.to_string(), map(r))).collect()
    }

    /// A request for a table: `put("v", Acked)`.
    fn put(value: &str, outcome: Outcome) -> (Op, Outcome) {
        (Op::Put(value.as_bytes().to_vec()), outcome)
    }

    fn delete(outcome: Outcome) -> (Op, Outcome) {
        (Op::Delete, outcome)
    }

    /// `ops` all for key `k`.
    fn writes_of(ops: &[(Op, Outcome)]) -> Writes {
        let mut w = Writes::new();
        for (op, outcome) in ops {
            w.record("k", op.clone(), *outcome);
        }
        w
    }

    /// Each row: a name, the requests for key `k` in order, where `k` is held (pod, value),
    /// and what must be in the one problem expected (`None`: I4 holds).
    type Row = (
        &'static str,
        Vec<(Op, Outcome)>,
        &'static [(&'static str, &'static [(&'static str, &'static str)])],
        Option<&'static str>,
    );

    fn rows() -> Vec<Row> {
        vec![
            (
                "the newest acknowledged put is held",
                vec![put("1", Acked), put("2", Acked), put("3", Acked)],
                &[("ds-1", &[]), ("ds-2", &[("k", "3")])],
                None,
            ),
            (
                "an overwritten key that reads its older value",
                vec![put("1", Acked), put("2", Acked)],
                &[("ds-1", &[("k", "1")])],
                Some(
                    "pod ds-1 holds k = \"1\" (written by put 1 of 2, acknowledged), \
                     expected \"2\" (after put 2 of 2, acknowledged)",
                ),
            ),
            (
                "a deleted key that comes back",
                vec![put("1", Acked), put("2", Acked), delete(Acked)],
                &[("ds-0", &[("k", "2")])],
                Some(
                    "pod ds-0 holds k = \"2\" (written by put 2 of 3, acknowledged), \
                     expected absent (after delete 3 of 3, acknowledged)",
                ),
            ),
            (
                "a deleted key held nowhere",
                vec![put("1", Acked), delete(Acked)],
                &[("ds-0", &[])],
                None,
            ),
            (
                "a key put again after its delete is held",
                vec![put("1", Acked), delete(Acked), put("3", Acked)],
                &[("ds-2", &[("k", "3")])],
                None,
            ),
            (
                "a key put again after its delete is lost",
                vec![put("1", Acked), delete(Acked), put("3", Acked)],
                &[("ds-2", &[])],
                Some("k is lost: held nowhere, expected \"3\" (after put 3 of 3, acknowledged)"),
            ),
            (
                "an unanswered later put that landed",
                vec![put("1", Acked), put("2", Unanswered)],
                &[("ds-0", &[("k", "2")])],
                None,
            ),
            (
                "an unanswered later put that did not land",
                vec![put("1", Acked), put("2", Unanswered)],
                &[("ds-0", &[("k", "1")])],
                None,
            ),
            (
                "an unanswered later delete that landed",
                vec![put("1", Acked), delete(Unanswered)],
                &[("ds-0", &[])],
                None,
            ),
            (
                "an unanswered put before the last acknowledged one may not win",
                vec![put("1", Acked), put("2", Unanswered), put("3", Acked)],
                &[("ds-0", &[("k", "2")])],
                Some(
                    "pod ds-0 holds k = \"2\" (written by put 2 of 3, unanswered), expected \"3\"",
                ),
            ),
            (
                "an unanswered delete before the last acknowledged put may not win",
                vec![put("1", Acked), delete(Unanswered), put("3", Acked)],
                &[("ds-0", &[])],
                Some("k is lost"),
            ),
            (
                "a key never acknowledged may be absent",
                vec![put("1", Unanswered), put("2", Unanswered)],
                &[("ds-0", &[])],
                None,
            ),
            (
                "a key never acknowledged may hold any of its unanswered puts",
                vec![put("1", Unanswered), put("2", Unanswered)],
                &[("ds-0", &[("k", "1")])],
                None,
            ),
            (
                "a value no request wrote",
                vec![put("1", Acked), put("2", Unanswered)],
                &[("ds-0", &[("k", "9")])],
                Some(
                    "pod ds-0 holds k = \"9\", which no request wrote, expected one of \
                     [\"1\" (after put 1 of 2, acknowledged), \
                     \"2\" (after put 2 of 2, unanswered)]",
                ),
            ),
            (
                "a key held twice with its newest value",
                vec![put("1", Acked), put("2", Acked)],
                &[("ds-0", &[("k", "2")]), ("ds-1", &[("k", "2")])],
                Some("k is held 2 times: [\"ds-0\", \"ds-1\"]"),
            ),
        ]
    }

    #[test]
    fn each_key_is_judged_by_its_newest_acknowledged_request() {
        let mut wrong = Vec::new();
        for (name, ops, pods, want) in rows() {
            let problems = writes_of(&ops).check(&held(pods));
            let right = match want {
                None => problems.is_empty(),
                Some(w) => problems.len() == 1 && problems[0].starts_with(w),
            };
            if !right {
                wrong.push(format!("{name}: want {want:?}, got {problems:#?}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn a_key_held_twice_with_an_old_copy_is_named_for_both() {
        let w = writes_of(&[put("1", Acked), put("2", Acked)]);
        let p = w.check(&held(&[("ds-0", &[("k", "2")]), ("ds-1", &[("k", "1")])]));
        assert_eq!(p.len(), 2, "{p:#?}");
        assert!(p[0].starts_with("pod ds-1 holds k = \"1\""), "{p:#?}");
        assert_eq!(p[1], "k is held 2 times: [\"ds-0\", \"ds-1\"]");
    }

    #[test]
    fn a_key_nobody_wrote_is_named() {
        let mut w = Writes::new();
        w.put("a", "1", Acked);
        let p = w.check(&held(&[("ds-0", &[("a", "1"), ("zz", "?")])]));
        assert_eq!(p, vec!["pod ds-0 holds zz, which nobody wrote".to_owned()]);
    }

    #[test]
    fn keys_are_judged_apart() {
        let mut w = Writes::new();
        w.put("a", "a1", Acked);
        w.put("b", "b1", Acked);
        w.put("a", "a2", Acked);
        w.delete("b", Acked);
        w.put("c", "c1", Unanswered);
        assert!(w.check(&held(&[("ds-0", &[("a", "a2")])])).is_empty());
        let p = w.check(&held(&[("ds-0", &[("a", "a2"), ("b", "b1")])]));
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(p[0].starts_with("pod ds-0 holds b = \"b1\""), "{p:#?}");
    }

    #[test]
    fn summary_counts_keys_overwrites_and_deletes() {
        let mut w = Writes::new();
        w.put("a", "1", Acked);
        w.put("a", "2", Unanswered);
        w.delete("a", Acked);
        w.delete("b", Unanswered);
        w.put("b", "1", Acked);
        let want = Summary {
            keys: 2,
            overwrites: 2,
            deletes: 2,
            deletes_acked: 1,
            unanswered: 2,
        };
        assert_eq!(w.summary(), want);
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let long = "x".repeat(100);
        assert_eq!(show(long.as_bytes()), format!("{:?}…", "x".repeat(40)));
        assert_eq!(show(b"short"), "\"short\"");
    }

    #[test]
    fn outcome_of_a_result() {
        assert_eq!(Outcome::of(&Ok::<(), ()>(())), Acked);
        assert_eq!(Outcome::of(&Err::<(), ()>(())), Unanswered);
    }

    #[test]
    fn every_record_once_with_its_value_holds() {
        let acked = map(&[("a", "1"), ("b", "2")]);
        let maybe = map(&[("c", "3"), ("d", "4")]);
        let h = held(&[("ds-0", &[("a", "1"), ("c", "3")]), ("ds-1", &[("b", "2")])]);
        assert!(check(&acked, &maybe, &h).is_empty());
    }

    #[test]
    fn lost_duplicated_changed_and_unknown_records_are_each_named() {
        let acked = map(&[("a", "1"), ("b", "2"), ("lost", "x")]);
        let maybe = map(&[("c", "3")]);
        let h = held(&[
            ("ds-0", &[("a", "1"), ("b", "9"), ("c", "3")]),
            ("ds-1", &[("a", "1"), ("c", "3"), ("zz", "?")]),
        ]);
        let p = check(&acked, &maybe, &h);
        assert_eq!(p.len(), 5, "{p:?}");
        assert!(p.iter().any(|m| m.starts_with("pod ds-0 holds b = \"9\"")));
        assert!(p.iter().any(|m| m.contains("zz, which nobody wrote")));
        assert!(p.iter().any(|m| m.starts_with("lost is lost")));
        assert!(p.iter().any(|m| m.starts_with("a is held 2 times")));
        assert!(p.iter().any(|m| m.starts_with("c is held 2 times")));
    }
}
