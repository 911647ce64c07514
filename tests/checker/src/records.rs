//! I4 for the example datastore: every acknowledged record is held by exactly one pod, with the
//! value written; nothing else is held but records whose write was sent without an answer.

use std::collections::{BTreeMap, BTreeSet};

/// Checks what the pods hold (`held`: pod name → key → value) against what was written:
/// `acknowledged` writes must each be held exactly once with their value; `unanswered` writes
/// (sent, no answer: they may or may not have landed) may be held at most once, with their
/// value. Every problem, empty when I4 holds.
pub fn check(
    acknowledged: &BTreeMap<String, Vec<u8>>,
    unanswered: &BTreeMap<String, Vec<u8>>,
    held: &BTreeMap<String, BTreeMap<String, Vec<u8>>>,
) -> Vec<String> {
    let mut holders: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut problems = Vec::new();
    for (pod, records) in held {
        for (key, value) in records {
            holders.entry(key).or_default().push(pod);
            let want = acknowledged.get(key).or_else(|| unanswered.get(key));
            match want {
                None => problems.push(format!("pod {pod} holds {key}, which nobody wrote")),
                Some(w) if w != value => {
                    problems.push(format!("pod {pod} holds {key} with another value"))
                }
                Some(_) => {}
            }
        }
    }
    let lost: BTreeSet<&String> = acknowledged
        .keys()
        .filter(|k| !holders.contains_key(k.as_str()))
        .collect();
    if !lost.is_empty() {
        problems.push(format!(
            "{} acknowledged records lost, e.g. {:?}",
            lost.len(),
            lost.iter().take(10).collect::<Vec<_>>()
        ));
    }
    for (key, pods) in holders {
        if pods.len() > 1 {
            problems.push(format!("{key} is held {} times: {pods:?}", pods.len()));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    fn held(pods: &[(&str, &[(&str, &str)])]) -> BTreeMap<String, BTreeMap<String, Vec<u8>>> {
        pods.iter().map(|(p, r)| (p.to_string(), map(r))).collect()
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
        assert!(p.iter().any(|m| m.contains("b with another value")));
        assert!(p.iter().any(|m| m.contains("zz, which nobody wrote")));
        assert!(p.iter().any(|m| m.contains("1 acknowledged records lost")));
        assert!(p.iter().any(|m| m.starts_with("a is held 2 times")));
        assert!(p.iter().any(|m| m.starts_with("c is held 2 times")));
    }
}
